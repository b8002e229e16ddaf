/* cuda_cudnn: the attention core from cuDNN 9's fused scaled-dot-product attention, forward
 * and backward, for the cuda backend's kernel table (backend_cuda_kernels.c), through cuDNN's C
 * backend API: an operation graph of matmul, pointwise and reduction nodes, built as cuDNN's
 * frontend builds its SDPA node, which cuDNN's fused-attention engines run as one kernel.
 * Usage (q, k, v, y, lse device buffers; st the stream):
 *   GError *err = NULL;
 *   float *y = NULL, *lse = NULL; const float *q = NULL, *k = NULL, *v = NULL;
 *   cudaStream_t st = 0;
 *   struct exec_cudnn_sdpa *c = exec_cudnn_sdpa_new(&err);
 *   struct exec_cudnn_sdpa_shape sh = {.batch = 1, .seq_q = 4096, .seq_kv = 4096, .heads = 32,
 *                                      .kv_heads = 8, .head_dim = 128};
 *   if (c && exec_cudnn_sdpa_supported(&sh))
 *     exec_cudnn_sdpa_forward(c, &sh, y, lse, q, k, v, st, &err);
 *   exec_cudnn_sdpa_free(c);
 * Tensors are fp32 device memory in kernels/attention.c's saved layout: q, y, dq [B*Sq, H*D],
 * k, v, dk, dv [B*Skv, KV*D], lse [B, H, Sq] (natural-log log-sum-exp of a row's scaled scores,
 * as kc_flash_attention_forward). cuDNN's SDPA reads bf16, so each call rounds its operands to
 * bf16 copies and widens cuDNN's bf16 outputs (y, dq, dk, dv) back, in stream-ordered scratch.
 * Built with HAVE_CUDA; without HAVE_CUDNN every call says cuDNN is not built in. */
#ifndef PIPER_EXEC_CUDA_CUDNN_H
#define PIPER_EXEC_CUDA_CUDNN_H
#ifdef HAVE_CUDA

#include <cuda_runtime.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

struct exec_cudnn_sdpa; /* a cuDNN handle and its finalized plans, one per shape */

struct exec_cudnn_sdpa_shape {
  int batch, seq_q, seq_kv, heads, kv_heads, head_dim;
  /* Causal over positions (context parallelism's chunks pass their first positions): query
   * row i, at position q_offset + i, sees key j, at kv_offset + j, when q_offset + i >=
   * kv_offset + j. q_offset >= kv_offset (every row sees a key; a chunk that sees none is
   * skipped by the caller); 0, 0 is the whole sequence. */
  int64_t q_offset, kv_offset;
};

/* false when the build has no cuDNN (NO_CUDNN=1, or no cudnn.h under CUDA_HOME) */
bool exec_cudnn_sdpa_built(void);
/* the shapes the graph is built for: head_dim a multiple of 8 up to 128 (cuDNN's fused
 * attention on sm80/sm90), heads a multiple of kv_heads, q_offset >= kv_offset */
bool exec_cudnn_sdpa_supported(const struct exec_cudnn_sdpa_shape *s);
/* On the current device (cudaSetDevice first). NULL with *err when not built or no cuDNN. */
struct exec_cudnn_sdpa *exec_cudnn_sdpa_new(GError **err);
void exec_cudnn_sdpa_free(struct exec_cudnn_sdpa *c);
/* y, lse <- q, k, v on stream st. The first call of a shape builds and finalizes its plan;
 * false with *err when cuDNN refuses the graph (no engine for it on this GPU) or a call fails. */
bool exec_cudnn_sdpa_forward(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                             float *y, float *lse, const float *q, const float *k, const float *v,
                             cudaStream_t st, GError **err);
/* dq, dk, dv (=, not +=) <- q, k, v, y, dy, lse */
bool exec_cudnn_sdpa_backward(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                              float *dq, float *dk, float *dv, const float *q, const float *k,
                              const float *v, const float *y, const float *dy, const float *lse,
                              cudaStream_t st, GError **err);

#endif /* HAVE_CUDA */
#endif
