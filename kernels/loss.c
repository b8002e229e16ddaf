/* loss: the LM head (logits = h w) fused with mean cross-entropy against the targets. */
#include "kernels.h"
#include "kernels-impl.h"

#include "../base/assert.h"

#include <math.h>

size_t kernels_lm_head_loss_param_count(int C, int V) {
  return (size_t)C * V;
}
size_t kernels_lm_head_loss_saved_floats(int T, int V) {
  (void)V;
  return 2 * (size_t)T; /* each row's max logit, then each row's 1 / sum of exp */
}
size_t kernels_lm_head_loss_bwork_floats(int T, int V) {
  (void)T, (void)V;
  return 0; /* BI keeps nothing for BW: both recompute the dlogits */
}

/* Rows of logits per forward chunk: about 8 MiB of per-thread scratch, so no [T, V] buffer
 * lives in the forward (at Llama-3's vocabulary, 16 rows). */
static int head_chunk_rows(int T, int V) {
  size_t rows = ((size_t)2 << 20) / (size_t)(V > 0 ? V : 1);
  return rows < 1 ? 1 : rows > (size_t)T ? T : (int)rows;
}

/* logits [n, C] x [C, V] (or [V, C] tied) -> out [n, V] */
static void head_logits(float *out, const float *h, const float *params,
                        enum kernels_lm_head_layout layout, int n, int C, int V) {
  if (layout == KERNELS_LM_HEAD_TIED)
    kernels_gemm(false, true, n, V, C, 1.0f, h, C, params, C, 0.0f, out, V);
  else
    kernels_gemm(false, false, n, V, C, 1.0f, h, C, params, V, 0.0f, out, V);
}

/* logits [n, V] -> exp(logit - max) in place; max[t], inv[t] = 1 / sum of the row's exp;
 * returns sum_t -log softmax[t, target] */
KERNELS_IMPL_VECTOR
static double softmax_stats(float *logits, float *max, float *inv, const int32_t *targets, int n,
                            int V) {
  double loss = 0.0;
  for (int t = 0; t < n; t++) {
    PIPER_ASSERT(targets[t] >= 0 && targets[t] < V);
    float *row = logits + (size_t)t * V;
    float maxv = kernels_impl_max(row, (size_t)V), target = row[targets[t]];
    double sum = kernels_impl_exp_sum(row, (size_t)V, maxv);
    /* -log p[target] = logsumexp - logit[target], which stays finite when p underflows. */
    loss += maxv + log(sum) - target;
    max[t] = maxv;
    inv[t] = (float)(1.0 / sum);
  }
  return loss;
}

/* saved = (max [T], inv [T]) <- h [T, C], w [C, V] (or wte [V, C] tied), targets [T], the
 * logits a chunk of rows at a time; *loss <- mean_t -log probs[t, target] */
void kernels_lm_head_loss_forward(float *loss_out, float *saved, const float *h,
                                  const int32_t *targets, const float *params,
                                  enum kernels_lm_head_layout layout, int T, int C, int V) {
  int rows = head_chunk_rows(T, V);
  float *chunk = kernels_impl_scratch(KERNELS_SCRATCH_LM_HEAD, (size_t)rows * V * sizeof(float));
  double loss = 0.0;
  for (int t0 = 0; t0 < T; t0 += rows) {
    int n = T - t0 < rows ? T - t0 : rows;
    head_logits(chunk, h + (size_t)t0 * C, params, layout, n, C, V);
    loss += softmax_stats(chunk, saved + t0, saved + T + t0, targets + t0, n, V);
  }
  *loss_out = (float)(loss / T);
}

/* dl [n, V] <- dlogits = (probs - onehot(target)) * scale for rows [t0, t0 + n), the
 * probabilities recomputed from the logits and the forward's max and 1 / sum, exactly as the
 * forward had them. A target outside [0, V) has no column (tensor parallelism's slice of the
 * vocabulary holds no target of another slice): that row's dlogits are the probabilities'. */
KERNELS_IMPL_VECTOR
static void dlogits_rows(float *dl, const float *h, const float *saved, const int32_t *targets,
                         const float *params, enum kernels_lm_head_layout layout, float scale,
                         int t0, int n, int T, int C, int V) {
  head_logits(dl, h + (size_t)t0 * C, params, layout, n, C, V);
  for (int t = 0; t < n; t++) {
    float *row = dl + (size_t)t * V;
    int tg = targets[t0 + t];
    kernels_impl_exp_sum(row, (size_t)V, saved[t0 + t]);
    float inv = saved[T + t0 + t];
    bool has = tg >= 0 && tg < V;
    float pt = has ? row[tg] * inv : 0.0f;
    for (int v = 0; v < V; v++)
      row[v] = row[v] * inv * scale;
    if (has)
      row[tg] = (pt - 1.0f) * scale;
  }
}

/* dh [T, C] (= or +=) <- dlogits w^T, a chunk of rows at a time: the logits recomputed from h
 * (one more head GEMM than keeping the probabilities). Nothing is kept for BW. */
void kernels_lm_head_loss_backward_input(float *dh, float *bwork, const float *saved,
                                         const float *h, const int32_t *targets,
                                         const float *params, enum kernels_lm_head_layout layout,
                                         float dloss, int T, int C, int V, bool accumulate) {
  (void)bwork;
  int rows = head_chunk_rows(T, V);
  float *dl = kernels_impl_scratch(KERNELS_SCRATCH_LM_HEAD, (size_t)rows * V * sizeof(float));
  float beta = accumulate ? 1.0f : 0.0f;
  for (int t0 = 0; t0 < T; t0 += rows) {
    int n = T - t0 < rows ? T - t0 : rows;
    dlogits_rows(dl, h, saved, targets, params, layout, dloss / (float)T, t0, n, T, C, V);
    float *out = dh + (size_t)t0 * C;
    if (layout == KERNELS_LM_HEAD_TIED)
      kernels_gemm(false, false, n, C, V, 1.0f, dl, V, params, C, beta, out, C);
    else
      kernels_gemm(false, true, n, C, V, 1.0f, dl, V, params, V, beta, out, C);
  }
}

