/* key_file.h - reading a secret key from a file an operator made: the remote tier's pre-shared key,
 * an object integrity key. One rule for all of them, so a key is never read from a file others can
 * read or swap. Thread-safe, nothing kept. */
#ifndef KVS_KEY_FILE_H
#define KVS_KEY_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

/* Read the whole file at path into out (cap bytes) as the key, newline included: a regular file (not
 * a symlink) of min..cap bytes with no group or other permission bits (mode 0600 or 0400). *len gets
 * its size. Refusals: KVS_EIO (cannot open or read), KVS_EINVAL (permissions, size), with a
 * sentence that starts with `what` ("remote auth"). out is wiped on a refusal. */
kvs_status kvs_key_file_load(const char *what, const char *path, uint8_t *out, size_t cap,
                             size_t min, size_t *len, char *error, size_t error_len);

#endif
