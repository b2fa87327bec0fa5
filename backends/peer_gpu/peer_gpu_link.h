/* peer_gpu_link.h - the tier's link to its lender (peer_gpu_link.c), started at create and stopped
 * at destroy (peer_gpu.c). */
#ifndef KVS_PEER_GPU_LINK_H
#define KVS_PEER_GPU_LINK_H

#include "abi/kvstrata_backend.h"
#include "peer_gpu_state.h"

/* First connection attempt (create), then the link thread. */
kvs_status pg_link_start(pg_state *st);
void pg_link_stop(pg_state *st);

#endif /* KVS_PEER_GPU_LINK_H */
