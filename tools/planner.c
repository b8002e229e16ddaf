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
    {.name = "zero0", .layout_suffix = "",        .min_dp = 1},
    {.name = "zero2", .layout_suffix = ",zero=2", .min_dp = 2},
    {.name = "zero3", .layout_suffix = ",zero=3", .min_dp = 2},
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

/* Compile (shared streams ordered by the costs the profile charges, as piper-sim does) and
 * simulate without a memory timeline: only peaks are needed. */
static void evaluate_one(struct planner_config *c, const struct planner_eval *ev) {
  const struct profile *prof = ev->profiles[c->profile];
  struct compile_options o = compile_options_default();
  o.model_path = ev->model_path;
  o.layout = c->layout;
  o.directives_path = c->directives;
  o.pp_regions = c->layout ? 0 : c->pp_regions;
  o.micro_batch_size = c->micro_batch_size;
  o.have_schedule = true;
  o.schedule.family = c->schedule;
  o.schedule.mbs = c->microbatches;
  o.schedule.ranks = c->ranks;
  o.cost_model = prof->synthetic ? IR_COST_UNIT : IR_COST_FLOPS;
  GError *e = NULL;
  struct plan *plan = compile_take_plan(&o, &e);
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
  uint32_t n;
  const struct planner_eval *ev;
  gint next, done;
  pthread_mutex_t lock; /* progress output (a pthread mutex: ThreadSanitizer sees it, not
                          GLib's futex-based GMutex) */
  int last_tenth;
  double t0;
  bool tty;
};

static void report_progress(struct pool *p, uint32_t done) {
  if (!p->ev->progress)
    return;
  pthread_mutex_lock(&p->lock);
  double t = piper_clock_seconds() - p->t0;
  int tenth = (int)(10ull * done / p->n);
  if (p->tty) {
    fprintf(stderr, "\r\033[K%s: %u/%u configurations simulated (%.1f s)",
            p->ev->progress_name, done, p->n, t);
    if (done == p->n)
      fputc('\n', stderr);
  } else if (tenth > p->last_tenth || done == p->n) {
    /* a log or a pipe gets a line per tenth, not a carriage-return animation */
    fprintf(stderr, "%s: %u/%u configurations simulated (%.1f s)\n", p->ev->progress_name, done,
            p->n, t);
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
    evaluate_one(&p->configs[i], p->ev);
    report_progress(p, (uint32_t)g_atomic_int_add(&p->done, 1) + 1);
  }
  return NULL;
}

