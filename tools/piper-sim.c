/* piper-sim: simulate one training step of compiled per-device plans on a hardware profile and
 * write the run directory of SPEC §8 (program, results.csv, metrics.json, trace.json, charts).
 * Exit status: 0 success, 1 runtime failure, 2 bad input. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cairo.h>
#include <dlfcn.h>

#include "../directives/compile.h"
#include "../base/json.h"
#include "../base/version.h"
#include "../report/chart.h"
#include "../sim/sim.h"
#include "sweep.h"

static const char usage[] =
    "usage: piper-sim --model FILE --directives FILE [--schedule NAME --ranks R --mbs M]\n"
    "                 --profile FILE [options]\n"
    "       piper-sim --plans DIR --profile FILE [options]\n"
    "       piper-sim --sweep FILE [--out DIR]\n"
    "\n"
    "Simulates one training step of the per-device plans on a hardware profile and writes\n"
    "out/<YYYYmmdd_HHMMSS>/ (or --out DIR): <schedule>_pp<R>_mbs<M>.json (the program compiled),\n"
    "results.csv, metrics.json, trace.json (Perfetto), schedule.png, schedule.svg, memory.png.\n"
    "\n"
    "input:\n"
    "  --model FILE        annotated model (models/*.json)\n"
    "  --directives FILE   directive program (a base schedule with --schedule); alias "
    "--base-schedule\n"
    "  --schedule NAME     gpipe, 1f1b, interleaved_1f1b, zerobubble, zbv, dualpipe, dualpipev,\n"
    "                      custom: build the order directives for R ranks and M micro-batches\n"
    "  --ranks R           pipeline ranks (default: from the base schedule's placement)\n"
    "  --mbs M             micro-batches (default: the program's split)\n"
    "  --keep-order        keep the base program's order directives\n"
    "  --pp-regions N      split the model into N equal PP regions\n"
    "  --plans DIR         plans written by piper-compile -o DIR instead of a model + program\n"
    "  --profile FILE      hardware profile (profiles/*.json)\n"
    "  --sweep FILE        what-if grid (see the README): sweep.csv, sweep.png\n"
    "output:\n"
    "  --out DIR           run directory (default out/<YYYYmmdd_HHMMSS>)\n"
    "  --format FMT        also draw the schedule as FMT: png, svg or pdf (png and svg always)\n"
    "  --viz               also write the DAG of each pipeline rank (dag_pp<k>.dot, and .svg\n"
    "                      when Graphviz is installed)\n"
    "  --no-charts         write no pictures\n"
    "  --trace-all         trace every device even when the trace gets large\n"
    "  --no-collapse       simulate every device, not one per class of alike devices\n"
    "  --quiet             print no summary\n"
    "  --help, --version\n";

/* --viz: each pipeline rank's program as a DOT graph (stream order and cross-stream waits). */
static bool write_viz(const struct report_run *r, const char *dir, GError **err) {
  const struct plan *p = r->plan;
  for (uint32_t k = 0; k < r->pp; k++) {
    uint32_t dev = UINT32_MAX;
    for (uint32_t i = 0; i < r->n_devices; i++)
      if (r->devices[i].pp_rank == (int32_t)k && r->devices[i].dp_rank == 0)
        dev = i;
    if (dev == UINT32_MAX)
      continue;
    const struct plan_class *c = plan_device_class(p, r->devices[dev].device);
    char name[64];
    snprintf(name, sizeof name, "dag_pp%u.dot", k);
    char *path = g_build_filename(dir, name, NULL);
    FILE *f = fopen(path, "w");
    if (!f) {
      g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s", path,
                  strerror(errno));
      g_free(path);
      return false;
    }
    fprintf(f, "digraph pp%u {\n  rankdir=LR; node [shape=box, style=filled, fontsize=10];\n", k);
    for (uint32_t s = 0; s < p->n_streams; s++) {
      if (c->stream_first[s + 1] == c->stream_first[s])
        continue;
      fprintf(f, "  subgraph cluster_%u { label=\"%s\";\n", s, p->streams[s].name);
      for (uint32_t j = c->stream_first[s]; j < c->stream_first[s + 1]; j++) {
        uint32_t i = c->stream_instrs[j];
        const struct ir_node *n = &p->nodes[c->instrs[i].node];
        char nb[256];
        plan_node_name(p, c->instrs[i].node, nb, sizeof nb);
        const char *col = n->kind != IR_NODE_COMPUTE ? "#d9c8ef"
                          : n->pass == IR_PASS_F     ? "#a9c4e0"
                          : n->pass == IR_PASS_BW    ? "#f9c89b"
                                                     : "#b6dcae";
        fprintf(f, "    i%u [label=\"%s\", fillcolor=\"%s\"];\n", i, nb, col);
        if (j > c->stream_first[s])
          fprintf(f, "    i%u -> i%u;\n", c->stream_instrs[j - 1], i);
      }
      fputs("  }\n", f);
    }
    for (uint32_t i = 0; i < c->n_instrs; i++)
      for (uint32_t w = 0; w < c->instrs[i].wait_count; w++)
        fprintf(f, "  i%u -> i%u [style=dashed, color=\"#888888\"];\n",
                c->waits[c->instrs[i].wait_first + w], i);
    fputs("}\n", f);
    fclose(f);
    /* Render with Graphviz when it is installed (tools/install-deps.sh installs it); the .dot
     * file stays either way. */
    char *dot = g_find_program_in_path("dot");
    if (dot) {
      char *svg = g_strdup_printf("%.*s.svg", (int)strlen(path) - 4, path);
      char *argv[] = {dot, "-Tsvg", path, "-o", svg, NULL};
      gint status = 0;
      GError *spawn_err = NULL;
      if (!g_spawn_sync(NULL, argv, NULL, G_SPAWN_STDOUT_TO_DEV_NULL | G_SPAWN_STDERR_TO_DEV_NULL,
                        NULL, NULL, NULL, NULL, &status, &spawn_err) ||
          !g_spawn_check_wait_status(status, NULL)) {
        g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: Graphviz could not render it",
                    path);
        if (spawn_err)
          g_error_free(spawn_err);
        g_free(svg);
        g_free(dot);
        g_free(path);
        return false;
      }
      g_free(svg);
      g_free(dot);
    }
    g_free(path);
  }
  return true;
}

