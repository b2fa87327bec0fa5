/* test_wire_refusals.c - what the wire decoder (backends/ucx/wire) refuses: every limit once, every
 * refusal class, and a bounded fuzz of mutated messages that must decode cleanly or be refused. */
#include <check.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ucx/wire.h"
#include "tests/support/wire_messages.h"

/* ---- limits: one each ------------------------------------------------------------------------ */

START_TEST(a_batch_over_the_key_limit_is_refused) {
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_LOOKUP, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    kvs_test_raw_bin(&r, (KVS_WIRE_MAX_KEYS + 1) * KVS_WIRE_KEY_BYTES, 1);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "over the limit");
    /* and the encoder will not write one */
    kvs_test_wire_keyed_entries(KVS_WIRE_MAX_KEYS + 1);
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 1);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = KVS_WIRE_MAX_KEYS + 1;
    size_t len;
    ck_assert_int_eq(kvs_wire_encode(&msg, kvs_test_wire_buf, sizeof kvs_test_wire_buf, &len, &why),
                     KVS_EINVAL);
    ck_assert_int_eq(why.code, KVS_WIRE_ERR_LIMIT);
}
END_TEST

START_TEST(a_per_key_array_declaring_four_billion_entries_is_refused_before_reading_them) {
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_PUT_REPLY, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, UINT32_MAX), 0); /* five bytes, no elements */
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "4294967295 elements");
}
END_TEST

START_TEST(an_rkey_over_the_limit_is_refused) {
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_GET, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 2), 0);
    kvs_test_raw_bin(&r, 16, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 3), 0);
    ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 4096), 0);
    ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 4096), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_MAX_RKEY_BYTES + 1, 2);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "an rkey of 513 bytes");
}
END_TEST

START_TEST(an_inline_payload_over_the_limit_is_refused) {
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_PUT, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 2), 0);
    kvs_test_raw_bin(&r, 16, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    kvs_test_raw_bin(&r, KVS_WIRE_MAX_INLINE_BYTES + 1, 3);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "inline data of 4097");
}
END_TEST

START_TEST(a_tenant_name_over_the_limit_is_refused) {
    char name[KVS_WIRE_MAX_TENANT_BYTES + 1];
    memset(name, 'a', sizeof name);
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_HELLO, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 2), 0);
    ck_assert_int_eq(msgpack_pack_str(&r.pk, sizeof name), 0);
    ck_assert_int_eq(msgpack_pack_str_body(&r.pk, name, sizeof name), 0);
    kvs_test_raw_bin(&r, 32, 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "tenant name of 65 bytes");
}
END_TEST

START_TEST(an_error_text_over_the_limit_is_refused) {
    char text[KVS_WIRE_MAX_ERROR_TEXT + 1];
    memset(text, 'e', sizeof text);
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_ERROR, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 2), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, 3), 0);
    ck_assert_int_eq(msgpack_pack_str(&r.pk, sizeof text), 0);
    ck_assert_int_eq(msgpack_pack_str_body(&r.pk, text, sizeof text), 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EINVAL,
                                 KVS_WIRE_ERR_LIMIT, "error text of 257");
}
END_TEST

START_TEST(a_message_over_the_size_limit_is_refused_as_too_large) {
    size_t len = KVS_WIRE_MAX_MESSAGE_BYTES + 1;
    uint8_t *big = calloc(1, len);
    ck_assert_ptr_nonnull(big);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_status st = kvs_wire_decode(big, len, kvs_test_wire_decoded, KVS_WIRE_MAX_KEYS, &msg, &why);
    kvs_test_wire_assert_refused(st, &why, KVS_EINVAL, KVS_WIRE_ERR_TOO_LARGE, "over the limit");
    free(big);
    /* an encodable-looking PUT whose inline objects add up past the limit is refused by the encoder */
    static uint8_t payload[KVS_WIRE_MAX_INLINE_BYTES];
    kvs_test_wire_keyed_entries(300);
    for (uint32_t i = 0; i < 300; i++) {
        kvs_test_wire_in[i].inline_data = payload;
        kvs_test_wire_in[i].length = sizeof payload;
    }
    kvs_wire_msg_init(&msg, KVS_WIRE_PUT, 1);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 300;
    size_t need;
    ck_assert_int_eq(
        kvs_wire_encode(&msg, kvs_test_wire_buf, sizeof kvs_test_wire_buf, &need, &why),
        KVS_EINVAL);
    ck_assert_int_eq(why.code, KVS_WIRE_ERR_TOO_LARGE);
    ck_assert_uint_gt(need, KVS_WIRE_MAX_MESSAGE_BYTES);
}
END_TEST

/* ---- refusal classes ------------------------------------------------------------------------- */

