/* tp: tensor parallelism in the executor (Megatron-LM, Shoeybi et al. 2019), as the compiler
 * lays it out (directives/tensor_parallel.c).
 *
 * Each TP rank holds a slice of every divided op, cut from the same full initialisation the
 * one-device run uses (exec_tp_full_index maps a local element to its place in the full
 * block), so losses and the gathered parameters match one device:
 *   - attention: the columns of Q, K and V of its heads and KV heads (heads / tp of each, a
 *     contiguous run, so each local query head still reads its own KV head), and the rows of
 *     the output projection for those heads: the host kernel runs with heads / tp;
 *   - MLP: the gate and up columns and the down rows of F / tp: the kernel runs with F / tp;
 *   - embedding: the rows of a vocabulary slice; a token outside it gives zeros, and the sum
 *     over the group gives every token its row;
 *   - LM head: the columns (the rows, tied) of the same vocabulary slice, with the parallel
 *     cross-entropy: each rank's logits stay on it; the row max, the sum of exp and the target
 *     logit are summed (the max gathered) over the group;
 *   - experts (and the shared expert): each expert's gate and up columns and down rows, like
 *     the MLP (E blocks of its layout); the routed rows stay whole, the partial outputs are
 *     summed after the combine (local experts) or on the routed rows (EP, expert_parallel.c);
 *   - norms and the router: whole on every rank (under SP the router on the whole sequence).
 * The row-parallel outputs (and the embedding's) are partial sums, summed over the group right
 * after the op; the column-parallel ops' input gradients likewise before they reach the op
 * before. These collectives run inside the compute, on the compute's fiber, as Megatron's run
 * synchronously with compute; the plan's TP node after each compute (which stands for them)
 * has nothing left to do (exec_run_instr, EXEC_ROLE_TP). */
#include <math.h>
#include <string.h>

#include "train-impl.h"

bool exec_tp_divided(enum model_op_kind k) {
  switch (k) {
  case MODEL_OP_EMBEDDING:
  case MODEL_OP_ATTENTION:
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT:
  case MODEL_OP_EXPERT_FFN:
  case MODEL_OP_LM_HEAD_LOSS: return true;
  default: return false;
  }
}

uint64_t exec_tp_op_params(const struct exec_model *xm, const struct model_op *op, uint32_t tp) {
  (void)xm;
  if (tp <= 1 || !exec_tp_divided(op->kind))
    return op->param_count;
  return op->param_count / tp;
}

/* Element `local` of a [rows, cols / tp] column slice r, in the full [rows, cols]. */
static uint64_t column(uint64_t local, uint64_t cols, uint32_t tp, uint32_t r) {
  uint64_t w = cols / tp;
  return local / w * cols + (uint64_t)r * w + local % w;
}

/* Element `local` of slice r of a SwiGLU block: wg, wu [C, F] columns; wd [F, C] rows
 * (kernels/mlp.c, and each expert's block in kernels/moe.c). */
static uint64_t ffn_index(uint64_t local, uint64_t C, uint64_t F, uint32_t tp, uint32_t r) {
  uint64_t base = 0;
  for (int k = 0; k < 2; k++) {
    if (local < C * F / tp)
      return base + column(local, F, tp, r);
    local -= C * F / tp;
    base += C * F;
  }
  return base + (uint64_t)r * (F / tp) * C + local;
}

