/*
 * Fake libcuda.so.1 for tests without a GPU. See fakegpu.h for the design.
 *
 * Built twice: as tests/fakegpu/libcuda.so.1 (driver 13000 with the
 * cuCheckpointProcess* API) and, with -DFAKEGPU_NO_CHECKPOINT_API, as
 * tests/fakegpu/old/libcuda.so.1 (driver 12040, no checkpoint API and no
 * restore thread).
 *
 * Environment:
 *   FAKEGPU_DIR               directory of the daemon (all processes)
 *   FAKEGPU_DRIVER_VERSION    value reported by cuDriverGetVersion
 *   FAKEGPU_KEEP_DEVICE_MAPPING=1  the device mappings (dev/nvidia-mappable, see
 *                             map_device) stay mapped after a checkpoint
 * Read by the checkpoint half, in the calling process, on every call:
 *   FAKEGPU_CALL_TIMEOUT_MS   how long the restore thread gets to take a
 *                             request (default 60000)
 *   FAKEGPU_FAIL=op[:pid][,...]   op returns CUDA_ERROR_UNKNOWN
 *   FAKEGPU_INIT_MS=N         cuInit takes N ms first (a driver slow to load)
 *   FAKEGPU_COPY_MBPS=N       the restore thread copies device memory at N MB/s
 *                             (checkpoint and restore), so that progress shows
 *   FAKEGPU_STALL_AFTER_MB=N  the restore thread stops making progress after
 *                             N MB of a checkpoint or restore: a driver that
 *                             hangs mid-copy, for FAKEGPU_STALL_MS (default:
 *                             until the process dies), then goes on
 * Managed memory (cuMemAllocManaged) is host memory here, usable through its
 * pointer; like the r580 driver, a checkpoint of a process that holds some is
 * refused with CUDA_ERROR_NOT_SUPPORTED (the process stays locked).
 *   FAKEGPU_HANG=op[:pid][,...]   op sleeps FAKEGPU_HANG_MS (default 3600000) first
 *   FAKEGPU_CRASH_TARGET=op[:pid][,...]  the target's restore thread SIGKILLs
 *                             its process when it receives op
 *   FAKEGPU_KILL_CALLER=op[:pid][,...]   the calling process (e.g. CRIU, which
 *                             runs the plugin) SIGKILLs itself when it calls op;
 *                             once per op (and pid, if given): a file
 *                             kill-caller.<op>[.<pid>] in FAKEGPU_DIR records it,
 *                             so that a process taking over afterwards (the
 *                             plugin's guard, which inherits CRIU's environment)
 *                             can make the same call
 *   op is one of getrestoretid, getstate, lock, checkpoint, restore, unlock.
 */
#define _GNU_SOURCE
#define __CUDA_API_PUSH_VISIBILITY_DEFAULT 1
#include <cuda.h>

#include <ctype.h>
#include <dirent.h>
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
#include <time.h>
#include <unistd.h>

#include "fakegpu.h"

#ifdef FAKEGPU_NO_CHECKPOINT_API
#define FG_DEFAULT_DRIVER_VERSION 12040
#else
#define FG_DEFAULT_DRIVER_VERSION 13000
#endif

__attribute__((format(printf, 1, 2))) static void fg_err(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fg_vlog("", fmt, ap);
	va_end(ap);
}

/* ======================================================================
 * Client half
 * ====================================================================== */

#define CTX_MAGIC 0x43545846u

struct CUctx_st {
	uint32_t magic;
	int ordinal;
	int primary;
	int refs;
};

struct host_copy {
	uint64_t dptr;
	uint64_t size;
	uint32_t gpu;
	void *data;
};

static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
static char g_dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
static uint64_t g_id;
static int g_main_fd = -1;
static int g_fifo_fd = -1;
static struct fg_devices g_devs;
static uint32_t g_devmap[FG_MAX_GPUS]; /* device ordinal -> daemon GPU */
static uint32_t g_ndev;                 /* devices this process sees (FAKEGPU_VISIBLE) */

/*
 * How this process sees the machine, to play "another host" in tests (read by cuInit):
 *   FAKEGPU_VISIBLE=2,0   only these daemon GPUs, in this ordinal order (like CUDA_VISIBLE_DEVICES)
 *   FAKEGPU_MODEL=NAME    every GPU reports this model name
 *   FAKEGPU_MEM=BYTES     every GPU reports this much memory
 */
static void apply_view(void)
{
	g_ndev = g_devs.count;
	const char *vis = getenv("FAKEGPU_VISIBLE");
	if (!vis)
		return;
	uint32_t n = 0;
	for (const char *p = vis; *p && n < FG_MAX_GPUS;) {
		char *end;
		unsigned long idx = strtoul(p, &end, 10);
		if (end == p)
			break;
		if (idx < g_devs.count)
			g_devmap[n++] = (uint32_t)idx;
		p = *end == ',' ? end + 1 : end;
	}
	g_ndev = n;
}
static struct CUctx_st g_primary[FG_MAX_GPUS];
static pthread_mutex_t g_rpc_lock = PTHREAD_MUTEX_INITIALIZER;
/* Stand-ins of /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<gpu>: open while
 * the process holds device resources, closed at checkpoint like the real
 * driver's device fds. */
static pthread_mutex_t g_node_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ctl_fd = -1, g_uvm_fd = -1;
static int g_gpu_fd[FG_MAX_GPUS];
static uint32_t g_gpu_mask; /* daemon GPUs this process has a context on */
static _Thread_local CUcontext tls_ctx;

/* API gate: lock/unlock of the checkpoint API */
static pthread_mutex_t g_gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cond;
static int g_locked;
static int g_inflight;

