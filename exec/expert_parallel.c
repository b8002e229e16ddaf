/* expert_parallel: an expert segment sharded by expert parallelism: the all-to-all dispatch
 * that routes each token's rows to the experts' owners, the experts' compute on the rows
 * received, the combine that brings their outputs back, and their transposes in the backward. */
#include "../kernels/fp8.h"
#include "train-impl.h"

/* Expert-parallel state of one micro-batch at one expert segment. */
struct exec_moe {
  uint32_t S, rank;
  int e_first, e_count;
  uint32_t in_edge;
  int32_t *send_counts, *recv_counts; /* host memory [S] */
  size_t n_recv, cap; /* rows received; rows every buffer of them holds (the plan's capacity) */
  const int32_t *ids;
  const float *weights;
  int32_t *route_row, *send_expert, *recv_expert;
  float *send_rows, *recv_rows, *y_recv, *y_send, *saved, *bwork, *scratch;
  float *recv_weight; /* the received rows' routing weights [cap], which the experts apply */
  float *drw_recv;    /* their gradients [cap], from the experts' backward, sent back */
  float *act; /* silu(gate)·up apart from saved under moe_act (struct local_moe's), or NULL */
  /* fp8_expert_inputs (DeepSeek-V3's FP8 caching): the rows' inputs kept for the weight
   * gradient in e4m3 [cap, C] with their 1 x 128 tiles' factors [cap, ceil(C / 128)], in the
   * saved tensor in place of their floats; NULL without it */
  uint8_t *q8;
  float *inv8;
  float *dy_recv, *drows_recv;
  bool rerun; /* routed by the rerun's own dispatch (full recomputation, pass R) */
  /* the tokens this device routes: the micro-batch's T, or its sequence shard's where each TP
   * rank routes its own to whole experts (route_split); their routes start at route_off in the
   * router's [T, top_k] tables (route_row holds only theirs) */
  int T_route;
  size_t route_off;
};

/* Experts divided by the dense TP (their TP peers hold the same rows, each a slice of every
 * expert), not run whole by each TP rank on its own tokens (route_split). */
static bool experts_tp_split(const struct exec_state *s, uint32_t seg) {
  return exec_segment_tp(s->dev, seg) > 1;
}

static void byte_counts(const int32_t *rows, uint32_t S, size_t row_bytes, size_t *out) {
  for (uint32_t r = 0; r < S; r++)
    out[r] = (size_t)rows[r] * row_bytes;
}

/* EP with TP: the routed rows' partial sums summed over the TP group in place, through the
 * buffer the plan gives the TP node ([T, hidden], ir_tp_segment_comm), T rows at a time. */
static bool tp_sum_floats(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                          uint32_t i, float *x, size_t n, GError **err) {
  size_t chunk = (size_t)s->xm->T * (size_t)s->xm->C;
  float *buf = exec_tp_buffer(s, st, mb, i, &st->tp.sum);
  for (size_t r = 0; r < n; r += chunk) {
    size_t k = n - r < chunk ? n - r : chunk;
    KT(st, s, s->k->copy(st->stream, buf, x + r, k * sizeof(float)));
    if (!exec_tp_all_reduce(s, st, buf, k, err))
      return false;
    KT(st, s, s->k->copy(st->stream, x + r, buf, k * sizeof(float)));
  }
  return true;
}

static bool tp_sum_rows(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                        uint32_t i, float *rows, size_t n_rows, GError **err) {
  return tp_sum_floats(s, st, mb, i, rows, n_rows * (size_t)s->xm->C, err);
}

/* EP with TP and SP: each TP peer dispatched every route (the same rows in the same order on
 * every peer: one routing, whole routing weights) but only its sequence shard's tokens'
 * values, zeros elsewhere, and its combine's transpose only its shard's output gradients;
 * summed over the TP group here, in the expert compute (the compute stream orders the TP
 * collectives alike on every peer), each value comes whole from the one peer that holds it
 * (x + 0 is exact). */
