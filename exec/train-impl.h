/* train-impl: what the sources that run one instruction share: the memory rule's owners and
 * buffers (memory.c), where parameters and gradients live (params.c), a segment run's state
 * (segment_forward.c, segment_backward.c), the TP collectives' buffers (tp.c), and what every
 * kind of instruction calls (expert_parallel.c, transfer.c, optimizer.c; train.c dispatches). */
#ifndef PIPER_EXEC_TRAIN_IMPL_H
#define PIPER_EXEC_TRAIN_IMPL_H

#include "exec-impl.h"

#define TC EXEC_T_COUNT

/* ---- memory.c: the memory rule ------------------------------------------------------------
 *
 * Owners of a device buffer besides a plan tensor (its index): the running instruction
 * (OWN_WORK) and the micro-batch (OWN_MB); see memory.c. */
#define OWN_WORK IR_NONE
#define OWN_MB (IR_NONE - 1u)
/* The running instruction's too, but held until it ends whatever group it was allocated in
 * (what a forward under full recomputation saves and drops at its end). */
#define OWN_STAY (IR_NONE - 2u)
/* exec_block.group of OWN_STAY's blocks */
#define EXEC_GROUP_STAY UINT32_MAX
/* exec_state.gathered_users of a gather whose buffer is its plan tensor's */
#define GATHER_TENSOR UINT32_MAX

/* A device buffer (never NULL, even for 0 bytes) owned by `owner`: zeroed when asked, else with
 * undefined contents (NaN under poisoning, so a kernel that reads what it did not write, or a
 * buffer used after its release, shows up in the equivalence tests). */
void *exec_mb_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                     uint32_t owner, size_t bytes, enum report_mem_kind kind, bool zero);
/* The running instruction's op group `group` has ended: its workspace blocks go back (the
 * TP buffers among them are allocated again by the next group that needs them). */
void exec_work_group_end(struct exec_state *s, struct exec_task_ctx *st, uint32_t group);
/* Host memory of the micro-batch, zeroed: what the CPU reads (pointer tables, expert-parallel
 * state, all-to-all counts). Not device memory, so not in the figures. */
void *exec_mb_host(struct exec_state *s, struct exec_mb *mb, size_t bytes,
                   enum report_mem_kind kind);

/* Device floats written in full before they are read. */
static inline float *mb_floats_raw(struct exec_state *s, struct exec_task_ctx *st,
                                   struct exec_mb *mb, uint32_t owner, size_t n) {
  return exec_mb_buffer(s, st, mb, owner, n * sizeof(float), REPORT_MEM_ACTIVATIONS, false);
}

/* Device floats, zeroed. */
static inline float *mb_floats(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                               uint32_t owner, size_t n) {
  return exec_mb_buffer(s, st, mb, owner, n * sizeof(float), REPORT_MEM_ACTIVATIONS, true);
}

static inline void *mb_raw(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                           uint32_t owner, size_t bytes, enum report_mem_kind kind) {
  return exec_mb_buffer(s, st, mb, owner, bytes, kind, false);
}

/* The tensor of kind k instruction i writes (the first), or OWN_WORK. */
uint32_t exec_written_tensor(const struct exec_state *s, uint32_t i, enum plan_tensor_kind k);
/* The buffer of a compute's TP collectives: the tensor its TP node reads (exec_tp_buffer). */
bool exec_is_tp_buffer(const struct exec_state *s, const struct plan_tensor *pt);
/* The plan tensor that carries value t out of instruction i: an "out" tensor whose consumer
 * reads t through its edge (else, unless exact, i's first "out" tensor); OWN_WORK (exact) or
 * OWN_MB when there is none. */
uint32_t exec_out_tensor_of(const struct exec_state *s, uint32_t i, enum exec_tensor t, bool exact);

static inline uint32_t out_tensor(const struct exec_state *s, uint32_t i, enum exec_tensor t) {
  return exec_out_tensor_of(s, i, t, false);
}

