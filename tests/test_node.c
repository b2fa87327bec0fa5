/* test_node.c - the kvstrata-node daemon as a child process serving requests from this process, a
 * client on 127.0.0.1 (tests/support/node_client): put/lookup/get round trips through RMA, tenant
 * isolation, malformed requests, sessions, an ssd tier below DRAM, settings from the config, and
 * SIGTERM shutdown. The handshake and hostile connections are in test_node_control.c. */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_node: skipped, this build has no UCX\n");
    return 77;
}
#else

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/ucx/control.h"
#include "backends/ucx/stream.h"
#include "backends/ucx/ucx_transport.h"
#include "backends/ucx/wire.h"
#include "common/clock.h"
#include "tests/support/node_client.h"
#include "tests/support/node_proc.h"
#include "tests/support/objects.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"
#include "tools/node/node.h" /* KVS_NODE_AM_ID */

#define TIMEOUT_MS 5000
#define KIB        1024u
#define MIB        (1024u * 1024u)

static kvs_test_node node;

static void setup(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    kvs_test_node_start_suite(&node, KVS_TEST_NODE_DRAM_YAML, 1, 0);
}

static void setup_ssd(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    kvs_test_node_start_suite(&node, KVS_TEST_NODE_SSD_YAML, 2, 0);
}

static void setup_from_yaml(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    kvs_test_node_start_suite(&node, KVS_TEST_NODE_DRAM_YAML, 1, 1);
}

static void teardown(void) {
    (void)kvs_test_node_stop(
        &node); /* its status matters only to the SIGTERM test, which stops it itself */
}

START_TEST(a_request_naming_no_session_is_dropped) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint8_t key[16];
    kvs_test_node_key(key, 2);
    c->token[0] ^= 0xff; /* a token the node never handed out */
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 1);
    m.entries = &e;
    m.n_entries = 1;
    uint8_t buf[256];
    size_t len = 0;
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &len, &why), KVS_OK);
    uint32_t arrived_before = c->n_arrived;
    ck_assert_int_eq(
        kvs_ucx_am_send(c->conn, KVS_NODE_AM_ID, c->token, sizeof c->token, buf, len, TIMEOUT_MS),
        KVS_OK);
    /* The node answers one session's requests in order, so an answer to the request above would come
     * before the answer to this lookup: one message arriving means the request was dropped. */
    c->token[0] ^= 0xff;
    ck_assert_uint_eq(kvs_test_client_lookup(c, key), 0);
    ck_assert_msg(c->n_arrived == arrived_before + 1,
                  "the node answered a request with a wrong session token");
    kvs_test_client_close(c);
}
END_TEST

/* Send one PUT object as a payload message (KVS_NODE_PAYLOAD_AM_ID) from the client's memory. */
static kvs_status send_put_payload(kvs_test_client *c, const void *header, size_t header_len,
                                   size_t off, size_t len) {
    kvs_ucx_am_out out = {.header = header,
                          .header_len = header_len,
                          .data = c->mem + off,
                          .data_len = len,
                          .mem = c->mem_reg};
    return kvs_ucx_am_send_many(c->conn, KVS_NODE_PAYLOAD_AM_ID, &out, 1, TIMEOUT_MS);
}

/* PUT objects as payload messages: the node answers the PUT once all its objects have landed, and
 * stores them; hostile payloads (a header of the wrong size, a token of no session, an index not
 * below the count) are dropped without an answer, an object over max_object_bytes is refused in
 * the answer, and the node keeps serving the session. */
