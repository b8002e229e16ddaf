/* A host stand-in for <cuda.h> (tests/gpu/emu/README.md): the driver types that
 * exec/backend_cuda_green.c names. The emulation has no driver: cudaGetDriverEntryPointByVersion
 * finds no symbol, so the backend says once that green contexts are missing, as on an old
 * driver. */
#ifndef PIPER_EMU_CUDA_H
#define PIPER_EMU_CUDA_H
typedef int CUresult;
typedef int CUdevice;
typedef struct emu_stream *CUstream;
typedef struct emu_green *CUgreenCtx;
typedef struct emu_resource_desc *CUdevResourceDesc;
typedef enum { CU_DEV_RESOURCE_TYPE_SM = 1 } CUdevResourceType;
typedef struct {
  CUdevResourceType type;
  struct {
    unsigned smCount;
  } sm;
} CUdevResource;
#define CUDA_SUCCESS 0
#define CU_GREEN_CTX_DEFAULT_STREAM 0x1
#define CU_STREAM_NON_BLOCKING 0x1
#endif
