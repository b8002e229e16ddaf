/* directives: applying a program to the IR as rewrites, in the fixed phase order
 * (docs/design.md, "The directive phase order"):
 *   1. every split (program order), 2. the BI/BW split of backward nodes named by orders,
 *   3. place, 4. replicate / shard (program order), 5. tensor_parallel, the stream
 *   declarations, recompute, 6. communication insertion (optimizer regrouping, gradient
 *   buckets, ZeRO-3 gathers, all-to-all, TP collectives, send/recv),
 *   7. order (temporal edges, cycle check), then default priorities for lowering. */
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"
#include "directives.h"
#include "context_parallel-impl.h"
#include "tensor_parallel-impl.h"

#define MIB (1024.0 * 1024.0)

/* Side information per node that only the rewrites need. */
struct node_info {
  uint32_t grouped_by;  /* directive that set the group (place, replicate, shard), IR_NONE */
  uint32_t replicate;   /* replicate directive covering it, IR_NONE */
  uint32_t shard;       /* shard directive covering it, IR_NONE */
  uint32_t send_stream; /* from place's "stream", IR_NONE = default */
  uint32_t recv_stream;
};

struct apply {
  const struct dir_program *p;
  struct ir_graph *g;
  uint32_t limit; /* device ids must be below it */
  GArray *info;   /* struct node_info, parallel to g->nodes */
  int split_tag;  /* tag index of the first split dimension, -1 before any split */
};

#define INFO(a, i) (&g_array_index((a)->info, struct node_info, (i)))

static uint32_t add_node(struct apply *a, const struct ir_node *n) {
  uint32_t id = ir_graph_add_node(a->g, n);
  struct node_info ni = {IR_NONE, IR_NONE, IR_NONE, IR_NONE, IR_NONE};
  g_array_append_val(a->info, ni);
  return id;
}

static bool fail_at(const struct apply *a, uint32_t d, GError **err, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);
static bool fail_at(const struct apply *a, uint32_t d, GError **err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *what = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  if (d == IR_NONE)
    piper_input_error(err, "%s: %s", a->p->name, what);
  else
    piper_input_error(err, "%s: directive %u (%s): %s", a->p->name, a->p->d[d].index,
                      dir_op_name(a->p->d[d].op), what);
  g_free(what);
  return false;
}

static char *node_name(const struct ir_graph *g, uint32_t i) {
  char buf[256];
  ir_node_name(g, i, buf, sizeof buf);
  return g_strdup(buf);
}

static char *filter_text(const struct dir_filter *f) {
  GString *s = g_string_new("{");
  for (uint32_t k = 0; k < f->n_keys; k++) {
    if (f->keys[k].value == IR_FILTER_ANY)
      g_string_append_printf(s, "%s\"%s\": \"*\"", k ? ", " : "", f->keys[k].name);
    else
      g_string_append_printf(s, "%s\"%s\": %d", k ? ", " : "", f->keys[k].name, f->keys[k].value);
  }
  if (f->pass != IR_PASS_NONE)
    g_string_append_printf(s, "%s\"PASS\": \"%s\"", f->n_keys ? ", " : "", ir_pass_name(f->pass));
  g_string_append(s, "}");
  return g_string_free(s, FALSE);
}

bool dir_filter_resolve(const struct dir_filter *f, const struct ir_graph *g, struct ir_filter *out,
                        const char *ctx, GError **err) {
  for (int t = 0; t < IR_MAX_TAGS; t++)
    out->tags[t] = IR_FILTER_UNSET;
  out->pass = f->pass;
  for (uint32_t k = 0; k < f->n_keys; k++) {
    int t = ir_graph_tag((struct ir_graph *)g, f->keys[k].name, false);
    if (t < 0) {
      GString *known = g_string_new(NULL);
      for (uint32_t i = 0; i < g->n_tags; i++)
        g_string_append_printf(known, "%s, ", g->tag_names[i]);
      g_string_append(known, "PASS");
      piper_input_error(err, "%s: filter key \"%s\" is not a tag of the model (tags: %s)", ctx,
                        f->keys[k].name, known->str);
      g_string_free(known, TRUE);
      return false;
    }
    out->tags[t] = f->keys[k].value;
  }
  return true;
}

static bool resolve(const struct apply *a, uint32_t d, const struct dir_filter *f,
                    struct ir_filter *out, GError **err) {
  /* the message's context only when it fails: schedules resolve O(M) filters per rank */
  if (dir_filter_resolve(f, a->g, out, "", NULL))
    return true;
  char *ctx = g_strdup_printf("%s: directive %u (%s)", a->p->name, a->p->d[d].index,
                              dir_op_name(a->p->d[d].op));
  bool ok = dir_filter_resolve(f, a->g, out, ctx, err);
  g_free(ctx);
  return ok;
}

/* Matched nodes of the kinds a directive acts on (compute, optionally optimizer). */
static GArray *match(const struct apply *a, const struct ir_filter *f, bool optimizer) {
  GArray *m = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t i = 0; i < a->g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(a->g, i);
    if (n->kind != IR_NODE_COMPUTE && !(optimizer && n->kind == IR_NODE_OPTIMIZER))
      continue;
    if (ir_filter_match(f, n))
      g_array_append_val(m, i);
  }
  return m;
}

/* Compute nodes by (tag, value), so the many small filters of order directives look at a few
 * candidates instead of the whole graph (schedules have O(M) filters per rank). */
struct tag_index {
  GHashTable *lists; /* (tag << 32 | value) -> GArray of node ids, ascending */
  /* Two tags' values together (an order filter names a stage and a micro-batch: each one's
   * list alone holds every micro-batch's or every stage's nodes, scanned per filter), built
   * the first time a filter asks for that pair of tags: struct tag_pair_key -> GArray */
  GHashTable *pairs;
  bool have_pair[IR_MAX_TAGS][IR_MAX_TAGS];
  uint32_t n_nodes; /* the nodes indexed */
};
struct tag_pair_key {
  int32_t tag[2], value[2];
};
static guint tag_pair_hash(gconstpointer p) {
  const struct tag_pair_key *k = p;
  return (guint)k->tag[0] * 2654435761u ^ (guint)k->tag[1] * 40503u ^
         (guint)k->value[0] * 2246822519u ^ (guint)k->value[1] * 3266489917u;
}
static gboolean tag_pair_equal(gconstpointer a, gconstpointer b) {
  return memcmp(a, b, sizeof(struct tag_pair_key)) == 0;
}

static void tag_index_build(const struct ir_graph *g, struct tag_index *ix) {
  ix->lists =
      g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, (GDestroyNotify)g_array_unref);
  ix->pairs =
      g_hash_table_new_full(tag_pair_hash, tag_pair_equal, g_free, (GDestroyNotify)g_array_unref);
  memset(ix->have_pair, 0, sizeof ix->have_pair);
  ix->n_nodes = g->nodes->len;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    for (uint32_t t = 0; t < g->n_tags; t++) {
      if (n->tags[t] < 0)
        continue;
      int64_t key = ((int64_t)t << 32) | n->tags[t];
      GArray *l = g_hash_table_lookup(ix->lists, &key);
      if (!l) {
        l = g_array_new(FALSE, FALSE, sizeof(uint32_t));
        g_hash_table_insert(ix->lists, g_memdup2(&key, sizeof key), l);
      }
      g_array_append_val(l, i);
    }
  }
}

static void tag_index_free(struct tag_index *ix) {
  if (ix->lists)
    g_hash_table_destroy(ix->lists);
  if (ix->pairs)
    g_hash_table_destroy(ix->pairs);
  ix->lists = NULL;
  ix->pairs = NULL;
}

/* The compute nodes with tag ta = va and tb = vb (ascending ids, as the one-tag lists), or
 * NULL: none. Tags do not change while an index lives (the phases that use one add edges). */
static const GArray *tag_index_pair(struct tag_index *ix, const struct ir_graph *g, int32_t ta,
                                    int32_t va, int32_t tb, int32_t vb) {
  if (!ix->have_pair[ta][tb]) {
    ix->have_pair[ta][tb] = true;
    for (uint32_t i = 0; i < ix->n_nodes; i++) {
      const struct ir_node *n = IR_NODE(g, i);
      if (n->kind != IR_NODE_COMPUTE || n->tags[ta] < 0 || n->tags[tb] < 0)
        continue;
      struct tag_pair_key k = {.tag = {ta, tb}, .value = {n->tags[ta], n->tags[tb]}};
      GArray *l = g_hash_table_lookup(ix->pairs, &k);
      if (!l) {
        l = g_array_new(FALSE, FALSE, sizeof(uint32_t));
        g_hash_table_insert(ix->pairs, g_memdup2(&k, sizeof k), l);
      }
      g_array_append_val(l, i);
    }
  }
  struct tag_pair_key k = {.tag = {ta, tb}, .value = {va, vb}};
  return g_hash_table_lookup(ix->pairs, &k);
}

/* match() restricted to compute nodes, through the index when the filter names a value. */
static GArray *match_indexed(const struct apply *a, struct tag_index *ix,
                             const struct ir_filter *f) {
  const GArray *best = NULL;
  int32_t best_tag = -1, other_tag = -1; /* the two shortest lists' tags */
  uint32_t other_len = 0;
  for (uint32_t t = 0; t < a->g->n_tags; t++) {
    if (f->tags[t] < 0)
      continue;
    int64_t key = ((int64_t)t << 32) | f->tags[t];
    const GArray *l = g_hash_table_lookup(ix->lists, &key);
    if (!l)
      return g_array_new(FALSE, FALSE, sizeof(uint32_t));
    if (!best || l->len < best->len) {
      if (best) {
        other_tag = best_tag;
        other_len = best->len;
      }
      best = l;
      best_tag = (int32_t)t;
    } else if (other_tag < 0 || l->len < other_len) {
      other_tag = (int32_t)t;
      other_len = l->len;
    }
  }
  if (!best)
    return match(a, f, false);
  if (other_tag >= 0) {
    best = tag_index_pair(ix, a->g, MIN(best_tag, other_tag), f->tags[MIN(best_tag, other_tag)],
                          MAX(best_tag, other_tag), f->tags[MAX(best_tag, other_tag)]);
    if (!best)
      return g_array_new(FALSE, FALSE, sizeof(uint32_t));
  }
  GArray *m = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t j = 0; j < best->len; j++) {
    uint32_t i = g_array_index(best, uint32_t, j);
    if (ir_filter_match(f, IR_NODE(a->g, i)))
      g_array_append_val(m, i);
  }
  return m;
}

static bool check_devices(const struct apply *a, uint32_t d) {
  const struct dir_directive *dd = &a->p->d[d];
  for (uint32_t i = 0; i < dd->n_devices; i++)
    if (dd->devices[i] >= a->limit)
      return false;
  return true;
}

/* ---- phase 1: split ---------------------------------------------------------------------- */

static bool apply_split(struct apply *a, uint32_t d, GError **err) {
  const struct dir_directive *dd = &a->p->d[d];
  struct ir_graph *g = a->g;
  if (ir_graph_tag(g, dd->dim_name, false) >= 0 || strcmp(dd->dim_name, "PASS") == 0)
    return fail_at(a, d, err, "\"dim_name\" \"%s\" already names a tag", dd->dim_name);
  struct ir_filter f;
  if (!resolve(a, d, &dd->filter, &f, err))
    return false;
  GArray *m = match(a, &f, false);
  bool ok = false;
  uint32_t n = (uint32_t)dd->num_microbatches;
  if (m->len == 0) {
    char *ft = filter_text(&dd->filter);
    fail_at(a, d, err, "\"filter\" %s matches nothing", ft);
    g_free(ft);
    goto out;
  }
  if ((uint64_t)g->n_microbatches * n > DIR_MAX_MICROBATCHES) {
    fail_at(a, d, err, "\"num_microbatches\": %u micro-batches in all exceed the limit of %u",
            g->n_microbatches * n, DIR_MAX_MICROBATCHES);
    goto out;
  }
  if ((uint64_t)g->nodes->len + (uint64_t)m->len * (n - 1) > IR_MAX_NODES) {
    fail_at(a, d, err, "splitting %u nodes %u ways exceeds the graph limit of %u nodes", m->len, n,
            IR_MAX_NODES);
    goto out;
  }
  int tag = ir_graph_tag(g, dd->dim_name, true);
  if (tag < 0) {
    fail_at(a, d, err, "too many tags (limit %d) to add \"%s\"", IR_MAX_TAGS, dd->dim_name);
    goto out;
  }
  if (a->split_tag < 0)
    a->split_tag = tag;
  uint32_t nn = g->nodes->len, ne = g->edges->len;
  /* copy[i] = first copy (k = 1) of matched node i; copy k is copy[i] + (k-1) * m->len. */
  uint32_t *copy = g_new(uint32_t, nn);
  for (uint32_t i = 0; i < nn; i++)
    copy[i] = IR_NONE;
  for (uint32_t k = 1; k < n; k++) {
    for (uint32_t j = 0; j < m->len; j++) {
      uint32_t i = g_array_index(m, uint32_t, j);
      struct ir_node c = *IR_NODE(g, i);
      c.tags[tag] = (int32_t)k;
      uint32_t id = add_node(a, &c);
      *INFO(a, id) = *INFO(a, i);
      if (k == 1)
        copy[i] = id;
    }
  }
  for (uint32_t j = 0; j < m->len; j++)
    IR_NODE(g, g_array_index(m, uint32_t, j))->tags[tag] = 0;
  uint32_t stride = m->len;
  for (uint32_t e = 0; e < ne; e++) {
    struct ir_edge ed = *IR_EDGE(g, e);
    if (ed.kind == IR_EDGE_DEAD)
      continue;
    bool ms = copy[ed.src] != IR_NONE, md = copy[ed.dst] != IR_NONE;
    if (!ms && !md)
      continue;
    for (uint32_t k = 1; k < n; k++) {
      uint32_t s = ms ? copy[ed.src] + (k - 1) * stride : ed.src;
      uint32_t t = md ? copy[ed.dst] + (k - 1) * stride : ed.dst;
      ir_graph_add_edge(g, s, t, ed.kind, ed.slot, ed.bytes);
    }
  }
  g_free(copy);
  g->n_microbatches *= n;
  ok = true;
out:
  g_array_free(m, TRUE);
  return ok;
}

/* ---- phase 2: BI/BW split ---------------------------------------------------------------- */

/* adj: the graph's edges before the first split. A split adds only edges into its new BW node
 * and moves temporal edges from b to it, so b's own lists stay what a scan of every edge would
 * find, in the same (creation) order (a scan per node made the split quadratic: a fifth of a
 * 405B compile at 32 ranks). */
static void split_backward_node(struct apply *a, const struct ir_adjacency *adj, uint32_t b) {
  struct ir_graph *g = a->g;
  struct ir_node w = *IR_NODE(g, b);
  IR_NODE(g, b)->pass = IR_PASS_BI;
  w.pass = IR_PASS_BW;
  uint32_t bw = add_node(a, &w);
  *INFO(a, bw) = *INFO(a, b);
  IR_NODE(g, b)->pair = bw;
  IR_NODE(g, bw)->pair = b;
  uint64_t grad_in = 0;
  for (uint32_t k = adj->out_first[b]; k < adj->out_first[b + 1]; k++) {
    struct ir_edge *ed = IR_EDGE(g, adj->out_edges[k]);
    if (ed->kind == IR_EDGE_TEMPORAL)
      ed->src = bw; /* weight gradients now come from BW */
  }
  for (uint32_t k = adj->in_first[b]; k < adj->in_first[b + 1]; k++) {
    struct ir_edge ed = *IR_EDGE(g, adj->in_edges[k]);
    if (ed.kind != IR_EDGE_DATA)
      continue;
    if (ed.slot == 1) /* BW reads the activations */
      ir_graph_add_edge(g, ed.src, bw, IR_EDGE_DATA, ed.slot, ed.bytes);
    else
      grad_in += ed.bytes;
  }
  /* BW also needs the output gradient BI received; BI keeps it for BW (slot 1 of BI). */
  ir_graph_add_edge(g, b, bw, IR_EDGE_DATA, 1, grad_in);
}

