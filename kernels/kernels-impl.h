/* kernels-impl: helpers private to kernels/ (pointwise SwiGLU shared by MLP and expert FFN). */
#ifndef PIPER_KERNELS_KERNELS_IMPL_H
#define PIPER_KERNELS_KERNELS_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Per-thread scratch, one slot per user so that two kernels never share a buffer; the pointer
 * is valid until the same thread asks for the same slot again. */
enum kernels_scratch_slot {
  KERNELS_SCRATCH_ATTENTION_DS, /* attention BI: dS of one row block, [block, seq] floats */
  KERNELS_SCRATCH_LOSS_EXP,     /* lm_head forward: exp of one row of logits, [V] doubles */
  KERNELS_SCRATCH_SLOTS
};
void *kernels_impl_scratch(enum kernels_scratch_slot slot, size_t bytes);

/* exp(x) for float x, branch-free so that loops over it vectorise (libm's expf is a call per
 * element). Cephes expf: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 with ln 2 in
 * two parts, exp(r) by a degree-6 polynomial on |r| <= ln2 / 2; relative error under 2e-7
 * (about 2 ulp) against double exp on [-87, 88]. Exact at 0 (exp(0) = 1). Inputs are clamped
 * to [-87.33, 88.37], so it never returns 0, a subnormal or inf; x is never NaN here. */
static inline float kernels_impl_expf(float x) {
  x = x < 88.3762626647949f ? x : 88.3762626647949f;
  x = x > -87.3365447504f ? x : -87.3365447504f;
  /* round to nearest by the 1.5 * 2^23 trick (no floorf, which SSE2 cannot vectorise) */
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* act = silu(g) * u over n elements; silu(g) = g * sigmoid(g). */
static inline void kernels_impl_swiglu_forward(float *act, const float *g, const float *u,
                                               size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + kernels_impl_expf(-g[i]));
    act[i] = g[i] * sig * u[i];
  }
}

/* On entry dg holds dact; on exit dg = dact * u * silu'(g), du = dact * silu(g), with
 * silu'(g) = sig * (1 + g * (1 - sig)). */
static inline void kernels_impl_swiglu_backward(float *dg, float *du, const float *g,
                                                const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + kernels_impl_expf(-g[i]));
    float dact = dg[i];
    du[i] = dact * g[i] * sig;
    dg[i] = dact * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

#endif
