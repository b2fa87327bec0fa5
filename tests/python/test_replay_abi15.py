"""KvstrataConnector over what ABI 1.5 adds for vLLM's real call order: asynchronous loads reported by
get_finished, steps with no forward pass closed by the next bind, two tensor-parallel ranks in two
worker processes under one scheduler, per-tier load statistics."""

import time
import unittest

from kvs_harness import Harness, Node, corrupt_shared_object, object_bytes, prompt


def wait_steps(h, until, max_steps=500, **kw):
    """Step until `until()` holds; a short pause between steps gives a background load time."""
    for _ in range(max_steps):
        if until():
            return
        h.step(**kw)
        time.sleep(0.005)
    raise AssertionError(f"not done after {max_steps} steps")


def reported(h, key, rid):
    return [i for i, (_so, _outs, back) in enumerate(h.steps) if rid in getattr(back, key)]


class AsyncLoads(unittest.TestCase):
    def saved_prompt(self, h, seed=1, n=106):
        a = prompt(seed, n)
        h.add("A", a, max_tokens=1)
        wait_steps(h, lambda: h.info("A")["status"] == "FINISHED")
        return a

    def test_an_async_load_is_reported_by_get_finished_while_others_decode(self):
        h = Harness(self, loads="always")
        a = self.saved_prompt(h)
        h.add("Z", prompt(2, 20), max_tokens=400)  # a running request: steps keep their forward
        h.step()
        h.add("B", a, max_tokens=2)
        so, outs, back = h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 96, True)])
        self.assertEqual(h.info("B")["status"], "WAITING_FOR_REMOTE_KVS")
        self.assertNotIn("B", so.num_scheduled_tokens, "B waits while its KV loads")
        wait_steps(h, lambda: h.info("B")["status"] == "RUNNING")
        first = reported(h, "finished_recving", "B")
        self.assertEqual(len(first), 1, "B's load is reported once")
        so, _outs, _back = h.steps[-1]
        self.assertEqual(so.num_scheduled_tokens["B"], len(a) - 96)
        self.assertEqual([r.num_computed_tokens for r in so.scheduled_new_reqs if r.req_id == "B"],
                         [96])
        self.assertEqual(h.check("B"), {0: []}, "the loaded KV is the saved KV")
        stats = h.steps[first[0]][1][0].stats.data
        self.assertGreaterEqual(stats.get("async_loads_done", 0), 1)
        # vLLM calls update_state_after_alloc(B, blocks, 0) again when B is scheduled after its
        # load: the load is done, not cancelled, and the library is not told otherwise.
        self.assertEqual(h.info("B")["on_alloc"], [96])

    def test_an_async_load_with_nothing_else_running_completes_in_steps_without_forward(self):
        h = Harness(self, loads="always")
        a = self.saved_prompt(h, seed=3)
        h.add("B", a, max_tokens=2)
        wait_steps(h, lambda: h.info("B")["status"] == "RUNNING")
        idle = [so for so, _o, _b in h.steps if so.total_num_scheduled_tokens == 0]
        self.assertTrue(idle, "B's load spanned at least one step with nothing scheduled")
        self.assertEqual(h.check("B"), {0: []})

    def test_a_failed_async_load_reports_its_blocks_no_later_than_the_request(self):
        h = Harness(self, loads="always")
        a = self.saved_prompt(h, seed=4)
        needle = h.workers[0].call("row_bytes", a, 0, 40)
        self.assertIsNotNone(corrupt_shared_object(h.shm_name, needle))
        h.add("Z", prompt(5, 20), max_tokens=400)
        h.add("B", a, max_tokens=2)
        wait_steps(h, lambda: reported(h, "finished_recving", "B"))
        done = reported(h, "finished_recving", "B")[0]
        blocks = h.info("B")["block_ids"]
        invalid = set().union(*(back.invalid_block_ids for _so, _o, back in h.steps[:done + 1]))
        self.assertEqual(invalid, set(blocks[2:4]), "chunk 1's blocks, by the step reporting B")
        wait_steps(h, lambda: h.info("B")["status"] == "RUNNING")
        self.assertEqual(h.steps[-1][0].num_scheduled_tokens["B"], len(a) - 32,
                         "B recomputes from its first failed block")
        wait_steps(h, lambda: h.info("B")["num_computed"] >= len(a))
        self.assertEqual(h.check("B", 0, len(a)), {0: []})

    def test_a_request_aborted_while_its_kv_loads_is_still_reported(self):
        # vLLM keeps an aborted request's blocks while its load may write them, and frees them only
        # when a worker's get_finished reports the load.
        h = Harness(self, loads="always")
        a = self.saved_prompt(h, seed=13)
        h.add("Z", prompt(14, 20), max_tokens=400)
        h.add("B", a, max_tokens=2)
        seen = {}

        def abort_b():  # the step arms B's load; B is aborted before the workers start it
            seen["status"] = h.info("B")["status"]
            seen["blocks"] = blocks = h.info("B")["block_ids"]
            seen["abort"] = h.sched.call("abort", "B")
            seen["kept"] = not h.sched.call("are_free", blocks)

        h.step(between=abort_b)
        self.assertEqual(seen["status"], "WAITING_FOR_REMOTE_KVS")
        self.assertEqual(seen["abort"], (False, None))
        self.assertTrue(seen["kept"], "kept while the load may write them")
        blocks = seen["blocks"]
        wait_steps(h, lambda: reported(h, "finished_recving", "B"))
        self.assertEqual(len(reported(h, "finished_recving", "B")), 1)
        self.assertTrue(h.sched.call("are_free", blocks), "freed once the load was reported")


