/* sweep: what-if grids, the planner's explicit mode (piper-sim --sweep FILE, piper-plan --sweep
 * FILE). A sweep file names a model and lists base schedules (directive files, or layouts with
 * their own PP split), schedule families, micro-batch counts and profiles; every combination is
 * compiled and simulated in parallel (planner.h), ranked by throughput among those under the
 * memory cap, and written as sweep.csv plus a chart (throughput vs peak memory, report/chart.h). Files
 * the sweep names are checked when it is loaded, before anything runs.
 *
 *   GError *err = NULL;
 *   struct sweep *s = sweep_load_file("sweep.json", &err);
 *   if (!s || !sweep_run(s, "out/sweep", true, &err))   // true: progress on stderr
 *     fprintf(stderr, "%s\n", err->message);
 *   sweep_free(s);
 */
#ifndef PIPER_TOOLS_SWEEP_H
#define PIPER_TOOLS_SWEEP_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../report/report.h"

struct sweep_point {
  char *base, *schedule, *profile;
  uint32_t microbatches;
  bool ok;       /* compiled and simulated */
  bool feasible; /* ok and peak memory <= cap */
  double iteration_time_s, throughput_tokens_per_s, peak_memory_bytes, memory_cap_bytes;
  double bubble_fraction; /* mean over devices */
  struct report_bubble_split bubble; /* its split (fractions, means over devices) */
  char *error;            /* when !ok: the one-line reason */
  uint32_t order;         /* position in the grid (ties rank in grid order) */
};

/* One entry of "base_schedules": a file ("path" or {"file": path, "pp_regions": N}) or a layout
 * ({"layout": "pp=4,v"}: its stages give the PP split). */
struct sweep_base {
  char *file, *layout;
  int pp_regions; /* 0: the sweep's "pp_regions", else the model's */
};

struct sweep {
  char *path;
  char *model;
  int pp_regions;
  uint32_t ranks;
  double memory_cap_gib; /* 0: each profile's memory capacity */
  uint32_t n_bases, n_schedules, n_mbs, n_profiles;
  char **bases; /* each base's label: its file, or "layout SPEC" */
  struct sweep_base *base_entries;
  char **schedules, **profiles;
  uint32_t *mbs;
  uint32_t n_points;
  struct sweep_point *points; /* after sweep_run, ranked */
};

struct sweep_run_options {
  bool progress;       /* progress on stderr (a line per tenth when it is not a terminal) */
  bool charts;         /* sweep.png */
  bool collapse;       /* simulate one device per class of alike devices */
  uint32_t threads;    /* 0: one per core */
  const char *profile; /* replaces the file's "profiles" when not NULL */
};

struct sweep *sweep_load_file(const char *path, GError **err);
void sweep_free(struct sweep *s);
/* Runs every combination, ranks them, writes dir/sweep.csv and sweep.png
 * (charts). A combination that fails to compile is a row with its error, not a failure of the
 * sweep; a profile that does not load is an input error before anything runs. */
bool sweep_run_with(struct sweep *s, const char *dir, const struct sweep_run_options *o,
                    GError **err);
/* sweep_run_with with charts, collapse, one thread per core. */
bool sweep_run(struct sweep *s, const char *dir, bool progress, GError **err);
/* A program's whole sweep mode: load path, run into dir, print the summary when summary is set
 * (--no-summary unsets it; --quiet only drops the progress, o->progress). Returns the exit
 * status: 0, 1 when no combination could be simulated, 2 for bad input. */
int sweep_main(const char *program, const char *path, const char *dir,
               const struct sweep_run_options *o, bool summary);

#endif
