// fp8: the FP8 recipes' quantisation kernels (kernels/fp8.h): a tensor's amax and scale
// (current scaling), its cast to e4m3, the blockwise casts (1 x 128 tiles, 128 x 128 blocks,
// each with its own scale) and the fp32 promotion of one 128-wide K slice's partial product.
// Every cast writes its operand K-major ([outer][K], compact), the layout cuBLASLt's FP8
// matmul reads (both operands contracted along their contiguous dimension), and rounds with
// kernels_fp8_e4m3_encode, the host reference's encoder. Reductions use a fixed tree and no
// atomics: the same bits run to run.
#include <math.h>
#include <string.h>

#include "cuda_block.cuh"
#include "fp8.h"

namespace {

constexpr int kFp8Threads = 128; // one thread per K element of a 128-wide tile
// Rows of blocks a grid strides over: enough to fill a GPU's SMs; the emulated GPU runs a
// fiber a thread, so it takes few (the results are the same bits: a max is exact in any order)
#ifdef PIPER_CUDA_EMU
constexpr int kFp8Rows = 8;
#else
constexpr int kFp8Rows = 256;
#endif

__host__ __device__ float load(const void *x, bool bf16, size_t i) {
  if (!bf16)
    return ((const float *)x)[i];
  uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// element (o, k) of x [rows, cols] (row stride ld): o along the outer dimension, k along K
__host__ __device__ size_t index_of(int ld, bool transpose, int o, int k) {
  return transpose ? (size_t)k * ld + o : (size_t)o * ld + k;
}

// Block-wide max in a fixed order (cuda_block.cuh), over the block's kFp8Threads.
__device__ float block_max128(float v) {
  __shared__ float buf[kFp8Threads];
  return block_max_in(buf, v);
}

// partials[block] = max |x| over the block's rows
__global__ void amax_k(float *partials, const void *x, bool bf16, int rows, int cols, int ld) {
  float m = 0.0f;
  for (int r = blockIdx.x; r < rows; r += gridDim.x)
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      m = fmaxf(m, fabsf(load(x, bf16, (size_t)r * ld + c)));
  m = block_max128(m);
  if (threadIdx.x == 0)
    partials[blockIdx.x] = m;
}

// scale[0] = 448 / amax (1 when the tensor is zero), scale[1] = its inverse
__global__ void scale_k(float *scale, const float *partials, int n) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    m = fmaxf(m, partials[i]);
  m = block_max128(m);
  if (threadIdx.x == 0) {
    float s = m > 0.0f ? KERNELS_FP8_E4M3_MAX / m : 1.0f;
    scale[0] = s;
    scale[1] = 1.0f / s;
  }
}

// q [outer][ldq]: x's e4m3 copy K-major, zeros in [K, ldq) (a K padded to cuBLASLt's 16)
__global__ void quantize_tensor_k(uint8_t *q, int ldq, const void *x, bool bf16, int K, int outer,
                                  int ld, bool transpose, const float *scale) {
  float s = scale[0];
  for (int o = blockIdx.y; o < outer; o += gridDim.y)
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < ldq; k += gridDim.x * blockDim.x)
      q[(size_t)o * ldq + k] =
          k < K ? kernels_fp8_e4m3_encode(load(x, bf16, index_of(ld, transpose, o, k)) * s) : 0;
}

// a block per tile (block_outer rows of the outer dimension by 128 of K), striding over the
// tiles of the outer dimension; the last tile also writes the padding [K, ldq) with zeros
__global__ void quantize_tiles_k(uint8_t *q, int ldq, float *inv, const void *x, bool bf16, int K,
                                 int outer, int ld, bool transpose, int block_outer) {
  int nk = (K + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK, nob = (outer + block_outer - 1) / block_outer;
  int kt = blockIdx.x, k = kt * KERNELS_FP8_BLOCK + (int)threadIdx.x;
  for (int ob = blockIdx.y; ob < nob; ob += gridDim.y) {
    int o0 = ob * block_outer, o1 = o0 + block_outer < outer ? o0 + block_outer : outer;
    float m = 0.0f;
    for (int o = o0; k < K && o < o1; o++)
      m = fmaxf(m, fabsf(load(x, bf16, index_of(ld, transpose, o, k))));
    m = block_max128(m);
    float s = m > 0.0f ? KERNELS_FP8_E4M3_MAX / m : 1.0f;
    if (threadIdx.x == 0)
      inv[(size_t)ob * nk + kt] = 1.0f / s;
    for (int o = o0; k < ldq && o < o1; o++)
      q[(size_t)o * ldq + k] =
          k < K ? kernels_fp8_e4m3_encode(load(x, bf16, index_of(ld, transpose, o, k)) * s) : 0;
  }
}

// C [m, n] (row stride ldc) = (first ? beta C : C) + alpha part [m, n] inv_a(i) inv_b(j):
// one K slice's FP8 partial product promoted to fp32 with its tiles' dequantisation factors
__global__ void promote_k(float *C, int ldc, const float *part, int m, int n, float alpha,
                          float beta, bool first, const float *inv_a, int br_a,
                          const float *inv_b, int br_b, int nk, int slice) {
  for (int i = blockIdx.y; i < m; i += gridDim.y) {
    float fa = alpha * inv_a[(size_t)(i / br_a) * nk + slice];
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
      float v = part[(size_t)i * n + j] * fa * inv_b[(size_t)(j / br_b) * nk + slice];
      float *c = C + (size_t)i * ldc + j;
      *c = first ? (beta == 0.0f ? v : beta * *c + v) : *c + v;
    }
  }
}

