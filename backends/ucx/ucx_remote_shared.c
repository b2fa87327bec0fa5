/*
 * ucx_remote_shared.c - gets out of and puts into the shared DRAM tier of a node on this host
 * (docs/remote.md, "Gets out of the node's shared tier"): a node whose first tier is a dram tier
 * with shm_name names it in AUTH_OK to a client on its host that offered shared memory; the client
 * attaches the same tier (backends/dram, process-shared) and copies objects out of it, and puts
 * into its free slabs, itself: one copy of the bytes and no transfer the node drives, so nothing
 * can land in the caller's buffer after it gave up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/dram/dram.h"
#include "common/clock.h"
#include "common/copy.h"
#include "ucx_remote_error.h"
#include "ucx_remote_shared.h"

static const kvs_backend_host SHARED_HOST = {.struct_size = sizeof(kvs_backend_host)};

/* Keys pinned at once: few enough that the node's own puts still find room, and that the last of
 * a run is copied well within its pin's timeout_ms */
#define SHARED_RUN_MAX 32u

void remote_shared_attach(remote *r, rnode *nd, const kvs_wire_msg *m) {
    remote_shared_detach(r, nd); /* a session before this one, should it still hold one */
    if (!r->opt.shared_memory || !m->shared_tier_len) return;
    char name[KVS_WIRE_MAX_SHARED_TIER_NAME + 1], tier_name[160], err[256] = "";
    snprintf(name, sizeof name, "%.*s", (int)m->shared_tier_len, m->shared_tier);
    snprintf(tier_name, sizeof tier_name, "%s: node %s's shared tier", r->name, node_id(r, nd));
    /* - attach only: where this process does not see the node's /dev/shm (another IPC or mount
     *   namespace) it must not create an empty tier of the node's size;
     * - a node stopped while it holds the tier's lock (SIGSTOP, a debugger) must not stop this
     *   process: after a quarter of timeout_ms (the lock is held for microseconds) its gets and
     *   puts go to the node instead, whose own deadline ends them (shared_shun);
     * - evict: never: a put of ours takes free room only; evictions are the node's, which passes
     *   the objects down its tiers (ours would drop them) and keeps some room free for us */
    char lock_ms[16];
    snprintf(lock_ms, sizeof lock_ms, "%u", r->opt.timeout_ms / 4 ? r->opt.timeout_ms / 4 : 1);
    kvs_backend_option opt[4] = {{.key = "shm_name", .value = name},
                                 {.key = "shm_open", .value = "attach"},
                                 {.key = "lock_timeout_ms", .value = lock_ms},
                                 {.key = "evict", .value = "never"}};
    kvs_backend_init init;
    memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    init.tier_name = tier_name;
    init.capacity_bytes = m->shared_tier_capacity;
    init.max_object_bytes = m->shared_tier_max_object;
    init.options = opt;
    init.n_options = 4;
    init.host = &SHARED_HOST;
    init.error = err;
    init.error_len = sizeof err;
    void *tier = NULL;
    if (kvs_dram_backend()->create(&init, &tier) != KVS_OK) {
        remote_set_error(r,
                         "node %s is on this host but its shared tier \"%s\" cannot be attached "
                         "(%s); gets go over its connection",
                         node_id(r, nd), name, err);
        return;
    }
    __atomic_store_n(&nd->shared_shunned_until_ns, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&nd->shared_tier, tier, __ATOMIC_RELEASE);
    pthread_mutex_lock(&r->mutex);
    r->stats.nodes_shared_tier++;
    pthread_mutex_unlock(&r->mutex);
}

void remote_shared_detach(remote *r, rnode *nd) {
    void *tier = __atomic_exchange_n(&nd->shared_tier, NULL, __ATOMIC_SEQ_CST);
    if (!tier) return;
    /* a get that took the tier before the exchange is still copying out of it: wait for it (a
     * batch's copies), then no thread can reach the tier any more */
    while (__atomic_load_n(&nd->shared_readers, __ATOMIC_SEQ_CST)) {
        struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
    }
    kvs_dram_backend()->destroy(tier);
    pthread_mutex_lock(&r->mutex);
    r->stats.nodes_shared_tier--;
    pthread_mutex_unlock(&r->mutex);
}

void remote_shared_detach_all(remote *r) {
    for (uint32_t i = 0; r->nodes && i < r->opt.n_nodes; i++) remote_shared_detach(r, &r->nodes[i]);
}

/* A node's shared tier to use, counted in as a reader (shared_release), or NULL: counted in before
 * the tier is read, so remote_shared_detach waits for us (seq_cst pairs this with its exchange). */
static void *shared_acquire(rnode *nd, uint64_t now) {
    if (now < __atomic_load_n(&nd->shared_shunned_until_ns, __ATOMIC_RELAXED)) return NULL;
    __atomic_add_fetch(&nd->shared_readers, 1, __ATOMIC_SEQ_CST);
    void *t = __atomic_load_n(&nd->shared_tier, __ATOMIC_SEQ_CST);
    if (!t) __atomic_sub_fetch(&nd->shared_readers, 1, __ATOMIC_SEQ_CST);
    return t;
}

static void shared_release(rnode *nd) {
    __atomic_sub_fetch(&nd->shared_readers, 1, __ATOMIC_SEQ_CST);
}

