#include "meta.h"

#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Wire form (msgpack): [version, step, fingerprint bin16, chunk_tokens, [req...]]
 * req: [id str, [block ids], [[key bin16, chunk_first, first_token, n_tokens]...],
 *       [[key bin16, chunk_first]...], layer mask bin (empty: every layer)] */

static void pack_key(msgpack_packer *pk, const kvs_key *key) {
    msgpack_pack_bin(pk, sizeof key->bytes);
    msgpack_pack_bin_body(pk, key->bytes, sizeof key->bytes);
}

static void pack_req(msgpack_packer *pk, const kvs_meta_req *r) {
    msgpack_pack_array(pk, 5);
    size_t idlen = strnlen(r->id, KVS_REQ_ID_MAX - 1);
    msgpack_pack_str(pk, idlen);
    msgpack_pack_str_body(pk, r->id, idlen);
    msgpack_pack_array(pk, (size_t)r->n_block_ids);
    for (uint64_t i = 0; i < r->n_block_ids; i++) msgpack_pack_uint32(pk, r->block_ids[i]);
    msgpack_pack_array(pk, (size_t)r->n_loads);
    for (uint64_t i = 0; i < r->n_loads; i++) {
        const kvs_meta_load *l = &r->loads[i];
        msgpack_pack_array(pk, 4);
        pack_key(pk, &l->key);
        msgpack_pack_uint64(pk, l->chunk_first);
        msgpack_pack_uint64(pk, l->first_token);
        msgpack_pack_uint32(pk, l->n_tokens);
    }
    msgpack_pack_array(pk, (size_t)r->n_saves);
    for (uint64_t i = 0; i < r->n_saves; i++) {
        msgpack_pack_array(pk, 2);
        pack_key(pk, &r->saves[i].key);
        msgpack_pack_uint64(pk, r->saves[i].chunk_first);
    }
    msgpack_pack_bin(pk, r->layers ? r->n_layer_bytes : 0);
    if (r->layers && r->n_layer_bytes) msgpack_pack_bin_body(pk, r->layers, r->n_layer_bytes);
}

kvs_status kvs_meta_encode(const kvs_meta *meta, void **out, uint64_t *len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 5);
    msgpack_pack_uint32(&pk, KVS_META_VERSION);
    msgpack_pack_uint64(&pk, meta->step);
    pack_key(&pk, &meta->fingerprint);
    msgpack_pack_uint32(&pk, meta->chunk_tokens);
    msgpack_pack_array(&pk, (size_t)meta->n_reqs);
    for (uint64_t i = 0; i < meta->n_reqs; i++) pack_req(&pk, &meta->reqs[i]);
    if (!sb.data && sb.size) return KVS_ENOMEM;
    *out = sb.data; /* msgpack's sbuffer grows with realloc: the caller frees with free() */
    *len = sb.size;
    return KVS_OK;
}

/* --- decoding ------------------------------------------------------------------------------------- */

typedef struct decoder {
    char *err;
    uint64_t err_len;
} decoder;

static int bad(decoder *d, const char *what) {
    kvs_fmt(d->err, d->err_len, "step metadata: %s", what);
    return 0;
}

static int get_array(decoder *d, const msgpack_object *o, uint32_t want, const char *what) {
    if (o->type != MSGPACK_OBJECT_ARRAY || (want && o->via.array.size != want)) {
        char msg[160];
        kvs_fmt(msg, sizeof msg, "%s is not an array of %u", what, want);
        return bad(d, msg);
    }
    return 1;
}

static int get_u64(decoder *d, const msgpack_object *o, uint64_t max, uint64_t *out, const char *what) {
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max) {
        char msg[160];
        kvs_fmt(msg, sizeof msg, "%s is not an integer in [0, %llu]", what, (unsigned long long)max);
        return bad(d, msg);
    }
    *out = o->via.u64;
    return 1;
}

static int get_key(decoder *d, const msgpack_object *o, kvs_key *out) {
    if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != sizeof out->bytes)
        return bad(d, "a key is not 16 bytes of binary");
    memcpy(out->bytes, o->via.bin.ptr, sizeof out->bytes);
    return 1;
}

