/* model building: the forward op list of a configured model with per-op costs, the tags of
 * every op (PP, EP, user tags), the segments (maximal runs of ops with identical tags) and
 * the data edges between segments. Costs are per micro-batch, unsharded; FLOPs count 2 per
 * multiply-add. The README's "Model files" section lists every formula used here. */
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "model-impl.h"

/* The decoder state one micro-batch's forward pass passes between ops (model.h's kind table).
 * Edges between segments carry these. */
enum tensor { TENSOR_X, TENSOR_H, TENSOR_A, TENSOR_M, TENSOR_S, TENSOR_R, TENSOR_COUNT };
#define BIT(t) (1u << (t))

struct op_io {
  uint8_t reads, writes; /* BIT(tensor) masks */
};

/* Every byte and parameter count must stay below this. 2^56 bytes (64 PiB) is far beyond any
 * device, and the headroom lets callers multiply by micro-batch or replica counts. */
#define SIZE_LIMIT (UINT64_C(1) << 56)

struct builder {
  struct model *m;
  GArray *ops; /* struct model_op */
  GArray *io;  /* struct op_io, parallel to ops */
  bool overflow;
  uint64_t T, h, B; /* tokens per micro-batch, hidden size, dtype bytes */
  uint64_t act;     /* bytes of one [T, hidden] activation */
};

/* Checked arithmetic: a result above SIZE_LIMIT marks the build failed (reported once at the
 * end) and yields 0, so a bad size can never wrap into a small plausible number. */
static uint64_t mul(struct builder *b, uint64_t x, uint64_t y) {
  if (x != 0 && y > SIZE_LIMIT / x) {
    b->overflow = true;
    return 0;
  }
  return x * y;
}

static uint64_t mul3(struct builder *b, uint64_t x, uint64_t y, uint64_t z) {
  return mul(b, mul(b, x, y), z);
}

static uint64_t add(struct builder *b, uint64_t x, uint64_t y) {
  if (x > SIZE_LIMIT || y > SIZE_LIMIT - x) {
    b->overflow = true;
    return 0;
  }
  return x + y;
}

static uint64_t u(int64_t v) {
  return (uint64_t)v;
}

static struct model_op *emit(struct builder *b, enum model_op_kind kind, int32_t layer,
                             unsigned reads, unsigned writes) {
  struct model_op op = {.kind = kind, .layer = layer};
  struct op_io io = {.reads = (uint8_t)reads, .writes = (uint8_t)writes};
  g_array_append_val(b->ops, op);
  g_array_append_val(b->io, io);
  return &g_array_index(b->ops, struct model_op, b->ops->len - 1);
}

static void set_params(struct builder *b, struct model_op *op, uint64_t count) {
  op->param_count = count;
  op->param_bytes = mul(b, count, b->B);
}

/* tokens -> x, [T, vocab, hidden]. A gather: no FLOPs forward, no input gradient (token ids);
 * the weight gradient is a scatter-add of T rows. Only the T gathered rows are read. */
static void emit_embedding(struct builder *b) {
  struct model *m = b->m;
  struct model_op *op = emit(b, MODEL_OP_EMBEDDING, -1, 0, BIT(TENSOR_X));
  op->shape[0] = (int64_t)b->T;
  op->shape[1] = m->vocab_size;
  op->shape[2] = m->hidden_size;
  op->flops_bwd_weight = (double)b->T * (double)b->h;
  set_params(b, op, mul(b, u(m->vocab_size), b->h));
  op->bytes_fwd = add(b, mul(b, b->T, 4), 2 * b->act); /* int32 ids, rows read, x written */
  if (m->max_positions > 0) {
    /* GPT's learned positions: a second table of max_positions rows, its T rows gathered and
     * added (one FLOP an element), its gradient a second scatter-add */
    set_params(b, op, mul(b, add(b, u(m->vocab_size), u(m->max_positions)), b->h));
    op->flops_fwd += (double)b->T * (double)b->h;
    op->flops_bwd_weight += (double)b->T * (double)b->h;
    op->bytes_fwd = add(b, op->bytes_fwd, b->act);
  }
  op->saved_bytes = mul(b, b->T, 4);                   /* ids, for the scatter-add */
  op->out_bytes = b->act;
}

