/* report reading: a run directory back into the figures piper-compare needs (the inverse of
 * write.c). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

#include "../base/json.h"
#include "../base/version.h"

struct report_dir_reader {
  struct report_dir *d;
  GHashTable *kind_index; /* row name -> index + 1 into kinds */
  GArray *kinds;          /* struct report_trace_kind */
  bool *device_seen;      /* pid has instruction events */
  GHashTable *node_index; /* a node's identity (trace_node_of) -> index + 1 into nodes */
  GHashTable *name_count; /* "<pid>\x1f<name>" -> nodes of that name so far */
  GHashTable *occurrence; /* "<pid>\x1f<step>\x1f<name>" -> events so far (traces without
                             "node") */
  GArray *nodes;          /* struct report_trace_node */
  GArray *events;         /* struct report_trace_event, step as an index into steps */
  GHashTable *step_index; /* step number -> index + 1 into steps */
  GArray *steps;          /* uint32_t step numbers, in order of first appearance */
  GArray *threads;        /* struct report_trace_thread */
};

void report_dir_free(struct report_dir *d) {
  if (!d)
    return;
  g_free(d->path);
  g_free(d->program_file);
  cJSON_Delete(d->program);
  cJSON_Delete(d->metrics);
  g_free(d->devices);
  g_free(d->trace_kinds);
  for (uint32_t i = 0; i < d->n_trace_nodes; i++)
    g_free(d->trace_nodes[i].name);
  g_free(d->trace_nodes);
  g_free(d->trace_events);
  g_free(d->trace_steps);
  g_free(d->trace_threads);
  g_free(d);
}

static bool get_u32(const cJSON *o, const char *key, int64_t lo, int64_t hi, uint32_t *out,
                    const char *ctx, GError **err) {
  int64_t v = 0;
  if (!json_get_int(o, key, true, lo, hi, &v, ctx, err))
    return false;
  *out = (uint32_t)v;
  return true;
}

/* "kind": given, or (older files) told by what only one writer puts there. */
static bool metrics_kind(struct report_dir *d, const char *path, GError **err) {
  const cJSON *m = d->metrics;
  if (!json_get_string(m, "kind", false, &d->kind, path, err))
    return false;
  if (!d->kind && cJSON_GetObjectItemCaseSensitive(m, "simulation"))
    d->kind = "sim";
  else if (!d->kind && (cJSON_GetObjectItemCaseSensitive(m, "losses") ||
                        cJSON_GetObjectItemCaseSensitive(m, "backend")))
    d->kind = "exec";
  if (!d->kind)
    return piper_input_error(err, "%s: key \"kind\" is required (or a \"simulation\" or \"losses\" key)",
                     path);
  if (strcmp(d->kind, "sim") != 0 && strcmp(d->kind, "exec") != 0)
    return piper_input_error(err, "%s: key \"kind\": \"%s\" is not \"sim\" or \"exec\"", path, d->kind);
  return true;
}

/* The run's global figures: model, layout, iteration time, throughput, MFU. */
static bool metrics_run_figures(struct report_dir *d, const char *path, GError **err) {
  const cJSON *m = d->metrics;
  int64_t mbs = 0, seq = 0;
  if (!json_get_string(m, "model", true, &d->model, path, err) ||
      !json_get_string(m, "schedule", true, &d->schedule, path, err) ||
      !get_u32(m, "pp", 1, IR_MAX_DEVICES, &d->pp, path, err) ||
      !get_u32(m, "dp", 1, IR_MAX_DEVICES, &d->dp, path, err) ||
      !get_u32(m, "n_devices", 1, IR_MAX_DEVICES, &d->n_devices, path, err) ||
      !get_u32(m, "num_microbatches", 1, INT32_MAX, &d->num_microbatches, path, err) ||
      !json_get_int(m, "micro_batch_size", true, 1, INT64_MAX / 2, &mbs, path, err) ||
      !json_get_int(m, "seq_len", true, 1, INT64_MAX / 2, &seq, path, err) ||
      !json_get_double(m, "iteration_time_s", true, 0, 1e12, &d->iteration_time_s, path, err) ||
      !json_get_double(m, "iteration_time_std_s", false, 0, 1e12, &d->iteration_time_std_s, path,
                       err) ||
      !json_get_double(m, "throughput_tokens_per_s", true, 0, 1e30, &d->throughput_tokens_per_s,
                       path, err) ||
      !json_get_double(m, "tokens_per_iteration", true, 0, 1e30, &d->tokens_per_iteration, path,
                       err) ||
      !json_get_double(m, "model_flops_per_iteration", true, 0, 1e30, &d->model_flops_per_iteration,
                       path, err))
    return false;
  d->micro_batch_size = mbs;
  d->seq_len = seq;
  d->n_iterations = 1;
  const cJSON *its = cJSON_GetObjectItemCaseSensitive(m, "iteration_times_s");
  if (its && !cJSON_IsArray(its))
    return piper_input_error(err, "%s: key \"iteration_times_s\" must be an array", path);
  if (its && cJSON_GetArraySize(its) > 0)
    d->n_iterations = (uint32_t)cJSON_GetArraySize(its);
  d->mfu = NAN;
  const cJSON *mfu = cJSON_GetObjectItemCaseSensitive(m, "mfu");
  if (mfu && !cJSON_IsNull(mfu) && !json_get_double(m, "mfu", false, 0, 1e6, &d->mfu, path, err))
    return false;
  return true;
}

