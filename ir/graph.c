/* ir: graph construction, interning of groups and streams, adjacency, filters and names. */
#include <string.h>

#include "ir.h"

static guint group_key_hash(gconstpointer key) {
  const GArray *a = key;
  guint h = 2166136261u;
  for (guint i = 0; i < a->len; i++)
    h = (h ^ g_array_index(a, uint32_t, i)) * 16777619u;
  return h;
}

static gboolean group_key_equal(gconstpointer x, gconstpointer y) {
  const GArray *a = x, *b = y;
  return a->len == b->len && memcmp(a->data, b->data, a->len * sizeof(uint32_t)) == 0;
}

static void group_key_free(gpointer p) {
  g_array_free(p, TRUE);
}

static struct ir_graph *graph_new(const struct model *m) {
  struct ir_graph *g = g_new0(struct ir_graph, 1);
  g->model = m;
  g->nodes = g_array_new(FALSE, TRUE, sizeof(struct ir_node));
  g->edges = g_array_new(FALSE, TRUE, sizeof(struct ir_edge));
  g->groups = g_array_new(FALSE, TRUE, sizeof(struct ir_group));
  g->device_pool = g_array_new(FALSE, TRUE, sizeof(uint32_t));
  g->group_index = g_hash_table_new_full(group_key_hash, group_key_equal, group_key_free, NULL);
  g->streams = g_array_new(FALSE, TRUE, sizeof(struct ir_stream));
  g->segsets = g_array_new(FALSE, TRUE, sizeof(struct ir_segset));
  g->segment_pool = g_array_new(FALSE, TRUE, sizeof(uint32_t));
  g->n_microbatches = 1;
  g->n_tags = m->n_tags;
  for (uint32_t t = 0; t < m->n_tags; t++)
    memcpy(g->tag_names[t], m->tag_names[t], MODEL_TAG_NAME_MAX);
  ir_graph_stream(g, "compute");
  uint32_t dev0 = 0;
  ir_graph_group(g, &dev0, 1);
  return g;
}

void ir_graph_free(struct ir_graph *g) {
  if (!g)
    return;
  g_array_free(g->nodes, TRUE);
  g_array_free(g->edges, TRUE);
  g_array_free(g->groups, TRUE);
  g_array_free(g->device_pool, TRUE);
  g_hash_table_destroy(g->group_index);
  g_array_free(g->streams, TRUE);
  g_array_free(g->segsets, TRUE);
  g_array_free(g->segment_pool, TRUE);
  g_free(g->segment_tp);
  g_free(g);
}

uint32_t ir_graph_add_node(struct ir_graph *g, const struct ir_node *n) {
  g_array_append_val(g->nodes, *n);
  return g->nodes->len - 1;
}

uint32_t ir_graph_add_edge(struct ir_graph *g, uint32_t src, uint32_t dst, enum ir_edge_kind kind,
                           uint32_t slot, uint64_t bytes) {
  PIPER_ASSERT(src < g->nodes->len && dst < g->nodes->len && src != dst);
  struct ir_edge e = {.src = src, .dst = dst, .kind = kind, .slot = slot, .bytes = bytes};
  g_array_append_val(g->edges, e);
  return g->edges->len - 1;
}

uint32_t ir_graph_group(struct ir_graph *g, const uint32_t *devices, uint32_t count) {
  PIPER_ASSERT(count > 0);
  GArray *key = g_array_sized_new(FALSE, FALSE, sizeof(uint32_t), count);
  g_array_append_vals(key, devices, count);
  gpointer found = g_hash_table_lookup(g->group_index, key);
  if (found) {
    g_array_free(key, TRUE);
    return GPOINTER_TO_UINT(found) - 1;
  }
  struct ir_group grp = {.first = g->device_pool->len, .count = count};
  g_array_append_vals(g->device_pool, devices, count);
  g_array_append_val(g->groups, grp);
  uint32_t id = g->groups->len - 1;
  g_hash_table_insert(g->group_index, key, GUINT_TO_POINTER(id + 1));
  for (uint32_t i = 0; i < count; i++)
    if (devices[i] + 1 > g->n_devices)
      g->n_devices = devices[i] + 1;
  return id;
}

int ir_group_position(const struct ir_graph *g, uint32_t group, uint32_t device) {
  const struct ir_group *grp = IR_GROUP(g, group);
  const uint32_t *d = IR_GROUP_DEVICES(g, group);
  for (uint32_t i = 0; i < grp->count; i++)
    if (d[i] == device)
      return (int)i;
  return -1;
}

uint32_t ir_graph_stream(struct ir_graph *g, const char *name) {
  for (uint32_t i = 0; i < g->streams->len; i++)
    if (strcmp(IR_STREAM(g, i)->name, name) == 0)
      return i;
  struct ir_stream s = {.priority = 0, .sm_share = 1.0};
  g_strlcpy(s.name, name, sizeof s.name);
  g_array_append_val(g->streams, s);
  return g->streams->len - 1;
}

