/* kernels_cuda: the CUDA kernels behind the cuda backend's kernel table (kernels/cuda.cu),
 * each the device twin of a step of kernels.h's host reference: elementwise and row-wise work
 * only. GEMMs go through cuBLASLt in exec/backend_cuda_kernels.c, which composes each model op
 * from these and GEMMs. fp32 in memory (bf16 as GEMM operands, the cached bf16 copies of the
 * weights: kc_to_bf16, and the kc_bf16_* kernels' activations); every launcher enqueues on `stream` and returns, e.g.
 * kc_fill(x, 0.0f, n, stream). Empty without HAVE_CUDA (the CUDA headers are not there).
 */
#ifndef PIPER_KERNELS_KERNELS_CUDA_H
#define PIPER_KERNELS_KERNELS_CUDA_H
#ifdef HAVE_CUDA

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void kc_fill(float *x, float value, size_t n, cudaStream_t stream);
/* dst [rows, cols] (compact, bf16 bits) = src [rows, cols] with row stride ld, rounded to
 * nearest even: a GEMM operand for cuBLASLt's bf16 inputs */
void kc_to_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld, cudaStream_t stream);
/* dst [n] = src [n] (bf16 bits) widened to fp32, exactly */
void kc_from_bf16(float *dst, const uint16_t *src, size_t n, cudaStream_t stream);
/* y = x (accumulate false) or y += x */
void kc_add(float *y, const float *x, size_t n, bool accumulate, cudaStream_t stream);
/* kc_sum_squares: *sum (device) += x [n] squared, in double, one block in a fixed order
 * (deterministic); kc_scale: x [n] *= factor */
void kc_embedding_forward(float *x, const int32_t *tokens, const float *wte, int T, int C,
                          cudaStream_t stream);
/* dwte[tokens[t]] += dx[t], t ascending per row of dwte: deterministic, no atomics. With
 * scratch (2 T int32, device), the positions of each token are chained first and a thread
 * sums a (column, token) chain; without, a thread a column walks all T positions. */
void kc_embedding_backward(float *dwte, const float *dx, const int32_t *tokens, int T, int C,
                           int32_t *scratch, cudaStream_t stream);
/* Tensor parallelism's vocabulary slice [lo, lo + n) (kernels_tp_embedding_* of kernels.h):
 * table [n, C]; a token outside the slice gets zeros, and no gradient (the serial walk) */
void kc_embedding_slice_forward(float *x, const int32_t *tokens, const float *table, int T, int C,
                                int lo, int n, cudaStream_t stream);
void kc_embedding_slice_backward(float *dtable, const float *dx, const int32_t *tokens, int T,
                                 int C, int lo, int n, cudaStream_t stream);
/* kernels_rope_scaled on x [B*S, H*D]; factor 0: no scaling */
void kc_rope(float *x, int batch, int seq, int heads, int head_dim, float theta, float factor,
             float low_freq_factor, float high_freq_factor, int original_max, bool inverse,
             cudaStream_t stream);
/* The same under context parallelism: x holds CP rank cp_rank's two chunks of each of batch
 * sequences, seq (= the whole / cp) rows each, rotated at their global positions
 * (kernels_rope_cp); cp 1 is kc_rope */
void kc_rope_cp(float *x, int batch, int seq, int cp, int cp_rank, int heads, int head_dim,
                float theta, float factor, float low_freq_factor, float high_freq_factor,
                int original_max, bool inverse, cudaStream_t stream);
/* act = silu(g) * u */
void kc_swiglu_forward(float *act, const float *g, const float *u, size_t n, cudaStream_t stream);
/* dg = dact * u * silu'(g), du = dact * silu(g) */
void kc_swiglu_backward(float *dg, float *du, const float *dact, const float *g, const float *u,
                        size_t n, cudaStream_t stream);
/* The same with bf16 outputs (round to nearest even), for bf16 models, where act, dg and du
 * are only GEMM operands: no fp32 copy to write and convert again */
void kc_swiglu_forward_bf16(uint16_t *act, const float *g, const float *u, size_t n,
                            cudaStream_t stream);
void kc_swiglu_backward_bf16(uint16_t *dg, uint16_t *du, const float *dact, const float *g,
                             const float *u, size_t n, cudaStream_t stream);
/* rows [n_rows, S] of scores scaled by scale, causal softmax (row r is query r % S): keys
 * beyond it become 0; lse[r] = log-sum-exp of the row's scaled scores */
