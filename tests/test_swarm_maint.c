/* test_swarm_maint.c - cluster maintenance (schedulers/swarm/swarm_maint): new entries join the
 * clusters they fire with (Eq. 9), continuing the cluster's stripe; the pending pool is clustered
 * every k windows (notes §6.2 item 11). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/swarm/swarm.h"

/* ---- 11. maintenance ---------------------------------------------------------------------------- */

typedef struct maint_fixture {
    kvs_swarm_clusters *c;
    kvs_swarm_layout layout;
    kvs_swarm_maint *m;
} maint_fixture;

/* Clusters {0, 1, 2} and {3, 4} on 4 paths: starts 0 and 3; next slots 2, 1, 1, 1 after placement. */
static void maint_setup(maint_fixture *f, uint32_t paper_offset, double tau) {
    ck_assert_int_eq(kvs_swarm_clusters_create(32, &f->c), KVS_OK);
    uint32_t k;
    ck_assert_int_eq(kvs_swarm_clusters_add(f->c, &k), KVS_OK);
    for (uint32_t e = 0; e < 3; e++)
        ck_assert_int_eq(kvs_swarm_clusters_add_member(f->c, k, e), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_add(f->c, &k), KVS_OK);
    for (uint32_t e = 3; e < 5; e++)
        ck_assert_int_eq(kvs_swarm_clusters_add_member(f->c, k, e), KVS_OK);
    ck_assert_int_eq(kvs_swarm_layout_init(&f->layout, 4, KVS_SWARM_BALANCE_GLOBAL_POINTER),
                     KVS_OK);
    kvs_swarm_layout_place(&f->layout, f->c, 0);
    ck_assert_uint_eq(f->c->items[0].start_path, 0);
    ck_assert_uint_eq(f->c->items[1].start_path, 3);
    kvs_swarm_maint_params prm;
    kvs_swarm_maint_defaults(&prm);
    prm.window_steps = 10;
    prm.tau = tau;
    prm.paper_offset = paper_offset;
    prm.pending_windows = 0;
    ck_assert_int_eq(kvs_swarm_maint_create(&prm, f->c, &f->layout, &f->m), KVS_OK);
}

static void maint_teardown(maint_fixture *f) {
    kvs_swarm_maint_destroy(f->m);
    kvs_swarm_clusters_destroy(f->c);
}

/* Ten steps. Cluster 0's medoid fires in steps 0-7, cluster 1's in 3-9. Entry 10 fires in 0-4 (5 with
 * cluster 0: exactly (1 - tau) W at tau 0.5; 2 with cluster 1), entry 11 in every step (8 and 7), and
 * entries 12 and 13 together in 6-9 (4 with cluster 1, 2 with cluster 0). */
static void maint_run(maint_fixture *f) {
    for (uint32_t e = 10; e <= 13; e++) ck_assert_int_eq(kvs_swarm_maint_add(f->m, e), KVS_OK);
    for (uint32_t t = 0; t < 10; t++) {
        uint32_t active[8], n = 0, clusters[2], n_c = 0;
        if (t < 5) active[n++] = 10;
        active[n++] = 11;
        if (t >= 6) {
            active[n++] = 12;
            active[n++] = 13;
        }
        if (t < 8) clusters[n_c++] = 0;
        if (t >= 3) clusters[n_c++] = 1;
        ck_assert_int_eq(kvs_swarm_maint_step(f->m, active, n, clusters, n_c), KVS_OK);
        if (t < 9) ck_assert_uint_eq(f->m->n_placed, 0); /* nobody leaves before W steps */
    }
}

static int member_at(const kvs_swarm_clusters *c, uint32_t k, uint32_t entry, uint32_t *path) {
    for (uint32_t m = 0; m < c->items[k].n_members; m++)
        if (c->items[k].members[m] == entry) {
            *path = c->items[k].paths[m];
            return 1;
        }
    return 0;
}

START_TEST(new_entry_joins_matching_clusters_continuing_their_stripe) {
    maint_fixture f;
    maint_setup(&f, 0, 0.5);
    maint_run(&f);
    uint32_t path;
    /* 10: f = 5 = (1 - tau) W joins C0 (<=); it is C0's 4th member: (0 + 3) mod 4. */
    ck_assert(member_at(f.c, 0, 10, &path));
    ck_assert_uint_eq(path, 3);
    ck_assert(!member_at(f.c, 1, 10, &path));
    /* 11 joins both: two replicas. In C0 as 5th member (0 + 4) mod 4 = 0; in C1 as 3rd, (3 + 2) mod 4. */
    ck_assert(member_at(f.c, 0, 11, &path));
    ck_assert_uint_eq(path, 0);
    ck_assert(member_at(f.c, 1, 11, &path));
    ck_assert_uint_eq(path, 1);
    ck_assert_uint_eq(f.c->copies[11], 2);
    /* 12 and 13 matched nothing (4 of 10 < 5): pending. */
    ck_assert_uint_eq(f.c->copies[12], 0);
    ck_assert_uint_eq(f.m->n_pending, 2);
    ck_assert_uint_eq(f.m->n_joined, 2);
    ck_assert_uint_eq(f.m->n_replicas, 1);
    /* The log names each copy's path and slot: 10 took path 3's slot 1 (after C1's medoid). */
    ck_assert_uint_eq(f.m->n_placed, 3);
    ck_assert_uint_eq(f.m->placed[0].entry, 10);
    ck_assert_uint_eq(f.m->placed[0].path, 3);
    ck_assert_uint_eq(f.m->placed[0].slot, 1);
    /* Flushing the pool clusters 12 with 13 and places the new cluster on the global stripe at 5. */
    uint32_t before = f.c->n_clusters;
    ck_assert_int_eq(kvs_swarm_maint_flush(f.m), KVS_OK);
    ck_assert_uint_eq(f.c->n_clusters, before + 1);
    const kvs_swarm_cluster *nc = &f.c->items[before];
    ck_assert_uint_eq(nc->n_members, 2);
    ck_assert_uint_eq(nc->start_path, 5 % 4);
    ck_assert_uint_eq(f.m->n_pending, 0);
    ck_assert_uint_eq(f.m->n_placed, 5);
    maint_teardown(&f);
}
END_TEST

