/* progress.h - progress of long work (an index rebuilt, a directory verified, a run of a workload):
 * on a terminal one line redrawn in place (count, rate, eta), elsewhere a plain line every few
 * seconds and one at the end, so logs collected by a service manager stay readable. One owner
 * thread per progress; nothing is allocated. */
#ifndef KVS_PROGRESS_H
#define KVS_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#define KVS_PROGRESS_TTY \
    1 /* redraw one line (\r); chosen by kvs_progress_begin when out is a tty */
#define KVS_PROGRESS_LINES 2 /* a line every interval_ms, and one at the end */
#define KVS_PROGRESS_QUIET 3 /* nothing */

typedef struct kvs_progress {
    FILE *out;
    int mode;       /* KVS_PROGRESS_* */
    char what[96];  /* "verifying /mnt/nvme0/kvstrata" */
    char unit[16];  /* "objects", "MiB", "turns" */
    uint64_t total; /* 0: unknown (no eta, no bar) */
    uint64_t done;
    uint64_t start_ns, last_ns;
    uint64_t interval_ns; /* between lines (KVS_PROGRESS_LINES) or redraws (KVS_PROGRESS_TTY) */
    uint64_t
        quiet_ns; /* nothing is shown before this much time has passed (short work is silent) */
    int shown;    /* a line was printed */
} kvs_progress;

/* Start. out NULL: stderr. mode 0: KVS_PROGRESS_TTY when out is a terminal, else LINES. Lines
 * start after quiet_ms (0: at once) and repeat every interval_ms (0: 5000 for lines, 100 for tty). */
void kvs_progress_begin(kvs_progress *p, FILE *out, int mode, const char *what, const char *unit,
                        uint64_t total, uint64_t quiet_ms, uint64_t interval_ms);
/* done items so far (absolute); prints when the interval has passed. */
void kvs_progress_update(kvs_progress *p, uint64_t done);
/* The last line ("done in 3.2 s", with note when non-NULL), printed only when a line was shown
 * before or the work took longer than quiet_ms. */
void kvs_progress_end(kvs_progress *p, const char *note);
/* The line as it would be printed now (tests): "what: 40/100 objects (40%), 12.0 objects/s, eta 5 s" */
void kvs_progress_format(const kvs_progress *p, uint64_t now_ns, char *buf, size_t len);

#endif
