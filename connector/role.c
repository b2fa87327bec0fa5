/* role.c - the role check every hook makes first (role.h). */
#include "role.h"

#include "handle.h"
#include "last_error.h"

kvs_status kvs_require_role(kvs_handle *h, kvs_role role, const char *hook) {
    if ((h->role & role) == 0)
        return kvs_set_error(h, KVS_ESTATE, "%s: this handle was opened with role %s", hook,
                             h->role == KVS_ROLE_SCHEDULER ? "scheduler" : "worker");
    return KVS_OK;
}
