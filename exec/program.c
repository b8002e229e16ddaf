/* program: what the plan means for training on one device, derived from the plan alone (so
 * plans read from disk run as well as plans compiled in-process; the model level is model.c).
 *
 * A send/recv carries one model edge (values in F, their gradients in backward), found from
 * the segment of the sending node and the segment that consumes the receive; an all-to-all is
 * a dispatch or a combine depending on whether the expert computes its input. */
#include <string.h>

#include "../base/json.h"
#include "exec-impl.h"

static bool fail_instr(const struct plan *p, uint32_t device, uint32_t node, GError **err,
                       const char *what) {
  char nb[256];
  plan_node_name(p, node, nb, sizeof nb);
  return piper_input_error(err, "plan: device %u: instruction \"%s\": %s", device, nb, what);
}

/* First consumer instruction of what instruction i writes, or IR_NONE. */
static uint32_t first_consumer(const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++) {
    const struct plan_tensor *t = &c->tensors[c->writes[in->write_first + w]];
    if (t->consumer_count)
      return c->consumers[t->consumer_first];
  }
  return IR_NONE;
}

static int compare_key(const void *a, const void *b) {
  const struct exec_comm_key *x = a, *y = b;
  if (x->comm != y->comm)
    return x->comm < y->comm ? -1 : 1;
  if (x->stream_a != y->stream_a)
    return x->stream_a < y->stream_a ? -1 : 1;
  return x->stream_b < y->stream_b ? -1 : x->stream_b > y->stream_b;
}

static struct exec_comm_key key_of(const struct plan *p, const struct plan_instr *in) {
  const struct ir_node *n = &p->nodes[in->node];
  struct exec_comm_key k = {in->comm, n->stream, IR_NONE};
  if (n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV) {
    uint32_t other = n->pair < p->n_nodes ? p->nodes[n->pair].stream : IR_NONE;
    k.stream_a = n->kind == IR_NODE_SEND ? n->stream : other;
    k.stream_b = n->kind == IR_NODE_SEND ? other : n->stream;
  }
  return k;
}

void exec_device_clear(struct exec_device *d) {
  if (!d)
    return;
  g_free(d->instrs);
  g_free(d->holds);
  g_free(d->param_offset);
  g_free(d->param_local);
  g_free(d->bucket_of);
  g_free(d->ep_size);
  g_free(d->ep_rank);
  g_free(d->route_split);
  for (uint32_t b = 0; b < d->n_buckets; b++)
    g_free(d->buckets[b].segs);
  g_free(d->buckets);
  g_free(d->mb_instr_count);
  g_free(d->comm_keys);
  g_free(d->op_offset);
  memset(d, 0, sizeof *d);
}

/* Which class this device runs, its micro-batches and the one tag that numbers them. */
static bool device_shape(struct exec_device *d, uint32_t device, GError **err) {
  const struct plan *p = d->plan;
  if (device >= p->n_devices)
    return piper_input_error(err,
                             "plan: the plan has %u devices but this process is rank %u (launch "
                             "as many processes as devices)",
                             p->n_devices, device);
  d->class_id = p->device_class[device];
  d->cls = plan_device_class(p, device);
  d->M = p->n_microbatches ? p->n_microbatches : 1;
  d->mb_tag = -1;
  for (uint32_t t = d->xm->m->n_tags; t < p->n_tags; t++) {
    if (d->mb_tag >= 0)
      return piper_input_error(err,
                               "plan: the program splits micro-batches along two dimensions (%s "
                               "and %s); the executor needs one",
                               p->tag_names[d->mb_tag], p->tag_names[t]);
    d->mb_tag = (int)t;
  }
  return true;
}

/* DP degree (every compute node of the plan has the same number of replicas) and this
 * device's position in its data-parallel groups (the same in all of them). */
