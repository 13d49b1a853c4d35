/*
 * Fake libcuda.so.1 for tests without a GPU. See fakegpu.h for the design.
 *
 * Four files, one library: this one holds the process's state, its device
 * nodes and mappings, the API gate and cuInit; libcuda_fake_api.c the client
 * calls (devices, contexts, memory, errors); libcuda_fake_service.c the
 * restore thread; libcuda_fake_checkpoint.c the cuCheckpointProcess* calls
 * another process makes. What they share is in libcuda_fake.h, hidden: the
 * library exports only the cu* entry points.
 *
 * Built twice: as tests/fakegpu/libcuda.so.1 (driver 13000 with the
 * cuCheckpointProcess* API) and, with -DFAKEGPU_NO_CHECKPOINT_API, as
 * tests/fakegpu/old/libcuda.so.1 (driver 12040, no checkpoint API and no
 * restore thread).
 *
 * Environment:
 *   FAKEGPU_DIR               directory of the daemon (all processes)
 *   FAKEGPU_DRIVER_VERSION    value reported by cuDriverGetVersion
 *   FAKEGPU_SHARED_HANDLE=1   the process holds one more nvidiactl node, as the fd of
 *                             an exported CUDA memory handle (see open_nodes)
 *   FAKEGPU_LEGACY_IPC=export | import:PID   the trace legacy CUDA IPC leaves on r580 (see
 *                             map_ipc_file): export creates and maps this process's
 *                             /dev/shm/cuda.shm.0.<pid in hex>.1, import:PID maps PID's
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
 *   FAKEGPU_RESTORE_BACKWARDS=1  the restore thread reads each host copy a page
 *                             at a time from its end to its start before it
 *                             pushes it (memory touched out of the order it was
 *                             restored in)
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
#include "libcuda_fake.h"

#ifdef FAKEGPU_NO_CHECKPOINT_API
#define FG_DEFAULT_DRIVER_VERSION 12040
#else
#define FG_DEFAULT_DRIVER_VERSION 13000
#endif

__attribute__((format(printf, 1, 2))) void fg_err(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fg_vlog("", fmt, ap);
	va_end(ap);
}

uint64_t env_u64(const char *var, uint64_t def)
{
	const char *s = getenv(var);
	if (!s || !*s)
		return def;
	return strtoull(s, NULL, 0);
}

/* ======================================================================
 * Client half
 * ====================================================================== */


static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
char g_dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
uint64_t g_id;
int g_main_fd = -1;
int g_fifo_fd = -1;
struct fg_devices g_devs;
uint32_t g_devmap[FG_MAX_GPUS]; /* device ordinal -> daemon GPU */
uint32_t g_ndev;                 /* devices this process sees (FAKEGPU_VISIBLE) */

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
struct CUctx_st g_primary[FG_MAX_GPUS];
pthread_mutex_t g_rpc_lock = PTHREAD_MUTEX_INITIALIZER;
/* Stand-ins of /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<gpu>: open while
 * the process holds device resources, closed at checkpoint like the real
 * driver's device fds. */
pthread_mutex_t g_node_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ctl_fd = -1, g_uvm_fd = -1;
static int g_gpu_fd[FG_MAX_GPUS];
uint32_t g_gpu_mask; /* daemon GPUs this process has a context on */
_Thread_local CUcontext tls_ctx;

/* API gate: lock/unlock of the checkpoint API */
pthread_mutex_t g_gate_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_gate_cond;
int g_locked;
int g_inflight;

#ifndef FAKEGPU_NO_CHECKPOINT_API
static pthread_t g_svc_thread;
int g_svc_tid;
int g_svc_go; /* 0 wait, 1 run, -1 exit */
struct host_copy *g_copies;
size_t g_ncopies;
size_t g_copies_bytes;
/* Test hooks, set at cuInit (tests/e2e/cuda_mapped_restore.sh): the restore writes its memory map and
 * its copies' addresses to FAKEGPU_DIR/restore-maps.PID before reading the copies (FAKEGPU_RECORD_MAPS);
 * the restore keeps its copies mapped, as a driver that did not unmap them would (FAKEGPU_KEEP_COPIES). */
