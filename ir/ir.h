/* ir: the global training DAG (docs/design.md, "The model and its annotations";
 * docs/design.md, "The directive phase order"). One graph holds every compute and communication
 * op of one training step. A node runs on a device group; replicas of a data-parallel group are
 * one node (they differ only in rank ids), so the graph stays small at thousands of devices.
 * Nodes, edges, groups and streams live in flat arrays and refer to each other by index.
 *
 *   GError *err = NULL;
 *   struct model *model = model_load_file("models/tiny-moe.json", 0, &err);
 *   struct ir_graph *g = model ? ir_graph_build(model) : NULL;  // F, B and optimizer nodes
 *   // here directives rewrite it: dir_program_apply (directives/directives.h)
 *   if (g && !ir_graph_dump_json(g, "ir.json", &err))
 *     fprintf(stderr, "%s\n", err->message);
 *   ir_graph_free(g);
 *   model_free(model);
 *   g_clear_error(&err);
 */
#ifndef PIPER_IR_IR_H
#define PIPER_IR_IR_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../models/model.h"

#define IR_NONE UINT32_MAX
#define IR_MAX_TAGS 12          /* model tags + split dimensions */
#define IR_MAX_DEVICES (1 << 20) /* largest device id + 1 accepted (= LAYOUT_MAX_DEVICES) */
#define IR_MAX_NODES (4u << 20) /* a rewrite that would exceed it is refused */
#define IR_NAME_MAX 32          /* stream and tag names */

/* R: a forward rerun for backward under recompute (its node's `recompute` says how much). */
enum ir_pass { IR_PASS_F, IR_PASS_B, IR_PASS_BI, IR_PASS_BW, IR_PASS_R, IR_PASS_NONE };

enum ir_node_kind {
  IR_NODE_COMPUTE,        /* a model segment in one pass */
  IR_NODE_SEND,           /* to peer_group, same position in the group */
  IR_NODE_RECV,           /* from peer_group, same position in the group */
  IR_NODE_ALL_REDUCE,     /* gradient sync over group */
  IR_NODE_REDUCE_SCATTER, /* gradient sync under shard_optimizer / grads / params */
  IR_NODE_ALL_GATHER,     /* parameter gather under shard_params */
  IR_NODE_ALL_TO_ALL,     /* expert dispatch / combine under shard */
  IR_NODE_OPTIMIZER,      /* AdamW update of the parameters one device group holds */
  IR_NODE_KIND_COUNT
};

enum ir_edge_kind { IR_EDGE_DATA, IR_EDGE_TEMPORAL, IR_EDGE_DEAD };

/* Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in
 * Large Transformer Models"; Megatron's --recompute-granularity): none; full (the forward
 * keeps only the segment's input and reruns before backward); selective (only the attention
 * core's own activations are dropped and recomputed). */
enum ir_recompute { IR_RECOMPUTE_NONE, IR_RECOMPUTE_FULL, IR_RECOMPUTE_SELECTIVE };
#define IR_RECOMPUTE_MODULES_DEFAULT MODEL_MODULE_BIT(MODEL_MODULE_CORE_ATTN)

/* What a communication node serves, which fixes its communicator purpose. */
/* TP: the tensor-parallel collectives of a compute node (tensor_parallel, IR_COMM_TP). CP: the
 * K/V exchange of context parallelism's attention (context_parallel, IR_COMM_CP). */
enum ir_comm_purpose { IR_COMM_NONE, IR_COMM_PP, IR_COMM_DP, IR_COMM_EP, IR_COMM_TP, IR_COMM_CP };
#define IR_COMM_PURPOSE_COUNT 6

/* How context parallelism's attention sees the other ranks' K/V (directives/context_parallel.c):
 * a ring of point-to-point exchanges overlapped with the block attention (Megatron's
 * cp_comm_type p2p), or one all-gather before it (Llama 3's). */
enum ir_cp_comm { IR_CP_P2P, IR_CP_ALL_GATHER };

