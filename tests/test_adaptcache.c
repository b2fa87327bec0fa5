/* test_adaptcache.c - the AdaptCache placement (schedulers/adaptcache/adaptcache.h): against a brute-
 * force optimum on small instances, capacities never exceeded, more weight on quality never lowering
 * quality, the fixes of the paper's weaknesses (decode time in the delay, a prior for new entries,
 * downward-only re-encoding), and the quality curve. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/adaptcache/adaptcache.h"

static uint64_t rs = 88172645463325252ull;
static double urand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1p-53;
}

/* Codecs like raw, KIVI-4, KIVI-2, INT8: rates and a decode cost. */
static void base_params(kvs_ac_params *p, double alpha) {
    memset(p, 0, sizeof *p);
    p->alpha = alpha;
    p->freq_prior = 0.5;
    p->n_codecs = 4;
    p->codecs[1] = (kvs_ac_codec_cost){.fixed_s = 1e-4, .s_per_raw_byte = 1e-11};
    p->codecs[2] = (kvs_ac_codec_cost){.fixed_s = 1e-4, .s_per_raw_byte = 1e-11};
    p->codecs[3] = (kvs_ac_codec_cost){.fixed_s = 5e-5, .s_per_raw_byte = 5e-12};
    p->devices[KVS_AC_DRAM] = (kvs_ac_device){.latency_s = 1e-5, .bytes_per_s = 20e9};
    p->devices[KVS_AC_SSD] = (kvs_ac_device){.latency_s = 1e-4, .bytes_per_s = 1e9};
}

static void random_entry(kvs_ac_entry *e, int devices) {
    memset(e, 0, sizeof *e);
    e->raw_bytes = (uint64_t)(1 + urand() * 64) << 20;
    e->freq = urand() < 0.2 ? -1.0 : urand() * 2.0;
    e->recompute_s = (double)e->raw_bytes / 1e9 * (0.5 + urand()); /* prefill about an SSD read */
    static const double rate[4] = {1.0, 0.3125, 0.1875, 0.5078};
    for (int c = 0; c < 4; c++) {
        e->bytes[c] = (uint64_t)((double)e->raw_bytes * rate[c]);
        e->quality[c] = c == 0 ? 1.0 : 1.0 - urand() * (c == 2 ? 0.4 : c == 1 ? 0.1 : 0.02);
    }
    e->allowed = 0xf;
    e->devices = (uint32_t)devices;
}

/* The best summed utility over every assignment, within both capacities. */
static double brute_force(const kvs_ac_params *p, const kvs_ac_entry *e, size_t n) {
    int per = 2 * (int)p->n_codecs + 1;
    int idx[8] = {0};
    double best = -INFINITY;
    for (;;) {
        uint64_t used[2] = {0, 0};
        double u = 0;
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++) {
            int k = idx[i];
            if (k == per - 1) {
                u += kvs_ac_utility(p, &e[i], KVS_AC_NONE, 0);
                continue;
            }
            int dev = k / (int)p->n_codecs, c = k % (int)p->n_codecs;
            if (!(e[i].devices & (1u << dev)) || !(e[i].allowed & (1u << c)) || !e[i].bytes[c] ||
                e[i].quality[c] < p->min_quality) {
                ok = 0;
                break;
            }
            used[dev] += e[i].bytes[c];
            u += kvs_ac_utility(p, &e[i], dev, (uint32_t)c);
        }
        if (ok && used[0] <= p->devices[0].capacity && used[1] <= p->devices[1].capacity &&
            u > best)
            best = u;
        size_t i = 0;
        while (i < n && ++idx[i] == per) idx[i++] = 0;
        if (i == n) break;
    }
    return best;
}

START_TEST(one_tier_greedy_is_within_one_step_of_the_optimum) {
    for (int inst = 0; inst < 3000; inst++) {
        kvs_ac_params p;
        base_params(&p, 0.05 + urand() * 0.5);
        size_t n = 2 + (size_t)(urand() * 4);
        kvs_ac_entry e[6];
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            random_entry(&e[i], 1 << KVS_AC_DRAM);
            total += e[i].raw_bytes;
        }
        p.devices[KVS_AC_DRAM].capacity = (uint64_t)((double)total * urand() * 0.6);
        kvs_ac_choice out[6];
        kvs_ac_result r;
        ck_assert_int_eq(kvs_ac_place(&p, e, n, out, &r), KVS_OK);
        ck_assert_uint_le(r.used[KVS_AC_DRAM], p.devices[KVS_AC_DRAM].capacity);
        ck_assert_uint_eq(r.used[KVS_AC_SSD], 0);
        double opt = brute_force(&p, e, n);
        ck_assert_msg(r.utility >= opt - r.largest_step - 1e-9 * fabs(opt),
                      "instance %d: greedy %.6g, optimum %.6g, largest step %.6g", inst, r.utility,
                      opt, r.largest_step);
        ck_assert(r.utility <= opt + 1e-9 * fabs(opt));
    }
}
END_TEST

