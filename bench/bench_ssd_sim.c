/* bench_ssd_sim.c - Swarm's multi-SSD placement and scheduling (schedulers/swarm) in virtual time: every
 * figure comes from the disk model of swarm_disk.h, not from a device, so it is deterministic and the
 * same on any machine. Each path's time for a step is n_ios / IOPS + bytes / bandwidth (PM9A3-like:
 * 1.1 M IOPS, 6.9 GB/s; Optane 900P-like: 0.55 M, 2.5 GB/s); the step takes as long as its slowest path.
 *
 * Workloads.
 *  - Whole-prefix loads: 64 objects of 32 units of 256 KiB, striped with kvs_swarm_place (one copy),
 *    every unit read: the common LMCache case, where each object is one "cluster".
 *  - Sparse retrievals: the planted co-activation workload of notes §6.1 (swarm_synth.h: 4096 entries
 *    of 4 KiB, 192 groups of 2..8, 10% of grouped entries in 2..3 groups, Zipf 0.5, 6 groups a step,
 *    p 0.9, 0.5% noise). 400 profiling steps build the co-activation profile; Algorithm 1 clusters it
 *    (Jaccard, tau 0.65, support 3, R_max 3, +25% slots); 400 further steps are the evaluation trace.
 *    A step selects the clusters whose medoid fired and reads their members less the DRAM-resident
 *    medoids (Eq. 8). "batch 8" reads the union of 8 consecutive steps at once (a batch-8 decode).
 *
 * Results, each against a reference measured on the same trace in the same run:
 *  B1 aggregation: effective bandwidth (bytes read / I/O time) with 1, 2, 4, 8 paths over 1 path, and
 *     utilisation = effective bandwidth / sum of the paths' nominal bandwidth.
 *  B2 layout at 8 paths: Swarm (Eq. 7 clusters, replicas, bucket scheduler) against chunk-hash (256-entry
 *     chunks on hash(chunk) mod 8), No-Balance placement (every cluster starts at path 0) and token
 *     striping (entry e on path e mod 8), all reading the same entries; ratio = their time / Swarm's.
 *  B3 scheduler at 8 paths on the Swarm layout: Static (each selected cluster read from its own copies,
 *     no dedup), No-Balance (dedup, always the first copy), No-Dedup (balanced, duplicates read);
 *     ratio = their I/O time / Swarm's, bytes_ratio = their bytes / Swarm's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "schedulers/swarm/swarm.h"
#include "tools/workloads/swarm_synth.h"

#define ENTRY_BYTES       4096u /* one token-layer entry: 8 KV heads x 128 x BF16, K and V */
#define PREFIX_UNIT_BYTES (256u << 10)
#define PREFIX_UNITS      32u
#define PREFIX_OBJECTS    64u
#define MAX_COPIES        3u
#define CLUSTER_TAU       0.65 /* calibrated on the planted workload (tests/test_swarm.c) */
#define CLUSTER_MIN_COUNT 3u
#define CHUNK_ENTRIES     256u
#define MAX_PATHS         8u

typedef struct options {
    uint32_t profile_steps;
    uint32_t eval_steps;
    uint64_t seed;
} options;

/* Where each entry's copies are: n_copies[e] copies at paths[e * MAX_COPIES + k]. */
typedef struct routes {
    uint32_t *n_copies;
    uint32_t *paths;
} routes;

/* One planted workload, profiled and clustered once; the evaluation trace is fixed. */
typedef struct world {
    const char *name;
    kvs_swarm_synth synth;
    uint32_t n_entries;
    kvs_swarm_clusters *clusters;
    uint32_t *cluster_of_medoid; /* [n_entries] cluster whose medoid the entry is, or UINT32_MAX */
    uint8_t *dram;               /* [n_entries] medoids: resident in DRAM (Eq. 8) */
    uint32_t n_steps;
    uint64_t *step_start; /* [n_steps + 1] CSR of the trace's activation sets */
    uint32_t *step_ids;
    double precision, recall, f1;
} world;

