/* compile: the front end every program shares. Loads the model and the directive program,
 * runs the schedule harness (--schedule/--ranks/--mbs) or a CSV import, builds the IR,
 * applies the directives and lowers to per-device plans (with the progress check).
 *
 *   GError *err = NULL;
 *   struct compile_options o = compile_options_default();
 *   o.model_path = "models/tiny-moe.json";
 *   o.directives_path = "directives/base-schedules/dp2.json";
 *   struct compile_result r = {0};
 *   if (compile_run(&o, &r, &err))
 *     printf("%u devices\n", r.plan->n_devices);  // r.plan is ready
 *   else
 *     fprintf(stderr, "%s\n", err->message);      // names the file and directive at fault
 *   compile_result_free(&r);
 *   g_clear_error(&err);
 */
#ifndef PIPER_DIRECTIVES_COMPILE_H
#define PIPER_DIRECTIVES_COMPILE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/ir.h"
#include "../ir/plan.h"
#include "../models/model.h"
#include "directives.h"
#include "schedule.h"

struct compile_options {
  const char *model_path;
  const char *directives_path;
  const char *layout; /* instead of directives_path: "pp=4,dp=2,ep=2,v" (directives/layout.h) */
  int pp_regions;     /* > 0 overrides the model's PP split; a layout sets it to its stages */
  int64_t micro_batch_size; /* > 0 replaces the model file's micro_batch_size (--micro-batch-size) */
  int64_t seq_len;          /* > 0 replaces the model file's seq_len (--seq-length) */
  /* "none", "tensorwise" or "blockwise": replaces the model file's piper.fp8 (--fp8); NULL:
   * the file's */
  const char *fp8;
  /* > 0: sequences per step over the data-parallel replicas (--global-batch-size); the
   * micro-batch count is global / (micro_batch_size x dp), refused where that is not whole or
   * where schedule.mbs (--num-micro-batches) says otherwise */
  uint64_t global_batch_size;
  bool have_schedule; /* --schedule given */
  struct sched_options schedule;
  uint32_t n_devices;     /* > 0: the run's world size; device ids must be below it */
  const char *import_csv; /* replace the program's order directives by this CSV */
  bool lower;             /* false stops after the rewrites (no plan) */
  enum ir_cost_model cost_model; /* how lowering orders shared streams (ir.h); FLOPs by default */
  bool default_streams;          /* drop the streams place and shard name: what the choice costs */
  GString *notes;                /* not NULL: gets notes for the user, a line each (what an
                                    imported CSV's reader skipped) */
  /* the plan keeps no text of the program (plan.program_json NULL): for callers that write no
   * plan (the planner); printing an O(M x ranks) order program was a tenth of its compile */
  bool no_program_text;
};

struct compile_result {
  struct model *model;
  struct dir_program *program; /* after the harness: what was compiled */
  struct ir_graph *graph;
  struct plan *plan;
  uint32_t ranks;          /* pipeline ranks of the layout */
  uint32_t mbs;            /* micro-batches (product of splits) */
  char *program_file_name; /* "<schedule>_pp<R>_mbs<M>.json" */
};

/* The front-end options piper-compile, piper-sim and piper-exec share, as given on the command
 * line: --model, --directives (alias --base-schedule), --schedule, --ranks,
 * --num-micro-batches (alias --mbs), --micro-batch-size, --seq-length, --global-batch-size, --fp8,
 * --keep-order, --pp-regions, --import-csv. They mean the same in every program: --mbs alone
 * sets the program's MB split, --ranks alone is checked against the placement. The programs
 * read them by one option table (tools/options.h). */
struct compile_args {
  const char *model, *directives, *layout, *schedule, *import_csv;
  uint32_t ranks, mbs, pp_regions, microbatch_group;
  /* Megatron's names: --micro-batch-size, --seq-length, --global-batch-size (0: the model's;
   * mbs above is --num-micro-batches, alias --mbs) */
  uint32_t micro_batch_size, seq_length, global_batch_size;
  const char *fp8; /* --fp8 RECIPE: the model file's piper.fp8 replaced */
  bool keep_order;
};
/* Compile options from the arguments; fails naming an unknown --schedule. */
bool compile_args_to_options(const struct compile_args *a, struct compile_options *o, GError **err);

struct compile_options compile_options_default(void);
bool compile_run(const struct compile_options *o, struct compile_result *r, GError **err);
void compile_result_free(struct compile_result *r);
/* compile_run, keeping only the plan (the caller frees it with plan_free); NULL on failure. */
struct plan *compile_take_plan(const struct compile_options *o, GError **err);
/* The same from a model and a directive file (+ the schedule harness when sched is not NULL;
 * pp_regions > 0 overrides the model's split): what tests, benchmarks and sweeps compile. */
struct plan *compile_plan(const char *model_path, const char *directives_path,
                          const struct sched_options *sched, int pp_regions, GError **err);

/* Writes r->program as JSON to dir/<program_file_name>. */
bool compile_write_program(const struct compile_result *r, const char *dir, GError **err);

#endif
