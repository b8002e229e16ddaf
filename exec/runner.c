/* runner: drives training steps through a backend. Per step it submits every instruction of
 * this device's plan to its stream in issue order, preceded by waits on the events of the
 * instructions it depends on and followed by a record of its own event, then waits for the
 * streams to drain under a watchdog. Between steps it collects the global loss and timings
 * (job-wide operations on a control stream, so a dead peer cannot block the main thread),
 * prints progress and writes checkpoints; at the end, rank 0 returns the measured run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/json.h"
#include "runner-impl.h"

/* ---- tasks ------------------------------------------------------------------------------- */

/* A tag no plan uses (MPI guarantees tags up to 32767). */
#define STALL_TAG 32767

/* Blocks like a transfer whose peer never comes: a receive from itself that nothing matches,
 * on a communicator of its own, until the run is cancelled (the real cancel path). */
static bool stall_task(struct runner *R, uint32_t i, GError **err) {
  GError *e = NULL;
  exec_comm_recv(R->b, R->fault_comm, R->rank, &R->stall_word, sizeof R->stall_word, STALL_TAG,
                 &e);
  g_clear_error(&e);
  return piper_runtime_error(err, "rank %u: stalled instruction %u cancelled", R->rank, i);
}

/* The slow-rank hook: the device kept busy for secs more, as a slower device would be; on
 * its busy clock where the backend has one (so a rank that waits for a core still does the
 * extra work), else on the wall clock. Returns the wall seconds it took. */
static double slow_down(struct runner *R, double secs) {
  double t0 = exec_backend_clock(R->b), b0, b;
  if (R->busy_known && exec_backend_busy_clock(R->b, &b0))
    while (exec_backend_busy_clock(R->b, &b) && b - b0 < secs)
      ;
  else
    while (exec_backend_clock(R->b) - t0 < secs)
      ;
  return exec_backend_clock(R->b) - t0;
}

static bool run_task(struct exec_stream *stream, void *arg, GError **err) {
  struct task *t = arg;
  struct runner *R = t->R;
  uint32_t i = t->i;
  bool compute = R->dev->instrs[i].role == EXEC_ROLE_COMPUTE;
  double t0 = exec_backend_clock(R->b), b0 = 0, b1 = 0;
  if (compute && R->busy_known)
    exec_backend_busy_clock(R->b, &b0);
  struct exec_task_ctx st = {.stream = stream};
  bool ok;
  if (R->s.forward_only && !exec_instr_in_forward(&R->dev->instrs[i])) {
    exec_skip_instr(&R->s, i, &st); /* evaluation: the forward pass alone */
    ok = true;
  } else if (R->stall_armed && i == R->stall_instr)
    ok = stall_task(R, i, err);
  else
    ok = exec_run_instr(&R->s, i, &st, err);
  if (ok && compute && R->o->hooks.slow_factor > 1 && R->rank == R->o->hooks.slow_rank) {
    double work = st.kernel_s;
    if (R->busy_known && exec_backend_busy_clock(R->b, &b1))
      work = b1 - b0;
    st.kernel_s += slow_down(R, (R->o->hooks.slow_factor - 1) * work);
  }
  if (compute && R->busy_known && exec_backend_busy_clock(R->b, &b1))
    R->busy[i] = b1 - b0;
  double t1 = exec_backend_clock(R->b);
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

/* ---- steps ------------------------------------------------------------------------------- */

/* What --clip-grad runs after the norm exchange: the update and what carries it to the
 * other shards. */
static bool deferred_role(const struct exec_instr *x) {
  return x->role == EXEC_ROLE_OPTIMIZER || x->role == EXEC_ROLE_GATHER_UPDATE;
}

/* Submits the step's instructions in issue order (phase 0: all; 1: all but the deferred;
 * 2: the deferred alone), then a record of each stream's end. */
static void submit_instrs(struct runner *R, int phase) {
  const struct exec_device *d = R->dev;
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    bool later = deferred_role(&d->instrs[i]);
    if ((phase == 1 && later) || (phase == 2 && !later))
      continue;
    const struct plan_instr *pi = &c->instrs[i];
    struct exec_stream *st = R->streams[pi->stream];
    for (uint32_t w = 0; w < pi->wait_count; w++)
      exec_stream_wait_event(R->b, st, R->events[c->waits[pi->wait_first + w]]);
    /* The first part of a point-to-point group runs every part: it waits for all their waits
     * (lowering keeps those before the group's first part). */
    for (uint32_t k = d->instrs[i].group_lead == i ? d->instrs[i].group_head : IR_NONE;
         k != IR_NONE; k = d->instrs[k].group_next)
      for (uint32_t w = 0; k != i && w < c->instrs[k].wait_count; w++)
        exec_stream_wait_event(R->b, st, R->events[c->waits[c->instrs[k].wait_first + w]]);
    R->start[i] = R->end[i] = 0;
    exec_stream_submit(R->b, st, run_task, &R->tasks[i], i);
    exec_event_record(R->b, R->events[i], st);
  }
  for (uint32_t s2 = 0; s2 < d->plan->n_streams; s2++)
    if (R->streams[s2])
      exec_event_record(R->b, R->stream_end[s2], R->streams[s2]);
}

