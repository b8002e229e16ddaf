/* runner_report: what a run reports. Each rank keeps the intervals of its measured steps and the
 * last step's memory timeline; at the end rank 0 gathers every rank's into the run it returns
 * (exec_result_report, for the program to write as the run directory), and the final
 * parameters (--dump-params), each element from the lowest rank holding a current copy. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/json.h"
#include "runner-impl.h"

/* ---- report ------------------------------------------------------------------------------ */

/* What each rank sends rank 0: this header, the intervals of every traced step, the memory
 * timeline of the last step, the steps' (number, first interval) pairs, padded to 8 bytes so
 * that the next rank's blob stays aligned. */
struct device_blob {
  uint32_t n_intervals, n_steps, n_memory, pad;
  uint64_t peak, peak_breakdown[REPORT_MEM_KIND_COUNT];
};

struct report_job {
  void *mine;
  size_t mine_bytes;
  void *all;
  size_t *sizes;
};

static bool gather_fn(struct runner *R, void *arg, GError **err) {
  struct report_job *j = arg;
  return exec_world_gather(R->b, j->mine, j->mine_bytes, &j->all, &j->sizes, err);
}

static gint compare_memory_point(gconstpointer a, gconstpointer b) {
  double x = ((const struct report_memory_point *)a)->t,
         y = ((const struct report_memory_point *)b)->t;
  return x < y ? -1 : x > y;
}

/* By start; ties by node and stream, so that the order does not depend on qsort. */
static int compare_interval(const void *a, const void *b) {
  const struct report_interval *x = a, *y = b;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  if (x->node != y->node)
    return x->node < y->node ? -1 : 1;
  return x->stream < y->stream ? -1 : x->stream > y->stream;
}

/* Appends this step's instructions to the trace (per-op statistics then cover the same steps
 * as the iteration time), sorted by start; the ones that never ran (start 0) dropped. */
void exec_runner_keep_step_trace(struct runner *R, uint32_t step) {
  const struct plan_class *c = R->dev->cls;
  if (!R->traced) {
    R->traced = g_array_new(FALSE, FALSE, sizeof(struct report_interval));
    R->traced_steps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  }
  uint32_t pair[2] = {step, R->traced->len};
  g_array_append_vals(R->traced_steps, pair, 2);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    /* a measured box starts at the post: no wait before it */
    struct report_interval v = {R->start[i], R->end[i], c->instrs[i].node, c->instrs[i].stream, 0};
    if (v.end > v.start || v.start > 0)
      g_array_append_val(R->traced, v);
  }
  qsort((struct report_interval *)(void *)R->traced->data + pair[1], R->traced->len - pair[1],
        sizeof(struct report_interval), compare_interval);
}

/* This rank's blob (struct device_blob). */
static char *report_blob(struct runner *R, size_t *bytes) {
  /* memory points are appended by workers as they finish: sort by time */
  g_array_sort(R->memory, compare_memory_point);
  uint32_t n_steps = R->traced_steps->len / 2;
  struct device_blob hdr = {R->traced->len, n_steps, R->memory->len, 0,
                            exec_backend_memory_peak(R->b, R->s.mem_peak), {0}};
  memcpy(hdr.peak_breakdown, R->s.mem_peak_breakdown, sizeof hdr.peak_breakdown);
  size_t iv_bytes = R->traced->len * sizeof(struct report_interval);
  size_t mem_bytes = R->memory->len * sizeof(struct report_memory_point);
  size_t steps_bytes = 2 * n_steps * sizeof(uint32_t);
  *bytes = (sizeof hdr + iv_bytes + mem_bytes + steps_bytes + 7) & ~(size_t)7;
  char *blob = g_malloc0(*bytes);
  memcpy(blob, &hdr, sizeof hdr);
  memcpy(blob + sizeof hdr, R->traced->data, iv_bytes);
  memcpy(blob + sizeof hdr + iv_bytes, R->memory->data, mem_bytes);
  memcpy(blob + sizeof hdr + iv_bytes + mem_bytes, R->traced_steps->data, steps_bytes);
  return blob;
}