class StepsWithoutForward(unittest.TestCase):
    def test_empty_steps_then_the_next_bind_works(self):
        # vLLM binds metadata every step, also when nothing is scheduled, and then skips the layer
        # hooks and wait_for_save (kv_connector_no_forward).
        h = Harness(self)
        a = prompt(6, 70)
        h.add("A", a, max_tokens=1)
        wait_steps(h, lambda: h.info("A")["status"] == "FINISHED")
        for _ in range(2):
            so, outs, back = h.step()
            self.assertEqual(so.total_num_scheduled_tokens, 0)
            self.assertNotIn("wait_for_save", outs[0].calls)
        h.add("B", a, max_tokens=2)
        h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 64, False)])
        self.assertEqual(h.check("B"), {0: []})
        stats = h.sched.call("connector_stats")
        self.assertIsNotNone(stats)

    def test_a_bound_load_without_forward_lands_before_the_next_step(self):
        h = Harness(self)
        a = prompt(7, 106)
        h.add("A", a, max_tokens=1)
        wait_steps(h, lambda: h.info("A")["status"] == "FINISHED")
        h.add("Z", prompt(8, 20), max_tokens=400)
        h.step()
        h.add("B", a, max_tokens=50)
        so, outs, back = h.step(opts={"no_forward": True})
        self.assertEqual(so.num_scheduled_tokens["B"], 10)
        self.assertNotIn("layers", outs[0].calls)
        so, outs, back = h.step()  # binds the next step: the one above is closed first
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("B", 0, 96), {0: []}, "the closed step's loads landed")
        self.assertGreaterEqual(outs[0].stats.data.get("steps_closed", 0), 1)
        h.sched.call("abort", "B")
        h.step()


class TwoRanks(unittest.TestCase):
    def test_a_chunk_one_rank_lost_is_not_a_hit(self):
        spec_probe = dict(chunk_tokens=32, heads_total=4, head_dim=16, n_layers=2, tp=2, mla=False,
                          dtype="fp16")
        slab = -(-object_bytes(spec_probe) // 4096) * 4096
        h = Harness(self, tp=2, heads_total=4, capacity=str(3 * slab))
        a, b = prompt(9, 40), prompt(10, 40)
        h.add("A", a, max_tokens=1)
        h.step(worker_order=[1, 0])  # rank 1 stores A's chunk first: it is the least recent
        self.assertEqual(h.info("A")["status"], "FINISHED")
        h.add("B", b, max_tokens=1)
        _so, outs, _back = h.step(worker_order=[0, 1])  # objects 3 and 4: rank 1's A goes
        self.assertEqual(sum(o.stats.data.get("evictions", 0) for o in outs), 1,
                         "one object left: rank 0 still holds its shard of A")
        self.assertEqual(h.probe("pa", a, 0), (0, False),
                         "rank 0 still holds A's chunk, rank 1 does not: no hit")
        self.assertEqual(h.probe("pb", b, 0), (32, False))
        h.add("C", b, max_tokens=2)
        so, outs, back = h.step()
        self.assertEqual(h.info("C")["lookups"], [(0, 32, False)])
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("C"), {0: [], 1: []}, "each rank restored its own heads")
        self.assertEqual(outs[0].stats.data.get("tokens_loaded"), 32)
        self.assertNotIn("tokens_loaded", outs[1].stats.data, "counted once, by rank 0")

    def test_async_loads_on_two_ranks_finish_when_both_report(self):
        h = Harness(self, tp=2, heads_total=4, loads="always")
        a = prompt(11, 70)
        h.add("A", a, max_tokens=1)
        wait_steps(h, lambda: h.info("A")["status"] == "FINISHED")
        h.add("B", a, max_tokens=2)
        wait_steps(h, lambda: h.info("B")["status"] == "RUNNING")
        per_rank = [[i for i, (_so, outs, _b) in enumerate(h.steps)
                     if "B" in (outs[r].finished_recving or ())] for r in (0, 1)]
        self.assertEqual([len(p) for p in per_rank], [1, 1])
        self.assertEqual(reported(h, "finished_recving", "B"), [max(per_rank[0][0], per_rank[1][0])])
        self.assertEqual(h.check("B"), {0: [], 1: []})
        # per-request counts come from rank 0 only; shard counts from both ranks
        started = [sum(outs[r].stats.data.get("async_loads_started", 0)
                       for _so, outs, _b in h.steps if outs[r].stats) for r in (0, 1)]
        self.assertEqual(started, [1, 0], "one async load, counted once")
        chunks = [sum(outs[r].stats.data.get("chunks_loaded", 0)
                      for _so, outs, _b in h.steps if outs[r].stats) for r in (0, 1)]
        self.assertEqual(chunks, [2, 2], "each rank loads its shard of both chunks")


