/* piper-plan: which configuration should I run? Searches the layouts, schedules, micro-batch
 * counts and ZeRO levels of a model on N devices (tools/planner.h), prints the best ones under
 * the memory cap with why each wins, and writes the ranked plan.csv and plan.png. --sweep FILE
 * evaluates a list written by hand instead (tools/sweep.h). Exit status: 0 success, 1 runtime
 * failure (nothing could be simulated), 2 bad input. */
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../report/chart.h"
#include "../report/report.h"
#include "options.h"
#include "planner.h"
#include "planner_slow.h"
#include "sweep.h"

struct plan_cli {
  const char *model, *profile, *out, *micro_batch_sizes, *schedules, *sweep, *pp, *tp, *recompute;
  const char *cp, *ep, *fp8;
  const char *rank_by;
  uint32_t devices, global_batch, seq_length, max_interleave, threads, top;
  double memory_cap_gib;
  bool force, no_charts, quiet, no_summary;
  const char *argv0; /* where the sibling programs of the printed commands are */
};

// clang-format off
#define PLAN_OPTION(field) .offset = offsetof(struct plan_cli, field)
static const struct option_spec options[] = {
    {.kind = OPTION_HEADING, .help = "the question:"},
    {.name = "--model", .kind = OPTION_STRING, PLAN_OPTION(model), .metavar = "FILE",
     .help = "annotated model (models/*.json)"},
    {.name = "--devices", .kind = OPTION_U32, PLAN_OPTION(devices), .lo = 1,
     .hi = LAYOUT_MAX_DEVICES, .metavar = "N", .help = "devices to train on"},
    {.name = "--profile", .kind = OPTION_STRING, PLAN_OPTION(profile), .metavar = "FILE",
     .help = "hardware profile (profiles/*.json)"},
    {.name = "--global-batch-size", .alias = "--global-batch", .kind = OPTION_U32,
     PLAN_OPTION(global_batch), .lo = 1, .hi = 1u << 30, .metavar = "SEQ",
     .help = "sequences per step over all data-parallel replicas:\n"
             "dp x micro-batches x micro-batch size (Megatron's name; --global-batch kept)"},
    {.name = "--seq-length", .alias = "--seq-len", .kind = OPTION_U32, PLAN_OPTION(seq_length),
     .lo = 1, .hi = 1u << 24, .metavar = "S",
     .help = "tokens in one sequence (default: the model file's piper.seq_len)"},
    {.name = "--memory-cap", .kind = OPTION_DOUBLE, PLAN_OPTION(memory_cap_gib), .lo = 0,
     .hi = 1e9, .metavar = "GIB", .help = "per-device memory cap (default: the profile's capacity)"},
    {.kind = OPTION_HEADING, .help = "the space:"},
    {.name = "--pp", .kind = OPTION_STRING, PLAN_OPTION(pp), .metavar = "LIST",
     .help = "pipeline degrees to try, e.g. 4,8 (default: every divisor of N)"},
    {.name = "--tp", .kind = OPTION_STRING, PLAN_OPTION(tp), .metavar = "LIST",
     .help = "tensor-parallel degrees to try, each with sequence parallelism\n"
             "(default: 1,2,4,8 where they divide N, the heads, KV heads, vocabulary\n"
             "and FFN)"},
    {.name = "--cp", .kind = OPTION_STRING, PLAN_OPTION(cp), .metavar = "LIST",
     .help = "context-parallel degrees to try, e.g. 1,2,4 (default 1; where the\n"
             "sequence splits into 2 x cp chunks, on layouts without expert parallelism)"},
    {.name = "--ep", .kind = OPTION_STRING, PLAN_OPTION(ep), .metavar = "LIST",
     .help = "expert-parallel sizes to try besides 1 (MoE models; default: every size\n"
             "dividing the experts and a stage's tp x dp ranks, with etp = tp or 1)"},
    {.name = "--fp8", .kind = OPTION_STRING, PLAN_OPTION(fp8), .metavar = "LIST",
     .help = "FP8 recipes to try, e.g. none,tensorwise,blockwise (default: the model\n"
             "file's piper.fp8; bf16 models on a profile with an FP8 peak)"},
    {.name = "--micro-batch-size", .alias = "--micro-batch-sizes", .kind = OPTION_STRING,
     PLAN_OPTION(micro_batch_sizes), .metavar = "B[,B...]",
     .help = "micro-batch size, or sizes to try, e.g. 1,2,4 (default: the model's;\n"
             "the micro-batch counts follow from --global-batch-size)"},
    {.name = "--schedules", .kind = OPTION_STRING, PLAN_OPTION(schedules), .metavar = "LIST",
     .help = "schedule families to try where they apply (default: gpipe, 1f1b,\n"
             "zerobubble, interleaved_1f1b, zbv, dualpipev)"},
    {.name = "--recompute", .kind = OPTION_STRING, PLAN_OPTION(recompute), .metavar = "LIST",
     .help = "recomputation to try with each layout, e.g. none,selective,full:uniform:1\n"
             "(none, selective, full, full:uniform:N, full:block:N; default none)"},
    {.name = "--max-interleave", .kind = OPTION_U32, PLAN_OPTION(max_interleave), .lo = 1,
     .hi = 64, .metavar = "V", .help = "interleaved 1F1B with 2 .. V stages per rank (default 2)"},
    {.name = "--threads", .kind = OPTION_U32, PLAN_OPTION(threads), .lo = 1, .hi = 1024,
     .metavar = "N", .help = "simulations at once (default: one per core)"},
    {.name = "--sweep", .kind = OPTION_STRING, PLAN_OPTION(sweep), .metavar = "FILE",
     .help = "evaluate the list of a sweep file instead of searching (sweep.csv)"},
    {.kind = OPTION_HEADING, .help = "output:"},
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING, PLAN_OPTION(out), .metavar = "DIR",
     .help = "output directory (default: a new out/<YYYYmmdd_HHMMSS>[_K])"},
    {.name = "--force", .kind = OPTION_FLAG, PLAN_OPTION(force),
     .help = "overwrite another run's files in --out DIR"},
    {.name = "--rank-by", .kind = OPTION_STRING, PLAN_OPTION(rank_by), .metavar = "WHAT",
     .help = "throughput (default), or slow-gpu[=F]: also simulate the top K again\n"
             "with one GPU F times slower (default 1.3) on its worst pipeline rank,\n"
             "rank them by the step's loss (tolerance) and write slow-gpu.csv"},
    {.name = "--top", .kind = OPTION_U32, PLAN_OPTION(top), .lo = 1, .hi = 1000, .metavar = "K",
     .help = "configurations explained in the summary (default 5)"},
    {.name = "--no-charts", .kind = OPTION_FLAG, PLAN_OPTION(no_charts),
     .help = "write no chart"},
    {.name = "--quiet", .kind = OPTION_FLAG, PLAN_OPTION(quiet),
     .help = "no progress lines (the summary stays, as in the other tools)"},
    {.name = "--no-summary", .kind = OPTION_FLAG, PLAN_OPTION(no_summary),
     .help = "print no summary (what --quiet did before; add --quiet for no output)"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-plan",
    .usage =
        "usage: piper-plan --model FILE --devices N --profile FILE --global-batch-size SEQ [options]\n"
        "       piper-plan --sweep FILE [--profile FILE] [--out DIR]\n"
        "\n"
        "Searches every layout pp x dp x ep x tp (x --cp) of N devices (tp > 1 with sequence\n"
        "parallelism; ep its own size with etp = tp or 1; uneven stages where they do not\n"
        "divide the layers; --fp8's recipes), with the schedules\n"
        "that apply to each (gpipe, 1f1b, zerobubble on one stage per rank; interleaved_1f1b on\n"
        "a loop; zbv, dualpipev on a V), the micro-batch counts of the global batch, ZeRO 0-3\n"
        "and --recompute's values; keeps only what the compiler accepts, simulates them in\n"
        "parallel (not those whose memory bound is over the cap), and prints the best ones\n"
        "under the memory cap with why each wins and the piper-sim and mpirun ... piper-exec\n"
        "commands that run the pick (when none fits: the closest by memory). Writes plan.csv\n"
        "(every configuration, ranked; the reason for those that do not fit) and plan.png.\n"
        "\n"
        "  piper-plan --model models/qwen3-30b-a3b.json --devices 64 \\\n"
        "             --profile profiles/h100-sxm.json --global-batch-size 256\n"
        "\n",
    .epilogue = "\nExit status: 0 success, 1 runtime failure (nothing could be simulated), "
                "2 bad input.\n",
    .options = options,
    .help_column = 26,
};

