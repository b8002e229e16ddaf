/* report writing: results.csv, metrics.json, trace.json and the directive program of a run
 * (docs/design.md, "Outputs and exit statuses"), every file through piper_out. */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../base/json.h"
#include "../base/version.h"

static bool fail_io(GError **err, const char *path, const char *what) {
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: %s: %s", path, what, strerror(errno));
  return false;
}

static double gib(uint64_t b) {
  return (double)b / (double)(1ull << 30);
}

/* Means over the pp ranks of dp rank j (devices at[k * dp + j]) of the bubble and its split,
 * as fractions of the iteration time iter. */
static void write_row_bubble(FILE *f, const struct report_run *r, const int64_t *at, uint32_t j,
                             double iter) {
  double sum[4] = {0};
  uint32_t n = 0;
  for (uint32_t k = 0; k < r->pp; k++) {
    int64_t di = at[(size_t)k * r->dp + j];
    if (di < 0)
      continue;
    const struct report_device *d = &r->devices[di];
    sum[0] += d->bubble_fraction;
    sum[1] += iter > 0 ? d->pipeline_idle_s / iter : 0;
    sum[2] += iter > 0 ? d->exposed_comm_s / iter : 0;
    sum[3] += iter > 0 ? d->imbalance_s / iter : 0;
    n++;
  }
  for (int k = 0; k < 4; k++)
    fprintf(f, ",%.6f", n ? sum[k] / n : 0);
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
  /* the bubble split of the row's devices (report.h) */
  fputs(",bubble_fraction,pipeline_idle_fraction,exposed_comm_fraction,imbalance_fraction\n", f);
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
  double window = report_iteration_time(r); /* what the statistics were derived over */
  for (uint32_t j = 0; j < r->dp; j++) {
    fprintf(f, "%u,%s,%s,%u,%u,%lld,%u,%lld,%lld,%.9g,%.9g,%.9g", j, m->name,
            r->schedule ? r->schedule : "custom", r->pp, r->dp, (long long)batch, M,
            (long long)m->seq_len, (long long)(batch * r->dp / (r->cp > 1 ? r->cp : 1)), mean, stddev,
            mean > 0 ? tokens / mean : 0);
    for (uint32_t k = 0; k < r->pp; k++) {
      int64_t di = at[(size_t)k * r->dp + j];
      if (di >= 0)
        fprintf(f, ",%.6f", gib(r->devices[di].peak_memory_bytes));
      else
        fputc(',', f);
    }
    write_row_bubble(f, r, at, j, window);
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
  if (r->tp > 1) /* absent without tensor parallelism, as metrics were */
    cJSON_AddNumberToObject(root, "tp", r->tp);
  if (r->cp > 1) /* "dp" counts the CP ranks too (report.h) */
    cJSON_AddNumberToObject(root, "cp", r->cp);
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
  /* bubble_fraction_mean = the sum of these three (report.h) */
  struct report_bubble_split split = report_bubble_split(r);
  cJSON_AddNumberToObject(root, "pipeline_idle_fraction_mean", split.pipeline_idle);
  cJSON_AddNumberToObject(root, "exposed_comm_fraction_mean", split.exposed_comm);
  cJSON_AddNumberToObject(root, "imbalance_fraction_mean", split.imbalance);
  if (r->extra) {
    const cJSON *it;
    cJSON_ArrayForEach(it, r->extra)
        cJSON_AddItemToObject(root, it->string, cJSON_Duplicate(it, true));
  }
  /* Uneven stages: each stage's layers, and each device's share (an equal split adds nothing,
   * so the files of the runs before stay as they were). */
  bool uneven = !model_pp_split_is_equal(m);
  if (uneven) {
    cJSON *sl = cJSON_AddArrayToObject(root, "stage_layers");
    for (int32_t st = 0; st < m->pp_regions; st++)
      cJSON_AddItemToArray(sl, cJSON_CreateNumber(m->pp_layers[st]));
  }
  cJSON *devs = cJSON_AddArrayToObject(root, "devices");
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "device", d->device);
    cJSON_AddNumberToObject(o, "pp_rank", d->pp_rank);
    cJSON_AddNumberToObject(o, "dp_rank", d->dp_rank);
    if (uneven)
      cJSON_AddNumberToObject(o, "layers", (double)report_device_layers(r->plan, d));
    cJSON_AddNumberToObject(o, "busy_s", d->compute_s);
    cJSON_AddNumberToObject(o, "comm_s", d->comm_s);
    cJSON_AddNumberToObject(o, "idle_s", d->idle_s);
    cJSON_AddNumberToObject(o, "bubble_fraction", d->bubble_fraction);
    cJSON_AddNumberToObject(o, "exposed_comm_s", d->exposed_comm_s);
    cJSON_AddNumberToObject(o, "pipeline_idle_s", d->pipeline_idle_s);
    cJSON_AddNumberToObject(o, "imbalance_s", d->imbalance_s);
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

/* Steps in the trace: the measured steps a run kept, else one. */
static uint32_t trace_step_count(const struct report_run *r) {
  return r->n_trace_steps ? r->n_trace_steps : 1;
}

/* Device d's intervals of traced step k, and that step's training step number. */
static const struct report_interval *trace_step_intervals(const struct report_run *r,
                                                          const struct report_device *d, uint32_t k,
                                                          uint32_t *n, uint32_t *step) {
  *step = r->n_trace_steps && r->trace_steps ? r->trace_steps[k] : 1;
  if (!r->n_trace_steps || !d->all_intervals) {
    *n = k == 0 ? d->n_intervals : 0;
    return d->intervals;
  }
  *n = d->step_begin[k + 1] - d->step_begin[k];
  return d->all_intervals + d->step_begin[k];
}

/* The window of traced step k over every device (traced or not, so that times do not depend
 * on which devices the trace shows): [*lo, *hi] in seconds, lo > hi when nothing ran. */
static void trace_step_window(const struct report_run *r, uint32_t k, double *lo, double *hi) {
  *lo = INFINITY;
  *hi = -INFINITY;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    uint32_t n, step;
    const struct report_interval *iv = trace_step_intervals(r, &r->devices[i], k, &n, &step);
    for (uint32_t j = 0; j < n; j++) {
      *lo = fmin(*lo, iv[j].start);
      *hi = fmax(*hi, iv[j].end);
    }
  }
}