#ifndef FAKEGPU_NO_CHECKPOINT_API
static pthread_t g_svc_thread;
static int g_svc_tid;
static int g_svc_go; /* 0 wait, 1 run, -1 exit */
static struct host_copy *g_copies;
static size_t g_ncopies;
static size_t g_copies_bytes;
/* Test hooks, set at cuInit (tests/e2e/cuda_mapped_restore.sh): the restore writes its memory map and
 * its copies' addresses to FAKEGPU_DIR/restore-maps.PID before reading the copies (FAKEGPU_RECORD_MAPS);
 * the restore keeps its copies mapped, as a driver that did not unmap them would (FAKEGPU_KEEP_COPIES). */
static int g_record_maps, g_keep_copies;
static void *svc_main(void *arg);
#endif

/* The driver's device mappings: when $FAKEGPU_DIR/dev/nvidia-mappable exists (a block device node the
 * fork tests make over a loop device: CRIU cannot dump a mapping of it by itself, like one of
 * /dev/nvidiactl), the process maps it while it holds its nodes, in two places (read-write and
 * read-only, like the real driver's bookkeeping mappings), and unmaps it at checkpoint. A child forked
 * after cuInit inherits the fd and the mappings and never uses them: see child_after_fork. */
#define FG_MAP_RW_BYTES (2 * 4096)
#define FG_MAP_RO_BYTES 4096
static int g_map_fd = -1;
static void *g_map_rw, *g_map_ro;

static void map_device(void)
{
	char path[PATH_MAX];
	if (g_map_fd >= 0)
		return;
	snprintf(path, sizeof(path), "%s/dev/nvidia-mappable", g_dir);
	g_map_fd = open(path, O_RDWR | O_CLOEXEC);
	if (g_map_fd < 0)
		return; /* not asked for */
	g_map_rw = mmap(NULL, FG_MAP_RW_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, g_map_fd, 0);
	g_map_ro = mmap(NULL, FG_MAP_RO_BYTES, PROT_READ, MAP_SHARED, g_map_fd, FG_MAP_RW_BYTES);
	if (g_map_rw == MAP_FAILED || g_map_ro == MAP_FAILED)
		fg_err("cannot map %s: %s", path, strerror(errno));
	if (g_map_rw == MAP_FAILED)
		g_map_rw = NULL;
	if (g_map_ro == MAP_FAILED)
		g_map_ro = NULL;
}

static void unmap_device(void)
{
	if (g_map_rw)
		munmap(g_map_rw, FG_MAP_RW_BYTES);
	if (g_map_ro)
		munmap(g_map_ro, FG_MAP_RO_BYTES);
	if (g_map_fd >= 0)
		close(g_map_fd);
	g_map_rw = g_map_ro = NULL;
	g_map_fd = -1;
}

static int open_node(const char *name)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/dev/%s", g_dir, name);
	/* The daemon's device nodes have no driver behind them: held O_PATH, which
	 * never calls into a driver, yet shows in /proc/PID/fd like the real ones. */
	struct stat st;
	int flags = stat(path, &st) == 0 && S_ISCHR(st.st_mode) ? O_PATH : O_RDWR;
	int fd = open(path, flags | O_CLOEXEC);
	if (fd < 0)
		fg_err("cannot open %s: %s", path, strerror(errno));
	return fd;
}

static void open_gpu_node(uint32_t gpu)
{
	char name[32];
	if (g_gpu_fd[gpu] >= 0)
		return;
	snprintf(name, sizeof(name), "nvidia%u", gpu);
	g_gpu_fd[gpu] = open_node(name);
}

static void close_nodes(void)
{
	unmap_device();
	if (g_ctl_fd >= 0)
		close(g_ctl_fd);
	if (g_uvm_fd >= 0)
		close(g_uvm_fd);
	g_ctl_fd = g_uvm_fd = -1;
	for (uint32_t g = 0; g < FG_MAX_GPUS; g++) {
		if (g_gpu_fd[g] >= 0)
			close(g_gpu_fd[g]);
		g_gpu_fd[g] = -1;
	}
}

/* nvidiactl, nvidia-uvm and one node per GPU in g_gpu_mask. */
static int open_nodes(void)
{
	if (g_ctl_fd < 0)
		g_ctl_fd = open_node("nvidiactl");
	if (g_uvm_fd < 0)
		g_uvm_fd = open_node("nvidia-uvm");
	for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
		if (g_gpu_mask & (1u << g))
			open_gpu_node(g);
	map_device();
	return g_ctl_fd >= 0 && g_uvm_fd >= 0 ? 0 : -1;
}

static void child_after_fork(void)
{
	/* The child of a CUDA process is not a CUDA client (like with the real
	 * driver, it must not use the parent's contexts). Drop the inherited
	 * connection and identity so that it can call cuInit on its own. */
	if (g_main_fd >= 0)
		close(g_main_fd);
	if (g_fifo_fd >= 0)
		close(g_fifo_fd);
	g_main_fd = g_fifo_fd = -1;
	/* Like the real driver's: the device mappings and their fd stay in the child, unused. */
	g_map_fd = -1;
	g_map_rw = g_map_ro = NULL;
	close_nodes();
	g_gpu_mask = 0;
	pthread_mutex_init(&g_node_lock, NULL);
	g_inited = 0;
	g_init_result = CUDA_ERROR_NOT_INITIALIZED;
	g_locked = 0;
	g_inflight = 0;
	tls_ctx = NULL;
	memset(g_primary, 0, sizeof(g_primary));
	pthread_mutex_init(&g_init_lock, NULL);
	pthread_mutex_init(&g_rpc_lock, NULL);
	pthread_mutex_init(&g_gate_lock, NULL);
#ifndef FAKEGPU_NO_CHECKPOINT_API
	g_copies = NULL; /* the mappings are the parent's data, leave them */
	g_ncopies = g_copies_bytes = 0;
	g_svc_go = 0;
#endif
}

__attribute__((constructor)) static void fg_ctor(void)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g_gate_cond, &ca);
	for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
		g_gpu_fd[g] = -1;
	pthread_atfork(NULL, NULL, child_after_fork);
}

