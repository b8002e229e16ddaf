/* Scale benchmark (issue 15): compile, simulate and write the outputs of data-parallel layouts
 * from 2,048 to 131,072 devices, one phase at a time, and fit each phase's growth exponent in
 * the device count (the slope of log seconds over log devices), so a cost that grows faster
 * than the devices shows as a number above 1. Each configuration runs in its own process so
 * its peak RSS is its own.
 *
 *   dense:  Llama-3-70B, pp=16,dp=G, 1F1B, 64 micro-batches, G = 128 ... 1,024 (8,192 with
 *           --big: 131,072 devices)
 *   moe-ep: DeepSeek-V3, pp=16,dp=G,ep=G,v (32 PP regions), dualpipev, 32 micro-batches,
 *           G = 32 ... 256 (512 ... 4,096 devices: 256 experts)
 *   moe-dp: the same with experts replicated over the group, G = 128 ... 1,024 (8,192 with
 *           --big: 131,072 devices)
 *
 * Phases: apply (directives onto the IR), lower (plans, with the progress check), check (the
 * progress check again, alone), write (piper-compile -o), sim (collapsed; --no-collapse too
 * with --no-collapse), outputs (stats, results, metrics, trace, charts).
 *
 * The plan directory is written at every size: past 2,048 devices it holds one file per class
 * (plan-impl.h), so writing it costs what plan.json's device lists cost. A phase not run shows
 * 0 and is left out of its exponent.
 *
 * --engine measures the simulator alone with every device simulated (sim_options.collapse
 * false), dense family from 4,096 to 65,536 devices (--big: 131,072): CPU seconds of sim_run,
 * simulated instructions a second, the bytes per device it adds to the peak RSS, the growth
 * exponent over those sizes and, per size, the time per instruction over that at a quarter of
 * the devices. --check R exits 1 when such a ratio exceeds R (a loose test of linear growth
 * that a noisy machine passes; tests/cli/test_sim.sh runs it from 4,096 to 16,384 devices with
 * --no-timelines: below piper-sim's trace limit (2 million instructions) every device keeps a
 * memory timeline, above it none does, and that step, or a working set still in the caches
 * (below 4,096 devices), says nothing about growth). BENCH_SPLIT=1
 * also prints sim_run's own setup and event-loop wall seconds for each size on stderr.
 *
 * Run from the repository root: build/bench/bench_scale [--big] [--no-collapse] [--no-charts]
 * [--only dense|moe-ep|moe-dp] [--repeat N] [--engine [--min-dp G] [--max-dp G] [--check R]] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "../../directives/compile.h"
#include "../../directives/layout.h"
#include "../../report/chart.h"
#include "../../sim/sim.h"

enum phase { PH_APPLY, PH_LOWER, PH_CHECK, PH_WRITE, PH_SIM, PH_NOCOLLAPSE, PH_OUTPUTS, PH_COUNT };
static const char *const phase_names[PH_COUNT] = {"apply", "lower",       "check",  "write",
                                                  "sim",   "no-collapse", "outputs"};

struct family {
  const char *name, *model, *layout_fmt;
  int pp_regions;
  enum sched_family schedule;
  uint32_t mbs;
  uint32_t min_dp, max_dp, max_dp_big; /* group sizes run: powers of two, --big to the last */
};

/* DeepSeek-V3 has 256 routed experts, and the compiler shards them over a whole replicate
 * group only, so expert parallelism stops at groups of 256 (4,096 devices); beyond that the
 * experts are replicated over the group (moe-dp) to reach 131,072 devices. */
static const struct family families[] = {
    {"dense", "models/llama3-70b.json", "pp=16,dp=%u", 16, SCHED_1F1B, 64, 128, 1024, 8192},
    {"moe-ep", "models/deepseek-v3.json", "pp=16,dp=%u,ep=%u,v", 32, SCHED_DUALPIPEV, 32, 32,
     256, 256},
    {"moe-dp", "models/deepseek-v3.json", "pp=16,dp=%u,v", 32, SCHED_DUALPIPEV, 32, 128, 1024,
     8192},
};

