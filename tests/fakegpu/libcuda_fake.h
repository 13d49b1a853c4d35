/*
 * What the four files of the fake libcuda.so.1 share (see libcuda_fake.c): the process's state as a CUDA
 * client, defined in libcuda_fake.c, and the helpers each file calls in another. All of it is hidden (the
 * library is built with hidden visibility and cuda.h's entry points pushed to default): the exported
 * symbols are the cu* functions only.
 */
#ifndef FAKEGPU_LIBCUDA_FAKE_H
#define FAKEGPU_LIBCUDA_FAKE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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

#pragma GCC visibility push(hidden)

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

/* The driver's device mappings (see map_device in libcuda_fake.c). */
#define FG_MAP_RW_BYTES (2 * 4096)
#define FG_MAP_RO_BYTES 4096

/* The client's connection and identity, and the GPUs it sees. */
extern char g_dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
extern uint64_t g_id;
extern int g_main_fd, g_fifo_fd;
extern struct fg_devices g_devs;
extern uint32_t g_devmap[FG_MAX_GPUS]; /* device ordinal -> daemon GPU */
extern uint32_t g_ndev;                 /* devices this process sees (FAKEGPU_VISIBLE) */
extern struct CUctx_st g_primary[FG_MAX_GPUS];
extern pthread_mutex_t g_rpc_lock, g_node_lock;
extern uint32_t g_gpu_mask; /* daemon GPUs this process has a context on */
extern _Thread_local CUcontext tls_ctx;
extern size_t g_managed_bytes; /* held by cuMemAllocManaged; never freed */

/* The API gate: lock/unlock of the checkpoint API. */
extern pthread_mutex_t g_gate_lock;
extern pthread_cond_t g_gate_cond;
extern int g_locked, g_inflight;

extern int g_map_fd;
extern void *g_map_rw, *g_map_ro;

#ifndef FAKEGPU_NO_CHECKPOINT_API
/* The restore thread and the host copies of device memory it holds while checkpointed. */
extern int g_svc_tid;
extern int g_svc_go; /* 0 wait, 1 run, -1 exit */
extern struct host_copy *g_copies;
extern size_t g_ncopies, g_copies_bytes;
extern int g_record_maps, g_keep_copies;
void *svc_main(void *arg);
#endif

__attribute__((format(printf, 1, 2))) void fg_err(const char *fmt, ...);
/* An unsigned number from the environment variable var, def when unset or empty. */
uint64_t env_u64(const char *var, uint64_t def);
void open_gpu_node(uint32_t gpu);
void close_nodes(void);
int open_nodes(void);
CUresult api_enter(void);
void api_leave(void);
CUresult rpc(uint32_t op, uint64_t a0, uint64_t a1, uint64_t a2, const void *in, uint64_t inlen, void *out,
	     uint64_t outlen, struct fg_msg *rep);

#pragma GCC visibility pop

#endif
