/* backend_cuda_act16: the cuda backend's kernel table for bf16 activations (#29), entry by
 * entry as the op list (kernels/ops.def) is converted. An activation argument of a converted
 * entry (x, h, y, dx, dh, dy) holds bf16 bits (the table keeps the op list's float pointers;
 * their element count is unchanged, their bytes halve); statistics (RMSNorm's rstd), weights
 * and parameter gradients stay fp32, as the kc_bf16_* launchers of kernels/cuda.cu have them.
 *
 * An op not converted yet is NULL here, so that a plan that needs it is refused by name
 * (exec_backend_supports_op) rather than run on bf16 bits read as floats; an op that touches
 * no activation (the optimizer's, gradient clipping's, a copy of bytes) keeps its fp32 entry.
 * The runner does not take this table yet: exec_gpu_act_dtype holds every model's activations
 * in fp32 until the buffers are sized at the activation width and every op a plan uses is
 * here (docs/exec.md, "The CUDA backend", Memory). check_kernels runs each entry against the
 * host reference. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "../base/assert.h"
#include "../kernels/kernels.h"
#include "../kernels/kernels_cuda.h"
#include "backend_cuda.h"
#include "cuda-impl.h"

static cudaStream_t st_of(struct exec_stream *s) {
  return exec_cuda_st_of(s);
}

/* a float pointer of the op list that holds bf16 bits */
#define A16(p) ((uint16_t *)(void *)(p))
#define C16(p) ((const uint16_t *)(const void *)(p))

static void a16_residual_add_forward(struct exec_stream *s, float *x, const float *y, size_t n) {
  kc_bf16_add(A16(x), C16(y), n, true, st_of(s));
}

static void a16_residual_add_backward(struct exec_stream *s, float *dy, const float *dx, size_t n,
                                      bool accumulate) {
  kc_bf16_add(A16(dy), C16(dx), n, accumulate, st_of(s));
}

static void a16_embedding_forward(struct exec_stream *s, float *x, const int32_t *tokens,
                                  const float *params, int T, int V, int C) {
  (void)V;
  kc_bf16_embedding_forward(A16(x), tokens, params, T, C, 0, INT_MAX, st_of(s));
}

/* the embedding's B is its BW: it has no input gradient */
static void a16_embedding_backward_weight(struct exec_stream *s, float *dparams, const float *dx,
                                          const int32_t *tokens, int T, int V, int C) {
  (void)V;
  kc_bf16_embedding_backward(dparams, C16(dx), tokens, T, C, 0, INT_MAX, st_of(s));
}

static void a16_rmsnorm_forward(struct exec_stream *s, float *h, float *saved, const float *x,
                                const float *params, int T, int C, float eps) {
  kc_bf16_rmsnorm_forward(A16(h), saved, C16(x), params, T, C, eps, st_of(s));
}

static void a16_residual_rmsnorm_forward(struct exec_stream *s, float *x, float *h, float *saved,
                                         const float *y, const float *params, int T, int C,
                                         float eps) {
  kc_bf16_residual_rmsnorm_forward(A16(x), A16(h), saved, C16(y), params, T, C, eps, st_of(s));
}

static void a16_rmsnorm_backward_input(struct exec_stream *s, float *dx, const float *dh,
                                       const float *x, const float *saved, const float *params,
                                       int T, int C, bool accumulate) {
  kc_bf16_rmsnorm_backward_input(A16(dx), C16(dh), C16(x), saved, params, T, C, accumulate,
                                 st_of(s));
}

static void a16_rmsnorm_backward_weight(struct exec_stream *s, float *dparams, const float *dh,
                                        const float *x, const float *saved, int T, int C) {
  kc_bf16_rmsnorm_backward_weight(dparams, C16(dh), C16(x), saved, T, C, st_of(s));
}

static void a16_rmsnorm_backward(struct exec_stream *s, float *dx, float *dparams, const float *dh,
                                 const float *x, const float *saved, const float *params, int T,
                                 int C, bool accumulate) {
  a16_rmsnorm_backward_input(s, dx, dh, x, saved, params, T, C, accumulate);
  a16_rmsnorm_backward_weight(s, dparams, dh, x, saved, T, C);
}