/* Per-step scratch, sized for the largest step. */
typedef struct scratch {
    uint64_t cap;
    uint32_t *n_copies;
    uint32_t *paths;
    uint32_t *chosen;
    uint64_t *order;
    uint64_t *cluster_stamp; /* [n_clusters] */
    uint32_t *selected;      /* [n_clusters] */
    uint32_t *seen_stamp;    /* [n_entries] */
    kvs_swarm_seen seen;
    uint64_t epoch;
} scratch;

typedef enum read_policy {
    READ_SWARM = 0,      /* dedup, any copy, least-loaded */
    READ_STATIC = 1,     /* each selected cluster read from its own copies, no dedup */
    READ_NO_BALANCE = 2, /* dedup, first copy */
    READ_NO_DEDUP = 3    /* no dedup, any copy, least-loaded */
} read_policy;

/* What a sequence of steps cost. */
typedef struct run_result {
    double time_s;
    uint64_t bytes;
    uint64_t reads;
    double imbalance_sum; /* sum over steps of max reads on a path / ceil(reads / paths) */
    uint32_t steps;
} run_result;

static void die(const char *what) {
    fprintf(stderr, "kvs-bench-ssd-sim: %s\n", what);
    exit(1);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) die("out of memory");
    return p;
}

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [--profile-steps N] [--eval-steps N] [--seed S]\n"
            "  --profile-steps  steps of the planted workload used to cluster (default 400)\n"
            "  --eval-steps     steps of the evaluation trace (default 400)\n"
            "  --seed           workload seed (default the synth default)\n",
            prog);
}

static options parse_options(int argc, char **argv) {
    options o = {400, 400, kvs_swarm_synth_defaults().seed};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--profile-steps"))
            o.profile_steps = (uint32_t)bench_parse_u64(argv[i], v, 10, 100000);
        else if (!strcmp(argv[i], "--eval-steps"))
            o.eval_steps = (uint32_t)bench_parse_u64(argv[i], v, 8, 100000);
        else if (!strcmp(argv[i], "--seed"))
            o.seed = bench_parse_u64(argv[i], v, 0, UINT64_MAX);
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            exit(0);
        } else {
            usage(stderr, argv[0]);
            exit(2);
        }
        i++;
    }
    return o;
}

/* ---- the planted world -------------------------------------------------------------------------- */

