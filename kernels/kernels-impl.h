/* kernels-impl: helpers private to kernels/ (scratch, exp, lane reductions, SwiGLU shared by
 * MLP and expert FFN). */
#ifndef PIPER_KERNELS_KERNELS_IMPL_H
#define PIPER_KERNELS_KERNELS_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Functions whose loops are most of a kernel's own time are compiled twice, for AVX2 and for
 * baseline x86-64 (SSE2), and the loader picks one per machine (function multiversioning).
 * Both do the same IEEE operations in the same order (no FMA: -std=c11 keeps contraction off;
 * the lane reductions below fix the order), so the same bits; the AVX2 copy is just 8 lanes
 * wide instead of 4 (SwiGLU at [512, 1376]: 1.0 against 2.3 ns per element). */
/* GCC only: clang's multiversioned functions leave the plain symbol undefined when a caller in
 * another file links against it (the sanitizer and fuzz builds use clang). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNELS_IMPL_VECTOR __attribute__((target_clones("avx2", "default")))
#else
#define KERNELS_IMPL_VECTOR
#endif

/* The helpers below must be inlined to be compiled for the caller's target. */
#if defined(__GNUC__) || defined(__clang__)
#define KERNELS_IMPL_INLINE static inline __attribute__((always_inline))
#else
#define KERNELS_IMPL_INLINE static inline
#endif

/* Per-thread scratch, one slot per user so that two kernels never share a buffer; the pointer
 * is valid until the same thread asks for the same slot again. */
enum kernels_scratch_slot {
  KERNELS_SCRATCH_ATTENTION_DS, /* attention BI: dS of one row block, [block, seq] floats */
  KERNELS_SCRATCH_ATTENTION_P,  /* attention F and BI: one row block's probabilities and a row */
  KERNELS_SCRATCH_ATTENTION_BLOCK, /* a CP block's row of scores, [n] floats */
  KERNELS_SCRATCH_ATTENTION_BLOCK_Y, /* a CP block's own y and lse before its merge */
  KERNELS_SCRATCH_LM_HEAD,      /* LM head F: a chunk of rows' logits */
  KERNELS_SCRATCH_TP_TARGETS,   /* TP's LM head: the targets as its vocabulary slice's columns */
  KERNELS_SCRATCH_SLOTS
};
void *kernels_impl_scratch(enum kernels_scratch_slot slot, size_t bytes);

/* exp(x) for float x, branch-free so that loops over it vectorise (libm's expf is a call per
 * element). Cephes expf: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 with ln 2 in
 * two parts, exp(r) by a degree-6 polynomial on |r| <= ln2 / 2; relative error under 2e-7
 * (about 2 ulp) against double exp on [-87, 88]. Exact at 0 (exp(0) = 1). Inputs are clamped
 * to [-87.33, 88.37], so it never returns 0, a subnormal or inf; x is never NaN here. */
