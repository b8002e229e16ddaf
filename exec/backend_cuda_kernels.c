/* backend_cuda_kernels: the cuda backend's kernel table. Each model op is composed, step for
 * step, like its host reference in kernels/ (*.c): the same buffers (saved, bwork, scratch in the
 * same layouts), GEMMs through cuBLASLt (backend_cuda_gemm.c) and the elementwise and row-wise
 * steps from kernels/cuda.cu. Memory is fp32 (the master copy); GEMMs of bf16 models read bf16 operands
 * on the tensor cores with fp32 accumulation and fp32 output (CUBLAS_COMPUTE_32F): a weight
 * matrix of the optimizer's store from its cached bf16 copy (one per matrix, made by its first
 * GEMM after each write: once per step; exec/gpu_weights.h), the other operand rounded to
 * nearest even per GEMM; fp32 models stay fp32. A kernel entry cannot return an error: a
 * failure fails the stream it was enqueued on, and the runner reports it. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "../kernels/fp8.h"
#include "../kernels/kernels_cuda.h"
#include "cuda-impl.h"
#include "cuda_cudnn.h"
#include "gpu_layout.h"

static struct cuda_context *kernel_ctx(struct exec_stream *s) {
  return exec_cuda_kernel_ctx(s);
}

static cudaStream_t st_of(struct exec_stream *s) {
  return exec_cuda_st_of(s);
}

/* The op list's DIRECT ops (kernels/ops.def): their launchers as they are, on the task's
 * stream. */
#define K_DIRECT(name, params, args)                                                               \
  static void k_##name(struct exec_stream *s, EXEC_UNPAREN params) {                               \
    kc_##name(EXEC_UNPAREN args, st_of(s));                                                        \
  }
#define K_OWN(name, params, args)
#define KERNEL_OP(name, use, cuda, params, args) K_##cuda(name, params, args)
#include "../kernels/ops.def"
#undef KERNEL_OP
#undef K_DIRECT
#undef K_OWN

/* a GEMM of fp32 operands (cuda-impl.h) */
#define gemm exec_cuda_gemm

/* ---- simple entries --------------------------------------------------------------------- */

void *exec_cuda_stream_scratch(struct exec_stream *s, size_t n) {
  void *x = NULL;
  GError *e = NULL;
  if (!CUDA_CHECK(kernel_ctx(s), cudaMallocAsync(&x, n ? n : 1, st_of(s)), &e)) {
    exec_cuda_fail(s, e);
    return NULL;
  }
  return x;
}

static void k_fill(struct exec_stream *s, float *x, float value, size_t n) {
  exec_cuda_written(kernel_ctx(s), x, n * sizeof(float));
  kc_fill(x, value, n, st_of(s));
}

static void k_copy(struct exec_stream *s, void *dst, const void *src, size_t bytes) {
  GError *e = NULL;
  struct cuda_context *b = kernel_ctx(s);
  exec_cuda_written(b, dst, bytes);
  if (bytes &&
      !CUDA_CHECK(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st_of(s)), &e))
    exec_cuda_fail(s, e);
}

static void k_add(struct exec_stream *s, float *y, const float *x, size_t n) {
  kc_add(y, x, n, true, st_of(s));
}

static void k_embedding_forward(struct exec_stream *s, float *x, const int32_t *tokens,
                                const float *params, int T, int V, int C) {
  (void)V;
  kc_embedding_forward(x, tokens, params, T, C, st_of(s));
}

static void k_embedding_backward_weight(struct exec_stream *s, float *dparams, const float *dx,
                                        const int32_t *tokens, int T, int V, int C) {
  (void)V;
  int32_t *chains = exec_cuda_stream_scratch(s, 2 * (size_t)T * sizeof(int32_t));
  if (!chains)
    return;
  kc_embedding_backward(dparams, dx, tokens, T, C, chains, st_of(s));
  cudaFreeAsync(chains, st_of(s));
}

static void k_rmsnorm_backward(struct exec_stream *s, float *dx, float *dparams, const float *dh,
                               const float *x, const float *saved, const float *params, int T,
                               int C, bool accumulate) {
  k_rmsnorm_backward_input(s, dx, dh, x, saved, params, T, C, accumulate);
  k_rmsnorm_backward_weight(s, dparams, dh, x, saved, T, C);
}

static void k_residual_add_forward(struct exec_stream *s, float *x, const float *y, size_t n) {
  kc_add(x, y, n, true, st_of(s));
}

static void k_residual_add_backward(struct exec_stream *s, float *dy, const float *dx, size_t n,
                                    bool accumulate) {
  kc_add(dy, dx, n, accumulate, st_of(s));
}

/* ---- MLP (kernels/mlp.c) ------------------------------------------------------------------ */

/* bf16 models keep act, dg and du, which only GEMMs read, in bf16 inside the op's fp32
 * buffers, written so by the SwiGLU kernels (no fp32 copy to write and convert again): act in
 * the first half of saved's act slot; dg, du in bwork's du slot, after the fp32 dact (the
 * down projection's gradient) in its dg slot. fp32 models keep the host's layout. */
/* The host kernels' layout (kernels_mlp_views), and the bf16 forms this backend keeps in it:
 * act in bf16 over act's own floats, dg and du in bf16 over du's (dact, the fp32 gradient of
 * act, in dg's place until the SwiGLU backward). */
struct mlp_views {
  const float *wg, *wu, *wd;
  float *g, *u, *act, *dact, *du;
  uint16_t *act16, *dg16, *du16;
};

