// flash_attention: the attention core of bf16 models (kernels_cuda.h: kc_flash_*), fused after
// FlashAttention-2: causal, grouped-query, no [S, S] matrix anywhere. Each warp owns 16 rows of
// a tile and keeps its scores, probabilities and output accumulators in registers (mma.sync's
// documented fragment layouts, kernels/mma_sm80.cuh): the forward's online softmax, the
// backward's recomputed probabilities and softmax gradient never touch shared memory, which
// holds only the bf16 operand tiles, double-buffered by cp.async so the next tile loads while
// the tensor cores work on this one.
// Precision is what the unfused path (cuBLASLt bf16 GEMMs + kernels/cuda.cu's softmax) had:
// q, k, v, p, dy and ds are rounded to bf16 (nearest even) as tensor-core operands (q, k, v
// and dy once, by a conversion pass into scratch), every product is accumulated in fp32,
// softmax, lse and the gradient of the softmax are fp32. Memory is fp32 row-major as in the
// saved layout: q, y, dq rows of T x (H*D), k, v, dk, dv rows of T x (KVH*D), lse [B, H, S].
// Context parallelism's blocks (kc_flash_attention_block_*) run Sq query rows of a sequence
// against Sk keys of it, causal by global positions: row i sees key j when j <= i + shift
// (shift = the query chunk's first position minus the key chunk's); the whole sequence is
// Sq = Sk = S, shift 0. A row that sees no key gets y 0 and lse -inf; the backward's gradients
// can add into dq, dk, dv (a block's share of the ring's sums).
// Deterministic: every output element is written by one block, sums run in a fixed order; dQ
// has a kernel of its own (it recomputes the scores) rather than atomics into dq.
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "kernels_cuda.h"
#include "mma_sm80.cuh"

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBr = 64; // query rows of a forward or dQ block: 16 per warp
constexpr int kBc = 64; // keys per key tile (forward, dQ) and of a dK/dV block: 16 per warp
constexpr int kBq = 32; // query rows per tile a dK/dV block streams
constexpr int kPad = 8; // bf16 row padding: rows 16 B apart mod 128, ldmatrix conflict-free
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr size_t kAlign = 256; // scratch regions

static_assert(kBr == kBc, "the diagonal key tile of a query tile is aligned with it");

// Where a (sequence, head) starts: query head h reads kv head h / group.
struct HeadPtrs {
  size_t qoff, koff, loff;
};

__device__ HeadPtrs head_ptrs(int b, int h, int Sq, int Sk, int H, int KVH, int D) {
  HeadPtrs p;
  p.qoff = (size_t)b * Sq * H * D + (size_t)h * D;
  p.koff = (size_t)b * Sk * KVH * D + (size_t)(h / (H / KVH)) * D;
  p.loff = ((size_t)b * H + h) * Sq;
  return p;
}

// The last key a query tile's rows q0 .. q0 + kBr - 1 see (below 0: none), and so how many key
// tiles it visits.
__device__ int key_tiles(int q0, int Sk, int shift) {
  int last = q0 + kBr - 1 + shift < Sk - 1 ? q0 + kBr - 1 + shift : Sk - 1;
  return last < 0 ? 0 : last / kBc + 1;
}

// ---- operand tiles and fragments ------------------------------------------------------------

// dst [Rows x D] (row stride D + kPad) <- rows row0 .. row0 + Rows - 1 of src (bf16, row stride
// ld), asynchronously; rows at or past n_rows are zero, so that padding never holds a NaN that
// a zero probability would turn into one (0 * NaN).
template <int D, int Rows>
__device__ void load_tile(bf16 *dst, const bf16 *src, size_t ld, int row0, int n_rows) {
  constexpr int kChunks = D / 8; // 16-byte pieces per row
  for (int i = threadIdx.x; i < Rows * kChunks; i += kThreads) {
    int r = i / kChunks, c = (i % kChunks) * 8;
    bool valid = row0 + r < n_rows;
    cp_async_16(dst + r * (D + kPad) + c, valid ? src + (size_t)(row0 + r) * ld + c : src, valid);
  }
}

// A operand rows r0 .. r0 + 15, columns c0 .. c0 + 15 of a row-major tile.
__device__ void load_a(uint32_t (&a)[4], const bf16 *tile, int ld, int r0, int c0) {
  int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + (r0 + lane % 16) * ld + c0 + (lane / 16) * 8);
}

