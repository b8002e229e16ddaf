/* moe: the mixture-of-experts layer: router (softmax top-k), token dispatch and combine for
 * expert parallelism, and the SwiGLU experts over routed rows. */
#include "kernels.h"

#include "../base/assert.h"
#include "kernels-impl.h"

#include <math.h>
#include <string.h>

/* ---- router ------------------------------------------------------------------------------ */

size_t kernels_router_param_count(int C, int E) {
  return (size_t)C * E;
}
size_t kernels_router_saved_floats(int T, int E) {
  return (size_t)T * E;
}
size_t kernels_router_bwork_floats(int T, int E) {
  return (size_t)T * E;
}

/* Sum of the chosen probabilities, in slot order (BI recomputes exactly the forward's value). */
static float chosen_sum(const float *probs, const int32_t *ids, int K) {
  float s = 0.0f;
  for (int k = 0; k < K; k++)
    s += probs[ids[k]];
  return s;
}

/* ids [T, K], weights [T, K], probs [T, E] <- h [T, C], w [C, E] */
void kernels_router_forward(int32_t *ids, float *weights, float *saved, const float *h,
                            const float *params, int T, int C, int E, int K) {
  PIPER_ASSERT(K >= 1 && K <= E);
  kernels_gemm(false, false, T, E, C, 1.0f, h, C, params, E, 0.0f, saved, E);
  for (int t = 0; t < T; t++) {
    float *p = saved + (size_t)t * E;
    int32_t *id = ids + (size_t)t * K;
    float maxv = -INFINITY;
    for (int e = 0; e < E; e++)
      if (p[e] > maxv)
        maxv = p[e];
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
      p[e] = expf(p[e] - maxv);
      sum += p[e];
    }
    float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++)
      p[e] *= inv;
    /* Selection by repeated argmax: strict '>' keeps the lower id on ties. K is small. */
    for (int k = 0; k < K; k++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int j = 0; j < k; j++)
          taken = taken || id[j] == e;
        if (!taken && (best < 0 || p[e] > p[best]))
          best = e;
      }
      id[k] = best;
    }
    float s = chosen_sum(p, id, K);
    for (int k = 0; k < K; k++)
      weights[(size_t)t * K + k] = p[id[k]] / s;
  }
}

/* dh [T, C] (= or +=), dlogits [T, E] <- dweights [T, K]
 * w_k = p_k / S over the chosen: dp_j = (dw_j - sum_k dw_k w_k) / S for chosen j, else 0;
 * softmax: dlogit_e = p_e (dp_e - sum_e' p_e' dp_e'). */
void kernels_router_backward_input(float *dh, float *bwork, const float *dweights,
                                   const int32_t *ids, const float *weights, const float *saved,
                                   const float *params, int T, int C, int E, int K,
                                   bool accumulate) {
  for (int t = 0; t < T; t++) {
    const float *p = saved + (size_t)t * E;
    const int32_t *id = ids + (size_t)t * K;
    const float *w = weights + (size_t)t * K, *dw = dweights + (size_t)t * K;
    float *dl = bwork + (size_t)t * E;
    float s = chosen_sum(p, id, K);
    float wdw = 0.0f;
    for (int k = 0; k < K; k++)
      wdw += dw[k] * w[k];
    memset(dl, 0, (size_t)E * sizeof(float));
    for (int k = 0; k < K; k++)
      dl[id[k]] = (dw[k] - wdw) / s; /* dp, turned into dlogits below */
    float pdp = 0.0f;
    for (int e = 0; e < E; e++)
      pdp += p[e] * dl[e];
    for (int e = 0; e < E; e++)
      dl[e] = p[e] * (dl[e] - pdp);
  }
  kernels_gemm(false, true, T, C, E, 1.0f, bwork, E, params, E, accumulate ? 1.0f : 0.0f, dh, C);
}

/* dw [C, E] += h^T dlogits */
void kernels_router_backward_weight(float *dparams, const float *bwork, const float *h, int T,
                                    int C, int E) {
  kernels_gemm(true, false, C, E, T, 1.0f, h, C, bwork, E, 1.0f, dparams, E);
}

/* Fused backward: BI then BW, same shapes (BW reads what BI left in bwork). */
void kernels_router_backward(float *dh, float *dparams, float *bwork, const float *dweights,
                             const int32_t *ids, const float *weights, const float *saved,
                             const float *h, const float *params, int T, int C, int E, int K,
                             bool accumulate) {
  kernels_router_backward_input(dh, bwork, dweights, ids, weights, saved, params, T, C, E, K,
                                accumulate);
  kernels_router_backward_weight(dparams, bwork, h, T, C, E);
}

/* ---- dispatch / combine ------------------------------------------------------------------ */

