// flash_attention: the attention core of bf16 models (kernels_cuda.h: kc_flash_*), fused after
// FlashAttention-2: causal, grouped-query, no [S, S] matrix anywhere. The scores of a tile of
// 64 queries against a tile of 64 keys live in shared memory only; the forward keeps a running
// softmax per row, the backward recomputes the probabilities from the forward's log-sum-exp.
// Precision is what the unfused path (cuBLASLt bf16 GEMMs + kernels/cuda.cu's softmax) had:
// q, k, v, p, dy and ds are rounded to bf16 (nearest even) as tensor-core operands, every
// product is accumulated in fp32 (wmma 16x16x16 bf16 -> fp32), softmax, lse and the
// gradient of the softmax are fp32. Memory is fp32 row-major as in the saved layout:
// q, y, dq rows of T x (H*D), k, v, dk, dv rows of T x (KVH*D), lse [B, H, S].
// Deterministic: every output element is written by one block, sums run in a fixed order.
#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>
#include <type_traits>

#include "kernels_cuda.h"

namespace {

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

constexpr int kTile = 64;           // queries per query tile = keys per key tile (Br = Bc)
constexpr int kPadH = 8;            // bf16 row padding (elements): wmma ldm % 8, fewer bank clashes
constexpr int kPadF = 4;            // fp32 row padding (elements): wmma ldm % 4
constexpr int kFwdWarps = 4;        // forward: warp w owns query rows 16w .. 16w + 15 of its tile
constexpr int kBwdWarps = 8;        // backward: 4 row bands x 2 column halves
constexpr int kLdS = kTile + kPadF; // fp32 [64 x 64] score tiles
constexpr int kLdP = kTile + kPadH; // bf16 [64 x 64] probability tiles

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragArow;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> FragAcol;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragBrow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBcol;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragAcc;

// Element (r, c) of a matrix stored row-major (Row) or column-major with leading dimension ld.
template <bool Row> __device__ const bf16 *at(const bf16 *p, int ld, int r, int c) {
  return Row ? p + r * ld + c : p + c * ld + r;
}

// acc[f] += A[r0 .. r0+16, 0 .. K) * B[0 .. K, c0 + 16 f .. + 16): one warp, fp32 accumulation.
// ARow / BRow: how A and B are stored (a transposed operand is the other layout of its tile).
template <int NF, bool ARow, bool BRow>
__device__ void warp_mma(FragAcc (&acc)[NF], const bf16 *A, int lda, const bf16 *B, int ldb, int r0,
                         int c0, int K) {
  typename std::conditional<ARow, FragArow, FragAcol>::type a;
  typename std::conditional<BRow, FragBrow, FragBcol>::type b;
  for (int k = 0; k < K; k += 16) {
    wmma::load_matrix_sync(a, at<ARow>(A, lda, r0, k), lda);
    for (int f = 0; f < NF; f++) {
      wmma::load_matrix_sync(b, at<BRow>(B, ldb, k, c0 + 16 * f), ldb);
      wmma::mma_sync(acc[f], a, b, acc[f]);
    }
  }
}

template <int NF> __device__ void zero(FragAcc (&acc)[NF]) {
  for (int f = 0; f < NF; f++)
    wmma::fill_fragment(acc[f], 0.0f);
}

template <int NF> __device__ void store(float *dst, int ld, int r0, int c0, FragAcc (&acc)[NF]) {
  for (int f = 0; f < NF; f++)
    wmma::store_matrix_sync(dst + r0 * ld + c0 + 16 * f, acc[f], ld, wmma::mem_row_major);
}

// dst [64 x D] bf16 (row stride D + kPadH) <- rows row0 .. row0 + 63 of src (fp32, row stride
// ld, D columns); rows at or past n_rows are zero, so that padding never holds a NaN that a
// zero probability would turn into one (0 * NaN).
template <int D>
__device__ void load_tile(bf16 *dst, const float *src, size_t ld, int row0, int n_rows) {
  for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
    int r = i / D, c = i % D;
    float x = row0 + r < n_rows ? src[(size_t)(row0 + r) * ld + c] : 0.0f;
    dst[r * (D + kPadH) + c] = __float2bfloat16_rn(x);
  }
}

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where a (sequence, head) starts: query head h reads kv head h / group.
struct HeadPtrs {
  size_t qoff, koff, loff;
};

