/* test_lending.c - the peer-GPU tier's lending protocol (backends/peer_gpu/lending.h): lend,
 * reclaim while I/O is in flight, stale messages, deaths on either side, and a random run of both
 * state machines over two ordered queues that checks after every step that the lender never
 * holds a unit the borrower can still touch. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "backends/peer_gpu/lending.h"

START_TEST(a_unit_is_lent_in_two_steps_and_taken_back_in_two) {
    kvs_lender *l = malloc(sizeof *l);
    kvs_borrower *b = malloc(sizeof *b);
    ck_assert_int_eq(kvs_lender_init(l, 4), KVS_OK);
    ck_assert_int_eq(kvs_borrower_init(b, 4), KVS_OK);
    uint32_t e, e2;
    ck_assert_int_eq(kvs_lender_offer(l, 1, &e), KVS_ESTATE); /* nobody to lend to */
    ck_assert_int_eq(kvs_lender_connect(l), KVS_OK);
    ck_assert_int_eq(kvs_lender_connect(l), KVS_ESTATE); /* one borrower at a time */
    ck_assert_int_eq(kvs_lender_offer(l, 1, &e), KVS_OK);
    ck_assert(!kvs_lender_may_use(l, 1)); /* offered: neither side uses it */
    ck_assert_int_eq(kvs_borrower_begin_io(b, 1), KVS_ESTATE);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, e), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_accept(l, 1, e), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_accept(l, 1, e), KVS_ESTATE); /* twice: nothing changes */
    /* two reads in flight when the lender asks it back */
    ck_assert_int_eq(kvs_borrower_begin_io(b, 1), KVS_OK);
    ck_assert_int_eq(kvs_borrower_begin_io(b, 1), KVS_OK);
    ck_assert_int_eq(kvs_lender_reclaim(l, 1, &e2), KVS_OK);
    ck_assert_uint_eq(e2, e);
    ck_assert(!kvs_lender_may_use(l, 1));
    int release = 1;
    ck_assert_int_eq(kvs_borrower_on_reclaim(b, 1, e2, 1, &release), KVS_OK);
    ck_assert_int_eq(release, 0);                                  /* reads still in flight */
    ck_assert_int_eq(kvs_borrower_begin_io(b, 1), KVS_ESTATE);     /* no new I/O */
    ck_assert_int_eq(kvs_borrower_release(b, 1, &e2), KVS_ESTATE); /* not while reads run */
    kvs_borrower_end_io(b, 1, 1, &release);
    ck_assert_int_eq(release, 0);
    kvs_borrower_end_io(b, 1, 1, &release);
    ck_assert_int_eq(release, 1); /* the last one: answer RELEASED */
    ck_assert_int_eq(kvs_borrower_release(b, 1, &e2), KVS_OK);
    ck_assert(!kvs_lender_may_use(l, 1)); /* not before the message arrives */
    ck_assert_int_eq(kvs_lender_on_released(l, 1, e2), KVS_OK);
    ck_assert(kvs_lender_may_use(l, 1));
    /* lent again: a new epoch, and the old one's messages are ignored */
    uint32_t e3;
    ck_assert_int_eq(kvs_lender_offer(l, 1, &e3), KVS_OK);
    ck_assert_uint_eq(e3, e + 1);
    ck_assert_int_eq(kvs_lender_on_accept(l, 1, e), KVS_ESTATE);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, e3), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_accept(l, 1, e3), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_released(l, 1, e), KVS_ESTATE);
    ck_assert(!kvs_lender_may_use(l, 1));
    ck_assert_int_eq(kvs_borrower_on_reclaim(b, 1, e, 1, &release), KVS_ESTATE); /* stale */
    ck_assert_int_eq(kvs_borrower_begin_io(b, 1), KVS_OK);
    kvs_borrower_end_io(b, 1, 0, &release);
    ck_assert_int_eq(release, 0); /* usable, not draining */
    free(l), free(b);
}
END_TEST

