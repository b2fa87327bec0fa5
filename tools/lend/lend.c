/*
 * lend.c - kvstrata-lend: the lender of the peer_gpu tier (docs/peer_gpu.md). It owns a region of
 * --units units of --unit-size bytes (a sealed memfd, or with --device cuda:N memory of that GPU
 * exported with CUDA IPC), serves one borrower at a time on a Unix SOCK_SEQPACKET socket, and lends
 * and takes units back under the two-step protocol (backends/peer_gpu/lending.h). What it lends is
 * driven by commands, one a line on standard input, or by its own demand through SwiftCache's
 * Alg. 1 (`demand`); every event is a line on standard output, so a script or a test can follow
 * it.
 *
 * A borrower whose connection is lost keeps what it held (quarantined) until its process is known to
 * be gone: the lender watches it with a pidfd (the peer's pid from SO_PEERCRED). A unit that comes
 * back is filled with the lender's pattern, and `check` verifies every unit the lender owns still
 * holds it: a borrower that wrote after giving a unit back would be caught.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "backends/peer_gpu/lend_wire.h"
#include "backends/peer_gpu/lending.h"
#include "common/clock.h"
#include "common/options.h"
#include "common/units.h"
#include "kernels/device.h"
#include "schedulers/elastic/elastic.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvstrata-lend --socket PATH --units N --unit-size SIZE [--lend N]\n"
            "                     [--unit-blocks N] [--window-ms N] [--send-timeout-ms N]\n"
            "                     [--device host|cuda:N]\n"
            "  Lends units of a region it owns to one peer_gpu tier at a time (docs/peer_gpu.md).\n"
            "  --socket PATH        Unix socket to listen on (a stale one is replaced)\n"
            "  --units N            units in the region (1..%u)\n"
            "  --unit-size SIZE     bytes of a unit (a multiple of 4KiB, e.g. 64MiB)\n"
            "  --lend N             units offered to each borrower when it connects (default all)\n"
            "  --unit-blocks N      the lender's own KV blocks a unit holds, for `demand` (default "
            "1)\n"
            "  --window-ms N        ScaleDown's window over `demand` samples (default 60000)\n"
            "  --send-timeout-ms N  bound on a send to a borrower that reads nothing (default "
            "1000)\n"
            "  --device D           where the region lives: host (a sealed memfd, the default) or\n"
            "                       cuda:N (memory of GPU N, lent with CUDA IPC)\n"
            "Commands on standard input, one a line:\n"
            "  lend N        offer N more owned units\n"
            "  reclaim N     ask N lent units back (the answer comes as `released` lines)\n"
            "  demand B      the lender itself needs B blocks: Alg. 1 takes back what covers it,\n"
            "                and lends what the window's peak leaves (ScaleUp, ScaleDown)\n"
            "  status        print `status owned O offered F lent L reclaiming R quarantined Q`\n"
            "  check         print `check ok` when every owned unit holds the lender's pattern\n"
            "  quit          say BYE and end\n"
            "Events on standard output: ready, borrower PID, accepted U, declined U, released U,\n"
            "borrower lost, borrower gone, refused WHY.\n",
            KVS_LEND_MAX_UNITS);
}

#define MAX_QUARANTINE 8

typedef struct lender {
    kvs_lender l;
    int listen_fd, sock, pidfd, memfd;  /* pidfd: the connected borrower's process */
    int pid;                            /* the connected borrower's */
    int quarantine[MAX_QUARANTINE];     /* pidfds of lost borrowers whose units are quarantined */
    int quarantine_pid[MAX_QUARANTINE]; /* and their pids */
    uint32_t n_quarantine;
    uint8_t *region;
    uint64_t unit_bytes;
    int device;                    /* -1: host memory; else the GPU the region is on */
    const kvs_device_mem_ops *mem; /* the CUDA module's, for a GPU region */
    uint64_t *stage;               /* a GPU region: one unit of host memory for fill and check */
    uint32_t lend_on_connect, unit_blocks;
    uint32_t want_lend, want_reclaim; /* asked for, not yet sent (pump) */
    int send_timeout_ms;
    kvs_el_window window;
} lender;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static uint64_t pattern_word(uint32_t unit, uint64_t i) {
    return 0x9e3779b97f4a7c15ull * (unit + 1) ^ (i * 0xbf58476d1ce4e5b9ull);
}