// B operands of the n8 tiles n0 and n0 + 8 over k0 .. k0 + 15 (b[0], b[1] the first, b[2],
// b[3] the second) from a tile that stores B transposed, a row per n: K for q k^T.
__device__ void load_b_nk(uint32_t (&b)[4], const bf16 *tile, int ld, int n0, int k0) {
  int lane = threadIdx.x % 32, i = lane / 8;
  ldmatrix_x4(b, tile + (n0 + lane % 8 + (i / 2) * 8) * ld + k0 + (i % 2) * 8);
}

// The same from a tile that stores B as it is, a row per k: V for p v (ldmatrix transposes).
__device__ void load_b_kn(uint32_t (&b)[4], const bf16 *tile, int ld, int k0, int n0) {
  int lane = threadIdx.x % 32, i = lane / 8;
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + (i % 2) * 8) * ld + n0 + (i / 2) * 8);
}

// acc[n] += A (16 rows of tile a from r0, K columns) times the N / 8 n-tiles of B (tile b,
// stored transposed: a row per n), over k 0 .. K.
template <int N, int K>
__device__ void mma_rows_nk(float (&acc)[N / 8][4], const bf16 *a, const bf16 *b, int ld, int r0) {
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t af[4];
    load_a(af, a, ld, r0, 16 * kk);
    for (int n = 0; n < N / 16; n++) {
      uint32_t bf[4];
      load_b_nk(bf, b, ld, 16 * n, 16 * kk);
      mma_16816(acc[2 * n], af, bf[0], bf[1]);
      mma_16816(acc[2 * n + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[n] += P times B (tile b stored as is: K rows of N), P the warp's [16 x K] fp32
// accumulators, rounded to bf16: mma's C layout of n-tiles 2j, 2j + 1 is A's of k chunk j.
template <int N, int K>
__device__ void mma_acc_kn(float (&acc)[N / 8][4], const float (&p)[K / 8][4], const bf16 *b,
                           int ld) {
  for (int kk = 0; kk < K / 16; kk++) {
    const float *lo = p[2 * kk], *hi = p[2 * kk + 1];
    uint32_t af[4] = {pack_bf16(lo[0], lo[1]), pack_bf16(lo[2], lo[3]), pack_bf16(hi[0], hi[1]),
                      pack_bf16(hi[2], hi[3])};
    for (int n = 0; n < N / 16; n++) {
      uint32_t bf[4];
      load_b_kn(bf, b, ld, 16 * kk, 16 * n);
      mma_16816(acc[2 * n], af, bf[0], bf[1]);
      mma_16816(acc[2 * n + 1], af, bf[2], bf[3]);
    }
  }
}

// Reductions over the four lanes that share a row of a C fragment.
__device__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Rows row and row + 8 of a warp's [16 x N] fp32 result (C layout), those before S, to dst
// (row stride ld), times mul[0], mul[1]; added to what dst holds when add.
template <int N>
__device__ void store_rows(float *dst, size_t ld, int row, int S, const float (&acc)[N / 8][4],
                           const float (&mul)[2], bool add = false) {
  int t = threadIdx.x % 4;
  for (int h = 0; h < 2; h++) {
    if (row + 8 * h >= S)
      continue;
    float *r = dst + (size_t)(row + 8 * h) * ld + 2 * t;
    for (int n = 0; n < N / 8; n++) {
      r[8 * n] = (add ? r[8 * n] : 0.0f) + acc[n][2 * h] * mul[h];
      r[8 * n + 1] = (add ? r[8 * n + 1] : 0.0f) + acc[n][2 * h + 1] * mul[h];
    }
  }
}

// ---- forward --------------------------------------------------------------------------------

template <int D> struct FwdSmem {
  static constexpr int kLd = D + kPad;
  static constexpr size_t tile = sizeof(bf16) * kBc * kLd;
  static constexpr size_t q = 0, k = q + tile, v = k + 2 * tile, bytes = v + 2 * tile;
};

// The scores of the warp's rows (row, row + 8) against key tile k0 -> log2 units (c =
// scale log2 e), -inf where the key is after the query (j > i + shift) or past Sk (only tiles
// at an edge).
__device__ void mask_scores(float (&s)[kBc / 8][4], int row, int k0, int Sk, int shift, float c,
                            bool edge) {
  int t = threadIdx.x % 4;
  for (int n = 0; n < kBc / 8; n++)
    for (int e = 0; e < 4; e++) {
      int key = k0 + 8 * n + 2 * t + (e & 1), r = row + 8 * (e / 2);
      s[n][e] = edge && (key > r + shift || key >= Sk) ? -INFINITY : s[n][e] * c;
    }
}

// One key tile of the online softmax for the warp's rows. After it, per row: m = the max score
// seen so far, l = this lane's part of sum exp2(score - m), o rescaled to the new m, and s
// holds exp2(score - m). A row that has seen no key yet (a block's rows before its keys, shift
// < 0) keeps m -inf: its exponents are taken against 0, so that it adds zeros, not NaN.
template <int D>
__device__ void online_softmax(float (&s)[kBc / 8][4], float (&o)[D / 8][4], float (&m)[2],
                               float (&l)[2]) {
  for (int h = 0; h < 2; h++) {
    float mx = m[h];
    for (int n = 0; n < kBc / 8; n++)
      mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    mx = quad_max(mx);
    float base = mx == -INFINITY ? 0.0f : mx;
    float alpha = exp2f(m[h] - base), sum = 0.0f;
    for (int n = 0; n < kBc / 8; n++)
      for (int e = 2 * h; e < 2 * h + 2; e++) {
        s[n][e] = exp2f(s[n][e] - base);
        sum += s[n][e];
      }
    l[h] = l[h] * alpha + sum;
    m[h] = mx;
    for (int n = 0; n < D / 8; n++) {
      o[n][2 * h] *= alpha;
      o[n][2 * h + 1] *= alpha;
    }
  }
}

// grid tiles_grid(S, H, B), kThreads. y = softmax(scale q k^T) v per query tile, lse = the
// natural-log log-sum-exp of each row's scaled scores, as kc_causal_softmax writes it.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_k(float *y, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int Sq, int Sk,
                int shift, int H, int KVH, float scale) {
  typedef FwdSmem<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *Qs = (bf16 *)(smem + L::q), *Ks = (bf16 *)(smem + L::k), *Vs = (bf16 *)(smem + L::v);
  // blocks start in grid order, z slowest: the last query tiles (the most keys) go first,
  // the light ones fill the tail
  int q0 = (int)(gridDim.z - 1 - blockIdx.z) * kBr, h = blockIdx.x, b = blockIdx.y;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = q0 + 16 * warp + lane / 4;
  HeadPtrs hp = head_ptrs(b, h, Sq, Sk, H, KVH, D);
  size_t ldq = (size_t)H * D, ldk = (size_t)KVH * D;
  int n_tiles = key_tiles(q0, Sk, shift); // up to the diagonal: later keys masked for every row
  load_tile<D, kBr>(Qs, q + hp.qoff, ldq, q0, Sq);
  load_tile<D, kBc>(Ks, k + hp.koff, ldk, 0, Sk);
  load_tile<D, kBc>(Vs, v + hp.koff, ldk, 0, Sk);
  cp_async_commit();
  float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int j = 0; j < n_tiles; j++) {
    const bf16 *Kj = Ks + (j % 2) * kBc * L::kLd, *Vj = Vs + (j % 2) * kBc * L::kLd;
    if (j + 1 < n_tiles) { // into the buffers tile j - 1 used: read before the last barrier
      load_tile<D, kBc>(Ks + ((j + 1) % 2) * kBc * L::kLd, k + hp.koff, ldk, (j + 1) * kBc, Sk);
      load_tile<D, kBc>(Vs + ((j + 1) % 2) * kBc * L::kLd, v + hp.koff, ldk, (j + 1) * kBc, Sk);
    }
    cp_async_commit();
    cp_async_wait<1>(); // everything but the prefetch: tile j (and q) are in
    __syncthreads();
    float s[kBc / 8][4] = {};
    mma_rows_nk<kBc, D>(s, Qs, Kj, L::kLd, 16 * warp);
    int k0 = j * kBc;
    mask_scores(s, row, k0, Sk, shift, scale * kLog2e,
                k0 + kBc - 1 > q0 + 16 * warp + shift || k0 + kBc > Sk);
    online_softmax<D>(s, o, m, l);
    mma_acc_kn<D, kBc>(o, s, Vj, L::kLd);
    __syncthreads(); // this tile's buffers are read: the next turn may load over them
  }
  float inv[2];
  for (int h2 = 0; h2 < 2; h2++) {
    l[h2] = quad_sum(l[h2]);
    inv[h2] = l[h2] > 0.0f ? 1.0f / l[h2] : 0.0f; // a row that saw no key: y 0
  }
  store_rows<D>(y + hp.qoff, ldq, row, Sq, o, inv);
  for (int h2 = 0; h2 < 2; h2++)
    if (lane % 4 == 0 && row + 8 * h2 < Sq)
      lse[hp.loff + row + 8 * h2] = l[h2] > 0.0f ? (m[h2] + log2f(l[h2])) * kLn2 : -INFINITY;
}

// ---- backward -------------------------------------------------------------------------------

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
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0)
    dvec[row] = sum;
}

