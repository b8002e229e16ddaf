/* norm: embedding lookup, RMSNorm and the residual add (the ops without GEMMs but the head's). */
#include "kernels.h"
#include "kernels-impl.h"

#include "../base/assert.h"

#include <math.h>
#include <string.h>

size_t kernels_embedding_param_count(int V, int C) {
  return (size_t)V * C;
}

/* x [T, C] <- tokens [T], wte [V, C] */
void kernels_embedding_forward(float *x, const int32_t *tokens, const float *params, int T, int V,
                               int C) {
  (void)V; /* only checked */
  for (int t = 0; t < T; t++) {
    PIPER_ASSERT(tokens[t] >= 0 && tokens[t] < V);
    memcpy(x + (size_t)t * C, params + (size_t)tokens[t] * C, (size_t)C * sizeof(float));
  }
}

/* dwte [V, C] += scatter of dx [T, C] by tokens [T] */
void kernels_embedding_backward_weight(float *dparams, const float *dx, const int32_t *tokens,
                                       int T, int V, int C) {
  (void)V; /* only checked */
  for (int t = 0; t < T; t++) {
    PIPER_ASSERT(tokens[t] >= 0 && tokens[t] < V);
    float *dw = dparams + (size_t)tokens[t] * C;
    const float *d = dx + (size_t)t * C;
    for (int c = 0; c < C; c++)
      dw[c] += d[c];
  }
}

/* x [T, C] <- the rows of the vocabulary slice [lo, lo + n) (table [n, C]), zeros elsewhere */
void kernels_tp_embedding_forward(float *x, const int32_t *tokens, const float *table, int T,
                                  int C, int lo, int n) {
  for (int t = 0; t < T; t++) {
    int v = tokens[t] - lo;
    if (v >= 0 && v < n)
      memcpy(x + (size_t)t * C, table + (size_t)v * C, (size_t)C * sizeof(float));
    else
      memset(x + (size_t)t * C, 0, (size_t)C * sizeof(float));
  }
}

/* dtable [n, C] += dx [T, C] of the tokens in the slice [lo, lo + n) */
void kernels_tp_embedding_backward(float *dtable, const float *dx, const int32_t *tokens, int T,
                                   int C, int lo, int n) {
  for (int t = 0; t < T; t++) {
    int v = tokens[t] - lo;
    if (v < 0 || v >= n)
      continue;
    float *row = dtable + (size_t)v * C;
    const float *g = dx + (size_t)t * C;
    for (int c = 0; c < C; c++)
      row[c] += g[c];
  }
}

/* Fused backward: the embedding has BW only (dwte [V, C] += scatter of dx [T, C]). */
void kernels_embedding_backward(float *dparams, const float *dx, const int32_t *tokens, int T,
                                int V, int C) {
  kernels_embedding_backward_weight(dparams, dx, tokens, T, V, C);
}

size_t kernels_rmsnorm_param_count(int C) {
  return (size_t)C;
}
size_t kernels_rmsnorm_saved_floats(int T) {
  return (size_t)T;
}

/* h [T, C], rstd [T] <- x [T, C], w [C] */
KERNELS_IMPL_VECTOR
void kernels_rmsnorm_forward(float *h, float *saved, const float *x, const float *params, int T,
                             int C, float eps) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * C;
    float *ht = h + (size_t)t * C;
    double ss = kernels_impl_dot(xt, xt, (size_t)C);
    float rstd = (float)(1.0 / sqrt(ss / C + eps));
    saved[t] = rstd;
    for (int c = 0; c < C; c++)
      ht[c] = xt[c] * rstd * params[c];
  }
}

/* x [T, C] += y; h [T, C], rstd [T] <- x, w [C]: a row at a time, while it is in cache */
KERNELS_IMPL_VECTOR
void kernels_residual_rmsnorm_forward(float *x, float *h, float *saved, const float *y,
                                      const float *params, int T, int C, float eps) {
  for (int t = 0; t < T; t++) {
    float *xt = x + (size_t)t * C;
    const float *yt = y + (size_t)t * C;
    for (int c = 0; c < C; c++)
      xt[c] += yt[c];
    kernels_rmsnorm_forward(h + (size_t)t * C, saved + t, xt, params, 1, C, eps);
  }
}

/* sum of x[c] y[c] z[c] over [0, C), in double lanes (see kernels_impl_dot) */
KERNELS_IMPL_INLINE double dot3(const float *x, const float *y, const float *z, int C) {
  enum { L = KERNELS_IMPL_LANES };
  double lane[L] = {0};
  int c8 = C / L * L;
  for (int c = 0; c < c8; c += L)
    for (int l = 0; l < L; l++)
      lane[l] += (double)x[c + l] * y[c + l] * z[c + l];
  double sum = 0.0;
  for (int l = 0; l < L; l++)
    sum += lane[l];
  for (int c = c8; c < C; c++)
    sum += (double)x[c] * y[c] * z[c];
  return sum;
}

/* dx [T, C] (= or +=) <- dh [T, C], x [T, C], rstd [T], w [C]
 * dx_j = rstd * w_j dh_j - x_j * rstd^3 / C * sum_i w_i dh_i x_i */
KERNELS_IMPL_VECTOR
void kernels_rmsnorm_backward_input(float *dx, const float *dh, const float *x, const float *saved,
                                    const float *params, int T, int C, bool accumulate) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * C, *dht = dh + (size_t)t * C;
    float *dxt = dx + (size_t)t * C;
    float rstd = saved[t];
    double dot = dot3(dht, params, xt, C);
    float coef = (float)(dot * rstd * rstd * rstd / C);
    /* two loops, not a select per element: gcc vectorises neither branch of the select */
    if (accumulate)
      for (int c = 0; c < C; c++)
        dxt[c] += rstd * params[c] * dht[c] - xt[c] * coef;
    else
      for (int c = 0; c < C; c++)
        dxt[c] = rstd * params[c] * dht[c] - xt[c] * coef;
  }
}

/* dw [C] += sum_t dh * x * rstd */
KERNELS_IMPL_VECTOR
void kernels_rmsnorm_backward_weight(float *dparams, const float *dh, const float *x,
                                     const float *saved, int T, int C) {
  for (int t = 0; t < T; t++) {
    const float *xt = x + (size_t)t * C, *dht = dh + (size_t)t * C;
    for (int c = 0; c < C; c++)
      dparams[c] += dht[c] * xt[c] * saved[t];
  }
}

/* Fused backward: BI then BW, same shapes. */
void kernels_rmsnorm_backward(float *dx, float *dparams, const float *dh, const float *x,
                              const float *saved, const float *params, int T, int C,
                              bool accumulate) {
  kernels_rmsnorm_backward_input(dx, dh, x, saved, params, T, C, accumulate);
  kernels_rmsnorm_backward_weight(dparams, dh, x, saved, T, C);
}

/* x [n] += y [n] */
void kernels_residual_add_forward(float *x, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] += y[i];
}

/* dy [n] (= or +=) dx [n]; dx itself flows on unchanged. */
void kernels_residual_add_backward(float *dy, const float *dx, size_t n, bool accumulate) {
  if (!accumulate) {
    memcpy(dy, dx, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i++)
    dy[i] += dx[i];
}
