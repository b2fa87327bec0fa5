/* worker_saver.h - asynchronous saves (`saves: {async: true}`) and the sending report. wait_save hands
 * the step's gathered chunk objects to a saver thread, which hashes them (when the device did not),
 * seals and stores them while the engine steps on; the saver counts, per request, the saves not
 * landed yet. The step metadata names the requests the scheduler finished with their pages kept;
 * get_finished reports each of them once in its sending list when none of its saves is in flight.
 * Calls on one handle come from the worker's thread (the saver thread is the module's own business). */
#ifndef KVS_WORKER_SAVER_H
#define KVS_WORKER_SAVER_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "meta.h"

struct kvs_save_work;

/* 1 when wait_save hands this step's stores to the saver thread: async saves are configured and
 * every tier may be called from another thread (else the stores stay in wait_save). */
int kvs_saver_async(kvs_handle *h);
/* Queue the whole, untainted saves works[0..n) (their objects hold every layer; hashes computed by
 * the device unless `hash` is 1). Each work is cleared: its slab or reservation belongs to the saver.
 * A work that cannot be queued (out of memory, no thread) is stored here, on the caller's thread. */
void kvs_saver_submit(kvs_handle *h, struct kvs_save_work *works, uint64_t n, int hash);
/* Remember the requests step metadata m names as finished (reported by kvs_saver_take_sending). */
kvs_status kvs_saver_note_finished(kvs_handle *h, const kvs_meta *m);
/* Bytes (ids and NULs) and count of the finished requests with no save in flight. */
void kvs_saver_sending_need(kvs_handle *h, uint64_t *bytes, uint64_t *n);
/* Write those ids, NUL-separated, into buf[0..cap) (as many whole ones as fit) and forget them;
 * *n gets how many. */
void kvs_saver_take_sending(kvs_handle *h, char *buf, uint64_t cap, uint64_t *n);
/* Wait up to saves.timeout_ms for a queued save to land (its staging slab is free again): 1 when
 * one did, 0 when none is queued or the time ran out. */
int kvs_saver_wait_landed(kvs_handle *h);
/* Fold the saver's counters into h->stats (chunks_saved, bytes_saved, saves_skipped, save_ns,
 * saves_in_flight). */
void kvs_saver_collect(kvs_handle *h);
/* Wait up to saves.timeout_ms for the queue to drain, stop the thread, drop what is left (slabs
 * freed, reservations aborted, counted skipped) and forget every request (close). */
void kvs_saver_close(kvs_handle *h);
/* Tests: with hold 1 the saver thread takes no new job (they stay queued) until hold 0. */
void kvs_saver_hold(kvs_handle *h, int hold);

#endif
