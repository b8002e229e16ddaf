/* report: metrics, results.csv, metrics.json and trace.json of a run (SPEC §8). */
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

const char *report_mem_kind_name(enum report_mem_kind k) {
  static const char *const names[REPORT_MEM_KIND_COUNT] = {
      "params", "grads", "optimizer", "activations", "gathered_params", "comm"};
  return (unsigned)k < REPORT_MEM_KIND_COUNT ? names[k] : "?";
}

bool report_node_is_compute(const struct ir_node *n) {
  return n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_OPTIMIZER;
}

/* ---- ranks -------------------------------------------------------------------------------- */

void report_run_init_devices(struct report_run *r) {
  const struct plan *p = r->plan;
  r->n_devices = p->n_devices;
  r->devices = g_new0(struct report_device, p->n_devices + 1);
  /* Lowest PP stage of each class (PP is tag 0 of every model and plan) among the compute of
   * the first micro-batch: with model copies (DualPipe) a device also runs another stage for
   * later micro-batches, which must not make two pipeline ranks look like one. */
  uint32_t n_model_tags = p->model->n_tags;
  int32_t *cls_stage = g_new(int32_t, p->n_classes + 1);
  for (uint32_t c = 0; c < p->n_classes; c++) {
    const struct plan_class *pc = &p->classes[c];
    int32_t lo = INT32_MAX, lo_any = INT32_MAX;
    for (uint32_t i = 0; i < pc->n_instrs; i++) {
      const struct ir_node *n = &p->nodes[pc->instrs[i].node];
      int32_t st = n->tags[MODEL_TAG_PP];
      if (n->kind != IR_NODE_COMPUTE || st < 0)
        continue;
      bool first_mb = true;
      for (uint32_t t = n_model_tags; t < p->n_tags && t < IR_MAX_TAGS; t++)
        first_mb &= n->tags[t] <= 0;
      if (st < lo_any)
        lo_any = st;
      if (first_mb && st < lo)
        lo = st;
    }
    cls_stage[c] = lo != INT32_MAX ? lo : lo_any;
  }
  /* distinct lowest stages in order give the pp ranks */
  GArray *stages = g_array_new(FALSE, FALSE, sizeof(int32_t));
  for (uint32_t d = 0; d < p->n_devices; d++) {
    int32_t s = cls_stage[p->device_class[d]];
    if (s == INT32_MAX)
      continue;
    bool found = false;
    for (uint32_t k = 0; k < stages->len && !found; k++)
      found = g_array_index(stages, int32_t, k) == s;
    if (!found)
      g_array_append_val(stages, s);
  }
  int32_t *sv = (int32_t *)stages->data;
  for (uint32_t i = 1; i < stages->len; i++) {
    int32_t v = sv[i];
    uint32_t j = i;
    while (j > 0 && sv[j - 1] > v) {
      sv[j] = sv[j - 1];
      j--;
    }
    sv[j] = v;
  }
  uint32_t pp = stages->len;
  uint32_t *count = g_new0(uint32_t, pp + 1);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    struct report_device *rd = &r->devices[d];
    rd->device = d;
    rd->pp_rank = -1;
    rd->dp_rank = -1;
    int32_t s = cls_stage[p->device_class[d]];
    for (uint32_t k = 0; k < pp; k++)
      if (sv[k] == s) {
        rd->pp_rank = (int32_t)k;
        rd->dp_rank = (int32_t)count[k]++;
        break;
      }
  }
  r->pp = pp;
  r->dp = 0;
  for (uint32_t k = 0; k < pp; k++)
    if (count[k] > r->dp)
      r->dp = count[k];
  if (r->pp == 0)
    r->pp = 1;
  if (r->dp == 0)
    r->dp = 1;
  g_free(count);
  g_array_free(stages, TRUE);
  g_free(cls_stage);
}

void report_run_free_devices(struct report_run *r) {
  g_free(r->devices);
  r->devices = NULL;
  r->n_devices = 0;
}

/* ---- metrics ------------------------------------------------------------------------------ */

