/* test_swarm_cache.c - the DRAM cluster cache (schedulers/swarm/swarm_cache): S-score frequencies
 * and the min-heap, eviction order, and the score cache against LRU (notes §6.2 item 12). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/swarm/swarm.h"
#include "tests/support/rng.h"

/* ---- 12. cache ---------------------------------------------------------------------------------- */

static kvs_swarm_cache_params cache_params(kvs_swarm_cache_policy policy, uint64_t capacity) {
    kvs_swarm_cache_params p;
    memset(&p, 0, sizeof p);
    p.policy = policy;
    p.formula = KVS_SWARM_SCORE_PAPER;
    p.capacity_entries = capacity;
    p.t_base_s = 80e-6; /* QD1 4 KiB read */
    p.t_transfer_s = 4096 / 6.9e9;
    return p;
}

static void assert_heap(const kvs_swarm_cache *c) {
    uint64_t used = 0;
    uint32_t n_cached = 0;
    for (uint32_t k = 0; k < c->n_clusters; k++)
        if (c->cached[k]) {
            used += c->size[k];
            n_cached++;
            ck_assert_uint_lt(c->heap_pos[k], c->n_heap);
            ck_assert_uint_eq(c->heap[c->heap_pos[k]], k);
        }
    ck_assert_uint_eq(n_cached, c->n_heap);
    ck_assert_uint_eq(used, c->used_entries);
    ck_assert_uint_le(used, c->params.capacity_entries);
    for (uint32_t i = 1; i < c->n_heap; i++) {
        uint32_t parent = c->heap[(i - 1) / 2], child = c->heap[i];
        if (c->params.policy == KVS_SWARM_CACHE_LRU) {
            uint64_t up = c->last_use[parent], uc = c->last_use[child];
            ck_assert(up < uc || (up == uc && parent < child));
        } else {
            double sp = kvs_swarm_cache_score(c, parent), sc = kvs_swarm_cache_score(c, child);
            ck_assert(sp < sc || (sp == sc && parent < child));
        }
    }
}

START_TEST(frequencies_move_by_one_and_the_heap_holds_after_every_step) {
    const uint32_t sizes[4] = {2, 3, 4, 5}, freqs[4] = {0, 5, 1, 0};
    kvs_swarm_cache_params p = cache_params(KVS_SWARM_CACHE_SCORE, 100);
    kvs_swarm_cache *c = NULL;
    ck_assert_int_eq(kvs_swarm_cache_create(&p, 4, sizes, freqs, &c), KVS_OK);
    const uint32_t s1[] = {0, 1, 1};
    kvs_swarm_cache_result r;
    ck_assert_int_eq(kvs_swarm_cache_step(c, s1, 3, &r), KVS_OK);
    ck_assert_uint_eq(r.misses, 2); /* 1 listed twice counts once */
    ck_assert_uint_eq(r.hits, 0);
    ck_assert_uint_eq(c->freq[0], 1);
    ck_assert_uint_eq(c->freq[1], 6);
    ck_assert_uint_eq(c->freq[2], 1); /* not cached, not active: unchanged */
    ck_assert(c->cached[0] && c->cached[1]);
    const uint32_t s2[] = {2};
    ck_assert_int_eq(kvs_swarm_cache_step(c, s2, 1, &r), KVS_OK);
    ck_assert_uint_eq(c->freq[0], 0); /* cached and inactive: -1 */
    ck_assert_uint_eq(c->freq[1], 5);
    ck_assert_uint_eq(c->freq[2], 2);
    ck_assert_int_eq(kvs_swarm_cache_step(c, s2, 1, &r), KVS_OK);
    ck_assert_uint_eq(c->freq[0], 0); /* clamped */
    ck_assert_uint_eq(r.hits, 1);
    ck_assert_uint_eq(r.hit_entries, 4);
    const uint32_t bad[] = {4};
    ck_assert_int_eq(kvs_swarm_cache_step(c, bad, 1, &r), KVS_EINVAL);
    kvs_swarm_cache_destroy(c);

    /* A random trace over both policies: the heap and the budget hold after every step. */
    uint32_t sz[60], fq[60];
    uint64_t rng = 13;
    for (uint32_t k = 0; k < 60; k++) {
        sz[k] = 1 + kvs_test_rng_below(&rng, 12);
        fq[k] = kvs_test_rng_below(&rng, 5);
    }
    for (int policy = 0; policy < 2; policy++) {
        kvs_swarm_cache_params q = cache_params((kvs_swarm_cache_policy)policy, 80);
        ck_assert_int_eq(kvs_swarm_cache_create(&q, 60, sz, fq, &c), KVS_OK);
        for (int t = 0; t < 300; t++) {
            uint32_t act[8];
            uint32_t n = 1 + kvs_test_rng_below(&rng, 8);
            for (uint32_t i = 0; i < n; i++) act[i] = kvs_test_rng_below(&rng, 60);
            ck_assert_int_eq(kvs_swarm_cache_step(c, act, n, NULL), KVS_OK);
            assert_heap(c);
        }
        ck_assert_uint_gt(c->total.evicted, 0);
        kvs_swarm_cache_destroy(c);
    }
}
END_TEST

