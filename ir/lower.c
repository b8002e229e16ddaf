/* plan: lowering the rewritten IR to per-device plans.
 *
 * One global issue order is fixed first: Kahn's algorithm over the whole graph, taking the
 * ready node of lowest priority (then lowest id), and emitting each recv right after its send.
 * Every device's streams run the projection of that order, so executing the whole step in
 * that order one instruction at a time is always possible: each send meets its recv at once,
 * and a collective is one node for all members. The projection is therefore deadlock-free by
 * construction; plan_check_progress proves it again on the lowered plans (and on plans read
 * from disk). Devices with the same group memberships get one shared program (a class). */
#include <string.h>

#include "../base/json.h"
#include "plan.h"

/* ---- global order ------------------------------------------------------------------------ */

struct heap_item {
  uint64_t prio;
  uint32_t node;
};

struct heap {
  struct heap_item *v;
  uint32_t n, cap;
};

static bool item_less(struct heap_item a, struct heap_item b) {
  return a.prio < b.prio || (a.prio == b.prio && a.node < b.node);
}

static void heap_push(struct heap *h, struct heap_item it) {
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 1024;
    h->v = g_renew(struct heap_item, h->v, h->cap);
  }
  uint32_t i = h->n++;
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!item_less(it, h->v[parent]))
      break;
    h->v[i] = h->v[parent];
    i = parent;
  }
  h->v[i] = it;
}

static struct heap_item heap_pop(struct heap *h) {
  struct heap_item top = h->v[0], last = h->v[--h->n];
  uint32_t i = 0;
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= h->n)
      break;
    if (c + 1 < h->n && item_less(h->v[c + 1], h->v[c]))
      c++;
    if (!item_less(h->v[c], last))
      break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n)
    h->v[i] = last;
  return top;
}

/* Fills order[] (node ids in issue order); false if the graph has a cycle. */
static bool global_order(const struct ir_graph *g, const struct ir_adjacency *adj,
                         uint32_t *order) {
  uint32_t nn = g->nodes->len;
  uint32_t *indeg = g_new(uint32_t, nn);
  uint64_t *eprio = g_new0(uint64_t, nn);
  struct heap h = {0};
  for (uint32_t v = 0; v < nn; v++) {
    indeg[v] = adj->in_first[v + 1] - adj->in_first[v];
    const struct ir_node *n = IR_NODE(g, v);
    eprio[v] = n->kind == IR_NODE_COMPUTE ? n->priority : 0;
    if (!indeg[v])
      heap_push(&h, (struct heap_item){eprio[v], v});
  }
  uint32_t emitted = 0;
  while (h.n) {
    uint32_t stack[2], depth = 0;
    stack[depth++] = heap_pop(&h).node;
    while (depth) {
      uint32_t v = stack[--depth];
      order[emitted++] = v;
      const struct ir_node *n = IR_NODE(g, v);
      for (uint32_t k = adj->out_first[v]; k < adj->out_first[v + 1]; k++) {
        uint32_t w = IR_EDGE(g, adj->out_edges[k])->dst;
        const struct ir_node *wn = IR_NODE(g, w);
        /* Communication inherits the priority of what it serves. */
        if (wn->kind != IR_NODE_COMPUTE && eprio[v] > eprio[w])
          eprio[w] = eprio[v];
        if (--indeg[w] == 0) {
          if (n->kind == IR_NODE_SEND && w == n->pair)
            stack[depth++] = w; /* a recv goes right after its send */
          else
            heap_push(&h, (struct heap_item){eprio[w], w});
        }
      }
    }
  }
  g_free(h.v);
  g_free(eprio);
  g_free(indeg);
  return emitted == nn;
}

/* ---- classes ----------------------------------------------------------------------------- */

struct lower {
  const struct ir_graph *g;
  struct plan *p;
  struct ir_adjacency adj;
  uint32_t *order, *order_pos;
  GArray **group_nodes;   /* per group: node ids in issue order */
  GHashTable *comm_index; /* packed (purpose, group, peer) -> comm id + 1 */
  GArray *comms;
};