static void run_window(const struct report_run *r, double *t0, double *t1) {
  double lo = INFINITY, hi = -INFINITY;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    for (uint32_t k = 0; k < d->n_intervals; k++) {
      if (d->intervals[k].start < lo)
        lo = d->intervals[k].start;
      if (d->intervals[k].end > hi)
        hi = d->intervals[k].end;
    }
    /* intervals are sorted by start: later devices sharing an array add nothing new */
    while (i + 1 < r->n_devices && r->devices[i + 1].intervals == d->intervals &&
           r->devices[i + 1].n_intervals == d->n_intervals)
      i++;
  }
  if (!isfinite(lo))
    lo = hi = 0;
  *t0 = lo;
  *t1 = hi;
}

double report_iteration_time(const struct report_run *r) {
  double t0, t1;
  run_window(r, &t0, &t1);
  return t1 - t0;
}

struct endpoint {
  double t;
  int8_t compute, comm; /* +1 start, -1 end */
};

static int endpoint_cmp(const void *a, const void *b) {
  const struct endpoint *x = a, *y = b;
  if (x->t != y->t)
    return x->t < y->t ? -1 : 1;
  /* ends before starts at one instant: back-to-back kernels leave no gap and no overlap */
  int sx = x->compute + x->comm, sy = y->compute + y->comm;
  return sx < sy ? -1 : sx > sy;
}

static void device_stats(const struct plan *p, struct report_device *d, double iter) {
  uint32_t n = d->n_intervals;
  struct endpoint *e = g_new(struct endpoint, 2 * (size_t)n + 1);
  uint32_t m = 0;
  for (uint32_t k = 0; k < n; k++) {
    const struct report_interval *iv = &d->intervals[k];
    if (!(iv->end > iv->start))
      continue;
    bool comp = report_node_is_compute(&p->nodes[iv->node]);
    e[m++] = (struct endpoint){iv->start, comp ? 1 : 0, comp ? 0 : 1};
    e[m++] = (struct endpoint){iv->end, comp ? -1 : 0, comp ? 0 : -1};
  }
  qsort(e, m, sizeof *e, endpoint_cmp);
  double compute = 0, comm = 0, both = 0, any = 0;
  int nc = 0, nm = 0;
  for (uint32_t k = 0; k < m; k++) {
    if (k > 0) {
      double dt = e[k].t - e[k - 1].t;
      if (nc > 0)
        compute += dt;
      if (nm > 0)
        comm += dt;
      if (nc > 0 && nm > 0)
        both += dt;
      if (nc > 0 || nm > 0)
        any += dt;
    }
    nc += e[k].compute;
    nm += e[k].comm;
  }
  g_free(e);
  d->compute_s = compute;
  d->comm_s = comm;
  d->exposed_comm_s = comm - both;
  d->overlap_fraction = comm > 0 ? both / comm : 0;
  d->bubble_fraction = iter > 0 ? 1.0 - compute / iter : 0;
  d->idle_s = iter - any > 0 ? iter - any : 0;
}

void report_compute_stats(struct report_run *r) {
  double iter = report_iteration_time(r);
  /* devices that share an interval array (simulated as one) share the figures */
  GHashTable *done = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (uint32_t i = 0; i < r->n_devices; i++) {
    struct report_device *d = &r->devices[i];
    gpointer prev = d->intervals ? g_hash_table_lookup(done, d->intervals) : NULL;
    if (prev) {
      const struct report_device *p = &r->devices[GPOINTER_TO_UINT(prev) - 1];
      if (p->n_intervals == d->n_intervals) {
        d->compute_s = p->compute_s;
        d->comm_s = p->comm_s;
        d->exposed_comm_s = p->exposed_comm_s;
        d->overlap_fraction = p->overlap_fraction;
        d->bubble_fraction = p->bubble_fraction;
        d->idle_s = p->idle_s;
        continue;
      }
    }
    device_stats(r->plan, d, iter);
    if (d->intervals)
      g_hash_table_insert(done, (gpointer)d->intervals, GUINT_TO_POINTER(i + 1));
  }
  g_hash_table_destroy(done);
}

