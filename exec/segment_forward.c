/* segment_forward: a segment's forward F (and its rerun R under recomputation) on one
 * micro-batch, op by op through the backend's kernel table, with what its backward will read
 * kept in the saved activations.
 *
 * Inside a segment every tensor version is a value (SSA): ops read values and write new ones,
 * so the backward finds each op's inputs as the forward saw them. Memory follows the plan's
 * rule (ir/plan.h, memory.c): a forward keeps in its saved tensor exactly what its backward
 * reads, outputs live in the tensors that carry them until their last reader, everything else
 * only while its op group runs (one model layer: model_group_end; no value a later group
 * reads is a transient, so the workspace of group 0 is all released when the group ends). */
#include "train-impl.h"

/* ---- a run's values and what it keeps -------------------------------------------------------- */

/* Whether the segment's backward reads value v (so the forward keeps it in its saved
 * activations): an input of a norm, attention, MLP, router or head (their weight gradients,
 * and the norm's input gradient, need it), the routing of the local experts, the router's
 * output. */
static bool value_kept(const struct exec_segment *es, int32_t v) {
  for (uint32_t j = 0; j < es->n_ops; j++) {
    const struct exec_seg_op *so = &es->ops[j];
    switch (so->kind) {
    case MODEL_OP_RMSNORM:
    case MODEL_OP_ATTENTION:
    case MODEL_OP_MLP:
    case MODEL_OP_SHARED_EXPERT:
    case MODEL_OP_LM_HEAD_LOSS:
      if (so->in[0] == v)
        return true;
      break;
    case MODEL_OP_ROUTER:
      if (so->in[0] == v || so->out == v)
        return true;
      break;
    case MODEL_OP_EXPERT_FFN:
      if (so->in[1] == v)
        return true;
      break;
    default: break;
    }
  }
  return false;
}

/* Where forward instruction i keeps value v: with its saved activations when the backward
 * reads it, in the tensor that carries it on when it leaves the segment, else in the
 * instruction's workspace. A value selective recomputation drops (dropped: a norm's output,
 * which R rebuilds) is not kept: it lives in the carrying tensor or in the workspace. */
static uint32_t value_owner(const struct exec_state *s, uint32_t i, const struct exec_segment *es,
                            int32_t v, uint32_t saved, bool dropped) {
  enum exec_tensor t = (enum exec_tensor)es->values[v].tensor;
  if (value_kept(es, v) && !(dropped && es->final_value[t] == v))
    return dropped ? OWN_WORK : saved;
  if (es->final_value[t] == v)
    return exec_out_tensor_of(s, i, t, true); /* OWN_WORK when nothing reads it on */
  return OWN_WORK;
}

/* The run tables of a segment's forward, and its inputs: those the backward reads are copied
 * into the saved activations (the tensor that brought them goes after its last reader). Under
 * full recomputation F copies every input into `keep` too, for R; R (from: F's run) reads
 * them there. */
