/* segment_backward: a segment's backward on one micro-batch, fused (B) or as its input (BI)
 * and weight (BW) halves, op by op in reverse through the backend's kernel table, from the
 * values its forward saved (segment_forward.c). */
#include "train-impl.h"

/* ---- a run's gradients ----------------------------------------------------------------------- */

/* One segment's backward (or its BI or BW half) on one micro-batch. */
struct bwd {
  struct exec_state *s;
  struct exec_task_ctx *st;
  const struct exec_kernels *k;
  const struct exec_model *xm;
  struct exec_mb *mb;
  struct exec_seg_run *run;
  const struct exec_segment *es;
  enum bwd_mode mode;
  const float *P;     /* the segment's parameters (NULL for BW: it needs none) */
  float *G;           /* and their gradients */
  float dloss;        /* the loss gradient's scale: one over the global batch's micro-batches */
  uint32_t i;         /* the instruction */
  uint32_t keep;      /* owner of what BW reads: BI's saved tensor, or the workspace (B, BW) */
  uint32_t *group;    /* [n_ops] each op's group (model_bwd_group_end), 0 for the segment's first */
  float **input_grad; /* [n_values] the segment inputs' gradients, allocated as the pass began */
};

/* Where the gradient of value v goes: an input's leaves the segment in the tensor that
 * carries it back; the others are the instruction's, or kept for BW after a BI. */
static uint32_t grad_owner(const struct bwd *b, int32_t v) {
  const struct exec_value *val = &b->es->values[v];
  if (val->op < 0)
    return out_tensor(b->s, b->i, (enum exec_tensor)val->tensor);
  return b->keep;
}

/* A gradient buffer of value v. In the workspace it goes with the group of v's producer (the
 * last to read it: the residual stream's gradient, written by the group after, is read by the
 * group before). */
static float *grad_buffer(struct bwd *b, int32_t v, bool zero) {
  const struct exec_value *val = &b->es->values[v];
  if (val->op < 0 && b->input_grad && b->input_grad[v]) { /* allocated when the pass began */
    float *g = b->input_grad[v];
    b->input_grad[v] = NULL;
    if (zero)
      KT(b->st, b->s,
         b->k->fill(b->st->stream, g, 0.0f,
                    exec_grad_floats(b->xm, (enum exec_tensor)val->tensor)));
    return g;
  }
  size_t n = exec_grad_floats(b->xm, (enum exec_tensor)val->tensor);
  uint32_t now = b->st->group;
  if (val->op >= 0)
    b->st->group = b->group[val->op];
  float *g = zero ? mb_floats(b->s, b->st, b->mb, grad_owner(b, v), n)
                  : mb_floats_raw(b->s, b->st, b->mb, grad_owner(b, v), n);
  b->st->group = now;
  return g;
}

static float *dval_out(struct bwd *b, int32_t v) {
  struct exec_seg_run *run = b->run;
  if (!run->dval[v])
    run->dval[v] = grad_buffer(b, v, true);
  return run->dval[v];
}

/* Gradient buffer of input value v and whether to accumulate into it. */
static float *dval_in(struct bwd *b, int32_t v, bool *acc) {
  struct exec_seg_run *run = b->run;
  *acc = run->dval[v] != NULL;
  if (!*acc) /* the kernel writes it (accumulate = false) */
    run->dval[v] = grad_buffer(b, v, false);
  return run->dval[v];
}

/* Op j of the segment, with its operands as the forward saw them. */
struct bwd_op {
  int32_t j;
  const struct exec_seg_op *so;
  const struct model_op *op;
  const float *prm, *in0, *in1;
  float *dprm, *dout, *din; /* din: gradient of input 0 (= or += by acc) */
  bool acc;
};

/* The routing weights' gradient where the experts behind edge e are run whole by each TP rank
 * on its own sequence shard's tokens (route_split, exec/expert_parallel.c): each peer's
 * dispatch transpose brought back its own tokens' (zeros elsewhere), and the router, run on
 * the whole sequence alike on every peer, needs every token's: summed over the TP group here,
 * on the compute stream as every TP collective, so the peers issue them in one order. */
