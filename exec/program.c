/* program: what the plan means for training on one device, derived from the plan alone (so
 * plans read from disk run as well as plans compiled in-process).
 *
 * Model level: each op reads and writes decoder state tensors (the rule of models/build.c);
 * a model edge carries the tensors its destination reads whose last writer is its source.
 * Device level: a send/recv carries one model edge (values in F, their gradients in backward),
 * found from the segment of the sending node and the segment that consumes the receive; an
 * all-to-all is a dispatch or a combine depending on whether the expert computes its input. */
#include <string.h>

#include "../base/json.h"
#include "exec-impl.h"

const char *exec_tensor_name(enum exec_tensor t) {
  static const char *const names[EXEC_T_COUNT] = {"x", "h", "a", "m", "s", "r"};
  return (unsigned)t < EXEC_T_COUNT ? names[t] : "?";
}

size_t exec_tensor_words(const struct exec_model *xm, enum exec_tensor t) {
  if (t == EXEC_T_R)
    return 2 * (size_t)xm->T * (size_t)xm->K;
  return (size_t)xm->T_seq * (size_t)xm->C;
}

size_t exec_grad_floats(const struct exec_model *xm, enum exec_tensor t) {
  /* r's gradient travels in r's layout (2 words per route, as the plan counts its bytes):
   * the weights' gradients in the first half, the ids' half unused */
  if (t == EXEC_T_R)
    return 2 * (size_t)xm->T * (size_t)xm->K;
  return (size_t)xm->T_seq * (size_t)xm->C;
}

uint32_t exec_model_edge(const struct exec_model *xm, uint32_t src, uint32_t dst) {
  for (uint32_t e = 0; e < xm->m->n_edges; e++)
    if (xm->m->edges[e].src == src && xm->m->edges[e].dst == dst)
      return e;
  return IR_NONE;
}

static bool layer_has_shared_expert(const struct model *m, int32_t layer) {
  for (uint32_t o = 0; o < m->n_ops; o++)
    if (m->ops[o].layer == layer && m->ops[o].kind == MODEL_OP_SHARED_EXPERT)
      return true;
  return false;
}

/* Reads and writes of op o (models/build.c's table). */
static void op_io(const struct model *m, uint32_t o, unsigned *reads, unsigned *writes) {
  const struct model_op *op = &m->ops[o];
  *reads = *writes = 0;
  switch (op->kind) {
  case MODEL_OP_EMBEDDING: *writes = EXEC_BIT(EXEC_T_X); break;
  case MODEL_OP_RMSNORM:
    *reads = EXEC_BIT(EXEC_T_X);
    *writes = EXEC_BIT(EXEC_T_H);
    break;
  case MODEL_OP_ATTENTION:
  case MODEL_OP_MLA_ATTENTION:
    *reads = EXEC_BIT(EXEC_T_H);
    *writes = EXEC_BIT(EXEC_T_A);
    break;
  case MODEL_OP_RESIDUAL_ADD: {
    enum model_op_kind prev = o > 0 ? m->ops[o - 1].kind : MODEL_OP_EMBEDDING;
    if (prev == MODEL_OP_ATTENTION || prev == MODEL_OP_MLA_ATTENTION) {
      *reads = EXEC_BIT(EXEC_T_X) | EXEC_BIT(EXEC_T_A);
    } else {
      *reads = EXEC_BIT(EXEC_T_X) | EXEC_BIT(EXEC_T_M);
      if (prev == MODEL_OP_EXPERT_FFN && layer_has_shared_expert(m, op->layer))
        *reads |= EXEC_BIT(EXEC_T_S);
    }
    *writes = EXEC_BIT(EXEC_T_X);
    break;
  }
  case MODEL_OP_MLP:
    *reads = EXEC_BIT(EXEC_T_H);
    *writes = EXEC_BIT(EXEC_T_M);
    break;
  case MODEL_OP_SHARED_EXPERT:
    *reads = EXEC_BIT(EXEC_T_H);
    *writes = EXEC_BIT(EXEC_T_S);
    break;
  case MODEL_OP_ROUTER:
    *reads = EXEC_BIT(EXEC_T_H);
    *writes = EXEC_BIT(EXEC_T_R);
    break;
  case MODEL_OP_EXPERT_FFN:
    *reads = EXEC_BIT(EXEC_T_H) | EXEC_BIT(EXEC_T_R);
    *writes = EXEC_BIT(EXEC_T_M);
    break;
  case MODEL_OP_LM_HEAD_LOSS: *reads = EXEC_BIT(EXEC_T_H); break;
  default: break;
  }
}

/* Parameter count the host kernels expect for op o (what models/ must report too). */
static uint64_t kernel_param_count(const struct exec_model *xm, const struct model_op *op) {
  switch (op->kind) {
  case MODEL_OP_EMBEDDING: return kernels_embedding_param_count(xm->V, xm->C);
  case MODEL_OP_RMSNORM: return kernels_rmsnorm_param_count(xm->C);
  case MODEL_OP_ATTENTION: {
    struct kernels_attention_dims d = exec_attention_dims(xm, op);
    return kernels_attention_param_count(&d);
  }
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: return kernels_mlp_param_count(xm->C, (int)op->shape[2]);
  case MODEL_OP_ROUTER: return kernels_router_param_count(xm->C, xm->E);
  case MODEL_OP_EXPERT_FFN: return kernels_expert_ffn_param_count(xm->E, xm->C, xm->F_expert);
  case MODEL_OP_LM_HEAD_LOSS: return xm->tied ? 0 : kernels_lm_head_loss_param_count(xm->C, xm->V);
  default: return 0;
  }
}

void exec_model_clear(struct exec_model *xm) {
  if (!xm)
    return;
  if (xm->segs && xm->m)
    for (uint32_t s = 0; s < xm->m->n_segments; s++) {
      g_free(xm->segs[s].values);
      g_free(xm->segs[s].ops);
      g_free(xm->segs[s].out_edges);
      g_free(xm->segs[s].in_edges);
    }
  g_free(xm->segs);
  g_free(xm->edge_mask);
  memset(xm, 0, sizeof *xm);
}

