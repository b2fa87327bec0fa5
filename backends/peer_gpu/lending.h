/* lending.h - the two-step lending protocol of the peer-GPU tier (docs/peer_gpu.md) as two
 * pure state machines, one per side, with no I/O: the lender's and the borrower's view of each unit
 * of lent memory, driven by the messages and events the control channel delivers. The transport
 * (a Unix socket) and the memory (a memfd on the host device, CUDA IPC on a GPU) are the tier's.
 *
 * The rule both sides keep: a borrower never touches a unit the lender took back. Lending and taking
 * back are two steps each:
 *   lend:    lender OFFER(unit, epoch) -> borrower takes it -> ACCEPT(unit, epoch)
 *   reclaim: lender RECLAIM(unit, epoch) -> the borrower stops new I/O on it, lets what is in flight
 *            finish, empties it (its objects evicted or moved down the chain) -> RELEASED(unit,
 *            epoch) -> only then may the lender reuse it.
 * Every unit carries an epoch, bumped each time the lender offers it, so a message about an earlier
 * lending of the same unit is told apart and ignored (a borrower takes an offer only of a newer
 * epoch than any it held the unit under). Losing the connection is not the borrower's death: its
 * process may still be copying, so its units are quarantined, and come back to the lender only once
 * the tier has made sure the process is gone. A lost lender's units become unusable to the borrower
 * at once (their memory may be gone) and what they held turns into misses; I/O already in flight
 * stays counted, so a unit is not taken again from a new lender before it has ended. */
#ifndef KVS_LENDING_H
#define KVS_LENDING_H

#include <stdint.h>

#include "abi/kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_LEND_MAX_UNITS 4096u

/* ---- the lender -------------------------------------------------------------------------------- */

typedef enum kvs_lend_unit_state {
    KVS_LEND_OWNED = 0,   /* the lender's own: it may use it */
    KVS_LEND_OFFERED,     /* offered, not yet accepted: neither side uses it */
    KVS_LEND_LENT,        /* the borrower's */
    KVS_LEND_RECLAIMING,  /* asked back: still the borrower's until RELEASED */
    KVS_LEND_QUARANTINED, /* the connection was lost while the borrower held it: nobody's until the
                           * borrower's process is known to be gone */
} kvs_lend_unit_state;

typedef struct kvs_lender {
    uint32_t n_units;
    uint8_t state[KVS_LEND_MAX_UNITS];
    uint32_t epoch[KVS_LEND_MAX_UNITS];
    int borrower; /* a borrower is connected */
} kvs_lender;

/* n_units units, all the lender's; no borrower yet. KVS_EINVAL beyond KVS_LEND_MAX_UNITS. */
kvs_status kvs_lender_init(kvs_lender *l, uint32_t n_units);
/* A borrower connected (one at a time: KVS_ESTATE if one is). */
kvs_status kvs_lender_connect(kvs_lender *l);
/* Offer an owned unit: *epoch gets the epoch the OFFER carries. KVS_ESTATE if it is not owned or
 * no borrower is connected. */
kvs_status kvs_lender_offer(kvs_lender *l, uint32_t unit, uint32_t *epoch);
/* ACCEPT(unit, epoch) arrived: an offered unit becomes lent. A stale or unexpected one changes
 * nothing (KVS_ESTATE). */
kvs_status kvs_lender_on_accept(kvs_lender *l, uint32_t unit, uint32_t epoch);
/* DECLINE(unit, epoch): the borrower did not take the offer; the unit is the lender's again. */
kvs_status kvs_lender_on_decline(kvs_lender *l, uint32_t unit, uint32_t epoch);
/* Ask a lent unit back: *epoch gets the epoch the RECLAIM carries. KVS_ESTATE if it is not lent. */
kvs_status kvs_lender_reclaim(kvs_lender *l, uint32_t unit, uint32_t *epoch);
/* RELEASED(unit, epoch): a unit being reclaimed (or lent: the borrower gave it back unasked) is the
 * lender's again. A stale one changes nothing (KVS_ESTATE). */
