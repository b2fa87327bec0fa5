/* xxh3_secret.c - the default XXH3 secret, taken from libxxhash's own header so that kvs_xxh3
 * (xxh3.c) hashes with exactly the library's constants. Only this file includes the header's
 * implementation, so the library's functions elsewhere stay the linked (and dispatched) ones. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "xxh3_secret.h"

_Static_assert(sizeof(XXH3_kSecret) == 192, "the XXH3 default secret is 192 bytes");

const uint8_t *kvs_xxh3_secret(void) {
    return XXH3_kSecret;
}
