/* xxh3_secret.h - libxxhash's default XXH3 secret, for xxh3.c (internal to common/). */
#ifndef KVS_XXH3_SECRET_H
#define KVS_XXH3_SECRET_H

#include <stdint.h>

/* The 192 bytes of the default secret. */
const uint8_t *kvs_xxh3_secret(void);

#endif
