/* planner slow GPU: ranks the planner's best layouts by their tolerance to one slow GPU, the
 * fraction of the step it costs them (piper-plan --rank-by slow-gpu[=F]). Each of the top
 * feasible configurations is simulated again with one device's compute F times as long (a sim
 * scenario, docs/sim.md), once per pipeline rank (the slow GPU is dp rank 0's device of that
 * rank; its replicas are alike), keeping the worst: the step a run gets when the straggler
 * lands on its worst stage.
 *
 *   GError *err = NULL;
 *   const struct planner *pl = NULL; // planner_new, then planner_run
 *   struct planner_slow *ps = planner_slow_run(pl, 1.3, 5, &err);
 *   for (uint32_t k = 0; ps && k < ps->n; k++)      // most tolerant first
 *     printf("%s +%.1f%%\n", pl->configs[ps->rows[k].config].layout, 100 * ps->rows[k].loss);
 *   planner_slow_free(ps);
 */
#ifndef PIPER_TOOLS_PLANNER_SLOW_H
#define PIPER_TOOLS_PLANNER_SLOW_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "planner.h"

#define PLANNER_SLOW_DEFAULT_FACTOR 1.3

struct planner_slow_row {
  uint32_t config;           /* index into planner.configs (ranked by healthy throughput) */
  double healthy_s, slowed_s; /* step without and with the slow GPU (its worst stage) */
  double loss;               /* slowed / healthy - 1 */
  uint32_t worst_pp_rank, worst_device;
  double throughput_tokens_per_s; /* under the slow GPU */
};

struct planner_slow {
  double factor;
  uint32_t n;                   /* configurations re-simulated */
  struct planner_slow_row *rows; /* by loss, smallest first; ties in healthy order */
  uint32_t simulations;
  double seconds;
};

/* Re-simulates the first `top` feasible configurations of a ranked planner. A configuration
 * that fails to compile or simulate again is left out (it did the first time). Errors: none
 * expected past planner_run's; NULL with err set if the scenario cannot be built. */
struct planner_slow *planner_slow_run(const struct planner *pl, double factor, uint32_t top,
                                      GError **err);
void planner_slow_free(struct planner_slow *ps);
/* dir/slow-gpu.csv: the rows, ranked. */
bool planner_slow_write_csv(const struct planner *pl, const struct planner_slow *ps,
                            const char *dir, GError **err);
/* The summary's lines: each row, its step against the healthy one. */
void planner_slow_print(const struct planner *pl, const struct planner_slow *ps, FILE *f);
/* "--rank-by" value: "throughput" (factor 0) or "slow-gpu[=F]" with F > 1; false when bad. */
bool planner_slow_parse_rank_by(const char *text, double *factor);

#endif
