/* check_kernels: every kernel of the cuda backend's table against the host reference
 * (kernels/kernels.h), forward, BI and BW separately (each pass gets the host's saved/bwork as
 * input, so a fault is pinned to one pass). Needs a GPU; run by tools/gpu-check.sh, once with
 * fp32 GEMMs and once with bf16 GEMMs (PIPER_CUDA_GEMM).
 *
 * Error measure: max |gpu - host| / max |host| over each output (a norm-wise relative error:
 * elementwise relative errors blow up at values near zero). Tolerances:
 *   - no GEMM in the op (fill, add, norms' row reductions, softmax, AdamW): 1e-5: the same
 *     fp32 formulas, only the reduction order and libm's expf differ (a few ulps);
 *   - GEMMs in fp32 (CUBLAS_COMPUTE_32F): 2e-4: fp32 sums of up to a few hundred products in
 *     another order (about sqrt(k) ulps), through softmax and back;
 *   - GEMMs in bf16 (bf16 copies of both operands, rounded to nearest even; fp32 accumulation
 *     and output, CUBLAS_COMPUTE_32F; what bf16 models run): 3e-2. bf16 keeps 8 significant
 *     bits: rounding to nearest moves a value by at most half its spacing, a relative 2^-8
 *     (the unit roundoff u; exec_bf16_round's unit test checks the bound), so a product of two
 *     rounded inputs is off by at most 2u = 2^-7 ~ 7.8e-3 of itself; fp32 accumulation adds
 *     ~2^-24 per term, nothing at this scale, so a GEMM's output is off by at most 2^-7 of the
 *     sum of its terms' magnitudes (with these random inputs of mixed sign, against the
 *     largest output, well under that: the roundings are independent and partly cancel).
 *     Ops chain up to three GEMMs with only elementwise steps between (attention:
 *     projection, scores, softmax, values, output; the MLP: gate/up, SwiGLU, down), and the
 *     first-order errors add: 3 * 2^-7 ~ 2.3e-2 < 3e-2. The softmax and the norms run in
 *     fp32 on fp32 inputs and add only the fp32 tolerance. The training check
 *     (tools/gpu-check.sh b) holds bf16 losses to the same 3e-2 of the host's.
 *   - the cached bf16 weight copies against per-GEMM conversion: 0 (the same bits: the same
 *     bf16 operands through the same algorithm).
 *   - the bf16 activation kernels (kc_bf16_*: no GEMM, bf16 in and out): 2^-8 + 1e-5, one
 *     rounding of each output (the bf16 section below says why).
 * Prints one line per check; exits 1 when any exceeds its tolerance, 2 when no GPU. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../exec/backend.h"
#include "../../exec/backend_cuda.h"
#include "../../exec/cuda_cudnn.h"
#include "../../exec/gpu_layout.h"
#include "../../exec/gpu_weights.h"
#include "../../kernels/kernels-impl.h" /* the SwiGLU reference */
#include "../../kernels/fp8.h"
#include "../../kernels/kernels.h"
#include "../../kernels/kernels_cuda.h"
#ifdef PIPER_CUDA_EMU
#include <cudnn.h> /* the stand-in's counts */
#endif

struct check {
  struct exec_backend *b;
  const struct exec_kernels *k;
  struct exec_stream *s;
  GRand *rng;
  double tol_gemm;
  bool bf16; /* bf16 GEMMs: the MLP keeps its GEMM-only intermediates in bf16 */
  int failed, run;
};

static float *rnd(struct check *c, size_t n, float scale) {
  float *x = g_new(float, n ? n : 1);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)g_rand_double_range(c->rng, -scale, scale);
  return x;
}

static void *dev(struct check *c, const void *host, size_t bytes) {
  void *d = exec_backend_alloc(c->b, bytes ? bytes : 4);
  if (!d) {
    fprintf(stderr, "check_kernels: out of device memory\n");
    exit(2);
  }
  if (host && bytes)
    exec_backend_from_host(c->b, d, host, bytes);
  return d;
}

static float *devf(struct check *c, const float *host, size_t n) {
  return dev(c, host, n * sizeof(float));
}

/* Compares n floats got (host memory, from the device) with the host's ref. */
static void compare_values(struct check *c, const char *what, const float *ref, const float *got,
                           size_t n, double tol) {
  const GError *e = exec_stream_error(c->b, c->s);
  double maxref = 0, maxerr = 0;
  bool nan = false;
  for (size_t i = 0; i < n; i++) {
    maxref = fmax(maxref, fabs(ref[i]));
    if (isnan(got[i]) != isnan(ref[i]))
      nan = true;
    else if (!isnan(ref[i]))
      maxerr = fmax(maxerr, fabs((double)got[i] - ref[i]));
  }
  double rel = maxerr / (maxref > 0 ? maxref : 1);
  bool ok = !e && !nan && rel <= tol;
  printf("%-4s %-44s rel err %.2e (tol %.0e)%s%s\n", ok ? "ok" : "FAIL", what, rel, tol,
         nan ? " NaN mismatch" : "", e ? e->message : "");
  c->run++;
  c->failed += !ok;
}

/* Compares n floats of device memory d with the host's ref. */
static void compare(struct check *c, const char *what, const float *ref, const float *d, size_t n,
                    double tol) {
  float *got = g_new(float, n ? n : 1);
  exec_backend_to_host(c->b, got, d, n * sizeof(float));
  compare_values(c, what, ref, got, n, tol);
  g_free(got);
}

static void compare_bits(struct check *c, const char *what, const float *d1, const float *d2,
                         size_t n, bool same);

static void compare_i32(struct check *c, const char *what, const int32_t *ref, const int32_t *d,
                        size_t n) {
  int32_t *got = g_new(int32_t, n ? n : 1);
  exec_backend_to_host(c->b, got, d, n * sizeof(int32_t));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    bad += got[i] != ref[i];
  printf("%-4s %-44s %zu of %zu differ\n", bad ? "FAIL" : "ok", what, bad, n);
  c->run++;
  c->failed += bad != 0;
  g_free(got);
}

enum { B = 2, S = 16, T = B * S, C = 64, F = 96, H = 4, KV = 2, D = 16, E = 8, K = 2, V = 101 };
#define TOL_PLAIN 1e-5