/* The model's shape as the host kernels see it; input error for what they cannot train. */
static bool model_dims(struct exec_model *xm, const struct model *m, GError **err) {
  if (m->family == MODEL_FAMILY_DEEPSEEK_V3)
    return piper_input_error(err,
                             "%s: model_type %s uses MLA attention, which has no host kernel (the "
                             "host backend trains dense and MoE decoders)",
                             m->name, m->model_type);
  if (m->shared_expert_gate)
    return piper_input_error(err,
                             "%s: model_type %s gates its shared expert (shared_expert_gate), "
                             "which has no host kernel",
                             m->name, m->model_type);
  int64_t T = m->micro_batch_size * m->seq_len;
  if (T > (1 << 20) || m->hidden_size > (1 << 16) || m->vocab_size > (1 << 20))
    return piper_input_error(err,
                             "%s: too large for the host backend (tokens per micro-batch %lld, "
                             "hidden_size %lld, vocab_size %lld)",
                             m->name, (long long)T, (long long)m->hidden_size,
                             (long long)m->vocab_size);
  xm->T = xm->T_seq = (int)T;
  xm->batch = (int)m->micro_batch_size;
  xm->seq = (int)m->seq_len;
  xm->C = (int)m->hidden_size;
  xm->V = (int)m->vocab_size;
  xm->K = (int)(m->experts_per_tok > 0 ? m->experts_per_tok : 1);
  xm->E = (int)(m->num_experts > 0 ? m->num_experts : 1);
  xm->F_expert = (int)m->moe_intermediate_size;
  return true;
}

/* The embedding and the LM head, and whether the head reads the embedding's table (then
 * both must be in one segment). */
static bool find_ends(struct exec_model *xm, GError **err) {
  const struct model *m = xm->m;
  xm->embedding_op = xm->head_op = IR_NONE;
  for (uint32_t o = 0; o < m->n_ops; o++) {
    if (m->ops[o].kind == MODEL_OP_EMBEDDING)
      xm->embedding_op = o;
    if (m->ops[o].kind == MODEL_OP_LM_HEAD_LOSS)
      xm->head_op = o;
  }
  if (xm->embedding_op == IR_NONE || xm->head_op == IR_NONE)
    return piper_input_error(err, "%s: the model has no embedding or no LM head", m->name);
  xm->tied = m->ops[xm->head_op].param_count == 0;
  xm->tied_copy = m->tie_word_embeddings && !xm->tied;
  uint32_t head_seg = IR_NONE, embedding_seg = IR_NONE;
  for (uint32_t s = 0; s < m->n_segments; s++) {
    const struct model_segment *ms = &m->segments[s];
    if (xm->head_op - ms->op_first < ms->op_count)
      head_seg = s;
    if (xm->embedding_op - ms->op_first < ms->op_count)
      embedding_seg = s;
  }
  xm->embedding_seg = embedding_seg;
  xm->head_seg = head_seg;
  if (xm->tied && head_seg != embedding_seg)
    return piper_input_error(err,
                             "%s: tied embeddings need the embedding and the LM head in one "
                             "segment (one PP region without expert layers)",
                             m->name);
  return true;
}

/* Replaying the model's writers (models/build.c's build_edges) while walking the segments:
 * the segment that last wrote each tensor, and the values of the segment being built. */
struct seg_builder {
  struct exec_model *xm;
  uint32_t seg;
  uint32_t writer[EXEC_T_COUNT];
  int32_t cur[EXEC_T_COUNT]; /* current value of each tensor in the segment, -1 */
  GArray *vals;              /* struct exec_value */
};

/* The value of tensor t for op o: the segment's current one, or a new input value carried by
 * the edge from the tensor's last writer. */
static int32_t input_value(struct seg_builder *sb, uint32_t o, enum exec_tensor t, GError **err) {
  const struct model *m = sb->xm->m;
  if (sb->cur[t] >= 0)
    return sb->cur[t];
  if (sb->writer[t] == IR_NONE) {
    piper_input_error(err, "%s: op %u (%s) reads %s before anything writes it", m->name, o,
                      model_op_kind_name(m->ops[o].kind), exec_tensor_name(t));
    return -1;
  }
  uint32_t e = IR_NONE;
  for (uint32_t k = 0; k < m->n_edges; k++)
    if (m->edges[k].src == sb->writer[t] && m->edges[k].dst == sb->seg)
      e = k;
  if (e == IR_NONE) {
    piper_input_error(err, "%s: segment %u reads %s from segment %u but the model has no such edge",
                      m->name, sb->seg, exec_tensor_name(t), sb->writer[t]);
    return -1;
  }
  sb->xm->edge_mask[e] |= (uint8_t)EXEC_BIT(t);
  struct exec_value v = {.tensor = (uint8_t)t, .op = -1, .edge = e};
  g_array_append_val(sb->vals, v);
  sb->cur[t] = (int32_t)sb->vals->len - 1;
  return sb->cur[t];
}

/* Op j of the segment: its parameters' place, its input values (in role order: x first, then
 * a|h, m, s, r; train.c relies on it) and the values it writes. */
