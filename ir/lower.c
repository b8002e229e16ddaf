/* plan: lowering the rewritten IR to per-device plans.
 *
 * One global issue order is fixed first: Kahn's algorithm over the whole graph, taking the
 * ready node of lowest priority (then lowest id), and emitting each recv right after its send.
 * Every device's streams run the projection of that order, so executing the whole step in
 * that order one instruction at a time is always possible: each send meets its recv at once,
 * and a collective is one node for all members. The projection is therefore deadlock-free by
 * construction; plan_check_progress proves it again on the lowered plans (and on plans read
 * from disk). Devices with the same group memberships get one shared program (a class).
 * A stream that carries more than one kind of point-to-point traffic (a program that named one
 * stream for all of it) is ordered by when its transfers become ready instead, and those ready
 * together are issued as one group; see "point-to-point groups" below. */
#include <string.h>

#include "../base/json.h"
#include "plan-impl.h"

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
  GHashTable *comm_index; /* struct comm_key -> comm id + 1 */
  uint32_t *node_comm;    /* comm_of by node (IR_NONE: not yet), while lower_classes runs: a
                           * node is in the program of every class of its group */
  GArray *comms;
  GArray **dev_groups;   /* per device: the groups that shape its program, ascending */
  GArray *class_members; /* per class: a GArray of its devices, until the class owns them */
  bool issue_order;      /* shared streams keep the global issue order (the fallback) */
  double *est;           /* estimated start per node, when some stream is shared */
  bool any_shared;       /* some class has a shared stream */
};

/* comm_index's key: a communicator's fields (formatting them as text cost a tenth of a
 * lowering at 64 pipeline ranks) */
struct comm_key {
  uint32_t field[6];
};
static guint comm_key_hash(gconstpointer p) {
  const struct comm_key *k = p;
  guint h = 2166136261u;
  for (int i = 0; i < 6; i++)
    h = (h ^ k->field[i]) * 16777619u;
  return h;
}
static gboolean comm_key_equal(gconstpointer a, gconstpointer b) {
  return memcmp(a, b, sizeof(struct comm_key)) == 0;
}

static uint32_t comm_of(struct lower *l, const struct ir_node *n) {
  struct plan_comm c = {.purpose = n->purpose, .group = n->group, .peer_group = IR_NONE};
  if (n->tp_degree > 1 && n->purpose != IR_COMM_PP)
    c.split = n->tp_degree; /* TP peers, or the devices of one TP rank (tensor_parallel.c) */
  if (n->purpose == IR_COMM_CP) { /* one tp rank's and one dp rank's cp devices */
    c.split = n->cp_degree;
    c.stride = n->tp_degree > 1 ? n->tp_degree : 0;
  }
  if (n->kind == IR_NODE_SEND)
    c.peer_group = n->peer_group;
  if (n->kind == IR_NODE_RECV) {
    c.group = n->peer_group;
    c.peer_group = n->group;
  }
  /* an all-to-all of experts carved from the stage: one EP group per block (ir.h) */
  if (n->purpose == IR_COMM_EP && n->expert_replicas > 1)
    c.block = l->g->groups ? IR_GROUP(l->g, n->group)->count / n->expert_replicas : 0;
  struct comm_key key = {{(uint32_t)c.purpose, c.group, c.peer_group, c.split, c.block, c.stride}};
  gpointer found = g_hash_table_lookup(l->comm_index, &key);
  if (found)
    return GPOINTER_TO_UINT(found) - 1;
  g_array_append_val(l->comms, c);
  g_hash_table_insert(l->comm_index, g_memdup2(&key, sizeof key),
                      GUINT_TO_POINTER(l->comms->len));
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

/* The class's instructions: the nodes of its groups, in the global issue order. */
static void class_instrs(struct lower *l, struct plan_class *c, const uint32_t *groups,
                         uint32_t n_groups, uint32_t *instr_of) {
  const struct ir_graph *g = l->g;
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
}

/* Instruction lists by stream, in issue order. */
static void class_streams(struct plan_class *c, uint32_t n_streams) {
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
}

static void class_comms_seq(struct lower *l, struct plan_class *c, uint32_t *comm_seq) {
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    uint32_t node = c->instrs[i].node;
    const struct ir_node *n = IR_NODE(l->g, node);
    if (n->purpose == IR_COMM_NONE)
      continue;
    if (l->node_comm[node] == IR_NONE)
      l->node_comm[node] = comm_of(l, n);
    uint32_t comm = l->node_comm[node];
    c->instrs[i].comm = comm;
    /* A device in both groups of a PP communicator sends and receives on it: the two sides
     * count separately, as the two ends of each pair do. */
    c->instrs[i].seq = comm_seq[2 * comm + (n->kind == IR_NODE_RECV)]++;
  }
}

/* ---- point-to-point groups -------------------------------------------------------------- */

/* A stream that carries sends or receives to more than one (direction, peer) on this class is
 * shared: a program named one stream for all its pipeline traffic. In the global order, one
 * transfer there waits for its peer while another the compute needs first queues behind it.
 * Such streams get their sends and receives reordered by when the compute needs them and
 * grouped (Megatron's send_forward_recv_backward); a stream of one direction (the default)
 * is a FIFO channel that needs neither, and its plans stay as they were. */

static bool is_p2p(const struct ir_node *n) {
  return n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV;
}

static bool is_compute(const struct ir_node *n) {
  return n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_OPTIMIZER;
}

static bool same_channel(const struct ir_node *a, const struct ir_node *b) {
  return a->kind == b->kind && a->group == b->group && a->peer_group == b->peer_group;
}

