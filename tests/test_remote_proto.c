/* test_remote_proto.c - the remote tier's plain-C foundation: wire protocol round trips and
 * refusals, the connect handshake, tenant keys, rendezvous hashing, and a bounded decoder fuzz. */
#include <check.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/ucx/auth.h"
#include "backends/ucx/hashring.h"
#include "backends/ucx/wire.h"
#include "tests/support/test_support.h"

static uint8_t out_buf[KVS_WIRE_MAX_MESSAGE_BYTES + 64];
static kvs_wire_entry entries[KVS_WIRE_MAX_KEYS];
static kvs_wire_entry in_entries[KVS_WIRE_MAX_KEYS + 1];
static uint8_t key_bytes[(KVS_WIRE_MAX_KEYS + 1) * KVS_WIRE_KEY_BYTES];

/* ---- helpers --------------------------------------------------------------------------------- */

static kvs_key key_of(uint32_t i) {
    kvs_key k;
    uint64_t a = i * 0x9E3779B97F4A7C15ull + 1, b = ~a * 0xBF58476D1CE4E5B9ull;
    memcpy(k.bytes, &a, 8);
    memcpy(k.bytes + 8, &b, 8);
    return k;
}

/* n entries whose keys are key_of(0..n) */
static void keyed_entries(uint32_t n) {
    memset(in_entries, 0, sizeof in_entries);
    for (uint32_t i = 0; i < n; i++) {
        kvs_key k = key_of(i);
        memcpy(key_bytes + (size_t)i * 16, k.bytes, 16);
        in_entries[i].key = key_bytes + (size_t)i * 16;
    }
}

static size_t encode_ok(const kvs_wire_msg *msg) {
    size_t len = 0;
    kvs_wire_refusal why;
    kvs_status st = kvs_wire_encode(msg, out_buf, sizeof out_buf, &len, &why);
    ck_assert_msg(st == KVS_OK, "encode: %d %s", st, why.text);
    ck_assert_uint_gt(len, 0);
    return len;
}

/* Decode a copy in an exact-size heap block, so any overread shows under ASan. */
static kvs_status decode_copy(const void *bytes, size_t len, kvs_wire_msg *msg,
                              kvs_wire_refusal *why, uint8_t **keep) {
    uint8_t *copy = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, bytes, len);
    kvs_status st = kvs_wire_decode(copy, len, entries, KVS_WIRE_MAX_KEYS, msg, why);
    if (keep)
        *keep = copy;
    else
        free(copy);
    return st;
}

/* Encode msg and decode it back into *back; returns the heap copy the decoded pointers live in. */
static uint8_t *round_trip(const kvs_wire_msg *msg, kvs_wire_msg *back) {
    size_t len = encode_ok(msg);
    kvs_wire_refusal why;
    uint8_t *copy = NULL;
    kvs_status st = decode_copy(out_buf, len, back, &why, &copy);
    ck_assert_msg(st == KVS_OK, "decode: %d %s", st, why.text);
    ck_assert_uint_eq(back->version, KVS_WIRE_VERSION);
    ck_assert_uint_eq(back->type, msg->type);
    ck_assert_uint_eq(back->request_id, msg->request_id);
    return copy;
}

/* Raw messages for the refusal tests, built with msgpack-c directly (the encoder refuses them). */
typedef struct raw {
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
} raw;

static void raw_begin(raw *r, uint32_t version, uint32_t type, uint64_t request_id) {
    msgpack_sbuffer_init(&r->sbuf);
    msgpack_packer_init(&r->pk, &r->sbuf, msgpack_sbuffer_write);
    msgpack_pack_array(&r->pk, 4);
    msgpack_pack_uint32(&r->pk, version);
    msgpack_pack_uint32(&r->pk, type);
    msgpack_pack_uint64(&r->pk, request_id);
}

static void raw_bin(raw *r, uint32_t len, uint8_t fill) {
    uint8_t *b = malloc(len ? len : 1);
    memset(b, fill, len);
    msgpack_pack_bin(&r->pk, len);
    msgpack_pack_bin_body(&r->pk, b, len);
    free(b);
}

static kvs_status raw_decode(raw *r, kvs_wire_msg *msg, kvs_wire_refusal *why) {
    kvs_status st = decode_copy(r->sbuf.data, r->sbuf.size, msg, why, NULL);
    msgpack_sbuffer_destroy(&r->sbuf);
    return st;
}

static void assert_refused(kvs_status st, const kvs_wire_refusal *why, kvs_status want_st,
                           kvs_wire_error want_code, const char *needle) {
    ck_assert_msg(st == want_st, "status %d, wanted %d (%s)", st, want_st, why->text);
    ck_assert_msg(why->code == want_code, "code %s, wanted %s (%s)", kvs_wire_error_name(why->code),
                  kvs_wire_error_name(want_code), why->text);
    ck_assert_msg(strstr(why->text, needle) != NULL, "sentence \"%s\" lacks \"%s\"", why->text,
                  needle);
}

/* ---- round trips ----------------------------------------------------------------------------- */

/* A node decodes every message into one entries array: an rkey PUT after an inline PUT must not keep
 * the earlier message's inline_data pointer (it pointed into a freed frame). */
START_TEST(decoding_into_reused_entries_leaves_no_field_of_the_last_message) {
    static uint8_t buf[4096], buf2[4096];
    static kvs_wire_entry in[1], out[KVS_WIRE_MAX_KEYS];
    uint8_t key[16] = {1}, data[8] = {9}, rkey[4] = {7, 7, 7, 7};
    kvs_wire_msg m, d;
    kvs_wire_refusal why;
    size_t len = 0, len2 = 0;
    kvs_wire_msg_init(&m, KVS_WIRE_PUT, 1);
    memset(in, 0, sizeof in);
    in[0].key = key;
    in[0].inline_data = data;
    in[0].length = sizeof data;
    m.entries = in;
    m.n_entries = 1;
    ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &len, &why), KVS_OK);
    memset(in, 0, sizeof in);
    in[0].key = key;
    in[0].length = 300000;
    in[0].remote_addr = 0x1000;
    in[0].rkey = rkey;
    in[0].rkey_len = sizeof rkey;
    ck_assert_int_eq(kvs_wire_encode(&m, buf2, sizeof buf2, &len2, &why), KVS_OK);
    ck_assert_int_eq(kvs_wire_decode(buf, len, out, KVS_WIRE_MAX_KEYS, &d, &why), KVS_OK);
    ck_assert_ptr_nonnull(out[0].inline_data);
    ck_assert_int_eq(kvs_wire_decode(buf2, len2, out, KVS_WIRE_MAX_KEYS, &d, &why), KVS_OK);
    ck_assert_ptr_null(out[0].inline_data);
    ck_assert_uint_eq(out[0].length, 300000);
    ck_assert_uint_eq(out[0].remote_addr, 0x1000);
}
END_TEST

START_TEST(hello_round_trips_tenant_and_nonce) {
    uint8_t nonce[32];
    for (int i = 0; i < 32; i++) nonce[i] = (uint8_t)(i * 3 + 1);
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_HELLO, 77);
    msg.tenant = "team-a.prod_1";
    msg.tenant_len = (uint32_t)strlen(msg.tenant);
    msg.nonce = nonce;
    uint8_t *copy = round_trip(&msg, &back);
    size_t len = encode_ok(&msg);
    ck_assert_uint_eq(back.tenant_len, 13);
    ck_assert_int_eq(memcmp(back.tenant, "team-a.prod_1", 13), 0);
    ck_assert_int_eq(memcmp(back.nonce, nonce, 32), 0);
    /* points into the input */
    ck_assert((uintptr_t)back.nonce >= (uintptr_t)copy &&
              (uintptr_t)back.nonce + 32 <= (uintptr_t)copy + len);
    free(copy);
}
END_TEST

