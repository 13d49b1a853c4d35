/*
 * What the test workloads share: the state file, rewritten in place with one fixed-size write, and the
 * way they fail (a message on stderr and status=FAIL in the state file, exit status 2).
 *
 * The including file defines WORKLOAD_NAME (its name in messages) and write_fail_state, and includes
 * cuda.h first.
 */
#ifndef WORKLOAD_H
#define WORKLOAD_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes status (with errors=1) to the state file. */
static void write_fail_state(const char *status);

/* Writes the n bytes of text in buf, padded with newlines to size, over the start of the state file fd
 * (path): a reader never sees it shorter, and no temporary file is left for a dump to record. */
static void write_state_text(int fd, const char *path, char *buf, size_t size, int n)
{
	if (n < 0 || n >= (int)size)
		n = (int)size - 1;
	memset(buf + n, '\n', size - (size_t)n);
	if (pwrite(fd, buf, size, 0) != (ssize_t)size)
		fprintf(stderr, WORKLOAD_NAME ": cannot write %s: %s\n", path, strerror(errno));
}

__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
	char buf[1024], st[1100];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, WORKLOAD_NAME "[%d]: FAIL %s\n", (int)getpid(), buf);
	snprintf(st, sizeof(st), "FAIL %s", buf);
	write_fail_state(st);
	exit(2);
}

/* Fails unless the driver call what succeeded, naming the call and the error. */
static void check(CUresult r, const char *what)
{
	if (r == CUDA_SUCCESS)
		return;
	const char *name = NULL;
	if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
		name = "?";
	fail("%s returned %d (%s)", what, (int)r, name);
}

#endif /* WORKLOAD_H */