/* "1,2,4" into a new array; false on an item that is not a whole number in [1, hi]. */
static bool parse_list(const char *list, uint32_t hi, uint32_t **out, uint32_t *n) {
  gchar **items = g_strsplit(list, ",", -1);
  *n = g_strv_length(items);
  *out = g_new0(uint32_t, *n + 1);
  bool ok = *n > 0;
  for (uint32_t i = 0; ok && i < *n; i++)
    ok = piper_parse_u32(g_strstrip(items[i]), 1, hi, &(*out)[i]);
  g_strfreev(items);
  return ok;
}

/* "none,selective,full:uniform:1" into the request's recompute values, each checked as a
 * --layout recompute= value would be; *items owns the strings (g_strfreev). */
static bool parse_recompute(const char *list, struct planner_request *rq, gchar ***items) {
  *items = g_strsplit(list, ",", -1);
  rq->n_recompute = g_strv_length(*items);
  rq->recompute = (const char *const *)*items;
  bool ok = rq->n_recompute > 0;
  for (gchar **it = *items; ok && *it; it++) {
    g_strstrip(*it);
    struct layout l;
    g_autofree char *spec = g_strdup_printf("pp=1,recompute=%s", *it);
    ok = strcmp(*it, "none") == 0 || layout_parse(spec, &l, NULL);
  }
  return ok;
}