struct options {
  bool big, no_collapse, charts, engine, no_timelines;
  const char *only;
  uint32_t repeat, min_dp, max_dp;
  double check;
};

/* What one run reports back through its pipe. */
struct sample {
  uint32_t devices;
  uint64_t instructions;
  double seconds[PH_COUNT];
  double rss_mib;
  double sim_rss_mib; /* --engine: what the simulation added to the peak RSS */
};

/* The layout's directive program. DeepSeek-V3's stage 0 holds only dense layers (its first
 * three), so it has no expert region to shard: its shard line goes. */
static char *layout_text(const struct layout *l, bool moe) {
  char *text = layout_to_json(l);
  if (!moe)
    return text;
  char *line = strstr(text, "{\"op\": \"shard\", \"filter\": {\"PP\": 0, ");
  char *end = line ? strstr(line, "}, ") : NULL;
  end = end ? strstr(end + 3, "\n") : NULL;
  if (line && end)
    memmove(line - 2 * (line[-2] == ' '), end + 1, strlen(end + 1) + 1);
  return text;
}

static char *write_layout(const struct family *f, uint32_t dp, GError **err) {
  char spec[64];
  g_snprintf(spec, sizeof spec, f->layout_fmt, dp, dp);
  struct layout l;
  if (!layout_parse(spec, &l, err))
    return NULL;
  char *path = g_strdup_printf("%s/piper-bench-scale-%d-%s-%u.json", g_get_tmp_dir(), (int)getpid(),
                               f->name, dp);
  char *text = layout_text(&l, l.ep > 1);
  bool ok = g_file_set_contents(path, text, -1, err);
  g_free(text);
  if (!ok)
    g_clear_pointer(&path, g_free);
  return path;
}

/* Seconds of CPU this process used (user + system): on a shared machine wall clock mostly
 * measures the neighbours, and every phase here runs on one thread. */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double since(double *t) {
  double now = cpu_seconds(), d = now - *t;
  *t = now;
  return d;
}

/* Stats, run directory and charts of a simulated plan, as piper-sim writes them, tracing one
 * device per pp rank at every size (piper-sim traces every device while the trace stays under
 * 2,000,000 events, which would make small sizes cost more than large ones here). */
static bool write_outputs(const struct plan *plan, const struct sim_result *res, const char *dir,
                          bool charts, GError **err) {
  struct report_run run = {.plan = plan,
                           .kind = "sim",
                           .schedule = "bench",
                           .program_file = "program.json",
                           .n_iterations = 1,
                           .iteration_times = &res->iteration_time,
                           .trace_device_limit = 1};
  report_run_init_devices(&run);
  sim_fill_report(res, &run);
  report_compute_stats(&run);
  bool ok = report_write_dir(&run, dir, err);
  if (ok && charts) {
    GString *files = g_string_new(NULL);
    ok = report_write_charts(&run, dir, CHART_PNG, files, err);
    g_string_free(files, TRUE);
  }
  report_run_free_devices(&run);
  return ok;
}

static bool simulate(const struct plan *plan, const struct profile *prof, bool collapse,
                     bool no_timelines, struct sim_result **out, GError **err) {
  struct sim_options o = {.collapse = collapse,
                          .memory_timeline_limit = 2000000, /* piper-sim's */
                          .no_memory_timeline = no_timelines};
  *out = sim_run(plan, prof, &o, err);
  return *out != NULL;
}

static double peak_rss_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

/* --engine: the simulation of every device alone, its CPU seconds and what it adds to the
 * peak RSS (the compile's peak is below the simulation's at these sizes). */
static bool engine_phase(struct compile_result *r, const struct options *opt, struct sample *s,
                         GError **err) {
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", err);
  struct sim_result *res = NULL;
  bool ok = prof != NULL;
  if (ok) {
    double before = peak_rss_mib(), t = cpu_seconds();
    ok = simulate(r->plan, prof, false, opt->no_timelines, &res, err);
    s->seconds[PH_NOCOLLAPSE] = cpu_seconds() - t;
    s->sim_rss_mib = peak_rss_mib() - before;
    if (res && getenv("BENCH_SPLIT"))
      fprintf(stderr, "setup %.3f run %.3f (wall)\n", res->seconds_setup, res->seconds_run);
  }
  sim_result_free(res);
  profile_free(prof);
  compile_result_free(r);
  return ok;
}