static CUresult api_enter(void)
{
	if (!g_inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&g_gate_lock);
	while (g_locked)
		pthread_cond_wait(&g_gate_cond, &g_gate_lock);
	g_inflight++;
	pthread_mutex_unlock(&g_gate_lock);
	return CUDA_SUCCESS;
}

static void api_leave(void)
{
	pthread_mutex_lock(&g_gate_lock);
	if (--g_inflight == 0)
		pthread_cond_broadcast(&g_gate_cond);
	pthread_mutex_unlock(&g_gate_lock);
}

/* One request/response on the main connection. in: payload to send;
 * out/outlen: where the reply payload goes (must match exactly). */
static CUresult rpc(uint32_t op, uint64_t a0, uint64_t a1, uint64_t a2, const void *in, uint64_t inlen,
		    void *out, uint64_t outlen, struct fg_msg *rep)
{
	uint64_t a[3] = { a0, a1, a2 };
	struct fg_msg m;
	pthread_mutex_lock(&g_rpc_lock);
	if (g_main_fd < 0 || fg_send(g_main_fd, op, 0, a, 3, in, inlen) || fg_recv(g_main_fd, &m)) {
		pthread_mutex_unlock(&g_rpc_lock);
		fg_err("lost the connection to the daemon in %s", g_dir);
		return CUDA_ERROR_UNKNOWN;
	}
	if (m.len && (m.len != outlen || fg_read_full(g_main_fd, out, m.len))) {
		pthread_mutex_unlock(&g_rpc_lock);
		fg_err("bad reply from the daemon (op %u)", op);
		return CUDA_ERROR_UNKNOWN;
	}
	pthread_mutex_unlock(&g_rpc_lock);
	if (rep)
		*rep = m;
	return (CUresult)m.status;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	const char *v = getenv("FAKEGPU_DRIVER_VERSION");
	*driverVersion = v && *v ? atoi(v) : FG_DEFAULT_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int flags)
{
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&g_init_lock);
	if (g_inited) {
		pthread_mutex_unlock(&g_init_lock);
		return CUDA_SUCCESS;
	}
	const char *slow = getenv("FAKEGPU_INIT_MS"); /* a driver slow to load (cold, many GPUs) */
	uint64_t init_ms = slow ? strtoull(slow, NULL, 0) : 0;
	if (init_ms)
		fg_sleep_ms(init_ms);
	const char *dir = getenv("FAKEGPU_DIR");
	int fd = -1;
	CUresult r = CUDA_ERROR_NO_DEVICE;
	struct fg_msg m;
	if (!dir || !*dir) {
		fg_err("cuInit: FAKEGPU_DIR is not set");
		goto out;
	}
	if (strlen(dir) + 1 + sizeof(FG_SOCK_NAME) > sizeof(g_dir)) {
		fg_err("cuInit: FAKEGPU_DIR is too long");
		goto out;
	}
	strcpy(g_dir, dir);
#ifndef FAKEGPU_NO_CHECKPOINT_API
	g_record_maps = getenv("FAKEGPU_RECORD_MAPS") != NULL;
	g_keep_copies = getenv("FAKEGPU_KEEP_COPIES") != NULL;
#endif
	fd = fg_connect(g_dir);
	if (fd < 0) {
		fg_err("cuInit: cannot connect to the daemon at %s/" FG_SOCK_NAME ": %s", g_dir,
		       strerror(errno));
		goto out;
	}

	int tid = 0;