static struct mlp_views mlp_views(const float *params, const float *saved, const float *bwork,
                                  int T, int C, int F) {
  struct kernels_mlp_views k = kernels_mlp_views(params, saved, bwork, T, C, F);
  struct mlp_views w = {k.wg, k.wu, k.wd, k.g, k.u, k.act, k.dg, k.du, NULL, NULL, NULL};
  if (saved)
    w.act16 = (uint16_t *)(void *)w.act;
  if (bwork) {
    w.dg16 = (uint16_t *)(void *)w.du;
    w.du16 = w.dg16 + (size_t)T * F;
  }
  return w;
}

/* A bf16 copy of activation x [rows, cols] in stream-ordered scratch, for the GEMMs of one op
 * that read it (converted once rather than per GEMM); free with cudaFreeAsync. */
static uint16_t *bf16_once(struct exec_stream *s, const float *x, int rows, int cols) {
  uint16_t *x16 = exec_cuda_stream_scratch(s, (size_t)rows * cols * sizeof(uint16_t));
  if (x16)
    kc_to_bf16(x16, x, rows, cols, cols, st_of(s));
  return x16;
}

static void mlp_forward_bf16(struct exec_stream *s, float *m, const struct mlp_views *w,
                             const float *h, int T, int C, int F) {
  uint16_t *h16 = bf16_once(s, h, T, C);
  if (!h16)
    return;
  exec_cuda_gemm_pre(s, GEMM_A16, false, false, T, F, C, 1.0f, h16, C, w->wg, F, 0.0f, w->g, F);
  exec_cuda_gemm_pre(s, GEMM_A16, false, false, T, F, C, 1.0f, h16, C, w->wu, F, 0.0f, w->u, F);
  cudaFreeAsync(h16, st_of(s));
  kc_swiglu_forward_bf16(w->act16, w->g, w->u, (size_t)T * F, st_of(s));
  exec_cuda_gemm_pre(s, GEMM_A16, false, false, T, C, F, 1.0f, w->act16, F, w->wd, C, 0.0f, m, C);
}

static void k_mlp_forward(struct exec_stream *s, float *m, float *saved, const float *h,
                          const float *params, int T, int C, int F) {
  struct mlp_views w = mlp_views(params, saved, NULL, T, C, F);
  if (kernel_ctx(s)->bf16_gemm) {
    mlp_forward_bf16(s, m, &w, h, T, C, F);
    return;
  }
  gemm(s, false, false, T, F, C, 1.0f, h, C, w.wg, F, 0.0f, w.g, F);
  gemm(s, false, false, T, F, C, 1.0f, h, C, w.wu, F, 0.0f, w.u, F);
  kc_swiglu_forward(w.act, w.g, w.u, (size_t)T * F, st_of(s));
  gemm(s, false, false, T, C, F, 1.0f, w.act, F, w.wd, C, 0.0f, m, C);
}

static void k_mlp_backward_input(struct exec_stream *s, float *dh, float *bwork, const float *dm,
                                 const float *saved, const float *params, int T, int C, int F,
                                 bool accumulate) {
  struct mlp_views w = mlp_views(params, saved, bwork, T, C, F);
  float beta = accumulate ? 1.0f : 0.0f;
  gemm(s, false, true, T, F, C, 1.0f, dm, C, w.wd, C, 0.0f, w.dact, F);
  if (kernel_ctx(s)->bf16_gemm) {
    kc_swiglu_backward_bf16(w.dg16, w.du16, w.dact, w.g, w.u, (size_t)T * F, st_of(s));
    exec_cuda_gemm_pre(s, GEMM_A16, false, true, T, C, F, 1.0f, w.dg16, F, w.wg, F, beta, dh, C);
    exec_cuda_gemm_pre(s, GEMM_A16, false, true, T, C, F, 1.0f, w.du16, F, w.wu, F, 1.0f, dh, C);
    return;
  }
  float *dg = w.dact; /* in place over dact */
  kc_swiglu_backward(dg, w.du, w.dact, w.g, w.u, (size_t)T * F, st_of(s));
  gemm(s, false, true, T, C, F, 1.0f, dg, F, w.wg, F, beta, dh, C);
  gemm(s, false, true, T, C, F, 1.0f, w.du, F, w.wu, F, 1.0f, dh, C);
}

static void k_mlp_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                  const float *dm, const float *h, const float *saved, int T, int C,
                                  int F) {
  struct mlp_views w = mlp_views(NULL, saved, bwork, T, C, F);
  float *dwg = dparams, *dwu = dwg + (size_t)C * F, *dwd = dwu + (size_t)C * F;
  if (kernel_ctx(s)->bf16_gemm) {
    uint16_t *h16 = bf16_once(s, h, T, C);
    if (!h16)
      return;
    unsigned both = GEMM_A16 | GEMM_B16;
    exec_cuda_gemm_pre(s, both, true, false, C, F, T, 1.0f, h16, C, w.dg16, F, 1.0f, dwg, F);
    exec_cuda_gemm_pre(s, both, true, false, C, F, T, 1.0f, h16, C, w.du16, F, 1.0f, dwu, F);
    exec_cuda_gemm_pre(s, GEMM_A16, true, false, F, C, T, 1.0f, w.act16, F, dm, C, 1.0f, dwd, C);
    cudaFreeAsync(h16, st_of(s));
    return;
  }
  const float *dg = w.dact;
  gemm(s, true, false, C, F, T, 1.0f, h, C, dg, F, 1.0f, dwg, F);
  gemm(s, true, false, C, F, T, 1.0f, h, C, w.du, F, 1.0f, dwu, F);
  gemm(s, true, false, F, C, T, 1.0f, w.act, F, dm, C, 1.0f, dwd, C);
}

