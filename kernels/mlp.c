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

/* m [T, C], saved = g, u, act [T, F] each <- h [T, C] */
void kernels_mlp_forward(float *m, float *saved, const float *h, const float *params, int T, int C,
                         int F) {
  const float *wg = params, *wu = wg + (size_t)C * F, *wd = wu + (size_t)C * F;
  float *g = saved, *u = g + (size_t)T * F, *act = u + (size_t)T * F;
  kernels_gemm(false, false, T, F, C, 1.0f, h, C, wg, F, 0.0f, g, F);
  kernels_gemm(false, false, T, F, C, 1.0f, h, C, wu, F, 0.0f, u, F);
  kernels_impl_swiglu_forward(act, g, u, (size_t)T * F);
  kernels_gemm(false, false, T, C, F, 1.0f, act, F, wd, C, 0.0f, m, C);
}

/* dh [T, C] (= or +=), bwork = dg, du [T, F] each <- dm [T, C] */
void kernels_mlp_backward_input(float *dh, float *bwork, const float *dm, const float *saved,
                                const float *params, int T, int C, int F, bool accumulate) {
  const float *wg = params, *wu = wg + (size_t)C * F, *wd = wu + (size_t)C * F;
  const float *g = saved, *u = g + (size_t)T * F;
  float *dg = bwork, *du = dg + (size_t)T * F;
  kernels_gemm(false, true, T, F, C, 1.0f, dm, C, wd, C, 0.0f, dg, F); /* dact, into dg */
  kernels_impl_swiglu_backward(dg, du, g, u, (size_t)T * F);
  kernels_gemm(false, true, T, C, F, 1.0f, dg, F, wg, F, accumulate ? 1.0f : 0.0f, dh, C);
  kernels_gemm(false, true, T, C, F, 1.0f, du, F, wu, F, 1.0f, dh, C);
}

/* dwg += h^T dg, dwu += h^T du, dwd += act^T dm */
void kernels_mlp_backward_weight(float *dparams, const float *bwork, const float *dm,
                                 const float *h, const float *saved, int T, int C, int F) {
  float *dwg = dparams, *dwu = dwg + (size_t)C * F, *dwd = dwu + (size_t)C * F;
  const float *act = saved + 2 * (size_t)T * F;
  const float *dg = bwork, *du = dg + (size_t)T * F;
  kernels_gemm(true, false, C, F, T, 1.0f, h, C, dg, F, 1.0f, dwg, F);
  kernels_gemm(true, false, C, F, T, 1.0f, h, C, du, F, 1.0f, dwu, F);
  kernels_gemm(true, false, F, C, T, 1.0f, act, F, dm, C, 1.0f, dwd, C);
}

/* Fused backward: BI then BW, same shapes (BW reads what BI left in bwork). */
void kernels_mlp_backward(float *dh, float *dparams, float *bwork, const float *dm, const float *h,
                          const float *saved, const float *params, int T, int C, int F,
                          bool accumulate) {
  kernels_mlp_backward_input(dh, bwork, dm, saved, params, T, C, F, accumulate);
  kernels_mlp_backward_weight(dparams, bwork, dm, h, saved, T, C, F);
}
