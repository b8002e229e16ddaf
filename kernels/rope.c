/* rope: rotary position embedding with cos/sin tables built once per (theta, seq, head_dim,
 * scaling) and shared by every thread for the life of the process. */
#include "kernels.h"

#include "../base/assert.h"

#include <glib.h>
#include <math.h>
#include <string.h>

/* One table: cos and sin [seq, head_dim / 2]. Immutable once published, so readers need the
 * lock only to find it. */
struct rope_table {
  float theta;
  int seq, head_dim;
  struct kernels_rope_scaling scaling;
  float *cos, *sin;
  struct rope_table *next;
};

/* Process-lifetime cache: a run sees a handful of shapes (one per model and sequence length),
 * so a list is enough; entries are never freed (they stay reachable from the list head). */
static GMutex rope_lock;
static struct rope_table *rope_tables;

bool kernels_rope_scaling_supported(const char *type) {
  return type == NULL || type[0] == '\0' || strcmp(type, "default") == 0 ||
         strcmp(type, "llama3") == 0;
}

/* Llama 3's frequency-dependent scaling (Hugging Face _compute_llama3_parameters): long
 * wavelengths are slowed by `factor`, short ones kept, the band between interpolated. */
static double rope_llama3_inv_freq(double inv_freq, const struct kernels_rope_scaling *sc) {
  double old_ctx = sc->original_max_position_embeddings;
  double low_wavelen = old_ctx / sc->low_freq_factor;
  double high_wavelen = old_ctx / sc->high_freq_factor;
  double wavelen = 2.0 * M_PI / inv_freq;
  if (wavelen < high_wavelen)
    return inv_freq;
  if (wavelen > low_wavelen)
    return inv_freq / sc->factor;
  double smooth =
      (old_ctx / wavelen - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
  return (1.0 - smooth) * inv_freq / sc->factor + smooth * inv_freq;
}

static struct rope_table *rope_table_build(float theta, int seq, int head_dim,
                                           const struct kernels_rope_scaling *sc) {
  int half = head_dim / 2;
  struct rope_table *t = g_new0(struct rope_table, 1);
  t->theta = theta;
  t->seq = seq;
  t->head_dim = head_dim;
  t->scaling = *sc;
  t->cos = g_new(float, (size_t)seq *half);
  t->sin = g_new(float, (size_t)seq *half);
  for (int i = 0; i < half; i++) {
    double inv_freq = pow(theta, -2.0 * i / head_dim);
    if (sc->factor > 0.0f)
      inv_freq = rope_llama3_inv_freq(inv_freq, sc);
    for (int s = 0; s < seq; s++) {
      /* Angles in double: s * theta^(-2i/D) reaches thousands of radians at long sequences. */
      double angle = s * inv_freq;
      t->cos[(size_t)s * half + i] = (float)cos(angle);
      t->sin[(size_t)s * half + i] = (float)sin(angle);
    }
  }
  return t;
}

static bool rope_table_matches(const struct rope_table *t, float theta, int seq, int head_dim,
                               const struct kernels_rope_scaling *sc) {
  return t->theta == theta && t->seq == seq && t->head_dim == head_dim &&
         memcmp(&t->scaling, sc, sizeof *sc) == 0;
}

static const struct rope_table *rope_table_get(float theta, int seq, int head_dim,
                                               const struct kernels_rope_scaling *sc) {
  g_mutex_lock(&rope_lock);
  struct rope_table *t = rope_tables;
  while (t && !rope_table_matches(t, theta, seq, head_dim, sc))
    t = t->next;
  if (!t) {
    t = rope_table_build(theta, seq, head_dim, sc);
    t->next = rope_tables;
    rope_tables = t;
  }
  g_mutex_unlock(&rope_lock);
  return t;
}

/* Rotates one head's pairs; sign = -1 for the inverse (exact, so the result is the same as
 * rotating by -angle). Written as plain arrays so the loop vectorises. */
static void rope_rotate(float *restrict lo, float *restrict hi, const float *restrict c,
                        const float *restrict sn, float sign, int half) {
  for (int i = 0; i < half; i++) {
    float x0 = lo[i], x1 = hi[i], s = sn[i] * sign;
    lo[i] = x0 * c[i] - x1 * s;
    hi[i] = x1 * c[i] + x0 * s;
  }
}

void kernels_rope_scaled(float *x, int batch, int seq, int n_heads, int head_dim, float theta,
                         const struct kernels_rope_scaling *scaling, bool inverse) {
  PIPER_ASSERT(head_dim % 2 == 0);
  static const struct kernels_rope_scaling none;
  struct kernels_rope_scaling sc = scaling ? *scaling : none;
  if (sc.factor > 0.0f)
    PIPER_ASSERT(sc.original_max_position_embeddings > 0 &&
                 sc.high_freq_factor > sc.low_freq_factor && sc.low_freq_factor > 0.0f);
  const struct rope_table *t = rope_table_get(theta, seq, head_dim, &sc);
  int half = head_dim / 2;
  size_t row = (size_t)n_heads * head_dim;
  float sign = inverse ? -1.0f : 1.0f;
  for (int b = 0; b < batch; b++) {
    for (int s = 0; s < seq; s++) {
      float *xr = x + ((size_t)b * seq + s) * row;
      const float *c = t->cos + (size_t)s * half, *sn = t->sin + (size_t)s * half;
      for (int h = 0; h < n_heads; h++) {
        float *xh = xr + (size_t)h * head_dim;
        rope_rotate(xh, xh + half, c, sn, sign, half);
      }
    }
  }
}

void kernels_rope(float *x, int batch, int seq, int n_heads, int head_dim, float theta,
                  bool inverse) {
  kernels_rope_scaled(x, batch, seq, n_heads, head_dim, theta, NULL, inverse);
}

void kernels_rope_cp(float *x, int batch, int seq, int cp, int cp_rank, int n_heads, int head_dim,
                     float theta, const struct kernels_rope_scaling *scaling, bool inverse) {
  PIPER_ASSERT(head_dim % 2 == 0 && cp >= 1 && cp_rank >= 0 && cp_rank < cp &&
               seq % (2 * cp) == 0);
  static const struct kernels_rope_scaling none;
  struct kernels_rope_scaling sc = scaling ? *scaling : none;
  /* the whole sequence's table: a chunk's rows are its global positions' */
  const struct rope_table *t = rope_table_get(theta, seq, head_dim, &sc);
  int half = head_dim / 2, chunk = seq / (2 * cp), local = seq / cp;
  size_t row = (size_t)n_heads * head_dim;
  float sign = inverse ? -1.0f : 1.0f;
  for (int b = 0; b < batch; b++)
    for (int s = 0; s < local; s++) {
      /* the rank's chunks cp_rank and 2 cp - 1 - cp_rank, in that order */
      int pos = s < chunk ? cp_rank * chunk + s : (2 * cp - 1 - cp_rank) * chunk + s - chunk;
      float *xr = x + ((size_t)b * local + s) * row;
      const float *c = t->cos + (size_t)pos * half, *sn = t->sin + (size_t)pos * half;
      for (int h = 0; h < n_heads; h++) {
        float *xh = xr + (size_t)h * head_dim;
        rope_rotate(xh, xh + half, c, sn, sign, half);
      }
    }
}
