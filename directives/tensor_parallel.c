/* directives: tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism
 * (Korthikanti et al. 2022) as a rewrite of the IR.
 *
 * The directive. {"op": "tensor_parallel", "filter": F, "degree": t, "sequence_parallel": b}
 * divides every compute node F matches over t devices of its own device group. It adds no
 * devices: `place` (and `replicate` / `shard`) give a stage its whole group of t x d devices,
 * and tensor_parallel says that t of them share each layer. It composes with place, replicate,
 * shard and every schedule, because a schedule's split / order directives only see nodes, and
 * nodes keep their tags. It is applied after replicate / shard (phase 4b).
 *
 * Two-dimensional device groups. A TP node's group of t x d devices is read in Megatron's rank
 * order, TP innermost: position p in the group has tp_rank = p mod t and dp_rank = p div t, so
 * a `place` over consecutive device ids keeps each TP group inside a node. The node then carries
 * tp_degree = t, and its replica_degree (data parallelism) or shard_degree (expert parallelism)
 * becomes d. No new groups are made: a communicator (struct plan_comm) gains a `split` = t that
 * says which positions of its group form one instance:
 *   - purpose tp: positions [p - p mod t, p - p mod t + t), the TP peers of the device;
 *   - purpose dp / ep with split t: positions with the same TP rank, {p mod t + k t}.
 * So the gradient collectives of replicate run over the d devices that hold the same slices,
 * and the expert all-to-all too.
 *
 * Experts: EP over DP with TP inside (Megatron's expert tensor parallelism equal to TP): the
 * experts are divided over the d data-parallel positions as `shard` does today, and every
 * expert's FFN is column / row divided over the t TP peers, like the dense MLP.
 *
 * What a device holds and runs (ir/tensor_parallel.c, ir_tp_op_share): column-parallel Q/K/V
 * and MLP up/gate, row-parallel attention output and MLP down: FLOPs, bytes, parameters and
 * saved activations of attention (MLA: its projections and core), MLP, shared expert and expert
 * FFN divided by t; heads and KV heads divided (an error names the file, the directive and the
 * numbers when t does not divide heads, KV heads, FFN sizes, vocabulary or, under SP, the
 * tokens); vocabulary-parallel embedding and LM head with a parallel cross-entropy (logits never
 * gathered: two all-reduces of [T] fp32 statistics plus one of the target logits); router
 * replicated; RMSNorm and residual adds replicated unless sequence_parallel, which divides them,
 * their saved inputs and the activations between layers (and sent between stages) by t.
 *
 * Communication, inserted as IR nodes with purpose tp on the node's own stream (Megatron's TP
 * collectives are synchronous with compute): per layer, an all-reduce of [T, hidden] after each
 * row-parallel block in forward (attention, FFN) and one before each column-parallel block in
 * backward (the input gradient of attention and FFN). A segment of L layers has 2L of them per
 * pass; they are modelled as ONE node per compute node, carrying the total bytes and the count
 * of collectives (node.collectives), so the simulator charges count latencies and the total
 * transfer (the compute between them is in the compute node). With sequence_parallel each
 * all-reduce becomes a reduce-scatter and an all-gather (two nodes, same total bytes as a ring
 * all-reduce moves). The vocabulary-parallel embedding adds an all-reduce of [T, hidden] in
 * forward; the LM head's cross-entropy its three [T] fp32 all-reduces in forward and an
 * all-reduce of its input gradient in backward. BW nodes (weight gradients) need none.
 */
#include <string.h>

#include "tensor_parallel-impl.h"

static bool fail(const struct dir_program *p, const struct dir_directive *dd, GError **err,
                 const char *fmt, ...) G_GNUC_PRINTF(4, 5);
static bool fail(const struct dir_program *p, const struct dir_directive *dd, GError **err,
                 const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *what = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  piper_input_error(err, "%s: directive %u (tensor_parallel): %s", p->name, dd->index, what);
  g_free(what);
  return false;
}