static bool routing_grad_whole(struct bwd *b, uint32_t e, float *dr, GError **err) {
  uint32_t dst = b->xm->m->edges[e].dst;
  if (b->s->dev->route_split[dst] <= 1)
    return true;
  return exec_tp_all_reduce(b->s, b->st, dr, (size_t)b->xm->T * (size_t)b->xm->K, err);
}

/* Gradients of the segment's outputs: the sum over the edges that carried them, in edge
 * order. */
static bool output_grads(struct bwd *b, uint32_t i, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  const struct exec_segment *es = b->es;
  struct exec_seg_run *run = b->run;
  for (uint32_t q = 0; q < es->n_out_edges; q++) {
    uint32_t e = es->out_edges[q];
    for (int t = 0; t < TC; t++) {
      if (!(b->xm->edge_mask[e] & EXEC_BIT(t)))
        continue;
      const float *g = b->mb->grad[(size_t)e * TC + t];
      if (!g)
        return internal(err, s, i, "an output gradient of the segment has not arrived");
      int32_t v = es->final_value[t];
      size_t n = exec_grad_floats(b->xm, (enum exec_tensor)t);
      if (!run->dval[v]) {
        run->dval[v] = grad_buffer(b, v, false);
        KT(st, s, b->k->copy(st->stream, run->dval[v], g, n * sizeof(float)));
      } else {
        KT(st, s, b->k->add(st->stream, run->dval[v], g, n));
      }
      if (t == EXEC_T_R && !routing_grad_whole(b, e, run->dval[v], err))
        return false;
    }
  }
  return true;
}

/* ---- op by op -------------------------------------------------------------------------------- */

static void bwd_embedding(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  int T = b->xm->T, V = b->xm->V, C = b->xm->C;
  if (b->mode == BWD_FUSED)
    KT(st, s, b->k->embedding_backward(st->stream, o->dprm, o->dout, b->mb->tokens, T, V, C));
  else if (b->mode == BWD_WEIGHT)
    KT(st, s,
       b->k->embedding_backward_weight(st->stream, o->dprm, o->dout, b->mb->tokens, T, V, C));
}

static void bwd_rmsnorm(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  const float *saved = b->run->saved[o->j];
  int T = b->xm->T_seq, C = b->xm->C;
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->rmsnorm_backward(st->stream, o->din, o->dprm, o->dout, o->in0, saved, o->prm, T, C,
                              o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->rmsnorm_backward_input(st->stream, o->din, o->dout, o->in0, saved, o->prm, T, C,
                                    o->acc));
  else
    KT(st, s, b->k->rmsnorm_backward_weight(st->stream, o->dprm, o->dout, o->in0, saved, T, C));
}

static bool bwd_attention(struct bwd *b, const struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  int32_t j = o->j;
  struct kernels_attention_dims dd = attention_dims(s, o->op);
  dd.core = run->core[j]; /* apart from saved under selective recomputation */
  if (b->mode != BWD_WEIGHT)
    run->bwork[j] = mb_floats_raw(s, st, b->mb, b->keep, kernels_attention_bwork_floats(&dd));
  if (s->dev->cp_degree > 1 && b->mode != BWD_WEIGHT) {
    /* its K/V exchange inside (context_parallel.c); BW is the plain one's */
    if (!exec_cp_attention_backward_input(s, st, b->mb, o->din, run->bwork[j], o->dout,
                                          run->saved[j], o->prm, &dd, o->acc, err))
      return false;
    if (b->mode == BWD_FUSED)
      KT(st, s,
         b->k->attention_backward_weight(st->stream, o->dprm, run->bwork[j], o->dout, o->in0,
                                         run->saved[j], &dd));
  } else if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->attention_backward(st->stream, o->din, o->dprm, run->bwork[j], o->dout, o->in0,
                                run->saved[j], o->prm, &dd, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->attention_backward_input(st->stream, o->din, run->bwork[j], o->dout, run->saved[j],
                                      o->prm, &dd, o->acc));
  else
    KT(st, s,
       b->k->attention_backward_weight(st->stream, o->dprm, run->bwork[j], o->dout, o->in0,
                                       run->saved[j], &dd));
  return true;
}