static uint32_t comm_of(struct lower *l, const struct ir_node *n) {
  struct plan_comm c = {.purpose = n->purpose, .group = n->group, .peer_group = IR_NONE};
  if (n->kind == IR_NODE_SEND)
    c.peer_group = n->peer_group;
  if (n->kind == IR_NODE_RECV) {
    c.group = n->peer_group;
    c.peer_group = n->group;
  }
  char key[64];
  g_snprintf(key, sizeof key, "%d:%u:%u", c.purpose, c.group, c.peer_group);
  gpointer found = g_hash_table_lookup(l->comm_index, key);
  if (found)
    return GPOINTER_TO_UINT(found) - 1;
  g_array_append_val(l->comms, c);
  g_hash_table_insert(l->comm_index, g_strdup(key), GUINT_TO_POINTER(l->comms->len));
  return l->comms->len - 1;
}

static gint compare_u32(gconstpointer x, gconstpointer y) {
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  return a < b ? -1 : a > b;
}

static int compare_pair(const void *x, const void *y) {
  const uint32_t *a = x, *b = y;
  if (a[0] != b[0])
    return a[0] < b[0] ? -1 : 1;
  return a[1] < b[1] ? -1 : a[1] > b[1];
}

/* Builds the program of one class, whose devices belong to exactly `groups`. */
static void build_class(struct lower *l, struct plan_class *c, const uint32_t *groups,
                        uint32_t n_groups, uint32_t *instr_of, uint32_t *comm_seq) {
  const struct ir_graph *g = l->g;
  uint32_t n_streams = l->p->n_streams;
  GArray *positions = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t k = 0; k < n_groups; k++) {
    GArray *gn = l->group_nodes[groups[k]];
    for (uint32_t j = 0; j < gn->len; j++) {
      uint32_t pos = l->order_pos[g_array_index(gn, uint32_t, j)];
      g_array_append_val(positions, pos);
    }
  }
  g_array_sort(positions, compare_u32);
  c->n_instrs = positions->len;
  c->instrs = g_new0(struct plan_instr, c->n_instrs ? c->n_instrs : 1);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    uint32_t node = l->order[g_array_index(positions, uint32_t, i)];
    instr_of[node] = i;
    c->instrs[i].node = node;
    c->instrs[i].stream = IR_NODE(g, node)->stream;
    c->instrs[i].comm = IR_NONE;
  }
  g_array_free(positions, TRUE);

  /* Streams: instruction lists by stream, in issue order. */
  c->stream_first = g_new0(uint32_t, n_streams + 1);
  for (uint32_t i = 0; i < c->n_instrs; i++)
    c->stream_first[c->instrs[i].stream + 1]++;
  for (uint32_t s = 0; s < n_streams; s++)
    c->stream_first[s + 1] += c->stream_first[s];
  c->stream_instrs = g_new(uint32_t, c->n_instrs ? c->n_instrs : 1);
  uint32_t *fill = g_memdup2(c->stream_first, (n_streams + 1) * sizeof(uint32_t));
  for (uint32_t i = 0; i < c->n_instrs; i++)
    c->stream_instrs[fill[c->instrs[i].stream]++] = i;
  g_free(fill);

  /* Communicators and sequence numbers. */
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = IR_NODE(g, c->instrs[i].node);
    if (n->purpose == IR_COMM_NONE)
      continue;
    uint32_t comm = comm_of(l, n);
    c->instrs[i].comm = comm;
    /* A device in both groups of a PP communicator sends and receives on it: the two sides
     * count separately, as the two ends of each pair do. */
    c->instrs[i].seq = comm_seq[2 * comm + (n->kind == IR_NODE_RECV)]++;
  }

  /* Waits (cross-stream, latest per stream), tensors, reads and writes. */
  GArray *waits = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GArray *reads = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GArray *writes = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GArray *consumers = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GArray *tensors = g_array_new(FALSE, FALSE, sizeof(struct plan_tensor));
  uint32_t *latest = g_new(uint32_t, n_streams);
  GArray *tensor_reads = g_array_new(FALSE, FALSE, sizeof(uint32_t) * 2); /* (reader, tensor) */
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    uint32_t x = c->instrs[i].node;
    const struct ir_node *xn = IR_NODE(g, x);
    for (uint32_t s = 0; s < n_streams; s++)
      latest[s] = IR_NONE;
    for (uint32_t k = l->adj.in_first[x]; k < l->adj.in_first[x + 1]; k++) {
      const struct ir_edge *e = IR_EDGE(g, l->adj.in_edges[k]);
      uint32_t u = e->src;
      if (instr_of[u] == IR_NONE)
        continue;
      if (xn->kind == IR_NODE_RECV && u == xn->pair)
        continue; /* rendezvous, not a wait */
      uint32_t ui = instr_of[u], us = c->instrs[ui].stream;
      if (us == c->instrs[i].stream)
        continue; /* stream order already implies it */
      if (latest[us] == IR_NONE || ui > latest[us])
        latest[us] = ui;
    }
    c->instrs[i].wait_first = waits->len;
    for (uint32_t s = 0; s < n_streams; s++)
      if (latest[s] != IR_NONE)
        g_array_append_val(waits, latest[s]);
    c->instrs[i].wait_count = waits->len - c->instrs[i].wait_first;

    /* Tensors written: one per distinct output slot with a local consumer. */
    c->instrs[i].write_first = writes->len;
    for (uint32_t k = l->adj.out_first[x]; k < l->adj.out_first[x + 1]; k++) {
      const struct ir_edge *e = IR_EDGE(g, l->adj.out_edges[k]);
      if (e->kind != IR_EDGE_DATA || instr_of[e->dst] == IR_NONE)
        continue;
      if (xn->kind == IR_NODE_SEND && e->dst == xn->pair)
        continue;
      uint32_t t = IR_NONE;
      for (uint32_t w = c->instrs[i].write_first; w < writes->len; w++) {
        uint32_t cand = g_array_index(writes, uint32_t, w);
        if (g_array_index(tensors, struct plan_tensor, cand).consumer_first == e->slot) {
          t = cand;
          break;
        }
      }
      if (t == IR_NONE) {
        /* consumer_first holds the slot until consumers are laid out below. */
        struct plan_tensor pt = {.bytes = e->bytes,
                                 .producer = i,
                                 .kind = e->slot == 1 ? PLAN_TENSOR_SAVED : PLAN_TENSOR_OUT,
                                 .consumer_first = e->slot,
                                 .consumer_count = 0};
        g_array_append_val(tensors, pt);
        t = tensors->len - 1;
        g_array_append_val(writes, t);
      }
      struct plan_tensor *pt = &g_array_index(tensors, struct plan_tensor, t);
      if (e->bytes > pt->bytes)
        pt->bytes = e->bytes;
      uint32_t pair[2] = {instr_of[e->dst], t};
      g_array_append_vals(tensor_reads, pair, 1);
    }
    c->instrs[i].write_count = writes->len - c->instrs[i].write_first;
  }
  g_free(latest);

  /* Consumers and reads, deduplicated, in reader order. */
  uint32_t n_pairs = tensor_reads->len;
  uint32_t(*pairs)[2] = (uint32_t(*)[2])tensor_reads->data;
  /* Sort (reader, tensor) pairs so reads come out grouped by reader. */
  qsort(pairs, n_pairs, sizeof pairs[0], compare_pair);
  for (uint32_t t = 0; t < tensors->len; t++)
    g_array_index(tensors, struct plan_tensor, t).consumer_count = 0;
  uint32_t prev_r = IR_NONE, prev_t = IR_NONE;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    c->instrs[i].read_first = c->instrs[i].read_count = 0;
  for (uint32_t k = 0; k < n_pairs; k++) {
    uint32_t r = pairs[k][0], t = pairs[k][1];
    if (r == prev_r && t == prev_t)
      continue;
    if (r != prev_r)
      c->instrs[r].read_first = reads->len;
    g_array_append_val(reads, t);
    c->instrs[r].read_count++;
    g_array_index(tensors, struct plan_tensor, t).consumer_count++;
    prev_r = r;
    prev_t = t;
  }
  uint32_t acc = 0;
  for (uint32_t t = 0; t < tensors->len; t++) {
    struct plan_tensor *pt = &g_array_index(tensors, struct plan_tensor, t);
    pt->consumer_first = acc;
    acc += pt->consumer_count;
    pt->consumer_count = 0;
  }
  g_array_set_size(consumers, acc);
  for (uint32_t i = 0; i < c->n_instrs; i++)
    for (uint32_t k = 0; k < c->instrs[i].read_count; k++) {
      uint32_t t = g_array_index(reads, uint32_t, c->instrs[i].read_first + k);
      struct plan_tensor *pt = &g_array_index(tensors, struct plan_tensor, t);
      g_array_index(consumers, uint32_t, pt->consumer_first + pt->consumer_count++) = i;
    }
  g_array_free(tensor_reads, TRUE);

  c->n_waits = waits->len;
  c->waits = (uint32_t *)g_array_free(waits, FALSE);
  c->n_reads = reads->len;
  c->reads = (uint32_t *)g_array_free(reads, FALSE);
  c->n_writes = writes->len;
  c->writes = (uint32_t *)g_array_free(writes, FALSE);
  c->n_consumers = consumers->len;
  c->consumers = (uint32_t *)g_array_free(consumers, FALSE);
  c->n_tensors = tensors->len;
  c->tensors = (struct plan_tensor *)g_array_free(tensors, FALSE);

  for (uint32_t i = 0; i < c->n_instrs; i++)
    instr_of[c->instrs[i].node] = IR_NONE;
}