static bool sp_whole_rows(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                          uint32_t i, float *rows, size_t n_rows, GError **err) {
  if (!s->dev->sequence_parallel || !n_rows || !experts_tp_split(s, s->dev->instrs[i].segment))
    return true;
  return tp_sum_rows(s, st, mb, i, rows, n_rows, err);
}

/* The node's experts keep their inputs in FP8 (fp8_expert_inputs). */
static bool fp8_cached(const struct exec_state *s, uint32_t i) {
  return s->dev->plan->nodes[s->dev->instrs[i].node].fp8_expert_inputs;
}

/* The FP8 cache's bytes: the factors first (floats stay aligned), then the e4m3 rows; with the
 * floats the experts keep besides, the plan's saved bytes (ir/expert.c, input_row_bytes). */
static size_t fp8_cache_bytes(size_t rows, int C) {
  size_t tiles = ((size_t)C + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  return rows * tiles * sizeof(float) + rows * (size_t)C;
}

/* The experts' forward on the rows the dispatch brought, or their rerun under full
 * recomputation on the rows the rerun's own dispatch brought (Megatron-LM's full
 * recomputation of a MoE layer: the rerun routes again, bit-identically, and its combine
 * regenerates the copy the combine's backward reads). F keeps nothing for R. */
static bool expert_forward(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                           struct exec_moe *moe, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = &s->mbs[x->mb];
  int C = xm->C, F = expert_width_of(s, x->segment), n = (int)moe->n_recv;
  size_t cap = moe->cap; /* every buffer of routed rows at the plan's capacity (ir/expert.c) */
  enum fwd_keep keep = fwd_keep_of(s, x);
  const float *P = exec_params_of(s, x), *rows = moe->recv_rows;
  uint32_t saved = saved_owner(s, i), y = out_tensor(s, i, EXEC_T_M);
  size_t all = kernels_expert_ffn_saved_floats((int)cap, C, F), act = cap * (size_t)F;
  if (keep == FWD_SELECTIVE_RERUN) {
    /* moe_act: silu(gate)·up of the rows received, from the kept gate and up, into R's saved
     * tensor (the only module selective recomputation reruns here: no attention, no norm) */
    moe->act = mb_floats_raw(s, st, mb, saved, act);
    if (n)
      KT(st, s, s->k->expert_ffn_act_forward(st->stream, moe->act, moe->saved, n, C, F));
    return true;
  }
  if (keep == FWD_FULL_DROP) {
    saved = OWN_WORK;
  } else if (keep == FWD_FULL_RERUN) {
    if (!moe->rerun)
      return internal(err, s, i, "a rerun before its own dispatch");
  }
  bool drop_act = keep == FWD_SELECTIVE_DROP;
  if (drop_act &&
      !(s->dev->plan->nodes[x->node].recompute_modules & MODEL_MODULE_BIT(MODEL_MODULE_MOE_ACT)))
    return internal(err, s, i, "selective recomputation of experts other than moe_act");
  float *yr = mb_floats_raw(s, st, mb, y, cap * C);
  moe->y_recv = yr;
  /* FP8 caching: the forward's GEMMs read the rows' floats, grouped in a workspace of their
   * own (DeepSeek-V3 caches the activations; what the forward multiplies is not the cache),
   * and the saved tensor keeps their e4m3 copy instead (also where F keeps nothing, so that
   * its workspace is the plan's: F under full recomputation holds a plain F's saved bytes) */
  bool fp8 = fp8_cached(s, i);
  size_t xs_floats = fp8 ? cap * (size_t)C : 0;
  float *xs = fp8 ? mb_floats_raw(s, st, mb, OWN_WORK, xs_floats) : NULL;
  moe->saved = mb_floats_raw(s, st, mb, saved, (drop_act ? all - act : all) - xs_floats);
  moe->act = drop_act ? mb_floats_raw(s, st, mb, OWN_WORK, act) : NULL;
  if (fp8) {
    moe->inv8 = mb_raw(s, st, mb, saved, fp8_cache_bytes(cap, C), REPORT_MEM_ACTIVATIONS);
    moe->q8 = (uint8_t *)(moe->inv8 + cap * ((C + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK));
  }
  moe->scratch = mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats((int)cap, C));
  if (!sp_whole_rows(s, st, mb, i, moe->recv_rows, (size_t)n, err))
    return false;
  if (n)
    KT(st, s,
       s->k->expert_ffn_forward(st->stream, yr, moe->saved, moe->act, xs, moe->scratch, rows,
                                moe->recv_expert, moe->recv_weight, n, P, moe->e_first,
                                moe->e_count, C, F));
  if (fp8 && n)
    KT(st, s, s->k->fp8_rows_quantize(st->stream, moe->q8, moe->inv8, xs, n, C));
  /* TP: the TP peers received the same rows (same tokens, same routing, the all-to-all over
   * the devices of their TP rank), each output a partial sum of its slice; summed here, before
   * the combine, so the combine sees whole outputs (a rerun's too: its combine receives them
   * and keeps nothing). Whole experts (route_split) give whole outputs already. */
  if (experts_tp_split(s, x->segment) && n)
    return tp_sum_rows(s, st, mb, i, yr, (size_t)n, err);
  return true;
}

bool exec_expert_compute(struct exec_state *s, uint32_t i, enum bwd_mode mode, bool forward,
                         struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_moe *moe = mb->moe[x->segment];
  int C = xm->C, F = expert_width_of(s, x->segment);
  if (!moe)
    return internal(err, s, i, "experts run before their dispatch");
  int n = (int)moe->n_recv;
  float *G = forward ? NULL : exec_grads_of(s, st, x->segment);
  if (forward)
    return expert_forward(s, i, st, moe, err);
  /* the weight gradient reads the rows' inputs back from their FP8 cache */
  float *xs = NULL;
  if (moe->q8 && mode != BWD_INPUT) {
    xs = mb_floats_raw(s, st, mb, OWN_WORK, moe->cap * (size_t)C);
    if (n)
      KT(st, s, k->fp8_rows_dequantize(st->stream, xs, moe->q8, moe->inv8, n, C));
  }
  if (mode == BWD_WEIGHT) {
    if (n)
      KT(st, s,
         k->expert_ffn_backward_weight(st->stream, G, moe->bwork, moe->recv_expert, n, moe->saved,
                                       moe->act, xs, moe->e_first, moe->e_count, C, F));
    return true;
  }
  if (!moe->dy_recv)
    return internal(err, s, i, "expert backward before its output gradient");
  const float *P = exec_params_of(s, x);
  uint32_t keep = OWN_WORK;
  if (mode == BWD_INPUT) {
    keep = exec_written_tensor(s, i, PLAN_TENSOR_SAVED);
    keep = keep == OWN_WORK ? OWN_MB : keep;
  }
  moe->bwork = mb_floats_raw(s, st, mb, keep, kernels_expert_ffn_bwork_floats((int)moe->cap, C, F));
  /* the rows' input gradients and their routing weights' gradients go back together */
  uint32_t back = out_tensor(s, i, EXEC_T_H);
  moe->drows_recv = mb_floats_raw(s, st, mb, back, moe->cap * C);
  moe->drw_recv = mb_floats_raw(s, st, mb, back, moe->cap);
  moe->scratch =
      mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats((int)moe->cap, C));
  if (!sp_whole_rows(s, st, mb, i, moe->dy_recv, (size_t)n, err))
    return false;
  if (n && mode == BWD_FUSED)
    KT(st, s,
       k->expert_ffn_backward(st->stream, moe->drows_recv, moe->drw_recv, G, moe->bwork,
                              moe->scratch, moe->dy_recv, moe->recv_expert, n, moe->saved, moe->act,
                              xs, P, moe->e_first, moe->e_count, C, F, false));
  else if (n)
    KT(st, s,
       k->expert_ffn_backward_input(st->stream, moe->drows_recv, moe->drw_recv, moe->bwork,
                                    moe->scratch, moe->dy_recv, moe->recv_expert, n, moe->saved,
                                    moe->act, P, moe->e_first, moe->e_count, C, F, false));
  /* TP: each slice's input gradient is partial, and so is each routing weight's (a dot product
   * over the slice's activation columns); both go back whole. Whole experts (route_split):
   * both whole already. */
  if (experts_tp_split(s, x->segment) && n)
    return tp_sum_rows(s, st, mb, i, moe->drows_recv, (size_t)n, err) &&
           tp_sum_floats(s, st, mb, i, moe->drw_recv, (size_t)n, err);
  return true;
}

