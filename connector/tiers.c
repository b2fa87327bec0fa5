/* tiers.c - the chain of tiers (tiers.h): opening built-ins and plugins, write-back and
 * write-through between them, and every call the connector makes into a backend. */
#include "tiers.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/compress/compress.h"
#include "backends/dram/dram.h"
#include "backends/peer_gpu/peer_gpu.h"
#include "backends/redis/redis.h"
#include "backends/ssd/ssd.h"
#include "backends/ucx/remote.h"
#include "common/log.h"
#include "common/status.h"
#include "empty_tier.h"
#include "object.h"
#include "policy.h"

/* The 1.0 table ends at usage; 1.1 appended reserve, commit, abort and memory. */
#define KVS_BACKEND_OPS_1_0_SIZE offsetof(kvs_backend_ops, reserve)

typedef struct kvs_tier {
    char name[KVS_NAME_MAX];
    const kvs_backend_ops *ops;
    void *state;
    void *dl; /* plugin handle, NULL for built-ins */
    kvs_write_policy write;
    int remote;   /* type remote: its answers cross the network (read once, at open) */
    int degraded; /* it could not open: an empty tier (empty_tier.h) stands in for it */
    char degraded_reason[320]; /* why, for operators' tools (the same words as the warning) */
    uint32_t index;
    struct kvs_tier_chain *chain;
    kvs_backend_host host;
    kvs_backend_option *options;
    char **option_text; /* values with {rank} replaced, owned; NULL entries borrow the config's */
    size_t n_option_text;
} kvs_tier;

struct kvs_tier_chain {
    kvs_tier *tiers;
    uint32_t n;
    kvs_tier_encoder encoder; /* for compress tiers (encodings NULL: none) */
    void *staging_base;       /* the worker's pool, told to backends (io_uring fixed buffers) */
    int32_t rank;             /* what {rank} in an option value becomes; < 0: left as written */
    uint64_t staging_len;
    int log_level;
    kvs_tier_event_fn on_event;
    void *event_ctx;
    _Atomic uint64_t evictions;
    _Atomic uint64_t dropped_saves; /* puts the top tier accepted and could not store after all */
};

typedef struct builtin {
    const char *type;
    const kvs_backend_ops *(*ops)(void);
} builtin;

static const builtin builtins[] = {
    {"dram", kvs_dram_backend},         {"compress", kvs_compress_backend},
    {"ssd", kvs_ssd_backend},           {"remote", kvs_remote_backend},
    {"peer_gpu", kvs_peer_gpu_backend}, {"redis", kvs_redis_backend}};

static void host_log(void *ctx, int level, const char *message) {
    kvs_tier *t = ctx;
    kvs_log(t->chain->log_level, level, "tier \"%s\": %s", t->name, message);
}

/* A tier that hands a put it has no room for to the next one (KVS_BACKEND_CAP_SPILLS). */
static int spills(const kvs_tier *t, kvs_status st) {
    return st == KVS_ENOMEM && (t->ops->caps & KVS_BACKEND_CAP_SPILLS);
}

int kvs_tiers_raw_key(const kvs_key *key) {
    return memcmp(key->bytes, KVS_TIERS_RAW_MAGIC, 8) == 0 ||
           memcmp(key->bytes, KVS_TIERS_SPARSE_MAGIC, 8) == 0;
}

/* Write-back: an object the tier drops moves one tier down; from the last tier it is gone. A raw
 * block (the layer stream cache's) is no object: it is gone at once, and never announced. */
static void host_on_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    kvs_tier *t = ctx;
    kvs_tier_chain *c = t->chain;
    uint32_t next = t->index + 1;
    if (kvs_tiers_raw_key(key)) return;
    /* A tier below that could not open stores nothing: the object leaves the chain, an eviction. */
    int below = next < c->n && !c->tiers[next].degraded;
    if (below && t->write == KVS_WRITE_BACK && object) {
        kvs_tier *down = &c->tiers[next];
        kvs_status st = down->ops->put(down->state, key, object, len);
        while (spills(down, st) && next + 1 < c->n) { /* no room there: the tier below it */
            down = &c->tiers[++next];
            st = down->ops->put(down->state, key, object, len);
        }
        if (st == KVS_OK) {
            if (c->on_event) c->on_event(c->event_ctx, KVS_EVENT_STORED, key, next);
        } else {
            kvs_log(c->log_level, KVS_LOG_WARN, "tier \"%s\": write-back to \"%s\" failed: %s",
                    t->name, down->name, down->ops->last_error(down->state));
        }
    } else if (!below || !object) {
        atomic_fetch_add(
            &c->evictions,
            1); /* gone from the chain (a tier without the bytes cannot pass them down) */
    }
    if (c->on_event) c->on_event(c->event_ctx, KVS_EVENT_REMOVED, key, t->index);
}

