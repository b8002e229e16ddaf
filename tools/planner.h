/* planner: which configuration should I run? Enumerates a table of dimensions (tp, pp, ep, stage
 * shape with uneven stages, ZeRO, recomputation, micro-batch size, schedule; planner.c's
 * planner_dimensions), keeps only what the compiler accepts (its own checks: layout_parse,
 * sched_check, one compile of each distinct layout), leaves out unsimulated what its memory
 * bound (static memory and the activations its schedule holds) puts over the cap, compiles and
 * simulates the rest on a thread pool, and ranks them by throughput among those under the
 * memory cap (the others by memory over it). A sweep (sweep.h) is the same evaluation of a
 * list the user wrote. *
 *   GError *err = NULL;
 *   struct planner_request rq = planner_request_default();
 *   rq.model_path = "models/tiny-moe.json";
 *   rq.profile_path = "profiles/unit.json";
 *   rq.devices = 4;
 *   rq.global_batch = 16;                         // sequences per step, all replicas together
 *   struct planner *pl = planner_new(&rq, &err);
 *   if (pl && planner_run(pl, &err) && planner_write_outputs(pl, "out/plan", true, &err))
 *     printf("best: %s %s\n", pl->configs[0].layout, sched_family_name(pl->configs[0].schedule));
 *   else if (err)
 *     fprintf(stderr, "%s\n", err->message);
 *   planner_free(pl);
 */
#ifndef PIPER_TOOLS_PLANNER_H
#define PIPER_TOOLS_PLANNER_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../directives/layout.h"
#include "../directives/schedule.h"
#include "../report/chart.h"
#include "../report/report.h"
#include "../sim/profile.h"

/* A memory choice is one row: its name and what it adds to the layout spec (where it applies
 * is the layout's rule: ZeRO needs dp >= 2). Recomputation is a second axis
 * (planner_request.recompute): each memory choice with each of its values. */
struct planner_memory_choice {
  const char *name;
  const char *layout_suffix; /* appended to "pp=..,dp=..": ",zero=2" */
  uint32_t zero;             /* its ZeRO level (layout_zero_applies says where it applies) */
};
extern const struct planner_memory_choice planner_memory_choices[];
extern const uint32_t planner_n_memory_choices;

enum planner_status {
  PLANNER_PENDING,
  PLANNER_FEASIBLE, /* simulated, peak memory within the cap */
  PLANNER_OVER_CAP, /* simulated, over the cap */
  PLANNER_FAILED,   /* did not compile or simulate: error says why */
};

/* One configuration: what to compile (a layout spec or a directive file) and what came out. */
struct planner_config {
  char *layout;     /* "pp=4,dp=16,ep=16,v,zero=2", or NULL with directives */
  char *directives; /* a base schedule file (sweeps) */
  int pp_regions;   /* with directives: > 0 overrides the model's PP split */
  enum sched_family schedule;
  uint32_t ranks; /* > 0: the pipeline ranks the layout must have (a sweep's "ranks") */
  uint32_t microbatches;
  int64_t micro_batch_size; /* 0: the model file's */
  uint32_t profile;         /* index into the evaluation's profiles */
  uint32_t pp, dp, ep, tp, stages; /* from the layout (0 for a directive file) */
  uint32_t cp, etp;                /* from the layout: 1, and 0 where etp is tp's */
  const char *fp8; /* --fp8 of the compile ("none", "tensorwise", "blockwise"); NULL: the model
                    * file's piper.fp8 */
  const char *memory_choice;   /* a planner_memory_choices name, or "" */
  uint32_t order;              /* position in the enumeration: ties rank in this order */
  uint32_t layout_check;       /* the planner's: index of its distinct layout while enumerating */
  /* Lower bound of the peak (bytes), on the device class where it is largest: the static
   * memory of the compiled layout (parameters, gradients, optimizer state) plus the
   * activations the schedule's order holds at once (planner.c, memory_bound). 0: none. */
  double memory_bound_bytes;
  bool bounded; /* over the cap by the bound alone: not simulated (peak_memory_bytes = bound) */
  /* results */
  enum planner_status status;
  char *error;
  double iteration_time_s, throughput_tokens_per_s;
  double mfu; /* 0 on a synthetic profile */
  double peak_memory_bytes, memory_cap_bytes; /* cap 0: none */
  double compute_s_mean; /* busy seconds, mean over devices */
  struct report_bubble_split bubble; /* fractions of the step, means over devices */
};

/* Compiles and simulates configs[0..n) on `threads` threads (0: one per core) with the given
 * profiles (configs[i].profile indexes them) and caps (bytes, per profile; 0: no cap). Progress
 * goes to stderr when progress is true: a rewritten line on a terminal, a line every tenth of
 * the work otherwise. A configuration that fails is a row with its error, not a failure of the
 * evaluation. The compiler and the simulator keep no global state, so workers share nothing
 * but the read-only profiles (thread safety). */
struct planner_eval {
  const char *model_path;
  int64_t seq_len; /* > 0 replaces the model file's seq_len (--seq-length) */
  struct profile *const *profiles;
  const double *caps;
  uint32_t threads;
  bool progress;
  bool collapse;
  const char *progress_name; /* "piper-plan" */
};
void planner_evaluate(struct planner_config *configs, uint32_t n, const struct planner_eval *ev);
/* Sorts feasible first by throughput, then those over the cap by peak memory (the closest
 * first), then failed ones; ties by order. */
