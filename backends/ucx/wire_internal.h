/* wire_internal.h - the checks the wire's encoder (wire_encode.c) and decoder (wire_decode.c)
 * share; nothing public. Pure functions, any thread. */
#ifndef KVS_WIRE_INTERNAL_H
#define KVS_WIRE_INTERNAL_H

#include <stdint.h>

#include "wire.h"

#define N_HEADER_FIELDS 4u /* version, type, request_id, body */

/* Fill *why with code and a formatted sentence unless it already holds a reason (the first one is
 * kept); why may be NULL. */
void wire_refuse(kvs_wire_refusal *why, kvs_wire_error code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 1 for the types whose body carries keys (requests and replies of lookup, get, put, delete). */
int wire_is_batch_type(uint32_t type);
/* 1 when a tenant name is 1..KVS_WIRE_MAX_TENANT_BYTES of [A-Za-z0-9._-]. */

#endif
