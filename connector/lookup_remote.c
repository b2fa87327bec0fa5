/* lookup_remote.c - queries of the remote tiers on their own thread (lookup_remote.h). */
#include "lookup_remote.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { RL_QUEUED, RL_ASKING, RL_DONE };

struct kvs_rlookup {
    struct kvs_rlookup *next; /* queue */
    int state;                /* RL_* */
    int dropped;              /* the owner forgot it while the thread asked: the thread frees it */
    uint64_t first, n_chunks, submitted_ns;
    uint32_t ranks;
    kvs_key *keys;  /* n_chunks * ranks */
    uint8_t *local; /* n_chunks: held by the other tiers, not asked */
    int16_t *tier;  /* n_chunks: the answer */
};

struct kvs_rlookups {
    kvs_tier_chain *chain;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    pthread_t thread;
    int started, start_failed, stopping;
    kvs_rlookup *head, *tail;
};

static void rlookup_free(kvs_rlookup *l) {
    if (!l) return;
    free(l->keys);
    free(l->local);
    free(l->tier);
    free(l);
}

/* Which remote tier holds the longest run of whole chunks from chunk p, one question per remote
 * tier; returns the run's length (0: none holds chunk p). */
static uint64_t longest_run(kvs_rlookups *q, const kvs_rlookup *l, uint64_t p, int *tier) {
    uint64_t best = 0;
    for (uint32_t t = 0; t < kvs_tiers_count(q->chain); t++) {
        if (!kvs_tiers_is_remote(q->chain, t)) continue;
        uint64_t present = 0;
        if (kvs_tiers_contains(q->chain, t, l->keys + p * l->ranks, (l->n_chunks - p) * l->ranks,
                               &present) != KVS_OK)
            continue; /* a failing tier holds nothing for this query */
        uint64_t chunks = present / l->ranks;
        if (chunks > best) best = chunks, *tier = (int)t;
    }
    return best;
}

/* The answer: remote tiers asked from the first chunk the other tiers lack, one leading run at a
 * time; asking stops at the first chunk no tier holds (a lookup's run ends there). */
static void ask(kvs_rlookups *q, kvs_rlookup *l) {
    uint64_t p = 0;
    while (p < l->n_chunks) {
        if (l->local[p]) {
            p++;
            continue;
        }
        int tier = -1;
        uint64_t run = longest_run(q, l, p, &tier);
        if (run == 0) break;
        for (uint64_t i = 0; i < run && p + i < l->n_chunks; i++) l->tier[p + i] = (int16_t)tier;
        p += run;
    }
}

static void *thread_main(void *arg) {
    kvs_rlookups *q = arg;
    pthread_mutex_lock(&q->mutex);
    for (;;) {
        while (!q->head && !q->stopping) pthread_cond_wait(&q->cond, &q->mutex);
        if (q->stopping) break;
        kvs_rlookup *l = q->head;
        q->head = l->next;
        if (!q->head) q->tail = NULL;
        l->state = RL_ASKING;
        pthread_mutex_unlock(&q->mutex);
        ask(q, l);
        pthread_mutex_lock(&q->mutex);
        l->state = RL_DONE;
        if (l->dropped) rlookup_free(l);
    }
    pthread_mutex_unlock(&q->mutex);
    return NULL;
}

kvs_rlookups *kvs_rlookups_create(kvs_tier_chain *chain) {
    int any = 0;
    for (uint32_t t = 0; t < kvs_tiers_count(chain); t++) any |= kvs_tiers_is_remote(chain, t);
    kvs_rlookups *q = any ? calloc(1, sizeof *q) : NULL;
    if (!q) return NULL;
    q->chain = chain;
    pthread_mutex_init(&q->mutex, NULL);
    pthread_cond_init(&q->cond, NULL);
    return q;
}

void kvs_rlookups_destroy(kvs_rlookups *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mutex);
    q->stopping = 1;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->mutex);
    if (q->started) pthread_join(q->thread, NULL);
    while (q->head) { /* queued, never asked (their owners dropped them first) */
        kvs_rlookup *l = q->head;
        q->head = l->next;
        rlookup_free(l);
    }
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->mutex);
    free(q);
}

kvs_rlookup *kvs_rlookup_submit(kvs_rlookups *q, const kvs_key *keys, uint64_t first,
                                uint64_t n_chunks, uint32_t ranks, const uint8_t *local,
                                uint64_t now_ns) {
    if (!q || q->start_failed || n_chunks == 0 || ranks == 0) return NULL;
    kvs_rlookup *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->first = first;
    l->n_chunks = n_chunks;
    l->ranks = ranks;
    l->submitted_ns = now_ns;
    l->keys = malloc(n_chunks * ranks * sizeof *l->keys);
    l->local = malloc(n_chunks);
    l->tier = malloc(n_chunks * sizeof *l->tier);
    if (!l->keys || !l->local || !l->tier) {
        rlookup_free(l);
        return NULL;
    }
    memcpy(l->keys, keys, n_chunks * ranks * sizeof *l->keys);
    memcpy(l->local, local, n_chunks);
    for (uint64_t i = 0; i < n_chunks; i++) l->tier[i] = -1;
    pthread_mutex_lock(&q->mutex);
    if (!q->started) {
        if (pthread_create(&q->thread, NULL, thread_main, q) != 0) {
            q->start_failed = 1; /* from now on lookups ask the remote tiers themselves */
            pthread_mutex_unlock(&q->mutex);
            rlookup_free(l);
            return NULL;
        }
        q->started = 1;
    }
    if (q->tail)
        q->tail->next = l;
    else
        q->head = l;
    q->tail = l;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->mutex);
    return l;
}

int kvs_rlookup_done(kvs_rlookups *q, kvs_rlookup *l) {
    pthread_mutex_lock(&q->mutex);
    int done = l->state == RL_DONE;
    pthread_mutex_unlock(&q->mutex);
    return done;
}

int kvs_rlookup_matches(const kvs_rlookup *l, const kvs_key *keys, uint64_t first,
                        uint64_t n_chunks, uint32_t ranks) {
    return l->first == first && l->n_chunks == n_chunks && l->ranks == ranks &&
           memcmp(l->keys, keys, n_chunks * ranks * sizeof *keys) == 0;
}

uint64_t kvs_rlookup_submitted_ns(const kvs_rlookup *l) {
    return l->submitted_ns;
}

int kvs_rlookup_tier(const kvs_rlookup *l, uint64_t chunk) {
    if (chunk < l->first || chunk - l->first >= l->n_chunks) return -1;
    return l->tier[chunk - l->first];
}

void kvs_rlookup_drop(kvs_rlookups *q, kvs_rlookup *l) {
    if (!l) return;
    pthread_mutex_lock(&q->mutex);
    if (l->state == RL_ASKING) {
        l->dropped = 1; /* the thread frees it when it has asked */
        pthread_mutex_unlock(&q->mutex);
        return;
    }
    if (l->state == RL_QUEUED) { /* unlink */
        kvs_rlookup **p = &q->head, *prev = NULL;
        while (*p && *p != l) prev = *p, p = &(*p)->next;
        if (*p) {
            *p = l->next;
            if (q->tail == l) q->tail = prev;
        }
    }
    pthread_mutex_unlock(&q->mutex);
    rlookup_free(l);
}
