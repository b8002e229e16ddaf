/* attention: causal grouped-query self-attention with rotary embeddings (the llama family). */
#include "kernels.h"

#include "../base/assert.h"

#include <math.h>
#include <string.h>

/* x [batch * seq, n_heads * D], rotated in place by position within the sequence. */
void kernels_rope(float *x, int batch, int seq, int n_heads, int head_dim, float theta,
                  bool inverse) {
  PIPER_ASSERT(head_dim % 2 == 0);
  int half = head_dim / 2;
  size_t row = (size_t)n_heads * head_dim;
  for (int s = 0; s < seq; s++) {
    for (int i = 0; i < half; i++) {
      /* Angles in double: s * theta^(-2i/D) reaches thousands of radians at long sequences. */
      double angle = s * pow(theta, -2.0 * i / head_dim);
      float c = (float)cos(angle), sn = (float)sin(angle);
      if (inverse)
        sn = -sn;
      for (int b = 0; b < batch; b++) {
        float *xr = x + ((size_t)b * seq + s) * row;
        for (int h = 0; h < n_heads; h++) {
          float *xh = xr + (size_t)h * head_dim;
          float x0 = xh[i], x1 = xh[i + half];
          xh[i] = x0 * c - x1 * sn;
          xh[i + half] = x1 * c + x0 * sn;
        }
      }
    }
  }
}

size_t kernels_attention_param_count(const struct kernels_attention_dims *d) {
  return (size_t)d->hidden * d->head_dim * (2 * (size_t)d->heads + 2 * (size_t)d->kv_heads);
}

size_t kernels_attention_saved_floats(const struct kernels_attention_dims *d) {
  size_t T = (size_t)d->batch * d->seq;
  return T * d->head_dim * (2 * (size_t)d->heads + 2 * (size_t)d->kv_heads) +
         (size_t)d->batch * d->heads * d->seq * d->seq;
}

size_t kernels_attention_bwork_floats(const struct kernels_attention_dims *d) {
  size_t T = (size_t)d->batch * d->seq;
  return T * d->head_dim * (2 * (size_t)d->heads + 2 * (size_t)d->kv_heads);
}

/* Pointers into params, saved and bwork (layouts in kernels.h). */
struct attention_views {
  size_t T, HD, KD;
  const float *wq, *wk, *wv, *wo;
  float *q, *k, *v, *p, *y;
  float *dy, *dq, *dk, *dv;
};

static struct attention_views attention_views(const struct kernels_attention_dims *d,
                                              const float *params, const float *saved,
                                              const float *bwork) {
  PIPER_ASSERT(d->heads > 0 && d->kv_heads > 0 && d->heads % d->kv_heads == 0);
  PIPER_ASSERT(d->head_dim % 2 == 0);
  struct attention_views w = {0};
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
  /* The views are shared by const and non-const callers; each function writes only the
   * buffers it owns (forward: saved, BI: bwork). */
  if (saved) {
    w.q = (float *)saved;
    w.k = w.q + w.T * w.HD;
    w.v = w.k + w.T * w.KD;
    w.p = w.v + w.T * w.KD;
    w.y = w.p + (size_t)d->batch * d->heads * d->seq * d->seq;
  }
  if (bwork) {
    w.dy = (float *)bwork;
    w.dq = w.dy + w.T * w.HD;
    w.dk = w.dq + w.T * w.HD;
    w.dv = w.dk + w.T * w.KD;
  }
  return w;
}

