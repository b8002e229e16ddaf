/* ir: what tensor parallelism leaves on one device (Megatron-LM's column / row layout,
 * Shoeybi et al. 2019; sequence parallelism, Korthikanti et al. 2022). The rewrite that uses it
 * is directives/tensor_parallel.c; the simulator and the plan reader use the same formulas so
 * that they cannot disagree with the compiler. */
#include <string.h>

#include "ir.h"

static bool op_divided(enum model_op_kind k) {
  switch (k) {
  case MODEL_OP_EMBEDDING:     /* vocabulary-parallel rows */
  case MODEL_OP_ATTENTION:     /* heads (Q/K/V columns, output rows) */
  case MODEL_OP_MLA_ATTENTION: /* heads of q_b / kv_b / o and the core */
  case MODEL_OP_MLP:           /* up/gate columns, down rows */
  case MODEL_OP_SHARED_EXPERT:
  case MODEL_OP_EXPERT_FFN:   /* every expert's FFN, like the MLP */
  case MODEL_OP_LM_HEAD_LOSS: /* vocabulary-parallel logits and cross-entropy */
    return true;
  default: return false; /* RMSNorm, residual add, router: replicated */
  }
}

double ir_tp_op_share(const struct model_op *op, uint32_t tp, bool sequence_parallel) {
  if (tp <= 1)
    return 1.0;
  if (op_divided(op->kind) || sequence_parallel)
    return 1.0 / (double)tp;
  return 1.0;
}

uint64_t ir_tp_segment_param_bytes(const struct model *m, uint32_t segment, uint32_t tp) {
  const struct model_segment *s = &m->segments[segment];
  if (tp <= 1)
    return s->param_bytes;
  uint64_t sum = 0;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++) {
    const struct model_op *op = &m->ops[i];
    sum += op_divided(op->kind) ? op->param_bytes / tp : op->param_bytes;
  }
  return sum;
}

