/* elastic.c - SwiftCache's sizing, exchange unit and Alg. 1 (elastic.h). */
#include "schedulers/elastic/elastic.h"

#include <string.h>

static int mul(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

uint64_t kvs_el_layer_block_bytes(const kvs_el_model *m) {
    uint64_t x = m->kv_planes;
    if (!m->kv_planes || !m->block_tokens || !m->kv_heads || !m->head_dim || !m->elem_bytes)
        return 0;
    if (!mul(x, m->block_tokens, &x) || !mul(x, m->kv_heads, &x) || !mul(x, m->head_dim, &x) ||
        !mul(x, m->elem_bytes, &x))
        return 0;
    return x;
}

uint64_t kvs_el_block_bytes(const kvs_el_model *m) {
    uint64_t x = kvs_el_layer_block_bytes(m);
    return m->n_layers && mul(x, m->n_layers, &x) ? x : 0;
}

kvs_status kvs_el_plan_capacity(const kvs_el_model *master, uint64_t master_bytes,
                                const uint64_t *worker_bytes, uint32_t n_workers,
                                uint32_t lsc_buffers, uint64_t *k_out, kvs_el_capacity *out) {
    memset(out, 0, sizeof *out);
    uint64_t layer_block = kvs_el_layer_block_bytes(master), block = kvs_el_block_bytes(master);
    if (!layer_block || !block || lsc_buffers < 1 || lsc_buffers > 2 ||
        (n_workers && !worker_bytes))
        return KVS_EINVAL;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n_workers; i++) {
        uint64_t k = worker_bytes[i] / block; /* Eq. 2 */
        if (k_out) k_out[i] = k;
        if (__builtin_add_overflow(sum, k, &sum)) return KVS_EOVERFLOW;
    }
    uint64_t k_master = master_bytes / layer_block; /* Eq. 3 */
    uint64_t lsc_room = k_master / lsc_buffers;
    uint64_t n_lsc = sum < lsc_room ? sum : lsc_room; /* Eq. 4 */
    uint64_t left = k_master - n_lsc * lsc_buffers;   /* single-layer blocks beside it */
    uint64_t n_rc = left / master->n_layers;          /* Eq. 5 (0 once the LSC fills it) */
    uint64_t blocks = n_lsc + n_rc, tokens,
             local = k_master / master->n_layers * master->block_tokens;
    if (!mul(blocks, master->block_tokens, &tokens)) return KVS_EOVERFLOW;
    *out = (kvs_el_capacity){.k_master = k_master,
                             .k_workers = sum,
                             .n_lsc = n_lsc,
                             .n_rc = n_rc,
                             .max_tokens = tokens,
                             .max_tokens_without_lsc = local};
    return KVS_OK;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

kvs_status kvs_el_exchange_unit(const kvs_el_model *master, const kvs_el_model *worker,
                                kvs_el_unit *out) {
    memset(out, 0, sizeof *out);
    uint64_t m = kvs_el_block_bytes(master), w = kvs_el_block_bytes(worker);
    if (!m || !w) return KVS_EINVAL;
    uint64_t lcm;
    if (!mul(m / gcd(m, w), w, &lcm)) return KVS_EOVERFLOW; /* Eq. 8, in bytes */
    *out =
        (kvs_el_unit){.lcm_bytes = lcm, .meu_master = lcm / m, .meu_worker = lcm / w}; /* Eq. 9 */
    return KVS_OK;
}

uint64_t kvs_el_batch_blocks(const uint64_t *tokens, size_t n, uint32_t block_tokens) {
    uint64_t sum = 0;
    if (!block_tokens) return UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = tokens[i] / block_tokens + (tokens[i] % block_tokens != 0);
        if (__builtin_add_overflow(sum, b, &sum)) return UINT64_MAX;
    }
    return sum;
}

static kvs_el_delta units(uint64_t k, const kvs_el_unit *u) {
    kvs_el_delta d = {.units = k};
    if (!mul(k, u->meu_worker, &d.worker_blocks) || !mul(k, u->meu_master, &d.master_blocks))
        d = (kvs_el_delta){0};
    return d;
}

kvs_el_delta kvs_el_scale_up(uint64_t owned, uint64_t need, uint64_t lent_master,
                             const kvs_el_unit *u) {
    if (need <= owned || !u->meu_worker || !u->meu_master) return (kvs_el_delta){0};
    uint64_t gap = need - owned;
    uint64_t k = gap / u->meu_worker + (gap % u->meu_worker != 0); /* rounded up */
    uint64_t most = lent_master / u->meu_master;                   /* whole units lent */
    int shortfall = k > most;
    kvs_el_delta d = units(shortfall ? most : k, u);
    /* a take-back whose block count does not fit 64 bits is none: the demand stays short */
    d.short_of_demand = shortfall || (d.units == 0 && k != 0);
    return d;
}

kvs_el_delta kvs_el_scale_down(uint64_t owned, uint64_t window_need, const kvs_el_unit *u) {
    if (window_need >= owned || !u->meu_worker || !u->meu_master) return (kvs_el_delta){0};
    return units((owned - window_need) / u->meu_worker, u); /* rounded down */
}

void kvs_el_window_init(kvs_el_window *w, uint64_t window_ms) {
    memset(w, 0, sizeof *w);
    w->window_ms = window_ms;
}

void kvs_el_window_note(kvs_el_window *w, uint64_t now_ms, uint64_t blocks) {
    /* samples closer than a bucket (the window over the ring's slots) share the newest slot, so
     * the ring always spans the whole window however often samples come */
    uint64_t bucket =
        w->window_ms / KVS_EL_WINDOW_SAMPLES ? w->window_ms / KVS_EL_WINDOW_SAMPLES : 1;
    if (w->count) {
        uint32_t last = (w->head + w->count - 1) % KVS_EL_WINDOW_SAMPLES;
        if (now_ms >= w->at_ms[last] && now_ms - w->at_ms[last] < bucket) {
            if (blocks > w->blocks[last]) w->blocks[last] = blocks;
            return; /* the slot keeps its start: its peak counts a slot's span longer (below) */
        }
    }
    if (w->count == KVS_EL_WINDOW_SAMPLES) { /* fold the oldest into the next: its peak, later */
        uint32_t next = (w->head + 1) % KVS_EL_WINDOW_SAMPLES;
        if (w->blocks[w->head] > w->blocks[next]) w->blocks[next] = w->blocks[w->head];
        w->head = next;
        w->count--;
    }
    uint32_t at = (w->head + w->count) % KVS_EL_WINDOW_SAMPLES;
    w->at_ms[at] = now_ms;
    w->blocks[at] = blocks;
    w->count++;
}

uint64_t kvs_el_window_max(const kvs_el_window *w, uint64_t now_ms) {
    uint64_t best = 0, bucket = w->window_ms / KVS_EL_WINDOW_SAMPLES;
    uint64_t span = w->window_ms + (bucket ? bucket : 1); /* a slot's samples start at its time */
    for (uint32_t i = 0; i < w->count; i++) {
        uint32_t at = (w->head + i) % KVS_EL_WINDOW_SAMPLES;
        int recent = w->at_ms[at] > now_ms || now_ms - w->at_ms[at] < span;
        if (recent && w->blocks[at] > best) best = w->blocks[at];
    }
    return best;
}