/* devices[i].memory_breakdown_bytes: bytes by kind at the peak. */
static bool metrics_breakdown(const cJSON *o, struct report_device *rd, const char *ctx,
                              GError **err) {
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "memory_breakdown_bytes");
  if (!cJSON_IsObject(b))
    return piper_input_error(err, "%s: key \"memory_breakdown_bytes\" is required (an object)", ctx);
  char bctx[600];
  snprintf(bctx, sizeof bctx, "%s.memory_breakdown_bytes", ctx);
  for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++) {
    double v = 0;
    if (!json_get_double(b, report_mem_kind_name((enum report_mem_kind)k), false, 0, 1e30, &v,
                         bctx, err))
      return false;
    rd->peak_breakdown[k] = (uint64_t)v;
  }
  return true;
}

/* devices[i]: its ranks, the derived figures and its peak memory. */
static bool metrics_device(const cJSON *o, uint32_t i, struct report_device *rd, const char *ctx,
                           GError **err) {
  int64_t dev = 0, pr = 0, dr = 0;
  double peak = 0;
  if (!cJSON_IsObject(o))
    return piper_input_error(err, "%s: must be an object", ctx);
  /* fractions are derived as 1 - x / iteration time: allow their rounding */
  const double lo_f = -1e-9, hi_f = 1 + 1e-9;
  if (!json_get_int(o, "device", true, 0, IR_MAX_DEVICES - 1, &dev, ctx, err) ||
      !json_get_int(o, "pp_rank", true, -1, IR_MAX_DEVICES, &pr, ctx, err) ||
      !json_get_int(o, "dp_rank", true, -1, IR_MAX_DEVICES, &dr, ctx, err) ||
      !json_get_double(o, "busy_s", true, 0, 1e12, &rd->compute_s, ctx, err) ||
      !json_get_double(o, "comm_s", true, 0, 1e12, &rd->comm_s, ctx, err) ||
      !json_get_double(o, "idle_s", false, 0, 1e12, &rd->idle_s, ctx, err) ||
      !json_get_double(o, "bubble_fraction", true, lo_f, hi_f, &rd->bubble_fraction, ctx, err) ||
      !json_get_double(o, "exposed_comm_s", true, 0, 1e12, &rd->exposed_comm_s, ctx, err) ||
      !json_get_double(o, "overlap_fraction", true, lo_f, hi_f, &rd->overlap_fraction, ctx,
                       err) ||
      !json_get_double(o, "peak_memory_bytes", true, 0, 1e30, &peak, ctx, err))
    return false;
  if (dev != (int64_t)i)
    return piper_input_error(err, "%s: key \"device\" is %lld, expected %u (devices in order)", ctx,
                     (long long)dev, i);
  rd->device = i;
  rd->pp_rank = (int32_t)pr;
  rd->dp_rank = (int32_t)dr;
  rd->peak_memory_bytes = (uint64_t)peak;
  return metrics_breakdown(o, rd, ctx, err);
}

/* "devices": one entry per device, in device order. */
static bool metrics_devices(struct report_dir *d, const char *path, GError **err) {
  const cJSON *devs = cJSON_GetObjectItemCaseSensitive(d->metrics, "devices");
  if (!cJSON_IsArray(devs))
    return piper_input_error(err, "%s: key \"devices\" is required (an array)", path);
  if ((uint32_t)cJSON_GetArraySize(devs) != d->n_devices)
    return piper_input_error(err, "%s: key \"devices\" has %d entries, \"n_devices\" says %u", path,
                     cJSON_GetArraySize(devs), d->n_devices);
  d->devices = g_new0(struct report_device, d->n_devices + 1);
  uint32_t i = 0;
  const cJSON *o;
  cJSON_ArrayForEach(o, devs) {
    char ctx[512];
    snprintf(ctx, sizeof ctx, "%s: devices[%u]", path, i);
    if (!metrics_device(o, i, &d->devices[i], ctx, err))
      return false;
    i++;
  }
  return true;
}

static bool read_metrics(struct report_dir *d, const char *path, GError **err) {
  d->metrics = json_parse_file_strict(path, err);
  if (!d->metrics)
    return false;
  if (!cJSON_IsObject(d->metrics))
    return piper_input_error(err, "%s: must be a JSON object", path);
  return metrics_kind(d, path, err) && metrics_run_figures(d, path, err) &&
         metrics_devices(d, path, err);
}

/* results.csv must be the one written with metrics.json: same model, schedule, dp rows and
 * iteration time. A mix of files from two runs would otherwise compare nonsense. */
