/* wire_decode.c - decode a message with the strict reader (common/mp_reader) that step metadata
 * uses too (see wire.h).
 *
 * msgpack-c's unpacker is not used to decode: it allocates room for an array's declared element
 * count before checking that the bytes exist, so five bytes from a peer could ask for gigabytes.
 * The reader checks every count and length against its limit and the bytes left, and points into
 * the input. */
#include <stdio.h>
#include <string.h>

#include "common/mp_reader.h"
#include "wire_internal.h"

/* The primitives are the strict reader every untrusted blob goes through (common/mp_reader); this
 * layer adds the wire's refusal codes and its message-level checks. */
typedef struct reader {
    kvs_mp_reader mp;
    kvs_wire_refusal *why;
    const char *where;       /* message type name, for sentences */
    char prefix[48];         /* "wire: <where> message" */
    int caller_short;        /* refused because entries_cap was smaller than a valid count */
    kvs_wire_entry *entries; /* the caller's, reused across decodes */
} reader;

static void set_where(reader *r, const char *where) {
    r->where = where;
    snprintf(r->prefix, sizeof r->prefix, "wire: %s message", where);
    r->mp.prefix = r->prefix;
}

/* A primitive refused: its sentence is in why->text already; record the wire's code for it (a count or
 * length over a limit counts as `over`). */
static int failed(reader *r, kvs_wire_error over) {
    if (r->why->code != KVS_WIRE_ERR_NONE) return -1;
    switch (r->mp.refusal) {
        case KVS_MP_TRUNCATED: r->why->code = KVS_WIRE_ERR_TRUNCATED; break;
        case KVS_MP_TYPE: r->why->code = KVS_WIRE_ERR_TYPE; break;
        case KVS_MP_LIMIT: r->why->code = over; break;
        default: r->why->code = KVS_WIRE_ERR_VALUE; break;
    }
    return -1;
}

static int read_int(reader *r, int64_t *v, const char *what) {
    return kvs_mp_read_int(&r->mp, v, what) != 0 ? failed(r, KVS_WIRE_ERR_VALUE) : 0;
}

/* 1 when the next value is an unsigned integer (positive fixint or uint 8..64). */
static int next_is_uint(const reader *r) {
    if (r->mp.left == 0) return 0;
    uint8_t b = r->mp.p[0];
    return b <= 0x7f || (b >= 0xcc && b <= 0xcf);
}

static int read_uint(reader *r, uint64_t *v, uint64_t max, const char *what) {
    return kvs_mp_read_uint(&r->mp, max, v, what) != 0 ? failed(r, KVS_WIRE_ERR_VALUE) : 0;
}

/* An array header whose count must be in [min, max]; over max is `over` (LIMIT or TYPE). */
static int read_array(reader *r, uint32_t *n, uint32_t min, uint32_t max, kvs_wire_error over,
                      const char *what) {
    return kvs_mp_read_array(&r->mp, min, max, n, what) != 0 ? failed(r, over) : 0;
}

/* A bin (or, with want_str, a str) of at most max bytes; the limit is checked before the bytes. */
static int read_blob(reader *r, int want_str, const uint8_t **out, uint32_t *n, uint32_t max,
                     const char *what) {
    return kvs_mp_read_bytes(&r->mp, want_str, max, out, n, what) != 0
               ? failed(r, KVS_WIRE_ERR_LIMIT)
               : 0;
}

static int read_fixed(reader *r, const uint8_t **out, uint32_t size, const char *what) {
    uint32_t n;
    if (read_blob(r, 0, out, &n, size, what) != 0) return -1;
    if (n != size) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: %s message: %s is %u bytes, %u expected",
                    r->where, what, n, size);
        return -1;
    }
    return 0;
}

