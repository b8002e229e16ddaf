/* runner: drives training steps through a backend. Per step it submits every instruction of
 * this device's plan to its stream in issue order, preceded by waits on the events of the
 * instructions it depends on and followed by a record of its own event, then waits for the
 * streams to drain under a watchdog. Between steps it collects the global loss and timings
 * (job-wide operations on a control stream, so a dead peer cannot block the main thread),
 * prints progress and writes checkpoints; at the end, rank 0 writes the run directory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "exec-impl.h"

struct runner;

struct task {
  struct runner *R;
  uint32_t i;
};

/* A job-wide operation run on the control stream. */
struct control_job {
  struct runner *R;
  bool (*fn)(struct runner *R, void *arg, GError **err);
  void *arg;
};

struct runner {
  struct exec_state s;
  struct exec_model xm;
  struct exec_device device;
  const struct exec_options *o;
  const struct exec_backend_ops *ops;
  struct exec_backend *b;
  const struct exec_device *dev;
  uint32_t rank;
  struct exec_stream **streams; /* [plan n_streams], NULL where unused */
  struct exec_stream *control;
  struct exec_event **events;     /* [n_instrs] */
  struct exec_event **stream_end; /* [plan n_streams] */
  struct exec_event *control_end;
  struct task *tasks;
  /* per-instruction measurements of the current step */
  double *start, *end, *kernel, *comm;
  double step_setup, step_fill;
  bool tracing; /* record memory points (the last step) */
  GMutex trace_lock;
  GArray *memory; /* struct report_memory_point */
  /* totals over measured steps */
  uint64_t instructions;
  double kernel_s, comm_s, task_s, overhead_s, dispatch_s;
  bool stall_armed;
  uint32_t stall_instr;
  atomic_bool cancelled; /* set when the run gives up (the stall hook polls it) */
};

/* ---- tasks ------------------------------------------------------------------------------- */

static bool stall_task(struct runner *R, uint32_t i, GError **err) {
  /* blocks like a transfer whose peer never comes, until the run is cancelled */
  while (!atomic_load(&R->cancelled))
    g_usleep(10000);
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "rank %u: stalled instruction %u cancelled",
              R->rank, i);
  return false;
}

static bool run_task(void *arg, GError **err) {
  struct task *t = arg;
  struct runner *R = t->R;
  uint32_t i = t->i;
  double t0 = R->ops->clock(R->b);
  struct exec_task_stats st = {0, 0};
  bool ok;
  if (R->stall_armed && i == R->stall_instr)
    ok = stall_task(R, i, err);
  else
    ok = exec_run_instr(&R->s, i, &st, err);
  double t1 = R->ops->clock(R->b);
  R->start[i] = t0;
  R->end[i] = t1;
  R->kernel[i] = st.kernel_s;
  R->comm[i] = st.comm_s;
  if (R->tracing) {
    struct report_memory_point mp = {.t = t1};
    g_mutex_lock(&R->s.mem_lock);
    memcpy(mp.bytes, R->s.mem, sizeof mp.bytes);
    g_mutex_unlock(&R->s.mem_lock);
    g_mutex_lock(&R->trace_lock);
    g_array_append_val(R->memory, mp);
    g_mutex_unlock(&R->trace_lock);
  }
  return ok;
}

static bool run_control(void *arg, GError **err) {
  struct control_job *c = arg;
  return c->fn(c->R, c->arg, err);
}

/* ---- the watchdog ------------------------------------------------------------------------ */

static const char *instr_peer_text(const struct runner *R, uint32_t i, char *buf, size_t len) {
  const struct exec_instr *x = &R->dev->instrs[i];
  buf[0] = 0;
  if (x->role == EXEC_ROLE_SEND)
    g_snprintf(buf, len, " (sending to rank %u)", x->peer);
  if (x->role == EXEC_ROLE_RECV)
    g_snprintf(buf, len, " (receiving from rank %u)", x->peer);
  if (x->comm != IR_NONE && x->role != EXEC_ROLE_SEND && x->role != EXEC_ROLE_RECV) {
    char cn[64];
    plan_comm_name(R->dev->plan, R->dev->comm_keys[x->comm].comm, cn, sizeof cn);
    g_snprintf(buf, len, " (collective on %s)", cn);
  }
  return buf;
}

/* One line naming what this rank waits on: the longest-running instruction, else the
 * longest-waiting one. */