/* Piper drops no tokens (ir/expert.c): a routing that sends a device more rows than the
 * plan's capacity stops the step, saying what would hold it. */
static bool capacity_exceeded(struct exec_state *s, uint32_t i, const struct exec_moe *moe,
                              GError **err) {
  const struct ir_node *n = &s->dev->plan->nodes[s->dev->instrs[i].node];
  double f = n->capacity_factor > 0 ? n->capacity_factor : IR_EP_CAPACITY_FACTOR_DEFAULT;
  double need = (double)moe->n_recv / (double)((size_t)moe->T_route * (size_t)s->xm->K);
  g_autofree char *why = g_strdup_printf(
      "the routing sent this device %zu rows, over the plan's expert capacity of %zu "
      "(capacity_factor %g on the shard directive; %.2f would hold them)",
      moe->n_recv, moe->cap, f, need);
  return internal(err, s, i, why);
}

/* A rerun's dispatch reads h and the routing where the router's rerun left them: in its saved
 * activations (the router's backward reads both), which the plan keeps until that backward. */
static bool router_rerun_output(struct exec_state *s, const struct exec_instr *x, const float **h,
                                const float **r) {
  uint32_t src = s->xm->m->edges[x->edge].src;
  const struct exec_seg_run *router = s->mbs[x->mb].seg[src];
  const struct exec_segment *es = &s->xm->segs[src];
  int32_t hv = es->final_value[EXEC_T_H], rv = es->final_value[EXEC_T_R];
  if (!router || router->dropped || hv < 0 || rv < 0)
    return false;
  *h = router->val[hv];
  *r = router->val[rv];
  return *h && *r;
}

