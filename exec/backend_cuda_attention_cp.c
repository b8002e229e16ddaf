/* backend_cuda_attention_cp: context parallelism's attention blocks in the cuda backend's kernel
 * table (kernels/ops.def: attention_block_forward, attention_block_backward; the host reference
 * is kernels/attention_cp.c, the orchestration exec/context_parallel.c, shared by both
 * backends). A block is m query rows of one sequence against n keys, causal by global
 * positions: row i sees key j when k0 + j <= q0 + i, i.e. the diagonal shifted by q0 - k0. Per
 * head, as the unfused whole-sequence core: the scores by a GEMM into stream-ordered scratch,
 * the shifted causal softmax (kernels/attention_cp.cu), the values by a GEMM. The backward
 * recomputes the probabilities from the merged lse and takes the softmax's row term from the
 * merged y (rowsum(dy y)), so the blocks' gradients sum to the whole attention's; dq, dk, dv
 * accumulate (+=) as the host's do. bf16 models take the fused cores instead, as the whole
 * sequence's attention does (backend_cuda_kernels.c): cuDNN's SDPA with the chunks' offsets
 * (cuda_cudnn.h), else kernels/flash_attention.cu's blocks; a block's own result is merged by
 * kc_attention_merge. */
#include <math.h>

#include "../kernels/kernels_cuda.h"
#include "cuda-impl.h"
#include "cuda_cudnn.h"
#include "gpu_layout.h"

/* Which core a block runs on (the whole sequence's choice: PIPER_CUDA_ATTENTION, bf16 models). */
enum core { CORE_UNFUSED, CORE_FUSED, CORE_CUDNN };

static struct exec_cudnn_sdpa_shape cudnn_shape(const struct kernels_attention_block *b) {
  return (struct exec_cudnn_sdpa_shape){1, b->m, b->n, b->heads, b->kv_heads, b->head_dim, b->q0,
                                        b->k0};
}

static enum core core_of(struct exec_stream *s, const struct kernels_attention_block *b) {
  struct cuda_context *c = exec_cuda_kernel_ctx(s);
  struct exec_cudnn_sdpa_shape sh = cudnn_shape(b);
  bool usable = c->bf16_gemm && !c->cudnn_off && exec_cudnn_sdpa_built() &&
                exec_cudnn_sdpa_supported(&sh);
  if (exec_gpu_attention_cudnn(c->attention, usable))
    return CORE_CUDNN;
  bool fusable = c->bf16_gemm && kc_flash_attention_supported(b->head_dim, b->heads, b->kv_heads);
  return exec_gpu_attention_fused(c->attention, fusable) ? CORE_FUSED : CORE_UNFUSED;
}

/* cuDNN's handle, made on first use; NULL with *e */
static struct exec_cudnn_sdpa *cudnn_of(struct exec_stream *s, GError **e) {
  struct cuda_context *c = exec_cuda_kernel_ctx(s);
  if (!c->cudnn)
    c->cudnn = exec_cudnn_sdpa_new(e);
  return c->cudnn;
}

static cudaStream_t st_of(struct exec_stream *s) {
  return exec_cuda_st_of(s);
}

