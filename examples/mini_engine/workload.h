/* workload.h - multi-turn chat sessions: a seeded ShareGPT-like generator or a JSONL trace. A turn
 * only holds its new user tokens; the engine builds the prompt as the session's history (shared
 * system prompt, optional document, earlier turns and their generated outputs) plus those tokens. */
#ifndef MINI_WORKLOAD_H
#define MINI_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct workload_params {
    int vocab;
    uint64_t seed;
    int system_tokens; /* shared by every session */
    int doc_tokens;    /* per-session document before the first user turn (generator only) */
    int user_tokens;   /* mean new user tokens per turn */
    int output_tokens; /* tokens generated per turn unless a trace line says otherwise */
    int sessions;
    int turns;
    const uint8_t *text; /* NULL: random token ids; else prompts are slices of these bytes */
    size_t text_len;     /* > 0 with text; every byte below vocab */
} workload_params;

typedef struct workload_turn {
    int session;   /* index into workload.session_names */
    int turn;      /* 0 for the session's first turn */
    int32_t *user; /* new user tokens (owned) */
    int n_user;
    int output_tokens; /* tokens to generate, >= 1 */
} workload_turn;

typedef struct workload {
    int32_t *system; /* shared system prompt */
    int n_system;
    int n_sessions;
    char **session_names;
    int32_t **docs; /* per session, prepended after the system prompt in its first turn */
    int *n_docs;
    workload_turn *turns; /* in arrival order */
    int n_turns;
} workload;

/* Sessions interleaved round-robin: turn 0 of every session, then turn 1, ... */
int workload_generate(const workload_params *p, workload *out, char *err, size_t err_len);
/* One turn per JSONL line: {"session": "s1", "user_tokens": 120, "output_tokens": 16} or with
 * "user": [ids]. Errors name file:line. Every session starts with the shared system prompt. */
int workload_load_trace(const char *path, const workload_params *p, workload *out, char *err,
                        size_t err_len);
void workload_free(workload *w);

/* Tokens of the longest prompt and of the largest final history per session, summed: for sizing. */
void workload_sizes(const workload *w, uint64_t *max_prompt, uint64_t *max_request,
                    uint64_t *total_history);

#endif