int kernels_moe_owner(int expert, int E, int n_ranks) {
  PIPER_ASSERT(n_ranks >= 1 && E % n_ranks == 0 && expert >= 0 && expert < E);
  return expert / (E / n_ranks);
}

/* send_counts [n_ranks], route_row [T*K] <- ids [T, K] */
void kernels_moe_dispatch_plan(int32_t *send_counts, int32_t *route_row, const int32_t *ids, int T,
                               int K, int E, int n_ranks) {
  /* One pass per rank keeps the order (rank, token, slot) without a cursor array. */
  int32_t row = 0;
  for (int r = 0; r < n_ranks; r++) {
    int32_t start = row;
    for (size_t i = 0; i < (size_t)T * K; i++)
      if (kernels_moe_owner(ids[i], E, n_ranks) == r)
        route_row[i] = row++;
    send_counts[r] = row - start;
  }
}

/* send [T*K, C], send_expert [T*K], send_weight [T*K] <- h [T, C], weights [T, K]: each row
 * carries its routing weight to the expert, which applies it (kernels.h, EXPERT_FFN) */
void kernels_moe_dispatch_forward(float *send, int32_t *send_expert, float *send_weight,
                                  const float *h, const int32_t *ids, const float *weights,
                                  const int32_t *route_row, int T, int K, int C) {
  for (int t = 0; t < T; t++) {
    for (int k = 0; k < K; k++) {
      size_t i = (size_t)t * K + k, row = (size_t)route_row[i];
      memcpy(send + row * C, h + (size_t)t * C, (size_t)C * sizeof(float));
      send_expert[row] = ids[i];
      send_weight[row] = weights[i];
    }
  }
}

/* dh [T, C] (= or +=) <- dsend [T*K, C]; dweights [T, K] (written; NULL: none) <- dsend_weight
 * [T*K] */
void kernels_moe_dispatch_backward(float *dh, float *dweights, const float *dsend,
                                   const float *dsend_weight, const int32_t *route_row, int T,
                                   int K, int C, bool accumulate) {
  for (int t = 0; t < T; t++) {
    float *d = dh + (size_t)t * C;
    if (!accumulate)
      memset(d, 0, (size_t)C * sizeof(float));
    for (int k = 0; k < K; k++) {
      size_t i = (size_t)t * K + k;
      const float *src = dsend + (size_t)route_row[i] * C;
      for (int c = 0; c < C; c++)
        d[c] += src[c];
      if (dweights)
        dweights[i] = dsend_weight[route_row[i]];
    }
  }
}

/* m [T, C] <- y [T*K, C] (the expert outputs, already weighted) */
void kernels_moe_combine_forward(float *m, const float *y, const int32_t *route_row, int T, int K,
                                 int C) {
  for (int t = 0; t < T; t++) {
    float *mt = m + (size_t)t * C;
    memset(mt, 0, (size_t)C * sizeof(float));
    for (int k = 0; k < K; k++) {
      const float *yr = y + (size_t)route_row[(size_t)t * K + k] * C;
      for (int c = 0; c < C; c++)
        mt[c] += yr[c];
    }
  }
}

/* dy [T*K, C] <- dm [T, C]: each route's row gets its token's gradient */
void kernels_moe_combine_backward(float *dy, const float *dm, const int32_t *route_row, int T,
                                  int K, int C) {
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++)
      memcpy(dy + (size_t)route_row[(size_t)t * K + k] * C, dm + (size_t)t * C,
             (size_t)C * sizeof(float));
}

/* ---- expert FFN -------------------------------------------------------------------------- */

size_t kernels_expert_ffn_param_count(int E, int C, int F) {
  return 3 * (size_t)E * C * F;
}
size_t kernels_expert_ffn_saved_floats(int n_rows, int C, int F) {
  return (size_t)n_rows * ((size_t)C + 3 * (size_t)F + 1);
}
size_t kernels_expert_ffn_bwork_floats(int n_rows, int C, int F) {
  return (size_t)n_rows * ((size_t)C + 2 * (size_t)F);
}
size_t kernels_expert_ffn_scratch_floats(int n_rows, int C) {
  return (size_t)n_rows * C;
}

/* Copies the rows of expert e from src (row order) into dst (packed), or back when to_rows;
 * returns their number. add: when to_rows, dst rows += instead of =. */
static int expert_rows_move(float *dst, const float *src, const int32_t *row_expert, int n_rows,
                            int e, int C, bool to_rows, bool add) {
  int cnt = 0;
  for (int r = 0; r < n_rows; r++) {
    if (row_expert[r] != e)
      continue;
    size_t packed = (size_t)cnt * C, row = (size_t)r * C;
    if (!to_rows) {
      memcpy(dst + packed, src + row, (size_t)C * sizeof(float));
    } else if (!add) {
      memcpy(dst + row, src + packed, (size_t)C * sizeof(float));
    } else {
      for (int c = 0; c < C; c++)
        dst[row + c] += src[packed + c];
    }
    cnt++;
  }
  return cnt;
}

