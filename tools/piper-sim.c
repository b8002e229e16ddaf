/* piper-sim: simulate one training step of compiled per-device plans on a hardware profile and
 * write the run directory: the program, results.csv, metrics.json, trace.json, the charts
 * (docs/design.md, "Outputs and exit statuses"). Exit status: 0 success, 1 runtime failure, 2 bad
 * input. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cairo.h>
#include <dlfcn.h>
#include <glib/gstdio.h>

#include "../directives/compile.h"
#include "../base/json.h"
#include "../base/version.h"
#include "../report/chart.h"
#include "../sim/sim.h"
#include "sweep.h"
#include "options.h"

/* What the command line asks for. */
struct sim_cli {
  struct compile_args compile;
  const char *plans, *profile, *sweep, *out, *format, *scenario;
  bool viz, no_charts, trace_all, no_collapse, quiet, no_summary, force, no_sensitivity;
};

/* One row per option, as in redis's config table: kept as rows, not reflowed. */
// clang-format off
#define SIM_OPTION(field) .offset = offsetof(struct sim_cli, field)
static const struct option_spec options[] = {
    {.kind = OPTION_HEADING, .help = "input:"},
    OPTIONS_COMPILE_ARGS(struct sim_cli, compile),
    {.name = "--plans", .kind = OPTION_STRING, SIM_OPTION(plans), .metavar = "DIR",
     .help = "plans written by piper-compile -o DIR instead of a model + program"},
    {.name = "--profile", .kind = OPTION_STRING, SIM_OPTION(profile), .metavar = "FILE",
     .help = "hardware profile (profiles/*.json)"},
    {.name = "--sweep", .kind = OPTION_STRING, SIM_OPTION(sweep), .metavar = "FILE",
     .help = "what-if grid (see the README): sweep.csv, sweep.png"},
    {.name = "--scenario", .kind = OPTION_STRING, SIM_OPTION(scenario), .metavar = "FILE",
     .help = "what-ifs on devices and links (slow GPUs, degraded or failed NICs,\n"
             "jitter; docs/sim.md): the step against the healthy one, the delay's path"},
    {.kind = OPTION_HEADING, .help = "output:"},
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING, SIM_OPTION(out), .metavar = "DIR",
     .help = "run directory (default: a new out/<YYYYmmdd_HHMMSS>[_K])"},
    {.name = "--force", .kind = OPTION_FLAG, SIM_OPTION(force),
     .help = "overwrite another run's files in --out DIR"},
    {.name = "--format", .kind = OPTION_STRING, SIM_OPTION(format), .metavar = "FMT",
     .help = "also draw the schedule as FMT: png, svg or pdf (png and svg always)"},
    {.name = "--viz", .kind = OPTION_FLAG, SIM_OPTION(viz),
     .help = "also write the DAG of each pipeline rank (dag_pp<k>.dot, and .svg\n"
             "when Graphviz is installed)"},
    {.name = "--no-charts", .kind = OPTION_FLAG, SIM_OPTION(no_charts),
     .help = "write no pictures"},
    {.name = "--trace-all", .kind = OPTION_FLAG, SIM_OPTION(trace_all),
     .help = "trace every device even when the trace gets large"},
    {.name = "--no-collapse", .kind = OPTION_FLAG, SIM_OPTION(no_collapse),
     .help = "simulate every device, not one per class of alike devices"},
    {.name = "--no-sensitivity", .kind = OPTION_FLAG, SIM_OPTION(no_sensitivity),
     .help = "skip the 8 extra simulations that say how much the step moves when\n"
             "each cost family (GEMM, attention, collectives, memory) is +-10%"},
    {.name = "--quiet", .kind = OPTION_FLAG, SIM_OPTION(quiet),
     .help = "no progress lines (a sweep's; the summary stays, as in every tool)"},
    {.name = "--no-summary", .kind = OPTION_FLAG, SIM_OPTION(no_summary),
     .help = "print no summary of a sweep"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-sim",
    .usage =
        "usage: piper-sim --model FILE --directives FILE [--schedule NAME --ranks R --mbs M]\n"
        "                 --profile FILE [options]\n"
        "       piper-sim --plans DIR --profile FILE [options]\n"
        "       piper-sim --sweep FILE [--profile FILE] [--out DIR] [--no-charts]\n"
        "\n"
        "Simulates one training step of the per-device plans on a hardware profile and writes\n"
        "out/<YYYYmmdd_HHMMSS>/ (or --out DIR): <schedule>_pp<R>_mbs<M>.json (the program "
        "compiled),\n"
        "results.csv, metrics.json, trace.json (Perfetto), schedule.png, schedule.svg, "
        "memory.png.\n"
        "\n",
    .epilogue = "\nExit status: 0 success, 1 runtime failure, 2 bad input.\n",
    .options = options,
    .help_column = 22,
};

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
  char tp[48] = "";
  uint32_t cp = r->cp > 1 ? r->cp : 1;
  if (r->tp > 1)
    g_snprintf(tp, sizeof tp, " x tp %u", r->tp);
  if (cp > 1)
    g_snprintf(tp + strlen(tp), sizeof tp - strlen(tp), " x cp %u", cp);
  printf("piper-sim: %s, %s, pp %u x dp %u%s (%u devices), %u micro-batches, profile %s\n",
         r->plan->model->name, r->schedule, r->pp, r->dp / cp, tp, r->plan->n_devices,
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
  struct report_bubble_split split = report_bubble_split(r);
  printf("  split          pipeline idle %.1f%% + exposed comm %.1f%% + imbalance %.1f%% (of the "
         "step)\n",
         100 * split.pipeline_idle, 100 * split.exposed_comm, 100 * split.imbalance);
  if (r->n_devices) {
    uint64_t peak = r->devices[peak_dev].peak_memory_bytes;
    printf("  peak memory    %.3f GiB (device %u)%s\n", (double)peak / (double)(1ull << 30),
           peak_dev,
           prof->memory_capacity && peak > prof->memory_capacity ? "  over the profile's capacity"
                                                                 : "");
  }
  printf("  simulated      %llu instructions (%llu distinct) in %.3f s; %llu ops costed %s, "
         "%llu measured\n",
         (unsigned long long)s->device_instructions, (unsigned long long)s->unit_instructions,
         s->seconds_setup + s->seconds_run, (unsigned long long)s->fallback_ops,
         prof->shape_model ? "from shapes" : "by roofline", (unsigned long long)s->measured_ops);
  printf("  wrote          %s/ (%s)\n", dir, files);
}