#ifndef FAKEGPU_NO_CHECKPOINT_API
	/* start the restore thread first: its tid is registered with the daemon */
	g_svc_go = 0;
	g_svc_tid = 0;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited: the thread blocks all signals */
	int prc = pthread_create(&g_svc_thread, NULL, svc_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (prc) {
		fg_err("cuInit: cannot start the restore thread");
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	pthread_mutex_lock(&g_gate_lock);
	while (!g_svc_tid)
		pthread_cond_wait(&g_gate_cond, &g_gate_lock);
	tid = g_svc_tid;
	pthread_mutex_unlock(&g_gate_lock);
#endif

	uint64_t a[2] = { (uint64_t)getpid(), (uint64_t)tid };
	if (fg_send(fd, FG_HELLO, 0, a, 2, NULL, 0) || fg_recv(fd, &m) || m.status ||
	    m.len != sizeof(g_devs) || fg_read_full(fd, &g_devs, sizeof(g_devs))) {
		fg_err("cuInit: registration with the daemon failed");
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto stop_thread;
	}
	g_id = m.a[0];
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/" FG_CLIENTS_DIR "/%llu", g_dir, (unsigned long long)g_id);
	g_fifo_fd = open(path, O_RDWR | O_CLOEXEC);
	if (g_fifo_fd < 0) {
		fg_err("cuInit: cannot open %s: %s", path, strerror(errno));
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto stop_thread;
	}
	if (open_nodes()) {
		close_nodes();
		close(g_fifo_fd);
		g_fifo_fd = -1;
		r = CUDA_ERROR_OPERATING_SYSTEM;
		goto stop_thread;
	}
	for (uint32_t i = 0; i < FG_MAX_GPUS; i++)
		g_devmap[i] = i;
	apply_view();
	g_main_fd = fd;
	fd = -1;
	g_inited = 1;
	r = CUDA_SUCCESS;
stop_thread:
#ifndef FAKEGPU_NO_CHECKPOINT_API
	pthread_mutex_lock(&g_gate_lock);
	g_svc_go = r == CUDA_SUCCESS ? 1 : -1;
	pthread_cond_broadcast(&g_gate_cond);
	pthread_mutex_unlock(&g_gate_lock);
	if (r != CUDA_SUCCESS)
		pthread_join(g_svc_thread, NULL);
	else
		pthread_detach(g_svc_thread);
#endif
out:
	if (fd >= 0)
		close(fd);
	g_init_result = r;
	pthread_mutex_unlock(&g_init_lock);
	return r;
}

static int dev_ok(CUdevice dev)
{
	return dev >= 0 && (uint32_t)dev < g_ndev;
}

#define ENTER()                               \
	do {                                  \
		CUresult e_ = api_enter();    \
		if (e_ != CUDA_SUCCESS)       \
			return e_;            \
	} while (0)
/* evaluates r (e.g. the rpc) before leaving the gate */
#define LEAVE(r)                          \
	do {                              \
		CUresult l_ = (r);        \
		api_leave();              \
		return l_;                \
	} while (0)
/* ENTER, then the device ordinal dev must be one this process sees */
#define ENTER_DEVICE(dev)                                 \
	do {                                              \
		ENTER();                                  \
		if (!dev_ok(dev))                         \
			LEAVE(CUDA_ERROR_INVALID_DEVICE); \
	} while (0)
/* ENTER, then the thread must have a current context */
#define ENTER_CONTEXT()                                    \
	do {                                               \
		ENTER();                                   \
		if (cur_gpu() < 0)                         \
			LEAVE(CUDA_ERROR_INVALID_CONTEXT); \
	} while (0)

/* What the daemon says of device ordinal dev (dev_ok). */
static const struct fg_device *dev_info(CUdevice dev)
{
	return &g_devs.dev[g_devmap[dev]];
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	*count = (int)g_ndev;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(ordinal);
	*device = ordinal;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	const char *model = getenv("FAKEGPU_MODEL");
	snprintf(name, (size_t)len, "%s", model ? model : dev_info(dev)->name);
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	memcpy(uuid->bytes, dev_info(dev)->uuid, 16);
	LEAVE(CUDA_SUCCESS);
}

/* the unversioned name, for callers built against older headers */
#undef cuDeviceGetUuid
__attribute__((visibility("default"))) CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	const char *mem = getenv("FAKEGPU_MEM");
	*bytes = mem ? (size_t)strtoull(mem, NULL, 0) : (size_t)dev_info(dev)->total_mem;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	if (!pciBusId || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	snprintf(pciBusId, (size_t)len, "%s", dev_info(dev)->pci_bus_id);
	LEAVE(CUDA_SUCCESS);
}

static CUresult use_gpu(CUdevice dev)
{
	uint32_t gpu = g_devmap[dev];
	CUresult r = rpc(FG_USE_GPU, gpu, 0, 0, NULL, 0, NULL, 0, NULL);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&g_node_lock);
		g_gpu_mask |= 1u << gpu;
		open_gpu_node(gpu);
		pthread_mutex_unlock(&g_node_lock);
	}
	return r;
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
			     CUdevice dev)
{
	(void)ctxCreateParams;
	(void)flags;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	CUresult r = use_gpu(dev);
	if (r != CUDA_SUCCESS)
		LEAVE(r);
	struct CUctx_st *c = calloc(1, sizeof(*c));
	if (!c)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	c->magic = CTX_MAGIC;
	c->ordinal = dev;
	c->refs = 1;
	*pctx = c;
	tls_ctx = c;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
	ENTER();
	if (!ctx || ctx->magic != CTX_MAGIC || ctx->primary)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	if (tls_ctx == ctx)
		tls_ctx = NULL;
	ctx->magic = 0;
	free(ctx);
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	ENTER();
	if (ctx && ctx->magic != CTX_MAGIC)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	tls_ctx = ctx;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	*pctx = tls_ctx;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	ENTER();
	LEAVE(tls_ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	struct CUctx_st *c = &g_primary[dev];
	if (c->magic != CTX_MAGIC) {
		CUresult r = use_gpu(dev);
		if (r != CUDA_SUCCESS)
			LEAVE(r);
		c->magic = CTX_MAGIC;
		c->ordinal = dev;
		c->primary = 1;
	}
	c->refs++;
	*pctx = c;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	ENTER_DEVICE(dev);
	if (g_primary[dev].refs > 0)
		g_primary[dev].refs--;
	LEAVE(CUDA_SUCCESS);
}

/* The GPU of the current context, or -1. */
static int cur_gpu(void)
{
	CUcontext c = tls_ctx;
	if (!c || c->magic != CTX_MAGIC)
		return -1;
	return (int)g_devmap[c->ordinal];
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total)
{
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	int gpu = cur_gpu();
	if (gpu < 0)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	struct fg_msg m;
	CUresult r = rpc(FG_MEMINFO, (uint64_t)gpu, 0, 0, NULL, 0, NULL, 0, &m);
	if (r == CUDA_SUCCESS) {
		*free_bytes = (size_t)m.a[0];
		*total = (size_t)m.a[1];
	}
	LEAVE(r);
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	int gpu = cur_gpu();
	if (gpu < 0)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	struct fg_msg m;
	CUresult r = rpc(FG_ALLOC, (uint64_t)gpu, bytesize, 0, NULL, 0, NULL, 0, &m);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)m.a[0];
	LEAVE(r);
}

static size_t g_managed_bytes; /* held by cuMemAllocManaged; never freed */

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	__atomic_add_fetch(&g_managed_bytes, bytesize, __ATOMIC_RELAXED);
	*dptr = (CUdeviceptr)(uintptr_t)p;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	ENTER_CONTEXT();
	if (!dptr)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_FREE, dptr, 0, 0, NULL, 0, NULL, 0, NULL));
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	if (ByteCount && !srcHost)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_CONTEXT();
	if (!ByteCount)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_HTOD, dstDevice, 0, 0, srcHost, ByteCount, NULL, 0, NULL));
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	if (ByteCount && !dstHost)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_CONTEXT();
	if (!ByteCount)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_DTOH, srcDevice, ByteCount, 0, NULL, 0, dstHost, ByteCount, NULL));
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	ENTER_CONTEXT();
	if (!N)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_MEMSET, dstDevice, uc, N, NULL, 0, NULL, 0, NULL));
}

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} g_errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS" },
	{ CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "wait operation timed out" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

/* The name (name_not_text) or the description of error, as cuGetErrorName and cuGetErrorString give
 * them. */
static CUresult error_text(CUresult error, const char **pStr, int name_not_text)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(g_errors) / sizeof(g_errors[0]); i++)
		if (g_errors[i].code == error) {
			*pStr = name_not_text ? g_errors[i].name : g_errors[i].text;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) { return error_text(error, pStr, 1); }

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) { return error_text(error, pStr, 0); }