/* shared[s] for every stream (n_streams entries, caller frees); NULL when none is shared. */
static bool *class_shared_streams(const struct lower *l, const struct plan_class *c) {
  uint32_t n_streams = l->p->n_streams;
  uint32_t *first = g_new(uint32_t, n_streams);
  bool *shared = g_new0(bool, n_streams), any = false;
  for (uint32_t s = 0; s < n_streams; s++)
    first[s] = IR_NONE;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = IR_NODE(l->g, c->instrs[i].node);
    if (!is_p2p(n))
      continue;
    uint32_t s = c->instrs[i].stream;
    if (first[s] == IR_NONE)
      first[s] = c->instrs[i].node;
    else if (!same_channel(IR_NODE(l->g, first[s]), n))
      any = shared[s] = true;
  }
  g_free(first);
  if (!any) {
    g_free(shared);
    return NULL;
  }
  return shared;
}

struct place {
  double t;       /* estimated start of the node, or of the compute a transfer is placed before */
  uint32_t phase; /* 0: a transfer placed before the node starting at t, 1: the node itself */
  uint64_t tie;   /* global position (of the receive, for a transfer) */
  uint32_t instr;
};

static int compare_place(const void *x, const void *y) {
  const struct place *a = x, *b = y;
  if (a->t != b->t)
    return a->t < b->t ? -1 : 1;
  if (a->phase != b->phase)
    return a->phase < b->phase ? -1 : 1;
  if (a->tie != b->tie)
    return a->tie < b->tie ? -1 : 1;
  return a->instr < b->instr ? -1 : a->instr > b->instr;
}

/* A compute node's relative duration (see enum ir_cost_model; FLOPs per device plus one, so
 * that nothing is free), communication none. Enough to tell which transfer is ready first. */
static double unit_cost(const struct ir_graph *g, const struct ir_node *n) {
  if (n->kind != IR_NODE_COMPUTE || n->segment >= g->model->n_segments)
    return 0;
  if (g->cost_model == IR_COST_UNIT)
    return n->pass == IR_PASS_F ? 1 : n->pass == IR_PASS_B ? 2 : 1;
  const struct model_segment *s = &g->model->segments[n->segment];
  double f = n->pass == IR_PASS_F || n->pass == IR_PASS_R ? s->flops_fwd
             : n->pass == IR_PASS_BI ? s->flops_bwd_input
             : n->pass == IR_PASS_BW ? s->flops_bwd_weight
                                     : s->flops_bwd_input + s->flops_bwd_weight;
  return f + 1;
}

/* Estimated start of every node: compute runs in issue order on its group's stream, data
 * waits for its producers, communication takes no time. Only lowering of shared streams uses
 * it, to issue transfers in the order they are needed. */
static double *estimate_starts(const struct lower *l) {
  const struct ir_graph *g = l->g;
  uint32_t nn = g->nodes->len;
  double *start = g_new0(double, nn ? nn : 1);
  GHashTable *chain = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
  for (uint32_t k = 0; k < nn; k++) {
    uint32_t v = l->order[k];
    const struct ir_node *n = IR_NODE(g, v);
    double t = 0;
    for (uint32_t e = l->adj.in_first[v]; e < l->adj.in_first[v + 1]; e++) {
      uint32_t u = IR_EDGE(g, l->adj.in_edges[e])->src;
      double end = start[u] + unit_cost(g, IR_NODE(g, u));
      if (end > t)
        t = end;
    }
    if (is_compute(n)) {
      int64_t key = ((int64_t)n->group << 32) | n->stream;
      double *free_at = g_hash_table_lookup(chain, &key);
      if (!free_at) {
        int64_t *kk = g_new(int64_t, 1);
        *kk = key;
        free_at = g_new0(double, 1);
        g_hash_table_insert(chain, kk, free_at);
      }
      if (*free_at > t)
        t = *free_at;
      *free_at = t + unit_cost(g, n);
    }
    start[v] = t;
  }
  g_hash_table_destroy(chain);
  return start;
}

/* The receive of a transfer (x itself or its pair). */
static uint32_t transfer_recv(const struct ir_node *n, uint32_t x) {
  return n->kind == IR_NODE_RECV ? x : n->pair;
}

/* Where instruction i goes. A transfer on a shared stream goes, on both its ends, at its
 * estimated ready time (its producer's end, before whatever starts then); everything else at
 * its own estimated start. Every device's order is then the projection of one global order in
 * which each transfer sits at one place for both ends: sequence numbers stay paired, and run
 * one step at a time that order meets every transfer at once, so the plan cannot deadlock.
 * And a stream issues its transfers in the order they become ready: with the textbook
 * timeline, each one meets its peer as soon as its data exists, as on a stream per direction. */
static struct place place_of(const struct lower *l, const struct plan_class *c, uint32_t i,
                             const uint32_t *instr_of, const bool *shared) {
  uint32_t x = c->instrs[i].node;
  const struct ir_node *n = IR_NODE(l->g, x);
  if (!is_p2p(n) || !shared[c->instrs[i].stream] || instr_of[n->pair] != IR_NONE)
    return (struct place){l->est[x], 1, l->order_pos[x], i};
  uint32_t r = transfer_recv(n, x);
  return (struct place){l->est[r], 0, l->order_pos[r], i};
}

