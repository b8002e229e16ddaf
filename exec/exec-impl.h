/* exec-impl: what the executor's sources share. program.c derives, from the plan alone, what
 * each instruction of this device means for training (which model edge a send carries, which
 * all-to-all is a dispatch, where each segment's parameters live); train.c runs an instruction
 * (train-impl.h); runner.c drives steps on a backend; checkpoint.c saves and restores the state. */
#ifndef PIPER_EXEC_EXEC_IMPL_H
#define PIPER_EXEC_EXEC_IMPL_H

#include <stdatomic.h>

#include "../report/report.h"
#include "backend.h"
#include "data.h"
#include "watchdog.h"

/* The decoder state one micro-batch passes between ops (models/model.h's kind table). r holds
 * the top-k expert ids (int32) then their weights (float): 2 * T * K words. */
enum exec_tensor { EXEC_T_X, EXEC_T_H, EXEC_T_A, EXEC_T_M, EXEC_T_S, EXEC_T_R, EXEC_T_COUNT };
#define EXEC_BIT(t) (1u << (t))

/* ---- model level: the same on every device ------------------------------------------------ */

struct exec_value {
  uint8_t tensor;
  int32_t op;    /* producing op (index in the segment), -1 = segment input */
  uint32_t edge; /* input: the model edge that carries it */
};

struct exec_seg_op {
  uint32_t op; /* model op index */
  enum model_op_kind kind;
  int32_t in[3];         /* value indices, -1 = unused (see segment_forward.c per kind) */
  int32_t out;           /* value index, -1 for the LM head */
  uint64_t param_offset; /* in the segment's full parameter block */
  uint64_t param_count;  /* full (all experts) */
};

struct exec_segment {
  uint32_t n_values;
  struct exec_value *values;
  uint32_t n_ops;
  struct exec_seg_op *ops;
  int32_t final_value[EXEC_T_COUNT]; /* value of tensor t at the end, -1 = not written */
  uint32_t n_out_edges, n_in_edges;
  uint32_t *out_edges, *in_edges; /* model edge indices, ascending */
  uint64_t param_count;           /* full */
  bool expert;
};

struct exec_model {
  const struct model *m;
  int T, C, V, K, E, F_expert; /* tokens per micro-batch, hidden, vocab, top-k, experts, ffn */
  int T_seq; /* tokens of the residual stream one rank holds: T, or T / tp under sequence
              * parallelism (exec_tp_model_shape); the decoder state's values have T_seq rows */
  int batch, seq;
  uint8_t *edge_mask;        /* [n_edges]: tensors each model edge carries */
  struct exec_segment *segs; /* [n_segments] */
  uint32_t embedding_op, head_op;
  uint32_t embedding_seg, head_seg;
  bool tied; /* the head reads the embedding's table (same segment) */
  /* the model file's numerics, as the kernels take them */
  float rope_theta, rms_norm_eps;
  struct kernels_rope_scaling rope_scaling;
  const struct kernels_rope_scaling *scaling; /* &rope_scaling, or NULL when none */
  /* Tied across PP stages: the head holds its own copy of the table ([V, C], the tied layout),
   * starts equal to it and is kept equal by the plan's tied sync (EXEC_ROLE_TIED_SYNC). */
  bool tied_copy;
};
/* Attention dimensions of a model op, with the model's RoPE. */
struct kernels_attention_dims exec_attention_dims(const struct exec_model *xm,
                                                  const struct model_op *op);

/* Deterministic initial value of element `index` of model op `op`'s parameters: independent of
 * the plan, so every plan of a model starts from the same weights. */
float exec_init_param(const struct model *m, uint64_t seed, uint32_t op, uint64_t index);

bool exec_model_init(struct exec_model *xm, const struct model *m, GError **err);
void exec_model_clear(struct exec_model *xm);
/* Floats (4-byte words) of tensor t, and of its gradient (r: the weights only). */
size_t exec_tensor_words(const struct exec_model *xm, enum exec_tensor t);
size_t exec_grad_floats(const struct exec_model *xm, enum exec_tensor t);
/* Model edge index of (src, dst), or IR_NONE. */
uint32_t exec_model_edge(const struct exec_model *xm, uint32_t src, uint32_t dst);
const char *exec_tensor_name(enum exec_tensor t);

/* ---- device level ------------------------------------------------------------------------ */

