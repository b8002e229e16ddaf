/* directives: context parallelism (Megatron-LM's --context-parallel-size; ring attention, Liu
 * et al. 2023; Llama 3's all-gather of K/V, Dubey et al. 2024) as a rewrite of the IR.
 *
 * The directive. {"op": "context_parallel", "degree": c, "comm": "p2p" | "all_gather"} splits
 * every sequence over c devices of each stage's group, for the whole model (a sequence is cut
 * once, for every layer). Each sequence is cut into 2c equal chunks and rank i holds chunks i
 * and 2c-1-i, the causal load balance of Megatron and Transformer Engine: every rank then does
 * the same attention work. Like tensor_parallel it adds no devices: `place` / `replicate` give
 * a stage its tp x c x d devices, read in Megatron's rank order (TP innermost, then CP, then
 * DP: position p has tp rank p mod tp, cp rank (p div tp) mod c, dp rank p div (tp c)).
 *
 * What a device runs. The model is loaded with piper.context_parallel = c (compile.c), so its
 * ops are already one rank's share: seq_len / c tokens everywhere (GEMMs, norms, activations,
 * saved tensors, pipeline sends, TP collectives, all of them 1/c), and 1/c of the causal
 * attention core. What is left for this rewrite is the attention's view of the other ranks'
 * keys and values, inserted as IR nodes of purpose cp over the CP group (a communicator whose
 * instance is the c devices of one tp rank and one dp rank):
 *   - p2p (default): a ring of c - 1 point-to-point K/V exchanges per layer, overlapped with
 *     the block attention: modelled as one all-gather node (a ring all-gather is those c - 1
 *     steps) on stream "cp", beside the compute node (it starts with the compute's inputs and
 *     the compute's consumers wait for it), so the simulator overlaps it with compute and
 *     charges only what it does not hide. Backward sends K/V again and dK/dV back around the
 *     ring: an all-gather and a reduce-scatter node on "cp".
 *   - all_gather: the whole sequence's K/V gathered before the attention (on the compute's
 *     stream, exposed, as Llama 3 ran it); backward gathers again before and reduce-scatters
 *     dK/dV after.
 * A segment of L attention layers gets one node per kind and pass carrying the total bytes and
 * the count L (node.collectives), as the TP collectives do. The buffers the exchange holds are
 * the attention's workspace (ir_cp_buffer_bytes, lower.c). Gradients: the data-parallel
 * collectives run over the devices of one tp rank, i.e. over DP x CP, as Megatron reduces them.
 */
#include "context_parallel-impl.h"

static bool fail(const struct dir_program *p, uint32_t index, GError **err, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);
static bool fail(const struct dir_program *p, uint32_t index, GError **err, const char *fmt,
                 ...) {
  va_list ap;
  va_start(ap, fmt);
  char *what = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  piper_input_error(err, "%s: directive %u (context_parallel): %s", p->name, index, what);
  g_free(what);
  return false;
}

/* Node i runs on tp x cp x d devices, replicated over the d x cp of each tp rank. */
static bool check_node(const struct dir_program *p, const struct dir_directive *dd,
                       struct ir_graph *g, uint32_t i, GError **err) {
  struct ir_node *n = IR_NODE(g, i);
  uint32_t size = IR_GROUP(g, n->group)->count, tp = n->tp_degree > 1 ? n->tp_degree : 1;
  char nm[256];
  ir_node_name(g, i, nm, sizeof nm);
  /* experts (carved from the TP x CP x DP positions, carve_expert_node: their expert-DP
   * groups take CP in, as Megatron's do) route each CP rank's tokens, its share of the
   * sequence: they have no attention, nothing to exchange */
  if (n->shard_degree > 1)
    return true;
  if (size % (tp * dd->cp_degree) != 0)
    return fail(p, dd->index, err, "\"degree\" %u (x tensor parallelism %u) does not divide the "
                                   "%u devices \"%s\" runs on", dd->cp_degree, tp, size, nm);
  if (n->replica_degree * tp != size)
    return fail(p, dd->index, err, "\"%s\" runs on %u devices without a replicate over them: "
                                   "context parallelism needs every stage replicated over its "
                                   "devices (its gradients are reduced over DP x CP)", nm, size);
  n->cp_degree = dd->cp_degree;
  n->cp_comm = dd->cp_comm;
  return true;
}

bool dir_cp_apply(const struct dir_program *p, struct ir_graph *g, GError **err) {
  const struct dir_directive *dd = NULL;
  for (uint32_t d = 0; d < p->n; d++) {
    if (p->d[d].op != DIR_CONTEXT_PARALLEL)
      continue;
    if (dd)
      return fail(p, p->d[d].index, err, "given twice (directive %u is the first): a sequence "
                                         "is split once", dd->index);
    dd = &p->d[d];
  }
  const struct model *m = g->model;
  if ((!dd || dd->cp_degree <= 1) && m->context_parallel > 1) /* split, and nothing exchanged */
    return piper_input_error(err, "%s: the model %s has piper.context_parallel %lld, but the "
                                  "program has no context_parallel directive of that degree",
                             p->name, m->name, (long long)m->context_parallel);
  if (!dd || dd->cp_degree <= 1)
    return true;
  if (m->context_parallel != (int64_t)dd->cp_degree)
    return fail(p, dd->index, err, "the model %s was loaded for context parallelism %lld, not "
                                   "%u (piper-compile loads it with piper.context_parallel)",
                m->name, (long long)(m->context_parallel > 1 ? m->context_parallel : 1),
                dd->cp_degree);
  for (uint32_t i = 0; i < g->nodes->len; i++)
    if (IR_NODE(g, i)->kind == IR_NODE_COMPUTE && !check_node(p, dd, g, i, err))
      return false;
  return true;
}