/* True when every local edge still points forward in the order (new_pos by old index). */
static bool order_respects_edges(const struct lower *l, const struct plan_class *c,
                                 const uint32_t *instr_of, const uint32_t *new_pos) {
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    uint32_t x = c->instrs[i].node;
    for (uint32_t k = l->adj.in_first[x]; k < l->adj.in_first[x + 1]; k++) {
      uint32_t u = instr_of[IR_EDGE(l->g, l->adj.in_edges[k])->src];
      if (u != IR_NONE && new_pos[u] >= new_pos[i])
        return false;
    }
  }
  return true;
}

/* Reorders the class's instructions so that each shared stream runs its sends and receives
 * in the order the compute needs them. Left as it is if the result would break an edge. */
static void class_order_shared(struct lower *l, struct plan_class *c, uint32_t *instr_of,
                               const bool *shared) {
  uint32_t n = c->n_instrs;
  struct place *pl = g_new(struct place, n ? n : 1);
  for (uint32_t i = 0; i < n; i++)
    pl[i] = place_of(l, c, i, instr_of, shared);
  qsort(pl, n, sizeof *pl, compare_place);
  uint32_t *new_pos = g_new(uint32_t, n ? n : 1);
  for (uint32_t k = 0; k < n; k++)
    new_pos[pl[k].instr] = k;
  if (order_respects_edges(l, c, instr_of, new_pos)) {
    struct plan_instr *old = g_memdup2(c->instrs, sizeof *old * (n ? n : 1));
    for (uint32_t k = 0; k < n; k++) {
      c->instrs[k] = old[pl[k].instr];
      instr_of[c->instrs[k].node] = k;
    }
    g_free(old);
  }
  g_free(new_pos);
  g_free(pl);
}

/* True when instruction x waits on or reads from one of the instructions parts[0 .. n). */
static bool depends_on_any(const struct plan_class *c, uint32_t x, const uint32_t *parts,
                           uint32_t n) {
  const struct plan_instr *in = &c->instrs[x];
  for (uint32_t k = 0; k < n; k++) {
    for (uint32_t w = 0; w < in->wait_count; w++)
      if (c->waits[in->wait_first + w] == parts[k])
        return true;
    for (uint32_t r = 0; r < in->read_count; r++)
      if (c->tensors[c->reads[in->read_first + r]].producer == parts[k])
        return true;
  }
  return false;
}

/* Whether stream entry `next` may join the group whose parts are parts[0 .. n): it is a send
 * or receive issued before the next compute instruction, whatever it waits for is done when
 * the group is posted, and nothing issued between the parts depends on them (the group holds
 * its parts until the last has met its peer). These keep the plan deadlock-free: the group
 * only posts a part earlier and completes the others no earlier than the plain order did. */
static bool joins_group(const struct lower *l, const struct plan_class *c, const uint32_t *parts,
                        uint32_t n_parts, uint32_t next, const uint32_t *computes_before) {
  const struct plan_instr *in = &c->instrs[next];
  const struct ir_node *n = IR_NODE(l->g, in->node);
  if (!is_p2p(n) || computes_before[next] != computes_before[parts[0]])
    return false;
  /* In the order by readiness a group is posted when its last send is ready. A receive may
   * join (posted early it costs nothing, and the stream lists it after every earlier-ready
   * part); a send only if every part so far became ready with it, or it would hold their
   * peers until it is ready. */
  uint32_t first = c->instrs[parts[0]].node;
  if (!l->issue_order && n->kind == IR_NODE_SEND &&
      l->est[transfer_recv(n, in->node)] != l->est[transfer_recv(IR_NODE(l->g, first), first)])
    return false;
  for (uint32_t w = 0; w < in->wait_count; w++)
    if (c->waits[in->wait_first + w] >= parts[0])
      return false;
  for (uint32_t x = parts[n_parts - 1] + 1; x < next; x++)
    if (depends_on_any(c, x, parts, n_parts))
      return false;
  return true;
}

/* Groups the runs of sends and receives on each shared stream that the compute needs
 * between the same two compute instructions. */
static void class_group_p2p(struct lower *l, struct plan_class *c, const bool *shared) {
  uint32_t *computes_before = g_new(uint32_t, c->n_instrs + 1);
  computes_before[0] = 0;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    computes_before[i + 1] = computes_before[i] + is_compute(IR_NODE(l->g, c->instrs[i].node));
  uint32_t *parts = g_new(uint32_t, c->n_instrs ? c->n_instrs : 1);
  for (uint32_t s = 0; s < l->p->n_streams; s++) {
    if (!shared[s])
      continue;
    uint32_t j = c->stream_first[s], end = c->stream_first[s + 1];
    while (j < end) {
      uint32_t n = 1;
      parts[0] = c->stream_instrs[j];
      if (is_p2p(IR_NODE(l->g, c->instrs[parts[0]].node)))
        while (j + n < end && joins_group(l, c, parts, n, c->stream_instrs[j + n], computes_before))
          parts[n] = c->stream_instrs[j + n], n++;
      for (uint32_t k = 0; k < n && n > 1; k++)
        c->instrs[parts[k]].group_parts = n;
      j += n;
    }
  }
  g_free(parts);
  g_free(computes_before);
}

/* The pools of the class being built; tensor_reads holds (reader, tensor) pairs until reads
 * and consumers are laid out. */
struct class_pools {
  GArray *waits, *reads, *writes, *consumers, *tensors, *tensor_reads;
};

/* Instruction i's cross-stream waits: the latest instruction per other stream it depends on.
 * latest is scratch of n_streams entries. */