static void stall_error(struct runner *R, double idle, GError **err) {
  const struct plan *p = R->dev->plan;
  double now = R->ops->clock(R->b);
  int best = -1, best_rank = -1;
  double best_age = -1;
  struct exec_stream_status best_st = {0};
  for (uint32_t s = 0; s < p->n_streams; s++) {
    if (!R->streams[s])
      continue;
    struct exec_stream_status st;
    R->ops->stream_status(R->streams[s], &st);
    int rank = st.phase == EXEC_STREAM_RUNNING ? 2 : st.phase == EXEC_STREAM_WAITING ? 1 : 0;
    if (rank == 0)
      continue;
    double age = now - st.since;
    if (rank > best_rank || (rank == best_rank && age > best_age)) {
      best = (int)s;
      best_rank = rank;
      best_age = age;
      best_st = st;
    }
  }
  if (best < 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "rank %u: watchdog: no progress for %.1f s in a job-wide operation between steps "
                "(stream control; a peer rank may have died)",
                R->rank, idle);
    return;
  }
  uint32_t i = best_st.task_id;
  char nb[256] = "?", peer[96] = "";
  if (i < R->dev->n_instrs) {
    plan_node_name(p, R->dev->instrs[i].node, nb, sizeof nb);
    instr_peer_text(R, i, peer, sizeof peer);
  }
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
              "rank %u: watchdog: no progress for %.1f s: stream \"%s\" is %s instruction %u "
              "\"%s\"%s",
              R->rank, idle, p->streams[best].name,
              best_rank == 2 ? "stuck in" : "waiting to start", i, nb, peer);
}

/* The first error of a failed stream (by time), or NULL. */
static const GError *stream_failure(struct runner *R) {
  const GError *first = NULL;
  double when = INFINITY;
  uint32_t n = R->dev->plan->n_streams;
  for (uint32_t s = 0; s <= n; s++) {
    struct exec_stream *st = s < n ? R->streams[s] : R->control;
    if (!st)
      continue;
    struct exec_stream_status ss;
    R->ops->stream_status(st, &ss);
    if (!ss.failed)
      continue;
    const GError *e = R->ops->stream_error(st);
    if (e && ss.since < when) {
      first = e;
      when = ss.since;
    }
  }
  return first;
}

/* Waits until every event in evs has completed, with the watchdog. */
static bool wait_events(struct runner *R, struct exec_event **evs, uint32_t n, GError **err) {
  uint64_t seen = R->ops->progress(R->b);
  double last = R->ops->clock(R->b);
  for (uint32_t k = 0; k < n; k++) {
    if (!evs[k])
      continue;
    while (!R->ops->event_synchronize(evs[k], 0.05)) {
      const GError *f = stream_failure(R);
      if (f) {
        g_propagate_error(err, g_error_copy(f));
        atomic_store(&R->cancelled, true);
        R->ops->cancel(R->b);
        return false;
      }
      uint64_t now_seen = R->ops->progress(R->b);
      double now = R->ops->clock(R->b);
      if (now_seen != seen) {
        seen = now_seen;
        last = now;
      } else if (now - last > R->o->timeout_s) {
        stall_error(R, now - last, err);
        atomic_store(&R->cancelled, true);
        R->ops->cancel(R->b);
        return false;
      }
    }
  }
  const GError *f = stream_failure(R);
  if (f) {
    g_propagate_error(err, g_error_copy(f));
    atomic_store(&R->cancelled, true);
    R->ops->cancel(R->b);
    return false;
  }
  return true;
}

/* Runs fn on the control stream and waits for it under the watchdog. */
static bool control(struct runner *R, bool (*fn)(struct runner *, void *, GError **), void *arg,
                    GError **err) {
  struct control_job c = {R, fn, arg};
  R->ops->stream_submit(R->control, run_control, &c, UINT32_MAX);
  R->ops->event_record(R->control_end, R->control);
  return wait_events(R, &R->control_end, 1, err);
}

/* ---- steps ------------------------------------------------------------------------------- */