void planner_evaluate(struct planner_config *configs, uint32_t n, const struct planner_eval *ev) {
  if (n == 0)
    return;
  struct pool p = {.configs = configs, .n = n, .ev = ev, .last_tenth = 0,
                   .t0 = piper_clock_seconds(), .tty = isatty(STDERR_FILENO)};
  pthread_mutex_init(&p.lock, NULL);
  uint32_t threads = ev->threads ? ev->threads : g_get_num_processors();
  if (threads > n)
    threads = n;
  if (threads <= 1) {
    pool_worker(&p);
  } else {
    GThread **th = g_new(GThread *, threads);
    for (uint32_t t = 0; t < threads; t++)
      th[t] = g_thread_new("planner", pool_worker, &p);
    for (uint32_t t = 0; t < threads; t++)
      g_thread_join(th[t]);
    g_free(th);
  }
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
  /* equal up to rounding (the same schedule length summed in another order) is a tie */
  double tx = x->throughput_tokens_per_s, ty = y->throughput_tokens_per_s;
  if (fabs(tx - ty) > 1e-9 * fmax(fabs(tx), fabs(ty)))
    return tx > ty ? -1 : 1;
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
 * DualPipe (two model copies) has no layout yet. */
static const struct {
  enum layout_shape shape;
  enum sched_family family;
  uint32_t min_pp;
} schedule_table[] = {
    {LAYOUT_LINEAR, SCHED_1F1B, 1},         {LAYOUT_LINEAR, SCHED_GPIPE, 2},
    {LAYOUT_LINEAR, SCHED_ZEROBUBBLE, 2},   {LAYOUT_INTERLEAVED, SCHED_INTERLEAVED_1F1B, 2},
    {LAYOUT_V, SCHED_ZBV, 2},               {LAYOUT_V, SCHED_DUALPIPEV, 2},
};

/* Enumeration state: the growing array and the model's shape. */
struct space {
  struct planner *pl;
  GArray *configs;
  int64_t layers, experts;
  int64_t heads, kv_heads, vocab, ffn, moe_ffn; /* what a tp degree must divide */
  GHashTable *skip_reasons; /* reason -> count */
};

static void skip(struct space *s, const char *reason) {
  gpointer v = g_hash_table_lookup(s->skip_reasons, reason);
  g_hash_table_replace(s->skip_reasons, g_strdup(reason), GUINT_TO_POINTER(GPOINTER_TO_UINT(v) + 1));
}

/* One configuration at the end of the enumeration. */
static void add_config(struct space *s, const struct layout *l, const char *spec,
                       const struct planner_memory_choice *mc, const char *recompute,
                       enum sched_family family, int64_t mbs, uint32_t microbatches) {
  struct planner_config c = {0};
  c.layout = strcmp(recompute, "none") == 0
                 ? g_strdup_printf("%s%s", spec, mc->layout_suffix)
                 : g_strdup_printf("%s%s,recompute=%s", spec, mc->layout_suffix, recompute);
  c.schedule = family;
  c.microbatches = microbatches;
  c.micro_batch_size = mbs;
  c.pp = l->pp;
  c.dp = l->dp;
  c.ep = l->ep;
  c.tp = l->tp;
  c.stages = layout_stages(l);
  c.memory_choice = mc->name;
  c.order = s->configs->len;
  g_array_append_val(s->configs, c);
}

/* Every micro-batch size, memory choice and schedule of one layout (spec without the memory
 * choice's suffix). */
static void add_layout(struct space *s, const struct layout *l, const char *spec) {
  const struct planner_request *rq = &s->pl->request;
  uint32_t before = s->configs->len;
  for (uint32_t k = 0; k < rq->n_micro_batch_sizes; k++) {
    int64_t mbs = rq->micro_batch_sizes[k];
    uint64_t per_step = (uint64_t)l->dp * (uint64_t)mbs;
    if (rq->global_batch % per_step != 0 || rq->global_batch / per_step > DIR_MAX_MICROBATCHES) {
      skip(s, "layout and micro-batch size pairs: the global batch is not a whole number of "
              "micro-batches per replica");
      continue;
    }
    static const char *const no_recompute[] = {"none"};
    const char *const *rc = rq->recompute ? rq->recompute : no_recompute;
    uint32_t n_rc = rq->recompute ? rq->n_recompute : 1;
    for (uint32_t z = 0; z < planner_n_memory_choices; z++) {
      if (l->dp < planner_memory_choices[z].min_dp)
        continue;
      for (uint32_t r = 0; r < n_rc; r++)
        for (size_t t = 0; t < G_N_ELEMENTS(schedule_table); t++)
          if (schedule_table[t].shape == l->shape && l->pp >= schedule_table[t].min_pp &&
              rq->schedules[schedule_table[t].family])
            add_config(s, l, spec, &planner_memory_choices[z], rc[r], schedule_table[t].family,
                       mbs, (uint32_t)(rq->global_batch / per_step));
    }
  }
  s->pl->n_layouts += s->configs->len > before;
}

/* Stage layer counts for a layout whose stages do not divide the layers (Llama-3.1-405B: 126
 * over 16), appended to spec: Megatron's account-for-embedding/loss where layers + 2 divide
 * (the embedding and the loss each weigh a layer: 7 + 14 x 8 + 7), else the middle stages
 * ceil(layers / stages) each and the first and last stage the rest, the first the lighter (it
 * holds the embedding; DeepSeek-V3's 61 over 16: 2 + 14 x 4 + 3). False when neither leaves
 * every stage a layer. */
static bool uneven_stages(int64_t layers, uint32_t stages, char *spec, size_t size) {
  size_t n = strlen(spec);
  if ((layers + 2) % stages == 0 && (layers + 2) / stages >= 2) {
    g_snprintf(spec + n, size - n, ",account-for-embedding,account-for-loss");
    return true;
  }
  int64_t middle = (layers + stages - 1) / stages;
  int64_t rest = layers - (int64_t)(stages - 2) * middle;
  if (rest < 2)
    return false;
  g_snprintf(spec + n, size - n, ",first-stage-layers=%lld,last-stage-layers=%lld",
             (long long)(rest / 2), (long long)(rest - rest / 2));
  return true;
}

/* One pp x dp x ep x tp with each stage shape, its stages splitting the model's layers evenly
 * or, where they do not divide, as uneven_stages says. */
static void add_shapes(struct space *s, uint32_t pp, uint32_t dp, uint32_t ep, uint32_t tp) {
  uint32_t max_v = s->pl->request.max_interleave;
  for (uint32_t v = 1; v <= max_v + 1; v++) {
    /* v = 1: one stage per rank; 2 .. max_v: interleaved; max_v + 1 stands for the V */
    bool is_v = v == max_v + 1;
    struct layout l = {.pp = pp, .dp = dp, .ep = ep, .interleave = 1, .shape = LAYOUT_LINEAR,
                       .tp = tp, .cp = 1, .sequence_parallel = tp > 1};
    char spec[192];
    int n = g_snprintf(spec, sizeof spec, "pp=%u,dp=%u,ep=%u", pp, dp, ep);
    if (tp > 1)
      n += g_snprintf(spec + n, sizeof spec - (size_t)n, ",tp=%u,sp", tp);
    if (is_v) {
      l.shape = LAYOUT_V;
      g_snprintf(spec + n, sizeof spec - (size_t)n, ",v");
    } else if (v > 1) {
      l.shape = LAYOUT_INTERLEAVED;
      l.interleave = v;
      g_snprintf(spec + n, sizeof spec - (size_t)n, ",interleave=%u", v);
    }
    if ((is_v || v > 1) && pp < 2)
      continue;
    uint32_t stages = layout_stages(&l);
    if (stages > s->layers ||
        (s->layers % stages != 0 && !uneven_stages(s->layers, stages, spec, sizeof spec))) {
      skip(s, "layouts: the stages do not split the model's layers");
      continue;
    }
    add_layout(s, &l, spec);
  }
}

static bool in_list(const uint32_t *list, uint32_t n, uint32_t v) {
  for (uint32_t i = 0; i < n; i++)
    if (list[i] == v)
      return true;
  return list == NULL;
}

/* A tensor-parallel degree the model takes: it divides the heads, the KV heads (no KV head
 * replication), the vocabulary and the FFN widths (tensor_parallel.c refuses the others). */
static bool tp_divides_model(const struct space *s, uint32_t tp) {
  return s->heads % tp == 0 && s->kv_heads % tp == 0 && s->vocab % tp == 0 &&
         (s->ffn == 0 || s->ffn % tp == 0) && (s->moe_ffn == 0 || s->moe_ffn % tp == 0);
}

/* Every pp x dp at one tp degree (pp x dp x tp = devices); ep 1, or dp when the model has
 * experts that dp divides. */
static void enumerate_tp(struct space *s, uint32_t tp) {
  uint32_t n = s->pl->request.devices / tp;
  for (uint32_t pp = 1; pp <= n; pp++) {
    if (n % pp || !in_list(s->pl->request.pp, s->pl->request.n_pp, pp))
      continue;
    uint32_t dp = n / pp;
    add_shapes(s, pp, dp, 1, tp);
    if (dp > 1 && s->experts > 0) {
      if (s->experts % dp == 0)
        add_shapes(s, pp, dp, dp, tp);
      else
        skip(s, "layouts: expert parallelism over dp, and dp does not divide the experts");
    }
  }
}

/* The tp degrees asked for (default 1, 2, 4, 8: a node's GPUs at most) that divide the devices
 * and the model, each with its pp x dp layouts. */
static void enumerate(struct space *s) {
  static const uint32_t default_tp[] = {1, 2, 4, 8};
  const struct planner_request *rq = &s->pl->request;
  const uint32_t *tps = rq->tp ? rq->tp : default_tp;
  uint32_t n_tp = rq->tp ? rq->n_tp : G_N_ELEMENTS(default_tp);
  for (uint32_t i = 0; i < n_tp; i++) {
    uint32_t tp = tps[i];
    if (tp == 0 || rq->devices % tp != 0)
      continue;
    if (tp > 1 && !tp_divides_model(s, tp)) {
      skip(s, "tensor-parallel degrees: tp does not divide the heads, KV heads, vocabulary or "
              "FFN");
      continue;
    }
    enumerate_tp(s, tp);
  }
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The skip reasons as sorted lines "N layouts: reason". */
static void describe_skips(struct space *s) {
  guint n = 0;
  char **keys = (char **)g_hash_table_get_keys_as_array(s->skip_reasons, &n);
  qsort(keys, n, sizeof *keys, compare_strings);
  for (guint i = 0; i < n; i++)
    g_string_append_printf(s->pl->skipped, "left out: %u %s\n",
                           GPOINTER_TO_UINT(g_hash_table_lookup(s->skip_reasons, keys[i])),
                           keys[i]);
  g_free(keys);
}

static bool load_model_shape(struct planner *pl, struct space *s, GError **err) {
  struct model *m = model_load_file(pl->request.model_path, 0, err);
  if (!m)
    return false;
  s->layers = m->num_layers;
  s->experts = m->num_experts;
  s->heads = m->num_heads;
  s->kv_heads = m->num_kv_heads;
  s->vocab = m->vocab_size;
  s->ffn = m->intermediate_size;
  s->moe_ffn = m->moe_intermediate_size;
  pl->model_name = g_strdup(m->name);
  pl->model_micro_batch_size = m->micro_batch_size;
  model_free(m);
  return true;
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
                    .skip_reasons = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL)};
  bool ok = load_model_shape(pl, &s, err);
  if (ok) {
    pl->profile = profile_load_file(rq->profile_path, err);
    ok = pl->profile != NULL;
  }
  int64_t own = pl->model_micro_batch_size;
  if (ok && !rq->micro_batch_sizes) {
    pl->request.micro_batch_sizes = &own;
    pl->request.n_micro_batch_sizes = 1;
  }
  if (ok) {
    enumerate(&s);
    describe_skips(&s);
    pl->request.micro_batch_sizes = NULL; /* the caller's arrays (or `own`): not kept */
    pl->request.pp = NULL;
    pl->request.recompute = NULL;
    pl->memory_cap_bytes = rq->memory_cap_gib > 0 ? rq->memory_cap_gib * (double)(1ull << 30)
                                                  : (double)pl->profile->memory_capacity;
    if (s.configs->len == 0) {
      /* one line: the reasons joined */
      gchar **lines = g_strsplit(g_strchomp(pl->skipped->str), "\n", -1);
      g_autofree char *why = g_strjoinv("; ", lines);
      g_strfreev(lines);
      ok = piper_input_error(err, "no layout of %u devices fits %s with a global batch of %llu "
                                  "sequences (%s)",
                             rq->devices, rq->model_path, (unsigned long long)rq->global_batch,
                             why[0] ? why : "no schedule applies");
    }
  }
  g_hash_table_destroy(s.skip_reasons);
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
  struct planner_eval ev = {.model_path = pl->request.model_path, .profiles = profs,
                            .caps = caps, .threads = pl->request.threads,
                            .progress = pl->request.progress, .collapse = pl->request.collapse,
                            .progress_name = "piper-plan"};
  pl->threads_used = ev.threads ? ev.threads : g_get_num_processors();
  planner_evaluate(pl->configs, pl->n_configs, &ev);
  planner_rank(pl->configs, pl->n_configs);
  pl->seconds = piper_clock_seconds() - t0;
  return true;
}