static int decode_loads(decoder *d, const msgpack_object *o, kvs_meta_req *r, uint32_t chunk_tokens) {
    if (!get_array(d, o, 0, "load list")) return 0;
    r->n_loads = o->via.array.size;
    if (r->n_loads && !(r->loads = calloc(r->n_loads, sizeof *r->loads))) return bad(d, "out of memory");
    for (uint64_t i = 0; i < r->n_loads; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        kvs_meta_load *l = &r->loads[i];
        uint64_t n = 0;
        if (!get_array(d, e, 4, "load entry") || !get_key(d, &e->via.array.ptr[0], &l->key) ||
            !get_u64(d, &e->via.array.ptr[1], UINT64_MAX / 2, &l->chunk_first, "load chunk_first") ||
            !get_u64(d, &e->via.array.ptr[2], UINT64_MAX / 2, &l->first_token, "load first_token") ||
            !get_u64(d, &e->via.array.ptr[3], chunk_tokens, &n, "load n_tokens"))
            return 0;
        l->n_tokens = (uint32_t)n;
        if (n == 0 || l->first_token < l->chunk_first ||
            l->first_token + n > l->chunk_first + chunk_tokens || l->chunk_first % chunk_tokens)
            return bad(d, "a load range lies outside its chunk");
    }
    return 1;
}

static int decode_saves(decoder *d, const msgpack_object *o, kvs_meta_req *r, uint32_t chunk_tokens) {
    if (!get_array(d, o, 0, "save list")) return 0;
    r->n_saves = o->via.array.size;
    if (r->n_saves && !(r->saves = calloc(r->n_saves, sizeof *r->saves))) return bad(d, "out of memory");
    for (uint64_t i = 0; i < r->n_saves; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        kvs_meta_save *s = &r->saves[i];
        if (!get_array(d, e, 2, "save entry") || !get_key(d, &e->via.array.ptr[0], &s->key) ||
            !get_u64(d, &e->via.array.ptr[1], UINT64_MAX / 2, &s->chunk_first, "save chunk_first"))
            return 0;
        if (s->chunk_first % chunk_tokens) return bad(d, "a save does not start on a chunk boundary");
    }
    return 1;
}

static int decode_req(decoder *d, const msgpack_object *o, kvs_meta_req *r, uint32_t chunk_tokens) {
    if (!get_array(d, o, 5, "request")) return 0;
    const msgpack_object *f = o->via.array.ptr;
    if (f[0].type != MSGPACK_OBJECT_STR || f[0].via.str.size == 0 ||
        f[0].via.str.size >= KVS_REQ_ID_MAX || memchr(f[0].via.str.ptr, 0, f[0].via.str.size))
        return bad(d, "a request id is not a string of 1..255 bytes");
    memcpy(r->id, f[0].via.str.ptr, f[0].via.str.size);
    r->id[f[0].via.str.size] = '\0';
    if (!get_array(d, &f[1], 0, "block table")) return 0;
    r->n_block_ids = f[1].via.array.size;
    if (r->n_block_ids && !(r->block_ids = calloc(r->n_block_ids, sizeof *r->block_ids)))
        return bad(d, "out of memory");
    for (uint64_t i = 0; i < r->n_block_ids; i++) {
        uint64_t v;
        if (!get_u64(d, &f[1].via.array.ptr[i], UINT32_MAX, &v, "a block id")) return 0;
        r->block_ids[i] = (uint32_t)v;
    }
    if (!decode_loads(d, &f[2], r, chunk_tokens) || !decode_saves(d, &f[3], r, chunk_tokens)) return 0;
    /* the layer mask: its size against the model is checked by the worker */
    if (f[4].type != MSGPACK_OBJECT_BIN || f[4].via.bin.size > KVS_META_MAX_LAYER_BYTES)
        return bad(d, "a request's layer mask is not a bin of at most 8192 bytes");
    r->n_layer_bytes = f[4].via.bin.size;
    if (r->n_layer_bytes) {
        if (!(r->layers = malloc(r->n_layer_bytes))) return bad(d, "out of memory");
        memcpy(r->layers, f[4].via.bin.ptr, r->n_layer_bytes);
    }
    return 1;
}

