#include <stdio.h>

#include "kvstrata_cmd.h"

int kvs_cmd_check(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvstrata check: not built yet\n");
    return 2;
}