enum exec_role {
  EXEC_ROLE_COMPUTE,
  EXEC_ROLE_SEND,
  EXEC_ROLE_RECV,
  EXEC_ROLE_A2A_TO_EXPERT,   /* F: dispatch; B/BI: combine's transpose (output gradients) */
  EXEC_ROLE_A2A_FROM_EXPERT, /* F: combine; B/BI: dispatch's transpose (input gradients) */
  EXEC_ROLE_ALL_REDUCE,
  EXEC_ROLE_REDUCE_SCATTER,
  EXEC_ROLE_GATHER_USE,    /* ZeRO-3: parameters for one use, into a fresh buffer */
  EXEC_ROLE_GATHER_UPDATE, /* ZeRO-2: updated shards back into the parameters */
  EXEC_ROLE_OPTIMIZER,
  EXEC_ROLE_TIED_SYNC, /* all-reduce of the tied embedding's two copies' gradients */
  EXEC_ROLE_TP,        /* the plan's TP collectives of a compute: run inside it (tp.c) */
  EXEC_ROLE_CP,        /* its K/V exchange: run inside the attention (context_parallel.c) */
};

struct exec_instr {
  enum exec_role role;
  uint32_t node, stream;
  enum ir_pass pass;
  int32_t mb;       /* local micro-batch (MB tag), -1 = none */
  uint32_t segment; /* compute / a2a: model segment; tied sync: the copy's; else IR_NONE */
  uint32_t edge;    /* send / recv / a2a: model edge */
  uint32_t peer;    /* send / recv: world rank */
  uint32_t comm;    /* index into exec_device.comm_keys, IR_NONE */
  int tag;
  uint32_t bucket;       /* collectives, gathers: index into exec_device.buckets */
  uint32_t gather;       /* compute: instruction whose buffer holds its parameters */
  uint32_t gather_users; /* gather-use: consumers of its buffer */
  uint32_t segset;       /* optimizer */
  /* A part of a point-to-point group (plan_instr.group_parts): the task of the group's first
   * part (group_lead) issues every part, listed group_head -> group_next, as one backend group
   * (exec_comm_p2p_group); the others' tasks do nothing. IR_NONE where there is no group. */
  uint32_t group_lead, group_head, group_next;
  /* A TP node: the compute whose collectives it stands for (its first TP node only; under
   * SP the all-gather after the reduce-scatter has IR_NONE). */
  uint32_t tp_compute;
};

/* A DP gradient bucket: its segments' parameters are contiguous in the device's flat arrays
 * [offset, offset + padded), padded to a multiple of the group size for reduce-scatter. */
struct exec_bucket {
  uint32_t node; /* the collective's plan node */
  uint32_t n_segs;
  uint32_t *segs;
  uint64_t offset, count, padded, shard; /* shard = padded / group size */
  uint32_t group_size, rank;
  /* ZeRO levels: reduce-scattered gradients and an update of this device's shard alone
   * (1, and every level above), gradients (2) and parameters (3) held as a shard */
  bool sharded_optimizer, sharded_grads, sharded_params;
  uint64_t store_at[3]; /* where its stored part starts in each store (enum exec_store) */
};

/* The three stores of a device's training state (shard.c). Parameters, gradients and AdamW
 * moments are addressed by flat index (param_offset, bucket offset); each store keeps only
 * what this device owns: a ZeRO bucket's own shard where its level shards that store
 * (optimizer state from ZeRO-1, gradients from ZeRO-2, parameters at ZeRO-3), the whole
 * padded bucket otherwise, and every segment outside buckets whole. */
enum exec_store { EXEC_STORE_PARAMS, EXEC_STORE_GRADS, EXEC_STORE_STATE };
#define EXEC_NOT_STORED UINT64_MAX

/* A communicator to create: plan communicator + the streams that use it. */
struct exec_comm_key {
  uint32_t comm;
  uint32_t stream_a, stream_b; /* PP: send and recv stream; else the stream, IR_NONE */
};

