/*
 * ucx_remote_stream.c - the remote tier's requests on a node's stream (its control connection:
 * payloads stream, and every request with encrypt; stream.h): a GET with its answer, PUTs answered
 * later, and one-frame LOOKUP, DELETE and STATS. Progress thread only (ucx_remote_stream.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "stream.h"
#include "ucx_remote_nodes.h"
#include "ucx_remote_reply.h"
#include "ucx_remote_stream.h"

/* A GET of the node's batch: the request frame, then groups of records and bytes, each hit read
 * straight into its destination. On any error the node's batch fails (the stream is out of step:
 * the caller marks the node down). */
kvs_status remote_stream_get(remote *r, rnode *nd, job *j, const kvs_wire_msg *m,
                             uint64_t deadline) {
    char err[256] = "";
    kvs_status st = kvs_stream_write_msg(&nd->ctl, m, r->frame_buf, KVS_WIRE_MAX_MESSAGE_BYTES + 4,
                                         deadline, err, sizeof err);
    uint32_t done = 0;
    uint64_t hits = 0;
    while (st == KVS_OK && done < nd->n_batch) {
        uint8_t head[KVS_STREAM_GROUP_BYTES];
        uint32_t g = 0;
        st = kvs_stream_read(&nd->ctl, head, sizeof head, deadline, err, sizeof err);
        if (st == KVS_OK)
            st = kvs_stream_group_decode(head, m->request_id, nd->n_batch - done, &g, err,
                                         sizeof err);
        uint8_t(*records)[KVS_STREAM_RECORD_BYTES] = (void *)r->frame_buf;
        if (st == KVS_OK)
            st = kvs_stream_read(&nd->ctl, records, (size_t)g * KVS_STREAM_RECORD_BYTES, deadline,
                                 err, sizeof err);
        size_t n_iov = 0;
        for (uint32_t i = 0; st == KVS_OK && i < g; i++) {
            uint32_t k = nd->batch[done + i];
            kvs_status s;
            uint64_t len;
            kvs_stream_record_decode(records[i], &s, &len);
            if (s == KVS_OK && len > j->cap[k]) {
                snprintf(err, sizeof err, "an object of %llu bytes for a buffer of %llu",
                         (unsigned long long)len, (unsigned long long)j->cap[k]);
                st = KVS_ECORRUPT;
                break;
            }
            j->statuses[k] = s;
            j->lens[k] = len;
            if (s == KVS_OK && len) { /* back-to-back destinations read as one */
                struct iovec *last = n_iov ? &r->iov[n_iov - 1] : NULL;
                if (last && (uint8_t *)last->iov_base + last->iov_len == (uint8_t *)j->dsts[k])
                    last->iov_len += (size_t)len;
                else
                    r->iov[n_iov++] =
                        (struct iovec){.iov_base = j->dsts[k], .iov_len = (size_t)len};
            }
            hits += s == KVS_OK;
        }
        if (st == KVS_OK && n_iov)
            st = kvs_stream_readv(&nd->ctl, r->iov, n_iov, deadline, err, sizeof err);
        for (uint32_t i = 0; st == KVS_OK && i < g; i++) j->resolved[nd->batch[done + i]] = 1;
        done += g;
    }
    if (st != KVS_OK) {
        /* keys of this batch not yet resolved stay so: the next round asks their next home */
        for (uint32_t i = 0; i < nd->n_batch; i++)
            if (!j->resolved[nd->batch[i]]) j->statuses[nd->batch[i]] = KVS_ENOTFOUND;
        snprintf(nd->refusal, sizeof nd->refusal, "get on the stream: %s", err);
        return st;
    }
    j->stream_hits += hits;
    pthread_mutex_lock(&r->mutex);
    r->stats.stream_gets += hits;
    pthread_mutex_unlock(&r->mutex);
    return KVS_OK;
}

/* A PUT of the node's batch: the request frame and every object's bytes straight from the put
 * queue. Its answer is read later (remote_stream_drain): once written the bytes are the kernel's,
 * so the batch's queue room is free, and the next batch follows without a round trip. */
kvs_status remote_stream_put(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline) {
    char err[256] = "";
    kvs_status st = remote_stream_drain(r, nd, STREAM_PUTS_IN_FLIGHT - 1, deadline);
    if (st != KVS_OK) return st; /* the node is down: its refusal says why */
    st = kvs_stream_write_msg(&nd->ctl, m, r->frame_buf, KVS_WIRE_MAX_MESSAGE_BYTES + 4, deadline,
                              err, sizeof err);
    for (uint32_t b = 0; b < nd->n_batch; b++) {
        const job *pj = r->put_jobs[nd->batch[b]];
        r->iov[b] =
            (struct iovec){.iov_base = (void *)(uintptr_t)pj->object, .iov_len = (size_t)pj->len};
    }
    if (st == KVS_OK)
        st = kvs_stream_writev(&nd->ctl, r->iov, nd->n_batch, deadline, err, sizeof err);
    if (st != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "put on the stream: %s", err);
        return st;
    }
    nd->stream_out_id[nd->stream_out] = m->request_id;
    nd->stream_out_n[nd->stream_out++] = nd->n_batch;
    return KVS_OK;
}

