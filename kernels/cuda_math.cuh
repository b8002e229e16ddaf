// cuda_math: the per-element formulas the fp32 kernels (cuda.cu) and the bf16 kernels
// (cuda_bf16.cu) share, so that both storage types compute the same fp32 arithmetic. Device
// functions only (no __shared__ declaration: the emulated GPU compiles this header as it is).
#ifndef PIPER_KERNELS_CUDA_MATH_CUH
#define PIPER_KERNELS_CUDA_MATH_CUH

#include <math.h>
#include <stddef.h>

namespace {

constexpr int kThreads = 256; // threads a block, for every elementwise and row kernel

// Blocks for n elements, a thread each, capped (grid-stride loops cover the rest).
unsigned blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 65535 * 32 ? (b ? b : 1) : 65535 * 32);
}

// Block-wide sum in a fixed order (a tree over buf, the caller's shared array of blockDim.x
// floats): every thread gets the result. The array is the caller's because the emulated GPU
// rewrites __shared__ only in .cu files.
__device__ float block_sum_in(float *buf, float v) {
  __syncthreads();
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s)
      buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

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