static struct exec_seg_run *seg_run_begin(struct exec_state *s, uint32_t i,
                                          struct exec_task_ctx *st, uint32_t saved, uint32_t keep,
                                          const struct exec_seg_run *from) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  const struct exec_segment *es = &s->xm->segs[x->segment];
  struct exec_seg_run *run = exec_mb_host(s, mb, sizeof *run, REPORT_MEM_ACTIVATIONS);
  run->val = exec_mb_host(s, mb, es->n_values * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->dval = exec_mb_host(s, mb, es->n_values * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->kept_in = exec_mb_host(s, mb, es->n_values * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->saved = exec_mb_host(s, mb, es->n_ops * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->bwork = exec_mb_host(s, mb, es->n_ops * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->core = exec_mb_host(s, mb, es->n_ops * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->moe = exec_mb_host(s, mb, es->n_ops * sizeof(struct local_moe *), REPORT_MEM_ACTIVATIONS);
  for (uint32_t v = 0; v < es->n_values; v++) {
    if (es->values[v].op >= 0)
      continue;
    enum exec_tensor t = (enum exec_tensor)es->values[v].tensor;
    float *in = from ? from->kept_in[v] : edge_value(s, mb, es->values[v].edge, t);
    size_t n = exec_tensor_words(s->xm, t) * sizeof(float);
    if (in && keep != OWN_WORK) {
      run->kept_in[v] = mb_floats_raw(s, st, mb, keep, n / sizeof(float));
      KT(st, s, s->k->copy(st->stream, run->kept_in[v], in, n));
    }
    if (in && value_kept(es, (int32_t)v)) {
      float *copy = mb_floats_raw(s, st, mb, saved, n / sizeof(float));
      KT(st, s, s->k->copy(st->stream, copy, in, n));
      in = copy;
    }
    run->val[v] = in;
  }
  return run;
}

/* Whether selective recomputation drops model op `op`'s part under modules: its attention
 * core, its output (a decoder layer's norm: models/build.c sets the bytes), its MLP or shared
 * expert activations. */
static bool op_dropped(const struct exec_state *s, uint32_t modules, uint32_t op) {
  const struct model_op *mo = &s->xm->m->ops[op];
  switch (mo->kind) {
  case MODEL_OP_ATTENTION: return modules & MODEL_MODULE_BIT(MODEL_MODULE_CORE_ATTN);
  case MODEL_OP_RMSNORM:
    return (modules & MODEL_MODULE_BIT(MODEL_MODULE_LAYERNORM)) &&
           mo->module_saved_bytes[MODEL_MODULE_LAYERNORM] > 0;
  case MODEL_OP_MLP: return modules & MODEL_MODULE_BIT(MODEL_MODULE_MLP);
  case MODEL_OP_SHARED_EXPERT: return modules & MODEL_MODULE_BIT(MODEL_MODULE_SHARED_EXPERTS);
  case MODEL_OP_EXPERT_FFN: return modules & MODEL_MODULE_BIT(MODEL_MODULE_MOE_ACT);
  default: return false;
  }
}

/* The segment's final values, for the instructions that read them. One the backward also
 * reads lives in the saved activations; the tensor that carries it on gets its own copy, so
 * that each goes at its own release point. */
static void seg_outputs(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                        struct exec_seg_run *run, uint32_t drop) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_segment *es = &s->xm->segs[x->segment];
  struct exec_mb *mb = &s->mbs[x->mb];
  for (int t = 0; t < TC; t++) {
    int32_t v = es->final_value[t];
    if (v < 0)
      continue;
    float *val = run->val[v];
    uint32_t out = exec_out_tensor_of(s, i, (enum exec_tensor)t, true);
    /* a dropped norm output is already in the tensor that carries it (value_owner) */
    bool dropped = es->values[v].op >= 0 && op_dropped(s, drop, es->ops[es->values[v].op].op) &&
                   es->ops[es->values[v].op].kind == MODEL_OP_RMSNORM;
    if (out != OWN_WORK && es->values[v].op >= 0 && value_kept(es, v) && !dropped) {
      size_t n = exec_tensor_words(s->xm, (enum exec_tensor)t);
      val = mb_floats_raw(s, st, mb, out, n);
      KT(st, s, s->k->copy(st->stream, val, run->val[v], n * sizeof(float)));
    }
    mb->out[(size_t)x->segment * TC + t] = val;
  }
}

/* A rerun under full recomputation computes only what its backward reads: an op runs when it
 * saves something or a later running op reads its output, so a layer's last residual add does
 * not; the embedding (its token ids) and a local MoE (its routing and rows) run but skip the
 * lookup and the combine when nothing reads them. Returns needed[n_values] (value v is
 * computed) followed by runs[n_ops]. */
static bool *rerun_needed(const struct exec_segment *es) {
  bool *needed = g_new0(bool, es->n_values + es->n_ops + 1), *runs = needed + es->n_values;
  for (uint32_t v = 0; v < es->n_values; v++)
    needed[v] = value_kept(es, (int32_t)v);
  for (int32_t j = (int32_t)es->n_ops - 1; j >= 0; j--) {
    const struct exec_seg_op *so = &es->ops[j];
    runs[j] = so->kind != MODEL_OP_RESIDUAL_ADD || (so->out >= 0 && needed[so->out]);
    for (int q = 0; q < 3 && runs[j]; q++)
      if (so->in[q] >= 0)
        needed[so->in[q]] = true;
  }
  return needed;
}

/* ---- op by op -------------------------------------------------------------------------------- */

/* One forward (or rerun) of a segment: the op loop's shared state. */
struct fwd {
  struct exec_state *s;
  struct exec_task_ctx *st;
  struct exec_mb *mb;
  const struct exec_segment *es;
  struct exec_seg_run *run;
  const float *P;
  uint32_t i, saved; /* owner of what the backward reads (OWN_WORK: F under full) */
  /* owner of what only the input-gradient pass reads (exec_bi_only_tensor; saved where the
   * plan keeps it in saved): attention's q, k, v, the router's probabilities */
  uint32_t bi_only;
  enum fwd_keep keep;
  uint32_t drop;      /* F under selective recomputation: the modules it does not keep */
  const bool *needed; /* a full rerun's (rerun_needed); NULL: every value */
};

static bool fwd_attention(struct fwd *f, uint32_t j, float *out, const float *in0, const float *prm,
                          GError **err) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  struct kernels_attention_dims dd = attention_dims(s, &s->xm->m->ops[f->es->ops[j].op]);
  size_t all = kernels_attention_saved_floats(&dd), core = kernels_attention_core_floats(&dd);
  if (f->keep == FWD_SELECTIVE_DROP && op_dropped(s, f->drop, f->es->ops[j].op)) {
    /* q, k, v saved; lse and y only while F runs */
    f->run->saved[j] = mb_floats_raw(s, st, f->mb, f->bi_only, all - core);
    dd.core = f->run->core[j] = mb_floats_raw(s, st, f->mb, OWN_WORK, core);
  } else if (f->bi_only != f->saved) {
    /* q, k, v go when BI ends; y (BW's input of the output projection) and lse stay */
    f->run->saved[j] = mb_floats_raw(s, st, f->mb, f->bi_only, all - core);
    dd.core = f->run->core[j] = mb_floats_raw(s, st, f->mb, f->saved, core);
  } else {
    f->run->saved[j] = mb_floats_raw(s, st, f->mb, f->saved, all);
  }
  if (s->dev->cp_degree > 1) /* its K/V exchange inside (context_parallel.c) */
    return exec_cp_attention_forward(s, st, f->mb, out, f->run->saved[j], in0, prm, &dd, err);
  KT(st, s, s->k->attention_forward(st->stream, out, f->run->saved[j], in0, prm, &dd));
  return true;
}

/* The experts on one device: dispatch, experts, combine (no combine in a rerun that does not
 * need its output). */
static void fwd_local_moe(struct fwd *f, uint32_t j, float *out, const float *in0, const float *in1,
                          const float *prm) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = f->mb;
  const struct exec_model *xm = s->xm;
  int T = xm->T, C = xm->C, E = xm->E, K = xm->K, TK = T * K, F = expert_width(s);
  uint32_t saved = f->saved;
  struct local_moe *lm = exec_mb_host(s, mb, sizeof *lm, REPORT_MEM_ACTIVATIONS);
  f->run->moe[j] = lm;
  /* the backward reads the routing; the experts' outputs come weighted (the experts apply the
   * routing weights, which the dispatch hands them with the rows), so the combine only sums
   * them and nothing of them is kept */
  lm->counts = mb_raw(s, st, mb, OWN_WORK, sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  lm->route_row = mb_raw(s, st, mb, saved, (size_t)TK * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  lm->row_expert = mb_raw(s, st, mb, saved, (size_t)TK * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  lm->rows = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C);
  float *row_weight = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK);
  lm->y = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C);
  lm->scratch = mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats(TK, C));
  size_t all = kernels_expert_ffn_saved_floats(TK, C, F), act = (size_t)TK * F;
  if (f->keep == FWD_SELECTIVE_DROP && op_dropped(s, f->drop, f->es->ops[j].op)) {
    /* rows, gate and up saved; silu(gate)·up only while F runs (R rebuilds it) */
    f->run->saved[j] = mb_floats_raw(s, st, mb, saved, all - act);
    lm->act = mb_floats_raw(s, st, mb, OWN_WORK, act);
  } else {
    f->run->saved[j] = mb_floats_raw(s, st, mb, saved, all);
  }
  const int32_t *ids = (const int32_t *)in1;
  const float *weights = in1 + TK;
  KT(st, s, k->moe_dispatch_plan(st->stream, lm->counts, lm->route_row, ids, T, K, E, 1));
  KT(st, s,
     k->moe_dispatch_forward(st->stream, lm->rows, lm->row_expert, row_weight, in0, ids, weights,
                             lm->route_row, T, K, C));
  KT(st, s,
     k->expert_ffn_forward(st->stream, lm->y, f->run->saved[j], lm->act, NULL, lm->scratch,
                           lm->rows, lm->row_expert, row_weight, TK, prm, 0, E, C, F));
  if (out)
    KT(st, s, k->moe_combine_forward(st->stream, out, lm->y, lm->route_row, T, K, C));
}

static void fwd_lm_head(struct fwd *f, uint32_t j, const float *in0, const float *prm) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = f->mb;
  int T = xm->T, C = xm->C, V = xm->V;
  f->run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_lm_head_loss_saved_floats(T, V));
  mb->targets = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  exec_backend_from_host(s->b, mb->targets, mb->targets_host, (size_t)T * sizeof(int32_t));
  const float *w = xm->tied ? f->P + s->dev->op_offset[f->es->ops[0].op] : prm;
  float *loss = s->loss_device + f->s->dev->instrs[f->i].mb, loss_host = 0;
  KT(st, s,
     s->k->lm_head_loss_forward(
         st->stream, loss, f->run->saved[j], in0, mb->targets, w,
         xm->tied || xm->tied_copy ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED, T, C, V));
  exec_backend_to_host(s->b, &loss_host, loss, sizeof loss_host);
  mb->loss = loss_host; /* a rerun's is the same, bit for bit */
  mb->has_loss = true;
}