// The backward's operands: bf16 q, k, v, dy (the conversion pass's), fp32 lse and dvec.
struct BwdIn {
  const bf16 *q, *k, *v, *dy;
  const float *lse, *dvec;
};

// p = exp2(s c - lse2) (the forward's probabilities, lse2 = lse log2 e) and, in place over dp,
// ds = p (dp - dvec) scale, for one score entry; both 0 where masked.
__device__ void prob_and_grad(float &s, float &dp, float lse2, float dvec, float c, float scale,
                              bool masked) {
  float p = masked ? 0.0f : exp2f(s * c - lse2);
  dp = p * (dp - dvec) * scale;
  s = p;
}

template <int D> struct KvSmem {
  static constexpr int kLd = D + kPad;
  static constexpr size_t key_tile = sizeof(bf16) * kBc * kLd, q_tile = sizeof(bf16) * kBq * kLd;
  static constexpr size_t k = 0, v = k + key_tile, q = v + key_tile, dy = q + 2 * q_tile;
  static constexpr size_t lse = dy + 2 * q_tile, dvec = lse + 2 * sizeof(float) * kBq;
  static constexpr size_t bytes = dvec + 2 * sizeof(float) * kBq;
};

// Starts loading turn it's query side of a dK/dV block into buffer it % 2: q and dy rows q0 ..
// q0 + kBq - 1 of head hh (asynchronously), lse in log2 units and dvec (synchronously; rows
// past S 0: their probabilities are masked).
template <int D>
__device__ void kv_load_query_side(unsigned char *smem, const BwdIn &in, int b, int hh, int q0,
                                   int S, int Sk, int H, int KVH, int buf) {
  typedef KvSmem<D> L;
  HeadPtrs hp = head_ptrs(b, hh, S, Sk, H, KVH, D);
  size_t ldq = (size_t)H * D;
  load_tile<D, kBq>((bf16 *)(smem + L::q) + buf * kBq * L::kLd, in.q + hp.qoff, ldq, q0, S);
  load_tile<D, kBq>((bf16 *)(smem + L::dy) + buf * kBq * L::kLd, in.dy + hp.qoff, ldq, q0, S);
  float *ls = (float *)(smem + L::lse) + buf * kBq, *dv = (float *)(smem + L::dvec) + buf * kBq;
  for (int i = threadIdx.x; i < kBq; i += kThreads) {
    ls[i] = q0 + i < S ? in.lse[hp.loff + q0 + i] * kLog2e : 0.0f;
    dv[i] = q0 + i < S ? in.dvec[hp.loff + q0 + i] : 0.0f;
  }
}

