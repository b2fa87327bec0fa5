/* ucx_remote_error.c - the remote tier's last error (ucx_remote_error.h), set from any of its
 * files: kept under the tier's mutex and logged through the host. */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "ucx_remote_error.h"

void remote_set_error(remote *r, const char *fmt, ...) {
    char msg[ERROR_BYTES - 80];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&r->mutex);
    snprintf(r->error, sizeof r->error, "remote tier \"%s\": %s", r->name, msg);
    pthread_mutex_unlock(&r->mutex);
    if (r->host && r->host->log &&
        r->host->struct_size >= offsetof(kvs_backend_host, log) + sizeof r->host->log) {
        char line[ERROR_BYTES];
        snprintf(line, sizeof line, "remote tier \"%s\": %s", r->name, msg);
        r->host->log(r->host->ctx, KVS_LOG_WARN, line);
    }
}

void remote_log(remote *r, int level, const char *line) {
    if (r->host && r->host->log &&
        r->host->struct_size >= offsetof(kvs_backend_host, log) + sizeof r->host->log)
        r->host->log(r->host->ctx, level, line);
}