static bool run_step(struct runner *R, uint32_t step, GError **err) {
  const struct exec_device *d = R->dev;
  const struct plan_class *c = d->cls;
  struct exec_state *s = &R->s;
  double t0 = R->ops->clock(R->b);
  s->step = step;
  s->k->fill(s->grads, 0.0f, (size_t)d->n_params);
  R->step_fill = R->ops->clock(R->b) - t0; /* a kernel: training needs it, not the executor */
  for (uint32_t k = 0; k < d->M; k++)
    exec_mb_begin(s, k);
  R->stall_armed = R->o->fault == EXEC_FAULT_STALL && R->o->fault_rank == R->rank &&
                   R->o->fault_step == step && R->stall_instr != IR_NONE;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct plan_instr *pi = &c->instrs[i];
    struct exec_stream *st = R->streams[pi->stream];
    for (uint32_t w = 0; w < pi->wait_count; w++)
      R->ops->stream_wait_event(st, R->events[c->waits[pi->wait_first + w]]);
    R->start[i] = R->end[i] = 0;
    R->ops->stream_submit(st, run_task, &R->tasks[i], i);
    R->ops->event_record(R->events[i], st);
  }
  for (uint32_t s2 = 0; s2 < d->plan->n_streams; s2++)
    if (R->streams[s2])
      R->ops->event_record(R->stream_end[s2], R->streams[s2]);
  R->step_setup = R->ops->clock(R->b) - t0;
  bool ok = wait_events(R, R->stream_end, d->plan->n_streams, err);
  for (uint32_t k = 0; k < d->M; k++)
    exec_mb_end(s, k);
  return ok;
}

/* Executor latency of this step: per instruction, from when it could start (its stream's
 * previous instruction and the instructions it waits for were done) to its end, minus the
 * time inside kernels and communication; plus the step's setup on the submitting thread. */
static void account_step(struct runner *R) {
  const struct plan_class *c = R->dev->cls;
  double over = R->step_setup - R->step_fill;
  R->kernel_s += R->step_fill;
  for (uint32_t s = 0; s < R->dev->plan->n_streams; s++) {
    double prev_end = -INFINITY;
    for (uint32_t j = c->stream_first[s]; j < c->stream_first[s + 1]; j++) {
      uint32_t i = c->stream_instrs[j];
      const struct plan_instr *pi = &c->instrs[i];
      double ready = prev_end;
      for (uint32_t w = 0; w < pi->wait_count; w++) {
        double e = R->end[c->waits[pi->wait_first + w]];
        if (e > ready)
          ready = e;
      }
      if (!isfinite(ready) || ready > R->start[i])
        ready = R->start[i];
      double lat = (R->end[i] - ready) - R->kernel[i] - R->comm[i];
      R->dispatch_s += R->start[i] - ready;
      if (lat > 0)
        over += lat;
      R->kernel_s += R->kernel[i];
      R->comm_s += R->comm[i];
      R->task_s += R->end[i] - R->start[i];
      prev_end = R->end[i];
    }
  }
  R->overhead_s += over;
  R->instructions += c->n_instrs;
}

struct step_stats {
  double *losses; /* [dp * M] by global micro-batch */
  uint32_t n;
  double window[2]; /* -first start, last end */
};

static bool collect(struct runner *R, void *arg, GError **err) {
  struct step_stats *ss = arg;
  if (!R->ops->world_all_reduce_f64(R->b, ss->losses, ss->n, EXEC_REDUCE_SUM, err))
    return false;
  return R->ops->world_all_reduce_f64(R->b, ss->window, 2, EXEC_REDUCE_MAX, err);
}

static bool sum_fn(struct runner *R, void *arg, GError **err) {
  struct step_stats *ss = arg;
  return R->ops->world_all_reduce_f64(R->b, ss->losses, ss->n, EXEC_REDUCE_SUM, err);
}

static bool barrier(struct runner *R, void *arg, GError **err) {
  double x = 0;
  (void)arg;
  return R->ops->world_all_reduce_f64(R->b, &x, 1, EXEC_REDUCE_SUM, err);
}

/* Values every rank must agree on, each as v and -v so one max-reduction gives the range. */
struct agree {
  double v[6]; /* plan fingerprint (two 32-bit halves), step resumed from */
};

static bool agree_fn(struct runner *R, void *arg, GError **err) {
  struct agree *a = arg;
  return R->ops->world_all_reduce_f64(R->b, a->v, 6, EXEC_REDUCE_MAX, err);
}

/* ---- report ------------------------------------------------------------------------------ */

struct device_blob {
  uint32_t n_intervals, n_memory;
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
  return R->ops->world_gather(R->b, j->mine, j->mine_bytes, &j->all, &j->sizes, err);
}

struct dump_job {
  double *full;
  uint64_t n;
  enum exec_reduce_op op;
};

static bool dump_fn(struct runner *R, void *arg, GError **err) {
  struct dump_job *j = arg;
  return R->ops->world_all_reduce_f64(R->b, j->full, j->n, j->op, err);
}