// grid tiles_grid(S, KVH, B), kThreads. dK and dV of a key tile sum over its kv head's whole
// query-head group and over the query tiles from the diagonal on; each warp keeps its 16 keys'
// rows in registers, computing the transposed scores (s^T = k q^T, dp^T = v dy^T) so that
// p^T and ds^T are A operands as they are: dV += p^T dy, dK += ds^T q. Written once (=, or
// added when add). S: query rows, Sk: keys.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_kv_k(float *dk, float *dv, BwdIn in, int S, int Sk, int shift, int H, int KVH,
                   float scale, bool add) {
  typedef KvSmem<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  const bf16 *Ks = (const bf16 *)(smem + L::k), *Vs = (const bf16 *)(smem + L::v);
  // the first key tiles (seen by the most queries) go first
  int k0 = blockIdx.z * kBc, kvh = blockIdx.x, b = blockIdx.y, group = H / KVH;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  int key = k0 + 16 * warp + lane / 4;
  HeadPtrs kp = head_ptrs(b, kvh * group, S, Sk, H, KVH, D);
  size_t ldk = (size_t)KVH * D;
  load_tile<D, kBc>((bf16 *)(smem + L::k), in.k + kp.koff, ldk, k0, Sk);
  load_tile<D, kBc>((bf16 *)(smem + L::v), in.v + kp.koff, ldk, k0, Sk);
  int first = k0 - shift > 0 ? k0 - shift : 0; // earlier queries see none of these keys
  int per_head = first < S ? (S - first + kBq - 1) / kBq : 0, n_turns = group * per_head;
  kv_load_query_side<D>(smem, in, b, kvh * group, first, S, Sk, H, KVH, 0);
  cp_async_commit();
  float dka[D / 8][4] = {}, dva[D / 8][4] = {};
  const float c = scale * kLog2e;
  for (int it = 0; it < n_turns; it++) {
    int q0 = first + (it % per_head) * kBq, buf = it % 2;
    if (it + 1 < n_turns)
      kv_load_query_side<D>(smem, in, b, kvh * group + (it + 1) / per_head,
                            first + ((it + 1) % per_head) * kBq, S, Sk, H, KVH, 1 - buf);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16 *Qs = (const bf16 *)(smem + L::q) + buf * kBq * L::kLd;
    const bf16 *dYs = (const bf16 *)(smem + L::dy) + buf * kBq * L::kLd;
    const float *ls = (const float *)(smem + L::lse) + buf * kBq;
    const float *dvs = (const float *)(smem + L::dvec) + buf * kBq;
    float st[kBq / 8][4] = {}, dpt[kBq / 8][4] = {};
    mma_rows_nk<kBq, D>(st, Ks, Qs, L::kLd, 16 * warp);
    mma_rows_nk<kBq, D>(dpt, Vs, dYs, L::kLd, 16 * warp);
    bool edge = q0 + shift < k0 + 16 * warp + 15 || q0 + kBq > S || k0 + kBc > Sk;
    for (int n = 0; n < kBq / 8; n++)
      for (int e = 0; e < 4; e++) {
        int col = 8 * n + 2 * t + (e & 1), qi = q0 + col, r = key + 8 * (e / 2);
        prob_and_grad(st[n][e], dpt[n][e], ls[col], dvs[col], c, scale,
                      edge && (r > qi + shift || qi >= S || r >= Sk));
      }
    mma_acc_kn<D, kBq>(dva, st, dYs, L::kLd);
    mma_acc_kn<D, kBq>(dka, dpt, Qs, L::kLd);
    __syncthreads();
  }
  const float one[2] = {1.0f, 1.0f};
  store_rows<D>(dk + kp.koff, ldk, key, Sk, dka, one, add);
  store_rows<D>(dv + kp.koff, ldk, key, Sk, dva, one, add);
}