double report_mean_iteration_time(const struct report_run *r, double *stddev) {
  double mean = 0, var = 0;
  uint32_t n = r->n_iterations;
  if (n == 0 || !r->iteration_times) {
    if (stddev)
      *stddev = 0;
    return report_iteration_time(r);
  }
  for (uint32_t i = 0; i < n; i++)
    mean += r->iteration_times[i];
  mean /= n;
  for (uint32_t i = 0; i < n; i++)
    var += (r->iteration_times[i] - mean) * (r->iteration_times[i] - mean);
  if (stddev)
    *stddev = n > 1 ? sqrt(var / (n - 1)) : 0;
  return mean;
}

double report_tokens_per_iteration(const struct report_run *r) {
  const struct model *m = r->plan->model;
  return (double)r->dp * (double)(r->plan->n_microbatches ? r->plan->n_microbatches : 1) *
         (double)model_tokens_per_microbatch(m);
}

/* ---- files -------------------------------------------------------------------------------- */

static bool fail_io(GError **err, const char *path, const char *what) {
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: %s: %s", path, what, strerror(errno));
  return false;
}

static double gib(uint64_t b) {
  return (double)b / (double)(1ull << 30);
}

bool report_write_results_csv(const struct report_run *r, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  const struct model *m = r->plan->model;
  double stddev;
  double mean = report_mean_iteration_time(r, &stddev);
  double tokens = report_tokens_per_iteration(r);
  uint32_t M = r->plan->n_microbatches ? r->plan->n_microbatches : 1;
  /* batch_size: samples one DP rank processes per iteration; samples: the global batch */
  int64_t batch = (int64_t)M * m->micro_batch_size;
  fprintf(f, "dp_rank,model,schedule,pp,dp,batch_size,num_microbatches,seq_len,samples,"
             "iter_time_mean_s,iter_time_std_s,throughput_tokens_per_s");
  for (uint32_t k = 0; k < r->pp; k++)
    fprintf(f, ",peak_memory_pp%u_gb", k);
  fputc('\n', f);
  /* device at (pp, dp) */
  int64_t *at = g_new(int64_t, (size_t)r->pp * r->dp + 1);
  for (size_t i = 0; i < (size_t)r->pp * r->dp; i++)
    at[i] = -1;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    if (d->pp_rank >= 0 && d->dp_rank >= 0 && (uint32_t)d->pp_rank < r->pp &&
        (uint32_t)d->dp_rank < r->dp)
      at[(size_t)d->pp_rank * r->dp + (size_t)d->dp_rank] = i;
  }
  for (uint32_t j = 0; j < r->dp; j++) {
    fprintf(f, "%u,%s,%s,%u,%u,%lld,%u,%lld,%lld,%.9g,%.9g,%.9g", j, m->name,
            r->schedule ? r->schedule : "custom", r->pp, r->dp, (long long)batch, M,
            (long long)m->seq_len, (long long)(batch * r->dp), mean, stddev,
            mean > 0 ? tokens / mean : 0);
    for (uint32_t k = 0; k < r->pp; k++) {
      int64_t di = at[(size_t)k * r->dp + j];
      if (di >= 0)
        fprintf(f, ",%.6f", gib(r->devices[di].peak_memory_bytes));
      else
        fputc(',', f);
    }
    fputc('\n', f);
  }
  g_free(at);
  return piper_out_close(&out, err);
}

