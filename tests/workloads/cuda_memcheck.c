/*
 * cuda_memcheck: a CUDA driver API workload for checkpoint/restore tests.
 *
 *   cuda_memcheck --mb N [--device I] [--state FILE] [--interval-ms MS]
 *                 [--seed S] [--children K] [--child-device I|spread] [--plain-children K]
 *                 [--tolerate-child-exit] [--managed-mb M] [--zero-mb Z] [--pattern random|weights]
 *
 * Allocates N MiB of device memory and fills it, 64 MiB chunk by chunk, with a
 * pattern derived from the seed, the chunk index and the chunk's generation.
 * Then, forever: verify the whole buffer, rewrite one chunk with a new
 * generation (the iteration number), and write the state file atomically:
 *
 *   iterations=N  errors=0  mb=N  pid=P  status=ok     (one per line)
 *
 * On a mismatch or a CUDA error the state file says "status=FAIL <details>"
 * and the process exits with 2. The state file is first written right after
 * the initial fill (iterations=0).
 *
 * --children K forks K processes doing the same with their own allocation
 * (state files FILE.0 .. FILE.<K-1>), on device I of --child-device, or child
 * k on device k+1 with --child-device spread (one process per GPU);
 * --plain-children K forks K processes that never touch CUDA. Children are
 * forked before cuInit. --managed-mb M also allocates M MiB of managed memory
 * (cuMemAllocManaged), filled and verified through its host pointer: the
 * driver cannot checkpoint such a process. --zero-mb Z also allocates Z MiB of device memory set to
 * zero (cuMemsetD8), as serving systems allocate their KV caches, and verifies each iteration that it
 * is still all zero. --pattern weights fills the device memory with 16-bit values shaped like bf16
 * weights (random low bytes, high bytes of two values) instead of random words: data that compresses
 * (about 1.8x byte-shuffled), as a model's weights do.
 *
 * Only the CUDA driver API is used, so the same binary runs against a real
 * libcuda.so.1 or the fake one.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WORKLOAD_NAME "cuda_memcheck"
#include "workload.h"

#define CHUNK (64ull << 20)

static const char *g_state;
static size_t g_mb;
static uint64_t g_seed;
static pid_t g_cuda_children[256];
static int g_ncuda_children;
static int g_tolerate_child_exit; /* --tolerate-child-exit: a dead CUDA child is not a failure */
static size_t g_managed_mb;       /* --managed-mb */
static size_t g_zero_mb;          /* --zero-mb */
static int g_weights;             /* --pattern weights */

/*
 * The state file is rewritten in place through one fd kept open, with a single fixed-size pwrite (newline
 * padded). Not write-to-temporary-and-rename: a dump taken in the middle of that would record an open
 * temporary file that is renamed away afterwards, and a later restore of the image would fail on it.
 */
static int g_state_fd = -1;
static pid_t g_state_fd_pid;