/* ---- the SwiGLU MLP (kernels/mlp.c's layout at bf16: saved g, u, act; bwork dg, du) --------
 * GEMMs read the bf16 activations as stored (GEMM_A16, GEMM_B16), so bf16 activations come with
 * bf16 GEMMs. cuBLASLt writes fp32 here (exec_cuda_gemm_pre), so an output activation goes
 * through fp32 stream-ordered scratch and is rounded once into its bf16 buffer; the gradient of
 * act is rounded to bf16 before the SwiGLU backward, as a bf16 GEMM output would be. */
struct mlp16 {
  const float *wg, *wu, *wd;
  uint16_t *g, *u, *act, *dg, *du;
};

static struct mlp16 mlp16_views(struct exec_stream *s, const float *params, const float *saved,
                                const float *bwork, int T, int C, int F) {
  /* programmer error: the table is for bf16 models, whose GEMMs take bf16 operands */
  PIPER_ASSERT(exec_cuda_kernel_ctx(s)->bf16_gemm);
  size_t TF = (size_t)T * F, CF = (size_t)C * F;
  struct mlp16 w = {0};
  if (params) {
    w.wg = params;
    w.wu = w.wg + CF;
    w.wd = w.wu + CF;
  }
  if (saved) {
    w.g = (uint16_t *)(void *)saved;
    w.u = w.g + TF;
    w.act = w.u + TF;
  }
  if (bwork) {
    w.dg = (uint16_t *)(void *)bwork;
    w.du = w.dg + TF;
  }
  return w;
}

static float *scratch32(struct exec_stream *s, size_t n) {
  return exec_cuda_stream_scratch(s, n * sizeof(float));
}

static void a16_mlp_forward(struct exec_stream *s, float *m, float *saved, const float *h,
                            const float *params, int T, int C, int F) {
  struct mlp16 w = mlp16_views(s, params, saved, NULL, T, C, F);
  float *t = scratch32(s, (size_t)T * (F > C ? F : C));
  if (!t)
    return;
  exec_cuda_gemm_pre(s, GEMM_A16, false, false, T, F, C, 1.0f, h, C, w.wg, F, 0.0f, t, F);
  kc_to_bf16(w.g, t, T, F, F, st_of(s));
  exec_cuda_gemm_pre(s, GEMM_A16, false, false, T, F, C, 1.0f, h, C, w.wu, F, 0.0f, t, F);
  kc_to_bf16(w.u, t, T, F, F, st_of(s));
  kc_bf16_swiglu_forward(w.act, w.g, w.u, (size_t)T * F, st_of(s));
  exec_cuda_gemm_pre(s, GEMM_A16, false, false, T, C, F, 1.0f, w.act, F, w.wd, C, 0.0f, t, C);
  kc_to_bf16(A16(m), t, T, C, C, st_of(s));
  cudaFreeAsync(t, st_of(s));
}

static void a16_mlp_backward_input(struct exec_stream *s, float *dh, float *bwork, const float *dm,
                                   const float *saved, const float *params, int T, int C, int F,
                                   bool accumulate) {
  struct mlp16 w = mlp16_views(s, params, saved, bwork, T, C, F);
  float *t = scratch32(s, (size_t)T * (F > C ? F : C));
  if (!t)
    return;
  exec_cuda_gemm_pre(s, GEMM_A16, false, true, T, F, C, 1.0f, dm, C, w.wd, C, 0.0f, t, F);
  kc_to_bf16(w.dg, t, T, F, F, st_of(s)); /* dact, in dg's place: the backward is in place */
  kc_bf16_swiglu_backward(w.dg, w.du, w.dg, w.g, w.u, (size_t)T * F, st_of(s));
  if (accumulate)
    kc_from_bf16(t, C16(dh), (size_t)T * C, st_of(s));
  float beta = accumulate ? 1.0f : 0.0f;
  exec_cuda_gemm_pre(s, GEMM_A16, false, true, T, C, F, 1.0f, w.dg, F, w.wg, F, beta, t, C);
  exec_cuda_gemm_pre(s, GEMM_A16, false, true, T, C, F, 1.0f, w.du, F, w.wu, F, 1.0f, t, C);
  kc_to_bf16(A16(dh), t, T, C, C, st_of(s));
  cudaFreeAsync(t, st_of(s));
}

