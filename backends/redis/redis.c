/*
 * redis.c - the redis tier: its state, masters and slot map, and the backend ops (contract in
 * redis.h). Each op is one call: requests built here, run by redis_batch.c under the tier's lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>

#include "common/clock.h"
#include "common/key_file.h"
#include "common/options.h"
#include "redis_internal.h"

#define REFRESH_EVERY_NS  (100ull * 1000000) /* slot map asked again at most this often */
#define USAGE_EVERY_NS    (1000ull * 1000000)
#define DEFERRED_PUTS_MAX 32 /* puts written whose answers a connection has not read yet */

static void key_text(const kvs_redis *r, const kvs_key *key, char *out, size_t *len) {
    static const char hex[] = "0123456789abcdef";
    memcpy(out, r->prefix, r->prefix_len);
    char *p = out + r->prefix_len;
    for (int i = 0; i < 16; i++) {
        *p++ = hex[key->bytes[i] >> 4];
        *p++ = hex[key->bytes[i] & 15];
    }
    *p = '\0';
    *len = (size_t)(p - out);
}

/* The master for a key now: the one node, or the slot's owner in the map. */
static uint32_t route(kvs_redis *r, const char *key, size_t len, uint16_t *slot) {
    *slot = kvs_redis_key_slot(key, len);
    if (!r->opt.cluster) return 0;
    uint32_t node = r->slot_owner[*slot];
    if (node == REDIS_NO_NODE) r->refresh_due = 1;
    return node;
}

/* Ask CLUSTER SLOTS of a node that answers (masters first, then every node known), when the map
 * is due and not asked in the last 100 ms; within the call begun (its deadline bounds it all). */
static void maybe_refresh(kvs_redis *r, int force) {
    if (!r->opt.cluster) return;
    uint64_t now = kvs_now_ns();
    if (!force && (!r->refresh_due || now < r->refresh_after_ns)) return;
    r->refresh_after_ns = now + REFRESH_EVERY_NS;
    static const char *const argv[] = {"CLUSTER", "SLOTS"};
    static const size_t lens[] = {7, 5};
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < r->n_nodes; i++) {
            if (r->nodes[i].is_master != (pass == 0)) continue;
            if (kvs_now_ns() >= r->deadline_ns) return;
            redis_req req;
            redis_req_init(&req, OP_SLOTS, 2, argv, lens, NULL, 0);
            req.weight = REDIS_RBUF_BYTES;
            req.counted = 1;
            r->outstanding = 1;
            redis_queue(r, i, &req);
            redis_run(r);
            if (req.status == KVS_OK) {
                r->refresh_due = 0;
                return;
            }
        }
    }
}

/* Build and run one request per key: op with the key as its only argument (GET fills dsts, SET
 * sends value). */
static kvs_status run_keys(kvs_redis *r, uint8_t op, const kvs_key *keys, uint64_t n,
                           redis_req *reqs, void *const *dsts, const uint64_t *caps,
                           const void *value, uint64_t value_len) {
    static const char *const names[] = {
        [OP_GET] = "GET", [OP_SET] = "SET", [OP_EXISTS] = "EXISTS", [OP_DEL] = "DEL"};
    uint32_t *node = malloc((n ? n : 1) * sizeof *node);
    if (!node) return KVS_ENOMEM;
    redis_call_begin(r);
    maybe_refresh(r, 0);
    for (uint64_t i = 0; i < n; i++) {
        char key[REDIS_KEY_BYTES];
        size_t key_len = 0;
        key_text(r, &keys[i], key, &key_len);
        const char *argv[2] = {names[op], key};
        size_t lens[2] = {strlen(names[op]), key_len};
        if (redis_req_init(&reqs[i], op, 2, argv, lens, value, value_len) != KVS_OK) {
            free(node);
            return KVS_EINVAL;
        }
        if (op == OP_GET) {
            reqs[i].dst = dsts[i];
            reqs[i].cap = caps[i];
            uint64_t most = caps[i] < r->max_object_bytes ? caps[i] : r->max_object_bytes;
            reqs[i].weight = most + 64;
        }
        reqs[i].counted = 1;
        node[i] = route(r, key, key_len, &reqs[i].slot);
    }
    /* a read goes only once every put before it is answered (Redis orders commands per connection
     * only); puts wait only for a connection that owes many answers */
    r->outstanding = 0;
    if (op == OP_SET)
        redis_wait_deferred(r, DEFERRED_PUTS_MAX, DEFERRED_PUTS_MAX / 2);
    else
        redis_wait_deferred(r, 1, 0);
    if (r->outstanding > 0) redis_run(r);
    r->outstanding = n;
    for (uint64_t i = 0; i < n; i++) redis_queue(r, node[i], &reqs[i]);
    redis_run(r);
    free(node);
    return KVS_OK;
}