cJSON *report_metrics_json(const struct report_run *r) {
  const struct model *m = r->plan->model;
  cJSON *root = cJSON_CreateObject();
  double stddev;
  double mean = report_mean_iteration_time(r, &stddev);
  double tokens = report_tokens_per_iteration(r);
  uint32_t M = r->plan->n_microbatches ? r->plan->n_microbatches : 1;
  cJSON_AddStringToObject(root, "version", PIPER_VERSION);
  cJSON_AddStringToObject(root, "kind", r->kind ? r->kind : "sim");
  cJSON_AddStringToObject(root, "model", m->name);
  cJSON_AddStringToObject(root, "schedule", r->schedule ? r->schedule : "custom");
  cJSON_AddNumberToObject(root, "pp", r->pp);
  cJSON_AddNumberToObject(root, "dp", r->dp);
  cJSON_AddNumberToObject(root, "n_devices", r->plan->n_devices);
  cJSON_AddNumberToObject(root, "num_microbatches", M);
  cJSON_AddNumberToObject(root, "micro_batch_size", (double)m->micro_batch_size);
  cJSON_AddNumberToObject(root, "seq_len", (double)m->seq_len);
  cJSON_AddNumberToObject(root, "iteration_time_s", mean);
  cJSON_AddNumberToObject(root, "iteration_time_std_s", stddev);
  cJSON *its = cJSON_AddArrayToObject(root, "iteration_times_s");
  for (uint32_t i = 0; i < r->n_iterations && r->iteration_times; i++)
    cJSON_AddItemToArray(its, cJSON_CreateNumber(r->iteration_times[i]));
  cJSON_AddNumberToObject(root, "tokens_per_iteration", tokens);
  cJSON_AddNumberToObject(root, "throughput_tokens_per_s", mean > 0 ? tokens / mean : 0);
  double flops = (double)r->dp * M * model_flops_per_microbatch(m);
  cJSON_AddNumberToObject(root, "model_flops_per_iteration", flops);
  if (r->peak_flops_per_device > 0 && mean > 0)
    cJSON_AddNumberToObject(root, "mfu",
                            flops / mean / ((double)r->plan->n_devices * r->peak_flops_per_device));
  else
    cJSON_AddNullToObject(root, "mfu");
  uint64_t peak = 0;
  double bubble = 0, exposed = 0;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    if (r->devices[i].peak_memory_bytes > peak)
      peak = r->devices[i].peak_memory_bytes;
    bubble += r->devices[i].bubble_fraction;
    exposed += r->devices[i].exposed_comm_s;
  }
  cJSON_AddNumberToObject(root, "peak_memory_bytes_max", (double)peak);
  cJSON_AddNumberToObject(root, "bubble_fraction_mean", r->n_devices ? bubble / r->n_devices : 0);
  cJSON_AddNumberToObject(root, "exposed_comm_s_mean", r->n_devices ? exposed / r->n_devices : 0);
  if (r->extra) {
    const cJSON *it;
    cJSON_ArrayForEach(it, r->extra)
        cJSON_AddItemToObject(root, it->string, cJSON_Duplicate(it, true));
  }
  cJSON *devs = cJSON_AddArrayToObject(root, "devices");
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "device", d->device);
    cJSON_AddNumberToObject(o, "pp_rank", d->pp_rank);
    cJSON_AddNumberToObject(o, "dp_rank", d->dp_rank);
    cJSON_AddNumberToObject(o, "busy_s", d->compute_s);
    cJSON_AddNumberToObject(o, "comm_s", d->comm_s);
    cJSON_AddNumberToObject(o, "idle_s", d->idle_s);
    cJSON_AddNumberToObject(o, "bubble_fraction", d->bubble_fraction);
    cJSON_AddNumberToObject(o, "exposed_comm_s", d->exposed_comm_s);
    cJSON_AddNumberToObject(o, "overlap_fraction", d->overlap_fraction);
    cJSON_AddNumberToObject(o, "peak_memory_bytes", (double)d->peak_memory_bytes);
    cJSON *b = cJSON_AddObjectToObject(o, "memory_breakdown_bytes");
    for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
      cJSON_AddNumberToObject(b, report_mem_kind_name((enum report_mem_kind)k),
                              (double)d->peak_breakdown[k]);
    cJSON_AddItemToArray(devs, o);
  }
  return root;
}

