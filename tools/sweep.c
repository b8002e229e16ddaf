/* sweep: the what-if grid of piper-sim --sweep. */
#include "sweep.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "../directives/compile.h"
#include "../directives/layout.h"
#include "../report/chart.h"
#include "../sim/sim.h"
#include "planner.h"


static bool string_list(const cJSON *root, const char *key, char ***out, uint32_t *n,
                        const char *ctx, GError **err) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!a)
    return piper_input_error(err, "%s: key \"%s\" is required", ctx, key);
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0)
    return piper_input_error(err, "%s: key \"%s\" must be a non-empty array of strings", ctx, key);
  *n = (uint32_t)cJSON_GetArraySize(a);
  *out = g_new0(char *, *n + 1);
  uint32_t i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, a) {
    if (!cJSON_IsString(v) || !v->valuestring[0])
      return piper_input_error(err, "%s: key \"%s\": item %u must be a non-empty string", ctx, key, i);
    (*out)[i++] = g_strdup(v->valuestring);
  }
  return true;
}

/* One "base_schedules" item: "file", or {"file": F, "pp_regions": N}, or {"layout": SPEC}. */
static bool base_entry(const cJSON *v, uint32_t i, struct sweep *s, const char *path,
                       GError **err) {
  struct sweep_base *b = &s->base_entries[i];
  char ctx[600];
  g_snprintf(ctx, sizeof ctx, "%s: key \"base_schedules\": item %u", path, i);
  if (cJSON_IsString(v) && v->valuestring[0]) {
    b->file = g_strdup(v->valuestring);
    s->bases[i] = g_strdup(b->file);
    return true;
  }
  static const char *const keys[] = {"file", "layout", "pp_regions", NULL};
  if (!cJSON_IsObject(v))
    return piper_input_error(err, "%s must be a file name or an object with \"file\" or "
                                  "\"layout\"", ctx);
  if (!json_check_keys(v, keys, ctx, err))
    return false;
  const char *file = NULL, *spec = NULL;
  int64_t pp = 0;
  if (!json_get_string(v, "file", false, &file, ctx, err) ||
      !json_get_string(v, "layout", false, &spec, ctx, err) ||
      !json_get_int(v, "pp_regions", false, 1, MODEL_MAX_LAYERS, &pp, ctx, err))
    return false;
  if (!file == !spec)
    return piper_input_error(err, "%s: give one of \"file\" and \"layout\"", ctx);
  struct layout l;
  if (spec && !layout_parse(spec, &l, err)) {
    g_prefix_error(err, "%s: ", ctx);
    return false;
  }
  if (spec && pp > 0 && (uint32_t)pp != layout_stages(&l))
    return piper_input_error(err, "%s: \"pp_regions\" %lld disagrees with layout \"%s\" (%u "
                                  "stages)", ctx, (long long)pp, spec, layout_stages(&l));
  b->file = file ? g_strdup(file) : NULL;
  b->layout = spec ? g_strdup(spec) : NULL;
  b->pp_regions = (int)pp;
  s->bases[i] = file ? g_strdup(file) : g_strdup_printf("layout %s", spec);
  return true;
}

static bool base_list(const cJSON *root, struct sweep *s, const char *path, GError **err) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "base_schedules");
  if (!a)
    return piper_input_error(err, "%s: key \"base_schedules\" is required", path);
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0)
    return piper_input_error(err, "%s: key \"base_schedules\" must be a non-empty array", path);
  s->n_bases = (uint32_t)cJSON_GetArraySize(a);
  s->bases = g_new0(char *, s->n_bases + 1);
  s->base_entries = g_new0(struct sweep_base, s->n_bases + 1);
  uint32_t i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, a) {
    if (!base_entry(v, i, s, path, err))
      return false;
    i++;
  }
  return true;
}

/* Every file the sweep names exists, before anything is compiled: a typo in the last profile
 * must not cost the whole grid's time. */
