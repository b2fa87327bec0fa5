/* metrics_handle.h - a connector handle's slot in its instance's metrics segment (metrics.h). */
#ifndef KVS_METRICS_HANDLE_H
#define KVS_METRICS_HANDLE_H

#include "handle.h"

/* Attaches h when its config has `metrics:` (after the handle opened; failures only log). */
void kvs_metrics_handle_open(kvs_handle *h);
/* Stages h's counters for the instance's thread when the last stage is KVS_METRICS_PUBLISH_MS old.
 * Called by the hooks the engine calls every step, on the engine's thread: h->stats is that
 * thread's (plain fields, as stats reads them), so the copy is race-free without atomics on the hot
 * path, and it costs one clock read per hook and, twice a second, the saver's counters taken (its
 * own mutex, held for a few additions) and a copy of a few KiB into process memory. No tier is
 * called and no lock of a tier or of the metrics segment is taken: the instance's thread asks the
 * tiers' usage and writes the segment. */
void kvs_metrics_handle_tick(kvs_handle *h);
/* Publishes a last time and retires the slot. */
void kvs_metrics_handle_close(kvs_handle *h);

#define KVS_METRICS_PUBLISH_MS 500

#endif
