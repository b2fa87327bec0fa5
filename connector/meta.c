#include "meta.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/mp_reader.h"
#include "keys.h"

/* Blob: "KVSM", XXH3-64 of the rest (8 bytes, big-endian), then msgpack:
 * [version, step, group fingerprint bin16, key_ranks R, chunk_tokens, [req...], flags,
 *  [finished request id str...]]
 * req: [id str, [block ids], [[keys bin16*R, chunk_first, first_token, n_tokens]...],
 *       [[keys bin16*R, chunk_first]...], layer mask bin (empty: every layer), load_async 0|1,
 *       derived_from (UINT64_MAX: none), block_first (the table index of the first block id)]
 * keys: the chunk's key of every key rank, rank 0 first. */

static void pack_key(msgpack_packer *pk, const kvs_key *key) {
    msgpack_pack_bin(pk, sizeof key->bytes);
    msgpack_pack_bin_body(pk, key->bytes, sizeof key->bytes);
}

static void pack_keys(msgpack_packer *pk, const kvs_key *keys, uint32_t n_ranks) {
    msgpack_pack_bin(pk, (size_t)n_ranks * sizeof keys->bytes);
    msgpack_pack_bin_body(pk, keys, (size_t)n_ranks * sizeof keys->bytes);
}

static void pack_req(msgpack_packer *pk, const kvs_meta_req *r, uint32_t n_ranks) {
    msgpack_pack_array(pk, 8);
    size_t idlen = strnlen(r->id, KVS_REQ_ID_MAX - 1);
    msgpack_pack_str(pk, idlen);
    msgpack_pack_str_body(pk, r->id, idlen);
    msgpack_pack_array(pk, (size_t)r->n_block_ids);
    for (uint64_t i = 0; i < r->n_block_ids; i++) msgpack_pack_uint32(pk, r->block_ids[i]);
    msgpack_pack_array(pk, (size_t)r->n_loads);
    for (uint64_t i = 0; i < r->n_loads; i++) {
        const kvs_meta_load *l = &r->loads[i];
        msgpack_pack_array(pk, 4);
        pack_keys(pk, l->keys ? l->keys : &l->key, n_ranks);
        msgpack_pack_uint64(pk, l->chunk_first);
        msgpack_pack_uint64(pk, l->first_token);
        msgpack_pack_uint32(pk, l->n_tokens);
    }
    msgpack_pack_array(pk, (size_t)r->n_saves);
    for (uint64_t i = 0; i < r->n_saves; i++) {
        msgpack_pack_array(pk, 2);
        pack_keys(pk, r->saves[i].keys ? r->saves[i].keys : &r->saves[i].key, n_ranks);
        msgpack_pack_uint64(pk, r->saves[i].chunk_first);
    }
    msgpack_pack_bin(pk, r->layers ? r->n_layer_bytes : 0);
    if (r->layers && r->n_layer_bytes) msgpack_pack_bin_body(pk, r->layers, r->n_layer_bytes);
    msgpack_pack_uint8(pk, r->load_async ? 1 : 0);
    msgpack_pack_uint64(pk, r->derived ? r->derived_from : UINT64_MAX);
    msgpack_pack_uint64(pk, r->block_first);
}

/* Every load and save has its R keys (a lone `key` serves one rank only). */
static int keys_complete(const kvs_meta *meta) {
    if (meta->key_ranks == 0 || meta->key_ranks > KVS_KEYS_MAX_RANKS) return 0;
    if (meta->key_ranks == 1) return 1;
    for (uint64_t i = 0; i < meta->n_reqs; i++) {
        const kvs_meta_req *r = &meta->reqs[i];
        for (uint64_t j = 0; j < r->n_loads; j++)
            if (!r->loads[j].keys) return 0;
        for (uint64_t j = 0; j < r->n_saves; j++)
            if (!r->saves[j].keys) return 0;
    }
    return 1;
}