/* x -> h, [T, hidden]: mean square, rsqrt, scale by weight (~4 FLOPs per element forward). */
static void emit_rmsnorm(struct builder *b, int32_t layer) {
  struct model_op *op = emit(b, MODEL_OP_RMSNORM, layer, BIT(TENSOR_X), BIT(TENSOR_H));
  double n = (double)b->T * (double)b->h;
  bool ln = b->m->norm == MODEL_NORM_LAYER;
  op->shape[0] = (int64_t)b->T;
  op->shape[1] = (int64_t)b->h;
  op->shape[2] = ln;
  /* LayerNorm (gpt2) also centres (a mean: 2 more per element forward, the mean's term in
   * the input gradient: 3 more) and shifts by a bias (1 forward, its gradient 1 more per
   * element); it keeps an fp32 mean beside the rstd and has 2 x hidden parameters */
  op->flops_fwd = (ln ? 7 : 4) * n;
  op->flops_bwd_input = (ln ? 9 : 6) * n;
  op->flops_bwd_weight = (ln ? 3 : 2) * n; /* sum over tokens of dy * x_hat (and of dy) */
  set_params(b, op, ln ? 2 * b->h : b->h);
  op->bytes_fwd = add(b, op->param_bytes, 2 * b->act);
  /* input x and fp32 rstd per token (and the mean, LayerNorm) */
  op->saved_bytes = add(b, b->act, mul(b, b->T, ln ? 8 : 4));
  op->out_bytes = b->act;
  /* its output, which the op it feeds keeps (Megatron's layernorm recompute: a decoder
   * layer's two norms, not the final one); the rerun writes it and holds the fp32 rstd it
   * computes again */
  if (layer >= 0) {
    op->module_saved_bytes[MODEL_MODULE_LAYERNORM] = b->act;
    op->module_flops_fwd[MODEL_MODULE_LAYERNORM] = op->flops_fwd;
    op->module_rerun_work_bytes[MODEL_MODULE_LAYERNORM] = mul(b, b->T, ln ? 8 : 4);
  }
}

/* Context parallelism: one rank's queries are seq_len / cp tokens (two load-balanced chunks),
 * so its share of the causal core is exactly 1 / cp of the whole (docs/directives.md). */
static double cp_of(const struct model *m) {
  return m->context_parallel > 1 ? (double)m->context_parallel : 1;
}
static int64_t local_seq(const struct model *m) {
  return m->seq_len / (m->context_parallel > 1 ? m->context_parallel : 1);
}

/* h -> a, GQA with RoPE: [batch, seq, heads, kv_heads, head_dim, hidden] (seq: this rank's).
 * q,k,v,o projections are matmuls (F = BI = BW = 2mnk). The causal core QK^T and PV costs half
 * of the full 2*2*b*H*s*s*hd because flash kernels skip the upper triangle; its backward is
 * twice the forward and it has no weights. RoPE is not counted (a few FLOPs per q/k element). */
static void emit_attention(struct builder *b, int32_t layer) {
  struct model *m = b->m;
  struct model_op *op = emit(b, MODEL_OP_ATTENTION, layer, BIT(TENSOR_H), BIT(TENSOR_A));
  uint64_t qd = mul(b, u(m->num_heads), u(m->head_dim));
  uint64_t kvd = mul(b, u(m->num_kv_heads), u(m->head_dim));
  /* a sliding layer's queries see at most `window` keys: the causal band s w - w^2 / 2 of
   * the s^2 / 2 triangle */
  int64_t window = model_layer_sliding(m, layer) && m->sliding_window < m->seq_len
                       ? m->sliding_window
                       : 0;
  int64_t shape[] = {m->micro_batch_size, local_seq(m), m->num_heads, m->num_kv_heads,
                     m->head_dim,         m->hidden_size, window};
  memcpy(op->shape, shape, sizeof shape);
  double T = (double)b->T, h = (double)b->h, s = (double)m->seq_len;
  double mm = 2 * T * h * ((double)qd + 2 * (double)kvd) + 2 * T * (double)qd * h;
  double keys = window ? s * (double)window - (double)window * (double)window / 2 : s * s / 2;
  double core = 2.0 * 2 * (double)m->micro_batch_size * (double)m->num_heads * keys *
                (double)m->head_dim / cp_of(m);
  op->flops_fwd = mm + core;
  op->flops_bwd_input = mm + 2 * core;
  op->flops_bwd_weight = mm;
  set_params(b, op, add(b, mul(b, 2 * b->h, qd), mul(b, 2 * b->h, kvd)));
  if (m->linear_bias) {
    /* q, k, v and o biases: an add an element forward, a sum over tokens for their gradient */
    double nb = (double)(qd + 2 * kvd) + h;
    set_params(b, op, add(b, op->param_count, add(b, add(b, qd, 2 * kvd), b->h)));
    op->flops_fwd += T * nb;
    op->flops_bwd_weight += T * nb;
  }
  if (m->attention_sinks) /* gpt_oss: one learned logit per head in each softmax */
    set_params(b, op, add(b, op->param_count, u(m->num_heads)));
  uint64_t qkv = mul3(b, b->T, add(b, qd, 2 * kvd), b->B); /* q, k, v activations */
  uint64_t core_out = mul3(b, b->T, qd, b->B);
  uint64_t lse = mul3(b, b->T, u(m->num_heads), 4); /* fp32 logsumexp per row */
  /* params, h in, q/k/v written then read by the core, core output written then read by o,
   * logsumexp written, a written. */
  op->bytes_fwd =
      add(b, add(b, op->param_bytes, 2 * b->act), add(b, add(b, 2 * qkv, 2 * core_out), lse));
  op->saved_bytes = add(b, add(b, b->act, qkv), add(b, core_out, lse));
  op->out_bytes = b->act;
  op->bwork_bytes = add(b, qkv, core_out); /* dy (BI scratch), dq, dk, dv */
  op->module_flops_fwd[MODEL_MODULE_CORE_ATTN] = core;
  op->module_saved_bytes[MODEL_MODULE_CORE_ATTN] = add(b, core_out, lse);
}