static void instr_waits(struct lower *l, struct plan_class *c, uint32_t i, const uint32_t *instr_of,
                        uint32_t *latest, struct class_pools *cp) {
  uint32_t n_streams = l->p->n_streams, x = c->instrs[i].node;
  const struct ir_node *xn = IR_NODE(l->g, x);
  for (uint32_t s = 0; s < n_streams; s++)
    latest[s] = IR_NONE;
  for (uint32_t k = l->adj.in_first[x]; k < l->adj.in_first[x + 1]; k++) {
    const struct ir_edge *e = IR_EDGE(l->g, l->adj.in_edges[k]);
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
  c->instrs[i].wait_first = cp->waits->len;
  for (uint32_t s = 0; s < n_streams; s++)
    if (latest[s] != IR_NONE)
      g_array_append_val(cp->waits, latest[s]);
  c->instrs[i].wait_count = cp->waits->len - c->instrs[i].wait_first;
}

/* The workspace of a forward or rerun under recomputation (apply_recompute gives F's and R's
 * saved tensors their sizes; these are what each holds only while it runs), one op group's
 * transients at a time (ir_tp_segment_work):
 *   F, full: everything a plain F saves, now dropped when it ends (it keeps its inputs), held
 *            for the whole instruction, and the largest group's transients;
 *   R, full: a plain F's workspace (it saves what a plain F saves, in its own tensor);
 *   F, selective: the largest group's plain F workspace and what of its modules it no
 *            longer saves (attention cores, norm outputs, MLP activations);
 *   R, selective: what the largest group's reruns hold while they run (a norm's rstd, an
 *            MLP's output; the cores nothing), the rest going into its saved tensor. */
static uint64_t recompute_work(const struct model *m, const struct ir_node *n, uint64_t fwd_work) {
  bool full = n->recompute == IR_RECOMPUTE_FULL;
  if (n->pass == IR_PASS_R)
    return full ? fwd_work
                : ir_tp_segment_work_modules(m, n->segment, IR_PASS_R, n->tp_degree,
                                             n->sequence_parallel, n->recompute_modules);
  if (full) /* experts under EP save their rows at the capacity (ir/expert.c) */
    return fwd_work + (ir_ep_sized(n) ? ir_ep_saved_bytes(m, n)
                                      : ir_tp_segment_saved_bytes(m, n->segment, n->tp_degree,
                                                                  n->sequence_parallel));
  if (ir_ep_sized(n)) /* no attention among the experts; their activation rows (moe_act) */
    return fwd_work + ir_node_module_bytes(m, n, n->recompute_modules);
  return ir_tp_segment_work_modules(m, n->segment, IR_PASS_F, n->tp_degree, n->sequence_parallel,
                                    n->recompute_modules);
}

/* A tensor of instruction i that no instruction reads: its workspace (held while it runs) or
 * an output whose release the memory rule places (instr_bucket). */
static void add_unread(uint32_t i, uint64_t bytes, enum plan_tensor_kind kind,
                       struct class_pools *cp) {
  if (!bytes)
    return;
  struct plan_tensor pt = {.bytes = bytes,
                           .producer = i,
                           .kind = kind,
                           .consumer_first = IR_NONE, /* no slot: never matched as an output */
                           .consumer_count = 0};
  g_array_append_val(cp->tensors, pt);
  uint32_t t = cp->tensors->len - 1;
  g_array_append_val(cp->writes, t);
}

/* What compute node n holds while it runs in pass (its workspace without recomputation):
 * expert-parallel experts at the plan's capacity (ir/expert.c), any other segment as tensor
 * parallelism divides it (ir/tensor_parallel.c; undivided at tp <= 1). */
static uint64_t node_work(const struct model *m, const struct ir_node *n, enum ir_pass pass) {
  struct ir_node at = *n;
  at.pass = pass;
  return ir_ep_sized(&at) ? ir_ep_work_bytes(m, &at, NULL)
                          : ir_tp_segment_work(m, n->segment, pass, n->tp_degree,
                                               n->sequence_parallel, NULL);
}

/* Compute instruction i's workspace (models/model.h): F holds its outputs nobody keeps and
 * scratch; a fused B its values' gradients, bwork and scratch; BI its scratch (it keeps the
 * rest for BW, its saved tensor); BW nothing new; under recomputation, recompute_work. */
static uint64_t compute_work(const struct model *m, const struct ir_node *n) {
  if (n->recompute != IR_RECOMPUTE_NONE && (n->pass == IR_PASS_F || n->pass == IR_PASS_R))
    return recompute_work(m, n, node_work(m, n, IR_PASS_F));
  return node_work(m, n, n->pass);
}

/* Under context parallelism the attention also holds the K/V (and dK/dV) its exchange brings
 * (ir_cp_buffer_bytes), while it runs. */
uint64_t plan_compute_work_bytes(const struct model *m, const struct ir_node *n) {
  if (n->kind != IR_NODE_COMPUTE || n->segment >= m->n_segments)
    return 0;
  uint64_t cp = n->cp_degree > 1 ? ir_cp_buffer_bytes(m, n->segment, n->pass, n->tp_degree,
                                                      n->cp_comm)
                                 : 0;
  return compute_work(m, n) + cp;
}

static void instr_work(struct lower *l, uint32_t i, const struct ir_node *n,
                       struct class_pools *cp) {
  add_unread(i, plan_compute_work_bytes(l->g->model, n), PLAN_TENSOR_WORK, cp);
}

/* An expert-parallel all-to-all's send buffers (ir_ep_a2a_work_bytes), released when it ends.
 * Into the experts when its output goes to a compute node of the segment it serves. */
static void instr_a2a_work(struct lower *l, uint32_t i, uint32_t x, struct class_pools *cp) {
  const struct ir_node *n = IR_NODE(l->g, x);
  if (n->kind != IR_NODE_ALL_TO_ALL || !ir_ep_sized(n))
    return;
  bool into = false;
  for (uint32_t k = l->adj.out_first[x]; k < l->adj.out_first[x + 1]; k++) {
    const struct ir_edge *e = IR_EDGE(l->g, l->adj.out_edges[k]);
    const struct ir_node *dn = IR_NODE(l->g, e->dst);
    into |= e->kind == IR_EDGE_DATA && e->slot == 0 && dn->kind == IR_NODE_COMPUTE &&
            dn->segment == n->segment;
  }
  uint64_t bytes = ir_ep_a2a_work_bytes(l->g->model, n, into);
  add_unread(i, bytes, PLAN_TENSOR_WORK, cp);
}

/* A ZeRO-2/3 gradient reduce-scatter's input: the bucket's gradients summed whole (padded to
 * N * ceil(P / N) so the collective divides evenly) from the first weight gradient of the step
 * to the reduce-scatter, after which only the shard stays (the static figure). Produced by the
 * reduce-scatter, read by nobody; its alloc point moves to the first weight gradient
 * (class_bucket_points). */
static void instr_bucket(struct lower *l, uint32_t i, const struct ir_node *n,
                         struct class_pools *cp) {
  if (n->kind != IR_NODE_REDUCE_SCATTER || n->purpose != IR_COMM_DP || !n->shard_grads ||
      n->segset == IR_NONE)
    return;
  uint64_t dtype = model_dtype_bytes(l->g->model->dtype);
  uint64_t P = IR_SEGSET(l->g, n->segset)->param_bytes / dtype;
  uint64_t N = n->replica_degree ? n->replica_degree : 1;
  add_unread(i, (P + N - 1) / N * N * dtype, PLAN_TENSOR_OUT, cp);
}

/* Forward (or rerun) i's saved tensor split by reader where its backward is split: what only
 * the input-gradient pass reads (ir_bi_only_saved_bytes) goes into a saved tensor of its own,
 * read by the saved tensor's readers but BW, so the memory rule releases it when BI ends
 * rather than when BW does. reads_from: where i's (reader, tensor) pairs start. */
static void instr_split_saved(struct lower *l, struct plan_class *c, uint32_t i,
                              uint32_t reads_from, struct class_pools *cp) {
  const struct ir_node *xn = IR_NODE(l->g, c->instrs[i].node);
  uint64_t bi_only = ir_bi_only_saved_bytes(l->g->model, xn);
  if (!bi_only)
    return;
  uint32_t saved = IR_NONE;
  for (uint32_t w = c->instrs[i].write_first; w < cp->writes->len; w++) {
    uint32_t t = g_array_index(cp->writes, uint32_t, w);
    if (g_array_index(cp->tensors, struct plan_tensor, t).kind == PLAN_TENSOR_SAVED)
      saved = t;
  }
  uint32_t(*pairs)[2] = (uint32_t(*)[2])cp->tensor_reads->data;
  uint32_t n_pairs = cp->tensor_reads->len;
  bool weights = false;
  for (uint32_t k = reads_from; k < n_pairs && saved != IR_NONE; k++)
    weights |= pairs[k][1] == saved && IR_NODE(l->g, c->instrs[pairs[k][0]].node)->pass == IR_PASS_BW;
  struct plan_tensor *pt = saved == IR_NONE ? NULL
                                            : &g_array_index(cp->tensors, struct plan_tensor, saved);
  if (!weights || pt->bytes < bi_only)
    return;
  pt->bytes -= bi_only;
  add_unread(i, bi_only, PLAN_TENSOR_SAVED, cp); /* no slot: never matched by an edge */
  uint32_t t = cp->tensors->len - 1;
  for (uint32_t k = reads_from; k < n_pairs; k++) {
    pairs = (uint32_t(*)[2])cp->tensor_reads->data; /* appending may move the array */
    if (pairs[k][1] != saved ||
        IR_NODE(l->g, c->instrs[pairs[k][0]].node)->pass == IR_PASS_BW)
      continue;
    uint32_t pair[2] = {pairs[k][0], t};
    g_array_append_vals(cp->tensor_reads, pair, 1);
  }
}

/* Instruction i's tensors: one per distinct output slot with a local consumer, and its
 * workspace. */
static void instr_writes(struct lower *l, struct plan_class *c, uint32_t i,
                         const uint32_t *instr_of, struct class_pools *cp) {
  uint32_t x = c->instrs[i].node;
  const struct ir_node *xn = IR_NODE(l->g, x);
  c->instrs[i].write_first = cp->writes->len;
  uint32_t reads_from = cp->tensor_reads->len;
  for (uint32_t k = l->adj.out_first[x]; k < l->adj.out_first[x + 1]; k++) {
    const struct ir_edge *e = IR_EDGE(l->g, l->adj.out_edges[k]);
    if (e->kind != IR_EDGE_DATA || instr_of[e->dst] == IR_NONE)
      continue;
    if (xn->kind == IR_NODE_SEND && e->dst == xn->pair)
      continue;
    uint32_t t = IR_NONE;
    for (uint32_t w = c->instrs[i].write_first; w < cp->writes->len; w++) {
      uint32_t cand = g_array_index(cp->writes, uint32_t, w);
      if (g_array_index(cp->tensors, struct plan_tensor, cand).consumer_first == e->slot) {
        t = cand;
        break;
      }
    }
    if (t == IR_NONE) {
      /* consumer_first holds the slot until consumers are laid out. */
      struct plan_tensor pt = {.bytes = e->bytes,
                               .producer = i,
                               .kind = e->slot == 1 ? PLAN_TENSOR_SAVED : PLAN_TENSOR_OUT,
                               .consumer_first = e->slot,
                               .consumer_count = 0};
      g_array_append_val(cp->tensors, pt);
      t = cp->tensors->len - 1;
      g_array_append_val(cp->writes, t);
    }
    struct plan_tensor *pt = &g_array_index(cp->tensors, struct plan_tensor, t);
    if (e->bytes > pt->bytes)
      pt->bytes = e->bytes;
    /* what BI keeps for BW: the gradients of the segment's values and the ops' bwork */
    if (xn->kind == IR_NODE_COMPUTE && xn->pass == IR_PASS_BI && e->slot == 1 &&
        xn->segment < l->g->model->n_segments) {
      if (ir_ep_sized(xn))
        ir_ep_work_bytes(l->g->model, xn, &pt->bytes);
      else
        ir_tp_segment_work(l->g->model, xn->segment, IR_PASS_BI, xn->tp_degree,
                           xn->sequence_parallel, &pt->bytes);
    }
    uint32_t pair[2] = {instr_of[e->dst], t};
    g_array_append_vals(cp->tensor_reads, pair, 1);
  }
  instr_split_saved(l, c, i, reads_from, cp);
  instr_work(l, i, xn, cp);
  instr_a2a_work(l, i, x, cp);
  instr_bucket(l, i, xn, cp);
  c->instrs[i].write_count = cp->writes->len - c->instrs[i].write_first;
}

/* The memory rule's points (struct plan_tensor): allocated when its producer starts, released
 * when its last consumer in issue order ends (consumers are listed in issue order). */
static void tensor_points(struct class_pools *cp) {
  for (uint32_t t = 0; t < cp->tensors->len; t++) {
    struct plan_tensor *pt = &g_array_index(cp->tensors, struct plan_tensor, t);
    pt->alloc = pt->producer;
    pt->release = pt->consumer_count
                      ? g_array_index(cp->consumers, uint32_t,
                                      pt->consumer_first + pt->consumer_count - 1)
                      : pt->producer;
  }
}

/* Reads per instruction and consumers per tensor, deduplicated, in reader order. */
static void class_reads_consumers(struct plan_class *c, struct class_pools *cp) {
  uint32_t n_pairs = cp->tensor_reads->len;
  uint32_t(*pairs)[2] = (uint32_t(*)[2])cp->tensor_reads->data;
  /* Sort (reader, tensor) pairs so reads come out grouped by reader. */
  if (n_pairs > 1) /* an empty GArray's data is NULL, which qsort may not be given */
    qsort(pairs, n_pairs, sizeof pairs[0], compare_pair);
  for (uint32_t t = 0; t < cp->tensors->len; t++)
    g_array_index(cp->tensors, struct plan_tensor, t).consumer_count = 0;
  uint32_t prev_r = IR_NONE, prev_t = IR_NONE;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    c->instrs[i].read_first = c->instrs[i].read_count = 0;
  for (uint32_t k = 0; k < n_pairs; k++) {
    uint32_t r = pairs[k][0], t = pairs[k][1];
    if (r == prev_r && t == prev_t)
      continue;
    if (r != prev_r)
      c->instrs[r].read_first = cp->reads->len;
    g_array_append_val(cp->reads, t);
    c->instrs[r].read_count++;
    g_array_index(cp->tensors, struct plan_tensor, t).consumer_count++;
    prev_r = r;
    prev_t = t;
  }
  uint32_t acc = 0;
  for (uint32_t t = 0; t < cp->tensors->len; t++) {
    struct plan_tensor *pt = &g_array_index(cp->tensors, struct plan_tensor, t);
    pt->consumer_first = acc;
    acc += pt->consumer_count;
    pt->consumer_count = 0;
  }
  g_array_set_size(cp->consumers, acc);
  for (uint32_t i = 0; i < c->n_instrs; i++)
    for (uint32_t k = 0; k < c->instrs[i].read_count; k++) {
      uint32_t t = g_array_index(cp->reads, uint32_t, c->instrs[i].read_first + k);
      struct plan_tensor *pt = &g_array_index(cp->tensors, struct plan_tensor, t);
      g_array_index(cp->consumers, uint32_t, pt->consumer_first + pt->consumer_count++) = i;
    }
  tensor_points(cp);
}

/* Moves the pools into the class and frees what is left. */
static void class_take_pools(struct plan_class *c, struct class_pools *cp) {
  g_array_free(cp->tensor_reads, TRUE);
  c->n_waits = cp->waits->len;
  c->waits = (uint32_t *)g_array_free(cp->waits, FALSE);
  c->n_reads = cp->reads->len;
  c->reads = (uint32_t *)g_array_free(cp->reads, FALSE);
  c->n_writes = cp->writes->len;
  c->writes = (uint32_t *)g_array_free(cp->writes, FALSE);
  c->n_consumers = cp->consumers->len;
  c->consumers = (uint32_t *)g_array_free(cp->consumers, FALSE);
  c->n_tensors = cp->tensors->len;
  c->tensors = (struct plan_tensor *)g_array_free(cp->tensors, FALSE);
  memset(cp, 0, sizeof *cp);
}

/* A bucket tensor (instr_bucket) is allocated at the first instruction of the class that
 * writes a weight gradient of one of its segments (B or BW), in issue order. */
static void class_bucket_points(const struct lower *l, struct plan_class *c) {
  for (uint32_t t = 0; t < c->n_tensors; t++) {
    struct plan_tensor *pt = &c->tensors[t];
    const struct ir_node *rs = IR_NODE(l->g, c->instrs[pt->producer].node);
    if (pt->consumer_count || rs->kind != IR_NODE_REDUCE_SCATTER || rs->segset == IR_NONE)
      continue;
    const struct ir_segset *ss = IR_SEGSET(l->g, rs->segset);
    const uint32_t *segs = &g_array_index(l->g->segment_pool, uint32_t, ss->first);
    for (uint32_t i = 0; i < pt->producer; i++) {
      const struct ir_node *n = IR_NODE(l->g, c->instrs[i].node);
      if (n->kind != IR_NODE_COMPUTE || (n->pass != IR_PASS_B && n->pass != IR_PASS_BW))
        continue;
      bool mine = false;
      for (uint32_t k = 0; k < ss->count && !mine; k++)
        mine = segs[k] == n->segment;
      if (mine) {
        pt->alloc = i;
        break;
      }
    }
  }
}

/* Builds the program of one class, whose devices belong to exactly `groups`. instr_of is
 * IR_NONE for every node on entry and on return. */
static void build_class(struct lower *l, struct plan_class *c, const uint32_t *groups,
                        uint32_t n_groups, uint32_t *instr_of, uint32_t *comm_seq) {
  uint32_t n_streams = l->p->n_streams;
  class_instrs(l, c, groups, n_groups, instr_of);
  bool *shared = class_shared_streams(l, c);
  l->any_shared |= shared != NULL;
  if (shared && !l->issue_order) {
    if (!l->est)
      l->est = estimate_starts(l);
    class_order_shared(l, c, instr_of, shared);
  }
  class_streams(c, n_streams);
  class_comms_seq(l, c, comm_seq);
  struct class_pools cp = {
      .waits = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
      .reads = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
      .writes = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
      .consumers = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
      .tensors = g_array_new(FALSE, FALSE, sizeof(struct plan_tensor)),
      .tensor_reads = g_array_new(FALSE, FALSE, sizeof(uint32_t) * 2),
  };
  uint32_t *latest = g_new(uint32_t, n_streams ? n_streams : 1);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    instr_waits(l, c, i, instr_of, latest, &cp);
    instr_writes(l, c, i, instr_of, &cp);
  }
  g_free(latest);
  class_reads_consumers(c, &cp);
  class_take_pools(c, &cp);
  class_bucket_points(l, c);
  if (shared)
    class_group_p2p(l, c, shared);
  g_free(shared);
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

/* The plan's own copy of the model, rebuilt from its JSON text so that a plan read back from
 * files holds exactly the same model. */
static bool lower_model(struct plan *p, const struct ir_graph *g, const char *program_json,
                        GError **err) {
  cJSON *mj = model_to_json(g->model);
  p->model_json = cJSON_PrintUnformatted(mj);
  cJSON_Delete(mj);
  mj = cJSON_Parse(p->model_json);
  p->model = model_load_json(g->model->name, mj, 0, err);
  cJSON_Delete(mj);
  p->program_json = program_json ? g_strdup(program_json) : NULL;
  return p->model != NULL;
}

/* The global issue order, and per group its nodes in that order. */
static bool lower_order(struct lower *l, GError **err) {
  const struct ir_graph *g = l->g;
  uint32_t nn = g->nodes->len;
  ir_adjacency_build(g, &l->adj);
  l->order = g_new(uint32_t, nn ? nn : 1);
  l->order_pos = g_new(uint32_t, nn ? nn : 1);
  if (!global_order(g, &l->adj, l->order))
    return piper_input_error(err, "the training graph has a cycle");
  for (uint32_t i = 0; i < nn; i++)
    l->order_pos[l->order[i]] = i;
  l->group_nodes = g_new(GArray *, l->p->n_groups);
  for (uint32_t k = 0; k < l->p->n_groups; k++)
    l->group_nodes[k] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t i = 0; i < nn; i++) {
    uint32_t v = l->order[i];
    g_array_append_val(l->group_nodes[IR_NODE(g, v)->group], v);
  }
  return true;
}

