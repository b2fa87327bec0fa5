/* metrics.h - Prometheus metrics outside the engine (docs/operations.md, Metrics): every handle,
 * store and node of an instance (the processes that open one YAML with a `metrics:` section)
 * publishes its counters into the instance's shared segment (metrics_seg.h); the one process whose
 * bind on metrics.listen succeeds serves GET /metrics from it, the others retry the bind every
 * second so one of them takes over when it exits. Tools read the same text without any server. */
#ifndef KVS_METRICS_H
#define KVS_METRICS_H

#include <stddef.h>

#include "metrics_seg.h"

/* The text the endpoint serves, from the segment `name` (metrics.name), without any process of the
 * instance needing to serve HTTP. malloc'd into *text (the caller frees it with free()), its length
 * in *len. KVS_ENOTFOUND with a sentence in err when no process has created the segment yet. */
kvs_status kvs_metrics_render_named(const char *name, char **text, size_t *len, char *err,
                                    size_t err_len);

/* Checks "HOST:PORT" (port 1..65535): 0, or -1 with a sentence in why. */
int kvs_metrics_check_listen(const char *listen, char *why, size_t why_len);
/* 1 for a character a segment name may hold: letters, digits, '-', '_', '.'. */
int kvs_metrics_name_char_ok(char c);
/* The segment name an instance without `metrics.name` uses: from the listen address and the uid,
 * so two users' or two ports' instances never share one. */
void kvs_metrics_default_name(const char *listen, char *out, size_t cap);

typedef struct kvs_metrics_source kvs_metrics_source;

/* Fills v's values (identity fields stay as attached), called by the instance's thread every
 * KVS_METRICS_POLL_MS: for sources whose counters are atomics and may be read from any thread, or
 * that stage their counters (kvs_metrics_stage: v holds the last staged values) and leave the
 * instance's thread the work that may wait (tier usage). final: the last call, on the detaching
 * thread (the slot's gauges leave with it: nothing that may wait is needed). Never called after
 * kvs_metrics_detach returned. */
typedef void (*kvs_metrics_poll_fn)(void *ctx, kvs_mseg_values *v, int final);
#define KVS_METRICS_POLL_MS 500

/* A slot in the instance of (listen, name), started (segment, thread) by its first source in this
 * process. poll NULL: the owner publishes with kvs_metrics_publish. NULL when metrics cannot run
 * (logged; the engine goes on without them). */
kvs_metrics_source *kvs_metrics_attach(const char *listen, const char *name, int log_level,
                                       const kvs_mseg_values *identity, kvs_metrics_poll_fn poll,
                                       void *ctx);
/* The owner's values (never waits). */
void kvs_metrics_publish(kvs_metrics_source *src, const kvs_mseg_values *v);
/* The owner's values for the instance's thread to publish at its next poll (a source with a poll
 * function): never waits, and may run on a thread that must not (an engine's). */
void kvs_metrics_stage(kvs_metrics_source *src, const kvs_mseg_values *v);
/* Publishes a last time (poll sources), retires the slot; the instance's last source in the process
 * stops its thread and server. NULL: no-op. In a forked child, a source its parent attached is only
 * freed: the slot, thread and server stay the parent's (the child attaches its own). */
void kvs_metrics_detach(kvs_metrics_source *src);
/* 1 when this process's instance of that name serves HTTP now (tests). */
int kvs_metrics_serving(const char *name);

#endif
