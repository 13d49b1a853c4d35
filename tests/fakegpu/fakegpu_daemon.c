/*
 * fakegpu-daemon: plays the GPUs for the fake libcuda.so.1 (see fakegpu.h).
 *
 *   fakegpu-daemon --dir DIR [--gpus N] [--gpu-mem BYTES] [--gpu-name NAME]
 *                  [--uuid-seed S] [--pairs-of used|all] [--verbose]
 *
 * GPU pairs of a restore must name every GPU the process used (--pairs-of used, the default), or every
 * GPU of the daemon, each onto a different GPU (--pairs-of all: what NVIDIA's r580 driver was seen to
 * want, also for GPUs a process could not see).
 *
 * One thread per connection; a global mutex protects the client table, the
 * per-GPU accounting and the jobs; each client's device memory has its own
 * mutex so a slow (or stopped) client never blocks the others.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "fakegpu.h"

struct alloc {
	uint64_t dptr;
	uint64_t size;
	uint32_t gpu;
	void *data;
	struct alloc *next;
};

enum job_phase { JOB_NONE, JOB_PENDING, JOB_ACCEPTED, JOB_FINISHING, JOB_DONE };

struct conn;

struct client {
	uint64_t id;
	int pid, tid; /* as the client sees them (its pid namespace) */
	CUprocessState state;
	struct conn *main_conn; /* NULL while detached (checkpointed) or dead */
	int dead;               /* the process went away; cleared by a restore */
	uint32_t used_mask;     /* GPUs with a context or an allocation */
	uint64_t ckpt_bytes[FG_MAX_GPUS];
	uint64_t next_off[FG_MAX_GPUS];
	pthread_mutex_t mem_lock; /* allocs and the data in them */
	struct alloc *allocs;
	/* bytes of allocs, read without mem_lock (atomically): a copy holds mem_lock for its whole paced
	 * transfer, and NVML's per-process query must not wait for it, as the real one does not */
	uint64_t held;
	/* the current job, protected by g_lock */
	uint64_t job_seq;
	enum job_phase job_phase;
	int job_action;
	int job_result;
	uint32_t job_lock_timeout;
	uint32_t job_crash;
	uint32_t job_map[FG_MAX_GPUS];
	struct conn *job_conn;
	struct client *next;
};

struct conn {
	int fd;
	struct client *client; /* main or service connection of this client */
	int is_svc;
};

