#include "inspect_kv.h"

#include "abi/kvstrata_server.h"

static int describe(void *ctx, const uint8_t *head, uint64_t head_len, uint64_t object_len,
                    kvs_ssd_inspect_object *o) {
    (void)ctx;
    (void)object_len;
    kvs_server_object_info info;
    if (!kvs_server_object_describe(head, head_len, &info)) return 0;
    o->fingerprint = info.fingerprint;
    o->n_layers = info.n_layers;
    o->n_tokens = info.n_tokens;
    o->codec = info.codec;
    return 1;
}

static int check(void *ctx, const uint8_t *obj, uint64_t len, char *what, size_t what_len) {
    (void)ctx;
    return kvs_server_object_check(obj, len, what, what_len);
}

const kvs_ssd_inspect_content *cli_inspect_kv_content(void) {
    static kvs_ssd_inspect_content content = {.describe = describe, .check = check};
    content.head_bytes = kvs_server_object_head_bytes();
    return &content;
}
