// A host stand-in for kernels/mma_sm80.cuh (see fake_cuda.hpp): the same warp-collective
// primitives, each lane holding exactly the registers PTX gives it (the layouts in
// mma_sm80.cuh's comment), so that a lane-mapping mistake in the kernels shows up as wrong
// sums. Each operation starts and ends with the warp in step, as on the GPU. cp.async copies
// at once: the emulation checks what lands where, not the asynchrony.
#pragma once
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>



inline thread_local uint32_t emu_regs[32][32][6]; // [warp][lane]: a0..a3, b0, b1 of an mma
inline thread_local const void *emu_rows[32][32]; // [warp][lane]: ldmatrix row addresses

inline uint32_t emu_bits(float f) {
  return __float2bfloat16_rn(f).bits;
}

// bf16 half h (0: low) of a register
inline float emu_half(uint32_t r, int h) {
  __nv_bfloat16 b;
  b.bits = (uint16_t)(r >> (16 * h));
  return emu_bf16_to_float(b);
}

inline uint32_t pack_bf16(float lo, float hi) {
  return emu_bits(lo) | emu_bits(hi) << 16;
}

inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  for (int i = 0; i < 4; i++)
    emu_regs[w][l][i] = a[i];
  emu_regs[w][l][4] = b0;
  emu_regs[w][l][5] = b1;
  __syncwarp();
  float A[16][16], B[16][8];
  for (int L = 0; L < 32; L++) {
    const uint32_t *r = emu_regs[w][L];
    int g = L / 4, t = L % 4;
    for (int e = 0; e < 2; e++) {
      A[g][2 * t + e] = emu_half(r[0], e);
      A[g + 8][2 * t + e] = emu_half(r[1], e);
      A[g][2 * t + 8 + e] = emu_half(r[2], e);
      A[g + 8][2 * t + 8 + e] = emu_half(r[3], e);
      B[2 * t + e][g] = emu_half(r[4], e);
      B[2 * t + 8 + e][g] = emu_half(r[5], e);
    }
  }
  __syncwarp();
  int g = l / 4, t = l % 4;
  for (int e = 0; e < 4; e++) {
    int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
    float s = d[e];
    for (int k = 0; k < 16; k++)
      s += A[row][k] * B[k][col];
    d[e] = s;
  }
}

inline uint32_t emu_elem(const void *row, int col) {
  uint16_t x;
  std::memcpy(&x, (const unsigned char *)row + 2 * col, 2);
  return x;
}

inline void emu_ldmatrix(uint32_t (&r)[4], const void *row, bool trans) {
  int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t = l % 4;
  emu_rows[w][l] = row;
  __syncwarp();
  for (int i = 0; i < 4; i++) {
    const void *const *m = emu_rows[w] + 8 * i; // matrix i's eight row addresses
    r[i] = trans ? emu_elem(m[2 * t], g) | emu_elem(m[2 * t + 1], g) << 16
                 : emu_elem(m[g], 2 * t) | emu_elem(m[g], 2 * t + 1) << 16;
  }
  __syncwarp();
}

inline void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
  emu_ldmatrix(r, row, false);
}

inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
  emu_ldmatrix(r, row, true);
}

inline void cp_async_16(void *dst, const void *src, bool valid) {
  if (valid)
    std::memcpy(dst, src, 16);
  else
    std::memset(dst, 0, 16);
}

inline void cp_async_commit() {}

template <int N> void cp_async_wait() {}
