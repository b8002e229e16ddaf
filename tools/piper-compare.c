/* piper-compare: put two run directories of the same plan side by side (docs/design.md, "Pipeline"
 * and "Outputs and exit statuses"), typically one simulated (piper-sim) and one measured
 * (piper-exec), to check the simulator against the measurement. Exit status: 0 success, 1 runtime
 * failure (--tolerance: the iteration times differ by more than it allows; an output that cannot be
 * written), 2 bad input. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "../base/version.h"
#include "../report/chart.h"
#include "../report/report.h"
#include "options.h"

/* What the command line asks for. */
struct compare_cli {
  const char *dirs[2];
  uint32_t n_dirs;
  const char *json_path;
  const char *chart_path; /* NULL: compare.png beside --json, else none */
  const char *out_dir;    /* -o DIR: DIR/compare.json and DIR/compare.png (unless --json/--chart) */
  double tolerance;       /* NAN: no verdict */
  bool quiet;             /* the summary and the verdict only */
};

static bool take_run_dir(void *args, const char *arg, GError **err) {
  struct compare_cli *a = args;
  if (a->n_dirs == 2)
    return piper_input_error(err, "one run directory too many: %s", arg);
  a->dirs[a->n_dirs++] = arg;
  return true;
}

/* One row per option, as in redis's config table: kept as rows, not reflowed. */
// clang-format off
static const struct option_spec options[] = {
    {.name = "--tolerance", .kind = OPTION_DOUBLE, .offset = offsetof(struct compare_cli, tolerance),
     .lo = 0, .hi = 1e6, .metavar = "X",
     .help = "relative, e.g. 0.2: exit 1 when the iteration time ratio B/A is outside\n"
             "[1/(1+X), 1+X] (the prediction is off)"},
    {.name = "--json", .kind = OPTION_STRING, .offset = offsetof(struct compare_cli, json_path),
     .metavar = "FILE", .help = "also write the comparison as JSON, and the chart as\n"
                                "compare.png in FILE's directory (unless --chart)"},
    {.name = "--chart", .kind = OPTION_STRING, .offset = offsetof(struct compare_cli, chart_path),
     .metavar = "FILE", .help = "draw the timelines of A and B, one above the other, into\n"
                                "FILE (PNG)"},
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING, .offset = offsetof(struct compare_cli, out_dir),
     .metavar = "DIR", .help = "write DIR/compare.json and DIR/compare.png (--json and\n"
                               "--chart name other files)"},
    {.name = "--quiet", .kind = OPTION_FLAG, .offset = offsetof(struct compare_cli, quiet),
     .help = "no per-device and per-instruction detail (the summary and the\n"
             "verdict stay, as in every tool)"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-compare",
    .usage =
        "usage: piper-compare A_DIR B_DIR [--tolerance X] [-o DIR] [--json FILE] [--chart FILE]\n"
        "\n"
        "Puts two run directories of the same plan side by side (written by piper-sim or\n"
        "piper-exec; either may be either) and says which is simulated and which measured.\n"
        "Both must hold the same directive program (<schedule>_pp<R>_mbs<M>.json), model and\n"
        "device count. Prints, with the ratio B/A on every row: iteration time, throughput, MFU,\n"
        "bubble fraction, exposed communication and overlap per device, peak memory and its\n"
        "breakdown per device, and the mean duration of each kind of instruction (F, B, BI, BW,\n"
        "send/recv, collectives by pass, optimizer) from trace.json; then the instructions\n"
        "paired by (device, IR node, micro-batch), each side's duration the median over its\n"
        "traced steps (a measured run traces every measured step): the error max(B/A, A/B) - 1\n"
        "as median and p90, over all and per kind, and the ten worst nodes named.\n"
        "\n",
    .epilogue =
        "\n"
        "Exit status: 0 success, 1 iteration times outside --tolerance (or FILE cannot be\n"
        "written), 2 bad input (a missing or malformed run directory, runs of different plans).\n",
    .options = options,
    .help_column = 18,
    .positional = take_run_dir,
};