/* A put the tier accepted could not be stored after all (a device tier that writes in the
 * background). From the top tier it was a save: counted as skipped. From a lower tier it was a
 * write-back or write-through copy: gone from the chain, counted as an eviction. */
static void host_on_put_dropped(void *ctx, const kvs_key *key, kvs_status why) {
    kvs_tier *t = ctx;
    kvs_tier_chain *c = t->chain;
    if (kvs_tiers_raw_key(key)) return; /* never announced, never a save */
    /* its STORED event went out at put: routers learn it is gone (not an eviction) */
    if (c->on_event)
        c->on_event(c->event_ctx, KVS_EVENT_REMOVED | KVS_TIER_EVENT_DROPPED, key, t->index);
    uint64_t n = t->index == 0 ? atomic_fetch_add(&c->dropped_saves, 1) + 1
                               : atomic_fetch_add(&c->evictions, 1) + 1;
    if ((n & (n - 1)) == 0) /* the 1st, 2nd, 4th, 8th ...: a full device cannot flood the log */
        kvs_log(c->log_level, KVS_LOG_WARN,
                "tier \"%s\": a %s it had accepted was dropped (%s); %llu so far", t->name,
                t->index == 0 ? "save" : "copy", kvs_status_sentence(why), (unsigned long long)n);
}

static kvs_status host_encodings(void *ctx, const void *object, uint64_t len,
                                 kvs_backend_encoding *out, uint32_t cap, uint32_t *n) {
    kvs_tier *t = ctx;
    return t->chain->encoder.encodings(t->chain->encoder.ctx, object, len, out, cap, n);
}

static kvs_status host_encode(void *ctx, const void *object, uint64_t len, uint32_t id, void *dst,
                              uint64_t cap, uint64_t *out_len) {
    kvs_tier *t = ctx;
    return t->chain->encoder.encode(t->chain->encoder.ctx, object, len, id, dst, cap, out_len);
}

static kvs_status host_plan(void *ctx, const kvs_backend_place_entry *entries, uint64_t n,
                            const kvs_backend_devices *devices, kvs_backend_place_choice *out) {
    kvs_tier *t = ctx;
    return t->chain->encoder.plan(t->chain->encoder.ctx, entries, n, devices, out);
}

/* A plugin that cannot serve as a tier is a configuration error at its `plugin:` line; one built for
 * another backend ABI major keeps KVS_EVERSION, with the same position. */
static kvs_status check_plugin_ops(const kvs_backend_ops *ops, const kvs_config *cfg, uint32_t i,
                                   char *err, uint64_t err_len) {
    const kvs_tier_config *tc = &cfg->tiers[i];
    if (!ops || ops->abi_major != KVS_BACKEND_ABI_MAJOR) {
        if (ops)
            kvs_config_refuse_tier(
                cfg, i, "plugin", err, err_len,
                "tier \"%s\": plugin %s implements backend ABI major %u; this library needs %d",
                tc->name, tc->plugin, ops->abi_major, KVS_BACKEND_ABI_MAJOR);
        else
            kvs_config_refuse_tier(cfg, i, "plugin", err, err_len,
                                   "tier \"%s\": plugin %s refuses backend ABI major %d", tc->name,
                                   tc->plugin, KVS_BACKEND_ABI_MAJOR);
        return KVS_EVERSION;
    }
    if (ops->struct_size < KVS_BACKEND_OPS_1_0_SIZE)
        return kvs_config_refuse_tier(
            cfg, i, "plugin", err, err_len,
            "tier \"%s\": plugin %s table is %u bytes, smaller than the %zu of ABI 1.0", tc->name,
            tc->plugin, ops->struct_size, (size_t)KVS_BACKEND_OPS_1_0_SIZE);
    const char *missing = !ops->create       ? "create"
                          : !ops->destroy    ? "destroy"
                          : !ops->last_error ? "last_error"
                          : !ops->contains   ? "contains"
                          : !ops->pin        ? "pin"
                          : !ops->unpin      ? "unpin"
                          : !ops->get        ? "get"
                          : !ops->put        ? "put"
                          : !ops->remove     ? "remove"
                          : !ops->usage      ? "usage"
                                             : NULL;
    if (!missing && (ops->caps & KVS_BACKEND_CAP_ZERO_COPY) && !ops->get_ref) missing = "get_ref";
    if (!missing && (ops->caps & KVS_BACKEND_CAP_RESERVE))
        missing = !KVS_HAS_OP(ops, reserve)  ? "reserve"
                  : !KVS_HAS_OP(ops, commit) ? "commit"
                  : !KVS_HAS_OP(ops, abort)  ? "abort"
                                             : NULL;
    if (!missing && (ops->caps & KVS_BACKEND_CAP_MEMORY) && !KVS_HAS_OP(ops, memory))
        missing = "memory";
    if (missing)
        return kvs_config_refuse_tier(cfg, i, "plugin", err, err_len,
                                      "tier \"%s\": plugin %s has no '%s' operation", tc->name,
                                      tc->plugin, missing);
    return KVS_OK;
}

