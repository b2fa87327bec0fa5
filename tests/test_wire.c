/* test_wire.c - the remote tier's wire format (backends/ucx/wire): every message type round trips
 * through encode and decode, decoding into reused entries keeps nothing of the last message, and the
 * encoder reports the size it needs. */
#include <check.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ucx/wire.h"
#include "tests/support/wire_messages.h"

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
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    size_t len = kvs_test_wire_encode_ok(&msg);
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
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.challenge, bytes, 32), 0);
    ck_assert_int_eq(memcmp(back.proof, bytes, 32), 0); /* the node's proof travels with it */
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH, 2);
    msg.proof = bytes;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.proof, bytes, 32), 0);
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 3);
    msg.proof = bytes;
    msg.worker_addr = bytes;
    msg.worker_addr_len = 12;
    msg.session_token = bytes + 16;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.proof, bytes, 32), 0); /* the node's proof of the handshake */
    ck_assert_uint_eq(back.transports_len, 0);
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_STATS, UINT64_MAX);
    free(kvs_test_wire_round_trip(&msg, &back));
    ck_assert_uint_eq(back.request_id, UINT64_MAX);
}
END_TEST

START_TEST(error_round_trips_code_and_sentence) {
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_ERROR, 9);
    msg.error_code = KVS_WIRE_ERR_AUTH;
    msg.error_text = "tenant \"x\" failed the handshake";
    msg.error_text_len = (uint32_t)strlen(msg.error_text);
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.error_code, KVS_WIRE_ERR_AUTH);
    ck_assert_uint_eq(back.error_text_len, msg.error_text_len);
    ck_assert_int_eq(memcmp(back.error_text, msg.error_text, msg.error_text_len), 0);
    free(copy);
    msg.error_text = NULL; /* no sentence at all */
    msg.error_text_len = 0;
    msg.error_code = KVS_WIRE_ERR_INTERNAL;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.error_code, KVS_WIRE_ERR_INTERNAL);
    ck_assert_uint_eq(back.error_text_len, 0);
    free(copy);
}
END_TEST

START_TEST(lookup_and_delete_round_trip_keys_in_order) {
    uint32_t types[] = {KVS_WIRE_LOOKUP, KVS_WIRE_DELETE};
    for (int t = 0; t < 2; t++) {
        kvs_test_wire_keyed_entries(KVS_WIRE_MAX_KEYS);
        kvs_wire_msg msg, back;
        kvs_wire_msg_init(&msg, types[t], 1000 + (uint64_t)t);
        msg.entries = kvs_test_wire_in;
        msg.n_entries = KVS_WIRE_MAX_KEYS;
        uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
        ck_assert_uint_eq(back.n_entries, KVS_WIRE_MAX_KEYS);
        for (uint32_t i = 0; i < back.n_entries; i++) {
            kvs_key k = kvs_test_wire_key(i);
            ck_assert_int_eq(memcmp(back.entries[i].key, k.bytes, 16), 0);
        }
        free(copy);
    }
}
END_TEST

START_TEST(lookup_reply_round_trips_presence_flags) {
    memset(kvs_test_wire_in, 0, sizeof kvs_test_wire_in);
    for (uint32_t i = 0; i < 37; i++) kvs_test_wire_in[i].present = (uint8_t)(i % 3 == 0);
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP_REPLY, 5);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 37;
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 37);
    for (uint32_t i = 0; i < 37; i++) ck_assert_uint_eq(back.entries[i].present, i % 3 == 0);
    free(copy);
    /* decoded into entries a GET filled before: only the flags, nothing of the GET left */
    for (uint32_t i = 0; i < 37; i++)
        kvs_test_wire_decoded[i] = (kvs_wire_entry){.length = 777, .status = -4, .remote_addr = 9};
    size_t len = kvs_test_wire_encode_ok(&msg);
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_decode(kvs_test_wire_buf, len, kvs_test_wire_decoded,
                                     KVS_WIRE_MAX_KEYS, &back, &why),
                     KVS_OK);
    for (uint32_t i = 0; i < 37; i++) {
        ck_assert_uint_eq(back.entries[i].length, 0);
        ck_assert_int_eq(back.entries[i].status, 0);
        ck_assert_uint_eq(back.entries[i].remote_addr, 0);
    }
}
END_TEST

