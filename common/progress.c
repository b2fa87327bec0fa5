#include "progress.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void copy_text(char *dst, size_t cap, const char *src) {
    kvs_fmt(dst, cap, "%s", src ? src : "");
}

void kvs_progress_begin(kvs_progress *p, FILE *out, int mode, const char *what, const char *unit,
                        uint64_t total, uint64_t quiet_ms, uint64_t interval_ms) {
    memset(p, 0, sizeof *p);
    p->out = out ? out : stderr;
    if (mode == 0) mode = isatty(fileno(p->out)) ? KVS_PROGRESS_TTY : KVS_PROGRESS_LINES;
    p->mode = mode;
    copy_text(p->what, sizeof p->what, what);
    copy_text(p->unit, sizeof p->unit, unit);
    p->total = total;
    if (interval_ms == 0) interval_ms = mode == KVS_PROGRESS_TTY ? 100 : 5000;
    p->interval_ns = interval_ms * 1000000ull;
    p->quiet_ns = quiet_ms * 1000000ull;
    p->start_ns = p->last_ns = now_ns();
}

/* "1.2 h", "3 min", "45 s": an eta or an elapsed time, rounded the way a person reads one. */
static void format_seconds(char *buf, size_t len, double s) {
    if (s >= 5400.0)
        kvs_fmt(buf, len, "%.1f h", s / 3600.0);
    else if (s >= 90.0)
        kvs_fmt(buf, len, "%.0f min", s / 60.0);
    else if (s >= 10.0)
        kvs_fmt(buf, len, "%.0f s", s);
    else
        kvs_fmt(buf, len, "%.1f s", s);
}

void kvs_progress_format(const kvs_progress *p, uint64_t now, char *buf, size_t len) {
    double elapsed = now > p->start_ns ? (double)(now - p->start_ns) / 1e9 : 0.0;
    double rate = elapsed > 0.0 ? (double)p->done / elapsed : 0.0;
    char eta[32] = "";
    if (p->total > 0 && rate > 0.0 && p->done < p->total) {
        char t[24];
        format_seconds(t, sizeof t, (double)(p->total - p->done) / rate);
        kvs_fmt(eta, sizeof eta, ", eta %s", t);
    }
    if (p->total > 0) {
        unsigned pct = (unsigned)(p->done >= p->total ? 100 : p->done * 100 / p->total);
        kvs_fmt(buf, len, "%s: %llu/%llu %s (%u%%), %.1f %s/s%s", p->what,
                (unsigned long long)p->done, (unsigned long long)p->total, p->unit, pct, rate,
                p->unit, eta);
    } else {
        kvs_fmt(buf, len, "%s: %llu %s, %.1f %s/s", p->what, (unsigned long long)p->done, p->unit,
                rate, p->unit);
    }
}

static void show(kvs_progress *p, uint64_t now) {
    char line[256];
    kvs_progress_format(p, now, line, sizeof line);
    if (p->mode == KVS_PROGRESS_TTY)
        fprintf(p->out, "\r\033[K%s", line); /* erase the rest of a longer earlier line */
    else
        fprintf(p->out, "%s\n", line);
    fflush(p->out);
    p->shown = 1;
    p->last_ns = now;
}

void kvs_progress_update(kvs_progress *p, uint64_t done) {
    p->done = done;
    if (p->mode == KVS_PROGRESS_QUIET) return;
    uint64_t now = now_ns();
    if (now - p->start_ns < p->quiet_ns) return;
    if (p->shown && now - p->last_ns < p->interval_ns) return;
    if (!p->shown && p->mode == KVS_PROGRESS_LINES && p->quiet_ns == 0 &&
        now - p->start_ns < p->interval_ns)
        return;
    show(p, now);
}

void kvs_progress_end(kvs_progress *p, const char *note) {
    if (p->mode == KVS_PROGRESS_QUIET) return;
    uint64_t now = now_ns();
    if (!p->shown && now - p->start_ns < p->quiet_ns) return;
    char line[256], took[24];
    kvs_progress_format(p, now, line, sizeof line);
    format_seconds(took, sizeof took, (double)(now - p->start_ns) / 1e9);
    fprintf(p->out, "%s%s, done in %s%s%s\n", p->mode == KVS_PROGRESS_TTY ? "\r\033[K" : "", line,
            took, note && note[0] ? "; " : "", note ? note : "");
    fflush(p->out);
    p->shown = 1;
}