START_TEST(put_objects_as_payload_messages_and_hostile_ones_are_refused) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint8_t keys[3][16];
    for (uint32_t i = 0; i < 3; i++) kvs_test_node_key(keys[i], 70 + i);
    const size_t sizes[2] = {MIB, 64 * KIB};
    kvs_test_fill(c->mem, MIB, 71);
    kvs_test_fill(c->mem + MIB, 64 * KIB, 72);
    uint8_t h[KVS_WIRE_PUT_PAYLOAD_BYTES];
    const uint64_t request = 900;
    c->arrived = 0;
    for (uint32_t i = 0; i < 2; i++) {
        kvs_wire_payload p = {
            .kind = KVS_WIRE_PAYLOAD_PUT, .index = i, .count = 2, .request_id = request};
        memcpy(p.token, c->token, sizeof p.token);
        memcpy(p.key, keys[i], sizeof p.key);
        size_t hl = kvs_wire_payload_encode(&p, h);
        ck_assert_int_eq(send_put_payload(c, h, hl, i * MIB, sizes[i]), KVS_OK);
    }
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(TIMEOUT_MS);
    while (!c->arrived && kvs_test_now_ms() < until) kvs_ucx_wait(c->t, 50);
    ck_assert_msg(c->arrived, "no answer to a PUT sent as payload messages");
    kvs_wire_msg rep;
    kvs_wire_refusal why;
    ck_assert_int_eq(
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_PUT_REPLY);
    ck_assert_uint_eq(rep.request_id, request);
    ck_assert_uint_eq(rep.n_entries, 2);
    ck_assert_int_eq(rep.entries[0].status, KVS_OK);
    ck_assert_int_eq(rep.entries[1].status, KVS_OK);
    for (uint32_t i = 0; i < 2; i++) {
        uint64_t len = 0;
        memset(c->mem + 2 * MIB, 0, MIB);
        ck_assert_int_eq(kvs_test_client_get(c, keys[i], 2 * MIB, MIB, &len), KVS_OK);
        ck_assert_uint_eq(len, sizes[i]);
        ck_assert_int_eq(memcmp(c->mem + 2 * MIB, c->mem + i * MIB, sizes[i]), 0);
    }

    /* hostile: none of these may be answered or stored */
    uint32_t arrived_before = c->n_arrived;
    uint8_t garbage[10] = {KVS_WIRE_VERSION, KVS_WIRE_PAYLOAD_PUT};
    ck_assert_int_eq(send_put_payload(c, garbage, sizeof garbage, 0, 4096), KVS_OK);
    kvs_wire_payload p = {.kind = KVS_WIRE_PAYLOAD_PUT, .index = 0, .count = 1, .request_id = 901};
    memcpy(p.key, keys[2], sizeof p.key);
    memcpy(p.token, c->token, sizeof p.token);
    p.token[0] ^= 0xff; /* a token the node never handed out */
    size_t hl = kvs_wire_payload_encode(&p, h);
    ck_assert_int_eq(send_put_payload(c, h, hl, 0, 4096), KVS_OK);
    memcpy(p.token, c->token, sizeof p.token);
    p.index = 1; /* not below the count */
    hl = kvs_wire_payload_encode(&p, h);
    ck_assert_int_eq(send_put_payload(c, h, hl, 0, 4096), KVS_OK);
    /* The node serves a session in order: the next thing to arrive answers this lookup. */
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[2]), 0);
    ck_assert_msg(c->n_arrived == arrived_before + 1, "the node answered a hostile payload");

    /* over max_object_bytes (2 MiB): refused in the answer, not stored */
    p.index = 0;
    p.request_id = 902;
    hl = kvs_wire_payload_encode(&p, h);
    c->arrived = 0;
    kvs_status st = send_put_payload(c, h, hl, 0, 3 * MIB);
    ck_assert(st == KVS_OK || st == KVS_EIO); /* a refused rendezvous fails on this side too */
    until = kvs_test_now_ms() + kvs_test_scaled_ms(TIMEOUT_MS);
    while (!c->arrived && kvs_test_now_ms() < until) kvs_ucx_wait(c->t, 50);
    ck_assert(c->arrived);
    ck_assert_int_eq(
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.request_id, 902);
    ck_assert_uint_eq(rep.n_entries, 1);
    ck_assert_int_eq(rep.entries[0].status, KVS_EINVAL);
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[2]), 0);
    kvs_test_client_close(c);
}
END_TEST

