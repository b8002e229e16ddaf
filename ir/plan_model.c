/* plan_model: a plan read from files must agree with the model it embeds (README: "the plan's
 * model must agree with its instructions"). The simulator costs compute from the model and
 * communication from the nodes, and the executor shapes its buffers from the model, so a plan
 * whose "model" was edited (layers, hidden size, vocabulary, experts) would be simulated or
 * trained as something it was not compiled for.
 *
 * The check is structural: what the nodes carry is recomputed from the embedded model the way
 * the compiler computed it, and the first disagreement is named. A stored hash of the model
 * text was the alternative; it was not taken because it changes every written plan (they must
 * stay byte-identical), it is as easy to edit as the model next to it, and it can only say
 * "changed", never what disagrees. What the structure cannot see (a change that moves no byte
 * count, such as num_experts_per_tok on a plan without expert parallelism) only changes FLOPs,
 * which the simulator takes from the model as it now reads.
 *
 * What is recomputed (what a plan's nodes claim about the model; nothing is required of nodes
 * the plan does not have, so a plan built by hand for a test still reads):
 *   - every compute node carries its model segment's tags (layers and the PP split move
 *     segments between regions);
 *   - a segment set holds the parameter bytes of its segments (whole, or divided by their
 *     expert shard degree for an optimizer's set): hidden size, vocabulary, experts, layers;
 *   - a data-parallel collective moves its segment set's bytes; an expert all-to-all moves
 *     tokens x top-k x hidden; the tied-embedding gradient sync moves the embedding matrix;
 *   - a pipeline send or receive moves the activation (or its gradient) of a model edge out of
 *     its segment in forward, into it in backward: sequence length, micro-batch size and
 *     hidden size, which a dense plan shows nowhere else. */
#include <inttypes.h>
#include <stdarg.h>

#include "../base/json.h"
#include "plan-impl.h"

/* What the model says each segment looks like, gathered once. */
struct model_view {
  const struct model *m;
  uint32_t *shard_degree; /* [n_segments]: of its compute nodes, 0 before one is seen */
  uint32_t *tp_degree;    /* [n_segments]: tensor-parallel degree of its compute nodes, 0 none */
  bool *sequence_parallel;
};

static bool fail_node(GError **err, const char *file, const struct plan *p, uint32_t i,
                      const char *fmt, ...) G_GNUC_PRINTF(5, 6);

/* "<file>: node <i> "<name>": the embedded "model" disagrees: <what>" */
static bool fail_node(GError **err, const char *file, const struct plan *p, uint32_t i,
                      const char *fmt, ...) {
  char name[PLAN_NAME_LEN];
  plan_node_name(p, i, name, sizeof name);
  va_list ap;
  va_start(ap, fmt);
  char *what = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  piper_input_error(err, "%s: node %u \"%s\": the embedded \"model\" disagrees: %s", file, i, name,
                    what);
  g_free(what);
  return false;
}

static bool check_compute(struct model_view *v, const struct plan *p, uint32_t i, const char *file,
                          GError **err) {
  const struct ir_node *n = &p->nodes[i];
  if (n->segment == IR_NONE)
    return fail_node(err, file, p, i, "a compute node needs a model segment");
  const struct model_segment *ms = &v->m->segments[n->segment];
  for (uint32_t t = 0; t < v->m->n_tags; t++)
    if (n->tags[t] != ms->tags[t])
      return fail_node(err, file, p, i, "tag %.*s is %d, the model's segment %u has %d",
                       MODEL_TAG_NAME_MAX, v->m->tag_names[t], n->tags[t], n->segment, ms->tags[t]);
  if (!v->shard_degree[n->segment])
    v->shard_degree[n->segment] = n->shard_degree ? n->shard_degree : 1;
  if (n->tp_degree > 1 && !v->tp_degree[n->segment]) {
    v->tp_degree[n->segment] = n->tp_degree;
    v->sequence_parallel[n->segment] = n->sequence_parallel;
  }
  return true;
}