static void json_escape(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* Which devices go into the trace: all, or one per pp rank when the trace would be huge. */
static bool *trace_selection(const struct report_run *r, uint32_t *n_selected) {
  bool *sel = g_new0(bool, r->n_devices + 1);
  uint64_t total = 0;
  for (uint32_t i = 0; i < r->n_devices; i++)
    total += r->devices[i].n_intervals;
  bool all = r->trace_device_limit == 0 || total <= r->trace_device_limit;
  *n_selected = 0;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    sel[i] = all || r->devices[i].dp_rank == 0 || r->devices[i].pp_rank < 0;
    if (sel[i])
      (*n_selected)++;
  }
  return sel;
}

bool report_write_trace(const struct report_run *r, const char *path, GError **err) {
  const struct plan *p = r->plan;
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  static char buf[1 << 20];
  setvbuf(f, buf, _IOFBF, sizeof buf);
  double t0, t1;
  run_window(r, &t0, &t1);
  uint32_t n_sel;
  bool *sel = trace_selection(r, &n_sel);
  char **names = g_new0(char *, p->n_nodes + 1);
  fprintf(f,
          "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"version\":\"%s\",\"kind\":\"%s\","
          "\"devices_in_trace\":%u,\"devices\":%u},\n\"traceEvents\":[\n",
          PIPER_VERSION, r->kind ? r->kind : "sim", n_sel, r->n_devices);
  bool first = true;
#define SEP() (first ? (void)(first = false) : (void)fputs(",\n", f))
  for (uint32_t i = 0; i < r->n_devices; i++) {
    if (!sel[i])
      continue;
    const struct report_device *d = &r->devices[i];
    SEP();
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":"
            "\"device %u (pp %d, dp %d)\"}}",
            d->device, d->device, d->pp_rank, d->dp_rank);
    SEP();
    fprintf(f,
            "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{"
            "\"sort_index\":%u}}",
            d->device, d->device);
    /* thread names for the streams this device uses */
    bool *used = g_new0(bool, p->n_streams + 1);
    for (uint32_t k = 0; k < d->n_intervals; k++)
      if (d->intervals[k].stream < p->n_streams)
        used[d->intervals[k].stream] = true;
    for (uint32_t s = 0; s < p->n_streams; s++) {
      if (!used[s])
        continue;
      SEP();
      fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"args\":{\"name\":",
              d->device, s);
      json_escape(f, p->streams[s].name);
      fputs("}}", f);
    }
    g_free(used);
    for (uint32_t k = 0; k < d->n_intervals; k++) {
      const struct report_interval *iv = &d->intervals[k];
      if (iv->node >= p->n_nodes)
        continue;
      const struct ir_node *n = &p->nodes[iv->node];
      if (!names[iv->node]) {
        char nb[256];
        plan_node_name(p, iv->node, nb, sizeof nb);
        names[iv->node] = g_strdup(nb);
      }
      SEP();
      fputs("{\"name\":", f);
      json_escape(f, names[iv->node]);
      fprintf(f,
              ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,"
              "\"args\":{\"kind\":\"%s\"",
              report_node_is_compute(n) ? "compute" : "comm", d->device, iv->stream,
              (iv->start - t0) * 1e6, (iv->end - iv->start) * 1e6, ir_node_kind_name(n->kind));
      if (n->pass != IR_PASS_NONE)
        fprintf(f, ",\"PASS\":\"%s\"", ir_pass_name(n->pass));
      for (uint32_t t = 0; t < p->n_tags && t < IR_MAX_TAGS; t++)
        if (n->tags[t] >= 0) {
          fputc(',', f);
          json_escape(f, p->tag_names[t]);
          fprintf(f, ":%d", n->tags[t]);
        }
      if (n->kind != IR_NODE_COMPUTE && n->kind != IR_NODE_OPTIMIZER)
        fprintf(f, ",\"bytes\":%llu", (unsigned long long)n->bytes);
      fputs("}}", f);
    }
    for (uint32_t k = 0; k < d->n_memory; k++) {
      const struct report_memory_point *mp = &d->memory[k];
      SEP();
      double ts = mp->t - t0;
      if (ts < 0)
        ts = 0;
      fprintf(f, "{\"name\":\"memory (GiB)\",\"ph\":\"C\",\"pid\":%u,\"ts\":%.3f,\"args\":{",
              d->device, ts * 1e6);
      for (int j = 0; j < REPORT_MEM_KIND_COUNT; j++)
        fprintf(f, "%s\"%s\":%.6f", j ? "," : "", report_mem_kind_name((enum report_mem_kind)j),
                gib(mp->bytes[j]));
      fputs("}}", f);
    }
  }
