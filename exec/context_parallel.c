/* context_parallel: context parallelism in the host executor (docs/directives.md, "Context
 * parallelism"), as the compiler lays it out (the model loaded with piper.context_parallel = c,
 * so every op is one CP rank's seq / c tokens).
 *
 * A CP rank holds chunks r and 2c - 1 - r of every sequence (Megatron's causal load balance):
 * the data loader keeps those rows of the tokens and targets (exec_cp_batch), and everything but
 * the attention's core runs on them unchanged. The attention projects its own rows, rotates q and
 * k at their global positions (kernels_rope_cp), gathers every rank's K and V over the plan's cp
 * communicator, and runs each of its two query chunks against every key chunk with the blocks of
 * kernels/attention_cp.c (causal by the chunks' global offsets), merging the partial outputs by
 * their log-sum-exp. Its backward gathers K and V again, sums each block's dK and dV into the
 * whole sequence's, and reduce-scatters them back to their owners. The gathers run inside the
 * compute, on its fiber, as TP's collectives do: the plan's cp nodes (which stand for them, ring
 * or all-gather alike) have nothing left to do (EXEC_ROLE_CP); a rerun (recomputation) gathers
 * again. Every token's loss is its CP
 * rank's: the ranks count among the replicas, so the step's mean over their micro-batch means is
 * the whole sequence's, and the loss gradient's 1 / (replicas x M) scale each token once. */
#include <math.h>
#include <string.h>

#include "data.h"
#include "train-impl.h"

static bool fail_node(const struct exec_device *d, uint32_t node, GError **err, const char *what) {
  char nb[256];
  plan_node_name(d->plan, node, nb, sizeof nb);
  return piper_input_error(err, "plan: device %u: instruction \"%s\": %s", d->device, nb, what);
}

bool exec_cp_device_init(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  d->cp_degree = 1;
  d->cp_rank = 0;
  d->cp_comm = IR_NONE;
  uint32_t cp = p->model->context_parallel > 1 ? (uint32_t)p->model->context_parallel : 1;
  if (cp <= 1)
    return true;
  for (uint32_t i = 0; i < d->cls->n_instrs; i++) {
    uint32_t node = d->cls->instrs[i].node;
    const struct ir_node *n = &p->nodes[node];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    if (n->cp_degree != cp || n->replica_degree % cp != 0)
      return fail_node(d, node, err, "is not split over the model's context-parallel degree");
    /* TP innermost, then CP (Megatron's order): the CP rank is the replica position's digit */
    int pos = plan_node_position(p, node, d->device);
    if (pos < 0)
      return fail_node(d, node, err, "runs on a device outside its group");
    d->cp_degree = cp;
    d->cp_rank = (uint32_t)pos / d->tp_degree % cp;
    return true;
  }
  return true;
}

bool exec_cp_link_comm(struct exec_device *d, GError **err) {
  if (d->cp_degree <= 1)
    return true;
  const struct plan *p = d->plan;
  for (uint32_t i = 0; i < d->n_instrs; i++) {
    const struct exec_instr *x = &d->instrs[i];
    if (x->role != EXEC_ROLE_CP)
      continue;
    if (d->cp_comm != IR_NONE && d->comm_keys[d->cp_comm].comm != d->comm_keys[x->comm].comm)
      return fail_node(d, x->node, err, "exchanges K/V on a second CP group; a device has one");
    if (d->cp_comm == IR_NONE)
      d->cp_comm = x->comm;
  }
  if (d->cp_comm == IR_NONE || p->comms[d->comm_keys[d->cp_comm].comm].purpose != IR_COMM_CP)
    return piper_input_error(err, "plan: device %u: context parallelism without a cp communicator",
                             d->device);
  return true;
}

uint64_t exec_cp_data_block(const struct exec_device *d, uint32_t step, uint32_t k) {
  /* the CP ranks of one replica read the same sequences: blocks count model copies */
  uint32_t cp = d->cp_degree > 1 ? d->cp_degree : 1;
  return (uint64_t)(step - 1) * (d->dp_degree / cp) * d->M + (uint64_t)(d->dp_rank / cp) * d->M + k;
}

void exec_cp_batch(const struct exec_data *data, const struct exec_device *d, uint64_t block,
                   int batch, int seq, int32_t *tokens, int32_t *targets) {
  int cp = (int)d->cp_degree, r = (int)d->cp_rank;
  if (cp <= 1) {
    exec_data_batch(data, block, batch, seq, tokens, targets);
    return;
  }
  size_t whole = (size_t)batch * (size_t)seq;
  int32_t *tk = g_new(int32_t, whole), *tg = g_new(int32_t, whole);
  exec_data_batch(data, block, batch, seq, tk, tg);
  int L = seq / (2 * cp), local = seq / cp;
  int chunks[2] = {r, 2 * cp - 1 - r};
  for (int b = 0; b < batch; b++)
    for (int c = 0; c < 2; c++) {
      size_t from = (size_t)b * seq + (size_t)chunks[c] * L, to = (size_t)b * local + (size_t)c * L;
      memcpy(tokens + to, tk + from, (size_t)L * sizeof(int32_t));
      memcpy(targets + to, tg + from, (size_t)L * sizeof(int32_t));
    }
  g_free(tk);
  g_free(tg);
}