START_TEST(get_round_trips_destination_descriptors) {
    uint8_t rkey_a[3] = {1, 2, 3}, rkey_b[KVS_WIRE_MAX_RKEY_BYTES];
    memset(rkey_b, 0x5a, sizeof rkey_b);
    kvs_test_wire_keyed_entries(4);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_test_wire_in[i].remote_addr = 0x7f0000000000ull + i * 4096;
        kvs_test_wire_in[i].length = i == 3 ? UINT64_MAX : 1000u * (i + 1);
        kvs_test_wire_in[i].rkey = i % 2 ? rkey_b : rkey_a;
        kvs_test_wire_in[i].rkey_len = i % 2 ? (uint32_t)sizeof rkey_b : 3;
    }
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET, 6);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 4;
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 4);
    for (uint32_t i = 0; i < 4; i++) {
        const kvs_wire_entry *e = &back.entries[i];
        ck_assert_int_eq(memcmp(e->key, kvs_test_wire_in[i].key, 16), 0);
        ck_assert_uint_eq(e->remote_addr, kvs_test_wire_in[i].remote_addr);
        ck_assert_uint_eq(e->length, kvs_test_wire_in[i].length);
        ck_assert_uint_eq(e->rkey_len, kvs_test_wire_in[i].rkey_len);
        ck_assert_int_eq(memcmp(e->rkey, kvs_test_wire_in[i].rkey, e->rkey_len), 0);
    }
    free(copy);
}
END_TEST

/* A GET may ask for some objects as payload messages ([capacity]) and others by RMA; decoding a
 * message of the other kind into the same entries keeps neither flag nor key of the last one. */
START_TEST(get_round_trips_objects_asked_as_payload_messages) {
    uint8_t rkey[5] = {9, 8, 7, 6, 5};
    kvs_test_wire_keyed_entries(4);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_wire_entry *e = &kvs_test_wire_in[i];
        e->length = 65536u * (i + 1);
        e->by_message = (uint8_t)(i % 2 == 0);
        if (!e->by_message) {
            e->remote_addr = 0x1000u * (i + 1);
            e->rkey = rkey;
            e->rkey_len = sizeof rkey;
        }
    }
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET, 9);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 4;
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.n_entries, 4);
    for (uint32_t i = 0; i < 4; i++) {
        const kvs_wire_entry *e = &back.entries[i];
        ck_assert_uint_eq(e->by_message, i % 2 == 0);
        ck_assert_uint_eq(e->length, 65536u * (i + 1));
        if (e->by_message) {
            ck_assert_ptr_null(e->rkey);
            ck_assert_uint_eq(e->remote_addr, 0);
        } else {
            ck_assert_uint_eq(e->rkey_len, sizeof rkey);
            ck_assert_uint_eq(e->remote_addr, 0x1000u * (i + 1));
        }
    }
    free(copy);
    /* the same entries reused for an all-RMA GET: no by_message left over */
    for (uint32_t i = 0; i < 4; i++) {
        kvs_test_wire_in[i].by_message = 0;
        kvs_test_wire_in[i].rkey = rkey;
        kvs_test_wire_in[i].rkey_len = sizeof rkey;
    }
    kvs_wire_entry *reused = back.entries;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_ptr_eq(back.entries, reused);
    for (uint32_t i = 0; i < 4; i++) ck_assert_uint_eq(back.entries[i].by_message, 0);
    free(copy);
}
END_TEST

/* Payload message headers: both kinds round trip; a wrong length, version, kind, count or index is
 * refused with a sentence. */
