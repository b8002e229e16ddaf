/* attention_cp: the blocks of ring attention under context parallelism (docs/directives.md,
 * "Context parallelism"): one query chunk against one key chunk of the same sequence, causal by
 * their global positions, and the log-sum-exp merge of partial results (Milakov & Gimelshein
 * 2018's online softmax; Megatron's flash_attn_fwd_out_correction). exec/context_parallel.c runs
 * them per chunk pair through the kernel table; this is the host backend's entry and the plain
 * reference the cuda backend's blocks are checked against (tests/gpu/check_kernels.c). lse is
 * [H, m], a row (head h, query i) at h m + i. */
#include "kernels.h"
#include "kernels-impl.h"

#include "../base/assert.h"

#include <math.h>
#include <string.h>

/* Query row i of head h of a block: its scores against the visible keys into s[n] (masked:
 * -INFINITY); returns the row's maximum (-INFINITY when it sees no key). */
static float block_scores(const struct kernels_attention_block *b, const float *q, const float *k,
                          int i, int h, float *s) {
  int D = b->head_dim, group = b->heads / b->kv_heads, kh = h / group;
  const float *qi = q + ((size_t)i * b->heads + (size_t)h) * (size_t)D;
  float most = -INFINITY;
  for (int j = 0; j < b->n; j++) {
    if (b->k0 + j > b->q0 + i) { /* a later position: causal mask */
      s[j] = -INFINITY;
      continue;
    }
    const float *kj = k + ((size_t)j * b->kv_heads + (size_t)kh) * (size_t)D;
    float dot = 0;
    for (int e = 0; e < D; e++)
      dot += qi[e] * kj[e];
    s[j] = dot * b->scale;
    most = s[j] > most ? s[j] : most;
  }
  return most;
}

/* y, lse (=) <- the block's softmax(q k^T) v */
static void block_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                          const struct kernels_attention_block *b) {
  PIPER_ASSERT(b->heads % b->kv_heads == 0);
  float *scratch = kernels_impl_scratch(KERNELS_SCRATCH_ATTENTION_BLOCK,
                                        (size_t)b->n * sizeof(float));
  int D = b->head_dim, group = b->heads / b->kv_heads;
  for (int i = 0; i < b->m; i++)
    for (int h = 0; h < b->heads; h++) {
      float *yi = y + ((size_t)i * b->heads + (size_t)h) * (size_t)D;
      float most = block_scores(b, q, k, i, h, scratch);
      memset(yi, 0, sizeof(float) * (size_t)D);
      if (most == -INFINITY) { /* sees no key of this block: contributes nothing to a merge */
        lse[(size_t)h * b->m + (size_t)i] = -INFINITY;
        continue;
      }
      double sum = 0;
      for (int j = 0; j < b->n; j++) {
        if (scratch[j] == -INFINITY)
          continue;
        float p = expf(scratch[j] - most);
        sum += p;
        const float *vj = v + ((size_t)j * b->kv_heads + (size_t)(h / group)) * (size_t)D;
        for (int e = 0; e < D; e++)
          yi[e] += p * vj[e];
      }
      for (int e = 0; e < D; e++)
        yi[e] = (float)(yi[e] / sum);
      lse[(size_t)h * b->m + (size_t)i] = most + (float)log(sum);
    }
}

void kernels_attention_block_forward(float *y, float *lse, const float *q, const float *k,
                                     const float *v, const struct kernels_attention_block *b,
                                     bool merge) {
  if (!merge) {
    block_forward(y, lse, q, k, v, b);
    return;
  }
  size_t ny = (size_t)b->m * b->heads * b->head_dim, nl = (size_t)b->m * b->heads;
  float *yb = kernels_impl_scratch(KERNELS_SCRATCH_ATTENTION_BLOCK_Y, (ny + nl) * sizeof(float));
  block_forward(yb, yb + ny, q, k, v, b);
  kernels_attention_merge(y, lse, yb, yb + ny, b->m, b->heads, b->head_dim);
}

void kernels_attention_merge(float *y, float *lse, const float *y_block, const float *lse_block,
                             int m, int heads, int head_dim) {
  for (int i = 0; i < m; i++)
    for (int h = 0; h < heads; h++) {
      size_t r = (size_t)h * m + (size_t)i, row = ((size_t)i * heads + (size_t)h) * head_dim;
      float a = lse[r], c = lse_block[r];
      if (c == -INFINITY)
        continue;
      float *yr = y + row;
      const float *br = y_block + row;
      if (a == -INFINITY) {
        memcpy(yr, br, sizeof(float) * (size_t)head_dim);
        lse[r] = c;
        continue;
      }
      /* lse' = log(e^a + e^c); each part weighted by its share of the new normaliser */
      float most = a > c ? a : c;
      float merged = most + log1pf(expf(-fabsf(a - c)));
      float wa = expf(a - merged), wc = expf(c - merged);
      for (int e = 0; e < head_dim; e++)
        yr[e] = wa * yr[e] + wc * br[e];
      lse[r] = merged;
    }
}

void kernels_attention_block_backward(float *dq, float *dk, float *dv, const float *dy,
                                      const float *y, const float *lse, const float *q,
                                      const float *k, const float *v,
                                      const struct kernels_attention_block *b) {
  int D = b->head_dim, group = b->heads / b->kv_heads;
  float *scratch = kernels_impl_scratch(KERNELS_SCRATCH_ATTENTION_BLOCK,
                                        (size_t)b->n * sizeof(float));
  for (int i = 0; i < b->m; i++)
    for (int h = 0; h < b->heads; h++) {
      size_t row = (size_t)i * b->heads + (size_t)h;
      const float *dyi = dy + row * (size_t)D, *yi = y + row * (size_t)D;
      const float *qi = q + row * (size_t)D;
      float *dqi = dq + row * (size_t)D;
      if (block_scores(b, q, k, i, h, scratch) == -INFINITY)
        continue;
      float delta = 0; /* rowsum(dy * y), with y the merged output (FlashAttention-2's D) */
      for (int e = 0; e < D; e++)
        delta += dyi[e] * yi[e];
      for (int j = 0; j < b->n; j++) {
        if (scratch[j] == -INFINITY)
          continue;
        size_t kv = (size_t)j * b->kv_heads + (size_t)(h / group);
        const float *kj = k + kv * (size_t)D, *vj = v + kv * (size_t)D;
        float p = expf(scratch[j] - lse[(size_t)h * b->m + (size_t)i]), dp = 0; /* the final softmax, by the merged lse */
        for (int e = 0; e < D; e++)
          dp += dyi[e] * vj[e];
        float ds = p * (dp - delta) * b->scale;
        for (int e = 0; e < D; e++) {
          dqi[e] += ds * kj[e];
          dk[kv * (size_t)D + (size_t)e] += ds * qi[e];
          dv[kv * (size_t)D + (size_t)e] += p * dyi[e];
        }
      }
    }
}