START_TEST(challenge_auth_auth_ok_and_stats_round_trip) {
    uint8_t bytes[32];
    for (int i = 0; i < 32; i++) bytes[i] = (uint8_t)(255 - i);
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_CHALLENGE, 1);
    msg.challenge = bytes;
    msg.proof = bytes;
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.challenge, bytes, 32), 0);
    ck_assert_int_eq(memcmp(back.proof, bytes, 32), 0); /* the node's proof travels with it */
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH, 2);
    msg.proof = bytes;
    copy = round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.proof, bytes, 32), 0);
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 3);
    free(round_trip(&msg, &back));
    kvs_wire_msg_init(&msg, KVS_WIRE_STATS, UINT64_MAX);
    free(round_trip(&msg, &back));
    ck_assert_uint_eq(back.request_id, UINT64_MAX);
}
END_TEST

START_TEST(error_round_trips_code_and_sentence) {
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_ERROR, 9);
    msg.error_code = KVS_WIRE_ERR_AUTH;
    msg.error_text = "tenant \"x\" failed the handshake";
    msg.error_text_len = (uint32_t)strlen(msg.error_text);
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.error_code, KVS_WIRE_ERR_AUTH);
    ck_assert_uint_eq(back.error_text_len, msg.error_text_len);
    ck_assert_int_eq(memcmp(back.error_text, msg.error_text, msg.error_text_len), 0);
    free(copy);
    msg.error_text = NULL; /* no sentence at all */
    msg.error_text_len = 0;
    msg.error_code = KVS_WIRE_ERR_INTERNAL;
    copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.error_code, KVS_WIRE_ERR_INTERNAL);
    ck_assert_uint_eq(back.error_text_len, 0);
    free(copy);
}
END_TEST

START_TEST(lookup_and_delete_round_trip_keys_in_order) {
    uint32_t types[] = {KVS_WIRE_LOOKUP, KVS_WIRE_DELETE};
    for (int t = 0; t < 2; t++) {
        keyed_entries(KVS_WIRE_MAX_KEYS);
        kvs_wire_msg msg, back;
        kvs_wire_msg_init(&msg, types[t], 1000 + (uint64_t)t);
        msg.entries = in_entries;
        msg.n_entries = KVS_WIRE_MAX_KEYS;
        uint8_t *copy = round_trip(&msg, &back);
        ck_assert_uint_eq(back.n_entries, KVS_WIRE_MAX_KEYS);
        for (uint32_t i = 0; i < back.n_entries; i++) {
            kvs_key k = key_of(i);
            ck_assert_int_eq(memcmp(back.entries[i].key, k.bytes, 16), 0);
        }
        free(copy);
    }
}
END_TEST

START_TEST(lookup_reply_round_trips_presence_flags) {
    memset(in_entries, 0, sizeof in_entries);
    for (uint32_t i = 0; i < 37; i++) in_entries[i].present = (uint8_t)(i % 3 == 0);
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP_REPLY, 5);
    msg.entries = in_entries;
    msg.n_entries = 37;
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 37);
    for (uint32_t i = 0; i < 37; i++) ck_assert_uint_eq(back.entries[i].present, i % 3 == 0);
    free(copy);
}
END_TEST

START_TEST(get_round_trips_destination_descriptors) {
    uint8_t rkey_a[3] = {1, 2, 3}, rkey_b[KVS_WIRE_MAX_RKEY_BYTES];
    memset(rkey_b, 0x5a, sizeof rkey_b);
    keyed_entries(4);
    for (uint32_t i = 0; i < 4; i++) {
        in_entries[i].remote_addr = 0x7f0000000000ull + i * 4096;
        in_entries[i].length = i == 3 ? UINT64_MAX : 1000u * (i + 1);
        in_entries[i].rkey = i % 2 ? rkey_b : rkey_a;
        in_entries[i].rkey_len = i % 2 ? (uint32_t)sizeof rkey_b : 3;
    }
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET, 6);
    msg.entries = in_entries;
    msg.n_entries = 4;
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 4);
    for (uint32_t i = 0; i < 4; i++) {
        const kvs_wire_entry *e = &back.entries[i];
        ck_assert_int_eq(memcmp(e->key, in_entries[i].key, 16), 0);
        ck_assert_uint_eq(e->remote_addr, in_entries[i].remote_addr);
        ck_assert_uint_eq(e->length, in_entries[i].length);
        ck_assert_uint_eq(e->rkey_len, in_entries[i].rkey_len);
        ck_assert_int_eq(memcmp(e->rkey, in_entries[i].rkey, e->rkey_len), 0);
    }
    free(copy);
}
END_TEST

START_TEST(get_reply_round_trips_status_and_length) {
    memset(in_entries, 0, sizeof in_entries);
    in_entries[0].status = KVS_OK;
    in_entries[0].length = 65536;
    in_entries[1].status = KVS_ENOTFOUND;
    in_entries[2].status = KVS_EOVERFLOW;
    in_entries[2].length = 1ull << 40;
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET_REPLY, 6);
    msg.entries = in_entries;
    msg.n_entries = 3;
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 3);
    ck_assert_int_eq(back.entries[0].status, KVS_OK);
    ck_assert_uint_eq(back.entries[0].length, 65536);
    ck_assert_int_eq(back.entries[1].status, KVS_ENOTFOUND);
    ck_assert_int_eq(back.entries[2].status, KVS_EOVERFLOW);
    ck_assert_uint_eq(back.entries[2].length, 1ull << 40);
    free(copy);
}
END_TEST

START_TEST(put_round_trips_remote_and_inline_sources) {
    uint8_t rkey[40], small[KVS_WIRE_MAX_INLINE_BYTES];
    for (size_t i = 0; i < sizeof rkey; i++) rkey[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof small; i++) small[i] = (uint8_t)(i * 7);
    keyed_entries(3);
    in_entries[0].length = 1 << 20;
    in_entries[0].remote_addr = 0x1000;
    in_entries[0].rkey = rkey;
    in_entries[0].rkey_len = sizeof rkey;
    in_entries[1].inline_data = small;
    in_entries[1].length = sizeof small;
    in_entries[2].inline_data = small;
    in_entries[2].length = 0; /* an empty object is legal */
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_PUT, 8);
    msg.entries = in_entries;
    msg.n_entries = 3;
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 3);
    ck_assert_ptr_null(back.entries[0].inline_data);
    ck_assert_uint_eq(back.entries[0].length, 1 << 20);
    ck_assert_uint_eq(back.entries[0].remote_addr, 0x1000);
    ck_assert_uint_eq(back.entries[0].rkey_len, sizeof rkey);
    ck_assert_int_eq(memcmp(back.entries[0].rkey, rkey, sizeof rkey), 0);
    ck_assert_ptr_nonnull(back.entries[1].inline_data);
    ck_assert_uint_eq(back.entries[1].length, sizeof small);
    ck_assert_int_eq(memcmp(back.entries[1].inline_data, small, sizeof small), 0);
    ck_assert_ptr_null(back.entries[1].rkey);
    ck_assert_uint_eq(back.entries[2].length, 0);
    ck_assert_int_eq(memcmp(back.entries[2].key, in_entries[2].key, 16), 0);
    free(copy);
}
END_TEST

START_TEST(put_reply_and_delete_reply_round_trip_statuses) {
    uint32_t types[] = {KVS_WIRE_PUT_REPLY, KVS_WIRE_DELETE_REPLY};
    for (int t = 0; t < 2; t++) {
        memset(in_entries, 0, sizeof in_entries);
        for (uint32_t i = 0; i < 12; i++) in_entries[i].status = -(int32_t)i;
        kvs_wire_msg msg, back;
        kvs_wire_msg_init(&msg, types[t], 4);
        msg.entries = in_entries;
        msg.n_entries = 12;
        uint8_t *copy = round_trip(&msg, &back);
        ck_assert_uint_eq(back.n_entries, 12);
        for (uint32_t i = 0; i < 12; i++) ck_assert_int_eq(back.entries[i].status, -(int32_t)i);
        free(copy);
    }
}
END_TEST