static kvs_status resolve_ops(kvs_tier *t, const kvs_config *cfg, uint32_t i, char *err,
                              uint64_t err_len) {
    const kvs_tier_config *tc = &cfg->tiers[i];
    if (strcmp(tc->type, "plugin") != 0) {
        for (size_t b = 0; b < sizeof builtins / sizeof builtins[0]; b++) {
            if (strcmp(tc->type, builtins[b].type) == 0) {
                t->ops = builtins[b].ops();
                return KVS_OK;
            }
        }
        kvs_fmt(err, err_len, "tier \"%s\": backend type \"%s\" is not built into this library",
                tc->name, tc->type);
        return KVS_ENOTSUP;
    }
    struct stat sb;
    if (stat(tc->plugin, &sb) != 0)
        return kvs_config_refuse_tier(cfg, i, "plugin", err, err_len,
                                      "tier \"%s\": plugin %s does not exist (%s)", tc->name,
                                      tc->plugin, strerror(errno));
    dlerror();
    t->dl = dlopen(tc->plugin, RTLD_NOW | RTLD_LOCAL);
    if (!t->dl) {
        const char *why = dlerror();
        return kvs_config_refuse_tier(cfg, i, "plugin", err, err_len,
                                      "tier \"%s\": cannot load plugin: %s", tc->name,
                                      why ? why : tc->plugin);
    }
    kvs_backend_entry_fn entry;
    *(void **)&entry = dlsym(t->dl, KVS_BACKEND_ENTRY_SYMBOL);
    if (!entry)
        return kvs_config_refuse_tier(cfg, i, "plugin", err, err_len,
                                      "tier \"%s\": %s is not a kvstrata backend (no symbol %s)",
                                      tc->name, tc->plugin, KVS_BACKEND_ENTRY_SYMBOL);
    t->ops = entry(KVS_BACKEND_ABI_MAJOR);
    return check_plugin_ops(t->ops, cfg, i, err, err_len);
}

/* A create that failed because of what the tier met (a device, a file system, memory, a peer), not
 * because of what the file says: such a tier may be replaced by an empty one. A refused
 * configuration (KVS_ECONFIG, KVS_EVERSION), a wrong argument and an unknown status always refuse. */
static int environment_failure(kvs_status st) {
    return st == KVS_EIO || st == KVS_ETIMEDOUT || st == KVS_ENOMEM || st == KVS_EAGAIN ||
           st == KVS_ENOTFOUND || st == KVS_ECORRUPT;
}

/* Tier t could not open (why) and is not required: an empty tier stands in for it, so the engine
 * serves on with the other tiers. One warning says so; lookups miss it and saves to it are skipped. */
static kvs_status open_empty(kvs_tier_chain *c, kvs_tier *t, const kvs_tier_config *tc,
                             const char *why, char *err, uint64_t err_len) {
    kvs_backend_option options[2] = {{"type", tc->type}, {"reason", why}};
    char failed[256] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = tc->name,
                             .options = options,
                             .n_options = 2,
                             .error = failed,
                             .error_len = sizeof failed};
    t->ops = kvs_empty_tier_backend();
    t->remote = 0;
    t->degraded = 1;
    kvs_fmt(t->degraded_reason, sizeof t->degraded_reason, "%s", why);
    kvs_status st = t->ops->create(&init, &t->state);
    if (st != KVS_OK) {
        t->state = NULL;
        kvs_fmt(err, err_len, "tier \"%s\": %s; %s", tc->name, why, failed);
        return st;
    }
    kvs_log(c->log_level, KVS_LOG_WARN,
            "tier \"%s\" (%s) could not open and serves empty: every lookup in it misses and "
            "every save to it is skipped (%s; `required: true` refuses to open instead): %s",
            tc->name, tc->type,
            t->index == 0 ? "counted in saves_skipped" : "objects written back to it are evictions",
            why);
    return KVS_OK;
}

/* value with each {rank} replaced by rank (a worker's own tensor-parallel rank: one lender's socket
 * per GPU), malloc'd; NULL when out of memory. */