static bool read_results(struct report_dir *d, const char *path, GError **err) {
  GStatBuf st;
  if (g_stat(path, &st) != 0)
    return piper_input_error(err, "%s: cannot open: %s", path, strerror(errno));
  if ((guint64)st.st_size > JSON_MAX_FILE_BYTES)
    return piper_input_error(err, "%s: file larger than %u MiB", path, JSON_MAX_FILE_BYTES >> 20);
  char *text = NULL;
  gsize len = 0;
  GError *e = NULL;
  if (!g_file_get_contents(path, &text, &len, &e)) {
    piper_input_error(err, "%s: cannot read: %s", path, e->message);
    g_error_free(e);
    return false;
  }
  bool ok = false;
  char **lines = g_strsplit(text, "\n", -1);
  char **head = NULL;
  static const char *const need[] = {"dp_rank",          "model", "schedule", "iter_time_mean_s",
                                     "num_microbatches", NULL};
  int col[5];
  uint32_t n_cols = 0, rows = 0;
  if (memchr(text, '\0', len)) {
    piper_input_error(err, "%s: not a text file (NUL byte)", path);
    goto out;
  }
  if (!lines[0] || !*g_strstrip(lines[0])) {
    piper_input_error(err, "%s: empty (a header line is required)", path);
    goto out;
  }
  head = g_strsplit(lines[0], ",", -1);
  n_cols = g_strv_length(head);
  for (int k = 0; need[k]; k++) {
    col[k] = -1;
    for (uint32_t c = 0; c < n_cols; c++)
      if (strcmp(head[c], need[k]) == 0)
        col[k] = (int)c;
    if (col[k] < 0) {
      piper_input_error(err, "%s: line 1: column \"%s\" is missing", path, need[k]);
      goto out;
    }
  }
  for (uint32_t l = 1; lines[l]; l++) {
    g_strstrip(lines[l]);
    if (!*lines[l])
      continue;
    char **f = g_strsplit(lines[l], ",", -1);
    uint32_t nf = g_strv_length(f);
    uint32_t dp_rank = 0, mbs = 0;
    double t = 0;
    const char *what = NULL;
    if (nf != n_cols)
      what = "has another number of fields than the header";
    else if (!piper_parse_u32(f[col[0]], 0, IR_MAX_DEVICES, &dp_rank) || dp_rank != rows)
      what = "dp_rank is not the row's index";
    else if (strcmp(f[col[1]], d->model) != 0)
      what = "model differs from metrics.json's";
    else if (strcmp(f[col[2]], d->schedule) != 0)
      what = "schedule differs from metrics.json's";
    else if (!piper_parse_double(f[col[3]], 0, 1e12, &t) ||
             fabs(t - d->iteration_time_s) > 1e-6 * d->iteration_time_s + 1e-12)
      what = "iter_time_mean_s is not a number or differs from metrics.json's iteration_time_s";
    else if (!piper_parse_u32(f[col[4]], 1, INT32_MAX, &mbs) || mbs != d->num_microbatches)
      what = "num_microbatches is not a number or differs from metrics.json's";
    g_strfreev(f);
    if (what) {
      piper_input_error(err, "%s: line %u: %s", path, l + 1, what);
      goto out;
    }
    rows++;
  }
  if (rows != d->dp) {
    piper_input_error(err, "%s: %u rows, metrics.json says dp %u (one row per dp rank)", path, rows, d->dp);
    goto out;
  }
  d->results_rows = rows;
  ok = true;
out:
  g_strfreev(head);
  g_strfreev(lines);
  g_free(text);
  return ok;
}

/* "<schedule>_pp<R>_mbs<M>.json" */
static bool is_program_file_name(const char *name) {
  if (!g_str_has_suffix(name, ".json"))
    return false;
  const char *pp = g_strrstr(name, "_pp");
  if (!pp || pp == name)
    return false;
  const char *c = pp + 3;
  if (!g_ascii_isdigit(*c))
    return false;
  while (g_ascii_isdigit(*c))
    c++;
  if (strncmp(c, "_mbs", 4) != 0 || !g_ascii_isdigit(c[4]))
    return false;
  c += 4;
  while (g_ascii_isdigit(*c))
    c++;
  return strcmp(c, ".json") == 0;
}

static bool read_program(struct report_dir *d, GError **err) {
  char *expect = g_strdup_printf("%s_pp%u_mbs%u.json", d->schedule, d->pp, d->num_microbatches);
  char *path = g_build_filename(d->path, expect, NULL);
  if (g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
    d->program_file = expect;
  } else {
    g_free(expect);
    /* the name's R is the writer's pipeline ranks, which need not be metrics.json's pp */
    GDir *dir = g_dir_open(d->path, 0, NULL);
    GPtrArray *found = g_ptr_array_new_with_free_func(g_free);
    const char *name;
    while (dir && (name = g_dir_read_name(dir)))
      if (is_program_file_name(name))
        g_ptr_array_add(found, g_strdup(name));
    if (dir)
      g_dir_close(dir);
    if (found->len == 1) {
      d->program_file = g_strdup(g_ptr_array_index(found, 0));
    } else if (found->len == 0) {
      piper_input_error(err, "%s: no directive program (<schedule>_pp<R>_mbs<M>.json) in the run directory",
                d->path);
    } else {
      piper_input_error(err, "%s: %u files look like the directive program (%s, %s, ...); keep one",
                d->path, found->len, (const char *)g_ptr_array_index(found, 0),
                (const char *)g_ptr_array_index(found, 1));
    }
    g_ptr_array_free(found, TRUE);
    g_free(path);
    if (!d->program_file)
      return false;
    path = g_build_filename(d->path, d->program_file, NULL);
  }
  d->program = json_parse_file_strict(path, err);
  if (d->program && !cJSON_IsArray(d->program)) {
    piper_input_error(err, "%s: a directive program must be a JSON array", path);
    cJSON_Delete(d->program);
    d->program = NULL;
  }
  g_free(path);
  return d->program != NULL;
}