/* This rank's share of the squared gradient norm (the streams are idle). */
static double local_norm_squares(struct runner *R) {
  double sum = 0;
  exec_backend_from_host(R->b, R->norm_sum, &sum, sizeof sum);
  exec_grad_sum_squares(&R->s, exec_backend_setup_stream(R->b), R->norm_sum);
  exec_backend_to_host(R->b, &sum, R->norm_sum, sizeof sum);
  return sum;
}

/* --clip-grad, between the step's phases: the job's norm (one sum over every rank), the
 * scale the update applies (Megatron's: limit / (norm + 1e-6) when below 1), then the
 * deferred instructions. */
static bool clip_and_update(struct runner *R, GError **err) {
  double sq = local_norm_squares(R);
  if (!exec_runner_all_reduce(R, &sq, 1, EXEC_REDUCE_SUM, err))
    return false;
  R->grad_norm = sqrt(sq);
  double coeff = R->o->clip_grad / (R->grad_norm + 1e-6);
  R->s.clip_scale = coeff < 1.0 ? (float)coeff : 1.0f;
  double t0 = exec_backend_clock(R->b);
  submit_instrs(R, 2);
  R->step_setup += exec_backend_clock(R->b) - t0;
  return exec_runner_wait_events(R, R->stream_end, R->dev->plan->n_streams, err);
}

static bool run_step(struct runner *R, uint32_t step, GError **err) {
  const struct exec_device *d = R->dev;
  struct exec_state *s = &R->s;
  double t0 = exec_backend_clock(R->b);
  s->step = step;
  s->lr = (float)exec_lr_at(&s->lr_schedule, R->o->lr, step);
  s->clip_scale = 1.0f;
  s->k->fill(exec_backend_setup_stream(R->b), s->grads, 0.0f, (size_t)d->n_store[EXEC_STORE_GRADS]);
  R->step_fill = exec_backend_clock(R->b) - t0; /* a kernel: training needs it, not the executor */
  exec_step_memory_begin(s);
  for (uint32_t k = 0; k < d->M; k++)
    exec_mb_begin(s, k);
  exec_step_memory_issue(s);
  R->stall_armed = R->o->hooks.fault == EXEC_FAULT_STALL && R->o->hooks.fault_rank == R->rank &&
                   R->o->hooks.fault_step == step && R->stall_instr != IR_NONE && !s->forward_only;
  bool split = R->defer_update && !s->forward_only;
  submit_instrs(R, split ? 1 : 0);
  R->step_setup = exec_backend_clock(R->b) - t0;
  bool ok = exec_runner_wait_events(R, R->stream_end, d->plan->n_streams, err);
  if (ok && split)
    ok = clip_and_update(R, err);
  for (uint32_t k = 0; k < d->M; k++)
    exec_mb_end(s, k);
  exec_step_memory_end(s);
  return ok;
}

/* A backend whose tasks only enqueue (cuda) times the work itself: its times replace those
 * measured around the tasks (enqueue times there), and an instruction's time is all kernel or
 * all communication, by what it ran. */
static void device_times(struct runner *R) {
  for (uint32_t i = 0; i < R->dev->n_instrs; i++) {
    double s = 0, e = 0;
    if (!exec_backend_task_times(R->b, i, &s, &e))
      return;
    bool comm = R->comm[i] > 0;
    R->start[i] = s;
    R->end[i] = e;
    R->kernel[i] = comm ? 0 : e - s;
    R->comm[i] = comm ? e - s : 0;
  }
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
      /* a deferred update (--clip-grad) was ready once the norm exchange was done */
      if (!isfinite(ready) || ready > R->start[i] ||
          (R->defer_update && deferred_role(&R->dev->instrs[i])))
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
  if (R->loop_known) {
    /* the backend's own time is the overhead: on one loop per rank, the time an instruction
     * waits while the loop runs another is the core's, not the executor's; testing posted
     * requests progresses them (a collective reduces inside the test): communication */
    over = R->step_setup - R->step_fill + R->loop_step.dispatch_s;
    R->comm_s += R->loop_step.test_s;
    R->loop_total.dispatch_s += R->loop_step.dispatch_s;
    R->loop_total.test_s += R->loop_step.test_s;
    R->loop_total.tests += R->loop_step.tests;
  }
  R->overhead_s += over;
  R->instructions += c->n_instrs;
}