static bool data_parallel_place(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  d->dp_degree = 0;
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    const struct ir_node *n = &p->nodes[i];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    if (d->dp_degree == 0)
      d->dp_degree = n->replica_degree;
    if (n->replica_degree != d->dp_degree)
      return fail_instr(p, d->device, i, err,
                        "regions are replicated over different numbers of devices; the "
                        "executor needs one data-parallel degree for the whole model");
  }
  if (d->dp_degree == 0)
    d->dp_degree = 1;
  d->dp_rank = 0;
  bool dp_set = false;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_COMPUTE || d->dp_degree == 1)
      continue;
    /* TP innermost in the group: the data-parallel rank is the position over the degree */
    int pos = plan_node_position(p, c->instrs[i].node, d->device) / (int)d->tp_degree;
    if (dp_set && (uint32_t)pos != d->dp_rank)
      return fail_instr(p, d->device, c->instrs[i].node, err,
                        "this device has different positions in its data-parallel groups");
    d->dp_rank = (uint32_t)pos;
    dp_set = true;
  }
  return true;
}

static void device_alloc(struct exec_device *d) {
  uint32_t ns = d->xm->m->n_segments, n = d->cls->n_instrs;
  d->n_instrs = n;
  d->instrs = g_new0(struct exec_instr, n ? n : 1);
  d->holds = g_new0(bool, ns ? ns : 1);
  d->param_offset = g_new0(uint64_t, ns ? ns : 1);
  d->param_local = g_new0(uint64_t, ns ? ns : 1);
  d->bucket_of = g_new(uint32_t, ns ? ns : 1);
  d->ep_size = g_new(uint32_t, ns ? ns : 1);
  d->ep_rank = g_new0(uint32_t, ns ? ns : 1);
  d->route_split = g_new(uint32_t, ns ? ns : 1);
  for (uint32_t s = 0; s < ns; s++) {
    d->bucket_of[s] = IR_NONE;
    d->ep_size[s] = 1;
    d->route_split[s] = 1;
  }
  d->mb_instr_count = g_new0(uint32_t, d->M);
  d->op_offset = g_new0(uint64_t, d->xm->m->n_ops ? d->xm->m->n_ops : 1);
}

/* What decoding the instructions collects on the way. */
struct decoder {
  struct exec_device *d;
  GArray *buckets;          /* struct exec_bucket */
  GHashTable **class_index; /* [n_classes]: node + 1 -> instruction + 1, built on demand */
};

static bool fail_at(const struct decoder *dc, uint32_t i, GError **err, const char *what) {
  return fail_instr(dc->d->plan, dc->d->device, dc->d->cls->instrs[i].node, err, what);
}