static void print_summary(const struct report_run *r, const struct sim_result *s,
                          const struct profile *prof, const char *dir, const char *files) {
  double iter = s->iteration_time;
  double tokens = report_tokens_per_iteration(r);
  double bubble = 0, exposed = 0;
  uint32_t peak_dev = 0;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    bubble += r->devices[i].bubble_fraction;
    exposed += r->devices[i].exposed_comm_s;
    if (r->devices[i].peak_memory_bytes > r->devices[peak_dev].peak_memory_bytes)
      peak_dev = i;
  }
  uint32_t n = r->n_devices ? r->n_devices : 1;
  printf("piper-sim: %s, %s, pp %u x dp %u (%u devices), %u micro-batches, profile %s\n",
         r->plan->model->name, r->schedule, r->pp, r->dp, r->plan->n_devices,
         r->plan->n_microbatches, prof->name);
  printf("  iteration      %.6g ms\n", iter * 1e3);
  printf("  throughput     %.6g tokens/s", iter > 0 ? tokens / iter : 0);
  if (r->peak_flops_per_device > 0 && iter > 0)
    printf("   MFU %.1f%%\n", 100 * (double)r->dp * r->plan->n_microbatches *
                                  model_flops_per_microbatch(r->plan->model) / iter /
                                  (r->plan->n_devices * r->peak_flops_per_device));
  else
    printf("   MFU n/a (synthetic profile)\n");
  printf("  bubble         %.1f%% (mean over devices)   exposed comm %.6g ms (mean)\n",
         100 * bubble / n, exposed / n * 1e3);
  if (r->n_devices) {
    uint64_t peak = r->devices[peak_dev].peak_memory_bytes;
    printf("  peak memory    %.3f GiB (device %u)%s\n", (double)peak / (double)(1ull << 30),
           peak_dev,
           prof->memory_capacity && peak > prof->memory_capacity ? "  over the profile's capacity"
                                                                 : "");
  }
  printf("  simulated      %llu instructions (%llu distinct) in %.3f s; %llu ops costed by "
         "roofline, %llu measured\n",
         (unsigned long long)s->device_instructions, (unsigned long long)s->unit_instructions,
         s->seconds_setup + s->seconds_run, (unsigned long long)s->fallback_ops,
         (unsigned long long)s->measured_ops);
  printf("  wrote          %s/ (%s)\n", dir, files);
}