/* The dispatch: routes this micro-batch's tokens to the experts' owners (counts first, then
 * the rows and their experts); under full recomputation again in the rerun (pass R), to the
 * same peers in the same order: the routing is recomputed bit for bit. sb, rb: scratch of S
 * byte counts. */
static bool a2a_dispatch(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                         struct exec_comm *comm, size_t *sb, size_t *rb, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  int T = xm->T, C = xm->C, K = xm->K, E = xm->E, TK = T * K;
  size_t row = (size_t)C * sizeof(float);
  bool ok = true;
  uint32_t S = s->dev->ep_size[x->segment];
  struct exec_moe *moe = exec_mb_host(s, mb, sizeof *moe, REPORT_MEM_COMM);
  mb->moe[x->segment] = moe;
  moe->S = S;
  moe->rank = s->dev->ep_rank[x->segment];
  moe->e_count = E / (int)S;
  moe->e_first = (int)moe->rank * moe->e_count;
  moe->in_edge = x->edge;
  moe->rerun = x->pass == IR_PASS_R;
  bool own_tokens = s->dev->route_split[x->segment] > 1; /* SP: h is the sequence shard */
  moe->T_route = own_tokens ? xm->T_seq : T;
  moe->route_off = own_tokens ? (size_t)s->dev->tp_rank * (size_t)xm->T_seq * K : 0;
  int TKr = moe->T_route * K;
  const float *h = edge_value(s, mb, x->edge, EXEC_T_H);
  const float *r = edge_value(s, mb, x->edge, EXEC_T_R);
  if (moe->rerun && !router_rerun_output(s, x, &h, &r))
    return internal(err, s, i, "a rerun's dispatch before the router's rerun");
  if (!h || !r)
    return internal(err, s, i, "the router's output has not arrived");
  /* the combine and both backward all-to-alls read the routing: the router's own copy in
   * its saved activations lives until its backward, after theirs (r, the copy that came
   * here, goes after this dispatch) */
  const struct exec_seg_run *router = mb->seg[s->xm->m->edges[x->edge].src];
  int32_t rv = s->xm->segs[s->xm->m->edges[x->edge].src].final_value[EXEC_T_R];
  if (moe->rerun || fwd_keep_of(s, x) == FWD_FULL_DROP) {
    /* under full recomputation: the rerun's routing is in the router rerun's saved
     * activations (until its backward, after every reader); the forward's stays in the
     * router's output, which the plan keeps until the forward's combine, its last reader */
  } else if (router && rv >= 0 && router->val[rv] && !router->dropped) {
    r = router->val[rv];
  } else if (router && router->dropped) {
    /* the router's forward under full recomputation kept none of it, and its rerun comes
     * after the combine's backward: a copy of the micro-batch's */
    float *copy = mb_floats_raw(s, st, mb, OWN_MB, (size_t)2 * TK);
    KT(st, s, k->copy(st->stream, copy, r, (size_t)2 * TK * sizeof(float)));
    r = copy;
  }
  moe->ids = (const int32_t *)r;
  moe->weights = r + TK;
  moe->send_counts = exec_mb_host(s, mb, S * sizeof(int32_t), REPORT_MEM_COMM);
  int32_t *counts_dev = mb_raw(s, st, mb, OWN_WORK, S * sizeof(int32_t), REPORT_MEM_COMM);
  /* the routing tables serve the experts, the combine and both backward all-to-alls: the
   * plan's tensor of them (ir_ep_route_bytes) lives until the last of those */
  uint32_t route = exec_written_tensor(s, i, PLAN_TENSOR_SAVED);
  route = route == OWN_WORK ? OWN_MB : route;
  moe->cap = (size_t)ir_ep_capacity_rows(s->dev->plan->model, &s->dev->plan->nodes[x->node]);
  moe->route_row = mb_raw(s, st, mb, route, (size_t)TKr * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  moe->send_expert = mb_raw(s, st, mb, OWN_WORK, (size_t)TKr * sizeof(int32_t), REPORT_MEM_COMM);
  moe->send_rows = mb_raw(s, st, mb, OWN_WORK, (size_t)TKr * row, REPORT_MEM_COMM);
  float *send_weight = mb_raw(s, st, mb, OWN_WORK, (size_t)TKr * sizeof(float), REPORT_MEM_COMM);
  const int32_t *ids = moe->ids + moe->route_off;
  KT(st, s,
     k->moe_dispatch_plan(st->stream, counts_dev, moe->route_row, ids, moe->T_route, K, E, (int)S));
  if (s->dev->sequence_parallel && !own_tokens) {
    /* h is this peer's sequence shard: the other tokens' rows go as zeros (sp_whole_rows) */
    size_t shard = (size_t)xm->T_seq * C;
    float *hz = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)T * C);
    KT(st, s, k->fill(st->stream, hz, 0.0f, (size_t)T * C));
    KT(st, s, k->copy(st->stream, hz + s->dev->tp_rank * shard, h, shard * sizeof(float)));
    h = hz;
  }
  KT(st, s,
     k->moe_dispatch_forward(st->stream, moe->send_rows, moe->send_expert, send_weight, h, ids,
                             moe->weights + moe->route_off, moe->route_row, moe->T_route, K, C));
  exec_backend_to_host(s->b, moe->send_counts, counts_dev, S * sizeof(int32_t));
  int32_t *rc = exec_mb_host(s, mb, S * sizeof(int32_t), REPORT_MEM_COMM);
  CT(st, s, ok, exec_comm_all_to_all_i32(s->b, comm, moe->send_counts, rc, err));
  moe->recv_counts = rc;
  if (!ok)
    return false;
  moe->n_recv = 0;
  for (uint32_t q = 0; q < S; q++)
    moe->n_recv += (size_t)rc[q];
  if (moe->n_recv > moe->cap)
    return capacity_exceeded(s, i, moe, err);
  uint32_t rows_out = exec_a2a_out_tensor(s, i, true);
  moe->recv_rows = mb_raw(s, st, mb, rows_out, moe->cap * row, REPORT_MEM_COMM);
  moe->recv_weight = mb_raw(s, st, mb, rows_out, moe->cap * sizeof(float), REPORT_MEM_COMM);
  moe->recv_expert = mb_raw(s, st, mb, route, moe->cap * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  byte_counts(moe->send_counts, S, row, sb);
  byte_counts(moe->recv_counts, S, row, rb);
  CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->send_rows, sb, moe->recv_rows, rb, err));
  if (!ok)
    return false;
  byte_counts(moe->send_counts, S, sizeof(int32_t), sb);
  byte_counts(moe->recv_counts, S, sizeof(int32_t), rb);
  CT(st, s, ok,
     exec_comm_all_to_all_v(s->b, comm, moe->send_expert, sb, moe->recv_expert, rb, err));
  if (ok)
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, send_weight, sb, moe->recv_weight, rb, err));
  return ok;
}