START_TEST(paper_offset_places_one_path_further_and_a_tighter_tau_rejects_the_boundary) {
    maint_fixture f;
    maint_setup(&f, 1, 0.5);
    maint_run(&f);
    uint32_t path;
    ck_assert(member_at(f.c, 0, 10, &path));
    ck_assert_uint_eq(path, 0); /* (0 + 3 + 1) mod 4 */
    ck_assert(member_at(f.c, 1, 11, &path));
    ck_assert_uint_eq(path, 2); /* (3 + 2 + 1) mod 4 */
    maint_teardown(&f);

    maint_setup(&f, 0, 0.45); /* needs f >= 5.5 of 10: entry 10 (5) now waits in the pool */
    maint_run(&f);
    ck_assert_uint_eq(f.c->copies[10], 0);
    ck_assert_uint_eq(f.c->copies[11], 2);
    ck_assert_uint_eq(f.m->n_pending, 3);
    maint_teardown(&f);
}
END_TEST

START_TEST(pool_is_clustered_every_k_windows_and_max_copies_keeps_the_closest_cluster) {
    maint_fixture f;
    maint_setup(&f, 0, 0.5);
    f.m->params.pending_windows = 2; /* every 20 steps */
    f.m->params.max_copies = 1;
    maint_run(&f);
    /* Entry 11 matched both clusters (8 and 7 of 10) but may join one: the closer, cluster 0. */
    uint32_t path;
    ck_assert_uint_eq(f.c->copies[11], 1);
    ck_assert(member_at(f.c, 0, 11, &path));
    ck_assert_uint_eq(f.m->n_pending, 2);
    uint32_t before = f.c->n_clusters;
    for (uint32_t t = 10; t < 20; t++) {
        ck_assert_uint_eq(f.c->n_clusters, before); /* not due before step 20 */
        ck_assert_int_eq(kvs_swarm_maint_step(f.m, NULL, 0, NULL, 0), KVS_OK);
    }
    ck_assert_uint_eq(f.c->n_clusters, before + 1);
    ck_assert_uint_eq(f.m->n_pending, 0);
    ck_assert_uint_eq(f.m->n_pool_clusters, 1);
    maint_teardown(&f);
}
END_TEST

START_TEST(a_stream_of_new_entries_each_leaves_the_window_after_exactly_w_steps) {
    maint_fixture f;
    ck_assert_int_eq(kvs_swarm_layout_init(&f.layout, 4, KVS_SWARM_BALANCE_GLOBAL_POINTER), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_create(4000, &f.c), KVS_OK);
    uint32_t k;
    ck_assert_int_eq(kvs_swarm_clusters_add(f.c, &k), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_add_member(f.c, k, 0), KVS_OK);
    kvs_swarm_layout_place(&f.layout, f.c, 0);
    kvs_swarm_maint_params prm;
    kvs_swarm_maint_defaults(&prm);
    prm.window_steps = 7;
    prm.pending_windows = 3;
    ck_assert_int_eq(kvs_swarm_maint_create(&prm, f.c, &f.layout, &f.m), KVS_OK);
    /* Two new entries a step; even ones fire with cluster 0's medoid every step, odd ones never. */
    uint32_t next = 1;
    for (uint32_t t = 0; t < 1500; t++) {
        uint32_t active[16], n = 0;
        for (int i = 0; i < 2; i++) ck_assert_int_eq(kvs_swarm_maint_add(f.m, next++), KVS_OK);
        for (uint32_t e = next > 16 ? next - 16 : 1; e < next; e++)
            if (e % 2 == 0) active[n++] = e;
        const uint32_t cluster0 = 0;
        ck_assert_int_eq(kvs_swarm_maint_step(f.m, active, n, &cluster0, 1), KVS_OK);
        uint64_t left = t + 1 >= prm.window_steps ? 2ull * (t + 2 - prm.window_steps) : 0;
        ck_assert_uint_eq(f.m->n_joined + f.m->n_pooled, left);
    }
    ck_assert_uint_eq(f.m->n_joined, f.m->n_pooled); /* the even half joined, the odd half pooled */
    ck_assert_uint_eq(f.c->items[0].n_members, 1 + f.m->n_joined);
    ck_assert_int_eq(kvs_swarm_maint_add(f.m, next - 1), KVS_EINVAL); /* already in the window */
    maint_teardown(&f);
}
END_TEST

static Suite *swarm_maint_suite(void) {
    Suite *s = suite_create("swarm_maint");
    TCase *maint = tcase_create("maintenance");
    tcase_add_test(maint, new_entry_joins_matching_clusters_continuing_their_stripe);
    tcase_add_test(maint,
                   paper_offset_places_one_path_further_and_a_tighter_tau_rejects_the_boundary);
    tcase_add_test(maint,
                   pool_is_clustered_every_k_windows_and_max_copies_keeps_the_closest_cluster);
    tcase_add_test(maint, a_stream_of_new_entries_each_leaves_the_window_after_exactly_w_steps);
    suite_add_tcase(s, maint);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(swarm_maint_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