/* Rank 0's view of every device from the gathered blobs: the traced steps (the last one is
 * what the statistics and charts describe), memory and peaks. step_begin[dv] and *steps are
 * allocated here. */
static void report_devices_from_blobs(struct report_run *run, const struct report_job *j,
                                      uint32_t **step_begin, uint32_t **steps) {
  size_t off = 0;
  for (uint32_t dv = 0; dv < run->n_devices; dv++) {
    const char *base = (const char *)j->all + off;
    off += j->sizes[dv];
    struct device_blob h;
    memcpy(&h, base, sizeof h);
    struct report_device *rd = &run->devices[dv];
    const struct report_interval *iv = (const struct report_interval *)(base + sizeof h);
    const char *mem = base + sizeof h + h.n_intervals * sizeof *iv;
    const char *pairs = mem + h.n_memory * sizeof(struct report_memory_point);
    step_begin[dv] = g_new(uint32_t, h.n_steps + 1);
    /* every rank runs the same steps: the trace's step list is rank 0's */
    PIPER_ASSERT(dv == 0 || h.n_steps == run->n_trace_steps);
    if (dv == 0) {
      run->n_trace_steps = h.n_steps;
      *steps = g_new0(uint32_t, h.n_steps + 1);
    }
    for (uint32_t k = 0; k < h.n_steps; k++) {
      uint32_t pair[2];
      memcpy(pair, pairs + k * sizeof pair, sizeof pair);
      step_begin[dv][k] = pair[1];
      if (dv == 0)
        (*steps)[k] = pair[0];
    }
    step_begin[dv][h.n_steps] = h.n_intervals;
    rd->all_intervals = iv;
    rd->step_begin = step_begin[dv];
    uint32_t last = h.n_steps ? step_begin[dv][h.n_steps - 1] : 0;
    rd->intervals = iv + last;
    rd->n_intervals = h.n_intervals - last;
    rd->n_memory = h.n_memory;
    rd->memory = (const struct report_memory_point *)mem;
    rd->peak_memory_bytes = h.peak;
    memcpy(rd->peak_breakdown, h.peak_breakdown, sizeof rd->peak_breakdown);
  }
  run->trace_steps = *steps;
}