static const char *g_dir;
static int g_verbose;
static int g_pairs_of_all; /* --pairs-of all */
static struct fg_devices g_devs;
static uint64_t g_gpu_used[FG_MAX_GPUS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;
static struct client *g_clients;
static uint64_t g_next_id = 1;
static uint64_t g_next_seq = 1;
static volatile sig_atomic_t g_stop;

__attribute__((format(printf, 1, 2))) static void logmsg(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fg_vlog("daemon: ", fmt, ap);
	va_end(ap);
}

#define dbg(...)                          \
	do {                              \
		if (g_verbose)            \
			logmsg(__VA_ARGS__); \
	} while (0)

static const char *action_name(int a)
{
	switch (a) {
	case FG_ACT_LOCK: return "lock";
	case FG_ACT_CHECKPOINT: return "checkpoint";
	case FG_ACT_RESTORE: return "restore";
	case FG_ACT_UNLOCK: return "unlock";
	case FG_ACT_PING: return "state query";
	}
	return "?";
}

static int reply(struct conn *c, int32_t status, uint64_t a0, uint64_t a1, uint64_t a2,
		 const void *payload, uint64_t len)
{
	uint64_t a[3] = { a0, a1, a2 };
	return fg_send(c->fd, 0, status, a, 3, payload, len);
}

/* Reads and drops len payload bytes. */
static int drain(int fd, uint64_t len)
{
	char buf[65536];
	while (len) {
		size_t n = len > sizeof(buf) ? sizeof(buf) : (size_t)len;
		if (fg_read_full(fd, buf, n))
			return -1;
		len -= n;
	}
	return 0;
}

static struct client *find_client(uint64_t id)
{
	for (struct client *cl = g_clients; cl; cl = cl->next)
		if (cl->id == id)
			return cl;
	return NULL;
}

static void client_path(char *buf, size_t len, uint64_t id)
{
	snprintf(buf, len, "%s/" FG_CLIENTS_DIR "/%llu", g_dir, (unsigned long long)id);
}

/* ---- device memory ---- */

/* Called with cl->mem_lock held. */
static struct alloc *find_range(struct client *cl, uint64_t ptr, uint64_t len)
{
	for (struct alloc *a = cl->allocs; a; a = a->next)
		if (ptr >= a->dptr && ptr < a->dptr + a->size && len <= a->dptr + a->size - ptr)
			return a;
	return NULL;
}

/* Called with cl->mem_lock held. */
static CUresult alloc_mem(struct client *cl, uint32_t gpu, uint64_t size, uint64_t dptr,
			  struct alloc **out)
{
	if (gpu >= g_devs.count)
		return CUDA_ERROR_INVALID_DEVICE;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_lock);
	if (g_gpu_used[gpu] + size > g_devs.dev[gpu].total_mem) {
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	g_gpu_used[gpu] += size;
	cl->used_mask |= 1u << gpu;
	pthread_mutex_unlock(&g_lock);

	struct alloc *a = calloc(1, sizeof(*a));
	void *data = mmap(NULL, size, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!a || data == MAP_FAILED) {
		free(a);
		if (data != MAP_FAILED)
			munmap(data, size);
		pthread_mutex_lock(&g_lock);
		g_gpu_used[gpu] -= size;
		pthread_mutex_unlock(&g_lock);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (!dptr) {
		dptr = ((uint64_t)(gpu + 1) << FG_PTR_GPU_SHIFT) + cl->next_off[gpu];
		cl->next_off[gpu] += (size + FG_PTR_ALIGN - 1) & ~(uint64_t)(FG_PTR_ALIGN - 1);
	}
	a->dptr = dptr;
	a->size = size;
	a->gpu = gpu;
	a->data = data;
	a->next = cl->allocs;
	cl->allocs = a;
	__atomic_add_fetch(&cl->held, size, __ATOMIC_RELAXED);
	*out = a;
	return CUDA_SUCCESS;
}

static void free_one(struct alloc *a)
{
	munmap(a->data, a->size);
	pthread_mutex_lock(&g_lock);
	g_gpu_used[a->gpu] -= a->size;
	pthread_mutex_unlock(&g_lock);
	free(a);
}

/* Called with cl->mem_lock held. Returns the bytes freed per GPU in per_gpu. */
static void free_all(struct client *cl, uint64_t *per_gpu)
{
	while (cl->allocs) {
		struct alloc *a = cl->allocs;
		cl->allocs = a->next;
		if (per_gpu)
			per_gpu[a->gpu] += a->size;
		__atomic_sub_fetch(&cl->held, a->size, __ATOMIC_RELAXED);
		free_one(a);
	}
}

/* ---- main connection of a client ---- */

static void client_died(struct client *cl)
{
	pthread_mutex_lock(&g_lock);
	int already = cl->dead;
	cl->dead = 1;
	pthread_mutex_unlock(&g_lock);
	if (already)
		return;
	pthread_mutex_lock(&cl->mem_lock);
	free_all(cl, NULL);
	pthread_mutex_unlock(&cl->mem_lock);
	pthread_mutex_lock(&g_lock);
	/* A dead client keeps its record in the CHECKPOINTED state: an image of it
	 * taken earlier (which holds the host copy) may be restored again. */
	cl->state = CU_PROCESS_STATE_CHECKPOINTED;
	if (cl->job_phase == JOB_PENDING || cl->job_phase == JOB_ACCEPTED) {
		cl->job_phase = JOB_DONE;
		cl->job_result = CUDA_ERROR_OPERATING_SYSTEM;
	}
	pthread_cond_broadcast(&g_cond);
	pthread_mutex_unlock(&g_lock);
	dbg("client %llu (pid %d) went away, memory released", (unsigned long long)cl->id, cl->pid);
}

static int handle_hello(struct conn *c, struct fg_msg *m)
{
	char path[PATH_MAX];
	struct client *cl = calloc(1, sizeof(*cl));
	if (!cl)
		return reply(c, CUDA_ERROR_OUT_OF_MEMORY, 0, 0, 0, NULL, 0);
	pthread_mutex_init(&cl->mem_lock, NULL);
	pthread_mutex_lock(&g_lock);
	for (;;) {
		cl->id = g_next_id++;
		client_path(path, sizeof(path), cl->id);
		if (mkfifo(path, 0666) == 0)
			break;
		if (errno != EEXIST) {
			int e = errno;
			pthread_mutex_unlock(&g_lock);
			logmsg("mkfifo %s: %s", path, strerror(e));
			free(cl);
			return reply(c, CUDA_ERROR_OPERATING_SYSTEM, 0, 0, 0, NULL, 0);
		}
	}
	chmod(path, 0666);
	cl->pid = (int)m->a[0];
	cl->tid = (int)m->a[1];
	cl->state = CU_PROCESS_STATE_RUNNING;
	cl->main_conn = c;
	cl->next = g_clients;
	g_clients = cl;
	c->client = cl;
	pthread_mutex_unlock(&g_lock);
	dbg("client %llu registered: pid %d tid %d", (unsigned long long)cl->id, cl->pid, cl->tid);
	return reply(c, CUDA_SUCCESS, cl->id, 0, 0, &g_devs, sizeof(g_devs));
}

static int handle_reattach(struct conn *c, struct fg_msg *m)
{
	pthread_mutex_lock(&g_lock);
	struct client *cl = find_client(m->a[0]);
	if (!cl || cl->job_phase != JOB_ACCEPTED || cl->job_action != FG_ACT_RESTORE) {
		pthread_mutex_unlock(&g_lock);
		logmsg("reattach of client %llu outside of a restore", (unsigned long long)m->a[0]);
		return reply(c, CUDA_ERROR_ILLEGAL_STATE, 0, 0, 0, NULL, 0);
	}
	cl->pid = (int)m->a[1];
	cl->tid = (int)m->a[2];
	cl->main_conn = c;
	cl->dead = 0;
	c->client = cl;
	pthread_mutex_unlock(&g_lock);
	dbg("client %llu reattached: pid %d tid %d", (unsigned long long)cl->id, cl->pid, cl->tid);
	return reply(c, CUDA_SUCCESS, cl->id, 0, 0, &g_devs, sizeof(g_devs));
}

static int handle_main_op(struct conn *c, struct fg_msg *m)
{
	struct client *cl = c->client;
	struct alloc *a;
	CUresult r;

	switch (m->op) {
	case FG_DETACH:
		pthread_mutex_lock(&g_lock);
		if (cl->main_conn == c)
			cl->main_conn = NULL;
		c->client = NULL;
		pthread_mutex_unlock(&g_lock);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	case FG_USE_GPU:
		if (m->a[0] >= g_devs.count)
			return reply(c, CUDA_ERROR_INVALID_DEVICE, 0, 0, 0, NULL, 0);
		pthread_mutex_lock(&g_lock);
		cl->used_mask |= 1u << m->a[0];
		pthread_mutex_unlock(&g_lock);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	case FG_ALLOC:
		pthread_mutex_lock(&cl->mem_lock);
		r = alloc_mem(cl, (uint32_t)m->a[0], m->a[1], 0, &a);
		pthread_mutex_unlock(&cl->mem_lock);
		return reply(c, r, r == CUDA_SUCCESS ? a->dptr : 0, 0, 0, NULL, 0);
	case FG_FREE: {
		struct alloc **pp;
		pthread_mutex_lock(&cl->mem_lock);
		for (pp = &cl->allocs; *pp && (*pp)->dptr != m->a[0]; pp = &(*pp)->next)
			;
		a = *pp;
		if (a) {
			*pp = a->next;
			__atomic_sub_fetch(&cl->held, a->size, __ATOMIC_RELAXED);
		}
		pthread_mutex_unlock(&cl->mem_lock);
		if (!a)
			return reply(c, CUDA_ERROR_INVALID_VALUE, 0, 0, 0, NULL, 0);
		free_one(a);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	}
	case FG_HTOD: {
		pthread_mutex_lock(&cl->mem_lock);
		a = find_range(cl, m->a[0], m->len);
		int rc = a ? fg_read_full(c->fd, (char *)a->data + (m->a[0] - a->dptr), m->len)
			   : drain(c->fd, m->len);
		pthread_mutex_unlock(&cl->mem_lock);
		if (rc)
			return -1;
		return reply(c, a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, 0, 0, 0, NULL, 0);
	}
	case FG_DTOH: {
		pthread_mutex_lock(&cl->mem_lock);
		a = find_range(cl, m->a[0], m->a[1]);
		int rc = a ? reply(c, CUDA_SUCCESS, 0, 0, 0, (char *)a->data + (m->a[0] - a->dptr), m->a[1])
			   : reply(c, CUDA_ERROR_INVALID_VALUE, 0, 0, 0, NULL, 0);
		pthread_mutex_unlock(&cl->mem_lock);
		return rc;
	}
	case FG_MEMSET:
		pthread_mutex_lock(&cl->mem_lock);
		a = find_range(cl, m->a[0], m->a[2]);
		if (a)
			memset((char *)a->data + (m->a[0] - a->dptr), (int)(m->a[1] & 0xff), m->a[2]);
		pthread_mutex_unlock(&cl->mem_lock);
		return reply(c, a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, 0, 0, 0, NULL, 0);
	case FG_MEMINFO: {
		if (m->a[0] >= g_devs.count)
			return reply(c, CUDA_ERROR_INVALID_DEVICE, 0, 0, 0, NULL, 0);
		pthread_mutex_lock(&g_lock);
		uint64_t total = g_devs.dev[m->a[0]].total_mem;
		uint64_t used = g_gpu_used[m->a[0]];
		pthread_mutex_unlock(&g_lock);
		return reply(c, CUDA_SUCCESS, total - used, total, 0, NULL, 0);
	}
	}
	logmsg("unexpected op %u on a client connection", m->op);
	return -1;
}

/* ---- service connection (the restore thread of a client) ---- */

static int handle_svc_hello(struct conn *c, struct fg_msg *m)
{
	pthread_mutex_lock(&g_lock);
	struct client *cl = find_client(m->a[0]);
	if (!cl || cl->job_seq != m->a[1] || cl->job_phase != JOB_PENDING) {
		pthread_mutex_unlock(&g_lock);
		dbg("stale doorbell of client %llu seq %llu ignored", (unsigned long long)m->a[0],
		    (unsigned long long)m->a[1]);
		return reply(c, FG_CANCELLED, 0, 0, 0, NULL, 0);
	}
	cl->job_phase = JOB_ACCEPTED;
	cl->job_conn = c;
	c->client = cl;
	c->is_svc = 1;
	uint32_t map[FG_MAX_GPUS];
	memcpy(map, cl->job_map, sizeof(map));
	int action = cl->job_action;
	uint32_t lock_timeout = cl->job_lock_timeout, crash = cl->job_crash;
	pthread_cond_broadcast(&g_cond);
	pthread_mutex_unlock(&g_lock);
	dbg("client %llu: service thread took %s (seq %llu)", (unsigned long long)cl->id,
	    action_name(action), (unsigned long long)m->a[1]);
	return reply(c, CUDA_SUCCESS, (uint64_t)action, lock_timeout, crash, map, sizeof(map));
}

static int handle_svc_op(struct conn *c, struct fg_msg *m)
{
	struct client *cl = c->client;
	struct alloc *a;

	switch (m->op) {
	case FG_SVC_LIST: {
		pthread_mutex_lock(&cl->mem_lock);
		size_t n = 0;
		for (a = cl->allocs; a; a = a->next)
			n++;
		struct fg_buf *bufs = calloc(n ? n : 1, sizeof(*bufs));
		if (!bufs) {
			pthread_mutex_unlock(&cl->mem_lock);
			return reply(c, CUDA_ERROR_OUT_OF_MEMORY, 0, 0, 0, NULL, 0);
		}
		n = 0;
		for (a = cl->allocs; a; a = a->next, n++) {
			bufs[n].dptr = a->dptr;
			bufs[n].size = a->size;
			bufs[n].gpu = a->gpu;
		}
		pthread_mutex_unlock(&cl->mem_lock);
		int rc = reply(c, CUDA_SUCCESS, n, 0, 0, bufs, n * sizeof(*bufs));
		free(bufs);
		return rc;
	}
	case FG_SVC_PULL: {
		pthread_mutex_lock(&cl->mem_lock);
		for (a = cl->allocs; a && a->dptr != m->a[0]; a = a->next)
			;
		int rc = a ? reply(c, CUDA_SUCCESS, 0, 0, 0, a->data, a->size)
			   : reply(c, CUDA_ERROR_INVALID_VALUE, 0, 0, 0, NULL, 0);
		pthread_mutex_unlock(&cl->mem_lock);
		return rc;
	}
	case FG_SVC_PUSH: {
		pthread_mutex_lock(&cl->mem_lock);
		CUresult r = find_range(cl, m->a[0], 1) ? CUDA_ERROR_INVALID_VALUE
							 : alloc_mem(cl, (uint32_t)m->a[1], m->len, m->a[0], &a);
		int rc = r == CUDA_SUCCESS ? fg_read_full(c->fd, a->data, m->len) : drain(c->fd, m->len);
		pthread_mutex_unlock(&cl->mem_lock);
		if (rc)
			return -1;
		return reply(c, r, 0, 0, 0, NULL, 0);
	}
	case FG_SVC_DONE: {
		int32_t st = m->status;
		uint64_t per_gpu[FG_MAX_GPUS] = { 0 };
		pthread_mutex_lock(&g_lock);
		int action = cl->job_action;
		pthread_mutex_unlock(&g_lock);
		if (action == FG_ACT_CHECKPOINT && st == CUDA_SUCCESS) {
			pthread_mutex_lock(&cl->mem_lock);
			free_all(cl, per_gpu);
			pthread_mutex_unlock(&cl->mem_lock);
		} else if (action == FG_ACT_RESTORE && st != CUDA_SUCCESS) {
			pthread_mutex_lock(&cl->mem_lock);
			free_all(cl, NULL);
			pthread_mutex_unlock(&cl->mem_lock);
		}
		pthread_mutex_lock(&g_lock);
		switch (action) {
		case FG_ACT_LOCK:
			if (st == CUDA_SUCCESS)
				cl->state = CU_PROCESS_STATE_LOCKED;
			break;
		case FG_ACT_CHECKPOINT:
			if (st == CUDA_SUCCESS) {
				cl->state = CU_PROCESS_STATE_CHECKPOINTED;
				memcpy(cl->ckpt_bytes, per_gpu, sizeof(per_gpu));
			}
			break;
		case FG_ACT_RESTORE:
			if (st == CUDA_SUCCESS) {
				uint32_t mask = 0;
				for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
					if (cl->used_mask & (1u << g))
						mask |= 1u << cl->job_map[g];
				cl->used_mask = mask;
				cl->state = CU_PROCESS_STATE_LOCKED;
			}
			break;
		case FG_ACT_UNLOCK:
			if (st == CUDA_SUCCESS)
				cl->state = CU_PROCESS_STATE_RUNNING;
			break;
		}
		cl->job_result = st;
		cl->job_phase = JOB_FINISHING; /* done once the service connection is closed */
		pthread_mutex_unlock(&g_lock);
		dbg("client %llu: %s finished with %d", (unsigned long long)cl->id, action_name(action), st);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	}
	}
	logmsg("unexpected op %u on a service connection", m->op);
	return -1;
}

static void svc_closed(struct conn *c)
{
	struct client *cl = c->client;
	int died = 0;
	pthread_mutex_lock(&g_lock);
	if (cl->job_conn == c) {
		cl->job_conn = NULL;
		if (cl->job_phase == JOB_FINISHING) {
			cl->job_phase = JOB_DONE;
		} else if (cl->job_phase == JOB_ACCEPTED) {
			/* the service thread vanished mid-job: the process died */
			cl->job_phase = JOB_DONE;
			cl->job_result = CUDA_ERROR_OPERATING_SYSTEM;
			died = !cl->main_conn;
		}
		pthread_cond_broadcast(&g_cond);
	}
	pthread_mutex_unlock(&g_lock);
	if (died)
		client_died(cl);
}

/* ---- checkpoint side ---- */

static int find_gpu_by_uuid(const unsigned char *uuid)
{
	for (uint32_t g = 0; g < g_devs.count; g++)
		if (!memcmp(g_devs.dev[g].uuid, uuid, 16))
			return (int)g;
	return -1;
}

static int peer_hung_up(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
	return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

static int handle_ck_action(struct conn *c, struct fg_msg *m)
{
	uint64_t id = m->a[0];
	int action = (int)m->a[1];
	uint64_t call_timeout = m->a[2];
	uint64_t lock_timeout = m->a[3];
	uint64_t start = fg_now_ms();
	struct fg_pair *pairs = NULL;
	size_t npairs = 0;
	char path[PATH_MAX];

	if (m->len) {
		if (m->len % sizeof(struct fg_pair) || m->len > 1024 * sizeof(struct fg_pair))
			return -1;
		pairs = malloc(m->len);
		if (!pairs || fg_read_full(c->fd, pairs, m->len)) {
			free(pairs);
			return -1;
		}
		npairs = m->len / sizeof(struct fg_pair);
	}

	pthread_mutex_lock(&g_lock);
	struct client *cl = find_client(id);
	CUresult r = CUDA_SUCCESS;
	uint32_t map[FG_MAX_GPUS];
	for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
		map[g] = g;
	static const CUprocessState need[] = {
		[FG_ACT_LOCK] = CU_PROCESS_STATE_RUNNING,
		[FG_ACT_CHECKPOINT] = CU_PROCESS_STATE_LOCKED,
		[FG_ACT_RESTORE] = CU_PROCESS_STATE_CHECKPOINTED,
		[FG_ACT_UNLOCK] = CU_PROCESS_STATE_LOCKED,
	};
	if (cl && action == FG_ACT_PING && cl->job_phase != JOB_NONE && cl->job_phase != JOB_DONE) {
		/* the restore thread is at work on another call: it is running, nothing to ask */
		pthread_mutex_unlock(&g_lock);
		free(pairs);
		return reply(c, CUDA_SUCCESS, 0, 0, 0, NULL, 0);
	}
	if (!cl)
		r = CUDA_ERROR_NOT_FOUND;
	else if (action < FG_ACT_LOCK || action > FG_ACT_PING)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (cl->job_phase != JOB_NONE && cl->job_phase != JOB_DONE)
		r = CUDA_ERROR_ILLEGAL_STATE; /* another call on this process is in progress */
	else if (action != FG_ACT_PING && cl->state != need[action])
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (r == CUDA_SUCCESS && action == FG_ACT_RESTORE && npairs) {
		/* every checkpointed GPU must be listed (with --pairs-of all: every GPU, onto distinct GPUs) */
		uint32_t targets = 0;
		for (uint32_t g = 0; g < g_devs.count && r == CUDA_SUCCESS; g++) {
			if (!g_pairs_of_all && !(cl->used_mask & (1u << g)))
				continue;
			size_t i;
			for (i = 0; i < npairs; i++)
				if (!memcmp(pairs[i].old_uuid, g_devs.dev[g].uuid, 16))
					break;
			if (i == npairs) {
				logmsg("restore of client %llu: GPU %u is not in the GPU pairs",
				       (unsigned long long)id, g);
				r = CUDA_ERROR_INVALID_VALUE;
				break;
			}
			int ng = find_gpu_by_uuid(pairs[i].new_uuid);
			if (ng < 0) {
				logmsg("restore of client %llu: new GPU UUID of pair %zu does not exist",
				       (unsigned long long)id, i);
				r = CUDA_ERROR_INVALID_DEVICE;
				break;
			}
			if (g_pairs_of_all && (targets & (1u << ng))) {
				logmsg("restore of client %llu: two GPUs paired onto GPU %d", (unsigned long long)id, ng);
				r = CUDA_ERROR_INVALID_VALUE;
				break;
			}
			targets |= 1u << ng;
			map[g] = (uint32_t)ng;
		}
	}
	if (r == CUDA_SUCCESS && action == FG_ACT_RESTORE) {
		uint64_t need_bytes[FG_MAX_GPUS] = { 0 };
		for (uint32_t g = 0; g < g_devs.count; g++)
			need_bytes[map[g]] += cl->ckpt_bytes[g];
		for (uint32_t g = 0; g < g_devs.count; g++)
			if (g_gpu_used[g] + need_bytes[g] > g_devs.dev[g].total_mem)
				r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	free(pairs);
	if (r != CUDA_SUCCESS) {
		pthread_mutex_unlock(&g_lock);
		dbg("%s of client %llu refused: %d", action_name(action), (unsigned long long)id, r);
		return reply(c, r, 0, 0, 0, NULL, 0);
	}

	uint64_t seq = g_next_seq++;
	cl->job_seq = seq;
	cl->job_phase = JOB_PENDING;
	cl->job_action = action;
	cl->job_result = CUDA_ERROR_UNKNOWN;
	cl->job_crash = (uint32_t)m->a[4];
	cl->job_lock_timeout = (uint32_t)lock_timeout;
	memcpy(cl->job_map, map, sizeof(map));

	/* ring the doorbell */
	client_path(path, sizeof(path), id);
	int ffd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	struct fg_doorbell db = { .id = id, .seq = seq };
	if (ffd < 0 || write(ffd, &db, sizeof(db)) != (ssize_t)sizeof(db)) {
		logmsg("cannot ring the doorbell %s: %s", path, strerror(errno));
		if (ffd >= 0)
			close(ffd);
		cl->job_phase = JOB_NONE;
		pthread_mutex_unlock(&g_lock);
		return reply(c, CUDA_ERROR_OPERATING_SYSTEM, 0, 0, 0, NULL, 0);
	}
	close(ffd);
	dbg("%s of client %llu requested (seq %llu)", action_name(action), (unsigned long long)id,
	    (unsigned long long)seq);

	/* wait for the service thread to take the job */
	uint64_t deadline = start + call_timeout;
	if (action == FG_ACT_LOCK && lock_timeout && start + lock_timeout < deadline)
		deadline = start + lock_timeout;
	while (cl->job_seq == seq && cl->job_phase == JOB_PENDING) {
		uint64_t t = fg_now_ms();
		if (t >= deadline || peer_hung_up(c->fd)) {
			cl->job_phase = JOB_NONE;
			int pid = cl->pid;
			pthread_mutex_unlock(&g_lock);
			logmsg("%s of client %llu (pid %d): the service thread did not answer within %llu ms",
			       action_name(action), (unsigned long long)id, pid, (unsigned long long)(t - start));
			return reply(c, CUDA_ERROR_TIMEOUT, 0, 0, 0, NULL, 0);
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t step = deadline - t < 100 ? deadline - t : 100;
		ts.tv_nsec += (long)(step * 1000000);
		ts.tv_sec += ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&g_cond, &g_lock, &ts);
	}
	/* taken: wait until it is finished. If the service thread stalls mid-job
	 * (stopped again, or blocked), report a timeout; the job stays in
	 * progress, so further calls get CUDA_ERROR_ILLEGAL_STATE until it ends. */
	deadline = fg_now_ms() + call_timeout;
	while (cl->job_seq == seq && cl->job_phase != JOB_DONE) {
		if (fg_now_ms() >= deadline) {
			int pid = cl->pid;
			pthread_mutex_unlock(&g_lock);
			logmsg("%s of client %llu (pid %d): the service thread took the job but did not finish it "
			       "within %llu ms",
			       action_name(action), (unsigned long long)id, pid, (unsigned long long)call_timeout);
			return reply(c, CUDA_ERROR_TIMEOUT, 0, 0, 0, NULL, 0);
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 100 * 1000000;
		ts.tv_sec += ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&g_cond, &g_lock, &ts);
	}
	r = cl->job_seq == seq ? (CUresult)cl->job_result : CUDA_ERROR_UNKNOWN;
	pthread_mutex_unlock(&g_lock);
	return reply(c, r, 0, 0, 0, NULL, 0);
}

static int handle_ck_query(struct conn *c, struct fg_msg *m)
{
	pthread_mutex_lock(&g_lock);
	struct client *cl = find_client(m->a[0]);
	CUresult r = cl ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
	uint64_t st = cl ? (uint64_t)cl->state : 0, tid = cl ? (uint64_t)cl->tid : 0,
		 pid = cl ? (uint64_t)cl->pid : 0;
	pthread_mutex_unlock(&g_lock);
	return reply(c, r, st, tid, pid, NULL, 0);
}

/* Device memory each live client holds, for the fake NVML's per-process query. */
static int handle_usage(struct conn *c)
{
	struct fg_usage u[256];
	struct client *live[256];
	uint64_t n = 0, k = 0;
	/* client records are never freed */
	pthread_mutex_lock(&g_lock);
	for (struct client *cl = g_clients; cl && k < 256; cl = cl->next)
		if (!cl->dead)
			live[k++] = cl;
	pthread_mutex_unlock(&g_lock);
	for (uint64_t i = 0; i < k; i++) {
		uint64_t bytes = __atomic_load_n(&live[i]->held, __ATOMIC_RELAXED);
		if (bytes)
			u[n++] = (struct fg_usage){ .pid = live[i]->pid, .bytes = bytes };
	}
	return reply(c, CUDA_SUCCESS, n, 0, 0, u, n * sizeof(u[0]));
}

/* ---- connections ---- */

static void *conn_thread(void *arg)
{
	struct conn *c = arg;
	struct fg_msg m;
	int rc = 0;

	while (rc == 0 && fg_recv(c->fd, &m) == 0) {
		if (!c->client) {
			switch (m.op) {
			case FG_HELLO: rc = handle_hello(c, &m); break;
			case FG_REATTACH: rc = handle_reattach(c, &m); break;
			case FG_SVC_HELLO: rc = handle_svc_hello(c, &m); break;
			case FG_CK_QUERY: rc = handle_ck_query(c, &m); break;
			case FG_CK_ACTION: rc = handle_ck_action(c, &m); break;
			case FG_USAGE: rc = handle_usage(c); break;
			default:
				logmsg("unexpected op %u", m.op);
				rc = -1;
			}
		} else if (c->is_svc) {
			rc = handle_svc_op(c, &m);
		} else {
			rc = handle_main_op(c, &m);
		}
	}
	if (c->client && c->is_svc) {
		svc_closed(c);
	} else if (c->client) {
		struct client *cl = c->client;
		pthread_mutex_lock(&g_lock);
		int mine = cl->main_conn == c;
		if (mine)
			cl->main_conn = NULL;
		pthread_mutex_unlock(&g_lock);
		if (mine)
			client_died(cl);
	}
	close(c->fd);
	free(c);
	return NULL;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);
	switch (*end) {
	case 'k': case 'K': v <<= 10; break;
	case 'm': case 'M': v <<= 20; break;
	case 'g': case 'G': v <<= 30; break;
	case 't': case 'T': v <<= 40; break;
	case 0: break;
	default:
		fprintf(stderr, "fakegpu: daemon: bad size '%s'\n", s);
		exit(1);
	}
	return v;
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: fakegpu-daemon --dir DIR [--gpus N] [--gpu-mem BYTES] "
			"[--gpu-name NAME] [--uuid-seed S] [--pairs-of used|all] [--verbose]\n");
	exit(1);
}

int main(int argc, char **argv)
{
	unsigned gpus = 1;
	uint64_t mem = 16ull << 30;
	const char *name = "NVIDIA Fake H200";
	uint64_t seed = 0;
	char path[PATH_MAX];

	for (int i = 1; i < argc; i++) {
		const char *o = argv[i];
		if (!strcmp(o, "--verbose") || !strcmp(o, "-v")) {
			g_verbose = 1;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		const char *v = argv[++i];
		if (!strcmp(o, "--dir"))
			g_dir = v;
		else if (!strcmp(o, "--gpus"))
			gpus = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(o, "--gpu-mem"))
			mem = parse_size(v);
		else if (!strcmp(o, "--gpu-name"))
			name = v;
		else if (!strcmp(o, "--uuid-seed"))
			seed = strtoull(v, NULL, 0);
		else if (!strcmp(o, "--pairs-of") && (!strcmp(v, "used") || !strcmp(v, "all")))
			g_pairs_of_all = !strcmp(v, "all");
		else
			usage();
	}
	if (!g_dir || gpus < 1 || gpus > FG_MAX_GPUS || mem == 0)
		usage();

	g_devs.count = gpus;
	for (unsigned g = 0; g < gpus; g++) {
		struct fg_device *d = &g_devs.dev[g];
		snprintf(d->name, sizeof(d->name), "%s", name);
		uint64_t x = seed * 0x100 + g, u0 = splitmix64(&x), u1 = splitmix64(&x);
		memcpy(d->uuid, &u0, 8);
		memcpy(d->uuid + 8, &u1, 8);
		d->uuid[6] = (unsigned char)((d->uuid[6] & 0x0f) | 0x40);
		d->uuid[8] = (unsigned char)((d->uuid[8] & 0x3f) | 0x80);
		d->total_mem = mem;
		snprintf(d->pci_bus_id, sizeof(d->pci_bus_id), "00000000:%02X:00.0", 0x18 + 0x10 * g);
	}

	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g_cond, &ca);

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal; /* no SA_RESTART: accept() returns EINTR */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	mkdir(g_dir, 0777);
	snprintf(path, sizeof(path), "%s/" FG_CLIENTS_DIR, g_dir);
	if (mkdir(path, 0777) && errno != EEXIST) {
		logmsg("mkdir %s: %s", path, strerror(errno));
		return 1;
	}
	chmod(path, 0777);

	/* Stand-ins of the NVIDIA device nodes. nvidiactl and nvidia<N> are character
	 * devices of the NVIDIA major (195) and the real minors, as the plugin counts
	 * only those as GPUs; the fake libcuda opens them O_PATH, so no driver is
	 * needed behind them. Without the right to mknod (not root), regular files:
	 * the workloads still run, but a dump does not see which GPUs they hold. */
	snprintf(path, sizeof(path), "%s/dev", g_dir);
	if (mkdir(path, 0777) && errno != EEXIST) {
		logmsg("mkdir %s: %s", path, strerror(errno));
		return 1;
	}
	for (int i = -2; i < (int)gpus; i++) {
		if (i == -2)
			snprintf(path, sizeof(path), "%s/dev/nvidiactl", g_dir);
		else if (i == -1)
			snprintf(path, sizeof(path), "%s/dev/nvidia-uvm", g_dir);
		else
			snprintf(path, sizeof(path), "%s/dev/nvidia%d", g_dir, i);
		if (i != -1) {
			unlink(path);
			if (mknod(path, S_IFCHR | 0666, makedev(195, i == -2 ? 255 : (unsigned)i)) == 0) {
				chmod(path, 0666);
				continue;
			}
			logmsg("cannot make the character device %s (%s): a regular file instead", path,
			       strerror(errno));
		}
		int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
		if (fd < 0) {
			logmsg("cannot create %s: %s", path, strerror(errno));
			return 1;
		}
		fchmod(fd, 0666);
		close(fd);
	}

	struct sockaddr_un sun;
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	if ((size_t)snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/" FG_SOCK_NAME, g_dir) >=
	    sizeof(sun.sun_path)) {
		logmsg("--dir path too long for a unix socket");
		return 1;
	}
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	unlink(sun.sun_path);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sun, sizeof(sun)) || listen(lfd, 64)) {
		logmsg("listen on %s: %s", sun.sun_path, strerror(errno));
		return 1;
	}
	chmod(sun.sun_path, 0666);

	char tmp[PATH_MAX + 8];
	snprintf(path, sizeof(path), "%s/" FG_PID_NAME, g_dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "we");
	if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) || rename(tmp, path)) {
		logmsg("cannot write %s: %s", path, strerror(errno));
		return 1;
	}
	dbg("listening on %s: %u GPU(s) '%s', %llu bytes each", sun.sun_path, gpus, name,
	    (unsigned long long)mem);

	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	while (!g_stop) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EINTR && errno != ECONNABORTED)
				logmsg("accept: %s", strerror(errno));
			continue;
		}
		struct conn *c = calloc(1, sizeof(*c));
		pthread_t th;
		if (!c) {
			close(fd);
			continue;
		}
		c->fd = fd;
		if (pthread_create(&th, &attr, conn_thread, c)) {
			logmsg("pthread_create failed");
			close(fd);
			free(c);
		}
	}
	unlink(sun.sun_path);
	unlink(path);
	dbg("stopped");
	return 0;
}