uint64_t exec_tp_full_index(const struct exec_model *xm, const struct model_op *op, uint32_t tp,
                            uint32_t r, uint64_t local) {
  if (tp <= 1)
    return local;
  uint64_t C = (uint64_t)xm->C, V = (uint64_t)xm->V;
  switch (op->kind) {
  case MODEL_OP_EMBEDDING: return (uint64_t)r * (V / tp) * C + local; /* [V, C] rows */
  case MODEL_OP_LM_HEAD_LOSS: return column(local, V, tp, r);         /* [C, V] columns */
  case MODEL_OP_ATTENTION: {
    /* wq [C, HD], wk, wv [C, KD] columns; wo [HD, C] rows (kernels/attention.c) */
    struct kernels_attention_dims d = exec_attention_dims(xm, op);
    uint64_t HD = (uint64_t)d.heads * (uint64_t)d.head_dim;
    uint64_t KD = (uint64_t)d.kv_heads * (uint64_t)d.head_dim;
    uint64_t base = 0;
    if (local < C * HD / tp)
      return column(local, HD, tp, r);
    local -= C * HD / tp;
    base += C * HD;
    for (int k = 0; k < 2; k++) {
      if (local < C * KD / tp)
        return base + column(local, KD, tp, r);
      local -= C * KD / tp;
      base += C * KD;
    }
    return base + (uint64_t)r * (HD / tp) * C + local;
  }
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: return ffn_index(local, C, (uint64_t)op->shape[2], tp, r);
  case MODEL_OP_EXPERT_FFN: {
    /* E blocks of [wg, wu, wd] (kernels/moe.c), each divided like the MLP */
    uint64_t F = (uint64_t)op->shape[2], per = 3 * C * F / tp;
    return local / per * 3 * C * F + ffn_index(local % per, C, F, tp, r);
  }
  default: return local;
  }
}

static bool fail_node(const struct exec_device *d, uint32_t node, GError **err, const char *what) {
  char nb[256];
  plan_node_name(d->plan, node, nb, sizeof nb);
  return piper_input_error(err, "plan: device %u: instruction \"%s\": %s", d->device, nb, what);
}

bool exec_tp_device_init(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  d->tp_degree = 1;
  d->tp_rank = 0;
  d->tp_comm = IR_NONE;
  bool first = true;
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    const struct ir_node *n = &p->nodes[i];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    if (n->route_split > 1 && n->tp_degree > 1)
      return fail_node(d, i, err,
                       "divides experts by an expert_tensor_parallel between 1 and the "
                       "dense tensor_parallel, which piper-sim simulates but piper-exec does "
                       "not run yet (expert_tensor_parallel 1 runs)");
    if (n->route_split > 1) /* whole experts, each TP rank routing its sequence shard */
      continue;
    uint32_t tp = n->tp_degree > 1 ? n->tp_degree : 1;
    if (first) {
      d->tp_degree = tp;
      d->sequence_parallel = tp > 1 && n->sequence_parallel;
      first = false;
    } else if (tp != d->tp_degree || (tp > 1 && n->sequence_parallel != d->sequence_parallel)) {
      return fail_node(d, i, err,
                       "is divided by tensor parallelism unlike other regions; the executor "
                       "needs one degree (and one sequence_parallel) for the whole model");
    }
  }
  if (d->tp_degree <= 1)
    return true;
  /* the LM head gathers 3 statistics a token a rank in the collectives' [T, C] buffer */
  if (3 * d->tp_degree > (uint32_t)d->xm->C)
    return piper_input_error(err,
                             "plan: device %u: tensor parallelism of degree %u needs a hidden "
                             "size of at least %u (the model's is %d)",
                             d->device, d->tp_degree, 3 * d->tp_degree, d->xm->C);
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    int pos = plan_node_position(p, c->instrs[i].node, d->device);
    if (pos < 0)
      return fail_node(d, c->instrs[i].node, err, "runs on a device outside its group");
    d->tp_rank = (uint32_t)pos % d->tp_degree;
    break;
  }
  return true;
}

/* The communicator the compute runs its TP collectives on: the plan's TP nodes' (one for the
 * device; its compute in one stream, so the collectives come in one order on every peer). */