static char *with_rank(const char *value, int32_t rank) {
    char num[16];
    int nl = snprintf(num, sizeof num, "%d", (int)rank);
    size_t n = 0;
    for (const char *p = value; (p = strstr(p, "{rank}")); p += 6) n++;
    char *out = malloc(strlen(value) + n * (size_t)nl + 1);
    if (!out) return NULL;
    char *o = out;
    for (const char *p = value; *p;) {
        if (strncmp(p, "{rank}", 6) == 0) {
            memcpy(o, num, (size_t)nl);
            o += nl;
            p += 6;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
    return out;
}

/* The tier's options for its backend: the config's, with {rank} replaced in those that hold it
 * (a worker's rank; the replaced text is the tier's, freed with it). */
static kvs_status tier_options(kvs_tier_chain *c, kvs_tier *t, const kvs_tier_config *tc, char *err,
                               uint64_t err_len) {
    t->options = calloc(tc->n_options ? tc->n_options : 1, sizeof *t->options);
    if (!t->options) {
        kvs_fmt(err, err_len, "tier \"%s\": out of memory", tc->name);
        return KVS_ENOMEM;
    }
    for (size_t k = 0; k < tc->n_options; k++) {
        t->options[k].key = tc->options[k].key;
        t->options[k].value = tc->options[k].value;
        if (c->rank >= 0 && strstr(tc->options[k].value, "{rank}")) {
            if (!t->option_text) {
                if (!(t->option_text = calloc(tc->n_options, sizeof(char *)))) {
                    kvs_fmt(err, err_len, "tier \"%s\": out of memory", tc->name);
                    return KVS_ENOMEM;
                }
                t->n_option_text = tc->n_options;
            }
            if (!(t->option_text[k] = with_rank(tc->options[k].value, c->rank))) {
                kvs_fmt(err, err_len, "tier \"%s\": out of memory", tc->name);
                return KVS_ENOMEM;
            }
            t->options[k].value = t->option_text[k];
        }
    }
    return KVS_OK;
}

/* What the backend may call back into: logging, evictions, dropped puts, the policy's hooks and,
 * with an encoder, the encodings. */
static void tier_host(kvs_tier_chain *c, kvs_tier *t) {
    t->host = (kvs_backend_host){.struct_size = sizeof(kvs_backend_host),
                                 .ctx = t,
                                 .log = host_log,
                                 .on_evict = host_on_evict,
                                 .on_put_dropped = host_on_put_dropped};
    kvs_policy_install(&t->host);
    if (c->encoder.encodings) {
        t->host.encodings = host_encodings;
        t->host.encode = host_encode;
        t->host.plan = host_plan;
        t->host.reevaluate_ms = c->encoder.reevaluate_ms;
    }
}

/* The backend's create failed with st (why, and the option it refused): a refused configuration
 * points at its line; a failure of the environment leaves an empty tier in its place unless the
 * tier is required; anything else is the open's error. */
static kvs_status create_failed(kvs_tier_chain *c, kvs_tier *t, const kvs_config *cfg, uint32_t i,
                                kvs_status st, char *why, uint64_t why_len, const char *refused,
                                char *err, uint64_t err_len) {
    const kvs_tier_config *tc = &cfg->tiers[i];
    t->state = NULL;
    if (!why[0]) kvs_fmt(why, why_len, "tier \"%s\": create failed (%d)", tc->name, (int)st);
    /* A refused configuration points at the line of what the backend named (or the tier). */
    if (st == KVS_ECONFIG) return kvs_config_refuse_tier(cfg, i, refused, err, err_len, "%s", why);
    if (!environment_failure(st)) {
        kvs_fmt(err, err_len, "%s", why);
        return st;
    }
    if (tc->required) {
        kvs_fmt(err, err_len, "tier \"%s\" cannot open and is required (required: true): %s",
                tc->name, why);
        return st;
    }
    return open_empty(c, t, tc, why, err, err_len);
}

static kvs_status open_tier(kvs_tier_chain *c, uint32_t i, const kvs_config *cfg,
                            uint64_t max_object_bytes, char *err, uint64_t err_len) {
    const kvs_tier_config *tc = &cfg->tiers[i];
    kvs_tier *t = &c->tiers[i];
    memcpy(t->name, tc->name, sizeof t->name);
    t->index = i;
    t->chain = c;
    t->write = tc->write;
    kvs_status st = resolve_ops(t, cfg, i, err, err_len);
    if (st != KVS_OK) return st;
    if ((st = tier_options(c, t, tc, err, err_len)) != KVS_OK) return st;
    tier_host(c, t);
    t->remote = (t->ops->caps & KVS_BACKEND_CAP_REMOTE) != 0;
    char why[512] = "", refused[KVS_NAME_MAX + 16] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = tc->name,
                             .capacity_bytes = tc->capacity_bytes,
                             .max_object_bytes = max_object_bytes,
                             .options = t->options,
                             .n_options = tc->n_options,
                             .host = &t->host,
                             .error = why,
                             .error_len = sizeof why,
                             .staging_base = c->staging_base,
                             .staging_len = c->staging_len,
                             .error_option = refused,
                             .error_option_len = sizeof refused};
    st = t->ops->create(&init, &t->state);
    if (st != KVS_OK)
        return create_failed(c, t, cfg, i, st, why, sizeof why, refused, err, err_len);
    return KVS_OK;
}

kvs_status kvs_tiers_open(const kvs_config *cfg, uint64_t max_object_bytes,
                          const kvs_tier_encoder *encoder, void *staging_base, uint64_t staging_len,
                          kvs_tier_event_fn on_event, void *event_ctx, kvs_tier_chain **out,
                          char *err, uint64_t err_len) {
    return kvs_tiers_open_ranked(cfg, max_object_bytes, encoder, staging_base, staging_len, -1,
                                 on_event, event_ctx, out, err, err_len);
}

kvs_status kvs_tiers_open_ranked(const kvs_config *cfg, uint64_t max_object_bytes,
                                 const kvs_tier_encoder *encoder, void *staging_base,
                                 uint64_t staging_len, int32_t rank, kvs_tier_event_fn on_event,
                                 void *event_ctx, kvs_tier_chain **out, char *err,
                                 uint64_t err_len) {
    *out = NULL;
    kvs_tier_chain *c = calloc(1, sizeof *c);
    if (!c || !(c->tiers = calloc(cfg->n_tiers, sizeof *c->tiers))) {
        free(c);
        kvs_fmt(err, err_len, "tiers: out of memory");
        return KVS_ENOMEM;
    }
    c->log_level = cfg->log_level;
    if (encoder) c->encoder = *encoder;
    c->staging_base = staging_base;
    c->staging_len = staging_len;
    c->rank = rank;
    c->on_event = on_event;
    c->event_ctx = event_ctx;
    for (uint32_t i = 0; i < cfg->n_tiers; i++) {
        c->n = i + 1; /* so close() tears down exactly what was set up */
        kvs_status st = open_tier(c, i, cfg, max_object_bytes, err, err_len);
        if (st != KVS_OK) {
            kvs_tiers_close(c);
            return st;
        }
    }
    /* A tier that passes objects down from its own thread (KVS_BACKEND_CAP_EVICTS_ON_ITS_THREAD:
     * a peer_gpu tier's reclaims) does so while the connector calls the tiers below: they must take
     * calls from several threads at once. */
    for (uint32_t i = 0; i < c->n; i++) {
        if (!(c->tiers[i].ops->caps & KVS_BACKEND_CAP_EVICTS_ON_ITS_THREAD)) continue;
        for (uint32_t j = i + 1; j < c->n; j++) {
            if (c->tiers[j].ops->caps & KVS_BACKEND_CAP_THREAD_SAFE) continue;
            const char *type = c->tiers[i].ops->type_name;
            kvs_status st = kvs_config_refuse_tier(
                cfg, j, "", err, err_len,
                "tier \"%s\": a %s tier above it (\"%s\") passes objects down from its own "
                "thread, and this tier's backend is not thread-safe",
                c->tiers[j].name, type ? type : "plugin", c->tiers[i].name);
            kvs_tiers_close(c);
            return st;
        }
    }
    *out = c;
    return KVS_OK;
}

void kvs_tiers_close(kvs_tier_chain *c) {
    if (!c) return;
    /* Top down, so what a tier passes down as it closes (its last evictions; a reclaim that reaches
     * a peer_gpu tier's thread meanwhile) lands in a tier still open. */
    for (uint32_t i = 0; i < c->n; i++) {
        kvs_tier *t = &c->tiers[i];
        if (t->state) t->ops->destroy(t->state);
        if (t->dl) dlclose(t->dl);
        free(t->options);
        for (size_t k = 0; t->option_text && k < t->n_option_text; k++) free(t->option_text[k]);
        free(t->option_text);
    }
    free(c->tiers);
    free(c);
}

uint32_t kvs_tiers_count(const kvs_tier_chain *c) {
    return c->n;
}
const char *kvs_tiers_name(const kvs_tier_chain *c, uint32_t tier) {
    return c->tiers[tier].name;
}
int kvs_tiers_degraded(const kvs_tier_chain *c, uint32_t tier) {
    return tier < c->n && c->tiers[tier].degraded;
}

const char *kvs_tiers_degraded_reason(const kvs_tier_chain *c, uint32_t tier) {
    return tier < c->n && c->tiers[tier].degraded ? c->tiers[tier].degraded_reason : "";
}
int kvs_tiers_shared(const kvs_tier_chain *c, uint32_t tier) {
    if (tier >= c->n) return 0;
    const kvs_tier *t = &c->tiers[tier];
    /* objects on other machines are every process's (a plugin older than 1.8 may say only REMOTE) */
    if (t->ops->caps & (KVS_BACKEND_CAP_SHARED | KVS_BACKEND_CAP_REMOTE)) return 1;
    return KVS_HAS_OP(t->ops, instance_caps) &&
           (t->ops->instance_caps(t->state) & KVS_BACKEND_CAP_SHARED) != 0;
}
uint32_t kvs_tiers_bottom(const kvs_tier_chain *c) {
    uint32_t t = c->n ? c->n - 1 : 0;
    while (t > 0 && c->tiers[t].degraded) t--;
    return t;
}
const kvs_backend_ops *kvs_tiers_ops(const kvs_tier_chain *c, uint32_t tier) {
    return c->tiers[tier].ops;
}
void *kvs_tiers_state(const kvs_tier_chain *c, uint32_t tier) {
    return c->tiers[tier].state;
}

uint64_t kvs_tiers_pin_many(kvs_tier_chain *c, uint32_t tier, const kvs_key *keys, uint64_t n,
                            uint64_t timeout_ms) {
    const kvs_tier *t = &c->tiers[tier];
    uint64_t pinned = 0;
    if (n == 0 || t->ops->pin(t->state, keys, n, timeout_ms, &pinned) != KVS_OK) return 0;
    return pinned < n ? pinned : n;
}

void kvs_tiers_unpin_many(kvs_tier_chain *c, uint32_t tier, const kvs_key *keys, uint64_t n) {
    const kvs_tier *t = &c->tiers[tier];
    if (n) t->ops->unpin(t->state, keys, n);
}

int kvs_tiers_pin(kvs_tier_chain *c, uint32_t tier, const kvs_key *key, uint64_t timeout_ms) {
    return kvs_tiers_pin_many(c, tier, key, 1, timeout_ms) == 1;
}

void kvs_tiers_unpin(kvs_tier_chain *c, uint32_t tier, const kvs_key *key) {
    kvs_tiers_unpin_many(c, tier, key, 1);
}

int kvs_tiers_zero_copy(const kvs_tier_chain *c, uint32_t tier) {
    return (c->tiers[tier].ops->caps & KVS_BACKEND_CAP_ZERO_COPY) != 0;
}

int kvs_tiers_can_get_range(const kvs_tier_chain *c, uint32_t tier) {
    const kvs_backend_ops *ops = c->tiers[tier].ops;
    return (ops->caps & KVS_BACKEND_CAP_GET_RANGE) && KVS_HAS_OP(ops, get_range);
}

int kvs_tiers_can_put_range(const kvs_tier_chain *c, uint32_t tier) {
    const kvs_backend_ops *ops = c->tiers[tier].ops;
    return (ops->caps & KVS_BACKEND_CAP_PUT_RANGE) && KVS_HAS_OP(ops, put_range);
}

kvs_status kvs_tiers_put_range(kvs_tier_chain *c, uint32_t tier, const kvs_key *key,
                               uint64_t offset, const void *src, uint64_t len) {
    kvs_tier *t = &c->tiers[tier];
    return t->ops->put_range(t->state, key, offset, src, len);
}

int kvs_tiers_thread_safe(const kvs_tier_chain *c) {
    for (uint32_t i = 0; i < c->n; i++)
        if (!(c->tiers[i].ops->caps & KVS_BACKEND_CAP_THREAD_SAFE)) return 0;
    return 1;
}

int kvs_tiers_can_get_many(const kvs_tier_chain *c, uint32_t tier) {
    const kvs_backend_ops *ops = c->tiers[tier].ops;
    return (ops->caps & KVS_BACKEND_CAP_GET_MANY) && KVS_HAS_OP(ops, get_many);
}

int kvs_tiers_can_get_many_async(const kvs_tier_chain *c, uint32_t tier) {
    const kvs_backend_ops *ops = c->tiers[tier].ops;
    return (ops->caps & KVS_BACKEND_CAP_GET_MANY_ASYNC) && KVS_HAS_OP(ops, get_many_start) &&
           KVS_HAS_OP(ops, get_many_finish);
}

kvs_status kvs_tiers_get_ref(kvs_tier_chain *c, uint32_t tier, const kvs_key *key,
                             const void **object, uint64_t *len) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->get_ref(t->state, key, object, len);
}

