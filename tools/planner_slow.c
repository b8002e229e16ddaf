/* planner slow GPU: the best layouts again, each with one slow GPU (planner_slow.h). Kept apart
 * from planner.c so the search and its ranking stay one thing and this one hook. */
#include "planner_slow.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../sim/sim.h"

bool planner_slow_parse_rank_by(const char *text, double *factor) {
  *factor = 0;
  if (strcmp(text, "throughput") == 0)
    return true;
  if (strcmp(text, "slow-gpu") == 0) {
    *factor = PLANNER_SLOW_DEFAULT_FACTOR;
    return true;
  }
  if (strncmp(text, "slow-gpu=", 9) != 0)
    return false;
  char *end = NULL;
  double f = g_ascii_strtod(text + 9, &end);
  /* a factor of 1 or less is no straggler; 1e6 is scenario.c's bound on a slow factor */
  if (end == text + 9 || *end != '\0' || !(f > 1 && f <= 1e6))
    return false;
  *factor = f;
  return true;
}

/* The step of plan with device d's compute `factor` times as long (the scenario machinery of
 * piper-sim --scenario, collapsed as the planner simulates). */
static bool slowed_step(const struct plan *plan, const struct profile *prof, bool collapse,
                        uint32_t d, double factor, double *step, GError **err) {
  cJSON *root = cJSON_CreateObject(), *slow = cJSON_AddArrayToObject(root, "slow");
  cJSON *entry = cJSON_CreateObject();
  cJSON *devices = cJSON_AddArrayToObject(entry, "devices");
  cJSON_AddItemToArray(devices, cJSON_CreateNumber(d));
  cJSON_AddNumberToObject(entry, "factor", factor);
  cJSON_AddItemToArray(slow, entry);
  struct sim_scenario *sc = sim_scenario_from_json(root, "--rank-by slow-gpu", plan, err);
  cJSON_Delete(root);
  if (!sc)
    return false;
  struct sim_options so = {.collapse = collapse,
                           .no_intervals = true,
                           .no_memory_timeline = true,
                           .scenario = sc};
  struct sim_result *r = sim_run(plan, prof, &so, err);
  if (r)
    *step = r->iteration_time;
  sim_result_free(r);
  sim_scenario_free(sc);
  return r != NULL;
}

/* Slows dp rank 0's device of each pipeline rank in turn and keeps the worst step: the stage
 * matters (how much of the pipeline's idle time is left to absorb the delay), the replica does
 * not (replicas of a stage run alike). */
static bool slow_one(const struct planner *pl, const struct planner_config *c, double factor,
                     struct planner_slow_row *row, uint32_t *simulations, GError **err) {
  struct plan *plan = planner_compile_config(c, pl->request.model_path, pl->request.seq_len,
                                              pl->profile, err);
  if (!plan)
    return false;
  struct report_run run = {.plan = plan};
  report_run_init_devices(&run);
  bool ok = true;
  row->slowed_s = -1;
  for (uint32_t r = 0; ok && r < run.pp; r++) {
    uint32_t d = 0;
    while (d < run.n_devices &&
           !(run.devices[d].pp_rank == (int32_t)r && run.devices[d].dp_rank == 0))
      d++;
    double step = 0;
    if (d == run.n_devices)
      continue; /* a pipeline rank without a dp rank 0: cannot happen, nothing to slow */
    ok = slowed_step(plan, pl->profile, pl->request.collapse, d, factor, &step, err);
    (*simulations)++;
    if (ok && step > row->slowed_s) {
      row->slowed_s = step;
      row->worst_pp_rank = r;
      row->worst_device = d;
    }
  }
  report_run_free_devices(&run);
  plan_free(plan);
  return ok && row->slowed_s > 0;
}

static int row_cmp(const void *a, const void *b) {
  const struct planner_slow_row *x = a, *y = b;
  if (x->loss != y->loss)
    return x->loss < y->loss ? -1 : 1;
  return x->config < y->config ? -1 : x->config > y->config;
}

