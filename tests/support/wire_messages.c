/* wire_messages.c - see wire_messages.h. */
#include "wire_messages.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

uint8_t kvs_test_wire_buf[KVS_WIRE_MAX_MESSAGE_BYTES + 64];
kvs_wire_entry kvs_test_wire_decoded[KVS_WIRE_MAX_KEYS];
kvs_wire_entry kvs_test_wire_in[KVS_WIRE_MAX_KEYS + 1];
static uint8_t key_bytes[(KVS_WIRE_MAX_KEYS + 1) * KVS_WIRE_KEY_BYTES];

kvs_key kvs_test_wire_key(uint32_t i) {
    kvs_key k;
    uint64_t a = i * 0x9E3779B97F4A7C15ull + 1, b = ~a * 0xBF58476D1CE4E5B9ull;
    memcpy(k.bytes, &a, 8);
    memcpy(k.bytes + 8, &b, 8);
    return k;
}

void kvs_test_wire_keyed_entries(uint32_t n) {
    memset(kvs_test_wire_in, 0, sizeof kvs_test_wire_in);
    for (uint32_t i = 0; i < n; i++) {
        kvs_key k = kvs_test_wire_key(i);
        memcpy(key_bytes + (size_t)i * 16, k.bytes, 16);
        kvs_test_wire_in[i].key = key_bytes + (size_t)i * 16;
    }
}

size_t kvs_test_wire_encode_ok(const kvs_wire_msg *msg) {
    size_t len = 0;
    kvs_wire_refusal why;
    kvs_status st = kvs_wire_encode(msg, kvs_test_wire_buf, sizeof kvs_test_wire_buf, &len, &why);
    ck_assert_msg(st == KVS_OK, "encode: %d %s", st, why.text);
    ck_assert_uint_gt(len, 0);
    return len;
}

kvs_status kvs_test_wire_decode_copy(const void *bytes, size_t len, kvs_wire_msg *msg,
                                     kvs_wire_refusal *why, uint8_t **keep) {
    uint8_t *copy = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, bytes, len);
    kvs_status st = kvs_wire_decode(copy, len, kvs_test_wire_decoded, KVS_WIRE_MAX_KEYS, msg, why);
    if (keep)
        *keep = copy;
    else
        free(copy);
    return st;
}

uint8_t *kvs_test_wire_round_trip(const kvs_wire_msg *msg, kvs_wire_msg *back) {
    size_t len = kvs_test_wire_encode_ok(msg);
    kvs_wire_refusal why;
    uint8_t *copy = NULL;
    kvs_status st = kvs_test_wire_decode_copy(kvs_test_wire_buf, len, back, &why, &copy);
    ck_assert_msg(st == KVS_OK, "decode: %d %s", st, why.text);
    ck_assert_uint_eq(back->version, KVS_WIRE_VERSION);
    ck_assert_uint_eq(back->type, msg->type);
    ck_assert_uint_eq(back->request_id, msg->request_id);
    return copy;
}

void kvs_test_raw_begin(kvs_test_raw *r, uint32_t version, uint32_t type, uint64_t request_id) {
    msgpack_sbuffer_init(&r->sbuf);
    msgpack_packer_init(&r->pk, &r->sbuf, msgpack_sbuffer_write);
    ck_assert_int_eq(msgpack_pack_array(&r->pk, 4), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r->pk, version), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r->pk, type), 0);
    ck_assert_int_eq(msgpack_pack_uint64(&r->pk, request_id), 0);
}

void kvs_test_raw_bin(kvs_test_raw *r, uint32_t len, uint8_t fill) {
    uint8_t *b = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(b);
    memset(b, fill, len);
    ck_assert_int_eq(msgpack_pack_bin(&r->pk, len), 0);
    ck_assert_int_eq(msgpack_pack_bin_body(&r->pk, b, len), 0);
    free(b);
}

kvs_status kvs_test_raw_decode(kvs_test_raw *r, kvs_wire_msg *msg, kvs_wire_refusal *why) {
    kvs_status st = kvs_test_wire_decode_copy(r->sbuf.data, r->sbuf.size, msg, why, NULL);
    msgpack_sbuffer_destroy(&r->sbuf);
    return st;
}

void kvs_test_wire_assert_refused(kvs_status st, const kvs_wire_refusal *why, kvs_status want_st,
                                  kvs_wire_error want_code, const char *needle) {
    ck_assert_msg(st == want_st, "status %d, wanted %d (%s)", st, want_st, why->text);
    ck_assert_msg(why->code == want_code, "code %s, wanted %s (%s)", kvs_wire_error_name(why->code),
                  kvs_wire_error_name(want_code), why->text);
    ck_assert_msg(strstr(why->text, needle) != NULL, "sentence \"%s\" lacks \"%s\"", why->text,
                  needle);
}