static gint compare_memory_point(gconstpointer a, gconstpointer b) {
  double x = ((const struct report_memory_point *)a)->t,
         y = ((const struct report_memory_point *)b)->t;
  return x < y ? -1 : x > y;
}

static bool write_report(struct runner *R, struct exec_result *res, const double *all_losses,
                         uint32_t n_losses, const double *measured, uint32_t n_measured,
                         GError **err) {
  const struct plan *p = R->dev->plan;
  const struct plan_class *c = R->dev->cls;
  /* this rank's intervals of the last step and its memory timeline (sorted by time: workers
   * append as they finish) */
  g_array_sort(R->memory, compare_memory_point);
  struct device_blob hdr = {c->n_instrs, R->memory->len, R->s.mem_peak, {0}};
  memcpy(hdr.peak_breakdown, R->s.mem_peak_breakdown, sizeof hdr.peak_breakdown);
  size_t bytes = sizeof hdr + c->n_instrs * sizeof(struct report_interval) +
                 R->memory->len * sizeof(struct report_memory_point);
  char *blob = g_malloc(bytes);
  memcpy(blob, &hdr, sizeof hdr);
  struct report_interval *iv = (struct report_interval *)(blob + sizeof hdr);
  for (uint32_t i = 0; i < c->n_instrs; i++)
    iv[i] =
        (struct report_interval){R->start[i], R->end[i], c->instrs[i].node, c->instrs[i].stream};
  memcpy(blob + sizeof hdr + c->n_instrs * sizeof *iv, R->memory->data,
         R->memory->len * sizeof(struct report_memory_point));
  struct report_job j = {blob, bytes, NULL, NULL};
  bool ok = control(R, gather_fn, &j, err);
  g_free(blob);
  if (!ok || R->rank != 0) {
    g_free(j.all);
    g_free(j.sizes);
    return ok;
  }
  struct report_run run = {.plan = p,
                           .kind = "exec",
                           .schedule = R->o->schedule ? R->o->schedule : "custom",
                           .program_file = R->o->program_file,
                           .n_iterations = n_measured,
                           .iteration_times = measured,
                           .trace_device_limit = 0};
  report_run_init_devices(&run);
  GArray **sorted = g_new0(GArray *, p->n_devices);
  size_t off = 0;
  for (uint32_t dv = 0; dv < p->n_devices; dv++) {
    const char *base = (const char *)j.all + off;
    off += j.sizes[dv];
    struct device_blob h;
    memcpy(&h, base, sizeof h);
    struct report_device *rd = &run.devices[dv];
    /* sorted by start, as the report wants; the ones that never ran (start 0) dropped */
    sorted[dv] = g_array_new(FALSE, FALSE, sizeof(struct report_interval));
    const struct report_interval *src = (const struct report_interval *)(base + sizeof h);
    for (uint32_t k = 0; k < h.n_intervals; k++)
      if (src[k].end > src[k].start || src[k].start > 0)
        g_array_append_val(sorted[dv], src[k]);
    for (guint a = 1; a < sorted[dv]->len; a++) {
      struct report_interval v = g_array_index(sorted[dv], struct report_interval, a);
      guint b = a;
      while (b > 0 && g_array_index(sorted[dv], struct report_interval, b - 1).start > v.start) {
        g_array_index(sorted[dv], struct report_interval, b) =
            g_array_index(sorted[dv], struct report_interval, b - 1);
        b--;
      }
      g_array_index(sorted[dv], struct report_interval, b) = v;
    }
    rd->n_intervals = sorted[dv]->len;
    rd->intervals = (const struct report_interval *)sorted[dv]->data;
    rd->n_memory = h.n_memory;
    rd->memory =
        (const struct report_memory_point *)(base + sizeof h + h.n_intervals * sizeof *src);
    rd->peak_memory_bytes = h.peak;
    memcpy(rd->peak_breakdown, h.peak_breakdown, sizeof rd->peak_breakdown);
  }
  report_compute_stats(&run);
  cJSON *extra = cJSON_CreateObject();
  cJSON *losses = cJSON_AddArrayToObject(extra, "losses");
  for (uint32_t k = 0; k < n_losses; k++)
    cJSON_AddItemToArray(losses, cJSON_CreateNumber(all_losses[k]));
  cJSON_AddNumberToObject(extra, "first_step", res->first_step);
  cJSON_AddNumberToObject(extra, "warmup", R->o->warmup);
  cJSON_AddStringToObject(extra, "backend", "host");
  cJSON_AddStringToObject(extra, "communication", R->ops->comm_library(R->b));
  cJSON_AddStringToObject(extra, "data", exec_data_kind(R->s.data));
  cJSON_AddNumberToObject(extra, "executor_overhead_us_per_instruction",
                          res->job_overhead_per_instr_s * 1e6);
  cJSON_AddNumberToObject(extra, "executor_dispatch_us_per_instruction",
                          res->job_dispatch_per_instr_s * 1e6);
  cJSON_AddNumberToObject(extra, "instructions_per_step", (double)plan_instruction_count(p));
  cJSON_AddNumberToObject(extra, "kernel_seconds_rank0", res->kernel_seconds);
  cJSON_AddNumberToObject(extra, "comm_seconds_rank0", res->comm_seconds);
  run.extra = extra;
  ok = report_write_dir(&run, R->o->out_dir, err);
  cJSON_Delete(extra);
  for (uint32_t dv = 0; dv < p->n_devices; dv++)
    g_array_free(sorted[dv], TRUE);
  g_free(sorted);
  report_run_free_devices(&run);
  g_free(j.all);
  g_free(j.sizes);
  if (ok)
    res->run_dir = g_strdup(R->o->out_dir);
  return ok;
}

