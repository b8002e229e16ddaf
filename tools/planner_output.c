/* planner output: the ranked CSV, the chart and the reasons a configuration wins (planner.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../report/chart.h"
#include "planner.h"

#define GIB ((double)(1ull << 30))

char *planner_config_name(const struct planner_config *c) {
  const char *what = c->layout ? c->layout : c->directives ? c->directives : "?";
  if (c->micro_batch_size > 0)
    return g_strdup_printf("%s %s, %u micro-batches of %lld", sched_family_name(c->schedule), what,
                           c->microbatches, (long long)c->micro_batch_size);
  return g_strdup_printf("%s %s, %u micro-batches", sched_family_name(c->schedule), what,
                         c->microbatches);
}

static const char *status_name(enum planner_status s) {
  switch (s) {
  case PLANNER_FEASIBLE: return "ok";
  case PLANNER_OVER_CAP: return "over_memory_cap";
  case PLANNER_FAILED: return "error";
  default: return "pending";
  }
}

static void csv_field(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\n")) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', f);
    fputc(*s == '\n' ? ' ' : *s, f);
  }
  fputc('"', f);
}

/* Why a row is not feasible, in the words of the CSV's reason column. */
static char *infeasible_reason(const struct planner_config *c) {
  if (c->status == PLANNER_OVER_CAP)
    return g_strdup_printf("peak memory %.3f GiB over the cap of %.3f GiB",
                           c->peak_memory_bytes / GIB, c->memory_cap_bytes / GIB);
  return g_strdup(c->error ? c->error : "");
}

static bool write_csv(const struct planner *pl, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  fputs("rank,status,schedule,layout,pp,dp,ep,stages,memory,micro_batch_size,microbatches,"
        "iteration_time_s,throughput_tokens_per_s,mfu,peak_memory_gib,memory_cap_gib,"
        "headroom_gib,bubble_fraction,pipeline_idle_fraction,exposed_comm_fraction,"
        "imbalance_fraction,reason\n",
        f);
  for (uint32_t i = 0; i < pl->n_configs; i++) {
    const struct planner_config *c = &pl->configs[i];
    fprintf(f, "%u,%s,%s,", i + 1, status_name(c->status), sched_family_name(c->schedule));
    csv_field(f, c->layout ? c->layout : c->directives ? c->directives : "");
    fprintf(f, ",%u,%u,%u,%u,%s,%lld,%u", c->pp, c->dp, c->ep, c->stages, c->memory_choice,
            (long long)(c->micro_batch_size ? c->micro_batch_size : pl->model_micro_batch_size),
            c->microbatches);
    if (c->status == PLANNER_FEASIBLE || c->status == PLANNER_OVER_CAP)
      fprintf(f, ",%.9g,%.9g,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,", c->iteration_time_s,
              c->throughput_tokens_per_s, c->mfu, c->peak_memory_bytes / GIB,
              c->memory_cap_bytes / GIB,
              c->memory_cap_bytes > 0 ? (c->memory_cap_bytes - c->peak_memory_bytes) / GIB : 0,
              c->bubble.bubble, c->bubble.pipeline_idle, c->bubble.exposed_comm,
              c->bubble.imbalance);
    else
      fputs(",,,,,,,,,,,", f);
    char *reason = c->status == PLANNER_FEASIBLE ? g_strdup("") : infeasible_reason(c);
    csv_field(f, reason);
    g_free(reason);
    fputc('\n', f);
  }
  return piper_out_close(&out, err);
}

/* Chart data: one block per schedule family (simulated configurations only): peak GiB,
 * throughput, 1 when feasible else 0, the rank as label. */
static bool write_chart_data(const struct planner *pl, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  for (int fam = 0; fam < SCHED_FAMILY_COUNT; fam++) {
    fprintf(out.f, "# %s\n", sched_family_name((enum sched_family)fam));
    int rows = 0;
    for (uint32_t i = 0; i < pl->n_configs; i++) {
      const struct planner_config *c = &pl->configs[i];
      if ((int)c->schedule != fam || c->status == PLANNER_FAILED || c->status == PLANNER_PENDING)
        continue;
      fprintf(out.f, "%.6f %.9g %d \"#%u\"\n", c->peak_memory_bytes / GIB,
              c->throughput_tokens_per_s, c->status == PLANNER_FEASIBLE, i + 1);
      rows++;
    }
    if (rows == 0)
      fputs("NaN NaN 0 \"\"\n", out.f); /* gnuplot needs a non-empty block */
    fputs("\n\n", out.f);
  }
  return piper_out_close(&out, err);
}

