/* workload.c - the session generator and the JSONL trace reader. */
#include "workload.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64* seeded through splitmix64, one stream per (purpose, session, turn). */
typedef struct rng {
    uint64_t s;
} rng;

static uint64_t splitmix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static rng rng_stream(uint64_t seed, uint64_t purpose, uint64_t a, uint64_t b) {
    rng r = {splitmix(splitmix(splitmix(seed ^ purpose) ^ a) ^ b)};
    if (r.s == 0) r.s = 1;
    return r;
}

static uint64_t rng_next(rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

enum { STREAM_SYSTEM = 1, STREAM_DOC = 2, STREAM_USER = 3, STREAM_LENGTH = 4 };

static int32_t *random_tokens(rng *r, int n, int vocab) {
    int32_t *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rng_next(r) % (uint64_t)vocab);
    return t;
}

/* n tokens: random ids, or with a text the bytes of a slice of it at a seeded offset (wrapping at
 * its end), so a trained byte-level model reads prose. */
static int32_t *draw_tokens(const workload_params *p, rng *r, int n) {
    if (!p->text) return random_tokens(r, n, p->vocab);
    int32_t *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!t) return NULL;
    size_t at = (size_t)(rng_next(r) % (uint64_t)p->text_len);
    for (int i = 0; i < n; i++) t[i] = p->text[(at + (size_t)i) % p->text_len];
    return t;
}

static void set_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

void workload_free(workload *w) {
    if (!w) return;
    free(w->system);
    for (int s = 0; s < w->n_sessions; s++) {
        if (w->session_names) free(w->session_names[s]);
        if (w->docs) free(w->docs[s]);
    }
    free(w->session_names);
    free(w->docs);
    free(w->n_docs);
    for (int t = 0; t < w->n_turns; t++) free(w->turns[t].user);
    free(w->turns);
    memset(w, 0, sizeof *w);
}

static int init_system(const workload_params *p, workload *w) {
    rng r = rng_stream(p->seed, STREAM_SYSTEM, 0, 0);
    w->n_system = p->system_tokens;
    w->system = draw_tokens(p, &r, p->system_tokens);
    return w->system ? 0 : -1;
}

int workload_generate(const workload_params *p, workload *w, char *err, size_t err_len) {
    memset(w, 0, sizeof *w);
    if (p->sessions < 1 || p->turns < 1 || p->user_tokens < 0 || p->system_tokens < 0 ||
        p->doc_tokens < 0 || p->output_tokens < 1) {
        set_err(err, err_len,
                "--sessions and --turns must be positive, token counts non-negative, "
                "--decode-tokens at least 1");
        return -1;
    }
    if (init_system(p, w) != 0) goto nomem;
    w->n_sessions = p->sessions;
    w->session_names = calloc((size_t)p->sessions, sizeof *w->session_names);
    w->docs = calloc((size_t)p->sessions, sizeof *w->docs);
    w->n_docs = calloc((size_t)p->sessions, sizeof *w->n_docs);
    w->turns = calloc((size_t)p->sessions * (size_t)p->turns, sizeof *w->turns);
    if (!w->session_names || !w->docs || !w->n_docs || !w->turns) goto nomem;
    for (int s = 0; s < p->sessions; s++) {
        char name[32];
        snprintf(name, sizeof name, "s%d", s);
        w->session_names[s] = strdup(name);
        rng r = rng_stream(p->seed, STREAM_DOC, (uint64_t)s, 0);
        w->docs[s] = draw_tokens(p, &r, p->doc_tokens);
        w->n_docs[s] = p->doc_tokens;
        if (!w->session_names[s] || !w->docs[s]) goto nomem;
    }
    for (int k = 0; k < p->turns; k++) {
        for (int s = 0; s < p->sessions; s++) {
            workload_turn *t = &w->turns[w->n_turns++];
            /* Lengths vary uniformly over [mean/2, 3*mean/2], at least one token. */
            rng len = rng_stream(p->seed, STREAM_LENGTH, (uint64_t)s, (uint64_t)k);
            int n = p->user_tokens / 2 + (int)(rng_next(&len) % (uint64_t)(p->user_tokens + 1));
            if (n < 1) n = 1;
            rng r = rng_stream(p->seed, STREAM_USER, (uint64_t)s, (uint64_t)k);
            t->session = s;
            t->turn = k;
            t->n_user = n;
            t->user = draw_tokens(p, &r, n);
            t->output_tokens = p->output_tokens;
            if (!t->user) goto nomem;
        }
    }
    return 0;
nomem:
    set_err(err, err_len, "workload: out of memory");
    workload_free(w);
    return -1;
}

