/* sim queue: events in (time, push order), bucketed by time (queue-impl.h). */
#include <string.h>

#include <glib.h>

#include "queue-impl.h"

#define NONE UINT32_MAX

static uint64_t time_hash(double t) {
  uint64_t h;
  memcpy(&h, &t, sizeof h);
  h *= 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

static uint32_t *table_find(struct sim_queue *q, double t) {
  uint32_t at = (uint32_t)(time_hash(t) & q->table_mask);
  while (q->table[at] && q->b[q->table[at] - 1].t != t)
    at = (at + 1) & q->table_mask;
  return &q->table[at];
}

static void table_grow(struct sim_queue *q) {
  uint32_t old_cap = q->table ? q->table_mask + 1 : 0, *old = q->table;
  uint32_t cap = old_cap ? 2 * old_cap : 256;
  q->table = g_new0(uint32_t, cap);
  q->table_mask = cap - 1;
  for (uint32_t k = 0; k < old_cap; k++)
    if (old[k])
      *table_find(q, q->b[old[k] - 1].t) = old[k];
  g_free(old);
}

/* Linear probing's deletion by backward shift: later entries of the run move up so that no
 * lookup stops early at the hole. */
static void table_remove(struct sim_queue *q, double t) {
  uint32_t hole = (uint32_t)(table_find(q, t) - q->table);
  q->table[hole] = 0;
  q->table_n--;
  for (uint32_t at = (hole + 1) & q->table_mask; q->table[at]; at = (at + 1) & q->table_mask) {
    uint32_t home = (uint32_t)(time_hash(q->b[q->table[at] - 1].t) & q->table_mask);
    /* the entry may fill the hole when its home is not in (hole, at] cyclically */
    if (((at - home) & q->table_mask) >= ((at - hole) & q->table_mask)) {
      q->table[hole] = q->table[at];
      q->table[at] = 0;
      hole = at;
    }
  }
}

static double heap_t(const struct sim_queue *q, uint32_t i) {
  return q->b[q->heap[i]].t;
}

static void heap_set(struct sim_queue *q, uint32_t i, uint32_t bucket) {
  q->heap[i] = bucket;
}

static void heap_up(struct sim_queue *q, uint32_t i) {
  uint32_t bucket = q->heap[i];
  double t = q->b[bucket].t;
  while (i > 0 && t < heap_t(q, (i - 1) / 2)) {
    heap_set(q, i, q->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  heap_set(q, i, bucket);
}

static void heap_down(struct sim_queue *q, uint32_t i) {
  uint32_t bucket = q->heap[i];
  double t = q->b[bucket].t;
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= q->n_heap)
      break;
    if (c + 1 < q->n_heap && heap_t(q, c + 1) < heap_t(q, c))
      c++;
    if (!(heap_t(q, c) < t))
      break;
    heap_set(q, i, q->heap[c]);
    i = c;
  }
  heap_set(q, i, bucket);
}

static uint32_t chunk_new(struct sim_queue *q) {
  uint32_t id;
  if (q->free_c != NONE) {
    id = q->free_c;
    q->free_c = q->c[id].next;
  } else {
    if (q->n_c == q->cap_c) {
      q->cap_c = q->cap_c ? 2 * q->cap_c : 256;
      q->c = g_renew(struct sim_queue_chunk, q->c, q->cap_c);
    }
    id = q->n_c++;
  }
  q->c[id].n = 0;
  q->c[id].next = NONE;
  return id;
}

static void chunk_free(struct sim_queue *q, uint32_t id) {
  q->c[id].next = q->free_c;
  q->free_c = id;
}

static uint32_t bucket_new(struct sim_queue *q, double t) {
  uint32_t id;
  if (q->free_b != NONE) {
    id = q->free_b;
    q->free_b = q->b[id].tail;
  } else {
    if (q->n_b == q->cap_b) {
      q->cap_b = q->cap_b ? 2 * q->cap_b : 256;
      q->b = g_renew(struct sim_queue_bucket, q->b, q->cap_b);
    }
    id = q->n_b++;
  }
  uint32_t chunk = chunk_new(q);
  q->b[id] = (struct sim_queue_bucket){.t = t, .head = chunk, .tail = chunk};
  if (q->n_heap == q->cap_heap) {
    q->cap_heap = q->cap_heap ? 2 * q->cap_heap : 256;
    q->heap = g_renew(uint32_t, q->heap, q->cap_heap);
  }
  q->heap[q->n_heap++] = id;
  heap_up(q, q->n_heap - 1);
  return id;
}

uint32_t sim_queue_push(struct sim_queue *q, double t, uint32_t type, uint32_t id, uint32_t version,
                        uint32_t unit) {
  if (t == 0)
    t = 0; /* -0.0 and 0.0 are one time */
  if (!q->table) {
    q->free_c = q->free_b = NONE;
    table_grow(q);
  }
  uint32_t *slot = table_find(q, t), bucket;
  if (*slot) {
    bucket = *slot - 1;
  } else {
    bucket = bucket_new(q, t);
    if (2 * (q->table_n + 1) > q->table_mask + 1) {
      table_grow(q);
      slot = table_find(q, t);
    }
    *slot = bucket + 1;
    q->table_n++;
  }
  uint32_t tail = q->b[bucket].tail;
  if (q->c[tail].n == SIM_QUEUE_CHUNK) {
    uint32_t fresh = chunk_new(q);
    q->c[tail].next = fresh;
    q->b[bucket].tail = tail = fresh;
  }
  struct sim_queue_chunk *c = &q->c[tail];
  uint32_t h = tail * SIM_QUEUE_CHUNK + c->n;
  c->e[c->n++] = (struct sim_queue_entry){type, id, version, unit};
  q->n++;
  return h;
}

struct sim_event sim_queue_pop(struct sim_queue *q) {
  uint32_t bucket = q->heap[0];
  struct sim_queue_bucket *b = &q->b[bucket];
  struct sim_queue_chunk *c = &q->c[b->head];
  const struct sim_queue_entry *e = &c->e[b->read++];
  struct sim_event out = {b->t, e->type, e->id, e->version, e->unit};
  q->n--;
  if (b->read < c->n)
    return out;
  if (b->head != b->tail) { /* on to the next chunk */
    uint32_t next = c->next;
    chunk_free(q, b->head);
    b->head = next;
    b->read = 0;
    return out;
  }
  /* the time is used up: its bucket goes */
  chunk_free(q, b->head);
  table_remove(q, b->t);
  heap_set(q, 0, q->heap[--q->n_heap]);
  if (q->n_heap > 0)
    heap_down(q, 0);
  b->tail = q->free_b;
  q->free_b = bucket;
  return out;
}

void sim_queue_free(struct sim_queue *q) {
  g_free(q->c);
  g_free(q->b);
  g_free(q->heap);
  g_free(q->table);
  memset(q, 0, sizeof *q);
}