static bool build_op(struct seg_builder *sb, struct exec_segment *es, uint32_t j, uint64_t *poff,
                     GError **err) {
  const struct model *m = sb->xm->m;
  uint32_t o = m->segments[sb->seg].op_first + j;
  const struct model_op *op = &m->ops[o];
  unsigned rd, wr;
  op_io(m, o, &rd, &wr);
  struct exec_seg_op *so = &es->ops[j];
  so->op = o;
  so->kind = op->kind;
  so->in[0] = so->in[1] = so->in[2] = so->out = -1;
  so->param_offset = *poff;
  so->param_count = op->param_count;
  uint64_t want = kernel_param_count(sb->xm, op);
  if (op->param_count != want)
    return piper_input_error(err,
                             "%s: op %u (%s) has %llu parameters but the host kernel takes %llu",
                             m->name, o, model_op_kind_name(op->kind),
                             (unsigned long long)op->param_count, (unsigned long long)want);
  *poff += op->param_count;
  static const enum exec_tensor order[] = {EXEC_T_X, EXEC_T_H, EXEC_T_A,
                                           EXEC_T_M, EXEC_T_R, EXEC_T_S};
  int slot = 0;
  for (size_t q = 0; q < G_N_ELEMENTS(order); q++) {
    if (!(rd & EXEC_BIT(order[q])))
      continue;
    int32_t v = input_value(sb, o, order[q], err);
    if (v < 0)
      return false;
    so->in[slot++] = v;
  }
  for (int t = 0; t < EXEC_T_COUNT; t++) {
    if (!(wr & EXEC_BIT(t)))
      continue;
    struct exec_value v = {.tensor = (uint8_t)t, .op = (int32_t)j, .edge = IR_NONE};
    g_array_append_val(sb->vals, v);
    sb->cur[t] = (int32_t)sb->vals->len - 1;
    es->final_value[t] = sb->cur[t];
  }
  if (wr)
    so->out = sb->cur[__builtin_ctz(wr)];
  return true;
}

/* Segment s's ops and values (SSA, see exec-impl.h). */
static bool build_segment(struct seg_builder *sb, uint32_t s, GError **err) {
  const struct model_segment *ms = &sb->xm->m->segments[s];
  struct exec_segment *es = &sb->xm->segs[s];
  es->expert = ms->expert;
  es->ops = g_new0(struct exec_seg_op, ms->op_count ? ms->op_count : 1);
  es->n_ops = ms->op_count;
  sb->seg = s;
  sb->vals = g_array_new(FALSE, TRUE, sizeof(struct exec_value));
  for (int t = 0; t < EXEC_T_COUNT; t++)
    sb->cur[t] = es->final_value[t] = -1;
  uint64_t poff = 0;
  bool ok = true;
  for (uint32_t j = 0; j < ms->op_count && ok; j++)
    ok = build_op(sb, es, j, &poff, err);
  for (int t = 0; t < EXEC_T_COUNT; t++)
    if (es->final_value[t] >= 0)
      sb->writer[t] = s;
  es->param_count = poff;
  es->n_values = sb->vals->len;
  es->values = (struct exec_value *)g_array_free(sb->vals, FALSE);
  return ok;
}

/* Every model edge must carry what the executor derived, byte for byte. */
static bool check_edge_bytes(const struct exec_model *xm, GError **err) {
  const struct model *m = xm->m;
  for (uint32_t e = 0; e < m->n_edges; e++) {
    uint64_t bytes = 0;
    for (int t = 0; t < EXEC_T_COUNT; t++)
      if (xm->edge_mask[e] & EXEC_BIT(t))
        bytes += t == EXEC_T_R ? (uint64_t)xm->T * (uint64_t)xm->K * 8
                               : (uint64_t)xm->T * (uint64_t)xm->C * model_dtype_bytes(m->dtype);
    if (bytes != m->edges[e].bytes)
      return piper_input_error(err,
                               "%s: edge %u (segment %u -> %u) carries %llu bytes in the model "
                               "but %llu by the executor's rule",
                               m->name, e, m->edges[e].src, m->edges[e].dst,
                               (unsigned long long)m->edges[e].bytes, (unsigned long long)bytes);
  }
  return true;
}

/* Each segment's in and out edge lists, ascending. */
static void list_segment_edges(struct exec_model *xm) {
  const struct model *m = xm->m;
  for (uint32_t s = 0; s < m->n_segments; s++) {
    GArray *in = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    GArray *outs = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t e = 0; e < m->n_edges; e++) {
      if (m->edges[e].dst == s)
        g_array_append_val(in, e);
      if (m->edges[e].src == s)
        g_array_append_val(outs, e);
    }
    xm->segs[s].n_in_edges = in->len;
    xm->segs[s].n_out_edges = outs->len;
    xm->segs[s].in_edges = (uint32_t *)g_array_free(in, FALSE);
    xm->segs[s].out_edges = (uint32_t *)g_array_free(outs, FALSE);
  }
}

static bool build_segments(struct exec_model *xm, GError **err) {
  const struct model *m = xm->m;
  xm->edge_mask = g_new0(uint8_t, m->n_edges ? m->n_edges : 1);
  xm->segs = g_new0(struct exec_segment, m->n_segments ? m->n_segments : 1);
  struct seg_builder sb = {.xm = xm};
  for (int t = 0; t < EXEC_T_COUNT; t++)
    sb.writer[t] = IR_NONE;
  for (uint32_t s = 0; s < m->n_segments; s++)
    if (!build_segment(&sb, s, err))
      return false;
  return true;
}

/* The model file's rope_theta, rms_norm_eps and rope_scaling, refused where the kernels do not
 * implement them (DeepSeek's "yarn"). */
static bool model_numerics(struct exec_model *xm, const struct model *m, GError **err) {
  xm->rope_theta = (float)m->rope_theta;
  xm->rms_norm_eps = (float)m->rms_norm_eps;
  const struct model_rope_scaling *sc = &m->rope_scaling;
  if (!kernels_rope_scaling_supported(sc->type))
    return piper_input_error(err,
                             "%s: \"rope_scaling\" of type \"%s\" has no host kernel (none, "
                             "\"default\" and \"llama3\" do)",
                             m->name, sc->type);
  if (strcmp(sc->type, "llama3") == 0) {
    xm->rope_scaling = (struct kernels_rope_scaling){
        .factor = (float)sc->factor,
        .low_freq_factor = (float)sc->low_freq_factor,
        .high_freq_factor = (float)sc->high_freq_factor,
        .original_max_position_embeddings = (int)sc->original_max_position_embeddings,
    };
    xm->scaling = &xm->rope_scaling;
  }
  return true;
}