void planner_rank(struct planner_config *configs, uint32_t n);
void planner_config_clear(struct planner_config *c);
/* The plan of configuration c as planner_evaluate compiles it (plan_free). */
struct plan *planner_compile_config(const struct planner_config *c, const char *model_path,
                                    int64_t seq_len, const struct profile *prof, GError **err);

struct planner_request {
  const char *model_path, *profile_path;
  uint32_t devices;
  uint64_t global_batch;    /* sequences per step: dp x micro-batches x micro-batch size */
  int64_t seq_len;          /* > 0 replaces the model file's seq_len (--seq-length) */
  double memory_cap_gib;    /* 0: the profile's memory capacity */
  const int64_t *micro_batch_sizes; /* NULL: the model file's */
  uint32_t n_micro_batch_sizes;
  const uint32_t *pp;       /* pipeline degrees to try; NULL: every divisor of devices */
  uint32_t n_pp;
  const uint32_t *tp;       /* tensor-parallel degrees to try (each with sequence parallelism);
                             * NULL: 1, 2, 4 and 8 where they divide the devices and the model */
  uint32_t n_tp;
  const uint32_t *cp;       /* context-parallel degrees to try; NULL: 1 (none) */
  uint32_t n_cp;
  const uint32_t *ep;       /* expert-parallel sizes to try besides 1 (MoE models); NULL: every
                             * size that divides the experts and a stage's ranks */
  uint32_t n_ep;
  /* FP8 recipes to try ("none", "tensorwise", "blockwise"; the profile must have an FP8 peak
   * and the model be bf16); NULL: the model file's */
  const char *const *fp8;
  uint32_t n_fp8;
  uint32_t max_interleave;  /* interleaved 1F1B with 2 .. this many stages per rank */
  uint32_t threads;         /* 0: one per core */
  bool progress;
  bool schedules[SCHED_FAMILY_COUNT]; /* families to try where they apply */
  /* recomputation to try with each memory choice: --layout recompute= values ("none",
   * "selective", "full", "full:uniform:N", "full:block:N"); NULL: none only */
  const char *const *recompute;
  uint32_t n_recompute;
  bool collapse;
};
struct planner_request planner_request_default(void);

struct planner {
  struct planner_request request;
  struct profile *profile;
  double memory_cap_bytes;
  char *model_name;
  int64_t model_micro_batch_size;
  const char *model_fp8; /* the model file's piper.fp8 ("none" when absent) */
  uint32_t n_configs;
  struct planner_config *configs; /* ranked after planner_run */
  uint32_t n_layouts;             /* distinct layouts enumerated */
  uint32_t n_checked_layouts;     /* layout x micro-batch size pairs the compiler checked */
  uint32_t n_simulated;           /* configurations simulated (the others over the cap by bound) */
  /* One line each: "not searched: N what (first: why)", the values of a dimension that the
   * compiler's own rules say do not apply (tp the model does not take, schedules whose
   * builder refuses the micro-batch count, ...), kept out while enumerating; and "refused by
   * the compiler (a bug ...)", configurations the planner generated that the compiler then
   * refused (n_refused of them): a bug, never a row (issue 32). */
  GString *skipped;
  uint32_t n_refused;
  double check_seconds;           /* wall clock of planner_new: enumeration and checks */
  double seconds;                 /* wall clock of planner_run */
  uint32_t threads_used;
};

/* Loads the model and the profile and enumerates the space; an input error names what is
 * wrong (a global batch no layout divides, a device count of 0). */
struct planner *planner_new(const struct planner_request *rq, GError **err);
void planner_free(struct planner *pl);
bool planner_run(struct planner *pl, GError **err);
/* dir/plan.csv (every configuration, ranked; infeasible ones with the reason) and, when
 * charts, plan.png (throughput against peak memory, planner_write_chart). */
bool planner_write_outputs(const struct planner *pl, const char *dir, bool charts, GError **err);
/* Why configs[i] ranks where it does against the next feasible one: the step-time difference
 * split into pipeline idle, exposed communication, imbalance and compute, and the memory
 * headroom (g_free). */
char *planner_explain(const struct planner *pl, uint32_t i);
/* The configuration's name as the CSV and summary show it: "zbv pp=4,dp=16,ep=16,v mbs 1 x 16". */
char *planner_config_name(const struct planner_config *c);

/* The what-if chart of the planner (plan.png) and of sweeps (sweep.png): n configurations, best
 * first, drawn by chart_points. point(ctx, i, &label) returns configuration i's point and sets
 * label to its g_malloc'd label (left NULL: none); the labels are freed after drawing. */
#define PLANNER_CHART_TOP 5 /* the top picks plan.png and sweep.png always label */
bool planner_write_chart(const char *title, uint32_t n,
                         struct chart_point (*point)(const void *ctx, uint32_t i, char **label),
                         const void *ctx, const char *path, GError **err);
/* One CSV field of plan.csv and sweep.csv: quoted when it holds a comma, a quote or a newline
 * (quotes doubled, newlines written as spaces). */
void planner_csv_field(FILE *f, const char *s);

#endif