static char *node_name(const struct ir_graph *g, uint32_t i) {
  char buf[256];
  ir_node_name(g, i, buf, sizeof buf);
  return g_strdup(buf);
}

/* Divides one matched compute node: the group of tp x d devices keeps its data-parallel or
 * expert-parallel meaning over d. */
static bool divide_node(const struct dir_program *p, const struct dir_directive *dd,
                        struct ir_graph *g, uint32_t i, GError **err) {
  struct ir_node *n = IR_NODE(g, i);
  uint32_t tp = dd->tp_degree, size = IR_GROUP(g, n->group)->count;
  bool ok = false;
  char *nm = node_name(g, i);
  if (n->tp_degree > 1 && (n->tp_degree != tp || n->sequence_parallel != dd->sequence_parallel)) {
    fail(p, dd, err, "\"%s\" is already divided by %u by an earlier tensor_parallel", nm,
         n->tp_degree);
    goto out;
  }
  if (n->tp_degree > 1) {
    ok = true; /* matched twice alike */
    goto out;
  }
  if (size % tp != 0) {
    fail(p, dd, err, "\"degree\" %u does not divide the %u devices \"%s\" runs on", tp, size, nm);
    goto out;
  }
  /* experts under `replicate` and `shard` over the same devices are both: EP over DP keeps
   * both meanings over the d positions */
  bool replicated = size > 1 && n->replica_degree == size, sharded = size > 1 && n->shard_degree == size;
  if (replicated)
    n->replica_degree = size / tp;
  if (sharded)
    n->shard_degree = size / tp;
  if (!replicated && !sharded && size != tp) {
    fail(p, dd, err,
         "\"%s\" runs on %u devices, neither replicated nor sharded: tensor parallelism of %u "
         "needs exactly %u (or replicate / shard over all %u)",
         nm, size, tp, tp, size);
    goto out;
  }
  n->tp_degree = tp;
  n->sequence_parallel = dd->sequence_parallel;
  uint32_t *seg_tp = &g->segment_tp[n->segment];
  if (*seg_tp && *seg_tp != tp) {
    fail(p, dd, err, "\"%s\": its segment is divided by %u elsewhere", nm, *seg_tp);
    goto out;
  }
  *seg_tp = tp;
  ok = true;
out:
  g_free(nm);
  return ok;
}

static bool apply_directive(const struct dir_program *p, const struct dir_directive *dd,
                            struct ir_graph *g, GError **err) {
  char why[160];
  if (!ir_tp_check_model(g->model, dd->tp_degree, dd->sequence_parallel, why, sizeof why))
    return fail(p, dd, err, "\"degree\" %s (model %s)", why, g->model->name);
  if (dd->tp_degree <= 1)
    return true; /* degree 1: nothing divided */
  const struct model *m = g->model;
  if (m->tie_word_embeddings && m->pp_regions > 1)
    return fail(p, dd, err, "tied embeddings split over pipeline stages (model %s) are not "
                            "supported with tensor parallelism yet", m->name);
  char *ctx = g_strdup_printf("%s: directive %u (tensor_parallel)", p->name, dd->index);
  struct ir_filter f;
  bool ok = dir_filter_resolve(&dd->filter, g, &f, ctx, err);
  g_free(ctx);
  if (!ok)
    return false;
  if (!g->segment_tp)
    g->segment_tp = g_new0(uint32_t, m->n_segments ? m->n_segments : 1);
  uint32_t matched = 0;
  for (uint32_t i = 0; ok && i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE || !ir_filter_match(&f, n))
      continue;
    matched++;
    ok = divide_node(p, dd, g, i, err);
  }
  if (ok && matched == 0)
    return fail(p, dd, err, "\"filter\" matches nothing");
  return ok;
}

/* Every pass and micro-batch of a divided segment must be divided alike: a forward on tp
 * slices whose backward held the whole layer would be a different model. */