/* The best five under the cap: ringed and numbered on the chart (labels staggered left and
 * right, then upwards, so that close points keep readable numbers), and listed in full beside
 * it. Returns how many there are. */
static uint32_t chart_best(FILE *f, const struct planner *pl) {
  uint32_t n = 0;
  GString *list = g_string_new("best under the cap (micro-batches x size):");
  for (uint32_t i = 0; i < pl->n_configs && n < 5; i++) {
    const struct planner_config *c = &pl->configs[i];
    if (c->status != PLANNER_FEASIBLE)
      continue;
    bool right = n % 2 == 0;
    fprintf(f, "set label %u '#%u' at %.6f,%.9g %s offset %s1.6,%.1f font ',10' front\n", 10 + n,
            i + 1, c->peak_memory_bytes / GIB, c->throughput_tokens_per_s,
            right ? "left" : "right", right ? "" : "-", 0.4 + 0.9 * (n / 2));
    g_string_append_printf(list, "\\n#%u %s %s, %u x %lld", i + 1, sched_family_name(c->schedule),
                           c->layout ? c->layout : "", c->microbatches,
                           (long long)(c->micro_batch_size ? c->micro_batch_size
                                                           : pl->model_micro_batch_size));
    n++;
  }
  fprintf(f, "set label 2 \"%s\" at screen 0.68, screen 0.50 left font ',9'\n", list->str);
  g_string_free(list, TRUE);
  return n;
}

/* Feasible points filled, over the cap hollow, one colour per schedule present; the cap as a
 * dashed line; the best five ringed and numbered. */
static bool write_chart_script(const struct planner *pl, const char *path, GError **err) {
  static const char *const colours[SCHED_FAMILY_COUNT] = {
      "#4E79A7", "#F28E2B", "#E15759", "#76B7B2", "#59A14F", "#EDC948", "#B07AA1", "#9C755F"};
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  double cap = pl->memory_cap_bytes / GIB;
  fprintf(f,
          "set terminal pngcairo size 1400,800 font 'sans,11' noenhanced\n%s"
          "set title 'piper-plan: %s on %u devices, %s, global batch %llu (%u configurations; "
          "filled: under the cap, hollow: over it)'\n"
          "set xlabel 'peak memory per device (GiB)'\nset ylabel 'throughput (tokens/s)'\n"
          "set grid\nset rmargin at screen 0.66\nset key at screen 0.68, screen 0.92 left top "
          "box Left reverse\nset yrange [0:*]\nset xrange [0:*]\n",
          CHART_GNUPLOT_OUTPUT("plan.png"), pl->model_name, pl->request.devices,
          pl->profile->name, (unsigned long long)pl->request.global_batch, pl->n_configs);
  if (cap > 0)
    fprintf(f,
            "set arrow 1 from %.6f, graph 0 to %.6f, graph 1 nohead dt 2 lw 2 lc rgb '#C0392B'\n"
            "set label 1 'memory cap' at %.6f, graph 0.97 right offset -0.5,0 tc rgb '#C0392B'\n",
            cap, cap, cap);
  bool present[SCHED_FAMILY_COUNT] = {false};
  for (uint32_t i = 0; i < pl->n_configs; i++)
    present[pl->configs[i].schedule] |= pl->configs[i].status == PLANNER_FEASIBLE ||
                                        pl->configs[i].status == PLANNER_OVER_CAP;
  uint32_t best = chart_best(f, pl);
  fputs("plot ", f);
  const char *sep = "";
  for (int fam = 0; fam < SCHED_FAMILY_COUNT; fam++) {
    if (!present[fam])
      continue;
    fprintf(f,
            "%s'plan.dat' index %d using 1:($3 > 0 ? $2 : 1/0) with points pt 7 ps 1.4 "
            "lc rgb '%s' title '%s', \\\n     'plan.dat' index %d using 1:($3 > 0 ? 1/0 : $2) "
            "with points pt 6 ps 1.4 lc rgb '%s' notitle",
            sep, fam, colours[fam], sched_family_name((enum sched_family)fam), fam, colours[fam]);
    sep = ", \\\n     ";
  }
  /* rings around the best, from any block: feasible rows rank first, so the best are ranks
   * 1 .. best */
  if (best)
    fprintf(f, "%s'plan.dat' using 1:(($3 > 0 && int(substr(strcol(4), 2, 9)) <= %u) ? $2 : 1/0) "
               "with points pt 4 ps 2.6 lw 1.5 lc rgb 'black' title 'best %u'",
            sep, best, best);
  fputc('\n', f);
  return piper_out_close(&out, err);
}

