/* bench_attention: the attention core's time at the llama3-8b shape, the own fused kernel
 * (kernels/flash_attention.cu) and, where the build has cuDNN, cuDNN's fused SDPA through the
 * executor's entry point (exec/cuda_cudnn.h: its fp32 <-> bf16 conversions included, as the
 * executor pays them): one sequence of S = 4096 (or argv[1]), 32 query heads, 8 kv heads,
 * head_dim 128, causal. Prints each core's forward and backward milliseconds and TFLOP/s per layer,
 * counting causal FLOPs as usual (FlashAttention's convention): forward 4 S^2 D H / 2 (two
 * GEMMs over half the score matrix), backward 2.5 times that (five GEMMs; the recomputation
 * of the scores is not counted). Needs a GPU; exits 2 without one, 1 on a CUDA error. */
#include <glib.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../exec/cuda_cudnn.h"
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

/* the tensors of one layer's core */
struct core {
  int S;
  float *q, *k, *v, *dy, *y, *lse, *dq, *dk, *dv, *scratch;
  struct exec_cudnn_sdpa *cudnn; /* NULL: the own kernel */
};

static bool run_forward(struct core *c) {
  GError *e = NULL;
  if (!c->cudnn)
    return ok(kc_flash_attention_forward(c->y, c->lse, c->scratch, c->q, c->k, c->v, 1, c->S,
                                         HEADS, KV_HEADS, HEAD_DIM, 0),
              "forward");
  struct exec_cudnn_sdpa_shape sh = {1, c->S, c->S, HEADS, KV_HEADS, HEAD_DIM, 0, 0};
  if (exec_cudnn_sdpa_forward(c->cudnn, &sh, c->y, c->lse, c->q, c->k, c->v, 0, &e))
    return true;
  fprintf(stderr, "bench_attention: cuDNN forward: %s\n", e->message);
  g_error_free(e);
  return false;
}

static bool run_backward(struct core *c) {
  GError *e = NULL;
  if (!c->cudnn)
    return ok(kc_flash_attention_backward(c->dq, c->dk, c->dv, c->scratch, c->q, c->k, c->v, c->y,
                                          c->dy, c->lse, 1, c->S, HEADS, KV_HEADS, HEAD_DIM, 0),
              "backward");
  struct exec_cudnn_sdpa_shape sh = {1, c->S, c->S, HEADS, KV_HEADS, HEAD_DIM, 0, 0};
  if (exec_cudnn_sdpa_backward(c->cudnn, &sh, c->dq, c->dk, c->dv, c->q, c->k, c->v, c->y, c->dy,
                               c->lse, 0, &e))
    return true;
  fprintf(stderr, "bench_attention: cuDNN backward: %s\n", e->message);
  g_error_free(e);
  return false;
}

/* mean forward and backward ms over REPEAT runs after WARMUP; false on an error */
static bool time_core(struct core *c, cudaEvent_t ev[3], float *ms_f, float *ms_b) {
  *ms_f = *ms_b = 0;
  for (int it = 0; it < WARMUP + REPEAT; it++) {
    bool timed = it >= WARMUP;
    cudaEventRecord(ev[0], 0);
    if (!run_forward(c))
      return false;
    cudaEventRecord(ev[1], 0);
    if (!run_backward(c))
      return false;
    cudaEventRecord(ev[2], 0);
    if (!ok(cudaEventSynchronize(ev[2]), "run"))
      return false;
    float f = 0, b = 0;
    cudaEventElapsedTime(&f, ev[0], ev[1]);
    cudaEventElapsedTime(&b, ev[1], ev[2]);
    *ms_f += timed ? f : 0;
    *ms_b += timed ? b : 0;
  }
  *ms_f /= REPEAT;
  *ms_b /= REPEAT;
  return true;
}

static void report(const char *name, int S, float ms_f, float ms_b) {
  double flop_f = 4.0 * S * (double)S * HEAD_DIM * HEADS / 2, flop_b = 2.5 * flop_f;
  printf("%s S=%d H=%d KVH=%d D=%d causal, bf16 tensor cores:\n", name, S, HEADS, KV_HEADS,
         HEAD_DIM);
  printf("  forward  %8.3f ms  %6.1f TFLOP/s\n", ms_f, flop_f / (ms_f * 1e-3) / 1e12);
  printf("  backward %8.3f ms  %6.1f TFLOP/s\n", ms_b, flop_b / (ms_b * 1e-3) / 1e12);
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
  struct core c = {.S = S};
  c.q = device_floats(nq, rng), c.k = device_floats(nk, rng), c.v = device_floats(nk, rng);
  c.dy = device_floats(nq, rng), c.y = device_floats(nq, NULL), c.lse = device_floats(nl, NULL);
  c.dq = device_floats(nq, NULL), c.dk = device_floats(nk, NULL), c.dv = device_floats(nk, NULL);
  size_t sb = kc_flash_attention_scratch_bytes(1, S, HEADS, KV_HEADS, HEAD_DIM, true);
  c.scratch = device_floats(sb / sizeof(float) + 1, NULL);
  cudaEvent_t ev[3];
  for (int i = 0; i < 3; i++)
    if (!ok(cudaEventCreate(&ev[i]), "cudaEventCreate"))
      return 1;
  float ms_f, ms_b;
  if (!time_core(&c, ev, &ms_f, &ms_b))
    return 1;
  report("flash attention (own kernel)", S, ms_f, ms_b);
  int rc = 0;
  GError *e = NULL;
  if (!exec_cudnn_sdpa_built()) {
    printf("cudnn attention: not built (NO_CUDNN=1 or no cudnn.h)\n");
  } else if (!(c.cudnn = exec_cudnn_sdpa_new(&e))) {
    printf("cudnn attention: unavailable: %s\n", e->message);
    g_error_free(e);
  } else if (time_core(&c, ev, &ms_f, &ms_b)) {
    report("cudnn attention (with fp32<->bf16 conversions)", S, ms_f, ms_b);
  } else {
    rc = 1;
  }
  exec_cudnn_sdpa_free(c.cudnn);
  float *bufs[] = {c.q, c.k, c.v, c.dy, c.y, c.lse, c.dq, c.dk, c.dv, c.scratch};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    cudaFree(bufs[i]);
  g_rand_free(rng);
  return rc;
}