struct ir_node {
  enum ir_node_kind kind;
  enum ir_pass pass; /* compute: its pass; comm: the pass it serves; else NONE */
  enum ir_comm_purpose purpose;
  int32_t tags[IR_MAX_TAGS]; /* value per graph tag name, -1 = absent */
  uint32_t segment;          /* compute: model segment; all-to-all/gather: the segment served */
  uint32_t group;            /* device group running it */
  uint32_t peer_group;       /* send: destination, recv: source; else IR_NONE */
  uint32_t stream;           /* logical stream (graph stream table) */
  uint32_t pair;             /* send <-> recv partner node */
  uint32_t segset;           /* collectives, gathers, optimizer: the segments they cover */
  uint64_t bytes;            /* comm: payload per device; compute: output bytes */
  uint32_t shard_degree;     /* compute on an expert region: EP group size, else 1. Each
                              * device holds 1/shard_degree of the experts and runs as many
                              * routed tokens as its own micro-batch has (EP group = DP group) */
  /* expert parallelism (shard_degree > 1): the receive capacity factor of the shard directive
   * (ir_ep_capacity_rows); 0 = IR_EP_CAPACITY_FACTOR_DEFAULT */
  double capacity_factor;
  /* expert parallelism: the saved routed rows (the experts' GEMM inputs) in FP8, 1 byte an
   * element and an fp32 scale per 128 (DeepSeek-V3's FP8 caching; ir_ep_saved_bytes): the
   * shard directive's fp8_expert_inputs, costed by the simulator, run by the executor
   * (exec/expert_parallel.c) */
  bool fp8_expert_inputs;
  /* Expert parallelism as its own dimension (a shard with a "degree"): expert groups carved
   * from the stage's TP x DP grid as Megatron's expert-model-parallel groups are. Position p of
   * the stage's group has expert-TP rank p mod tp_degree, EP rank (p / tp_degree) mod
   * shard_degree and expert-DP rank p / (tp_degree x shard_degree); expert_replicas is the
   * expert-DP size, the devices holding the same experts (their gradients are summed over
   * them), 0 or 1 = none (the EP group is every device of one TP rank). On the expert nodes,
   * their all-to-alls and their gradient collectives. */
  uint32_t expert_replicas;
  /* Experts with a smaller TP than the dense layers (expert_tensor_parallel < tp, under
   * sequence parallelism): each device routes 1/route_split of its micro-batch's tokens, its
   * sequence shard of the TP group, as Megatron's experts do; 0 or 1 = every token. */
  uint32_t route_split;
  uint32_t replica_degree;   /* data-parallel replicas of this node (group size), 1 if none */
  /* ZeRO levels of the replicate directive that placed it: shard_optimizer (1), shard_grads
   * (2, implies 1), shard_params (3, implies 2) */
  bool shard_optimizer, shard_grads, shard_params;
  /* Tensor parallelism (directives/tensor_parallel.c): 0 or 1 = none; else the node's group is
   * tp_degree x replica_degree (or x shard_degree) devices, TP innermost (position p has TP rank
   * p mod tp_degree). Compute nodes run 1/tp_degree of their segment as ir_tp_op_share says;
   * collectives over the group inherit it and run over one TP rank's devices (dp, ep) or one
   * TP group (tp). sequence_parallel divides norms and activations between layers too. */
  uint32_t tp_degree;
  bool sequence_parallel;
  uint32_t collectives; /* a tp or cp node: how many collectives of bytes/collectives it stands for */
  /* Context parallelism (directives/context_parallel.c): 0 or 1 = none; else the node's group is
   * tp_degree x cp_degree x d devices, TP innermost then CP (Megatron's order), each CP rank
   * holding 2 of the 2 x cp_degree chunks of every sequence (the model's ops are one rank's
   * share, models/model.h). cp_comm: how its K/V travel. */
  uint32_t cp_degree;
  enum ir_cp_comm cp_comm;
  /* F under a recompute directive (it saves less) and its R rerun; NONE elsewhere */
  enum ir_recompute recompute;
  /* under SELECTIVE: the modules it drops and reruns (MODEL_MODULE_BIT of enum model_module;
   * IR_RECOMPUTE_MODULES_DEFAULT, the attention core, unless the directive names others) */
  uint32_t recompute_modules;
  uint32_t directive; /* last directive that rewrote it (for messages), IR_NONE */
  /* Lowering's tie-break among ready nodes (lower first): an `order` slot and the node's
   * place in the slot's interleaving, or by default pass then micro-batch (GPipe-like).
   * Communication nodes inherit their producers' priority when lowered. */
  uint64_t priority;
};

