"""Every tier in vLLM's process layout: a scheduler and two tensor-parallel workers per instance, in
processes of their own (the replay harness), over tiers a kvstrata-node owns (docs/vllm.md "Tiers
in vLLM's processes"). Saves in one instance, loads in another, byte for byte, counted per tier;
kill -9 of the owner, of a worker and of a scheduler while loads run."""

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

from kvs_harness import Harness, Node, prompt

SSD_ONE = ("  - name: nvme\n    type: ssd\n    capacity: 32MiB\n    paths: [{dir}/ssd0]\n"
           "    options:\n      stripe_bytes: 64KiB\n")
SSD_TWO = ("  - name: nvme\n    type: ssd\n    capacity: 32MiB\n"
           "    paths: [{dir}/ssd0, {dir}/ssd1]\n    options:\n      stripe_bytes: 64KiB\n")
CHAIN = ("  - name: dram\n    type: dram\n    capacity: 16MiB\n    options:\n"
         "      shm_name: kvs-layout-{pid}\n" + SSD_TWO)

N_TOKENS = 106  # three chunks of 32 tokens and a partial one
HIT = 96
EXACT = {0: [], 1: []}  # no wrong block on either rank


def finished(h, rid):
    return lambda: h.info(rid)["status"] == "FINISHED"


def wait_steps(h, until, max_steps=400):
    for _ in range(max_steps):
        if until():
            return
        h.step()
        time.sleep(0.005)
    raise AssertionError(f"not done after {max_steps} steps")


def far_chunks_loaded(h, rank, tier="far"):
    return sum(outs[rank].stats.data.get("tiers", {}).get(tier, {}).get("chunks_loaded", 0)
               for _so, outs, _b in h.steps if outs[rank].stats)