void kc_causal_softmax(float *p, float *lse, int n_rows, int S, float scale, cudaStream_t stream);
/* the same probabilities from the scores and lse (the backward's recomputation) */
void kc_causal_softmax_from_lse(float *p, const float *lse, int n_rows, int S, float scale,
                                cudaStream_t stream);
/* ds = p * (dp - sum(p * dp)) * scale, in place over dp */
void kc_softmax_backward(float *dp, const float *p, int n_rows, int S, float scale,
                         cudaStream_t stream);
/* The fused attention core of bf16 models (kernels/flash_attention.cu, FlashAttention-2
 * style: no [S, S] buffer; bf16 tensor-core products, fp32 accumulation and softmax). Layout
 * of kernels/attention.c's saved: q, y, dq [B*S, heads*head_dim], k, v, dk, dv
 * [B*S, kv_heads*head_dim], lse [B, heads, S]; causal, query head h reads kv head
 * h / (heads / kv_heads), scale 1/sqrt(head_dim). Only the shapes _supported says (head_dim
 * 32, 64 or 128); the others keep the unfused path. Each pass needs device scratch of
 * _scratch_bytes (its operands' bf16 copies; the backward's softmax row terms), in use until
 * the pass's last kernel ends (stream order). Each returns the launch's error. */
bool kc_flash_attention_supported(int head_dim, int heads, int kv_heads);
size_t kc_flash_attention_scratch_bytes(int batch, int seq, int heads, int kv_heads, int head_dim,
                                        bool backward);
/* y, lse <- q, k, v (lse: the natural-log log-sum-exp of the row's scaled scores, as
 * kc_causal_softmax) */
cudaError_t kc_flash_attention_forward(float *y, float *lse, void *scratch, const float *q,
                                       const float *k, const float *v, int batch, int seq,
                                       int heads, int kv_heads, int head_dim, cudaStream_t stream);
/* dq, dk, dv (=, not +=) <- q, k, v, y, dy, lse */
cudaError_t kc_flash_attention_backward(float *dq, float *dk, float *dv, void *scratch,
                                        const float *q, const float *k, const float *v,
                                        const float *y, const float *dy, const float *lse,
                                        int batch, int seq, int heads, int kv_heads, int head_dim,
                                        cudaStream_t stream);
/* Context parallelism's blocks (kernels/attention_cp.cu; kernels_attention_block_* of
 * kernels.h): m query rows against n keys, row i seeing key j when j <= i + shift (shift = the
 * queries' first position minus the keys'). kc_attention_block_softmax: rows [m, n] of scores
 * in place to probabilities of scale * score, lse [m] written (from_lse false: -inf and zero
 * probabilities for a row that sees no key) or read (true: the merged lse, the backward's);
 * kc_attention_block_dsoftmax: dp = p (dp - delta[i]) scale in place, delta the whole row's
 * rowsum(dy y) (kc_attention_rowdot: delta [H, m] from dy, y [m, H*D]); kc_attention_merge:
 * y, lse (y [m, H*D], lse [H, m]) <- the log-sum-exp merge of a block's yb, lb (as
 * kernels_attention_merge). */
void kc_attention_block_softmax(float *p, float *lse, int m, int n, int shift, float scale,
                                bool from_lse, cudaStream_t stream);
void kc_attention_block_dsoftmax(float *dp, const float *p, const float *delta, int m, int n,
                                 float scale, cudaStream_t stream);
void kc_attention_rowdot(float *delta, const float *dy, const float *y, int m, int heads,
                         int head_dim, cudaStream_t stream);
void kc_attention_merge(float *y, float *lse, const float *yb, const float *lb, int m, int heads,
                        int head_dim, cudaStream_t stream);
/* The same kernels on context parallelism's blocks: q_len query rows against kv_len keys of
 * each sequence, row i seeing key j when j <= i + shift (shift: the query chunk's first
 * position minus the key chunk's); q, y, dq [B*q_len, ...], k, v, dk, dv [B*kv_len, ...], lse
 * [B, heads, q_len]. A row that sees no key gets y 0, lse -inf. The backward takes the merged
 * y and lse (the final softmax's) and, with accumulate, adds into dq, dk, dv. */
size_t kc_flash_attention_block_scratch_bytes(int batch, int q_len, int kv_len, int heads,
                                              int kv_heads, int head_dim, bool backward);
