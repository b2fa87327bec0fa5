#!/usr/bin/python3
"""vllm-scheduler-step.py - what the scheduler-side KvstrataConnector costs vLLM's scheduler per
decode step, measured in the replay harness's scheduler (tests/python/kvs_harness.py).

R requests of L prompt tokens are prefilled, then every step decodes one token of each (no loads,
no saves: the prompts are not in the tier and decode tokens are not saved). Timed per step, in one
process on this machine:
  - without: the harness's scheduler with a connector that does nothing (the reference: the
    scheduler's own work for the step, building the SchedulerOutput included);
  - with:    the same scheduler with KvstrataConnector (role SCHEDULER, a DRAM tier in /dev/shm);
  - connector: the time spent inside the connector's hooks in the "with" run.
The two schedulers run side by side, their steps interleaved. Printed (medians over the steps):
one JSON object per (R, L) and one human line; the ratio is connector / without.

usage: KVSTRATA_LIBRARY=build/lib/libkvstrata.so PYTHONPATH=python \\
       /usr/bin/python3 bench/vllm-scheduler-step.py [--requests 256] [--tokens 1024,8192] [--steps 64]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))

import kvs_harness as H  # noqa: E402

HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "request_finished", "on_new_request", "get_kv_connector_stats")


class NullConnector:
    """The scheduler-side hooks doing nothing: the reference run's connector."""

    _handle = None
    _requests = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return None

    def build_connector_meta(self, scheduler_output):
        return None

    def request_finished(self, request, block_ids):
        return False, None

    def on_new_request(self, request):
        return None

    def get_kv_connector_stats(self):
        return None

    def shutdown(self):
        return None


class Timed:
    """Wraps a connector and adds the time spent in its hooks to self.ns."""

    def __init__(self, conn):
        self.conn = conn
        self.ns = 0

    def __getattr__(self, name):
        attr = getattr(self.conn, name)
        if name not in HOOKS:
            return attr

        def timed(*a, **kw):
            t0 = time.perf_counter_ns()
            try:
                return attr(*a, **kw)
            finally:
                self.ns += time.perf_counter_ns() - t0

        return timed


def spec_for(n_requests, n_tokens, steps, tmp):
    shm = "kvstrata-bench-" + uuid.uuid4().hex[:12]
    path = os.path.join(tmp, "kvstrata.yaml")
    with open(path, "w") as f:
        f.write(f"version: 1\nchunk_tokens: 256\ntiers:\n  - name: dram\n    type: dram\n"
                f"    capacity: 64MiB\n    options:\n      shm_name: {shm}\n")
    # room for each request's decode: one token a step while the others prefill, then the steps
    budget = max(8192, n_requests)
    decode = n_requests * n_tokens // budget + steps + 64
    blocks = n_requests * ((n_tokens + decode) // 16 + 2)
    return dict(layout="nhd", dtype="fp16", tp=1, n_layers=32, heads_total=8, head_dim=128,
                block_size=16, kernel_block_size=None, n_blocks=blocks, chunk_tokens=256,
                vocab=32000, token_budget=budget, mla=False,
                model_id="kvstrata-bench/step", engine_id="bench" + uuid.uuid4().hex[:8],
                model_dtype="float16", cache_dtype="auto", model="hash", device="cpu",
                extra_config={"config": path}, shared_layers=0), shm


class Run:
    """One scheduler (with or without the connector) whose R requests have prefilled."""

    def __init__(self, n_requests, n_tokens, steps, with_connector):
        self.tmp = tempfile.mkdtemp(prefix="kvs-bench-step-")
        spec, self.shm = spec_for(n_requests, n_tokens, steps, self.tmp)
        self.s = s = H.SchedulerRunner(spec)
        self.real = s.conn
        s.conn = Timed(self.real) if with_connector else NullConnector()
        self.with_connector = with_connector
        self.n_requests = n_requests
        for i in range(n_requests):
            s.add_request(f"r{i}", H.prompt(1000 + i, n_tokens), 1 << 30)
        # prefill: every request computes its prompt (chunked by the token budget)
        while any(r.num_output_tokens == 0 for r in s.requests.values()):
            so = s.schedule()
            sampled = {rid: 7 for rid in so.num_scheduled_tokens
                       if s.requests[rid].num_computed_tokens >= s.requests[rid].num_tokens}
            s.update_from_output(H.StepOutput(sampled, set(), set(), set()))
        self.times, self.conn_times = [], []

    def step(self):
        s = self.s
        c0 = s.conn.ns if self.with_connector else 0
        t0 = time.perf_counter_ns()
        so = s.schedule()
        sampled = {rid: 7 for rid in so.num_scheduled_tokens}
        s.update_from_output(H.StepOutput(sampled, set(), set(), set()))
        self.times.append(time.perf_counter_ns() - t0)
        self.conn_times.append((s.conn.ns if self.with_connector else 0) - c0)
        assert len(so.num_scheduled_tokens) == self.n_requests, "every request decodes each step"

    def close(self):
        self.real.shutdown()
        leftover = os.path.join("/dev/shm", self.shm)
        if os.path.exists(leftover):
            os.unlink(leftover)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def medians(self):
        t, c = sorted(self.times), sorted(self.conn_times)
        return t[len(t) // 2] / 1e6, c[len(c) // 2] / 1e6


def run(n_requests, n_tokens, steps):
    """Both schedulers, their decode steps interleaved (a noisy neighbour slows both alike)."""
    without = Run(n_requests, n_tokens, steps, False)
    with_ = Run(n_requests, n_tokens, steps, True)
    for _ in range(steps):
        without.step()
        with_.step()
    a, _ = without.medians()
    b, conn = with_.medians()
    without.close()
    with_.close()
    return a, b, conn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--tokens", default="1024,8192")
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    for n_tokens in [int(x) for x in a.tokens.split(",")]:
        without, with_, conn = run(a.requests, n_tokens, a.steps)
        out = {"bench": "vllm_scheduler_step", "requests": a.requests, "prompt_tokens": n_tokens,
               "steps": a.steps, "step_ms_without": round(without, 4),
               "step_ms_with": round(with_, 4), "connector_ms": round(conn, 4),
               "connector_over_without": round(conn / without, 4)}
        print(json.dumps(out))
        print(f"# {a.requests} requests of {n_tokens} tokens: scheduler step {without:.3f} ms "
              f"without the connector, {with_:.3f} ms with it; the connector's hooks "
              f"{conn:.3f} ms a step = {conn / without:.3f}x the scheduler's own step")


if __name__ == "__main__":
    main()