struct exec_device {
  const struct plan *plan;
  const struct exec_model *xm;
  uint32_t device, class_id;
  const struct plan_class *cls;
  uint32_t n_instrs;
  struct exec_instr *instrs;
  uint32_t M; /* micro-batches per step on one device */
  uint32_t dp_degree, dp_rank;
  int mb_tag; /* tag index of "MB", -1 */
  /* parameters this device holds, per segment (expert segments: the local experts only) */
  bool *holds;                 /* [n_segments] */
  uint64_t *param_offset;      /* [n_segments] into the flat arrays */
  uint64_t *param_local;       /* [n_segments] local count */
  uint32_t *bucket_of;         /* [n_segments] IR_NONE if in no bucket */
  uint32_t *ep_size, *ep_rank; /* [n_segments]: expert parallel group of expert segments */
  /* [n_segments]: experts whose TP (1) is below the dense TP (ir.h, route_split): this device
   * routes its 1/route_split of each micro-batch's tokens to whole experts; 1 elsewhere */
  uint32_t *route_split;
  uint64_t n_params;           /* flat length, padding included */
  uint64_t tail_flat;          /* flat index where the segments outside buckets start */
  uint64_t tail_store_at[3];   /* ... and where they start in each store */
  uint64_t n_store[3];         /* floats in each store (enum exec_store) */
  uint32_t n_buckets;
  struct exec_bucket *buckets;
  uint32_t *mb_instr_count; /* [M]: instructions tagged with each micro-batch */
  uint32_t n_comm_keys;     /* every communicator of the plan (all ranks create all) */
  struct exec_comm_key *comm_keys;
  /* Tensor parallelism (tp.c): one degree for the whole model, this device's TP rank, and the
   * communicator key its compute runs the TP collectives on (IR_NONE without TP). */
  uint32_t tp_degree, tp_rank;
  bool sequence_parallel;
  uint32_t tp_comm;
  /* Context parallelism (context_parallel.c): the degree (1: none), this device's CP rank, and
   * the communicator key its attention exchanges K/V on (IR_NONE without CP). The CP ranks
   * count among the replicas: dp_degree and dp_rank include them (CP inside DP). */
  uint32_t cp_degree, cp_rank, cp_comm;
  /* cp-comm=p2p: the ring (K/V from cp_prev, on to cp_next: their world ranks), else the
   * all-gather of K/V */
  bool cp_ring;
  uint32_t cp_prev, cp_next;
  uint64_t *op_offset; /* [n_ops]: where each op's parameters start in its segment's local block */
};

/* The TP degree segment seg's weights are divided by here: the dense TP, or 1 for experts
 * each TP rank runs whole (route_split). */
static inline uint32_t exec_segment_tp(const struct exec_device *d, uint32_t seg) {
  return d->route_split[seg] > 1 ? 1 : d->tp_degree;
}

/* Derives the device program from the plan; fails (input error) for what the executor cannot
 * run, naming the instruction. */
bool exec_device_init(struct exec_device *d, const struct plan *p, const struct exec_model *xm,
                      uint32_t device, GError **err);
void exec_device_clear(struct exec_device *d);

/* ---- runtime state ----------------------------------------------------------------------- */

struct exec_state;

struct exec_block {
  void *p;
  size_t bytes;
  enum report_mem_kind kind;
  bool host;      /* host memory (g_malloc0), else device memory from the state's pool */
  uint32_t group; /* a workspace block's: the op group it is released with (memory.c) */
};

/* One micro-batch of the current step on this device. Buffers come from its arena, freed when
 * the last instruction tagged with it completes: device memory for what kernels touch, host
 * memory for what the CPU reads (pointer tables, the expert-parallel state and counts). */
struct exec_mb {
  GMutex lock;
  GArray *allocs; /* struct exec_block */
  uint64_t bytes; /* live in the arena */
  atomic_uint remaining;
  uint32_t global_index; /* micro-batch index in the global batch */
  int32_t *tokens, *targets;             /* device copies, made by the ops that read them */
  int32_t *tokens_host, *targets_host; /* this micro-batch's data */
  float **out;               /* [n_segments * T_COUNT] final values of local segments */
  float **in_val;            /* [n_edges * T_COUNT] values received */
  float **grad;              /* [n_edges * T_COUNT] gradients carried by edges */
  struct exec_seg_run **seg; /* [n_segments] */
  struct exec_moe **moe;     /* [n_segments] expert-parallel state */
  double loss;
  bool has_loss;
};

/* The buffers of one instruction's TP collectives (tp.c), each made on first use: the
 * [T, C] partial sums (the plan tensor its TP node reads), under sequence parallelism a divided
 * op's input and its output gradient gathered whole [T, C], a summed shard to add, and a norm's
 * weight-gradient part. */