/* Group memberships per device (only groups that run a node shape a program); devices with
 * equal memberships share a class. Fills p->device_class and l->class_members. */
static void lower_device_classes(struct lower *l) {
  struct plan *p = l->p;
  l->dev_groups = g_new(GArray *, p->n_devices);
  for (uint32_t d = 0; d < p->n_devices; d++)
    l->dev_groups[d] = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t k = 0; k < p->n_groups; k++) {
    if (l->group_nodes[k]->len == 0)
      continue;
    const struct ir_group *grp = &p->groups[k];
    for (uint32_t j = 0; j < grp->count; j++)
      g_array_append_val(l->dev_groups[p->device_pool[grp->first + j]], k);
  }
  GHashTable *class_of = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  p->device_class = g_new(uint32_t, p->n_devices ? p->n_devices : 1);
  l->class_members = g_array_new(FALSE, FALSE, sizeof(GArray *));
  for (uint32_t d = 0; d < p->n_devices; d++) {
    GString *key = g_string_new(NULL);
    for (uint32_t j = 0; j < l->dev_groups[d]->len; j++)
      g_string_append_printf(key, "%u,", g_array_index(l->dev_groups[d], uint32_t, j));
    gpointer found = g_hash_table_lookup(class_of, key->str);
    uint32_t c;
    if (found) {
      c = GPOINTER_TO_UINT(found) - 1;
      g_string_free(key, TRUE);
    } else {
      c = l->class_members->len;
      GArray *m = g_array_new(FALSE, FALSE, sizeof(uint32_t));
      g_array_append_val(l->class_members, m);
      g_hash_table_insert(class_of, g_string_free(key, FALSE), GUINT_TO_POINTER(c + 1));
    }
    g_array_append_val(g_array_index(l->class_members, GArray *, c), d);
    p->device_class[d] = c;
  }
  g_hash_table_destroy(class_of);
}

