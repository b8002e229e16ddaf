/* schedule-impl: what schedule.c (builders, harness) and schedule_csv.c (interchange) share:
 * size caps and the per-rank slot lists both fill before turning them into a sched_program.
 * Private to directives/; everything here is static so no symbol leaves the module. */
#ifndef PIPER_DIRECTIVES_SCHEDULE_IMPL_H
#define PIPER_DIRECTIVES_SCHEDULE_IMPL_H

#include <glib.h>
#include <stdint.h>

#include "schedule.h"

/* Caps on one schedule. The action cap matches the directive parser's cap on the filters of all
 * order directives (parse.c, DIR_MAX_ORDER_FILTERS): a schedule larger than that could be built
 * but its program could not be read back. Stages and ranks are bounded by the device count. */
#define SCHED_MAX_ACTIONS 1000000u
#define SCHED_MAX_STAGES 65536 /* stages and ranks stay below 2^16 (schedule_csv.c action keys) */
#define SCHED_MAX_RANKS 65536

/* Per-rank slot lists under construction: rows[r] is a GArray of struct sched_slot. */
struct sched_rows {
  uint32_t n_ranks;
  GArray **rows;
  uint64_t n_actions;
};

static inline void sched_rows_init(struct sched_rows *w, uint32_t n_ranks) {
  w->n_ranks = n_ranks;
  w->n_actions = 0;
  w->rows = g_new(GArray *, n_ranks ? n_ranks : 1);
  for (uint32_t r = 0; r < n_ranks; r++)
    w->rows[r] = g_array_new(FALSE, TRUE, sizeof(struct sched_slot));
}

/* Adds a rank at the end (the CSV reader learns the rank count row by row). */
static inline uint32_t sched_rows_add_rank(struct sched_rows *w) {
  w->rows = g_renew(GArray *, w->rows, w->n_ranks + 1);
  w->rows[w->n_ranks] = g_array_new(FALSE, TRUE, sizeof(struct sched_slot));
  return w->n_ranks++;
}

static inline void sched_rows_push(struct sched_rows *w, uint32_t rank,
                                   const struct sched_slot *s) {
  PIPER_ASSERT(rank < w->n_ranks && (s->n_actions == 1 || s->n_actions == 2));
  g_array_append_val(w->rows[rank], *s);
  w->n_actions += s->n_actions;
}

static inline void sched_rows_free(struct sched_rows *w) {
  for (uint32_t r = 0; r < w->n_ranks; r++)
    g_array_free(w->rows[r], TRUE);
  g_free(w->rows);
  w->rows = NULL;
  w->n_ranks = 0;
}

/* Moves the rows into a new program (slots arrays owned by it, freed with g_free) and frees w. */
static inline struct sched_program *sched_rows_finish(struct sched_rows *w, enum sched_family f,
                                                      uint32_t n_stages, uint32_t n_microbatches) {
  struct sched_program *s = g_new0(struct sched_program, 1);
  s->family = f;
  s->n_ranks = w->n_ranks;
  s->n_stages = n_stages;
  s->n_microbatches = n_microbatches;
  s->ranks = g_new0(struct sched_rank, w->n_ranks ? w->n_ranks : 1);
  for (uint32_t r = 0; r < w->n_ranks; r++) {
    s->ranks[r].n_slots = w->rows[r]->len;
    /* g_array_free(.., FALSE) hands over the g_malloc'd element block (NULL when empty). */
    s->ranks[r].slots = (struct sched_slot *)(void *)g_array_free(w->rows[r], FALSE);
  }
  g_free(w->rows);
  w->rows = NULL;
  w->n_ranks = 0;
  return s;
}

/* The CSV letter of a pass (PyTorch's names: I = backward for inputs, W = for weights). */
static inline char sched_pass_letter(enum ir_pass p) {
  switch (p) {
  case IR_PASS_F: return 'F';
  case IR_PASS_B: return 'B';
  case IR_PASS_BI: return 'I';
  case IR_PASS_BW: return 'W';
  default: return '?';
  }
}

#endif