struct planner_slow *planner_slow_run(const struct planner *pl, double factor, uint32_t top,
                                      GError **err) {
  double t0 = piper_clock_seconds();
  struct planner_slow *ps = g_new0(struct planner_slow, 1);
  ps->factor = factor;
  ps->rows = g_new0(struct planner_slow_row, top ? top : 1);
  for (uint32_t i = 0; i < pl->n_configs && ps->n < top; i++) {
    const struct planner_config *c = &pl->configs[i];
    if (c->status != PLANNER_FEASIBLE)
      continue;
    struct planner_slow_row *row = &ps->rows[ps->n];
    *row = (struct planner_slow_row){.config = i, .healthy_s = c->iteration_time_s};
    GError *e = NULL;
    if (!slow_one(pl, c, factor, row, &ps->simulations, &e)) {
      /* it compiled and simulated healthy: a failure here is the scenario's, and names it */
      if (e && e->domain == PIPER_ERROR && e->code == PIPER_ERROR_INPUT) {
        g_propagate_error(err, e);
        planner_slow_free(ps);
        return NULL;
      }
      g_clear_error(&e);
      continue;
    }
    row->loss = row->healthy_s > 0 ? row->slowed_s / row->healthy_s - 1 : 0;
    row->throughput_tokens_per_s =
        row->slowed_s > 0 ? c->throughput_tokens_per_s * row->healthy_s / row->slowed_s : 0;
    ps->n++;
  }
  qsort(ps->rows, ps->n, sizeof *ps->rows, row_cmp);
  ps->seconds = piper_clock_seconds() - t0;
  return ps;
}

void planner_slow_free(struct planner_slow *ps) {
  if (!ps)
    return;
  g_free(ps->rows);
  g_free(ps);
}

bool planner_slow_write_csv(const struct planner *pl, const struct planner_slow *ps,
                            const char *dir, GError **err) {
  char *path = g_build_filename(dir, "slow-gpu.csv", NULL);
  struct piper_out out;
  bool ok = piper_out_open(&out, path, err);
  g_free(path);
  if (!ok)
    return false;
  FILE *f = out.f;
  fprintf(f, "rank,healthy_rank,configuration,factor,healthy_step_s,slowed_step_s,loss_fraction,"
             "worst_pp_rank,worst_device,slowed_tokens_per_s\n");
  for (uint32_t k = 0; k < ps->n; k++) {
    const struct planner_slow_row *r = &ps->rows[k];
    char *name = planner_config_name(&pl->configs[r->config]);
    fprintf(f, "%u,%u,", k + 1, r->config + 1);
    planner_csv_field(f, name);
    fprintf(f, ",%.17g,%.17g,%.17g,%.17g,%u,%u,%.17g\n", ps->factor, r->healthy_s, r->slowed_s,
            r->loss, r->worst_pp_rank, r->worst_device, r->throughput_tokens_per_s);
    g_free(name);
  }
  return piper_out_close(&out, err);
}

void planner_slow_print(const struct planner *pl, const struct planner_slow *ps, FILE *f) {
  if (ps->n == 0) {
    fprintf(f, "  one GPU x%g slower: no feasible configuration to simulate again\n", ps->factor);
    return;
  }
  fprintf(f, "  one GPU x%g slower (its worst pipeline rank; %u simulations in %.2f s), ranked by "
             "the loss:\n",
          ps->factor, ps->simulations, ps->seconds);
  for (uint32_t k = 0; k < ps->n; k++) {
    const struct planner_slow_row *r = &ps->rows[k];
    char *name = planner_config_name(&pl->configs[r->config]);
    fprintf(f, "  #%u %s (#%u healthy): %.4g ms a step against %.4g ms (+%.2f%%), worst on pp "
               "rank %u\n",
            k + 1, name, r->config + 1, r->slowed_s * 1e3, r->healthy_s * 1e3, 100 * r->loss,
            r->worst_pp_rank);
    g_free(name);
  }
}