int main(int argc, char **argv) {
  struct compile_args ca = {0};
  const char *plans = NULL, *profile = NULL;
  const char *out = NULL, *sweep = NULL, *format = NULL;
  bool viz = false, no_charts = false, trace_all = false, collapse = true;
  bool quiet = false;
  GError *err = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char **target = NULL;
    int shared = compile_args_parse(&ca, argc, argv, &i, &err);
    if (shared < 0)
      return piper_error_exit("piper-sim", err);
    if (shared)
      continue;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("piper-sim %s\n", PIPER_VERSION);
      return 0;
    } else if (strcmp(a, "--plans") == 0)
      target = &plans;
    else if (strcmp(a, "--profile") == 0)
      target = &profile;
    else if (strcmp(a, "--out") == 0)
      target = &out;
    else if (strcmp(a, "--sweep") == 0)
      target = &sweep;
    else if (strcmp(a, "--format") == 0)
      target = &format;
    else if (strcmp(a, "--viz") == 0)
      viz = true;
    else if (strcmp(a, "--no-charts") == 0)
      no_charts = true;
    else if (strcmp(a, "--trace-all") == 0)
      trace_all = true;
    else if (strcmp(a, "--no-collapse") == 0)
      collapse = false;
    else if (strcmp(a, "--quiet") == 0)
      quiet = true;
    else
      return piper_usage_error("piper-sim", "unknown option %s", a);
    if (target) {
      if (i + 1 >= argc)
        return piper_usage_error("piper-sim", "%s needs a value", a);
      *target = argv[++i];
    }
  }
  enum chart_format extra_format = CHART_PNG;
  if (format && !chart_format_parse(format, &extra_format))
    return piper_usage_error("piper-sim", "--format: \"%s\" is not png, svg or pdf", format);

  char stamp[32];
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(stamp, sizeof stamp, "out/%Y%m%d_%H%M%S", &tmv);
  const char *dir = out ? out : stamp;

  if (sweep) {
    if (ca.model || ca.directives || plans || ca.schedule)
      return piper_usage_error("piper-sim", "%s",
                               "--sweep takes the model, schedules and profiles from its file");
    struct sweep *s = sweep_load_file(sweep, &err);
    if (!s)
      return piper_error_exit("piper-sim", err);
    bool ok = sweep_run(s, dir, isatty(STDERR_FILENO), &err);
    if (ok && !quiet) {
      uint32_t feasible = 0, failed = 0;
      for (uint32_t i = 0; i < s->n_points; i++) {
        feasible += s->points[i].feasible;
        failed += !s->points[i].ok;
      }
      printf("piper-sim: sweep of %u configurations: %u feasible, %u over the memory cap, %u "
             "failed to compile\n",
             s->n_points, feasible, s->n_points - feasible - failed, failed);
      if (s->n_points && s->points[0].feasible)
        printf("  best: %s on %s, %u micro-batches, %s: %.6g tokens/s, %.3f GiB peak\n",
               s->points[0].schedule, s->points[0].base, s->points[0].microbatches,
               s->points[0].profile, s->points[0].throughput_tokens_per_s,
               s->points[0].peak_memory_bytes / (double)(1ull << 30));
      printf("  wrote %s/ (sweep.csv sweep.png)\n", dir);
    }
    sweep_free(s);
    return ok ? 0 : piper_error_exit("piper-sim", err);
  }

  if (!profile)
    return piper_usage_error("piper-sim", "%s", "--profile FILE is required");
  if (plans && (ca.model || ca.directives || ca.schedule))
    return piper_usage_error("piper-sim", "%s",
                             "--plans replaces --model, --directives and --schedule");
  if (!plans && (!ca.model || !ca.directives))
    return piper_usage_error("piper-sim", "%s",
                             "give --model FILE and --directives FILE, or --plans DIR");
  struct compile_options co;
  if (!compile_args_to_options(&ca, &co, &err))
    return piper_error_exit("piper-sim", err);
  if (!ca.schedule && (ca.ranks || ca.mbs))
    return piper_usage_error("piper-sim", "%s", "--ranks and --mbs need --schedule");
  const struct sched_options so = co.schedule;
  const char *schedule = ca.schedule;

  struct profile *prof = profile_load_file(profile, &err);
  if (!prof)
    return piper_error_exit("piper-sim", err);
  struct plan *plan = NULL;
  if (plans) {
    plan = plan_read_dir(plans, &err);
  } else {
    struct compile_result cr = {0};
    if (compile_run(&co, &cr, &err)) {
      plan = cr.plan;
      cr.plan = NULL; /* the plan is ours; the rest of the front end's result goes */
    }
    compile_result_free(&cr);
  }
  if (!plan) {
    profile_free(prof);
    return piper_error_exit("piper-sim", err);
  }
  struct sim_options o = {.collapse = collapse};
  struct sim_result *res = sim_run(plan, prof, &o, &err);
  int rc = 0;
  struct report_run run = {0};
  char *program_file = NULL;
  cJSON *extra = NULL;
  if (!res) {
    rc = piper_error_exit("piper-sim", err);
    goto out;
  }
  run.plan = plan;
  run.kind = "sim";
  run.schedule = schedule ? schedule : "custom";
  run.n_iterations = 1;
  run.iteration_times = &res->iteration_time;
  run.peak_flops_per_device = prof->synthetic ? 0 : prof->peak_flops[plan->model->dtype];
  run.trace_device_limit = trace_all ? 0 : 2000000;
  report_run_init_devices(&run);
  program_file = sched_program_file_name(schedule ? so.family : SCHED_CUSTOM, run.pp,
                                         plan->n_microbatches ? plan->n_microbatches : 1);
  run.program_file = program_file;
  sim_fill_report(res, &run);
  report_compute_stats(&run);
  extra = cJSON_CreateObject();
  cJSON *sim = cJSON_AddObjectToObject(extra, "simulation");
  cJSON_AddStringToObject(sim, "profile", prof->name);
  cJSON_AddStringToObject(sim, "profile_file", profile);
  cJSON_AddNumberToObject(sim, "fallback_ops", (double)res->fallback_ops);
  cJSON_AddNumberToObject(sim, "measured_ops", (double)res->measured_ops);
  cJSON_AddNumberToObject(sim, "instructions", (double)res->device_instructions);
  cJSON_AddNumberToObject(sim, "instructions_simulated", (double)res->unit_instructions);
  cJSON_AddNumberToObject(sim, "device_classes_simulated", res->n_units);
  cJSON_AddNumberToObject(sim, "events", (double)res->events);
  cJSON_AddNumberToObject(sim, "wall_seconds", res->seconds_setup + res->seconds_run);
  run.extra = extra;
  if (!report_write_dir(&run, dir, &err)) {
    rc = piper_error_exit("piper-sim", err);
    goto out;
  }
  GString *files = g_string_new("");
  g_string_append_printf(files, "%s results.csv metrics.json trace.json", program_file);
  if (!no_charts) {
    if (!chart_gnuplot_available())
      fprintf(stderr, "piper-sim: note: gnuplot is not installed: no memory.png\n");
    if (!report_write_charts(&run, dir, format ? extra_format : CHART_PNG, files, &err)) {
      g_string_free(files, TRUE);
      rc = piper_error_exit("piper-sim", err);
      goto out;
    }
  }
  if (viz) {
    if (!write_viz(&run, dir, &err)) {
      g_string_free(files, TRUE);
      rc = piper_error_exit("piper-sim", err);
      goto out;
    }
    g_string_append(files, " dag_pp*.dot");
  }
  if (!quiet)
    print_summary(&run, res, prof, dir, files->str);
  g_string_free(files, TRUE);
out:
  cJSON_Delete(extra);
  g_free(program_file);
  report_run_free_devices(&run);
  sim_result_free(res);
  plan_free(plan);
  profile_free(prof);
  /* drop cairo's and fontconfig's caches so that leak checkers see only our own allocations;
   * fontconfig comes in through cairo, so its FcFini is looked up rather than linked */
  cairo_debug_reset_static_data();
  void (*fc_fini)(void) = NULL;
  void *sym = dlsym(RTLD_DEFAULT, "FcFini");
  memcpy(&fc_fini, &sym, sizeof sym); /* POSIX: object and function pointers convert */
  if (fc_fini)
    fc_fini();
  return rc;
}
