// mma_sm80: the warp-level tensor-core primitives kernels/flash_attention.cu is built from
// (sm_80 and later), as inline PTX: mma.sync m16n8k16 (bf16 operands, fp32 accumulation),
// ldmatrix (shared memory to operand registers, optionally transposed) and cp.async
// (global to shared memory without passing through registers). The fragment layouts are the
// PTX ISA's, which the kernels rely on to keep the softmax in registers; with lane = 32 w + l,
// g = l / 4, t = l % 4:
//   A (16 x 16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16 x 8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16 x 8, fp32): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// Two bf16 share a 32-bit register, the lower column in the low half. tests/gpu/emu has a
// host stand-in with the same lane semantics (tests/cli/test_flash_emu.sh).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

// lo, hi rounded to bf16 (nearest even), packed: lo in bits 0..15
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// d += a b (16 x 16 times 16 x 8), one warp
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices: lane 8 i + j gives the address of row j of matrix i; r[i] is
// matrix i's (row g, columns 2t, 2t + 1), or with _trans its (rows 2t, 2t + 1, column g).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// 16 bytes global -> shared, asynchronously; !valid writes 16 zero bytes (src is not read)
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool valid) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(dst);
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// until at most N of the groups committed last are still in flight
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
