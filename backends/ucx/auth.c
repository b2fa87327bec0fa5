/* auth.c - HMAC-SHA256 challenge/response and SHA-256 tenant keys, all from libcrypto. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/key_file.h"

#define TENANT_LABEL     "kvstrata-tenant-v1"     /* tenant namespacing of stored keys */
#define TENANT_KEY_LABEL "kvstrata-tenant-key-v1" /* a tenant's key from the master key */
#define TLS_PSK_LABEL    "kvstrata-tls-psk-v1"    /* a tenant's TLS key from its key */

enum { NODE_FRESH, NODE_CHALLENGED, NODE_ACCEPTED, NODE_REFUSED };

static void auth_error(char *error, size_t error_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void auth_error(char *error, size_t error_len, const char *fmt, ...) {
    if (!error || error_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, error_len, fmt, ap);
    va_end(ap);
}

kvs_status kvs_remote_psk_set(kvs_remote_psk *out, const void *bytes, size_t len, char *error,
                              size_t error_len) {
    if (!out || (!bytes && len)) return KVS_EINVAL;
    if (len < KVS_REMOTE_PSK_MIN_BYTES || len > KVS_REMOTE_PSK_MAX_BYTES) {
        auth_error(error, error_len,
                   "remote auth: a pre-shared key must be %u..%u bytes, this one is %zu",
                   KVS_REMOTE_PSK_MIN_BYTES, KVS_REMOTE_PSK_MAX_BYTES, len);
        return KVS_EINVAL;
    }
    memcpy(out->bytes, bytes, len);
    out->len = len;
    return KVS_OK;
}

kvs_status kvs_remote_psk_load(const char *path, kvs_remote_psk *out, char *error,
                               size_t error_len) {
    if (!path || !out) return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    return kvs_key_file_load("remote auth", path, out->bytes, sizeof out->bytes,
                             KVS_REMOTE_PSK_MIN_BYTES, &out->len, error, error_len);
}

void kvs_remote_psk_clear(kvs_remote_psk *psk) {
    if (!psk) return;
    OPENSSL_cleanse(psk->bytes, sizeof psk->bytes);
    psk->len = 0;
}

kvs_status kvs_remote_random(uint8_t *out, size_t n) {
    if (!out || n > INT32_MAX) return KVS_EINVAL;
    return RAND_bytes(out, (int)n) == 1 ? KVS_OK : KVS_EIO;
}

/* ---- the transcript's proofs ------------------------------------------------------------- */

static const char *const PROOF_LABELS[] = {"kvstrata-node-v3", "kvstrata-auth-v3",
                                           "kvstrata-ok-v3"};

typedef struct mac {
    EVP_MAC *alg;
    EVP_MAC_CTX *ctx;
    int ok;
} mac;

static void mac_part(mac *m, const void *bytes, size_t len) {
    uint8_t l[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    m->ok = m->ok && len <= UINT32_MAX && EVP_MAC_update(m->ctx, l, sizeof l) == 1 &&
            (len == 0 || EVP_MAC_update(m->ctx, bytes, len) == 1);
}

static void mac_u64(mac *m, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (56 - 8 * i));
    mac_part(m, b, sizeof b);
}

/* HMAC-SHA256(key, label [|| version] || parts...): each part length-prefixed, so no two
 * transcripts concatenate to the same bytes. A tenant's key is not versioned: it outlives protocol
 * versions. */
static kvs_status mac_begin(mac *m, const kvs_remote_psk *key, const char *label, int versioned) {
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                           OSSL_PARAM_construct_end()};
    /* fetched per handshake message, not kept: a library that is dlclosed leaves nothing behind */
    m->alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
    m->ctx = m->alg ? EVP_MAC_CTX_new(m->alg) : NULL;
    m->ok = m->ctx && EVP_MAC_init(m->ctx, key->bytes, key->len, params) == 1;
    mac_part(m, label, strlen(label));
    if (versioned) mac_u64(m, KVS_WIRE_VERSION);
    return m->ok ? KVS_OK : KVS_EIO;
}

static void mac_free(mac *m) {
    EVP_MAC_CTX_free(m->ctx);
    EVP_MAC_free(m->alg);
    m->ctx = NULL;
    m->alg = NULL;
}