/* Every class's program, and the communicators they use. */
static void lower_classes(struct lower *l) {
  struct plan *p = l->p;
  uint32_t nn = l->g->nodes->len;
  l->comm_index = g_hash_table_new_full(comm_key_hash, comm_key_equal, g_free, NULL);
  l->comms = g_array_new(FALSE, FALSE, sizeof(struct plan_comm));
  uint32_t *instr_of = g_new(uint32_t, nn ? nn : 1);
  l->node_comm = g_new(uint32_t, nn ? nn : 1);
  for (uint32_t i = 0; i < nn; i++)
    instr_of[i] = l->node_comm[i] = IR_NONE;
  /* At most one communicator per comm node, so nn bounds the counters. */
  uint32_t *comm_seq = g_new0(uint32_t, 2 * (size_t)(nn ? nn : 1));
  p->n_classes = l->class_members->len;
  p->classes = g_new0(struct plan_class, p->n_classes ? p->n_classes : 1);
  for (uint32_t c = 0; c < p->n_classes; c++) {
    GArray *m = g_array_index(l->class_members, GArray *, c);
    struct plan_class *pc = &p->classes[c];
    pc->n_devices = m->len;
    pc->devices = (uint32_t *)g_array_free(m, FALSE);
    const GArray *groups = l->dev_groups[pc->devices[0]];
    build_class(l, pc, (const uint32_t *)groups->data, groups->len, instr_of, comm_seq);
    for (uint32_t i = 0; i < pc->n_instrs; i++)
      if (pc->instrs[i].comm != IR_NONE)
        comm_seq[2 * pc->instrs[i].comm] = comm_seq[2 * pc->instrs[i].comm + 1] = 0;
  }
  g_array_free(l->class_members, TRUE);
  l->class_members = NULL;
  p->n_comms = l->comms->len;
  p->comms = (struct plan_comm *)g_array_free(l->comms, FALSE);
  l->comms = NULL;
  g_free(instr_of);
  g_clear_pointer(&l->node_comm, g_free);
  g_free(comm_seq);
}