int ir_graph_tag(struct ir_graph *g, const char *name, bool add) {
  for (uint32_t t = 0; t < g->n_tags; t++)
    if (strcmp(g->tag_names[t], name) == 0)
      return (int)t;
  if (!add || g->n_tags >= IR_MAX_TAGS)
    return -1;
  g_strlcpy(g->tag_names[g->n_tags], name, MODEL_TAG_NAME_MAX);
  return (int)g->n_tags++;
}

uint32_t ir_graph_add_segset(struct ir_graph *g, const uint32_t *segments, uint32_t count,
                             const uint32_t *shard_degree) {
  struct ir_segset s = {.first = g->segment_pool->len, .count = count, .param_bytes = 0};
  g_array_append_vals(g->segment_pool, segments, count);
  for (uint32_t i = 0; i < count; i++) {
    uint32_t deg = shard_degree ? shard_degree[i] : 1;
    uint32_t tp = g->segment_tp ? g->segment_tp[segments[i]] : 0;
    uint64_t pb = tp > 1 ? ir_tp_segment_param_bytes(g->model, segments[i], tp)
                         : g->model->segments[segments[i]].param_bytes;
    s.param_bytes += pb / (deg ? deg : 1);
  }
  g_array_append_val(g->segsets, s);
  return g->segsets->len - 1;
}

static struct ir_node node_template(void) {
  struct ir_node n;
  memset(&n, 0, sizeof n);
  for (int t = 0; t < IR_MAX_TAGS; t++)
    n.tags[t] = -1;
  n.pass = IR_PASS_NONE;
  n.purpose = IR_COMM_NONE;
  n.segment = IR_NONE;
  n.group = 0;
  n.peer_group = IR_NONE;
  n.stream = 0;
  n.pair = IR_NONE;
  n.segset = IR_NONE;
  n.shard_degree = 1;
  n.replica_degree = 1;
  n.directive = IR_NONE;
  return n;
}

struct ir_graph *ir_graph_build(const struct model *m) {
  struct ir_graph *g = graph_new(m);
  uint32_t ns = m->n_segments;
  /* Forward nodes are 0..ns-1 and backward nodes ns..2ns-1, in model order. */
  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t s = 0; s < ns; s++) {
      struct ir_node n = node_template();
      n.kind = IR_NODE_COMPUTE;
      n.pass = pass == 0 ? IR_PASS_F : IR_PASS_B;
      n.segment = s;
      for (uint32_t t = 0; t < m->n_tags; t++)
        n.tags[t] = m->segments[s].tags[t];
      ir_graph_add_node(g, &n);
    }
  }
  /* Output slots: 1 = activations saved for backward; 2 + k = the k-th distinct tensor a
   * segment sends on (one per model edge out of it), so a tensor is (producer, slot). */
  uint32_t *next_slot = g_new0(uint32_t, ns);
  for (uint32_t e = 0; e < m->n_edges; e++) {
    const struct model_edge *me = &m->edges[e];
    uint32_t fwd_slot = 2 + next_slot[me->src]++;
    uint32_t bwd_slot = 2 + next_slot[me->dst]++;
    ir_graph_add_edge(g, me->src, me->dst, IR_EDGE_DATA, fwd_slot, me->bytes);
    ir_graph_add_edge(g, ns + me->dst, ns + me->src, IR_EDGE_DATA, bwd_slot, me->bytes);
  }
  g_free(next_slot);
  for (uint32_t s = 0; s < ns; s++)
    ir_graph_add_edge(g, s, ns + s, IR_EDGE_DATA, 1, m->segments[s].saved_bytes);
  /* One optimizer update per PP region, after every backward of the region. */
  for (int32_t r = 0; r < m->pp_regions; r++) {
    GArray *segs = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    for (uint32_t s = 0; s < ns; s++)
      if (m->segments[s].tags[MODEL_TAG_PP] == r && m->segments[s].param_count > 0)
        g_array_append_val(segs, s);
    struct ir_node n = node_template();
    n.kind = IR_NODE_OPTIMIZER;
    n.tags[MODEL_TAG_PP] = r;
    n.segset = ir_graph_add_segset(g, (uint32_t *)segs->data, segs->len, NULL);
    uint32_t id = ir_graph_add_node(g, &n);
    for (uint32_t i = 0; i < segs->len; i++)
      ir_graph_add_edge(g, ns + g_array_index(segs, uint32_t, i), id, IR_EDGE_TEMPORAL, 0, 0);
    g_array_free(segs, TRUE);
  }
  return g;
}

void ir_graph_compact(struct ir_graph *g) {
  uint32_t w = 0;
  for (uint32_t i = 0; i < g->edges->len; i++) {
    struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    if (w != i)
      *IR_EDGE(g, w) = *e;
    w++;
  }
  g_array_set_size(g->edges, w);
}