#ifndef FAKEGPU_NO_CHECKPOINT_API

/* ======================================================================
 * The restore thread. It runs while every other thread of the process may
 * be ptrace-stopped anywhere, so it uses no malloc and no stdio: only
 * system calls, mmap and the gate mutex (never held across a stop point by
 * the application: a locked process has no API call in flight).
 * ====================================================================== */

static int svc_call(int fd, uint32_t op, int32_t status, uint64_t a0, uint64_t a1, const void *in,
		    uint64_t inlen, struct fg_msg *rep)
{
	uint64_t a[2] = { a0, a1 };
	if (fg_send(fd, op, status, a, 2, in, inlen) || fg_recv(fd, rep))
		return -1;
	return 0;
}

static void drop_copies(void)
{
	for (size_t i = 0; i < g_ncopies; i++)
		munmap(g_copies[i].data, g_copies[i].size);
	if (g_copies)
		munmap(g_copies, g_copies_bytes);
	g_copies = NULL;
	g_ncopies = g_copies_bytes = 0;
}

static CUresult svc_lock(uint32_t timeout_ms)
{
	CUresult r = CUDA_SUCCESS;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&g_gate_lock);
	g_locked = 1;
	while (g_inflight > 0) {
		if (!timeout_ms) {
			pthread_cond_wait(&g_gate_cond, &g_gate_lock);
		} else if (pthread_cond_timedwait(&g_gate_cond, &g_gate_lock, &ts) == ETIMEDOUT &&
			   g_inflight > 0) {
			g_locked = 0;
			pthread_cond_broadcast(&g_gate_cond);
			r = CUDA_ERROR_TIMEOUT;
			break;
		}
	}
	pthread_mutex_unlock(&g_gate_lock);
	return r;
}

static void svc_unlock(void)
{
	pthread_mutex_lock(&g_gate_lock);
	g_locked = 0;
	pthread_cond_broadcast(&g_gate_cond);
	pthread_mutex_unlock(&g_gate_lock);
}

/* Detaches and closes a main connection. */
static void detach_main(int fd)
{
	struct fg_msg m;
	uint64_t a[1] = { 0 };
	if (fg_send(fd, FG_DETACH, 0, a, 0, NULL, 0) == 0)
		fg_recv(fd, &m);
	close(fd);
}

static uint64_t env_u64(const char *var, uint64_t def);

/* Bytes the restore thread has copied in the current checkpoint or restore. */
static uint64_t g_copied;

/* Before copying len more bytes: honours FAKEGPU_STALL_AFTER_MB (blocks for
 * good) and FAKEGPU_COPY_MBPS (sleeps so that the copy runs at that rate). */