/* Compiles, checks, writes and simulates one configuration; fills s. */
static bool run_phases(const struct family *f, const char *program_path, const char *dir,
                       const struct options *opt, struct sample *s, GError **err) {
  struct compile_options co = compile_options_default();
  co.model_path = f->model;
  co.directives_path = program_path;
  co.pp_regions = f->pp_regions;
  co.have_schedule = true;
  co.schedule.family = f->schedule;
  co.schedule.mbs = f->mbs;
  co.lower = false;
  struct compile_result r;
  double t = cpu_seconds();
  if (!compile_run(&co, &r, err)) /* load, schedule, IR, apply */
    return false;
  s->seconds[PH_APPLY] = since(&t);
  cJSON *pj = dir_program_to_json(r.program);
  char *text = cJSON_PrintUnformatted(pj);
  cJSON_Delete(pj);
  r.plan = plan_lower(r.graph, text, err);
  cJSON_free(text);
  struct profile *prof = NULL;
  struct sim_result *res = NULL;
  bool ok = r.plan != NULL;
  if (ok) {
    s->seconds[PH_LOWER] = since(&t);
    s->devices = r.plan->n_devices;
    s->instructions = plan_instruction_count(r.plan);
    ok = plan_check_progress(r.plan, err);
    s->seconds[PH_CHECK] = since(&t);
  }
  if (ok && opt->engine)
    return engine_phase(&r, opt, s, err);
  char *plan_dir = g_build_filename(dir, "plan", NULL);
  if (ok) {
    t = cpu_seconds();
    ok = plan_write_dir(r.plan, plan_dir, err);
    s->seconds[PH_WRITE] = since(&t);
  }
  if (ok)
    prof = profile_load_file("profiles/h100-sxm.json", err);
  ok = ok && prof;
  if (ok && opt->no_collapse) {
    t = cpu_seconds();
    ok = simulate(r.plan, prof, false, false, &res, err);
    s->seconds[PH_NOCOLLAPSE] = since(&t);
    sim_result_free(res);
    res = NULL;
  }
  if (ok) {
    t = cpu_seconds();
    ok = simulate(r.plan, prof, true, false, &res, err);
    s->seconds[PH_SIM] = since(&t);
  }
  if (ok) {
    char *run_dir = g_build_filename(dir, "run", NULL);
    ok = write_outputs(r.plan, res, run_dir, opt->charts, err);
    s->seconds[PH_OUTPUTS] = since(&t);
    g_free(run_dir);
  }
  g_free(plan_dir);
  sim_result_free(res);
  profile_free(prof);
  compile_result_free(&r);
  return ok;
}

static void remove_tree(const char *path) {
  GDir *d = g_dir_open(path, 0, NULL);
  if (d) {
    const char *name;
    while ((name = g_dir_read_name(d))) {
      char *child = g_build_filename(path, name, NULL);
      remove_tree(child);
      g_free(child);
    }
    g_dir_close(d);
  }
  g_remove(path);
}