/* The final parameters on rank 0. Copies exist on several ranks (data-parallel replicas,
 * DualPipe's two model copies, ZeRO-3 shards, experts split over a group): every element is
 * taken from the lowest rank holding a current copy, so the result is exact. */
static bool dump_params(struct runner *R, GError **err) {
  uint64_t n = exec_model_param_total(R->s.xm);
  float *full = g_new0(float, n ? n : 1);
  bool *held = g_new0(bool, n ? n : 1);
  exec_params_export(&R->s, full, held, n);
  struct dump_job j = {g_new(double, n ? n : 1), n, EXEC_REDUCE_MIN};
  for (uint64_t i = 0; i < n; i++)
    j.full[i] = held[i] ? (double)R->rank : 1e30;
  bool ok = control(R, dump_fn, &j, err);
  for (uint64_t i = 0; ok && i < n; i++)
    j.full[i] = held[i] && j.full[i] == (double)R->rank ? full[i] : 0.0;
  j.op = EXEC_REDUCE_SUM;
  ok = ok && control(R, dump_fn, &j, err);
  if (ok && R->rank == 0) {
    for (uint64_t i = 0; i < n; i++)
      full[i] = (float)j.full[i];
    GError *e = NULL;
    if (!g_file_set_contents(R->o->dump_params_path, (const char *)full,
                             (gssize)(n * sizeof(float)), &e)) {
      g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s",
                  R->o->dump_params_path, e->message);
      g_error_free(e);
      ok = false;
    }
  }
  g_free(j.full);
  g_free(held);
  g_free(full);
  return ok;
}

/* ---- setup and the run ------------------------------------------------------------------- */

struct exec_options exec_options_default(void) {
  struct exec_options o;
  memset(&o, 0, sizeof o);
  o.iters = 10;
  o.warmup = 1;
  o.seed = 1234;
  o.lr = 1e-3f;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.0f;
  o.timeout_s = 300;
  return o;
}

void exec_result_clear(struct exec_result *r) {
  if (!r)
    return;
  g_free(r->losses);
  g_free(r->step_times);
  g_free(r->run_dir);
  memset(r, 0, sizeof *r);
}

static bool create_comms(struct runner *R, GError **err) {
  const struct exec_device *d = R->dev;
  const struct plan *p = d->plan;
  R->s.comms = g_new0(struct exec_comm *, d->n_comm_keys ? d->n_comm_keys : 1);
  uint32_t *all = g_new(uint32_t, p->n_devices);
  for (uint32_t k = 0; k < p->n_devices; k++)
    all[k] = k;
  bool ok = true;
  for (uint32_t k = 0; k < d->n_comm_keys && ok; k++) {
    const struct exec_comm_key *key = &d->comm_keys[k];
    const struct plan_comm *pc = &p->comms[key->comm];
    char label[96], cn[64];
    plan_comm_name(p, key->comm, cn, sizeof cn);
    g_snprintf(label, sizeof label, "%s (%s)", cn,
               key->stream_a < p->n_streams ? p->streams[key->stream_a].name : "?");
    GError *e = NULL;
    if (pc->purpose == IR_COMM_PP) {
      R->s.comms[k] = R->ops->comm_create(R->b, label, all, p->n_devices, true, &e);
    } else {
      const struct ir_group *g = &p->groups[pc->group];
      R->s.comms[k] =
          R->ops->comm_create(R->b, label, &p->device_pool[g->first], g->count, false, &e);
    }
    if (e) {
      g_propagate_error(err, e);
      ok = false;
    }
  }
  g_free(all);
  return ok;
}

