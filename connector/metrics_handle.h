/* metrics_handle.h - a connector handle's slot in its instance's metrics segment (metrics.h). */
#ifndef KVS_METRICS_HANDLE_H
#define KVS_METRICS_HANDLE_H

#include "handle.h"

/* Attaches h when its config has `metrics:` (after the handle opened; failures only log). */
void kvs_metrics_handle_open(kvs_handle *h);
/* Publishes h's counters when the last publish is KVS_METRICS_PUBLISH_MS old. Called by the hooks
 * the engine calls every step, on the engine's thread: h->stats is that thread's (plain fields, as
 * stats reads them), so the copy is race-free without atomics on the hot path, and it costs one
 * clock read per hook and a copy of a few KiB twice a second. */
void kvs_metrics_handle_tick(kvs_handle *h);
/* Publishes a last time and retires the slot. */
void kvs_metrics_handle_close(kvs_handle *h);

#define KVS_METRICS_PUBLISH_MS 500

#endif
