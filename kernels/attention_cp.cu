// attention_cp: the row-wise steps of context parallelism's attention blocks on the GPU
// (kernels_cuda.h: kc_attention_*), the device twins of kernels/attention_cp.c: a block's
// causal softmax by global positions (the diagonal shifted by the chunks' offsets), its
// backward against the whole row's rowsum(dy y), and the log-sum-exp merge of partial results.
// The cuda backend's unfused block (exec/backend_cuda_attention_cp.c) runs its GEMMs around
// these. One warp per row (a block's rows are a chunk's keys: hundreds to thousands), a fixed
// reduction tree: deterministic.
#include <math.h>

#include "cuda_block.cuh"
#include "kernels_cuda.h"

namespace {

constexpr int kThreads = 32; // per row; elementwise kernels: kFlatThreads

// Block-wide reduction in a fixed order (cuda_block.cuh): every thread gets the result.
template <bool kMax> __device__ float block_reduce(float v) {
  __shared__ float buf[kThreads];
  return block_reduce_in<kMax>(buf, v);
}

// Row i of p [m, n] (keys 0 .. last visible = min(n - 1, i + shift)) in place: exp(scale s -
// lse); lse the row's own log-sum-exp (written) or the merged one (from_lse). A row that sees
// no key: zeros, and lse -inf when written.
__global__ void block_softmax_k(float *p, float *lse, int n, int shift, float scale,
                                bool from_lse) {
  int i = blockIdx.x;
  float *row = p + (size_t)i * n;
  int last = i + shift < n - 1 ? i + shift : n - 1; // may be < 0: no key
  float l;
  if (from_lse) {
    l = lse[i];
  } else {
    float mx = -INFINITY;
    for (int k = threadIdx.x; k <= last; k += blockDim.x)
      mx = fmaxf(mx, row[k] * scale);
    mx = block_reduce<true>(mx);
    float sum = 0;
    for (int k = threadIdx.x; k <= last; k += blockDim.x)
      sum += expf(row[k] * scale - mx);
    sum = block_reduce<false>(sum);
    l = last >= 0 ? mx + logf(sum) : -INFINITY;
    if (threadIdx.x == 0)
      lse[i] = l;
  }
  for (int k = threadIdx.x; k < n; k += blockDim.x)
    row[k] = k <= last ? expf(row[k] * scale - l) : 0.0f;
}

__global__ void block_dsoftmax_k(float *dp, const float *p, const float *delta, int n,
                                 float scale) {
  size_t off = (size_t)blockIdx.x * n;
  float dl = delta[blockIdx.x];
  for (int k = threadIdx.x; k < n; k += blockDim.x)
    dp[off + k] = p[off + k] * (dp[off + k] - dl) * scale;
}

// delta[h m + i] = dy_i,h . y_i,h: one block per (i, h) row
__global__ void rowdot_k(float *delta, const float *dy, const float *y, int m, int H, int D) {
  int r = blockIdx.x, i = r / H, h = r % H;
  size_t off = ((size_t)i * H + h) * D;
  float sum = 0;
  for (int e = threadIdx.x; e < D; e += blockDim.x)
    sum += dy[off + e] * y[off + e];
  sum = block_reduce<false>(sum);
  if (threadIdx.x == 0)
    delta[(size_t)h * m + i] = sum;
}

// One thread per (row, element): each reads the row's two lse (kernels_attention_merge's
// formulas); element 0's thread writes the merged lse after the others of its row have read
// the old one, so the lse is merged in a second pass (merge_lse_k).
__global__ void merge_y_k(float *y, const float *lse, const float *yb, const float *lb, int m,
                          int H, int D) {
  size_t n = (size_t)m * H * D;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
       idx += (size_t)gridDim.x * blockDim.x) {
    size_t row = idx / D;
    int i = (int)(row / H), h = (int)(row % H);
    size_t r = (size_t)h * m + i;
    float a = lse[r], c = lb[r];
    if (c == -INFINITY)
      continue;
    if (a == -INFINITY) {
      y[idx] = yb[idx];
      continue;
    }
    float most = a > c ? a : c, merged = most + log1pf(expf(-fabsf(a - c)));
    y[idx] = expf(a - merged) * y[idx] + expf(c - merged) * yb[idx];
  }
}

__global__ void merge_lse_k(float *lse, const float *lb, size_t n) {
  for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < n;
       r += (size_t)gridDim.x * blockDim.x) {
    float a = lse[r], c = lb[r];
    if (c == -INFINITY)
      continue;
    if (a == -INFINITY) {
      lse[r] = c;
      continue;
    }
    float most = a > c ? a : c;
    lse[r] = most + log1pf(expf(-fabsf(a - c)));
  }
}

} // namespace

void kc_attention_block_softmax(float *p, float *lse, int m, int n, int shift, float scale,
                                bool from_lse, cudaStream_t st) {
  if (m && n)
    block_softmax_k<<<m, kThreads, 0, st>>>(p, lse, n, shift, scale, from_lse);
}

void kc_attention_block_dsoftmax(float *dp, const float *p, const float *delta, int m, int n,
                                 float scale, cudaStream_t st) {
  if (m && n)
    block_dsoftmax_k<<<m, kThreads, 0, st>>>(dp, p, delta, n, scale);
}

void kc_attention_rowdot(float *delta, const float *dy, const float *y, int m, int heads,
                         int head_dim, cudaStream_t st) {
  if (m && heads)
    rowdot_k<<<m * heads, kThreads, 0, st>>>(delta, dy, y, m, heads, head_dim);
}

void kc_attention_merge(float *y, float *lse, const float *yb, const float *lb, int m, int heads,
                        int head_dim, cudaStream_t st) {
  size_t n = (size_t)m * heads * head_dim;
  if (!n)
    return;
  merge_y_k<<<blocks_for(n), kFlatThreads, 0, st>>>(y, lse, yb, lb, m, heads, head_dim);
  merge_lse_k<<<blocks_for((size_t)m * heads), kFlatThreads, 0, st>>>(lse, lb, (size_t)m * heads);
}
