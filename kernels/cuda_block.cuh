// cuda_block: the block-level helpers every kernel file shares: a grid's size for an
// elementwise kernel, and the block-wide reductions (sum, max) in a fixed order, so that a
// row's statistic is the same bits run to run and in every file that computes one. Device
// functions only (no __shared__ declaration: the emulated GPU compiles this header as it is).
#ifndef PIPER_KERNELS_CUDA_BLOCK_CUH
#define PIPER_KERNELS_CUDA_BLOCK_CUH

#include <math.h>
#include <stddef.h>

namespace {

constexpr int kFlatThreads = 256; // threads a block of an elementwise kernel

// Blocks for n elements, a thread each, capped (grid-stride loops cover the rest).
inline unsigned blocks_for(size_t n) {
  size_t b = (n + kFlatThreads - 1) / kFlatThreads;
  return (unsigned)(b < 65535 * 32 ? (b ? b : 1) : 65535 * 32);
}

// Block-wide reduction in a fixed order (a tree over buf, the caller's shared array of
// blockDim.x floats, a power of two): every thread gets the result. The array is the
// caller's because the emulated GPU rewrites __shared__ only in .cu files.
template <bool kMax> __device__ float block_reduce_in(float *buf, float v) {
  __syncthreads();
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s)
      buf[threadIdx.x] = kMax ? fmaxf(buf[threadIdx.x], buf[threadIdx.x + s])
                              : buf[threadIdx.x] + buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

__device__ inline float block_sum_in(float *buf, float v) {
  return block_reduce_in<false>(buf, v);
}

__device__ inline float block_max_in(float *buf, float v) {
  return block_reduce_in<true>(buf, v);
}

} // namespace

#endif
