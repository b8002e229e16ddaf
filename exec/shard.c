/* shard: where a device keeps its parameters, gradients and optimizer state under ZeRO. The
 * flat layout (program.c) gives every parameter a flat index, buckets first, each padded to a
 * multiple of its group; each store keeps, bucket after bucket, either that bucket's own shard
 * (flat [offset + rank * shard, + shard)) or the whole padded bucket, then the segments outside
 * buckets whole. So a device allocates exactly what the simulator's static memory counts. */
#include "exec-impl.h"

#include <string.h>

static bool sharded(const struct exec_bucket *bk, enum exec_store which) {
  switch (which) {
  case EXEC_STORE_PARAMS: return bk->sharded_params;
  case EXEC_STORE_GRADS: return bk->sharded_grads;
  case EXEC_STORE_STATE: return bk->sharded_optimizer;
  }
  return false;
}

/* The flat range a store keeps of bucket bk: [*lo, *hi). */
static void stored_range(const struct exec_bucket *bk, enum exec_store which, uint64_t *lo,
                         uint64_t *hi) {
  if (sharded(bk, which)) {
    *lo = bk->offset + (uint64_t)bk->rank * bk->shard;
    *hi = *lo + bk->shard;
  } else {
    *lo = bk->offset;
    *hi = bk->offset + bk->padded;
  }
}

void exec_store_layout(struct exec_device *d) {
  d->tail_flat = 0;
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    const struct exec_bucket *bk = &d->buckets[b];
    if (bk->offset + bk->padded > d->tail_flat)
      d->tail_flat = bk->offset + bk->padded;
  }
  for (int w = 0; w < 3; w++) {
    uint64_t at = 0;
    for (uint32_t b = 0; b < d->n_buckets; b++) {
      struct exec_bucket *bk = &d->buckets[b];
      uint64_t lo, hi;
      stored_range(bk, (enum exec_store)w, &lo, &hi);
      bk->store_at[w] = at;
      at += hi - lo;
    }
    d->tail_store_at[w] = at;
    d->n_store[w] = at + (d->n_params - d->tail_flat);
  }
}

uint64_t exec_store_index(const struct exec_device *d, enum exec_store which, uint64_t flat) {
  /* the end itself too: a segment without parameters starts there */
  if (flat >= d->tail_flat)
    return flat <= d->n_params ? d->tail_store_at[which] + (flat - d->tail_flat) : EXEC_NOT_STORED;
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    const struct exec_bucket *bk = &d->buckets[b];
    if (flat < bk->offset || flat >= bk->offset + bk->padded)
      continue;
    uint64_t lo, hi;
    stored_range(bk, which, &lo, &hi);
    return flat >= lo && flat < hi ? bk->store_at[which] + (flat - lo) : EXEC_NOT_STORED;
  }
  return EXEC_NOT_STORED;
}

void exec_store_expand(const struct exec_device *d, enum exec_store which, const float *store,
                       float *flat, float fill) {
  for (uint64_t i = 0; i < d->tail_flat; i++)
    flat[i] = fill;
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    const struct exec_bucket *bk = &d->buckets[b];
    uint64_t lo, hi;
    stored_range(bk, which, &lo, &hi);
    memcpy(flat + lo, store + bk->store_at[which], (hi - lo) * sizeof(float));
  }
  memcpy(flat + d->tail_flat, store + d->tail_store_at[which],
         (d->n_params - d->tail_flat) * sizeof(float));
}

void exec_store_compact(const struct exec_device *d, enum exec_store which, const float *flat,
                        float *store) {
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    const struct exec_bucket *bk = &d->buckets[b];
    uint64_t lo, hi;
    stored_range(bk, which, &lo, &hi);
    memcpy(store + bk->store_at[which], flat + lo, (hi - lo) * sizeof(float));
  }
  memcpy(store + d->tail_store_at[which], flat + d->tail_flat,
         (d->n_params - d->tail_flat) * sizeof(float));
}