/* A request frame on the session's control connection (payloads: stream). */
static void stream_send(kvs_test_client *c, kvs_wire_msg *m, uint64_t id) {
    static uint8_t buf[KVS_WIRE_MAX_MESSAGE_BYTES + 4];
    char err[256] = "";
    m->request_id = id;
    ck_assert_msg(kvs_stream_write_msg(&c->ch, m, buf, sizeof buf,
                                       kvs_now_ns() + TIMEOUT_MS * 1000000ull, err,
                                       sizeof err) == KVS_OK,
                  "%s", err);
}

/* 1 once the node closed the session's control connection (within the timeout). */
static int session_closed(kvs_test_client *c) {
    uint8_t byte;
    char err[128];
    return kvs_stream_read(&c->ch, &byte, 1, kvs_now_ns() + TIMEOUT_MS * 1000000ull, err,
                           sizeof err) == KVS_EIO;
}

/* GET and PUT on the session's TCP stream: a PUT's bytes follow its frame, an object over
 * max_object_bytes is read, dropped and refused in the answer while the others are stored; a GET
 * is answered with records and the hits' bytes; a LOOKUP and a DELETE with one frame each. A frame
 * that is not a request, or a length over the limit, ends that session and the node serves the
 * next. */
START_TEST(get_and_put_on_the_stream_and_bad_frames_end_the_session) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint8_t keys[3][16];
    for (uint32_t i = 0; i < 3; i++) kvs_test_node_key(keys[i], 90 + i);
    const uint64_t sizes[3] = {64 * KIB, 3 * MIB, 1000}; /* the node's max is 2 MiB */
    kvs_wire_entry e[3];
    memset(e, 0, sizeof e);
    struct iovec iov[3];
    uint64_t off = 0;
    for (uint32_t i = 0; i < 3; i++) {
        e[i].key = keys[i];
        e[i].length = sizes[i];
        e[i].by_message = 1;
        kvs_test_fill(c->mem + off, sizes[i], 91 + i);
        iov[i] = (struct iovec){.iov_base = c->mem + off, .iov_len = sizes[i]};
        off += sizes[i];
    }
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_PUT, 0);
    m.entries = e;
    m.n_entries = 3;
    stream_send(c, &m, 41);
    char err[256] = "";
    uint64_t deadline = kvs_now_ns() + TIMEOUT_MS * 1000000ull;
    ck_assert_int_eq(kvs_stream_writev(&c->ch, iov, 3, deadline, err, sizeof err), KVS_OK);
    static uint8_t frame[KVS_WIRE_MAX_MESSAGE_BYTES];
    size_t len = 0;
    ck_assert_msg(kvs_stream_read_frame(&c->ch, frame, sizeof frame, &len, deadline, err,
                                        sizeof err) == KVS_OK,
                  "%s", err);
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_decode(frame, len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why),
                     KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_PUT_REPLY);
    ck_assert_uint_eq(rep.request_id, 41);
    ck_assert_int_eq(rep.entries[0].status, KVS_OK);
    ck_assert_int_eq(rep.entries[1].status, KVS_EINVAL);
    ck_assert_int_eq(rep.entries[2].status, KVS_OK);

    /* GET on the stream: object 0, the refused 1 (a miss), object 2 into a buffer too small */
    e[0].length = MIB;
    e[1].length = MIB;
    e[2].length = 10;
    kvs_wire_msg_init(&m, KVS_WIRE_GET, 0);
    m.entries = e;
    m.n_entries = 3;
    stream_send(c, &m, 42);
    /* groups of one: each object's record and bytes go out as the socket takes them */
    kvs_status st[3];
    uint64_t lens[3];
    uint8_t *back = c->mem + 3 * MIB + 1000 + 64 * KIB;
    for (uint32_t i = 0; i < 3; i++) {
        uint8_t head[KVS_STREAM_GROUP_BYTES], rec[KVS_STREAM_RECORD_BYTES];
        uint32_t count = 0;
        ck_assert_int_eq(kvs_stream_read(&c->ch, head, sizeof head, deadline, err, sizeof err),
                         KVS_OK);
        ck_assert_int_eq(kvs_stream_group_decode(head, 42, 3 - i, &count, err, sizeof err), KVS_OK);
        ck_assert_uint_eq(count, 1);
        ck_assert_int_eq(kvs_stream_read(&c->ch, rec, sizeof rec, deadline, err, sizeof err),
                         KVS_OK);
        kvs_stream_record_decode(rec, &st[i], &lens[i]);
        if (st[i] == KVS_OK)
            ck_assert_int_eq(kvs_stream_read(&c->ch, back, lens[i], deadline, err, sizeof err),
                             KVS_OK);
    }
    ck_assert_int_eq(st[0], KVS_OK);
    ck_assert_uint_eq(lens[0], 64 * KIB);
    ck_assert_int_eq(st[1], KVS_ENOTFOUND);
    ck_assert_int_eq(st[2], KVS_EOVERFLOW);
    ck_assert_uint_eq(lens[2], 1000);
    ck_assert_int_eq(memcmp(back, c->mem, 64 * KIB), 0);
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[2]), 1); /* UCX requests still served */

    /* a LOOKUP and a DELETE on the stream are answered there, a frame after each */
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 0);
    m.entries = e;
    m.n_entries = 2;
    stream_send(c, &m, 43);
    ck_assert_msg(kvs_stream_read_frame(&c->ch, frame, sizeof frame, &len, deadline, err,
                                        sizeof err) == KVS_OK,
                  "%s", err);
    ck_assert_int_eq(kvs_wire_decode(frame, len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why),
                     KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_LOOKUP_REPLY);
    ck_assert_uint_eq(rep.request_id, 43);
    ck_assert_uint_eq(rep.n_entries, 2);
    ck_assert_uint_eq(rep.entries[0].present, 1);
    ck_assert_uint_eq(rep.entries[1].present, 0); /* the refused object */
    kvs_wire_msg_init(&m, KVS_WIRE_DELETE, 0);
    m.entries = e;
    m.n_entries = 1;
    stream_send(c, &m, 44);
    ck_assert_msg(kvs_stream_read_frame(&c->ch, frame, sizeof frame, &len, deadline, err,
                                        sizeof err) == KVS_OK,
                  "%s", err);
    ck_assert_int_eq(kvs_wire_decode(frame, len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why),
                     KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_DELETE_REPLY);
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[0]), 0);

    /* not a request on the stream: the session ends */
    kvs_wire_msg_init(&m, KVS_WIRE_PUT_REPLY, 0);
    m.entries = e;
    m.n_entries = 1;
    stream_send(c, &m, 45);
    ck_assert_msg(session_closed(c), "a put_reply on the stream did not end the session");
    kvs_test_client_close(c);

    /* a frame length over the limit: the same, and the node goes on serving */
    c = kvs_test_client_authed(&node, "tenant-a");
    uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(kvs_control_write(&c->ch, huge, 4, deadline, err, sizeof err), KVS_OK);
    ck_assert_msg(session_closed(c), "a 4 GiB frame did not end the session");
    kvs_test_client_close(c);
    c = kvs_test_client_authed(&node, "tenant-a");
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[2]), 1);
    kvs_test_client_close(c);
}
END_TEST

