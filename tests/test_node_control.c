/* test_node_control.c - the kvstrata-node daemon's control connection, driven from this process on
 * 127.0.0.1: the handshake (right key, wrong key, requests before it), and hostile plain sockets
 * (garbage, truncated frames, huge lengths, its UCX ports, a slowloris, floods, the handshake cap). */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_node_control: skipped, this build has no UCX\n");
    return 77;
}
#else

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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

static void teardown(void) {
    (void)kvs_test_node_stop(
        &node); /* its status matters only to the SIGTERM test, which stops it itself */
}

START_TEST(handshake_with_the_right_key_is_accepted) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint64_t s[KVS_WIRE_STATS_COUNT];
    kvs_test_client_stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 0);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_CAPACITY_BYTES], 32u * MIB);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_OBJECTS], 0);
    kvs_test_client_close(c);
}
END_TEST

START_TEST(handshake_with_a_wrong_key_is_refused_and_the_connection_closed) {
    kvs_test_client *c = kvs_test_client_open(&node);
    uint8_t wrong[32];
    memcpy(wrong, node.psk, sizeof wrong);
    wrong[5] ^= 1;
    uint32_t code = 0;
    ck_assert_uint_eq(kvs_test_client_handshake(c, "tenant-a", wrong, sizeof wrong, &code),
                      KVS_WIRE_ERROR);
    ck_assert(
        !c->node_proved); /* to a client with another key the node's proof does not check out */
    ck_assert_uint_eq(code, KVS_WIRE_ERR_AUTH);
    ck_assert_ptr_null(c->conn); /* no UCX endpoint was made */
    ck_assert_msg(kvs_test_control_closed(c->ctl_fd),
                  "the node kept the connection after a wrong proof");
    kvs_test_client_close(c);
    /* A good client is still served and sees the failure counted. */
    c = kvs_test_client_authed(&node, "tenant-a");
    uint64_t s[KVS_WIRE_STATS_COUNT];
    kvs_test_client_stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 1);
    kvs_test_client_close(c);
}
END_TEST

/* Each tenant holds only its own key: tenant-b's key (or the node's master key) does not log in as
 * tenant-a, and the node's CHALLENGE already tells such a client the node does not know its key. */
START_TEST(a_tenant_s_key_logs_in_as_that_tenant_only) {
    uint8_t b_key[32];
    kvs_test_node_tenant_key(&node, "tenant-b", b_key, NULL, 0);
    const uint8_t *keys[] = {b_key, node.psk};
    for (int k = 0; k < 2; k++) {
        kvs_test_client *c = kvs_test_client_open(&node);
        uint32_t code = 0;
        ck_assert_uint_eq(kvs_test_client_handshake(c, "tenant-a", keys[k], 32, &code),
                          KVS_WIRE_ERROR);
        ck_assert(!c->node_proved);
        ck_assert_uint_eq(code, KVS_WIRE_ERR_AUTH);
        ck_assert_ptr_null(c->conn);
        kvs_test_client_close(c);
    }
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-b"); /* as itself: served */
    uint64_t s[KVS_WIRE_STATS_COUNT];
    kvs_test_client_stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 2);
    kvs_test_client_close(c);
}
END_TEST

/* An authenticated tenant sends a worker address UCX would abort on (another address version in its
 * header, or too short): the session is refused before UCX sees it, and the node serves on. */
START_TEST(a_crafted_worker_address_is_refused_and_the_node_lives) {
    uint8_t key[32], addr[512];
    kvs_test_node_tenant_key(&node, "tenant-a", key, NULL, 0);
    const size_t lens[] = {256, 512, 4};
    for (int i = 0; i < 3; i++) {
        memset(addr, 0xff, sizeof addr);
        if (i == 1)
            for (size_t k = 0; k < sizeof addr; k++) addr[k] = (uint8_t)(k * 131 + 7);
        if (i == 1) addr[0] |= 0x0f; /* version 15 */
        kvs_test_client *c = kvs_test_client_open(&node);
        uint32_t code = 0;
        ck_assert_uint_eq(
            kvs_test_client_handshake_with(c, "tenant-a", key, sizeof key, addr, lens[i], &code),
            KVS_WIRE_ERROR);
        ck_assert_uint_eq(code, KVS_WIRE_ERR_INTERNAL);
        kvs_test_client_close(c);
        ck_assert(kvs_test_node_alive(&node));
    }
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    kvs_test_client_close(c);
}
END_TEST

/* node.max_sessions_per_tenant: one tenant cannot take every session; the others still log in. */
START_TEST(a_tenant_holds_at_most_its_share_of_sessions) {
    kvs_test_node capped;
    kvs_test_node_start_suite(
        &capped, KVS_TEST_NODE_DRAM_YAML "node:\n  max_sessions_per_tenant: 2\n", 1, 0);
    kvs_test_client *q1 = kvs_test_client_authed(&capped, "tenant-q");
    kvs_test_client *q2 = kvs_test_client_authed(&capped, "tenant-q");
    uint8_t key[32];
    kvs_test_node_tenant_key(&capped, "tenant-q", key, NULL, 0);
    kvs_test_client *q3 = kvs_test_client_open(&capped);
    uint32_t code = 0;
    ck_assert_uint_eq(kvs_test_client_handshake(q3, "tenant-q", key, sizeof key, &code),
                      KVS_WIRE_ERROR);
    ck_assert_uint_eq(code, KVS_WIRE_ERR_INTERNAL);
    kvs_test_client_close(q3);
    kvs_test_client *r = kvs_test_client_authed(&capped, "tenant-r"); /* another tenant: served */
    kvs_test_client_close(r);
    kvs_test_client_close(q1);
    q1 = NULL;
    for (int i = 0; i < 50 && !q1; i++) { /* once the node has seen q1's end */
        kvs_test_client *t = kvs_test_client_open(&capped);
        if (kvs_test_client_handshake(t, "tenant-q", key, sizeof key, NULL) == KVS_WIRE_AUTH_OK)
            q1 = t;
        else {
            kvs_test_client_close(t);
            kvs_test_pause_ms(20);
        }
    }
    ck_assert_ptr_nonnull(q1);
    kvs_test_client_close(q1);
    kvs_test_client_close(q2);
    (void)kvs_test_node_stop(&capped);
}
END_TEST

