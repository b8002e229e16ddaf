/* prof core: what every part of the profiler uses: its progress lines, rounding, the medians
 * of repeated timings, deterministic random inputs, the relative least-squares line, and the
 * cost of one instruction through a backend (the host's loop or the cuda backend's enqueue). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../base/base.h"
#include "../exec/backend.h"
#include "prof-impl.h"

void prof_progress(const struct prof_run *r, const char *fmt, ...) {
  if (r->a->quiet || r->rank != 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  fputs("piper-prof: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

double prof_physical_memory_bytes(void) {
  return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

double prof_round_sig(double x, int digits) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.*g", digits, x);
  return strtod(buf, NULL);
}

/* ---- timing ------------------------------------------------------------------------------- */

double prof_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, piper_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median seconds of one call of fn: warm-up calls first (scratch grows, caches fill), then at
 * least `repeats` timed calls, more for short kernels (up to about 50 ms of timing in all). */
double prof_median_seconds_after(const struct prof_args *a, prof_bench_fn fn, void *ctx,
                                 prof_bench_fn before) {
  for (uint32_t i = 0; i < a->warmup; i++)
    fn(ctx);
  if (before)
    before(NULL);
  double t0 = piper_clock_seconds();
  fn(ctx);
  double first = piper_clock_seconds() - t0;
  uint32_t n = a->repeats;
  double want = a->quick ? 0.005 : 0.05;
  if (first > 0 && want / first > n)
    n = want / first > 500 ? 500 : (uint32_t)(want / first);
  double *t = g_new(double, n);
  for (uint32_t i = 0; i < n; i++) {
    if (before)
      before(NULL);
    double s = piper_clock_seconds();
    fn(ctx);
    t[i] = piper_clock_seconds() - s;
  }
  double med = prof_median(t, n);
  g_free(t);
  return med;
}

double prof_median_seconds(const struct prof_args *a, prof_bench_fn fn, void *ctx) {
  return prof_median_seconds_after(a, fn, ctx, NULL);
}

/* ---- inputs and fits ---------------------------------------------------------------------- */

float *prof_random_floats(size_t n, uint32_t seed, float scale) {
  float *x = g_new(float, n ? n : 1);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = scale * (((float)(s >> 8) / 16777216.0f) - 0.5f);
  }
  return x;
}

int32_t *prof_random_ids(size_t n, int32_t range) {
  int32_t *x = g_new(int32_t, n ? n : 1);
  for (size_t i = 0; i < n; i++)
    x[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)range);
  return x;
}

/* Least squares of y = alpha + beta * x over n points, each residual relative to its y (weights
 * 1 / y^2): the times span several decades, and a plain fit would let the largest sizes set
 * the latency too (often below zero). */
void prof_fit_line(const double *x, const double *y, int n, double *alpha, double *beta) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < n; i++) {
    double w = y[i] > 0 ? 1 / (y[i] * y[i]) : 0;
    sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  double d = sw * sxx - sx * sx;
  *beta = d != 0 ? (sw * sxy - sx * sy) / d : 0;
  *alpha = sw > 0 ? (sy - *beta * sx) / sw : 0;
}

/* ---- the executor's cost per instruction -------------------------------------------------- */

static bool noop_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s, (void)arg, (void)err;
  return true;
}

/* Median seconds per instruction (task + record) of the backend's loop, over 5 batches. */
double prof_instruction_cost(struct exec_backend *b, uint32_t n, GError **err) {
  struct exec_stream *st = exec_stream_create(b, "piper-prof", 0, err);
  if (!st)
    return -1;
  struct exec_event *e = exec_event_create(b);
  double t[5];
  for (int rep = 0; rep < 6; rep++) {
    double t0 = piper_clock_seconds();
    for (uint32_t i = 0; i < n; i++) {
      exec_stream_submit(b, st, noop_task, NULL, i);
      exec_event_record(b, e, st);
    }
    exec_event_synchronize(b, e, 60);
    if (rep > 0) /* the first batch warms the loop up */
      t[rep - 1] = (piper_clock_seconds() - t0) / n;
  }
  exec_event_destroy(b, e);
  exec_stream_destroy(b, st);
  return prof_median(t, 5);
}
