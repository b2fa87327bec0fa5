/* last_error.h - the handle's last-error sentence, which every hook reports through. Calls on one
 * handle are not thread-safe (the last error belongs to the handle). */
#ifndef KVS_LAST_ERROR_H
#define KVS_LAST_ERROR_H

#include "abi/kvstrata.h"

/* Write the sentence into the handle's last error (logged at debug) and return st. */
kvs_status kvs_set_error(kvs_handle *h, kvs_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
