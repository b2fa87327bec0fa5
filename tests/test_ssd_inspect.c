/* test_ssd_inspect.c - reading an ssd tier's files without the tier (backends/ssd/ssd_inspect.h):
 * what a listing counts, what --verify finds (exactly the damage planted, nothing changed on disk),
 * what --repair drops (and that the tier then serves the rest and misses the dropped), a repair
 * refused while the tier is open, with replicas a bad copy retired alone (its object kept), a file
 * reached twice read once, data files named as the tier names them, and the progress lines of a
 * slow index rebuild. */
#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/ssd/ssd.h"
#include "backends/ssd/ssd_format.h"
#include "backends/ssd/ssd_inspect.h"
#include "common/xxh3.h"
#include "connector/object.h"
#include "tests/support/objects.h"
#include "tests/support/ssd_tier.h"
#include "tests/support/test_support.h"
#include "tools/kvstrata/inspect_kv.h"

#define KIB   1024ull
#define MIB   (1024ull * 1024ull)
#define N_OBJ 12
#define PLAIN 11 /* the one object that is not a KV object: bytes of kvs_test_fill */

static const kvs_backend_ops *ops;

static void setup(void) {
    kvs_test_ssd_setup();
    ops = kvs_ssd_backend();
}

/* Two paths, 16KiB stripes: objects of up to 4 units, spread over both files. */
static const kvs_test_ssd_args tier_args = {.n_paths = 2,
                                            .capacity = 8 * MIB,
                                            .max_object = 64 * KIB,
                                            .options = {{"stripe_bytes", "16KiB"}}};

static kvs_key fingerprint_of(uint32_t i) {
    return kvs_test_key(i % 2 ? 2000 : 1000); /* two models (or namespaces): even and odd */
}

/* Object i into buf (64KiB): a sealed KV object of 2 layers under fingerprint_of(i); object 9 is
 * sealed, then one byte of its layer 1 changes (written damaged: its units' checksums hold, its KV
 * layer checksum does not); object PLAIN is 5000 bytes of kvs_test_fill. Returns its length. */
static uint64_t build_object(uint32_t i, uint8_t *buf) {
    if (i == PLAIN) {
        kvs_test_fill(buf, 5000, 77);
        return 5000;
    }
    uint64_t layer_bytes = 1000 + 2400ull * i;
    kvs_key fp = fingerprint_of(i), key = kvs_test_key(i);
    memset(buf, 0, kvs_object_bytes(2, layer_bytes)); /* the padding before the payload too */
    kvs_object_init(buf, &fp, &key, 2, 16, layer_bytes);
    for (uint32_t l = 0; l < 2; l++) {
        uint8_t *layer = kvs_object_layer(buf, l);
        kvs_test_fill(layer, layer_bytes, i * 10 + l);
        kvs_object_layer_hashes(buf)[l] = kvs_xxh3_64(layer, layer_bytes);
    }
    kvs_object_seal(buf);
    if (i == 9) kvs_object_layer(buf, 1)[7] ^= 0x40;
    return kvs_object_bytes(2, layer_bytes);
}

static uint64_t total_bytes(void) {
    uint8_t *buf = malloc(64 * KIB);
    ck_assert_ptr_nonnull(buf);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < N_OBJ; i++) sum += build_object(i, buf);
    free(buf);
    return sum;
}

static void store_objects(const kvs_test_dirs *d) {
    void *st = kvs_test_ssd_open(d, &tier_args);
    uint8_t *buf = malloc(64 * KIB);
    ck_assert_ptr_nonnull(buf);
    for (uint32_t i = 0; i < N_OBJ; i++) {
        uint64_t len = build_object(i, buf);
        kvs_key k = kvs_test_key(i);
        ck_assert_int_eq(ops->put(st, &k, buf, len), KVS_OK);
    }
    kvs_test_ssd_flush(st);
    free(buf);
    ops->destroy(st);
}

/* What the callbacks saw. */
typedef struct seen {
    kvs_ssd_inspect_object objects[64];
    uint32_t n_objects;
    kvs_ssd_inspect_damage damage[64];
    uint32_t n_damage;
} seen;