template <int D> struct QSmem {
  static constexpr int kLd = D + kPad;
  static constexpr size_t tile = sizeof(bf16) * kBc * kLd;
  static constexpr size_t q = 0, dy = q + tile, k = dy + tile, v = k + 2 * tile;
  static constexpr size_t bytes = v + 2 * tile;
};

// grid tiles_grid(S, H, B), kThreads: dQ = ds k over the key tiles up to the diagonal, each
// warp's 16 rows in registers, written once (=). Recomputes the pairs' p and ds rather than
// adding into dq from the key-side kernel with atomics: deterministic, and no zero-fill.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_q_k(float *dq, BwdIn in, int S, int Sk, int shift, int H, int KVH, float scale,
                  bool add) {
  typedef QSmem<D> L;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *Qs = (bf16 *)(smem + L::q), *dYs = (bf16 *)(smem + L::dy);
  bf16 *Ks = (bf16 *)(smem + L::k), *Vs = (bf16 *)(smem + L::v);
  int q0 = (int)(gridDim.z - 1 - blockIdx.z) * kBr, h = blockIdx.x, b = blockIdx.y;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  int row = q0 + 16 * warp + lane / 4;
  HeadPtrs hp = head_ptrs(b, h, S, Sk, H, KVH, D);
  size_t ldq = (size_t)H * D, ldk = (size_t)KVH * D;
  int n_tiles = key_tiles(q0, Sk, shift);
  load_tile<D, kBr>(Qs, in.q + hp.qoff, ldq, q0, S);
  load_tile<D, kBr>(dYs, in.dy + hp.qoff, ldq, q0, S);
  load_tile<D, kBc>(Ks, in.k + hp.koff, ldk, 0, Sk);
  load_tile<D, kBc>(Vs, in.v + hp.koff, ldk, 0, Sk);
  cp_async_commit();
  float lse2[2], dvr[2];
  for (int h2 = 0; h2 < 2; h2++) {
    bool in_seq = row + 8 * h2 < S;
    lse2[h2] = in_seq ? in.lse[hp.loff + row + 8 * h2] * kLog2e : 0.0f;
    dvr[h2] = in_seq ? in.dvec[hp.loff + row + 8 * h2] : 0.0f;
  }
  float dqa[D / 8][4] = {};
  const float c = scale * kLog2e;
  for (int j = 0; j < n_tiles; j++) {
    const bf16 *Kj = Ks + (j % 2) * kBc * L::kLd, *Vj = Vs + (j % 2) * kBc * L::kLd;
    if (j + 1 < n_tiles) {
      load_tile<D, kBc>(Ks + ((j + 1) % 2) * kBc * L::kLd, in.k + hp.koff, ldk, (j + 1) * kBc, Sk);
      load_tile<D, kBc>(Vs + ((j + 1) % 2) * kBc * L::kLd, in.v + hp.koff, ldk, (j + 1) * kBc, Sk);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    float s[kBc / 8][4] = {}, dp[kBc / 8][4] = {};
    mma_rows_nk<kBc, D>(s, Qs, Kj, L::kLd, 16 * warp);
    mma_rows_nk<kBc, D>(dp, dYs, Vj, L::kLd, 16 * warp);
    int k0 = j * kBc;
    bool edge = k0 + kBc - 1 > q0 + 16 * warp + shift || k0 + kBc > Sk;
    for (int n = 0; n < kBc / 8; n++)
      for (int e = 0; e < 4; e++) {
        int key = k0 + 8 * n + 2 * t + (e & 1), r = row + 8 * (e / 2);
        prob_and_grad(s[n][e], dp[n][e], lse2[e / 2], dvr[e / 2], c, scale,
                      edge && (key > r + shift || key >= Sk));
      }
    mma_acc_kn<D, kBc>(dqa, dp, Kj, L::kLd);
    __syncthreads();
  }
  const float one[2] = {1.0f, 1.0f};
  store_rows<D>(dq + hp.qoff, ldq, row, S, dqa, one, add);
}

// ---- launchers --------------------------------------------------------------------------------

// dst = src rounded to bf16 (nearest even), n elements
__global__ void to_bf16_k(bf16 *dst, const float *src, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16_rn(src[i]);
}

cudaError_t to_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t st) {
  size_t blocks = (n + 255) / 256;
  to_bf16_k<<<(unsigned)(blocks < 2048 ? blocks : 2048), 256, 0, st>>>(dst, src, n);
  return cudaGetLastError();
}