static void a16_mlp_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                    const float *dm, const float *h, const float *saved, int T,
                                    int C, int F) {
  struct mlp16 w = mlp16_views(s, NULL, saved, bwork, T, C, F);
  float *dwg = dparams, *dwu = dwg + (size_t)C * F, *dwd = dwu + (size_t)C * F;
  unsigned both = GEMM_A16 | GEMM_B16;
  exec_cuda_gemm_pre(s, both, true, false, C, F, T, 1.0f, h, C, w.dg, F, 1.0f, dwg, F);
  exec_cuda_gemm_pre(s, both, true, false, C, F, T, 1.0f, h, C, w.du, F, 1.0f, dwu, F);
  exec_cuda_gemm_pre(s, both, true, false, F, C, T, 1.0f, w.act, F, dm, C, 1.0f, dwd, C);
}

static void a16_mlp_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                             const float *dm, const float *h, const float *saved,
                             const float *params, int T, int C, int F, bool accumulate) {
  a16_mlp_backward_input(s, dh, bwork, dm, saved, params, T, C, F, accumulate);
  a16_mlp_backward_weight(s, dparams, bwork, dm, h, saved, T, C, F);
}

/* ---- attention (kernels/attention.c's layout at mixed widths: saved q, k, v in bf16, then the
 * core: lse [B, H, S] fp32 and y in bf16, after v or in d->core; bwork dy, dq, dk, dv in bf16).
 * An adapter, correct and not yet fast: each entry widens its bf16 operands exactly into fp32
 * stream-ordered scratch in the host layout, runs the fp32-activation entry (cuDNN's, the own
 * fused or the unfused core, as configured) and rounds what it wrote once into the bf16
 * buffers. The fp32 entries round h, q, k, v, y to bf16 for their GEMMs and cores anyway, and
 * widening a bf16 value then rounding it is exact, so the adapter adds only the roundings of
 * its stores. The fast form reads the bf16 buffers directly (the fused kernels and cuDNN take
 * bf16 operands: their own per-call bf16 copies go away). */
struct att16 {
  uint16_t *qkv, *y;
  float *lse;
  size_t n_qkv, n_lse, n_y; /* elements */
};

static struct att16 att16_views(const struct kernels_attention_dims *d, const float *saved) {
  size_t T = (size_t)d->batch * d->seq, HD = (size_t)d->heads * d->head_dim;
  size_t KD = (size_t)d->kv_heads * d->head_dim;
  struct att16 a = {NULL, NULL, NULL, T * (HD + 2 * KD), (size_t)d->batch * d->heads * d->seq,
                    T * HD};
  a.qkv = (uint16_t *)(void *)saved;
  char *core = d->core ? (char *)d->core : saved ? (char *)(a.qkv + a.n_qkv) : NULL;
  if (core) {
    a.lse = (float *)(void *)core;
    a.y = (uint16_t *)(void *)(core + a.n_lse * sizeof(float));
  }
  return a;
}

/* d for the fp32 entry: the core after v, in one fp32 buffer */
static struct kernels_attention_dims att32_dims(const struct kernels_attention_dims *d) {
  struct kernels_attention_dims d32 = *d;
  d32.core = NULL;
  return d32;
}

static void widen(struct exec_stream *s, float *dst, const uint16_t *src, size_t n) {
  kc_from_bf16(dst, src, n, st_of(s));
}

static void round_into(struct exec_stream *s, uint16_t *dst, const float *src, size_t n) {
  PIPER_ASSERT(n <= INT_MAX);
  kc_to_bf16(dst, src, 1, (int)n, (int)n, st_of(s));
}

static void copy_f32(struct exec_stream *s, float *dst, const float *src, size_t n) {
  GError *e = NULL;
  if (n && !CUDA_CHECK(exec_cuda_kernel_ctx(s),
                       cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                       st_of(s)),
                       &e))
    exec_cuda_fail(s, e);
}

/* the bf16 saved of d widened into the fp32 layout s32 (q, k, v, lse, y) */
static void att16_widen(struct exec_stream *s, const struct kernels_attention_dims *d,
                        const float *saved, float *s32, bool core) {
  struct att16 a = att16_views(d, saved);
  widen(s, s32, a.qkv, a.n_qkv);
  if (!core)
    return;
  copy_f32(s, s32 + a.n_qkv, a.lse, a.n_lse);
  widen(s, s32 + a.n_qkv + a.n_lse, a.y, a.n_y);
}

