/*
 * A fake libnvidia-ml.so.1 (NVML) with the few functions the plugin and cuda-criu use. What it reports
 * comes from the environment of the process that loads it, except the device memory each process uses,
 * which the fake GPU daemon of $FAKEGPU_DIR tells (as the real NVML asks the kernel driver).
 *
 *   FAKENVML_FREE=BYTES        every GPU has this much free memory (unset: the query is not supported)
 *   FAKENVML_TOTAL=BYTES       instead: every GPU has this much memory, of which what the daemon's
 *                              processes use (their device memory, as below) is not free
 *   FAKENVML_PERSISTENCE=0|1   every GPU's persistence mode (unset: not supported)
 *   FAKENVML_PROCESSES=none    no memory per process (not supported), as a driver that does not tell what
 *                              the processes it is restoring hold so far
 *
 * It shows one device, which stands for every GPU of the daemon. Like the real NVML, nvmlInit_v2 opens
 * the device nodes ($FAKEGPU_DIR/dev/nvidiactl and nvidia0, held O_PATH when they are device nodes) and
 * holds them until nvmlShutdown: a process using NVML alone holds NVIDIA device files, no CUDA state.
 *
 * Built into tests/fakegpu/nvml/; a test puts that directory in LD_LIBRARY_PATH to use it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakegpu.h"

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_UNKNOWN 999
#define EXPORT __attribute__((visibility("default")))

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

static int g_device; /* every GPU is this one: the values do not depend on the GPU */

static int g_node_fds[2] = { -1, -1 };

EXPORT int nvmlInit_v2(void)
{
	const char *dir = getenv("FAKEGPU_DIR");
	const char *names[2] = { "nvidiactl", "nvidia0" };
	for (int i = 0; i < 2 && dir; i++) {
		char path[PATH_MAX];
		struct stat st;
		snprintf(path, sizeof(path), "%s/dev/%s", dir, names[i]);
		if (g_node_fds[i] < 0 && stat(path, &st) == 0)
			g_node_fds[i] = open(path, (S_ISCHR(st.st_mode) ? O_PATH : O_RDONLY) | O_CLOEXEC);
	}
	return NVML_SUCCESS;
}

EXPORT int nvmlShutdown(void)
{
	for (int i = 0; i < 2; i++) {
		if (g_node_fds[i] >= 0)
			close(g_node_fds[i]);
		g_node_fds[i] = -1;
	}
	return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, void **device)
{
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &g_device;
	return NVML_SUCCESS;
}

/* The start of a query whose answer the environment variable var plays: an invalid argument without
 * device or out, not supported while var is unset; *value is var's value. */
static int env_query(const char *var, const void *device, const void *out, const char **value)
{
	if (!device || !out)
		return NVML_ERROR_INVALID_ARGUMENT;
	*value = getenv(var);
	return *value ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* The device memory of each process of the daemon: n entries into u (at most max); -1 on failure. */
static int daemon_usage(struct fg_usage *u, unsigned max)
{
	const char *dir = getenv("FAKEGPU_DIR");
	if (!dir)
		return -1;
	int fd = fg_connect(dir);
	if (fd < 0)
		return -1;
	struct fg_msg m;
	int bad = fg_send(fd, FG_USAGE, 0, NULL, 0, NULL, 0) || fg_recv(fd, &m) || m.a[0] > max ||
		  m.len != m.a[0] * sizeof(u[0]) || (m.len && fg_read_full(fd, u, m.len));
	close(fd);
	return bad ? -1 : (int)m.a[0];
}

EXPORT int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory)
{
	const char *total = getenv("FAKENVML_TOTAL");
	if (total && device && memory) {
		struct fg_usage u[256];
		int n = daemon_usage(u, 256);
		if (n < 0)
			return NVML_ERROR_UNKNOWN;
		memory->total = strtoull(total, NULL, 0);
		memory->used = 0;
		for (int i = 0; i < n; i++)
			memory->used += u[i].bytes;
		memory->free = memory->used < memory->total ? memory->total - memory->used : 0;
		return NVML_SUCCESS;
	}
	const char *free_bytes;
	int r = env_query("FAKENVML_FREE", device, memory, &free_bytes);
	if (r != NVML_SUCCESS)
		return r;
	memory->free = strtoull(free_bytes, NULL, 0);
	memory->total = memory->free;
	memory->used = 0;
	return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetPersistenceMode(void *device, int *mode)
{
	const char *p;
	int r = env_query("FAKENVML_PERSISTENCE", device, mode, &p);
	if (r != NVML_SUCCESS)
		return r;
	*mode = atoi(p) == 1;
	return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetCount_v2(unsigned *count)
{
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = 1;
	return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device)
{
	if (index != 0 || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &g_device;
	return NVML_SUCCESS;
}

typedef struct {
	unsigned pid;
	unsigned long long usedGpuMemory;
	unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;


/* Device memory per process, from the daemon. */
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned *count, nvmlProcessInfo_t *infos)
{
	if (!device || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	const char *processes = getenv("FAKENVML_PROCESSES");
	if (!getenv("FAKEGPU_DIR") || (processes && strcmp(processes, "none") == 0))
		return NVML_ERROR_NOT_SUPPORTED;
	struct fg_usage u[256];
	int got = daemon_usage(u, 256);
	if (got < 0)
		return NVML_ERROR_UNKNOWN;
	unsigned n = (unsigned)got;
	if (*count < n || (n && !infos)) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (unsigned i = 0; i < n; i++)
		infos[i] = (nvmlProcessInfo_t){ (unsigned)u[i].pid, u[i].bytes, 0xffffffffu, 0xffffffffu };
	*count = n;
	return NVML_SUCCESS;
}