static int expert_rows_count(const int32_t *row_expert, int n_rows, int e) {
  int cnt = 0;
  for (int r = 0; r < n_rows; r++)
    cnt += row_expert[r] == e;
  return cnt;
}

static void check_row_experts(const int32_t *row_expert, int n_rows, int e_first, int e_count) {
  for (int r = 0; r < n_rows; r++) {
    PIPER_ASSERT(row_expert[r] >= e_first && row_expert[r] < e_first + e_count);
    (void)row_expert, (void)r, (void)e_first, (void)e_count;
  }
}

/* The packed rows' routing weights in saved: after act, or after u when act lives apart */
static float *saved_weights(const float *saved, const float *act_buf, size_t n, int F) {
  return (float *)saved + (act_buf ? 2 : 3) * n * F;
}

/* The packed rows' inputs: xs_buf where they live apart, else in saved after the weights
 * (last, so that the ops that do not read them need not know where they are) */
static float *saved_inputs(const float *saved, const float *xs_buf, const float *act_buf, size_t n,
                           int F) {
  return xs_buf ? (float *)xs_buf : saved_weights(saved, act_buf, n, F) + n;
}

/* out [n, C], saved = g, u, act [n, F], ws [n], xs [n, C] (grouped by expert; act in
 * act_buf, xs in xs_buf when given) <- in [n, C], row_weight [n]. act = silu(g)·u · w per
 * row, so out is the routed row's weighted output (Megatron-Core's weighted SwiGLU) and the
 * combine only sums. */
void kernels_expert_ffn_forward(float *out, float *saved, float *act_buf, float *xs_buf,
                                float *scratch, const float *in, const int32_t *row_expert,
                                const float *row_weight, int n_rows, const float *params,
                                int e_first, int e_count, int C, int F) {
  check_row_experts(row_expert, n_rows, e_first, e_count);
  size_t n = (size_t)n_rows, per = kernels_expert_ffn_param_count(1, C, F);
  float *g = saved, *u = g + n * F, *act = act_buf ? act_buf : u + n * F;
  float *ws = saved_weights(saved, act_buf, n, F), *xs = saved_inputs(saved, xs_buf, act_buf, n, F);
  size_t off = 0;
  for (int e = e_first; e < e_first + e_count; e++) {
    int cnt = expert_rows_move(xs + off * C, in, row_expert, n_rows, e, C, false, false);
    if (cnt == 0)
      continue;
    expert_rows_move(ws + off, row_weight, row_expert, n_rows, e, 1, false, false);
    const float *wg = params + (size_t)(e - e_first) * per;
    const float *wu = wg + (size_t)C * F, *wd = wu + (size_t)C * F;
    float *ge = g + off * F, *ue = u + off * F, *ae = act + off * F;
    kernels_gemm(false, false, cnt, F, C, 1.0f, xs + off * C, C, wg, F, 0.0f, ge, F);
    kernels_gemm(false, false, cnt, F, C, 1.0f, xs + off * C, C, wu, F, 0.0f, ue, F);
    kernels_impl_swiglu_forward(ae, ge, ue, (size_t)cnt * F);
    kernels_impl_rows_scale(ae, ws + off, cnt, F);
    kernels_gemm(false, false, cnt, C, F, 1.0f, ae, F, wd, C, 0.0f, scratch, C);
    expert_rows_move(out, scratch, row_expert, n_rows, e, C, true, false);
    off += (size_t)cnt;
  }
}

/* din [n, C] (= or +=), drow_weight [n] (written), bwork = dys [n, C], dg, du [n, F] (grouped)
 * <- dout [n, C]. With dact_w = dys wd^T the gradient of act = silu(g)·u · w: the weight's is
 * dact_w . silu(g)·u = du' . u, where du' = dact_w · silu(g) is the unweighted SwiGLU
 * backward's du; both SwiGLU gradients are then w times the unweighted ones (linear in dact). */