/* What metrics.json adds for a measured run: losses, the backend, executor overheads. */
static cJSON *report_extra(struct runner *R, const struct exec_result *res,
                           const double *all_losses, uint32_t n_losses) {
  const struct plan *p = R->dev->plan;
  cJSON *extra = cJSON_CreateObject();
  cJSON *losses = cJSON_AddArrayToObject(extra, "losses");
  for (uint32_t k = 0; k < n_losses; k++)
    cJSON_AddItemToArray(losses, cJSON_CreateNumber(all_losses[k]));
  /* per step, as losses: learning rate, gradient norm (before clipping), peak memory so far
   * (the job's largest rank), MFU (null without --peak-tflops) */
  const double *per_step[] = {res->lrs, res->grad_norms, res->peak_memory, res->mfu};
  const char *names[] = {"lr", "grad_norm", "peak_memory_bytes_per_step", "mfu_per_step"};
  for (size_t f = 0; f < G_N_ELEMENTS(names); f++) {
    cJSON *a = cJSON_AddArrayToObject(extra, names[f]);
    for (uint32_t k = 0; k < n_losses && per_step[f]; k++)
      cJSON_AddItemToArray(a, isfinite(per_step[f][k]) ? cJSON_CreateNumber(per_step[f][k])
                                                        : cJSON_CreateNull());
  }
  if (R->o->clip_grad > 0)
    cJSON_AddNumberToObject(extra, "clip_grad", R->o->clip_grad);
  cJSON *evals = cJSON_AddArrayToObject(extra, "eval");
  for (uint32_t k = 0; k < res->n_evals; k++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "step", res->eval_steps[k]);
    cJSON_AddNumberToObject(e, "loss", res->eval_losses[k]);
    cJSON_AddItemToArray(evals, e);
  }
  cJSON_AddNumberToObject(extra, "first_step", res->first_step);
  cJSON_AddNumberToObject(extra, "warmup", R->o->warmup);
  if (res->stopped) /* a signal ended the run early: the steps asked for, and the last one run */
    cJSON_AddNumberToObject(extra, "stopped_after_step", res->first_step + res->n_steps - 1);
  cJSON_AddStringToObject(extra, "backend", exec_backend_name(R->b));
  cJSON_AddStringToObject(extra, "communication", exec_backend_comm_library(R->b));
  cJSON_AddStringToObject(extra, "data", exec_data_kind(R->s.data));
  cJSON_AddNumberToObject(extra, "executor_overhead_us_per_instruction",
                          res->job_overhead_per_instr_s * 1e6);
  cJSON_AddNumberToObject(extra, "executor_dispatch_us_per_instruction",
                          res->job_dispatch_per_instr_s * 1e6);
  if (res->comm_tests_per_instr > 0) { /* rank 0's loop: a fact for the simulator's profile */
    cJSON_AddNumberToObject(extra, "executor_comm_test_us", res->comm_test_s * 1e6);
    cJSON_AddNumberToObject(extra, "executor_comm_tests_per_instruction",
                            res->comm_tests_per_instr);
  }
  cJSON_AddNumberToObject(extra, "instructions_per_step", (double)plan_instruction_count(p));
  cJSON_AddNumberToObject(extra, "kernel_seconds_rank0", res->kernel_seconds);
  cJSON_AddNumberToObject(extra, "comm_seconds_rank0", res->comm_seconds);
  cJSON *compute = cJSON_AddArrayToObject(extra, "compute_seconds_per_rank");
  for (uint32_t r = 0; res->compute_seconds && r < p->n_devices; r++)
    cJSON_AddItemToArray(compute, cJSON_CreateNumber(res->compute_seconds[r]));
  /* [measured step][rank], as every rank exchanged them */
  cJSON *compute_steps = cJSON_AddArrayToObject(extra, "compute_seconds_per_step");
  const double *t = (const double *)(void *)R->compute_steps->data;
  for (uint32_t s = 0; s < R->compute_steps->len / p->n_devices; s++) {
    cJSON *row = cJSON_CreateArray();
    for (uint32_t r = 0; r < p->n_devices; r++)
      cJSON_AddItemToArray(row, cJSON_CreateNumber(t[(size_t)s * p->n_devices + r]));
    cJSON_AddItemToArray(compute_steps, row);
  }
  cJSON *slow = cJSON_AddArrayToObject(extra, "stragglers");
  for (uint32_t k = 0; k < res->n_stragglers; k++) {
    const struct exec_straggler *x = &res->stragglers[k];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", x->rank);
    cJSON_AddNumberToObject(o, "class", x->class_id);
    cJSON_AddNumberToObject(o, "peers", x->peers);
    cJSON_AddNumberToObject(o, "ratio", x->ratio);
    cJSON_AddNumberToObject(o, "slow_steps", x->slow_steps);
    cJSON_AddItemToArray(slow, o);
  }
  cJSON_AddNumberToObject(extra, "straggler_threshold", R->o->straggler_threshold);
  cJSON *traced = cJSON_AddArrayToObject(extra, "traced_steps");
  for (guint k = 0; k < R->traced_steps->len; k += 2)
    cJSON_AddItemToArray(traced, cJSON_CreateNumber(g_array_index(R->traced_steps, uint32_t, k)));
  return extra;
}

/* What the measured run reports (rank 0): the run and what its pointers point into. */
struct exec_report {
  struct report_run run;
  cJSON *extra;
  char *blobs;
  size_t *sizes;
  uint32_t **step_begin, *steps;
  double *measured;
};

