/* prof chain: the host kernels in the executor's order. Each model's ops run as the executor
 * runs them on one device (forward over micro-batches, then backward in reverse, on linked
 * buffers, AdamW per segment after each step), every call timed where it stands. */
#include "../base/base.h"
#include "../kernels/kernels.h"
#include "../models/model.h"
#include "prof-impl.h"

/* ---- kernels in the executor's order ------------------------------------------------------
 * A kernel timed alone, back to back on the same buffers, runs with its operands hot in the
 * caches; the executor runs it between the other ops of the model, on one set of activation
 * buffers per micro-batch, with the weights shared. So the model's ops are run as the
 * executor runs them on one device: forward of every op for each of CHAIN_MBS micro-batches,
 * then BI in reverse op order, BW, and the fused B, every op on its micro-batch's own buffers;
 * each call is timed where it stands and an entry is the median over repeats, micro-batches
 * and every op of that kind and shape (the layers). This is a micro-benchmark of the kernels
 * alone, not a run of any plan. */
#define CHAIN_MBS 4

struct chain {
  const struct model *m;
  uint32_t n_ops;         /* the model's, then its expert-parallel variants */
  uint32_t n_model_ops;
  GArray *variants;       /* struct model_op: the expert-parallel variants */
  const struct model_op **ops; /* [n_ops] */
  bool *run;              /* [n_ops] ops timed here (kernel, first-seen shape class) */
  uint32_t *cls;          /* [n_ops] index of the op's (kind, shape) class */
  uint32_t n_classes;
  const struct model_op **class_op; /* [n_classes] an op of each class */
  struct op_bench *b;     /* [CHAIN_MBS * n_ops] */
  GArray **samples;       /* [n_classes * 4] seconds per (class, pass) */
  float **m1, **v1;       /* [n_ops] AdamW moments of each op's weights */
  size_t *n_params;       /* [n_ops] */
  GArray **opt;           /* [n_segments] AdamW seconds of each segment */
  uint8_t *linked;        /* [CHAIN_MBS * n_ops] LINK_IN: in0 borrowed, LINK_DOUT: dout */
  uint32_t n_linked;      /* ops of a micro-batch that read their predecessor's output */
  int step;
};

/* AdamW of every segment after the backward, in segment order, each timed as a whole (the
 * executor's optimizer instruction updates a segment's weights). */
static void chain_optimizer(struct chain *c) {
  c->step++;
  for (uint32_t sg = 0; sg < c->m->n_segments; sg++) {
    const struct model_segment *seg = &c->m->segments[sg];
    double t0 = piper_clock_seconds();
    bool any = false;
    for (uint32_t i = seg->op_first; i < seg->op_first + seg->op_count; i++) {
      if (!c->run[i] || c->n_params[i] == 0)
        continue;
      kernels_adamw_step(c->b[i].params, c->b[i].dparams, c->m1[i], c->v1[i], c->n_params[i], 1e-9f,
                         0.9f, 0.95f, 1e-8f, 0.0f, c->step);
      any = true;
    }
    double dt = piper_clock_seconds() - t0;
    if (any)
      g_array_append_val(c->opt[sg], dt);
  }
}

static const enum ir_pass chain_passes[4] = {IR_PASS_F, IR_PASS_BI, IR_PASS_BW, IR_PASS_B};

/* One pass over every op of micro-batches [mb0, mb1) (backward passes in reverse op order). */
static void chain_sweep(struct chain *c, int pass, int mb0, int mb1) {
  bool reverse = chain_passes[pass] != IR_PASS_F;
  for (int mb = mb0; mb < mb1; mb++)
    for (uint32_t k = 0; k < c->n_ops; k++) {
      uint32_t i = reverse ? c->n_ops - 1 - k : k;
      if (!c->run[i])
        continue;
      struct op_bench *b = &c->b[(size_t)mb * c->n_ops + i];
      b->pass = chain_passes[pass];
      if (!prof_pass_runs(b->op->kind, b->pass))
        continue;
      double t0 = piper_clock_seconds();
      prof_op_bench_run(b);
      double dt = piper_clock_seconds() - t0;
      if (c->cls[i] != UINT32_MAX) /* else measured with an earlier model: run, not kept */
        g_array_append_val(c->samples[c->cls[i] * 4 + (uint32_t)pass], dt);
    }
}