struct exec_tp_bufs {
  float *sum, *input, *dout, *shard, *norm;
};

/* What an instruction runs with: the stream its kernels go to, and the time it spends in
 * kernels and communication. Work outside any task has none: its kernels go to the backend's
 * exec_backend_setup_stream. */
struct exec_task_ctx {
  struct exec_stream *stream;
  double kernel_s, comm_s;
  GArray *work; /* struct exec_block: the instruction's workspace, freed when it ends */
  /* the plan's tensor for that workspace (a backend that places tensors puts it in the
   * tensor's slot), when has_work */
  bool has_work;
  uint32_t work_tensor;
  /* the op group new workspace blocks are released with (exec_work_group_end): a segment's
   * ops run one group (model_group_end) at a time and hold one group's transients */
  uint32_t group;
  struct exec_tp_bufs tp;
};

/* A plan tensor's buffers in the current step (the memory rule, struct plan_tensor): what the
 * executor really allocates for it, released once its release point and consumers are done. */
struct exec_tensor_rt {
  GArray *blocks; /* struct exec_block */
  atomic_uint left; /* consumers + the release point still to end */
};

struct exec_state {
  const struct exec_options *o;
  struct exec_backend *b;
  const struct exec_kernels *k;
  const struct exec_model *xm;
  const struct exec_device *dev;
  struct exec_data *data;
  struct exec_comm **comms;                /* [n_comm_keys], NULL where not a member */
  float *params, *grads, *adam_m, *adam_v; /* stores: [n_store[...]] (shard.c) */
  /* ZeRO-2/3: a bucket's whole gradient, summed over micro-batches from its first weight
   * gradient until its reduce-scatter keeps this device's shard; NULL in between steps */
  float **grad_acc; /* [n_buckets] */
  float *loss_device;                      /* [M]: each micro-batch's loss, read back */
  uint32_t step;                           /* 1-based step being run (AdamW's t) */
  struct exec_lr_schedule lr_schedule;     /* o->lr_schedule resolved for the run */
  float lr;                                /* this step's learning rate */
  /* Clipping (o->clip_grad): the gradients the optimizer updates with are scaled by this
   * (< 1: the step's global norm was above the limit; the runner sets it) */
  float clip_scale;
  /* Evaluation: only the forward instructions run (exec_instr_in_forward); the others end
   * as if run (exec_skip_instr) */
  bool forward_only;
  struct exec_mb *mbs;                     /* [M] */
  void **gathered;                         /* [n_instrs] ZeRO-3 buffers by gather instruction */
  atomic_uint *gathered_users;             /* [n_instrs] consumers left */
  /* buffers come from a cache of freed ones by exact size: every step asks for the same sizes,
   * and going back to malloc each time costs more than the smaller kernels take */
  GMutex pool_lock;
  GHashTable *pool; /* size -> GPtrArray of free buffers */
  bool poison;      /* fill fresh buffers with NaN (exec_options.hooks.poison, tests) */
  /* The plan's memory points: tensors[t] of the class, and per instruction the tensors it
   * releases (release_first[i] .. release_first[i + 1] of release_list) */
  struct exec_tensor_rt *tensors;
  uint32_t *release_first, *release_list;
  /* [n_instrs] instruction i's workspace tensor (PLAN_TENSOR_WORK), IR_NONE where it has none */
  uint32_t *work_of;
  double *tp_seconds; /* [n_instrs]: a compute's time in its TP collectives (NULL: no TP) */
  GMutex tensor_lock;
  /* A receive's buffers, allocated when its stream becomes free (its issue: the plan's alloc
   * point), before the event loop gets to run it: [n_instrs * EXEC_T_COUNT]; next_on_stream
   * [n_instrs]: the instruction after each on its stream, IR_NONE at the end */
  float **recv_ready;
  uint32_t *next_on_stream;
  /* memory accounting (bytes by report kind) */
  GMutex mem_lock;
  uint64_t mem[REPORT_MEM_KIND_COUNT];
  uint64_t mem_peak, mem_peak_breakdown[REPORT_MEM_KIND_COUNT];
};