/* trace.json is read without building its whole tree: a large simulated trace holds millions of
 * events. A small scanner walks the top-level object and the traceEvents array; each event's
 * own text is then parsed (and so checked) by cJSON. */
struct trace_scan {
  const char *path, *buf;
  size_t len, pos;
  GError **err;
};

static bool scan_fail(struct trace_scan *s, size_t at, const char *what) {
  int line = 1, col = 1;
  for (size_t i = 0; i < at && i < s->len; i++) {
    if (s->buf[i] == '\n') {
      line++;
      col = 1;
    } else {
      col++;
    }
  }
  return piper_input_error(s->err, "%s:%d:%d: malformed JSON: %s", s->path, line, col, what);
}

static void scan_space(struct trace_scan *s) {
  while (s->pos < s->len && (s->buf[s->pos] == ' ' || s->buf[s->pos] == '\n' ||
                             s->buf[s->pos] == '\r' || s->buf[s->pos] == '\t'))
    s->pos++;
}

static bool scan_string(struct trace_scan *s) {
  size_t start = s->pos++;
  while (s->pos < s->len) {
    char c = s->buf[s->pos];
    if (c == '\\')
      s->pos += 2;
    else if (c == '"') {
      s->pos++;
      return true;
    } else
      s->pos++;
  }
  return scan_fail(s, start, "unterminated string");
}

/* Moves past one value. Brackets are only counted, not matched: cJSON checks what is kept. */
static bool scan_value(struct trace_scan *s) {
  scan_space(s);
  if (s->pos >= s->len)
    return scan_fail(s, s->pos, "unexpected end of file");
  char c = s->buf[s->pos];
  if (c == '"')
    return scan_string(s);
  if (c == '{' || c == '[') {
    size_t start = s->pos;
    uint64_t depth = 0;
    while (s->pos < s->len) {
      c = s->buf[s->pos];
      if (c == '"') {
        if (!scan_string(s))
          return false;
        continue;
      }
      if (c == '{' || c == '[') {
        depth++;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) {
          s->pos++;
          return true;
        }
      }
      s->pos++;
    }
    return scan_fail(s, start, "unterminated object or array");
  }
  size_t start = s->pos;
  while (s->pos < s->len && (g_ascii_isalnum(s->buf[s->pos]) || s->buf[s->pos] == '.' ||
                             s->buf[s->pos] == '-' || s->buf[s->pos] == '+'))
    s->pos++;
  if (s->pos == start)
    return scan_fail(s, start, "expected a value");
  return true;
}

/* An event with a key twice would be read by its first value: refused, as every reader of a
 * JSON file refuses it (the name is built only for the message). */
static bool event_keys_once(struct trace_scan *s, const cJSON *ev, uint64_t i) {
  if (json_refuse_duplicate_keys(ev, s->path, NULL))
    return true;
  char *name = g_strdup_printf("%s: traceEvents[%" G_GUINT64_FORMAT "]", s->path, (guint64)i);
  json_refuse_duplicate_keys(ev, name, s->err);
  g_free(name);
  return false;
}

/* Parses buf[start, s->pos) as one JSON value. */
static cJSON *scan_parse(struct trace_scan *s, size_t start) {
  const char *end = NULL;
  cJSON *v = cJSON_ParseWithLengthOpts(s->buf + start, s->pos - start, &end, false);
  if (!v) {
    size_t at = end ? (size_t)(end - s->buf) : start;
    scan_fail(s, at, "malformed value");
    return NULL;
  }
  return v;
}

static uint32_t trace_kind_rank(const char *kind, const char *pass) {
  uint32_t p = IR_PASS_NONE;
  for (uint32_t i = 0; i < IR_PASS_NONE; i++)
    if (pass && strcmp(pass, ir_pass_name((enum ir_pass)i)) == 0)
      p = i;
  for (uint32_t k = 0; k < IR_NODE_KIND_COUNT; k++) {
    if (strcmp(kind, ir_node_kind_name((enum ir_node_kind)k)) != 0)
      continue;
    if (k == IR_NODE_COMPUTE)
      return p;
    if (k == IR_NODE_OPTIMIZER)
      return 1000;
    return 10 + 10 * k + p;
  }
  return 2000; /* a kind this build does not know: last, by name */
}

/* A stream's name (metadata event "thread_name"); a malformed one is only a missing label. */
static void trace_thread_name(struct report_dir_reader *rd, const cJSON *ev) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(ev, "name");
  const cJSON *pid = cJSON_GetObjectItemCaseSensitive(ev, "pid");
  const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  const cJSON *label = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "name") : NULL;
  if (!cJSON_IsString(name) || strcmp(name->valuestring, "thread_name") != 0 ||
      !cJSON_IsNumber(pid) || !cJSON_IsNumber(tid) || !cJSON_IsString(label) ||
      !(pid->valuedouble >= 0 && pid->valuedouble < rd->d->n_devices) ||
      !(tid->valuedouble >= 0 && tid->valuedouble <= REPORT_TRACE_MAX_TID))
    return;
  struct report_trace_thread t = {(uint32_t)pid->valuedouble, (uint32_t)tid->valuedouble, ""};
  g_strlcpy(t.name, label->valuestring, sizeof t.name);
  g_array_append_val(rd->threads, t);
}

