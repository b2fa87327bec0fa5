#include <stdio.h>

#include "kvstrata_cmd.h"

int kvs_cmd_compare(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvstrata compare: not built yet\n");
    return 2;
}