START_TEST(payload_headers_round_trip_and_bad_ones_are_refused) {
    uint8_t buf[KVS_WIRE_PUT_PAYLOAD_BYTES];
    kvs_wire_payload get = {
        .kind = KVS_WIRE_PAYLOAD_GET, .index = 1023, .request_id = 0x0123456789abcdefull};
    ck_assert_uint_eq(kvs_wire_payload_encode(&get, buf), KVS_WIRE_GET_PAYLOAD_BYTES);
    kvs_wire_payload back;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    ck_assert_int_eq(
        kvs_wire_payload_decode(buf, KVS_WIRE_GET_PAYLOAD_BYTES, KVS_WIRE_PAYLOAD_GET, &back, &why),
        KVS_OK);
    ck_assert_uint_eq(back.index, 1023);
    ck_assert_uint_eq(back.request_id, 0x0123456789abcdefull);
    /* a GET header read as a PUT one (wrong length), and the other way round (wrong kind) */
    ck_assert_int_eq(
        kvs_wire_payload_decode(buf, KVS_WIRE_GET_PAYLOAD_BYTES, KVS_WIRE_PAYLOAD_PUT, &back, &why),
        KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why.text, "60 expected"));

    kvs_wire_payload put = {.kind = KVS_WIRE_PAYLOAD_PUT,
                            .index = 6,
                            .count = 7,
                            .request_id = 42,
                            .read_by_ns = 0xfedcba9876543210ull};
    for (uint32_t i = 0; i < sizeof put.token; i++) put.token[i] = (uint8_t)(i * 3);
    for (uint32_t i = 0; i < sizeof put.key; i++) put.key[i] = (uint8_t)(200 - i);
    ck_assert_uint_eq(kvs_wire_payload_encode(&put, buf), KVS_WIRE_PUT_PAYLOAD_BYTES);
    memset(&why, 0, sizeof why);
    ck_assert_int_eq(kvs_wire_payload_decode(buf, sizeof buf, KVS_WIRE_PAYLOAD_PUT, &back, &why),
                     KVS_OK);
    ck_assert_uint_eq(back.index, 6);
    ck_assert_uint_eq(back.count, 7);
    ck_assert_uint_eq(back.request_id, 42);
    ck_assert_uint_eq(back.read_by_ns, 0xfedcba9876543210ull);
    ck_assert_int_eq(memcmp(back.token, put.token, sizeof put.token), 0);
    ck_assert_int_eq(memcmp(back.key, put.key, sizeof put.key), 0);
    memset(&why, 0, sizeof why);
    ck_assert_int_eq(kvs_wire_payload_decode(buf, sizeof buf, KVS_WIRE_PAYLOAD_GET, &back, &why),
                     KVS_EINVAL);

    static const struct {
        uint32_t index, count;
    } bad_shapes[] = {{0, 0}, {7, 7}, {0, KVS_WIRE_MAX_KEYS + 1}, {UINT32_MAX, 3}};
    for (size_t i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; i++) {
        put.index = bad_shapes[i].index;
        put.count = bad_shapes[i].count;
        kvs_wire_payload_encode(&put, buf);
        memset(&why, 0, sizeof why);
        ck_assert_int_eq(
            kvs_wire_payload_decode(buf, sizeof buf, KVS_WIRE_PAYLOAD_PUT, &back, &why),
            KVS_EINVAL);
        ck_assert_int_eq(why.code, KVS_WIRE_ERR_VALUE);
    }
    put.index = 0;
    put.count = 1;
    kvs_wire_payload_encode(&put, buf);
    buf[0] = KVS_WIRE_VERSION + 1;
    memset(&why, 0, sizeof why);
    ck_assert_int_eq(kvs_wire_payload_decode(buf, sizeof buf, KVS_WIRE_PAYLOAD_PUT, &back, &why),
                     KVS_EINVAL);
    ck_assert_int_eq(why.code, KVS_WIRE_ERR_VERSION);
    buf[0] = KVS_WIRE_VERSION;
    memset(&why, 0, sizeof why);
    ck_assert_int_eq(
        kvs_wire_payload_decode(buf, sizeof buf - 1, KVS_WIRE_PAYLOAD_PUT, &back, &why),
        KVS_EINVAL);
    ck_assert_int_eq(kvs_wire_payload_decode(NULL, 0, KVS_WIRE_PAYLOAD_PUT, &back, &why),
                     KVS_EINVAL);
}
END_TEST