static void on_object(void *ctx, const kvs_ssd_inspect_object *o) {
    seen *s = ctx;
    ck_assert_uint_lt(s->n_objects, 64);
    s->objects[s->n_objects++] = *o;
}

static void on_damage(void *ctx, const kvs_ssd_inspect_damage *d) {
    seen *s = ctx;
    ck_assert_uint_lt(s->n_damage, 64);
    s->damage[s->n_damage++] = *d;
}

static kvs_status inspect(const kvs_test_dirs *d, int mode, seen *s, kvs_ssd_inspect_report *rep,
                          char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    const char *paths[2] = {d->dir[0], d->dir[1]};
    kvs_ssd_inspect_options opt = {.mode = mode,
                                   .on_object = on_object,
                                   .on_damage = on_damage,
                                   .ctx = s,
                                   .content = cli_inspect_kv_content()};
    return kvs_ssd_inspect_run(paths, 2, &opt, rep, err, err_len);
}

static const kvs_ssd_inspect_object *find_object(const seen *s, uint32_t i) {
    kvs_key k = kvs_test_key(i);
    for (uint32_t j = 0; j < s->n_objects; j++)
        if (!memcmp(&s->objects[j].key, &k, sizeof k)) return &s->objects[j];
    return NULL;
}

static void data_file(const kvs_test_dirs *d, int path, char *out, size_t len) {
    snprintf(out, len, "%s/kvstrata-ssd0.data", d->dir[path]);
}

static uint64_t file_hash(const char *path) {
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    uint64_t h = kvs_xxh3_64(buf, (size_t)st.st_size) ^ (uint64_t)st.st_size;
    free(buf);
    return h;
}

static void flip_byte(const char *path, uint64_t offset) {
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, (off_t)offset), 1);
    b ^= 0x01;
    ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)offset), 1);
    close(fd);
}

/* The planted damage: object 2's payload (a flipped byte in unit 0's data), object 4's unit 0
 * header (a flipped key byte: the magic holds, the checksum does not), and the file holding object
 * PLAIN (the last one written, so the highest slot of its file) cut 100 bytes into its data. With
 * object 9, written damaged, that is five things to find. Returns the listing before. */
typedef struct planted {
    seen before;
    uint32_t header_file, truncated_file;
    uint64_t header_offset, truncated_at;
} planted;

static void plant_damage(const kvs_test_dirs *d, planted *p) {
    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    ck_assert_ptr_nonnull(rep);
    char err[512];
    ck_assert_int_eq(inspect(d, KVS_SSD_INSPECT_LIST, &p->before, rep, err, sizeof err), KVS_OK);
    const kvs_ssd_inspect_object *o2 = find_object(&p->before, 2), *o4 = find_object(&p->before, 4),
                                 *plain = find_object(&p->before, PLAIN);
    ck_assert_ptr_nonnull(o2);
    ck_assert_ptr_nonnull(o4);
    ck_assert_ptr_nonnull(plain);
    ck_assert_uint_eq(plain->units, 1);
    for (uint32_t j = 0; j < p->before.n_objects; j++) /* nothing lies past PLAIN in its file */
        if (p->before.objects[j].file == plain->file)
            ck_assert_uint_le(p->before.objects[j].offset, plain->offset);
    flip_byte(rep->files[o2->file].path, o2->offset + 4096 + 5000);
    p->header_file = o4->file;
    p->header_offset = o4->offset;
    flip_byte(rep->files[o4->file].path, o4->offset + 20);
    p->truncated_file = plain->file;
    p->truncated_at = plain->offset + 4096 + 100;
    ck_assert_int_eq(truncate(rep->files[plain->file].path, (off_t)p->truncated_at), 0);
    free(rep);
}

