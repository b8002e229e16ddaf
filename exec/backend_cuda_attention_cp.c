/* backend_cuda_attention_cp: context parallelism's attention blocks in the cuda backend's kernel
 * table (kernels/ops.def: attention_block_forward, attention_block_backward; the host reference
 * is kernels/attention_cp.c, the orchestration exec/context_parallel.c, shared by both
 * backends). A block is m query rows of one sequence against n keys, causal by global
 * positions: row i sees key j when k0 + j <= q0 + i, i.e. the diagonal shifted by q0 - k0. Per
 * head, as the unfused whole-sequence core: the scores by a GEMM into stream-ordered scratch,
 * the shifted causal softmax (kernels/attention_cp.cu), the values by a GEMM. The backward
 * recomputes the probabilities from the merged lse and takes the softmax's row term from the
 * merged y (rowsum(dy y)), so the blocks' gradients sum to the whole attention's; dq, dk, dv
 * accumulate (+=) as the host's do. */
#include <math.h>

#include "../kernels/kernels_cuda.h"
#include "cuda-impl.h"

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

void exec_cuda_attention_block_forward(struct exec_stream *s, float *y, float *lse, const float *q,
                                       const float *k, const float *v,
                                       const struct kernels_attention_block *b, bool merge) {
  size_t ny = (size_t)b->m * b->heads * b->head_dim, nl = (size_t)b->m * b->heads;
  size_t np = (size_t)b->m * b->n;
  /* merging: the block's own result first, in scratch beside its scores */
  float *p = exec_cuda_stream_scratch(s, (np + (merge ? ny + nl : 0)) * sizeof(float));
  if (!p)
    return;
  float *yo = merge ? p + np : y, *lo = merge ? p + np + ny : lse;
  block_forward_heads(s, yo, lo, q, k, v, b, p);
  if (merge)
    kc_attention_merge(y, lse, yo, lo, b->m, b->heads, b->head_dim, st_of(s));
  cudaFreeAsync(p, st_of(s));
}

void exec_cuda_attention_block_backward(struct exec_stream *s, float *dq, float *dk, float *dv,
                                        const float *dy, const float *y, const float *lse,
                                        const float *q, const float *k, const float *v,
                                        const struct kernels_attention_block *b) {
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
