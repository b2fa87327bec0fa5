"""kvstrata inspect ssd: an SSD tier's directories written by the mini engine under two models,
listed, verified (nothing changed), damaged, repaired, and served again; with replicas, a damaged
copy retired alone and its object kept.

Run by CTest (tests/CMakeLists.txt, label cli) with KVSTRATA (the kvstrata program) and
KVSTRATA_LIB (libkvstrata) in the environment; kvs-mini-engine is found beside kvstrata.
"""

import ctypes
import ctypes.util
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


REPLICAS_CONFIG = CONFIG + "      replicas: 2\n"

_xxhash = None


def xxh3(data):
    """XXH3-64 of data, through the system's libxxhash (the tier's checksums)."""
    global _xxhash
    if _xxhash is None:
        _xxhash = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
        _xxhash.XXH3_64bits.restype = ctypes.c_uint64
        _xxhash.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return _xxhash.XXH3_64bits(bytes(data), len(data))


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


def loaded_chunks(output):
    m = re.search(r"connector: .*chunks loaded (\d+) \(.*load errors (\d+)", output)
    if not m:
        raise AssertionError("no connector summary in: " + output)
    return int(m.group(1)), int(m.group(2))


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

    def test_a_bad_kv_layer_checksum_under_sound_unit_checksums_is_found_and_dropped(self):
        """One byte of a KV object's layer 0 changed and the unit's checksums sealed again over
        it: only the KV object's own layer checksum tells."""
        rc, doc, _ = self.inspect("--list", *self.paths)
        total = doc["summary"]["objects"]
        o = doc["objects"][2]
        with open(o["file"], "r+b") as f:
            f.seek(o["offset"])
            header = bytearray(f.read(4096))
            data_bytes = int.from_bytes(header[72:76], "little")
            data = bytearray(f.read(data_bytes))
            payload_offset = int.from_bytes(data[52:56], "little")
            self.assertLess(payload_offset + 7, data_bytes)
            data[payload_offset + 7] ^= 0x40
            header[80:88] = xxh3(data).to_bytes(8, "little")
            header[88:96] = xxh3(header[:88]).to_bytes(8, "little")
            f.seek(o["offset"])
            f.write(header)
            f.write(data)
        rc, doc, _ = self.inspect("--list", *self.paths)  # the headers alone see nothing
        self.assertEqual((rc, doc["summary"]["damaged"]), (0, 0))
        rc, doc, out = self.inspect("--verify", *self.paths)
        self.assertEqual(rc, 1, out.stderr)
        self.assertEqual([d["key"] for d in doc["damage"]], [o["key"]])
        self.assertIn("KV object layer 0 checksum mismatch", doc["damage"][0]["what"])
        rc, doc, out = self.inspect("--repair", "--list", *self.paths)
        self.assertEqual(rc, 0, out.stderr)
        self.assertEqual(doc["summary"]["dropped"], 1)
        self.assertEqual(doc["summary"]["objects"], total - 1)
        self.assertNotIn(o["key"], [x["key"] for x in doc["objects"]])

    def test_paths_of_a_config_per_rank(self):
        """{rank} in the tier's paths is --rank (default 0), as the tier of that rank reads it."""
        os.mkdir(os.path.join(self.work, "r2"))
        for sub in ("ssd0", "ssd1"):
            os.rename(os.path.join(self.work, sub), os.path.join(self.work, "r2", sub))
        config = os.path.join(self.work, "ranked.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.replace("[ssd0, ssd1]", "['r{rank}/ssd0', 'r{rank}/ssd1']"))
        rc, doc, out = self.inspect("--config", config, "--tier", "nvme", "--rank", "2")
        self.assertEqual(rc, 0, out.stderr)
        self.assertEqual(doc["summary"]["objects"], self.saved["fp16"] + self.saved["fp32"])
        self.assertTrue(all("/r2/ssd" in p["file"] for p in doc["paths"]))
        rc, _, out = self.inspect("--config", config, "--tier", "nvme", json_out=False)
        self.assertEqual(rc, 1)  # rank 0: r0/ssd0 does not exist
        self.assertIn("r0/ssd0", out.stderr)
        r = subprocess.run([KVSTRATA, "inspect", "ssd", "--rank", "2", *self.paths],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)  # --rank is for --config

    def test_a_data_file_named_twice_is_read_once_and_repair_runs(self):
        data = os.path.join(self.paths[0], "kvstrata-nvme.data")
        link = os.path.join(self.work, "link.data")
        os.symlink(os.path.join(self.paths[1], "kvstrata-nvme.data"), link)
        rc, doc, out = self.inspect("--repair", self.paths[0], data, link, self.paths[1])
        self.assertEqual(rc, 0, out.stderr)
        self.assertEqual(len(doc["paths"]), 2)
        self.assertIsNone(doc["summary"]["refused"])
        self.assertEqual(doc["summary"]["objects"], self.saved["fp16"] + self.saved["fp32"])

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


class InspectSsdReplicasTest(unittest.TestCase):
    """replicas: 2 over two paths: one copy of an object's unit damaged. The tier would read the
    other copy only if the damaged one failed to read; on a checksum mismatch it drops the object.
    A repair retires the damaged copy alone, so the object stays and is served from its good copy."""

    @classmethod
    def setUpClass(cls):
        if not (KVSTRATA and os.access(KVSTRATA, os.X_OK)):
            raise AssertionError("KVSTRATA names no program")
        cls.top = tempfile.TemporaryDirectory(prefix="kvstrata-inspect-replicas.")
        cls.template = os.path.join(cls.top.name, "template")
        os.makedirs(os.path.join(cls.template, "ssd0"))
        os.makedirs(os.path.join(cls.template, "ssd1"))
        with open(os.path.join(cls.template, "config.yaml"), "w") as f:
            f.write(REPLICAS_CONFIG)
        run_engine(cls.template, "--dtype", "fp16")

    @classmethod
    def tearDownClass(cls):
        cls.top.cleanup()

    def copy(self, name):
        work = os.path.join(self.top.name, name)
        shutil.copytree(self.template, work)
        self.addCleanup(shutil.rmtree, work, True)
        return work, [os.path.join(work, "ssd0"), os.path.join(work, "ssd1")]

    def inspect(self, *args):
        out = subprocess.run([KVSTRATA, "inspect", "ssd", "--json", *args], capture_output=True,
                             text=True, timeout=120)
        return out.returncode, json.loads(out.stdout), out

    def test_a_damaged_copy_is_retired_and_its_object_served_from_the_other(self):
        pristine, _ = self.copy("pristine")
        want = loaded_chunks(run_engine(pristine, "--dtype", "fp16", "--verify"))
        self.assertEqual(want[1], 0)
        self.assertGreater(want[0], 0)

        work, paths = self.copy("damaged")
        rc, doc, _ = self.inspect("--list", *paths)
        total = doc["summary"]["objects"]
        o = doc["objects"][0]
        self.assertEqual(o["replicas"], 2)
        with open(o["file"], "r+b") as f:  # copy 0 of unit 0: its data
            f.seek(o["offset"] + 4096 + 5000)
            b = f.read(1)
            f.seek(o["offset"] + 4096 + 5000)
            f.write(bytes([b[0] ^ 0x10]))
        rc, doc, out = self.inspect("--verify", *paths)
        self.assertEqual(rc, 1, out.stderr)
        self.assertEqual(doc["summary"]["damaged"], 1)
        self.assertEqual(len(doc["damage"]), 1)
        d = doc["damage"][0]
        self.assertEqual((d["key"], d["object_kept"], d["dropped"]), (o["key"], True, False))
        self.assertIn("another copy of this unit is good", d["what"])

        rc, doc, out = self.inspect("--repair", "--list", *paths)
        self.assertEqual(rc, 0, out.stderr)
        self.assertEqual(doc["summary"]["objects"], total)
        self.assertEqual(doc["summary"]["dropped"], 1)
        self.assertTrue(doc["damage"][0]["object_kept"] and doc["damage"][0]["dropped"])
        self.assertIn(o["key"], [x["key"] for x in doc["objects"]])
        rc, doc, _ = self.inspect("--verify", *paths)
        self.assertEqual((rc, doc["summary"]["damaged"], doc["summary"]["objects"]), (0, 0, total))
        # the tier reopened serves every object, the repaired one from its good copy, bit for bit
        out = run_engine(work, "--dtype", "fp16", "--verify")
        self.assertEqual(loaded_chunks(out), want)
        self.assertIn("0 mismatches", out)


if __name__ == "__main__":
    unittest.main()