START_TEST(stats_reply_round_trips_counters) {
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_STATS_REPLY, 11);
    for (uint32_t i = 0; i < KVS_WIRE_STATS_COUNT; i++)
        msg.counters[i] = (uint64_t)i << ((i * 7) % 64);
    msg.counters[KVS_WIRE_STAT_CAPACITY_BYTES] = UINT64_MAX;
    uint8_t *copy = round_trip(&msg, &back);
    for (uint32_t i = 0; i < KVS_WIRE_STATS_COUNT; i++)
        ck_assert_uint_eq(back.counters[i], msg.counters[i]);
    free(copy);
}
END_TEST

START_TEST(encode_reports_the_needed_size_and_writes_nothing_past_a_short_buffer) {
    keyed_entries(10);
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 1);
    msg.entries = in_entries;
    msg.n_entries = 10;
    size_t need = 0;
    ck_assert_int_eq(kvs_wire_encode(&msg, NULL, 0, &need, NULL), KVS_EOVERFLOW);
    ck_assert_uint_gt(need, 160); /* 10 keys of 16 bytes plus framing */
    uint8_t small[64];
    memset(small, 0xee, sizeof small);
    size_t len = 0;
    ck_assert_int_eq(kvs_wire_encode(&msg, small, 32, &len, NULL), KVS_EOVERFLOW);
    ck_assert_uint_eq(len, need);
    for (size_t i = 32; i < sizeof small; i++) ck_assert_uint_eq(small[i], 0xee);
    uint8_t *exact = malloc(need);
    ck_assert_int_eq(kvs_wire_encode(&msg, exact, need, &len, NULL), KVS_OK);
    ck_assert_uint_eq(len, need);
    kvs_wire_msg back;
    ck_assert_int_eq(kvs_wire_decode(exact, len, entries, KVS_WIRE_MAX_KEYS, &back, NULL), KVS_OK);
    ck_assert_uint_eq(back.n_entries, 10);
    free(exact);
}
END_TEST

/* ---- limits: one each ------------------------------------------------------------------------ */

START_TEST(a_batch_over_the_key_limit_is_refused) {
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_LOOKUP, 1);
    msgpack_pack_array(&r.pk, 1);
    raw_bin(&r, (KVS_WIRE_MAX_KEYS + 1) * KVS_WIRE_KEY_BYTES, 1);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "over the limit");
    /* and the encoder will not write one */
    keyed_entries(KVS_WIRE_MAX_KEYS + 1);
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 1);
    msg.entries = in_entries;
    msg.n_entries = KVS_WIRE_MAX_KEYS + 1;
    size_t len;
    ck_assert_int_eq(kvs_wire_encode(&msg, out_buf, sizeof out_buf, &len, &why), KVS_EINVAL);
    ck_assert_int_eq(why.code, KVS_WIRE_ERR_LIMIT);
}
END_TEST

START_TEST(a_per_key_array_declaring_four_billion_entries_is_refused_before_reading_them) {
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_PUT_REPLY, 1);
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_array(&r.pk, UINT32_MAX); /* five bytes, no elements */
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "4294967295 elements");
}
END_TEST

START_TEST(auth_with_a_worker_address_and_auth_ok_with_transports_round_trip) {
    uint8_t proof[KVS_WIRE_PROOF_BYTES], host[32], addr[300];
    memset(proof, 3, sizeof proof);
    memset(host, 4, sizeof host);
    for (size_t i = 0; i < sizeof addr; i++) addr[i] = (uint8_t)i;
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH, 5);
    msg.proof = proof;
    msg.host_id = host;
    msg.host_id_len = sizeof host;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    msg.pid = 4242;
    uint8_t *copy = round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.proof, proof, sizeof proof), 0);
    ck_assert_uint_eq(back.host_id_len, sizeof host);
    ck_assert_int_eq(memcmp(back.host_id, host, sizeof host), 0);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.worker_addr, addr, sizeof addr), 0);
    ck_assert_uint_eq(back.pid, 4242);
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 6);
    msg.transports = "sysv+posix+cma";
    msg.transports_len = 14;
    copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.transports_len, 14);
    ck_assert_int_eq(memcmp(back.transports, "sysv+posix+cma", 14), 0);
    free(copy);
    /* version 2: a worker address alone (every client sends one), and AUTH_OK with the node's worker
     * address and the session token */
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH, 8);
    msg.proof = proof;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.worker_addr, addr, sizeof addr), 0);
    ck_assert_uint_eq(back.host_id_len, 0);
    free(copy);
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES];
    memset(token, 0x3c, sizeof token);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 9);
    msg.transports = "tcp";
    msg.transports_len = 3;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    msg.session_token = token;
    copy = round_trip(&msg, &back);
    ck_assert_uint_eq(back.transports_len, 3);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.session_token, token, sizeof token), 0);
    free(copy);
    /* a host id without a worker address or without a pid, or an AUTH_OK address without a token, is
     * not encoded */
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH, 7);
    msg.proof = proof;
    msg.host_id = host;
    msg.host_id_len = sizeof host;
    msg.pid = 1;
    size_t len = 0;
    kvs_wire_refusal why;
    uint8_t buf[1024];
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    msg.pid = 0;
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 7);
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
}
END_TEST

START_TEST(an_auth_with_a_bad_address_group_is_refused) {
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    raw r;
    /* three fields: the pid is missing */
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    msgpack_pack_array(&r.pk, 3);
    raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    raw_bin(&r, 32, 2);
    raw_bin(&r, 100, 3);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_TYPE,
                   "has 3 fields");
    /* a worker address over the limit, refused before its bytes are read */
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    msgpack_pack_array(&r.pk, 4);
    raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    raw_bin(&r, 32, 2);
    raw_bin(&r, KVS_WIRE_MAX_WORKER_ADDR_BYTES + 1, 3);
    msgpack_pack_uint32(&r.pk, 7);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "the worker address");
    /* a host id over the limit */
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    msgpack_pack_array(&r.pk, 4);
    raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    raw_bin(&r, KVS_WIRE_MAX_HOST_ID_BYTES + 1, 2);
    raw_bin(&r, 100, 3);
    msgpack_pack_uint32(&r.pk, 7);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT, "the host id");
    /* pid 0 and a pid over INT32_MAX */
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    msgpack_pack_array(&r.pk, 4);
    raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    raw_bin(&r, 32, 2);
    raw_bin(&r, 100, 3);
    msgpack_pack_uint32(&r.pk, 0);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_VALUE, "pid 0");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    msgpack_pack_array(&r.pk, 4);
    raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    raw_bin(&r, 32, 2);
    raw_bin(&r, 100, 3);
    msgpack_pack_uint64(&r.pk, 1ull << 40);
    kvs_status st = raw_decode(&r, &msg, &why);
    ck_assert_int_ne(st, KVS_OK);
    /* a transports text over the limit in AUTH_OK */
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH_OK, 1);
    msgpack_pack_array(&r.pk, 1);
    char text[KVS_WIRE_MAX_TRANSPORTS_TEXT + 1];
    memset(text, 'a', sizeof text);
    msgpack_pack_str(&r.pk, sizeof text);
    msgpack_pack_str_body(&r.pk, text, sizeof text);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "the transports");
}
END_TEST