static bool collect(struct runner *R, void *arg, GError **err) {
  struct step_stats *ss = arg;
  if (!exec_world_all_reduce_f64(R->b, ss->losses, ss->n + 1, EXEC_REDUCE_SUM, err) ||
      !exec_world_all_reduce_f64(R->b, ss->compute, R->dev->plan->n_devices, EXEC_REDUCE_SUM,
                                 err))
    return false;
  return exec_world_all_reduce_f64(R->b, ss->window, 4, EXEC_REDUCE_MAX, err);
}

struct reduce_job {
  double *v;
  uint64_t n;
  enum exec_reduce_op op;
};

static bool reduce_fn(struct runner *R, void *arg, GError **err) {
  struct reduce_job *j = arg;
  return exec_world_all_reduce_f64(R->b, j->v, j->n, j->op, err);
}

bool exec_runner_all_reduce(struct runner *R, double *v, uint64_t n, enum exec_reduce_op op,
                            GError **err) {
  struct reduce_job j = {v, n, op};
  return exec_runner_control(R, reduce_fn, &j, err);
}

static bool barrier(struct runner *R, void *arg, GError **err) {
  double x = 0;
  (void)arg;
  return exec_world_all_reduce_f64(R->b, &x, 1, EXEC_REDUCE_SUM, err);
}

/* Values every rank must agree on, each as v and -v so one max-reduction gives the range. */
struct agree {
  double v[6]; /* plan fingerprint (two 32-bit halves), step resumed from */
};

static bool agree_fn(struct runner *R, void *arg, GError **err) {
  struct agree *a = arg;
  return exec_world_all_reduce_f64(R->b, a->v, 6, EXEC_REDUCE_MAX, err);
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
  o.lr_schedule.wsd_decay_fraction = 0.1f;
  o.eval_iters = 1;
  o.timeout_s = 300;
  o.straggler_threshold = 0.25;
  return o;
}

void exec_result_clear(struct exec_result *r) {
  if (!r)
    return;
  g_free(r->losses);
  g_free(r->step_times);
  g_free(r->compute_seconds);
  g_free(r->stragglers);
  g_free(r->lrs);
  g_free(r->grad_norms);
  g_free(r->peak_memory);
  g_free(r->mfu);
  g_free(r->eval_steps);
  g_free(r->eval_losses);
  exec_report_free(r->report);
  memset(r, 0, sizeof *r);
}

/* "eta 1h02m", "eta 3m05s", "eta 12s": what is left at the pace of the steps run so far. */
static void format_eta(double secs, char *buf, size_t len) {
  uint64_t s = secs > 0 && secs < 1e9 ? (uint64_t)(secs + 0.5) : 0;
  if (s >= 3600)
    g_snprintf(buf, len, "eta %uh%02um", (unsigned)(s / 3600), (unsigned)(s % 3600 / 60));
  else if (s >= 60)
    g_snprintf(buf, len, "eta %um%02us", (unsigned)(s / 60), (unsigned)(s % 60));
  else
    g_snprintf(buf, len, "eta %us", (unsigned)s);
}

/* One step's line (every log_every-th step, the first and the last), with the ETA. */
static void print_step(const struct runner *R, const struct exec_result *res, uint32_t step,
                       double loss, double secs, bool warm) {
  uint32_t idx = step - res->first_step;
  uint32_t total = R->o->warmup + R->o->iters, every = MAX(R->o->log_every, 1);
  uint32_t done = step - res->first_step + 1;
  if (step != res->first_step && step != total && done % every != 0)
    return;
  char eta[32] = "";
  if (step < total)
    format_eta((piper_clock_seconds() - R->progress_t0) / done * (total - step), eta,
               sizeof eta);
  char mfu[24] = "";
  if (isfinite(res->mfu[idx]))
    g_snprintf(mfu, sizeof mfu, "  mfu %5.1f%%", res->mfu[idx] * 100);
  printf("step %*u/%u  loss %.6f  %10.0f tokens/s  %8.2f ms  lr %.3e  gnorm %.4f  mem %.1f MiB"
         "%s%s%s%s\n",
         total >= 1000  ? 4
         : total >= 100 ? 3
                        : 2,
         step, total, loss, secs > 0 ? res->tokens_per_step / secs : 0, secs * 1e3,
         res->lrs[idx], res->grad_norms[idx], res->peak_memory[idx] / (1024.0 * 1024.0), mfu,
         warm ? "  (warmup)" : "", eta[0] ? "  " : "", eta);
  fflush(stdout);
}

/* Every rank must run the same plan and resume from the same step: each value goes into one
 * max-reduction as v and -v, which gives its range. */