static bool check_file(const char *file, const char *path, const char *key, uint32_t item,
                       GError **err) {
  if (g_file_test(file, G_FILE_TEST_IS_REGULAR))
    return true;
  if (item == UINT32_MAX)
    return piper_input_error(err, "%s: key \"%s\": \"%s\": no such file", path, key, file);
  return piper_input_error(err, "%s: key \"%s\": item %u: \"%s\": no such file", path, key,
                           item, file);
}

static bool check_files(const struct sweep *s, GError **err) {
  if (!check_file(s->model, s->path, "model", UINT32_MAX, err))
    return false;
  for (uint32_t i = 0; i < s->n_bases; i++)
    if (s->base_entries[i].file &&
        !check_file(s->base_entries[i].file, s->path, "base_schedules", i, err))
      return false;
  for (uint32_t i = 0; i < s->n_profiles; i++)
    if (!check_file(s->profiles[i], s->path, "profiles", i, err))
      return false;
  return true;
}

struct sweep *sweep_load_file(const char *path, GError **err) {
  cJSON *root = json_parse_file_strict(path, err);
  if (!root)
    return NULL;
  struct sweep *s = g_new0(struct sweep, 1);
  s->path = g_strdup(path);
  bool ok = false;
  static const char *const keys[] = {
      "model",    "pp_regions", "base_schedules", "schedules",   "microbatches",
      "profiles", "ranks",      "memory_cap_gib", "description", NULL};
  if (!cJSON_IsObject(root)) {
    piper_input_error(err, "%s: a sweep file must be a JSON object", path);
    goto out;
  }
  if (!json_check_keys(root, keys, path, err))
    goto out;
  const char *model;
  if (!json_get_string(root, "model", true, &model, path, err))
    goto out;
  s->model = g_strdup(model);
  int64_t v = 0;
  if (!json_get_int(root, "pp_regions", false, 0, MODEL_MAX_LAYERS, &v, path, err))
    goto out;
  s->pp_regions = (int)v;
  v = 0;
  if (!json_get_int(root, "ranks", false, 0, IR_MAX_DEVICES, &v, path, err))
    goto out;
  s->ranks = (uint32_t)v;
  if (!json_get_double(root, "memory_cap_gib", false, 0, 1e9, &s->memory_cap_gib, path, err))
    goto out;
  if (!base_list(root, s, path, err) ||
      !string_list(root, "schedules", &s->schedules, &s->n_schedules, path, err) ||
      !string_list(root, "profiles", &s->profiles, &s->n_profiles, path, err))
    goto out;
  for (uint32_t i = 0; i < s->n_schedules; i++) {
    enum sched_family f;
    if (!sched_family_parse(s->schedules[i], &f)) {
      piper_input_error(err, "%s: key \"schedules\": unknown schedule \"%s\"", path, s->schedules[i]);
      goto out;
    }
  }
  const cJSON *mb = cJSON_GetObjectItemCaseSensitive(root, "microbatches");
  if (!cJSON_IsArray(mb) || cJSON_GetArraySize(mb) == 0) {
    piper_input_error(err, "%s: key \"microbatches\" must be a non-empty array of integers", path);
    goto out;
  }
  s->n_mbs = (uint32_t)cJSON_GetArraySize(mb);
  s->mbs = g_new0(uint32_t, s->n_mbs);
  uint32_t i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, mb) {
    int64_t m;
    if (!json_as_int(it, 1, DIR_MAX_MICROBATCHES, &m, path, "microbatches", err))
      goto out;
    s->mbs[i++] = (uint32_t)m;
  }
  uint64_t total = (uint64_t)s->n_bases * s->n_schedules * s->n_mbs * s->n_profiles;
  if (total > 100000) {
    piper_input_error(err, "%s: %llu combinations; at most 100000", path, (unsigned long long)total);
    goto out;
  }
  ok = check_files(s, err);
out:
  cJSON_Delete(root);
  if (!ok) {
    sweep_free(s);
    return NULL;
  }
  return s;
}

static void point_clear(struct sweep_point *p) {
  g_free(p->base);
  g_free(p->schedule);
  g_free(p->profile);
  g_free(p->error);
}

