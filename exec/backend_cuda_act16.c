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

void exec_cuda_kernels_act_bf16(struct exec_kernels *k) {
  memset(k, 0, sizeof *k);
  /* no activation in these: bytes, or the fp32 parameters, gradients and moments. `fill` and
   * `add` are not here: the runner uses them on fp32 parameter gradients and on activations
   * alike, so they need activation twins in the op list first. */
  const struct exec_kernels *fp32 = &exec_cuda_kernels;
  k->copy = fp32->copy;
  k->sum_squares = fp32->sum_squares;
  k->scale = fp32->scale;
  k->adamw_step = fp32->adamw_step;
  k->adamw_multi = fp32->adamw_multi;
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
}
