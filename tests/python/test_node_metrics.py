"""Prometheus metrics of a kvstrata-node and of a connector (docs/node.md, Metrics; docs/operations.md,
Metrics).

A node started with --metrics (or a `metrics:` section) serves two tenants' stores over a remote tier;
its endpoint is scraped over HTTP, parsed with prometheus_client's parser, and each tenant's series
are checked against what that tenant's store did, the series' sums against the node's own final
stats line, and `kvstrata stats ENDPOINT --json` against the same endpoint.

The mini engine runs a small workload with a `metrics:` section and exits; its counters stay in the
instance's segment (retired rows), which a store this process opens on the same config then serves:
the hit tokens and chunk counts there must equal the engine's own JSON summary."""

import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request
import uuid

from kvstrata.store import Store
from kvs_scrape import free_port, scrape, value

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def build_bin(name):
    lib = os.environ.get("KVSTRATA_LIBRARY", "")
    if lib:
        return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib))), "bin", name)
    return os.path.join(ROOT, "build", "bin", name)


def cli():
    return os.environ.get("KVSTRATA_CLI") or os.path.join(ROOT, "build", "bin", "kvstrata")


def series(samples, name):
    """{labels dict as a sorted tuple: value} of one family's samples."""
    return {labels: v for (n, labels), v in samples.items() if n == name}


def wait_for(port, check, what, test):
    deadline = time.monotonic() + 15
    last = None
    while time.monotonic() < deadline:
        try:
            last = scrape(port)
            if check(last):
                return last
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    test.fail(f"{what}: not seen within 15 s; last scrape {last}")


def unlink_segment(name):
    try:
        os.unlink("/dev/shm/kvstrata-" + name)
    except FileNotFoundError:
        pass