static bool decode_compute(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct ir_node *n = &p->nodes[d->cls->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  x->role = EXEC_ROLE_COMPUTE;
  if (n->segment >= d->xm->m->n_segments || n->pass == IR_PASS_NONE)
    return fail_at(dc, i, err, "is a compute node without a segment and pass");
  x->segment = n->segment;
  d->holds[n->segment] = true;
  if (!d->xm->m->segments[n->segment].expert)
    return true;
  /* R of experts reruns them on the rows its F kept, routed as F routed them
   * (expert_parallel.c, expert_forward): a micro-batch's routing is computed once, and no
   * all-to-all reruns */
  if (n->shard_degree <= 1)
    return true;
  if (d->xm->E % (int)n->shard_degree != 0)
    return fail_at(dc, i, err, "shards experts unevenly");
  /* carved with one expert-DP rank (EP x expert TP = the group): no replicas to sync */
  bool unreplicated = p->groups[n->group].count ==
                      n->shard_degree * (n->tp_degree > 1 ? n->tp_degree : 1);
  if (n->replica_degree != 1 && n->replica_degree != n->shard_degree && n->expert_replicas <= 1 &&
      !unreplicated)
    /* experts outside expert-DP groups are never gradient-synced: replicas in other EP groups
     * would drift */
    return fail_at(dc, i, err,
                   "replicates sharded experts over a different group than it shards them");
  d->ep_size[n->segment] = n->shard_degree;
  /* the expert grid (ir.h): expert-TP innermost, then EP, then expert DP; with EP = DP the EP
   * rank is the position's data-parallel rank (tensor_parallel.c) */
  uint32_t pos = (uint32_t)plan_node_position(p, x->node, d->device);
  d->ep_rank[n->segment] = pos / (n->tp_degree > 1 ? n->tp_degree : 1) % n->shard_degree;
  d->route_split[n->segment] = n->route_split > 1 ? n->route_split : 1;
  return true;
}

/* The instruction of the peer's class that runs node `node`, or IR_NONE. */
static uint32_t peer_instr(struct decoder *dc, uint32_t peer_class, uint32_t node) {
  const struct plan_class *rc = &dc->d->plan->classes[peer_class];
  if (!dc->class_index[peer_class]) {
    dc->class_index[peer_class] = g_hash_table_new(NULL, NULL);
    for (uint32_t k = 0; k < rc->n_instrs; k++)
      g_hash_table_insert(dc->class_index[peer_class], GUINT_TO_POINTER(rc->instrs[k].node + 1),
                          GUINT_TO_POINTER(k + 1));
  }
  uint32_t ri = GPOINTER_TO_UINT(
      g_hash_table_lookup(dc->class_index[peer_class], GUINT_TO_POINTER(node + 1)));
  return ri ? ri - 1 : IR_NONE;
}

/* A send or receive: its peer and the model edge it carries (named by the receiving side's
 * consumer). */
static bool decode_transfer(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct ir_node *n = &p->nodes[d->cls->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  x->role = n->kind == IR_NODE_SEND ? EXEC_ROLE_SEND : EXEC_ROLE_RECV;
  x->peer = plan_peer(p, x->node, d->device);
  if (x->peer == IR_NONE || x->peer >= p->n_devices || n->pair >= p->n_nodes)
    return fail_at(dc, i, err, "has no peer device");
  const struct plan_class *rc = d->cls;
  uint32_t ri = i;
  if (n->kind == IR_NODE_SEND) {
    rc = &p->classes[p->device_class[x->peer]];
    ri = peer_instr(dc, p->device_class[x->peer], n->pair);
    if (ri == IR_NONE)
      return fail_at(dc, i, err, "its receive is not in the peer's plan");
  }
  uint32_t ci = first_consumer(rc, ri);
  const struct ir_node *cn = ci == IR_NONE ? NULL : &p->nodes[rc->instrs[ci].node];
  if (!cn || cn->kind != IR_NODE_COMPUTE)
    return fail_at(dc, i, err,
                   "the data it carries is not consumed by a compute node (expert parallelism "
                   "needs the expert region on the devices of its neighbours)");
  bool fwd = n->pass == IR_PASS_F;
  if (fwd != (cn->pass == IR_PASS_F) || cn->pass == IR_PASS_BW)
    return fail_at(dc, i, err,
                   "carries activations saved for backward between devices; place the forward "
                   "and backward of a region on the same devices");
  uint32_t a = n->segment, bseg = cn->segment;
  x->segment = a;
  x->edge = exec_model_edge(d->xm, a < bseg ? a : bseg, a < bseg ? bseg : a);
  if (x->edge == IR_NONE)
    return fail_at(dc, i, err, "joins segments that no model edge joins");
  return true;
}

/* The producer of the first tensor instruction i reads that a compute instruction wrote, and
 * the first consumer of i's first "out" tensor: an all-to-all also reads and writes the
 * routing tables (ir/expert.c), between all-to-alls. IR_NONE if none. */
static uint32_t a2a_producer(const struct plan *p, const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t r = 0; r < in->read_count; r++) {
    uint32_t pr = c->tensors[c->reads[in->read_first + r]].producer;
    if (p->nodes[c->instrs[pr].node].kind == IR_NODE_COMPUTE)
      return pr;
  }
  return IR_NONE;
}

static uint32_t a2a_consumer(const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++) {
    const struct plan_tensor *t = &c->tensors[c->writes[in->write_first + w]];
    if (t->kind == PLAN_TENSOR_OUT && t->consumer_count)
      return c->consumers[t->consumer_first];
  }
  return IR_NONE;
}

