/*
 * The fake libcuda.so.1's client calls: devices, contexts, memory and error texts (see libcuda_fake.c).
 */
#include "libcuda_fake.h"

static int dev_ok(CUdevice dev)
{
	return dev >= 0 && (uint32_t)dev < g_ndev;
}

#define ENTER()                               \
	do {                                  \
		CUresult e_ = api_enter();    \
		if (e_ != CUDA_SUCCESS)       \
			return e_;            \
	} while (0)
/* evaluates r (e.g. the rpc) before leaving the gate */
#define LEAVE(r)                          \
	do {                              \
		CUresult l_ = (r);        \
		api_leave();              \
		return l_;                \
	} while (0)
/* ENTER, then the device ordinal dev must be one this process sees */
#define ENTER_DEVICE(dev)                                 \
	do {                                              \
		ENTER();                                  \
		if (!dev_ok(dev))                         \
			LEAVE(CUDA_ERROR_INVALID_DEVICE); \
	} while (0)
/* ENTER, then the thread must have a current context */
#define ENTER_CONTEXT()                                    \
	do {                                               \
		ENTER();                                   \
		if (cur_gpu() < 0)                         \
			LEAVE(CUDA_ERROR_INVALID_CONTEXT); \
	} while (0)

/* What the daemon says of device ordinal dev (dev_ok). */
static const struct fg_device *dev_info(CUdevice dev)
{
	return &g_devs.dev[g_devmap[dev]];
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	*count = (int)g_ndev;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(ordinal);
	*device = ordinal;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	const char *model = getenv("FAKEGPU_MODEL");
	snprintf(name, (size_t)len, "%s", model ? model : dev_info(dev)->name);
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	memcpy(uuid->bytes, dev_info(dev)->uuid, 16);
	LEAVE(CUDA_SUCCESS);
}

/* the unversioned name, for callers built against older headers */
#undef cuDeviceGetUuid
__attribute__((visibility("default"))) CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	const char *mem = getenv("FAKEGPU_MEM");
	*bytes = mem ? (size_t)strtoull(mem, NULL, 0) : (size_t)dev_info(dev)->total_mem;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	if (!pciBusId || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	snprintf(pciBusId, (size_t)len, "%s", dev_info(dev)->pci_bus_id);
	LEAVE(CUDA_SUCCESS);
}

static CUresult use_gpu(CUdevice dev)
{
	uint32_t gpu = g_devmap[dev];
	CUresult r = rpc(FG_USE_GPU, gpu, 0, 0, NULL, 0, NULL, 0, NULL);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&g_node_lock);
		g_gpu_mask |= 1u << gpu;
		open_gpu_node(gpu);
		pthread_mutex_unlock(&g_node_lock);
	}
	return r;
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
			     CUdevice dev)
{
	(void)ctxCreateParams;
	(void)flags;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	CUresult r = use_gpu(dev);
	if (r != CUDA_SUCCESS)
		LEAVE(r);
	struct CUctx_st *c = calloc(1, sizeof(*c));
	if (!c)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	c->magic = CTX_MAGIC;
	c->ordinal = dev;
	c->refs = 1;
	*pctx = c;
	tls_ctx = c;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
	ENTER();
	if (!ctx || ctx->magic != CTX_MAGIC || ctx->primary)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	if (tls_ctx == ctx)
		tls_ctx = NULL;
	ctx->magic = 0;
	free(ctx);
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	ENTER();
	if (ctx && ctx->magic != CTX_MAGIC)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	tls_ctx = ctx;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	*pctx = tls_ctx;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	ENTER();
	LEAVE(tls_ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_DEVICE(dev);
	struct CUctx_st *c = &g_primary[dev];
	if (c->magic != CTX_MAGIC) {
		CUresult r = use_gpu(dev);
		if (r != CUDA_SUCCESS)
			LEAVE(r);
		c->magic = CTX_MAGIC;
		c->ordinal = dev;
		c->primary = 1;
	}
	c->refs++;
	*pctx = c;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	ENTER_DEVICE(dev);
	if (g_primary[dev].refs > 0)
		g_primary[dev].refs--;
	LEAVE(CUDA_SUCCESS);
}

/* The GPU of the current context, or -1. */
static int cur_gpu(void)
{
	CUcontext c = tls_ctx;
	if (!c || c->magic != CTX_MAGIC)
		return -1;
	return (int)g_devmap[c->ordinal];
}

/* One request about the GPU of the thread's current context. */
static CUresult rpc_on_current_gpu(uint32_t op, uint64_t a1, struct fg_msg *m)
{
	int gpu = cur_gpu();
	return gpu < 0 ? CUDA_ERROR_INVALID_CONTEXT : rpc(op, (uint64_t)gpu, a1, 0, NULL, 0, NULL, 0, m);
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total)
{
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	struct fg_msg m;
	CUresult r = rpc_on_current_gpu(FG_MEMINFO, 0, &m);
	if (r == CUDA_SUCCESS) {
		*free_bytes = (size_t)m.a[0];
		*total = (size_t)m.a[1];
	}
	LEAVE(r);
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	struct fg_msg m;
	CUresult r = rpc_on_current_gpu(FG_ALLOC, bytesize, &m);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)m.a[0];
	LEAVE(r);
}

size_t g_managed_bytes; /* held by cuMemAllocManaged; never freed */

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	if (!dptr || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER();
	void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	__atomic_add_fetch(&g_managed_bytes, bytesize, __ATOMIC_RELAXED);
	*dptr = (CUdeviceptr)(uintptr_t)p;
	LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	ENTER_CONTEXT();
	if (!dptr)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_FREE, dptr, 0, 0, NULL, 0, NULL, 0, NULL));
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	if (ByteCount && !srcHost)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_CONTEXT();
	if (!ByteCount)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_HTOD, dstDevice, 0, 0, srcHost, ByteCount, NULL, 0, NULL));
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	if (ByteCount && !dstHost)
		return CUDA_ERROR_INVALID_VALUE;
	ENTER_CONTEXT();
	if (!ByteCount)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_DTOH, srcDevice, ByteCount, 0, NULL, 0, dstHost, ByteCount, NULL));
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	ENTER_CONTEXT();
	if (!N)
		LEAVE(CUDA_SUCCESS);
	LEAVE(rpc(FG_MEMSET, dstDevice, uc, N, NULL, 0, NULL, 0, NULL));
}

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} g_errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS" },
	{ CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "wait operation timed out" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

/* The name (name_not_text) or the description of error, as cuGetErrorName and cuGetErrorString give
 * them. */
static CUresult error_text(CUresult error, const char **pStr, int name_not_text)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(g_errors) / sizeof(g_errors[0]); i++)
		if (g_errors[i].code == error) {
			*pStr = name_not_text ? g_errors[i].name : g_errors[i].text;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) { return error_text(error, pStr, 1); }

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) { return error_text(error, pStr, 0); }
