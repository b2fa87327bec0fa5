/* sparse_decode.h - kvs-mini-research --sparse-decode: one long prompt prefilled and saved through
 * the connector, then decoded attending per KV head to the sink, the recent rows and the top-k rows
 * the connector selects and reads from the tiers into a head cache (ABI 1.9, docs/sparse.md).
 * --verify replays the same rows from the prefill's own KV (the logits bit for bit); full attention
 * gives the top-1 agreement and the attention error, and the decode rates side by side. */
#ifndef MINI_SPARSE_DECODE_H
#define MINI_SPARSE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "models/mini/model.h"
#include "research.h"

/* 0 when every check passed, 1 when one failed or the run could not be made, 2 for a model it
 * cannot decode (MLA). text/text_len: --text's bytes for the prompt, or NULL (seeded tokens). */
int sparse_decode_run(const options *o, const research *x, const model *m, const uint8_t *text,
                      size_t text_len);

#endif
