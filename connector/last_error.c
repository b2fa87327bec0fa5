/* last_error.c - the last-error sentence every hook reports through (last_error.h). */
#include "last_error.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/log.h"
#include "handle.h"

kvs_status kvs_set_error(kvs_handle *h, kvs_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->last_error, sizeof h->last_error, fmt, ap);
    va_end(ap);
    kvs_log(h->cfg ? h->cfg->log_level : KVS_LOG_WARN, KVS_LOG_DEBUG, "%s", h->last_error);
    return st;
}