/* "zbv,1f1b" into the request's family switches; the name at fault in *bad. */
static bool parse_schedules(const char *list, struct planner_request *rq, char **bad) {
  for (int f = 0; f < SCHED_FAMILY_COUNT; f++)
    rq->schedules[f] = false;
  gchar **items = g_strsplit(list, ",", -1);
  bool ok = items[0] != NULL;
  for (gchar **it = items; ok && *it; it++) {
    enum sched_family f;
    ok = sched_family_parse(g_strstrip(*it), &f) && f != SCHED_CUSTOM && f != SCHED_DUALPIPE;
    if (ok)
      rq->schedules[f] = true;
    else
      *bad = g_strdup(*it);
  }
  g_strfreev(items);
  return ok;
}

/* What the request's lists point to (request_lists_free). */
struct request_lists {
  int64_t *sizes;
  uint32_t *pp, *tp, *cp, *ep;
  gchar **recompute, **fp8;
};

static void request_lists_free(struct request_lists *s) {
  g_free(s->sizes);
  g_free(s->pp);
  g_free(s->tp);
  g_free(s->cp);
  g_free(s->ep);
  g_strfreev(s->recompute);
  g_strfreev(s->fp8);
}

/* --cp, --ep and --fp8 into the request (the recipes' names are the planner's check). */
static int parse_parallel_lists(const struct plan_cli *a, struct planner_request *rq,
                                struct request_lists *st) {
  if (a->cp && !parse_list(a->cp, 1024, &st->cp, &rq->n_cp))
    return piper_usage_error(program.name,
                             "--cp: \"%s\" is not a list of whole numbers in [1, 1024] "
                             "(context-parallel degrees)",
                             a->cp);
  rq->cp = st->cp;
  if (a->ep && !parse_list(a->ep, LAYOUT_MAX_DEVICES, &st->ep, &rq->n_ep))
    return piper_usage_error(program.name,
                             "--ep: \"%s\" is not a list of whole numbers (expert-parallel "
                             "sizes)",
                             a->ep);
  rq->ep = st->ep;
  if (a->fp8) {
    st->fp8 = g_strsplit(a->fp8, ",", -1);
    for (gchar **it = st->fp8; *it; it++)
      g_strstrip(*it);
    rq->n_fp8 = g_strv_length(st->fp8);
    rq->fp8 = (const char *const *)st->fp8;
  }
  return OPTIONS_CONTINUE;
}

