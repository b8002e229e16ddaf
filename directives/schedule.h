/* schedule: the schedule builders (docs/design.md, "The directive phase order"): for R physical
 * pipeline ranks, M micro-batches and a stage-to-rank layout taken from a base schedule's place
 * directives, each builder produces the per-rank sequence of slots (the `order` directives) of one
 * schedule family, plus the PyTorch pipeline-schedule CSV interchange of those sequences.
 *
 *   GError *err = NULL;
 *   struct sched_layout l = {.n_ranks = 2, .n_stages = 2, .stage_rank = (int32_t[]){0, 1}};
 *   struct sched_program *s = sched_build(SCHED_1F1B, &l, 4, &err);
 *   for (uint32_t r = 0; s && r < s->n_ranks; r++) {
 *     const struct sched_action *a = &s->ranks[r].slots[0].actions[0];
 *     printf("rank %u: %u slots, first stage %d mb %d\n", r, s->ranks[r].n_slots, a->stage,
 *            a->mb);
 *   }
 *   sched_program_free(s);
 *   g_clear_error(&err);
 */
#ifndef PIPER_DIRECTIVES_SCHEDULE_H
#define PIPER_DIRECTIVES_SCHEDULE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../ir/ir.h"
#include "directives.h"

enum sched_family {
  SCHED_GPIPE,
  SCHED_1F1B,
  SCHED_INTERLEAVED_1F1B,
  SCHED_ZEROBUBBLE,
  SCHED_ZBV,
  SCHED_DUALPIPE,
  SCHED_DUALPIPEV,
  SCHED_INTERLEAVED_ZEROBUBBLE, /* PyTorch's ScheduleInterleavedZeroBubble (ZB1P, v >= 2) */
  SCHED_CUSTOM,
  SCHED_FAMILY_COUNT
};

/* stage_rank[s] = physical pipeline rank of stage s (stage = PP region index). recompute: the
 * stages rerun their forward before their backward (full recomputation); ZB-V, DualPipe and
 * DualPipeV then defer no weight gradient in their cool-down (a deferred BW would hold what the
 * rerun restored: see build_zbv and build_dualpipe_rank). */
struct sched_layout {
  uint32_t n_ranks;
  uint32_t n_stages;
  const int32_t *stage_rank;
  bool recompute;
  /* interleaved_1f1b: micro-batches per group going through the chunks together (Megatron's
   * --microbatch-group-size-per-virtual-pipeline-stage); 0 = the ranks R. R .. M. */
  uint32_t microbatch_group;
};

struct sched_action {
  int32_t stage;
  int32_t mb;
  enum ir_pass pass; /* F, B, BI or BW */
};

/* One slot: one action, or two that may interleave (an overlapped F&B, DualPipe-style). */
struct sched_slot {
  uint32_t n_actions; /* 1 or 2 */
  struct sched_action actions[2];
  uint32_t column; /* read from a CSV: its 1-based column there (for messages); else 0 */
};

struct sched_rank {
  uint32_t n_slots;
  struct sched_slot *slots;
};

struct sched_program {
  enum sched_family family;
  uint32_t n_ranks, n_stages, n_microbatches;
  struct sched_rank *ranks; /* [n_ranks] */
  char *note; /* sched_read_csv: one line on what it skipped (communication cells), or NULL */
};

/* Refuses impossible inputs (too few micro-batches, a layout not of the family's shape, odd R
 * for dualpipe) with a PIPER_ERROR_INPUT message that says what is needed. */
struct sched_program *sched_build(enum sched_family f, const struct sched_layout *layout,
                                  uint32_t n_microbatches, GError **err);
void sched_program_free(struct sched_program *s);
/* The checks of sched_build without building: what a planner asks before it costs a
 * configuration, so that it proposes only what the builder accepts. */
bool sched_check(enum sched_family f, const struct sched_layout *layout, uint32_t n_microbatches,
                 GError **err);

