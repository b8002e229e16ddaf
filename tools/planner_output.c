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
  g_autofree char *fp8 = c->fp8 && strcmp(c->fp8, "none") != 0
                             ? g_strdup_printf(", FP8 %s", c->fp8)
                             : g_strdup("");
  if (c->micro_batch_size > 0)
    return g_strdup_printf("%s %s, %u micro-batches of %lld%s", sched_family_name(c->schedule),
                           what, c->microbatches, (long long)c->micro_batch_size, fp8);
  return g_strdup_printf("%s %s, %u micro-batches%s", sched_family_name(c->schedule), what,
                         c->microbatches, fp8);
}

static const char *status_name(enum planner_status s) {
  switch (s) {
  case PLANNER_FEASIBLE: return "ok";
  case PLANNER_OVER_CAP: return "over_memory_cap";
  case PLANNER_FAILED: return "error";
  default: return "pending";
  }
}

void planner_csv_field(FILE *f, const char *s) {
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
  if (c->bounded)
    return g_strdup_printf("at least %.3f GiB (parameters, gradients, optimizer state and the "
                           "activations its schedule holds at once), over the cap of %.3f GiB "
                           "(not simulated)",
                           c->peak_memory_bytes / GIB, c->memory_cap_bytes / GIB);
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
  fputs("rank,status,schedule,layout,pp,dp,ep,tp,cp,etp,fp8,stages,memory,micro_batch_size,"
        "num_microbatches,"
        "iteration_time_s,throughput_tokens_per_s,mfu,peak_memory_gib,memory_cap_gib,"
        "headroom_gib,bubble_fraction,pipeline_idle_fraction,exposed_comm_fraction,"
        "imbalance_fraction,reason\n",
        f);
  for (uint32_t i = 0; i < pl->n_configs; i++) {
    const struct planner_config *c = &pl->configs[i];
    fprintf(f, "%u,%s,%s,", i + 1, status_name(c->status), sched_family_name(c->schedule));
    planner_csv_field(f, c->layout ? c->layout : c->directives ? c->directives : "");
    /* etp: the experts' TP (the layout's tp where not given); fp8: the recipe the GEMMs ran */
    fprintf(f, ",%u,%u,%u,%u,%u,%u,%s,%u,%s,%lld,%u", c->pp, c->dp, c->ep, c->tp,
            c->cp ? c->cp : 1, c->etp ? c->etp : c->tp, c->fp8 ? c->fp8 : pl->model_fp8,
            c->stages, c->memory_choice,
            (long long)(c->micro_batch_size ? c->micro_batch_size : pl->model_micro_batch_size),
            c->microbatches);
    if (c->bounded) /* not simulated: the bound is the one figure */
      fprintf(f, ",,,,%.6f,%.6f,%.6f,,,,,", c->peak_memory_bytes / GIB, c->memory_cap_bytes / GIB,
              (c->memory_cap_bytes - c->peak_memory_bytes) / GIB);
    else if (c->status == PLANNER_FEASIBLE || c->status == PLANNER_OVER_CAP)
      fprintf(f, ",%.9g,%.9g,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,", c->iteration_time_s,
              c->throughput_tokens_per_s, c->mfu, c->peak_memory_bytes / GIB,
              c->memory_cap_bytes / GIB,
              c->memory_cap_bytes > 0 ? (c->memory_cap_bytes - c->peak_memory_bytes) / GIB : 0,
              c->bubble.bubble, c->bubble.pipeline_idle, c->bubble.exposed_comm,
              c->bubble.imbalance);
    else
      fputs(",,,,,,,,,,,", f);
    char *reason = c->status == PLANNER_FEASIBLE ? g_strdup("") : infeasible_reason(c);
    planner_csv_field(f, reason);
    g_free(reason);
    fputc('\n', f);
  }
  return piper_out_close(&out, err);
}

bool planner_write_chart(const char *title, uint32_t n,
                         struct chart_point (*point)(const void *ctx, uint32_t i, char **label),
                         const void *ctx, const char *path, GError **err) {
  struct chart_point *pts = g_new0(struct chart_point, n + 1);
  char **labels = g_new0(char *, n + 1);
  for (uint32_t i = 0; i < n; i++) {
    pts[i] = point(ctx, i, &labels[i]);
    pts[i].label = labels[i];
  }
  bool ok = chart_points(title, pts, n, path, err);
  g_strfreev(labels);
  g_free(pts);
  return ok;
}

/* A layout spec short enough for a chart label: the keys every configuration has at their
 * default dropped, the long ones abbreviated. */
static char *short_layout(const char *spec) {
  static const char *const swaps[][2] = {
      {",ep=1", ""},
      {",account-for-embedding,account-for-loss", ",acct-emb+loss"},
      {"first-stage-layers=", "first="},
      {"last-stage-layers=", "last="},
      {"recompute=", "rc="},
      {"interleave=", "il="},
  };
  char *out = g_strdup(spec);
  for (size_t k = 0; k < G_N_ELEMENTS(swaps); k++) {
    gchar **parts = g_strsplit(out, swaps[k][0], -1);
    g_free(out);
    out = g_strjoinv(swaps[k][1], parts);
    g_strfreev(parts);
  }
  return out;
}

/* plan.png: every simulated configuration, throughput against peak memory (colour by
 * schedule, hollow over the cap, the cap line, the Pareto front). Configurations come ranked:
 * the first five feasible are the top picks, labelled "#rank schedule layout" always; the
 * chart labels the front's others where there is room. */
static struct chart_point config_point(const void *ctx, uint32_t i, char **label) {
  const struct planner *pl = ctx;
  const struct planner_config *c = &pl->configs[i];
  bool simulated = (c->status == PLANNER_FEASIBLE || c->status == PLANNER_OVER_CAP) && !c->bounded;
  if (simulated) {
    g_autofree char *layout = short_layout(c->layout ? c->layout : "");
    *label = g_strdup_printf("#%u %s %s", i + 1, sched_family_name(c->schedule), layout);
  }
  return (struct chart_point){.schedule = sched_family_name(c->schedule),
                              .profile = pl->profile->name,
                              .ok = simulated,
                              .bounded = c->bounded,
                              .feasible = c->status == PLANNER_FEASIBLE,
                              .top = c->status == PLANNER_FEASIBLE && i < PLANNER_CHART_TOP,
                              .peak_memory_bytes = c->peak_memory_bytes,
                              .throughput_tokens_per_s = c->throughput_tokens_per_s,
                              .memory_cap_bytes = pl->memory_cap_bytes};
}

static bool write_chart(const struct planner *pl, const char *path, GError **err) {
  g_autofree char *title = g_strdup_printf(
      "piper-plan: %s on %u devices, %s, global batch %llu (%u configurations; labels: rank, "
      "schedule, layout)",
      pl->model_name, pl->request.devices, pl->profile->name,
      (unsigned long long)pl->request.global_batch, pl->n_configs);
  return planner_write_chart(title, pl->n_configs, config_point, pl, path, err);
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
    any |= (pl->configs[i].status == PLANNER_FEASIBLE || pl->configs[i].status == PLANNER_OVER_CAP) &&
           !pl->configs[i].bounded;
  if (!ok || !charts || !any)
    return ok;
  char *png = g_build_filename(dir, "plan.png", NULL);
  ok = write_chart(pl, png, err);
  g_free(png);
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
      g_string_append_printf(s, "\n      ties with #%u (ranked first: %s)", k,
                             c->peak_memory_bytes < next->peak_memory_bytes
                                 ? "less peak memory"
                                 : "enumeration order");
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