static bool check_segments(struct model_view *v, const struct plan *p, const char *file,
                           GError **err) {
  for (uint32_t i = 0; i < p->n_nodes; i++)
    if (p->nodes[i].kind == IR_NODE_COMPUTE && !check_compute(v, p, i, file, err))
      return false;
  return true;
}

static bool check_segsets(const struct model_view *v, const struct plan *p, const char *file,
                          GError **err) {
  for (uint32_t k = 0; k < p->n_segsets; k++) {
    const struct ir_segset *ss = &p->segsets[k];
    uint64_t whole = 0, sharded = 0;
    for (uint32_t j = 0; j < ss->count; j++) {
      uint32_t s = p->segment_pool[ss->first + j];
      uint64_t pb = ir_tp_segment_param_bytes(v->m, s, v->tp_degree[s]);
      uint32_t deg = v->shard_degree[s] ? v->shard_degree[s] : 1;
      whole += pb;
      sharded += pb / deg;
    }
    if (ss->param_bytes != whole && ss->param_bytes != sharded)
      return piper_input_error(err,
                               "%s: segsets[%u]: \"param_bytes\" is %" PRIu64
                               ", but the embedded \"model\"'s segments in it hold %" PRIu64
                               " bytes of parameters",
                               file, k, ss->param_bytes, whole);
  }
  return true;
}

/* A pipeline transfer of segment s (its producer's): an edge s -> t in forward, t -> s (the
 * gradient flowing back) in backward, of the bytes it moves. */
static bool check_p2p(const struct model_view *v, const struct plan *p, uint32_t i,
                      const char *file, GError **err) {
  const struct ir_node *n = &p->nodes[i];
  const struct model *m = v->m;
  if (n->segment == IR_NONE)
    return true;
  uint64_t seen = 0;
  for (uint32_t k = 0; k < m->n_edges; k++) {
    const struct model_edge *e = &m->edges[k];
    uint32_t end = n->pass == IR_PASS_F ? e->src : e->dst;
    if (end != n->segment)
      continue;
    /* sequence parallelism sends each device's sequence shard */
    uint32_t tp = n->sequence_parallel && n->tp_degree > 1 ? n->tp_degree : 1;
    if (e->bytes / tp == n->bytes)
      return true;
    seen = e->bytes;
  }
  if (!seen)
    return true; /* no edge of the model touches it: a hand-built plan's own transfer */
  return fail_node(err, file, p, i,
                   "it moves %" PRIu64 " bytes, the model's activations there are %" PRIu64
                   " bytes (sequence length x micro-batch size x hidden x dtype)",
                   n->bytes, seen);
}