/* s32's parts stored into d's bf16 saved: q, k, v when qkv, the core (lse, y) when core */
static void att16_store(struct exec_stream *s, const struct kernels_attention_dims *d,
                        float *saved, const float *s32, bool qkv, bool core) {
  struct att16 a = att16_views(d, saved);
  if (qkv)
    round_into(s, a.qkv, s32, a.n_qkv);
  if (core) {
    copy_f32(s, a.lse, s32 + a.n_qkv, a.n_lse);
    round_into(s, a.y, s32 + a.n_qkv + a.n_lse, a.n_y);
  }
}

/* fp32 scratch: n[i] floats each, one allocation; NULL when it failed (the stream failed) */
static float *scratch_parts(struct exec_stream *s, int k, const size_t *n, float **part) {
  size_t all = 0;
  for (int i = 0; i < k; i++)
    all += (n[i] + 3) / 4 * 4; /* 16-byte parts: the kernels' vector loads */
  float *x = scratch32(s, all);
  size_t at = 0;
  for (int i = 0; i < k; i++) {
    part[i] = x ? x + at : NULL;
    at += (n[i] + 3) / 4 * 4;
  }
  return x;
}

/* x [n] bf16 widened into fp32 scratch (free with cudaFreeAsync); NULL: the stream failed */
static float *widened(struct exec_stream *s, const float *x, size_t n) {
  float *x32 = scratch32(s, n);
  if (x32)
    widen(s, x32, C16(x), n);
  return x32;
}

/* h [n] widened into p[0], and p[1] for dh [n], holding dh widened when the entry accumulates
 * into it: the head's backward entries' scratch, one allocation */
static float *head_scratch(struct exec_stream *s, const float *h, const float *dh, size_t n,
                           bool accumulate, float *p[2]) {
  size_t m[2] = {n, n};
  float *x = scratch_parts(s, 2, m, p);
  if (x) {
    widen(s, p[0], C16(h), n);
    if (accumulate)
      widen(s, p[1], C16(dh), n);
  }
  return x;
}

static size_t att_rows(const struct kernels_attention_dims *d) {
  return (size_t)d->batch * d->seq * d->hidden;
}

static void a16_attention_forward(struct exec_stream *s, float *a, float *saved, const float *h,
                                  const float *params, const struct kernels_attention_dims *d) {
  struct kernels_attention_dims d32 = att32_dims(d);
  size_t n[3] = {att_rows(d), kernels_attention_saved_floats(&d32), att_rows(d)};
  float *p[3], *x = scratch_parts(s, 3, n, p);
  if (!x)
    return;
  widen(s, p[0], C16(h), n[0]);
  exec_cuda_kernels.attention_forward(s, p[2], p[1], p[0], params, &d32);
  att16_store(s, d, saved, p[1], true, true);
  round_into(s, A16(a), p[2], n[2]);
  cudaFreeAsync(x, st_of(s));
}

static void a16_attention_core_forward(struct exec_stream *s, float *saved,
                                       const struct kernels_attention_dims *d) {
  struct kernels_attention_dims d32 = att32_dims(d);
  size_t n[1] = {kernels_attention_saved_floats(&d32)};
  float *p[1], *x = scratch_parts(s, 1, n, p);
  if (!x)
    return;
  att16_widen(s, d, saved, p[0], false);
  exec_cuda_kernels.attention_core_forward(s, p[0], &d32);
  att16_store(s, d, saved, p[0], false, true);
  cudaFreeAsync(x, st_of(s));
}

/* The backward's fp32 scratch: p[0] da, p[1] saved (both widened), p[2] bwork, p[3] [T, C]
 * (dh in BI, h in BW); n their floats. NULL when it could not be had (the stream failed). */
static float *att16_backward_scratch(struct exec_stream *s, const struct kernels_attention_dims *d,
                                     const struct kernels_attention_dims *d32, const float *da,
                                     const float *saved, size_t n[4], float *p[4]) {
  n[0] = n[3] = att_rows(d);
  n[1] = kernels_attention_saved_floats(d32);
  n[2] = kernels_attention_bwork_floats(d32);
  float *x = scratch_parts(s, 4, n, p);
  if (x) {
    widen(s, p[0], C16(da), n[0]);
    att16_widen(s, d, saved, p[1], true);
  }
  return x;
}

static void a16_attention_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                         const float *da, const float *saved, const float *params,
                                         const struct kernels_attention_dims *d, bool accumulate) {
  struct kernels_attention_dims d32 = att32_dims(d);
  size_t n[4];
  float *p[4], *x = att16_backward_scratch(s, d, &d32, da, saved, n, p);
  if (!x)
    return;
  if (accumulate)
    widen(s, p[3], C16(dh), n[3]);
  exec_cuda_kernels.attention_backward_input(s, p[3], p[2], p[0], p[1], params, &d32, accumulate);
  round_into(s, A16(dh), p[3], n[3]);
  round_into(s, A16(bwork), p[2], n[2]);
  cudaFreeAsync(x, st_of(s));
}

