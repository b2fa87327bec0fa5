/* fuzz_wire.c - libFuzzer target: any bytes as a control message (every type: HELLO, CHALLENGE,
 * AUTH, AUTH_OK, requests and replies), as a payload message header and as a stream GET answer's
 * group header and record. Each is decoded cleanly or refused; what decodes encodes again to bytes
 * that decode to the same message. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ucx/stream.h"
#include "backends/ucx/wire.h"

static kvs_wire_entry entries[KVS_WIRE_MAX_KEYS], again_entries[KVS_WIRE_MAX_KEYS];
static uint8_t encoded[KVS_WIRE_MAX_MESSAGE_BYTES];

static void same_or_abort(const kvs_wire_msg *a, const kvs_wire_msg *b) {
    if (a->type != b->type || a->request_id != b->request_id || a->n_entries != b->n_entries ||
        a->tenant_len != b->tenant_len || a->worker_addr_len != b->worker_addr_len)
        abort();
    for (uint32_t i = 0; i < a->n_entries; i++)
        if (a->entries[i].length != b->entries[i].length ||
            a->entries[i].status != b->entries[i].status)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kvs_wire_msg msg, back;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(data, size, entries, KVS_WIRE_MAX_KEYS, &msg, &why) == KVS_OK) {
        size_t len = 0;
        if (kvs_wire_encode(&msg, encoded, sizeof encoded, &len, NULL) != KVS_OK) abort();
        if (kvs_wire_decode(encoded, len, again_entries, KVS_WIRE_MAX_KEYS, &back, &why) != KVS_OK)
            abort();
        same_or_abort(&msg, &back);
    }
    kvs_wire_payload h;
    for (uint32_t kind = KVS_WIRE_PAYLOAD_GET; kind <= KVS_WIRE_PAYLOAD_PUT; kind++)
        (void)kvs_wire_payload_decode(data, size, kind, &h, &why);
    if (size >= KVS_STREAM_GROUP_BYTES) {
        uint32_t count = 0;
        char err[128];
        uint64_t id = 0; /* the request id the reader expects: the input's last 8 bytes */
        if (size >= KVS_STREAM_GROUP_BYTES + sizeof id)
            memcpy(&id, data + size - sizeof id, sizeof id);
        if (kvs_stream_group_decode(data, id, 1024, &count, err, sizeof err) == KVS_OK &&
            (count == 0 || count > 1024))
            abort();
    }
    if (size >= KVS_STREAM_RECORD_BYTES) {
        kvs_status st;
        uint64_t length;
        kvs_stream_record_decode(data, &st, &length);
    }
    return 0;
}