static void world_build(world *w, const char *name, int scattered, double overlap,
                        const options *o) {
    memset(w, 0, sizeof *w);
    w->name = name;
    kvs_swarm_synth_params sp = kvs_swarm_synth_defaults();
    sp.scattered = scattered;
    sp.overlap_fraction = overlap;
    sp.seed = o->seed;
    if (kvs_swarm_synth_init(&w->synth, &sp) != 0) die("cannot build the planted workload");
    uint32_t n = w->n_entries = sp.n_entries;
    uint32_t *active = xcalloc(n, sizeof *active);
    kvs_swarm_profile *profile = NULL;
    if (kvs_swarm_profile_create(n, 0, &profile) != KVS_OK) die("profile_create failed");
    for (uint32_t t = 0; t < o->profile_steps; t++) {
        uint32_t k = kvs_swarm_synth_step(&w->synth, active, NULL);
        if (kvs_swarm_profile_add_step(profile, active, k) != KVS_OK)
            die("profile_add_step failed");
    }
    kvs_swarm_graph *graph = NULL;
    if (kvs_swarm_graph_build(profile, KVS_SWARM_METRIC_JACCARD, 1.0, CLUSTER_MIN_COUNT, &graph) !=
        KVS_OK)
        die("graph_build failed");
    kvs_swarm_cluster_params prm;
    kvs_swarm_cluster_defaults(&prm);
    prm.tau = CLUSTER_TAU;
    prm.max_copies = MAX_COPIES;
    if (kvs_swarm_clusters_create(n, &w->clusters) != KVS_OK ||
        kvs_swarm_cluster_build(graph, &prm, w->clusters) != KVS_OK)
        die("cluster_build failed");
    kvs_swarm_graph_destroy(graph);
    kvs_swarm_profile_destroy(profile);
    if (kvs_swarm_synth_pair_f1(&w->synth, w->clusters, &w->precision, &w->recall, &w->f1) != 0)
        die("out of memory");

    w->cluster_of_medoid = xcalloc(n, sizeof *w->cluster_of_medoid);
    w->dram = xcalloc(n, 1);
    for (uint32_t e = 0; e < n; e++) w->cluster_of_medoid[e] = UINT32_MAX;
    for (uint32_t k = 0; k < w->clusters->n_clusters; k++) {
        uint32_t m = w->clusters->items[k].members[0];
        w->cluster_of_medoid[m] = k;
        w->dram[m] = 1;
    }

    w->n_steps = o->eval_steps;
    w->step_start = xcalloc((size_t)w->n_steps + 1, sizeof *w->step_start);
    uint64_t cap = (uint64_t)w->n_steps * 64, used = 0;
    w->step_ids = xcalloc(cap, sizeof *w->step_ids);
    for (uint32_t t = 0; t < w->n_steps; t++) {
        uint32_t k = kvs_swarm_synth_step(&w->synth, active, NULL);
        if (used + k > cap) {
            cap = 2 * (used + k);
            uint32_t *ids = realloc(w->step_ids, cap * sizeof *ids);
            if (!ids) die("out of memory");
            w->step_ids = ids;
        }
        memcpy(w->step_ids + used, active, (size_t)k * sizeof *active);
        used += k;
        w->step_start[t + 1] = used;
    }
    free(active);
}

static void world_free(world *w) {
    kvs_swarm_clusters_destroy(w->clusters);
    kvs_swarm_synth_free(&w->synth);
    free(w->cluster_of_medoid);
    free(w->dram);
    free(w->step_start);
    free(w->step_ids);
}

/* ---- layouts ------------------------------------------------------------------------------------ */

static routes routes_alloc(uint32_t n) {
    routes r = {xcalloc(n, sizeof(uint32_t)), xcalloc((size_t)n * MAX_COPIES, sizeof(uint32_t))};
    return r;
}

static void routes_free(routes *r) {
    free(r->n_copies);
    free(r->paths);
}

/* Place the world's clusters on n_paths (Eq. 7 or every cluster at path 0) and read back the routes. */
static void layout_clusters(world *w, uint32_t n_paths, kvs_swarm_balance balance, routes *r) {
    kvs_swarm_layout layout;
    if (kvs_swarm_layout_init(&layout, n_paths, balance) != KVS_OK) die("layout_init failed");
    for (uint32_t k = 0; k < w->clusters->n_clusters; k++) w->clusters->items[k].placed = 0;
    kvs_swarm_layout_place(&layout, w->clusters, 0);
    if (kvs_swarm_routes(w->clusters, w->n_entries, MAX_COPIES, r->n_copies, r->paths, NULL) != 0)
        die("an entry has more copies than MAX_COPIES");
}

static void layout_striped(uint32_t n, uint32_t n_paths, routes *r) {
    for (uint32_t e = 0; e < n; e++) {
        r->n_copies[e] = 1;
        r->paths[(uint64_t)e * MAX_COPIES] = e % n_paths;
    }
}

static void layout_chunk_hash(uint32_t n, uint32_t n_paths, routes *r) {
    for (uint32_t e = 0; e < n; e++) {
        r->n_copies[e] = 1;
        r->paths[(uint64_t)e * MAX_COPIES] = (uint32_t)(bench_mix64(e / CHUNK_ENTRIES) % n_paths);
    }
}

/* ---- one step ----------------------------------------------------------------------------------- */