/* The backward nodes that order filters name by BI or BW, through the tag index (a scan of the
 * graph per filter was quadratic in the micro-batches). */
static bool apply_bi_bw_split(struct apply *a, GError **err) {
  struct ir_graph *g = a->g;
  uint32_t nn = g->nodes->len;
  bool *split = g_new0(bool, nn);
  struct tag_index ix = {NULL};
  bool ok = true, any = false;
  for (uint32_t d = 0; d < a->p->n && ok; d++) {
    const struct dir_directive *dd = &a->p->d[d];
    if (dd->op != DIR_ORDER)
      continue;
    for (uint32_t fi = dd->slot_first[0]; fi < dd->slot_first[dd->n_slots] && ok; fi++) {
      const struct dir_filter *wf = &dd->filters[fi];
      if (wf->pass != IR_PASS_BI && wf->pass != IR_PASS_BW)
        continue;
      struct ir_filter f;
      if (!(ok = resolve(a, d, wf, &f, err)))
        break;
      f.pass = IR_PASS_B;
      if (!ix.lists)
        tag_index_build(g, &ix);
      GArray *m = match_indexed(a, &ix, &f);
      for (uint32_t j = 0; j < m->len; j++) {
        uint32_t i = g_array_index(m, uint32_t, j);
        if (IR_NODE(g, i)->pass == IR_PASS_B)
          any = split[i] = true;
      }
      g_array_free(m, TRUE);
    }
  }
  if (ok && any) {
    struct ir_adjacency adj;
    ir_adjacency_build(g, &adj);
    for (uint32_t i = 0; i < nn; i++)
      if (split[i])
        split_backward_node(a, &adj, i);
    ir_adjacency_free(&adj);
  }
  tag_index_free(&ix);
  g_free(split);
  return ok;
}

/* ---- phases 3-4: place, replicate, shard ------------------------------------------------- */

/* True when directive d is a place whose filter names a split dimension (e.g. "MB"). */
static bool placed_per_microbatch(const struct apply *a, uint32_t d) {
  const struct dir_directive *dd = &a->p->d[d];
  if (dd->op != DIR_PLACE)
    return false;
  for (uint32_t k = 0; k < dd->filter.n_keys; k++) {
    int t = ir_graph_tag(a->g, dd->filter.keys[k].name, false);
    if (t >= (int)a->g->model->n_tags)
      return true;
  }
  return false;
}

static bool set_group(struct apply *a, uint32_t d, uint32_t node, uint32_t group, GError **err) {
  struct node_info *ni = INFO(a, node);
  struct ir_node *n = IR_NODE(a->g, node);
  enum dir_op op = a->p->d[d].op;
  if (op != DIR_PLACE && ni->grouped_by != IR_NONE && n->group != group) {
    /* A region placed per micro-batch (DualPipe's second model copy) keeps its own group:
     * replicate / shard then act over that group, which must have the same size. */
    if (placed_per_microbatch(a, ni->grouped_by) &&
        IR_GROUP(a->g, n->group)->count == IR_GROUP(a->g, group)->count) {
      n->directive = d;
      return true;
    }
    char *nm = node_name(a->g, node);
    fail_at(a, d, err, "\"devices\" differ from the devices given to \"%s\" by directive %u (%s)",
            nm, a->p->d[ni->grouped_by].index, dir_op_name(a->p->d[ni->grouped_by].op));
    g_free(nm);
    return false;
  }
  n->group = group;
  n->directive = d;
  ni->grouped_by = d;
  return true;
}

static bool apply_placement(struct apply *a, uint32_t d, GError **err) {
  const struct dir_directive *dd = &a->p->d[d];
  struct ir_graph *g = a->g;
  if (!check_devices(a, d))
    return fail_at(a, d, err, "\"devices\" names a device id out of range (the run has %u devices)",
                   a->limit);
  struct ir_filter f;
  if (!resolve(a, d, &dd->filter, &f, err))
    return false;
  GArray *m = match(a, &f, dd->op == DIR_PLACE);
  bool ok = false;
  if (m->len == 0) {
    char *ft = filter_text(&dd->filter);
    fail_at(a, d, err, "\"filter\" %s matches nothing", ft);
    g_free(ft);
    goto out;
  }
  uint32_t group = ir_graph_group(g, dd->devices, dd->n_devices);
  uint32_t stream = dd->stream[0] ? ir_graph_stream(g, dd->stream) : IR_NONE;
  for (uint32_t j = 0; j < m->len; j++) {
    uint32_t i = g_array_index(m, uint32_t, j);
    struct ir_node *n = IR_NODE(g, i);
    if (dd->op == DIR_SHARD) {
      const struct model_segment *seg = &g->model->segments[n->segment];
      if (!seg->expert) {
        char *nm = node_name(g, i);
        fail_at(a, d, err,
                "\"filter\" matches \"%s\", which is no expert region (add \"EP\": \"*\")", nm);
        g_free(nm);
        goto out;
      }
      /* without a "degree", whether the experts divide is checked after tensor parallelism
       * has divided the group (check_expert_split) */
      if (dd->ep_degree > 0 && g->model->num_experts % dd->ep_degree != 0) {
        fail_at(a, d, err, "\"degree\": %lld experts do not divide evenly over %u EP ranks",
                (long long)g->model->num_experts, dd->ep_degree);
        goto out;
      }
    }
    if (!set_group(a, d, i, group, err))
      goto out;
    n = IR_NODE(g, i);
    struct node_info *ni = INFO(a, i);
    switch (dd->op) {
    case DIR_PLACE:
      if (stream != IR_NONE)
        ni->send_stream = ni->recv_stream = stream;
      break;
    case DIR_REPLICATE:
      n->replica_degree = dd->n_devices;
      n->shard_optimizer = dd->shard_optimizer;
      n->shard_grads = dd->shard_grads;
      n->shard_params = dd->shard_params;
      ni->replicate = d;
      break;
    case DIR_SHARD:
      n->shard_degree = dd->n_devices;
      n->capacity_factor =
          dd->capacity_factor > 0 ? dd->capacity_factor : IR_EP_CAPACITY_FACTOR_DEFAULT;
      n->fp8_expert_inputs = dd->fp8_expert_inputs;
      ni->shard = d;
      break;
    default: break;
    }
  }
  ok = true;
out:
  g_array_free(m, TRUE);
  return ok;
}

/* ---- recompute ----------------------------------------------------------------------------- */

/* How directive d recomputes forward node i: its granularity, except that selective
 * recomputation of the "moe" module reruns the routed experts' segments in full. */
static enum ir_recompute node_granularity(const struct apply *a, uint32_t d, uint32_t i) {
  const struct dir_directive *dd = &a->p->d[d];
  const struct ir_node *n = IR_NODE(a->g, i);
  if (dd->granularity == IR_RECOMPUTE_SELECTIVE &&
      (dd->modules & MODEL_MODULE_BIT(MODEL_MODULE_MOE)) && n->segment < a->g->model->n_segments &&
      a->g->model->segments[n->segment].expert)
    return IR_RECOMPUTE_FULL;
  return dd->granularity;
}

/* What forward node i saves on its devices without recomputation. */
static uint64_t node_saved(const struct ir_graph *g, uint32_t i) {
  const struct ir_node *n = IR_NODE(g, i);
  return ir_ep_sized(n) ? ir_ep_saved_bytes(g->model, n)
                        : ir_tp_segment_saved_bytes(g->model, n->segment, n->tp_degree,
                                                    n->sequence_parallel);
}

/* What selective recomputation of directive d's modules stops keeping on node i's devices. */
static uint64_t node_module_saved(const struct apply *a, uint32_t d, uint32_t i) {
  return ir_node_module_bytes(a->g->model, IR_NODE(a->g, i), a->p->d[d].modules);
}

/* Modules besides the attention core are rerun on whole ops: tensor parallelism, which would
 * rerun their collectives (and all-gathers under sequence parallelism), is refused. */
static bool check_modules_tp(struct apply *a, uint32_t d, uint32_t i, GError **err) {
  const struct dir_directive *dd = &a->p->d[d];
  if (IR_NODE(a->g, i)->tp_degree <= 1 || !(dd->modules & ~IR_RECOMPUTE_MODULES_DEFAULT))
    return true;
  char *nm = node_name(a->g, i);
  fail_at(a, d, err, "\"modules\" other than core_attn under tensor parallelism (\"%s\"): not "
                     "supported (their reruns would repeat the collectives)", nm);
  g_free(nm);
  return false;
}

/* Matched forward nodes a recompute directive acts on; fails naming the directive when there
 * are none, or when an earlier recompute took one. */
static GArray *recompute_targets(struct apply *a, uint32_t d, GError **err) {
  const struct dir_directive *dd = &a->p->d[d];
  struct ir_graph *g = a->g;
  struct ir_filter f;
  if (!resolve(a, d, &dd->filter, &f, err))
    return NULL;
  if (f.pass != IR_PASS_NONE && f.pass != IR_PASS_F) {
    fail_at(a, d, err, "\"filter\": \"PASS\" may only be F (the forward whose activations are "
                       "dropped)");
    return NULL;
  }
  GArray *m = match(a, &f, false), *t = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  /* a layered directive reruns its chunks only (compile's chunk_model tagged them) */
  int rc = dd->method == DIR_RECOMPUTE_SEGMENT ? -1 : model_tag_index(g->model, DIR_RECOMPUTE_TAG);
  bool ok = true;
  for (uint32_t j = 0; j < m->len && ok; j++) {
    uint32_t i = g_array_index(m, uint32_t, j);
    const struct ir_node *n = IR_NODE(g, i);
    bool selective = node_granularity(a, d, i) == IR_RECOMPUTE_SELECTIVE;
    /* a forward that saves nothing (a residual add after the experts) has nothing to rerun:
     * under full recomputation it would keep its inputs for a rerun that restores nothing */
    if (n->pass != IR_PASS_F || (selective && node_module_saved(a, d, i) == 0) ||
        (!selective && node_saved(g, i) == 0) ||
        (dd->method != DIR_RECOMPUTE_SEGMENT && (rc < 0 || n->tags[rc] < 0)))
      continue;
    if (n->recompute != IR_RECOMPUTE_NONE) {
      char *nm = node_name(g, i);
      fail_at(a, d, err, "\"filter\" matches \"%s\", which an earlier recompute took", nm);
      g_free(nm);
      ok = false;
    }
    ok = ok && (!selective || check_modules_tp(a, d, i, err));
    if (ok)
      g_array_append_val(t, i);
  }
  g_array_free(m, TRUE);
  if (ok && t->len == 0) {
    char *ft = filter_text(&dd->filter);
    fail_at(a, d, err, "\"filter\" %s matches no forward%s", ft,
            dd->granularity == IR_RECOMPUTE_SELECTIVE ? " with one of its modules" : "");
    g_free(ft);
    ok = false;
  }
  if (!ok) {
    g_array_free(t, TRUE);
    return NULL;
  }
  return t;
}

/* recompute: each matched forward F gets a rerun R on its devices, between it and its
 * backward. Memory follows from the edges (lowering makes each output slot a tensor, alive
 * from its producer to its last consumer):
 *   full: F keeps only the segment's inputs, for R (F -> R); R restores everything F saved
 *     (R -> B), so a micro-batch waiting for its backward holds its inputs alone;
 *   selective (Megatron's selective recomputation): F keeps all but its modules' part (the
 *     attention core's output and logsumexp by default; F -> B, F -> R: one tensor, read by
 *     both); R recomputes that part (R -> B). */
static bool apply_recompute(struct apply *a, uint32_t d, GError **err) {
  struct ir_graph *g = a->g;
  GArray *t = recompute_targets(a, d, err);
  if (!t)
    return false;
  uint32_t nn = g->nodes->len, ne = g->edges->len;
  uint32_t *rerun = g_new(uint32_t, nn);
  uint64_t *inputs = g_new0(uint64_t, nn), *saved = g_new0(uint64_t, nn);
  for (uint32_t i = 0; i < nn; i++)
    rerun[i] = IR_NONE;
  for (uint32_t j = 0; j < t->len; j++) {
    uint32_t i = g_array_index(t, uint32_t, j);
    struct ir_node r = *IR_NODE(g, i);
    r.pass = IR_PASS_R;
    r.recompute = node_granularity(a, d, i);
    r.recompute_modules = r.recompute == IR_RECOMPUTE_SELECTIVE ? a->p->d[d].modules : 0;
    r.directive = d;
    IR_NODE(g, i)->recompute = r.recompute;
    IR_NODE(g, i)->recompute_modules = r.recompute_modules;
    rerun[i] = add_node(a, &r);
    *INFO(a, rerun[i]) = *INFO(a, i);
  }
  for (uint32_t e = 0; e < ne; e++) {
    struct ir_edge ed = *IR_EDGE(g, e);
    if (ed.kind != IR_EDGE_DATA)
      continue;
    if (ed.slot != 1 && rerun[ed.dst] != IR_NONE) /* a forward input (slots 2 + k) */
      inputs[ed.dst] += ed.bytes;
    if (ed.slot != 1 || rerun[ed.src] == IR_NONE)
      continue;
    if (ed.bytes > saved[ed.src])
      saved[ed.src] = ed.bytes;
    if (IR_NODE(g, ed.src)->recompute == IR_RECOMPUTE_FULL) {
      IR_EDGE(g, e)->kind = IR_EDGE_DEAD;
      ir_graph_add_edge(g, rerun[ed.src], ed.dst, IR_EDGE_DATA, 1, ed.bytes);
    } else {
      uint64_t part = node_module_saved(a, d, ed.src);
      IR_EDGE(g, e)->bytes = ed.bytes > part ? ed.bytes - part : 0;
      ir_graph_add_edge(g, rerun[ed.src], ed.dst, IR_EDGE_DATA, 1, part);
    }
  }
  for (uint32_t j = 0; j < t->len; j++) {
    uint32_t i = g_array_index(t, uint32_t, j);
    uint64_t part = node_module_saved(a, d, i);
    uint64_t kept = IR_NODE(g, i)->recompute == IR_RECOMPUTE_FULL ? inputs[i]
                    : saved[i] > part                             ? saved[i] - part
                                                                  : 0;
    ir_graph_add_edge(g, i, rerun[i], IR_EDGE_DATA, 1, kept);
  }
  g_free(rerun);
  g_free(inputs);
  g_free(saved);
  g_array_free(t, TRUE);
  return true;
}

/* Full recomputation of expert-parallel experts reruns their dispatch on the router's rerun
 * (insert_expert_reruns), so the segment that feeds the experts must be recomputed in full
 * too: refused in one line naming the directive that takes the experts alone. (Keeping the
 * router's outputs instead would keep [T, hidden] and the routing per micro-batch anyway, the
 * same as rerunning the router, whose FLOPs are small; one rule is simpler to state.) */