kvs_status kvs_meta_encode(const kvs_meta *meta, void **out, uint64_t *len) {
    if (!keys_complete(meta)) return KVS_EINVAL;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    static const char header[KVS_META_HEADER_BYTES] = KVS_META_MAGIC; /* checksum filled in below */
    msgpack_sbuffer_write(&sb, header, sizeof header);
    msgpack_pack_array(&pk, 8);
    msgpack_pack_uint32(&pk, KVS_META_VERSION);
    msgpack_pack_uint64(&pk, meta->step);
    pack_key(&pk, &meta->group_fingerprint);
    msgpack_pack_uint32(&pk, meta->key_ranks);
    msgpack_pack_uint32(&pk, meta->chunk_tokens);
    msgpack_pack_array(&pk, (size_t)meta->n_reqs);
    for (uint64_t i = 0; i < meta->n_reqs; i++) pack_req(&pk, &meta->reqs[i], meta->key_ranks);
    msgpack_pack_uint32(&pk, meta->flags);
    msgpack_pack_array(&pk, (size_t)meta->n_finished);
    for (uint64_t i = 0; i < meta->n_finished; i++) {
        size_t idlen = strnlen(meta->finished[i], KVS_REQ_ID_MAX - 1);
        msgpack_pack_str(&pk, idlen);
        msgpack_pack_str_body(&pk, meta->finished[i], idlen);
    }
    if (!sb.data || sb.size < KVS_META_HEADER_BYTES) {
        msgpack_sbuffer_destroy(&sb);
        return KVS_ENOMEM;
    }
    uint64_t sum = XXH3_64bits(sb.data + KVS_META_HEADER_BYTES, sb.size - KVS_META_HEADER_BYTES);
    for (unsigned i = 0; i < 8; i++) sb.data[4 + i] = (char)(uint8_t)(sum >> (56 - 8 * i));
    *out = sb.data; /* msgpack's sbuffer grows with realloc: the caller frees with free() */
    *len = sb.size;
    return KVS_OK;
}

/* --- decoding ------------------------------------------------------------------------------------- */

static int read_key(kvs_mp_reader *rd, kvs_key *out, const char *what) {
    const uint8_t *p;
    uint32_t n;
    if (kvs_mp_read_bytes(rd, 0, sizeof out->bytes, &p, &n, what) != 0) return -1;
    if (n != sizeof out->bytes)
        return kvs_mp_refuse(rd, KVS_MP_VALUE, "%s is %u bytes, 16 expected", what, n);
    memcpy(out->bytes, p, sizeof out->bytes);
    return 0;
}

/* What the decoder needs of the root to read a request: the keys it keeps are rank `rank`'s of
 * `ranks`. */
typedef struct decode_ctx {
    uint32_t chunk_tokens;
    uint32_t ranks;
    uint32_t rank;
} decode_ctx;

/* A chunk's keys (ranks of them, one bin); keeps the decoding rank's. */
static int read_rank_key(kvs_mp_reader *rd, const decode_ctx *dc, kvs_key *out, const char *what) {
    const uint8_t *p;
    uint32_t n, want = dc->ranks * (uint32_t)sizeof out->bytes;
    if (kvs_mp_read_bytes(rd, 0, want, &p, &n, what) != 0) return -1;
    if (n != want)
        return kvs_mp_refuse(rd, KVS_MP_VALUE, "%s are %u bytes, %u expected (16 per key rank)",
                             what, n, want);
    memcpy(out->bytes, p + (size_t)dc->rank * sizeof out->bytes, sizeof out->bytes);
    return 0;
}

/* calloc of n elements; n was bounded by the blob's bytes (kvs_mp_read_array). */
static void *alloc_n(kvs_mp_reader *rd, uint64_t n, size_t size) {
    void *p = n ? calloc(n, size) : NULL;
    if (n && !p)
        kvs_mp_refuse(rd, KVS_MP_LIMIT, "out of memory for %llu entries", (unsigned long long)n);
    return p;
}

static int decode_loads(kvs_mp_reader *rd, kvs_meta_req *r, const decode_ctx *dc) {
    uint32_t chunk_tokens = dc->chunk_tokens;
    uint32_t n;
    if (kvs_mp_read_array(rd, 0, UINT32_MAX, &n, "a load list") != 0) return -1;
    if (n && !(r->loads = alloc_n(rd, n, sizeof *r->loads))) return -1;
    r->n_loads = n;
    for (uint64_t i = 0; i < n; i++) {
        kvs_meta_load *l = &r->loads[i];
        uint32_t fields;
        uint64_t count = 0;
        if (kvs_mp_read_array(rd, 4, 4, &fields, "a load entry") != 0 ||
            read_rank_key(rd, dc, &l->key, "a load's keys") != 0 ||
            kvs_mp_read_uint(rd, UINT64_MAX / 2, &l->chunk_first, "a load's chunk_first") != 0 ||
            kvs_mp_read_uint(rd, UINT64_MAX / 2, &l->first_token, "a load's first_token") != 0 ||
            kvs_mp_read_uint(rd, chunk_tokens, &count, "a load's n_tokens") != 0)
            return -1;
        l->n_tokens = (uint32_t)count;
        if (count == 0 || l->first_token < l->chunk_first ||
            l->first_token + count > l->chunk_first + chunk_tokens || l->chunk_first % chunk_tokens)
            return kvs_mp_refuse(rd, KVS_MP_VALUE, "a load range lies outside its chunk");
    }
    return 0;
}

