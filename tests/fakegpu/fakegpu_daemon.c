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
#include "fakegpu_daemon.h"

const char *g_dir;
int g_verbose;
int g_pairs_of_all; /* --pairs-of all */
struct fg_devices g_devs;
uint64_t g_gpu_used[FG_MAX_GPUS];
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_cond;
static struct client *g_clients;
static uint64_t g_next_id = 1;
uint64_t g_next_seq = 1;
static volatile sig_atomic_t g_stop;

__attribute__((format(printf, 1, 2))) void logmsg(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fg_vlog("daemon: ", fmt, ap);
	va_end(ap);
}

const char *action_name(int a)
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

int reply(struct conn *c, int32_t status, uint64_t a0, uint64_t a1, uint64_t a2, const void *payload,
	  uint64_t len)
{
	uint64_t a[3] = { a0, a1, a2 };
	return fg_send(c->fd, 0, status, a, 3, payload, len);
}

/* Reads and drops len payload bytes. */
int drain(int fd, uint64_t len)
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

struct client *find_client(uint64_t id)
{
	for (struct client *cl = g_clients; cl; cl = cl->next)
		if (cl->id == id)
			return cl;
	return NULL;
}

void client_path(char *buf, size_t len, uint64_t id)
{
	snprintf(buf, len, "%s/" FG_CLIENTS_DIR "/%llu", g_dir, (unsigned long long)id);
}

void doorbell_path(char *buf, size_t len, const struct client *cl)
{
	client_path(buf, len, cl->origin ? cl->origin : cl->id);
}

struct client *client_of(uint64_t id, uint64_t key, int pid)
{
	struct client *cl = find_client(id);
	if (!cl || !key)
		return cl;
	for (struct client *r = g_clients; r; r = r->next)
		if (r->origin == id && r->holder == key)
			return r;
	if (!cl->holder || cl->holder == key || fg_pid_gone(cl->holder_pid)) {
		cl->holder = key;
		cl->holder_pid = pid;
		return cl;
	}
	/* Another live process holds this client: pid is a replica, restored from the same image. */
	struct client *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	pthread_mutex_init(&r->mem_lock, NULL);
	r->id = g_next_id++;
	r->origin = id;
	r->holder = key;
	r->holder_pid = pid;
	r->pid = cl->pid;
	r->tid = cl->tid;
	r->state = CU_PROCESS_STATE_CHECKPOINTED;
	r->used_mask = cl->used_mask;
	memcpy(r->ckpt_bytes, cl->ckpt_bytes, sizeof(r->ckpt_bytes));
	memcpy(r->next_off, cl->next_off, sizeof(r->next_off));
	r->next = g_clients;
	g_clients = r;
	cl->cloned = 1;
	dbg("client %llu: pid %d holds it too (a replica): client %llu made for it", (unsigned long long)id, pid,
	    (unsigned long long)r->id);
	return r;
}

/* ---- device memory ---- */

/* Called with cl->mem_lock held. */
struct alloc *find_range(struct client *cl, uint64_t ptr, uint64_t len)
{
	for (struct alloc *a = cl->allocs; a; a = a->next)
		if (ptr >= a->dptr && ptr < a->dptr + a->size && len <= a->dptr + a->size - ptr)
			return a;
	return NULL;
}

/* Called with cl->mem_lock held. */
CUresult alloc_mem(struct client *cl, uint32_t gpu, uint64_t size, uint64_t dptr,
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
void free_all(struct client *cl, uint64_t *per_gpu)
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

void client_died(struct client *cl)
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
