/* ucx_remote_error.h - the remote tier's last error and log lines (ucx_remote_error.c). */
#ifndef KVS_UCX_REMOTE_ERROR_H
#define KVS_UCX_REMOTE_ERROR_H

#include "ucx_remote_state.h"

/* Record the tier's last error (under mutex) and log it through the host. Any thread. */
void remote_set_error(remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line for the host's log only (the last error is left as it is). Any thread. */
void remote_log(remote *r, int level, const char *line);

#endif
