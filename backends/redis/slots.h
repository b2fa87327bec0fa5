/*
 * slots.h - Redis Cluster's key slots: CRC16 of a key (with the hash-tag rule) modulo 16384, and the
 * slot map read from a CLUSTER SLOTS reply (untrusted: every field is checked). Pure, thread-safe.
 */
#ifndef KVS_REDIS_SLOTS_H
#define KVS_REDIS_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "resp.h"

#define KVS_REDIS_SLOTS        16384
#define KVS_REDIS_HOST_BYTES   256 /* a host name or address, NUL included */
#define KVS_REDIS_ENDPOINT_MAX 300 /* "host:port" or a unix socket path, NUL included */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with. */
uint16_t kvs_redis_crc16(const void *data, size_t len);

/* The slot of a key: of the part between the first '{' and the next '}' when that part is not
 * empty, else of the whole key. */
uint16_t kvs_redis_key_slot(const char *key, size_t len);

/* One range of slots and the master that serves it, as CLUSTER SLOTS tells. */
typedef struct kvs_redis_slot_range {
    uint16_t first, last;
    uint16_t port;
    char host[KVS_REDIS_HOST_BYTES];
} kvs_redis_slot_range;

/* The ranges of a CLUSTER SLOTS reply (nodes[0..n), as kvs_resp_parse wrote them) into
 * out[0..cap), *n_out of them. A master's host that is empty or "?" (the server does not know its
 * own address) becomes asked_host, the host of the node that was asked. 0, or -1 with a sentence
 * in why when the reply is not a slot map (wrong shapes, slots past 16383, first > last, bad ports,
 * more ranges than cap). */
int kvs_redis_slots_parse(const kvs_resp_node *nodes, uint32_t n, const char *asked_host,
                          kvs_redis_slot_range *out, uint32_t cap, uint32_t *n_out, char *why,
                          size_t why_len);

#endif
