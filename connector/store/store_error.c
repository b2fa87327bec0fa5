/* store_error.c - the store API's last error: per calling thread, since every call may come from any
 * thread at once, with the store it was on (a sentence about another store is not this one's). */
#include <stdarg.h>
#include <stdio.h>

#include "store_state.h"

static _Thread_local char tl_error[512];
static _Thread_local const kvs_store *tl_store;

void kvs_store_set_error(const kvs_store *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof tl_error, fmt, ap);
    va_end(ap);
    tl_store = s;
}

const char *kvs_store_error_of(const kvs_store *s) {
    return s && tl_store == s ? tl_error : "";
}

void kvs_store_forget_error(const kvs_store *s) {
    if (tl_store == s) tl_store = NULL;
}