START_TEST(get_reply_round_trips_status_and_length) {
    memset(kvs_test_wire_in, 0, sizeof kvs_test_wire_in);
    kvs_test_wire_in[0].status = KVS_OK;
    kvs_test_wire_in[0].length = 65536;
    kvs_test_wire_in[1].status = KVS_ENOTFOUND;
    kvs_test_wire_in[2].status = KVS_EOVERFLOW;
    kvs_test_wire_in[2].length = 1ull << 40;
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET_REPLY, 6);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 3;
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
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
    kvs_test_wire_keyed_entries(3);
    kvs_test_wire_in[0].length = 1 << 20;
    kvs_test_wire_in[0].remote_addr = 0x1000;
    kvs_test_wire_in[0].rkey = rkey;
    kvs_test_wire_in[0].rkey_len = sizeof rkey;
    kvs_test_wire_in[1].inline_data = small;
    kvs_test_wire_in[1].length = sizeof small;
    kvs_test_wire_in[2].inline_data = small;
    kvs_test_wire_in[2].length = 0; /* an empty object is legal */
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_PUT, 8);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 3;
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
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
    ck_assert_int_eq(memcmp(back.entries[2].key, kvs_test_wire_in[2].key, 16), 0);
    free(copy);
}
END_TEST

/* A PUT to a node on shared memory carries the time from which the client may reuse the objects'
 * room; one without it decodes as 0 (none). */
START_TEST(put_round_trips_its_read_by_time) {
    uint8_t rkey[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvs_test_wire_keyed_entries(1);
    kvs_test_wire_in[0].length = 1 << 20;
    kvs_test_wire_in[0].remote_addr = 0x2000;
    kvs_test_wire_in[0].rkey = rkey;
    kvs_test_wire_in[0].rkey_len = sizeof rkey;
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_PUT, 9);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 1;
    msg.read_by_ns = 0x123456789abcull;
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.read_by_ns, 0x123456789abcull);
    ck_assert_uint_eq(back.entries[0].remote_addr, 0x2000);
    free(copy);
    msg.read_by_ns = 0;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.read_by_ns, 0);
    free(copy);
}
END_TEST

/* A read-by time of 0 is not a time, and a GET has no such field. */
START_TEST(a_zero_read_by_time_and_a_get_with_one_are_refused) {
    static const uint32_t types[2] = {KVS_WIRE_PUT, KVS_WIRE_GET};
    for (int t = 0; t < 2; t++) {
        kvs_test_raw r;
        kvs_test_raw_begin(&r, KVS_WIRE_VERSION, types[t], 1);
        ck_assert_int_eq(msgpack_pack_array(&r.pk, 3), 0);
        kvs_test_raw_bin(&r, KVS_WIRE_KEY_BYTES, 1);
        ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
        ck_assert_int_eq(msgpack_pack_array(&r.pk, 3), 0);
        ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 4096), 0);
        ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 0x1000), 0);
        kvs_test_raw_bin(&r, 8, 3);
        ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 0), 0);
        kvs_wire_msg msg;
        kvs_wire_refusal why;
        ck_assert_int_ne(kvs_test_raw_decode(&r, &msg, &why), KVS_OK);
        ck_assert_int_eq(why.code, t == 0 ? KVS_WIRE_ERR_VALUE : KVS_WIRE_ERR_TYPE);
    }
}
END_TEST