static void scratch_init(scratch *s, const world *w) {
    memset(s, 0, sizeof *s);
    uint64_t cap = 0;
    for (uint32_t k = 0; k < w->clusters->n_clusters; k++) cap += w->clusters->items[k].n_members;
    s->cap = cap; /* every member of every cluster: an upper bound for any batch */
    s->n_copies = xcalloc(cap, sizeof *s->n_copies);
    s->paths = xcalloc(cap * MAX_COPIES, sizeof *s->paths);
    s->chosen = xcalloc(cap, sizeof *s->chosen);
    s->order = xcalloc(cap, sizeof *s->order);
    s->cluster_stamp = xcalloc(w->clusters->n_clusters, sizeof *s->cluster_stamp);
    s->selected = xcalloc(w->clusters->n_clusters, sizeof *s->selected);
    s->seen_stamp = xcalloc(w->n_entries, sizeof *s->seen_stamp);
    kvs_swarm_seen_init(&s->seen, s->seen_stamp, w->n_entries);
}

static void scratch_free(scratch *s) {
    free(s->n_copies);
    free(s->paths);
    free(s->chosen);
    free(s->order);
    free(s->cluster_stamp);
    free(s->selected);
    free(s->seen_stamp);
}

/* Read one (batched) step: select clusters, build the reads for the policy, schedule, model the time. */
static void run_step(const world *w, scratch *s, uint32_t first, uint32_t batch, const routes *r,
                     uint32_t n_paths, read_policy policy, const kvs_swarm_disk *disk,
                     run_result *out) {
    uint64_t epoch = ++s->epoch;
    uint32_t n_selected = 0;
    for (uint32_t t = first; t < first + batch && t < w->n_steps; t++)
        for (uint64_t i = w->step_start[t]; i < w->step_start[t + 1]; i++) {
            uint32_t k = w->cluster_of_medoid[w->step_ids[i]];
            if (k == UINT32_MAX || s->cluster_stamp[k] == epoch) continue;
            s->cluster_stamp[k] = epoch;
            s->selected[n_selected++] = k;
        }

    kvs_swarm_seen_begin(&s->seen);
    uint64_t n = 0;
    for (uint32_t i = 0; i < n_selected; i++) {
        const kvs_swarm_cluster *cl = &w->clusters->items[s->selected[i]];
        for (uint32_t m = 0; m < cl->n_members; m++) {
            uint32_t e = cl->members[m];
            if (w->dram[e]) continue;
            int dedup = policy == READ_SWARM || policy == READ_NO_BALANCE;
            if (dedup && !kvs_swarm_seen_mark(&s->seen, e)) continue;
            uint32_t *dst = s->paths + n * MAX_COPIES;
            if (policy == READ_STATIC) {
                s->n_copies[n] = 1;
                dst[0] = cl->paths[m];
            } else {
                uint32_t copies = policy == READ_NO_BALANCE ? 1 : r->n_copies[e];
                s->n_copies[n] = copies;
                memcpy(dst, r->paths + (uint64_t)e * MAX_COPIES, copies * sizeof *dst);
            }
            n++;
        }
    }
    kvs_swarm_schedule(n_paths, n, MAX_COPIES, s->n_copies, s->paths, s->chosen, s->order);
    uint64_t ios[MAX_PATHS], bytes[MAX_PATHS];
    kvs_swarm_disk disks[MAX_PATHS];
    for (uint32_t d = 0; d < n_paths; d++) disks[d] = *disk;
    kvs_swarm_tally(n_paths, n, s->chosen, NULL, ENTRY_BYTES, ios, bytes);
    out->time_s += kvs_swarm_step_time(disks, n_paths, KVS_SWARM_TIME_SUM, ios, bytes, NULL);
    out->bytes += n * ENTRY_BYTES;
    out->reads += n;
    out->steps++;
    if (n) {
        uint64_t most = 0, ideal = (n + n_paths - 1) / n_paths;
        for (uint32_t d = 0; d < n_paths; d++) most = ios[d] > most ? ios[d] : most;
        out->imbalance_sum += (double)most / (double)ideal;
    }
}

