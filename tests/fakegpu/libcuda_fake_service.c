/*
 * The fake libcuda.so.1's restore thread (see libcuda_fake.c and fakegpu.h): it serves the checkpoint
 * calls another process makes, saving device memory to host copies and back. Not in the library
 * without the checkpoint API.
 */
#include "libcuda_fake.h"

#ifndef FAKEGPU_NO_CHECKPOINT_API
/* ======================================================================
 * The restore thread. It runs while every other thread of the process may
 * be ptrace-stopped anywhere, so it uses no malloc and no stdio: only
 * system calls, mmap and the gate mutex (never held across a stop point by
 * the application: a locked process has no API call in flight).
 * ====================================================================== */

static int svc_call(int fd, uint32_t op, int32_t status, uint64_t a0, uint64_t a1, uint64_t a2, const void *in,
		    uint64_t inlen, struct fg_msg *rep)
{
	uint64_t a[3] = { a0, a1, a2 };
	if (fg_send(fd, op, status, a, 3, in, inlen) || fg_recv(fd, rep))
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

/* A process restored from an image may have been frozen by the dump with one of its threads inside the
 * gate's lock (entering the gate, a few instructions): that thread stays stopped until the restore is done,
 * so the unlock, part of the restore, must not wait for the lock. The gate re-checks every 20 ms. */
static void svc_unlock(void)
{
	__atomic_store_n(&g_locked, 0, __ATOMIC_RELEASE);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 100000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	if (pthread_mutex_timedlock(&g_gate_lock, &ts) == 0) {
		pthread_cond_broadcast(&g_gate_cond);
		pthread_mutex_unlock(&g_gate_lock);
	} else {
		pthread_cond_broadcast(&g_gate_cond);
	}
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
	if (svc_call(sfd, FG_SVC_LIST, 0, 0, 0, 0, NULL, 0, &m) || m.status)
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
		/* MAP_POPULATE, as the real driver maps its buffer (os/checkpoint_buffer.h). */
		void *data = mmap(NULL, bufs[i].size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
				  -1, 0);
		if (data == MAP_FAILED) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
		copies[i].dptr = bufs[i].dptr;
		copies[i].size = bufs[i].size;
		copies[i].gpu = bufs[i].gpu;
		copies[i].data = data;
		g_ncopies = i + 1;
		if (svc_call(sfd, FG_SVC_PULL, 0, bufs[i].dptr, 0, 0, NULL, 0, &m) || m.status ||
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

/* FAKEGPU_RESTORE_BACKWARDS: the host copy read a page at a time from its end to its start. */
static void read_backwards(const struct host_copy *c)
{
	if (!env_u64("FAKEGPU_RESTORE_BACKWARDS", 0))
		return;
	const volatile char *data = c->data;
	for (uint64_t off = c->size & ~(uint64_t)4095; off > 0; off -= 4096)
		(void)data[off - 4096];
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
		read_backwards(c);
		if (svc_call(sfd, FG_SVC_PUSH, 0, c->dptr, gpu, 0, c->data, c->size, &m))
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

/* The job of a doorbell: taken, stale, or (a FIFO shared by replicas, fakegpu.h) another process's, put
 * back into the FIFO for the others. A replica's first job makes the daemon's clone its own client. */
static void svc_job(const struct fg_doorbell *db)
{
	struct fg_msg m;
	uint32_t map[FG_MAX_GPUS];
	int sfd = fg_connect(g_dir);
	if (sfd < 0) {
		fg_err("restore thread: cannot connect to the daemon: %s", strerror(errno));
		return;
	}
	int hello = svc_call(sfd, FG_SVC_HELLO, 0, db->id, db->seq, fg_proc_key(0), NULL, 0, &m);
	if (!hello && m.status == FG_NOT_YOURS) {
		close(sfd);
		if (write(g_fifo_fd, db, sizeof(*db)) != (ssize_t)sizeof(*db))
			fg_err("restore thread: cannot put back a doorbell for client %llu", (unsigned long long)db->id);
		fg_sleep_ms(2);
		return;
	}
	if (hello || m.status == FG_CANCELLED || m.status != CUDA_SUCCESS || m.len != sizeof(map) ||
	    fg_read_full(sfd, map, sizeof(map))) {
		close(sfd);
		return;
	}
	g_id = db->id;
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
	svc_call(sfd, FG_SVC_DONE, (int32_t)r, 0, 0, 0, NULL, 0, &m);
	close(sfd);
}

void *svc_main(void *arg)
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
		if (n != (ssize_t)sizeof(db))
			continue;
		svc_job(&db);
	}
	return NULL;
}

#endif /* !FAKEGPU_NO_CHECKPOINT_API */
