/* profile: the hardware a simulation runs on (docs/design.md, "The simulator's definitions"). A
 * device profile gives peak FLOP/s per dtype, memory bandwidth and capacity, efficiency factors, an
 * optional measured table (op kind + pass + shape -> time) and a network (GPUs per node, NVLink and
 * NIC bandwidth and latency); a synthetic profile gives fixed milliseconds per compute node by pass
 * and per communication. Datasheet profiles cost ops from their shapes and collectives by
 * topology (device.cost_model "shapes", network.collective_model "topology": sim/cost.h).
 *
 *   GError *err = NULL;
 *   struct model *model = model_load_file("models/tiny-moe.json", 0, &err);
 *   struct profile *pr = profile_load_file("profiles/h200.json", &err);
 *   if (model && pr) {
 *     struct profile_cost c = profile_compute_cost(pr, model, 0, IR_PASS_F, 1);  // segment 0
 *     uint32_t devices[] = {0, 1, 2, 3};
 *     struct profile_span span = profile_span_of(pr, devices, 4);
 *     struct profile_comm_cost ar = profile_comm_cost(pr, IR_NODE_ALL_REDUCE, 1 << 20, &span);
 *     printf("%g s compute, %g s all-reduce\n", c.seconds, ar.latency + ar.transfer);
 *   }
 *   profile_free(pr);
 *   model_free(model);
 *   g_clear_error(&err);
 */
#ifndef PIPER_SIM_PROFILE_H
#define PIPER_SIM_PROFILE_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/ir.h"
#include "../models/model.h"

#define PROFILE_MAX_SHAPE 8
/* An expert_ffn entry whose shape has d > 1 in this field (past the op's five) times the
 * experts alone on one device of a d-way expert-parallel group: E / d local experts over the
 * T x k rows the all-to-all brings with balanced routing, without the dispatch and combine
 * (which the executor runs in the all-to-alls). 0: the op on one device, dispatch to combine. */
#define PROFILE_EP_DIM 5

enum profile_collective_algo { PROFILE_ALGO_RING, PROFILE_ALGO_TREE, PROFILE_ALGO_AUTO };

/* The families of costs a step is made of, which piper-sim's sensitivity scales one at a time
 * (struct profile.family_scale): tensor-core GEMMs, the attention core, communication, and
 * memory-bound kernels (norms, adds, elementwise parts of ops, the optimizer). */
enum profile_family {
  PROFILE_FAMILY_GEMM,
  PROFILE_FAMILY_ATTENTION,
  PROFILE_FAMILY_COMM,
  PROFILE_FAMILY_MEMORY,
  PROFILE_FAMILY_COUNT
};
extern const char *const profile_family_names[PROFILE_FAMILY_COUNT]; /* "gemm", "attention".. */

/* The operations a profile may fit one by one ("collectives" section), and the link kinds a
 * fit is for: inside one node (shared memory, NVLink) or across nodes. */
enum profile_collective {
  PROFILE_COLL_P2P,
  PROFILE_COLL_ALL_REDUCE,
  PROFILE_COLL_REDUCE_SCATTER,
  PROFILE_COLL_ALL_GATHER,
  PROFILE_COLL_ALL_TO_ALL,
  PROFILE_COLL_COUNT
};
enum profile_link_kind { PROFILE_LINK_INTRA, PROFILE_LINK_INTER, PROFILE_LINK_COUNT };
extern const char *const profile_collective_names[PROFILE_COLL_COUNT]; /* "p2p", "all_reduce".. */
extern const char *const profile_link_names[PROFILE_LINK_COUNT]; /* "intra_node", "inter_node" */

/* A measured operation's link terms under the simulator's formula for it (profile_comm_cost:
 * a p2p transfer is a + n / B, a ring all-reduce 2 (p-1) a + 2 (p-1)/p n / B, the others
 * (p-1) a + (p-1)/p n / B), fitted over sizes and group sizes. bandwidth 0: not measured. */
struct profile_fit {
  double latency;   /* a, seconds */
  double bandwidth; /* B, bytes/s, achieved (no efficiency factor applies) */
};