static run_result run_trace(const world *w, scratch *s, uint32_t batch, const routes *r,
                            uint32_t n_paths, read_policy policy, const kvs_swarm_disk *disk) {
    run_result res;
    memset(&res, 0, sizeof res);
    for (uint32_t t = 0; t < w->n_steps; t += batch)
        run_step(w, s, t, batch, r, n_paths, policy, disk, &res);
    return res;
}

/* ---- B1: aggregation ---------------------------------------------------------------------------- */

/* One whole-prefix load: every unit of PREFIX_OBJECTS objects striped by kvs_swarm_place. */
static run_result prefix_load(uint32_t n_paths, const kvs_swarm_disk *disk) {
    uint32_t n = PREFIX_OBJECTS * PREFIX_UNITS;
    uint32_t *paths = xcalloc(n, sizeof *paths), *n_copies = xcalloc(n, sizeof *n_copies);
    uint32_t *chosen = xcalloc(n, sizeof *chosen);
    uint64_t *order = xcalloc(n, sizeof *order), pointer = 0;
    for (uint32_t o = 0; o < PREFIX_OBJECTS; o++)
        kvs_swarm_place(&pointer, n_paths, PREFIX_UNITS, 1, paths + o * PREFIX_UNITS);
    for (uint32_t u = 0; u < n; u++) n_copies[u] = 1;
    kvs_swarm_schedule(n_paths, n, 1, n_copies, paths, chosen, order);
    uint64_t ios[MAX_PATHS], bytes[MAX_PATHS];
    kvs_swarm_disk disks[MAX_PATHS];
    for (uint32_t d = 0; d < n_paths; d++) disks[d] = *disk;
    kvs_swarm_tally(n_paths, n, chosen, NULL, PREFIX_UNIT_BYTES, ios, bytes);
    run_result res;
    memset(&res, 0, sizeof res);
    res.time_s = kvs_swarm_step_time(disks, n_paths, KVS_SWARM_TIME_SUM, ios, bytes, NULL);
    res.bytes = (uint64_t)n * PREFIX_UNIT_BYTES;
    res.reads = n;
    res.steps = 1;
    free(paths);
    free(n_copies);
    free(chosen);
    free(order);
    return res;
}

static double gbps(const run_result *r) {
    return r->time_s > 0.0 ? (double)r->bytes / r->time_s / 1e9 : 0.0;
}

static void report_b1(const char *workload, const kvs_swarm_disk *disk, uint32_t n_paths,
                      uint32_t batch, const run_result *r, const run_result *one) {
    double ratio = gbps(r) / gbps(one), util = gbps(r) * 1e9 / (disk->bytes_per_s * n_paths);
    printf("{\"bench\":\"ssd_sim_b1_aggregation\",\"workload\":\"%s\",\"disk\":\"%s\",\"model\":"
           "\"sum\","
           "\"paths\":%u,\"batch\":%u,\"ratio\":%.3f,\"reference\":\"1 path, same "
           "trace\",\"gbps\":%.3f,"
           "\"reference_gbps\":%.3f,\"utilisation\":%.3f,\"time_s\":%.6e,\"reference_time_s\":%.6e,"
           "\"bytes\":%llu,\"reads\":%llu,\"steps\":%u,\"makespan_over_ideal\":%.3f}\n",
           workload, disk->name, n_paths, batch, ratio, gbps(r), gbps(one), util, r->time_s,
           one->time_s, (unsigned long long)r->bytes, (unsigned long long)r->reads, r->steps,
           r->steps ? r->imbalance_sum / r->steps : 1.0);
    printf("B1 %s batch %u, %s x%u: %.2f GB/s effective, %.2fx one path (%.2f GB/s), utilisation "
           "%.2f\n",
           workload, batch, disk->name, n_paths, gbps(r), ratio, gbps(one), util);
}