/* The output gradient passes to every input (none in BW: no parameters). */
static void bwd_residual_add(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  if (b->mode == BWD_WEIGHT)
    return;
  for (int q = 0; q < 3; q++) {
    if (o->so->in[q] < 0)
      continue;
    bool a;
    float *g = dval_in(b, o->so->in[q], &a);
    KT(st, s,
       b->k->residual_add_backward(st->stream, g, o->dout, (size_t)b->xm->T_seq * b->xm->C, a));
  }
}

static void bwd_mlp(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  int32_t j = o->j;
  int T = b->xm->T, C = b->xm->C, F = mlp_width(s, o->op);
  if (b->mode != BWD_WEIGHT)
    run->bwork[j] = mb_floats_raw(s, st, b->mb, b->keep, kernels_mlp_bwork_floats(T, F));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->mlp_backward(st->stream, o->din, o->dprm, run->bwork[j], o->dout, o->in0,
                          run->saved[j], o->prm, T, C, F, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->mlp_backward_input(st->stream, o->din, run->bwork[j], o->dout, run->saved[j], o->prm,
                                T, C, F, o->acc));
  else
    KT(st, s,
       b->k->mlp_backward_weight(st->stream, o->dprm, run->bwork[j], o->dout, o->in0, run->saved[j],
                                 T, C, F));
}

static void bwd_router(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  int32_t j = o->j;
  int T = b->xm->T, C = b->xm->C, E = b->xm->E, K = b->xm->K, TK = T * K;
  const float *r = run->val[o->so->out];
  const int32_t *ids = (const int32_t *)r;
  if (b->mode != BWD_WEIGHT)
    run->bwork[j] = mb_floats_raw(s, st, b->mb, b->keep, kernels_router_bwork_floats(T, E));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->router_backward(st->stream, o->din, o->dprm, run->bwork[j], o->dout, ids, r + TK,
                             run->saved[j], o->in0, o->prm, T, C, E, K, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->router_backward_input(st->stream, o->din, run->bwork[j], o->dout, ids, r + TK,
                                   run->saved[j], o->prm, T, C, E, K, o->acc));
  else
    KT(st, s, b->k->router_backward_weight(st->stream, o->dprm, run->bwork[j], o->in0, T, C, E));
}

/* Experts on one device: combine's backward, the experts', dispatch's. Under TP (dh_tp: the
 * collectives' buffer) each rank's expert activations are slices, so the routing weights'
 * gradient (a dot product over the activation's columns) is summed over the group here, and
 * the input gradient, partial too, is left in dh_tp for the caller's sum. */
static bool bwd_expert_ffn(struct bwd *b, const struct bwd_op *o, float *dh_tp, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  struct exec_mb *mb = b->mb;
  const struct exec_kernels *k = b->k;
  int32_t j = o->j;
  int T = b->xm->T, C = b->xm->C, E = b->xm->E, K = b->xm->K, TK = T * K, F = expert_width(s);
  struct local_moe *lm = run->moe[j];
  if (b->mode == BWD_WEIGHT) {
    KT(st, s,
       k->expert_ffn_backward_weight(st->stream, o->dprm, run->bwork[j], lm->row_expert, TK,
                                     run->saved[j], lm->act, NULL, 0, E, C, F));
    return true;
  }
  run->bwork[j] = mb_floats_raw(s, st, mb, b->keep, kernels_expert_ffn_bwork_floats(TK, C, F));
  float *dy = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C),
        *drows = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C),
        *scratch = mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats(TK, C)),
        *drw = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK);
  bool ar;
  float *dw = dval_in(b, o->so->in[1], &ar);
  float *dwt = ar ? mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK) : dw;
  KT(st, s, k->moe_combine_backward(st->stream, dy, o->dout, lm->route_row, T, K, C));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       k->expert_ffn_backward(st->stream, drows, drw, o->dprm, run->bwork[j], scratch, dy,
                              lm->row_expert, TK, run->saved[j], lm->act, NULL, o->prm, 0, E, C, F,
                              false));
  else
    KT(st, s,
       k->expert_ffn_backward_input(st->stream, drows, drw, run->bwork[j], scratch, dy,
                                    lm->row_expert, TK, run->saved[j], lm->act, o->prm, 0, E, C, F,
                                    false));
  if (dh_tp && !exec_tp_all_reduce(s, st, drw, (size_t)TK, err))
    return false;
  bool ah = false;
  float *dh = dh_tp ? dh_tp : dval_in(b, o->so->in[0], &ah);
  KT(st, s, k->moe_dispatch_backward(st->stream, dh, dwt, drows, drw, lm->route_row, T, K, C, ah));
  if (ar)
    KT(st, s, k->add(st->stream, dw, dwt, (size_t)TK));
  return true;
}