/* The names the node stores keys[0, n) under (its tenant's keys), in out: KVS_OK, or a status. */
static kvs_status tenant_keys(remote *r, const kvs_key *keys, uint64_t n, kvs_key *out) {
    kvs_status st = KVS_ENOMEM;
    pthread_mutex_lock(&r->tenant_hasher_mutex);
    if (!r->tenant_hasher)
        r->tenant_hasher = kvs_remote_tenant_hasher_new(r->opt.tenant, strlen(r->opt.tenant));
    if (r->tenant_hasher) {
        st = KVS_OK;
        for (uint64_t i = 0; st == KVS_OK && i < n; i++)
            st = kvs_remote_tenant_hasher_key(r->tenant_hasher, &keys[i], &out[i]);
    }
    pthread_mutex_unlock(&r->tenant_hasher_mutex);
    return st;
}

/* The tier's lock was held past lock_timeout_ms: leave this node's tier alone for timeout_ms. */
static void shared_shun(remote *r, rnode *nd, void *tier) {
    __atomic_store_n(&nd->shared_shunned_until_ns,
                     kvs_now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull, __ATOMIC_RELAXED);
    remote_set_error(r, "node %s's shared tier: %s; requests go to the node for %u ms",
                     node_id(r, nd), kvs_dram_backend()->last_error(tier), r->opt.timeout_ms);
}

uint64_t remote_shared_gets(remote *r, const kvs_key *keys, void *const *dsts, const uint64_t *caps,
                            uint64_t n, uint64_t *lens, kvs_status *statuses) {
    void *tiers[KVS_REMOTE_RING_MAX_NODES];
    rnode *held[KVS_REMOTE_RING_MAX_NODES];
    uint32_t n_tiers = 0;
    uint64_t now = kvs_now_ns();
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        void *t = shared_acquire(&r->nodes[i], now);
        if (t) {
            tiers[n_tiers] = t;
            held[n_tiers++] = &r->nodes[i];
        }
    }
    if (!n_tiers) return 0;
    const kvs_backend_ops *d = kvs_dram_backend();
    uint64_t answered = 0, hits = 0;
    kvs_key *tk = malloc(n * sizeof *tk);
    int named = tk && tenant_keys(r, keys, n, tk) == KVS_OK;
    for (uint32_t t = 0; named && t < n_tiers; t++) {
        int locked_out = 0; /* the tier's lock was not free within timeout_ms: leave it */
        for (uint64_t i = 0; i < n && !locked_out;) {
            if (statuses[i] != KVS_ENOTFOUND) { /* an earlier tier answered it */
                i++;
                continue;
            }
            uint64_t run = 1, pinned = 0;
            while (i + run < n && run < SHARED_RUN_MAX && statuses[i + run] == KVS_ENOTFOUND) run++;
            /* the run's present prefix pinned in one trip, copied, unpinned: the node's evictions
             * skip pinned objects. A removal is forced even under pins (the dram tier's rule), and
             * then the connector's checksum fails the copy, as for an object torn on any tier */
            kvs_status st = d->pin(tiers[t], tk + i, run, r->opt.timeout_ms, &pinned);
            if (st != KVS_OK) pinned = 0;
            locked_out = st == KVS_ETIMEDOUT;
            for (uint64_t k = i; k < i + pinned && !locked_out; k++) {
                const void *object = NULL;
                uint64_t len = 0;
                if ((st = d->get_ref(tiers[t], &tk[k], &object, &len)) != KVS_OK) {
                    locked_out = st == KVS_ETIMEDOUT;
                    continue;
                }
                if (len <= caps[k]) {
                    kvs_copy_streaming(dsts[k], object, (size_t)len);
                    statuses[k] = KVS_OK;
                    hits++;
                } else {
                    statuses[k] = KVS_EOVERFLOW;
                }
                lens[k] = len;
                answered++;
            }
            if (pinned && !locked_out) d->unpin(tiers[t], tk + i, pinned); /* else they lapse */
            i += pinned < run ? pinned + 1 : pinned; /* the key after the prefix is not here */
        }
        if (locked_out) shared_shun(r, held[t], tiers[t]);
    }
    free(tk);
    kvs_copy_fence();
    for (uint32_t t = 0; t < n_tiers; t++) shared_release(held[t]);
    pthread_mutex_lock(&r->mutex);
    r->stats.shared_tier_gets += hits;
    pthread_mutex_unlock(&r->mutex);
    return answered;
}

kvs_status remote_shared_put(remote *r, const kvs_key *key, const void *object, uint64_t len) {
    if (r->opt.replicas != 1) return KVS_ENOTSUP; /* every copy goes the same way: the queue */
    uint32_t home = 0, n = 0;
    pthread_mutex_lock(&r->mutex);
    int found = r->stats.nodes_shared_tier > 0 &&
                kvs_remote_ring_homes(&r->ring, key, 1, &home, &n) == KVS_OK && n == 1;
    pthread_mutex_unlock(&r->mutex);
    if (!found) return KVS_ENOTFOUND;
    rnode *nd = &r->nodes[home];
    void *tier = shared_acquire(nd, kvs_now_ns());
    if (!tier) return KVS_ENOTFOUND;
    const kvs_backend_ops *d = kvs_dram_backend();
    kvs_key tk;
    kvs_status st = tenant_keys(r, key, 1, &tk);
    void *dst = NULL;
    uint64_t ticket = 0;
    if (st == KVS_OK) st = d->reserve(tier, &tk, len, &dst, &ticket);
    if (st == KVS_OK) { /* room of its own until the commit: nothing else writes or reads it */
        kvs_copy_streaming(dst, object, (size_t)len);
        kvs_copy_fence();
        st = d->commit(tier, ticket);
    }
    if (st == KVS_ETIMEDOUT) shared_shun(r, nd, tier);
    shared_release(nd);
    if (st == KVS_OK) {
        pthread_mutex_lock(&r->mutex);
        r->stats.shared_tier_puts++;
        r->stats.puts_stored++;
        pthread_mutex_unlock(&r->mutex);
    }
    return st;
}
