/* Ring attention's blocks (kernels/attention_cp.c): a rank's two load-balanced query chunks
 * run against every key chunk of the sequence and merged by log-sum-exp give the whole causal
 * attention's rows, and the blocks' backward sums to its gradients (checked against a direct
 * double-precision reference, itself checked by finite differences). */
#include "test-helpers.h"

#include "../../kernels/kernels.h"

#define S 16 /* sequence */
#define H 4  /* query heads */
#define KV 2 /* KV heads */
#define D 8  /* head size */

static float frand(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)((*state >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* Direct causal attention in double: y [S, H*D], lse [S, H]; with dy, the gradients. */
static void reference(const float *q, const float *k, const float *v, const float *dy, double *y,
                      double *lse, double *dq, double *dk, double *dv) {
  double scale = 1 / sqrt((double)D);
  memset(dq, 0, sizeof(double) * S * H * D);
  memset(dk, 0, sizeof(double) * S * KV * D);
  memset(dv, 0, sizeof(double) * S * KV * D);
  for (int i = 0; i < S; i++)
    for (int h = 0; h < H; h++) {
      int kh = h / (H / KV);
      double s[S], most = -INFINITY, sum = 0;
      for (int j = 0; j <= i; j++) {
        s[j] = 0;
        for (int e = 0; e < D; e++)
          s[j] += (double)q[(i * H + h) * D + e] * k[(j * KV + kh) * D + e];
        s[j] *= scale;
        most = fmax(most, s[j]);
      }
      for (int j = 0; j <= i; j++)
        sum += exp(s[j] - most);
      lse[i * H + h] = most + log(sum);
      double *yi = y + (i * H + h) * D, delta = 0;
      for (int e = 0; e < D; e++) {
        yi[e] = 0;
        for (int j = 0; j <= i; j++)
          yi[e] += exp(s[j] - lse[i * H + h]) * v[(j * KV + kh) * D + e];
        delta += dy ? dy[(i * H + h) * D + e] * yi[e] : 0;
      }
      for (int j = 0; dy && j <= i; j++) {
        double p = exp(s[j] - lse[i * H + h]), dp = 0;
        for (int e = 0; e < D; e++)
          dp += dy[(i * H + h) * D + e] * v[(j * KV + kh) * D + e];
        double ds = p * (dp - delta) * scale;
        for (int e = 0; e < D; e++) {
          dq[(i * H + h) * D + e] += ds * k[(j * KV + kh) * D + e];
          dk[(j * KV + kh) * D + e] += ds * q[(i * H + h) * D + e];
          dv[(j * KV + kh) * D + e] += p * dy[(i * H + h) * D + e];
        }
      }
    }
}

/* sum(dy * y) of the reference: the loss whose gradients reference() gives. */
static double loss(const float *q, const float *k, const float *v, const float *dy) {
  static double y[S * H * D], lse[S * H], dq[S * H * D], dk[S * KV * D], dv[S * KV * D];
  reference(q, k, v, NULL, y, lse, dq, dk, dv);
  double l = 0;
  for (int x = 0; x < S * H * D; x++)
    l += dy[x] * y[x];
  return l;
}

static void test_reference_gradients(void **state) {
  (void)state;
  static float q[S * H * D], k[S * KV * D], v[S * KV * D], dy[S * H * D];
  static double y[S * H * D], lse[S * H], dq[S * H * D], dk[S * KV * D], dv[S * KV * D];
  uint32_t rng = 7;
  for (int x = 0; x < S * H * D; x++)
    q[x] = frand(&rng), dy[x] = frand(&rng);
  for (int x = 0; x < S * KV * D; x++)
    k[x] = frand(&rng), v[x] = frand(&rng);
  reference(q, k, v, dy, y, lse, dq, dk, dv);
  /* central differences in float inputs: step 1e-2, error O(h^2) ~ 1e-4 of these O(1) sums */
  const struct {
    float *x;
    double *g;
    int at;
  } probes[] = {{q, dq, 5 * H * D + 3}, {k, dk, 2 * KV * D + 9}, {v, dv, 7 * KV * D + 1}};
  for (size_t i = 0; i < G_N_ELEMENTS(probes); i++) {
    float keep = probes[i].x[probes[i].at], eps = 1e-2f;
    probes[i].x[probes[i].at] = keep + eps;
    double up = loss(q, k, v, dy);
    probes[i].x[probes[i].at] = keep - eps;
    double down = loss(q, k, v, dy);
    probes[i].x[probes[i].at] = keep;
    test_assert_near(probes[i].g[probes[i].at], (up - down) / (2 * (double)eps), 1e-4, 1e-3,
                     "reference gradient against finite differences");
  }
}

/* Every rank of CP cp: its chunks r and 2cp-1-r against every key chunk, merged; backward per
 * block, the keys' gradients summed over ranks (the ring's reduce). */
static void check_ring(int cp) {
  static float q[S * H * D], k[S * KV * D], v[S * KV * D], dy[S * H * D];
  static double y[S * H * D], lse[S * H], dq[S * H * D], dk[S * KV * D], dv[S * KV * D];
  uint32_t rng = 11 + (uint32_t)cp;
  for (int x = 0; x < S * H * D; x++)
    q[x] = frand(&rng), dy[x] = frand(&rng);
  for (int x = 0; x < S * KV * D; x++)
    k[x] = frand(&rng), v[x] = frand(&rng);
  reference(q, k, v, dy, y, lse, dq, dk, dv);
  int L = S / (2 * cp);
  static float ry[S * H * D], rlse[S * H], by[S * H * D], blse[S * H];
  static float rdq[S * H * D], rdk[S * KV * D], rdv[S * KV * D];
  memset(rdq, 0, sizeof rdq);
  memset(rdk, 0, sizeof rdk);
  memset(rdv, 0, sizeof rdv);
  for (int r = 0; r < cp; r++) {
    int chunks[2] = {r, 2 * cp - 1 - r};
    for (int c = 0; c < 2; c++) {
      int q0 = chunks[c] * L;
      float *yc = ry + q0 * H * D, *lc = rlse + q0 * H;
      for (int x = 0; x < L * H; x++)
        lc[x] = -INFINITY;
      memset(yc, 0, sizeof(float) * (size_t)(L * H * D));
      /* the ring brings each rank's two chunks in turn, this rank's own first */
      for (int step = 0; step < cp; step++) {
        int from = (r + step) % cp, held[2] = {from, 2 * cp - 1 - from};
        for (int kc = 0; kc < 2; kc++) {
          struct kernels_attention_block b = {L, L, H, KV, D, q0, held[kc] * L,
                                              1 / sqrtf((float)D)};
          /* alternately through the op's own merge and the merge alone */
          if ((step + kc) % 2) {
            kernels_attention_block_forward(yc, lc, q + q0 * H * D, k + b.k0 * KV * D,
                                            v + b.k0 * KV * D, &b, true);
            continue;
          }
          kernels_attention_block_forward(by, blse, q + q0 * H * D, k + b.k0 * KV * D,
                                          v + b.k0 * KV * D, &b, false);
          kernels_attention_merge(yc, lc, by, blse, L, H, D);
        }
      }
      for (int step = 0; step < cp; step++) { /* backward: dK/dV go back to their owners */
        int from = (r + step) % cp, held[2] = {from, 2 * cp - 1 - from};
        for (int kc = 0; kc < 2; kc++) {
          struct kernels_attention_block b = {L, L, H, KV, D, q0, held[kc] * L,
                                              1 / sqrtf((float)D)};
          kernels_attention_block_backward(rdq + q0 * H * D, rdk + b.k0 * KV * D,
                                           rdv + b.k0 * KV * D, dy + q0 * H * D, yc, lc,
                                           q + q0 * H * D, k + b.k0 * KV * D, v + b.k0 * KV * D,
                                           &b);
        }
      }
    }
  }
  /* float blocks against a double reference: 1e-5 on O(1) values */
  for (int x = 0; x < S * H; x++) { /* a chunk's lse is [H, L], from its first row on */
    int i = x / H, h = x % H, q0 = i / L * L;
    test_assert_near(rlse[q0 * H + h * L + i - q0], lse[x], 1e-5, 1e-5, "ring log-sum-exp");
  }
  for (int x = 0; x < S * H * D; x++) {
    test_assert_near(ry[x], y[x], 1e-5, 1e-5, "ring output");
    test_assert_near(rdq[x], dq[x], 1e-5, 1e-5, "ring dq");
  }
  for (int x = 0; x < S * KV * D; x++) {
    test_assert_near(rdk[x], dk[x], 1e-5, 1e-5, "ring dk");
    test_assert_near(rdv[x], dv[x], 1e-5, 1e-5, "ring dv");
  }
}

static void test_ring_cp2(void **state) {
  (void)state;
  check_ring(2);
}

static void test_ring_cp4(void **state) {
  (void)state;
  check_ring(4);
}

/* A block entirely above the diagonal (keys after every query) leaves the running result as
 * it was. */
static void test_masked_block(void **state) {
  (void)state;
  float q[2 * H * D] = {0}, k[2 * KV * D] = {0}, v[2 * KV * D], y[2 * H * D], lse[2 * H];
  float by[2 * H * D], blse[2 * H];
  for (int x = 0; x < 2 * KV * D; x++)
    v[x] = 1;
  for (int x = 0; x < 2 * H * D; x++)
    y[x] = 0.25f;
  for (int x = 0; x < 2 * H; x++)
    lse[x] = 1.5f;
  struct kernels_attention_block b = {2, 2, H, KV, D, 0, 2, 1};
  kernels_attention_block_forward(by, blse, q, k, v, &b, false);
  kernels_attention_merge(y, lse, by, blse, 2, H, D);
  for (int x = 0; x < 2 * H; x++)
    assert_true(blse[x] == -INFINITY && lse[x] == 1.5f);
  for (int x = 0; x < 2 * H * D; x++)
    assert_true(y[x] == 0.25f);
}

/* RoPE at the chunks' global positions: a rank's rows rotated alone are bit-identical to the
 * same rows of the whole sequence rotated (batch 2, CP 2 and 4, forward and inverse). */
static void test_rope_chunks(void **state) {
  (void)state;
  enum { B = 2, HD = H * D };
  static float whole[B * S * HD], mine[B * S * HD];
  uint32_t rng = 3;
  for (int x = 0; x < B * S * HD; x++)
    whole[x] = frand(&rng);
  static float orig[B * S * HD];
  memcpy(orig, whole, sizeof whole);
  kernels_rope(whole, B, S, H, D, 10000.0f, false);
  for (int cp = 2; cp <= 4; cp += 2)
    for (int r = 0; r < cp; r++) {
      int L = S / (2 * cp), chunks[2] = {r, 2 * cp - 1 - r};
      for (int b = 0; b < B; b++)
        for (int c = 0; c < 2; c++)
          memcpy(mine + ((size_t)b * 2 * L + (size_t)c * L) * HD,
                 orig + ((size_t)b * S + (size_t)chunks[c] * L) * HD, sizeof(float) * L * HD);
      kernels_rope_cp(mine, B, S, cp, r, H, D, 10000.0f, NULL, false);
      for (int b = 0; b < B; b++)
        for (int c = 0; c < 2; c++)
          assert_memory_equal(mine + ((size_t)b * 2 * L + (size_t)c * L) * HD,
                              whole + ((size_t)b * S + (size_t)chunks[c] * L) * HD,
                              sizeof(float) * L * HD);
      kernels_rope_cp(mine, B, S, cp, r, H, D, 10000.0f, NULL, true); /* and back */
      for (int b = 0; b < B; b++)
        for (int c = 0; c < 2; c++)
          for (int x = 0; x < L * HD; x++)
            test_assert_near(mine[((size_t)b * 2 * L + (size_t)c * L) * HD + (size_t)x],
                             orig[((size_t)b * S + (size_t)chunks[c] * L) * HD + (size_t)x],
                             1e-6, 1e-6, "inverse RoPE");
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_gradients), cmocka_unit_test(test_ring_cp2),
      cmocka_unit_test(test_ring_cp4), cmocka_unit_test(test_masked_block),
      cmocka_unit_test(test_rope_chunks)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