static void lower_free(struct lower *l) {
  struct plan *p = l->p;
  if (l->dev_groups) {
    for (uint32_t d = 0; d < p->n_devices; d++)
      g_array_free(l->dev_groups[d], TRUE);
    g_free(l->dev_groups);
  }
  if (l->class_members) {
    for (uint32_t c = 0; c < l->class_members->len; c++)
      g_array_free(g_array_index(l->class_members, GArray *, c), TRUE);
    g_array_free(l->class_members, TRUE);
  }
  if (l->group_nodes) {
    for (uint32_t k = 0; k < p->n_groups; k++)
      g_array_free(l->group_nodes[k], TRUE);
    g_free(l->group_nodes);
  }
  if (l->comms)
    g_array_free(l->comms, TRUE);
  if (l->comm_index)
    g_hash_table_destroy(l->comm_index);
  ir_adjacency_free(&l->adj);
  g_free(l->order);
  g_free(l->order_pos);
  g_free(l->est);
}

/* Lowers again with every shared stream in the global issue order, where the order by need
 * deadlocks (a peer that posts its receive only when its compute needs it can hold up a group
 * whose other part another compute needs). Groups formed there only post a part earlier and
 * never complete one later than the plain order did, so this plan makes progress as the
 * default one does; the check below proves it again. */
