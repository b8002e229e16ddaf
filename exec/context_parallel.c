/* context_parallel: context parallelism in the host executor (docs/directives.md, "Context
 * parallelism"), as the compiler lays it out (the model loaded with piper.context_parallel = c,
 * so every op is one CP rank's seq / c tokens).
 *
 * A CP rank holds chunks r and 2c - 1 - r of every sequence (Megatron's causal load balance):
 * the data loader keeps those rows of the tokens and targets (exec_cp_batch), and everything but
 * the attention's core runs on them unchanged. The attention projects its own rows, rotates q and
 * k at their global positions (kernels_rope_cp), and runs its two query chunks against every
 * rank's two key chunks with the blocks of kernels/attention_cp.c (causal by the chunks' global
 * offsets; a block masked whole is skipped, as Megatron / Transformer Engine's load-balanced
 * ring skips it), merging the partial outputs by their log-sum-exp. The other ranks' K/V come
 * one of two ways, the plan's cp_comm:
 *   - p2p (the ring, Megatron's cp_comm_type p2p): c steps; at step i a rank holds the K/V of
 *     rank r - i, sends it on to rank r + 1 and receives rank r - i - 1's from rank r - 1
 *     (exec_comm_p2p_start) while its blocks against the K/V it holds run, and waits before the
 *     next step. Two blocks of K/V are resident besides its own (one at c = 2). Backward runs
 *     the same ring, and the dK/dV of each block travel with it: a rank adds its blocks'
 *     gradients for the K/V it holds to the sum the previous rank passes on, one step behind
 *     (so that exchange overlaps too), and after c steps each sum is back at its owner;
 *   - all_gather (Llama 3's): every rank's K/V gathered before the blocks; backward gathers
 *     again, sums each block's dK/dV into the whole sequence's and reduce-scatters them.
 * Both visit the blocks in the ring's order (source_of), so their forwards agree bit for
 * bit. The exchange runs inside the compute, on its fiber (host) or beside its stream (cuda),
 * as TP's collectives do: the plan's cp nodes (which stand for it) have nothing left to do
 * (EXEC_ROLE_CP); a rerun (recomputation) exchanges again. Every token's loss is its CP rank's:
 * the ranks count among the replicas, so the step's mean over their micro-batch means is the
 * whole sequence's, and the loss gradient's 1 / (replicas x M) scale each token once. */
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
    d->cp_ring = n->cp_comm == IR_CP_P2P;
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
  /* the ring's neighbours; the blocks take a member's position as its CP rank */
  uint32_t comm = d->comm_keys[d->cp_comm].comm, *members = g_new(uint32_t, d->cp_degree);
  bool ok = plan_comm_size(p, comm) == d->cp_degree &&
            plan_comm_rank(p, comm, d->device) == (int)d->cp_rank;
  if (ok) {
    plan_comm_members(p, comm, d->device, members);
    d->cp_next = members[(d->cp_rank + 1) % d->cp_degree];
    d->cp_prev = members[(d->cp_rank + d->cp_degree - 1) % d->cp_degree];
  }
  g_free(members);
  if (!ok)
    return piper_input_error(err, "plan: device %u: its cp communicator does not hold the %u CP "
                                  "ranks in order", d->device, d->cp_degree);
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
 * *kg and *vg, taken from the workspace (what the exchange holds while the attention runs) and
 * gathered over the cp communicator. n: one rank's K (or V) floats. */