static bool agree_on_start(struct runner *R, uint32_t done, GError **err) {
  const struct plan *p = R->dev->plan;
  const char *mj = p->model_json ? p->model_json : "";
  const char *pj = p->program_json ? p->program_json : "";
  uint64_t fp = piper_fnv1a(PIPER_FNV1A_INIT, mj, strlen(mj));
  fp = piper_fnv1a(fp, pj, strlen(pj));
  fp ^= (uint64_t)p->n_microbatches << 32 ^ plan_instruction_count(p);
  double hi32 = (double)(fp >> 32), lo32 = (double)(fp & 0xffffffffu);
  struct agree a = {{hi32, -hi32, lo32, -lo32, done, -(double)done}};
  exec_watchdog_phase("agreeing on the plan", true);
  if (!exec_runner_control(R, agree_fn, &a, err)) {
    R->clean = false;
    return false;
  }
  if (a.v[0] != -a.v[1] || a.v[2] != -a.v[3])
    return piper_input_error(err, "the ranks run different plans (compile every rank from the "
                                  "same model, directives and options)");
  if (a.v[4] != -a.v[5])
    return piper_input_error(err, "%s: ranks resume from different steps (%g and %g)",
                             R->o->resume_dir ? R->o->resume_dir : "--resume", -a.v[5], a.v[4]);
  return true;
}

/* A checkpoint (or Hugging Face weights, --load-hf) one rank refuses is refused by the job:
 * every rank learns the lowest refusing rank, which alone reports its reason, and all end together with the input error (nothing
 * is in flight, so no abort). Changes the user allowed are said on stdout by rank 0. */
static bool resume(struct runner *R, struct exec_result *res, uint32_t *done, GError **err) {
  const struct exec_options *o = R->o;
  GError *mine = NULL;
  GString *notes = g_string_new(NULL);
  bool ok = o->resume_dir ? exec_checkpoint_read(&R->s, o->resume_dir, done, notes, &mine)
                          : exec_state_load_hf(&R->s, o->load_hf_dir, &mine);
  double first = ok ? (double)R->dev->plan->n_devices : (double)R->rank;
  if (!exec_runner_all_reduce(R, &first, 1, EXEC_REDUCE_MIN, err)) {
    R->clean = false;
    ok = false;
  } else if (first < (double)R->dev->plan->n_devices) {
    res->error_everywhere = true;
    res->error_printed_elsewhere = first != (double)R->rank;
    if (mine && !res->error_printed_elsewhere)
      g_propagate_error(err, g_steal_pointer(&mine));
    else
      piper_input_error(err, "resume: rank %g refused the checkpoint", first);
    ok = false;
  } else if (R->rank == 0 && notes->len) {
    printf("resume: from %s (step %u) with %s, allowed by --resume-allow-change\n", o->resume_dir,
           *done, notes->str);
    fflush(stdout);
  }
  g_clear_error(&mine);
  g_string_free(notes, TRUE);
  return ok;
}

/* --clip-grad runs the update after the rest of the step (submit_instrs). The plan places
 * each segment set's update after every use of its parameters and gradients in the step, so
 * what follows it on its stream reads none of them; but nothing may wait for it. */
static bool update_comes_last(struct runner *R, GError **err) {
  const struct exec_device *d = R->dev;
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    if (deferred_role(&d->instrs[i]))
      continue;
    for (uint32_t w = 0; w < c->instrs[i].wait_count; w++)
      if (deferred_role(&d->instrs[c->waits[c->instrs[i].wait_first + w]])) {
        char name[256];
        plan_node_name(d->plan, d->instrs[i].node, name, sizeof name);
        return piper_input_error(err,
                                 "--clip-grad: rank %u runs \"%s\" after the optimizer update; "
                                 "clipping needs the update last in the step",
                                 R->rank, name);
      }
  }
  return true;
}

/* The learning-rate schedule resolved for the run, and the options that go with others. */
static bool training_checks(struct runner *R, GError **err) {
  const struct exec_options *o = R->o;
  R->s.lr_schedule = o->lr_schedule;
  if (!exec_lr_schedule_resolve(&R->s.lr_schedule, o->warmup + o->iters, err))
    return false;
  R->defer_update = o->clip_grad > 0;
  if (R->defer_update && !update_comes_last(R, err))
    return false;
  if (o->lr_schedule.decay != EXEC_LR_CONSTANT && o->lr_schedule.min_lr > o->lr)
    return piper_input_error(err, "--min-lr %g is above --lr %g", (double)o->lr_schedule.min_lr,
                             (double)o->lr);
  if (o->eval_every && !o->eval_path)
    return piper_input_error(err, "--eval-every N goes with --eval-data FILE");
  return true;
}

