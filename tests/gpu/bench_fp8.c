/* bench_fp8: the cuda backend's FP8 GEMMs (exec/backend_cuda_fp8.c) checked against the host
 * reference and timed. For each shape (row-major C[m,n] = A[m,k] B[k,n], A an activation, B a
 * weight: the forward's layout) and each recipe it
 *   - quantises A and B on the device (kernels/fp8.cu) and on the host (kernels/fp8.c): the
 *     e4m3 bytes and the scales must be the same bits;
 *   - multiplies them as the backend does (tensorwise: one cuBLASLt FP8 matmul with the two
 *     inverse scales as A/B_SCALE_POINTER; blockwise: one matmul per 128-wide K slice, promoted
 *     into C with the tiles' scales by kc_fp8_promote) and compares C with the product of the
 *     host's dequantised operands in double: within 2e-3 of max |C| (the tensor cores' FP8
 *     products are exact in fp32; their accumulation keeps at least 2^-13 of the sum's
 *     magnitude between cuBLASLt's fp32 promotions, 1e-3 over the k / 128 promotions of these
 *     shapes; the emulated GPU sums in double, so it meets 1e-6);
 *   - times quantisation + GEMM and the GEMM alone (median of 10 after 3), TFLOP/s (2mnk / t).
 * Usage: build/gpu/bench_fp8 [--small]   (--small: three small shapes, the emulated GPU's) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../kernels/fp8.h"
#define BENCH_NAME "bench_fp8"
#include "bench.h"

static double tol = 2e-3; /* 1e-6 on the emulated GPU (--small) */

struct shape {
  const char *what;
  int m, n, k;
};

/* the device side of one shape: operands, their e4m3 copies and scales, C, scratch */
struct dev {
  float *a, *b, *c, *part, *scales, *partials, *inv_a, *inv_b;
  uint8_t *qa, *qb;
  void *ws;
  size_t ws_bytes;
  cublasLtHandle_t lt;
  cudaStream_t st;
};

/* D [n, m] col-major (= row-major C [m, n], ld ldd) = alpha first^T second over ks of K from
 * k0 (both K-major, ld k) with the given scale pointers (or none) */
static void matmul(struct dev *d, const struct shape *s, int k0, int ks, const float *sa,
                   const float *sb, float *D, int ldd) {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  float alpha = 1.0f, beta = 0.0f;
  LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
  if (sa)
    LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
  if (sb)
    LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, ks, s->n, s->k));
  LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, ks, s->m, s->k));
  LK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s->n, s->m, ldd));
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulHeuristicResult_t r;
  int got = 0;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &d->ws_bytes, sizeof d->ws_bytes));
  LK(cublasLtMatmulAlgoGetHeuristic(d->lt, op, la, lb, lc, lc, pref, 1, &r, &got));
  if (!got) {
    fprintf(stderr, "bench_fp8: cuBLASLt has no FP8 algorithm for %dx%dx%d\n", s->m, s->n, ks);
    exit(1);
  }
  LK(cublasLtMatmul(d->lt, op, &alpha, d->qb + k0, la, d->qa + k0, lb, &beta, D, lc, D, lc,
                    &r.algo, d->ws, d->ws_bytes, d->st));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
}

/* quantise A ([m][k], K-major as stored) and B ([k][n]: K along its rows) as the recipe does */
static void quantize(struct dev *d, const struct shape *s, bool blocks) {
  if (blocks) {
    kc_fp8_quantize_tiles(d->qa, s->k, d->inv_a, d->a, false, s->m, s->k, s->k, false, 1, d->st);
    kc_fp8_quantize_tiles(d->qb, s->k, d->inv_b, d->b, false, s->k, s->n, s->n, true, 128, d->st);
    return;
  }
  kc_fp8_amax_scale(d->scales, d->partials, d->a, false, s->m, s->k, s->k, d->st);
  kc_fp8_quantize_tensor(d->qa, s->k, d->a, false, s->m, s->k, s->k, false, d->scales, d->st);
  kc_fp8_amax_scale(d->scales + 2, d->partials, d->b, false, s->k, s->n, s->n, d->st);
  kc_fp8_quantize_tensor(d->qb, s->k, d->b, false, s->k, s->n, s->n, true, d->scales + 2, d->st);
}

