/* sweep: the what-if grid of piper-sim --sweep. */
#include "sweep.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "../directives/compile.h"
#include "../report/chart.h"
#include "../sim/sim.h"


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

struct sweep *sweep_load_file(const char *path, GError **err) {
  cJSON *root = json_parse_file(path, err);
  if (root && !json_refuse_duplicate_keys(root, path, err)) {
    cJSON_Delete(root);
    return NULL;
  }
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
  if (!string_list(root, "base_schedules", &s->bases, &s->n_bases, path, err) ||
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
  ok = true;
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
  if (x->throughput_tokens_per_s != y->throughput_tokens_per_s)
    return x->throughput_tokens_per_s > y->throughput_tokens_per_s ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static void csv_field(FILE *f, const char *s) {
  bool quote = strpbrk(s, ",\"\n") != NULL;
  if (!quote) {
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

static bool write_csv(const struct sweep *s, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  fprintf(f, "rank,status,schedule,base,microbatches,profile,iteration_time_s,"
             "throughput_tokens_per_s,peak_memory_gb,memory_cap_gb,bubble_fraction,error\n");
  for (uint32_t i = 0; i < s->n_points; i++) {
    const struct sweep_point *p = &s->points[i];
    fprintf(f, "%u,%s,", i + 1, p->feasible ? "ok" : p->ok ? "over_memory_cap" : "error");
    csv_field(f, p->schedule);
    fputc(',', f);
    csv_field(f, p->base);
    fprintf(f, ",%u,", p->microbatches);
    csv_field(f, p->profile);
    if (p->ok)
      fprintf(f, ",%.9g,%.9g,%.6f,%.6f,%.6f,", p->iteration_time_s, p->throughput_tokens_per_s,
              p->peak_memory_bytes / (double)(1ull << 30),
              p->memory_cap_bytes / (double)(1ull << 30), p->bubble_fraction);
    else
      fputs(",,,,,,", f);
    csv_field(f, p->error ? p->error : "");
    fputc('\n', f);
  }
  return piper_out_close(&out, err);
}

/* sweep.png: every simulated point (chart_points), labelled schedule/base/micro-batches, best
 * first. */
static bool write_chart(const struct sweep *s, const char *path, GError **err) {
  struct chart_point *pts = g_new0(struct chart_point, s->n_points + 1);
  char **labels = g_new0(char *, s->n_points + 1);
  for (uint32_t i = 0; i < s->n_points; i++) {
    const struct sweep_point *p = &s->points[i];
    g_autofree char *base = g_path_get_basename(p->base);
    char *dot = strrchr(base, '.');
    if (dot)
      *dot = 0;
    labels[i] = g_strdup_printf("%s/%s/%u", p->schedule, base, p->microbatches);
    pts[i] = (struct chart_point){.label = labels[i],
                                  .schedule = p->schedule,
                                  .profile = p->profile,
                                  .ok = p->ok,
                                  .feasible = p->feasible,
                                  .peak_memory_bytes = p->peak_memory_bytes,
                                  .throughput_tokens_per_s = p->throughput_tokens_per_s,
                                  .memory_cap_bytes = p->memory_cap_bytes};
  }
  g_autofree char *mname = g_path_get_basename(s->model);
  g_autofree char *title = g_strdup_printf(
      "What-if sweep: %s, %u configurations (labels: schedule/base/micro-batches)", mname,
      s->n_points);
  bool ok = chart_points(title, pts, s->n_points, path, err);
  g_strfreev(labels);
  g_free(pts);
  return ok;
}

/* dir/sweep.csv and sweep.png. */
static bool write_outputs(const struct sweep *s, const char *dir, GError **err) {
  char *csv = g_build_filename(dir, "sweep.csv", NULL);
  char *png = g_build_filename(dir, "sweep.png", NULL);
  bool ok = write_csv(s, csv, err) && write_chart(s, png, err);
  g_free(csv);
  g_free(png);
  return ok;
}

bool sweep_run(struct sweep *s, const char *dir, bool progress, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create directory: %s", dir,
                strerror(errno));
    return false;
  }
  struct profile **profs = g_new0(struct profile *, s->n_profiles + 1);
  bool ok = true;
  for (uint32_t i = 0; i < s->n_profiles && ok; i++) {
    profs[i] = profile_load_file(s->profiles[i], err);
    if (!profs[i])
      ok = false;
  }
  uint32_t total = s->n_bases * s->n_schedules * s->n_mbs * s->n_profiles;
  s->points = g_new0(struct sweep_point, total + 1);
  s->n_points = 0;
  uint32_t k = 0;
  for (uint32_t b = 0; b < s->n_bases && ok; b++)
    for (uint32_t sc = 0; sc < s->n_schedules; sc++)
      for (uint32_t m = 0; m < s->n_mbs; m++) {
        struct sched_options so = {.ranks = s->ranks, .mbs = s->mbs[m]};
        sched_family_parse(s->schedules[sc], &so.family);
        GError *e = NULL;
        /* one compile serves every profile */
        struct plan *plan = compile_plan(s->model, s->bases[b], &so, s->pp_regions, &e);
        for (uint32_t pi = 0; pi < s->n_profiles; pi++, k++) {
          struct sweep_point *pt = &s->points[s->n_points++];
          pt->base = g_strdup(s->bases[b]);
          pt->schedule = g_strdup(s->schedules[sc]);
          pt->profile = g_strdup(profs[pi]->name);
          pt->microbatches = s->mbs[m];
          pt->order = s->n_points - 1;
          if (progress) {
            fprintf(stderr, "\r\033[K[%u/%u] %s %s mbs %u %s", k + 1, total, s->schedules[sc],
                    s->bases[b], s->mbs[m], profs[pi]->name);
            fflush(stderr);
          }
          if (!plan) {
            pt->error = g_strdup(e ? e->message : "compile failed");
            continue;
          }
          struct sim_options o = {.collapse = true, .no_memory_timeline = true};
          GError *se = NULL;
          struct sim_result *r = sim_run(plan, profs[pi], &o, &se);
          if (!r) {
            pt->error = g_strdup(se->message);
            g_error_free(se);
            continue;
          }
          struct report_run run = {.plan = plan,
                                   .kind = "sim",
                                   .n_iterations = 1,
                                   .iteration_times = &r->iteration_time};
          report_run_init_devices(&run);
          sim_fill_report(r, &run);
          report_compute_stats(&run);
          pt->ok = true;
          pt->iteration_time_s = r->iteration_time;
          pt->throughput_tokens_per_s =
              r->iteration_time > 0 ? report_tokens_per_iteration(&run) / r->iteration_time : 0;
          double peak = 0, bubble = 0;
          for (uint32_t d = 0; d < run.n_devices; d++) {
            if ((double)run.devices[d].peak_memory_bytes > peak)
              peak = (double)run.devices[d].peak_memory_bytes;
            bubble += run.devices[d].bubble_fraction;
          }
          pt->peak_memory_bytes = peak;
          pt->bubble_fraction = run.n_devices ? bubble / run.n_devices : 0;
          pt->memory_cap_bytes = s->memory_cap_gib > 0 ? s->memory_cap_gib * (double)(1ull << 30)
                                                       : (double)profs[pi]->memory_capacity;
          pt->feasible = pt->memory_cap_bytes <= 0 || peak <= pt->memory_cap_bytes;
          report_run_free_devices(&run);
          sim_result_free(r);
        }
        if (e)
          g_error_free(e);
        plan_free(plan);
      }
  if (progress && ok)
    fprintf(stderr, "\r\033[K[%u/%u] done\n", total, total);
  for (uint32_t i = 0; i < s->n_profiles; i++)
    profile_free(profs[i]);
  g_free(profs);
  if (!ok)
    return false;
  qsort(s->points, s->n_points, sizeof *s->points, point_rank_cmp);
  return write_outputs(s, dir, err);
}
