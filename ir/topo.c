/* ir_topo: topological positions kept up to date while edges are added (ir.h).
 *
 * Why incremental: the order phase re-sorts the whole graph after each pipeline rank's order
 * directive (the next directive sorts its matches by these positions, and a cycle must be
 * refused), which was a quarter to a third of a compile at 32 to 64 ranks. The positions must
 * stay exactly those of a sort from scratch (they decide the order of a schedule's incomparable
 * nodes, so the plans), so an update re-runs Kahn's algorithm from the first step the new edges
 * change, not from the start:
 *
 * In the previous run, node v was put in the queue while the node at position enq[v] was taken
 * out (enq[v] = IR_NONE: a source, queued before step 0). A new edge u -> v with
 * pos[u] < enq[v] changes nothing: when v's last old predecessor leaves the queue, u has left
 * already, so v joins the queue at the same step and in the same place. Any other new edge
 * makes the run differ at step enq[v] at the earliest (v joined the queue then; now it waits
 * for u), or at the start when v was a source. Before the first such step t, the two runs take
 * out the same nodes and queue the same ones in the same order, so positions < t and the queue
 * at step t (order[t .. tail)) are the old ones; from there the run goes on with the remaining
 * in-degrees of the nodes not yet queued, counted from the edges out of order[t ..). */
#include "ir.h"

#include <string.h>

/* Edges g->edges[t->n_edges ..) not dead into the out-lists (after the CSR part, in creation
 * order, as a CSR built now would hold them) and the in-degrees; the earliest step they change
 * (t->n_nodes: none). */
static uint32_t take_new_edges(struct ir_topo *t, const struct ir_graph *g) {
  uint32_t first_change = t->n_nodes;
  for (uint32_t i = t->n_edges; i < g->edges->len; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    uint32_t k = t->extra->len;
    struct ir_topo_extra x = {.dst = e->dst, .next = IR_NONE};
    g_array_append_val(t->extra, x);
    if (t->extra_head[e->src] == IR_NONE)
      t->extra_head[e->src] = k;
    else
      g_array_index(t->extra, struct ir_topo_extra, t->extra_tail[e->src]).next = k;
    t->extra_tail[e->src] = k;
    t->indeg[e->dst]++;
    uint32_t enq = t->enq[e->dst];
    if (enq == IR_NONE)
      first_change = 0;
    else if (t->pos[e->src] >= enq && enq < first_change)
      first_change = enq;
  }
  t->n_edges = g->edges->len;
  return first_change;
}

/* Takes node v out of the queue at position head: its successors whose last predecessor it
 * is join the queue. */
static void take_out(struct ir_topo *t, uint32_t head) {
  uint32_t v = t->order[head];
  t->pos[v] = head;
  for (uint32_t k = t->out_first[v]; k < t->out_first[v + 1]; k++) {
    uint32_t w = t->out_dst[k];
    if (--t->rem[w] == 0) {
      t->enq[w] = head;
      t->order[t->done++] = w;
    }
  }
  for (uint32_t k = t->extra_head[v]; k != IR_NONE;) {
    const struct ir_topo_extra *x = &g_array_index(t->extra, struct ir_topo_extra, k);
    if (--t->rem[x->dst] == 0) {
      t->enq[x->dst] = head;
      t->order[t->done++] = x->dst;
    }
    k = x->next;
  }
}

/* Runs the queue from step `head` (t->done: its tail); false on a cycle, *stuck a node on it:
 * the lowest-numbered compute node still waiting, else the lowest-numbered node. */
static bool run_queue(struct ir_topo *t, const struct ir_graph *g, uint32_t head,
                      uint32_t *stuck) {
  for (; head < t->done; head++)
    take_out(t, head);
  if (t->done == t->n_nodes)
    return true;
  *stuck = IR_NONE;
  for (uint32_t v = 0; v < t->n_nodes && *stuck == IR_NONE; v++)
    if (t->rem[v] && IR_NODE(g, v)->kind == IR_NODE_COMPUTE)
      *stuck = v;
  for (uint32_t v = 0; v < t->n_nodes && *stuck == IR_NONE; v++)
    if (t->rem[v])
      *stuck = v;
  return false;
}

/* From scratch: sources in id order, then first in, first out. */
static bool run_all(struct ir_topo *t, const struct ir_graph *g, uint32_t *stuck) {
  memcpy(t->rem, t->indeg, t->n_nodes * sizeof *t->rem);
  t->done = 0;
  for (uint32_t v = 0; v < t->n_nodes; v++)
    if (!t->indeg[v]) {
      t->enq[v] = IR_NONE;
      t->order[t->done++] = v;
    }
  return run_queue(t, g, 0, stuck);
}

