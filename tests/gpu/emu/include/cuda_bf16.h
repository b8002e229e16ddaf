// A host stand-in for <cuda_bf16.h> (tests/gpu/emu/README.md), C++ only (the kernels'): bf16
// as its bits, rounded to nearest even like __float2bfloat16_rn.
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN stays a (quiet) NaN
    b.bits = (uint16_t)((u >> 16) | 0x40u);
  else
    b.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return b;
}

inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) {
  return b.bits;
}

inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float emu_bf16_to_float(__nv_bfloat16 b) {
  return __bfloat162float(b);
}
