/* gpu_weights: the bookkeeping of the cuda backend's bf16 weight copies (see the header). */
#include <math.h>
#include <string.h>

#include "../base/assert.h"
#include "gpu_weights.h"

struct store {
  uintptr_t lo, hi;
};

static guint entry_hash(gconstpointer k) {
  const struct exec_wcache_entry *e = k;
  uint64_t h = (uint64_t)(uintptr_t)e->ptr;
  h = h * 1099511628211u ^ (uint64_t)(uint32_t)e->rows;
  h = h * 1099511628211u ^ (uint64_t)(uint32_t)e->cols;
  h = h * 1099511628211u ^ (uint64_t)(uint32_t)e->ld;
  return (guint)(h ^ h >> 32);
}

static gboolean entry_equal(gconstpointer a, gconstpointer b) {
  const struct exec_wcache_entry *x = a, *y = b;
  return x->ptr == y->ptr && x->rows == y->rows && x->cols == y->cols && x->ld == y->ld;
}

void exec_wcache_init(struct exec_wcache *c) {
  memset(c, 0, sizeof *c);
  c->stores = g_array_new(FALSE, FALSE, sizeof(struct store));
  c->entries = g_ptr_array_new_with_free_func(g_free);
  c->index = g_hash_table_new(entry_hash, entry_equal);
}

void exec_wcache_clear(struct exec_wcache *c) {
  if (c->index)
    g_hash_table_destroy(c->index);
  if (c->entries)
    g_ptr_array_free(c->entries, TRUE);
  if (c->stores)
    g_array_free(c->stores, TRUE);
  memset(c, 0, sizeof *c);
}

void exec_wcache_add_store(struct exec_wcache *c, const void *base, size_t bytes) {
  struct store s = {(uintptr_t)base, (uintptr_t)base + bytes};
  /* stores that meet the new one merge into it: they stay disjoint */
  for (guint k = 0; k < c->stores->len;) {
    const struct store *x = &g_array_index(c->stores, struct store, k);
    if (x->lo <= s.hi && s.lo <= x->hi) {
      s.lo = x->lo < s.lo ? x->lo : s.lo;
      s.hi = x->hi > s.hi ? x->hi : s.hi;
      g_array_remove_index_fast(c->stores, k);
    } else {
      k++;
    }
  }
  g_array_append_val(c->stores, s);
}

bool exec_wcache_in_store(const struct exec_wcache *c, const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
  for (guint k = 0; c->stores && k < c->stores->len; k++) {
    const struct store *x = &g_array_index(c->stores, struct store, k);
    if (x->lo <= lo && hi <= x->hi)
      return true;
  }
  return false;
}

/* Whether [p, p + bytes) meets a store: a write that does not touches no copy. */
static bool meets_store(const struct exec_wcache *c, const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
  for (guint k = 0; c->stores && k < c->stores->len; k++) {
    const struct store *x = &g_array_index(c->stores, struct store, k);
    if (x->lo < hi && lo < x->hi)
      return true;
  }
  return false;
}

size_t exec_wcache_extent(int rows, int cols, int ld) {
  PIPER_ASSERT(rows >= 0 && cols >= 0 && ld >= cols);
  if (rows == 0 || cols == 0)
    return 0;
  return ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * sizeof(float);
}

struct exec_wcache_entry *exec_wcache_find(struct exec_wcache *c, const void *ptr, int rows,
                                           int cols, int ld, bool *created) {
  *created = false;
  size_t extent = exec_wcache_extent(rows, cols, ld);
  if (!extent || !exec_wcache_in_store(c, ptr, extent))
    return NULL;
  struct exec_wcache_entry key = {.ptr = ptr, .rows = rows, .cols = cols, .ld = ld};
  struct exec_wcache_entry *e = g_hash_table_lookup(c->index, &key);
  if (e)
    return e;
  e = g_new0(struct exec_wcache_entry, 1);
  *e = key;
  g_ptr_array_add(c->entries, e);
  g_hash_table_add(c->index, e);
  *created = true;
  return e;
}

/* Entry k and the bytes [*lo, *hi) its fp32 matrix spans. */
static struct exec_wcache_entry *entry_span(const struct exec_wcache *c, guint k, uintptr_t *lo,
                                            uintptr_t *hi) {
  struct exec_wcache_entry *e = g_ptr_array_index(c->entries, k);
  *lo = (uintptr_t)e->ptr;
  *hi = *lo + exec_wcache_extent(e->rows, e->cols, e->ld);
  return e;
}

uint32_t exec_wcache_written(struct exec_wcache *c, const void *p, size_t bytes) {
  if (!bytes || !c->entries || !meets_store(c, p, bytes))
    return 0;
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes, elo, ehi;
  uint32_t n = 0;
  for (guint k = 0; k < c->entries->len; k++) {
    struct exec_wcache_entry *e = entry_span(c, k, &elo, &ehi);
    if (e->fresh && elo < hi && lo < ehi) {
      e->fresh = false;
      n++;
    }
  }
  return n;
}

uint32_t exec_wcache_within(const struct exec_wcache *c, const void *p, size_t bytes,
                            GPtrArray *out) {
  if (!bytes || !c->entries)
    return 0;
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes, elo, ehi;
  uint32_t n = 0;
  for (guint k = 0; k < c->entries->len; k++) {
    struct exec_wcache_entry *e = entry_span(c, k, &elo, &ehi);
    if (e->copy && lo <= elo && ehi <= hi) {
      g_ptr_array_add(out, e);
      n++;
    }
  }
  return n;
}

uint16_t exec_bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if (isnan(x))
    return 0x7fffu; /* the canonical NaN, as cvt.rn.bf16.f32 and cuda_bf16.hpp's host path */
  /* add half an ulp of bf16, less one when the kept part is even: ties go to even; an
   * overflow of the exponent rounds to infinity, as it should */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float exec_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

uint32_t exec_wcache_drop(struct exec_wcache *c, const void *p, GPtrArray *out) {
  uintptr_t at = (uintptr_t)p;
  for (guint k = 0; c->stores && k < c->stores->len; k++) {
    struct store x = g_array_index(c->stores, struct store, k);
    if (at < x.lo || at >= x.hi)
      continue;
    g_array_remove_index_fast(c->stores, k);
    uint32_t n = 0;
    for (guint i = 0; i < c->entries->len;) {
      struct exec_wcache_entry *e = g_ptr_array_index(c->entries, i);
      uintptr_t ep = (uintptr_t)e->ptr;
      if (ep < x.lo || ep >= x.hi) {
        i++;
        continue;
      }
      g_hash_table_remove(c->index, e);
      g_ptr_array_add(out, g_ptr_array_steal_index_fast(c->entries, i));
      n++;
    }
    return n;
  }
  return 0;
}
