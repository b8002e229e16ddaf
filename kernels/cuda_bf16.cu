// cuda_bf16: the elementwise and row-wise kernels of kernels_cuda.h (kc_bf16_*) on activations
// stored in bf16 (bits in uint16_t), for bf16 models: every value is widened to fp32 on load,
// the arithmetic is cuda.cu's fp32 (the formulas of cuda_math.cuh), and each stored result is
// rounded to nearest even once. Per-row statistics (RMSNorm's rstd) and weight gradients stay
// fp32: they are summed over a row or over the tokens, where bf16's 8 significant bits would
// lose the small terms (the same split Megatron and Transformer Engine make). Deterministic as
// cuda.cu: one block per row with a fixed reduction tree; weight gradients sum the tokens in
// a fixed order.
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda_math.cuh"
#include "kernels_cuda.h"

namespace {

// bf16 bits widened to fp32 (exact) and fp32 rounded to nearest even into bf16 bits.
__device__ float ld16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

__device__ uint16_t st16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

#define FOR_EACH(i, n)                                                                       \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                 \
       i += (size_t)gridDim.x * blockDim.x)

__global__ void add16_k(uint16_t *y, const uint16_t *x, size_t n, bool acc) {
  FOR_EACH(i, n)
  y[i] = acc ? st16(ld16(y[i]) + ld16(x[i])) : x[i];
}

// Row blockIdx.x of h and its rstd from its (bf16) x, given each thread's sum of squares of
// the columns it holds.
__device__ void rmsnorm_row16(uint16_t *h, float *rstd, const uint16_t *xr, const float *w, int C,
                              float eps, float ss) {
  __shared__ float buf[kThreads];
  ss = block_sum_in(buf, ss);
  float r = 1.0f / sqrtf(ss / C + eps);
  if (threadIdx.x == 0)
    rstd[blockIdx.x] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    h[(size_t)blockIdx.x * C + c] = st16(ld16(xr[c]) * r * w[c]);
}

__global__ void rmsnorm_fwd16_k(uint16_t *h, float *rstd, const uint16_t *x, const float *w, int C,
                                float eps) {
  const uint16_t *xr = x + (size_t)blockIdx.x * C;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = ld16(xr[c]);
    ss += v * v;
  }
  rmsnorm_row16(h, rstd, xr, w, C, eps, ss);
}

// x += y (rounded to bf16), then the norm of the rounded sum: what the residual stream holds
// is what the norm read, as with the two ops one after the other.
__global__ void residual_rmsnorm_fwd16_k(uint16_t *x, uint16_t *h, float *rstd, const uint16_t *y,
                                         const float *w, int C, float eps) {
  uint16_t *xr = x + (size_t)blockIdx.x * C;
  const uint16_t *yr = y + (size_t)blockIdx.x * C;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    uint16_t b = st16(ld16(xr[c]) + ld16(yr[c]));
    xr[c] = b;
    float v = ld16(b);
    ss += v * v;
  }
  rmsnorm_row16(h, rstd, xr, w, C, eps, ss);
}

__global__ void rmsnorm_bwd_input16_k(uint16_t *dx, const uint16_t *dh, const uint16_t *x,
                                      const float *rstd, const float *w, int C, bool acc) {
  __shared__ float buf[kThreads];
  size_t row = (size_t)blockIdx.x * C;
  float r = rstd[blockIdx.x];
  float dot = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += ld16(dh[row + c]) * w[c] * ld16(x[row + c]);
  dot = block_sum_in(buf, dot);
  float k = dot * r * r * r / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float g = ld16(dh[row + c]) * w[c] * r - ld16(x[row + c]) * k;
    dx[row + c] = st16(acc ? ld16(dx[row + c]) + g : g);
  }
}

// dw[c] += sum over t of dh x rstd, in fp32: cuda.cu's rmsnorm_bwd_weight_k (a block per 32
// columns, kNormGroups row groups added in group order) on widened bf16 inputs
constexpr int kNormGroups = 16;

__global__ void rmsnorm_bwd_weight16_k(float *dw, const uint16_t *dh, const uint16_t *x,
                                       const float *rstd, int T, int C) {
  __shared__ float part[kNormGroups][33];
  int c = blockIdx.x * 32 + threadIdx.x, g = threadIdx.y;
  float s = 0;
  if (c < C)
    for (int t = g; t < T; t += kNormGroups)
      s += ld16(dh[(size_t)t * C + c]) * ld16(x[(size_t)t * C + c]) * rstd[t];
  part[g][threadIdx.x] = s;
  __syncthreads();
  if (g == 0 && c < C) {
    float total = 0;
    for (int k = 0; k < kNormGroups; k++)
      total += part[k][threadIdx.x];
    dw[c] += total;
  }
}

__global__ void rope16_k(uint16_t *x, int B, int S, int H, int D, float theta, float factor,
                         float lo, float hi, int old_ctx, bool inverse) {
  int half = D / 2;
  size_t n = (size_t)B * S * H * half;
  FOR_EACH(idx, n) {
    int i = (int)(idx % half);
    size_t rest = idx / half;
    int h = (int)(rest % H);
    size_t row = rest / H; // b * S + s
    int s = (int)(row % S);
    double angle = s * rope_inv_freq(i, D, theta, factor, lo, hi, old_ctx);
    float cs = (float)cos(angle), sn = (float)sin(angle);
    if (inverse)
      sn = -sn;
    uint16_t *p = x + row * (size_t)H * D + (size_t)h * D;
    float a = ld16(p[i]), b = ld16(p[i + half]);
    p[i] = st16(a * cs - b * sn);
    p[i + half] = st16(b * cs + a * sn);
  }
}