static bool check_comm(const struct model_view *v, const struct plan *p, uint32_t i,
                       const char *file, GError **err) {
  const struct ir_node *n = &p->nodes[i];
  const struct model *m = v->m;
  uint64_t want;
  switch (n->kind) {
  case IR_NODE_ALL_TO_ALL:
    want = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->experts_per_tok *
           (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
    if (n->sequence_parallel && n->tp_degree > 1)
      want /= n->tp_degree; /* each device routes its sequence shard */
    break;
  case IR_NODE_ALL_REDUCE:
  case IR_NODE_REDUCE_SCATTER:
  case IR_NODE_ALL_GATHER:
    if (n->purpose == IR_COMM_TP || n->purpose == IR_COMM_CP) {
      uint32_t count;
      if (n->segment == IR_NONE || n->segment >= m->n_segments)
        return fail_node(err, file, p, i, "a %s collective needs a model segment",
                         plan_purpose_names[n->purpose]);
      if (n->purpose == IR_COMM_TP)
        ir_tp_segment_comm(m, n->segment, n->pass, &want, &count);
      else /* cp: the K/V of the segment's attention layers */
        ir_cp_segment_kv(m, n->segment, n->tp_degree, &want, &count);
      if (n->collectives != (count > 1 ? count : 0))
        return fail_node(err, file, p, i, "it stands for %u collectives, the model gives %u",
                         n->collectives, count);
      break;
    }
    if (n->segset != IR_NONE) {
      want = p->segsets[n->segset].param_bytes;
      break;
    }
    if (!ir_node_is_tied_sync(n))
      return true;
    want = (uint64_t)m->vocab_size * (uint64_t)m->hidden_size * model_dtype_bytes(m->dtype);
    break;
  case IR_NODE_SEND:
  case IR_NODE_RECV: return check_p2p(v, p, i, file, err);
  default: return true;
  }
  if (n->bytes == want)
    return true;
  return fail_node(err, file, p, i, "it moves %" PRIu64 " bytes, the model gives %" PRIu64,
                   n->bytes, want);
}

bool plan_check_model(const struct plan *p, const char *file, GError **err) {
  const struct model *m = p->model;
  uint32_t ns = m->n_segments ? m->n_segments : 1;
  struct model_view v = {.m = m,
                         .shard_degree = g_new0(uint32_t, ns),
                         .tp_degree = g_new0(uint32_t, ns),
                         .sequence_parallel = g_new0(bool, ns)};
  bool ok = check_segments(&v, p, file, err) && check_segsets(&v, p, file, err);
  for (uint32_t i = 0; ok && i < p->n_nodes; i++)
    ok = check_comm(&v, p, i, file, err);
  g_free(v.shard_degree);
  g_free(v.tp_degree);
  g_free(v.sequence_parallel);
  return ok;
}

/* n_microbatches is what the splits made: each split adds its own tag (a dimension name is
 * never split twice) and numbers its copies 0 .. n-1, so the product over the tags beyond the
 * model's of (largest value + 1) is the count the compiler multiplied up. The executor runs
 * that many micro-batches and the simulator counts that many in its tokens per step, so a
 * count edited in plan.json would train and report a different batch than the instructions. */
static bool check_microbatches(const struct plan *p, const char *file, GError **err) {
  uint64_t want = 1;
  for (uint32_t t = p->model->n_tags; t < p->n_tags; t++) {
    int32_t top = -1;
    for (uint32_t i = 0; i < p->n_nodes; i++)
      if (p->nodes[i].tags[t] > top)
        top = p->nodes[i].tags[t];
    want *= (uint64_t)(top + 1 > 0 ? top + 1 : 1);
    if (want > PLAN_MAX_MICROBATCHES)
      break;
  }
  if (p->n_microbatches == want)
    return true;
  return piper_input_error(err,
                           "%s: \"n_microbatches\" is %u, but the nodes' split tags number %" PRIu64
                           " micro-batches",
                           file, p->n_microbatches, want);
}

/* A compute instruction's "work" tensor holds what lowering gave it from the model's shapes
 * (plan_compute_work_bytes): sequence length and micro-batch size show there even on a plan
 * with no transfer between stages (one device, or data parallelism only), where nothing else
 * carries them. The simulator's memory comes from the tensors and its times from the model, so
 * both must describe the same shapes. (Every workspace is linear in sequence length x
 * micro-batch size, so an edit that keeps their product gives exactly the plan piper-compile
 * writes for the edited model: nothing disagrees, and the plan runs as the model it names.) */
static bool check_class_work(const struct plan *p, uint32_t cls, const char *file, GError **err) {
  const struct plan_class *c = &p->classes[cls];
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    uint64_t want = plan_compute_work_bytes(p->model, n), have = 0;
    uint32_t found = 0;
    for (uint32_t w = 0; w < c->instrs[i].write_count; w++) {
      const struct plan_tensor *t = &c->tensors[c->writes[c->instrs[i].write_first + w]];
      if (t->kind == PLAN_TENSOR_WORK) {
        have = t->bytes;
        found++;
      }
    }
    if (found <= 1 && have == want)
      continue;
    char name[PLAN_NAME_LEN];
    plan_node_name(p, c->instrs[i].node, name, sizeof name);
    return piper_input_error(err,
                             "%s: class %u, instruction %u \"%s\": its \"work\" tensors hold "
                             "%" PRIu64 " bytes in %u, the embedded \"model\" gives %" PRIu64
                             " (sequence length x micro-batch size x hidden sizes)",
                             file, cls, i, name, have, found, want);
  }
  return true;
}