/* One step of the chain as the executor runs a pipeline stage: F of every micro-batch, then
 * each micro-batch's BI and right after it its BW (zero-bubble schedules run a micro-batch's
 * BW right after its BI or two instructions later; swept after every micro-batch's BI
 * instead, the GEMM ops' BW came out 3-6% slower, RMSNorm's 34%), then the fused B of every
 * micro-batch (1F1B-style schedules). */
static void chain_step(struct chain *c) {
  chain_sweep(c, 0, 0, CHAIN_MBS);
  for (int mb = 0; mb < CHAIN_MBS; mb++) {
    chain_sweep(c, 1, mb, mb + 1);
    chain_sweep(c, 2, mb, mb + 1);
  }
  chain_sweep(c, 3, 0, CHAIN_MBS);
}

static double array_median(GArray *a) {
  if (a->len == 0)
    return 0;
  return prof_median((double *)(void *)a->data, a->len);
}

enum { LINK_IN = 1, LINK_DOUT = 2 };

/* The executor's data flow within a micro-batch: an op reads the output its predecessor has
 * just written (still in the caches), and its backward reads the input gradient its
 * successor has just written. Each op timed on buffers of its own read them cold, and the
 * kernels came out about 10% slower than in a step. Linked where the sizes agree (a
 * residual add's second input and the MoE ops' routed rows keep their own buffers). */
static uint32_t chain_link(struct chain *c) {
  uint32_t n = 0;
  c->linked = g_new0(uint8_t, (size_t)CHAIN_MBS * c->n_ops + 1);
  for (int mb = 0; mb < CHAIN_MBS; mb++) {
    struct op_bench *prev = NULL;
    uint8_t *prev_link = NULL;
    for (uint32_t i = 0; i < c->n_model_ops; i++) {
      if (!c->run[i])
        continue;
      size_t at = (size_t)mb * c->n_ops + i;
      struct op_bench *b = &c->b[at];
      struct op_sizes zb = prof_op_sizes(b);
      if (prev && b->in0 && prev->out && prev->dout && b->din && zb.in > 0 &&
          prof_op_sizes(prev).out == zb.in) {
        g_free(b->in0);
        b->in0 = prev->out;
        g_free(prev->dout);
        prev->dout = b->din;
        c->linked[at] |= LINK_IN;
        *prev_link |= LINK_DOUT;
        n += mb == 0;
      }
      prev = b;
      prev_link = &c->linked[at];
    }
  }
  return n;
}

/* Buffers of every micro-batch of every op, the weights of micro-batch 0 shared by all. */
static void chain_init(struct chain *c, const struct model *m) {
  c->b = g_new0(struct op_bench, (size_t)CHAIN_MBS * c->n_ops + 1);
  for (uint32_t i = 0; i < c->n_ops; i++) {
    if (!c->run[i])
      continue;
    for (int mb = 0; mb < CHAIN_MBS; mb++) {
      struct op_bench *b = &c->b[(size_t)mb * c->n_ops + i];
      prof_op_bench_init(b, m, c->ops[i]);
      if (mb > 0) {
        g_free(b->params), g_free(b->dparams);
        b->params = c->b[i].params, b->dparams = c->b[i].dparams;
      }
    }
  }
  c->m1 = g_new0(float *, c->n_ops + 1);
  c->v1 = g_new0(float *, c->n_ops + 1);
  c->n_params = g_new0(size_t, c->n_ops + 1);
  for (uint32_t i = 0; i < c->n_ops; i++)
    if (c->run[i]) {
      c->n_params[i] = prof_op_sizes(&c->b[i]).params;
      c->m1[i] = g_new0(float, c->n_params[i] + 1);
      c->v1[i] = g_new0(float, c->n_params[i] + 1);
    }
  c->opt = g_new(GArray *, m->n_segments + 1);
  for (uint32_t sg = 0; sg < m->n_segments; sg++)
    c->opt[sg] = g_array_new(FALSE, FALSE, sizeof(double));
  c->n_linked = chain_link(c);
}

