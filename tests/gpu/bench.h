/* bench: the timing and reporting harness the GEMM benches share (bench_gemm.c, bench_fp8.c):
 * their CUDA and cuBLASLt error checks, the median of timed runs on a stream, a GEMM's
 * TFLOP/s. Static functions in a header: each C file of tests/gpu is a program of its own. Each
 * bench defines BENCH_NAME (its name in error lines) before including it; "bench" otherwise. */
#ifndef PIPER_TESTS_GPU_BENCH_H
#define PIPER_TESTS_GPU_BENCH_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef BENCH_NAME
#define BENCH_NAME "bench"
#endif

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, BENCH_NAME ": %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__,       \
              __LINE__);                                                                           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
#define LK(x)                                                                                      \
  do {                                                                                             \
    cublasStatus_t s_ = (x);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, BENCH_NAME ": %s: status %d (%s:%d)\n", #x, (int)s_, __FILE__, __LINE__);   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* timed runs, and untimed ones before them (clocks, caches, cuBLASLt's first-call setup) */
enum { REPS = 10, WARM = 3 };

static inline int bench_cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* The median milliseconds of REPS runs of run(arg), each enqueued on st and timed by events
 * around it, after WARM untimed ones; -1 as soon as a run says it failed. */
static inline float bench_median_ms(cudaStream_t st, bool (*run)(void *), void *arg) {
  float t[REPS], ms = -1.0f;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int i = 0;
  for (; i < WARM + REPS; i++) {
    CK(cudaEventRecord(e0, st));
    bool ran = run(arg);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    if (!ran)
      break;
    if (i >= WARM)
      CK(cudaEventElapsedTime(&t[i - WARM], e0, e1));
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  if (i == WARM + REPS) {
    qsort(t, REPS, sizeof t[0], bench_cmp_float);
    ms = 0.5f * (t[REPS / 2 - 1] + t[REPS / 2]);
  }
  return ms;
}

/* TFLOP/s of an m x n x k GEMM (2mnk flops) in ms milliseconds; 0 where it did not run */
static inline double bench_tflops(int m, int n, int k, float ms) {
  return ms > 0 ? 2.0 * m * (double)n * k / (ms * 1e-3) / 1e12 : 0.0;
}

#endif