static void write_state(unsigned long long iterations, int errors, const char *status)
{
	if (!g_state)
		return;
	if (g_state_fd < 0 || g_state_fd_pid != getpid()) { /* a forked child writes its own file */
		g_state_fd = open(g_state, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		g_state_fd_pid = getpid();
		if (g_state_fd < 0) {
			fprintf(stderr, "cuda_memcheck: cannot open %s: %s\n", g_state, strerror(errno));
			return;
		}
	}
	char buf[1536];
	int n = snprintf(buf, sizeof(buf), "iterations=%llu\nerrors=%d\nmb=%zu\npid=%d\nstatus=%s\n", iterations,
			 errors, g_mb, (int)getpid(), status);
	write_state_text(g_state_fd, g_state, buf, sizeof(buf), n);
}

static unsigned long long g_iter;

static void write_fail_state(const char *status) { write_state(g_iter, 1, status); }

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t chunk_base(size_t chunk, uint64_t gen)
{
	return mix(g_seed * 0x9e3779b97f4a7c15ull ^ mix(((uint64_t)chunk << 32) ^ gen));
}

/* Word w of a chunk whose pattern starts at base. */
static uint64_t word_at(uint64_t base, size_t w)
{
	uint64_t v = mix(base + w * 0x9e3779b97f4a7c15ull);
	/* --pattern weights: each 16-bit value a sign-and-exponent byte 0x3c or 0x3d, a random mantissa byte */
	return g_weights ? (v & 0x01ff01ff01ff01ffull) | 0x3c003c003c003c00ull : v;
}

static void fill(uint64_t *buf, size_t bytes, size_t chunk, uint64_t gen)
{
	uint64_t base = chunk_base(chunk, gen);
	for (size_t w = 0; w < bytes / 8; w++)
		buf[w] = word_at(base, w);
}

static void reap_children(void)
{
	int status;
	pid_t p;
	while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
		for (int i = 0; i < g_ncuda_children; i++) {
			if (g_cuda_children[i] != p)
				continue;
			if (g_tolerate_child_exit)
				break;
			if (WIFEXITED(status))
				fail("CUDA child %d exited with status %d", (int)p, WEXITSTATUS(status));
			fail("CUDA child %d was killed by signal %d", (int)p, WTERMSIG(status));
		}
	}
}

static void run(int device, unsigned interval_ms)
{
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr dptr;
	size_t total = g_mb << 20;
	size_t nchunks = (total + CHUNK - 1) / CHUNK;

	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, device), "cuDeviceGet");
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	check(cuMemAlloc(&dptr, total), "cuMemAlloc");
	uint64_t *managed = NULL;
	size_t managed_bytes = g_managed_mb << 20;
	if (managed_bytes) {
		CUdeviceptr m;
		check(cuMemAllocManaged(&m, managed_bytes, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
		managed = (uint64_t *)(uintptr_t)m;
		fill(managed, managed_bytes, (size_t)-1, 0);
	}

	CUdeviceptr zeros = 0;
	size_t zero_bytes = g_zero_mb << 20;
	if (zero_bytes) {
		check(cuMemAlloc(&zeros, zero_bytes), "cuMemAlloc");
		check(cuMemsetD8(zeros, 0, zero_bytes), "cuMemsetD8");
	}

	uint64_t *gen = calloc(nchunks, sizeof(*gen));
	uint64_t *host = malloc(total < CHUNK ? total : CHUNK);
	if (!gen || !host)
		fail("out of host memory");
	printf("ready pid=%d mb=%zu\n", (int)getpid(), g_mb);
	fflush(stdout);

	for (size_t c = 0; c < nchunks; c++) {
		size_t len = total - c * CHUNK < CHUNK ? total - c * CHUNK : CHUNK;
		fill(host, len, c, 0);
		check(cuMemcpyHtoD(dptr + c * CHUNK, host, len), "cuMemcpyHtoD");
	}
	write_state(0, 0, "ok");

	for (;;) {
		if (interval_ms) {
			struct timespec ts = { .tv_sec = interval_ms / 1000,
					       .tv_nsec = (long)(interval_ms % 1000) * 1000000 };
			while (nanosleep(&ts, &ts) && errno == EINTR)
				;
		}
		reap_children();
		for (size_t c = 0; c < nchunks; c++) {
			size_t len = total - c * CHUNK < CHUNK ? total - c * CHUNK : CHUNK;
			check(cuMemcpyDtoH(host, dptr + c * CHUNK, len), "cuMemcpyDtoH");
			uint64_t base = chunk_base(c, gen[c]);
			for (size_t w = 0; w < len / 8; w++) {
				uint64_t want = word_at(base, w);
				if (host[w] != want)
					fail("mismatch at chunk %zu offset %zu (generation %llu, iteration %llu): "
					     "expected 0x%016llx got 0x%016llx",
					     c, w * 8, (unsigned long long)gen[c], g_iter + 1,
					     (unsigned long long)want, (unsigned long long)host[w]);
			}
		}
		size_t step = total < CHUNK ? total : CHUNK; /* the host buffer's size */
		for (size_t off = 0; off < zero_bytes; off += step) {
			size_t n = zero_bytes - off < step ? zero_bytes - off : step;
			check(cuMemcpyDtoH(host, zeros + off, n), "cuMemcpyDtoH");
			for (size_t w = 0; w < n / 8; w++)
				if (host[w])
					fail("zeroed memory changed at offset %zu (iteration %llu): 0x%016llx", off + w * 8,
					     g_iter + 1, (unsigned long long)host[w]);
		}
		if (managed) {
			uint64_t base = chunk_base((size_t)-1, 0);
			for (size_t w = 0; w < managed_bytes / 8; w++)
				if (managed[w] != word_at(base, w))
					fail("managed memory mismatch at offset %zu (iteration %llu)", w * 8, g_iter + 1);
		}
		g_iter++;
		size_t c = (size_t)((g_iter - 1) % nchunks);
		size_t len = total - c * CHUNK < CHUNK ? total - c * CHUNK : CHUNK;
		fill(host, len, c, g_iter);
		check(cuMemcpyHtoD(dptr + c * CHUNK, host, len), "cuMemcpyHtoD");
		gen[c] = g_iter;
		write_state(g_iter, 0, "ok");
	}
}

/* fork(); the child dies with parent (this process), also when parent died before the child could ask.
 * Returns 0 in the child, like fork. */
static pid_t fork_tied(pid_t parent)
{
	pid_t p = fork();
	if (p < 0)
		fail("fork: %s", strerror(errno));
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(0);
	}
	return p;
}