struct kernels_attention_dims exec_attention_dims(const struct exec_model *xm,
                                                  const struct model_op *op) {
  return (struct kernels_attention_dims){
      .batch = (int)op->shape[0],
      .seq = (int)op->shape[1],
      .heads = (int)op->shape[2],
      .kv_heads = (int)op->shape[3],
      .head_dim = (int)op->shape[4],
      .hidden = (int)op->shape[5],
      .rope_theta = xm->rope_theta,
      .rope_scaling = xm->scaling,
  };
}

bool exec_model_init(struct exec_model *xm, const struct model *m, GError **err) {
  memset(xm, 0, sizeof *xm);
  xm->m = m;
  if (!model_dims(xm, m, err) || !model_numerics(xm, m, err) || !find_ends(xm, err))
    return false;
  if (!build_segments(xm, err) || !check_edge_bytes(xm, err)) {
    exec_model_clear(xm);
    return false;
  }
  list_segment_edges(xm);
  return true;
}

/* ---- device ------------------------------------------------------------------------------ */

static bool fail_instr(const struct plan *p, uint32_t device, uint32_t node, GError **err,
                       const char *what) {
  char nb[256];
  plan_node_name(p, node, nb, sizeof nb);
  return piper_input_error(err, "plan: device %u: instruction \"%s\": %s", device, nb, what);
}

/* First consumer instruction of what instruction i writes, or IR_NONE. */
static uint32_t first_consumer(const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++) {
    const struct plan_tensor *t = &c->tensors[c->writes[in->write_first + w]];
    if (t->consumer_count)
      return c->consumers[t->consumer_first];
  }
  return IR_NONE;
}

static int compare_key(const void *a, const void *b) {
  const struct exec_comm_key *x = a, *y = b;
  if (x->comm != y->comm)
    return x->comm < y->comm ? -1 : 1;
  if (x->stream_a != y->stream_a)
    return x->stream_a < y->stream_a ? -1 : 1;
  return x->stream_b < y->stream_b ? -1 : x->stream_b > y->stream_b;
}

static struct exec_comm_key key_of(const struct plan *p, const struct plan_instr *in) {
  const struct ir_node *n = &p->nodes[in->node];
  struct exec_comm_key k = {in->comm, n->stream, IR_NONE};
  if (n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV) {
    uint32_t other = n->pair < p->n_nodes ? p->nodes[n->pair].stream : IR_NONE;
    k.stream_a = n->kind == IR_NODE_SEND ? n->stream : other;
    k.stream_b = n->kind == IR_NODE_SEND ? other : n->stream;
  }
  return k;
}

void exec_device_clear(struct exec_device *d) {
  if (!d)
    return;
  g_free(d->instrs);
  g_free(d->holds);
  g_free(d->param_offset);
  g_free(d->param_local);
  g_free(d->bucket_of);
  g_free(d->ep_size);
  g_free(d->ep_rank);
  for (uint32_t b = 0; b < d->n_buckets; b++)
    g_free(d->buckets[b].segs);
  g_free(d->buckets);
  g_free(d->mb_instr_count);
  g_free(d->comm_keys);
  g_free(d->op_offset);
  memset(d, 0, sizeof *d);
}

/* Which class this device runs, its micro-batches and the one tag that numbers them. */
static bool device_shape(struct exec_device *d, uint32_t device, GError **err) {
  const struct plan *p = d->plan;
  if (device >= p->n_devices)
    return piper_input_error(err,
                             "plan: the plan has %u devices but this process is rank %u (launch "
                             "as many processes as devices)",
                             p->n_devices, device);
  d->class_id = p->device_class[device];
  d->cls = plan_device_class(p, device);
  d->M = p->n_microbatches ? p->n_microbatches : 1;
  d->mb_tag = -1;
  for (uint32_t t = d->xm->m->n_tags; t < p->n_tags; t++) {
    if (d->mb_tag >= 0)
      return piper_input_error(err,
                               "plan: the program splits micro-batches along two dimensions (%s "
                               "and %s); the executor needs one",
                               p->tag_names[d->mb_tag], p->tag_names[t]);
    d->mb_tag = (int)t;
  }
  return true;
}

/* DP degree (every compute node of the plan has the same number of replicas) and this
 * device's position in its data-parallel groups (the same in all of them). */
static bool data_parallel_place(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  d->dp_degree = 0;
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    const struct ir_node *n = &p->nodes[i];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    if (d->dp_degree == 0)
      d->dp_degree = n->replica_degree;
    if (n->replica_degree != d->dp_degree)
      return fail_instr(p, d->device, i, err,
                        "regions are replicated over different numbers of devices; the "
                        "executor needs one data-parallel degree for the whole model");
  }
  if (d->dp_degree == 0)
    d->dp_degree = 1;
  d->dp_rank = 0;
  bool dp_set = false;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_COMPUTE || d->dp_degree == 1)
      continue;
    /* TP innermost in the group: the data-parallel rank is the position over the degree */
    int pos = plan_node_position(p, c->instrs[i].node, d->device) / (int)d->tp_degree;
    if (dp_set && (uint32_t)pos != d->dp_rank)
      return fail_instr(p, d->device, c->instrs[i].node, err,
                        "this device has different positions in its data-parallel groups");
    d->dp_rank = (uint32_t)pos;
    dp_set = true;
  }
  return true;
}