int g_record_maps, g_keep_copies;
#endif

/* The driver's device mappings: when $FAKEGPU_DIR/dev/nvidia-mappable exists (a block device node the
 * fork tests make over a loop device: CRIU cannot dump a mapping of it by itself, like one of
 * /dev/nvidiactl), the process maps it while it holds its nodes, in two places (read-write and
 * read-only, like the real driver's bookkeeping mappings), and unmaps it at checkpoint. A child forked
 * after cuInit inherits the fd and the mappings and never uses them: see child_after_fork. */
int g_map_fd = -1;
void *g_map_rw, *g_map_ro;

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

void open_gpu_node(uint32_t gpu)
{
	char name[32];
	if (g_gpu_fd[gpu] >= 0)
		return;
	snprintf(name, sizeof(name), "nvidia%u", gpu);
	g_gpu_fd[gpu] = open_node(name);
}

void close_nodes(void)
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

/* FAKEGPU_SHARED_HANDLE=1: one more nvidiactl node, held like the file descriptor of a CUDA memory
 * handle exported to (or imported from) another process (cuMemExportToShareableHandle): the process's,
 * not the driver's, so a checkpoint leaves it open. */
static int g_handle_fd = -1;

/* FAKEGPU_LEGACY_IPC: as the r580 driver does for an IPC event (cuIpcGetEventHandle; torch shares one
 * with every CUDA tensor it passes to another process), the exporter creates
 * /dev/shm/cuda.shm.0.<its pid in hex>.1 (81920 bytes), maps it shared and keeps an fd of it; an importer
 * (cuIpcOpenEventHandle) maps the exporter's file. The driver never removes the file; neither does this. */
static void map_ipc_file(void)
{
	static int done;
	const char *how = getenv("FAKEGPU_LEGACY_IPC");
	if (done || !how)
		return;
	done = 1;
	int exporter = !strcmp(how, "export");
	long pid = exporter ? (long)getpid() : strncmp(how, "import:", 7) ? 0 : strtol(how + 7, NULL, 10);
	if (pid <= 0) {
		fg_err("FAKEGPU_LEGACY_IPC=%s: export or import:PID", how);
		return;
	}
	char path[64];
	snprintf(path, sizeof(path), "/dev/shm/cuda.shm.0.%lx.1", pid);
	int fd = open(path, exporter ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0 || (exporter && ftruncate(fd, 81920)) ||
	    mmap(NULL, 81920, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED)
		fg_err("FAKEGPU_LEGACY_IPC: %s: %s", path, strerror(errno));
	if (fd >= 0 && !exporter)
		close(fd);
}

/* nvidiactl, nvidia-uvm and one node per GPU in g_gpu_mask. */
int open_nodes(void)
{
	if (g_ctl_fd < 0)
		g_ctl_fd = open_node("nvidiactl");
	const char *handle = getenv("FAKEGPU_SHARED_HANDLE");
	if (g_handle_fd < 0 && handle && !strcmp(handle, "1"))
		g_handle_fd = open_node("nvidiactl");
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

/* The gate waits in steps of 20 ms: the restore thread's unlock may have to wake it without the gate's
 * lock (svc_unlock), and a wake-up sent before the wait would otherwise be lost. */
CUresult api_enter(void)
{
	if (!g_inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&g_gate_lock);
	while (__atomic_load_n(&g_locked, __ATOMIC_ACQUIRE)) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 20000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&g_gate_cond, &g_gate_lock, &ts);
	}
	g_inflight++;
	pthread_mutex_unlock(&g_gate_lock);
	return CUDA_SUCCESS;
}

void api_leave(void)
{
	pthread_mutex_lock(&g_gate_lock);
	if (--g_inflight == 0)
		pthread_cond_broadcast(&g_gate_cond);
	pthread_mutex_unlock(&g_gate_lock);
}

/* One request/response on the main connection. in: payload to send;
 * out/outlen: where the reply payload goes (must match exactly). */
CUresult rpc(uint32_t op, uint64_t a0, uint64_t a1, uint64_t a2, const void *in, uint64_t inlen,
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
	map_ipc_file();
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