/* Whether all-to-all i reads what a compute of segment e wrote: a combine (or the dispatch's
 * transpose). A combine under full recomputation also reads the router's output (its routing
 * weights), so the producer it reads first need not be the experts. */
static bool a2a_reads_segment(const struct plan *p, const struct plan_class *c, uint32_t i,
                              uint32_t e) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t r = 0; r < in->read_count; r++) {
    uint32_t pr = c->tensors[c->reads[in->read_first + r]].producer;
    const struct ir_node *pn = &p->nodes[c->instrs[pr].node];
    if (pn->kind == IR_NODE_COMPUTE && pn->segment == e)
      return true;
  }
  return false;
}

/* The segment expert segment e's output goes to (its combine's other side). */
static uint32_t a2a_next_segment(const struct model *m, uint32_t e) {
  for (uint32_t k = 0; k < m->n_edges; k++)
    if (m->edges[k].src == e)
      return m->edges[k].dst;
  return IR_NONE;
}

/* An all-to-all: dispatch or combine, by which side of it the expert segment is. */
static bool decode_all_to_all(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  const struct ir_node *n = &p->nodes[c->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  uint32_t e = n->segment;
  uint32_t pr = a2a_producer(p, c, i), co = a2a_consumer(c, i);
  const struct ir_node *pn = pr == IR_NONE ? NULL : &p->nodes[c->instrs[pr].node];
  const struct ir_node *cn = co == IR_NONE ? NULL : &p->nodes[c->instrs[co].node];
  if (n->pass == IR_PASS_R && !cn && pn && pn->segment == e)
    cn = pn; /* the rerun's combine (directives/apply.c, insert_expert_reruns) */
  if (!pn || !cn || pn->kind != IR_NODE_COMPUTE || cn->kind != IR_NODE_COMPUTE)
    return fail_at(dc, i, err,
                   "expert parallelism needs the expert region and its neighbours on the same "
                   "devices");
  bool from = a2a_reads_segment(p, c, i, e);
  x->role = from ? EXEC_ROLE_A2A_FROM_EXPERT : EXEC_ROLE_A2A_TO_EXPERT;
  uint32_t other = from ? cn->segment : pn->segment;
  if (from && cn->segment == e) /* a rerun's combine: read by the transpose alone */
    other = a2a_next_segment(d->xm->m, e);
  x->segment = e;
  x->edge = exec_model_edge(d->xm, e < other ? e : other, e < other ? other : e);
  if (e >= d->xm->m->n_segments || !d->xm->m->segments[e].expert || x->edge == IR_NONE)
    return fail_at(dc, i, err, "is an all-to-all that serves no expert region edge");
  return true;
}

/* How many instances the instruction's communicator splits its group into (1: none). */
static uint32_t pi_split(const struct plan *p, const struct plan_instr *pi) {
  if (pi->comm == IR_NONE || pi->comm >= p->n_comms)
    return 1;
  return p->comms[pi->comm].split > 1 ? p->comms[pi->comm].split : 1;
}

/* An all-reduce or reduce-scatter: a gradient bucket. */
static bool decode_bucket(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct ir_node *n = &p->nodes[d->cls->instrs[i].node];
  struct exec_instr *x = &d->instrs[i];
  x->role = n->kind == IR_NODE_ALL_REDUCE ? EXEC_ROLE_ALL_REDUCE : EXEC_ROLE_REDUCE_SCATTER;
  if (n->segset >= p->n_segsets)
    return fail_at(dc, i, err, "has no segment set");
  const struct ir_segset *ss = &p->segsets[n->segset];
  /* under TP the group's instance is the devices with this one's TP rank (plan_comm.split) */
  uint32_t split = pi_split(p, &d->cls->instrs[i]);
  struct exec_bucket bk = {.node = x->node,
                           .n_segs = ss->count,
                           .segs = g_memdup2(&p->segment_pool[ss->first],
                                             (ss->count ? ss->count : 1) * sizeof(uint32_t)),
                           .group_size = p->groups[n->group].count / split,
                           .rank = (uint32_t)plan_node_position(p, x->node, d->device) / split,
                           .sharded_optimizer = n->kind == IR_NODE_REDUCE_SCATTER,
                           .sharded_grads = n->shard_grads,
                           .sharded_params = n->shard_params};
  x->bucket = dc->buckets->len;
  g_array_append_val(dc->buckets, bk);
  return true;
}

/* Instruction i's common fields and its micro-batch, then what its kind means. */
static bool decode_instr(struct decoder *dc, uint32_t i, GError **err) {
  struct exec_device *d = dc->d;
  const struct plan *p = d->plan;
  const struct plan_instr *pi = &d->cls->instrs[i];
  const struct ir_node *n = &p->nodes[pi->node];
  struct exec_instr *x = &d->instrs[i];
  x->node = pi->node;
  x->stream = pi->stream;
  x->pass = n->pass;
  x->segment = x->edge = x->peer = x->comm = x->bucket = x->gather = x->segset = x->tp_compute =
      IR_NONE;
  x->mb = -1;
  bool per_mb = n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV ||
                n->kind == IR_NODE_ALL_TO_ALL || n->purpose == IR_COMM_TP ||
                n->purpose == IR_COMM_CP ||
                (n->kind == IR_NODE_ALL_GATHER && n->pass != IR_PASS_NONE);
  if (per_mb) {
    int32_t v = d->mb_tag >= 0 ? n->tags[d->mb_tag] : 0;
    if (v < 0 || (uint32_t)v >= d->M)
      return fail_at(dc, i, err, "has no micro-batch index in range");
    x->mb = v;
    d->mb_instr_count[v]++;
  }
  if (n->purpose == IR_COMM_TP) { /* run inside its compute (tp.c) */
    x->role = EXEC_ROLE_TP;
    x->segment = n->segment;
    return true;
  }
  if (n->purpose == IR_COMM_CP) { /* run inside its attention (context_parallel.c) */
    x->role = EXEC_ROLE_CP;
    x->segment = n->segment;
    return true;
  }
  switch (n->kind) {
  case IR_NODE_COMPUTE: return decode_compute(dc, i, err);
  case IR_NODE_SEND:
  case IR_NODE_RECV: return decode_transfer(dc, i, err);
  case IR_NODE_ALL_TO_ALL: return decode_all_to_all(dc, i, err);
  case IR_NODE_ALL_REDUCE:
    if (ir_node_is_tied_sync(n)) {
      x->role = EXEC_ROLE_TIED_SYNC; /* its copy is found once every compute is decoded */
      return true;
    }
    return decode_bucket(dc, i, err);
  case IR_NODE_REDUCE_SCATTER: return decode_bucket(dc, i, err);
  case IR_NODE_ALL_GATHER:
    x->role = n->pass == IR_PASS_NONE ? EXEC_ROLE_GATHER_UPDATE : EXEC_ROLE_GATHER_USE;
    x->segset = n->segset;
    return true;
  case IR_NODE_OPTIMIZER:
    x->role = EXEC_ROLE_OPTIMIZER;
    x->segset = n->segset;
    if (n->segset >= p->n_segsets)
      return fail_at(dc, i, err, "has no segment set");
    return true;
  default: return fail_at(dc, i, err, "has an unknown kind");
  }
}

static void link_groups(struct exec_device *d);

static bool same_segments(const struct exec_bucket *x, const struct exec_bucket *y) {
  if (x->n_segs != y->n_segs)
    return false;
  for (uint32_t j = 0; j < x->n_segs; j++)
    if (x->segs[j] != y->segs[j])
      return false;
  return true;
}

/* DualPipe under ZeRO-1/2 (directives/apply.c, zero_copy_buckets): the copies' sum of a
 * bucket is an all-reduce naming the segments of one of this device's reduce-scatters, run
 * on that bucket's whole gradients before it. It is no bucket of its own: a segment lives in
 * one bucket. */
static void alias_copy_sums(struct exec_device *d, GArray *buckets) {
  for (uint32_t b = 0; b < buckets->len; b++) {
    struct exec_bucket *ar = &g_array_index(buckets, struct exec_bucket, b);
    if (ar->sharded_optimizer)
      continue;
    uint32_t rs = 0;
    while (rs < buckets->len &&
           !(g_array_index(buckets, struct exec_bucket, rs).sharded_optimizer &&
             same_segments(ar, &g_array_index(buckets, struct exec_bucket, rs))))
      rs++;
    if (rs == buckets->len)
      continue;
    g_free(ar->segs);
    g_array_remove_index(buckets, b);
    for (uint32_t i = 0; i < d->n_instrs; i++) {
      struct exec_instr *x = &d->instrs[i];
      if (x->bucket == b)
        x->bucket = rs > b ? rs - 1 : rs;
      else if (x->bucket != IR_NONE && x->bucket > b)
        x->bucket--;
    }
    b--;
  }
}

static bool decode_instrs(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  struct decoder dc = {d, g_array_new(FALSE, TRUE, sizeof(struct exec_bucket)),
                       g_new0(GHashTable *, p->n_classes)};
  bool ok = true;
  for (uint32_t i = 0; i < d->cls->n_instrs && ok; i++)
    ok = decode_instr(&dc, i, err);
  if (ok)
    alias_copy_sums(d, dc.buckets);
  /* the device owns the buckets from here, so clearing it frees them after a failure too */
  d->n_buckets = dc.buckets->len;
  d->buckets = (struct exec_bucket *)g_array_free(dc.buckets, FALSE);
  for (uint32_t k = 0; k < p->n_classes; k++)
    if (dc.class_index[k])
      g_hash_table_destroy(dc.class_index[k]);
  g_free(dc.class_index);
  if (ok)
    link_groups(d);
  return ok;
}

/* The order in which a group's parts are given to the backend: with each peer (ascending), the
 * lower rank's sends first and the higher rank's receives first. The parts are posted together
 * (see transfer_group), so this order is not needed for progress; it is the one in which parts
 * run one after another would still meet for mirrored groups (Megatron's
 * send_forward_recv_backward against send_backward_recv_forward), which exec_comm_p2p_group's
 * default relies on for a backend without a group of its own. */
struct group_part {
  uint32_t peer, phase, instr;
};

static int compare_group_part(const void *x, const void *y) {
  const struct group_part *a = x, *b = y;
  if (a->peer != b->peer)
    return a->peer < b->peer ? -1 : 1;
  if (a->phase != b->phase)
    return a->phase < b->phase ? -1 : 1;
  return a->instr < b->instr ? -1 : a->instr > b->instr;
}

static void link_group(struct exec_device *d, const uint32_t *entries, uint32_t n) {
  struct group_part *parts = g_new(struct group_part, n);
  for (uint32_t k = 0; k < n; k++) {
    const struct exec_instr *x = &d->instrs[entries[k]];
    bool send_first = d->device < x->peer;
    parts[k] = (struct group_part){x->peer, (x->role == EXEC_ROLE_SEND) != send_first, entries[k]};
  }
  qsort(parts, n, sizeof *parts, compare_group_part);
  struct exec_instr *lead = &d->instrs[entries[0]];
  lead->group_head = parts[0].instr;
  for (uint32_t k = 0; k < n; k++) {
    struct exec_instr *x = &d->instrs[parts[k].instr];
    x->group_lead = entries[0];
    x->group_next = k + 1 < n ? parts[k + 1].instr : IR_NONE;
  }
  g_free(parts);
}

/* Every point-to-point group of the device's streams (see struct exec_instr). */
static void link_groups(struct exec_device *d) {
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    d->instrs[i].group_lead = d->instrs[i].group_head = d->instrs[i].group_next = IR_NONE;
  for (uint32_t s = 0; s < d->plan->n_streams; s++)
    for (uint32_t e = c->stream_first[s]; e < c->stream_first[s + 1];) {
      uint32_t n = plan_group_span(c, e);
      if (n > 1)
        link_group(d, c->stream_instrs + e, n);
      e += n;
    }
}

/* Gathers find their bucket by segment set; compute finds its gathered parameters. */
static bool link_gathers(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    struct exec_instr *x = &d->instrs[i];
    const struct plan_instr *pi = &c->instrs[i];
    if (x->role == EXEC_ROLE_GATHER_USE || x->role == EXEC_ROLE_GATHER_UPDATE) {
      for (uint32_t b = 0; b < d->n_buckets; b++)
        if (p->nodes[d->buckets[b].node].segset == x->segset)
          x->bucket = b;
      if (x->bucket == IR_NONE)
        return fail_instr(p, d->device, x->node, err,
                          "gathers parameters of no gradient bucket here");
      for (uint32_t w = 0; w < pi->write_count; w++)
        x->gather_users += c->tensors[c->writes[pi->write_first + w]].consumer_count;
    }
    if (x->role == EXEC_ROLE_COMPUTE)
      for (uint32_t r = 0; r < pi->read_count; r++) {
        uint32_t prod = c->tensors[c->reads[pi->read_first + r]].producer;
        if (p->nodes[c->instrs[prod].node].kind == IR_NODE_ALL_GATHER)
          x->gather = prod;
      }
  }
  return true;
}