bool ir_topo_init(struct ir_topo *t, const struct ir_graph *g, uint32_t *stuck) {
  memset(t, 0, sizeof *t);
  uint32_t nn = g->nodes->len, ne = g->edges->len;
  t->n_nodes = nn;
  t->n_edges = ne;
  t->out_first = g_new0(uint32_t, nn + 1);
  t->indeg = g_new0(uint32_t, nn ? nn : 1);
  for (uint32_t i = 0; i < ne; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind != IR_EDGE_DEAD) {
      t->out_first[e->src + 1]++;
      t->indeg[e->dst]++;
    }
  }
  for (uint32_t v = 0; v < nn; v++)
    t->out_first[v + 1] += t->out_first[v];
  t->out_dst = g_new(uint32_t, t->out_first[nn] ? t->out_first[nn] : 1);
  uint32_t *fill = g_memdup2(t->out_first, (nn + 1) * sizeof *fill);
  /* edges keep their creation order inside each list, as ir_adjacency_build's */
  for (uint32_t i = 0; i < ne; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind != IR_EDGE_DEAD)
      t->out_dst[fill[e->src]++] = e->dst;
  }
  g_free(fill);
  t->extra = g_array_new(FALSE, FALSE, sizeof(struct ir_topo_extra));
  t->extra_head = g_new(uint32_t, nn ? nn : 1);
  t->extra_tail = g_new(uint32_t, nn ? nn : 1);
  memset(t->extra_head, 0xff, nn * sizeof *t->extra_head); /* IR_NONE */
  t->order = g_new(uint32_t, nn ? nn : 1);
  t->pos = g_new(uint32_t, nn ? nn : 1);
  t->enq = g_new(uint32_t, nn ? nn : 1);
  t->rem = g_new(uint32_t, nn ? nn : 1);
  return run_all(t, g, stuck);
}

/* One edge into w for remaining_in_degrees: from the prefix, one fewer left (for a node of the
 * suffix); from the suffix, one more. */
static inline void count_edge(struct ir_topo *t, uint32_t w, uint32_t from, bool from_prefix) {
  if (!from_prefix)
    t->rem[w]++;
  else if (t->pos[w] >= from)
    t->rem[w]--;
}

/* The in-degrees left at step `from` of the nodes not yet taken out (order[from ..): the
 * previous positions): their in-edges from nodes at positions >= from. Counted from whichever
 * side holds fewer nodes: the edges out of the suffix, or the in-degree less the edges out of
 * the prefix (no edge goes from the suffix back into the prefix: it would have moved `from`). */
static void remaining_in_degrees(struct ir_topo *t, uint32_t from) {
  bool from_prefix = from < t->n_nodes - from;
  uint32_t lo = from_prefix ? 0 : from, hi = from_prefix ? from : t->n_nodes;
  for (uint32_t i = from; i < t->n_nodes; i++) {
    uint32_t v = t->order[i];
    t->rem[v] = from_prefix ? t->indeg[v] : 0;
  }
  for (uint32_t i = lo; i < hi; i++) {
    uint32_t v = t->order[i];
    for (uint32_t k = t->out_first[v]; k < t->out_first[v + 1]; k++)
      count_edge(t, t->out_dst[k], from, from_prefix);
    for (uint32_t k = t->extra_head[v]; k != IR_NONE;) {
      const struct ir_topo_extra *x = &g_array_index(t->extra, struct ir_topo_extra, k);
      count_edge(t, x->dst, from, from_prefix);
      k = x->next;
    }
  }
}

bool ir_topo_update(struct ir_topo *t, const struct ir_graph *g, uint32_t *stuck) {
  PIPER_ASSERT(g->nodes->len == t->n_nodes && g->edges->len >= t->n_edges);
  bool complete = t->done == t->n_nodes;
  uint32_t from = take_new_edges(t, g);
  if (!complete || from == 0)
    return run_all(t, g, stuck);
  if (from >= t->n_nodes)
    return true;
  /* the queue at step `from`: the nodes queued before it, in order (enq grows along order) */
  uint32_t tail = from;
  while (tail < t->n_nodes && (t->enq[t->order[tail]] == IR_NONE || t->enq[t->order[tail]] < from))
    tail++;
  remaining_in_degrees(t, from);
  t->done = tail;
  return run_queue(t, g, from, stuck);
}

void ir_topo_free(struct ir_topo *t) {
  if (!t)
    return;
  g_free(t->out_first);
  g_free(t->out_dst);
  if (t->extra)
    g_array_free(t->extra, TRUE);
  g_free(t->extra_head);
  g_free(t->extra_tail);
  g_free(t->indeg);
  g_free(t->order);
  g_free(t->pos);
  g_free(t->enq);
  g_free(t->rem);
  memset(t, 0, sizeof *t);
}