/* dw [C, V] += h^T dlogits, or dwte [V, C] += dlogits^T h when tied, the dlogits recomputed a
 * chunk of rows at a time as BI does (one more head GEMM) */
void kernels_lm_head_loss_backward_weight(float *dparams, const float *bwork, const float *saved,
                                          const float *h, const int32_t *targets,
                                          const float *params, enum kernels_lm_head_layout layout,
                                          float dloss, int T, int C, int V) {
  (void)bwork;
  int rows = head_chunk_rows(T, V);
  float *dl = kernels_impl_scratch(KERNELS_SCRATCH_LM_HEAD, (size_t)rows * V * sizeof(float));
  for (int t0 = 0; t0 < T; t0 += rows) {
    int n = T - t0 < rows ? T - t0 : rows;
    const float *hc = h + (size_t)t0 * C;
    dlogits_rows(dl, h, saved, targets, params, layout, dloss / (float)T, t0, n, T, C, V);
    if (layout == KERNELS_LM_HEAD_TIED)
      kernels_gemm(true, false, V, C, n, 1.0f, dl, V, hc, C, 1.0f, dparams, C);
    else
      kernels_gemm(true, false, C, V, n, 1.0f, hc, C, dl, V, 1.0f, dparams, V);
  }
}

/* Fused backward: BI then BW (each recomputes the dlogits). */
void kernels_lm_head_loss_backward(float *dh, float *dparams, float *bwork, const float *saved,
                                   const float *h, const int32_t *targets, const float *params,
                                   enum kernels_lm_head_layout layout, float dloss, int T, int C,
                                   int V, bool accumulate) {
  kernels_lm_head_loss_backward_input(dh, bwork, saved, h, targets, params, layout, dloss, T, C,
                                      V, accumulate);
  kernels_lm_head_loss_backward_weight(dparams, bwork, saved, h, targets, params, layout, dloss, T,
                                       C, V);
}

/* ---- tensor parallelism: the vocabulary slice [lo, lo + n) ------------------------------------ */

/* logits [T, n] of the slice: h [T, C] x w [C, n] (untied), or x w^T of the table's rows */
static float *slice_logits(const float *h, const float *w, enum kernels_lm_head_layout layout,
                           int T, int C, int n) {
  float *out = kernels_impl_scratch(KERNELS_SCRATCH_LM_HEAD, (size_t)T * n * sizeof(float));
  head_logits(out, h, w, layout, T, C, n);
  return out;
}

/* stats [3, T] <- each row's max over the slice, its sum of exp, the target's logit (or 0) */
void kernels_tp_head_stats(float *stats, const float *h, const int32_t *targets, const float *w,
                           enum kernels_lm_head_layout layout, int T, int C, int lo, int n) {
  float *logits = slice_logits(h, w, layout, T, C, n);
  for (int t = 0; t < T; t++) {
    float *row = logits + (size_t)t * n;
    float m = kernels_impl_max(row, (size_t)n);
    int tg = targets[t] - lo;
    stats[t] = m;
    stats[2 * (size_t)T + t] = tg >= 0 && tg < n ? row[tg] : 0.0f;
    stats[T + t] = (float)kernels_impl_exp_sum(row, (size_t)n, m); /* exp in place */
  }
}

/* saved (max [T], 1 / sum [T]) <- the group's stats [tp][3, T]; *loss_out <- the mean loss */
void kernels_tp_head_combine(float *loss_out, float *saved, const float *gathered, int tp, int T) {
  double loss = 0.0;
  for (int t = 0; t < T; t++) {
    float m = gathered[t];
    for (int r = 1; r < tp; r++)
      m = fmaxf(m, gathered[(size_t)r * 3 * T + t]);
    double sum = 0.0, target = 0.0;
    for (int r = 0; r < tp; r++) {
      const float *st = gathered + (size_t)r * 3 * T;
      sum += (double)st[T + t] * exp((double)st[t] - (double)m);
      target += st[2 * (size_t)T + t];
    }
    saved[t] = m;
    saved[T + t] = (float)(1.0 / sum);
    loss += (double)m + log(sum) - target;
  }
  *loss_out = (float)(loss / T);
}

/* The whole head's backward over the slice (its chunks of rows), the targets as the slice's
 * columns (none outside it): dh = (a partial sum), dw += */
void kernels_tp_head_backward(float *dh, float *dw, const float *saved, const float *h,
                              const int32_t *targets, const float *w,
                              enum kernels_lm_head_layout layout, float dloss, int T, int C,
                              int lo, int n) {
  int32_t *local = kernels_impl_scratch(KERNELS_SCRATCH_TP_TARGETS, (size_t)T * sizeof(int32_t));
  for (int t = 0; t < T; t++)
    local[t] = targets[t] - lo >= 0 && targets[t] - lo < n ? targets[t] - lo : -1;
  if (dh)
    kernels_lm_head_loss_backward_input(dh, NULL, saved, h, local, w, layout, dloss, T, C, n,
                                        false);
  if (dw)
    kernels_lm_head_loss_backward_weight(dw, NULL, saved, h, local, w, layout, dloss, T, C, n);
}