/* node.tenant_capacity and node.tenants: a tenant that puts past its share evicts its own oldest
 * objects, not another tenant's (the tiers hold 16 objects here; without shares the 40 puts below
 * evicted all of the victim's); an object larger than a tenant's whole share is refused. */
START_TEST(a_tenant_over_its_share_evicts_its_own_objects_first) {
    kvs_test_node shared;
    kvs_test_node_start_suite(&shared,
                              KVS_TEST_NODE_DRAM_YAML "node:\n  tenant_capacity: 8MiB\n"
                                                      "  tenants:\n    tiny: 1MiB\n",
                              1, 0);
    kvs_test_client *victim = kvs_test_client_authed(&shared, "victim");
    kvs_test_client *noisy = kvs_test_client_authed(&shared, "noisy");
    uint8_t key[16];
    kvs_test_fill(victim->mem, MIB, 1);
    kvs_test_fill(noisy->mem, MIB, 2);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_test_node_key(key, 100 + i);
        ck_assert_int_eq(kvs_test_client_put(victim, key, 0, MIB, 0), KVS_OK);
    }
    for (uint32_t i = 0; i < 40; i++) {
        kvs_test_node_key(key, 1000 + i);
        ck_assert_int_eq(kvs_test_client_put(noisy, key, 0, MIB, 0), KVS_OK);
    }
    for (uint32_t i = 0; i < 4; i++) {
        kvs_test_node_key(key, 100 + i);
        ck_assert_msg(kvs_test_client_lookup(victim, key) == 1, "the victim's object %u is gone",
                      i);
    }
    uint32_t held = 0;
    for (uint32_t i = 0; i < 40; i++) {
        kvs_test_node_key(key, 1000 + i);
        held += (uint32_t)kvs_test_client_lookup(noisy, key);
    }
    ck_assert_uint_eq(held, 8); /* its newest 8 MiB */
    kvs_test_node_key(key, 1039);
    ck_assert_uint_eq(kvs_test_client_lookup(noisy, key), 1);
    kvs_test_client *tiny = kvs_test_client_authed(&shared, "tiny");
    kvs_test_fill(tiny->mem, MIB + 1000, 3);
    kvs_test_node_key(key, 5000);
    ck_assert_int_ne(kvs_test_client_put(tiny, key, 0, MIB + 1000, 0), KVS_OK);
    ck_assert_int_eq(kvs_test_client_put(tiny, key, 0, MIB, 0), KVS_OK);
    kvs_test_client_close(tiny);
    kvs_test_client_close(noisy);
    kvs_test_client_close(victim);
    ck_assert_int_eq(kvs_test_node_stop(&shared), 0);
    ck_assert_msg(strstr(shared.out, "quota_evictions=32") != NULL, "output: %s", shared.out);
}
END_TEST

/* An authenticated tenant names its memory with a packed rkey UCX cannot read (all 0xff: a map of
 * 64 memory domains in 24 bytes; a map of all 64 domains with empty keys, which fits its length and
 * crashed UCX's unpack; a real one cut to 10 bytes): its GET is not served and its session ends,
 * the node serves on, and a real key works. */
START_TEST(a_crafted_rkey_ends_its_session_and_the_node_lives) {
    uint8_t key[16];
    kvs_test_node_key(key, 77);
    for (int shape = 0; shape < 3; shape++) {
        kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
        kvs_test_fill(c->mem, 64 * KIB, 77);
        ck_assert_int_eq(kvs_test_client_put(c, key, 0, 64 * KIB, 0), KVS_OK);
        uint8_t rkey[KVS_WIRE_MAX_RKEY_BYTES];
        size_t len = shape == 0 ? 24 : shape == 1 ? 73 : 10;
        memset(rkey, 0xff, sizeof rkey);
        if (shape == 1) {
            memset(rkey, 0, sizeof rkey);
            memset(rkey, 0xff, 8);
        }
        if (shape == 2) memcpy(rkey, c->rkey, 10);
        kvs_wire_entry e;
        memset(&e, 0, sizeof e);
        e.key = key;
        e.remote_addr = (uint64_t)(uintptr_t)(c->mem + MIB);
        e.length = 64 * KIB;
        e.rkey = rkey;
        e.rkey_len = (uint32_t)len;
        kvs_wire_msg m;
        kvs_wire_msg_init(&m, KVS_WIRE_GET, 7);
        m.entries = &e;
        m.n_entries = 1;
        static uint8_t buf[4096];
        size_t n = 0;
        kvs_wire_refusal why;
        ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &n, &why), KVS_OK);
        if (kvs_test_client_send_raw(c, buf, n)) { /* answered before the session ends */
            kvs_wire_msg rep;
            ck_assert_int_eq(
                kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why),
                KVS_OK);
            ck_assert_msg(rep.n_entries == 1 && rep.entries[0].status != KVS_OK,
                          "shape %d (%zu bytes) was served", shape, len);
        }
        ck_assert_msg(kvs_test_control_closed(c->ctl_fd), "shape %d: the session goes on", shape);
        ck_assert(kvs_test_node_alive(&node));
        kvs_test_client_close(c);
    }
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-a");
    uint64_t got = 0;
    kvs_test_fill(c->mem, 64 * KIB, 77);
    ck_assert_int_eq(kvs_test_client_get(c, key, MIB, 64 * KIB, &got), KVS_OK);
    ck_assert_int_eq(memcmp(c->mem + MIB, c->mem, 64 * KIB), 0);
    kvs_test_client_close(c);
}
END_TEST

