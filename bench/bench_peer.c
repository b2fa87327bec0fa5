/* bench_peer.c - kvs-bench-peer: the peer_gpu tier's copy throughput on the host device (a sealed
 * memfd lent by kvstrata-lend, started here as a child process), against memcpy of the same bytes
 * between the same kinds of memory in the same run.
 *
 * --device cuda:N: the lender's region is memory of GPU N, lent over CUDA IPC. The tier's put and
 * get then copy between host buffers and the lent GPU memory (cudaMemcpy through the CUDA module);
 * the reference is the same copies between the same host buffers and a GPU allocation of this
 * process. Before the tier connects, the bench opens the lender's IPC handle itself and times
 * device-to-device copies out of and into the lent memory against the same copies between two
 * allocations of its own on the same GPU: what CUDA IPC costs a peer copy (the tier's own loads do
 * not take that path yet: docs/peer_gpu.md).
 *
 * The tier is driven through its backend ops table: `put` of every object (a save into lent
 * memory) and `get` of every object (a load out of it), --objects objects of --object-bytes, from
 * and into one private buffer per object (as the connector's staging). Reference, per round and in
 * the same order: a copy of each object between the same private buffers and a second memfd mapped
 * shared (the lent memory's kind), one copy per object, with memcpy and with non-temporal stores,
 * each measured before and after the tier's path: the fastest of the four is the round's limit (the
 * tier copies with non-temporal stores; memcpy alone was slower than it here). The tier's path
 * adds its lock, the protocol's in-flight counting and its index: the ratio says what they cost.
 * Medians over the rounds are reported; the last round's reads are checked byte for byte. */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/peer_gpu/lend_wire.h"
#include "backends/peer_gpu/peer_gpu.h"
#include "bench_common.h"
#include "common/copy.h"
#include "common/key.h"
#include "kernels/device.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvs-bench-peer [--objects N] [--object-bytes N] [--rounds N] [--lend PATH]\n"
               "  peer_gpu tier put/get throughput on the host device against memcpy of the same\n"
               "  bytes between the same kinds of memory (docs/peer_gpu.md, docs/benchmarks.md)\n"
               "  --objects N        objects stored and read each round (32)\n"
               "  --object-bytes N   bytes of one object (4194304)\n"
               "  --rounds N         rounds; medians are reported (9)\n"
               "  --lend PATH        kvstrata-lend (default: beside this program)\n"
               "  --device D         host (default) or cuda:N: the lent region on GPU N\n");
}

static void copy(int nt, void *dst, const void *src, size_t n) {
    if (nt) {
        kvs_copy_streaming(dst, src, n);
        kvs_copy_fence();
    } else {
        memcpy(dst, src, n);
    }
}

static void gpu_check(kvs_status st, const char *what, const char *why) {
    if (st == KVS_OK) return;
    fprintf(stderr, "kvs-bench-peer: %s: %s\n", what, why);
    exit(1);
}

/* One reference copy: memcpy or non-temporal stores, or on a GPU the module's copy. */
static void ref_copy(const kvs_device_mem_ops *mem, int gpu, int nt, void *dst, const void *src,
                     size_t n) {
    char why[512];
    if (mem)
        gpu_check(mem->copy(gpu, dst, src, n, why, sizeof why), "reference copy", why);
    else
        copy(nt, dst, src, n);
}

