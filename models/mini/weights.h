/* weights.h - trained weights for the mini engine's model (--weights FILE), written by
 * models/mini/train/train.py.
 *
 * The KVSW format, little-endian throughout:
 *   char magic[8] = "KVSWGT01"; u32 version = 1; u32 dim, layers, heads, kv_heads, ffn, vocab;
 *   u32 prompt_len, desc_len, reserved = 0;
 *   desc_len bytes of JSON describing the training run (corpus, licence, validation loss, ...);
 *   the weights as fp32 in the model's input-major order (model.h, model_weights_floats);
 *   prompt_len tokens (one byte each: the tokenizer is bytes) and vocab fp32 logits the trainer
 *   computed for the prompt's last position, so a loader can check it computes the same model;
 *   u64 FNV-1a of every byte before it.
 * A file is taken whole or not at all: its size, checksum and shape are checked before any weight
 * is used. */
#ifndef MINI_WEIGHTS_H
#define MINI_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

typedef struct weights_file {
    model_config config; /* seed 0, GQA */
    const float *floats; /* model_weights_floats(&config) of them, 4-byte aligned */
    const uint8_t *prompt;
    uint32_t prompt_len;
    const float *ref_logits; /* vocab of them */
    char *desc;              /* NUL-terminated JSON */
    void *mem;               /* the file's bytes */
    size_t mem_len;
} weights_file;

/* Read and check path. 0, or -1 with a sentence in err (nothing to free). */
int weights_load(const char *path, weights_file *out, char *err, size_t err_len);
/* The same from bytes already in memory (copied). */
int weights_parse(const void *bytes, size_t len, weights_file *out, char *err, size_t err_len);
void weights_free(weights_file *w);

/* A file shipped with the build (the checkpoint mini-256.kvsw, its text sample mini-256.sample.txt):
 * <exe dir>/../share/kvstrata/NAME, else the source tree's models/mini/train/NAME. Writes
 * the path into buf and returns buf, or NULL if neither exists. */
const char *weights_default_file(const char *name, char *buf, size_t len);

/* Run tokens[0..n) through m from an empty fp32 cache, the prompt as one step; out gets the logits
 * of positions [first, n), n - first rows of vocab floats. 0, or -1 and a sentence. The reference
 * other runs of the same model are held to (the trainer's file, llama.cpp). */
int weights_prompt_logits(const model *m, const int32_t *tokens, int n, int first, float *out,
                          char *err, size_t err_len);

/* Run the file's reference prompt through m (built from w) and compare the last position's logits
 * with the trainer's: 0 when every one is within 1e-3 of the largest magnitude, else -1 and a
 * sentence. *max_diff gets the largest difference either way. */
int weights_check(const weights_file *w, const model *m, float *max_diff, char *err,
                  size_t err_len);

/* Read a text file for --text (at most 64 MiB, not empty); byte tokens need vocab >= 256. */
int text_load(const char *path, int vocab, uint8_t **text, size_t *len, char *err, size_t err_len);

#endif
