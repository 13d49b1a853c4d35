/*
 * fakegpu: a GPU-less stand-in for libcuda.so.1, used to test checkpoint and
 * restore of CUDA processes with CRIU on machines without an NVIDIA GPU.
 *
 * Three pieces share this header:
 *
 *   fakegpu-daemon   plays the GPUs: it owns the device memory of every
 *                    client and the checkpoint state of every client.
 *   libcuda.so.1     (libcuda_fake.c) the driver library. It has two halves:
 *                    the client half (cuInit, cuMemAlloc, ...) used by a CUDA
 *                    application, and the checkpoint half
 *                    (cuCheckpointProcess*) used by another process, e.g. the
 *                    CRIU plugin, with the pid of the application.
 *   the service thread   started by cuInit inside the application and named
 *                    "cuda-restore"; the checkpoint half's
 *                    cuCheckpointProcessGetRestoreThreadId() returns its tid.
 *
 * All of them find each other through the directory named by the environment
 * variable FAKEGPU_DIR (same value for the application, the daemon's --dir and
 * the checkpointing process):
 *
 *   $FAKEGPU_DIR/daemon.sock      the daemon's listening unix socket
 *   $FAKEGPU_DIR/daemon.pid       the daemon's pid
 *   $FAKEGPU_DIR/clients/<id>     one FIFO per client, created by the daemon
 *   $FAKEGPU_DIR/dev/nvidiactl, dev/nvidia-uvm, dev/nvidia<N>
 *                                 the device nodes: nvidiactl and nvidia<N>
 *                                 character devices 195:255 and 195:N
 *                                 (regular files when the daemon may not
 *                                 mknod), held O_PATH so that no driver is
 *                                 needed; nvidia-uvm a regular file. A
 *                                 client holds nvidiactl and
 *                                 nvidia-uvm open from cuInit on, and
 *                                 nvidia<N> once it has a context on GPU N
 *                                 (daemon index = device ordinal of a fresh
 *                                 process); all are closed at checkpoint and
 *                                 reopened (remapped) at restore, like the
 *                                 real driver's /dev/nvidia* fds.
 *
 * Client identity and pid resolution
 * ----------------------------------
 * cuInit connects to the daemon (the "main" connection) and registers; the
 * daemon assigns a numeric client id and creates the FIFO clients/<id>. The
 * client opens that FIFO O_RDWR and keeps it open for its whole life: it is the
 * analogue of the /dev/nvidia* fds a real CUDA process holds, and it is the
 * client's identity. The checkpoint half resolves a pid by scanning
 * /proc/<pid>/fd/ for a link that points to "<realpath FAKEGPU_DIR>/clients/<id>".
 * CRIU dumps and restores the FIFO fd with its path, so the same id is found
 * again after a restore, even when the restored process got another pid (a new
 * pid namespace). A pid without such an fd (not a CUDA client, or gone) is
 * answered with CUDA_ERROR_NOT_INITIALIZED without talking to the daemon, as
 * r580 answers for a process without CUDA state.
 * The restore thread's tid, as seen by the caller, is found by scanning
 * /proc/<pid>/task/<tid>/status for the task whose innermost NSpid equals the
 * tid the service thread registered (then, as a fallback, by the thread name
 * "cuda-restore").
 *
 * How requests reach the service thread
 * -------------------------------------
 * The same FIFO is the service thread's doorbell. The service thread blocks in
 * read() on it; the daemon writes one struct fg_doorbell per request. A FIFO was
 * chosen because:
 *   - it needs no signal (the CRIU plugin blocks every signal of the restore
 *     thread) and no polling;
 *   - CRIU dumps and restores FIFOs by path, including unread data, so the
 *     doorbell keeps working after the main connection was closed at
 *     checkpoint time and after a restore in another process;
 *   - while the service thread is ptrace-stopped nobody reads the doorbell, so
 *     a request simply does not complete (like the real driver); the daemon
 *     gives up after the caller's FAKEGPU_CALL_TIMEOUT_MS.
 * After reading a doorbell the service thread opens a fresh "service"
 * connection to the daemon and sends FG_SVC_HELLO with the doorbell's sequence
 * number; the daemon answers with the job, or with FG_CANCELLED if the request
 * has timed out meanwhile (a stale doorbell), which the thread ignores. The
 * service connection is always closed again when the job is done, so between
 * requests a checkpointed process holds no socket at all.
 *
 * Replicas: one image restored more than once at the same time (each in its
 * own pid namespace) gives live processes that all hold the same FIFO. A
 * process is told apart by its key, the same from every pid namespace:
 * (inode of its pid namespace << 22) | its pid there (fg_proc_key; a
 * thread's key is its process's). The checkpoint half passes the key of the
 * pid it was asked about with every query and action (and that pid, in the
 * request's status field); when another live process holds the client
 * already, the daemon clones it for this key (a client of its own,
 * checkpointed, with the same buffers to be pushed back, its doorbell still
 * the original's FIFO). A doorbell read from
 * that FIFO names the client it is for; a service thread gives its own key in
 * FG_SVC_HELLO, and the daemon answers FG_NOT_YOURS where the client is held
 * by another process (the thread puts the doorbell back for the others), or
 * hands the job over, and the thread then takes the clone's id as its own.
 *
 * Jobs:
 *   lock        set the in-process API gate, wait (up to the lock timeout) for
 *               API calls in flight to finish;
 *   checkpoint  pull every device buffer into fresh anonymous mmap memory of
 *               the process, detach and close the main connection, then tell
 *               the daemon, which frees the device memory;
 *   restore     open a new main connection (FG_REATTACH), push every buffer
 *               back (onto the remapped GPU when GPU pairs were given), unmap
 *               the host copies;
 *   unlock      open the API gate;
 *   ping        nothing: cuCheckpointProcessGetState rings it first, because
 *               the real driver answers a state query through the restore
 *               thread (measured on r580: with that thread ptrace-stopped,
 *               GetState and Unlock block, GetRestoreThreadId answers).
 *
 * Wire format: every message is a struct fg_msg followed by msg.len payload
 * bytes, over SOCK_STREAM unix sockets, host byte order.
 */