START_TEST(two_tiers_stay_within_capacity_and_near_the_optimum) {
    double worst = 0.0;
    for (int inst = 0; inst < 1500; inst++) {
        kvs_ac_params p;
        base_params(&p, 0.05 + urand() * 0.5);
        size_t n = 2 + (size_t)(urand() * 3);
        kvs_ac_entry e[5];
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            random_entry(&e[i], 3);
            total += e[i].raw_bytes;
        }
        p.devices[KVS_AC_DRAM].capacity = (uint64_t)((double)total * urand() * 0.3);
        p.devices[KVS_AC_SSD].capacity = (uint64_t)((double)total * urand() * 0.8);
        kvs_ac_choice out[5];
        kvs_ac_result r;
        ck_assert_int_eq(kvs_ac_place(&p, e, n, out, &r), KVS_OK);
        uint64_t used[2] = {0, 0};
        double u = 0;
        for (size_t i = 0; i < n; i++) {
            if (out[i].device != KVS_AC_NONE) used[out[i].device] += e[i].bytes[out[i].codec];
            u += kvs_ac_utility(&p, &e[i], out[i].device, out[i].codec);
        }
        ck_assert_uint_le(used[0], p.devices[0].capacity);
        ck_assert_uint_le(used[1], p.devices[1].capacity);
        ck_assert_uint_eq(used[0], r.used[0]);
        ck_assert_uint_eq(used[1], r.used[1]);
        ck_assert_double_eq_tol(u, r.utility, 1e-9 * (1 + fabs(u)));
        double opt = brute_force(&p, e, n);
        /* two capacities: within two steps of the optimum (one per tier) */
        ck_assert_msg(r.utility >= opt - 2 * r.largest_step - 1e-9 * fabs(opt),
                      "instance %d: greedy %.6g, optimum %.6g, largest step %.6g", inst, r.utility,
                      opt, r.largest_step);
        double gap = opt > 0 ? (opt - r.utility) / opt : 0;
        worst = gap > worst ? gap : worst;
    }
    ck_assert_msg(worst < 0.5, "worst relative gap %.3f", worst);
}
END_TEST

/* Raising alpha (quality worth more) never lowers the quality of the optimum (if x1 is optimal at a1
 * and x2 at a2 > a1, adding a1 Q1 - T1 >= a1 Q2 - T2 and a2 Q2 - T2 >= a2 Q1 - T1 gives
 * (a2 - a1)(Q2 - Q1) >= 0, Q the frequency-weighted sum). The greedy is within e of the optimum,
 * e = its largest step per tier, so the same argument bounds what it may lose:
 * Q2 >= Q1 - (e1 + e2) / (a2 - a1). Checked along alpha sweeps, with the trend over the sweep. */
START_TEST(more_weight_on_quality_never_lowers_quality_beyond_the_greedys_bound) {
    int dipped = 0;
    for (int inst = 0; inst < 400; inst++) {
        int tiers = inst % 2 ? 3 : 1 << KVS_AC_DRAM;
        kvs_ac_entry e[24];
        uint64_t total = 0;
        double fsum = 0;
        for (int i = 0; i < 24; i++) {
            random_entry(&e[i], tiers);
            total += e[i].raw_bytes;
        }
        double cap_d = urand() * 0.3, cap_s = urand() * 0.6, last_q = -1, last_e = 0, first_q = 0;
        for (double alpha = 0.0; alpha <= 2.0 + 1e-9; alpha += 0.1) {
            kvs_ac_params p;
            base_params(&p, alpha);
            p.devices[0].capacity = (uint64_t)((double)total * cap_d);
            p.devices[1].capacity = tiers == 3 ? (uint64_t)((double)total * cap_s) : 0;
            kvs_ac_choice out[24];
            kvs_ac_result r;
            ck_assert_int_eq(kvs_ac_place(&p, e, 24, out, &r), KVS_OK);
            fsum = 0;
            for (int i = 0; i < 24; i++) fsum += e[i].freq < 0 ? p.freq_prior : e[i].freq;
            double eps = (tiers == 3 ? 2 : 1) * r.largest_step;
            if (last_q < 0) first_q = r.mean_quality;
            if (last_q >= 0) {
                double allowed = (eps + last_e) / 0.1 / fsum;
                ck_assert_msg(r.mean_quality >= last_q - allowed - 1e-12,
                              "instance %d alpha %.2f: quality %.6f after %.6f (bound %.2g)", inst,
                              alpha, r.mean_quality, last_q, allowed);
                dipped += r.mean_quality < last_q - 1e-12;
            }
            last_q = r.mean_quality;
            last_e = eps;
        }
        ck_assert_msg(last_q >= first_q - 1e-12, "instance %d: quality %.6f at alpha 2, %.6f at 0",
                      inst, last_q, first_q);
    }
    ck_assert_int_lt(dipped, 400 * 20 / 10); /* dips are rare */
}
END_TEST