static bool has_work_tensors(const struct plan *p) {
  for (uint32_t c = 0; c < p->n_classes; c++)
    for (uint32_t t = 0; t < p->classes[c].n_tensors; t++)
      if (p->classes[c].tensors[t].kind == PLAN_TENSOR_WORK)
        return true;
  return false;
}

/* Which of segment and segset a node of this kind carries (lowering's rule): a segment's own
 * work (compute, its transfers, its all-to-all, its tensor-parallel collectives) names the
 * segment; an update or a data-parallel collective names the set of segments it covers. The
 * other field stays null: the simulator and the executor read whichever is there (a segset
 * on a compute node, a segment on an optimizer, changed what they did). The tied embedding's
 * sync is the all-reduce without a set (ir_node_is_tied_sync): it names the head's segment. */
static bool names_segment(const struct ir_node *n) {
  switch (n->kind) {
  case IR_NODE_OPTIMIZER: return false;
  case IR_NODE_ALL_REDUCE: return n->purpose == IR_COMM_TP || ir_node_is_tied_sync(n);
  case IR_NODE_REDUCE_SCATTER:
  case IR_NODE_ALL_GATHER: return n->purpose == IR_COMM_TP || n->purpose == IR_COMM_CP;
  default: return true;
  }
}

static bool check_node_fields(const struct plan *p, uint32_t i, const char *file, GError **err) {
  const struct ir_node *n = &p->nodes[i];
  const struct model *m = p->model;
  if (!names_segment(n) && n->segment != IR_NONE)
    return fail_node(err, file, p, i, "a %s node has \"segment\" null", ir_node_kind_name(n->kind));
  if (names_segment(n) && n->segset != IR_NONE)
    return fail_node(err, file, p, i, "a %s node has \"segset\" null", ir_node_kind_name(n->kind));
  /* its model tags are its segment's, or (an update, a DP collective) one of its segments' */
  for (uint32_t t = 0; t < m->n_tags; t++) {
    if (n->segment != IR_NONE && n->tags[t] != m->segments[n->segment].tags[t])
      return fail_node(err, file, p, i, "tag %.*s is %d, the model's segment %u has %d",
                       MODEL_TAG_NAME_MAX, m->tag_names[t], n->tags[t], n->segment,
                       m->segments[n->segment].tags[t]);
    if (n->segset == IR_NONE || n->tags[t] < 0)
      continue;
    /* a bucket may span regions: one of its segments has the node's tag */
    const struct ir_segset *ss = &p->segsets[n->segset];
    bool found = false;
    for (uint32_t j = 0; j < ss->count && !found; j++)
      found = m->segments[p->segment_pool[ss->first + j]].tags[t] == n->tags[t];
    if (!found)
      return fail_node(err, file, p, i, "tag %.*s is %d, no segment of its segment set has it",
                       MODEL_TAG_NAME_MAX, m->tag_names[t], n->tags[t]);
  }
  /* a send and its receive are one transfer of one segment: the same tags */
  if ((n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV) && n->pair != IR_NONE &&
      n->segment != IR_NONE && p->nodes[n->pair].segment != IR_NONE)
    for (uint32_t t = 0; t < p->n_tags; t++)
      if (p->nodes[n->pair].tags[t] != n->tags[t])
        return fail_node(err, file, p, i, "tag %.*s is %d, its pair (node %u) has %d",
                         MODEL_TAG_NAME_MAX, p->tag_names[t], n->tags[t], n->pair,
                         p->nodes[n->pair].tags[t]);
  return true;
}

/* Micro-batch numbers (the split tags) follow the data: a tensor's producer and each of its
 * consumers that carry a split tag carry the same value (the executor picks each compute
 * node's micro-batch of data by it). */
