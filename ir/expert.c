/* ir: what expert parallelism holds on one device (docs/design.md, "The memory rule", for
 * routed rows).
 *
 * The rows an EP device receives depend on the routing, known only at run time. A plan fixes
 * them instead: each device receives at most a capacity of ceil(factor x T x top_k) rows per
 * micro-batch and expert layer (T x top_k is the average: every device sends that many), and
 * the executor allocates every routed-row buffer on the experts' side at the capacity, so that
 * the simulator and the executor hold the same bytes. A step whose routing sends a device more
 * rows than that stops with an error (exec/expert_parallel.c): Piper drops no tokens, so that expert
 * parallelism trains exactly as one device does. The default factor 2.0 never binds at EP 2
 * (a device cannot receive more than 2 x T x top_k rows there) and leaves twice the average on
 * larger groups; Megatron's moe_expert_capacity_factor plays the same part (its default, no
 * capacity, sizes the buffers at run time, which a plan cannot). The sizes below are those the
 * host executor allocates (exec/expert_parallel.c), in the model's dtype. */
#include <math.h>

#include "ir.h"

bool ir_ep_sized(const struct ir_node *n) {
  return n->shard_degree > 1;
}

/* Each expert's intermediate size on one device: under tensor parallelism (EP with TP inside)
 * its gate / up columns and down rows of F / tp; the routed rows stay whole. */
static uint64_t expert_ffn(const struct model *m, const struct ir_node *n) {
  return (uint64_t)m->moe_intermediate_size / (n->tp_degree > 1 ? n->tp_degree : 1);
}

/* The (token, k) routes one device sends a micro-batch: its tokens x top_k, or its sequence
 * shard's where its experts' TP is smaller than the dense layers' (route_split). */
static uint64_t routes(const struct model *m, const struct ir_node *n) {
  uint64_t split = n->route_split > 1 ? n->route_split : 1;
  return (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->experts_per_tok / split;
}

static uint64_t round16(uint64_t b) {
  return (b + 15) & ~(uint64_t)15;
}

uint64_t ir_ep_capacity_rows(const struct model *m, const struct ir_node *n) {
  double f = n->capacity_factor > 0 ? n->capacity_factor : IR_EP_CAPACITY_FACTOR_DEFAULT;
  uint64_t tk = routes(m, n), most = tk * (n->shard_degree ? n->shard_degree : 1);
  double rows = ceil(f * (double)tk);
  return rows >= (double)most ? most : (uint64_t)rows;
}

uint64_t ir_ep_rows_bytes(const struct model *m, const struct ir_node *n) {
  return ir_ep_capacity_rows(m, n) * (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
}

/* A saved routed row's input: at the model's dtype, or under DeepSeek-V3's FP8 caching
 * (fp8_expert_inputs) 1 byte an element and one fp32 scale per 1 x 128 tile, as DeepSeek
 * quantises activations (DeepSeek-V3 technical report, 2024, section 3.3). */
static uint64_t input_row_bytes(const struct model *m, const struct ir_node *n) {
  uint64_t h = (uint64_t)m->hidden_size;
  return n->fp8_expert_inputs ? h + 4 * ((h + 127) / 128) : h * model_dtype_bytes(m->dtype);
}

/* kernels_expert_ffn_saved_floats: each row's input, gate and up, silu(gate) * up times the
 * row's routing weight (the experts apply it, Megatron-Core's weighted SwiGLU), and that
 * weight in fp32 */
uint64_t ir_ep_saved_bytes(const struct model *m, const struct ir_node *n) {
  uint64_t f = expert_ffn(m, n);
  return ir_ep_capacity_rows(m, n) *
         (input_row_bytes(m, n) + 3 * f * model_dtype_bytes(m->dtype) + 4);
}

/* The received rows' routing weights (F, beside the rows) or their gradients (B, beside the
 * rows' gradients), fp32 at the capacity */
uint64_t ir_ep_weights_bytes(const struct model *m, const struct ir_node *n) {
  return round16(ir_ep_capacity_rows(m, n) * 4);
}

/* F: scratch of a row each; B: bwork (the rows' gradients, dgate, dup) and scratch; BI:
 * scratch, keeping bwork for BW; BW: nothing. Under FP8 caching (fp8_expert_inputs) the rows'
 * inputs at the dtype besides, a row each: in F (and R) the copy its GEMMs read, grouped by
 * expert, before it is cast into the cache; in B and BW the copy dequantised from the cache
 * that the weight gradient reads (BI does not read the inputs). */
uint64_t ir_ep_work_bytes(const struct model *m, const struct ir_node *n, uint64_t *keep) {
  uint64_t h = (uint64_t)m->hidden_size, f = expert_ffn(m, n);
  uint64_t rows = ir_ep_capacity_rows(m, n), B = model_dtype_bytes(m->dtype);
  uint64_t scratch = rows * h * B, bwork = rows * (h + 2 * f) * B;
  uint64_t inputs = n->fp8_expert_inputs ? rows * h * B : 0;
  if (keep)
    *keep = n->pass == IR_PASS_BI ? bwork : 0;
  switch (n->pass) {
  case IR_PASS_F:
  case IR_PASS_R: return scratch + inputs;
  case IR_PASS_BI: return scratch;
  case IR_PASS_B: return bwork + scratch + inputs;
  case IR_PASS_BW: return inputs;
  default: return 0;
  }
}

/* int32 route row per (token, k) and expert per received row */
uint64_t ir_ep_route_bytes(const struct model *m, const struct ir_node *n) {
  return round16(routes(m, n) * 4) + round16(ir_ep_capacity_rows(m, n) * 4);
}

uint64_t ir_ep_combine_bytes(const struct model *m, const struct ir_node *n) {
  return routes(m, n) * (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
}

/* Into the experts: the dispatch's rows, their experts and routing weights and one count per
 * peer in F, the output gradients' rows in B; out of them: the expert outputs received in F
 * (summed by the combine, kept by nobody), the input gradients' rows and their routing
 * weights' gradients in B. */
uint64_t ir_ep_a2a_work_bytes(const struct model *m, const struct ir_node *n, bool into) {
  uint64_t rows = ir_ep_combine_bytes(m, n), per_route = round16(routes(m, n) * 4);
  bool forward = n->pass == IR_PASS_F || n->pass == IR_PASS_R;
  if (forward && into)
    return rows + 2 * per_route + round16((uint64_t)n->shard_degree * 4);
  return into || forward ? rows : rows + per_route;
}

uint64_t ir_node_module_bytes(const struct model *m, const struct ir_node *n, uint32_t modules) {
  if (!ir_ep_sized(n))
    return ir_tp_segment_module_bytes(m, n->segment, n->tp_degree, modules);
  if (!(modules & MODEL_MODULE_BIT(MODEL_MODULE_MOE_ACT)))
    return 0;
  return ir_ep_capacity_rows(m, n) * expert_ffn(m, n) * model_dtype_bytes(m->dtype);
}