static void check_simple(struct check *c) {
  size_t n = (size_t)T * C;
  float *x = rnd(c, n, 1), *y = rnd(c, n, 1), *ref = g_memdup2(x, n * sizeof(float));
  float *dx = devf(c, x, n), *dy = devf(c, y, n);
  kernels_residual_add_forward(ref, y, n);
  c->k->residual_add_forward(c->s, dx, dy, n);
  compare(c, "residual_add F", ref, dx, n, TOL_PLAIN);
  kernels_residual_add_backward(ref, y, n, true);
  c->k->residual_add_backward(c->s, dx, dy, n, true);
  compare(c, "residual_add B (accumulate)", ref, dx, n, TOL_PLAIN);
  c->k->fill(c->s, dx, 0.5f, n);
  for (size_t i = 0; i < n; i++)
    ref[i] = 0.5f;
  compare(c, "fill", ref, dx, n, 0);
  c->k->copy(c->s, dx, dy, n * sizeof(float));
  compare(c, "copy", y, dx, n, 0);
  /* AdamW, step 3 */
  float *p = rnd(c, n, 1), *g = rnd(c, n, 1), *m = rnd(c, n, 0.1f), *v = rnd(c, n, 0.1f);
  for (size_t i = 0; i < n; i++)
    v[i] = fabsf(v[i]);
  float *dp = devf(c, p, n), *dm = devf(c, m, n), *dv = devf(c, v, n), *dg = devf(c, g, n);
  kernels_adamw_step(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  c->k->adamw_step(c->s, dp, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  compare(c, "adamw params", p, dp, n, TOL_PLAIN);
  compare(c, "adamw m", m, dm, n, TOL_PLAIN);
  compare(c, "adamw v", v, dv, n, TOL_PLAIN);
  /* clipping: the squares' sum (double, added to what is there) and the scale */
  double sum = 0.25, got = 0.25;
  double *dsum = exec_backend_alloc(c->b, sizeof(double));
  exec_backend_from_host(c->b, dsum, &got, sizeof got);
  kernels_sum_squares(&sum, g, n);
  c->k->sum_squares(c->s, dsum, dg, n);
  exec_backend_to_host(c->b, &got, dsum, sizeof got);
  exec_backend_release(c->b, dsum);
  /* the same doubles summed in another order: equal to a few ulps */
  bool sum_ok = fabs(got - sum) <= 1e-12 * sum;
  printf("%-4s %-44s %.17g vs %.17g\n", sum_ok ? "ok" : "FAIL", "sum_squares", got, sum);
  c->run++;
  c->failed += !sum_ok;
  kernels_scale(g, 0.375f, n);
  c->k->scale(c->s, dg, 0.375f, n);
  compare(c, "scale", g, dg, n, 0);
}

static void check_embedding_norm(struct check *c) {
  int32_t tok[T];
  for (int t = 0; t < T; t++)
    tok[t] = (int32_t)g_rand_int_range(c->rng, 0, 7); /* repeats: the order of the sums */
  float *wte = rnd(c, (size_t)V * C, 1), *x = g_new(float, T *C);
  int32_t *dtok = dev(c, tok, sizeof tok);
  float *dwte = devf(c, wte, (size_t)V * C), *dxo = devf(c, NULL, T * C);
  kernels_embedding_forward(x, tok, wte, T, V, C);
  c->k->embedding_forward(c->s, dxo, dtok, dwte, T, V, C);
  compare(c, "embedding F", x, dxo, T * C, 0);
  float *gx = rnd(c, T * C, 1), *dg = devf(c, gx, T * C);
  kernels_embedding_backward_weight(wte, gx, tok, T, V, C);
  c->k->embedding_backward_weight(c->s, dwte, dg, dtok, T, V, C);
  compare(c, "embedding BW", wte, dwte, (size_t)V * C, TOL_PLAIN);
  /* RMSNorm */
  float *w = rnd(c, C, 1), *h = g_new(float, T *C), *rs = g_new(float, T);
  float *dw = devf(c, w, C), *dh = devf(c, NULL, T * C), *drs = devf(c, NULL, T);
  float *dxin = devf(c, x, T * C);
  kernels_rmsnorm_forward(h, rs, x, w, T, C, 1e-6f);
  c->k->rmsnorm_forward(c->s, dh, drs, dxin, dw, T, C, 1e-6f);
  compare(c, "rmsnorm F", h, dh, T * C, TOL_PLAIN);
  compare(c, "rmsnorm F saved (rstd)", rs, drs, T, TOL_PLAIN);
  float *gdh = rnd(c, T * C, 1), *dgdh = devf(c, gdh, T * C);
  float *gdx = rnd(c, T * C, 1), *dgdx = devf(c, gdx, T * C);
  kernels_rmsnorm_backward_input(gdx, gdh, x, rs, w, T, C, true);
  c->k->rmsnorm_backward_input(c->s, dgdx, dgdh, dxin, drs, dw, T, C, true);
  compare(c, "rmsnorm BI (accumulate)", gdx, dgdx, T * C, TOL_PLAIN);
  float *gw = rnd(c, C, 1), *dgw = devf(c, gw, C);
  kernels_rmsnorm_backward_weight(gw, gdh, x, rs, T, C);
  c->k->rmsnorm_backward_weight(c->s, dgw, dgdh, dxin, drs, T, C);
  compare(c, "rmsnorm BW", gw, dgw, C, TOL_PLAIN);
  /* the fused residual add + RMSNorm: the host's reference, and the GPU's own add then norm
   * bit for bit */
  float *y = rnd(c, T * C, 1), *dy = devf(c, y, T * C);
  float *xf = devf(c, x, T * C), *xu = devf(c, x, T * C);
  float *hf = devf(c, NULL, T * C), *hu = devf(c, NULL, T * C);
  float *rf = devf(c, NULL, T), *ru = devf(c, NULL, T);
  kernels_residual_rmsnorm_forward(x, h, rs, y, w, T, C, 1e-6f);
  c->k->residual_rmsnorm_forward(c->s, xf, hf, rf, dy, dw, T, C, 1e-6f);
  c->k->residual_add_forward(c->s, xu, dy, (size_t)T * C);
  c->k->rmsnorm_forward(c->s, hu, ru, xu, dw, T, C, 1e-6f);
  compare(c, "residual + rmsnorm F (x)", x, xf, T * C, TOL_PLAIN);
  compare(c, "residual + rmsnorm F (h)", h, hf, T * C, TOL_PLAIN);
  compare(c, "residual + rmsnorm F saved (rstd)", rs, rf, T, TOL_PLAIN);
  compare_bits(c, "residual + rmsnorm F = residual add, rmsnorm", hf, hu, T * C, true);
  compare_bits(c, "residual + rmsnorm F saved = rmsnorm's", rf, ru, T, true);
}

/* "attention" + the shape's label + what: one check's name. */
static const char *attn_name(char *buf, size_t n, const char *label, const char *what) {
  g_snprintf(buf, n, "attention%s%s %s", label[0] ? " " : "", label, what);
  return buf;
}

/* Attention at shape d (T = batch * seq, C = d.hidden): F, the core rerun of selective
 * recomputation (into a core buffer of its own: the forward's lse and y bit for bit), BI, BW. */
static void check_attention_shape(struct check *c, const char *label,
                                  struct kernels_attention_dims d) {
  char what[80];
  size_t T_ = (size_t)d.batch * d.seq, C_ = (size_t)d.hidden, TC = T_ * C_;
  size_t P = kernels_attention_param_count(&d), SV = kernels_attention_saved_floats(&d);
  size_t BW = kernels_attention_bwork_floats(&d), CORE = kernels_attention_core_floats(&d);
  float *p = rnd(c, P, 0.2f), *h = rnd(c, TC, 1), *a = g_new(float, TC);
  float *saved = g_new0(float, SV), *bwork = g_new0(float, BW);
  float *dp = devf(c, p, P), *dh = devf(c, h, TC), *da = devf(c, NULL, TC);
  float *dsaved = devf(c, NULL, SV), *dcore = devf(c, NULL, CORE);
  kernels_attention_forward(a, saved, h, p, &d);
  c->k->attention_forward(c->s, da, dsaved, dh, dp, &d);
  compare(c, attn_name(what, sizeof what, label, "F (llama3 rope scaling)"), a, da, TC,
          c->tol_gemm);
  compare(c, attn_name(what, sizeof what, label, "F saved (q k v lse y)"), saved, dsaved, SV,
          c->tol_gemm);
  struct kernels_attention_dims dc = d;
  dc.core = dcore;
  c->k->attention_core_forward(c->s, dsaved, &dc);
  compare_bits(c, attn_name(what, sizeof what, label, "core rerun = F's lse y"), dcore,
               dsaved + (SV - CORE), CORE, true);
  exec_backend_from_host(c->b, dsaved, saved, SV * sizeof(float));
  float *g = rnd(c, TC, 1), *dgo = devf(c, g, TC);
  float *gh = g_new0(float, TC), *dgh = devf(c, NULL, TC), *dbw = devf(c, NULL, BW);
  kernels_attention_backward_input(gh, bwork, g, saved, p, &d, false);
  c->k->attention_backward_input(c->s, dgh, dbw, dgo, dsaved, dp, &d, false);
  compare(c, attn_name(what, sizeof what, label, "BI"), gh, dgh, TC, c->tol_gemm);
  compare(c, attn_name(what, sizeof what, label, "BI bwork (dy dq dk dv)"), bwork, dbw, BW,
          c->tol_gemm);
  exec_backend_from_host(c->b, dbw, bwork, BW * sizeof(float));
  float *gp = rnd(c, P, 0.1f), *dgp = devf(c, gp, P);
  kernels_attention_backward_weight(gp, bwork, g, h, saved, &d);
  c->k->attention_backward_weight(c->s, dgp, dbw, dgo, dh, dsaved, &d);
  compare(c, attn_name(what, sizeof what, label, "BW"), gp, dgp, P, c->tol_gemm);
  float *bufs[] = {dp, dh, da, dsaved, dcore, dgo, dgh, dbw, dgp};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    exec_backend_release(c->b, bufs[i]);
  float *hbufs[] = {p, h, a, saved, bwork, g, gh, gp};
  for (size_t i = 0; i < G_N_ELEMENTS(hbufs); i++)
    g_free(hbufs[i]);
}

/* The small shape (head_dim 16: the unfused per-head path in both precisions), then shapes of
 * the fused kernel (kernels/flash_attention.cu), which bf16 GEMMs take for head_dim 32, 64
 * and 128 (exec_gpu_attention_fused; tools/gpu-check.sh also runs the checks with
 * PIPER_CUDA_ATTENTION=unfused): grouped-query heads, sequences a whole number of its 64-row
 * tiles long and not
 * (200 = 3 * 64 + 8: a tail tile; 40: a single partial tile), several sequences. With fp32
 * GEMMs the same shapes check the unfused path at sizes where its scratch is S x S. The
 * fused path meets the bf16 tolerance for the unfused path's reason: it rounds the same
 * operands to bf16 (q, k for the scores; p, v for y; dy, v for dP; p, dy for dV; ds, q for
 * dK; ds, k for dQ), accumulates every product in fp32 and keeps the softmax, lse and the
 * softmax gradient in fp32; only the order of the fp32 sums differs (the running max
 * rescales partial sums by exact-to-fp32 factors). */
static void check_attention(struct check *c) {
  struct kernels_rope_scaling sc = {8.0f, 1.0f, 4.0f, 8};
  struct kernels_attention_dims small = {B, S, H, KV, D, C, 10000.0f, &sc, NULL, 0, 0};
  check_attention_shape(c, "", small);
  const struct kernels_attention_dims shapes[] = {
      {1, 256, 8, 2, 64, 128, 500000.0f, &sc, NULL, 0, 0},
      {2, 200, 8, 2, 128, 128, 500000.0f, &sc, NULL, 0, 0},
      {3, 40, 4, 1, 32, 128, 500000.0f, &sc, NULL, 0, 0},
  };
  const char *labels[] = {"S256 H8/2 D64", "B2 S200 H8/2 D128", "B3 S40 H4/1 D32"};
  for (size_t i = 0; i < G_N_ELEMENTS(shapes); i++)
    check_attention_shape(c, labels[i], shapes[i]);
}

/* ---- attention from cuDNN at context-parallel chunk offsets (exec/cuda_cudnn.h) ---------- */

/* The double-precision reference of one chunk: q [B*Sq, H*D] at positions q_offset.., k, v
 * [B*Skv, KV*D] at kv_offset..; y, lse, and with dy the gradients dq, dk, dv (dk, dv summed
 * over a kv head's query heads). */
static void chunk_reference(const struct exec_cudnn_sdpa_shape *s, const float *q, const float *k,
                            const float *v, const float *dy, float *y, float *lse, float *dq,
                            float *dk, float *dv) {
  int Sq = s->seq_q, Sk = s->seq_kv, H = s->heads, KVh = s->kv_heads, Dh = s->head_dim;
  size_t HD = (size_t)H * Dh, KD = (size_t)KVh * Dh;
  double scale = 1.0 / sqrt((double)Dh), *p = g_new(double, Sk), *dp = g_new(double, Sk);
  memset(dk, 0, sizeof(float) * (size_t)s->batch * Sk * KD);
  memset(dv, 0, sizeof(float) * (size_t)s->batch * Sk * KD);
  for (int b = 0; b < s->batch; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < Sq; i++) {
        const float *qi = q + ((size_t)b * Sq + i) * HD + (size_t)h * Dh;
        const float *dyi = dy + ((size_t)b * Sq + i) * HD + (size_t)h * Dh;
        size_t kvo = (size_t)b * Sk * KD + (size_t)(h / (H / KVh)) * Dh;
        double mx = -INFINITY, sum = 0, dot = 0;
        for (int j = 0; j < Sk; j++) {
          double a = 0;
          for (int d = 0; d < Dh; d++)
            a += (double)qi[d] * k[kvo + (size_t)j * KD + d];
          p[j] = s->q_offset + i >= s->kv_offset + j ? a * scale : -INFINITY;
          mx = fmax(mx, p[j]);
        }
        for (int j = 0; j < Sk; j++)
          sum += p[j] = exp(p[j] - mx);
        lse[((size_t)b * H + h) * Sq + i] = (float)(mx + log(sum));
        for (int d = 0; d < Dh; d++) {
          double a = 0;
          for (int j = 0; j < Sk; j++)
            a += p[j] / sum * v[kvo + (size_t)j * KD + d];
          y[((size_t)b * Sq + i) * HD + (size_t)h * Dh + d] = (float)a;
          dot += a * dyi[d];
        }
        for (int j = 0; j < Sk; j++) {
          double a = 0;
          for (int d = 0; d < Dh; d++)
            a += (double)dyi[d] * v[kvo + (size_t)j * KD + d];
          dp[j] = p[j] / sum * (a - dot) * scale;
          for (int d = 0; d < Dh; d++) {
            dv[kvo + (size_t)j * KD + d] += (float)(p[j] / sum * dyi[d]);
            dk[kvo + (size_t)j * KD + d] += (float)(dp[j] * qi[d]);
          }
        }
        for (int d = 0; d < Dh; d++) {
          double a = 0;
          for (int j = 0; j < Sk; j++)
            a += dp[j] * k[kvo + (size_t)j * KD + d];
          dq[((size_t)b * Sq + i) * HD + (size_t)h * Dh + d] = (float)a;
        }
      }
  g_free(p);
  g_free(dp);
}

/* One chunk through cuDNN's forward and backward against chunk_reference. Tolerance 3e-2, the
 * bf16 GEMMs' (the header's argument): cuDNN reads q, k, v (and y, dy) rounded to bf16, keeps
 * its products in fp32 and rounds y, dq, dk, dv to bf16 once more (2^-9, within the budget). */
static void check_cudnn_chunk(struct check *c, struct exec_cudnn_sdpa *sdpa,
                              struct exec_cudnn_sdpa_shape sh, const char *label) {
  size_t nq = (size_t)sh.batch * sh.seq_q * sh.heads * sh.head_dim;
  size_t nk = (size_t)sh.batch * sh.seq_kv * sh.kv_heads * sh.head_dim;
  size_t nl = (size_t)sh.batch * sh.heads * sh.seq_q;
  float *q = rnd(c, nq, 1), *k = rnd(c, nk, 1), *v = rnd(c, nk, 1), *dy = rnd(c, nq, 1);
  float *y = g_new(float, nq), *lse = g_new(float, nl), *dq = g_new(float, nq);
  float *dk = g_new(float, nk), *dv = g_new(float, nk);
  chunk_reference(&sh, q, k, v, dy, y, lse, dq, dk, dv);
  float *gq = devf(c, q, nq), *gk = devf(c, k, nk), *gv = devf(c, v, nk), *gdy = devf(c, dy, nq);
  float *gy = devf(c, NULL, nq), *gl = devf(c, NULL, nl), *gdq = devf(c, NULL, nq);
  float *gdk = devf(c, NULL, nk), *gdv = devf(c, NULL, nk);
  GError *e = NULL;
  char what[96];
  bool ok = exec_cudnn_sdpa_forward(sdpa, &sh, gy, gl, gq, gk, gv, NULL, &e) &&
            exec_cudnn_sdpa_backward(sdpa, &sh, gdq, gdk, gdv, gq, gk, gv, gy, gdy, gl, NULL, &e);
  if (!ok) {
    printf("FAIL cudnn %s: %s\n", label, e->message);
    g_error_free(e);
    c->run++;
    c->failed++;
  } else {
    const char *names[] = {"y", "lse", "dq", "dk", "dv"};
    const float *ref[] = {y, lse, dq, dk, dv}, *got[] = {gy, gl, gdq, gdk, gdv};
    size_t n[] = {nq, nl, nq, nk, nk};
    for (int i = 0; i < 5; i++)
      compare(c, (g_snprintf(what, sizeof what, "cudnn %s %s", label, names[i]), what), ref[i],
              got[i], n[i], 3e-2);
  }
  float *bufs[] = {gq, gk, gv, gdy, gy, gl, gdq, gdk, gdv};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    exec_backend_release(c->b, bufs[i]);
  float *hbufs[] = {q, k, v, dy, y, lse, dq, dk, dv};
  for (size_t i = 0; i < G_N_ELEMENTS(hbufs); i++)
    g_free(hbufs[i]);
}

/* cuDNN's core at a whole causal sequence and at context-parallel chunks (a query chunk later
 * than its keys: the diagonal shifted; the same shift at other absolute positions), GQA
 * throughout; then, emulated, that the kernel table's attention above went through cuDNN
 * where the mode says it does (the stand-in counts its plans and executions). */
static void check_cudnn(struct check *c) {
  if (!exec_cudnn_sdpa_built()) {
    printf("skip cudnn: this build has no cuDNN (NO_CUDNN=1 or no cudnn.h)\n");
    return;
  }
  GError *e = NULL;
  struct exec_cudnn_sdpa *sdpa = exec_cudnn_sdpa_new(&e);
  if (!sdpa) {
    printf("FAIL cudnn: %s\n", e->message);
    g_error_free(e);
    c->run++, c->failed++;
    return;
  }
  check_cudnn_chunk(c, sdpa, (struct exec_cudnn_sdpa_shape){2, 24, 24, 4, 2, 32, 0, 0},
                    "B2 S24 H4/2 D32 causal");
  check_cudnn_chunk(c, sdpa, (struct exec_cudnn_sdpa_shape){2, 24, 40, 4, 2, 32, 16, 0},
                    "Sq24 Skv40 chunk at +16");
  check_cudnn_chunk(c, sdpa, (struct exec_cudnn_sdpa_shape){1, 16, 40, 4, 1, 64, 96, 72},
                    "Sq16 Skv40 chunk 96/72 H4/1 D64");
  exec_cudnn_sdpa_free(sdpa);
#ifdef PIPER_CUDA_EMU
  long plans, fwd, bwd;
  emu_cudnn_counts(&plans, &fwd, &bwd);
  enum exec_gpu_attention mode = exec_gpu_attention_mode(getenv("PIPER_CUDA_ATTENTION"));
  bool expect = c->bf16 && exec_gpu_attention_cudnn(mode, true);
  /* the three chunks above: 6 plans (each shape, both passes) and 3 executions each */
  bool ok = expect ? fwd > 3 && bwd > 3 && plans > 6 : fwd == 3 && bwd == 3 && plans == 6;
  printf("%-4s %-44s %ld plans, %ld forward, %ld backward (%s)\n", ok ? "ok" : "FAIL",
         "cuDNN stand-in: the table's attention", plans, fwd, bwd,
         expect ? "expected from the table too" : "this mode keeps the own kernels");
  c->run++;
  c->failed += !ok;
#endif
}

static void check_mlp(struct check *c) {
  size_t P = kernels_mlp_param_count(C, F), SV = kernels_mlp_saved_floats(T, F);
  size_t BW = kernels_mlp_bwork_floats(T, F);
  float *p = rnd(c, P, 0.2f), *h = rnd(c, T * C, 1), *m = g_new(float, T *C);
  float *saved = g_new(float, SV), *bwork = g_new(float, BW);
  float *dp = devf(c, p, P), *dh = devf(c, h, T * C), *dm = devf(c, NULL, T * C);
  float *dsaved = devf(c, NULL, SV), *dbw = devf(c, NULL, BW);
  kernels_mlp_forward(m, saved, h, p, T, C, F);
  c->k->mlp_forward(c->s, dm, dsaved, dh, dp, T, C, F);
  compare(c, "mlp F", m, dm, T * C, c->tol_gemm);
  /* with bf16 GEMMs saved and bwork hold bf16 act, dg and du (the cuda backend's own layout):
   * each pass then runs on the device's previous pass, and its outputs are what is checked */
  if (!c->bf16)
    exec_backend_from_host(c->b, dsaved, saved, SV * sizeof(float));
  float *g = rnd(c, T * C, 1), *dg = devf(c, g, T * C);
  float *gh = rnd(c, T * C, 1), *dgh = devf(c, gh, T * C);
  kernels_mlp_backward_input(gh, bwork, g, saved, p, T, C, F, true);
  c->k->mlp_backward_input(c->s, dgh, dbw, dg, dsaved, dp, T, C, F, true);
  compare(c, "mlp BI (accumulate)", gh, dgh, T * C, c->tol_gemm);
  if (!c->bf16) {
    compare(c, "mlp BI bwork", bwork, dbw, BW, c->tol_gemm);
    exec_backend_from_host(c->b, dbw, bwork, BW * sizeof(float));
  }
  float *gp = rnd(c, P, 0.1f), *dgp = devf(c, gp, P);
  kernels_mlp_backward_weight(gp, bwork, g, h, saved, T, C, F);
  c->k->mlp_backward_weight(c->s, dgp, dbw, dg, dh, dsaved, T, C, F);
  compare(c, "mlp BW", gp, dgp, P, c->tol_gemm);
}

/* Top-k ids: in bf16 a near tie may choose differently; only tokens whose host margin
 * between the K-th and the next probability is at least 0.02 must agree. */
static void compare_ids(struct check *c, const int32_t *ref, const int32_t *d, const float *probs) {
  int32_t got[T * K];
  exec_backend_to_host(c->b, got, d, sizeof got);
  int bad = 0, near = 0;
  for (int t = 0; t < T; t++) {
    bool same = memcmp(got + t * K, ref + t * K, K * sizeof(int32_t)) == 0;
    float kth = probs[t * E + ref[t * K + K - 1]], next = 0;
    for (int e = 0; e < E; e++) {
      bool chosen = false;
      for (int k = 0; k < K; k++)
        chosen |= ref[t * K + k] == e;
      if (!chosen && probs[t * E + e] > next)
        next = probs[t * E + e];
    }
    if (!same && kth - next >= 0.02f)
      bad++;
    else if (!same)
      near++;
  }
  printf("%-4s %-44s %d tokens differ (+%d near ties)\n", bad ? "FAIL" : "ok", "router F ids", bad,
         near);
  c->run++;
  c->failed += bad != 0;
}

static void check_router_moe(struct check *c) {
  float *w = rnd(c, (size_t)C * E, 0.3f), *h = rnd(c, T * C, 1);
  int32_t ids[T * K];
  float weights[T * K], *probs = g_new(float, T *E);
  float *dw = devf(c, w, (size_t)C * E), *dh = devf(c, h, T * C), *dwt = devf(c, NULL, T * K);
  float *dprobs = devf(c, NULL, T * E);
  int32_t *dids = dev(c, NULL, sizeof ids);
  kernels_router_forward(ids, weights, probs, h, w, T, C, E, K);
  c->k->router_forward(c->s, dids, dwt, dprobs, dh, dw, T, C, E, K);
  compare_ids(c, ids, dids, probs);
  compare(c, "router F saved (probs)", probs, dprobs, T * E, c->tol_gemm);
  exec_backend_from_host(c->b, dids, ids, sizeof ids);
  exec_backend_from_host(c->b, dwt, weights, sizeof weights);
  exec_backend_from_host(c->b, dprobs, probs, T * E * sizeof(float));
  float *gwt = rnd(c, T * K, 1), *dgwt = devf(c, gwt, T * K);
  float *gh = g_new0(float, T *C), *dgh = devf(c, NULL, T * C);
  float *bw = g_new(float, T *E), *dbw = devf(c, NULL, T * E);
  kernels_router_backward_input(gh, bw, gwt, ids, weights, probs, w, T, C, E, K, false);
  c->k->router_backward_input(c->s, dgh, dbw, dgwt, dids, dwt, dprobs, dw, T, C, E, K, false);
  compare(c, "router BI", gh, dgh, T * C, c->tol_gemm);
  compare(c, "router BI bwork (dlogits)", bw, dbw, T * E, TOL_PLAIN);
  float *gw = rnd(c, (size_t)C * E, 0.1f), *dgw = devf(c, gw, (size_t)C * E);
  kernels_router_backward_weight(gw, bw, h, T, C, E);
  c->k->router_backward_weight(c->s, dgw, dbw, dh, T, C, E);
  compare(c, "router BW", gw, dgw, (size_t)C * E, c->tol_gemm);
  /* dispatch and combine over 2 ranks */
  int32_t counts[2], route[T * K];
  int32_t *dcounts = dev(c, NULL, sizeof counts), *droute = dev(c, NULL, sizeof route);
  kernels_moe_dispatch_plan(counts, route, ids, T, K, E, 2);
  c->k->moe_dispatch_plan(c->s, dcounts, droute, dids, T, K, E, 2);
  compare_i32(c, "moe dispatch plan counts", counts, dcounts, 2);
  compare_i32(c, "moe dispatch plan route_row", route, droute, T * K);
  float *send = g_new(float, T *K *C), *dsend = devf(c, NULL, T * K * C);
  int32_t sexp[T * K], *dsexp = dev(c, NULL, sizeof sexp);
  float sw[T * K], *dsw = devf(c, NULL, T * K);
  kernels_moe_dispatch_forward(send, sexp, sw, h, ids, weights, route, T, K, C);
  c->k->moe_dispatch_forward(c->s, dsend, dsexp, dsw, dh, dids, dwt, droute, T, K, C);
  compare(c, "moe dispatch F", send, dsend, T * K * C, 0);
  compare_i32(c, "moe dispatch F send_expert", sexp, dsexp, T * K);
  compare(c, "moe dispatch F send_weight", sw, dsw, T * K, 0);
  float *gs = rnd(c, T * K * C, 1), *dgs = devf(c, gs, T * K * C);
  float *gsw = rnd(c, T * K, 1), *dgsw = devf(c, gsw, T * K);
  float gwk[T * K], *dgwk = devf(c, NULL, T * K);
  exec_backend_from_host(c->b, dgh, gh, T * C * sizeof(float)); /* the same start */
  kernels_moe_dispatch_backward(gh, gwk, gs, gsw, route, T, K, C, true);
  c->k->moe_dispatch_backward(c->s, dgh, dgwk, dgs, dgsw, droute, T, K, C, true);
  compare(c, "moe dispatch B (accumulate)", gh, dgh, T * C, TOL_PLAIN);
  compare(c, "moe dispatch B dweights", gwk, dgwk, T * K, 0);
  /* C = 0: the weights' gradients alone (sequence parallelism) */
  float *dgwk0 = devf(c, NULL, T * K);
  c->k->moe_dispatch_backward(c->s, dgh, dgwk0, dgs, dgsw, droute, T, K, 0, false);
  compare(c, "moe dispatch B dweights alone (C = 0)", gwk, dgwk0, T * K, 0);
  float *m = g_new(float, T *C), *dm = devf(c, NULL, T * C);
  kernels_moe_combine_forward(m, gs, route, T, K, C);
  c->k->moe_combine_forward(c->s, dm, dgs, droute, T, K, C);
  compare(c, "moe combine F", m, dm, T * C, TOL_PLAIN);
  float *gm = rnd(c, T * C, 1), *dgm = devf(c, gm, T * C);
  float *gy = g_new(float, T *K *C), *dgy = devf(c, NULL, T * K * C);
  kernels_moe_combine_backward(gy, gm, route, T, K, C);
  c->k->moe_combine_backward(c->s, dgy, dgm, droute, T, K, C);
  compare(c, "moe combine B dy", gy, dgy, T * K * C, 0);
}

static void check_expert_ffn(struct check *c) {
  enum { N = 40, E0 = 2, EC = 4 };
  int32_t rexp[N];
  for (int r = 0; r < N; r++)
    rexp[r] = E0 + (int32_t)g_rand_int_range(c->rng, 0, EC - 1); /* expert E0+EC-1 gets none */
  size_t P = kernels_expert_ffn_param_count(EC, C, F),
         SV = kernels_expert_ffn_saved_floats(N, C, F);
  size_t BW = kernels_expert_ffn_bwork_floats(N, C, F),
         SC = kernels_expert_ffn_scratch_floats(N, C);
  float *p = rnd(c, P, 0.2f), *in = rnd(c, N * C, 1), *out = g_new(float, N *C);
  float *rw = rnd(c, N, 1), *drw = devf(c, rw, N); /* routing weights, signs mixed */
  float *saved = g_new(float, SV), *bwork = g_new(float, BW), *scratch = g_new(float, SC);
  float *dp = devf(c, p, P), *din = devf(c, in, N * C), *dout = devf(c, NULL, N * C);
  float *dsaved = devf(c, NULL, SV), *dbw = devf(c, NULL, BW), *dscr = devf(c, NULL, SC);
  int32_t *drexp = dev(c, rexp, sizeof rexp);
  kernels_expert_ffn_forward(out, saved, NULL, NULL, scratch, in, rexp, rw, N, p, E0, EC, C, F);
  c->k->expert_ffn_forward(c->s, dout, dsaved, NULL, NULL, dscr, din, drexp, drw, N, dp, E0, EC, C,
                           F);
  compare(c, "expert_ffn F", out, dout, N * C, c->tol_gemm);
  compare(c, "expert_ffn F saved (grouped)", saved, dsaved, SV, c->tol_gemm);
  exec_backend_from_host(c->b, dsaved, saved, SV * sizeof(float));
  /* moe_act's rerun: silu(g)·u·w from the host's g, u and weights, elementwise (the host's
   * act); with act apart the weights follow u, so the rerun reads a copy laid out so */
  size_t NA = (size_t)N * F, GU = (size_t)N * 2 * F;
  float *apart = g_new(float, SV - NA);
  memcpy(apart, saved, GU * sizeof(float));
  memcpy(apart + GU, saved + GU + NA, (SV - GU - NA) * sizeof(float));
  float *dapart = devf(c, apart, SV - NA), *dact = devf(c, NULL, NA);
  c->k->expert_ffn_act_forward(c->s, dact, dapart, N, C, F);
  compare(c, "expert_ffn act rerun (moe_act)", saved + GU, dact, NA, c->tol_gemm);
  float *g = rnd(c, N * C, 1), *dg = devf(c, g, N * C);
  float *gi = rnd(c, N * C, 1), *dgi = devf(c, gi, N * C);
  float *grw = g_new(float, N), *dgrw = devf(c, NULL, N);
  kernels_expert_ffn_backward_input(gi, grw, bwork, scratch, g, rexp, N, saved, NULL, p, E0, EC, C,
                                    F, true);
  c->k->expert_ffn_backward_input(c->s, dgi, dgrw, dbw, dscr, dg, drexp, N, dsaved, NULL, dp, E0,
                                  EC, C, F, true);
  compare(c, "expert_ffn BI (accumulate)", gi, dgi, N * C, c->tol_gemm);
  compare(c, "expert_ffn BI routing weights' gradient", grw, dgrw, N, c->tol_gemm);
  compare(c, "expert_ffn BI bwork", bwork, dbw, BW, c->tol_gemm);
  exec_backend_from_host(c->b, dbw, bwork, BW * sizeof(float));
  float *gp = rnd(c, P, 0.1f), *dgp = devf(c, gp, P), *dgp2 = devf(c, gp, P);
  float *dgp3 = devf(c, gp, P);
  kernels_expert_ffn_backward_weight(gp, bwork, rexp, N, saved, NULL, NULL, E0, EC, C, F);
  c->k->expert_ffn_backward_weight(c->s, dgp, dbw, drexp, N, dsaved, NULL, NULL, E0, EC, C, F);
  compare(c, "expert_ffn BW", gp, dgp, P, c->tol_gemm);
  /* the weight gradient with act apart (the rerun's buffer) */
  c->k->expert_ffn_backward_weight(c->s, dgp2, dbw, drexp, N, dapart, dact, NULL, E0, EC, C, F);
  compare(c, "expert_ffn BW, act apart", gp, dgp2, P, c->tol_gemm);
  /* ... and with the inputs apart (where the executor keeps their FP8 copy instead): the
   * host's xs, last in saved */
  float *dxs = devf(c, saved + GU + NA + N, (size_t)N * C);
  c->k->expert_ffn_backward_weight(c->s, dgp3, dbw, drexp, N, dsaved, NULL, dxs, E0, EC, C, F);
  compare(c, "expert_ffn BW, inputs apart", gp, dgp3, P, c->tol_gemm);
}

static void check_lm_head(struct check *c, enum kernels_lm_head_layout layout) {
  const char *name = layout == KERNELS_LM_HEAD_TIED ? "tied" : "untied";
  char what[64];
  int32_t tg[T];
  for (int t = 0; t < T; t++)
    tg[t] = (int32_t)g_rand_int_range(c->rng, 0, V);
  float *p = rnd(c, (size_t)C * V, 0.2f), *h = rnd(c, T * C, 1), *saved = g_new(float, T *V);
  float *dp = devf(c, p, (size_t)C * V), *dh = devf(c, h, T * C), *dsaved = devf(c, NULL, T * V);
  float *dloss = devf(c, NULL, 1);
  int32_t *dtg = dev(c, tg, sizeof tg);
  float loss;
  kernels_lm_head_loss_forward(&loss, saved, h, tg, p, layout, T, C, V);
  c->k->lm_head_loss_forward(c->s, dloss, dsaved, dh, dtg, dp, layout, T, C, V);
  g_snprintf(what, sizeof what, "lm_head_loss F %s (loss)", name);
  compare(c, what, &loss, dloss, 1, c->tol_gemm);
  g_snprintf(what, sizeof what, "lm_head_loss F %s saved (row max, 1 / sum)", name);
  compare(c, what, saved, dsaved, 2 * T, c->tol_gemm);
  exec_backend_from_host(c->b, dsaved, saved, 2 * T * sizeof(float));
  float *gh = g_new0(float, T *C), *dgh = devf(c, NULL, T * C);
  float *bw = g_new(float, T *V), *dbw = devf(c, NULL, T * V);
  kernels_lm_head_loss_backward_input(gh, bw, saved, h, tg, p, layout, 0.5f, T, C, V, false);
  c->k->lm_head_loss_backward_input(c->s, dgh, dbw, dsaved, dh, dtg, dp, layout, 0.5f, T, C, V,
                                    false);
  g_snprintf(what, sizeof what, "lm_head_loss BI %s", name);
  compare(c, what, gh, dgh, T * C, c->tol_gemm);
  float *gp = rnd(c, (size_t)C * V, 0.1f), *dgp = devf(c, gp, (size_t)C * V);
  kernels_lm_head_loss_backward_weight(gp, bw, saved, h, tg, p, layout, 0.5f, T, C, V);
  c->k->lm_head_loss_backward_weight(c->s, dgp, dbw, dsaved, dh, dtg, dp, layout, 0.5f, T, C, V);
  g_snprintf(what, sizeof what, "lm_head_loss BW %s", name);
  compare(c, what, gp, dgp, (size_t)C * V, c->tol_gemm);
}

/* Tensor parallelism's vocabulary slice: rows [lo, lo + n) of V, tokens and targets drawn
 * over the whole vocabulary (some in the slice, most not): the embedding's rows and zeros and
 * its gradient; the head's row statistics, their merge over a group of 2 (the second rank's
 * statistics drawn), and its backward (dh = the slice's partial sum, dw +=). */
static void check_tp(struct check *c, enum kernels_lm_head_layout layout) {
  enum { LO = 40, N = 33, TP = 2 };
  const char *name = layout == KERNELS_LM_HEAD_TIED ? "tied" : "untied";
  char what[80];
  int32_t tok[T];
  for (int t = 0; t < T; t++)
    tok[t] = (int32_t)g_rand_int_range(c->rng, 0, V);
  int32_t *dtok = dev(c, tok, sizeof tok);
  size_t TC = (size_t)T * C, P = (size_t)N * C;
  float *tab = rnd(c, P, 1), *x = g_new(float, TC), *dx = rnd(c, TC, 1), *gt = rnd(c, P, 1);
  float *dtab = devf(c, tab, P), *dxo = devf(c, NULL, TC), *ddx = devf(c, dx, TC);
  float *dgt = devf(c, gt, P);
  kernels_tp_embedding_forward(x, tok, tab, T, C, LO, N);
  c->k->tp_embedding_forward(c->s, dxo, dtok, dtab, T, C, LO, N);
  compare(c, "tp embedding F (slice rows, zeros)", x, dxo, TC, 0);
  kernels_tp_embedding_backward(gt, dx, tok, T, C, LO, N);
  c->k->tp_embedding_backward(c->s, dgt, ddx, dtok, T, C, LO, N);
  compare(c, "tp embedding BW", gt, dgt, P, TOL_PLAIN);
  /* the head: w [C, N] untied, or the table's rows [N, C] tied */
  float *h = rnd(c, TC, 1), *dh_in = devf(c, h, TC);
  float *gathered = g_new(float, (size_t)TP * 3 * T), *saved = g_new(float, 2 * T);
  float *dgathered = devf(c, NULL, (size_t)TP * 3 * T), *dsaved = devf(c, NULL, 2 * T);
  float *dloss = devf(c, NULL, 1);
  kernels_tp_head_stats(gathered, h, tok, tab, layout, T, C, LO, N);
  c->k->tp_head_stats(c->s, dgathered, dh_in, dtok, dtab, layout, T, C, LO, N);
  g_snprintf(what, sizeof what, "tp lm_head stats %s (max, sum of exp, target)", name);
  compare(c, what, gathered, dgathered, 3 * (size_t)T, c->tol_gemm);
  for (int t = 0; t < T; t++) { /* rank 1's statistics */
    gathered[3 * T + t] = (float)g_rand_double_range(c->rng, -2, 2);
    gathered[4 * T + t] = (float)g_rand_double_range(c->rng, 1, 40);
    gathered[5 * T + t] = (float)g_rand_double_range(c->rng, -1, 1);
  }
  exec_backend_from_host(c->b, dgathered, gathered, (size_t)TP * 3 * T * sizeof(float));
  float loss;
  kernels_tp_head_combine(&loss, saved, gathered, TP, T);
  c->k->tp_head_combine(c->s, dloss, dsaved, dgathered, TP, T);
  compare(c, "tp lm_head combine (loss)", &loss, dloss, 1, TOL_PLAIN);
  compare(c, "tp lm_head combine saved (max, 1 / sum)", saved, dsaved, 2 * (size_t)T, TOL_PLAIN);
  float *gh = g_new(float, TC), *dgh = devf(c, NULL, TC), *gw = rnd(c, P, 0.1f);
  float *dgw = devf(c, gw, P);
  kernels_tp_head_backward(gh, gw, saved, h, tok, tab, layout, 0.5f, T, C, LO, N);
  c->k->tp_head_backward(c->s, dgh, dgw, dsaved, dh_in, dtok, dtab, layout, 0.5f, T, C, LO, N);
  g_snprintf(what, sizeof what, "tp lm_head B %s dh (partial)", name);
  compare(c, what, gh, dgh, TC, c->tol_gemm);
  g_snprintf(what, sizeof what, "tp lm_head B %s dw", name);
  compare(c, what, gw, dgw, P, c->tol_gemm);
  float *bufs[] = {dtab, dxo, ddx, dgt, dh_in, dgathered, dsaved, dloss, dgh, dgw};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    exec_backend_release(c->b, bufs[i]);
  exec_backend_release(c->b, dtok);
  float *host[] = {tab, x, dx, gt, h, gathered, saved, gh, gw};
  for (size_t i = 0; i < G_N_ELEMENTS(host); i++)
    g_free(host[i]);
}

/* The GEMMs' bf16 operand copies, bit for bit against the host twin exec_bf16_round: a
 * contiguous matrix and a strided view (a head's columns), with exact ties (1 + 2^-8 rounds
 * down to 1, 1 + 3 * 2^-8 up to 1 + 2^-6), a subnormal tie, an overflow to infinity and an
 * infinity; a NaN must stay a NaN (its bits are the PTX conversion's: only NaN-ness is
 * checked). */
static void check_bf16_copy(struct check *c) {
  enum { R = 37, LD = 53, W = 29 };
  float *x = rnd(c, (size_t)R * LD, 3);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x80000000u,
                              0x00018000u, 0x7f7fffffu, 0xff800000u};
  for (size_t i = 0; i < G_N_ELEMENTS(special); i++)
    memcpy(&x[i], &special[i], sizeof(float));
  x[G_N_ELEMENTS(special)] = NAN;
  float *dx = devf(c, x, (size_t)R * LD);
  uint16_t *d16 = dev(c, NULL, (size_t)R * LD * sizeof(uint16_t));
  uint16_t *got = g_new(uint16_t, (size_t)R * LD);
  for (int strided = 0; strided < 2; strided++) {
    int cols = strided ? W : LD;
    /* the upload went on the backend's own (non-blocking) setup stream: wait for it */
    bool synced = cudaDeviceSynchronize() == cudaSuccess;
    kc_to_bf16(d16, dx + (strided ? 3 : 0), R, cols, LD, 0);
    exec_backend_to_host(c->b, got, d16, (size_t)R * cols * sizeof(uint16_t));
    size_t bad = 0;
    for (int r = 0; r < R; r++)
      for (int k = 0; k < cols; k++) {
        float xi = x[(size_t)r * LD + k + (strided ? 3 : 0)];
        uint16_t g = got[(size_t)r * cols + k];
        bad += isnan(xi) ? !isnan(exec_bf16_to_f32(g)) : g != exec_bf16_round(xi);
      }
    bool ok = synced && bad == 0 && cudaGetLastError() == cudaSuccess;
    printf("%-4s %-44s %zu of %d differ\n", ok ? "ok" : "FAIL",
           strided ? "bf16 operand copy, strided view" : "bf16 operand copy, contiguous", bad,
           R * cols);
    c->run++;
    c->failed += !ok;
  }
  g_free(got);
  g_free(x);
  exec_backend_release(c->b, dx);
  exec_backend_release(c->b, d16);
}

/* Two device results that must be the same bits (same=true), or must differ. */
static void compare_bits(struct check *c, const char *what, const float *d1, const float *d2,
                         size_t n, bool same) {
  float *x = g_new(float, n), *y = g_new(float, n);
  exec_backend_to_host(c->b, x, d1, n * sizeof(float));
  exec_backend_to_host(c->b, y, d2, n * sizeof(float));
  const GError *e = exec_stream_error(c->b, c->s);
  bool equal = memcmp(x, y, n * sizeof(float)) == 0;
  bool ok = !e && equal == same;
  printf("%-4s %-44s %s%s\n", ok ? "ok" : "FAIL", what, equal ? "same bits" : "differ",
         e ? e->message : "");
  c->run++;
  c->failed += !ok;
  g_free(x);
  g_free(y);
}

/* The cached bf16 weight copies (bf16 GEMMs only). An MLP forward before the optimizer has
 * registered the weights' store converts them per GEMM; after it (AdamW with lr 0 and zero
 * gradients: the weights stay as they are) the first forward makes the copies and the second
 * reuses them: all three the same bits (the same bf16 operands, alignment and algorithm).
 * After a write through from_host, and one through AdamW, the forward matches one over a
 * plain copy of the new weights (converted per GEMM) bit for bit, and differs from the old:
 * the copies went stale and were made again. */
static void check_weight_copies(struct check *c, bool bf16) {
  if (!bf16) {
    printf("skip bf16 weight copies (fp32 GEMMs)\n");
    return;
  }
  size_t P = kernels_mlp_param_count(C, F), SV = kernels_mlp_saved_floats(T, F), n = T * C;
  float *p = rnd(c, P, 0.2f), *h = rnd(c, n, 1), *zero = g_new0(float, P);
  float *dp = devf(c, p, P), *dref = devf(c, NULL, P), *dh = devf(c, h, n);
  float *dsaved = devf(c, NULL, SV), *dm[4];
  for (int i = 0; i < 4; i++)
    dm[i] = devf(c, NULL, n);
  float *dg = devf(c, zero, P), *dmo = devf(c, zero, P), *dv = devf(c, zero, P);
  c->k->mlp_forward(c->s, dm[0], dsaved, dh, dp, T, C, F);
  c->k->adamw_step(c->s, dp, dg, dmo, dv, P, 0.0f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  c->k->mlp_forward(c->s, dm[1], dsaved, dh, dp, T, C, F);
  c->k->mlp_forward(c->s, dm[2], dsaved, dh, dp, T, C, F);
  compare_bits(c, "weight copies: made = converted per GEMM", dm[0], dm[1], n, true);
  compare_bits(c, "weight copies: reused = made", dm[1], dm[2], n, true);
  /* a load (a checkpoint's weights) */
  float *p2 = rnd(c, P, 0.2f);
  exec_backend_from_host(c->b, dp, p2, P * sizeof(float));
  exec_backend_from_host(c->b, dref, p2, P * sizeof(float));
  c->k->mlp_forward(c->s, dm[1], dsaved, dh, dp, T, C, F);
  c->k->mlp_forward(c->s, dm[3], dsaved, dh, dref, T, C, F);
  compare_bits(c, "weight copies: after a load = per GEMM", dm[1], dm[3], n, true);
  compare_bits(c, "weight copies: after a load != before", dm[1], dm[2], n, false);
  /* an optimizer step */
  float *g = rnd(c, P, 1);
  exec_backend_from_host(c->b, dg, g, P * sizeof(float));
  c->k->adamw_step(c->s, dp, dg, dmo, dv, P, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  c->k->copy(c->s, dref, dp, P * sizeof(float));
  c->k->mlp_forward(c->s, dm[2], dsaved, dh, dp, T, C, F);
  c->k->mlp_forward(c->s, dm[3], dsaved, dh, dref, T, C, F);
  compare_bits(c, "weight copies: after AdamW = per GEMM", dm[2], dm[3], n, true);
  compare_bits(c, "weight copies: after AdamW != before", dm[2], dm[1], n, false);
  float *bufs[] = {dp, dref, dh, dsaved, dm[0], dm[1], dm[2], dm[3], dg, dmo, dv};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    exec_backend_release(c->b, bufs[i]);
  g_free(p);
  g_free(p2);
  g_free(g);
  g_free(h);
  g_free(zero);
}

/* The multi-tensor AdamW (one launch over a table, kc_adamw_multi) against the host reference
 * (TOL_PLAIN, as adamw_step: the same fp32 formula, sqrtf and division may differ by an ulp on
 * a GPU) and against adamw_step on the device tensor by tensor (the same bits: the same
 * adamw_one per element). Tensors: one element; one across a chunk boundary (4097); one at an
 * odd float offset (no 16-byte vectors) with a tail; an empty one; one of several chunks. */
static void check_adamw_multi(struct check *c) {
  enum { NT = 5 };
  const size_t len[NT] = {1, KC_ADAMW_CHUNK + 1, 1003, 0, 3 * KC_ADAMW_CHUNK + 7};
  const size_t at[NT] = {0, 4, KC_ADAMW_CHUNK + 5 + 1, 0, KC_ADAMW_CHUNK + 1100};
  size_t n = at[NT - 1] + len[NT - 1];
  float *p = rnd(c, n, 1), *g = rnd(c, n, 1), *m = rnd(c, n, 0.1f), *v = rnd(c, n, 0.1f);
  for (size_t i = 0; i < n; i++)
    v[i] = fabsf(v[i]);
  float *dev_[2][4];
  for (int k = 0; k < 2; k++) {
    dev_[k][0] = devf(c, p, n), dev_[k][1] = devf(c, g, n);
    dev_[k][2] = devf(c, m, n), dev_[k][3] = devf(c, v, n);
  }
  struct kernels_adamw_tensor host[NT], gpu[NT];
  for (int t = 0; t < NT; t++) {
    host[t] = (struct kernels_adamw_tensor){p + at[t], g + at[t], m + at[t], v + at[t], len[t]};
    gpu[t] = (struct kernels_adamw_tensor){dev_[0][0] + at[t], dev_[0][1] + at[t],
                                           dev_[0][2] + at[t], dev_[0][3] + at[t], len[t]};
    c->k->adamw_step(c->s, dev_[1][0] + at[t], dev_[1][1] + at[t], dev_[1][2] + at[t],
                     dev_[1][3] + at[t], len[t], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  }
  kernels_adamw_multi(host, NT, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  c->k->adamw_multi(c->s, gpu, NT, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  compare(c, "adamw multi-tensor params", p, dev_[0][0], n, TOL_PLAIN);
  compare(c, "adamw multi-tensor m", m, dev_[0][2], n, TOL_PLAIN);
  compare(c, "adamw multi-tensor v", v, dev_[0][3], n, TOL_PLAIN);
  compare_bits(c, "adamw multi-tensor = per tensor (params)", dev_[0][0], dev_[1][0], n, true);
  compare_bits(c, "adamw multi-tensor = per tensor (v)", dev_[0][3], dev_[1][3], n, true);
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 4; j++)
      exec_backend_release(c->b, dev_[k][j]);
  g_free(p), g_free(g), g_free(m), g_free(v);
}

/* The cuda table has every op of exec/ops.def (it is generated from the list: a k_ function
 * per kernel, an exec_cuda_ function per collective). */
/* ---- bf16 activations (kc_bf16_*, kernels/cuda_bf16.cu) ------------------------------------
 * Each kernel against the host reference run in fp32 on the same inputs: random values rounded
 * to bf16 on the host first (the kernels' inputs are bf16, so that rounding is not theirs; fp32
 * inputs, the norm weights, rstd and the embedding table, stay as they are). A kernel widens
 * its inputs exactly, computes in fp32 as the fp32 kernel does, and rounds each output once to
 * nearest even: that moves it by at most half a bf16 spacing, a relative 2^-8 (8 significant
 * bits; the unit roundoff u of exec_bf16_round's test), and the fp32 arithmetic adds the plain
 * tolerance (the inputs are exact in fp32, so no input rounding compounds: one op, one rounding). So the norm-wise error is at most u + TOL_PLAIN. A kernel that truncated instead
 * of rounding (up to 2u), rounded twice, or read its input at the wrong width fails it. The
 * fp32 outputs (rstd, the weight gradients: sums in fp32 of exactly widened terms) keep
 * TOL_PLAIN. */
#define TOL_BF16_STORE (1.0 / 256 + TOL_PLAIN)

/* n random values in [-scale, scale] rounded to bf16: the values (returned) and their bits */
static float *rnd16(struct check *c, size_t n, float scale, uint16_t **bits) {
  float *x = rnd(c, n, scale);
  *bits = g_new(uint16_t, n ? n : 1);
  for (size_t i = 0; i < n; i++) {
    (*bits)[i] = exec_bf16_round(x[i]);
    x[i] = exec_bf16_to_f32((*bits)[i]);
  }
  return x;
}

/* Compares n bf16 values of device memory d (widened) with the host's fp32 ref. */
static void compare16(struct check *c, const char *what, const float *ref, const uint16_t *d,
                      size_t n, double tol) {
  uint16_t *bits = g_new(uint16_t, n ? n : 1);
  float *got = g_new(float, n ? n : 1);
  bool synced = cudaDeviceSynchronize() == cudaSuccess;
  exec_backend_to_host(c->b, bits, d, n * sizeof(uint16_t));
  for (size_t i = 0; i < n; i++)
    got[i] = exec_bf16_to_f32(bits[i]);
  if (!synced)
    got[0] = NAN;
  compare_values(c, what, ref, got, n, tol);
  g_free(got);
  g_free(bits);
}

static uint16_t *dev16(struct check *c, const uint16_t *bits, size_t n) {
  return dev(c, bits, n * sizeof(uint16_t));
}

/* RMSNorm forward (alone and after the residual add), BI and BW on bf16 x, h, dh, dx */
static void check_bf16_norm(struct check *c) {
  size_t n = (size_t)T * C;
  uint16_t *xb, *yb, *gb, *db;
  float *x = rnd16(c, n, 2, &xb), *y = rnd16(c, n, 2, &yb), *w = rnd(c, C, 1);
  float *gdh = rnd16(c, n, 1, &gb), *gdx = rnd16(c, n, 1, &db);
  float *h = g_new(float, n), *rs = g_new(float, T), *gw = rnd(c, C, 1);
  uint16_t *dx = dev16(c, xb, n), *dy = dev16(c, yb, n), *dh = dev16(c, NULL, n);
  uint16_t *ddh = dev16(c, gb, n), *ddx = dev16(c, db, n);
  float *dw = devf(c, w, C), *drs = devf(c, NULL, T), *dgw = devf(c, gw, C);
  cudaDeviceSynchronize(); /* the uploads went on the backend's setup stream */
  kernels_rmsnorm_forward(h, rs, x, w, T, C, 1e-6f);
  kc_bf16_rmsnorm_forward(dh, drs, dx, dw, T, C, 1e-6f, 0);
  compare16(c, "bf16 rmsnorm F", h, dh, n, TOL_BF16_STORE);
  compare(c, "bf16 rmsnorm F saved (rstd, fp32)", rs, drs, T, TOL_PLAIN);
  kernels_rmsnorm_backward_input(gdx, gdh, x, rs, w, T, C, true);
  kc_bf16_rmsnorm_backward_input(ddx, ddh, dx, drs, dw, T, C, true, 0);
  compare16(c, "bf16 rmsnorm BI (accumulate)", gdx, ddx, n, TOL_BF16_STORE);
  kernels_rmsnorm_backward_weight(gw, gdh, x, rs, T, C);
  kc_bf16_rmsnorm_backward_weight(dgw, ddh, dx, drs, T, C, 0);
  compare(c, "bf16 rmsnorm BW (fp32 dw)", gw, dgw, C, TOL_PLAIN);
  /* the residual add rounds the sum into the stream; the norm reads the rounded sum */
  float *sum = g_new(float, n);
  for (size_t i = 0; i < n; i++)
    sum[i] = exec_bf16_to_f32(exec_bf16_round(x[i] + y[i]));
  kernels_rmsnorm_forward(h, rs, sum, w, T, C, 1e-6f);
  kc_bf16_residual_rmsnorm_forward(dx, dh, drs, dy, dw, T, C, 1e-6f, 0);
  compare16(c, "bf16 residual + rmsnorm F (x)", sum, dx, n, 0);
  compare16(c, "bf16 residual + rmsnorm F (h)", h, dh, n, TOL_BF16_STORE);
  compare(c, "bf16 residual + rmsnorm F saved (rstd)", rs, drs, T, TOL_PLAIN);
  /* the gradient's accumulation into a bf16 buffer, and the plain copy */
  for (size_t i = 0; i < n; i++)
    sum[i] = y[i] + gdh[i];
  kc_bf16_add(ddh, dy, n, true, 0);
  compare16(c, "bf16 add (accumulate)", sum, ddh, n, TOL_BF16_STORE);
  kc_bf16_add(ddh, dy, n, false, 0);
  compare16(c, "bf16 add (copy)", y, ddh, n, 0);
  g_free(sum);
}

/* RoPE in place on bf16 q rows (llama3 scaling), SwiGLU F and B, the embedding F and BW */
static void check_bf16_pointwise(struct check *c) {
  size_t nq = (size_t)T * H * D, nf = (size_t)T * F;
  uint16_t *qb, *gb, *ub, *ab;
  float *q = rnd16(c, nq, 2, &qb);
  struct kernels_rope_scaling sc = {8.0f, 1.0f, 4.0f, 8};
  uint16_t *dq = dev16(c, qb, nq);
  cudaDeviceSynchronize();
  for (int inverse = 0; inverse < 2; inverse++) {
    kernels_rope_scaled(q, B, S, H, D, 10000.0f, &sc, inverse);
    kc_bf16_rope(dq, B, S, H, D, 10000.0f, sc.factor, sc.low_freq_factor, sc.high_freq_factor,
                 sc.original_max_position_embeddings, inverse, 0);
    compare16(c, inverse ? "bf16 rope (inverse, after forward)" : "bf16 rope (llama3 scaling)",
              q, dq, nq, TOL_BF16_STORE);
    for (size_t i = 0; i < nq; i++) /* the inverse reads what the forward stored */
      q[i] = exec_bf16_to_f32(exec_bf16_round(q[i]));
  }
  float *g = rnd16(c, nf, 4, &gb), *u = rnd16(c, nf, 2, &ub), *da = rnd16(c, nf, 1, &ab);
  float *act = g_new(float, nf), *du = g_new(float, nf);
  uint16_t *dg = dev16(c, gb, nf), *dU = dev16(c, ub, nf), *dd = dev16(c, ab, nf);
  uint16_t *dact = dev16(c, NULL, nf), *ddg = dev16(c, NULL, nf), *ddu = dev16(c, NULL, nf);
  cudaDeviceSynchronize();
  kernels_impl_swiglu_forward(act, g, u, nf);
  kc_bf16_swiglu_forward(dact, dg, dU, nf, 0);
  compare16(c, "bf16 swiglu F", act, dact, nf, TOL_BF16_STORE);
  kernels_impl_swiglu_backward(da, du, g, u, nf); /* da: dact in, dg out */
  kc_bf16_swiglu_backward(ddg, ddu, dd, dg, dU, nf, 0);
  compare16(c, "bf16 swiglu B (dg)", da, ddg, nf, TOL_BF16_STORE);
  compare16(c, "bf16 swiglu B (du)", du, ddu, nf, TOL_BF16_STORE);
  /* the embedding: a rounded copy of the fp32 table's rows (exact against the rounded rows);
   * its gradient fp32 sums of the widened bf16 rows in token order */
  int32_t tok[T];
  for (int t = 0; t < T; t++)
    tok[t] = (int32_t)g_rand_int_range(c->rng, 0, 7);
  uint16_t *xb;
  float *wte = rnd(c, (size_t)V * C, 1), *x = g_new(float, T *C), *gx = rnd16(c, T * C, 1, &xb);
  int32_t *dtok = dev(c, tok, sizeof tok);
  float *dwte = devf(c, wte, (size_t)V * C);
  uint16_t *dx = dev16(c, NULL, T * C), *dgx = dev16(c, xb, T * C);
  cudaDeviceSynchronize();
  kernels_embedding_forward(x, tok, wte, T, V, C);
  for (int i = 0; i < T * C; i++)
    x[i] = exec_bf16_to_f32(exec_bf16_round(x[i]));
  kc_bf16_embedding_forward(dx, dtok, dwte, T, C, 0, INT_MAX, 0);
  compare16(c, "bf16 embedding F", x, dx, T * C, 0);
  kernels_embedding_backward_weight(wte, gx, tok, T, V, C);
  kc_bf16_embedding_backward(dwte, dgx, dtok, T, C, 0, INT_MAX, 0);
  cudaDeviceSynchronize();
  compare(c, "bf16 embedding BW (fp32 dtable)", wte, dwte, (size_t)V * C, TOL_PLAIN);
}

/* DeepSeek-V3's FP8 cache of the routed rows (fp8_expert_inputs): the device's e4m3 bytes and
 * tile factors are the host reference's bit for bit (the same encoder, the same amax and
 * 448 / amax in fp32), and so is the dequantised copy the weight gradient reads. A row of
 * 200: one whole 1 x 128 tile and a partial one; an all-zero row (factor 1, bytes 0); values
 * over three decades, so that some tiles hold e4m3 subnormals. */
static void check_fp8_rows(struct check *c) {
  enum { NR = 5, CR = 200, NK = (CR + 127) / 128 };
  float *x = rnd(c, (size_t)NR * CR, 1);
  for (int i = 0; i < CR; i++)
    x[CR + i] = 0.0f, x[2 * CR + i] *= i % 3 ? 1e-5f : 4.0f;
  uint8_t q[NR * CR], gq[NR * CR];
  float inv[NR * NK], ginv[NR * NK], *back = g_new(float, (size_t)NR *CR);
  kernels_fp8_rows_quantize(q, inv, x, NR, CR);
  kernels_fp8_rows_dequantize(back, q, inv, NR, CR);
  float *dx = devf(c, x, (size_t)NR * CR), *dinv = devf(c, NULL, NR * NK);
  float *dback = devf(c, NULL, (size_t)NR * CR);
  uint8_t *dq = dev(c, NULL, sizeof q);
  c->k->fp8_rows_quantize(c->s, dq, dinv, dx, NR, CR);
  c->k->fp8_rows_dequantize(c->s, dback, dq, dinv, NR, CR);
  exec_backend_to_host(c->b, gq, dq, sizeof gq);
  exec_backend_to_host(c->b, ginv, dinv, sizeof ginv);
  const GError *e = exec_stream_error(c->b, c->s);
  bool ok = !e && memcmp(q, gq, sizeof q) == 0 && memcmp(inv, ginv, sizeof inv) == 0;
  printf("%-4s %-44s %s%s\n", ok ? "ok" : "FAIL", "fp8 routed rows: e4m3 bytes and factors",
         ok ? "same bits as the host" : "differ", e ? e->message : "");
  c->run++;
  c->failed += !ok;
  float *hback = devf(c, back, (size_t)NR * CR);
  compare_bits(c, "fp8 routed rows: dequantised", hback, dback, (size_t)NR * CR, true);
  g_free(x);
  g_free(back);
  exec_backend_release(c->b, dx);
  exec_backend_release(c->b, dinv);
  exec_backend_release(c->b, dback);
  exec_backend_release(c->b, dq);
  exec_backend_release(c->b, hback);
}

/* ---- the kernel table for bf16 activations (exec_cuda_kernels_act_bf16) ---------------------
 * Its shape first: an op keeps its fp32 entry only where it touches no activation (a copy of
 * bytes, gradient clipping, AdamW); every other entry is converted (its own) or NULL (refused
 * by name). An fp32 entry left in by mistake would read bf16 bits as floats: that fails here.
 * Then each converted entry through the table, against the host reference on bf16-rounded
 * inputs at the kc_bf16_* kernels' tolerance (one rounding of each bf16 output; rstd and the
 * weights' gradients fp32). */
static bool act_free_op(const char *name) {
  static const char *const free_ops[] = {"copy",       "sum_squares", "scale",
                                         "adamw_step", "adamw_multi", "tp_head_combine"};
  for (size_t i = 0; i < G_N_ELEMENTS(free_ops); i++)
    if (strcmp(name, free_ops[i]) == 0)
      return true;
  return false;
}

static void check_act16_shape(struct check *c, const struct exec_kernels *k16) {
  struct {
    const char *name;
    void (*fp32)(void), (*bf16)(void);
  } ops[] = {
#define EXEC_KERNEL(name, use, params, args)                                                       \
  {#name, (void (*)(void))c->k->name, (void (*)(void))k16->name},
#define EXEC_COLLECTIVE(name, use, params, args, pre)
#include "../../exec/ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
  };
  int converted = 0, wrong = 0;
  for (size_t i = 0; i < G_N_ELEMENTS(ops); i++) {
    bool same = ops[i].bf16 == ops[i].fp32, free_op = act_free_op(ops[i].name);
    if (ops[i].bf16 && same != free_op) {
      printf("FAIL bf16-activation table: %s %s\n", ops[i].name,
             same ? "is the fp32 entry" : "is not the fp32 entry, and touches no activation");
      wrong++;
    }
    converted += ops[i].bf16 && !same;
  }
  printf("%-4s %-44s %d of %zu ops converted\n", wrong ? "FAIL" : "ok",
         "bf16-activation table (exec_cuda_kernels_act_bf16)", converted, G_N_ELEMENTS(ops));
  c->run++;
  c->failed += wrong > 0;
}

/* widened bf16 device buffer d [n] (float * of the op list) */
#define F16(p) ((float *)(void *)(p))

static void check_act16_mlp(struct check *c, const struct exec_kernels *k16);
static void check_act16_attention(struct check *c, const struct exec_kernels *k16);
static void check_act16_lm_head(struct check *c, const struct exec_kernels *k16,
                                enum kernels_lm_head_layout layout);
static void check_act16_tp(struct check *c, const struct exec_kernels *k16,
                           enum kernels_lm_head_layout layout);

static void check_act16_table(struct check *c) {
  struct exec_kernels k16;
  exec_cuda_kernels_act_bf16(&k16);
  check_act16_shape(c, &k16);
  size_t n = (size_t)T * C;
  uint16_t *xb, *yb, *gb, *db;
  float *x = rnd16(c, n, 2, &xb), *y = rnd16(c, n, 2, &yb), *w = rnd(c, C, 1);
  float *gdh = rnd16(c, n, 1, &gb), *gdx = rnd16(c, n, 1, &db), *gw = rnd(c, C, 1);
  float *h = g_new(float, n), *rs = g_new(float, T), *ref = g_new(float, n);
  uint16_t *dx = dev16(c, xb, n), *dy = dev16(c, yb, n), *dh = dev16(c, NULL, n);
  uint16_t *ddh = dev16(c, gb, n), *ddx = dev16(c, db, n);
  float *dw = devf(c, w, C), *drs = devf(c, NULL, T), *dgw = devf(c, gw, C);
  cudaDeviceSynchronize(); /* the uploads went on the backend's setup stream */
  kernels_rmsnorm_forward(h, rs, x, w, T, C, 1e-6f);
  k16.rmsnorm_forward(c->s, F16(dh), drs, F16(dx), dw, T, C, 1e-6f);
  compare16(c, "act bf16: rmsnorm F", h, dh, n, TOL_BF16_STORE);
  compare(c, "act bf16: rmsnorm F saved (rstd, fp32)", rs, drs, T, TOL_PLAIN);
  kernels_rmsnorm_backward(gdx, gw, gdh, x, rs, w, T, C, true);
  k16.rmsnorm_backward(c->s, F16(ddx), dgw, F16(ddh), F16(dx), drs, dw, T, C, true);
  compare16(c, "act bf16: rmsnorm B (dx, accumulate)", gdx, ddx, n, TOL_BF16_STORE);
  compare(c, "act bf16: rmsnorm B (dw, fp32)", gw, dgw, C, TOL_PLAIN);
  /* the residual add rounds its sum into the stream; the norm reads the rounded sum */
  for (size_t i = 0; i < n; i++)
    ref[i] = exec_bf16_to_f32(exec_bf16_round(x[i] + y[i]));
  kernels_rmsnorm_forward(h, rs, ref, w, T, C, 1e-6f);
  k16.residual_rmsnorm_forward(c->s, F16(dx), F16(dh), drs, F16(dy), dw, T, C, 1e-6f);
  compare16(c, "act bf16: residual + rmsnorm F (x)", ref, dx, n, 0);
  compare16(c, "act bf16: residual + rmsnorm F (h)", h, dh, n, TOL_BF16_STORE);
  for (size_t i = 0; i < n; i++) /* dx now holds the rounded sum: add y once more */
    ref[i] = exec_bf16_to_f32(exec_bf16_round(ref[i] + y[i]));
  k16.residual_add_forward(c->s, F16(dx), F16(dy), n);
  compare16(c, "act bf16: residual_add F", ref, dx, n, 0);
  for (size_t i = 0; i < n; i++)
    ref[i] = gdh[i] + y[i];
  k16.residual_add_backward(c->s, F16(ddh), F16(dy), n, true);
  compare16(c, "act bf16: residual_add B (accumulate)", ref, ddh, n, TOL_BF16_STORE);
  k16.residual_add_backward(c->s, F16(ddh), F16(dy), n, false);
  compare16(c, "act bf16: residual_add B (copy)", y, ddh, n, 0);
  /* the embedding: rows of the fp32 table rounded once; its gradient in fp32 */
  int32_t tok[T];
  for (int t = 0; t < T; t++)
    tok[t] = (int32_t)g_rand_int_range(c->rng, 0, 7); /* repeats: the order of the sums */
  float *wte = rnd(c, (size_t)V * C, 1), *dwte = devf(c, wte, (size_t)V * C);
  int32_t *dtok = dev(c, tok, sizeof tok);
  cudaDeviceSynchronize();
  kernels_embedding_forward(ref, tok, wte, T, V, C);
  for (size_t i = 0; i < n; i++)
    ref[i] = exec_bf16_to_f32(exec_bf16_round(ref[i]));
  k16.embedding_forward(c->s, F16(dh), dtok, dwte, T, V, C);
  compare16(c, "act bf16: embedding F", ref, dh, n, 0);
  kernels_embedding_backward(wte, y, tok, T, V, C); /* ddh holds y's bits (the copy above) */
  k16.embedding_backward(c->s, dwte, F16(ddh), dtok, T, V, C);
  cudaDeviceSynchronize();
  compare(c, "act bf16: embedding B (fp32 dtable)", wte, dwte, (size_t)V * C, TOL_PLAIN);
  g_free(h);
  g_free(rs);
  g_free(ref);
  check_act16_mlp(c, &k16);
  check_act16_attention(c, &k16);
  check_act16_lm_head(c, &k16, KERNELS_LM_HEAD_UNTIED);
  check_act16_lm_head(c, &k16, KERNELS_LM_HEAD_TIED);
  check_act16_tp(c, &k16, KERNELS_LM_HEAD_UNTIED);
  check_act16_tp(c, &k16, KERNELS_LM_HEAD_TIED);
}

/* The MLP through the bf16-activation table: h, m, dm, dh and the saved g, u, act and bwork's
 * dg, du in bf16 (the device's own passes feed each other); the host runs in fp32 on the same
 * bf16-rounded h, dm and dh. Held to the bf16 GEMMs' tolerance (3e-2, the header's reasoning:
 * up to three GEMMs chained, each off by 2^-7 of its terms at first order); the roundings of
 * g, u, act, dact and the output add 2^-8 each at most, independent of the GEMMs' and partly
 * cancelling in the norm-wise measure (measured: under half the tolerance). */
static void check_act16_mlp(struct check *c, const struct exec_kernels *k16) {
  if (!c->bf16) {
    printf("skip act bf16: mlp (bf16 activations come with bf16 GEMMs)\n");
    return;
  }
  size_t P = kernels_mlp_param_count(C, F), SV = kernels_mlp_saved_floats(T, F), n = T * C;
  size_t BW = kernels_mlp_bwork_floats(T, F);
  uint16_t *hb, *gb, *ghb;
  float *p = rnd(c, P, 0.2f), *h = rnd16(c, n, 1, &hb), *m = g_new(float, n);
  float *saved = g_new(float, SV), *bwork = g_new(float, BW);
  float *g = rnd16(c, n, 1, &gb), *gh = rnd16(c, n, 1, &ghb), *gp = rnd(c, P, 0.1f);
  float *dp = devf(c, p, P), *dgp = devf(c, gp, P);
  uint16_t *dh = dev16(c, hb, n), *dm = dev16(c, NULL, n), *dg = dev16(c, gb, n);
  uint16_t *dgh = dev16(c, ghb, n), *dsaved = dev16(c, NULL, SV), *dbw = dev16(c, NULL, BW);
  cudaDeviceSynchronize();
  kernels_mlp_forward(m, saved, h, p, T, C, F);
  k16->mlp_forward(c->s, F16(dm), F16(dsaved), F16(dh), dp, T, C, F);
  compare16(c, "act bf16: mlp F", m, dm, n, c->tol_gemm);
  compare16(c, "act bf16: mlp F saved (g, u, act)", saved, dsaved, SV, c->tol_gemm);
  kernels_mlp_backward_input(gh, bwork, g, saved, p, T, C, F, true);
  k16->mlp_backward_input(c->s, F16(dgh), F16(dbw), F16(dg), F16(dsaved), dp, T, C, F, true);
  compare16(c, "act bf16: mlp BI (accumulate)", gh, dgh, n, c->tol_gemm);
  compare16(c, "act bf16: mlp BI bwork (dg, du)", bwork, dbw, BW, c->tol_gemm);
  kernels_mlp_backward_weight(gp, bwork, g, h, saved, T, C, F);
  k16->mlp_backward_weight(c->s, dgp, F16(dbw), F16(dg), F16(dh), F16(dsaved), T, C, F);
  compare(c, "act bf16: mlp BW (fp32 dparams)", gp, dgp, P, c->tol_gemm);
  g_free(m);
  g_free(saved);
  g_free(bwork);
}

/* Attention through the bf16-activation table at shape d: saved q, k, v, y in bf16 and lse in
 * fp32 (after v, or in a core buffer of its own under selective recomputation), bwork in bf16;
 * the device's passes feed each other, the host runs in fp32 on the same bf16-rounded h and
 * da. The bf16 GEMMs' tolerance (3e-2: the fp32-activation entries round the same operands to
 * bf16; the stores add one rounding, 2^-8, each). */
static void check_act16_attention_shape(struct check *c, const struct exec_kernels *k16,
                                        const char *label, struct kernels_attention_dims d) {
  char what[96];
  size_t TC = (size_t)d.batch * d.seq * d.hidden, P = kernels_attention_param_count(&d);
  size_t SV = kernels_attention_saved_floats(&d), BW = kernels_attention_bwork_floats(&d);
  size_t CORE = kernels_attention_core_floats(&d), NL = (size_t)d.batch * d.heads * d.seq;
  size_t NQKV = SV - CORE, NY = CORE - NL, core16 = NL * 4 + NY * 2;
  uint16_t *hb, *gb;
  float *p = rnd(c, P, 0.2f), *h = rnd16(c, TC, 1, &hb), *g = rnd16(c, TC, 1, &gb);
  float *a = g_new(float, TC), *saved = g_new0(float, SV), *bwork = g_new0(float, BW);
  float *gh = g_new0(float, TC), *gp = rnd(c, P, 0.1f), *dp = devf(c, p, P), *dgp = devf(c, gp, P);
  uint16_t *dh = dev16(c, hb, TC), *da = dev16(c, NULL, TC), *dg = dev16(c, gb, TC);
  uint16_t *dgh = dev16(c, NULL, TC), *dbw = dev16(c, NULL, BW);
  uint16_t *dsv = dev(c, NULL, NQKV * 2 + core16), *dcore = dev(c, NULL, core16);
  cudaDeviceSynchronize();
  kernels_attention_forward(a, saved, h, p, &d);
  k16->attention_forward(c->s, F16(da), F16(dsv), F16(dh), dp, &d);
  g_snprintf(what, sizeof what, "act bf16: attention %s F", label);
  compare16(c, what, a, da, TC, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: attention %s F saved (q k v)", label);
  compare16(c, what, saved, dsv, NQKV, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: attention %s F saved (lse, fp32)", label);
  compare(c, what, saved + NQKV, F16(dsv + NQKV), NL, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: attention %s F saved (y)", label);
  compare16(c, what, saved + NQKV + NL, dsv + NQKV + 2 * NL, NY, c->tol_gemm);
  struct kernels_attention_dims dc = d;
  dc.core = F16(dcore);
  k16->attention_core_forward(c->s, F16(dsv), &dc);
  g_snprintf(what, sizeof what, "act bf16: attention %s core rerun = F's lse y", label);
  compare_bits(c, what, F16(dcore), F16(dsv + NQKV), core16 / 4, true);
  kernels_attention_backward_input(gh, bwork, g, saved, p, &d, false);
  k16->attention_backward_input(c->s, F16(dgh), F16(dbw), F16(dg), F16(dsv), dp, &d, false);
  g_snprintf(what, sizeof what, "act bf16: attention %s BI", label);
  compare16(c, what, gh, dgh, TC, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: attention %s BI bwork (dy dq dk dv)", label);
  compare16(c, what, bwork, dbw, BW, c->tol_gemm);
  kernels_attention_backward_weight(gp, bwork, g, h, saved, &d);
  k16->attention_backward_weight(c->s, dgp, F16(dbw), F16(dg), F16(dh), F16(dsv), &d);
  g_snprintf(what, sizeof what, "act bf16: attention %s BW (fp32 dparams)", label);
  compare(c, what, gp, dgp, P, c->tol_gemm);
  float *hbufs[] = {a, saved, bwork, gh};
  for (size_t i = 0; i < G_N_ELEMENTS(hbufs); i++)
    g_free(hbufs[i]);
}

/* the unfused per-head core's small shape and one of the fused kernel's */
static void check_act16_attention(struct check *c, const struct exec_kernels *k16) {
  if (!c->bf16) {
    printf("skip act bf16: attention (bf16 activations come with bf16 GEMMs)\n");
    return;
  }
  struct kernels_rope_scaling sc = {8.0f, 1.0f, 4.0f, 8};
  check_act16_attention_shape(c, k16, "B2 S16 H4/2 D16",
                              (struct kernels_attention_dims){B, S, H, KV, D, C, 10000.0f, &sc,
                                                              NULL, 0, 0});
  check_act16_attention_shape(c, k16, "S256 H8/2 D64",
                              (struct kernels_attention_dims){1, 256, 8, 2, 64, 128, 500000.0f,
                                                              &sc, NULL, 0, 0});
}

/* The LM head through the bf16-activation table: h and dh in bf16, the saved row statistics,
 * the loss and dparams fp32; the host on the same bf16-rounded h. B (fused) against BI + BW. */
static void check_act16_lm_head(struct check *c, const struct exec_kernels *k16,
                                enum kernels_lm_head_layout layout) {
  if (!c->bf16) {
    printf("skip act bf16: lm_head (bf16 activations come with bf16 GEMMs)\n");
    return;
  }
  const char *name = layout == KERNELS_LM_HEAD_TIED ? "tied" : "untied";
  char what[80];
  int32_t tg[T];
  for (int t = 0; t < T; t++)
    tg[t] = (int32_t)g_rand_int_range(c->rng, 0, V);
  size_t PV = (size_t)C * V;
  uint16_t *hb, *gb;
  float *p = rnd(c, PV, 0.2f), *h = rnd16(c, T * C, 1, &hb), *g = rnd16(c, T * C, 1, &gb);
  float *saved = g_new(float, 2 * T), *gp = rnd(c, PV, 0.1f), loss;
  float *dp = devf(c, p, PV), *dsaved = devf(c, NULL, 2 * T), *dloss = devf(c, NULL, 1);
  float *dgp = devf(c, gp, PV), *dgp2 = devf(c, gp, PV);
  uint16_t *dh = dev16(c, hb, T * C), *dgh = dev16(c, gb, T * C), *dgh2 = dev16(c, gb, T * C);
  int32_t *dtg = dev(c, tg, sizeof tg);
  cudaDeviceSynchronize();
  kernels_lm_head_loss_forward(&loss, saved, h, tg, p, layout, T, C, V);
  k16->lm_head_loss_forward(c->s, dloss, dsaved, F16(dh), dtg, dp, layout, T, C, V);
  g_snprintf(what, sizeof what, "act bf16: lm_head F %s (loss)", name);
  compare(c, what, &loss, dloss, 1, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: lm_head F %s saved (fp32 stats)", name);
  compare(c, what, saved, dsaved, 2 * T, c->tol_gemm);
  kernels_lm_head_loss_backward_input(g, NULL, saved, h, tg, p, layout, 0.5f, T, C, V, true);
  k16->lm_head_loss_backward_input(c->s, F16(dgh), NULL, dsaved, F16(dh), dtg, dp, layout, 0.5f,
                                   T, C, V, true);
  g_snprintf(what, sizeof what, "act bf16: lm_head BI %s (accumulate)", name);
  compare16(c, what, g, dgh, T * C, c->tol_gemm);
  kernels_lm_head_loss_backward_weight(gp, NULL, saved, h, tg, p, layout, 0.5f, T, C, V);
  k16->lm_head_loss_backward_weight(c->s, dgp, NULL, dsaved, F16(dh), dtg, dp, layout, 0.5f, T, C,
                                    V);
  g_snprintf(what, sizeof what, "act bf16: lm_head BW %s (fp32 dparams)", name);
  compare(c, what, gp, dgp, PV, c->tol_gemm);
  k16->lm_head_loss_backward(c->s, F16(dgh2), dgp2, NULL, dsaved, F16(dh), dtg, dp, layout, 0.5f,
                             T, C, V, true);
  g_snprintf(what, sizeof what, "act bf16: lm_head B %s (dh)", name);
  compare16(c, what, g, dgh2, T * C, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: lm_head B %s (fp32 dparams)", name);
  compare(c, what, gp, dgp2, PV, c->tol_gemm);
  g_free(saved);
}

/* Tensor parallelism's vocabulary slice through the bf16-activation table (check_tp's shapes):
 * the embedding's rows rounded once (exact against the rounded host rows), its gradient fp32,
 * the head's statistics and its partial dh on bf16 h. */
static void check_act16_tp(struct check *c, const struct exec_kernels *k16,
                           enum kernels_lm_head_layout layout) {
  enum { LO = 40, N = 33 };
  if (!c->bf16) {
    printf("skip act bf16: tp (bf16 activations come with bf16 GEMMs)\n");
    return;
  }
  const char *name = layout == KERNELS_LM_HEAD_TIED ? "tied" : "untied";
  char what[80];
  int32_t tok[T];
  for (int t = 0; t < T; t++)
    tok[t] = (int32_t)g_rand_int_range(c->rng, 0, V);
  size_t TC = (size_t)T * C, P = (size_t)N * C;
  uint16_t *gb, *hb;
  float *tab = rnd(c, P, 1), *x = g_new(float, TC), *g = rnd16(c, TC, 1, &gb);
  float *gt = rnd(c, P, 1), *h = rnd16(c, TC, 1, &hb), *stats = g_new(float, 3 * (size_t)T);
  float *saved = g_new(float, 2 * (size_t)T), *gh = g_new(float, TC), *gw = rnd(c, P, 0.1f);
  int32_t *dtok = dev(c, tok, sizeof tok);
  float *dtab = devf(c, tab, P), *dgt = devf(c, gt, P), *dstats = devf(c, NULL, 3 * (size_t)T);
  float *dgw = devf(c, gw, P), *dsaved;
  uint16_t *dx = dev16(c, NULL, TC), *dg = dev16(c, gb, TC), *dh = dev16(c, hb, TC);
  uint16_t *dgh = dev16(c, NULL, TC);
  cudaDeviceSynchronize();
  kernels_tp_embedding_forward(x, tok, tab, T, C, LO, N);
  for (size_t i = 0; i < TC; i++)
    x[i] = exec_bf16_to_f32(exec_bf16_round(x[i]));
  k16->tp_embedding_forward(c->s, F16(dx), dtok, dtab, T, C, LO, N);
  compare16(c, "act bf16: tp embedding F (slice rows, zeros)", x, dx, TC, 0);
  kernels_tp_embedding_backward(gt, g, tok, T, C, LO, N);
  k16->tp_embedding_backward(c->s, dgt, F16(dg), dtok, T, C, LO, N);
  cudaDeviceSynchronize();
  compare(c, "act bf16: tp embedding BW (fp32 dtable)", gt, dgt, P, TOL_PLAIN);
  kernels_tp_head_stats(stats, h, tok, tab, layout, T, C, LO, N);
  k16->tp_head_stats(c->s, dstats, F16(dh), dtok, dtab, layout, T, C, LO, N);
  g_snprintf(what, sizeof what, "act bf16: tp lm_head stats %s", name);
  compare(c, what, stats, dstats, 3 * (size_t)T, c->tol_gemm);
  float loss;
  kernels_tp_head_combine(&loss, saved, stats, 1, T); /* one rank's statistics: the saved */
  dsaved = devf(c, saved, 2 * (size_t)T);
  cudaDeviceSynchronize();
  kernels_tp_head_backward(gh, gw, saved, h, tok, tab, layout, 0.5f, T, C, LO, N);
  k16->tp_head_backward(c->s, F16(dgh), dgw, dsaved, F16(dh), dtok, dtab, layout, 0.5f, T, C, LO,
                        N);
  g_snprintf(what, sizeof what, "act bf16: tp lm_head B %s dh (partial)", name);
  compare16(c, what, gh, dgh, TC, c->tol_gemm);
  g_snprintf(what, sizeof what, "act bf16: tp lm_head B %s dw (fp32)", name);
  compare(c, what, gw, dgw, P, c->tol_gemm);
  float *host[] = {x, stats, saved, gh};
  for (size_t i = 0; i < G_N_ELEMENTS(host); i++)
    g_free(host[i]);
}

static void check_op_table(struct check *c) {
  int missing = 0;
  for (int op = 0; op < EXEC_OP_COUNT; op++)
    if (!exec_backend_supports_op(c->b, (enum exec_op)op)) {
      printf("FAIL op %s is not in the cuda table\n", exec_op_name((enum exec_op)op));
      missing++;
    }
  printf("%-4s %-44s %d of %d ops\n", missing ? "FAIL" : "ok", "the op list (exec/ops.def)",
         EXEC_OP_COUNT - missing, EXEC_OP_COUNT);
  c->run++;
  c->failed += missing > 0;
}

int main(int argc, char **argv) {
  GError *err = NULL;
  struct exec_backend_params bp = {&argc, &argv, false, piper_launch_detect()};
  struct check c = {0};
  /* no plan configures the backend here: its GEMM precision is the variable's, bf16 unless
   * told (what this prints must be what runs) */
  if (!getenv("PIPER_CUDA_GEMM"))
    setenv("PIPER_CUDA_GEMM", "bf16", 1);
  c.b = exec_backend_init_by_name("cuda", &bp, &err);
  if (!c.b) {
    fprintf(stderr, "check_kernels: %s\n", err->message);
    return 2;
  }
  const char *g = getenv("PIPER_CUDA_GEMM");
  bool fp32 = g && strcmp(g, "fp32") == 0;
  c.tol_gemm = fp32 ? 2e-4 : 3e-2;
  c.bf16 = !fp32;
  printf("check_kernels: GEMMs in %s, tolerance %.0e (no GEMM: %.0e)\n", fp32 ? "fp32" : "bf16",
         c.tol_gemm, TOL_PLAIN);
  c.k = exec_backend_kernels(c.b);
  c.s = exec_stream_create(c.b, "check", 0, &err);
  c.rng = g_rand_new_with_seed(42);
  check_op_table(&c);
  check_simple(&c);
  check_adamw_multi(&c);
  check_bf16_copy(&c);
  check_embedding_norm(&c);
  check_bf16_norm(&c);
  check_bf16_pointwise(&c);
  check_attention(&c);
  check_cudnn(&c);
  check_mlp(&c);
  check_weight_copies(&c, !fp32);
  check_router_moe(&c);
  check_expert_ffn(&c);
  check_fp8_rows(&c);
  check_lm_head(&c, KERNELS_LM_HEAD_UNTIED);
  check_lm_head(&c, KERNELS_LM_HEAD_TIED);
  check_tp(&c, KERNELS_LM_HEAD_UNTIED);
  check_tp(&c, KERNELS_LM_HEAD_TIED);
  check_act16_table(&c); /* last: the checks above draw the same inputs as before it */
  printf("check_kernels: %d of %d checks failed\n", c.failed, c.run);
  g_rand_free(c.rng);
  exec_stream_destroy(c.b, c.s);
  exec_backend_free(c.b);
  return c.failed ? 1 : 0;
}
