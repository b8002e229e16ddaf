// fake_cuda: just enough of CUDA to run kernels/flash_attention.cu on the host, so that a
// machine without a GPU checks its indexing, masking, tails, grouped-query heads and
// barriers against a plain reference (tests/cli/test_flash_emu.sh). A block runs as
// blockDim.x threads with real barriers (__syncthreads, __syncwarp, shuffles), blocks one
// after the other over one shared-memory array, which starts as NaN bytes each time (what
// the kernel reads before writing shows up). The launch syntax is rewritten to fake_launch
// by the script. What this cannot check: the tensor cores' own rounding and timing; that is
// tests/gpu/check_kernels.c's job on a GPU.
#pragma once
#define PIPER_KERNELS_KERNELS_CUDA_H /* the real header needs the CUDA toolkit's */
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __launch_bounds__(x)
#define __shared__
#define __align__(n)

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef void *cudaStream_t;
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F> cudaError_t cudaFuncSetAttribute(F, int, int bytes) {
  return bytes <= 163 * 1024 ? cudaSuccess : cudaErrorInvalidValue; // sm_80's limit
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}

inline std::barrier<> *emu_block_barrier;
inline std::barrier<> *emu_warp_barrier[32];
inline float emu_shuffle[32][32];

inline void __syncthreads() {
  emu_block_barrier->arrive_and_wait();
}
inline void __syncwarp() {
  emu_warp_barrier[threadIdx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  emu_shuffle[w][l] = v;
  __syncwarp();
  float r = emu_shuffle[w][l ^ lane_mask];
  __syncwarp();
  return r;
}

namespace {
alignas(128) unsigned char smem[200 * 1024];
}

template <class K, class... A>
void fake_launch(dim3 grid, dim3 block, size_t bytes, cudaStream_t, K kernel, A... args) {
  if (bytes > sizeof smem || block.x % 32 || block.x > 1024) {
    fprintf(stderr, "fake_launch: %zu bytes of shared memory, %u threads\n", bytes, block.x);
    abort();
  }
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        memset(smem, 0xff, sizeof smem);
        std::barrier<> bar(block.x);
        emu_block_barrier = &bar;
        for (unsigned w = 0; w < block.x / 32; w++)
          emu_warp_barrier[w] = new std::barrier<>(32);
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block.x; t++)
          threads.emplace_back([=] {
            threadIdx = dim3(t);
            blockIdx = dim3(x, y, z);
            kernel(args...);
          });
        for (auto &t : threads)
          t.join();
        for (unsigned w = 0; w < block.x / 32; w++)
          delete emu_warp_barrier[w];
      }
}