/* The dispatch's transpose: the input gradients' rows and their routing weights' gradients
 * back to the tokens' owners; dh summed over each token's routes (this peer's sequence shard
 * under SP), the routing weights' gradient in the router's [T, K] table. Under SP with experts
 * TP-split every peer sent every route, whole after the experts' TP sum: every token's comes
 * back. Where each TP rank routes its own tokens (route_split) only theirs come back, zeros
 * elsewhere: the router's backward sums the table over the TP group (segment_backward.c,
 * output_grads), on the compute stream as every TP collective. sb, rb: the rows' byte counts
 * on entry. */
static bool a2a_dispatch_backward(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                                  struct exec_comm *comm, size_t *sb, size_t *rb, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_moe *moe = mb->moe[x->segment];
  int T = xm->T, C = xm->C, K = xm->K, TK = T * K, TS = xm->T_seq;
  bool sp = s->dev->sequence_parallel, ok = true;
  bool own_tokens = s->dev->route_split[x->segment] > 1;
  size_t off = sp ? (size_t)s->dev->tp_rank * TS * K : 0, roff = own_tokens ? 0 : off;
  size_t TKr = (size_t)moe->T_route * K;
  uint32_t S = moe->S;
  if (!moe->drows_recv)
    return internal(err, s, i, "input gradients before the experts' backward");
  float *dsend = mb_raw(s, st, mb, OWN_WORK, TKr * C * sizeof(float), REPORT_MEM_COMM);
  float *dsend_w = mb_raw(s, st, mb, OWN_WORK, TKr * sizeof(float), REPORT_MEM_COMM);
  CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->drows_recv, rb, dsend, sb, err));
  byte_counts(moe->send_counts, S, sizeof(float), sb);
  byte_counts(moe->recv_counts, S, sizeof(float), rb);
  if (ok)
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->drw_recv, rb, dsend_w, sb, err));
  if (!ok)
    return false;
  uint32_t out = exec_a2a_out_tensor(s, i, false);
  float *dh = mb_floats_raw(s, st, mb, out, (size_t)TS * C);
  /* in r's layout (exec_grad_floats): the router's backward reads that many */
  float *dweights = mb_floats_raw(s, st, mb, out, exec_grad_floats(xm, EXEC_T_R));
  if (own_tokens) /* its own tokens' routes, from route_off on; the others' zeros */
    KT(st, s, k->fill(st->stream, dweights, 0.0f, (size_t)TK));
  bool every = sp && !own_tokens; /* every route came back: every token's weights apart */
  KT(st, s,
     k->moe_dispatch_backward(st->stream, dh, every ? NULL : dweights + moe->route_off, dsend,
                              dsend_w, moe->route_row + roff, TS, K, C, false));
  if (every) /* C = 0: the weights' gradients alone, every token's */
    KT(st, s,
       k->moe_dispatch_backward(st->stream, dh, dweights, dsend, dsend_w, moe->route_row, T, K, 0,
                                false));
  mb->grad[(size_t)x->edge * TC + EXEC_T_H] = dh;
  mb->grad[(size_t)moe->in_edge * TC + EXEC_T_R] = dweights;
  return true;
}

