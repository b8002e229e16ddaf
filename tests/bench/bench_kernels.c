/* Host kernel benchmark (the figures of the host-kernels issue). Run from anywhere, with one
 * BLAS thread for the figures the README keeps:
 *   OPENBLAS_NUM_THREADS=1 build/bench/bench_kernels [--quick | --shape NAME]
 * Times are the process's CPU time (one BLAS thread: the kernel's own time, not the time other
 * processes on a shared machine took from it; several BLAS threads would add up).
 * First measures the machine: single-thread SGEMM peak (1024^3, best of 5) and memory
 * bandwidth (a triad over 3 x 64 MiB, counting 3 words moved per element). Then, per shape and
 * per op and pass (F, BI, BW), the best of several runs of each kernel and its achieved GFLOP/s
 * (ops that are GEMMs at heart; % of the GEMM peak) or GB/s (pointwise ops; % of the measured
 * bandwidth). FLOPs count 2 per multiply-add, causal attention only below the diagonal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../base/base.h"
#include "../../kernels/kernels.h"

struct machine {
  double gemm_gflops, mem_gbs;
};

struct shape {
  const char *name;
  int B, S, C, H, KV, D, F, V; /* dense decoder shape: T = B * S */
  int E, K, Fe;                /* MoE: experts, top-k, expert width (0: dense) */
};

/* The bundled tiny models, and the mid-size shapes of the issue. */
static const struct shape shapes[] = {
    {"tiny-dense", 2, 32, 64, 4, 2, 16, 128, 256, 0, 0, 0},
    {"tiny-moe", 2, 32, 64, 4, 2, 16, 128, 256, 8, 2, 32},
    {"h512-s256", 2, 256, 512, 8, 4, 64, 1376, 4096, 0, 0, 0},
    {"h1024-s512", 1, 512, 1024, 16, 8, 64, 2752, 4096, 0, 0, 0},
};

/* CPU seconds of this process (see the top comment). */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int reps_for(double work) {
  int r = (int)(2e8 / (work + 1.0));
  return r < 3 ? 3 : r > 200 ? 200 : r;
}

static float *randn(size_t n, unsigned seed, float scale) {
  float *x = malloc(n * sizeof(float));
  unsigned s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = scale * (((float)(s >> 8) / 16777216.0f) - 0.5f);
  }
  return x;
}

/* ---- machine ---------------------------------------------------------------------------- */

/* Best of 20: on a shared machine the best run is the one nobody else interrupted. */
static double measure_gemm_peak(void) {
  int n = 1024;
  float *a = randn((size_t)n * n, 1, 1), *b = randn((size_t)n * n, 2, 1);
  float *c = randn((size_t)n * n, 3, 1);
  double best = 1e30;
  for (int r = 0; r < 20; r++) {
    double t0 = cpu_seconds();
    kernels_gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double t = cpu_seconds() - t0;
    best = t < best ? t : best;
  }
  free(a);
  free(b);
  free(c);
  return 2.0 * n * n * n / best / 1e9;
}

static double measure_bandwidth(void) {
  size_t n = (size_t)16 << 20;
  float *a = randn(n, 4, 1), *b = randn(n, 5, 1), *c = randn(n, 6, 1);
  double best = 1e30;
  for (int r = 0; r < 10; r++) {
    double t0 = cpu_seconds();
    for (size_t i = 0; i < n; i++)
      a[i] = b[i] + 0.5f * c[i];
    double t = cpu_seconds() - t0;
    best = t < best ? t : best;
  }
  volatile float sink = a[n / 2];
  (void)sink;
  free(a);
  free(b);
  free(c);
  return 3.0 * n * sizeof(float) / best / 1e9;
}

/* ---- timing and the table ------------------------------------------------------------------ */

/* One row: flops > 0 rates against the GEMM peak, else bytes against the bandwidth. */
static void report(const struct machine *mc, const char *shape, const char *op, const char *pass,
                   double seconds, double flops, double bytes) {
  if (flops > 0)
    printf("%-11s %-13s %-3s %10.3f %9.1f GFLOP/s %5.0f%%\n", shape, op, pass, seconds * 1e3,
           flops / seconds / 1e9, 100 * flops / seconds / 1e9 / mc->gemm_gflops);
  else
    printf("%-11s %-13s %-3s %10.3f %9.1f GB/s    %5.0f%%\n", shape, op, pass, seconds * 1e3,
           bytes / seconds / 1e9, 100 * bytes / seconds / 1e9 / mc->mem_gbs);
}