/* ---- driver ------------------------------------------------------------------------------ */

static void copy_tables(struct plan *p, const struct ir_graph *g) {
  p->n_devices = g->n_devices;
  p->n_microbatches = g->n_microbatches;
  p->n_tags = g->n_tags;
  memcpy(p->tag_names, g->tag_names, sizeof p->tag_names);
  p->n_nodes = g->nodes->len;
  p->nodes = g_memdup2(g->nodes->data, sizeof(struct ir_node) * (p->n_nodes ? p->n_nodes : 1));
  p->n_groups = g->groups->len;
  p->groups = g_memdup2(g->groups->data, sizeof(struct ir_group) * p->n_groups);
  p->n_device_pool = g->device_pool->len;
  p->device_pool = g_memdup2(g->device_pool->data, sizeof(uint32_t) * p->n_device_pool);
  p->n_segsets = g->segsets->len;
  p->segsets =
      g_memdup2(g->segsets->data, sizeof(struct ir_segset) * (p->n_segsets ? p->n_segsets : 1));
  p->n_segment_pool = g->segment_pool->len;
  p->segment_pool = g_memdup2(g->segment_pool->data,
                              sizeof(uint32_t) * (p->n_segment_pool ? p->n_segment_pool : 1));
  p->n_streams = g->streams->len;
  p->streams = g_memdup2(g->streams->data, sizeof(struct ir_stream) * p->n_streams);
}

