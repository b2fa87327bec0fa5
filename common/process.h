/* process.h - a process one process recorded in shared memory, as another one finds it: its pid,
 * its start time (/proc/PID/stat field 22: a reused pid never passes for it) and its pid namespace
 * (a pid from another namespace - containers sharing /dev/shm - means nothing here). */
#ifndef KVS_PROCESS_H
#define KVS_PROCESS_H

#include <stdint.h>

/* State (field 3: 'R', 'S', 'Z', ...) and start time (field 22, clock ticks since boot) of pid.
 * 0, or -1 when /proc cannot say (no such process, no /proc). */
int kvs_process_stat(int32_t pid, char *state, uint64_t *start_time);
/* pid's start time, 0 when unknown. */
uint64_t kvs_process_start_time(int32_t pid);
/* The inode naming this process's pid namespace, 0 when /proc cannot say. */
uint64_t kvs_process_own_pid_ns(void);
/* 1 while the process recorded as (pid, start_time, pid_ns) runs, or cannot be looked up from here
 * (another pid namespace; /proc unreadable); 0 once it exited (a zombie has). start_time or pid_ns
 * 0: not recorded, the pid alone counts. */
int kvs_process_alive(int32_t pid, uint64_t start_time, uint64_t pid_ns);

#endif
