/* test_support.h - helpers shared by the Check suites (not part of the library). */
#ifndef KVS_TEST_SUPPORT_H
#define KVS_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

/* Make a fresh directory under $TMPDIR (or /tmp) and return its path in buf. Returns 0 on success. */
int kvs_test_tmpdir(char *buf, size_t len);
/* Write `text` to dir/name; returns 0 on success and the full path in path_out. */
int kvs_test_write_file(const char *dir, const char *name, const char *text, char *path_out,
                        size_t path_len);
/* Remove a directory tree made by kvs_test_tmpdir. */
void kvs_test_rmtree(const char *dir);

#endif
