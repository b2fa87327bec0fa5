/* profile.h - measure the coefficients of the restore planner's cost model for this engine and the
 * configured tier, and write them as a restore profile (docs/cacheflow.md). */
#ifndef MINI_PROFILE_H
#define MINI_PROFILE_H

#include <stdint.h>

#include "examples/mini_engine/engine.h"

/* e: an engine with an open connector (no restore planner configured), pages for max_tokens and a
 * scratch for prefill_chunk tokens over max_tokens of context. Measures forwards at several sizes and
 * offsets, stores a max_tokens prompt and restores prefixes of it; writes the profile to out_path
 * with tier_name as the name of the tier that served the loads. Returns 0, or -1 after printing why. */
int profile_run(engine *e, uint64_t max_tokens, const char *tier_name, const char *out_path);

#endif