cudaError_t kc_flash_attention_block_forward(float *y, float *lse, void *scratch, const float *q,
                                             const float *k, const float *v, int batch, int q_len,
                                             int kv_len, int shift, int heads, int kv_heads,
                                             int head_dim, cudaStream_t stream);
cudaError_t kc_flash_attention_block_backward(float *dq, float *dk, float *dv, void *scratch,
                                              const float *q, const float *k, const float *v,
                                              const float *y, const float *dy, const float *lse,
                                              int batch, int q_len, int kv_len, int shift,
                                              int heads, int kv_heads, int head_dim,
                                              bool accumulate, cudaStream_t stream);
/* probs [T, E] = softmax(logits) (in place), then top-k ids and renormalised weights */
void kc_router_topk(int32_t *ids, float *weights, float *probs, int T, int E, int K,
                    cudaStream_t stream);
/* dlogits [T, E] from dweights, as kernels_router_backward_input before its GEMM */
void kc_router_dlogits(float *dlogits, const float *dweights, const int32_t *ids,
                       const float *weights, const float *probs, int T, int E, int K,
                       cudaStream_t stream);
/* x [rows, n] *= w[row] (the routed experts' weighted activation and its gradients) */
void kc_rows_scale(float *x, const float *w, int rows, int n, cudaStream_t stream);
/* out [rows] = the dot product of x's and y's rows [rows, n] (the routing weights' gradients) */
void kc_rows_dot(float *out, const float *x, const float *y, int rows, int n, cudaStream_t stream);
/* rows gathered (dst[i] = src[index[i]]) or scattered (dst[index[i]] (+)= src[i]), C wide */
void kc_gather_rows(float *dst, const float *src, const int32_t *index, int n, int C,
                    cudaStream_t stream);
void kc_scatter_rows(float *dst, const float *src, const int32_t *index, int n, int C,
                     bool accumulate, cudaStream_t stream);
/* The LM head's cross-entropy over rows [0, n) of a chunk of logits [n, V] (the chunk's rows
 * start at row t0 of T): rowloss[t0 + t] = -log softmax[target], saved[t0 + t] = the row's max
 * logit, saved[T + t0 + t] = 1 / the sum of its exp (the host's saved layout, kernels/loss.c). */
void kc_xent_stats(float *rowloss, float *saved, const float *logits, const int32_t *targets,
                   int t0, int n, int T, int V, cudaStream_t stream);
/* *loss = the mean of rowloss [T], in a fixed order */
void kc_xent_mean(float *loss, const float *rowloss, int T, cudaStream_t stream);
/* a chunk of logits [n, V] (rows t0 .. t0 + n of T) -> dlogits = (softmax - onehot(target)) *
 * scale, the probabilities recomputed from saved (kc_xent_stats): in place over the logits, or
 * rounded to bf16 into out16 [n, V] when it is not NULL (the operand of bf16 GEMMs) */
void kc_xent_backward(float *logits, uint16_t *out16, const float *saved, const int32_t *targets,
                      int t0, int n, int T, int V, float scale, cudaStream_t stream);
/* Tensor parallelism's LM head (kernels_tp_head_* of kernels.h) over a chunk of the slice's
 * logits [rows, n] (rows t0 .. t0 + rows of T): stats [3, T] (max, sum of exp, the target's
 * logit or 0); the group's stats [tp][3, T] merged into saved and *loss (the mean of rowloss
 * [T], device scratch); the targets as the slice's columns (-1 outside it), for
 * kc_xent_backward over the slice */
void kc_tp_head_stats(float *stats, const float *logits, const int32_t *targets, int t0, int rows,
                      int T, int n, int lo, cudaStream_t stream);
void kc_tp_head_combine(float *loss, float *rowloss, float *saved, const float *gathered, int tp,
                        int T, cudaStream_t stream);
void kc_slice_targets(int32_t *local, const int32_t *targets, int T, int lo, int n,
                      cudaStream_t stream);
/* One AdamW step over n parameters (kernels_adamw's formulas); with copy, also the bf16 copy
 * [n] of the updated weights (round to nearest even), the GEMMs' operand */
void kc_adamw(float *params, const float *grads, float *m, float *v, uint16_t *copy, size_t n,
              float lr, float beta1, float beta2, float eps, float weight_decay, int step,
              cudaStream_t stream);