__device__ HeadPtrs head_ptrs(int b, int h, int S, int H, int KVH, int D) {
  HeadPtrs p;
  p.qoff = (size_t)b * S * H * D + (size_t)h * D;
  p.koff = (size_t)b * S * KVH * D + (size_t)(h / (H / KVH)) * D;
  p.loff = ((size_t)b * H + h) * S;
  return p;
}

// ---- forward ------------------------------------------------------------------------------

template <int D> struct FwdSmem {
  static constexpr int kLd = D + kPadH, kLdO = D + kPadF;
  static constexpr size_t q = 0, k = q + sizeof(bf16) * kTile * kLd,
                          v = k + sizeof(bf16) * kTile * kLd;
  static constexpr size_t s = v + sizeof(bf16) * kTile * kLd;
  static constexpr size_t p = s + sizeof(float) * kTile * kLdS;
  static constexpr size_t o = p + sizeof(bf16) * kTile * kLdP;
  static constexpr size_t m = o + sizeof(float) * kTile * kLdO;
  static constexpr size_t l = m + sizeof(float) * kTile, alpha = l + sizeof(float) * kTile;
  static constexpr size_t bytes = alpha + sizeof(float) * kTile;
};

// One warp's rows of the online softmax after the scores of key tile k0 are in Ss. Invariant
// after the call, for each row r: m[r] = the max scaled score over the keys seen so far,
// l[r] = sum over those keys of exp(score - m[r]), alpha[r] = exp(old m - new m) (the factor
// that rescales what O accumulated against the old max), P = exp(score - m[r]) in bf16 (0 for
// masked keys: later than the query or past the sequence's end).
__device__ void online_softmax_rows(const float *Ss, bf16 *Ps, float *m, float *l, float *alpha,
                                    int r0, int q0, int k0, int S, float scale) {
  int lane = threadIdx.x % 32;
  for (int r = r0; r < r0 + 16; r++) {
    int qi = q0 + r, ka = k0 + lane, kb = ka + 32;
    bool va = ka <= qi && ka < S, vb = kb <= qi && kb < S;
    float xa = va ? Ss[r * kLdS + lane] * scale : -INFINITY;
    float xb = vb ? Ss[r * kLdS + lane + 32] * scale : -INFINITY;
    float m_old = m[r], m_new = fmaxf(m_old, warp_max(fmaxf(xa, xb)));
    // every row sees key k0 <= q0 <= qi in each tile it visits (Br = Bc, tiles aligned), so
    // m_new is finite; the guard only keeps exp(-inf - -inf) out should that ever change
    float m_use = m_new == -INFINITY ? 0.0f : m_new;
    float pa = va ? expf(xa - m_use) : 0.0f, pb = vb ? expf(xb - m_use) : 0.0f;
    float a = expf(m_old - m_use);
    float sum = warp_sum(pa + pb);
    Ps[r * kLdP + lane] = __float2bfloat16_rn(pa);
    Ps[r * kLdP + lane + 32] = __float2bfloat16_rn(pb);
    if (lane == 0) {
      m[r] = m_new;
      l[r] = l[r] * a + sum;
      alpha[r] = a;
    }
  }
}