/* ---- divided ops under tensor parallelism (tp.c) --------------------------------------------- */

/* Forward of divided op j under TP: this rank's slice into the collectives' buffer, summed
 * over the group into the op's output (the LM head sums only its row statistics). */
static bool tp_forward_op(struct fwd *f, uint32_t j, GError **err) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  struct exec_tp_bufs *tb = &st->tp;
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = f->mb;
  struct exec_seg_run *run = f->run;
  const struct exec_seg_op *so = &f->es->ops[j];
  const struct model_op *op = &xm->m->ops[so->op];
  const float *prm = f->P + s->dev->op_offset[so->op];
  const float *in0 = so->in[0] >= 0 ? run->val[so->in[0]] : NULL;
  int T = xm->T;
  float *buf = exec_tp_buffer(s, st, mb, f->i, &tb->sum);
  if (s->dev->sequence_parallel && in0 &&
      !(in0 = exec_tp_gathered(s, st, mb, &tb->input, in0, err)))
    return false;
  switch (so->kind) {
  case MODEL_OP_EMBEDDING:
    mb->tokens = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
    exec_backend_from_host(s->b, mb->tokens, mb->tokens_host, (size_t)T * sizeof(int32_t));
    KT(st, s, exec_tp_embedding_forward(s, st->stream, buf, mb->tokens, prm));
    break;
  case MODEL_OP_ATTENTION:
    if (!fwd_attention(f, j, buf, in0, prm, err))
      return false;
    break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: {
    int F = mlp_width(s, op);
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_mlp_saved_floats(T, F));
    KT(st, s, s->k->mlp_forward(st->stream, buf, run->saved[j], in0, prm, T, xm->C, F));
    break;
  }
  case MODEL_OP_EXPERT_FFN:
    /* the whole sequence's routing (the router runs on it under SP too, fwd_op); the partial
     * outputs summed over the group after the combine, as the plan's one [T, hidden] all-reduce */
    fwd_local_moe(f, j, buf, in0, run->val[so->in[1]], prm);
    break;
  case MODEL_OP_LM_HEAD_LOSS: {
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_lm_head_loss_saved_floats(T, xm->V));
    mb->targets = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
    exec_backend_from_host(s->b, mb->targets, mb->targets_host, (size_t)T * sizeof(int32_t));
    const float *w = xm->tied ? f->P + s->dev->op_offset[f->es->ops[0].op] : prm;
    /* the row statistics gathered in the collectives' buffer (exec_tp_device_init: 3 tp <= C) */
    float *loss = s->loss_device + s->dev->instrs[f->i].mb, loss_host = 0;
    if (!exec_tp_head_forward(s, st, buf, loss, run->saved[j], in0, mb->targets, w,
                              xm->tied || xm->tied_copy, err))
      return false;
    exec_backend_to_host(s->b, &loss_host, loss, sizeof loss_host);
    mb->loss = loss_host; /* a rerun's is the same, bit for bit */
    mb->has_loss = s->dev->tp_rank == 0; /* every TP peer has it; the step sums one */
    return true;
  }
  default: return internal(err, s, f->i, "op kind without a tensor-parallel kernel");
  }
  return exec_tp_sum_into(s, st, mb, run->val[so->out], false, err);
}