/* A cp collective of kind standing for `layers` exchanges of kv bytes each, on stream. */
static uint32_t add_cp_collective(struct ir_graph *g, uint32_t like, enum ir_node_kind kind,
                                  uint64_t kv, uint32_t layers, uint32_t stream) {
  struct ir_node c = *IR_NODE(g, like);
  c.kind = kind;
  c.purpose = IR_COMM_CP;
  c.peer_group = IR_NONE;
  c.pair = IR_NONE;
  c.segset = IR_NONE;
  c.stream = stream;
  c.bytes = kv;
  c.collectives = layers > 1 ? layers : 0;
  return ir_graph_add_node(g, &c);
}

/* Temporal edges: from every node x waits on to `to`, and from `from` to every node waiting
 * on x (x's edges from adj, built before any node was added). */
static void wire_inputs(struct ir_graph *g, const struct ir_adjacency *adj, uint32_t x,
                        uint32_t to) {
  for (uint32_t k = adj->in_first[x]; k < adj->in_first[x + 1]; k++) {
    const struct ir_edge *e = IR_EDGE(g, adj->in_edges[k]);
    PIPER_ASSERT(e->kind == IR_EDGE_DEAD || IR_NODE(g, e->src)->group == IR_NODE(g, x)->group);
    if (e->kind != IR_EDGE_DEAD)
      ir_graph_add_edge(g, e->src, to, IR_EDGE_TEMPORAL, 0, 0);
  }
}
static void wire_outputs(struct ir_graph *g, const struct ir_adjacency *adj, uint32_t x,
                         uint32_t from) {
  for (uint32_t k = adj->out_first[x]; k < adj->out_first[x + 1]; k++) {
    const struct ir_edge *e = IR_EDGE(g, adj->out_edges[k]);
    PIPER_ASSERT(e->kind == IR_EDGE_DEAD || IR_NODE(g, e->dst)->group == IR_NODE(g, x)->group);
    if (e->kind != IR_EDGE_DEAD)
      ir_graph_add_edge(g, from, e->dst, IR_EDGE_TEMPORAL, 0, 0);
  }
}

static void insert_for_node(struct ir_graph *g, const struct ir_adjacency *adj, uint32_t x,
                            uint32_t cp_stream) {
  const struct ir_node *n = IR_NODE(g, x);
  uint64_t kv;
  uint32_t layers;
  ir_cp_segment_kv(g->model, n->segment, n->tp_degree, &kv, &layers);
  if (layers == 0 || n->pass == IR_PASS_BW)
    return;
  bool bwd = n->pass == IR_PASS_B || n->pass == IR_PASS_BI, ring = n->cp_comm == IR_CP_P2P;
  uint32_t stream = ring ? cp_stream : n->stream;
  /* adding nodes moves the node array: n is not used past here */
  uint32_t gather = add_cp_collective(g, x, IR_NODE_ALL_GATHER, kv, layers, stream);
  uint32_t scatter =
      bwd ? add_cp_collective(g, x, IR_NODE_REDUCE_SCATTER, kv, layers, stream) : IR_NONE;
  wire_inputs(g, adj, x, gather);
  if (ring) { /* beside the compute: both start with its inputs, its consumers wait for both */
    wire_outputs(g, adj, x, gather);
    if (scatter != IR_NONE) {
      ir_graph_add_edge(g, gather, scatter, IR_EDGE_TEMPORAL, 0, 0);
      wire_outputs(g, adj, x, scatter);
    }
    return;
  }
  ir_graph_add_edge(g, gather, x, IR_EDGE_TEMPORAL, 0, 0); /* gathered before the attention */
  if (scatter != IR_NONE) { /* dK/dV reduced after it */
    ir_graph_add_edge(g, x, scatter, IR_EDGE_TEMPORAL, 0, 0);
    wire_outputs(g, adj, x, scatter);
  }
}

void dir_cp_insert_comm(struct ir_graph *g) {
  if (g->model->context_parallel <= 1)
    return;
  uint32_t nn = g->nodes->len;
  bool any = false;
  for (uint32_t i = 0; i < nn && !any; i++)
    any = IR_NODE(g, i)->kind == IR_NODE_COMPUTE && IR_NODE(g, i)->cp_degree > 1;
  if (!any)
    return;
  uint32_t cp_stream = ir_graph_stream(g, "cp");
  struct ir_adjacency adj;
  ir_adjacency_build(g, &adj);
  for (uint32_t i = 0; i < nn; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_COMPUTE && n->cp_degree > 1)
      insert_for_node(g, &adj, i, cp_stream);
  }
  ir_adjacency_free(&adj);
}