bool exec_all_to_all(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_comm *comm = comm_of(s, i);
  int T = xm->T, C = xm->C, K = xm->K, TK = T * K;
  size_t row = (size_t)C * sizeof(float);
  bool ok = true;
  /* under SP the combine's output and the dispatch's input gradient are this peer's sequence
   * shard: its tokens' routes, from route off on */
  int TS = xm->T_seq;
  size_t off = s->dev->sequence_parallel ? (size_t)s->dev->tp_rank * TS * K : 0;
  if (!comm)
    return internal(err, s, i, "no communicator");
  uint32_t S = s->dev->ep_size[x->segment];
  size_t *sb = g_new(size_t, S), *rb = g_new(size_t, S);
  struct exec_moe *moe = mb->moe[x->segment];
  bool forward = x->pass == IR_PASS_F || x->pass == IR_PASS_R;
  if (x->role == EXEC_ROLE_A2A_TO_EXPERT && forward) {
    ok = a2a_dispatch(s, i, st, comm, sb, rb, err);
    goto out;
  }
  if (!moe) {
    ok = internal(err, s, i, "all-to-all before its dispatch");
    goto out;
  }
  byte_counts(moe->send_counts, S, row, sb);
  byte_counts(moe->recv_counts, S, row, rb);
  /* the routes this device dispatched (route_row holds only theirs where it routes its own
   * tokens, route_split: from 0 on) */
  bool own_tokens = s->dev->route_split[x->segment] > 1;
  size_t TKr = (size_t)moe->T_route * K, roff = own_tokens ? 0 : off;
  if (x->role == EXEC_ROLE_A2A_FROM_EXPERT && forward) {
    /* combine: the weighted expert outputs back to the tokens' owners, summed per token; the
     * received rows are transient (the combine's transpose reads nothing of them) */
    if (!moe->y_recv) {
      ok = internal(err, s, i, "combine before the experts ran");
      goto out;
    }
    moe->y_send = mb_raw(s, st, mb, OWN_WORK, TKr * row, REPORT_MEM_COMM);
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->y_recv, rb, moe->y_send, sb, err));
    if (!ok || x->pass == IR_PASS_R) /* the forward's combined output went on */
      goto out;
    float *mout = mb_floats_raw(s, st, mb, exec_a2a_out_tensor(s, i, false), (size_t)TS * C);
    KT(st, s,
       k->moe_combine_forward(st->stream, mout, moe->y_send, moe->route_row + roff, TS, K, C));
    mb->out[(size_t)x->segment * TC + EXEC_T_M] = mout;
  } else if (x->role == EXEC_ROLE_A2A_TO_EXPERT) {
    /* combine's transpose: each route's row gets its token's output gradient */
    const float *dm = mb->grad[(size_t)x->edge * TC + EXEC_T_M];
    if (!dm) {
      ok = internal(err, s, i, "the experts' output gradient has not arrived");
      goto out;
    }
    float *dy_send = mb_raw(s, st, mb, OWN_WORK, TKr * row, REPORT_MEM_COMM);
    if (s->dev->sequence_parallel && !own_tokens) /* the other tokens' as zeros (sp_whole_rows) */
      KT(st, s, k->fill(st->stream, dy_send, 0.0f, (size_t)TK * C));
    KT(st, s, k->moe_combine_backward(st->stream, dy_send, dm, moe->route_row + roff, TS, K, C));
    moe->dy_recv =
        mb_raw(s, st, mb, exec_a2a_out_tensor(s, i, true), moe->cap * row, REPORT_MEM_COMM);
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, dy_send, sb, moe->dy_recv, rb, err));
  } else {
    ok = a2a_dispatch_backward(s, i, st, comm, sb, rb, err);
  }
out:
  g_free(sb);
  g_free(rb);
  return ok;
}