// (heads, sequences, 64-row tiles): the tile slowest, so that the kernels order the work by
// tile (x allows 2^31 - 1 heads; S up to 65535 tiles, 4M rows)
dim3 tiles_grid(int S, int heads, int batch) {
  return dim3((unsigned)heads, (unsigned)batch, (unsigned)((S + kBr - 1) / kBr));
}

size_t round_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The scratch's regions: bf16 q, k, v (both passes), dy and fp32 dvec (backward).
struct Scratch {
  bf16 *q, *k, *v, *dy;
  float *dvec;
};

Scratch carve(void *scratch, int B, int S, int Sk, int H, int KVH, int D, bool backward,
              size_t *bytes) {
  size_t nq = (size_t)B * S * H * D, nk = (size_t)B * Sk * KVH * D;
  size_t off_k = round_up(nq * sizeof(bf16)), off_v = off_k + round_up(nk * sizeof(bf16));
  size_t off_dy = off_v + round_up(nk * sizeof(bf16)), off_dvec = off_dy + round_up(nq * sizeof(bf16));
  size_t end = backward ? off_dvec + round_up((size_t)B * H * S * sizeof(float)) : off_dy;
  if (bytes)
    *bytes = end;
  unsigned char *p = (unsigned char *)scratch;
  if (!p)
    return Scratch{};
  return Scratch{(bf16 *)p, (bf16 *)(p + off_k), (bf16 *)(p + off_v),
                 backward ? (bf16 *)(p + off_dy) : nullptr,
                 backward ? (float *)(p + off_dvec) : nullptr};
}