START_TEST(put_reply_and_delete_reply_round_trip_statuses) {
    uint32_t types[] = {KVS_WIRE_PUT_REPLY, KVS_WIRE_DELETE_REPLY};
    for (int t = 0; t < 2; t++) {
        memset(kvs_test_wire_in, 0, sizeof kvs_test_wire_in);
        for (uint32_t i = 0; i < 12; i++) kvs_test_wire_in[i].status = -(int32_t)i;
        kvs_wire_msg msg, back;
        kvs_wire_msg_init(&msg, types[t], 4);
        msg.entries = kvs_test_wire_in;
        msg.n_entries = 12;
        uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
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
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    for (uint32_t i = 0; i < KVS_WIRE_STATS_COUNT; i++)
        ck_assert_uint_eq(back.counters[i], msg.counters[i]);
    free(copy);
}
END_TEST

START_TEST(encode_reports_the_needed_size_and_writes_nothing_past_a_short_buffer) {
    kvs_test_wire_keyed_entries(10);
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 1);
    msg.entries = kvs_test_wire_in;
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
    ck_assert_ptr_nonnull(exact);
    ck_assert_int_eq(kvs_wire_encode(&msg, exact, need, &len, NULL), KVS_OK);
    ck_assert_uint_eq(len, need);
    kvs_wire_msg back;
    ck_assert_int_eq(
        kvs_wire_decode(exact, len, kvs_test_wire_decoded, KVS_WIRE_MAX_KEYS, &back, NULL), KVS_OK);
    ck_assert_uint_eq(back.n_entries, 10);
    free(exact);
}
END_TEST

/* ---- auth messages --------------------------------------------------------------------------- */

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
    uint8_t *copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_int_eq(memcmp(back.proof, proof, sizeof proof), 0);
    ck_assert_uint_eq(back.host_id_len, sizeof host);
    ck_assert_int_eq(memcmp(back.host_id, host, sizeof host), 0);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.worker_addr, addr, sizeof addr), 0);
    ck_assert_uint_eq(back.pid, 4242);
    free(copy);
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES];
    memset(token, 0x3c, sizeof token);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 6);
    msg.proof = proof;
    msg.transports = "sysv+posix+cma";
    msg.transports_len = 14;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    msg.session_token = token;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.transports_len, 14);
    ck_assert_int_eq(memcmp(back.transports, "sysv+posix+cma", 14), 0);
    free(copy);
    /* a worker address alone (every client sends one), and AUTH_OK with the node's worker address
     * and the session token */
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH, 8);
    msg.proof = proof;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.worker_addr, addr, sizeof addr), 0);
    ck_assert_uint_eq(back.host_id_len, 0);
    free(copy);
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 9);
    msg.proof = proof;
    msg.transports = "tcp";
    msg.transports_len = 3;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    msg.session_token = token;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.transports_len, 3);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.session_token, token, sizeof token), 0);
    ck_assert_uint_eq(back.shared_tier_len, 0);
    free(copy);
    /* and with the node's shared tier, to a client on its host */
    msg.shared_tier = "kvs-node-dram";
    msg.shared_tier_len = 13;
    msg.shared_tier_capacity = 1ull << 33;
    msg.shared_tier_max_object = 1ull << 20;
    copy = kvs_test_wire_round_trip(&msg, &back);
    ck_assert_uint_eq(back.worker_addr_len, sizeof addr);
    ck_assert_int_eq(memcmp(back.session_token, token, sizeof token), 0);
    ck_assert_uint_eq(back.shared_tier_len, 13);
    ck_assert_int_eq(memcmp(back.shared_tier, "kvs-node-dram", 13), 0);
    ck_assert_uint_eq(back.shared_tier_capacity, 1ull << 33);
    ck_assert_uint_eq(back.shared_tier_max_object, 1ull << 20);
    free(copy);
    /* a host id without a worker address or without a pid, or an AUTH_OK address without a token or
     * without the node's proof, is not encoded */
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
    msg.proof = proof;
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
    msg.session_token = token;
    msg.proof = NULL;
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
    /* a shared tier without a worker address, or without its geometry, is not encoded either */
    kvs_wire_msg_init(&msg, KVS_WIRE_AUTH_OK, 7);
    msg.proof = proof;
    msg.shared_tier = "t";
    msg.shared_tier_len = 1;
    msg.shared_tier_capacity = 1;
    msg.shared_tier_max_object = 1;
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
    msg.worker_addr = addr;
    msg.worker_addr_len = sizeof addr;
    msg.session_token = token;
    msg.shared_tier_capacity = 0;
    ck_assert_int_eq(kvs_wire_encode(&msg, buf, sizeof buf, &len, &why), KVS_EINVAL);
}
END_TEST