START_TEST(put_lookup_get_round_trip_64k_1m_and_inline_objects) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    const size_t sizes[3] = {64 * KIB, MIB, 1000};
    const size_t src_off[3] = {0, 64 * KIB, 64 * KIB + MIB};
    uint8_t keys[4][16];
    for (uint32_t i = 0; i < 4; i++) kvs_test_node_key(keys[i], 10 + i);
    for (uint32_t i = 0; i < 3; i++) {
        kvs_test_fill(c->mem + src_off[i], sizes[i], 50 + i);
        ck_assert_int_eq(kvs_test_client_put(c, keys[i], src_off[i], sizes[i], i == 2), KVS_OK);
    }
    for (uint32_t i = 0; i < 3; i++) ck_assert_uint_eq(kvs_test_client_lookup(c, keys[i]), 1);
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[3]), 0);

    const size_t dst = 2 * MIB;
    for (uint32_t i = 0; i < 3; i++) {
        memset(c->mem + dst, 0, MIB + 4096);
        uint64_t len = 0;
        ck_assert_int_eq(kvs_test_client_get(c, keys[i], dst, MIB + 4096, &len), KVS_OK);
        ck_assert_uint_eq(len, sizes[i]);
        ck_assert_msg(memcmp(c->mem + dst, c->mem + src_off[i], sizes[i]) == 0, "object %u differs",
                      i);
        ck_assert_uint_eq(c->mem[dst + sizes[i]], 0); /* nothing written past the object */
    }
    uint64_t len = 7;
    ck_assert_int_eq(kvs_test_client_get(c, keys[3], dst, MIB, &len), KVS_ENOTFOUND);
    ck_assert_uint_eq(len, 0);
    memset(c->mem + dst, 0xEE, 64 * KIB);
    ck_assert_int_eq(kvs_test_client_get(c, keys[1], dst, 64 * KIB, &len),
                     KVS_EOVERFLOW); /* 1 MiB into 64 KiB */
    ck_assert_uint_eq(len, MIB);
    ck_assert_uint_eq(c->mem[dst], 0xEE); /* the destination is untouched */

    uint64_t s[KVS_WIRE_STATS_COUNT];
    kvs_test_client_stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_OBJECTS], 3);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_PUTS], 3);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_BYTES_USED], 64 * KIB + MIB + 1000);

    /* DELETE, then the key is gone. */
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = keys[0];
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_DELETE, 0);
    m.entries = &e;
    m.n_entries = 1;
    kvs_test_client_request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_DELETE_REPLY);
    ck_assert_int_eq(rep.entries[0].status, KVS_OK);
    ck_assert_uint_eq(kvs_test_client_lookup(c, keys[0]), 0);
    kvs_test_client_close(c);
}
END_TEST