#ifndef FAKEGPU_H
#define FAKEGPU_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define FG_MAGIC 0x46414b45u /* "FAKE" */
#define FG_MAX_GPUS 16
#define FG_NAME_LEN 64
#define FG_THREAD_NAME "cuda-restore"
#define FG_SOCK_NAME "daemon.sock"
#define FG_PID_NAME "daemon.pid"
#define FG_CLIENTS_DIR "clients"

/* Device pointers: ((gpu + 1) << FG_PTR_GPU_SHIFT) + offset at allocation
 * time. After a restore onto another GPU the value stays the same; it is an
 * opaque key for the daemon, only unique per client. */
#define FG_PTR_GPU_SHIFT 40
#define FG_PTR_ALIGN (2u << 20)

/* Message operations. */
enum fg_op {
	/* main connection of a client */
	FG_HELLO = 1,   /* a0=pid a1=service tid -> a0=client id, payload devices */
	FG_REATTACH,    /* a0=id a1=pid a2=tid -> payload devices */
	FG_DETACH,      /* orderly close before checkpoint */
	FG_USE_GPU,     /* a0=gpu: a context was created on it */
	FG_ALLOC,       /* a0=gpu a1=size -> a0=dptr */
	FG_FREE,        /* a0=dptr */
	FG_HTOD,        /* a0=dptr, payload=data */
	FG_DTOH,        /* a0=dptr a1=size -> payload=data */
	FG_MEMSET,      /* a0=dptr a1=byte a2=size */
	FG_MEMINFO,     /* a0=gpu -> a0=free a1=total */
	/* service connection */
	FG_SVC_HELLO = 32, /* a0=id a1=seq a2=key -> a0=job op a1=lock timeout ms a2=crash, payload gpu map */
	FG_SVC_LIST,       /* -> payload fg_buf[] */
	FG_SVC_PULL,       /* a0=dptr -> payload data */
	FG_SVC_PUSH,       /* a0=dptr a1=gpu, payload data */
	FG_SVC_DONE,       /* status=result */
	/* checkpoint side */
	FG_CK_QUERY = 64,  /* a0=id a1=key, status=pid -> a0=state a1=tid a2=pid (namespace of the client) */
	FG_CK_ACTION,      /* a0=id a1=action a2=call timeout ms a3=lock timeout ms a4=crash a5=key, status=pid,
	                      payload pairs */
	/* the fake NVML */
	FG_USAGE = 96,     /* -> a0=count, payload fg_usage[]: device memory per live client */
};

struct fg_usage {
	int64_t pid; /* as the client sees it */
	uint64_t bytes;
};

/* Actions of FG_CK_ACTION / jobs of the service thread. */
enum fg_action {
	FG_ACT_LOCK = 1,
	FG_ACT_CHECKPOINT,
	FG_ACT_RESTORE,
	FG_ACT_UNLOCK,
	FG_ACT_PING, /* GetState: the real driver asks the restore thread, which must be running */
};

