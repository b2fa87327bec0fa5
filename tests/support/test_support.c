#include "test_support.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvs_test_tmpdir(char *buf, size_t len) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    int n = snprintf(buf, len, "%s/kvs-test-XXXXXX", base);
    if (n < 0 || (size_t)n >= len) return -1;
    return mkdtemp(buf) ? 0 : -1;
}

int kvs_test_write_file(const char *dir, const char *name, const char *text, char *path_out,
                        size_t path_len) {
    int n = snprintf(path_out, path_len, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= path_len) return -1;
    FILE *f = fopen(path_out, "w");
    if (!f) return -1;
    size_t want = strlen(text);
    size_t put = fwrite(text, 1, want, f);
    if (fclose(f) != 0 || put != want) return -1;
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void kvs_test_rmtree(const char *dir) {
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *kvs_test_layout_name(kvs_test_layout layout) {
    switch (layout) {
        case KVS_TEST_LAYOUT_NHD: return "nhd";
        case KVS_TEST_LAYOUT_HND: return "hnd";
        case KVS_TEST_LAYOUT_FLASHINFER: return "flashinfer";
        case KVS_TEST_LAYOUT_MLA: return "mla";
        case KVS_TEST_LAYOUT_CROSS_LAYER: return "cross_layer";
        case KVS_TEST_LAYOUT_COUNT: break;
    }
    return "unknown";
}

void *kvs_test_alloc_kv_layout(kvs_test_layout layout, uint32_t n_layers, uint32_t n_blocks,
                               uint32_t block_tokens, uint32_t n_heads, uint32_t head_dim,
                               uint32_t elem_bytes, kvs_layer_view *views, size_t *bytes_out) {
    if (!views || n_layers == 0 || n_blocks == 0 || block_tokens == 0 || n_heads == 0 ||
        head_dim == 0 || elem_bytes == 0 || (unsigned)layout >= KVS_TEST_LAYOUT_COUNT)
        return NULL;
    if (layout == KVS_TEST_LAYOUT_MLA && n_heads != 1) return NULL;
    const size_t head_bytes = (size_t)head_dim * elem_bytes;
    const size_t page_bytes = (size_t)block_tokens * n_heads * head_bytes; /* one block of K or V */
    const size_t parts = layout == KVS_TEST_LAYOUT_MLA ? 1 : 2;
    const size_t layer_bytes = parts * n_blocks * page_bytes;
    const size_t bytes = layer_bytes * n_layers;
    /* aligned_alloc wants a multiple of the alignment. */
    void *buffer = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!buffer) return NULL;
    memset(buffer, 0, bytes);
    char *base = buffer;
    for (uint32_t l = 0; l < n_layers; l++) {
        kvs_layer_view *v = &views[l];
        memset(v, 0, sizeof *v);
        v->struct_size = sizeof *v;
        v->device_kind = KVS_DEVICE_HOST;
        v->device_index = 0;
        v->n_blocks = n_blocks;
        char *layer = base + l * layer_bytes;
        switch (layout) {
            case KVS_TEST_LAYOUT_NHD:
                v->k_base = layer;
                v->v_base = layer + n_blocks * page_bytes;
                v->block_stride = (int64_t)page_bytes;
                v->token_stride = (int64_t)(n_heads * head_bytes);
                v->head_stride = (int64_t)head_bytes;
                break;
            case KVS_TEST_LAYOUT_HND:
                v->k_base = layer;
                v->v_base = layer + n_blocks * page_bytes;
                v->block_stride = (int64_t)page_bytes;
                v->token_stride = (int64_t)head_bytes;
                v->head_stride = (int64_t)(block_tokens * head_bytes);
                break;
            case KVS_TEST_LAYOUT_FLASHINFER:
                v->k_base = layer;
                v->v_base = layer + page_bytes;
                v->block_stride = (int64_t)(2 * page_bytes);
                v->token_stride = (int64_t)(n_heads * head_bytes);
                v->head_stride = (int64_t)head_bytes;
                break;
            case KVS_TEST_LAYOUT_MLA:
                v->k_base = layer;
                v->v_base = NULL;
                v->block_stride = (int64_t)page_bytes;
                v->token_stride = (int64_t)head_bytes;
                v->head_stride = (int64_t)head_bytes;
                break;
            case KVS_TEST_LAYOUT_CROSS_LAYER:
                /* Block-major: a block holds every layer's K and V pages back to back. */
                v->k_base = base + (size_t)l * 2 * page_bytes;
                v->v_base = (char *)v->k_base + page_bytes;
                v->block_stride = (int64_t)((size_t)n_layers * 2 * page_bytes);
                v->token_stride = (int64_t)(n_heads * head_bytes);
                v->head_stride = (int64_t)head_bytes;
                break;
            case KVS_TEST_LAYOUT_COUNT: break;
        }
    }
    if (bytes_out) *bytes_out = bytes;
    return buffer;
}

void kvs_test_free_kv_layout(void *buffer) {
    free(buffer);
}
