/* kernels-impl: helpers private to kernels/ (pointwise SwiGLU shared by MLP and expert FFN). */
#ifndef PIPER_KERNELS_KERNELS_IMPL_H
#define PIPER_KERNELS_KERNELS_IMPL_H

#include <math.h>
#include <stddef.h>

/* Per-thread scratch, one slot per user so that two kernels never share a buffer; the pointer
 * is valid until the same thread asks for the same slot again. */
enum kernels_scratch_slot {
  KERNELS_SCRATCH_ATTENTION_DS, /* attention BI: dS of one row block, [block, seq] floats */
  KERNELS_SCRATCH_LOSS_EXP,     /* lm_head forward: exp of one row of logits, [V] doubles */
  KERNELS_SCRATCH_SLOTS
};
void *kernels_impl_scratch(enum kernels_scratch_slot slot, size_t bytes);

/* act = silu(g) * u over n elements; silu(g) = g * sigmoid(g). */
static inline void kernels_impl_swiglu_forward(float *act, const float *g, const float *u,
                                               size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + expf(-g[i]));
    act[i] = g[i] * sig * u[i];
  }
}

/* On entry dg holds dact; on exit dg = dact * u * silu'(g), du = dact * silu(g), with
 * silu'(g) = sig * (1 + g * (1 - sig)). */
static inline void kernels_impl_swiglu_backward(float *dg, float *du, const float *g,
                                                const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sig = 1.0f / (1.0f + expf(-g[i]));
    float dact = dg[i];
    du[i] = dact * g[i] * sig;
    dg[i] = dact * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

#endif