START_TEST(a_listing_counts_objects_bytes_and_fingerprints_as_stored) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    store_objects(&d);
    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    ck_assert_ptr_nonnull(rep);
    seen *s = malloc(sizeof *s);
    ck_assert_ptr_nonnull(s);
    char err[512];
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_LIST, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(rep->n_files, 2);
    ck_assert_uint_eq(rep->objects, N_OBJ);
    ck_assert_uint_eq(s->n_objects, N_OBJ);
    ck_assert_uint_eq(rep->bytes, total_bytes());
    ck_assert_uint_eq(rep->damaged, 0);
    ck_assert_uint_eq(s->n_damage, 0);
    ck_assert_int_eq(rep->in_use, 0);
    /* per fingerprint: 6 of the even model, 5 of the odd, one that is not a KV object */
    uint32_t even = 0, odd = 0, plain = 0;
    kvs_key fe = fingerprint_of(0), fo = fingerprint_of(1);
    uint8_t *buf = malloc(64 * KIB);
    ck_assert_ptr_nonnull(buf);
    for (uint32_t i = 0; i < N_OBJ; i++) {
        const kvs_ssd_inspect_object *o = find_object(s, i);
        ck_assert_msg(o != NULL, "object %u is not listed", i);
        ck_assert_uint_eq(o->len, build_object(i, buf));
        ck_assert_uint_eq(o->units, (o->len + 16 * KIB - 1) / (16 * KIB));
        ck_assert_uint_ne(o->written_after_ns, 0);
        if (!o->kv) {
            plain++;
            continue;
        }
        ck_assert_uint_eq(o->n_layers, 2);
        ck_assert_uint_eq(o->n_tokens, 16);
        if (!memcmp(&o->fingerprint, &fe, sizeof fe)) even++;
        if (!memcmp(&o->fingerprint, &fo, sizeof fo)) odd++;
    }
    free(buf);
    ck_assert_uint_eq(even, 6);
    ck_assert_uint_eq(odd, 5);
    ck_assert_uint_eq(plain, 1);
    /* per path: units of both files add up to every object's units, each file its capacity */
    uint64_t units = 0, file_units = 0, file_bytes = 0;
    for (uint32_t j = 0; j < s->n_objects; j++) units += s->objects[j].units;
    for (uint32_t f = 0; f < 2; f++) {
        file_units += rep->files[f].units;
        file_bytes += rep->files[f].bytes;
        ck_assert_int_eq(rep->files[f].superblock_ok, 1);
        ck_assert_str_eq(rep->files[f].tier, "ssd0");
        ck_assert_uint_eq(rep->files[f].capacity,
                          rep->files[f].n_slots * rep->files[f].stripe_bytes);
        ck_assert_uint_gt(rep->files[f].objects, 0);
    }
    ck_assert_uint_eq(file_units, units);
    ck_assert_uint_eq(file_bytes, rep->bytes);
    ck_assert_uint_eq(rep->capacity, rep->files[0].capacity + rep->files[1].capacity);

    /* the quick summary agrees, also while the tier has the files open */
    void *st = kvs_test_ssd_open(&d, &tier_args);
    kvs_ssd_inspect_summary sum;
    const char *paths[2] = {d.dir[0], d.dir[1]};
    ck_assert_int_eq(kvs_ssd_inspect_summary_of(paths, 2, &sum, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(sum.objects, N_OBJ);
    ck_assert_uint_eq(sum.bytes, rep->bytes);
    ck_assert_uint_eq(sum.capacity, rep->capacity);
    ck_assert_uint_eq(sum.damaged, 0);
    ck_assert_uint_eq(sum.paths, 2);
    ops->destroy(st);
    free(s);
    free(rep);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(verify_finds_exactly_the_planted_damage_and_changes_nothing) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    store_objects(&d);
    planted *p = malloc(sizeof *p);
    ck_assert_ptr_nonnull(p);
    plant_damage(&d, p);
    char f0[400], f1[400];
    data_file(&d, 0, f0, sizeof f0);
    data_file(&d, 1, f1, sizeof f1);
    uint64_t h0 = file_hash(f0), h1 = file_hash(f1);

    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    seen *s = malloc(sizeof *s);
    ck_assert_ptr_nonnull(rep);
    ck_assert_ptr_nonnull(s);
    char err[512];
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_VERIFY, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(file_hash(f0), h0);
    ck_assert_uint_eq(file_hash(f1), h1);

    /* object 4 lost its header: the scan (like the tier's) no longer finds it */
    ck_assert_uint_eq(rep->objects, N_OBJ - 1);
    ck_assert_ptr_null(find_object(s, 4));
    ck_assert_uint_eq(rep->damaged, 5);
    ck_assert_uint_eq(rep->dropped, 0);
    uint32_t keyed = 0, header = 0, truncated = 0;
    for (uint32_t j = 0; j < s->n_damage; j++) {
        const kvs_ssd_inspect_damage *dm = &s->damage[j];
        ck_assert_int_eq(dm->dropped, 0);
        if (dm->has_key) {
            kvs_key k2 = kvs_test_key(2), k9 = kvs_test_key(9), kp = kvs_test_key(PLAIN);
            int which = !memcmp(&dm->key, &k2, sizeof k2)   ? 2
                        : !memcmp(&dm->key, &k9, sizeof k9) ? 9
                        : !memcmp(&dm->key, &kp, sizeof kp) ? PLAIN
                                                            : -1;
            ck_assert_msg(which >= 0, "damage reported on an undamaged object: %s", dm->what);
            if (which == 2) ck_assert_ptr_nonnull(strstr(dm->what, "payload checksum mismatch"));
            if (which == 9) ck_assert_ptr_nonnull(strstr(dm->what, "KV object layer 1"));
            if (which == PLAIN) ck_assert_ptr_nonnull(strstr(dm->what, "cut off"));
            keyed |= 1u << which;
        } else if (dm->file == p->header_file && dm->offset == p->header_offset) {
            ck_assert_ptr_nonnull(strstr(dm->what, "unit header"));
            header++;
        } else {
            ck_assert_uint_eq(dm->file, p->truncated_file);
            ck_assert_uint_eq(dm->offset, p->truncated_at);
            ck_assert_ptr_nonnull(strstr(dm->what, "truncated"));
            truncated++;
        }
    }
    ck_assert_uint_eq(keyed, (1u << 2) | (1u << 9) | (1u << PLAIN));
    ck_assert_uint_eq(header, 1);
    ck_assert_uint_eq(truncated, 1);
    for (uint32_t i = 0; i < N_OBJ; i++) {
        const kvs_ssd_inspect_object *o = find_object(s, i);
        if (i == 4) continue;
        ck_assert_ptr_nonnull(o);
        ck_assert_int_eq(o->damaged, i == 2 || i == 9 || i == PLAIN);
    }
    ck_assert_uint_gt(rep->checked_bytes, 0);

    /* a listing (headers only) sees what the headers show: the header and the truncation */
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_LIST, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(rep->damaged, 3);
    ck_assert_uint_eq(file_hash(f0), h0);
    ck_assert_uint_eq(file_hash(f1), h1);
    free(s);
    free(rep);
    free(p);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(repair_drops_the_damage_and_the_tier_then_serves_the_rest) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    store_objects(&d);
    planted *p = malloc(sizeof *p);
    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    seen *s = malloc(sizeof *s);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(rep);
    ck_assert_ptr_nonnull(s);
    plant_damage(&d, p);
    char err[512];
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_REPAIR, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(rep->damaged, 5);
    ck_assert_uint_eq(rep->dropped, 5);
    for (uint32_t j = 0; j < s->n_damage; j++) ck_assert_int_eq(s->damage[j].dropped, 1);
    /* what is listed after the repair: the 8 sound objects */
    ck_assert_uint_eq(rep->objects, N_OBJ - 4);
    ck_assert_uint_eq(s->n_objects, N_OBJ - 4);

    void *st = kvs_test_ssd_open(&d, &tier_args);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, N_OBJ - 4);
    uint8_t *want = malloc(64 * KIB), *got = kvs_test_aligned_buffer(72 * KIB);
    ck_assert_ptr_nonnull(want);
    for (uint32_t i = 0; i < N_OBJ; i++) {
        kvs_key k = kvs_test_key(i);
        uint64_t len = 0, want_len = build_object(i, want);
        kvs_status rc = ops->get(st, &k, got, 72 * KIB, &len);
        if (i == 2 || i == 4 || i == 9 || i == PLAIN) {
            ck_assert_msg(rc == KVS_ENOTFOUND, "dropped object %u: %d", i, rc);
        } else {
            ck_assert_msg(rc == KVS_OK, "object %u: %d %s", i, rc, ops->last_error(st));
            ck_assert_uint_eq(len, want_len);
            ck_assert_int_eq(memcmp(got, want, len), 0);
        }
    }
    ck_assert_uint_eq(kvs_test_ssd_stats(st).corrupt_drops, 0);
    ops->destroy(st);
    free(want);
    free(got);

    /* and a check afterwards finds the files sound */
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_VERIFY, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(rep->damaged, 0);
    ck_assert_uint_eq(rep->objects, N_OBJ - 4);
    free(s);
    free(rep);
    free(p);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(repair_is_refused_while_the_tier_is_open_and_verify_still_works) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    store_objects(&d);
    planted *p = malloc(sizeof *p);
    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    seen *s = malloc(sizeof *s);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(rep);
    ck_assert_ptr_nonnull(s);
    plant_damage(&d, p);
    char f0[400], f1[400];
    data_file(&d, 0, f0, sizeof f0);
    data_file(&d, 1, f1, sizeof f1);
    void *st = kvs_test_ssd_open(&d, &tier_args); /* it extends the truncated file: hash after */
    uint64_t h0 = file_hash(f0), h1 = file_hash(f1);
    char err[512];
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_REPAIR, s, rep, err, sizeof err), KVS_ESTATE);
    ck_assert_ptr_nonnull(strstr(err, "is in use"));
    ck_assert_ptr_nonnull(strstr(err, "--verify works while the tier runs"));
    char pid[32];
    snprintf(pid, sizeof pid, "process %d", (int)getpid());
    ck_assert_msg(strstr(err, pid) != NULL, "no pid in: %s", err);
    ck_assert_uint_eq(s->n_objects, 0);
    ck_assert_uint_eq(file_hash(f0), h0);
    ck_assert_uint_eq(file_hash(f1), h1);

    /* verify reads while the tier runs, says so, and still finds what is damaged */
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_VERIFY, s, rep, err, sizeof err), KVS_OK);
    ck_assert_int_eq(rep->in_use, 1);
    ck_assert_int_eq(rep->files[0].in_use, 1);
    ck_assert_int_eq(rep->files[0].in_use_pid, (int)getpid());
    ck_assert_int_eq(find_object(s, 2)->damaged, 1);
    ck_assert_int_eq(find_object(s, 9)->damaged, 1);
    ck_assert_int_eq(find_object(s, 0)->damaged, 0);
    ck_assert_uint_eq(file_hash(f0), h0);
    ck_assert_uint_eq(file_hash(f1), h1);
    ops->destroy(st);

    /* once it is closed the repair runs */
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_REPAIR, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_gt(rep->dropped, 0);
    free(p);
    free(rep);
    free(s);
    kvs_test_rmtree(d.root);
}
END_TEST