/* Chrome trace "otherData": the writer, the run's kind and each step's time range (so a reader
 * or a person in Perfetto sees where one step ends), all relative to t0. */
static double trace_header(FILE *f, const struct report_run *r, uint32_t n_sel) {
  uint32_t n_steps = trace_step_count(r);
  double *lo = g_new(double, n_steps), *hi = g_new(double, n_steps);
  double t0 = INFINITY;
  for (uint32_t k = 0; k < n_steps; k++) {
    trace_step_window(r, k, &lo[k], &hi[k]);
    t0 = fmin(t0, lo[k]);
  }
  if (!isfinite(t0)) {
    double t1;
    report_run_window(r, &t0, &t1);
  }
  fprintf(f,
          "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"version\":\"%s\",\"kind\":\"%s\","
          "\"devices_in_trace\":%u,\"devices\":%u,\"steps\":[",
          PIPER_VERSION, r->kind ? r->kind : "sim", n_sel, r->n_devices);
  for (uint32_t k = 0; k < n_steps; k++) {
    uint32_t n, step;
    trace_step_intervals(r, &r->devices[0], k, &n, &step);
    fprintf(f, "%s{\"step\":%u,\"start_us\":%.3f,\"end_us\":%.3f}", k ? "," : "", step,
            isfinite(lo[k]) ? (lo[k] - t0) * 1e6 : 0, isfinite(hi[k]) ? (hi[k] - t0) * 1e6 : 0);
  }
  fputs("]},\n\"traceEvents\":[\n", f);
  g_free(lo);
  g_free(hi);
  return t0;
}

struct trace_writer {
  FILE *f;
  const struct report_run *r;
  double t0;
  char **names; /* [plan n_nodes], made on first use */
  bool first;
  const struct plan_class *cls; /* the traced device's class, NULL when it has none */
  GHashTable *groups;           /* cls's plan_class_group_index, NULL without groups */
};

static void trace_sep(struct trace_writer *w) {
  if (!w->first)
    fputs(",\n", w->f);
  w->first = false;
}

/* The device as a Perfetto process, its streams as threads (those any traced step used). */
static void trace_device_meta(struct trace_writer *w, const struct report_device *d) {
  const struct plan *p = w->r->plan;
  FILE *f = w->f;
  trace_sep(w);
  fprintf(f,
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":"
          "\"device %u (pp %d, dp %d)\"}}",
          d->device, d->device, d->pp_rank, d->dp_rank);
  trace_sep(w);
  fprintf(f,
          "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{"
          "\"sort_index\":%u}}",
          d->device, d->device);
  bool *used = g_new0(bool, p->n_streams + 1);
  for (uint32_t k = 0; k < trace_step_count(w->r); k++) {
    uint32_t n, step;
    const struct report_interval *iv = trace_step_intervals(w->r, d, k, &n, &step);
    for (uint32_t j = 0; j < n; j++)
      if (iv[j].stream < p->n_streams)
        used[iv[j].stream] = true;
  }
  for (uint32_t s = 0; s < p->n_streams; s++) {
    if (!used[s])
      continue;
    trace_sep(w);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"args\":{\"name\":",
            d->device, s);
    json_escape(f, p->streams[s].name);
    fputs("}}", f);
  }
  g_free(used);
}