static kvs_status mac_end(mac *m, uint8_t out[KVS_WIRE_PROOF_BYTES]) {
    uint8_t md[EVP_MAX_MD_SIZE];
    size_t len = 0;
    m->ok = m->ok && EVP_MAC_final(m->ctx, md, &len, sizeof md) == 1 && len == KVS_WIRE_PROOF_BYTES;
    if (m->ok) memcpy(out, md, KVS_WIRE_PROOF_BYTES);
    OPENSSL_cleanse(md, sizeof md);
    mac_free(m);
    return m->ok ? KVS_OK : KVS_EIO;
}

kvs_status kvs_remote_proof(const kvs_remote_psk *key, kvs_remote_proof_kind kind,
                            const kvs_remote_transcript *t, uint8_t proof[KVS_WIRE_PROOF_BYTES]) {
    if (!key || key->len < KVS_REMOTE_PSK_MIN_BYTES || !t || !proof || kind < 0 ||
        kind > KVS_REMOTE_PROOF_OK || !t->tenant || t->tenant_len == 0 ||
        t->tenant_len > KVS_WIRE_MAX_TENANT_BYTES || !t->nonce || !t->challenge)
        return KVS_EINVAL;
    if (kind >= KVS_REMOTE_PROOF_CLIENT &&
        (!t->node_proof || (t->client_worker_addr_len && !t->client_worker_addr) ||
         (t->host_id_len && !t->host_id)))
        return KVS_EINVAL;
    if (kind == KVS_REMOTE_PROOF_OK && (!t->client_proof || (t->transports_len && !t->transports) ||
                                        (t->node_worker_addr_len && !t->node_worker_addr) ||
                                        (t->shared_tier_len && !t->shared_tier)))
        return KVS_EINVAL;
    mac m;
    if (mac_begin(&m, key, PROOF_LABELS[kind], 1) != KVS_OK) {
        mac_free(&m);
        return KVS_EIO;
    }
    mac_part(&m, t->tenant, t->tenant_len);
    mac_part(&m, t->nonce, KVS_WIRE_NONCE_BYTES);
    mac_part(&m, t->challenge, KVS_WIRE_CHALLENGE_BYTES);
    if (kind >= KVS_REMOTE_PROOF_CLIENT) {
        mac_part(&m, t->node_proof, KVS_WIRE_PROOF_BYTES);
        mac_part(&m, t->client_worker_addr, t->client_worker_addr_len);
        mac_part(&m, t->host_id, t->host_id_len);
        mac_u64(&m, t->pid);
    }
    if (kind == KVS_REMOTE_PROOF_OK) {
        mac_part(&m, t->client_proof, KVS_WIRE_PROOF_BYTES);
        mac_part(&m, t->transports, t->transports_len);
        mac_part(&m, t->node_worker_addr, t->node_worker_addr_len);
        mac_part(&m, t->session_token, t->session_token ? KVS_WIRE_SESSION_TOKEN_BYTES : 0);
        mac_part(&m, t->shared_tier, t->shared_tier_len);
        mac_u64(&m, t->shared_tier_capacity);
        mac_u64(&m, t->shared_tier_max_object);
    }
    return mac_end(&m, proof);
}

kvs_status kvs_remote_proof_check(const kvs_remote_psk *key, kvs_remote_proof_kind kind,
                                  const kvs_remote_transcript *t, const uint8_t *proof,
                                  size_t proof_len) {
    uint8_t want[KVS_WIRE_PROOF_BYTES];
    if (!proof || proof_len != KVS_WIRE_PROOF_BYTES) return KVS_EINVAL;
    kvs_status st = kvs_remote_proof(key, kind, t, want);
    if (st != KVS_OK) return st;
    int same = CRYPTO_memcmp(want, proof, KVS_WIRE_PROOF_BYTES) == 0;
    OPENSSL_cleanse(want, sizeof want);
    return same ? KVS_OK : KVS_EINVAL;
}

