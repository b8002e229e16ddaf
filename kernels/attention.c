/* attention: causal grouped-query self-attention with rotary embeddings (the llama family). */
#include "kernels.h"
#include "kernels-impl.h"

#include "../base/assert.h"

#include <math.h>
#include <string.h>

size_t kernels_attention_param_count(const struct kernels_attention_dims *d) {
  return (size_t)d->hidden * d->head_dim * (2 * (size_t)d->heads + 2 * (size_t)d->kv_heads);
}

/* q, k, v (after RoPE), the log-sum-exp of every score row and the core output y: what the
 * models' attention keeps (models/build.c: qkv, core output, lse). The probabilities are not
 * kept: the backward recomputes them block by block from q, k and lse, flash-style, with the
 * very operations the forward used, so they are bit-identical to the forward's. */
size_t kernels_attention_saved_floats(const struct kernels_attention_dims *d) {
  size_t T = (size_t)d->batch * d->seq;
  return T * d->head_dim * (2 * (size_t)d->heads + 2 * (size_t)d->kv_heads) + T * d->heads;
}

size_t kernels_attention_core_floats(const struct kernels_attention_dims *d) {
  size_t T = (size_t)d->batch * d->seq;
  return T * d->heads + T * d->head_dim * (size_t)d->heads;
}

size_t kernels_attention_bwork_floats(const struct kernels_attention_dims *d) {
  size_t T = (size_t)d->batch * d->seq;
  return T * d->head_dim * (2 * (size_t)d->heads + 2 * (size_t)d->kv_heads);
}

struct kernels_attention_views kernels_attention_views(const struct kernels_attention_dims *d,
                                                      const float *params, const float *saved,
                                                      const float *bwork) {
  PIPER_ASSERT(d->heads > 0 && d->kv_heads > 0 && d->heads % d->kv_heads == 0);
  PIPER_ASSERT(d->head_dim % 2 == 0);
  struct kernels_attention_views w = {0};
  w.T = (size_t)d->batch * d->seq;
  w.HD = (size_t)d->heads * d->head_dim;
  w.KD = (size_t)d->kv_heads * d->head_dim;
  size_t C = (size_t)d->hidden;
  if (params) {
    w.wq = params;
    w.wk = w.wq + C * w.HD;
    w.wv = w.wk + C * w.KD;
    w.wo = w.wv + C * w.KD;
  }
  if (saved) {
    w.q = (float *)saved;
    w.k = w.q + w.T * w.HD;
    w.v = w.k + w.T * w.KD;
    w.lse = d->core ? d->core : w.v + w.T * w.KD;
    w.y = w.lse + w.T * (size_t)d->heads;
  }
  if (bwork) {
    w.dy = (float *)bwork;
    w.dq = w.dy + w.T * w.HD;
    w.dk = w.dq + w.T * w.HD;
    w.dv = w.dk + w.T * w.KD;
  }
  return w;
}

/* Query rows per causal block: QK^T and PV run one GEMM per block of rows over the keys up to
 * the block's last row, so the work above the diagonal is at most half a block per row. 64
 * keeps the GEMMs big enough for BLAS's kernels at seq 256 while wasting < 1/8 at seq >= 512. */
#define ATTENTION_BLOCK 64

/* One (sequence, query head): strided views into q/k/v/y/lse (and their gradients), GQA by
 * pointing k/v at the shared kv head, never copying it. p is the kernel's scratch for one row
 * block of probabilities ([block, S]). */
struct attention_head {
  int S, D, HD, KD;
  const float *q, *k, *v;
  float *lse, *y, *p;
  float *dy, *dq, *dk, *dv;
};

static struct attention_head attention_head(const struct kernels_attention_views *w,
                                            const struct kernels_attention_dims *d, int b, int hh) {
  int S = d->seq, D = d->head_dim, group = d->heads / d->kv_heads;
  size_t qoff = (size_t)b * S * w->HD + (size_t)hh * D;
  size_t koff = (size_t)b * S * w->KD + (size_t)(hh / group) * D;
  struct attention_head a = {S,
                             D,
                             (int)w->HD,
                             (int)w->KD,
                             w->q + qoff,
                             w->k + koff,
                             w->v + koff,
                             w->lse + ((size_t)b * d->heads + hh) * S,
                             NULL,
                             NULL,
                             NULL,
                             NULL,
                             NULL,
                             NULL};
  if (w->y)
    a.y = w->y + qoff;
  if (w->dy) {
    a.dy = w->dy + qoff;
    a.dq = w->dq + qoff;
    a.dk = w->dk + koff;
    a.dv = w->dv + koff;
  }
  return a;
}