def documented_yaml(marker="tested as written: tests/python/test_replay_layout.py"):
    """The YAML blocks of docs/vllm.md that follow the marker, in order."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "vllm.md")) as f:
        text = f.read()
    blocks = []
    for part in text.split(marker)[1:]:
        body = part.split("```yaml\n", 1)[1]
        blocks.append(body.split("```", 1)[0])
    return blocks


def substitute(text, pairs):
    """text with each (old, new) replaced, each old present exactly once."""
    for old, new in pairs:
        assert text.count(old) == 1, (old, text)
        text = text.replace(old, new)
    return text


class Instances:
    """Instances of one deployment (each: its own DRAM tier in shared memory, writing through to
    the node's tiers under one tenant), as several vLLM servers on one host."""

    def __init__(self, test, node_tiers):
        self.test = test
        self.node = Node(test, tiers=node_tiers.replace("{pid}", str(os.getpid())))
        self.tier = self.node.tier("layout", timeout_ms=2000)

    def new(self):
        return Harness(self.test, tp=2, tiers_below=self.tier)

    def wait_held(self, tokens, want=HIT):
        """Until a scheduler with an empty DRAM tier of its own finds `want` tokens on the node
        (the workers queue their puts to it and send them while they run)."""
        probe = self.new()
        for i in range(600):
            if probe.probe(f"p{i}", tokens, 0) == (want, False):
                break
            time.sleep(0.01)
        self.test.assertEqual(probe.probe("p", tokens, 0), (want, False), "held by the node")
        probe.close()

    def stored(self, seed):
        """A prompt one instance computed and the node holds; returns its tokens."""
        a = prompt(seed, N_TOKENS)
        first = self.new()
        first.add("A", a, max_tokens=1)
        wait_steps(first, finished(first, "A"))
        self.wait_held(a)
        return a

    def restored(self, rid, tokens):
        """A new instance's request of `tokens`: looked up as a hit, loaded from the node's tiers by
        each rank (its shard of the three chunks), exact. Returns the instance."""
        h = self.new()
        h.add(rid, tokens, max_tokens=2)
        wait_steps(h, lambda: h.info(rid)["num_computed"] >= N_TOKENS)
        self.test.assertEqual(h.info(rid)["lookups"][-1][1], HIT)
        self.test.assertEqual(h.check(rid), EXACT, "restored byte for byte")
        self.test.assertEqual([far_chunks_loaded(h, r) for r in (0, 1)], [3, 3])
        return h


class ServedByTheOwner(unittest.TestCase):
    def save_in_one_instance_load_in_another(self, node_tiers):
        inst = Instances(self, node_tiers)
        # another instance: its DRAM tier is empty, the node's tiers are not
        inst.restored("B", inst.stored(31))
        return inst

    def test_an_ssd_tier_on_one_path(self):
        inst = self.save_in_one_instance_load_in_another(SSD_ONE)
        stats = inst.node.stop()
        self.assertGreaterEqual(int(stats["gets"]), 6, "the node's only tier, the ssd, served them")

    def test_an_ssd_tier_on_two_paths(self):
        inst = self.save_in_one_instance_load_in_another(SSD_TWO)
        files = [os.path.join(inst.node.dir, d, "kvstrata-nvme.data") for d in ("ssd0", "ssd1")]
        self.assertTrue(all(os.path.exists(f) for f in files), "one data file per path")

    def test_a_chain_of_shared_dram_over_ssd(self):
        self.save_in_one_instance_load_in_another(CHAIN)


def lender(test, sock):
    """A kvstrata-lend (host memory) of 8 units of 1MiB on `sock`, stopped at cleanup."""
    lib = os.environ.get("KVSTRATA_LIBRARY", "")
    binary = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib))), "bin",
                          "kvstrata-lend")
    if not os.access(binary, os.X_OK):
        raise unittest.SkipTest(f"no kvstrata-lend at {binary} (build it: make build)")
    proc = subprocess.Popen([binary, "--socket", sock, "--units", "8", "--unit-size", "1MiB"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    # its event lines are read and dropped, so a full pipe never stops it
    drain = threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True)
    drain.start()

    def stop():
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        drain.join(5)  # at the end of its output
        proc.stdin.close()
        proc.stdout.close()
    test.addCleanup(stop)
    test.assertTrue(first.startswith("ready "), first)
    return proc


class WorkersOwnTheirTier(unittest.TestCase):
    """compress and peer_gpu keep their bytes in each worker's process (its heap, its lent GPU
    memory); with index_shm the workers publish what they hold and the scheduler's lookups find and
    pin it there (docs/vllm.md "Tiers in vLLM's processes")."""

    def saved_then_loaded(self, top, tier, text=None):
        d = tempfile.mkdtemp(prefix="kvs-layout-")
        self.addCleanup(shutil.rmtree, d, True)
        pid = os.getpid()
        if text is None:
            text = ("version: 1\nchunk_tokens: 32\ntiers:\n"
                    + top.format(dir=d, pid=pid)
                    + f"  - name: dram\n    type: dram\n    capacity: 16MiB\n"
                      f"    options:\n      shm_name: kvs-layout-below-{pid}\n")
        path = os.path.join(d, "kvstrata.yaml")
        with open(path, "w") as f:
            f.write(text)
        h = Harness(self, tp=2, extra_config={"config": path})
        a = prompt(41, N_TOKENS)
        h.add("A", a, max_tokens=1)
        wait_steps(h, finished(h, "A"))
        h.add("B", a, max_tokens=2)
        wait_steps(h, lambda: h.info("B")["num_computed"] >= N_TOKENS)
        self.assertEqual(h.info("B")["lookups"][-1][1], HIT, "the scheduler found the workers' chunks")
        self.assertEqual(h.check("B"), EXACT, "loaded byte for byte")
        self.assertEqual([far_chunks_loaded(h, r, tier) for r in (0, 1)], [3, 3],
                         f"each rank's shard served by its own {tier} tier")
        return h, path, a

    ZIP = ("  - name: zip\n    type: compress\n    capacity: 8MiB\n    options:\n"
           "      index_shm: kvs-layout-zip-{pid}\n")

    def test_a_compress_tier_over_shared_dram(self):
        self.saved_then_loaded(self.ZIP, "zip")

    def test_an_instance_killed_and_started_again(self):
        # kill -9 of every process of the instance: nothing detaches, the index keeps naming what
        # the dead workers held. The instance started again on the same YAML finds those entries,
        # its workers' loads miss (error blocks, recomputed: the model's KV), the misses withdraw
        # them, and what it computes is saved and served again.
        h, path, a = self.saved_then_loaded(self.ZIP, "zip")
        for actor in h.actors:
            os.kill(actor.proc.pid, signal.SIGKILL)
            actor.proc.join(10)
        again = Harness(self, tp=2, extra_config={"config": path})
        again.add("C", a, max_tokens=2)
        so, _outs, back = again.step()
        self.assertEqual(again.info("C")["lookups"][-1][1], HIT, "the dead workers' entries")
        self.assertTrue(back.invalid_block_ids, "their loads missed: error blocks, not wrong KV")
        wait_steps(again, lambda: again.info("C")["num_computed"] >= N_TOKENS)
        self.assertEqual(again.check("C"), EXACT, "recomputed: the model's KV")
        wait_steps(again, finished(again, "C"))
        again.add("D", a, max_tokens=2)
        wait_steps(again, lambda: again.info("D")["num_computed"] >= N_TOKENS)
        self.assertEqual(again.info("D")["lookups"][-1][1], HIT)
        self.assertEqual(again.check("D"), EXACT)
        self.assertEqual([far_chunks_loaded(again, r, "zip") for r in (0, 1)], [3, 3])

    def test_a_peer_gpu_tier_with_a_lender_per_rank(self):
        d = tempfile.mkdtemp(prefix="kvs-lend-")
        self.addCleanup(shutil.rmtree, d, True)
        for r in (0, 1):
            lender(self, os.path.join(d, f"lend-{r}.sock"))
        self.saved_then_loaded(
            "  - name: peer\n    type: peer_gpu\n    options:\n"
            f"      socket: {d}/lend-{{{{rank}}}}.sock\n"
            "      index_shm: kvs-layout-peer-{pid}\n", "peer")

    def test_the_chain_docs_vllm_md_gives(self):
        # peer_gpu over compress over shared dram, as docs/vllm.md writes it, but for what names
        # this machine: sizes, the lenders' sockets and the shared memory names.
        (yaml,) = documented_yaml("tested as written (WorkersOwnTheirTier): "
                                  "tests/python/test_replay_layout.py")
        d = tempfile.mkdtemp(prefix="kvs-lend-")
        self.addCleanup(shutil.rmtree, d, True)
        for r in (0, 1):
            lender(self, os.path.join(d, f"lend-{r}.sock"))
        pid = os.getpid()
        text = "version: 1\nchunk_tokens: 32\n" + substitute(yaml, [
            ("/run/kvstrata/lend-{rank}.sock", f"{d}/lend-{{rank}}.sock"),
            ("capacity: 8GiB", "capacity: 8MiB"), ("capacity: 32GiB", "capacity: 16MiB"),
            ("kvs-llama8b-peer", f"kvs-doc-peer-{pid}"), ("kvs-llama8b-zip", f"kvs-doc-zip-{pid}"),
            ("shm_name: kvs-llama8b", f"shm_name: kvs-doc-dram-{pid}")])
        self.saved_then_loaded(None, "peer", text)


class Kills(unittest.TestCase):
    def test_the_owner_killed_during_loads_then_restarted(self):
        # The node dies between the scheduler's lookup and the workers' loads: the loads fail, vLLM
        # recomputes the error blocks, and the KV is the model's. A node started again on the same
        # ssd path finds what was written (its recovery reads the unit headers) and serves it.
        inst = Instances(self, SSD_ONE)
        a = inst.stored(32)
        second = inst.new()
        second.add("B", a, max_tokens=2)
        so, _outs, back = second.step(between=inst.node.kill)
        self.assertEqual(second.info("B")["lookups"][-1][1], HIT, "looked up while the node lived")
        self.assertTrue(back.invalid_block_ids, "its loads failed: error blocks, not wrong KV")
        wait_steps(second, lambda: second.info("B")["num_computed"] >= N_TOKENS)
        self.assertEqual(second.check("B"), EXACT, "recomputed: the model's KV")
        inst.node.start()
        inst.wait_held(a)  # durable across the restart
        inst.restored("C", a)

    def kill_during_loads(self, victim):
        # One instance dies (kill -9 of one of its processes) while its workers load from the
        # node: the node and every other instance serve on, byte for byte. The node is stopped
        # (SIGSTOP) while the workers send their gets, so they are in flight at the kill; it
        # resumes after it and serves them to a process that is gone.
        inst = Instances(self, SSD_ONE)
        a = inst.stored(33)
        doomed = inst.new()
        doomed.add("B", a, max_tokens=2)
        so = doomed.sched.call("schedule")  # the lookup, while the node runs
        self.assertEqual(doomed.info("B")["lookups"][-1][1], HIT)
        node = inst.node.proc.pid
        os.kill(node, signal.SIGSTOP)
        try:
            for w in doomed.workers:
                w.send("execute", so, None)
            time.sleep(0.3)  # their gets are sent and wait on the stopped node
            proc = doomed.sched.proc if victim == "scheduler" else doomed.workers[1].proc
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
        finally:
            os.kill(node, signal.SIGCONT)
        doomed.workers[0].result("execute")
        inst.restored("C", a)
        self.assertIsNone(inst.node.proc.poll(), "the owner lives on")

    def test_a_worker_killed_during_loads(self):
        self.kill_during_loads("worker")

    def test_a_scheduler_killed_during_loads(self):
        self.kill_during_loads("scheduler")


class DocumentedLayout(unittest.TestCase):
    def test_the_configurations_docs_vllm_md_gives(self):
        # docs/vllm.md's connector and node YAML as written, but for what names this machine:
        # sizes, paths, the key file, the shared memory name and the node's port.
        connector, node_yaml = documented_yaml()
        node = Node(self, config=substitute(node_yaml, [
            ("capacity: 1TiB", "capacity: 256MiB"),
            ("paths: [/mnt/nvme0/kvs, /mnt/nvme1/kvs]", "paths: [{dir}/ssd0, {dir}/ssd1]"),
            ("psk_file: /etc/kvstrata/node.key", "psk_file: node.key")]))
        n_tokens = 600  # two chunks of 256 and a partial one
        harnesses = []
        for i in range(3):
            shm = f"kvs-doc-{os.getpid()}-{i}"
            text = substitute(connector, [
                ("capacity: 32GiB", "capacity: 64MiB"), ("shm_name: kvs-llama8b", f"shm_name: {shm}"),
                ("nodes: [127.0.0.1:13337]", f"nodes: [{node.address}]"),
                ("psk_file: /etc/kvstrata/llama8b.key",
                 f"psk_file: {node.tenant_key('llama8b')}")])
            if i == 2:  # the probe: its lookups wait for the node (a finished probe has no retry)
                text = "\n".join(ln for ln in text.split("\n") if "remote_lookups" not in ln)
            path = os.path.join(node.dir, f"instance{i}.yaml")
            with open(path, "w") as f:
                f.write(text)
            harnesses.append(Harness(self, tp=2, chunk_tokens=256, n_blocks=160,
                                     extra_config={"config": path}))
        first, second, probe = harnesses
        a = prompt(34, n_tokens)
        first.add("A", a, max_tokens=1)
        wait_steps(first, finished(first, "A"))
        for i in range(600):  # the workers send their puts to the node while they run
            found = probe.probe(f"probe{i}", a, 0)
            if found[0] == 512:
                break
            time.sleep(0.01)
        self.assertEqual(found, (512, True), "the node holds both chunks; they load between steps")
        second.add("B", a, max_tokens=2)
        wait_steps(second, lambda: second.info("B")["num_computed"] >= n_tokens)
        self.assertEqual(second.info("B")["lookups"][-1][1], 512)
        self.assertEqual(second.check("B"), EXACT, "restored from the node's ssd, byte for byte")
        self.assertEqual([far_chunks_loaded(second, r, "nvme") for r in (0, 1)], [2, 2])


if __name__ == "__main__":
    unittest.main()
