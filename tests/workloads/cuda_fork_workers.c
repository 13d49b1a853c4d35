/*
 * cuda_fork_workers: a CUDA process whose children are forked after CUDA started, like PyTorch
 * DataLoader workers with the fork start method.
 *
 *   cuda_fork_workers --state FILE [--workers K] [--interval-ms MS]
 *
 * The parent initialises CUDA, fills 1 MiB of device memory with a pattern, then forks K workers. Each
 * worker never calls CUDA (it inherited the driver's files and mappings and leaves them alone) and
 * sends numbered batches, 16 bytes each (worker index, sequence number), over one pipe shared by all
 * workers. The parent, forever: reads the batches, checks that each worker's sequence numbers follow
 * each other without a gap or a repeat, checks its device memory against the pattern, and writes
 *
 *   batches=N  errors=0  pid=P  workers=P1,P2  status=ok  (one per line)
 *
 * to the state file (fixed size, rewritten in place). On a mismatch or a CUDA error it writes
 * "status=FAIL <details>" and exits 2; a worker that loses its parent exits.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define WORKLOAD_NAME "cuda_fork_workers"
#include "workload.h"

#define MAX_WORKERS 16
#define BYTES (1u << 20)

static const char *g_state;
static int g_state_fd = -1;
static unsigned long long g_batches;
static pid_t g_workers[MAX_WORKERS];
static int g_nworkers = 2;

static void write_state(int errors, const char *status)
{
	char workers[256] = "";
	size_t off = 0;
	for (int i = 0; i < g_nworkers && off < sizeof(workers) - 16; i++)
		off += (size_t)snprintf(workers + off, sizeof(workers) - off, "%s%d", i ? "," : "", (int)g_workers[i]);
	char buf[1024];
	int n = snprintf(buf, sizeof(buf), "batches=%llu\nerrors=%d\npid=%d\nworkers=%s\nstatus=%s\n", g_batches,
			 errors, (int)getpid(), workers, status);
	write_state_text(g_state_fd, g_state, buf, sizeof(buf), n);
}

static void write_fail_state(const char *status) { write_state(1, status); }

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void worker(int index, int wfd, unsigned interval_ms)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	for (uint64_t seq = 1;; seq++) {
		uint64_t batch[2] = {(uint64_t)index, seq};
		if (write(wfd, batch, sizeof(batch)) != (ssize_t)sizeof(batch))
			_exit(errno == EINTR ? 0 : 3);
		sleep_ms(interval_ms);
	}
}

int main(int argc, char **argv)
{
	unsigned interval_ms = 20;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--state") && i + 1 < argc)
			g_state = argv[++i];
		else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
			g_nworkers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--interval-ms") && i + 1 < argc)
			interval_ms = (unsigned)atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: cuda_fork_workers --state FILE [--workers K] [--interval-ms MS]\n");
			return 64;
		}
	}
	if (!g_state || g_nworkers < 1 || g_nworkers > MAX_WORKERS) {
		fprintf(stderr, "cuda_fork_workers: --state is required; --workers is 1 to %d\n", MAX_WORKERS);
		return 64;
	}
	g_state_fd = open(g_state, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (g_state_fd < 0) {
		fprintf(stderr, "cuda_fork_workers: cannot open %s: %s\n", g_state, strerror(errno));
		return 1;
	}

	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr dptr;
	static uint8_t host[BYTES], back[BYTES];
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	check(cuMemAlloc(&dptr, BYTES), "cuMemAlloc");
	for (size_t i = 0; i < BYTES; i++)
		host[i] = (uint8_t)(i * 131 + 7);
	check(cuMemcpyHtoD(dptr, host, BYTES), "cuMemcpyHtoD");

	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		fail("pipe: %s", strerror(errno));
	for (int i = 0; i < g_nworkers; i++) {
		pid_t pid = fork(); /* after CUDA started: the point of this workload */
		if (pid < 0)
			fail("fork: %s", strerror(errno));
		if (pid == 0) {
			close(p[0]);
			worker(i, p[1], interval_ms);
		}
		g_workers[i] = pid;
	}
	close(p[1]);

	uint64_t last[MAX_WORKERS] = {0};
	write_state(0, "ok");
	for (;;) {
		struct pollfd pfd = {p[0], POLLIN, 0};
		int n = poll(&pfd, 1, 200);
		if (n < 0 && errno != EINTR)
			fail("poll: %s", strerror(errno));
		if (n > 0) {
			uint64_t batch[2];
			ssize_t r = read(p[0], batch, sizeof(batch));
			if (r == 0)
				fail("every worker is gone");
			if (r < 0 && errno != EINTR)
				fail("read: %s", strerror(errno));
			if (r > 0 && r != (ssize_t)sizeof(batch))
				fail("short batch: %zd bytes", r);
			if (r > 0) {
				if (batch[0] >= (uint64_t)g_nworkers)
					fail("batch from unknown worker %llu", (unsigned long long)batch[0]);
				if (batch[1] != last[batch[0]] + 1)
					fail("worker %llu sent batch %llu after %llu", (unsigned long long)batch[0],
					     (unsigned long long)batch[1], (unsigned long long)last[batch[0]]);
				last[batch[0]] = batch[1];
				g_batches++;
			}
		}
		check(cuMemcpyDtoH(back, dptr, BYTES), "cuMemcpyDtoH");
		if (memcmp(back, host, BYTES) != 0)
			fail("device memory differs from its pattern after %llu batches", g_batches);
		write_state(0, "ok");
	}
}