// grid tiles_grid(S, H, B), kFwdWarps warps. O (fp32, shared) accumulates P V; y = O / l and
// lse = m + log(l) at the end: the natural-log log-sum-exp of the row's scaled scores, as
// kc_causal_softmax writes it (the backward and the host reference read it).
template <int D>
__global__ void __launch_bounds__(kFwdWarps * 32)
    flash_fwd_k(float *y, float *lse, const float *q, const float *k, const float *v, int S, int H,
                int KVH, float scale) {
  typedef FwdSmem<D> L;
  static_assert(L::k % 32 == 0 && L::v % 32 == 0 && L::s % 32 == 0 && L::p % 32 == 0 &&
                    L::o % 32 == 0,
                "wmma tiles must start 32-byte aligned");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *Qs = (bf16 *)(smem + L::q), *Ks = (bf16 *)(smem + L::k), *Vs = (bf16 *)(smem + L::v);
  float *Ss = (float *)(smem + L::s), *Os = (float *)(smem + L::o);
  bf16 *Ps = (bf16 *)(smem + L::p);
  float *m = (float *)(smem + L::m), *l = (float *)(smem + L::l),
        *alpha = (float *)(smem + L::alpha);
  // blocks start in grid order, z slowest: the last query tiles (the most keys) go first,
  // the light ones fill the tail
  int q0 = (int)(gridDim.z - 1 - blockIdx.z) * kTile, h = blockIdx.x, b = blockIdx.y;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = 16 * warp;
  HeadPtrs hp = head_ptrs(b, h, S, H, KVH, D);
  size_t ldq = (size_t)H * D, ldk = (size_t)KVH * D;
  load_tile<D>(Qs, q + hp.qoff, ldq, q0, S);
  for (int i = threadIdx.x; i < kTile * L::kLdO; i += blockDim.x)
    Os[i] = 0.0f;
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  // key tiles up to the diagonal tile (causal: later keys are masked for every row)
  for (int k0 = 0; k0 <= q0 && k0 < S; k0 += kTile) {
    __syncthreads(); // the previous tile's K, V are no longer read
    load_tile<D>(Ks, k + hp.koff, ldk, k0, S);
    load_tile<D>(Vs, v + hp.koff, ldk, k0, S);
    __syncthreads();
    FragAcc sacc[kTile / 16];
    zero(sacc);
    warp_mma<kTile / 16, true, false>(sacc, Qs, L::kLd, Ks, L::kLd, r0, 0, D);
    store(Ss, kLdS, r0, 0, sacc);
    __syncwarp();
    online_softmax_rows(Ss, Ps, m, l, alpha, r0, q0, k0, S, scale);
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
      int r = r0 + i / D;
      Os[r * L::kLdO + i % D] *= alpha[r];
    }
    __syncwarp();
    FragAcc oacc[D / 16];
    for (int f = 0; f < D / 16; f++)
      wmma::load_matrix_sync(oacc[f], Os + r0 * L::kLdO + 16 * f, L::kLdO, wmma::mem_row_major);
    warp_mma<D / 16, true, true>(oacc, Ps, kLdP, Vs, L::kLd, r0, 0, kTile);
    store(Os, L::kLdO, r0, 0, oacc);
  }
  __syncwarp();
  for (int i = lane; i < 16 * D; i += 32) {
    int r = r0 + i / D;
    if (q0 + r < S)
      y[hp.qoff + (size_t)(q0 + r) * ldq + i % D] = Os[r * L::kLdO + i % D] / l[r];
  }
  if (lane < 16 && q0 + r0 + lane < S)
    lse[hp.loff + q0 + r0 + lane] = m[r0 + lane] + logf(l[r0 + lane]);
}

// ---- backward -----------------------------------------------------------------------------

// dvec[b, h, i] = sum_d dy[i, d] y[i, d] = sum_j p_ij dp_ij (FA2's D): the softmax gradient's
// row term, from fp32 dy and y. One warp per row.
__global__ void flash_dvec_k(float *dvec, const float *dy, const float *y, int S, int H, int D,
                             int n_rows) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n_rows)
    return;
  int i = row % S, h = (row / S) % H, b = row / (S * H);
  size_t off = ((size_t)b * S + i) * H * D + (size_t)h * D;
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32)
    sum += dy[off + d] * y[off + d];
  sum = warp_sum(sum);
  if (lane == 0)
    dvec[row] = sum;
}

