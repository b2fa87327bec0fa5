"""kvstrata check and kvstrata stats, the operator's command, on real tiers this test builds: a shared
DRAM tier another process holds and fills (through the store API), an SSD tier's directory, a Redis
server, a metrics endpoint. Every figure the command prints is compared with what the test did."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

from kvs_scrape import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.environ.get("KVSTRATA_LIBRARY", "")
CLI = os.environ.get("KVSTRATA_CLI") or os.path.join(os.path.dirname(os.path.dirname(LIB)), "bin",
                                                       "kvstrata")

# A process that holds a store on CONFIG, puts N values of SIZE bytes, reports what its store's usage
# says, then stays until its stdin closes.
HOLDER = r"""
import json, sys
from kvstrata.store import Store
config, n, size, tenant = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] or None
s = Store("test-cli", tenant=tenant, config=config, max_value_bytes=1 << 20)
keys = [b"k-%d" % i for i in range(n)]
res = s.put(keys, [bytes([i % 251]) * size for i in range(n)])
assert all(r.status == 0 for r in res), [r.status for r in res]
out = [bytearray(size) for _ in range(n + 3)]
got = s.get(keys + [b"absent-1", b"absent-2", b"absent-3"], out)
u = s.usage()[0]
print(json.dumps({"objects": u.objects, "bytes": u.bytes, "hits": sum(r.status == 0 for r in got),
                  "stats": s.stats()}), flush=True)
