// flash_emu: kernels/flash_attention.cu run on the host (the emulation: README.md here)
// against a plain double-precision causal attention, forward and backward, at the shape given:
//   flash_emu BATCH SEQ HEADS KV_HEADS HEAD_DIM
// The kernel rounds q, k, v, p, dy and ds to bf16 as the GPU does; the error measure and the
// tolerance are tests/gpu/check_kernels.c's (max |error| / max |reference|, 3e-2). The
// backward gets the reference's y and lse, so a fault is pinned to one pass. Exits 1 on a
// failure. Built by `make emu`, run by tests/cli/test_cuda_emu.sh.
#include <cuda_runtime.h>

#include "kernels_cuda.h"

#include <algorithm>
#include <random>

namespace {

struct shape {
  int B, S, H, KVH, D;
  size_t T() const {
    return (size_t)B * S;
  }
  size_t q_index(int b, int i, int h, int d) const {
    return ((size_t)b * S + i) * H * D + (size_t)h * D + d;
  }
  size_t k_index(int b, int j, int h, int d) const {
    return ((size_t)b * S + j) * KVH * D + (size_t)(h / (H / KVH)) * D + d;
  }
};

struct reference {
  std::vector<double> y, lse, dq, dk, dv;
};

// One (sequence, head): probabilities P [S x S] (row i over keys j <= i), y, lse, then the
// gradients (dk, dv accumulate over the heads of a kv group).
void reference_head(const shape &s, int b, int h, const std::vector<float> &q,
                    const std::vector<float> &k, const std::vector<float> &v,
                    const std::vector<float> &dy, reference &r) {
  double scale = 1.0 / std::sqrt((double)s.D);
  std::vector<double> P((size_t)s.S * s.S, 0.0);
  for (int i = 0; i < s.S; i++) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j <= i; j++) {
      double a = 0;
      for (int d = 0; d < s.D; d++)
        a += (double)q[s.q_index(b, i, h, d)] * k[s.k_index(b, j, h, d)];
      P[(size_t)i * s.S + j] = a * scale;
      mx = std::max(mx, a * scale);
    }
    for (int j = 0; j <= i; j++)
      sum += std::exp(P[(size_t)i * s.S + j] - mx);
    r.lse[((size_t)b * s.H + h) * s.S + i] = mx + std::log(sum);
    for (int j = 0; j <= i; j++)
      P[(size_t)i * s.S + j] = std::exp(P[(size_t)i * s.S + j] - mx) / sum;
    for (int d = 0; d < s.D; d++) {
      double a = 0;
      for (int j = 0; j <= i; j++)
        a += P[(size_t)i * s.S + j] * v[s.k_index(b, j, h, d)];
      r.y[s.q_index(b, i, h, d)] = a;
    }
  }
  for (int i = 0; i < s.S; i++) {
    std::vector<double> dp(i + 1);
    double dot = 0;
    for (int j = 0; j <= i; j++) {
      for (int d = 0; d < s.D; d++)
        dp[j] += (double)dy[s.q_index(b, i, h, d)] * v[s.k_index(b, j, h, d)];
      dot += P[(size_t)i * s.S + j] * dp[j];
    }
    for (int j = 0; j <= i; j++) {
      double p = P[(size_t)i * s.S + j], ds = p * (dp[j] - dot) * scale;
      for (int d = 0; d < s.D; d++) {
        r.dq[s.q_index(b, i, h, d)] += ds * k[s.k_index(b, j, h, d)];
        r.dk[s.k_index(b, j, h, d)] += ds * q[s.q_index(b, i, h, d)];
        r.dv[s.k_index(b, j, h, d)] += p * dy[s.q_index(b, i, h, d)];
      }
    }
  }
}

// max |got - ref| / max |ref| (absolute where the reference is all zero); NaN counts as failed
double error_of(const std::vector<float> &got, const std::vector<double> &ref) {
  double err = 0, top = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    if (std::isnan(got[i]))
      return INFINITY;
    top = std::max(top, std::fabs(ref[i]));
    err = std::max(err, std::fabs(got[i] - ref[i]));
  }
  return top > 0 ? err / top : err;
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: flash_emu BATCH SEQ HEADS KV_HEADS HEAD_DIM\n");
    return 2;
  }
  shape s = {atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
  if (!kc_flash_attention_supported(s.D, s.H, s.KVH)) {
    fprintf(stderr, "flash_emu: head_dim %d with %d/%d heads is not a fused shape\n", s.D, s.H,
            s.KVH);
    return 2;
  }
  size_t nq = s.T() * s.H * s.D, nk = s.T() * s.KVH * s.D, nl = s.T() * s.H;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uni(-1.5f, 1.5f); // scores spread over a few units
  std::vector<float> q(nq), k(nk), v(nk), dy(nq);
  for (auto *x : {&q, &k, &v, &dy})
    for (auto &e : *x)
      e = uni(rng);
  reference r = {std::vector<double>(nq), std::vector<double>(nl), std::vector<double>(nq),
                 std::vector<double>(nk), std::vector<double>(nk)};
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.H; h++)
      reference_head(s, b, h, q, k, v, dy, r);
  // NaN-filled outputs: an element the kernels leave unwritten fails
  std::vector<float> y(nq, NAN), lse(nl, NAN), dq(nq, NAN), dk(nk, NAN), dv(nk, NAN);
  // NaN bytes: what a pass reads of its scratch before writing it shows up
  std::vector<unsigned char> scratch(
      kc_flash_attention_scratch_bytes(s.B, s.S, s.H, s.KVH, s.D, true), 0xff);
  std::vector<float> ry(r.y.begin(), r.y.end()), rlse(r.lse.begin(), r.lse.end());
  bool launched =
      kc_flash_attention_forward(y.data(), lse.data(), scratch.data(), q.data(), k.data(), v.data(), s.B, s.S, s.H,
                                 s.KVH, s.D, nullptr) == cudaSuccess &&
      kc_flash_attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), q.data(), k.data(),
                                  v.data(), ry.data(), dy.data(), rlse.data(), s.B, s.S, s.H, s.KVH,
                                  s.D, nullptr) == cudaSuccess;
  const char *names[] = {"y", "lse", "dq", "dk", "dv"};
  double errors[] = {error_of(y, r.y), error_of(lse, r.lse), error_of(dq, r.dq), error_of(dk, r.dk),
                     error_of(dv, r.dv)};
  bool ok = launched;
  printf("B%d S%d H%d/%d D%d:", s.B, s.S, s.H, s.KVH, s.D);
  for (int i = 0; i < 5; i++) {
    printf(" %s %.1e", names[i], errors[i]);
    ok = ok && errors[i] <= 3e-2;
  }
  printf("%s\n", ok ? "" : launched ? "  FAIL (tolerance 3e-2)" : "  FAIL (launch refused)");
  return ok ? 0 : 1;
}