static bool check_expert_recompute(struct apply *a, GError **err) {
  struct ir_graph *g = a->g;
  for (uint32_t e = 0; e < g->edges->len; e++) {
    const struct ir_edge *ed = IR_EDGE(g, e);
    const struct ir_node *x = IR_NODE(g, ed->dst), *src = IR_NODE(g, ed->src);
    if (ed->kind != IR_EDGE_DATA || ed->slot == 1 || x->kind != IR_NODE_COMPUTE ||
        x->pass != IR_PASS_F || x->recompute != IR_RECOMPUTE_FULL || !ir_ep_sized(x) ||
        src->kind != IR_NODE_COMPUTE || src->segment == x->segment ||
        src->recompute == IR_RECOMPUTE_FULL)
      continue;
    uint32_t d = IR_NONE;
    for (uint32_t k = 0; k < g->edges->len && d == IR_NONE; k++) {
      const struct ir_edge *r = IR_EDGE(g, k);
      if (r->src == ed->dst && r->kind == IR_EDGE_DATA && r->slot == 1 &&
          IR_NODE(g, r->dst)->pass == IR_PASS_R)
        d = IR_NODE(g, r->dst)->directive;
    }
    char *xn = node_name(g, ed->dst), *rn = node_name(g, ed->src);
    fail_at(a, d, err,
            "recomputes the experts \"%s\" in full but not \"%s\", which routes their tokens "
            "(their rerun reruns the dispatch on the router's rerun: recompute both in full)",
            xn, rn);
    g_free(xn);
    g_free(rn);
    return false;
  }
  return true;
}

/* The router's rerun feeds the experts' rerun through the rerun's dispatch (pass R): it goes
 * right before that rerun, not before its own backward (which comes after the experts'). */
static void rerun_chain_priorities(struct ir_graph *g) {
  struct ir_adjacency adj;
  ir_adjacency_build(g, &adj);
  for (uint32_t d = 0; d < g->nodes->len; d++) {
    const struct ir_node *dn = IR_NODE(g, d);
    if (dn->kind != IR_NODE_ALL_TO_ALL || dn->pass != IR_PASS_R)
      continue;
    for (uint32_t i = adj.in_first[d]; i < adj.in_first[d + 1]; i++)
      for (uint32_t o = adj.out_first[d]; o < adj.out_first[d + 1]; o++) {
        struct ir_node *r0 = IR_NODE(g, IR_EDGE(g, adj.in_edges[i])->src);
        const struct ir_node *r1 = IR_NODE(g, IR_EDGE(g, adj.out_edges[o])->dst);
        if (r0->kind != IR_NODE_COMPUTE || r0->pass != IR_PASS_R ||
            r1->kind != IR_NODE_COMPUTE || r1->pass != IR_PASS_R)
          continue;
        uint64_t p = r1->priority - (r1->priority > 0);
        if (p < r0->priority)
          r0->priority = p;
      }
  }
  ir_adjacency_free(&adj);
}

/* A rerun goes right before the first backward that reads what it restores: lowering then
 * runs it there, not as soon as its forward is done (which would keep everything alive). */
static void recompute_priorities(struct apply *a) {
  struct ir_graph *g = a->g;
  for (uint32_t i = 0; i < g->nodes->len; i++)
    if (IR_NODE(g, i)->kind == IR_NODE_COMPUTE && IR_NODE(g, i)->pass == IR_PASS_R)
      IR_NODE(g, i)->priority = UINT64_MAX;
  for (uint32_t e = 0; e < g->edges->len; e++) {
    const struct ir_edge *ed = IR_EDGE(g, e);
    struct ir_node *r = IR_NODE(g, ed->src);
    /* the backward it restores for; not its own collectives (tensor parallelism), which
     * inherit the rerun's place when lowered */
    if (ed->kind != IR_EDGE_DATA || r->kind != IR_NODE_COMPUTE || r->pass != IR_PASS_R ||
        IR_NODE(g, ed->dst)->kind != IR_NODE_COMPUTE)
      continue;
    uint64_t p = IR_NODE(g, ed->dst)->priority;
    if (p - (p > 0) < r->priority)
      r->priority = p - (p > 0);
  }
  rerun_chain_priorities(g);
}

/* ---- phase 5: communication insertion ---------------------------------------------------- */

static struct ir_node comm_node(const struct ir_node *like, enum ir_node_kind kind,
                                enum ir_comm_purpose purpose, uint32_t stream, uint64_t bytes) {
  struct ir_node n = *like;
  n.kind = kind;
  n.purpose = purpose;
  n.stream = stream;
  n.bytes = bytes;
  n.peer_group = IR_NONE;
  n.pair = IR_NONE;
  n.segset = IR_NONE;
  return n;
}

/* Nodes that produce weight gradients (B or BW), per model segment, in node order. */
struct grad_index {
  uint32_t *first; /* [n_segments + 1] */
  uint32_t *nodes;
};

static void grad_index_build(const struct ir_graph *g, struct grad_index *gi) {
  uint32_t ns = g->model->n_segments;
  gi->first = g_new0(uint32_t, ns + 1);
  uint32_t total = 0;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_COMPUTE && (n->pass == IR_PASS_B || n->pass == IR_PASS_BW)) {
      gi->first[n->segment + 1]++;
      total++;
    }
  }
  for (uint32_t s = 0; s < ns; s++)
    gi->first[s + 1] += gi->first[s];
  gi->nodes = g_new(uint32_t, total ? total : 1);
  uint32_t *pos = g_memdup2(gi->first, (ns + 1) * sizeof(uint32_t));
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_COMPUTE && (n->pass == IR_PASS_B || n->pass == IR_PASS_BW))
      gi->nodes[pos[n->segment]++] = i;
  }
  g_free(pos);
}

static void grad_index_free(struct grad_index *gi) {
  g_free(gi->first);
  g_free(gi->nodes);
}

static gint compare_u32(gconstpointer x, gconstpointer y) {
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  return a < b ? -1 : a > b;
}

/* Where each model segment runs: the device groups of its compute nodes. A segment with
 * parameters normally has one home; schedules with two model copies (DualPipe) place a
 * segment's micro-batches on two groups, and the copies' gradients are then summed across. */
#define MAX_HOMES 4
struct segment_home {
  uint32_t group;    /* first home, IR_NONE when the segment has no compute node */
  uint32_t fwd_node; /* one compute node, for flags and messages */
  uint32_t n_homes;
  uint32_t homes[MAX_HOMES];
};

static bool has_home(const struct segment_home *h, uint32_t group) {
  for (uint32_t k = 0; k < h->n_homes; k++)
    if (h->homes[k] == group)
      return true;
  return false;
}

static bool segment_homes(struct apply *a, struct segment_home *home, GError **err) {
  const struct ir_graph *g = a->g;
  for (uint32_t s = 0; s < g->model->n_segments; s++)
    home[s] = (struct segment_home){.group = IR_NONE, .fwd_node = IR_NONE};
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    struct segment_home *h = &home[n->segment];
    if (h->group == IR_NONE) {
      h->group = n->group;
      h->fwd_node = i;
      h->homes[h->n_homes++] = n->group;
      continue;
    }
    if (has_home(h, n->group) || g->model->segments[n->segment].param_count == 0)
      continue;
    char *x = node_name(g, h->fwd_node), *y = node_name(g, i);
    uint32_t d = INFO(a, i)->grouped_by;
    bool failed = true;
    if (h->n_homes == MAX_HOMES)
      fail_at(a, d, err, "\"%s\" puts a model segment on more than %d device groups", y, MAX_HOMES);
    else if (IR_GROUP(g, n->group)->count != IR_GROUP(g, h->group)->count)
      fail_at(a, d, err,
              "\"%s\" runs on %u devices but \"%s\" of the same segment on %u: copies of a "
              "segment need equal groups",
              y, IR_GROUP(g, n->group)->count, x, IR_GROUP(g, h->group)->count);
    else if (n->shard_params || IR_NODE(g, h->fwd_node)->shard_params)
      fail_at(a, d, err,
              "\"%s\" and \"%s\" put copies of a ZeRO-3 (shard_params) segment on two device "
              "groups, which is not supported (ZeRO-1 and ZeRO-2 are)",
              y, x);
    else {
      h->homes[h->n_homes++] = n->group;
      failed = false;
    }
    g_free(x);
    g_free(y);
    if (failed)
      return false;
  }
  return true;
}

/* A program that places anything places everything: a compute node no place, replicate or
 * shard reached would otherwise land on device 0 unnoticed. A program with no placement at
 * all is a one-device program. */
static bool check_all_placed(struct apply *a, GError **err) {
  bool any = false;
  for (uint32_t d = 0; d < a->p->n && !any; d++)
    any =
        a->p->d[d].op == DIR_PLACE || a->p->d[d].op == DIR_REPLICATE || a->p->d[d].op == DIR_SHARD;
  if (!any)
    return true;
  struct ir_graph *g = a->g;
  int pp = ir_graph_tag(g, "PP", false);
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE || INFO(a, i)->grouped_by != IR_NONE)
      continue;
    char *nm = node_name(g, i);
    if (pp >= 0 && n->tags[pp] >= 0)
      fail_at(a, IR_NONE, err,
              "pipeline stage PP=%d has no place: no place, replicate or shard directive "
              "matches \"%s\" (add {\"op\": \"place\", \"filter\": {\"PP\": %d}, ...})",
              n->tags[pp], nm, n->tags[pp]);
    else
      fail_at(a, IR_NONE, err,
              "\"%s\" has no place: no place, replicate or shard directive matches it", nm);
    g_free(nm);
    return false;
  }
  return true;
}

/* The directive whose "devices" name the highest device id: the likely typo. */
static uint32_t directive_with_device(const struct apply *a, uint32_t device) {
  for (uint32_t d = 0; d < a->p->n; d++)
    for (uint32_t k = 0; k < a->p->d[d].n_devices; k++)
      if (a->p->d[d].devices[k] == device)
        return d;
  return IR_NONE;
}

/* Device ids run from 0 without a gap unless the run's world was given (--devices N): a gap
 * is a typo in "devices" that would make phantom idle devices. */
static bool check_contiguous(struct apply *a, uint32_t n_devices_limit, GError **err) {
  const struct ir_graph *g = a->g;
  if (n_devices_limit || g->n_devices <= 1)
    return true;
  bool *used = g_new0(bool, g->n_devices);
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    for (uint32_t k = 0; k < IR_GROUP(g, n->group)->count; k++)
      used[IR_GROUP_DEVICES(g, n->group)[k]] = true;
  }
  uint32_t gap = 0;
  while (gap < g->n_devices && used[gap])
    gap++;
  g_free(used);
  if (gap == g->n_devices)
    return true;
  uint32_t top = g->n_devices - 1;
  return fail_at(a, directive_with_device(a, top), err,
                 "device ids must be contiguous from 0, but nothing runs on device %u while "
                 "device %u is used (a typo in \"devices\"? give --devices N for a larger world)",
                 gap, top);
}

/* ---- expert parallelism as its own dimension --------------------------------------------- */

/* Expert node i under a shard with a "degree" (EP size) carved from its group of
 * tp x d devices (Megatron's expert-model-parallel groups, parallel_state.py: within a stage
 * the expert ranks run ETP innermost, then EP, then expert DP, over the same positions the
 * dense layers read as TP, then DP; a CP factor of the dense grid changes nothing here, as it
 * only multiplies the positions). After the TP phase, which gave the node the dense TP. */
static bool carve_expert_node(struct apply *a, uint32_t d, uint32_t i, GError **err) {
  const struct dir_directive *dd = &a->p->d[d];
  struct ir_node *n = IR_NODE(a->g, i);
  uint32_t size = IR_GROUP(a->g, n->group)->count, tp = n->tp_degree > 1 ? n->tp_degree : 1;
  uint32_t ep = dd->ep_degree, etp = dd->etp_degree ? dd->etp_degree : tp;
  if (tp % etp != 0)
    return fail_at(a, d, err, "\"expert_tensor_parallel\" %u must divide the tensor-parallel "
                              "degree %u of the layers it shards", etp, tp);
  if (etp < tp && !n->sequence_parallel)
    return fail_at(a, d, err, "\"expert_tensor_parallel\" %u below the tensor-parallel degree "
                              "%u needs sequence_parallel (each TP rank routes its sequence "
                              "shard, as Megatron requires of MoE under TP)", etp, tp);
  if ((uint64_t)ep * etp > size || size % (ep * etp) != 0)
    return fail_at(a, d, err, "\"degree\" %u x expert_tensor_parallel %u = %llu does not "
                              "divide the %u devices the experts run on", ep, etp,
                   (unsigned long long)ep * etp, size);
  n->shard_degree = ep;
  /* replica_degree keeps the dense DP degree: every DP rank still routes its own tokens */
  n->expert_replicas = size / (ep * etp);
  n->route_split = tp / etp;
  n->tp_degree = etp > 1 ? etp : 0;
  n->sequence_parallel = etp > 1 && n->sequence_parallel;
  if (a->g->segment_tp)
    a->g->segment_tp[n->segment] = etp > 1 ? etp : 0;
  return true;
}

/* The experts of a shard without a "degree" divide over its EP group: every device of one TP
 * rank, so the shard's devices over the TP degree the tensor_parallel phase gave the node
 * (divide_node set shard_degree to that), not all of the shard's devices: 60 experts over
 * 8 devices at TP 2 is EP 4. A shard with a "degree" is checked where it is parsed. */
static bool check_expert_split(struct apply *a, GError **err) {
  int64_t experts = a->g->model->num_experts;
  for (uint32_t i = 0; i < a->g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(a->g, i);
    uint32_t d = INFO(a, i)->shard;
    if (n->kind != IR_NODE_COMPUTE || d == IR_NONE || a->p->d[d].ep_degree > 0 ||
        n->shard_degree == 0 || experts % n->shard_degree == 0)
      continue;
    if (n->tp_degree > 1)
      return fail_at(a, d, err, "\"devices\": %lld experts do not divide evenly over the %u "
                                "expert-parallel ranks (%u devices over tensor parallelism %u)",
                     (long long)experts, n->shard_degree, a->p->d[d].n_devices, n->tp_degree);
    return fail_at(a, d, err, "\"devices\": %lld experts do not divide evenly over %u devices",
                   (long long)experts, n->shard_degree);
  }
  return true;
}

/* Every expert node of a shard with a "degree". A shard without one keeps today's meaning:
 * the EP group is every device of one TP rank, the experts take the dense TP. */
static bool carve_experts(struct apply *a, GError **err) {
  for (uint32_t i = 0; i < a->g->nodes->len; i++) {
    uint32_t d = INFO(a, i)->shard;
    if (IR_NODE(a->g, i)->kind == IR_NODE_COMPUTE && d != IR_NONE && a->p->d[d].ep_degree > 0 &&
        !carve_expert_node(a, d, i, err))
      return false;
  }
  return true;
}

/* Every node on several devices must be replicated or sharded over them. */
static bool check_group_use(struct apply *a, GError **err) {
  const struct ir_graph *g = a->g;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    uint32_t size = IR_GROUP(g, n->group)->count, tp = n->tp_degree > 1 ? n->tp_degree : 1;
    uint32_t carved = n->shard_degree * tp * (n->expert_replicas > 1 ? n->expert_replicas : 1);
    if (size > 1 && n->replica_degree * tp != size && n->shard_degree * tp != size &&
        carved != size) {
      char *nm = node_name(g, i);
      fail_at(a, INFO(a, i)->grouped_by, err,
              "\"%s\" runs on %u devices but is neither replicated nor sharded over them "
              "(add a replicate or shard directive for it)",
              nm, size);
      g_free(nm);
      return false;
    }
  }
  return true;
}

