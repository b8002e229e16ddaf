/* Tests for kernels/: every backward against central finite differences, BI + BW against the
 * fused backward, hand-computed forwards, causality, routing ties, expert-parallel equivalence,
 * AdamW and cross-entropy against closed forms. */
#include "test-helpers.h"

#include <glib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/kernels.h"
#include "../../kernels/fp8.h"
#include "../../kernels/kernels-impl.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* Finite differences. The kernels run in fp32; the scalar loss is sum(out * R) accumulated in
 * double over ~100 fp32 outputs, so it carries ~1e-6 absolute rounding noise, which a central
 * difference with step 1e-2 turns into up to ~1e-4 of gradient noise; the O(step^2) truncation
 * error of these smooth ops is of the same order for unit-scale inputs (observed worst: under
 * 1e-2 of the tolerance below; KERNELS_TEST_VERBOSE=1 prints it). A wrong gradient (a missing
 * term, a wrong index or sign) is off by O(0.1) or more, far outside atol + rtol * |fd|. */
#define FD_EPS 1e-2f
#define FD_ATOL 1e-3
#define FD_RTOL 5e-3
/* BI with accumulate = true against old + written: one extra fp32 rounding on unit values. */
#define ACC_ATOL 1e-5
#define ACC_RTOL 1e-5

static uint64_t rng_state = 42;

/* Uniform in [-1, 1), deterministic (a 64-bit LCG, top 24 bits). */
static float frand(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((double)(rng_state >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

static void fill(float *a, size_t n, float scale) {
  for (size_t i = 0; i < n; i++)
    a[i] = scale * frand();
}

static float *fz(size_t n) {
  float *p = calloc(n ? n : 1, sizeof(float));
  assert_non_null(p);
  return p;
}

static int32_t *iz(size_t n) {
  int32_t *p = calloc(n ? n : 1, sizeof(int32_t));
  assert_non_null(p);
  return p;
}

static float *fdup(const float *a, size_t n) {
  float *p = fz(n);
  memcpy(p, a, n * sizeof(float));
  return p;
}

static double dotd(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += (double)a[i] * b[i];
  return s;
}

/* |got - ref| <= atol + rtol * |ref| elementwise; reports the first failure. */
static void assert_close(const char *what, const float *got, const double *ref, size_t n,
                         double atol, double rtol) {
  for (size_t i = 0; i < n; i++) {
    if (!test_near(got[i], ref[i], atol, rtol)) {
      print_error("%s[%zu]: got %.9g, want %.9g (atol %g, rtol %g)\n", what, i, (double)got[i],
                  ref[i], atol, rtol);
      fail();
    }
  }
}

static void assert_close_f(const char *what, const float *got, const float *ref, size_t n,
                           double atol, double rtol) {
  double *r = malloc(n * sizeof(double));
  assert_non_null(r);
  for (size_t i = 0; i < n; i++)
    r[i] = ref[i];
  assert_close(what, got, r, n, atol, rtol);
  free(r);
}

static void assert_same(const char *what, const float *a, const float *b, size_t n) {
  if (memcmp(a, b, n * sizeof(float)) != 0) {
    for (size_t i = 0; i < n; i++)
      if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
        print_error("%s[%zu]: %.9g != %.9g (bit-exact expected)\n", what, i, (double)a[i],
                    (double)b[i]);
        break;
      }
    fail();
  }
}

typedef double (*loss_fn)(void *ctx);

/* Checks analytic[i] = dL/dx[i] by central differences on x (restored afterwards). Also
 * requires some gradient of size > 1e-2, so a check of all-zero gradients cannot pass. */
static void fd_check(const char *what, float *x, size_t n, const float *analytic, loss_fn loss,
                     void *ctx) {
  double *fd = malloc(n * sizeof(double));
  assert_non_null(fd);
  double biggest = 0.0;
  for (size_t i = 0; i < n; i++) {
    float keep = x[i];
    float up = keep + FD_EPS, down = keep - FD_EPS;
    x[i] = up;
    double lp = loss(ctx);
    x[i] = down;
    double lm = loss(ctx);
    x[i] = keep;
    fd[i] = (lp - lm) / ((double)up - (double)down);
    if (fabs(fd[i]) > biggest)
      biggest = fabs(fd[i]);
  }
  if (!(biggest > 1e-2)) {
    print_error("%s: finite-difference gradient is ~0 everywhere (max %g)\n", what, biggest);
    fail();
  }
  if (getenv("KERNELS_TEST_VERBOSE")) { /* how close to the tolerance each check runs */
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
      double ratio = fabs(analytic[i] - fd[i]) / (FD_ATOL + FD_RTOL * fabs(fd[i]));
      worst = ratio > worst ? ratio : worst;
    }
    print_message("%-24s max |fd| %8.4f, worst error / tolerance %.3f\n", what, biggest, worst);
  }
  assert_close(what, analytic, fd, n, FD_ATOL, FD_RTOL);
  free(fd);
}

/* BI with accumulate = true on a buffer holding old must give old + (BI written). */
static void check_accumulated(const char *what, const float *acc, const float *old,
                              const float *written, size_t n) {
  double *r = malloc(n * sizeof(double));
  assert_non_null(r);
  for (size_t i = 0; i < n; i++)
    r[i] = (double)old[i] + written[i];
  assert_close(what, acc, r, n, ACC_ATOL, ACC_RTOL);
  free(r);
}

/* ---- GEMM -------------------------------------------------------------------------------- */

static void test_gemm_all_transposes(void **state) {
  (void)state;
  enum { M = 5, N = 7, K = 6, PAD = 3 };
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      for (int bz = 0; bz < 2; bz++) {
        int lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + PAD;
        float *a = fz((size_t)(ta ? K : M) * lda), *b = fz((size_t)(tb ? N : K) * ldb);
        float *c = fz((size_t)M * ldc);
        fill(a, (size_t)(ta ? K : M) * lda, 1.0f);
        fill(b, (size_t)(tb ? N : K) * ldb, 1.0f);
        fill(c, (size_t)M * ldc, 1.0f);
        float beta = bz ? 0.0f : 2.0f;
        if (bz)
          for (int i = 0; i < M; i++)
            c[(size_t)i * ldc] = NAN; /* beta == 0 must ignore C's old contents */
        float *c0 = fdup(c, (size_t)M * ldc);
        kernels_gemm(ta, tb, M, N, K, 0.5f, a, lda, b, ldb, beta, c, ldc);
        for (int i = 0; i < M; i++) {
          double want[N];
          for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int p = 0; p < K; p++)
              s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                   (tb ? b[j * ldb + p] : b[p * ldb + j]);
            want[j] = 0.5 * s + (bz ? 0.0 : (double)beta * c0[i * ldc + j]);
          }
          /* fp32 dot products of length 6 over unit values: ~1e-6 rounding. */
          assert_close("gemm", c + (size_t)i * ldc, want, N, 1e-5, 1e-5);
          for (int j = N; j < ldc; j++) /* padding columns untouched */
            assert_memory_equal(&c[i * ldc + j], &c0[i * ldc + j], sizeof(float));
        }
        free(a), free(b), free(c), free(c0);
      }
    }
  }
}

/* ---- EMBEDDING --------------------------------------------------------------------------- */

struct emb_ctx {
  int T, V, C;
  int32_t *tokens;
  float *params, *x, *R;
};

static double emb_loss(void *p) {
  struct emb_ctx *c = p;
  kernels_embedding_forward(c->x, c->tokens, c->params, c->T, c->V, c->C);
  return dotd(c->x, c->R, (size_t)c->T * c->C);
}

static void test_embedding(void **state) {
  (void)state;
  struct emb_ctx c = {.T = 5, .V = 4, .C = 3};
  int32_t tokens[5] = {2, 0, 2, 3, 2};
  c.tokens = tokens;
  size_t np = kernels_embedding_param_count(c.V, c.C), nx = (size_t)c.T * c.C;
  assert_int_equal(np, 12);
  c.params = fz(np), c.x = fz(nx), c.R = fz(nx);
  fill(c.params, np, 1.0f), fill(c.R, nx, 1.0f);
  emb_loss(&c);
  for (int t = 0; t < c.T; t++)
    assert_memory_equal(c.x + t * c.C, c.params + tokens[t] * c.C, c.C * sizeof(float));
  float *dw = fz(np), *dw2 = fz(np);
  kernels_embedding_backward_weight(dw, c.R, tokens, c.T, c.V, c.C);
  /* Row 1 is never used: its gradient stays exactly 0; row 2 sums rows 0, 2, 4 in order. */
  for (int j = 0; j < c.C; j++) {
    assert_true(dw[1 * c.C + j] == 0.0f);
    assert_true(dw[2 * c.C + j] ==
                ((0.0f + c.R[0 * c.C + j]) + c.R[2 * c.C + j]) + c.R[4 * c.C + j]);
  }
  fd_check("embedding dwte", c.params, np, dw, emb_loss, &c);
  kernels_embedding_backward(dw2, c.R, tokens, c.T, c.V, c.C);
  assert_same("embedding fused", dw, dw2, np);
  free(c.params), free(c.x), free(c.R), free(dw), free(dw2);
}

/* ---- RMSNORM ----------------------------------------------------------------------------- */

static void test_rmsnorm_known(void **state) {
  (void)state;
  /* x = (2, 2, 2, 2), eps = 0: mean(x^2) = 4, rstd = 0.5 exactly, so h = w exactly. */
  float x[4] = {2, 2, 2, 2}, w[4] = {1, -2, 3, 0.5f}, h[4], rstd;
  kernels_rmsnorm_forward(h, &rstd, x, w, 1, 4, 0.0f);
  assert_true(rstd == 0.5f);
  assert_memory_equal(h, w, sizeof h);
  /* x = (1, 2, 3, 4), default eps: rstd = 1 / sqrt(7.5 + 1e-6). */
  float x2[4] = {1, 2, 3, 4};
  kernels_rmsnorm_forward(h, &rstd, x2, w, 1, 4, KERNELS_RMSNORM_EPS);
  double r = 1.0 / sqrt(7.5 + 1e-6), want[4];
  for (int i = 0; i < 4; i++)
    want[i] = x2[i] * r * w[i];
  assert_close("rmsnorm known", h, want, 4, 0.0, 1e-6); /* a few fp32 roundings */
}

/* The fused residual add + RMSNorm: the same bits as the add and then the norm, for a width
 * that is no multiple of the vector lanes. */
static void test_residual_rmsnorm_equals_unfused(void **state) {
  (void)state;
  enum { T = 5, C = 37 };
  float x1[T * C], x2[T * C], y[T * C], w[C], h1[T * C], h2[T * C], r1[T], r2[T];
  uint64_t rng_saved = rng_state; /* the later tests' inputs stay what they were */
  fill(x1, T * C, 2.0f);
  memcpy(x2, x1, sizeof x1);
  fill(y, T * C, 1.0f);
  fill(w, C, 1.0f);
  kernels_residual_add_forward(x1, y, T * C);
  kernels_rmsnorm_forward(h1, r1, x1, w, T, C, KERNELS_RMSNORM_EPS);
  kernels_residual_rmsnorm_forward(x2, h2, r2, y, w, T, C, KERNELS_RMSNORM_EPS);
  assert_memory_equal(x1, x2, sizeof x1);
  assert_memory_equal(h1, h2, sizeof h1);
  assert_memory_equal(r1, r2, sizeof r1);
  rng_state = rng_saved;
}

struct rms_ctx {
  int T, C;
  float *x, *params, *h, *saved, *R;
};