static void pace(uint64_t len)
{
	uint64_t stall_mb = env_u64("FAKEGPU_STALL_AFTER_MB", 0);
	if (stall_mb && g_copied <= (stall_mb << 20) && g_copied + len > (stall_mb << 20)) {
		uint64_t ms = env_u64("FAKEGPU_STALL_MS", 0);
		fg_err("FAKEGPU_STALL_AFTER_MB: restore thread of %d stops after %llu MiB%s", (int)getpid(),
		       (unsigned long long)(g_copied >> 20), ms ? " for a while" : "");
		if (!ms)
			for (;;)
				pause();
		fg_sleep_ms(ms);
	}
	g_copied += len;
	uint64_t mbps = env_u64("FAKEGPU_COPY_MBPS", 0);
	if (!mbps)
		return;
	uint64_t us = len * 1000000 / (mbps * 1000000);
	struct timespec ts = { .tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000 };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Reads len bytes of a pulled buffer into data, in pieces, paced. */
static int pull_paced(int sfd, char *data, uint64_t len)
{
	const uint64_t piece = 4u << 20;
	for (uint64_t off = 0; off < len; off += piece) {
		uint64_t n = len - off < piece ? len - off : piece;
		pace(n);
		if (fg_read_full(sfd, data + off, (size_t)n))
			return -1;
	}
	return 0;
}

static CUresult svc_checkpoint(int sfd)
{
	g_copied = 0;
	if (g_managed_bytes) {
		fg_err("checkpoint of %d refused: it holds %zu bytes of managed memory", (int)getpid(),
		       g_managed_bytes);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	struct fg_msg m;
	if (svc_call(sfd, FG_SVC_LIST, 0, 0, 0, NULL, 0, &m) || m.status)
		return CUDA_ERROR_OPERATING_SYSTEM;
	size_t n = (size_t)m.a[0];
	if (m.len != n * sizeof(struct fg_buf))
		return CUDA_ERROR_OPERATING_SYSTEM;
	size_t bytes = (n ? n : 1) * sizeof(struct fg_buf);
	size_t tbytes = (n ? n : 1) * sizeof(struct host_copy);
	struct fg_buf *bufs = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct host_copy *copies =
		mmap(NULL, tbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (bufs == MAP_FAILED || copies == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY; /* the connection is dropped by the caller */
	if (m.len && fg_read_full(sfd, bufs, m.len))
		return CUDA_ERROR_OPERATING_SYSTEM;
	g_copies = copies;
	g_copies_bytes = tbytes;
	g_ncopies = 0;
	CUresult r = CUDA_SUCCESS;
	for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
		void *data = mmap(NULL, bufs[i].size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (data == MAP_FAILED) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
		copies[i].dptr = bufs[i].dptr;
		copies[i].size = bufs[i].size;
		copies[i].gpu = bufs[i].gpu;
		copies[i].data = data;
		g_ncopies = i + 1;
		if (svc_call(sfd, FG_SVC_PULL, 0, bufs[i].dptr, 0, NULL, 0, &m) || m.status ||
		    m.len != bufs[i].size || pull_paced(sfd, data, m.len))
			r = CUDA_ERROR_OPERATING_SYSTEM;
	}
	munmap(bufs, bytes);
	if (r != CUDA_SUCCESS) {
		drop_copies();
		return r;
	}
	/* The process now holds everything; give up the device handles. */
	pthread_mutex_lock(&g_rpc_lock);
	int mfd = g_main_fd;
	g_main_fd = -1;
	pthread_mutex_unlock(&g_rpc_lock);
	if (mfd >= 0)
		detach_main(mfd);
	/* FAKEGPU_KEEP_DEVICE_MAPPING=1: a driver that forgets to release its device mapping at
	 * checkpoint (the plugin must refuse to dump such a process). */
	const char *keep = getenv("FAKEGPU_KEEP_DEVICE_MAPPING");
	if (keep && !strcmp(keep, "1")) {
		g_map_fd = -1;
		g_map_rw = g_map_ro = NULL;
	}
	close_nodes();
	return CUDA_SUCCESS;
}

/* FAKEGPU_RECORD_MAPS: /proc/self/maps, then "copy START-END" per host copy (no malloc, no stdio streams). */
static void record_maps(void)
{
	char path[sizeof(g_dir) + 64], buf[4096];
	snprintf(path, sizeof(path), "%s/restore-maps.%d", g_dir, (int)getpid());
	int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	ssize_t n;
	while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n)
			break;
	for (size_t i = 0; out >= 0 && i < g_ncopies; i++) {
		int len = snprintf(buf, sizeof(buf), "copy %lx-%lx\n", (unsigned long)g_copies[i].data,
				   (unsigned long)g_copies[i].data + (unsigned long)g_copies[i].size);
		if (write(out, buf, (size_t)len) != len)
			break;
	}
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
}

static CUresult svc_restore(int sfd, const uint32_t *map)
{
	struct fg_msg m;
	struct fg_devices devs;
	if (g_record_maps)
		record_maps();
	int mfd = fg_connect(g_dir);
	if (mfd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	uint64_t a[3] = { g_id, (uint64_t)getpid(), (uint64_t)gettid() };
	if (fg_send(mfd, FG_REATTACH, 0, a, 3, NULL, 0) || fg_recv(mfd, &m) || m.status ||
	    m.len != sizeof(devs) || fg_read_full(mfd, &devs, sizeof(devs))) {
		close(mfd);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	CUresult r = CUDA_SUCCESS;
	g_copied = 0;
	for (size_t i = 0; i < g_ncopies && r == CUDA_SUCCESS; i++) {
		struct host_copy *c = &g_copies[i];
		uint32_t gpu = c->gpu < FG_MAX_GPUS ? map[c->gpu] : c->gpu;
		pace(c->size);
		if (svc_call(sfd, FG_SVC_PUSH, 0, c->dptr, gpu, c->data, c->size, &m))
			r = CUDA_ERROR_OPERATING_SYSTEM;
		else
			r = (CUresult)m.status;
	}
	if (r != CUDA_SUCCESS) {
		detach_main(mfd); /* stay checkpointed, keep the host copies */
		return r;
	}
	if (g_keep_copies) {
		g_copies = NULL;
		g_ncopies = g_copies_bytes = 0;
	} else {
		drop_copies();
	}
	g_devs = devs;
	for (uint32_t i = 0; i < FG_MAX_GPUS; i++)
		g_devmap[i] = g_devmap[i] < FG_MAX_GPUS ? map[g_devmap[i]] : g_devmap[i];
	uint32_t mask = 0;
	for (uint32_t g = 0; g < FG_MAX_GPUS; g++)
		if (g_gpu_mask & (1u << g))
			mask |= 1u << map[g];
	g_gpu_mask = mask;
	open_nodes();
	pthread_mutex_lock(&g_rpc_lock);
	g_main_fd = mfd;
	pthread_mutex_unlock(&g_rpc_lock);
	return CUDA_SUCCESS;
}

static void svc_job(uint64_t seq)
{
	struct fg_msg m;
	uint32_t map[FG_MAX_GPUS];
	int sfd = fg_connect(g_dir);
	if (sfd < 0) {
		fg_err("restore thread: cannot connect to the daemon: %s", strerror(errno));
		return;
	}
	if (svc_call(sfd, FG_SVC_HELLO, 0, g_id, seq, NULL, 0, &m) || m.status == FG_CANCELLED ||
	    m.status != CUDA_SUCCESS || m.len != sizeof(map) || fg_read_full(sfd, map, sizeof(map))) {
		close(sfd);
		return;
	}
	int action = (int)m.a[0];
	uint32_t lock_timeout = (uint32_t)m.a[1];
	if (m.a[2]) {
		fg_err("restore thread: FAKEGPU_CRASH_TARGET: killing process %d", (int)getpid());
		kill(getpid(), SIGKILL);
	}
	CUresult r;
	switch (action) {
	case FG_ACT_LOCK: r = svc_lock(lock_timeout); break;
	case FG_ACT_CHECKPOINT: r = svc_checkpoint(sfd); break;
	case FG_ACT_RESTORE: r = svc_restore(sfd, map); break;
	case FG_ACT_UNLOCK: svc_unlock(); r = CUDA_SUCCESS; break;
	case FG_ACT_PING: r = CUDA_SUCCESS; break;
	default: r = CUDA_ERROR_INVALID_VALUE;
	}
	svc_call(sfd, FG_SVC_DONE, (int32_t)r, 0, 0, NULL, 0, &m);
	close(sfd);
}

static void *svc_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), FG_THREAD_NAME);
	pthread_mutex_lock(&g_gate_lock);
	g_svc_tid = gettid();
	pthread_cond_broadcast(&g_gate_cond);
	while (!g_svc_go)
		pthread_cond_wait(&g_gate_cond, &g_gate_lock);
	int go = g_svc_go;
	pthread_mutex_unlock(&g_gate_lock);
	if (go < 0)
		return NULL;
	for (;;) {
		struct fg_doorbell db;
		ssize_t n = read(g_fifo_fd, &db, sizeof(db));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EBADF)
			return NULL;
		if (n != (ssize_t)sizeof(db) || db.id != g_id)
			continue;
		svc_job(db.seq);
	}
	return NULL;
}

/* ======================================================================
 * Checkpoint half: called by another process (CRIU) with the target pid.
 * ====================================================================== */

enum { OP_GETRESTORETID, OP_GETSTATE, OP_LOCK, OP_CHECKPOINT, OP_RESTORE, OP_UNLOCK };
static const char *const g_op_names[] = { "getrestoretid", "getstate", "lock",
					   "checkpoint", "restore", "unlock" };

/* Does the list in env var `var` (op[:pid][,op[:pid]...]) name op for pid?
 * 1: by op alone, 2: by op and pid. */
static int env_matches(const char *var, int op, int pid)
{
	const char *s = getenv(var);
	if (!s)
		return 0;
	const char *name = g_op_names[op];
	size_t nl = strlen(name);
	while (*s) {
		const char *end = strchr(s, ',');
		size_t len = end ? (size_t)(end - s) : strlen(s);
		if (len >= nl && !strncmp(s, name, nl)) {
			if (len == nl)
				return 1;
			if (s[nl] == ':' && atoi(s + nl + 1) == pid)
				return 2;
		}
		s += len;
		if (*s == ',')
			s++;
	}
	return 0;
}

static uint64_t env_u64(const char *var, uint64_t def)
{
	const char *s = getenv(var);
	if (!s || !*s)
		return def;
	return strtoull(s, NULL, 0);
}

/* Finds the client id of pid from its fds. Returns 0 if it is not a client. */
static uint64_t resolve_pid(int pid)
{
	const char *dir = getenv("FAKEGPU_DIR");
	char real[PATH_MAX], prefix[PATH_MAX + 16], path[64], link[PATH_MAX];
	if (!dir || !*dir || !realpath(dir, real))
		return 0;
	int pl = snprintf(prefix, sizeof(prefix), "%s/" FG_CLIENTS_DIR "/", real);
	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	DIR *d = opendir(path);
	if (!d)
		return 0;
	uint64_t id = 0;
	struct dirent *de;
	while (!id && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		ssize_t n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n <= pl)
			continue;
		link[n] = 0;
		if (strncmp(link, prefix, (size_t)pl))
			continue;
		const char *p = link + pl;
		char *end;
		unsigned long long v = strtoull(p, &end, 10);
		if (isdigit((unsigned char)*p) && !*end)
			id = v;
	}
	closedir(d);
	return id;
}