static const char *role(const struct report_dir *d) {
  return strcmp(d->kind, "exec") == 0 ? "measured" : "simulated";
}

/* Instructions per step of the whole plan, when the run says (-1 otherwise). */
static double plan_instructions(const struct report_dir *d) {
  const cJSON *sim = cJSON_GetObjectItemCaseSensitive(d->metrics, "simulation");
  const cJSON *n = sim ? cJSON_GetObjectItemCaseSensitive(sim, "instructions")
                       : cJSON_GetObjectItemCaseSensitive(d->metrics, "instructions_per_step");
  return cJSON_IsNumber(n) ? n->valuedouble : -1;
}

static const char *metrics_string(const cJSON *o, const char *key) {
  const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool differ(double a, double b) {
  return fabs(a - b) > 1e-9 * fmax(fabs(a), fabs(b));
}

/* Same model, program and devices, or an input error saying what differs. */
static bool check_same_plan(const struct report_dir *a, const struct report_dir *b, GError **err) {
  if (strcmp(a->model, b->model) != 0)
    return piper_input_error(err, "%s and %s: different models (\"%s\" and \"%s\" in metrics.json)",
                             a->path, b->path, a->model, b->model);
  if (a->n_devices != b->n_devices)
    return piper_input_error(err, "%s and %s: different device counts (%u and %u in metrics.json)",
                             a->path, b->path, a->n_devices, b->n_devices);
  if (!cJSON_Compare(a->program, b->program, true)) {
    int na = cJSON_GetArraySize(a->program), nb = cJSON_GetArraySize(b->program);
    int i = 0;
    while (
        i < na && i < nb &&
        cJSON_Compare(cJSON_GetArrayItem(a->program, i), cJSON_GetArrayItem(b->program, i), true))
      i++;
    if (i < na && i < nb) {
      const char *op = metrics_string(cJSON_GetArrayItem(a->program, i), "op");
      return piper_input_error(
          err, "%s/%s and %s/%s: the directive programs differ at directive %d (%s)", a->path,
          a->program_file, b->path, b->program_file, i, op ? op : "?");
    }
    return piper_input_error(
        err, "%s/%s and %s/%s: the directive programs differ (%d and %d directives)", a->path,
        a->program_file, b->path, b->program_file, na, nb);
  }
  /* the same program over another configuration of a model of the same name */
  static const char *const keys[] = {
      "pp", "dp", "num_microbatches", "micro_batch_size", "seq_len", "model_flops_per_iteration"};
  const double va[] = {a->pp,
                       a->dp,
                       a->num_microbatches,
                       (double)a->micro_batch_size,
                       (double)a->seq_len,
                       a->model_flops_per_iteration};
  const double vb[] = {b->pp,
                       b->dp,
                       b->num_microbatches,
                       (double)b->micro_batch_size,
                       (double)b->seq_len,
                       b->model_flops_per_iteration};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
    if (differ(va[k], vb[k]))
      return piper_input_error(err, "%s and %s: metrics.json key \"%s\" differs (%.17g and %.17g)",
                               a->path, b->path, keys[k], va[k], vb[k]);
  double ia = plan_instructions(a), ib = plan_instructions(b);
  if (ia >= 0 && ib >= 0 && differ(ia, ib))
    return piper_input_error(
        err,
        "%s and %s: the plans differ: %.0f and %.0f instructions per step (another "
        "--pp-regions?)",
        a->path, b->path, ia, ib);
  return true;
}

/* ---- one row: A, B, B/A ------------------------------------------------------------------ */

static double ratio(double a, double b) {
  if (!isfinite(a) || !isfinite(b) || a == 0)
    return NAN;
  return b / a;
}

static cJSON *json_pair(double a, double b) {
  cJSON *o = cJSON_CreateObject();
  double r = ratio(a, b);
  if (isfinite(a))
    cJSON_AddNumberToObject(o, "a", a);
  else
    cJSON_AddNullToObject(o, "a");
  if (isfinite(b))
    cJSON_AddNumberToObject(o, "b", b);
  else
    cJSON_AddNullToObject(o, "b");
  if (isfinite(r))
    cJSON_AddNumberToObject(o, "ratio", r);
  else
    cJSON_AddNullToObject(o, "ratio");
  return o;
}

/* Where the rows go: stdout, or /dev/null for the per-device and per-instruction detail under
 * --quiet (the summary rows and the verdict are printed always). Set by compare(). */
static FILE *text_out;

static void print_value(double v) {
  if (isfinite(v))
    fprintf(text_out, " %14.6g", v);
  else
    fprintf(text_out, " %14s", "-");
}

/* scale converts the stored unit (seconds, bytes, fraction) into the printed one */
static void print_row(int indent, const char *label, double a, double b, double scale) {
  fprintf(text_out, "%*s%-*s", indent, "", 36 - indent, label);
  print_value(a * scale);
  print_value(b * scale);
  double r = ratio(a, b);
  if (isfinite(r))
    fprintf(text_out, " %10.4g\n", r);
  else
    fprintf(text_out, " %10s\n", "-");
}

static void add_row(cJSON *obj, const char *key, double a, double b) {
  cJSON_AddItemToObject(obj, key, json_pair(a, b));
}

static double mean_of(const struct report_dir *d, size_t offset) {
  double s = 0;
  for (uint32_t i = 0; i < d->n_devices; i++)
    s += *(const double *)((const char *)&d->devices[i] + offset);
  return d->n_devices ? s / d->n_devices : 0;
}

static double peak_max(const struct report_dir *d) {
  uint64_t m = 0;
  for (uint32_t i = 0; i < d->n_devices; i++)
    if (d->devices[i].peak_memory_bytes > m)
      m = d->devices[i].peak_memory_bytes;
  return (double)m;
}

static void describe(const char *letter, const struct report_dir *d) {
  const cJSON *m = d->metrics;
  printf("  %s = %s: %s", letter, d->path, role(d));
  if (strcmp(d->kind, "exec") == 0) {
    const char *backend = metrics_string(m, "backend"), *comm = metrics_string(m, "communication");
    printf(" (piper-exec, backend %s, %s; mean of %u step%s; per-device figures from the last, "
           "instruction times over %u traced step%s)\n",
           backend ? backend : "?", comm ? comm : "?", d->n_iterations,
           d->n_iterations == 1 ? "" : "s", d->n_trace_steps, d->n_trace_steps == 1 ? "" : "s");
  } else {
    const cJSON *sim = cJSON_GetObjectItemCaseSensitive(m, "simulation");
    const char *prof = metrics_string(sim, "profile");
    const cJSON *fb = sim ? cJSON_GetObjectItemCaseSensitive(sim, "fallback_ops") : NULL;
    printf(" (piper-sim, profile %s", prof ? prof : "?");
    if (cJSON_IsNumber(fb))
      printf(", %.0f ops costed by roofline", fb->valuedouble);
    printf(")\n");
  }
}

static cJSON *json_side(const struct report_dir *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "dir", d->path);
  cJSON_AddStringToObject(o, "kind", d->kind);
  cJSON_AddStringToObject(o, "role", role(d));
  cJSON_AddStringToObject(o, "schedule", d->schedule);
  cJSON_AddStringToObject(o, "program_file", d->program_file);
  cJSON_AddNumberToObject(o, "iterations", d->n_iterations);
  cJSON_AddNumberToObject(o, "trace_devices", d->trace_devices);
  cJSON_AddNumberToObject(o, "trace_steps", d->n_trace_steps);
  const cJSON *sim = cJSON_GetObjectItemCaseSensitive(d->metrics, "simulation");
  if (sim) {
    const char *prof = metrics_string(sim, "profile");
    if (prof)
      cJSON_AddStringToObject(o, "profile", prof);
  }
  const char *backend = metrics_string(d->metrics, "backend");
  if (backend)
    cJSON_AddStringToObject(o, "backend", backend);
  return o;
}

