/*
 * The fake libcuda.so.1's checkpoint half, cuCheckpointProcess*: called by another process (CRIU's
 * plugin, cuda-criu) with the target's pid, answered by the target's restore thread through the daemon
 * (see fakegpu.h), with the fault injection of the FAKEGPU_* variables (see libcuda_fake.c).
 */
#include "libcuda_fake.h"

#ifndef FAKEGPU_NO_CHECKPOINT_API
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
		return CUDA_ERROR_NOT_INITIALIZED;
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

static CUresult ck_query(int pid, uint64_t id, struct fg_msg *rep)
{
	const char *dir;
	int fd = ck_connect(&dir);
	if (fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	uint64_t a[2] = { id, fg_proc_key(pid) };
	int rc = fg_send(fd, FG_CK_QUERY, pid, a, 2, NULL, 0) || fg_recv(fd, rep);
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
	uint64_t a[6] = { id, (uint64_t)action, call_timeout, lock_timeout,
			  (uint64_t)env_matches("FAKEGPU_CRASH_TARGET", op, pid), fg_proc_key(pid) };
	if (fg_send(fd, FG_CK_ACTION, pid, a, 6, pairs, npairs * sizeof(*pairs))) {
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
		if (fg_pid_gone(pid)) {
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
		r = ck_query(pid, id, rep);
	return r;
}

CUresult CUDAAPI cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	struct fg_msg m;
	CUresult r = tid ? ck_lookup(OP_GETRESTORETID, pid, 0, &m) : CUDA_ERROR_INVALID_VALUE;
	int t = r == CUDA_SUCCESS ? find_task(pid, (int)m.a[1]) : 0;
	if (r == CUDA_SUCCESS && !t)
		r = CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS)
		*tid = t;
	return r;
}

CUresult CUDAAPI cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	struct fg_msg m;
	CUresult r = state ? ck_lookup(OP_GETSTATE, pid, 1, &m) : CUDA_ERROR_INVALID_VALUE;
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