kvs_status kvs_lender_on_released(kvs_lender *l, uint32_t unit, uint32_t epoch);
/* The connection to the borrower is lost (its socket closed or failed): every unit not the
 * lender's is quarantined, offered ones too (the borrower may have taken the offer and be using the
 * unit, its ACCEPT lost with the connection). A new borrower may connect. */
void kvs_lender_disconnected(kvs_lender *l);
/* The borrower that held the quarantined units is known to be gone (its process ended): they come
 * back. */
void kvs_lender_borrower_gone(kvs_lender *l);
/* 1 when the lender may use the unit. */
int kvs_lender_may_use(const kvs_lender *l, uint32_t unit);

/* ---- the borrower ------------------------------------------------------------------------------ */

typedef enum kvs_borrow_unit_state {
    KVS_BORROW_NONE = 0, /* not ours */
    KVS_BORROW_USABLE,   /* ours: I/O may start */
    KVS_BORROW_DRAINING, /* asked back: no new I/O; RELEASED once in_flight is 0 and it is empty */
} kvs_borrow_unit_state;

typedef struct kvs_borrower {
    uint32_t n_units;
    uint8_t state[KVS_LEND_MAX_UNITS];
    uint32_t epoch[KVS_LEND_MAX_UNITS];     /* the epoch it holds (or last held) the unit under */
    uint32_t seen[KVS_LEND_MAX_UNITS];      /* the newest epoch offered, taken or declined */
    uint32_t in_flight[KVS_LEND_MAX_UNITS]; /* reads and writes started, not finished */
    int lender;                             /* the lender is alive */
} kvs_borrower;

kvs_status kvs_borrower_init(kvs_borrower *b, uint32_t n_units);
/* OFFER(unit, epoch): take it (KVS_OK: answer ACCEPT) unless the lender is dead, the unit is ours
 * already, I/O on it is still in flight, or the epoch is not newer than every offer of the unit
 * seen so far, taken or declined (a late or repeated offer) (KVS_ESTATE: answer DECLINE, or nothing
 * for a dead lender). */
kvs_status kvs_borrower_on_offer(kvs_borrower *b, uint32_t unit, uint32_t epoch);
/* Start I/O on a unit: KVS_OK and counted in flight only while it is usable (the tier turns
 * anything else into a miss, or a save elsewhere). */
kvs_status kvs_borrower_begin_io(kvs_borrower *b, uint32_t unit);
/* I/O on the unit finished. *release is set to 1 when that was the last I/O of a draining unit
 * that the tier has emptied (then answer RELEASED). */
void kvs_borrower_end_io(kvs_borrower *b, uint32_t unit, int emptied, int *release);
/* RECLAIM(unit, epoch): no new I/O on it. *release is set to 1 when nothing is in flight and the
 * tier says it is already empty (answer RELEASED at once); otherwise the tier empties it and
 * answers when kvs_borrower_drained says so. A stale RECLAIM changes nothing (KVS_ESTATE). */
kvs_status kvs_borrower_on_reclaim(kvs_borrower *b, uint32_t unit, uint32_t epoch, int emptied,
                                   int *release);
/* The tier emptied a draining unit: *release is set to 1 when nothing is in flight either. */
void kvs_borrower_drained(kvs_borrower *b, uint32_t unit, int *release);
/* RELEASED was sent for the unit (reclaimed, or given back unasked from usable with nothing in
 * flight): it is not ours any more. KVS_ESTATE when I/O is still in flight. */
kvs_status kvs_borrower_release(kvs_borrower *b, uint32_t unit, uint32_t *epoch);
/* The lender is gone: no unit is usable from now on, whatever is in flight (its memory may be
 * gone); the tier turns what they held into misses. I/O in flight stays counted until it ends. */
void kvs_borrower_lender_died(kvs_borrower *b);
/* A new lender (its HELLO): its epochs start afresh. A unit with I/O still in flight from before
 * is declined until that ends. */
void kvs_borrower_connect(kvs_borrower *b);

#ifdef __cplusplus
}
#endif

#endif