static pid_t start_lender(const char *lend, const char *sock, uint32_t units, uint64_t unit_bytes,
                          const char *device) {
    char n[16], size[32];
    snprintf(n, sizeof n, "%u", units);
    snprintf(size, sizeof size, "%llu", (unsigned long long)unit_bytes);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 1);
        execl(lend, lend, "--socket", sock, "--units", n, "--unit-size", size, "--device", device,
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The CUDA module's memory table, for --device cuda:N; exits when it is not usable. */
static const kvs_device_mem_ops *gpu_mem(int ordinal) {
    char why[512];
    void *dl = NULL;
    const kvs_device_ops *dev = kvs_device_cuda_load(&dl, why, sizeof why);
    int n = 0;
    if (!dev || !dev->mem || dev->mem->count(&n, why, sizeof why) != KVS_OK || ordinal >= n) {
        fprintf(stderr, "kvs-bench-peer: cuda:%d is not usable: %s\n", ordinal,
                dev && dev->mem ? (n ? "no such device" : why) : why);
        exit(1);
    }
    return dev->mem;
}

/* Device-to-device copies out of and into the lent region, opened here from the lender's HELLO,
 * against the same copies between two allocations of this process; medians over rounds. Says BYE
 * after, so the tier is the lender's next borrower. */
static void ipc_peer_copies(const kvs_device_mem_ops *mem, int dev, const char *sock,
                            uint64_t bytes, uint64_t rounds) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    kvs_lend_msg m;
    int fd = -1;
    char why[512];
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        kvs_lend_recv(s, 10000, 0, &m, &fd, why, sizeof why) != KVS_OK ||
        m.type != KVS_LEND_HELLO || m.region_kind != KVS_LEND_REGION_CUDA) {
        fprintf(stderr, "kvs-bench-peer: no CUDA HELLO from the lender\n");
        exit(1);
    }
    bytes = bytes < m.region_bytes ? bytes : m.region_bytes;
    void *lent = NULL, *a = NULL, *b = NULL;
    uint64_t span = 0;
    gpu_check(mem->open_handle(dev, m.ipc, &lent, &span, why, sizeof why), "opening the IPC handle",
              why);
    gpu_check(mem->alloc(dev, bytes, &a, why, sizeof why), "alloc", why);
    gpu_check(mem->alloc(dev, bytes, &b, why, sizeof why), "alloc", why);
    gpu_check(mem->fill(dev, a, 3, bytes, why, sizeof why), "fill", why);
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = calloc(rounds, sizeof *t[k]);
    double gb = (double)bytes / 1e9;
    for (uint64_t r = 0; r < rounds + 1; r++) {
        /* out of the lent memory, into it; then the local reference both ways */
        void *dst[4] = {a, lent, a, b}, *src[4] = {lent, a, b, a};
        for (int k = 0; k < 4; k++) {
            uint64_t t0 = bench_now_ns();
            gpu_check(mem->copy(dev, dst[k], src[k], bytes, why, sizeof why), "copy", why);
            if (r) t[k][r - 1] = gb / ((double)(bench_now_ns() - t0) / 1e9);
        }
    }
    double out = bench_median(t[0], rounds), in = bench_median(t[1], rounds);
    double ref_out = bench_median(t[2], rounds), ref_in = bench_median(t[3], rounds);
    printf("peer copy over CUDA IPC, %llu bytes device to device on cuda:%d (lender cuda:%u)\n",
           (unsigned long long)bytes, dev, m.device);
    printf("out of lent memory: %.2f GB/s   cudaMemcpy D2D %.2f GB/s   ratio %.3f\n", out, ref_out,
           out / ref_out);
    printf("into lent memory:   %.2f GB/s   cudaMemcpy D2D %.2f GB/s   ratio %.3f\n", in, ref_in,
           in / ref_in);
    mem->release(dev, a);
    mem->release(dev, b);
    mem->close_handle(dev, lent);
    kvs_lend_msg bye = {.type = KVS_LEND_BYE};
    kvs_lend_send(s, &bye, -1, 1000, why, sizeof why);
    close(s);
    for (int k = 0; k < 4; k++) free(t[k]);
}

static void log_host(void *ctx, int level, const char *m) {
    (void)ctx;
    if (level <= KVS_LOG_WARN) fprintf(stderr, "kvs-bench-peer: tier: %s\n", m);
}

