/* kvstrata - the operator's command: one program, one subcommand per question an operator asks of a
 * deployment (docs/operations.md). */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvstrata_cmd.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"check", kvs_cmd_check, "validate a YAML file and open its tiers as an engine would"},
    {"stats", kvs_cmd_stats, "per-tier objects, bytes, hits, loads, saves of a deployment or node"},
    {"inspect", kvs_cmd_inspect, "what an SSD tier's directory holds; verify and repair it"},
    {"compare", kvs_cmd_compare, "one workload through two configurations, side by side"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out) {
    fprintf(out, "usage: kvstrata COMMAND [ARGS...]   (kvstrata COMMAND --help for each)\n\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nExit status: 0 done, 1 a problem was found (the output says which), 2 usage.\n"
                 "docs/operations.md has the commands, the metrics and recipes.\n");
}

static char exe_dir[PATH_MAX];

const char *kvs_cmd_exe_dir(void) {
    return exe_dir;
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof exe_dir - 1);
    if (n > 0) {
        exe_dir[n] = '\0';
        char *slash = strrchr(exe_dir, '/');
        if (slash) *slash = '\0';
    } else {
        exe_dir[0] = '\0';
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvstrata: no command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