/* h -> a, DeepSeek multi-head latent attention, costed as its real projections:
 * [batch, seq, heads, q_lora_rank, kv_lora_rank, qk_head_dim, v_head_dim, hidden].
 * q = q_b(norm(q_a h)) (or q_proj h when q_lora_rank is 0), [c_kv, k_rope] = kv_a h,
 * [k_nope, v] = kv_b(norm(c_kv)), a = o(core). The causal core is b*H*s*s*(qk + v) forward
 * (QK^T over qk_head_dim, PV over v_head_dim, half of the square each). */
static void emit_mla(struct builder *b, int32_t layer) {
  struct model *m = b->m;
  struct model_op *op = emit(b, MODEL_OP_MLA_ATTENTION, layer, BIT(TENSOR_H), BIT(TENSOR_A));
  int64_t qk = m->qk_nope_head_dim + m->qk_rope_head_dim;
  int64_t shape[] = {m->micro_batch_size, local_seq(m), m->num_heads, m->q_lora_rank,
                     m->kv_lora_rank,     qk,         m->v_head_dim, m->hidden_size};
  memcpy(op->shape, shape, sizeof shape);
  uint64_t H = u(m->num_heads), ql = u(m->q_lora_rank), kvl = u(m->kv_lora_rank);
  uint64_t rope = u(m->qk_rope_head_dim), nope = u(m->qk_nope_head_dim), vd = u(m->v_head_dim);
  uint64_t hq = mul(b, H, u(qk)), kv_a_out = kvl + rope, kv_b_out = mul(b, H, nope + vd);
  uint64_t hv = mul(b, H, vd);
  /* weight matrices as (in, out) pairs; their sum of in*out is the parameter count and
   * 2*T*in*out their forward FLOPs */
  uint64_t mats[][2] = {
      {b->h, ql},       {ql, hq}, /* q_a, q_b (absent when q_lora_rank is 0) */
      {b->h, kv_a_out}, {kvl, kv_b_out}, {hv, b->h},
  };
  if (ql == 0)
    mats[0][1] = hq;                 /* q_proj: [hidden, heads*qk] */
  uint64_t params = add(b, ql, kvl); /* q_a_norm, kv_a_norm weights */
  double mm = 0;
  for (size_t i = 0; i < G_N_ELEMENTS(mats); i++) {
    params = add(b, params, mul(b, mats[i][0], mats[i][1]));
    mm += 2 * (double)b->T * (double)mats[i][0] * (double)mats[i][1];
  }
  double norm_el = (double)b->T * (double)(ql + kvl); /* elements of the two latent norms */
  double core = (double)m->micro_batch_size * (double)H * (double)m->seq_len * (double)m->seq_len *
                (double)(qk + m->v_head_dim) / cp_of(m);
  op->flops_fwd = mm + core + 4 * norm_el;
  op->flops_bwd_input = mm + 2 * core + 6 * norm_el;
  op->flops_bwd_weight = mm + 2 * norm_el;
  set_params(b, op, params);
  uint64_t lat = mul3(b, b->T, ql + kv_a_out, b->B);      /* c_q, [c_kv, k_rope] */
  uint64_t qkv = mul3(b, b->T, add(b, 2 * hq, hv), b->B); /* q, k (with rope), v */
  uint64_t core_out = mul3(b, b->T, hv, b->B);
  uint64_t lse = mul3(b, b->T, H, 4);
  op->bytes_fwd = add(b, add(b, op->param_bytes, 2 * b->act),
                      add(b, add(b, 2 * lat, 2 * qkv), add(b, 2 * core_out, lse)));
  /* h, the latents (q_b / kv_b weight gradients need them), q, k, v, core output, lse */
  op->saved_bytes = add(b, add(b, b->act, lat), add(b, add(b, qkv, core_out), lse));
  op->module_flops_fwd[MODEL_MODULE_CORE_ATTN] = core;
  op->module_saved_bytes[MODEL_MODULE_CORE_ATTN] = add(b, core_out, lse);
  /* q from c_q (q_b), k and v from c_kv (kv_b) and k_rope after the latent norms; the
   * latents are kept. Without q_lora_rank q comes from h (q_proj): it stays. */
  op->module_saved_bytes[MODEL_MODULE_MLA_UP_PROJ] = ql ? qkv : mul3(b, b->T, add(b, hq, hv), b->B);
  op->module_flops_fwd[MODEL_MODULE_MLA_UP_PROJ] =
      2 * (double)b->T * ((double)ql * (double)(ql ? hq : 0) + (double)kvl * (double)kv_b_out) +
      4 * norm_el;
  op->out_bytes = b->act;
}

/* x += a | m (+ s), [T, hidden]. The backward passes dy through unchanged; the one add counted
 * in BI is where the stream's gradient meets the block's input gradient. */
static void emit_residual(struct builder *b, int32_t layer, unsigned reads) {
  struct model_op *op = emit(b, MODEL_OP_RESIDUAL_ADD, layer, reads, BIT(TENSOR_X));
  unsigned added = (unsigned)__builtin_popcount(reads) - 1; /* inputs besides x */
  double n = (double)b->T * (double)b->h;
  op->shape[0] = (int64_t)b->T;
  op->shape[1] = (int64_t)b->h;
  op->flops_fwd = added * n;
  op->flops_bwd_input = n;
  op->bytes_fwd = mul(b, b->act, added + 2); /* read x and the added ones, write x */
  op->out_bytes = b->act;
}