static void k_mlp_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                           const float *dm, const float *h, const float *saved, const float *params,
                           int T, int C, int F, bool accumulate) {
  k_mlp_backward_input(s, dh, bwork, dm, saved, params, T, C, F, accumulate);
  k_mlp_backward_weight(s, dparams, bwork, dm, h, saved, T, C, F);
}

/* ---- attention (kernels/attention.c's layout: saved q, k, v, the log-sum-exp of each row of
 * scores [B,H,S] and y, the core's lse and y in d->core when set). The core runs per
 * (sequence, head) GEMMs, a head's S x S probabilities in stream-ordered scratch, recomputed
 * from q, k and lse in the backward (fp32 models; PIPER_CUDA_ATTENTION=unfused); or fused
 * (kernels/flash_attention.cu: no [S, S] memory at all), for bf16 models with a head size it
 * supports (exec_gpu_attention_fused). -------------------------------------------------------- */

/* RoPE at the rows' positions: the whole sequence's, or under context parallelism the rank's
 * chunks' global ones (kernels/attention.c's rope) */
static void rope(struct exec_stream *s, float *x, const struct kernels_attention_dims *d, int heads,
                 bool inverse) {
  const struct kernels_rope_scaling *sc = d->rope_scaling;
  int cp = d->cp > 1 ? d->cp : 1;
  kc_rope_cp(x, d->batch, d->seq, cp, cp > 1 ? d->cp_rank : 0, heads, d->head_dim, d->rope_theta,
             sc ? sc->factor : 0.0f, sc ? sc->low_freq_factor : 0.0f,
             sc ? sc->high_freq_factor : 0.0f, sc ? sc->original_max_position_embeddings : 0,
             inverse, st_of(s));
}

/* Offsets of sequence b, query head hh: into q/y rows (HD wide), k/v rows (KD wide) and lse. */
static void head_offsets(const struct kernels_attention_views *w,
                         const struct kernels_attention_dims *d, int b, int hh, size_t *qoff,
                         size_t *koff, size_t *loff) {
  int S = d->seq, D = d->head_dim, group = d->heads / d->kv_heads;
  *qoff = (size_t)b * S * w->HD + (size_t)hh * D;
  *koff = (size_t)b * S * w->KD + (size_t)(hh / group) * D;
  *loff = ((size_t)b * d->heads + hh) * S;
}

/* Whether the core runs fused (exec_gpu_attention_fused: the faster core): for bf16 models (the
 * fused kernel rounds its operands to bf16 exactly where the unfused bf16 GEMMs do) with a
 * head size it has a variant for. */
static bool attention_fused(struct exec_stream *s, const struct kernels_attention_dims *d) {
  const struct cuda_context *b = kernel_ctx(s);
  bool fusable = b->bf16_gemm && kc_flash_attention_supported(d->head_dim, d->heads, d->kv_heads);
  return exec_gpu_attention_fused(b->attention, fusable);
}

/* lse, y <- q, k, v in one fused pass; its scratch (the operands' bf16 copies) stream-ordered. */
static void attention_fused_forward(struct exec_stream *s, const struct kernels_attention_views *w,
                                    const struct kernels_attention_dims *d) {
  void *scratch =
      exec_cuda_stream_scratch(s, kc_flash_attention_scratch_bytes(d->batch, d->seq, d->heads, d->kv_heads,
                                                         d->head_dim, false));
  if (!scratch)
    return;
  GError *e = NULL;
  if (!CUDA_CHECK(kernel_ctx(s),
                  kc_flash_attention_forward(w->y, w->lse, scratch, w->q, w->k, w->v, d->batch,
                                             d->seq, d->heads, d->kv_heads, d->head_dim, st_of(s)),
                  &e))
    exec_cuda_fail(s, e);
  cudaFreeAsync(scratch, st_of(s));
}

/* The whole sequence (no context-parallel chunk yet: its offsets go in q_offset, kv_offset). */
static struct exec_cudnn_sdpa_shape cudnn_shape(const struct kernels_attention_dims *d) {
  struct exec_cudnn_sdpa_shape sh = {d->batch, d->seq, d->seq, d->heads, d->kv_heads,
                                     d->head_dim, 0, 0};
  return sh;
}

/* Whether cuDNN's core runs (exec_gpu_attention_cudnn): for bf16 models, as the own fused
 * kernel (cuDNN computes in bf16 too), where the build has cuDNN and the shape fits. */
static bool attention_cudnn(struct exec_stream *s, const struct kernels_attention_dims *d) {
  const struct cuda_context *b = kernel_ctx(s);
  struct exec_cudnn_sdpa_shape sh = cudnn_shape(d);
  bool usable = b->bf16_gemm && !b->cudnn_off && exec_cudnn_sdpa_built() &&
                exec_cudnn_sdpa_supported(&sh);
  return exec_gpu_attention_cudnn(b->attention, usable);
}

/* cuDNN could not run (e is why): forced (PIPER_CUDA_ATTENTION=cudnn), the stream fails with
 * e (true: handled); in auto mode the own kernels take this call and every later one, said
 * once (false). */
bool exec_cuda_cudnn_refused(struct exec_stream *s, GError *e) {
  struct cuda_context *b = kernel_ctx(s);
  if (b->attention == EXEC_GPU_ATTENTION_CUDNN) {
    exec_cuda_fail(s, e);
    return true;
  }
  g_printerr("piper-exec: cuda: %s: the own attention kernels run instead\n", e->message);
  g_error_free(e);
  b->cudnn_off = true;
  return false;
}