void sweep_free(struct sweep *s) {
  if (!s)
    return;
  g_strfreev(s->bases);
  for (uint32_t i = 0; s->base_entries && i < s->n_bases; i++) {
    g_free(s->base_entries[i].file);
    g_free(s->base_entries[i].layout);
  }
  g_free(s->base_entries);
  g_strfreev(s->schedules);
  g_strfreev(s->profiles);
  g_free(s->mbs);
  for (uint32_t i = 0; i < s->n_points; i++)
    point_clear(&s->points[i]);
  g_free(s->points);
  g_free(s->model);
  g_free(s->path);
  g_free(s);
}

static int point_rank_cmp(const void *a, const void *b) {
  const struct sweep_point *x = a, *y = b;
  int cx = x->feasible ? 0 : x->ok ? 1 : 2, cy = y->feasible ? 0 : y->ok ? 1 : 2;
  if (cx != cy)
    return cx < cy ? -1 : 1;
  /* over the cap: the closest first, as the planner ranks them */
  if (cx == 1 && x->peak_memory_bytes != y->peak_memory_bytes)
    return x->peak_memory_bytes < y->peak_memory_bytes ? -1 : 1;
  if (x->throughput_tokens_per_s != y->throughput_tokens_per_s)
    return x->throughput_tokens_per_s > y->throughput_tokens_per_s ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static bool write_csv(const struct sweep *s, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  fprintf(f, "rank,status,schedule,base,num_microbatches,profile,iteration_time_s,"
             "throughput_tokens_per_s,peak_memory_gib,memory_cap_gib,bubble_fraction,"
             "pipeline_idle_fraction,exposed_comm_fraction,imbalance_fraction,error\n");
  for (uint32_t i = 0; i < s->n_points; i++) {
    const struct sweep_point *p = &s->points[i];
    fprintf(f, "%u,%s,", i + 1, p->feasible ? "ok" : p->ok ? "over_memory_cap" : "error");
    planner_csv_field(f, p->schedule);
    fputc(',', f);
    planner_csv_field(f, p->base);
    fprintf(f, ",%u,", p->microbatches);
    planner_csv_field(f, p->profile);
    if (p->ok)
      fprintf(f, ",%.9g,%.9g,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,", p->iteration_time_s,
              p->throughput_tokens_per_s, p->peak_memory_bytes / (double)(1ull << 30),
              p->memory_cap_bytes / (double)(1ull << 30), p->bubble_fraction,
              p->bubble.pipeline_idle, p->bubble.exposed_comm, p->bubble.imbalance);
    else
      fputs(",,,,,,,,,", f);
    planner_csv_field(f, p->error ? p->error : "");
    fputc('\n', f);
  }
  return piper_out_close(&out, err);
}

/* sweep.png: every simulated point, labelled schedule/base/micro-batches (the top picks
 * always, the Pareto front where there is room), best first. */
static struct chart_point sweep_chart_point(const void *ctx, uint32_t i, char **label) {
  const struct sweep_point *p = &((const struct sweep *)ctx)->points[i];
  g_autofree char *base = g_path_get_basename(p->base);
  char *dot = strrchr(base, '.');
  if (dot)
    *dot = 0;
  *label = g_strdup_printf("%s/%s/%u", p->schedule, base, p->microbatches);
  return (struct chart_point){.schedule = p->schedule,
                              .profile = p->profile,
                              .ok = p->ok,
                              .feasible = p->feasible,
                              .top = p->feasible && i < PLANNER_CHART_TOP, /* ranked: best first */
                              .peak_memory_bytes = p->peak_memory_bytes,
                              .throughput_tokens_per_s = p->throughput_tokens_per_s,
                              .memory_cap_bytes = p->memory_cap_bytes};
}

static bool write_chart(const struct sweep *s, const char *path, GError **err) {
  g_autofree char *mname = g_path_get_basename(s->model);
  g_autofree char *title = g_strdup_printf(
      "What-if sweep: %s, %u configurations (labels: schedule/base/micro-batches)", mname,
      s->n_points);
  return planner_write_chart(title, s->n_points, sweep_chart_point, s, path, err);
}

/* dir/sweep.csv, and with charts sweep.png. */
static bool write_outputs(const struct sweep *s, const char *dir, bool charts, GError **err) {
  char *csv = g_build_filename(dir, "sweep.csv", NULL);
  char *png = g_build_filename(dir, "sweep.png", NULL);
  bool ok = write_csv(s, csv, err) && (!charts || write_chart(s, png, err));
  g_free(csv);
  g_free(png);
  return ok;
}

/* The profiles: the file's, or the one --profile names. All load before anything runs. */
static struct profile **load_profiles(struct sweep *s, const struct sweep_run_options *o,
                                      GError **err) {
  if (o->profile) {
    g_strfreev(s->profiles);
    s->profiles = g_new0(char *, 2);
    s->profiles[0] = g_strdup(o->profile);
    s->n_profiles = 1;
  }
  struct profile **profs = g_new0(struct profile *, s->n_profiles + 1);
  for (uint32_t i = 0; i < s->n_profiles; i++) {
    profs[i] = profile_load_file(s->profiles[i], err);
    if (!profs[i]) {
      for (uint32_t k = 0; k < i; k++)
        profile_free(profs[k]);
      g_free(profs);
      return NULL;
    }
  }
  return profs;
}

/* The grid in order: bases, then schedules, then micro-batch counts, then profiles. */
static struct planner_config *grid_configs(const struct sweep *s, uint32_t *n) {
  *n = s->n_bases * s->n_schedules * s->n_mbs * s->n_profiles;
  struct planner_config *c = g_new0(struct planner_config, *n + 1);
  uint32_t k = 0;
  for (uint32_t b = 0; b < s->n_bases; b++)
    for (uint32_t sc = 0; sc < s->n_schedules; sc++)
      for (uint32_t m = 0; m < s->n_mbs; m++)
        for (uint32_t pi = 0; pi < s->n_profiles; pi++, k++) {
          const struct sweep_base *e = &s->base_entries[b];
          c[k].directives = g_strdup(e->file);
          c[k].layout = g_strdup(e->layout);
          c[k].pp_regions = e->pp_regions ? e->pp_regions : s->pp_regions;
          sched_family_parse(s->schedules[sc], &c[k].schedule);
          c[k].ranks = s->ranks;
          c[k].microbatches = s->mbs[m];
          c[k].profile = pi;
          c[k].memory_choice = "";
          c[k].order = k;
        }
  return c;
}

static void fill_point(struct sweep_point *pt, const struct sweep *s, const struct planner_config *c,
                       const struct profile *prof) {
  uint32_t b = c->order / (s->n_schedules * s->n_mbs * s->n_profiles);
  pt->base = g_strdup(s->bases[b]);
  pt->schedule = g_strdup(sched_family_name(c->schedule));
  pt->profile = g_strdup(prof->name);
  pt->microbatches = c->microbatches;
  pt->order = c->order;
  pt->ok = c->status == PLANNER_FEASIBLE || c->status == PLANNER_OVER_CAP;
  pt->feasible = c->status == PLANNER_FEASIBLE;
  pt->error = g_strdup(c->error);
  pt->iteration_time_s = c->iteration_time_s;
  pt->throughput_tokens_per_s = c->throughput_tokens_per_s;
  pt->peak_memory_bytes = c->peak_memory_bytes;
  pt->memory_cap_bytes = c->memory_cap_bytes;
  pt->bubble_fraction = c->bubble.bubble;
  pt->bubble = c->bubble;
}

bool sweep_run_with(struct sweep *s, const char *dir, const struct sweep_run_options *o,
                    GError **err) {
  struct profile **profs = load_profiles(s, o, err);
  if (!profs)
    return false;
  if (g_mkdir_with_parents(dir, 0755) != 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create directory: %s", dir,
                strerror(errno));
    for (uint32_t i = 0; i < s->n_profiles; i++)
      profile_free(profs[i]);
    g_free(profs);
    return false;
  }
  double *caps = g_new0(double, s->n_profiles + 1);
  for (uint32_t i = 0; i < s->n_profiles; i++)
    caps[i] = s->memory_cap_gib > 0 ? s->memory_cap_gib * (double)(1ull << 30)
                                    : (double)profs[i]->memory_capacity;
  uint32_t n = 0;
  struct planner_config *configs = grid_configs(s, &n);
  struct planner_eval ev = {.model_path = s->model, .profiles = profs, .caps = caps,
                            .threads = o->threads, .progress = o->progress,
                            .collapse = o->collapse, .progress_name = "sweep"};
  planner_evaluate(configs, n, &ev);
  s->points = g_new0(struct sweep_point, n + 1);
  s->n_points = n;
  for (uint32_t i = 0; i < n; i++) {
    fill_point(&s->points[i], s, &configs[i], profs[configs[i].profile]);
    planner_config_clear(&configs[i]);
  }
  g_free(configs);
  g_free(caps);
  for (uint32_t i = 0; i < s->n_profiles; i++)
    profile_free(profs[i]);
  g_free(profs);
  qsort(s->points, s->n_points, sizeof *s->points, point_rank_cmp);
  /* nothing simulated: nothing to draw */
  return write_outputs(s, dir, o->charts && s->n_points && s->points[0].ok, err);
}

