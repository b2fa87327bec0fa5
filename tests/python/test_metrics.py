"""Prometheus metrics outside the engine (docs/operations.md, Metrics): stores of two tenants in this
process and a store in a second process publish into one instance's segment; the endpoint this
process serves is scraped over HTTP, parsed with prometheus_client's parser, and checked against the
stores' own counters (kvs_store_stats, usage), including what the second process did after it
exited."""

import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
import uuid

from kvstrata.store import Store
from kvs_scrape import free_port, scrape, value

KiB = 1 << 10
HERE = os.path.dirname(os.path.abspath(__file__))


CHILD = r"""
import sys
from kvstrata.store import Store
s = Store("metrics-test", tenant="a", config=sys.argv[1], max_value_bytes=4096)
keys = [b"child-%d" % i for i in range(int(sys.argv[2]))]
s.put(keys, [bytearray(1000) for _ in keys])
bufs = [bytearray(4096) for _ in keys]
s.get(keys, bufs)
print(s.stats()["gets"], s.stats()["puts_stored"], flush=True)
s.close()
"""


class StoreMetrics(unittest.TestCase):
    def setUp(self):
        self.port = free_port()
        self.name = "test-" + uuid.uuid4().hex[:12]
        self.addCleanup(lambda: os.path.exists("/dev/shm/kvstrata-" + self.name)
                        and os.unlink("/dev/shm/kvstrata-" + self.name))
        d = tempfile.mkdtemp(prefix="kvs-metrics-")
        self.config = os.path.join(d, "m.yaml")
        with open(self.config, "w") as f:
            f.write("version: 1\ntiers:\n  - name: ram\n    type: dram\n    capacity: 16MiB\n"
                    f"metrics:\n  listen: 127.0.0.1:{self.port}\n  name: {self.name}\n")

    def wait_for(self, check, what):
        deadline = time.monotonic() + 15
        last = None
        while time.monotonic() < deadline:
            try:
                last = scrape(self.port)
                if check(last):
                    return last
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        self.fail(f"{what}: not seen within 15 s; last scrape {last}")

    def workload(self, store, prefix, n_put, n_get_extra):
        keys = [prefix + b"-%d" % i for i in range(n_put)]
        store.put(keys, [bytearray(os.urandom(500 + i)) for i in range(n_put)])
        asked = keys + [prefix + b"-absent-%d" % i for i in range(n_get_extra)]
        bufs = [bytearray(4096) for _ in asked]
        store.get(asked, bufs)

    def test_two_tenants_and_a_process_gone(self):
        a = Store("metrics-test", tenant="a", config=self.config, max_value_bytes=4096)
        self.addCleanup(a.close)
        b = Store("metrics-test", tenant="b", config=self.config, max_value_bytes=4096)
        self.addCleanup(b.close)
        self.workload(a, b"a", 7, 3)
        self.workload(b, b"b", 4, 5)
        sa, sb = a.stats(), b.stats()
        self.assertEqual(sa["gets"], 10)  # the workload's own count, before any scrape

        def settled(s):
            return (value(s, "kvstrata_gets_total", tenant="a") == sa["gets"]
                    and value(s, "kvstrata_gets_total", tenant="b") == sb["gets"])
        s = self.wait_for(settled, "the stores' gets")
        for t, st in (("a", sa), ("b", sb)):
            self.assertEqual(value(s, "kvstrata_get_misses_total", tenant=t), st["get_misses"])
            self.assertEqual(value(s, "kvstrata_saves_total", tenant=t), st["puts_stored"])
            self.assertEqual(value(s, "kvstrata_saved_bytes_total", tenant=t), st["put_bytes"])
        ua, ub = a.usage()[0], b.usage()[0]
        self.assertEqual(value(s, "kvstrata_tier_hits_total", tier="ram", tenant="a"), ua.hits)
        self.assertEqual(value(s, "kvstrata_tier_hits_total", tier="ram", tenant="b"), ub.hits)
        self.assertEqual(value(s, "kvstrata_tier_loaded_bytes_total", tier="ram", tenant="a"),
                         ua.hit_bytes)
        # each store has its own private dram tier in this process: objects add up
        self.assertEqual(value(s, "kvstrata_tier_objects", tier="ram"), ua.objects + ub.objects)
        self.assertEqual(value(s, "kvstrata_tier_capacity_bytes", tier="ram"), 2 * 16 * 1024 * KiB)
        self.assertEqual(value(s, "kvstrata_processes"), 1)
        hits = (sa["gets"] - sa["get_misses"]) + (sb["gets"] - sb["get_misses"])
        self.assertAlmostEqual(value(s, "kvstrata_hit_rate"), hits / (sa["gets"] + sb["gets"]),
                               places=5)
        self.assertAlmostEqual(value(s, "kvstrata_tier_hit_rate", tier="ram"),
                               (ua.hits + ub.hits) / (sa["gets"] + sb["gets"]), places=5)

        # a second process of the instance publishes into the same segment and exits: what it did
        # stays in the sums
        env = dict(os.environ)
        child = subprocess.run([sys.executable, "-c", CHILD, self.config, "6"], env=env,
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(child.returncode, 0, child.stderr)
        child_gets, child_saves = (int(x) for x in child.stdout.split())
        self.assertEqual(child_gets, 6)
        s = self.wait_for(lambda s: value(s, "kvstrata_gets_total", tenant="a")
                          == sa["gets"] + child_gets, "the gone process's gets")
        self.assertEqual(value(s, "kvstrata_saves_total", tenant="a"),
                         sa["puts_stored"] + child_saves)
        self.assertEqual(value(s, "kvstrata_processes"), 1)

    def test_other_paths_and_methods(self):
        a = Store("metrics-test", tenant="a", config=self.config, max_value_bytes=4096)
        self.addCleanup(a.close)
        self.wait_for(lambda s: value(s, "kvstrata_processes") == 1, "the endpoint")
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/other", timeout=5)
        self.assertEqual(e.exception.code, 404)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/metrics", data=b"x",
                                     method="POST")
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        self.assertEqual(e.exception.code, 405)


if __name__ == "__main__":
    unittest.main()