/* h -> m | s, SwiGLU: down(silu(gate h) * up h), [T, hidden, ffn]. silu-and-multiply is ~5
 * FLOPs per ffn element forward, ~8 backward. The shared expert keeps no copy of h: the
 * router of the same layer saves it. */
/* h -> m, GPT's MLP: down(gelu(up h + b1)) + b2, [T, hidden, ffn, 1]. GELU in its tanh form
 * is ~8 FLOPs an element forward and ~12 in its gradient; the biases an add an element and a
 * sum over tokens. It keeps its input, the pre-activation and the GELU output (the down
 * projection's weight gradient reads it). */
static void emit_gelu_mlp(struct builder *b, int32_t layer, uint64_t ffn) {
  struct model_op *op = emit(b, MODEL_OP_MLP, layer, BIT(TENSOR_H), BIT(TENSOR_M));
  op->shape[0] = (int64_t)b->T;
  op->shape[1] = (int64_t)b->h;
  op->shape[2] = (int64_t)ffn;
  op->shape[3] = 1;
  double tf = (double)b->T * (double)ffn, th = (double)b->T * (double)b->h;
  double mm = 4 * tf * (double)b->h;
  op->flops_fwd = mm + 8 * tf + tf + th;
  op->flops_bwd_input = mm + 12 * tf;
  op->flops_bwd_weight = mm + tf + th;
  set_params(b, op, add(b, mul3(b, 2, b->h, ffn), add(b, ffn, b->h)));
  uint64_t up = mul3(b, b->T, ffn, b->B);
  /* params, h in, up written and read, gelu written and read, out written */
  op->bytes_fwd = add(b, add(b, op->param_bytes, 2 * b->act), 4 * up);
  op->saved_bytes = add(b, b->act, 2 * up);
  op->out_bytes = b->act;
  op->bwork_bytes = up; /* d(up) */
  op->module_saved_bytes[MODEL_MODULE_MLP] = 2 * up;
  op->module_flops_fwd[MODEL_MODULE_MLP] = op->flops_fwd;
  op->module_rerun_work_bytes[MODEL_MODULE_MLP] = b->act;
}

static void emit_mlp(struct builder *b, enum model_op_kind kind, int32_t layer, uint64_t ffn) {
  bool shared = kind == MODEL_OP_SHARED_EXPERT;
  if (kind == MODEL_OP_MLP && b->m->mlp_act == MODEL_MLP_GELU) {
    emit_gelu_mlp(b, layer, ffn);
    return;
  }
  struct model_op *op = emit(b, kind, layer, BIT(TENSOR_H), BIT(shared ? TENSOR_S : TENSOR_M));
  op->shape[0] = (int64_t)b->T;
  op->shape[1] = (int64_t)b->h;
  op->shape[2] = (int64_t)ffn;
  double tf = (double)b->T * (double)ffn;
  double mm = 6 * tf * (double)b->h;
  op->flops_fwd = mm + 5 * tf;
  op->flops_bwd_input = mm + 8 * tf;
  op->flops_bwd_weight = mm;
  set_params(b, op, mul3(b, 3, b->h, ffn));
  uint64_t gu = mul3(b, b->T, 2 * ffn, b->B); /* gate and up */
  uint64_t act = mul3(b, b->T, ffn, b->B);
  /* params, h in, gate/up written and read, silu*up written and read, out written */
  op->bytes_fwd = add(b, add(b, op->param_bytes, 2 * b->act), add(b, 2 * gu, 2 * act));
  /* and silu(gate) * up, which the down projection's weight gradient reads (the host
   * kernels keep it rather than recompute it, kernels_mlp_saved_floats) */
  op->saved_bytes = shared ? add(b, gu, act) : add(b, add(b, b->act, gu), act);
  op->out_bytes = b->act;
  op->bwork_bytes = gu; /* dgate, dup */
  /* rerun whole (the kernel computes the output too, into a transient [T, hidden]) */
  enum model_module k = shared ? MODEL_MODULE_SHARED_EXPERTS : MODEL_MODULE_MLP;
  op->module_saved_bytes[k] = add(b, gu, act);
  op->module_flops_fwd[k] = op->flops_fwd;
  op->module_rerun_work_bytes[k] = b->act;
}

/* Qwen2-MoE's shared-expert gate on the shared expert just emitted: s *= sigmoid(h w), w
 * [hidden, 1] (HF Qwen2MoeSparseMoeBlock.shared_expert_gate). A [T, hidden] x [hidden, 1]
 * product each way plus the sigmoid and the scaling of s; it keeps its [T] logits. */
static void add_shared_gate(struct builder *b, struct model_op *op) {
  double th = (double)b->T * (double)b->h;
  set_params(b, op, add(b, op->param_count, b->h));
  op->flops_fwd += 2 * th + th;        /* logits, then s * sigmoid */
  op->flops_bwd_input += 2 * th + th;  /* dh from the logits, ds */
  op->flops_bwd_weight += 2 * th;
  op->bytes_fwd = add(b, op->bytes_fwd, add(b, mul(b, b->h, b->B), 2 * b->act));
  op->saved_bytes = add(b, op->saved_bytes, mul(b, b->T, 4));
}