/* How memory is printed: GiB when either side reaches one, else MiB. */
struct memory_unit {
  double scale; /* bytes to the unit */
  const char *name;
};

static struct memory_unit memory_unit_of(const struct report_dir *A, const struct report_dir *B) {
  double peak = fmax(peak_max(A), peak_max(B));
  bool gib = peak >= (double)(1ull << 30);
  return (struct memory_unit){1.0 / (double)(gib ? 1ull << 30 : 1ull << 20), gib ? "GiB" : "MiB"};
}

/* The comparison's JSON: both sides and the plan they share. */
static cJSON *json_header(const struct report_dir *A, const struct report_dir *B) {
  cJSON *out = cJSON_CreateObject();
  cJSON_AddStringToObject(out, "version", PIPER_VERSION);
  cJSON_AddItemToObject(out, "a", json_side(A));
  cJSON_AddItemToObject(out, "b", json_side(B));
  cJSON_AddStringToObject(out, "model", A->model);
  cJSON_AddNumberToObject(out, "pp", A->pp);
  cJSON_AddNumberToObject(out, "dp", A->dp);
  cJSON_AddNumberToObject(out, "n_devices", A->n_devices);
  cJSON_AddNumberToObject(out, "num_microbatches", A->num_microbatches);
  return out;
}