/* Parameter layout: buckets first (contiguous, padded), then the other segments held. */
static bool lay_out_params(struct exec_device *d, GError **err) {
  const struct plan *p = d->plan;
  const struct model *m = d->xm->m;
  uint32_t ns = m->n_segments;
  uint64_t off = 0;
  for (uint32_t s = 0; s < ns; s++) {
    uint64_t n = 0; /* the segment's ops, each as this device holds it (TP slices) */
    for (uint32_t j = 0; j < d->xm->segs[s].n_ops; j++)
      n += exec_tp_op_params(d->xm, &m->ops[d->xm->segs[s].ops[j].op], exec_segment_tp(d, s));
    d->param_local[s] = d->holds[s] ? n / d->ep_size[s] : 0;
  }
  exec_tp_op_offsets(d);
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    struct exec_bucket *bk = &d->buckets[b];
    bk->offset = off;
    for (uint32_t j = 0; j < bk->n_segs; j++) {
      uint32_t s = bk->segs[j];
      /* Sharded experts are synced only between model copies (DualPipe), by an all-reduce of
       * the local experts' gradients with the device holding the same experts in the other
       * copy; ZeRO never shards them. */
      bool sharded_ok = p->nodes[bk->node].kind == IR_NODE_ALL_REDUCE ||
                        p->nodes[bk->node].expert_replicas > 1; /* summed over expert DP */
      if (s >= ns || !d->holds[s] || (d->ep_size[s] > 1 && !sharded_ok) ||
          d->bucket_of[s] != IR_NONE)
        return fail_instr(p, d->device, bk->node, err,
                          "syncs a segment this device does not replicate");
      d->bucket_of[s] = b;
      d->param_offset[s] = off;
      off += d->param_local[s];
    }
    bk->count = off - bk->offset;
    bk->shard = (bk->count + bk->group_size - 1) / bk->group_size;
    bk->padded = bk->shard * bk->group_size;
    off = bk->offset + bk->padded;
  }
  for (uint32_t s = 0; s < ns; s++) {
    if (!d->holds[s] || d->bucket_of[s] != IR_NONE)
      continue;
    d->param_offset[s] = off;
    off += d->param_local[s];
  }
  d->n_params = off;
  exec_store_layout(d);
  return true;
}

