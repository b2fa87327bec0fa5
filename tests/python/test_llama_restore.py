"""A tiny Llama (Hugging Face weights when transformers is there) restored through KvstrataConnector:
the logits of a request whose prefix kvstrata restored equal, bit for bit, those of an engine that
still held the prefix's KV, and those of a full recompute within float tolerance. The pages are on
KVS_TEST_DEVICE (cpu by default; cuda on a GPU machine)."""

import unittest

from kvs_harness import Harness, prompt

# One pass over a prompt in float32 against another split over two passes: the arithmetic is the
# same up to the order of float additions inside the matrix products.
FULL_TOLERANCE = {"fp32": 2e-4, "bf16": 6e-2}


class LlamaRestore(unittest.TestCase):
    def restore(self, layout="nhd", dtype="fp32", loads=None):
        h = Harness(self, model="llama", layout=layout, dtype=dtype, n_layers=3, heads_total=2,
                    head_dim=32, chunk_tokens=32, loads=loads)
        C = h.spec["chunk_tokens"]
        a = prompt(21, 3 * C + 10)
        h.add("A", a, max_tokens=1)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        b = a[:3 * C] + prompt(22, 20)
        h.add("B", b, max_tokens=2)
        h.run(lambda: h.info("B")["num_computed"] >= len(b))
        ib = h.info("B")
        self.assertEqual(ib["lookups"][0][1], 3 * C, "kvstrata held the 3 shared chunks")
        w = h.workers[0]
        self.assertEqual(w.call("llama_check_pages", a, ib["block_ids"], 3 * C), [],
                         "the restored K/V are the saved K/V, bit for bit")
        steps = w.call("llama_logits", "B")
        self.assertEqual(steps[0][0], 3 * C, "B computed only its own tail")
        got = steps[0][1]
        ref = w.call("llama_references", a, 3 * C, b)
        self.assertTrue(bool((got == ref["after_saved"]).all()),
                        f"logits after the restore equal those over the saved K/V "
                        f"(max diff {float((got - ref['after_saved']).abs().max())})")
        diff = float((got - ref["full"]).abs().max())
        self.assertLess(diff, FULL_TOLERANCE[dtype], "a full recompute gives the same logits")
        self.assert_same_token(got, ref["full"], diff)
        print(f"\n  {layout} {dtype} on {ref['device']} ({ref['source']}): restored logits == "
              f"logits over the saved K/V; max |restored - full recompute| = {diff:.3g}", end="")
        return ref, got

    def assert_same_token(self, got, want, diff):
        """The same greedy next token, unless the two best logits are closer than the logits'
        difference (then either is a correct answer)."""
        top = want.topk(2).values
        if float(top[0] - top[1]) > 2 * diff:
            self.assertEqual(int(got.argmax()), int(want.argmax()), "the same next token")

    def test_nhd_fp32(self):
        self.restore()

    def test_hnd_bf16(self):
        self.restore(layout="hnd", dtype="bf16")

    def test_flashinfer_fp32_async_load(self):
        self.restore(layout="flashinfer", loads="always")

    def test_packed_bf16(self):
        self.restore(layout="packed", dtype="bf16")

    def test_the_forward_is_transformers_llama(self):
        try:
            import transformers  # noqa: F401
        except ImportError:
            self.skipTest("transformers is not installed: the forward is not compared with "
                          "LlamaForCausalLM's (it runs on the GPU machine)")
        ref, got = self.restore()
        diff = float((got - ref["hf"]).abs().max())
        print(f"; max |restored - LlamaForCausalLM| = {diff:.3g}", end="")
        self.assertLess(diff, FULL_TOLERANCE["fp32"])
        self.assert_same_token(got, ref["hf"], diff)


if __name__ == "__main__":
    unittest.main()
