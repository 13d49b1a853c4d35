/*
 * What the two files of fakegpu-daemon share: the clients, their memory and their jobs
 * (fakegpu_daemon.c: the client table, the client connections, main; fakegpu_daemon_jobs.c: the
 * restore threads' connections and the checkpoint calls that become their jobs).
 */
#ifndef FAKEGPU_DAEMON_H
#define FAKEGPU_DAEMON_H

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
	/* replicas (fakegpu.h): the key of the process holding this client (0 while unknown) and its pid as
	 * the checkpointing side saw it; the client a replica was cloned from (its FIFO is the doorbell), 0
	 * for an original; whether clones of this client exist (doorbells of its FIFO are then checked) */
	uint64_t holder;
	int holder_pid;
	uint64_t origin;
	int cloned;
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

extern const char *g_dir;
extern int g_verbose;
extern int g_pairs_of_all; /* --pairs-of all */
extern struct fg_devices g_devs;
extern uint64_t g_gpu_used[FG_MAX_GPUS];
extern pthread_mutex_t g_lock; /* the client table, the per-GPU accounting and the jobs */
extern pthread_cond_t g_cond;
extern uint64_t g_next_seq;

__attribute__((format(printf, 1, 2))) void logmsg(const char *fmt, ...);
#define dbg(...)                          \
	do {                              \
		if (g_verbose)            \
			logmsg(__VA_ARGS__); \
	} while (0)

const char *action_name(int a);
int reply(struct conn *c, int32_t status, uint64_t a0, uint64_t a1, uint64_t a2, const void *payload,
	  uint64_t len);
int drain(int fd, uint64_t len);
struct client *find_client(uint64_t id);
/* The client of the process with key (pid: the checkpointing side's view of it), found by the FIFO's id:
 * a replica's clone made where another live process holds that client. Called with g_lock held. */
struct client *client_of(uint64_t id, uint64_t key, int pid);
/* The FIFO that rings a client's restore thread. */
void doorbell_path(char *buf, size_t len, const struct client *cl);
struct alloc *find_range(struct client *cl, uint64_t ptr, uint64_t len);
void client_path(char *buf, size_t len, uint64_t id);
CUresult alloc_mem(struct client *cl, uint32_t gpu, uint64_t size, uint64_t dptr, struct alloc **out);
void free_all(struct client *cl, uint64_t *per_gpu);
void client_died(struct client *cl);

/* fakegpu_daemon_jobs.c */
int handle_svc_hello(struct conn *c, struct fg_msg *m);
int handle_svc_op(struct conn *c, struct fg_msg *m);
void svc_closed(struct conn *c);
int handle_ck_action(struct conn *c, struct fg_msg *m);
int handle_ck_query(struct conn *c, struct fg_msg *m);

#endif