/* The whole sequence's K and V (every rank's, in rank order: [cp][batch][seq / cp][KV*D]) into
 * kg and vg, gathered over the cp communicator. */
static bool gather_kv(struct exec_state *s, struct exec_task_ctx *st, const float *k,
                      const float *v, float *kg, float *vg, size_t n, GError **err) {
  struct exec_comm *comm = s->comms[s->dev->cp_comm];
  bool ok;
  CT(st, s, ok, exec_comm_all_gather(s->b, comm, k, kg, n * sizeof(float), err));
  if (ok)
    CT(st, s, ok, exec_comm_all_gather(s->b, comm, v, vg, n * sizeof(float), err));
  return ok;
}

/* Chunk c (0, 1) of CP rank r: its global chunk index. */
static int chunk_index(int cp, int r, int c) {
  return c == 0 ? r : 2 * cp - 1 - r;
}

/* The blocks of one (sequence b, local query chunk c) against every rank's two key chunks. */
struct cp_blocks {
  const struct kernels_attention_dims *d;
  int cp, rank, L, local;
  size_t HD, KD;
};

static struct kernels_attention_block block_of(const struct cp_blocks *cb, int c, int r2, int c2) {
  const struct kernels_attention_dims *d = cb->d;
  return (struct kernels_attention_block){
      .m = cb->L,
      .n = cb->L,
      .heads = d->heads,
      .kv_heads = d->kv_heads,
      .head_dim = d->head_dim,
      .q0 = chunk_index(cb->cp, cb->rank, c) * cb->L,
      .k0 = chunk_index(cb->cp, r2, c2) * cb->L,
      .scale = 1.0f / sqrtf((float)d->head_dim),
  };
}

/* Row offset of (rank r2, sequence b, local chunk c2) in the gathered [cp][batch][local] rows. */
static size_t kv_row(const struct cp_blocks *cb, int r2, int b, int c2) {
  return ((size_t)r2 * (size_t)cb->d->batch + (size_t)b) * (size_t)cb->local +
         (size_t)c2 * (size_t)cb->L;
}

/* lse, y of the local queries: each chunk's blocks merged by their log-sum-exp. lse is kept
 * per chunk, [H, L] from the chunk's first row (only this file reads it under CP). */
static void core_forward(struct exec_state *s, struct exec_task_ctx *st, const struct cp_blocks *cb,
                         const struct kernels_attention_views *w, const float *kg,
                         const float *vg) {
  const struct kernels_attention_dims *d = cb->d;
  const struct exec_kernels *k = s->k;
  for (int b = 0; b < d->batch; b++)
    for (int c = 0; c < 2; c++) {
      size_t q = (size_t)b * cb->local + (size_t)c * cb->L;
      float *y = w->y + q * cb->HD, *lse = w->lse + q * (size_t)d->heads;
      bool first = true;
      for (int r2 = 0; r2 < cb->cp; r2++)
        for (int c2 = 0; c2 < 2; c2++) {
          struct kernels_attention_block blk = block_of(cb, c, r2, c2);
          if (blk.k0 > blk.q0 + blk.m - 1)
            continue; /* every key after every query: masked whole */
          size_t kr = kv_row(cb, r2, b, c2);
          /* the first block a chunk sees writes its result; the others merge into it */
          KT(st, s,
             k->attention_block_forward(st->stream, y, lse, w->q + q * cb->HD, kg + kr * cb->KD,
                                        vg + kr * cb->KD, &blk, !first));
          first = false;
        }
    }
}

static struct cp_blocks blocks_of(const struct exec_state *s,
                                  const struct kernels_attention_dims *d,
                                  const struct kernels_attention_views *w) {
  int cp = (int)s->dev->cp_degree;
  return (struct cp_blocks){d, cp, (int)s->dev->cp_rank, d->seq / 2, d->seq, w->HD, w->KD};
}

/* The dims with this rank's chunks' positions (the projections' RoPE). */
static struct kernels_attention_dims cp_dims(const struct exec_state *s,
                                             const struct kernels_attention_dims *d) {
  struct kernels_attention_dims dd = *d;
  dd.cp = (int)s->dev->cp_degree;
  dd.cp_rank = (int)s->dev->cp_rank;
  return dd;
}

/* The core over every rank's K/V: gathered into the workspace (what the exchange holds while
 * the attention runs), then the blocks. */
