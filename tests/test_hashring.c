/* test_hashring.c - rendezvous hashing over the remote tier's nodes (backends/ucx/hashring): homes
 * are distinct and ordered, keys spread evenly, a node added or removed moves only its share, and a
 * down node is skipped. */
#include <check.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ucx/hashring.h"
#include "tests/support/wire_messages.h"

/* ---- rendezvous hashing ---------------------------------------------------------------------- */

static void ring_of(kvs_remote_ring *ring, uint32_t n, uint32_t first) {
    kvs_remote_ring_init(ring);
    for (uint32_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "node-%u:13337", first + i);
        ck_assert_int_eq(kvs_remote_ring_add(ring, id), KVS_OK);
    }
}

static const char *primary(const kvs_remote_ring *ring, uint32_t k) {
    kvs_key key = kvs_test_wire_key(k);
    uint32_t out[1], n;
    ck_assert_int_eq(kvs_remote_ring_homes(ring, &key, 1, out, &n), KVS_OK);
    ck_assert_uint_eq(n, 1);
    return ring->nodes[out[0]].id;
}

START_TEST(homes_are_distinct_ordered_and_independent_of_insertion_order) {
    kvs_remote_ring fwd, rev;
    ring_of(&fwd, 6, 0);
    kvs_remote_ring_init(&rev);
    for (int i = 5; i >= 0; i--) {
        char id[32];
        snprintf(id, sizeof id, "node-%d:13337", i);
        ck_assert_int_eq(kvs_remote_ring_add(&rev, id), KVS_OK);
    }
    for (uint32_t k = 0; k < 2000; k++) {
        kvs_key key = kvs_test_wire_key(k);
        uint32_t a[3], b[3], all[6], na, nb, nall;
        ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 3, a, &na), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&rev, &key, 3, b, &nb), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 6, all, &nall), KVS_OK);
        ck_assert_uint_eq(na, 3);
        ck_assert_uint_eq(nall, 6);
        for (int i = 0; i < 3; i++) {
            ck_assert_str_eq(fwd.nodes[a[i]].id, rev.nodes[b[i]].id);
            ck_assert_uint_eq(a[i], all[i]); /* the top 3 are the prefix of the full order */
            for (int j = 0; j < i; j++) ck_assert_uint_ne(a[i], a[j]);
        }
    }
    uint32_t out[8], n;
    kvs_key key = kvs_test_wire_key(1);
    ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 8, out, &n), KVS_OK);
    ck_assert_uint_eq(n, 6); /* fewer nodes than asked for */
    ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, 0, out, &n), KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_ring_homes(&fwd, &key, KVS_REMOTE_RING_MAX_REPLICAS + 1, out, &n),
                     KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_ring_add(&fwd, "node-1:13337"), KVS_EINVAL); /* duplicate */
    ck_assert_int_eq(kvs_remote_ring_add(&fwd, ""), KVS_EINVAL);
}
END_TEST

#define SPREAD_KEYS 100000u

START_TEST(keys_spread_evenly_over_nodes) {
    kvs_remote_ring ring;
    ring_of(&ring, 10, 0);
    uint32_t count[10] = {0};
    for (uint32_t k = 0; k < SPREAD_KEYS; k++) {
        kvs_key key = kvs_test_wire_key(k);
        uint32_t out[1], n;
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 1, out, &n), KVS_OK);
        count[out[0]]++;
    }
    for (int i = 0; i < 10; i++) /* 10000 expected, sd ~95 */
        ck_assert_msg(count[i] > 9400 && count[i] < 10600, "node %d holds %u of %u keys", i,
                      count[i], SPREAD_KEYS);
}
END_TEST

START_TEST(adding_a_node_moves_about_one_key_in_n_and_only_onto_it) {
    kvs_remote_ring before, after;
    ring_of(&before, 10, 0);
    ring_of(&after, 11, 0);
    uint32_t moved = 0;
    for (uint32_t k = 0; k < SPREAD_KEYS; k++) {
        const char *a = primary(&before, k), *b = primary(&after, k);
        if (strcmp(a, b) != 0) {
            moved++;
            ck_assert_str_eq(b, "node-10:13337");
        }
    }
    double frac = (double)moved / SPREAD_KEYS; /* 1/11 = 0.0909, sd ~0.0009 */
    ck_assert_msg(frac > 0.085 && frac < 0.097, "moved %.4f of keys", frac);
}
END_TEST

START_TEST(removing_a_node_moves_only_its_keys) {
    kvs_remote_ring before, after;
    ring_of(&before, 10, 0);
    ring_of(&after, 10, 0);
    ck_assert_int_eq(kvs_remote_ring_remove(&after, "node-4:13337"), KVS_OK);
    ck_assert_int_eq(kvs_remote_ring_remove(&after, "node-4:13337"), KVS_ENOTFOUND);
    ck_assert_uint_eq(after.n_nodes, 9);
    uint32_t moved = 0;
    for (uint32_t k = 0; k < SPREAD_KEYS; k++) {
        const char *a = primary(&before, k), *b = primary(&after, k);
        int held = strcmp(a, "node-4:13337") == 0;
        ck_assert_int_eq(strcmp(a, b) != 0, held);
        moved += (uint32_t)held;
    }
    double frac = (double)moved / SPREAD_KEYS;
    ck_assert_msg(frac > 0.094 && frac < 0.106, "moved %.4f of keys", frac);
}
END_TEST

START_TEST(a_down_node_is_skipped_for_the_next_preferred) {
    kvs_remote_ring ring;
    ring_of(&ring, 5, 0);
    uint32_t skipped = 0;
    for (uint32_t k = 0; k < 500; k++) {
        kvs_key key = kvs_test_wire_key(k);
        uint32_t full[5], n, part[2], m;
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 5, full, &n), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_set_down(&ring, ring.nodes[full[0]].id, 1), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 2, part, &m), KVS_OK);
        ck_assert_uint_eq(m, 2);
        ck_assert_uint_eq(part[0], full[1]);
        ck_assert_uint_eq(part[1], full[2]);
        ck_assert_int_eq(kvs_remote_ring_set_down(&ring, ring.nodes[full[0]].id, 0), KVS_OK);
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 1, part, &m), KVS_OK);
        ck_assert_uint_eq(part[0], full[0]);
        skipped++;
    }
    ck_assert_uint_eq(skipped, 500);
    for (uint32_t i = 0; i < 5; i++)
        ck_assert_int_eq(kvs_remote_ring_set_down(&ring, ring.nodes[i].id, 1), KVS_OK);
    kvs_key key = kvs_test_wire_key(0);
    uint32_t out[1], n = 99;
    ck_assert_int_eq(kvs_remote_ring_homes(&ring, &key, 1, out, &n), KVS_ENOTFOUND);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(kvs_remote_ring_set_down(&ring, "nobody", 1), KVS_ENOTFOUND);
}
END_TEST

static Suite *hashring_suite(void) {
    Suite *s = suite_create("hashring");
    TCase *ring = tcase_create("hashring");
    tcase_set_timeout(ring, 60);
    tcase_add_test(ring, homes_are_distinct_ordered_and_independent_of_insertion_order);
    tcase_add_test(ring, keys_spread_evenly_over_nodes);
    tcase_add_test(ring, adding_a_node_moves_about_one_key_in_n_and_only_onto_it);
    tcase_add_test(ring, removing_a_node_moves_only_its_keys);
    tcase_add_test(ring, a_down_node_is_skipped_for_the_next_preferred);
    suite_add_tcase(s, ring);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(hashring_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
