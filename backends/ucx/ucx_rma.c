/* ucx_rma.c - the transport's memory registration, remote keys and RMA (see ucx_transport.h): every
 * transfer of a batch is issued at once and waited for by one timeout; puts flush once at the end.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ucx_transport_internal.h"

kvs_status kvs_ucx_mem_register(kvs_ucx_transport *t, void *addr, size_t len, kvs_ucx_mem **out) {
    if (out) *out = NULL;
    if (!t || !addr || len == 0 || !out) return KVS_EINVAL;
    kvs_ucx_mem *mem = calloc(1, sizeof *mem);
    if (!mem) {
        set_err(t, "ucx \"%s\": no memory for a registration", t->name);
        return KVS_ENOMEM;
    }
    ucp_mem_map_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = addr;
    p.length = len;
    ucs_status_t st = ucp_mem_map(t->context, &p, &mem->memh);
    if (st != UCS_OK) {
        char size[32];
        set_err(t, "ucx \"%s\": cannot register %s at %p: %s", t->name,
                kvs_fmt_bytes(size, sizeof size, len), addr, ucs_status_string(st));
        free(mem);
        return KVS_EIO;
    }
    mem->t = t;
    mem->next = t->mems;
    t->mems = mem;
    *out = mem;
    return KVS_OK;
}

void kvs_ucx_mem_deregister(kvs_ucx_mem *mem) {
    if (!mem) return;
    kvs_ucx_transport *t = mem->t;
    for (kvs_ucx_mem **pp = &t->mems; *pp; pp = &(*pp)->next) {
        if (*pp == mem) {
            *pp = mem->next;
            break;
        }
    }
    ucp_mem_unmap(t->context, mem->memh);
    free(mem);
}

kvs_status kvs_ucx_mem_pack(kvs_ucx_mem *mem, void *buf, size_t cap, size_t *len_out) {
    if (!mem || !len_out || (cap && !buf)) return KVS_EINVAL;
    kvs_ucx_transport *t = mem->t;
    void *packed = NULL;
    size_t size = 0;
    ucs_status_t st = ucp_rkey_pack(t->context, mem->memh, &packed, &size);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": cannot pack a remote key: %s", t->name, ucs_status_string(st));
        return KVS_EIO;
    }
    *len_out = size;
    kvs_status rc = KVS_OK;
    if (size > cap) {
        set_err(t, "ucx \"%s\": the packed remote key needs %zu bytes, the buffer has %zu", t->name,
                size, cap);
        rc = KVS_EOVERFLOW;
    } else {
        memcpy(buf, packed, size);
    }
    ucp_rkey_buffer_release(packed);
    return rc;
}

kvs_status kvs_ucx_rkey_unpack(kvs_ucx_conn *conn, const void *blob, size_t len,
                               kvs_ucx_rkey **out) {
    if (out) *out = NULL;
    if (!conn || !blob || len == 0 || !out) return KVS_EINVAL;
    kvs_ucx_transport *t = conn->t;
    if (conn->dead || !conn->ep) {
        set_err(t, "ucx \"%s\": cannot unpack a key for %s: %s", t->name, conn->peer, conn->why);
        return KVS_EIO;
    }
    kvs_ucx_rkey *rkey = calloc(1, sizeof *rkey);
    if (!rkey) {
        set_err(t, "ucx \"%s\": no memory for a remote key", t->name);
        return KVS_ENOMEM;
    }
    ucs_status_t st = ucp_ep_rkey_unpack(conn->ep, blob, &rkey->rkey);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": the %zu-byte remote key from %s does not unpack: %s", t->name, len,
                conn->peer, ucs_status_string(st));
        free(rkey);
        return KVS_ECORRUPT;
    }
    rkey->conn = conn;
    rkey->next = conn->rkeys;
    conn->rkeys = rkey;
    *out = rkey;
    return KVS_OK;
}

/* A packed rkey as UCX 1.13 lays it out: the memory domains' map (8 bytes), the memory type (1),
 * then per domain of the map its key's length (1) and bytes, then optionally the system device
 * and its distances. ucp_ep_rkey_unpack takes no length: it reads as far as the map says, so a map
 * that promises more than the blob holds is refused here before UCX reads past it. */
static int rkey_layout_fits(const uint8_t *b, size_t len) {
    if (len < 9) return 0;
    uint64_t md_map = 0;
    for (int i = 0; i < 8; i++) md_map |= (uint64_t)b[i] << (8 * i);
    size_t off = 9;
    for (; md_map; md_map &= md_map - 1) {
        if (off >= len) return 0;
        off += 1u + b[off];
        if (off > len) return 0;
    }
    return 1;
}

