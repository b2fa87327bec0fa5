"""What the metrics suites share: a free local port, and one scrape of a kvstrata metrics endpoint
parsed by prometheus_client's text-format parser (not by our own code)."""

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """{(name, sorted labels): value} of every sample; a series sampled twice fails."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in samples:  # one series, one sample: a second would be a rendering fault
                raise AssertionError(f"two samples of {key} in the scrape")
            samples[key] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))
