/* policy.h - placement/retrieval callbacks for multi-device tiers (schedulers/swarm behind them). */
#ifndef KVS_POLICY_H
#define KVS_POLICY_H

#include "abi/kvstrata_backend.h"

/* Fill host->place and host->schedule. */
void kvs_policy_install(kvs_backend_host *host);

#endif
