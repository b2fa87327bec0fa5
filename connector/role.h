/* role.h - the role check every hook makes first: a hook of the scheduler role on a worker-only
 * handle (or the reverse) is refused with a sentence. */
#ifndef KVS_ROLE_H
#define KVS_ROLE_H

#include "abi/kvstrata.h"

/* KVS_OK if the handle was opened with `role`, else KVS_ESTATE naming the hook and the handle's role. */
kvs_status kvs_require_role(kvs_handle *h, kvs_role role, const char *hook);

#endif