static void multiply(struct dev *d, const struct shape *s, bool blocks) {
  if (!blocks) {
    matmul(d, s, 0, s->k, d->scales + 3, d->scales + 1, d->c, s->n);
    return;
  }
  int nk = (s->k + 127) / 128;
  for (int sl = 0; sl < nk; sl++) {
    int ks = s->k - sl * 128 < 128 ? s->k - sl * 128 : 128;
    matmul(d, s, sl * 128, ks, NULL, NULL, d->part, s->n);
    kc_fp8_promote(d->c, s->n, d->part, s->m, s->n, 1.0f, 0.0f, sl == 0, d->inv_a, 1, d->inv_b,
                   128, nk, sl, d->st);
  }
}

/* one timed run: quantise + multiply (whole) or multiply alone (for bench_median_ms) */
struct fp8_run {
  struct dev *d;
  const struct shape *s;
  bool blocks, whole;
};

static bool run_once(void *arg) {
  struct fp8_run *r = arg;
  if (r->whole)
    quantize(r->d, r->s, r->blocks);
  multiply(r->d, r->s, r->blocks);
  return true;
}

static float time_it(struct dev *d, const struct shape *s, bool blocks, bool whole) {
  struct fp8_run r = {d, s, blocks, whole};
  return bench_median_ms(d->st, run_once, &r);
}

/* the host reference: q and scales the same bits as the device's, C within TOL of max |C| */
static bool check(struct dev *d, const struct shape *s, bool blocks, const float *a,
                  const float *b, double *err) {
  size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k, nk = (k + 127) / 128;
  uint8_t *qa = malloc(m * k), *qb = malloc(n * k), *ga = malloc(m * k), *gb = malloc(n * k);
  float *ia = malloc(sizeof(float) * m * nk), *ib = malloc(sizeof(float) * n * nk);
  float *gia = malloc(sizeof(float) * m * nk), *gib = malloc(sizeof(float) * n * nk);
  float *c = malloc(sizeof(float) * m * n), sc[4];
  size_t nib = blocks ? (n + 127) / 128 * nk : 1;
  if (blocks) {
    kernels_fp8_quantize_tiles(qa, ia, a, s->m, s->k, s->k, 0, 1);
    kernels_fp8_quantize_tiles(qb, ib, b, s->k, s->n, s->n, 1, 128);
  } else {
    ia[0] = kernels_fp8_quantize_tensor(qa, a, s->m, s->k, s->k, 0);
    ib[0] = kernels_fp8_quantize_tensor(qb, b, s->k, s->n, s->n, 1);
  }
  CK(cudaMemcpy(ga, d->qa, m * k, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gb, d->qb, n * k, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(c, d->c, sizeof(float) * m * n, cudaMemcpyDeviceToHost));
  if (blocks) {
    CK(cudaMemcpy(gia, d->inv_a, sizeof(float) * m * nk, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gib, d->inv_b, sizeof(float) * nib, cudaMemcpyDeviceToHost));
  } else {
    CK(cudaMemcpy(sc, d->scales, sizeof sc, cudaMemcpyDeviceToHost));
    gia[0] = sc[1], gib[0] = sc[3];
  }
  bool same = memcmp(qa, ga, m * k) == 0 && memcmp(qb, gb, n * k) == 0 &&
              memcmp(ia, gia, sizeof(float) * (blocks ? m * nk : 1)) == 0 &&
              memcmp(ib, gib, sizeof(float) * nib) == 0;
  double worst = 0, top = 0;
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++) {
      double sum = 0;
      for (size_t l = 0; l < k; l++) {
        double fa = blocks ? ia[i * nk + l / 128] : ia[0];
        double fb = blocks ? ib[(j / 128) * nk + l / 128] : ib[0];
        sum += kernels_fp8_e4m3_decode(qa[i * k + l]) * fa *
               (kernels_fp8_e4m3_decode(qb[j * k + l]) * fb);
      }
      worst = fmax(worst, fabs(sum - c[i * n + j]));
      top = fmax(top, fabs(sum));
    }
  *err = worst / (top > 0 ? top : 1);
  free(qa), free(qb), free(ga), free(gb), free(ia), free(ib), free(gia), free(gib), free(c);
  if (!same)
    fprintf(stderr, "bench_fp8: %s %s: the device's e4m3 bytes or scales differ from the host's\n",
            s->what, blocks ? "blockwise" : "tensorwise");
  return same && *err <= tol;
}

static float *random_fp32(size_t n, uint32_t seed, float **host) {
  float *h = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    /* a spread of magnitudes (2^-8 .. 1), as activations have: the scales matter */
    h[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * ldexpf(1.0f, -(int)(seed % 9));
  }
  float *dv = NULL;
  CK(cudaMalloc((void **)&dv, n * sizeof(float)));
  CK(cudaMemcpy(dv, h, n * sizeof(float), cudaMemcpyHostToDevice));
  *host = h;
  return dv;
}