/* Where the run starts (after a resume: the checkpoint's step) and the result's arrays. */
static bool plan_steps(struct runner *R, struct exec_result *res, GError **err) {
  const struct exec_options *o = R->o;
  uint32_t done = 0, allow = 0;
  if (!exec_resume_allow_parse(o->resume_allow_change, &allow, err))
    return false;
  if (allow && !o->resume_dir)
    return piper_input_error(err, "--resume-allow-change goes with --resume DIR");
  if (o->checkpoint_keep && !o->checkpoint_dir)
    return piper_input_error(err, "--checkpoint-keep goes with --checkpoint DIR");
  if (!training_checks(R, err))
    return false;
  if (o->load_hf_dir && o->resume_dir)
    return piper_input_error(err, "--load-hf starts a run; --resume continues one: give one");
  if ((o->resume_dir || o->load_hf_dir) && !resume(R, res, &done, err))
    return false;
  if (o->checkpoint_dir && !exec_checkpoint_begin(o->checkpoint_dir, R->rank, err))
    return false;
  if (!agree_on_start(R, done, err))
    return false;
  uint32_t total = o->warmup + o->iters;
  if (done >= total)
    return piper_input_error(
        err, "%s: the checkpoint is at step %u; --warmup %u --iters %u leaves nothing to run",
        o->resume_dir, done, o->warmup, o->iters);
  res->first_step = done + 1;
  res->n_steps = total - done;
  if (o->resume_dir && R->rank == 0) {
    printf("resume: from %s at step %u; running steps %u to %u (--warmup %u + --iters %u "
           "count from the start of training)\n",
           o->resume_dir, done, done + 1, total, o->warmup, o->iters);
    fflush(stdout);
  }
  res->losses = g_new0(double, res->n_steps);
  res->step_times = g_new0(double, res->n_steps);
  res->tokens_per_step = (double)R->dev->dp_degree * R->dev->M * R->xm.T;
  R->measured = g_new0(double, res->n_steps);
  R->ss.n = R->dev->dp_degree * R->dev->M;
  R->ss.losses = g_new0(double, R->ss.n + 1); /* and the squared gradient norm */
  res->lrs = g_new0(double, res->n_steps);
  res->grad_norms = g_new0(double, res->n_steps);
  res->peak_memory = g_new0(double, res->n_steps);
  res->mfu = g_new0(double, res->n_steps);
  R->ss.compute = g_new0(double, R->dev->plan->n_devices);
  R->compute_steps = g_array_new(FALSE, FALSE, sizeof(double));
  return true;
}

/* The step's window and losses, summed over the job on the control stream. */
static bool collect_step(struct runner *R, GError **err) {
  struct step_stats *ss = &R->ss;
  memset(ss->losses, 0, (ss->n + 1) * sizeof(double));
  double lo = INFINITY, hi = -INFINITY;
  for (uint32_t i = 0; i < R->dev->n_instrs; i++) {
    if (R->start[i] < lo)
      lo = R->start[i];
    if (R->end[i] > hi)
      hi = R->end[i];
  }
  ss->window[0] = -lo;
  ss->window[1] = hi;
  ss->window[2] = R->o->stop && *R->o->stop ? 1 : 0;
  ss->window[3] = (double)exec_backend_memory_peak(R->b, R->s.mem_peak);
  /* clipping has the norm already; otherwise the gradients are still there to measure */
  ss->losses[ss->n] = R->defer_update ? 0 : local_norm_squares(R);
  for (uint32_t k = 0; k < R->dev->M; k++)
    if (R->s.mbs[k].has_loss)
      ss->losses[R->s.mbs[k].global_index] = R->s.mbs[k].loss;
  memset(ss->compute, 0, R->dev->plan->n_devices * sizeof(double));
  for (uint32_t i = 0; i < R->dev->n_instrs; i++)
    if (R->dev->instrs[i].role == EXEC_ROLE_COMPUTE)
      ss->compute[R->rank] += R->busy_known ? R->busy[i] : R->kernel[i];
  return exec_runner_control(R, collect, ss, err);
}

/* A checkpoint every checkpoint_every steps and after the last one: every rank writes its
 * file, then rank 0 commits once all have. */
static bool checkpoint_step(struct runner *R, uint32_t step, GError **err) {
  const struct exec_options *o = R->o;
  bool last = step == o->warmup + o->iters;
  if (!o->checkpoint_dir || !o->checkpoint_every || (step % o->checkpoint_every != 0 && !last))
    return true;
  if (!exec_checkpoint_write(&R->s, o->checkpoint_dir, step, err) ||
      !exec_runner_control(R, barrier, NULL, err))
    return false;
  if (R->rank != 0)
    return true;
  if (!exec_checkpoint_commit(o->checkpoint_dir, step, o->checkpoint_keep, err))
    return false;
  printf("checkpoint: step %u written to %s/step-%u\n", step, o->checkpoint_dir, step);
  fflush(stdout);
  return true;
}

/* The step line's figures: learning rate, gradient norm, peak memory, MFU (the model's FLOPs
 * of the global batch, as metrics.json counts them, over the step's time on every device). */
