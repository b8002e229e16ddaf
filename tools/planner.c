/* planner: the search space and its parallel evaluation (planner.h). */
#include "planner.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../directives/compile.h"
#include "../sim/sim.h"

// clang-format off
const struct planner_memory_choice planner_memory_choices[] = {
    {.name = "zero0", .layout_suffix = "", .zero = 0},
    {.name = "zero1", .layout_suffix = ",zero=1", .zero = 1},
    {.name = "zero2", .layout_suffix = ",zero=2", .zero = 2},
    {.name = "zero3", .layout_suffix = ",zero=3", .zero = 3},
};
// clang-format on
const uint32_t planner_n_memory_choices = G_N_ELEMENTS(planner_memory_choices);

void planner_config_clear(struct planner_config *c) {
  g_free(c->layout);
  g_free(c->directives);
  g_free(c->error);
  memset(c, 0, sizeof *c);
}

/* ---- evaluating one configuration -------------------------------------------------------- */

static void fail_config(struct planner_config *c, GError *e, const char *fallback) {
  c->status = PLANNER_FAILED;
  c->error = g_strdup(e ? e->message : fallback);
  if (e)
    g_error_free(e);
}

/* The figures of a simulated step: throughput, peak memory, the bubble split. */
static void measure(struct planner_config *c, const struct plan *plan, const struct sim_result *r,
                    const struct profile *prof, double cap) {
  struct report_run run = {.plan = plan, .kind = "sim", .n_iterations = 1,
                           .iteration_times = &r->iteration_time};
  report_run_init_devices(&run);
  sim_fill_report(r, &run);
  report_compute_stats(&run);
  double iter = r->iteration_time, peak = 0, compute = 0;
  for (uint32_t d = 0; d < run.n_devices; d++) {
    peak = fmax(peak, (double)run.devices[d].peak_memory_bytes);
    compute += run.devices[d].compute_s;
  }
  c->iteration_time_s = iter;
  c->throughput_tokens_per_s = iter > 0 ? report_tokens_per_iteration(&run) / iter : 0;
  double peak_flops = prof->synthetic ? 0 : prof->peak_flops[plan->model->dtype];
  c->mfu = peak_flops > 0 && iter > 0
               ? (double)run.dp * plan->n_microbatches * model_flops_per_microbatch(plan->model) /
                     iter / (plan->n_devices * peak_flops)
               : 0;
  c->peak_memory_bytes = peak;
  c->memory_cap_bytes = cap;
  c->compute_s_mean = run.n_devices ? compute / run.n_devices : 0;
  c->bubble = report_bubble_split(&run);
  c->status = cap <= 0 || peak <= cap ? PLANNER_FEASIBLE : PLANNER_OVER_CAP;
  report_run_free_devices(&run);
}

/* Shared streams ordered by the costs the profile charges, as piper-sim does. */
struct plan *planner_compile_config(const struct planner_config *c, const char *model_path,
                                    int64_t seq_len, const struct profile *prof, GError **err) {
  struct compile_options o = compile_options_default();
  o.model_path = model_path;
  o.layout = c->layout;
  o.directives_path = c->directives;
  o.pp_regions = c->layout ? 0 : c->pp_regions;
  o.micro_batch_size = c->micro_batch_size;
  o.seq_len = seq_len;
  o.fp8 = c->fp8;
  o.have_schedule = true;
  o.schedule.family = c->schedule;
  o.schedule.mbs = c->microbatches;
  o.schedule.ranks = c->ranks;
  o.cost_model = prof->synthetic ? IR_COST_UNIT : IR_COST_FLOPS;
  o.no_program_text = true; /* no plan is written */
  return compile_take_plan(&o, err);
}

/* Compile and simulate without a memory timeline: only peaks are needed. */
static void evaluate_one(struct planner_config *c, const struct planner_eval *ev) {
  const struct profile *prof = ev->profiles[c->profile];
  double cap = ev->caps[c->profile];
  if (cap > 0 && c->memory_bound_bytes > cap) {
    /* its parameters, gradients and optimizer state alone exceed the cap: no schedule fits it */
    c->status = PLANNER_OVER_CAP;
    c->bounded = true;
    c->peak_memory_bytes = c->memory_bound_bytes;
    c->memory_cap_bytes = cap;
    return;
  }
  GError *e = NULL;
  struct plan *plan = planner_compile_config(c, ev->model_path, ev->seq_len, prof, &e);
  if (!plan) {
    fail_config(c, e, "compile failed");
    return;
  }
  struct sim_options so = {.collapse = ev->collapse, .no_memory_timeline = true};
  struct sim_result *r = sim_run(plan, prof, &so, &e);
  if (r)
    measure(c, plan, r, prof, ev->caps[c->profile]);
  else
    fail_config(c, e, "simulation failed");
  sim_result_free(r);
  plan_free(plan);
}

/* ---- the thread pool --------------------------------------------------------------------- */

struct pool {
  struct planner_config *configs;
  const uint32_t *index; /* configs[index[k]] is the k-th to run; NULL: configs[k] */
  uint32_t n;
  uint32_t done_before, total; /* progress over all rounds */
  const struct planner_eval *ev;
  gint next, done;
  pthread_mutex_t lock; /* progress output (a pthread mutex: ThreadSanitizer sees it, not
                          GLib's futex-based GMutex) */
  int last_tenth;
  uint32_t last_done;
  double t0;
  bool tty;
};

static void report_progress(struct pool *p, uint32_t done) {
  if (!p->ev->progress)
    return;
  pthread_mutex_lock(&p->lock);
  double t = piper_clock_seconds() - p->t0;
  done += p->done_before;
  if (done == p->last_done) { /* said already */
    pthread_mutex_unlock(&p->lock);
    return;
  }
  p->last_done = done;
  int tenth = (int)(10ull * done / p->total);
  if (p->tty) {
    fprintf(stderr, "\r\033[K%s: %u/%u configurations simulated (%.1f s)",
            p->ev->progress_name, done, p->total, t);
    if (done == p->total)
      fputc('\n', stderr);
  } else if (tenth > p->last_tenth || done == p->total) {
    /* a log or a pipe gets a line per tenth, not a carriage-return animation */
    fprintf(stderr, "%s: %u/%u configurations simulated (%.1f s)\n", p->ev->progress_name, done,
            p->total, t);
    p->last_tenth = tenth;
  }
  fflush(stderr);
  pthread_mutex_unlock(&p->lock);
}