static void bwd_lm_head(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  const struct exec_model *xm = b->xm;
  int32_t j = o->j;
  int T = xm->T, C = xm->C, V = xm->V;
  enum kernels_lm_head_layout lay =
      xm->tied || xm->tied_copy ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
  /* BW recomputes the logits too, so it reads the head's parameters as BI does (under ZeRO-3
   * from a gather of its own: insert_gathers in directives/apply.c) */
  const float *P = b->P ? b->P : exec_params_of(s, &s->dev->instrs[b->i]);
  const uint64_t *at = s->dev->op_offset;
  const float *w = P + (xm->tied ? at[b->es->ops[0].op] : at[o->so->op]);
  float *dw = xm->tied ? b->G + at[b->es->ops[0].op] : o->dprm;
  run->bwork[j] = NULL; /* BI and BW recompute the dlogits from h and the row statistics */
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->lm_head_loss_backward(st->stream, o->din, dw, run->bwork[j], run->saved[j], o->in0,
                                   b->mb->targets, w, lay, b->dloss, T, C, V, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->lm_head_loss_backward_input(st->stream, o->din, run->bwork[j], run->saved[j], o->in0,
                                         b->mb->targets, w, lay, b->dloss, T, C, V, o->acc));
  else
    KT(st, s,
       b->k->lm_head_loss_backward_weight(st->stream, dw, run->bwork[j], run->saved[j], o->in0,
                                          b->mb->targets, w, lay, b->dloss, T, C, V));
}

/* ---- under tensor and sequence parallelism (tp.c) -------------------------------------------- */

/* The local experts' backward under TP: the output gradient whole (gathered under SP), the
 * partial input gradient summed over the group (reduce-scattered under SP). */
static bool tp_experts_backward(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  if (b->mode == BWD_WEIGHT)
    return bwd_expert_ffn(b, o, NULL, err);
  if (s->dev->sequence_parallel &&
      !(o->dout = (float *)exec_tp_gathered(s, st, b->mb, &st->tp.dout, o->dout, err)))
    return false;
  bool ah;
  float *dh = dval_in(b, o->so->in[0], &ah);
  float *buf = exec_tp_buffer(s, st, b->mb, b->i, &st->tp.sum);
  return bwd_expert_ffn(b, o, buf, err) && exec_tp_sum_into(s, st, b->mb, dh, ah, err);
}

/* The router under SP runs on the whole sequence (its input gathered), as every TP rank needs
 * the whole routing for its slices of the experts: its weight gradient is the same on every
 * rank, and its input gradient's rows of this device's shard go on. */
static bool tp_router_backward(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  size_t n = (size_t)b->xm->T_seq * (size_t)b->xm->C;
  if (o->in0 && b->mode != BWD_INPUT &&
      !(o->in0 = exec_tp_gathered(s, st, b->mb, &st->tp.input, o->in0, err)))
    return false;
  float *din = o->din;
  bool acc = o->acc;
  if (din) {
    o->din = exec_tp_buffer(s, st, b->mb, b->i, &st->tp.sum);
    o->acc = false;
  }
  bwd_router(b, o);
  if (!din)
    return true;
  const float *mine = o->din + (size_t)s->dev->tp_rank * n;
  if (acc)
    KT(st, s, s->k->add(st->stream, din, mine, n));
  else
    KT(st, s, s->k->copy(st->stream, din, mine, n * sizeof(float)));
  return true;
}

/* Backward of divided op j under TP: the input gradient of this rank's slice into the
 * collectives' buffer, summed over the group into the op's input gradient; the weight
 * gradient of the slice. */