/* A rotation without a restart: the master key file replaced, SIGHUP; tenant keys derived from the
 * old one no longer log in, those from the new one do, and a session opened before goes on. */
START_TEST(sighup_rotates_the_master_key_without_a_restart) {
    kvs_test_client *before = kvs_test_client_authed(&node, "tenant-a");
    uint8_t old_key[32];
    kvs_test_node_tenant_key(&node, "tenant-a", old_key, NULL, 0);
    for (size_t i = 0; i < sizeof node.psk; i++) node.psk[i] = (uint8_t)(i * 13 + 101);
    int fd = open(node.psk_path, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, node.psk, sizeof node.psk), (ssize_t)sizeof node.psk);
    ck_assert_int_eq(close(fd), 0);
    ck_assert_int_eq(kill(node.pid, SIGHUP), 0);
    int rotated = 0;
    for (int i = 0; i < 100 && !rotated; i++) { /* until the node has read it */
        kvs_test_client *c = kvs_test_client_open(&node);
        uint32_t code = 0;
        rotated = kvs_test_client_handshake(c, "tenant-a", old_key, sizeof old_key, &code) ==
                  KVS_WIRE_ERROR;
        kvs_test_client_close(c);
        if (!rotated) kvs_test_pause_ms(20);
    }
    ck_assert_msg(rotated, "the old tenant key still logs in after SIGHUP");
    kvs_test_client *after = kvs_test_client_authed(&node, "tenant-a"); /* the new one does */
    kvs_test_client_close(after);
    uint8_t key[16];
    kvs_test_node_key(key, 5150);
    ck_assert_uint_eq(kvs_test_client_lookup(before, key), 0); /* the old session goes on */
    kvs_test_client_close(before);
    ck_assert(kvs_test_node_alive(&node));
}
END_TEST

START_TEST(requests_before_the_handshake_are_refused_with_state) {
    kvs_test_client *c = kvs_test_client_open(&node);
    uint8_t key[16];
    kvs_test_node_key(key, 1);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 0);
    m.entries = &e;
    m.n_entries = 1;
    ck_assert(kvs_test_client_control_request(c, &m, &rep));
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);
    ck_assert_msg(kvs_test_control_closed(c->ctl_fd),
                  "the node kept a connection that sent a lookup before hello");
    kvs_test_client_close(c);
    c = kvs_test_client_open(&node);
    uint8_t proof[KVS_WIRE_PROOF_BYTES] = {0}, addr[1] = {1};
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH, 0); /* AUTH without HELLO: no challenge yet */
    m.proof = proof;
    m.worker_addr = addr;
    m.worker_addr_len = 1;
    ck_assert(kvs_test_client_control_request(c, &m, &rep));
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);
    ck_assert_msg(kvs_test_control_closed(c->ctl_fd),
                  "the node kept a connection that sent auth before hello");
    kvs_test_client_close(c);
    c = kvs_test_client_authed(&node, "tenant-a");
    ck_assert_uint_eq(kvs_test_client_lookup(c, key), 0);
    /* HELLO again after AUTH_OK (over UCX): STATE, and the session stays authenticated. */
    uint8_t nonce[KVS_WIRE_NONCE_BYTES] = {0};
    kvs_wire_msg_init(&m, KVS_WIRE_HELLO, 0);
    m.tenant = "tenant-b";
    m.tenant_len = 8;
    m.nonce = nonce;
    kvs_test_client_request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);
    ck_assert_uint_eq(kvs_test_client_lookup(c, key), 0);
    kvs_test_client_close(c);
}
END_TEST

/* ---- hostile plain sockets ----------------------------------------------------------------------- */

/* A plain TCP connection to addr (sin_addr.s_addr) and port. */
static int raw_connect_to(uint32_t addr, uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    sin.sin_addr.s_addr = addr;
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    return fd;
}

static int raw_connect(uint16_t port) {
    return raw_connect_to(htonl(INADDR_LOOPBACK), port);
}

/* Connect, send bytes (as many as the peer takes before it closes), close at once. */
static void raw_send_close_to(uint32_t addr, uint16_t port, const void *bytes, size_t len) {
    int fd = raw_connect_to(addr, port);
    ssize_t sent = send(fd, bytes, len, MSG_NOSIGNAL);
    ck_assert_int_ge(sent, 0);
    ck_assert_int_eq(close(fd), 0);
}

static void raw_send_close(uint16_t port, const void *bytes, size_t len) {
    int fd = raw_connect(port);
    ck_assert_int_eq(send(fd, bytes, len, MSG_NOSIGNAL), (ssize_t)len);
    ck_assert_int_eq(close(fd), 0);
}

static unsigned fd_count(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    unsigned n = 0;
    for (struct dirent *de; (de = readdir(dir)) != NULL;) n += de->d_name[0] != '.';
    ck_assert_int_eq(closedir(dir), 0);
    return n;
}

