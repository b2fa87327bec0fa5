/* test_redis_resp.c - the redis tier's protocol pieces without a server: the RESP2 reply parser (whole
 * replies, every split point, refusals of what a broken or hostile server sends), command encoding,
 * CRC16 key slots and CLUSTER SLOTS replies. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis.h"
#include "backends/redis/redis_conn.h"
#include "backends/redis/resp.h"
#include "backends/redis/slots.h"

static kvs_resp_node nodes[256];

static kvs_resp_result parse(const char *text, uint32_t *n, size_t *used) {
    return kvs_resp_parse(text, strlen(text), 1 << 20, nodes, 256, n, used, NULL);
}

START_TEST(parses_each_kind_of_reply) {
    uint32_t n = 0;
    size_t used = 0;
    ck_assert_int_eq(parse("+OK\r\n", &n, &used), KVS_RESP_DONE);
    ck_assert_int_eq(nodes[0].kind, KVS_RESP_STATUS);
    ck_assert(kvs_resp_text_is(&nodes[0], "OK", 0));
    ck_assert_uint_eq(used, 5);
    ck_assert_int_eq(parse("-MOVED 3999 127.0.0.1:7002\r\n", &n, &used), KVS_RESP_DONE);
    ck_assert_int_eq(nodes[0].kind, KVS_RESP_ERROR);
    ck_assert(kvs_resp_text_is(&nodes[0], "MOVED", 1));
    ck_assert(!kvs_resp_text_is(&nodes[0], "MOVE", 1));
    ck_assert_int_eq(parse(":-42\r\n", &n, &used), KVS_RESP_DONE);
    ck_assert_int_eq(nodes[0].integer, -42);
    ck_assert_int_eq(parse("$5\r\nab\r\nc\r\n", &n, &used), KVS_RESP_DONE);
    ck_assert_int_eq(nodes[0].kind, KVS_RESP_BULK);
    ck_assert_uint_eq(nodes[0].len, 5);
    ck_assert_int_eq(memcmp(nodes[0].text, "ab\r\nc", 5), 0);
    ck_assert_int_eq(parse("$-1\r\n", &n, &used), KVS_RESP_DONE);
    ck_assert_int_eq(nodes[0].kind, KVS_RESP_NIL);
    ck_assert_int_eq(parse("$0\r\n\r\n", &n, &used), KVS_RESP_DONE);
    ck_assert_uint_eq(nodes[0].len, 0);
    /* nested arrays: [[1, [], "x"], nil] and pre-order `next` */
    const char *a = "*2\r\n*3\r\n:1\r\n*0\r\n$1\r\nx\r\n*-1\r\n+tail\r\n";
    ck_assert_int_eq(parse(a, &n, &used), KVS_RESP_DONE);
    ck_assert_uint_eq(n, 6);
    ck_assert_uint_eq(used, strlen(a) - strlen("+tail\r\n"));
    ck_assert_uint_eq(nodes[0].next, 6);
    ck_assert_uint_eq(nodes[1].next, 5);
    ck_assert_uint_eq(nodes[3].next, 4); /* the empty array */
    ck_assert_int_eq(nodes[5].kind, KVS_RESP_NIL);
}
END_TEST

START_TEST(every_proper_prefix_is_incomplete) {
    const char *replies[] = {"+OK\r\n", "$5\r\nhello\r\n", "*2\r\n$1\r\na\r\n*1\r\n:7\r\n",
                             "-ERR x\r\n", ":12345\r\n"};
    for (size_t r = 0; r < sizeof replies / sizeof *replies; r++) {
        size_t len = strlen(replies[r]);
        char *copy = malloc(len); /* exactly len bytes: a read past them is ASAN's to catch */
        memcpy(copy, replies[r], len);
        for (size_t cut = 0; cut < len; cut++) {
            uint32_t n = 0;
            size_t used = 0;
            ck_assert_int_eq(kvs_resp_parse(copy, cut, 1 << 20, nodes, 256, &n, &used, NULL),
                             KVS_RESP_INCOMPLETE);
            ck_assert_uint_eq(used, 0);
        }
        uint32_t n = 0;
        size_t used = 0;
        ck_assert_int_eq(kvs_resp_parse(copy, len, 1 << 20, nodes, 256, &n, &used, NULL),
                         KVS_RESP_DONE);
        ck_assert_uint_eq(used, len);
        free(copy);
    }
}
END_TEST

