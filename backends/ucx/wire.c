/* wire.c - the message basics of the wire format (see wire.h): initialising a message, the names of
 * types and error codes, refusals, and the checks encoder and decoder share (wire_internal.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "wire_internal.h"

void kvs_wire_msg_init(kvs_wire_msg *msg, kvs_wire_type type, uint64_t request_id) {
    memset(msg, 0, sizeof *msg);
    msg->version = KVS_WIRE_VERSION;
    msg->type = (uint32_t)type;
    msg->request_id = request_id;
}

const char *kvs_wire_type_name(uint32_t type) {
    static const char *const names[] = {NULL,      "hello",        "challenge", "auth",
                                        "auth_ok", "error",        "lookup",    "lookup_reply",
                                        "get",     "get_reply",    "put",       "put_reply",
                                        "delete",  "delete_reply", "stats",     "stats_reply"};
    if (type == 0 || type >= sizeof names / sizeof names[0]) return "unknown";
    return names[type];
}

const char *kvs_wire_error_name(uint32_t code) {
    static const char *const names[] = {"none",  "truncated", "too_large", "limit",
                                        "type",  "trailing",  "version",   "unknown_type",
                                        "value", "auth",      "state",     "internal"};
    if (code >= sizeof names / sizeof names[0]) return "unknown";
    return names[code];
}

void wire_refuse(kvs_wire_refusal *why, kvs_wire_error code, const char *fmt, ...) {
    if (!why || why->code != KVS_WIRE_ERR_NONE) return; /* keep the first reason */
    why->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->text, sizeof why->text, fmt, ap);
    va_end(ap);
}

int wire_is_batch_type(uint32_t type) {
    return type == KVS_WIRE_LOOKUP || type == KVS_WIRE_LOOKUP_REPLY || type == KVS_WIRE_GET ||
           type == KVS_WIRE_GET_REPLY || type == KVS_WIRE_PUT || type == KVS_WIRE_PUT_REPLY ||
           type == KVS_WIRE_DELETE || type == KVS_WIRE_DELETE_REPLY;
}

int kvs_wire_tenant_ok(const char *tenant, uint32_t len) {
    if (len == 0 || len > KVS_WIRE_MAX_TENANT_BYTES) return 0;
    for (uint32_t i = 0; i < len; i++) {
        char c = tenant[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

void kvs_wire_refusal_make(kvs_wire_refusal *why, kvs_wire_error code, uint64_t request_id,
                           const char *text) {
    memset(why, 0, sizeof *why);
    why->code = code;
    why->request_id = request_id;
    why->have_request_id = 1;
    snprintf(why->text, sizeof why->text, "%s", text ? text : "");
}

/* ---- payload headers -------------------------------------------------------------------------- */

void kvs_wire_le_put(uint8_t *p, uint64_t v, unsigned bytes) {
    for (unsigned i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t kvs_wire_le_get(const uint8_t *p, unsigned bytes) {
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

size_t kvs_wire_payload_encode(const kvs_wire_payload *p, uint8_t out[KVS_WIRE_PUT_PAYLOAD_BYTES]) {
    int put = p->kind == KVS_WIRE_PAYLOAD_PUT;
    out[0] = KVS_WIRE_VERSION;
    out[1] = (uint8_t)p->kind;
    kvs_wire_le_put(out + 2, 0, 2);
    kvs_wire_le_put(out + 4, p->index, 4);
    if (!put) {
        kvs_wire_le_put(out + 8, p->request_id, 8);
        return KVS_WIRE_GET_PAYLOAD_BYTES;
    }
    kvs_wire_le_put(out + 8, p->count, 4);
    memcpy(out + 12, p->token, KVS_WIRE_SESSION_TOKEN_BYTES);
    kvs_wire_le_put(out + 28, p->request_id, 8);
    memcpy(out + 36, p->key, KVS_WIRE_KEY_BYTES);
    kvs_wire_le_put(out + 52, p->read_by_ns, 8);
    return KVS_WIRE_PUT_PAYLOAD_BYTES;
}

kvs_status kvs_wire_payload_decode(const void *header, size_t len, uint32_t kind,
                                   kvs_wire_payload *out, kvs_wire_refusal *why) {
    const uint8_t *h = header;
    size_t want =
        kind == KVS_WIRE_PAYLOAD_PUT ? KVS_WIRE_PUT_PAYLOAD_BYTES : KVS_WIRE_GET_PAYLOAD_BYTES;
    memset(out, 0, sizeof *out);
    if (!h || len != want) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE, "wire: a payload header of %zu bytes, %zu expected",
                    len, want);
        return KVS_EINVAL;
    }
    if (h[0] != KVS_WIRE_VERSION) {
        wire_refuse(why, KVS_WIRE_ERR_VERSION,
                    "wire: payload header version %u, this side speaks %u", h[0], KVS_WIRE_VERSION);
        return KVS_EINVAL;
    }
    if (h[1] != kind || kvs_wire_le_get(h + 2, 2) != 0) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE, "wire: payload header of kind %u, %u expected", h[1],
                    kind);
        return KVS_EINVAL;
    }
    out->kind = kind;
    out->index = (uint32_t)kvs_wire_le_get(h + 4, 4);
    if (kind != KVS_WIRE_PAYLOAD_PUT) {
        out->request_id = kvs_wire_le_get(h + 8, 8);
        return KVS_OK;
    }
    out->count = (uint32_t)kvs_wire_le_get(h + 8, 4);
    memcpy(out->token, h + 12, KVS_WIRE_SESSION_TOKEN_BYTES);
    out->request_id = kvs_wire_le_get(h + 28, 8);
    memcpy(out->key, h + 36, KVS_WIRE_KEY_BYTES);
    out->read_by_ns = kvs_wire_le_get(h + 52, 8);
    if (out->count == 0 || out->count > KVS_WIRE_MAX_KEYS || out->index >= out->count) {
        wire_refuse(why, KVS_WIRE_ERR_VALUE,
                    "wire: put payload %u of %u (1..%u objects, index below the count)", out->index,
                    out->count, KVS_WIRE_MAX_KEYS);
        return KVS_EINVAL;
    }
    return KVS_OK;
}