static double rms_loss(void *p) {
  struct rms_ctx *c = p;
  kernels_rmsnorm_forward(c->h, c->saved, c->x, c->params, c->T, c->C, KERNELS_RMSNORM_EPS);
  return dotd(c->h, c->R, (size_t)c->T * c->C);
}

static void test_rmsnorm_grad(void **state) {
  (void)state;
  struct rms_ctx c = {.T = 4, .C = 6};
  size_t n = (size_t)c.T * c.C, np = kernels_rmsnorm_param_count(c.C);
  c.x = fz(n), c.params = fz(np), c.h = fz(n), c.R = fz(n);
  c.saved = fz(kernels_rmsnorm_saved_floats(c.T));
  fill(c.x, n, 1.0f), fill(c.params, np, 1.0f), fill(c.R, n, 1.0f);
  rms_loss(&c);
  float *dx = fz(n), *dw = fz(np), *dx2 = fz(n), *dw2 = fz(np), *dx3 = fz(n);
  kernels_rmsnorm_backward_input(dx, c.R, c.x, c.saved, c.params, c.T, c.C, false);
  kernels_rmsnorm_backward_weight(dw, c.R, c.x, c.saved, c.T, c.C);
  kernels_rmsnorm_backward(dx2, dw2, c.R, c.x, c.saved, c.params, c.T, c.C, false);
  assert_same("rmsnorm fused dx", dx, dx2, n);
  assert_same("rmsnorm fused dw", dw, dw2, np);
  fill(dx3, n, 1.0f);
  float *old = fdup(dx3, n);
  kernels_rmsnorm_backward_input(dx3, c.R, c.x, c.saved, c.params, c.T, c.C, true);
  check_accumulated("rmsnorm accumulate", dx3, old, dx, n);
  fd_check("rmsnorm dx", c.x, n, dx, rms_loss, &c);
  fd_check("rmsnorm dw", c.params, np, dw, rms_loss, &c);
  free(c.x), free(c.params), free(c.h), free(c.R), free(c.saved);
  free(dx), free(dw), free(dx2), free(dw2), free(dx3), free(old);
}

/* ---- RoPE -------------------------------------------------------------------------------- */

static void test_rope_known(void **state) {
  (void)state;
  /* D = 4: pairs (0, 2) at frequency 1 and (1, 3) at 10000^(-1/2) = 0.01. Position 0 is the
   * identity; at position 1, e0 -> (cos 1, 0, sin 1, 0) and e1 -> (0, cos .01, 0, sin .01). */
  float x[2 * 2 * 4] = {1, 0, 0, 0, 0, 1, 0, 0,  /* s = 0, heads 0 and 1 */
                        1, 0, 0, 0, 0, 1, 0, 0}; /* s = 1 */
  float x0[16];
  memcpy(x0, x, sizeof x);
  kernels_rope(x, 1, 2, 2, 4, KERNELS_ROPE_THETA, false);
  assert_memory_equal(x, x0, 8 * sizeof(float));
  double want[8] = {cos(1.0), 0, sin(1.0), 0, 0, cos(0.01), 0, sin(0.01)};
  assert_close("rope pos 1", x + 8, want, 8, 1e-7, 1e-6); /* cos/sin rounded to fp32 */
  kernels_rope(x, 1, 2, 2, 4, KERNELS_ROPE_THETA, true);
  assert_close_f("rope inverse", x, x0, 16, 1e-7, 0.0); /* two fp32 rotations */
}

/* Llama 3 scaling (Hugging Face _compute_llama3_parameters with factor 8, low 1, high 4, old
 * context 8192): wavelengths under 8192/4 keep their frequency, those over 8192 are slowed 8x,
 * and the band between is interpolated. D = 8 with theta = 10000 gives wavelengths 2 pi
 * (6.28), 2 pi 10 (62.8), 2 pi 100 (628) and 2 pi 1000 (6283): with old context 512 instead,
 * the first two stay, the last is divided by 8 and the third is in the band. */
static void test_rope_llama3_scaling(void **state) {
  (void)state;
  enum { D = 8, S = 3 };
  struct kernels_rope_scaling sc = {.factor = 8.0f,
                                    .low_freq_factor = 1.0f,
                                    .high_freq_factor = 4.0f,
                                    .original_max_position_embeddings = 512};
  float x[S * D], y[S * D];
  for (int s = 0; s < S; s++)
    for (int i = 0; i < D; i++)
      x[s * D + i] = i < D / 2 ? 1.0f : 0.0f; /* every pair at angle 0 */
  memcpy(y, x, sizeof x);
  kernels_rope_scaled(x, 1, S, 1, D, KERNELS_ROPE_THETA, &sc, false);
  kernels_rope(y, 1, S, 1, D, KERNELS_ROPE_THETA, false);
  for (int i = 0; i < D / 2; i++) {
    double inv = pow(10000.0, -2.0 * i / D), wavelen = 2 * M_PI / inv, want = inv;
    if (wavelen > 512.0)
      want = inv / 8;
    else if (wavelen >= 128.0) {
      double smooth = (512.0 / wavelen - 1.0) / 3.0;
      want = (1 - smooth) * inv / 8 + smooth * inv;
    }
    double got = atan2(x[2 * D + i + D / 2], x[2 * D + i]) / 2; /* position 2 */
    assert_true(fabs(got - want) <= 1e-6);
    if (i < 2) /* high frequencies: the same bits as unscaled */
      assert_true(x[2 * D + i] == y[2 * D + i] && x[2 * D + i + D / 2] == y[2 * D + i + D / 2]);
  }
  assert_true(kernels_rope_scaling_supported("llama3"));
  assert_true(kernels_rope_scaling_supported(NULL));
  assert_false(kernels_rope_scaling_supported("yarn"));
}

/* ---- ATTENTION --------------------------------------------------------------------------- */

struct attn_ctx {
  struct kernels_attention_dims d;
  float *h, *params, *a, *saved, *R;
};

static size_t attn_tc(const struct kernels_attention_dims *d) {
  return (size_t)d->batch * d->seq * d->hidden;
}

static double attn_loss(void *p) {
  struct attn_ctx *c = p;
  kernels_attention_forward(c->a, c->saved, c->h, c->params, &c->d);
  return dotd(c->a, c->R, attn_tc(&c->d));
}

static void attn_alloc(struct attn_ctx *c) {
  size_t n = attn_tc(&c->d), np = kernels_attention_param_count(&c->d);
  c->h = fz(n), c->a = fz(n), c->R = fz(n), c->params = fz(np);
  c->saved = fz(kernels_attention_saved_floats(&c->d));
  fill(c->h, n, 1.0f), fill(c->R, n, 1.0f);
  fill(c->params, np, 0.5f); /* keeps the softmax away from one-hot, so every path matters */
}

static void attn_free(struct attn_ctx *c) {
  free(c->h), free(c->a), free(c->R), free(c->params), free(c->saved);
}

static void test_attention_grad(void **state) {
  (void)state;
  struct attn_ctx c = {.d = {.batch = 2,
                             .seq = 5,
                             .heads = 4,
                             .kv_heads = 2,
                             .head_dim = 4,
                             .hidden = 8,
                             .rope_theta = KERNELS_ROPE_THETA}};
  assert_int_equal(kernels_attention_param_count(&c.d), 8 * 4 * (2 * 4 + 2 * 2));
  attn_alloc(&c);
  size_t n = attn_tc(&c.d), np = kernels_attention_param_count(&c.d);
  size_t nb = kernels_attention_bwork_floats(&c.d), ns = kernels_attention_saved_floats(&c.d);
  attn_loss(&c);
  float *a1 = fdup(c.a, n), *s1 = fdup(c.saved, ns);
  attn_loss(&c);
  assert_same("attention deterministic a", c.a, a1, n);
  assert_same("attention deterministic saved", c.saved, s1, ns);
  float *dh = fz(n), *dw = fz(np), *bw = fz(nb), *dh2 = fz(n), *dw2 = fz(np), *bw2 = fz(nb);
  kernels_attention_backward_input(dh, bw, c.R, c.saved, c.params, &c.d, false);
  kernels_attention_backward_weight(dw, bw, c.R, c.h, c.saved, &c.d);
  kernels_attention_backward(dh2, dw2, bw2, c.R, c.h, c.saved, c.params, &c.d, false);
  assert_same("attention fused dh", dh, dh2, n);
  assert_same("attention fused dw", dw, dw2, np);
  float *dh3 = fz(n);
  fill(dh3, n, 1.0f);
  float *old = fdup(dh3, n);
  kernels_attention_backward_input(dh3, bw2, c.R, c.saved, c.params, &c.d, true);
  check_accumulated("attention accumulate", dh3, old, dh, n);
  fd_check("attention dh", c.h, n, dh, attn_loss, &c);
  fd_check("attention dw", c.params, np, dw, attn_loss, &c);
  attn_free(&c);
  free(a1), free(s1), free(dh), free(dw), free(bw), free(dh2), free(dw2), free(bw2);
  free(dh3), free(old);
}

static void test_attention_causal(void **state) {
  (void)state;
  struct attn_ctx c = {.d = {.batch = 2,
                             .seq = 6,
                             .heads = 2,
                             .kv_heads = 1,
                             .head_dim = 4,
                             .hidden = 8,
                             .rope_theta = KERNELS_ROPE_THETA}};
  attn_alloc(&c);
  size_t n = attn_tc(&c.d);
  int C = c.d.hidden, S = c.d.seq;
  attn_loss(&c);
  float *a0 = fdup(c.a, n);
  for (int j = 0; j < C; j++) /* change token 3 of sequence 0 */
    c.h[3 * C + j] += 1.0f;
  attn_loss(&c);
  assert_memory_equal(c.a, a0, (size_t)3 * C * sizeof(float)); /* earlier tokens: same bits */
  assert_memory_equal(c.a + (size_t)S * C, a0 + (size_t)S * C, (size_t)S * C * sizeof(float));
  assert_memory_not_equal(c.a + 3 * C, a0 + 3 * C, (size_t)C * sizeof(float)); /* it matters */
  free(a0);
  attn_free(&c);
}

/* wq = 0 makes every score 0, so softmax is uniform over the causal prefix: y_i is the mean of
 * v_0..v_i and p_ij = 1 / (i + 1) for j <= i, 0 after. */
static void test_attention_uniform(void **state) {
  (void)state;
  struct attn_ctx c = {.d = {.batch = 1,
                             .seq = 4,
                             .heads = 2,
                             .kv_heads = 2,
                             .head_dim = 2,
                             .hidden = 4,
                             .rope_theta = KERNELS_ROPE_THETA}};
  attn_alloc(&c);
  size_t T = 4, C = 4, HD = 4, KD = 4;
  memset(c.params, 0, C * HD * sizeof(float)); /* wq [C, HD] */
  attn_loss(&c);
  /* saved keeps each score row's log-sum-exp, not the probabilities: equal scores give
   * log(i + 1) (a float sum of ones, one log) */
  const float *v = c.saved + T * HD + T * KD, *lse = v + T * KD, *y = lse + 2 * 4;
  for (int hh = 0; hh < 2; hh++)
    for (int i = 0; i < 4; i++)
      assert_true(fabsf(lse[hh * 4 + i] - logf((float)(i + 1))) <= 1e-6f);
  for (size_t i = 0; i < T; i++) {
    double want[4] = {0, 0, 0, 0};
    for (size_t j = 0; j <= i; j++)
      for (int col = 0; col < 4; col++)
        want[col] += v[j * KD + col] / (double)(i + 1);
    assert_close("attention uniform y", y + i * HD, want, 4, 1e-6, 1e-6); /* fp32 sums */
  }
  attn_free(&c);
}

