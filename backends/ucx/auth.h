/* auth.h - the remote tier's connect handshake and tenant namespacing (OpenSSL libcrypto).
 *
 * HELLO (tenant, client nonce) -> CHALLENGE (32 fresh random bytes from the node, the node's proof)
 * -> AUTH (the client's proof, its worker address) -> AUTH_OK (the node's worker address, the session
 * token, the node's proof of all of it) or ERROR. Each proof is keyed with the tenant's own key and
 * covers the whole transcript so far (kvs_remote_transcript). A proof answers one challenge; the node
 * consumes the challenge on the first AUTH, right or wrong, so a recorded AUTH fails on any other
 * connection. This authenticates the handshake only: nothing here encrypts or signs later traffic.
 * All calls are thread-safe on distinct objects. */
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

/* A tenant's key: HMAC-SHA256(master, u32 big-endian len(label) || label || u32 big-endian
 * len(tenant) || tenant) with label "kvstrata-tenant-key-v1", 32 bytes. The node holds the master key and derives each tenant's at its HELLO; a client
 * holds only its own tenant's (`kvstrata-node --tenant-key`), so it can act as no other tenant. */
kvs_status kvs_remote_tenant_psk(const kvs_remote_psk *master, const char *tenant,
                                 size_t tenant_len, kvs_remote_psk *out);

/* The TLS 1.3 pre-shared key of a tenant's key (`encrypt: true`, channel.h): HMAC-SHA256(tenant key,
 * u32 big-endian len(label) || label) with label "kvstrata-tls-psk-v1", 32 bytes. Its own key, so
 * nothing TLS does with it touches the handshake proofs' key. */
kvs_status kvs_remote_tls_psk(const kvs_remote_psk *tenant_key, uint8_t out[KVS_WIRE_PROOF_BYTES]);

/* Everything both sides sent in one handshake, as each side saw it. Every proof is an HMAC-SHA256
 * under the tenant's key over a label, the wire version and the fields up to its own message, each
 * as a 4-byte big-endian length and its bytes: anything changed in flight fails the next proof. */
typedef struct kvs_remote_transcript {
    const char *tenant; /* HELLO */
    size_t tenant_len;
    const uint8_t *nonce;      /* HELLO: KVS_WIRE_NONCE_BYTES */
    const uint8_t *challenge;  /* CHALLENGE: KVS_WIRE_CHALLENGE_BYTES */
    const uint8_t *node_proof; /* CHALLENGE: the node's proof of the fields above */
    /* AUTH */
    const uint8_t *client_worker_addr;
    uint32_t client_worker_addr_len;
    const uint8_t *host_id;
    uint32_t host_id_len;
    uint32_t pid;
    const uint8_t *client_proof; /* AUTH: the client's proof of everything above */
    /* AUTH_OK */
    const char *transports;
    uint32_t transports_len;
    const uint8_t *node_worker_addr;
    uint32_t node_worker_addr_len;
    const uint8_t *session_token; /* KVS_WIRE_SESSION_TOKEN_BYTES, or NULL */
    const char *shared_tier;
    uint32_t shared_tier_len;
    uint64_t shared_tier_capacity, shared_tier_max_object;
} kvs_remote_transcript;

typedef enum kvs_remote_proof_kind {
    KVS_REMOTE_PROOF_NODE = 0,   /* CHALLENGE: tenant, nonce, challenge */
    KVS_REMOTE_PROOF_CLIENT = 1, /* AUTH: and the node's proof, the client's worker address, host
                                  * id and pid */
    KVS_REMOTE_PROOF_OK = 2,     /* AUTH_OK: and the client's proof, transports, the node's worker
                                  * address, the session token and the shared tier */
} kvs_remote_proof_kind;

/* The proof of `kind` over t under key (a tenant's key). KVS_EINVAL for a field it needs missing. */
kvs_status kvs_remote_proof(const kvs_remote_psk *key, kvs_remote_proof_kind kind,
                            const kvs_remote_transcript *t, uint8_t proof[KVS_WIRE_PROOF_BYTES]);
/* KVS_OK when proof (proof_len bytes) is that proof; KVS_EINVAL otherwise (compared in constant
 * time). */
kvs_status kvs_remote_proof_check(const kvs_remote_psk *key, kvs_remote_proof_kind kind,
                                  const kvs_remote_transcript *t, const uint8_t *proof,
                                  size_t proof_len);

/* t's AUTH_OK fields from ok, and the client's proof they follow. */
void kvs_remote_transcript_ok(kvs_remote_transcript *t, const uint8_t *client_proof,
                              const kvs_wire_msg *ok);

/* Node side of one connection's handshake. One per connection, owned by its connection thread. */
typedef struct kvs_remote_auth_node {
    uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES];
    uint8_t nonce[KVS_WIRE_NONCE_BYTES];
    char tenant[KVS_WIRE_MAX_TENANT_BYTES + 1]; /* NUL-terminated once a HELLO was taken */
    size_t tenant_len;
    kvs_remote_psk key; /* the tenant's, derived at HELLO; wiped once the handshake ends */
    uint8_t node_proof[KVS_WIRE_PROOF_BYTES];
    uint8_t client_proof[KVS_WIRE_PROOF_BYTES];
    int state; /* internal: 0 fresh, 1 challenge issued, 2 authenticated, 3 refused */
} kvs_remote_auth_node;

/* Take a decoded HELLO: derive the tenant's key from master, make a fresh challenge and the node's
 * proof; *challenge_out and *proof_out point at them (inside node) for the CHALLENGE reply.
 * KVS_ESTATE if a HELLO was already taken. */
kvs_status kvs_remote_auth_node_hello(kvs_remote_auth_node *node, const kvs_remote_psk *master,
                                      const kvs_wire_msg *hello, const uint8_t **challenge_out,
                                      const uint8_t **proof_out, char *error, size_t error_len);
/* Check an AUTH (its proof covers the transcript and its own worker address, host id and pid). The
 * challenge is used up either way. KVS_OK: authenticated; KVS_EINVAL: wrong proof; KVS_ESTATE: no
 * live challenge. */
kvs_status kvs_remote_auth_node_check(kvs_remote_auth_node *node, const kvs_wire_msg *auth,
                                      char *error, size_t error_len);
/* The node's proof for the AUTH_OK `ok` (its other fields set) of an accepted handshake, into
 * proof; the tenant's key is wiped after it. KVS_ESTATE when not accepted. */
kvs_status kvs_remote_auth_node_ok_proof(kvs_remote_auth_node *node, const kvs_wire_msg *auth,
                                         const kvs_wire_msg *ok,
                                         uint8_t proof[KVS_WIRE_PROOF_BYTES]);
/* 1 when this connection finished the handshake and was accepted. */
int kvs_remote_auth_node_ok(const kvs_remote_auth_node *node);
/* Wipe what the handshake holds (the tenant's key). */
void kvs_remote_auth_node_clear(kvs_remote_auth_node *node);

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