/* The group entry (1-based) of node on the traced device, 0 when the node is in no group. */
static uint32_t trace_group_entry(const struct trace_writer *w, uint32_t node) {
  return w->groups ? GPOINTER_TO_UINT(g_hash_table_lookup(w->groups, GUINT_TO_POINTER(node))) : 0;
}

/* One instruction: its node's name, kind, pass and tags, the plan node index and the step. A
 * point-to-point group is one event, named by its parts, at its first part (the others are
 * left out). */
static void trace_event(struct trace_writer *w, const struct report_device *d,
                        const struct report_interval *iv, uint32_t step) {
  const struct plan *p = w->r->plan;
  FILE *f = w->f;
  const struct ir_node *n = &p->nodes[iv->node];
  uint32_t entry = trace_group_entry(w, iv->node);
  if (entry && w->cls->instrs[w->cls->stream_instrs[entry - 1]].node != iv->node)
    return;
  char group_name[1024];
  if (entry)
    plan_group_name(p, w->cls, entry - 1, false, -1, group_name, sizeof group_name);
  if (!entry && !w->names[iv->node]) {
    char nb[256];
    plan_node_name(p, iv->node, nb, sizeof nb);
    w->names[iv->node] = g_strdup(nb);
  }
  trace_sep(w);
  fputs("{\"name\":", f);
  json_escape(f, entry ? group_name : w->names[iv->node]);
  fprintf(f,
          ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,"
          "\"args\":{\"kind\":\"%s\"",
          report_node_is_compute(n) ? "compute" : "comm", d->device, iv->stream,
          (iv->start - w->t0) * 1e6, (iv->end - iv->start) * 1e6, ir_node_kind_name(n->kind));
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
  if (entry)
    fprintf(f, ",\"group_parts\":%u", plan_group_span(w->cls, entry - 1));
  if (iv->wait > 0)
    fprintf(f, ",\"wait_us\":%.3f", iv->wait * 1e6);
  fprintf(f, ",\"node\":%u,\"step\":%u}}", iv->node, step);
}

/* The memory timeline as a Perfetto counter track. */
static void trace_device_memory(struct trace_writer *w, const struct report_device *d) {
  for (uint32_t k = 0; k < d->n_memory; k++) {
    const struct report_memory_point *mp = &d->memory[k];
    trace_sep(w);
    double ts = mp->t - w->t0;
    if (ts < 0)
      ts = 0;
    fprintf(w->f, "{\"name\":\"memory (GiB)\",\"ph\":\"C\",\"pid\":%u,\"ts\":%.3f,\"args\":{",
            d->device, ts * 1e6);
    for (int j = 0; j < REPORT_MEM_KIND_COUNT; j++)
      fprintf(w->f, "%s\"%s\":%.6f", j ? "," : "", report_mem_kind_name((enum report_mem_kind)j),
              gib(mp->bytes[j]));
    fputs("}}", w->f);
  }
}

bool report_write_trace(const struct report_run *r, const char *path, GError **err) {
  const struct plan *p = r->plan;
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  static char buf[1 << 20];
  setvbuf(out.f, buf, _IOFBF, sizeof buf);
  uint32_t n_sel;
  bool *sel = trace_selection(r, &n_sel);
  struct trace_writer w = {out.f, r, 0, g_new0(char *, p->n_nodes + 1), true, NULL, NULL};
  w.t0 = trace_header(out.f, r, n_sel);
  for (uint32_t i = 0; i < r->n_devices; i++) {
    if (!sel[i])
      continue;
    const struct report_device *d = &r->devices[i];
    trace_device_meta(&w, d);
    w.cls = plan_device_class(p, d->device);
    w.groups = w.cls ? plan_class_group_index(w.cls) : NULL;
    for (uint32_t k = 0; k < trace_step_count(r); k++) {
      uint32_t n, step;
      const struct report_interval *iv = trace_step_intervals(r, d, k, &n, &step);
      for (uint32_t j = 0; j < n; j++)
        if (iv[j].node < p->n_nodes)
          trace_event(&w, d, &iv[j], step);
    }
    if (w.groups)
      g_hash_table_destroy(w.groups);
    w.groups = NULL;
    trace_device_memory(&w, d);
  }
  fputs("\n]}\n", out.f);
  for (uint32_t i = 0; i < p->n_nodes; i++)
    g_free(w.names[i]);
  g_free(w.names);
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
    ok = piper_write_file(path, r->plan->program_json, strlen(r->plan->program_json), err);
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