class Node:
    """A kvstrata-node on 127.0.0.1 (a port it picks) with a 64 MiB DRAM tier; stopped by the test's
    cleanup, SIGKILL where SIGTERM does not end it."""

    def __init__(self, test, args=(), metrics_section=""):
        self.binary = build_bin("kvstrata-node")
        if not os.access(self.binary, os.X_OK):
            test.fail(f"no kvstrata-node at {self.binary} (build it: make build)")
        self.dir = tempfile.mkdtemp(prefix="kvs-node-metrics-")
        test.addCleanup(shutil.rmtree, self.dir, True)
        self.psk = os.path.join(self.dir, "node.key")
        with open(os.open(self.psk, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(bytes((i * 11 + 5) & 0xFF for i in range(32)))
        config = os.path.join(self.dir, "node.yaml")
        with open(config, "w") as f:
            f.write("version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n"
                    "    capacity: 64MiB\n" + metrics_section)
        self.proc = subprocess.Popen([self.binary, "--config", config, "--psk-file", self.psk,
                                      "--listen", "127.0.0.1:0", "--max-object-bytes", "64KiB",
                                      *args], stdout=subprocess.PIPE, text=True)
        test.addCleanup(self.stop)
        line = self.proc.stdout.readline()
        if not line.startswith("kvstrata-node ready listen="):
            test.fail(f"kvstrata-node did not start: {line!r}")
        self.address = line.split("listen=")[1].split()[0]

    def tenant_config(self, tenant):
        """A store config with a remote tier `far` over this node, with the tenant's own key."""
        key = os.path.join(self.dir, f"{tenant}.key")
        subprocess.run([self.binary, "--psk-file", self.psk, "--tenant-key", tenant, "--out", key],
                       check=True)
        path = os.path.join(self.dir, f"{tenant}.yaml")
        with open(path, "w") as f:
            # the store API seals its values with checksums; a keyed tier is refused for it
            f.write(f"version: 1\nlog_level: error\ntiers:\n  - name: far\n    type: remote\n"
                    f"    nodes: [{self.address}]\n    integrity: checksum\n    options:\n"
                    f"      psk_file: {key}\n      tenant: {tenant}\n      timeout_ms: 5000\n")
        return path

    def stop(self):
        """SIGTERM; the final stats line as a dict (None when it had stopped)."""
        if self.proc.poll() is not None:
            if not self.proc.stdout.closed:
                self.proc.stdout.close()
            return None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None
        last = [ln for ln in out.splitlines() if ln.startswith("kvstrata-node stopped")]
        return dict(kv.split("=", 1) for kv in last[-1].split() if "=" in kv) if last else None


# Two tenants' workloads, of different sizes: puts, then gets of every key put and of absent ones.
WORK = {"alpha": (5, 2), "beta": (3, 4)}


def workload(store, tenant):
    n_put, n_absent = WORK[tenant]
    keys = [b"%s-%d" % (tenant.encode(), i) for i in range(n_put)]
    res = store.put(keys, [bytearray(os.urandom(100 + 10 * i)) for i in range(n_put)])
    assert all(r.status == 0 for r in res), res
    asked = keys + [b"%s-absent-%d" % (tenant.encode(), i) for i in range(n_absent)]
    store.get(asked, [bytearray(4096) for _ in asked])
    return keys


class NodeMetrics(unittest.TestCase):
    def start(self, by_flag):
        self.port = free_port()
        if by_flag:  # the segment's name derives from the address (docs/configuration.md)
            self.segment = f"kvs{os.getuid()}-127.0.0.1_{self.port}"
            node = Node(self, args=("--metrics", f"127.0.0.1:{self.port}"))
        else:
            self.segment = "node-test-" + uuid.uuid4().hex[:12]
            node = Node(self, metrics_section=f"metrics:\n  listen: 127.0.0.1:{self.port}\n"
                                              f"  name: {self.segment}\n")
        self.addCleanup(unlink_segment, self.segment)
        stores, stats = {}, {}
        for t in WORK:
            stores[t] = Store("node-metrics", tenant=t, config=node.tenant_config(t),
                              max_value_bytes=4096)
            self.addCleanup(stores[t].close)
            workload(stores[t], t)
            stats[t] = stores[t].stats()
        for t, (n_put, n_absent) in WORK.items():  # what each tenant did, by its own count
            self.assertEqual(stats[t]["puts_stored"], n_put)
            self.assertEqual(stats[t]["get_hits"], n_put)
            self.assertEqual(stats[t]["get_misses"], n_absent)
        return node, stores, stats

    def settled(self, stats):
        def check(s):
            return all(value(s, "kvstrata_node_puts_total", tenant=t) == stats[t]["puts_stored"]
                       and value(s, "kvstrata_node_gets_total", tenant=t) == stats[t]["get_hits"]
                       for t in WORK)
        return wait_for(self.port, check, "the tenants' puts and gets", self)

    def test_tenants_scraped(self):
        node, stores, stats = self.start(by_flag=True)
        s = self.settled(stats)
        for t, st in stats.items():
            # a GET asks the node only for keys its lookup found; every object put is read once
            self.assertEqual(value(s, "kvstrata_node_puts_total", tenant=t), st["puts_stored"])
            self.assertEqual(value(s, "kvstrata_node_gets_total", tenant=t), st["get_hits"])
            self.assertGreaterEqual(value(s, "kvstrata_node_hits_total", tenant=t),
                                    st["get_hits"])
            self.assertGreaterEqual(value(s, "kvstrata_node_misses_total", tenant=t),
                                    st["get_misses"])
            bytes_in = value(s, "kvstrata_node_bytes_in_total", tenant=t)
            self.assertGreaterEqual(bytes_in, st["put_bytes"])  # the values and their framing
            self.assertEqual(value(s, "kvstrata_node_bytes_out_total", tenant=t), bytes_in)
            self.assertEqual(value(s, "kvstrata_node_deletes_total", tenant=t), 0)
        # traffic has series per tenant only; the whole counters none
        self.assertEqual({dict(k).get("tenant") for k in series(s, "kvstrata_node_hits_total")},
                         set(WORK))
        self.assertEqual(value(s, "kvstrata_node_auth_ok_total"), len(WORK))
        self.assertIsNone(value(s, "kvstrata_node_hits_total"))
        self.assertEqual(value(s, "kvstrata_tier_objects", tier="dram", role="node"),
                         sum(st["puts_stored"] for st in stats.values()))
        self.assertEqual(value(s, "kvstrata_tier_capacity_bytes", tier="dram", role="node"), 64 << 20)
        self.assertEqual(value(s, "kvstrata_tier_bytes", tier="dram", role="node"),
                         sum(value(s, "kvstrata_node_bytes_in_total", tenant=t) for t in WORK))

        # lookups of keys present, by one tenant: its lookups and hits move by as many, the other
        # tenant's not at all
        before = s
        n_present, _ = stores["alpha"].exists([b"alpha-0", b"alpha-1", b"alpha-2"])
        self.assertEqual(n_present, 3)

        def moved(s):
            return (value(s, "kvstrata_node_lookups_total", tenant="alpha")
                    != value(before, "kvstrata_node_lookups_total", tenant="alpha"))
        s = wait_for(self.port, moved, "alpha's lookups", self)
        for name in ("kvstrata_node_lookups_total", "kvstrata_node_hits_total"):
            self.assertEqual(value(s, name, tenant="alpha") - value(before, name, tenant="alpha"),
                             3, name)
            self.assertEqual(value(s, name, tenant="beta"), value(before, name, tenant="beta"))
        self.assertEqual(value(s, "kvstrata_node_misses_total", tenant="alpha"),
                         value(before, "kvstrata_node_misses_total", tenant="alpha"))

        # the tenants' series add up to the node's own totals (its final stats line)
        for st in stores.values():
            st.close()
        time.sleep(0.7)  # a publish period: the closes' own traffic, if any, is in
        s = scrape(self.port)
        final = node.stop()
        self.assertIsNotNone(final, "no final stats line")
        for name in ("lookups", "hits", "misses", "gets", "puts", "deletes", "bytes_in",
                     "bytes_out"):
            total = sum(value(s, f"kvstrata_node_{name}_total", tenant=t) for t in WORK)
            self.assertEqual(total, int(final[name]), name)
        for name in ("connections", "auth_ok", "auth_failures", "rejected", "refusals"):
            self.assertEqual(value(s, f"kvstrata_node_{name}_total"), int(final[name]), name)

    def test_tenants_past_the_rows_share_one(self):
        # the node keeps series of their own for its first 64 tenants (KVS_NODE_TENANT_ROWS)
        node, _, stats = self.start(by_flag=True)  # alpha and beta are the first two
        extra = 64 + 2 - len(WORK)
        for i in range(extra):
            with Store("node-metrics", config=node.tenant_config(f"t{i}"),
                       max_value_bytes=4096) as st:
                st.put([b"k"], [bytearray(10 + i)])
        s = wait_for(self.port, lambda s: value(s, "kvstrata_node_puts_total", tenant="(other)")
                     == 2, "the shared row", self)
        tenants = {dict(k)["tenant"] for k in series(s, "kvstrata_node_puts_total")}
        self.assertEqual(len(tenants), 65)
        self.assertIn("t61", tenants)  # the 64th tenant
        self.assertNotIn("t62", tenants)
        self.assertNotIn("t63", tenants)
        self.assertEqual(value(s, "kvstrata_node_puts_total", tenant="alpha"),
                         stats["alpha"]["puts_stored"])
        final = node.stop()
        self.assertEqual(sum(series(s, "kvstrata_node_puts_total").values()),
                         int(final["puts"]))

    def test_cli_stats_of_the_node(self):
        node, stores, stats = self.start(by_flag=False)  # the config's metrics: section
        s = self.settled(stats)
        r = subprocess.run([cli(), "stats", f"127.0.0.1:{self.port}", "--json"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, f"kvstrata stats: {r.stdout}{r.stderr}")
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        rows = {(x["name"], x["tenant"]): x["value"] for x in doc["node"]}
        for t, st in stats.items():
            self.assertEqual(rows[("puts_total", t)], st["puts_stored"])
            self.assertEqual(rows[("gets_total", t)], st["get_hits"])
            self.assertEqual(rows[("bytes_in_total", t)],
                             value(s, "kvstrata_node_bytes_in_total", tenant=t))
        self.assertEqual(rows[("auth_ok_total", "")], len(WORK))
        # the node's tier is a row of its own (role="node"), never merged with an engine's "dram"
        dram = [x for x in doc["tiers"] if x["tier"] == "dram (node)"]
        self.assertEqual(len(dram), 1, doc["tiers"])
        self.assertEqual([x for x in doc["tiers"] if x["tier"] == "dram"], [])
        self.assertEqual(dram[0]["objects"], sum(st["puts_stored"] for st in stats.values()))


class EngineMetrics(unittest.TestCase):
    """The mini engine's counters in the segment after it exited, against its JSON summary."""

    def test_hit_tokens_match_the_engine(self):
        engine = build_bin("kvs-mini-engine")
        if not os.access(engine, os.X_OK):
            self.fail(f"no kvs-mini-engine at {engine} (build it: make build)")
        port = free_port()
        name = "engine-test-" + uuid.uuid4().hex[:12]
        self.addCleanup(unlink_segment, name)
        d = tempfile.mkdtemp(prefix="kvs-engine-metrics-")
        self.addCleanup(shutil.rmtree, d, True)
        config = os.path.join(d, "engine.yaml")
        with open(config, "w") as f:
            f.write("version: 1\nlog_level: error\ntiers:\n  - name: ram\n    type: dram\n"
                    f"    capacity: 64MiB\nmetrics:\n  listen: 127.0.0.1:{port}\n  name: {name}\n")
        r = subprocess.run([engine, "--config", config, "--sessions", "3", "--turns", "3",
                            "--doc-tokens", "512", "--json", "--quiet"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        summary = json.loads(r.stdout.strip().splitlines()[-1])["connector"]
        hit_tokens = summary["all_turns"]["connector_hit_tokens"]
        self.assertGreater(hit_tokens, 0, "the workload should reuse stored KV")
        self.assertTrue(os.path.exists("/dev/shm/kvstrata-" + name), "no segment after the run")

        # a store on the same config joins the instance and serves what the engine left
        store = Store("engine-metrics", config=config, max_value_bytes=4096)
        self.addCleanup(store.close)
        s = wait_for(port, lambda s: value(s, "kvstrata_processes") == 1, "the endpoint", self)
        self.assertEqual(value(s, "kvstrata_hit_tokens_total"), hit_tokens)
        self.assertEqual(value(s, "kvstrata_tier_hit_tokens_total", tier="ram"), hit_tokens)
        self.assertEqual(value(s, "kvstrata_tier_hits_total", tier="ram"),
                         summary["tier_chunks_loaded"][0])
        self.assertEqual(value(s, "kvstrata_saves_total"), summary["chunks_saved"])
        self.assertEqual(value(s, "kvstrata_errors_total", kind="load"), summary["load_errors"])

        # kvstrata stats CONFIG reads the segment without any server
        store.close()
        r = subprocess.run([cli(), "stats", config, "--json"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 0, f"kvstrata stats: {r.stdout}{r.stderr}")
        doc = json.loads(r.stdout.strip().splitlines()[-1])
        ram = [x for x in doc["tiers"] if x["tier"] == "ram"]
        self.assertEqual(len(ram), 1, doc["tiers"])
        self.assertEqual(ram[0]["hit_tokens"], hit_tokens)
        self.assertEqual(ram[0]["hits"], summary["tier_chunks_loaded"][0])
        self.assertEqual(sum(t["hit_tokens"] for t in doc["tenants"]), hit_tokens)
        self.assertEqual(sum(t["saves"] for t in doc["tenants"]), summary["chunks_saved"])


if __name__ == "__main__":
    unittest.main()