static void print_header(const struct report_dir *A, const struct report_dir *B) {
  printf("piper-compare: %s, %s", A->model, A->schedule);
  if (strcmp(A->schedule, B->schedule) != 0)
    printf(" (B: %s)", B->schedule);
  printf(", pp %u x dp %u (%u devices), %u micro-batches of %lld x %lld tokens, same program "
         "(%s)\n",
         A->pp, A->dp, A->n_devices, A->num_microbatches, (long long)A->micro_batch_size,
         (long long)A->seq_len, A->program_file);
  describe("A", A);
  describe("B", B);
}

/* The run as a whole: time, throughput, MFU, means over devices, peak memory. */
static void compare_global(const struct report_dir *A, const struct report_dir *B,
                           struct memory_unit mem, cJSON *out) {
  char label[96];
  fprintf(text_out, "\n%-36s %14s %14s %10s\n", "", "A", "B", "B/A");
  cJSON *g = cJSON_AddObjectToObject(out, "global");
  print_row(2, "iteration time (ms)", A->iteration_time_s, B->iteration_time_s, 1e3);
  add_row(g, "iteration_time_s", A->iteration_time_s, B->iteration_time_s);
  print_row(2, "  std over steps (ms)", A->iteration_time_std_s, B->iteration_time_std_s, 1e3);
  add_row(g, "iteration_time_std_s", A->iteration_time_std_s, B->iteration_time_std_s);
  print_row(2, "throughput (tokens/s)", A->throughput_tokens_per_s, B->throughput_tokens_per_s, 1);
  add_row(g, "throughput_tokens_per_s", A->throughput_tokens_per_s, B->throughput_tokens_per_s);
  print_row(2, "MFU (%)", A->mfu, B->mfu, 100);
  add_row(g, "mfu", A->mfu, B->mfu);
  const size_t bubble_off = offsetof(struct report_device, bubble_fraction);
  const size_t exposed_off = offsetof(struct report_device, exposed_comm_s);
  const size_t overlap_off = offsetof(struct report_device, overlap_fraction);
  print_row(2, "bubble (%, mean of devices)", mean_of(A, bubble_off), mean_of(B, bubble_off), 100);
  add_row(g, "bubble_fraction_mean", mean_of(A, bubble_off), mean_of(B, bubble_off));
  print_row(2, "exposed comm (ms, mean)", mean_of(A, exposed_off), mean_of(B, exposed_off), 1e3);
  add_row(g, "exposed_comm_s_mean", mean_of(A, exposed_off), mean_of(B, exposed_off));
  print_row(2, "overlap (%, mean)", mean_of(A, overlap_off), mean_of(B, overlap_off), 100);
  add_row(g, "overlap_fraction_mean", mean_of(A, overlap_off), mean_of(B, overlap_off));
  snprintf(label, sizeof label, "peak memory (%s, max)", mem.name);
  print_row(2, label, peak_max(A), peak_max(B), mem.scale);
  add_row(g, "peak_memory_bytes_max", peak_max(A), peak_max(B));
}

