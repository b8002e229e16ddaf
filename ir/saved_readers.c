/* Saved activations split by reader: what a forward (or rerun) keeps that only the
 * input-gradient pass (BI) reads, released at BI's end instead of at the weight pass (BW).
 * BW reads the linear layers' inputs and the output gradients (BI's bwork); the attention
 * core's q, k, v (after RoPE, or MLA's up-projections) and the router's probabilities feed
 * only the input gradients (kernels/kernels.h: BW of attention reads h, y and bwork; of the
 * router h and bwork). docs/memory.md, "Saved tensors released by reader". */
#include "ir.h"

/* The module whose selective recomputation rebuilds op's BI-only part (MODEL_MODULE_COUNT:
 * none, the forward always keeps it). */
static int bi_only_module(const struct model_op *op) {
  return op->kind == MODEL_OP_MLA_ATTENTION ? MODEL_MODULE_MLA_UP_PROJ : MODEL_MODULE_COUNT;
}

/* op's BI-only saved bytes on one device holding the whole op: attention's q, k, v
 * (everything it saves but its input and the core's y and lse), MLA's rebuilt q, k, v (what
 * mla_up_proj drops), the router's fp32 probabilities. */
static uint64_t op_bi_only(const struct model *m, const struct model_op *op, uint32_t tp) {
  uint64_t act = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->hidden_size *
                 model_dtype_bytes(m->dtype);
  uint64_t core = op->module_saved_bytes[MODEL_MODULE_CORE_ATTN];
  uint32_t div = tp > 1 ? tp : 1;
  switch (op->kind) {
  case MODEL_OP_ATTENTION: /* divided by heads under TP, as ir_tp_segment_saved_bytes does */
    return op->saved_bytes > act + core ? (op->saved_bytes - act - core) / div : 0;
  case MODEL_OP_MLA_ATTENTION: return op->module_saved_bytes[MODEL_MODULE_MLA_UP_PROJ] / div;
  case MODEL_OP_ROUTER: /* whole on every rank (routes_whole) */
    return (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->num_experts * 4;
  default: return 0;
  }
}

uint64_t ir_bi_only_saved_bytes(const struct model *m, const struct ir_node *n) {
  if (n->kind != IR_NODE_COMPUTE || n->segment >= m->n_segments || ir_ep_sized(n) ||
      n->cp_degree > 1)
    return 0;
  bool full = n->recompute == IR_RECOMPUTE_FULL, rerun = n->pass == IR_PASS_R;
  if (n->pass != IR_PASS_F && !rerun)
    return 0;
  if (full && !rerun) /* F keeps its inputs only, for R */
    return 0;
  uint32_t modules = n->recompute == IR_RECOMPUTE_SELECTIVE ? n->recompute_modules : 0;
  const struct model_segment *s = &m->segments[n->segment];
  uint64_t sum = 0;
  for (uint32_t o = s->op_first; o < s->op_first + s->op_count; o++) {
    const struct model_op *op = &m->ops[o];
    int k = bi_only_module(op);
    bool dropped = k != MODEL_MODULE_COUNT && (modules & MODEL_MODULE_BIT(k));
    /* a selective rerun keeps what it rebuilds; anything else what its forward did not drop */
    bool keeps = rerun && !full ? dropped : !dropped;
    if (keeps)
      sum += op_bi_only(m, op, n->tp_degree);
  }
  return sum;
}
