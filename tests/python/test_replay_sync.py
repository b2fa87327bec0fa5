"""KvstrataConnector driven in vLLM's order with the scheduler and the worker in separate processes:
synchronous loads (restored in the step that schedules the request), every paged layout, load errors,
preemption, a request finished while its save is pending."""

import unittest

from kvs_harness import Harness, StepOutput, corrupt_shared_object, prompt, sample


class ExactRestore(unittest.TestCase):
    def restore(self, layout="nhd", dtype="fp16", order="load_first", **kw):
        """Request A computes a 3-chunk prompt (plus a tail) and saves it; request B shares the
        3 chunks, gets them from kvstrata into other blocks and computes only its own tail."""
        h = Harness(self, layout=layout, dtype=dtype, **kw)
        C = h.spec["chunk_tokens"]
        a = prompt(1, 3 * C + 10)
        h.add("A", a, max_tokens=2)
        h.step(opts={"order": order})
        ia = h.info("A")
        self.assertEqual(ia["lookups"], [(0, 0, False)], "nothing is stored yet")
        self.assertEqual(h.check("A"), {0: []})
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        b = a[:3 * C] + prompt(2, 20)
        h.add("B", b, max_tokens=2)
        so, outs, back = h.step(opts={"order": order})
        ib = h.info("B")
        self.assertEqual(ib["lookups"], [(0, 3 * C, False)])
        self.assertEqual(so.num_scheduled_tokens["B"], len(b) - 3 * C,
                         "only B's own tail is computed")
        self.assertEqual(back.invalid_block_ids, set())
        n_shared_blocks = 3 * C // h.spec["block_size"]
        self.assertFalse(set(ib["block_ids"][:n_shared_blocks]) & set(ia["block_ids"]),
                         "the shared prefix lands in other blocks than A's")
        self.assertEqual(h.check("B", 0, 3 * C), {0: []}, "the restored KV is the saved KV")
        self.assertEqual(h.check("B"), {0: []})
        st = outs[0].stats.data
        self.assertEqual(st.get("chunks_loaded"), 3)
        self.assertGreater(st.get("bytes_loaded", 0), 0)
        self.assertEqual(st["tiers"]["dram"]["chunks_loaded"], 3)
        return h

    def test_exact_restore_of_a_multi_chunk_prefix_into_other_blocks(self):
        self.restore()

    def test_flash_attention_hnd_strides_bf16(self):
        self.restore(layout="hnd", dtype="bf16")

    def test_flashinfer_fp32(self):
        self.restore(layout="flashinfer", dtype="fp32")

    def test_flashinfer_hnd_strides(self):
        self.restore(layout="flashinfer_hnd", heads_total=4)

    def test_mla_latents_in_fp8_pages(self):
        self.restore(layout="mla", dtype="fp8", head_dim=64)

    def test_packed_kv_layout(self):
        self.restore(layout="packed", heads_total=4)

    def test_cross_layer_cache_registered_as_one_tensor(self):
        self.restore(layout="crosslayer", dtype="bf16", n_layers=3)

    def test_kernel_blocks_smaller_than_the_scheduler_block(self):
        self.restore(block_size=32, kernel_block_size=16, chunk_tokens=64)

    def test_layers_sharing_another_layers_kv_are_mapped_to_it(self):
        # Two KV-sharing layers come with the tensors of layers 0 and 1: three stored layers, no
        # refusal of the layer count, each shared layer's hooks served by its target's.
        h = self.restore(n_layers=3, shared_layers=2)
        self.assertEqual(h.workers[0].call("model_description")["n_layers"], 3)

    def test_layer_hooks_before_start_load_kv(self):
        # vLLM runs the layers first and calls start_load_kv after them when a step has no
        # synchronous load; the connector starts the step's loads at the first hook either way.
        self.restore(order="layers_first")