#undef SEP
  fputs("\n]}\n", f);
  for (uint32_t i = 0; i < p->n_nodes; i++)
    g_free(names[i]);
  g_free(names);
  g_free(sel);
  return piper_out_close(&out, err);
}

bool report_write_dir(const struct report_run *r, const char *dir, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0)
    return fail_io(err, dir, "cannot create directory");
  bool ok = true;
  char *path;
  if (r->program_file && r->plan->program_json) {
    path = g_build_filename(dir, r->program_file, NULL);
    GError *e = NULL;
    if (!g_file_set_contents(path, r->plan->program_json, -1, &e)) {
      g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s", path, e->message);
      g_error_free(e);
      ok = false;
    }
    g_free(path);
    if (!ok)
      return false;
  }
  path = g_build_filename(dir, "results.csv", NULL);
  ok = report_write_results_csv(r, path, err);
  g_free(path);
  if (!ok)
    return false;
  path = g_build_filename(dir, "metrics.json", NULL);
  cJSON *mj = report_metrics_json(r);
  ok = json_write_file(path, mj, err);
  cJSON_Delete(mj);
  g_free(path);
  if (!ok)
    return false;
  path = g_build_filename(dir, "trace.json", NULL);
  ok = report_write_trace(r, path, err);
  g_free(path);
  return ok;
}

/* ---- reading a run directory back --------------------------------------------------------- */