template <int D> struct BwdSmem {
  static constexpr int kLd = D + kPadH, kLdO = D + kPadF;
  static constexpr size_t tile = sizeof(bf16) * kTile * kLd;
  static constexpr size_t q = 0, dy = q + tile, k = dy + tile, v = k + tile;
  // the fp32 scores and dp tiles, or the fp32 staging of a finished [64 x D] result
  static constexpr size_t work = v + tile;
  static constexpr size_t scores_bytes = 2 * sizeof(float) * kTile * kLdS;
  static constexpr size_t stage_bytes = sizeof(float) * kTile * kLdO;
  static constexpr size_t work_bytes = scores_bytes > stage_bytes ? scores_bytes : stage_bytes;
  static constexpr size_t p = work + work_bytes, ds = p + sizeof(bf16) * kTile * kLdP;
  static constexpr size_t lse = ds + sizeof(bf16) * kTile * kLdP,
                          dvec = lse + sizeof(float) * kTile;
  static constexpr size_t bytes = dvec + sizeof(float) * kTile;
};

// sm_80 (A100) grants a block at most 163 KB of shared memory, sm_90 227 KB: the largest
// variant must fit the smaller.
constexpr size_t kMaxSmem = 163 * 1024;
static_assert(FwdSmem<128>::bytes <= kMaxSmem, "forward tiles exceed sm_80's shared memory");
static_assert(BwdSmem<128>::bytes <= kMaxSmem, "backward tiles exceed sm_80's shared memory");

// The shared tiles of one (query tile, key tile) pair of the backward.
struct BwdTiles {
  const bf16 *Qs, *dYs, *Ks, *Vs;
  float *Ss, *dPs;
  bf16 *Ps, *dSs;
  const float *lse, *dvec;
};

template <int D> __device__ BwdTiles bwd_tiles(unsigned char *smem) {
  typedef BwdSmem<D> L;
  static_assert(L::tile % 32 == 0 && L::work % 32 == 0 && L::p % 32 == 0 && L::ds % 32 == 0,
                "wmma tiles must start 32-byte aligned");
  BwdTiles t;
  t.Qs = (const bf16 *)(smem + L::q);
  t.dYs = (const bf16 *)(smem + L::dy);
  t.Ks = (const bf16 *)(smem + L::k);
  t.Vs = (const bf16 *)(smem + L::v);
  t.Ss = (float *)(smem + L::work);
  t.dPs = t.Ss + kTile * kLdS;
  t.Ps = (bf16 *)(smem + L::p);
  t.dSs = (bf16 *)(smem + L::ds);
  t.lse = (const float *)(smem + L::lse);
  t.dvec = (const float *)(smem + L::dvec);
  return t;
}

// Loads the query side of a pair: q, dy (bf16), lse and dvec of query rows q0 .. q0 + 63.
template <int D>
__device__ void load_query_side(unsigned char *smem, const float *q, const float *dy,
                                const float *lse, const float *dvec, const HeadPtrs &hp, int q0,
                                int S, int H) {
  typedef BwdSmem<D> L;
  load_tile<D>((bf16 *)(smem + L::q), q + hp.qoff, (size_t)H * D, q0, S);
  load_tile<D>((bf16 *)(smem + L::dy), dy + hp.qoff, (size_t)H * D, q0, S);
  float *ls = (float *)(smem + L::lse), *dv = (float *)(smem + L::dvec);
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    ls[i] = q0 + i < S ? lse[hp.loff + q0 + i] : 0.0f;
    dv[i] = q0 + i < S ? dvec[hp.loff + q0 + i] : 0.0f;
  }
}