/* The "out" tensor of all-to-all i read by the expert segment's instructions (experts true) or
 * by the other side's; OWN_MB when there is none. */
uint32_t exec_a2a_out_tensor(const struct exec_state *s, uint32_t i, bool experts);

static inline size_t slot_of(uint32_t i, int t) {
  return (size_t)i * TC + (size_t)t;
}

/* Instruction i has ended: its workspace goes, and what it was the last use of. */
void exec_instr_memory_done(struct exec_state *s, uint32_t i, struct exec_task_ctx *st);

/* Input tensor t of model edge e for this micro-batch: computed here, or received. Which one
 * is a property of the micro-batch, not of the segment: DualPipe runs a segment here for some
 * micro-batches and on another device for the others. */
static inline float *edge_value(struct exec_state *s, struct exec_mb *mb, uint32_t e,
                                enum exec_tensor t) {
  float *local = mb->out[(size_t)s->xm->m->edges[e].src * TC + t];
  return local ? local : mb->in_val[(size_t)e * TC + t];
}

/* ---- params.c: where parameters and gradients live ------------------------------------------- */

/* Where flat index `flat` of a store lives on the device; it must be stored here. */
static inline float *stored(const struct exec_state *s, float *base, enum exec_store which,
                            uint64_t flat) {
  uint64_t at = exec_store_index(s->dev, which, flat);
  PIPER_ASSERT(at != EXEC_NOT_STORED);
  return base + at;
}

/* The gradient accumulator of bucket b under ZeRO-2/3, made (zeroed) by its first weight
 * gradient of the step. Counted as communication memory: it is the reduce-scatter's input,
 * and after it only the shard stays. One rank's instructions run on one host thread (the
 * backend's event loop), so the first use cannot race. */
float *exec_grad_accumulator(struct exec_state *s, struct exec_task_ctx *st, uint32_t b);
void exec_grad_accumulator_release(struct exec_state *s, uint32_t b);
/* Where segment seg's weight gradients accumulate. */
float *exec_grads_of(struct exec_state *s, struct exec_task_ctx *st, uint32_t seg);
/* The parameters compute x reads: gathered for it (ZeRO-3), else the stored ones. */
const float *exec_params_of(struct exec_state *s, const struct exec_instr *x);

/* ---- a segment run (segment_forward.c, segment_backward.c) ----------------------------------- */

/* The expert op of a segment run on one device (no expert parallelism): dispatch, experts,
 * combine all local. */
struct local_moe {
  int32_t *counts, *route_row, *row_expert;
  float *rows, *y, *scratch;
  /* the experts' silu(gate)·up where selective recomputation (moe_act) holds it apart from
   * their saved rows, gate and up: F's transient, then R's rebuilt copy; NULL: inside saved */
  float *act;
};

struct exec_seg_run {
  float **val, **dval;
  float **saved, **bwork;
  struct local_moe **moe;
  /* per op: an attention's lse and y where selective recomputation keeps them apart from
   * its saved q, k, v (kernels_attention_dims.core); NULL: inside saved */
  float **core;
  /* per value: the copy of an input that a forward under full recomputation keeps for its
   * rerun (the only thing it keeps); NULL elsewhere */
  float **kept_in;
  /* a forward under full recomputation: its values went with its workspace */
  bool dropped;
};

/* Time in kernels (KT) and in communication (CT) of the task st. */
#define KT(st, s, call)                                                                            \
  do {                                                                                             \
    double kt0_ = exec_backend_clock((s)->b);                                                      \
    call;                                                                                          \
    (st)->kernel_s += exec_backend_clock((s)->b) - kt0_;                                           \
  } while (0)

#define CT(st, s, ok, call)                                                                        \
  do {                                                                                             \
    double ct0_ = exec_backend_clock((s)->b);                                                      \
    ok = (call);                                                                                   \
    (st)->comm_s += exec_backend_clock((s)->b) - ct0_;                                             \
  } while (0)

