#include "process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kvs_process_stat(int32_t pid, char *state, uint64_t *start_time) {
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return -1;
    text[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count from the last ')' */
    const char *p = strrchr(text, ')');
    if (!p || p[1] != ' ' || !p[2]) return -1;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) { /* field 3 is the state; 22 the start time */
        p = strchr(p, ' ');
        if (!p) return -1;
        p++;
    }
    unsigned long long v = 0;
    if (sscanf(p, "%llu", &v) != 1) return -1;
    *start_time = (uint64_t)v;
    return 0;
}

uint64_t kvs_process_start_time(int32_t pid) {
    char state = 0;
    uint64_t start = 0;
    return kvs_process_stat(pid, &state, &start) == 0 ? start : 0;
}

uint64_t kvs_process_own_pid_ns(void) {
    /* not cached: a child forked after unshare(CLONE_NEWPID) is in another namespace than the
     * process whose memory it inherited */
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

int kvs_process_alive(int32_t pid, uint64_t start_time, uint64_t pid_ns) {
    if (pid <= 0) return 0;
    uint64_t own = kvs_process_own_pid_ns();
    if (pid_ns && own && pid_ns != own) return 1; /* its pid means nothing here */
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char state = 0;
    uint64_t now = 0;
    if (kvs_process_stat(pid, &state, &now) != 0) return 1; /* it exists but cannot be inspected */
    if (state == 'Z' || state == 'X') return 0;             /* exited, not yet reaped */
    return start_time == 0 || now == start_time;
}