static bool gather_kv(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                      const float *k, const float *v, float **kg, float **vg, size_t n, int cp,
                      GError **err) {
  *kg = mb_floats_raw(s, st, mb, OWN_WORK, n * (size_t)cp);
  *vg = mb_floats_raw(s, st, mb, OWN_WORK, n * (size_t)cp);
  struct exec_comm *comm = s->comms[s->dev->cp_comm];
  bool ok;
  CT(st, s, ok, exec_comm_all_gather(s->b, comm, k, *kg, n * sizeof(float), err));
  if (ok)
    CT(st, s, ok, exec_comm_all_gather(s->b, comm, v, *vg, n * sizeof(float), err));
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

/* Where sequence b's local chunk c2 starts in one rank's rows ([batch][seq / cp]). */
static size_t kv_row(const struct cp_blocks *cb, int b, int c2) {
  return (size_t)b * (size_t)cb->local + (size_t)c2 * (size_t)cb->L;
}

/* The rank whose K/V a rank holds at step `step` of the ring (step 0: its own). */
static int source_of(const struct cp_blocks *cb, int step) {
  return (cb->rank - step + cb->cp) % cb->cp;
}

/* One rank's K and V rows ([batch][seq / cp][KV*D] each), or their dK and dV. */
struct cp_kv {
  float *k, *v;
};

/* lse, y of the local queries against the K/V of step `step`'s source rank. Step 0 (this
 * rank's own K/V, the diagonal: its first chunk is seen by both local chunks) writes; every
 * later block merges into what the chunk has. */
static void forward_source(struct exec_state *s, struct exec_task_ctx *st,
                           const struct cp_blocks *cb, const struct kernels_attention_views *w,
                           int step, struct cp_kv kv) {
  const struct kernels_attention_dims *d = cb->d;
  const struct exec_kernels *k = s->k;
  int src = source_of(cb, step);
  for (int b = 0; b < d->batch; b++)
    for (int c = 0; c < 2; c++) {
      size_t q = kv_row(cb, b, c);
      float *y = w->y + q * cb->HD, *lse = w->lse + q * (size_t)d->heads;
      for (int c2 = 0; c2 < 2; c2++) {
        struct kernels_attention_block blk = block_of(cb, c, src, c2);
        bool write = step == 0 && c2 == 0;
        if (blk.k0 > blk.q0 + blk.m - 1) { /* every key after every query: masked whole */
          PIPER_ASSERT(!write);
          continue;
        }
        size_t kr = kv_row(cb, b, c2) * cb->KD;
        KT(st, s,
           k->attention_block_forward(st->stream, y, lse, w->q + q * cb->HD, kv.k + kr,
                                      kv.v + kr, &blk, !write));
      }
    }
}

/* dq (local) and d (the source's dK, dV) += the blocks of the local queries against the K/V
 * of step `step`'s source rank. */
static void backward_source(struct exec_state *s, struct exec_task_ctx *st,
                            const struct cp_blocks *cb, const struct kernels_attention_views *w,
                            int step, struct cp_kv kv, struct cp_kv dkv) {
  const struct kernels_attention_dims *d = cb->d;
  const struct exec_kernels *k = s->k;
  int src = source_of(cb, step);
  for (int b = 0; b < d->batch; b++)
    for (int c = 0; c < 2; c++) {
      size_t q = kv_row(cb, b, c), qo = q * cb->HD;
      const float *lse = w->lse + q * (size_t)d->heads;
      for (int c2 = 0; c2 < 2; c2++) {
        struct kernels_attention_block blk = block_of(cb, c, src, c2);
        if (blk.k0 > blk.q0 + blk.m - 1)
          continue;
        size_t ko = kv_row(cb, b, c2) * cb->KD;
        KT(st, s,
           k->attention_block_backward(st->stream, w->dq + qo, dkv.k + ko, dkv.v + ko, w->dy + qo,
                                       w->y + qo, lse, w->q + qo, kv.k + ko, kv.v + ko, &blk));
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

/* ---- the all-gather ------------------------------------------------------------------------ */

/* Source rank src's rows in the gathered [cp][batch][seq / cp][KV*D] K and V (or dK, dV). */
static struct cp_kv gathered_of(const struct cp_blocks *cb, float *k, float *v, int src) {
  size_t at = (size_t)src * (size_t)cb->d->batch * (size_t)cb->local * cb->KD;
  return (struct cp_kv){k + at, v + at};
}

/* The core over every rank's K/V, gathered into the workspace (what the exchange holds while
 * the attention runs), then the blocks in the ring's order. */
static bool gathered_forward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                             const struct cp_blocks *cb, const struct kernels_attention_views *w,
                             GError **err) {
  float *kg, *vg;
  if (!gather_kv(s, st, mb, w->k, w->v, &kg, &vg, w->T * w->KD, cb->cp, err))
    return false;
  for (int step = 0; step < cb->cp; step++)
    forward_source(s, st, cb, w, step, gathered_of(cb, kg, vg, source_of(cb, step)));
  return true;
}

/* dq, and the whole sequence's dK and dV summed over the ranks whose queries saw them and
 * reduce-scattered back to their owners (w->dk, w->dv). */
static bool gathered_backward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                              const struct cp_blocks *cb, const struct kernels_attention_views *w,
                              GError **err) {
  size_t n = w->T * w->KD, cp = (size_t)cb->cp;
  /* K and V gathered again (the forward kept its own rows only), dK and dV of all of them */
  float *kg, *vg;
  if (!gather_kv(s, st, mb, w->k, w->v, &kg, &vg, n, cb->cp, err))
    return false;
  float *dkg = mb_floats(s, st, mb, OWN_WORK, n * cp);
  float *dvg = mb_floats(s, st, mb, OWN_WORK, n * cp);
  for (int step = 0; step < cb->cp; step++) {
    int src = source_of(cb, step);
    backward_source(s, st, cb, w, step, gathered_of(cb, kg, vg, src),
                    gathered_of(cb, dkg, dvg, src));
  }
  struct exec_comm *comm = s->comms[s->dev->cp_comm];
  bool ok;
  CT(st, s, ok, exec_comm_reduce_scatter_f32(s->b, comm, dkg, w->dk, n, err));
  if (ok)
    CT(st, s, ok, exec_comm_reduce_scatter_f32(s->b, comm, dvg, w->dv, n, err));
  return ok;
}

/* ---- the ring ------------------------------------------------------------------------------ */

/* One rank's K/V (or dK/dV) rows of n floats each, in the running instruction's workspace. */
static struct cp_kv ring_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                                size_t n) {
  float *k = mb_floats_raw(s, st, mb, OWN_WORK, n);
  return (struct cp_kv){k, mb_floats_raw(s, st, mb, OWN_WORK, n)};
}

/* Posts one exchange of the ring: each of `pairs` K/V pairs of send to the next CP rank, the
 * same pair of recv from the previous one, tags from tag (distinct per kind: MPI matches a
 * peer's messages of one tag in order). Even ranks list their sends first, odd ones their
 * receives (the order rule of exec_backend_ops.p2p_group: mirrored at c = 2). */
static bool ring_start(struct exec_state *s, struct exec_task_ctx *st, const struct cp_kv *send,
                       const struct cp_kv *recv, uint32_t pairs, size_t n, int tag,
                       struct exec_p2p_flight **flight, GError **err) {
  const struct exec_device *d = s->dev;
  struct exec_comm *comm = s->comms[d->cp_comm];
  struct exec_p2p_part parts[8];
  uint32_t np = 0;
  for (int half = 0; half < 2; half++) {
    bool sends = (half == 0) == (d->cp_rank % 2 == 0);
    for (uint32_t p = 0; p < pairs; p++)
      for (int kv = 0; kv < 2; kv++) {
        const struct cp_kv *x = sends ? &send[p] : &recv[p];
        parts[np++] = (struct exec_p2p_part){comm, sends ? d->cp_next : d->cp_prev, sends,
                                             kv ? x->v : x->k, n * sizeof(float),
                                             tag + 2 * (int)p + kv};
      }
  }
  bool ok;
  CT(st, s, ok, exec_comm_p2p_start(s->b, parts, np, flight, err));
  return ok;
}

static bool ring_finish(struct exec_state *s, struct exec_task_ctx *st,
                        struct exec_p2p_flight *flight, GError **err) {
  bool ok;
  CT(st, s, ok, exec_comm_p2p_finish(s->b, flight, err));
  return ok;
}

/* Tags of the ring's messages on the cp communicator (forward K/V; backward K/V, dK/dV). */
enum { RING_TAG_FORWARD = 0, RING_TAG_BACKWARD = 2, RING_TAG_GRAD = 4 };

/* The forward's ring: at each step the blocks against the K/V held run while it goes on to the
 * next rank and the next arrives; held: the own rows, then the two buffers in turn (one at
 * c = 2: the last step sends nothing). */
static bool ring_forward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                         const struct cp_blocks *cb, const struct kernels_attention_views *w,
                         GError **err) {
  size_t n = w->T * w->KD;
  struct cp_kv buf[2], cur = {w->k, w->v};
  for (int i = 0; i < 2 && i < cb->cp - 1; i++)
    buf[i] = ring_buffer(s, st, mb, n);
  for (int step = 0; step < cb->cp; step++) {
    bool last = step == cb->cp - 1;
    struct exec_p2p_flight *flight = NULL;
    if (!last && !ring_start(s, st, &cur, &buf[step % 2], 1, n, RING_TAG_FORWARD, &flight, err))
      return false;
    forward_source(s, st, cb, w, step, cur);
    if (!last && !ring_finish(s, st, flight, err))
      return false;
    if (!last)
      cur = buf[step % 2];
  }
  return true;
}