static void print_step(uint32_t step, uint32_t total, double loss, double secs, double tokens,
                       bool warm) {
  printf("step %*u/%u  loss %.6f  %10.0f tokens/s  %8.2f ms%s\n",
         total >= 1000  ? 4
         : total >= 100 ? 3
                        : 2,
         step, total, loss, secs > 0 ? tokens / secs : 0, secs * 1e3, warm ? "  (warmup)" : "");
  fflush(stdout);
}

bool exec_run(const struct exec_options *o, const struct exec_backend_ops *ops,
              struct exec_backend *b, struct exec_result *res, GError **err) {
  memset(res, 0, sizeof *res);
  const struct plan *p = o->plan;
  uint32_t rank = ops->world_rank(b), size = ops->world_size(b);
  if (size != p->n_devices)
    return piper_input_error(err,
                     "the plan has %u devices but the job has %u processes (launch one process "
                     "per device: mpirun -np %u)",
                     p->n_devices, size, p->n_devices);
  ops->reset(b);
  /* on the heap: after a failure, workers may outlive this call */
  struct runner *R = g_new0(struct runner, 1);
  struct exec_model *xm = &R->xm;
  struct exec_device *dev = &R->device;
  if (!exec_model_init(xm, p->model, err)) {
    g_free(R);
    return false;
  }
  if (!exec_device_init(dev, p, xm, rank, err)) {
    exec_model_clear(xm);
    g_free(R);
    return false;
  }
  R->o = o;
  R->ops = ops;
  R->b = b;
  R->dev = dev;
  R->rank = rank;
  struct exec_state *s = &R->s;
  s->o = o;
  s->ops = ops;
  s->b = b;
  s->k = ops->kernels;
  s->xm = xm;
  s->dev = dev;
  g_mutex_init(&s->mem_lock);
  g_mutex_init(&s->pool_lock);
  const char *poison = getenv("PIPER_EXEC_POISON");
  s->poison = poison && strcmp(poison, "1") == 0;
  g_mutex_init(&R->trace_lock);
  R->memory = g_array_new(FALSE, FALSE, sizeof(struct report_memory_point));
  bool ok = false, clean = true;
  uint32_t n = dev->n_instrs, ns = p->n_streams;
  double *all_losses = NULL, *measured = NULL;
  uint32_t n_measured = 0;
  struct step_stats ss = {NULL, 0, {0, 0}};
  s->data = exec_data_open(o->data_path, xm->m->vocab_size, o->seed, err);
  if (!s->data)
    goto out;
  s->mbs = g_new0(struct exec_mb, dev->M);
  s->gathered = g_new0(void *, n ? n : 1);
  s->gathered_users = g_new0(atomic_uint, n ? n : 1);
  if (!exec_state_init_params(s, err))
    goto out;
  if (!create_comms(R, err))
    goto out;
  R->streams = g_new0(struct exec_stream *, ns);
  R->stream_end = g_new0(struct exec_event *, ns);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t st = dev->cls->instrs[i].stream;
    if (R->streams[st])
      continue;
    R->streams[st] = ops->stream_create(b, p->streams[st].name, p->streams[st].priority, err);
    if (!R->streams[st])
      goto out;
    R->stream_end[st] = ops->event_create(b);
  }
  R->control = ops->stream_create(b, "control", 0, err);
  if (!R->control)
    goto out;
  R->control_end = ops->event_create(b);
  R->events = g_new0(struct exec_event *, n ? n : 1);
  R->tasks = g_new0(struct task, n ? n : 1);
  for (uint32_t i = 0; i < n; i++) {
    R->events[i] = ops->event_create(b);
    R->tasks[i] = (struct task){R, i};
  }
  R->start = g_new0(double, n ? n : 1);
  R->end = g_new0(double, n ? n : 1);
  R->kernel = g_new0(double, n ? n : 1);
  R->comm = g_new0(double, n ? n : 1);
  /* the stall hook takes the first communication, or the first instruction alone */
  R->stall_instr = n ? 0 : IR_NONE;
  for (uint32_t i = n; i-- > 0;)
    if (dev->instrs[i].comm != IR_NONE)
      R->stall_instr = i;

  /* every rank must run the same plan and resume from the same step */
  uint32_t done = 0;
  if (o->resume_dir && !exec_checkpoint_read(s, o->resume_dir, &done, err))
    goto out;
  {
    uint64_t fp = 14695981039346656037ull;
    const char *mj = p->model_json ? p->model_json : "";
    const char *pj = p->program_json ? p->program_json : "";
    for (const char *c = mj; *c; c++)
      fp = (fp ^ (unsigned char)*c) * 1099511628211ull;
    for (const char *c = pj; *c; c++)
      fp = (fp ^ (unsigned char)*c) * 1099511628211ull;
    fp ^= (uint64_t)p->n_microbatches << 32 ^ plan_instruction_count(p);
    double hi32 = (double)(fp >> 32), lo32 = (double)(fp & 0xffffffffu);
    struct agree a = {{hi32, -hi32, lo32, -lo32, done, -(double)done}};
    if (!control(R, agree_fn, &a, err)) {
      clean = false;
      goto out;
    }
    if (a.v[0] != -a.v[1] || a.v[2] != -a.v[3]) {
      piper_input_error(err, "the ranks run different plans (compile every rank from the same model, "
                     "directives and options)");
      goto out;
    }
    if (a.v[4] != -a.v[5]) {
      piper_input_error(err, "%s: ranks resume from different steps (%g and %g)",
                o->resume_dir ? o->resume_dir : "--resume", -a.v[5], a.v[4]);
      goto out;
    }
  }
  uint32_t total = o->warmup + o->iters;
  if (done >= total) {
    piper_input_error(err, "%s: the checkpoint is at step %u; --warmup %u --iters %u leaves nothing to run",
              o->resume_dir, done, o->warmup, o->iters);
    goto out;
  }
  res->first_step = done + 1;
  res->n_steps = total - done;
  res->losses = g_new0(double, res->n_steps);
  res->step_times = g_new0(double, res->n_steps);
  res->tokens_per_step = (double)dev->dp_degree * dev->M * xm->T;
  measured = g_new0(double, res->n_steps);
  ss.n = dev->dp_degree * dev->M;
  ss.losses = g_new0(double, ss.n);
  for (uint32_t step = done + 1; step <= total; step++) {
    if (o->step_hook)
      o->step_hook(rank, step, o->step_hook_data);
    R->tracing = step == total;
    if (R->tracing)
      g_array_set_size(R->memory, 0);
    double wall0 = ops->clock(b);
    if (!run_step(R, step, err)) {
      clean = false;
      goto out;
    }
    bool warm = step <= o->warmup;
    if (!warm)
      account_step(R);
    memset(ss.losses, 0, ss.n * sizeof(double));
    double lo = INFINITY, hi = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
      if (R->start[i] < lo)
        lo = R->start[i];
      if (R->end[i] > hi)
        hi = R->end[i];
    }
    ss.window[0] = -lo;
    ss.window[1] = hi;
    for (uint32_t k = 0; k < dev->M; k++)
      if (s->mbs[k].has_loss)
        ss.losses[s->mbs[k].global_index] = s->mbs[k].loss;
    if (!control(R, collect, &ss, err)) {
      clean = false;
      goto out;
    }
    if (!warm)
      res->wall_seconds += ops->clock(b) - wall0;
    double loss = 0;
    for (uint32_t q = 0; q < ss.n; q++)
      loss += ss.losses[q];
    loss /= ss.n;
    double secs = ss.window[1] + ss.window[0];
    uint32_t idx = step - res->first_step;
    res->losses[idx] = loss;
    res->step_times[idx] = secs;
    if (!warm)
      measured[n_measured++] = secs;
    if (o->progress && rank == 0)
      print_step(step, total, loss, secs, res->tokens_per_step, warm);
    if (!isfinite(loss)) {
      g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "step %u: the loss is %g", step, loss);
      goto out;
    }
    if (o->checkpoint_dir && o->checkpoint_every && step % o->checkpoint_every == 0) {
      if (!exec_checkpoint_write(s, o->checkpoint_dir, step, err)) {
        clean = false;
        goto out;
      }
      if (!control(R, barrier, NULL, err)) {
        clean = false;
        goto out;
      }
      if (rank == 0 && !exec_checkpoint_commit(o->checkpoint_dir, step, size, err)) {
        clean = false;
        goto out;
      }
    }
  }
  all_losses = res->losses;
  res->instructions = R->instructions;
  res->kernel_seconds = R->kernel_s;
  res->comm_seconds = R->comm_s;
  res->task_seconds = R->task_s;
  res->overhead_per_instr_s = R->instructions ? R->overhead_s / (double)R->instructions : 0;
  res->dispatch_per_instr_s = R->instructions ? R->dispatch_s / (double)R->instructions : 0;
  res->peak_memory_bytes = s->mem_peak;
  {
    /* job-wide executor overhead: every rank's latency over every rank's instructions */
    struct step_stats tot = {g_new0(double, 3), 3, {0, 0}};
    tot.losses[0] = R->overhead_s;
    tot.losses[1] = R->dispatch_s;
    tot.losses[2] = (double)R->instructions;
    bool tok = control(R, sum_fn, &tot, err);
    if (tok && tot.losses[2] > 0) {
      res->job_overhead_per_instr_s = tot.losses[0] / tot.losses[2];
      res->job_dispatch_per_instr_s = tot.losses[1] / tot.losses[2];
    }
    g_free(tot.losses);
    if (!tok) {
      clean = false;
      goto out;
    }
  }
  if (o->dump_params_path && !dump_params(R, err)) {
    clean = false;
    goto out;
  }
  if (o->out_dir && !write_report(R, res, all_losses, res->n_steps, measured, n_measured, err)) {
    clean = false;
    goto out;
  }
  ok = true;