static kvs_status redis_contains(void *state, const kvs_key *keys, uint64_t n,
                                 uint64_t *n_present) {
    kvs_redis *r = state;
    *n_present = 0;
    if (n == 0) return KVS_OK;
    redis_req *reqs = malloc(n * sizeof *reqs);
    if (!reqs) return KVS_ENOMEM;
    pthread_mutex_lock(&r->mutex);
    kvs_status st = run_keys(r, OP_EXISTS, keys, n, reqs, NULL, NULL, NULL, 0);
    pthread_mutex_unlock(&r->mutex);
    while (st == KVS_OK && *n_present < n && reqs[*n_present].status == KVS_OK &&
           reqs[*n_present].integer == 1)
        (*n_present)++;
    free(reqs);
    return st;
}

static kvs_status redis_get_many(void *state, const kvs_key *keys, void *const *dsts,
                                 const uint64_t *caps, uint64_t n, uint64_t *lens,
                                 kvs_status *statuses) {
    kvs_redis *r = state;
    if (n == 0) return KVS_OK;
    redis_req *reqs = malloc(n * sizeof *reqs);
    if (!reqs) return KVS_ENOMEM;
    pthread_mutex_lock(&r->mutex);
    r->stats.gets += n;
    kvs_status st = run_keys(r, OP_GET, keys, n, reqs, dsts, caps, NULL, 0);
    pthread_mutex_unlock(&r->mutex);
    for (uint64_t i = 0; i < n; i++) {
        kvs_status s = st != KVS_OK ? st : reqs[i].status;
        /* every failure of the store is a miss: the engine computes the chunk instead */
        statuses[i] = s == KVS_OK || s == KVS_EOVERFLOW ? s : KVS_ENOTFOUND;
        lens[i] = s == KVS_OK || s == KVS_EOVERFLOW ? reqs[i].len : 0;
    }
    free(reqs);
    return KVS_OK;
}

static kvs_status redis_get(void *state, const kvs_key *key, void *dst, uint64_t cap,
                            uint64_t *len) {
    void *dsts[1] = {dst};
    kvs_status st = KVS_EIO;
    *len = 0;
    kvs_status call = redis_get_many(state, key, dsts, &cap, 1, len, &st);
    return call != KVS_OK ? call : st;
}

static kvs_status redis_get_ref(void *state, const kvs_key *key, const void **object,
                                uint64_t *len) {
    (void)state, (void)key, (void)object, (void)len;
    return KVS_ENOTSUP;
}

static kvs_status redis_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    kvs_redis *r = state;
    redis_req req;
    if (len > REDIS_MAX_VALUE) return KVS_ENOMEM; /* Redis refuses a bulk string this long */
    pthread_mutex_lock(&r->mutex);
    r->stats.puts++;
    kvs_status st = run_keys(r, OP_SET, key, 1, &req, NULL, NULL, object, len);
    if (st == KVS_OK) st = req.status == KVS_OK || req.status == KVS_ENOMEM ? req.status : KVS_EIO;
    if (st == KVS_ENOMEM)
        redis_error(r, KVS_LOG_DEBUG,
                    "the server refused the write (out of memory: maxmemory "
                    "with a noeviction policy, or its clients' buffers)");
    pthread_mutex_unlock(&r->mutex);
    return st;
}

static kvs_status redis_remove(void *state, const kvs_key *key) {
    kvs_redis *r = state;
    redis_req req;
    pthread_mutex_lock(&r->mutex);
    kvs_status st = run_keys(r, OP_DEL, key, 1, &req, NULL, NULL, NULL, 0);
    pthread_mutex_unlock(&r->mutex);
    return st == KVS_OK && req.status != KVS_OK ? KVS_EIO : st;
}

static kvs_status redis_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                            uint64_t *n_pinned) {
    (void)timeout_ms; /* Redis has no leases: a pin only reports what is present now */
    return redis_contains(state, keys, n, n_pinned);
}

static kvs_status redis_unpin(void *state, const kvs_key *keys, uint64_t n) {
    (void)state, (void)keys, (void)n;
    return KVS_OK;
}