static cJSON *json_device(uint32_t i, const struct report_device *a,
                          const struct report_device *b) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "device", i);
  cJSON_AddNumberToObject(o, "pp_rank", a->pp_rank);
  cJSON_AddNumberToObject(o, "dp_rank", a->dp_rank);
  add_row(o, "busy_s", a->compute_s, b->compute_s);
  add_row(o, "comm_s", a->comm_s, b->comm_s);
  add_row(o, "bubble_fraction", a->bubble_fraction, b->bubble_fraction);
  add_row(o, "exposed_comm_s", a->exposed_comm_s, b->exposed_comm_s);
  add_row(o, "overlap_fraction", a->overlap_fraction, b->overlap_fraction);
  add_row(o, "peak_memory_bytes", (double)a->peak_memory_bytes, (double)b->peak_memory_bytes);
  cJSON *bd = cJSON_AddObjectToObject(o, "memory_breakdown_bytes");
  for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
    add_row(bd, report_mem_kind_name((enum report_mem_kind)k), (double)a->peak_breakdown[k],
            (double)b->peak_breakdown[k]);
  return o;
}

static void print_device(uint32_t i, const struct report_device *a, const struct report_device *b,
                         struct memory_unit mem) {
  char label[96];
  fprintf(text_out, "  device %u (pp %d, dp %d)\n", i, a->pp_rank, a->dp_rank);
  print_row(4, "busy (ms)", a->compute_s, b->compute_s, 1e3);
  print_row(4, "communication (ms)", a->comm_s, b->comm_s, 1e3);
  print_row(4, "bubble (%)", a->bubble_fraction, b->bubble_fraction, 100);
  print_row(4, "exposed comm (ms)", a->exposed_comm_s, b->exposed_comm_s, 1e3);
  print_row(4, "overlap (%)", a->overlap_fraction, b->overlap_fraction, 100);
  snprintf(label, sizeof label, "peak memory (%s)", mem.name);
  print_row(4, label, (double)a->peak_memory_bytes, (double)b->peak_memory_bytes, mem.scale);
  for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
    if (a->peak_breakdown[k] || b->peak_breakdown[k])
      print_row(6, report_mem_kind_name((enum report_mem_kind)k), (double)a->peak_breakdown[k],
                (double)b->peak_breakdown[k], mem.scale);
}

/* Per device: all of them in JSON; on screen all up to 16, else dp rank 0 of each pp rank. */
static void compare_devices(const struct report_dir *A, const struct report_dir *B,
                            struct memory_unit mem, cJSON *out) {
  bool all = A->n_devices <= 16;
  fprintf(text_out, "\nper device%s\n", all ? "" : " (dp rank 0 of each pipeline rank; --json has all)");
  cJSON *devs = cJSON_AddArrayToObject(out, "devices");
  for (uint32_t i = 0; i < A->n_devices; i++) {
    const struct report_device *a = &A->devices[i], *b = &B->devices[i];
    cJSON_AddItemToArray(devs, json_device(i, a, b));
    if (all || a->dp_rank <= 0)
      print_device(i, a, b, mem);
  }
}

/* Instructions of a kind per step of the trace. */
static double per_step(const struct report_trace_kind *k, const struct report_dir *d) {
  return k ? (double)k->count / (d->n_trace_steps ? d->n_trace_steps : 1) : 0;
}

/* One kind of instruction: mean durations on both sides over every traced step (either may
 * lack it), and how many ran per step. */
