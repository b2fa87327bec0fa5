/* node_client.h - a client of a kvstrata-node daemon (node_proc.h) for the node suites, speaking as
 * the remote tier does: the handshake over the TCP control connection, then requests over UCX with
 * its session token, payloads by RMA from registered client memory. Failures are Check assertions.
 * One thread per client. Needs UCX (KVS_HAVE_UCX). */
#ifndef KVS_TEST_NODE_CLIENT_H
#define KVS_TEST_NODE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "backends/ucx/control.h"
#include "backends/ucx/ucx_transport.h"
#include "backends/ucx/wire.h"
#include "node_proc.h"

#define KVS_TEST_NODE_TIMEOUT_MS 5000                 /* every send, and every wait (scaled) */
#define KVS_TEST_CLIENT_BYTES    (4u * 1024u * 1024u) /* registered client memory */

typedef struct kvs_test_client {
    kvs_ucx_transport *t;
    int ctl_fd;  /* the control connection */
    kvs_chan ch; /* the same connection as a channel (TLS after kvs_test_client_tls) */
    kvs_tls *tls;
    kvs_control_reader rd;
    uint8_t frame[KVS_CONTROL_MAX_FRAME_BYTES + KVS_CONTROL_PREFIX_BYTES];
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES]; /* from AUTH_OK */
    kvs_ucx_conn *conn;                          /* to the node's worker address, after AUTH_OK */
    int node_proved; /* the node's CHALLENGE proved it holds this client's key */
    int ok_proved;   /* the node's AUTH_OK proved the whole handshake */
    uint8_t reply[KVS_WIRE_MAX_MESSAGE_BYTES];
    size_t reply_len;
    int arrived;
    uint32_t n_arrived; /* messages received so far */
    int dead;
    uint64_t next_id;
    kvs_wire_entry entries[KVS_WIRE_MAX_KEYS];
    uint8_t *mem; /* KVS_TEST_CLIENT_BYTES, registered */
    kvs_ucx_mem *mem_reg;
    uint8_t rkey[KVS_WIRE_MAX_RKEY_BYTES];
    size_t rkey_len;
} kvs_test_client;

/* A client with its UCX worker, registered memory and a control connection to d (no handshake). */
kvs_test_client *kvs_test_client_open(const kvs_test_node *d);
void kvs_test_client_close(kvs_test_client *c);
/* Make the control connection TLS with tenant's key (a node run with --encrypt on) and finish the
 * TLS handshake: KVS_OK, or the failure (a node that refused the key, a node without encrypt). */
kvs_status kvs_test_client_tls(kvs_test_client *c, const char *tenant, const uint8_t *psk_bytes,
                               size_t psk_len);
/* Send raw bytes with the session token and wait for one reply; 1 when a reply arrived. */
int kvs_test_client_send_raw(kvs_test_client *c, const void *bytes, size_t len);
/* Encode msg (its request_id is set here), send it, decode the reply into *rep. */
void kvs_test_client_request(kvs_test_client *c, kvs_wire_msg *msg, kvs_wire_msg *rep);
/* A request of one entry; the reply must be reply_type with one entry, which is returned (it points
 * into c->entries). */
const kvs_wire_entry *kvs_test_client_request_one(kvs_test_client *c, uint32_t type,
                                                  uint32_t reply_type, kvs_wire_entry *e);
/* Send msg on the control connection and wait for the node's next frame there (progressing UCX
 * meanwhile: the node wires up its endpoint to us before AUTH_OK), decoded into *rep; 0 when the
 * node closed the connection or said nothing within the timeout. */
int kvs_test_client_control_request(kvs_test_client *c, kvs_wire_msg *msg, kvs_wire_msg *rep);
/* 1 once the node has closed the control connection fd (EOF) within the timeout. */
int kvs_test_control_closed(int fd);
/* The same with worker_addr (worker_addr_len bytes) sent as the client's worker address, its proof
 * made over it (an authenticated peer that sends a crafted one). */
uint32_t kvs_test_client_handshake_with(kvs_test_client *c, const char *tenant,
                                        const uint8_t *psk_bytes, size_t psk_len,
                                        const uint8_t *worker_addr, size_t worker_addr_len,
                                        uint32_t *error_code);
/* HELLO + AUTH with the given tenant key; returns the type of the answer to AUTH (AUTH_OK or ERROR), and
 * its error code in *error_code (may be NULL). On AUTH_OK the client makes its endpoint to the node's
 * worker address and keeps the session token. */
uint32_t kvs_test_client_handshake(kvs_test_client *c, const char *tenant, const uint8_t *psk_bytes,
                                   size_t psk_len, uint32_t *error_code);
/* A client of d that passed the handshake for tenant with d's key (and checked the node's proof). */
kvs_test_client *kvs_test_client_authed(const kvs_test_node *d, const char *tenant);
/* The 16-byte key of number n. */
void kvs_test_node_key(uint8_t key[16], uint32_t n);
/* PUT one object from client memory at offset off (RMA), or inline when use_inline; the status. */
int32_t kvs_test_client_put(kvs_test_client *c, const uint8_t key[16], size_t off, size_t len,
                            int use_inline);
/* GET one object into client memory at offset off with capacity cap; *len gets the reported length. */
int32_t kvs_test_client_get(kvs_test_client *c, const uint8_t key[16], size_t off, size_t cap,
                            uint64_t *len);
/* LOOKUP one key: 1 when present. */
uint8_t kvs_test_client_lookup(kvs_test_client *c, const uint8_t key[16]);
/* The node's counters (STATS). */
void kvs_test_client_stats(kvs_test_client *c, uint64_t counters[KVS_WIRE_STATS_COUNT]);

#endif