/* The request from the command line; OPTIONS_CONTINUE, or the usage error's exit status. */
static int build_request(const struct plan_cli *a, struct planner_request *rq,
                         struct request_lists *st) {
  int64_t **sizes = &st->sizes;
  uint32_t **pps = &st->pp, **tps = &st->tp;
  gchar ***recompute = &st->recompute;
  if (!a->model || !a->devices || !a->profile || !a->global_batch)
    return piper_usage_error(program.name, "%s",
                             "give --model FILE, --devices N, --profile FILE and --global-batch-size SEQ");
  *rq = planner_request_default();
  rq->model_path = a->model;
  rq->profile_path = a->profile;
  rq->devices = a->devices;
  rq->global_batch = a->global_batch;
  rq->seq_len = a->seq_length;
  rq->memory_cap_gib = a->memory_cap_gib;
  rq->threads = a->threads;
  rq->progress = !a->quiet;
  if (a->max_interleave)
    rq->max_interleave = a->max_interleave;
  uint32_t *list = NULL;
  if (a->micro_batch_sizes) {
    bool ok = parse_list(a->micro_batch_sizes, 65536, &list, &rq->n_micro_batch_sizes);
    *sizes = g_new0(int64_t, rq->n_micro_batch_sizes + 1);
    for (uint32_t i = 0; i < rq->n_micro_batch_sizes; i++)
      (*sizes)[i] = list[i];
    g_free(list);
    if (!ok)
      return piper_usage_error(program.name,
                               "--micro-batch-size: \"%s\" is not a list of whole numbers in "
                               "[1, 65536]",
                               a->micro_batch_sizes);
    rq->micro_batch_sizes = *sizes;
  }
  if (a->pp) {
    if (!parse_list(a->pp, LAYOUT_MAX_DEVICES, pps, &rq->n_pp))
      return piper_usage_error(program.name,
                               "--pp: \"%s\" is not a list of whole numbers (pipeline degrees)",
                               a->pp);
    rq->pp = *pps;
  }
  if (a->tp) {
    if (!parse_list(a->tp, 1024, tps, &rq->n_tp))
      return piper_usage_error(program.name,
                               "--tp: \"%s\" is not a list of whole numbers in [1, 1024] "
                               "(tensor-parallel degrees)",
                               a->tp);
    rq->tp = *tps;
  }
  if (a->recompute && !parse_recompute(a->recompute, rq, recompute))
    return piper_usage_error(program.name,
                             "--recompute: \"%s\" is not a list of none, selective, full, "
                             "full:uniform:N, full:block:N",
                             a->recompute);
  char *bad = NULL;
  if (a->schedules && !parse_schedules(a->schedules, rq, &bad)) {
    int rc = piper_usage_error(program.name,
                               "--schedules: \"%s\" is not one of gpipe, 1f1b, zerobubble, "
                               "interleaved_1f1b, zbv, dualpipev",
                               bad ? bad : a->schedules);
    g_free(bad);
    return rc;
  }
  return parse_parallel_lists(a, rq, st);
}

static void print_best(const struct planner *pl, uint32_t i) {
  const struct planner_config *c = &pl->configs[i];
  char *name = planner_config_name(c);
  char *why = planner_explain(pl, i);
  printf("  #%u %s (%s): %.6g tokens/s, %.4g ms a step", i + 1, name, c->memory_choice,
         c->throughput_tokens_per_s, c->iteration_time_s * 1e3);
  if (c->mfu > 0)
    printf(", MFU %.1f%%", 100 * c->mfu);
  printf(", peak %.2f GiB\n      %s\n", c->peak_memory_bytes / (double)(1ull << 30), why);
  g_free(why);
  g_free(name);
}

/* A word of a shell command: as it is when the shell reads it so, else quoted. */
static char *shell_word(const char *s) {
  for (const char *c = s; *c; c++)
    if (!g_ascii_isalnum(*c) && !strchr("_./,=:+@%-", *c))
      return g_shell_quote(s);
  return g_strdup(s);
}

/* The program beside this one (argv[0]'s directory), as the user would type it. */
static char *sibling(const char *argv0, const char *name) {
  if (!strchr(argv0, '/'))
    return g_strdup(name); /* found on PATH: so is its sibling */
  g_autofree char *dir = g_path_get_dirname(argv0);
  g_autofree char *path = g_build_filename(dir, name, NULL);
  return shell_word(path);
}

/* The commands that run configuration c: piper-sim (the figures above) and piper-exec under
 * mpirun, one process per device, with the variables that let Open MPI start as root (the
 * README's recipe; harmless for other users). The host backend for a CPU or synthetic profile,
 * cuda otherwise. */
