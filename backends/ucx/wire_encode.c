/* wire_encode.c - encode a message with msgpack-c's packer (see wire.h), after checking it against
 * the limits a decoder enforces, so nothing is sent that a peer must wire_refuse. */
#include <msgpack.h>
#include <string.h>

#include "wire_internal.h"

typedef struct sink {
    uint8_t *buf;
    size_t cap;
    size_t used; /* bytes the message needs so far, even past cap */
} sink;

static int sink_write(void *data, const char *bytes, size_t len) {
    sink *s = data;
    if (len == 0) return 0; /* an empty str/bin body may come with a NULL pointer */
    if (s->buf && s->used <= s->cap && len <= s->cap - s->used)
        memcpy(s->buf + s->used, bytes, len);
    s->used += len;
    return 0;
}

static void pack_bytes(msgpack_packer *pk, const void *bytes, uint32_t len) {
    msgpack_pack_bin(pk, len);
    msgpack_pack_bin_body(pk, bytes, len);
}

static void pack_entry_keys(msgpack_packer *pk, const kvs_wire_msg *msg) {
    msgpack_pack_bin(pk, msg->n_entries * KVS_WIRE_KEY_BYTES);
    for (uint32_t i = 0; i < msg->n_entries; i++)
        msgpack_pack_bin_body(pk, msg->entries[i].key, KVS_WIRE_KEY_BYTES);
}

/* auth_ok's three limits: the transports text, the optional shared tier, the worker address. */
static int check_auth_ok(const kvs_wire_msg *msg, kvs_wire_refusal *why) {
    if (msg->transports_len > KVS_WIRE_MAX_TRANSPORTS_TEXT ||
        (msg->transports_len && !msg->transports)) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT, "wire: auth_ok transports text of %u bytes is over %u",
                    msg->transports_len, KVS_WIRE_MAX_TRANSPORTS_TEXT);
        return -1;
    }
    if (msg->shared_tier_len &&
        (!msg->shared_tier || msg->shared_tier_len > KVS_WIRE_MAX_SHARED_TIER_NAME ||
         !msg->worker_addr_len || !msg->shared_tier_capacity || !msg->shared_tier_max_object)) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT,
                    "wire: auth_ok names a shared tier of %u bytes (1..%u) only with a worker "
                    "address, a capacity and a max object size",
                    msg->shared_tier_len, KVS_WIRE_MAX_SHARED_TIER_NAME);
        return -1;
    }
    if (!msg->worker_addr || !msg->worker_addr_len ||
        msg->worker_addr_len > KVS_WIRE_MAX_WORKER_ADDR_BYTES || !msg->session_token) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT,
                    "wire: auth_ok carries a worker address of %u bytes (1..%u) with a "
                    "session token",
                    msg->worker_addr_len, KVS_WIRE_MAX_WORKER_ADDR_BYTES);
        return -1;
    }
    return 0;
}

/* The messages that carry no entries: the handshake's and error. */
static int check_fields(const kvs_wire_msg *msg, kvs_wire_refusal *why) {
    uint32_t t = msg->type;
    if (t == KVS_WIRE_HELLO &&
        (!msg->tenant || !kvs_wire_tenant_ok(msg->tenant, msg->tenant_len) || !msg->nonce)) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE,
                    "wire: hello needs a nonce and a tenant name of 1..%u bytes of [A-Za-z0-9._-]",
                    KVS_WIRE_MAX_TENANT_BYTES);
        return -1;
    }
    if ((t == KVS_WIRE_CHALLENGE && (!msg->challenge || !msg->proof)) ||
        ((t == KVS_WIRE_AUTH || t == KVS_WIRE_AUTH_OK) && !msg->proof)) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE, "wire: %s without its 32 bytes",
                    kvs_wire_type_name(t));
        return -1;
    }
    if (t == KVS_WIRE_AUTH && (msg->host_id_len || msg->worker_addr_len) &&
        (!msg->worker_addr || msg->worker_addr_len > KVS_WIRE_MAX_WORKER_ADDR_BYTES ||
         msg->worker_addr_len == 0 ||
         (msg->host_id_len && (!msg->host_id || msg->host_id_len > KVS_WIRE_MAX_HOST_ID_BYTES ||
                               msg->pid == 0 || msg->pid > INT32_MAX)))) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT,
                    "wire: auth carries a worker address of %u bytes (1..%u), and with it "
                    "optionally a host id of %u bytes (1..%u) and a pid",
                    msg->worker_addr_len, KVS_WIRE_MAX_WORKER_ADDR_BYTES, msg->host_id_len,
                    KVS_WIRE_MAX_HOST_ID_BYTES);
        return -1;
    }
    if (t == KVS_WIRE_AUTH_OK && check_auth_ok(msg, why) != 0) return -1;
    if (t == KVS_WIRE_ERROR && (msg->error_text_len > KVS_WIRE_MAX_ERROR_TEXT ||
                                (msg->error_text_len && !msg->error_text))) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT, "wire: error text of %u bytes is over %u",
                    msg->error_text_len, KVS_WIRE_MAX_ERROR_TEXT);
        return -1;
    }
    return 0;
}

