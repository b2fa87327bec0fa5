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