kvs_status kvs_remote_tenant_psk(const kvs_remote_psk *master, const char *tenant,
                                 size_t tenant_len, kvs_remote_psk *out) {
    if (!master || master->len < KVS_REMOTE_PSK_MIN_BYTES || !tenant || !out ||
        !kvs_wire_tenant_ok(tenant, (uint32_t)tenant_len))
        return KVS_EINVAL;
    mac m;
    memset(out, 0, sizeof *out);
    if (mac_begin(&m, master, TENANT_KEY_LABEL, 0) != KVS_OK) {
        mac_free(&m);
        return KVS_EIO;
    }
    mac_part(&m, tenant, tenant_len);
    if (mac_end(&m, out->bytes) != KVS_OK) return KVS_EIO;
    out->len = KVS_WIRE_PROOF_BYTES; /* 32 bytes: a key of the smallest size a key file takes */
    return KVS_OK;
}

kvs_status kvs_remote_tls_psk(const kvs_remote_psk *tenant_key, uint8_t out[KVS_WIRE_PROOF_BYTES]) {
    if (!tenant_key || tenant_key->len < KVS_REMOTE_PSK_MIN_BYTES || !out) return KVS_EINVAL;
    mac m;
    if (mac_begin(&m, tenant_key, TLS_PSK_LABEL, 0) != KVS_OK) {
        mac_free(&m);
        return KVS_EIO;
    }
    return mac_end(&m, out);
}

/* The transcript as far as the node has it: HELLO and its CHALLENGE. */
static kvs_remote_transcript node_transcript(const kvs_remote_auth_node *node) {
    return (kvs_remote_transcript){.tenant = node->tenant,
                                   .tenant_len = node->tenant_len,
                                   .nonce = node->nonce,
                                   .challenge = node->challenge,
                                   .node_proof = node->node_proof};
}

static void with_auth(kvs_remote_transcript *t, const kvs_wire_msg *auth) {
    t->client_worker_addr = auth->worker_addr;
    t->client_worker_addr_len = auth->worker_addr_len;
    t->host_id = auth->host_id;
    t->host_id_len = auth->host_id_len;
    t->pid = auth->pid;
}

kvs_status kvs_remote_auth_node_hello(kvs_remote_auth_node *node, const kvs_remote_psk *master,
                                      const kvs_wire_msg *hello, const uint8_t **challenge_out,
                                      const uint8_t **proof_out, char *error, size_t error_len) {
    if (!node || !master || !hello || !challenge_out || !proof_out) return KVS_EINVAL;
    if (node->state != NODE_FRESH) {
        auth_error(error, error_len, "remote auth: a second hello on one connection is refused");
        node->state = NODE_REFUSED;
        return KVS_ESTATE;
    }
    if (hello->type != KVS_WIRE_HELLO || !hello->nonce || !hello->tenant ||
        !kvs_wire_tenant_ok(hello->tenant, hello->tenant_len)) {
        auth_error(error, error_len,
                   "remote auth: the first message must be a hello with a tenant and a nonce");
        node->state = NODE_REFUSED;
        return KVS_EINVAL;
    }
    if (kvs_remote_random(node->challenge, sizeof node->challenge) != KVS_OK) {
        auth_error(error, error_len, "remote auth: the random generator failed; no challenge made");
        node->state = NODE_REFUSED;
        return KVS_EIO;
    }
    memcpy(node->nonce, hello->nonce, KVS_WIRE_NONCE_BYTES);
    memcpy(node->tenant, hello->tenant, hello->tenant_len);
    node->tenant[hello->tenant_len] = '\0';
    node->tenant_len = hello->tenant_len;
    kvs_remote_transcript t = node_transcript(node);
    if (kvs_remote_tenant_psk(master, node->tenant, node->tenant_len, &node->key) != KVS_OK ||
        kvs_remote_proof(&node->key, KVS_REMOTE_PROOF_NODE, &t, node->node_proof) != KVS_OK) {
        auth_error(error, error_len, "remote auth: could not derive the tenant's key (libcrypto)");
        kvs_remote_auth_node_clear(node);
        node->state = NODE_REFUSED;
        return KVS_EIO;
    }
    node->state = NODE_CHALLENGED;
    *challenge_out = node->challenge;
    *proof_out = node->node_proof;
    return KVS_OK;
}

