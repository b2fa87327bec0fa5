/*
 * ssd_format.h - the ssd tier's on-disk format: one data file per path, a 4KiB superblock, then
 * fixed slots of [4KiB unit header][stripe_bytes of data]. All integers are little-endian; every
 * header carries an XXH3-64 checksum of its own fields. Layout tables are in docs/ssd.md.
 */
#ifndef KVS_SSD_FORMAT_H
#define KVS_SSD_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

#define SSD_BLOCK           4096u /* O_DIRECT alignment, superblock and unit header size */
#define SSD_FORMAT_VERSION  1u
#define SSD_TIER_NAME_BYTES 64u /* tier name kept in the superblock, NUL-padded */
#define SSD_TIER_NAME_KEPT  96u /* the tier's name as a tier keeps it (and names its files by) */

typedef struct ssd_superblock {
    uint64_t stripe_bytes; /* data bytes per slot */
    uint64_t slot_bytes;   /* SSD_BLOCK + stripe_bytes */
    uint64_t n_slots;
    char tier_name[SSD_TIER_NAME_BYTES];
} ssd_superblock;

typedef struct ssd_unit_header {
    kvs_key key;
    uint64_t object_len;
    uint64_t sequence; /* per-tier write number; the newest complete one of a key wins */
    uint32_t unit_index, unit_count;
    uint32_t replica_index, replica_count;
    uint64_t stripe_bytes;
    uint32_t data_bytes;    /* bytes of object data in this unit */
    uint64_t data_checksum; /* XXH3-64 of those bytes */
} ssd_unit_header;

/* Encode into a zeroed SSD_BLOCK buffer (the caller zeroes it). */
void ssd_format_encode_superblock(const ssd_superblock *sb, uint8_t *block);
/* 0 when block holds a superblock of this format version with a valid checksum. */
int ssd_format_decode_superblock(const uint8_t *block, ssd_superblock *sb);

void ssd_format_encode_unit(const ssd_unit_header *h, uint8_t *block);
/* 0 when block holds a unit header with a valid checksum whose fields agree with each other
 * (unit index below count, data bytes the unit's share of object_len for stripe_bytes). */
int ssd_format_decode_unit(const uint8_t *block, ssd_unit_header *h);

/* 1 when block starts with a unit header's magic (whether or not the rest holds). */
int ssd_format_has_unit_magic(const uint8_t *block);

/* Units of an object of len bytes cut at stripe bytes: at least one (an empty object has one). */
uint32_t ssd_format_unit_count(uint64_t len, uint64_t stripe_bytes);
/* Data bytes of unit u of that object. */
uint64_t ssd_format_unit_bytes(uint64_t len, uint64_t stripe_bytes, uint32_t u);

/* The part of a path's data file name, <path>/kvstrata-<base>.data, made of the tier's name: its
 * characters [A-Za-z0-9_.-] kept (a leading '.' replaced), every other one replaced by '_'. */
void ssd_format_file_base(const char *tier, char *out, size_t len);
/* The name of a tier's data file in each of its paths, "kvstrata-<base>.data", for a tier named
 * tier: the name as the tier keeps it (its first SSD_TIER_NAME_KEPT - 1 bytes), made a base. */
void ssd_format_data_file(const char *tier, char *out, size_t len);

static inline uint64_t ssd_round_up(uint64_t v, uint64_t align) {
    return (v + align - 1) / align * align;
}

#endif /* KVS_SSD_FORMAT_H */