static uint32_t stream_or(struct ir_graph *g, const char *name, const char *fallback) {
  return ir_graph_stream(g, name && name[0] ? name : fallback);
}

/* True when groups a and b share a device: a dependency between them is kept by the shared
 * devices (each device waits only for what it runs). */
static bool groups_overlap(const struct ir_graph *g, uint32_t a, uint32_t b) {
  if (a == b)
    return true;
  const uint32_t *da = IR_GROUP_DEVICES(g, a);
  for (uint32_t i = 0; i < IR_GROUP(g, a)->count; i++)
    if (ir_group_position(g, b, da[i]) >= 0)
      return true;
  return false;
}

static void free_syncs(GArray **syncs_of, uint32_t n) {
  for (uint32_t s = 0; s < n; s++)
    g_array_free(syncs_of[s], TRUE);
  g_free(syncs_of);
}

/* A copies' sum is keyed by its group and split: key = group | split << 32 (split 0: the
 * whole group). */
#define SYNC_KEY(group, split) ((uint64_t)(group) | (uint64_t)(split) << 32)
#define SYNC_GROUP(key) ((uint32_t)((key) & 0xffffffffu))
#define SYNC_SPLIT(key) ((uint32_t)((key) >> 32))

/* The devices of every home of h, ascending (devs); fails when two copies share a device. */
static bool union_of_homes(struct apply *a, const struct segment_home *h, GArray *devs,
                           GError **err) {
  struct ir_graph *g = a->g;
  uint32_t size = IR_GROUP(g, h->homes[0])->count;
  g_array_set_size(devs, 0);
  for (uint32_t k = 0; k < h->n_homes; k++)
    g_array_append_vals(devs, IR_GROUP_DEVICES(g, h->homes[k]), size);
  g_array_sort(devs, compare_u32);
  for (uint32_t k = 1; k < devs->len; k++)
    if (g_array_index(devs, uint32_t, k) == g_array_index(devs, uint32_t, k - 1)) {
      char *x = node_name(g, h->fwd_node);
      fail_at(a, INFO(a, h->fwd_node)->grouped_by, err, "copies of \"%s\" share device %u", x,
              g_array_index(devs, uint32_t, k));
      g_free(x);
      return false;
    }
  return true;
}

/* True when the sorted union puts every home's device p at an index = p mod the home's size:
 * the union's instances under split = size (plan_comm: positions {p mod split + k split}) are
 * then the devices at each position (as for homes of ascending ids, what layouts write). */
static bool positions_line_up(const struct ir_graph *g, const struct segment_home *h,
                              const GArray *devs) {
  uint32_t size = IR_GROUP(g, h->homes[0])->count;
  for (uint32_t k = 0; k < h->n_homes; k++)
    for (uint32_t p = 0; p < size; p++) {
      uint32_t dev = IR_GROUP_DEVICES(g, h->homes[k])[p], lo = 0, hi = devs->len;
      while (lo < hi) { /* binary search: devs is ascending */
        uint32_t mid = (lo + hi) / 2;
        if (g_array_index(devs, uint32_t, mid) < dev)
          lo = mid + 1;
        else
          hi = mid;
      }
      if (lo % size != p)
        return false;
    }
  return true;
}

/* The sync keys over which the copies of a segment with several homes sum their gradients: a
 * replicated segment the union of its homes (which covers the data parallelism inside each);
 * per_position (experts sharded over each home, or each home's own ZeRO sharding), the devices
 * at each position of the homes, which hold the same parameters: one collective over the union
 * split into those positions where the union lines them up (so that the devices of a data-
 * parallel group share one program at any scale), else one group per position. */
static bool copy_sync_keys(struct apply *a, const struct segment_home *h, bool per_position,
                           GArray *out, GError **err) {
  struct ir_graph *g = a->g;
  uint32_t size = IR_GROUP(g, h->homes[0])->count;
  GArray *devs = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  bool ok = union_of_homes(a, h, devs, err);
  const struct ir_node *fn = IR_NODE(g, h->fwd_node);
  uint32_t tp = fn->tp_degree, edp = fn->expert_replicas > 1 ? fn->expert_replicas : 1;
  bool lined_up = ok && per_position && size > 1 && positions_line_up(g, h, devs);
  if (ok && edp > 1 && !lined_up) {
    char *x = node_name(g, h->fwd_node);
    ok = fail_at(a, INFO(a, h->fwd_node)->grouped_by, err,
                 "the copies of \"%s\" (experts in expert-data-parallel groups) must be placed "
                 "on device lists whose positions line up (ascending ids, as layouts write)", x);
    g_free(x);
  }
  if (ok && (!per_position || (lined_up && (tp <= 1 || edp > 1)))) {
    /* carved experts: the devices at positions with the same p mod (EP x ETP) in every copy */
    uint64_t key = SYNC_KEY(ir_graph_group(g, (uint32_t *)devs->data, devs->len),
                            per_position ? size / edp : 0);
    g_array_append_val(out, key);
  } else if (ok) {
    uint32_t pos[MAX_HOMES];
    for (uint32_t p = 0; p < size; p++) {
      for (uint32_t k = 0; k < h->n_homes; k++)
        pos[k] = IR_GROUP_DEVICES(g, h->homes[k])[p];
      qsort(pos, h->n_homes, sizeof *pos, (int (*)(const void *, const void *))compare_u32);
      uint64_t key = SYNC_KEY(ir_graph_group(g, pos, h->n_homes), 0);
      g_array_append_val(out, key);
    }
  }
  g_array_free(devs, TRUE);
  return ok;
}

/* Adds the gradient collective of one bucket on group: every weight-gradient node of the
 * bucket's segments on devices of the group feeds it; syncs_of records it per segment. */
static uint32_t add_bucket_collective(struct apply *a, const GArray *bucket,
                                      const struct segment_home *home, enum ir_node_kind kind,
                                      uint32_t group, uint32_t stream, uint64_t bytes,
                                      uint32_t directive, const struct grad_index *gi,
                                      GArray **syncs_of) {
  struct ir_graph *g = a->g;
  const struct ir_node *first = IR_NODE(g, home[g_array_index(bucket, uint32_t, 0)].fwd_node);
  struct ir_node c = comm_node(first, kind, IR_COMM_DP, stream, bytes);
  c.pass = IR_PASS_NONE;
  c.segment = IR_NONE;
  c.group = group;
  c.replica_degree = IR_GROUP(g, group)->count;
  for (uint32_t t = 0; t < IR_MAX_TAGS; t++)
    if (t != MODEL_TAG_PP)
      c.tags[t] = -1;
  c.segset = ir_graph_add_segset(g, (const uint32_t *)bucket->data, bucket->len, NULL);
  c.directive = directive;
  if (directive == IR_NONE) /* a sum across model copies: whole gradients, whatever the ZeRO */
    c.shard_optimizer = c.shard_grads = c.shard_params = false;
  uint32_t cid = add_node(a, &c);
  for (uint32_t j = 0; j < bucket->len; j++) {
    uint32_t seg = g_array_index(bucket, uint32_t, j);
    g_array_append_val(syncs_of[seg], cid);
    for (uint32_t q = gi->first[seg]; q < gi->first[seg + 1]; q++)
      if (groups_overlap(g, IR_NODE(g, gi->nodes[q])->group, group))
        ir_graph_add_edge(g, gi->nodes[q], cid, IR_EDGE_TEMPORAL, 0, 0);
  }
  return cid;
}

/* A copies' sum of one bucket over sync key `key`; a split key runs one instance per position
 * (the communicator's split, carried as the node's tp_degree: lower.c, comm_of). */
static uint32_t add_copy_sum(struct apply *a, const GArray *bucket, const struct segment_home *home,
                             uint64_t key, uint32_t stream, uint64_t bytes,
                             const struct grad_index *gi, GArray **syncs_of) {
  uint32_t cid = add_bucket_collective(a, bucket, home, IR_NODE_ALL_REDUCE, SYNC_GROUP(key),
                                       stream, bytes, IR_NONE, gi, syncs_of);
  if (SYNC_SPLIT(key) > 1) {
    struct ir_node *c = IR_NODE(a->g, cid);
    c->tp_degree = SYNC_SPLIT(key);
    c->sequence_parallel = false;
    c->replica_degree = IR_GROUP(a->g, c->group)->count / SYNC_SPLIT(key);
  }
  return cid;
}

/* What the data-parallel phases share: where each segment's weight gradients are computed,
 * and per segment the gradient collectives that sum them. */
struct dp_sync {
  const struct segment_home *home;
  struct grad_index gi;
  GArray **syncs_of; /* segment -> gradient collectives */
};

/* The buckets of replicate directive d: per (group, directive), segments in reverse model
 * order (the order backward produces their gradients), closed when the next would overflow. */
static void replicate_buckets(struct apply *a, struct dp_sync *ds, uint32_t d) {
  struct ir_graph *g = a->g;
  const struct model *m = g->model;
  const struct segment_home *home = ds->home;
  const struct dir_directive *dd = &a->p->d[d];
  double cap = dd->bucket_size_mb * MIB;
  uint32_t grp_of_dir = ir_graph_group(g, dd->devices, dd->n_devices);
  GArray *bucket = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  uint64_t bytes = 0;
  for (int64_t s = (int64_t)m->n_segments - 1; s >= -1; s--) {
    bool take = false;
    if (s >= 0 && home[s].n_homes == 1 && home[s].group == grp_of_dir &&
        m->segments[s].param_count > 0) {
      const struct node_info *ni = INFO(a, home[s].fwd_node);
      const struct ir_node *fn = IR_NODE(g, home[s].fwd_node);
      /* Sharded experts own distinct parameters on each device: nothing to sync. */
      take = ni->replicate == d && fn->replica_degree > 1 && fn->shard_degree == 1;
    }
    uint64_t sb = take ? m->segments[s].param_bytes : 0;
    bool flush = bucket->len > 0 && (s < 0 || (take && (double)(bytes + sb) > cap));
    if (flush) {
      add_bucket_collective(
          a, bucket, home, dd->shard_optimizer ? IR_NODE_REDUCE_SCATTER : IR_NODE_ALL_REDUCE,
          grp_of_dir, stream_or(g, dd->reduce_stream, "dp"), bytes, d, &ds->gi, ds->syncs_of);
      g_array_set_size(bucket, 0);
      bytes = 0;
    }
    if (take) {
      uint32_t seg = (uint32_t)s;
      g_array_append_val(bucket, seg);
      bytes += sb;
    }
  }
  g_array_free(bucket, TRUE);
}

/* Expert segments of replicate directive d carved into expert-DP groups (expert_replicas > 1,
 * one home): their gradients are summed over the devices holding the same experts, the
 * positions of the stage with the same p mod (EP x ETP) (a DP communicator split by EP x ETP),
 * reduce-scattered under ZeRO, so that the optimizer state of the experts is sharded over the
 * expert-DP group as the dense layers' is over DP. Buckets of their own (another communicator),
 * in reverse model order, closed when the next would overflow. */
static void expert_dp_buckets(struct apply *a, struct dp_sync *ds, uint32_t d) {
  struct ir_graph *g = a->g;
  const struct model *m = g->model;
  const struct dir_directive *dd = &a->p->d[d];
  uint32_t grp_of_dir = ir_graph_group(g, dd->devices, dd->n_devices);
  GArray *bucket = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GArray *deg = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  /* the bucket's expert grid, as its last node's (copied: adding the collective may move the
   * node array) */
  uint32_t like_replicas = 0, like_shard = 1, like_tp = 0;
  double cap = dd->bucket_size_mb * MIB, bytes = 0;
  for (int64_t s = (int64_t)m->n_segments - 1; s >= -1; s--) {
    /* copied: adding a collective below may move the node array */
    struct ir_node f = s >= 0 ? *IR_NODE(g, ds->home[s].fwd_node) : (struct ir_node){0};
    const struct ir_node *fn = &f;
    bool take = s >= 0 && ds->home[s].n_homes == 1 && ds->home[s].group == grp_of_dir &&
                m->segments[s].param_count > 0 && INFO(a, ds->home[s].fwd_node)->replicate == d &&
                fn->expert_replicas > 1;
    double sb = take ? (double)m->segments[s].param_bytes / fn->shard_degree : 0;
    if (bucket->len > 0 && (s < 0 || (take && bytes + sb > cap))) {
      uint32_t cid = add_bucket_collective(
          a, bucket, ds->home, dd->shard_optimizer ? IR_NODE_REDUCE_SCATTER : IR_NODE_ALL_REDUCE,
          grp_of_dir, stream_or(g, dd->reduce_stream, "dp"), 0, d, &ds->gi, ds->syncs_of);
      struct ir_node *c = IR_NODE(g, cid);
      c->segset = ir_graph_add_segset(g, (uint32_t *)bucket->data, bucket->len,
                                      (uint32_t *)deg->data);
      c->bytes = IR_SEGSET(g, c->segset)->param_bytes; /* what one device holds of them */
      c->expert_replicas = c->replica_degree = like_replicas;
      c->tp_degree = like_shard * (like_tp > 1 ? like_tp : 1);
      c->sequence_parallel = false;
      c->shard_degree = 1;
      g_array_set_size(bucket, 0);
      g_array_set_size(deg, 0);
      bytes = 0;
    }
    if (take) {
      uint32_t seg = (uint32_t)s;
      g_array_append_val(bucket, seg);
      g_array_append_val(deg, fn->shard_degree);
      bytes += sb;
      like_replicas = fn->expert_replicas;
      like_shard = fn->shard_degree;
      like_tp = fn->tp_degree;
    }
  }
  g_array_free(bucket, TRUE);
  g_array_free(deg, TRUE);
}

/* A segment with copies on several homes (DualPipe) under ZeRO-1/2: each copy shards over its
 * own replica group (zero_copy_buckets), not over the union of the homes. */
static bool zero_copy_segment(const struct apply *a, const struct segment_home *home, uint32_t s) {
  const struct segment_home *h = &home[s];
  if (h->n_homes < 2 || a->g->model->segments[s].param_count == 0)
    return false;
  const struct ir_node *fn = IR_NODE(a->g, h->fwd_node);
  return fn->shard_optimizer && fn->shard_degree == 1;
}

static bool same_homes(const struct segment_home *x, const struct segment_home *y) {
  if (x->n_homes != y->n_homes)
    return false;
  for (uint32_t k = 0; k < x->n_homes; k++)
    if (!has_home(y, x->homes[k]))
      return false;
  return true;
}

/* One bucket of zero_copy_buckets: the copies' sums (per position), then one reduce-scatter
 * per home, each after the sums on its devices. */
static bool zero_copy_bucket(struct apply *a, struct dp_sync *ds, const struct segment_home *ref,
                             const GArray *bucket, uint64_t bytes, uint32_t d, GError **err) {
  struct ir_graph *g = a->g;
  uint32_t stream = stream_or(g, a->p->d[d].reduce_stream, "dp");
  GArray *keys = g_array_new(FALSE, FALSE, sizeof(uint64_t));
  GArray *sums = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  bool ok = copy_sync_keys(a, ref, true, keys, err);
  for (uint32_t q = 0; ok && q < keys->len; q++) {
    uint32_t cid = add_copy_sum(a, bucket, ds->home, g_array_index(keys, uint64_t, q), stream,
                                bytes, &ds->gi, ds->syncs_of);
    g_array_append_val(sums, cid);
  }
  for (uint32_t k = 0; ok && k < ref->n_homes; k++) {
    uint32_t rs = add_bucket_collective(a, bucket, ds->home, IR_NODE_REDUCE_SCATTER,
                                        ref->homes[k], stream, bytes, d, &ds->gi, ds->syncs_of);
    for (uint32_t q = 0; q < sums->len; q++) {
      uint32_t cid = g_array_index(sums, uint32_t, q);
      if (groups_overlap(g, IR_NODE(g, cid)->group, ref->homes[k]))
        ir_graph_add_edge(g, cid, rs, IR_EDGE_TEMPORAL, 0, 0);
    }
  }
  g_array_free(keys, TRUE);
  g_array_free(sums, TRUE);
  return ok;
}