/* The multi-tensor AdamW: one launch over a table (device memory) of n tensors, each updated
 * as kc_adamw updates one (the same bits), copy as there (NULL: none). first_chunk: the
 * tensor's first chunk of KC_ADAMW_CHUNK elements in the whole launch (the sum of the chunks
 * of the tensors before it: ascending); chunks: the total. */
#define KC_ADAMW_CHUNK 4096
struct kc_adamw_tensor {
  float *params;
  const float *grads;
  float *m, *v;
  uint16_t *copy;
  size_t n, first_chunk;
};
void kc_adamw_multi(const struct kc_adamw_tensor *table, int n, size_t chunks, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int step,
                    cudaStream_t stream);

/* ---- bf16 activations (kernels/cuda.cu: the fp32 kernels' templates), for bf16 models: the
 * same ops as the fp32 launchers above with the activations (x, h, dx, dh, g, u, act and their
 * gradients) stored as bf16 bits in uint16_t, widened to fp32 on load, computed in fp32 and
 * rounded to nearest even once on store. RMSNorm's rstd, the norm weights, their gradient and
 * the embedding table and its gradient stay fp32 (sums over a row or over the tokens). e.g.
 *   kc_bf16_rmsnorm_forward(h16, rstd, x16, w, T, C, 1e-5f, stream);
 */
/* y = x (accumulate false) or y += x, rounded */
void kc_bf16_add(uint16_t *y, const uint16_t *x, size_t n, bool accumulate, cudaStream_t stream);
void kc_bf16_rmsnorm_forward(uint16_t *h, float *rstd, const uint16_t *x, const float *w, int T,
                             int C, float eps, cudaStream_t stream);
/* x += y rounded to bf16, then h and rstd from the rounded x */
void kc_bf16_residual_rmsnorm_forward(uint16_t *x, uint16_t *h, float *rstd, const uint16_t *y,
                                      const float *w, int T, int C, float eps,
                                      cudaStream_t stream);
void kc_bf16_rmsnorm_backward_input(uint16_t *dx, const uint16_t *dh, const uint16_t *x,
                                    const float *rstd, const float *w, int T, int C,
                                    bool accumulate, cudaStream_t stream);
void kc_bf16_rmsnorm_backward_weight(float *dw, const uint16_t *dh, const uint16_t *x,
                                     const float *rstd, int T, int C, cudaStream_t stream);
void kc_bf16_rope(uint16_t *x, int batch, int seq, int heads, int head_dim, float theta,
                  float factor, float low_freq_factor, float high_freq_factor, int original_max,
                  bool inverse, cudaStream_t stream);
void kc_bf16_swiglu_forward(uint16_t *act, const uint16_t *g, const uint16_t *u, size_t n,
                            cudaStream_t stream);
void kc_bf16_swiglu_backward(uint16_t *dg, uint16_t *du, const uint16_t *dact, const uint16_t *g,
                             const uint16_t *u, size_t n, cudaStream_t stream);
/* rows [lo, lo + n) of the vocabulary (the whole table: lo 0, n INT_MAX); a token outside gets
 * zeros, and adds no gradient */
void kc_bf16_embedding_forward(uint16_t *x, const int32_t *tokens, const float *table, int T,
                               int C, int lo, int n, cudaStream_t stream);
void kc_bf16_embedding_backward(float *dtable, const uint16_t *dx, const int32_t *tokens, int T,
                                int C, int lo, int n, cudaStream_t stream);

/* The launchers of the op list's DIRECT ops (kernels/ops.def), void kc_<name>(parameters,
 * cudaStream_t stream), which the cuda backend's table calls as they are. */
#define KERNELS_CUDA_LAUNCHER_DIRECT(name, ...) void kc_##name(__VA_ARGS__, cudaStream_t stream);
#define KERNELS_CUDA_LAUNCHER_OWN(name, ...)
#define KERNELS_CUDA_LAUNCHER(cuda, name, params)                                                  \
  KERNELS_CUDA_LAUNCHER_##cuda(name, KERNELS_UNPAREN params)
#define KERNELS_UNPAREN(...) __VA_ARGS__
#define KERNEL_OP(name, use, cuda, params, args) KERNELS_CUDA_LAUNCHER(cuda, name, params)
#include "ops.def"
#undef KERNEL_OP

#ifdef __cplusplus
}
#endif

#endif /* HAVE_CUDA */
#endif