static void chain_free(struct chain *c) {
  for (uint32_t i = 0; i < c->n_ops; i++) {
    if (!c->run[i])
      continue;
    for (int mb = CHAIN_MBS - 1; mb >= 0; mb--) {
      size_t at = (size_t)mb * c->n_ops + i;
      struct op_bench *b = &c->b[at];
      if (mb > 0)
        b->params = b->dparams = NULL;
      if (c->linked[at] & LINK_IN)
        b->in0 = NULL; /* the previous op's out, freed with it */
      if (c->linked[at] & LINK_DOUT)
        b->dout = NULL; /* the next op's din */
      prof_op_bench_free(b);
    }
  }
  g_free(c->linked);
  for (uint32_t k = 0; k < 4 * c->n_classes; k++)
    g_array_free(c->samples[k], TRUE);
  for (uint32_t i = 0; i < c->n_ops; i++)
    g_free(c->m1[i]), g_free(c->v1[i]);
  for (uint32_t sg = 0; sg < c->m->n_segments; sg++)
    g_array_free(c->opt[sg], TRUE);
  g_free(c->m1), g_free(c->v1), g_free(c->n_params), g_free(c->opt);
  g_free(c->samples), g_free(c->b), g_free(c->run), g_free(c->cls), g_free(c->class_op);
  g_free(c->ops);
  g_array_free(c->variants, TRUE);
}

/* The ops with a kernel (all run) and the (kind, shape) classes not measured yet (kept): the
 * model's ops, then their expert-parallel variants, timed after the model's in each sweep. */
static void chain_classes(struct prof_run *r, struct chain *c, const struct model *m) {
  c->m = m;
  c->n_model_ops = m->n_ops;
  c->variants = prof_ep_variants(m);
  c->n_ops = m->n_ops + c->variants->len;
  c->ops = g_new(const struct model_op *, c->n_ops + 1);
  for (uint32_t i = 0; i < c->n_ops; i++)
    c->ops[i] = i < m->n_ops ? &m->ops[i]
                             : &g_array_index(c->variants, struct model_op, i - m->n_ops);
  c->run = g_new0(bool, c->n_ops + 1);
  c->cls = g_new0(uint32_t, c->n_ops + 1);
  c->class_op = g_new0(const struct model_op *, c->n_ops + 1);
  GHashTable *mine = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  for (uint32_t i = 0; i < c->n_ops; i++) {
    const struct model_op *op = c->ops[i];
    if (!prof_op_has_kernel(op->kind))
      continue;
    c->run[i] = true;
    c->cls[i] = UINT32_MAX;
    char *key = prof_op_shape_key(op);
    gpointer id;
    if (g_hash_table_lookup_extended(mine, key, NULL, &id)) {
      c->cls[i] = GPOINTER_TO_UINT(id);
      g_free(key);
      continue;
    }
    if (g_hash_table_contains(r->seen, key)) {
      g_free(key);
      continue;
    }
    c->cls[i] = c->n_classes;
    c->class_op[c->n_classes++] = op;
    g_hash_table_insert(mine, g_strdup(key), GUINT_TO_POINTER(c->cls[i]));
    g_hash_table_add(r->seen, key);
  }
  g_hash_table_destroy(mine);
  c->samples = g_new(GArray *, 4 * c->n_classes + 1);
  for (uint32_t k = 0; k < 4 * c->n_classes; k++)
    c->samples[k] = g_array_new(FALSE, FALSE, sizeof(double));
}

/* Bytes of every buffer of the chain: it must fit comfortably, or the ops are timed alone. */
static double chain_bytes(const struct model *m) {
  double total = 0;
  for (uint32_t i = 0; i < m->n_ops; i++)
    if (prof_op_has_kernel(m->ops[i].kind))
      total += CHAIN_MBS * prof_op_bench_bytes(m, &m->ops[i]);
  GArray *v = prof_ep_variants(m);
  for (guint i = 0; i < v->len; i++)
    total += CHAIN_MBS * prof_op_bench_bytes(m, &g_array_index(v, struct model_op, i));
  g_array_free(v, TRUE);
  return total;
}