bool exec_tp_link_comm(struct exec_device *d, GError **err) {
  if (d->tp_degree <= 1)
    return true;
  const struct plan *p = d->plan;
  uint32_t stream = IR_NONE;
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < d->n_instrs; i++) {
    struct exec_instr *x = &d->instrs[i];
    x->tp_compute = IR_NONE;
    if (x->role == EXEC_ROLE_TP && c->instrs[i].read_count) {
      /* the compute that wrote what it reads: its own collectives (SP's all-gather reads the
       * reduce-scatter's, and stands for nothing more) */
      uint32_t prod = c->tensors[c->reads[c->instrs[i].read_first]].producer;
      if (d->instrs[prod].role == EXEC_ROLE_COMPUTE)
        x->tp_compute = prod;
    }
    if (x->role == EXEC_ROLE_TP) {
      if (d->tp_comm != IR_NONE && d->comm_keys[d->tp_comm].comm != d->comm_keys[x->comm].comm)
        return fail_node(d, x->node, err,
                         "runs TP collectives on a second TP group; a device belongs to one");
      if (d->tp_comm == IR_NONE)
        d->tp_comm = x->comm;
    }
    if (x->role == EXEC_ROLE_COMPUTE) {
      if (stream != IR_NONE && x->stream != stream)
        return fail_node(d, x->node, err,
                         "computes on a second stream; under tensor parallelism the host "
                         "executor needs one compute stream per device");
      stream = x->stream;
    }
  }
  if (d->tp_comm == IR_NONE || p->comms[d->comm_keys[d->tp_comm].comm].purpose != IR_COMM_TP)
    return piper_input_error(err, "plan: device %u: tensor parallelism without a TP communicator",
                             d->device);
  return true;
}

void exec_tp_retime(const struct exec_state *s, double *start, double *end, double *comm) {
  if (!s->tp_seconds)
    return;
  for (uint32_t i = 0; i < s->dev->n_instrs; i++) {
    uint32_t c = s->dev->instrs[i].tp_compute;
    if (s->dev->instrs[i].role != EXEC_ROLE_TP || c == IR_NONE)
      continue;
    double t = s->tp_seconds[c], e = end[c];
    end[c] = e - t;
    comm[c] -= t;
    start[i] = e - t;
    end[i] = e;
    comm[i] = t;
  }
}

void exec_tp_op_offsets(struct exec_device *d) {
  const struct exec_model *xm = d->xm;
  const struct model *m = xm->m;
  for (uint32_t seg = 0; seg < m->n_segments; seg++) {
    const struct exec_segment *es = &xm->segs[seg];
    uint64_t off = 0;
    for (uint32_t j = 0; j < es->n_ops; j++) {
      const struct exec_seg_op *so = &es->ops[j];
      /* experts split over EP: each op's local experts, at the same fraction of the block */
      d->op_offset[so->op] = d->ep_size[seg] > 1 ? so->param_offset / d->ep_size[seg] : off;
      off += exec_tp_op_params(xm, &m->ops[so->op], exec_segment_tp(d, seg));
    }
  }
}

void exec_tp_model_shape(struct exec_model *xm, const struct exec_device *d) {
  xm->T_seq = d->sequence_parallel ? xm->T / (int)d->tp_degree : xm->T;
}

bool exec_tp_reduce_scatter(struct exec_state *s, struct exec_task_ctx *st, const float *in,
                            float *out, size_t n, GError **err) {
  double t0 = exec_backend_clock(s->b);
  bool ok = exec_comm_reduce_scatter_f32(s->b, s->comms[s->dev->tp_comm], in, out, n, err);
  st->comm_s += exec_backend_clock(s->b) - t0;
  return ok;
}

bool exec_tp_all_reduce(struct exec_state *s, struct exec_task_ctx *st, float *buf, size_t n,
                        GError **err) {
  double t0 = exec_backend_clock(s->b);
  bool ok = exec_comm_all_reduce_f32(s->b, s->comms[s->dev->tp_comm], buf, n, err);
  st->comm_s += exec_backend_clock(s->b) - t0;
  return ok;
}

/* This rank's vocabulary slice [lo, lo + n). */
static void vocab_slice(const struct exec_state *s, int *lo, int *n) {
  *n = s->xm->V / (int)s->dev->tp_degree;
  *lo = (int)s->dev->tp_rank * *n;
}

void exec_tp_embedding_forward(const struct exec_state *s, struct exec_stream *stream, float *x,
                               const int32_t *tokens, const float *table) {
  int lo, n;
  vocab_slice(s, &lo, &n);
  s->k->tp_embedding_forward(stream, x, tokens, table, s->xm->T, s->xm->C, lo, n);
}

void exec_tp_embedding_backward(const struct exec_state *s, struct exec_stream *stream,
                                float *dtable, const float *dx, const int32_t *tokens) {
  int lo, n;
  vocab_slice(s, &lo, &n);
  s->k->tp_embedding_backward(stream, dtable, dx, tokens, s->xm->T, s->xm->C, lo, n);
}

