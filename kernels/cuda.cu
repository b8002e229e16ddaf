// cuda: the CUDA kernels of kernels_cuda.h. Each mirrors one step of the host reference in
// kernels/*.c (same formulas, fp32 throughout); row-wise reductions use one block per row and
// a fixed reduction tree, so results are deterministic run to run. Weight gradients that sum
// over tokens loop over the tokens in order inside one thread per column (no atomics). The
// elementwise and row kernels bf16 activations need are templates over the storage type
// (fp32 kc_*, bf16 kc_bf16_*): one body per op, so the two cannot drift apart.
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda_math.cuh"
#include "kernels_cuda.h"

namespace {

// Block-wide sum and max in a fixed order (cuda_block.cuh): every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float buf[kThreads];
  return block_sum_in(buf, v);
}

__device__ float block_max(float v) {
  __shared__ float buf[kThreads];
  return block_max_in(buf, v);
}

__global__ void fill_k(float *x, float v, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = v;
}

// Round to nearest even (__float2bfloat16_rn), a compact [rows, cols] copy of a strided one.
// Memory-bound: a contiguous source (ld == cols, the usual case) is copied with no index
// arithmetic; a strided one gets a row per grid row (y), columns along x.
__device__ uint16_t bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Four at a time (16-byte loads, 8-byte stores) where vec says the pointers allow it: the
// conversions are pure traffic, so their width is their speed.
__device__ uint2 bf16x4(float4 f) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(f.x, f.y), hi = __floats2bfloat162_rn(f.z, f.w);
  return make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
}

// The storage types of the templated elementwise and row kernels below, instantiated for
// fp32 (kc_*) and for bf16 bits in uint16_t (kc_bf16_*, bf16 models' activations): a value is
// widened to fp32 on load (exact), the arithmetic is fp32 (the formulas of cuda_math.cuh), and
// a stored result is rounded to nearest even once (bf16) or stored as it is (fp32). Per-row
// statistics (RMSNorm's rstd) and weight gradients stay fp32 in both: they sum over a row or
// over the tokens, where bf16's 8 significant bits would lose the small terms (the split
// Megatron and Transformer Engine make).
__device__ inline float ld(float x) {
  return x;
}

__device__ inline float ld(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

template <typename T> __device__ inline T st(float f) {
  return f;
}

template <> __device__ inline uint16_t st<uint16_t>(float f) {
  return bf16(f);
}

// Elementwise kernels below: quads [0, n4) (n4 = n / 4 when vec, else 0) by 16-byte
// vectors, then the elements [4 n4, n) one at a time.
#define FOR_QUADS(i, n4)                                                                     \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n4);                \
       i += (size_t)gridDim.x * blockDim.x)
#define FOR_TAIL(i, n4, n)                                                                   \
  for (size_t i = 4 * (n4) + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

__host__ __device__ bool aligned_to(unsigned bytes, const void *a, const void *b = NULL, const void *c = NULL) {
  return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & (bytes - 1)) == 0;
}

__global__ void to_bf16_k(uint16_t *dst, const float *src, size_t n, bool vec) {
  size_t n4 = vec ? n / 4 : 0;
  FOR_QUADS(i, n4)
  ((uint2 *)dst)[i] = bf16x4(((const float4 *)src)[i]);
  FOR_TAIL(i, n4, n)
  dst[i] = bf16(src[i]);
}

__global__ void to_bf16_strided_k(uint16_t *dst, const float *src, int rows, int cols, int ld) {
  for (int r = blockIdx.y; r < rows; r += gridDim.y)
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
      dst[(size_t)r * cols + c] =
          bf16(src[(size_t)r * ld + c]);
}

// bf16 bits widened to fp32 (exact): the outputs of cuDNN's bf16 attention back to fp32.
__global__ void from_bf16_k(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
  {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, sizeof u);
  }
}

template <typename T> __global__ void add_k(T *y, const T *x, size_t n, bool acc) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = acc ? st<T>(ld(y[i]) + ld(x[i])) : x[i];
}

// Rows [lo, lo + rows) of the vocabulary in wte (tensor parallelism's slice; the whole table:
// lo 0, rows INT_MAX): a token outside gets zeros. In bf16 each element is a copy, so the
// rounding is the only error.
template <typename E>
__global__ void embedding_fwd_k(E *x, const int32_t *tok, const float *wte, int T, int C, int lo,
                                int rows) {
  size_t n = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / C, c = i % C;
    int v = tok[t] - lo;
    x[i] = st<E>(v >= 0 && v < rows ? wte[(size_t)v * C + c] : 0.0f);
  }
}

// dwte[tok[t] - lo] += dx[t] for the tokens in the slice, t ascending per column: the serial
// walk (no scratch for chains); fp32 sums of the widened gradients in bf16.
template <typename E>
__global__ void embedding_bwd_k(float *dwte, const E *dx, const int32_t *tok, int T, int C, int lo,
                                int rows) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  for (int t = 0; t < T; t++) {
    int v = tok[t] - lo;
    if (v >= 0 && v < rows)
      dwte[(size_t)v * C + c] += ld(dx[(size_t)t * C + c]);
  }
}

// The positions of each token as a chain: next[t] = the next position holding tok[t] (-1:
// none), head[t] = 1 where no earlier position holds it. O(T^2) comparisons, a thread a
// position, every warp reading the same tok[u] at once.
__global__ void token_chains_k(int32_t *next, int32_t *head, const int32_t *tok, int T) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T)
    return;
  int v = tok[t], nx = -1, first = 1;
  for (int u = 0; u < T; u++)
    if (tok[u] == v) {
      first &= u >= t;
      if (u > t && nx < 0)
        nx = u;
    }
  next[t] = nx;
  head[t] = first;
}