kvs_status kvs_tiers_get(kvs_tier_chain *c, uint32_t tier, const kvs_key *key, void *dst,
                         uint64_t cap, uint64_t *len) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->get(t->state, key, dst, cap, len);
}

kvs_status kvs_tiers_get_range(kvs_tier_chain *c, uint32_t tier, const kvs_key *key,
                               uint64_t offset, uint64_t len, void *dst, uint64_t *got,
                               uint64_t *object_len) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->get_range(t->state, key, offset, len, dst, got, object_len);
}

kvs_status kvs_tiers_get_many(kvs_tier_chain *c, uint32_t tier, const kvs_key *keys,
                              void *const *dsts, const uint64_t *caps, uint64_t n, uint64_t *lens,
                              kvs_status *statuses) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->get_many(t->state, keys, dsts, caps, n, lens, statuses);
}

kvs_status kvs_tiers_get_many_start(kvs_tier_chain *c, uint32_t tier, const kvs_key *keys,
                                    void *const *dsts, const uint64_t *caps, uint64_t n,
                                    uint64_t *lens, kvs_status *statuses, uint64_t *ticket) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->get_many_start(t->state, keys, dsts, caps, n, lens, statuses, ticket);
}

kvs_status kvs_tiers_get_many_finish(kvs_tier_chain *c, uint32_t tier, uint64_t ticket) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->get_many_finish(t->state, ticket);
}

