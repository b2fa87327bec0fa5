/* units.h - the one grammar of sizes and rates that every configuration value uses (YAML keys and
 * backend options alike); docs/configuration.md ("Value types") states it for users. Pure functions
 * of their text: thread-safe, nothing kept.
 *
 * A size is DIGITS[.DIGITS], then optional spaces and a unit, with nothing before or after:
 *   no unit or B          bytes                    4096, 7B
 *   K KiB  M MiB  G GiB  T TiB   powers of 1024    4KiB, 4K, 1.5 GiB
 *   KB MB GB TB           powers of 1000           4MB, 1.5GB
 * Units are case-sensitive (`kb`, `Gb`, `gib` are refused). A fraction is accepted when the result is
 * a whole number of bytes (0.5KiB, not 1.1GiB). Refused: empty, a sign, a leading or trailing dot,
 * exponents, hex, separators, tabs, spaces with no unit after them, anything after the unit, and more
 * than 2^64-1 bytes. 0 is a size (callers that need more check it).
 *
 * A rate is a size per second: SIZE/s (250MB/s, 1.5GiB/s, 4096/s). A bare SIZE is read as per second
 * too: the spelling dram's read_bandwidth, ssd's sim_bandwidth and the restore profile's bandwidth
 * accepted before rates had their own grammar. Nothing may stand between the unit and `/s`.
 */
#ifndef KVS_UNITS_H
#define KVS_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

/* The units in the order refusals list them. */
#define KVS_UNITS_LIST \
    "B, K, KiB, M, MiB, G, GiB, T, TiB (powers of 1024), KB, MB, GB, TB (powers of 1000)"

/* text -> *bytes. KVS_OK, or KVS_EINVAL with *bytes untouched and a phrase in why (why may be NULL):
 * "unknown unit 'Gb' (units: ...)", "the size is not a whole number of bytes", ... */
kvs_status kvs_units_parse_size(const char *text, uint64_t *bytes, char *why, size_t why_len);

/* text -> *bytes_per_s, as kvs_units_parse_size with an optional "/s" after the size. */
kvs_status kvs_units_parse_rate(const char *text, uint64_t *bytes_per_s, char *why, size_t why_len);

#endif /* KVS_UNITS_H */
