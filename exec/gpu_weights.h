/* gpu_weights: the cuda backend's cached bf16 copies of its weights, as bookkeeping that needs
 * no GPU (kept apart, like gpu_layout.h, so it is tested on machines without one), and the
 * host twins of the device's fp32 -> bf16 conversion.
 *
 * For a bf16 model every GEMM reads its weight operand in bf16. Converting the fp32 master
 * weights in every GEMM costs 6 bytes of traffic per weight per GEMM; instead each weight
 * matrix (a GEMM's B operand as stored: pointer, rows, columns, row stride) that lies in a
 * weight store (the buffer the optimizer updates) gets one compact bf16 copy, made by the
 * first GEMM that reads it after its last write and reused until the next write: once per
 * optimizer step, by the optimizer itself once the copy exists (exec_wcache_within), so that
 * the cost lands where the simulator charges it. Every path that writes device memory reports the bytes it wrote
 * (exec_wcache_written), which makes the copies they overlap stale. The caller owns the
 * copies' memory and the event that orders their making (entry->copy, entry->made).
 *
 *   struct exec_wcache c;
 *   exec_wcache_init(&c);
 *   static float store[64];                      // the optimizer's master weights
 *   exec_wcache_add_store(&c, store, sizeof store);
 *   bool created = false;
 *   struct exec_wcache_entry *e = exec_wcache_find(&c, store + 8, 4, 4, 8, &created);
 *   bool stale = e && !e->fresh;                 // true: convert, then e->fresh = true
 *   uint32_t hit = exec_wcache_written(&c, store + 9, sizeof(float)); // 0: e was not made yet
 *   GPtrArray *remake = g_ptr_array_new();
 *   uint32_t n = exec_wcache_within(&c, store, sizeof store, remake); // 0: e has no copy yet
 *   g_ptr_array_free(remake, TRUE);
 *   GPtrArray *gone = g_ptr_array_new_with_free_func(g_free);
 *   exec_wcache_drop(&c, store, gone);           // the store is freed: e moves to gone
 *   g_ptr_array_free(gone, TRUE);
 *   uint16_t b = exec_bf16_round(1.0f);          // 0x3f80
 *   exec_wcache_clear(&c);
 */
#ifndef PIPER_EXEC_GPU_WEIGHTS_H
#define PIPER_EXEC_GPU_WEIGHTS_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct exec_wcache_entry {
  const void *ptr;     /* the fp32 matrix's first element */
  int rows, cols, ld;  /* as stored, row-major, in elements */
  void *copy;          /* compact bf16 [rows, cols]: the caller's buffer (NULL until made) */
  void *made;          /* the caller's event recorded after the copy was made, or NULL */
  const void *maker;   /* the stream that made it (the caller's handle), NULL before */
  bool fresh;          /* made after the last write to the matrix's bytes */
  uint64_t conversions; /* times made */
};

struct exec_wcache {
  GArray *stores;       /* struct {uintptr_t lo, hi}: weight stores, disjoint */
  GPtrArray *entries;   /* struct exec_wcache_entry *, owned */
  GHashTable *index;    /* key -> entry */
  uint64_t hits, misses; /* GEMM operands served from a fresh copy, or (re)made */
};

void exec_wcache_init(struct exec_wcache *c);
/* Frees the bookkeeping; the caller frees every entry's copy and event first
 * (c->entries). */
void exec_wcache_clear(struct exec_wcache *c);
/* [base, base + bytes) holds weights that GEMMs read as their B operand (the block the
 * optimizer updates). Idempotent; a range meeting a known store widens it. */
void exec_wcache_add_store(struct exec_wcache *c, const void *base, size_t bytes);
/* Whether [p, p + bytes) lies inside one store. */
bool exec_wcache_in_store(const struct exec_wcache *c, const void *p, size_t bytes);
/* The bytes of an fp32 matrix of rows x cols with row stride ld: ((rows - 1) ld + cols) * 4. */
size_t exec_wcache_extent(int rows, int cols, int ld);
/* The entry of the matrix at ptr (*created true when new: no copy yet, not fresh), or NULL
 * when it does not lie inside a store (the caller converts it per GEMM). */
struct exec_wcache_entry *exec_wcache_find(struct exec_wcache *c, const void *ptr, int rows,
                                           int cols, int ld, bool *created);
/* Device bytes [p, p + bytes) were (or are about to be) written: every entry whose matrix
 * meets them is no longer fresh. Returns how many were fresh and are now stale. */
uint32_t exec_wcache_written(struct exec_wcache *c, const void *p, size_t bytes);

/* Appends to out (not owning) every entry whose matrix lies wholly inside [p, p + bytes) and
 * has a copy: what an optimizer that has just rewritten those bytes remakes at once, so that
 * the step's GEMMs find fresh copies. Returns how many. */
uint32_t exec_wcache_within(const struct exec_wcache *c, const void *p, size_t bytes,
                            GPtrArray *out);

/* The store holding p is freed: it and its entries leave the cache; the entries are moved to
 * out (the caller frees each one's copy and event, then the entry with g_free). Returns how
 * many; 0 when p is in no store. */
uint32_t exec_wcache_drop(struct exec_wcache *c, const void *p, GPtrArray *out);

/* fp32 -> bf16 bits, rounded to nearest even (subnormals kept, overflow to infinity), every
 * NaN the canonical 0x7fff: bit for bit the device's __float2bfloat16_rn (kc_to_bf16). */
uint16_t exec_bf16_round(float x);
/* bf16 bits -> fp32 (exact). */
float exec_bf16_to_f32(uint16_t b);

#endif
