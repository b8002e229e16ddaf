/* fp8: the FP8 recipes' number format (e4m3, OCP "fn": max 448, no infinities), its
 * round-to-nearest-even saturating encoder and exact decoder, shared by the host reference and
 * the CUDA quantisation kernels (kernels/fp8.cu) so both round the same way.
 *
 *   float x = 0.3f, amax = 2.0f;                              // amax: max |x| of the tile
 *   uint8_t q = kernels_fp8_e4m3_encode(x * 448.0f / amax);   // scale = 448 / amax
 *   float back = kernels_fp8_e4m3_decode(q) * amax / 448.0f;  // what an FP8 GEMM multiplies
 */
#ifndef PIPER_KERNELS_FP8_H
#define PIPER_KERNELS_FP8_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KERNELS_FP8_HD __host__ __device__ static inline
#else
#define KERNELS_FP8_HD static inline
#endif

/* the largest finite e4m3 value: the quantisers' target for a tile's amax */
#define KERNELS_FP8_E4M3_MAX 448.0f
/* the K extent of a blockwise tile (DeepSeek-V3: 1 x 128 activation tiles, 128 x 128 weight
 * blocks) and the interval at which partial sums are promoted to fp32 */
#define KERNELS_FP8_BLOCK 128

/* x to e4m3, rounding to nearest with ties to even, saturating at +-448 (the recipes scale
 * into range first, so saturation only clips what rounding pushed over); NaN stays NaN
 * (0x7f). Bias 7; normals 2^-6 .. 448, subnormals multiples of 2^-9. */
KERNELS_FP8_HD uint8_t kernels_fp8_e4m3_encode(float x) {
  uint8_t sign = signbit(x) ? 0x80 : 0;
  float a = fabsf(x);
  if (isnan(x))
    return (uint8_t)(sign | 0x7f);
  if (a >= KERNELS_FP8_E4M3_MAX)
    return (uint8_t)(sign | 0x7e);
  if (a < 0.015625f) /* 2^-6: subnormal; a * 512 is exact, rintf ties to even; 8 is 2^-6 */
    return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f));
  int e;
  float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
  int m = (int)rintf((f * 2.0f - 1.0f) * 8.0f); /* 3 mantissa bits, exact before rounding */
  e -= 1;
  if (m == 8) {
    m = 0;
    e++;
  }
  int code = ((e + 7) << 3) | m;
  return (uint8_t)(sign | (code > 0x7e ? 0x7e : code));
}

KERNELS_FP8_HD float kernels_fp8_e4m3_decode(uint8_t c) {
  int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7)
    return NAN;
  float v = e == 0 ? (float)m * 0.001953125f /* 2^-9 */ : ldexpf(1.0f + (float)m / 8.0f, e - 7);
  return c & 0x80 ? -v : v;
}

/* The host reference of the quantisers (kernels/fp8.c), for checking kernels/fp8.cu.
 * x [rows, cols] with row stride ld; K is the GEMM's contraction dimension: cols, or rows when
 * transpose. q is written K-major ([outer][K], compact: what an FP8 GEMM reads), inv [outer
 * blocks][K / 128 rounded up] the dequantisation factors (amax / 448 per tile, 1 for an
 * all-zero tile). block_outer 1: 1 x 128 tiles (activations); 128: 128 x 128 blocks
 * (weights). kernels_fp8_quantize_tensor scales the whole tensor by one factor (amax over all
 * of it: current scaling) and returns its dequantisation factor. */
void kernels_fp8_quantize_tiles(uint8_t *q, float *inv, const float *x, int rows, int cols,
                                int ld, int transpose, int block_outer);
float kernels_fp8_quantize_tensor(uint8_t *q, const float *x, int rows, int cols, int ld,
                                  int transpose);

#ifdef HAVE_CUDA
#include <cuda_runtime.h>
#include <stdbool.h>
#ifdef __cplusplus
extern "C" {
#endif
/* The device twins (kernels/fp8.cu), each enqueued on st; x is fp32, or bf16 bits when bf16.
 * kc_fp8_amax_scale: scale[0] = 448 / amax(x), scale[1] = amax / 448 (device floats), through
 * partials (KC_FP8_PARTIALS device floats). kc_fp8_quantize_tensor: q = e4m3(x * scale[0]),
 * K-major with row stride ldq >= K, zeros in [K, ldq) (a K padded to a multiple of 16 for
 * cuBLASLt: zeros add nothing to the product). kc_fp8_quantize_tiles: as
 * kernels_fp8_quantize_tiles, with ldq as the tensorwise one. kc_fp8_promote: C [m, n]
 * (ldc) = (first ? beta C : C) + alpha part [m, n] inv_a[i / br_a][slice] inv_b[j / br_b][slice]
 * (nk slices a row of inv): one 128-wide K slice's FP8 product promoted to fp32. */
#define KC_FP8_PARTIALS 256
void kc_fp8_amax_scale(float *scale, float *partials, const void *x, bool bf16, int rows,
                       int cols, int ld, cudaStream_t st);
void kc_fp8_quantize_tensor(uint8_t *q, int ldq, const void *x, bool bf16, int rows, int cols,
                            int ld, bool transpose, const float *scale, cudaStream_t st);
void kc_fp8_quantize_tiles(uint8_t *q, int ldq, float *inv, const void *x, bool bf16, int rows,
                           int cols, int ld, bool transpose, int block_outer, cudaStream_t st);
void kc_fp8_promote(float *C, int ldc, const float *part, int m, int n, float alpha, float beta,
                    bool first, const float *inv_a, int br_a, const float *inv_b, int br_b,
                    int nk, int slice, cudaStream_t st);
/* kc_fp8_dequantize_rows: as kernels_fp8_rows_dequantize (kernels/ops.def) */
void kc_fp8_dequantize_rows(float *x, const uint8_t *q, const float *inv, int n_rows, int C,
                            cudaStream_t st);
#ifdef __cplusplus
}
#endif
#endif /* HAVE_CUDA */

#endif
