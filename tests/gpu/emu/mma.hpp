// A host stand-in for <mma.h> (nvcuda::wmma, 16x16x16 bf16 -> fp32 only; see fake_cuda.hpp).
// Every thread of a warp holds the whole tile (the real fragment spreads it over the lanes:
// which lane holds what is unspecified, so code that respects the API cannot tell). The
// operations are warp-collective as on the GPU: each starts with the warp in step, so that no
// lane stores over a tile another lane of its warp has still to load.
#pragma once
#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  float x[16][16];
};
typedef fragment<accumulator, 16, 16, 16, float> emu_acc;

template <typename Use, typename T, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ld) {
  __syncwarp();
  for (unsigned i = 0; i < 16; i++)
    for (unsigned j = 0; j < 16; j++)
      f.x[i][j] =
          emu_bf16_to_float(std::is_same<L, row_major>::value ? p[i * ld + j] : p[j * ld + i]);
}

inline void load_matrix_sync(emu_acc &f, const float *p, unsigned ld, layout_t l) {
  __syncwarp();
  for (unsigned i = 0; i < 16; i++)
    for (unsigned j = 0; j < 16; j++)
      f.x[i][j] = l == mem_row_major ? p[i * ld + j] : p[j * ld + i];
}

inline void store_matrix_sync(float *p, const emu_acc &f, unsigned ld, layout_t l) {
  __syncwarp();
  for (unsigned i = 0; i < 16; i++)
    for (unsigned j = 0; j < 16; j++)
      (l == mem_row_major ? p[i * ld + j] : p[j * ld + i]) = f.x[i][j];
}

inline void fill_fragment(emu_acc &f, float v) {
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++)
      f.x[i][j] = v;
}

template <typename A, typename B>
void mma_sync(emu_acc &d, const A &a, const B &b, const emu_acc &c) {
  emu_acc r;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[i][j];
      for (int k = 0; k < 16; k++)
        s += a.x[i][k] * b.x[k][j];
      r.x[i][j] = s;
    }
  d = r;
}
} // namespace wmma
} // namespace nvcuda