bool exec_tp_all_gather(struct exec_state *s, struct exec_task_ctx *st, const float *in, float *out,
                        size_t n, GError **err) {
  double t0 = exec_backend_clock(s->b);
  bool ok = exec_comm_all_gather(s->b, s->comms[s->dev->tp_comm], in, out, n * sizeof(float), err);
  st->comm_s += exec_backend_clock(s->b) - t0;
  return ok;
}

static enum kernels_lm_head_layout head_layout(bool tied) {
  return tied ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
}

bool exec_tp_head_forward(struct exec_state *s, struct exec_task_ctx *st, float *gathered,
                          float *loss, float *saved, const float *h, const int32_t *targets,
                          const float *w, bool tied, GError **err) {
  int lo, n, T = s->xm->T, C = s->xm->C, tp = (int)s->dev->tp_degree;
  vocab_slice(s, &lo, &n);
  /* this rank's statistics in its place of the gathered [tp][3, T] (all-gather in place) */
  float *mine = gathered + (size_t)s->dev->tp_rank * 3 * (size_t)T;
  double t0 = exec_backend_clock(s->b);
  s->k->tp_head_stats(st->stream, mine, h, targets, w, head_layout(tied), T, C, lo, n);
  st->kernel_s += exec_backend_clock(s->b) - t0;
  if (!exec_tp_all_gather(s, st, mine, gathered, 3 * (size_t)T, err))
    return false;
  t0 = exec_backend_clock(s->b);
  s->k->tp_head_combine(st->stream, loss, saved, gathered, tp, T);
  st->kernel_s += exec_backend_clock(s->b) - t0;
  return true;
}

void exec_tp_head_backward(const struct exec_state *s, struct exec_stream *stream, float *dh,
                           float *dw, const float *saved, const float *h, const int32_t *targets,
                           const float *w, bool tied, float dloss) {
  int lo, n;
  vocab_slice(s, &lo, &n);
  s->k->tp_head_backward(stream, dh, dw, saved, h, targets, w, head_layout(tied), dloss, s->xm->T,
                         s->xm->C, lo, n);
}

/* ---- the buffers of a compute's TP collectives ----------------------------------------------- */

float *exec_tp_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                      uint32_t i, float **buf) {
  if (*buf)
    return *buf;
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  uint32_t owner = OWN_WORK;
  for (uint32_t w = 0; w < in->write_count; w++) {
    uint32_t tid = c->writes[in->write_first + w];
    if (c->tensors[tid].kind == PLAN_TENSOR_OUT && exec_is_tp_buffer(s, &c->tensors[tid]))
      owner = tid;
  }
  *buf = mb_floats_raw(s, st, mb, owner, (size_t)s->xm->T * (size_t)s->xm->C);
  return *buf;
}

const float *exec_tp_gathered(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                              float **slot, const float *src, GError **err) {
  size_t n = (size_t)s->xm->T_seq * (size_t)s->xm->C;
  if (!*slot)
    *slot = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)s->xm->T * (size_t)s->xm->C);
  return exec_tp_all_gather(s, st, src, *slot, n, err) ? *slot : NULL;
}

bool exec_tp_sum_into(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                      float *dst, bool acc, GError **err) {
  struct exec_tp_bufs *tb = &st->tp;
  size_t n = (size_t)s->xm->T_seq * (size_t)s->xm->C;
  float *buf = tb->sum, *sum = buf;
  if (s->dev->sequence_parallel) {
    if (acc && !tb->shard)
      tb->shard = mb_floats_raw(s, st, mb, OWN_WORK, n);
    sum = acc ? tb->shard : dst;
    if (!exec_tp_reduce_scatter(s, st, buf, sum, n, err))
      return false;
  } else if (!exec_tp_all_reduce(s, st, buf, n, err)) {
    return false;
  }
  if (acc)
    KT(st, s, s->k->add(st->stream, dst, sum, n));
  else if (sum != dst)
    KT(st, s, s->k->copy(st->stream, dst, sum, n * sizeof(float)));
  return true;
}
