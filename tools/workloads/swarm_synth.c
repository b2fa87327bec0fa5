/* swarm_synth.c - the planted co-activation workload (see swarm_synth.h). */
#include "swarm_synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* N 4096, G 192, groups of 2..8 in runs, 10% overlap, Zipf 0.5, 6 groups per step, p 0.9, noise 0.5%. */
kvs_swarm_synth_params kvs_swarm_synth_defaults(void) {
    kvs_swarm_synth_params p = {4096, 192, 2, 8, 0, 0.10, 0.5, 6, 0.9, 0.005, 0x5eed5a7a11ull};
    return p;
}

static uint64_t synth_next(kvs_swarm_synth *s) { /* splitmix64 */
    uint64_t x = (s->rng += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform in [0, n). */
static uint32_t synth_below(kvs_swarm_synth *s, uint32_t n) {
    return (uint32_t)(((synth_next(s) >> 32) * (uint64_t)n) >> 32);
}

static double synth_unit(kvs_swarm_synth *s) {
    return (double)(synth_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

void kvs_swarm_synth_free(kvs_swarm_synth *s) {
    if (!s) return;
    free(s->group_start);
    free(s->group_member);
    free(s->cumulative);
    free(s->stamp);
    free(s->step_group);
    memset(s, 0, sizeof *s);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Build the groups. Returns 0, or -1 on bad parameters or no memory (the struct is then empty). */
int kvs_swarm_synth_init(kvs_swarm_synth *s, const kvs_swarm_synth_params *p) {
    memset(s, 0, sizeof *s);
    uint32_t n = p->n_entries, g_count = p->n_groups;
    if (n == 0 || g_count == 0 || p->min_group < 1 || p->max_group < p->min_group ||
        (uint64_t)g_count * p->max_group > n || p->groups_per_step > g_count)
        return -1;
    s->params = *p;
    s->rng = p->seed;
    uint32_t *size = calloc(g_count, sizeof *size), *base = calloc(g_count, sizeof *base);
    uint32_t *extra_of = NULL, *perm = NULL;
    s->group_start = calloc((size_t)g_count + 1, sizeof *s->group_start);
    s->cumulative = calloc(g_count, sizeof *s->cumulative);
    s->stamp = calloc(n, sizeof *s->stamp);
    s->step_group = calloc(g_count, 1);
    perm = malloc((size_t)n * sizeof *perm);
    if (!size || !base || !s->group_start || !s->cumulative || !s->stamp || !s->step_group || !perm)
        goto fail;

    /* Base members: runs separated by random gaps that use up the free space, or a random subset. */
    uint64_t grouped = 0;
    for (uint32_t g = 0; g < g_count; g++) {
        size[g] = p->min_group + synth_below(s, p->max_group - p->min_group + 1);
        grouped += size[g];
    }
    for (uint32_t e = 0; e < n; e++) perm[e] = e;
    if (p->scattered) {
        for (uint32_t e = n - 1; e > 0; e--) { /* Fisher-Yates */
            uint32_t j = synth_below(s, e + 1), t = perm[e];
            perm[e] = perm[j];
            perm[j] = t;
        }
        uint32_t at = 0;
        for (uint32_t g = 0; g < g_count; g++) {
            base[g] = at;
            at += size[g];
        }
    } else {
        uint64_t free_space = n - grouped, at = 0;
        for (uint32_t g = 0; g < g_count; g++) {
            uint64_t mean_gap = free_space / (g_count - g + 1);
            uint64_t gap = mean_gap ? synth_below(s, (uint32_t)(2 * mean_gap + 1)) : 0;
            if (gap > free_space) gap = free_space;
            free_space -= gap;
            at += gap;
            base[g] = (uint32_t)at;
            at += size[g];
        }
    }
    /* Overlap: some grouped entries join one or two more groups. */
    uint64_t n_extra_entries = (uint64_t)(p->overlap_fraction * (double)grouped + 0.5);
    extra_of =
        malloc((size_t)(4 * n_extra_entries + 1) * sizeof *extra_of); /* <= 2 (entry, group) each */
    if (!extra_of) goto fail;
    uint64_t n_extra = 0;
    uint32_t *extra_count =
        s->group_start; /* reused as per-group extra counts until the CSR is built */
    for (uint64_t k = 0; k < n_extra_entries; k++) {
        uint32_t g = synth_below(s, g_count);
        uint32_t e = perm[base[g] + synth_below(s, size[g])];
        uint32_t more = 1 + synth_below(s, 2);
        for (uint32_t m = 0; m < more; m++) {
            uint32_t h = synth_below(s, g_count);
            if (h == g) continue;
            extra_of[2 * n_extra] = e;
            extra_of[2 * n_extra + 1] = h;
            n_extra++;
            extra_count[h]++;
        }
    }
    uint32_t *extra_seen = calloc(g_count, sizeof *extra_seen);
    if (!extra_seen) goto fail;
    uint64_t total = 0;
    for (uint32_t g = 0; g < g_count; g++) {
        uint32_t c = extra_count[g];
        extra_count[g] = (uint32_t)total;
        total += size[g] + c;
    }
    s->group_start[g_count] = (uint32_t)total;
    s->group_member = malloc((size_t)(total + 1) * sizeof *s->group_member);
    if (!s->group_member) {
        free(extra_seen);
        goto fail;
    }
    for (uint32_t g = 0; g < g_count; g++)
        for (uint32_t m = 0; m < size[g]; m++)
            s->group_member[s->group_start[g] + m] = perm[base[g] + m];
    for (uint64_t k = 0; k < n_extra; k++) {
        uint32_t e = extra_of[2 * k], h = extra_of[2 * k + 1];
        s->group_member[s->group_start[h] + size[h] + extra_seen[h]++] = e;
    }
    free(extra_seen);
    /* Sort each group and drop an entry listed twice (it joined the same extra group twice). */
    uint32_t write = 0;
    for (uint32_t g = 0; g < g_count; g++) {
        uint32_t begin = s->group_start[g],
                 end = g + 1 < g_count ? s->group_start[g + 1] : (uint32_t)total;
        qsort(s->group_member + begin, end - begin, sizeof *s->group_member, cmp_u32);
        s->group_start[g] = write;
        for (uint32_t k = begin; k < end; k++)
            if (k == begin || s->group_member[k] != s->group_member[k - 1])
                s->group_member[write++] = s->group_member[k];
    }
    s->group_start[g_count] = write;

    /* Popularity: Zipf over a random rank order, so rank is not tied to position. */
    for (uint32_t g = 0; g < g_count; g++) perm[g] = g;
    for (uint32_t g = g_count - 1; g > 0; g--) {
        uint32_t j = synth_below(s, g + 1), t = perm[g];
        perm[g] = perm[j];
        perm[j] = t;
    }
    double acc = 0.0;
    for (uint32_t g = 0; g < g_count; g++) {
        acc += 1.0 / pow((double)perm[g] + 1.0, p->zipf_s);
        s->cumulative[g] = acc;
    }
    free(size);
    free(base);
    free(extra_of);
    free(perm);
    return 0;
fail:
    free(size);
    free(base);
    free(extra_of);
    free(perm);
    kvs_swarm_synth_free(s);
    return -1;
}

uint32_t kvs_swarm_synth_group_size(const kvs_swarm_synth *s, uint32_t g) {
    return s->group_start[g + 1] - s->group_start[g];
}

/* One step: active[0..returned) gets the distinct entries that fired (active must hold N ids);
 * groups (may be NULL; k entries) gets the groups drawn. */
uint32_t kvs_swarm_synth_step(kvs_swarm_synth *s, uint32_t *active, uint32_t *groups) {
    const kvs_swarm_synth_params *p = &s->params;
    uint64_t step = ++s->step;
    uint32_t n_active = 0;
    double total = s->cumulative[p->n_groups - 1];
    memset(s->step_group, 0, p->n_groups);
    for (uint32_t k = 0; k < p->groups_per_step; k++) {
        uint32_t g;
        do {
            double x = synth_unit(s) * total;
            uint32_t lo = 0, hi = p->n_groups - 1;
            while (lo < hi) {
                uint32_t mid = (lo + hi) / 2;
                if (s->cumulative[mid] > x)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            g = lo;
        } while (s->step_group[g]);
        s->step_group[g] = 1;
        if (groups) groups[k] = g;
        for (uint32_t m = s->group_start[g]; m < s->group_start[g + 1]; m++) {
            uint32_t e = s->group_member[m];
            if (synth_unit(s) >= p->member_p || s->stamp[e] == step) continue;
            s->stamp[e] = step;
            active[n_active++] = e;
        }
    }
    uint32_t n_noise = (uint32_t)(p->noise_fraction * p->n_entries + 0.5);
    for (uint32_t k = 0; k < n_noise; k++) {
        uint32_t e = synth_below(s, p->n_entries);
        if (s->stamp[e] == step) continue;
        s->stamp[e] = step;
        active[n_active++] = e;
    }
    return n_active;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Distinct unordered pairs that share a set, sets given in CSR (start[0..n_sets], member). Returns the
 * sorted pair keys (caller frees) and their count in *n_pairs; NULL on no memory. */
static uint64_t *pair_keys(const uint32_t *start, const uint32_t *member, uint32_t n_sets,
                           uint64_t *n_pairs) {
    uint64_t cap = 0;
    for (uint32_t k = 0; k < n_sets; k++) {
        uint64_t n = start[k + 1] - start[k];
        cap += n * (n - (n > 0)) / 2;
    }
    uint64_t *keys = malloc((size_t)(cap + 1) * sizeof *keys), n = 0;
    if (!keys) return NULL;
    for (uint32_t k = 0; k < n_sets; k++)
        for (uint32_t a = start[k]; a < start[k + 1]; a++)
            for (uint32_t b = a + 1; b < start[k + 1]; b++) {
                uint32_t x = member[a], y = member[b];
                if (x == y) continue;
                keys[n++] = x < y ? ((uint64_t)x << 32) | y : ((uint64_t)y << 32) | x;
            }
    qsort(keys, n, sizeof *keys, cmp_u64);
    uint64_t w = 0;
    for (uint64_t i = 0; i < n; i++)
        if (w == 0 || keys[w - 1] != keys[i]) keys[w++] = keys[i];
    *n_pairs = w;
    return keys;
}

/* Pairwise precision, recall and F1 of clusters against the planted groups: a pair is predicted when
 * some cluster holds both entries and true when some group does. Returns -1 on no memory. */
int kvs_swarm_synth_pair_f1(const kvs_swarm_synth *s, const kvs_swarm_clusters *c,
                            double *precision, double *recall, double *f1) {
    uint32_t *start = calloc((size_t)c->n_clusters + 1, sizeof *start);
    if (!start) return -1;
    for (uint32_t k = 0; k < c->n_clusters; k++) start[k + 1] = start[k] + c->items[k].n_members;
    uint32_t *member = malloc((size_t)start[c->n_clusters] * sizeof *member + 1);
    if (!member) {
        free(start);
        return -1;
    }
    for (uint32_t k = 0; k < c->n_clusters; k++)
        memcpy(member + start[k], c->items[k].members,
               (size_t)c->items[k].n_members * sizeof *member);
    uint64_t n_pred = 0, n_true = 0;
    uint64_t *pred = pair_keys(start, member, c->n_clusters, &n_pred);
    uint64_t *truth = pair_keys(s->group_start, s->group_member, s->params.n_groups, &n_true);
    free(start);
    free(member);
    if (!pred || !truth) {
        free(pred);
        free(truth);
        return -1;
    }
    uint64_t both = 0;
    for (uint64_t i = 0, j = 0; i < n_pred && j < n_true;) {
        if (pred[i] == truth[j]) {
            both++;
            i++;
            j++;
        } else if (pred[i] < truth[j]) {
            i++;
        } else {
            j++;
        }
    }
    free(pred);
    free(truth);
    *precision = n_pred ? (double)both / (double)n_pred : 0.0;
    *recall = n_true ? (double)both / (double)n_true : 0.0;
    *f1 = *precision + *recall > 0.0 ? 2.0 * *precision * *recall / (*precision + *recall) : 0.0;
    return 0;
}