/* ---- the forward ----------------------------------------------------------------------------- */

/* Op j's output buffer, where it has one that is read (or always written). */
static float *fwd_out(struct fwd *f, uint32_t j, bool tp) {
  struct exec_state *s = f->s;
  const struct exec_seg_op *so = &f->es->ops[j];
  /* only the embedding's lookup and the combine can be left out; the other kernels (and the
   * TP collectives) write their output whether read or not */
  bool optional = !tp && (so->kind == MODEL_OP_EMBEDDING || so->kind == MODEL_OP_EXPERT_FFN);
  if (so->out < 0 || (f->needed && !f->needed[so->out] && optional))
    return NULL;
  size_t words = exec_tensor_words(s->xm, (enum exec_tensor)f->es->values[so->out].tensor);
  bool dropped = f->drop && so->kind == MODEL_OP_RMSNORM && op_dropped(s, f->drop, so->op);
  uint32_t owner = value_owner(s, f->i, f->es, so->out, f->saved, dropped);
  return f->run->val[so->out] = mb_floats_raw(s, f->st, f->mb, owner, words);
}

static bool tp_divides(const struct exec_state *s, enum model_op_kind kind) {
  return s->dev->tp_degree > 1 && exec_tp_divided(kind);
}

/* Whether op j is a residual add of two values whose sum op j + 1 normalises, both run here:
 * then one kernel does both (ops.def's residual_rmsnorm_forward, the same bits). */
