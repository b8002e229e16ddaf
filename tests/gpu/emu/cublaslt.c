/* cublaslt: include/cublasLt.h's matmul on the host (tests/gpu/emu/README.md). Column-major,
 * as cuBLASLt: element (r, c) of a layout is at r + c * ld; op(A) is [m, k], op(B) [k, n],
 * C and D [m, n]. The layouts' shapes must agree and every buffer must lie in device memory,
 * or the call fails as cuBLASLt's would (CUBLAS_STATUS_INVALID_VALUE), before touching D.
 * FP8 (CUDA_R_8F_E4M3 A and B) as on Hopper: only "TN" (A transposed, B not: both K-major),
 * leading dimensions and pointers 16-byte multiples (else the heuristic finds nothing), fp32
 * C and D; each e4m3 code decoded exactly, times the A and B scales
 * (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER: device floats read when the matmul
 * runs in stream order, 1 when unset), accumulated in double and rounded once to fp32. */
#include <cublasLt.h>
#include <glib.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "emu.h"

struct emu_lt {
  int unused;
};
struct emu_lt_desc {
  cublasOperation_t ta, tb;
  const float *a_scale, *b_scale; /* device, or NULL */
};
struct emu_lt_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct emu_lt_pref {
  size_t workspace;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  *h = g_new0(struct emu_lt, 1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  g_free(h);
  return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) {
  return 0;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = g_new0(struct emu_lt_desc, 1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  g_free(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t bytes) {
  if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER || attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) {
    if (bytes != sizeof(const float *))
      return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? &d->a_scale : &d->b_scale, buf,
           sizeof(const float *));
    return CUBLAS_STATUS_SUCCESS;
  }
  if (bytes != sizeof(cublasOperation_t))
    return CUBLAS_STATUS_INVALID_VALUE;
  cublasOperation_t op;
  memcpy(&op, buf, sizeof op);
  if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA)
    d->ta = op;
  else if (attr == CUBLASLT_MATMUL_DESC_TRANSB)
    d->tb = op;
  else
    return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (type != CUDA_R_32F && type != CUDA_R_16BF && type != CUDA_R_8F_E4M3)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < (int64_t)(rows ? rows : 1))
    return CUBLAS_STATUS_INVALID_VALUE; /* cuBLASLt: ld >= rows */
  *l = g_new0(struct emu_lt_layout, 1);
  **l = (struct emu_lt_layout){type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  g_free(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = g_new0(struct emu_lt_pref, 1);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  g_free(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t bytes) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (bytes != sizeof(uint64_t))
      return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t w;
    memcpy(&w, buf, sizeof w);
    p->workspace = (size_t)w;
    return CUBLAS_STATUS_SUCCESS;
  }
  return bytes == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

/* op(A) [m, k], op(B) [k, n], C and D [m, n]: false when the layouts disagree */
static bool shapes(const struct emu_lt_desc *d, const struct emu_lt_layout *a,
                   const struct emu_lt_layout *b, const struct emu_lt_layout *c, uint64_t *m,
                   uint64_t *n, uint64_t *k) {
  *m = c->rows;
  *n = c->cols;
  *k = d->ta == CUBLAS_OP_T ? a->rows : a->cols;
  uint64_t am = d->ta == CUBLAS_OP_T ? a->cols : a->rows;
  uint64_t bk = d->tb == CUBLAS_OP_T ? b->cols : b->rows;
  uint64_t bn = d->tb == CUBLAS_OP_T ? b->rows : b->cols;
  return am == *m && bk == *k && bn == *n && a->type == b->type && c->type == CUDA_R_32F;
}

/* What cuBLASLt's FP8 matmul accepts on Hopper: both operands K-major ("TN") with 16-byte
 * leading dimensions; scales only on FP8 operands. */
static bool fp8_ok(const struct emu_lt_desc *d, const struct emu_lt_layout *a,
                   const struct emu_lt_layout *b) {
  if (a->type != CUDA_R_8F_E4M3)
    return !d->a_scale && !d->b_scale;
  return d->ta == CUBLAS_OP_T && d->tb == CUBLAS_OP_N && a->ld % 16 == 0 && b->ld % 16 == 0;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int want,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *found) {
  uint64_t m, n, k;
  if (!h || !p || want < 1 || !shapes(d, a, b, c, &m, &n, &k) || dl->rows != m || dl->cols != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  memset(results, 0, sizeof *results);
  if (!fp8_ok(d, a, b)) {
    *found = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  results->state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

/* an e4m3 code's value (OCP E4M3FN: bias 7, subnormals, S.1111.111 NaN, no infinities) */
static double e4m3(uint8_t c) {
  int e = (c >> 3) & 15, m = c & 7;
  double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
  return c & 0x80 ? -v : v;
}

static double element(const void *base, const struct emu_lt_layout *l, uint64_t r, uint64_t c) {
  size_t i = (size_t)(r + c * (uint64_t)l->ld);
  if (l->type == CUDA_R_32F)
    return ((const float *)base)[i];
  if (l->type == CUDA_R_8F_E4M3)
    return e4m3(((const uint8_t *)base)[i]);
  uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* bytes from a layout's first element to one past its last */
static size_t extent(const struct emu_lt_layout *l) {
  size_t elem = l->type == CUDA_R_32F ? 4 : l->type == CUDA_R_8F_E4M3 ? 1 : 2;
  if (!l->rows || !l->cols)
    return 0;
  return ((l->cols - 1) * (size_t)l->ld + l->rows) * elem;
}

/* One matmul, its descriptors copied (the caller may destroy them once it returns) */
struct matmul {
  struct emu_lt_desc d;
  struct emu_lt_layout la, lb, lc, ld;
  const void *A, *B, *C;
  void *D;
  float alpha, beta;
  uint64_t m, n, k;
};

static void matmul_run(void *arg);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t la, const void *B,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                              cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  uint64_t m, n, k;
  if (!h || !algo || !shapes(d, la, lb, lc, &m, &n, &k) || ld->rows != m || ld->cols != n ||
      ld->ld != lc->ld || (workspace_bytes && !emu_device_range(workspace, workspace_bytes)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!fp8_ok(d, la, lb) ||
      (la->type == CUDA_R_8F_E4M3 && ((uintptr_t)A % 16 != 0 || (uintptr_t)B % 16 != 0)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d->a_scale)
    emu_check_device(d->a_scale, sizeof(float), "cublasLtMatmul A scale");
  if (d->b_scale)
    emu_check_device(d->b_scale, sizeof(float), "cublasLtMatmul B scale");
  emu_check_device(A, extent(la), "cublasLtMatmul A");
  emu_check_device(B, extent(lb), "cublasLtMatmul B");
  emu_check_device(D, extent(ld), "cublasLtMatmul D");
  float al = *(const float *)alpha, be = *(const float *)beta;
  if (be != 0.0f)
    emu_check_device(C, extent(lc), "cublasLtMatmul C");
  struct matmul *x = g_new(struct matmul, 1);
  *x = (struct matmul){*d, *la, *lb, *lc, *ld, A, B, C, D, al, be, m, n, k};
  emu_enqueue(stream, matmul_run, x);
  return CUBLAS_STATUS_SUCCESS;
}

static void matmul_run(void *arg) {
  struct matmul *x = arg;
  const struct emu_lt_desc *d = &x->d;
  const struct emu_lt_layout *la = &x->la, *lb = &x->lb, *lc = &x->lc, *ld = &x->ld;
  const void *A = x->A, *B = x->B, *C = x->C;
  float be = x->beta;
  /* the FP8 scales multiply alpha, in fp32, as cuBLASLt's epilogue does */
  float al = x->alpha * (d->a_scale ? *d->a_scale : 1.0f) * (d->b_scale ? *d->b_scale : 1.0f);
  uint64_t m = x->m, n = x->n, k = x->k;
  /* op(A) by rows and op(B) by columns, each contiguous along k: dot products */
  float *a = g_new(float, m * k + 1), *b = g_new(float, n * k + 1), *out = x->D;
  for (uint64_t i = 0; i < m; i++)
    for (uint64_t l = 0; l < k; l++)
      a[i * k + l] = d->ta == CUBLAS_OP_T ? element(A, la, l, i) : element(A, la, i, l);
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t l = 0; l < k; l++)
      b[j * k + l] = d->tb == CUBLAS_OP_T ? element(B, lb, j, l) : element(B, lb, l, j);
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t i = 0; i < m; i++) {
      const float *x = a + i * k, *y = b + j * k;
      double s = 0;
      for (uint64_t l = 0; l < k; l++)
        s += (double)x[l] * y[l];
      double c = be != 0.0f ? (double)be * ((const float *)C)[i + j * (uint64_t)lc->ld] : 0.0;
      out[i + j * (uint64_t)ld->ld] = (float)((double)al * s + c);
    }
  g_free(a);
  g_free(b);
  g_free(x);
}