/* One measured kernel time: op kind + pass + shape (the model_op shape fields) -> seconds. */
struct profile_entry {
  enum model_op_kind kind;
  enum ir_pass pass;
  int64_t shape[PROFILE_MAX_SHAPE];
  double seconds; /* the longer of the two below: the op's cost without a host thread */
  double device_seconds, host_seconds; /* "ms", "host_ms" (0: not measured) */
};

/* How a backend holds memory, per element of the plan's tensors and per parameter. A field
 * left unset (0 for activation_bytes, negative for the rates) takes the plan's own rule, what
 * a production executor holds: the plan's tensors at the model's dtype, and the ZeRO paper's
 * mixed-precision rates (bf16: params 2, grads 2, optimizer 12 with the fp32 master copy;
 * fp32: 4, 4, 8). piper-exec holds everything in fp32 whatever the model's dtype: tensors 4,
 * params 4 (the master copy), grads 4, optimizer 8 (AdamW m and v); its cuda backend adds a
 * bf16 copy of each GEMM weight matrix for bf16 models (compute_copy 2, counted as params). */
struct profile_memory {
  uint32_t activation_bytes; /* per element of the plan's tensors */
  double param_bytes, grad_bytes, optimizer_bytes; /* per parameter held */
  double compute_copy_bytes; /* per GEMM weight parameter held whole, bf16 models only */
};

struct profile {
  char *name; /* "name" key, else the file basename */
  char *path; /* for messages */
  bool synthetic;

  /* device (SI units: FLOP/s, bytes/s, bytes, seconds) */
  double peak_flops[3]; /* by enum model_dtype: [FP32], [BF16], [FP8] (0: none); dense */
  double memory_bandwidth;
  uint64_t memory_capacity;
  uint32_t sm_count;
  double compute_efficiency;        /* achieved / peak FLOP/s for large GEMMs */
  double memory_efficiency;         /* achieved / peak bandwidth for streaming kernels */
  double kernel_overhead;           /* per op launch, added to every roofline op */
  double optimizer_bytes_per_param; /* AdamW traffic per parameter updated */
  /* a backend that keeps a bf16 copy of each fp32 weight for its GEMMs (piper-exec's cuda
   * backend) remakes it once a step: traffic per parameter held, bf16 models only (0: none) */
  double weight_copy_bytes_per_param;

  /* device.cost_model "shapes" (sim/cost.h): GEMMs costed as tiled tensor-core kernels from
   * their shapes, the attention core as a FlashAttention-class kernel; false ("roofline",
   * the default): every op at compute_efficiency of peak or memory_efficiency of bandwidth */
  bool shape_model;
  double gemm_efficiency;     /* a full wave of the largest tile's main loop / peak */
  /* the same for FP8 GEMMs (a recipe's GEMMs at the FP8 peak); 0: gemm_efficiency */
  double gemm_efficiency_fp8;
  double gemm_tile_fill_k;    /* a tile's prologue and epilogue, in K elements of its loop */
  double attention_efficiency[2]; /* [0] forward, [1] backward: long-sequence plateau / peak */
  double attention_half_seq;  /* causal sequence at which the kernel reaches half its plateau */
  /* device.attention_kernel "unfused": the core as Megatron-LM ran it before FlashAttention
   * (batched GEMMs over the full s x s scores, softmax and dropout kernels over them in HBM);
   * false ("fused", the default): a FlashAttention-class kernel at attention_efficiency */
  bool attention_unfused;
  /* MoE ("moe" section): routing_imbalance > 0 is the most-loaded expert's tokens over the
   * mean (a measured or published figure); 0: the binomial spread of balanced random routing */
  double routing_imbalance;
  /* moe.expert_gemm_launches "per_expert": a grouped expert GEMM is one kernel launch per
   * local expert (Transformer Engine's GroupedLinear: a cuBLAS call per expert), each paying
   * kernel_overhead; false ("grouped", the default): one launch for all (a grouped kernel) */
  bool expert_gemm_per_expert;
  /* device.host_launch_us: the host's time to enqueue one kernel launch (PyTorch eager's
   * dispatch plus cudaLaunchKernel; docs/sim.md "The host thread"). > 0: each device has a
   * host thread that enqueues its instructions in issue order ahead of the GPU; 0 (absent):
   * none, every instruction is enqueued at once */
  double host_launch;
  /* moe.dispatcher "dropless_sync" (the default): Megatron's dropless alltoall dispatcher
   * copies the tokens per expert to the host before the dispatch all-to-all and the host
   * waits for it; false ("nosync"): a dispatcher that sizes on the GPU (DeepEP) */
  bool moe_dispatch_sync;
  /* multiplies each family's costs (1 unless piper-sim's sensitivity varies them) */
  double family_scale[PROFILE_FAMILY_COUNT];