START_TEST(an_rkey_over_the_limit_is_refused) {
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_GET, 1);
    msgpack_pack_array(&r.pk, 2);
    raw_bin(&r, 16, 1);
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_uint64(&r.pk, 4096);
    msgpack_pack_uint64(&r.pk, 4096);
    raw_bin(&r, KVS_WIRE_MAX_RKEY_BYTES + 1, 2);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "an rkey of 513 bytes");
}
END_TEST

START_TEST(an_inline_payload_over_the_limit_is_refused) {
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_PUT, 1);
    msgpack_pack_array(&r.pk, 2);
    raw_bin(&r, 16, 1);
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_array(&r.pk, 1);
    raw_bin(&r, KVS_WIRE_MAX_INLINE_BYTES + 1, 3);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "inline data of 4097");
}
END_TEST

START_TEST(a_tenant_name_over_the_limit_is_refused) {
    char name[KVS_WIRE_MAX_TENANT_BYTES + 1];
    memset(name, 'a', sizeof name);
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_HELLO, 1);
    msgpack_pack_array(&r.pk, 2);
    msgpack_pack_str(&r.pk, sizeof name);
    msgpack_pack_str_body(&r.pk, name, sizeof name);
    raw_bin(&r, 32, 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "tenant name of 65 bytes");
}
END_TEST

START_TEST(an_error_text_over_the_limit_is_refused) {
    char text[KVS_WIRE_MAX_ERROR_TEXT + 1];
    memset(text, 'e', sizeof text);
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_ERROR, 1);
    msgpack_pack_array(&r.pk, 2);
    msgpack_pack_uint32(&r.pk, 3);
    msgpack_pack_str(&r.pk, sizeof text);
    msgpack_pack_str_body(&r.pk, text, sizeof text);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EINVAL, KVS_WIRE_ERR_LIMIT,
                   "error text of 257");
}
END_TEST

START_TEST(a_message_over_the_size_limit_is_refused_as_too_large) {
    size_t len = KVS_WIRE_MAX_MESSAGE_BYTES + 1;
    uint8_t *big = calloc(1, len);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_status st = kvs_wire_decode(big, len, entries, KVS_WIRE_MAX_KEYS, &msg, &why);
    assert_refused(st, &why, KVS_EINVAL, KVS_WIRE_ERR_TOO_LARGE, "over the limit");
    free(big);
    /* an encodable-looking PUT whose inline objects add up past the limit is refused by the encoder */
    static uint8_t payload[KVS_WIRE_MAX_INLINE_BYTES];
    keyed_entries(300);
    for (uint32_t i = 0; i < 300; i++) {
        in_entries[i].inline_data = payload;
        in_entries[i].length = sizeof payload;
    }
    kvs_wire_msg_init(&msg, KVS_WIRE_PUT, 1);
    msg.entries = in_entries;
    msg.n_entries = 300;
    size_t need;
    ck_assert_int_eq(kvs_wire_encode(&msg, out_buf, sizeof out_buf, &need, &why), KVS_EINVAL);
    ck_assert_int_eq(why.code, KVS_WIRE_ERR_TOO_LARGE);
    ck_assert_uint_gt(need, KVS_WIRE_MAX_MESSAGE_BYTES);
}
END_TEST

/* ---- refusal classes ------------------------------------------------------------------------- */

START_TEST(every_truncation_of_a_valid_message_is_refused_as_truncated) {
    uint8_t rkey[20] = {9};
    keyed_entries(5);
    for (uint32_t i = 0; i < 5; i++) {
        in_entries[i].remote_addr = 1ull << 40;
        in_entries[i].length = 300;
        in_entries[i].rkey = rkey;
        in_entries[i].rkey_len = sizeof rkey;
    }
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET, 42);
    msg.entries = in_entries;
    msg.n_entries = 5;
    size_t len = encode_ok(&msg);
    for (size_t cut = 0; cut < len; cut++) {
        kvs_wire_refusal why;
        kvs_status st = decode_copy(out_buf, cut, &msg, &why, NULL);
        ck_assert_msg(st == KVS_ECORRUPT && why.code == KVS_WIRE_ERR_TRUNCATED, "cut at %zu: %d %s",
                      cut, st, why.text);
    }
}
END_TEST

START_TEST(a_wrong_typed_field_is_refused) {
    raw r; /* the request id as a string */
    msgpack_sbuffer_init(&r.sbuf);
    msgpack_packer_init(&r.pk, &r.sbuf, msgpack_sbuffer_write);
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint32(&r.pk, KVS_WIRE_VERSION);
    msgpack_pack_uint32(&r.pk, KVS_WIRE_STATS);
    msgpack_pack_str(&r.pk, 2);
    msgpack_pack_str_body(&r.pk, "42", 2);
    msgpack_pack_array(&r.pk, 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_TYPE,
                   "the request id");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_LOOKUP, 1); /* keys as a string instead of binary */
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_str(&r.pk, 16);
    msgpack_pack_str_body(&r.pk, "0123456789abcdef", 16);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_TYPE,
                   "should be binary");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH_OK, 1); /* a body that is a map */
    msgpack_pack_map(&r.pk, 0);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_TYPE, "an array");
}
END_TEST

START_TEST(trailing_bytes_after_a_message_are_refused) {
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_STATS, 3);
    size_t len = encode_ok(&msg);
    out_buf[len] = 0xc0; /* msgpack nil */
    kvs_wire_refusal why;
    assert_refused(decode_copy(out_buf, len + 1, &msg, &why, NULL), &why, KVS_ECORRUPT,
                   KVS_WIRE_ERR_TRAILING, "1 stray bytes");
    ck_assert_int_eq(decode_copy(out_buf, len, &msg, &why, NULL), KVS_OK);
}
END_TEST

START_TEST(an_unknown_version_is_refused_and_answered_with_an_error_reply) {
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 0xabcdef);
    msg.version = KVS_WIRE_VERSION + 1;
    keyed_entries(2);
    msg.entries = in_entries;
    msg.n_entries = 2;
    size_t len = encode_ok(&msg);
    kvs_wire_refusal why;
    assert_refused(decode_copy(out_buf, len, &msg, &why, NULL), &why, KVS_EVERSION,
                   KVS_WIRE_ERR_VERSION, "version 3");
    ck_assert_int_eq(why.have_request_id, 1);
    ck_assert_uint_eq(why.request_id, 0xabcdef);
    /* a newer header with more fields still gets a version error, not a shape error */
    raw r;
    msgpack_sbuffer_init(&r.sbuf);
    msgpack_packer_init(&r.pk, &r.sbuf, msgpack_sbuffer_write);
    msgpack_pack_array(&r.pk, 6);
    msgpack_pack_uint32(&r.pk, 7);
    msgpack_pack_uint32(&r.pk, 99);
    msgpack_pack_uint64(&r.pk, 5);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_EVERSION, KVS_WIRE_ERR_VERSION,
                   "version 7");
    ck_assert_uint_eq(why.request_id, 5);
    /* the node's reply */
    uint8_t reply[512];
    size_t reply_len;
    ck_assert_int_eq(kvs_wire_encode_refusal(&why, reply, sizeof reply, &reply_len), KVS_OK);
    kvs_wire_msg back;
    uint8_t *copy = NULL;
    ck_assert_int_eq(decode_copy(reply, reply_len, &back, NULL, &copy), KVS_OK);
    ck_assert_uint_eq(back.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(back.version, KVS_WIRE_VERSION);
    ck_assert_uint_eq(back.request_id, 5);
    ck_assert_uint_eq(back.error_code, KVS_WIRE_ERR_VERSION);
    ck_assert_uint_eq(back.error_text_len, strlen(why.text));
    ck_assert_int_eq(memcmp(back.error_text, why.text, back.error_text_len), 0);
    free(copy);
}
END_TEST