/* A GPU call of the lender failed: it cannot vouch for its own memory any more. */
static void gpu_failed(const char *what, const char *err) {
    fprintf(stderr, "kvstrata-lend: %s: %s\n", what, err);
    exit(1);
}

/* The lender's own use of a unit it got back: its pattern, which `check` verifies. */
static void fill_unit(lender *ld, uint32_t u) {
    uint8_t *at = ld->region + (uint64_t)u * ld->unit_bytes;
    uint64_t *w = ld->device < 0 ? (uint64_t *)at : ld->stage;
    for (uint64_t i = 0; i < ld->unit_bytes / 8; i++) w[i] = pattern_word(u, i);
    char err[512];
    if (ld->device >= 0 &&
        ld->mem->copy(ld->device, at, ld->stage, ld->unit_bytes, err, sizeof err) != KVS_OK)
        gpu_failed("filling a unit", err);
}

static int unit_intact(const lender *ld, uint32_t u) {
    const uint8_t *at = ld->region + (uint64_t)u * ld->unit_bytes;
    const uint64_t *w = ld->device < 0 ? (const uint64_t *)at : ld->stage;
    char err[512];
    if (ld->device >= 0 &&
        ld->mem->copy(ld->device, ld->stage, at, ld->unit_bytes, err, sizeof err) != KVS_OK)
        gpu_failed("reading a unit back", err);
    for (uint64_t i = 0; i < ld->unit_bytes / 8; i++)
        if (w[i] != pattern_word(u, i)) return 0;
    return 1;
}

/* Units in each kvs_lend_unit_state. */
static void count_states(const lender *ld, uint32_t n[5]) {
    memset(n, 0, 5 * sizeof n[0]);
    for (uint32_t u = 0; u < ld->l.n_units; u++) n[ld->l.state[u]]++;
}

static uint32_t count_state(const lender *ld, uint8_t state) {
    uint32_t n[5];
    count_states(ld, n);
    return n[state];
}

static void send_msg(lender *ld, uint32_t type, uint32_t unit, uint32_t epoch) {
    kvs_lend_msg m = {.type = type, .unit = unit, .epoch = epoch};
    char why[256];
    if (ld->sock >= 0 &&
        kvs_lend_send(ld->sock, &m, -1, ld->send_timeout_ms, why, sizeof why) != KVS_OK) {
        say("refused %s", why);
        shutdown(ld->sock, SHUT_RDWR); /* the poll loop finds it lost */
    }
}

/* Messages the borrower has not answered yet are at most WINDOW (offers not yet accepted or
 * declined, reclaims not yet released): its answers then always fit the socket's queue, so the two
 * sides never both wait to send. What is asked beyond it waits in want_lend and want_reclaim. */
#define WINDOW 32u

/* Send what is asked, within the window: offers of owned units from the top of the region down
 * (the lender keeps the bottom), reclaims of lent units from the lowest up. */
static void pump(lender *ld) {
    uint32_t n[5], epoch;
    count_states(ld, n);
    uint32_t open = n[KVS_LEND_OFFERED] + n[KVS_LEND_RECLAIMING]; /* unanswered */
    while (ld->want_reclaim && open < WINDOW) {
        uint32_t u = 0;
        while (u < ld->l.n_units && kvs_lender_reclaim(&ld->l, u, &epoch) != KVS_OK) u++;
        if (u == ld->l.n_units) {
            ld->want_reclaim = 0; /* nothing lent is left to take back */
            break;
        }
        send_msg(ld, KVS_LEND_RECLAIM, u, epoch);
        ld->want_reclaim--;
        open++;
    }
    while (ld->want_lend && open < WINDOW && ld->sock >= 0) {
        uint32_t u = ld->l.n_units;
        while (u-- > 0 && kvs_lender_offer(&ld->l, u, &epoch) != KVS_OK) {
        }
        if (u == UINT32_MAX) {
            ld->want_lend = 0; /* nothing owned is left to lend */
            break;
        }
        send_msg(ld, KVS_LEND_OFFER, u, epoch);
        ld->want_lend--;
        open++;
    }
}