/* A tied embedding split across stages trains like one table only when every device holding
 * a copy sums its gradient with the other copy's (the plan's tied sync) over whole, unsharded
 * gradients: each sync finds the copy held here, and a copy without a sync is refused. */
static bool link_tied_syncs(struct exec_device *d, GError **err) {
  const struct exec_model *xm = d->xm;
  uint32_t emb = xm->embedding_seg, head = xm->head_seg, syncs = 0;
  for (uint32_t i = 0; i < d->cls->n_instrs; i++) {
    struct exec_instr *x = &d->instrs[i];
    if (x->role != EXEC_ROLE_TIED_SYNC)
      continue;
    if (!xm->tied_copy)
      return fail_instr(d->plan, d->device, x->node, err,
                        "syncs tied embeddings, but the model keeps no copy of its embedding");
    if (d->holds[emb] == d->holds[head])
      return fail_instr(d->plan, d->device, x->node, err,
                        d->holds[emb] ? "syncs the tied embedding's two copies on one device"
                                      : "syncs a tied embedding this device holds no copy of");
    x->segment = d->holds[emb] ? emb : head;
    uint32_t b = d->bucket_of[x->segment];
    if (b != IR_NONE && d->buckets[b].sharded_optimizer)
      return fail_instr(d->plan, d->device, x->node, err,
                        "syncs a tied embedding whose gradients are sharded (ZeRO): not supported");
    syncs++;
  }
  if (xm->tied_copy && (d->holds[emb] || d->holds[head]) && syncs == 0)
    return piper_input_error(err,
                             "device %u: holds a copy of the tied embedding that the plan never "
                             "syncs with the other (copies on one device group or on several "
                             "model copies are not supported; one PP region ties them in place)",
                             d->device);
  return true;
}