START_TEST(a_declined_offer_and_an_empty_reclaim) {
    kvs_lender *l = malloc(sizeof *l);
    kvs_borrower *b = malloc(sizeof *b);
    kvs_lender_init(l, 2), kvs_borrower_init(b, 2), kvs_lender_connect(l);
    uint32_t e, e2;
    int release = 0;
    ck_assert_int_eq(kvs_lender_offer(l, 0, &e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, e), KVS_ESTATE); /* ours already: decline */
    ck_assert_int_eq(kvs_lender_on_accept(l, 0, e), KVS_OK);
    /* nothing in flight, nothing stored: released at once */
    ck_assert_int_eq(kvs_lender_reclaim(l, 0, &e2), KVS_OK);
    ck_assert_int_eq(kvs_lender_reclaim(l, 0, &e2), KVS_ESTATE); /* already asked */
    ck_assert_int_eq(kvs_borrower_on_reclaim(b, 0, e2, 1, &release), KVS_OK);
    ck_assert_int_eq(release, 1);
    ck_assert_int_eq(kvs_borrower_release(b, 0, &e2), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_released(l, 0, e2), KVS_OK);
    ck_assert(kvs_lender_may_use(l, 0));
    /* stored objects still there: released once the tier has emptied it */
    ck_assert_int_eq(kvs_lender_offer(l, 1, &e), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_decline(l, 1, e), KVS_OK);
    ck_assert(kvs_lender_may_use(l, 1));
    ck_assert_int_eq(kvs_lender_offer(l, 1, &e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, e), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_accept(l, 1, e), KVS_OK);
    ck_assert_int_eq(kvs_lender_reclaim(l, 1, &e2), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_reclaim(b, 1, e2, 0, &release), KVS_OK);
    ck_assert_int_eq(release, 0);
    kvs_borrower_drained(b, 1, &release);
    ck_assert_int_eq(release, 1);
    ck_assert_int_eq(kvs_borrower_release(b, 1, &e2), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_released(l, 1, e2), KVS_OK);
    /* a borrower may give a unit back unasked; the same message twice changes nothing */
    ck_assert_int_eq(kvs_lender_offer(l, 0, &e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, e), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_accept(l, 0, e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_release(b, 0, &e2), KVS_OK);
    ck_assert_int_eq(kvs_lender_on_released(l, 0, e2), KVS_OK);
    ck_assert(kvs_lender_may_use(l, 0));
    ck_assert_int_eq(kvs_lender_on_released(l, 0, e2), KVS_ESTATE);
    ck_assert_int_eq(kvs_borrower_release(b, 0, &e2), KVS_ESTATE); /* not ours any more */
    free(l), free(b);
}
END_TEST

START_TEST(a_death_on_either_side_ends_every_lending) {
    kvs_lender *l = malloc(sizeof *l);
    kvs_borrower *b = malloc(sizeof *b);
    kvs_lender_init(l, 3), kvs_borrower_init(b, 3), kvs_lender_connect(l);
    uint32_t e;
    int release;
    for (uint32_t u = 0; u < 3; u++) {
        ck_assert_int_eq(kvs_lender_offer(l, u, &e), KVS_OK);
        ck_assert_int_eq(kvs_borrower_on_offer(b, u, e), KVS_OK);
        if (u < 2) ck_assert_int_eq(kvs_lender_on_accept(l, u, e), KVS_OK);
    }
    ck_assert_int_eq(kvs_lender_reclaim(l, 1, &e), KVS_OK);
    /* the connection is lost: every unit the borrower held or may have taken waits until its
     * process is known to be gone - the offered one too (unit 2: the borrower took the offer and
     * may be writing into it; its ACCEPT went down with the connection) */
    kvs_lender_disconnected(l);
    ck_assert(!kvs_lender_may_use(l, 0));
    ck_assert(!kvs_lender_may_use(l, 1));
    ck_assert(!kvs_lender_may_use(l, 2));
    ck_assert_int_eq(kvs_borrower_begin_io(b, 2), KVS_OK); /* what the lender must not race */
    kvs_borrower_end_io(b, 2, 1, &release);
    ck_assert_int_eq(kvs_lender_on_accept(l, 2, e), KVS_ESTATE); /* a late message: ignored */
    ck_assert_int_eq(kvs_lender_offer(l, 0, &e), KVS_ESTATE);    /* nobody to lend to */
    kvs_lender_borrower_gone(l);
    for (uint32_t u = 0; u < 3; u++) ck_assert(kvs_lender_may_use(l, u));
    /* a new borrower; then the lender dies with I/O in flight */
    kvs_borrower_init(b, 3);
    ck_assert_int_eq(kvs_lender_connect(l), KVS_OK);
    ck_assert_int_eq(kvs_lender_offer(l, 0, &e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_begin_io(b, 0), KVS_OK);
    kvs_borrower_lender_died(b);
    ck_assert_int_eq(kvs_borrower_begin_io(b, 0), KVS_ESTATE); /* misses from now on */
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, 9), KVS_ESTATE);
    /* a new lender: its epochs start afresh; the unit whose read still runs is declined */
    kvs_borrower_connect(b);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, 1), KVS_ESTATE);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, 1), KVS_OK);
    kvs_borrower_end_io(b, 0, 1, &release);
    ck_assert_int_eq(release, 0);                                 /* nobody to answer */
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, 1), KVS_ESTATE); /* the declined one, again */
    ck_assert_int_eq(kvs_borrower_on_offer(b, 0, 2), KVS_OK);     /* offered anew */
    /* a late copy of an offer already taken and given back is declined, and so is a late copy of
     * one declined */
    ck_assert_int_eq(kvs_borrower_on_offer(b, 2, 5), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 2, 6), KVS_ESTATE); /* ours already: declined */
    ck_assert_int_eq(kvs_borrower_release(b, 2, &e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 2, 6), KVS_ESTATE); /* its late copy */
    ck_assert_int_eq(kvs_borrower_release(b, 1, &e), KVS_OK);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, 1), KVS_ESTATE);
    ck_assert_int_eq(kvs_borrower_on_offer(b, 1, 2), KVS_OK);
    ck_assert_int_eq(kvs_lender_init(l, KVS_LEND_MAX_UNITS + 1), KVS_EINVAL);
    ck_assert_int_eq(kvs_borrower_init(b, 0), KVS_EINVAL);
    free(l), free(b);
}
END_TEST

