#include <stdio.h>

#include "kvstrata_cmd.h"

int kvs_cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvstrata inspect: not built yet\n");
    return 2;
}