/* Where copy `replica` of unit `unit` of object i lies: the data file of d's path (0 or 1) and the
 * offset of its unit header, found by reading the file's headers as the restart scan does. */
static void find_copy(const kvs_test_dirs *d, uint32_t i, uint32_t unit, uint32_t replica,
                      char *file, size_t file_len, uint64_t *offset) {
    kvs_key k = kvs_test_key(i);
    uint8_t *block = malloc(SSD_BLOCK);
    ck_assert_ptr_nonnull(block);
    for (int p = 0; p < 2; p++) {
        data_file(d, p, file, file_len);
        int fd = open(file, O_RDONLY);
        ck_assert_int_ge(fd, 0);
        ssd_superblock sb;
        ck_assert_int_eq(pread(fd, block, SSD_BLOCK, 0), SSD_BLOCK);
        ck_assert_int_eq(ssd_format_decode_superblock(block, &sb), 0);
        for (uint64_t slot = 0; slot < sb.n_slots; slot++) {
            uint64_t off = SSD_BLOCK + slot * sb.slot_bytes;
            ssd_unit_header h;
            ck_assert_int_eq(pread(fd, block, SSD_BLOCK, (off_t)off), SSD_BLOCK);
            if (ssd_format_decode_unit(block, &h) == 0 && !memcmp(&h.key, &k, sizeof k) &&
                h.unit_index == unit && h.replica_index == replica) {
                *offset = off;
                close(fd);
                free(block);
                return;
            }
        }
        close(fd);
    }
    ck_abort_msg("no copy %u of unit %u of object %u", replica, unit, i);
}