/* Is the process gone (or a zombie)? */
static int pid_dead(int pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 1;
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	return !p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X';
}

/* FAKEGPU_KILL_CALLER: SIGKILLs this process the first time it (or any
 * process) calls op for pid. */
static void maybe_kill_caller(int op, int pid)
{
	int how = env_matches("FAKEGPU_KILL_CALLER", op, pid);
	const char *dir = getenv("FAKEGPU_DIR");
	if (!how || !dir)
		return;
	char marker[PATH_MAX];
	if (how == 2)
		snprintf(marker, sizeof(marker), "%s/kill-caller.%s.%d", dir, g_op_names[op], pid);
	else
		snprintf(marker, sizeof(marker), "%s/kill-caller.%s", dir, g_op_names[op]);
	int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return; /* fired already */
	close(fd);
	fg_err("FAKEGPU_KILL_CALLER: %s of pid %d: killing the caller, process %d", g_op_names[op], pid,
	       (int)getpid());
	kill(getpid(), SIGKILL);
}

/* Common start of every checkpoint call: resolve the pid, fault injection. */
static CUresult ck_begin(int op, int pid, uint64_t *id)
{
	if (pid <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	*id = resolve_pid(pid);
	if (!*id)
		return CUDA_ERROR_NOT_FOUND;
	maybe_kill_caller(op, pid);
	if (env_matches("FAKEGPU_HANG", op, pid)) {
		uint64_t ms = env_u64("FAKEGPU_HANG_MS", 3600000);
		fg_err("FAKEGPU_HANG: %s of pid %d sleeps %llu ms", g_op_names[op], pid, (unsigned long long)ms);
		fg_sleep_ms(ms);
	}
	if (env_matches("FAKEGPU_FAIL", op, pid)) {
		fg_err("FAKEGPU_FAIL: %s of pid %d fails", g_op_names[op], pid);
		return CUDA_ERROR_UNKNOWN;
	}
	return CUDA_SUCCESS;
}

/* A connection to the daemon in FAKEGPU_DIR (*dir), or -1, said. */
static int ck_connect(const char **dir)
{
	*dir = getenv("FAKEGPU_DIR");
	int fd = fg_connect(*dir);
	if (fd < 0)
		fg_err("cannot connect to the daemon in %s: %s", *dir, strerror(errno));
	return fd;
}

static CUresult ck_query(uint64_t id, struct fg_msg *rep)
{
	const char *dir;
	int fd = ck_connect(&dir);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	uint64_t a[1] = { id };
	int rc = fg_send(fd, FG_CK_QUERY, 0, a, 1, NULL, 0) || fg_recv(fd, rep);
	close(fd);
	if (rc) {
		fg_err("no answer from the daemon in %s", dir);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	return (CUresult)rep->status;
}

static CUresult ck_action(int op, int pid, uint64_t id, int action, uint32_t lock_timeout,
			  const struct fg_pair *pairs, size_t npairs)
{
	const char *dir;
	uint64_t call_timeout = env_u64("FAKEGPU_CALL_TIMEOUT_MS", 60000);
	int fd = ck_connect(&dir);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	uint64_t a[5] = { id, (uint64_t)action, call_timeout, lock_timeout,
			  (uint64_t)env_matches("FAKEGPU_CRASH_TARGET", op, pid) };
	if (fg_send(fd, FG_CK_ACTION, 0, a, 5, pairs, npairs * sizeof(*pairs))) {
		close(fd);
		fg_err("cannot talk to the daemon in %s", dir);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	/* wait for the answer; give up early if the target dies */
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n = poll(&p, 1, 200);
		if (n > 0)
			break;
		if (n < 0 && errno != EINTR)
			break;
		if (pid_dead(pid)) {
			close(fd);
			fg_err("%s: process %d died", g_op_names[op], pid);
			return CUDA_ERROR_OPERATING_SYSTEM;
		}
	}
	struct fg_msg m;
	int rc = fg_recv(fd, &m);
	close(fd);
	if (rc) {
		fg_err("%s: no answer from the daemon in %s", g_op_names[op], dir);
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	if (m.status == CUDA_ERROR_TIMEOUT)
		fg_err("%s of pid %d timed out: is its restore thread running?", g_op_names[op], pid);
	return (CUresult)m.status;
}

/* ck_begin, then the action: the body of the lock, checkpoint, restore and unlock calls. */
static CUresult ck_call(int op, int pid, int action, uint32_t lock_timeout, const struct fg_pair *pairs,
			size_t npairs)
{
	uint64_t id;
	CUresult r = ck_begin(op, pid, &id);
	if (r != CUDA_SUCCESS)
		return r;
	return ck_action(op, pid, id, action, lock_timeout, pairs, npairs);
}

static int all_zero(const void *p, size_t len)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < len; i++)
		if (b[i])
			return 0;
	return 1;
}

/* The task of pid whose tid in its own pid namespace is nstid. */
static int find_task(int pid, int nstid)
{
	char path[96], buf[4096];
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	DIR *d = opendir(path);
	if (!d)
		return 0;
	int found = 0, by_name = 0;
	struct dirent *de;
	while (!found && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		int t = atoi(de->d_name);
		snprintf(path, sizeof(path), "/proc/%d/task/%d/status", pid, t);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = 0;
		char *ns = strstr(buf, "\nNSpid:");
		if (ns) {
			char *end = strchr(ns + 1, '\n');
			if (end)
				*end = 0;
			char *last = strrchr(ns, '\t');
			if (last && atoi(last + 1) == nstid)
				found = t;
			if (end)
				*end = '\n';
		}
		if (!strncmp(buf, "Name:\t" FG_THREAD_NAME "\n", sizeof("Name:\t" FG_THREAD_NAME)))
			by_name = t;
	}
	closedir(d);
	return found ? found : by_name;
}

/* ck_begin, then the daemon's record of pid into *rep; ping: have its restore thread answer first
 * (the real driver's state query asks the restore thread, which must be running). */
static CUresult ck_lookup(int op, int pid, int ping, struct fg_msg *rep)
{
	uint64_t id;
	CUresult r = ck_begin(op, pid, &id);
	if (r == CUDA_SUCCESS && ping)
		r = ck_action(op, pid, id, FG_ACT_PING, 0, NULL, 0);
	if (r == CUDA_SUCCESS)
		r = ck_query(id, rep);
	return r;
}

CUresult CUDAAPI cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	struct fg_msg m;
	if (!tid)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ck_lookup(OP_GETRESTORETID, pid, 0, &m);
	if (r != CUDA_SUCCESS)
		return r;
	int t = find_task(pid, (int)m.a[1]);
	if (!t)
		return CUDA_ERROR_NOT_FOUND;
	*tid = t;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	struct fg_msg m;
	if (!state)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = ck_lookup(OP_GETSTATE, pid, 1, &m);
	if (r == CUDA_SUCCESS)
		*state = (CUprocessState)m.a[0];
	return r;
}