/* memory.c: the byte figures, the pool of freed buffers, the memory rule, the micro-batches */
void exec_mb_begin(struct exec_state *s, uint32_t mb);
void exec_mb_end(struct exec_state *s, uint32_t mb);
/* The memory rule's state: set up and armed for a step (before its micro-batches begin);
 * at the step's end, frees what no release point freed (nothing, when the plan is right);
 * exec_memory_free at teardown. */
void exec_step_memory_begin(struct exec_state *s);
/* After the micro-batches began: the first receive of each stream is issued. */
void exec_step_memory_issue(struct exec_state *s);
void exec_step_memory_end(struct exec_state *s);
void exec_memory_free(struct exec_state *s);
void exec_mem_add(struct exec_state *s, enum report_mem_kind k, int64_t bytes);
void *exec_pool_get(struct exec_state *s, size_t bytes);
void exec_pool_put(struct exec_state *s, void *p, size_t bytes);
void exec_pool_clear(struct exec_state *s);

/* params.c: the training state's stores */
bool exec_state_init_params(struct exec_state *s, GError **err);
/* Replaces the parameters with a Hugging Face checkpoint's (exec_hf_load). */
bool exec_state_load_hf(struct exec_state *s, const char *dir, GError **err);
void exec_state_free_params(struct exec_state *s);
/* Full model parameters in model op order (floats): what this device holds current copies of
 * (held[i] set), zeros elsewhere. */
void exec_params_export(const struct exec_state *s, float *full, bool *held, uint64_t n_full);
uint64_t exec_model_param_total(const struct exec_model *xm);
/* fn(s, op, local, g, data) for every parameter of segment seg held here: local is its index
 * in the segment's block (flat: param_offset[seg] + local), g its index in the op's one-device
 * block (the layout of kernels/kernels.h). */
typedef void (*exec_param_fn)(const struct exec_state *s, uint32_t op, uint64_t local,
                              uint64_t g, void *data);
void exec_for_each_param(const struct exec_state *s, uint32_t seg, exec_param_fn fn, void *data);
/* Whether this device holds a current copy of element `local` of segment seg: everywhere but
 * outside its own shard under ZeRO-3 (the rest is stale until the next gather). */
bool exec_param_current(const struct exec_state *s, uint32_t seg, uint64_t local);

/* hf.c: Hugging Face names and safetensors (docs/exec.md, "Hugging Face weights"). Each
 * parameter tensor of a Hugging Face checkpoint, by name, and where it lies in an op's
 * one-device block: HF stores nn.Linear weights [out, in] row-major, the kernels [in, out]. */
struct exec_hf_tensor {
  char *name;
  uint32_t op;
  uint64_t offset;     /* first element in the op's block */
  uint32_t ndim;       /* 1 or 2 */
  uint64_t shape[2];   /* HF's */
  bool transposed;     /* the block holds [shape[1], shape[0]] */
  bool alias;          /* the LM head's copy of a tied embedding: read, never written */
};
struct exec_hf_map {
  uint32_t n;
  struct exec_hf_tensor *t; /* model order */
  uint32_t *op_first;       /* [n_ops + 1]: op o's tensors are [op_first[o], op_first[o + 1]) */
};
bool exec_hf_map_build(const struct model *m, struct exec_hf_map *map, GError **err);
void exec_hf_map_clear(struct exec_hf_map *map);
/* Element g of op's block: its tensor and its row-major index in HF's shape. */
void exec_hf_locate(const struct exec_hf_map *map, uint32_t op, uint64_t g, uint32_t *tensor,
                    uint64_t *index);
/* The map as the JSON a checkpoint's step directory keeps (tensors.json; cJSON_free), NULL for
 * a model without one (MLA). */
char *exec_hf_map_json(const struct model *m);
/* Overwrites the initialisation in host (this device's flat parameters) with the checkpoint's
 * values in dir, reading only the elements this device keeps current; every tensor's name,
 * shape and dtype checked first (input errors naming the file and the tensor). */
bool exec_hf_load(const struct exec_state *s, const char *dir, float *host, GError **err);

/* grad_norm.c: *sum (device memory) += the squares of the step's reduced gradients this
 * device owns (each element of the model on one device of the job), enqueued on stream. */
void exec_grad_sum_squares(struct exec_state *s, struct exec_stream *stream, double *sum);

/* train.c: runs instruction i (the sources it calls share train-impl.h) */
bool exec_run_instr(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err);
/* Whether x is a part of the forward pass (what an evaluation runs), and instruction i ended
 * without running: its memory and micro-batch as if it had. */