const char *kvs_tiers_last_error(const kvs_tier_chain *c, uint32_t tier) {
    const kvs_tier *t = &c->tiers[tier];
    return t->ops->last_error(t->state);
}

static int find_in(kvs_tier_chain *c, const kvs_key *key, int skip_remote) {
    for (uint32_t i = 0; i < c->n; i++) {
        uint64_t n = 0;
        if (skip_remote && kvs_tiers_is_remote(c, i)) continue;
        if (c->tiers[i].ops->contains(c->tiers[i].state, key, 1, &n) == KVS_OK && n == 1)
            return (int)i;
    }
    return -1;
}

int kvs_tiers_find(kvs_tier_chain *c, const kvs_key *key) {
    return find_in(c, key, 0);
}

int kvs_tiers_find_local(kvs_tier_chain *c, const kvs_key *key) {
    return find_in(c, key, 1);
}

int kvs_tiers_is_remote(const kvs_tier_chain *c, uint32_t tier) {
    return tier < c->n && c->tiers[tier].remote;
}

kvs_status kvs_tiers_contains(kvs_tier_chain *c, uint32_t tier, const kvs_key *keys, uint64_t n,
                              uint64_t *n_present) {
    *n_present = 0;
    return c->tiers[tier].ops->contains(c->tiers[tier].state, keys, n, n_present);
}