/* What one simulation holds; session_free releases it. */
struct sim_session {
  struct profile *prof;
  struct plan *plan;
  struct sim_result *res;
  struct report_run run;
  char *program_file;
  cJSON *extra;
  GString *files; /* what was written, for the summary */
  struct sim_scenario *scenario;      /* --scenario */
  struct sim_result *healthy;         /* the step without it */
  struct report_path_step *path;      /* the critical path, for the chart */
  cJSON *scenario_report;             /* inside extra */
  bool sensitive;                     /* sensitivity below was simulated */
  struct sim_sensitivity sensitivity;
};

static void session_free(struct sim_session *s) {
  if (s->files)
    g_string_free(s->files, TRUE);
  cJSON_Delete(s->extra);
  g_free(s->program_file);
  report_run_free_devices(&s->run);
  sim_result_free(s->res);
  sim_result_free(s->healthy);
  sim_scenario_free(s->scenario);
  g_free(s->path);
  plan_free(s->plan);
  profile_free(s->prof);
}

/* Drops cairo's and fontconfig's caches so that leak checkers see only our own allocations;
 * fontconfig comes in through cairo, so its FcFini is looked up rather than linked. */
static void release_cairo_caches(void) {
  cairo_debug_reset_static_data();
  void (*fc_fini)(void) = NULL;
  void *sym = dlsym(RTLD_DEFAULT, "FcFini");
  memcpy(&fc_fini, &sym, sizeof sym); /* POSIX: object and function pointers convert */
  if (fc_fini)
    fc_fini();
}

/* The run directory: --out DIR when it holds no other run (or --force), else a new one. */
static char *claim_run_dir(const struct sim_cli *a, GError **err) {
  if (a->out)
    return report_run_dir_claim(a->out, a->force, err) ? g_strdup(a->out) : NULL;
  return report_run_dir_new("out", err);
}

/* --sweep FILE: every configuration of the grid, then one summary (tools/sweep.h). --profile
 * replaces the file's profiles, --no-charts and --no-collapse apply; the options that describe
 * one run's files are refused rather than ignored. */
static int run_sweep(const struct sim_cli *a, const char *dir) {
  const char *given = a->plans ? "--plans" : options_compile_arg_given(&a->compile);
  if (given)
    return piper_usage_error(program.name,
                             "--sweep takes the model, schedules and micro-batches from its file: "
                             "%s does not apply",
                             given);
  if (a->format || a->viz || a->trace_all)
    return piper_usage_error(program.name, "%s",
                             "--sweep writes sweep.csv and sweep.png: --format, --viz and "
                             "--trace-all do not apply");
  struct sweep_run_options o = {.progress = !a->quiet, .charts = !a->no_charts,
                                .collapse = !a->no_collapse, .profile = a->profile};
  return sweep_main(program.name, a->sweep, dir, &o, !a->no_summary);
}

