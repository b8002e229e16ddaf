/* Host profile benchmark: the figures of profiles/host-cpu.json, measured on this machine.
 *   build/bench/bench_host_profile                 one core: GEMM FLOP/s, memory bandwidth
 *   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
 *     mpirun -np 2 build/bench/bench_host_profile   adds MPI ping-pong latency and bandwidth
 * 1. fp32 GEMM through kernels_gemm (OpenBLAS, one thread: the host backend runs one rank per
 *    core): a large square product (the profile's peak) and the shapes of models/tiny-moe.json
 *    (what a micro-batch of it really multiplies; their share of the peak is the efficiency).
 * 2. Memory: a STREAM-style triad a = b + s c over arrays far larger than the last-level cache,
 *    counting 12 bytes per element (two reads and a write of fp32; write-allocate not counted,
 *    as STREAM does). Also a copy, for reference.
 * 3. Under an MPI launcher with 2 ranks: ping-pong between them (half the round trip): latency
 *    of an 8-byte message, bandwidth of a 4 MiB one. Loopback through shared memory.
 * Every figure is the best of several repetitions (least disturbed by other processes). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef HAVE_BLAS
#include <cblas.h>
#endif
#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "../../base/base.h"
#include "../../kernels/kernels.h"

static float *filled(size_t n, float v) {
  float *p = malloc(n * sizeof *p);
  if (!p) {
    fprintf(stderr, "bench_host_profile: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++)
    p[i] = v + (float)(i % 7) * 0.01f;
  return p;
}

/* Best FLOP/s of C[m, n] = A[m, k] B[k, n], repeated until about min_s seconds have passed. */
static double gemm_flops(int m, int n, int k, double min_s) {
  float *a = filled((size_t)m * k, 0.5f), *b = filled((size_t)k * n, 0.25f);
  float *c = filled((size_t)m * n, 0);
  kernels_gemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n); /* warm the caches */
  double best = INFINITY, t_all = 0;
  int reps = 1;
  while (t_all < min_s) {
    double t0 = piper_clock_seconds();
    for (int r = 0; r < reps; r++)
      kernels_gemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n);
    double dt = (piper_clock_seconds() - t0) / reps;
    if (dt < best)
      best = dt;
    t_all += dt * reps;
    if (dt * reps < 1e-3)
      reps *= 2; /* small products: time batches, not single calls */
  }
  free(a);
  free(b);
  free(c);
  return 2.0 * m * n * k / best;
}

/* Best bytes/s of the triad a = b + s c (12 bytes per element) and of a copy (8). */
static void stream(size_t n, double *triad, double *copy) {
  float *a = filled(n, 0), *b = filled(n, 1), *c = filled(n, 2);
  *triad = *copy = 0;
  for (int r = 0; r < 6; r++) {
    double t0 = piper_clock_seconds();
    for (size_t i = 0; i < n; i++)
      a[i] = b[i] + 0.5f * c[i];
    double t1 = piper_clock_seconds();
    memcpy(c, a, n * sizeof *a);
    double t2 = piper_clock_seconds();
    if (12.0 * n / (t1 - t0) > *triad)
      *triad = 12.0 * n / (t1 - t0);
    if (8.0 * n / (t2 - t1) > *copy)
      *copy = 8.0 * n / (t2 - t1);
  }
  /* keep the loops: their result is read */
  if (a[n / 2] < -1)
    printf("?");
  free(a);
  free(b);
  free(c);
}

#ifdef HAVE_MPI
/* Half the round trip of bytes between ranks 0 and 1: the best and the median of reps. */
static void ping_pong(int rank, size_t bytes, int reps, double *best, double *median) {
  char *buf = calloc(bytes, 1);
  double *t = malloc((size_t)reps * sizeof *t);
  for (int r = 0; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    t[r] = (MPI_Wtime() - t0) / 2;
  }
  qsort(t, (size_t)reps, sizeof *t, piper_cmp_double);
  *best = t[0];
  *median = t[reps / 2];
  free(t);
  free(buf);
}
#endif

int main(int argc, char **argv) {
  int rank = 0, size = 1;
#ifdef HAVE_MPI
  /* only under a launcher: a process alone stays out of MPI, like piper-exec */
  bool mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
  if (mpi) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
#else
  (void)argc;
  (void)argv;
#endif
#ifdef HAVE_BLAS
  openblas_set_num_threads(1);
#endif
  if (rank == 0) {
    double peak = gemm_flops(1024, 1024, 1024, 1.0);
    printf("fp32 GEMM 1024x1024x1024, one thread:          %7.1f GFLOP/s  (profile peak)\n",
           peak * 1e-9);
    /* tiny-moe: T = 2 x 32 tokens, C = 64, FFN 128, expert FFN 32, 4 heads x 16, vocab 256 */
    static const struct {
      int m, n, k;
      const char *what;
    } shapes[] = {{64, 128, 64, "tiny-moe mlp up    [64,64]x[64,128]"},
                  {64, 64, 128, "tiny-moe mlp down  [64,128]x[128,64]"},
                  {64, 128, 64, "tiny-moe qkv       [64,64]x[64,128]"},
                  {64, 256, 64, "tiny-moe lm head   [64,64]x[64,256]"},
                  {16, 32, 64, "tiny-moe expert    [16,64]x[64,32]"}};
    double sum = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
      double f = gemm_flops(shapes[i].m, shapes[i].n, shapes[i].k, 0.2);
      sum += f / peak;
      printf("fp32 GEMM %s: %7.1f GFLOP/s  (%4.1f%% of peak)\n", shapes[i].what, f * 1e-9,
             100 * f / peak);
    }
    printf("  mean share of peak at tiny-moe shapes: %.1f%%\n",
           100 * sum / (double)(sizeof shapes / sizeof *shapes));
    double triad, copy;
    stream((size_t)32 << 20, &triad, &copy); /* 3 x 128 MiB, beyond any last-level cache */
    printf("memory triad (3 x 128 MiB fp32), one core:    %7.2f GB/s  (profile bandwidth)\n",
           triad * 1e-9);
    printf("memory copy (memcpy), one core:               %7.2f GB/s\n", copy * 1e-9);
  }
  bool pinged = false;
#ifdef HAVE_MPI
  if (mpi) {
    if (size >= 2) {
      double lat, lat_med, big, big_med;
      ping_pong(rank, 8, 2000, &lat, &lat_med);
      ping_pong(rank, (size_t)4 << 20, 30, &big, &big_med);
      if (rank == 0)
        printf("MPI ping-pong, %d ranks on this machine (best / median): latency %.2f / %.2f us "
               "(8 B), bandwidth %.2f / %.2f GB/s (4 MiB, latency included)\n",
               size, lat * 1e6, lat_med * 1e6, (double)(4 << 20) / big * 1e-9,
               (double)(4 << 20) / big_med * 1e-9);
      pinged = true;
    }
    MPI_Finalize();
  }
#endif
  if (!pinged && rank == 0)
    printf("MPI ping-pong: not run (start it with mpirun -np 2)\n");
  return 0;
}
