"""Disaggregated prefill and decode through a shared tier: a producer instance (vLLM kv_role
kv_producer) and a consumer instance (kv_consumer), each its own scheduler process and worker
process, share one DRAM tier through one shared memory object, with asynchronous saves. The
producer keeps a finished request's blocks until its workers report the saves landed
(finished_sending); the consumer finds every chunk the producer reported and loads it byte for byte,
waits (lookup None) for chunks not stored yet, and takes what it has once its wait runs out."""

import time
import unittest
import uuid

from kvs_harness import Harness, prompt, sample

ASYNC_SAVES = "saves:\n  async: true\n"
VOCAB = 32000


def wait_steps(h, until, max_steps=300, pause=0.005):
    for _ in range(max_steps):
        if until():
            return
        h.step()
        time.sleep(pause)
    raise AssertionError(f"not done after {max_steps} steps")


def prefilled(h, rid, n):
    """rid has computed its first n tokens and still runs (its blocks are still its own)."""
    i = h.info(rid)
    return i["status"] == "RUNNING" and i["num_computed"] >= n


def reported(h, key, rid):
    return [i for i, (_so, _outs, back) in enumerate(h.steps) if rid in getattr(back, key)]


def worker_total(h, name):
    return sum((o.stats.data.get(name, 0) if o.stats else 0) for _so, outs, _b in h.steps
               for o in outs)