class RemoteLookups(unittest.TestCase):
    def test_unknown_yet_lookups_then_a_restore_from_the_node(self):
        # loads.remote_lookups async: a prefix only a kvstrata-node holds is asked about on a
        # thread; vLLM gets None (the request waits) until the answer is in, then loads it.
        node = Node(self)
        tier = node.tier("replay")
        first = Harness(self, tiers_below=tier)  # its DRAM tier writes through to the node
        a = prompt(21, 106)
        first.add("A", a, max_tokens=1)
        wait_steps(first, lambda: first.info("A")["status"] == "FINISHED")
        # The node has A's chunks once a scheduler that waits for the nodes (and has its own empty
        # DRAM tier) finds them: the worker queued the puts, and sends them while it runs.
        probe = Harness(self, tiers_below=tier)
        for i in range(500):
            if probe.probe(f"p{i}", a, 0) == (96, False):
                break
            time.sleep(0.01)
        self.assertEqual(probe.probe("p", a, 0), (96, False), "the node holds A's three chunks")
        probe.close()
        first.close()
        h = Harness(self, tiers_below=tier, yaml_extra="loads:\n  remote_lookups: async\n")
        h.add("B", a, max_tokens=2)
        wait_steps(h, lambda: h.info("B")["num_computed"] >= len(a))
        lookups = h.info("B")["lookups"]
        self.assertEqual(lookups[0], (0, None, False), "the first answer is vLLM's None")
        self.assertEqual(lookups[-1], (0, 96, False), "then the node's three chunks")
        self.assertTrue(all(n is None for _c, n, _a in lookups[:-1]))
        self.assertEqual(h.check("B"), {0: []}, "restored from the node, byte for byte")
        st = [outs[0].stats.data for _so, outs, _b in h.steps if outs[0].stats]
        self.assertEqual(sum(d.get("tiers", {}).get("far", {}).get("chunks_loaded", 0) for d in st), 3)
        self.assertGreaterEqual(h.sched.call("connector_stats").get("lookups_unknown", 0), 1)


class TierStats(unittest.TestCase):
    def test_loads_are_counted_by_tier_in_tokens_bytes_and_time(self):
        self.check_tier_stats(Harness(self))

    def test_loads_by_an_asynchronous_device_are_timed_by_tier_too(self):
        # The CUDA device's order (copies enqueued at start_load, waited for at wait_for_save), as
        # the host device plays it: the first GPU run found no dram load time there.
        self.check_tier_stats(Harness(self, yaml_extra="device:\n  host_copies: deferred\n"))

    def check_tier_stats(self, h):
        a = prompt(12, 106)
        h.add("A", a, max_tokens=1)
        wait_steps(h, lambda: h.info("A")["status"] == "FINISHED")
        h.add("B", a, max_tokens=2)
        so, outs, back = h.step()
        d = outs[0].stats.data
        self.assertEqual(d.get("tokens_loaded"), 96)
        dram = d["tiers"]["dram"]
        self.assertEqual(dram["bytes_loaded"], d["bytes_loaded"])
        self.assertGreater(dram["load_ns"], 0)
        self.assertIn("load_gbps[dram]", outs[0].stats.reduce())


if __name__ == "__main__":
    unittest.main()