START_TEST(tenants_cannot_see_or_overwrite_each_others_objects) {
    kvs_test_client *a = kvs_test_client_authed(&node, "alice");
    kvs_test_client *b = kvs_test_client_authed(&node, "bob");
    uint8_t key[16];
    kvs_test_node_key(key, 77);
    kvs_test_fill(a->mem, 64 * KIB, 1);
    kvs_test_fill(b->mem, 64 * KIB, 2);
    ck_assert_int_eq(kvs_test_client_put(a, key, 0, 64 * KIB, 0), KVS_OK);
    ck_assert_uint_eq(kvs_test_client_lookup(b, key), 0);
    uint64_t len = 0;
    ck_assert_int_eq(kvs_test_client_get(b, key, MIB, 64 * KIB, &len), KVS_ENOTFOUND);
    ck_assert_int_eq(kvs_test_client_put(b, key, 0, 64 * KIB, 0),
                     KVS_OK); /* bob's own object of the same key */
    ck_assert_int_eq(kvs_test_client_get(a, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_uint_eq(len, 64 * KIB);
    ck_assert_msg(memcmp(a->mem + MIB, a->mem, 64 * KIB) == 0, "alice reads bob's bytes");
    ck_assert_int_eq(kvs_test_client_get(b, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_msg(memcmp(b->mem + MIB, b->mem, 64 * KIB) == 0, "bob reads alice's bytes");
    kvs_test_client_close(a);
    kvs_test_client_close(b);
}
END_TEST

START_TEST(malformed_messages_get_an_error_and_the_node_keeps_serving) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    kvs_wire_msg rep;
    kvs_wire_refusal why;
    const uint8_t garbage[] = {0xc1, 0xff, 0x00, 0x13};
    ck_assert(kvs_test_client_send_raw(c, garbage, sizeof garbage));
    ck_assert_int_eq(
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_ne(rep.error_code, KVS_WIRE_ERR_NONE);

    /* A valid LOOKUP cut short: TRUNCATED, naming its request id. */
    uint8_t buf[256], key[16];
    kvs_test_node_key(key, 5);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 4242);
    m.entries = &e;
    m.n_entries = 1;
    size_t len = 0;
    ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &len, &why), KVS_OK);
    ck_assert(kvs_test_client_send_raw(c, buf, len - 3));
    ck_assert_int_eq(
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_TRUNCATED);
    ck_assert_uint_eq(rep.request_id, 4242);

    /* A reply type sent as a request. */
    uint8_t filler[32] = {1};
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH_OK, 0);
    m.proof = m.worker_addr = m.session_token = filler;
    m.worker_addr_len = sizeof filler;
    kvs_test_client_request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);

    /* Still serving on the same connection. */
    ck_assert_uint_eq(kvs_test_client_lookup(c, key), 0);
    ck_assert(!c->dead);
    kvs_test_client_close(c);
}
END_TEST