START_TEST(an_unknown_message_type_is_refused) {
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, 99, 8);
    msgpack_pack_array(&r.pk, 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_UNKNOWN_TYPE,
                   "type 99");
    ck_assert_uint_eq(why.request_id, 8);
}
END_TEST

START_TEST(impossible_values_are_refused) {
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    raw r;
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_LOOKUP_REPLY, 1); /* a presence flag of 2 */
    msgpack_pack_array(&r.pk, 1);
    raw_bin(&r, 3, 2);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_VALUE,
                   "not 0 or 1");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_DELETE, 1); /* 17 bytes of keys */
    msgpack_pack_array(&r.pk, 1);
    raw_bin(&r, 17, 0);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_VALUE,
                   "not a multiple of 16");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_PUT, 1); /* two keys, one descriptor */
    msgpack_pack_array(&r.pk, 2);
    raw_bin(&r, 32, 0);
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_array(&r.pk, 1);
    raw_bin(&r, 4, 0);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_VALUE,
                   "2 keys but 1");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_HELLO, 1); /* a tenant with a slash, a short nonce */
    msgpack_pack_array(&r.pk, 2);
    msgpack_pack_str(&r.pk, 3);
    msgpack_pack_str_body(&r.pk, "a/b", 3);
    raw_bin(&r, 32, 0);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_VALUE,
                   "tenant name");
    raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    msgpack_pack_array(&r.pk, 1);
    raw_bin(&r, 31, 0);
    assert_refused(raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT, KVS_WIRE_ERR_VALUE,
                   "31 bytes, 32 expected");
}
END_TEST

START_TEST(more_entries_than_the_caller_has_room_for_is_an_overflow) {
    keyed_entries(8);
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 1);
    msg.entries = in_entries;
    msg.n_entries = 8;
    size_t len = encode_ok(&msg);
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_decode(out_buf, len, entries, 7, &back, &why), KVS_EOVERFLOW);
    ck_assert_int_eq(kvs_wire_decode(out_buf, len, entries, 8, &back, &why), KVS_OK);
}
END_TEST

/* ---- handshake ------------------------------------------------------------------------------- */

static const uint8_t test_psk_bytes[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                           11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                           22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

static void psk_of(kvs_remote_psk *psk, uint8_t tweak) {
    uint8_t bytes[32];
    memcpy(bytes, test_psk_bytes, 32);
    bytes[31] ^= tweak;
    ck_assert_int_eq(kvs_remote_psk_set(psk, bytes, sizeof bytes, NULL, 0), KVS_OK);
}

/* One connection: HELLO through the wire, the node's challenge, the client's proof with client_psk. */
typedef struct conn {
    kvs_remote_auth_node node;
    uint8_t nonce[32];
    uint8_t challenge[32];
    uint8_t proof[32];
} conn;

static void conn_hello(conn *c, const char *tenant) {
    memset(c, 0, sizeof *c);
    ck_assert_int_eq(kvs_remote_random(c->nonce, sizeof c->nonce), KVS_OK);
    kvs_wire_msg hello, back;
    kvs_wire_msg_init(&hello, KVS_WIRE_HELLO, 1);
    hello.tenant = tenant;
    hello.tenant_len = (uint32_t)strlen(tenant);
    hello.nonce = c->nonce;
    uint8_t *copy = round_trip(&hello, &back);
    const uint8_t *challenge = NULL;
    char error[200];
    ck_assert_int_eq(kvs_remote_auth_node_hello(&c->node, &back, &challenge, error, sizeof error),
                     KVS_OK);
    free(copy);
    memcpy(c->challenge, challenge, 32);
}

START_TEST(the_proof_matches_a_known_answer) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    uint8_t challenge[32], nonce[32], proof[32];
    for (int i = 0; i < 32; i++) {
        challenge[i] = (uint8_t)(0xa0 + i % 16);
        nonce[i] = (uint8_t)(7 * i);
    }
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, challenge, nonce, "tenant-a", 8, proof), KVS_OK);
    /* HMAC-SHA256 computed independently (Python's hmac module) */
    static const uint8_t want[32] = {0x35, 0x3f, 0xb8, 0xb2, 0x4a, 0x09, 0x2e, 0x18,
                                     0xc1, 0xdb, 0xac, 0x78, 0xee, 0x5d, 0x06, 0x5f,
                                     0xf4, 0xb7, 0x45, 0x88, 0x78, 0xae, 0xb4, 0xe5,
                                     0xec, 0x97, 0xbf, 0x3b, 0x84, 0x5f, 0x1a, 0x5b};
    ck_assert_int_eq(memcmp(proof, want, 32), 0);
}
END_TEST

START_TEST(the_right_key_is_accepted) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn c;
    conn_hello(&c, "tenant-a");
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "tenant-a", 8, c.proof),
                     KVS_OK);
    char error[200] = "";
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, c.proof, 32, error, sizeof error),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 1);
}
END_TEST

START_TEST(a_wrong_key_is_refused) {
    kvs_remote_psk node_psk, client_psk;
    psk_of(&node_psk, 0);
    psk_of(&client_psk, 1); /* one bit off */
    conn c;
    conn_hello(&c, "tenant-a");
    ck_assert_int_eq(
        kvs_remote_auth_proof(&client_psk, c.challenge, c.nonce, "tenant-a", 8, c.proof), KVS_OK);
    char error[200] = "";
    ck_assert_int_eq(
        kvs_remote_auth_node_check(&c.node, &node_psk, c.proof, 32, error, sizeof error),
        KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(error, "tenant \"tenant-a\" failed the handshake"));
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
}
END_TEST

START_TEST(a_proof_for_another_tenant_is_refused) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn c;
    conn_hello(&c, "tenant-a");
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "tenant-b", 8, c.proof),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, c.proof, 32, NULL, 0), KVS_EINVAL);
}
END_TEST

START_TEST(an_empty_or_missing_proof_is_refused) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    size_t lens[] = {0, 0, 31, 33};
    for (int i = 0; i < 4; i++) {
        conn c;
        conn_hello(&c, "t");
        ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "t", 1, c.proof),
                         KVS_OK);
        uint8_t padded[33] = {0};
        memcpy(padded, c.proof, 32);
        char error[200] = "";
        const uint8_t *proof = i == 0 ? NULL : padded;
        ck_assert_int_eq(
            kvs_remote_auth_node_check(&c.node, &psk, proof, lens[i], error, sizeof error),
            KVS_EINVAL);
        ck_assert_ptr_nonnull(strstr(error, "32 expected"));
        ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    }
    /* an all-zero proof of the right length is refused too */
    conn c;
    conn_hello(&c, "t");
    uint8_t zero[32] = {0};
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, zero, 32, NULL, 0), KVS_EINVAL);
}
END_TEST

START_TEST(a_replayed_proof_fails_on_a_new_connection) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn first;
    conn_hello(&first, "tenant-a");
    ck_assert_int_eq(
        kvs_remote_auth_proof(&psk, first.challenge, first.nonce, "tenant-a", 8, first.proof),
        KVS_OK);
    kvs_wire_msg auth;
    kvs_wire_msg_init(&auth, KVS_WIRE_AUTH, 2);
    auth.proof = first.proof;
    size_t recorded_len = encode_ok(&auth);
    uint8_t recorded[128];
    memcpy(recorded, out_buf, recorded_len);
    ck_assert_int_eq(kvs_remote_auth_node_check(&first.node, &psk, first.proof, 32, NULL, 0),
                     KVS_OK);

    /* the attacker replays the same HELLO (same nonce) and the recorded AUTH */
    conn second;
    memset(&second, 0, sizeof second);
    kvs_wire_msg hello;
    kvs_wire_msg_init(&hello, KVS_WIRE_HELLO, 1);
    hello.tenant = "tenant-a";
    hello.tenant_len = 8;
    hello.nonce = first.nonce;
    const uint8_t *challenge = NULL;
    ck_assert_int_eq(kvs_remote_auth_node_hello(&second.node, &hello, &challenge, NULL, 0), KVS_OK);
    ck_assert_int_ne(memcmp(challenge, first.challenge, 32), 0); /* fresh */
    kvs_wire_msg replayed;
    ck_assert_int_eq(decode_copy(recorded, recorded_len, &replayed, NULL, NULL), KVS_OK);
    char error[200] = "";
    ck_assert_int_eq(
        kvs_remote_auth_node_check(&second.node, &psk, first.proof, 32, error, sizeof error),
        KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&second.node), 0);
}
END_TEST