/* Ask for up to n more units to be offered (as many as are owned and not asked yet). */
static uint32_t lend(lender *ld, uint32_t n) {
    uint32_t owned = count_state(ld, KVS_LEND_OWNED);
    uint32_t room = owned > ld->want_lend ? owned - ld->want_lend : 0;
    if (ld->sock < 0) room = 0;
    if (n > room) n = room;
    ld->want_lend += n;
    pump(ld);
    return n;
}

/* Ask up to n lent units back. */
static uint32_t reclaim(lender *ld, uint32_t n) {
    uint32_t lent = count_state(ld, KVS_LEND_LENT);
    uint32_t room = lent > ld->want_reclaim ? lent - ld->want_reclaim : 0;
    if (n > room) n = room;
    ld->want_reclaim += n;
    pump(ld);
    return n;
}

/* Alg. 1 over the lender's own demand, in its blocks: take back what covers it now (ScaleUp), lend
 * what the window's peak leaves (ScaleDown). */
static void demand(lender *ld, uint64_t blocks) {
    uint32_t n[5];
    count_states(ld, n);
    kvs_el_unit unit = {
        .lcm_bytes = ld->unit_bytes, .meu_master = 1, .meu_worker = ld->unit_blocks};
    /* what is on its way back counts as owned: a sample before the RELEASED asks no more */
    uint64_t coming = (uint64_t)n[KVS_LEND_RECLAIMING] + ld->want_reclaim;
    uint64_t owned = ((uint64_t)n[KVS_LEND_OWNED] + coming) * ld->unit_blocks;
    uint64_t lent = n[KVS_LEND_LENT] > ld->want_reclaim ? n[KVS_LEND_LENT] - ld->want_reclaim : 0;
    uint64_t now_ms = kvs_now_ns() / 1000000u;
    kvs_el_window_note(&ld->window, now_ms, blocks);
    kvs_el_delta up = kvs_el_scale_up(owned, blocks, lent, &unit);
    if (up.units) {
        say("scale-up %llu%s", (unsigned long long)up.units, up.short_of_demand ? " short" : "");
        reclaim(ld, (uint32_t)up.units);
        return;
    }
    kvs_el_delta down = kvs_el_scale_down(owned, kvs_el_window_max(&ld->window, now_ms), &unit);
    if (down.units) say("scale-down %llu", (unsigned long long)lend(ld, (uint32_t)down.units));
}

static void command(lender *ld, char *line) {
    char word[16], extra[2];
    char arg[32] = "";
    int k = sscanf(line, "%15s %31s %1s", word, arg, extra);
    if (k < 1) return;
    uint64_t v = 0;
    /* a count: digits only, within what a unit count or a demand can be */
    if (k == 2 && kvs_option_count(arg, 0, UINT32_MAX, &v) != 0) {
        say("refused %s: not a count", line);
        return;
    }
    if (k == 3) {
        say("refused %s: one argument at most", line);
        return;
    }
    if (!strcmp(word, "lend") && k == 2) {
        say("offering %u", lend(ld, (uint32_t)v));
    } else if (!strcmp(word, "reclaim") && k == 2) {
        say("reclaiming %u", reclaim(ld, (uint32_t)v));
    } else if (!strcmp(word, "demand") && k == 2) {
        demand(ld, v);
    } else if (!strcmp(word, "status")) {
        uint32_t n[5];
        count_states(ld, n);
        say("status owned %u offered %u lent %u reclaiming %u quarantined %u", n[KVS_LEND_OWNED],
            n[KVS_LEND_OFFERED], n[KVS_LEND_LENT], n[KVS_LEND_RECLAIMING], n[KVS_LEND_QUARANTINED]);
    } else if (!strcmp(word, "check")) {
        for (uint32_t u = 0; u < ld->l.n_units; u++)
            if (kvs_lender_may_use(&ld->l, u) && !unit_intact(ld, u)) {
                say("check bad %u", u);
                return;
            }
        say("check ok");
    } else {
        say("refused unknown command: %s", line);
    }
}