/* The options that go together; OPTIONS_CONTINUE, or the usage error's exit status. */
static int check_inputs(const struct sim_cli *a, struct compile_options *co) {
  const struct compile_args *ca = &a->compile;
  if (!a->profile)
    return piper_usage_error(program.name, "%s", "--profile FILE is required");
  if (a->plans && options_compile_arg_given(ca))
    return piper_usage_error(program.name, "--plans takes the plans as compiled: %s does not apply",
                             options_compile_arg_given(ca));
  if (!a->plans && (!ca->model || (!ca->directives && !ca->layout)))
    return piper_usage_error(program.name, "%s",
                             "give --model FILE and --directives FILE (or --layout SPEC), or --plans DIR");
  GError *err = NULL;
  if (!compile_args_to_options(ca, co, &err))
    return piper_error_exit(program.name, err);
  return OPTIONS_CONTINUE;
}

/* The profile, and the plan: read from --plans or compiled. */
static bool load_inputs(const struct sim_cli *a, const struct compile_options *co,
                        struct sim_session *s, GError **err) {
  s->prof = profile_load_file(a->profile, err);
  if (!s->prof)
    return false;
  if (a->plans) {
    s->plan = plan_read_dir(a->plans, err);
  } else {
    /* Shared streams are ordered by the compute costs the profile will charge. */
    struct compile_options opts = *co;
    opts.cost_model = s->prof->synthetic ? IR_COST_UNIT : IR_COST_FLOPS;
    g_autoptr(GString) notes = g_string_new(NULL);
    opts.notes = notes;
    s->plan = compile_take_plan(&opts, err);
    options_print_notes(program.name, notes);
  }
  return s->plan != NULL;
}

/* A host profile from one process has the machine's cores but not how ranks that share them
 * wait for each other (piper-prof measures that under mpirun): a plan with several devices
 * on a node is then predicted without those waits, several times too fast. Said once. */
static void warn_unmeasured_waits(const struct sim_cli *a, const struct sim_session *s) {
  const struct profile *p = s->prof;
  uint32_t gpn = p->gpus_per_node ? p->gpus_per_node : 1;
  uint32_t on_node = s->plan->n_devices < gpn ? s->plan->n_devices : gpn;
  if (p->cores_per_node == 0 || !p->host_loop || on_node < 2 || p->wake_latency > 0 ||
      p->wait_core_share > 0)
    return;
  g_printerr("piper-sim: warning: %s: host measured by one process, without how ranks sharing "
             "its cores wait for each other; %u devices per node are predicted too fast "
             "(profile under mpirun -np %u)\n",
             a->profile, on_node, on_node);
}

/* --scenario: metrics.json's "scenario", and the chart's marked rows and critical path. */
static void fill_scenario(struct sim_session *s) {
  s->scenario_report = sim_scenario_report(s->scenario, s->plan, s->healthy, s->res);
  cJSON_AddItemToObject(s->extra, "scenario", s->scenario_report);
  s->run.n_marked = s->scenario->n_marked;
  s->run.marked = s->scenario->marked;
  s->run.marked_notes = (const char *const *)s->scenario->marked_label;
  s->path = g_new(struct report_path_step, s->res->n_path + 1);
  for (uint32_t k = 0; k < s->res->n_path; k++)
    s->path[k] = (struct report_path_step){s->res->path[k].device, s->res->path[k].stream,
                                           s->res->path[k].start, s->res->path[k].end};
  s->run.n_path = s->res->n_path;
  s->run.path = s->path;
}

/* metrics.json's simulation.sensitivity: per family, the step (ms) and its change (%) with that
 * family's costs at 1 - delta and 1 + delta. */
static void add_sensitivity(cJSON *sim, const struct sim_sensitivity *v) {
  cJSON *o = cJSON_AddObjectToObject(sim, "sensitivity");
  cJSON_AddNumberToObject(o, "delta", v->delta);
  for (int f = 0; f < PROFILE_FAMILY_COUNT; f++) {
    cJSON *fam = cJSON_AddObjectToObject(o, profile_family_names[f]);
    cJSON_AddNumberToObject(fam, "minus_ms", v->minus[f] * 1e3);
    cJSON_AddNumberToObject(fam, "plus_ms", v->plus[f] * 1e3);
    cJSON_AddNumberToObject(fam, "minus_pct", 100 * (v->minus[f] / v->step - 1));
    cJSON_AddNumberToObject(fam, "plus_pct", 100 * (v->plus[f] / v->step - 1));
  }
}

