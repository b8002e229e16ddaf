// A host stand-in for <cuda_bf16.h>, only what kernels/flash_attention.cu uses (see
// fake_cuda.hpp): bf16 as its bits, rounded to nearest even like __float2bfloat16_rn.
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 b;
  b.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); // no NaN in these inputs
  return b;
}

inline float emu_bf16_to_float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