static void a16_attention_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                          const float *da, const float *h, const float *saved,
                                          const struct kernels_attention_dims *d) {
  struct kernels_attention_dims d32 = att32_dims(d);
  size_t n[4];
  float *p[4], *x = att16_backward_scratch(s, d, &d32, da, saved, n, p);
  if (!x)
    return;
  widen(s, p[2], C16(bwork), n[2]);
  widen(s, p[3], C16(h), n[3]);
  exec_cuda_kernels.attention_backward_weight(s, dparams, p[2], p[0], p[3], p[1], &d32);
  cudaFreeAsync(x, st_of(s));
}

static void a16_attention_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                                   const float *da, const float *h, const float *saved,
                                   const float *params, const struct kernels_attention_dims *d,
                                   bool accumulate) {
  a16_attention_backward_input(s, dh, bwork, da, saved, params, d, accumulate);
  a16_attention_backward_weight(s, dparams, bwork, da, h, saved, d);
}

/* ---- the LM head and loss: saved is fp32 statistics alone (each row's max logit and 1 / sum
 * of exp); h and dh are bf16. The same adapter: h widened exactly (the fp32 entries round it
 * to bf16 for their GEMMs: the same operand), dh rounded once. */
static void a16_lm_head_loss_forward(struct exec_stream *s, float *loss, float *saved,
                                     const float *h, const int32_t *targets, const float *params,
                                     enum kernels_lm_head_layout layout, int T, int C, int V) {
  float *h32 = widened(s, h, (size_t)T * C);
  if (!h32)
    return;
  exec_cuda_kernels.lm_head_loss_forward(s, loss, saved, h32, targets, params, layout, T, C, V);
  cudaFreeAsync(h32, st_of(s));
}

static void a16_lm_head_loss_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                            const float *saved, const float *h,
                                            const int32_t *targets, const float *params,
                                            enum kernels_lm_head_layout layout, float dloss, int T,
                                            int C, int V, bool accumulate) {
  float *p[2], *x = head_scratch(s, h, dh, (size_t)T * C, accumulate, p);
  if (!x)
    return;
  exec_cuda_kernels.lm_head_loss_backward_input(s, p[1], bwork, saved, p[0], targets, params,
                                                layout, dloss, T, C, V, accumulate);
  round_into(s, A16(dh), p[1], (size_t)T * C);
  cudaFreeAsync(x, st_of(s));
}

static void a16_lm_head_loss_backward_weight(struct exec_stream *s, float *dparams,
                                             const float *bwork, const float *saved,
                                             const float *h, const int32_t *targets,
                                             const float *params, enum kernels_lm_head_layout layout,
                                             float dloss, int T, int C, int V) {
  float *h32 = widened(s, h, (size_t)T * C);
  if (!h32)
    return;
  exec_cuda_kernels.lm_head_loss_backward_weight(s, dparams, bwork, saved, h32, targets, params,
                                                 layout, dloss, T, C, V);
  cudaFreeAsync(h32, st_of(s));
}

/* the fused B (each tile's logits once for both gradients) on the widened h */
static void a16_lm_head_loss_backward(struct exec_stream *s, float *dh, float *dparams,
                                      float *bwork, const float *saved, const float *h,
                                      const int32_t *targets, const float *params,
                                      enum kernels_lm_head_layout layout, float dloss, int T, int C,
                                      int V, bool accumulate) {
  float *p[2], *x = head_scratch(s, h, dh, (size_t)T * C, accumulate, p);
  if (!x)
    return;
  exec_cuda_kernels.lm_head_loss_backward(s, p[1], dparams, bwork, saved, p[0], targets, params,
                                          layout, dloss, T, C, V, accumulate);
  round_into(s, A16(dh), p[1], (size_t)T * C);
  cudaFreeAsync(x, st_of(s));
}

/* ---- tensor parallelism's vocabulary slice [lo, lo + n): the embedding's rows on the bf16
 * kernels (a token outside the slice gets zeros and adds no gradient), the head's statistics
 * and backward as the LM head's adapter (dh is the slice's partial sum, summed over the TP
 * group in bf16 as Megatron sums it); the statistics' merge touches no activation. */
