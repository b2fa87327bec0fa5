/* main.c - kvstrata-node: command line, signals, readiness and final stats lines (docs/node.md). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "abi/kvstrata_server.h"
#include "common/metrics.h"
#include "common/units.h"
#include "node.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: kvstrata-node --config PATH [--psk-file PATH] [--listen HOST:PORT] [--max-clients "
        "N]\n"
        "       kvstrata-node --psk-file PATH --tenant-key TENANT --out PATH\n"
        "                     [--max-handshakes N] [--timeout-ms N] [--max-object-bytes SIZE]\n"
        "                     [--busy-poll-us N] [--shared-memory-payloads on|off]\n"
        "                     [--encrypt on|off] [--metrics HOST:PORT]\n"
        "  Each flag overrides the same setting of the config's `node:` section (docs/node.md).\n"
        "  --psk-file PATH         the master key file (required here or as node.psk_file);\n"
        "                          SIGHUP reads it again (a rotation)\n"
        "  --tenant-key TENANT --out PATH\n"
        "                          write TENANT's key, derived from the master key, to a new file\n"
        "                          PATH (mode 0600): what that tenant's clients give as psk_file\n"
        "  --listen HOST:PORT      IPv4 address and port to listen on (default 0.0.0.0:0; port 0 "
        "picks one)\n"
        "  --max-clients N         authenticated sessions served at once (default 64)\n"
        "  --max-handshakes N      connections not yet authenticated at once (default 16)\n"
        "  --max-sessions-per-tenant N\n"
        "                          sessions one tenant holds at once (default: --max-clients)\n"
        "  --timeout-ms N          bound on each send, RMA transfer and handshake (default 5000)\n"
        "  --max-object-bytes SIZE largest object stored or served (default 64MiB)\n"
        "  --busy-poll-us N        poll UCX this long after work before sleeping (default 200)\n"
        "  --shared-memory-payloads on|off\n"
        "                          clients on this host get payloads over UCX shared memory\n"
        "                          (experimental; default off)\n"
        "  --encrypt on|off        every client connection over TLS 1.3 keyed by its tenant's "
        "key;\n"
        "                          plain clients and objects over UCX refused (default off)\n"
        "  --metrics HOST:PORT     serve Prometheus metrics at http://HOST:PORT/metrics: tiers,\n"
        "                          counters, each tenant's traffic (default: the config's\n"
        "                          `metrics:` section, else off)\n");
}

static int parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (!text || !*text || *text == '-') return -1;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* --tenant-key: derive one tenant's key from the master key and write it to a new file. */
static int write_tenant_key(const char *psk_path, const char *tenant, const char *out) {
    char err[512] = "";
    kvs_remote_psk master, key;
    if (!psk_path || !out) {
        fprintf(stderr, "kvstrata-node: --tenant-key needs --psk-file and --out\n");
        return 2;
    }
    if (!kvs_wire_tenant_ok(tenant, (uint32_t)strlen(tenant))) {
        fprintf(stderr, "kvstrata-node: tenant \"%s\": 1..%u characters of A-Z a-z 0-9 . _ -\n",
                tenant, KVS_WIRE_MAX_TENANT_BYTES);
        return 2;
    }
    if (kvs_remote_psk_load(psk_path, &master, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "kvstrata-node: %s\n", err);
        return 2;
    }
    kvs_status st = kvs_remote_tenant_psk(&master, tenant, strlen(tenant), &key);
    kvs_remote_psk_clear(&master);
    int fd = st == KVS_OK ? open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
    const char *why = st != KVS_OK ? "the key did not derive" : fd < 0 ? strerror(errno) : NULL;
    ssize_t wrote = fd >= 0 ? write(fd, key.bytes, key.len) : -1;
    if (!why && wrote != (ssize_t)key.len) why = wrote < 0 ? strerror(errno) : "a short write";
    if (fd >= 0 && close(fd) != 0 && !why) why = strerror(errno);
    kvs_remote_psk_clear(&key);
    if (why) {
        if (fd >= 0) unlink(out); /* no partial key file left behind */
        fprintf(stderr, "kvstrata-node: cannot write %s: %s\n", out, why);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *config_path = NULL, *psk_path = NULL, *listen = NULL;
    const char *tenant_key = NULL, *out_path = NULL, *metrics = NULL;
    uint64_t max_clients = 0, max_handshakes = 0, timeout_ms = 0, max_object = 0; /* 0: not given */
    uint64_t busy_poll = UINT64_MAX;                                              /* not given */
    uint64_t per_tenant = 0;                                                      /* not given */
    int shm_payloads = -1;                                                        /* not given */
    int encrypt = -1;                                                             /* not given */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--config")) {
            config_path = v;
        } else if (!strcmp(a, "--psk-file")) {
            psk_path = v;
        } else if (!strcmp(a, "--tenant-key")) {
            tenant_key = v;
        } else if (!strcmp(a, "--out")) {
            out_path = v;
        } else if (!strcmp(a, "--listen")) {
            listen = v;
        } else if (!strcmp(a, "--metrics")) {
            char why[200];
            bad = kvs_metrics_check_listen(v, why, sizeof why) != 0;
            metrics = v;
        } else if (!strcmp(a, "--max-clients")) {
            bad = parse_u64(v, 1, 1u << 20, &max_clients);
        } else if (!strcmp(a, "--max-handshakes")) {
            bad = parse_u64(v, 1, 1u << 16, &max_handshakes);
        } else if (!strcmp(a, "--max-sessions-per-tenant")) {
            bad = parse_u64(v, 1, 1u << 20, &per_tenant);
        } else if (!strcmp(a, "--timeout-ms")) {
            bad = parse_u64(v, 1, 3600000, &timeout_ms);
        } else if (!strcmp(a, "--busy-poll-us")) {
            bad = parse_u64(v, 0, 100000, &busy_poll);
        } else if (!strcmp(a, "--shared-memory-payloads")) {
            bad = strcmp(v, "on") != 0 && strcmp(v, "off") != 0;
            shm_payloads = strcmp(v, "on") == 0;
        } else if (!strcmp(a, "--encrypt")) {
            bad = strcmp(v, "on") != 0 && strcmp(v, "off") != 0;
            encrypt = strcmp(v, "on") == 0;
        } else if (!strcmp(a, "--max-object-bytes")) {
            bad = kvs_units_parse_size(v, &max_object, NULL, 0) != KVS_OK || max_object == 0 ||
                  max_object > (1ull << 32);
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "kvstrata-node: bad argument %s%s%s\n", a, v ? " " : "", v ? v : "");
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (tenant_key) return write_tenant_key(psk_path, tenant_key, out_path);
    if (!config_path) {
        fprintf(stderr, "kvstrata-node: --config is required\n");
        usage(stderr);
        return 2;
    }
    char err[1024] = "";
    kvs_server_config *cfg = NULL;
    if (kvs_server_config_load(config_path, &cfg, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "kvstrata-node: %s\n", err);
        return 2;
    }
    const kvs_server_settings *set = kvs_server_config_settings(cfg);
    /* command line, else the config's node: section, else the defaults */
    if (!psk_path && set->node.psk_file[0]) psk_path = set->node.psk_file;
    if (!listen) listen = set->node.listen[0] ? set->node.listen : "0.0.0.0:0";
    if (!max_clients) max_clients = set->node.max_clients ? set->node.max_clients : 64;
    if (!max_handshakes) max_handshakes = set->node.max_handshakes ? set->node.max_handshakes : 16;
    if (!timeout_ms) timeout_ms = set->node.timeout_ms ? set->node.timeout_ms : 5000;
    if (!per_tenant) per_tenant = set->node.max_sessions_per_tenant;
    if (!max_object)
        max_object = set->node.max_object_bytes ? set->node.max_object_bytes : 64ull << 20;
    if (busy_poll == UINT64_MAX)
        busy_poll = set->node.busy_poll_us ? set->node.busy_poll_us - 1u : 200u;
    if (shm_payloads < 0) shm_payloads = set->node.shared_memory_payloads == 2;
    if (encrypt < 0) encrypt = set->node.encrypt == 2;
    /* the segment's name: the config's metrics.name, else derived from the address served */
    static char metrics_listen[128], metrics_name[64];
    if (!metrics && set->metrics.listen[0]) metrics = set->metrics.listen;
    if (metrics) {
        snprintf(metrics_listen, sizeof metrics_listen, "%s", metrics);
        if (set->metrics.name[0])
            snprintf(metrics_name, sizeof metrics_name, "%s", set->metrics.name);
        else
            kvs_metrics_default_name(metrics_listen, metrics_name, sizeof metrics_name);
    }
    if (!psk_path) {
        fprintf(stderr,
                "kvstrata-node: no pre-shared key file: give --psk-file or node.psk_file in %s\n",
                config_path);
        kvs_server_config_free(cfg);
        return 2;
    }
    static char psk_file[4096]; /* the config is freed once the node runs; SIGHUP reads it again */
    snprintf(psk_file, sizeof psk_file, "%s", psk_path);
    psk_path = psk_file;
    char host[256];
    uint64_t port = 0;
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host ||
        parse_u64(colon + 1, 0, 65535, &port) != 0) {
        fprintf(stderr, "kvstrata-node: --listen %s: expected HOST:PORT\n", listen);
        kvs_server_config_free(cfg);
        return 2;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';

    /* Signals go to the loop through a signalfd; block them before UCX starts its threads. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) {
        perror("kvstrata-node: sigprocmask");
        kvs_server_config_free(cfg);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL); /* the rkey checks wait for their children (a parent may ignore it) */
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        perror("kvstrata-node: signalfd");
        kvs_server_config_free(cfg);
        return 1;
    }

    int rc = 1;
    kvs_node *node = NULL;
    kvs_remote_psk psk;
    memset(&psk, 0, sizeof psk);
    if (kvs_remote_psk_load(psk_path, &psk, err, sizeof err) != KVS_OK) goto out;
    kvs_node_params p = {.config = cfg,
                         .psk = &psk,
                         .listen_host = host,
                         .listen_port = (uint16_t)port,
                         .max_clients = (uint32_t)max_clients,
                         .max_handshakes = (uint32_t)max_handshakes,
                         .timeout_ms = (int)timeout_ms,
                         .max_sessions_per_tenant = (uint32_t)per_tenant,
                         .max_object_bytes = max_object,
                         .max_refusals = 16,
                         .busy_poll_us = (uint32_t)busy_poll,
                         .shm_payloads = shm_payloads,
                         .encrypt = encrypt,
                         .metrics_listen = metrics ? metrics_listen : NULL,
                         .metrics_name = metrics ? metrics_name : NULL};
    kvs_status st = kvs_node_create(&p, &node, err, sizeof err);
    kvs_remote_psk_clear(&psk);
    kvs_server_config_free(cfg);
    cfg = NULL;
    if (st != KVS_OK) goto out;

    printf("kvstrata-node ready listen=%s:%u tiers=%u\n", host, kvs_node_port(node),
           kvs_node_tier_count(node));
    fflush(stdout);
    const char *signame = "signal";
    for (;;) {
        kvs_node_run(node, sfd);
        struct signalfd_siginfo si;
        if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si) continue;
        if (si.ssi_signo != SIGHUP) {
            signame = si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM";
            break;
        }
        /* a rotation: new handshakes derive tenants' keys from the file as it is now */
        if (kvs_remote_psk_load(psk_path, &psk, err, sizeof err) == KVS_OK) {
            kvs_node_set_psk(node, &psk);
            kvs_remote_psk_clear(&psk);
            fprintf(stderr, "kvstrata-node: SIGHUP: key file %s read again\n", psk_path);
        } else {
            fprintf(stderr, "kvstrata-node: SIGHUP: %s; the key in use stays\n", err);
        }
    }

    kvs_node_stats s;
    kvs_node_get_stats(node, &s);
    kvs_node_destroy(node);
    node = NULL;
    printf("kvstrata-node stopped on %s connections=%llu rejected=%llu handshake_refusals=%llu "
           "handshake_timeouts=%llu unknown_sessions=%llu auth_ok=%llu auth_failures=%llu "
           "refusals=%llu lookups=%llu hits=%llu misses=%llu gets=%llu puts=%llu deletes=%llu "
           "bytes_in=%llu bytes_out=%llu late_puts=%llu payloads_refused=%llu "
           "quota_evictions=%llu\n",
           signame, (unsigned long long)s.connections, (unsigned long long)s.rejected,
           (unsigned long long)s.handshake_refusals, (unsigned long long)s.handshake_timeouts,
           (unsigned long long)s.unknown_sessions, (unsigned long long)s.auth_ok,
           (unsigned long long)s.auth_failures, (unsigned long long)s.refusals,
           (unsigned long long)s.lookups, (unsigned long long)s.hits, (unsigned long long)s.misses,
           (unsigned long long)s.gets, (unsigned long long)s.puts, (unsigned long long)s.deletes,
           (unsigned long long)s.bytes_in, (unsigned long long)s.bytes_out,
           (unsigned long long)s.late_puts, (unsigned long long)s.payloads_refused,
           (unsigned long long)s.quota_evictions);
    fflush(stdout);
    rc = 0;
out:
    if (rc != 0) fprintf(stderr, "kvstrata-node: %s\n", err[0] ? err : "failed");
    kvs_remote_psk_clear(&psk);
    kvs_server_config_free(cfg);
    close(sfd);
    return rc;
}