/* Units that came back are the lender's: its pattern goes in. */
static void refill_owned(lender *ld, const uint8_t *was_owned) {
    for (uint32_t u = 0; u < ld->l.n_units; u++)
        if (!was_owned[u] && kvs_lender_may_use(&ld->l, u)) fill_unit(ld, u);
}

/* The quarantined units come back once no lost borrower's process lives (units of the connected
 * borrower, if any, are not quarantined: they stay its). */
static void quarantine_check(lender *ld) {
    if (ld->n_quarantine) return;
    uint8_t was[KVS_LEND_MAX_UNITS];
    uint32_t q = 0;
    for (uint32_t u = 0; u < ld->l.n_units; u++) {
        was[u] = (uint8_t)kvs_lender_may_use(&ld->l, u);
        q += ld->l.state[u] == KVS_LEND_QUARANTINED;
    }
    kvs_lender_borrower_gone(&ld->l);
    refill_owned(ld, was);
    if (q) say("borrower gone");
}

/* The connection to the borrower is lost (or it said BYE: bye). What it held is quarantined until
 * its process ends, unless it said BYE and no other lost borrower's units are quarantined (the
 * machine's quarantine is one set: it comes back all at once). */
static void lost_borrower(lender *ld, int bye) {
    close(ld->sock);
    ld->sock = -1;
    ld->want_lend = ld->want_reclaim = 0;
    kvs_lender_disconnected(&ld->l);
    say("borrower lost");
    /* Watched until its process ends, unless it said BYE (it unmapped the region first: what it
     * held may come back as soon as the lost ones' do) or its process is watched already (it lost
     * a link before: one entry a process, however often it reconnects). */
    int watched = 0;
    for (uint32_t q = 0; q < ld->n_quarantine; q++) watched |= ld->quarantine_pid[q] == ld->pid;
    if (bye || watched) {
        close(ld->pidfd);
    } else {
        ld->quarantine_pid[ld->n_quarantine] = ld->pid;
        ld->quarantine[ld->n_quarantine++] = ld->pidfd;
    }
    ld->pidfd = -1;
    quarantine_check(ld);
}

static void turn_away(lender *ld, int s, const char *why) {
    (void)ld;
    kvs_lend_msg bye = {.type = KVS_LEND_BYE};
    char ignored[64];
    kvs_lend_send(s, &bye, -1, 0, ignored, sizeof ignored);
    close(s);
    say("refused %s", why);
}

static void on_borrower_message(lender *ld);