/* One entry of a batch message: its key, its rkey, its inline bytes, its presence flag. */
static int check_entry(uint32_t t, const kvs_wire_entry *e, uint32_t i, kvs_wire_refusal *why) {
    int keyed =
        t == KVS_WIRE_LOOKUP || t == KVS_WIRE_GET || t == KVS_WIRE_PUT || t == KVS_WIRE_DELETE;
    if (keyed && !e->key) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE, "wire: %s entry %u has no key", kvs_wire_type_name(t),
                    i);
        return -1;
    }
    int remote = (t == KVS_WIRE_GET || t == KVS_WIRE_PUT) && !e->by_message &&
                 !(t == KVS_WIRE_PUT && e->inline_data);
    if (remote && (!e->rkey || e->rkey_len == 0 || e->rkey_len > KVS_WIRE_MAX_RKEY_BYTES)) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT,
                    "wire: %s entry %u has an rkey of %u bytes (1..%u allowed)",
                    kvs_wire_type_name(t), i, e->rkey_len, KVS_WIRE_MAX_RKEY_BYTES);
        return -1;
    }
    if (t == KVS_WIRE_PUT && e->inline_data && e->length > KVS_WIRE_MAX_INLINE_BYTES) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT,
                    "wire: put entry %u carries %llu inline bytes, over %u", i,
                    (unsigned long long)e->length, KVS_WIRE_MAX_INLINE_BYTES);
        return -1;
    }
    if (t == KVS_WIRE_LOOKUP_REPLY && e->present > 1) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE, "wire: lookup_reply entry %u has presence flag %u", i,
                    e->present);
        return -1;
    }
    return 0;
}

/* What a decoder would wire_refuse, refused before writing. */
static int encode_check(const kvs_wire_msg *msg, kvs_wire_refusal *why) {
    uint32_t t = msg->type;
    if (t < KVS_WIRE_HELLO || t > KVS_WIRE_STATS_REPLY) {
        wire_refuse(why, KVS_WIRE_ERR_UNKNOWN_TYPE, "wire: cannot encode unknown message type %u",
                    t);
        return -1;
    }
    if (check_fields(msg, why) != 0) return -1;
    if (!wire_is_batch_type(t)) return 0;
    if (msg->n_entries && !msg->entries) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE, "wire: %s of %u keys has no entries",
                    kvs_wire_type_name(t), msg->n_entries);
        return -1;
    }
    if (msg->n_entries > KVS_WIRE_MAX_KEYS) {
        wire_refuse(why, KVS_WIRE_ERR_LIMIT, "wire: %s of %u keys is over the limit of %u",
                    kvs_wire_type_name(t), msg->n_entries, KVS_WIRE_MAX_KEYS);
        return -1;
    }
    for (uint32_t i = 0; i < msg->n_entries; i++)
        if (check_entry(t, &msg->entries[i], i, why) != 0) return -1;
    return 0;
}

