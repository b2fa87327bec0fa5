/* inspect_kv.h - what an ssd tier's objects mean to kvstrata, for backends/ssd/ssd_inspect.h: a
 * KV object (abi/kvstrata_server.h) is recognised by its header (model fingerprint, layers, tokens,
 * codec) and, when verified, checked by its header and layer checksums. The tier itself stores
 * bytes; this reading is the connector's, so it comes in from here. */
#ifndef KVS_CLI_INSPECT_KV_H
#define KVS_CLI_INSPECT_KV_H

#include "backends/ssd/ssd_inspect.h"

/* The content description of kvstrata KV objects (static, ctx unused). */
const kvs_ssd_inspect_content *cli_inspect_kv_content(void);

#endif