/* Grouped-query heads: with KV = 2, H = 4, head j reads kv head j / 2. The same model with
 * KV = 4 and kv heads 2g, 2g+1 both copies of kv head g must give the same output. */
static void test_attention_gqa(void **state) {
  (void)state;
  struct attn_ctx g = {.d = {.batch = 1,
                             .seq = 5,
                             .heads = 4,
                             .kv_heads = 2,
                             .head_dim = 4,
                             .hidden = 8,
                             .rope_theta = KERNELS_ROPE_THETA}};
  struct attn_ctx f = g;
  f.d.kv_heads = 4;
  attn_alloc(&g);
  attn_alloc(&f);
  size_t C = 8, D = 4, HD = 16, KDg = 8, KDf = 16, n = attn_tc(&g.d);
  memcpy(f.h, g.h, n * sizeof(float));
  const float *wq = g.params, *wk = wq + C * HD, *wv = wk + C * KDg, *wo = wv + C * KDg;
  float *fq = f.params, *fk = fq + C * HD, *fv = fk + C * KDf, *fo = fv + C * KDf;
  memcpy(fq, wq, C * HD * sizeof(float));
  memcpy(fo, wo, HD * C * sizeof(float));
  for (size_t r = 0; r < C; r++)
    for (size_t hh = 0; hh < 4; hh++)
      for (size_t i = 0; i < D; i++) {
        fk[r * KDf + hh * D + i] = wk[r * KDg + (hh / 2) * D + i];
        fv[r * KDf + hh * D + i] = wv[r * KDg + (hh / 2) * D + i];
      }
  attn_loss(&g);
  attn_loss(&f);
  /* Same arithmetic per element, but BLAS may block the wider k/v GEMMs differently. */
  assert_close_f("attention gqa", g.a, f.a, n, 1e-6, 1e-5);
  attn_free(&g);
  attn_free(&f);
}

/* ---- MLP --------------------------------------------------------------------------------- */

static void test_mlp_known(void **state) {
  (void)state;
  /* C = F = 1: m = wd * silu(h wg) * (h wu) = 0.5 * (2 sigmoid(2)) * 3 = 3 / (1 + e^-2). */
  float h = 1.0f, params[3] = {2.0f, 3.0f, 0.5f}, m, saved[3];
  assert_int_equal(kernels_mlp_param_count(1, 1), 3);
  kernels_mlp_forward(&m, saved, &h, params, 1, 1, 1);
  double want = 3.0 / (1.0 + exp(-2.0));
  assert_close("mlp known", &m, &want, 1, 0.0, 1e-6); /* expf and a few fp32 products */
}

struct mlp_ctx {
  int T, C, F;
  float *h, *params, *m, *saved, *R;
};

static double mlp_loss(void *p) {
  struct mlp_ctx *c = p;
  kernels_mlp_forward(c->m, c->saved, c->h, c->params, c->T, c->C, c->F);
  return dotd(c->m, c->R, (size_t)c->T * c->C);
}

static void test_mlp_grad(void **state) {
  (void)state;
  struct mlp_ctx c = {.T = 5, .C = 6, .F = 10};
  size_t n = (size_t)c.T * c.C, np = kernels_mlp_param_count(c.C, c.F);
  size_t nb = kernels_mlp_bwork_floats(c.T, c.F);
  c.h = fz(n), c.m = fz(n), c.R = fz(n), c.params = fz(np);
  c.saved = fz(kernels_mlp_saved_floats(c.T, c.F));
  fill(c.h, n, 1.0f), fill(c.R, n, 1.0f), fill(c.params, np, 0.7f);
  mlp_loss(&c);
  float *m1 = fdup(c.m, n);
  mlp_loss(&c);
  assert_same("mlp deterministic", c.m, m1, n);
  float *dh = fz(n), *dw = fz(np), *bw = fz(nb), *dh2 = fz(n), *dw2 = fz(np), *bw2 = fz(nb);
  kernels_mlp_backward_input(dh, bw, c.R, c.saved, c.params, c.T, c.C, c.F, false);
  kernels_mlp_backward_weight(dw, bw, c.R, c.h, c.saved, c.T, c.C, c.F);
  kernels_mlp_backward(dh2, dw2, bw2, c.R, c.h, c.saved, c.params, c.T, c.C, c.F, false);
  assert_same("mlp fused dh", dh, dh2, n);
  assert_same("mlp fused dw", dw, dw2, np);
  /* Weight gradients accumulate: a second BW adds the same amount again. */
  kernels_mlp_backward_weight(dw2, bw, c.R, c.h, c.saved, c.T, c.C, c.F);
  check_accumulated("mlp dw accumulates", dw2, dw, dw, np);
  float *dh3 = fz(n);
  fill(dh3, n, 1.0f);
  float *old = fdup(dh3, n);
  kernels_mlp_backward_input(dh3, bw2, c.R, c.saved, c.params, c.T, c.C, c.F, true);
  check_accumulated("mlp accumulate", dh3, old, dh, n);
  fd_check("mlp dh", c.h, n, dh, mlp_loss, &c);
  fd_check("mlp dw", c.params, np, dw, mlp_loss, &c);
  free(c.h), free(c.m), free(c.R), free(c.params), free(c.saved), free(m1);
  free(dh), free(dw), free(bw), free(dh2), free(dw2), free(bw2), free(dh3), free(old);
}

/* ---- ROUTER ------------------------------------------------------------------------------ */

static void test_router_topk_known(void **state) {
  (void)state;
  /* C = 1, h = 1: the logits are w itself. */
  float h = 1.0f, logits[4] = {0.0f, 2.0f, 2.0f, 1.0f}, probs[4], weights[3];
  int32_t ids[3];
  kernels_router_forward(ids, weights, probs, &h, logits, 1, 1, 4, 2);
  /* Experts 1 and 2 tie: most probable first, lower id first on the tie; equal
   * probabilities renormalise to exactly 1/2 (p / (p + p)). */
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 2);
  assert_true(weights[0] == 0.5f && weights[1] == 0.5f);
  double e = exp(1.0), z = 1.0 + 2 * e * e + e, want[4] = {1 / z, e * e / z, e * e / z, e / z};
  assert_close("router probs", probs, want, 4, 0.0, 1e-6); /* expf and fp32 division */
  kernels_router_forward(ids, weights, probs, &h, logits, 1, 1, 4, 3);
  assert_int_equal(ids[0], 1);
  assert_int_equal(ids[1], 2);
  assert_int_equal(ids[2], 3);
  double s = 2 * e * e + e, ww[3] = {e * e / s, e * e / s, e / s};
  assert_close("router weights k=3", weights, ww, 3, 0.0, 1e-6);
  /* All equal: the K lowest ids, in order, on every call. */
  float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  for (int rep = 0; rep < 3; rep++) {
    kernels_router_forward(ids, weights, probs, &h, flat, 1, 1, 4, 3);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 2);
  }
}

struct router_ctx {
  int T, C, E, K;
  float *h, *params, *weights, *saved, *R;
  int32_t *ids, *ids0;
};

static double router_loss(void *p) {
  struct router_ctx *c = p;
  kernels_router_forward(c->ids, c->weights, c->saved, c->h, c->params, c->T, c->C, c->E, c->K);
  /* The choice is piecewise constant: a step that flips it makes the difference meaningless. */
  assert_memory_equal(c->ids, c->ids0, (size_t)c->T * c->K * sizeof(int32_t));
  return dotd(c->weights, c->R, (size_t)c->T * c->K);
}

static void test_router_grad(void **state) {
  (void)state;
  struct router_ctx c = {.T = 5, .C = 4, .E = 6, .K = 3};
  size_t n = (size_t)c.T * c.C, np = kernels_router_param_count(c.C, c.E);
  size_t nk = (size_t)c.T * c.K, nb = kernels_router_bwork_floats(c.T, c.E);
  c.h = fz(n), c.params = fz(np), c.weights = fz(nk), c.R = fz(nk);
  c.saved = fz(kernels_router_saved_floats(c.T, c.E));
  c.ids = iz(nk), c.ids0 = iz(nk);
  fill(c.h, n, 1.0f), fill(c.params, np, 1.0f), fill(c.R, nk, 1.0f);
  kernels_router_forward(c.ids0, c.weights, c.saved, c.h, c.params, c.T, c.C, c.E, c.K);
  router_loss(&c);
  float *dh = fz(n), *dw = fz(np), *bw = fz(nb), *dh2 = fz(n), *dw2 = fz(np), *bw2 = fz(nb);
  kernels_router_backward_input(dh, bw, c.R, c.ids, c.weights, c.saved, c.params, c.T, c.C, c.E,
                                c.K, false);
  kernels_router_backward_weight(dw, bw, c.h, c.T, c.C, c.E);
  kernels_router_backward(dh2, dw2, bw2, c.R, c.ids, c.weights, c.saved, c.h, c.params, c.T, c.C,
                          c.E, c.K, false);
  assert_same("router fused dh", dh, dh2, n);
  assert_same("router fused dw", dw, dw2, np);
  float *dh3 = fz(n);
  fill(dh3, n, 1.0f);
  float *old = fdup(dh3, n);
  kernels_router_backward_input(dh3, bw2, c.R, c.ids, c.weights, c.saved, c.params, c.T, c.C, c.E,
                                c.K, true);
  check_accumulated("router accumulate", dh3, old, dh, n);
  fd_check("router dh", c.h, n, dh, router_loss, &c);
  fd_check("router dw", c.params, np, dw, router_loss, &c);
  free(c.h), free(c.params), free(c.weights), free(c.R), free(c.saved), free(c.ids);
  free(c.ids0), free(dh), free(dw), free(bw), free(dh2), free(dw2), free(bw2), free(dh3);
  free(old);
}

/* ---- DISPATCH / COMBINE ------------------------------------------------------------------ */

static void test_dispatch_plan_order(void **state) {
  (void)state;
  /* E = 4 over 2 ranks: rank 0 owns experts 0-1, rank 1 owns 2-3. Rows go by rank, then
   * token, then slot. */
  int32_t ids[6] = {3, 0, 1, 2, 2, 3}, counts[2], route_row[6];
  assert_int_equal(kernels_moe_owner(1, 4, 2), 0);
  assert_int_equal(kernels_moe_owner(2, 4, 2), 1);
  kernels_moe_dispatch_plan(counts, route_row, ids, 3, 2, 4, 2);
  assert_int_equal(counts[0], 2);
  assert_int_equal(counts[1], 4);
  int32_t want[6] = {2, 0, 1, 3, 4, 5};
  assert_memory_equal(route_row, want, sizeof want);
  /* One rank: the identity order. */
  kernels_moe_dispatch_plan(counts, route_row, ids, 3, 2, 4, 1);
  assert_int_equal(counts[0], 6);
  for (int i = 0; i < 6; i++)
    assert_int_equal(route_row[i], i);
}