__global__ void swiglu_fwd16_k(uint16_t *act, const uint16_t *g, const uint16_t *u, size_t n) {
  FOR_EACH(i, n)
  act[i] = st16(silu(ld16(g[i])) * ld16(u[i]));
}

__global__ void swiglu_bwd16_k(uint16_t *dg, uint16_t *du, const uint16_t *dact, const uint16_t *g,
                               const uint16_t *u, size_t n) {
  FOR_EACH(i, n) {
    float a, b;
    swiglu_grad(ld16(dact[i]), ld16(g[i]), ld16(u[i]), &a, &b);
    dg[i] = st16(a);
    du[i] = st16(b);
  }
}

// Rows [lo, lo + rows) of the vocabulary in table (fp32, the optimizer's store; the whole
// table: lo 0, rows INT_MAX): a token outside gets zeros. Each element is a copy, so the
// rounding to bf16 is the only error.
__global__ void embedding_fwd16_k(uint16_t *x, const int32_t *tok, const float *table, int T,
                                  int C, int lo, int rows) {
  size_t n = (size_t)T * C;
  FOR_EACH(i, n) {
    size_t t = i / C, c = i % C;
    int v = tok[t] - lo;
    x[i] = v >= 0 && v < rows ? st16(table[(size_t)v * C + c]) : (uint16_t)0;
  }
}

// dtable[tok[t] - lo] += dx[t] (fp32 sums of the widened bf16 gradients) for the tokens in the
// slice, t ascending per column: the serial walk, deterministic.
__global__ void embedding_bwd16_k(float *dtable, const uint16_t *dx, const int32_t *tok, int T,
                                  int C, int lo, int rows) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  for (int t = 0; t < T; t++) {
    int v = tok[t] - lo;
    if (v >= 0 && v < rows)
      dtable[(size_t)v * C + c] += ld16(dx[(size_t)t * C + c]);
  }
}

} // namespace

extern "C" {

void kc_bf16_add(uint16_t *y, const uint16_t *x, size_t n, bool acc, cudaStream_t st) {
  if (n)
    add16_k<<<blocks_for(n), kThreads, 0, st>>>(y, x, n, acc);
}

void kc_bf16_rmsnorm_forward(uint16_t *h, float *rstd, const uint16_t *x, const float *w, int T,
                             int C, float eps, cudaStream_t st) {
  if (T)
    rmsnorm_fwd16_k<<<T, kThreads, 0, st>>>(h, rstd, x, w, C, eps);
}

void kc_bf16_residual_rmsnorm_forward(uint16_t *x, uint16_t *h, float *rstd, const uint16_t *y,
                                      const float *w, int T, int C, float eps, cudaStream_t st) {
  if (T)
    residual_rmsnorm_fwd16_k<<<T, kThreads, 0, st>>>(x, h, rstd, y, w, C, eps);
}

void kc_bf16_rmsnorm_backward_input(uint16_t *dx, const uint16_t *dh, const uint16_t *x,
                                    const float *rstd, const float *w, int T, int C, bool acc,
                                    cudaStream_t st) {
  if (T)
    rmsnorm_bwd_input16_k<<<T, kThreads, 0, st>>>(dx, dh, x, rstd, w, C, acc);
}

void kc_bf16_rmsnorm_backward_weight(float *dw, const uint16_t *dh, const uint16_t *x,
                                     const float *rstd, int T, int C, cudaStream_t st) {
  if (C)
    rmsnorm_bwd_weight16_k<<<(C + 31) / 32, dim3(32, kNormGroups), 0, st>>>(dw, dh, x, rstd, T,
                                                                             C);
}

void kc_bf16_rope(uint16_t *x, int B, int S, int H, int D, float theta, float factor, float lo,
                  float hi, int old_ctx, bool inverse, cudaStream_t st) {
  size_t n = (size_t)B * S * H * (D / 2);
  if (n)
    rope16_k<<<blocks_for(n), kThreads, 0, st>>>(x, B, S, H, D, theta, factor, lo, hi, old_ctx,
                                                inverse);
}

void kc_bf16_swiglu_forward(uint16_t *act, const uint16_t *g, const uint16_t *u, size_t n,
                            cudaStream_t st) {
  if (n)
    swiglu_fwd16_k<<<blocks_for(n), kThreads, 0, st>>>(act, g, u, n);
}

void kc_bf16_swiglu_backward(uint16_t *dg, uint16_t *du, const uint16_t *dact, const uint16_t *g,
                             const uint16_t *u, size_t n, cudaStream_t st) {
  if (n)
    swiglu_bwd16_k<<<blocks_for(n), kThreads, 0, st>>>(dg, du, dact, g, u, n);
}

void kc_bf16_embedding_forward(uint16_t *x, const int32_t *tok, const float *table, int T, int C,
                               int lo, int n, cudaStream_t st) {
  if (T && C)
    embedding_fwd16_k<<<blocks_for((size_t)T * C), kThreads, 0, st>>>(x, tok, table, T, C, lo, n);
}

void kc_bf16_embedding_backward(float *dtable, const uint16_t *dx, const int32_t *tok, int T,
                                int C, int lo, int n, cudaStream_t st) {
  if (T && C)
    embedding_bwd16_k<<<blocks_for(C), kThreads, 0, st>>>(dtable, dx, tok, T, C, lo, n);
}

} // extern "C"