/* lse, y <- q, k, v through cuDNN; false when the own kernels must run instead */
static bool attention_cudnn_forward(struct exec_stream *s, const struct kernels_attention_views *w,
                                    const struct kernels_attention_dims *d) {
  struct cuda_context *b = kernel_ctx(s);
  struct exec_cudnn_sdpa_shape sh = cudnn_shape(d);
  GError *e = NULL;
  if (!b->cudnn)
    b->cudnn = exec_cudnn_sdpa_new(&e);
  if (b->cudnn && exec_cudnn_sdpa_forward(b->cudnn, &sh, w->y, w->lse, w->q, w->k, w->v,
                                          st_of(s), &e))
    return true;
  return exec_cuda_cudnn_refused(s, e);
}

/* dq, dk, dv <- q, k, v, y, dy, lse through cuDNN; false as the forward */
static bool attention_cudnn_backward(struct exec_stream *s, const struct kernels_attention_views *w,
                                     const struct kernels_attention_dims *d) {
  struct cuda_context *b = kernel_ctx(s);
  struct exec_cudnn_sdpa_shape sh = cudnn_shape(d);
  GError *e = NULL;
  if (!b->cudnn)
    b->cudnn = exec_cudnn_sdpa_new(&e);
  if (b->cudnn && exec_cudnn_sdpa_backward(b->cudnn, &sh, w->dq, w->dk, w->dv, w->q, w->k, w->v,
                                           w->y, w->dy, w->lse, st_of(s), &e))
    return true;
  return exec_cuda_cudnn_refused(s, e);
}

/* lse, y <- q, k, v: cuDNN's fused SDPA, the own fused kernel, or per head: scores, softmax,
 * values. */
static void attention_core(struct exec_stream *s, const struct kernels_attention_views *w,
                           const struct kernels_attention_dims *d) {
  int S = d->seq, D = d->head_dim, HD = (int)w->HD, KD = (int)w->KD;
  if (attention_cudnn(s, d) && attention_cudnn_forward(s, w, d))
    return;
  if (attention_fused(s, d)) {
    attention_fused_forward(s, w, d);
    return;
  }
  float scale = 1.0f / sqrtf((float)D);
  float *p = exec_cuda_stream_scratch(s, (size_t)S * S * sizeof(float)); /* one head's scores */
  if (!p)
    return;
  bool fp8 = exec_cuda_fp8_enter(s, EXEC_OP_attention_core_forward); /* the core stays bf16 */
  for (int b = 0; b < d->batch; b++)
    for (int hh = 0; hh < d->heads; hh++) {
      size_t qo, ko, lo;
      head_offsets(w, d, b, hh, &qo, &ko, &lo);
      gemm(s, false, true, S, S, D, 1.0f, w->q + qo, HD, w->k + ko, KD, 0.0f, p, S);
      kc_causal_softmax(p, w->lse + lo, S, S, scale, st_of(s));
      gemm(s, false, false, S, D, S, 1.0f, p, S, w->v + ko, KD, 0.0f, w->y + qo, HD);
    }
  exec_cuda_fp8_leave(s, fp8);
  cudaFreeAsync(p, st_of(s));
}

/* q, k, v of saved <- h (RoPE by d->cp): the attention's first part */
static void k_attention_qkv_forward(struct exec_stream *s, float *saved, const float *h,
                                    const float *params, const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, NULL);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD;
  /* bf16 models: h converted once for its three projections */
  uint16_t *h16 = kernel_ctx(s)->bf16_gemm ? bf16_once(s, h, T, C) : NULL;
  const void *x = h16 ? (const void *)h16 : (const void *)h;
  unsigned pre = h16 ? GEMM_A16 : 0;
  exec_cuda_gemm_pre(s, pre, false, false, T, HD, C, 1.0f, x, C, w.wq, HD, 0.0f, w.q, HD);
  exec_cuda_gemm_pre(s, pre, false, false, T, KD, C, 1.0f, x, C, w.wk, KD, 0.0f, w.k, KD);
  exec_cuda_gemm_pre(s, pre, false, false, T, KD, C, 1.0f, x, C, w.wv, KD, 0.0f, w.v, KD);
  if (h16)
    cudaFreeAsync(h16, st_of(s));
  rope(s, w.q, d, d->heads, false);
  rope(s, w.k, d, d->kv_heads, false);
}

/* a = y wo: the last part */
static void k_attention_out_forward(struct exec_stream *s, float *a, const float *saved,
                                    const float *params, const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, NULL);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD;
  gemm(s, false, false, T, C, HD, 1.0f, w.y, HD, w.wo, C, 0.0f, a, C);
}

static void k_attention_forward(struct exec_stream *s, float *a, float *saved, const float *h,
                                const float *params, const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, NULL);
  k_attention_qkv_forward(s, saved, h, params, d);
  attention_core(s, &w, d);
  k_attention_out_forward(s, a, saved, params, d);
}

/* Selective recomputation's rerun: the same core on the same q, k, v (deterministic either
 * way, so lse and y are the forward's bit for bit). */
static void k_attention_core_forward(struct exec_stream *s, float *saved,
                                     const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, NULL, saved, NULL);
  attention_core(s, &w, d);
}

/* dq, dk, dv <- q, k, v, y, dy, lse in one fused pass (dk, dv written, not accumulated); its
 * scratch (bf16 operands, the softmax gradient's row sums) stream-ordered. */