/* The summary's line for it: each family's change at +delta and -delta. */
static void print_sensitivity(const struct sim_sensitivity *v) {
  printf("  sensitivity    step when each cost family is +%g%% / -%g%%:", 100 * v->delta,
         100 * v->delta);
  for (int f = 0; f < PROFILE_FAMILY_COUNT; f++)
    printf("%s %s %+.1f%% / %+.1f%%", f ? "," : "", profile_family_names[f],
           100 * (v->plus[f] / v->step - 1), 100 * (v->minus[f] / v->step - 1));
  printf("\n");
}

/* The run directory's description of the simulated step, with the simulation's own figures
 * under "simulation" in metrics.json. */
static void fill_report(const struct sim_cli *a, const struct compile_options *co,
                        struct sim_session *s) {
  const char *schedule = a->compile.schedule;
  struct report_run *run = &s->run;
  run->plan = s->plan;
  run->kind = "sim";
  run->schedule = schedule ? schedule : "custom";
  run->n_iterations = 1;
  run->iteration_times = &s->res->iteration_time;
  run->peak_flops_per_device = s->prof->synthetic ? 0 : s->prof->peak_flops[s->plan->model->dtype];
  run->memory_capacity_bytes = (double)s->prof->memory_capacity;
  run->capacity_source = s->prof->name;
  run->trace_device_limit = a->trace_all ? 0 : 2000000;
  report_run_init_devices(run);
  s->program_file = sched_program_file_name(schedule ? co->schedule.family : SCHED_CUSTOM, run->pp,
                                            s->plan->n_microbatches ? s->plan->n_microbatches : 1);
  run->program_file = s->program_file;
  sim_fill_report(s->res, run);
  report_compute_stats(run);
  s->extra = cJSON_CreateObject();
  cJSON *sim = cJSON_AddObjectToObject(s->extra, "simulation");
  cJSON_AddStringToObject(sim, "profile", s->prof->name);
  cJSON_AddStringToObject(sim, "profile_file", a->profile);
  cJSON_AddNumberToObject(sim, "fallback_ops", (double)s->res->fallback_ops);
  cJSON_AddNumberToObject(sim, "measured_ops", (double)s->res->measured_ops);
  cJSON_AddNumberToObject(sim, "instructions", (double)s->res->device_instructions);
  cJSON_AddNumberToObject(sim, "instructions_simulated", (double)s->res->unit_instructions);
  cJSON_AddNumberToObject(sim, "device_classes_simulated", s->res->n_units);
  cJSON_AddNumberToObject(sim, "events", (double)s->res->events);
  cJSON_AddNumberToObject(sim, "wall_seconds", s->res->seconds_setup + s->res->seconds_run);
  if (s->sensitive)
    add_sensitivity(sim, &s->sensitivity);
  run->extra = s->extra;
  if (s->scenario)
    fill_scenario(s);
}

/* schedule.png and .svg (and .pdf under --format pdf), memory.png when gnuplot is there. */
static bool write_charts(struct sim_session *s, enum chart_format extra_format, const char *dir,
                         GError **err) {
  if (!chart_gnuplot_available())
    fprintf(stderr, "%s: note: gnuplot is not installed: no memory.png\n", program.name);
  return report_write_charts(&s->run, dir, extra_format, s->files, err);
}