/* Which of the backward ring's three dK/dV buffers a step adds its blocks' gradients into:
 * the one neither sending the previous step's sum nor receiving this step's. */
static int ring_local(int step) {
  return (3 - step % 3) % 3;
}

/* dq, and this rank's dK/dV (w->dk, w->dv) from the sums that went round the ring. Step i
 * holds the K/V of rank r - i (as the forward) and adds its blocks' gradients for them into a
 * zeroed buffer; meanwhile the sum of ranks r - i .. r - 1 for that K/V arrives from rank r - 1
 * and the previous step's sum leaves for rank r + 1 (one step behind, so this exchange overlaps
 * the blocks too); the arrived sum is added after. The last step's sum leaves for its owner
 * r + 1, and rank r's arrives into w->dk, w->dv. Three dK/dV buffers turn (ring_local); the one
 * free at the end is w's own, so two are workspace, as are two K/V buffers (one at c = 2). */
static bool ring_backward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                          const struct cp_blocks *cb, const struct kernels_attention_views *w,
                          GError **err) {
  int cp = cb->cp;
  size_t n = w->T * w->KD;
  struct cp_kv kvbuf[2], dbuf[3], cur = {w->k, w->v};
  for (int i = 0; i < 2 && i < cp - 1; i++)
    kvbuf[i] = ring_buffer(s, st, mb, n);
  int own = 3 - ring_local(cp - 2) - ring_local(cp - 1); /* free after the last step */
  for (int i = 0; i < 3; i++)
    dbuf[i] = i == own ? (struct cp_kv){w->dk, w->dv} : ring_buffer(s, st, mb, n);
  const struct exec_kernels *k = s->k;
  int sum = -1; /* the previous step's sum, leaving now */
  for (int step = 0; step < cp; step++) {
    int local = ring_local(step), in = sum < 0 ? -1 : 3 - sum - local;
    struct exec_p2p_flight *kv_flight = NULL, *d_flight = NULL;
    if (step < cp - 1 && !ring_start(s, st, &cur, &kvbuf[step % 2], 1, n, RING_TAG_BACKWARD,
                                     &kv_flight, err))
      return false;
    if (in >= 0 &&
        !ring_start(s, st, &dbuf[sum], &dbuf[in], 1, n, RING_TAG_GRAD, &d_flight, err)) {
      ring_finish(s, st, kv_flight, NULL); /* nothing stays in flight */
      return false;
    }
    KT(st, s, k->fill(st->stream, dbuf[local].k, 0.0f, n));
    KT(st, s, k->fill(st->stream, dbuf[local].v, 0.0f, n));
    backward_source(s, st, cb, w, step, cur, dbuf[local]);
    bool ok = ring_finish(s, st, kv_flight, err);
    ok = ring_finish(s, st, d_flight, ok ? err : NULL) && ok;
    if (!ok)
      return false;
    if (in >= 0) { /* this rank's blocks, then the ranks' before it: the all-gather's sum at c = 2 */
      KT(st, s, k->add(st->stream, dbuf[local].k, dbuf[in].k, n));
      KT(st, s, k->add(st->stream, dbuf[local].v, dbuf[in].v, n));
    }
    sum = local;
    if (step < cp - 1)
      cur = kvbuf[step % 2];
  }
  PIPER_ASSERT(sum != own);
  struct exec_p2p_flight *flight = NULL;
  return ring_start(s, st, &dbuf[sum], &dbuf[own], 1, n, RING_TAG_GRAD, &flight, err) &&
         ring_finish(s, st, flight, err);
}