static void pack_auth(msgpack_packer *pk, const kvs_wire_msg *msg) {
    msgpack_pack_array(pk, msg->host_id_len ? 4 : msg->worker_addr_len ? 2 : 1);
    pack_bytes(pk, msg->proof, KVS_WIRE_PROOF_BYTES);
    if (msg->host_id_len) {
        pack_bytes(pk, msg->host_id, msg->host_id_len);
        pack_bytes(pk, msg->worker_addr, msg->worker_addr_len);
        msgpack_pack_uint32(pk, msg->pid);
    } else if (msg->worker_addr_len) {
        pack_bytes(pk, msg->worker_addr, msg->worker_addr_len);
    }
}

static void pack_auth_ok(msgpack_packer *pk, const kvs_wire_msg *msg) {
    msgpack_pack_array(pk, msg->shared_tier_len ? 7 : 4);
    pack_bytes(pk, msg->proof, KVS_WIRE_PROOF_BYTES); /* the node's */
    msgpack_pack_str(pk, msg->transports_len);
    msgpack_pack_str_body(pk, msg->transports, msg->transports_len);
    pack_bytes(pk, msg->worker_addr, msg->worker_addr_len);
    pack_bytes(pk, msg->session_token, KVS_WIRE_SESSION_TOKEN_BYTES);
    if (msg->shared_tier_len) {
        msgpack_pack_str(pk, msg->shared_tier_len);
        msgpack_pack_str_body(pk, msg->shared_tier, msg->shared_tier_len);
        msgpack_pack_uint64(pk, msg->shared_tier_capacity);
        msgpack_pack_uint64(pk, msg->shared_tier_max_object);
    }
}

static void pack_get(msgpack_packer *pk, const kvs_wire_msg *msg) {
    uint32_t n = msg->n_entries;
    msgpack_pack_array(pk, 2);
    pack_entry_keys(pk, msg);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        const kvs_wire_entry *e = &msg->entries[i];
        if (e->by_message) { /* [capacity]: the node sends the object as a payload */
            msgpack_pack_array(pk, 1);
            msgpack_pack_uint64(pk, e->length);
            continue;
        }
        msgpack_pack_array(pk, 3);
        msgpack_pack_uint64(pk, e->remote_addr);
        msgpack_pack_uint64(pk, e->length);
        pack_bytes(pk, e->rkey, e->rkey_len);
    }
}

static void pack_put(msgpack_packer *pk, const kvs_wire_msg *msg) {
    uint32_t n = msg->n_entries;
    msgpack_pack_array(pk, msg->read_by_ns ? 3 : 2);
    pack_entry_keys(pk, msg);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        const kvs_wire_entry *e = &msg->entries[i];
        if (e->inline_data) { /* [bytes]: the length is the bin's */
            msgpack_pack_array(pk, 1);
            pack_bytes(pk, e->inline_data, (uint32_t)e->length);
        } else if (e->by_message) { /* [length]: the bytes follow on the stream */
            msgpack_pack_array(pk, 1);
            msgpack_pack_uint64(pk, e->length);
        } else { /* [length, addr, rkey] */
            msgpack_pack_array(pk, 3);
            msgpack_pack_uint64(pk, e->length);
            msgpack_pack_uint64(pk, e->remote_addr);
            pack_bytes(pk, e->rkey, e->rkey_len);
        }
    }
    if (msg->read_by_ns) msgpack_pack_uint64(pk, msg->read_by_ns);
}

/* The replies to a batch: presence flags, [status, length] pairs, statuses, counters. */
static void pack_reply(msgpack_packer *pk, const kvs_wire_msg *msg) {
    uint32_t n = msg->n_entries;
    msgpack_pack_array(pk, 1);
    switch ((kvs_wire_type)msg->type) {
        case KVS_WIRE_LOOKUP_REPLY:
            msgpack_pack_bin(pk, n);
            for (uint32_t i = 0; i < n; i++) msgpack_pack_bin_body(pk, &msg->entries[i].present, 1);
            break;
        case KVS_WIRE_GET_REPLY:
            msgpack_pack_array(pk, n);
            for (uint32_t i = 0; i < n; i++) {
                msgpack_pack_array(pk, 2);
                msgpack_pack_int32(pk, msg->entries[i].status);
                msgpack_pack_uint64(pk, msg->entries[i].length);
            }
            break;
        case KVS_WIRE_STATS_REPLY:
            msgpack_pack_array(pk, KVS_WIRE_STATS_COUNT);
            for (uint32_t i = 0; i < KVS_WIRE_STATS_COUNT; i++)
                msgpack_pack_uint64(pk, msg->counters[i]);
            break;
        default: /* put_reply, delete_reply */
            msgpack_pack_array(pk, n);
            for (uint32_t i = 0; i < n; i++) msgpack_pack_int32(pk, msg->entries[i].status);
            break;
    }
}

