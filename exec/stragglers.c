/* stragglers: which ranks compute consistently slower than their peers, from every rank's
 * compute time per measured step (the measured counterpart of piper-sim's slow-device
 * scenarios). Peers are the ranks of the same plan class: the same instructions on the same
 * shapes (data-parallel replicas), so a difference between them is the device's, not the
 * plan's. Expert-parallel peers differ by their experts' routed rows too: a rank named there
 * may be the one whose experts the router favours. */
#include <math.h>
#include <stdlib.h>

#include "../base/assert.h"
#include "exec-impl.h"

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of v [n] (sorted in place); n > 0. */
static double median(double *v, uint32_t n) {
  qsort(v, n, sizeof *v, compare_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Rank r's time over the median of its peers' (the other ranks of its class) in one step; 0
 * when it has no peer or they computed nothing. */
static double step_ratio(const double *t, uint32_t n_ranks, const uint32_t *class_of, uint32_t r,
                         double *scratch) {
  uint32_t n = 0;
  for (uint32_t q = 0; q < n_ranks; q++)
    if (q != r && class_of[q] == class_of[r])
      scratch[n++] = t[q];
  if (n == 0)
    return 0;
  double m = median(scratch, n);
  return m > 0 ? t[r] / m : 0;
}

static uint32_t peers_of(uint32_t n_ranks, const uint32_t *class_of, uint32_t r) {
  uint32_t n = 0;
  for (uint32_t q = 0; q < n_ranks; q++)
    n += q != r && class_of[q] == class_of[r];
  return n;
}

uint32_t exec_find_stragglers(const double *compute, uint32_t n_steps, uint32_t n_ranks,
                              const uint32_t *class_of, double threshold,
                              struct exec_straggler **out) {
  PIPER_ASSERT(out != NULL && threshold > 0);
  *out = NULL;
  /* consistently: in three steps of four at least, and never on one step's word alone */
  uint32_t need = (uint32_t)ceil(0.75 * n_steps);
  if (n_steps < 2 || n_ranks < 2)
    return 0;
  double *scratch = g_new(double, n_ranks), *ratios = g_new(double, n_steps);
  GArray *found = g_array_new(FALSE, FALSE, sizeof(struct exec_straggler));
  for (uint32_t r = 0; r < n_ranks; r++) {
    uint32_t slow = 0;
    for (uint32_t s = 0; s < n_steps; s++) {
      ratios[s] = step_ratio(compute + (size_t)s * n_ranks, n_ranks, class_of, r, scratch);
      slow += ratios[s] > 1.0 + threshold;
    }
    if (slow < need)
      continue;
    struct exec_straggler x = {r, class_of[r], peers_of(n_ranks, class_of, r), slow,
                               median(ratios, n_steps)};
    g_array_append_val(found, x);
  }
  g_free(scratch);
  g_free(ratios);
  uint32_t n = found->len;
  *out = (struct exec_straggler *)(void *)g_array_free(found, n == 0);
  return n;
}