/* The row of the instruction-kind table an event counts in (created on first use). */
static uint32_t trace_kind_of(struct report_dir_reader *rd, const char *kind, const char *pass) {
  char name[48];
  if (strcmp(kind, "compute") == 0)
    snprintf(name, sizeof name, "%s", pass ? pass : "compute");
  else if (strcmp(kind, "optimizer") == 0 || !pass)
    snprintf(name, sizeof name, "%s", kind);
  else
    snprintf(name, sizeof name, "%s %s", kind, pass);
  gpointer at = g_hash_table_lookup(rd->kind_index, name);
  if (!at) {
    struct report_trace_kind k = {.rank = trace_kind_rank(kind, pass)};
    snprintf(k.name, sizeof k.name, "%s", name);
    g_array_append_val(rd->kinds, k);
    at = GUINT_TO_POINTER(rd->kinds->len);
    g_hash_table_insert(rd->kind_index, g_strdup(name), at);
  }
  return GPOINTER_TO_UINT(at) - 1;
}

/* What the event's args say of its node besides kind and pass. */
struct trace_event_args {
  const char *kind, *pass;
  int64_t node, step, micro_batch, stage;
  double wait_us;
};

static bool trace_event_args(const cJSON *args, struct trace_event_args *ea, const char *ctx,
                             GError **err) {
  ea->kind = ea->pass = NULL;
  ea->step = 0; /* traces written before events carried their step hold one */
  ea->node = ea->micro_batch = ea->stage = -1;
  ea->wait_us = 0;
  return json_get_string(args, "kind", true, &ea->kind, ctx, err) &&
         json_get_double(args, "wait_us", false, 0, 1e18, &ea->wait_us, ctx, err) &&
         json_get_int(args, "node", false, 0, INT32_MAX, &ea->node, ctx, err) &&
         json_get_string(args, "PASS", false, &ea->pass, ctx, err) &&
         json_get_int(args, "step", false, 0, INT32_MAX, &ea->step, ctx, err) &&
         json_get_int(args, "MB", false, -1, INT32_MAX, &ea->micro_batch, ctx, err) &&
         json_get_int(args, "PP", false, -1, INT32_MAX, &ea->stage, ctx, err);
}

/* Bumps the counter of key in t; returns its value before. */
static uint32_t count_up(GHashTable *t, char *key) {
  uint32_t n = GPOINTER_TO_UINT(g_hash_table_lookup(t, key));
  g_hash_table_replace(t, key, GUINT_TO_POINTER(n + 1));
  return n;
}

/* The node of an event on device pid (created on first use). A node is its plan node index
 * (args.node); a trace written before events carried it has one step, in which the k-th event
 * of a name on a device is the k-th node of that name (names need not be unique: an
 * all-to-all's dispatch and combine share one). */
static uint32_t trace_node_of(struct report_dir_reader *rd, uint32_t pid, const char *name,
                              const struct trace_event_args *ea) {
  char *key;
  if (ea->node >= 0) {
    key = g_strdup_printf("%u\x1f#%lld", pid, (long long)ea->node);
  } else {
    uint32_t k = count_up(rd->occurrence,
                          g_strdup_printf("%u\x1f%lld\x1f%s", pid, (long long)ea->step, name));
    key = g_strdup_printf("%u\x1f%s\x1f%u", pid, name, k);
  }
  gpointer at = g_hash_table_lookup(rd->node_index, key);
  if (at) {
    g_free(key);
    return GPOINTER_TO_UINT(at) - 1;
  }
  struct report_trace_node n = {
      .name = g_strdup(name),
      .device = pid,
      .ordinal = count_up(rd->name_count, g_strdup_printf("%u\x1f%s", pid, name)),
      .micro_batch = (int32_t)ea->micro_batch,
      .stage = (int32_t)ea->stage,
      .kind = trace_kind_of(rd, ea->kind, ea->pass),
      .ir_kind = IR_NODE_KIND_COUNT,
      .pass = IR_PASS_NONE};
  for (uint32_t k = 0; k < IR_NODE_KIND_COUNT; k++)
    if (strcmp(ea->kind, ir_node_kind_name((enum ir_node_kind)k)) == 0)
      n.ir_kind = k;
  for (uint32_t k = 0; ea->pass && k < IR_PASS_NONE; k++)
    if (strcmp(ea->pass, ir_pass_name((enum ir_pass)k)) == 0)
      n.pass = k;
  g_array_append_val(rd->nodes, n);
  g_hash_table_insert(rd->node_index, key, GUINT_TO_POINTER(rd->nodes->len));
  return rd->nodes->len - 1;
}

static uint32_t trace_step_of(struct report_dir_reader *rd, uint32_t step) {
  gpointer at = g_hash_table_lookup(rd->step_index, GUINT_TO_POINTER(step + 1));
  if (at)
    return GPOINTER_TO_UINT(at) - 1;
  g_array_append_val(rd->steps, step);
  g_hash_table_insert(rd->step_index, GUINT_TO_POINTER(step + 1), GUINT_TO_POINTER(rd->steps->len));
  return rd->steps->len - 1;
}