static bool tp_backward_op(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  const struct exec_model *xm = b->xm;
  bool input = b->mode != BWD_WEIGHT, weight = b->mode != BWD_INPUT;
  if (o->so->kind == MODEL_OP_EXPERT_FFN)
    return tp_experts_backward(b, o, err);
  float *din = o->din, *buf = NULL;
  bool acc = o->acc;
  if (input && o->so->kind != MODEL_OP_EMBEDDING) {
    buf = exec_tp_buffer(s, st, b->mb, b->i, &st->tp.sum);
    o->din = buf;
    o->acc = false;
  }
  /* SP: the output gradient's and the input's sequence shards gathered (the input only where
   * it is read: weight gradients, and the head's logits) */
  bool sp = s->dev->sequence_parallel;
  if (sp && o->dout && (weight || o->so->kind != MODEL_OP_EMBEDDING) &&
      !(o->dout = (float *)exec_tp_gathered(s, st, b->mb, &st->tp.dout, o->dout, err)))
    return false;
  if (sp && o->in0 && (weight || o->so->kind == MODEL_OP_LM_HEAD_LOSS) &&
      !(o->in0 = exec_tp_gathered(s, st, b->mb, &st->tp.input, o->in0, err)))
    return false;
  switch (o->so->kind) {
  case MODEL_OP_EMBEDDING:
    if (weight)
      KT(st, s, exec_tp_embedding_backward(s, st->stream, o->dprm, o->dout, b->mb->tokens));
    return true;
  case MODEL_OP_ATTENTION:
    if (!bwd_attention(b, o, err))
      return false;
    break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: bwd_mlp(b, o); break;
  case MODEL_OP_LM_HEAD_LOSS: {
    const uint64_t *at = s->dev->op_offset;
    const float *P = b->P ? b->P : exec_params_of(s, &s->dev->instrs[b->i]);
    const float *w = P + (xm->tied ? at[b->es->ops[0].op] : at[o->so->op]);
    float *dw = xm->tied ? b->G + at[b->es->ops[0].op] : o->dprm;
    b->run->bwork[o->j] = NULL;
    KT(st, s,
       exec_tp_head_backward(s, st->stream, buf, weight ? dw : NULL, b->run->saved[o->j], o->in0,
                             b->mb->targets, w, xm->tied || xm->tied_copy, b->dloss));
    break;
  }
  default: return internal(err, s, b->i, "op kind without a tensor-parallel kernel");
  }
  return !input || exec_tp_sum_into(s, st, b->mb, din, acc, err);
}

/* A norm's weight gradient under SP: each device has its sequence shard's part; their sum over
 * the TP group is the gradient (Megatron sums the replicated norms' gradients likewise). */
static bool tp_norm_backward(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  size_t C = (size_t)b->xm->C;
  if (!st->tp.norm)
    st->tp.norm = mb_floats_raw(s, st, b->mb, OWN_WORK, C);
  float *dprm = o->dprm, *part = st->tp.norm;
  KT(st, s, s->k->fill(st->stream, part, 0.0f, C));
  o->dprm = part;
  bwd_rmsnorm(b, o);
  if (!exec_tp_all_reduce(s, st, part, C, err))
    return false;
  KT(st, s, s->k->add(st->stream, dprm, part, C));
  return true;
}

/* ---- the backward ---------------------------------------------------------------------------- */