sys.stdin.read()
s.close()
"""


def run_cli(*args, timeout=60):
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Dirs:
    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="kvs-cli-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def yaml(self, text, directory=None):
        path = os.path.join(directory or self.tmpdir(), "deploy.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def shm_name(self):
        name = "kvs-cli-test-" + uuid.uuid4().hex[:12]
        self.addCleanup(lambda: os.path.exists("/dev/shm/" + name) and os.unlink("/dev/shm/" + name))
        return name

    def redis_server(self, d):
        """A redis-server on a unix socket in d, stopped at the test's end; its socket path."""
        sock = os.path.join(d, "redis.sock")
        srv = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--save", "",
                                "--appendonly", "no"], stdout=subprocess.DEVNULL)
        self.addCleanup(lambda: (srv.terminate(), srv.wait()))
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.02)
        return sock

    def metrics_name(self):
        """A metrics segment name of this test's own, removed at its end."""
        name = "cli-" + uuid.uuid4().hex[:10]
        self.addCleanup(lambda: os.path.exists("/dev/shm/kvstrata-" + name)
                        and os.unlink("/dev/shm/kvstrata-" + name))
        return name

    def holder(self, config, n, size, tenant=""):
        """A second process holding the store; returns (its report, process)."""
        env = dict(os.environ)
        p = subprocess.Popen([sys.executable, "-c", HOLDER, config, str(n), str(size), tenant],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

        def stop():
            if p.poll() is None:
                p.stdin.close()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            p.stdout.close()
        self.addCleanup(stop)
        line = p.stdout.readline()
        self.assertTrue(line, "the holder process died before reporting")
        return json.loads(line), p


class Check(Dirs, unittest.TestCase):
    def test_a_sound_file_has_no_problems(self):
        d = self.tmpdir()
        cfg = self.yaml("version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 16MiB\n"
                        f"  - name: disk\n    type: ssd\n    capacity: 16MiB\n    paths: [{d}]\n", d)
        rc, out, err = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 0, out + err)
        doc = json.loads(out)
        self.assertEqual([t["state"] for t in doc["tiers"]], ["ok", "ok"])
        self.assertEqual(doc["problems"], [])
        rc, out, _ = run_cli("check", cfg)
        self.assertEqual(rc, 0)
        self.assertIn("no problems", out)

    def test_an_unknown_key_is_named_at_its_line_and_column(self):
        cfg = self.yaml("version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 16MiB\n"
                        "    colour: blue\n")
        rc, out, _ = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 1)
        problems = json.loads(out)["problems"]
        self.assertEqual(len(problems), 1)
        self.assertTrue(problems[0].startswith(cfg + ":6:5:"), problems[0])
        self.assertIn("colour", problems[0])

    def test_each_bad_ssd_path_is_a_problem_at_its_own_entry(self):
        d = self.tmpdir()
        plain = os.path.join(d, "a-file")
        open(plain, "w").close()
        cfg = self.yaml("version: 1\ntiers:\n  - name: disk\n    type: ssd\n    capacity: 16MiB\n"
                        f"    paths:\n      - {d}\n      - {d}/missing\n      - {plain}\n", d)
        rc, out, _ = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 1)
        problems = json.loads(out)["problems"]
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(problems[0].startswith(cfg + ":8:9: key 'tiers[0].paths[1]'"), problems[0])
        self.assertIn("ENOENT", problems[0])
        self.assertTrue(problems[1].startswith(cfg + ":9:9: key 'tiers[0].paths[2]'"), problems[1])
        self.assertIn("not a directory", problems[1])

    def test_a_capacity_larger_than_the_disk_is_a_problem_at_capacity_share(self):
        d = self.tmpdir()
        free = shutil.disk_usage(d).free
        cfg = self.yaml("version: 1\ntiers:\n  - name: disk\n    type: ssd\n"
                        f"    capacity: {2 * free + (1 << 30)}\n    paths: [{d}]\n", d)
        rc, out, _ = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 1)
        problems = json.loads(out)["problems"]
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("share of the capacity", problems[0])

    def test_a_shared_dram_tier_in_use_is_read_in_place_and_its_geometry_compared(self):
        name = self.shm_name()
        d = self.tmpdir()
        cfg = self.yaml("version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 64MiB\n"
                        f"    options:\n      shm_name: {name}\n", d)
        report, _ = self.holder(cfg, 7, 50000)
        self.assertEqual(report["objects"], 7)
        rc, out, err = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 0, out + err)
        tier = json.loads(out)["tiers"][0]
        self.assertEqual(tier["state"], "in use")
        self.assertIn("7 objects", tier["detail"])
        self.assertIn("attached by 1 process", tier["detail"])
        # The same tier asked for with another capacity: every process must give the same one.
        other = self.yaml("version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 32MiB\n"
                          f"    options:\n      shm_name: {name}\n")
        rc, out, _ = run_cli("check", "--json", other)
        self.assertEqual(rc, 1)
        problems = json.loads(out)["problems"]
        self.assertEqual(len(problems), 1, problems)
        self.assertTrue(problems[0].startswith(other + ":5:15: key 'tiers[0].capacity'"),
                        problems[0])

    def test_an_ssd_path_per_rank_and_a_tier_name_its_file_does_not_keep(self):
        """{rank} in a path is the --rank given; the data file probed is the one the tier itself
        names (a leading '.' made '_'), found here in use by the store that holds it."""
        d = self.tmpdir()
        os.mkdir(os.path.join(d, "r0"))
        os.mkdir(os.path.join(d, "r3"))
        tier = ".disk-1"
        held = self.yaml(f"version: 1\ntiers:\n  - name: '{tier}'\n    type: ssd\n"
                         f"    capacity: 16MiB\n    paths: [{d}/r3]\n")
        self.holder(held, 2, 30000)
        self.assertEqual(os.listdir(os.path.join(d, "r3")), ["kvstrata-_disk-1.data"])
        cfg = self.yaml(f"version: 1\ntiers:\n  - name: '{tier}'\n    type: ssd\n"
                        f"    capacity: 16MiB\n    paths: ['{d}/r{{rank}}']\n", d)
        rc, out, err = run_cli("check", "--json", "--rank", "3", cfg)
        self.assertEqual(rc, 0, out + err)
        t = json.loads(out)["tiers"][0]
        self.assertEqual(t["state"], "in use")
        self.assertIn(f"{d}/r3: data file of", t["detail"])
        self.assertIn("open in a running process", t["detail"])
        rc, out, err = run_cli("check", "--json", cfg)  # rank 0: its directory holds no file yet
        self.assertEqual(rc, 0, out + err)
        t = json.loads(out)["tiers"][0]
        self.assertEqual(t["state"], "ok")
        self.assertNotIn("data file", t["detail"])
        self.assertIn(f"{d}/r0:", t["detail"])

    def test_a_redis_server_nobody_listens_on_is_a_problem_at_its_nodes(self):
        with socket.socket() as s:  # a port nothing listens on (bound, never listening)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            cfg = self.yaml("version: 1\ntiers:\n  - name: r\n    type: redis\n"
                            f"    nodes: [127.0.0.1:{port}]\n    options: {{timeout_ms: 200}}\n")
            rc, out, _ = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 1)
        problems = json.loads(out)["problems"]
        self.assertEqual(len(problems), 1, problems)
        self.assertTrue(problems[0].startswith(cfg + ":5:12: key 'tiers[0].nodes'"), problems[0])
        self.assertIn("cannot be reached", problems[0])

    def test_a_running_redis_server_opens(self):
        d = self.tmpdir()
        sock = self.redis_server(d)
        cfg = self.yaml(f"version: 1\ntiers:\n  - name: r\n    type: redis\n    nodes: [{sock}]\n", d)
        rc, out, err = run_cli("check", "--json", cfg)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(json.loads(out)["tiers"][0]["state"], "ok")

    def test_usage_errors_exit_2_and_help_exits_0(self):
        self.assertEqual(run_cli("check")[0], 2)
        self.assertEqual(run_cli("check", "--bogus", "x.yaml")[0], 2)
        rc, out, _ = run_cli("check", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("usage: kvstrata check", out)
        self.assertEqual(run_cli("no-such-command")[0], 2)


class Stats(Dirs, unittest.TestCase):
    def deployment(self, ssd=True):
        """A shared DRAM tier (over an SSD directory: one process owns that), with a metrics
        section of its own."""
        d = self.tmpdir()
        os.mkdir(os.path.join(d, "ssd"))
        name = self.metrics_name()
        self.port = free_port()
        section = f"metrics:\n  listen: 127.0.0.1:{self.port}\n  name: {name}\n"
        disk = (f"  - name: disk\n    type: ssd\n    capacity: 64MiB\n    paths: [{d}/ssd]\n"
                if ssd else "")
        return self.yaml(f"version: 1\n{section}tiers:\n  - name: dram\n    type: dram\n"
                         f"    capacity: 64MiB\n    options:\n      shm_name: {self.shm_name()}\n"
                         + disk, d)

    def stats(self, target, *more):
        rc, out, err = run_cli("stats", "--json", *more, target)
        self.assertEqual(rc, 0, out + err)
        return json.loads(out)

    def wait_published(self, cfg, gets):
        """The holder's store publishes twice a second: wait for its figures to arrive."""
        for _ in range(50):
            doc = self.stats(cfg)
            if sum(t["gets"] or 0 for t in doc["tenants"]) >= gets:
                return doc
            time.sleep(0.1)
        self.fail("the holder's counters never arrived: %s" % doc)

    def test_a_shared_tier_in_use_and_its_processes_counters_match_what_they_did(self):
        cfg = self.deployment(ssd=False)
        a, _ = self.holder(cfg, 9, 40000, "team-a")
        b, _ = self.holder(cfg, 4, 40000, "team-b")
        doc = self.wait_published(cfg, a["stats"]["gets"] + b["stats"]["gets"])
        dram = doc["tiers"][0]
        self.assertEqual(dram["tier"], "dram")
        # contents read in place: both tenants' objects, exactly as each store's usage says
        self.assertEqual(dram["objects"], 13)
        self.assertEqual(dram["objects"], b["objects"])
        self.assertEqual(dram["bytes"], b["bytes"])
        self.assertEqual(dram["hits"], a["hits"] + b["hits"])
        self.assertEqual(doc["processes"], 2)
        tenants = {t["tenant"]: t for t in doc["tenants"]}
        for name, report in (("team-a", a), ("team-b", b)):
            st = report["stats"]
            self.assertEqual(tenants[name]["gets"], st["gets"])
            self.assertEqual(tenants[name]["get_misses"], st["get_misses"])
            self.assertEqual(tenants[name]["saves"], st["puts_stored"])
            self.assertEqual(tenants[name]["saved_bytes"], st["put_bytes"])
        self.assertEqual(tenants["team-a"]["get_misses"], 3)
        # the endpoint one of the holders serves says the same
        ep = self.stats(f"127.0.0.1:{self.port}")
        self.assertEqual({t["tenant"]: t["gets"] for t in ep["tenants"]},
                         {k: v["gets"] for k, v in tenants.items()})
        self.assertEqual(ep["tiers"][0]["hits"], dram["hits"])
        rc, out, _ = run_cli("stats", cfg)
        self.assertEqual(rc, 0)
        self.assertIn("team-b", out)
        self.assertIn("2 process(es) publishing", out)

    def test_counters_outlive_the_processes_and_an_ssd_directory_is_read_from_disk(self):
        cfg = self.deployment()
        a, p = self.holder(cfg, 5, 40000, "team-a")
        live = self.wait_published(cfg, a["stats"]["gets"])
        # the SSD tier the holder has open: described by what it publishes, its headers not read
        self.assertIn("the figures it publishes", live["tiers"][1]["note"])
        self.assertEqual(live["tiers"][1]["objects"], 0)
        p.stdin.close()
        p.wait(20)
        doc = self.stats(cfg)
        self.assertEqual(doc["processes"], 0)
        self.assertEqual(doc["tenants"][0]["gets"], a["stats"]["gets"])  # kept after its exit
        # the shared tier left with its last process (unlinked): it holds nothing now
        self.assertEqual(doc["tiers"][0]["objects"], 0)
        self.assertEqual(doc["tiers"][1]["objects"], 0)  # nothing was written back to the SSD
        self.assertIn("no process holds the tier", doc["tiers"][0]["note"])
        # an SSD-only deployment: what a store put, read from the directory once it closed
        d = self.tmpdir()
        ssd = self.yaml(f"version: 1\ntiers:\n  - name: disk\n    type: ssd\n    capacity: 64MiB\n"
                        f"    paths: [{d}]\n", d)
        _, q = self.holder(ssd, 6, 70000, "")
        # held open by a process that publishes no metrics: its headers are read only on request
        busy = self.stats(ssd)["tiers"][0]
        self.assertIsNone(busy["objects"])
        self.assertIn("--scan", busy["note"])
        for _ in range(50):  # read while the store holds the tier open (its writes land meanwhile)
            held = self.stats(ssd, "--scan")["tiers"][0]
            if held["objects"] == 6:
                break
            time.sleep(0.1)
        q.stdin.close()
        q.wait(20)
        closed = self.stats(ssd)
        self.assertFalse(closed["counters"])
        self.assertIn("metrics", closed["counters_note"])
        self.assertEqual(closed["tiers"][0]["objects"], 6)
        # the tier itself, opened again (its index rebuilt from the same headers), agrees
        from kvstrata.store import Store
        with Store("test-cli", config=ssd, max_value_bytes=1 << 20) as again:
            u = again.usage()[0]
        self.assertEqual((closed["tiers"][0]["objects"], closed["tiers"][0]["bytes"]),
                         (u.objects, u.bytes))
        self.assertEqual(held["objects"], 6)

    def test_an_ssd_path_per_rank_is_read_for_the_rank_given(self):
        d = self.tmpdir()
        os.mkdir(os.path.join(d, "r0"))
        os.mkdir(os.path.join(d, "r2"))
        tier = ".disk-2"
        held = self.yaml(f"version: 1\ntiers:\n  - name: '{tier}'\n    type: ssd\n"
                         f"    capacity: 16MiB\n    paths: [{d}/r2]\n")
        _, p = self.holder(held, 4, 30000)
        p.stdin.close()
        p.wait(20)
        cfg = self.yaml(f"version: 1\ntiers:\n  - name: '{tier}'\n    type: ssd\n"
                        f"    capacity: 16MiB\n    paths: ['{d}/r{{rank}}']\n", d)
        self.assertEqual(self.stats(cfg, "--rank", "2")["tiers"][0]["objects"], 4)
        rank0 = self.stats(cfg)["tiers"][0]  # the default rank, 0: nothing written there yet
        self.assertEqual(rank0["objects"], 0)
        self.assertIn("no data file yet", rank0["note"])
        self.assertEqual(run_cli("stats", "--rank", "x", cfg)[0], 2)

    def test_watch_refreshes_and_an_unreachable_endpoint_is_exit_1(self):
        cfg = self.deployment()
        a, _ = self.holder(cfg, 2, 1000, "t")
        self.wait_published(cfg, a["stats"]["gets"])
        rc, out, err = run_cli("stats", "--json", "--watch", "0.2", "--count", "3", cfg)
        self.assertEqual(rc, 0, err)
        docs = [json.loads(line) for line in out.splitlines() if line.strip()]
        self.assertEqual(len(docs), 3)
        self.assertTrue(all(d["tiers"][0]["objects"] == 2 for d in docs))
        rc, _, err = run_cli("stats", f"127.0.0.1:{free_port()}", "--timeout-ms", "500")
        self.assertEqual(rc, 1)
        self.assertIn("cannot connect", err)
        rc, _, err = run_cli("stats", "/nonexistent/deploy.yaml")
        self.assertEqual(rc, 1)
        self.assertEqual(run_cli("stats")[0], 2)
        self.assertEqual(run_cli("stats", "--help")[0], 0)


class EngineThread(Dirs, unittest.TestCase):
    def test_an_engine_publishing_metrics_never_asks_its_redis_servers_for_usage(self):
        """A connector handle publishes from the engine's own calls: a round trip to Redis there
        (DBSIZE, INFO) would stall the engine's step, so none is made."""
        d = self.tmpdir()
        sock = self.redis_server(d)
        name = self.metrics_name()
        cfg = self.yaml(f"version: 1\nmetrics:\n  listen: 127.0.0.1:{free_port()}\n  name: {name}\n"
                        "tiers:\n  - name: dram\n    type: dram\n    capacity: 1MiB\n"
                        f"  - name: r\n    type: redis\n    nodes: [{sock}]\n", d)
        engine = os.path.join(os.path.dirname(CLI), "kvs-mini-engine")
        run = subprocess.run([engine, "--config", cfg, "--sessions", "3", "--turns", "3",
                              "--doc-tokens", "512", "--quiet", "--json", "--connector-only"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        stats = subprocess.run(["redis-cli", "-s", sock, "INFO", "commandstats"],
                               capture_output=True, text=True, timeout=30).stdout
        self.assertIn("cmdstat_set", stats)  # the engine did use the tier
        self.assertNotIn("cmdstat_dbsize", stats)
        # and its counters reached the segment all the same
        doc = json.loads(run_cli("stats", "--json", cfg)[1])
        self.assertGreater(sum(t["lookup_tokens"] or 0 for t in doc["tenants"]), 0)


if __name__ == "__main__":
    unittest.main()