static bool trace_event(struct report_dir_reader *rd, const cJSON *ev, uint64_t index,
                        const char *path, GError **err) {
  char ctx[512];
  snprintf(ctx, sizeof ctx, "%s: traceEvents[%llu]", path, (unsigned long long)index);
  if (!cJSON_IsObject(ev))
    return piper_input_error(err, "%s: must be an object", ctx);
  const char *ph = NULL, *name = NULL;
  if (!json_get_string(ev, "ph", true, &ph, ctx, err))
    return false;
  if (strcmp(ph, "M") == 0)
    trace_thread_name(rd, ev);
  if (strcmp(ph, "X") != 0)
    return true; /* metadata and memory counters */
  double dur = 0, ts = 0;
  int64_t pid = 0, tid = 0;
  if (!json_get_string(ev, "name", true, &name, ctx, err) ||
      !json_get_double(ev, "dur", true, 0, 1e18, &dur, ctx, err) ||
      !json_get_double(ev, "ts", true, -1e18, 1e18, &ts, ctx, err) ||
      !json_get_int(ev, "pid", true, 0, IR_MAX_DEVICES - 1, &pid, ctx, err) ||
      !json_get_int(ev, "tid", false, 0, REPORT_TRACE_MAX_TID, &tid, ctx, err))
    return false;
  if ((uint64_t)pid >= rd->d->n_devices)
    return piper_input_error(err, "%s: key \"pid\": device %lld, but metrics.json has %u devices", ctx,
                     (long long)pid, rd->d->n_devices);
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  if (!cJSON_IsObject(args))
    return piper_input_error(err, "%s: key \"args\" is required (an object)", ctx);
  strncat(ctx, ".args", sizeof ctx - strlen(ctx) - 1);
  struct trace_event_args ea;
  if (!trace_event_args(args, &ea, ctx, err))
    return false;
  uint32_t node = trace_node_of(rd, (uint32_t)pid, name, &ea);
  struct report_trace_kind *k =
      &g_array_index(rd->kinds, struct report_trace_kind,
                     g_array_index(rd->nodes, struct report_trace_node, node).kind);
  k->count++;
  k->total_s += (ea.wait_us + dur) * 1e-6; /* trace times are microseconds */
  struct report_trace_event e = {ts * 1e-6, dur * 1e-6, ea.wait_us * 1e-6, node, (uint32_t)tid,
                                 trace_step_of(rd, (uint32_t)ea.step)};
  g_array_append_val(rd->events, e);
  rd->device_seen[pid] = true;
  return true;
}

static int trace_kind_cmp(const void *a, const void *b) {
  const struct report_trace_kind *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return strcmp(x->name, y->name);
}

struct kind_slot {
  struct report_trace_kind kind;
  uint32_t old_index;
};

static int kind_slot_cmp(const void *a, const void *b) {
  return trace_kind_cmp(&((const struct kind_slot *)a)->kind, &((const struct kind_slot *)b)->kind);
}

/* Sorts the kinds (renumbering the nodes' kind) and hands them to d. */
static void trace_finish_kinds(struct report_dir_reader *rd) {
  struct report_dir *d = rd->d;
  uint32_t n = rd->kinds->len;
  struct kind_slot *slot = g_new(struct kind_slot, n + 1);
  for (uint32_t i = 0; i < n; i++)
    slot[i] = (struct kind_slot){g_array_index(rd->kinds, struct report_trace_kind, i), i};
  qsort(slot, n, sizeof *slot, kind_slot_cmp);
  uint32_t *new_index = g_new(uint32_t, n + 1);
  d->trace_kinds = g_new(struct report_trace_kind, n + 1);
  for (uint32_t i = 0; i < n; i++) {
    new_index[slot[i].old_index] = i;
    d->trace_kinds[i] = slot[i].kind;
  }
  d->n_trace_kinds = n;
  for (uint32_t i = 0; i < rd->nodes->len; i++) {
    struct report_trace_node *node = &g_array_index(rd->nodes, struct report_trace_node, i);
    node->kind = new_index[node->kind];
  }
  g_free(new_index);
  g_free(slot);
}

/* Step numbers ascending; events' steps renumbered to match. */
static void trace_finish_steps(struct report_dir_reader *rd) {
  struct report_dir *d = rd->d;
  uint32_t n = rd->steps->len;
  uint32_t *sorted = g_new(uint32_t, n + 1);
  if (n) /* an empty GArray's data is NULL, which memcpy may not be given */
    memcpy(sorted, rd->steps->data, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, piper_cmp_u32);
  uint32_t *new_index = g_new(uint32_t, n + 1);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t v = g_array_index(rd->steps, uint32_t, i);
    const uint32_t *at = bsearch(&v, sorted, n, sizeof *sorted, piper_cmp_u32);
    new_index[i] = (uint32_t)(at - sorted);
  }
  struct report_trace_event *ev = (struct report_trace_event *)(void *)rd->events->data;
  for (guint i = 0; i < rd->events->len; i++)
    ev[i].step = new_index[ev[i].step];
  g_free(new_index);
  d->n_trace_steps = n;
  d->trace_steps = sorted;
}

