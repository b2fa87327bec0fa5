/* slots.c - key slots and CLUSTER SLOTS replies (contract in slots.h). */
#include "slots.h"

#include <stdio.h>
#include <string.h>

uint16_t kvs_redis_crc16(const void *data, size_t len) {
    const uint8_t *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc = (uint16_t)(crc ^ (uint16_t)(p[i] << 8));
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

uint16_t kvs_redis_key_slot(const char *key, size_t len) {
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return (uint16_t)(kvs_redis_crc16(open + 1, (size_t)(close - open - 1)) &
                              (KVS_REDIS_SLOTS - 1));
    }
    return (uint16_t)(kvs_redis_crc16(key, len) & (KVS_REDIS_SLOTS - 1));
}

static int text_copy(const kvs_resp_node *node, char *out, size_t cap) {
    if ((node->kind != KVS_RESP_BULK && node->kind != KVS_RESP_STATUS) || node->len >= cap)
        return -1;
    for (uint64_t i = 0; i < node->len; i++)
        if (node->text[i] == '\0' || node->text[i] == ' ' || node->text[i] == '\r' ||
            node->text[i] == '\n' || node->text[i] == '/')
            return -1;
    memcpy(out, node->text, node->len);
    out[node->len] = '\0';
    return 0;
}

int kvs_redis_slots_parse(const kvs_resp_node *nodes, uint32_t n, const char *asked_host,
                          kvs_redis_slot_range *out, uint32_t cap, uint32_t *n_out, char *why,
                          size_t why_len) {
    *n_out = 0;
    if (n == 0 || nodes[0].kind != KVS_RESP_ARRAY) {
        snprintf(why, why_len, "CLUSTER SLOTS did not answer an array");
        return -1;
    }
    uint32_t at = 1;
    for (int64_t r = 0; r < nodes[0].integer; r++) {
        const kvs_resp_node *range = &nodes[at];
        uint32_t end = range->next;
        if (range->kind != KVS_RESP_ARRAY || range->integer < 3 || end > n) {
            snprintf(why, why_len, "CLUSTER SLOTS range %lld is not [first, last, master, ...]",
                     (long long)r);
            return -1;
        }
        const kvs_resp_node *first = &nodes[at + 1], *last = &nodes[first->next];
        const kvs_resp_node *master = &nodes[last->next];
        if (first->kind != KVS_RESP_INTEGER || last->kind != KVS_RESP_INTEGER ||
            first->integer < 0 || last->integer >= KVS_REDIS_SLOTS ||
            first->integer > last->integer) {
            snprintf(why, why_len, "CLUSTER SLOTS range %lld has bad slot numbers", (long long)r);
            return -1;
        }
        if (master->kind != KVS_RESP_ARRAY || master->integer < 2) {
            snprintf(why, why_len, "CLUSTER SLOTS range %lld has no [host, port] master",
                     (long long)r);
            return -1;
        }
        const kvs_resp_node *host = &nodes[last->next + 1], *port = &nodes[host->next];
        if (*n_out == cap) {
            snprintf(why, why_len, "CLUSTER SLOTS has more than %u ranges", cap);
            return -1;
        }
        kvs_redis_slot_range *o = &out[*n_out];
        if (port->kind != KVS_RESP_INTEGER || port->integer < 1 || port->integer > 65535 ||
            text_copy(host, o->host, sizeof o->host) != 0) {
            snprintf(why, why_len, "CLUSTER SLOTS range %lld has a bad master address",
                     (long long)r);
            return -1;
        }
        if (o->host[0] == '\0' || strcmp(o->host, "?") == 0) {
            if (strlen(asked_host) >= sizeof o->host) {
                snprintf(why, why_len, "the host asked is too long");
                return -1;
            }
            snprintf(o->host, sizeof o->host, "%s", asked_host);
        }
        o->first = (uint16_t)first->integer;
        o->last = (uint16_t)last->integer;
        o->port = (uint16_t)port->integer;
        (*n_out)++;
        at = end;
    }
    return 0;
}
