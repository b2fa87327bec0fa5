/* lending.c - the lender's and the borrower's state machines (lending.h). */
#include "backends/peer_gpu/lending.h"

#include <string.h>

kvs_status kvs_lender_init(kvs_lender *l, uint32_t n_units) {
    memset(l, 0, sizeof *l);
    if (n_units == 0 || n_units > KVS_LEND_MAX_UNITS) return KVS_EINVAL;
    l->n_units = n_units;
    return KVS_OK;
}

kvs_status kvs_lender_connect(kvs_lender *l) {
    if (l->borrower) return KVS_ESTATE;
    l->borrower = 1;
    return KVS_OK;
}

kvs_status kvs_lender_offer(kvs_lender *l, uint32_t unit, uint32_t *epoch) {
    if (unit >= l->n_units || !l->borrower || l->state[unit] != KVS_LEND_OWNED) return KVS_ESTATE;
    l->state[unit] = KVS_LEND_OFFERED;
    *epoch = ++l->epoch[unit];
    return KVS_OK;
}

/* The unit is in `want` under this epoch: the message is about its current lending. */
static int current(const kvs_lender *l, uint32_t unit, uint32_t epoch, uint8_t want) {
    return unit < l->n_units && l->borrower && l->state[unit] == want && l->epoch[unit] == epoch;
}

kvs_status kvs_lender_on_accept(kvs_lender *l, uint32_t unit, uint32_t epoch) {
    if (!current(l, unit, epoch, KVS_LEND_OFFERED)) return KVS_ESTATE;
    l->state[unit] = KVS_LEND_LENT;
    return KVS_OK;
}

kvs_status kvs_lender_on_decline(kvs_lender *l, uint32_t unit, uint32_t epoch) {
    if (!current(l, unit, epoch, KVS_LEND_OFFERED)) return KVS_ESTATE;
    l->state[unit] = KVS_LEND_OWNED;
    return KVS_OK;
}

kvs_status kvs_lender_reclaim(kvs_lender *l, uint32_t unit, uint32_t *epoch) {
    if (unit >= l->n_units || l->state[unit] != KVS_LEND_LENT) return KVS_ESTATE;
    l->state[unit] = KVS_LEND_RECLAIMING;
    *epoch = l->epoch[unit];
    return KVS_OK;
}

kvs_status kvs_lender_on_released(kvs_lender *l, uint32_t unit, uint32_t epoch) {
    if (!current(l, unit, epoch, KVS_LEND_RECLAIMING) && !current(l, unit, epoch, KVS_LEND_LENT))
        return KVS_ESTATE;
    l->state[unit] = KVS_LEND_OWNED;
    return KVS_OK;
}

void kvs_lender_disconnected(kvs_lender *l) {
    /* an offered unit too: the borrower may have taken it, its ACCEPT lost with the connection */
    for (uint32_t u = 0; u < l->n_units; u++)
        if (l->state[u] != KVS_LEND_OWNED) l->state[u] = KVS_LEND_QUARANTINED;
    l->borrower = 0;
}

void kvs_lender_borrower_gone(kvs_lender *l) {
    for (uint32_t u = 0; u < l->n_units; u++)
        if (l->state[u] == KVS_LEND_QUARANTINED) l->state[u] = KVS_LEND_OWNED;
}

int kvs_lender_may_use(const kvs_lender *l, uint32_t unit) {
    return unit < l->n_units && l->state[unit] == KVS_LEND_OWNED;
}

kvs_status kvs_borrower_init(kvs_borrower *b, uint32_t n_units) {
    memset(b, 0, sizeof *b);
    if (n_units == 0 || n_units > KVS_LEND_MAX_UNITS) return KVS_EINVAL;
    b->n_units = n_units;
    b->lender = 1;
    return KVS_OK;
}

kvs_status kvs_borrower_on_offer(kvs_borrower *b, uint32_t unit, uint32_t epoch) {
    if (!b->lender || unit >= b->n_units) return KVS_ESTATE;
    int fresh = epoch > b->seen[unit];
    if (fresh) b->seen[unit] = epoch; /* a copy of this offer, declined or not, is never taken */
    if (!fresh || b->state[unit] != KVS_BORROW_NONE || b->in_flight[unit] != 0) return KVS_ESTATE;
    b->state[unit] = KVS_BORROW_USABLE;
    b->epoch[unit] = epoch;
    return KVS_OK;
}

kvs_status kvs_borrower_begin_io(kvs_borrower *b, uint32_t unit) {
    if (!b->lender || unit >= b->n_units || b->state[unit] != KVS_BORROW_USABLE) return KVS_ESTATE;
    b->in_flight[unit]++;
    return KVS_OK;
}

void kvs_borrower_end_io(kvs_borrower *b, uint32_t unit, int emptied, int *release) {
    *release = 0;
    if (unit >= b->n_units || b->in_flight[unit] == 0) return;
    b->in_flight[unit]--;
    *release =
        b->lender && b->state[unit] == KVS_BORROW_DRAINING && emptied && b->in_flight[unit] == 0;
}

kvs_status kvs_borrower_on_reclaim(kvs_borrower *b, uint32_t unit, uint32_t epoch, int emptied,
                                   int *release) {
    *release = 0;
    if (!b->lender || unit >= b->n_units || b->epoch[unit] != epoch ||
        b->state[unit] == KVS_BORROW_NONE)
        return KVS_ESTATE;
    b->state[unit] = KVS_BORROW_DRAINING;
    *release = emptied && b->in_flight[unit] == 0;
    return KVS_OK;
}

void kvs_borrower_drained(kvs_borrower *b, uint32_t unit, int *release) {
    *release = b->lender && unit < b->n_units && b->state[unit] == KVS_BORROW_DRAINING &&
               b->in_flight[unit] == 0;
}

kvs_status kvs_borrower_release(kvs_borrower *b, uint32_t unit, uint32_t *epoch) {
    if (unit >= b->n_units || b->state[unit] == KVS_BORROW_NONE || b->in_flight[unit] != 0)
        return KVS_ESTATE;
    b->state[unit] = KVS_BORROW_NONE;
    *epoch = b->epoch[unit];
    return KVS_OK;
}

void kvs_borrower_lender_died(kvs_borrower *b) {
    b->lender = 0;
    for (uint32_t u = 0; u < b->n_units; u++) b->state[u] = KVS_BORROW_NONE;
}

void kvs_borrower_connect(kvs_borrower *b) {
    b->lender = 1;
    memset(b->epoch, 0, sizeof b->epoch);
    memset(b->seen, 0, sizeof b->seen);
}
