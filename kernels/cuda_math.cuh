// cuda_math: the per-element formulas of cuda.cu's kernels (fp32 and bf16 storage alike),
// with the block helpers of cuda_block.cuh. Device
// functions only (no __shared__ declaration: the emulated GPU compiles this header as it is).
#ifndef PIPER_KERNELS_CUDA_MATH_CUH
#define PIPER_KERNELS_CUDA_MATH_CUH

#include <math.h>
#include <stddef.h>

#include "cuda_block.cuh"

namespace {

constexpr int kThreads = kFlatThreads; // threads a block, for every elementwise and row kernel

// Llama 3's frequency scaling, as kernels/rope.c (double, like the host's tables).
__device__ double rope_inv_freq(int i, int D, float theta, float factor, float lo, float hi,
                                int old_ctx) {
  double inv = pow((double)theta, -2.0 * i / D);
  if (factor <= 0.0f)
    return inv;
  double low_wavelen = old_ctx / (double)lo, high_wavelen = old_ctx / (double)hi;
  double wavelen = 2.0 * M_PI / inv;
  if (wavelen < high_wavelen)
    return inv;
  if (wavelen > low_wavelen)
    return inv / factor;
  double smooth = (old_ctx / wavelen - lo) / ((double)hi - lo);
  return (1.0 - smooth) * inv / factor + smooth * inv;
}

__device__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

__device__ void swiglu_grad(float d, float g, float u, float *dg, float *du) {
  float s = 1.0f / (1.0f + expf(-g));
  *dg = d * u * s * (1.0f + g * (1.0f - s));
  *du = d * g * s;
}

} // namespace

#endif
