/* ir: what context parallelism moves and holds on one device (ring attention: Liu et al. 2023,
 * "Ring Attention with Blockwise Transformers"; Megatron-LM / Transformer Engine's cp_comm_type
 * p2p, and the K/V all-gather Llama 3 used, Dubey et al. 2024, section 3.3.2). The ops of a CP
 * model are already one rank's share (models/build.c); these are the K/V exchanges its
 * attention adds. The rewrite that uses them is directives/context_parallel.c; the plan reader
 * and lowering use the same formulas, so they cannot disagree with the compiler. */
#include "ir.h"

/* K and V of one attention op over the whole sequence on one TP rank (bytes): what a rank
 * sees of the other ranks' keys and values, its own chunks included. 0 for other ops. */
static uint64_t op_kv_bytes(const struct model *m, const struct model_op *op, uint32_t tp) {
  uint64_t cp = m->context_parallel > 1 ? (uint64_t)m->context_parallel : 1;
  uint64_t t = tp > 1 ? tp : 1, e = model_dtype_bytes(m->dtype);
  const int64_t *sh = op->shape; /* [batch, this rank's seq, heads, ...] (models/model.h) */
  uint64_t tokens = (uint64_t)sh[0] * (uint64_t)sh[1] * cp;
  if (op->kind == MODEL_OP_ATTENTION) /* GQA: kv_heads x head_dim each of K and V */
    return 2 * tokens * ((uint64_t)sh[3] / t) * (uint64_t)sh[4] * e;
  if (op->kind == MODEL_OP_MLA_ATTENTION) /* MLA's decompressed K (qk) and V (v) per head */
    return tokens * ((uint64_t)sh[2] / t) * ((uint64_t)sh[5] + (uint64_t)sh[6]) * e;
  return 0;
}

void ir_cp_segment_kv(const struct model *m, uint32_t segment, uint32_t tp, uint64_t *kv_bytes,
                      uint32_t *layers) {
  const struct model_segment *s = &m->segments[segment];
  *kv_bytes = 0;
  *layers = 0;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++) {
    uint64_t kv = op_kv_bytes(m, &m->ops[i], tp);
    *kv_bytes += kv;
    *layers += kv > 0;
  }
}

uint64_t ir_cp_buffer_bytes(const struct model *m, uint32_t segment, enum ir_pass pass,
                            uint32_t tp, enum ir_cp_comm comm) {
  if (m->context_parallel <= 1 || pass == IR_PASS_BW || pass == IR_PASS_NONE)
    return 0;
  const struct model_segment *s = &m->segments[segment];
  uint64_t cp = (uint64_t)m->context_parallel, most = 0;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++) {
    uint64_t kv = op_kv_bytes(m, &m->ops[i], tp);
    if (kv > most)
      most = kv;
  }
  /* One layer at a time. The all-gather holds the whole sequence's K/V, backward its dK/dV
   * too before the reduce-scatter. The ring (exec/context_parallel.c) holds, besides the rank's
   * own K/V, a block of one rank's K/V (most / cp) arriving while it attends to the one it
   * holds: two buffers in turn, one at cp 2 (whose only exchange brings the other rank's).
   * Backward adds two dK/dV blocks: one a step's gradients go into while the previous step's
   * sum leaves from another and the next sum arrives in the third, which is the attention's
   * own dK/dV (its backward workspace already). */
  bool bwd = pass == IR_PASS_B || pass == IR_PASS_BI;
  if (comm == IR_CP_ALL_GATHER)
    return bwd ? 2 * most : most;
  uint64_t kv_blocks = cp - 1 < 2 ? cp - 1 : 2;
  return (kv_blocks + (bwd ? 2 : 0)) * (most / cp);
}
