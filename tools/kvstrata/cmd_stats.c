#include <stdio.h>

#include "kvstrata_cmd.h"

int kvs_cmd_stats(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvstrata stats: not built yet\n");
    return 2;
}