/* One intermediate value of every routed row (T x top_k x moe_intermediate_size). */
static uint64_t expert_row_bytes(const struct model *m) {
  return (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->experts_per_tok *
         (uint64_t)m->moe_intermediate_size * model_dtype_bytes(m->dtype);
}

/* The part of an op's saved activations that TP alone leaves whole on every rank: the
 * replicated [T, hidden] inputs of the divided blocks (sequence parallelism divides them too),
 * and everything the replicated ops save. */
static uint64_t saved_whole(const struct model *m, const struct model_op *op) {
  uint64_t act = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->hidden_size *
                 model_dtype_bytes(m->dtype);
  switch (op->kind) {
  case MODEL_OP_ATTENTION:
  case MODEL_OP_MLA_ATTENTION:
  case MODEL_OP_MLP: return op->saved_bytes < act ? op->saved_bytes : act;
  case MODEL_OP_SHARED_EXPERT: return 0; /* its gate/up only */
  case MODEL_OP_LM_HEAD_LOSS: {
    /* the kept fp32 probabilities are the rank's vocabulary slice; its input and what it keeps
     * per token (targets, a log-sum-exp) are whole */
    uint64_t probs = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->vocab_size * 4;
    return op->saved_bytes >= act + probs ? op->saved_bytes - probs : op->saved_bytes;
  }
  case MODEL_OP_EXPERT_FFN: {
    /* routed rows, routing and expert outputs whole; the gate, up and silu(gate) * up per row
     * divided (kernels_expert_ffn_saved_floats at F / tp) */
    uint64_t f = expert_row_bytes(m);
    return op->saved_bytes > 3 * f ? op->saved_bytes - 3 * f : 0;
  }
  default: return op->saved_bytes;
  }
}

/* [T, hidden] of the model's dtype. */
static uint64_t act_bytes(const struct model *m) {
  return (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->hidden_size *
         model_dtype_bytes(m->dtype);
}

/* Under sequence parallelism the router and the experts still run on the whole sequence (the
 * router on its gathered input): each rank's expert slices read every token's route, as
 * Megatron's experts under SP get the tokens of the whole TP group. So their routing, probs,
 * routed rows and outputs stay whole on every rank. */
static bool routes_whole(enum model_op_kind k) {
  return k == MODEL_OP_ROUTER || k == MODEL_OP_EXPERT_FFN;
}

uint64_t ir_tp_segment_saved_bytes(const struct model *m, uint32_t segment, uint32_t tp,
                                   bool sequence_parallel) {
  const struct model_segment *s = &m->segments[segment];
  if (tp <= 1)
    return s->saved_bytes;
  uint64_t sum = 0;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++) {
    const struct model_op *op = &m->ops[i];
    if (op->kind == MODEL_OP_EMBEDDING) { /* token ids: every rank needs them all */
      sum += op->saved_bytes;
      continue;
    }
    uint64_t whole = saved_whole(m, op);
    uint64_t divided = op->saved_bytes - whole;
    if (sequence_parallel && routes_whole(op->kind)) {
      /* only the router's input is a sequence shard */
      uint64_t h = op->kind == MODEL_OP_ROUTER ? act_bytes(m) : 0;
      sum += divided / tp + (whole - h) + h / tp;
      continue;
    }
    sum += divided / tp + (sequence_parallel ? whole / tp : whole);
  }
  return sum;
}

/* What ops [first, end) drop under modules, per device (the cores divided by heads); with
 * transient, only what F then holds until its group ends (a norm output that leaves the
 * segment lives in the tensor that carries it instead). */
static uint64_t ops_module_bytes(const struct model *m, uint32_t first, uint32_t end, uint32_t tp,
                                 uint32_t modules, bool transient) {
  uint64_t b = 0;
  for (uint32_t o = first; o < end; o++)
    for (int k = 0; k < MODEL_MODULE_COUNT; k++)
      if ((modules & MODEL_MODULE_BIT(k)) &&
          !(transient && k == MODEL_MODULE_LAYERNORM && m->ops[o].out_leaves_segment))
        b += m->ops[o].module_saved_bytes[k];
  return tp > 1 ? b / tp : b;
}

uint64_t ir_tp_segment_module_bytes(const struct model *m, uint32_t segment, uint32_t tp,
                                    uint32_t modules) {
  const struct model_segment *s = &m->segments[segment];
  return ops_module_bytes(m, s->op_first, s->op_first + s->op_count, tp, modules, false);
}

double ir_segment_module_flops(const struct model *m, uint32_t segment, uint32_t modules) {
  const struct model_segment *s = &m->segments[segment];
  double f = 0;
  for (uint32_t o = s->op_first; o < s->op_first + s->op_count; o++)
    for (int k = 0; k < MODEL_MODULE_COUNT; k++)
      if (modules & MODEL_MODULE_BIT(k))
        f += m->ops[o].module_flops_fwd[k];
  return f;
}

void ir_tp_segment_comm(const struct model *m, uint32_t segment, enum ir_pass pass,
                        uint64_t *bytes, uint32_t *count) {
  const struct model_segment *s = &m->segments[segment];
  uint64_t T = (uint64_t)model_tokens_per_microbatch(m);
  uint64_t act = T * (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
  *bytes = 0;
  *count = 0;
  if (pass == IR_PASS_BW || pass == IR_PASS_NONE)
    return; /* weight gradients are local to each slice */
  bool fwd = pass == IR_PASS_F;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++) {
    switch (m->ops[i].kind) {
    case MODEL_OP_ATTENTION:
    case MODEL_OP_MLA_ATTENTION:
    case MODEL_OP_MLP:
    case MODEL_OP_SHARED_EXPERT:
    case MODEL_OP_EXPERT_FFN:
      /* F: after the row-parallel output; B: the input gradient of the column-parallel input */
      *bytes += act;
      *count += 1;
      break;
    case MODEL_OP_EMBEDDING:
      if (fwd) { /* each rank looked up only its vocabulary rows */
        *bytes += act;
        *count += 1;
      }
      break;
    case MODEL_OP_LM_HEAD_LOSS:
      if (fwd) { /* parallel cross-entropy: max, sum of exp and target logit, fp32 per token */
        *bytes += 3 * T * 4;
        *count += 3;
      } else { /* the head's input gradient, summed over the vocabulary slices */
        *bytes += act;
        *count += 1;
      }
      break;
    default: break;
    }
  }
}

bool ir_tp_check_model(const struct model *m, uint32_t tp, bool sequence_parallel, char *why,
                       size_t len) {
  if (tp <= 1)
    return true;
  const struct {
    const char *key;
    int64_t value;
  } dims[] = {
      {"num_attention_heads", m->num_heads},
      {"num_key_value_heads",
       m->family == MODEL_FAMILY_DEEPSEEK_V3 ? m->num_heads : m->num_kv_heads},
      {"intermediate_size", m->intermediate_size},
      {"moe_intermediate_size", m->moe_intermediate_size},
      {"vocab_size", m->vocab_size},
      {"tokens per micro-batch (seq_len x micro_batch_size)",
       sequence_parallel ? model_tokens_per_microbatch(m) : 0},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(dims); k++)
    if (dims[k].value > 0 && dims[k].value % (int64_t)tp != 0) {
      g_snprintf(why, len, "%u does not divide %s = %lld", tp, dims[k].key,
                 (long long)dims[k].value);
      return false;
    }
  return true;
}

/* Under sequence parallelism the divided ops read their input whole, and their backward the
 * output gradient: each all-gathered from the sequence shards into a [T, hidden] buffer that
 * lives while the op group runs (Megatron's all-gather output; the host executor allocates the
 * same, again for each group). The input where it is read: the forward, the weight gradients,
 * and the LM head's recomputed logits; the output gradient in every backward pass but the
 * embedding's BI (it has no input gradient). Ops [first, end) of one group. */
static uint64_t sp_gathered(const struct model *m, uint32_t first, uint32_t end,
                            enum ir_pass pass) {
  bool input = false, dout = false, backward = pass != IR_PASS_F;
  for (uint32_t i = first; i < end; i++)
    switch (m->ops[i].kind) {
    case MODEL_OP_ATTENTION:
    case MODEL_OP_MLA_ATTENTION:
    case MODEL_OP_MLP:
    case MODEL_OP_SHARED_EXPERT:
      input = input || pass != IR_PASS_BI;
      dout = dout || backward;
      break;
    case MODEL_OP_EXPERT_FFN: /* its backward reads the routed rows it saved, not its input */
      input = input || pass == IR_PASS_F || pass == IR_PASS_R;
      dout = dout || pass == IR_PASS_B || pass == IR_PASS_BI;
      break;
    case MODEL_OP_EMBEDDING: dout = dout || pass == IR_PASS_B || pass == IR_PASS_BW; break;
    case MODEL_OP_LM_HEAD_LOSS: input = true; break;
    default: break;
    }
  uint64_t act = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->hidden_size *
                 model_dtype_bytes(m->dtype);
  return ((uint64_t)input + (uint64_t)dout) * act;
}

/* One op group's transients on one device (ir_tp_segment_work): F's scratch and outputs
 * nothing keeps, the gradients of its values and bwork (what B holds and BI keeps), and the
 * backward's scratch. At tp <= 1 the model's own figures. */
struct group_work {
  double fwd, keep, scratch;
};

static void op_work(const struct model *m, const struct model_op *op, uint32_t tp,
                    bool sequence_parallel, struct group_work *w) {
  if (tp <= 1) {
    w->fwd += (double)op->fwd_work_bytes;
    if (op->kind != MODEL_OP_LM_HEAD_LOSS)
      w->keep += (double)op->out_bytes;
    w->keep += (double)op->bwork_bytes;
    w->scratch += (double)op->bwd_scratch_bytes;
    return;
  }
  double values = sequence_parallel ? 1.0 / tp : 1.0;            /* [T, hidden] between ops */
  bool whole = sequence_parallel && op->kind == MODEL_OP_ROUTER; /* routes_whole */
  double share = whole ? 1.0 : ir_tp_op_share(op, tp, sequence_parallel);
  double outputs = (double)op->fwd_work_bytes - (double)op->fwd_scratch_bytes;
  w->fwd += values * outputs; /* outputs nothing keeps */
  if (op->kind != MODEL_OP_LM_HEAD_LOSS)
    w->keep += (whole ? 1.0 : values) * (double)op->out_bytes;
  if (op->kind == MODEL_OP_EXPERT_FFN) {
    /* the routed rows, their gradients and the combine's whole on every rank (the host
     * executor's local experts); only dgate and dup per row are divided */
    double gu = 2.0 * (double)expert_row_bytes(m);
    w->fwd += (double)op->fwd_scratch_bytes;
    w->keep += (double)op->bwork_bytes - gu + gu / tp;
    w->scratch += (double)op->bwd_scratch_bytes;
    return;
  }
  w->fwd += share * (double)op->fwd_scratch_bytes;
  w->keep += share * (double)op->bwork_bytes;
  w->scratch += share * (double)op->bwd_scratch_bytes;
}

/* What one group of ops [first, end) holds in pass; *seg_keep sums the keep of the whole
 * segment in op order (BI's saved tensor keeps every group's for BW). A fused B of a group
 * after the segment's first also holds the gradient of the value the group before handed it
 * (the residual stream, [T, hidden]): the group writes it, the group before reads it. */
static uint64_t group_work(const struct model *m, uint32_t first, uint32_t end, bool later,
                           enum ir_pass pass, uint32_t tp, bool sequence_parallel,
                           double *seg_keep) {
  struct group_work w = {0};
  for (uint32_t i = first; i < end; i++) {
    double k0 = w.keep;
    op_work(m, &m->ops[i], tp, sequence_parallel, &w);
    *seg_keep += w.keep - k0;
  }
  double values = tp > 1 && sequence_parallel ? 1.0 / tp : 1.0;
  double carried = later ? values * (double)act_bytes(m) : 0;
  uint64_t gathered = tp > 1 && sequence_parallel ? sp_gathered(m, first, end, pass) : 0;
  /* under SP a norm's weight gradient is summed over the group from a [hidden] part of each
   * device's shard (the host executor's, once a group) in B and BW */
  bool norm = false;
  for (uint32_t i = first; i < end; i++)
    norm = norm || m->ops[i].kind == MODEL_OP_RMSNORM;
  if (norm && (pass == IR_PASS_B || pass == IR_PASS_BW) && tp > 1 && sequence_parallel)
    gathered += (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
  return gathered + (pass == IR_PASS_F    ? (uint64_t)w.fwd
                     : pass == IR_PASS_B  ? (uint64_t)(w.keep + carried) + (uint64_t)w.scratch
                     : pass == IR_PASS_BI ? (uint64_t)w.scratch
                                          : 0);
}

/* The most any group of segment holds in pass; with modules, each group's F also holds what
 * selective recomputation's F drops when the group ends, and R holds only what its reruns of
 * the group hold while they run (the rest goes into its saved tensor). */
static uint64_t segment_most(const struct model *m, uint32_t segment, enum ir_pass pass,
                             uint32_t tp, bool sequence_parallel, uint32_t modules,
                             double *seg_keep) {
  const struct model_segment *s = &m->segments[segment];
  uint32_t end = s->op_first + s->op_count;
  uint64_t most = 0;
  /* a backward frees block by block (model_bwd_group_end), a forward layer by layer */
  bool bwd = pass == IR_PASS_B || pass == IR_PASS_BI || pass == IR_PASS_BW;
  for (uint32_t g = s->op_first, g_end; g < end; g = g_end) {
    g_end = bwd ? model_bwd_group_end(m, g, end) : model_group_end(m, g, end);
    uint64_t b = 0;
    if (pass == IR_PASS_R) {
      for (uint32_t o = g; o < g_end; o++)
        for (int k = 0; k < MODEL_MODULE_COUNT; k++)
          if (modules & MODEL_MODULE_BIT(k))
            b += m->ops[o].module_rerun_work_bytes[k];
    } else {
      b = group_work(m, g, g_end, g > s->op_first, pass, tp, sequence_parallel, seg_keep) +
          ops_module_bytes(m, g, g_end, tp, modules, true);
    }
    most = b > most ? b : most;
  }
  return most;
}

uint64_t ir_tp_segment_work_modules(const struct model *m, uint32_t segment, enum ir_pass pass,
                                    uint32_t tp, bool sequence_parallel, uint32_t modules) {
  double seg_keep = 0;
  return segment_most(m, segment, pass, tp, sequence_parallel, modules, &seg_keep);
}

uint64_t ir_tp_segment_work(const struct model *m, uint32_t segment, enum ir_pass pass, uint32_t tp,
                            bool sequence_parallel, uint64_t *keep) {
  const struct model_segment *s = &m->segments[segment];
  double seg_keep = 0;
  uint64_t most = segment_most(m, segment, pass, tp, sequence_parallel, 0, &seg_keep);
  if (keep)
    *keep = tp > 1 ? (uint64_t)seg_keep : s->bwd_keep_bytes;
  return most;
}