static int decode_root(decoder *d, const msgpack_object *root, kvs_meta *m) {
    if (!get_array(d, root, 5, "root")) return 0;
    const msgpack_object *f = root->via.array.ptr;
    uint64_t version, chunk;
    if (!get_u64(d, &f[0], UINT32_MAX, &version, "version")) return 0;
    if (version != KVS_META_VERSION) return bad(d, "unsupported metadata version");
    if (!get_u64(d, &f[1], UINT64_MAX, &m->step, "step") || !get_key(d, &f[2], &m->fingerprint) ||
        !get_u64(d, &f[3], 1u << 20, &chunk, "chunk_tokens") || !get_array(d, &f[4], 0, "request list"))
        return 0;
    if (chunk == 0) return bad(d, "chunk_tokens is zero");
    m->chunk_tokens = (uint32_t)chunk;
    m->n_reqs = f[4].via.array.size;
    if (m->n_reqs && !(m->reqs = calloc(m->n_reqs, sizeof *m->reqs))) return bad(d, "out of memory");
    for (uint64_t i = 0; i < m->n_reqs; i++)
        if (!decode_req(d, &f[4].via.array.ptr[i], &m->reqs[i], m->chunk_tokens)) return 0;
    return 1;
}

static uint64_t be(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Walk the msgpack structure of buf without building it: 1 when every declared length fits in the
 * bytes left and every container's count could be filled by them. msgpack-c allocates a container's
 * declared count before reading it, so a corrupt count (up to 2^32 entries) would otherwise ask for
 * tens of GiB. */
static int plausible_msgpack(const uint8_t *b, uint64_t len) {
    uint64_t pos = 0, pending = 1;
    while (pending) {
        if (pos >= len) return 0;
        uint8_t t = b[pos++];
        uint64_t skip = 0, items = 0;
        unsigned n = 0;
        pending--;
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
            /* one byte */
        } else if (t >= 0x80 && t <= 0x8f) {
            items = 2ull * (t & 0x0f);
        } else if (t >= 0x90 && t <= 0x9f) {
            items = t & 0x0f;
        } else if (t >= 0xa0 && t <= 0xbf) {
            skip = t & 0x1f;
        } else {
            switch (t) {
            case 0xc4: case 0xc5: case 0xc6: n = 1u << (t - 0xc4); break; /* bin: length then bytes */
            case 0xd9: case 0xda: case 0xdb: n = 1u << (t - 0xd9); break; /* str */
            case 0xc7: case 0xc8: case 0xc9: n = 1u << (t - 0xc7); break; /* ext: length, type, bytes */
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xcd: case 0xce: case 0xcf: skip = 1ull << (t - 0xcc); break;
            case 0xd0: case 0xd1: case 0xd2: case 0xd3: skip = 1ull << (t - 0xd0); break;
            case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: skip = 1 + (1ull << (t - 0xd4)); break;
            case 0xdc: case 0xdd: case 0xde: case 0xdf: n = t == 0xdc || t == 0xde ? 2 : 4; break;
            default: return 0; /* 0xc1 is never used */
            }
            if (n) {
                if (len - pos < n) return 0;
                uint64_t v = be(b + pos, n);
                pos += n;
                if (t >= 0xdc) items = t >= 0xde ? 2 * v : v;
                else skip = v + (t >= 0xc7 && t <= 0xc9);
            }
        }
        if (skip > len - pos) return 0;
        pos += skip;
        pending += items;
        if (pending > len - pos) return 0; /* every item takes at least one byte */
    }
    return 1;
}

kvs_status kvs_meta_decode(const void *buf, uint64_t len, kvs_meta **out, char *err, uint64_t err_len) {
    *out = NULL;
    decoder d = {err, err_len};
    if (!buf || len == 0) {
        bad(&d, "empty blob");
        return KVS_EINVAL;
    }
    if (!plausible_msgpack(buf, len)) {
        bad(&d, "not valid msgpack (a length or count runs past the blob)");
        return KVS_EINVAL;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ret = msgpack_unpack_next(&up, buf, (size_t)len, &off);
    if (ret != MSGPACK_UNPACK_SUCCESS || off != len) {
        msgpack_unpacked_destroy(&up);
        bad(&d, ret == MSGPACK_UNPACK_SUCCESS ? "trailing bytes after the blob" : "not valid msgpack");
        return KVS_EINVAL;
    }
    kvs_meta *m = calloc(1, sizeof *m);
    if (!m) {
        msgpack_unpacked_destroy(&up);
        bad(&d, "out of memory");
        return KVS_ENOMEM;
    }
    int ok = decode_root(&d, &up.data, m);
    msgpack_unpacked_destroy(&up);
    if (!ok) {
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
    r->n_layer_bytes = 0;
}

void kvs_meta_free(kvs_meta *m) {
    if (!m) return;
    for (uint64_t i = 0; i < m->n_reqs; i++) kvs_meta_req_clear(&m->reqs[i]);
    free(m->reqs);
    free(m);
}