bool sweep_run(struct sweep *s, const char *dir, bool progress, GError **err) {
  struct sweep_run_options o = {.progress = progress, .charts = true, .collapse = true};
  return sweep_run_with(s, dir, &o, err);
}

static void print_sweep_summary(const char *program, const struct sweep *s, const char *dir,
                                bool charts) {
  uint32_t feasible = 0, failed = 0;
  for (uint32_t i = 0; i < s->n_points; i++) {
    feasible += s->points[i].feasible;
    failed += !s->points[i].ok;
  }
  printf("%s: sweep of %u configurations: %u feasible, %u over the memory cap, %u failed to "
         "compile\n",
         program, s->n_points, feasible, s->n_points - feasible - failed, failed);
  const struct sweep_point *b = s->n_points ? &s->points[0] : NULL;
  if (b && b->feasible)
    printf("  best: %s on %s, %u micro-batches, %s: %.6g tokens/s, %.3f GiB peak\n"
           "        bubble %.1f%% = pipeline idle %.1f%% + exposed comm %.1f%% + imbalance "
           "%.1f%%\n",
           b->schedule, b->base, b->microbatches, b->profile, b->throughput_tokens_per_s,
           b->peak_memory_bytes / (double)(1ull << 30), 100 * b->bubble_fraction,
           100 * b->bubble.pipeline_idle, 100 * b->bubble.exposed_comm, 100 * b->bubble.imbalance);
  else if (b && failed == s->n_points)
    printf("  every configuration failed; the first: %s on %s, %u micro-batches: %s\n",
           b->schedule, b->base, b->microbatches, b->error ? b->error : "?");
  printf("  wrote %s/ (sweep.csv%s)\n", dir, charts ? " sweep.png" : "");
}

int sweep_main(const char *program, const char *path, const char *dir,
               const struct sweep_run_options *o, bool summary) {
  GError *err = NULL;
  struct sweep *s = sweep_load_file(path, &err);
  if (!s)
    return piper_error_exit(program, err);
  struct sweep_run_options opts = *o;
  int rc = 0;
  if (!sweep_run_with(s, dir, &opts, &err)) {
    rc = piper_error_exit(program, err);
  } else {
    uint32_t simulated = 0;
    for (uint32_t i = 0; i < s->n_points; i++)
      simulated += s->points[i].ok;
    if (summary)
      print_sweep_summary(program, s, dir, opts.charts && simulated);
    if (simulated == 0) {
      fprintf(stderr, "%s: error: none of the sweep's %u configurations compiled and simulated "
                      "(sweep.csv has each error)\n", program, s->n_points);
      rc = 1;
    }
  }
  sweep_free(s);
  return rc;
}
