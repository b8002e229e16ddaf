/* loss: the LM head (logits = h w) fused with mean cross-entropy against the targets. */
#include "kernels.h"
#include "kernels-impl.h"

#include "../base/assert.h"

#include <math.h>

size_t kernels_lm_head_loss_param_count(int C, int V) {
  return (size_t)C * V;
}
size_t kernels_lm_head_loss_saved_floats(int T, int V) {
  return (size_t)T * V;
}
size_t kernels_lm_head_loss_bwork_floats(int T, int V) {
  return (size_t)T * V;
}

/* logits [T, V] -> probs in place; returns sum_t -log probs[t, target] */
KERNELS_IMPL_VECTOR
static double softmax_loss(float *logits, const int32_t *targets, int T, int V) {
  double loss = 0.0;
  for (int t = 0; t < T; t++) {
    PIPER_ASSERT(targets[t] >= 0 && targets[t] < V);
    float *row = logits + (size_t)t * V;
    float maxv = kernels_impl_max(row, (size_t)V), target = row[targets[t]];
    /* One pass for exp and sum (a row of the logits stays in L1), then one to normalise. */
    double sum = kernels_impl_exp_sum(row, (size_t)V, maxv);
    /* -log p[target] = logsumexp - logit[target], which stays finite when p underflows. */
    loss += maxv + log(sum) - target;
    float inv = (float)(1.0 / sum);
    for (int v = 0; v < V; v++)
      row[v] *= inv;
  }
  return loss;
}

/* probs [T, V] <- h [T, C], w [C, V] (or wte [V, C] tied), targets [T];
 * returns mean_t -log probs[t, target] */
float kernels_lm_head_loss_forward(float *saved, const float *h, const int32_t *targets,
                                   const float *params, enum kernels_lm_head_layout layout, int T,
                                   int C, int V) {
  if (layout == KERNELS_LM_HEAD_TIED)
    kernels_gemm(false, true, T, V, C, 1.0f, h, C, params, C, 0.0f, saved, V);
  else
    kernels_gemm(false, false, T, V, C, 1.0f, h, C, params, V, 0.0f, saved, V);
  return (float)(softmax_loss(saved, targets, T, V) / T);
}

/* dh [T, C] (= or +=), dlogits [T, V] = (probs - onehot(target)) * dloss / T */
void kernels_lm_head_loss_backward_input(float *dh, float *bwork, const float *saved,
                                         const int32_t *targets, const float *params,
                                         enum kernels_lm_head_layout layout, float dloss, int T,
                                         int C, int V, bool accumulate) {
  float scale = dloss / (float)T;
  for (int t = 0; t < T; t++) {
    const float *p = saved + (size_t)t * V;
    float *dl = bwork + (size_t)t * V;
    float pt = p[targets[t]]; /* bwork may alias saved: read before the row is written */
    for (int v = 0; v < V; v++)
      dl[v] = p[v] * scale;
    dl[targets[t]] = (pt - 1.0f) * scale;
  }
  float beta = accumulate ? 1.0f : 0.0f;
  if (layout == KERNELS_LM_HEAD_TIED)
    kernels_gemm(false, false, T, C, V, 1.0f, bwork, V, params, C, beta, dh, C);
  else
    kernels_gemm(false, true, T, C, V, 1.0f, bwork, V, params, V, beta, dh, C);
}

/* dw [C, V] += h^T dlogits, or dwte [V, C] += dlogits^T h when tied */
void kernels_lm_head_loss_backward_weight(float *dparams, const float *bwork, const float *h,
                                          enum kernels_lm_head_layout layout, int T, int C, int V) {
  if (layout == KERNELS_LM_HEAD_TIED)
    kernels_gemm(true, false, V, C, T, 1.0f, bwork, V, h, C, 1.0f, dparams, C);
  else
    kernels_gemm(true, false, C, V, T, 1.0f, h, C, bwork, V, 1.0f, dparams, V);
}

/* Fused backward: BI then BW, same shapes (BW reads what BI left in bwork). */
void kernels_lm_head_loss_backward(float *dh, float *dparams, float *bwork, const float *saved,
                                   const float *h, const int32_t *targets, const float *params,
                                   enum kernels_lm_head_layout layout, float dloss, int T, int C,
                                   int V, bool accumulate) {
  kernels_lm_head_loss_backward_input(dh, bwork, saved, targets, params, layout, dloss, T, C, V,
                                      accumulate);
  kernels_lm_head_loss_backward_weight(dparams, bwork, h, layout, T, C, V);
}