static void plan_print_commands(const struct planner *pl, const struct planner_config *c,
                         const char *argv0) {
  g_autofree char *sim = sibling(argv0, "piper-sim");
  g_autofree char *exec = sibling(argv0, "piper-exec");
  g_autofree char *model = shell_word(pl->request.model_path);
  g_autofree char *profile = shell_word(pl->request.profile_path);
  g_autofree char *layout = shell_word(c->layout);
  /* Megatron's names, both sizes spelled out (the model file's defaults may change) */
  g_autofree char *seq = pl->request.seq_len > 0
                             ? g_strdup_printf(" --seq-length %lld", (long long)pl->request.seq_len)
                             : g_strdup("");
  g_autofree char *what = g_strdup_printf(
      "--model %s --layout %s --schedule %s --micro-batch-size %lld --num-micro-batches %u%s",
      model, layout, sched_family_name(c->schedule),
      (long long)(c->micro_batch_size ? c->micro_batch_size : pl->model_micro_batch_size),
      c->microbatches, seq);
  bool host = pl->profile->synthetic || strstr(pl->profile->name, "host") != NULL;
  /* FP8: piper-sim costs the recipe and the cuda backend runs it; the host backend has no FP8
   * GEMMs and refuses it, so a host line runs the same layout in bf16 (and says so) rather
   * than a line that fails */
  const char *fp8 = c->fp8 ? c->fp8 : pl->model_fp8;
  bool any_fp8 = strcmp(fp8, "none") != 0;
  g_autofree char *sim_fp8 = c->fp8 && strcmp(c->fp8, pl->model_fp8) != 0
                                 ? g_strdup_printf(" --fp8 %s", c->fp8)
                                 : g_strdup("");
  const char *exec_fp8 = !host ? sim_fp8
                         : any_fp8 && strcmp(pl->model_fp8, "none") != 0 ? " --fp8 none"
                                                                          : "";
  printf("  run #1:\n    %s %s%s --profile %s\n", sim, what, sim_fp8, profile);
  /* --allow-run-as-root: runs as root (containers) and as a user alike, as the README's */
  printf("    %smpirun --allow-run-as-root -np %u%s %s "
         "--backend %s %s%s --iters 20\n",
         host ? "OPENBLAS_NUM_THREADS=1 " : "", pl->request.devices,
         host ? " --oversubscribe" : pl->request.devices > 8 ? " --hostfile HOSTS" : "", exec,
         host ? "host" : "cuda", what, exec_fp8);
  if (any_fp8 && host)
    printf("    (the host backend has no FP8 GEMMs: that line trains the layout in bf16)\n");
}

static void print_closest(const struct planner *pl, uint32_t i) {
  const struct planner_config *c = &pl->configs[i];
  g_autofree char *name = planner_config_name(c);
  double gib = (double)(1ull << 30);
  printf("  #%u %s (%s): peak %s%.2f GiB, %.2f GiB over the cap", i + 1, name, c->memory_choice,
         c->bounded ? "at least " : "", c->peak_memory_bytes / gib,
         (c->peak_memory_bytes - c->memory_cap_bytes) / gib);
  if (!c->bounded)
    printf(", %.6g tokens/s", c->throughput_tokens_per_s);
  printf("\n");
}

static void print_summary(const struct planner *pl, const struct plan_cli *a, const char *dir) {
  uint32_t feasible = 0, over = 0, failed = 0, bounded = 0;
  for (uint32_t i = 0; i < pl->n_configs; i++) {
    feasible += pl->configs[i].status == PLANNER_FEASIBLE;
    over += pl->configs[i].status == PLANNER_OVER_CAP;
    failed += pl->configs[i].status == PLANNER_FAILED;
    bounded += pl->configs[i].bounded;
  }
  printf("piper-plan: %s on %u devices, profile %s, global batch %llu sequences", pl->model_name,
         pl->request.devices, pl->profile->name, (unsigned long long)pl->request.global_batch);
  if (pl->memory_cap_bytes > 0)
    printf(", memory cap %.1f GiB\n", pl->memory_cap_bytes / (double)(1ull << 30));
  else
    printf(", no memory cap (the profile has no capacity)\n");
  printf("  searched %u configurations (%u layouts) in %.1f s on %u threads (%.1f s of it the "
         "compiler's checks): %u feasible, %u over the memory cap, %u failed\n",
         pl->n_configs, pl->n_layouts, pl->check_seconds + pl->seconds, pl->threads_used,
         pl->check_seconds, feasible, over, failed);
  printf("  simulated %u; %u over the cap by their memory bound (parameters, gradients, "
         "optimizer state and the activations their schedule holds at once; not simulated)\n",
         pl->n_simulated, bounded);
  if (pl->skipped->len) {
    gchar **lines = g_strsplit(pl->skipped->str, "\n", -1);
    for (gchar **l = lines; *l && **l; l++)
      printf("  (%s)\n", *l);
    g_strfreev(lines);
  }
  printf("  not searched: DualPipe (two model copies)\n");
  uint32_t top = a->top ? a->top : 5;
  if (feasible == 0 && over > 0) {
    /* ranked by peak memory (planner_rank): what comes closest to fitting */
    printf("  no configuration fits under the memory cap; the closest (plan.csv has them all):\n");
    for (uint32_t i = 0; i < over && i < top; i++)
      print_closest(pl, i);
  }
  for (uint32_t i = 0; i < feasible && i < top; i++)
    print_best(pl, i);
  if (feasible)
    plan_print_commands(pl, &pl->configs[0], a->argv0);
  printf("  wrote %s/ (plan.csv%s)\n", dir,
         a->no_charts || pl->n_simulated == failed ? "" : " plan.png");
}

