#include "test_support.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvs_test_tmpdir(char *buf, size_t len) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    int n = snprintf(buf, len, "%s/kvs-test-XXXXXX", base);
    if (n < 0 || (size_t)n >= len) return -1;
    return mkdtemp(buf) ? 0 : -1;
}

int kvs_test_write_file(const char *dir, const char *name, const char *text, char *path_out,
                        size_t path_len) {
    int n = snprintf(path_out, path_len, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= path_len) return -1;
    FILE *f = fopen(path_out, "w");
    if (!f) return -1;
    size_t want = strlen(text);
    size_t put = fwrite(text, 1, want, f);
    if (fclose(f) != 0 || put != want) return -1;
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void kvs_test_rmtree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
