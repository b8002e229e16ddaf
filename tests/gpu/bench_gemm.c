/* bench_gemm: what cuBLASLt gives for the GEMMs the cuda backend runs, and what the backend's
 * choices cost. For each shape (row-major C[m,n] = op(A) op(B), the backend's convention) and
 * transpose pattern it times, on random bf16 operands with fp32 accumulation:
 *   - fp32 output, the heuristic's first algorithm, 32 MiB workspace (what the backend does);
 *   - bf16 output, same algorithm choice (what bf16 activations would write);
 *   - fp32 output, the fastest of the heuristic's first 8 algorithms, timed (autotuning);
 *   - fp32 output with a 256 MiB workspace.
 * Each figure is the median of 10 timed runs after 3 untimed ones, in TFLOP/s (2mnk / time).
 * Usage: build/gpu/bench_gemm            (tools/gpu-check.sh runs it and keeps its table) */
#include <stdint.h>
#include <string.h>

#define BENCH_NAME "bench_gemm"
#include "bench.h"

enum { CANDIDATES = 8 };

struct shape {
  const char *what;
  int m, n, k;
  bool ta, tb;
};

struct gemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const void *first, *second;
  void *c;
  void *ws;
  size_t ws_bytes;
  cudaStream_t st;
};

/* one run of algo on g (for bench_median_ms) */
struct gemm_run {
  struct gemm *g;
  const cublasLtMatmulAlgo_t *algo;
};

static bool run_algo(void *arg) {
  struct gemm_run *r = arg;
  struct gemm *g = r->g;
  float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(g->lt, g->op, &alpha, g->first, g->la, g->second, g->lb, &beta, g->c,
                        g->lc, g->c, g->lc, r->algo, g->ws, g->ws_bytes,
                        g->st) == CUBLAS_STATUS_SUCCESS;
}

/* median milliseconds of algo on g */
static float time_algo(struct gemm *g, const cublasLtMatmulAlgo_t *algo) {
  struct gemm_run r = {g, algo};
  return bench_median_ms(g->st, run_algo, &r);
}

/* the heuristic's answers for g (column-major view: C^T = op(B)^T op(A)^T, B first) */
static int heuristics(struct gemm *g, cublasLtMatmulHeuristicResult_t *r, int want) {
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &g->ws_bytes, sizeof g->ws_bytes));
  int got = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(g->lt, g->op, g->la, g->lb, g->lc, g->lc, pref, want, r, &got));
  cublasLtMatmulPreferenceDestroy(pref);
  return got;
}

static void layouts(struct gemm *g, const struct shape *s, cudaDataType_t out) {
  cublasOperation_t opa = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LK(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  /* B row-major [k,n] (or [n,k] transposed) is column-major [n,k] (or [k,n]) */
  int ldb = s->tb ? s->k : s->n, lda = s->ta ? s->m : s->k;
  LK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, s->tb ? s->k : s->n, s->tb ? s->n : s->k,
                                ldb));
  LK(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, s->ta ? s->m : s->k, s->ta ? s->k : s->m,
                                lda));
  LK(cublasLtMatrixLayoutCreate(&g->lc, out, s->n, s->m, s->n));
}

static void free_layouts(struct gemm *g) {
  cublasLtMatrixLayoutDestroy(g->lc);
  cublasLtMatrixLayoutDestroy(g->lb);
  cublasLtMatrixLayoutDestroy(g->la);
  cublasLtMatmulDescDestroy(g->op);
}

static void *random_bf16(size_t n, uint32_t seed) {
  uint16_t *h = malloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    float x = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.2f;
    uint32_t u;
    memcpy(&u, &x, 4);
    h[i] = (uint16_t)(u >> 16);
  }
  void *d = NULL;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static double tflops(const struct shape *s, float ms) {
  return bench_tflops(s->m, s->n, s->k, ms);
}

static void bench(struct gemm *g, const struct shape *s, void *ws_big, size_t ws_big_bytes) {
  void *a = random_bf16((size_t)s->m * s->k, 1), *b = random_bf16((size_t)s->k * s->n, 2);
  CK(cudaMalloc(&g->c, (size_t)s->m * s->n * 4));
  g->first = b, g->second = a;
  cublasLtMatmulHeuristicResult_t r[CANDIDATES];
  double f[4] = {0};
  layouts(g, s, CUDA_R_32F);
  int got = heuristics(g, r, CANDIDATES);
  f[0] = got ? tflops(s, time_algo(g, &r[0].algo)) : 0;
  float best = 1e30f;
  for (int i = 0; i < got; i++) {
    float t = time_algo(g, &r[i].algo);
    if (t > 0 && t < best)
      best = t;
  }
  f[2] = got ? tflops(s, best) : 0;
  void *ws = g->ws;
  size_t wsb = g->ws_bytes;
  g->ws = ws_big, g->ws_bytes = ws_big_bytes;
  got = heuristics(g, r, 1);
  f[3] = got ? tflops(s, time_algo(g, &r[0].algo)) : 0;
  g->ws = ws, g->ws_bytes = wsb;
  free_layouts(g);
  layouts(g, s, CUDA_R_16BF);
  got = heuristics(g, r, 1);
  f[1] = got ? tflops(s, time_algo(g, &r[0].algo)) : 0;
  free_layouts(g);
  printf("%-28s %6d %6d %6d  %c%c   %7.1f  %7.1f  %7.1f  %7.1f\n", s->what, s->m, s->n, s->k,
         s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', f[0], f[1], f[2], f[3]);
  fflush(stdout);
  CK(cudaFree(g->c));
  CK(cudaFree(a));
  CK(cudaFree(b));
}

int main(void) {
  static const struct shape shapes[] = {
      {"square", 4096, 4096, 4096, false, false},
      {"square", 8192, 8192, 8192, false, false},
      {"mlp up (llama3-8b, T 4096)", 4096, 14336, 4096, false, false},
      {"mlp down", 4096, 4096, 14336, false, false},
      {"mlp BI (dh = dg w^T)", 4096, 4096, 14336, false, true},
      {"mlp BW (dw = h^T dg)", 4096, 14336, 4096, true, false},
      {"lm head chunk 2048 rows", 2048, 128256, 4096, false, false},
      {"lm head chunk 130 rows", 130, 128256, 4096, false, false},
  };
  struct gemm g = {0};
  int dev = 0;
  struct cudaDeviceProp p;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&p, dev));
  LK(cublasLtCreate(&g.lt));
  CK(cudaStreamCreate(&g.st));
  g.ws_bytes = (size_t)32 << 20;
  size_t big = (size_t)256 << 20;
  void *ws_big = NULL;
  CK(cudaMalloc(&g.ws, g.ws_bytes));
  CK(cudaMalloc(&ws_big, big));
  printf("bench_gemm: %s, cuBLASLt %zu; bf16 operands, fp32 accumulation; TFLOP/s, median of %d\n",
         p.name, cublasLtGetVersion(), REPS);
  printf("%-28s %6s %6s %6s  op   %7s  %7s  %7s  %7s\n", "shape", "m", "n", "k", "fp32out",
         "bf16out", "best8", "ws256M");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    bench(&g, &shapes[i], ws_big, big);
  CK(cudaFree(ws_big));
  CK(cudaFree(g.ws));
  cublasLtDestroy(g.lt);
  return 0;
}