static void attention_fused_backward(struct exec_stream *s, const struct kernels_attention_views *w,
                                     const struct kernels_attention_dims *d) {
  void *scratch =
      exec_cuda_stream_scratch(s, kc_flash_attention_scratch_bytes(d->batch, d->seq, d->heads, d->kv_heads,
                                                         d->head_dim, true));
  if (!scratch)
    return;
  GError *e = NULL;
  if (!CUDA_CHECK(kernel_ctx(s),
                  kc_flash_attention_backward(w->dq, w->dk, w->dv, scratch, w->q, w->k, w->v, w->y,
                                              w->dy, w->lse, d->batch, d->seq, d->heads,
                                              d->kv_heads, d->head_dim, st_of(s)),
                  &e))
    exec_cuda_fail(s, e);
  cudaFreeAsync(scratch, st_of(s));
}

/* p, ds: S*S floats of scratch each, stream-ordered (cudaMallocAsync); p is recomputed per
 * head from q, k and the forward's lse. */
static void attention_heads_backward(struct exec_stream *s, const struct kernels_attention_views *w,
                                     const struct kernels_attention_dims *d, float *p, float *ds) {
  int S = d->seq, D = d->head_dim, HD = (int)w->HD, KD = (int)w->KD;
  float scale = 1.0f / sqrtf((float)D);
  bool fp8 = exec_cuda_fp8_enter(s, EXEC_OP_attention_core_forward); /* the core stays bf16 */
  for (int b = 0; b < d->batch; b++)
    for (int hh = 0; hh < d->heads; hh++) {
      size_t qo, ko, lo;
      head_offsets(w, d, b, hh, &qo, &ko, &lo);
      gemm(s, false, true, S, S, D, 1.0f, w->q + qo, HD, w->k + ko, KD, 0.0f, p, S);
      kc_causal_softmax_from_lse(p, w->lse + lo, S, S, scale, st_of(s));
      gemm(s, false, true, S, S, D, 1.0f, w->dy + qo, HD, w->v + ko, KD, 0.0f, ds, S);
      kc_softmax_backward(ds, p, S, S, scale, st_of(s));
      gemm(s, false, false, S, D, S, 1.0f, ds, S, w->k + ko, KD, 0.0f, w->dq + qo, HD);
      gemm(s, true, false, S, D, S, 1.0f, ds, S, w->q + qo, HD, 1.0f, w->dk + ko, KD);
      gemm(s, true, false, S, D, S, 1.0f, p, S, w->dy + qo, HD, 1.0f, w->dv + ko, KD);
    }
  exec_cuda_fp8_leave(s, fp8);
}

/* dy of bwork = da wo^T */
static void k_attention_out_backward_input(struct exec_stream *s, float *bwork, const float *da,
                                           const float *params,
                                           const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, NULL, bwork);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD;
  gemm(s, false, true, T, HD, C, 1.0f, da, C, w.wo, C, 0.0f, w.dy, HD);
}

/* dq, dk rotated back; dh (= or +=) <- dq wq^T + dk wk^T + dv wv^T */
static void k_attention_qkv_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                           const float *params,
                                           const struct kernels_attention_dims *d,
                                           bool accumulate) {
  struct kernels_attention_views w = kernels_attention_views(d, params, NULL, bwork);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD;
  rope(s, w.dq, d, d->heads, true);
  rope(s, w.dk, d, d->kv_heads, true);
  gemm(s, false, true, T, C, HD, 1.0f, w.dq, HD, w.wq, HD, accumulate ? 1.0f : 0.0f, dh, C);
  gemm(s, false, true, T, C, KD, 1.0f, w.dk, KD, w.wk, KD, 1.0f, dh, C);
  gemm(s, false, true, T, C, KD, 1.0f, w.dv, KD, w.wv, KD, 1.0f, dh, C);
}

static void k_attention_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                       const float *da, const float *saved, const float *params,
                                       const struct kernels_attention_dims *d, bool accumulate) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, bwork);
  int S = d->seq;
  cudaStream_t cs = st_of(s);
  k_attention_out_backward_input(s, bwork, da, params, d);
  if (attention_cudnn(s, d) && attention_cudnn_backward(s, &w, d)) {
    /* dq, dk, dv written */
  } else if (attention_fused(s, d)) {
    attention_fused_backward(s, &w, d);
  } else {
    kc_fill(w.dk, 0.0f, w.T * w.KD, cs);
    kc_fill(w.dv, 0.0f, w.T * w.KD, cs);
    size_t head = (size_t)S * S * sizeof(float); /* one head's scores */
    float *p = exec_cuda_stream_scratch(s, head), *ds = p ? exec_cuda_stream_scratch(s, head) : NULL;
    if (!ds) {
      if (p)
        cudaFreeAsync(p, cs);
      return;
    }
    attention_heads_backward(s, &w, d, p, ds);
    cudaFreeAsync(ds, cs);
    cudaFreeAsync(p, cs);
  }
  k_attention_qkv_backward_input(s, dh, bwork, params, d, accumulate);
}