struct node_duration {
  uint32_t node;
  double dur;
};

static int node_duration_cmp(const void *a, const void *b) {
  const struct node_duration *x = a, *y = b;
  if (x->node != y->node)
    return x->node < y->node ? -1 : 1;
  return piper_cmp_double(&x->dur, &y->dur);
}

/* Each node's event count and median duration over the steps. */
static void trace_finish_nodes(struct report_dir_reader *rd) {
  struct report_dir *d = rd->d;
  guint n_ev = rd->events->len;
  struct node_duration *nd = g_new(struct node_duration, n_ev + 1);
  for (guint i = 0; i < n_ev; i++) {
    const struct report_trace_event *e = &g_array_index(rd->events, struct report_trace_event, i);
    nd[i] = (struct node_duration){e->node, e->wait_s + e->dur_s};
  }
  qsort(nd, n_ev, sizeof *nd, node_duration_cmp);
  struct report_trace_node *nodes = (struct report_trace_node *)(void *)rd->nodes->data;
  for (guint i = 0; i < n_ev;) {
    guint j = i;
    while (j < n_ev && nd[j].node == nd[i].node)
      j++;
    guint m = j - i;
    struct report_trace_node *node = &nodes[nd[i].node];
    node->n_events = m;
    node->median_s = m % 2 ? nd[i + m / 2].dur : (nd[i + m / 2 - 1].dur + nd[i + m / 2].dur) / 2;
    i = j;
  }
  g_free(nd);
  d->n_trace_nodes = rd->nodes->len;
  d->trace_nodes = (struct report_trace_node *)(void *)g_array_free(rd->nodes, FALSE);
  rd->nodes = NULL;
  d->n_trace_events = n_ev;
  d->trace_events = (struct report_trace_event *)(void *)g_array_free(rd->events, FALSE);
  rd->events = NULL;
  d->n_trace_threads = rd->threads->len;
  d->trace_threads = (struct report_trace_thread *)(void *)g_array_free(rd->threads, FALSE);
  rd->threads = NULL;
}

void report_dir_step_window(const struct report_dir *d, uint32_t k, const bool *devices, double *t0,
                            double *t1) {
  double lo = INFINITY, hi = -INFINITY;
  for (uint64_t i = 0; i < d->n_trace_events; i++) {
    const struct report_trace_event *e = &d->trace_events[i];
    if (e->step != k || (devices && !devices[d->trace_nodes[e->node].device]))
      continue;
    lo = fmin(lo, e->start_s);
    hi = fmax(hi, e->start_s + e->dur_s);
  }
  if (!isfinite(lo))
    lo = hi = 0;
  *t0 = lo;
  *t1 = hi;
}

static bool read_trace_events(struct report_dir_reader *rd, struct trace_scan *s) {
  scan_space(s);
  if (s->pos >= s->len || s->buf[s->pos] != '[')
    return scan_fail(s, s->pos, "key \"traceEvents\" must be an array");
  s->pos++;
  scan_space(s);
  if (s->pos < s->len && s->buf[s->pos] == ']') {
    s->pos++;
    return true;
  }
  for (uint64_t i = 0;; i++) {
    scan_space(s);
    size_t start = s->pos;
    if (!scan_value(s))
      return false;
    cJSON *ev = scan_parse(s, start);
    if (!ev)
      return false;
    bool ok = event_keys_once(s, ev, i) && trace_event(rd, ev, i, s->path, s->err);
    cJSON_Delete(ev);
    if (!ok)
      return false;
    scan_space(s);
    if (s->pos < s->len && s->buf[s->pos] == ',') {
      s->pos++;
    } else if (s->pos < s->len && s->buf[s->pos] == ']') {
      s->pos++;
      return true;
    } else {
      return scan_fail(s, s->pos, "expected , or ] in traceEvents");
    }
  }
}

static void reader_init(struct report_dir_reader *rd, struct report_dir *d) {
  *rd = (struct report_dir_reader){d,
                                   g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                                   g_array_new(FALSE, FALSE, sizeof(struct report_trace_kind)),
                                   g_new0(bool, d->n_devices + 1),
                                   g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                                   g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                                   g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                                   g_array_new(FALSE, FALSE, sizeof(struct report_trace_node)),
                                   g_array_new(FALSE, FALSE, sizeof(struct report_trace_event)),
                                   g_hash_table_new(g_direct_hash, g_direct_equal),
                                   g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                                   g_array_new(FALSE, FALSE, sizeof(struct report_trace_thread))};
}

/* Frees what was not handed to the report_dir. */
static void reader_clear(struct report_dir_reader *rd) {
  if (rd->kinds)
    g_array_free(rd->kinds, TRUE);
  if (rd->nodes) {
    for (guint i = 0; i < rd->nodes->len; i++)
      g_free(g_array_index(rd->nodes, struct report_trace_node, i).name);
    g_array_free(rd->nodes, TRUE);
  }
  if (rd->events)
    g_array_free(rd->events, TRUE);
  if (rd->threads)
    g_array_free(rd->threads, TRUE);
  g_array_free(rd->steps, TRUE);
  g_hash_table_destroy(rd->step_index);
  g_hash_table_destroy(rd->node_index);
  g_hash_table_destroy(rd->name_count);
  g_hash_table_destroy(rd->occurrence);
  g_hash_table_destroy(rd->kind_index);
  g_free(rd->device_seen);
}

