/* gemm: the one matrix-multiply entry point every host kernel uses (BLAS or reference loops). */
#include "kernels.h"

#include "../base/assert.h"

#include <string.h>

#ifdef HAVE_BLAS
#include <cblas.h>
#endif

/* C [m, n] = alpha * op(A) [m, k] * op(B) [k, n] + beta * C, row-major with leading dims. */
void kernels_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  PIPER_ASSERT(m >= 0 && n >= 0 && k >= 0);
  PIPER_ASSERT(ldc >= n);
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    /* BLAS rejects lda < 1 for k = 0 in some layouts; the result is just beta * C. */
    for (int i = 0; i < m; i++) {
      float *ci = c + (size_t)i * ldc;
      for (int j = 0; j < n; j++)
        ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
    }
    return;
  }
#ifdef HAVE_BLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  for (int i = 0; i < m; i++) {
    float *ci = c + (size_t)i * ldc;
    if (beta == 0.0f)
      memset(ci, 0, (size_t)n * sizeof(float));
    else if (beta != 1.0f)
      for (int j = 0; j < n; j++)
        ci[j] *= beta;
    if (!trans_b) {
      /* i-p-j order: the inner loop walks rows of B and C contiguously. */
      for (int p = 0; p < k; p++) {
        float aip = alpha * (trans_a ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
        const float *bp = b + (size_t)p * ldb;
        for (int j = 0; j < n; j++)
          ci[j] += aip * bp[j];
      }
    } else {
      for (int j = 0; j < n; j++) {
        const float *bj = b + (size_t)j * ldb;
        float s = 0.0f;
        for (int p = 0; p < k; p++)
          s += (trans_a ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) * bj[p];
        ci[j] += alpha * s;
      }
    }
  }
#endif
}