static int decode_saves(kvs_mp_reader *rd, kvs_meta_req *r, const decode_ctx *dc) {
    uint32_t n;
    if (kvs_mp_read_array(rd, 0, UINT32_MAX, &n, "a save list") != 0) return -1;
    if (n && !(r->saves = alloc_n(rd, n, sizeof *r->saves))) return -1;
    r->n_saves = n;
    for (uint64_t i = 0; i < n; i++) {
        kvs_meta_save *sv = &r->saves[i];
        uint32_t fields;
        if (kvs_mp_read_array(rd, 2, 2, &fields, "a save entry") != 0 ||
            read_rank_key(rd, dc, &sv->key, "a save's keys") != 0 ||
            kvs_mp_read_uint(rd, UINT64_MAX / 2, &sv->chunk_first, "a save's chunk_first") != 0)
            return -1;
        if (sv->chunk_first % dc->chunk_tokens)
            return kvs_mp_refuse(rd, KVS_MP_VALUE, "a save does not start on a chunk boundary");
    }
    return 0;
}

/* A request id: 1..255 bytes without a NUL, into id (KVS_REQ_ID_MAX bytes). */
static int read_id(kvs_mp_reader *rd, char *id, const char *what) {
    const uint8_t *p;
    uint32_t n;
    if (kvs_mp_read_bytes(rd, 1, KVS_REQ_ID_MAX - 1, &p, &n, what) != 0) return -1;
    if (n == 0 || memchr(p, 0, n))
        return kvs_mp_refuse(rd, KVS_MP_VALUE, "%s is not 1..255 bytes of text", what);
    memcpy(id, p, n);
    id[n] = '\0';
    return 0;
}

static int decode_req(kvs_mp_reader *rd, kvs_meta_req *r, const decode_ctx *dc) {
    uint32_t fields, n;
    const uint8_t *p;
    uint64_t async;
    if (kvs_mp_read_array(rd, 8, 8, &fields, "a request") != 0 ||
        read_id(rd, r->id, "a request id") != 0)
        return -1;
    if (kvs_mp_read_array(rd, 0, UINT32_MAX, &n, "a block table") != 0) return -1;
    if (n && !(r->block_ids = alloc_n(rd, n, sizeof *r->block_ids))) return -1;
    r->n_block_ids = n;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v;
        if (kvs_mp_read_uint(rd, UINT32_MAX, &v, "a block id") != 0) return -1;
        r->block_ids[i] = (uint32_t)v;
    }
    if (decode_loads(rd, r, dc) != 0 || decode_saves(rd, r, dc) != 0) return -1;
    /* the layer mask: its size against the model is checked by the worker */
    if (kvs_mp_read_bytes(rd, 0, KVS_META_MAX_LAYER_BYTES, &p, &n, "a request's layer mask") != 0)
        return -1;
    r->n_layer_bytes = n;
    if (n) {
        if (!(r->layers = alloc_n(rd, n, 1))) return -1;
        memcpy(r->layers, p, n);
    }
    if (kvs_mp_read_uint(rd, 1, &async, "a request's load_async") != 0) return -1;
    r->load_async = (uint8_t)async;
    uint64_t from = UINT64_MAX;
    if (kvs_mp_read_uint(rd, UINT64_MAX, &from, "a request's derived_from") != 0) return -1;
    r->derived = from != UINT64_MAX;
    r->derived_from = r->derived ? from : 0;
    /* a block table index: past UINT32_MAX blocks no engine's table reaches, and its tokens then
     * stay far from overflowing (the worker checks the spans against it) */
    return kvs_mp_read_uint(rd, UINT32_MAX, &r->block_first, "a request's block_first");
}