/* A fresh client authenticates and moves a 64 KiB object through the node. */
static void a_real_client_is_served(const kvs_test_node *d, uint32_t seed) {
    kvs_test_client *c = kvs_test_client_authed(d, "tenant-real");
    uint8_t key[16];
    kvs_test_node_key(key, 1000 + seed);
    kvs_test_fill(c->mem, 64 * KIB, seed);
    ck_assert_int_eq(kvs_test_client_put(c, key, 0, 64 * KIB, 0), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(kvs_test_client_get(c, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_uint_eq(len, 64 * KIB);
    ck_assert_int_eq(memcmp(c->mem + MIB, c->mem, 64 * KIB), 0);
    kvs_test_client_close(c);
}

static void node_counters(const kvs_test_node *d, uint64_t s[KVS_WIRE_STATS_COUNT]) {
    kvs_test_client *c = kvs_test_client_authed(d, "tenant-stats");
    kvs_test_client_stats(c, s);
    kvs_test_client_close(c);
}

START_TEST(garbage_truncated_frames_and_huge_lengths_from_plain_sockets_leave_the_node_serving) {
    uint8_t zeros[64] = {0};
    raw_send_close(node.port, zeros, sizeof zeros); /* aborted UCX 1.13's sockaddr listener */
    uint8_t junk[4096];
    kvs_test_fill(junk, sizeof junk, 77);
    raw_send_close(node.port, junk, sizeof junk);
    uint8_t truncated[4 + 50];
    memset(truncated, 0x93, sizeof truncated);
    truncated[0] = 0, truncated[1] = 0, truncated[2] = 0,
    truncated[3] = 100; /* announces 100, sends 50 */
    raw_send_close(node.port, truncated, sizeof truncated);
    uint8_t huge[4 + 4096];
    memset(huge, 0xab, sizeof huge);
    huge[0] = huge[1] = huge[2] = huge[3] = 0xff; /* 4 GiB announced */
    raw_send_close(node.port, huge, sizeof huge);
    /* a well-framed message that is not msgpack */
    uint8_t framed[4 + 16] = {0, 0, 0, 16};
    memset(framed + 4, 0xc1, 16);
    raw_send_close(node.port, framed, sizeof framed);
    ck_assert_msg(kvs_test_node_alive(&node), "the node died of garbage from a plain socket");
    a_real_client_is_served(&node, 1);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    node_counters(&node, s);
    /* each is refused, or closed at accept when the other four still hold the handshake slots */
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED],
                      5);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 0);
    ck_assert(kvs_test_node_alive(&node));
}
END_TEST

/* The IPv4 TCP sockets pid listens on other than port `skip` (its UCX transport's own listeners), up to
 * max: their addresses (as sin_addr.s_addr, 0 for any) and ports. */
static unsigned listening_ports(pid_t pid, uint16_t skip, uint32_t *addrs, uint16_t *ports,
                                unsigned max) {
    char path[64], line[512];
    unsigned long long inodes[64];
    unsigned n_inodes = 0, n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    for (struct dirent *de; (de = readdir(dir)) != NULL && n_inodes < 64;) {
        char link[128], target[128];
        snprintf(link, sizeof link, "%s/%s", path, de->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        if (sscanf(target, "socket:[%llu]", &inodes[n_inodes]) == 1) n_inodes++;
    }
    ck_assert_int_eq(closedir(dir), 0);
    snprintf(path, sizeof path, "/proc/%d/net/tcp", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f) && n < max) {
        unsigned addr, port, state;
        unsigned long long inode;
        if (sscanf(line, " %*u: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %llu", &addr, &port,
                   &state, &inode) != 4 ||
            state != 0x0a || port == skip)
            continue;
        for (unsigned i = 0; i < n_inodes; i++)
            if (inodes[i] ==
                inode) { /* /proc prints the address as the host-order view of its bytes */
                addrs[n] = addr ? addr : htonl(INADDR_LOOPBACK);
                ports[n++] = (uint16_t)port;
            }
    }
    ck_assert_int_eq(fclose(f), 0);
    return n;
}

/* Nothing of ours listens there, but UCX's tcp transport does (endpoints from worker addresses reach
 * it): whatever a plain socket sends to those ports must not take the node down either. */
START_TEST(garbage_sent_to_the_nodes_ucx_ports_leaves_it_serving) {
    uint16_t ports[16];
    uint32_t addrs[16];
    unsigned n = listening_ports(node.pid, node.port, addrs, ports, 16);
    ck_assert_msg(n >= 1, "no UCX listening port found beside the control port %u", node.port);
    printf("garbage sent to %u UCX listening port(s) of the node, first %u\n", n, ports[0]);
    uint8_t zeros[64] = {0}, junk[65536],
            huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    kvs_test_fill(junk, sizeof junk, 91);
    for (unsigned i = 0; i < n; i++) {
        raw_send_close_to(addrs[i], ports[i], zeros, sizeof zeros);
        raw_send_close_to(addrs[i], ports[i], junk, sizeof junk);
        raw_send_close_to(addrs[i], ports[i], huge, sizeof huge);
        int fd = raw_connect_to(addrs[i], ports[i]); /* a trickle that stops halfway */
        for (int b = 0; b < 3; b++) {
            ssize_t k = send(fd, junk + b, 1, MSG_NOSIGNAL); /* or refused: UCX closed it */
            ck_assert(k == 1 || (k < 0 && (errno == EPIPE || errno == ECONNRESET)));
            kvs_test_pause_ms(100);
        }
        ck_assert_int_eq(close(fd), 0);
    }
    ck_assert_msg(kvs_test_node_alive(&node), "the node died of garbage sent to a UCX port");
    a_real_client_is_served(&node, 3);
    ck_assert(kvs_test_node_alive(&node));
}
END_TEST

/* The node's end of our connection from local port `port`, duplicated into this process
 * (pidfd_getfd: the node is our child), or -1 while the node has not accepted it yet. */