/* Flip one data byte of a unit copy: its data no longer matches its header's checksum. */
static void damage_copy(const kvs_test_dirs *d, uint32_t i, uint32_t unit, uint32_t replica) {
    char file[400];
    uint64_t off = 0;
    find_copy(d, i, unit, replica, file, sizeof file, &off);
    flip_byte(file, off + SSD_BLOCK + 1000);
}

static int damage_of(const seen *s, uint32_t i, uint32_t *kept, uint32_t *dropped) {
    kvs_key k = kvs_test_key(i);
    int n = 0;
    *kept = *dropped = 0;
    for (uint32_t j = 0; j < s->n_damage; j++) {
        if (!s->damage[j].has_key || memcmp(&s->damage[j].key, &k, sizeof k)) continue;
        n++;
        *kept += (uint32_t)s->damage[j].object_kept;
        *dropped += (uint32_t)s->damage[j].dropped;
    }
    return n;
}

/* Two copies of each unit on two paths. Object 0: one bad copy of unit 0; object 1: a bad copy of
 * unit 0 and the other copy of unit 1 bad (each unit still has a good one); object 2: both copies
 * of unit 2 bad; object 3 sound. A verify reports three bad copies whose objects are whole and
 * object 2's two; a repair retires the three copies alone and drops object 2, and the tier reopened
 * serves objects 0, 1 and 3 byte for byte (its first read of each checks every unit). */