// dwte[v] += the sum of dx over the positions holding token v, ascending: a (column, chain)
// per thread, so every row of dwte has one writer and the order is fixed.
__global__ void embedding_bwd_chain_k(float *dwte, const float *dx, const int32_t *tok,
                                      const int32_t *next, const int32_t *head, int T, int C) {
  for (int t = blockIdx.y; t < T; t += gridDim.y) {
    if (!head[t])
      continue;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
      float sum = 0.0f;
      for (int u = t; u >= 0; u = next[u])
        sum += dx[(size_t)u * C + c];
      dwte[(size_t)tok[t] * C + c] += sum;
    }
  }
}

// Row blockIdx.x of h and its rstd from its x, given each thread's sum of squares of the
// columns it holds (c = threadIdx.x, + blockDim.x, ...).
template <typename T>
__device__ void rmsnorm_row(T *h, float *rstd, const T *xr, const float *w, int C, float eps,
                            float ss) {
  ss = block_sum(ss);
  float r = 1.0f / sqrtf(ss / C + eps);
  if (threadIdx.x == 0)
    rstd[blockIdx.x] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    h[(size_t)blockIdx.x * C + c] = st<T>(ld(xr[c]) * r * w[c]);
}

template <typename T>
__global__ void rmsnorm_fwd_k(T *h, float *rstd, const T *x, const float *w, int C, float eps) {
  const T *xr = x + (size_t)blockIdx.x * C;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = ld(xr[c]);
    ss += v * v;
  }
  rmsnorm_row(h, rstd, xr, w, C, eps, ss);
}

// x += y, then rmsnorm_fwd_k on the sum: each thread adds the columns it then squares, in
// rmsnorm_fwd_k's order, so the bits are those of add_k followed by rmsnorm_fwd_k (in bf16:
// the norm reads the rounded sum, what the residual stream holds).
template <typename T>
__global__ void residual_rmsnorm_fwd_k(T *x, T *h, float *rstd, const T *y, const float *w, int C,
                                       float eps) {
  T *xr = x + (size_t)blockIdx.x * C;
  const T *yr = y + (size_t)blockIdx.x * C;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    T b = st<T>(ld(xr[c]) + ld(yr[c]));
    xr[c] = b;
    float v = ld(b);
    ss += v * v;
  }
  rmsnorm_row(h, rstd, xr, w, C, eps, ss);
}

template <typename T>
__global__ void rmsnorm_bwd_input_k(T *dx, const T *dh, const T *x, const float *rstd,
                                    const float *w, int C, bool acc) {
  size_t row = (size_t)blockIdx.x * C;
  float r = rstd[blockIdx.x];
  float dot = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += ld(dh[row + c]) * w[c] * ld(x[row + c]);
  dot = block_sum(dot);
  float k = dot * r * r * r / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float g = ld(dh[row + c]) * w[c] * r - ld(x[row + c]) * k;
    dx[row + c] = st<T>(acc ? ld(dx[row + c]) + g : g);
  }
}

// dw[c] += sum over t of dh x rstd: a block per 32 columns, kNormGroups row groups (rows g,
// g + kNormGroups, ...), whose sums are added in group order: deterministic, and T / 16 long
// loops instead of one thread per column walking all T rows.
constexpr int kNormGroups = 16;

template <typename E>
__global__ void rmsnorm_bwd_weight_k(float *dw, const E *dh, const E *x, const float *rstd, int T,
                                     int C) {
  __shared__ float part[kNormGroups][33];
  int c = blockIdx.x * 32 + threadIdx.x, g = threadIdx.y;
  float s = 0;
  if (c < C)
    for (int t = g; t < T; t += kNormGroups)
      s += ld(dh[(size_t)t * C + c]) * ld(x[(size_t)t * C + c]) * rstd[t];
  part[g][threadIdx.x] = s;
  __syncthreads();
  if (g == 0 && c < C) {
    float total = 0;
    for (int k = 0; k < kNormGroups; k++)
      total += part[k][threadIdx.x];
    dw[c] += total;
  }
}

// Position of row s of a sequence's S rows: s itself, or under context parallelism (cp > 1)
// the global position of CP rank r's chunks r and 2 cp - 1 - r, S / 2 rows each.
__device__ int rope_position(int s, int S, int cp, int r) {
  if (cp <= 1)
    return s;
  int L = S / 2;
  return s < L ? r * L + s : (2 * cp - 1 - r) * L + s - L;
}

template <typename T>
__global__ void rope_k(T *x, int B, int S, int H, int D, float theta, float factor, float lo,
                       float hi, int old_ctx, bool inverse, int cp, int cp_rank) {
  int half = D / 2;
  size_t n = (size_t)B * S * H * half;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
       idx += (size_t)gridDim.x * blockDim.x) {
    int i = (int)(idx % half);
    size_t rest = idx / half;
    int h = (int)(rest % H);
    size_t row = rest / H; // b * S + s
    int s = rope_position((int)(row % S), S, cp, cp_rank);
    double angle = s * rope_inv_freq(i, D, theta, factor, lo, hi, old_ctx);
    float cs = (float)cos(angle), sn = (float)sin(angle);
    if (inverse)
      sn = -sn;
    T *p = x + row * (size_t)H * D + (size_t)h * D;
    float a = ld(p[i]), b = ld(p[i + half]);
    p[i] = st<T>(a * cs - b * sn);
    p[i + half] = st<T>(b * cs + a * sn);
  }
}

template <typename T> __global__ void swiglu_fwd_k(T *act, const T *g, const T *u, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    act[i] = st<T>(silu(ld(g[i])) * ld(u[i]));
}

// The same with act in bf16 (bf16 models: act is only ever a GEMM operand).
__global__ void swiglu_fwd_bf16_k(uint16_t *act, const float *g, const float *u, size_t n,
                                  bool vec) {
  size_t n4 = vec ? n / 4 : 0;
  FOR_QUADS(i, n4) {
    float4 gi = ((const float4 *)g)[i], ui = ((const float4 *)u)[i];
    ((uint2 *)act)[i] = bf16x4(make_float4(silu(gi.x) * ui.x, silu(gi.y) * ui.y,
                                           silu(gi.z) * ui.z, silu(gi.w) * ui.w));
  }
  FOR_TAIL(i, n4, n)
  act[i] = bf16(silu(g[i]) * u[i]);
}