START_TEST(a_peer_that_keeps_sending_garbage_is_disconnected) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    const uint8_t garbage[] = {0x93, 0x01};
    int answered = 0;
    for (int i = 0; i < 40 && !c->dead; i++)
        answered += kvs_test_client_send_raw(c, garbage, sizeof garbage);
    ck_assert_msg(kvs_test_control_closed(c->ctl_fd), "the node kept an abusive session");
    ck_assert_int_ge(answered, 16);
    ck_assert_int_le(answered, 17);
    kvs_test_client_close(c);
    c = kvs_test_client_authed(&node, "tenant-a"); /* others are still served */
    kvs_test_client_close(c);
}
END_TEST

START_TEST(sigterm_stops_the_node_with_status_0_and_a_stats_line) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint8_t key[16];
    kvs_test_node_key(key, 9);
    kvs_test_fill(c->mem, 64 * KIB, 3);
    ck_assert_int_eq(kvs_test_client_put(c, key, 0, 64 * KIB, 0), KVS_OK);
    int status = kvs_test_node_stop(&node);
    ck_assert_msg(status != -1, "the node did not exit within 5 s of SIGTERM");
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    ck_assert_msg(strstr(node.out, "kvstrata-node stopped on SIGTERM") != NULL, "output: %s",
                  node.out);
    ck_assert_msg(strstr(node.out, " puts=1 ") != NULL, "output: %s", node.out);
    ck_assert_msg(strstr(node.out, " bytes_in=65536 ") != NULL, "output: %s", node.out);
    kvs_test_client_close(c);
}
END_TEST

START_TEST(objects_evicted_to_the_ssd_tier_are_still_served) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint8_t keys[4][16];
    for (uint32_t i = 0; i < 4; i++) {
        kvs_test_node_key(keys[i], 200 + i);
        kvs_test_fill(c->mem, MIB, 90 + i);
        ck_assert_int_eq(kvs_test_client_put(c, keys[i], 0, MIB, 0), KVS_OK);
    }
    uint64_t s[KVS_WIRE_STATS_COUNT];
    kvs_test_client_stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_CAPACITY_BYTES], 34u * MIB);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_EVICTIONS], 0); /* nothing fell off the last tier */
    for (uint32_t i = 0; i < 4; i++) {
        ck_assert_uint_eq(kvs_test_client_lookup(c, keys[i]), 1);
        uint64_t len = 0;
        memset(c->mem + 2 * MIB, 0, MIB);
        ck_assert_int_eq(kvs_test_client_get(c, keys[i], 2 * MIB, MIB, &len), KVS_OK);
        ck_assert_uint_eq(len, MIB);
        kvs_test_fill(c->mem, MIB, 90 + i);
        ck_assert_msg(memcmp(c->mem + 2 * MIB, c->mem, MIB) == 0, "object %u differs", i);
    }
    kvs_test_client_close(c);
}
END_TEST

/* Started with --config only: listen address, key file (relative to the config), limits from node:. */
START_TEST(settings_come_from_the_node_section_of_the_config) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-y");
    uint8_t key[16];
    kvs_test_node_key(key, 7);
    kvs_test_fill(c->mem, 3 * MIB, 7);
    ck_assert_int_eq(kvs_test_client_put(c, key, 0, MIB, 0), KVS_OK);
    ck_assert_int_ne(kvs_test_client_put(c, key, 0, 3 * MIB, 0),
                     KVS_OK); /* over node.max_object_bytes (2MiB) */
    uint64_t len = 0;
    ck_assert_int_eq(kvs_test_client_get(c, key, 3 * MIB, MIB, &len), KVS_OK);
    ck_assert_uint_eq(len, MIB);
    ck_assert_int_eq(memcmp(c->mem + 3 * MIB, c->mem, MIB), 0);
    kvs_test_client_close(c);
}
END_TEST