/* A LOOKUP, DELETE or STATS of an encrypted node goes on its TLS stream (PUTs' answers before it
 * were drained by the caller); every node's is written before any answer is read, so the nodes
 * serve them at once, as over UCX. */
kvs_status remote_stream_call_send(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline) {
    char err[256] = "";
    kvs_status st = kvs_stream_write_msg(&nd->ctl, m, r->frame_buf, KVS_WIRE_MAX_MESSAGE_BYTES + 4,
                                         deadline, err, sizeof err);
    if (st != KVS_OK)
        snprintf(nd->refusal, sizeof nd->refusal, "%s on the stream: %s",
                 kvs_wire_type_name(m->type), err);
    return st;
}

/* Its answer, taken as a UCX reply would be (take_reply); a failure marks the node failed. An answer
 * already in reads by any deadline: a slow node before it costs the others nothing. */
void remote_stream_call_take(remote *r, rnode *nd, uint64_t deadline) {
    char err[256] = "";
    size_t len = 0;
    kvs_wire_msg rep;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    kvs_status st = kvs_stream_read_frame(&nd->ctl, r->frame_buf, KVS_WIRE_MAX_MESSAGE_BYTES, &len,
                                          deadline, err, sizeof err);
    if (st == KVS_OK && kvs_wire_decode(r->frame_buf, len, r->reply_entries, KVS_WIRE_MAX_KEYS,
                                        &rep, &why) != KVS_OK) {
        snprintf(err, sizeof err, "an unreadable answer: %s", why.text);
        st = KVS_ECORRUPT;
    }
    if (st == KVS_OK && rep.request_id != nd->request_id) {
        snprintf(err, sizeof err, "an answer to request %llu, not %llu",
                 (unsigned long long)rep.request_id, (unsigned long long)nd->request_id);
        st = KVS_ECORRUPT;
    }
    if (st != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "an answer on the stream: %s", err);
        nd->pending = 0;
        nd->failed = 1;
        return;
    }
    remote_take_reply(r, nd, &rep); /* clears pending, or sets failed for an ERROR */
}

kvs_status remote_stream_drain(remote *r, rnode *nd, uint32_t keep, uint64_t deadline) {
    char err[256] = "";
    while (nd->stream_out > keep) {
        size_t len = 0;
        kvs_status st = kvs_stream_read_frame(&nd->ctl, r->frame_buf, KVS_WIRE_MAX_MESSAGE_BYTES,
                                              &len, deadline, err, sizeof err);
        kvs_wire_msg rep;
        kvs_wire_refusal why;
        memset(&why, 0, sizeof why);
        if (st == KVS_OK && kvs_wire_decode(r->frame_buf, len, r->reply_entries, KVS_WIRE_MAX_KEYS,
                                            &rep, &why) != KVS_OK) {
            snprintf(err, sizeof err, "an unreadable answer: %s", why.text);
            st = KVS_ECORRUPT;
        }
        if (st == KVS_OK &&
            (rep.type != KVS_WIRE_PUT_REPLY || rep.request_id != nd->stream_out_id[0] ||
             rep.n_entries != nd->stream_out_n[0])) {
            snprintf(err, sizeof err,
                     "a %s of %u entries for request %llu, not the put_reply of %u for %llu",
                     kvs_wire_type_name(rep.type), rep.n_entries,
                     (unsigned long long)rep.request_id, nd->stream_out_n[0],
                     (unsigned long long)nd->stream_out_id[0]);
            st = KVS_ECORRUPT;
        }
        if (st != KVS_OK) {
            char why_down[320];
            snprintf(why_down, sizeof why_down, "the answer to a put on the stream: %s", err);
            snprintf(nd->refusal, sizeof nd->refusal, "%s", why_down);
            remote_node_down(r, nd, why_down); /* counts the unanswered copies dropped */
            return st;
        }
        uint64_t stored = 0;
        for (uint32_t i = 0; i < rep.n_entries; i++) stored += rep.entries[i].status == KVS_OK;
        pthread_mutex_lock(&r->mutex);
        r->stats.puts_stored += stored;
        r->stats.puts_refused += rep.n_entries - stored;
        pthread_mutex_unlock(&r->mutex);
        memmove(nd->stream_out_id, nd->stream_out_id + 1,
                (nd->stream_out - 1) * sizeof nd->stream_out_id[0]);
        memmove(nd->stream_out_n, nd->stream_out_n + 1,
                (nd->stream_out - 1) * sizeof nd->stream_out_n[0]);
        nd->stream_out--;
    }
    return KVS_OK;
}