static bool fwd_fuses_norm(const struct fwd *f, uint32_t j) {
  const struct exec_segment *es = f->es;
  /* nor when the norm's output is dropped (layernorm recomputation): a transient of the next
   * group, it would go when the add's group ends */
  if (j + 1 >= es->n_ops || !f->s->k->residual_rmsnorm_forward ||
      (f->drop && op_dropped(f->s, f->drop, es->ops[j + 1].op)))
    return false;
  const struct exec_seg_op *add = &es->ops[j], *norm = &es->ops[j + 1];
  return add->kind == MODEL_OP_RESIDUAL_ADD && add->in[2] < 0 && add->out >= 0 &&
         norm->kind == MODEL_OP_RMSNORM && norm->in[0] == add->out &&
         !tp_divides(f->s, add->kind) && !tp_divides(f->s, norm->kind) &&
         (!f->needed || (f->needed[es->n_values + j] && f->needed[es->n_values + j + 1]));
}

/* Ops j (the residual add) and j + 1 (the norm) of the forward f, in one pass over x. */
static void fwd_residual_norm(struct fwd *f, uint32_t j) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_model *xm = s->xm;
  const struct exec_seg_op *add = &f->es->ops[j], *norm = &f->es->ops[j + 1];
  float *x = fwd_out(f, j, false), *h = fwd_out(f, j + 1, false);
  float *saved = f->run->saved[j + 1] =
      mb_floats_raw(s, st, f->mb, f->saved, kernels_rmsnorm_saved_floats(xm->T_seq));
  const float *prm = f->P + s->dev->op_offset[norm->op];
  size_t n = (size_t)xm->T_seq * xm->C;
  KT(st, s, s->k->copy(st->stream, x, f->run->val[add->in[0]], n * sizeof(float)));
  KT(st, s,
     s->k->residual_rmsnorm_forward(st->stream, x, h, saved, f->run->val[add->in[1]], prm,
                                    xm->T_seq, xm->C, xm->rms_norm_eps));
}