static void bench_b1(world *w, scratch *s) {
    const kvs_swarm_disk disks[2] = {kvs_swarm_disk_pm9a3(), kvs_swarm_disk_optane_900p()};
    routes r = routes_alloc(w->n_entries);
    for (int di = 0; di < 2; di++) {
        const kvs_swarm_disk *disk = &disks[di];
        run_result one = prefix_load(1, disk);
        for (uint32_t p = 1; p <= MAX_PATHS; p *= 2) {
            run_result res = prefix_load(p, disk);
            report_b1("whole_prefix", disk, p, 1, &res, &one);
        }
        for (uint32_t batch = 1; batch <= 8; batch *= 8) {
            layout_clusters(w, 1, KVS_SWARM_BALANCE_GLOBAL_POINTER, &r);
            run_result sparse_one = run_trace(w, s, batch, &r, 1, READ_SWARM, disk);
            for (uint32_t p = 1; p <= MAX_PATHS; p *= 2) {
                layout_clusters(w, p, KVS_SWARM_BALANCE_GLOBAL_POINTER, &r);
                run_result res = run_trace(w, s, batch, &r, p, READ_SWARM, disk);
                report_b1("sparse_planted", disk, p, batch, &res, &sparse_one);
            }
        }
    }
    routes_free(&r);
}

/* ---- B2: layout ablation ------------------------------------------------------------------------ */

static void report_ratio(const char *bench, const world *w, uint32_t batch, const char *variant,
                         const char *reference, const run_result *r, const run_result *ref) {
    double ratio = r->time_s / ref->time_s, bytes_ratio = (double)r->bytes / (double)ref->bytes;
    printf("{\"bench\":\"%s\",\"workload\":\"%s\",\"variant\":\"%s\",\"disk\":\"pm9a3\",\"model\":"
           "\"sum\","
           "\"paths\":%u,\"batch\":%u,\"ratio\":%.3f,\"reference\":\"%s\",\"bytes_ratio\":%.3f,"
           "\"time_s\":%.6e,\"reference_time_s\":%.6e,\"bytes\":%llu,\"reference_bytes\":%llu,"
           "\"makespan_over_ideal\":%.3f,\"reference_makespan_over_ideal\":%.3f,\"reads_per_step\":"
           "%.1f}\n",
           bench, w->name, variant, MAX_PATHS, batch, ratio, reference, bytes_ratio, r->time_s,
           ref->time_s, (unsigned long long)r->bytes, (unsigned long long)ref->bytes,
           r->imbalance_sum / r->steps, ref->imbalance_sum / ref->steps,
           (double)ref->reads / ref->steps);
    printf("%s %s batch %u: %s takes %.2fx Swarm's I/O time and reads %.2fx its bytes "
           "(makespan/ideal %.2f vs "
           "%.2f)\n",
           bench, w->name, batch, variant, ratio, bytes_ratio, r->imbalance_sum / r->steps,
           ref->imbalance_sum / ref->steps);
}

static void bench_b2(world *w, scratch *s) {
    const kvs_swarm_disk disk = kvs_swarm_disk_pm9a3();
    routes swarm = routes_alloc(w->n_entries), other = routes_alloc(w->n_entries);
    for (uint32_t batch = 1; batch <= 8; batch *= 8) {
        layout_clusters(w, MAX_PATHS, KVS_SWARM_BALANCE_GLOBAL_POINTER, &swarm);
        run_result ref = run_trace(w, s, batch, &swarm, MAX_PATHS, READ_SWARM, &disk);
        const char *reference = "swarm: Eq. 7 clusters, replicas, bucket scheduler";

        layout_chunk_hash(w->n_entries, MAX_PATHS, &other);
        run_result r = run_trace(w, s, batch, &other, MAX_PATHS, READ_SWARM, &disk);
        report_ratio("ssd_sim_b2_layout", w, batch, "chunk_hash_256", reference, &r, &ref);

        layout_clusters(w, MAX_PATHS, KVS_SWARM_BALANCE_NONE, &other);
        r = run_trace(w, s, batch, &other, MAX_PATHS, READ_SWARM, &disk);
        report_ratio("ssd_sim_b2_layout", w, batch, "no_balance_placement", reference, &r, &ref);

        layout_striped(w->n_entries, MAX_PATHS, &other);
        r = run_trace(w, s, batch, &other, MAX_PATHS, READ_SWARM, &disk);
        report_ratio("ssd_sim_b2_layout", w, batch, "token_striping", reference, &r, &ref);
    }
    layout_clusters(w, MAX_PATHS, KVS_SWARM_BALANCE_GLOBAL_POINTER,
                    &swarm); /* leave the Swarm layout */
    routes_free(&swarm);
    routes_free(&other);
}