/* The keys blob: n * 16 bytes, n <= KVS_WIRE_MAX_KEYS. */
static int read_keys(reader *r, kvs_wire_msg *out, uint32_t entries_cap, uint32_t *n_keys) {
    const uint8_t *keys;
    uint32_t bytes;
    if (read_blob(r, 0, &keys, &bytes, KVS_WIRE_MAX_KEYS * KVS_WIRE_KEY_BYTES, "the keys") != 0)
        return -1;
    if (bytes % KVS_WIRE_KEY_BYTES != 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE,
                    "wire: %s message: keys blob of %u bytes is not a multiple of %u", r->where,
                    bytes, KVS_WIRE_KEY_BYTES);
        return -1;
    }
    uint32_t n = bytes / KVS_WIRE_KEY_BYTES;
    if (n > entries_cap) {
        wire_refuse(r->why, KVS_WIRE_ERR_LIMIT,
                    "wire: %s message has %u keys, the caller has room for %u", r->where, n,
                    entries_cap);
        r->caller_short = 1;
        return -1;
    }
    /* entries are reused across decodes: clear each, so no field of an earlier message survives */
    for (uint32_t i = 0; i < n; i++) {
        memset(&out->entries[i], 0, sizeof out->entries[i]);
        out->entries[i].key = keys + (size_t)i * KVS_WIRE_KEY_BYTES;
    }
    *n_keys = n;
    return 0;
}

/* A per-key array that must have exactly one element per key. */
static int read_per_key(reader *r, uint32_t n_keys, uint32_t entries_cap, uint32_t *n,
                        const char *what) {
    if (read_array(r, n, 0, KVS_WIRE_MAX_KEYS, KVS_WIRE_ERR_LIMIT, what) != 0) return -1;
    if (*n > entries_cap) {
        wire_refuse(r->why, KVS_WIRE_ERR_LIMIT,
                    "wire: %s message has %u entries, the caller has room for %u", r->where, *n,
                    entries_cap);
        r->caller_short = 1;
        return -1;
    }
    if (n_keys != UINT32_MAX && *n != n_keys) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: %s message has %u keys but %u %s", r->where,
                    n_keys, *n, what);
        return -1;
    }
    if (n_keys ==
        UINT32_MAX) /* a reply's entries: clear them, so no field of an earlier message survives */
        memset(r->entries, 0, *n * sizeof *r->entries);
    return 0;
}

static int read_status(reader *r, int32_t *status) {
    int64_t v;
    if (read_int(r, &v, "a status") != 0) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: %s message: status %lld is out of range",
                    r->where, (long long)v);
        return -1;
    }
    *status = (int32_t)v;
    return 0;
}

static int read_hello(reader *r, kvs_wire_msg *out) {
    uint32_t n_fields, len;
    const uint8_t *bytes;
    if (read_array(r, &n_fields, 2, 2, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_blob(r, 1, &bytes, &len, KVS_WIRE_MAX_TENANT_BYTES, "the tenant name") != 0) return -1;
    out->tenant = (const char *)bytes;
    out->tenant_len = len;
    if (!kvs_wire_tenant_ok(out->tenant, len)) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE,
                    "wire: hello message: tenant name must be 1..%u bytes of [A-Za-z0-9._-]",
                    KVS_WIRE_MAX_TENANT_BYTES);
        return -1;
    }
    return read_fixed(r, &out->nonce, KVS_WIRE_NONCE_BYTES, "the nonce");
}

static int read_challenge(reader *r, kvs_wire_msg *out) {
    uint32_t n_fields;
    if (read_array(r, &n_fields, 2, 2, KVS_WIRE_ERR_TYPE, "the body") != 0 ||
        read_fixed(r, &out->challenge, KVS_WIRE_CHALLENGE_BYTES, "the challenge") != 0)
        return -1;
    return read_fixed(r, &out->proof, KVS_WIRE_PROOF_BYTES, "the node's proof");
}

/* auth's four-field form: host id, worker address and pid after the proof. */
static int read_auth_host(reader *r, kvs_wire_msg *out) {
    if (read_blob(r, 0, &out->host_id, &out->host_id_len, KVS_WIRE_MAX_HOST_ID_BYTES,
                  "the host id") != 0 ||
        read_blob(r, 0, &out->worker_addr, &out->worker_addr_len, KVS_WIRE_MAX_WORKER_ADDR_BYTES,
                  "the worker address") != 0)
        return -1;
    if (out->host_id_len == 0 || out->worker_addr_len == 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE,
                    "wire: auth message: empty host id or worker address");
        return -1;
    }
    uint64_t pid;
    if (read_uint(r, &pid, INT32_MAX, "the pid") != 0) return -1;
    if (pid == 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: auth message: pid 0");
        return -1;
    }
    out->pid = (uint32_t)pid;
    return 0;
}