/* Simulates the step and writes the run directory: results, charts, the --viz graphs. */
static bool simulate_and_write(const struct sim_cli *a, const struct compile_options *co,
                               enum chart_format extra_format, const char *dir,
                               struct sim_session *s, GError **err) {
  /* timelines of the devices the outputs show, as the trace (--trace-all: every device) */
  struct sim_options o = {.collapse = !a->no_collapse,
                          .memory_timeline_limit = a->trace_all ? 0 : 2000000};
  if (a->scenario) { /* the healthy step first (collapsed: the same times), then the what-if */
    s->scenario = sim_scenario_load(a->scenario, s->plan, err);
    struct sim_options h = {.collapse = true, .no_intervals = true, .no_memory_timeline = true};
    s->healthy = s->scenario ? sim_run(s->plan, s->prof, &h, err) : NULL;
    if (!s->healthy)
      return false;
    o.scenario = s->scenario;
    o.critical_path = true;
  }
  s->res = sim_run(s->plan, s->prof, &o, err);
  if (!s->res)
    return false;
  /* a synthetic profile's costs belong to no family */
  if (!a->no_sensitivity && !s->prof->synthetic) {
    struct sim_options q = {.collapse = !a->no_collapse, .scenario = o.scenario};
    if (!sim_sensitivity_run(s->plan, s->prof, &q, s->res->iteration_time, 0.1, &s->sensitivity,
                             err))
      return false;
    s->sensitive = true;
  }
  fill_report(a, co, s);
  if (!report_write_dir(&s->run, dir, err))
    return false;
  s->files = g_string_new("");
  g_string_append_printf(s->files, "%s results.csv metrics.json trace.json", s->program_file);
  if (!a->no_charts && !write_charts(s, extra_format, dir, err))
    return false;
  if (a->viz) {
    if (!write_viz(&s->run, dir, err))
      return false;
    g_string_append(s->files, " dag_pp*.dot");
  }
  return true;
}

/* One note when a stream that several communicators share (a stream the program named) made
 * the step more than 1% longer than the default streams would: the cost is the difference of
 * the two simulations. Plans read with --plans have no program to compare with. */
static void print_stream_note(const struct sim_cli *a, const struct compile_options *co,
                              const struct sim_session *s) {
  if (a->plans || s->res->serial_stream == IR_NONE)
    return;
  struct compile_options opts = *co;
  opts.cost_model = s->prof->synthetic ? IR_COST_UNIT : IR_COST_FLOPS;
  opts.default_streams = true;
  struct compile_result cr = {0};
  struct sim_options o = {
      .collapse = !a->no_collapse, .no_intervals = true, .no_memory_timeline = true};
  struct sim_result *base =
      compile_run(&opts, &cr, NULL) ? sim_run(cr.plan, s->prof, &o, NULL) : NULL;
  double step = s->res->iteration_time, cost = base ? step - base->iteration_time : 0;
  if (base && cost > 0.01 * step)
    fprintf(stderr,
            "%s: note: stream \"%s\" carries more than one kind of communication: work that "
            "could overlap takes turns on it, which costs an estimated %.6g ms a step (%.1f%%) "
            "against the default streams; give each kind a stream of its own to overlap them\n",
            program.name, s->plan->streams[s->res->serial_stream].name, cost * 1e3,
            100 * cost / step);
  sim_result_free(base);
  compile_result_free(&cr);
}

static int run_simulation(const struct sim_cli *a, enum chart_format extra_format,
                          const char *dir) {
  struct compile_options co;
  int rc = check_inputs(a, &co);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  struct sim_session s = {0};
  GError *err = NULL;
  bool loaded = load_inputs(a, &co, &s, &err);
  if (loaded)
    warn_unmeasured_waits(a, &s);
  if (loaded && simulate_and_write(a, &co, extra_format, dir, &s, &err)) {
    print_summary(&s.run, s.res, s.prof, dir, s.files->str);
    if (s.sensitive)
      print_sensitivity(&s.sensitivity);
    if (s.scenario_report) {
      char *text = sim_scenario_summary(s.scenario_report);
      fputs(text, stdout);
      g_free(text);
    }
    print_stream_note(a, &co, &s);
    rc = 0;
  } else {
    rc = piper_error_exit(program.name, err);
  }
  session_free(&s);
  return rc;
}

int main(int argc, char **argv) {
  struct sim_cli a = {0};
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  enum chart_format extra_format = CHART_PNG;
  if (a.format && !chart_format_parse(a.format, &extra_format))
    return piper_usage_error(program.name, "--format: \"%s\" is not png, svg or pdf", a.format);
  if (a.sweep && a.scenario)
    return piper_usage_error(program.name, "--scenario: not with --sweep (one plan at a time)");
  if (a.no_summary && !a.sweep)
    return piper_usage_error(program.name, "--no-summary applies to --sweep only");
  GError *err = NULL;
  bool created = !a.out || !g_file_test(a.out, G_FILE_TEST_EXISTS);
  char *dir = claim_run_dir(&a, &err);
  if (!dir)
    return piper_error_exit(program.name, err);
  rc = a.sweep ? run_sweep(&a, dir) : run_simulation(&a, extra_format, dir);
  if (rc != 0 && created)
    g_rmdir(dir); /* a failed run leaves no empty directory behind (only an empty one goes) */
  g_free(dir);
  release_cairo_caches();
  return rc;
}