static void device_alloc(struct exec_device *d) {
  uint32_t ns = d->xm->m->n_segments, n = d->cls->n_instrs;
  d->n_instrs = n;
  d->instrs = g_new0(struct exec_instr, n ? n : 1);
  d->holds = g_new0(bool, ns ? ns : 1);
  d->param_offset = g_new0(uint64_t, ns ? ns : 1);
  d->param_local = g_new0(uint64_t, ns ? ns : 1);
  d->bucket_of = g_new(uint32_t, ns ? ns : 1);
  d->ep_size = g_new(uint32_t, ns ? ns : 1);
  d->ep_rank = g_new0(uint32_t, ns ? ns : 1);
  for (uint32_t s = 0; s < ns; s++) {
    d->bucket_of[s] = IR_NONE;
    d->ep_size[s] = 1;
  }
  d->mb_instr_count = g_new0(uint32_t, d->M);
  d->op_offset = g_new0(uint64_t, d->xm->m->n_ops ? d->xm->m->n_ops : 1);
}

/* What decoding the instructions collects on the way. */
struct decoder {
  struct exec_device *d;
  GArray *buckets;          /* struct exec_bucket */
  GHashTable **class_index; /* [n_classes]: node + 1 -> instruction + 1, built on demand */
};

static bool fail_at(const struct decoder *dc, uint32_t i, GError **err, const char *what) {
  return fail_instr(dc->d->plan, dc->d->device, dc->d->cls->instrs[i].node, err, what);
}

static bool decode_compute(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct ir_node *n = &p->nodes[d->cls->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  x->role = EXEC_ROLE_COMPUTE;
  if (n->segment >= d->xm->m->n_segments || n->pass == IR_PASS_NONE)
    return fail_at(dc, i, err, "is a compute node without a segment and pass");
  x->segment = n->segment;
  d->holds[n->segment] = true;
  if (!d->xm->m->segments[n->segment].expert)
    return true;
  /* R of experts reruns them on the rows its F kept, routed as F routed them (train.c,
   * expert_forward): a micro-batch's routing is computed once, and no all-to-all reruns */
  if (n->shard_degree <= 1)
    return true;
  if (d->xm->E % (int)n->shard_degree != 0)
    return fail_at(dc, i, err, "shards experts unevenly");
  if (n->replica_degree != 1 && n->replica_degree != n->shard_degree)
    /* experts are never gradient-synced: replicas in other EP groups would drift */
    return fail_at(dc, i, err,
                   "replicates sharded experts over a different group than it shards them");
  d->ep_size[n->segment] = n->shard_degree;
  /* TP innermost: the EP rank is the position's data-parallel rank (tensor_parallel.c) */
  d->ep_rank[n->segment] =
      (uint32_t)plan_node_position(p, x->node, d->device) / (n->tp_degree > 1 ? n->tp_degree : 1);
  return true;
}

/* The instruction of the peer's class that runs node `node`, or IR_NONE. */
static uint32_t peer_instr(struct decoder *dc, uint32_t peer_class, uint32_t node) {
  const struct plan_class *rc = &dc->d->plan->classes[peer_class];
  if (!dc->class_index[peer_class]) {
    dc->class_index[peer_class] = g_hash_table_new(NULL, NULL);
    for (uint32_t k = 0; k < rc->n_instrs; k++)
      g_hash_table_insert(dc->class_index[peer_class], GUINT_TO_POINTER(rc->instrs[k].node + 1),
                          GUINT_TO_POINTER(k + 1));
  }
  uint32_t ri = GPOINTER_TO_UINT(
      g_hash_table_lookup(dc->class_index[peer_class], GUINT_TO_POINTER(node + 1)));
  return ri ? ri - 1 : IR_NONE;
}

/* A send or receive: its peer and the model edge it carries (named by the receiving side's
 * consumer). */
static bool decode_transfer(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct ir_node *n = &p->nodes[d->cls->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  x->role = n->kind == IR_NODE_SEND ? EXEC_ROLE_SEND : EXEC_ROLE_RECV;
  x->peer = plan_peer(p, x->node, d->device);
  if (x->peer == IR_NONE || x->peer >= p->n_devices || n->pair >= p->n_nodes)
    return fail_at(dc, i, err, "has no peer device");
  const struct plan_class *rc = d->cls;
  uint32_t ri = i;
  if (n->kind == IR_NODE_SEND) {
    rc = &p->classes[p->device_class[x->peer]];
    ri = peer_instr(dc, p->device_class[x->peer], n->pair);
    if (ri == IR_NONE)
      return fail_at(dc, i, err, "its receive is not in the peer's plan");
  }
  uint32_t ci = first_consumer(rc, ri);
  const struct ir_node *cn = ci == IR_NONE ? NULL : &p->nodes[rc->instrs[ci].node];
  if (!cn || cn->kind != IR_NODE_COMPUTE)
    return fail_at(dc, i, err,
                   "the data it carries is not consumed by a compute node (expert parallelism "
                   "needs the expert region on the devices of its neighbours)");
  bool fwd = n->pass == IR_PASS_F;
  if (fwd != (cn->pass == IR_PASS_F) || cn->pass == IR_PASS_BW)
    return fail_at(dc, i, err,
                   "carries activations saved for backward between devices; place the forward "
                   "and backward of a region on the same devices");
  uint32_t a = n->segment, bseg = cn->segment;
  x->segment = a;
  x->edge = exec_model_edge(d->xm, a < bseg ? a : bseg, a < bseg ? bseg : a);
  if (x->edge == IR_NONE)
    return fail_at(dc, i, err, "joins segments that no model edge joins");
  return true;
}

/* The producer of the first tensor instruction i reads that a compute instruction wrote, and
 * the first consumer of i's first "out" tensor: an all-to-all also reads and writes the
 * routing tables and the combine's copy (ir/expert.c), between all-to-alls. IR_NONE if none. */
static uint32_t a2a_producer(const struct plan *p, const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t r = 0; r < in->read_count; r++) {
    uint32_t pr = c->tensors[c->reads[in->read_first + r]].producer;
    if (p->nodes[c->instrs[pr].node].kind == IR_NODE_COMPUTE)
      return pr;
  }
  return IR_NONE;
}

static uint32_t a2a_consumer(const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++) {
    const struct plan_tensor *t = &c->tensors[c->writes[in->write_first + w]];
    if (t->kind == PLAN_TENSOR_OUT && t->consumer_count)
      return c->consumers[t->consumer_first];
  }
  return IR_NONE;
}