/* otherData: a trace of the other kind of run means files of two runs were mixed. */
static bool read_trace_other(struct report_dir_reader *rd, struct trace_scan *s) {
  scan_space(s);
  size_t start = s->pos;
  if (!scan_value(s))
    return false;
  cJSON *other = scan_parse(s, start);
  if (!other)
    return false;
  char *name = g_strdup_printf("%s: otherData", s->path);
  bool once = json_refuse_duplicate_keys(other, name, s->err);
  g_free(name);
  if (!once) {
    cJSON_Delete(other);
    return false;
  }
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(other, "kind");
  bool mixed = cJSON_IsString(k) && strcmp(k->valuestring, rd->d->kind) != 0;
  if (mixed)
    piper_input_error(s->err, "%s: otherData.kind is \"%s\" but metrics.json says \"%s\"", s->path,
                      k->valuestring, rd->d->kind);
  cJSON_Delete(other);
  return !mixed;
}

/* The top-level object, key by key: traceEvents and otherData read, the rest skipped. */
static bool read_trace_object(struct report_dir_reader *rd, struct trace_scan *s, bool *events) {
  scan_space(s);
  if (s->pos >= s->len || s->buf[s->pos] != '{')
    return scan_fail(s, s->pos, "a trace must be a JSON object");
  s->pos++;
  scan_space(s);
  if (s->pos < s->len && s->buf[s->pos] == '}') {
    s->pos++;
    return true;
  }
  unsigned other = 0;
  for (;;) {
    scan_space(s);
    if (s->pos >= s->len || s->buf[s->pos] != '"')
      return scan_fail(s, s->pos, "expected a key");
    size_t key = s->pos + 1;
    if (!scan_string(s))
      return false;
    size_t key_len = s->pos - 1 - key;
    scan_space(s);
    if (s->pos >= s->len || s->buf[s->pos] != ':')
      return scan_fail(s, s->pos, "expected :");
    s->pos++;
    if (key_len == 11 && memcmp(s->buf + key, "traceEvents", 11) == 0) {
      /* a second list would be read on top of the first */
      if (*events)
        return piper_input_error(s->err, "%s: key \"traceEvents\" appears twice", s->path);
      if (!read_trace_events(rd, s))
        return false;
      *events = true;
    } else if (key_len == 9 && memcmp(s->buf + key, "otherData", 9) == 0) {
      if (other++)
        return piper_input_error(s->err, "%s: key \"otherData\" appears twice", s->path);
      if (!read_trace_other(rd, s))
        return false;
    } else if (!scan_value(s)) {
      return false;
    }
    scan_space(s);
    if (s->pos < s->len && s->buf[s->pos] == ',') {
      s->pos++;
    } else if (s->pos < s->len && s->buf[s->pos] == '}') {
      s->pos++;
      return true;
    } else {
      return scan_fail(s, s->pos, "expected , or }");
    }
  }
}

static bool read_trace(struct report_dir *d, const char *path, GError **err) {
  GError *e = NULL;
  GMappedFile *mf = g_mapped_file_new(path, FALSE, &e);
  if (!mf) {
    piper_input_error(err, "%s: cannot open: %s", path, e->message);
    g_error_free(e);
    return false;
  }
  struct trace_scan s = {path, g_mapped_file_get_contents(mf), g_mapped_file_get_length(mf), 0,
                         err};
  struct report_dir_reader rd;
  reader_init(&rd, d);
  bool events = false;
  bool ok = read_trace_object(&rd, &s, &events);
  if (ok) {
    scan_space(&s);
    if (s.pos < s.len)
      ok = scan_fail(&s, s.pos, "text after the value");
  }
  if (ok && !events)
    ok = piper_input_error(err, "%s: key \"traceEvents\" is required", path);
  if (ok) {
    trace_finish_kinds(&rd);
    trace_finish_steps(&rd);
    trace_finish_nodes(&rd);
    for (uint32_t i = 0; i < d->n_devices; i++)
      d->trace_devices += rd.device_seen[i];
  }
  reader_clear(&rd);
  g_mapped_file_unref(mf);
  return ok;
}

struct report_dir *report_dir_load(const char *dir, GError **err) {
  if (!g_file_test(dir, G_FILE_TEST_EXISTS)) {
    piper_input_error(err, "%s: no such run directory", dir);
    return NULL;
  }
  if (!g_file_test(dir, G_FILE_TEST_IS_DIR)) {
    piper_input_error(err, "%s: not a directory (give a run directory of piper-sim or piper-exec)", dir);
    return NULL;
  }
  struct report_dir *d = g_new0(struct report_dir, 1);
  d->path = g_strdup(dir);
  char *metrics = g_build_filename(dir, "metrics.json", NULL);
  char *results = g_build_filename(dir, "results.csv", NULL);
  char *trace = g_build_filename(dir, "trace.json", NULL);
  bool ok = read_metrics(d, metrics, err) && read_results(d, results, err) &&
            read_program(d, err) && read_trace(d, trace, err);
  g_free(metrics);
  g_free(results);
  g_free(trace);
  if (!ok) {
    report_dir_free(d);
    return NULL;
  }
  return d;
}