START_TEST(every_truncation_of_a_valid_message_is_refused_as_truncated) {
    uint8_t rkey[20] = {9};
    kvs_test_wire_keyed_entries(5);
    for (uint32_t i = 0; i < 5; i++) {
        kvs_test_wire_in[i].remote_addr = 1ull << 40;
        kvs_test_wire_in[i].length = 300;
        kvs_test_wire_in[i].rkey = rkey;
        kvs_test_wire_in[i].rkey_len = sizeof rkey;
    }
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_GET, 42);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 5;
    size_t len = kvs_test_wire_encode_ok(&msg);
    for (size_t cut = 0; cut < len; cut++) {
        kvs_wire_refusal why;
        kvs_status st = kvs_test_wire_decode_copy(kvs_test_wire_buf, cut, &msg, &why, NULL);
        ck_assert_msg(st == KVS_ECORRUPT && why.code == KVS_WIRE_ERR_TRUNCATED, "cut at %zu: %d %s",
                      cut, st, why.text);
    }
}
END_TEST

START_TEST(a_wrong_typed_field_is_refused) {
    kvs_test_raw r; /* the request id as a string */
    msgpack_sbuffer_init(&r.sbuf);
    msgpack_packer_init(&r.pk, &r.sbuf, msgpack_sbuffer_write);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 4), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, KVS_WIRE_VERSION), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, KVS_WIRE_STATS), 0);
    ck_assert_int_eq(msgpack_pack_str(&r.pk, 2), 0);
    ck_assert_int_eq(msgpack_pack_str_body(&r.pk, "42", 2), 0);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 0), 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_TYPE, "the request id");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_LOOKUP,
                       1); /* keys as a string instead of binary */
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    ck_assert_int_eq(msgpack_pack_str(&r.pk, 16), 0);
    ck_assert_int_eq(msgpack_pack_str_body(&r.pk, "0123456789abcdef", 16), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_TYPE, "should be binary");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH_OK, 1); /* a body that is a map */
    ck_assert_int_eq(msgpack_pack_map(&r.pk, 0), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_TYPE, "an array");
}
END_TEST

START_TEST(trailing_bytes_after_a_message_are_refused) {
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_STATS, 3);
    size_t len = kvs_test_wire_encode_ok(&msg);
    kvs_test_wire_buf[len] = 0xc0; /* msgpack nil */
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(
        kvs_test_wire_decode_copy(kvs_test_wire_buf, len + 1, &msg, &why, NULL), &why, KVS_ECORRUPT,
        KVS_WIRE_ERR_TRAILING, "1 stray bytes");
    ck_assert_int_eq(kvs_test_wire_decode_copy(kvs_test_wire_buf, len, &msg, &why, NULL), KVS_OK);
}
END_TEST

START_TEST(an_unknown_version_is_refused_and_answered_with_an_error_reply) {
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 0xabcdef);
    msg.version = KVS_WIRE_VERSION + 1;
    kvs_test_wire_keyed_entries(2);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 2;
    size_t len = kvs_test_wire_encode_ok(&msg);
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(
        kvs_test_wire_decode_copy(kvs_test_wire_buf, len, &msg, &why, NULL), &why, KVS_EVERSION,
        KVS_WIRE_ERR_VERSION, "this side speaks 3");
    ck_assert_int_eq(why.have_request_id, 1);
    ck_assert_uint_eq(why.request_id, 0xabcdef);
    /* a newer header with more fields still gets a version error, not a shape error */
    kvs_test_raw r;
    msgpack_sbuffer_init(&r.sbuf);
    msgpack_packer_init(&r.pk, &r.sbuf, msgpack_sbuffer_write);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 6), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, 7), 0);
    ck_assert_int_eq(msgpack_pack_uint32(&r.pk, 99), 0);
    ck_assert_int_eq(msgpack_pack_uint64(&r.pk, 5), 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_EVERSION,
                                 KVS_WIRE_ERR_VERSION, "version 7");
    ck_assert_uint_eq(why.request_id, 5);
    /* the node's reply */
    uint8_t reply[512];
    size_t reply_len;
    ck_assert_int_eq(kvs_wire_encode_refusal(&why, reply, sizeof reply, &reply_len), KVS_OK);
    kvs_wire_msg back;
    uint8_t *copy = NULL;
    ck_assert_int_eq(kvs_test_wire_decode_copy(reply, reply_len, &back, NULL, &copy), KVS_OK);
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
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, 99, 8);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 0), 0);
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_UNKNOWN_TYPE, "type 99");
    ck_assert_uint_eq(why.request_id, 8);
}
END_TEST

