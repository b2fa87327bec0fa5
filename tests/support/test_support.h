/* test_support.h - helpers shared by the Check suites (not part of the library). */
#ifndef KVS_TEST_SUPPORT_H
#define KVS_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

/* Make a fresh directory under $TMPDIR (or /tmp) and return its path in buf. Returns 0 on success. */
int kvs_test_tmpdir(char *buf, size_t len);
/* Write `text` to dir/name; returns 0 on success and the full path in path_out. */
int kvs_test_write_file(const char *dir, const char *name, const char *text, char *path_out,
                        size_t path_len);
/* Remove a directory tree made by kvs_test_tmpdir. */
void kvs_test_rmtree(const char *dir);

/* Paged KV cache layouts an engine may use; each layer's view is described by strides only. */
typedef enum kvs_test_layout {                      /* bs = block_tokens, dim = head_dim */
                               KVS_TEST_LAYOUT_NHD, /* per layer [2, blocks, bs, heads, dim] (vLLM FlashAttention) */
                               KVS_TEST_LAYOUT_HND, /* per layer [2, blocks, heads, bs, dim] */
                               KVS_TEST_LAYOUT_FLASHINFER, /* per layer [blocks, 2, bs, heads, dim] */
                               KVS_TEST_LAYOUT_MLA, /* per layer [blocks, bs, latent]: n_heads 1, no V */
                               KVS_TEST_LAYOUT_CROSS_LAYER, /* one tensor [blocks, layers, 2, bs, heads, dim] */
                               KVS_TEST_LAYOUT_COUNT
} kvs_test_layout;

/* Lower-case name of a layout ("nhd", "cross_layer"), for messages. */
const char *kvs_test_layout_name(kvs_test_layout layout);

/* Allocate one zeroed, 64-byte aligned host buffer holding n_layers layers of `layout` and fill
 * views[0..n_layers) (host device) for it; head_dim is in elements of elem_bytes bytes (MLA: the
 * latent width, and n_heads must be 1). Per-layer layouts put layer l at l * (bytes / n_layers).
 * *bytes_out (may be NULL) gets the buffer size. Returns NULL on a bad argument or no memory.
 * Free with kvs_test_free_kv_layout. */
void *kvs_test_alloc_kv_layout(kvs_test_layout layout, uint32_t n_layers, uint32_t n_blocks,
                               uint32_t block_tokens, uint32_t n_heads, uint32_t head_dim,
                               uint32_t elem_bytes, kvs_layer_view *views, size_t *bytes_out);
/* Free a buffer from kvs_test_alloc_kv_layout; NULL is a no-op. */
void kvs_test_free_kv_layout(void *buffer);

#endif
