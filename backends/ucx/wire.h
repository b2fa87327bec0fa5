/* wire.h - the remote tier's wire protocol: one msgpack message per transport frame, encoded into a
 * caller buffer and decoded into plain structs that point into the input buffer (no allocation).
 *
 * Every message is the msgpack array [version, type, request_id, body]; the first three fields keep
 * their place in every version, so a node can name the request of a message it cannot read. Bodies
 * are listed in docs/remote.md. All functions are pure and thread-safe (no shared state). */
#ifndef KVS_WIRE_H
#define KVS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

/* 2: AUTH carries the worker address, AUTH_OK the node's and a session token; 3: per-tenant keys,
 * every proof covers the whole handshake, AUTH_OK carries the node's */
#define KVS_WIRE_VERSION 3u

/* Limits: a decoder refuses anything over them before it reads the field's bytes; an encoder refuses
 * to write what a decoder would refuse. */
#define KVS_WIRE_MAX_MESSAGE_BYTES     (1u << 20) /* whole encoded message */
#define KVS_WIRE_MAX_KEYS              1024u      /* keys per LOOKUP/GET/PUT/DELETE and per reply */
#define KVS_WIRE_MAX_RKEY_BYTES        512u       /* one packed UCX remote key */
#define KVS_WIRE_MAX_INLINE_BYTES      4096u      /* one PUT object carried inside the message */
#define KVS_WIRE_MAX_TENANT_BYTES      64u        /* tenant name: 1..64 bytes of [A-Za-z0-9._-] */
#define KVS_WIRE_MAX_ERROR_TEXT        256u       /* ERROR sentence */
#define KVS_WIRE_MAX_HOST_ID_BYTES     64u        /* AUTH: the client's host identity */
#define KVS_WIRE_MAX_WORKER_ADDR_BYTES 16384u     /* AUTH: the client's UCX worker address */
#define KVS_WIRE_MAX_TRANSPORTS_TEXT   96u        /* AUTH_OK: transports the node's RMA uses */
#define KVS_WIRE_MAX_SHARED_TIER_NAME  200u /* AUTH_OK: the node's shared DRAM tier (shm_name) */
#define KVS_WIRE_KEY_BYTES             16u
#define KVS_WIRE_NONCE_BYTES           32u /* HELLO client nonce */
#define KVS_WIRE_CHALLENGE_BYTES       32u /* CHALLENGE */
#define KVS_WIRE_PROOF_BYTES           32u /* AUTH: HMAC-SHA256 */
#define KVS_WIRE_SESSION_TOKEN_BYTES \
    16u /* AUTH_OK: names the session in every UCX request header */

typedef enum kvs_wire_type {
    KVS_WIRE_HELLO = 1,     /* client -> node: tenant, nonce */
    KVS_WIRE_CHALLENGE = 2, /* node -> client: challenge */
    KVS_WIRE_AUTH =
        3, /* client -> node: proof [, worker_addr] or proof, host_id, worker_addr, pid */
    KVS_WIRE_AUTH_OK = 4,      /* node -> client: proof, transports, worker_addr, session_token [,
                             shared tier name, its capacity, its max object bytes] */
    KVS_WIRE_ERROR = 5,        /* either way: error_code, error_text */
    KVS_WIRE_LOOKUP = 6,       /* entries[].key */
    KVS_WIRE_LOOKUP_REPLY = 7, /* entries[].present */
    KVS_WIRE_GET = 8,          /* entries[].key, remote_addr, length (destination capacity), rkey */
    KVS_WIRE_GET_REPLY = 9,    /* entries[].status, length (bytes written) */
    KVS_WIRE_PUT = 10,         /* entries[].key, length, and remote_addr + rkey or inline_data */
    KVS_WIRE_PUT_REPLY = 11,   /* entries[].status */
    KVS_WIRE_DELETE = 12,      /* entries[].key */
    KVS_WIRE_DELETE_REPLY = 13, /* entries[].status */
    KVS_WIRE_STATS = 14,        /* empty */
    KVS_WIRE_STATS_REPLY = 15   /* counters[] */
} kvs_wire_type;

/* Why a message was refused; also the code an ERROR message carries. Values are on the wire. */
typedef enum kvs_wire_error {
    KVS_WIRE_ERR_NONE = 0,
    KVS_WIRE_ERR_TRUNCATED = 1,    /* the bytes end inside a field */
    KVS_WIRE_ERR_TOO_LARGE = 2,    /* the message is over KVS_WIRE_MAX_MESSAGE_BYTES */
    KVS_WIRE_ERR_LIMIT = 3,        /* a count or length is over its limit */
    KVS_WIRE_ERR_TYPE = 4,         /* a field has the wrong msgpack type or shape */
    KVS_WIRE_ERR_TRAILING = 5,     /* bytes follow the message */
    KVS_WIRE_ERR_VERSION = 6,      /* protocol version this side does not speak */
    KVS_WIRE_ERR_UNKNOWN_TYPE = 7, /* message type not known */
    KVS_WIRE_ERR_VALUE = 8,        /* right type, impossible value (bad flag, length mismatch) */
    KVS_WIRE_ERR_AUTH = 9,         /* handshake refused */
    KVS_WIRE_ERR_STATE = 10,       /* message not allowed now (e.g. LOOKUP before AUTH_OK) */
    KVS_WIRE_ERR_INTERNAL = 11     /* the node failed for its own reasons */
} kvs_wire_error;