bool exec_instr_in_forward(const struct exec_instr *x);
void exec_skip_instr(struct exec_state *s, uint32_t i, struct exec_task_ctx *st);

/* tp.c: tensor parallelism (Megatron-LM's layout) on one device */

/* Parameters op holds on one of tp ranks, and the index in the op's full block (the one-device
 * layout, exec_init_param's) of local element `local` on TP rank r: column-parallel Q/K/V and
 * MLP gate/up keep a slice of each row's columns, row-parallel attention output and MLP down
 * a block of rows, the embedding (and a tied head) a block of vocabulary rows, an untied head
 * a block of vocabulary columns; norms and the router are whole. */
uint64_t exec_tp_op_params(const struct exec_model *xm, const struct model_op *op, uint32_t tp);
uint64_t exec_tp_full_index(const struct exec_model *xm, const struct model_op *op, uint32_t tp,
                            uint32_t r, uint64_t local);
/* The TP shape of the plan on this device: degree, rank, communicator; input error for what
 * the executor cannot run under TP (experts, regions divided differently). */
bool exec_tp_device_init(struct exec_device *d, GError **err);
/* The model's shape on the device: under sequence parallelism the residual stream's values
 * are the device's sequence shard (xm->T_seq). */
void exec_tp_model_shape(struct exec_model *xm, const struct exec_device *d);
/* Collectives over the TP group, timed as communication of the task: the sequence shards of
 * the summed in [tp * n] into out [n], and the shards in [n] gathered into out [tp * n]. */
bool exec_tp_reduce_scatter(struct exec_state *s, struct exec_task_ctx *st, const float *in,
                            float *out, size_t n, GError **err);
bool exec_tp_all_gather(struct exec_state *s, struct exec_task_ctx *st, const float *in,
                        float *out, size_t n, GError **err);
/* The plan has one TP node (two under SP) after each compute for its collectives, which ran
 * inside the compute: the measured intervals of the step are moved so that the compute ends
 * where its collectives' time begins and its first TP node spans that time (communication),
 * as the simulator has them, for the trace and piper-compare. */
void exec_tp_retime(const struct exec_state *s, double *start, double *end, double *comm);
/* After the communicator keys: d->tp_comm, and the checks that need it. */
bool exec_tp_link_comm(struct exec_device *d, GError **err);
/* Context parallelism (context_parallel.c). After exec_tp_device_init: d->cp_degree and
 * d->cp_rank. After the communicator keys: d->cp_comm. */
bool exec_cp_device_init(struct exec_device *d, GError **err);
bool exec_cp_link_comm(struct exec_device *d, GError **err);
/* The sequence block micro-batch k of step reads: the CP ranks of one replica read the same. */
uint64_t exec_cp_data_block(const struct exec_device *d, uint32_t step, uint32_t k);
/* tokens, targets [batch, seq / cp] <- block's sequences of seq: this CP rank's two chunks of
 * each (exec_data_batch without CP). */
void exec_cp_batch(const struct exec_data *data, const struct exec_device *d, uint64_t block,
                   int batch, int seq, int32_t *tokens, int32_t *targets);
/* Each op's local parameter offset in its segment (d->op_offset), after the EP split. */
void exec_tp_op_offsets(struct exec_device *d);
/* Whether the executor's kernel of op kind k runs on a slice (and its output or input gradient
 * is summed over the TP group). */
bool exec_tp_divided(enum model_op_kind k);
/* Sum of buf [n] over the TP group, timed as communication of the task. */
bool exec_tp_all_reduce(struct exec_state *s, struct exec_task_ctx *st, float *buf, size_t n,
                        GError **err);
/* The vocabulary-parallel embedding: x [T, C] = this rank's rows of the table for the tokens
 * in its range, zero for the others (the caller sums over the group); its weight gradient.
 * Enqueued on stream through the kernel table (tp_embedding_*). */
void exec_tp_embedding_forward(const struct exec_state *s, struct exec_stream *stream, float *x,
                               const int32_t *tokens, const float *table);
void exec_tp_embedding_backward(const struct exec_state *s, struct exec_stream *stream,
                                float *dtable, const float *dx, const int32_t *tokens);