class Lookups(unittest.TestCase):
    def test_a_full_hit_reports_at_most_num_tokens_minus_one_minus_computed(self):
        h = Harness(self)
        a = prompt(3, 96)  # exactly three chunks of 32
        h.add("A", a, max_tokens=1)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        for computed in (0, 32, 64):
            n, load_async = h.probe(f"probe-{computed}", a, computed)
            self.assertEqual(n, len(a) - 1 - computed)
            self.assertFalse(load_async)
        h.add("B", a, max_tokens=2)
        so, outs, back = h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 95, False)])
        self.assertEqual(so.num_scheduled_tokens["B"], 1, "vLLM computes the last token itself")
        self.assertEqual(h.check("B", 0, 96), {0: []})

    def test_lookups_are_never_unknown_with_local_tiers(self):
        # A DRAM tier always knows: the ABI's unknown_yet (vLLM's None) comes only from tiers that
        # cannot answer without blocking; test_vllm_class checks the mapping of unknown_yet to None.
        h = Harness(self)
        n, load_async = h.probe("p", prompt(4, 100), 0)
        self.assertIsInstance(n, int)
        self.assertEqual((n, load_async), (0, False))

    def test_a_lora_requests_kv_is_not_the_base_models(self):
        h = Harness(self)
        a = prompt(5, 70)
        h.add("A", a, max_tokens=1, lora=True)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        self.assertEqual(h.info("A")["lookups"], [(0, 0, False)])
        h.add("B", a, max_tokens=2)
        h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 0, False)],
                         "a LoRA request's KV was not saved under the base model's keys")

    def test_default_configuration_shares_one_dram_tier_between_the_processes(self):
        # No YAML: the connector writes one with a DRAM tier in /dev/shm/kvstrata-<engine_id>, so
        # the scheduler process sees what the worker process saved.
        h = Harness(self, default_config=True, capacity="32MiB", n_blocks=128)
        a = prompt(6, 600)
        h.add("A", a, max_tokens=1)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        h.add("B", a[:512] + prompt(7, 30), max_tokens=2)
        h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 512, False)])
        self.assertEqual(h.check("B"), {0: []})


class Failures(unittest.TestCase):
    def test_a_corrupted_object_becomes_error_blocks_and_is_recomputed(self):
        h = Harness(self)
        a = prompt(8, 106)
        h.add("A", a, max_tokens=1)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        needle = h.workers[0].call("row_bytes", a, 0, 40)  # token 40: chunk 1
        self.assertIsNotNone(corrupt_shared_object(h.shm_name, needle),
                             "the saved chunk is in the shared DRAM tier")
        h.add("B", a, max_tokens=2)
        so, outs, back = h.step()
        ib = h.info("B")
        self.assertEqual(ib["lookups"], [(0, 96, False)])
        self.assertEqual(back.invalid_block_ids, set(ib["block_ids"][2:4]),
                         "the blocks of chunk 1 (tokens 32..63) failed")
        self.assertEqual(ib["num_computed"], 32, "vLLM recomputes from the first failed block")
        self.assertEqual(outs[0].stats.data.get("load_errors"), 1)
        h.run(lambda: h.info("B")["status"] == "FINISHED")
        # B recomputed chunks 1 and 2 and saved them again: a third request restores all three.
        h.add("C", a, max_tokens=2)
        so, outs, back = h.step()
        self.assertEqual(h.info("C")["lookups"], [(0, 96, False)])
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("C"), {0: []})

    def test_a_request_finished_while_its_save_is_pending(self):
        # With async scheduling vLLM may finish (abort) a request after building the step that
        # saves its prompt and before the workers run it: the save still lands.
        h = Harness(self)
        a = prompt(9, 70)
        h.add("A", a, max_tokens=4)
        so = h.sched.call("schedule")
        self.assertEqual(h.sched.call("abort", "A"), (False, None),
                         "saves finish within the step: vLLM need not keep the blocks")
        out = h.workers[0].call("execute", so)
        h.sched.call("update_from_output", StepOutput(out.sampled, set(), set(),
                                                      out.invalid_block_ids))
        self.assertEqual(out.stats.data.get("chunks_saved"), 2)
        h.add("B", a, max_tokens=2)
        h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 64, False)])
        self.assertEqual(h.check("B"), {0: []})

    def test_preemption_then_resume_restores_the_prompt_into_new_blocks(self):
        h = Harness(self)
        a = prompt(10, 80)
        h.add("A", a, max_tokens=8)
        h.add("Z", prompt(11, 20), max_tokens=40)  # keeps decoding: every step has a forward pass
        h.run(lambda: len(h.info("A")["tokens"]) >= 83)
        before = h.info("A")
        self.assertEqual(h.check("A"), {0: []})
        h.sched.call("preempt", "A")
        so, outs, back = h.step()
        self.assertEqual(so.preempted_req_ids, {"A"})
        self.assertIn("handle_preemptions", outs[0].calls)
        self.assertEqual(h.info("A")["status"], "PREEMPTED")
        so, outs, back = h.step()
        after = h.info("A")
        self.assertEqual(after["lookups"], [(0, 0, False), (0, 64, False)],
                         "asked again after the preemption: the prompt's two chunks are stored")
        self.assertIn("A", so.scheduled_cached_reqs.resumed_req_ids)
        self.assertEqual(so.num_scheduled_tokens["A"], len(before["tokens"]) - 64)
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("A"), {0: []})
        h.run(lambda: h.info("A")["status"] == "FINISHED")


    def test_preemption_then_resume_with_the_older_resumed_flags(self):
        # vLLM releases without resumed_req_ids flag resumed requests in resumed_from_preemption:
        # the resumed request's new_block_ids is its whole new table, not an extension of the old
        h = Harness(self)
        h.sched.call("use_legacy_cached")
        a = prompt(13, 80)
        h.add("A", a, max_tokens=8)
        h.add("Z", prompt(14, 20), max_tokens=40)
        h.run(lambda: len(h.info("A")["tokens"]) >= 83)
        h.sched.call("preempt", "A")
        h.step()
        so, outs, back = h.step()
        self.assertFalse(hasattr(so.scheduled_cached_reqs, "resumed_req_ids"))
        h.step()  # one more step: a stale table extended would now be longer than vLLM's
        i = h.info("A")
        self.assertEqual(i["connector_block_ids"], i["block_ids"],
                         "the connector keeps vLLM's block table of the resumed request")
        self.assertEqual(h.info("A")["lookups"], [(0, 0, False), (0, 64, False)])
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("A"), {0: []})
        h.run(lambda: h.info("A")["status"] == "FINISHED")


