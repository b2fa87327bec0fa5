"""kvstrata's statistics in vLLM: the stats object vLLM aggregates over the scheduler and the workers,
and the Prometheus metrics it exports (vllm:kvstrata_*). KvstrataConnector (kvstrata.vllm) builds them;
docs/vllm.md lists what each metric means."""

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
except ImportError:  # no vLLM, or a release before connector stats
    from kvstrata._vllm_standin import KVConnectorPromMetrics, KVConnectorStats

__all__ = ["KvstrataConnectorStats", "KvstrataPromMetrics", "stats_delta"]


# Counters of kvs_stats reported as deltas. Per-request counts (tokens, async loads, closed steps)
# come from TP rank 0 only: every rank repeats them for its shard. Chunks, bytes, times and load
# errors are per shard and summed over the ranks.
_SCALAR_STATS = ("lookups", "lookup_hit_tokens", "lookup_miss_tokens", "tokens_loaded",
                 "chunks_loaded", "bytes_loaded", "load_ns", "chunks_saved", "bytes_saved",
                 "save_ns", "saves_skipped", "load_errors", "evictions", "async_loads_started",
                 "async_loads_done", "async_loads_failed", "steps_closed", "lookups_unknown",
                 "lossy_chunks_loaded")
_RANK0_STATS = ("tokens_loaded", "async_loads_started", "async_loads_done", "async_loads_failed",
                "steps_closed")
# Keys whose value is {name: {counter: int}}: per serving tier (workers), per tenant (the scheduler,
# by a hash of the request's cache_salt).
_NESTED = ("tiers", "tenants")
_TIER_STATS = {"tier_chunks_loaded": "chunks_loaded", "tier_bytes_loaded": "bytes_loaded",
               "tier_load_ns": "load_ns"}