void kernels_expert_ffn_backward_input(float *din, float *drow_weight, float *bwork, float *scratch,
                                       const float *dout, const int32_t *row_expert, int n_rows,
                                       const float *saved, const float *act_buf,
                                       const float *params, int e_first, int e_count, int C, int F,
                                       bool accumulate) {
  check_row_experts(row_expert, n_rows, e_first, e_count);
  size_t n = (size_t)n_rows, per = kernels_expert_ffn_param_count(1, C, F);
  const float *g = saved, *u = g + n * F, *ws = saved_weights(saved, act_buf, n, F);
  float *dys = bwork, *dg = dys + n * C, *du = dg + n * F;
  size_t off = 0;
  for (int e = e_first; e < e_first + e_count; e++) {
    int cnt = expert_rows_move(dys + off * C, dout, row_expert, n_rows, e, C, false, false);
    if (cnt == 0)
      continue;
    const float *wg = params + (size_t)(e - e_first) * per;
    const float *wu = wg + (size_t)C * F, *wd = wu + (size_t)C * F;
    float *dge = dg + off * F, *due = du + off * F;
    kernels_gemm(false, true, cnt, F, C, 1.0f, dys + off * C, C, wd, C, 0.0f, dge, F);
    kernels_impl_swiglu_backward(dge, due, g + off * F, u + off * F, (size_t)cnt * F);
    /* scratch's first cnt floats: the packed rows' weight gradients, then scattered */
    for (int i = 0; i < cnt; i++)
      scratch[i] = (float)kernels_impl_dot_f(due + (size_t)i * F, u + (off + i) * F, (size_t)F);
    expert_rows_move(drow_weight, scratch, row_expert, n_rows, e, 1, true, false);
    kernels_impl_rows_scale(dge, ws + off, cnt, F);
    kernels_impl_rows_scale(due, ws + off, cnt, F);
    kernels_gemm(false, true, cnt, C, F, 1.0f, dge, F, wg, F, 0.0f, scratch, C);
    kernels_gemm(false, true, cnt, C, F, 1.0f, due, F, wu, F, 1.0f, scratch, C);
    expert_rows_move(din, scratch, row_expert, n_rows, e, C, true, accumulate);
    off += (size_t)cnt;
  }
}

/* per expert e: dwg += xs^T dg, dwu += xs^T du, dwd += act^T dys (act weighted) */
void kernels_expert_ffn_backward_weight(float *dparams, const float *bwork,
                                        const int32_t *row_expert, int n_rows, const float *saved,
                                        const float *act_buf, const float *xs_buf, int e_first,
                                        int e_count, int C, int F) {
  check_row_experts(row_expert, n_rows, e_first, e_count);
  size_t n = (size_t)n_rows, per = kernels_expert_ffn_param_count(1, C, F);
  const float *xs = saved_inputs(saved, xs_buf, act_buf, n, F);
  const float *act = act_buf ? act_buf : saved + 2 * n * F;
  const float *dys = bwork, *dg = dys + n * C, *du = dg + n * F;
  size_t off = 0;
  for (int e = e_first; e < e_first + e_count; e++) {
    int cnt = expert_rows_count(row_expert, n_rows, e);
    if (cnt == 0)
      continue;
    float *dwg = dparams + (size_t)(e - e_first) * per;
    float *dwu = dwg + (size_t)C * F, *dwd = dwu + (size_t)C * F;
    kernels_gemm(true, false, C, F, cnt, 1.0f, xs + off * C, C, dg + off * F, F, 1.0f, dwg, F);
    kernels_gemm(true, false, C, F, cnt, 1.0f, xs + off * C, C, du + off * F, F, 1.0f, dwu, F);
    kernels_gemm(true, false, F, C, cnt, 1.0f, act + off * F, F, dys + off * C, C, 1.0f, dwd, C);
    off += (size_t)cnt;
  }
}

/* Fused backward: BI then BW, same shapes (BW reads what BI left in bwork). */
void kernels_expert_ffn_backward(float *din, float *drow_weight, float *dparams, float *bwork,
                                 float *scratch, const float *dout, const int32_t *row_expert,
                                 int n_rows, const float *saved, const float *act, const float *xs,
                                 const float *params, int e_first, int e_count, int C, int F,
                                 bool accumulate) {
  kernels_expert_ffn_backward_input(din, drow_weight, bwork, scratch, dout, row_expert, n_rows,
                                    saved, act, params, e_first, e_count, C, F, accumulate);
  kernels_expert_ffn_backward_weight(dparams, bwork, row_expert, n_rows, saved, act, xs, e_first,
                                     e_count, C, F);
}

/* The forward's weighted swiglu over every row at once: elementwise, so the same bits as its
 * pass per expert (kernels_impl_swiglu_forward computes each element alike wherever it falls,
 * and each row is scaled by its own weight). act lives apart here, so the weights follow u. */
void kernels_expert_ffn_act_forward(float *act, const float *saved, int n_rows, int C, int F) {
  size_t n = (size_t)n_rows;
  const float *g = saved, *u = g + n * F;
  (void)C;
  kernels_impl_swiglu_forward(act, g, u, n * F);
  kernels_impl_rows_scale(act, saved_weights(saved, act, n, F), n_rows, F);
}
