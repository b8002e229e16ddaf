/* prof machine: the host's roofline, what the simulator falls back on for ops without an
 * entry: the single-thread GEMM rate, a triad's memory bandwidth, and AdamW at several sizes
 * with cold caches (fitted to an overhead and a cost per parameter). */
#include <unistd.h>

#include "../kernels/kernels.h"
#include "prof-impl.h"

/* Writes a buffer twice the last-level cache (at least 16 MiB): what runs next finds its
 * operands in memory, as the optimizer does after a whole step of other work. */
static void evict_caches(void *unused) {
  (void)unused;
  static char *buf;
  static size_t n;
  if (!buf) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    n = llc > 0 ? 2 * (size_t)llc : 0;
    n = n < ((size_t)16 << 20) ? (size_t)16 << 20 : n > ((size_t)256 << 20) ? (size_t)256 << 20 : n;
    buf = g_malloc(n);
  }
  for (size_t i = 0; i < n; i += 64)
    buf[i] = (char)(buf[i] + 1);
}

struct gemm_ctx {
  int n;
  float *a, *b, *c;
};
static void gemm_run(void *ctx) {
  struct gemm_ctx *g = ctx;
  kernels_gemm(false, false, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f, g->c, g->n);
}

struct triad_ctx {
  size_t n;
  float *a, *b, *c;
};
static void triad_run(void *ctx) {
  struct triad_ctx *t = ctx;
  for (size_t i = 0; i < t->n; i++)
    t->a[i] = t->b[i] + 0.5f * t->c[i];
}

struct adamw_ctx {
  size_t n;
  float *p, *g, *m, *v;
  int step;
};
static void adamw_run(void *ctx) {
  struct adamw_ctx *w = ctx;
  kernels_adamw_step(w->p, w->g, w->m, w->v, w->n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, ++w->step);
}

/* AdamW at 4 sizes up to the largest model's parameter count (what one device of a host run
 * updates at most), by 4x: the fit holds where the executor uses it. Each timed call starts
 * with cold caches: the executor's optimizer runs after a whole step of other work. */
void prof_measure_machine(struct prof_run *r, uint64_t max_params) {
  struct gemm_ctx g = {.n = r->a->quick ? 512 : 1024};
  size_t nn = (size_t)g.n * g.n;
  g.a = prof_random_floats(nn, 7, 1), g.b = prof_random_floats(nn, 8, 1), g.c = g_new0(float, nn);
  r->gemm_flops = 2.0 * g.n * g.n * g.n / prof_median_seconds(r->a, gemm_run, &g);
  g_free(g.a), g_free(g.b), g_free(g.c);
  prof_progress(r, "GEMM %d^3: %.1f GFLOP/s", g.n, r->gemm_flops / 1e9);

  struct triad_ctx t = {.n = (size_t)(r->a->quick ? 4 : 16) << 20};
  t.a = g_new0(float, t.n);
  t.b = prof_random_floats(t.n, 9, 1);
  t.c = prof_random_floats(t.n, 10, 1);
  r->triad_bytes = 3.0 * (double)t.n * sizeof(float) / prof_median_seconds(r->a, triad_run, &t);
  g_free(t.a), g_free(t.b), g_free(t.c);
  prof_progress(r, "triad: %.1f GB/s", r->triad_bytes / 1e9);

  enum { N_ADAMW = 4 };
  double x[N_ADAMW], y[N_ADAMW];
  for (int i = 0; i < N_ADAMW; i++) {
    struct adamw_ctx w = {.n = (size_t)(max_params >> (2 * (N_ADAMW - 1 - i)))};
    if (w.n < 1024)
      w.n = 1024;
    w.p = prof_random_floats(w.n, 11, 1), w.g = prof_random_floats(w.n, 12, 1);
    w.m = g_new0(float, w.n), w.v = g_new0(float, w.n);
    x[i] = (double)w.n;
    y[i] = prof_median_seconds_after(r->a, adamw_run, &w, evict_caches);
    g_free(w.p), g_free(w.g), g_free(w.m), g_free(w.v);
    prof_progress(r, "AdamW %zu parameters: %.1f us", w.n, y[i] * 1e6);
  }
  prof_fit_line(x, y, N_ADAMW, &r->adamw_overhead, &r->adamw_per_param);
  if (r->adamw_overhead < 0)
    r->adamw_overhead = 0;
}