/* Name <-> family ("gpipe", "1f1b", "interleaved_1f1b", "zerobubble", "zbv", "dualpipe",
 * "dualpipev", "interleaved_zerobubble", "custom"); sched_family_parse returns false for an unknown name. */
const char *sched_family_name(enum sched_family f);
bool sched_family_parse(const char *name, enum sched_family *out);

/* One `order` directive per rank, slots of {"PP": stage, "<dim>": mb, "PASS": pass} filters. */
bool sched_to_directives(const struct sched_program *s, const char *dim_name,
                         struct dir_program *out, GError **err);

/* PyTorch pipeline-schedule CSV: one row per rank, cells "<stage>F<mb>", "<stage>B<mb>",
 * "<stage>I<mb>", "<stage>W<mb>", "(<a>;<b>)OVERLAP_F_B", empty = idle. The reader also takes
 * PyTorch's default dialect with communication cells ("1SEND_F0", "0UNSHARD", ...): it skips
 * them (the plan makes its own communication) and says how many in the program's note. */
bool sched_write_csv(const struct sched_program *s, FILE *f);
/* name is used in messages. n_stages is taken from the largest stage seen + 1. */
struct sched_program *sched_read_csv(const char *name, const char *text, size_t len,
                                     GError **err);
/* Fails unless s schedules exactly the pipeline of the program it is imported into: one row per
 * pipeline rank, every action in the row of the rank that runs it (mb_rank[stage * M + mb] from
 * sched_microbatch_ranks), and for every stage and micro-batch below n_microbatches a forward
 * and a backward (B, or both I and W). Errors name the CSV (name), row and column. */
bool sched_check_complete(const struct sched_program *s, const char *name, const int32_t *mb_rank,
                          uint32_t n_stages, uint32_t n_ranks, uint32_t n_microbatches,
                          GError **err);

/* The harness shared by piper-compile, piper-sim and piper-exec (--schedule NAME --ranks R
 * --mbs M [--keep-order]): drops the base program's `order` directives (unless keep_order),
 * makes sure there is exactly one `split` with dim_name "MB" and num_microbatches = mbs
 * (adding or rewriting it), derives the stage-to-rank layout from the `place` directives (a
 * rank is a distinct device group, numbered by the lowest stage it holds), checks it has
 * `ranks` ranks, builds the family's schedule and appends its `order` directives. With
 * SCHED_CUSTOM only the split is enforced (when mbs > 0) and the program is otherwise kept. */
struct sched_options {
  enum sched_family family;
  uint32_t ranks; /* 0 = take it from the layout */
  uint32_t mbs;   /* 0 = keep the program's split */
  uint32_t microbatch_group; /* interleaved_1f1b's group (sched_layout); 0 = R */
  bool keep_order;
};
bool sched_prepare_program(struct dir_program *p, uint32_t n_stages, const struct sched_options *o,
                           GError **err);
/* The layout the harness derives from p's place directives: stage_rank[n_stages] (caller
 * frees with g_free), *n_ranks set. Stages not placed are on the rank of device 0. */
int32_t *sched_layout_from_program(const struct dir_program *p, uint32_t n_stages,
                                   uint32_t *n_ranks, GError **err);
/* The pipeline rank that runs each (stage, micro-batch), [n_stages * M] (caller frees with
 * g_free): the stage's rank (sched_layout_from_program), except where a place directive whose
 * filter is exactly {"PP": s, "MB": m} puts the micro-batch on another rank's devices (DualPipe's
 * copy B). */
int32_t *sched_microbatch_ranks(const struct dir_program *p, uint32_t n_stages, uint32_t M,
                                uint32_t *n_ranks, GError **err);
/* "<schedule>_pp<R>_mbs<M>.json", the name of the compiled program in a run directory. */
char *sched_program_file_name(enum sched_family f, uint32_t ranks, uint32_t mbs);

#endif