static void gemm(struct exec_stream *s, bool ta, bool tb, int m, int n, int k, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  exec_cuda_gemm_pre(s, 0, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* y, lse (=) <- one block, per head; p: m x n floats of scratch */
static void block_forward_heads(struct exec_stream *s, float *y, float *lse, const float *q,
                                const float *k, const float *v,
                                const struct kernels_attention_block *b, float *p) {
  int D = b->head_dim, HD = b->heads * D, KD = b->kv_heads * D, group = b->heads / b->kv_heads;
  for (int h = 0; h < b->heads; h++) {
    const float *kh = k + (size_t)(h / group) * D, *vh = v + (size_t)(h / group) * D;
    gemm(s, false, true, b->m, b->n, D, 1.0f, q + (size_t)h * D, HD, kh, KD, 0.0f, p, b->n);
    kc_attention_block_softmax(p, lse + (size_t)h * b->m, b->m, b->n, b->q0 - b->k0, b->scale,
                               false, st_of(s));
    gemm(s, false, false, b->m, D, b->n, 1.0f, p, b->n, vh, KD, 0.0f, y + (size_t)h * D, HD);
  }
}

/* y, lse (=) <- one block on a fused core; false: cuDNN refused it (auto mode: the own
 * kernels from now on) */
static bool block_forward_fused(struct exec_stream *s, enum core core, float *y, float *lse,
                                const float *q, const float *k, const float *v,
                                const struct kernels_attention_block *b) {
  GError *e = NULL;
  if (core == CORE_CUDNN) {
    struct exec_cudnn_sdpa *c = cudnn_of(s, &e);
    struct exec_cudnn_sdpa_shape sh = cudnn_shape(b);
    if (c && exec_cudnn_sdpa_forward(c, &sh, y, lse, q, k, v, st_of(s), &e))
      return true;
    return exec_cuda_cudnn_refused(s, e);
  }
  void *scratch = exec_cuda_stream_scratch(
      s, kc_flash_attention_block_scratch_bytes(1, b->m, b->n, b->heads, b->kv_heads, b->head_dim,
                                                false));
  if (!scratch)
    return true;
  if (!CUDA_CHECK(exec_cuda_kernel_ctx(s),
                  kc_flash_attention_block_forward(y, lse, scratch, q, k, v, 1, b->m, b->n,
                                                   b->q0 - b->k0, b->heads, b->kv_heads,
                                                   b->head_dim, st_of(s)),
                  &e))
    exec_cuda_fail(s, e);
  cudaFreeAsync(scratch, st_of(s));
  return true;
}

void exec_cuda_attention_block_forward(struct exec_stream *s, float *y, float *lse, const float *q,
                                       const float *k, const float *v,
                                       const struct kernels_attention_block *b, bool merge) {
  size_t ny = (size_t)b->m * b->heads * b->head_dim, nl = (size_t)b->m * b->heads;
  enum core core = core_of(s, b);
  size_t np = core == CORE_UNFUSED ? (size_t)b->m * b->n : 0;
  /* merging: the block's own result first, in scratch beside its scores */
  float *p = exec_cuda_stream_scratch(s, (np + (merge ? ny + nl : 0)) * sizeof(float));
  if (!p)
    return;
  float *yo = merge ? p + np : y, *lo = merge ? p + np + ny : lse;
  if (core == CORE_UNFUSED || !block_forward_fused(s, core, yo, lo, q, k, v, b)) {
    if (!np) { /* cuDNN refused it: the unfused core's scores need room */
      float *scores = exec_cuda_stream_scratch(s, (size_t)b->m * b->n * sizeof(float));
      if (scores) {
        block_forward_heads(s, yo, lo, q, k, v, b, scores);
        cudaFreeAsync(scores, st_of(s));
      }
    } else {
      block_forward_heads(s, yo, lo, q, k, v, b, p);
    }
  }
  if (merge)
    kc_attention_merge(y, lse, yo, lo, b->m, b->heads, b->head_dim, st_of(s));
  cudaFreeAsync(p, st_of(s));
}

/* dq, dk, dv += one block on a fused core; false as block_forward_fused */
static bool block_backward_fused(struct exec_stream *s, enum core core, float *dq, float *dk,
                                 float *dv, const float *dy, const float *y, const float *lse,
                                 const float *q, const float *k, const float *v,
                                 const struct kernels_attention_block *b) {
  GError *e = NULL;
  cudaStream_t cs = st_of(s);
  if (core == CORE_CUDNN) {
    /* cuDNN writes its gradients (=): into scratch, then added */
    size_t nq = (size_t)b->m * b->heads * b->head_dim, nk = (size_t)b->n * b->kv_heads * b->head_dim;
    float *g = exec_cuda_stream_scratch(s, (nq + 2 * nk) * sizeof(float));
    if (!g)
      return true;
    struct exec_cudnn_sdpa *c = cudnn_of(s, &e);
    struct exec_cudnn_sdpa_shape sh = cudnn_shape(b);
    bool ok = c && exec_cudnn_sdpa_backward(c, &sh, g, g + nq, g + nq + nk, q, k, v, y, dy, lse,
                                            cs, &e);
    if (ok) {
      kc_add(dq, g, nq, true, cs);
      kc_add(dk, g + nq, nk, true, cs);
      kc_add(dv, g + nq + nk, nk, true, cs);
    }
    cudaFreeAsync(g, cs);
    return ok || exec_cuda_cudnn_refused(s, e);
  }
  void *scratch = exec_cuda_stream_scratch(
      s, kc_flash_attention_block_scratch_bytes(1, b->m, b->n, b->heads, b->kv_heads, b->head_dim,
                                                true));
  if (!scratch)
    return true;
  if (!CUDA_CHECK(exec_cuda_kernel_ctx(s),
                  kc_flash_attention_block_backward(dq, dk, dv, scratch, q, k, v, y, dy, lse, 1,
                                                    b->m, b->n, b->q0 - b->k0, b->heads,
                                                    b->kv_heads, b->head_dim, true, cs),
                  &e))
    exec_cuda_fail(s, e);
  cudaFreeAsync(scratch, cs);
  return true;
}

void exec_cuda_attention_block_backward(struct exec_stream *s, float *dq, float *dk, float *dv,
                                        const float *dy, const float *y, const float *lse,
                                        const float *q, const float *k, const float *v,
                                        const struct kernels_attention_block *b) {
  enum core core = core_of(s, b);
  if (core != CORE_UNFUSED && block_backward_fused(s, core, dq, dk, dv, dy, y, lse, q, k, v, b))
    return;
  int D = b->head_dim, HD = b->heads * D, KD = b->kv_heads * D, group = b->heads / b->kv_heads;
  int m = b->m, n = b->n;
  size_t np = (size_t)m * n;
  float *p = exec_cuda_stream_scratch(s, (2 * np + (size_t)m * b->heads) * sizeof(float));
  if (!p)
    return;
  float *ds = p + np, *delta = ds + np;
  cudaStream_t cs = st_of(s);
  kc_attention_rowdot(delta, dy, y, m, b->heads, D, cs);
  for (int h = 0; h < b->heads; h++) {
    size_t qo = (size_t)h * D, ko = (size_t)(h / group) * D;
    gemm(s, false, true, m, n, D, 1.0f, q + qo, HD, k + ko, KD, 0.0f, p, n);
    kc_attention_block_softmax(p, (float *)lse + (size_t)h * m, m, n, b->q0 - b->k0, b->scale,
                               true, cs);
    gemm(s, false, true, m, n, D, 1.0f, dy + qo, HD, v + ko, KD, 0.0f, ds, n);
    kc_attention_block_dsoftmax(ds, p, delta + (size_t)h * m, m, n, b->scale, cs);
    gemm(s, false, false, m, D, n, 1.0f, ds, n, k + ko, KD, 1.0f, dq + qo, HD);
    gemm(s, true, false, n, D, m, 1.0f, ds, n, q + qo, HD, 1.0f, dk + ko, KD);
    gemm(s, true, false, n, D, m, 1.0f, p, n, dy + qo, HD, 1.0f, dv + ko, KD);
  }
  cudaFreeAsync(p, cs);
}