START_TEST(a_challenge_answers_one_auth_only) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn c;
    conn_hello(&c, "tenant-a");
    uint8_t wrong[32] = {1};
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, wrong, 32, NULL, 0), KVS_EINVAL);
    /* the right proof after a wrong guess is too late: no guessing loop on one challenge */
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "tenant-a", 8, c.proof),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, c.proof, 32, NULL, 0), KVS_ESTATE);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    /* and an AUTH before any HELLO is refused */
    kvs_remote_auth_node fresh;
    memset(&fresh, 0, sizeof fresh);
    ck_assert_int_eq(kvs_remote_auth_node_check(&fresh, &psk, c.proof, 32, NULL, 0), KVS_ESTATE);
}
END_TEST

START_TEST(key_files_must_be_private_and_long_enough) {
    char dir[256], path[512], error[300];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    const char *key_text = "0123456789abcdef0123456789abcdef\n"; /* 33 bytes, newline included */
    ck_assert_int_eq(kvs_test_write_file(dir, "good.key", key_text, path, sizeof path), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    kvs_remote_psk psk;
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_OK);
    ck_assert_uint_eq(psk.len, 33);
    ck_assert_int_eq(memcmp(psk.bytes, key_text, 33), 0);
    kvs_remote_psk_clear(&psk);
    ck_assert_uint_eq(psk.len, 0);
    ck_assert_uint_eq(psk.bytes[0], 0);

    mode_t bad_modes[] = {0640, 0604, 0620, 0660, 0644};
    for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++) {
        ck_assert_int_eq(chmod(path, bad_modes[i]), 0);
        error[0] = '\0';
        ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_EINVAL);
        ck_assert_msg(strstr(error, "must not be open to group or others"), "%s", error);
        ck_assert_uint_eq(psk.len, 0);
    }
    ck_assert_int_eq(chmod(path, 0400), 0);
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_OK);

    ck_assert_int_eq(
        kvs_test_write_file(dir, "short.key", "only-31-bytes-of-key-material!!", path, sizeof path),
        0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_EINVAL);
    ck_assert_msg(strstr(error, "holds 31 bytes"), "%s", error);

    char link_path[600];
    snprintf(link_path, sizeof link_path, "%s/link.key", dir);
    char target[600];
    snprintf(target, sizeof target, "%s/good.key", dir);
    ck_assert_int_eq(symlink(target, link_path), 0);
    ck_assert_int_eq(kvs_remote_psk_load(link_path, &psk, error, sizeof error), KVS_EIO);

    snprintf(path, sizeof path, "%s/missing.key", dir);
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_EIO);
    ck_assert_msg(strstr(error, "missing.key cannot be opened"), "%s", error);
    ck_assert_int_eq(kvs_remote_psk_load(dir, &psk, error, sizeof error),
                     KVS_EINVAL); /* a directory */
    kvs_test_rmtree(dir);
}
END_TEST

/* ---- tenant keys ----------------------------------------------------------------------------- */

static int compare_keys(const void *a, const void *b) {
    return memcmp(a, b, sizeof(kvs_key));
}

START_TEST(tenant_keys_are_deterministic_and_differ_across_tenants) {
    kvs_key key, a1, a2, b, a_other;
    for (int i = 0; i < 16; i++) key.bytes[i] = (uint8_t)i;
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &key, &a1), KVS_OK);
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &key, &a2), KVS_OK);
    ck_assert_int_eq(memcmp(a1.bytes, a2.bytes, 16), 0);
    /* SHA-256 computed independently (Python's hashlib) */
    static const uint8_t want[16] = {0x63, 0xc0, 0xe0, 0x26, 0x2c, 0xf8, 0xbc, 0x27,
                                     0x77, 0xdd, 0x73, 0xe7, 0x86, 0x8e, 0xa6, 0x04};
    ck_assert_int_eq(memcmp(a1.bytes, want, 16), 0);
    /* the hasher a node keeps per connection gives the same keys, key after key */
    kvs_remote_tenant_hasher *h = kvs_remote_tenant_hasher_new("tenant-a", 8);
    ck_assert_ptr_nonnull(h);
    for (int round = 0; round < 3; round++) {
        kvs_key via;
        ck_assert_int_eq(kvs_remote_tenant_hasher_key(h, &key, &via), KVS_OK);
        ck_assert_int_eq(memcmp(via.bytes, want, 16), 0);
        kvs_key other = key, direct;
        other.bytes[round] ^= 0x5a;
        ck_assert_int_eq(kvs_remote_tenant_hasher_key(h, &other, &via), KVS_OK);
        ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &other, &direct), KVS_OK);
        ck_assert_int_eq(memcmp(via.bytes, direct.bytes, 16), 0);
    }
    kvs_remote_tenant_hasher_free(h);
    ck_assert_ptr_null(kvs_remote_tenant_hasher_new("", 0));
    ck_assert_ptr_null(kvs_remote_tenant_hasher_new("x", KVS_WIRE_MAX_TENANT_BYTES + 1));
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-b", 8, &key, &b), KVS_OK);
    ck_assert_int_ne(memcmp(a1.bytes, b.bytes, 16), 0);
    ck_assert_int_ne(memcmp(a1.bytes, key.bytes, 16), 0);
    key.bytes[15] ^= 1;
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &key, &a_other), KVS_OK);
    ck_assert_int_ne(memcmp(a1.bytes, a_other.bytes, 16), 0);
    /* many tenants over many keys: no two stored keys collide */
    enum { TENANTS = 20, KEYS = 200 };
    static kvs_key seen[TENANTS * KEYS];
    for (int t = 0; t < TENANTS; t++) {
        char name[16];
        int n = snprintf(name, sizeof name, "t%d", t);
        for (uint32_t k = 0; k < KEYS; k++) {
            kvs_key in = key_of(k);
            ck_assert_int_eq(kvs_remote_tenant_key(name, (size_t)n, &in, &seen[t * KEYS + (int)k]),
                             KVS_OK);
        }
    }
    qsort(seen, TENANTS * KEYS, sizeof seen[0], compare_keys);
    for (int i = 1; i < TENANTS * KEYS; i++)
        ck_assert_int_ne(memcmp(seen[i - 1].bytes, seen[i].bytes, 16), 0);
    ck_assert_int_eq(kvs_remote_tenant_key("", 0, &key, &b), KVS_EINVAL);
}
END_TEST

/* ---- rendezvous hashing ---------------------------------------------------------------------- */

static void ring_of(kvs_remote_ring *ring, uint32_t n, uint32_t first) {
    kvs_remote_ring_init(ring);
    for (uint32_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "node-%u:13337", first + i);
        ck_assert_int_eq(kvs_remote_ring_add(ring, id), KVS_OK);
    }
}

static const char *primary(const kvs_remote_ring *ring, uint32_t k) {
    kvs_key key = key_of(k);
    uint32_t out[1], n;
    ck_assert_int_eq(kvs_remote_ring_homes(ring, &key, 1, out, &n), KVS_OK);
    ck_assert_uint_eq(n, 1);
    return ring->nodes[out[0]].id;
}

