#include "node_quota.h"

#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

/* Each record counts at least this much against its tenant (a tier gives an object at least a
 * page), so one-byte puts cannot grow the records past share / 4 KiB per tenant. */
#define MIN_CHARGE 4096u

typedef struct record {
    kvs_key key;
    uint64_t len;
    uint32_t tenant;
    struct record *next_hash;
    struct record *older, *newer; /* the tenant's list, oldest first */
} record;

typedef struct tenant_share {
    char name[KVS_SERVER_TENANT_MAX + 1];
    uint64_t share, used;
    record *oldest, *newest;
} tenant_share;

struct node_quota {
    uint64_t default_share; /* node.tenant_capacity; 0: tenants not named have none */
    tenant_share *tenants;
    uint32_t n_tenants, cap_tenants;
    record **buckets; /* by a hash of the key under a seed drawn at create: a tenant who chooses its
                       * keys cannot aim them at one bucket */
    uint64_t n_buckets, n_records, seed;
};

node_quota *node_quota_create(const kvs_server_settings *cfg, int *oom) {
    *oom = 0;
    if (!cfg->node.tenant_capacity && !cfg->node.n_tenants) return NULL;
    node_quota *q = calloc(1, sizeof *q);
    if (q) {
        q->default_share = cfg->node.tenant_capacity;
        q->n_buckets = 1u << 12;
        q->buckets = calloc(q->n_buckets, sizeof *q->buckets);
        if (RAND_bytes((uint8_t *)&q->seed, sizeof q->seed) != 1) q->seed = 0x9e3779b97f4a7c15ull;
        q->seed |= 1;
        q->cap_tenants = cfg->node.n_tenants + 16;
        q->tenants = calloc(q->cap_tenants, sizeof *q->tenants);
    }
    if (!q || !q->buckets || !q->tenants) {
        node_quota_destroy(q);
        *oom = 1;
        return NULL;
    }
    for (uint32_t i = 0; i < cfg->node.n_tenants; i++) {
        tenant_share *t = &q->tenants[q->n_tenants++];
        memcpy(t->name, cfg->node.tenants[i].name, sizeof t->name);
        t->share = cfg->node.tenants[i].capacity;
    }
    return q;
}

void node_quota_destroy(node_quota *q) {
    if (!q) return;
    for (uint64_t b = 0; q->buckets && b < q->n_buckets; b++)
        for (record *r = q->buckets[b], *next; r; r = next) {
            next = r->next_hash;
            free(r);
        }
    free(q->buckets);
    free(q->tenants);
    free(q);
}

static uint64_t bucket_in(const kvs_key *key, uint64_t seed, uint64_t n_buckets) {
    uint64_t lo, hi;
    memcpy(&lo, key->bytes, sizeof lo);
    memcpy(&hi, key->bytes + 8, sizeof hi);
    uint64_t h = (lo ^ seed) * 0xff51afd7ed558ccdull;
    h ^= (hi + seed) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= seed;
    return (h >> 32) & (n_buckets - 1);
}

static uint64_t record_bucket(const node_quota *q, const kvs_key *key) {
    return bucket_in(key, q->seed, q->n_buckets);
}

/* Twice the buckets once there are more records than buckets (out of memory: stay as it is). */
static void grow_buckets(node_quota *q) {
    uint64_t n = q->n_buckets * 2;
    record **b = calloc(n, sizeof *b);
    if (!b) return;
    for (uint64_t i = 0; i < q->n_buckets; i++)
        for (record *r = q->buckets[i], *next; r; r = next) {
            next = r->next_hash;
            uint64_t at = bucket_in(&r->key, q->seed, n);
            r->next_hash = b[at];
            b[at] = r;
        }
    free(q->buckets);
    q->buckets = b;
    q->n_buckets = n;
}

static record **slot_of(node_quota *q, const kvs_key *key) {
    record **at = &q->buckets[record_bucket(q, key)];
    while (*at && memcmp((*at)->key.bytes, key->bytes, sizeof key->bytes) != 0)
        at = &(*at)->next_hash;
    return at;
}

/* The tenant's entry, added with the default share on first sight; NULL when out of memory. */
static tenant_share *tenant_of(node_quota *q, const char *name, int add) {
    for (uint32_t i = 0; i < q->n_tenants; i++)
        if (strcmp(q->tenants[i].name, name) == 0) return &q->tenants[i];
    if (!add || strlen(name) > KVS_SERVER_TENANT_MAX) return NULL;
    if (q->n_tenants == q->cap_tenants) {
        uint32_t cap = q->cap_tenants * 2;
        tenant_share *grown = realloc(q->tenants, cap * sizeof *grown);
        if (!grown) return NULL;
        /* the lists point at records, never at tenants: moving the array is safe */
        memset(grown + q->cap_tenants, 0, (cap - q->cap_tenants) * sizeof *grown);
        q->tenants = grown;
        q->cap_tenants = cap;
    }
    tenant_share *t = &q->tenants[q->n_tenants++];
    strcpy(t->name, name);
    t->share = q->default_share;
    return t;
}

static void unlink_record(node_quota *q, record **slot) {
    record *r = *slot;
    tenant_share *t = &q->tenants[r->tenant];
    if (r->older)
        r->older->newer = r->newer;
    else
        t->oldest = r->newer;
    if (r->newer)
        r->newer->older = r->older;
    else
        t->newest = r->older;
    t->used -= r->len;
    *slot = r->next_hash;
    q->n_records--;
    free(r);
}

void node_quota_forget(node_quota *q, const kvs_key *key) {
    if (!q) return;
    record **slot = slot_of(q, key);
    if (*slot) unlink_record(q, slot);
}

kvs_status node_quota_admit(node_quota *q, const char *tenant, uint64_t len) {
    if (!q) return KVS_OK;
    tenant_share *t = tenant_of(q, tenant, 1);
    if (!t) return KVS_ENOMEM;
    return t->share && len > t->share ? KVS_ENOMEM : KVS_OK;
}

void node_quota_stored(node_quota *q, const char *tenant, const kvs_key *key, uint64_t len,
                       void (*remove)(void *ctx, const kvs_key *key), void *ctx,
                       uint64_t *evicted) {
    if (!q) return;
    tenant_share *t = tenant_of(q, tenant, 1);
    if (!t || !t->share) return;
    node_quota_forget(q, key); /* it replaced what was stored under its key */
    uint64_t charge = len < MIN_CHARGE ? MIN_CHARGE : len;
    record *r = calloc(1, sizeof *r);
    if (r) {
        uint32_t index = (uint32_t)(t - q->tenants);
        *r = (record){.key = *key, .len = charge, .tenant = index, .older = t->newest};
        if (t->newest)
            t->newest->newer = r;
        else
            t->oldest = r;
        t->newest = r;
        t->used += charge;
        if (q->n_records >= q->n_buckets) grow_buckets(q);
        record **slot = &q->buckets[record_bucket(q, key)];
        r->next_hash = *slot;
        *slot = r;
        q->n_records++;
    }
    /* the tenant's oldest go until it is within its share again; never the one just stored */
    while (t->used > t->share && t->oldest && t->oldest != r) {
        kvs_key victim = t->oldest->key;
        unlink_record(q, slot_of(q, &victim));
        remove(ctx, &victim);
        (*evicted)++;
    }
}

uint64_t node_quota_used(const node_quota *q, const char *tenant) {
    if (!q) return 0;
    for (uint32_t i = 0; i < q->n_tenants; i++)
        if (strcmp(q->tenants[i].name, tenant) == 0) return q->tenants[i].used;
    return 0;
}