/* Run the node on a config text with extra arguments; returns its exit status, its stderr in err. */
static int node_exit_status(const char *yaml_text, const char *extra, char *err, size_t err_len) {
    char dir[512], yaml[700];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "node.yaml", yaml_text, yaml, sizeof yaml), 0);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "%s/kvstrata-node --config %s %s 2>&1 >/dev/null", KVS_TEST_BIN_DIR,
             yaml, extra);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(err, 1, err_len - 1, f);
    err[n] = '\0';
    int status = pclose(f);
    kvs_test_rmtree(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(a_bad_node_section_or_no_key_file_is_refused_with_a_sentence) {
    char err[2048];
    ck_assert_int_eq(node_exit_status(KVS_TEST_NODE_DRAM_YAML "node:\n  listen: 127.0.0.1\n", "",
                                      err, sizeof err),
                     2);
    ck_assert_msg(strstr(err, "node.listen") && strstr(err, "HOST:PORT"), "stderr: %s", err);
    ck_assert_int_eq(
        node_exit_status(KVS_TEST_NODE_DRAM_YAML "node:\n  colour: red\n", "", err, sizeof err), 2);
    ck_assert_msg(strstr(err, "unknown key") && strstr(err, "listen, psk_file"), "stderr: %s", err);
    ck_assert_int_eq(node_exit_status(KVS_TEST_NODE_DRAM_YAML "node:\n  max_object_bytes: 0\n", "",
                                      err, sizeof err),
                     2);
    ck_assert_msg(strstr(err, "node.max_object_bytes"), "stderr: %s", err);
    ck_assert_int_eq(node_exit_status(KVS_TEST_NODE_DRAM_YAML, "", err, sizeof err), 2);
    ck_assert_msg(strstr(err, "--psk-file or node.psk_file"), "stderr: %s", err);
    /* a flag wins over the section: a bad --listen is refused although node.listen is fine */
    ck_assert_int_eq(node_exit_status(KVS_TEST_NODE_DRAM_YAML
                                      "node:\n  listen: 127.0.0.1:0\n  psk_file: /nonexistent\n",
                                      "--listen nonsense", err, sizeof err),
                     2);
    ck_assert_msg(strstr(err, "--listen nonsense"), "stderr: %s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("node");
    TCase *tc = tcase_create("node");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, put_lookup_get_round_trip_64k_1m_and_inline_objects);
    tcase_add_test(tc, put_objects_as_payload_messages_and_hostile_ones_are_refused);
    tcase_add_test(tc, get_and_put_on_the_stream_and_bad_frames_end_the_session);
    tcase_add_test(tc, tenants_cannot_see_or_overwrite_each_others_objects);
    tcase_add_test(tc, malformed_messages_get_an_error_and_the_node_keeps_serving);
    tcase_add_test(tc, a_peer_that_keeps_sending_garbage_is_disconnected);
    tcase_add_test(tc, sigterm_stops_the_node_with_status_0_and_a_stats_line);
    tcase_add_test(tc, a_request_naming_no_session_is_dropped);
    suite_add_tcase(s, tc);
    TCase *ssd = tcase_create("ssd");
    tcase_add_checked_fixture(ssd, setup_ssd, teardown);
    tcase_set_timeout(ssd, 30);
    tcase_add_test(ssd, objects_evicted_to_the_ssd_tier_are_still_served);
    suite_add_tcase(s, ssd);
    TCase *yaml = tcase_create("yaml");
    tcase_add_checked_fixture(yaml, setup_from_yaml, teardown);
    tcase_set_timeout(yaml, 30);
    tcase_add_test(yaml, settings_come_from_the_node_section_of_the_config);
    suite_add_tcase(s, yaml);
    TCase *refused = tcase_create("refused");
    tcase_set_timeout(refused, 30);
    tcase_add_test(refused, a_bad_node_section_or_no_key_file_is_refused_with_a_sentence);
    suite_add_tcase(s, refused);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