class RunnerOrders(unittest.TestCase):
    """The call orders of main's two model runners (vLLM 017e9f4448b7)."""

    def restore_in(self, order, corrupt=False, **kw):
        h = Harness(self, **kw)
        a = prompt(21, 106)
        h.add("A", a, max_tokens=2)
        h.run(lambda: h.info("A")["status"] == "FINISHED", opts={"order": order})
        if corrupt:
            needle = h.workers[0].call("row_bytes", a, 0, 40)  # token 40: chunk 1
            self.assertIsNotNone(corrupt_shared_object(h.shm_name, needle))
        h.add("B", a, max_tokens=3)
        so, outs, back = h.step(opts={"order": order})
        return h, outs, back

    def test_v2_runner_waits_for_saves_after_sampling_and_drafting(self):
        h, outs, back = self.restore_in("v2")
        calls = outs[0].calls
        self.assertLess(calls.index("sample"), calls.index("wait_for_save"))
        self.assertLess(calls.index("draft"), calls.index("wait_for_save"))
        self.assertEqual(h.info("B")["lookups"], [(0, 96, False)])
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("B"), {0: []})
        h.run(lambda: h.info("B")["status"] == "FINISHED", opts={"order": "v2"})

    def test_with_a_drafter_load_errors_are_complete_before_wait_for_save(self):
        self.drafter_load_errors()

    def test_with_a_drafter_and_the_cuda_ordering_load_errors_are_complete_too(self):
        # device.host_copies: deferred runs the CUDA device's ordering on the host: copies and
        # checksums complete only when the connector waits for them.
        self.drafter_load_errors(yaml_extra="device:\n  host_copies: deferred\n")

    def drafter_load_errors(self, **kw):
        # The V1 runner with speculative decoding asks get_block_ids_with_load_errors before the
        # draft model runs and calls wait_for_save after it: the failed chunk must be reported in
        # that step (vLLM recomputes from it), and not again in the next.
        h, outs, back = self.restore_in("deferred_finalize", corrupt=True, **kw)
        calls = outs[0].calls
        self.assertLess(calls.index("get_block_ids_with_load_errors"), calls.index("wait_for_save"))
        ib = h.info("B")
        self.assertEqual(back.invalid_block_ids, set(ib["block_ids"][2:4]))
        self.assertEqual(ib["num_computed"], 32)
        so, outs, back = h.step(opts={"order": "deferred_finalize"})
        self.assertEqual(back.invalid_block_ids, set(), "reported once")
        self.assertEqual(h.check("B"), {0: []}, "the recomputed blocks hold the model's KV")
        h.run(lambda: h.info("B")["status"] == "FINISHED", opts={"order": "deferred_finalize"})