static void compare_instruction_kind(const struct report_dir *A,
                                     const struct report_trace_kind *use_a,
                                     const struct report_dir *B,
                                     const struct report_trace_kind *use_b, cJSON *ins) {
  double ma = use_a && use_a->count ? use_a->total_s / (double)use_a->count : NAN;
  double mb = use_b && use_b->count ? use_b->total_s / (double)use_b->count : NAN;
  const char *name = use_a ? use_a->name : use_b->name;
  fprintf(text_out, "  %-34s", name);
  print_value(ma * 1e6);
  print_value(mb * 1e6);
  double r = ratio(ma, mb);
  if (isfinite(r))
    fprintf(text_out, " %10.4g", r);
  else
    fprintf(text_out, " %10s", "-");
  fprintf(text_out, "   %g / %g\n", per_step(use_a, A), per_step(use_b, B));
  cJSON *o = json_pair(ma, mb);
  cJSON_AddStringToObject(o, "name", name);
  cJSON_AddNumberToObject(o, "count_a", per_step(use_a, A));
  cJSON_AddNumberToObject(o, "count_b", per_step(use_b, B));
  cJSON_AddItemToArray(ins, o);
}

/* Instructions: the union of both traces' kinds, in the readers' order. */
static void compare_instructions(const struct report_dir *A, const struct report_dir *B,
                                 cJSON *out) {
  fprintf(text_out, "\nmean duration per instruction (us)   %14s %14s %10s   per step A / B\n", "A", "B",
         "B/A");
  cJSON *ins = cJSON_AddArrayToObject(out, "instructions");
  uint32_t ia = 0, ib = 0;
  while (ia < A->n_trace_kinds || ib < B->n_trace_kinds) {
    const struct report_trace_kind *ka = ia < A->n_trace_kinds ? &A->trace_kinds[ia] : NULL;
    const struct report_trace_kind *kb = ib < B->n_trace_kinds ? &B->trace_kinds[ib] : NULL;
    int c = !ka                    ? 1
            : !kb                  ? -1
            : ka->rank != kb->rank ? (ka->rank < kb->rank ? -1 : 1)
                                   : strcmp(ka->name, kb->name);
    const struct report_trace_kind *use_a = c <= 0 ? ka : NULL, *use_b = c >= 0 ? kb : NULL;
    ia += use_a != NULL;
    ib += use_b != NULL;
    compare_instruction_kind(A, use_a, B, use_b, ins);
  }
}

/* ---- node by node --------------------------------------------------------------------- */

/* numpy's default quantile (linear between the closest ranks) of sorted x. */
static double quantile(const double *x, uint32_t n, double q) {
  if (n == 0)
    return NAN;
  double h = (n - 1) * q;
  uint32_t lo = (uint32_t)floor(h);
  if (lo + 1 >= n || h == lo || !isfinite(x[lo + 1]))
    return h == lo || lo + 1 >= n ? x[lo] : x[lo + 1];
  return x[lo] + (h - lo) * (x[lo + 1] - x[lo]);
}

static void json_number_or_null(cJSON *o, const char *key, double v) {
  if (isfinite(v))
    cJSON_AddNumberToObject(o, key, v);
  else
    cJSON_AddNullToObject(o, key);
}

static void print_percent(double v) {
  if (isfinite(v))
    fprintf(text_out, " %12.1f%%", v * 100);
  else
    fprintf(text_out, " %13s", "inf");
}

/* One summary row: the pairs whose A node is of kind `kind` (every pair when kind < 0). */
static void summarise_pairs(const struct report_node_pair *pairs, uint32_t n, int64_t kind,
                            const char *label, cJSON *rows) {
  double *ratio = g_new(double, n + 1), *error = g_new(double, n + 1);
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++)
    if (kind < 0 || pairs[i].a->kind == (uint32_t)kind) {
      ratio[m] = pairs[i].ratio;
      error[m++] = pairs[i].error;
    }
  if (m > 0) {
    qsort(ratio, m, sizeof *ratio, piper_cmp_double);
    qsort(error, m, sizeof *error, piper_cmp_double);
    double med_r = quantile(ratio, m, 0.5), med_e = quantile(error, m, 0.5);
    double p90_e = quantile(error, m, 0.9);
    fprintf(text_out, "  %-34s %8u %12.4g", label, m, med_r);
    print_percent(med_e);
    print_percent(p90_e);
    fprintf(text_out, "\n");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", label);
    cJSON_AddNumberToObject(o, "nodes", m);
    json_number_or_null(o, "median_ratio", med_r);
    json_number_or_null(o, "median_error", med_e);
    json_number_or_null(o, "p90_error", p90_e);
    json_number_or_null(o, "max_error", error[m - 1]);
    cJSON_AddItemToArray(rows, o);
  }
  g_free(ratio);
  g_free(error);
}

