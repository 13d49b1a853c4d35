/*
 * fakegpu_smoke: self-contained test of the fake GPU.
 *
 *   fakegpu_smoke --lib libcuda.so.1 --old-lib old/libcuda.so.1
 *                 --daemon fakegpu-daemon --workload cuda_memcheck [--keep]
 *
 * Starts a daemon (2 fake GPUs) in a fresh directory, runs cuda_memcheck
 * against the fake library, and drives the checkpoint API on it from this
 * process (the workload is not ptrace-stopped, so its restore thread runs):
 * states, wrong-state calls, a lock/checkpoint/restore(remap)/unlock cycle,
 * socket-free checkpointed state, timeouts with a stopped target, fault
 * injection, a process tree, and the variant without the checkpoint API.
 * Exits 0 on success, 1 on the first failure.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakegpu.h" /* fg_now_ms, fg_sleep_ms */
#include "fakegpu_smoke.h"

typedef CUresult (*fn_getrestoretid)(int, int *);
typedef CUresult (*fn_getstate)(int, CUprocessState *);
typedef CUresult (*fn_lock)(int, CUcheckpointLockArgs *);
typedef CUresult (*fn_checkpoint)(int, CUcheckpointCheckpointArgs *);
typedef CUresult (*fn_restore)(int, CUcheckpointRestoreArgs *);
typedef CUresult (*fn_unlock)(int, CUcheckpointUnlockArgs *);
typedef CUresult (*fn_init)(unsigned);
typedef CUresult (*fn_version)(int *);
typedef CUresult (*fn_devget)(CUdevice *, int);
typedef CUresult (*fn_uuid)(CUuuid *, CUdevice);
typedef CUresult (*fn_retain)(CUcontext *, CUdevice);
typedef CUresult (*fn_setcur)(CUcontext);
typedef CUresult (*fn_meminfo)(size_t *, size_t *);

static fn_getrestoretid p_tid;
static fn_getstate p_state;
static fn_lock p_lock;
static fn_checkpoint p_ckpt;
static fn_restore p_restore;
static fn_unlock p_unlock;

static char g_dir[] = "/tmp/fakegpu-smoke.XXXXXX";
static pid_t g_daemon = -1;
static pid_t g_workloads[4];
static int g_nworkloads;
static int g_keep;
static int g_checks;

static void cleanup(void)
{
	for (int i = 0; i < g_nworkloads; i++)
		if (g_workloads[i] > 0) {
			kill(g_workloads[i], SIGKILL);
			waitpid(g_workloads[i], NULL, 0);
		}
	if (g_daemon > 0) {
		kill(g_daemon, SIGTERM);
		waitpid(g_daemon, NULL, 0);
	}
	if (!g_keep) {
		char cmd[PATH_MAX + 16];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
		if (system(cmd))
			fprintf(stderr, "fakegpu_smoke: cannot remove %s\n", g_dir);
	}
}

void die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "fakegpu_smoke: FAIL: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	g_keep = 1;
	fprintf(stderr, "fakegpu_smoke: logs kept in %s\n", g_dir);
	cleanup();
	exit(1);
}

#define EXPECT(call, want)                                                                   \
	do {                                                                                 \
		CUresult r_ = (call);                                                        \
		if (r_ != (want))                                                            \
			die("%s:%d: %s returned %d, expected %d", __FILE__, __LINE__, #call, \
			    (int)r_, (int)(want));                                           \
		g_checks++;                                                                  \
	} while (0)

static void expect_state(int pid, CUprocessState want, int line)
{
	CUprocessState st = (CUprocessState)-1;
	CUresult r = p_state(pid, &st);
	if (r != CUDA_SUCCESS || st != want)
		die("line %d: state of %d: result %d state %d, expected state %d", line, pid, (int)r, (int)st,
		    (int)want);
	g_checks++;
}
#define EXPECT_STATE(pid, st) expect_state(pid, st, __LINE__)

/* Number of fds of pid on the fake's device nodes; with name, on that one only. */
static int count_nodes(int pid, const char *name)
{
	char prefix[PATH_MAX];
	snprintf(prefix, sizeof(prefix), "%s/dev/%s", g_dir, name ? name : "");
	return count_fds(pid, prefix, name != NULL);
}

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p)
		die("dlsym %s: %s", name, dlerror());
	return p;
}