/* Rows [i0, i0 + m) of a causal block, row r at pb + r ld holding the scores of its keys:
 * p = exp(s - lse) over the causal prefix [0, i0 + r + 1), zeros after it up to ld (exactly
 * causal, whatever the block size). */
KERNELS_IMPL_VECTOR
static void softmax_apply_block(float *pb, int ld, int i0, int m, const float *lse) {
  for (int r = 0; r < m; r++) {
    float *p = pb + (size_t)r * ld;
    int len = i0 + r + 1;
    float shift = lse[i0 + r];
    for (int j = 0; j < len; j++)
      p[j] = kernels_impl_expf(p[j] - shift);
    for (int j = len; j < ld; j++)
      p[j] = 0.0f;
  }
}

/* The forward's softmax of the same block: each row's log-sum-exp into lse (a max pass, a
 * sum of exp(s - max) into a scratch row that stays in L1), then p as the backward will
 * recompute it (softmax_apply_block). */
KERNELS_IMPL_VECTOR
static void softmax_block(float *pb, int ld, int i0, int m, float *lse, float *row) {
  for (int r = 0; r < m; r++) {
    const float *p = pb + (size_t)r * ld;
    int len = i0 + r + 1;
    float maxv = kernels_impl_max(p, (size_t)len);
    memcpy(row, p, (size_t)len * sizeof(float));
    lse[i0 + r] = maxv + (float)log(kernels_impl_exp_sum(row, (size_t)len, maxv));
  }
  softmax_apply_block(pb, ld, i0, m, lse);
}

/* The same block's softmax backward: on entry ds [m, n] holds dP = dy v^T; on exit
 * dS = scale p (dP - rowsum(p dP)) on the causal prefix, zeros after it. */
KERNELS_IMPL_VECTOR
static void softmax_backward_block(float *ds, const float *pb, int ld, int i0, int m, int n,
                                   float scale) {
  for (int r = 0; r < m; r++) {
    const float *pr = pb + (size_t)r * ld;
    float *dr = ds + (size_t)r * n;
    int len = i0 + r + 1;
    float pdp = (float)kernels_impl_dot_f(pr, dr, (size_t)len);
    for (int j = 0; j < len; j++)
      dr[j] = scale * pr[j] * (dr[j] - pdp);
    for (int j = len; j < n; j++)
      dr[j] = 0.0f;
  }
}

/* The scores of row block [i0, i0 + m) over keys [0, n): scale q k^T into pb [m, S]. The
 * forward and the backward's recomputation make this same call. */
static void scores_block(const struct attention_head *a, float scale, int i0, int m, int n,
                         float *pb) {
  kernels_gemm(false, true, m, n, a->D, scale, a->q + (size_t)i0 * a->HD, a->HD, a->k, a->KD,
               0.0f, pb, a->S);
}

/* p = softmax(scale q k^T) (causal), y = p v, one row block at a time; lse kept. */
static void attention_head_forward(const struct attention_head *a, float scale, float *row) {
  int S = a->S;
  for (int i0 = 0; i0 < S; i0 += ATTENTION_BLOCK) {
    int m = S - i0 < ATTENTION_BLOCK ? S - i0 : ATTENTION_BLOCK, n = i0 + m;
    scores_block(a, scale, i0, m, n, a->p);
    softmax_block(a->p, S, i0, m, a->lse, row);
    kernels_gemm(false, false, m, a->D, n, 1.0f, a->p, S, a->v, a->KD, 0.0f,
                 a->y + (size_t)i0 * a->HD, a->HD);
  }
}