/* DualPipe under ZeRO-1/2: the segments of replicate directive d with copies on several homes.
 * Per bucket (reverse model order, d's bucket_size), the copies' gradients are summed first,
 * by one all-reduce per position p over the devices at p of each home (a device and its twin
 * in the other copy hold the same parameters); then each home reduce-scatters the bucket over
 * its own replica group, updates its shard and all-gathers it (insert_zero2_gathers), so the
 * copies take the same steps. The executor runs each sum on its reduce-scatter's bucket
 * (exec/program.c, alias_copy_sums): both name the same segments. */
static bool zero_copy_buckets(struct apply *a, struct dp_sync *ds, uint32_t d, GError **err) {
  struct ir_graph *g = a->g;
  const struct model *m = g->model;
  double cap = a->p->d[d].bucket_size_mb * MIB;
  const struct segment_home *ref = NULL;
  GArray *bucket = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  uint64_t bytes = 0;
  bool ok = true;
  for (int64_t s = (int64_t)m->n_segments - 1; s >= -1 && ok; s--) {
    const struct segment_home *h = s >= 0 ? &ds->home[s] : NULL;
    bool take = h && zero_copy_segment(a, ds->home, (uint32_t)s) &&
                INFO(a, h->fwd_node)->replicate == d;
    if (take && !ref)
      ref = h;
    if (take && !same_homes(ref, h)) {
      char *x = node_name(g, ref->fwd_node), *y = node_name(g, h->fwd_node);
      ok = fail_at(a, d, err, "the copies of \"%s\" and \"%s\" are on different device groups: "
                              "one ZeRO replicate needs its segments' copies on the same groups",
                   x, y);
      g_free(x);
      g_free(y);
      break;
    }
    uint64_t sb = take ? m->segments[s].param_bytes : 0;
    if (bucket->len > 0 && (s < 0 || (take && (double)(bytes + sb) > cap))) {
      ok = zero_copy_bucket(a, ds, ref, bucket, bytes, d, err);
      g_array_set_size(bucket, 0);
      bytes = 0;
    }
    if (take) {
      uint32_t seg = (uint32_t)s;
      g_array_append_val(bucket, seg);
      bytes += sb;
    }
  }
  g_array_free(bucket, TRUE);
  return ok;
}

/* Open buckets of the copies' gradient sums, one per sync group. */
struct copy_buckets {
  GArray *sync_groups;  /* sync keys (SYNC_KEY) */
  GPtrArray *buckets;   /* per sync group: segments */
  GArray *bucket_bytes; /* per sync group */
};

/* Before segment s (or at the end, s < 0) joins its sync groups mine: closes every bucket that
 * ends here (the end, or one of s's groups that s would overflow). */
static void copy_buckets_flush(struct apply *a, struct dp_sync *ds, struct copy_buckets *cb,
                               int64_t s, const GArray *mine, uint64_t sb) {
  for (uint32_t k = 0; k < cb->sync_groups->len; k++) {
    GArray *b = g_ptr_array_index(cb->buckets, k);
    uint64_t *bytes = &g_array_index(cb->bucket_bytes, uint64_t, k);
    uint64_t sg = g_array_index(cb->sync_groups, uint64_t, k);
    bool in_mine = false;
    for (uint32_t q = 0; q < mine->len; q++)
      in_mine |= g_array_index(mine, uint64_t, q) == sg;
    if (b->len == 0 || !(s < 0 || (in_mine && (double)(*bytes + sb) > DIR_DEFAULT_BUCKET_MB * MIB)))
      continue;
    add_copy_sum(a, b, ds->home, sg, stream_or(a->g, "", "dp"), *bytes, &ds->gi, ds->syncs_of);
    g_array_set_size(b, 0);
    *bytes = 0;
  }
}

static void copy_buckets_add(struct copy_buckets *cb, uint32_t seg, const GArray *mine,
                             uint64_t sb) {
  for (uint32_t q = 0; q < mine->len; q++) {
    uint64_t sg = g_array_index(mine, uint64_t, q);
    uint32_t k = 0;
    while (k < cb->sync_groups->len && g_array_index(cb->sync_groups, uint64_t, k) != sg)
      k++;
    if (k == cb->sync_groups->len) {
      g_array_append_val(cb->sync_groups, sg);
      g_ptr_array_add(cb->buckets, g_array_new(FALSE, FALSE, sizeof(uint32_t)));
      g_array_set_size(cb->bucket_bytes, cb->sync_groups->len);
    }
    g_array_append_val(g_ptr_array_index(cb->buckets, k), seg);
    g_array_index(cb->bucket_bytes, uint64_t, k) += sb;
  }
}

/* Segments with several homes (model copies, DualPipe): the copies' gradients are summed.
 * A replicated segment is summed over the union of its homes, which covers the data
 * parallelism inside each home too; a sharded expert segment over each position's devices
 * (home k's device p holds the same experts as home l's device p). Buckets per sync group. */
static bool copy_sync_buckets(struct apply *a, struct dp_sync *ds, GError **err) {
  const struct model *m = a->g->model;
  struct copy_buckets cb = {
      .sync_groups = g_array_new(FALSE, FALSE, sizeof(uint64_t)),
      .buckets = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref),
      .bucket_bytes = g_array_new(FALSE, TRUE, sizeof(uint64_t)),
  };
  GArray *mine = g_array_new(FALSE, FALSE, sizeof(uint64_t)); /* this segment's sync keys */
  bool ok = true;
  for (int64_t s = (int64_t)m->n_segments - 1; s >= -1 && ok; s--) {
    g_array_set_size(mine, 0);
    if (s >= 0 && ds->home[s].n_homes > 1 && m->segments[s].param_count > 0 &&
        !zero_copy_segment(a, ds->home, (uint32_t)s))
      ok = copy_sync_keys(a, &ds->home[s], IR_NODE(a->g, ds->home[s].fwd_node)->shard_degree > 1,
                          mine, err);
    /* what one device holds: a sharded expert segment 1/shard_degree of its weights (under TP
     * dir_tp_fix_data_parallel replaces the bytes with the device's slices) */
    uint32_t shard = s >= 0 ? IR_NODE(a->g, ds->home[s].fwd_node)->shard_degree : 1;
    uint64_t sb = s >= 0 ? m->segments[s].param_bytes / (shard > 1 ? shard : 1) : 0;
    copy_buckets_flush(a, ds, &cb, s, mine, sb);
    copy_buckets_add(&cb, (uint32_t)s, mine, sb);
  }
  g_array_free(mine, TRUE);
  g_array_free(cb.sync_groups, TRUE);
  g_ptr_array_free(cb.buckets, TRUE);
  g_array_free(cb.bucket_bytes, TRUE);
  return ok;
}

/* The distinct homes of the segments the optimizer node's set holds, in first-seen order. */
static GArray *optimizer_homes(const struct ir_graph *g, const struct segment_home *home,
                               const struct ir_segset *orig) {
  GArray *groups = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t j = 0; j < orig->count; j++) {
    const struct segment_home *h = &home[g_array_index(g->segment_pool, uint32_t, orig->first + j)];
    for (uint32_t q = 0; q < h->n_homes; q++) {
      uint32_t grp = h->homes[q];
      bool seen = false;
      for (uint32_t k = 0; k < groups->len; k++)
        seen |= g_array_index(groups, uint32_t, k) == grp;
      if (!seen)
        g_array_append_val(groups, grp);
    }
  }
  return groups;
}

/* The optimizer update waits for what sums its segments' gradients: one edge per bucket
 * collective, however many of its segments the update owns; without a collective, for the
 * weight-gradient nodes on its group. */
static void link_optimizer(struct apply *a, struct dp_sync *ds, uint32_t target, uint32_t grp,
                           const GArray *segs) {
  struct ir_graph *g = a->g;
  GHashTable *linked = g_hash_table_new(NULL, NULL);
  for (uint32_t j = 0; j < segs->len; j++) {
    uint32_t seg = g_array_index(segs, uint32_t, j);
    const GArray *syncs = ds->syncs_of[seg];
    if (syncs->len) {
      for (uint32_t q = 0; q < syncs->len; q++) {
        uint32_t cid = g_array_index(syncs, uint32_t, q);
        if (groups_overlap(g, IR_NODE(g, cid)->group, grp) &&
            g_hash_table_add(linked, GUINT_TO_POINTER(cid + 1)))
          ir_graph_add_edge(g, cid, target, IR_EDGE_TEMPORAL, 0, 0);
      }
    } else {
      for (uint32_t q = ds->gi.first[seg]; q < ds->gi.first[seg + 1]; q++)
        if (IR_NODE(g, ds->gi.nodes[q])->group == grp)
          ir_graph_add_edge(g, ds->gi.nodes[q], target, IR_EDGE_TEMPORAL, 0, 0);
    }
  }
  g_hash_table_destroy(linked);
}

/* The update of optimizer node o on its k-th home grp: the segments of orig held there. The
 * first home keeps node o; the others get copies. */
static void optimizer_on_group(struct apply *a, struct dp_sync *ds, uint32_t o, uint32_t k,
                               uint32_t grp, const struct ir_segset *orig) {
  struct ir_graph *g = a->g;
  GArray *segs = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GArray *deg = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  bool shard_optimizer = false, shard_grads = false, shard_params = false;
  uint32_t replicas = 1;
  for (uint32_t j = 0; j < orig->count; j++) {
    uint32_t seg = g_array_index(g->segment_pool, uint32_t, orig->first + j);
    if (!has_home(&ds->home[seg], grp))
      continue;
    const struct ir_node *fn = IR_NODE(g, ds->home[seg].fwd_node);
    g_array_append_val(segs, seg);
    g_array_append_val(deg, fn->shard_degree);
    shard_optimizer |= fn->shard_optimizer;
    shard_grads |= fn->shard_grads;
    shard_params |= fn->shard_params;
    if (fn->replica_degree > replicas)
      replicas = fn->replica_degree;
  }
  uint32_t target = o;
  struct ir_node opt = *IR_NODE(g, o);
  opt.group = grp;
  opt.segset = ir_graph_add_segset(g, (uint32_t *)segs->data, segs->len, (uint32_t *)deg->data);
  opt.shard_optimizer = shard_optimizer;
  opt.shard_grads = shard_grads;
  opt.shard_params = shard_params;
  opt.replica_degree = replicas;
  if (k == 0)
    *IR_NODE(g, o) = opt;
  else
    target = add_node(a, &opt);
  link_optimizer(a, ds, target, grp, segs);
  g_array_free(segs, TRUE);
  g_array_free(deg, TRUE);
}

/* Optimizer nodes (the first n_opt nodes hold them): one per PP region and device group
 * holding its parameters. */
static void regroup_optimizers(struct apply *a, struct dp_sync *ds, uint32_t n_opt) {
  struct ir_graph *g = a->g;
  for (uint32_t o = 0; o < n_opt; o++) {
    struct ir_node *on = IR_NODE(g, o);
    if (on->kind != IR_NODE_OPTIMIZER)
      continue;
    for (uint32_t e = 0; e < g->edges->len; e++)
      if (IR_EDGE(g, e)->dst == o)
        IR_EDGE(g, e)->kind = IR_EDGE_DEAD;
    const struct ir_segset orig = *IR_SEGSET(g, on->segset);
    GArray *groups = optimizer_homes(g, ds->home, &orig);
    for (uint32_t k = 0; k < groups->len; k++)
      optimizer_on_group(a, ds, o, k, g_array_index(groups, uint32_t, k), &orig);
    g_array_free(groups, TRUE);
  }
}

/* ZeRO-2: the update touched only this device's shard; gather the updated parameters. Looks at
 * the collectives added since node first. */
static void insert_zero2_gathers(struct apply *a, uint32_t first) {
  struct ir_graph *g = a->g;
  uint32_t nn = g->nodes->len;
  for (uint32_t c = first; c < nn; c++) {
    const struct ir_node *cn = IR_NODE(g, c);
    if (cn->kind != IR_NODE_REDUCE_SCATTER || cn->shard_params)
      continue;
    const struct dir_directive *dd = &a->p->d[cn->directive];
    uint32_t ne = g->edges->len;
    for (uint32_t e = 0; e < ne; e++) {
      const struct ir_edge *ed = IR_EDGE(g, e);
      if (ed->src != c || ed->kind == IR_EDGE_DEAD ||
          IR_NODE(g, ed->dst)->kind != IR_NODE_OPTIMIZER)
        continue;
      uint32_t opt = ed->dst;
      struct ir_node gn =
          comm_node(IR_NODE(g, c), IR_NODE_ALL_GATHER, IR_COMM_DP,
                    stream_or(g, dd->gather_stream, "dp_gather"), IR_NODE(g, c)->bytes);
      gn.segset = IR_NODE(g, c)->segset;
      uint32_t gid = add_node(a, &gn);
      ir_graph_add_edge(g, opt, gid, IR_EDGE_TEMPORAL, 0, 0);
    }
  }
}

/* The segments of the embedding and of the LM head when the head keeps its own copy of a tied
 * embedding (tie_word_embeddings with the two in different PP regions, models/build.c). */
static bool tied_copy_segments(const struct model *m, uint32_t *embedding, uint32_t *head) {
  *embedding = *head = IR_NONE;
  if (!m->tie_word_embeddings)
    return false;
  for (uint32_t s = 0; s < m->n_segments; s++)
    for (uint32_t o = m->segments[s].op_first;
         o < m->segments[s].op_first + m->segments[s].op_count; o++) {
      if (m->ops[o].kind == MODEL_OP_EMBEDDING)
        *embedding = s;
      if (m->ops[o].kind == MODEL_OP_LM_HEAD_LOSS && m->ops[o].param_count > 0)
        *head = s;
    }
  return *embedding != IR_NONE && *head != IR_NONE && *embedding != *head;
}

/* The sync of a tied embedding split across stages waits for everything that writes the two
 * copies' gradients there: the segment's gradient collectives, else its weight-gradient nodes. */
static void link_tied_sync(struct apply *a, struct dp_sync *ds, uint32_t seg, uint32_t cid) {
  struct ir_graph *g = a->g;
  uint32_t grp = IR_NODE(g, cid)->group;
  const GArray *syncs = ds->syncs_of[seg];
  for (uint32_t q = 0; q < syncs->len; q++) {
    uint32_t c = g_array_index(syncs, uint32_t, q);
    if (groups_overlap(g, IR_NODE(g, c)->group, grp))
      ir_graph_add_edge(g, c, cid, IR_EDGE_TEMPORAL, 0, 0);
  }
  if (syncs->len == 0)
    for (uint32_t q = ds->gi.first[seg]; q < ds->gi.first[seg + 1]; q++)
      if (groups_overlap(g, IR_NODE(g, ds->gi.nodes[q])->group, grp))
        ir_graph_add_edge(g, ds->gi.nodes[q], cid, IR_EDGE_TEMPORAL, 0, 0);
}

/* Tied embeddings split across pipeline stages: the LM head's stage keeps its own copy of the
 * embedding matrix, and the two copies' gradients are summed (as Megatron does) after each
 * stage's own data-parallel sum, so both copies take the same optimizer steps. One all-reduce
 * per data-parallel position, between the devices at that position on the two stages; the
 * optimizers of both wait for it (it joins the segments' syncs). Copies placed on one device
 * group (V placements) or on several (DualPipe) get no collective: the executor refuses them. */