/* h -> r: logits = h W [T, hidden] x [hidden, experts], fp32 softmax, top-k, normalised
 * weights. r is int32 expert id + fp32 weight per (token, k): 8 bytes. Shape
 * [T, hidden, experts, top_k]. */
static void emit_router(struct builder *b, int32_t layer) {
  struct model *m = b->m;
  struct model_op *op = emit(b, MODEL_OP_ROUTER, layer, BIT(TENSOR_H), BIT(TENSOR_R));
  uint64_t E = u(m->num_experts), k = u(m->experts_per_tok);
  int64_t shape[] = {(int64_t)b->T, (int64_t)b->h, m->num_experts, m->experts_per_tok};
  memcpy(op->shape, shape, sizeof shape);
  double te = (double)b->T * (double)E;
  double mm = 2 * te * (double)b->h;
  op->flops_fwd = mm + 6 * te; /* softmax ~5 per logit, top-k selection ~1 */
  op->flops_bwd_input = mm + 4 * te;
  op->flops_bwd_weight = mm;
  set_params(b, op, mul(b, b->h, E));
  if (m->linear_bias) { /* gpt_oss's router bias */
    set_params(b, op, add(b, op->param_count, E));
    op->flops_fwd += te;
    op->flops_bwd_weight += te;
  }
  uint64_t probs = mul3(b, b->T, E, 4);
  uint64_t r = mul3(b, b->T, k, 8);
  op->bytes_fwd = add(b, add(b, op->param_bytes, b->act), add(b, 2 * probs, r));
  /* h (its weight gradient needs it; experts keep only their routed copies) and the probs */
  /* and r itself: the router's backward reads the ids and weights it chose */
  op->saved_bytes = add(b, add(b, b->act, probs), r);
  op->out_bytes = r;
  op->bwork_bytes = probs; /* dlogits */
}

/* h, r -> m: T*top_k routed rows through SwiGLU experts of width expert_ffn, then the weighted
 * combine (2 FLOPs per routed element). Shape [T, hidden, expert_ffn, experts, top_k]. The
 * forward reads every expert's weights: at real sizes every expert receives tokens. */
static void emit_experts(struct builder *b, int32_t layer) {
  struct model *m = b->m;
  struct model_op *op =
      emit(b, MODEL_OP_EXPERT_FFN, layer, BIT(TENSOR_H) | BIT(TENSOR_R), BIT(TENSOR_M));
  uint64_t E = u(m->num_experts), k = u(m->experts_per_tok), f = u(m->moe_intermediate_size);
  int64_t shape[] = {(int64_t)b->T, (int64_t)b->h, m->moe_intermediate_size, m->num_experts,
                     m->experts_per_tok};
  memcpy(op->shape, shape, sizeof shape);
  uint64_t tk = mul(b, b->T, k);
  double rf = (double)tk * (double)f, rh = (double)tk * (double)b->h;
  double mm = 6 * rf * (double)b->h;
  op->flops_fwd = mm + 5 * rf + 2 * rh;
  op->flops_bwd_input = mm + 8 * rf + 2 * rh;
  op->flops_bwd_weight = mm;
  set_params(b, op, mul(b, E, mul3(b, 3, b->h, f)));
  if (m->linear_bias) {
    /* gpt_oss: gate/up and down biases per expert, added to each routed row */
    double nb = (double)tk * (double)(2 * f + b->h);
    set_params(b, op, add(b, op->param_count, mul(b, E, add(b, 2 * f, b->h))));
    op->flops_fwd += nb;
    op->flops_bwd_weight += nb;
  }
  uint64_t rows = mul3(b, tk, b->h, b->B); /* routed copies of h, or of the expert outputs */
  uint64_t gu = mul3(b, tk, 2 * f, b->B);  /* gate and up per routed row */
  uint64_t act = mul3(b, tk, f, b->B);
  uint64_t r = mul(b, tk, 8);
  uint64_t rw = mul(b, tk, 4); /* each routed row's routing weight, fp32 */
  /* params, h and r in, dispatched rows written and read, gate/up and silu*up written and
   * read, expert outputs written and read by the combine, m written */
  op->bytes_fwd = add(b, add(b, add(b, op->param_bytes, 2 * b->act), add(b, r, 2 * rows)),
                      add(b, add(b, 2 * gu, 2 * act), 2 * rows));
  /* routed input rows, gate/up, r, silu(gate) * up times the routing weight and the weight
   * (kernels_expert_ffn_saved_floats), and the routing permutation (an int32 row and expert
   * per route). Not the expert outputs: the experts apply the routing weights before the down
   * projection (Megatron-Core's weighted SwiGLU), so the weights' gradient is dact . silu(g)*u,
   * from what the experts keep anyway, and the combine only sums */
  op->saved_bytes = add(b, add(b, add(b, rows, gu), add(b, r, rw)), add(b, act, mul(b, tk, 8)));
  op->out_bytes = b->act;
  /* dispatched rows and their weights, the expert outputs and the experts' scratch (and an
   * int32 count, one 16-byte block) while F runs; dgate, dup and the routed rows' gradients as
   * bwork; the combine's and the dispatch's gradients, the experts' scratch and the weights'
   * gradients while the backward runs */
  op->fwd_scratch_bytes = add(b, add(b, 3 * rows, rw), 16);
  op->bwork_bytes = add(b, rows, gu);
  op->bwd_scratch_bytes = add(b, 3 * rows, rw);
  op->module_saved_bytes[MODEL_MODULE_MOE_ACT] = act; /* silu(gate) * up from gate and up */
  op->module_flops_fwd[MODEL_MODULE_MOE_ACT] = 5 * rf;
}