/* Op j of the forward f. */
static bool fwd_op(struct fwd *f, uint32_t j, GError **err) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_kernels *k = s->k;
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = f->mb;
  struct exec_seg_run *run = f->run;
  const struct exec_seg_op *so = &f->es->ops[j];
  const float *prm = f->P + s->dev->op_offset[so->op];
  int T = xm->T, C = xm->C, V = xm->V, K = xm->K, E = xm->E, Ts = xm->T_seq;
  bool tp = tp_divides(s, so->kind);
  float *out = fwd_out(f, j, tp);
  const float *in0 = so->in[0] >= 0 ? run->val[so->in[0]] : NULL;
  const float *in1 = so->in[1] >= 0 ? run->val[so->in[1]] : NULL;
  const float *in2 = so->in[2] >= 0 ? run->val[so->in[2]] : NULL;
  if (tp)
    return tp_forward_op(f, j, err);
  switch (so->kind) {
  case MODEL_OP_EMBEDDING:
    mb->tokens = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
    exec_backend_from_host(s->b, mb->tokens, mb->tokens_host, (size_t)T * sizeof(int32_t));
    if (out)
      KT(st, s, k->embedding_forward(st->stream, out, mb->tokens, prm, T, V, C));
    return true;
  case MODEL_OP_RMSNORM:
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_rmsnorm_saved_floats(Ts));
    KT(st, s,
       k->rmsnorm_forward(st->stream, out, run->saved[j], in0, prm, Ts, C, xm->rms_norm_eps));
    return true;
  case MODEL_OP_ATTENTION: return fwd_attention(f, j, out, in0, prm, err);
  case MODEL_OP_RESIDUAL_ADD: {
    size_t n = (size_t)Ts * C;
    KT(st, s, k->copy(st->stream, out, in0, n * sizeof(float)));
    KT(st, s, k->residual_add_forward(st->stream, out, in1, n));
    if (in2)
      KT(st, s, k->residual_add_forward(st->stream, out, in2, n));
    return true;
  }
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: {
    int F = (int)xm->m->ops[so->op].shape[2];
    uint32_t owner = op_dropped(s, f->drop, so->op) ? OWN_WORK : f->saved;
    run->saved[j] = mb_floats_raw(s, st, mb, owner, kernels_mlp_saved_floats(T, F));
    KT(st, s, k->mlp_forward(st->stream, out, run->saved[j], in0, prm, T, C, F));
    return true;
  }
  case MODEL_OP_ROUTER:
    /* under SP on the whole sequence: every TP rank's expert slices read every token's route */
    if (s->dev->sequence_parallel && !(in0 = exec_tp_gathered(s, st, mb, &st->tp.input, in0, err)))
      return false;
    run->saved[j] = mb_floats_raw(s, st, mb, f->bi_only, kernels_router_saved_floats(T, E));
    KT(st, s,
       k->router_forward(st->stream, (int32_t *)out, out + T * K, run->saved[j], in0, prm, T, C, E,
                         K));
    return true;
  case MODEL_OP_EXPERT_FFN:
    if (s->dev->ep_size[s->dev->instrs[f->i].segment] > 1)
      return internal(err, s, f->i, "expert op outside EP path");
    fwd_local_moe(f, j, out, in0, in1, prm);
    return true;
  case MODEL_OP_LM_HEAD_LOSS: fwd_lm_head(f, j, in0, prm); return true;
  default: return internal(err, s, f->i, "op kind without a host kernel");
  }
}

/* One op of a selective rerun: what its forward dropped, rebuilt from what it kept into R's
 * saved tensor (saved); what the kernel also writes and nobody reads (an MLP's output, a
 * norm's row statistics) in R's workspace. */
static bool rerun_op(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                     struct exec_seg_run *run, const struct exec_seg_op *so, uint32_t j,
                     uint32_t saved, const float *P, GError **err) {
  const struct exec_model *xm = s->xm;
  const float *prm = P + s->dev->op_offset[so->op];
  int T = xm->T, C = xm->C, Ts = xm->T_seq;
  switch (so->kind) {
  case MODEL_OP_ATTENTION: {
    struct kernels_attention_dims dd = attention_dims(s, &xm->m->ops[so->op]);
    dd.core = run->core[j] = mb_floats_raw(s, st, mb, saved, kernels_attention_core_floats(&dd));
    if (s->dev->cp_degree > 1) /* over every rank's K/V (context_parallel.c) */
      return exec_cp_attention_core_forward(s, st, mb, run->saved[j], &dd, err);
    KT(st, s, s->k->attention_core_forward(st->stream, run->saved[j], &dd));
    return true;
  }
  case MODEL_OP_RMSNORM: {
    float *h = mb_floats_raw(s, st, mb, saved, (size_t)Ts * C);
    float *rstd = mb_floats_raw(s, st, mb, OWN_WORK, kernels_rmsnorm_saved_floats(Ts));
    KT(st, s, s->k->rmsnorm_forward(st->stream, h, rstd, run->val[so->in[0]], prm, Ts, C,
                                    xm->rms_norm_eps));
    run->val[so->out] = h;
    return true;
  }
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: {
    int F = (int)xm->m->ops[so->op].shape[2];
    float *out = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)T * C);
    run->saved[j] = mb_floats_raw(s, st, mb, saved, kernels_mlp_saved_floats(T, F));
    KT(st, s, s->k->mlp_forward(st->stream, out, run->saved[j], run->val[so->in[0]], prm, T, C, F));
    return true;
  }
  case MODEL_OP_EXPERT_FFN: { /* local experts (moe_act): silu(gate)·up from the kept gate, up */
    int TK = T * xm->K, F = expert_width(s);
    struct local_moe *lm = run->moe[j];
    lm->act = mb_floats_raw(s, st, mb, saved, (size_t)TK * F);
    KT(st, s, s->k->expert_ffn_act_forward(st->stream, lm->act, run->saved[j], TK, C, F));
    return true;
  }
  default: PIPER_UNREACHABLE();
  }
}

