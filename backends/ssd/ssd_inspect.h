/*
 * ssd_inspect.h - what an ssd tier's data files hold, read without opening the tier: the objects
 * its restart scan would find (the same selection: per key the newest sequence with every unit),
 * what each object is (told by the caller, which knows what the tier stores: for kvstrata the KV
 * object's header and its model fingerprint) and on request every unit copy's data checked against
 * its checksum. A repair drops what the tier cannot serve as the tier drops a corrupt object (an
 * all-zero block over the header of unit 0 of each copy); with replicas, a bad copy of a unit that
 * has another good copy is retired alone (its header zeroed), so the restart scan serves the object
 * from the good one. Listing and verifying open the files read-only and work while a tier has them
 * open; a repair takes the tier's own lock (flock on each data file) and is refused while another
 * process holds it. Used by `kvstrata inspect ssd`, `kvstrata stats` and `kvstrata check`.
 */
#ifndef KVS_SSD_INSPECT_H
#define KVS_SSD_INSPECT_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "common/progress.h"

#define KVS_SSD_INSPECT_MAX_FILES 64

/* The name of tier's data file in each of its paths (kvstrata-<tier's name made safe>.data), as
 * the tier names it. len: at least 128. */
void kvs_ssd_data_file_name(const char *tier, char *out, size_t len);

/* A quick count over the data files in paths (every kvstrata-*.data there): objects and their
 * bytes as the restart scan would find them, capacity (data bytes of all slots), damaged (what the
 * headers alone show: a unit header whose checksum fails, an object cut off by a truncated file, a
 * file without a valid superblock) and paths (data files read). No data is checked; read-only,
 * so it works while a process has the tier open. KVS_EIO with a sentence when no path could be
 * read. */
typedef struct kvs_ssd_inspect_summary {
    uint64_t objects, bytes, capacity, damaged, paths;
} kvs_ssd_inspect_summary;
kvs_status kvs_ssd_inspect_summary_of(const char *const *paths, uint32_t n_paths,
                                      kvs_ssd_inspect_summary *out, char *err, size_t err_len);

enum {
    KVS_SSD_INSPECT_LIST = 0,   /* headers only, and each object's KV header for its fingerprint */
    KVS_SSD_INSPECT_VERIFY = 1, /* and every unit copy's data against its checksum */
    KVS_SSD_INSPECT_REPAIR = 2, /* verify, then drop what is damaged */
    KVS_SSD_INSPECT_QUICK = 3,  /* headers only (kvs_ssd_inspect_summary_of) */
};

/* One object the tier would serve (or, when damaged, trip on). */
typedef struct kvs_ssd_inspect_object {
    kvs_key key;
    uint64_t len, sequence;
    uint32_t units, replicas;
    uint32_t file;   /* report.files[] index of the first copy of unit 0 */
    uint64_t offset; /* of that copy's unit header in its file */
    int kv;          /* 1: the caller's content.describe recognised it and set the fields below */
    kvs_key fingerprint;
    uint32_t n_layers, n_tokens, codec;
    /* The format records no write time. A tier's sequence numbers start at the wall clock
     * (CLOCK_REALTIME ns) each time it opens and count its writes, so this is about when the tier
     * that wrote the object was opened: the object is no older than that. 0: not known. */
    uint64_t written_after_ns;
    int damaged, dropped;
} kvs_ssd_inspect_object;

/* Something wrong on disk: an object's unit, a unit header, a file. */
typedef struct kvs_ssd_inspect_damage {
    uint32_t file;   /* report.files[] index */
    uint64_t offset; /* in that file */
    int has_key;     /* the damage belongs to object key */
    kvs_key key;
    int dropped; /* a repair dropped it (or fixed the file, or retired the copy) */
    /* A bad unit copy whose unit has another good copy: the object is still whole (a repair
     * retires this copy alone and keeps the object). */
    int object_kept;
    char what[400];
} kvs_ssd_inspect_damage;