CUresult CUDAAPI cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	if (args && (args->reserved0 || !all_zero(args->reserved1, sizeof(args->reserved1))))
		return CUDA_ERROR_INVALID_VALUE;
	return ck_call(OP_LOCK, pid, FG_ACT_LOCK, args ? args->timeoutMs : 0, NULL, 0);
}

CUresult CUDAAPI cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	if (args && !all_zero(args->reserved, sizeof(args->reserved)))
		return CUDA_ERROR_INVALID_VALUE;
	return ck_call(OP_CHECKPOINT, pid, FG_ACT_CHECKPOINT, 0, NULL, 0);
}

CUresult CUDAAPI cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	struct fg_pair pairs[64];
	size_t n = 0;
	if (args) {
		if (!all_zero(args->reserved, sizeof(args->reserved)) || args->reserved1)
			return CUDA_ERROR_INVALID_VALUE;
		if (args->gpuPairsCount && !args->gpuPairs)
			return CUDA_ERROR_INVALID_VALUE;
		if (args->gpuPairsCount > sizeof(pairs) / sizeof(pairs[0]))
			return CUDA_ERROR_INVALID_VALUE;
		n = args->gpuPairsCount;
		for (size_t i = 0; i < n; i++) {
			memcpy(pairs[i].old_uuid, args->gpuPairs[i].oldUuid.bytes, 16);
			memcpy(pairs[i].new_uuid, args->gpuPairs[i].newUuid.bytes, 16);
		}
	}
	return ck_call(OP_RESTORE, pid, FG_ACT_RESTORE, 0, pairs, n);
}

CUresult CUDAAPI cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	if (args && !all_zero(args->reserved, sizeof(args->reserved)))
		return CUDA_ERROR_INVALID_VALUE;
	return ck_call(OP_UNLOCK, pid, FG_ACT_UNLOCK, 0, NULL, 0);
}

#endif /* !FAKEGPU_NO_CHECKPOINT_API */
