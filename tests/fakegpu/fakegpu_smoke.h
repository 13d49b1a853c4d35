/*
 * What fakegpu_smoke.c (the checks) and fakegpu_smoke_proc.c (the processes under test, through /proc
 * and ptrace) share.
 */
#ifndef FAKEGPU_SMOKE_H
#define FAKEGPU_SMOKE_H

#include <stddef.h>

/* Reports a failed check, keeps the logs, cleans up and exits 1. */
__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...);

/* A workload's state file ("key=value" lines): one value, and the status beside it. */
long long state_value(const char *file, const char *key, char *status, size_t slen);
long long iterations_ok(const char *file);
void wait_for_file(const char *path, unsigned ms);
long long wait_progress(const char *file, long long after, unsigned ms);

/* The process's fds in /proc: those whose link starts with prefix (whole: is prefix). */
int count_fds(int pid, const char *prefix, int whole);
int count_sockets(int pid);
int child_of(int ppid, int not);

/* CRIU's freeze played by hand: every thread ptrace-stopped, then let go. */
void stop_all(int pid);
int freeze(int pid, int *tids, int max);
void thaw(const int *tids, int n, int running_tid);

#endif