void exec_report_free(struct exec_report *x) {
  if (!x)
    return;
  cJSON_Delete(x->extra);
  for (uint32_t dv = 0; x->step_begin && dv < x->run.plan->n_devices; dv++)
    g_free(x->step_begin[dv]);
  g_free(x->step_begin);
  g_free(x->steps);
  report_run_free_devices(&x->run);
  g_free(x->blobs);
  g_free(x->sizes);
  g_free(x->measured);
  g_free(x);
}

const struct report_run *exec_result_report(const struct exec_result *r) {
  return r->report ? &r->report->run : NULL;
}

/* Gathers every rank's trace on rank 0, which returns the run for the caller to write (the
 * run directory and its charts are the program's). The trace holds every measured step (the
 * last step alone when none was measured). */
bool exec_runner_gather_report(struct runner *R, struct exec_result *res,
                               const double *all_losses, uint32_t n_losses,
                               const double *measured, uint32_t n_measured, GError **err) {
  const struct plan *p = R->dev->plan;
  if (!R->traced)
    exec_runner_keep_step_trace(R, R->o->warmup + R->o->iters);
  struct report_job j = {NULL, 0, NULL, NULL};
  j.mine = report_blob(R, &j.mine_bytes);
  bool ok = exec_runner_control(R, gather_fn, &j, err);
  g_free(j.mine);
  if (!ok || R->rank != 0) {
    g_free(j.all);
    g_free(j.sizes);
    return ok;
  }
  struct exec_report *x = g_new0(struct exec_report, 1);
  x->blobs = j.all;
  x->sizes = j.sizes;
  x->measured = g_memdup2(measured, (n_measured ? n_measured : 1) * sizeof(double));
  x->run = (struct report_run){.plan = p,
                               .kind = "exec",
                               .schedule = R->o->schedule ? R->o->schedule : "custom",
                               .program_file = R->o->program_file,
                               .n_iterations = n_measured,
                               .iteration_times = x->measured,
                               .trace_device_limit = 0};
  report_run_init_devices(&x->run);
  x->step_begin = g_new0(uint32_t *, p->n_devices + 1);
  report_devices_from_blobs(&x->run, &j, x->step_begin, &x->steps);
  report_compute_stats(&x->run);
  x->extra = report_extra(R, res, all_losses, n_losses);
  x->run.extra = x->extra;
  res->report = x;
  return true;
}

/* The final parameters on rank 0. Copies exist on several ranks (data-parallel replicas,
 * DualPipe's two model copies, ZeRO-3 shards, experts split over a group): every element is
 * taken from the lowest rank holding a current copy, so the result is exact. */
bool exec_runner_dump_params(struct runner *R, GError **err) {
  uint64_t n = exec_model_param_total(R->s.xm);
  float *full = g_new0(float, n ? n : 1);
  bool *held = g_new0(bool, n ? n : 1);
  exec_params_export(&R->s, full, held, n);
  double *v = g_new(double, n ? n : 1);
  for (uint64_t i = 0; i < n; i++)
    v[i] = held[i] ? (double)R->rank : 1e30;
  bool ok = exec_runner_all_reduce(R, v, n, EXEC_REDUCE_MIN, err);
  for (uint64_t i = 0; ok && i < n; i++)
    v[i] = held[i] && v[i] == (double)R->rank ? full[i] : 0.0;
  ok = ok && exec_runner_all_reduce(R, v, n, EXEC_REDUCE_SUM, err);
  if (ok && R->rank == 0) {
    for (uint64_t i = 0; i < n; i++)
      full[i] = (float)v[i];
    /* piper_write_file: a device (/dev/null, /dev/full) is written in place, a full disk is
     * an error naming the file */
    ok = piper_write_file(R->o->dump_params_path, full, n * sizeof(float), err);
  }
  g_free(v);
  g_free(held);
  g_free(full);
  return ok;
}