START_TEST(with_replicas_a_bad_copy_is_retired_alone_and_its_object_kept) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 8 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}, {"replicas", "2"}}};
    const uint64_t len = 40 * KIB; /* 3 units */
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 4; i++) kvs_test_ssd_put(st, i, len);
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    damage_copy(&d, 0, 0, 0);
    damage_copy(&d, 1, 0, 1);
    damage_copy(&d, 1, 1, 0);
    damage_copy(&d, 2, 2, 0);
    damage_copy(&d, 2, 2, 1);
    char f0[400], f1[400];
    data_file(&d, 0, f0, sizeof f0);
    data_file(&d, 1, f1, sizeof f1);
    uint64_t h0 = file_hash(f0), h1 = file_hash(f1);

    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    seen *s = malloc(sizeof *s);
    ck_assert_ptr_nonnull(rep);
    ck_assert_ptr_nonnull(s);
    char err[512];
    uint32_t kept, dropped;
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_VERIFY, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(file_hash(f0), h0);
    ck_assert_uint_eq(file_hash(f1), h1);
    ck_assert_uint_eq(rep->objects, 4);
    ck_assert_uint_eq(rep->damaged, 3);
    ck_assert_uint_eq(s->n_damage, 5);
    ck_assert_int_eq(damage_of(s, 0, &kept, &dropped), 1);
    ck_assert_uint_eq(kept, 1);
    ck_assert_int_eq(damage_of(s, 1, &kept, &dropped), 2);
    ck_assert_uint_eq(kept, 2);
    ck_assert_int_eq(damage_of(s, 2, &kept, &dropped), 2);
    ck_assert_uint_eq(kept, 0);
    for (uint32_t j = 0; j < s->n_damage; j++) {
        ck_assert_int_eq(s->damage[j].dropped, 0);
        ck_assert_ptr_nonnull(strstr(s->damage[j].what, "payload checksum mismatch"));
        if (s->damage[j].object_kept)
            ck_assert_ptr_nonnull(strstr(s->damage[j].what, "another copy of this unit is good"));
    }
    for (uint32_t i = 0; i < 4; i++) {
        ck_assert_ptr_nonnull(find_object(s, i));
        ck_assert_int_eq(find_object(s, i)->replicas, 2);
        ck_assert_int_eq(find_object(s, i)->damaged, i != 3);
    }

    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_REPAIR, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(rep->damaged, 3);
    ck_assert_uint_eq(rep->dropped, 3);
    ck_assert_int_eq(damage_of(s, 0, &kept, &dropped), 1);
    ck_assert_uint_eq(kept, 1);
    ck_assert_uint_eq(dropped, 1);
    ck_assert_int_eq(damage_of(s, 1, &kept, &dropped), 2);
    ck_assert_uint_eq(kept, 2);
    ck_assert_uint_eq(dropped, 2);
    ck_assert_int_eq(damage_of(s, 2, &kept, &dropped), 2);
    ck_assert_uint_eq(kept, 0);
    ck_assert_uint_eq(dropped, 2);
    ck_assert_uint_eq(rep->objects, 3); /* listed after the repair: 0, 1 and 3 */
    ck_assert_ptr_nonnull(find_object(s, 0));
    ck_assert_ptr_nonnull(find_object(s, 1));
    ck_assert_ptr_null(find_object(s, 2));
    ck_assert_ptr_nonnull(find_object(s, 3));

    st = kvs_test_ssd_open(&d, &a);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 3);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, len); /* asserts the bytes when KVS_OK */
        ck_assert_msg(rc == (i == 2 ? KVS_ENOTFOUND : KVS_OK), "object %u: %d %s", i, rc,
                      ops->last_error(st));
    }
    ck_assert_uint_eq(kvs_test_ssd_stats(st).corrupt_drops, 0);
    ops->destroy(st);

    /* and a check afterwards finds the files sound, the kept objects still with their units */
    ck_assert_int_eq(inspect(&d, KVS_SSD_INSPECT_VERIFY, s, rep, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(rep->damaged, 0);
    ck_assert_uint_eq(rep->objects, 3);
    free(s);
    free(rep);
    kvs_test_rmtree(d.root);
}
END_TEST

/* A directory and its own data file, or a link to a data file, name one file: it is read once, and
 * a repair does not find its own first open holding the lock. */
START_TEST(a_file_given_twice_is_read_once_and_a_repair_runs) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    store_objects(&d);
    char f0[400], f1[400], link[400];
    data_file(&d, 0, f0, sizeof f0);
    data_file(&d, 1, f1, sizeof f1);
    snprintf(link, sizeof link, "%s/link.data", d.root);
    ck_assert_int_eq(symlink(f1, link), 0);
    const char *paths[4] = {d.dir[0], f0, link, d.dir[1]};
    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    ck_assert_ptr_nonnull(rep);
    char err[512];
    for (int mode = KVS_SSD_INSPECT_LIST; mode <= KVS_SSD_INSPECT_REPAIR; mode++) {
        kvs_ssd_inspect_options opt = {.mode = mode, .content = cli_inspect_kv_content()};
        ck_assert_msg(kvs_ssd_inspect_run(paths, 4, &opt, rep, err, sizeof err) == KVS_OK,
                      "mode %d: %s", mode, err);
        ck_assert_uint_eq(rep->n_files, 2);
        ck_assert_int_eq(rep->in_use, 0);
        uint64_t want = mode == KVS_SSD_INSPECT_REPAIR ? N_OBJ - 1 : N_OBJ; /* 9 is dropped */
        ck_assert_uint_eq(rep->objects, want);
    }
    free(rep);
    kvs_test_rmtree(d.root);
}
END_TEST

