"""KvstrataConnector with requests whose KV depends on more than their tokens: vLLM's per-request
cache_salt (tenants), LoRA adapters and multimodal inputs enter the chunk keys, and reset_cache
(vLLM's reset_prefix_cache(reset_connector=True) after a weight update) makes what was stored
unreachable. Needs libkvstrata ABI 1.10 (request_key_input)."""

import unittest

from kvs_harness import Harness, prompt


def finish(h, rid):
    h.run(lambda: h.info(rid)["status"] == "FINISHED")


def first_lookup(h, rid):
    return h.info(rid)["lookups"][0][1]


class Tenants(unittest.TestCase):
    def test_requests_of_two_tenants_never_share_a_chunk(self):
        h = Harness(self)
        a = prompt(31, 106)
        h.add("A", a, max_tokens=1, cache_salt="tenant-a")
        finish(h, "A")
        h.add("B", a, max_tokens=1, cache_salt="tenant-b")
        finish(h, "B")
        self.assertEqual(first_lookup(h, "B"), 0, "tenant b is not served what tenant a stored")
        h.add("U", a, max_tokens=1)
        finish(h, "U")
        self.assertEqual(first_lookup(h, "U"), 0, "nor is a request without a salt")
        h.add("A2", a, max_tokens=2, cache_salt="tenant-a")
        h.step()
        self.assertEqual(first_lookup(h, "A2"), 96, "tenant a finds its own prefix")
        self.assertEqual(h.check("A2"), {0: []}, "and it is the KV tenant a stored")
        h.add("B2", a, max_tokens=2, cache_salt="tenant-b")
        h.step()
        self.assertEqual(first_lookup(h, "B2"), 96, "tenant b finds the copy it stored itself")
        self.assertEqual(h.check("B2"), {0: []})

    def test_lookups_are_counted_per_tenant(self):
        h = Harness(self)
        a = prompt(32, 106)
        h.add("A", a, max_tokens=1, cache_salt="tenant-a")
        finish(h, "A")
        h.add("A2", a, max_tokens=1, cache_salt="tenant-a")
        h.add("B", a, max_tokens=1, cache_salt="tenant-b")
        finish(h, "A2")
        finish(h, "B")
        tenants = h.sched.call("connector_stats")["tenants"]
        self.assertEqual(len(tenants), 2, tenants)
        counts = sorted((t["lookups"], t["hit_tokens"]) for t in tenants.values())
        self.assertEqual(counts, [(1, 0), (2, 96)])
        self.assertNotIn("tenant-a", tenants, "the label is a hash, not the salt")


class AdaptersAndMedia(unittest.TestCase):
    def test_a_lora_request_shares_only_with_its_own_adapter(self):
        h = Harness(self)
        a = prompt(33, 106)
        h.add("X", a, max_tokens=1, lora="sql")
        finish(h, "X")
        self.assertEqual(first_lookup(h, "X"), 0)
        h.add("Base", a, max_tokens=1)
        h.add("Other", a, max_tokens=1, lora="chat")
        finish(h, "Base")
        finish(h, "Other")
        self.assertEqual((first_lookup(h, "Base"), first_lookup(h, "Other")), (0, 0))
        h.add("X2", a, max_tokens=2, lora="sql")
        h.step()
        self.assertEqual(first_lookup(h, "X2"), 96)
        self.assertEqual(h.check("X2"), {0: []})

    def test_a_multimodal_input_keys_the_chunks_from_its_position_on(self):
        h = Harness(self)
        a = prompt(34, 106)
        h.add("I", a, max_tokens=1, mm=[("image-1", 40, 16)])  # in chunk 1 (tokens 32..63)
        finish(h, "I")
        h.add("J", a, max_tokens=2, mm=[("image-2", 40, 16)])
        h.step()
        self.assertEqual(first_lookup(h, "J"), 32,
                         "another image at the same placeholders: only the chunk before it is shared")
        self.assertEqual(h.check("J", 0, 32), {0: []})
        finish(h, "J")
        h.add("I2", a, max_tokens=2, mm=[("image-1", 40, 16)])
        h.step()
        self.assertEqual(first_lookup(h, "I2"), 96)
        self.assertEqual(h.check("I2"), {0: []})


