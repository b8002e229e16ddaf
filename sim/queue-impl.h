/* sim queue: the simulator's event queue, private to sim/. Events come out in (time, push
 * order), exactly as a heap keyed by (t, sequence number) gives them, but events at one time
 * share a bucket: a FIFO in push order, and a small heap orders the distinct times only.
 *
 *   struct sim_queue q = {0};
 *   sim_queue_push(&q, 1.5, 0, 7, 1, 3);        // time, type, id, version, unit
 *   while (q.n > 0) {
 *     struct sim_event e = sim_queue_pop(&q);   // the earliest, first pushed first
 *     printf("%g %u\n", e.t, e.id);
 *   }
 *   sim_queue_free(&q);
 *
 * Why buckets: with every device simulated (--no-collapse), the replicas of a stage run in
 * lockstep, so thousands of events fall on each time. A heap of all of them sifts through
 * log4(events) levels of lines that miss the caches; here a push is one probe of a table of
 * the distinct times (a few hundred entries, cache-resident) and an append, a pop takes a
 * bucket's head, and the heap moves only when a time is first or last used.
 */
#ifndef PIPER_SIM_QUEUE_IMPL_H
#define PIPER_SIM_QUEUE_IMPL_H

#include <stddef.h>
#include <stdint.h>

struct sim_event {
  double t;
  uint32_t type, id, version, unit;
};

struct sim_queue_entry {
  uint32_t type, id, version, unit;
};

/* A bucket's events are chunks of consecutive entries: popping a linked list of single events
 * chased one pointer per event (each load waiting for the previous one, a cache miss apiece
 * once the queue outgrows the caches); a chunk's entries are adjacent and prefetched. */
#define SIM_QUEUE_CHUNK 15

struct sim_queue_chunk {
  struct sim_queue_entry e[SIM_QUEUE_CHUNK];
  uint32_t n;    /* entries written */
  uint32_t next; /* next chunk of the bucket, or of the free list; UINT32_MAX: none */
};

struct sim_queue_bucket {
  double t;
  uint32_t head, tail; /* chunks; a free bucket's tail links the free list */
  uint32_t read;       /* entries of the head chunk already popped */
};

struct sim_queue {
  size_t n; /* events queued */
  struct sim_queue_chunk *c;
  uint32_t n_c, cap_c, free_c;
  struct sim_queue_bucket *b;
  uint32_t n_b, cap_b, free_b;
  uint32_t *heap; /* bucket ids, a binary min-heap on their distinct times */
  uint32_t n_heap, cap_heap;
  uint32_t *table; /* open addressing on the time's bits: bucket id + 1, 0 empty */
  uint32_t table_mask, table_n;
};

/* The type of an event cancelled while queued (sim_queue_cancel): pop still returns it, in its
 * place, but its other fields mean nothing. */
#define SIM_QUEUE_CANCELLED UINT32_MAX

/* Returns the event's handle, valid until the event is popped (its chunk lives that long). */
uint32_t sim_queue_push(struct sim_queue *q, double t, uint32_t type, uint32_t id, uint32_t version,
                        uint32_t unit);
/* Marks the queued event of handle h cancelled (SIM_QUEUE_CANCELLED). The others keep their
 * order: a cancelled event is skipped in place, never moved, so the order of those left is the
 * order they had. Whoever owns the event must know it has not been popped. */
static inline void sim_queue_cancel(struct sim_queue *q, uint32_t h) {
  q->c[h / SIM_QUEUE_CHUNK].e[h % SIM_QUEUE_CHUNK].type = SIM_QUEUE_CANCELLED;
}
struct sim_event sim_queue_pop(struct sim_queue *q); /* q->n > 0 */
void sim_queue_free(struct sim_queue *q);

#endif