template <typename T>
__global__ void swiglu_bwd_k(T *dg, T *du, const T *dact, const T *g, const T *u, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float a, b;
    swiglu_grad(ld(dact[i]), ld(g[i]), ld(u[i]), &a, &b);
    dg[i] = st<T>(a);
    du[i] = st<T>(b);
  }
}

// dg and du in bf16 (bf16 models: both are only GEMM operands).
__global__ void swiglu_bwd_bf16_k(uint16_t *dg, uint16_t *du, const float *dact, const float *g,
                                  const float *u, size_t n, bool vec) {
  size_t n4 = vec ? n / 4 : 0;
  FOR_QUADS(i, n4) {
    float4 d = ((const float4 *)dact)[i], gi = ((const float4 *)g)[i];
    float4 ui = ((const float4 *)u)[i], a, b;
    swiglu_grad(d.x, gi.x, ui.x, &a.x, &b.x);
    swiglu_grad(d.y, gi.y, ui.y, &a.y, &b.y);
    swiglu_grad(d.z, gi.z, ui.z, &a.z, &b.z);
    swiglu_grad(d.w, gi.w, ui.w, &a.w, &b.w);
    ((uint2 *)dg)[i] = bf16x4(a);
    ((uint2 *)du)[i] = bf16x4(b);
  }
  FOR_TAIL(i, n4, n) {
    float a, b;
    swiglu_grad(dact[i], g[i], u[i], &a, &b);
    dg[i] = bf16(a);
    du[i] = bf16(b);
  }
}

// Row r of scores (query r % S), in place: the causal softmax, and the row's log-sum-exp of
// the scaled scores into lse[r] (what the backward recomputes the row from).
__global__ void causal_softmax_k(float *p, float *lse, int S, float scale) {
  float *row = p + (size_t)blockIdx.x * S;
  int q = blockIdx.x % S; // keys 0..q
  float mx = -INFINITY;
  for (int k = threadIdx.x; k <= q; k += blockDim.x)
    mx = fmaxf(mx, row[k] * scale);
  mx = block_max(mx);
  float sum = 0;
  for (int k = threadIdx.x; k <= q; k += blockDim.x)
    sum += expf(row[k] * scale - mx);
  sum = block_sum(sum);
  for (int k = threadIdx.x; k < S; k += blockDim.x)
    row[k] = k <= q ? expf(row[k] * scale - mx) / sum : 0.0f;
  if (threadIdx.x == 0)
    lse[blockIdx.x] = mx + logf(sum);
}

// The probabilities again from the scores and the forward's log-sum-exp (flash-style).
__global__ void causal_softmax_lse_k(float *p, const float *lse, int S, float scale) {
  float *row = p + (size_t)blockIdx.x * S;
  int q = blockIdx.x % S;
  float l = lse[blockIdx.x];
  for (int k = threadIdx.x; k < S; k += blockDim.x)
    row[k] = k <= q ? expf(row[k] * scale - l) : 0.0f;
}

__global__ void softmax_bwd_k(float *dp, const float *p, int S, float scale) {
  size_t off = (size_t)blockIdx.x * S;
  float dot = 0;
  for (int k = threadIdx.x; k < S; k += blockDim.x)
    dot += p[off + k] * dp[off + k];
  dot = block_sum(dot);
  for (int k = threadIdx.x; k < S; k += blockDim.x)
    dp[off + k] = p[off + k] * (dp[off + k] - dot) * scale;
}

// One thread per token: E and K are small (tens of experts).
__global__ void router_topk_k(int32_t *ids, float *weights, float *probs, int T, int E, int K) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T)
    return;
  float *p = probs + (size_t)t * E;
  float mx = -INFINITY;
  for (int e = 0; e < E; e++)
    mx = fmaxf(mx, p[e]);
  float sum = 0;
  for (int e = 0; e < E; e++) {
    p[e] = expf(p[e] - mx);
    sum += p[e];
  }
  for (int e = 0; e < E; e++)
    p[e] /= sum;
  float chosen = 0;
  for (int k = 0; k < K; k++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int j = 0; j < k; j++)
        taken |= ids[(size_t)t * K + j] == e;
      if (!taken && (best < 0 || p[e] > p[best]))
        best = e;
    }
    ids[(size_t)t * K + k] = best;
    chosen += p[best];
  }
  for (int k = 0; k < K; k++)
    weights[(size_t)t * K + k] = p[ids[(size_t)t * K + k]] / chosen;
}

__global__ void router_dlogits_k(float *dl, const float *dw, const int32_t *ids, const float *w,
                                 const float *probs, int T, int E, int K) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T)
    return;
  const float *p = probs + (size_t)t * E;
  const int32_t *id = ids + (size_t)t * K;
  float *d = dl + (size_t)t * E;
  float s = 0, wdw = 0;
  for (int k = 0; k < K; k++) {
    s += p[id[k]];
    wdw += dw[(size_t)t * K + k] * w[(size_t)t * K + k];
  }
  for (int e = 0; e < E; e++)
    d[e] = 0;
  for (int k = 0; k < K; k++)
    d[id[k]] = (dw[(size_t)t * K + k] - wdw) / s;
  float pdp = 0;
  for (int e = 0; e < E; e++)
    pdp += p[e] * d[e];
  for (int e = 0; e < E; e++)
    d[e] = p[e] * (d[e] - pdp);
}

// Sequential by design: the order (rank, token, slot) is a prefix count; T * K is small.
__global__ void dispatch_plan_k(int32_t *counts, int32_t *route_row, const int32_t *ids, int T,
                                int K, int E, int n_ranks) {
  int32_t row = 0;
  int per = E / n_ranks;
  for (int r = 0; r < n_ranks; r++) {
    int32_t start = row;
    for (size_t i = 0; i < (size_t)T * K; i++)
      if (ids[i] / per == r)
        route_row[i] = row++;
    counts[r] = row - start;
  }
}