static inline bool internal(GError **err, const struct exec_state *s, uint32_t i,
                            const char *what) {
  char nb[256];
  plan_node_name(s->dev->plan, s->dev->instrs[i].node, nb, sizeof nb);
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "rank %u: instruction %u \"%s\": %s",
              s->dev->device, i, nb, what);
  return false;
}

static inline struct exec_comm *comm_of(struct exec_state *s, uint32_t i) {
  uint32_t c = s->dev->instrs[i].comm;
  return c == IR_NONE ? NULL : s->comms[c];
}

/* How a forward instruction keeps what its backward reads (ir_node.recompute, docs/directives.md):
 * plainly; under full recomputation F keeps only copies of its inputs and R rebuilds the rest;
 * under selective both keep all but the attention core, which F drops and R reruns alone. */
enum fwd_keep { FWD_PLAIN, FWD_FULL_DROP, FWD_FULL_RERUN, FWD_SELECTIVE_DROP, FWD_SELECTIVE_RERUN };

static inline enum fwd_keep fwd_keep_of(const struct exec_state *s, const struct exec_instr *x) {
  enum ir_recompute rc = s->dev->plan->nodes[x->node].recompute;
  bool rerun = x->pass == IR_PASS_R;
  if (rc == IR_RECOMPUTE_FULL)
    return rerun ? FWD_FULL_RERUN : FWD_FULL_DROP;
  if (rc == IR_RECOMPUTE_SELECTIVE)
    return rerun ? FWD_SELECTIVE_RERUN : FWD_SELECTIVE_DROP;
  return FWD_PLAIN;
}

/* Of a forward's two saved tensors (ir/lower.c, instr_split_saved: lowering lists the one BW
 * reads first, so exec_written_tensor finds it), the one no weight pass (BW) reads, released
 * when the input-gradient pass ends; OWN_WORK where the plan keeps everything in one. */
uint32_t exec_bi_only_tensor(const struct exec_state *s, uint32_t i);
/* The owner of what instruction i saves for a backward: its saved tensor, or the micro-batch
 * where the plan has none on this device. */
static inline uint32_t saved_owner(const struct exec_state *s, uint32_t i) {
  uint32_t t = exec_written_tensor(s, i, PLAN_TENSOR_SAVED);
  return t == OWN_WORK ? OWN_MB : t;
}

/* Whether op j of segment es starts an op group (model_group_end) after the segment's first:
 * the group before it ends there, and its transients go (exec_work_group_end). */
static inline bool exec_group_starts(const struct exec_state *s, const struct exec_segment *es,
                                     uint32_t j) {
  if (j == 0 || j >= es->n_ops)
    return false;
  uint32_t prev = es->ops[j - 1].op;
  return model_group_end(s->xm->m, prev, es->ops[j].op + 1) == es->ops[j].op;
}

/* exec_group_starts for a backward: its groups are a layer's blocks (model_bwd_group_end). */
static inline bool exec_bwd_group_starts(const struct exec_state *s,
                                         const struct exec_segment *es, uint32_t j) {
  if (j == 0 || j >= es->n_ops)
    return false;
  uint32_t prev = es->ops[j - 1].op;
  return model_bwd_group_end(s->xm->m, prev, es->ops[j].op + 1) == es->ops[j].op;
}

/* Attention's dimensions as this device runs it: heads / tp of each kind. */
static inline struct kernels_attention_dims attention_dims(const struct exec_state *s,
                                                           const struct model_op *op) {
  struct kernels_attention_dims dd = exec_attention_dims(s->xm, op);
  dd.heads /= (int)s->dev->tp_degree;
  dd.kv_heads /= (int)s->dev->tp_degree;
  return dd;
}