static pid_t start_workload(const char *workload, const char *libdir, const char *mb, const char *state,
			    const char *extra1, const char *extra2)
{
	char log[PATH_MAX];
	snprintf(log, sizeof(log), "%s.log", state);
	pid_t p = fork();
	if (p < 0)
		die("fork: %s", strerror(errno));
	if (p == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		setenv("LD_LIBRARY_PATH", libdir, 1);
		setsid();
		execl(workload, workload, "--mb", mb, "--state", state, "--interval-ms", "20",
		      extra1 ? "--children" : NULL, extra1, extra2 ? "--plain-children" : NULL, extra2,
		      (char *)NULL);
		_exit(127);
	}
	g_workloads[g_nworkloads++] = p;
	wait_for_file(state, 20000);
	return p;
}

static void set_fault(const char *var, const char *op, int pid)
{
	char v[64];
	if (pid)
		snprintf(v, sizeof(v), "%s:%d", op, pid);
	else
		snprintf(v, sizeof(v), "%s", op);
	setenv(var, v, 1);
}

/* How long the daemon waits for the restore thread to take, then to finish, each following call. */
static void call_timeout_ms(const char *ms)
{
	setenv("FAKEGPU_CALL_TIMEOUT_MS", ms, 1);
}

static void full_cycle(int pid, const char *state)
{
	long long before = wait_progress(state, iterations_ok(state), 10000);
	CUcheckpointLockArgs la;
	memset(&la, 0, sizeof(la));
	la.timeoutMs = 5000;
	EXPECT(p_lock(pid, &la), CUDA_SUCCESS);
	EXPECT(p_ckpt(pid, NULL), CUDA_SUCCESS);
	EXPECT_STATE(pid, CU_PROCESS_STATE_CHECKPOINTED);
	if (count_sockets(pid) || count_nodes(pid, NULL))
		die("checkpointed process %d still holds a socket or a device node", pid);
	EXPECT(p_restore(pid, NULL), CUDA_SUCCESS);
	EXPECT(p_unlock(pid, NULL), CUDA_SUCCESS);
	EXPECT_STATE(pid, CU_PROCESS_STATE_RUNNING);
	wait_progress(state, before + 3, 10000);
}