__global__ void dispatch_fwd_k(float *send, int32_t *send_expert, float *send_weight,
                               const float *h, const int32_t *ids, const float *w,
                               const int32_t *route_row, int T, int K, int C) {
  size_t n = (size_t)T * K * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t route = i / C, c = i % C;
    size_t t = route / K;
    int row = route_row[route];
    send[(size_t)row * C + c] = h[t * C + c];
    if (c == 0) {
      send_expert[row] = ids[route];
      send_weight[row] = w[route];
    }
  }
}

// out[t] (= or +=) the sum of in's rows of token t's K routes, in slot order: the dispatch's
// backward (the routed rows' gradients back to the token) and the combine's forward (the
// expert outputs, weighted already by the experts, summed into the token's row).
__global__ void sum_routes_k(float *out, const float *in, const int32_t *route_row, int T, int K,
                             int C, bool acc) {
  size_t n = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / C, c = i % C;
    float s = 0;
    for (int k = 0; k < K; k++)
      s += in[(size_t)route_row[t * K + k] * C + c];
    out[i] = acc ? out[i] + s : s;
  }
}

__global__ void dispatch_bwd_w_k(float *dw, const float *dsend_w, const int32_t *route_row,
                                 size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dw[i] = dsend_w[route_row[i]];
}

__global__ void combine_bwd_k(float *dy, const float *dm, const int32_t *route_row, int T, int K,
                              int C) {
  size_t n = (size_t)T * K * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t route = i / C, c = i % C;
    dy[(size_t)route_row[route] * C + c] = dm[(route / K) * C + c];
  }
}

__global__ void rows_scale_k(float *x, const float *w, int rows, int n) {
  size_t total = (size_t)rows * n;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= w[i / n];
}

// One block per row: out[r] = x[r] . y[r] (block sum, a fixed order).
__global__ void rows_dot_k(float *out, const float *x, const float *y, int n) {
  size_t r = blockIdx.x;
  float dot = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    dot += x[r * n + j] * y[r * n + j];
  dot = block_sum(dot);
  if (threadIdx.x == 0)
    out[r] = dot;
}

__global__ void gather_rows_k(float *dst, const float *src, const int32_t *index, int n, int C) {
  size_t total = (size_t)n * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[(size_t)index[i / C] * C + i % C];
}

__global__ void scatter_rows_k(float *dst, const float *src, const int32_t *index, int n, int C,
                               bool acc) {
  size_t total = (size_t)n * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = (size_t)index[i / C] * C + i % C;
    dst[d] = acc ? dst[d] + src[i] : src[i];
  }
}

// A row of logits' max and its sum of exp(logit - max), every thread of the block getting both.
__device__ void row_softmax_stats(const float *row, int V, float *mx, float *sum) {
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    m = fmaxf(m, row[v]);
  m = block_max(m);
  float s = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    s += expf(row[v] - m);
  *mx = m;
  *sum = block_sum(s);
}

// One block per row of a chunk: the row's loss, max logit and 1 / sum of exp (saved layout of
// kernels/loss.c: max [T], then inv [T]); the logits are left as they are.
__global__ void xent_stats_k(float *rowloss, float *saved, const float *logits,
                             const int32_t *targets, int t0, int T, int V) {
  const float *row = logits + (size_t)blockIdx.x * V;
  int t = t0 + (int)blockIdx.x;
  float mx, sum;
  row_softmax_stats(row, V, &mx, &sum);
  if (threadIdx.x == 0) {
    rowloss[t] = -(row[targets[t]] - mx - logf(sum));
    saved[t] = mx;
    saved[T + t] = 1.0f / sum;
  }
}

// The mean in one block, rows in a fixed order.
__global__ void mean_k(float *out, const float *x, int n) {
  float s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0)
    *out = s / n;
}

// Row r of the chunk (grid y) over its V columns (grid x): to out16 (bf16, compact) when
// given, the GEMMs' operand, else in place over the logits.
__global__ void xent_bwd_k(float *dl, uint16_t *out16, const float *saved, const int32_t *targets,
                           int t0, int n, int T, int V, float scale) {
  for (int r = blockIdx.y; r < n; r += gridDim.y) {
    int t = t0 + r, target = targets[t];
    float mx = saved[t], inv = saved[T + t];
    size_t row = (size_t)r * V;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < V; v += gridDim.x * blockDim.x) {
      float p = expf(dl[row + v] - mx) * inv;
      float g = (p - (v == target ? 1.0f : 0.0f)) * scale;
      if (out16)
        out16[row + v] = bf16(g);
      else
        dl[row + v] = g;
    }
  }
}

// Tensor parallelism's LM head over the vocabulary slice [lo, lo + n): a block per row of the
// slice's logits [T, n]: stats [3, T] = its max, its sum of exp(logit - max), the target's
// logit (0 when the target is in another slice).
__global__ void tp_head_stats_k(float *stats, const float *logits, const int32_t *targets, int t0,
                                int T, int n, int lo) {
  const float *row = logits + (size_t)blockIdx.x * n;
  int t = t0 + (int)blockIdx.x;
  float mx, sum;
  row_softmax_stats(row, n, &mx, &sum);
  if (threadIdx.x == 0) {
    int tg = targets[t] - lo;
    stats[t] = mx;
    stats[T + t] = sum;
    stats[2 * (size_t)T + t] = tg >= 0 && tg < n ? row[tg] : 0.0f;
  }
}