kvs_status kvs_remote_auth_node_check(kvs_remote_auth_node *node, const kvs_wire_msg *auth,
                                      char *error, size_t error_len) {
    if (!node || !auth) return KVS_EINVAL;
    if (node->state != NODE_CHALLENGED) {
        auth_error(error, error_len, "remote auth: an auth without a live challenge is refused");
        node->state = NODE_REFUSED;
        return KVS_ESTATE;
    }
    node->state = NODE_REFUSED; /* the challenge is used up whatever happens below */
    if (!auth->proof) {
        auth_error(error, error_len, "remote auth: tenant \"%s\" sent no proof", node->tenant);
        kvs_remote_auth_node_clear(node);
        return KVS_EINVAL;
    }
    kvs_remote_transcript t = node_transcript(node);
    with_auth(&t, auth);
    kvs_status st = kvs_remote_proof_check(&node->key, KVS_REMOTE_PROOF_CLIENT, &t, auth->proof,
                                           KVS_WIRE_PROOF_BYTES);
    if (st != KVS_OK) {
        auth_error(
            error, error_len,
            "remote auth: tenant \"%s\" failed the handshake (not its key, a stale proof, or a "
            "message changed on the way)",
            node->tenant);
        kvs_remote_auth_node_clear(node);
        return KVS_EINVAL;
    }
    memcpy(node->client_proof, auth->proof, KVS_WIRE_PROOF_BYTES);
    node->state = NODE_ACCEPTED;
    return KVS_OK;
}

kvs_status kvs_remote_auth_node_ok_proof(kvs_remote_auth_node *node, const kvs_wire_msg *auth,
                                         const kvs_wire_msg *ok,
                                         uint8_t proof[KVS_WIRE_PROOF_BYTES]) {
    if (!node || !auth || !ok || !proof) return KVS_EINVAL;
    if (node->state != NODE_ACCEPTED) return KVS_ESTATE;
    kvs_remote_transcript t = node_transcript(node);
    with_auth(&t, auth);
    kvs_remote_transcript_ok(&t, node->client_proof, ok);
    kvs_status st = kvs_remote_proof(&node->key, KVS_REMOTE_PROOF_OK, &t, proof);
    kvs_remote_psk_clear(&node->key);
    return st;
}

void kvs_remote_transcript_ok(kvs_remote_transcript *t, const uint8_t *client_proof,
                              const kvs_wire_msg *ok) {
    t->client_proof = client_proof;
    t->transports = ok->transports;
    t->transports_len = ok->transports_len;
    t->node_worker_addr = ok->worker_addr;
    t->node_worker_addr_len = ok->worker_addr_len;
    t->session_token = ok->session_token;
    t->shared_tier = ok->shared_tier;
    t->shared_tier_len = ok->shared_tier_len;
    t->shared_tier_capacity = ok->shared_tier_capacity;
    t->shared_tier_max_object = ok->shared_tier_max_object;
}

void kvs_remote_auth_node_clear(kvs_remote_auth_node *node) {
    if (node) kvs_remote_psk_clear(&node->key);
}

int kvs_remote_auth_node_ok(const kvs_remote_auth_node *node) {
    return node && node->state == NODE_ACCEPTED;
}