START_TEST(refuses_what_is_not_resp2_or_over_a_bound) {
    const char *bad[] = {
        "?x\r\n",                    /* unknown type */
        "+OK\n",                     /* LF without CR */
        ":12a\r\n",                  /* not a number */
        ":\r\n",                     /* empty number */
        "$-2\r\n",                   /* negative length other than nil */
        "$007\r\n",                  /* padded length */
        "$+5\r\n",                   /* signed length */
        "$99999999999999999999\r\n", /* overflow */
        "$3\r\nabcd\r\n",            /* bulk not followed by CRLF */
        "*-5\r\n",                   /* negative count */
        "$2000000\r\n",              /* over the caller's max_bulk */
        "*1000\r\n",                 /* more elements than nodes */
        "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", /* too deep */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint32_t n = 0;
        size_t used = 0;
        const char *why = NULL;
        kvs_resp_result r =
            kvs_resp_parse(bad[i], strlen(bad[i]), 1 << 20, nodes, 256, &n, &used, &why);
        ck_assert_msg(r == KVS_RESP_MALFORMED, "accepted %s", bad[i]);
        ck_assert_ptr_nonnull(why);
    }
    /* a line with no CRLF within 4 KiB is refused, not waited for forever */
    char *line = malloc(KVS_RESP_MAX_LINE + 10);
    line[0] = '+';
    memset(line + 1, 'a', KVS_RESP_MAX_LINE + 9);
    uint32_t n = 0;
    size_t used = 0;
    ck_assert_int_eq(
        kvs_resp_parse(line, KVS_RESP_MAX_LINE + 10, 1 << 20, nodes, 256, &n, &used, NULL),
        KVS_RESP_MALFORMED);
    ck_assert_int_eq(kvs_resp_parse(line, 100, 1 << 20, nodes, 256, &n, &used, NULL),
                     KVS_RESP_INCOMPLETE);
    free(line);
}
END_TEST

START_TEST(encodes_commands_and_a_value_sent_apart) {
    char out[128];
    const char *argv[] = {"SET", "kvs1:t:ab"};
    size_t lens[] = {3, 9};
    size_t n = kvs_resp_command(out, sizeof out, 2, argv, lens, 5);
    ck_assert_uint_eq(n, strlen("*3\r\n$3\r\nSET\r\n$9\r\nkvs1:t:ab\r\n$5\r\n"));
    ck_assert_int_eq(memcmp(out, "*3\r\n$3\r\nSET\r\n$9\r\nkvs1:t:ab\r\n$5\r\n", n), 0);
    n = kvs_resp_command(out, sizeof out, 1, argv, lens, UINT64_MAX);
    ck_assert_int_eq(memcmp(out, "*1\r\n$3\r\nSET\r\n", n), 0);
    ck_assert_uint_eq(kvs_resp_command(out, 20, 2, argv, lens, 5), 0); /* too small */
}
END_TEST

START_TEST(key_slots_are_redis_clusters) {
    /* the CRC16/XMODEM check value, and slots Redis documents or computes (CLUSTER KEYSLOT) */
    ck_assert_uint_eq(kvs_redis_crc16("123456789", 9), 0x31C3);
    ck_assert_uint_eq(kvs_redis_key_slot("foo", 3), 12182);
    ck_assert_uint_eq(kvs_redis_key_slot("bar", 3), 5061);
    ck_assert_uint_eq(kvs_redis_key_slot("{user1000}.following", 20),
                      kvs_redis_key_slot("user1000", 8));
    ck_assert_uint_eq(kvs_redis_key_slot("foo{}{bar}", 10),
                      kvs_redis_crc16("foo{}{bar}", 10) & 16383);
    ck_assert_uint_eq(kvs_redis_key_slot("foo{{bar}}zap", 13), kvs_redis_key_slot("{bar", 4));
}
END_TEST

START_TEST(reads_a_cluster_slots_reply) {
    const char *reply = "*2\r\n"
                        "*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
                        "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$2\r\nid\r\n"
                        "*3\r\n:5461\r\n:16383\r\n*4\r\n$0\r\n\r\n:7001\r\n$2\r\nid\r\n*0\r\n";
    uint32_t n = 0;
    size_t used = 0;
    ck_assert_int_eq(parse(reply, &n, &used), KVS_RESP_DONE);
    kvs_redis_slot_range ranges[4];
    uint32_t nr = 0;
    char why[200];
    ck_assert_int_eq(kvs_redis_slots_parse(nodes, n, "10.0.0.9", ranges, 4, &nr, why, sizeof why),
                     0);
    ck_assert_uint_eq(nr, 2);
    ck_assert_uint_eq(ranges[0].first, 0);
    ck_assert_uint_eq(ranges[0].last, 5460);
    ck_assert_str_eq(ranges[0].host, "127.0.0.1");
    ck_assert_uint_eq(ranges[0].port, 7000);
    ck_assert_str_eq(ranges[1].host, "10.0.0.9"); /* empty host: the node asked */
    ck_assert_uint_eq(ranges[1].port, 7001);
    const char *bad[] = {
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n", /* slot past 16383 */
        "*1\r\n*3\r\n:9\r\n:3\r\n*2\r\n$1\r\na\r\n:1\r\n",     /* first > last */
        "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\na\r\n:0\r\n",     /* port 0 */
        "*1\r\n*3\r\n:0\r\n:3\r\n*1\r\n$1\r\na\r\n",           /* no port */
        "*1\r\n*2\r\n:0\r\n:3\r\n",                            /* no master */
        "*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$3\r\na b\r\n:1\r\n",   /* a space in the host */
        "+OK\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(parse(bad[i], &n, &used), KVS_RESP_DONE);
        ck_assert_msg(kvs_redis_slots_parse(nodes, n, "h", ranges, 4, &nr, why, sizeof why) == -1,
                      "accepted %s", bad[i]);
    }
}
END_TEST