/* JSONL trace -------------------------------------------------------------------------------------- */

typedef struct cursor {
    const char *p;
    const char *file;
    long line;
    char *err;
    size_t err_len;
} cursor;

static void skip_ws(cursor *c) {
    while (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n') c->p++;
}

static int fail(cursor *c, const char *what) {
    set_err(c->err, c->err_len, "%s:%ld: %s", c->file, c->line, what);
    return -1;
}

static int expect(cursor *c, char ch) {
    skip_ws(c);
    if (*c->p != ch) {
        char msg[64];
        snprintf(msg, sizeof msg, "expected '%c'", ch);
        return fail(c, msg);
    }
    c->p++;
    return 0;
}

/* A JSON string into out[0..cap); \uXXXX outside ASCII is refused (names here are plain). */
static int parse_string(cursor *c, char *out, size_t cap) {
    size_t n = 0;
    if (expect(c, '"') != 0) return -1;
    for (;;) {
        char ch = *c->p++;
        if (ch == '\0') return fail(c, "unterminated string");
        if (ch == '"') break;
        if ((unsigned char)ch < 0x20) return fail(c, "control character in a string");
        if (ch == '\\') {
            char e = *c->p++;
            switch (e) {
                case '"':
                case '\\':
                case '/': ch = e; break;
                case 'b': ch = '\b'; break;
                case 'f': ch = '\f'; break;
                case 'n': ch = '\n'; break;
                case 'r': ch = '\r'; break;
                case 't': ch = '\t'; break;
                case 'u': {
                    unsigned v = 0;
                    for (int i = 0; i < 4; i++) {
                        char h = *c->p++;
                        if (!isxdigit((unsigned char)h)) return fail(c, "bad \\u escape");
                        v = v * 16u + (unsigned)(isdigit((unsigned char)h)
                                                     ? h - '0'
                                                     : (tolower((unsigned char)h) - 'a' + 10));
                    }
                    if (v == 0 || v > 0x7f) return fail(c, "\\u escapes are limited to ASCII");
                    ch = (char)v;
                    break;
                }
                default: return fail(c, "bad escape in a string");
            }
        }
        if (n + 1 >= cap) return fail(c, "string too long");
        out[n++] = ch;
    }
    out[n] = '\0';
    return 0;
}

/* A JSON integer (no fraction or exponent). */
static int parse_int(cursor *c, long long *out) {
    skip_ws(c);
    const char *start = c->p;
    if (*c->p == '-') c->p++;
    if (!isdigit((unsigned char)*c->p)) return fail(c, "expected an integer");
    while (isdigit((unsigned char)*c->p)) c->p++;
    if (*c->p == '.' || *c->p == 'e' || *c->p == 'E')
        return fail(c, "expected an integer, not a fraction");
    if (c->p - start > 18) return fail(c, "integer out of range");
    *out = strtoll(start, NULL, 10);
    return 0;
}

typedef struct trace_line {
    char session[128];
    int have_session, have_user, have_user_tokens, have_output;
    long long user_tokens, output_tokens;
    int32_t *user;
    int n_user, cap_user;
} trace_line;

static int parse_user_array(cursor *c, trace_line *tl, int vocab) {
    if (expect(c, '[') != 0) return -1;
    skip_ws(c);
    if (*c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        long long v;
        if (parse_int(c, &v) != 0) return -1;
        if (v < 0 || v >= vocab) {
            char msg[96];
            snprintf(msg, sizeof msg, "token id %lld out of range [0, %d)", v, vocab);
            return fail(c, msg);
        }
        if (tl->n_user == tl->cap_user) {
            int cap = tl->cap_user ? tl->cap_user * 2 : 256;
            int32_t *grown = realloc(tl->user, (size_t)cap * sizeof *grown);
            if (!grown) return fail(c, "out of memory");
            tl->user = grown;
            tl->cap_user = cap;
        }
        tl->user[tl->n_user++] = (int32_t)v;
        skip_ws(c);
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        return expect(c, ']');
    }
}

static int parse_line(cursor *c, trace_line *tl, int vocab) {
    if (expect(c, '{') != 0) return -1;
    skip_ws(c);
    if (*c->p == '}')
        return fail(c, "empty object: a turn needs \"session\" and \"user\" or \"user_tokens\"");
    for (;;) {
        char key[64];
        if (parse_string(c, key, sizeof key) != 0 || expect(c, ':') != 0) return -1;
        skip_ws(c);
        int *seen;
        if (strcmp(key, "session") == 0)
            seen = &tl->have_session;
        else if (strcmp(key, "user_tokens") == 0)
            seen = &tl->have_user_tokens;
        else if (strcmp(key, "output_tokens") == 0)
            seen = &tl->have_output;
        else if (strcmp(key, "user") == 0)
            seen = &tl->have_user;
        else {
            char msg[128];
            snprintf(msg, sizeof msg, "unknown key \"%s\"", key);
            return fail(c, msg);
        }
        if (*seen) {
            char msg[128];
            snprintf(msg, sizeof msg, "duplicate key \"%s\"", key);
            return fail(c, msg);
        }
        *seen = 1;
        if (seen == &tl->have_session) {
            if (*c->p == '"') {
                if (parse_string(c, tl->session, sizeof tl->session) != 0) return -1;
                if (tl->session[0] == '\0') return fail(c, "empty session name");
            } else {
                long long v;
                if (parse_int(c, &v) != 0) return -1;
                snprintf(tl->session, sizeof tl->session, "%lld", v);
            }
        } else if (seen == &tl->have_user_tokens) {
            if (parse_int(c, &tl->user_tokens) != 0) return -1;
            if (tl->user_tokens < 0 || tl->user_tokens > (1 << 20))
                return fail(c, "\"user_tokens\" must lie in [0, 1048576]");
        } else if (seen == &tl->have_output) {
            if (parse_int(c, &tl->output_tokens) != 0) return -1;
            if (tl->output_tokens < 1 || tl->output_tokens > (1 << 16))
                return fail(c, "\"output_tokens\" must lie in [1, 65536]");
        } else if (parse_user_array(c, tl, vocab) != 0) {
            return -1;
        }
        skip_ws(c);
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (expect(c, '}') != 0) return -1;
        break;
    }
    skip_ws(c);
    if (*c->p != '\0') return fail(c, "trailing characters after the object (one turn per line)");
    if (!tl->have_session) return fail(c, "missing \"session\"");
    if (tl->have_user == tl->have_user_tokens)
        return fail(c, "give exactly one of \"user\" (token ids) and \"user_tokens\" (a count)");
    if (tl->have_user && tl->n_user == 0) return fail(c, "\"user\" is empty");
    if (tl->have_user_tokens && tl->user_tokens == 0)
        return fail(c, "\"user_tokens\" must be at least 1");
    return 0;
}

int workload_load_trace(const char *path, const workload_params *p, workload *w, char *err,
                        size_t err_len) {
    memset(w, 0, sizeof *w);
    FILE *f = fopen(path, "r");
    if (!f) {
        set_err(err, err_len, "%s: cannot open the trace (%s)", path, strerror(errno));
        return -1;
    }
    if (init_system(p, w) != 0) goto nomem;
    char *line = NULL;
    size_t line_cap = 0;
    int cap_turns = 0, cap_sessions = 0;
    int *turns_seen = NULL;
    cursor c = {.file = path, .err = err, .err_len = err_len};
    trace_line tl = {0};
    int rc = -1;
    while (getline(&line, &line_cap, f) >= 0) {
        c.line++;
        c.p = line;
        skip_ws(&c);
        if (*c.p == '\0') continue; /* blank line */
        free(tl.user);
        memset(&tl, 0, sizeof tl);
        if (parse_line(&c, &tl, p->vocab) != 0) goto out;

        int s = 0;
        while (s < w->n_sessions && strcmp(w->session_names[s], tl.session) != 0) s++;
        if (s == w->n_sessions) {
            if (s == cap_sessions) {
                cap_sessions = cap_sessions ? cap_sessions * 2 : 16;
                char **names = realloc(w->session_names, (size_t)cap_sessions * sizeof *names);
                if (names) w->session_names = names;
                int *seen = realloc(turns_seen, (size_t)cap_sessions * sizeof *seen);
                if (seen) turns_seen = seen;
                if (!names || !seen) goto out_nomem;
            }
            w->session_names[s] = strdup(tl.session);
            if (!w->session_names[s]) goto out_nomem;
            turns_seen[s] = 0;
            w->n_sessions++;
        }
        if (w->n_turns == cap_turns) {
            cap_turns = cap_turns ? cap_turns * 2 : 64;
            workload_turn *grown = realloc(w->turns, (size_t)cap_turns * sizeof *grown);
            if (!grown) goto out_nomem;
            w->turns = grown;
        }
        workload_turn *t = &w->turns[w->n_turns];
        memset(t, 0, sizeof *t);
        t->session = s;
        t->turn = turns_seen[s]++;
        t->output_tokens = tl.have_output ? (int)tl.output_tokens : p->output_tokens;
        if (tl.have_user) {
            t->user = tl.user;
            t->n_user = tl.n_user;
            tl.user = NULL;
        } else {
            rng r = rng_stream(p->seed, STREAM_USER, (uint64_t)s, (uint64_t)t->turn);
            t->n_user = (int)tl.user_tokens;
            t->user = draw_tokens(p, &r, t->n_user);
            if (!t->user) goto out_nomem;
        }
        w->n_turns++;
    }
    if (ferror(f)) {
        set_err(err, err_len, "%s: read error (%s)", path, strerror(errno));
        goto out;
    }
    if (w->n_turns == 0) {
        set_err(err, err_len, "%s: the trace holds no turns", path);
        goto out;
    }
    /* Trace sessions have no document: their first user turn plays that part. */
    w->docs = calloc((size_t)w->n_sessions, sizeof *w->docs);
    w->n_docs = calloc((size_t)w->n_sessions, sizeof *w->n_docs);
    if (!w->docs || !w->n_docs) goto out_nomem;
    rc = 0;
    goto out;
out_nomem:
    set_err(err, err_len, "%s:%ld: out of memory", path, c.line);
out:
    free(tl.user);
    free(line);
    free(turns_seen);
    fclose(f);
    if (rc != 0) workload_free(w);
    return rc;
nomem:
    fclose(f);
    set_err(err, err_len, "workload: out of memory");
    workload_free(w);
    return -1;
}

void workload_sizes(const workload *w, uint64_t *max_prompt, uint64_t *max_request,
                    uint64_t *total_history) {
    uint64_t *history = calloc((size_t)w->n_sessions, sizeof *history);
    uint64_t mp = 0, mr = 0, total = 0;
    if (history) {
        for (int s = 0; s < w->n_sessions; s++)
            history[s] = (uint64_t)w->n_system + (uint64_t)w->n_docs[s];
        for (int i = 0; i < w->n_turns; i++) {
            const workload_turn *t = &w->turns[i];
            uint64_t prompt = history[t->session] + (uint64_t)t->n_user;
            uint64_t request = prompt + (uint64_t)t->output_tokens;
            if (prompt > mp) mp = prompt;
            if (request > mr) mr = request;
            history[t->session] = request;
        }
        for (int s = 0; s < w->n_sessions; s++) total += history[s];
    }
    free(history);
    *max_prompt = mp;
    *max_request = mr;
    *total_history = total;
}