static void accept_borrower(lender *ld) {
    int s = accept4(ld->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) return;
    /* the one connected may have said BYE already (a process that closes a tier and opens the next
     * at once): read what it sent first */
    for (struct pollfd p = {.fd = ld->sock, .events = POLLIN}; ld->sock >= 0 && poll(&p, 1, 0) > 0;
         p.fd = ld->sock)
        on_borrower_message(ld);
    if (ld->sock >= 0) return turn_away(ld, s, "a second borrower: one at a time");
    if (ld->n_quarantine == MAX_QUARANTINE)
        return turn_away(ld, s, "a borrower: too many lost ones are still alive");
    /* its process must be watchable: a lost connection quarantines its units until it ends */
    struct ucred cred = {0};
    socklen_t len = sizeof cred;
    int pidfd = -1;
    char why[256];
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) {
        snprintf(why, sizeof why,
                 "a borrower whose process cannot be watched (no pid: another pid namespace?)");
        return turn_away(ld, s, why);
    }
    pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
    if (pidfd < 0) {
        snprintf(why, sizeof why, "a borrower whose process cannot be watched (pid %d: %s)",
                 (int)cred.pid, strerror(errno));
        return turn_away(ld, s, why);
    }
    kvs_lend_msg hello = {.type = KVS_LEND_HELLO,
                          .n_units = ld->l.n_units,
                          .unit_bytes = ld->unit_bytes,
                          .region_bytes = ld->unit_bytes * ld->l.n_units};
    if (ld->device >= 0) {
        char err[512];
        hello.region_kind = KVS_LEND_REGION_CUDA;
        hello.device = (uint32_t)ld->device;
        /* a handle per borrower: the same bytes each time, from the one allocation */
        if (ld->mem->export_handle(ld->device, ld->region, hello.ipc, err, sizeof err) != KVS_OK ||
            ld->mem->uuid(ld->device, hello.uuid, err, sizeof err) != KVS_OK) {
            close(pidfd);
            snprintf(why, sizeof why, "exporting the region: %s", err);
            return turn_away(ld, s, why);
        }
    }
    if (kvs_lend_send(s, &hello, ld->memfd, ld->send_timeout_ms, why, sizeof why) != KVS_OK) {
        close(pidfd); /* nothing was offered: nothing to quarantine */
        return turn_away(ld, s, why);
    }
    kvs_lender_connect(&ld->l);
    ld->sock = s;
    ld->pidfd = pidfd;
    ld->pid = (int)cred.pid;
    say("borrower %d", (int)cred.pid);
    lend(ld, ld->lend_on_connect);
}

static void on_borrower_message(lender *ld) {
    kvs_lend_msg m;
    int fd = -1;
    char why[256];
    kvs_status rc = kvs_lend_recv(ld->sock, 0, ld->l.n_units, &m, &fd, why, sizeof why);
    if (fd >= 0) close(fd);
    if (rc == KVS_ETIMEDOUT) return;
    if (rc != KVS_OK) {
        if (rc == KVS_EINVAL) say("refused %s", why);
        lost_borrower(ld, 0);
        return;
    }
    uint8_t was = (uint8_t)kvs_lender_may_use(&ld->l, m.unit);
    switch (m.type) {
        case KVS_LEND_ACCEPT:
            if (kvs_lender_on_accept(&ld->l, m.unit, m.epoch) == KVS_OK) say("accepted %u", m.unit);
            break;
        case KVS_LEND_DECLINE:
            if (kvs_lender_on_decline(&ld->l, m.unit, m.epoch) == KVS_OK)
                say("declined %u", m.unit);
            break;
        case KVS_LEND_RELEASED:
            if (kvs_lender_on_released(&ld->l, m.unit, m.epoch) == KVS_OK) {
                if (!was) fill_unit(ld, m.unit);
                say("released %u", m.unit);
            }
            break;
        case KVS_LEND_BYE:
            lost_borrower(ld, 1); /* an orderly end: the borrower unmapped the region first */
            break;
        default:
            say("refused a lender's message from the borrower (type %u)", m.type);
            lost_borrower(ld, 0);
            break;
    }
    pump(ld);
}