bool planner_write_outputs(const struct planner *pl, const char *dir, bool charts, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create directory: %s", dir,
                strerror(errno));
    return false;
  }
  char *csv = g_build_filename(dir, "plan.csv", NULL);
  bool ok = write_csv(pl, csv, err);
  g_free(csv);
  bool any = false; /* nothing simulated: nothing to draw */
  for (uint32_t i = 0; i < pl->n_configs; i++)
    any |= pl->configs[i].status == PLANNER_FEASIBLE || pl->configs[i].status == PLANNER_OVER_CAP;
  if (!ok || !charts || !any)
    return ok;
  char *dat = g_build_filename(dir, "plan.dat", NULL);
  char *gp = g_build_filename(dir, "plan.gp", NULL);
  ok = write_chart_data(pl, dat, err) && write_chart_script(pl, gp, err) &&
       chart_run_gnuplot(dir, "plan.gp", "plan.png", err);
  g_free(dat);
  g_free(gp);
  return ok;
}

/* One part of a step-time difference: "12.3 ms less pipeline idle". */
static void explain_part(GString *s, double delta_s, const char *what, bool *first) {
  if (fabs(delta_s) < 5e-7)
    return;
  g_string_append_printf(s, "%s%.3g ms %s %s", *first ? "" : ", ", fabs(delta_s) * 1e3,
                         delta_s < 0 ? "less" : "more", what);
  *first = false;
}

char *planner_explain(const struct planner *pl, uint32_t i) {
  const struct planner_config *c = &pl->configs[i];
  GString *s = g_string_new("");
  const struct planner_config *next = NULL;
  for (uint32_t j = i + 1; j < pl->n_configs && !next; j++)
    if (pl->configs[j].status == PLANNER_FEASIBLE)
      next = &pl->configs[j];
  double it = c->iteration_time_s;
  g_string_append_printf(s, "bubble %.1f%% (pipeline idle %.1f%%, exposed comm %.1f%%, "
                            "imbalance %.1f%%)",
                         100 * c->bubble.bubble, 100 * c->bubble.pipeline_idle,
                         100 * c->bubble.exposed_comm, 100 * c->bubble.imbalance);
  if (c->memory_cap_bytes > 0)
    g_string_append_printf(s, "; %.1f GiB headroom (%.0f%% of the cap)",
                           (c->memory_cap_bytes - c->peak_memory_bytes) / GIB,
                           100 * (c->memory_cap_bytes - c->peak_memory_bytes) /
                               c->memory_cap_bytes);
  if (next) {
    /* per device, step = compute + pipeline idle + exposed comm + imbalance: the difference of
     * the means splits exactly into these four */
    double itn = next->iteration_time_s;
    uint32_t k = (uint32_t)(next - pl->configs) + 1;
    if (fabs(itn - it) <= 1e-9 * fmax(it, itn)) {
      g_string_append_printf(s, "\n      ties with #%u (ranked first by enumeration order)", k);
      return g_string_free(s, FALSE);
    }
    g_string_append_printf(s, "\n      beats #%u by %.4g ms a step with ", k, (itn - it) * 1e3);
    bool first = true;
    explain_part(s, c->bubble.pipeline_idle * it - next->bubble.pipeline_idle * itn,
                 "pipeline idle", &first);
    explain_part(s, c->bubble.exposed_comm * it - next->bubble.exposed_comm * itn,
                 "exposed communication", &first);
    explain_part(s, c->bubble.imbalance * it - next->bubble.imbalance * itn, "imbalance", &first);
    explain_part(s, c->compute_s_mean - next->compute_s_mean, "compute per device", &first);
  }
  return g_string_free(s, FALSE);
}
