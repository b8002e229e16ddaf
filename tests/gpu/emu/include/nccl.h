/* A host stand-in for <nccl.h> (tests/gpu/emu/README.md): NCCL's calls over MPI, so that the
 * cuda backend's NCCL path (one emulated GPU per rank: PIPER_EMU_GPUS) runs between
 * processes. A communicator is an MPI communicator of its members; streams run at enqueue
 * (cuda_runtime.h), so an operation runs when it is called: sends are buffered and complete
 * in the background, receives and collectives wait, and a group posts all its parts before
 * waiting for its receives. */
#ifndef PIPER_EMU_NCCL_H
#define PIPER_EMU_NCCL_H
#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5
} ncclResult_t;
typedef enum { ncclInt8 = 0, ncclFloat = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct emu_nccl_comm *ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct {
  int minCTAs, maxCTAs;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {0, 0}

const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *in, void *out, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *in, void *out, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *in, void *out, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