/* Two ordered queues, random steps on both sides; after every step, a unit the lender may use is
 * neither usable by the borrower nor under its I/O. */
typedef struct msg {
    int kind; /* 0 offer, 1 reclaim (lender to borrower); 2 accept, 3 decline, 4 released */
    uint32_t unit, epoch;
} msg;

typedef struct queue {
    msg m[1 << 14];
    uint32_t head, tail;
} queue;

static void push(queue *q, msg m) {
    ck_assert_uint_lt(q->tail - q->head, 1u << 14);
    q->m[q->tail++ % (1u << 14)] = m;
}

START_TEST(random_runs_never_share_a_unit) {
    enum { UNITS = 8, STEPS = 200000 };
    kvs_lender *l = malloc(sizeof *l);
    kvs_borrower *b = malloc(sizeof *b);
    queue *down = calloc(1, sizeof *down), *up = calloc(1, sizeof *up);
    uint8_t stored[UNITS] = {0}; /* the borrower's tier holds objects in the unit */
    msg last_offer[UNITS];
    memset(last_offer, 0, sizeof last_offer);
    uint64_t restarts = 0;
    kvs_lender_init(l, UNITS), kvs_borrower_init(b, UNITS), kvs_lender_connect(l);
    uint64_t x = 0x2545f4914f6cdd1dull, lent = 0, reclaimed = 0;
    for (int s = 0; s < STEPS; s++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t u = (uint32_t)(x >> 32) % UNITS, e;
        int release = 0;
        if ((x >> 20) % 4096 ==
            0) { /* the borrower crashes and a new one connects: the queues go */
            kvs_lender_disconnected(l);
            kvs_lender_borrower_gone(l); /* the tier saw its process end */
            kvs_borrower_init(b, UNITS);
            memset(stored, 0, sizeof stored);
            memset(last_offer, 0, sizeof last_offer); /* an old connection's copies are gone too */
            down->head = down->tail, up->head = up->tail;
            ck_assert_int_eq(kvs_lender_connect(l), KVS_OK);
            restarts++;
            continue;
        }
        switch ((x >> 8) % 10) {
            case 0:
                if (kvs_lender_offer(l, u, &e) == KVS_OK) {
                    last_offer[u] = (msg){0, u, e};
                    push(down, last_offer[u]);
                }
                break;
            case 9: /* a late copy of the unit's last offer */
                if (last_offer[u].epoch) push(down, last_offer[u]);
                break;
            case 1:
                if (kvs_lender_reclaim(l, u, &e) == KVS_OK) push(down, (msg){1, u, e});
                break;
            case 2: /* the borrower reads from or writes into the unit */
                if (kvs_borrower_begin_io(b, u) == KVS_OK) stored[u] = 1;
                break;
            case 3:
                if (b->in_flight[u]) {
                    kvs_borrower_end_io(b, u, !stored[u], &release);
                    if (release && kvs_borrower_release(b, u, &e) == KVS_OK)
                        push(up, (msg){4, u, e});
                }
                break;
            case 4: /* the tier moves a draining unit's objects down the chain */
                if (b->state[u] == KVS_BORROW_DRAINING) {
                    stored[u] = 0;
                    kvs_borrower_drained(b, u, &release);
                    if (release && kvs_borrower_release(b, u, &e) == KVS_OK)
                        push(up, (msg){4, u, e});
                }
                break;
            case 5: /* given back unasked */
                if (b->state[u] == KVS_BORROW_USABLE && !b->in_flight[u] &&
                    kvs_borrower_release(b, u, &e) == KVS_OK) {
                    stored[u] = 0;
                    push(up, (msg){4, u, e});
                }
                break;
            case 6:
            case 7:
                if (down->head != down->tail) { /* the borrower reads a message */
                    msg m = down->m[down->head++ % (1u << 14)];
                    if (m.kind == 0) {
                        kvs_status st = kvs_borrower_on_offer(b, m.unit, m.epoch);
                        push(up, (msg){st == KVS_OK ? 2 : 3, m.unit, m.epoch});
                    } else if (kvs_borrower_on_reclaim(b, m.unit, m.epoch, !stored[m.unit],
                                                       &release) == KVS_OK &&
                               release && kvs_borrower_release(b, m.unit, &e) == KVS_OK) {
                        push(up, (msg){4, m.unit, e});
                    }
                }
                break;
            default:
                if (up->head != up->tail) { /* the lender reads a message */
                    msg m = up->m[up->head++ % (1u << 14)];
                    if (m.kind == 2) lent += kvs_lender_on_accept(l, m.unit, m.epoch) == KVS_OK;
                    if (m.kind == 3) kvs_lender_on_decline(l, m.unit, m.epoch);
                    if (m.kind == 4)
                        reclaimed += kvs_lender_on_released(l, m.unit, m.epoch) == KVS_OK;
                }
        }
        for (uint32_t v = 0; v < UNITS; v++)
            if (kvs_lender_may_use(l, v))
                ck_assert_msg(b->state[v] == KVS_BORROW_NONE && b->in_flight[v] == 0,
                              "step %d: unit %u is the lender's and the borrower's", s, v);
    }
    ck_assert_uint_gt(lent, 1000); /* the run exercised the protocol */
    ck_assert_uint_gt(reclaimed, 1000);
    ck_assert_uint_gt(restarts, 10);
    free(l), free(b), free(down), free(up);
}
END_TEST

int main(void) {
    Suite *s = suite_create("lending");
    TCase *tc = tcase_create("lending");
    tcase_add_test(tc, a_unit_is_lent_in_two_steps_and_taken_back_in_two);
    tcase_add_test(tc, a_declined_offer_and_an_empty_reclaim);
    tcase_add_test(tc, a_death_on_either_side_ends_every_lending);
    tcase_add_test(tc, random_runs_never_share_a_unit);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