/* The files of a tier whose name has characters a file name cannot keep, or is longer than the
 * tier keeps, are the ones --tier NAME finds, and kvs_ssd_data_file_name names them. */
START_TEST(a_tier_with_an_unusual_name_is_found_by_its_name) {
    static const char *names[] = {"kv cache/\xc3\xa9t\xc3\xa9 #1", ".hidden",
                                  "a-very-long-tier-name-0123456789-0123456789-0123456789-"
                                  "0123456789-0123456789-0123456789-0123456789-end"};
    for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
        kvs_test_dirs d;
        kvs_test_ssd_dirs(&d);
        kvs_test_ssd_args a = tier_args;
        a.name = names[n];
        void *st = kvs_test_ssd_open(&d, &a);
        kvs_test_ssd_put(st, 1, 5000);
        kvs_test_ssd_flush(st);
        ops->destroy(st);
        char name[256], file[700];
        kvs_ssd_data_file_name(names[n], name, sizeof name);
        ck_assert_ptr_null(strchr(name, '/'));
        ck_assert_ptr_null(strchr(name, ' '));
        ck_assert_int_ne(name[9], '.');
        snprintf(file, sizeof file, "%s/%s", d.dir[0], name);
        ck_assert_msg(access(file, F_OK) == 0, "%s: the tier wrote no %s", names[n], name);
        const char *paths[2] = {d.dir[0], d.dir[1]};
        kvs_ssd_inspect_options opt = {.mode = KVS_SSD_INSPECT_LIST, .tier = names[n]};
        kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
        ck_assert_ptr_nonnull(rep);
        char err[512];
        ck_assert_msg(kvs_ssd_inspect_run(paths, 2, &opt, rep, err, sizeof err) == KVS_OK, "%s",
                      err);
        ck_assert_uint_eq(rep->n_files, 2);
        ck_assert_uint_eq(rep->objects, 1);
        free(rep);
        kvs_test_rmtree(d.root);
    }
}
END_TEST

