/*
 * cuda_server: a CUDA driver API server for checkpoint/restore tests with clients that stay connected.
 *
 *   cuda_server --mb N --port P [--state FILE] [--interval-ms MS] [--seed S] [--device I]
 *
 * Allocates N MiB of device memory, fills it with a pattern derived from the seed and each 1 MiB chunk's
 * index (generation 1: the data never changes afterwards), and listens on 127.0.0.1:P. Any number of
 * clients may hold connections open; each request is one line, answered with one line:
 *
 *   chunk I   ->  chunk I gen G hash H     (H: FNV-1a 64 of chunk I as copied back from the GPU, in hex)
 *   ping      ->  pong
 *   other     ->  error WHY
 *
 * so the same request gets the same answer before and after a checkpoint and restore, if the device
 * memory came back. Every MS milliseconds (default 100) it verifies the whole buffer against the pattern,
 * a chunk between two looks at the sockets (an answer never waits for a whole pass), and after each pass
 * writes the state file (fixed size, rewritten in place, as cuda_memcheck does):
 *
 *   iterations=N  errors=0  mb=N  pid=P  port=P  requests=R  clients=C  status=ok     (one per line)
 *
 * On a mismatch or a CUDA error the state file says "status=FAIL <details>" and the process exits with 2.
 * Only the CUDA driver API is used: the same binary runs on a real libcuda.so.1 or on the fake one.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WORKLOAD_NAME "cuda_server"
#include "workload.h"

#define CHUNK (1ull << 20)
#define GENERATION 1
#define MAX_CLIENTS 64
#define LINE_MAX_LEN 256

static const char *g_state;
static int g_state_fd = -1;
static size_t g_mb;
static int g_port;
static uint64_t g_seed = 12345;
static unsigned long long g_iter, g_requests;
static int g_nclients;

static void write_state(int errors, const char *status)
{
	if (!g_state)
		return;
	if (g_state_fd < 0) {
		g_state_fd = open(g_state, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		if (g_state_fd < 0) {
			fprintf(stderr, WORKLOAD_NAME ": cannot open %s: %s\n", g_state, strerror(errno));
			return;
		}
	}
	char buf[1536];
	int n = snprintf(buf, sizeof(buf), "iterations=%llu\nerrors=%d\nmb=%zu\npid=%d\nport=%d\nrequests=%llu\n"
			 "clients=%d\nstatus=%s\n", g_iter, errors, g_mb, (int)getpid(), g_port, g_requests,
			 g_nclients, status);
	write_state_text(g_state_fd, g_state, buf, sizeof(buf), n);
}

static void write_fail_state(const char *status) { write_state(1, status); }

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t chunk_base(size_t chunk)
{
	return mix(g_seed * 0x9e3779b97f4a7c15ull ^ mix(((uint64_t)chunk << 32) ^ GENERATION));
}

static uint64_t word(uint64_t base, size_t w) { return mix(base + w * 0x9e3779b97f4a7c15ull); }

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static CUdeviceptr g_dptr;
static uint64_t *g_host; /* one chunk */

/* Verifies chunk c of the device memory against the pattern. */
static void verify_chunk(size_t c)
{
	uint64_t base = chunk_base(c);
	check(cuMemcpyDtoH(g_host, g_dptr + c * CHUNK, CHUNK), "cuMemcpyDtoH");
	for (size_t w = 0; w < CHUNK / 8; w++)
		if (g_host[w] != word(base, w))
			fail("mismatch at chunk %zu offset %zu (iteration %llu): expected 0x%016llx got 0x%016llx", c, w * 8,
			     g_iter + 1, (unsigned long long)word(base, w), (unsigned long long)g_host[w]);
}

/* The answer to one request line, without its newline, in out. */
static void answer(const char *req, char *out, size_t size)
{
	unsigned long long i;
	char extra;
	if (!strcmp(req, "ping")) {
		snprintf(out, size, "pong");
	} else if (sscanf(req, "chunk %llu%c", &i, &extra) == 1) {
		if (i >= g_mb) {
			snprintf(out, size, "error chunk %llu out of range (%zu chunks)", i, g_mb);
			return;
		}
		check(cuMemcpyDtoH(g_host, g_dptr + i * CHUNK, CHUNK), "cuMemcpyDtoH");
		snprintf(out, size, "chunk %llu gen %d hash %016llx", i, GENERATION,
			 (unsigned long long)fnv1a((const unsigned char *)g_host, CHUNK));
	} else {
		snprintf(out, size, "error unknown request (chunk I | ping)");
	}
}

struct client {
	int fd;
	size_t len;
	char line[LINE_MAX_LEN];
};

static struct client g_clients[MAX_CLIENTS];