/* Objects and bytes of every master (DBSIZE, INFO memory's used_memory), asked at most once a
 * second: the whole database's, not only this tenant's keys. */
static kvs_status redis_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    kvs_redis *r = state;
    pthread_mutex_lock(&r->mutex);
    uint64_t now = kvs_now_ns();
    if (r->usage_at_ns == 0 || now - r->usage_at_ns >= USAGE_EVERY_NS) {
        static const char *const dbsize[] = {"DBSIZE"}, *const info[] = {"INFO", "memory"};
        static const size_t dbsize_len[] = {6}, info_len[] = {4, 6};
        redis_call_begin(r);
        maybe_refresh(r, 0);
        uint32_t n_nodes = r->n_nodes; /* a redirection may add nodes while these are queued */
        redis_req *reqs = calloc(2 * (size_t)n_nodes, sizeof *reqs);
        uint32_t n = 0;
        if (reqs) {
            for (uint32_t i = 0; i < n_nodes; i++) {
                if (r->opt.cluster && !r->nodes[i].is_master) continue;
                redis_req_init(&reqs[n], OP_DBSIZE, 1, dbsize, dbsize_len, NULL, 0);
                redis_req_init(&reqs[n + 1], OP_INFO, 2, info, info_len, NULL, 0);
                reqs[n + 1].weight = 16384;
                reqs[n].counted = reqs[n + 1].counted = 1;
                r->outstanding += 2;
                redis_queue(r, i, &reqs[n]);
                redis_queue(r, i, &reqs[n + 1]);
                n += 2;
            }
            redis_run(r);
            r->usage_objects = r->usage_bytes = 0;
            for (uint32_t i = 0; i < n; i += 2) {
                if (reqs[i].status == KVS_OK) r->usage_objects += (uint64_t)reqs[i].integer;
                if (reqs[i + 1].status == KVS_OK) r->usage_bytes += reqs[i + 1].info_used_memory;
            }
            r->usage_at_ns = now;
        }
        free(reqs);
    }
    *n_objects = r->usage_objects;
    *bytes = r->usage_bytes;
    pthread_mutex_unlock(&r->mutex);
    return KVS_OK;
}

kvs_status kvs_redis_stats(void *state, kvs_redis_stats_t *out) {
    kvs_redis *r = state;
    pthread_mutex_lock(&r->mutex);
    *out = r->stats;
    uint64_t now = kvs_now_ns();
    out->n_masters = 0;
    out->masters_down = 0;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        if (r->opt.cluster && !r->nodes[i].is_master) continue;
        out->n_masters++;
        if (r->nodes[i].down_until_ns && now < r->nodes[i].down_until_ns) out->masters_down++;
    }
    pthread_mutex_unlock(&r->mutex);
    return KVS_OK;
}

static const char *redis_last_error(void *state) {
    static __thread char copy[sizeof((kvs_redis *)0)->last_error];
    kvs_redis *r = state;
    pthread_mutex_lock(&r->mutex); /* another call may be writing it */
    memcpy(copy, r->last_error, sizeof copy);
    pthread_mutex_unlock(&r->mutex);
    return copy;
}

static void redis_destroy(void *state) {
    kvs_redis *r = state;
    if (!r) return;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        redis_node *n = &r->nodes[i];
        for (uint32_t c = 0; n->conns && c < r->opt.connections_per_node; c++) {
            kvs_redis_conn_close(&n->conns[c].io);
            free(n->conns[c].rbuf);
            free(n->conns[c].q);
        }
        free(n->conns);
    }
    if (r->tls) SSL_CTX_free(r->tls);
    OPENSSL_cleanse(r->password, sizeof r->password);
    free(r->slot_owner);
    free(r->reply_nodes);
    free(r->active);
    free(r->extra);
    pthread_mutex_destroy(&r->mutex);
    free(r);
}

/* The client's private key, read once from a file checked like every secret (a regular file, not a
 * link, mode 0600 or 0400), and given to OpenSSL from memory: the file is not opened twice. */
static int load_private_key(SSL_CTX *ctx, const char *path, char *why, size_t why_len) {
    enum { KEY_CAP = 64 << 10 };
    uint8_t *buf = malloc(KEY_CAP);
    size_t len = 0;
    if (!buf) return -1;
    if (kvs_key_file_load("redis tls.key_file", path, buf, KEY_CAP, 1, &len, why, why_len) !=
        KVS_OK) {
        free(buf);
        return -1;
    }
    BIO *bio = BIO_new_mem_buf(buf, (int)len);
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    int ok = key && SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    EVP_PKEY_free(key);
    BIO_free(bio);
    OPENSSL_cleanse(buf, len);
    free(buf);
    if (!ok) snprintf(why, why_len, "tls.key_file %s is not the key of tls.cert_file", path);
    return ok ? 0 : -1;
}