// The group's stats [tp][3, T] merged a thread a row (in double, as the host's): saved = the
// max over the vocabulary, then 1 / the sum of exp; rowloss = max + log(sum) - target logit.
__global__ void tp_head_combine_k(float *rowloss, float *saved, const float *gathered, int tp,
                                  int T) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T)
    return;
  float m = gathered[t];
  for (int r = 1; r < tp; r++)
    m = fmaxf(m, gathered[(size_t)r * 3 * T + t]);
  double sum = 0.0, target = 0.0;
  for (int r = 0; r < tp; r++) {
    const float *st = gathered + (size_t)r * 3 * T;
    sum += (double)st[T + t] * exp((double)st[t] - (double)m);
    target += st[2 * (size_t)T + t];
  }
  saved[t] = m;
  saved[T + t] = (float)(1.0 / sum);
  rowloss[t] = (float)((double)m + log(sum) - target);
}

// targets as columns of the slice: target - lo, or -1 (no column) outside it
__global__ void slice_targets_k(int32_t *local, const int32_t *targets, int T, int lo, int n) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < T)
    local[t] = targets[t] - lo >= 0 && targets[t] - lo < n ? targets[t] - lo : -1;
}

__device__ void adamw_one(float &p, float g, float &m, float &v, float lr, float b1, float b2,
                          float eps, float wd, float bc1, float bc2) {
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  float mh = m / bc1, vh = v / bc2;
  p -= lr * (mh / (sqrtf(vh) + eps) + wd * p);
}

struct adamw_hyper {
  float lr, b1, b2, eps, wd, bc1, bc2;
};