/* Each expert's intermediate size as this device runs it (its gate / up columns, down rows). */
static inline int expert_width(const struct exec_state *s) {
  return s->xm->F_expert / (int)s->dev->tp_degree;
}

/* ... of segment seg's experts: whole where each TP rank routes its own tokens (route_split). */
static inline int expert_width_of(const struct exec_state *s, uint32_t seg) {
  return s->xm->F_expert / (int)exec_segment_tp(s->dev, seg);
}

/* The MLP's intermediate size as this device runs it. */
static inline int mlp_width(const struct exec_state *s, const struct model_op *op) {
  return (int)op->shape[2] / (int)s->dev->tp_degree;
}

enum bwd_mode { BWD_FUSED, BWD_INPUT, BWD_WEIGHT };

/* A segment's forward F, or its rerun R under full recomputation: the same ops on the same
 * inputs, so R's values are F's bit for bit. */
bool exec_segment_forward(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err);
/* Its backward B, or the BI or BW half of it (mode). */
bool exec_segment_backward(struct exec_state *s, uint32_t i, enum bwd_mode mode,
                           struct exec_task_ctx *st, GError **err);

/* ---- tp.c: the buffers of a compute's TP collectives ----------------------------------------- */

/* The [T, C] buffer instruction i's TP collectives run in: the plan tensor its TP node reads,
 * made on first use (the instruction's workspace where the plan has none). */
float *exec_tp_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                      uint32_t i, float **buf);
/* Value src [T_seq, C], a sequence shard under SP, gathered whole into *slot [T, C]. */
const float *exec_tp_gathered(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                              float **slot, const float *src, GError **err);
/* A slice's partial result in buf [T, C], summed over the TP group, then into dst (= or +=):
 * all of it, or under SP this device's sequence shard (a reduce-scatter). */
bool exec_tp_sum_into(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                      float *dst, bool acc, GError **err);

/* ---- the other instructions ------------------------------------------------------------------ */

/* expert_parallel.c: an expert segment's compute (forward when `forward`, else its backward in
 * mode), and the all-to-alls around it (dispatch, combine and their transposes). */
bool exec_expert_compute(struct exec_state *s, uint32_t i, enum bwd_mode mode, bool forward,
                         struct exec_task_ctx *st, GError **err);
bool exec_all_to_all(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err);
/* transfer.c: a send or receive of a model edge, alone or as a part of a point-to-point group. */
bool exec_transfer_group(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err);
/* optimizer.c: a bucket's collective or gather, the tied embedding's gradient sum, AdamW; a
 * consumer of gathered parameters is done (the last one frees them). */
bool exec_data_parallel(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err);
bool exec_tied_sync(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err);
bool exec_optimizer_step(struct exec_state *s, uint32_t i, struct exec_task_ctx *st);
void exec_gathered_release(struct exec_state *s, uint32_t g);

/* ---- context_parallel.c: the attention under context parallelism (host kernels) -------- */
/* a [T, C], saved <- h [T, C] (T this rank's tokens; saved's lse [T, H] by token) */
bool exec_cp_attention_forward(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                               float *a, float *saved, const float *h, const float *params,
                               const struct kernels_attention_dims *d, GError **err);
/* lse, y (into d->core) <- q, k, v of saved, over every rank's K/V: selective recomputation's
 * rerun of the core */
bool exec_cp_attention_core_forward(struct exec_state *s, struct exec_task_ctx *st,
                                    struct exec_mb *mb, float *saved,
                                    const struct kernels_attention_dims *d, GError **err);
/* dh (= or +=), bwork <- da: kernels_attention_backward_input's, over the CP group; BW is the
 * plain kernels_attention_backward_weight */
bool exec_cp_attention_backward_input(struct exec_state *s, struct exec_task_ctx *st,
                                      struct exec_mb *mb, float *dh, float *bwork, const float *da,
                                      const float *saved, const float *params,
                                      const struct kernels_attention_dims *d, bool accumulate,
                                      GError **err);

#endif