#define RKEY_TRY_MS 1000 /* an unpack takes microseconds: a child still at it after this hung */

/* Unpack blob in a child process first (fork: the child has the endpoint, and the unpack does no
 * I/O): UCX trusts a packed rkey's contents and crashes on some it cannot read (SIGSEGV in
 * ucp_ep_rkey_unpack, UCX 1.13). KVS_OK when the child unpacked it and exited; KVS_ECORRUPT when
 * UCX refused it, crashed, took over RKEY_TRY_MS, or no child could be made. The caller's memory
 * that a NIC may have pinned is MADV_DONTFORK (the node's regions), so the fork neither copies nor
 * moves it. */
static kvs_status rkey_tried_apart(kvs_ucx_conn *conn, const void *blob) {
    pid_t pid = fork();
    if (pid < 0) return KVS_ECORRUPT; /* no process to try it in: refused, not trusted */
    if (pid == 0) {
        /* a crash here is the answer, not an event: no core, no UCX backtrace on the node's log */
        struct rlimit none = {0, 0};
        (void)setrlimit(RLIMIT_CORE, &none);
        (void)prctl(PR_SET_DUMPABLE, 0);
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        ucp_rkey_h k = NULL;
        _exit(ucp_ep_rkey_unpack(conn->ep, blob, &k) == UCS_OK ? 0 : 1);
    }
    int status = 0, pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    if (pidfd < 0 || poll(&p, 1, RKEY_TRY_MS) <= 0) kill(pid, SIGKILL); /* hung: refused */
    if (pidfd >= 0) close(pidfd);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? KVS_OK : KVS_ECORRUPT;
}

kvs_status kvs_ucx_rkey_unpack_untrusted(kvs_ucx_conn *conn, const void *blob, size_t len,
                                         kvs_ucx_rkey **out) {
    if (out) *out = NULL;
    if (!conn || !blob || len == 0 || !out) return KVS_EINVAL;
    /* Not on a shared-memory payload endpoint (experimental, same host only): a fork beside its
     * transports broke the parent's transfers in our runs. Its layout is still checked. */
    if (!conn->dead && conn->ep &&
        (!rkey_layout_fits(blob, len) ||
         (!conn->no_peer_errors && rkey_tried_apart(conn, blob) != KVS_OK))) {
        set_err(conn->t, "ucx \"%s\": the %zu-byte remote key from %s is not one UCX can read",
                conn->t->name, len, conn->peer);
        return KVS_ECORRUPT;
    }
    return kvs_ucx_rkey_unpack(conn, blob, len, out);
}

void kvs_ucx_rkey_destroy(kvs_ucx_rkey *rkey) {
    if (!rkey) return;
    kvs_ucx_conn *conn = rkey->conn;
    for (kvs_ucx_rkey **pp = &conn->rkeys; *pp; pp = &(*pp)->next) {
        if (*pp == rkey) {
            *pp = rkey->next;
            break;
        }
    }
    ucp_rkey_destroy(rkey->rkey);
    free(rkey);
}

/* Issue ops[0..n) on conn, each request kept in requests[]; stops at the first UCX refuses (its
 * status returned). *issued: how many were issued. */
static ucs_status_t rma_issue(kvs_ucx_conn *conn, int is_put, const kvs_ucx_rma *ops, size_t n,
                              void **requests, size_t *issued) {
    for (*issued = 0; *issued < n; (*issued)++) {
        const kvs_ucx_rma *op = &ops[*issued];
        ucp_request_param_t p;
        memset(&p, 0, sizeof p);
        if (op->local_mem) {
            p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
            p.memh = op->local_mem->memh;
        }
        void *request =
            is_put ? ucp_put_nbx(conn->ep, op->local, op->len, op->remote_addr, op->rkey->rkey, &p)
                   : ucp_get_nbx(conn->ep, op->local, op->len, op->remote_addr, op->rkey->rkey, &p);
        if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
        requests[*issued] = request;
    }
    return UCS_OK;
}

/* A batch of n transfers (what, size: for the sentence) that did not complete within timeout_ms:
 * the connection fails, the requests still in flight (requests[waited..issued) and the flush)
 * are abandoned, and requests is freed. */
static kvs_status rma_timed_out(kvs_ucx_conn *conn, void **requests, size_t waited, size_t issued,
                                void *flush, size_t n, const char *what, const char *size,
                                int timeout_ms) {
    kvs_ucx_transport *t = conn->t;
    char why[160];
    if (ucx_guard_dead(conn))
        kvs_fmt(why, sizeof why, "%s died during %zu %s%s of %s", conn->guard->peer, n, what,
                n == 1 ? "" : "s", size);
    else
        kvs_fmt(why, sizeof why, "%zu %s%s of %s did not complete within %d ms", n, what,
                n == 1 ? "" : "s", size, timeout_ms);
    ucx_fail_conn(conn, why);
    for (size_t i = waited; i < issued; i++) ucx_request_abandon(t, requests[i]);
    ucx_request_abandon(t, flush);
    free(requests);
    set_err(t, "ucx \"%s\": %s: %s", t->name, conn->peer, why);
    return KVS_ETIMEDOUT;
}