class StepCost(unittest.TestCase):
    def test_a_decoding_request_is_not_handed_to_the_library(self):
        # Past its prompt, with decode tokens not saved and no load armed, a request can neither
        # load nor save: the step's metadata does not name it, and the connector stops following
        # it (no request watched: a decode step visits none, at any context length). A preemption
        # resumes it with its whole table, restored from the tier.
        h = Harness(self)
        a = prompt(41, 70)
        h.add("A", a, max_tokens=40)
        so, _outs, _back = h.step()
        self.assertEqual(so.kv_connector_metadata.req_ids, ("A",), "its prefill step names it")
        self.assertEqual(h.info("A")["connector_watched"], ["A"])
        prefill_table = h.info("A")["block_ids"]
        so, _outs, _back = h.step()
        self.assertEqual(so.kv_connector_metadata.req_ids, ("A",), "followed one step more")
        for _ in range(20):
            so, _outs, _back = h.step()
            self.assertEqual(so.num_scheduled_tokens, {"A": 1})
            self.assertEqual(so.kv_connector_metadata.req_ids, (), "a decode step does not")
        ia = h.info("A")
        self.assertEqual(ia["connector_watched"], [], "parked: no step visits it")
        self.assertGreater(len(ia["block_ids"]), len(prefill_table), "vLLM gave it more blocks")
        self.assertEqual(ia["connector_block_ids"], prefill_table, "not followed while parked")
        h.sched.call("preempt", "A")
        h.step()
        h.step()
        ia = h.info("A")
        self.assertEqual(ia["lookups"][-1][1], 64, "resumed: its saved prompt chunks are found")
        self.assertEqual(ia["connector_block_ids"], ia["block_ids"], "resumed with its table")
        self.assertEqual(h.check("A"), {0: []})

    def test_a_parked_request_set_back_into_its_prompt_is_not_handed_over(self):
        # The connector no longer follows a parked request's table: if vLLM sets it back below its
        # prompt without resuming it (no whole table given), it is computed without kvstrata
        # rather than saved through a table that may have moved.
        h = Harness(self)
        h.add("A", prompt(43, 70), max_tokens=40)
        for _ in range(6):
            h.step()
        self.assertEqual(h.info("A")["connector_watched"], [])
        h.sched.call("rewind", "A", 16)
        for _ in range(3):
            so, _outs, _back = h.step()
            self.assertEqual(so.kv_connector_metadata.req_ids, (), "nothing handed over for it")
        self.assertEqual(h.info("A")["connector_watched"], [])
        h.run(lambda: h.info("A")["num_computed"] >= 75)
        self.assertEqual(h.check("A"), {0: []}, "its KV is the model's")


class StepsWithoutForward(unittest.TestCase):
    def test_empty_steps_that_call_wait_for_save_then_a_restore(self):
        # Some releases' kv_connector_no_forward called wait_for_save as well (main's does not,
        # on either runner: test_replay_abi15 covers that order).
        h = Harness(self)
        a = prompt(12, 70)
        h.add("A", a, max_tokens=1)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        for _ in range(2):
            so, outs, back = h.step(opts={"no_forward_wait_save": True})
            self.assertEqual(so.total_num_scheduled_tokens, 0)
            self.assertIn("wait_for_save", outs[0].calls)
        h.add("B", a, max_tokens=2)
        h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 64, False)])
        self.assertEqual(h.check("B"), {0: []})


if __name__ == "__main__":
    unittest.main()