/* The vocabulary-parallel LM head with the parallel cross-entropy: the logits of this rank's
 * vocabulary slice only; each row's max, sum of exp and target logit over the slice,
 * all-gathered into gathered [tp][3, T] (device memory) and merged into saved (each row's max
 * then 1 / sum, as the one-device kernel keeps) and *loss (device memory: the mean over the
 * tokens). Returns false with err set when the collective fails. */
bool exec_tp_head_forward(struct exec_state *s, struct exec_task_ctx *st, float *gathered,
                          float *loss, float *saved, const float *h, const int32_t *targets,
                          const float *w, bool tied, GError **err);
/* dh (partial, this slice's share: the caller sums it) and / or dw (+=) from the recomputed
 * slice of dlogits; either may be NULL. */
void exec_tp_head_backward(const struct exec_state *s, struct exec_stream *stream, float *dh,
                           float *dw, const float *saved, const float *h, const int32_t *targets,
                           const float *w, bool tied, float dloss);

/* shard.c */
/* Fills each bucket's store_at, the tail and n_store, after the flat layout is known. */
void exec_store_layout(struct exec_device *d);
/* Index in store `which` of flat index `flat`, or EXEC_NOT_STORED. */
uint64_t exec_store_index(const struct exec_device *d, enum exec_store which, uint64_t flat);
/* Host copies between a store and its flat form: expand writes fill where nothing is stored. */
void exec_store_expand(const struct exec_device *d, enum exec_store which, const float *store,
                       float *flat, float fill);
void exec_store_compact(const struct exec_device *d, enum exec_store which, const float *flat,
                        float *store);

/* checkpoint_meta.c, checkpoint.c */

/* What a checkpoint records of the run that wrote it: everything that decides how this rank's
 * state is laid out (placement, expert split, gradient buckets and their ZeRO sharding) or
 * what the next step computes (batch shape, seed, data, optimizer, the device's program).
 * Written as JSON inside the rank's file; a resume compares it field by field. */
struct exec_checkpoint_segment {
  uint32_t segment;
  uint64_t offset, count;    /* in the flat arrays */
  uint32_t ep_size, ep_rank; /* expert split */
  /* the model ops in it: [op, first local index in the segment's block, local count] each,
   * what a resume on another layout maps back to the ops' one-device blocks (0: not recorded,
   * a file from before resharding) */
  uint32_t n_ops;
  uint64_t *ops; /* [3 * n_ops] */
};
struct exec_checkpoint_bucket {
  uint32_t zero; /* 0: all-reduce, 2: shard_grads, 3: shard_params */
  uint32_t n_group, n_segs;
  uint32_t *group, *segs; /* device group (world ranks), segments synced */
  uint32_t rank;          /* this device's shard */
  uint64_t offset, count, shard;
};
struct exec_checkpoint_meta {
  uint32_t step, rank, n_ranks;
  char *model;
  uint64_t model_hash, n_params;
  uint32_t n_segments, n_buckets;
  struct exec_checkpoint_segment *segments; /* held segments, ascending */
  struct exec_checkpoint_bucket *buckets;
  uint32_t microbatches, global_microbatches, microbatch_size, seq_len, dp, dp_rank;
  uint64_t seed;
  char *data_kind, *data_path; /* path as given ("" = synthetic) */
  uint64_t data_bytes;
  float lr, beta1, beta2, eps, weight_decay;
  char *lr_schedule; /* exec_lr_schedule_text; "constant" in checkpoints older than it */
  float clip_grad;
  uint64_t program_hash;
  /* the model without its training fields and PP split (what a resume on another layout
   * must share), and this device's TP slice; absent (0) in files from before resharding */
  uint64_t arch_hash;
  uint32_t tp_degree, tp_rank;
};
void exec_checkpoint_describe(const struct exec_options *o, const struct exec_device *d,
                              const struct exec_data *data, uint32_t step,
                              struct exec_checkpoint_meta *m);
void exec_checkpoint_meta_clear(struct exec_checkpoint_meta *m);
char *exec_checkpoint_meta_to_json(const struct exec_checkpoint_meta *m); /* cJSON_free */
/* Every field checked: anything else is an input error naming path. */
bool exec_checkpoint_meta_from_json(const char *path, const char *text, size_t len,
                                    struct exec_checkpoint_meta *m, GError **err);