/* The worst pairs, named. */
static void worst_pairs(const struct report_dir *A, const struct report_node_pair *pairs,
                        uint32_t n, cJSON *worst) {
  uint32_t show = n < 10 ? n : 10;
  char title[64];
  snprintf(title, sizeof title, "worst %u node%s by error", show, show == 1 ? "" : "s");
  fprintf(text_out, "\n%-36s %6s %4s %14s %14s %10s\n", title, "device", "mb", "A (us)", "B (us)", "B/A");
  for (uint32_t i = 0; i < show; i++) {
    const struct report_node_pair *p = &pairs[i];
    fprintf(text_out, "  %-34.34s %6u", p->a->name, p->a->device);
    if (p->a->micro_batch >= 0)
      fprintf(text_out, " %4d", p->a->micro_batch);
    else
      fprintf(text_out, " %4s", "-");
    print_value(p->a->median_s * 1e6);
    print_value(p->b->median_s * 1e6);
    if (isfinite(p->ratio))
      fprintf(text_out, " %10.4g\n", p->ratio);
    else
      fprintf(text_out, " %10s\n", "-");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", p->a->name);
    cJSON_AddStringToObject(o, "kind", A->trace_kinds[p->a->kind].name);
    cJSON_AddNumberToObject(o, "device", p->a->device);
    cJSON_AddNumberToObject(o, "micro_batch", p->a->micro_batch);
    cJSON_AddNumberToObject(o, "a", p->a->median_s);
    cJSON_AddNumberToObject(o, "b", p->b->median_s);
    json_number_or_null(o, "ratio", p->ratio);
    json_number_or_null(o, "error", p->error);
    cJSON_AddItemToArray(worst, o);
  }
}

/* Instructions paired by (device, IR node, micro-batch): medians over each side's traced steps,
 * the error's median and p90 over all pairs and per kind, and the worst ten. */
static void compare_nodes(const struct report_dir *A, const struct report_dir *B, cJSON *out) {
  uint32_t n = 0, only_a = 0, only_b = 0;
  struct report_node_pair *pairs = report_pair_nodes(A, B, &n, &only_a, &only_b);
  fprintf(text_out, "\nper node (device, IR node, micro-batch): median duration over the traced steps (A %u, "
         "B %u);\n  %u nodes paired, %u only in A, %u only in B; error = max(B/A, A/B) - 1\n",
         A->n_trace_steps, B->n_trace_steps, n, only_a, only_b);
  cJSON *o = cJSON_AddObjectToObject(out, "nodes");
  cJSON_AddNumberToObject(o, "paired", n);
  cJSON_AddNumberToObject(o, "only_a", only_a);
  cJSON_AddNumberToObject(o, "only_b", only_b);
  cJSON_AddNumberToObject(o, "steps_a", A->n_trace_steps);
  cJSON_AddNumberToObject(o, "steps_b", B->n_trace_steps);
  cJSON_AddStringToObject(o, "statistic", "median over steps");
  cJSON_AddStringToObject(o, "error", "max(B/A, A/B) - 1");
  fprintf(text_out, "  %-34s %8s %12s %13s %13s\n", "kind", "nodes", "median B/A", "median error",
         "p90 error");
  cJSON *rows = cJSON_AddArrayToObject(o, "summary");
  summarise_pairs(pairs, n, -1, "all", rows);
  for (uint32_t k = 0; k < A->n_trace_kinds; k++)
    summarise_pairs(pairs, n, k, A->trace_kinds[k].name, rows);
  worst_pairs(A, pairs, n, cJSON_AddArrayToObject(o, "worst"));
  g_free(pairs);
}

/* The verdict: a symmetric band around 1, so it does not matter which side is the prediction.
 * Returns the ratio B/A; *within is false when --tolerance is given and the ratio is out. */