static gpointer pool_worker(gpointer data) {
  struct pool *p = data;
  for (;;) {
    uint32_t i = (uint32_t)g_atomic_int_add(&p->next, 1);
    if (i >= p->n)
      break;
    evaluate_one(&p->configs[p->index ? p->index[i] : i], p->ev);
    report_progress(p, (uint32_t)g_atomic_int_add(&p->done, 1) + 1);
  }
  return NULL;
}

/* One round: configs[index[0 .. n)] on the pool's threads. */
static void run_round(struct pool *p, const uint32_t *index, uint32_t n) {
  p->index = index;
  p->n = n;
  p->next = 0;
  p->done = 0;
  uint32_t threads = p->ev->threads ? p->ev->threads : g_get_num_processors();
  if (threads > n)
    threads = n;
  if (threads <= 1) {
    pool_worker(p);
  } else {
    GThread **th = g_new(GThread *, threads);
    for (uint32_t t = 0; t < threads; t++)
      th[t] = g_thread_new("planner", pool_worker, p);
    for (uint32_t t = 0; t < threads; t++)
      g_thread_join(th[t]);
    g_free(th);
  }
  p->done_before += n;
}

/* Work a configuration's compile and simulation are expected to take: its instructions grow
 * with the micro-batches and the pipeline ranks (each rank's order directive re-sorts the
 * graph); one over the cap by its bound costs nothing. */
static double expected_work(const struct planner_config *c, const struct planner_eval *ev) {
  double cap = ev->caps[c->profile];
  if (cap > 0 && c->memory_bound_bytes > cap)
    return 0;
  return (double)MAX(c->microbatches, 1u) * MAX(c->stages, 1u) * MAX(c->pp, 1u);
}

static const double *sort_work; /* largest_first's qsort context (one caller at a time) */
static int by_work(const void *x, const void *y) {
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  if (sort_work[a] != sort_work[b])
    return sort_work[a] > sort_work[b] ? -1 : 1;
  return a < b ? -1 : a > b;
}

/* The order to run configs in: the largest first, so that with several threads the last to
 * finish are small ones and no thread waits alone on a big pipeline at the end (the largest
 * pipelines come last in the enumeration). Results do not depend on it: each configuration is
 * compiled and simulated on its own. */
static uint32_t *largest_first(const struct planner_config *configs, uint32_t n,
                               const struct planner_eval *ev) {
  static GMutex lock;
  double *work = g_new(double, n);
  uint32_t *index = g_new(uint32_t, n);
  for (uint32_t i = 0; i < n; i++) {
    work[i] = expected_work(&configs[i], ev);
    index[i] = i;
  }
  g_mutex_lock(&lock);
  sort_work = work;
  qsort(index, n, sizeof *index, by_work);
  sort_work = NULL;
  g_mutex_unlock(&lock);
  g_free(work);
  return index;
}

void planner_evaluate(struct planner_config *configs, uint32_t n, const struct planner_eval *ev) {
  if (n == 0)
    return;
  struct pool p = {.configs = configs, .total = n, .ev = ev, .last_tenth = 0,
                   .t0 = piper_clock_seconds(), .tty = isatty(STDERR_FILENO)};
  pthread_mutex_init(&p.lock, NULL);
  uint32_t *index = largest_first(configs, n, ev);
  run_round(&p, index, n);
  g_free(index);
  pthread_mutex_destroy(&p.lock);
}

static int status_class(enum planner_status s) {
  return s == PLANNER_FEASIBLE ? 0 : s == PLANNER_OVER_CAP ? 1 : 2;
}