out:
  g_free(measured);
  g_free(ss.losses);
  /* Idle streams can be joined and the state freed. After a failure, streams may be blocked
   * in communication with a peer that is gone: cancel them and give them a moment to drain
   * (cancelled work fails fast). Communicators of an unclean end stay allocated (freeing one
   * needs every member); the caller ends the job (ops->abort). */
  bool idle = clean;
  if (!clean) {
    atomic_store(&R->cancelled, true);
    ops->cancel(b);
    idle = true;
    struct exec_event *probe = ops->event_create(b);
    for (uint32_t st = 0; R->streams && st <= ns; st++) {
      struct exec_stream *x = st < ns ? R->streams[st] : R->control;
      if (!x)
        continue;
      ops->event_record(probe, x);
      idle = idle && ops->event_synchronize(probe, 2.0);
    }
    if (idle)
      ops->event_destroy(probe);
  }
  if (!idle)
    return false; /* leave everything to the workers until the job ends */
  if (R->streams)
    for (uint32_t st = 0; st < ns; st++) {
      if (R->streams[st])
        ops->stream_destroy(R->streams[st]);
      if (R->stream_end[st])
        ops->event_destroy(R->stream_end[st]);
    }
  if (R->control)
    ops->stream_destroy(R->control);
  if (R->control_end)
    ops->event_destroy(R->control_end);
  if (R->events)
    for (uint32_t i = 0; i < n; i++)
      ops->event_destroy(R->events[i]);
  if (clean && s->comms)
    for (uint32_t k = 0; k < dev->n_comm_keys; k++)
      if (s->comms[k])
        ops->comm_destroy(s->comms[k]);
  for (uint32_t k = 0; s->mbs && k < dev->M; k++) {
    exec_mb_end(s, k);
    if (s->mbs[k].allocs) {
      g_array_free(s->mbs[k].allocs, TRUE);
      g_mutex_clear(&s->mbs[k].lock);
    }
  }
  for (uint32_t i = 0; s->gathered && i < n; i++)
    if (s->gathered[i])
      ops->release(b, s->gathered[i]);
  exec_pool_clear(s);
  g_mutex_clear(&s->pool_lock);
  exec_state_free_params(s);
  g_free(s->mbs);
  g_free(s->gathered);
  g_free(s->gathered_users);
  g_free(s->comms);
  g_free(R->streams);
  g_free(R->stream_end);
  g_free(R->events);
  g_free(R->tasks);
  g_free(R->start);
  g_free(R->end);
  g_free(R->kernel);
  g_free(R->comm);
  g_array_free(R->memory, TRUE);
  g_mutex_clear(&R->trace_lock);
  g_mutex_clear(&s->mem_lock);
  exec_data_free(s->data);
  exec_device_clear(dev);
  exec_model_clear(xm);
  g_free(R);
  if (!ok) {
    g_free(res->losses);
    g_free(res->step_times);
    res->losses = res->step_times = NULL;
  }
  return ok;
}
