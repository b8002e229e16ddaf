/* report statistics: devices and their ranks, the run's window and the pinned per-device
 * figures (bubble, exposed communication, overlap;
 * docs/design.md, "The simulator's definitions"). */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *report_mem_kind_name(enum report_mem_kind k) {
  static const char *const names[REPORT_MEM_KIND_COUNT] = {
      "params", "grads", "optimizer", "activations", "gathered_params", "comm"};
  return (unsigned)k < REPORT_MEM_KIND_COUNT ? names[k] : "?";
}

bool report_node_is_compute(const struct ir_node *n) {
  return n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_OPTIMIZER;
}

int64_t report_device_layers(const struct plan *p, const struct report_device *d) {
  const struct model *m = p->model;
  g_autofree bool *seen = g_new0(bool, (size_t)m->pp_regions + 1);
  int64_t layers = 0;
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    const struct ir_node *n = &p->nodes[d->intervals[k].node];
    int32_t st = n->tags[MODEL_TAG_PP];
    if (n->kind != IR_NODE_COMPUTE || st < 0 || st >= m->pp_regions || seen[st])
      continue;
    seen[st] = true;
    layers += m->pp_layers[st];
  }
  return layers;
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
  /* Under tensor parallelism a stage's devices are tp x dp, TP innermost: tp devices make one
   * data-parallel replica (and one batch of tokens). */
  uint32_t tp = 1;
  for (uint32_t i = 0; i < p->n_nodes; i++) /* compute: a copies' sum splits its group too */
    if (p->nodes[i].kind == IR_NODE_COMPUTE && p->nodes[i].tp_degree > tp)
      tp = p->nodes[i].tp_degree;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    struct report_device *rd = &r->devices[d];
    rd->device = d;
    rd->pp_rank = -1;
    rd->dp_rank = -1;
    rd->tp_rank = 0;
    int32_t s = cls_stage[p->device_class[d]];
    for (uint32_t k = 0; k < pp; k++)
      if (sv[k] == s) {
        rd->pp_rank = (int32_t)k;
        rd->tp_rank = (int32_t)(count[k] % tp);
        rd->dp_rank = (int32_t)(count[k]++ / tp);
        break;
      }
  }
  r->pp = pp;
  r->tp = tp;
  r->cp = p->model->context_parallel > 1 ? (uint32_t)p->model->context_parallel : 1;
  r->dp = 0;
  for (uint32_t k = 0; k < pp; k++)
    if (count[k] / tp > r->dp)
      r->dp = count[k] / tp;
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

void report_run_window(const struct report_run *r, double *t0, double *t1) {
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
  report_run_window(r, &t0, &t1);
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

/* Idle time splits into imbalance (what the device would have computed with as much work as
 * the busiest device) and pipeline idle (the rest), so that the bubble is the sum of pipeline
 * idle, exposed communication and imbalance. */
static void split_idle(struct report_run *r) {
  double busiest = 0;
  for (uint32_t i = 0; i < r->n_devices; i++)
    busiest = fmax(busiest, r->devices[i].compute_s);
  for (uint32_t i = 0; i < r->n_devices; i++) {
    struct report_device *d = &r->devices[i];
    d->imbalance_s = fmin(d->idle_s, busiest - d->compute_s);
    d->pipeline_idle_s = d->idle_s - d->imbalance_s;
  }
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
  split_idle(r);
}

struct report_bubble_split report_bubble_split(const struct report_run *r) {
  struct report_bubble_split s = {0};
  double iter = report_iteration_time(r);
  if (r->n_devices == 0 || !(iter > 0))
    return s;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    s.bubble += d->bubble_fraction;
    s.pipeline_idle += d->pipeline_idle_s / iter;
    s.exposed_comm += d->exposed_comm_s / iter;
    s.imbalance += d->imbalance_s / iter;
  }
  s.bubble /= r->n_devices;
  s.pipeline_idle /= r->n_devices;
  s.exposed_comm /= r->n_devices;
  s.imbalance /= r->n_devices;
  return s;
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