static void test_dispatch_combine_roundtrip(void **state) {
  (void)state;
  enum { T = 7, K = 4, C = 5, E = 8, N = 4 };
  int32_t ids[T * K], counts[N], route_row[T * K], send_expert[T * K];
  for (int t = 0; t < T; t++) /* distinct experts per token, spread over ranks */
    for (int k = 0; k < K; k++)
      ids[t * K + k] = (t * 3 + k * 5) % E;
  float h[T * C], send[T * K * C], m[T * C], weights[T * K], send_weight[T * K], dw[T * K];
  fill(h, T * C, 1.0f);
  for (int i = 0; i < T * K; i++) /* 1/K (exact in binary) */
    weights[i] = 1.0f / K;
  kernels_moe_dispatch_plan(counts, route_row, ids, T, K, E, N);
  int total = 0;
  for (int r = 0; r < N; r++)
    total += counts[r];
  assert_int_equal(total, T * K);
  kernels_moe_dispatch_forward(send, send_expert, send_weight, h, ids, weights, route_row, T, K, C);
  int row = 0;
  for (int r = 0; r < N; r++) /* each rank's rows carry only its own experts */
    for (int i = 0; i < counts[r]; i++, row++)
      assert_int_equal(kernels_moe_owner(send_expert[row], E, N), r);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      assert_int_equal(send_expert[route_row[t * K + k]], ids[t * K + k]);
      assert_true(send_weight[route_row[t * K + k]] == weights[t * K + k]);
      assert_memory_equal(send + (size_t)route_row[t * K + k] * C, h + t * C, sizeof(float) * C);
    }
  /* The dispatch backward sums the K copies: K * h, exact for K a power of two; each route's
   * weight gradient is its row's (the experts' BI wrote them in row order). */
  float y[T * K * C];
  memcpy(y, send, sizeof y);
  kernels_moe_dispatch_backward(m, dw, send, send_weight, route_row, T, K, C, false);
  for (int i = 0; i < T * C; i++)
    assert_true(m[i] == K * h[i]);
  assert_memory_equal(dw, weights, sizeof dw);
  float *old = fdup(m, T * C);
  kernels_moe_dispatch_backward(m, NULL, send, NULL, route_row, T, K, C, true);
  check_accumulated("dispatch backward accumulate", m, old, old, T * C);
  /* Identity experts that apply their weights 1/K: the combine's sum restores h bit for bit. */
  for (int i = 0; i < T * K * C; i++)
    y[i] *= send_weight[i / C];
  kernels_moe_combine_forward(m, y, route_row, T, K, C);
  assert_memory_equal(m, h, sizeof h);
  free(old);
}

struct dc_ctx {
  int T, K, C, E, N;
  int32_t *ids, *route_row, *send_expert;
  float *h, *send, *send_weight, *y, *weights, *m, *Rs, *Rw, *Rm;
};

/* L = sum(dispatch(h) * Rs) + sum(dispatched weights * Rw) + sum(combine(y) * Rm). */
static double dc_loss(void *p) {
  struct dc_ctx *c = p;
  size_t nk = (size_t)c->T * c->K;
  kernels_moe_dispatch_forward(c->send, c->send_expert, c->send_weight, c->h, c->ids, c->weights,
                               c->route_row, c->T, c->K, c->C);
  kernels_moe_combine_forward(c->m, c->y, c->route_row, c->T, c->K, c->C);
  return dotd(c->send, c->Rs, nk * c->C) + dotd(c->send_weight, c->Rw, nk) +
         dotd(c->m, c->Rm, (size_t)c->T * c->C);
}

static void test_dispatch_combine_grad(void **state) {
  (void)state;
  struct dc_ctx c = {.T = 5, .K = 2, .C = 3, .E = 4, .N = 2};
  size_t nk = (size_t)c.T * c.K, n = (size_t)c.T * c.C, nr = nk * c.C;
  int32_t counts[2];
  c.ids = iz(nk), c.route_row = iz(nk), c.send_expert = iz(nk);
  for (size_t i = 0; i < nk; i++)
    c.ids[i] = (int32_t)((i * 3 + i / 2) % 4);
  kernels_moe_dispatch_plan(counts, c.route_row, c.ids, c.T, c.K, c.E, c.N);
  c.h = fz(n), c.send = fz(nr), c.send_weight = fz(nk), c.y = fz(nr), c.weights = fz(nk);
  c.m = fz(n), c.Rs = fz(nr), c.Rw = fz(nk), c.Rm = fz(n);
  fill(c.h, n, 1.0f), fill(c.y, nr, 1.0f), fill(c.weights, nk, 1.0f);
  fill(c.Rs, nr, 1.0f), fill(c.Rw, nk, 1.0f), fill(c.Rm, n, 1.0f);
  float *dh = fz(n), *dy = fz(nr), *dwt = fz(nk);
  kernels_moe_dispatch_backward(dh, dwt, c.Rs, c.Rw, c.route_row, c.T, c.K, c.C, false);
  kernels_moe_combine_backward(dy, c.Rm, c.route_row, c.T, c.K, c.C);
  fd_check("dispatch dh", c.h, n, dh, dc_loss, &c);
  fd_check("dispatch dweights", c.weights, nk, dwt, dc_loss, &c);
  fd_check("combine dy", c.y, nr, dy, dc_loss, &c);
  free(c.ids), free(c.route_row), free(c.send_expert), free(c.h), free(c.send), free(c.y);
  free(c.send_weight), free(c.Rw);
  free(c.weights), free(c.m), free(c.Rs), free(c.Rm), free(dh), free(dy), free(dwt);
}

/* ---- EXPERT_FFN -------------------------------------------------------------------------- */

struct exp_ctx {
  int n, C, F, e_first, e_count;
  int32_t *row_expert;
  float *in, *row_weight, *params, *out, *saved, *scratch, *R;
};

static double exp_loss(void *p) {
  struct exp_ctx *c = p;
  kernels_expert_ffn_forward(c->out, c->saved, NULL, NULL, c->scratch, c->in, c->row_expert,
                             c->row_weight, c->n, c->params, c->e_first, c->e_count, c->C, c->F);
  return dotd(c->out, c->R, (size_t)c->n * c->C);
}

/* Selective recomputation of the routed experts' activation (moe_act): the forward with act in
 * a buffer of its own writes the same outputs and the same xs, g, u, ws; kernels_expert_ffn_act_forward
 * rebuilds act from them bit for bit (every row at once, where the forward went expert by
 * expert); and the weight gradient read from that buffer is the one read from saved. The same
 * for the inputs xs in a buffer of their own (where the executor keeps them in FP8 instead).
 * Rows of three experts in arbitrary order, F = 37 so no expert's run of act is a multiple of
 * a vector. */
static void test_expert_ffn_act_rerun(void **state) {
  (void)state;
  int32_t row_expert[9] = {2, 0, 2, 1, 0, 2, 2, 1, 0};
  const int n = 9, C = 8, F = 37, E = 3;
  size_t np = kernels_expert_ffn_param_count(E, C, F),
         ns = kernels_expert_ffn_saved_floats(n, C, F);
  size_t na = (size_t)n * F, nb = kernels_expert_ffn_bwork_floats(n, C, F);
  size_t gu = (size_t)n * 2 * F, nx = (size_t)n * C; /* g, u; xs */
  float *params = fz(np), *in = fz((size_t)n * C), *dout = fz((size_t)n * C), *rw = fz(n);
  fill(params, np, 0.9f), fill(in, (size_t)n * C, 2.0f), fill(dout, (size_t)n * C, 1.0f);
  fill(rw, n, 1.0f);
  float *out = fz((size_t)n * C), *saved = fz(ns),
        *scratch = fz(kernels_expert_ffn_scratch_floats(n, C));
  kernels_expert_ffn_forward(out, saved, NULL, NULL, scratch, in, row_expert, rw, n, params, 0, E,
                             C, F);
  float *out2 = fz((size_t)n * C), *saved2 = fz(ns), *act = fz(na), *act2 = fz(na);
  kernels_expert_ffn_forward(out2, saved2, act, NULL, scratch, in, row_expert, rw, n, params, 0, E,
                             C, F);
  assert_same("outputs, act apart", out, out2, (size_t)n * C);
  assert_same("g, u, act apart", saved, saved2, gu);
  assert_same("the rows' weights, act apart", saved + gu + na, saved2 + gu, (size_t)n);
  assert_same("xs, act apart", saved + gu + na + n, saved2 + gu + n, nx);
  assert_same("act apart", saved + gu, act, na);
  float *out3 = fz(nx), *saved3 = fz(ns), *xs = fz(nx), *dw3 = fz(np);
  kernels_expert_ffn_forward(out3, saved3, NULL, xs, scratch, in, row_expert, rw, n, params, 0, E,
                             C, F);
  assert_same("outputs, xs apart", out, out3, nx);
  assert_same("g, u, act, weights, xs apart", saved, saved3, gu + na + n);
  assert_same("xs apart", saved + gu + na + n, xs, nx);
  kernels_expert_ffn_act_forward(act2, saved2, n, C, F);
  assert_same("act rebuilt", act, act2, na);
  float *bw = fz(nb), *dx = fz((size_t)n * C), *dw = fz(np), *dw2 = fz(np), *drw = fz(n);
  float *drw2 = fz(n), *dx2 = fz((size_t)n * C), *bw2 = fz(nb);
  kernels_expert_ffn_backward(dx, drw, dw, bw, scratch, dout, row_expert, n, saved, NULL, NULL,
                              params, 0, E, C, F, false);
  kernels_expert_ffn_backward_input(dx2, drw2, bw2, scratch, dout, row_expert, n, saved2, act2,
                                    params, 0, E, C, F, false);
  assert_same("input gradient, act apart", dx, dx2, (size_t)n * C);
  assert_same("routing weights' gradient, act apart", drw, drw2, (size_t)n);
  kernels_expert_ffn_backward_weight(dw2, bw, row_expert, n, saved2, act2, NULL, 0, E, C, F);
  assert_same("weight gradient from the rebuilt act", dw, dw2, np);
  kernels_expert_ffn_backward_weight(dw3, bw, row_expert, n, saved3, NULL, xs, 0, E, C, F);
  assert_same("weight gradient from xs apart", dw, dw3, np);
  free(out3), free(saved3), free(xs), free(dw3);
  free(params), free(in), free(dout), free(out), free(saved), free(scratch), free(out2);
  free(saved2), free(act), free(act2), free(bw), free(dx), free(dw), free(dw2), free(rw);
  free(drw), free(drw2), free(dx2), free(bw2);
}