static int read_auth(reader *r, kvs_wire_msg *out) {
    uint32_t n_fields;
    if (read_array(r, &n_fields, 1, 4, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (n_fields == 3) {
        wire_refuse(r->why, KVS_WIRE_ERR_TYPE,
                    "wire: auth message has 3 fields: 1 (proof), 2 (proof, worker "
                    "address) or 4 (proof, host id, worker address, pid) expected");
        return -1;
    }
    if (read_fixed(r, &out->proof, KVS_WIRE_PROOF_BYTES, "the proof") != 0) return -1;
    if (n_fields == 1) return 0;
    if (n_fields == 4) return read_auth_host(r, out);
    if (read_blob(r, 0, &out->worker_addr, &out->worker_addr_len, KVS_WIRE_MAX_WORKER_ADDR_BYTES,
                  "the worker address") != 0)
        return -1;
    if (out->worker_addr_len == 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: auth message: empty worker address");
        return -1;
    }
    return 0;
}

/* auth_ok's seven-field form: a shared tier's name, capacity and max object size at the end. */
static int read_auth_ok_shared_tier(reader *r, kvs_wire_msg *out) {
    uint32_t len;
    const uint8_t *bytes;
    if (read_blob(r, 1, &bytes, &len, KVS_WIRE_MAX_SHARED_TIER_NAME, "the shared tier's name") !=
            0 ||
        read_uint(r, &out->shared_tier_capacity, UINT64_MAX, "the shared tier's capacity") != 0 ||
        read_uint(r, &out->shared_tier_max_object, UINT64_MAX,
                  "the shared tier's max object size") != 0)
        return -1;
    if (len == 0 || out->shared_tier_capacity == 0 || out->shared_tier_max_object == 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE,
                    "wire: auth_ok message: an empty shared tier name, capacity or max "
                    "object size");
        return -1;
    }
    out->shared_tier = (const char *)bytes;
    out->shared_tier_len = len;
    return 0;
}

static int read_auth_ok(reader *r, kvs_wire_msg *out) {
    uint32_t n_fields, len;
    const uint8_t *bytes;
    if (read_array(r, &n_fields, 4, 7, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (n_fields == 5 || n_fields == 6) {
        wire_refuse(r->why, KVS_WIRE_ERR_TYPE,
                    "wire: auth_ok message has %u fields: 4 (proof, transports, worker "
                    "address, session token) or 7 (and a shared tier's name, capacity and "
                    "max object size) expected",
                    n_fields);
        return -1;
    }
    if (read_fixed(r, &out->proof, KVS_WIRE_PROOF_BYTES, "the node's proof") != 0 ||
        read_blob(r, 1, &bytes, &len, KVS_WIRE_MAX_TRANSPORTS_TEXT, "the transports") != 0)
        return -1;
    out->transports = (const char *)bytes;
    out->transports_len = len;
    if (read_blob(r, 0, &out->worker_addr, &out->worker_addr_len, KVS_WIRE_MAX_WORKER_ADDR_BYTES,
                  "the worker address") != 0)
        return -1;
    if (out->worker_addr_len == 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: auth_ok message: empty worker address");
        return -1;
    }
    if (read_fixed(r, &out->session_token, KVS_WIRE_SESSION_TOKEN_BYTES, "the session token") != 0)
        return -1;
    if (n_fields == 4) return 0;
    return read_auth_ok_shared_tier(r, out);
}

static int read_error(reader *r, kvs_wire_msg *out) {
    uint32_t n_fields, len;
    const uint8_t *bytes;
    uint64_t code;
    if (read_array(r, &n_fields, 2, 2, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_uint(r, &code, UINT32_MAX, "the error code") != 0) return -1;
    out->error_code = (uint32_t)code;
    if (read_blob(r, 1, &bytes, &len, KVS_WIRE_MAX_ERROR_TEXT, "the error text") != 0) return -1;
    out->error_text = (const char *)bytes;
    out->error_text_len = len;
    return 0;
}

/* lookup and delete: the keys alone. */
static int read_keys_only(reader *r, kvs_wire_msg *out, uint32_t entries_cap) {
    uint32_t n_fields;
    if (read_array(r, &n_fields, 1, 1, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    return read_keys(r, out, entries_cap, &out->n_entries);
}

static int read_lookup_reply(reader *r, kvs_wire_msg *out, uint32_t entries_cap) {
    uint32_t n_fields, len;
    const uint8_t *bytes;
    if (read_array(r, &n_fields, 1, 1, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_blob(r, 0, &bytes, &len, KVS_WIRE_MAX_KEYS, "the presence flags") != 0) return -1;
    if (len > entries_cap) {
        wire_refuse(r->why, KVS_WIRE_ERR_LIMIT,
                    "wire: lookup_reply has %u flags, the caller has room for %u", len,
                    entries_cap);
        r->caller_short = 1;
        return -1;
    }
    /* every field but the flag as zero: nothing left from what the array held before */
    memset(out->entries, 0, len * sizeof *out->entries);
    for (uint32_t i = 0; i < len; i++) {
        if (bytes[i] > 1) {
            wire_refuse(r->why, KVS_WIRE_ERR_VALUE,
                        "wire: lookup_reply message: flag %u is %u, not 0 or 1", i, bytes[i]);
            return -1;
        }
        out->entries[i].present = bytes[i];
    }
    out->n_entries = len;
    return 0;
}

/* One get or put descriptor: [capacity] / [length] / [inline bytes], or three fields naming the
 * peer's memory (address, length or capacity, rkey). */
static int read_descriptor(reader *r, kvs_wire_entry *e, int get, uint32_t i) {
    uint32_t n_fields, len;
    if (read_array(r, &n_fields, 1, 3, KVS_WIRE_ERR_TYPE, "a descriptor") != 0) return -1;
    if (get && n_fields == 1) { /* [capacity]: send the object as a payload message */
        if (read_uint(r, &e->length, UINT64_MAX, "a capacity") != 0) return -1;
        e->by_message = 1;
        return 0;
    }
    if (!get && n_fields == 1 && next_is_uint(r)) { /* [length]: bytes follow */
        if (read_uint(r, &e->length, UINT64_MAX, "a length") != 0) return -1;
        e->by_message = 1;
        return 0;
    }
    if (!get && n_fields == 1) {
        if (read_blob(r, 0, &e->inline_data, &len, KVS_WIRE_MAX_INLINE_BYTES, "inline data") != 0)
            return -1;
        e->length = len;
        return 0;
    }
    if (n_fields != 3) {
        wire_refuse(r->why, KVS_WIRE_ERR_TYPE,
                    "wire: %s message: descriptor %u has %u fields, 1 or 3 "
                    "expected",
                    r->where, i, n_fields);
        return -1;
    }
    if (get) {
        if (read_uint(r, &e->remote_addr, UINT64_MAX, "an address") != 0 ||
            read_uint(r, &e->length, UINT64_MAX, "a capacity") != 0)
            return -1;
    } else if (read_uint(r, &e->length, UINT64_MAX, "a length") != 0 ||
               read_uint(r, &e->remote_addr, UINT64_MAX, "an address") != 0) {
        return -1;
    }
    if (read_blob(r, 0, &e->rkey, &e->rkey_len, KVS_WIRE_MAX_RKEY_BYTES, "an rkey") != 0) return -1;
    if (e->rkey_len == 0) {
        wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: %s message: descriptor %u has an empty rkey",
                    r->where, i);
        return -1;
    }
    return 0;
}

static int read_get_put(reader *r, kvs_wire_msg *out, uint32_t entries_cap) {
    uint32_t n_keys, n;
    int get = out->type == KVS_WIRE_GET;
    uint32_t body_fields;
    if (read_array(r, &body_fields, 2, get ? 2 : 3, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_keys(r, out, entries_cap, &n_keys) != 0) return -1;
    if (read_per_key(r, n_keys, entries_cap, &n, "descriptors") != 0) return -1;
    for (uint32_t i = 0; i < n; i++)
        if (read_descriptor(r, &out->entries[i], get, i) != 0) return -1;
    out->n_entries = n;
    if (body_fields == 3) {
        if (read_uint(r, &out->read_by_ns, UINT64_MAX, "a read-by time") != 0) return -1;
        if (out->read_by_ns == 0) {
            wire_refuse(r->why, KVS_WIRE_ERR_VALUE, "wire: put message: the read-by time is 0");
            return -1;
        }
    }
    return 0;
}

static int read_get_reply(reader *r, kvs_wire_msg *out, uint32_t entries_cap) {
    uint32_t n_fields, n;
    if (read_array(r, &n_fields, 1, 1, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_per_key(r, UINT32_MAX, entries_cap, &n, "results") != 0) return -1;
    for (uint32_t i = 0; i < n; i++) {
        kvs_wire_entry *e = &out->entries[i];
        if (read_array(r, &n_fields, 2, 2, KVS_WIRE_ERR_TYPE, "a result") != 0 ||
            read_status(r, &e->status) != 0 ||
            read_uint(r, &e->length, UINT64_MAX, "a length") != 0)
            return -1;
    }
    out->n_entries = n;
    return 0;
}

/* put_reply and delete_reply: one status per key. */
static int read_statuses(reader *r, kvs_wire_msg *out, uint32_t entries_cap) {
    uint32_t n_fields, n;
    if (read_array(r, &n_fields, 1, 1, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_per_key(r, UINT32_MAX, entries_cap, &n, "statuses") != 0) return -1;
    for (uint32_t i = 0; i < n; i++)
        if (read_status(r, &out->entries[i].status) != 0) return -1;
    out->n_entries = n;
    return 0;
}

static int read_stats_reply(reader *r, kvs_wire_msg *out) {
    uint32_t n_fields, n;
    if (read_array(r, &n_fields, 1, 1, KVS_WIRE_ERR_TYPE, "the body") != 0) return -1;
    if (read_array(r, &n, KVS_WIRE_STATS_COUNT, KVS_WIRE_STATS_COUNT, KVS_WIRE_ERR_TYPE,
                   "the counters") != 0)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        if (read_uint(r, &out->counters[i], UINT64_MAX, "a counter") != 0) return -1;
    return 0;
}

static int read_body(reader *r, kvs_wire_msg *out, uint32_t entries_cap) {
    uint32_t n_fields;
    switch ((kvs_wire_type)out->type) {
        case KVS_WIRE_HELLO: return read_hello(r, out);
        case KVS_WIRE_CHALLENGE: return read_challenge(r, out);
        case KVS_WIRE_AUTH: return read_auth(r, out);
        case KVS_WIRE_AUTH_OK: return read_auth_ok(r, out);
        case KVS_WIRE_STATS: return read_array(r, &n_fields, 0, 0, KVS_WIRE_ERR_TYPE, "the body");
        case KVS_WIRE_ERROR: return read_error(r, out);
        case KVS_WIRE_LOOKUP:
        case KVS_WIRE_DELETE: return read_keys_only(r, out, entries_cap);
        case KVS_WIRE_LOOKUP_REPLY: return read_lookup_reply(r, out, entries_cap);
        case KVS_WIRE_GET:
        case KVS_WIRE_PUT: return read_get_put(r, out, entries_cap);
        case KVS_WIRE_GET_REPLY: return read_get_reply(r, out, entries_cap);
        case KVS_WIRE_PUT_REPLY:
        case KVS_WIRE_DELETE_REPLY: return read_statuses(r, out, entries_cap);
        case KVS_WIRE_STATS_REPLY: return read_stats_reply(r, out);
    }
    wire_refuse(r->why, KVS_WIRE_ERR_UNKNOWN_TYPE, "wire: unknown message type %u", out->type);
    return -1;
}

static kvs_status status_of(kvs_wire_error code) {
    switch (code) {
        case KVS_WIRE_ERR_VERSION: return KVS_EVERSION;
        case KVS_WIRE_ERR_TOO_LARGE:
        case KVS_WIRE_ERR_LIMIT: return KVS_EINVAL;
        default: return KVS_ECORRUPT;
    }
}

kvs_status kvs_wire_decode(const void *buf, size_t len, kvs_wire_entry *entries,
                           uint32_t entries_cap, kvs_wire_msg *out, kvs_wire_refusal *why) {
    kvs_wire_refusal local;
    if (!why) why = &local;
    memset(why, 0, sizeof *why);
    if (!out || (!buf && len) || (!entries && entries_cap)) return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    out->entries = entries;
    if (len > KVS_WIRE_MAX_MESSAGE_BYTES) {
        wire_refuse(why, KVS_WIRE_ERR_TOO_LARGE,
                    "wire: message of %zu bytes is over the limit of %u", len,
                    KVS_WIRE_MAX_MESSAGE_BYTES);
        return KVS_EINVAL;
    }
    reader r = {.why = why, .entries = entries};
    kvs_mp_reader_init(&r.mp, buf, len, NULL, why->text, sizeof why->text);
    set_where(&r, "a");
    uint32_t n_fields;
    uint64_t version, type, request_id;
    /* Any header of at least version, type and request id is read before the version is judged, so a
     * newer peer gets a version error naming its request rather than a shape error. */
    if ((kvs_mp_read_array_header(&r.mp, 3, UINT32_MAX, &n_fields, "the header") != 0 &&
         failed(&r, KVS_WIRE_ERR_TYPE)) ||
        read_uint(&r, &version, UINT32_MAX, "the version") != 0)
        return status_of(why->code);
    if (version != KVS_WIRE_VERSION) {
        if (read_uint(&r, &type, UINT32_MAX, "the type") == 0 &&
            read_uint(&r, &request_id, UINT64_MAX, "the request id") == 0) {
            why->request_id = request_id;
            why->have_request_id = 1;
        }
        memset(why->text, 0, sizeof why->text);
        why->code = KVS_WIRE_ERR_NONE;
        wire_refuse(why, KVS_WIRE_ERR_VERSION,
                    "wire: protocol version %llu is not spoken here (this side speaks %u)",
                    (unsigned long long)version, KVS_WIRE_VERSION);
        return KVS_EVERSION;
    }
    if (n_fields != N_HEADER_FIELDS) {
        wire_refuse(why, KVS_WIRE_ERR_TYPE,
                    "wire: version %u message has %u header fields, %u expected", KVS_WIRE_VERSION,
                    n_fields, N_HEADER_FIELDS);
        return KVS_ECORRUPT;
    }
    if (read_uint(&r, &type, UINT32_MAX, "the type") != 0 ||
        read_uint(&r, &request_id, UINT64_MAX, "the request id") != 0)
        return status_of(why->code);
    out->version = (uint32_t)version;
    out->type = (uint32_t)type;
    out->request_id = request_id;
    why->request_id = request_id;
    why->have_request_id = 1;
    if (type < KVS_WIRE_HELLO || type > KVS_WIRE_STATS_REPLY) {
        wire_refuse(why, KVS_WIRE_ERR_UNKNOWN_TYPE, "wire: unknown message type %llu",
                    (unsigned long long)type);
        return KVS_ECORRUPT;
    }
    set_where(&r, kvs_wire_type_name(out->type));
    if (read_body(&r, out, entries_cap) != 0) {
        /* more entries than the caller made room for is the caller's limit, not the peer's fault */
        if (r.caller_short) return KVS_EOVERFLOW;
        return status_of(why->code);
    }
    if (r.mp.left != 0) {
        wire_refuse(why, KVS_WIRE_ERR_TRAILING, "wire: %s message is followed by %zu stray bytes",
                    r.where, r.mp.left);
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}
