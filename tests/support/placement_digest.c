/* placement_digest.c - see placement_digest.h. */
#include "placement_digest.h"

static uint64_t fnv1a(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t kvs_test_placement_digest(kvs_test_place_fn place, void *ctx, uint64_t start) {
    uint64_t h = 0xcbf29ce484222325ull;
    uint32_t out[9 * 9];
    for (uint32_t n_paths = 1; n_paths <= 8; n_paths++)
        for (uint32_t replicas = 1; replicas <= 9; replicas++) {
            uint64_t pointer = start;
            for (uint32_t call = 0; call < 12; call++) {
                uint32_t n_units = (call * 7 + n_paths + replicas) % 10;
                place(ctx, &pointer, n_paths, n_units, replicas, out);
                for (uint32_t i = 0; i < n_units * replicas; i++) h = fnv1a(h, out[i]);
                h = fnv1a(h, pointer);
            }
        }
    return h;
}