START_TEST(decode_time_counts_in_the_delay) {
    kvs_ac_params p;
    base_params(&p, 0.0); /* delay alone decides */
    kvs_ac_entry e;
    random_entry(&e, 1 << KVS_AC_DRAM);
    e.freq = 1.0;
    e.recompute_s = 10.0;
    p.devices[0].capacity = e.raw_bytes * 4;
    kvs_ac_choice out;
    /* cheap decoding: the smallest object (KIVI-2) loads fastest */
    p.codecs[2].s_per_raw_byte = 0;
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_OK);
    ck_assert_int_eq(out.codec, 2);
    /* decoding slower than reading the raw bytes: raw wins though it is the largest */
    for (int c = 1; c < 4; c++) p.codecs[c].s_per_raw_byte = 1.0 / 10e9;
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_OK);
    ck_assert_int_eq(out.codec, 0);
    ck_assert_int_eq(out.device, KVS_AC_DRAM);
}
END_TEST

/* A new entry (frequency unknown) takes the prior: it is kept where an entry seen never to be hit
 * (frequency 0, the paper's value for a new entry) is the first to go. */
START_TEST(new_entries_take_the_frequency_prior) {
    kvs_ac_params p;
    base_params(&p, 0.3);
    kvs_ac_entry e[3];
    for (int i = 0; i < 3; i++) {
        random_entry(&e[i], 1 << KVS_AC_DRAM);
        e[i].raw_bytes = 8u << 20;
        for (int c = 0; c < 4; c++) e[i].bytes[c] = c == 0 ? e[i].raw_bytes : 0; /* raw only */
        e[i].recompute_s = 0.05;
    }
    e[0].freq = 0.3, e[1].freq = -1.0, e[2].freq = 0.0;
    p.devices[0].capacity = 2 * (8u << 20); /* room for two */
    kvs_ac_choice out[3];
    ck_assert_int_eq(kvs_ac_place(&p, e, 3, out, NULL), KVS_OK);
    ck_assert_int_eq(out[1].device, KVS_AC_DRAM);
    ck_assert_int_eq(out[2].device, KVS_AC_NONE);
    p.freq_prior = 0.1; /* a prior below the known entry's rate: the known one stays too */
    ck_assert_int_eq(kvs_ac_place(&p, e, 3, out, NULL), KVS_OK);
    ck_assert_int_eq(out[0].device, KVS_AC_DRAM);
}
END_TEST

/* Codecs outside an entry's allowed set (lossier-only, or raw only without allow_lossy), devices
 * outside its set and options under min_quality are never chosen. */
START_TEST(only_allowed_options_are_chosen) {
    for (int inst = 0; inst < 500; inst++) {
        kvs_ac_params p;
        base_params(&p, urand());
        p.min_quality = urand() < 0.5 ? 0.8 : 0.0;
        kvs_ac_entry e[16];
        uint64_t total = 0;
        for (int i = 0; i < 16; i++) {
            random_entry(&e[i], 1 + (int)(urand() * 3));
            e[i].allowed = 1u + (uint32_t)(urand() * 15);
            total += e[i].raw_bytes;
        }
        p.devices[0].capacity = (uint64_t)((double)total * urand() * 0.5);
        p.devices[1].capacity = (uint64_t)((double)total * urand());
        kvs_ac_choice out[16];
        ck_assert_int_eq(kvs_ac_place(&p, e, 16, out, NULL), KVS_OK);
        for (int i = 0; i < 16; i++) {
            if (out[i].device == KVS_AC_NONE) continue;
            ck_assert(e[i].devices & (1u << out[i].device));
            ck_assert(e[i].allowed & (1u << out[i].codec));
            ck_assert(e[i].quality[out[i].codec] >= p.min_quality);
        }
    }
}
END_TEST