static bool check_whole_segments(const struct dir_program *p, const struct ir_graph *g,
                                 GError **err) {
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    uint32_t want = g->segment_tp[n->segment], have = n->tp_degree > 1 ? n->tp_degree : 0;
    if (want == have)
      continue;
    char *nm = node_name(g, i);
    piper_input_error(err,
                      "%s: tensor_parallel: \"%s\" is not divided but other passes or "
                      "micro-batches of its segment are (by %u): match every pass",
                      p->name, nm, want);
    g_free(nm);
    return false;
  }
  return true;
}

/* Saved activations per device, and under sequence parallelism the sequence shards that flow
 * between segments (and stages). */
static void divide_edges(struct ir_graph *g) {
  for (uint32_t e = 0; e < g->edges->len; e++) {
    struct ir_edge *ed = IR_EDGE(g, e);
    const struct ir_node *src = IR_NODE(g, ed->src);
    if (ed->kind != IR_EDGE_DATA || src->kind != IR_NODE_COMPUTE || src->tp_degree <= 1)
      continue;
    if (ed->slot == 1)
      ed->bytes = ir_tp_segment_saved_bytes(g->model, src->segment, src->tp_degree,
                                            src->sequence_parallel);
    else if (src->sequence_parallel)
      ed->bytes /= src->tp_degree;
  }
}

bool dir_tp_apply(const struct dir_program *p, struct ir_graph *g, GError **err) {
  bool any = false;
  for (uint32_t d = 0; d < p->n; d++) {
    if (p->d[d].op != DIR_TENSOR_PARALLEL)
      continue;
    if (!apply_directive(p, &p->d[d], g, err))
      return false;
    any = any || p->d[d].tp_degree > 1;
  }
  if (!any)
    return true;
  if (!check_whole_segments(p, g, err))
    return false;
  divide_edges(g);
  /* The sets made before (the graph's optimizers, undivided) now hold each device's slices. */
  for (uint32_t k = 0; k < g->segsets->len; k++) {
    struct ir_segset *ss = IR_SEGSET(g, k);
    ss->param_bytes = 0;
    for (uint32_t j = 0; j < ss->count; j++) {
      uint32_t s = g_array_index(g->segment_pool, uint32_t, ss->first + j);
      ss->param_bytes += ir_tp_segment_param_bytes(g->model, s, g->segment_tp[s]);
    }
  }
  return true;
}

/* The TP degree of a segment set's segments (they share a stage, hence a degree), 0 if none. */
static uint32_t segset_tp(const struct ir_graph *g, uint32_t segset) {
  const struct ir_segset *ss = IR_SEGSET(g, segset);
  for (uint32_t j = 0; j < ss->count; j++) {
    uint32_t tp = g->segment_tp[g_array_index(g->segment_pool, uint32_t, ss->first + j)];
    if (tp > 1)
      return tp;
  }
  return 0;
}

void dir_tp_fix_data_parallel(struct ir_graph *g) {
  if (!g->segment_tp)
    return;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    struct ir_node *n = IR_NODE(g, i);
    bool dp = n->purpose == IR_COMM_DP && n->kind != IR_NODE_SEND && n->kind != IR_NODE_RECV;
    if ((!dp && n->kind != IR_NODE_OPTIMIZER) || n->segset == IR_NONE)
      continue;
    if (dp && n->expert_replicas > 1)
      continue; /* an expert-DP sum: its split and bytes are set where it is made */
    uint32_t tp = segset_tp(g, n->segset), size = IR_GROUP(g, n->group)->count;
    if (tp <= 1 || size % tp != 0)
      continue;
    n->tp_degree = tp;
    if (n->replica_degree == size)
      n->replica_degree = size / tp;
    /* the buckets summed whole segments; each device holds 1/tp of their weights, and of
     * experts sharded by EP (a DualPipe copies' sum of them, shard_degree > 1: every segment
     * of such a bucket is sharded alike, copy_sync_buckets) 1/shard_degree of those */
    if (dp)
      n->bytes = IR_SEGSET(g, n->segset)->param_bytes / (n->shard_degree > 1 ? n->shard_degree : 1);
  }
}