static int node_end_of(uint16_t port) {
    int pidfd = (int)syscall(SYS_pidfd_open, node.pid, 0);
    ck_assert_msg(pidfd >= 0, "pidfd_open: %s", strerror(errno));
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)node.pid);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, atoi(e->d_name), 0);
        if (fd < 0) continue;
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0 && peer.sin_family == AF_INET &&
            ntohs(peer.sin_port) == port)
            found = fd;
        else
            close(fd);
    }
    closedir(d);
    close(pidfd);
    return found;
}

START_TEST(the_nodes_connections_send_small_answers_without_waiting_for_acks) {
    /* Nagle's algorithm would hold a small answer written right after another (PUT_REPLY frames of
     * a client's PUTs on the stream, a GET answer's last group) until the client acknowledges the
     * first, which a client that waits for the answer delays by up to 40 ms */
    int fd = raw_connect(node.port);
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&me, &len), 0);
    int theirs = -1;
    for (int i = 0; i < 200 && (theirs = node_end_of(ntohs(me.sin_port))) < 0; i++)
        usleep(10000); /* until the node has accepted it */
    ck_assert_msg(theirs >= 0, "the node did not accept the connection");
    int nodelay = 0;
    len = sizeof nodelay;
    ck_assert_int_eq(getsockopt(theirs, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
    ck_assert_msg(nodelay, "the node's connection waits for ACKs before sending small writes");
    close(theirs);
    close(fd);
}
END_TEST

START_TEST(a_slowloris_is_closed_at_the_handshake_deadline_while_others_are_served) {
    /* a valid prefix, then one byte every 400 ms: never a whole frame before the 3 s deadline */
    int fd = raw_connect(node.port);
    const uint8_t prefix[4] = {0, 0, 0, 200};
    ck_assert_int_eq(send(fd, prefix, sizeof prefix, MSG_NOSIGNAL), 4);
    int closed = 0;
    uint8_t b = 0x93;
    for (int i = 0; i < 30 && !closed; i++) {
        if (i == 2) a_real_client_is_served(&node, 2); /* not stalled by the trickle */
        if (send(fd, &b, 1, MSG_NOSIGNAL) != 1) closed = 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 400) > 0) {
            uint8_t buf[64];
            ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN)) closed = 1;
        }
    }
    ck_assert_int_eq(close(fd), 0);
    ck_assert_msg(closed, "the node kept a handshake that trickled bytes for 12 s");
    ck_assert(kvs_test_node_alive(&node));
    uint64_t s[KVS_WIRE_STATS_COUNT];
    node_counters(&node, s);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_TIMEOUTS], 1);
}
END_TEST

/* Refusals are logged at most once a second, however fast they come: 24 idle connections (more
 * than the handshake slots) and three seconds of connections of junk (thousands) logged one line
 * per refusal before, some 14,000 lines a second. A real client still connects while the idle ones
 * are held. */
START_TEST(refusals_are_logged_at_most_once_a_second) {
    kvs_test_node logged;
    kvs_test_node_capture_stderr = 1;
    kvs_test_node_start_suite(&logged, KVS_TEST_NODE_DRAM_YAML, 1, 0);
    kvs_test_node_capture_stderr = 0;
    int idle[24];
    double t0 = kvs_test_now_ms();
    for (int i = 0; i < 24; i++) idle[i] = raw_connect(logged.port);
    uint8_t junk[64];
    memset(junk, 0x5a, sizeof junk);
    junk[0] = 0x7f, junk[1] = 0xff, junk[2] = 0xff, junk[3] = 0xff;
    unsigned sent = 0;
    while (kvs_test_now_ms() - t0 < 3000.0 || sent < 2000) { /* three seconds of refusals */
        raw_send_close(logged.port, junk, sizeof junk);
        sent++;
    }
    a_real_client_is_served(&logged, 11);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    node_counters(&logged, s);
    double seconds = (kvs_test_now_ms() - t0) / 1000.0;
    for (int i = 0; i < 24; i++) ck_assert_int_eq(close(idle[i]), 0);
    unsigned lines = kvs_test_node_log_lines(&logged, "kvstrata-node:");
    printf("refusals: %llu in %.1f s, %u log lines\n",
           (unsigned long long)(s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] +
                                s[KVS_WIRE_STAT_CONNECTIONS_REJECTED]),
           seconds, lines);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED],
                      1000);
    ck_assert_msg(lines <= (unsigned)seconds + 3, "%u lines in %.1f s", lines, seconds);
    (void)kvs_test_node_stop(&logged);
}
END_TEST

/* An authenticated tenant starts a request frame on its stream and trickles the rest: the node reads
 * it as it comes, so another tenant's whole session (handshake, put, get) runs meanwhile, well within
 * the node's 3 s timeout, which a loop that waited for the frame would have spent on the trickle. */
