/* mlp: the SwiGLU feed-forward block (dense MLP and DeepSeek's shared experts). */
#include "kernels.h"
#include "kernels-impl.h"

size_t kernels_mlp_param_count(int C, int F) {
  return 3 * (size_t)C * F;
}
size_t kernels_mlp_saved_floats(int T, int F) {
  return 3 * (size_t)T * F;
}
size_t kernels_mlp_bwork_floats(int T, int F) {
  return 2 * (size_t)T * F;
}

struct kernels_mlp_views kernels_mlp_views(const float *params, const float *saved,
                                           const float *bwork, int T, int C, int F) {
  struct kernels_mlp_views w = {0};
  size_t TF = (size_t)T * F, CF = (size_t)C * F;
  if (params) {
    w.wg = params;
    w.wu = w.wg + CF;
    w.wd = w.wu + CF;
  }
  if (saved) { /* each kernel writes only the buffers it owns (F: saved, BI: bwork) */
    w.g = (float *)saved;
    w.u = w.g + TF;
    w.act = w.u + TF;
  }
  if (bwork) {
    w.dg = (float *)bwork;
    w.du = w.dg + TF;
  }
  return w;
}

/* m [T, C], saved = g, u, act [T, F] each <- h [T, C] */
void kernels_mlp_forward(float *m, float *saved, const float *h, const float *params, int T, int C,
                         int F) {
  struct kernels_mlp_views w = kernels_mlp_views(params, saved, NULL, T, C, F);
  kernels_gemm(false, false, T, F, C, 1.0f, h, C, w.wg, F, 0.0f, w.g, F);
  kernels_gemm(false, false, T, F, C, 1.0f, h, C, w.wu, F, 0.0f, w.u, F);
  kernels_impl_swiglu_forward(w.act, w.g, w.u, (size_t)T * F);
  kernels_gemm(false, false, T, C, F, 1.0f, w.act, F, w.wd, C, 0.0f, m, C);
}

/* dh [T, C] (= or +=), bwork = dg, du [T, F] each <- dm [T, C] */
void kernels_mlp_backward_input(float *dh, float *bwork, const float *dm, const float *saved,
                                const float *params, int T, int C, int F, bool accumulate) {
  struct kernels_mlp_views w = kernels_mlp_views(params, saved, bwork, T, C, F);
  kernels_gemm(false, true, T, F, C, 1.0f, dm, C, w.wd, C, 0.0f, w.dg, F); /* dact, into dg */
  kernels_impl_swiglu_backward(w.dg, w.du, w.g, w.u, (size_t)T * F);
  kernels_gemm(false, true, T, C, F, 1.0f, w.dg, F, w.wg, F, accumulate ? 1.0f : 0.0f, dh, C);
  kernels_gemm(false, true, T, C, F, 1.0f, w.du, F, w.wu, F, 1.0f, dh, C);
}

/* dwg += h^T dg, dwu += h^T du, dwd += act^T dm */
void kernels_mlp_backward_weight(float *dparams, const float *bwork, const float *dm,
                                 const float *h, const float *saved, int T, int C, int F) {
  float *dwg = dparams, *dwu = dwg + (size_t)C * F, *dwd = dwu + (size_t)C * F;
  struct kernels_mlp_views w = kernels_mlp_views(NULL, saved, bwork, T, C, F);
  kernels_gemm(true, false, C, F, T, 1.0f, h, C, w.dg, F, 1.0f, dwg, F);
  kernels_gemm(true, false, C, F, T, 1.0f, h, C, w.du, F, 1.0f, dwu, F);
  kernels_gemm(true, false, F, C, T, 1.0f, w.act, F, dm, C, 1.0f, dwd, C);
}

/* Fused backward: BI then BW, same shapes (BW reads what BI left in bwork). */
void kernels_mlp_backward(float *dh, float *dparams, float *bwork, const float *dm, const float *h,
                          const float *saved, const float *params, int T, int C, int F,
                          bool accumulate) {
  kernels_mlp_backward_input(dh, bwork, dm, saved, params, T, C, F, accumulate);
  kernels_mlp_backward_weight(dparams, bwork, dm, h, saved, T, C, F);
}