/* Communicators of the whole plan, in one order every rank computes alike, and this device's
 * instructions' places among them. */
static void collect_comm_keys(struct exec_device *d) {
  const struct plan *p = d->plan;
  const struct plan_class *c = d->cls;
  GArray *keys = g_array_new(FALSE, FALSE, sizeof(struct exec_comm_key));
  for (uint32_t k = 0; k < p->n_classes; k++)
    for (uint32_t i = 0; i < p->classes[k].n_instrs; i++) {
      const struct plan_instr *pi = &p->classes[k].instrs[i];
      if (pi->comm == IR_NONE)
        continue;
      struct exec_comm_key key = key_of(p, pi);
      g_array_append_val(keys, key);
    }
  if (keys->len)
    qsort(keys->data, keys->len, sizeof(struct exec_comm_key), compare_key);
  uint32_t w = 0;
  for (uint32_t i = 0; i < keys->len; i++) {
    struct exec_comm_key *ki = &g_array_index(keys, struct exec_comm_key, i);
    if (w > 0 && compare_key(ki, &g_array_index(keys, struct exec_comm_key, w - 1)) == 0)
      continue;
    g_array_index(keys, struct exec_comm_key, w++) = *ki;
  }
  g_array_set_size(keys, w);
  d->n_comm_keys = keys->len;
  d->comm_keys = (struct exec_comm_key *)g_array_free(keys, FALSE);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    if (c->instrs[i].comm == IR_NONE)
      continue;
    struct exec_comm_key key = key_of(p, &c->instrs[i]);
    struct exec_comm_key *hit =
        bsearch(&key, d->comm_keys, d->n_comm_keys, sizeof(struct exec_comm_key), compare_key);
    d->instrs[i].comm = (uint32_t)(hit - d->comm_keys);
    /* sends and receives pair up in sequence order on their communicator */
    d->instrs[i].tag = (int)(c->instrs[i].seq & 0x7fff);
  }
}

bool exec_device_init(struct exec_device *d, const struct plan *p, const struct exec_model *xm,
                      uint32_t device, GError **err) {
  memset(d, 0, sizeof *d);
  d->plan = p;
  d->xm = xm;
  d->device = device;
  if (!device_shape(d, device, err) || !exec_tp_device_init(d, err) ||
      !exec_cp_device_init(d, err) || !data_parallel_place(d, err))
    return false;
  device_alloc(d);
  if (!decode_instrs(d, err) || !link_gathers(d, err) || !lay_out_params(d, err) ||
      !link_tied_syncs(d, err)) {
    exec_device_clear(d);
    return false;
  }
  collect_comm_keys(d);
  if (!exec_tp_link_comm(d, err) || !exec_cp_link_comm(d, err)) {
    exec_device_clear(d);
    return false;
  }
  return true;
}