static void test_expert_ffn_grad(void **state) {
  (void)state;
  /* A rank holding experts 1..3 of 5; rows in arbitrary order, expert 2 gets none. */
  int32_t row_expert[7] = {3, 1, 3, 1, 1, 3, 1};
  struct exp_ctx c = {.n = 7, .C = 4, .F = 6, .e_first = 1, .e_count = 3};
  c.row_expert = row_expert;
  size_t n = (size_t)c.n * c.C, np = kernels_expert_ffn_param_count(c.e_count, c.C, c.F);
  size_t nb = kernels_expert_ffn_bwork_floats(c.n, c.C, c.F);
  assert_int_equal(kernels_expert_ffn_param_count(5, 4, 6), 5 * 3 * 4 * 6);
  float *full = fz(kernels_expert_ffn_param_count(5, c.C, c.F));
  fill(full, kernels_expert_ffn_param_count(5, c.C, c.F), 0.7f);
  c.params = full + kernels_expert_ffn_param_count(c.e_first, c.C, c.F);
  c.in = fz(n), c.out = fz(n), c.R = fz(n), c.row_weight = fz((size_t)c.n);
  fill(c.row_weight, (size_t)c.n, 1.0f);
  c.saved = fz(kernels_expert_ffn_saved_floats(c.n, c.C, c.F));
  c.scratch = fz(kernels_expert_ffn_scratch_floats(c.n, c.C));
  fill(c.in, n, 1.0f), fill(c.R, n, 1.0f);
  exp_loss(&c);
  /* Each row equals the MLP kernel on that row with its expert's weights (same layout). */
  for (int r = 0; r < c.n; r++) {
    float m[4], ms[3 * 6];
    kernels_mlp_forward(m, ms, c.in + r * c.C,
                        full + kernels_expert_ffn_param_count(row_expert[r], c.C, c.F), 1, c.C,
                        c.F);
    /* The row's output is its weight times the MLP's (the weight scales the activation before
     * the linear down projection); BLAS may block a 1-row GEMM differently from a 4-row one. */
    for (int j = 0; j < c.C; j++)
      m[j] *= c.row_weight[r];
    assert_close_f("expert row vs mlp", c.out + r * c.C, m, (size_t)c.C, 1e-6, 1e-5);
  }
  float *dx = fz(n), *dw = fz(np), *bw = fz(nb), *dx2 = fz(n), *dw2 = fz(np), *bw2 = fz(nb);
  float *drw = fz((size_t)c.n), *drw2 = fz((size_t)c.n);
  kernels_expert_ffn_backward_input(dx, drw, bw, c.scratch, c.R, row_expert, c.n, c.saved, NULL,
                                    c.params, c.e_first, c.e_count, c.C, c.F, false);
  kernels_expert_ffn_backward_weight(dw, bw, row_expert, c.n, c.saved, NULL, NULL, c.e_first,
                                     c.e_count, c.C, c.F);
  kernels_expert_ffn_backward(dx2, drw2, dw2, bw2, c.scratch, c.R, row_expert, c.n, c.saved, NULL,
                              NULL, c.params, c.e_first, c.e_count, c.C, c.F, false);
  assert_same("expert fused dx", dx, dx2, n);
  assert_same("expert fused drow_weight", drw, drw2, (size_t)c.n);
  assert_same("expert fused dw", dw, dw2, np);
  /* Expert 2 had no rows: its gradient block stays exactly zero. */
  size_t per = kernels_expert_ffn_param_count(1, c.C, c.F);
  for (size_t i = per; i < 2 * per; i++)
    assert_true(dw[i] == 0.0f);
  float *dx3 = fz(n);
  fill(dx3, n, 1.0f);
  float *old = fdup(dx3, n);
  kernels_expert_ffn_backward_input(dx3, drw2, bw2, c.scratch, c.R, row_expert, c.n, c.saved, NULL,
                                    c.params, c.e_first, c.e_count, c.C, c.F, true);
  check_accumulated("expert accumulate", dx3, old, dx, n);
  fd_check("expert din", c.in, n, dx, exp_loss, &c);
  fd_check("expert dw", c.params, np, dw, exp_loss, &c);
  fd_check("expert drow_weight", c.row_weight, (size_t)c.n, drw, exp_loss, &c);
  free(full), free(c.in), free(c.out), free(c.R), free(c.saved), free(c.scratch);
  free(c.row_weight), free(drw), free(drw2);
  free(dx), free(dw), free(bw), free(dx2), free(dw2), free(bw2), free(dx3), free(old);
}

/* The MoE layer on one device against the same layer split over N expert-parallel ranks (each
 * runs its experts on the rows dispatched to it): forward output, input gradient and weight
 * gradients are bit-identical, because every expert sees the same rows in the same order. */
static void test_expert_parallel_equals_full(void **state) {
  (void)state;
  enum { T = 9, C = 6, F = 5, E = 8, K = 2, N = 4 };
  size_t per = kernels_expert_ffn_param_count(1, C, F), np = E * per;
  float h[T * C], rw[C * E], probs[T * E], weights[T * K], dm[T * C];
  int32_t ids[T * K];
  fill(h, T * C, 1.0f), fill(rw, C * E, 1.0f), fill(dm, T * C, 1.0f);
  kernels_router_forward(ids, weights, probs, h, rw, T, C, E, K);
  float *params = fz(np);
  fill(params, np, 0.5f);
  float *m[2], *dh[2], *dparams[2], *dweights[2];
  for (int run = 0; run < 2; run++) {
    int n_ranks = run == 0 ? 1 : N, per_rank = E / n_ranks;
    int32_t counts[N], route_row[T * K], send_expert[T * K];
    float *send = fz(T * K * C), *y = fz(T * K * C), *dy = fz(T * K * C), *dsend = fz(T * K * C);
    float *send_weight = fz(T * K), *dsend_weight = fz(T * K);
    float *saved = fz(kernels_expert_ffn_saved_floats(T * K, C, F));
    float *bwork = fz(kernels_expert_ffn_bwork_floats(T * K, C, F));
    float *scratch = fz(kernels_expert_ffn_scratch_floats(T * K, C));
    m[run] = fz(T * C), dh[run] = fz(T * C), dparams[run] = fz(np), dweights[run] = fz(T * K);
    kernels_moe_dispatch_plan(counts, route_row, ids, T, K, E, n_ranks);
    kernels_moe_dispatch_forward(send, send_expert, send_weight, h, ids, weights, route_row, T, K,
                                 C);
    /* "All-to-all": rank r's rows are the slice [off, off + counts[r]) of the send buffer. */
    size_t off = 0;
    for (int r = 0; r < n_ranks; r++) {
      size_t cnt = (size_t)counts[r], e0 = (size_t)r * per_rank;
      kernels_expert_ffn_forward(y + off * C, saved + off * (C + 3 * F + 1), NULL, NULL, scratch,
                                 send + off * C, send_expert + off, send_weight + off, (int)cnt,
                                 params + e0 * per, (int)e0, per_rank, C, F);
      off += cnt;
    }
    kernels_moe_combine_forward(m[run], y, route_row, T, K, C);
    kernels_moe_combine_backward(dy, dm, route_row, T, K, C);
    off = 0;
    for (int r = 0; r < n_ranks; r++) {
      size_t cnt = (size_t)counts[r], e0 = (size_t)r * per_rank;
      kernels_expert_ffn_backward(dsend + off * C, dsend_weight + off, dparams[run] + e0 * per,
                                  bwork + off * (C + 2 * F), scratch, dy + off * C,
                                  send_expert + off, (int)cnt, saved + off * (C + 3 * F + 1), NULL,
                                  NULL, params + e0 * per, (int)e0, per_rank, C, F, false);
      off += cnt;
    }
    kernels_moe_dispatch_backward(dh[run], dweights[run], dsend, dsend_weight, route_row, T, K, C,
                                  false);
    free(send), free(y), free(dy), free(dsend), free(saved), free(bwork), free(scratch);
    free(send_weight), free(dsend_weight);
  }
  assert_same("EP forward", m[0], m[1], T * C);
  assert_same("EP dh", dh[0], dh[1], T * C);
  assert_same("EP dweights", dweights[0], dweights[1], T * K);
  assert_same("EP dparams", dparams[0], dparams[1], np);
  for (int run = 0; run < 2; run++)
    free(m[run]), free(dh[run]), free(dparams[run]), free(dweights[run]);
  free(params);
}

/* The whole MoE layer, h -> router -> dispatch -> experts -> combine -> m, on one device:
 * the chained backward (through the expert inputs and through the routing weights) against
 * finite differences. */
struct moe_ctx {
  int T, C, F, E, K;
  float *h, *rw, *ew, *probs, *weights, *send, *send_weight, *y, *m, *esaved, *scratch, *R;
  int32_t *ids, *ids0, *route_row, *send_expert, counts[1];
};

static double moe_loss(void *p) {
  struct moe_ctx *c = p;
  kernels_router_forward(c->ids, c->weights, c->probs, c->h, c->rw, c->T, c->C, c->E, c->K);
  assert_memory_equal(c->ids, c->ids0, (size_t)c->T * c->K * sizeof(int32_t));
  kernels_moe_dispatch_plan(c->counts, c->route_row, c->ids, c->T, c->K, c->E, 1);
  kernels_moe_dispatch_forward(c->send, c->send_expert, c->send_weight, c->h, c->ids, c->weights,
                               c->route_row, c->T, c->K, c->C);
  kernels_expert_ffn_forward(c->y, c->esaved, NULL, NULL, c->scratch, c->send, c->send_expert,
                             c->send_weight, c->T * c->K, c->ew, 0, c->E, c->C, c->F);
  kernels_moe_combine_forward(c->m, c->y, c->route_row, c->T, c->K, c->C);
  return dotd(c->m, c->R, (size_t)c->T * c->C);
}

static void test_moe_layer_grad(void **state) {
  (void)state;
  struct moe_ctx c = {.T = 4, .C = 4, .F = 3, .E = 4, .K = 2};
  /* its own draw, apart from the tests before it: finite differences must not flip a routing
   * (a near tie between two experts' probabilities) */
  rng_state = 42;
  size_t n = (size_t)c.T * c.C, nk = (size_t)c.T * c.K, nr = nk * c.C;
  size_t nrw = kernels_router_param_count(c.C, c.E);
  size_t new_ = kernels_expert_ffn_param_count(c.E, c.C, c.F);
  c.h = fz(n), c.rw = fz(nrw), c.ew = fz(new_), c.probs = fz((size_t)c.T * c.E);
  c.weights = fz(nk), c.send = fz(nr), c.y = fz(nr), c.m = fz(n), c.R = fz(n);
  c.send_weight = fz(nk);
  c.esaved = fz(kernels_expert_ffn_saved_floats((int)nk, c.C, c.F));
  c.scratch = fz(kernels_expert_ffn_scratch_floats((int)nk, c.C));
  c.ids = iz(nk), c.ids0 = iz(nk), c.route_row = iz(nk), c.send_expert = iz(nk);
  fill(c.h, n, 1.0f), fill(c.rw, nrw, 1.0f), fill(c.ew, new_, 0.7f), fill(c.R, n, 1.0f);
  kernels_router_forward(c.ids0, c.weights, c.probs, c.h, c.rw, c.T, c.C, c.E, c.K);
  moe_loss(&c);
  float *dy = fz(nr), *dwt = fz(nk), *dsend = fz(nr), *dh = fz(n), *drw = fz(nrw);
  float *dsend_w = fz(nk);
  float *dew = fz(new_), *ebw = fz(kernels_expert_ffn_bwork_floats((int)nk, c.C, c.F));
  float *rbw = fz(kernels_router_bwork_floats(c.T, c.E));
  kernels_moe_combine_backward(dy, c.R, c.route_row, c.T, c.K, c.C);
  kernels_expert_ffn_backward(dsend, dsend_w, dew, ebw, c.scratch, dy, c.send_expert, (int)nk,
                              c.esaved, NULL, NULL, c.ew, 0, c.E, c.C, c.F, false);
  kernels_moe_dispatch_backward(dh, dwt, dsend, dsend_w, c.route_row, c.T, c.K, c.C, false);
  kernels_router_backward(dh, drw, rbw, dwt, c.ids, c.weights, c.probs, c.h, c.rw, c.T, c.C, c.E,
                          c.K, true); /* h fans out to router and experts: sum */
  fd_check("moe layer dh", c.h, n, dh, moe_loss, &c);
  fd_check("moe layer d router", c.rw, nrw, drw, moe_loss, &c);
  fd_check("moe layer d experts", c.ew, new_, dew, moe_loss, &c);
  free(c.h), free(c.rw), free(c.ew), free(c.probs), free(c.weights), free(c.send), free(c.y);
  free(c.m), free(c.R), free(c.esaved), free(c.scratch), free(c.ids), free(c.ids0);
  free(c.route_row), free(c.send_expert), free(dy), free(dwt), free(dsend), free(dh);
  free(drw), free(dew), free(ebw), free(rbw), free(c.send_weight), free(dsend_w);
}