  /* contention: a running communication kernel holds these shares of the device */
  double comm_sm_share;
  double comm_memory_share;

  /* network */
  uint32_t gpus_per_node, nics_per_node;
  double intra_bandwidth, intra_latency; /* per GPU, one direction (NVLink) */
  double nic_bandwidth, inter_latency;   /* per NIC, one direction */
  double network_efficiency;             /* bus bandwidth achieved / link bandwidth */
  enum profile_collective_algo algo;
  /* network.collective_model "topology" (sim/cost.h, cost_collective): latency per level
   * (NVLink steps, NIC steps, and past nodes_per_leaf nodes the spine's), ring and tree as
   * NCCL's tuning model counts their steps, all-to-all split over NVLink and NIC peers;
   * false ("alpha_beta", the default): one link and latency for the whole span */
  bool topology_model;
  uint32_t nodes_per_leaf;       /* nodes under one leaf (rail) switch group; 0: all */
  double spine_latency;          /* added to each NIC step of a span past one leaf group */
  double spine_bandwidth_factor; /* NIC bandwidth kept past one leaf group (1: non-blocking) */
  /* network.all_to_all "deepep": an optimised dispatcher (DeepEP's normal kernels) sends
   * every peer's tokens in one pass at these fractions of NVLink / NIC rates; "nccl" (the
   * default): NCCL's p - 1 point-to-point exchanges at network_efficiency */
  bool deepep;
  double deepep_efficiency_intra, deepep_efficiency_inter;

  /* per-operation fits: where one is present it replaces the link terms above for that
   * operation and link kind */
  struct profile_fit fits[PROFILE_LINK_COUNT][PROFILE_COLL_COUNT];

  /* host: the devices of a node (network.gpus_per_node of them, device d on node
   * d / gpus_per_node) are processes sharing cores_per_node cores; 0 (no "host" section):
   * every device has a processor of its own. instruction_overhead is the executor's own
   * work per instruction (on the rank's core), wait_core_share the part of a core a rank
   * waiting for communication takes by polling, comm_test the cost of one test of posted
   * communication (added to every communication's latency: the test that sees it end), and
   * wake_latency how late a waiting rank sees its communication end when every core of its
   * node is computing (the scheduler must first take a core from a computing rank).
   * loop_late is how late a rank waiting in the executor's loop sees its communication end
   * once it has been idle past loop_spin (the loop then sleeps between polls, and a message
   * needs both sides' polls), measured with a core free for each side; 0: not modelled.
   * Within loop_spin of going idle a rank polls without sleeping and is not late.
   * eager_bytes: a point-to-point message up to this size completes for its sender without
   * its receiver (MPI's eager protocol); a larger one once the receiver has polled and taken
   * it; 0 (absent): every send completes without its receiver. */
  uint32_t cores_per_node;
  /* executor "loop" (the default: piper-exec's host backend, each rank running its plan from
   * one loop on the node's cores, which the simulator then models) or "enqueue" (the cuda
   * backend: the host thread only enqueues, the devices' streams run apart) */
  bool host_loop;
  double instruction_overhead, wait_core_share, comm_test, wake_latency, loop_spin, loop_late;
  double eager_bytes;

  /* memory: the precision at which the profiled backend holds each kind ("memory" section;
   * facts of the backend's code, which piper-prof writes, not measurements) */
  struct profile_memory memory;

  /* measured table, sorted by (kind, pass, shape) */
  uint32_t n_entries;
  struct profile_entry *entries;