/* lse, y <- q, k, v: every (sequence, head) */
static void attention_core(const struct kernels_attention_views *w,
                           const struct kernels_attention_dims *d) {
  int S = d->seq;
  float scale = 1.0f / sqrtf((float)d->head_dim);
  float *pb = kernels_impl_scratch(KERNELS_SCRATCH_ATTENTION_P,
                                   ((size_t)ATTENTION_BLOCK + 1) * S * sizeof(float));
  for (int b = 0; b < d->batch; b++)
    for (int hh = 0; hh < d->heads; hh++) {
      struct attention_head ah = attention_head(w, d, b, hh);
      ah.p = pb;
      attention_head_forward(&ah, scale, pb + (size_t)ATTENTION_BLOCK * S);
    }
}

/* RoPE of q or k (heads of them) at their positions: the whole sequence's, or under context
 * parallelism the rank's chunks' global ones. */
static void rope(float *x, const struct kernels_attention_dims *d, int heads, bool inverse) {
  if (d->cp > 1)
    kernels_rope_cp(x, d->batch, d->seq * d->cp, d->cp, d->cp_rank, heads, d->head_dim,
                    d->rope_theta, d->rope_scaling, inverse);
  else
    kernels_rope_scaled(x, d->batch, d->seq, heads, d->head_dim, d->rope_theta, d->rope_scaling,
                        inverse);
}

void kernels_attention_qkv_forward(float *saved, const float *h, const float *params,
                                   const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, NULL);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD;
  kernels_gemm(false, false, T, HD, C, 1.0f, h, C, w.wq, HD, 0.0f, w.q, HD);
  kernels_gemm(false, false, T, KD, C, 1.0f, h, C, w.wk, KD, 0.0f, w.k, KD);
  kernels_gemm(false, false, T, KD, C, 1.0f, h, C, w.wv, KD, 0.0f, w.v, KD);
  rope(w.q, d, d->heads, false);
  rope(w.k, d, d->kv_heads, false);
}

void kernels_attention_out_forward(float *a, const float *saved, const float *params,
                                   const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, NULL);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD;
  kernels_gemm(false, false, T, C, HD, 1.0f, w.y, HD, w.wo, C, 0.0f, a, C);
}

/* a [B*S, C], saved <- h [B*S, C] */
void kernels_attention_forward(float *a, float *saved, const float *h, const float *params,
                               const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, NULL);
  kernels_attention_qkv_forward(saved, h, params, d);
  attention_core(&w, d);
  kernels_attention_out_forward(a, saved, params, d);
}

void kernels_attention_core_forward(float *saved, const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, NULL, saved, NULL);
  attention_core(&w, d);
}

/* For row block [i0, i0 + m) over keys [0, n): p recomputed from q, k and lse; dP = dy v^T;
 * dS = scale p (dP - rowsum(p dP)); dq = dS k; dk += dS^T q; dv += p^T dy. dq is written, dk
 * and dv accumulate over blocks and over the query heads that share the kv head. */
static void attention_head_backward(const struct attention_head *a, float scale, float *ds) {
  int S = a->S, D = a->D, HD = a->HD, KD = a->KD;
  for (int i0 = 0; i0 < S; i0 += ATTENTION_BLOCK) {
    int m = S - i0 < ATTENTION_BLOCK ? S - i0 : ATTENTION_BLOCK, n = i0 + m;
    const float *pb = a->p, *dyb = a->dy + (size_t)i0 * HD;
    scores_block(a, scale, i0, m, n, a->p);
    softmax_apply_block(a->p, S, i0, m, a->lse);
    kernels_gemm(false, true, m, n, D, 1.0f, dyb, HD, a->v, KD, 0.0f, ds, n);
    softmax_backward_block(ds, pb, S, i0, m, n, scale);
    kernels_gemm(false, false, m, D, n, 1.0f, ds, n, a->k, KD, 0.0f, a->dq + (size_t)i0 * HD, HD);
    kernels_gemm(true, false, n, D, m, 1.0f, ds, n, a->q + (size_t)i0 * HD, HD, 1.0f, a->dk, KD);
    kernels_gemm(true, false, n, D, m, 1.0f, pb, S, dyb, HD, 1.0f, a->dv, KD);
  }
}