START_TEST(a_tenant_trickling_a_stream_frame_holds_up_no_other_tenant) {
    kvs_test_client *slow = kvs_test_client_authed(&node, "tenant-slow");
    const uint8_t prefix[4] = {0, 0, 0, 200};
    ck_assert_int_eq(send(slow->ctl_fd, prefix, 3, MSG_NOSIGNAL), 3);
    kvs_test_pause_ms(50); /* the node has seen the first bytes */
    double t0 = kvs_test_now_ms();
    a_real_client_is_served(&node, 7);
    double took = kvs_test_now_ms() - t0;
    ck_assert_msg(took < kvs_test_scaled_ms(1500), "another tenant waited %.0f ms", took);
    ck_assert_int_eq(send(slow->ctl_fd, prefix + 3, 1, MSG_NOSIGNAL), 1);
    uint8_t junk[8] = {0xc1};
    ck_assert_int_eq(send(slow->ctl_fd, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
    kvs_test_client_close(slow);
    ck_assert(kvs_test_node_alive(&node));
}
END_TEST

/* A PUT on the stream whose object's bytes trickle: the node reads them as they come, so another
 * tenant's whole session runs meanwhile (before, the node read the object blocking, up to its 3 s
 * timeout); once the last bytes come the object is stored and the PUT answered. A frame or PUT left
 * half sent ends its session at the timeout. */
START_TEST(a_tenant_trickling_a_puts_object_holds_up_no_other_tenant) {
    kvs_test_client *slow = kvs_test_client_authed(&node, "tenant-trickle");
    enum { LEN = 64 * 1024 };
    uint8_t key[16], frame[256];
    kvs_test_node_key(key, 4343);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    e.length = LEN;
    e.by_message = 1;
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_PUT, 9);
    m.entries = &e;
    m.n_entries = 1;
    size_t len = 0;
    char err[128];
    ck_assert_int_eq(kvs_control_encode(&m, frame, sizeof frame, &len, err, sizeof err), KVS_OK);
    uint8_t *object = malloc(LEN);
    ck_assert_ptr_nonnull(object);
    kvs_test_fill(object, LEN, 77);
    ck_assert_int_eq(send(slow->ctl_fd, frame, len, MSG_NOSIGNAL), (ssize_t)len);
    ck_assert_int_eq(send(slow->ctl_fd, object, 100, MSG_NOSIGNAL), 100);
    kvs_test_pause_ms(50); /* the node has the frame and the first bytes */
    double t0 = kvs_test_now_ms();
    a_real_client_is_served(&node, 12);
    double took = kvs_test_now_ms() - t0;
    ck_assert_msg(took < kvs_test_scaled_ms(1500), "another tenant waited %.0f ms", took);
    ck_assert_int_eq(send(slow->ctl_fd, object + 100, LEN - 100, MSG_NOSIGNAL), LEN - 100);
    uint8_t reply[4096];
    size_t rlen = 0;
    ck_assert_int_eq(kvs_stream_read_frame(&slow->ch, reply, sizeof reply, &rlen,
                                           kvs_now_ns() + 5000000000ull, err, sizeof err),
                     KVS_OK);
    kvs_wire_entry entries[4];
    kvs_wire_msg rep;
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_decode(reply, rlen, entries, 4, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_PUT_REPLY);
    ck_assert_uint_eq(rep.n_entries, 1);
    ck_assert_int_eq(entries[0].status, KVS_OK);
    kvs_test_client_close(slow);
    kvs_test_client *check = kvs_test_client_authed(&node, "tenant-trickle");
    uint64_t got = 0;
    ck_assert_int_eq(kvs_test_client_get(check, key, 0, LEN, &got), KVS_OK);
    ck_assert_uint_eq(got, LEN);
    ck_assert_mem_eq(check->mem, object, LEN);
    kvs_test_client_close(check);
    /* half sent, then nothing: closed at the timeout (3 s), the node serving meanwhile */
    kvs_test_client *stuck = kvs_test_client_authed(&node, "tenant-trickle");
    ck_assert_int_eq(send(stuck->ctl_fd, frame, len, MSG_NOSIGNAL), (ssize_t)len);
    ck_assert_int_eq(send(stuck->ctl_fd, object, 100, MSG_NOSIGNAL), 100);
    t0 = kvs_test_now_ms();
    ck_assert(kvs_test_control_closed(stuck->ctl_fd));
    took = kvs_test_now_ms() - t0;
    ck_assert_msg(took > 2000 && took < kvs_test_scaled_ms(6000), "closed after %.0f ms", took);
    kvs_test_client_close(stuck);
    free(object);
    a_real_client_is_served(&node, 13);
}
END_TEST

/* A GET on the stream whose client does not read the answer (100 MiB, far past what the sockets
 * hold): the node writes what the socket takes and serves everyone else meanwhile (before, it wrote
 * the answer blocking, up to its 3 s timeout); the GET's session ends at the timeout. */
START_TEST(a_tenant_not_reading_a_get_answer_holds_up_no_other_tenant) {
    kvs_test_client *slow = kvs_test_client_authed(&node, "tenant-unread");
    uint8_t key[16], frame[8192];
    kvs_test_node_key(key, 4444);
    kvs_test_fill(slow->mem, 1024 * 1024, 5);
    ck_assert_int_eq(kvs_test_client_put(slow, key, 0, 1024 * 1024, 0), KVS_OK);
    kvs_wire_entry e[100];
    memset(e, 0, sizeof e);
    for (int i = 0; i < 100; i++)
        e[i] = (kvs_wire_entry){.key = key, .length = 1024 * 1024, .by_message = 1};
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_GET, 10);
    m.entries = e;
    m.n_entries = 100;
    size_t len = 0;
    char err[128];
    ck_assert_int_eq(kvs_control_encode(&m, frame, sizeof frame, &len, err, sizeof err), KVS_OK);
    ck_assert_int_eq(send(slow->ctl_fd, frame, len, MSG_NOSIGNAL), (ssize_t)len);
    kvs_test_pause_ms(100); /* the node has filled the socket */
    double t0 = kvs_test_now_ms();
    a_real_client_is_served(&node, 14);
    double took = kvs_test_now_ms() - t0;
    ck_assert_msg(took < kvs_test_scaled_ms(1500), "another tenant waited %.0f ms", took);
    /* not read for past the node's 3 s timeout: ended by then, so what is drained ends in EOF
     * before the 100 MiB could have come */
    kvs_test_pause_ms(3500);
    uint64_t drained = 0;
    static uint8_t sink[1 << 16];
    for (;;) {
        ssize_t k = recv(slow->ctl_fd, sink, sizeof sink, 0);
        if (k <= 0) break;
        drained += (uint64_t)k;
    }
    ck_assert_msg(drained < 100ull * 1024 * 1024, "the whole answer came (%llu bytes)",
                  (unsigned long long)drained);
    kvs_test_client_close(slow);
    a_real_client_is_served(&node, 15);
}
END_TEST