struct ir_edge {
  uint32_t src, dst;
  enum ir_edge_kind kind;
  uint32_t slot;  /* data: which output of src (0 = out, 1 = saved activations) */
  uint64_t bytes; /* data: tensor bytes per device */
};

/* A device group: devices[first .. first+count) of the graph's device pool. Interned: equal
 * lists share one id. Position in the list is the rank within the group. */
struct ir_group {
  uint32_t first, count;
};

/* A set of model segments handled together: a gradient bucket (synced by one collective), a
 * ZeRO-3 gather unit, or what one optimizer node updates. segments[first .. first+count) of
 * the graph's segment pool. */
struct ir_segset {
  uint32_t first, count;
  uint64_t param_bytes; /* on one device (expert segments divided by their shard degree) */
};

/* A logical stream. Priority and SM share come from `stream` directives. */
struct ir_stream {
  char name[IR_NAME_MAX];
  int32_t priority; /* higher runs first where the backend can say so; 0 default */
  double sm_share;  /* fraction of the device's SMs it may use; 1 = no limit */
};

/* What lowering takes a compute node's duration to be when it orders the sends and receives
 * of a stream that several kinds of pipeline traffic share (it never changes what a plan
 * means, only that order): its FLOPs, as on a real device (the default), or textbook units
 * (F 1, B 2, BI and BW 1), as on a synthetic profile. */
enum ir_cost_model { IR_COST_FLOPS, IR_COST_UNIT };

struct ir_graph {
  const struct model *model; /* not owned */
  enum ir_cost_model cost_model;
  uint32_t n_tags;
  char tag_names[IR_MAX_TAGS][MODEL_TAG_NAME_MAX]; /* model tags then split dims (e.g. MB) */

  GArray *nodes;           /* struct ir_node */
  GArray *edges;           /* struct ir_edge */
  GArray *groups;          /* struct ir_group */
  GArray *device_pool;     /* uint32_t */
  GHashTable *group_index; /* interned device lists -> group id + 1 */
  GArray *streams;         /* struct ir_stream; 0 = "compute" */
  GArray *segsets;         /* struct ir_segset */
  GArray *segment_pool;    /* uint32_t model segment ids */
  uint32_t n_devices;      /* largest device id used + 1 */
  uint32_t n_microbatches; /* product of split counts, 1 before any split */
  uint32_t *segment_tp;    /* [n_segments] TP degree per segment (0 = none); NULL without TP */
};

#define IR_NODE(g, i) (&g_array_index((g)->nodes, struct ir_node, (i)))
#define IR_EDGE(g, i) (&g_array_index((g)->edges, struct ir_edge, (i)))
#define IR_GROUP(g, i) (&g_array_index((g)->groups, struct ir_group, (i)))
#define IR_STREAM(g, i) (&g_array_index((g)->streams, struct ir_stream, (i)))
#define IR_SEGSET(g, i) (&g_array_index((g)->segsets, struct ir_segset, (i)))
#define IR_GROUP_DEVICES(g, i) (&g_array_index((g)->device_pool, uint32_t, IR_GROUP(g, i)->first))

/* The unsplit training DAG: per model segment an F and a B node (tags copied from the model),
 * data edges in forward and reversed in backward, F -> B edges for saved activations, and one
 * optimizer node per PP region after every B of the region. Everything on group {0}. */
struct ir_graph *ir_graph_build(const struct model *m);
void ir_graph_free(struct ir_graph *g);

uint32_t ir_graph_add_node(struct ir_graph *g, const struct ir_node *n);
uint32_t ir_graph_add_edge(struct ir_graph *g, uint32_t src, uint32_t dst, enum ir_edge_kind kind,
                           uint32_t slot, uint64_t bytes);
/* Interns a device list (order matters: it fixes ranks within the group). */
uint32_t ir_graph_group(struct ir_graph *g, const uint32_t *devices, uint32_t count);
/* Adds a segment set; param_bytes is computed from the model and the shard degrees given
 * (shard_degree[i] for segments[i], NULL = all 1). */