/* A checkpoint file's bytes, checked: header, checksum, description; arrays points into the
 * bytes given (3 * meta.n_params floats: parameters, AdamW m, v). Anything else is an input
 * error naming path. */
#define EXEC_CHECKPOINT_HEADER_BYTES 32 /* magic, version, description bytes, n_params, 0 */
struct exec_checkpoint_file {
  uint32_t version;
  struct exec_checkpoint_meta meta;
  const char *arrays;
};
bool exec_checkpoint_parse(const char *path, const void *data, size_t len,
                           struct exec_checkpoint_file *f, GError **err);
void exec_checkpoint_file_clear(struct exec_checkpoint_file *f);
/* The same without the checksum (a resume on another layout checks it only for the files it
 * reads from), and the checksum alone. */
bool exec_checkpoint_parse_unverified(const char *path, const void *data, size_t len,
                                      struct exec_checkpoint_file *f, GError **err);
bool exec_checkpoint_verify(const char *path, const void *data, size_t len, GError **err);
/* Input error naming the first difference that forbids continuing exactly; a difference that
 * allow (bits from exec_resume_allow_parse) accepts is appended to notes instead. */
bool exec_checkpoint_compare(const char *path, const struct exec_checkpoint_meta *was,
                             const struct exec_checkpoint_meta *now, uint32_t allow, GString *notes,
                             GError **err);
/* The part of that comparison a user may change on purpose (optimizer, data, schedule). */
bool exec_checkpoint_compare_allowed(const char *path, const struct exec_checkpoint_meta *was,
                                     const struct exec_checkpoint_meta *now, uint32_t allow,
                                     GString *notes, GError **err);
/* checkpoint_reshard.c: with --resume-allow-change layout, this device's state from the files
 * of every rank of the checkpoint in step_dir, whatever layout wrote them: each element by its
 * op and its index in the op's one-device block, from the lowest rank holding a current copy;
 * only the files it reads from are read (mapped) and checksummed. */
bool exec_checkpoint_reshard(struct exec_state *s, const char *step_dir, uint32_t allow,
                             uint32_t *step, GString *notes, GError **err);
/* bits of exec_resume_allow_parse's mask: a name's place in checkpoint_meta.c's allow_names */
#define EXEC_RESUME_ALLOW_LR (1u << 0)
#define EXEC_RESUME_ALLOW_DATA (1u << 5)
#define EXEC_RESUME_ALLOW_SCHEDULE (1u << 6)
#define EXEC_RESUME_ALLOW_CLIP_GRAD (1u << 7)
#define EXEC_RESUME_ALLOW_LAYOUT (1u << 8)
/* "lr,weight_decay" -> bits; NULL -> 0. */
bool exec_resume_allow_parse(const char *list, uint32_t *mask, GError **err);

/* Before the first checkpoint of a run: creates dir and removes temporary files a crashed
 * writer left (rank 0: all of them; other ranks: their own). */
bool exec_checkpoint_begin(const char *dir, uint32_t rank, GError **err);
bool exec_checkpoint_write(const struct exec_state *s, const char *dir, uint32_t step,
                           GError **err);
/* Reads this rank's file of the latest checkpoint under dir; *step = steps done; the changes
 * exec_options.resume_allow_change accepted are appended to notes. */
bool exec_checkpoint_read(struct exec_state *s, const char *dir, uint32_t *step, GString *notes,
                          GError **err);
/* Rank 0, once every rank has written step: points dir/latest at it, then keeps the last keep
 * step directories (0: all). */
bool exec_checkpoint_commit(const char *dir, uint32_t step, uint32_t keep, GError **err);

/* ops_check.c: the uses (enum exec_op_use) of the ops plan p runs, and the input error,
 * naming the op, when b lacks one of them. */
void exec_plan_uses(const struct plan *p, bool uses[EXEC_USE_COUNT]);
bool exec_check_ops(struct exec_backend *b, const struct plan *p, GError **err);

/* stragglers.c: the ranks whose compute (compute [n_steps][n_ranks] seconds) exceeds the median
 * of their peers' (the other ranks of their class) by more than threshold in three measured
 * steps of four at least; *out (g_free) holds them by rank. */
uint32_t exec_find_stragglers(const double *compute, uint32_t n_steps, uint32_t n_ranks,
                              const uint32_t *class_of, double threshold,
                              struct exec_straggler **out);

#endif