static bool check_class_microbatches(const struct plan *p, uint32_t cls, const char *file,
                                     GError **err) {
  const struct plan_class *c = &p->classes[cls];
  for (uint32_t x = 0; x < c->n_tensors; x++) {
    const struct plan_tensor *tn = &c->tensors[x];
    const struct ir_node *a = &p->nodes[c->instrs[tn->producer].node];
    for (uint32_t j = 0; j < tn->consumer_count; j++) {
      uint32_t u = c->consumers[tn->consumer_first + j];
      const struct ir_node *b = &p->nodes[c->instrs[u].node];
      for (uint32_t t = p->model->n_tags; t < p->n_tags; t++)
        if (a->tags[t] >= 0 && b->tags[t] >= 0 && a->tags[t] != b->tags[t])
          return fail_node(err, file, p, c->instrs[u].node,
                           "tag %.*s is %d, but it reads tensor %u of class %u from node %u, "
                           "which has %d",
                           MODEL_TAG_NAME_MAX, p->tag_names[t], b->tags[t], x, cls,
                           c->instrs[tn->producer].node, a->tags[t]);
    }
  }
  return true;
}

/* The one device group that runs segment s's compute nodes; IR_NONE when none or several. */
static uint32_t segment_group(const struct plan *p, uint32_t s) {
  uint32_t grp = IR_NONE;
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    const struct ir_node *n = &p->nodes[i];
    if (n->kind != IR_NODE_COMPUTE || n->segment != s)
      continue;
    if (grp != IR_NONE && grp != n->group)
      return IR_NONE;
    grp = n->group;
  }
  return grp;
}

static bool groups_share_a_device(const struct plan *p, uint32_t a, uint32_t b) {
  const struct ir_group *x = &p->groups[a], *y = &p->groups[b];
  for (uint32_t i = 0; i < x->count; i++)
    for (uint32_t j = 0; j < y->count; j++)
      if (p->device_pool[x->first + i] == p->device_pool[y->first + j])
        return true;
  return false;
}

/* A tied embedding split across stages is synced by one all-reduce per data-parallel position
 * (directives/apply.c, insert_tied_sync): as many tied syncs as the model and the placement
 * call for, so that "tie_word_embeddings" edited either way is seen (the head's copy has the
 * same bytes as an untied head). */
static bool check_tied(const struct plan *p, const char *file, GError **err) {
  const struct model *m = p->model;
  uint32_t emb = IR_NONE, head = IR_NONE, have = 0, want = 0;
  for (uint32_t s = 0; s < m->n_segments; s++)
    for (uint32_t o = m->segments[s].op_first;
         o < m->segments[s].op_first + m->segments[s].op_count; o++) {
      if (m->ops[o].kind == MODEL_OP_EMBEDDING)
        emb = s;
      if (m->ops[o].kind == MODEL_OP_LM_HEAD_LOSS && m->ops[o].param_count > 0)
        head = s;
    }
  for (uint32_t i = 0; i < p->n_nodes; i++)
    have += ir_node_is_tied_sync(&p->nodes[i]);
  if (m->tie_word_embeddings && emb != IR_NONE && head != IR_NONE && emb != head) {
    uint32_t ge = segment_group(p, emb), gh = segment_group(p, head);
    if (ge == IR_NONE || gh == IR_NONE)
      return true; /* copies on several groups: the executor refuses those itself */
    if (!groups_share_a_device(p, ge, gh))
      want = p->groups[ge].count;
  }
  if (have == want)
    return true;
  return piper_input_error(err,
                           "%s: %u tied-embedding syncs, but the embedded \"model\" (\"tie_word_"
                           "embeddings\": %s) and the placement call for %u",
                           file, have, m->tie_word_embeddings ? "true" : "false", want);
}

bool plan_check_instructions(const struct plan *p, const char *file, GError **err) {
  if (!check_microbatches(p, file, err) || !check_tied(p, file, err))
    return false;
  for (uint32_t i = 0; i < p->n_nodes; i++)
    if (!check_node_fields(p, i, file, err))
      return false;
  for (uint32_t c = 0; c < p->n_classes; c++)
    if (!check_class_microbatches(p, c, file, err))
      return false;
  /* Lowering gives every compute instruction its workspace; a plan built by hand for a test
   * may give none at all (nothing is required of what a plan does not have), never some. */
  if (!has_work_tensors(p))
    return true;
  for (uint32_t c = 0; c < p->n_classes; c++)
    if (!check_class_work(p, c, file, err))
      return false;
  return true;
}