static void a16_tp_embedding_forward(struct exec_stream *s, float *x, const int32_t *tokens,
                                     const float *table, int T, int C, int lo, int n) {
  kc_bf16_embedding_forward(A16(x), tokens, table, T, C, lo, n, st_of(s));
}

static void a16_tp_embedding_backward(struct exec_stream *s, float *dtable, const float *dx,
                                      const int32_t *tokens, int T, int C, int lo, int n) {
  kc_bf16_embedding_backward(dtable, C16(dx), tokens, T, C, lo, n, st_of(s));
}

static void a16_tp_head_stats(struct exec_stream *s, float *stats, const float *h,
                              const int32_t *targets, const float *w,
                              enum kernels_lm_head_layout layout, int T, int C, int lo, int n) {
  float *h32 = widened(s, h, (size_t)T * C);
  if (!h32)
    return;
  exec_cuda_kernels.tp_head_stats(s, stats, h32, targets, w, layout, T, C, lo, n);
  cudaFreeAsync(h32, st_of(s));
}

static void a16_tp_head_backward(struct exec_stream *s, float *dh, float *dw, const float *saved,
                                 const float *h, const int32_t *targets, const float *w,
                                 enum kernels_lm_head_layout layout, float dloss, int T, int C,
                                 int lo, int n) {
  float *p[2], *x = head_scratch(s, h, dh, (size_t)T * C, false, p);
  if (!x)
    return;
  exec_cuda_kernels.tp_head_backward(s, p[1], dw, saved, p[0], targets, w, layout, dloss, T, C,
                                     lo, n);
  round_into(s, A16(dh), p[1], (size_t)T * C);
  cudaFreeAsync(x, st_of(s));
}

void exec_cuda_kernels_act_bf16(struct exec_kernels *k) {
  memset(k, 0, sizeof *k);
  /* no activation in these: bytes, the fp32 parameters, gradients and moments, or the LM
   * head's row statistics (tp_head_combine). `fill` and
   * `add` are not here: the runner uses them on fp32 parameter gradients and on activations
   * alike, so they need activation twins in the op list first. */
  const struct exec_kernels *fp32 = &exec_cuda_kernels;
  k->copy = fp32->copy;
  k->sum_squares = fp32->sum_squares;
  k->scale = fp32->scale;
  k->adamw_step = fp32->adamw_step;
  k->adamw_multi = fp32->adamw_multi;
  k->tp_head_combine = fp32->tp_head_combine;
  /* converted: bf16 activations in and out, fp32 arithmetic and statistics */
  k->residual_add_forward = a16_residual_add_forward;
  k->residual_add_backward = a16_residual_add_backward;
  k->embedding_forward = a16_embedding_forward;
  k->embedding_backward_weight = a16_embedding_backward_weight;
  k->embedding_backward = a16_embedding_backward_weight;
  k->rmsnorm_forward = a16_rmsnorm_forward;
  k->residual_rmsnorm_forward = a16_residual_rmsnorm_forward;
  k->rmsnorm_backward_input = a16_rmsnorm_backward_input;
  k->rmsnorm_backward_weight = a16_rmsnorm_backward_weight;
  k->rmsnorm_backward = a16_rmsnorm_backward;
  k->mlp_forward = a16_mlp_forward;
  k->mlp_backward_input = a16_mlp_backward_input;
  k->mlp_backward_weight = a16_mlp_backward_weight;
  k->mlp_backward = a16_mlp_backward;
  k->attention_forward = a16_attention_forward;
  k->attention_backward_input = a16_attention_backward_input;
  k->attention_backward_weight = a16_attention_backward_weight;
  k->attention_backward = a16_attention_backward;
  k->attention_core_forward = a16_attention_core_forward;
  k->lm_head_loss_forward = a16_lm_head_loss_forward;
  k->lm_head_loss_backward_input = a16_lm_head_loss_backward_input;
  k->lm_head_loss_backward_weight = a16_lm_head_loss_backward_weight;
  k->lm_head_loss_backward = a16_lm_head_loss_backward;
  k->tp_embedding_forward = a16_tp_embedding_forward;
  k->tp_embedding_backward = a16_tp_embedding_backward;
  k->tp_head_stats = a16_tp_head_stats;
  k->tp_head_backward = a16_tp_head_backward;
}
