/* fuzz_handshake.c - libFuzzer target: a handshake as a peer without the key would drive it. The
 * input is up to four frames (a 2-byte little-endian length, then a message); the node's side takes
 * a HELLO, then an AUTH, each decoded first, and the client's side checks an AUTH_OK's proof against
 * the transcript so far. Nothing may crash, leak or be accepted: no input makes a valid proof, so an
 * accepted AUTH or AUTH_OK aborts. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ucx/auth.h"
#include "backends/ucx/wire.h"

static kvs_wire_entry entries[KVS_WIRE_MAX_KEYS];

/* The next frame of the input, or 0 when it is used up. */
static int next_frame(const uint8_t **data, size_t *size, const uint8_t **frame, size_t *len) {
    if (*size < 2) return 0;
    size_t n = (size_t)(*data)[0] | (size_t)(*data)[1] << 8;
    *data += 2;
    *size -= 2;
    if (n > *size) n = *size;
    *frame = *data;
    *len = n;
    *data += n;
    *size -= n;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kvs_remote_psk master;
    if (!master.len) {
        uint8_t bytes[32];
        for (int i = 0; i < 32; i++) bytes[i] = (uint8_t)(i * 7 + 3);
        if (kvs_remote_psk_set(&master, bytes, sizeof bytes, NULL, 0) != KVS_OK) abort();
    }
    kvs_remote_auth_node node;
    memset(&node, 0, sizeof node);
    const uint8_t *frame;
    size_t len;
    char err[256];
    for (int i = 0; i < 4 && next_frame(&data, &size, &frame, &len); i++) {
        kvs_wire_msg msg;
        kvs_wire_refusal why;
        memset(&why, 0, sizeof why);
        if (kvs_wire_decode(frame, len, entries, KVS_WIRE_MAX_KEYS, &msg, &why) != KVS_OK) continue;
        const uint8_t *challenge, *proof;
        switch (msg.type) {
            case KVS_WIRE_HELLO:
                (void)kvs_remote_auth_node_hello(&node, &master, &msg, &challenge, &proof, err,
                                                 sizeof err);
                break;
            case KVS_WIRE_AUTH:
                if (kvs_remote_auth_node_check(&node, &msg, err, sizeof err) == KVS_OK) abort();
                break;
            case KVS_WIRE_AUTH_OK: {
                /* a client that sent HELLO and AUTH checks the node's proof of all of it */
                kvs_remote_transcript t;
                memset(&t, 0, sizeof t);
                t.tenant = node.tenant_len ? node.tenant : "t";
                t.tenant_len = node.tenant_len ? node.tenant_len : 1;
                t.nonce = node.nonce;
                t.challenge = node.challenge;
                t.node_proof = node.node_proof;
                kvs_remote_transcript_ok(&t, node.client_proof, &msg);
                if (msg.proof && kvs_remote_proof_check(&master, KVS_REMOTE_PROOF_OK, &t, msg.proof,
                                                        KVS_WIRE_PROOF_BYTES) == KVS_OK)
                    abort();
                break;
            }
            default: break;
        }
    }
    kvs_remote_auth_node_clear(&node);
    return 0;
}
