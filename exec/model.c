/* model: what the model means for training, the same on every device, derived from the model
 * alone: each op reads and writes decoder state tensors (the rule of models/build.c), a model
 * edge carries the tensors its destination reads whose last writer is its source, and each
 * segment's ops read and write values (SSA) that segment_forward.c runs. */
#include <string.h>

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
  /* GPT-3-style layers and gpt_oss's extras are costed by the simulator, not trained here */
  if (m->norm != MODEL_NORM_RMS || m->mlp_act != MODEL_MLP_SWIGLU || m->max_positions > 0)
    return piper_input_error(err,
                             "%s: model_type %s (LayerNorm, GELU MLP, learned positions) has no "
                             "host kernel: piper-sim costs it, piper-exec trains llama, qwen and "
                             "mixtral-style decoders",
                             m->name, m->model_type);
  if (m->linear_bias || m->attention_sinks || m->sliding_window > 0)
    return piper_input_error(err,
                             "%s: model_type %s (projection biases, attention sinks, sliding "
                             "window) has no host kernel: piper-sim costs it, piper-exec trains "
                             "llama, qwen and mixtral-style decoders",
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
  /* under context parallelism a device runs its CP rank's share (seq stays the whole one's) */
  xm->T = xm->T_seq = (int)model_tokens_per_microbatch(m);
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
 * a|h, m, s, r; segment_forward.c relies on it) and the values it writes. */
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
