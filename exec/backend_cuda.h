/* backend_cuda: what the cuda backend offers beyond the common table (exec/backend.h), for the
 * programs that measure it (prof/cuda.c): the precision of its GEMMs, the weight stores whose
 * bf16 copies it keeps, and the device's facts. Built with the backend (HAVE_CUDA); b is an
 * instance of exec_backend_cuda.
 *
 *   GError *err = NULL;
 *   struct exec_backend *b = exec_backend_init_by_name("cuda", NULL, &err);
 *   struct exec_cuda_facts f;
 *   if (b && exec_cuda_facts(b, &f, &err))
 *     printf("%s: %d SMs\n", f.name, f.n_sms);
 *   if (b)
 *     exec_cuda_set_gemm_bf16(b, true); // GEMMs as for a bf16 model
 */
#ifndef PIPER_EXEC_BACKEND_CUDA_H
#define PIPER_EXEC_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"

struct exec_cuda_facts {
  char name[256];
  int n_sms;
  size_t free_bytes, total_bytes;
};

bool exec_cuda_facts(struct exec_backend *b, struct exec_cuda_facts *out, GError **err);
/* GEMMs with bf16 copies of their fp32 operands (fp32 accumulation and output), as the backend
 * configures them for a bf16 model, or in fp32. */
bool exec_cuda_gemm_bf16(struct exec_backend *b);
void exec_cuda_set_gemm_bf16(struct exec_backend *b, bool bf16);
/* A block of device memory holding weights that only the optimizer writes: GEMMs keep bf16
 * copies of its matrices and the optimizer's update refreshes them (as piper-exec's
 * parameter store is). */
void exec_cuda_add_weight_store(struct exec_backend *b, const void *store, size_t bytes);
/* The kernel table for bf16 activations (#29), filled into *k: the entries converted so far
 * take bf16 activations (bf16 bits behind the op list's float pointers) with fp32 statistics,
 * weights and arithmetic; an op not converted yet is NULL (exec_backend_supports_op refuses
 * it), an op on no activation keeps its fp32 entry. Not the runner's yet (exec_gpu_act_dtype):
 * check_kernels holds each entry to the host reference (backend_cuda_act16.c). */
void exec_cuda_kernels_act_bf16(struct exec_kernels *k);

#endif
