"""kvstrata compare: two configurations through the mini engine, side by side.

Run by CTest (tests/CMakeLists.txt, label cli) with KVSTRATA (the kvstrata program) and
KVSTRATA_LIB (libkvstrata) in the environment; kvs-mini-engine is found beside kvstrata.
"""

import json
import os
import signal
import struct
import subprocess
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET

KVSTRATA = os.environ.get("KVSTRATA", "")
LIB = os.environ.get("KVSTRATA_LIB", "")
# Small: a few seconds a run; 3 sessions push each other out of the engine's prefix cache, so
# every later turn is served by the connector.
WORKLOAD = ("--sessions 3 --turns 2 --doc-tokens 512 --system-tokens 64 --user-tokens 40 "
            "--decode-tokens 4")
TURNS = 6

FAST = """\
version: 1
chunk_tokens: 256
tiers:
  - name: fast
    type: dram
    capacity: 256MiB
"""
# The same tier read as a slow device: 50 ms more for every chunk read (two a later turn).
SLOW = """\
version: 1
chunk_tokens: 256
tiers:
  - name: slow
    type: dram
    capacity: 256MiB
    options:
      read_latency_us: 50000
      read_bandwidth: 50MiB/s
"""
BROKEN = """\
version: 1
chunk_tokens: 256
tiers:
  - name: broken
    type: dram
    capacity: 256MiB
    options:
      colour: red
"""


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(KVSTRATA and os.access(KVSTRATA, os.X_OK), "KVSTRATA names no program")
        self.dir = tempfile.TemporaryDirectory(prefix="kvstrata-compare-test.")
        self.tmp = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def config(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def compare(self, *args, env=None, timeout=300):
        cmd = [KVSTRATA, "compare", *args, "--lib", LIB, "--workload", WORKLOAD]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=self.tmp, env=env)

    def compare_json(self, *args, expect_rc=0, **kw):
        r = self.compare(*args, "--json", **kw)
        self.assertEqual(r.returncode, expect_rc, r.stdout + r.stderr)
        return json.loads(r.stdout)

    @staticmethod
    def tiers(run):
        return {t["name"]: t for t in run["tiers"]}

    def check_tier_figures(self, run, own, other):
        tiers = self.tiers(run)
        self.assertEqual(list(tiers), [own], run)
        self.assertNotIn(other, tiers)
        self.assertGreater(tiers[own]["chunks_loaded"], 0)
        self.assertGreater(tiers[own]["bytes_loaded"], 0)
        self.assertGreater(tiers[own]["hit_rate"], 0)
        self.assertAlmostEqual(tiers[own]["hit_rate"], run["hit_rate"], places=4)
        self.assertGreater(run["connector_hit_tokens"], 0)

    def test_the_faster_configuration_is_reported_faster_in_either_column(self):
        fast = self.config("fast.yaml", FAST)
        slow = self.config("slow.yaml", SLOW)
        doc = self.compare_json(fast, slow, "--no-plot")
        a, b, base = doc["runs"]
        self.assertTrue(a["ok"] and b["ok"] and base["ok"], doc)
        self.assertEqual(doc["faster"], "A")
        self.assertGreater(doc["b_over_a"]["later_turns_mean"], 1.0)
        self.assertGreater(b["later_turns"]["mean_ms"], a["later_turns"]["mean_ms"])
        self.check_tier_figures(a, "fast", "slow")
        self.check_tier_figures(b, "slow", "fast")
        # the run without the connector: no tiers, no connector hits
        self.assertIsNone(base["config"])
        self.assertEqual(base["tiers"], [])
        self.assertEqual(base["connector_hit_tokens"], 0)
        for run in (a, b, base):
            self.assertEqual(len(run["ttft_ms"]), TURNS, run)
            self.assertEqual(len(run["later_ttft_ms"]), run["later_turns"]["n"], run)
            self.assertEqual(run["all_turns"]["n"], TURNS)
        # the same pair the other way round: the verdict follows the configuration, not the column
        doc = self.compare_json(slow, fast, "--no-plot", "--no-baseline")
        self.assertEqual(len(doc["runs"]), 2)
        self.assertEqual(doc["faster"], "B")
        self.assertLess(doc["b_over_a"]["later_turns_mean"], 1.0)
        self.check_tier_figures(doc["runs"][0], "slow", "fast")

    def test_table_and_svg_picture(self):
        fast = self.config("fast.yaml", FAST)
        slow = self.config("slow.yaml", SLOW)
        svg = os.path.join(self.tmp, "ttft.svg")
        r = self.compare(fast, slow, "--plot", svg)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = r.stdout
        self.assertIn("TTFT later turns, mean (ms)", out)
        self.assertIn("from tier fast", out)
        self.assertIn("from tier slow", out)
        self.assertIn("A (fast.yaml) is faster", out)
        self.assertIn("picture: " + svg, out)
        # a progress line per run on stderr
        self.assertEqual(len([l for l in r.stderr.splitlines() if "done in" in l]), 3, r.stderr)
        root = ET.parse(svg).getroot()
        self.assertEqual(root.tag, "{http://www.w3.org/2000/svg}svg")
        text = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
        self.assertIn("A: fast.yaml", text)
        self.assertIn("B: slow.yaml", text)
        self.assertIn("TTFT (ms", text)
        # the default picture is compare.svg in the current directory
        r = self.compare(fast, slow, "--no-baseline")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        ET.parse(os.path.join(self.tmp, "compare.svg"))

    def test_png_picture(self):
        fast = self.config("fast.yaml", FAST)
        slow = self.config("slow.yaml", SLOW)
        png = os.path.join(self.tmp, "ttft.png")
        doc = self.compare_json(fast, slow, "--no-baseline", "--plot", png)
        self.assertEqual(doc["plot"], png)
        with open(png, "rb") as f:
            head = f.read(33)
        self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n")
        length, kind, width, height = struct.unpack(">I4sII", head[8:24])
        self.assertEqual(kind, b"IHDR")
        self.assertEqual(length, 13)
        self.assertGreater(width, 0)
        self.assertGreater(height, 0)

    def test_a_broken_configuration_fails_its_column_only(self):
        fast = self.config("fast.yaml", FAST)
        broken = self.config("broken.yaml", BROKEN)
        doc = self.compare_json(fast, broken, "--no-plot", expect_rc=1)
        a, b, base = doc["runs"]
        self.assertTrue(a["ok"], a)
        self.assertGreater(a["later_turns"]["mean_ms"], 0)
        self.check_tier_figures(a, "fast", "broken")
        self.assertTrue(base["ok"], base)
        self.assertFalse(b["ok"])
        self.assertIn("colour", b["error"])
        self.assertIn("broken.yaml", b["error"])
        self.assertIsNone(doc["faster"])
        r = self.compare(fast, broken, "--no-plot", "--no-baseline")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("B (%s) failed: open failed" % broken, r.stdout)
        self.assertIn("unknown option \"colour\"", r.stdout)
        self.assertIn("No verdict", r.stdout)

    def test_a_crash_and_a_hang_are_reported_and_stopped(self):
        engine = os.path.join(os.path.dirname(KVSTRATA), "kvs-mini-engine")
        marker = "61.%d" % os.getpid()  # a sleep no one else runs
        wrapper = self.config("engine.sh", textwrap.dedent("""\
            #!/bin/sh
            case "$*" in
              *crash.yaml*) kill -SEGV $$ ;;
              *hang.yaml*) exec sleep %s ;;
            esac
            exec %s "$@"
            """ % (marker, engine)))
        os.chmod(wrapper, 0o755)
        crash = self.config("crash.yaml", FAST)
        hang = self.config("hang.yaml", FAST)
        # no baseline: its run, the slowest, could itself pass 2 s on a loaded machine
        doc = self.compare_json(crash, hang, "--engine", wrapper, "--timeout", "2", "--no-plot",
                                "--no-baseline", expect_rc=1)
        a, b = doc["runs"]
        self.assertFalse(a["ok"])
        self.assertIn("signal %d" % signal.SIGSEGV, a["error"])
        self.assertFalse(b["ok"])
        self.assertIn("no result within 2 s", b["error"])
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        self.assertNotIn(marker.encode(), f.read(), "the stopped run lives on")
                except OSError:
                    pass

    def test_without_gnuplot_the_table_still_prints(self):
        fast = self.config("fast.yaml", FAST)
        slow = self.config("slow.yaml", SLOW)
        env = dict(os.environ, PATH=self.tmp)  # no gnuplot there
        r = self.compare(fast, slow, "--no-baseline", env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("A (fast.yaml) is faster", r.stdout)
        self.assertIn("no picture: gnuplot is not on PATH", r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "compare.svg")))

    def test_a_warm_start_is_said(self):
        """An SSD tier keeps a run's saves for the next: compare counts what a configuration's
        tiers held before its run and says when it was not a cold start."""
        os.mkdir(os.path.join(self.tmp, "ssd"))
        disk = self.config("disk.yaml", "version: 1\nchunk_tokens: 256\ntiers:\n  - name: disk\n"
                           "    type: ssd\n    capacity: 64MiB\n"
                           f"    paths: [{self.tmp}/ssd]\n")
        fast = self.config("fast.yaml", FAST)
        cold = self.compare_json(fast, disk, "--no-plot", "--no-baseline")
        self.assertEqual([r["stored_before"] for r in cold["runs"]], [0, 0])
        saved = cold["runs"][1]["chunks_saved"]
        self.assertGreater(saved, 0)
        r = self.compare(fast, disk, "--no-plot", "--no-baseline")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("Warm start: B began with %d objects already stored (disk: %d objects)"
                      % (saved, saved), r.stdout)
        self.assertNotIn("Warm start: A", r.stdout)
        row = [line for line in r.stdout.splitlines() if line.startswith("objects stored before")]
        self.assertEqual(row[0].split()[-2:], ["0", str(saved)])

    def test_help_and_usage_errors(self):
        r = subprocess.run([KVSTRATA, "compare", "--help"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)
        self.assertTrue(r.stdout.startswith("usage: kvstrata compare A.yaml B.yaml"))
        self.assertIn("--workload", r.stdout)
        for args in (["one.yaml"], ["a.yaml", "b.yaml", "c.yaml"], ["a.yaml", "b.yaml", "--bogus"],
                     ["a.yaml", "b.yaml", "--workload", "--config x.yaml"],
                     ["a.yaml", "b.yaml", "--", "--turns-out", "x"],
                     ["a.yaml", "b.yaml", "--timeout", "0"], ["a.yaml", "b.yaml", "--plot", "x.pdf"]):
            r = subprocess.run([KVSTRATA, "compare", *args], capture_output=True, text=True,
                               cwd=self.tmp)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertIn("kvstrata compare: ", r.stderr)


if __name__ == "__main__":
    unittest.main()
