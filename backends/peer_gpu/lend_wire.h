/* lend_wire.h - the peer-GPU tier's control channel (docs/peer_gpu.md): the messages of
 * the lending protocol (lending.h) between one lender and one borrower over a Unix SOCK_SEQPACKET
 * socket, one message a packet, msgpack [version, type, unit, epoch] (HELLO adds the region's
 * geometry and kind: a host region passes its file descriptor with SCM_RIGHTS, a CUDA region carries
 * its IPC handle and its GPU's UUID and ordinal in the packet). Every packet from the peer is
 * read with the strict reader: a packet that is not one of these is refused with a sentence, never
 * acted on. A closed socket is a lost connection (lending.h: not yet the peer's death). */
#ifndef KVS_LEND_WIRE_H
#define KVS_LEND_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_LEND_WIRE_VERSION 2   /* 2: HELLO names the region's kind (1 had host regions only) */
#define KVS_LEND_WIRE_MAX     160 /* bytes of the largest packet */
#define KVS_LEND_IPC_BYTES    64  /* a CUDA IPC memory handle (cudaIpcMemHandle_t) */
#define KVS_LEND_UUID_BYTES   16  /* the lender's GPU (cudaDeviceProp.uuid) */

/* Where the lent region lives (HELLO). */
typedef enum kvs_lend_region_kind {
    KVS_LEND_REGION_MEMFD = 0, /* host memory: a sealed memfd passed with the HELLO */
    KVS_LEND_REGION_CUDA = 1,  /* device memory of the lender's process: a CUDA IPC handle */
} kvs_lend_region_kind;

typedef enum kvs_lend_msg_type {
    KVS_LEND_HELLO = 1, /* lender -> borrower: the region (and its fd) */
    KVS_LEND_OFFER,     /* lender -> borrower: unit, epoch */
    KVS_LEND_RECLAIM,   /* lender -> borrower: unit, epoch */
    KVS_LEND_ACCEPT,    /* borrower -> lender: unit, epoch */
    KVS_LEND_DECLINE,   /* borrower -> lender: unit, epoch */
    KVS_LEND_RELEASED,  /* borrower -> lender: unit, epoch */
    KVS_LEND_BYE,       /* either way: an orderly end */
} kvs_lend_msg_type;

typedef struct kvs_lend_msg {
    uint32_t type; /* kvs_lend_msg_type */
    uint32_t unit;
    uint32_t epoch;
    /* HELLO only */
    uint32_t n_units;
    uint64_t unit_bytes;
    uint64_t region_bytes;             /* what the region holds: n_units * unit_bytes at least */
    uint32_t region_kind;              /* kvs_lend_region_kind */
    uint32_t device;                   /* CUDA: the lender's ordinal (in the lender's process) */
    uint8_t ipc[KVS_LEND_IPC_BYTES];   /* CUDA: the region's IPC handle */
    uint8_t uuid[KVS_LEND_UUID_BYTES]; /* CUDA: its GPU, the same in every process */
} kvs_lend_msg;

/* The packet of m into buf (KVS_LEND_WIRE_MAX bytes); its length, or 0 for a message that is not
 * one of these. */
size_t kvs_lend_encode(const kvs_lend_msg *m, uint8_t *buf);

/* Parse a packet: KVS_OK, or KVS_EINVAL with a sentence for anything else (another version, an
 * unknown type, a HELLO whose region does not hold its units or whose kind is unknown or carries a
 * handle of the wrong size, a unit >= max_units for the others
 * when max_units is not 0, trailing bytes). */
kvs_status kvs_lend_decode(const void *buf, size_t len, uint32_t max_units, kvs_lend_msg *m,
                           char *err, size_t err_len);

/* Send m on a SOCK_SEQPACKET socket, with pass_fd (>= 0) as ancillary data, waiting at most
 * timeout_ms (-1: no bound) for room: KVS_ETIMEDOUT when the peer reads nothing (two sides sending
 * at once never block each other for good), KVS_EIO with a sentence when the socket refuses it (the
 * connection is lost). */
kvs_status kvs_lend_send(int sock, const kvs_lend_msg *m, int pass_fd, int timeout_ms, char *err,
                         size_t err_len);

/* Receive one packet within timeout_ms (-1: wait). KVS_OK with *m (and, for a host region's HELLO,
 * *passed_fd the descriptor, else -1; a CUDA region's HELLO comes with none); KVS_ETIMEDOUT when none came; KVS_EIO when the peer closed the socket or it
 * failed (the connection is lost: the peer may still be alive, lending.h); KVS_EINVAL for a packet
 * that is not a message (an empty one, or a HELLO whose file is smaller than its region: refused,
 * any descriptor closed). */
kvs_status kvs_lend_recv(int sock, int timeout_ms, uint32_t max_units, kvs_lend_msg *m,
                         int *passed_fd, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