/* The child: one configuration, its sample written to fd. */
static int child_run(const struct family *f, uint32_t dp, const struct options *opt, int fd) {
  GError *err = NULL;
  struct sample s = {0};
  char *program = write_layout(f, dp, &err);
  char *dir = g_dir_make_tmp("piper-bench-scale-XXXXXX", &err);
  bool ok = program && dir && run_phases(f, program, dir, opt, &s, &err);
  if (program)
    g_unlink(program);
  if (dir)
    remove_tree(dir);
  g_free(program);
  g_free(dir);
  if (!ok) {
    fprintf(stderr, "bench_scale: error: %s\n", err ? err->message : "?");
    g_clear_error(&err);
    return 1;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  s.rss_mib = ru.ru_maxrss / 1024.0;
  return write(fd, &s, sizeof s) == (ssize_t)sizeof s ? 0 : 1;
}

static bool run_forked(const struct family *f, uint32_t dp, const struct options *opt,
                       struct sample *out) {
  int fds[2];
  if (pipe(fds) != 0)
    return false;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    _exit(child_run(f, dp, opt, fds[1]));
  }
  close(fds[1]);
  bool ok = pid > 0 && read(fds[0], out, sizeof *out) == (ssize_t)sizeof *out;
  close(fds[0]);
  int status = 0;
  if (pid > 0)
    waitpid(pid, &status, 0);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int compare_double(const void *a, const void *b) {
  return piper_cmp_double(a, b);
}

/* The median of each phase over n runs (and the largest RSS). */
static struct sample median_of(struct sample *runs, uint32_t n) {
  struct sample m = runs[0];
  double v[64];
  for (int ph = 0; ph < PH_COUNT; ph++) {
    for (uint32_t k = 0; k < n; k++)
      v[k] = runs[k].seconds[ph];
    qsort(v, n, sizeof v[0], compare_double);
    m.seconds[ph] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  for (uint32_t k = 0; k < n; k++) {
    m.rss_mib = fmax(m.rss_mib, runs[k].rss_mib);
    m.sim_rss_mib = fmax(m.sim_rss_mib, runs[k].sim_rss_mib);
  }
  return m;
}

/* Least-squares slope of log y over log x; NAN with fewer than two usable points. */
static double growth_exponent(const struct sample *s, uint32_t n, int ph) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    double y = ph < 0 ? s[i].rss_mib : s[i].seconds[ph];
    if (y <= 0)
      continue;
    double x = log((double)s[i].devices), ly = log(y);
    sx += x, sy += ly, sxx += x * x, sxy += x * ly, k++;
  }
  if (k < 2)
    return NAN;
  return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

static void print_header(void) {
  printf("%8s %12s", "devices", "instrs");
  for (int ph = 0; ph < PH_COUNT; ph++)
    printf(" %11s", phase_names[ph]);
  printf(" %9s %9s\n", "total", "RSS MiB");
}

/* compile + simulate: what a planner pays for one layout (no outputs written). */
static double compile_and_simulate(const struct sample *s) {
  return s->seconds[PH_APPLY] + s->seconds[PH_LOWER] + s->seconds[PH_SIM];
}

static void print_sample(const struct sample *s) {
  printf("%8u %12llu", s->devices, (unsigned long long)s->instructions);
  for (int ph = 0; ph < PH_COUNT; ph++)
    printf(" %11.3f", s->seconds[ph]);
  printf(" %9.3f %9.1f\n", compile_and_simulate(s), s->rss_mib);
  fflush(stdout);
}

static bool run_family(const struct family *f, const struct options *opt) {
  uint32_t sizes[8], n = 0;
  for (uint32_t g = f->min_dp; g <= (opt->big ? f->max_dp_big : f->max_dp); g *= 2)
    sizes[n++] = g;
  printf("\n%s: %s, %s, %s, %u micro-batches (median of %u; CPU seconds)\n", f->name, f->model,
         f->layout_fmt, sched_family_name(f->schedule), f->mbs, opt->repeat);
  print_header();
  struct sample med[8];
  for (uint32_t i = 0; i < n; i++) {
    struct sample runs[64];
    for (uint32_t k = 0; k < opt->repeat; k++)
      if (!run_forked(f, sizes[i], opt, &runs[k]))
        return false;
    med[i] = median_of(runs, opt->repeat);
    print_sample(&med[i]);
  }
  printf("%8s %12s", "exponent", "");
  for (int ph = 0; ph < PH_COUNT; ph++)
    printf(" %11.2f", growth_exponent(med, n, ph));
  printf(" %9s %9.2f\n", "", growth_exponent(med, n, -1));
  return true;
}

/* --engine: the simulator with every device simulated, dense family; false when a ratio of
 * time per instruction (at 4x the devices over the smaller) exceeds opt->check. */
static bool run_engine(const struct options *opt, bool *within) {
  const struct family *f = &families[0];
  uint32_t lo = opt->min_dp ? opt->min_dp : 256, hi = opt->max_dp ? opt->max_dp : opt->big ? 8192 : 4096;
  printf("\nengine: %s, %s, %s, %u micro-batches, every device simulated (median of %u; CPU "
         "seconds of sim_run)\n",
         f->model, f->layout_fmt, sched_family_name(f->schedule), f->mbs, opt->repeat);
  printf("%8s %12s %9s %12s %12s %13s %11s\n", "devices", "instrs", "seconds", "instrs/s",
         "ns/instr", "bytes/device", "vs 1/4 size");
  struct sample med[16];
  uint32_t n = 0;
  *within = true;
  for (uint32_t g = lo; g <= hi && n < 16; g *= 2, n++) {
    struct sample runs[64];
    for (uint32_t k = 0; k < opt->repeat; k++)
      if (!run_forked(f, g, opt, &runs[k]))
        return false;
    med[n] = median_of(runs, opt->repeat);
    const struct sample *m = &med[n];
    double sec = m->seconds[PH_NOCOLLAPSE], per = sec / (double)m->instructions;
    char ratio[32] = "";
    if (n >= 2) {
      double r = per / (med[n - 2].seconds[PH_NOCOLLAPSE] / (double)med[n - 2].instructions);
      g_snprintf(ratio, sizeof ratio, "%.2f", r);
      if (opt->check > 0 && r > opt->check)
        *within = false;
    }
    printf("%8u %12llu %9.3f %12.3g %12.1f %13.0f %11s\n", m->devices,
           (unsigned long long)m->instructions, sec, (double)m->instructions / sec, per * 1e9,
           m->sim_rss_mib * 1048576.0 / m->devices, ratio);
    fflush(stdout);
  }
  printf("%8s %12s %9.2f (seconds over devices)\n", "exponent", "",
         growth_exponent(med, n, PH_NOCOLLAPSE));
  if (!*within)
    printf("bench_scale: a time per instruction at 4x the devices is over %.2fx the smaller's\n",
           opt->check);
  return true;
}

static bool parse_args(int argc, char **argv, struct options *o) {
  *o = (struct options){.charts = true, .repeat = 1};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--big"))
      o->big = true;
    else if (!strcmp(argv[i], "--no-collapse"))
      o->no_collapse = true;
    else if (!strcmp(argv[i], "--no-charts"))
      o->charts = false;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc)
      o->only = argv[++i];
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
      o->repeat = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--engine"))
      o->engine = true;
    else if (!strcmp(argv[i], "--no-timelines"))
      o->no_timelines = true;
    else if (!strcmp(argv[i], "--min-dp") && i + 1 < argc)
      o->min_dp = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--max-dp") && i + 1 < argc)
      o->max_dp = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--check") && i + 1 < argc)
      o->check = atof(argv[++i]);
    else
      return false;
  }
  return o->repeat >= 1 && o->repeat <= 64;
}

int main(int argc, char **argv) {
  struct options opt;
  if (!parse_args(argc, argv, &opt)) {
    fprintf(stderr, "usage: bench_scale [--big] [--no-collapse] [--no-charts] "
                    "[--only dense|moe-ep|moe-dp] "
                    "[--repeat N (1..64)] [--engine [--min-dp G] [--max-dp G] [--check R] [--no-timelines]]\n");
    return 2;
  }
  if (opt.engine) {
    bool within = true;
    if (!run_engine(&opt, &within))
      return 1;
    return within ? 0 : 1;
  }
  printf("phases: apply = load + schedule + IR + directives; lower = plans incl. progress check;"
         "\ncheck = progress check alone; write = plan directory (0: not run); sim = simulation"
         " (collapsed);"
         "\noutputs = stats + run directory (trace) + charts; total = apply + lower + sim\n");
  for (size_t i = 0; i < G_N_ELEMENTS(families); i++)
    if ((!opt.only || !strcmp(opt.only, families[i].name)) && !run_family(&families[i], &opt))
      return 1;
  return 0;
}