// bf16 copies of q (n_q elements), k and v (n_k each) into the scratch
cudaError_t convert_qkv(const Scratch &sc, const float *q, const float *k, const float *v,
                        size_t n_q, size_t n_k, cudaStream_t st) {
  cudaError_t e = to_bf16(sc.q, q, n_q, st);
  if (e == cudaSuccess)
    e = to_bf16(sc.k, k, n_k, st);
  if (e == cudaSuccess)
    e = to_bf16(sc.v, v, n_k, st);
  return e;
}

// The query and key extents of a pass: S query rows, Sk keys per sequence, shift.
struct Extent {
  int S, Sk, shift;
};

template <int D>
cudaError_t forward(float *y, float *lse, void *scratch, const float *q, const float *k,
                    const float *v, int B, Extent x, int H, int KVH, cudaStream_t st) {
  int S = x.S;
  Scratch sc = carve(scratch, B, S, x.Sk, H, KVH, D, false, nullptr);
  size_t bytes = FwdSmem<D>::bytes;
  cudaError_t e = convert_qkv(sc, q, k, v, (size_t)B * S * H * D, (size_t)B * x.Sk * KVH * D, st);
  // over 48 KB of dynamic shared memory must be asked for (sm_80: up to 163 KB, sm_90: 227 KB)
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(flash_fwd_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes);
  if (e != cudaSuccess)
    return e;
  flash_fwd_k<D><<<tiles_grid(S, H, B), kThreads, bytes, st>>>(y, lse, sc.q, sc.k, sc.v, S, x.Sk,
                                                               x.shift, H, KVH,
                                                               1.0f / sqrtf((float)D));
  return cudaGetLastError();
}

template <int D>
cudaError_t backward(float *dq, float *dk, float *dv, void *scratch, const float *q,
                     const float *k, const float *v, const float *y, const float *dy,
                     const float *lse, int B, Extent x, int H, int KVH, bool add,
                     cudaStream_t st) {
  int S = x.S;
  Scratch sc = carve(scratch, B, S, x.Sk, H, KVH, D, true, nullptr);
  size_t nq = (size_t)B * S * H * D, kv_bytes = KvSmem<D>::bytes, q_bytes = QSmem<D>::bytes;
  float scale = 1.0f / sqrtf((float)D);
  int n_rows = B * H * S;
  flash_dvec_k<<<(n_rows + 7) / 8, 256, 0, st>>>(sc.dvec, dy, y, S, H, D, n_rows);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = convert_qkv(sc, q, k, v, nq, (size_t)B * x.Sk * KVH * D, st);
  if (e == cudaSuccess)
    e = to_bf16(sc.dy, dy, nq, st);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(flash_bwd_kv_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)kv_bytes);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(flash_bwd_q_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)q_bytes);
  if (e != cudaSuccess)
    return e;
  BwdIn in = {sc.q, sc.k, sc.v, sc.dy, lse, sc.dvec};
  flash_bwd_kv_k<D><<<tiles_grid(x.Sk, KVH, B), kThreads, kv_bytes, st>>>(
      dk, dv, in, S, x.Sk, x.shift, H, KVH, scale, add);
  if ((e = cudaGetLastError()) != cudaSuccess)
    return e;
  flash_bwd_q_k<D><<<tiles_grid(S, H, B), kThreads, q_bytes, st>>>(dq, in, S, x.Sk, x.shift, H,
                                                                   KVH, scale, add);
  return cudaGetLastError();
}