class Reset(unittest.TestCase):
    def test_reset_cache_makes_every_stored_chunk_unreachable(self):
        h = Harness(self)
        a = prompt(35, 106)
        h.add("A", a, max_tokens=1)
        finish(h, "A")
        self.assertIs(h.sched.call("reset_connector_cache"), True)
        h.add("B", a, max_tokens=1)
        finish(h, "B")
        self.assertEqual(first_lookup(h, "B"), 0, "the old weights' KV is not served")
        h.add("C", a, max_tokens=2)
        h.step()
        self.assertEqual(first_lookup(h, "C"), 96, "what was stored after the reset is")
        self.assertEqual(h.check("C"), {0: []})

    def test_a_request_keyed_before_a_reset_never_loads_or_saves_after_it(self):
        # vLLM preempts running requests on a reset (reset_running_requests) and looks them up
        # again: one keyed with the old epoch must not find the old weights' chunks under its old
        # keys, nor store what it computes under them.
        h = Harness(self)
        a = prompt(36, 106)
        h.add("A", a, max_tokens=1)
        finish(h, "A")
        h.add("B", a, max_tokens=30)
        h.step()
        self.assertEqual(first_lookup(h, "B"), 96)
        self.assertIs(h.sched.call("reset_connector_cache"), True)
        h.sched.call("preempt", "B")
        h.step()
        h.step()
        ib = h.info("B")
        self.assertEqual(ib["num_preemptions"], 1)
        self.assertEqual(ib["lookups"][-1][1], 0, "B is not served the old weights' chunks")
        finish(h, "B")
        h.add("C", a, max_tokens=1)
        finish(h, "C")
        self.assertEqual(first_lookup(h, "C"), 0, "nor did B store them under the new epoch")
        h.add("D", a, max_tokens=2)
        h.step()
        self.assertEqual(first_lookup(h, "D"), 96, "C stored its own")
        self.assertEqual(h.check("D"), {0: []})

    def test_instances_that_reset_together_keep_sharing(self):
        # The epoch counts resets: two instances over one tier that both reset once (one weight
        # update) agree on it, as a producer and its consumer must.
        first = Harness(self)
        second = Harness(self, shm_name=first.shm_name)
        for h in (first, second):
            self.assertIs(h.sched.call("reset_connector_cache"), True)
        a = prompt(37, 106)
        first.add("A", a, max_tokens=1)
        finish(first, "A")
        second.add("B", a, max_tokens=2)
        second.step()
        self.assertEqual(first_lookup(second, "B"), 96)
        self.assertEqual(second.check("B"), {0: []})


class Refusals(unittest.TestCase):
    def test_a_request_whose_inputs_cannot_be_keyed_is_computed_without_the_connector(self):
        # 70 images are more key inputs than the library takes per request: that request bypasses
        # the connector (lookups answer 0, nothing saved) and the engine goes on serving others.
        h = Harness(self, n_blocks=128)
        a = prompt(38, 106)
        images = [(f"img-{i}", i, 1) for i in range(70)]
        h.add("M", a, max_tokens=1, mm=images)
        h.add("T", prompt(39, 70), max_tokens=1)
        finish(h, "M")
        finish(h, "T")
        self.assertEqual(first_lookup(h, "M"), 0)
        h.add("M2", a, max_tokens=1, mm=images)
        finish(h, "M2")
        self.assertEqual(first_lookup(h, "M2"), 0, "nothing was saved for it")
        h.add("T2", prompt(39, 70), max_tokens=2)
        h.step()
        self.assertEqual(first_lookup(h, "T2"), 64, "the other request was served as usual")


if __name__ == "__main__":
    unittest.main()