static void k_attention_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                        const float *da, const float *h, const float *saved,
                                        const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, NULL, saved, bwork);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD;
  float *dwq = dparams, *dwk = dwq + (size_t)C * HD, *dwv = dwk + (size_t)C * KD;
  float *dwo = dwv + (size_t)C * KD;
  uint16_t *h16 = kernel_ctx(s)->bf16_gemm ? bf16_once(s, h, T, C) : NULL;
  const void *x = h16 ? (const void *)h16 : (const void *)h;
  unsigned pre = h16 ? GEMM_A16 : 0;
  exec_cuda_gemm_pre(s, pre, true, false, C, HD, T, 1.0f, x, C, w.dq, HD, 1.0f, dwq, HD);
  exec_cuda_gemm_pre(s, pre, true, false, C, KD, T, 1.0f, x, C, w.dk, KD, 1.0f, dwk, KD);
  exec_cuda_gemm_pre(s, pre, true, false, C, KD, T, 1.0f, x, C, w.dv, KD, 1.0f, dwv, KD);
  if (h16)
    cudaFreeAsync(h16, st_of(s));
  gemm(s, true, false, HD, C, T, 1.0f, w.y, HD, da, C, 1.0f, dwo, C);
}

static void k_attention_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                                 const float *da, const float *h, const float *saved,
                                 const float *params, const struct kernels_attention_dims *d,
                                 bool accumulate) {
  k_attention_backward_input(s, dh, bwork, da, saved, params, d, accumulate);
  k_attention_backward_weight(s, dparams, bwork, da, h, saved, d);
}

/* ---- router, dispatch, combine (kernels/moe.c) --------------------------------------------- */

static void k_router_forward(struct exec_stream *s, int32_t *ids, float *weights, float *saved,
                             const float *h, const float *params, int T, int C, int E, int K) {
  gemm(s, false, false, T, E, C, 1.0f, h, C, params, E, 0.0f, saved, E); /* logits into probs */
  kc_router_topk(ids, weights, saved, T, E, K, st_of(s));
}

static void k_router_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                    const float *dweights, const int32_t *ids, const float *weights,
                                    const float *saved, const float *params, int T, int C, int E,
                                    int K, bool accumulate) {
  kc_router_dlogits(bwork, dweights, ids, weights, saved, T, E, K, st_of(s));
  gemm(s, false, true, T, C, E, 1.0f, bwork, E, params, E, accumulate ? 1.0f : 0.0f, dh, C);
}

static void k_router_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                     const float *h, int T, int C, int E) {
  gemm(s, true, false, C, E, T, 1.0f, h, C, bwork, E, 1.0f, dparams, E);
}

static void k_router_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                              const float *dweights, const int32_t *ids, const float *weights,
                              const float *saved, const float *h, const float *params, int T, int C,
                              int E, int K, bool accumulate) {
  k_router_backward_input(s, dh, bwork, dweights, ids, weights, saved, params, T, C, E, K,
                          accumulate);
  k_router_backward_weight(s, dparams, bwork, h, T, C, E);
}

/* ---- expert FFN (kernels/moe.c): rows grouped by expert, as the host groups them ----------- */

/* Rows by expert, experts ascending, rows ascending within one: order (on the device) and the
 * count per expert (on the host, the GEMMs' sizes). This reads row_expert back: the wait for
 * routing counts that MoE needs (the plan's all-to-all already waited for the counts). */
struct expert_groups {
  int32_t *order; /* device, n_rows, stream-ordered (cudaFreeAsync) */
  int *count;     /* host, e_count */
};

static bool expert_groups(struct exec_stream *s, const int32_t *row_expert, int n_rows, int e_first,
                          int e_count, bool need_order, struct expert_groups *g) {
  struct cuda_context *b = kernel_ctx(s);
  cudaStream_t cs = st_of(s);
  GError *e = NULL;
  int32_t *host = g_new(int32_t, n_rows ? n_rows : 1);
  g->count = g_new0(int, e_count ? e_count : 1);
  g->order = NULL;
  bool ok =
      !n_rows || (CUDA_CHECK(b,
                             cudaMemcpyAsync(host, row_expert, (size_t)n_rows * sizeof(int32_t),
                                             cudaMemcpyDeviceToHost, cs),
                             &e) &&
                  CUDA_CHECK(b, cudaStreamSynchronize(cs), &e));
  for (int r = 0; ok && r < n_rows; r++) {
    int x = host[r] - e_first;
    if (x < 0 || x >= e_count)
      ok = piper_runtime_error(&e,
                               "rank %u GPU %d: expert FFN row %d routed to expert %d, "
                               "outside this rank's [%d, %d)",
                               b->rank, b->device, r, host[r], e_first, e_first + e_count);
    else
      g->count[x]++;
  }
  if (ok && need_order && n_rows) {
    int32_t *order = g_new(int32_t, n_rows);
    int *at = g_new0(int, e_count + 1);
    for (int x = 0; x < e_count; x++)
      at[x + 1] = at[x] + g->count[x];
    for (int r = 0; r < n_rows; r++)
      order[at[host[r] - e_first]++] = r;
    ok = CUDA_CHECK(b, cudaMallocAsync((void **)&g->order, (size_t)n_rows * sizeof(int32_t), cs),
                    &e) &&
         CUDA_CHECK(b,
                    cudaMemcpyAsync(g->order, order, (size_t)n_rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, cs),
                    &e);
    g_free(order);
    g_free(at);
  }
  g_free(host);
  if (!ok) {
    exec_cuda_fail(s, e);
    g_free(g->count);
    g->count = NULL;
  }
  return ok;
}

static void expert_groups_free(struct exec_stream *s, struct expert_groups *g) {
  if (g->order)
    cudaFreeAsync(g->order, st_of(s));
  g_free(g->count);
}

/* The packed rows' routing weights in saved (kernels.h, EXPERT_FFN): after act, or after u
 * when act lives apart */
static float *saved_weights(const float *saved, const float *act_buf, size_t n, int F) {
  return (float *)saved + (act_buf ? 2 : 3) * n * F;
}