/* A scan that takes over 2 s logs a line with its rate and eta, and one when it is done. The tier
 * is paced to 1000 reads/s over 2559 slots, so its restart scan takes about 2.6 s. */
START_TEST(a_slow_index_rebuild_logs_its_progress) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 20 * MIB,
                           .max_object = 4 * KIB,
                           .options = {{"stripe_bytes", "4KiB"}, {"sim_iops", "1000"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 1, 3000);
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    kvs_test_ssd_setup(); /* forget the first open's lines */
    st = kvs_test_ssd_open(&d, &a);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 1);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 3000), KVS_OK);
    ck_assert(kvs_test_ssd_log_contains("rebuilding the index from 1 paths: "));
    ck_assert(kvs_test_ssd_log_contains("/2559 unit headers ("));
    ck_assert(kvs_test_ssd_log_contains("unit headers/s, eta "));
    ck_assert(kvs_test_ssd_log_contains("2559/2559 unit headers (100%)"));
    ck_assert(kvs_test_ssd_log_contains("; 1 objects recovered"));
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

static Suite *ssd_inspect_suite(void) {
    Suite *s = suite_create("ssd_inspect");
    TCase *t = tcase_create("inspect");
    tcase_add_checked_fixture(t, setup, NULL);
    tcase_set_timeout(t, 60);
    tcase_add_test(t, a_listing_counts_objects_bytes_and_fingerprints_as_stored);
    tcase_add_test(t, verify_finds_exactly_the_planted_damage_and_changes_nothing);
    tcase_add_test(t, repair_drops_the_damage_and_the_tier_then_serves_the_rest);
    tcase_add_test(t, repair_is_refused_while_the_tier_is_open_and_verify_still_works);
    tcase_add_test(t, with_replicas_a_bad_copy_is_retired_alone_and_its_object_kept);
    tcase_add_test(t, a_file_given_twice_is_read_once_and_a_repair_runs);
    tcase_add_test(t, a_tier_with_an_unusual_name_is_found_by_its_name);
    suite_add_tcase(s, t);
    TCase *progress = tcase_create("progress");
    tcase_add_checked_fixture(progress, setup, NULL);
    tcase_set_timeout(progress, 60);
    tcase_add_test(progress, a_slow_index_rebuild_logs_its_progress);
    suite_add_tcase(s, progress);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(ssd_inspect_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