START_TEST(an_auth_with_a_bad_address_group_is_refused) {
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_raw r;
    /* three fields: the pid is missing */
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 3), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    kvs_test_raw_bin(&r, 32, 2);
    kvs_test_raw_bin(&r, 100, 3);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_TYPE, "has 3 fields");
    /* a worker address over the limit, refused before its bytes are read */
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 4), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    kvs_test_raw_bin(&r, 32, 2);
    kvs_test_raw_bin(&r, KVS_WIRE_MAX_WORKER_ADDR_BYTES + 1, 3);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, 7), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "the worker address");
    /* a host id over the limit */
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 4), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    kvs_test_raw_bin(&r, KVS_WIRE_MAX_HOST_ID_BYTES + 1, 2);
    kvs_test_raw_bin(&r, 100, 3);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, 7), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "the host id");
    /* pid 0 and a pid over INT32_MAX */
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 4), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    kvs_test_raw_bin(&r, 32, 2);
    kvs_test_raw_bin(&r, 100, 3);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, 0), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_VALUE, "pid 0");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 4), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    kvs_test_raw_bin(&r, 32, 2);
    kvs_test_raw_bin(&r, 100, 3);
    ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 1ull << 40), 0);
    kvs_status st = kvs_test_raw_decode(&r, &msg, &why);
    ck_assert_int_ne(st, KVS_OK);
    /* a transports text over the limit in AUTH_OK */
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH_OK, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 4), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
    char text[KVS_WIRE_MAX_TRANSPORTS_TEXT + 1];
    memset(text, 'a', sizeof text);
    ck_assert_int_eq(msgpack_pack_str(&r.pk, sizeof text), 0);
    ck_assert_int_eq(msgpack_pack_str_body(&r.pk, text, sizeof text), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "the transports");
    /* AUTH_OK with five fields (a shared tier's name without its geometry), and with a shared tier
     * of capacity 0 */
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES];
    memset(token, 1, sizeof token);
    for (int bad = 0; bad < 2; bad++) {
        kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH_OK, 1);
        ck_assert_int_eq(msgpack_pack_array(&r.pk, bad ? 7 : 5), 0);
        kvs_test_raw_bin(&r, KVS_WIRE_PROOF_BYTES, 1);
        ck_assert_int_eq(msgpack_pack_str(&r.pk, 3), 0);
        ck_assert_int_eq(msgpack_pack_str_body(&r.pk, "tcp", 3), 0);
        kvs_test_raw_bin(&r, 32, 2);
        ck_assert_int_eq(msgpack_pack_bin(&r.pk, sizeof token), 0);
        ck_assert_int_eq(msgpack_pack_bin_body(&r.pk, token, sizeof token), 0);
        ck_assert_int_eq(msgpack_pack_str(&r.pk, 4), 0);
        ck_assert_int_eq(msgpack_pack_str_body(&r.pk, "tier", 4), 0);
        if (bad) {
            ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 0), 0);
            ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 1 << 20), 0);
        }
        kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                     bad ? KVS_WIRE_ERR_VALUE : KVS_WIRE_ERR_TYPE,
                                     bad ? "shared tier" : "has 5 fields");
    }
}
END_TEST

static Suite *wire_suite(void) {
    Suite *s = suite_create("wire");
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
    tcase_add_test(wire, get_round_trips_objects_asked_as_payload_messages);
    tcase_add_test(wire, payload_headers_round_trip_and_bad_ones_are_refused);
    tcase_add_test(wire, get_reply_round_trips_status_and_length);
    tcase_add_test(wire, put_round_trips_remote_and_inline_sources);
    tcase_add_test(wire, put_round_trips_its_read_by_time);
    tcase_add_test(wire, a_zero_read_by_time_and_a_get_with_one_are_refused);
    tcase_add_test(wire, put_reply_and_delete_reply_round_trip_statuses);
    tcase_add_test(wire, stats_reply_round_trips_counters);
    tcase_add_test(wire, encode_reports_the_needed_size_and_writes_nothing_past_a_short_buffer);
    suite_add_tcase(s, wire);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(wire_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