static bool insert_tied_sync(struct apply *a, struct dp_sync *ds, GError **err) {
  struct ir_graph *g = a->g;
  const struct model *m = g->model;
  uint32_t emb, head;
  if (!tied_copy_segments(m, &emb, &head))
    return true;
  const struct segment_home *he = &ds->home[emb], *hh = &ds->home[head];
  if (he->n_homes != 1 || hh->n_homes != 1 || groups_overlap(g, he->group, hh->group))
    return true;
  uint32_t n = IR_GROUP(g, he->group)->count;
  if (IR_GROUP(g, hh->group)->count != n)
    return fail_at(a, IR_NONE, err,
                   "the tied embedding's copies are on %u and %u devices: the stages holding the "
                   "embedding and the LM head must have equal data-parallel sizes",
                   n, IR_GROUP(g, hh->group)->count);
  uint64_t bytes = (uint64_t)m->vocab_size * (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
  for (uint32_t pos = 0; pos < n; pos++) {
    uint32_t pair[2] = {IR_GROUP_DEVICES(g, he->group)[pos], IR_GROUP_DEVICES(g, hh->group)[pos]};
    struct ir_node c = comm_node(IR_NODE(g, hh->fwd_node), IR_NODE_ALL_REDUCE, IR_COMM_DP,
                                 stream_or(g, "", "dp"), bytes);
    c.pass = IR_PASS_NONE;
    c.segment = head;
    c.group = ir_graph_group(g, pair, 2);
    c.replica_degree = 2;
    c.shard_degree = 1;
    c.shard_optimizer = c.shard_grads = c.shard_params = false;
    c.directive = IR_NONE;
    for (uint32_t t = 0; t < IR_MAX_TAGS; t++)
      if (t != MODEL_TAG_PP)
        c.tags[t] = -1;
    uint32_t cid = add_node(a, &c);
    link_tied_sync(a, ds, emb, cid);
    link_tied_sync(a, ds, head, cid);
    g_array_append_val(ds->syncs_of[emb], cid);
    g_array_append_val(ds->syncs_of[head], cid);
  }
  return true;
}

/* Inserts gradient buckets (per replicate directive, then across model copies), regroups
 * optimizer nodes (one per PP region and device group) and adds ZeRO-2 gathers. */
static bool insert_data_parallel(struct apply *a, const struct segment_home *home, GError **err) {
  struct ir_graph *g = a->g;
  const struct model *m = g->model;
  struct dp_sync ds = {.home = home, .syncs_of = g_new(GArray *, m->n_segments)};
  grad_index_build(g, &ds.gi);
  for (uint32_t s = 0; s < m->n_segments; s++)
    ds.syncs_of[s] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  uint32_t n_opt = g->nodes->len;
  bool ok = true;
  for (uint32_t d = 0; d < a->p->n && ok; d++)
    if (a->p->d[d].op == DIR_REPLICATE) {
      replicate_buckets(a, &ds, d);
      expert_dp_buckets(a, &ds, d);
      ok = zero_copy_buckets(a, &ds, d, err);
    }
  ok = ok && copy_sync_buckets(a, &ds, err) && insert_tied_sync(a, &ds, err);
  if (ok) {
    regroup_optimizers(a, &ds, n_opt);
    insert_zero2_gathers(a, n_opt);
  }
  free_syncs(ds.syncs_of, m->n_segments);
  grad_index_free(&ds.gi);
  return ok;
}

/* Whether segment seg's weight-gradient pass (BW) reads the parameters: the LM head's BW
 * recomputes the logits from h and the head's weights (models/build.c), every other BW reads
 * only saved activations and output gradients. */
static bool bw_reads_params(const struct model *m, uint32_t seg) {
  const struct model_segment *sg = &m->segments[seg];
  for (uint32_t o = sg->op_first; o < sg->op_first + sg->op_count; o++)
    if (m->ops[o].kind == MODEL_OP_LM_HEAD_LOSS && m->ops[o].param_count > 0)
      return true;
  return false;
}

/* ZeRO-3: one all-gather per bucket, micro-batch and use (F, B or BI, and BW where it reads
 * the parameters), feeding every compute node of the bucket in that use; its buffer lives
 * until the last of them is done. BW has its own gather, not BI's kept: a zero-bubble
 * schedule defers BW past other micro-batches' work, and BI's buffer held that long would
 * pile up. When it may start is fixed once the order is known (prefetch_gathers). */
static void insert_gathers(struct apply *a) {
  struct ir_graph *g = a->g;
  uint32_t nn = g->nodes->len;
  /* Consumers grouped by (bucket collective, micro-batch key, use). */
  GHashTable *groups = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  GPtrArray *lists = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
  GArray *owners = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  uint32_t *bucket_of_seg = g_new(uint32_t, g->model->n_segments);
  for (uint32_t s = 0; s < g->model->n_segments; s++)
    bucket_of_seg[s] = IR_NONE;
  for (uint32_t i = 0; i < nn; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_REDUCE_SCATTER && n->kind != IR_NODE_ALL_REDUCE)
      continue;
    if (n->directive == IR_NONE || !a->p->d[n->directive].shard_params)
      continue; /* copy sync */
    const struct ir_segset *ss = IR_SEGSET(g, n->segset);
    for (uint32_t j = 0; j < ss->count; j++)
      bucket_of_seg[g_array_index(g->segment_pool, uint32_t, ss->first + j)] = i;
  }
  for (uint32_t i = 0; i < nn; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_COMPUTE ||
        (n->pass == IR_PASS_BW && !bw_reads_params(g->model, n->segment)))
      continue;
    uint32_t b = bucket_of_seg[n->segment];
    if (b == IR_NONE || IR_NODE(g, b)->group != n->group)
      continue;
    GString *key = g_string_new(NULL);
    g_string_append_printf(key, "%u|%d", b,
                           n->pass == IR_PASS_F ? 0 : n->pass == IR_PASS_BW ? 2 : 1);
    for (uint32_t t = g->model->n_tags; t < g->n_tags; t++)
      g_string_append_printf(key, "|%d", n->tags[t]);
    gpointer idx = g_hash_table_lookup(groups, key->str);
    if (!idx) {
      g_ptr_array_add(lists, g_array_new(FALSE, FALSE, sizeof(uint32_t)));
      g_array_append_val(owners, b);
      idx = GUINT_TO_POINTER(lists->len);
      g_hash_table_insert(groups, g_string_free(key, FALSE), idx);
    } else {
      g_string_free(key, TRUE);
    }
    g_array_append_val(g_ptr_array_index(lists, GPOINTER_TO_UINT(idx) - 1), i);
  }
  for (uint32_t l = 0; l < lists->len; l++) {
    GArray *cons = g_ptr_array_index(lists, l);
    uint32_t b = g_array_index(owners, uint32_t, l);
    const struct ir_node *first = IR_NODE(g, g_array_index(cons, uint32_t, 0));
    const struct dir_directive *dd = &a->p->d[IR_NODE(g, b)->directive];
    struct ir_node gn =
        comm_node(first, IR_NODE_ALL_GATHER, IR_COMM_DP,
                  stream_or(g, dd->gather_stream, "dp_gather"), IR_NODE(g, b)->bytes);
    gn.segment = IR_NONE;
    gn.segset = IR_NODE(g, b)->segset;
    gn.directive = IR_NODE(g, b)->directive;
    const struct ir_node *bn = IR_NODE(g, b);
    if (bn->expert_replicas > 1) { /* experts' gather: over their expert-DP group, as the sum */
      gn.expert_replicas = gn.replica_degree = bn->expert_replicas;
      gn.tp_degree = bn->tp_degree;
      gn.sequence_parallel = false;
      gn.shard_degree = 1;
      gn.route_split = 0;
    }
    uint32_t gid = add_node(a, &gn);
    for (uint32_t j = 0; j < cons->len; j++)
      ir_graph_add_edge(g, gid, g_array_index(cons, uint32_t, j), IR_EDGE_DATA, 0,
                        IR_NODE(g, b)->bytes);
  }
  g_free(bucket_of_seg);
  g_array_free(owners, TRUE);
  g_ptr_array_free(lists, TRUE);
  g_hash_table_destroy(groups);
}

/* The expert side's tensors at the capacity the plan states (ir/expert.c), and the state the
 * backward reads beyond the experts' saved activations, as tensors of the plan: the dispatch's
 * routing tables (read by the experts, the combine and both backward all-to-alls; under full
 * recomputation the rerun's dispatch's serve the backwards). The combine keeps nothing: the
 * experts apply the routing weights (kernels.h, EXPERT_FFN), so its transpose reads only the
 * routing. into[x] / out[x]: the all-to-all into and out of expert node x, IR_NONE where none. */
struct expert_side {
  struct ir_graph *g;
  const uint32_t *into, *out;
  uint32_t x, d;          /* the expert forward (or rerun) and the dispatch whose tables it reads */
  uint32_t combine;       /* the combine that reads them */
  uint64_t route, saved; /* bytes of the routing tables and of the experts' saved rows */
};

/* A backward b of the expert forward: what it reads at the capacity, and the routing. */
static void size_expert_backward(const struct expert_side *es, uint32_t e, uint64_t saved) {
  struct ir_graph *g = es->g;
  uint32_t b = IR_EDGE(g, e)->dst;
  IR_EDGE(g, e)->bytes = saved;
  ir_graph_add_edge(g, es->d, b, IR_EDGE_DATA, 1, es->route);
  if (es->into[b] != IR_NONE) { /* B or BI: the combine's and the dispatch's transposes */
    ir_graph_add_edge(g, es->d, es->into[b], IR_EDGE_DATA, 1, es->route);
    /* a rerun's combine keeps nothing for the backward, but the backward starts when the
     * whole rerun has ended, its combine too, as Megatron's checkpointed layer does */
    if (IR_NODE(g, es->combine)->pass == IR_PASS_R)
      ir_graph_add_edge(g, es->combine, es->into[b], IR_EDGE_TEMPORAL, 0, 0);
  }
  if (es->out[b] != IR_NONE)
    ir_graph_add_edge(g, es->d, es->out[b], IR_EDGE_DATA, 1, es->route);
}

/* The slot-1 edges out of expert node x (a forward, or a rerun with its own all-to-alls) into
 * compute nodes of its segment: its backwards'. (A forward under full recomputation has none:
 * insert_expert_reruns took its edge to the rerun.) Under selective recomputation (moe_act)
 * the forward keeps its rows less the activations, for its rerun and its backwards; the
 * rerun's edge, sized by apply_recompute at the capacity already, carries those. */
static void size_expert_readers(const struct expert_side *es, const struct ir_adjacency *adj) {
  struct ir_graph *g = es->g;
  uint32_t x = es->x;
  for (uint32_t k = adj->out_first[x]; k < adj->out_first[x + 1]; k++) {
    uint32_t e = adj->out_edges[k];
    const struct ir_edge *ed = IR_EDGE(g, e);
    const struct ir_node *bn = IR_NODE(g, ed->dst), *xn = IR_NODE(g, x);
    if (ed->kind != IR_EDGE_DATA || ed->slot != 1 || bn->kind != IR_NODE_COMPUTE ||
        bn->segment != xn->segment)
      continue;
    uint64_t part = xn->recompute == IR_RECOMPUTE_SELECTIVE && xn->pass == IR_PASS_F
                        ? ir_node_module_bytes(g->model, xn, xn->recompute_modules)
                        : 0;
    PIPER_ASSERT(part <= es->saved);
    if (bn->pass == IR_PASS_R) { /* a selective rerun reads what F kept, no routing */
      PIPER_ASSERT(part > 0);    /* a full one: insert_expert_reruns */
      IR_EDGE(g, e)->bytes = es->saved - part;
      continue;
    }
    size_expert_backward(es, e, es->saved - part);
  }
}

/* rerun_into[r] / rerun_out[r]: the rerun's own dispatch and combine (pass R), IR_NONE where
 * the rerun has none. Under full recomputation the forward's tables serve it and its combine
 * alone; the rerun's serve the rerun, its combine and the backwards. */
static void size_expert_side(struct ir_graph *g, const uint32_t *into, const uint32_t *out,
                             const uint32_t *rerun_into, const uint32_t *rerun_out, uint32_t nn) {
  const struct model *m = g->model;
  struct ir_adjacency adj; /* of the edges before this pass: the ones it adds are not walked */
  ir_adjacency_build(g, &adj);
  for (uint32_t x = 0; x < nn; x++) {
    const struct ir_node *xn = IR_NODE(g, x);
    bool rerun = rerun_into[x] != IR_NONE; /* insert_expert_reruns */
    if (xn->kind != IR_NODE_COMPUTE || !ir_ep_sized(xn) ||
        (!rerun && (xn->pass != IR_PASS_F || into[x] == IR_NONE || out[x] == IR_NONE)))
      continue;
    struct expert_side es = {g,
                             into,
                             out,
                             x,
                             rerun ? rerun_into[x] : into[x],
                             rerun ? rerun_out[x] : out[x],
                             ir_ep_route_bytes(m, xn),
                             ir_ep_saved_bytes(m, xn)};
    ir_graph_add_edge(g, es.d, x, IR_EDGE_DATA, 1, es.route);
    ir_graph_add_edge(g, es.d, es.combine, IR_EDGE_DATA, 1, es.route);
    size_expert_readers(&es, &adj);
  }
  ir_adjacency_free(&adj);
}

/* The rerun of forward f: the R node of f's segment that reads f's kept inputs (slot 1), and
 * that edge; IR_NONE where f has none. */
static uint32_t rerun_of(const struct ir_graph *g, const struct ir_adjacency *adj, uint32_t f,
                         uint32_t *edge) {
  for (uint32_t k = adj->out_first[f]; k < adj->out_first[f + 1]; k++) {
    const struct ir_edge *ed = IR_EDGE(g, adj->out_edges[k]);
    const struct ir_node *r = IR_NODE(g, ed->dst);
    if (ed->kind == IR_EDGE_DATA && ed->slot == 1 && r->kind == IR_NODE_COMPUTE &&
        r->pass == IR_PASS_R && r->segment == IR_NODE(g, f)->segment) {
      if (edge)
        *edge = adj->out_edges[k];
      return ed->dst;
    }
  }
  return IR_NONE;
}

/* The data edge into all-to-all c from a compute node (the router's output into a dispatch,
 * the experts' into a combine). */
static struct ir_edge a2a_input(const struct ir_graph *g, const struct ir_adjacency *adj,
                                uint32_t c) {
  for (uint32_t k = adj->in_first[c]; k < adj->in_first[c + 1]; k++) {
    const struct ir_edge *ed = IR_EDGE(g, adj->in_edges[k]);
    if (ed->kind == IR_EDGE_DATA && ed->slot != 1 && IR_NODE(g, ed->src)->kind == IR_NODE_COMPUTE)
      return *ed;
  }
  PIPER_UNREACHABLE();
}

/* Full recomputation of expert-parallel experts as Megatron-LM does it: the rerun reruns the
 * dispatch and the combine too (Megatron reruns the whole layer's forward), so that a
 * micro-batch waiting for its backward keeps nothing of T x top_k x hidden (the forward's
 * received rows). The router's rerun R0 (check_expert_recompute makes sure there is one) hands
 * its h and routing to the rerun's dispatch DR (they are in R0's saved activations, read
 * there); DR sends the rows and their routing weights to the experts' rerun R1, whose outputs
 * the rerun's combine CR receives and drops (CR produces no combined output: the forward's
 * went on). The forward's experts keep nothing for R1 (their edge dies), and the router's
 * output lives until the forward's combine, which reads its routing weights. */