/* A region of GPU memory, through the CUDA module (kernels/device.h). */
static int open_gpu_region(lender *ld, uint32_t units) {
    uint64_t bytes = ld->unit_bytes * units;
    char why[512];
    void *dl = NULL;
    const kvs_device_ops *ops = kvs_device_cuda_load(&dl, why, sizeof why);
    int n = 0;
    if (!ops || !ops->mem) {
        fprintf(stderr, "kvstrata-lend: --device cuda:%d needs the CUDA module: %s\n", ld->device,
                ops ? "it has no memory table" : why);
        return -1;
    }
    ld->mem = ops->mem;
    if (ld->mem->count(&n, why, sizeof why) != KVS_OK || ld->device >= n) {
        fprintf(stderr, "kvstrata-lend: --device cuda:%d: %s\n", ld->device,
                n ? "no such device" : why);
        return -1;
    }
    void *p = NULL;
    if (ld->mem->alloc(ld->device, bytes, &p, why, sizeof why) != KVS_OK) {
        fprintf(stderr, "kvstrata-lend: region of %llu bytes: %s\n", (unsigned long long)bytes,
                why);
        return -1;
    }
    ld->region = p;
    void *stage = NULL; /* pinned: the fills and checks copy a unit at a time */
    if (ld->mem->host_alloc(ld->unit_bytes, &stage, why, sizeof why) != KVS_OK) {
        fprintf(stderr, "kvstrata-lend: a staging buffer of %llu bytes: %s\n",
                (unsigned long long)ld->unit_bytes, why);
        return -1;
    }
    ld->stage = stage;
    for (uint32_t u = 0; u < units; u++) fill_unit(ld, u);
    return 0;
}

static int open_region(lender *ld, uint32_t units) {
    if (ld->device >= 0) return open_gpu_region(ld, units);
    uint64_t bytes = ld->unit_bytes * units;
    ld->memfd = memfd_create("kvstrata-lend", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ld->memfd < 0 || ftruncate(ld->memfd, (off_t)bytes) != 0 ||
        fcntl(ld->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        fprintf(stderr, "kvstrata-lend: region of %llu bytes: %s\n", (unsigned long long)bytes,
                strerror(errno));
        return -1;
    }
    ld->region = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ld->memfd, 0);
    if (ld->region == MAP_FAILED) {
        fprintf(stderr, "kvstrata-lend: mapping the region: %s\n", strerror(errno));
        return -1;
    }
    for (uint32_t u = 0; u < units; u++) fill_unit(ld, u);
    return 0;
}

