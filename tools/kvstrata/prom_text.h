/* prom_text.h - Prometheus's text exposition format (0.0.4), read: each sample line as a name, its
 * labels and a value. Comment, HELP and TYPE lines are skipped. Text from the network: every
 * length is bounded, a malformed line fails the whole text with its line number. */
#ifndef KVS_PROM_TEXT_H
#define KVS_PROM_TEXT_H

#include <stddef.h>

#define PROM_NAME_MAX   128
#define PROM_LABELS_MAX 8
#define PROM_VALUE_MAX  256

typedef struct prom_sample {
    char name[PROM_NAME_MAX];
    int n_labels;
    char label[PROM_LABELS_MAX][PROM_NAME_MAX];
    char label_value[PROM_LABELS_MAX][PROM_VALUE_MAX]; /* unescaped */
    double value;
} prom_sample;

/* Calls fn(ctx, sample) for each sample of text[0..len). 0, or -1 with err set. */
int prom_parse(const char *text, size_t len, void (*fn)(void *ctx, const prom_sample *s), void *ctx,
               char *err, size_t err_len);
/* The value of label name in s, NULL when s has none. */
const char *prom_label(const prom_sample *s, const char *name);

#endif