/* A chain's figures once its sweeps are done: AdamW per segment, then each class's entries. */
static void chain_entries(struct prof_run *r, struct chain *c) {
  const struct model *m = c->m;
  for (uint32_t sg = 0; sg < m->n_segments; sg++) {
    if (c->opt[sg]->len == 0)
      continue;
    double params = 0, t = array_median(c->opt[sg]);
    for (uint32_t i = m->segments[sg].op_first;
         i < m->segments[sg].op_first + m->segments[sg].op_count; i++)
      params += (double)c->n_params[i];
    g_array_append_val(r->opt_params, params);
    g_array_append_val(r->opt_seconds, t);
    prof_progress(r, "  %s: AdamW of segment %u: %.0f parameters, %.1f us", m->name, sg, params,
                  t * 1e6);
  }
  for (uint32_t k = 0; k < c->n_classes; k++) {
    double t[4];
    for (int p = 0; p < 4; p++) {
      t[p] = array_median(c->samples[k * 4 + (uint32_t)p]);
      prof_add_entry(r, c->class_op[k], chain_passes[p], t[p]);
    }
    prof_progress_op(r, c->class_op[k], t);
  }
}

/* ---- the models' chains, timed in turns --------------------------------------------------- */

/* The chains of every model that fits (their buffers together within an eighth of the memory;
 * chained[i] says which), timed in turns: each repeat sweeps every model's chain once, so a
 * slow spell of the machine (another tenant, a frequency change) falls on every model's
 * samples alike and the medians over repeats leave it out. Timed one model after the other, a
 * spell of ten seconds moved every kernel of one model by 30% between two profiles. */
void prof_measure_chains(struct prof_run *r, const GPtrArray *models, bool *chained) {
  struct chain *cs = g_new0(struct chain, models->len + 1);
  double total = 0, limit = prof_physical_memory_bytes() / 8;
  for (guint i = 0; i < models->len; i++) {
    const struct model *m = g_ptr_array_index(models, i);
    double bytes = chain_bytes(m);
    if (total + bytes > limit)
      continue;
    total += bytes;
    chained[i] = true;
    prof_progress(r, "kernels of %s (%u ops) in the executor's order, %d micro-batches", m->name,
                  m->n_ops, CHAIN_MBS);
    chain_classes(r, &cs[i], m);
    chain_init(&cs[i], m);
    prof_progress(r, "  %s: %u ops read their predecessor's output, and hand it its gradient",
                  m->name, cs[i].n_linked);
  }
  uint32_t reps = r->a->quick ? 3 : r->a->repeats;
  for (uint32_t rep = 0; rep < r->a->warmup + 1 + reps; rep++)
    for (guint i = 0; i < models->len; i++) {
      struct chain *c = &cs[i];
      if (!chained[i])
        continue;
      if (rep == r->a->warmup + 1) { /* warm-up done */
        for (uint32_t k = 0; k < 4 * c->n_classes; k++)
          g_array_set_size(c->samples[k], 0);
        for (uint32_t sg = 0; sg < c->m->n_segments; sg++)
          g_array_set_size(c->opt[sg], 0);
      }
      chain_step(c);
      chain_optimizer(c);
    }
  for (guint i = 0; i < models->len; i++)
    if (chained[i]) {
      chain_entries(r, &cs[i]);
      chain_free(&cs[i]);
    }
  g_free(cs);
}

/* AdamW as the chains ran it, where they give two sizes or more, replaces the line through
 * the cold, isolated sizes of prof_measure_machine. */
void prof_fit_chain_optimizer(struct prof_run *r) {
  GArray *x = r->opt_params, *y = r->opt_seconds;
  bool two = false;
  for (guint i = 1; i < x->len; i++)
    two |= g_array_index(x, double, i) != g_array_index(x, double, 0);
  if (!two)
    return;
  prof_fit_line((double *)(void *)x->data, (double *)(void *)y->data, (int)x->len,
                &r->adamw_overhead, &r->adamw_per_param);
  if (r->adamw_overhead < 0)
    r->adamw_overhead = 0;
  r->optimizer_from_chain = true;
  prof_progress(r, "AdamW in the executor's order: %.2f us + %.3f ns per parameter (%u segments)",
                r->adamw_overhead * 1e6, r->adamw_per_param * 1e9, x->len);
}
