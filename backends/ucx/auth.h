/* auth.h - the remote tier's connect handshake and tenant namespacing (OpenSSL libcrypto).
 *
 * HELLO (tenant, client nonce) -> CHALLENGE (32 fresh random bytes from the node) -> AUTH (proof) ->
 * AUTH_OK or ERROR, where proof = HMAC-SHA256(psk, "kvstrata-auth-v1" || challenge || nonce || tenant).
 * A proof answers one challenge; the node consumes the challenge on the first AUTH, right or wrong,
 * so a recorded AUTH fails on any other connection. This authenticates the peer at connect only:
 * nothing here encrypts or signs later traffic. All calls are thread-safe on distinct objects. */
#ifndef KVS_REMOTE_AUTH_H
#define KVS_REMOTE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "wire.h"

#define KVS_REMOTE_PSK_MIN_BYTES 32u
#define KVS_REMOTE_PSK_MAX_BYTES 1024u

/* A pre-shared key: the raw bytes of its file. Clear it with kvs_remote_psk_clear when done. */
typedef struct kvs_remote_psk {
    uint8_t bytes[KVS_REMOTE_PSK_MAX_BYTES];
    size_t len;
} kvs_remote_psk;

/* Load the key file at path: a regular file (not a symlink) of KVS_REMOTE_PSK_MIN_BYTES..MAX bytes
 * (all of them, newline included, are the key) with no group or other permission bits (mode 0600 or
 * 0400). Refusals: KVS_EIO (cannot open/read), KVS_EINVAL (permissions, size), with a sentence. */
kvs_status kvs_remote_psk_load(const char *path, kvs_remote_psk *out, char *error,
                               size_t error_len);
/* Use caller bytes as the key (tests, keys from elsewhere): same size rules as a file. */
kvs_status kvs_remote_psk_set(kvs_remote_psk *out, const void *bytes, size_t len, char *error,
                              size_t error_len);
/* Wipe the key bytes (OPENSSL_cleanse). */
void kvs_remote_psk_clear(kvs_remote_psk *psk);

/* Fill out with n cryptographically random bytes (RAND_bytes): client nonces, node challenges.
 * KVS_EIO when the generator fails. */
kvs_status kvs_remote_random(uint8_t *out, size_t n);

/* The client's proof for (challenge, nonce, tenant). tenant: tenant_len bytes, not NUL-terminated. */
kvs_status kvs_remote_auth_proof(const kvs_remote_psk *psk,
                                 const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                 const uint8_t nonce[KVS_WIRE_NONCE_BYTES], const char *tenant,
                                 size_t tenant_len, uint8_t proof[KVS_WIRE_PROOF_BYTES]);

/* The node's proof for (challenge, nonce, tenant), sent with its CHALLENGE: the client checks it
 * before it sends anything of its own (its proof, its worker address), so a peer that answers at a
 * node's address without the key learns nothing and can hand the client nothing for UCX to parse. */
kvs_status kvs_remote_node_proof(const kvs_remote_psk *psk,
                                 const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                 const uint8_t nonce[KVS_WIRE_NONCE_BYTES], const char *tenant,
                                 size_t tenant_len, uint8_t proof[KVS_WIRE_PROOF_BYTES]);
/* KVS_OK when proof (proof_len bytes) is the node's proof for these; KVS_EINVAL otherwise. */
kvs_status kvs_remote_node_proof_check(const kvs_remote_psk *psk,
                                       const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                       const uint8_t nonce[KVS_WIRE_NONCE_BYTES],
                                       const char *tenant, size_t tenant_len, const uint8_t *proof,
                                       size_t proof_len);

/* Node side of one connection's handshake. One per connection, owned by its connection thread. */
typedef struct kvs_remote_auth_node {
    uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES];
    uint8_t nonce[KVS_WIRE_NONCE_BYTES];
    char tenant[KVS_WIRE_MAX_TENANT_BYTES + 1]; /* NUL-terminated once a HELLO was taken */
    size_t tenant_len;
    int state; /* internal: 0 fresh, 1 challenge issued, 2 authenticated, 3 refused */
} kvs_remote_auth_node;

/* Take a decoded HELLO: remember tenant and nonce and make a fresh challenge; *challenge_out points
 * at it (inside node) for the CHALLENGE reply. KVS_ESTATE if a HELLO was already taken. */
kvs_status kvs_remote_auth_node_hello(kvs_remote_auth_node *node, const kvs_wire_msg *hello,
                                      const uint8_t **challenge_out, char *error, size_t error_len);
/* Check an AUTH proof (proof may be NULL or of the wrong length: refused). The challenge is used
 * up either way. KVS_OK: authenticated; KVS_EINVAL: wrong proof; KVS_ESTATE: no live challenge. */
kvs_status kvs_remote_auth_node_check(kvs_remote_auth_node *node, const kvs_remote_psk *psk,
                                      const uint8_t *proof, size_t proof_len, char *error,
                                      size_t error_len);
/* The node's proof for the challenge kvs_remote_auth_node_hello just made (for the CHALLENGE reply).
 * KVS_ESTATE when no challenge is live. */
kvs_status kvs_remote_auth_node_proof(const kvs_remote_auth_node *node, const kvs_remote_psk *psk,
                                      uint8_t proof[KVS_WIRE_PROOF_BYTES]);
/* 1 when this connection finished the handshake and was accepted. */
int kvs_remote_auth_node_ok(const kvs_remote_auth_node *node);

/* The key stored on the node for a tenant's key: the first 16 bytes of
 * SHA-256("kvstrata-tenant-v1" || u32 big-endian len(tenant) || tenant || key). Deterministic, and
 * two tenants never name the same stored object. tenant_len must be 1..KVS_WIRE_MAX_TENANT_BYTES. */
kvs_status kvs_remote_tenant_key(const char *tenant, size_t tenant_len, const kvs_key *key,
                                 kvs_key *out);

/* The same keys for one tenant, faster (a node hashes every key of every request): the tenant's
 * prefix is hashed once into the hasher. new returns NULL on a bad tenant or no memory. */
typedef struct kvs_remote_tenant_hasher kvs_remote_tenant_hasher;
kvs_remote_tenant_hasher *kvs_remote_tenant_hasher_new(const char *tenant, size_t tenant_len);
kvs_status kvs_remote_tenant_hasher_key(kvs_remote_tenant_hasher *h, const kvs_key *key,
                                        kvs_key *out);
void kvs_remote_tenant_hasher_free(kvs_remote_tenant_hasher *h);

/* This machine's identity for choosing shared memory: SHA-256("kvstrata-host-v1" || hostname ||
 * "\n" || kernel boot id || network namespace || pid namespace). Another machine, VM, container
 * with its own hostname, or network or pid namespace differs (UCX 1.13 shared-memory transfers between network
 * namespaces were seen to hang, so those peers use tcp). KVS_EIO when the boot id cannot be read
 * (the caller then does not offer shared memory). */
#define KVS_REMOTE_HOST_ID_BYTES 32u
kvs_status kvs_remote_host_id(uint8_t out[KVS_REMOTE_HOST_ID_BYTES]);

#endif
