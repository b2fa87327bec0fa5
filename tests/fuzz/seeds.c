/* seeds.c - the starting corpus of tests/fuzz/run.sh: one valid HELLO, AUTH and AUTH_OK (and a
 * GET and a PUT), each as it goes on the wire, written to DIR/wire-*; and the three framed as one
 * handshake (2-byte little-endian lengths) to DIR/handshake-0. A program, not a fuzz target. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ucx/wire.h"

static uint8_t bufs[5][4096];
static size_t lens[5];

static void put_file(const char *dir, const char *name, const void *a, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "seeds: cannot write %s\n", path);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    uint8_t b32[32], addr[64], tok[KVS_WIRE_SESSION_TOKEN_BYTES], key[16] = {1}, rkey[24] = {2};
    memset(b32, 0x11, sizeof b32);
    memset(addr, 0x01, sizeof addr);
    memset(tok, 0x22, sizeof tok);
    kvs_wire_entry e = {
        .key = key, .length = 4096, .remote_addr = 0x1000, .rkey = rkey, .rkey_len = sizeof rkey};
    kvs_wire_msg m[5];
    for (int i = 0; i < 5; i++) kvs_wire_msg_init(&m[i], 0, 0);
    kvs_wire_msg_init(&m[0], KVS_WIRE_HELLO, 0);
    m[0].tenant = "tenant-a";
    m[0].tenant_len = 8;
    m[0].nonce = b32;
    kvs_wire_msg_init(&m[1], KVS_WIRE_AUTH, 0);
    m[1].proof = b32;
    m[1].worker_addr = addr;
    m[1].worker_addr_len = sizeof addr;
    kvs_wire_msg_init(&m[2], KVS_WIRE_AUTH_OK, 0);
    m[2].proof = b32;
    m[2].worker_addr = addr;
    m[2].worker_addr_len = sizeof addr;
    m[2].session_token = tok;
    m[2].transports = "tcp";
    m[2].transports_len = 3;
    kvs_wire_msg_init(&m[3], KVS_WIRE_GET, 7);
    kvs_wire_msg_init(&m[4], KVS_WIRE_PUT, 8);
    m[3].entries = m[4].entries = &e;
    m[3].n_entries = m[4].n_entries = 1;
    uint8_t framed[3 * (4096 + 2)];
    size_t at = 0;
    for (int i = 0; i < 5; i++) {
        if (kvs_wire_encode(&m[i], bufs[i], sizeof bufs[i], &lens[i], NULL) != KVS_OK) {
            fprintf(stderr, "seeds: message %d does not encode\n", i);
            return 1;
        }
        char name[32];
        snprintf(name, sizeof name, "wire-%d", i);
        put_file(argv[1], name, bufs[i], lens[i]);
        if (i < 3) {
            framed[at++] = (uint8_t)lens[i];
            framed[at++] = (uint8_t)(lens[i] >> 8);
            memcpy(framed + at, bufs[i], lens[i]);
            at += lens[i];
        }
    }
    put_file(argv[2], "handshake-0", framed, at);
    return 0;
}