/* --sweep FILE: the hand-written list, with --profile replacing its profiles. */
static int run_sweep_mode(const struct plan_cli *a, const char *dir) {
  if (a->model || a->devices || a->global_batch || a->seq_length || a->micro_batch_sizes ||
      a->schedules || a->pp || a->tp || a->cp || a->ep || a->fp8 || a->recompute ||
      a->max_interleave || a->memory_cap_gib > 0 || a->top || a->rank_by)
    return piper_usage_error(program.name, "%s",
                             "--sweep takes the model, schedules and batch from its file (only "
                             "--profile, --threads, --out, --force, --no-charts, --quiet, "
                             "--no-summary go with it)");
  struct sweep_run_options o = {.progress = !a->quiet, .charts = !a->no_charts,
                                .threads = a->threads,
                                .profile = a->profile, .collapse = true};
  return sweep_main(program.name, a->sweep, dir, &o, !a->no_summary);
}

/* --rank-by slow-gpu: the top configurations again with one slow GPU (planner_slow.h). */
static int rank_slow_gpu(const struct planner *pl, const struct plan_cli *a, const char *dir,
                         double factor) {
  GError *err = NULL;
  struct planner_slow *ps = planner_slow_run(pl, factor, a->top ? a->top : 5, &err);
  if (!ps || !planner_slow_write_csv(pl, ps, dir, &err)) {
    planner_slow_free(ps);
    return piper_error_exit(program.name, err);
  }
  if (!a->no_summary) {
    planner_slow_print(pl, ps, stdout);
    printf("  wrote %s/slow-gpu.csv\n", dir);
  }
  planner_slow_free(ps);
  return 0;
}

static int run_plan(const struct plan_cli *a, const char *dir) {
  struct planner_request rq;
  struct request_lists lists = {0};
  int rc = build_request(a, &rq, &lists);
  double slow_factor = 0;
  if (rc == OPTIONS_CONTINUE && a->rank_by && !planner_slow_parse_rank_by(a->rank_by, &slow_factor))
    rc = piper_usage_error(program.name,
                           "--rank-by: \"%s\" is not throughput, slow-gpu or slow-gpu=F (F > 1)",
                           a->rank_by);
  GError *err = NULL;
  struct planner *pl = rc == OPTIONS_CONTINUE ? planner_new(&rq, &err) : NULL;
  request_lists_free(&lists);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  if (!pl)
    return piper_error_exit(program.name, err);
  bool charts = !a->no_charts;
  rc = 0;
  if (!planner_run(pl, &err) || !planner_write_outputs(pl, dir, charts, &err)) {
    rc = piper_error_exit(program.name, err);
  } else {
    if (!a->no_summary)
      print_summary(pl, a, dir);
    if (slow_factor > 0)
      rc = rank_slow_gpu(pl, a, dir, slow_factor);
    bool any = false;
    for (uint32_t i = 0; i < pl->n_configs; i++)
      any |= pl->configs[i].status != PLANNER_FAILED;
    if (!any) {
      fprintf(stderr, "%s: error: none of the %u configurations compiled and simulated (first: "
                      "%s)\n",
              program.name, pl->n_configs, pl->configs[0].error);
      rc = 1;
    }
  }
  planner_free(pl);
  return rc;
}

int main(int argc, char **argv) {
  struct plan_cli a = {.argv0 = argv[0]};
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  GError *err = NULL;
  bool created = !a.out || !g_file_test(a.out, G_FILE_TEST_EXISTS);
  char *dir = a.out ? (report_run_dir_claim(a.out, a.force, &err) ? g_strdup(a.out) : NULL)
                    : report_run_dir_new("out", &err);
  if (!dir)
    return piper_error_exit(program.name, err);
  rc = a.sweep ? run_sweep_mode(&a, dir) : run_plan(&a, dir);
  if (rc != 0 && created)
    g_rmdir(dir); /* a failed run leaves no empty directory behind (only an empty one goes) */
  g_free(dir);
  return rc;
}
