/* auth.c - HMAC-SHA256 challenge/response and SHA-256 tenant keys, all from libcrypto. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define AUTH_LABEL  "kvstrata-auth-v1" /* the client's proof */
#define NODE_LABEL  "kvstrata-node-v1" /* the node's */
#define LABEL_BYTES (sizeof AUTH_LABEL - 1)
_Static_assert(sizeof AUTH_LABEL == sizeof NODE_LABEL, "labels of one length");
#define TENANT_LABEL "kvstrata-tenant-v1"

enum { NODE_FRESH, NODE_CHALLENGED, NODE_ACCEPTED, NODE_REFUSED };

static void say(char *error, size_t error_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(char *error, size_t error_len, const char *fmt, ...) {
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
        say(error, error_len, "remote auth: a pre-shared key must be %u..%u bytes, this one is %zu",
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
    kvs_status st = KVS_EIO;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        say(error, error_len, "remote auth: key file %s cannot be opened (%s)", path,
            strerror(errno));
        return KVS_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        say(error, error_len, "remote auth: key file %s cannot be examined (%s)", path,
            strerror(errno));
        goto fail;
    }
    st = KVS_EINVAL;
    if (!S_ISREG(sb.st_mode)) {
        say(error, error_len, "remote auth: key file %s is not a regular file", path);
        goto fail;
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        say(error, error_len,
            "remote auth: key file %s has mode %04o; it must not be open to group or others (chmod "
            "600)",
            path, (unsigned)(sb.st_mode & 07777));
        goto fail;
    }
    if (sb.st_size < (off_t)KVS_REMOTE_PSK_MIN_BYTES ||
        sb.st_size > (off_t)KVS_REMOTE_PSK_MAX_BYTES) {
        say(error, error_len, "remote auth: key file %s holds %lld bytes; a key is %u..%u bytes",
            path, (long long)sb.st_size, KVS_REMOTE_PSK_MIN_BYTES, KVS_REMOTE_PSK_MAX_BYTES);
        goto fail;
    }
    size_t want = (size_t)sb.st_size, got = 0;
    while (got < want) {
        ssize_t n = read(fd, out->bytes + got, want - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            say(error, error_len, "remote auth: key file %s could not be read whole (%s)", path,
                n < 0 ? strerror(errno) : "it shrank");
            st = KVS_EIO;
            goto fail;
        }
        got += (size_t)n;
    }
    out->len = got;
    close(fd);
    return KVS_OK;
fail:
    kvs_remote_psk_clear(out);
    close(fd);
    return st;
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

/* HMAC-SHA256(psk, label || challenge || nonce || tenant); the two labels have one length, so a
 * client's proof is never a node's and the other way round. */
static kvs_status labeled_proof(const char label[LABEL_BYTES + 1], const kvs_remote_psk *psk,
                                const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                const uint8_t nonce[KVS_WIRE_NONCE_BYTES], const char *tenant,
                                size_t tenant_len, uint8_t proof[KVS_WIRE_PROOF_BYTES]) {
    if (!psk || psk->len < KVS_REMOTE_PSK_MIN_BYTES || !challenge || !nonce || !tenant || !proof ||
        tenant_len == 0 || tenant_len > KVS_WIRE_MAX_TENANT_BYTES)
        return KVS_EINVAL;
    /* every part but the last has a fixed size, so the concatenation is unambiguous */
    uint8_t msg[LABEL_BYTES + KVS_WIRE_CHALLENGE_BYTES + KVS_WIRE_NONCE_BYTES +
                KVS_WIRE_MAX_TENANT_BYTES];
    size_t at = 0;
    memcpy(msg, label, LABEL_BYTES);
    at += LABEL_BYTES;
    memcpy(msg + at, challenge, KVS_WIRE_CHALLENGE_BYTES);
    at += KVS_WIRE_CHALLENGE_BYTES;
    memcpy(msg + at, nonce, KVS_WIRE_NONCE_BYTES);
    at += KVS_WIRE_NONCE_BYTES;
    memcpy(msg + at, tenant, tenant_len);
    at += tenant_len;
    unsigned int md_len = 0;
    uint8_t md[EVP_MAX_MD_SIZE];
    if (!HMAC(EVP_sha256(), psk->bytes, (int)psk->len, msg, at, md, &md_len) ||
        md_len != KVS_WIRE_PROOF_BYTES)
        return KVS_EIO;
    memcpy(proof, md, KVS_WIRE_PROOF_BYTES);
    OPENSSL_cleanse(md, sizeof md);
    return KVS_OK;
}

kvs_status kvs_remote_auth_proof(const kvs_remote_psk *psk,
                                 const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                 const uint8_t nonce[KVS_WIRE_NONCE_BYTES], const char *tenant,
                                 size_t tenant_len, uint8_t proof[KVS_WIRE_PROOF_BYTES]) {
    return labeled_proof(AUTH_LABEL, psk, challenge, nonce, tenant, tenant_len, proof);
}

kvs_status kvs_remote_node_proof(const kvs_remote_psk *psk,
                                 const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                 const uint8_t nonce[KVS_WIRE_NONCE_BYTES], const char *tenant,
                                 size_t tenant_len, uint8_t proof[KVS_WIRE_PROOF_BYTES]) {
    return labeled_proof(NODE_LABEL, psk, challenge, nonce, tenant, tenant_len, proof);
}

kvs_status kvs_remote_node_proof_check(const kvs_remote_psk *psk,
                                       const uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES],
                                       const uint8_t nonce[KVS_WIRE_NONCE_BYTES],
                                       const char *tenant, size_t tenant_len, const uint8_t *proof,
                                       size_t proof_len) {
    uint8_t want[KVS_WIRE_PROOF_BYTES];
    if (!proof || proof_len != KVS_WIRE_PROOF_BYTES) return KVS_EINVAL;
    kvs_status st = kvs_remote_node_proof(psk, challenge, nonce, tenant, tenant_len, want);
    if (st != KVS_OK) return st;
    int same = CRYPTO_memcmp(want, proof, KVS_WIRE_PROOF_BYTES) == 0;
    OPENSSL_cleanse(want, sizeof want);
    return same ? KVS_OK : KVS_EINVAL;
}

kvs_status kvs_remote_auth_node_hello(kvs_remote_auth_node *node, const kvs_wire_msg *hello,
                                      const uint8_t **challenge_out, char *error,
                                      size_t error_len) {
    if (!node || !hello || !challenge_out) return KVS_EINVAL;
    if (node->state != NODE_FRESH) {
        say(error, error_len, "remote auth: a second hello on one connection is refused");
        node->state = NODE_REFUSED;
        return KVS_ESTATE;
    }
    if (hello->type != KVS_WIRE_HELLO || !hello->nonce || !hello->tenant ||
        hello->tenant_len == 0 || hello->tenant_len > KVS_WIRE_MAX_TENANT_BYTES) {
        say(error, error_len,
            "remote auth: the first message must be a hello with a tenant and a nonce");
        node->state = NODE_REFUSED;
        return KVS_EINVAL;
    }
    if (kvs_remote_random(node->challenge, sizeof node->challenge) != KVS_OK) {
        say(error, error_len, "remote auth: the random generator failed; no challenge made");
        node->state = NODE_REFUSED;
        return KVS_EIO;
    }
    memcpy(node->nonce, hello->nonce, KVS_WIRE_NONCE_BYTES);
    memcpy(node->tenant, hello->tenant, hello->tenant_len);
    node->tenant[hello->tenant_len] = '\0';
    node->tenant_len = hello->tenant_len;
    node->state = NODE_CHALLENGED;
    *challenge_out = node->challenge;
    return KVS_OK;
}

kvs_status kvs_remote_auth_node_check(kvs_remote_auth_node *node, const kvs_remote_psk *psk,
                                      const uint8_t *proof, size_t proof_len, char *error,
                                      size_t error_len) {
    if (!node || !psk) return KVS_EINVAL;
    if (node->state != NODE_CHALLENGED) {
        say(error, error_len, "remote auth: an auth without a live challenge is refused");
        node->state = NODE_REFUSED;
        return KVS_ESTATE;
    }
    node->state = NODE_REFUSED; /* the challenge is used up whatever happens below */
    if (!proof || proof_len != KVS_WIRE_PROOF_BYTES) {
        say(error, error_len, "remote auth: tenant \"%s\" sent a proof of %zu bytes, %u expected",
            node->tenant, proof ? proof_len : 0, KVS_WIRE_PROOF_BYTES);
        return KVS_EINVAL;
    }
    uint8_t want[KVS_WIRE_PROOF_BYTES];
    kvs_status st = kvs_remote_auth_proof(psk, node->challenge, node->nonce, node->tenant,
                                          node->tenant_len, want);
    OPENSSL_cleanse(node->challenge, sizeof node->challenge);
    if (st != KVS_OK) {
        say(error, error_len, "remote auth: could not compute the expected proof (libcrypto)");
        return st;
    }
    int same = CRYPTO_memcmp(want, proof, KVS_WIRE_PROOF_BYTES) == 0;
    OPENSSL_cleanse(want, sizeof want);
    if (!same) {
        say(error, error_len,
            "remote auth: tenant \"%s\" failed the handshake (wrong key or stale proof)",
            node->tenant);
        return KVS_EINVAL;
    }
    node->state = NODE_ACCEPTED;
    return KVS_OK;
}

kvs_status kvs_remote_auth_node_proof(const kvs_remote_auth_node *node, const kvs_remote_psk *psk,
                                      uint8_t proof[KVS_WIRE_PROOF_BYTES]) {
    if (!node || node->state != NODE_CHALLENGED) return KVS_ESTATE;
    return kvs_remote_node_proof(psk, node->challenge, node->nonce, node->tenant, node->tenant_len,
                                 proof);
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