/* and their inputs: apart (xs_buf), or last in saved */
static float *saved_inputs(const float *saved, const float *xs_buf, const float *act_buf, size_t n,
                           int F) {
  return xs_buf ? (float *)xs_buf : saved_weights(saved, act_buf, n, F) + n;
}

static void k_expert_ffn_forward(struct exec_stream *s, float *out, float *saved, float *act_buf,
                                 float *xs_buf, float *scratch, const float *in,
                                 const int32_t *row_expert, const float *row_weight, int n_rows,
                                 const float *params, int e_first, int e_count, int C, int F) {
  struct expert_groups eg;
  if (!expert_groups(s, row_expert, n_rows, e_first, e_count, true, &eg))
    return;
  size_t n = (size_t)n_rows, per = 3 * (size_t)C * F;
  float *g = saved, *u = g + n * F, *act = act_buf ? act_buf : u + n * F;
  float *ws = saved_weights(saved, act_buf, n, F), *xs = saved_inputs(saved, xs_buf, act_buf, n, F);
  kc_gather_rows(xs, in, eg.order, n_rows, C, st_of(s));
  kc_gather_rows(ws, row_weight, eg.order, n_rows, 1, st_of(s));
  size_t off = 0;
  for (int x = 0; x < e_count; x++) {
    int cnt = eg.count[x];
    if (cnt == 0)
      continue;
    const float *wg = params + (size_t)x * per, *wu = wg + (size_t)C * F, *wd = wu + (size_t)C * F;
    gemm(s, false, false, cnt, F, C, 1.0f, xs + off * C, C, wg, F, 0.0f, g + off * F, F);
    gemm(s, false, false, cnt, F, C, 1.0f, xs + off * C, C, wu, F, 0.0f, u + off * F, F);
    kc_swiglu_forward(act + off * F, g + off * F, u + off * F, (size_t)cnt * F, st_of(s));
    kc_rows_scale(act + off * F, ws + off, cnt, F, st_of(s));
    gemm(s, false, false, cnt, C, F, 1.0f, act + off * F, F, wd, C, 0.0f, scratch + off * C, C);
    off += (size_t)cnt;
  }
  kc_scatter_rows(out, scratch, eg.order, n_rows, C, false, st_of(s));
  expert_groups_free(s, &eg);
}

/* as kernels_expert_ffn_backward_input: the unweighted SwiGLU backward, each row's weight
 * gradient du' . u (into the expert's scratch rows, then scattered), then both gradients
 * scaled by the row's weight */
static void k_expert_ffn_backward_input(struct exec_stream *s, float *din, float *drow_weight,
                                        float *bwork, float *scratch, const float *dout,
                                        const int32_t *row_expert, int n_rows, const float *saved,
                                        const float *act_buf, const float *params, int e_first,
                                        int e_count, int C, int F, bool accumulate) {
  struct expert_groups eg;
  if (!expert_groups(s, row_expert, n_rows, e_first, e_count, true, &eg))
    return;
  size_t n = (size_t)n_rows, per = 3 * (size_t)C * F;
  const float *g = saved, *u = g + n * F, *ws = saved_weights(saved, act_buf, n, F);
  float *dys = bwork, *dg = dys + n * C, *du = dg + n * F;
  kc_gather_rows(dys, dout, eg.order, n_rows, C, st_of(s));
  size_t off = 0;
  for (int x = 0; x < e_count; x++) {
    int cnt = eg.count[x];
    if (cnt == 0)
      continue;
    const float *wg = params + (size_t)x * per, *wu = wg + (size_t)C * F, *wd = wu + (size_t)C * F;
    float *dge = dg + off * F, *due = du + off * F;
    gemm(s, false, true, cnt, F, C, 1.0f, dys + off * C, C, wd, C, 0.0f, dge, F);
    kc_swiglu_backward(dge, due, dge, g + off * F, u + off * F, (size_t)cnt * F, st_of(s));
    kc_rows_dot(scratch + off * C, due, u + off * F, cnt, F, st_of(s));
    kc_scatter_rows(drow_weight, scratch + off * C, eg.order + off, cnt, 1, false, st_of(s));
    kc_rows_scale(dge, ws + off, cnt, F, st_of(s));
    kc_rows_scale(due, ws + off, cnt, F, st_of(s));
    gemm(s, false, true, cnt, C, F, 1.0f, dge, F, wg, F, 0.0f, scratch + off * C, C);
    gemm(s, false, true, cnt, C, F, 1.0f, due, F, wu, F, 1.0f, scratch + off * C, C);
    off += (size_t)cnt;
  }
  kc_scatter_rows(din, scratch, eg.order, n_rows, C, accumulate, st_of(s));
  expert_groups_free(s, &eg);
}

static void k_expert_ffn_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                         const int32_t *row_expert, int n_rows, const float *saved,
                                         const float *act_buf, const float *xs_buf, int e_first,
                                         int e_count, int C, int F) {
  struct expert_groups eg;
  if (!expert_groups(s, row_expert, n_rows, e_first, e_count, false, &eg))
    return;
  size_t n = (size_t)n_rows, per = 3 * (size_t)C * F;
  const float *xs = saved_inputs(saved, xs_buf, act_buf, n, F);
  const float *act = act_buf ? act_buf : saved + 2 * n * F;
  const float *dys = bwork, *dg = dys + n * C, *du = dg + n * F;
  size_t off = 0;
  for (int x = 0; x < e_count; x++) {
    int cnt = eg.count[x];
    if (cnt == 0)
      continue;
    float *dwg = dparams + (size_t)x * per, *dwu = dwg + (size_t)C * F, *dwd = dwu + (size_t)C * F;
    gemm(s, true, false, C, F, cnt, 1.0f, xs + off * C, C, dg + off * F, F, 1.0f, dwg, F);
    gemm(s, true, false, C, F, cnt, 1.0f, xs + off * C, C, du + off * F, F, 1.0f, dwu, F);
    gemm(s, true, false, F, C, cnt, 1.0f, act + off * F, F, dys + off * C, C, 1.0f, dwd, C);
    off += (size_t)cnt;
  }
  expert_groups_free(s, &eg);
}

