/* peer_gpu_region.h - the lent region (peer_gpu_region.c), the tier's lowest unit: mapping or
 * opening it, the copies into and out of it, and the tier's error and log helpers. */
#ifndef KVS_PEER_GPU_REGION_H
#define KVS_PEER_GPU_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "lend_wire.h"
#include "peer_gpu_state.h"

/* The tier's last error (st->error, written without the lock as in the other tiers) and a line to
 * the host's log. */
void pg_set_error(pg_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pg_log(pg_state *st, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* No lock held unless said. Map (host) or open (CUDA) the HELLO's region. KVS_OK with *base (and *device for CUDA); else a
 * sentence in why and nothing held. */
kvs_status pg_region_open(pg_state *st, const kvs_lend_msg *m, int fd, uint8_t **base, int *device,
                          char *why, size_t why_len);
void pg_region_close(pg_state *st, uint8_t *base, uint64_t bytes, uint32_t kind, int device);
/* The CUDA module, at destroy. */
void pg_region_unload(pg_state *st);
/* Copies out of and into bytes of the region in `unit`, no lock held (the test hook first; a host
 * region's copy uses non-temporal stores past KVS_COPY_STREAM_MIN, fenced), done when they
 * return: KVS_OK, or KVS_EIO for a failed copy (st->error says why). */
kvs_status pg_region_read(pg_state *st, uint32_t unit, void *dst, const uint8_t *src, uint64_t n);
kvs_status pg_region_write(pg_state *st, uint32_t unit, uint8_t *dst, const void *src, uint64_t n);
/* len bytes of the region at src as host bytes to pass down the chain: src itself (a host
 * region), or (CUDA) a copy in evict_buf[buf]; NULL when that copy failed (st->error says why). */
const void *pg_region_host_view(pg_state *st, const uint8_t *src, uint64_t len, int buf);

#endif /* KVS_PEER_GPU_REGION_H */