static void step_figures(struct runner *R, struct exec_result *res, uint32_t idx, double secs) {
  const struct plan *p = R->dev->plan;
  res->lrs[idx] = R->s.lr;
  res->grad_norms[idx] = R->defer_update ? R->grad_norm : sqrt(R->ss.losses[R->ss.n]);
  res->peak_memory[idx] = R->ss.window[3];
  double flops = (double)R->dev->dp_degree * R->dev->M * model_flops_per_microbatch(p->model);
  res->mfu[idx] = R->o->peak_flops > 0 && secs > 0
                      ? flops / secs / ((double)p->n_devices * R->o->peak_flops)
                      : NAN;
}

/* The held-out loss after step `step`: the mean loss of the first eval_iters global batches of
 * the evaluation data (batch k as a training step k + 1 would read it), each run through the
 * plan's forward instructions alone (exec_instr_in_forward); the training data, step and
 * last step's memory trace are left as they were. */
static bool evaluate(struct runner *R, struct exec_result *res, uint32_t step, GError **err) {
  struct exec_state *s = &R->s;
  struct exec_data *train = s->data;
  uint32_t train_step_no = s->step;
  float lr = s->lr;
  bool tracing = R->tracing, ok = true;
  double *losses = g_new0(double, R->ss.n), sum = 0;
  s->data = R->eval_data;
  s->forward_only = true;
  R->tracing = false;
  R->clean = false;
  for (uint32_t k = 0; k < R->o->eval_iters && ok; k++) {
    ok = run_step(R, k + 1, err);
    memset(losses, 0, R->ss.n * sizeof(double));
    for (uint32_t q = 0; q < R->dev->M; q++)
      if (s->mbs[q].has_loss)
        losses[s->mbs[q].global_index] = s->mbs[q].loss;
    ok = ok && exec_runner_all_reduce(R, losses, R->ss.n, EXEC_REDUCE_SUM, err);
    for (uint32_t q = 0; ok && q < R->ss.n; q++)
      sum += losses[q];
  }
  g_free(losses);
  s->data = train;
  s->step = train_step_no;
  s->lr = lr;
  s->forward_only = false;
  R->tracing = tracing;
  if (!ok)
    return false;
  R->clean = true;
  double loss = sum / ((double)R->ss.n * R->o->eval_iters);
  res->eval_steps = g_renew(uint32_t, res->eval_steps, res->n_evals + 1);
  res->eval_losses = g_renew(double, res->eval_losses, res->n_evals + 1);
  res->eval_steps[res->n_evals] = step;
  res->eval_losses[res->n_evals++] = loss;
  if (R->o->progress && R->rank == 0) {
    printf("eval after step %u  loss %.6f  (%u batch%s of %s)\n", step, loss, R->o->eval_iters,
           R->o->eval_iters == 1 ? "" : "es", R->o->eval_path);
    fflush(stdout);
  }
  return true;
}

/* One training step end to end: run, account, collect the loss, report, checkpoint. */
static bool train_step(struct runner *R, struct exec_result *res, uint32_t step, GError **err) {
  const struct exec_options *o = R->o;
  uint32_t total = o->warmup + o->iters;
  char phase[64];
  g_snprintf(phase, sizeof phase, "step %u", step);
  exec_watchdog_phase(phase, true);
  if (o->hooks.step_hook)
    o->hooks.step_hook(R->rank, step, o->hooks.step_hook_data);
  R->tracing = step == total;
  if (R->tracing)
    g_array_set_size(R->memory, 0);
  double wall0 = exec_backend_clock(R->b);
  if (step == res->first_step)
    R->progress_t0 = piper_clock_seconds();
  bool warm = step <= o->warmup;
  R->clean = false; /* until the step's streams are idle again */
  struct exec_backend_loop_stats before, after;
  R->loop_known = exec_backend_loop_stats(R->b, &before);
  if (!run_step(R, step, err))
    return false;
  device_times(R);
  exec_tp_retime(&R->s, R->start, R->end, R->comm);
  exec_backend_loop_stats(R->b, &after);
  R->loop_step = (struct exec_backend_loop_stats){after.dispatch_s - before.dispatch_s,
                                                  after.test_s - before.test_s,
                                                  after.tests - before.tests,
                                                  after.items - before.items};
  if (!warm)
    account_step(R);
  if (!collect_step(R, err))
    return false;
  R->clean = true;
  if (!warm)
    res->wall_seconds += exec_backend_clock(R->b) - wall0;
  double loss = 0;
  for (uint32_t q = 0; q < R->ss.n; q++)
    loss += R->ss.losses[q];
  loss /= R->ss.n;
  double secs = R->ss.window[1] + R->ss.window[0];
  uint32_t idx = step - res->first_step;
  res->losses[idx] = loss;
  res->step_times[idx] = secs;
  step_figures(R, res, idx, secs);
  if (!warm) {
    R->measured[R->n_measured++] = secs;
    g_array_append_vals(R->compute_steps, R->ss.compute, R->dev->plan->n_devices);
    exec_runner_keep_step_trace(R, step);
  }
  if (o->progress && R->rank == 0)
    print_step(R, res, step, loss, secs, warm);
  if (!isfinite(loss)) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "step %u: the loss is %g", step, loss);
    return false;
  }
  R->clean = false;
  if (!checkpoint_step(R, step, err))
    return false;
  R->clean = true;
  if (R->eval_data && (step == total || (o->eval_every && step % o->eval_every == 0)))
    return evaluate(R, res, step, err);
  return true;
}