  /* synthetic costs (seconds) */
  double syn_f, syn_b, syn_bi, syn_bw, syn_optimizer, syn_comm;
  double syn_host; /* synthetic.host_ms: the host thread's time for every instruction */
};

struct profile *profile_load_file(const char *path, GError **err);
/* name is used in messages (a path). */
struct profile *profile_parse_json(const char *name, const cJSON *root, GError **err);
void profile_free(struct profile *p);

/* Time of one compute node on one device when it runs alone. mem_fraction is the part of that
 * time spent memory-bound (it is what a communication kernel's bandwidth share slows down);
 * measured_ops/fallback_ops count the node's ops costed from the table or by the roofline. */
struct profile_cost {
  double seconds;
  double host_seconds; /* the host's time to enqueue it (profile.host_launch > 0), else 0 */
  double mem_fraction;
  uint32_t measured_ops, fallback_ops;
};
struct profile_cost profile_compute_cost(const struct profile *p, const struct model *m,
                                         uint32_t segment, enum ir_pass pass,
                                         uint32_t shard_degree);
/* The same for a node divided by tensor parallelism (tp_degree <= 1: none): each op's FLOPs,
 * bytes and measured time scaled by ir_tp_op_share. */
struct profile_cost profile_compute_cost_tp(const struct profile *p, const struct model *m,
                                            uint32_t segment, enum ir_pass pass,
                                            uint32_t shard_degree, uint32_t tp_degree,
                                            bool sequence_parallel);
/* One op of the model (index into m->ops) alone, as profile_compute_cost_tp costs it. */
struct profile_cost profile_op_cost(const struct profile *p, const struct model *m, uint32_t op,
                                    enum ir_pass pass, uint32_t shard_degree, uint32_t tp_degree,
                                    bool sequence_parallel);
/* AdamW over `params` parameters held by one device. */
/* params: parameters the step updates; copied: parameters whose bf16 copy the backend remakes
 * with the update (weight_copy_bytes_per_param, measured by piper-prof as the update's extra
 * time), charged with it. */
struct profile_cost profile_optimizer_cost(const struct profile *p, double params,
                                          double copied);

/* Bytes per element at which the backend holds a plan's tensors for a model of dtype: the
 * profile's memory.activation_bytes, else the model's own (the plan's count). */
uint32_t profile_activation_bytes(const struct profile *p, enum model_dtype dtype);

/* Where a communication runs: p ranks over n_nodes nodes, with at least min_per_node of them on
 * every node spanned. p2p transfers are p = 2. */
struct profile_span {
  uint32_t p;
  uint32_t n_nodes;
  uint32_t min_per_node;
};
/* The span of a device list under the profile's GPUs per node (node = device / gpus_per_node). */
struct profile_span profile_span_of(const struct profile *pr, const uint32_t *devices, uint32_t n);

/* Alpha-beta cost split in the latency part (not shared) and the bandwidth part (shared by
 * concurrent transfers on the same link of a device). */
struct profile_comm_cost {
  double latency;
  double transfer; /* seconds at the full link bandwidth */
  bool inter_node;
};
/* kind is SEND/RECV (a p2p transfer of bytes), ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER (bytes =
 * the full buffer on one device) or ALL_TO_ALL (bytes = what one device sends in all). */
struct profile_comm_cost profile_comm_cost(const struct profile *p, enum ir_node_kind kind,
                                           uint64_t bytes, const struct profile_span *span);
/* The collective of a communication node kind (SEND and RECV: P2P), or PROFILE_COLL_COUNT. */
enum profile_collective profile_collective_of(enum ir_node_kind kind);

/* Processor sharing among the ranks of one node: the speed (0, 1] at which each of `running`
 * computing ranks runs when `waiting` more ranks poll for communication, on cores_per_node
 * cores. 1 when the profile has no cores_per_node. */
double profile_node_speed(const struct profile *p, double running, double waiting);
/* Effective bandwidth (bytes/s) and latency of a span: NVLink inside a node; across nodes the
 * share of the node's NICs held by the members on it. */
void profile_link(const struct profile *p, const struct profile_span *span, double *bandwidth,
                  double *latency);

#endif
