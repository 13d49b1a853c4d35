/*
 * fakegpu_smoke's look at the processes it drives: their state files, their fds in /proc, and the
 * ptrace stops that play CRIU's freeze (see fakegpu_smoke.c).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakegpu.h"
#include "fakegpu_smoke.h"

/* Reads key=value from a state file; returns -1 if missing. */
long long state_value(const char *file, const char *key, char *status, size_t slen)
{
	FILE *f = fopen(file, "re");
	if (!f)
		return -1;
	char line[1200];
	long long v = -1;
	size_t kl = strlen(key);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, key, kl) && line[kl] == '=')
			v = atoll(line + kl + 1);
		if (status && !strncmp(line, "status=", 7)) {
			line[strcspn(line, "\n")] = 0;
			snprintf(status, slen, "%s", line + 7);
		}
	}
	fclose(f);
	return v;
}

long long iterations_ok(const char *file)
{
	char status[1200] = "";
	long long it = state_value(file, "iterations", status, sizeof(status));
	if (it < 0)
		die("cannot read %s", file);
	if (strcmp(status, "ok"))
		die("%s says status=%s", file, status);
	return it;
}

void wait_for_file(const char *path, unsigned ms)
{
	uint64_t end = fg_now_ms() + ms;
	while (access(path, F_OK)) {
		if (fg_now_ms() > end)
			die("timed out waiting for %s", path);
		fg_sleep_ms(10);
	}
}

/* Waits until the iteration count of file passes `after`. */
long long wait_progress(const char *file, long long after, unsigned ms)
{
	uint64_t end = fg_now_ms() + ms;
	long long it;
	while ((it = iterations_ok(file)) <= after) {
		if (fg_now_ms() > end)
			die("%s: no progress past iteration %lld", file, after);
		fg_sleep_ms(20);
	}
	return it;
}

/* /proc/PID/what, opened, or the test fails. */
static DIR *open_proc_dir(int pid, const char *what)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/%s", pid, what);
	DIR *d = opendir(path);
	if (!d)
		die("cannot read %s", path);
	return d;
}

/* The fields after "(comm) " of the /proc stat file path, read into buf ("" if there are none), or
 * NULL if the file is gone. */
static const char *stat_fields(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return NULL;
	size_t n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *e = strrchr(buf, ')');
	return e && e[1] == ' ' ? e + 2 : buf + n;
}

/* Number of fds of pid whose link starts with prefix (whole: is prefix). */
int count_fds(int pid, const char *prefix, int whole)
{
	char link[PATH_MAX];
	size_t pl = strlen(prefix);
	DIR *d = open_proc_dir(pid, "fd");
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		ssize_t l = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (l > 0) {
			link[l] = 0;
			if (!strncmp(link, prefix, pl) && (!whole || !link[pl]))
				n++;
		}
	}
	closedir(d);
	return n;
}

int count_sockets(int pid) { return count_fds(pid, "socket:", 0); }

/* SIGSTOP pid and wait until every thread has stopped. */
void stop_all(int pid)
{
	kill(pid, SIGSTOP);
	uint64_t end = fg_now_ms() + 5000;
	for (;;) {
		DIR *d = open_proc_dir(pid, "task");
		int running = 0;
		struct dirent *de;
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			char sp[384], buf[512];
			snprintf(sp, sizeof(sp), "/proc/%d/task/%s/stat", pid, de->d_name);
			const char *fields = stat_fields(sp, buf, sizeof(buf));
			if (fields && fields[0] != 'T')
				running = 1;
		}
		closedir(d);
		if (!running)
			return;
		if (fg_now_ms() > end)
			die("process %d does not stop", pid);
		fg_sleep_ms(1);
	}
}

/* Like CRIU: ptrace-stop every thread of pid; returns the number of tids. */
int freeze(int pid, int *tids, int max)
{
	DIR *d = open_proc_dir(pid, "task");
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)) && n < max) {
		if (de->d_name[0] == '.')
			continue;
		int t = atoi(de->d_name), st;
		if (ptrace(PTRACE_SEIZE, t, 0, 0) || ptrace(PTRACE_INTERRUPT, t, 0, 0))
			die("ptrace seize %d: %s", t, strerror(errno));
		if (waitpid(t, &st, __WALL) != t || !WIFSTOPPED(st))
			die("thread %d did not stop", t);
		tids[n++] = t;
	}
	closedir(d);
	return n;
}

void thaw(const int *tids, int n, int running_tid)
{
	int st;
	if (running_tid) {
		ptrace(PTRACE_INTERRUPT, running_tid, 0, 0);
		waitpid(running_tid, &st, __WALL);
	}
	for (int i = 0; i < n; i++)
		if (ptrace(PTRACE_DETACH, tids[i], 0, 0))
			die("ptrace detach %d: %s", tids[i], strerror(errno));
}

/* A child of the workload: the first one whose state file names it, or the
 * first child that is not `not`. */
int child_of(int ppid, int not)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int found = 0;
	while (!found && (de = readdir(d))) {
		int p = atoi(de->d_name);
		if (p <= 0 || p == not)
			continue;
		char path[64], buf[512];
		snprintf(path, sizeof(path), "/proc/%d/stat", p);
		const char *fields = stat_fields(path, buf, sizeof(buf));
		int pp = 0;
		if (fields && sscanf(fields, "%*c %d", &pp) == 1 && pp == ppid)
			found = p;
	}
	closedir(d);
	return found;
}
