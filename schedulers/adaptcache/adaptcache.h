/* adaptcache.h - where each stored entry lives and how hard it is compressed (AdaptCache;
 * docs/compress.md). A pure function: entries and capacities in, one option per
 * entry out, no I/O and no clock.
 *
 * An option is (device, codec) or "not stored". Its utility for entry i is
 *     U = F_i * (alpha * Q(i, codec) - T(i, device, codec))
 * where F_i is the entry's expected hits per second, Q its quality with that codec (1 for raw), and T
 * the delay of one hit: the device's latency, the stored bytes over its bandwidth, and the codec's
 * decode time (fixed plus per raw byte: the paper profiles it, then leaves it out). Not stored means
 * a recompute on a hit: Q = 1 and T = the entry's recompute time.
 *
 * The placement maximises the summed utility under both capacities with the paper's marginal-utility
 * greedy, with DRAM and SSD decided together: every entry starts at its best option, then while a
 * tier is over its capacity the move that loses the least utility per byte it frees there is made.
 * These moves go one way (down an entry's option list: DRAM options by size, SSD options by size,
 * not stored), so the loop ends; a last pass spends room the loop freed beyond what was needed on
 * the upgrades that gain the most per byte (still only codecs the entry may take). A move from DRAM into an SSD without room for it is charged the SSD's
 * current marginal utility per byte for the room it takes: the two tiers are priced together rather
 * than DRAM first and SSD with what is left. On one tier this is the classic multiple-choice knapsack
 * greedy: never worse than the optimum minus the largest single step's utility. */
#ifndef KVS_ADAPTCACHE_H
#define KVS_ADAPTCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_AC_MAX_CODECS 8
#define KVS_AC_DRAM       0
#define KVS_AC_SSD        1
#define KVS_AC_NONE       (-1) /* not stored */

typedef struct kvs_ac_device {
    double latency_s;   /* fixed cost of one hit */
    double bytes_per_s; /* device to engine, > 0 */
    uint64_t capacity;  /* bytes */
} kvs_ac_device;

typedef struct kvs_ac_codec_cost {
    double fixed_s;        /* decode launch cost of one hit */
    double s_per_raw_byte; /* decode time per byte of the decoded (raw) object */
} kvs_ac_codec_cost;

typedef struct kvs_ac_params {
    double alpha;       /* seconds of delay one unit of quality is worth (>= 0) */
    double freq_prior;  /* F for entries whose frequency is unknown (a new entry; > 0) */
    double min_quality; /* options of lower quality are never chosen (0: none barred) */
    uint32_t n_codecs;  /* codec 0 is raw (lossless) */
    kvs_ac_codec_cost codecs[KVS_AC_MAX_CODECS];
    kvs_ac_device devices[2]; /* KVS_AC_DRAM, KVS_AC_SSD */
} kvs_ac_params;

typedef struct kvs_ac_entry {
    uint64_t raw_bytes;
    double freq;        /* expected hits per second; < 0: unknown, use freq_prior */
    double recompute_s; /* delay of a hit when it is not stored */
    /* per codec: stored bytes (0: not available for this entry) and quality in [0, 1] (codec 0, raw,
     * is lossless: its quality is 1 whatever quality[0] says) */
    uint64_t bytes[KVS_AC_MAX_CODECS];
    double quality[KVS_AC_MAX_CODECS];
    /* codecs this entry may take, bit c for codec c: a stored lossy entry can only become lossier
     * (re-encoding never gets precision back), and a tier without allow_lossy offers codec 0 only */
    uint32_t allowed;
    /* devices it may take, bit d (1 << KVS_AC_DRAM | 1 << KVS_AC_SSD for both) */
    uint32_t devices;
} kvs_ac_entry;

typedef struct kvs_ac_choice {
    int8_t device; /* KVS_AC_DRAM, KVS_AC_SSD or KVS_AC_NONE */
    uint8_t codec;
} kvs_ac_choice;

typedef struct kvs_ac_result {
    double utility;      /* summed over the entries */
    uint64_t used[2];    /* bytes placed on each device, <= its capacity */
    uint64_t moves;      /* greedy steps taken */
    double largest_step; /* utility lost by the costliest single step */
    double mean_quality; /* frequency-weighted (not stored counts as 1: a recompute) */
    double mean_delay_s; /* frequency-weighted */
} kvs_ac_result;

/* Utility of one option (codec ignored for KVS_AC_NONE). */
double kvs_ac_utility(const kvs_ac_params *p, const kvs_ac_entry *e, int device, uint32_t codec);

/* Place n entries: out[i] for entry i. KVS_EINVAL (and nothing written) for parameters out of range
 * (alpha < 0, a bandwidth <= 0, n_codecs outside 1 .. KVS_AC_MAX_CODECS, freq_prior <= 0, any number
 * not finite, a quality outside [0, 1]); KVS_ENOMEM if scratch cannot be allocated. result may be
 * NULL. */
kvs_status kvs_ac_place(const kvs_ac_params *p, const kvs_ac_entry *entries, size_t n,
                        kvs_ac_choice *out, kvs_ac_result *result);

/* A quality curve measured once per model: quality at increasing relative reconstruction errors
 * (points sorted by error; at most 16 are read), linear between points, flat outside them, made
 * non-increasing. */
typedef struct kvs_ac_curve {
    uint32_t n;
    double error[16];
    double quality[16];
} kvs_ac_curve;

double kvs_ac_quality_from_error(const kvs_ac_curve *c, double rel_error);

#ifdef __cplusplus
}
#endif

#endif