/* ---- LM_HEAD_LOSS ------------------------------------------------------------------------ */

static void test_lm_head_known(void **state) {
  (void)state;
  enum { T = 3, C = 4, V = 50 };
  float h[T * C], w[C * V], probs[T * V];
  int32_t targets[T] = {0, 17, 49};
  fill(h, T * C, 1.0f);
  memset(w, 0, sizeof w);
  float loss;
  kernels_lm_head_loss_forward(&loss, probs, h, targets, w, KERNELS_LM_HEAD_UNTIED, T, C, V);
  double want = log((double)V);
  assert_close("uniform logits: ln V", &loss, &want, 1, 0.0, 1e-6); /* rounded to fp32 */
  /* V = 2, C = 1, h = 1, logits (0, d): -log p[0] = log(1 + e^d). */
  float h1 = 1.0f, w2[2] = {0.0f, 1.5f}, p2[2];
  int32_t t0 = 0;
  kernels_lm_head_loss_forward(&loss, p2, &h1, &t0, w2, KERNELS_LM_HEAD_UNTIED, 1, 1, 2);
  want = log(1.0 + exp(1.5));
  assert_close("two-class loss", &loss, &want, 1, 0.0, 1e-6);
}

struct lm_ctx {
  int T, C, V;
  enum kernels_lm_head_layout layout;
  float *h, *params, *saved;
  int32_t *targets;
};

static double lm_loss(void *p) {
  struct lm_ctx *c = p;
  float loss;
  kernels_lm_head_loss_forward(&loss, c->saved, c->h, c->targets, c->params, c->layout, c->T,
                               c->C, c->V);
  return loss;
}

static void test_lm_head_grad(void **state) {
  (void)state;
  int32_t targets[4] = {3, 0, 6, 3};
  struct lm_ctx c = {.T = 4, .C = 5, .V = 7, .layout = KERNELS_LM_HEAD_UNTIED};
  c.targets = targets;
  size_t n = (size_t)c.T * c.C, np = kernels_lm_head_loss_param_count(c.C, c.V);
  size_t ns = kernels_lm_head_loss_saved_floats(c.T, c.V);
  size_t nb = kernels_lm_head_loss_bwork_floats(c.T, c.V);
  c.h = fz(n), c.params = fz(np), c.saved = fz(ns);
  fill(c.h, n, 1.0f), fill(c.params, np, 1.0f);
  lm_loss(&c);
  float *dh = fz(n), *dw = fz(np), *bw = fz(nb), *dh2 = fz(n), *dw2 = fz(np), *bw2 = fz(nb);
  kernels_lm_head_loss_backward_input(dh, bw, c.saved, c.h, targets, c.params, c.layout, 1.0f, c.T,
                                      c.C, c.V, false);
  kernels_lm_head_loss_backward_weight(dw, bw, c.saved, c.h, targets, c.params, c.layout, 1.0f,
                                       c.T, c.C, c.V);
  kernels_lm_head_loss_backward(dh2, dw2, bw2, c.saved, c.h, targets, c.params, c.layout, 1.0f, c.T,
                                c.C, c.V, false);
  assert_same("lm head fused dh", dh, dh2, n);
  assert_same("lm head fused dw", dw, dw2, np);
  float *alias = fdup(c.saved, ns), *dh4 = fz(n);
  /* dloss = 1/2 halves every gradient exactly (power-of-two scaling). */
  kernels_lm_head_loss_backward_input(dh4, bw2, c.saved, c.h, targets, c.params, c.layout, 0.5f,
                                      c.T, c.C, c.V, false);
  for (size_t i = 0; i < n; i++)
    assert_true(dh4[i] == 0.5f * dh[i]);
  float *dh3 = fz(n);
  fill(dh3, n, 1.0f);
  float *old = fdup(dh3, n);
  kernels_lm_head_loss_backward_input(dh3, bw2, c.saved, c.h, targets, c.params, c.layout, 1.0f,
                                      c.T, c.C, c.V, true);
  check_accumulated("lm head accumulate", dh3, old, dh, n);
  fd_check("lm head dh", c.h, n, dh, lm_loss, &c);
  fd_check("lm head dw", c.params, np, dw, lm_loss, &c);
  free(c.h), free(c.params), free(c.saved), free(dh), free(dw), free(bw), free(dh2), free(dw2);
  free(bw2), free(alias), free(dh4), free(dh3), free(old);
}

/* The head as it was before it kept only row statistics: the [T, V] probabilities kept by F,
 * dlogits from them in BI. The losses and gradients are the same bits. */
static double old_head_forward(float *probs, const float *h, const int32_t *targets,
                               const float *w, int T, int C, int V) {
  kernels_gemm(false, false, T, V, C, 1.0f, h, C, w, V, 0.0f, probs, V);
  double loss = 0.0;
  for (int t = 0; t < T; t++) {
    float *row = probs + (size_t)t * V;
    float maxv = row[0];
    for (int v = 1; v < V; v++)
      maxv = row[v] > maxv ? row[v] : maxv;
    float target = row[targets[t]];
    double sum = 0.0;
    for (int v = 0; v < V; v++)
      sum += row[v] = expf(row[v] - maxv);
    loss += maxv + log(sum) - target;
    for (int v = 0; v < V; v++)
      row[v] *= (float)(1.0 / sum);
  }
  return loss / T;
}

static void test_lm_head_old_formula(void **state) {
  (void)state;
  /* V large enough that the forward runs in chunks of rows (kernels/loss.c: 2^21 / V rows) */
  enum { T = 21, C = 3, V = 1 << 18 };
  float *h = fz((size_t)T * C), *w = fz((size_t)C * V), *probs = fz((size_t)T * V);
  float *saved = fz(kernels_lm_head_loss_saved_floats(T, V));
  float *bw = fz(kernels_lm_head_loss_bwork_floats(T, V)), *dh = fz((size_t)T * C);
  float *dh_old = fz((size_t)T * C), *dl_old = fz((size_t)T * V);
  int32_t targets[T];
  for (int t = 0; t < T; t++) {
    targets[t] = (t * 7919) % V;
    for (int c = 0; c < C; c++)
      h[t * C + c] = (float)((t * 3 + c) % 7) * 0.25f - 0.5f;
  }
  for (size_t i = 0; i < (size_t)C * V; i++)
    w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  double want = old_head_forward(probs, h, targets, w, T, C, V);
  float loss;
  kernels_lm_head_loss_forward(&loss, saved, h, targets, w, KERNELS_LM_HEAD_UNTIED, T, C, V);
  float want_f = (float)want;
  assert_close_f("chunked loss = the old formula's", &loss, &want_f, 1, 1e-6, 1e-6);
  float scale = 1.0f / T;
  for (int t = 0; t < T; t++)
    for (int v = 0; v < V; v++) {
      float p = probs[(size_t)t * V + v];
      dl_old[(size_t)t * V + v] = (v == targets[t] ? p - 1.0f : p) * scale;
    }
  kernels_gemm(false, true, T, C, V, 1.0f, dl_old, V, w, V, 0.0f, dh_old, C);
  kernels_lm_head_loss_backward_input(dh, bw, saved, h, targets, w, KERNELS_LM_HEAD_UNTIED, 1.0f,
                                      T, C, V, false);
  assert_close_f("dh = the old formula's", dh, dh_old, T * C, 1e-6, 1e-5);
  /* BW recomputes the dlogits too: dw = h^T dlogits, chunk by chunk */
  float *dw = fz((size_t)C * V), *dw_old = fz((size_t)C * V);
  kernels_gemm(true, false, C, V, T, 1.0f, h, C, dl_old, V, 1.0f, dw_old, V);
  kernels_lm_head_loss_backward_weight(dw, bw, saved, h, targets, w, KERNELS_LM_HEAD_UNTIED, 1.0f,
                                       T, C, V);
  assert_close_f("dw = the old formula's", dw, dw_old, C * V, 1e-6, 1e-5);
  free(h), free(w), free(probs), free(saved), free(bw), free(dh), free(dh_old), free(dl_old);
  free(dw), free(dw_old);
}

/* Tied embeddings: the head reads wte [V, C] = w^T. Loss, dh and dwte^T match the untied head
 * (same products, but BLAS may order the transposed GEMMs' sums differently). */
static void test_lm_head_tied(void **state) {
  (void)state;
  enum { T = 4, C = 5, V = 7 };
  float h[T * C], w[C * V], wte[V * C], probs[T * V], bw[T * V];
  float dh[2][T * C], dw[C * V] = {0}, dwte[V * C] = {0};
  int32_t targets[T] = {1, 6, 0, 1};
  fill(h, T * C, 1.0f), fill(w, C * V, 1.0f);
  for (int c = 0; c < C; c++)
    for (int v = 0; v < V; v++)
      wte[v * C + c] = w[c * V + v];
  float loss;
  kernels_lm_head_loss_forward(&loss, probs, h, targets, w, KERNELS_LM_HEAD_UNTIED, T, C, V);
  kernels_lm_head_loss_backward(dh[0], dw, bw, probs, h, targets, w, KERNELS_LM_HEAD_UNTIED, 1.0f,
                                T, C, V, false);
  float tied;
  kernels_lm_head_loss_forward(&tied, probs, h, targets, wte, KERNELS_LM_HEAD_TIED, T, C, V);
  kernels_lm_head_loss_backward(dh[1], dwte, bw, probs, h, targets, wte, KERNELS_LM_HEAD_TIED, 1.0f,
                                T, C, V, false);
  assert_close_f("tied loss", &tied, &loss, 1, 1e-6, 1e-6);
  assert_close_f("tied dh", dh[1], dh[0], T * C, 1e-6, 1e-5);
  for (int c = 0; c < C; c++)
    for (int v = 0; v < V; v++)
      assert_close_f("tied dwte", &dwte[v * C + c], &dw[c * V + v], 1, 1e-6, 1e-5);
}

/* ---- RESIDUAL_ADD ------------------------------------------------------------------------ */

struct res_ctx {
  float *x, *y, *out, *R;
  size_t n;
};

static double res_loss(void *p) {
  struct res_ctx *c = p;
  memcpy(c->out, c->x, c->n * sizeof(float));
  kernels_residual_add_forward(c->out, c->y, c->n);
  return dotd(c->out, c->R, c->n);
}

static void test_residual_add(void **state) {
  (void)state;
  struct res_ctx c = {.n = 12};
  c.x = fz(c.n), c.y = fz(c.n), c.out = fz(c.n), c.R = fz(c.n);
  fill(c.x, c.n, 1.0f), fill(c.y, c.n, 1.0f), fill(c.R, c.n, 1.0f);
  res_loss(&c);
  for (size_t i = 0; i < c.n; i++)
    assert_true(c.out[i] == c.x[i] + c.y[i]);
  float *dy = fz(c.n);
  kernels_residual_add_backward(dy, c.R, c.n, false);
  assert_memory_equal(dy, c.R, c.n * sizeof(float));
  fd_check("residual dy", c.y, c.n, dy, res_loss, &c);
  fd_check("residual dx", c.x, c.n, c.R, res_loss, &c); /* dx passes through unchanged */
  kernels_residual_add_backward(dy, c.R, c.n, true);
  for (size_t i = 0; i < c.n; i++)
    assert_true(dy[i] == 2.0f * c.R[i]);
  free(c.x), free(c.y), free(c.out), free(c.R), free(dy);
}