/* ---- the attention ------------------------------------------------------------------------ */

/* lse, y of the local queries over every rank's K/V, by the plan's exchange. */
static bool core_forward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                         const struct kernels_attention_dims *d,
                         const struct kernels_attention_views *w, GError **err) {
  struct cp_blocks cb = blocks_of(s, d, w);
  return s->dev->cp_ring ? ring_forward(s, st, mb, &cb, w, err)
                         : gathered_forward(s, st, mb, &cb, w, err);
}

bool exec_cp_attention_forward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                               float *a, float *saved, const float *h, const float *params,
                               const struct kernels_attention_dims *d, GError **err) {
  struct kernels_attention_dims dd = cp_dims(s, d);
  struct kernels_attention_views w = kernels_attention_views(&dd, params, saved, NULL);
  KT(st, s, s->k->attention_qkv_forward(st->stream, saved, h, params, &dd));
  if (!core_forward(s, st, mb, &dd, &w, err))
    return false;
  KT(st, s, s->k->attention_out_forward(st->stream, a, saved, params, &dd));
  return true;
}

bool exec_cp_attention_core_forward(struct exec_state *s, struct exec_task_ctx *st,
                                    struct exec_mb *mb, float *saved,
                                    const struct kernels_attention_dims *d, GError **err) {
  struct kernels_attention_views w = kernels_attention_views(d, NULL, saved, NULL);
  return core_forward(s, st, mb, d, &w, err);
}

bool exec_cp_attention_backward_input(struct exec_state *s, struct exec_task_ctx *st,
                                      struct exec_mb *mb, float *dh, float *bwork, const float *da,
                                      const float *saved, const float *params,
                                      const struct kernels_attention_dims *d, bool accumulate,
                                      GError **err) {
  struct kernels_attention_dims dd = cp_dims(s, d);
  struct kernels_attention_views w = kernels_attention_views(&dd, params, saved, bwork);
  const struct exec_kernels *k = s->k;
  KT(st, s, k->attention_out_backward_input(st->stream, bwork, da, params, &dd));
  KT(st, s, k->fill(st->stream, w.dq, 0.0f, w.T * w.HD));
  struct cp_blocks cb = blocks_of(s, &dd, &w);
  bool ok = s->dev->cp_ring ? ring_backward(s, st, mb, &cb, &w, err)
                            : gathered_backward(s, st, mb, &cb, &w, err);
  if (!ok)
    return false;
  KT(st, s, k->attention_qkv_backward_input(st->stream, dh, bwork, params, &dd, accumulate));
  return true;
}