#define TIME_BEST(reps, out, stmt)                                                                 \
  do {                                                                                             \
    double best_ = 1e30;                                                                           \
    for (int r_ = 0; r_ < (reps); r_++) {                                                          \
      double t0_ = cpu_seconds();                                                                  \
      stmt;                                                                                        \
      double t_ = cpu_seconds() - t0_;                                                             \
      best_ = t_ < best_ ? t_ : best_;                                                             \
    }                                                                                              \
    (out) = best_;                                                                                 \
  } while (0)

/* ---- ops ---------------------------------------------------------------------------------- */

/* The causal core alone (QK^T, softmax, PV and their backward; RoPE included): the whole
 * kernel's time less that of its projection GEMMs at the same shapes, each the best of runs
 * that alternate the two (into scratch buffers), so both see the same machine. */
static void attention_core(const struct machine *mc, const struct shape *s,
                           const struct kernels_attention_dims *d, const float *params,
                           const float *h, float *saved, float *bwork, const float *da) {
  int T = s->B * s->S, C = s->C, HD = s->H * s->D, KD = s->KV * s->D;
  const float *wq = params, *wk = wq + (size_t)C * HD, *wv = wk + (size_t)C * KD;
  const float *wo = wv + (size_t)C * KD;
  float *out = calloc((size_t)T * C, sizeof(float)), *tmp = calloc((size_t)T * HD, sizeof(float));
  float *tc = calloc((size_t)T * C, sizeof(float));
  double tri = (double)s->B * s->H * s->S * (s->S + 1) / 2 * s->D * 2, t;
  double best[4] = {1e30, 1e30, 1e30, 1e30}; /* forward, its projections, BI, its projections */
  int reps = 3 * reps_for(2.0 * T * C * (2.0 * HD + 2.0 * KD));
  for (int r = 0; r < reps; r++) {
    double t0 = cpu_seconds();
    kernels_attention_forward(out, saved, h, params, d);
    double t1 = cpu_seconds();
    kernels_gemm(false, false, T, HD, C, 1.0f, h, C, wq, HD, 0.0f, tmp, HD);
    kernels_gemm(false, false, T, KD, C, 1.0f, h, C, wk, KD, 0.0f, tmp, KD);
    kernels_gemm(false, false, T, KD, C, 1.0f, h, C, wv, KD, 0.0f, tmp, KD);
    kernels_gemm(false, false, T, C, HD, 1.0f, tmp, HD, wo, C, 0.0f, tc, C);
    double t2 = cpu_seconds();
    kernels_attention_backward_input(out, bwork, da, saved, params, d, false);
    double t3 = cpu_seconds();
    kernels_gemm(false, true, T, HD, C, 1.0f, da, C, wo, C, 0.0f, tmp, HD);
    kernels_gemm(false, true, T, C, HD, 1.0f, tmp, HD, wq, HD, 0.0f, tc, C);
    kernels_gemm(false, true, T, C, KD, 1.0f, tmp, KD, wk, KD, 1.0f, tc, C);
    kernels_gemm(false, true, T, C, KD, 1.0f, tmp, KD, wv, KD, 1.0f, tc, C);
    double t4 = cpu_seconds(), dt[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
    for (int k = 0; k < 4; k++)
      best[k] = dt[k] < best[k] ? dt[k] : best[k];
  }
  t = best[0] - best[1];
  report(mc, s->name, "attn core", "F", t, 2 * tri, 0);
  t = best[2] - best[3];
  report(mc, s->name, "attn core", "BI", t, 4 * tri, 0);
  free(out), free(tmp), free(tc);
}

static void bench_attention(const struct machine *mc, const struct shape *s) {
  struct kernels_attention_dims d = {s->B, s->S, s->H, s->KV, s->D, s->C, KERNELS_ROPE_THETA, NULL, NULL, 0, 0};
  size_t T = (size_t)s->B * s->S, HD = (size_t)s->H * s->D, KD = (size_t)s->KV * s->D;
  float *params = randn(kernels_attention_param_count(&d), 10, 0.1f);
  float *dparams = calloc(kernels_attention_param_count(&d), sizeof(float));
  float *saved = calloc(kernels_attention_saved_floats(&d), sizeof(float));
  float *bwork = calloc(kernels_attention_bwork_floats(&d), sizeof(float));
  float *h = randn(T * s->C, 11, 1), *da = randn(T * s->C, 12, 1), *a = calloc(T * s->C, 4);
  float *dh = calloc(T * s->C, sizeof(float));
  double proj = 2.0 * T * s->C * (2 * HD + 2 * KD);
  double tri = (double)s->B * s->H * s->S * (s->S + 1) / 2 * s->D * 2; /* one causal GEMM */
  double f_flops = proj + 2 * tri, bi_flops = proj + 4 * tri, bw_flops = proj, t, t_f, t_bi;
  int reps = reps_for(f_flops);
  TIME_BEST(reps, t_f, kernels_attention_forward(a, saved, h, params, &d));
  report(mc, s->name, "attention", "F", t_f, f_flops, 0);
  TIME_BEST(reps, t_bi, kernels_attention_backward_input(dh, bwork, da, saved, params, &d, false));
  report(mc, s->name, "attention", "BI", t_bi, bi_flops, 0);
  TIME_BEST(reps, t, kernels_attention_backward_weight(dparams, bwork, da, h, saved, &d));
  report(mc, s->name, "attention", "BW", t, bw_flops, 0);
  attention_core(mc, s, &d, params, h, saved, bwork, da);
  TIME_BEST(reps, t, kernels_rope(saved, s->B, s->S, s->H, s->D, KERNELS_ROPE_THETA, false));
  report(mc, s->name, "rope", "F", t, 0, 2.0 * T * HD * sizeof(float));
  free(params), free(dparams), free(saved), free(bwork), free(h), free(da), free(a), free(dh);
}

static void bench_mlp(const struct machine *mc, const struct shape *s) {
  int T = s->B * s->S, C = s->C, F = s->F;
  float *params = randn(kernels_mlp_param_count(C, F), 20, 0.1f);
  float *dparams = calloc(kernels_mlp_param_count(C, F), sizeof(float));
  float *saved = calloc(kernels_mlp_saved_floats(T, F), sizeof(float));
  float *bwork = calloc(kernels_mlp_bwork_floats(T, F), sizeof(float));
  float *h = randn((size_t)T * C, 21, 1), *dm = randn((size_t)T * C, 22, 1);
  float *m = calloc((size_t)T * C, 4), *dh = calloc((size_t)T * C, 4);
  double flops = 2.0 * T * C * F * 3, t;
  int reps = reps_for(flops);
  TIME_BEST(reps, t, kernels_mlp_forward(m, saved, h, params, T, C, F));
  report(mc, s->name, "mlp", "F", t, flops, 0);
  TIME_BEST(reps, t, kernels_mlp_backward_input(dh, bwork, dm, saved, params, T, C, F, false));
  report(mc, s->name, "mlp", "BI", t, flops, 0);
  TIME_BEST(reps, t, kernels_mlp_backward_weight(dparams, bwork, dm, h, saved, T, C, F));
  report(mc, s->name, "mlp", "BW", t, flops, 0);
  free(params), free(dparams), free(saved), free(bwork), free(h), free(dm), free(m), free(dh);
}

static void bench_norm_loss(const struct machine *mc, const struct shape *s) {
  int T = s->B * s->S, C = s->C, V = s->V;
  float *x = randn((size_t)T * C, 30, 1), *w = randn(C, 31, 1), *dw = calloc(C, 4);
  float *h = calloc((size_t)T * C, 4), *dx = calloc((size_t)T * C, 4), *rstd = calloc(T, 4);
  double bytes = 2.0 * T * C * sizeof(float), t;
  int reps = reps_for(bytes);
  TIME_BEST(reps, t, kernels_rmsnorm_forward(h, rstd, x, w, T, C, KERNELS_RMSNORM_EPS));
  report(mc, s->name, "rmsnorm", "F", t, 0, bytes);
  TIME_BEST(reps, t, kernels_rmsnorm_backward_input(dx, h, x, rstd, w, T, C, false));
  report(mc, s->name, "rmsnorm", "BI", t, 0, 1.5 * bytes);
  TIME_BEST(reps, t, kernels_rmsnorm_backward_weight(dw, h, x, rstd, T, C));
  report(mc, s->name, "rmsnorm", "BW", t, 0, bytes);
  TIME_BEST(reps, t, kernels_residual_add_forward(h, x, (size_t)T * C));
  report(mc, s->name, "residual_add", "F", t, 0, 1.5 * bytes);

  float *head = randn((size_t)C * V, 32, 0.1f), *dhead = calloc((size_t)C * V, 4);
  float *probs = calloc(kernels_lm_head_loss_saved_floats(T, V), 4);
  float *dlogits = calloc(kernels_lm_head_loss_bwork_floats(T, V), 4);
  int32_t *targets = malloc((size_t)T * sizeof(int32_t));
  for (int i = 0; i < T; i++)
    targets[i] = (i * 7919) % V;
  double flops = 2.0 * T * C * V;
  reps = reps_for(flops);
  float loss;
  TIME_BEST(reps, t,
            kernels_lm_head_loss_forward(&loss, probs, x, targets, head, KERNELS_LM_HEAD_UNTIED, T,
                                         C, V));
  report(mc, s->name, "lm_head_loss", "F", t, flops, 0);
  TIME_BEST(reps, t,
            kernels_lm_head_loss_backward_input(dx, dlogits, probs, x, targets, head,
                                                KERNELS_LM_HEAD_UNTIED, 1.0f, T, C, V, false));
  report(mc, s->name, "lm_head_loss", "BI", t, flops, 0);
  TIME_BEST(reps, t,
            kernels_lm_head_loss_backward_weight(dhead, dlogits, probs, x, targets, head,
                                                 KERNELS_LM_HEAD_UNTIED, 1.0f, T, C, V));
  report(mc, s->name, "lm_head_loss", "BW", t, flops, 0);
  free(x), free(w), free(dw), free(h), free(dx), free(rstd), free(head), free(dhead), free(probs);
  free(dlogits), free(targets);
}

static void bench_moe(const struct machine *mc, const struct shape *s) {
  int T = s->B * s->S, C = s->C, E = s->E, K = s->K, F = s->Fe, n = T * K;
  float *wr = randn((size_t)C * E, 40, 0.1f), *dwr = calloc((size_t)C * E, 4);
  float *h = randn((size_t)T * C, 41, 1), *dh = calloc((size_t)T * C, 4);
  float *probs = calloc((size_t)T * E, 4), *dlog = calloc((size_t)T * E, 4);
  float *weights = calloc((size_t)T * K, 4), *dweights = randn((size_t)T * K, 42, 1);
  int32_t *ids = calloc((size_t)T * K, 4), *route_row = calloc((size_t)n, 4);
  int32_t *row_expert = calloc((size_t)n, 4), counts[1];
  double t, flops = 2.0 * T * C * E;
  int reps = reps_for(flops);
  TIME_BEST(reps, t, kernels_router_forward(ids, weights, probs, h, wr, T, C, E, K));
  report(mc, s->name, "router", "F", t, flops, 0);
  TIME_BEST(reps, t,
            kernels_router_backward_input(dh, dlog, dweights, ids, weights, probs, wr, T, C, E, K,
                                          false));
  report(mc, s->name, "router", "BI", t, flops, 0);
  TIME_BEST(reps, t, kernels_router_backward_weight(dwr, dlog, h, T, C, E));
  report(mc, s->name, "router", "BW", t, flops, 0);

  float *send = calloc((size_t)n * C, 4), *y = randn((size_t)n * C, 43, 1);
  float *dy = calloc((size_t)n * C, 4), *m = calloc((size_t)T * C, 4);
  float *row_weight = calloc((size_t)n, 4), *drow_weight = calloc((size_t)n, 4);
  kernels_moe_dispatch_plan(counts, route_row, ids, T, K, E, 1);
  double bytes = 2.0 * n * C * sizeof(float);
  reps = reps_for(bytes);
  TIME_BEST(reps, t, kernels_moe_dispatch_forward(send, row_expert, row_weight, h, ids, weights,
                                                  route_row, T, K, C));
  report(mc, s->name, "dispatch", "F", t, 0, bytes);
  TIME_BEST(reps, t, kernels_moe_combine_forward(m, y, route_row, T, K, C));
  report(mc, s->name, "combine", "F", t, 0, bytes);
  TIME_BEST(reps, t, kernels_moe_combine_backward(dy, m, route_row, T, K, C));
  report(mc, s->name, "combine", "B", t, 0, bytes);
  TIME_BEST(reps, t,
            kernels_moe_dispatch_backward(dh, dweights, dy, drow_weight, route_row, T, K, C, false));
  report(mc, s->name, "dispatch", "B", t, 0, bytes);

  size_t np = kernels_expert_ffn_param_count(E, C, F);
  float *ep = randn(np, 44, 0.1f), *dep = calloc(np, 4);
  float *esaved = calloc(kernels_expert_ffn_saved_floats(n, C, F), 4);
  float *ebwork = calloc(kernels_expert_ffn_bwork_floats(n, C, F), 4);
  float *scratch = calloc(kernels_expert_ffn_scratch_floats(n, C), 4);
  flops = 2.0 * n * C * F * 3;
  reps = reps_for(flops);
  TIME_BEST(reps, t,
            kernels_expert_ffn_forward(y, esaved, NULL, NULL, scratch, send, row_expert, row_weight,
                                       n, ep, 0, E, C, F));
  report(mc, s->name, "expert_ffn", "F", t, flops, 0);
  TIME_BEST(reps, t,
            kernels_expert_ffn_backward_input(send, drow_weight, ebwork, scratch, dy, row_expert, n,
                                              esaved, NULL, ep, 0, E, C, F, false));
  report(mc, s->name, "expert_ffn", "BI", t, flops, 0);
  TIME_BEST(reps, t,
            kernels_expert_ffn_backward_weight(dep, ebwork, row_expert, n, esaved, NULL, NULL, 0, E,
                                               C, F));
  report(mc, s->name, "expert_ffn", "BW", t, flops, 0);
  free(wr), free(dwr), free(h), free(dh), free(probs), free(dlog), free(weights), free(dweights);
  free(ids), free(route_row), free(row_expert), free(send), free(y), free(dy), free(m);
  free(row_weight), free(drow_weight);
  free(ep), free(dep), free(esaved), free(ebwork), free(scratch);
}

static void bench_adamw(const struct machine *mc, size_t n) {
  float *p = randn(n, 50, 1), *g = randn(n, 51, 1), *m = calloc(n, 4), *v = calloc(n, 4);
  double t;
  int step = 0;
  TIME_BEST(5, t, kernels_adamw_step(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step));
  /* reads p, g, m, v and writes p, m, v */
  report(mc, "(any)", "adamw", "-", t, 0, 7.0 * n * sizeof(float));
  free(p), free(g), free(m), free(v);
}

int main(int argc, char **argv) {
  bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  const char *only = argc > 2 && strcmp(argv[1], "--shape") == 0 ? argv[2] : NULL;
  if (argc > 1 && !quick && !only) {
    fprintf(stderr, "usage: bench_kernels [--quick | --shape NAME]\n");
    return 2;
  }
  struct machine mc = {measure_gemm_peak(), measure_bandwidth()};
  printf("machine: SGEMM peak %.1f GFLOP/s (1024^3, OPENBLAS_NUM_THREADS=%s), memory %.1f GB/s "
         "(triad)\n",
         mc.gemm_gflops, getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset",
         mc.mem_gbs);
  printf("%-11s %-13s %-3s %10s %17s %6s\n", "shape", "op", "pass", "ms", "achieved", "of peak");
  size_t n_shapes = quick ? 2 : sizeof shapes / sizeof shapes[0];
  for (size_t i = 0; i < n_shapes; i++) {
    const struct shape *s = &shapes[i];
    if (only && strcmp(only, s->name) != 0)
      continue;
    bench_attention(&mc, s);
    if (s->E > 0)
      bench_moe(&mc, s);
    else
      bench_mlp(&mc, s);
    bench_norm_loss(&mc, s);
  }
  if (!only)
    bench_adamw(&mc, (size_t)16 << 20);
  return 0;
}