/* A GET on the stream that the client reads slowly, its object deleted meanwhile and its room
 * taken by another tenant's put: the answer carries the first tenant's bytes or a miss, never the
 * other tenant's (the node copies each object out of the tiers when its group begins; a slab held
 * by a pin across loop turns was handed to the other tenant's put by the delete). */
START_TEST(a_slow_get_never_carries_another_tenants_bytes) {
    enum { LEN = 1024 * 1024, N = 40 };
    kvs_test_client *a = kvs_test_client_authed(&node, "tenant-first");
    kvs_test_client *b = kvs_test_client_authed(&node, "tenant-second");
    uint8_t key[16], frame[8192];
    kvs_test_node_key(key, 4545);
    kvs_test_fill(a->mem, LEN, 21);
    kvs_test_fill(b->mem, LEN, 22);
    ck_assert_int_eq(kvs_test_client_put(a, key, 0, LEN, 0), KVS_OK);
    kvs_wire_entry e[N];
    for (int i = 0; i < N; i++) e[i] = (kvs_wire_entry){.key = key, .length = LEN, .by_message = 1};
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_GET, 11);
    m.entries = e;
    m.n_entries = N;
    size_t len = 0;
    char err[128];
    ck_assert_int_eq(kvs_control_encode(&m, frame, sizeof frame, &len, err, sizeof err), KVS_OK);
    ck_assert_int_eq(send(a->ctl_fd, frame, len, MSG_NOSIGNAL), (ssize_t)len);
    kvs_test_pause_ms(100); /* the socket is full, an object half sent */
    kvs_wire_entry d = {.key = key};
    kvs_wire_msg del, rep;
    kvs_wire_msg_init(&del, KVS_WIRE_DELETE, 0);
    del.entries = &d;
    del.n_entries = 1;
    kvs_test_client_request(a, &del, &rep);
    ck_assert_int_eq(rep.entries[0].status, KVS_OK);
    for (uint32_t i = 0; i < 4; i++) { /* the freed room, and more, taken by the other tenant */
        uint8_t k2[16];
        kvs_test_node_key(k2, 4600 + i);
        ck_assert_int_eq(kvs_test_client_put(b, k2, 0, LEN, 0), KVS_OK);
    }
    uint8_t *got = malloc(LEN);
    ck_assert_ptr_nonnull(got);
    uint32_t hits = 0;
    uint64_t deadline = kvs_now_ns() + 5000000000ull;
    for (uint32_t answered = 0; answered < N;) {
        uint8_t head[KVS_STREAM_GROUP_BYTES], rec[KVS_STREAM_RECORD_BYTES];
        uint32_t count = 0;
        ck_assert_int_eq(kvs_stream_read(&a->ch, head, sizeof head, deadline, err, sizeof err),
                         KVS_OK);
        ck_assert_int_eq(kvs_stream_group_decode(head, 11, N - answered, &count, err, sizeof err),
                         KVS_OK);
        for (uint32_t i = 0; i < count; i++) {
            kvs_status st;
            uint64_t olen = 0;
            ck_assert_int_eq(kvs_stream_read(&a->ch, rec, sizeof rec, deadline, err, sizeof err),
                             KVS_OK);
            kvs_stream_record_decode(rec, &st, &olen);
            if (st != KVS_OK) continue;
            ck_assert_uint_eq(olen, LEN);
            ck_assert_int_eq(kvs_stream_read(&a->ch, got, LEN, deadline, err, sizeof err), KVS_OK);
            ck_assert_msg(kvs_test_bytes_match(got, LEN, 21), "object %u of the answer is not ours",
                          answered + i);
            hits++;
        }
        answered += count;
    }
    ck_assert_uint_ge(hits, 1);
    ck_assert_uint_lt(hits, N); /* the delete took effect within the answer */
    free(got);
    kvs_test_client_close(a);
    kvs_test_client_close(b);
}
END_TEST

/* A PUT on the stream announcing an object of 2^62 bytes ends its session at once (its bytes are
 * not read and dropped for timeout_ms), and the node serves on. */
START_TEST(a_put_announcing_a_huge_object_ends_its_session_at_once) {
    kvs_test_client *c = kvs_test_client_authed(&node, "tenant-huge");
    uint8_t key[16], buf[256];
    kvs_test_node_key(key, 4242);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    e.length = 1ull << 62;
    e.by_message = 1;
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_PUT, 1);
    m.entries = &e;
    m.n_entries = 1;
    size_t len = 0;
    char err[128];
    ck_assert_int_eq(kvs_control_encode(&m, buf, sizeof buf, &len, err, sizeof err), KVS_OK);
    double t0 = kvs_test_now_ms();
    ck_assert_int_eq(send(c->ctl_fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
    ck_assert_int_eq(send(c->ctl_fd, buf, 16, MSG_NOSIGNAL), 16); /* a trickle of its "object" */
    ck_assert(kvs_test_control_closed(c->ctl_fd));
    double took = kvs_test_now_ms() - t0;
    ck_assert_msg(took < kvs_test_scaled_ms(1500), "the session ended after %.0f ms", took);
    kvs_test_client_close(c);
    a_real_client_is_served(&node, 8);
}
END_TEST

START_TEST(two_thousand_junk_connections_do_not_grow_the_nodes_file_descriptors) {
    a_real_client_is_served(&node, 3); /* the node's own fds for UCX are made by now */
    unsigned before = fd_count(node.pid);
    uint8_t junk[4 + 4096];
    memset(junk, 0x5a, sizeof junk);
    junk[0] = 0x7f, junk[1] = 0xff, junk[2] = 0xff,
    junk[3] = 0xff; /* a huge length, a few KB, close */
    for (int i = 0; i < 2000; i++) raw_send_close(node.port, junk, sizeof junk);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(20000);
    do { /* every refusal is counted within a generous deadline */
        kvs_test_pause_ms(100);
        node_counters(&node, s);
    } while (s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED] < 2000 &&
             kvs_test_now_ms() < until);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED],
                      2000);
    unsigned after = fd_count(node.pid);
    printf("node fds before 2000 junk connections: %u, after: %u (refused %llu, rejected at accept "
           "%llu)\n",
           before, after, (unsigned long long)s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS],
           (unsigned long long)s[KVS_WIRE_STAT_CONNECTIONS_REJECTED]);
    ck_assert_msg(after <= before + 2, "node fds grew from %u to %u", before, after);
    a_real_client_is_served(&node, 4);
}
END_TEST