/* Selective recomputation's rerun: what its forward dropped of its modules, op by op in model
 * order (a norm's output before the MLP that reads it), into R's saved tensor; everything
 * else the forward kept stays as it is. A group's transients go when it ends, as in F. */
static bool seg_rerun_modules(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                              GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  const struct exec_segment *es = &s->xm->segs[x->segment];
  struct exec_seg_run *run = mb->seg[x->segment];
  if (!run)
    return internal(err, s, i, "a rerun before its forward");
  uint32_t saved = saved_owner(s, i), modules = s->dev->plan->nodes[x->node].recompute_modules;
  const float *P = exec_params_of(s, x);
  for (uint32_t j = 0; j < es->n_ops; j++) {
    if (op_dropped(s, modules, es->ops[j].op))
      if (!rerun_op(s, st, mb, run, &es->ops[j], j, saved, P, err))
        return false;
    if (exec_group_starts(s, es, j + 1))
      exec_work_group_end(s, st, 0);
  }
  return true;
}

bool exec_segment_forward(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                          GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  struct fwd f = {.s = s, .st = st, .mb = mb, .es = &s->xm->segs[x->segment], .i = i};
  f.keep = fwd_keep_of(s, x);
  if ((f.keep == FWD_SELECTIVE_DROP || f.keep == FWD_SELECTIVE_RERUN) &&
      !s->k->attention_core_forward)
    return internal(err, s, i, "selective recomputation needs the backend's attention core kernel");
  if (f.keep == FWD_SELECTIVE_RERUN)
    return seg_rerun_modules(s, i, st, err);
  if (f.keep == FWD_SELECTIVE_DROP)
    f.drop = s->dev->plan->nodes[x->node].recompute_modules;
  const struct exec_seg_run *from = NULL;
  uint32_t keep = OWN_WORK;
  f.saved = saved_owner(s, i);
  if (f.keep == FWD_FULL_DROP) { /* only the inputs, for R; the rest until F ends */
    keep = f.saved;
    f.saved = OWN_STAY;
  } else if (f.keep == FWD_FULL_RERUN) {
    from = mb->seg[x->segment];
    if (!from || !from->dropped)
      return internal(err, s, i, "a rerun before its forward");
  }
  f.bi_only = exec_bi_only_tensor(s, i);
  if (f.bi_only == OWN_WORK)
    f.bi_only = f.saved;
  f.run = seg_run_begin(s, i, st, f.saved, keep, from);
  f.run->dropped = f.keep == FWD_FULL_DROP;
  mb->seg[x->segment] = f.run;
  for (uint32_t v = 0; v < f.es->n_values; v++)
    if (f.es->values[v].op < 0 && !f.run->val[v])
      return internal(err, s, i, "an input of the segment has not arrived");
  f.P = exec_params_of(s, x);
  bool *needed = f.keep == FWD_FULL_RERUN ? rerun_needed(f.es) : NULL;
  f.needed = needed;
  bool ok = true;
  for (uint32_t j = 0, next; j < f.es->n_ops && ok; j = next) {
    next = j + 1;
    if (fwd_fuses_norm(&f, j)) {
      fwd_residual_norm(&f, j);
      next = j + 2;
    } else if (!needed || needed[f.es->n_values + j]) {
      ok = fwd_op(&f, j, err);
    }
    /* a group ended among the ops just run (a fused add and norm may span two: the norm's
     * outputs and saved row statistics are kept, none is a transient): its transients go */
    bool ended = false;
    for (uint32_t k = j + 1; k <= next; k++)
      ended = ended || exec_group_starts(s, f.es, k);
    if (ended)
      exec_work_group_end(s, st, 0);
  }
  g_free(needed);
  if (ok && f.keep != FWD_FULL_RERUN) /* R's outputs: the next segments have theirs */
    seg_outputs(s, i, st, f.run, f.drop);
  return ok;
}