/* SHA-256 fetched once: EVP_sha256() is looked up again on every digest. Tenant keys are hashed on
 * every key of every request, so the node keeps a hasher per connection with the tenant's prefix
 * absorbed (0.36 us a key with a fresh digest each time, 0.075 us this way). */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static void sha256_fetch(void) {
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

struct kvs_remote_tenant_hasher {
    EVP_MD_CTX *prefix; /* label, length and tenant absorbed */
    EVP_MD_CTX *work;
};

void kvs_remote_tenant_hasher_free(kvs_remote_tenant_hasher *h) {
    if (!h) return;
    EVP_MD_CTX_free(h->prefix);
    EVP_MD_CTX_free(h->work);
    free(h);
}

kvs_remote_tenant_hasher *kvs_remote_tenant_hasher_new(const char *tenant, size_t tenant_len) {
    if (!tenant || tenant_len == 0 || tenant_len > KVS_WIRE_MAX_TENANT_BYTES) return NULL;
    pthread_once(&sha256_once, sha256_fetch);
    kvs_remote_tenant_hasher *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    uint8_t len[4] = {(uint8_t)(tenant_len >> 24), (uint8_t)(tenant_len >> 16),
                      (uint8_t)(tenant_len >> 8), (uint8_t)tenant_len};
    h->prefix = EVP_MD_CTX_new();
    h->work = EVP_MD_CTX_new();
    if (!h->prefix || !h->work ||
        EVP_DigestInit_ex(h->prefix, sha256_md ? sha256_md : EVP_sha256(), NULL) != 1 ||
        EVP_DigestUpdate(h->prefix, TENANT_LABEL, sizeof TENANT_LABEL - 1) != 1 ||
        EVP_DigestUpdate(h->prefix, len, sizeof len) != 1 ||
        EVP_DigestUpdate(h->prefix, tenant, tenant_len) != 1) {
        kvs_remote_tenant_hasher_free(h);
        return NULL;
    }
    return h;
}

kvs_status kvs_remote_tenant_hasher_key(kvs_remote_tenant_hasher *h, const kvs_key *key,
                                        kvs_key *out) {
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!h || !key || !out || EVP_MD_CTX_copy_ex(h->work, h->prefix) != 1 ||
        EVP_DigestUpdate(h->work, key->bytes, sizeof key->bytes) != 1 ||
        EVP_DigestFinal_ex(h->work, md, &md_len) != 1 || md_len < sizeof out->bytes)
        return KVS_EIO;
    memcpy(out->bytes, md, sizeof out->bytes);
    return KVS_OK;
}

kvs_status kvs_remote_tenant_key(const char *tenant, size_t tenant_len, const kvs_key *key,
                                 kvs_key *out) {
    if (!tenant || !key || !out || tenant_len == 0 || tenant_len > KVS_WIRE_MAX_TENANT_BYTES)
        return KVS_EINVAL;
    kvs_remote_tenant_hasher *h = kvs_remote_tenant_hasher_new(tenant, tenant_len);
    if (!h) return KVS_ENOMEM;
    kvs_status st = kvs_remote_tenant_hasher_key(h, key, out);
    kvs_remote_tenant_hasher_free(h);
    return st;
}

kvs_status kvs_remote_host_id(uint8_t out[KVS_REMOTE_HOST_ID_BYTES]) {
    char host[256] = "", boot[64] = "";
    if (gethostname(host, sizeof host - 1) != 0) return KVS_EIO;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return KVS_EIO;
    ssize_t n = read(fd, boot, sizeof boot - 1);
    close(fd);
    if (n <= 0) return KVS_EIO;
    boot[n] = '\0';
    /* the network namespace too: shared memory across namespaces was seen to hang (UCX 1.13) */
    char net[64] = "", pidns[64] = "";
    ssize_t k = readlink("/proc/self/ns/net", net, sizeof net - 1);
    net[k > 0 ? k : 0] = '\0';
    k = readlink("/proc/self/ns/pid", pidns,
                 sizeof pidns - 1); /* pids (AUTH's pid) mean the same */
    pidns[k > 0 ? k : 0] = '\0';
    /* and the time namespace: a PUT's read-by time is CLOCK_MONOTONIC, which it offsets */
    char timens[64] = "";
    k = readlink("/proc/self/ns/time", timens, sizeof timens - 1);
    timens[k > 0 ? k : 0] = '\0';
    static const char tag[] = "kvstrata-host-v2";
    unsigned int len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(ctx, tag, sizeof tag - 1) == 1 &&
             EVP_DigestUpdate(ctx, host, strlen(host)) == 1 &&
             EVP_DigestUpdate(ctx, "\n", 1) == 1 && EVP_DigestUpdate(ctx, boot, (size_t)n) == 1 &&
             EVP_DigestUpdate(ctx, net, strlen(net)) == 1 &&
             EVP_DigestUpdate(ctx, pidns, strlen(pidns)) == 1 &&
             EVP_DigestUpdate(ctx, timens, strlen(timens)) == 1 &&
             EVP_DigestFinal_ex(ctx, out, &len) == 1 && len == KVS_REMOTE_HOST_ID_BYTES;
    EVP_MD_CTX_free(ctx);
    return ok ? KVS_OK : KVS_EIO;
}