/* x (after the final norm) -> loss, [T, hidden, vocab]: logits matmul and cross-entropy (~5
 * FLOPs per logit forward, ~3 backward). Each token's fp32 logits go through memory once a
 * chunk of rows at a time; the backward recomputes them (see saved_bytes below). Tied embeddings: the head uses the embedding's parameters only when
 * both are in one PP region. Across regions each stage holds its own copy (Megatron keeps the
 * word embedding on the last stage too and all-reduces the two gradients), so both count. */
static void emit_head(struct builder *b) {
  struct model *m = b->m;
  struct model_op *op = emit(b, MODEL_OP_LM_HEAD_LOSS, -1, BIT(TENSOR_H), 0);
  int64_t shape[] = {(int64_t)b->T, (int64_t)b->h, m->vocab_size};
  memcpy(op->shape, shape, sizeof shape);
  double tv = (double)b->T * (double)m->vocab_size;
  double mm = 2 * tv * (double)b->h;
  op->flops_fwd = mm + 5 * tv;
  /* BI and BW each recompute the logits and dlogits (one more head GEMM and the exp per logit
   * each) before dh, dw */
  op->flops_bwd_input = 2 * mm + 8 * tv;
  op->flops_bwd_weight = 2 * mm + 8 * tv;
  uint64_t w = mul(b, b->h, u(m->vocab_size));
  set_params(b, op, m->tie_word_embeddings && m->pp_regions == 1 ? 0 : w);
  uint64_t logits = mul3(b, b->T, u(m->vocab_size), 4);
  uint64_t labels_and_loss = add(b, mul(b, b->T, 4), 4);
  op->bytes_fwd = add(b, add(b, mul(b, w, b->B), b->act), add(b, 2 * logits, labels_and_loss));
  /* The kernels keep each token's max logit and 1 / sum of exp (kernels/loss.c: O(T), not the
   * 4*T*V bytes of fp32 probabilities), and the targets; BI and BW recompute the dlogits a
   * chunk of rows at a time in the kernels' own scratch, so nothing is kept between them. */
  op->saved_bytes = add(b, add(b, b->act, mul(b, b->T, 8)), mul(b, b->T, 4));
  op->out_bytes = 4; /* the fp32 loss */
}

static bool layer_is_moe(const struct model *m, int64_t layer) {
  if (m->family == MODEL_FAMILY_MOE)
    return true;
  return m->family == MODEL_FAMILY_DEEPSEEK_V3 && layer >= m->first_k_dense;
}

static void build_ops(struct builder *b) {
  struct model *m = b->m;
  emit_embedding(b);
  for (int32_t l = 0; l < (int32_t)m->num_layers; l++) {
    emit_rmsnorm(b, l);
    if (m->family == MODEL_FAMILY_DEEPSEEK_V3)
      emit_mla(b, l);
    else
      emit_attention(b, l);
    emit_residual(b, l, BIT(TENSOR_X) | BIT(TENSOR_A));
    emit_rmsnorm(b, l);
    if (!layer_is_moe(m, l)) {
      emit_mlp(b, MODEL_OP_MLP, l, u(m->intermediate_size));
      emit_residual(b, l, BIT(TENSOR_X) | BIT(TENSOR_M));
      continue;
    }
    emit_router(b, l);
    unsigned reads = BIT(TENSOR_X) | BIT(TENSOR_M);
    if (m->n_shared_experts > 0) {
      emit_mlp(b, MODEL_OP_SHARED_EXPERT, l,
               mul(b, u(m->moe_intermediate_size), u(m->n_shared_experts)));
      reads |= BIT(TENSOR_S);
    } else if (m->shared_expert_intermediate_size > 0) {
      emit_mlp(b, MODEL_OP_SHARED_EXPERT, l, u(m->shared_expert_intermediate_size));
      if (m->shared_expert_gate)
        add_shared_gate(b, &g_array_index(b->ops, struct model_op, b->ops->len - 1));
      reads |= BIT(TENSOR_S);
    }
    emit_experts(b, l);
    emit_residual(b, l, reads);
  }
  emit_rmsnorm(b, -1);
  emit_head(b);
}

/* PP from the layer's region (embedding first, head last), EP on the k-th expert op, user tags
 * on the ops of their layers, valued by the entry's position among entries of its name. Tags
 * are first laid out per layer so the cost stays linear in layers + entries (entries of one
 * name never overlap). */