START_TEST(lowest_score_cluster_is_evicted_first) {
    /* Equal sizes, so S orders as f. Capacity holds three clusters. */
    const uint32_t sizes[4] = {4, 4, 4, 4}, freqs[4] = {9, 3, 6, 0};
    kvs_swarm_cache_params p = cache_params(KVS_SWARM_CACHE_SCORE, 12);
    kvs_swarm_cache *c = NULL;
    ck_assert_int_eq(kvs_swarm_cache_create(&p, 4, sizes, freqs, &c), KVS_OK);
    const uint32_t warm[] = {0, 1, 2};
    ck_assert_int_eq(kvs_swarm_cache_step(c, warm, 3, NULL), KVS_OK); /* f: 10, 4, 7 */
    ck_assert(c->cached[0] && c->cached[1] && c->cached[2]);
    ck_assert_uint_eq(c->heap[0], 1);
    /* Cluster 3 fires six times; each time it is below cluster 1 until its f passes cluster 1's. */
    const uint32_t three[] = {3};
    kvs_swarm_cache_result r;
    int admitted_at = -1;
    for (int t = 0; t < 6 && admitted_at < 0; t++) {
        ck_assert_int_eq(kvs_swarm_cache_step(c, three, 1, &r), KVS_OK);
        if (r.admitted) admitted_at = t;
    }
    /* f3 after t+1 steps is t+1; f1 drops to 4 - (t+1). They cross at t = 1 (2 > 2 fails), t = 2. */
    ck_assert_int_eq(admitted_at, 2);
    ck_assert(!c->cached[1]); /* the lowest S went */
    ck_assert(c->cached[0] && c->cached[2] && c->cached[3]);
    ck_assert_uint_eq(r.evicted, 1);
    kvs_swarm_cache_destroy(c);
}
END_TEST

START_TEST(score_cache_beats_lru_on_big_one_shot_and_small_recurrent_clusters) {
    /* 10 small clusters (4 entries) each fire in half the steps; every step brings a new big cluster
     * (40 entries) that never fires again; DRAM holds 60 entries. LRU lets each big one flush the small
     * ones; S keeps them because a big one-shot cluster scores f * t_base / 40 against f * t_base / 4.
     * (With reuse rarer than every other step the -1 rule drains cached clusters to f = 0 and LRU wins;
     * docs/swarm.md reports both regimes.) */
    enum { SMALL = 10, BIG = 300 };
    uint32_t sizes[SMALL + BIG];
    for (uint32_t k = 0; k < SMALL + BIG; k++) sizes[k] = k < SMALL ? 4 : 40;
    double hit_rate[2], entry_hit_rate[2];
    for (int policy = 0; policy < 2; policy++) {
        kvs_swarm_cache_params p = cache_params((kvs_swarm_cache_policy)policy, 60);
        kvs_swarm_cache *c = NULL;
        ck_assert_int_eq(kvs_swarm_cache_create(&p, SMALL + BIG, sizes, NULL, &c), KVS_OK);
        uint64_t rng = 77;
        for (uint32_t t = 0; t < BIG; t++) {
            uint32_t act[SMALL + 1], n = 0;
            for (uint32_t k = 0; k < SMALL; k++)
                if (kvs_test_rng_below(&rng, 2)) act[n++] = k;
            act[n++] = SMALL + t;
            ck_assert_int_eq(kvs_swarm_cache_step(c, act, n, NULL), KVS_OK);
        }
        hit_rate[policy] = (double)c->total.hits / (double)(c->total.hits + c->total.misses);
        entry_hit_rate[policy] =
            (double)c->total.hit_entries / (double)(c->total.hit_entries + c->total.miss_entries);
        kvs_swarm_cache_destroy(c);
    }
    ck_assert_msg(hit_rate[KVS_SWARM_CACHE_SCORE] > hit_rate[KVS_SWARM_CACHE_LRU],
                  "score %.3f, LRU %.3f", hit_rate[0], hit_rate[1]);
    ck_assert(entry_hit_rate[KVS_SWARM_CACHE_SCORE] > entry_hit_rate[KVS_SWARM_CACHE_LRU]);
}
END_TEST

static Suite *swarm_cache_suite(void) {
    Suite *s = suite_create("swarm_cache");
    TCase *cache = tcase_create("cache");
    tcase_add_test(cache, frequencies_move_by_one_and_the_heap_holds_after_every_step);
    tcase_add_test(cache, lowest_score_cluster_is_evicted_first);
    tcase_add_test(cache, score_cache_beats_lru_on_big_one_shot_and_small_recurrent_clusters);
    suite_add_tcase(s, cache);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(swarm_cache_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
