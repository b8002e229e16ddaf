/* sweep: what-if grids for piper-sim --sweep FILE. A sweep file names a model and lists base
 * schedules (placement programs), schedule families, micro-batch counts and profiles; every
 * combination is compiled and simulated, ranked by throughput among those under the memory cap,
 * and written as sweep.csv plus a chart (throughput vs peak memory, report/chart.h).
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

struct sweep_point {
  char *base, *schedule, *profile;
  uint32_t microbatches;
  bool ok;       /* compiled and simulated */
  bool feasible; /* ok and peak memory <= cap */
  double iteration_time_s, throughput_tokens_per_s, peak_memory_bytes, memory_cap_bytes;
  double bubble_fraction; /* mean over devices */
  char *error;            /* when !ok: the one-line reason */
  uint32_t order;         /* position in the grid (ties rank in grid order) */
};

struct sweep {
  char *path;
  char *model;
  int pp_regions;
  uint32_t ranks;
  double memory_cap_gib; /* 0: each profile's memory capacity */
  uint32_t n_bases, n_schedules, n_mbs, n_profiles;
  char **bases, **schedules, **profiles;
  uint32_t *mbs;
  uint32_t n_points;
  struct sweep_point *points; /* after sweep_run, ranked */
};

struct sweep *sweep_load_file(const char *path, GError **err);
void sweep_free(struct sweep *s);
/* Runs every combination (progress on stderr when progress is true), ranks them, writes
 * dir/sweep.csv and sweep.png. A combination that fails to compile is a
 * row with its error, not a failure of the sweep. */
bool sweep_run(struct sweep *s, const char *dir, bool progress, GError **err);

#endif
