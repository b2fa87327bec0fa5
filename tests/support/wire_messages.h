/* wire_messages.h - building, encoding and decoding wire messages for the suites (backends/ucx/wire):
 * shared buffers, round trips through an exact-size heap copy (so ASan sees any overread), raw
 * msgpack for messages the encoder refuses, and refusal checks. Failures are Check assertions. One
 * thread (the buffers are shared). */
#ifndef KVS_TEST_WIRE_MESSAGES_H
#define KVS_TEST_WIRE_MESSAGES_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "backends/ucx/wire.h"

/* Where kvs_test_wire_encode_ok writes. */
extern uint8_t kvs_test_wire_buf[KVS_WIRE_MAX_MESSAGE_BYTES + 64];
/* The entries decodes write into (KVS_WIRE_MAX_KEYS). */
extern kvs_wire_entry kvs_test_wire_decoded[KVS_WIRE_MAX_KEYS];
/* Entries for messages to encode; kvs_test_wire_keyed_entries fills their keys. */
extern kvs_wire_entry kvs_test_wire_in[KVS_WIRE_MAX_KEYS + 1];

/* A well-spread 16-byte key for index i, the same on every run. */
kvs_key kvs_test_wire_key(uint32_t i);
/* Zero kvs_test_wire_in and give entries 0..n-1 the keys kvs_test_wire_key(0..n-1). */
void kvs_test_wire_keyed_entries(uint32_t n);
/* Encode msg into kvs_test_wire_buf, asserting success; returns the length. */
size_t kvs_test_wire_encode_ok(const kvs_wire_msg *msg);
/* Decode a copy of bytes in an exact-size heap block into kvs_test_wire_decoded. *keep (if not NULL)
 * gets the copy, which the decoded pointers point into (the caller frees it); else it is freed. */
kvs_status kvs_test_wire_decode_copy(const void *bytes, size_t len, kvs_wire_msg *msg,
                                     kvs_wire_refusal *why, uint8_t **keep);
/* Encode msg and decode it back into *back, asserting version, type and request id; returns the heap
 * copy the decoded pointers live in (the caller frees it). */
uint8_t *kvs_test_wire_round_trip(const kvs_wire_msg *msg, kvs_wire_msg *back);

/* A raw message built with msgpack-c directly. */
typedef struct kvs_test_raw {
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
} kvs_test_raw;

/* Start a message: the 4-element array and its version, type and request id (the body is next). */
void kvs_test_raw_begin(kvs_test_raw *r, uint32_t version, uint32_t type, uint64_t request_id);
/* Append a bin of len bytes of `fill`. */
void kvs_test_raw_bin(kvs_test_raw *r, uint32_t len, uint8_t fill);
/* Decode the raw message (kvs_test_wire_decode_copy) and free its buffer. */
kvs_status kvs_test_raw_decode(kvs_test_raw *r, kvs_wire_msg *msg, kvs_wire_refusal *why);
/* Assert a decode was refused with want_st and want_code, and that the sentence holds needle. */
void kvs_test_wire_assert_refused(kvs_status st, const kvs_wire_refusal *why, kvs_status want_st,
                                  kvs_wire_error want_code, const char *needle);

#endif