static void insert_expert_reruns(struct apply *a, const uint32_t *into, const uint32_t *out,
                                 uint32_t *rerun_into, uint32_t *rerun_out, uint32_t nn) {
  struct ir_graph *g = a->g;
  struct ir_adjacency adj;
  ir_adjacency_build(g, &adj);
  for (uint32_t x = 0; x < nn; x++) {
    const struct ir_node *xn = IR_NODE(g, x);
    uint32_t kept;
    if (xn->kind != IR_NODE_COMPUTE || xn->pass != IR_PASS_F || !ir_ep_sized(xn) ||
        xn->recompute != IR_RECOMPUTE_FULL || into[x] == IR_NONE || out[x] == IR_NONE)
      continue;
    uint32_t r1 = rerun_of(g, &adj, x, &kept);
    struct ir_edge in = a2a_input(g, &adj, into[x]), back = a2a_input(g, &adj, out[x]);
    uint32_t r0 = rerun_of(g, &adj, in.src, NULL);
    PIPER_ASSERT(r1 != IR_NONE && r0 != IR_NONE); /* check_expert_recompute */
    uint64_t rows = ir_ep_rows_bytes(g->model, xn);
    uint64_t rows_in = rows + ir_ep_weights_bytes(g->model, xn); /* with their weights */
    IR_EDGE(g, kept)->kind = IR_EDGE_DEAD;
    struct ir_node d = *IR_NODE(g, into[x]), c = *IR_NODE(g, out[x]);
    d.pass = c.pass = IR_PASS_R;
    rerun_into[r1] = add_node(a, &d);
    rerun_out[r1] = add_node(a, &c);
    ir_graph_add_edge(g, r0, rerun_into[r1], IR_EDGE_DATA, 1, in.bytes);
    ir_graph_add_edge(g, rerun_into[r1], r1, IR_EDGE_DATA, 0, rows_in);
    ir_graph_add_edge(g, r1, rerun_out[r1], IR_EDGE_DATA, back.slot, rows);
    ir_graph_add_edge(g, in.src, out[x], IR_EDGE_DATA, in.slot, in.bytes);
  }
  ir_adjacency_free(&adj);
}

/* Expert parallelism: an all-to-all on every data edge into and out of a sharded expert node
 * (dispatch and combine in F; their transposes in B or BI). Saved activations stay local. */
static void insert_all_to_all(struct apply *a) {
  struct ir_graph *g = a->g;
  const struct model *m = g->model;
  uint64_t payload = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->experts_per_tok *
                     (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
  uint32_t ne = g->edges->len, nn = g->nodes->len;
  uint32_t *into_of = g_new(uint32_t, nn ? nn : 1), *out_of = g_new(uint32_t, nn ? nn : 1);
  for (uint32_t i = 0; i < nn; i++) {
    into_of[i] = out_of[i] = IR_NONE;
    struct ir_node *n = IR_NODE(g, i); /* every EP node states its capacity (copies included) */
    if (n->shard_degree > 1 && n->capacity_factor <= 0)
      n->capacity_factor = IR_EP_CAPACITY_FACTOR_DEFAULT;
  }
  for (uint32_t e = 0; e < ne; e++) {
    struct ir_edge ed = *IR_EDGE(g, e);
    if (ed.kind != IR_EDGE_DATA || ed.slot == 1)
      continue;
    const struct ir_node *src = IR_NODE(g, ed.src), *dst = IR_NODE(g, ed.dst);
    bool into = dst->kind == IR_NODE_COMPUTE && dst->shard_degree > 1 &&
                src->kind == IR_NODE_COMPUTE && src->segment != dst->segment;
    bool out = src->kind == IR_NODE_COMPUTE && src->shard_degree > 1 &&
               dst->kind == IR_NODE_COMPUTE && src->segment != dst->segment;
    if (!into && !out)
      continue;
    const struct ir_node *expert = into ? dst : src;
    uint32_t ex = into ? ed.dst : ed.src;
    /* the routed rows on the experts' side: the capacity, not the tokens' [T, hidden]; into a
     * forward and out of a backward with their routing weights or those's gradients */
    uint64_t rows = ir_ep_sized(expert) ? ir_ep_rows_bytes(m, expert) : ed.bytes;
    bool fwd = expert->pass == IR_PASS_F || expert->pass == IR_PASS_R;
    if (ir_ep_sized(expert) && into == fwd)
      rows += ir_ep_weights_bytes(m, expert);
    const struct dir_directive *sd = &a->p->d[INFO(a, ex)->shard];
    uint64_t sent = payload / (expert->route_split > 1 ? expert->route_split : 1);
    struct ir_node c =
        comm_node(expert, IR_NODE_ALL_TO_ALL, IR_COMM_EP, stream_or(g, sd->stream, "ep"), sent);
    c.directive = INFO(a, ex)->shard;
    uint32_t cid = add_node(a, &c);
    IR_EDGE(g, e)->kind = IR_EDGE_DEAD;
    ir_graph_add_edge(g, ed.src, cid, IR_EDGE_DATA, ed.slot, into ? ed.bytes : rows);
    ir_graph_add_edge(g, cid, ed.dst, IR_EDGE_DATA, 0, into ? rows : ed.bytes);
    (into ? into_of : out_of)[ex] = cid;
  }
  uint32_t *rerun_into = g_new(uint32_t, nn ? nn : 1), *rerun_out = g_new(uint32_t, nn ? nn : 1);
  for (uint32_t i = 0; i < nn; i++)
    rerun_into[i] = rerun_out[i] = IR_NONE;
  insert_expert_reruns(a, into_of, out_of, rerun_into, rerun_out, nn);
  size_expert_side(g, into_of, out_of, rerun_into, rerun_out, nn);
  g_free(rerun_into);
  g_free(rerun_out);
  g_free(into_of);
  g_free(out_of);
}

/* Pipeline communication: a send/recv pair on every data edge between device groups. */
static bool insert_send_recv(struct apply *a, GError **err) {
  struct ir_graph *g = a->g;
  uint32_t ne = g->edges->len;
  for (uint32_t e = 0; e < ne; e++) {
    struct ir_edge ed = *IR_EDGE(g, e);
    if (ed.kind == IR_EDGE_DEAD)
      continue;
    struct ir_node src = *IR_NODE(g, ed.src), dst = *IR_NODE(g, ed.dst);
    if (src.group == dst.group)
      continue;
    if (ed.kind == IR_EDGE_TEMPORAL) {
      /* A dependency between overlapping groups (gradients of model copies into their
       * all-reduce) is kept by the shared devices; nothing to send. */
      PIPER_ASSERT(groups_overlap(g, src.group, dst.group));
      continue;
    }
    if (IR_GROUP(g, src.group)->count != IR_GROUP(g, dst.group)->count) {
      char *x = node_name(g, ed.src), *y = node_name(g, ed.dst);
      uint32_t d = INFO(a, ed.dst)->grouped_by;
      fail_at(a, d != IR_NONE ? d : INFO(a, ed.src)->grouped_by, err,
              "\"%s\" on %u devices sends to \"%s\" on %u devices: device groups that exchange "
              "data must have equal sizes",
              x, IR_GROUP(g, src.group)->count, y, IR_GROUP(g, dst.group)->count);
      g_free(x);
      g_free(y);
      return false;
    }
    /* By default each direction between two groups (one PP communicator) gets a stream of its
     * own on both ends: a FIFO channel whose receives run in its sends' order, so a message
     * that arrives late never holds up one from another peer or direction. */
    char channel[IR_NAME_MAX];
    g_snprintf(channel, sizeof channel, "pp g%u->g%u", src.group, dst.group);
    uint32_t ss = INFO(a, ed.src)->send_stream, rs = INFO(a, ed.dst)->recv_stream;
    uint32_t cs = ir_graph_stream(g, channel);
    struct ir_node s = comm_node(&src, IR_NODE_SEND, IR_COMM_PP, ss != IR_NONE ? ss : cs, ed.bytes);
    s.peer_group = dst.group;
    s.shard_degree = 1;
    struct ir_node r = s;
    r.kind = IR_NODE_RECV;
    r.group = dst.group;
    r.peer_group = src.group;
    r.stream = rs != IR_NONE ? rs : cs;
    uint32_t sid = add_node(a, &s), rid = add_node(a, &r);
    IR_NODE(g, sid)->pair = rid;
    IR_NODE(g, rid)->pair = sid;
    IR_EDGE(g, e)->kind = IR_EDGE_DEAD;
    ir_graph_add_edge(g, ed.src, sid, IR_EDGE_DATA, ed.slot, ed.bytes);
    ir_graph_add_edge(g, sid, rid, IR_EDGE_DATA, 0, ed.bytes);
    ir_graph_add_edge(g, rid, ed.dst, IR_EDGE_DATA, 0, ed.bytes);
  }
  return true;
}

/* ---- phase 6: order ---------------------------------------------------------------------- */

/* qsort context for by_position; per thread: the planner compiles on several at once */
static _Thread_local const uint32_t *sort_pos;
static int by_position(const void *x, const void *y) {
  uint32_t a = sort_pos[*(const uint32_t *)x], b = sort_pos[*(const uint32_t *)y];
  return a < b ? -1 : a > b;
}

/* topo: the graph's topological positions (by_position sorts by them), brought up to date
 * with this directive's temporal edges for the next. */
static bool apply_order(struct apply *a, uint32_t d, struct tag_index *ix,
                        struct ir_topo *topo, GError **err) {
  const struct dir_directive *dd = &a->p->d[d];
  struct ir_graph *g = a->g;
  bool ok = false;
  GPtrArray *slots = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
  uint32_t group = IR_NONE, group_node = IR_NONE;
  for (uint32_t s = 0; s < dd->n_slots; s++) {
    GArray *slot = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_ptr_array_add(slots, slot);
    for (uint32_t fi = dd->slot_first[s]; fi < dd->slot_first[s + 1]; fi++) {
      struct ir_filter f;
      if (!resolve(a, d, &dd->filters[fi], &f, err))
        goto out;
      GArray *m = match_indexed(a, ix, &f);
      if (m->len == 0) {
        char *ft = filter_text(&dd->filters[fi]);
        fail_at(a, d, err, "\"filters\" group %u filter %u %s matches nothing", s,
                fi - dd->slot_first[s], ft);
        g_free(ft);
        g_array_free(m, TRUE);
        goto out;
      }
      /* Round-robin interleaving inside a slot: the k-th node (topological order) of each
       * filter comes before the (k+1)-th of any, filters taken in the order written. */
      qsort(m->data, m->len, sizeof(uint32_t), by_position);
      for (uint32_t j = 0; j < m->len; j++) {
        uint32_t i = g_array_index(m, uint32_t, j);
        struct ir_node *n = IR_NODE(g, i);
        if (group == IR_NONE) {
          group = n->group;
          group_node = i;
        } else if (n->group != group) {
          char *x = node_name(g, group_node), *y = node_name(g, i);
          fail_at(a, d, err,
                  "\"filters\" group %u spans device groups: \"%s\" runs on g%u, \"%s\" on g%u "
                  "(one order directive orders one device group)",
                  s, y, n->group, x, group);
          g_free(x);
          g_free(y);
          g_array_free(m, TRUE);
          goto out;
        }
        n->priority = ((uint64_t)s << 32) | ((uint64_t)j << 8) | (fi - dd->slot_first[s]);
        g_array_append_val(slot, i);
      }
      g_array_free(m, TRUE);
    }
  }
  /* BI of a key must be followed by its BW in a later slot. */
  for (uint32_t s = 0; s < slots->len; s++) {
    GArray *slot = g_ptr_array_index(slots, s);
    for (uint32_t j = 0; j < slot->len; j++) {
      uint32_t i = g_array_index(slot, uint32_t, j);
      const struct ir_node *n = IR_NODE(g, i);
      if (n->pass != IR_PASS_BI)
        continue;
      bool later = false;
      for (uint32_t t = s + 1; t < slots->len && !later; t++) {
        GArray *ls = g_ptr_array_index(slots, t);
        for (uint32_t k = 0; k < ls->len && !later; k++)
          later = g_array_index(ls, uint32_t, k) == n->pair;
      }
      if (!later) {
        char *nm = node_name(g, i);
        fail_at(a, d, err, "\"filters\" group %u orders \"%s\" but no later group has its BW", s,
                nm);
        g_free(nm);
        goto out;
      }
    }
  }
  /* Temporal edges from the last nodes of each slot to the first nodes of the next. */
  for (uint32_t s = 0; s + 1 < slots->len; s++) {
    GArray *from = g_ptr_array_index(slots, s), *to = g_ptr_array_index(slots, s + 1);
    for (uint32_t j = 0; j < from->len; j++)
      for (uint32_t k = 0; k < to->len; k++) {
        uint32_t u = g_array_index(from, uint32_t, j), v = g_array_index(to, uint32_t, k);
        if (u != v)
          ir_graph_add_edge(g, u, v, IR_EDGE_TEMPORAL, 0, 0);
      }
  }
  uint32_t stuck;
  if (!ir_topo_update(topo, g, &stuck)) {
    char *nm = node_name(g, stuck);
    fail_at(a, d, err, "the order creates a cycle against dataflow (\"%s\" would wait on itself)",
            nm);
    g_free(nm);
    goto out;
  }
  ok = true;
out:
  g_ptr_array_free(slots, TRUE);
  return ok;
}

/* Default lowering priorities for nodes no order named: forward before backward, then
 * micro-batch (GPipe-like); weight gradients after input gradients. */
static void default_priorities(struct apply *a, const bool *ordered) {
  struct ir_graph *g = a->g;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    struct ir_node *n = IR_NODE(g, i);
    if (ordered[i] || n->kind != IR_NODE_COMPUTE)
      continue;
    uint64_t pass = n->pass == IR_PASS_F ? 0 : n->pass == IR_PASS_BW ? 2 : 1;
    uint64_t mb =
        a->split_tag >= 0 && n->tags[a->split_tag] >= 0 ? (uint64_t)n->tags[a->split_tag] : 0;
    n->priority = (1ull << 62) | (pass << 56) | (mb << 32);
  }
}

/* ---- ZeRO-3 prefetch ------------------------------------------------------------------------ */

/* A group's compute nodes in the order its devices run them: by run_positions. */
/* qsort context for by_run_order; per thread: the planner compiles on several at once */
static _Thread_local const uint32_t *run_pos;
static int by_run_order(const void *x, const void *y) {
  uint32_t u = run_pos[*(const uint32_t *)x], v = run_pos[*(const uint32_t *)y];
  return u < v ? -1 : u > v;
}

/* Topological positions that follow lowering priorities among ready nodes (lowest first, then
 * lowest id), as lowering's list scheduler does: a node that runs before another on a device
 * then usually also comes first here, so the edges below pass their no-cycle test. */
struct prio_heap {
  uint64_t *key;
  uint32_t *id, n;
};

static bool prio_less(const struct prio_heap *h, uint32_t a, uint32_t b) {
  return h->key[a] != h->key[b] ? h->key[a] < h->key[b] : h->id[a] < h->id[b];
}

static void prio_swap(struct prio_heap *h, uint32_t a, uint32_t b) {
  uint64_t k = h->key[a];
  uint32_t i = h->id[a];
  h->key[a] = h->key[b];
  h->id[a] = h->id[b];
  h->key[b] = k;
  h->id[b] = i;
}