/* ---- AdamW ------------------------------------------------------------------------------- */

/* Clipping's two kernels, exact on chosen values: the squares added to what *sum holds. */
static void test_sum_squares_scale(void **state) {
  (void)state;
  float x[] = {1, 2, 3, -4};
  double sum = 0.5;
  kernels_sum_squares(&sum, x, 4);
  assert_true(sum == 30.5);
  kernels_sum_squares(&sum, x, 0);
  assert_true(sum == 30.5);
  kernels_scale(x, 0.5f, 4);
  assert_true(x[0] == 0.5f && x[1] == 1.0f && x[2] == 1.5f && x[3] == -2.0f);
}

static void test_adamw(void **state) {
  (void)state;
  float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.1f, -0.2f, 0.0f}, m[3] = {0}, v[3] = {0};
  /* The reference uses the fp32 values of the hyperparameters the kernel receives (0.999f is
   * not 0.999; 1 - 0.999f is then exact in both). */
  const double lr = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  double pd[3], md[3] = {0}, vd[3] = {0};
  for (int i = 0; i < 3; i++)
    pd[i] = p[i];
  for (int step = 1; step <= 2; step++) {
    if (step == 2) /* a second step with another gradient exercises the moments */
      g[0] = -0.3f, g[1] = 0.05f, g[2] = 0.4f;
    kernels_adamw_step(p, g, m, v, 3, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, step);
    for (int i = 0; i < 3; i++) {
      md[i] = b1 * md[i] + (1 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
      double mh = md[i] / (1 - pow(b1, step)), vh = vd[i] / (1 - pow(b2, step));
      pd[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pd[i]);
    }
    /* fp32 against double: a few roundings of unit-scale values. */
    assert_close("adamw p", p, pd, 3, 1e-6, 1e-6);
    assert_close("adamw m", m, md, 3, 1e-9, 1e-6);
    assert_close("adamw v", v, vd, 3, 1e-12, 1e-5);
    if (step == 1) {
      /* First step, m = v = 0: the update is lr * (sign(g) + wd * p), 0 where g = 0. */
      double want[3] = {1.0 - 0.1 * (1 + 0.01), -2.0 - 0.1 * (-1 - 0.02), 0.5 - 0.1 * 0.005};
      assert_close("adamw step 1 closed form", p, want, 3, 1e-6, 1e-6);
    }
  }
}

/* The multi-tensor AdamW is each tensor's adamw_step, bit for bit (the cuda backend's one launch
 * is checked against the same in tests/gpu/check_kernels.c); an empty tensor is skipped. */
static void test_adamw_multi(void **state) {
  (void)state;
  enum { N1 = 5, N2 = 0, N3 = 9 };
  float p[2][N1 + N3], g[N1 + N3], m[2][N1 + N3], v[2][N1 + N3];
  for (int i = 0; i < N1 + N3; i++) {
    p[0][i] = p[1][i] = 0.1f * (float)(i - 6);
    g[i] = 0.05f * (float)((i * 7) % 5 - 2);
    m[0][i] = m[1][i] = 0.01f * (float)(i % 3);
    v[0][i] = v[1][i] = 0.001f * (float)(i % 4);
  }
  struct kernels_adamw_tensor t[3] = {{p[0], g, m[0], v[0], N1},
                                      {p[0] + N1, g + N1, m[0] + N1, v[0] + N1, N2},
                                      {p[0] + N1, g + N1, m[0] + N1, v[0] + N1, N3}};
  kernels_adamw_multi(t, 3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4);
  kernels_adamw_step(p[1], g, m[1], v[1], N1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4);
  kernels_adamw_step(p[1] + N1, g + N1, m[1] + N1, v[1] + N1, N3, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                     4);
  assert_memory_equal(p[0], p[1], sizeof p[0]);
  assert_memory_equal(m[0], m[1], sizeof m[0]);
  assert_memory_equal(v[0], v[1], sizeof v[0]);
  assert_true(p[0][0] != 0.1f * -6); /* it moved */
}

/* theta is the model file's rope_theta: another theta must give another output (llama3 uses
 * 500000), and the default must be what the model loader defaults to. */
static void test_attention_theta(void **state) {
  (void)state;
  struct attn_ctx c = {.d = {.batch = 1,
                             .seq = 6,
                             .heads = 2,
                             .kv_heads = 1,
                             .head_dim = 8,
                             .hidden = 8,
                             .rope_theta = KERNELS_ROPE_THETA}};
  attn_alloc(&c);
  size_t n = attn_tc(&c.d);
  attn_loss(&c);
  float *a0 = fdup(c.a, n);
  attn_loss(&c);
  assert_memory_equal(c.a, a0, n * sizeof(float)); /* the cached table is the same table */
  c.d.rope_theta = 500000.0f;
  attn_loss(&c);
  /* Token 0 sees only itself (RoPE is relative, position 0 rotates nothing): same bits. */
  assert_memory_equal(c.a, a0, (size_t)c.d.hidden * sizeof(float));
  double diff = 0.0;
  for (size_t i = c.d.hidden; i < n; i++)
    diff += fabs((double)c.a[i] - a0[i]);
  assert_true(diff > 1e-3); /* later tokens: relative angles changed */
  assert_true(KERNELS_ROPE_THETA == 10000.0f && KERNELS_RMSNORM_EPS == 1e-6f);
  free(a0);
  attn_free(&c);
}

/* The reference: the scalar loops the GEMM kernels replaced (q, k, v after RoPE from saved). */
static void attn_reference(double *y, const float *saved, const struct kernels_attention_dims *d) {
  int S = d->seq, H = d->heads, D = d->head_dim, HD = H * D, KD = d->kv_heads * D;
  int T = d->batch * S, group = H / d->kv_heads;
  const float *q = saved, *k = q + (size_t)T * HD, *v = k + (size_t)T * KD;
  double *sc = calloc((size_t)S, sizeof(double));
  for (int b = 0; b < d->batch; b++)
    for (int hh = 0; hh < H; hh++)
      for (int i = 0; i < S; i++) {
        const float *qi = q + ((size_t)b * S + i) * HD + (size_t)hh * D;
        double maxv = -INFINITY, sum = 0.0;
        for (int j = 0; j <= i; j++) {
          const float *kj = k + ((size_t)b * S + j) * KD + (size_t)(hh / group) * D;
          sc[j] = 0.0;
          for (int c = 0; c < D; c++)
            sc[j] += (double)qi[c] * kj[c] / sqrt((double)D);
          maxv = sc[j] > maxv ? sc[j] : maxv;
        }
        for (int j = 0; j <= i; j++)
          sum += (sc[j] = exp(sc[j] - maxv));
        double *yi = y + ((size_t)b * S + i) * HD + (size_t)hh * D;
        for (int j = 0; j <= i; j++)
          for (int c = 0; c < D; c++)
            yi[c] += sc[j] / sum * v[((size_t)b * S + j) * KD + (size_t)(hh / group) * D + c];
      }
  free(sc);
}

/* A sequence of several causal blocks (and a partial last one): y against the scalar
 * reference (causal), every row's lse finite; the backward against the fused one and against
 * finite differences of a few inputs is covered by test_attention_grad at one block, so here
 * dh is checked against a second run with the blocks' order irrelevant: the same bits. */
static void test_attention_blocks(void **state) {
  (void)state;
  struct attn_ctx c = {.d = {.batch = 2,
                             .seq = 150,
                             .heads = 4,
                             .kv_heads = 2,
                             .head_dim = 8,
                             .hidden = 16,
                             .rope_theta = KERNELS_ROPE_THETA}};
  attn_alloc(&c);
  int S = c.d.seq, H = c.d.heads, T = c.d.batch * S, HD = H * c.d.head_dim;
  attn_loss(&c);
  const float *lse = c.saved + (size_t)T * HD + 2 * (size_t)T * c.d.kv_heads * c.d.head_dim;
  const float *y = lse + (size_t)T * H;
  double *want = calloc((size_t)T * HD, sizeof(double));
  attn_reference(want, c.saved, &c.d);
  /* fp32 GEMM sums of up to 150 terms of unit-scale values against a double reference. */
  assert_close("attention blocks y", y, want, (size_t)T * HD, 1e-5, 1e-4);
  for (size_t r = 0; r < (size_t)T * H; r++)
    assert_true(isfinite(lse[r]));
  size_t n = attn_tc(&c.d), nb = kernels_attention_bwork_floats(&c.d);
  float *dh = fz(n), *bw = fz(nb), *dh2 = fz(n), *bw2 = fz(nb);
  kernels_attention_backward_input(dh, bw, c.R, c.saved, c.params, &c.d, false);
  fill(bw2, nb, 1.0f); /* stale bwork must not leak into the result */
  kernels_attention_backward_input(dh2, bw2, c.R, c.saved, c.params, &c.d, false);
  assert_same("attention blocks dh", dh, dh2, n);
  assert_same("attention blocks bwork", bw, bw2, nb);
  /* Directional derivative along one random direction of h against a central difference. */
  float *dir = fz(n);
  fill(dir, n, 1.0f);
  double analytic = dotd(dh, dir, n), f[2];
  for (int side = 0; side < 2; side++) {
    for (size_t i = 0; i < n; i++)
      c.h[i] += (side ? -2.0f : 1.0f) * FD_EPS * dir[i];
    f[side] = attn_loss(&c);
  }
  for (size_t i = 0; i < n; i++)
    c.h[i] += FD_EPS * dir[i];
  double fd = (f[0] - f[1]) / (2 * FD_EPS);
  assert_true(fabs(fd - analytic) <= 1e-2 + 1e-2 * fabs(fd));
  free(want), free(dh), free(bw), free(dh2), free(bw2), free(dir);
  attn_free(&c);
}

/* The vectorisable exp of softmax and SwiGLU against double exp over its whole range: within
 * 2 ulp (2.4e-7 relative), exact at 0, and positive and finite beyond it (clamped). */
static void test_expf(void **state) {
  (void)state;
  double worst = 0.0;
  for (int i = 0; i <= 200000; i++) {
    float x = -87.0f + 175.0f * (float)i / 200000.0f;
    double want = exp((double)x), got = kernels_impl_expf(x);
    double rel = fabs(got - want) / want;
    worst = rel > worst ? rel : worst;
  }
  assert_true(worst <= 2.4e-7);
  assert_true(kernels_impl_expf(0.0f) == 1.0f);
  assert_true(kernels_impl_expf(-1000.0f) > 0.0f && kernels_impl_expf(-1000.0f) < 1e-37f);
  assert_true(isfinite(kernels_impl_expf(1000.0f)));
}

/* The RoPE tables are built on first use and shared: threads racing to build tables of new
 * shapes (the executor's workers) must each get the table a lone thread gets. */
enum { ROPE_THREADS = 4, ROPE_SEQ = 37, ROPE_D = 12 };

static gpointer rope_thread(gpointer data) {
  float *x = data; /* [ROPE_THREADS][ROPE_SEQ * ROPE_D]: thread t uses theta 1000 (t + 1) */
  int t = (int)(x[0]);
  x[0] = 1.0f;
  for (int rep = 0; rep < 50; rep++)
    kernels_rope(x, 1, ROPE_SEQ + rep % 3, 1, ROPE_D, 1000.0f * (float)(t + 1) + 0.5f, rep % 2);
  return NULL;
}