static int config_rank_cmp(const void *a, const void *b) {
  const struct planner_config *x = a, *y = b;
  int cx = status_class(x->status), cy = status_class(y->status);
  if (cx != cy)
    return cx < cy ? -1 : 1;
  /* over the cap: the closest first (the least memory), what a user would shrink to fit */
  if (cx == 1 && x->peak_memory_bytes != y->peak_memory_bytes)
    return x->peak_memory_bytes < y->peak_memory_bytes ? -1 : 1;
  /* equal up to rounding (the same schedule length summed in another order) is a tie */
  double tx = x->throughput_tokens_per_s, ty = y->throughput_tokens_per_s;
  if (fabs(tx - ty) > 1e-9 * fmax(fabs(tx), fabs(ty)))
    return tx > ty ? -1 : 1;
  /* as fast: the one with more headroom */
  if (x->peak_memory_bytes != y->peak_memory_bytes)
    return x->peak_memory_bytes < y->peak_memory_bytes ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

void planner_rank(struct planner_config *configs, uint32_t n) {
  qsort(configs, n, sizeof *configs, config_rank_cmp);
}

/* ---- the search space -------------------------------------------------------------------- */

struct planner_request planner_request_default(void) {
  struct planner_request rq = {.max_interleave = 2, .collapse = true};
  for (int f = 0; f < SCHED_FAMILY_COUNT; f++)
    rq.schedules[f] = true;
  return rq;
}

/* Which schedule families run on which stage shape, and from how many pipeline ranks: with one
 * rank the plain families are all one schedule (gradient accumulation), kept once as 1F1B.
 * DualPipe (two model copies) has no layout yet. Whether a family takes a layout's ranks and
 * micro-batches is the builders' own check (sched_check), not this table's. */
static const struct {
  enum layout_shape shape;
  enum sched_family family;
  uint32_t min_pp;
} schedule_table[] = {
    {LAYOUT_LINEAR, SCHED_1F1B, 1},         {LAYOUT_LINEAR, SCHED_GPIPE, 2},
    {LAYOUT_LINEAR, SCHED_ZEROBUBBLE, 2},   {LAYOUT_INTERLEAVED, SCHED_INTERLEAVED_1F1B, 2},
    {LAYOUT_V, SCHED_ZBV, 2},               {LAYOUT_V, SCHED_DUALPIPEV, 2},
};

/* A device class of a layout's one-micro-batch plan (class_bounds). */
struct bound_class {
  double static_bytes;
  uint32_t first, count; /* its stages in layout_check.saved */
};
struct stage_saved {
  int32_t stage;
  double bytes; /* one micro-batch's forward of the stage, held until its backward */
};

/* One distinct layout spec (with its micro-batch size): checked once by the compiler itself,
 * its static memory (parameters, gradients, optimizer state: what no schedule changes) the
 * lower bound of every configuration's peak. */
struct layout_check {
  char *spec;
  int64_t micro_batch_size;
  char *error;           /* the compiler's refusal, or NULL */
  double static_bytes;   /* max over device classes: held the whole step, whatever the schedule */
  /* per device class of the one-micro-batch plan: its static memory and, per stage it runs,
   * what one micro-batch's forward leaves for that stage's backward (memory_bound) */
  uint32_t n_classes;
  struct bound_class *classes;
  GArray *saved; /* struct stage_saved, classes[k].first .. + count */
};

/* Enumeration state: the configurations so far, the distinct layouts and the model's shape. */
struct space {
  struct planner *pl;
  GArray *configs;
  GPtrArray *layouts;      /* struct layout_check *, in enumeration order */
  GHashTable *layout_index; /* "spec|mbs" -> index + 1 */
  int64_t layers, experts;
  enum model_dtype dtype;
  struct model *model;      /* the compiler's rules on the model's sizes read it (expand_tp) */
  GHashTable *skip_reasons; /* "kind\treason" -> count */
  GHashTable *skip_example; /* "kind\treason" -> the first one's message */
};

/* What the summary says of configurations kept out of the space: NOT_SEARCHED, values the
 * compiler's rules (asked while enumerating) say do not apply; REFUSED, what was generated and
 * the compiler then refused: a planner bug (counted in n_refused; test_planner wants none). */
#define NOT_SEARCHED "not searched"
#define REFUSED "refused by the compiler (a bug: please report it)"

static void skip_because(struct space *s, const char *kind, const char *reason,
                         const char *example) {
  char *key = g_strdup_printf("%s\t%s", kind, reason);
  gpointer v = g_hash_table_lookup(s->skip_reasons, key);
  if (example && !g_hash_table_contains(s->skip_example, key))
    g_hash_table_insert(s->skip_example, g_strdup(key), g_strdup(example));
  g_hash_table_replace(s->skip_reasons, key, GUINT_TO_POINTER(GPOINTER_TO_UINT(v) + 1));
  s->pl->n_refused += strcmp(kind, REFUSED) == 0;
}

static void skip(struct space *s, const char *reason) {
  skip_because(s, NOT_SEARCHED, reason, NULL);
}

/* A configuration being built, one dimension at a time (planner_dimensions). */
struct candidate {
  struct layout l;            /* pp, dp, ep, tp, sp, shape, interleave, zero */
  char stage_keys[96];        /* uneven stages: ",first-stage-layers=2,last-stage-layers=3" */
  uint32_t devices_left;      /* devices no dimension took yet: dp takes the rest */
  const struct planner_memory_choice *memory;
  const char *recompute;      /* a --layout recompute= value, or "none" */
  const char *fp8;            /* a --fp8 value, or NULL: the model file's */
  int64_t micro_batch_size;
  uint32_t microbatches;
  enum sched_family schedule;
};

/* The --layout spec of a candidate, in the order --layout documents. */
static char *candidate_spec(const struct candidate *c) {
  GString *g = g_string_new("");
  g_string_append_printf(g, "pp=%u,dp=%u,ep=%u", c->l.pp, c->l.dp, c->l.ep);
  if (c->l.etp)
    g_string_append_printf(g, ",etp=%u", c->l.etp);
  if (c->l.tp > 1)
    g_string_append_printf(g, ",tp=%u%s", c->l.tp, c->l.sequence_parallel ? ",sp" : "");
  if (c->l.cp > 1)
    g_string_append_printf(g, ",cp=%u", c->l.cp);
  if (c->l.shape == LAYOUT_V)
    g_string_append(g, ",v");
  else if (c->l.shape == LAYOUT_INTERLEAVED)
    g_string_append_printf(g, ",interleave=%u", c->l.interleave);
  g_string_append(g, c->stage_keys);
  if (c->memory)
    g_string_append(g, c->memory->layout_suffix);
  if (c->recompute && strcmp(c->recompute, "none") != 0)
    g_string_append_printf(g, ",recompute=%s", c->recompute);
  return g_string_free(g, FALSE);
}

static void next_dimension(struct space *s, uint32_t dim, const struct candidate *c);

/* tp: the degrees asked for (default 1, 2, 4, 8: a node's GPUs at most) that divide the devices
 * and that the model takes (heads, KV heads, vocabulary, FFN: the tensor_parallel rewrite's own
 * check, ir_tp_check_model; the tokens of a micro-batch under SP in expand_micro_batch), each
 * > 1 with sequence parallelism. */
static void expand_tp(struct space *s, uint32_t dim, const struct candidate *c) {
  static const uint32_t default_tp[] = {1, 2, 4, 8};
  const struct planner_request *rq = &s->pl->request;
  const uint32_t *tps = rq->tp ? rq->tp : default_tp;
  uint32_t n_tp = rq->tp ? rq->n_tp : G_N_ELEMENTS(default_tp);
  for (uint32_t i = 0; i < n_tp; i++) {
    if (tps[i] == 0 || c->devices_left % tps[i] != 0)
      continue;
    char why[160];
    if (!ir_tp_check_model(s->model, tps[i], false, why, sizeof why)) {
      g_autofree char *ex = g_strdup_printf("tp=%s", why);
      skip_because(s, NOT_SEARCHED, "tensor-parallel degree(s) the model does not take", ex);
      continue;
    }
    struct candidate d = *c;
    d.l.tp = tps[i];
    d.l.sequence_parallel = tps[i] > 1;
    d.devices_left /= tps[i];
    next_dimension(s, dim, &d);
  }
}

static bool in_list(const uint32_t *list, uint32_t n, uint32_t v) {
  for (uint32_t i = 0; i < n; i++)
    if (list[i] == v)
      return true;
  return list == NULL;
}

/* pp: every divisor of the devices left (or those of --pp); data parallelism takes the rest. */
static void expand_pp(struct space *s, uint32_t dim, const struct candidate *c) {
  const struct planner_request *rq = &s->pl->request;
  for (uint32_t pp = 1; pp <= c->devices_left; pp++) {
    if (c->devices_left % pp || !in_list(rq->pp, rq->n_pp, pp))
      continue;
    struct candidate d = *c;
    d.l.pp = pp;
    d.l.dp = c->devices_left / pp;
    d.devices_left = 1;
    next_dimension(s, dim, &d);
  }
}

/* The FP8 recipes by name (the model loader's): configurations keep these, not the caller's
 * strings. NULL: not a recipe. */
static const char *fp8_recipe(const char *name) {
  static const char *const recipes[] = {"none", "tensorwise", "blockwise"};
  for (size_t i = 0; i < G_N_ELEMENTS(recipes); i++)
    if (strcmp(name, recipes[i]) == 0)
      return recipes[i];
  return NULL;
}

/* cp: the context-parallel degrees of --cp (default 1: none) that divide the devices left;
 * whether the sequence splits into 2 x cp chunks is the compiler's check. */
static void expand_cp(struct space *s, uint32_t dim, const struct candidate *c) {
  static const uint32_t none[] = {1};
  const struct planner_request *rq = &s->pl->request;
  const uint32_t *cps = rq->cp ? rq->cp : none;
  uint32_t n_cp = rq->cp ? rq->n_cp : G_N_ELEMENTS(none);
  for (uint32_t i = 0; i < n_cp; i++) {
    if (cps[i] == 0 || c->devices_left % cps[i] != 0)
      continue;
    struct candidate d = *c;
    d.l.cp = cps[i];
    d.devices_left /= cps[i];
    next_dimension(s, dim, &d);
  }
}

/* ep: experts replicated (1), or sharded over ep of a stage's tp x cp x dp ranks (expert
 * parallelism as its own size, Megatron's expert-model-parallel groups), each expert with the
 * dense layers' TP or, under tensor parallelism, none (etp=1: every tp > 1 here has the
 * sequence parallelism that needs): ep x etp dividing the stage's ranks, ep the experts
 * (--ep LIST narrows the sizes). Context parallelism shards no experts yet (layout_parse). */
static void expand_ep(struct space *s, uint32_t dim, const struct candidate *c) {
  const struct planner_request *rq = &s->pl->request;
  struct candidate d = *c;
  d.l.ep = 1;
  d.l.etp = 0;
  next_dimension(s, dim, &d);
  if (s->experts <= 0 || c->l.cp > 1)
    return;
  uint32_t ranks = c->l.tp * c->l.cp * c->l.dp;
  for (uint32_t k = 0; k < (c->l.tp > 1 ? 2u : 1u); k++) {
    uint32_t etp = k == 0 ? c->l.tp : 1;
    for (uint32_t ep = 2; ep <= ranks / etp; ep++) {
      if ((ranks / etp) % ep != 0 || s->experts % ep != 0 || !in_list(rq->ep, rq->n_ep, ep))
        continue;
      d.l.ep = ep;
      d.l.etp = k == 0 ? 0 : etp; /* 0: the layout's default, tp */
      next_dimension(s, dim, &d);
    }
  }
}

/* Stage layer counts for a layout whose stages do not divide the layers (Llama-3.1-405B: 126
 * over 16), into keys: Megatron's account-for-embedding/loss where layers + 2 divide (the
 * embedding and the loss each weigh a layer: 7 + 14 x 8 + 7), else the middle stages
 * ceil(layers / stages) each and the first and last stage the rest, the first the lighter (it
 * holds the embedding; DeepSeek-V3's 61 over 16: 2 + 14 x 4 + 3). False when neither leaves
 * every stage a layer. */
static bool uneven_stages(int64_t layers, uint32_t stages, char *keys, size_t size) {
  if ((layers + 2) % stages == 0 && (layers + 2) / stages >= 2) {
    g_snprintf(keys, size, ",account-for-embedding,account-for-loss");
    return true;
  }
  int64_t middle = (layers + stages - 1) / stages;
  int64_t rest = layers - (int64_t)(stages - 2) * middle;
  if (stages < 2 || rest < 2)
    return false;
  g_snprintf(keys, size, ",first-stage-layers=%lld,last-stage-layers=%lld",
             (long long)(rest / 2), (long long)(rest - rest / 2));
  return true;
}

/* stages: one per rank, loops of 2 .. --max-interleave, a V; split evenly over the layers or,
 * where they do not divide, as uneven_stages says. */
static void expand_stages(struct space *s, uint32_t dim, const struct candidate *c) {
  uint32_t max_v = s->pl->request.max_interleave;
  for (uint32_t v = 1; v <= max_v + 1; v++) {
    /* v = 1: one stage per rank; 2 .. max_v: interleaved; max_v + 1 stands for the V */
    bool is_v = v == max_v + 1;
    if ((is_v || v > 1) && c->l.pp < 2)
      continue;
    struct candidate d = *c;
    d.l.shape = is_v ? LAYOUT_V : v > 1 ? LAYOUT_INTERLEAVED : LAYOUT_LINEAR;
    d.l.interleave = is_v ? 1 : v;
    d.stage_keys[0] = 0;
    uint32_t stages = layout_stages(&d.l);
    if (stages > s->layers ||
        (s->layers % stages != 0 &&
         !uneven_stages(s->layers, stages, d.stage_keys, sizeof d.stage_keys))) {
      skip(s, "stage shapes: more stages than the model's layers, or no uneven split");
      continue;
    }
    next_dimension(s, dim, &d);
  }
}

/* zero: the memory choices (planner_memory_choices) where the layout's rule says they apply
 * (layout_zero_applies: something to shard over). */
static void expand_zero(struct space *s, uint32_t dim, const struct candidate *c) {
  for (uint32_t z = 0; z < planner_n_memory_choices; z++) {
    struct candidate d = *c;
    d.memory = &planner_memory_choices[z];
    d.l.zero = d.memory->zero;
    if (layout_zero_applies(&d.l))
      next_dimension(s, dim, &d);
  }
}

/* recompute: the values of --recompute (default none). */
static void expand_recompute(struct space *s, uint32_t dim, const struct candidate *c) {
  static const char *const no_recompute[] = {"none"};
  const struct planner_request *rq = &s->pl->request;
  const char *const *rc = rq->recompute ? rq->recompute : no_recompute;
  uint32_t n_rc = rq->recompute ? rq->n_recompute : 1;
  for (uint32_t r = 0; r < n_rc; r++) {
    struct candidate d = *c;
    d.recompute = rc[r];
    next_dimension(s, dim, &d);
  }
}

/* micro-batch size, and the micro-batch count the global batch then gives each replica. */
static void expand_micro_batch(struct space *s, uint32_t dim, const struct candidate *c) {
  const struct planner_request *rq = &s->pl->request;
  for (uint32_t k = 0; k < rq->n_micro_batch_sizes; k++) {
    int64_t mbs = rq->micro_batch_sizes[k];
    uint64_t per_step = (uint64_t)c->l.dp * (uint64_t)mbs;
    if (rq->global_batch % per_step != 0) {
      skip(s, "layout and micro-batch size pairs: the global batch is not a whole number of "
              "micro-batches per replica");
      continue;
    }
    /* sequence parallelism divides the tokens of a micro-batch (one CP rank's share) */
    struct model sized = *s->model;
    sized.micro_batch_size = mbs;
    sized.seq_len = rq->seq_len > 0 ? rq->seq_len : sized.seq_len;
    sized.context_parallel = c->l.cp;
    char why[160];
    if (!ir_tp_check_model(&sized, c->l.tp, c->l.sequence_parallel, why, sizeof why)) {
      g_autofree char *ex = g_strdup_printf("tp=%s at micro-batch size %lld", why, (long long)mbs);
      skip_because(s, NOT_SEARCHED, "layout and micro-batch size pairs: the micro-batch's tokens "
                   "do not divide over tensor parallelism", ex);
      continue;
    }
    struct candidate d = *c;
    d.micro_batch_size = mbs;
    d.microbatches = (uint32_t)MIN(rq->global_batch / per_step, (uint64_t)UINT32_MAX);
    next_dimension(s, dim, &d);
  }
}

/* fp8: the recipes of --fp8 (default: the model file's; planner_new checked the profile has an
 * FP8 peak and the model is bf16). */
static void expand_fp8(struct space *s, uint32_t dim, const struct candidate *c) {
  const struct planner_request *rq = &s->pl->request;
  for (uint32_t i = 0; i < (rq->fp8 ? rq->n_fp8 : 1); i++) {
    struct candidate d = *c;
    d.fp8 = rq->fp8 ? fp8_recipe(rq->fp8[i]) : NULL;
    next_dimension(s, dim, &d);
  }
}

/* schedule: the families of the stage shape (schedule_table). */
static void expand_schedule(struct space *s, uint32_t dim, const struct candidate *c) {
  for (size_t t = 0; t < G_N_ELEMENTS(schedule_table); t++)
    if (schedule_table[t].shape == c->l.shape && c->l.pp >= schedule_table[t].min_pp &&
        s->pl->request.schedules[schedule_table[t].family]) {
      struct candidate d = *c;
      d.schedule = schedule_table[t].family;
      next_dimension(s, dim, &d);
    }
}

/* The dimensions of the search, outermost first: each is one function that gives a candidate
 * each of its values. Enumeration order (ties rank in it) follows this table. A new dimension
 * is one row here, a field of struct candidate and its key in candidate_spec (or, like fp8,
 * its compile option); the compiler's checks at the leaf (add_candidate) keep whatever it
 * cannot run out. */
static const struct {
  const char *name;
  void (*expand)(struct space *s, uint32_t dim, const struct candidate *c);
} planner_dimensions[] = {
    {"tp", expand_tp},           {"cp", expand_cp},
    {"pp", expand_pp},           {"ep", expand_ep},
    {"stages", expand_stages},   {"zero", expand_zero},
    {"recompute", expand_recompute}, {"micro-batch size", expand_micro_batch},
    {"fp8", expand_fp8},         {"schedule", expand_schedule},
};

/* The compiler's rules first (the layout's own and the schedule builder's, both cheap); the
 * rewrites' rules (experts over the shard group, tensor-parallel divisibility) once per
 * distinct layout, in check_layouts. */
static void add_candidate(struct space *s, const struct candidate *c) {
  g_autofree char *spec = candidate_spec(c);
  GError *e = NULL;
  struct layout l;
  if (!layout_parse(spec, &l, &e)) {
    skip_because(s, REFUSED, "configurations --layout refuses", e->message);
    g_error_free(e);
    return;
  }
  uint32_t stages = layout_stages(&l);
  g_autofree int32_t *stage_rank = g_new(int32_t, stages);
  for (uint32_t st = 0; st < stages; st++)
    stage_rank[st] = (int32_t)layout_stage_rank(&l, st);
  struct sched_layout sl = {.n_ranks = l.pp, .n_stages = stages, .stage_rank = stage_rank};
  for (uint32_t i = 0; i < l.n_recompute; i++)
    sl.recompute |= l.recompute[i].granularity == IR_RECOMPUTE_FULL;
  if (!sched_check(c->schedule, &sl, c->microbatches, &e)) {
    /* the builder's rule on ranks, stages and micro-batch counts (the count follows from the
     * global batch): this schedule does not apply to the layout */
    skip_because(s, NOT_SEARCHED, "configurations outside their schedule's rules (micro-batch "
                 "count or stages)", e->message);
    g_error_free(e);
    return;
  }
  g_autofree char *key = g_strdup_printf("%s|%lld", spec, (long long)c->micro_batch_size);
  uint32_t li = GPOINTER_TO_UINT(g_hash_table_lookup(s->layout_index, key));
  if (li == 0) {
    struct layout_check *lc = g_new0(struct layout_check, 1);
    lc->spec = g_strdup(spec);
    lc->micro_batch_size = c->micro_batch_size;
    g_ptr_array_add(s->layouts, lc);
    li = s->layouts->len;
    g_hash_table_insert(s->layout_index, g_steal_pointer(&key), GUINT_TO_POINTER(li));
  }
  struct planner_config pc = {0};
  pc.layout = g_steal_pointer(&spec);
  pc.schedule = c->schedule;
  pc.microbatches = c->microbatches;
  pc.micro_batch_size = c->micro_batch_size;
  pc.pp = l.pp;
  pc.dp = l.dp;
  pc.ep = l.ep;
  pc.tp = l.tp;
  pc.cp = l.cp;
  pc.etp = l.etp;
  pc.fp8 = c->fp8;
  pc.stages = stages;
  pc.memory_choice = c->memory->name;
  pc.layout_check = li - 1;
  g_array_append_val(s->configs, pc);
}

static void next_dimension(struct space *s, uint32_t dim, const struct candidate *c) {
  if (dim + 1 < G_N_ELEMENTS(planner_dimensions))
    planner_dimensions[dim + 1].expand(s, dim + 1, c);
  else
    add_candidate(s, c);
}

/* ---- the compiler's check of each distinct layout, in parallel ---------------------------- */

struct layout_pool {
  struct space *s;
  gint next;
};

/* The memory every configuration of a layout must hold, from its one-micro-batch plan, by
 * device class: the static memory (parameters, gradients, optimizer state: the whole step) and,
 * for each stage the class runs, the bytes of tensors a forward node of the stage produces and a
 * backward node (B, BI or BW) of the same stage releases: one micro-batch's activations saved
 * for backward. Every micro-batch holds the same (its shapes are the micro-batch size's). */
static void class_bounds(struct layout_check *lc, const struct plan *p,
                         const struct profile *prof) {
  int pp_tag = -1;
  for (uint32_t t = 0; t < p->n_tags; t++)
    if (strcmp(p->tag_names[t], "PP") == 0)
      pp_tag = (int)t;
  lc->n_classes = p->n_classes;
  lc->classes = g_new0(struct bound_class, p->n_classes);
  lc->saved = g_array_new(FALSE, FALSE, sizeof(struct stage_saved));
  for (uint32_t k = 0; k < p->n_classes; k++) {
    const struct plan_class *c = &p->classes[k];
    struct bound_class *bc = &lc->classes[k];
    uint64_t bytes[REPORT_MEM_KIND_COUNT];
    sim_static_memory_held(p, c, prof, bytes);
    for (int b = 0; b < REPORT_MEM_KIND_COUNT; b++)
      bc->static_bytes += (double)bytes[b];
    lc->static_bytes = fmax(lc->static_bytes, bc->static_bytes);
    bc->first = lc->saved->len;
    for (uint32_t t = 0; t < c->n_tensors && pp_tag >= 0; t++) {
      const struct ir_node *from = &p->nodes[c->instrs[c->tensors[t].producer].node];
      const struct ir_node *to = &p->nodes[c->instrs[c->tensors[t].release].node];
      if (from->kind != IR_NODE_COMPUTE || from->pass != IR_PASS_F ||
          to->kind != IR_NODE_COMPUTE || from->tags[pp_tag] < 0 ||
          to->tags[pp_tag] != from->tags[pp_tag] ||
          (to->pass != IR_PASS_B && to->pass != IR_PASS_BI && to->pass != IR_PASS_BW))
        continue;
      uint32_t j = bc->first;
      while (j < lc->saved->len &&
             g_array_index(lc->saved, struct stage_saved, j).stage != from->tags[pp_tag])
        j++;
      if (j == lc->saved->len)
        g_array_append_val(lc->saved, ((struct stage_saved){.stage = from->tags[pp_tag]}));
      g_array_index(lc->saved, struct stage_saved, j).bytes += (double)c->tensors[t].bytes;
    }
    bc->count = lc->saved->len - bc->first;
  }
}

/* Compiles the layout with one micro-batch and no schedule: every rewrite's rule runs (the
 * schedules' were checked already), and the plan's classes give the memory bound (class_bounds).
 * (The peak of the one-micro-batch step is no bound: a schedule's order can hold less at once;
 * nor is its compute a throughput ceiling: contention with communication slows it. test_planner
 * found both.) */
static void check_one_layout(struct layout_check *lc, const struct planner *pl) {
  struct compile_options o = compile_options_default();
  o.model_path = pl->request.model_path;
  o.layout = lc->spec;
  o.micro_batch_size = lc->micro_batch_size;
  o.schedule.mbs = 1;
  o.cost_model = pl->profile->synthetic ? IR_COST_UNIT : IR_COST_FLOPS;
  o.no_program_text = true;
  GError *e = NULL;
  struct plan *plan = compile_take_plan(&o, &e);
  if (!plan) {
    lc->error = g_strdup(e->message);
    g_error_free(e);
    return;
  }
  class_bounds(lc, plan, pl->profile);
  plan_free(plan);
}

/* The most one-micro-batch activations (saved[], by stage) the order of rank r holds at once:
 * after each slot, the micro-batches whose forward of a stage has run (F) and whose backward
 * of it has not started (B or BI). A slot starts when every node of the one before has ended
 * (the order's temporal edges), and every backward waits for the loss, so at that instant each
 * of them holds its saved tensors: allocated by their producer, released by their backward. */
static double schedule_held(const struct sched_rank *r, const struct stage_saved *saved,
                            uint32_t n_saved) {
  double held = 0, most = 0;
  for (uint32_t s = 0; s < r->n_slots; s++) {
    for (uint32_t a = 0; a < r->slots[s].n_actions; a++) {
      const struct sched_action *act = &r->slots[s].actions[a];
      double sign = act->pass == IR_PASS_F ? 1 : act->pass == IR_PASS_B || act->pass == IR_PASS_BI
                                                     ? -1
                                                     : 0;
      for (uint32_t j = 0; j < n_saved && sign != 0; j++)
        if (saved[j].stage == act->stage)
          held += sign * saved[j].bytes;
    }
    most = fmax(most, held);
  }
  return most;
}

/* Lower bound of configuration c's peak (bytes): over the layout's device classes, the static
 * memory plus the activations its schedule's order holds at once (schedule_held). The
 * schedule is the builder's own (the one the compiler will order by); 0 when it cannot be
 * built (the compiler's checks refused it before). */
static double memory_bound(const struct layout_check *lc, const struct planner_config *c) {
  struct layout l;
  if (!layout_parse(c->layout, &l, NULL))
    return lc->static_bytes;
  uint32_t stages = layout_stages(&l);
  g_autofree int32_t *stage_rank = g_new(int32_t, stages);
  for (uint32_t st = 0; st < stages; st++)
    stage_rank[st] = (int32_t)layout_stage_rank(&l, st);
  struct sched_layout sl = {.n_ranks = l.pp, .n_stages = stages, .stage_rank = stage_rank};
  for (uint32_t i = 0; i < l.n_recompute; i++)
    sl.recompute |= l.recompute[i].granularity == IR_RECOMPUTE_FULL;
  struct sched_program *sp = sched_build(c->schedule, &sl, c->microbatches, NULL);
  double bound = lc->static_bytes;
  for (uint32_t k = 0; k < lc->n_classes && sp; k++) {
    const struct bound_class *bc = &lc->classes[k];
    const struct stage_saved *saved = &g_array_index(lc->saved, struct stage_saved, bc->first);
    double held = 0;
    if (bc->count > 0 && saved[0].stage >= 0 && (uint32_t)saved[0].stage < stages)
      held = schedule_held(&sp->ranks[stage_rank[saved[0].stage]], saved, bc->count);
    bound = fmax(bound, bc->static_bytes + held);
  }
  sched_program_free(sp);
  return bound;
}

static gpointer layout_worker(gpointer data) {
  struct layout_pool *p = data;
  for (;;) {
    uint32_t i = (uint32_t)g_atomic_int_add(&p->next, 1);
    if (i >= p->s->layouts->len)
      break;
    check_one_layout(g_ptr_array_index(p->s->layouts, i), p->s->pl);
  }
  return NULL;
}

/* Every distinct layout through the compiler; the configurations of a refused one leave the
 * space (counted with the compiler's reason), the others get their memory lower bound. */
static void check_layouts(struct space *s) {
  struct layout_pool p = {.s = s};
  uint32_t threads = s->pl->request.threads ? s->pl->request.threads : g_get_num_processors();
  threads = MIN(threads, MAX(s->layouts->len, 1u));
  GThread **th = g_new0(GThread *, threads);
  for (uint32_t t = 1; t < threads; t++)
    th[t] = g_thread_new("planner-check", layout_worker, &p);
  layout_worker(&p);
  for (uint32_t t = 1; t < threads; t++)
    g_thread_join(th[t]);
  g_free(th);
  uint32_t kept = 0;
  GHashTable *distinct = g_hash_table_new(g_str_hash, g_str_equal);
  for (uint32_t i = 0; i < s->configs->len; i++) {
    struct planner_config *c = &g_array_index(s->configs, struct planner_config, i);
    const struct layout_check *lc = g_ptr_array_index(s->layouts, c->layout_check);
    if (lc->error) {
      skip_because(s, REFUSED, "configurations", lc->error);
      planner_config_clear(c);
      continue;
    }
    c->memory_bound_bytes = memory_bound(lc, c);
    c->order = kept;
    g_hash_table_add(distinct, c->layout);
    g_array_index(s->configs, struct planner_config, kept++) = *c;
  }
  g_array_set_size(s->configs, kept);
  s->pl->n_layouts = g_hash_table_size(distinct);
  g_hash_table_destroy(distinct);
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The skip reasons as sorted lines "kind: N reason (first: why)". */
static void describe_skips(struct space *s) {
  guint n = 0;
  char **keys = (char **)g_hash_table_get_keys_as_array(s->skip_reasons, &n);
  qsort(keys, n, sizeof *keys, compare_strings);
  for (guint i = 0; i < n; i++) {
    const char *example = g_hash_table_lookup(s->skip_example, keys[i]);
    const char *tab = strchr(keys[i], '\t');
    g_string_append_printf(s->pl->skipped, "%.*s: %u %s%s%s%s\n", (int)(tab - keys[i]), keys[i],
                           GPOINTER_TO_UINT(g_hash_table_lookup(s->skip_reasons, keys[i])),
                           tab + 1, example ? " (first: " : "", example ? example : "",
                           example ? ")" : "");
  }
  g_free(keys);
}

/* --fp8's recipes: known names, and FP8 only on a bf16 model and a profile with an FP8 peak
 * (the simulator's and the loader's rules, refused here in one line before any search). */
static bool check_fp8(const struct planner *pl, enum model_dtype dtype, GError **err) {
  const struct planner_request *rq = &pl->request;
  for (uint32_t i = 0; rq->fp8 && i < rq->n_fp8; i++) {
    if (!fp8_recipe(rq->fp8[i]))
      return piper_input_error(err, "--fp8: \"%s\" is not an FP8 recipe (tensorwise, blockwise "
                                    "or none)",
                               rq->fp8[i]);
    if (strcmp(rq->fp8[i], "none") == 0)
      continue;
    if (dtype != MODEL_DTYPE_BF16)
      return piper_input_error(err, "--fp8 %s: %s is not a bf16 model (\"piper.dtype\")",
                               rq->fp8[i], rq->model_path);
    if (!pl->profile->synthetic && !(pl->profile->peak_flops[MODEL_DTYPE_FP8] > 0))
      return piper_input_error(err, "--fp8 %s: profile %s has no FP8 peak (\"peak_tflops\"."
                                    "\"fp8\"): its device runs no FP8 GEMMs",
                               rq->fp8[i], pl->profile->name);
  }
  return true;
}

static bool load_model_shape(struct planner *pl, struct space *s, GError **err) {
  struct model *m = model_load_file(pl->request.model_path, 0, err);
  if (!m)
    return false;
  s->layers = m->num_layers;
  s->experts = m->num_experts;
  pl->model_name = g_strdup(m->name);
  pl->model_micro_batch_size = m->micro_batch_size;
  pl->model_fp8 = model_fp8_name(m->fp8);
  s->dtype = m->dtype;
  s->model = m;
  return true;
}

static void layout_check_free(gpointer p) {
  struct layout_check *lc = p;
  g_free(lc->classes);
  if (lc->saved)
    g_array_free(lc->saved, TRUE);
  g_free(lc->spec);
  g_free(lc->error);
  g_free(lc);
}

/* The space: every dimension's values (planner_dimensions), the compiler's checks, the skip
 * reasons; an input error when nothing is left. */
static bool enumerate(struct planner *pl, struct space *s, GError **err) {
  struct candidate root = {.devices_left = pl->request.devices, .l = {.cp = 1}};
  planner_dimensions[0].expand(s, 0, &root);
  check_layouts(s);
  describe_skips(s);
  if (s->configs->len > 0)
    return true;
  /* one line: the reasons joined */
  gchar **lines = g_strsplit(g_strchomp(pl->skipped->str), "\n", -1);
  g_autofree char *why = g_strjoinv("; ", lines);
  g_strfreev(lines);
  return piper_input_error(err, "no layout of %u devices fits %s with a global batch of %llu "
                                "sequences (%s)",
                           pl->request.devices, pl->request.model_path,
                           (unsigned long long)pl->request.global_batch,
                           why[0] ? why : "no schedule applies");
}

struct planner *planner_new(const struct planner_request *rq, GError **err) {
  if (rq->devices == 0 || rq->devices > LAYOUT_MAX_DEVICES)
    return piper_input_error(err, "--devices must be in [1, %u]", LAYOUT_MAX_DEVICES), NULL;
  if (rq->global_batch == 0)
    return piper_input_error(err, "--global-batch must be at least 1 sequence"), NULL;
  struct planner *pl = g_new0(struct planner, 1);
  pl->request = *rq;
  pl->skipped = g_string_new("");
  struct space s = {.pl = pl, .configs = g_array_new(FALSE, TRUE, sizeof(struct planner_config)),
                    .layouts = g_ptr_array_new_with_free_func(layout_check_free),
                    .layout_index = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                    .skip_reasons = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                    .skip_example = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free)};
  double t0 = piper_clock_seconds();
  bool ok = load_model_shape(pl, &s, err);
  if (ok) {
    pl->profile = profile_load_file(rq->profile_path, err);
    ok = pl->profile != NULL && check_fp8(pl, s.dtype, err);
  }
  int64_t own = pl->model_micro_batch_size;
  if (ok && !rq->micro_batch_sizes) {
    pl->request.micro_batch_sizes = &own;
    pl->request.n_micro_batch_sizes = 1;
  }
  if (ok) {
    ok = enumerate(pl, &s, err);
    pl->memory_cap_bytes = rq->memory_cap_gib > 0 ? rq->memory_cap_gib * (double)(1ull << 30)
                                                  : (double)pl->profile->memory_capacity;
  }
  pl->request.micro_batch_sizes = NULL; /* the caller's arrays (or `own`): not kept */
  pl->request.pp = NULL;
  pl->request.tp = NULL;
  pl->request.cp = NULL;
  pl->request.ep = NULL;
  pl->request.fp8 = NULL;
  pl->request.recompute = NULL;
  pl->check_seconds = piper_clock_seconds() - t0;
  model_free(s.model);
  g_hash_table_destroy(s.skip_reasons);
  g_hash_table_destroy(s.skip_example);
  g_hash_table_destroy(s.layout_index);
  pl->n_checked_layouts = s.layouts->len;
  g_ptr_array_free(s.layouts, TRUE);
  pl->n_configs = s.configs->len;
  pl->configs = (struct planner_config *)(void *)g_array_free(s.configs, FALSE);
  if (!ok) {
    planner_free(pl);
    return NULL;
  }
  return pl;
}

void planner_free(struct planner *pl) {
  if (!pl)
    return;
  for (uint32_t i = 0; i < pl->n_configs; i++)
    planner_config_clear(&pl->configs[i]);
  g_free(pl->configs);
  if (pl->skipped)
    g_string_free(pl->skipped, TRUE);
  profile_free(pl->profile);
  g_free(pl->model_name);
  g_free(pl);
}

bool planner_run(struct planner *pl, GError **err) {
  (void)err; /* a configuration that fails is a row, not an error of the run */
  double t0 = piper_clock_seconds();
  struct profile *profs[1] = {pl->profile};
  double caps[1] = {pl->memory_cap_bytes};
  struct planner_eval ev = {.model_path = pl->request.model_path,
                            .seq_len = pl->request.seq_len, .profiles = profs,
                            .caps = caps, .threads = pl->request.threads,
                            .progress = pl->request.progress, .collapse = pl->request.collapse,
                            .progress_name = "piper-plan"};
  pl->threads_used = ev.threads ? ev.threads : g_get_num_processors();
  planner_evaluate(pl->configs, pl->n_configs, &ev);
  pl->n_simulated = 0;
  for (uint32_t i = 0; i < pl->n_configs; i++)
    pl->n_simulated += !pl->configs[i].bounded;
  planner_rank(pl->configs, pl->n_configs);
  pl->seconds = piper_clock_seconds() - t0;
  return true;
}