uint32_t ir_graph_add_segset(struct ir_graph *g, const uint32_t *segments, uint32_t count,
                             const uint32_t *shard_degree);
/* Interns a stream name (new streams get priority 0, share 1). */
uint32_t ir_graph_stream(struct ir_graph *g, const char *name);
/* Tag index of name, adding it when add is true; -1 when absent and not added, or full. */
int ir_graph_tag(struct ir_graph *g, const char *name, bool add);
/* Position of device in group, or -1. */
int ir_group_position(const struct ir_graph *g, uint32_t group, uint32_t device);

/* Removes dead edges (kind IR_EDGE_DEAD), keeping the order of the others. */
void ir_graph_compact(struct ir_graph *g);

/* Adjacency in CSR form, built on demand after rewrites. */
struct ir_adjacency {
  uint32_t *out_first, *out_edges; /* out_edges[out_first[v] .. out_first[v+1]) */
  uint32_t *in_first, *in_edges;
};
void ir_adjacency_build(const struct ir_graph *g, struct ir_adjacency *adj);
void ir_adjacency_free(struct ir_adjacency *adj);

/* Topological positions (Kahn's algorithm: sources in id order, then first in, first out) kept
 * up to date while edges are only added, as the order phase adds each rank's temporal edges:
 * ir_topo_update gives exactly the positions a sort from scratch (ir_topo_init) would, re-running
 * only from the first step the new edges change (ir/topo.c says why that is exact). False on a
 * cycle, *stuck then a node on it (the lowest-numbered compute node still waiting, else the
 * lowest-numbered node). The graph's nodes must not change between calls, nor its edges but by
 * ir_graph_add_edge.
 *   struct ir_topo t;
 *   bool ok = ir_topo_init(&t, g, &stuck);   // t.pos[v]: v's position
 *   ir_graph_add_edge(g, u, v, IR_EDGE_TEMPORAL, 0, 0);
 *   ok = ok && ir_topo_update(&t, g, &stuck);
 *   ir_topo_free(&t); */
struct ir_topo_extra {
  uint32_t dst, next; /* an edge added after ir_topo_init; next: its source's next, or IR_NONE */
};
struct ir_topo {
  uint32_t n_nodes, n_edges;     /* g->edges[0 .. n_edges) taken in */
  uint32_t *out_first, *out_dst; /* out-lists of the edges at ir_topo_init (CSR, destinations) */
  GArray *extra;                 /* struct ir_topo_extra: edges added since, by source */
  uint32_t *extra_head, *extra_tail;
  uint32_t *indeg;
  uint32_t *order; /* the node at each position */
  uint32_t *pos;   /* the position of each node */
  uint32_t *enq;   /* the position whose node's removal queued it; IR_NONE: a source */
  uint32_t *rem;   /* in-degree left while sorting */
  uint32_t done;   /* nodes queued (n_nodes unless a cycle) */
};
bool ir_topo_init(struct ir_topo *t, const struct ir_graph *g, uint32_t *stuck);
bool ir_topo_update(struct ir_topo *t, const struct ir_graph *g, uint32_t *stuck);
void ir_topo_free(struct ir_topo *t);

/* A filter (docs/design.md, "The directive phase order"): every key must match. value >= 0
 * matches that index, IR_FILTER_ANY any value with the tag present. pass is IR_PASS_NONE when the
 * filter has no PASS key. A filter PASS of B also matches BI and BW nodes (the backward of the
 * key, however split). */
#define IR_FILTER_ANY (-2)
#define IR_FILTER_UNSET (-1)
struct ir_filter {
  int32_t tags[IR_MAX_TAGS]; /* IR_FILTER_UNSET = key not in the filter */
  enum ir_pass pass;
};
bool ir_filter_match(const struct ir_filter *f, const struct ir_node *n);

/* The gradient sync of a tied embedding split across pipeline stages: an all-reduce that
 * covers no segment set, between the stage holding the embedding and the one holding the LM
 * head's copy of it (segment: the head's). Every other data-parallel collective has a set. */
static inline bool ir_node_is_tied_sync(const struct ir_node *n) {
  return n->kind == IR_NODE_ALL_REDUCE && n->purpose == IR_COMM_DP && n->segset == IR_NONE;
}