static double verdict(const struct report_dir *A, const struct report_dir *B, double tolerance,
                      bool *within, cJSON *out) {
  double r = ratio(A->iteration_time_s, B->iteration_time_s);
  if (A->iteration_time_s == 0 && B->iteration_time_s == 0)
    r = 1;
  *within = true;
  if (isfinite(r))
    cJSON_AddNumberToObject(out, "iteration_time_ratio", r);
  else
    cJSON_AddNullToObject(out, "iteration_time_ratio");
  if (isfinite(tolerance)) {
    double lo = 1 / (1 + tolerance), hi = 1 + tolerance;
    *within = isfinite(r) && r >= lo && r <= hi;
    cJSON_AddNumberToObject(out, "tolerance", tolerance);
    cJSON_AddBoolToObject(out, "within_tolerance", *within);
    printf("\niteration time B/A %.4g: %s [%.4g, %.4g] (--tolerance %g)\n", r,
           *within ? "within" : "outside", lo, hi, tolerance);
  } else {
    cJSON_AddNullToObject(out, "tolerance");
    cJSON_AddNullToObject(out, "within_tolerance");
  }
  return r;
}

/* Prints the comparison, writes --json; the exit status. */
static int compare(const struct compare_cli *a, const struct report_dir *A,
                   const struct report_dir *B) {
  cJSON *out = json_header(A, B);
  print_header(A, B);
  struct memory_unit mem = memory_unit_of(A, B);
  text_out = stdout;
  compare_global(A, B, mem, out);
  FILE *none = a->quiet ? fopen("/dev/null", "w") : NULL;
  text_out = none ? none : stdout;
  compare_devices(A, B, mem, out);
  compare_instructions(A, B, out);
  compare_nodes(A, B, out);
  text_out = stdout;
  if (none)
    fclose(none);
  bool within = true;
  double r = verdict(A, B, a->tolerance, &within, out);
  int rc = within ? 0 : 1;
  fflush(stdout);
  GError *err = NULL;
  char *chart = a->chart_path ? g_strdup(a->chart_path) : NULL;
  if (!chart && a->out_dir)
    chart = g_build_filename(a->out_dir, "compare.png", NULL);
  if (!chart && a->json_path) {
    char *dir = g_path_get_dirname(a->json_path);
    chart = g_build_filename(dir, "compare.png", NULL);
    g_free(dir);
  }
  if (chart)
    cJSON_AddStringToObject(out, "chart", chart);
  g_autofree char *json = a->json_path ? g_strdup(a->json_path)
                         : a->out_dir ? g_build_filename(a->out_dir, "compare.json", NULL) : NULL;
  if (a->out_dir && g_mkdir_with_parents(a->out_dir, 0755) != 0)
    g_set_error(&err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create: %s", a->out_dir,
                g_strerror(errno));
  bool wrote = !err && (!json || json_write_file(json, out, &err)) &&
               (!chart || chart_compare(A, B, chart, &err));
  g_free(chart);
  if (!wrote)
    rc = piper_error_exit(program.name, err);
  else if (rc == 1)
    fprintf(stderr,
            "piper-compare: error: the prediction is off: iteration time B/A = %.4g (%s %s, %s "
            "%s) is outside [%.4g, %.4g] (--tolerance %g)\n",
            r, role(A), a->dirs[0], role(B), a->dirs[1], 1 / (1 + a->tolerance), 1 + a->tolerance,
            a->tolerance);
  cJSON_Delete(out);
  return rc;
}

int main(int argc, char **argv) {
  struct compare_cli a = {.tolerance = NAN};
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  if (a.n_dirs < 2)
    return piper_usage_error(program.name, "%s", "give two run directories, A_DIR and B_DIR");
  GError *err = NULL;
  struct report_dir *A = report_dir_load(a.dirs[0], &err);
  struct report_dir *B = A ? report_dir_load(a.dirs[1], &err) : NULL;
  if (!A || !B || !check_same_plan(A, B, &err))
    rc = piper_error_exit(program.name, err);
  else
    rc = compare(&a, A, B);
  report_dir_free(A);
  report_dir_free(B);
  return rc;
}