/* Whether all-to-all i reads what a compute of segment e wrote: a combine (or the dispatch's
 * transpose). A combine under full recomputation also reads the router's output (its routing
 * weights), so the producer it reads first need not be the experts. */
static bool a2a_reads_segment(const struct plan *p, const struct plan_class *c, uint32_t i,
                              uint32_t e) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t r = 0; r < in->read_count; r++) {
    uint32_t pr = c->tensors[c->reads[in->read_first + r]].producer;
    const struct ir_node *pn = &p->nodes[c->instrs[pr].node];
    if (pn->kind == IR_NODE_COMPUTE && pn->segment == e)
      return true;
  }
  return false;
}

/* The segment expert segment e's output goes to (its combine's other side). */
static uint32_t a2a_next_segment(const struct model *m, uint32_t e) {
  for (uint32_t k = 0; k < m->n_edges; k++)
    if (m->edges[k].src == e)
      return m->edges[k].dst;
  return IR_NONE;
}

/* An all-to-all: dispatch or combine, by which side of it the expert segment is. */
static bool decode_all_to_all(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  const struct ir_node *n = &p->nodes[c->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  uint32_t e = n->segment;
  uint32_t pr = a2a_producer(p, c, i), co = a2a_consumer(c, i);
  const struct ir_node *pn = pr == IR_NONE ? NULL : &p->nodes[c->instrs[pr].node];
  const struct ir_node *cn = co == IR_NONE ? NULL : &p->nodes[c->instrs[co].node];
  if (n->pass == IR_PASS_R && !cn && pn && pn->segment == e)
    cn = pn; /* the rerun's combine (directives/apply.c, insert_expert_reruns) */
  if (!pn || !cn || pn->kind != IR_NODE_COMPUTE || cn->kind != IR_NODE_COMPUTE)
    return fail_at(dc, i, err,
                   "expert parallelism needs the expert region and its neighbours on the same "
                   "devices");
  bool from = a2a_reads_segment(p, c, i, e);
  x->role = from ? EXEC_ROLE_A2A_FROM_EXPERT : EXEC_ROLE_A2A_TO_EXPERT;
  uint32_t other = from ? cn->segment : pn->segment;
  if (from && cn->segment == e) /* a rerun's combine: read by the transpose alone */
    other = a2a_next_segment(d->xm->m, e);
  x->segment = e;
  x->edge = exec_model_edge(d->xm, e < other ? e : other, e < other ? other : e);
  if (e >= d->xm->m->n_segments || !d->xm->m->segments[e].expert || x->edge == IR_NONE)
    return fail_at(dc, i, err, "is an all-to-all that serves no expert region edge");
  return true;
}

/* How many instances the instruction's communicator splits its group into (1: none). */
static uint32_t pi_split(const struct plan *p, const struct plan_instr *pi) {
  if (pi->comm == IR_NONE || pi->comm >= p->n_comms)
    return 1;
  return p->comms[pi->comm].split > 1 ? p->comms[pi->comm].split : 1;
}

/* An all-reduce or reduce-scatter: a gradient bucket. */
static bool decode_bucket(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct ir_node *n = &p->nodes[d->cls->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  x->role = n->kind == IR_NODE_ALL_REDUCE ? EXEC_ROLE_ALL_REDUCE : EXEC_ROLE_REDUCE_SCATTER;
  if (n->segset >= p->n_segsets)
    return fail_at(dc, i, err, "has no segment set");
  const struct ir_segset *ss = &p->segsets[n->segset];
  /* under TP the group's instance is the devices with this one's TP rank (plan_comm.split) */
  uint32_t split = pi_split(p, &d->cls->instrs[i]);
  struct exec_bucket bk = {.node = x->node,
                           .n_segs = ss->count,
                           .segs = g_memdup2(&p->segment_pool[ss->first],
                                             (ss->count ? ss->count : 1) * sizeof(uint32_t)),
                           .group_size = p->groups[n->group].count / split,
                           .rank = (uint32_t)plan_node_position(p, x->node, d->device) / split,
                           .sharded_optimizer = n->kind == IR_NODE_REDUCE_SCATTER,
                           .sharded_grads = n->shard_grads,
                           .sharded_params = n->shard_params};
  x->bucket = dc->buckets->len;
  g_array_append_val(dc->buckets, bk);
  return true;
}

/* Instruction i's common fields and its micro-batch, then what its kind means. */
static bool decode_instr(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct plan_instr *pi = &d->cls->instrs[i];
  const struct ir_node *n = &p->nodes[pi->node];
  struct exec_instr *x = &d->instrs[i];
  x->node = pi->node;
  x->stream = pi->stream;
  x->pass = n->pass;
  x->segment = x->edge = x->peer = x->comm = x->bucket = x->gather = x->segset = x->tp_compute =
      IR_NONE;
  x->mb = -1;
  bool per_mb = n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV ||
                n->kind == IR_NODE_ALL_TO_ALL || n->purpose == IR_COMM_TP ||
                (n->kind == IR_NODE_ALL_GATHER && n->pass != IR_PASS_NONE);
  if (per_mb) {
    int32_t v = d->mb_tag >= 0 ? n->tags[d->mb_tag] : 0;
    if (v < 0 || (uint32_t)v >= d->M)
      return fail_at(dc, i, err, "has no micro-batch index in range");
    x->mb = v;
    d->mb_instr_count[v]++;
  }
  if (n->purpose == IR_COMM_TP) { /* run inside its compute (tp.c) */
    x->role = EXEC_ROLE_TP;
    x->segment = n->segment;
    return true;
  }
  switch (n->kind) {
  case IR_NODE_COMPUTE: return decode_compute(dc, i, err);
  case IR_NODE_SEND:
  case IR_NODE_RECV: return decode_transfer(dc, i, err);
  case IR_NODE_ALL_TO_ALL: return decode_all_to_all(dc, i, err);
  case IR_NODE_ALL_REDUCE:
    if (ir_node_is_tied_sync(n)) {
      x->role = EXEC_ROLE_TIED_SYNC; /* its copy is found once every compute is decoded */
      return true;
    }
    return decode_bucket(dc, i, err);
  case IR_NODE_REDUCE_SCATTER: return decode_bucket(dc, i, err);
  case IR_NODE_ALL_GATHER:
    x->role = n->pass == IR_PASS_NONE ? EXEC_ROLE_GATHER_UPDATE : EXEC_ROLE_GATHER_USE;
    x->segset = n->segset;
    return true;
  case IR_NODE_OPTIMIZER:
    x->role = EXEC_ROLE_OPTIMIZER;
    x->segset = n->segset;
    if (n->segset >= p->n_segsets)
      return fail_at(dc, i, err, "has no segment set");
    return true;
  default: return fail_at(dc, i, err, "has an unknown kind");
  }
}

static void link_groups(struct exec_device *d);

static bool decode_instrs(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  struct decoder dc = {d, g_array_new(FALSE, TRUE, sizeof(struct exec_bucket)),
                       g_new0(GHashTable *, p->n_classes)};
  bool ok = true;
  for (uint32_t i = 0; i < d->cls->n_instrs && ok; i++)
    ok = decode_instr(&dc, i, err);
  /* the device owns the buckets from here, so clearing it frees them after a failure too */
  d->n_buckets = dc.buckets->len;
  d->buckets = (struct exec_bucket *)g_array_free(dc.buckets, FALSE);
  for (uint32_t k = 0; k < p->n_classes; k++)
    if (dc.class_index[k])
      g_hash_table_destroy(dc.class_index[k]);
  g_free(dc.class_index);
  if (ok)
    link_groups(d);
  return ok;
}

/* The order in which a group's parts are given to the backend: with each peer (ascending), the
 * lower rank's sends first and the higher rank's receives first. The parts are posted together
 * (see transfer_group), so this order is not needed for progress; it is the one in which parts
 * run one after another would still meet for mirrored groups (Megatron's
 * send_forward_recv_backward against send_backward_recv_forward), which exec_comm_p2p_group's
 * default relies on for a backend without a group of its own. */
struct group_part {
  uint32_t peer, phase, instr;
};

static int compare_group_part(const void *x, const void *y) {
  const struct group_part *a = x, *b = y;
  if (a->peer != b->peer)
    return a->peer < b->peer ? -1 : 1;
  if (a->phase != b->phase)
    return a->phase < b->phase ? -1 : 1;
  return a->instr < b->instr ? -1 : a->instr > b->instr;
}

static void link_group(struct exec_device *d, const uint32_t *entries, uint32_t n) {
  struct group_part *parts = g_new(struct group_part, n);
  for (uint32_t k = 0; k < n; k++) {
    const struct exec_instr *x = &d->instrs[entries[k]];
    bool send_first = d->device < x->peer;
    parts[k] = (struct group_part){x->peer, (x->role == EXEC_ROLE_SEND) != send_first, entries[k]};
  }
  qsort(parts, n, sizeof *parts, compare_group_part);
  struct exec_instr *lead = &d->instrs[entries[0]];
  lead->group_head = parts[0].instr;
  for (uint32_t k = 0; k < n; k++) {
    struct exec_instr *x = &d->instrs[parts[k].instr];
    x->group_lead = entries[0];
    x->group_next = k + 1 < n ? parts[k + 1].instr : IR_NONE;
  }
  g_free(parts);
}

/* Every point-to-point group of the device's streams (see struct exec_instr). */
static void link_groups(struct exec_device *d) {
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    d->instrs[i].group_lead = d->instrs[i].group_head = d->instrs[i].group_next = IR_NONE;
  for (uint32_t s = 0; s < d->plan->n_streams; s++)
    for (uint32_t e = c->stream_first[s]; e < c->stream_first[s + 1];) {
      uint32_t n = plan_group_span(c, e);
      if (n > 1)
        link_group(d, c->stream_instrs + e, n);
      e += n;
    }
}

/* Gathers find their bucket by segment set; compute finds its gathered parameters. */
static bool link_gathers(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    struct exec_instr *x = &d->instrs[i];
    const struct plan_instr *pi = &c->instrs[i];
    if (x->role == EXEC_ROLE_GATHER_USE || x->role == EXEC_ROLE_GATHER_UPDATE) {
      for (uint32_t b = 0; b < d->n_buckets; b++)
        if (p->nodes[d->buckets[b].node].segset == x->segset)
          x->bucket = b;
      if (x->bucket == IR_NONE)
        return fail_instr(p, d->device, x->node, err,
                          "gathers parameters of no gradient bucket here");
      for (uint32_t w = 0; w < pi->write_count; w++)
        x->gather_users += c->tensors[c->writes[pi->write_first + w]].consumer_count;
    }
    if (x->role == EXEC_ROLE_COMPUTE)
      for (uint32_t r = 0; r < pi->read_count; r++) {
        uint32_t prod = c->tensors[c->reads[pi->read_first + r]].producer;
        if (p->nodes[c->instrs[prod].node].kind == IR_NODE_ALL_GATHER)
          x->gather = prod;
      }
  }
  return true;
}

/* Parameter layout: buckets first (contiguous, padded), then the other segments held. */
static bool lay_out_params(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  const struct model *m = d->xm->m;
  uint32_t ns = m->n_segments;
  uint64_t off = 0;
  for (uint32_t s = 0; s < ns; s++) {
    uint64_t n = 0; /* the segment's ops, each as this device holds it (TP slices) */
    for (uint32_t j = 0; j < d->xm->segs[s].n_ops; j++)
      n += exec_tp_op_params(d->xm, &m->ops[d->xm->segs[s].ops[j].op], d->tp_degree);
    d->param_local[s] = d->holds[s] ? n / d->ep_size[s] : 0;
  }
  exec_tp_op_offsets(d);
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    struct exec_bucket *bk = &d->buckets[b];
    bk->offset = off;
    for (uint32_t j = 0; j < bk->n_segs; j++) {
      uint32_t s = bk->segs[j];
      /* Sharded experts are synced only between model copies (DualPipe), by an all-reduce of
       * the local experts' gradients with the device holding the same experts in the other
       * copy; ZeRO never shards them. */
      bool sharded_ok = p->nodes[bk->node].kind == IR_NODE_ALL_REDUCE;
      if (s >= ns || !d->holds[s] || (d->ep_size[s] > 1 && !sharded_ok) ||
          d->bucket_of[s] != IR_NONE)
        return fail_instr(p, d->device, bk->node, err,
                          "syncs a segment this device does not replicate");
      d->bucket_of[s] = b;
      d->param_offset[s] = off;
      off += d->param_local[s];
    }
    bk->count = off - bk->offset;
    bk->shard = (bk->count + bk->group_size - 1) / bk->group_size;
    bk->padded = bk->shard * bk->group_size;
    off = bk->offset + bk->padded;
  }
  for (uint32_t s = 0; s < ns; s++) {
    if (!d->holds[s] || d->bucket_of[s] != IR_NONE)
      continue;
    d->param_offset[s] = off;
    off += d->param_local[s];
  }
  d->n_params = off;
  exec_store_layout(d);
  return true;
}