static void k_expert_ffn_backward(struct exec_stream *s, float *din, float *drow_weight,
                                  float *dparams, float *bwork, float *scratch, const float *dout,
                                  const int32_t *row_expert, int n_rows, const float *saved,
                                  const float *act, const float *xs, const float *params,
                                  int e_first, int e_count, int C, int F, bool accumulate) {
  k_expert_ffn_backward_input(s, din, drow_weight, bwork, scratch, dout, row_expert, n_rows, saved,
                              act, params, e_first, e_count, C, F, accumulate);
  k_expert_ffn_backward_weight(s, dparams, bwork, row_expert, n_rows, saved, act, xs, e_first,
                               e_count, C, F);
}

/* moe_act's rerun: the forward's weighted swiglu over every row at once (elementwise: the
 * same bits) */
static void k_expert_ffn_act_forward(struct exec_stream *s, float *act, const float *saved,
                                     int n_rows, int C, int F) {
  size_t n = (size_t)n_rows;
  const float *g = saved, *u = g + n * F;
  (void)C;
  kc_swiglu_forward(act, g, u, n * F, st_of(s));
  kc_rows_scale(act, saved_weights(saved, act, n, F), n_rows, F, st_of(s));
}

/* DeepSeek-V3's FP8 cache of the routed rows: the FP8 GEMMs' 1 x 128 tile cast (rows along
 * K, compact), and its inverse; both round as the host's (kernels/fp8.h) */
static void k_fp8_rows_quantize(struct exec_stream *s, uint8_t *q, float *inv, const float *x,
                                int n_rows, int C) {
  kc_fp8_quantize_tiles(q, C, inv, x, false, n_rows, C, C, false, 1, st_of(s));
}

static void k_fp8_rows_dequantize(struct exec_stream *s, float *x, const uint8_t *q,
                                  const float *inv, int n_rows, int C) {
  kc_fp8_dequantize_rows(x, q, inv, n_rows, C, st_of(s));
}

static void k_embedding_backward(struct exec_stream *s, float *dparams, const float *dx,
                                 const int32_t *tokens, int T, int V, int C) {
  k_embedding_backward_weight(s, dparams, dx, tokens, T, V, C);
}

/* ---- tensor parallelism's vocabulary slice [lo, lo + n) (exec/tp.c runs the collectives
 * between these): the embedding's rows, and the LM head over the slice's logits, in the chunks
 * of rows the whole head uses (n columns wide). --------------------------------------------- */

static void k_tp_embedding_forward(struct exec_stream *s, float *x, const int32_t *tokens,
                                   const float *table, int T, int C, int lo, int n) {
  kc_embedding_slice_forward(x, tokens, table, T, C, lo, n, st_of(s));
}

static void k_tp_embedding_backward(struct exec_stream *s, float *dtable, const float *dx,
                                    const int32_t *tokens, int T, int C, int lo, int n) {
  kc_embedding_slice_backward(dtable, dx, tokens, T, C, lo, n, st_of(s));
}


/* the LM head and its tensor-parallel entries (backend_cuda_head.c) */
#define k_lm_head_loss_forward exec_cuda_lm_head_loss_forward
#define k_lm_head_loss_backward_input exec_cuda_lm_head_loss_backward_input
#define k_lm_head_loss_backward_weight exec_cuda_lm_head_loss_backward_weight
#define k_lm_head_loss_backward exec_cuda_lm_head_loss_backward
#define k_tp_head_stats exec_cuda_tp_head_stats
#define k_tp_head_combine exec_cuda_tp_head_combine
#define k_tp_head_backward exec_cuda_tp_head_backward

/* context parallelism's blocks (backend_cuda_attention_cp.c) */
#define k_attention_block_forward exec_cuda_attention_block_forward
#define k_attention_block_backward exec_cuda_attention_block_backward

/* the optimizer's entries (backend_cuda_adamw.c) */
#define k_adamw_step exec_cuda_adamw_step
#define k_adamw_multi exec_cuda_adamw_multi

/* Every entry as the table holds it: its op's FP8 state set around it (backend_cuda_fp8.c:
 * the linear layers' GEMMs run in e4m3 under piper.fp8). */
#define EXEC_KERNEL(name, use, params, args)                                                      \
  static void entry_##name(struct exec_stream *s, EXEC_UNPAREN params) {                         \
    bool was = exec_cuda_fp8_enter(s, EXEC_OP_##name);                                           \
    k_##name(s, EXEC_UNPAREN args);                                                              \
    exec_cuda_fp8_leave(s, was);                                                                 \
  }
#define EXEC_COLLECTIVE(name, use, params, args, pre)
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE

const struct exec_kernels exec_cuda_kernels = {
#define EXEC_KERNEL(name, use, params, args) .name = entry_##name,
#define EXEC_COLLECTIVE(name, use, params, args, pre)
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
};
