/* ucx_remote_progress.h - the remote tier's progress thread (ucx_remote_progress.c). */
#ifndef KVS_UCX_REMOTE_PROGRESS_H
#define KVS_UCX_REMOTE_PROGRESS_H

/* The thread's body (arg: the remote): starts UCX and connects the nodes, reports r->ready, then
 * runs queued jobs until r->stopping and the queue is drained. */
void *remote_progress_main(void *arg);

#endif
