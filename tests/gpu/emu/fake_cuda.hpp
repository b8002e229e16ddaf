// fake_cuda: the device side of CUDA on the host (tests/gpu/emu/README.md), for compiling
// kernels/*.cu with g++ (the launch syntax <<<grid, block, bytes, stream>>>(args) is
// rewritten to fake_launch(grid, block, bytes, stream, kernel, args) by the build, and
// `__shared__` to `static thread_local`). A launch is its stream's work (emu.h): a block runs
// as blockDim threads with real barriers (__syncthreads, __syncwarp, shuffles) on fibers
// (launch.cpp) in the thread that runs the stream, blocks one after the other over that
// thread's shared-memory array, which starts as NaN bytes each time (what a kernel reads
// before writing shows up). What this cannot check: the tensor cores' own rounding and the GPU's
// timing; that is tests/gpu/check_kernels.c's job on a GPU.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __align__(n) // smem below is 128-byte aligned
#define __forceinline__ inline

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
// the built-in variables: plain aggregates, so that reading one is a thread-local load
struct uint3 {
  unsigned x, y, z;
};
extern thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

// launch.cpp: runs thunk(arg) as every thread of every block of grid (threadIdx and blockIdx
// set for each), clearing `shared` (bytes) to 0xff before each block. Aborts, naming the
// kernel's launch, on a barrier that can never be passed (threads of a block waiting at
// different barriers).
void emu_run_grid(dim3 grid, dim3 block, void *shared, size_t bytes, void (*thunk)(void *),
                  void *arg);
// The launch on stream st (emu.h: at once, or in the stream's thread): emu_run_grid over the
// shared memory shared() returns in the thread that runs it, then done(arg).
void emu_launch(cudaStream_t st, dim3 grid, dim3 block, void *(*shared)(), size_t bytes,
                void (*thunk)(void *), void *arg, void (*done)(void *));
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);

namespace {
// dynamic shared memory (extern __shared__), one a thread: streams run apart (emu.h)
alignas(128) thread_local unsigned char smem[200 * 1024];
}

template <class F> cudaError_t cudaFuncSetAttribute(F, enum cudaFuncAttribute, int bytes) {
  return bytes <= (int)sizeof smem ? cudaSuccess : cudaErrorInvalidValue;
}

template <class K, class... A> struct emu_call {
  K kernel;
  std::tuple<A...> args; // by value, as a launch's arguments are
  static void run(void *p) {
    emu_call *c = (emu_call *)p;
    std::apply(c->kernel, c->args);
  }
  static void done(void *p) {
    delete (emu_call *)p;
  }
};

template <class K, class... A>
void fake_launch(dim3 grid, dim3 block, size_t bytes, cudaStream_t st, K kernel, A... args) {
  unsigned threads = block.x * block.y * block.z;
  if (bytes > sizeof smem || threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    // the launch error a GPU gives (too many threads, too much shared memory, an empty grid)
    emu_set_last_error(cudaErrorInvalidValue);
    return;
  }
  auto *call = new emu_call<K, A...>{kernel, std::tuple<A...>(args...)};
  emu_launch(st, grid, block, []() -> void * { return smem; }, bytes, emu_call<K, A...>::run, call,
             emu_call<K, A...>::done);
}