/* Tensor parallelism's division of the model (ir/tensor_parallel.c). The share of an op's
 * FLOPs, bytes and saved activations one of tp devices runs or holds (1 when tp <= 1): 1/tp for
 * the column / row divided ops (attention, MLP, shared expert, expert FFN, embedding and LM
 * head over the vocabulary), 1 for what stays replicated (RMSNorm, residual add, router), or
 * 1/tp for those under sequence parallelism. */
double ir_tp_op_share(const struct model_op *op, uint32_t tp, bool sequence_parallel);
/* Parameters are divided like the op, except that norms and the router stay whole even under
 * sequence parallelism. Per device, for a segment. */
uint64_t ir_tp_segment_param_bytes(const struct model *m, uint32_t segment, uint32_t tp);
/* Saved activations per device: the divided ops' own tensors / tp, their replicated inputs
 * ([T, hidden]) whole unless sequence_parallel. */
uint64_t ir_tp_segment_saved_bytes(const struct model *m, uint32_t segment, uint32_t tp,
                                   bool sequence_parallel);
/* What the segment's modules (a MODEL_MODULE_BIT mask) save on one device: what selective
 * recomputation drops after F and R rebuilds (the attention cores' output and log-sum-exp,
 * divided by heads under TP; the other modules only at tp <= 1, directives/apply.c). */
uint64_t ir_tp_segment_module_bytes(const struct model *m, uint32_t segment, uint32_t tp,
                                    uint32_t modules);
/* What compute node n (a forward or a rerun) saves that only its input-gradient pass reads
 * (ir/saved_readers.c): attention's q, k, v, MLA's rebuilt q, k, v, the router's
 * probabilities, per device. Where the backward is split (BI, BW), lowering gives it a saved
 * tensor of its own, released at BI's end; 0 under context parallelism and for EP experts. */
uint64_t ir_bi_only_saved_bytes(const struct model *m, const struct ir_node *n);
/* The forward FLOPs a selective rerun of the segment's modules computes. */
double ir_segment_module_flops(const struct model *m, uint32_t segment, uint32_t modules);
/* What a compute node of segment holds on one device besides its tensors (the memory rule's
 * workspace, models/model.h), one op group at a time (model_group_end: a trainer holds one
 * layer's transients, docs/memory.md; in a backward model_bwd_group_end, one block of a layer),
 * so the most any group holds: in pass F its scratch and
 * the outputs nothing keeps; in B the gradients of its values, bwork and scratch, and the
 * residual stream's gradient it hands the group before; in BI its scratch; in BW nothing;
 * *keep the part BI keeps for BW, summed over the segment's groups. Each op's bwork and scratch
 * are divided as its work is (ir_tp_op_share); the [T, hidden] values and gradients between
 * ops only under sequence parallelism, which adds the [T, hidden] buffers its all-gathers fill
 * (a divided op's input, its output gradient), again for each group. */
uint64_t ir_tp_segment_work(const struct model *m, uint32_t segment, enum ir_pass pass, uint32_t tp,
                            bool sequence_parallel, uint64_t *keep);
/* The most a group of segment holds under selective recomputation of modules: in F its F
 * workspace and what it no longer saves (ir_tp_segment_module_bytes, per group); in R what
 * its reruns hold while they run (model_op.module_rerun_work_bytes, per group). */
uint64_t ir_tp_segment_work_modules(const struct model *m, uint32_t segment, enum ir_pass pass,
                                    uint32_t tp, bool sequence_parallel, uint32_t modules);
/* Context parallelism's K/V (ir/context_parallel.c), for a model loaded with
 * context_parallel > 1. The K and V of the whole sequence on one TP rank, summed over the
 * segment's attention layers (*layers of them): what each of them gathers (the ring's p2p
 * steps move (cp - 1) / cp of it, as a ring all-gather does), and what backward's dK/dV
 * reduce-scatter moves. */
void ir_cp_segment_kv(const struct model *m, uint32_t segment, uint32_t tp, uint64_t *kv_bytes,
                      uint32_t *layers);
/* What a compute node's attention holds for the exchange while it runs, one layer at a time:
 * p2p, two blocks of one rank's K/V (one at cp 2), and two of dK/dV in B and BI; all_gather,
 * the whole sequence's K/V (and dK/dV). 0 in BW and without context parallelism. */
