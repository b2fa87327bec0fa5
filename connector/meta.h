/* meta.h - the per-step metadata a scheduler-role handle sends to worker-role handles, serialised
 * with msgpack so the two can live in different processes. Decoding validates every field: a blob
 * from a buggy or hostile peer yields KVS_EINVAL and a sentence, never a crash. */
#ifndef KVS_META_H
#define KVS_META_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

#define KVS_META_VERSION \
    8 /* 2: loads carry first_layer; 3: requests carry a layer mask instead;
                            * 4: the blob starts with a magic and a checksum of the rest;
                            * 5: every rank's keys, the group fingerprint, load_async;
                            * 6: requests carry derived_from; 7: the step's flags;
                             * 8: the requests finished with their pages kept, and a request's
                             *    block ids start at block_first */
#define KVS_META_MASKS_DROPPED 1u /* flags: the engine masks dropped tokens (KVS_PLAN_CAP_MASK) */
#define KVS_META_MAGIC         "KVSM"
#define KVS_META_HEADER_BYTES  12u /* magic, then XXH3-64 of the msgpack that follows, big-endian */
#define KVS_REQ_ID_MAX         256

/* Load tokens [first_token, first_token + n_tokens) of the chunk starting at chunk_first (the layers
 * its request's layer mask names). A load and a save carry the chunk's key of every key rank (TP
 * rank): `keys`, key_ranks of them in rank order, is what encode writes (NULL: `key`, with one key
 * rank; the pointer is the builder's, valid until encode returns); decode sets `key` to the decoding
 * worker's rank's and `keys` to NULL. The builder sets `key` to rank 0's, which tells chunks apart. */
typedef struct kvs_meta_load {
    kvs_key key;
    uint64_t chunk_first;
    uint64_t first_token;
    uint32_t n_tokens;
    const kvs_key *keys;
} kvs_meta_load;

/* Save the whole chunk starting at chunk_first (keys as a load's). */
typedef struct kvs_meta_save {
    kvs_key key;
    uint64_t chunk_first;
    const kvs_key *keys;
} kvs_meta_save;

typedef struct kvs_meta_req {
    char id[KVS_REQ_ID_MAX];
    uint32_t *block_ids; /* the request's block table from block block_first on, covering every load
                           * and save below (and the blocks before them that a failed load could
                           * taint a save through, when the step can have failed loads) */
    uint64_t n_block_ids;
    uint64_t block_first; /* the index of block_ids[0] in the request's table */
    kvs_meta_load *loads;
    uint64_t n_loads;
    kvs_meta_save *saves;
    uint64_t n_saves;
    uint8_t *layers; /* which layers its loads read: bit l of byte l / 8; NULL: every layer (a
                             * layer or stage restore plan leaves the others to the engine) */
    uint32_t
        n_layer_bytes;  /* 0 with layers NULL, else ceil(n_layers / 8) (checked by the worker) */
    uint8_t load_async; /* 1: its loads run between steps (lookup answered load_async) */
    /* derived: its saves of chunks from token derived_from on hold KV computed over chunks it loaded
     * lossy, and are sealed as derived (connector/object.h). 0: none (derived_from unused). */
    uint8_t derived;
    uint64_t derived_from;
} kvs_meta_req;

#define KVS_META_MAX_LAYER_BYTES 8192u

/* 1 when the loads of r read layer `layer`. */
static inline int kvs_meta_wants_layer(const kvs_meta_req *r, uint32_t layer) {
    return !r->n_layer_bytes ||
           (layer / 8 < r->n_layer_bytes && (r->layers[layer / 8] >> (layer % 8) & 1));
}

/* The index into r->block_ids of the block holding token t (t >= the request's first carried token:
 * bind_meta checks every load and save is). */
static inline uint64_t kvs_meta_block_index(const kvs_meta_req *r, uint64_t t, uint32_t bt) {
    return t / bt - r->block_first;
}
/* The first token of r->block_ids[0]'s block: spans over the carried ids start from it. */
static inline uint64_t kvs_meta_token_base(const kvs_meta_req *r, uint32_t bt) {
    return r->block_first * bt;
}

typedef struct kvs_meta {
    uint64_t step;
    kvs_key group_fingerprint; /* the model, layout, chunk size and tp_size the keys are for */
    uint32_t key_ranks;        /* keys per load and save: 1 (MLA, tp_size 1) or tp_size */
    uint32_t chunk_tokens;
    uint32_t flags; /* KVS_META_* bits: what the engine's scheduler declared */
    kvs_meta_req *reqs;
    uint64_t n_reqs;
    /* Requests request_finished kept the pages of (async saves) since the last step: each worker
     * reports each of them once in get_finished's sending list, when its saves have landed.
     * Decoded, the ids point into finished_pool, sized from the blob (an id takes at least its
     * length plus one byte there): a blob cannot make the decoder allocate much more than itself. */
    const char **finished;
    uint64_t n_finished;
    char *finished_pool; /* decoded metadata only */
} kvs_meta;

/* Serialise into a malloc'd buffer (*out, *len); the caller frees it with free(). KVS_EINVAL when
 * key_ranks is 0 or over KVS_KEYS_MAX_RANKS (keys.h), or above 1 with a load or save without `keys`. */
kvs_status kvs_meta_encode(const kvs_meta *meta, void **out, uint64_t *len);
/* Verify the checksum (KVS_ECORRUPT on a mismatch) and parse with the strict reader (KVS_EINVAL and a
 * sentence on anything malformed; every count is checked against the bytes left before anything is
 * allocated for it, so memory stays proportional to the blob's length); *out is freed with
 * kvs_meta_free. Each load's and save's `key` is key rank `rank`'s: a blob with fewer key ranks is
 * refused (built for another tensor-parallel size). */
kvs_status kvs_meta_decode(const void *buf, uint64_t len, uint32_t rank, kvs_meta **out, char *err,
                           uint64_t err_len);
void kvs_meta_free(kvs_meta *meta);
/* Free the arrays of one request (used by the builder too). */
void kvs_meta_req_clear(kvs_meta_req *req);

#endif