static bool lower_in_issue_order(struct lower *l, GError **err) {
  struct plan *p = l->p;
  for (uint32_t c = 0; c < p->n_classes; c++)
    plan_class_clear(&p->classes[c]);
  g_clear_pointer(&p->classes, g_free);
  g_clear_pointer(&p->comms, g_free);
  g_clear_pointer(&p->device_class, g_free);
  for (uint32_t d = 0; d < p->n_devices; d++)
    g_array_free(l->dev_groups[d], TRUE);
  g_clear_pointer(&l->dev_groups, g_free);
  g_clear_pointer(&l->comm_index, g_hash_table_destroy);
  l->issue_order = true;
  lower_device_classes(l);
  lower_classes(l);
  return plan_check_progress(p, err);
}

struct plan *plan_lower(const struct ir_graph *g, const char *program_json, GError **err) {
  struct plan *p = g_new0(struct plan, 1);
  struct lower l = {.g = g, .p = p};
  bool ok = false;
  if (!lower_model(p, g, program_json, err))
    goto out;
  copy_tables(p, g);
  if (!lower_order(&l, err))
    goto out;
  lower_device_classes(&l);
  lower_classes(&l);
  plan_index_positions(p);
  ok = plan_check_progress(p, NULL) || (l.any_shared && lower_in_issue_order(&l, NULL));
  if (!ok)
    ok = plan_check_progress(p, err);
out:
  lower_free(&l);
  if (!ok) {
    plan_free(p);
    return NULL;
  }
  return p;
}