static void test_rope_threads(void **state) {
  (void)state;
  size_t n = (size_t)(ROPE_SEQ + 2) * ROPE_D;
  float *xs[ROPE_THREADS], *want[ROPE_THREADS];
  GThread *th[ROPE_THREADS];
  for (int t = 0; t < ROPE_THREADS; t++) {
    xs[t] = fz(n);
    fill(xs[t], n, 1.0f);
    xs[t][0] = 1.0f;
    want[t] = fdup(xs[t], n);
    xs[t][0] = (float)t; /* tells the thread its theta; it puts the 1 back */
  }
  for (int t = 0; t < ROPE_THREADS; t++)
    th[t] = g_thread_new("rope", rope_thread, xs[t]);
  for (int t = 0; t < ROPE_THREADS; t++)
    g_thread_join(th[t]);
  for (int t = 0; t < ROPE_THREADS; t++) { /* the same calls, one thread */
    for (int rep = 0; rep < 50; rep++)
      kernels_rope(want[t], 1, ROPE_SEQ + rep % 3, 1, ROPE_D, 1000.0f * (float)(t + 1) + 0.5f,
                   rep % 2);
    assert_memory_equal(xs[t], want[t], n * sizeof(float));
    free(xs[t]), free(want[t]);
  }
}

/* ---- FP8 (kernels/fp8.h) ----------------------------------------------------------------- */

/* The value of e4m3 code c (0 <= c < 127, non-negative finite), from the format's definition
 * (OCP E4M3FN: 4 exponent bits, bias 7, 3 mantissa bits, subnormals at exponent 0), written
 * apart from the encoder so that the two check each other. */
static double fp8_value(int c) {
  int e = c >> 3, m = c & 7;
  return e == 0 ? m / 512.0 : (1.0 + m / 8.0) * pow(2.0, e - 7);
}

/* The code nearest x by brute force over all 127 non-negative finite codes, ties to the even
 * code (its last mantissa bit 0), |x| over 448 saturating to 448, the sign kept. */
static uint8_t fp8_nearest(float x) {
  double a = fabs((double)x);
  int best = 0;
  for (int c = 1; c < 127; c++) {
    double d = fabs(a - fp8_value(c)), db = fabs(a - fp8_value(best));
    if (d < db || (d == db && (c & 1) == 0))
      best = c;
  }
  return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

/* Round to nearest even with saturation, checked against brute force at every code, every
 * midpoint between neighbours (the ties) and a float either side of it, beyond 448, and at
 * random; decode inverts encode on every finite code, and NaN stays NaN. */
static void test_fp8_e4m3_rounding(void **state) {
  (void)state;
  GArray *xs = g_array_new(FALSE, FALSE, sizeof(float));
  for (int c = 0; c < 127; c++) {
    double v = fp8_value(c), next = c < 126 ? fp8_value(c + 1) : 480.0;
    float mid = (float)((v + next) / 2), pts[] = {(float)v, mid, nextafterf(mid, 0.0f),
                                                 nextafterf(mid, 1e9f)};
    for (size_t i = 0; i < G_N_ELEMENTS(pts); i++) {
      float neg = -pts[i];
      g_array_append_val(xs, pts[i]);
      g_array_append_val(xs, neg);
    }
  }
  float big[] = {448.0f, 449.0f, 464.0f, 1e6f, 1e-30f, 0.0f, -0.0f};
  g_array_append_vals(xs, big, G_N_ELEMENTS(big));
  GRand *r = g_rand_new_with_seed(8);
  for (int i = 0; i < 20000; i++) {
    float x = (float)(g_rand_double_range(r, -1.0, 1.0) * pow(2.0, g_rand_int_range(r, -12, 10)));
    g_array_append_val(xs, x);
  }
  g_rand_free(r);
  for (guint i = 0; i < xs->len; i++) {
    float x = g_array_index(xs, float, i);
    uint8_t got = kernels_fp8_e4m3_encode(x), want = fp8_nearest(x);
    if (got != want)
      fail_msg("e4m3(%.9g) = 0x%02x, nearest even is 0x%02x", (double)x, got, want);
  }
  g_array_free(xs, TRUE);
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) {
      assert_true(isnan(kernels_fp8_e4m3_decode((uint8_t)c)));
      continue;
    }
    float v = kernels_fp8_e4m3_decode((uint8_t)c);
    assert_true(v == (float)((c & 0x80 ? -1 : 1) * fp8_value(c & 0x7f)));
    assert_int_equal(kernels_fp8_e4m3_encode(v), c == 0x80 ? 0x80 : c);
  }
  assert_true(isnan(kernels_fp8_e4m3_decode(kernels_fp8_e4m3_encode(NAN))));
}

/* Tiles: each 1 x 128 tile (or 128 x 128 block) scaled by its own amax, so its largest element
 * lands on +-448 exactly and every element comes back within e4m3's half ulp (2^-4 of itself,
 * or 2^-10 of the tile's amax among subnormals); a tile of huge values leaves its neighbour's
 * precision alone (the point of fine-grained scaling). The tensorwise form, K-major
 * transposed, against the same bound on one scale. */
/* DeepSeek-V3's FP8 cache of the routed rows (fp8_expert_inputs): the 1 x 128 tile cast
 * along each row (the GEMMs' activation tiles, bytes for bytes), read back as decode x the
 * tile's factor; each element within e4m3's half step: 2^-4 of itself where it is normal in
 * its tile (3 mantissa bits), half the subnormal step (2^-10 x 448 x factor) below; an
 * all-zero row stays zero. */
static void test_fp8_rows(void **state) {
  (void)state;
  enum { NR = 4, CR = 200, NK = 2 };
  float x[NR * CR], back[NR * CR], inv[NR * NK], inv2[NR * NK];
  uint8_t q[NR * CR], q2[NR * CR];
  GRand *g = g_rand_new_with_seed(3);
  for (int i = 0; i < NR * CR; i++)
    x[i] = (float)g_rand_double_range(g, -1.0, 1.0) * (i % 7 ? 1.0f : 1e-5f);
  g_rand_free(g);
  for (int c = 0; c < CR; c++)
    x[2 * CR + c] = 0.0f;
  kernels_fp8_rows_quantize(q, inv, x, NR, CR);
  kernels_fp8_quantize_tiles(q2, inv2, x, NR, CR, CR, 0, 1);
  assert_memory_equal(q, q2, sizeof q);
  assert_memory_equal(inv, inv2, sizeof inv);
  kernels_fp8_rows_dequantize(back, q, inv, NR, CR);
  for (int r = 0; r < NR; r++)
    for (int c = 0; c < CR; c++) {
      float v = x[r * CR + c], f = inv[r * NK + c / 128], b = back[r * CR + c];
      double bound = fmax(fabs(v) / 16.0, f * 448.0 / 1024.0) * (1 + 1e-6);
      if (fabs(b - v) > bound || b != kernels_fp8_e4m3_decode(q[r * CR + c]) * f)
        fail_msg("row %d col %d: %g back as %g", r, c, (double)v, (double)b);
    }
  for (int c = 0; c < CR; c++)
    assert_true(back[2 * CR + c] == 0.0f);
}

static void test_fp8_quantize_tiles(void **state) {
  (void)state;
  enum { R = 130, Ccols = 300 }; /* partial tiles both ways */
  float *x = g_new(float, R * Ccols);
  GRand *g = g_rand_new_with_seed(9);
  for (int i = 0; i < R * Ccols; i++)
    x[i] = (float)g_rand_double_range(g, -1.0, 1.0);
  g_rand_free(g);
  for (int c = 0; c < 128; c++)
    x[c] *= 1e4f; /* row 0's first tile: huge */
  uint8_t *q = g_new(uint8_t, R * Ccols);
  float *inv = g_new(float, 2 * R * Ccols / 128 + R + Ccols); /* tiles either way, at most */
  for (int transpose = 0; transpose < 2; transpose++)
    for (int block = 1; block <= 128; block += 127) {
      /* transposed: x read as [Ccols'=R][...]: K along x's rows */
      int K = transpose ? R : Ccols, outer = transpose ? Ccols : R;
      int nkt = (K + 127) / 128;
      kernels_fp8_quantize_tiles(q, inv, x, R, Ccols, Ccols, transpose, block);
      for (int o = 0; o < outer; o++)
        for (int k = 0; k < K; k++) {
          float v = transpose ? x[k * Ccols + o] : x[o * Ccols + k];
          float f = inv[(o / block) * nkt + k / 128];
          float back = kernels_fp8_e4m3_decode(q[o * K + k]) * f;
          double bound = fmax(fabs(v) / 16.0, f * 448.0 / 1024.0) * (1 + 1e-6);
          if (fabs(back - v) > bound)
            fail_msg("tile (%d, %d) block %d transpose %d: %g back as %g", o, k, block,
                     transpose, (double)v, (double)back);
        }
      if (!transpose && block == 1) /* row 1's first tile is unaffected by row 0's */
        assert_true(inv[1 * nkt] < 1.0f / 400.0f);
    }
  float f = kernels_fp8_quantize_tensor(q, x, R, Ccols, Ccols, 1);
  assert_true(f > 1e4f / 448.0f * 0.99f); /* one scale, set by the huge tile */
  int exact = 0;
  for (int o = 0; o < Ccols; o++)
    for (int k = 0; k < R; k++) {
      float v = x[k * Ccols + o], back = kernels_fp8_e4m3_decode(q[o * R + k]) * f;
      assert_true(fabs(back - v) <= fmax(fabs(v) / 16.0, f * 448.0 / 1024.0) * (1 + 1e-6));
      exact += fabsf(back) == 448.0f * f;
    }
  assert_true(exact >= 1);
  g_free(x);
  g_free(q);
  g_free(inv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_all_transposes),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_rmsnorm_known),
      cmocka_unit_test(test_residual_rmsnorm_equals_unfused),
      cmocka_unit_test(test_rmsnorm_grad),
      cmocka_unit_test(test_rope_known),
      cmocka_unit_test(test_attention_grad),
      cmocka_unit_test(test_attention_causal),
      cmocka_unit_test(test_attention_uniform),
      cmocka_unit_test(test_attention_gqa),
      cmocka_unit_test(test_mlp_known),
      cmocka_unit_test(test_mlp_grad),
      cmocka_unit_test(test_router_topk_known),
      cmocka_unit_test(test_router_grad),
      cmocka_unit_test(test_dispatch_plan_order),
      cmocka_unit_test(test_dispatch_combine_roundtrip),
      cmocka_unit_test(test_dispatch_combine_grad),
      cmocka_unit_test(test_expert_ffn_grad),
      cmocka_unit_test(test_expert_ffn_act_rerun),
      cmocka_unit_test(test_expert_parallel_equals_full),
      cmocka_unit_test(test_moe_layer_grad),
      cmocka_unit_test(test_lm_head_known),
      cmocka_unit_test(test_lm_head_grad),
      cmocka_unit_test(test_lm_head_tied),
      cmocka_unit_test(test_lm_head_old_formula),
      cmocka_unit_test(test_residual_add),
      cmocka_unit_test(test_adamw),
      cmocka_unit_test(test_adamw_multi),
      cmocka_unit_test(test_sum_squares_scale),
      /* Last, so that the tests above draw the same random inputs as before they existed. */
      cmocka_unit_test(test_rope_llama3_scaling),
      cmocka_unit_test(test_attention_theta),
      cmocka_unit_test(test_attention_blocks),
      cmocka_unit_test(test_expf),
      cmocka_unit_test(test_rope_threads),
      cmocka_unit_test(test_fp8_e4m3_rounding),
      cmocka_unit_test(test_fp8_quantize_tiles),
      cmocka_unit_test(test_fp8_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