typedef struct kvs_ssd_inspect_file {
    char path[1024]; /* the data file */
    char tier[64];   /* the tier name its superblock records */
    int superblock_ok;
    uint64_t file_bytes, stripe_bytes, slot_bytes, n_slots;
    uint64_t capacity; /* n_slots * stripe_bytes */
    uint64_t units, bytes,
        objects;       /* live objects' unit copies here, their data bytes, objects with
                                     * a copy of a unit here */
    uint64_t mtime_ns; /* last change of the file (CLOCK_REALTIME) */
    int in_use;        /* a process holds the tier's lock on it */
    int in_use_pid;    /* that process, 0 when /proc/locks does not say */
    char note[256];    /* what is wrong with the file itself, "" when nothing */
} kvs_ssd_inspect_file;

/* What the stored bytes mean, from the caller: the tier stores objects as bytes, and what they hold
 * (for kvstrata a KV object, connector/object.h) is the caller's to read. */
typedef struct kvs_ssd_inspect_content {
    uint64_t head_bytes; /* the first bytes of an object describe wants (fewer when shorter) */
    /* head: the first head_len bytes of an object of object_len bytes. 1 when it is one the caller
     * knows, with o's fingerprint, n_layers, n_tokens and codec set; 0 when not. */
    int (*describe)(void *ctx, const uint8_t *head, uint64_t head_len, uint64_t object_len,
                    kvs_ssd_inspect_object *o);
    /* A whole object that describe recognised, every unit of it good (verify): 1 with a sentence
     * in what when its own checks fail (such an object is dropped by a repair), else 0. NULL: not
     * checked. */
    int (*check)(void *ctx, const uint8_t *object, uint64_t len, char *what, size_t what_len);
    void *ctx;
} kvs_ssd_inspect_content;

typedef struct kvs_ssd_inspect_options {
    int mode;         /* KVS_SSD_INSPECT_* */
    const char *tier; /* only this tier's files (kvstrata-<tier>.data); NULL: every one found */
    kvs_progress *progress; /* verify: begun by the caller with total 0, told objects checked */
    /* Called per object (in key order, per tier) and per damage found; NULL: not called. A repair
     * reports the objects left after it. */
    void (*on_object)(void *ctx, const kvs_ssd_inspect_object *o);
    void (*on_damage)(void *ctx, const kvs_ssd_inspect_damage *d);
    void *ctx;
    const kvs_ssd_inspect_content *content; /* NULL: every object is bytes (kv stays 0) */
} kvs_ssd_inspect_options;

typedef struct kvs_ssd_inspect_report {
    kvs_ssd_inspect_file files[KVS_SSD_INSPECT_MAX_FILES];
    uint32_t n_files;
    uint64_t objects, bytes, capacity;
    uint64_t damaged;       /* objects, unit headers and files found damaged */
    uint64_t dropped;       /* of those, dropped or fixed by a repair */
    uint64_t stray_units;   /* valid unit headers that belong to no live object: superseded,
                            * removed or unfinished writes, slots the tier reuses */
    uint64_t headers_read;  /* slots whose header was read */
    uint64_t checked_bytes; /* unit data read and checked */
    int in_use;             /* some file was locked by a running tier */
} kvs_ssd_inspect_report;

/* Inspect the data files in paths (each a tier directory, or a data file itself; a file reached
 * twice, through a link or as a directory and its file, is read once). Files of one tier (same
 * name) are read together, as the tier reads its paths. KVS_OK when every file could be
 * read (damage is counted in the report, not a failure); KVS_ESTATE for a repair refused because a
 * process holds the tier; KVS_EIO, KVS_ENOTFOUND (no data file), KVS_ENOMEM otherwise; a sentence
 * in err either way ("" when none). out is large: allocate it. */
kvs_status kvs_ssd_inspect_run(const char *const *paths, uint32_t n_paths,
                               const kvs_ssd_inspect_options *opt, kvs_ssd_inspect_report *out,
                               char *err, size_t err_len);

#endif /* KVS_SSD_INSPECT_H */