KERNELS_IMPL_INLINE float kernels_impl_expf(float x) {
  x = x < 88.3762626647949f ? x : 88.3762626647949f;
  x = x > -87.3365447504f ? x : -87.3365447504f;
  /* round to nearest by the 1.5 * 2^23 trick (no floorf, which SSE2 cannot vectorise) */
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* Reductions over 8 lanes: a plain loop-carried sum or max does not vectorise without
 * reassociation (which the kernels' flags do not allow), a fixed set of lanes does. The lanes
 * are combined in order, so a result depends only on n and the inputs. Sums are kept in
 * double lanes: no worse than the sequential float sums they replace at any length. */
enum { KERNELS_IMPL_LANES = 8 };

/* max of x[0, n) (-inf for n = 0) */
KERNELS_IMPL_INLINE float kernels_impl_max(const float *x, size_t n) {
  enum { L = KERNELS_IMPL_LANES };
  float lane[L];
  for (int l = 0; l < L; l++)
    lane[l] = -INFINITY;
  size_t n8 = n / L * L;
  for (size_t j = 0; j < n8; j += L)
    for (int l = 0; l < L; l++)
      lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
  float m = -INFINITY;
  for (int l = 0; l < L; l++)
    m = lane[l] > m ? lane[l] : m;
  for (size_t j = n8; j < n; j++)
    m = x[j] > m ? x[j] : m;
  return m;
}

/* Sums of many floats: float lanes over chunks of this many elements (8 per lane), each
 * chunk's lanes then added into double lanes. Float lanes vectorise twice as wide as double
 * ones (1.1 against 1.6 ns per element in the attention softmax with AVX2); rounding errors
 * grow over 8 terms, not over the whole row. */
enum { KERNELS_IMPL_CHUNK = 8 * KERNELS_IMPL_LANES };

/* x[j] <- exp(x[j] - shift) for j in [0, n); returns their sum */
KERNELS_IMPL_INLINE double kernels_impl_exp_sum(float *x, size_t n, float shift) {
  enum { L = KERNELS_IMPL_LANES, K = KERNELS_IMPL_CHUNK };
  double lane[L] = {0};
  size_t n8 = n / L * L;
  for (size_t j0 = 0; j0 < n8; j0 += K) {
    size_t end = j0 + K < n8 ? j0 + K : n8;
    float part[L] = {0};
    for (size_t j = j0; j < end; j += L)
      for (int l = 0; l < L; l++) {
        float e = kernels_impl_expf(x[j + l] - shift);
        x[j + l] = e;
        part[l] += e;
      }
    for (int l = 0; l < L; l++)
      lane[l] += part[l];
  }
  double sum = 0.0;
  for (int l = 0; l < L; l++)
    sum += lane[l];
  for (size_t j = n8; j < n; j++)
    sum += (double)(x[j] = kernels_impl_expf(x[j] - shift));
  return sum;
}

/* sum of x[j] y[j] over [0, n), float products summed as kernels_impl_exp_sum sums */
KERNELS_IMPL_INLINE double kernels_impl_dot_f(const float *x, const float *y, size_t n) {
  enum { L = KERNELS_IMPL_LANES, K = KERNELS_IMPL_CHUNK };
  double lane[L] = {0};
  size_t n8 = n / L * L;
  for (size_t j0 = 0; j0 < n8; j0 += K) {
    size_t end = j0 + K < n8 ? j0 + K : n8;
    float part[L] = {0};
    for (size_t j = j0; j < end; j += L)
      for (int l = 0; l < L; l++)
        part[l] += x[j + l] * y[j + l];
    for (int l = 0; l < L; l++)
      lane[l] += part[l];
  }
  double sum = 0.0;
  for (int l = 0; l < L; l++)
    sum += lane[l];
  for (size_t j = n8; j < n; j++)
    sum += x[j] * y[j];
  return sum;
}

/* sum of x[j] y[j] over [0, n), the products in double */
KERNELS_IMPL_INLINE double kernels_impl_dot(const float *x, const float *y, size_t n) {
  enum { L = KERNELS_IMPL_LANES };
  double lane[L] = {0};
  size_t n8 = n / L * L;
  for (size_t j = 0; j < n8; j += L)
    for (int l = 0; l < L; l++)
      lane[l] += (double)x[j + l] * y[j + l];
  double sum = 0.0;
  for (int l = 0; l < L; l++)
    sum += lane[l];
  for (size_t j = n8; j < n; j++)
    sum += (double)x[j] * y[j];
  return sum;
}

/* x [rows, n] *= w[row], row by row (the routed experts' weighted activation) */
static inline void kernels_impl_rows_scale(float *x, const float *w, int rows, int n) {
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < n; j++)
      x[(size_t)r * n + j] *= w[r];
}

/* act = silu(g) * u over n elements; silu(g) = g * sigmoid(g). act must not alias g or u. */
void kernels_impl_swiglu_forward(float *act, const float *g, const float *u, size_t n);

/* On entry dg holds dact; on exit dg = dact * u * silu'(g), du = dact * silu(g), with
 * silu'(g) = sig * (1 + g * (1 - sig)). du must not alias g, u or dg. */
void kernels_impl_swiglu_backward(float *dg, float *du, const float *g, const float *u, size_t n);

#endif
