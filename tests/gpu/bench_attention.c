/* bench_attention: the fused attention core's time (kernels/flash_attention.cu) at the
 * llama3-8b shape: one sequence of S = 4096 (or argv[1]), 32 query heads, 8 kv heads, head_dim
 * 128, causal. Prints the forward's and the backward's milliseconds and TFLOP/s per layer,
 * counting causal FLOPs as usual (FlashAttention's convention): forward 4 S^2 D H / 2 (two
 * GEMMs over half the score matrix), backward 2.5 times that (five GEMMs; the recomputation
 * of the scores is not counted). Needs a GPU; exits 2 without one, 1 on a CUDA error. */
#include <glib.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../kernels/kernels_cuda.h"

enum { HEADS = 32, KV_HEADS = 8, HEAD_DIM = 128, WARMUP = 2, REPEAT = 10 };

static bool ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    fprintf(stderr, "bench_attention: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

/* n floats of device memory, uniform in [-1, 1] (NULL when not wanted filled: zeros) */
static float *device_floats(size_t n, GRand *rng) {
  float *d = NULL;
  if (!ok(cudaMalloc((void **)&d, n * sizeof(float)), "cudaMalloc"))
    exit(1);
  float *h = g_new0(float, n);
  for (size_t i = 0; rng && i < n; i++)
    h[i] = (float)g_rand_double_range(rng, -1.0, 1.0);
  bool copied = ok(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  g_free(h);
  if (!copied)
    exit(1);
  return d;
}

int main(int argc, char **argv) {
  int S = argc > 1 ? atoi(argv[1]) : 4096, n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    fprintf(stderr, "bench_attention: no GPU\n");
    return 2;
  }
  if (S <= 0) {
    fprintf(stderr, "usage: bench_attention [SEQ]\n");
    return 1;
  }
  GRand *rng = g_rand_new_with_seed(7);
  size_t nq = (size_t)S * HEADS * HEAD_DIM, nk = (size_t)S * KV_HEADS * HEAD_DIM;
  size_t nl = (size_t)HEADS * S;
  /* the scores of random unit inputs are spread like a trained model's (std ~ 1 after the
   * 1/sqrt(D) scale): the exponentials cost the same either way */
  float *q = device_floats(nq, rng), *k = device_floats(nk, rng), *v = device_floats(nk, rng);
  float *dy = device_floats(nq, rng), *y = device_floats(nq, NULL), *lse = device_floats(nl, NULL);
  float *dq = device_floats(nq, NULL), *dk = device_floats(nk, NULL), *dv = device_floats(nk, NULL);
  size_t sb = kc_flash_attention_scratch_bytes(1, S, HEADS, KV_HEADS, HEAD_DIM, true);
  float *scratch = device_floats(sb / sizeof(float) + 1, NULL);
  cudaEvent_t ev[3];
  for (int i = 0; i < 3; i++)
    if (!ok(cudaEventCreate(&ev[i]), "cudaEventCreate"))
      return 1;
  float ms_f = 0, ms_b = 0;
  for (int it = 0; it < WARMUP + REPEAT; it++) {
    bool timed = it >= WARMUP;
    cudaEventRecord(ev[0], 0);
    if (!ok(kc_flash_attention_forward(y, lse, scratch, q, k, v, 1, S, HEADS, KV_HEADS, HEAD_DIM, 0),
            "forward"))
      return 1;
    cudaEventRecord(ev[1], 0);
    if (!ok(kc_flash_attention_backward(dq, dk, dv, scratch, q, k, v, y, dy, lse, 1, S, HEADS,
                                        KV_HEADS, HEAD_DIM, 0),
            "backward"))
      return 1;
    cudaEventRecord(ev[2], 0);
    if (!ok(cudaEventSynchronize(ev[2]), "run"))
      return 1;
    float f = 0, b = 0;
    cudaEventElapsedTime(&f, ev[0], ev[1]);
    cudaEventElapsedTime(&b, ev[1], ev[2]);
    ms_f += timed ? f : 0;
    ms_b += timed ? b : 0;
  }
  ms_f /= REPEAT;
  ms_b /= REPEAT;
  double flop_f = 4.0 * S * (double)S * HEAD_DIM * HEADS / 2, flop_b = 2.5 * flop_f;
  printf("flash attention S=%d H=%d KVH=%d D=%d causal, bf16 tensor cores:\n", S, HEADS, KV_HEADS,
         HEAD_DIM);
  printf("  forward  %8.3f ms  %6.1f TFLOP/s\n", ms_f, flop_f / (ms_f * 1e-3) / 1e12);
  printf("  backward %8.3f ms  %6.1f TFLOP/s\n", ms_b, flop_b / (ms_b * 1e-3) / 1e12);
  float *bufs[] = {q, k, v, dy, y, lse, dq, dk, dv, scratch};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    cudaFree(bufs[i]);
  g_rand_free(rng);
  return 0;
}
