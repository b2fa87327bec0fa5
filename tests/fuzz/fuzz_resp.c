/* fuzz_resp.c - libFuzzer target: any bytes as what a Redis server answers. The reply parser either
 * parses a reply within the bytes, waits for more, or refuses; a parsed reply's nodes stay inside the
 * input and their subtrees nest; the same bytes parse the same way when given one byte at a time;
 * a parsed reply read as a CLUSTER SLOTS map yields only valid ranges. Built and run by
 * tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/resp.h"
#include "backends/redis/slots.h"

static kvs_resp_node nodes[512];
static kvs_redis_slot_range ranges[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *buf = (const char *)data;
    uint32_t n = 0;
    size_t used = 0;
    kvs_resp_result r = kvs_resp_parse(buf, size, 1 << 16, nodes, 512, &n, &used, NULL);
    if (r == KVS_RESP_DONE) {
        if (used == 0 || used > size || n == 0) abort();
        for (uint32_t i = 0; i < n; i++) {
            if (nodes[i].next <= i || nodes[i].next > n) abort();
            if (nodes[i].len && (nodes[i].text < buf || nodes[i].text + nodes[i].len > buf + used))
                abort();
        }
        if (nodes[0].next != n) abort();
        /* a prefix of a parsed reply is never a different whole reply */
        for (size_t cut = 0; cut < used; cut++) {
            uint32_t m = 0;
            size_t u = 0;
            if (kvs_resp_parse(buf, cut, 1 << 16, nodes + 256, 256, &m, &u, NULL) == KVS_RESP_DONE)
                abort();
        }
        uint32_t nr = 0;
        char why[200];
        if (kvs_redis_slots_parse(nodes, n, "h", ranges, 64, &nr, why, sizeof why) == 0)
            for (uint32_t i = 0; i < nr; i++)
                if (ranges[i].first > ranges[i].last || ranges[i].last >= KVS_REDIS_SLOTS ||
                    ranges[i].port == 0 || ranges[i].host[0] == '\0')
                    abort();
    } else if (r != KVS_RESP_INCOMPLETE && r != KVS_RESP_MALFORMED) {
        abort();
    }
    kvs_resp_node h;
    size_t line = 0;
    if (kvs_resp_header(buf, size, &h, &line, NULL) == KVS_RESP_DONE && (line < 3 || line > size))
        abort();
    (void)kvs_redis_key_slot(buf, size);
    return 0;
}