kvs_status kvs_tiers_put(kvs_tier_chain *c, const kvs_key *key, const void *object, uint64_t len,
                         char *err, uint64_t err_len) {
    return kvs_tiers_put_from(c, 0, key, object, len, err, err_len);
}

kvs_status kvs_tiers_put_from(kvs_tier_chain *c, uint32_t from, const kvs_key *key,
                              const void *object, uint64_t len, char *err, uint64_t err_len) {
    kvs_status first = KVS_OK;
    uint32_t top =
        from; /* the tier whose answer is the save's: the first, or where it spilled to */
    for (uint32_t i = from; i < c->n; i++) {
        kvs_tier *t = &c->tiers[i];
        kvs_status st = t->ops->put(t->state, key, object, len);
        if (st == KVS_OK) {
            if (c->on_event) c->on_event(c->event_ctx, KVS_EVENT_STORED, key, i);
        } else if (i == top && spills(t, st) && i + 1 < c->n) {
            top = i + 1; /* no room there: the next tier takes it instead */
            continue;
        } else if (i == top) {
            first = st;
            kvs_fmt(err, err_len, "tier \"%s\": %s", t->name, t->ops->last_error(t->state));
        }
        if (t->write != KVS_WRITE_THROUGH) break;
    }
    return first;
}

void kvs_tiers_remove(kvs_tier_chain *c, const kvs_key *key) {
    for (uint32_t i = 0; i < c->n; i++) {
        uint64_t n = 0;
        if (c->tiers[i].ops->contains(c->tiers[i].state, key, 1, &n) == KVS_OK && n == 1) {
            c->tiers[i].ops->remove(c->tiers[i].state, key);
            if (c->on_event) c->on_event(c->event_ctx, KVS_EVENT_REMOVED, key, i);
        }
    }
}

int kvs_tiers_published(const kvs_tier_chain *c, uint32_t tier) {
    const kvs_tier *t = &c->tiers[tier];
    return !t->degraded && KVS_HAS_OP(t->ops, instance_caps) &&
           (t->ops->instance_caps(t->state) & KVS_BACKEND_CAP_PUBLISHED) != 0;
}

void kvs_tiers_forget_missing(kvs_tier_chain *c, const kvs_key *key) {
    for (uint32_t i = 0; i < c->n; i++) {
        const kvs_tier *t = &c->tiers[i];
        if (kvs_tiers_published(c, i)) t->ops->remove(t->state, key);
    }
}

static int knows_codecs(const kvs_tier *t) {
    return (t->ops->caps & KVS_BACKEND_CAP_CODECS) && KVS_HAS_OP(t->ops, codecs);
}