// Four elements at a time where vec (16-byte loads and stores: the update is bound by its 28
// bytes of traffic per parameter), and the bf16 copy of the new weights when copy is given:
// 2 bytes more here against the 6 of remaking it from the weights afterwards.
__global__ void adamw_k(float *p, const float *g, float *m, float *v, uint16_t *copy, size_t n,
                        bool vec, adamw_hyper h) {
  size_t n4 = vec ? n / 4 : 0;
  FOR_QUADS(i, n4) {
    float4 pi = ((float4 *)p)[i], gi = ((const float4 *)g)[i];
    float4 mi = ((float4 *)m)[i], vi = ((float4 *)v)[i];
    adamw_one(pi.x, gi.x, mi.x, vi.x, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
    adamw_one(pi.y, gi.y, mi.y, vi.y, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
    adamw_one(pi.z, gi.z, mi.z, vi.z, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
    adamw_one(pi.w, gi.w, mi.w, vi.w, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
    ((float4 *)p)[i] = pi;
    ((float4 *)m)[i] = mi;
    ((float4 *)v)[i] = vi;
    if (copy)
      ((uint2 *)copy)[i] = bf16x4(pi);
  }
  FOR_TAIL(i, n4, n) {
    adamw_one(p[i], g[i], m[i], v[i], h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
    if (copy)
      copy[i] = bf16(p[i]);
  }
}

// The multi-tensor AdamW (kc_adamw_multi): block-sized chunks of every tensor in one grid;
// chunk c belongs to the last tensor whose first_chunk <= c (a binary search over the table,
// which the first_chunk prefix sums keep ascending). The same adamw_one per element as adamw_k,
// so the same bits as one launch per tensor.
__device__ int adamw_tensor_of(const kc_adamw_tensor *t, int n, size_t chunk) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (t[mid].first_chunk <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__global__ void adamw_multi_k(const kc_adamw_tensor *t, int n, size_t chunks, adamw_hyper h) {
  for (size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const kc_adamw_tensor &x = t[adamw_tensor_of(t, n, c)];
    size_t lo = (c - x.first_chunk) * (size_t)KC_ADAMW_CHUNK;
    size_t hi = lo + (size_t)KC_ADAMW_CHUNK < x.n ? lo + (size_t)KC_ADAMW_CHUNK : x.n;
    bool vec = aligned_to(16, x.params, x.grads, x.m) && aligned_to(16, x.v) && aligned_to(8, x.copy);
    size_t i = lo + 4 * threadIdx.x;
    for (; vec && i + 4 <= hi; i += 4 * blockDim.x) {
      float4 pi = *(float4 *)(x.params + i), gi = *(const float4 *)(x.grads + i);
      float4 mi = *(float4 *)(x.m + i), vi = *(float4 *)(x.v + i);
      adamw_one(pi.x, gi.x, mi.x, vi.x, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
      adamw_one(pi.y, gi.y, mi.y, vi.y, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
      adamw_one(pi.z, gi.z, mi.z, vi.z, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
      adamw_one(pi.w, gi.w, mi.w, vi.w, h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1, h.bc2);
      *(float4 *)(x.params + i) = pi;
      *(float4 *)(x.m + i) = mi;
      *(float4 *)(x.v + i) = vi;
      if (x.copy)
        *(uint2 *)(x.copy + i) = bf16x4(pi);
    }
    // the scalar rest: everything when not aligned, else the chunk's last (hi - lo) % 4
    for (i = vec ? lo + (hi - lo) / 4 * 4 + threadIdx.x : lo + threadIdx.x; i < hi; i += blockDim.x) {
      adamw_one(x.params[i], x.grads[i], x.m[i], x.v[i], h.lr, h.b1, h.b2, h.eps, h.wd, h.bc1,
                h.bc2);
      if (x.copy)
        x.copy[i] = bf16(x.params[i]);
    }
  }
}

} // namespace

extern "C" {

void kc_fill(float *x, float value, size_t n, cudaStream_t st) {
  if (n)
    fill_k<<<blocks_for(n), kThreads, 0, st>>>(x, value, n);
}

void kc_to_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld, cudaStream_t st) {
  size_t n = (size_t)rows * cols;
  if (!n)
    return;
  if (ld == cols) {
    bool vec = aligned_to(16, src) && aligned_to(8, dst);
    to_bf16_k<<<blocks_for(vec ? n / 4 : n), kThreads, 0, st>>>(dst, src, n, vec);
    return;
  }
  unsigned bx = (unsigned)((cols + kThreads - 1) / kThreads);
  dim3 grid(bx < 64 ? bx : 64, rows < 65535 ? (unsigned)rows : 65535u);
  to_bf16_strided_k<<<grid, kThreads, 0, st>>>(dst, src, rows, cols, ld);
}

void kc_from_bf16(float *dst, const uint16_t *src, size_t n, cudaStream_t st) {
  if (n)
    from_bf16_k<<<blocks_for(n), kThreads, 0, st>>>(dst, src, n);
}

// One block: each thread sums a strided share, then a tree in shared memory (a fixed order,
// so the same bits every run). Runs once per step over the gradients.
__global__ void sum_squares_k(double *sum, const float *x, size_t n) {
  __shared__ double part[kThreads];
  double acc = 0;
  for (size_t i = threadIdx.x; i < n; i += kThreads)
    acc += (double)x[i] * x[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h /= 2) {
    if ((int)threadIdx.x < h)
      part[threadIdx.x] += part[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    *sum += part[0];
}

__global__ void scale_k(float *x, float factor, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= factor;
}

void kc_sum_squares(double *sum, const float *x, size_t n, cudaStream_t st) {
  if (n)
    sum_squares_k<<<1, kThreads, 0, st>>>(sum, x, n);
}

void kc_scale(float *x, float factor, size_t n, cudaStream_t st) {
  if (n)
    scale_k<<<blocks_for(n), kThreads, 0, st>>>(x, factor, n);
}

void kc_add(float *y, const float *x, size_t n, bool acc, cudaStream_t st) {
  if (n)
    add_k<float><<<blocks_for(n), kThreads, 0, st>>>(y, x, n, acc);
}

void kc_embedding_forward(float *x, const int32_t *tok, const float *wte, int T, int C,
                          cudaStream_t st) {
  embedding_fwd_k<float><<<blocks_for((size_t)T * C), kThreads, 0, st>>>(x, tok, wte, T, C, 0,
                                                                          INT_MAX);
}

void kc_embedding_slice_forward(float *x, const int32_t *tok, const float *table, int T, int C,
                                int lo, int n, cudaStream_t st) {
  embedding_fwd_k<float><<<blocks_for((size_t)T * C), kThreads, 0, st>>>(x, tok, table, T, C, lo,
                                                                          n);
}

void kc_embedding_slice_backward(float *dtable, const float *dx, const int32_t *tok, int T, int C,
                                 int lo, int n, cudaStream_t st) {
  if (T && C)
    embedding_bwd_k<float><<<blocks_for(C), kThreads, 0, st>>>(dtable, dx, tok, T, C, lo, n);
}

void kc_embedding_backward(float *dwte, const float *dx, const int32_t *tok, int T, int C,
                           int32_t *scratch, cudaStream_t st) {
  if (!T || !C)
    return;
  if (!scratch) {
    embedding_bwd_k<float><<<blocks_for(C), kThreads, 0, st>>>(dwte, dx, tok, T, C, 0, INT_MAX);
    return;
  }
  int32_t *next = scratch, *head = scratch + T;
  token_chains_k<<<(T + kThreads - 1) / kThreads, kThreads, 0, st>>>(next, head, tok, T);
  unsigned bx = (unsigned)((C + kThreads - 1) / kThreads);
  dim3 grid(bx < 64 ? bx : 64, T < 65535 ? (unsigned)T : 65535u);
  embedding_bwd_chain_k<<<grid, kThreads, 0, st>>>(dwte, dx, tok, next, head, T, C);
}

void kc_rmsnorm_forward(float *h, float *rstd, const float *x, const float *w, int T, int C,
                        float eps, cudaStream_t st) {
  if (T)
    rmsnorm_fwd_k<float><<<T, kThreads, 0, st>>>(h, rstd, x, w, C, eps);
}

void kc_residual_rmsnorm_forward(float *x, float *h, float *rstd, const float *y, const float *w,
                                 int T, int C, float eps, cudaStream_t st) {
  if (T)
    residual_rmsnorm_fwd_k<float><<<T, kThreads, 0, st>>>(x, h, rstd, y, w, C, eps);
}

void kc_rmsnorm_backward_input(float *dx, const float *dh, const float *x, const float *rstd,
                               const float *w, int T, int C, bool acc, cudaStream_t st) {
  if (T)
    rmsnorm_bwd_input_k<float><<<T, kThreads, 0, st>>>(dx, dh, x, rstd, w, C, acc);
}

void kc_rmsnorm_backward_weight(float *dw, const float *dh, const float *x, const float *rstd,
                                int T, int C, cudaStream_t st) {
  if (C)
    rmsnorm_bwd_weight_k<float><<<(C + 31) / 32, dim3(32, kNormGroups), 0, st>>>(dw, dh, x, rstd,
                                                                                 T, C);
}

void kc_rope_cp(float *x, int B, int S, int cp, int cp_rank, int H, int D, float theta,
                float factor, float lo, float hi, int old_ctx, bool inverse, cudaStream_t st) {
  size_t n = (size_t)B * S * H * (D / 2);
  if (n)
    rope_k<float><<<blocks_for(n), kThreads, 0, st>>>(x, B, S, H, D, theta, factor, lo, hi, old_ctx,
                                                inverse, cp, cp_rank);
}

void kc_rope(float *x, int B, int S, int H, int D, float theta, float factor, float lo, float hi,
             int old_ctx, bool inverse, cudaStream_t st) {
  kc_rope_cp(x, B, S, 1, 0, H, D, theta, factor, lo, hi, old_ctx, inverse, st);
}

void kc_swiglu_forward(float *act, const float *g, const float *u, size_t n, cudaStream_t st) {
  if (n)
    swiglu_fwd_k<float><<<blocks_for(n), kThreads, 0, st>>>(act, g, u, n);
}

void kc_swiglu_forward_bf16(uint16_t *act, const float *g, const float *u, size_t n,
                            cudaStream_t st) {
  bool vec = aligned_to(16, g, u) && aligned_to(8, act);
  if (n)
    swiglu_fwd_bf16_k<<<blocks_for(vec ? n / 4 : n), kThreads, 0, st>>>(act, g, u, n, vec);
}

void kc_swiglu_backward(float *dg, float *du, const float *dact, const float *g, const float *u,
                        size_t n, cudaStream_t st) {
  if (n)
    swiglu_bwd_k<float><<<blocks_for(n), kThreads, 0, st>>>(dg, du, dact, g, u, n);
}

void kc_swiglu_backward_bf16(uint16_t *dg, uint16_t *du, const float *dact, const float *g,
                             const float *u, size_t n, cudaStream_t st) {
  bool vec = aligned_to(16, dact, g, u) && aligned_to(8, dg, du);
  if (n)
    swiglu_bwd_bf16_k<<<blocks_for(vec ? n / 4 : n), kThreads, 0, st>>>(dg, du, dact, g, u, n,
                                                                         vec);
}

void kc_causal_softmax(float *p, float *lse, int n_rows, int S, float scale, cudaStream_t st) {
  if (n_rows)
    causal_softmax_k<<<n_rows, kThreads, 0, st>>>(p, lse, S, scale);
}

void kc_causal_softmax_from_lse(float *p, const float *lse, int n_rows, int S, float scale,
                                cudaStream_t st) {
  if (n_rows)
    causal_softmax_lse_k<<<n_rows, kThreads, 0, st>>>(p, lse, S, scale);
}

void kc_softmax_backward(float *dp, const float *p, int n_rows, int S, float scale,
                         cudaStream_t st) {
  if (n_rows)
    softmax_bwd_k<<<n_rows, kThreads, 0, st>>>(dp, p, S, scale);
}

void kc_router_topk(int32_t *ids, float *w, float *probs, int T, int E, int K, cudaStream_t st) {
  router_topk_k<<<blocks_for(T), kThreads, 0, st>>>(ids, w, probs, T, E, K);
}

void kc_router_dlogits(float *dl, const float *dw, const int32_t *ids, const float *w,
                       const float *probs, int T, int E, int K, cudaStream_t st) {
  router_dlogits_k<<<blocks_for(T), kThreads, 0, st>>>(dl, dw, ids, w, probs, T, E, K);
}

void kc_moe_dispatch_plan(int32_t *counts, int32_t *route_row, const int32_t *ids, int T, int K,
                          int E, int n_ranks, cudaStream_t st) {
  dispatch_plan_k<<<1, 1, 0, st>>>(counts, route_row, ids, T, K, E, n_ranks);
}

void kc_moe_dispatch_forward(float *send, int32_t *send_expert, float *send_weight,
                             const float *h, const int32_t *ids, const float *weights,
                             const int32_t *route_row, int T, int K, int C, cudaStream_t st) {
  size_t n = (size_t)T * K * C;
  if (n)
    dispatch_fwd_k<<<blocks_for(n), kThreads, 0, st>>>(send, send_expert, send_weight, h, ids,
                                                        weights, route_row, T, K, C);
}

void kc_moe_dispatch_backward(float *dh, float *dweights, const float *dsend,
                              const float *dsend_weight, const int32_t *route_row, int T, int K,
                              int C, bool acc, cudaStream_t st) {
  size_t n = (size_t)T * C, tk = (size_t)T * K;
  if (n)
    sum_routes_k<<<blocks_for(n), kThreads, 0, st>>>(dh, dsend, route_row, T, K, C, acc);
  if (dweights && tk)
    dispatch_bwd_w_k<<<blocks_for(tk), kThreads, 0, st>>>(dweights, dsend_weight, route_row, tk);
}

void kc_moe_combine_forward(float *m, const float *y, const int32_t *route_row, int T, int K,
                            int C, cudaStream_t st) {
  size_t n = (size_t)T * C;
  if (n)
    sum_routes_k<<<blocks_for(n), kThreads, 0, st>>>(m, y, route_row, T, K, C, false);
}

void kc_moe_combine_backward(float *dy, const float *dm, const int32_t *route_row, int T, int K,
                             int C, cudaStream_t st) {
  size_t n = (size_t)T * K * C;
  if (n)
    combine_bwd_k<<<blocks_for(n), kThreads, 0, st>>>(dy, dm, route_row, T, K, C);
}

void kc_rows_scale(float *x, const float *w, int rows, int n, cudaStream_t st) {
  size_t total = (size_t)rows * n;
  if (total)
    rows_scale_k<<<blocks_for(total), kThreads, 0, st>>>(x, w, rows, n);
}

void kc_rows_dot(float *out, const float *x, const float *y, int rows, int n, cudaStream_t st) {
  if (rows > 0)
    rows_dot_k<<<rows, kThreads, 0, st>>>(out, x, y, n);
}

void kc_gather_rows(float *dst, const float *src, const int32_t *index, int n, int C,
                    cudaStream_t st) {
  size_t total = (size_t)n * C;
  if (total)
    gather_rows_k<<<blocks_for(total), kThreads, 0, st>>>(dst, src, index, n, C);
}

void kc_scatter_rows(float *dst, const float *src, const int32_t *index, int n, int C, bool acc,
                     cudaStream_t st) {
  size_t total = (size_t)n * C;
  if (total)
    scatter_rows_k<<<blocks_for(total), kThreads, 0, st>>>(dst, src, index, n, C, acc);
}

void kc_xent_stats(float *rowloss, float *saved, const float *logits, const int32_t *targets,
                   int t0, int n, int T, int V, cudaStream_t st) {
  if (n)
    xent_stats_k<<<n, kThreads, 0, st>>>(rowloss, saved, logits, targets, t0, T, V);
}

void kc_xent_mean(float *loss, const float *rowloss, int T, cudaStream_t st) {
  mean_k<<<1, kThreads, 0, st>>>(loss, rowloss, T);
}

void kc_tp_head_stats(float *stats, const float *logits, const int32_t *targets, int t0, int rows,
                      int T, int n, int lo, cudaStream_t st) {
  if (rows)
    tp_head_stats_k<<<rows, kThreads, 0, st>>>(stats, logits, targets, t0, T, n, lo);
}

void kc_tp_head_combine(float *loss, float *rowloss, float *saved, const float *gathered, int tp,
                        int T, cudaStream_t st) {
  if (T)
    tp_head_combine_k<<<blocks_for(T), kThreads, 0, st>>>(rowloss, saved, gathered, tp, T);
  mean_k<<<1, kThreads, 0, st>>>(loss, rowloss, T);
}

void kc_slice_targets(int32_t *local, const int32_t *targets, int T, int lo, int n,
                      cudaStream_t st) {
  if (T)
    slice_targets_k<<<blocks_for(T), kThreads, 0, st>>>(local, targets, T, lo, n);
}

void kc_xent_backward(float *dl, uint16_t *out16, const float *saved, const int32_t *targets,
                      int t0, int n, int T, int V, float scale, cudaStream_t st) {
  if (!n || !V)
    return;
  unsigned bx = (unsigned)((V + kThreads - 1) / kThreads);
  dim3 grid(bx < 64 ? bx : 64, n < 65535 ? (unsigned)n : 65535u);
  xent_bwd_k<<<grid, kThreads, 0, st>>>(dl, out16, saved, targets, t0, n, T, V, scale);
}

void kc_adamw_multi(const kc_adamw_tensor *table, int n, size_t chunks, float lr, float b1,
                    float b2, float eps, float wd, int step, cudaStream_t st) {
  adamw_hyper h = {lr, b1, b2, eps, wd, (float)(1.0 - pow((double)b1, step)),
                   (float)(1.0 - pow((double)b2, step))};
  if (n > 0 && chunks > 0)
    adamw_multi_k<<<blocks_for(chunks * kThreads), kThreads, 0, st>>>(table, n, chunks, h);
}

void kc_adamw(float *p, const float *g, float *m, float *v, uint16_t *copy, size_t n, float lr,
              float b1, float b2, float eps, float wd, int step, cudaStream_t st) {
  // bias corrections in double, as the host reference
  adamw_hyper h = {lr, b1, b2, eps, wd, (float)(1.0 - pow((double)b1, step)),
                   (float)(1.0 - pow((double)b2, step))};
  bool vec = aligned_to(16, p, g, m) && aligned_to(16, v) && aligned_to(8, copy);
  if (n)
    adamw_k<<<blocks_for(vec ? n / 4 : n), kThreads, 0, st>>>(p, g, m, v, copy, n, vec, h);
}

// The same kernels on bf16 activations (bits in uint16_t), for bf16 models.

void kc_bf16_add(uint16_t *y, const uint16_t *x, size_t n, bool acc, cudaStream_t st) {
  if (n)
    add_k<uint16_t><<<blocks_for(n), kThreads, 0, st>>>(y, x, n, acc);
}

void kc_bf16_rmsnorm_forward(uint16_t *h, float *rstd, const uint16_t *x, const float *w, int T,
                             int C, float eps, cudaStream_t st) {
  if (T)
    rmsnorm_fwd_k<uint16_t><<<T, kThreads, 0, st>>>(h, rstd, x, w, C, eps);
}

void kc_bf16_residual_rmsnorm_forward(uint16_t *x, uint16_t *h, float *rstd, const uint16_t *y,
                                      const float *w, int T, int C, float eps, cudaStream_t st) {
  if (T)
    residual_rmsnorm_fwd_k<uint16_t><<<T, kThreads, 0, st>>>(x, h, rstd, y, w, C, eps);
}

void kc_bf16_rmsnorm_backward_input(uint16_t *dx, const uint16_t *dh, const uint16_t *x,
                                    const float *rstd, const float *w, int T, int C, bool acc,
                                    cudaStream_t st) {
  if (T)
    rmsnorm_bwd_input_k<uint16_t><<<T, kThreads, 0, st>>>(dx, dh, x, rstd, w, C, acc);
}

void kc_bf16_rmsnorm_backward_weight(float *dw, const uint16_t *dh, const uint16_t *x,
                                     const float *rstd, int T, int C, cudaStream_t st) {
  if (C)
    rmsnorm_bwd_weight_k<uint16_t><<<(C + 31) / 32, dim3(32, kNormGroups), 0, st>>>(dw, dh, x,
                                                                                    rstd, T, C);
}

void kc_bf16_rope(uint16_t *x, int B, int S, int H, int D, float theta, float factor, float lo,
                  float hi, int old_ctx, bool inverse, cudaStream_t st) {
  size_t n = (size_t)B * S * H * (D / 2);
  if (n)
    rope_k<uint16_t><<<blocks_for(n), kThreads, 0, st>>>(x, B, S, H, D, theta, factor, lo,
                                                   hi, old_ctx, inverse, 1, 0);
}

void kc_bf16_swiglu_forward(uint16_t *act, const uint16_t *g, const uint16_t *u, size_t n,
                            cudaStream_t st) {
  if (n)
    swiglu_fwd_k<uint16_t><<<blocks_for(n), kThreads, 0, st>>>(act, g, u, n);
}

void kc_bf16_swiglu_backward(uint16_t *dg, uint16_t *du, const uint16_t *dact, const uint16_t *g,
                             const uint16_t *u, size_t n, cudaStream_t st) {
  if (n)
    swiglu_bwd_k<uint16_t><<<blocks_for(n), kThreads, 0, st>>>(dg, du, dact, g, u, n);
}

void kc_bf16_embedding_forward(uint16_t *x, const int32_t *tok, const float *table, int T, int C,
                               int lo, int n, cudaStream_t st) {
  if (T && C)
    embedding_fwd_k<uint16_t><<<blocks_for((size_t)T * C), kThreads, 0, st>>>(x, tok, table, T, C,
                                                                               lo, n);
}

void kc_bf16_embedding_backward(float *dtable, const uint16_t *dx, const int32_t *tok, int T,
                                int C, int lo, int n, cudaStream_t st) {
  if (T && C)
    embedding_bwd_k<uint16_t><<<blocks_for(C), kThreads, 0, st>>>(dtable, dx, tok, T, C, lo, n);
}

} // extern "C"