static int tls_setup(kvs_redis *r, const kvs_redis_options *o, char *why, size_t why_len,
                     const char **refused) {
    if (!o->tls_ca_file) return 0;
    ERR_clear_error();
    r->tls = SSL_CTX_new(TLS_client_method());
    if (!r->tls || SSL_CTX_set_min_proto_version(r->tls, TLS1_2_VERSION) != 1) {
        snprintf(why, why_len, "cannot set up TLS");
        return -1;
    }
    SSL_CTX_set_mode(r->tls, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_verify(r->tls, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(r->tls, o->tls_ca_file, NULL) != 1) {
        *refused = "tls.ca_file";
        snprintf(why, why_len, "tls.ca_file %s is not a readable PEM certificate", o->tls_ca_file);
        return -1;
    }
    if (o->tls_cert_file) {
        if (SSL_CTX_use_certificate_chain_file(r->tls, o->tls_cert_file) != 1) {
            *refused = "tls.cert_file";
            snprintf(why, why_len, "tls.cert_file %s is not a readable PEM certificate",
                     o->tls_cert_file);
            return -1;
        }
        if (load_private_key(r->tls, o->tls_key_file, why, why_len) != 0) {
            *refused = "tls.key_file";
            return -1;
        }
    }
    ERR_clear_error();
    return 0;
}

/* At open: reach the servers once, so that a wrong password, an ACL user that may not touch this
 * tenant's keys, or the wrong mode is refused now with a sentence. Servers that do not answer are
 * not a refusal: the tier starts with them down and tries again. */
static kvs_status first_contact(kvs_redis *r, char *why, size_t why_len) {
    if (r->opt.cluster) {
        redis_call_begin(r);
        maybe_refresh(r, 1);
        if (r->not_cluster) {
            snprintf(why, why_len,
                     "mode is cluster but %s has cluster support disabled (use mode: standalone)",
                     r->nodes[0].ep.name);
            return KVS_ECONFIG;
        }
    }
    kvs_key probe;
    memset(&probe, 0, sizeof probe);
    redis_req req;
    kvs_status st = run_keys(r, OP_EXISTS, &probe, 1, &req, NULL, NULL, NULL, 0);
    if (st != KVS_OK) return st;
    if (r->refusal[0]) {
        snprintf(why, why_len,
                 "%s (the user needs the commands docs/redis.md lists and the keys ~%s*)",
                 r->refusal, r->prefix);
        return KVS_ECONFIG;
    }
    if (!r->opt.cluster && r->stats.moved > 0) {
        snprintf(why, why_len, "%s is a Redis Cluster node: use mode: cluster",
                 r->nodes[0].ep.name);
        return KVS_ECONFIG;
    }
    if (req.status != KVS_OK) {
        char reason[sizeof r->last_error];
        snprintf(reason, sizeof reason, "%s", r->last_error);
        redis_error(r, KVS_LOG_WARN, "no server answered at open; starting with them down (%s)",
                    reason);
    }
    return KVS_OK;
}

static kvs_status redis_create(const kvs_backend_init *init, void **state) {
    char why[600] = "", refused[80] = "";
    const char *refused_tls = NULL;
    *state = NULL;
    kvs_redis *r = calloc(1, sizeof *r);
    if (!r) return KVS_ENOMEM;
    snprintf(r->tier_name, sizeof r->tier_name, "%s", init->tier_name);
    pthread_mutex_init(&r->mutex, NULL);
    r->host = init->host;
    r->max_object_bytes = init->max_object_bytes ? init->max_object_bytes : (1ull << 32);
    kvs_status st = kvs_redis_options_parse(init->options, init->n_options, &r->opt, why,
                                            sizeof why, refused, sizeof refused);
    if (st == KVS_OK && r->opt.password_file) {
        uint8_t buf[sizeof r->password];
        size_t len = 0;
        st = kvs_key_file_load("redis password_file", r->opt.password_file, buf, sizeof buf, 1,
                               &len, why, sizeof why);
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
        if (st == KVS_OK && len == 0) {
            snprintf(why, sizeof why, "password_file %s holds an empty password",
                     r->opt.password_file);
            st = KVS_EINVAL;
        }
        memcpy(r->password, buf, len);
        r->password_len = len;
        OPENSSL_cleanse(buf, sizeof buf);
        if (st != KVS_OK) {
            st = KVS_ECONFIG;
            snprintf(refused, sizeof refused, "password_file");
        }
    }
    if (st == KVS_OK && r->opt.user) snprintf(r->user, sizeof r->user, "%s", r->opt.user);
    if (st == KVS_OK && tls_setup(r, &r->opt, why, sizeof why, &refused_tls) != 0) {
        st = KVS_ECONFIG;
        if (refused_tls) snprintf(refused, sizeof refused, "%s", refused_tls);
    }
    for (uint32_t i = 0; st == KVS_OK && r->tls && !r->opt.tls_server_name && i < r->opt.n_nodes;
         i++) {
        if (!strchr(r->opt.nodes[i], '/')) continue;
        snprintf(why, sizeof why,
                 "TLS to the unix socket %s needs tls.server_name (the name its certificate "
                 "carries)",
                 r->opt.nodes[i]);
        snprintf(refused, sizeof refused, "tls.server_name");
        st = KVS_ECONFIG;
    }
    if (st == KVS_OK && r->opt.tls_server_name)
        snprintf(r->tls_server_name, sizeof r->tls_server_name, "%s", r->opt.tls_server_name);
    if (st == KVS_OK) {
        r->prefix_len = (size_t)snprintf(r->prefix, sizeof r->prefix, "kvs1:%s:", r->opt.tenant);
        r->reply_nodes = malloc(REDIS_MAX_REPLY * sizeof *r->reply_nodes);
        if (r->opt.cluster) r->slot_owner = malloc(KVS_REDIS_SLOTS * sizeof *r->slot_owner);
        if (!r->reply_nodes || (r->opt.cluster && !r->slot_owner)) st = KVS_ENOMEM;
        for (uint32_t i = 0; r->slot_owner && i < KVS_REDIS_SLOTS; i++)
            r->slot_owner[i] = REDIS_NO_NODE;
    }
    for (uint32_t i = 0; st == KVS_OK && i < r->opt.n_nodes; i++) {
        char ep_why[200];
        kvs_redis_endpoint ep;
        if (kvs_redis_endpoint_parse(r->opt.nodes[i], &ep, ep_why, sizeof ep_why) != 0) {
            snprintf(why, sizeof why, "%s", ep_why);
            snprintf(refused, sizeof refused, "node[%u]", i);
            st = KVS_ECONFIG;
        } else if (redis_node_find_or_add(r, ep.name, 1) == REDIS_NO_NODE) {
            st = KVS_ENOMEM;
        }
        if (st == KVS_OK && !r->opt.cluster) r->nodes[0].is_master = 1;
    }
    /* the borrowed option strings are not kept past create */
    memset(r->opt.nodes, 0, sizeof r->opt.nodes);
    r->opt.tenant = r->opt.user = r->opt.password_file = NULL;
    r->opt.tls_ca_file = r->opt.tls_cert_file = r->opt.tls_key_file = NULL;
    r->opt.tls_server_name = NULL;
    if (st == KVS_OK) st = first_contact(r, why, sizeof why);
    if (st != KVS_OK) {
        char full[700];
        snprintf(full, sizeof full, "redis tier \"%s\": %s", init->tier_name,
                 why[0] ? why : "out of memory");
        kvs_create_error(init, full);
        if (refused[0]) {
            char *br = strchr(refused, '[');
            if (br) {
                *br = '\0';
                kvs_option_refused(init, refused, strtol(br + 1, NULL, 10));
            } else {
                kvs_option_refused(init, refused, -1);
            }
        }
        redis_destroy(r);
        return st;
    }
    *state = r;
    return KVS_OK;
}

static const kvs_backend_ops REDIS_OPS = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_MANY | KVS_BACKEND_CAP_REMOTE |
            KVS_BACKEND_CAP_SHARED,
    .type_name = "redis",
    .create = redis_create,
    .destroy = redis_destroy,
    .last_error = redis_last_error,
    .contains = redis_contains,
    .pin = redis_pin,
    .unpin = redis_unpin,
    .get = redis_get,
    .get_ref = redis_get_ref,
    .put = redis_put,
    .remove = redis_remove,
    .usage = redis_usage,
    .get_many = redis_get_many,
};

const kvs_backend_ops *kvs_redis_backend(void) {
    return &REDIS_OPS;
}