/* STATS_REPLY counters, in wire order. */
enum {
    KVS_WIRE_STAT_OBJECTS,
    KVS_WIRE_STAT_BYTES_USED,
    KVS_WIRE_STAT_CAPACITY_BYTES,
    KVS_WIRE_STAT_HITS,
    KVS_WIRE_STAT_MISSES,
    KVS_WIRE_STAT_PUTS,
    KVS_WIRE_STAT_EVICTIONS,
    KVS_WIRE_STAT_AUTH_FAILURES,
    KVS_WIRE_STAT_HANDSHAKE_REFUSALS, /* control connections closed for bad bytes, size or order (v2) */
    KVS_WIRE_STAT_HANDSHAKE_TIMEOUTS, /* control connections closed at the handshake deadline (v2) */
    KVS_WIRE_STAT_CONNECTIONS_REJECTED, /* closed at accept: over a cap, or no fd left (v2) */
    KVS_WIRE_STATS_COUNT
};

/* One key of a batch. Which fields a type uses is listed in kvs_wire_type; the rest stay zero.
 * Pointers point into the decoded input (or, for encoding, into caller memory). */
typedef struct kvs_wire_entry {
    const uint8_t *key;         /* KVS_WIRE_KEY_BYTES bytes */
    uint64_t remote_addr;       /* GET destination / PUT source in the client's registered memory */
    uint64_t length;            /* GET: destination capacity; PUT: object bytes; GET_REPLY: bytes */
    const uint8_t *rkey;        /* packed remote key for remote_addr */
    uint32_t rkey_len;          /* 1..KVS_WIRE_MAX_RKEY_BYTES when rkey is used */
    const uint8_t *inline_data; /* PUT: object bytes in the message (then no remote_addr/rkey) */
    /* GET: [capacity], the node sends the object as a payload message or on the stream; PUT:
     * [length], the bytes follow the message on the stream (stream.h). No remote_addr/rkey then. */
    uint8_t by_message;
    int32_t status;  /* replies: a kvs_status */
    uint8_t present; /* LOOKUP_REPLY: 1 when the node holds the key */
} kvs_wire_entry;

/* A decoded message or one to encode. Byte fields have the fixed sizes above; strings are not
 * NUL-terminated (use the *_len fields). */
typedef struct kvs_wire_msg {
    uint32_t version;
    uint32_t type; /* kvs_wire_type */
    uint64_t request_id;
    const char *tenant; /* HELLO */
    uint32_t tenant_len;
    const uint8_t *nonce;     /* HELLO */
    const uint8_t *challenge; /* CHALLENGE */
    const uint8_t *proof;     /* CHALLENGE (the node's), AUTH, AUTH_OK (the node's) */
    const uint8_t *host_id; /* AUTH, optional with worker_addr: same host -> node RMA by address */
    uint32_t host_id_len;
    const uint8_t *worker_addr; /* AUTH: the client's UCX worker address; AUTH_OK: the node's */
    uint32_t worker_addr_len;
    uint32_t pid;                 /* AUTH, with host_id: the client process (1..INT32_MAX) */
    const uint8_t *session_token; /* AUTH_OK, with worker_addr: KVS_WIRE_SESSION_TOKEN_BYTES */
    const char *transports; /* AUTH_OK, optional: what the node's RMA to this client runs over */
    uint32_t transports_len;
    /* AUTH_OK, optional with worker_addr, to a client on the node's host: the shm_name of the node's
     * first tier (a dram tier shared between processes) and its geometry, so the client can attach
     * it and read objects out of it itself */
    const char *shared_tier;
    uint32_t shared_tier_len; /* 1..KVS_WIRE_MAX_SHARED_TIER_NAME, 0: none */
    uint64_t shared_tier_capacity, shared_tier_max_object;
    uint32_t error_code;    /* ERROR: kvs_wire_error */
    const char *error_text; /* ERROR: 0..KVS_WIRE_MAX_ERROR_TEXT bytes */
    uint32_t error_text_len;
    kvs_wire_entry *entries; /* batch types: n_entries (0..KVS_WIRE_MAX_KEYS) */
    uint32_t n_entries;
    uint64_t counters[KVS_WIRE_STATS_COUNT]; /* STATS_REPLY */
    /* PUT, optional (0: none): the client's CLOCK_MONOTONIC time in ns from which it may reuse the
     * objects' room. Sent to a node on the same host whose payloads cross shared memory (same
     * boot, same time namespace: one clock): the node stores nothing it finished reading later. */
    uint64_t read_by_ns;
} kvs_wire_msg;

/* Why a decode (or an encode) was refused: a code and a sentence. request_id is set when the
 * message's header could be read (have_request_id), so the reply can name the request. */