/* One collective node of kind after the node `like`, standing for count collectives moving
 * bytes in total; edges from `from`. */
static uint32_t add_tp_collective(struct ir_graph *g, uint32_t like, uint32_t from,
                                  enum ir_node_kind kind, uint64_t bytes, uint32_t count,
                                  uint64_t buffer) {
  struct ir_node c = *IR_NODE(g, like);
  c.kind = kind;
  c.purpose = IR_COMM_TP;
  c.peer_group = IR_NONE;
  c.pair = IR_NONE;
  c.segset = IR_NONE;
  c.bytes = bytes;
  c.collectives = count > 1 ? count : 0;
  uint32_t id = ir_graph_add_node(g, &c);
  ir_graph_add_edge(g, from, id, IR_EDGE_DATA, 0, buffer);
  return id;
}

/* The TP collectives of compute node x, between it and the consumers of its output (its
 * out-edges from adj, built before any node was added: the edges added here leave new nodes). */
static void insert_for_node(struct ir_graph *g, const struct ir_adjacency *adj, uint32_t x) {
  const struct ir_node *n = IR_NODE(g, x);
  uint64_t bytes;
  uint32_t count;
  ir_tp_segment_comm(g->model, n->segment, n->pass, &bytes, &count);
  if (count == 0)
    return;
  const struct model *m = g->model;
  uint64_t act = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->hidden_size *
                 model_dtype_bytes(m->dtype);
  /* adding nodes moves the node array: n is not used past here */
  bool sp = n->sequence_parallel;
  uint32_t tp = n->tp_degree, last;
  if (sp) { /* reduce-scatter to the sequence shards, all-gather them for the next block */
    uint32_t rs = add_tp_collective(g, x, x, IR_NODE_REDUCE_SCATTER, bytes, count, act);
    last = add_tp_collective(g, x, rs, IR_NODE_ALL_GATHER, bytes, count, act / tp);
  } else {
    last = add_tp_collective(g, x, x, IR_NODE_ALL_REDUCE, bytes, count, act);
  }
  /* the output reaches the next block only once reduced; weight gradients and saved
   * activations do not wait */
  bool rerun = IR_NODE(g, x)->pass == IR_PASS_R;
  for (uint32_t k = adj->out_first[x]; k < adj->out_first[x + 1]; k++) {
    uint32_t e = adj->out_edges[k];
    struct ir_edge ed = *IR_EDGE(g, e);
    /* a rerun's output is what its backward reads (slot 1): the backward waits for the rerun's
     * collectives too, which keeps them (and the rerun) right before it */
    if (rerun && ed.kind == IR_EDGE_DATA && ed.slot == 1) {
      ir_graph_add_edge(g, last, ed.dst, IR_EDGE_TEMPORAL, 0, 0);
      continue;
    }
    if (ed.kind != IR_EDGE_DATA || ed.slot != 0)
      continue;
    enum ir_node_kind k = IR_NODE(g, ed.dst)->kind;
    if (k != IR_NODE_COMPUTE && k != IR_NODE_ALL_TO_ALL)
      continue;
    IR_EDGE(g, e)->kind = IR_EDGE_DEAD;
    ir_graph_add_edge(g, last, ed.dst, IR_EDGE_DATA, 0, ed.bytes);
  }
}

void dir_tp_insert_comm(struct ir_graph *g) {
  if (!g->segment_tp)
    return;
  uint32_t nn = g->nodes->len;
  struct ir_adjacency adj;
  ir_adjacency_build(g, &adj);
  for (uint32_t i = 0; i < nn; i++) {
    struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_ALL_TO_ALL && n->tp_degree > 1 && n->sequence_parallel)
      n->bytes /= n->tp_degree; /* each device routes its sequence shard */
    if (n->kind == IR_NODE_COMPUTE && n->tp_degree > 1)
      insert_for_node(g, &adj, i);
  }
  ir_adjacency_free(&adj);
}
