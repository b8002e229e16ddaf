/* runtime: the CUDA runtime of include/cuda_runtime.h on the host (tests/gpu/emu/README.md).
 * PIPER_EMU_GPUS (default 1) devices of PIPER_EMU_GPU_BYTES each (default 1 GiB); ranks of a
 * host that pick the same device share it, as on a machine with that many GPUs. Every
 * allocation is registered, so copies, memsets, GEMM and NCCL buffers are checked to lie in
 * device memory (the host's memory stands in for both: a host pointer passed where a device
 * one belongs would otherwise go unnoticed) and to fit their allocation. */
#include <cuda_runtime.h>
#include <glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

struct emu_stream {
  int priority;
};
struct emu_event {
  unsigned flags;
  bool recorded;
  double at;
};
struct emu_mem_pool {
  int device;
};

static _Thread_local cudaError_t last_error;
static int device_now;
static size_t used;
static GTree *allocations; /* start -> size */
static GMutex lock;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static long env_long(const char *name, long fallback, long lo) {
  const char *v = getenv(name);
  char *end = NULL;
  long x = v ? strtol(v, &end, 10) : fallback;
  if (v && (end == v || *end || x < lo)) {
    fprintf(stderr, "emu: %s=%s: expected an integer >= %ld\n", name, v, lo);
    exit(2);
  }
  return x;
}

static int n_devices(void) {
  return (int)env_long("PIPER_EMU_GPUS", 1, 0);
}

static size_t device_bytes(void) {
  return (size_t)env_long("PIPER_EMU_GPU_BYTES", 1L << 30, 1L << 20);
}

static gint by_address(gconstpointer a, gconstpointer b, gpointer unused) {
  (void)unused;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y ? -1 : x > y;
}

/* The allocation holding [p, p + bytes), or false. */
bool emu_device_range(const void *p, size_t bytes) {
  if (!p)
    return false;
  g_mutex_lock(&lock);
  bool ok = false;
  if (allocations) {
    /* the last allocation starting at or below p */
    GTreeNode *n = g_tree_upper_bound(allocations, p);
    n = n ? g_tree_node_previous(n) : g_tree_node_last(allocations);
    if (n) {
      uintptr_t start = (uintptr_t)g_tree_node_key(n);
      size_t size = GPOINTER_TO_SIZE(g_tree_node_value(n));
      ok = (uintptr_t)p >= start && (uintptr_t)p + bytes <= start + size;
    }
  }
  g_mutex_unlock(&lock);
  return ok;
}

void emu_check_device(const void *p, size_t bytes, const char *what) {
  if (bytes && !emu_device_range(p, bytes)) {
    fprintf(stderr, "emu: %s: %zu bytes at %p are not inside one device allocation\n", what,
            bytes, p);
    abort();
  }
}

void emu_set_last_error(cudaError_t e) {
  last_error = e;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulation: PIPER_EMU_GPUS=0)";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorNotSupported: return "operation not supported";
  }
  return "unknown error";
}

/* ---- devices -------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n) {
  *n = n_devices();
  return *n ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= n_devices())
    return cudaErrorInvalidDevice;
  device_now = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= n_devices())
    return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "emulated GPU %d (host CPU)", device);
  memcpy(prop->uuid.bytes, "piper-emu-gpu", 13);
  prop->uuid.bytes[15] = (unsigned char)device;
  prop->totalGlobalMem = device_bytes();
  prop->multiProcessorCount = 8;
  prop->major = 8;
  prop->sharedMemPerBlockOptin = 163 * 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess; /* streams run at enqueue */
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  g_mutex_lock(&lock);
  *total = device_bytes();
  *free_bytes = used < *total ? *total - used : 0;
  g_mutex_unlock(&lock);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)symbol, (void)version, (void)flags;
  *fn = NULL; /* no driver: the backend reports green contexts missing */
  if (status)
    *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

/* ---- memory --------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = NULL;
  size_t size = bytes ? (bytes + 255) & ~(size_t)255 : 256;
  g_mutex_lock(&lock);
  bool room = used + size <= device_bytes();
  if (room)
    used += size;
  g_mutex_unlock(&lock);
  if (!room)
    return cudaErrorMemoryAllocation;
  void *m = aligned_alloc(256, size);
  if (!m)
    return cudaErrorMemoryAllocation;
  memset(m, 0xff, size); /* NaN bytes, as fresh device memory is not zero */
  g_mutex_lock(&lock);
  if (!allocations)
    allocations = g_tree_new_full(by_address, NULL, NULL, NULL);
  g_tree_insert(allocations, m, GSIZE_TO_POINTER(size));
  g_mutex_unlock(&lock);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p)
    return cudaSuccess;
  g_mutex_lock(&lock);
  gpointer size = allocations ? g_tree_lookup(allocations, p) : NULL;
  if (size) {
    g_tree_remove(allocations, p);
    used -= GPOINTER_TO_SIZE(size);
  }
  g_mutex_unlock(&lock);
  if (!size)
    return cudaErrorInvalidValue; /* not an allocation's start */
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  (void)s;
  return cudaMalloc(p, bytes);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return cudaFree(p);
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  static struct emu_mem_pool pools[64];
  if (device < 0 || device >= n_devices() || device >= 64)
    return cudaErrorInvalidDevice;
  pools[device].device = device;
  *pool = &pools[device];
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  (void)attr, (void)value;
  return pool ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
    emu_check_device(dst, bytes, "cudaMemcpy destination");
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
    emu_check_device(src, bytes, "cudaMemcpy source");
  if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault)
    return cudaErrorInvalidValue; /* the backend names every direction */
  if (bytes)
    memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
  (void)s;
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  emu_check_device(p, bytes, "cudaMemset");
  memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
  (void)s;
  return cudaMemset(p, value, bytes);
}

/* ---- streams and events --------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
  (void)flags;
  *s = g_new0(struct emu_stream, 1);
  (*s)->priority = priority;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  g_free(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)s, (void)flags;
  return e ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  return cudaEventCreateWithFlags(e, 0);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  *e = g_new0(struct emu_event, 1);
  (*e)->flags = flags;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  g_free(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)s;
  if (!e)
    return cudaErrorInvalidValue;
  e->recorded = true;
  e->at = now_s(); /* everything before it on the stream has run */
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return e ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end || !start->recorded || !end->recorded ||
      (start->flags | end->flags) & cudaEventDisableTiming)
    return cudaErrorInvalidValue;
  *ms = (float)((end->at - start->at) * 1e3);
  return cudaSuccess;
}