static void assign_tags(struct model *m) {
  size_t L = (size_t)m->num_layers;
  int32_t *layer_tags = g_new(int32_t, L * MODEL_MAX_TAGS);
  for (size_t i = 0; i < L * MODEL_MAX_TAGS; i++)
    layer_tags[i] = -1;
  for (int32_t r = 0, l = 0; r < m->pp_regions; r++)
    for (int32_t i = 0; i < m->pp_layers[r]; i++)
      layer_tags[(size_t)l++ * MODEL_MAX_TAGS] = r;
  int32_t count[MODEL_MAX_TAGS] = {0}; /* entries seen per tag name */
  for (uint32_t i = 0; i < m->n_user_tags; i++) {
    const struct model_user_tag *ut = &m->user_tags[i];
    int index = model_tag_index(m, ut->name);
    PIPER_ASSERT(index >= 2);
    int32_t value = count[index]++;
    for (int32_t l = ut->first_layer; l <= ut->last_layer; l++)
      layer_tags[(size_t)l * MODEL_MAX_TAGS + (size_t)index] = value;
  }
  m->op_tags = g_new(int32_t, (size_t)m->n_ops * MODEL_MAX_TAGS);
  int32_t ep = 0;
  for (uint32_t o = 0; o < m->n_ops; o++) {
    const struct model_op *op = &m->ops[o];
    int32_t *t = &m->op_tags[(size_t)o * MODEL_MAX_TAGS];
    if (op->layer >= 0) {
      memcpy(t, &layer_tags[(size_t)op->layer * MODEL_MAX_TAGS], sizeof(int32_t) * MODEL_MAX_TAGS);
    } else {
      for (int i = 0; i < MODEL_MAX_TAGS; i++)
        t[i] = -1;
      t[MODEL_TAG_PP] = op->kind == MODEL_OP_EMBEDDING ? 0 : m->pp_regions - 1;
    }
    if (op->kind == MODEL_OP_EXPERT_FFN)
      t[MODEL_TAG_EP] = ep++;
  }
  m->n_ep_regions = ep;
  g_free(layer_tags);
}

static bool same_tags(const int32_t *a, const int32_t *b) {
  for (int i = 0; i < MODEL_MAX_TAGS; i++)
    if (a[i] != b[i])
      return false;
  return true;
}

/* An attention's, MLP's or shared expert's output is read by the residual add alone, which
 * keeps nothing: when that add is in the same segment the output lives only while F runs. */
static void segments_fwd_outputs(struct builder *b, GArray *segs) {
  struct model *m = b->m;
  for (guint k = 0; k < segs->len; k++) {
    struct model_segment *s = &g_array_index(segs, struct model_segment, k);
    for (uint32_t o = s->op_first; o < s->op_first + s->op_count; o++) {
      enum model_op_kind kind = m->ops[o].kind;
      if (kind != MODEL_OP_ATTENTION && kind != MODEL_OP_MLA_ATTENTION && kind != MODEL_OP_MLP &&
          kind != MODEL_OP_SHARED_EXPERT)
        continue;
      uint8_t out = g_array_index(b->io, struct op_io, o).writes;
      for (uint32_t p = o + 1; p < s->op_first + s->op_count; p++)
        if (g_array_index(b->io, struct op_io, p).reads & out) {
          s->fwd_work_bytes = add(b, s->fwd_work_bytes, m->ops[o].out_bytes);
          m->ops[o].fwd_work_bytes = add(b, m->ops[o].fwd_work_bytes, m->ops[o].out_bytes);
          break;
        }
    }
  }
}

/* A norm output that a later segment reads (the experts', under their EP tag) leaves in the
 * tensor that carries it on: selective recomputation of layernorm drops the copy its segment
 * keeps, and F writes it straight into that tensor (no transient of its own). */
static void segments_norm_outputs(struct builder *b, GArray *segs) {
  struct model *m = b->m;
  for (guint k = 0; k < segs->len; k++) {
    const struct model_segment *s = &g_array_index(segs, struct model_segment, k);
    uint32_t end = s->op_first + s->op_count;
    for (uint32_t o = s->op_first; o < end; o++) {
      if (m->ops[o].kind != MODEL_OP_RMSNORM)
        continue;
      uint8_t out = g_array_index(b->io, struct op_io, o).writes;
      for (uint32_t p = o + 1; p < m->n_ops; p++) {
        const struct op_io *io = &g_array_index(b->io, struct op_io, p);
        if ((io->reads & out) && p >= end)
          m->ops[o].out_leaves_segment = true;
        if (io->writes & out)
          break;
      }
    }
  }
}

