/* backend_cuda_green: a compute stream limited to a share of the GPU's SMs (the stream
 * directive's sm_share) runs in a green context (CUDA 12.4+ driver): the device's SM resource
 * is split, a green context made on the part, and the stream created in it; kernels and
 * cuBLASLt GEMMs enqueued there use only those SMs. The driver API is reached through the
 * runtime's entry-point lookup, so nothing links libcuda and machines without a driver still
 * run the programs. Where any step is missing the caller prints why, once. */
#include <cuda.h>
#include <string.h>

#include "../base/base.h"
#include "cuda-impl.h"
#include "gpu_layout.h"

typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*get_resource_fn)(CUdevice, CUdevResource *, CUdevResourceType);
typedef CUresult (*split_fn)(CUdevResource *, unsigned *, const CUdevResource *, CUdevResource *,
                             unsigned, unsigned);
typedef CUresult (*desc_fn)(CUdevResourceDesc *, CUdevResource *, unsigned);
typedef CUresult (*green_create_fn)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
typedef CUresult (*green_stream_fn)(CUstream *, CUgreenCtx, unsigned, int);
typedef CUresult (*green_destroy_fn)(CUgreenCtx);

static void *entry(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12040, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return NULL;
  return fn;
}

/* Entry points are data pointers to the runtime; calling one needs a function pointer. */
#define ENTRY(type, name) ((type)(uintptr_t)entry(name))

bool exec_cuda_green_stream(struct cuda_context *b, double sm_share, int priority,
                            cudaStream_t *out, void **green, char *why, size_t why_len) {
  device_get_fn device_get = ENTRY(device_get_fn, "cuDeviceGet");
  get_resource_fn get_resource = ENTRY(get_resource_fn, "cuDeviceGetDevResource");
  split_fn split = ENTRY(split_fn, "cuDevSmResourceSplitByCount");
  desc_fn desc = ENTRY(desc_fn, "cuDevResourceGenerateDesc");
  green_create_fn create = ENTRY(green_create_fn, "cuGreenCtxCreate");
  green_stream_fn stream = ENTRY(green_stream_fn, "cuGreenCtxStreamCreate");
  if (!device_get || !get_resource || !split || !desc || !create || !stream) {
    g_snprintf(why, why_len, "this driver has no green contexts (CUDA 12.4+ driver needed)");
    return false;
  }
  CUdevice dev;
  CUdevResource all, part, rest;
  CUdevResourceDesc d;
  CUgreenCtx g = NULL;
  CUstream s = NULL;
  unsigned groups = 1;
  int sms = exec_gpu_green_sms(sm_share, b->n_sms, 8);
  const char *step = NULL;
  CUresult r;
  if ((r = device_get(&dev, b->device)) != CUDA_SUCCESS)
    step = "cuDeviceGet";
  else if ((r = get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM)) != CUDA_SUCCESS)
    step = "cuDeviceGetDevResource";
  else if ((r = split(&part, &groups, &all, &rest, 0, (unsigned)sms)) != CUDA_SUCCESS)
    step = "cuDevSmResourceSplitByCount";
  else if ((r = desc(&d, &part, 1)) != CUDA_SUCCESS)
    step = "cuDevResourceGenerateDesc";
  else if ((r = create(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM)) != CUDA_SUCCESS)
    step = "cuGreenCtxCreate";
  else if ((r = stream(&s, g, CU_STREAM_NON_BLOCKING, priority)) != CUDA_SUCCESS)
    step = "cuGreenCtxStreamCreate";
  if (step) {
    g_snprintf(why, why_len, "%s failed (CUresult %d)", step, (int)r);
    if (g)
      exec_cuda_green_destroy(g);
    return false;
  }
  *out = (cudaStream_t)s;
  *green = g;
  g_snprintf(why, why_len, "green context of %u SMs", part.sm.smCount);
  return true;
}

void exec_cuda_green_destroy(void *green) {
  green_destroy_fn destroy = ENTRY(green_destroy_fn, "cuGreenCtxDestroy");
  if (green && destroy)
    destroy((CUgreenCtx)green);
}