START_TEST(bad_parameters_are_refused) {
    kvs_ac_params p;
    kvs_ac_entry e;
    kvs_ac_choice out = {.device = 7};
    random_entry(&e, 3);
    base_params(&p, -1.0);
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_EINVAL);
    base_params(&p, 1.0);
    p.devices[1].bytes_per_s = 0;
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_EINVAL);
    base_params(&p, 1.0);
    p.n_codecs = KVS_AC_MAX_CODECS + 1;
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_EINVAL);
    base_params(&p, 1.0);
    p.freq_prior = 0;
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_EINVAL);
    ck_assert_int_eq(out.device, 7); /* nothing written */
    base_params(&p, INFINITY);
    ck_assert_int_eq(kvs_ac_place(&p, &e, 1, &out, NULL), KVS_EINVAL);
    base_params(&p, 1.0);
    ck_assert_int_eq(kvs_ac_place(&p, NULL, 0, NULL, NULL), KVS_OK);
    /* entries whose numbers would make a utility NaN (0 * inf) or break the bounds */
    kvs_ac_entry bad = e;
    bad.freq = 0.0, bad.recompute_s = INFINITY;
    ck_assert_int_eq(kvs_ac_place(&p, &bad, 1, &out, NULL), KVS_EINVAL);
    bad = e, bad.freq = NAN;
    ck_assert_int_eq(kvs_ac_place(&p, &bad, 1, &out, NULL), KVS_EINVAL);
    bad = e, bad.quality[2] = 1.5;
    ck_assert_int_eq(kvs_ac_place(&p, &bad, 1, &out, NULL), KVS_EINVAL);
    ck_assert_int_eq(out.device, 7);
    /* raw is lossless whatever quality[0] holds: with a quality floor it stays a choice */
    kvs_ac_entry raw = e;
    raw.quality[0] = 0.0, raw.allowed = 1, raw.devices = 1u << KVS_AC_DRAM, raw.freq = 1.0;
    p.min_quality = 0.9;
    p.devices[KVS_AC_DRAM].capacity = raw.raw_bytes;
    raw.recompute_s = 1.0;
    ck_assert_int_eq(kvs_ac_place(&p, &raw, 1, &out, NULL), KVS_OK);
    ck_assert_int_eq(out.device, KVS_AC_DRAM);
    ck_assert_int_eq(out.codec, 0);
}
END_TEST

START_TEST(the_quality_curve_is_monotone_and_interpolates) {
    kvs_ac_curve c = {.n = 4, .error = {0.0, 0.1, 0.3, 0.6}, .quality = {1.0, 0.95, 0.97, 0.5}};
    ck_assert_double_eq_tol(kvs_ac_quality_from_error(&c, -1.0), 1.0, 1e-12);
    ck_assert_double_eq_tol(kvs_ac_quality_from_error(&c, 0.05), 0.975, 1e-12);
    /* 0.97 after 0.95 is measurement noise: held at 0.95 */
    ck_assert_double_eq_tol(kvs_ac_quality_from_error(&c, 0.2), 0.95, 1e-12);
    ck_assert_double_eq_tol(kvs_ac_quality_from_error(&c, 0.45), 0.725, 1e-12);
    ck_assert_double_eq_tol(kvs_ac_quality_from_error(&c, 5.0), 0.5, 1e-12);
    kvs_ac_curve big = c;
    big.n = 1000; /* more points than it holds: only 16 are read */
    ck_assert_double_eq_tol(kvs_ac_quality_from_error(&big, 0.05), 0.975, 1e-12);
    double last = 2;
    for (double x = 0; x < 1; x += 0.01) {
        double q = kvs_ac_quality_from_error(&c, x);
        ck_assert(q <= last + 1e-12);
        last = q;
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("adaptcache");
    TCase *tc = tcase_create("placement");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, one_tier_greedy_is_within_one_step_of_the_optimum);
    tcase_add_test(tc, two_tiers_stay_within_capacity_and_near_the_optimum);
    tcase_add_test(tc, more_weight_on_quality_never_lowers_quality_beyond_the_greedys_bound);
    tcase_add_test(tc, decode_time_counts_in_the_delay);
    tcase_add_test(tc, new_entries_take_the_frequency_prior);
    tcase_add_test(tc, only_allowed_options_are_chosen);
    tcase_add_test(tc, bad_parameters_are_refused);
    tcase_add_test(tc, the_quality_curve_is_monotone_and_interpolates);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
