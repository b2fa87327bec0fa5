/* guard.h - what every hook runs through: the role check and the handle's last-error sentence.
 * Calls on one handle are not thread-safe (the last error belongs to the handle). */
#ifndef KVS_GUARD_H
#define KVS_GUARD_H

#include "abi/kvstrata.h"

/* Write the sentence into the handle's last error (logged at debug) and return st. */
kvs_status kvs_set_error(kvs_handle *h, kvs_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* KVS_OK if the handle was opened with `role`, else KVS_ESTATE naming the hook and the handle's role. */
kvs_status kvs_require_role(kvs_handle *h, kvs_role role, const char *hook);

#endif