int main(int argc, char **argv) {
    uint64_t n_obj = 32, obj_bytes = 4u << 20, rounds = 9;
    char lend[PATH_MAX] = "";
    const char *device = "host";
    int gpu = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--objects")) {
            n_obj = bench_parse_u64(a, v, 1, 4096);
        } else if (!strcmp(a, "--object-bytes")) {
            obj_bytes = bench_parse_u64(a, v, 4096, 1ull << 30);
        } else if (!strcmp(a, "--rounds")) {
            rounds = bench_parse_u64(a, v, 1, 1000);
        } else if (!strcmp(a, "--lend")) {
            snprintf(lend, sizeof lend, "%s", v);
        } else if (!strcmp(a, "--device")) {
            device = v;
            gpu = strncmp(v, "cuda:", 5) == 0 ? (int)bench_parse_u64(a, v + 5, 0, 1023) : -1;
            if (gpu < 0 && strcmp(v, "host") != 0) {
                usage(stderr);
                return 2;
            }
        } else {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!lend[0]) {
        char self[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k <= 0) return 1;
        self[k] = '\0';
        *strrchr(self, '/') = '\0';
        snprintf(lend, sizeof lend, "%.*s/kvstrata-lend", (int)(sizeof lend - 16), self);
    }
    /* one object a unit, units a multiple of 4 KiB */
    uint64_t slot = (obj_bytes + 63) & ~63ull, unit_bytes = (slot + 4095) & ~4095ull;
    char dir[] = "/tmp/kvs-bench-peer-XXXXXX", sock[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(sock, sizeof sock, "%s/lend.sock", dir);
    const kvs_device_mem_ops *mem = gpu >= 0 ? gpu_mem(gpu) : NULL;
    pid_t lender = start_lender(lend, sock, (uint32_t)n_obj, unit_bytes, device);
    for (int w = 0; w < 500 && access(sock, F_OK) != 0; w++) usleep(10000);
    if (mem) ipc_peer_copies(mem, gpu, sock, n_obj * unit_bytes, rounds);

    kvs_backend_host host = {.struct_size = sizeof host, .log = log_host};
    kvs_backend_option opts[] = {{"socket", sock}, {"connect_timeout_ms", "5000"}};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "peer",
                             .max_object_bytes = obj_bytes,
                             .options = opts,
                             .n_options = 2,
                             .host = &host,
                             .error = err,
                             .error_len = sizeof err};
    const kvs_backend_ops *ops = kvs_peer_gpu_backend();
    void *tier = NULL;
    kvs_peer_gpu_stats st = {0};
    for (int tries = 0; tries < 50 && (!tier || !st.connected); tries++) {
        if (tier) ops->destroy(tier);
        tier = NULL;
        if (ops->create(&init, &tier) != KVS_OK) {
            fprintf(stderr, "kvs-bench-peer: %s\n", err);
            return 1;
        }
        kvs_peer_gpu_stats_get(tier, &st);
        if (!st.connected) usleep(100000);
    }
    for (int w = 0; w < 5000 && st.usable_units < n_obj; w++) {
        usleep(1000);
        kvs_peer_gpu_stats_get(tier, &st);
    }
    if (st.usable_units < n_obj) {
        fprintf(stderr, "kvs-bench-peer: the lender lent %u of %llu units\n", st.usable_units,
                (unsigned long long)n_obj);
        return 1;
    }

    uint8_t *bufs = bench_map(n_obj * obj_bytes, 0, 1, "staging");
    uint8_t *ref = NULL;
    char why[512];
    if (mem) { /* the reference's memory: the same kind as the lent region's */
        void *p = NULL;
        gpu_check(mem->alloc(gpu, n_obj * unit_bytes, &p, why, sizeof why), "alloc", why);
        gpu_check(mem->fill(gpu, p, 1, n_obj * unit_bytes, why, sizeof why), "fill", why);
        ref = p;
    } else {
        int ref_fd = memfd_create("kvs-bench-peer-ref", MFD_CLOEXEC);
        if (ref_fd < 0 || ftruncate(ref_fd, (off_t)(n_obj * unit_bytes)) != 0) return 1;
        ref = mmap(NULL, n_obj * unit_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ref_fd, 0);
        if (ref == MAP_FAILED) return 1;
        memset(ref, 1, n_obj * unit_bytes);
    }
    for (uint64_t i = 0; i < n_obj * obj_bytes / 8; i++) ((uint64_t *)bufs)[i] = bench_mix64(i);

    double *t_put = calloc(rounds, sizeof *t_put), *t_get = calloc(rounds, sizeof *t_get);
    double *r_put = calloc(rounds, sizeof *r_put), *r_get = calloc(rounds, sizeof *r_get);
    kvs_key *keys = calloc(n_obj, sizeof *keys);
    for (uint64_t i = 0; i < n_obj; i++) memcpy(keys[i].bytes, &(uint64_t){i + 1}, 8);
    double gb = (double)(n_obj * obj_bytes) / 1e9;
    for (uint64_t r = 0; r < rounds + 1; r++) { /* round 0 warms up */
        /* the reference: memcpy and non-temporal stores, each before and after the tier's path;
         * the fastest of the four is the round's limit */
        double rp = 0, rg = 0, tp = 0, tg = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int nt = 0; nt < (mem ? 1 : 2); nt++) { /* a GPU reference: cudaMemcpy only */
                uint64_t t0 = bench_now_ns();
                for (uint64_t i = 0; i < n_obj; i++)
                    ref_copy(mem, gpu, nt, ref + i * unit_bytes, bufs + i * obj_bytes, obj_bytes);
                uint64_t t1 = bench_now_ns();
                for (uint64_t i = 0; i < n_obj; i++)
                    ref_copy(mem, gpu, nt, bufs + i * obj_bytes, ref + i * unit_bytes, obj_bytes);
                uint64_t t2 = bench_now_ns();
                rp = fmax(rp, gb / ((double)(t1 - t0) / 1e9));
                rg = fmax(rg, gb / ((double)(t2 - t1) / 1e9));
            }
            if (pass == 1) break;
            uint64_t t0 = bench_now_ns();
            for (uint64_t i = 0; i < n_obj; i++)
                if (ops->put(tier, &keys[i], bufs + i * obj_bytes, obj_bytes) != KVS_OK) {
                    fprintf(stderr, "kvs-bench-peer: put: %s\n", ops->last_error(tier));
                    return 1;
                }
            uint64_t t1 = bench_now_ns();
            for (uint64_t i = 0; i < n_obj; i++) {
                uint64_t len = 0;
                if (ops->get(tier, &keys[i], bufs + i * obj_bytes, obj_bytes, &len) != KVS_OK ||
                    len != obj_bytes) {
                    fprintf(stderr, "kvs-bench-peer: get: %s\n", ops->last_error(tier));
                    return 1;
                }
            }
            uint64_t t2 = bench_now_ns();
            tp = gb / ((double)(t1 - t0) / 1e9);
            tg = gb / ((double)(t2 - t1) / 1e9);
        }
        if (r == 0) continue;
        r_put[r - 1] = rp;
        t_put[r - 1] = tp;
        r_get[r - 1] = rg;
        t_get[r - 1] = tg;
    }
    /* the last get must have the bytes the last put stored */
    for (uint64_t i = 0; i < n_obj * obj_bytes / 8; i++)
        if (((uint64_t *)bufs)[i] != bench_mix64(i)) {
            fprintf(stderr, "kvs-bench-peer: the bytes read back differ at word %llu\n",
                    (unsigned long long)i);
            return 1;
        }
    double mp = bench_median(t_put, rounds), mrp = bench_median(r_put, rounds);
    double mg = bench_median(t_get, rounds), mrg = bench_median(r_get, rounds);
    const char *ref_name = mem ? "cudaMemcpy" : "memcpy";
    printf("kvs-bench-peer: %llu objects of %llu bytes, %llu rounds (medians), region on %s\n",
           (unsigned long long)n_obj, (unsigned long long)obj_bytes, (unsigned long long)rounds,
           device);
    printf("save (put into lent memory):  %.2f GB/s   %s %.2f GB/s   ratio %.3f\n", mp, ref_name,
           mrp, mp / mrp);
    printf("load (get out of lent memory): %.2f GB/s   %s %.2f GB/s   ratio %.3f\n", mg, ref_name,
           mrg, mg / mrg);
    if (mem) mem->release(gpu, ref);
    ops->destroy(tier);
    kill(lender, SIGTERM);
    waitpid(lender, NULL, 0);
    rmdir(dir);
    return 0;
}