static bool gathered_core(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                          const struct kernels_attention_dims *d,
                          const struct kernels_attention_views *w, GError **err) {
  size_t n = w->T * w->KD, cp = s->dev->cp_degree;
  float *kg = mb_floats_raw(s, st, mb, OWN_WORK, n * cp);
  float *vg = mb_floats_raw(s, st, mb, OWN_WORK, n * cp);
  if (!gather_kv(s, st, w->k, w->v, kg, vg, n, err))
    return false;
  struct cp_blocks cb = blocks_of(s, d, w);
  core_forward(s, st, &cb, w, kg, vg);
  return true;
}

bool exec_cp_attention_forward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                               float *a, float *saved, const float *h, const float *params,
                               const struct kernels_attention_dims *d, GError **err) {
  struct kernels_attention_dims dd = cp_dims(s, d);
  struct kernels_attention_views w = kernels_attention_views(&dd, params, saved, NULL);
  KT(st, s, s->k->attention_qkv_forward(st->stream, saved, h, params, &dd));
  if (!gathered_core(s, st, mb, &dd, &w, err))
    return false;
  KT(st, s, s->k->attention_out_forward(st->stream, a, saved, params, &dd));
  return true;
}

bool exec_cp_attention_core_forward(struct exec_state *s, struct exec_task_ctx *st,
                                    struct exec_mb *mb, float *saved,
                                    const struct kernels_attention_dims *d, GError **err) {
  struct kernels_attention_views w = kernels_attention_views(d, NULL, saved, NULL);
  return gathered_core(s, st, mb, d, &w, err);
}

/* dq (local), dkg, dvg (the whole sequence's) += every block's gradients. */
static void core_backward(struct exec_state *s, struct exec_task_ctx *st,
                          const struct cp_blocks *cb, const struct kernels_attention_views *w,
                          const float *kg, const float *vg, float *dkg, float *dvg) {
  const struct kernels_attention_dims *d = cb->d;
  const struct exec_kernels *k = s->k;
  for (int b = 0; b < d->batch; b++)
    for (int c = 0; c < 2; c++) {
      size_t q = (size_t)b * cb->local + (size_t)c * cb->L, qo = q * cb->HD;
      const float *lse = w->lse + q * (size_t)d->heads;
      for (int r2 = 0; r2 < cb->cp; r2++)
        for (int c2 = 0; c2 < 2; c2++) {
          struct kernels_attention_block blk = block_of(cb, c, r2, c2);
          if (blk.k0 > blk.q0 + blk.m - 1)
            continue;
          size_t ko = kv_row(cb, r2, b, c2) * cb->KD;
          KT(st, s,
             k->attention_block_backward(st->stream, w->dq + qo, dkg + ko, dvg + ko, w->dy + qo,
                                         w->y + qo, lse, w->q + qo, kg + ko, vg + ko, &blk));
        }
    }
}

bool exec_cp_attention_backward_input(struct exec_state *s, struct exec_task_ctx *st,
                                      struct exec_mb *mb, float *dh, float *bwork, const float *da,
                                      const float *saved, const float *params,
                                      const struct kernels_attention_dims *d, bool accumulate,
                                      GError **err) {
  struct kernels_attention_dims dd = cp_dims(s, d);
  struct kernels_attention_views w = kernels_attention_views(&dd, params, saved, bwork);
  size_t n = w.T * w.KD, cp = s->dev->cp_degree;
  /* K and V gathered again (the forward kept its own rows only), dK and dV of all of them */
  float *kg = mb_floats_raw(s, st, mb, OWN_WORK, n * cp);
  float *vg = mb_floats_raw(s, st, mb, OWN_WORK, n * cp);
  if (!gather_kv(s, st, w.k, w.v, kg, vg, n, err))
    return false;
  float *dkg = mb_floats(s, st, mb, OWN_WORK, n * cp);
  float *dvg = mb_floats(s, st, mb, OWN_WORK, n * cp);
  const struct exec_kernels *k = s->k;
  KT(st, s, k->attention_out_backward_input(st->stream, bwork, da, params, &dd));
  KT(st, s, k->fill(st->stream, w.dq, 0.0f, w.T * w.HD));
  struct cp_blocks cb = blocks_of(s, &dd, &w);
  core_backward(s, st, &cb, &w, kg, vg, dkg, dvg);
  /* each rank's dK and dV summed over the ranks whose queries saw them, back to their owner */
  struct exec_comm *comm = s->comms[s->dev->cp_comm];
  bool ok;
  CT(st, s, ok, exec_comm_reduce_scatter_f32(s->b, comm, dkg, w.dk, n, err));
  if (ok)
    CT(st, s, ok, exec_comm_reduce_scatter_f32(s->b, comm, dvg, w.dv, n, err));
  if (!ok)
    return false;
  KT(st, s, k->attention_qkv_backward_input(st->stream, dh, bwork, params, &dd, accumulate));
  return true;
}