static void build_segments(struct builder *b) {
  struct model *m = b->m;
  GArray *segs = g_array_new(FALSE, TRUE, sizeof(struct model_segment));
  for (uint32_t o = 0; o < m->n_ops; o++) {
    const int32_t *t = &m->op_tags[(size_t)o * MODEL_MAX_TAGS];
    if (o == 0 || !same_tags(t, &m->op_tags[(size_t)(o - 1) * MODEL_MAX_TAGS])) {
      struct model_segment s = {.op_first = o};
      memcpy(s.tags, t, sizeof s.tags);
      s.expert = t[MODEL_TAG_EP] >= 0;
      g_array_append_val(segs, s);
    }
    struct model_segment *s = &g_array_index(segs, struct model_segment, segs->len - 1);
    const struct model_op *op = &m->ops[o];
    s->op_count++;
    s->flops_fwd += op->flops_fwd;
    s->flops_bwd_input += op->flops_bwd_input;
    s->flops_bwd_weight += op->flops_bwd_weight;
    s->bytes_fwd = add(b, s->bytes_fwd, op->bytes_fwd);
    s->param_count = add(b, s->param_count, op->param_count);
    s->param_bytes = add(b, s->param_bytes, op->param_bytes);
    s->saved_bytes = add(b, s->saved_bytes, op->saved_bytes);
    /* every op's output gets a gradient (the loss's does not: it starts the backward) */
    if (op->kind != MODEL_OP_LM_HEAD_LOSS)
      s->bwd_keep_bytes = add(b, s->bwd_keep_bytes, op->out_bytes);
    s->bwd_keep_bytes = add(b, s->bwd_keep_bytes, op->bwork_bytes);
    s->fwd_work_bytes = add(b, s->fwd_work_bytes, op->fwd_scratch_bytes);
    m->ops[o].fwd_work_bytes = op->fwd_scratch_bytes;
    s->bwd_scratch_bytes = add(b, s->bwd_scratch_bytes, op->bwd_scratch_bytes);
  }
  segments_fwd_outputs(b, segs);
  segments_norm_outputs(b, segs);
  /* Whole-model totals must fit too (callers sum segments). */
  uint64_t params = 0, saved = 0;
  for (guint i = 0; i < segs->len; i++) {
    params = add(b, params, g_array_index(segs, struct model_segment, i).param_bytes);
    saved = add(b, saved, g_array_index(segs, struct model_segment, i).saved_bytes);
  }
  m->n_segments = segs->len;
  m->segments = (struct model_segment *)g_array_free(segs, FALSE);
}

static int edge_cmp(const void *pa, const void *pb) {
  const struct model_edge *a = pa, *b = pb;
  if (a->src != b->src)
    return a->src < b->src ? -1 : 1;
  if (a->dst != b->dst)
    return a->dst < b->dst ? -1 : 1;
  return 0;
}

/* For each segment and each tensor it reads before writing it, the segment that last wrote it
 * sends it: one edge per (src, dst) pair with the bytes of all tensors it carries. */
static void build_edges(struct builder *b) {
  struct model *m = b->m;
  uint64_t size[TENSOR_COUNT];
  for (int t = 0; t < TENSOR_COUNT; t++)
    size[t] = b->act;
  size[TENSOR_R] = mul3(b, b->T, u(m->experts_per_tok), 8);
  uint32_t writer[TENSOR_COUNT];
  for (int t = 0; t < TENSOR_COUNT; t++)
    writer[t] = UINT32_MAX;
  GArray *edges = g_array_new(FALSE, TRUE, sizeof(struct model_edge));
  for (uint32_t s = 0; s < m->n_segments; s++) {
    const struct model_segment *seg = &m->segments[s];
    guint first_edge = edges->len; /* edges into s are appended from here */
    bool received[TENSOR_COUNT] = {false};
    for (uint32_t o = seg->op_first; o < seg->op_first + seg->op_count; o++) {
      struct op_io io = g_array_index(b->io, struct op_io, o);
      for (int t = 0; t < TENSOR_COUNT; t++) {
        if (!(io.reads & BIT(t)) || writer[t] == UINT32_MAX || writer[t] == s || received[t])
          continue;
        guint e = first_edge;
        while (e < edges->len && g_array_index(edges, struct model_edge, e).src != writer[t])
          e++;
        if (e == edges->len) {
          struct model_edge ne = {.src = writer[t], .dst = s};
          g_array_append_val(edges, ne);
        }
        struct model_edge *edge = &g_array_index(edges, struct model_edge, e);
        edge->bytes = add(b, edge->bytes, size[t]);
        /* The same value is sent once however many ops of s read it. */
        received[t] = true;
      }
      for (int t = 0; t < TENSOR_COUNT; t++)
        if (io.writes & BIT(t))
          writer[t] = s;
    }
  }
  if (edges->len > 1)
    qsort(edges->data, edges->len, sizeof(struct model_edge), edge_cmp);
  m->n_edges = edges->len;
  m->edges = (struct model_edge *)g_array_free(edges, FALSE);
  /* Never NULL, so callers may memcpy/memcmp zero edges without undefined behaviour. */
  if (!m->edges)
    m->edges = g_new0(struct model_edge, 1);
}

bool model_build(struct model *m, const char *ctx, GError **err) {
  struct builder b = {
      .m = m,
      .ops = g_array_new(FALSE, TRUE, sizeof(struct model_op)),
      .io = g_array_new(FALSE, TRUE, sizeof(struct op_io)),
      .h = u(m->hidden_size),
      .B = model_dtype_bytes(m->dtype),
  };
  b.T = u(model_tokens_per_microbatch(m)); /* one CP rank's share of the sequence */
  b.act = mul3(&b, b.T, b.h, b.B);
  build_ops(&b);
  m->n_ops = b.ops->len;
  m->ops = (struct model_op *)g_array_free(b.ops, FALSE);
  assign_tags(m);
  build_segments(&b);
  build_edges(&b);
  g_array_free(b.io, TRUE);
  if (b.overflow)
    return piper_input_error(err,
                     "%s: sizes too large: a byte or parameter count exceeds 2^56 (check "
                     "seq_len, micro_batch_size, vocab_size, hidden and expert sizes)",
                     ctx);
  return true;
}