// sm_80 (A100) grants a block at most 163 KB of shared memory, sm_90 227 KB: the largest
// variant must fit the smaller.
constexpr size_t kMaxSmem = 163 * 1024;
static_assert(FwdSmem<128>::bytes <= kMaxSmem, "forward tiles exceed sm_80's shared memory");
static_assert(KvSmem<128>::bytes <= kMaxSmem, "dK/dV tiles exceed sm_80's shared memory");
static_assert(QSmem<128>::bytes <= kMaxSmem, "dQ tiles exceed sm_80's shared memory");

bool shape_ok(int batch, int seq) {
  return batch <= 65535 && (seq + kBr - 1) / kBr <= 65535; // grid y and z
}

} // namespace

bool kc_flash_attention_supported(int head_dim, int heads, int kv_heads) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128) && kv_heads > 0 &&
         heads % kv_heads == 0;
}

size_t kc_flash_attention_block_scratch_bytes(int batch, int q_len, int kv_len, int heads,
                                              int kv_heads, int head_dim, bool backward) {
  size_t bytes = 0;
  carve(nullptr, batch, q_len, kv_len, heads, kv_heads, head_dim, backward, &bytes);
  return bytes;
}

size_t kc_flash_attention_scratch_bytes(int batch, int seq, int heads, int kv_heads, int head_dim,
                                        bool backward) {
  return kc_flash_attention_block_scratch_bytes(batch, seq, seq, heads, kv_heads, head_dim,
                                                backward);
}

cudaError_t kc_flash_attention_block_forward(float *y, float *lse, void *scratch, const float *q,
                                             const float *k, const float *v, int batch, int q_len,
                                             int kv_len, int shift, int heads, int kv_heads,
                                             int head_dim, cudaStream_t st) {
  if (!batch || !q_len || !heads)
    return cudaSuccess;
  if (!shape_ok(batch, q_len > kv_len ? q_len : kv_len) || kv_len <= 0)
    return cudaErrorInvalidValue;
  Extent x = {q_len, kv_len, shift};
  switch (head_dim) {
  case 32: return forward<32>(y, lse, scratch, q, k, v, batch, x, heads, kv_heads, st);
  case 64: return forward<64>(y, lse, scratch, q, k, v, batch, x, heads, kv_heads, st);
  case 128: return forward<128>(y, lse, scratch, q, k, v, batch, x, heads, kv_heads, st);
  default: return cudaErrorInvalidValue;
  }
}

cudaError_t kc_flash_attention_forward(float *y, float *lse, void *scratch, const float *q,
                                       const float *k, const float *v, int batch, int seq,
                                       int heads, int kv_heads, int head_dim, cudaStream_t st) {
  return kc_flash_attention_block_forward(y, lse, scratch, q, k, v, batch, seq, seq, 0, heads,
                                          kv_heads, head_dim, st);
}

cudaError_t kc_flash_attention_block_backward(float *dq, float *dk, float *dv, void *scratch,
                                              const float *q, const float *k, const float *v,
                                              const float *y, const float *dy, const float *lse,
                                              int batch, int q_len, int kv_len, int shift,
                                              int heads, int kv_heads, int head_dim,
                                              bool accumulate, cudaStream_t st) {
  if (!batch || !q_len || !heads)
    return cudaSuccess;
  if (!shape_ok(batch, q_len > kv_len ? q_len : kv_len) || kv_len <= 0)
    return cudaErrorInvalidValue;
  Extent x = {q_len, kv_len, shift};
  bool a = accumulate;
  switch (head_dim) {
  case 32: return backward<32>(dq, dk, dv, scratch, q, k, v, y, dy, lse, batch, x, heads, kv_heads, a, st);
  case 64: return backward<64>(dq, dk, dv, scratch, q, k, v, y, dy, lse, batch, x, heads, kv_heads, a, st);
  case 128:
    return backward<128>(dq, dk, dv, scratch, q, k, v, y, dy, lse, batch, x, heads, kv_heads, a, st);
  default: return cudaErrorInvalidValue;
  }
}

cudaError_t kc_flash_attention_backward(float *dq, float *dk, float *dv, void *scratch,
                                        const float *q, const float *k, const float *v,
                                        const float *y, const float *dy, const float *lse,
                                        int batch, int seq, int heads, int kv_heads, int head_dim,
                                        cudaStream_t st) {
  return kc_flash_attention_block_backward(dq, dk, dv, scratch, q, k, v, y, dy, lse, batch, seq,
                                           seq, 0, heads, kv_heads, head_dim, false, st);
}