// x [n, C] = decode(q) * inv of each element's 1 x 128 tile: the FP8 cache of the routed rows
// read back (kernels_fp8_rows_dequantize, the same float product)
__global__ void dequantize_rows_k(float *x, const uint8_t *q, const float *inv, int n, int C) {
  int nk = (C + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  for (int r = blockIdx.y; r < n; r += gridDim.y)
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
      x[(size_t)r * C + c] = kernels_fp8_e4m3_decode(q[(size_t)r * C + c]) *
                             inv[(size_t)r * nk + c / KERNELS_FP8_BLOCK];
}

dim3 grid_2d(int inner, int outer) {
  unsigned bx = (unsigned)((inner + kFp8Threads - 1) / kFp8Threads);
  return dim3(bx < 64 ? (bx ? bx : 1) : 64, outer < 65535 ? (unsigned)(outer ? outer : 1) : 65535u);
}

} // namespace

extern "C" {

void kc_fp8_amax_scale(float *scale, float *partials, const void *x, bool bf16, int rows,
                       int cols, int ld, cudaStream_t st) {
  int blocks = rows < kFp8Rows ? (rows ? rows : 1) : kFp8Rows; /* <= KC_FP8_PARTIALS */
  amax_k<<<blocks, kFp8Threads, 0, st>>>(partials, x, bf16, rows, cols, ld);
  scale_k<<<1, kFp8Threads, 0, st>>>(scale, partials, blocks);
}

void kc_fp8_quantize_tensor(uint8_t *q, int ldq, const void *x, bool bf16, int rows, int cols,
                            int ld, bool transpose, const float *scale, cudaStream_t st) {
  int K = transpose ? rows : cols, outer = transpose ? cols : rows;
  if (K > 0 && outer > 0)
    quantize_tensor_k<<<grid_2d(ldq, outer < kFp8Rows ? outer : kFp8Rows), kFp8Threads, 0, st>>>(
        q, ldq, x, bf16, K, outer, ld, transpose, scale);
}

void kc_fp8_quantize_tiles(uint8_t *q, int ldq, float *inv, const void *x, bool bf16, int rows,
                           int cols, int ld, bool transpose, int block_outer, cudaStream_t st) {
  int K = transpose ? rows : cols, outer = transpose ? cols : rows;
  int nk = (K + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  int nob = (outer + block_outer - 1) / block_outer;
  if (nk && nob)
    quantize_tiles_k<<<dim3((unsigned)nk, (unsigned)(nob < kFp8Rows ? nob : kFp8Rows)), kFp8Threads, 0, st>>>(
        q, ldq, inv, x, bf16, K, outer, ld, transpose, block_outer);
}

void kc_fp8_promote(float *C, int ldc, const float *part, int m, int n, float alpha, float beta,
                    bool first, const float *inv_a, int br_a, const float *inv_b, int br_b,
                    int nk, int slice, cudaStream_t st) {
  if (m > 0 && n > 0)
    promote_k<<<grid_2d(n, m < kFp8Rows ? m : kFp8Rows), kFp8Threads, 0, st>>>(C, ldc, part, m, n, alpha, beta, first,
                                                     inv_a, br_a, inv_b, br_b, nk, slice);
}

void kc_fp8_dequantize_rows(float *x, const uint8_t *q, const float *inv, int n_rows, int C,
                            cudaStream_t st) {
  if (n_rows > 0 && C > 0)
    dequantize_rows_k<<<grid_2d(C, n_rows < kFp8Rows ? n_rows : kFp8Rows), kFp8Threads, 0, st>>>(
        x, q, inv, n_rows, C);
}

} // extern "C"