static bool run_steps(struct runner *R, struct exec_result *res, GError **err) {
  uint32_t total = R->o->warmup + R->o->iters;
  for (uint32_t step = res->first_step; step <= total; step++) {
    if (!train_step(R, res, step, err))
      return false;
    /* every rank saw the same flag in the step's exchange: all stop after this step */
    if (R->ss.window[2] > 0 && step < total) {
      res->stopped = true;
      res->n_steps = step - res->first_step + 1;
      return true;
    }
  }
  return true;
}

/* Every rank's mean compute per measured step, and the ranks consistently slower than their
 * peers (every rank has every rank's times: the same answer everywhere). */
static void compute_summary(struct runner *R, struct exec_result *res) {
  uint32_t n = R->dev->plan->n_devices, steps = R->n_measured;
  const double *t = (const double *)(void *)R->compute_steps->data;
  res->compute_seconds = g_new0(double, n);
  for (uint32_t s = 0; s < steps; s++)
    for (uint32_t r = 0; r < n; r++)
      res->compute_seconds[r] += t[(size_t)s * n + r] / steps;
  res->n_stragglers = exec_find_stragglers(t, steps, n, R->dev->plan->device_class,
                                           R->o->straggler_threshold, &res->stragglers);
}

/* This rank's totals, and the executor overhead over every rank's instructions. */
static bool summarise(struct runner *R, struct exec_result *res, GError **err) {
  res->instructions = R->instructions;
  res->kernel_seconds = R->kernel_s;
  res->comm_seconds = R->comm_s;
  res->task_seconds = R->task_s;
  res->overhead_per_instr_s = R->instructions ? R->overhead_s / (double)R->instructions : 0;
  res->dispatch_per_instr_s = R->instructions ? R->dispatch_s / (double)R->instructions : 0;
  if (R->loop_total.tests) {
    res->comm_test_s = R->loop_total.test_s / (double)R->loop_total.tests;
    res->comm_tests_per_instr = (double)R->loop_total.tests / (double)R->instructions;
  }
  res->peak_memory_bytes = exec_backend_memory_peak(R->b, R->s.mem_peak);
  exec_watchdog_phase("the run's summary and report", true);
  double sums[3] = {R->overhead_s, R->dispatch_s, (double)R->instructions};
  if (!exec_runner_all_reduce(R, sums, 3, EXEC_REDUCE_SUM, err)) {
    R->clean = false;
    return false;
  }
  if (sums[2] > 0) {
    res->job_overhead_per_instr_s = sums[0] / sums[2];
    res->job_dispatch_per_instr_s = sums[1] / sums[2];
  }
  compute_summary(R, res);
  return true;
}

/* The parameter dump and the run directory, when asked for. */
static bool write_outputs(struct runner *R, struct exec_result *res, GError **err) {
  const struct exec_options *o = R->o;
  R->clean = false;
  /* the run directory first: a dump that fails (a FIFO nobody reads) does not lose it */
  if (o->report &&
      !exec_runner_gather_report(R, res, res->losses, res->n_steps, R->measured, R->n_measured, err))
    return false;
  if (o->dump_params_path && !exec_runner_dump_params(R, err))
    return false;
  if (o->save_hf_dir && !exec_runner_save_hf(R, err))
    return false;
  R->clean = true;
  return true;
}

/* After a failure, tasks may be suspended on communication with a peer that is gone: cancel
 * them (each request cancelled or completed) and let the streams drain (queued work is
 * skipped). True when every stream is idle, so the state can be freed; a stream whose
 * requests could not be stopped keeps everything until the job ends. */
static bool drain_streams(struct runner *R) {
  uint32_t ns = R->dev->plan->n_streams;
  exec_backend_cancel(R->b);
  bool idle = true;
  struct exec_event *probe = exec_event_create(R->b);
  for (uint32_t st = 0; st <= ns; st++) {
    struct exec_stream *x = st < ns ? R->streams[st] : R->control;
    if (!x)
      continue;
    exec_event_record(R->b, probe, x);
    idle = idle && exec_event_synchronize(R->b, probe, 2.0);
  }
  if (idle)
    exec_event_destroy(R->b, probe);
  return idle;
}