static int decode_root(kvs_mp_reader *rd, kvs_meta *m, uint32_t rank) {
    uint32_t fields, n;
    uint64_t version, chunk, ranks;
    if (kvs_mp_read_array(rd, 8, 8, &fields, "the root") != 0 ||
        kvs_mp_read_uint(rd, UINT32_MAX, &version, "the version") != 0)
        return -1;
    if (version != KVS_META_VERSION)
        return kvs_mp_refuse(rd, KVS_MP_VALUE,
                             "version %llu, this library reads version %d (a worker and a "
                             "scheduler of different builds?)",
                             (unsigned long long)version, KVS_META_VERSION);
    if (kvs_mp_read_uint(rd, UINT64_MAX, &m->step, "the step") != 0 ||
        read_key(rd, &m->group_fingerprint, "the group fingerprint") != 0 ||
        kvs_mp_read_uint(rd, KVS_KEYS_MAX_RANKS, &ranks, "key_ranks") != 0)
        return -1;
    if (ranks == 0) return kvs_mp_refuse(rd, KVS_MP_VALUE, "key_ranks is zero");
    if (rank >= ranks)
        return kvs_mp_refuse(rd, KVS_MP_VALUE,
                             "it carries the keys of %llu tensor-parallel rank%s, none for this "
                             "worker's rank %u (built for another tensor-parallel size)",
                             (unsigned long long)ranks, ranks == 1 ? "" : "s", rank);
    m->key_ranks = (uint32_t)ranks;
    if (kvs_mp_read_uint(rd, 1u << 20, &chunk, "chunk_tokens") != 0) return -1;
    if (chunk == 0) return kvs_mp_refuse(rd, KVS_MP_VALUE, "chunk_tokens is zero");
    m->chunk_tokens = (uint32_t)chunk;
    decode_ctx dc = {m->chunk_tokens, m->key_ranks, rank};
    if (kvs_mp_read_array(rd, 0, UINT32_MAX, &n, "the request list") != 0) return -1;
    if (n && !(m->reqs = alloc_n(rd, n, sizeof *m->reqs))) return -1;
    m->n_reqs = n;
    for (uint64_t i = 0; i < n; i++)
        if (decode_req(rd, &m->reqs[i], &dc) != 0) return -1;
    uint64_t flags;
    if (kvs_mp_read_uint(rd, KVS_META_MASKS_DROPPED, &flags, "the step's flags") != 0) return -1;
    m->flags = (uint32_t)flags;
    if (kvs_mp_read_array(rd, 0, UINT32_MAX, &n, "the finished list") != 0) return -1;
    if (n) {
        size_t pool_len = rd->left; /* each id: a tag byte and its text, here its text and a NUL */
        if (!(m->finished = alloc_n(rd, n, sizeof *m->finished)) ||
            !(m->finished_pool = alloc_n(rd, pool_len, 1)))
            return -1;
        char *at = m->finished_pool;
        for (uint64_t i = 0; i < n; i++) {
            char id[KVS_REQ_ID_MAX];
            if (read_id(rd, id, "a finished request id") != 0) return -1;
            size_t len = strlen(id) + 1;
            memcpy(at, id, len);
            m->finished[i] = at;
            at += len;
        }
    }
    m->n_finished = n;
    return kvs_mp_read_end(rd);
}

static uint64_t load_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

kvs_status kvs_meta_decode(const void *buf, uint64_t len, uint32_t rank, kvs_meta **out, char *err,
                           uint64_t err_len) {
    *out = NULL;
    const uint8_t *b = buf;
    if (!buf || len < KVS_META_HEADER_BYTES || memcmp(b, KVS_META_MAGIC, 4) != 0) {
        kvs_fmt(err, err_len, "step metadata: %s",
                !buf || len == 0              ? "empty blob"
                : len < KVS_META_HEADER_BYTES ? "shorter than its header"
                                              : "not step metadata (bad magic)");
        return KVS_EINVAL;
    }
    uint64_t want = load_be64(b + 4),
             got = XXH3_64bits(b + KVS_META_HEADER_BYTES, len - KVS_META_HEADER_BYTES);
    if (want != got) {
        kvs_fmt(
            err, err_len,
            "step metadata: checksum mismatch over %llu bytes (stored %016llx, computed %016llx): "
            "the blob was changed or cut between build_meta and bind_meta",
            (unsigned long long)(len - KVS_META_HEADER_BYTES), (unsigned long long)want,
            (unsigned long long)got);
        return KVS_ECORRUPT;
    }
    kvs_meta *m = calloc(1, sizeof *m);
    if (!m) {
        kvs_fmt(err, err_len, "step metadata: out of memory");
        return KVS_ENOMEM;
    }
    kvs_mp_reader rd;
    kvs_mp_reader_init(&rd, b + KVS_META_HEADER_BYTES, len - KVS_META_HEADER_BYTES, "step metadata",
                       err, (size_t)err_len);
    if (decode_root(&rd, m, rank) != 0) {
        kvs_meta_free(m);
        return KVS_EINVAL;
    }
    *out = m;
    return KVS_OK;
}

void kvs_meta_req_clear(kvs_meta_req *r) {
    free(r->block_ids);
    free(r->loads);
    free(r->saves);
    free(r->layers);
    r->block_ids = NULL;
    r->loads = NULL;
    r->saves = NULL;
    r->layers = NULL;
    r->n_block_ids = r->n_loads = r->n_saves = 0;
    r->block_first = 0;
    r->n_layer_bytes = 0;
}

void kvs_meta_free(kvs_meta *m) {
    if (!m) return;
    for (uint64_t i = 0; i < m->n_reqs; i++) kvs_meta_req_clear(&m->reqs[i]);
    free(m->reqs);
    free(m->finished);
    free(m->finished_pool);
    free(m);
}