void ir_adjacency_build(const struct ir_graph *g, struct ir_adjacency *adj) {
  uint32_t nn = g->nodes->len, ne = g->edges->len;
  adj->out_first = g_new0(uint32_t, nn + 1);
  adj->in_first = g_new0(uint32_t, nn + 1);
  adj->out_edges = g_new(uint32_t, ne ? ne : 1);
  adj->in_edges = g_new(uint32_t, ne ? ne : 1);
  for (uint32_t i = 0; i < ne; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    adj->out_first[e->src + 1]++;
    adj->in_first[e->dst + 1]++;
  }
  for (uint32_t v = 0; v < nn; v++) {
    adj->out_first[v + 1] += adj->out_first[v];
    adj->in_first[v + 1] += adj->in_first[v];
  }
  uint32_t *op = g_new(uint32_t, nn + 1), *ip = g_new(uint32_t, nn + 1);
  memcpy(op, adj->out_first, (nn + 1) * sizeof *op);
  memcpy(ip, adj->in_first, (nn + 1) * sizeof *ip);
  /* Edges keep their creation order inside each list, so walks are deterministic. */
  for (uint32_t i = 0; i < ne; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    adj->out_edges[op[e->src]++] = i;
    adj->in_edges[ip[e->dst]++] = i;
  }
  g_free(op);
  g_free(ip);
}

void ir_adjacency_free(struct ir_adjacency *adj) {
  if (!adj)
    return;
  g_free(adj->out_first);
  g_free(adj->out_edges);
  g_free(adj->in_first);
  g_free(adj->in_edges);
  memset(adj, 0, sizeof *adj);
}

bool ir_filter_match(const struct ir_filter *f, const struct ir_node *n) {
  if (f->pass != IR_PASS_NONE) {
    if (n->pass == IR_PASS_NONE)
      return false;
    bool backward = n->pass == IR_PASS_B || n->pass == IR_PASS_BI || n->pass == IR_PASS_BW;
    if (f->pass == IR_PASS_B ? !backward : f->pass != n->pass)
      return false;
  }
  for (int t = 0; t < IR_MAX_TAGS; t++) {
    int32_t want = f->tags[t];
    if (want == IR_FILTER_UNSET)
      continue;
    if (n->tags[t] < 0)
      return false;
    if (want != IR_FILTER_ANY && n->tags[t] != want)
      return false;
  }
  return true;
}

const char *ir_pass_name(enum ir_pass p) {
  static const char *names[] = {"F", "B", "BI", "BW", "R", "-"};
  return (unsigned)p <= IR_PASS_NONE ? names[p] : "?";
}

const char *ir_node_kind_name(enum ir_node_kind k) {
  static const char *names[] = {"compute",        "send",       "recv",       "all_reduce",
                                "reduce_scatter", "all_gather", "all_to_all", "optimizer"};
  return (unsigned)k < IR_NODE_KIND_COUNT ? names[k] : "?";
}

void ir_node_format_name(const struct ir_node *n, uint32_t n_tags,
                         const char (*tag_names)[MODEL_TAG_NAME_MAX], char *buf, size_t len) {
  GString *s = g_string_sized_new(64);
  if (n->kind == IR_NODE_COMPUTE)
    g_string_append(s, ir_pass_name(n->pass));
  else if (n->kind == IR_NODE_OPTIMIZER)
    g_string_append(s, "optimizer");
  else
    g_string_append_printf(s, "%s %s", ir_node_kind_name(n->kind), ir_pass_name(n->pass));
  /* Two segments may carry the same tags (the non-expert runs before and after an expert
   * region), so the segment index keeps names unique. */
  if (n->segment != IR_NONE)
    g_string_append_printf(s, " s%u", n->segment);
  for (uint32_t t = 0; t < n_tags && t < IR_MAX_TAGS; t++)
    if (n->tags[t] >= 0)
      g_string_append_printf(s, " %s=%d", tag_names[t], n->tags[t]);
  if (n->kind == IR_NODE_SEND)
    g_string_append_printf(s, " ->g%u", n->peer_group);
  if (n->kind == IR_NODE_RECV)
    g_string_append_printf(s, " <-g%u", n->peer_group);
  if (n->segset != IR_NONE && n->kind != IR_NODE_OPTIMIZER)
    g_string_append_printf(s, " set=%u", n->segset);
  if (n->kind != IR_NODE_COMPUTE)
    g_string_append_printf(s, " @g%u", n->group);
  g_strlcpy(buf, s->str, len);
  g_string_free(s, TRUE);
}

void ir_node_name(const struct ir_graph *g, uint32_t node, char *buf, size_t len) {
  ir_node_format_name(IR_NODE(g, node), g->n_tags, (const char(*)[MODEL_TAG_NAME_MAX])g->tag_names,
                      buf, len);
}