static void drop(struct client *c)
{
	close(c->fd);
	*c = g_clients[--g_nclients];
}

/* Reads what client c sent and answers every complete line; 0 when the connection is to be dropped. */
static int serve(struct client *c)
{
	ssize_t n = recv(c->fd, c->line + c->len, sizeof(c->line) - 1 - c->len, MSG_DONTWAIT);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		return 0;
	if (n < 0)
		return 1;
	c->len += (size_t)n;
	char *nl;
	while ((nl = memchr(c->line, '\n', c->len))) {
		*nl = '\0';
		if (nl > c->line && nl[-1] == '\r')
			nl[-1] = '\0';
		char out[LINE_MAX_LEN + 64];
		answer(c->line, out, sizeof(out) - 1);
		size_t len = strlen(out);
		out[len++] = '\n';
		/* Answers are short: a blocking send of one line never waits long for a reading client. */
		if (send(c->fd, out, len, MSG_NOSIGNAL) != (ssize_t)len)
			return 0;
		g_requests++;
		c->len -= (size_t)(nl + 1 - c->line);
		memmove(c->line, nl + 1, c->len);
	}
	return c->len < sizeof(c->line) - 1; /* a line longer than the buffer: not our protocol */
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int listen_on(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0)
		fail("socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 16))
		fail("listen on 127.0.0.1:%d: %s", port, strerror(errno));
	return fd;
}

static void usage(void)
{
	fprintf(stderr, "usage: cuda_server --mb N --port P [--state FILE] [--interval-ms MS] [--seed S] [--device I]\n");
	exit(1);
}

int main(int argc, char **argv)
{
	int device = 0;
	unsigned interval_ms = 100;
	for (int i = 1; i < argc; i += 2) {
		if (i + 1 >= argc)
			usage();
		const char *o = argv[i], *v = argv[i + 1];
		if (!strcmp(o, "--mb"))
			g_mb = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--port"))
			g_port = atoi(v);
		else if (!strcmp(o, "--state"))
			g_state = v;
		else if (!strcmp(o, "--interval-ms"))
			interval_ms = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(o, "--seed"))
			g_seed = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--device"))
			device = atoi(v);
		else
			usage();
	}
	if (!g_mb || g_port <= 0 || g_port > 65535)
		usage();

	CUdevice dev;
	CUcontext ctx;
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, device), "cuDeviceGet");
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	check(cuMemAlloc(&g_dptr, g_mb * CHUNK), "cuMemAlloc");
	g_host = malloc(CHUNK);
	if (!g_host)
		fail("out of host memory");
	for (size_t c = 0; c < g_mb; c++) {
		uint64_t base = chunk_base(c);
		for (size_t w = 0; w < CHUNK / 8; w++)
			g_host[w] = word(base, w);
		check(cuMemcpyHtoD(g_dptr + c * CHUNK, g_host, CHUNK), "cuMemcpyHtoD");
	}
	int lfd = listen_on(g_port);
	write_state(0, "ok");
	printf("ready pid=%d mb=%zu port=%d\n", (int)getpid(), g_mb, g_port);
	fflush(stdout);

	double next = now_s() + interval_ms / 1000.0;
	size_t verifying = 0; /* the next chunk of a pass under way, 0: none under way */
	for (;;) {
		struct pollfd pfd[MAX_CLIENTS + 1];
		pfd[0] = (struct pollfd){ .fd = lfd, .events = POLLIN };
		for (int k = 0; k < g_nclients; k++)
			pfd[k + 1] = (struct pollfd){ .fd = g_clients[k].fd, .events = POLLIN };
		double wait = verifying ? 0 : next - now_s();
		int r = poll(pfd, (nfds_t)g_nclients + 1, wait > 0 ? (int)(wait * 1000) + 1 : 0);
		if (r < 0 && errno != EINTR)
			fail("poll: %s", strerror(errno));
		/* Backwards, so that dropping client k (the last one moves into its slot) skips no one. */
		for (int k = g_nclients - 1; r > 0 && k >= 0; k--)
			if (pfd[k + 1].revents && !serve(&g_clients[k]))
				drop(&g_clients[k]);
		if (r > 0 && (pfd[0].revents & POLLIN)) {
			int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0 && g_nclients < MAX_CLIENTS)
				g_clients[g_nclients++] = (struct client){ .fd = fd };
			else if (fd >= 0)
				close(fd);
		}
		if (verifying || now_s() >= next) {
			verify_chunk(verifying++);
			if (verifying == g_mb) {
				verifying = 0;
				g_iter++;
				write_state(0, "ok");
				next = now_s() + interval_ms / 1000.0;
			}
		}
	}
}