static void destroy_streams(struct runner *R) {
  uint32_t ns = R->dev->plan->n_streams;
  for (uint32_t st = 0; st < ns; st++) {
    exec_stream_destroy(R->b, R->streams[st]);
    exec_event_destroy(R->b, R->stream_end[st]);
  }
  exec_stream_destroy(R->b, R->control);
  exec_event_destroy(R->b, R->control_end);
  for (uint32_t i = 0; i < R->dev->n_instrs; i++)
    exec_event_destroy(R->b, R->events[i]);
}

/* Communicators of an unclean end of a job of several processes stay allocated (freeing one
 * needs every member); the caller ends the job (exec_backend_abort). */
static void free_state(struct runner *R) {
  struct exec_state *s = &R->s;
  const struct exec_device *dev = R->dev;
  /* alone, this process is every member */
  bool free_comms = R->clean || exec_backend_world_size(R->b) == 1;
  if (free_comms && s->comms)
    for (uint32_t k = 0; k < dev->n_comm_keys; k++)
      exec_comm_destroy(R->b, s->comms[k]);
  if (free_comms)
    exec_comm_destroy(R->b, R->fault_comm);
  for (uint32_t k = 0; k < dev->M; k++) {
    exec_mb_end(s, k);
    if (s->mbs[k].allocs) {
      g_array_free(s->mbs[k].allocs, TRUE);
      g_mutex_clear(&s->mbs[k].lock);
    }
  }
  exec_memory_free(s); /* before the gathers: a gather's buffer may be its tensor's */
  for (uint32_t i = 0; i < dev->n_instrs; i++)
    exec_backend_release(R->b, s->gathered[i]);
  exec_pool_clear(s);
  g_mutex_clear(&s->pool_lock);
  exec_state_free_params(s);
  g_free(s->mbs);
  g_free(s->gathered);
  g_free(s->gathered_users);
  g_free(s->comms);
  g_mutex_clear(&s->mem_lock);
  exec_data_free(s->data);
  exec_data_free(R->eval_data);
  exec_backend_release(R->b, R->norm_sum);
}

static void runner_free(struct runner *R) {
  if (R->device_ready) {
    free_state(R);
    g_free(R->streams);
    g_free(R->stream_end);
    g_free(R->events);
    g_free(R->tasks);
    g_free(R->start);
    g_free(R->end);
    g_free(R->kernel);
    g_free(R->busy);
    g_free(R->comm);
    g_free(R->measured);
    g_free(R->ss.losses);
    g_free(R->ss.compute);
    if (R->compute_steps)
      g_array_free(R->compute_steps, TRUE);
    g_array_free(R->memory, TRUE);
    if (R->traced) {
      g_array_free(R->traced, TRUE);
      g_array_free(R->traced_steps, TRUE);
    }
    g_mutex_clear(&R->trace_lock);
    exec_device_clear(&R->device);
  }
  if (R->model_ready)
    exec_model_clear(&R->xm);
  g_free(R);
}

/* Idle streams can be joined and the state freed; streams that will not drain keep it all
 * until the job ends. */
static void runner_teardown(struct runner *R) {
  exec_watchdog_phase("teardown", false);
  if (R->device_ready) {
    if (!R->clean && !drain_streams(R))
      return;
    destroy_streams(R);
  }
  runner_free(R);
}

bool exec_run(const struct exec_options *o, struct exec_backend *b, struct exec_result *res,
              GError **err) {
  PIPER_ASSERT(o != NULL && o->plan != NULL && b != NULL && res != NULL);
  memset(res, 0, sizeof *res);
  uint32_t rank = exec_backend_world_rank(b), size = exec_backend_world_size(b);
  if (size != o->plan->n_devices) {
    /* every rank sees the same sizes: rank 0 alone says so, and no rank needs an abort */
    res->error_everywhere = true;
    res->error_printed_elsewhere = rank != 0;
    return piper_input_error(
        err,
        "the plan has %u devices but the job has %u processes (launch one process "
        "per device: mpirun -np %u)",
        o->plan->n_devices, size, o->plan->n_devices);
  }
  exec_backend_reset(b);
  /* on the heap: after a failure, workers may outlive this call */
  struct runner *R = g_new0(struct runner, 1);
  R->clean = true;
  bool ok = exec_runner_prepare(R, o, b, rank, err) && exec_runner_setup(R, err) && plan_steps(R, res, err) &&
            run_steps(R, res, err) && summarise(R, res, err) && write_outputs(R, res, err);
  runner_teardown(R);
  if (!ok) { /* the per-step figures go; the failure's flags and the measured run (a run
              * directory is still written after an output fails) stay */
    bool everywhere = res->error_everywhere, elsewhere = res->error_printed_elsewhere;
    struct exec_report *report = res->report;
    res->report = NULL;
    exec_result_clear(res);
    res->error_everywhere = everywhere;
    res->error_printed_elsewhere = elsewhere;
    res->report = report;
  }
  return ok;
}
