/* runner_setup: a run's setup before its first step (exec/runner.c runs the steps): the
 * model and this device's program, the state, the host-memory check, the communicators and
 * the streams. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/assert.h"
#include "runner-impl.h"

/* A DP, EP, TP or CP communicator: its group whole, or with split (tensor parallelism, TP
 * innermost) each instance of it in turn (every rank creates every instance, members or not):
 * TP the runs of split consecutive positions, DP and EP the positions with one TP rank, CP the
 * split positions of one TP and one DP rank (stride the TP degree). This
 * rank keeps its own instance. */
static struct exec_comm *create_split_comm(struct runner *R, const struct plan_comm *pc,
                                           const char *label, GError **err) {
  const struct plan *p = R->dev->plan;
  const struct ir_group *g = &p->groups[pc->group];
  const uint32_t *pool = &p->device_pool[g->first];
  uint32_t split = pc->split > 1 && g->count % pc->split == 0 ? pc->split : 1;
  if (split == 1 && !pc->block)
    return exec_comm_create(R->b, label, pool, g->count, false, err);
  /* every instance in the order of its first position (the same on every rank), its members
   * as the plan says (plan_comm_members: TP runs, one TP rank's devices, EP blocks) */
  uint32_t size = plan_comm_size(p, (uint32_t)(pc - p->comms));
  uint32_t *members = g_new(uint32_t, size ? size : 1);
  bool *covered = g_new0(bool, g->count);
  struct exec_comm *mine = NULL;
  for (uint32_t q = 0; q < g->count; q++) {
    if (covered[q])
      continue;
    plan_comm_members(p, (uint32_t)(pc - p->comms), pool[q], members);
    for (uint32_t k = 0; k < size; k++)
      covered[plan_group_position(p, pc->group, members[k])] = true;
    struct exec_comm *c = exec_comm_create(R->b, label, members, size, false, err);
    if (c)
      mine = c;
    else if (*err)
      break;
  }
  g_free(covered);
  g_free(members);
  return mine;
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
    char phase[160];
    g_snprintf(phase, sizeof phase, "creating communicator %s", label);
    exec_watchdog_phase(phase, false);
    if (pc->purpose == IR_COMM_PP) {
      R->s.comms[k] = exec_comm_create(R->b, label, all, p->n_devices, true, &e);
    } else {
      R->s.comms[k] = create_split_comm(R, pc, label, &e);
    }
    if (e) {
      g_propagate_error(err, e);
      ok = false;
    }
  }
  if (ok && R->o->hooks.fault == EXEC_FAULT_STALL) {
    /* every rank runs with the same fault option: all take part */
    exec_watchdog_phase("creating the fault injection's communicator", false);
    R->fault_comm = exec_comm_create(R->b, "fault injection", all, p->n_devices, true, err);
    ok = R->fault_comm != NULL;
  }
  g_free(all);
  return ok;
}

/* The device program and the state it trains, before anything runs: false (nothing to undo
 * but the model and device, which the caller frees) on an input error. */
/* MemAvailable in /proc/meminfo, bytes; 0 when unknown (not Linux). */
static uint64_t host_memory_available(void) {
  char *text = NULL;
  uint64_t kib = 0;
  if (!g_file_get_contents("/proc/meminfo", &text, NULL, NULL))
    return 0;
  const char *line = strstr(text, "MemAvailable:");
  if (line)
    kib = g_ascii_strtoull(line + strlen("MemAvailable:"), NULL, 10);
  g_free(text);
  return kib * 1024;
}

/* A model the host cannot hold is refused before anything is allocated, with the figures,
 * rather than ending in an allocation failure mid-setup. The estimate: parameters, gradients
 * and AdamW's two moments in float32, plus every buffer of one step held at once (an upper
 * bound on activations: the host backend computes in float32), times the ranks this machine
 * runs (the launcher's local size). A backend with device memory of its own is not judged
 * by the host's. */
static bool check_host_memory(const struct runner *R, struct exec_backend *b, GError **err) {
  if (!exec_backend_host_memory(b))
    return true;
  uint64_t avail = host_memory_available();
  if (!avail)
    return true;
  const struct plan_class *c = R->device.cls;
  size_t dtype = model_dtype_bytes(R->device.plan->model->dtype);
  uint64_t acts = 0;
  for (uint32_t t = 0; t < c->n_tensors; t++)
    acts += c->tensors[t].bytes / dtype * sizeof(float);
  const uint64_t *st = R->device.n_store;
  uint64_t stat = (st[EXEC_STORE_PARAMS] + st[EXEC_STORE_GRADS] + 2 * st[EXEC_STORE_STATE]) *
                  sizeof(float);
  uint64_t ranks = exec_backend_local_size(b);
  uint64_t need = (stat + acts) * ranks;
  if (need <= avail)
    return true;
  const double gib = (double)(1ull << 30);
  return piper_input_error(
      err,
      "%s does not fit this machine's memory: about %.1f GiB needed (%.1f GiB of parameters, "
      "gradients and optimizer state, %.1f GiB of activations per rank, %llu rank%s here) but "
      "%.1f GiB is available (MemAvailable in /proc/meminfo)",
      R->device.plan->model->name, (double)need / gib, (double)stat / gib, (double)acts / gib,
      (unsigned long long)ranks, ranks == 1 ? "" : "s", (double)avail / gib);
}