static float dot(const float *a, const float *b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* a [B*S, C], saved <- h [B*S, C] */
void kernels_attention_forward(float *a, float *saved, const float *h, const float *params,
                               const struct kernels_attention_dims *d) {
  struct attention_views w = attention_views(d, params, saved, NULL);
  int B = d->batch, S = d->seq, H = d->heads, D = d->head_dim, C = d->hidden;
  int T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD, group = H / d->kv_heads;
  kernels_gemm(false, false, T, HD, C, 1.0f, h, C, w.wq, HD, 0.0f, w.q, HD);
  kernels_gemm(false, false, T, KD, C, 1.0f, h, C, w.wk, KD, 0.0f, w.k, KD);
  kernels_gemm(false, false, T, KD, C, 1.0f, h, C, w.wv, KD, 0.0f, w.v, KD);
  kernels_rope(w.q, B, S, H, D, d->rope_theta, false);
  kernels_rope(w.k, B, S, d->kv_heads, D, d->rope_theta, false);
  float scale = 1.0f / sqrtf((float)D);
  for (int b = 0; b < B; b++) {
    for (int hh = 0; hh < H; hh++) {
      size_t kv_col = (size_t)(hh / group) * D;
      for (int i = 0; i < S; i++) {
        const float *qi = w.q + ((size_t)b * S + i) * HD + (size_t)hh * D;
        float *pi = w.p + (((size_t)b * H + hh) * S + i) * S;
        float maxv = -INFINITY;
        for (int j = 0; j <= i; j++) {
          pi[j] = scale * dot(qi, w.k + ((size_t)b * S + j) * KD + kv_col, D);
          if (pi[j] > maxv)
            maxv = pi[j];
        }
        double sum = 0.0;
        for (int j = 0; j <= i; j++) {
          pi[j] = expf(pi[j] - maxv);
          sum += pi[j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j <= i; j++)
          pi[j] *= inv;
        for (int j = i + 1; j < S; j++)
          pi[j] = 0.0f;
        float *yi = w.y + ((size_t)b * S + i) * HD + (size_t)hh * D;
        memset(yi, 0, (size_t)D * sizeof(float));
        for (int j = 0; j <= i; j++) {
          const float *vj = w.v + ((size_t)b * S + j) * KD + kv_col;
          for (int c = 0; c < D; c++)
            yi[c] += pi[j] * vj[c];
        }
      }
    }
  }
  kernels_gemm(false, false, T, C, HD, 1.0f, w.y, HD, w.wo, C, 0.0f, a, C);
}

/* dh [B*S, C] (= or +=), bwork <- da [B*S, C]
 * dp_ij = dy_i . v_j;  ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij');
 * dq_i = scale sum_j ds_ij k_j;  dk_j += scale ds_ij q_i;  dv_j += p_ij dy_i;  then RoPE^T. */
void kernels_attention_backward_input(float *dh, float *bwork, const float *da, const float *saved,
                                      const float *params, const struct kernels_attention_dims *d,
                                      bool accumulate) {
  struct attention_views w = attention_views(d, params, saved, bwork);
  int B = d->batch, S = d->seq, H = d->heads, D = d->head_dim, C = d->hidden;
  int T = (int)w.T, HD = (int)w.HD, KD = (int)w.KD, group = H / d->kv_heads;
  kernels_gemm(false, true, T, HD, C, 1.0f, da, C, w.wo, C, 0.0f, w.dy, HD);
  memset(w.dq, 0, w.T * w.HD * sizeof(float));
  memset(w.dk, 0, w.T * w.KD * sizeof(float));
  memset(w.dv, 0, w.T * w.KD * sizeof(float));
  float scale = 1.0f / sqrtf((float)D);
  for (int b = 0; b < B; b++) {
    for (int hh = 0; hh < H; hh++) {
      size_t kv_col = (size_t)(hh / group) * D;
      for (int i = 0; i < S; i++) {
        size_t qoff = ((size_t)b * S + i) * HD + (size_t)hh * D;
        const float *qi = w.q + qoff, *dyi = w.dy + qoff;
        float *dqi = w.dq + qoff;
        const float *pi = w.p + (((size_t)b * H + hh) * S + i) * S;
        /* Two passes recompute dp_ij instead of keeping an [S, S] scratch per head. */
        float pdp = 0.0f;
        for (int j = 0; j <= i; j++)
          pdp += pi[j] * dot(dyi, w.v + ((size_t)b * S + j) * KD + kv_col, D);
        for (int j = 0; j <= i; j++) {
          size_t koff = ((size_t)b * S + j) * KD + kv_col;
          const float *kj = w.k + koff, *vj = w.v + koff;
          float *dkj = w.dk + koff, *dvj = w.dv + koff;
          float ds = scale * pi[j] * (dot(dyi, vj, D) - pdp);
          for (int c = 0; c < D; c++) {
            dvj[c] += pi[j] * dyi[c];
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
      }
    }
  }
  kernels_rope(w.dq, B, S, H, D, d->rope_theta, true);
  kernels_rope(w.dk, B, S, d->kv_heads, D, d->rope_theta, true);
  kernels_gemm(false, true, T, C, HD, 1.0f, w.dq, HD, w.wq, HD, accumulate ? 1.0f : 0.0f, dh, C);
  kernels_gemm(false, true, T, C, KD, 1.0f, w.dk, KD, w.wk, KD, 1.0f, dh, C);
  kernels_gemm(false, true, T, C, KD, 1.0f, w.dv, KD, w.wv, KD, 1.0f, dh, C);
}

/* dwq += h^T dq, dwk += h^T dk, dwv += h^T dv, dwo += y^T da */
void kernels_attention_backward_weight(float *dparams, const float *bwork, const float *da,
                                       const float *h, const float *saved,
                                       const struct kernels_attention_dims *d) {
  struct attention_views w = attention_views(d, NULL, saved, bwork);
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