/* dh [B*S, C] (= or +=), bwork <- da [B*S, C]
 * dp_ij = dy_i . v_j;  ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij');
 * dq_i = scale sum_j ds_ij k_j;  dk_j += scale ds_ij q_i;  dv_j += p_ij dy_i;  then RoPE^T. */
void kernels_attention_out_backward_input(float *bwork, const float *da, const float *params,
                                          const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, params, NULL, bwork);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD;
  kernels_gemm(false, true, T, HD, C, 1.0f, da, C, w.wo, C, 0.0f, w.dy, HD);
}

void kernels_attention_qkv_backward_input(float *dh, float *bwork, const float *params,
                                          const struct kernels_attention_dims *d,
                                          bool accumulate) {
  struct kernels_attention_views w = kernels_attention_views(d, params, NULL, bwork);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD;
  rope(w.dq, d, d->heads, true);
  rope(w.dk, d, d->kv_heads, true);
  kernels_gemm(false, true, T, C, HD, 1.0f, w.dq, HD, w.wq, HD, accumulate ? 1.0f : 0.0f, dh, C);
  kernels_gemm(false, true, T, C, KD, 1.0f, w.dk, KD, w.wk, KD, 1.0f, dh, C);
  kernels_gemm(false, true, T, C, KD, 1.0f, w.dv, KD, w.wv, KD, 1.0f, dh, C);
}

void kernels_attention_backward_input(float *dh, float *bwork, const float *da, const float *saved,
                                      const float *params, const struct kernels_attention_dims *d,
                                      bool accumulate) {
  struct kernels_attention_views w = kernels_attention_views(d, params, saved, bwork);
  int B = d->batch, S = d->seq, H = d->heads, D = d->head_dim;
  kernels_attention_out_backward_input(bwork, da, params, d);
  memset(w.dk, 0, w.T * w.KD * sizeof(float));
  memset(w.dv, 0, w.T * w.KD * sizeof(float));
  float scale = 1.0f / sqrtf((float)D);
  float *ds = kernels_impl_scratch(KERNELS_SCRATCH_ATTENTION_DS,
                                   (size_t)ATTENTION_BLOCK * S * sizeof(float));
  float *pb = kernels_impl_scratch(KERNELS_SCRATCH_ATTENTION_P,
                                   ((size_t)ATTENTION_BLOCK + 1) * S * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int hh = 0; hh < H; hh++) {
      struct attention_head ah = attention_head(&w, d, b, hh);
      ah.p = pb;
      attention_head_backward(&ah, scale, ds);
    }
  kernels_attention_qkv_backward_input(dh, bwork, params, d, accumulate);
}

/* dwq += h^T dq, dwk += h^T dk, dwv += h^T dv, dwo += y^T da */
void kernels_attention_backward_weight(float *dparams, const float *bwork, const float *da,
                                       const float *h, const float *saved,
                                       const struct kernels_attention_dims *d) {
  struct kernels_attention_views w = kernels_attention_views(d, NULL, saved, bwork);
  int C = d->hidden, T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD;
  float *dwq = dparams, *dwk = dwq + (size_t)C * HD, *dwv = dwk + (size_t)C * KD;
  float *dwo = dwv + (size_t)C * KD;
  kernels_gemm(true, false, C, HD, T, 1.0f, h, C, w.dq, HD, 1.0f, dwq, HD);
  kernels_gemm(true, false, C, KD, T, 1.0f, h, C, w.dk, KD, 1.0f, dwk, KD);
  kernels_gemm(true, false, C, KD, T, 1.0f, h, C, w.dv, KD, 1.0f, dwv, KD);
  kernels_gemm(true, false, HD, C, T, 1.0f, w.y, HD, da, C, 1.0f, dwo, C);
}

/* Fused backward: BI then BW, same shapes (BW reads what BI left in bwork). */
void kernels_attention_backward(float *dh, float *dparams, float *bwork, const float *da,
                                const float *h, const float *saved, const float *params,
                                const struct kernels_attention_dims *d, bool accumulate) {
  kernels_attention_backward_input(dh, bwork, da, saved, params, d, accumulate);
  kernels_attention_backward_weight(dparams, bwork, da, h, saved, d);
}