class KvstrataConnectorStats(KVConnectorStats):
    """kvstrata's counters over an interval, summed over the scheduler and the workers. data:
    {counter: int, ..., "tiers": {tier name: {"chunks_loaded", "bytes_loaded", "load_ns"}}}."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        if other is None or not getattr(other, "data", None):
            return self
        for k, v in other.data.items():
            if k in _NESTED:
                mine = self.data.setdefault(k, {})
                for tier, d in v.items():
                    t = mine.setdefault(tier, {})
                    for kk, vv in d.items():
                        t[kk] = t.get(kk, 0) + vv
            else:
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        d = self.data
        out = {k: d[k] for k in _SCALAR_STATS if d.get(k)}
        if d.get("load_ns"):
            out["load_gbps"] = round(d.get("bytes_loaded", 0) / d["load_ns"], 3)
        if d.get("save_ns"):
            out["save_gbps"] = round(d.get("bytes_saved", 0) / d["save_ns"], 3)
        for tier, t in sorted(d.get("tiers", {}).items()):
            if t.get("bytes_loaded"):
                out[f"loaded_bytes[{tier}]"] = t["bytes_loaded"]
                if t.get("load_ns"):
                    out[f"load_gbps[{tier}]"] = round(t["bytes_loaded"] / t["load_ns"], 3)
        for tenant, t in sorted(d.get("tenants", {}).items()):
            if t.get("lookups"):
                out[f"hit_tokens[tenant={tenant}]"] = t.get("hit_tokens", 0)
                out[f"miss_tokens[tenant={tenant}]"] = t.get("miss_tokens", 0)
        return out

    def is_empty(self):
        d = self.data
        return not any(d.get(k) for k in _SCALAR_STATS) and not any(
            any(t.values()) for k in _NESTED for t in d.get(k, {}).values())


def stats_delta(now, before, tier_names, with_tokens):
    data = {}
    for k in _SCALAR_STATS:
        if k in _RANK0_STATS and not with_tokens:
            continue
        v = now.get(k, 0) - (before.get(k, 0) if before else 0)
        if v:
            data[k] = v
    tiers = {}
    for k, short in _TIER_STATS.items():
        cur = now.get(k, [])
        old = before.get(k, []) if before else []
        for i, v in enumerate(cur):
            dv = v - (old[i] if i < len(old) else 0)
            if dv:
                name = tier_names[i] if i < len(tier_names) else f"tier{i}"
                tiers.setdefault(name, {})[short] = dv
    if tiers:
        data["tiers"] = tiers
    return data


def _per_engine(metric, per_engine_labelvalues):
    """One labelled child of `metric` per engine index. Done here rather than through vLLM's helper,
    which moved (a KVConnectorPromMetrics method until 2026-03, vllm.v1.metrics.utils since), so the
    same code serves the releases on both sides of the move."""
    return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}


class KvstrataPromMetrics(KVConnectorPromMetrics):
    """kvstrata's counters in vLLM's Prometheus endpoint (vllm:kvstrata_*). Per tier: loaded bytes,
    seconds and chunks (rate(bytes) / rate(seconds) is the tier's load bandwidth) and a gauge of the
    last interval's GB/s."""

    COUNTERS = (
        ("lookups", "vllm:kvstrata_lookups", "Lookups the scheduler made", 1),
        ("lookup_hit_tokens", "vllm:kvstrata_hit_tokens",
         "Tokens lookups offered to load from kvstrata (hits)", 1),
        ("lookup_miss_tokens", "vllm:kvstrata_miss_tokens",
         "Prompt tokens lookups found in no tier (misses)", 1),
        ("tokens_loaded", "vllm:kvstrata_loaded_tokens", "Tokens whose KV kvstrata loaded", 1),
        ("load_errors", "vllm:kvstrata_load_errors",
         "Chunk shards whose load failed (summed over TP ranks); vLLM recomputed their blocks", 1),
        ("chunks_saved", "vllm:kvstrata_saved_chunks", "Chunks saved", 1),
        ("bytes_saved", "vllm:kvstrata_saved_bytes", "Bytes saved", 1),
        ("save_ns", "vllm:kvstrata_save_seconds", "Time spent saving", 1e-9),
        ("saves_skipped", "vllm:kvstrata_skipped_saves",
         "Saves dropped (already stored, or no staging memory)", 1),
        ("async_loads_started", "vllm:kvstrata_async_loads_started",
         "Requests whose load ran between steps", 1),
        ("async_loads_done", "vllm:kvstrata_async_loads_done",
         "Asynchronous loads reported finished", 1),
        ("async_loads_failed", "vllm:kvstrata_async_loads_failed",
         "Asynchronous loads with at least one failed chunk", 1),
        ("steps_closed", "vllm:kvstrata_steps_closed",
         "Steps with no forward pass closed by the next step", 1),
        ("lookups_unknown", "vllm:kvstrata_lookups_unknown",
         "Lookups answered None while the remote tiers were asked", 1),
        ("lossy_chunks_loaded", "vllm:kvstrata_lossy_chunks_loaded",
         "Chunks loaded from a lossy (compressed) or derived object", 1),
    )
    TIER_COUNTERS = (
        ("bytes_loaded", "vllm:kvstrata_loaded_bytes", "Bytes loaded, by serving tier", 1),
        ("load_ns", "vllm:kvstrata_load_seconds", "Time spent loading, by serving tier", 1e-9),
        ("chunks_loaded", "vllm:kvstrata_loaded_chunks", "Chunks loaded, by serving tier", 1),
    )

    TENANT_COUNTERS = (
        ("lookups", "vllm:kvstrata_tenant_lookups", "Lookups, by tenant (a hash of cache_salt)"),
        ("hit_tokens", "vllm:kvstrata_tenant_hit_tokens", "Tokens lookups offered, by tenant"),
        ("miss_tokens", "vllm:kvstrata_tenant_miss_tokens", "Tokens lookups missed, by tenant"),
    )

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        names = list(labelnames)
        self._counters = {}
        for key, metric, doc, scale in self.COUNTERS:
            c = self._counter_cls(name=metric, documentation=doc, labelnames=names)
            self._counters[key] = (_per_engine(c, self.per_engine_labelvalues), scale)
        self._tier_counters = {}
        for key, metric, doc, scale in self.TIER_COUNTERS:
            c = self._counter_cls(name=metric, documentation=doc, labelnames=names + ["tier"])
            self._tier_counters[key] = (c, scale)
        self._tenant_counters = {}
        for key, metric, doc in self.TENANT_COUNTERS:
            c = self._counter_cls(name=metric, documentation=doc, labelnames=names + ["tenant"])
            self._tenant_counters[key] = c
        self._tier_gbps = self._gauge_cls(
            name="vllm:kvstrata_load_gbps",
            documentation="Load bandwidth of the last interval, by serving tier (GB/s)",
            labelnames=names + ["tier"])

    def observe(self, transfer_stats_data, engine_idx=0):
        data = transfer_stats_data or {}
        for key, (per_engine, scale) in self._counters.items():
            v = data.get(key)
            if v:
                per_engine[engine_idx].inc(v * scale)
        labels = list(self.per_engine_labelvalues.get(engine_idx, []))
        for tier, t in (data.get("tiers") or {}).items():
            for key, (counter, scale) in self._tier_counters.items():
                v = t.get(key)
                if v:
                    counter.labels(*labels, tier).inc(v * scale)
            if t.get("bytes_loaded") and t.get("load_ns"):
                self._tier_gbps.labels(*labels, tier).set(t["bytes_loaded"] / t["load_ns"])
        for tenant, t in (data.get("tenants") or {}).items():
            for key, counter in self._tenant_counters.items():
                v = t.get(key)
                if v:
                    counter.labels(*labels, tenant).inc(v)