class AsyncScheduling(unittest.TestCase):
    """vLLM's async scheduling: step k+1 is scheduled (build_connector_meta included) before the
    scheduler has step k's output; a running request's sampled token is a placeholder meanwhile."""

    def decode(self, h, rid, n_tokens, max_steps=200, flush=True):
        """Step until rid has n_tokens tokens or finished (with flush, the last output fed back)."""
        for _ in range(max_steps):
            if len(h.info(rid)["tokens"]) >= n_tokens or h.info(rid)["status"] == "FINISHED":
                break
            h.step()
        if flush:
            h.flush()

    def test_a_failed_load_rewound_a_step_late_is_saved_again(self):
        # The step after B's load is built before that load's output: B looks past its prompt
        # there, then vLLM rewinds it to the failed chunk. The connector still follows B, so the
        # recomputed chunks are saved and a later request finds the whole prefix again.
        h = Harness(self, async_scheduling=True)
        a = prompt(8, 106)
        h.add("A", a, max_tokens=1)
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        h.flush()
        self.assertIsNotNone(corrupt_shared_object(h.shm_name, h.workers[0].call("row_bytes", a,
                                                                                  0, 40)))
        h.add("B", a, max_tokens=40)
        rewound = False
        for _ in range(200):
            if h.info("B")["num_computed"] >= len(a) + 4:
                break
            h.step()
            rewound |= 0 < h.info("B")["num_computed"] < len(a)
        h.flush()
        self.assertTrue(rewound, "vLLM set B back into its prompt")
        # (B's pages are not compared: the token B's in-flight step sampled over the failed chunk
        # is kept by the scheduler, as vLLM main's update_from_output keeps it, so B's first
        # output token is not the model's)
        h.add("C", a, max_tokens=2)
        h.step()
        self.assertEqual(h.info("C")["lookups"][0][1], 96, "B saved what it recomputed")

    def assert_model_tokens(self, h, rid, n_prompt):
        toks = h.info(rid)["tokens"]
        for i in range(n_prompt, len(toks)):
            self.assertEqual(toks[i], sample(toks[:i], h.spec["vocab"]), f"{rid}'s token {i}")

    def test_the_next_step_is_scheduled_on_a_placeholder(self):
        h = Harness(self, async_scheduling=True)
        a = prompt(30, 40)
        h.add("A", a, max_tokens=6)
        so, _, _ = h.step()
        self.assertEqual(so.num_scheduled_tokens, {"A": 40})
        i = h.info("A")
        self.assertEqual((len(i["tokens"]), i["num_computed"], i["placeholders"]), (40, 40, 1))
        so, outs, _ = h.step()  # scheduled before the first token came back
        self.assertEqual(so.num_scheduled_tokens, {"A": 1})
        self.assertEqual(so.scheduled_cached_reqs.num_computed_tokens, [40])
        self.assertEqual(so.scheduled_cached_reqs.num_output_tokens, [1],
                         "vLLM counts the placeholder among the output tokens")
        i = h.info("A")
        self.assertEqual((len(i["tokens"]), i["num_computed"], i["placeholders"]), (41, 41, 1))
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        h.flush()
        i = h.info("A")
        self.assertEqual((len(i["tokens"]), i["placeholders"]), (46, 0))
        self.assert_model_tokens(h, "A", 40)
        self.assertEqual(len(h.steps), 7)
        self.assertEqual(h.steps[-1][0].num_scheduled_tokens, {},
                         "the last token in flight: A is not scheduled past max_tokens")

    def test_a_prefix_another_request_saved_is_restored_exactly(self):
        h = Harness(self, async_scheduling=True)
        C = h.spec["chunk_tokens"]
        a = prompt(31, 3 * C + 10)
        h.add("A", a, max_tokens=4)
        h.step()  # A's prompt computed and saved; its first token in flight
        b = a[:3 * C] + prompt(32, 20)
        h.add("B", b, max_tokens=3)
        so, outs, back = h.step()  # B looked up while A's output is still in flight
        self.assertEqual(h.info("B")["lookups"], [(0, 3 * C, False)])
        self.assertEqual(so.num_scheduled_tokens, {"A": 1, "B": len(b) - 3 * C})
        self.assertEqual(outs[0].stats.data.get("chunks_loaded"), 3)
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("B", 0, 3 * C), {0: []}, "the restored KV is the saved KV")
        self.assertEqual(h.check("B"), {0: []})
        self.assertEqual(h.check("A"), {0: []})
        h.step()
        self.assertEqual(h.check("B"), {0: []}, "and B's first decode step on it")
        h.run(lambda: all(h.info(r)["status"] == "FINISHED" for r in ("A", "B")))
        h.flush()
        self.assert_model_tokens(h, "A", len(a))
        self.assert_model_tokens(h, "B", len(b))

    def test_preemption_after_many_decode_steps_then_resume(self):
        h = Harness(self, async_scheduling=True, yaml_extra="save_decode: true\n")
        a = prompt(33, 80)
        h.add("A", a, max_tokens=40)
        h.add("Z", prompt(34, 20), max_tokens=60)  # keeps decoding: every step has a forward pass
        self.decode(h, "A", 110, flush=False)  # A's step computing position 109 is in flight
        before = h.info("A")
        self.assertEqual((len(before["tokens"]), before["num_computed"], before["placeholders"]),
                         (110, 110, 1))
        self.assertEqual(h.check("A"), {0: []})
        h.sched.call("preempt", "A")
        so, outs, back = h.step()  # A preempted with a step in flight: its token is still delivered
        self.assertEqual(so.preempted_req_ids, {"A"})
        self.assertNotIn("A", so.num_scheduled_tokens)
        mid = h.info("A")
        self.assertEqual((mid["status"], mid["placeholders"], mid["num_computed"]),
                         ("PREEMPTED", 0, 0))
        self.assertEqual(len(mid["tokens"]), 111, "the in-flight step's token was delivered")
        so, outs, back = h.step()  # now A resumes
        self.assertIn("A", so.scheduled_cached_reqs.resumed_req_ids)
        after = h.info("A")
        n = len(after["tokens"])
        self.assertEqual(n, 111)
        # decode tokens saved: every whole chunk of the 111 tokens, [64, 96) half decode, is stored
        self.assertEqual(after["lookups"], [(0, 0, False), (0, 96, False)])
        self.assertEqual(so.num_scheduled_tokens["A"], n - 96)
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(outs[0].stats.data.get("chunks_loaded"), 3)
        self.assertEqual(h.check("A", 0, 96), {0: []}, "the restored KV is the saved KV")
        self.decode(h, "A", 116)
        self.assertEqual(h.check("A"), {0: []}, "and its decode steps after the resume")
        h.run(lambda: h.info("A")["status"] == "FINISHED")
        h.flush()
        self.assert_model_tokens(h, "A", 80)
        self.assertEqual(len(h.info("A")["tokens"]), 120)

    def test_decode_chunks_are_saved_only_with_their_sampled_tokens(self):
        # The prompt ends at a chunk boundary: each decode chunk's last token is sampled in the step
        # after the one that computes its position, so the step that schedules that position has
        # a placeholder there. The chunk is saved later, with the real token: B, which shares A's
        # prompt and outputs, restores pages equal to A's model's.
        h = Harness(self, async_scheduling=True, yaml_extra="save_decode: true\n")
        C = h.spec["chunk_tokens"]
        a = prompt(35, 2 * C)
        h.add("A", a, max_tokens=2 * C + 8)
        self.decode(h, "A", 10 ** 6)
        ia = h.info("A")
        self.assertEqual(ia["status"], "FINISHED")
        self.assert_model_tokens(h, "A", 2 * C)
        # the step computing position 4C-1 (a placeholder then) saves nothing; the next one, whose
        # metadata has that token, saves the chunk [3C, 4C)
        saved = [(so.scheduled_cached_reqs.num_computed_tokens,
                  outs[0].stats.data.get("chunks_saved"))
                 for so, outs, _ in h.steps if so.scheduled_cached_reqs.req_ids == ["A"]]
        at = [i for i, (nc, _) in enumerate(saved) if nc == [4 * C - 1]]
        self.assertEqual(len(at), 1)
        self.assertFalse(saved[at[0]][1], "a chunk whose last token is a placeholder is not saved")
        self.assertEqual(saved[at[0] + 1][1], 1)
        self.assertEqual(sum(n or 0 for _, n in saved), 2, "the chunks [2C, 3C) and [3C, 4C)")
        b = ia["tokens"][:4 * C] + prompt(36, 5)
        h.add("B", b, max_tokens=2)
        so, outs, back = h.step()
        self.assertEqual(h.info("B")["lookups"], [(0, 4 * C, False)])
        self.assertEqual(so.num_scheduled_tokens, {"B": 5})
        self.assertEqual(back.invalid_block_ids, set())
        self.assertEqual(h.check("B"), {0: []})
        h.flush()
        # and a request whose chunk differs from A's in the last decode token only gets the rest
        c = ia["tokens"][:4 * C - 1] + [(ia["tokens"][4 * C - 1] + 1) % h.spec["vocab"]]
        h.add("C", c + prompt(37, 5), max_tokens=1)
        h.step()
        self.assertEqual(h.info("C")["lookups"], [(0, 3 * C, False)])
        self.assertEqual(h.check("C"), {0: []})
