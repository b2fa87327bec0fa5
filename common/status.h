/* status.h - the sentence of each kvs_status (kvs_strerror exports it). */
#ifndef KVS_STATUS_H
#define KVS_STATUS_H

#include "abi/kvstrata.h"

/* A static English sentence for a status. Never NULL. */
const char *kvs_status_sentence(kvs_status status);

#endif /* KVS_STATUS_H */