bool exec_runner_prepare(struct runner *R, const struct exec_options *o, struct exec_backend *b,
                           uint32_t rank, GError **err) {
  /* every op the plan runs is in b's tables (every rank sees the whole plan: all refuse) */
  if (!exec_check_ops(b, o->plan, err))
    return false;
  if (!exec_model_init(&R->xm, o->plan->model, err))
    return false;
  R->model_ready = true;
  if (!exec_device_init(&R->device, o->plan, &R->xm, rank, err))
    return false;
  R->device_ready = true;
  exec_tp_model_shape(&R->xm, &R->device);
  R->o = o;
  R->b = b;
  R->dev = &R->device;
  R->rank = rank;
  struct exec_state *s = &R->s;
  s->o = o;
  s->b = b;
  s->k = exec_backend_kernels(b);
  s->xm = &R->xm;
  s->dev = &R->device;
  s->poison = o->hooks.poison;
  g_mutex_init(&s->mem_lock);
  g_mutex_init(&s->pool_lock);
  g_mutex_init(&R->trace_lock);
  R->memory = g_array_new(FALSE, FALSE, sizeof(struct report_memory_point));
  uint32_t n = R->dev->n_instrs;
  s->mbs = g_new0(struct exec_mb, R->dev->M);
  s->gathered = g_new0(void *, n ? n : 1);
  s->gathered_users = g_new0(atomic_uint, n ? n : 1);
  R->events = g_new0(struct exec_event *, n ? n : 1);
  R->tasks = g_new0(struct task, n ? n : 1);
  R->start = g_new0(double, n ? n : 1);
  R->end = g_new0(double, n ? n : 1);
  R->kernel = g_new0(double, n ? n : 1);
  R->comm = g_new0(double, n ? n : 1);
  R->busy = g_new0(double, n ? n : 1);
  double busy0;
  R->busy_known = o->plan->n_devices > 1 && exec_backend_busy_clock(b, &busy0);
  R->streams = g_new0(struct exec_stream *, o->plan->n_streams);
  R->stream_end = g_new0(struct exec_event *, o->plan->n_streams);
  return check_host_memory(R, b, err);
}

/* Whether instruction x is communication of kind k. */
static bool stall_kind_matches(const struct exec_instr *x, enum exec_stall_kind k) {
  switch (k) {
  case EXEC_STALL_ANY: return x->comm != IR_NONE;
  case EXEC_STALL_SEND: return x->role == EXEC_ROLE_SEND;
  case EXEC_STALL_RECV: return x->role == EXEC_ROLE_RECV;
  case EXEC_STALL_ALL_REDUCE: return x->role == EXEC_ROLE_ALL_REDUCE;
  case EXEC_STALL_REDUCE_SCATTER: return x->role == EXEC_ROLE_REDUCE_SCATTER;
  case EXEC_STALL_ALL_TO_ALL:
    return x->role == EXEC_ROLE_A2A_TO_EXPERT || x->role == EXEC_ROLE_A2A_FROM_EXPERT;
  case EXEC_STALL_ALL_GATHER:
    return x->role == EXEC_ROLE_GATHER_USE || x->role == EXEC_ROLE_GATHER_UPDATE;
  }
  return false;
}

/* The instruction a stall of kind k takes: the first of that kind in plan order; for ANY
 * with no communication at all, the first instruction. */
static uint32_t stall_target(const struct exec_device *d, enum exec_stall_kind k) {
  for (uint32_t i = 0; i < d->n_instrs; i++)
    if (stall_kind_matches(&d->instrs[i], k))
      return i;
  return k == EXEC_STALL_ANY && d->n_instrs ? 0 : IR_NONE;
}

/* One stream per plan stream this device uses, plus the control stream; an event per
 * instruction and one at each stream's end. */
static bool create_streams(struct runner *R, GError **err) {
  const struct plan *p = R->dev->plan;
  uint32_t n = R->dev->n_instrs;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t st = R->dev->cls->instrs[i].stream;
    if (R->streams[st])
      continue;
    R->streams[st] = exec_stream_create(R->b, p->streams[st].name, p->streams[st].priority, err);
    if (!R->streams[st])
      return false;
    R->stream_end[st] = exec_event_create(R->b);
  }
  R->control = exec_stream_create(R->b, "control", 0, err);
  if (!R->control)
    return false;
  R->control_end = exec_event_create(R->b);
  for (uint32_t i = 0; i < n; i++) {
    R->events[i] = exec_event_create(R->b);
    R->tasks[i] = (struct task){R, i};
  }
  R->stall_instr = stall_target(R->dev, R->o->hooks.fault_kind);
  return true;
}

/* Data, parameters, communicators and streams. */
bool exec_runner_setup(struct runner *R, GError **err) {
  struct exec_state *s = &R->s;
  if (R->o->hooks.step_hook)
    R->o->hooks.step_hook(R->rank, 0, R->o->hooks.step_hook_data);
  if (!exec_backend_configure(R->b, R->o->plan, R->rank, err))
    return false;
  s->data = exec_data_open(R->o->data_path, R->xm.m->vocab_size, R->o->seed, err);
  if (s->data && R->o->eval_path)
    R->eval_data = exec_data_open(R->o->eval_path, R->xm.m->vocab_size, R->o->seed, err);
  R->norm_sum = exec_backend_alloc(R->b, sizeof(double));
  return s->data && (!R->o->eval_path || R->eval_data) && exec_state_init_params(s, err) &&
         create_comms(R, err) && create_streams(R, err);
}