template <int D>
__device__ void load_key_side(unsigned char *smem, const float *k, const float *v,
                              const HeadPtrs &hp, int k0, int S, int KVH) {
  typedef BwdSmem<D> L;
  load_tile<D>((bf16 *)(smem + L::k), k + hp.koff, (size_t)KVH * D, k0, S);
  load_tile<D>((bf16 *)(smem + L::v), v + hp.koff, (size_t)KVH * D, k0, S);
}

// For the pair (q0, k0) whose tiles are loaded: P = exp(scale q k^T - lse) (the forward's
// probabilities, recomputed), dP = dy v^T, dS = P (dP - dvec) scale; P and dS in bf16 for the
// tensor cores. Masked entries (key after query, either past S) are exactly 0 in both.
// Starts and ends with the whole block in step.
template <int D>
__device__ void pair_probs_and_grads(const BwdTiles &t, int q0, int k0, int S, float scale) {
  constexpr int kLd = D + kPadH;
  int warp = threadIdx.x / 32, r0 = 16 * (warp % 4), c0 = 32 * (warp / 4);
  FragAcc acc[2];
  zero(acc);
  warp_mma<2, true, false>(acc, t.Qs, kLd, t.Ks, kLd, r0, c0, D);
  store(t.Ss, kLdS, r0, c0, acc);
  zero(acc);
  warp_mma<2, true, false>(acc, t.dYs, kLd, t.Vs, kLd, r0, c0, D);
  store(t.dPs, kLdS, r0, c0, acc);
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    int r = i / kTile, c = i % kTile, qi = q0 + r, kj = k0 + c;
    bool valid = kj <= qi && qi < S && kj < S;
    float p = valid ? expf(t.Ss[r * kLdS + c] * scale - t.lse[r]) : 0.0f;
    float ds = p * (t.dPs[r * kLdS + c] - t.dvec[r]) * scale;
    t.Ps[r * kLdP + c] = __float2bfloat16_rn(p);
    t.dSs[r * kLdP + c] = __float2bfloat16_rn(ds);
  }
  __syncthreads();
}

// Writes a block's [64 x D] result, held by its warps as acc (rows 16 (w % 4), columns
// (w / 4) D / 2), to rows row0 .. of dst (row stride ld; rows past S are dropped), staged
// through the shared work area.
template <int D>
__device__ void write_result(float *dst, size_t ld, int row0, int S, FragAcc (&acc)[D / 32],
                             unsigned char *smem) {
  typedef BwdSmem<D> L;
  float *stage = (float *)(smem + L::work);
  int warp = threadIdx.x / 32;
  __syncthreads(); // the work area's last scores are read
  store(stage, L::kLdO, 16 * (warp % 4), (warp / 4) * (D / 2), acc);
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
    int r = i / D, c = i % D;
    if (row0 + r < S)
      dst[(size_t)(row0 + r) * ld + c] = stage[r * L::kLdO + c];
  }
}