static void usage(void)
{
	fprintf(stderr, "usage: cuda_memcheck --mb N [--device I] [--state FILE] [--interval-ms MS] "
			"[--seed S] [--children K] [--child-device I|spread] [--plain-children K] [--tolerate-child-exit] "
			"[--managed-mb M] [--zero-mb Z] [--pattern random|weights]\n");
	exit(1);
}

int main(int argc, char **argv)
{
	int device = 0, children = 0, plain = 0, child_device = -1, spread = 0;
	unsigned interval_ms = 100;
	const char *state = NULL;

	g_seed = 12345;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--tolerate-child-exit")) {
			g_tolerate_child_exit = 1;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		const char *o = argv[i], *v = argv[++i];
		if (!strcmp(o, "--mb"))
			g_mb = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--device"))
			device = atoi(v);
		else if (!strcmp(o, "--state"))
			state = v;
		else if (!strcmp(o, "--interval-ms"))
			interval_ms = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(o, "--seed"))
			g_seed = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--children"))
			children = atoi(v);
		else if (!strcmp(o, "--child-device") && !strcmp(v, "spread"))
			spread = 1;
		else if (!strcmp(o, "--child-device"))
			child_device = atoi(v);
		else if (!strcmp(o, "--plain-children"))
			plain = atoi(v);
		else if (!strcmp(o, "--managed-mb"))
			g_managed_mb = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--zero-mb"))
			g_zero_mb = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--pattern") && (!strcmp(v, "weights") || !strcmp(v, "random")))
			g_weights = !strcmp(v, "weights");
		else
			usage();
	}
	if (!g_mb || children < 0 || children > 256 || plain < 0)
		usage();
	g_state = state;

	pid_t parent = getpid();
	for (int k = 0; k < plain; k++)
		if (fork_tied(parent) == 0)
			for (;;)
				sleep(1);
	for (int k = 0; k < children; k++) {
		fflush(stdout);
		pid_t p = fork_tied(parent);
		if (p == 0) {
			static char path[4096];
			if (state) {
				snprintf(path, sizeof(path), "%s.%d", state, k);
				g_state = path;
			}
			g_seed = g_seed + (uint64_t)k + 1;
			g_ncuda_children = 0;
			run(spread ? k + 1 : child_device >= 0 ? child_device : device, interval_ms);
		}
		g_cuda_children[g_ncuda_children++] = p;
	}
	run(device, interval_ms);
	return 0;
}