static void prio_push(struct prio_heap *h, uint64_t key, uint32_t id) {
  uint32_t i = h->n++;
  h->key[i] = key;
  h->id[i] = id;
  while (i > 0 && prio_less(h, i, (i - 1) / 2)) {
    prio_swap(h, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
}

static uint32_t prio_pop(struct prio_heap *h) {
  uint32_t top = h->id[0], i = 0;
  h->n--;
  if (h->n) {
    h->key[0] = h->key[h->n];
    h->id[0] = h->id[h->n];
  }
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && prio_less(h, l, m))
      m = l;
    if (r < h->n && prio_less(h, r, m))
      m = r;
    if (m == i)
      break;
    prio_swap(h, i, m);
    i = m;
  }
  return top;
}

static void run_positions(const struct ir_graph *g, const struct ir_adjacency *adj,
                          uint32_t *pos) {
  uint32_t nn = g->nodes->len, next = 0;
  uint32_t *indeg = g_new(uint32_t, nn ? nn : 1);
  struct prio_heap h = {g_new(uint64_t, nn ? nn : 1), g_new(uint32_t, nn ? nn : 1), 0};
  for (uint32_t v = 0; v < nn; v++) {
    indeg[v] = adj->in_first[v + 1] - adj->in_first[v];
    if (!indeg[v])
      prio_push(&h, IR_NODE(g, v)->priority, v);
  }
  while (h.n) {
    uint32_t v = prio_pop(&h);
    pos[v] = next++;
    for (uint32_t k = adj->out_first[v]; k < adj->out_first[v + 1]; k++) {
      uint32_t w = IR_EDGE(g, adj->out_edges[k])->dst;
      if (--indeg[w] == 0)
        prio_push(&h, IR_NODE(g, w)->priority, w);
    }
  }
  PIPER_ASSERT(next == nn); /* the graph was checked acyclic */
  g_free(indeg);
  g_free(h.key);
  g_free(h.id);
}

/* A rerun (recompute) waits for the compute right before its backward on its group: it would
 * otherwise run as soon as its forward is done whenever the device idles, and hold everything it
 * restores until its backward, undoing the saving. The place is taken from the backward's run
 * position, not the rerun's own: a rerun is ready once its forward is done, so its run position
 * drifts ahead of its backward by as many micro-batches as the backward waits on other stages
 * (DeepSeek-V3 on DualPipeV held 8 micro-batches' reruns, 30 GB). Other reruns are skipped: they
 * are held the same way. Edge u -> R only from a u run before every consumer of R (R's only
 * successors, so u cannot descend from R): no cycle. */
static bool is_rerun_a2a(const struct ir_graph *g, uint32_t c) {
  return IR_NODE(g, c)->kind == IR_NODE_ALL_TO_ALL && IR_NODE(g, c)->pass == IR_PASS_R;
}

/* first or c, whichever runs earlier, where c is a compute of the group */
static uint32_t earlier_compute(const struct ir_graph *g, const uint32_t *pos, uint32_t group,
                                uint32_t first, uint32_t c) {
  const struct ir_node *cn = IR_NODE(g, c);
  if (cn->kind == IR_NODE_COMPUTE && cn->pass != IR_PASS_R && cn->group == group &&
      (first == IR_NONE || pos[c] < pos[first]))
    return c;
  return first;
}

static void hold_rerun(struct ir_graph *g, const struct ir_adjacency *adj, const uint32_t *pos,
                       const GArray *seq, const uint32_t *seq_index, uint32_t r) {
  uint32_t min_pos = UINT32_MAX, first = IR_NONE;
  bool routes = false;
  for (uint32_t e = adj->out_first[r]; e < adj->out_first[r + 1]; e++) {
    uint32_t c = IR_EDGE(g, adj->out_edges[e])->dst;
    if (!is_rerun_a2a(g, c)) {
      if (pos[c] < min_pos)
        min_pos = pos[c];
      first = earlier_compute(g, pos, IR_NODE(g, r)->group, first, c);
      continue;
    }
    /* the rerun's own all-to-alls run right after it (they drift with it): the router's
     * rerun is held like the experts' rerun it feeds, by their backward. No cycle: a compute
     * that descends from them and is not a rerun descends from that backward. */
    routes = true; /* held one compute earlier: its dispatch overlaps that compute */
    for (uint32_t f = adj->out_first[c]; f < adj->out_first[c + 1]; f++) {
      uint32_t r1 = IR_EDGE(g, adj->out_edges[f])->dst;
      if (IR_NODE(g, r1)->kind != IR_NODE_COMPUTE || IR_NODE(g, r1)->pass != IR_PASS_R)
        continue;
      for (uint32_t b = adj->out_first[r1]; b < adj->out_first[r1 + 1]; b++) {
        uint32_t bn = IR_EDGE(g, adj->out_edges[b])->dst;
        if (is_rerun_a2a(g, bn))
          continue;
        if (pos[bn] < min_pos)
          min_pos = pos[bn];
        first = earlier_compute(g, pos, IR_NODE(g, r)->group, first, bn);
      }
    }
  }
  uint32_t k = first != IR_NONE ? seq_index[first] : seq_index[r], skip = routes ? 1 : 0;
  while (k > 0) {
    uint32_t u = g_array_index(seq, uint32_t, --k);
    if (u == r || IR_NODE(g, u)->pass == IR_PASS_R || (skip && skip--))
      continue;
    if (pos[u] < min_pos)
      ir_graph_add_edge(g, u, r, IR_EDGE_TEMPORAL, 0, 0);
    return;
  }
}

/* ZeRO-3 prefetching one segment ahead (ZeRO paper §5.3; FSDP's forward/backward prefetch):
 * the gather for a use starts once the compute two places before that use on the group has
 * finished, so it overlaps the compute right before the use, and is freed after the use. At
 * most the gather in use and the next one are alive, whatever the micro-batch count; without
 * the edge every gather is ready at the step's start and all of a step's gathers pile up.
 * The edge u -> gather only from a u topologically before every consumer: no cycle, nor among
 * the reruns' holds; but the two kinds together can close one (each placed by the same run
 * order, which the other's edges change: ZeRO-3 with recomputation on a V under DualPipeV,
 * or with experts over part of the replicas under 1F1B). gathers = false places the holds
 * only. True when it placed edges of both kinds (prefetch_and_hold checks those). */
static bool prefetch_gathers(struct apply *a, bool gathers) {
  struct ir_graph *g = a->g;
  uint32_t edges_before = g->edges->len, holds = 0;
  uint32_t nn = g->nodes->len, ng = g->groups->len;
  struct ir_adjacency adj;
  ir_adjacency_build(g, &adj);
  uint32_t *pos = g_new(uint32_t, nn ? nn : 1);
  run_positions(g, &adj, pos);
  GArray **seq = g_new0(GArray *, ng ? ng : 1);
  uint32_t *seq_index = g_new(uint32_t, nn ? nn : 1);
  bool any = false;
  for (uint32_t i = 0; i < nn; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    any |= (n->kind == IR_NODE_ALL_GATHER && n->pass != IR_PASS_NONE) ||
           (n->kind == IR_NODE_COMPUTE && n->pass == IR_PASS_R);
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    if (!seq[n->group])
      seq[n->group] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    g_array_append_val(seq[n->group], i);
  }
  for (uint32_t k = 0; k < ng && any; k++) {
    if (!seq[k])
      continue;
    run_pos = pos;
    qsort(seq[k]->data, seq[k]->len, sizeof(uint32_t), by_run_order);
    run_pos = NULL;
    for (uint32_t j = 0; j < seq[k]->len; j++)
      seq_index[g_array_index(seq[k], uint32_t, j)] = j;
  }
  for (uint32_t i = 0; i < nn && any; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_COMPUTE && n->pass == IR_PASS_R) {
      uint32_t before = g->edges->len;
      hold_rerun(g, &adj, pos, seq[n->group], seq_index, i);
      holds += g->edges->len - before;
      continue;
    }
    if (!gathers || n->kind != IR_NODE_ALL_GATHER || n->pass == IR_PASS_NONE || !seq[n->group])
      continue;
    /* a rerun's SP all-gather is no parameter gather: it follows its rerun, which hold_rerun
     * holds already (held again by its consumers it can wait on a backward that waits on the
     * expert-parallel rerun it feeds: a cycle) */
    if ((n->purpose == IR_COMM_TP && n->pass == IR_PASS_R) || n->purpose == IR_COMM_CP)
      continue; /* a cp all-gather is K/V, no parameter gather either */
    uint32_t first = UINT32_MAX, min_pos = UINT32_MAX;
    for (uint32_t e = adj.out_first[i]; e < adj.out_first[i + 1]; e++) {
      uint32_t c = IR_EDGE(g, adj.out_edges[e])->dst;
      if (IR_NODE(g, c)->kind != IR_NODE_COMPUTE || IR_NODE(g, c)->group != n->group)
        continue;
      if (seq_index[c] < first)
        first = seq_index[c];
      if (pos[c] < min_pos)
        min_pos = pos[c];
    }
    if (first == UINT32_MAX || first < 2)
      continue; /* the first two uses gather at the start */
    uint32_t u = g_array_index(seq[n->group], uint32_t, first - 2);
    if (pos[u] < min_pos)
      ir_graph_add_edge(g, u, i, IR_EDGE_TEMPORAL, 0, 0);
  }
  ir_adjacency_free(&adj);
  g_free(pos);
  for (uint32_t k = 0; k < ng; k++)
    if (seq[k])
      g_array_free(seq[k], TRUE);
  g_free(seq);
  g_free(seq_index);
  return holds > 0 && g->edges->len - edges_before > holds;
}

/* ZeRO-3's prefetch and the reruns' holds (prefetch_gathers); where together they close a
 * cycle, the holds alone: the gathers then start when ready (more memory, the same step), the
 * program compiles. Graphs without both kinds of edges pay no check. */
static void prefetch_and_hold(struct apply *a) {
  uint32_t edges_before = a->g->edges->len, stuck;
  if (!prefetch_gathers(a, true))
    return;
  struct ir_topo t;
  bool acyclic = ir_topo_init(&t, a->g, &stuck);
  ir_topo_free(&t);
  if (acyclic)
    return;
  g_array_set_size(a->g->edges, edges_before);
  prefetch_gathers(a, false);
}

/* The stream directives: each named stream's priority and SM share. */
static void apply_streams(const struct dir_program *p, struct ir_graph *g) {
  for (uint32_t d = 0; d < p->n; d++) {
    const struct dir_directive *dd = &p->d[d];
    if (dd->op != DIR_STREAM)
      continue;
    /* ir_graph_stream may append, and so move g->streams: take the index before the address. */
    uint32_t si = ir_graph_stream(g, dd->name);
    struct ir_stream *s = IR_STREAM(g, si);
    s->priority = (int32_t)dd->priority;
    s->sm_share = dd->sm_share;
  }
}

/* ordered[v]: node v is named by some order directive's slot (default_priorities leaves it). */
static bool mark_ordered(struct apply *a, struct tag_index *ix, bool *ordered,
                         GError **err) {
  const struct dir_program *p = a->p;
  for (uint32_t d = 0; d < p->n; d++) {
    const struct dir_directive *dd = &p->d[d];
    if (dd->op != DIR_ORDER)
      continue;
    for (uint32_t fi = 0; fi < dd->slot_first[dd->n_slots]; fi++) {
      struct ir_filter f;
      if (!resolve(a, d, &dd->filters[fi], &f, err))
        return false;
      GArray *m = match_indexed(a, ix, &f);
      for (uint32_t j = 0; j < m->len; j++)
        ordered[g_array_index(m, uint32_t, j)] = true;
      g_array_free(m, TRUE);
    }
  }
  return true;
}

/* ---- driver ------------------------------------------------------------------------------ */

bool dir_program_apply(const struct dir_program *p, struct ir_graph *g, uint32_t n_devices_limit,
                       GError **err) {
  struct apply a = {
      .p = p, .g = g, .limit = n_devices_limit ? n_devices_limit : IR_MAX_DEVICES, .split_tag = -1};
  a.info = g_array_new(FALSE, FALSE, sizeof(struct node_info));
  struct node_info none = {IR_NONE, IR_NONE, IR_NONE, IR_NONE, IR_NONE};
  for (uint32_t i = 0; i < g->nodes->len; i++)
    g_array_append_val(a.info, none);
  bool ok = false;
  struct ir_topo topo;
  bool have_topo = false;
  bool *ordered = NULL;
  struct tag_index ix = {NULL};

  for (uint32_t d = 0; d < p->n; d++)
    if (p->d[d].op == DIR_SPLIT && !apply_split(&a, d, err))
      goto out;
  if (!apply_bi_bw_split(&a, err))
    goto out;
  for (uint32_t d = 0; d < p->n; d++)
    if (p->d[d].op == DIR_PLACE && !apply_placement(&a, d, err))
      goto out;
  for (uint32_t d = 0; d < p->n; d++)
    if ((p->d[d].op == DIR_REPLICATE || p->d[d].op == DIR_SHARD) && !apply_placement(&a, d, err))
      goto out;
  if (!dir_tp_apply(p, g, err) || !check_expert_split(&a, err) || !carve_experts(&a, err) ||
      !dir_cp_apply(p, g, err))
    goto out;
  apply_streams(p, g);
  for (uint32_t d = 0; d < p->n; d++)
    if (p->d[d].op == DIR_RECOMPUTE && !apply_recompute(&a, d, err))
      goto out;
  if (!check_expert_recompute(&a, err))
    goto out;
  if (!check_all_placed(&a, err) || !check_contiguous(&a, n_devices_limit, err) ||
      !check_group_use(&a, err))
    goto out;
  {
    struct segment_home *home = g_new(struct segment_home, g->model->n_segments);
    bool homes_ok = segment_homes(&a, home, err) && insert_data_parallel(&a, home, err);
    g_free(home);
    if (!homes_ok)
      goto out;
  }
  dir_tp_fix_data_parallel(g);
  insert_gathers(&a);
  insert_all_to_all(&a);
  dir_tp_insert_comm(g);
  if (!insert_send_recv(&a, err))
    goto out;
  ir_graph_compact(g);

  uint32_t stuck;
  have_topo = true;
  if (!ir_topo_init(&topo, g, &stuck)) {
    char *nm = node_name(g, stuck);
    fail_at(&a, IR_NONE, err, "the program creates a cycle at \"%s\"", nm);
    g_free(nm);
    goto out;
  }
  sort_pos = topo.pos;
  tag_index_build(g, &ix);
  for (uint32_t d = 0; d < p->n; d++) {
    if (p->d[d].op != DIR_ORDER)
      continue;
    if (!apply_order(&a, d, &ix, &topo, err))
      goto out;
  }
  ordered = g_new0(bool, g->nodes->len);
  if (!mark_ordered(&a, &ix, ordered, err))
    goto out;
  default_priorities(&a, ordered);
  recompute_priorities(&a);
  prefetch_and_hold(&a);
  /* last: a K/V exchange starts with its compute (the same waits, order slots included) and its
   * consumers wait for both; send / recv are in, so its edges stay inside a device group */
  dir_cp_insert_comm(g);
  if (g->n_devices > a.limit) {
    fail_at(&a, IR_NONE, err, "the program uses %u devices but the run has %u", g->n_devices,
            a.limit);
    goto out;
  }
  ok = true;
out:
  tag_index_free(&ix);
  sort_pos = NULL;
  g_free(ordered);
  if (have_topo)
    ir_topo_free(&topo);
  g_array_free(a.info, TRUE);
  return ok;
}