// grid tiles_grid(S, KVH, B), kBwdWarps warps. dK and dV of a kv head sum over its whole
// query-head group and over the query tiles from the diagonal on; they stay in registers
// (warp w: key rows 16 (w % 4), columns (w / 4) D / 2) and are written once (=): each row of
// dk, dv belongs to one block.
template <int D>
__global__ void __launch_bounds__(kBwdWarps * 32)
    flash_bwd_kv_k(float *dk, float *dv, const float *q, const float *k, const float *v,
                   const float *dy, const float *lse, const float *dvec, int S, int H, int KVH,
                   float scale) {
  constexpr int kLd = D + kPadH;
  extern __shared__ __align__(128) unsigned char smem[];
  BwdTiles t = bwd_tiles<D>(smem);
  // the first key tiles (seen by the most queries) go first
  int k0 = blockIdx.z * kTile, kvh = blockIdx.x, b = blockIdx.y, group = H / KVH;
  int warp = threadIdx.x / 32, r0 = 16 * (warp % 4), c0 = (warp / 4) * (D / 2);
  HeadPtrs kp = head_ptrs(b, kvh * group, S, H, KVH, D);
  load_key_side<D>(smem, k, v, kp, k0, S, KVH);
  FragAcc dk_acc[D / 32], dv_acc[D / 32];
  zero(dk_acc);
  zero(dv_acc);
  for (int h = kvh * group; h < (kvh + 1) * group; h++) {
    HeadPtrs hp = head_ptrs(b, h, S, H, KVH, D);
    for (int q0 = k0; q0 < S; q0 += kTile) { // earlier query tiles see none of these keys
      __syncthreads();                       // the previous pair's tiles are no longer read
      load_query_side<D>(smem, q, dy, lse, dvec, hp, q0, S, H);
      __syncthreads();
      pair_probs_and_grads<D>(t, q0, k0, S, scale);
      // dV += P^T dy, dK += dS^T q: the transposed probabilities are the column-major view
      warp_mma<D / 32, false, true>(dv_acc, t.Ps, kLdP, t.dYs, kLd, r0, c0, kTile);
      warp_mma<D / 32, false, true>(dk_acc, t.dSs, kLdP, t.Qs, kLd, r0, c0, kTile);
    }
  }
  write_result<D>(dv + kp.koff, (size_t)KVH * D, k0, S, dv_acc, smem);
  write_result<D>(dk + kp.koff, (size_t)KVH * D, k0, S, dk_acc, smem);
}

// grid tiles_grid(S, H, B), kBwdWarps warps: dQ = dS k over the key tiles up to the diagonal,
// in registers, written once (=). Recomputes the pairs' P and dS rather than adding into dq
// from the key-side kernel with atomics: deterministic, and no zero-fill.
template <int D>
__global__ void __launch_bounds__(kBwdWarps * 32)
    flash_bwd_q_k(float *dq, const float *q, const float *k, const float *v, const float *dy,
                  const float *lse, const float *dvec, int S, int H, int KVH, float scale) {
  constexpr int kLd = D + kPadH;
  extern __shared__ __align__(128) unsigned char smem[];
  BwdTiles t = bwd_tiles<D>(smem);
  // blocks start in grid order, z slowest: the last query tiles (the most keys) go first,
  // the light ones fill the tail
  int q0 = (int)(gridDim.z - 1 - blockIdx.z) * kTile, h = blockIdx.x, b = blockIdx.y;
  int warp = threadIdx.x / 32, r0 = 16 * (warp % 4), c0 = (warp / 4) * (D / 2);
  HeadPtrs hp = head_ptrs(b, h, S, H, KVH, D);
  load_query_side<D>(smem, q, dy, lse, dvec, hp, q0, S, H);
  FragAcc dq_acc[D / 32];
  zero(dq_acc);
  for (int k0 = 0; k0 <= q0 && k0 < S; k0 += kTile) {
    __syncthreads();
    load_key_side<D>(smem, k, v, hp, k0, S, KVH);
    __syncthreads();
    pair_probs_and_grads<D>(t, q0, k0, S, scale);
    warp_mma<D / 32, true, true>(dq_acc, t.dSs, kLdP, t.Ks, kLd, r0, c0, kTile);
  }
  write_result<D>(dq + hp.qoff, (size_t)H * D, q0, S, dq_acc, smem);
}

// ---- launchers ----------------------------------------------------------------------------

// (heads, sequences, 64-row tiles): the tile slowest, so that the kernels order the work by
// tile (x allows 2^31 - 1 heads; S up to 65535 tiles, 4M rows)
dim3 tiles_grid(int S, int heads, int batch) {
  return dim3((unsigned)heads, (unsigned)batch, (unsigned)((S + kTile - 1) / kTile));
}