/* Issue every transfer at once so UCX keeps them in flight together, wait for all of them, and for
 * puts flush once at the end. One failure fails the whole batch (and, on timeout, the connection). */
kvs_status kvs_ucx_rma_many(kvs_ucx_conn *conn, int is_put, const kvs_ucx_rma *ops, size_t n,
                            int timeout_ms) {
    if (!conn || (n && !ops)) return KVS_EINVAL;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ops[i].local || ops[i].len == 0 || !ops[i].rkey || ops[i].rkey->conn != conn)
            return KVS_EINVAL;
        total += ops[i].len;
    }
    if (n == 0) return KVS_OK;
    kvs_ucx_transport *t = conn->t;
    const char *what = is_put ? "put" : "get";
    char size[32];
    kvs_fmt_bytes(size, sizeof size, total);
    if (ucx_guard_dead(conn) && !conn->dead)
        ucx_fail_conn(conn, "the peer died (its guard connection or process)");
    if (conn->dead || !conn->ep) {
        set_err(t, "ucx \"%s\": %s of %s from %s: the connection is dead: %s", t->name, what, size,
                conn->peer, conn->why);
        return KVS_EIO;
    }
    void **requests = calloc(n + 1, sizeof *requests); /* + 1: the flush */
    if (!requests) {
        set_err(t, "ucx \"%s\": no memory for %zu transfers", t->name, n);
        return KVS_ENOMEM;
    }
    unsigned long long deadline = ucx_deadline_after(timeout_ms);
    size_t issued;
    ucs_status_t st = rma_issue(conn, is_put, ops, n, requests, &issued);
    int timed_out = 0;
    size_t waited = 0;
    t->watch = conn;
    for (; waited < issued && !timed_out; waited++) {
        ucs_status_t s = ucx_request_wait(t, requests[waited], deadline, &timed_out);
        if (!timed_out) requests[waited] = NULL;
        if (!timed_out && s != UCS_OK && st == UCS_OK) st = s;
    }
    if (timed_out) waited--; /* requests[waited] is still owned by us */
    void *flush = NULL;
    if (!timed_out && st == UCS_OK && is_put && !conn->dead) {
        /* the puts completed locally; the flush says the bytes reached the peer */
        ucp_request_param_t fp;
        memset(&fp, 0, sizeof fp);
        flush = ucp_ep_flush_nbx(conn->ep, &fp);
        st = ucx_request_wait(t, flush, deadline, &timed_out);
        if (!timed_out) flush = NULL;
    }
    t->watch = NULL;
    if (timed_out)
        return rma_timed_out(conn, requests, waited, issued, flush, n, what, size, timeout_ms);
    free(requests);
    if (st != UCS_OK || conn->dead) {
        set_err(t, "ucx \"%s\": %zu %s%s of %s (first at 0x%llx) on %s failed: %s", t->name, n,
                what, n == 1 ? "" : "s", size, (unsigned long long)ops[0].remote_addr, conn->peer,
                conn->dead ? conn->why : ucs_status_string(st));
        return KVS_EIO;
    }
    return KVS_OK;
}

kvs_status kvs_ucx_get(kvs_ucx_conn *conn, void *local, size_t len, kvs_ucx_mem *local_mem,
                       uint64_t remote_addr, kvs_ucx_rkey *rkey, int timeout_ms) {
    kvs_ucx_rma op = {.local = local,
                      .len = len,
                      .local_mem = local_mem,
                      .remote_addr = remote_addr,
                      .rkey = rkey};
    return kvs_ucx_rma_many(conn, 0, &op, 1, timeout_ms);
}

kvs_status kvs_ucx_put(kvs_ucx_conn *conn, const void *local, size_t len, kvs_ucx_mem *local_mem,
                       uint64_t remote_addr, kvs_ucx_rkey *rkey, int timeout_ms) {
    /* UCX reads but never writes a put's source; the cast only shares the get path */
    kvs_ucx_rma op = {.local = (void *)(uintptr_t)local,
                      .len = len,
                      .local_mem = local_mem,
                      .remote_addr = remote_addr,
                      .rkey = rkey};
    return kvs_ucx_rma_many(conn, 1, &op, 1, timeout_ms);
}