START_TEST(endpoints_are_host_port_or_a_socket_path) {
    kvs_redis_endpoint ep;
    char why[200];
    ck_assert_int_eq(kvs_redis_endpoint_parse("10.0.0.7:6379", &ep, why, sizeof why), 0);
    ck_assert_str_eq(ep.host, "10.0.0.7");
    ck_assert_uint_eq(ep.port, 6379);
    ck_assert_int_eq(kvs_redis_endpoint_parse("[::1]:7000", &ep, why, sizeof why), 0);
    ck_assert_str_eq(ep.host, "::1");
    ck_assert_int_eq(kvs_redis_endpoint_parse("/run/redis/redis.sock", &ep, why, sizeof why), 0);
    ck_assert_str_eq(ep.host, "");
    ck_assert_int_eq(kvs_redis_endpoint_parse("host", &ep, why, sizeof why), -1);
    ck_assert_int_eq(kvs_redis_endpoint_parse("host:0", &ep, why, sizeof why), -1);
    ck_assert_int_eq(kvs_redis_endpoint_parse("host:65536", &ep, why, sizeof why), -1);
    ck_assert_int_eq(kvs_redis_endpoint_parse("host:12x", &ep, why, sizeof why), -1);
}
END_TEST

static kvs_status options(const char *const *kv, size_t n, kvs_redis_options *o, char *refused) {
    kvs_backend_option opts[16];
    for (size_t i = 0; i < n; i++) opts[i] = (kvs_backend_option){kv[2 * i], kv[2 * i + 1]};
    char why[300];
    refused[0] = '\0';
    return kvs_redis_options_parse(opts, n, o, why, sizeof why, refused, 80);
}

START_TEST(options_are_checked) {
    kvs_redis_options o;
    char refused[80];
    const char *ok[] = {"node", "/tmp/r.sock", "tenant", "team-a", "timeout_ms", "200"};
    ck_assert_int_eq(options(ok, 3, &o, refused), KVS_OK);
    ck_assert_str_eq(o.tenant, "team-a");
    ck_assert_uint_eq(o.timeout_ms, 200);
    ck_assert_uint_eq(o.connections_per_node, 2);
    const char *two[] = {"node", "a:1", "node", "b:2"};
    ck_assert_int_eq(options(two, 2, &o, refused), KVS_ECONFIG); /* standalone takes one */
    const char *cluster[] = {"node", "a:1", "node", "b:2", "mode", "cluster"};
    ck_assert_int_eq(options(cluster, 3, &o, refused), KVS_OK);
    ck_assert_uint_eq(o.cluster, 1);
    const char *tenant[] = {"node", "a:1", "tenant", "a:b"};
    ck_assert_int_eq(options(tenant, 2, &o, refused), KVS_ECONFIG);
    ck_assert_str_eq(refused, "tenant");
    const char *user[] = {"node", "a:1", "user", "u"};
    ck_assert_int_eq(options(user, 2, &o, refused), KVS_ECONFIG);
    ck_assert_str_eq(refused, "password_file");
    const char *cert[] = {"node", "a:1", "tls.ca_file", "ca", "tls.cert_file", "c"};
    ck_assert_int_eq(options(cert, 3, &o, refused), KVS_ECONFIG);
    ck_assert_str_eq(refused, "tls.key_file");
    const char *none[] = {"tenant", "x"};
    ck_assert_int_eq(options(none, 1, &o, refused), KVS_ECONFIG);
    ck_assert_str_eq(refused, "node");
}
END_TEST

static Suite *resp_suite(void) {
    Suite *s = suite_create("redis_resp");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, parses_each_kind_of_reply);
    tcase_add_test(tc, every_proper_prefix_is_incomplete);
    tcase_add_test(tc, refuses_what_is_not_resp2_or_over_a_bound);
    tcase_add_test(tc, encodes_commands_and_a_value_sent_apart);
    tcase_add_test(tc, key_slots_are_redis_clusters);
    tcase_add_test(tc, reads_a_cluster_slots_reply);
    tcase_add_test(tc, endpoints_are_host_port_or_a_socket_path);
    tcase_add_test(tc, options_are_checked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(resp_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? 1 : 0;
}