static void pack_body(msgpack_packer *pk, const kvs_wire_msg *msg) {
    switch ((kvs_wire_type)msg->type) {
        case KVS_WIRE_HELLO:
            msgpack_pack_array(pk, 2);
            msgpack_pack_str(pk, msg->tenant_len);
            msgpack_pack_str_body(pk, msg->tenant, msg->tenant_len);
            pack_bytes(pk, msg->nonce, KVS_WIRE_NONCE_BYTES);
            break;
        case KVS_WIRE_CHALLENGE:
            msgpack_pack_array(pk, 2);
            pack_bytes(pk, msg->challenge, KVS_WIRE_CHALLENGE_BYTES);
            pack_bytes(pk, msg->proof, KVS_WIRE_PROOF_BYTES); /* the node's */
            break;
        case KVS_WIRE_AUTH: pack_auth(pk, msg); break;
        case KVS_WIRE_AUTH_OK: pack_auth_ok(pk, msg); break;
        case KVS_WIRE_STATS: msgpack_pack_array(pk, 0); break;
        case KVS_WIRE_ERROR:
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint32(pk, msg->error_code);
            msgpack_pack_str(pk, msg->error_text_len);
            msgpack_pack_str_body(pk, msg->error_text, msg->error_text_len);
            break;
        case KVS_WIRE_LOOKUP:
        case KVS_WIRE_DELETE:
            msgpack_pack_array(pk, 1);
            pack_entry_keys(pk, msg);
            break;
        case KVS_WIRE_GET: pack_get(pk, msg); break;
        case KVS_WIRE_PUT: pack_put(pk, msg); break;
        case KVS_WIRE_LOOKUP_REPLY:
        case KVS_WIRE_GET_REPLY:
        case KVS_WIRE_PUT_REPLY:
        case KVS_WIRE_DELETE_REPLY:
        case KVS_WIRE_STATS_REPLY: pack_reply(pk, msg); break;
    }
}

kvs_status kvs_wire_encode(const kvs_wire_msg *msg, void *buf, size_t cap, size_t *len,
                           kvs_wire_refusal *why) {
    if (why) memset(why, 0, sizeof *why);
    if (!msg || !len || (!buf && cap)) return KVS_EINVAL;
    if (encode_check(msg, why) != 0) return KVS_EINVAL;
    sink s = {.buf = buf, .cap = cap, .used = 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &s, sink_write);
    msgpack_pack_array(&pk, N_HEADER_FIELDS);
    msgpack_pack_uint32(&pk, msg->version);
    msgpack_pack_uint32(&pk, msg->type);
    msgpack_pack_uint64(&pk, msg->request_id);
    pack_body(&pk, msg);
    *len = s.used;
    if (s.used > KVS_WIRE_MAX_MESSAGE_BYTES) {
        wire_refuse(why, KVS_WIRE_ERR_TOO_LARGE,
                    "wire: %s message of %zu bytes is over the limit of %u",
                    kvs_wire_type_name(msg->type), s.used, KVS_WIRE_MAX_MESSAGE_BYTES);
        return KVS_EINVAL;
    }
    return s.used > cap ? KVS_EOVERFLOW : KVS_OK;
}

kvs_status kvs_wire_encode_refusal(const kvs_wire_refusal *why, void *buf, size_t cap,
                                   size_t *len) {
    if (!why) return KVS_EINVAL;
    kvs_wire_msg msg;
    kvs_wire_msg_init(&msg, KVS_WIRE_ERROR, why->have_request_id ? why->request_id : 0);
    msg.error_code = (uint32_t)why->code;
    msg.error_text = why->text;
    size_t text_len = strnlen(why->text, sizeof why->text);
    msg.error_text_len = (uint32_t)text_len;
    return kvs_wire_encode(&msg, buf, cap, len, NULL);
}