static bool bench(struct dev *d, const struct shape *s, bool check_all) {
  size_t m = (size_t)s->m, n = (size_t)s->n, k = (size_t)s->k, nk = (k + 127) / 128;
  float *ha, *hb;
  d->a = random_fp32(m * k, 1, &ha), d->b = random_fp32(k * n, 2, &hb);
  CK(cudaMalloc((void **)&d->c, m * n * 4));
  CK(cudaMalloc((void **)&d->part, m * n * 4));
  CK(cudaMalloc((void **)&d->qa, m * k));
  CK(cudaMalloc((void **)&d->qb, n * k));
  CK(cudaMalloc((void **)&d->inv_a, m * nk * 4));
  CK(cudaMalloc((void **)&d->inv_b, n * nk * 4));
  bool ok = true;
  for (int blocks = 0; blocks < 2; blocks++) {
    double err = 0;
    quantize(d, s, blocks);
    multiply(d, s, blocks);
    CK(cudaStreamSynchronize(d->st));
    /* the host reference costs O(mnk) on the CPU (seconds at 1024^3): checked up to that */
    bool checked = check_all || m * n * k <= ((size_t)1 << 30);
    bool good = !checked || check(d, s, blocks, ha, hb, &err);
    float whole = time_it(d, s, blocks, true), gemm = time_it(d, s, blocks, false);
    printf("%-26s %6d %6d %6d  %-10s %8.1f %8.1f   %s\n", s->what, s->m, s->n, s->k,
           blocks ? "blockwise" : "tensorwise", bench_tflops(s->m, s->n, s->k, gemm),
           bench_tflops(s->m, s->n, s->k, whole),
           !checked ? "not checked (size)" : good ? "ok" : "FAIL");
    if (checked)
      printf("%-26s %6s %6s %6s  %-10s max |C - host| / max |C| = %.2e (tol %g)\n", "", "", "", "",
             "", err, tol);
    fflush(stdout);
    ok = ok && good;
  }
  CK(cudaFree(d->a));
  CK(cudaFree(d->b));
  CK(cudaFree(d->c));
  CK(cudaFree(d->part));
  CK(cudaFree(d->qa));
  CK(cudaFree(d->qb));
  CK(cudaFree(d->inv_a));
  CK(cudaFree(d->inv_b));
  free(ha), free(hb);
  return ok;
}

int main(int argc, char **argv) {
  static const struct shape large[] = {
      {"square (host-checked)", 1024, 1024, 1024},
      {"square", 2048, 2048, 2048},
      {"square", 8192, 8192, 8192},
      {"mlp up (llama3-8b, T 4096)", 4096, 14336, 4096},
      {"mlp down", 4096, 4096, 14336},
  };
  static const struct shape small[] = {
      {"tiny-moe attention", 64, 64, 64},
      {"two K slices", 48, 160, 256},
      {"a partial K slice", 32, 144, 208},
  };
  bool emu = argc > 1 && strcmp(argv[1], "--small") == 0;
  if (emu)
    tol = 1e-6;
  const struct shape *shapes = emu ? small : large;
  size_t n_shapes = emu ? sizeof small / sizeof small[0] : sizeof large / sizeof large[0];
  struct dev d = {0};
  struct cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  LK(cublasLtCreate(&d.lt));
  CK(cudaStreamCreateWithFlags(&d.st, cudaStreamNonBlocking));
  d.ws_bytes = (size_t)32 << 20;
  CK(cudaMalloc(&d.ws, d.ws_bytes));
  CK(cudaMalloc((void **)&d.scales, 4 * sizeof(float)));
  CK(cudaMalloc((void **)&d.partials, KC_FP8_PARTIALS * sizeof(float)));
  printf("bench_fp8: %s, cuBLASLt %zu; e4m3 operands, fp32 accumulation and output; TFLOP/s, "
         "median of %d\n",
         p.name, (size_t)cublasLtGetVersion(), REPS);
  printf("%-26s %6s %6s %6s  %-10s %8s %8s   %s\n", "shape", "m", "n", "k", "recipe", "GEMM",
         "+quant", "against the host");
  bool ok = true;
  for (size_t i = 0; i < n_shapes; i++)
    ok = bench(&d, &shapes[i], emu) && ok;
  CK(cudaFree(d.ws));
  CK(cudaFree(d.scales));
  CK(cudaFree(d.partials));
  cublasLtDestroy(d.lt);
  return ok ? 0 : 1;
}
