/*
 * ssd_format.c - encode and check the ssd tier's superblock and unit headers (contract in
 * ssd_format.h). Field offsets are fixed here and in docs/ssd.md; change both or neither.
 */
#include "ssd_format.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#define SUPER_MAGIC 0x314644535353564BULL /* "KVSSSDF1" as little-endian bytes: the file */
#define UNIT_MAGIC  0x315544535353564BULL /* "KVSSSDU1": a unit */

/* Superblock field offsets. */
enum {
    SB_MAGIC = 0,
    SB_VERSION = 8,
    SB_HEADER_BYTES = 12,
    SB_STRIPE = 16,
    SB_SLOT = 24,
    SB_SLOTS = 32,
    SB_NAME = 40,
    SB_CHECKSUM = SB_NAME + SSD_TIER_NAME_BYTES, /* 104: XXH3-64 of bytes [0, 104) */
};

/* Unit header field offsets. */
enum {
    UH_MAGIC = 0,
    UH_VERSION = 8,
    UH_HEADER_BYTES = 12,
    UH_KEY = 16,
    UH_OBJECT_LEN = 32,
    UH_SEQUENCE = 40,
    UH_UNIT = 48,
    UH_UNITS = 52,
    UH_REPLICA = 56,
    UH_REPLICAS = 60,
    UH_STRIPE = 64,
    UH_DATA_BYTES = 72,
    UH_FLAGS = 76,
    UH_DATA_CHECKSUM = 80,
    UH_CHECKSUM = 88, /* XXH3-64 of bytes [0, 88) */
};

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void le_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t le_get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

void ssd_format_encode_superblock(const ssd_superblock *sb, uint8_t *block) {
    put64(block + SB_MAGIC, SUPER_MAGIC);
    le_put32(block + SB_VERSION, SSD_FORMAT_VERSION);
    le_put32(block + SB_HEADER_BYTES, SSD_BLOCK);
    put64(block + SB_STRIPE, sb->stripe_bytes);
    put64(block + SB_SLOT, sb->slot_bytes);
    put64(block + SB_SLOTS, sb->n_slots);
    memcpy(block + SB_NAME, sb->tier_name, SSD_TIER_NAME_BYTES);
    put64(block + SB_CHECKSUM, XXH3_64bits(block, SB_CHECKSUM));
}

int ssd_format_decode_superblock(const uint8_t *block, ssd_superblock *sb) {
    if (get64(block + SB_MAGIC) != SUPER_MAGIC ||
        le_get32(block + SB_VERSION) != SSD_FORMAT_VERSION ||
        le_get32(block + SB_HEADER_BYTES) != SSD_BLOCK ||
        get64(block + SB_CHECKSUM) != XXH3_64bits(block, SB_CHECKSUM))
        return -1;
    sb->stripe_bytes = get64(block + SB_STRIPE);
    sb->slot_bytes = get64(block + SB_SLOT);
    sb->n_slots = get64(block + SB_SLOTS);
    memcpy(sb->tier_name, block + SB_NAME, SSD_TIER_NAME_BYTES);
    sb->tier_name[SSD_TIER_NAME_BYTES - 1] = '\0';
    return 0;
}

void ssd_format_encode_unit(const ssd_unit_header *h, uint8_t *block) {
    put64(block + UH_MAGIC, UNIT_MAGIC);
    le_put32(block + UH_VERSION, SSD_FORMAT_VERSION);
    le_put32(block + UH_HEADER_BYTES, SSD_BLOCK);
    memcpy(block + UH_KEY, h->key.bytes, sizeof h->key.bytes);
    put64(block + UH_OBJECT_LEN, h->object_len);
    put64(block + UH_SEQUENCE, h->sequence);
    le_put32(block + UH_UNIT, h->unit_index);
    le_put32(block + UH_UNITS, h->unit_count);
    le_put32(block + UH_REPLICA, h->replica_index);
    le_put32(block + UH_REPLICAS, h->replica_count);
    put64(block + UH_STRIPE, h->stripe_bytes);
    le_put32(block + UH_DATA_BYTES, h->data_bytes);
    le_put32(block + UH_FLAGS, 0);
    put64(block + UH_DATA_CHECKSUM, h->data_checksum);
    put64(block + UH_CHECKSUM, XXH3_64bits(block, UH_CHECKSUM));
}

int ssd_format_has_unit_magic(const uint8_t *block) {
    return get64(block + UH_MAGIC) == UNIT_MAGIC;
}

uint32_t ssd_format_unit_count(uint64_t len, uint64_t stripe_bytes) {
    uint64_t n = len / stripe_bytes + (len % stripe_bytes != 0);
    if (n > UINT32_MAX) return UINT32_MAX; /* only a forged header gets here; it fails its checks */
    return n == 0 ? 1u : (uint32_t)n;
}

uint64_t ssd_format_unit_bytes(uint64_t len, uint64_t stripe_bytes, uint32_t u) {
    uint64_t start = (uint64_t)u * stripe_bytes;
    if (start >= len) return 0;
    return len - start < stripe_bytes ? len - start : stripe_bytes;
}

int ssd_format_decode_unit(const uint8_t *block, ssd_unit_header *h) {
    if (get64(block + UH_MAGIC) != UNIT_MAGIC ||
        le_get32(block + UH_VERSION) != SSD_FORMAT_VERSION ||
        le_get32(block + UH_HEADER_BYTES) != SSD_BLOCK || le_get32(block + UH_FLAGS) != 0 ||
        get64(block + UH_CHECKSUM) != XXH3_64bits(block, UH_CHECKSUM))
        return -1;
    memcpy(h->key.bytes, block + UH_KEY, sizeof h->key.bytes);
    h->object_len = get64(block + UH_OBJECT_LEN);
    h->sequence = get64(block + UH_SEQUENCE);
    h->unit_index = le_get32(block + UH_UNIT);
    h->unit_count = le_get32(block + UH_UNITS);
    h->replica_index = le_get32(block + UH_REPLICA);
    h->replica_count = le_get32(block + UH_REPLICAS);
    h->stripe_bytes = get64(block + UH_STRIPE);
    h->data_bytes = le_get32(block + UH_DATA_BYTES);
    h->data_checksum = get64(block + UH_DATA_CHECKSUM);
    if (h->stripe_bytes == 0 || h->stripe_bytes % SSD_BLOCK != 0 || h->replica_count == 0 ||
        h->replica_index >= h->replica_count || h->unit_index >= h->unit_count ||
        h->unit_count != ssd_format_unit_count(h->object_len, h->stripe_bytes) ||
        h->data_bytes != ssd_format_unit_bytes(h->object_len, h->stripe_bytes, h->unit_index))
        return -1;
    return 0;
}

void ssd_format_file_base(const char *tier, char *out, size_t len) {
    size_t n = 0;
    for (const char *c = tier; *c && n + 1 < len; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                 *c == '_' || *c == '-' || (*c == '.' && n > 0);
        out[n++] = ok ? *c : '_';
    }
    out[n] = '\0';
}

void ssd_format_data_file(const char *tier, char *out, size_t len) {
    char kept[SSD_TIER_NAME_KEPT], base[SSD_TIER_NAME_KEPT];
    snprintf(kept, sizeof kept, "%s", tier);
    ssd_format_file_base(kept, base, sizeof base);
    snprintf(out, len, "kvstrata-%s.data", base);
}