START_TEST(homes_are_distinct_ordered_and_independent_of_insertion_order) {
    kvs_remote_ring fwd, rev;
    ring_of(&fwd, 6, 0);
    kvs_remote_ring_init(&rev);
    for (int i = 5; i >= 0; i--) {
        char id[32];
        snprintf(id, sizeof id, "node-%d:13337", i);
        ck_assert_int_eq(kvs_remote_ring_add(&rev, id), KVS_OK);
    }
    for (uint32_t k = 0; k < 2000; k++) {
        kvs_key key = key_of(k);
        uint32_t a[3], b[3], all[6], na, nb, nall;
        ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 3, a, &na), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&rev, &key, 3, b, &nb), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 6, all, &nall), KVS_OK);
        ck_assert_uint_eq(na, 3);
        ck_assert_uint_eq(nall, 6);
        for (int i = 0; i < 3; i++) {
            ck_assert_str_eq(fwd.nodes[a[i]].id, rev.nodes[b[i]].id);
            ck_assert_uint_eq(a[i], all[i]); /* the top 3 are the prefix of the full order */
            for (int j = 0; j < i; j++) ck_assert_uint_ne(a[i], a[j]);
        }
    }
    uint32_t out[8], n;
    kvs_key key = key_of(1);
    ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 8, out, &n), KVS_OK);
    ck_assert_uint_eq(n, 6); /* fewer nodes than asked for */
    ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 0, out, &n), KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, KVS_REMOTE_RING_MAX_REPLICAS + 1, out, &n),
                     KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_ring_add(&fwd, "node-1:13337"), KVS_EINVAL); /* duplicate */
    ck_assert_int_eq(kvs_remote_ring_add(&fwd, ""), KVS_EINVAL);
}
END_TEST

#define SPREAD_KEYS 100000u

START_TEST(keys_spread_evenly_over_nodes) {
    kvs_remote_ring ring;
    ring_of(&ring, 10, 0);
    uint32_t count[10] = {0};
    for (uint32_t k = 0; k < SPREAD_KEYS; k++) {
        kvs_key key = key_of(k);
        uint32_t out[1], n;
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 1, out, &n), KVS_OK);
        count[out[0]]++;
    }
    for (int i = 0; i < 10; i++) /* 10000 expected, sd ~95 */
        ck_assert_msg(count[i] > 9400 && count[i] < 10600, "node %d holds %u of %u keys", i,
                      count[i], SPREAD_KEYS);
}
END_TEST

START_TEST(adding_a_node_moves_about_one_key_in_n_and_only_onto_it) {
    kvs_remote_ring before, after;
    ring_of(&before, 10, 0);
    ring_of(&after, 11, 0);
    uint32_t moved = 0;
    for (uint32_t k = 0; k < SPREAD_KEYS; k++) {
        const char *a = primary(&before, k), *b = primary(&after, k);
        if (strcmp(a, b) != 0) {
            moved++;
            ck_assert_str_eq(b, "node-10:13337");
        }
    }
    double frac = (double)moved / SPREAD_KEYS; /* 1/11 = 0.0909, sd ~0.0009 */
    ck_assert_msg(frac > 0.085 && frac < 0.097, "moved %.4f of keys", frac);
}
END_TEST

START_TEST(removing_a_node_moves_only_its_keys) {
    kvs_remote_ring before, after;
    ring_of(&before, 10, 0);
    ring_of(&after, 10, 0);
    ck_assert_int_eq(kvs_remote_ring_remove(&after, "node-4:13337"), KVS_OK);
    ck_assert_int_eq(kvs_remote_ring_remove(&after, "node-4:13337"), KVS_ENOTFOUND);
    ck_assert_uint_eq(after.n_nodes, 9);
    uint32_t moved = 0;
    for (uint32_t k = 0; k < SPREAD_KEYS; k++) {
        const char *a = primary(&before, k), *b = primary(&after, k);
        int held = strcmp(a, "node-4:13337") == 0;
        ck_assert_int_eq(strcmp(a, b) != 0, held);
        moved += (uint32_t)held;
    }
    double frac = (double)moved / SPREAD_KEYS;
    ck_assert_msg(frac > 0.094 && frac < 0.106, "moved %.4f of keys", frac);
}
END_TEST

START_TEST(a_down_node_is_skipped_for_the_next_preferred) {
    kvs_remote_ring ring;
    ring_of(&ring, 5, 0);
    uint32_t skipped = 0;
    for (uint32_t k = 0; k < 500; k++) {
        kvs_key key = key_of(k);
        uint32_t full[5], n, part[2], m;
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 5, full, &n), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_set_down(&ring, ring.nodes[full[0]].id, 1), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 2, part, &m), KVS_OK);
        ck_assert_uint_eq(m, 2);
        ck_assert_uint_eq(part[0], full[1]);
        ck_assert_uint_eq(part[1], full[2]);
        ck_assert_int_eq(kvs_remote_ring_set_down(&ring, ring.nodes[full[0]].id, 0), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 1, part, &m), KVS_OK);
        ck_assert_uint_eq(part[0], full[0]);
        skipped++;
    }
    ck_assert_uint_eq(skipped, 500);
    for (uint32_t i = 0; i < 5; i++)
        ck_assert_int_eq(kvs_remote_ring_set_down(&ring, ring.nodes[i].id, 1), KVS_OK);
    kvs_key key = key_of(0);
    uint32_t out[1], n = 99;
    ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 1, out, &n), KVS_ENOTFOUND);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvs_remote_ring_set_down(&ring, "nobody", 1), KVS_ENOTFOUND);
}
END_TEST