struct plan *plan_lower(const struct ir_graph *g, const char *program_json, GError **err) {
  struct plan *p = g_new0(struct plan, 1);
  struct lower l = {.g = g, .p = p};
  uint32_t nn = g->nodes->len;
  uint32_t *instr_of = NULL, *comm_seq = NULL;
  GArray **dev_groups = NULL;
  bool ok = false;

  cJSON *mj = model_to_json(g->model);
  p->model_json = cJSON_PrintUnformatted(mj);
  cJSON_Delete(mj);
  mj = cJSON_Parse(p->model_json);
  p->model = model_load_json(g->model->name, mj, 0, err);
  cJSON_Delete(mj);
  if (!p->model)
    goto out;
  p->program_json = program_json ? g_strdup(program_json) : NULL;
  copy_tables(p, g);

  ir_adjacency_build(g, &l.adj);
  l.order = g_new(uint32_t, nn ? nn : 1);
  l.order_pos = g_new(uint32_t, nn ? nn : 1);
  if (!global_order(g, &l.adj, l.order)) {
    piper_input_error(err, "the training graph has a cycle");
    goto out;
  }
  for (uint32_t i = 0; i < nn; i++)
    l.order_pos[l.order[i]] = i;
  l.group_nodes = g_new(GArray *, p->n_groups);
  for (uint32_t k = 0; k < p->n_groups; k++)
    l.group_nodes[k] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t i = 0; i < nn; i++) {
    uint32_t v = l.order[i];
    g_array_append_val(l.group_nodes[IR_NODE(g, v)->group], v);
  }

  /* Group memberships per device; equal memberships share a class. */
  dev_groups = g_new(GArray *, p->n_devices);
  for (uint32_t d = 0; d < p->n_devices; d++)
    dev_groups[d] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t k = 0; k < p->n_groups; k++) {
    if (l.group_nodes[k]->len == 0)
      continue; /* a group no node uses does not shape a program */
    const struct ir_group *grp = &p->groups[k];
    for (uint32_t j = 0; j < grp->count; j++)
      g_array_append_val(dev_groups[p->device_pool[grp->first + j]], k);
  }
  GHashTable *class_of = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  p->device_class = g_new(uint32_t, p->n_devices ? p->n_devices : 1);
  GArray *class_members = g_array_new(FALSE, FALSE, sizeof(GArray *));
  for (uint32_t d = 0; d < p->n_devices; d++) {
    GString *key = g_string_new(NULL);
    for (uint32_t j = 0; j < dev_groups[d]->len; j++)
      g_string_append_printf(key, "%u,", g_array_index(dev_groups[d], uint32_t, j));
    gpointer found = g_hash_table_lookup(class_of, key->str);
    uint32_t c;
    if (found) {
      c = GPOINTER_TO_UINT(found) - 1;
      g_string_free(key, TRUE);
    } else {
      c = class_members->len;
      GArray *m = g_array_new(FALSE, FALSE, sizeof(uint32_t));
      g_array_append_val(class_members, m);
      g_hash_table_insert(class_of, g_string_free(key, FALSE), GUINT_TO_POINTER(c + 1));
    }
    g_array_append_val(g_array_index(class_members, GArray *, c), d);
    p->device_class[d] = c;
  }
  g_hash_table_destroy(class_of);

  l.comm_index = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  l.comms = g_array_new(FALSE, FALSE, sizeof(struct plan_comm));
  instr_of = g_new(uint32_t, nn ? nn : 1);
  for (uint32_t i = 0; i < nn; i++)
    instr_of[i] = IR_NONE;
  /* At most one communicator per comm node, so nn bounds the counters. */
  comm_seq = g_new0(uint32_t, 2 * (size_t)(nn ? nn : 1));
  p->n_classes = class_members->len;
  p->classes = g_new0(struct plan_class, p->n_classes ? p->n_classes : 1);
  for (uint32_t c = 0; c < p->n_classes; c++) {
    GArray *m = g_array_index(class_members, GArray *, c);
    struct plan_class *pc = &p->classes[c];
    pc->n_devices = m->len;
    pc->devices = (uint32_t *)g_array_free(m, FALSE);
    const GArray *groups = dev_groups[pc->devices[0]];
    build_class(&l, pc, (const uint32_t *)groups->data, groups->len, instr_of, comm_seq);
    for (uint32_t i = 0; i < pc->n_instrs; i++)
      if (pc->instrs[i].comm != IR_NONE)
        comm_seq[2 * pc->instrs[i].comm] = comm_seq[2 * pc->instrs[i].comm + 1] = 0;
  }
  g_array_free(class_members, TRUE);
  p->n_comms = l.comms->len;
  p->comms = (struct plan_comm *)g_array_free(l.comms, FALSE);
  l.comms = NULL;

  plan_index_positions(p);
  ok = plan_check_progress(p, err);
out:
  if (dev_groups) {
    for (uint32_t d = 0; d < p->n_devices; d++)
      g_array_free(dev_groups[d], TRUE);
    g_free(dev_groups);
  }
  if (l.group_nodes) {
    for (uint32_t k = 0; k < p->n_groups; k++)
      g_array_free(l.group_nodes[k], TRUE);
    g_free(l.group_nodes);
  }
  if (l.comms)
    g_array_free(l.comms, TRUE);
  if (l.comm_index)
    g_hash_table_destroy(l.comm_index);
  ir_adjacency_free(&l.adj);
  g_free(l.order);
  g_free(l.order_pos);
  g_free(instr_of);
  g_free(comm_seq);
  if (!ok) {
    plan_free(p);
    return NULL;
  }
  return p;
}
