"""kvstrata inspect ssd: an SSD tier's directories written by the mini engine under two models,
listed, verified (nothing changed), damaged, repaired, and served again.

Run by CTest (tests/CMakeLists.txt, label cli) with KVSTRATA (the kvstrata program) and
KVSTRATA_LIB (libkvstrata) in the environment; kvs-mini-engine is found beside kvstrata.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

KVSTRATA = os.environ.get("KVSTRATA", "")
LIB = os.environ.get("KVSTRATA_LIB", "")
WORKLOAD = "--sessions 2 --turns 2 --doc-tokens 600 --system-tokens 64".split()
CONFIG = textwrap.dedent("""\
    version: 1
    chunk_tokens: 256
    tiers:
      - name: nvme
        type: ssd
        capacity: 32MiB
        paths: [ssd0, ssd1]
        options:
          stripe_bytes: 64KiB
    """)


def engine():
    return os.path.join(os.path.dirname(KVSTRATA), "kvs-mini-engine")


def run_engine(workdir, *extra):
    cmd = [engine(), "--quiet", "--config", os.path.join(workdir, "config.yaml"), *WORKLOAD, *extra]
    if LIB:
        cmd += ["--lib", LIB]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"{cmd} failed: {out.stdout}{out.stderr}")
    return out.stdout + out.stderr


def saved_chunks(output):
    m = re.search(r"connector: .*saved (\d+) \(", output)
    if not m:
        raise AssertionError("no connector summary in: " + output)
    return int(m.group(1))


def file_digests(workdir):
    out = {}
    for sub in ("ssd0", "ssd1"):
        path = os.path.join(workdir, sub, "kvstrata-nvme.data")
        with open(path, "rb") as f:
            out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


class InspectSsdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not (KVSTRATA and os.access(KVSTRATA, os.X_OK)):
            raise AssertionError("KVSTRATA names no program")
        cls.top = tempfile.TemporaryDirectory(prefix="kvstrata-inspect-test.")
        cls.template = os.path.join(cls.top.name, "template")
        os.makedirs(os.path.join(cls.template, "ssd0"))
        os.makedirs(os.path.join(cls.template, "ssd1"))
        with open(os.path.join(cls.template, "config.yaml"), "w") as f:
            f.write(CONFIG)
        # two models: fp16 and fp32 KV of the same weights have different fingerprints
        cls.saved = {"fp16": saved_chunks(run_engine(cls.template, "--dtype", "fp16")),
                     "fp32": saved_chunks(run_engine(cls.template, "--dtype", "fp32"))}

    @classmethod
    def tearDownClass(cls):
        cls.top.cleanup()

    def setUp(self):
        self.work = tempfile.mkdtemp(dir=self.top.name)
        shutil.rmtree(self.work)
        shutil.copytree(self.template, self.work)
        self.paths = [os.path.join(self.work, "ssd0"), os.path.join(self.work, "ssd1")]
        self.holder = None

    def tearDown(self):
        if self.holder:
            if self.holder.poll() is None:
                self.holder.kill()
                self.holder.wait()
            self.holder.stdout.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def inspect(self, *args, json_out=True):
        cmd = [KVSTRATA, "inspect", "ssd", *args]
        if json_out:
            cmd.append("--json")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        doc = json.loads(out.stdout) if json_out else None
        return out.returncode, doc, out

    def test_the_listing_counts_what_the_engines_saved_per_model_and_path(self):
        rc, doc, out = self.inspect("--list", *self.paths)
        self.assertEqual(rc, 0, out.stderr)
        total = self.saved["fp16"] + self.saved["fp32"]
        s = doc["summary"]
        self.assertEqual(s["objects"], total)
        self.assertEqual(len(doc["objects"]), total)
        self.assertEqual(s["damaged"], 0)
        self.assertEqual(sum(o["bytes"] for o in doc["objects"]), s["bytes"])
        fps = sorted(f["objects"] for f in doc["fingerprints"])
        self.assertEqual(fps, sorted(self.saved.values()))
        self.assertTrue(all(f["fingerprint"] for f in doc["fingerprints"]))
        self.assertEqual(len(doc["paths"]), 2)
        self.assertEqual(sum(p["bytes"] for p in doc["paths"]), s["bytes"])
        self.assertEqual(sum(p["capacity"] for p in doc["paths"]), s["capacity"])
        self.assertTrue(all(p["tier"] == "nvme" and p["superblock_ok"] for p in doc["paths"]))
        # the paths from the YAML give the same listing
        rc2, doc2, _ = self.inspect("--list", "--config", os.path.join(self.work, "config.yaml"),
                                    "--tier", "nvme")
        self.assertEqual(rc2, 0)
        self.assertEqual(doc2["summary"]["objects"], total)
        self.assertEqual(doc2["fingerprints"], doc["fingerprints"])

    def test_the_default_listing_is_bounded(self):
        rc, _, out = self.inspect("--limit", "3", *self.paths, json_out=False)
        self.assertEqual(rc, 0)
        rows = [l for l in out.stdout.splitlines() if "kvstrata-nvme.data@" in l]
        self.assertEqual(len(rows), 3)
        self.assertRegex(out.stdout, r"\.\.\. \d+ more objects")

    def flip_payload_byte(self, doc, index):
        """Flip a byte 5000 bytes into object `index`'s unit 0 data; returns its key."""
        o = doc["objects"][index]
        self.assertGreater(o["bytes"], 5000)
        with open(o["file"], "r+b") as f:
            f.seek(o["offset"] + 4096 + 5000)
            b = f.read(1)
            f.seek(o["offset"] + 4096 + 5000)
            f.write(bytes([b[0] ^ 0x10]))
        return o["key"]

    def test_verify_finds_the_flipped_object_and_changes_nothing(self):
        rc, doc, _ = self.inspect("--list", *self.paths)
        self.assertEqual(rc, 0)
        key = self.flip_payload_byte(doc, 1)
        before = file_digests(self.work)
        rc, doc, out = self.inspect("--verify", "--list", *self.paths)
        self.assertEqual(rc, 1, out.stderr)
        self.assertEqual(file_digests(self.work), before)
        self.assertEqual(doc["summary"]["damaged"], 1)
        self.assertEqual([d["key"] for d in doc["damage"]], [key])
        self.assertIn("payload checksum mismatch", doc["damage"][0]["what"])
        self.assertEqual([o["key"] for o in doc["objects"] if o["damaged"]], [key])
        rc, _, out = self.inspect("--verify", *self.paths, json_out=False)
        self.assertEqual(rc, 1)
        self.assertIn("verified: 1 damaged; nothing was changed", out.stdout)
        self.assertEqual(file_digests(self.work), before)

    def test_repair_is_refused_while_held_then_drops_the_damage_and_the_tier_serves(self):
        rc, doc, _ = self.inspect("--list", *self.paths)
        total = doc["summary"]["objects"]
        key = self.flip_payload_byte(doc, 0)
        held = os.path.join(self.paths[0], "kvstrata-nvme.data")
        # a process holding the tier's lock, as a running tier does (flock, LOCK_EX)
        self.holder = subprocess.Popen(
            [sys.executable, "-c",
             "import fcntl, sys, time\n"
             "f = open(sys.argv[1], 'rb')\n"
             "fcntl.flock(f, fcntl.LOCK_EX)\n"
             "print('locked', flush=True)\n"
             "time.sleep(60)\n", held],
            stdout=subprocess.PIPE, text=True)
        self.assertEqual(self.holder.stdout.readline().strip(), "locked")
        before = file_digests(self.work)
        rc, _, out = self.inspect("--repair", *self.paths, json_out=False)
        self.assertEqual(rc, 1)
        self.assertIn("is in use", out.stderr)
        self.assertIn(f"process {self.holder.pid}", out.stderr)
        self.assertIn("--verify works while the tier runs", out.stderr)
        self.assertEqual(file_digests(self.work), before)
        rc, doc, _ = self.inspect("--verify", *self.paths)
        self.assertEqual(rc, 1)
        self.assertTrue(doc["summary"]["in_use"])
        self.assertEqual([d["key"] for d in doc["damage"]], [key])
        self.holder.kill()
        self.holder.wait()

        rc, doc, out = self.inspect("--repair", "--list", *self.paths)
        self.assertEqual(rc, 0, out.stderr)
        self.assertEqual(doc["summary"]["dropped"], 1)
        self.assertEqual(doc["summary"]["objects"], total - 1)
        self.assertNotIn(key, [o["key"] for o in doc["objects"]])
        rc, doc, _ = self.inspect("--verify", *self.paths)
        self.assertEqual(rc, 0)
        self.assertEqual(doc["summary"]["damaged"], 0)
        # the tier opens over the repaired files and serves what is left, bit for bit
        out = run_engine(self.work, "--dtype", "fp16", "--verify")
        self.assertNotRegex(out, r"load errors [1-9]")

    def test_exit_statuses_and_usage(self):
        self.assertEqual(subprocess.run([KVSTRATA, "inspect", "--help"],
                                        capture_output=True).returncode, 0)
        self.assertEqual(subprocess.run([KVSTRATA, "inspect", "ssd", "--help"],
                                        capture_output=True).returncode, 0)
        for args in (["inspect"], ["inspect", "ssd"], ["inspect", "ssd", "--limit", "x", "."],
                     ["inspect", "dram", "."], ["inspect", "ssd", "--config", "x.yaml"]):
            r = subprocess.run([KVSTRATA, *args], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, args)
        r = subprocess.run([KVSTRATA, "inspect", "ssd", os.path.join(self.work, "nothing")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("nothing", r.stderr)


if __name__ == "__main__":
    unittest.main()
