/*
 * ucx_remote_reply.c - a node's reply taken into the running job (ucx_remote_reply.h): the progress
 * thread's message handler and a stream node's answers both end here.
 */
#include "ucx_remote_reply.h"

#include <pthread.h>
#include <stdio.h>

void remote_take_reply(remote *r, rnode *nd, const kvs_wire_msg *m) {
    job *j = r->current;
    if (m->type == KVS_WIRE_ERROR) {
        snprintf(nd->refusal, sizeof nd->refusal, "%.*s", (int)m->error_text_len,
                 m->error_text ? m->error_text : "");
        if (nd->pending && m->request_id == nd->request_id) {
            nd->pending = 0;
            nd->failed = 1;
        }
        return;
    }
    if (!nd->pending || m->request_id != nd->request_id || !j)
        return; /* late reply of a past job */
    uint32_t want = m->type == KVS_WIRE_STATS_REPLY ? 0 : nd->n_batch;
    if (m->n_entries != want) {
        nd->pending = 0;
        nd->failed = 1;
        return;
    }
    for (uint32_t i = 0; i < m->n_entries; i++) {
        uint32_t k = nd->batch[i];
        const kvs_wire_entry *e = &m->entries[i];
        switch (m->type) {
            case KVS_WIRE_LOOKUP_REPLY:
                j->present[k] = e->present;
                j->resolved[k] = 1;
                break;
            case KVS_WIRE_GET_REPLY:
                j->statuses[k] = e->status;
                j->lens[k] = e->length;
                j->resolved[k] = 1;
                break;
            case KVS_WIRE_PUT_REPLY:
                if (k < r->n_put_jobs) {
                    pthread_mutex_lock(&r->mutex);
                    if (e->status == KVS_OK)
                        r->stats.puts_stored++;
                    else
                        r->stats.puts_refused++;
                    pthread_mutex_unlock(&r->mutex);
                }
                break;
            case KVS_WIRE_DELETE_REPLY:
                if (e->status != KVS_OK && e->status != KVS_ENOTFOUND) j->statuses[k] = e->status;
                break;
            default: break;
        }
    }
    if (m->type == KVS_WIRE_STATS_REPLY) {
        j->objects += m->counters[KVS_WIRE_STAT_OBJECTS];
        j->bytes += m->counters[KVS_WIRE_STAT_BYTES_USED];
    }
    nd->pending = 0;
}