static int open_socket(lender *ld, const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        fprintf(stderr, "kvstrata-lend: socket path %s is too long\n", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ld->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode)) unlink(path); /* a stale one */
    mode_t old = umask(0077);                                        /* the owner's only */
    int rc = ld->listen_fd < 0 ? -1 : bind(ld->listen_fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc != 0 || listen(ld->listen_fd, 4) != 0) {
        fprintf(stderr, "kvstrata-lend: listening on %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    uint64_t units = 0, unit_bytes = 0, lend_n = UINT64_MAX, unit_blocks = 1, window_ms = 60000,
             send_timeout = 1000, gpu = 0;
    int device = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char why[128] = "";
        int bad = !v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (bad) {
        } else if (!strcmp(a, "--socket")) {
            path = v;
        } else if (!strcmp(a, "--units")) {
            bad = kvs_option_count(v, 1, KVS_LEND_MAX_UNITS, &units);
        } else if (!strcmp(a, "--unit-size")) {
            bad = kvs_units_parse_size(v, &unit_bytes, why, sizeof why) != KVS_OK ||
                  unit_bytes == 0 || unit_bytes % 4096 != 0;
        } else if (!strcmp(a, "--lend")) {
            bad = kvs_option_count(v, 0, KVS_LEND_MAX_UNITS, &lend_n);
        } else if (!strcmp(a, "--unit-blocks")) {
            bad = kvs_option_count(v, 1, UINT32_MAX, &unit_blocks);
        } else if (!strcmp(a, "--window-ms")) {
            bad = kvs_option_count(v, 1, UINT32_MAX, &window_ms);
        } else if (!strcmp(a, "--send-timeout-ms")) {
            bad = kvs_option_count(v, 1, 600000, &send_timeout);
        } else if (!strcmp(a, "--device")) {
            device = -1;
            if (strncmp(v, "cuda:", 5) == 0) {
                bad = kvs_option_count(v + 5, 0, 1023, &gpu);
                device = (int)gpu;
            } else {
                bad = strcmp(v, "host") != 0;
            }
            if (bad) snprintf(why, sizeof why, "host or cuda:N");
        } else {
            fprintf(stderr, "kvstrata-lend: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "kvstrata-lend: bad value for %s%s%s\n", a, why[0] ? ": " : "", why);
            return 2;
        }
        i++;
    }
    if (!path || !units || !unit_bytes) {
        fprintf(stderr, "kvstrata-lend: --socket, --units and --unit-size are required\n");
        usage(stderr);
        return 2;
    }
    if (unit_bytes > UINT64_MAX / units) {
        fprintf(stderr, "kvstrata-lend: the region does not fit 64 bits\n");
        return 2;
    }
    lender ld = {.listen_fd = -1,
                 .sock = -1,
                 .pidfd = -1,
                 .memfd = -1,
                 .unit_bytes = unit_bytes,
                 .device = device,
                 .lend_on_connect = (uint32_t)(lend_n < units ? lend_n : units),
                 .unit_blocks = (uint32_t)unit_blocks,
                 .send_timeout_ms = (int)send_timeout};
    kvs_lender_init(&ld.l, (uint32_t)units);
    kvs_el_window_init(&ld.window, window_ms);
    if (open_region(&ld, (uint32_t)units) != 0 || open_socket(&ld, path) != 0) return 1;
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    say("ready %s units %u unit-size %llu", path, (unsigned)units, (unsigned long long)unit_bytes);
    char line[256];
    size_t have = 0;
    int input = 1, skipping = 0; /* skipping: the rest of a line longer than any command */
    for (;;) {
        struct pollfd p[5 + MAX_QUARANTINE] = {{.fd = ld.listen_fd, .events = POLLIN},
                                               {.fd = ld.sock, .events = POLLIN},
                                               {.fd = ld.pidfd, .events = POLLIN},
                                               {.fd = input ? 0 : -1, .events = POLLIN},
                                               {.fd = sfd, .events = POLLIN}};
        for (uint32_t q = 0; q < ld.n_quarantine; q++)
            p[5 + q] = (struct pollfd){.fd = ld.quarantine[q], .events = POLLIN};
        if (poll(p, 5 + ld.n_quarantine, -1) < 0) continue;
        if (p[4].revents) break;
        if (p[0].revents) accept_borrower(&ld);
        if (ld.sock >= 0 && p[1].fd == ld.sock && p[1].revents) on_borrower_message(&ld);
        if (ld.sock >= 0 && p[2].fd == ld.pidfd && p[2].revents) {
            /* the connected borrower's process ended (its socket may live on in a child) */
            lost_borrower(&ld, 0);
        }
        for (uint32_t q = ld.n_quarantine; q-- > 0;) {
            if (p[5 + q].fd != ld.quarantine[q] || !p[5 + q].revents) continue;
            /* a lost borrower's process ended: its mappings are gone with it */
            close(ld.quarantine[q]);
            ld.n_quarantine--;
            ld.quarantine[q] = ld.quarantine[ld.n_quarantine];
            ld.quarantine_pid[q] = ld.quarantine_pid[ld.n_quarantine];
            quarantine_check(&ld);
        }
        if (p[3].revents) {
            ssize_t got = read(0, line + have, sizeof line - 1 - have);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                input = 0; /* no more commands (a last one without its newline counts): serve on */
                line[have] = '\0';
                if (have && !skipping && !strcmp(line, "quit")) goto out;
                if (have && !skipping) command(&ld, line);
                have = 0;
                continue;
            }
            have += (size_t)got;
            char *nl;
            while ((nl = memchr(line, '\n', have))) {
                *nl = '\0';
                if (!skipping && !strcmp(line, "quit")) goto out;
                if (!skipping) command(&ld, line);
                skipping = 0;
                have -= (size_t)(nl + 1 - line);
                memmove(line, nl + 1, have);
            }
            if (have == sizeof line - 1) { /* no command is this long: drop it to its newline */
                if (!skipping) say("refused a line longer than any command");
                skipping = 1;
                have = 0;
            }
        }
    }
out:
    if (ld.sock >= 0) send_msg(&ld, KVS_LEND_BYE, 0, 0);
    unlink(path);
    say("bye");
    return 0;
}