/* A tied embedding split across stages trains like one table only when every device holding
 * a copy sums its gradient with the other copy's (the plan's tied sync) over whole, unsharded
 * gradients: each sync finds the copy held here, and a copy without a sync is refused. */
static bool link_tied_syncs(struct exec_device *d, GError **err) {
  const struct exec_model *xm = d->xm;
  uint32_t emb = xm->embedding_seg, head = xm->head_seg, syncs = 0;
  for (uint32_t i = 0; i < d->cls->n_instrs; i++) {
    struct exec_instr *x = &d->instrs[i];
    if (x->role != EXEC_ROLE_TIED_SYNC)
      continue;
    if (!xm->tied_copy)
      return fail_instr(d->plan, d->device, x->node, err,
                        "syncs tied embeddings, but the model keeps no copy of its embedding");
    if (d->holds[emb] == d->holds[head])
      return fail_instr(d->plan, d->device, x->node, err,
                        d->holds[emb] ? "syncs the tied embedding's two copies on one device"
                                      : "syncs a tied embedding this device holds no copy of");
    x->segment = d->holds[emb] ? emb : head;
    uint32_t b = d->bucket_of[x->segment];
    if (b != IR_NONE && d->buckets[b].sharded_optimizer)
      return fail_instr(d->plan, d->device, x->node, err,
                        "syncs a tied embedding whose gradients are sharded (ZeRO): not supported");
    syncs++;
  }
  if (xm->tied_copy && (d->holds[emb] || d->holds[head]) && syncs == 0)
    return piper_input_error(err,
                             "device %u: holds a copy of the tied embedding that the plan never "
                             "syncs with the other (copies on one device group or on several "
                             "model copies are not supported; one PP region ties them in place)",
                             d->device);
  return true;
}