/* ---- fuzz -------------------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

#define FUZZ_ITERATIONS 200000u
#define N_SEEDS         15

START_TEST(mutated_messages_decode_cleanly_or_are_refused) {
    /* one valid message of every type as seeds */
    static uint8_t seeds[N_SEEDS][4096];
    size_t seed_len[N_SEEDS];
    uint8_t bytes32[32], rkey[24], small[40];
    memset(bytes32, 0x11, sizeof bytes32);
    memset(rkey, 0x22, sizeof rkey);
    memset(small, 0x33, sizeof small);
    for (uint32_t t = 1; t <= N_SEEDS; t++) {
        kvs_wire_msg msg;
        kvs_wire_msg_init(&msg, t, 1000 + t);
        keyed_entries(4);
        for (uint32_t i = 0; i < 4; i++) {
            in_entries[i].remote_addr = 0x10000u * (i + 1);
            in_entries[i].length = i == 1 && t == KVS_WIRE_PUT ? sizeof small : 512u * (i + 1);
            in_entries[i].rkey = rkey;
            in_entries[i].rkey_len = sizeof rkey;
            in_entries[i].inline_data = i == 1 && t == KVS_WIRE_PUT ? small : NULL;
            in_entries[i].status = -(int32_t)i;
            in_entries[i].present = (uint8_t)(i & 1);
        }
        msg.entries = in_entries;
        msg.n_entries = 4;
        msg.tenant = "fuzz-tenant";
        msg.tenant_len = 11;
        msg.nonce = msg.challenge = msg.proof = bytes32;
        msg.error_code = 4;
        msg.error_text = "a sentence";
        msg.error_text_len = 10;
        for (uint32_t i = 0; i < KVS_WIRE_STATS_COUNT; i++)
            msg.counters[i] = (uint64_t)i * 1000003u;
        ck_assert_int_eq(
            kvs_wire_encode(&msg, seeds[t - 1], sizeof seeds[0], &seed_len[t - 1], NULL), KVS_OK);
    }
    rng_state = 0x5eed5eed5eedull;
    uint32_t accepted = 0, refused_by_code[16] = {0};
    static uint8_t work[4096 + 64];
    for (uint32_t it = 0; it < FUZZ_ITERATIONS; it++) {
        uint32_t s = (uint32_t)(rng() % N_SEEDS);
        size_t len = seed_len[s];
        memcpy(work, seeds[s], len);
        uint32_t n_mutations = 1 + (uint32_t)(rng() % 4);
        for (uint32_t m = 0; m < n_mutations && len > 0; m++) {
            size_t at = (size_t)(rng() % len);
            switch (rng() % 5) {
                case 0: work[at] ^= (uint8_t)(1u << (rng() % 8)); break; /* bit flip */
                case 1: len = at; break;                                 /* truncation */
                case 2: work[at] = (uint8_t)rng(); break;                /* random byte */
                case 3: /* length-field inflation: turn a byte into a 32-bit length/count tag of ~all ones */
                    work[at] = (uint8_t)(rng() % 2 ? 0xc6 : 0xdd);
                    for (size_t j = at + 1; j < at + 5 && j < len; j++) work[j] = 0xff;
                    break;
                case 4: /* append random bytes */
                    for (uint32_t j = 0; j < 1 + rng() % 8 && len < sizeof work; j++)
                        work[len++] = (uint8_t)rng();
                    break;
            }
        }
        kvs_wire_msg msg;
        kvs_wire_refusal why;
        uint8_t *copy = malloc(len ? len : 1); /* exact size: any overread is caught by ASan */
        memcpy(copy, work, len);
        kvs_status st = kvs_wire_decode(copy, len, entries, KVS_WIRE_MAX_KEYS, &msg, &why);
        if (st == KVS_OK) {
            accepted++;
            ck_assert_int_eq(why.code, KVS_WIRE_ERR_NONE);
            /* whatever the decoder takes, the encoder can write again, and it decodes the same */
            size_t again;
            kvs_wire_refusal ewhy;
            ck_assert_msg(kvs_wire_encode(&msg, out_buf, sizeof out_buf, &again, &ewhy) == KVS_OK,
                          "iteration %u: decoded but cannot re-encode: %s", it, ewhy.text);
            static kvs_wire_entry entries2[KVS_WIRE_MAX_KEYS];
            kvs_wire_msg back;
            ck_assert_int_eq(
                kvs_wire_decode(out_buf, again, entries2, KVS_WIRE_MAX_KEYS, &back, NULL), KVS_OK);
            ck_assert_uint_eq(back.type, msg.type);
            ck_assert_uint_eq(back.request_id, msg.request_id);
            ck_assert_uint_eq(back.n_entries, msg.n_entries);
        } else {
            ck_assert_msg(why.code != KVS_WIRE_ERR_NONE && why.text[0] != '\0',
                          "iteration %u: status %d with no reason", it, st);
            ck_assert(st == KVS_ECORRUPT || st == KVS_EINVAL || st == KVS_EVERSION);
            refused_by_code[why.code & 15]++;
        }
        free(copy);
    }
    /* the mutations reached every refusal class and left some messages valid */
    ck_assert_uint_gt(accepted, 100);
    ck_assert_uint_gt(refused_by_code[KVS_WIRE_ERR_TRUNCATED], 100);
    ck_assert_uint_gt(refused_by_code[KVS_WIRE_ERR_TYPE], 100);
    ck_assert_uint_gt(refused_by_code[KVS_WIRE_ERR_TRAILING], 100);
    ck_assert_uint_gt(refused_by_code[KVS_WIRE_ERR_LIMIT], 10);
    ck_assert_uint_gt(refused_by_code[KVS_WIRE_ERR_VERSION], 10);
}
END_TEST

/* ---- suite ------------------------------------------------------------------------------------- */

static Suite *remote_proto_suite(void) {
    Suite *s = suite_create("remote_proto");
    TCase *wire = tcase_create("wire");
    tcase_add_test(wire, hello_round_trips_tenant_and_nonce);
    tcase_add_test(wire, decoding_into_reused_entries_leaves_no_field_of_the_last_message);
    tcase_add_test(wire, challenge_auth_auth_ok_and_stats_round_trip);
    tcase_add_test(wire, auth_with_a_worker_address_and_auth_ok_with_transports_round_trip);
    tcase_add_test(wire, an_auth_with_a_bad_address_group_is_refused);
    tcase_add_test(wire, error_round_trips_code_and_sentence);
    tcase_add_test(wire, lookup_and_delete_round_trip_keys_in_order);
    tcase_add_test(wire, lookup_reply_round_trips_presence_flags);
    tcase_add_test(wire, get_round_trips_destination_descriptors);
    tcase_add_test(wire, get_reply_round_trips_status_and_length);
    tcase_add_test(wire, put_round_trips_remote_and_inline_sources);
    tcase_add_test(wire, put_reply_and_delete_reply_round_trip_statuses);
    tcase_add_test(wire, stats_reply_round_trips_counters);
    tcase_add_test(wire, encode_reports_the_needed_size_and_writes_nothing_past_a_short_buffer);
    suite_add_tcase(s, wire);

    TCase *refusals = tcase_create("refusals");
    tcase_add_test(refusals, a_batch_over_the_key_limit_is_refused);
    tcase_add_test(refusals,
                   a_per_key_array_declaring_four_billion_entries_is_refused_before_reading_them);
    tcase_add_test(refusals, an_rkey_over_the_limit_is_refused);
    tcase_add_test(refusals, an_inline_payload_over_the_limit_is_refused);
    tcase_add_test(refusals, a_tenant_name_over_the_limit_is_refused);
    tcase_add_test(refusals, an_error_text_over_the_limit_is_refused);
    tcase_add_test(refusals, a_message_over_the_size_limit_is_refused_as_too_large);
    tcase_add_test(refusals, every_truncation_of_a_valid_message_is_refused_as_truncated);
    tcase_add_test(refusals, a_wrong_typed_field_is_refused);
    tcase_add_test(refusals, trailing_bytes_after_a_message_are_refused);
    tcase_add_test(refusals, an_unknown_version_is_refused_and_answered_with_an_error_reply);
    tcase_add_test(refusals, an_unknown_message_type_is_refused);
    tcase_add_test(refusals, impossible_values_are_refused);
    tcase_add_test(refusals, more_entries_than_the_caller_has_room_for_is_an_overflow);
    suite_add_tcase(s, refusals);

    TCase *auth = tcase_create("auth");
    tcase_add_test(auth, the_proof_matches_a_known_answer);
    tcase_add_test(auth, the_right_key_is_accepted);
    tcase_add_test(auth, a_wrong_key_is_refused);
    tcase_add_test(auth, a_proof_for_another_tenant_is_refused);
    tcase_add_test(auth, an_empty_or_missing_proof_is_refused);
    tcase_add_test(auth, a_replayed_proof_fails_on_a_new_connection);
    tcase_add_test(auth, a_challenge_answers_one_auth_only);
    tcase_add_test(auth, key_files_must_be_private_and_long_enough);
    tcase_add_test(auth, tenant_keys_are_deterministic_and_differ_across_tenants);
    suite_add_tcase(s, auth);

    TCase *ring = tcase_create("hashring");
    tcase_set_timeout(ring, 60);
    tcase_add_test(ring, homes_are_distinct_ordered_and_independent_of_insertion_order);
    tcase_add_test(ring, keys_spread_evenly_over_nodes);
    tcase_add_test(ring, adding_a_node_moves_about_one_key_in_n_and_only_onto_it);
    tcase_add_test(ring, removing_a_node_moves_only_its_keys);
    tcase_add_test(ring, a_down_node_is_skipped_for_the_next_preferred);
    suite_add_tcase(s, ring);

    TCase *fuzz = tcase_create("fuzz");
    tcase_set_timeout(fuzz, 120);
    tcase_add_test(fuzz, mutated_messages_decode_cleanly_or_are_refused);
    suite_add_tcase(s, fuzz);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(remote_proto_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