uint64_t ir_cp_buffer_bytes(const struct model *m, uint32_t segment, enum ir_pass pass,
                            uint32_t tp, enum ir_cp_comm comm);
/* The TP collectives a compute node of segment in pass implies: *count of them moving *bytes
 * in total per device (all-reduces; under sequence parallelism each is a reduce-scatter plus an
 * all-gather of the same size). */
void ir_tp_segment_comm(const struct model *m, uint32_t segment, enum ir_pass pass,
                        uint64_t *bytes, uint32_t *count);
/* Why tp cannot divide the model (heads, KV heads, FFN sizes, vocabulary, experts' FFN, and
 * the tokens of a micro-batch under sequence parallelism), written into why; true if it can. */
bool ir_tp_check_model(const struct model *m, uint32_t tp, bool sequence_parallel, char *why,
                       size_t len);

/* Expert parallelism (ir/expert.c): what an expert-parallel device holds, per micro-batch and
 * expert layer, at the capacity its plan states. An EP device receives at most
 * ir_ep_capacity_rows routed rows (tokens x top_k on average: each device sends that many), and
 * every buffer of routed rows on the experts' side is allocated at that many rows, whatever the
 * routing, so that the simulator and the executor hold the same bytes. */
#define IR_EP_CAPACITY_FACTOR_DEFAULT 2.0
#define IR_EP_CAPACITY_FACTOR_MAX 1024.0
/* min(ceil(factor x T x top_k), shard_degree x T x top_k): T tokens per micro-batch. */
uint64_t ir_ep_capacity_rows(const struct model *m, const struct ir_node *n);
/* The sizes of an EP expert node n (shard_degree > 1; under TP each row's gate / up of F / tp,
 * the rows whole): rows received (or their outputs,
 * or either's gradients), its saved activations (for the backward), its workspace in its pass
 * (*keep: what BI keeps for BW), the dispatch's routing tables (the token side's route of each
 * (token, k) and the received rows' experts, kept until the last backward that reads them), the
 * routed rows of one micro-batch on the token side ([T x top_k, hidden]: an all-to-all's send
 * or receive buffer), the received rows' routing weights or their gradients (beside the rows
 * in F, beside their gradients in B) and an all-to-all's send buffers (into: toward the
 * experts). The combine keeps nothing: the experts apply the routing weights. */
bool ir_ep_sized(const struct ir_node *n);
uint64_t ir_ep_rows_bytes(const struct model *m, const struct ir_node *n);
uint64_t ir_ep_saved_bytes(const struct model *m, const struct ir_node *n);
uint64_t ir_ep_work_bytes(const struct model *m, const struct ir_node *n, uint64_t *keep);
uint64_t ir_ep_route_bytes(const struct model *m, const struct ir_node *n);
uint64_t ir_ep_combine_bytes(const struct model *m, const struct ir_node *n);
uint64_t ir_ep_weights_bytes(const struct model *m, const struct ir_node *n);
uint64_t ir_ep_a2a_work_bytes(const struct model *m, const struct ir_node *n, bool into);
/* What compute node n stops saving under selective recomputation of modules on its devices:
 * ir_tp_segment_module_bytes, or for EP experts their silu(gate)·up rows at the capacity
 * (moe_act). */
uint64_t ir_node_module_bytes(const struct model *m, const struct ir_node *n, uint32_t modules);

const char *ir_pass_name(enum ir_pass p);
const char *ir_node_kind_name(enum ir_node_kind k);
/* A readable, unique name such as "F PP=0 EP=1 MB=3", "send F PP=0 MB=3 ->g2",
 * "all_reduce PP=1 set=4". The graph form and the form plans use (nodes + tag names). */
void ir_node_name(const struct ir_graph *g, uint32_t node, char *buf, size_t len);
void ir_node_format_name(const struct ir_node *n, uint32_t n_tags,
                         const char (*tag_names)[MODEL_TAG_NAME_MAX], char *buf, size_t len);

/* Dumps (--dump-ir, --dump-dot). */
bool ir_graph_dump_json(const struct ir_graph *g, const char *path, GError **err);
bool ir_graph_dump_dot(const struct ir_graph *g, const char *path, GError **err);

#endif