typedef struct kvs_wire_refusal {
    kvs_wire_error code;
    char text[160];
    uint64_t request_id;
    int have_request_id;
} kvs_wire_refusal;

/* Zero *msg and set version KVS_WIRE_VERSION, type and request_id. */
void kvs_wire_msg_init(kvs_wire_msg *msg, kvs_wire_type type, uint64_t request_id);

/* Encode msg into buf[0..cap). On success *len is the message size. When cap is too small returns
 * KVS_EOVERFLOW with *len the size needed and buf untouched past cap (buf may be NULL with cap 0).
 * A message over a limit gives KVS_EINVAL and, when why is non-NULL, the reason. */
kvs_status kvs_wire_encode(const kvs_wire_msg *msg, void *buf, size_t cap, size_t *len,
                           kvs_wire_refusal *why);

/* Decode exactly one message from buf[0..len). Batch entries are written to entries[0..entries_cap)
 * (caller-owned; pass KVS_WIRE_MAX_KEYS of them to take any valid message); every pointer in *out
 * and in entries points into buf and lives as long as buf. On refusal *why says which class:
 * KVS_EVERSION (ERR_VERSION), KVS_EINVAL (ERR_TOO_LARGE, ERR_LIMIT), KVS_EOVERFLOW (more entries
 * than entries_cap), KVS_ECORRUPT (all other classes). *out is unspecified after a refusal. */
kvs_status kvs_wire_decode(const void *buf, size_t len, kvs_wire_entry *entries,
                           uint32_t entries_cap, kvs_wire_msg *out, kvs_wire_refusal *why);

/* Encode the ERROR reply a node sends for a refused message: the refusal's code and sentence, its
 * request id when known (else 0), in this side's version. Same buffer contract as kvs_wire_encode. */
kvs_status kvs_wire_encode_refusal(const kvs_wire_refusal *why, void *buf, size_t cap, size_t *len);
/* A refusal of request request_id with code and the sentence text (cut to fit), for kvs_wire_encode_refusal. */
void kvs_wire_refusal_make(kvs_wire_refusal *why, kvs_wire_error code, uint64_t request_id,
                           const char *text);

/* ---- payload message headers ----------------------------------------------------------------
 * Objects that travel as payload messages (kvs_ucx_payload_handler: the receiver places the data)
 * carry a fixed binary header, little-endian, beginning with the wire version and a kind:
 *   GET object (node -> client), 16 bytes: version u8, kind 1 u8, 0 u16, index u32, request_id u64
 *     -- the object of entry `index` of GET `request_id`; a miss sends nothing.
 *   PUT object (client -> node), 60 bytes: version u8, kind 2 u8, 0 u16, index u32, count u32,
 *     session token [16], request_id u64, key [16], read_by_ns u64 (0: none)
 *     -- object `index` of the `count` objects of PUT `request_id`; the data is the object. */
#define KVS_WIRE_GET_PAYLOAD_BYTES 16u
#define KVS_WIRE_PUT_PAYLOAD_BYTES 60u

typedef struct kvs_wire_payload {
    uint32_t kind; /* 1 GET object, 2 PUT object */
    uint32_t index;
    uint32_t count; /* PUT: 1..KVS_WIRE_MAX_KEYS, index < count */
    uint64_t request_id;
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES]; /* PUT */
    uint8_t key[KVS_WIRE_KEY_BYTES];             /* PUT */
    uint64_t read_by_ns;                         /* PUT: as kvs_wire_msg.read_by_ns */
} kvs_wire_payload;

#define KVS_WIRE_PAYLOAD_GET 1u
#define KVS_WIRE_PAYLOAD_PUT 2u

/* Little-endian integers of `bytes` bytes (1..8), for the binary headers here and in stream.h. */
void kvs_wire_le_put(uint8_t *p, uint64_t v, unsigned bytes);
uint64_t kvs_wire_le_get(const uint8_t *p, unsigned bytes);

/* Write p's header into out (KVS_WIRE_GET_PAYLOAD_BYTES or KVS_WIRE_PUT_PAYLOAD_BYTES, by kind);
 * returns its length. */
size_t kvs_wire_payload_encode(const kvs_wire_payload *p, uint8_t out[KVS_WIRE_PUT_PAYLOAD_BYTES]);
/* Read a payload header of kind `kind`: KVS_OK, or KVS_EINVAL with why set (wrong length, version
 * or kind, a count out of 1..KVS_WIRE_MAX_KEYS, an index not below the count). */
kvs_status kvs_wire_payload_decode(const void *header, size_t len, uint32_t kind,
                                   kvs_wire_payload *out, kvs_wire_refusal *why);

/* Lower-case name of a message type ("lookup_reply"), or "unknown". */
/* 1 when tenant[0..len) is a valid tenant name: 1..KVS_WIRE_MAX_TENANT_BYTES of [A-Za-z0-9._-]. */
int kvs_wire_tenant_ok(const char *tenant, uint32_t len);
const char *kvs_wire_type_name(uint32_t type);
/* Lower-case name of an error code ("truncated"), or "unknown". */
const char *kvs_wire_error_name(uint32_t code);

#endif
