/* fp8: the host reference of the FP8 recipes' quantisers (kernels/fp8.h). */
#include "fp8.h"
#include "kernels.h"

/* element (o, k) of x: o along the outer dimension, k along K */
static float at(const float *x, int ld, int transpose, int o, int k) {
  return transpose ? x[(size_t)k * ld + o] : x[(size_t)o * ld + k];
}

void kernels_fp8_quantize_tiles(uint8_t *q, float *inv, const float *x, int rows, int cols,
                                int ld, int transpose, int block_outer) {
  int K = transpose ? rows : cols, outer = transpose ? cols : rows;
  int nk = (K + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  for (int ob = 0; ob * block_outer < outer; ob++)
    for (int kt = 0; kt < nk; kt++) {
      int o1 = (ob + 1) * block_outer < outer ? (ob + 1) * block_outer : outer;
      int k0 = kt * KERNELS_FP8_BLOCK;
      int k1 = k0 + KERNELS_FP8_BLOCK < K ? k0 + KERNELS_FP8_BLOCK : K;
      float amax = 0.0f;
      for (int o = ob * block_outer; o < o1; o++)
        for (int k = k0; k < k1; k++)
          amax = fmaxf(amax, fabsf(at(x, ld, transpose, o, k)));
      float scale = amax > 0.0f ? KERNELS_FP8_E4M3_MAX / amax : 1.0f;
      inv[(size_t)ob * nk + kt] = 1.0f / scale;
      for (int o = ob * block_outer; o < o1; o++)
        for (int k = k0; k < k1; k++)
          q[(size_t)o * K + k] = kernels_fp8_e4m3_encode(at(x, ld, transpose, o, k) * scale);
    }
}

float kernels_fp8_quantize_tensor(uint8_t *q, const float *x, int rows, int cols, int ld,
                                  int transpose) {
  int K = transpose ? rows : cols, outer = transpose ? cols : rows;
  float amax = 0.0f;
  for (int o = 0; o < outer; o++)
    for (int k = 0; k < K; k++)
      amax = fmaxf(amax, fabsf(at(x, ld, transpose, o, k)));
  float scale = amax > 0.0f ? KERNELS_FP8_E4M3_MAX / amax : 1.0f;
  for (int o = 0; o < outer; o++)
    for (int k = 0; k < K; k++)
      q[(size_t)o * K + k] = kernels_fp8_e4m3_encode(at(x, ld, transpose, o, k) * scale);
  return 1.0f / scale;
}

/* DeepSeek-V3's FP8 cache of the routed rows (kernels/ops.def): 1 x 128 tiles along each row */
void kernels_fp8_rows_quantize(uint8_t *q, float *inv, const float *x, int n_rows, int C) {
  kernels_fp8_quantize_tiles(q, inv, x, n_rows, C, C, 0, 1);
}

void kernels_fp8_rows_dequantize(float *x, const uint8_t *q, const float *inv, int n_rows, int C) {
  int nk = (C + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  for (int r = 0; r < n_rows; r++)
    for (int c = 0; c < C; c++)
      x[(size_t)r * C + c] = kernels_fp8_e4m3_decode(q[(size_t)r * C + c]) *
                             inv[(size_t)r * nk + c / KERNELS_FP8_BLOCK];
}