/* ---- B3: scheduler ablation --------------------------------------------------------------------- */

static void bench_b3(world *w, scratch *s) {
    const kvs_swarm_disk disk = kvs_swarm_disk_pm9a3();
    routes r = routes_alloc(w->n_entries);
    layout_clusters(w, MAX_PATHS, KVS_SWARM_BALANCE_GLOBAL_POINTER, &r);
    const char *reference = "swarm: dedup, least-loaded copy";
    const read_policy policies[3] = {READ_STATIC, READ_NO_BALANCE, READ_NO_DEDUP};
    const char *names[3] = {"static_first_replica_no_dedup", "no_balance_first_replica",
                            "no_dedup_balanced"};
    for (uint32_t batch = 1; batch <= 8; batch *= 8) {
        run_result ref = run_trace(w, s, batch, &r, MAX_PATHS, READ_SWARM, &disk);
        for (int i = 0; i < 3; i++) {
            run_result v = run_trace(w, s, batch, &r, MAX_PATHS, policies[i], &disk);
            report_ratio("ssd_sim_b3_scheduler", w, batch, names[i], reference, &v, &ref);
        }
    }
    routes_free(&r);
}

static void report_world(const world *w) {
    const kvs_swarm_clusters *c = w->clusters;
    uint32_t multi = 0;
    for (uint32_t k = 0; k < c->n_clusters; k++) multi += c->items[k].n_members > 1;
    double slots = (double)c->n_slots / (double)w->n_entries;
    printf("{\"bench\":\"ssd_sim_clusters\",\"workload\":\"%s\",\"ratio\":%.4f,\"reference\":\"one "
           "copy per "
           "entry\",\"entries\":%u,\"slots\":%llu,\"clusters\":%u,\"clusters_over_one\":%u,"
           "\"pair_precision\":%.3f,\"pair_recall\":%.3f,\"pair_f1\":%.3f,\"tau\":%.2f,\"min_"
           "count\":%u}\n",
           w->name, slots, w->n_entries, (unsigned long long)c->n_slots, c->n_clusters, multi,
           w->precision, w->recall, w->f1, CLUSTER_TAU, CLUSTER_MIN_COUNT);
    printf("clusters %s: %u clusters (%u with more than one member), %.3f slots per entry, "
           "planted-pair "
           "F1 %.3f (precision %.3f, recall %.3f)\n",
           w->name, c->n_clusters, multi, slots, w->f1, w->precision, w->recall);
}

int main(int argc, char **argv) {
    options o = parse_options(argc, argv);
    world worlds[3];
    world_build(&worlds[0], "contiguous", 0, 0.10, &o);
    world_build(&worlds[1], "scattered", 1, 0.10, &o);
    world_build(&worlds[2], "contiguous_overlap_40", 0, 0.40, &o);
    for (int i = 0; i < 3; i++) report_world(&worlds[i]);

    scratch s;
    scratch_init(&s, &worlds[0]);
    bench_b1(&worlds[0], &s);
    scratch_free(&s);
    for (int i = 0; i < 3; i++) {
        scratch_init(&s, &worlds[i]);
        bench_b2(&worlds[i], &s);
        bench_b3(&worlds[i], &s);
        scratch_free(&s);
    }
    for (int i = 0; i < 3; i++) world_free(&worlds[i]);
    return 0;
}