/* The codec in the header of key's object in memory tier t (the caller holds a pin), 0 when it cannot
 * be read. Only the header is read where the tier reads ranges, so a paced tier charges that much. */
static uint16_t header_codec(kvs_tier_chain *c, uint32_t t, const kvs_key *key) {
    const kvs_backend_ops *ops = c->tiers[t].ops;
    void *state = c->tiers[t].state;
    kvs_object_header hd;
    uint64_t got = 0, len = 0;
    if (kvs_tiers_can_get_range(c, t))
        return ops->get_range(state, key, 0, sizeof hd, &hd, &got, &len) == KVS_OK &&
                       got == sizeof hd
                   ? hd.codec
                   : 0;
    const void *obj = NULL;
    if (ops->get_ref(state, key, &obj, &len) != KVS_OK || len < sizeof hd) return 0;
    memcpy(&hd, obj, sizeof hd);
    return hd.codec;
}

void kvs_tiers_codecs(kvs_tier_chain *c, const kvs_key *keys, const uint32_t *tiers, uint64_t n,
                      uint16_t *codecs) {
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t = tiers[i];
        codecs[i] = 0;
        if (t < c->n && !knows_codecs(&c->tiers[t]) && kvs_tiers_zero_copy(c, t)) {
            codecs[i] = header_codec(c, t, &keys[i]);
            continue;
        }
        while (t < c->n && t > 0 && !knows_codecs(&c->tiers[t])) t--; /* a record from above */
        if (t < c->n && knows_codecs(&c->tiers[t]) &&
            c->tiers[t].ops->codecs(c->tiers[t].state, &keys[i], 1, &codecs[i]) != KVS_OK)
            codecs[i] = 0;
    }
}

int kvs_tiers_know_codecs(const kvs_tier_chain *c) {
    for (uint32_t t = 0; t < c->n; t++)
        if (knows_codecs(&c->tiers[t])) return 1;
    return 0;
}

uint64_t kvs_tiers_evictions(const kvs_tier_chain *c) {
    return atomic_load(&c->evictions);
}
uint64_t kvs_tiers_dropped_saves(const kvs_tier_chain *c) {
    return atomic_load(&c->dropped_saves);
}

int kvs_tiers_can_reserve(const kvs_tier_chain *c) {
    return c->n > 0 && (c->tiers[0].ops->caps & KVS_BACKEND_CAP_RESERVE) != 0;
}

kvs_status kvs_tiers_reserve(kvs_tier_chain *c, const kvs_key *key, uint64_t len, void **dst,
                             uint64_t *ticket, char *err, uint64_t err_len) {
    if (!kvs_tiers_can_reserve(c)) {
        kvs_fmt(err, err_len, "tier \"%s\" cannot be written in place",
                c->n ? c->tiers[0].name : "");
        return KVS_ENOTSUP;
    }
    kvs_tier *t = &c->tiers[0];
    kvs_status st = t->ops->reserve(t->state, key, len, dst, ticket);
    if (st != KVS_OK)
        kvs_fmt(err, err_len, "tier \"%s\": %s", t->name, t->ops->last_error(t->state));
    return st;
}

kvs_status kvs_tiers_commit(kvs_tier_chain *c, const kvs_key *key, uint64_t ticket,
                            const void *object, uint64_t len, char *err, uint64_t err_len) {
    kvs_tier *top = &c->tiers[0];
    /* Write-through copies first: until commit the reserved bytes cannot be evicted under us. */
    for (uint32_t i = 1; i < c->n && c->tiers[i - 1].write == KVS_WRITE_THROUGH; i++) {
        kvs_tier *t = &c->tiers[i];
        if (t->ops->put(t->state, key, object, len) == KVS_OK) {
            if (c->on_event) c->on_event(c->event_ctx, KVS_EVENT_STORED, key, i);
        }
    }
    kvs_status st = top->ops->commit(top->state, ticket);
    if (st != KVS_OK) {
        kvs_fmt(err, err_len, "tier \"%s\": %s", top->name, top->ops->last_error(top->state));
        return st;
    }
    if (c->on_event) c->on_event(c->event_ctx, KVS_EVENT_STORED, key, 0);
    return KVS_OK;
}

void kvs_tiers_abort(kvs_tier_chain *c, uint64_t ticket) {
    kvs_tier *top = &c->tiers[0];
    top->ops->abort(top->state, ticket);
}

kvs_status kvs_tiers_memory(const kvs_tier_chain *c, uint32_t tier, void **base, uint64_t *len) {
    const kvs_tier *t = &c->tiers[tier];
    if (!(t->ops->caps & KVS_BACKEND_CAP_MEMORY)) return KVS_ENOTSUP;
    return t->ops->memory(t->state, base, len);
}
