/* ops_check: which ops of exec/ops.def a plan runs (by their use), and the refusal,
 * before anything runs, of a plan whose backend lacks one of them (ggml's supports_op). */
#include <string.h>

#include "../base/json.h"
#include "exec-impl.h"

/* The use of a model op kind's kernels; EXEC_USE_COUNT for a kind with none of its own. */
static enum exec_op_use kind_use(enum model_op_kind k) {
  switch (k) {
  case MODEL_OP_EMBEDDING: return EXEC_USE_EMBEDDING;
  case MODEL_OP_RMSNORM: return EXEC_USE_RMSNORM;
  case MODEL_OP_ATTENTION: return EXEC_USE_ATTENTION;
  case MODEL_OP_MLA_ATTENTION: return EXEC_USE_MLA_ATTENTION;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: return EXEC_USE_MLP;
  case MODEL_OP_ROUTER:
  case MODEL_OP_EXPERT_FFN: return EXEC_USE_EXPERTS;
  case MODEL_OP_LM_HEAD_LOSS: return EXEC_USE_LM_HEAD;
  default: return EXEC_USE_COUNT; /* residual adds: EXEC_USE_ALWAYS */
  }
}

/* The communication a plan node runs. */
static void node_uses(const struct ir_node *n, bool *uses) {
  switch (n->kind) {
  case IR_NODE_SEND:
  case IR_NODE_RECV: uses[EXEC_USE_POINT_TO_POINT] = true; break;
  case IR_NODE_ALL_TO_ALL: uses[EXEC_USE_ALL_TO_ALL] = true; break;
  case IR_NODE_ALL_REDUCE: uses[EXEC_USE_ALL_REDUCE] = true; break;
  case IR_NODE_REDUCE_SCATTER: uses[EXEC_USE_REDUCE_SCATTER] = true; break;
  case IR_NODE_ALL_GATHER: uses[EXEC_USE_ALL_GATHER] = true; break;
  default: break;
  }
  if (n->recompute == IR_RECOMPUTE_SELECTIVE)
    uses[EXEC_USE_SELECTIVE_RECOMPUTE] = true;
  if (n->tp_degree > 1 && n->kind == IR_NODE_COMPUTE) /* a copies' sum splits its group too */
    uses[EXEC_USE_TENSOR_PARALLEL] = true;
  if (n->cp_degree > 1 && n->kind == IR_NODE_COMPUTE)
    uses[EXEC_USE_CONTEXT_PARALLEL] = true;
}

/* Over the whole plan, not one device's part of it: every rank then refuses alike. */
void exec_plan_uses(const struct plan *p, bool uses[EXEC_USE_COUNT]) {
  for (int u = 0; u < EXEC_USE_COUNT; u++)
    uses[u] = u == EXEC_USE_ALWAYS;
  for (uint32_t o = 0; o < p->model->n_ops; o++) {
    enum exec_op_use u = kind_use(p->model->ops[o].kind);
    if (u != EXEC_USE_COUNT)
      uses[u] = true;
  }
  for (uint32_t k = 0; k < p->n_nodes; k++)
    node_uses(&p->nodes[k], uses);
}

/* Selective recomputation modules the executor reruns (exec/segment_forward.c, rerun_op;
 * moe_act under expert parallelism in exec/expert_parallel.c); mla_up_proj would need an MLA
 * kernel: the simulator costs it, the executor refuses it. (moe is a full rerun of the
 * experts' segments: no module of its own here.) */
#define EXEC_RERUN_MODULES                                                                         \
  (MODEL_MODULE_BIT(MODEL_MODULE_CORE_ATTN) | MODEL_MODULE_BIT(MODEL_MODULE_LAYERNORM) |           \
   MODEL_MODULE_BIT(MODEL_MODULE_MLP) | MODEL_MODULE_BIT(MODEL_MODULE_SHARED_EXPERTS) |            \
   MODEL_MODULE_BIT(MODEL_MODULE_MOE) | MODEL_MODULE_BIT(MODEL_MODULE_MOE_ACT))

bool exec_check_ops(struct exec_backend *b, const struct plan *p, GError **err) {
  /* FP8 GEMMs run on the cuda backend alone (exec/backend_cuda_fp8.c); the host kernels have
   * no FP8 path, and running its GEMMs in fp32 instead would measure another model. (Named
   * here rather than asked of the table: one capability, one backend, no API version bump.) */
  if (p->model->fp8 != MODEL_FP8_NONE && strcmp(exec_backend_name(b), "cuda") != 0)
    return piper_input_error(err,
                             "%s: \"piper.fp8\": \"%s\": the %s backend has no FP8 GEMMs "
                             "(the cuda backend runs them; piper-sim costs them; drop the key "
                             "to train in bf16)",
                             p->model->name, model_fp8_name(p->model->fp8), exec_backend_name(b));
  for (uint32_t k = 0; k < p->n_nodes; k++) {
    uint32_t extra = p->nodes[k].recompute_modules & ~(uint32_t)EXEC_RERUN_MODULES;
    for (int m = 0; m < MODEL_MODULE_COUNT && extra; m++)
      if (extra & MODEL_MODULE_BIT(m))
        return piper_input_error(err,
                                 "selective recomputation of \"%s\" has no kernel on the %s "
                                 "backend (piper-sim costs it; recompute other modules here)",
                                 model_module_name((enum model_module)m), exec_backend_name(b));
  }
  bool uses[EXEC_USE_COUNT], listed[EXEC_USE_COUNT] = {false};
  exec_plan_uses(p, uses);
  for (int op = 0; op < EXEC_OP_COUNT; op++) {
    enum exec_op_use u = exec_op_use((enum exec_op)op);
    listed[u] = true;
    if (uses[u] && !exec_backend_supports_op(b, (enum exec_op)op))
      return piper_input_error(err,
                               "the %s backend has no %s op, which the plan needs for %s "
                               "(exec/ops.def)",
                               exec_backend_name(b), exec_op_name((enum exec_op)op),
                               exec_op_use_name(u));
  }
  /* a use the list has no op for yet (its kernels are still to be written) */
  for (int u = 0; u < EXEC_USE_COUNT; u++)
    if (uses[u] && !listed[u])
      return piper_input_error(err,
                               "%s: the plan needs %s, which no op of exec/ops.def runs yet (the "
                               "%s backend cannot train it; piper-sim costs it)",
                               p->model->name, exec_op_use_name((enum exec_op_use)u),
                               exec_backend_name(b));
  return true;
}