template <int D>
cudaError_t forward(float *y, float *lse, const float *q, const float *k, const float *v, int B,
                    int S, int H, int KVH, cudaStream_t st) {
  size_t bytes = FwdSmem<D>::bytes;
  // over 48 KB of dynamic shared memory must be asked for (sm_80: up to 163 KB, sm_90: 227 KB)
  cudaError_t e =
      cudaFuncSetAttribute(flash_fwd_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e != cudaSuccess)
    return e;
  flash_fwd_k<D><<<tiles_grid(S, H, B), kFwdWarps * 32, bytes, st>>>(y, lse, q, k, v, S, H, KVH,
                                                                     1.0f / sqrtf((float)D));
  return cudaGetLastError();
}

template <int D>
cudaError_t backward(float *dq, float *dk, float *dv, float *dvec, const float *q, const float *k,
                     const float *v, const float *y, const float *dy, const float *lse, int B,
                     int S, int H, int KVH, cudaStream_t st) {
  size_t bytes = BwdSmem<D>::bytes;
  float scale = 1.0f / sqrtf((float)D);
  int n_rows = B * H * S;
  flash_dvec_k<<<(n_rows + 7) / 8, 256, 0, st>>>(dvec, dy, y, S, H, D, n_rows);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(flash_bwd_kv_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(flash_bwd_q_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes);
  if (e != cudaSuccess)
    return e;
  flash_bwd_kv_k<D><<<tiles_grid(S, KVH, B), kBwdWarps * 32, bytes, st>>>(dk, dv, q, k, v, dy, lse,
                                                                          dvec, S, H, KVH, scale);
  if ((e = cudaGetLastError()) != cudaSuccess)
    return e;
  flash_bwd_q_k<D><<<tiles_grid(S, H, B), kBwdWarps * 32, bytes, st>>>(dq, q, k, v, dy, lse, dvec,
                                                                       S, H, KVH, scale);
  return cudaGetLastError();
}

} // namespace

bool kc_flash_attention_supported(int head_dim, int heads, int kv_heads) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && kv_heads > 0 &&
         heads % kv_heads == 0;
}

cudaError_t kc_flash_attention_forward(float *y, float *lse, const float *q, const float *k,
                                       const float *v, int batch, int seq, int heads, int kv_heads,
                                       int head_dim, cudaStream_t st) {
  if (!batch || !seq || !heads)
    return cudaSuccess;
  if (batch > 65535 || (seq + kTile - 1) / kTile > 65535) // grid y and z
    return cudaErrorInvalidValue;
  switch (head_dim) {
  case 32: return forward<32>(y, lse, q, k, v, batch, seq, heads, kv_heads, st);
  case 64: return forward<64>(y, lse, q, k, v, batch, seq, heads, kv_heads, st);
  case 128: return forward<128>(y, lse, q, k, v, batch, seq, heads, kv_heads, st);
  default: return cudaErrorInvalidValue;
  }
}

cudaError_t kc_flash_attention_backward(float *dq, float *dk, float *dv, float *dvec,
                                        const float *q, const float *k, const float *v,
                                        const float *y, const float *dy, const float *lse,
                                        int batch, int seq, int heads, int kv_heads, int head_dim,
                                        cudaStream_t st) {
  if (!batch || !seq || !heads)
    return cudaSuccess;
  if (batch > 65535 || (seq + kTile - 1) / kTile > 65535) // grid y and z
    return cudaErrorInvalidValue;
  switch (head_dim) {
  case 32:
    return backward<32>(dq, dk, dv, dvec, q, k, v, y, dy, lse, batch, seq, heads, kv_heads, st);
  case 64:
    return backward<64>(dq, dk, dv, dvec, q, k, v, y, dy, lse, batch, seq, heads, kv_heads, st);
  case 128:
    return backward<128>(dq, dk, dv, dvec, q, k, v, y, dy, lse, batch, seq, heads, kv_heads, st);
  default: return cudaErrorInvalidValue;
  }
}