START_TEST(impossible_values_are_refused) {
    kvs_wire_msg msg;
    kvs_wire_refusal why;
    kvs_test_raw r;
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_LOOKUP_REPLY, 1); /* a presence flag of 2 */
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    kvs_test_raw_bin(&r, 3, 2);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_VALUE, "not 0 or 1");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_DELETE, 1); /* 17 bytes of keys */
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    kvs_test_raw_bin(&r, 17, 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_VALUE, "not a multiple of 16");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_PUT, 1); /* two keys, one descriptor */
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 2), 0);
    kvs_test_raw_bin(&r, 32, 0);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    kvs_test_raw_bin(&r, 4, 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_VALUE, "2 keys but 1");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_HELLO,
                       1); /* a tenant with a slash, a short nonce */
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 2), 0);
    ck_assert_int_eq(msgpack_pack_str(&r.pk, 3), 0);
    ck_assert_int_eq(msgpack_pack_str_body(&r.pk, "a/b", 3), 0);
    kvs_test_raw_bin(&r, 32, 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_VALUE, "tenant name");
    kvs_test_raw_begin(&r, KVS_WIRE_VERSION, KVS_WIRE_AUTH, 1);
    ck_assert_int_eq(msgpack_pack_array(&r.pk, 1), 0);
    kvs_test_raw_bin(&r, 31, 0);
    kvs_test_wire_assert_refused(kvs_test_raw_decode(&r, &msg, &why), &why, KVS_ECORRUPT,
                                 KVS_WIRE_ERR_VALUE, "31 bytes, 32 expected");
}
END_TEST

START_TEST(more_entries_than_the_caller_has_room_for_is_an_overflow) {
    kvs_test_wire_keyed_entries(8);
    kvs_wire_msg msg, back;
    kvs_wire_msg_init(&msg, KVS_WIRE_LOOKUP, 1);
    msg.entries = kvs_test_wire_in;
    msg.n_entries = 8;
    size_t len = kvs_test_wire_encode_ok(&msg);
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_decode(kvs_test_wire_buf, len, kvs_test_wire_decoded, 7, &back, &why),
                     KVS_EOVERFLOW);
    ck_assert_int_eq(kvs_wire_decode(kvs_test_wire_buf, len, kvs_test_wire_decoded, 8, &back, &why),
                     KVS_OK);
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
        kvs_test_wire_keyed_entries(4);
        for (uint32_t i = 0; i < 4; i++) {
            kvs_test_wire_in[i].remote_addr = 0x10000u * (i + 1);
            kvs_test_wire_in[i].length =
                i == 1 && t == KVS_WIRE_PUT ? sizeof small : 512u * (i + 1);
            kvs_test_wire_in[i].rkey = rkey;
            kvs_test_wire_in[i].rkey_len = sizeof rkey;
            kvs_test_wire_in[i].inline_data = i == 1 && t == KVS_WIRE_PUT ? small : NULL;
            kvs_test_wire_in[i].status = -(int32_t)i;
            kvs_test_wire_in[i].present = (uint8_t)(i & 1);
        }
        msg.entries = kvs_test_wire_in;
        msg.n_entries = 4;
        msg.tenant = "fuzz-tenant";
        msg.tenant_len = 11;
        msg.nonce = msg.challenge = msg.proof = bytes32;
        msg.worker_addr = msg.session_token = bytes32; /* AUTH_OK's */
        msg.worker_addr_len = t == KVS_WIRE_AUTH_OK ? sizeof bytes32 : 0;
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
        ck_assert_ptr_nonnull(copy);
        memcpy(copy, work, len);
        kvs_status st =
            kvs_wire_decode(copy, len, kvs_test_wire_decoded, KVS_WIRE_MAX_KEYS, &msg, &why);
        if (st == KVS_OK) {
            accepted++;
            ck_assert_int_eq(why.code, KVS_WIRE_ERR_NONE);
            /* whatever the decoder takes, the encoder can write again, and it decodes the same */
            size_t again;
            kvs_wire_refusal ewhy;
            ck_assert_msg(kvs_wire_encode(&msg, kvs_test_wire_buf, sizeof kvs_test_wire_buf, &again,
                                          &ewhy) == KVS_OK,
                          "iteration %u: decoded but cannot re-encode: %s", it, ewhy.text);
            static kvs_wire_entry entries2[KVS_WIRE_MAX_KEYS];
            kvs_wire_msg back;
            ck_assert_int_eq(
                kvs_wire_decode(kvs_test_wire_buf, again, entries2, KVS_WIRE_MAX_KEYS, &back, NULL),
                KVS_OK);
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

static Suite *wire_refusals_suite(void) {
    Suite *s = suite_create("wire_refusals");
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
    TCase *fuzz = tcase_create("fuzz");
    tcase_set_timeout(fuzz, 120);
    tcase_add_test(fuzz, mutated_messages_decode_cleanly_or_are_refused);
    suite_add_tcase(s, fuzz);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(wire_refusals_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