struct report_dir_reader {
  struct report_dir *d;
  GHashTable *kind_index; /* row name -> index + 1 into kinds */
  GArray *kinds;          /* struct report_trace_kind */
  bool *device_seen;      /* pid has instruction events */
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

static bool read_metrics(struct report_dir *d, const char *path, GError **err) {
  d->metrics = json_parse_file(path, err);
  if (!d->metrics)
    return false;
  const cJSON *m = d->metrics;
  if (!cJSON_IsObject(m))
    return piper_input_error(err, "%s: must be a JSON object", path);
  if (!json_get_string(m, "kind", false, &d->kind, path, err))
    return false;
  /* older files may lack "kind": what only one writer puts there tells */
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
  const cJSON *devs = cJSON_GetObjectItemCaseSensitive(m, "devices");
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
    struct report_device *rd = &d->devices[i];
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
    i++;
  }
  return true;
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
  d->program = json_parse_file(path, err);
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

static bool trace_event(struct report_dir_reader *rd, const cJSON *ev, uint64_t index,
                        const char *path, GError **err) {
  char ctx[512];
  snprintf(ctx, sizeof ctx, "%s: traceEvents[%llu]", path, (unsigned long long)index);
  if (!cJSON_IsObject(ev))
    return piper_input_error(err, "%s: must be an object", ctx);
  const char *ph = NULL, *kind = NULL, *pass = NULL;
  if (!json_get_string(ev, "ph", true, &ph, ctx, err))
    return false;
  if (strcmp(ph, "X") != 0)
    return true; /* metadata and memory counters */
  double dur = 0;
  int64_t pid = 0;
  if (!json_get_double(ev, "dur", true, 0, 1e18, &dur, ctx, err) ||
      !json_get_int(ev, "pid", true, 0, IR_MAX_DEVICES - 1, &pid, ctx, err))
    return false;
  if ((uint64_t)pid >= rd->d->n_devices)
    return piper_input_error(err, "%s: key \"pid\": device %lld, but metrics.json has %u devices", ctx,
                     (long long)pid, rd->d->n_devices);
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  if (!cJSON_IsObject(args))
    return piper_input_error(err, "%s: key \"args\" is required (an object)", ctx);
  strncat(ctx, ".args", sizeof ctx - strlen(ctx) - 1);
  if (!json_get_string(args, "kind", true, &kind, ctx, err) ||
      !json_get_string(args, "PASS", false, &pass, ctx, err))
    return false;
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
  struct report_trace_kind *k =
      &g_array_index(rd->kinds, struct report_trace_kind, GPOINTER_TO_UINT(at) - 1);
  k->count++;
  k->total_s += dur * 1e-6; /* trace times are microseconds */
  rd->device_seen[pid] = true;
  return true;
}

static int trace_kind_cmp(const void *a, const void *b) {
  const struct report_trace_kind *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return strcmp(x->name, y->name);
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
    bool ok = trace_event(rd, ev, i, s->path, s->err);
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
  struct report_dir_reader rd = {d, g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                                 g_array_new(FALSE, FALSE, sizeof(struct report_trace_kind)),
                                 g_new0(bool, d->n_devices + 1)};
  bool ok = false, events = false;
  scan_space(&s);
  if (s.pos >= s.len || s.buf[s.pos] != '{') {
    scan_fail(&s, s.pos, "a trace must be a JSON object");
    goto out;
  }
  s.pos++;
  scan_space(&s);
  if (s.pos < s.len && s.buf[s.pos] == '}') {
    s.pos++;
  } else {
    for (;;) {
      scan_space(&s);
      if (s.pos >= s.len || s.buf[s.pos] != '"') {
        scan_fail(&s, s.pos, "expected a key");
        goto out;
      }
      size_t key = s.pos + 1;
      if (!scan_string(&s))
        goto out;
      size_t key_len = s.pos - 1 - key;
      scan_space(&s);
      if (s.pos >= s.len || s.buf[s.pos] != ':') {
        scan_fail(&s, s.pos, "expected :");
        goto out;
      }
      s.pos++;
      if (key_len == 11 && memcmp(s.buf + key, "traceEvents", 11) == 0) {
        if (!read_trace_events(&rd, &s))
          goto out;
        events = true;
      } else if (key_len == 9 && memcmp(s.buf + key, "otherData", 9) == 0) {
        scan_space(&s);
        size_t start = s.pos;
        if (!scan_value(&s))
          goto out;
        cJSON *other = scan_parse(&s, start);
        if (!other)
          goto out;
        /* a trace of the other kind of run means files of two runs were mixed */
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(other, "kind");
        bool mixed = cJSON_IsString(k) && strcmp(k->valuestring, d->kind) != 0;
        if (mixed)
          piper_input_error(err, "%s: otherData.kind is \"%s\" but metrics.json says \"%s\"", path,
                    k->valuestring, d->kind);
        cJSON_Delete(other);
        if (mixed)
          goto out;
      } else if (!scan_value(&s)) {
        goto out;
      }
      scan_space(&s);
      if (s.pos < s.len && s.buf[s.pos] == ',') {
        s.pos++;
      } else if (s.pos < s.len && s.buf[s.pos] == '}') {
        s.pos++;
        break;
      } else {
        scan_fail(&s, s.pos, "expected , or }");
        goto out;
      }
    }
  }
  scan_space(&s);
  if (s.pos < s.len) {
    scan_fail(&s, s.pos, "text after the value");
    goto out;
  }
  if (!events) {
    piper_input_error(err, "%s: key \"traceEvents\" is required", path);
    goto out;
  }
  qsort(rd.kinds->data, rd.kinds->len, sizeof(struct report_trace_kind), trace_kind_cmp);
  d->n_trace_kinds = rd.kinds->len;
  d->trace_kinds = (struct report_trace_kind *)g_array_free(rd.kinds, FALSE);
  rd.kinds = NULL;
  for (uint32_t i = 0; i < d->n_devices; i++)
    d->trace_devices += rd.device_seen[i];
  ok = true;
out:
  if (rd.kinds)
    g_array_free(rd.kinds, TRUE);
  g_hash_table_destroy(rd.kind_index);
  g_free(rd.device_seen);
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
