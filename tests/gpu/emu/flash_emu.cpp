// flash_emu: kernels/flash_attention.cu run on the host (the emulation: README.md here)
// against a plain double-precision causal attention, forward and backward, at the shape given:
//   flash_emu BATCH SEQ HEADS KV_HEADS HEAD_DIM [chunks]
// With "chunks" (BATCH 1, SEQ even): context parallelism's blocks instead
// (kc_flash_attention_block_*): the sequence's halves A and B as chunks, B's queries against A's
// keys (shift SEQ / 2, every key seen) and against its own (the diagonal), A's against its
// own; the forward's two blocks of B merged as kernels_attention_merge merges, the backward's
// gradients added over the blocks (accumulate), both against the whole sequence's reference.
// The kernel rounds q, k, v, p, dy and ds to bf16 as the GPU does; the error measure and the
// tolerance are tests/gpu/check_kernels.c's (max |error| / max |reference|, 3e-2). The
// backward gets the reference's y and lse, so a fault is pinned to one pass. Exits 1 on a
// failure. Built by `make emu`, run by tests/cli/test_cuda_emu.sh.
#include <cuda_runtime.h>

#include "kernels_cuda.h"

#include <algorithm>
#include <random>
#include <string>

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

// C[rows] of a [S, width] tensor from row r0, as its own compact tensor
std::vector<float> rows_of(const std::vector<float> &x, int r0, int rows, int width) {
  return std::vector<float>(x.begin() + (size_t)r0 * width, x.begin() + (size_t)(r0 + rows) * width);
}

// The block path at B 1: true when every pass is within the tolerance.
bool check_chunks(const shape &s, const std::vector<float> &q, const std::vector<float> &k,
                  const std::vector<float> &v, const std::vector<float> &dy, const reference &r) {
  int L = s.S / 2, HD = s.H * s.D, KD = s.KVH * s.D;
  std::vector<unsigned char> scratch(
      kc_flash_attention_block_scratch_bytes(1, L, L, s.H, s.KVH, s.D, true), 0xff);
  // forward: B against A and against B, merged in double; A against A
  std::vector<float> qB = rows_of(q, L, L, HD), kA = rows_of(k, 0, L, KD), vA = rows_of(v, 0, L, KD);
  std::vector<float> kB = rows_of(k, L, L, KD), vB = rows_of(v, L, L, KD), qA = rows_of(q, 0, L, HD);
  std::vector<float> y1(qB.size(), NAN), l1((size_t)s.H * L, NAN), y2 = y1, l2 = l1, yA = y1, lA = l1;
  bool ok = kc_flash_attention_block_forward(y1.data(), l1.data(), scratch.data(), qB.data(), kA.data(), vA.data(), 1, L, L, L, s.H, s.KVH, s.D, nullptr) == cudaSuccess &&
            kc_flash_attention_block_forward(y2.data(), l2.data(), scratch.data(), qB.data(), kB.data(), vB.data(), 1, L, L, 0, s.H, s.KVH, s.D, nullptr) == cudaSuccess &&
            kc_flash_attention_block_forward(yA.data(), lA.data(), scratch.data(), qA.data(), kA.data(), vA.data(), 1, L, L, 0, s.H, s.KVH, s.D, nullptr) == cudaSuccess;
  std::vector<float> y(r.y.size()), lse(r.lse.size());
  for (int i = 0; i < s.S; i++)
    for (int h = 0; h < s.H; h++) {
      int li = i % L;
      size_t row = (size_t)h * L + li;
      double a = i < L ? lA[row] : l1[row], c = i < L ? -INFINITY : l2[row];
      double m = std::max(a, c), lm = m + std::log(std::exp(a - m) + std::exp(c - m));
      lse[(size_t)h * s.S + i] = (float)lm;
      for (int d = 0; d < s.D; d++) {
        size_t e = (size_t)li * HD + (size_t)h * s.D + d;
        double ya = i < L ? yA[e] : y1[e], yc = i < L ? 0.0 : y2[e];
        y[s.q_index(0, i, h, d)] = (float)(std::exp(a - lm) * ya + (c > -INFINITY ? std::exp(c - lm) * yc : 0.0));
      }
    }
  // backward from the reference's y and lse, each chunk's rows: gradients added over blocks
  std::vector<float> ry(r.y.begin(), r.y.end()), rl(r.lse.begin(), r.lse.end());
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  std::vector<float> lseA((size_t)s.H * L), lseB((size_t)s.H * L);
  for (int h = 0; h < s.H; h++)
    for (int i = 0; i < L; i++)
      lseA[(size_t)h * L + i] = rl[(size_t)h * s.S + i], lseB[(size_t)h * L + i] = rl[(size_t)h * s.S + L + i];
  std::vector<float> dyA = rows_of(dy, 0, L, HD), dyB = rows_of(dy, L, L, HD);
  std::vector<float> yrA = rows_of(ry, 0, L, HD), yrB = rows_of(ry, L, L, HD);
  float *dqA = dq.data(), *dqB = dq.data() + (size_t)L * HD, *dkA = dk.data(), *dkB = dk.data() + (size_t)L * KD;
  float *dvA = dv.data(), *dvB = dv.data() + (size_t)L * KD;
  ok = ok && kc_flash_attention_block_backward(dqB, dkA, dvA, scratch.data(), qB.data(), kA.data(), vA.data(), yrB.data(), dyB.data(), lseB.data(), 1, L, L, L, s.H, s.KVH, s.D, true, nullptr) == cudaSuccess &&
       kc_flash_attention_block_backward(dqB, dkB, dvB, scratch.data(), qB.data(), kB.data(), vB.data(), yrB.data(), dyB.data(), lseB.data(), 1, L, L, 0, s.H, s.KVH, s.D, true, nullptr) == cudaSuccess &&
       kc_flash_attention_block_backward(dqA, dkA, dvA, scratch.data(), qA.data(), kA.data(), vA.data(), yrA.data(), dyA.data(), lseA.data(), 1, L, L, 0, s.H, s.KVH, s.D, true, nullptr) == cudaSuccess;
  const char *names[] = {"y", "lse", "dq", "dk", "dv"};
  double errors[] = {error_of(y, r.y), error_of(lse, r.lse), error_of(dq, r.dq), error_of(dk, r.dk), error_of(dv, r.dv)};
  printf("chunks B1 S%d H%d/%d D%d:", s.S, s.H, s.KVH, s.D);
  bool good = ok;
  for (int i = 0; i < 5; i++) {
    printf(" %s %.1e", names[i], errors[i]);
    good = good && errors[i] <= 3e-2;
  }
  printf("%s\n", good ? "" : ok ? "  FAIL (tolerance 3e-2)" : "  FAIL (launch refused)");
  return good;
}

} // namespace

int main(int argc, char **argv) {
  bool chunks = argc == 7 && std::string(argv[6]) == "chunks";
  if (argc != 6 && !chunks) {
    fprintf(stderr, "usage: flash_emu BATCH SEQ HEADS KV_HEADS HEAD_DIM [chunks]\n");
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
  if (chunks)
    return s.B == 1 && s.S % 2 == 0 && check_chunks(s, q, k, v, dy, r) ? 0 : 1;
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
