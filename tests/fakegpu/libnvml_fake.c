/*
 * A fake libnvidia-ml.so.1 (NVML) with the few functions the plugin and cuda-criu use. It knows nothing of
 * the fake GPU daemon: what it reports comes from the environment of the process that loads it.
 *
 *   FAKENVML_FREE=BYTES        every GPU has this much free memory (unset: the query is not supported)
 *   FAKENVML_PERSISTENCE=0|1   every GPU's persistence mode (unset: not supported)
 *
 * Built into tests/fakegpu/nvml/; a test puts that directory in LD_LIBRARY_PATH to use it.
 */
#include <stdlib.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define EXPORT __attribute__((visibility("default")))

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

static int g_device; /* every GPU is this one: the values do not depend on the GPU */

EXPORT int nvmlInit_v2(void) { return NVML_SUCCESS; }

EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, void **device)
{
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &g_device;
	return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory)
{
	const char *free_bytes = getenv("FAKENVML_FREE");
	if (!device || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!free_bytes)
		return NVML_ERROR_NOT_SUPPORTED;
	memory->free = strtoull(free_bytes, NULL, 0);
	memory->total = memory->free;
	memory->used = 0;
	return NVML_SUCCESS;
}

EXPORT int nvmlDeviceGetPersistenceMode(void *device, int *mode)
{
	const char *p = getenv("FAKENVML_PERSISTENCE");
	if (!device || !mode)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!p)
		return NVML_ERROR_NOT_SUPPORTED;
	*mode = atoi(p) == 1;
	return NVML_SUCCESS;
}
