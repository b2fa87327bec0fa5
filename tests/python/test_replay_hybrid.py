"""A hybrid model (2 full-attention layers in KV cache group 0, 2 sliding-window layers of a 48-token
window in group 1) through the replay harness: one handle per group; a restored request's
full-attention pages equal recomputed ones for every hit token and its sliding-window pages for the
window before the hit, with nothing loaded into vLLM's null block; a hit needs both groups' chunks;
a window chunk whose blocks vLLM freed mid-prefill is not saved."""

import unittest

from kvs_harness import Harness, first_held, prompt

WINDOW, BLOCK, CHUNK = 48, 16, 64


def hybrid(test, **kw):
    return Harness(test, block_size=BLOCK, chunk_tokens=CHUNK, window=WINDOW, n_blocks=128, **kw)


class HybridReplay(unittest.TestCase):
    def finish(self, h, rid):
        h.run(lambda: h.info(rid)["status"] == "FINISHED")

    def test_a_restored_request_has_both_groups_pages_of_a_recomputed_one(self):
        h = hybrid(self)
        p = prompt(1, 200)
        h.add("a", p)
        self.finish(h, "a")
        h.add("b", p)
        h.run(lambda: h.info("b")["num_computed"] >= 199)
        i = h.info("b")
        n = i["lookups"][0][1]
        self.assertEqual(n, 192)  # whole chunks, the last token left to the engine
        s = first_held(h.spec, n)
        self.assertEqual(s, 144)
        # the window group's blocks before s(N) are the null block: nothing was loaded there
        self.assertEqual(i["window_block_ids"][:s // BLOCK], [0] * (s // BLOCK))
        self.assertNotIn(0, i["window_block_ids"][s // BLOCK:])
        for full, window, null_zero in h.check_hybrid("b", n).values():
            self.assertEqual(full, [])
            self.assertEqual(window, [])
            self.assertTrue(null_zero)

    def test_a_chunked_prefill_saves_no_window_chunk_over_freed_blocks_and_no_hit_needs_one(self):
        h = hybrid(self, token_budget=63)
        p = prompt(2, 200)
        h.add("a", p)
        self.finish(h, "a")
        # chunk 0 completed in step 2, when vLLM had freed the window's block 0: the full group
        # stored it, the window group did not
        self.assertEqual(h.sched.call("group_hit", 0, "p0", p[:80], 0), 64)
        self.assertEqual(h.sched.call("group_hit", 1, "p1", p[:80], 0), 0)
        self.assertEqual(h.sched.call("group_hit", 1, "p2", p[:80], 16), 0)
        # a 64-token hit needs the window's tokens 16..63 (chunk 0): no hit is counted
        self.assertEqual(h.probe("q", p[:80], 0), (0, False))
        # chunks 1 and 2 completed with their window blocks held: a 192-token hit needs only 144..
        self.assertEqual(h.probe("r", p, 0), (192, False))
        h.add("b", p)
        h.run(lambda: h.info("b")["num_computed"] >= 199)
        self.assertEqual(h.info("b")["lookups"][0][1], 192)
        for full, window, null_zero in h.check_hybrid("b", 192).values():
            self.assertEqual((full, window, null_zero), ([], [], True))


if __name__ == "__main__":
    unittest.main()
