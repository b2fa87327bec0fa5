/* status.c - the sentence of each kvs_status (contract in status.h). */
#include "status.h"

const char *kvs_status_sentence(kvs_status status) {
    switch (status) {
        case KVS_OK: return "success";
        case KVS_EINVAL: return "invalid argument";
        case KVS_ENOMEM: return "out of memory";
        case KVS_ENOTFOUND: return "not found";
        case KVS_EIO: return "input/output error";
        case KVS_ECONFIG: return "invalid configuration";
        case KVS_EVERSION: return "ABI version mismatch";
        case KVS_ESTATE: return "call out of order or on a handle of the wrong role";
        case KVS_ETIMEDOUT: return "timed out";
        case KVS_ENOTSUP: return "not supported";
        case KVS_ECORRUPT: return "stored data is corrupt";
        case KVS_EAGAIN: return "not ready, try again";
        case KVS_EOVERFLOW: return "output buffer too small";
    }
    return "unknown status";
}