int main(int argc, char **argv)
{
	const char *lib = NULL, *oldlib = NULL, *daemon = NULL, *workload = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--keep")) {
			g_keep = 1;
			continue;
		}
		if (i + 1 >= argc)
			goto usage;
		if (!strcmp(argv[i], "--lib"))
			lib = argv[++i];
		else if (!strcmp(argv[i], "--old-lib"))
			oldlib = argv[++i];
		else if (!strcmp(argv[i], "--daemon"))
			daemon = argv[++i];
		else if (!strcmp(argv[i], "--workload"))
			workload = argv[++i];
		else
			goto usage;
	}
	if (!lib || !oldlib || !daemon || !workload) {
usage:
		fprintf(stderr, "usage: fakegpu_smoke --lib PATH --old-lib PATH --daemon PATH --workload PATH [--keep]\n");
		return 2;
	}
	char libdir[PATH_MAX], tmp[PATH_MAX];
	if (!realpath(lib, tmp))
		die("%s: %s", lib, strerror(errno));
	snprintf(libdir, sizeof(libdir), "%s", dirname(tmp));

	if (!mkdtemp(g_dir))
		die("mkdtemp: %s", strerror(errno));
	setenv("FAKEGPU_DIR", g_dir, 1);
	unsetenv("FAKEGPU_FAIL");
	unsetenv("FAKEGPU_HANG");
	unsetenv("FAKEGPU_CRASH_TARGET");
	unsetenv("FAKEGPU_CALL_TIMEOUT_MS");
	printf("fakegpu_smoke: directory %s\n", g_dir);

	/* daemon: 2 GPUs of 1 GiB */
	char pidfile[PATH_MAX], dlog[PATH_MAX];
	snprintf(pidfile, sizeof(pidfile), "%s/daemon.pid", g_dir);
	snprintf(dlog, sizeof(dlog), "%s/daemon.log", g_dir);
	g_daemon = fork();
	if (g_daemon == 0) {
		int fd = open(dlog, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execl(daemon, daemon, "--dir", g_dir, "--gpus", "2", "--gpu-mem", "1G", "--verbose", (char *)NULL);
		_exit(127);
	}
	wait_for_file(pidfile, 10000);

	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die("dlopen %s: %s", lib, dlerror());
	p_tid = (fn_getrestoretid)sym(h, "cuCheckpointProcessGetRestoreThreadId");
	p_state = (fn_getstate)sym(h, "cuCheckpointProcessGetState");
	p_lock = (fn_lock)sym(h, "cuCheckpointProcessLock");
	p_ckpt = (fn_checkpoint)sym(h, "cuCheckpointProcessCheckpoint");
	p_restore = (fn_restore)sym(h, "cuCheckpointProcessRestore");
	p_unlock = (fn_unlock)sym(h, "cuCheckpointProcessUnlock");
	fn_version p_version = (fn_version)sym(h, "cuDriverGetVersion");
	int ver = 0;
	EXPECT(p_version(&ver), CUDA_SUCCESS);
	if (ver != 13000)
		die("driver version %d, expected 13000", ver);

	/* not CUDA clients: this process (no cuInit yet), the daemon, no process */
	CUprocessState st;
	int tid;
	EXPECT(p_state(getpid(), &st), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_state(g_daemon, &st), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_state(0x3fffffff, &st), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_tid(g_daemon, &tid), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_lock(g_daemon, NULL), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_ckpt(g_daemon, NULL), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_restore(g_daemon, NULL), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_unlock(g_daemon, NULL), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_state(-1, &st), CUDA_ERROR_INVALID_VALUE);

	/* this process becomes a client too, to read UUIDs and memory use */
	CUdevice d0, d1;
	CUcontext c0, c1;
	CUuuid u0, u1;
	size_t fr, total;
	EXPECT(((fn_init)sym(h, "cuInit"))(0), CUDA_SUCCESS);
	fn_devget p_devget = (fn_devget)sym(h, "cuDeviceGet");
	fn_uuid p_uuid = (fn_uuid)sym(h, "cuDeviceGetUuid_v2");
	fn_retain p_retain = (fn_retain)sym(h, "cuDevicePrimaryCtxRetain");
	fn_setcur p_setcur = (fn_setcur)sym(h, "cuCtxSetCurrent");
	fn_meminfo p_meminfo = (fn_meminfo)sym(h, "cuMemGetInfo_v2");
	EXPECT(p_devget(&d0, 0), CUDA_SUCCESS);
	EXPECT(p_devget(&d1, 1), CUDA_SUCCESS);
	EXPECT(p_uuid(&u0, d0), CUDA_SUCCESS);
	EXPECT(p_uuid(&u1, d1), CUDA_SUCCESS);
	EXPECT(p_retain(&c0, d0), CUDA_SUCCESS);
	EXPECT(p_retain(&c1, d1), CUDA_SUCCESS);
	EXPECT_STATE(getpid(), CU_PROCESS_STATE_RUNNING);

	/* the workload: 96 MiB on GPU 0 */
	char state[PATH_MAX];
	snprintf(state, sizeof(state), "%s/memcheck.state", g_dir);
	int wpid = start_workload(workload, libdir, "96", state, NULL, NULL);
	printf("fakegpu_smoke: workload pid %d is ready\n", wpid);
	EXPECT(p_tid(wpid, &tid), CUDA_SUCCESS);
	{
		char path[96], comm[64] = "";
		snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", wpid, tid);
		FILE *f = fopen(path, "re");
		if (!f || !fgets(comm, sizeof(comm), f))
			die("restore thread %d of %d does not exist", tid, wpid);
		fclose(f);
		if (strcmp(comm, "cuda-restore\n"))
			die("restore thread %d is named %s", tid, comm);
		printf("fakegpu_smoke: restore thread tid %d\n", tid);
	}
	EXPECT_STATE(wpid, CU_PROCESS_STATE_RUNNING);
	if (count_sockets(wpid) != 1)
		die("running workload holds %d sockets, expected 1", count_sockets(wpid));
	if (count_nodes(wpid, "nvidiactl") != 1 || count_nodes(wpid, "nvidia0") != 1 || count_nodes(wpid, NULL) != 3)
		die("running workload does not hold nvidiactl, nvidia-uvm and nvidia0 (only)");
	EXPECT(p_setcur(c0), CUDA_SUCCESS);
	EXPECT(p_meminfo(&fr, &total), CUDA_SUCCESS);
	if (total != (1u << 30) || total - fr != (96u << 20))
		die("GPU 0: free %zu total %zu, expected 96 MiB used", fr, total);

	/* wrong states */
	EXPECT(p_ckpt(wpid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(p_restore(wpid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(p_unlock(wpid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CUcheckpointLockArgs la;
	memset(&la, 0, sizeof(la));
	la.reserved0 = 1;
	EXPECT(p_lock(wpid, &la), CUDA_ERROR_INVALID_VALUE);

	/* fault injection */
	set_fault("FAKEGPU_FAIL", "lock", wpid);
	EXPECT(p_lock(wpid, NULL), CUDA_ERROR_UNKNOWN);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_RUNNING);
	set_fault("FAKEGPU_FAIL", "lock", wpid + 1);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_RUNNING);
	setenv("FAKEGPU_FAIL", "unlock,getstate", 1);
	EXPECT(p_state(wpid, &st), CUDA_ERROR_UNKNOWN);
	EXPECT(p_unlock(wpid, NULL), CUDA_ERROR_UNKNOWN);
	setenv("FAKEGPU_FAIL", "getrestoretid", 1);
	EXPECT(p_tid(wpid, &tid), CUDA_ERROR_UNKNOWN);
	unsetenv("FAKEGPU_FAIL");
	set_fault("FAKEGPU_HANG", "getstate", wpid);
	setenv("FAKEGPU_HANG_MS", "300", 1);
	uint64_t t0 = fg_now_ms();
	EXPECT_STATE(wpid, CU_PROCESS_STATE_RUNNING);
	if (fg_now_ms() - t0 < 300)
		die("FAKEGPU_HANG did not delay getstate");
	unsetenv("FAKEGPU_HANG");
	unsetenv("FAKEGPU_HANG_MS");
	printf("fakegpu_smoke: fault injection ok\n");

	/* the cycle, with a remap of GPU 0 onto GPU 1 */
	long long before = wait_progress(state, iterations_ok(state), 10000);
	memset(&la, 0, sizeof(la));
	la.timeoutMs = 5000;
	EXPECT(p_lock(wpid, &la), CUDA_SUCCESS);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_LOCKED);
	EXPECT(p_lock(wpid, &la), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(p_restore(wpid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	long long locked_at = iterations_ok(state);
	fg_sleep_ms(300);
	if (iterations_ok(state) > locked_at + 1)
		die("the workload kept running while locked");
	EXPECT(p_ckpt(wpid, NULL), CUDA_SUCCESS);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_CHECKPOINTED);
	if (count_sockets(wpid))
		die("checkpointed workload still holds %d socket(s)", count_sockets(wpid));
	if (count_nodes(wpid, NULL))
		die("checkpointed workload still holds %d device node(s)", count_nodes(wpid, NULL));
	EXPECT(p_meminfo(&fr, &total), CUDA_SUCCESS);
	if (fr != total)
		die("GPU 0 still has %zu bytes in use after the checkpoint", total - fr);
	EXPECT(p_ckpt(wpid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(p_unlock(wpid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	EXPECT(p_tid(wpid, &tid), CUDA_SUCCESS);
	printf("fakegpu_smoke: checkpointed: no socket, no device node, device memory released\n");

	CUcheckpointGpuPair pairs[2];
	CUcheckpointRestoreArgs ra;
	memset(&ra, 0, sizeof(ra));
	memset(pairs, 0, sizeof(pairs));
	ra.gpuPairs = pairs;
	pairs[0].oldUuid = u1; /* GPU 0, the one used, is missing */
	pairs[0].newUuid = u0;
	ra.gpuPairsCount = 1;
	EXPECT(p_restore(wpid, &ra), CUDA_ERROR_INVALID_VALUE);
	pairs[0].oldUuid = u0;
	memset(pairs[0].newUuid.bytes, 0xab, 16); /* no such GPU */
	EXPECT(p_restore(wpid, &ra), CUDA_ERROR_INVALID_DEVICE);
	ra.gpuPairs = NULL;
	EXPECT(p_restore(wpid, &ra), CUDA_ERROR_INVALID_VALUE);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_CHECKPOINTED);
	ra.gpuPairs = pairs;
	pairs[0].oldUuid = u0;
	pairs[0].newUuid = u1;
	pairs[1].oldUuid = u1;
	pairs[1].newUuid = u0;
	ra.gpuPairsCount = 2;
	EXPECT(p_restore(wpid, &ra), CUDA_SUCCESS);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_LOCKED);
	if (count_sockets(wpid) != 1)
		die("restored workload holds %d sockets, expected 1", count_sockets(wpid));
	if (count_nodes(wpid, "nvidia1") != 1 || count_nodes(wpid, NULL) != 3)
		die("workload restored onto GPU 1 does not hold nvidiactl, nvidia-uvm and nvidia1 (only)");
	EXPECT(p_meminfo(&fr, &total), CUDA_SUCCESS);
	if (fr != total)
		die("GPU 0 in use after a restore onto GPU 1");
	EXPECT(p_setcur(c1), CUDA_SUCCESS);
	EXPECT(p_meminfo(&fr, &total), CUDA_SUCCESS);
	if (total - fr != (96u << 20))
		die("GPU 1: %zu bytes in use after the restore, expected 96 MiB", total - fr);
	fg_sleep_ms(100);
	if (iterations_ok(state) > locked_at + 1)
		die("the workload ran while locked after the restore");
	EXPECT(p_unlock(wpid, NULL), CUDA_SUCCESS);
	EXPECT_STATE(wpid, CU_PROCESS_STATE_RUNNING);
	long long after = wait_progress(state, before + 5, 10000);
	printf("fakegpu_smoke: cycle ok (iterations %lld before, %lld after, data verified)\n", before, after);

	/* like CRIU: lock, ptrace-stop all threads, let only the restore thread
	 * run for checkpoint and restore, then detach and unlock; repeated, so
	 * that API calls are caught in flight */
	call_timeout_ms("5000");
	for (int i = 0; i < 10; i++) {
		int tids[16], n, rtid;
		EXPECT(p_tid(wpid, &rtid), CUDA_SUCCESS);
		EXPECT(p_lock(wpid, NULL), CUDA_SUCCESS);
		EXPECT(p_state(wpid, &st), CUDA_SUCCESS);
		n = freeze(wpid, tids, 16);
		if (ptrace(PTRACE_CONT, rtid, 0, 0))
			die("ptrace cont %d: %s", rtid, strerror(errno));
		EXPECT(p_ckpt(wpid, NULL), CUDA_SUCCESS);
		thaw(tids, n, rtid);
		if (count_sockets(wpid) || count_nodes(wpid, NULL))
			die("checkpointed workload holds a socket or a device node");
		n = freeze(wpid, tids, 16);
		ptrace(PTRACE_CONT, rtid, 0, 0);
		EXPECT(p_restore(wpid, NULL), CUDA_SUCCESS);
		EXPECT(p_unlock(wpid, NULL), CUDA_SUCCESS);
		thaw(tids, n, rtid);
		fg_sleep_ms(7 * i);
	}
	after = wait_progress(state, after + 3, 10000);
	printf("fakegpu_smoke: 10 cycles under ptrace with only the restore thread running ok (iteration %lld)\n",
	       after);

	/* the restore thread is stopped: calls time out, nothing changes. Calls that must time out get
	 * 400 ms, those that must succeed 5 s (a loaded machine can take longer than 400 ms to copy). */
	stop_all(wpid);
	call_timeout_ms("400");
	t0 = fg_now_ms();
	EXPECT(p_lock(wpid, NULL), CUDA_ERROR_TIMEOUT);
	if (fg_now_ms() - t0 < 400)
		die("lock timed out too early");
	/* like the r580 driver: a state query is answered by the restore thread, which is stopped */
	EXPECT(p_state(wpid, &st), CUDA_ERROR_TIMEOUT);
	memset(&la, 0, sizeof(la));
	la.timeoutMs = 200;
	call_timeout_ms("5000"); /* the lock's own timeout must end it long before the call's */
	t0 = fg_now_ms();
	EXPECT(p_lock(wpid, &la), CUDA_ERROR_TIMEOUT);
	if (fg_now_ms() - t0 > 2500)
		die("lock did not honour timeoutMs");
	kill(wpid, SIGCONT);
	call_timeout_ms("5000");
	EXPECT_STATE(wpid, CU_PROCESS_STATE_RUNNING); /* the stale doorbells are ignored */
	EXPECT(p_lock(wpid, NULL), CUDA_SUCCESS);
	stop_all(wpid);
	call_timeout_ms("400");
	EXPECT(p_ckpt(wpid, NULL), CUDA_ERROR_TIMEOUT);
	kill(wpid, SIGCONT);
	call_timeout_ms("5000");
	EXPECT_STATE(wpid, CU_PROCESS_STATE_LOCKED);
	EXPECT(p_ckpt(wpid, NULL), CUDA_SUCCESS);
	stop_all(wpid);
	call_timeout_ms("400");
	EXPECT(p_restore(wpid, NULL), CUDA_ERROR_TIMEOUT);
	kill(wpid, SIGCONT);
	call_timeout_ms("5000");
	EXPECT_STATE(wpid, CU_PROCESS_STATE_CHECKPOINTED);
	EXPECT(p_restore(wpid, NULL), CUDA_SUCCESS);
	stop_all(wpid);
	call_timeout_ms("400");
	EXPECT(p_unlock(wpid, NULL), CUDA_ERROR_TIMEOUT);
	kill(wpid, SIGCONT);
	call_timeout_ms("5000");
	EXPECT(p_unlock(wpid, NULL), CUDA_SUCCESS);
	unsetenv("FAKEGPU_CALL_TIMEOUT_MS");
	after = wait_progress(state, after + 3, 10000);
	printf("fakegpu_smoke: stopped restore thread: timeouts ok, still verifying (iteration %lld)\n", after);

	/* a process tree: parent and child use CUDA, a plain child does not */
	char state2[PATH_MAX], state2c[PATH_MAX + 4];
	snprintf(state2, sizeof(state2), "%s/tree.state", g_dir);
	snprintf(state2c, sizeof(state2c), "%s.0", state2);
	int tpid = start_workload(workload, libdir, "8", state2, "1", "1");
	wait_for_file(state2c, 20000);
	int cpid = (int)state_value(state2c, "pid", NULL, 0);
	int plain = child_of(tpid, cpid);
	if (cpid <= 0 || !plain)
		die("cannot find the children of %d", tpid);
	EXPECT_STATE(tpid, CU_PROCESS_STATE_RUNNING);
	EXPECT_STATE(cpid, CU_PROCESS_STATE_RUNNING);
	EXPECT(p_state(plain, &st), CUDA_ERROR_NOT_INITIALIZED);
	full_cycle(cpid, state2c);
	full_cycle(tpid, state2);
	printf("fakegpu_smoke: process tree ok (parent %d, CUDA child %d, plain child %d)\n", tpid, cpid, plain);

	/* the restore thread kills its process when asked to checkpoint */
	EXPECT(p_lock(wpid, NULL), CUDA_SUCCESS);
	set_fault("FAKEGPU_CRASH_TARGET", "checkpoint", wpid);
	CUresult cr = p_ckpt(wpid, NULL);
	if (cr == CUDA_SUCCESS)
		die("checkpoint of a crashing target succeeded");
	unsetenv("FAKEGPU_CRASH_TARGET");
	int wst;
	waitpid(wpid, &wst, 0);
	g_workloads[0] = -1;
	if (!WIFSIGNALED(wst) || WTERMSIG(wst) != SIGKILL)
		die("the crashing workload did not die of SIGKILL");
	EXPECT(p_state(wpid, &st), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT(p_setcur(c1), CUDA_SUCCESS);
	for (int i = 0;; i++) { /* the daemon notices the death asynchronously */
		EXPECT(p_meminfo(&fr, &total), CUDA_SUCCESS);
		if (fr == total)
			break;
		if (i == 100)
			die("GPU 1 still has %zu bytes in use after the crash", total - fr);
		fg_sleep_ms(20);
	}
	printf("fakegpu_smoke: crash of the target: checkpoint returned %d, memory released\n", (int)cr);

	/* the driver without the checkpoint API */
	pid_t op = fork();
	if (op == 0) {
		void *o = dlopen(oldlib, RTLD_NOW | RTLD_LOCAL);
		if (!o)
			_exit(10);
		if (dlsym(o, "cuCheckpointProcessLock") || dlsym(o, "cuCheckpointProcessGetRestoreThreadId"))
			_exit(11);
		int v = 0;
		fn_version ov = (fn_version)dlsym(o, "cuDriverGetVersion");
		if (!ov || ov(&v) || v != 12040)
			_exit(12);
		_exit(0);
	}
	int ost;
	waitpid(op, &ost, 0);
	if (!WIFEXITED(ost) || WEXITSTATUS(ost))
		die("old library check failed (%d)", WIFEXITED(ost) ? WEXITSTATUS(ost) : -1);
	g_checks++;
	printf("fakegpu_smoke: old library: no checkpoint API, driver 12040\n");

	cleanup();
	g_daemon = -1;
	printf("fakegpu_smoke: PASS (%d checks)\n", g_checks);
	return 0;
}