/* Special statuses of the FG_SVC_HELLO reply: the doorbell is stale; it is another process's (a replica's). */
#define FG_CANCELLED (-1)
#define FG_NOT_YOURS (-2)

/* Is the process gone (or a zombie)? pid: as this process sees it. */
static inline int fg_pid_gone(int pid)
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

/* A process's key (see Replicas above): 0 when /proc cannot tell. pid: as this process sees it, or 0 for
 * itself. */
static inline uint64_t fg_proc_key(int pid)
{
	char path[64], link[64], line[256];
	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/ns/pid", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/ns/pid");
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return 0;
	link[n] = 0;
	const char *b = strchr(link, '[');
	if (!b)
		return 0;
	uint64_t ns = strtoull(b + 1, NULL, 10), inner = 0;
	if (!pid)
		return (ns << 22) | (uint64_t)getpid();
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "NStgid:", 7)) { /* the process's, also where pid is one of its threads */
			const char *last = strrchr(line, '\t');
			inner = strtoull(last ? last + 1 : line + 7, NULL, 10);
		}
	fclose(f);
	return inner ? (ns << 22) | inner : 0;
}

struct fg_msg {
	uint32_t magic;
	uint32_t op;
	int32_t status; /* CUresult in replies */
	uint32_t pad;
	uint64_t a[6];
	uint64_t len; /* payload bytes that follow */
};

struct fg_doorbell {
	uint64_t id;
	uint64_t seq;
};

struct fg_device {
	char name[FG_NAME_LEN];
	unsigned char uuid[16];
	uint64_t total_mem;
	char pci_bus_id[32];
};

struct fg_devices {
	uint32_t count;
	uint32_t pad;
	struct fg_device dev[FG_MAX_GPUS];
};

struct fg_buf {
	uint64_t dptr;
	uint64_t size;
	uint32_t gpu;
	uint32_t pad;
};

struct fg_pair {
	unsigned char old_uuid[16];
	unsigned char new_uuid[16];
};

/* ---- small helpers shared by the daemon and the library ---- */

/* Writes "fakegpu: <who><message>\n" to stderr in one write(2), no stdio lock: the library's restore
 * thread may call it while the process's other threads are stopped anywhere. */
static inline void fg_vlog(const char *who, const char *fmt, va_list ap)
{
	char buf[512], line[600];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	int n = snprintf(line, sizeof(line), "fakegpu: %s%s\n", who, buf);
	if (n > 0) {
		ssize_t w = write(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
		(void)w;
	}
}

static inline uint64_t fg_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Sleeps ms milliseconds, through signals. */
static inline void fg_sleep_ms(uint64_t ms)
{
	struct timespec ts = { .tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000 };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static inline int fg_write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Returns 0, or -1 on error or EOF (errno 0 on a clean EOF at the start). */
static inline int fg_read_full(int fd, void *buf, size_t len)
{
	char *p = buf;
	size_t want = len;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0) {
			errno = (len == want) ? 0 : EPIPE;
			return -1;
		}
		if (n < 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static inline int fg_send(int fd, uint32_t op, int32_t status, const uint64_t *a, int na,
			  const void *payload, uint64_t len)
{
	struct fg_msg m;
	memset(&m, 0, sizeof(m));
	m.magic = FG_MAGIC;
	m.op = op;
	m.status = status;
	for (int i = 0; i < na && i < 6; i++)
		m.a[i] = a[i];
	m.len = len;
	if (fg_write_full(fd, &m, sizeof(m)))
		return -1;
	if (len && fg_write_full(fd, payload, (size_t)len))
		return -1;
	return 0;
}

static inline int fg_recv(int fd, struct fg_msg *m)
{
	if (fg_read_full(fd, m, sizeof(*m)))
		return -1;
	if (m->magic != FG_MAGIC) {
		errno = EPROTO;
		return -1;
	}
	return 0;
}

/* Connects to $dir/daemon.sock. Returns the fd (O_CLOEXEC) or -1. */
static inline int fg_connect(const char *dir)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	size_t dl = strlen(dir);
	if (dl + 1 + sizeof(FG_SOCK_NAME) > sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(sa.sun_path, dir, dl);
	sa.sun_path[dl] = '/';
	memcpy(sa.sun_path + dl + 1, FG_SOCK_NAME, sizeof(FG_SOCK_NAME));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

#endif /* FAKEGPU_H */