/* Op j's operands, then its kind's backward. */
static bool backward_op(struct bwd *b, int32_t j, uint32_t i, GError **err) {
  struct exec_seg_run *run = b->run;
  const struct exec_seg_op *so = &b->es->ops[j];
  struct bwd_op o = {.j = j, .so = so, .op = &b->xm->m->ops[so->op]};
  o.prm = b->P ? b->P + b->s->dev->op_offset[so->op] : NULL;
  o.dprm = b->G + b->s->dev->op_offset[so->op];
  o.in0 = so->in[0] >= 0 ? run->val[so->in[0]] : NULL;
  o.in1 = so->in[1] >= 0 ? run->val[so->in[1]] : NULL;
  o.dout = so->out >= 0 ? dval_out(b, so->out) : NULL;
  if (b->mode != BWD_WEIGHT && so->in[0] >= 0 && so->kind != MODEL_OP_EXPERT_FFN &&
      so->kind != MODEL_OP_RESIDUAL_ADD)
    o.din = dval_in(b, so->in[0], &o.acc);
  if (b->s->dev->tp_degree > 1 && exec_tp_divided(so->kind))
    return tp_backward_op(b, &o, err);
  if (b->s->dev->sequence_parallel && so->kind == MODEL_OP_RMSNORM && b->mode != BWD_INPUT)
    return tp_norm_backward(b, &o, err);
  if (b->s->dev->sequence_parallel && so->kind == MODEL_OP_ROUTER)
    return tp_router_backward(b, &o, err);
  switch (so->kind) {
  case MODEL_OP_EMBEDDING: bwd_embedding(b, &o); return true;
  case MODEL_OP_RMSNORM: bwd_rmsnorm(b, &o); return true;
  case MODEL_OP_ATTENTION: return bwd_attention(b, &o, err);
  case MODEL_OP_RESIDUAL_ADD: bwd_residual_add(b, &o); return true;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: bwd_mlp(b, &o); return true;
  case MODEL_OP_ROUTER: bwd_router(b, &o); return true;
  case MODEL_OP_EXPERT_FFN: return bwd_expert_ffn(b, &o, NULL, err);
  case MODEL_OP_LM_HEAD_LOSS: bwd_lm_head(b, &o); return true;
  default: return internal(err, b->s, i, "op kind without a host kernel");
  }
}

/* Gradients of the segment's inputs go onto the edges that brought them. */
static void input_grads(struct bwd *b) {
  const struct exec_segment *es = b->es;
  for (uint32_t v = 0; v < es->n_values; v++) {
    const struct exec_value *val = &es->values[v];
    if (val->op >= 0)
      continue;
    float *g = dval_out(b, (int32_t)v);
    b->mb->grad[(size_t)val->edge * TC + val->tensor] = g;
  }
}

bool exec_segment_backward(struct exec_state *s, uint32_t i, enum bwd_mode mode,
                           struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  struct bwd b = {.s = s,
                  .st = st,
                  .k = s->k,
                  .xm = s->xm,
                  .mb = mb,
                  .run = mb->seg[x->segment],
                  .es = &s->xm->segs[x->segment],
                  .mode = mode,
                  .G = exec_grads_of(s, st, x->segment),
                  .dloss = 1.0f / (float)(s->dev->dp_degree * s->dev->M),
                  .i = i,
                  .keep = OWN_WORK};
  if (mode == BWD_INPUT) {
    b.keep = exec_written_tensor(s, i, PLAN_TENSOR_SAVED);
    if (b.keep == OWN_WORK)
      b.keep = OWN_MB;
  }
  if (!b.run)
    return internal(err, s, i, "backward before its forward");
  b.P = mode == BWD_WEIGHT ? NULL : exec_params_of(s, x);
  /* op by op in reverse, one group at a time: a group's transients go when its first op is
   * done */
  b.group = g_new0(uint32_t, b.es->n_ops + 1);
  for (uint32_t j = 1; j < b.es->n_ops; j++)
    b.group[j] = b.group[j - 1] + (exec_bwd_group_starts(s, b.es, j) ? 1 : 0);
  /* the tensors that carry the inputs' gradients back are allocated as the pass begins, as
   * the memory rule has them (their producer starts), not when the segment's first group
   * writes them at the end */
  b.input_grad = g_new0(float *, b.es->n_values + 1);
  for (uint32_t v = 0; mode != BWD_WEIGHT && v < b.es->n_values; v++)
    if (b.es->values[v].op < 0 && !b.run->dval[v])
      b.input_grad[v] = grad_buffer(&b, (int32_t)v, false);
  bool ok = mode == BWD_WEIGHT || output_grads(&b, i, err);
  for (int32_t j = (int32_t)b.es->n_ops - 1; ok && j >= 0; j--) {
    st->group = b.group[j];
    ok = backward_op(&b, j, i, err);
    if (ok && (j == 0 || exec_bwd_group_starts(s, b.es, (uint32_t)j)))
      exec_work_group_end(s, st, b.group[j]);
  }
  st->group = 0;
  g_free(b.group);
  g_free(b.input_grad);
  if (ok && mode != BWD_WEIGHT)
    input_grads(&b);
  return ok;
}