/* Communicators of the whole plan, in one order every rank computes alike, and this device's
 * instructions' places among them. */
static void collect_comm_keys(struct exec_device *d) {
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  GArray *keys = g_array_new(FALSE, FALSE, sizeof(struct exec_comm_key));
  for (uint32_t k = 0; k < p->n_classes; k++)
    for (uint32_t i = 0; i < p->classes[k].n_instrs; i++) {
      const struct plan_instr *pi = &p->classes[k].instrs[i];
      if (pi->comm == IR_NONE)
        continue;
      struct exec_comm_key key = key_of(p, pi);
      g_array_append_val(keys, key);
    }
  if (keys->len)
    qsort(keys->data, keys->len, sizeof(struct exec_comm_key), compare_key);
  uint32_t w = 0;
  for (uint32_t i = 0; i < keys->len; i++) {
    struct exec_comm_key *ki = &g_array_index(keys, struct exec_comm_key, i);
    if (w > 0 && compare_key(ki, &g_array_index(keys, struct exec_comm_key, w - 1)) == 0)
      continue;
    g_array_index(keys, struct exec_comm_key, w++) = *ki;
  }
  g_array_set_size(keys, w);
  d->n_comm_keys = keys->len;
  d->comm_keys = (struct exec_comm_key *)g_array_free(keys, FALSE);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    if (c->instrs[i].comm == IR_NONE)
      continue;
    struct exec_comm_key key = key_of(p, &c->instrs[i]);
    struct exec_comm_key *hit =
        bsearch(&key, d->comm_keys, d->n_comm_keys, sizeof(struct exec_comm_key), compare_key);
    d->instrs[i].comm = (uint32_t)(hit - d->comm_keys);
    /* sends and receives pair up in sequence order on their communicator */
    d->instrs[i].tag = (int)(c->instrs[i].seq & 0x7fff);
  }
}

bool exec_device_init(struct exec_device *d, const struct plan *p, const struct exec_model *xm,
                      uint32_t device, GError **err) {
  memset(d, 0, sizeof *d);
  d->plan = p;
  d->xm = xm;
  d->device = device;
  if (!device_shape(d, device, err) || !exec_tp_device_init(d, err) || !data_parallel_place(d, err))
    return false;
  device_alloc(d);
  if (!decode_instrs(d, err) || !link_gathers(d, err) || !lay_out_params(d, err) ||
      !link_tied_syncs(d, err)) {
    exec_device_clear(d);
    return false;
  }
  collect_comm_keys(d);
  if (!exec_tp_link_comm(d, err)) {
    exec_device_clear(d);
    return false;
  }
  return true;
}