/* Idle connections over the handshake cap: each new one takes the slot of the oldest idle one, so
 * the flood holds at most the cap, a session is served throughout, and a new client still logs in
 * while the flood's connections hold every slot. */
START_TEST(connections_over_the_handshake_cap_evict_the_oldest_while_a_session_is_served) {
    kvs_test_client *c =
        kvs_test_client_authed(&node, "tenant-a"); /* authenticated before the flood */
    int idle[10];
    for (int i = 0; i < 10; i++) {
        idle[i] = raw_connect(node.port); /* say nothing: hold handshake slots */
        kvs_test_pause_ms(20);            /* accepted one after another, oldest first */
    }
    int refused = 0;
    for (int i = 0; i < 10; i++) {
        struct pollfd p = {.fd = idle[i], .events = POLLIN};
        uint8_t buf[8];
        if (poll(&p, 1, i >= 6 ? 0 : kvs_test_scaled_ms(5000)) > 0 &&
            recv(idle[i], buf, sizeof buf, MSG_DONTWAIT) == 0)
            refused++;
        else
            ck_assert_int_ge(i, 6); /* --max-handshakes 4: the 6 oldest are closed */
    }
    ck_assert_int_eq(refused, 6);
    kvs_test_client *late = kvs_test_client_authed(&node, "tenant-b"); /* takes a flood's slot */
    kvs_test_client_close(late);
    uint8_t key[16];
    kvs_test_node_key(key, 3000);
    kvs_test_fill(c->mem, 64 * KIB, 9);
    ck_assert_int_eq(kvs_test_client_put(c, key, 0, 64 * KIB, 0), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(kvs_test_client_get(c, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_int_eq(memcmp(c->mem + MIB, c->mem, 64 * KIB), 0);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    kvs_test_client_stats(c, s);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_CONNECTIONS_REJECTED], 6);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(close(idle[i]), 0);
    kvs_test_client_close(c);
    a_real_client_is_served(&node, 5); /* slots free again once the idle ones are gone */
}
END_TEST

int main(void) {
    Suite *s = suite_create("node_control");
    TCase *tc = tcase_create("handshake");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, handshake_with_the_right_key_is_accepted);
    tcase_add_test(tc, handshake_with_a_wrong_key_is_refused_and_the_connection_closed);
    tcase_add_test(tc, requests_before_the_handshake_are_refused_with_state);
    tcase_add_test(tc, a_tenant_s_key_logs_in_as_that_tenant_only);
    tcase_add_test(tc, a_crafted_worker_address_is_refused_and_the_node_lives);
    tcase_add_test(tc, a_tenant_holds_at_most_its_share_of_sessions);
    tcase_add_test(tc, a_tenant_over_its_share_evicts_its_own_objects_first);
    tcase_add_test(tc, a_slow_get_never_carries_another_tenants_bytes);
    tcase_add_test(tc, sighup_rotates_the_master_key_without_a_restart);
    tcase_add_test(tc, a_crafted_rkey_ends_its_session_and_the_node_lives);
    tcase_add_test(tc, the_nodes_connections_send_small_answers_without_waiting_for_acks);
    suite_add_tcase(s, tc);
    TCase *hostile = tcase_create("hostile");
    tcase_add_checked_fixture(hostile, setup, teardown);
    tcase_set_timeout(hostile, 60);
    tcase_add_test(
        hostile,
        garbage_truncated_frames_and_huge_lengths_from_plain_sockets_leave_the_node_serving);
    tcase_add_test(hostile, garbage_sent_to_the_nodes_ucx_ports_leaves_it_serving);
    tcase_add_test(hostile, two_thousand_junk_connections_do_not_grow_the_nodes_file_descriptors);
    tcase_add_test(hostile,
                   connections_over_the_handshake_cap_evict_the_oldest_while_a_session_is_served);
    suite_add_tcase(s, hostile);
    /* measures the node's handshake deadline: run by test_node_control_timing (label timing) */
    TCase *timing = tcase_create("hostile_timing");
    tcase_set_tags(timing, "timing");
    tcase_add_checked_fixture(timing, setup, teardown);
    tcase_set_timeout(timing, 60);
    tcase_add_test(timing, a_slowloris_is_closed_at_the_handshake_deadline_while_others_are_served);
    tcase_add_test(timing, a_tenant_trickling_a_stream_frame_holds_up_no_other_tenant);
    tcase_add_test(timing, refusals_are_logged_at_most_once_a_second);
    tcase_add_test(timing, a_tenant_trickling_a_puts_object_holds_up_no_other_tenant);
    tcase_add_test(timing, a_tenant_not_reading_a_get_answer_holds_up_no_other_tenant);
    tcase_add_test(timing, a_put_announcing_a_huge_object_ends_its_session_at_once);
    suite_add_tcase(s, timing);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