class Disaggregated(unittest.TestCase):
    def pair(self, consumer_extra=None):
        shm = "kvstrata-pd-" + uuid.uuid4().hex[:12]
        producer = Harness(self, kv_role="kv_producer", shm_name=shm, yaml_extra=ASYNC_SAVES)
        consumer = Harness(self, kv_role="kv_consumer", shm_name=shm, yaml_extra=ASYNC_SAVES,
                           extra_config=consumer_extra)
        return producer, consumer

    def prefill(self, producer, rid, tokens):
        """Run rid to its end on the producer (one output token, as a prefill instance does);
        returns (its kv_transfer_params, the step it finished in)."""
        producer.add(rid, tokens, max_tokens=1)
        wait_steps(producer, lambda: producer.info(rid)["status"] == "FINISHED")
        done = len(producer.steps) - 1
        info = producer.info(rid)
        keep, params = info["finished_result"]
        self.assertTrue(keep, "a request with saves emitted keeps its blocks while they land")
        kept = info["kept_block_ids"]
        self.assertTrue(kept)
        self.assertFalse(producer.sched.call("are_free", kept),
                         "the blocks stay allocated until finished_sending")
        self.assertEqual(reported(producer, "finished_sending", rid), [])
        wait_steps(producer, lambda: reported(producer, "finished_sending", rid))
        sent = reported(producer, "finished_sending", rid)
        self.assertEqual(len(sent), 1, "reported once")
        self.assertGreater(sent[0], done, "reported only after the scheduler finished it")
        self.assertTrue(producer.sched.call("are_free", kept), "freed on finished_sending")
        self.assertEqual(producer.info(rid)["kept_block_ids"], [])
        self.assertEqual(producer.info(rid)["lookups"], [(0, 0, False)],
                         "a producer's lookup finds nothing")
        return params, done

    def test_the_consumer_loads_every_chunk_the_producer_reported_sent(self):
        producer, consumer = self.pair()
        a = prompt(1, 106)
        params, _done = self.prefill(producer, "R", a)
        self.assertEqual(params, {"kvstrata_stored_tokens": 96})  # three chunks of 32
        first = producer.info("R")["tokens"][-1]
        self.assertEqual(first, sample(a, VOCAB))
        consumer.add("R", a + [first], max_tokens=20, kv_transfer_params=params)
        wait_steps(consumer, lambda: prefilled(consumer, "R", len(a) + 3))
        self.assertEqual(consumer.info("R")["lookups"], [(0, 96, False)])
        self.assertEqual(consumer.check("R"), {0: []}, "the loaded KV is the producer's")
        self.assertEqual(worker_total(consumer, "chunks_loaded"), 3)
        self.assertEqual(worker_total(consumer, "chunks_saved"), 0, "a consumer only loads")
        self.assertEqual(worker_total(producer, "chunks_saved"), 3)
        self.assertEqual(worker_total(producer, "saves_skipped"), 0)

    def test_a_consumer_waits_for_chunks_the_producer_has_not_stored_yet(self):
        producer, consumer = self.pair()
        a = prompt(2, 150)
        params = {"kvstrata_stored_tokens": 128}
        consumer.add("R", a + [sample(a, VOCAB)], max_tokens=20, kv_transfer_params=params)
        for _ in range(3):
            so, _outs, _back = consumer.step()
            self.assertNotIn("R", so.num_scheduled_tokens)
        self.assertEqual(consumer.info("R")["lookups"], [(0, None, False)] * 3)
        self.assertEqual(consumer.info("R")["status"], "WAITING")
        got, _done = self.prefill(producer, "R", a)
        self.assertEqual(got, params)
        wait_steps(consumer, lambda: prefilled(consumer, "R", len(a) + 1))
        self.assertEqual(consumer.info("R")["lookups"][-1], (0, 128, False))
        self.assertEqual(consumer.check("R"), {0: []})
        self.assertEqual(worker_total(consumer, "chunks_loaded"), 4)

    def test_a_consumer_takes_what_it_has_once_its_wait_runs_out(self):
        producer, consumer = self.pair(consumer_extra={"handoff_wait_ms": 300})
        a = prompt(3, 106)
        params, _done = self.prefill(producer, "R", a)
        # a hand-off claiming more than the tier holds (a dropped save): a miss after the wait,
        # never wrong KV
        longer = a + [sample(a, VOCAB)] + prompt(4, 100)
        consumer.add("R", longer, max_tokens=20,
                     kv_transfer_params={"kvstrata_stored_tokens": 192})
        started = time.monotonic()
        wait_steps(consumer, lambda: prefilled(consumer, "R", len(longer)), pause=0.02)
        self.assertGreaterEqual(time.monotonic() - started, 0.3)
        lookups = consumer.info("R")["lookups"]
        self.assertEqual(lookups[0], (0, None, False))
        self.assertEqual(lookups[-1], (0, 96, False), "the three chunks the producer stored")
        self.assertEqual(consumer.check("R"), {0: []})

    def test_a_request_without_a_hand_off_is_served_at_once(self):
        producer, consumer = self.pair()
        consumer.add("Q", prompt(5, 80), max_tokens=20)
        consumer.step()
        self.assertEqual(consumer.info("Q")["lookups"], [(0, 0, False)])
        wait_steps(consumer, lambda: prefilled(consumer, "Q", 81))
        self.assertEqual(consumer.check("Q"), {0: []})
        self.assertEqual(worker_total(consumer, "chunks_saved"), 0)


class AsyncSavesOnOneInstance(unittest.TestCase):
    def test_kept_blocks_are_freed_once_sent_and_a_second_request_hits(self):
        h = Harness(self, yaml_extra=ASYNC_SAVES)
        a = prompt(6, 106)
        h.add("A", a, max_tokens=2)
        wait_steps(h, lambda: h.info("A")["status"] == "FINISHED")
        self.assertTrue(h.info("A")["finished_result"][0])
        self.assertIsNone(h.info("A")["finished_result"][1], "kv_both hands nothing off")
        wait_steps(h, lambda: reported(h, "finished_sending", "A"))
        h.add("B", a, max_tokens=4)
        wait_steps(h, lambda: prefilled(h, "B", len(a) + 1))
        self.assertEqual(h.info("B")["lookups"], [(0, 96, False)])
        self.assertEqual(h.check("B"), {0: []})
        wait_steps(h, lambda: h.info("B")["status"] == "FINISHED")
        # every chunk of B was stored already: no save emitted, nothing to keep or report
        self.assertEqual(h.info("B")["finished_result"], (False, None))
        h.step()
        self.assertEqual(reported(h, "finished_sending", "B"), [])
        self.assertEqual(len(reported(h, "finished_sending", "A")), 1)


if __name__ == "__main__":
    unittest.main()
