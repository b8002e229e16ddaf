/* plan: ownership, per-device views and equality of lowered plans (plan.h).
 * The views resolve what a class leaves open per device (peers, communicator ranks) from the
 * plan's position table, so they cost O(log of the device's memberships), never a group scan. */
#include "plan.h"
#include "plan-impl.h"

#include "../base/assert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void plan_class_clear(struct plan_class *c) {
  g_free(c->devices);
  g_free(c->instrs);
  g_free(c->stream_first);
  g_free(c->stream_instrs);
  g_free(c->waits);
  g_free(c->reads);
  g_free(c->writes);
  g_free(c->consumers);
  g_free(c->tensors);
  memset(c, 0, sizeof *c);
}

static void positions_clear(struct plan_positions *t) {
  g_free(t->first);
  g_free(t->group);
  g_free(t->rank);
  memset(t, 0, sizeof *t);
}

static int compare_memory_event(const void *x, const void *y) {
  const struct plan_memory_event *a = x, *b = y;
  if (a->instr != b->instr)
    return a->instr < b->instr ? -1 : 1;
  if (a->release != b->release)
    return a->release ? 1 : -1;
  return a->tensor < b->tensor ? -1 : a->tensor > b->tensor;
}

uint32_t plan_class_memory_events(const struct plan_class *c, struct plan_memory_event **events) {
  uint32_t n = 2 * c->n_tensors;
  struct plan_memory_event *ev = g_new(struct plan_memory_event, n ? n : 1);
  for (uint32_t t = 0; t < c->n_tensors; t++) {
    ev[2 * t] = (struct plan_memory_event){c->tensors[t].alloc, t, false};
    ev[2 * t + 1] = (struct plan_memory_event){c->tensors[t].release, t, true};
  }
  qsort(ev, n, sizeof *ev, compare_memory_event);
  *events = ev;
  return n;
}

void plan_free(struct plan *p) {
  if (!p)
    return;
  model_free(p->model);
  g_free(p->model_json);
  g_free(p->program_json);
  g_free(p->nodes);
  g_free(p->groups);
  g_free(p->device_pool);
  g_free(p->segsets);
  g_free(p->segment_pool);
  g_free(p->streams);
  g_free(p->comms);
  if (p->classes)
    for (uint32_t c = 0; c < p->n_classes; c++)
      plan_class_clear(&p->classes[c]);
  g_free(p->classes);
  g_free(p->device_class);
  positions_clear(&p->positions);
  g_free(p);
}

const struct plan_class *plan_device_class(const struct plan *p, uint32_t device) {
  if (!p || device >= p->n_devices || !p->device_class)
    return NULL;
  uint32_t c = p->device_class[device];
  return c < p->n_classes ? &p->classes[c] : NULL;
}

/* A counting sort of the device pool by device: walking groups in ascending order leaves each
 * device's entries sorted by group, and a device listed twice in a group keeps its first
 * position first, as a scan of the group would find it. */
void plan_index_positions(struct plan *p) {
  struct plan_positions *t = &p->positions;
  positions_clear(t);
  t->first = g_new0(uint32_t, (size_t)p->n_devices + 1);
  uint32_t total = 0;
  for (uint32_t g = 0; g < p->n_groups; g++)
    for (uint32_t i = 0; i < p->groups[g].count; i++) {
      uint32_t d = p->device_pool[p->groups[g].first + i];
      if (d < p->n_devices) {
        t->first[d + 1]++;
        total++;
      }
    }
  for (uint32_t d = 0; d < p->n_devices; d++)
    t->first[d + 1] += t->first[d];
  t->group = g_new(uint32_t, total ? total : 1);
  t->rank = g_new(uint32_t, total ? total : 1);
  uint32_t *cursor = g_memdup2(t->first, ((size_t)p->n_devices + 1) * sizeof *cursor);
  for (uint32_t g = 0; g < p->n_groups; g++)
    for (uint32_t i = 0; i < p->groups[g].count; i++) {
      uint32_t d = p->device_pool[p->groups[g].first + i];
      if (d < p->n_devices) {
        t->group[cursor[d]] = g;
        t->rank[cursor[d]++] = i;
      }
    }
  g_free(cursor);
}

int plan_group_position(const struct plan *p, uint32_t group, uint32_t device) {
  if (!p || group >= p->n_groups || device >= p->n_devices)
    return -1;
  const struct plan_positions *t = &p->positions;
  PIPER_ASSERT(t->first != NULL); /* plan_index_positions was not run */
  uint32_t lo = t->first[device], hi = t->first[device + 1];
  while (lo < hi) { /* the first entry with group >= the one asked for */
    uint32_t mid = lo + (hi - lo) / 2;
    if (t->group[mid] < group)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < t->first[device + 1] && t->group[lo] == group ? (int)t->rank[lo] : -1;
}

int plan_node_position(const struct plan *p, uint32_t node, uint32_t device) {
  if (!p || node >= p->n_nodes)
    return -1;
  return plan_group_position(p, p->nodes[node].group, device);
}

uint32_t plan_peer(const struct plan *p, uint32_t node, uint32_t device) {
  int pos = plan_node_position(p, node, device);
  if (pos < 0)
    return IR_NONE;
  const struct ir_node *n = &p->nodes[node];
  if (n->kind != IR_NODE_SEND && n->kind != IR_NODE_RECV)
    return IR_NONE;
  if (n->peer_group >= p->n_groups)
    return IR_NONE;
  const struct ir_group *peer = &p->groups[n->peer_group];
  if ((uint32_t)pos >= peer->count)
    return IR_NONE;
  return p->device_pool[peer->first + (uint32_t)pos];
}

const char *const plan_purpose_names[IR_COMM_PURPOSE_COUNT] = {"none", "pp", "dp", "ep", "tp",
                                                                "cp"};

uint32_t plan_comm_instance(const struct plan_comm *c, uint32_t pos, uint32_t *stride,
                            uint32_t *rank) {
  uint32_t s = c->stride > 1 ? c->stride : 1, block = c->split * s;
  if (c->purpose == IR_COMM_CP) { /* (tp, cp, rest) coordinates of pos, TP innermost */
    *stride = s;
    *rank = pos / s % c->split;
    return pos - pos % block + pos % s;
  }
  if (c->purpose == IR_COMM_TP) {
    *stride = 1;
    *rank = pos % c->split;
    return pos - pos % c->split;
  }
  /* DP / EP: strided by the TP degree; an EP group carved from the stage (block > 0) holds
   * only the positions of pos's block [pos - pos mod block, +block) */
  uint32_t split = c->split > 1 ? c->split : 1, base = c->block ? pos - pos % c->block : 0;
  *stride = split;
  *rank = (pos - base) / split;
  return base + (pos - base) % split;
}

/* Position k (0 <= k < size) of the instance of split communicator c that holds group position
 * pos: consecutive for TP, strided by the TP degree for DP / EP and CP. */
static uint32_t split_position(const struct plan_comm *c, uint32_t pos, uint32_t k) {
  uint32_t stride, rank;
  return plan_comm_instance(c, pos, &stride, &rank) + k * stride;
}

static int split_rank(const struct plan_comm *c, int pos) {
  if (pos < 0 || (c->split <= 1 && !c->block))
    return pos;
  uint32_t stride, rank;
  plan_comm_instance(c, (uint32_t)pos, &stride, &rank);
  return (int)rank;
}

uint32_t plan_device_peer(const struct plan *p, uint32_t d, const struct ir_node *n) {
  if (n->kind != IR_NODE_SEND && n->kind != IR_NODE_RECV)
    return IR_NONE;
  int pos = plan_group_position(p, n->group, d);
  if (pos < 0 || n->peer_group >= p->n_groups)
    return IR_NONE;
  const struct ir_group *peer = &p->groups[n->peer_group];
  return (uint32_t)pos < peer->count ? p->device_pool[peer->first + (uint32_t)pos] : IR_NONE;
}

int32_t plan_device_comm_rank(const struct plan *p, uint32_t d, uint32_t comm, int side,
                              uint32_t pair[2]) {
  const struct plan_comm *c = &p->comms[comm];
  if (c->purpose != IR_COMM_PP)
    return split_rank(c, plan_group_position(p, c->group, d));
  int32_t rank = 0, pos = side == 1 ? -1 : plan_group_position(p, c->group, d);
  if (pos < 0 && side != 0) {
    rank = 1;
    pos = plan_group_position(p, c->peer_group, d);
  }
  if (pos < 0 || c->peer_group >= p->n_groups)
    return -1;
  const struct ir_group *a = &p->groups[c->group], *b = &p->groups[c->peer_group];
  if ((uint32_t)pos >= a->count || (uint32_t)pos >= b->count)
    return -1;
  pair[0] = p->device_pool[a->first + (uint32_t)pos];
  pair[1] = p->device_pool[b->first + (uint32_t)pos];
  return rank;
}

uint32_t *plan_class_comms(const struct plan_class *c, uint32_t *n_out) {
  uint32_t *ids = g_new(uint32_t, c->n_instrs ? c->n_instrs : 1), n = 0;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    if (c->instrs[i].comm != IR_NONE)
      ids[n++] = c->instrs[i].comm;
  qsort(ids, n, sizeof *ids, piper_cmp_u32);
  uint32_t u = 0;
  for (uint32_t i = 0; i < n; i++)
    if (u == 0 || ids[u - 1] != ids[i])
      ids[u++] = ids[i];
  *n_out = u;
  return ids;
}

uint32_t plan_comm_size(const struct plan *p, uint32_t comm) {
  if (!p || comm >= p->n_comms)
    return 0;
  const struct plan_comm *c = &p->comms[comm];
  if (c->purpose == IR_COMM_PP)
    return 2;
  if (c->group >= p->n_groups)
    return 0;
  uint32_t count = c->block ? c->block : p->groups[c->group].count;
  if (c->split <= 1)
    return count;
  return c->purpose == IR_COMM_TP || c->purpose == IR_COMM_CP ? c->split : count / c->split;
}

/* For PP: the instance (position p) device belongs to and its rank there (0 = the sending side).
 * A device that is in both groups is taken as a sender, the first way the comment in plan.h
 * names; plans never put one device on both sides of one direction. */
static int pp_instance(const struct plan *p, const struct plan_comm *c, uint32_t device,
                       int *rank) {
  int pos = plan_group_position(p, c->group, device);
  if (pos >= 0) {
    *rank = 0;
    return pos;
  }
  pos = plan_group_position(p, c->peer_group, device);
  *rank = 1;
  return pos;
}

int plan_comm_rank(const struct plan *p, uint32_t comm, uint32_t device) {
  if (!p || comm >= p->n_comms)
    return -1;
  const struct plan_comm *c = &p->comms[comm];
  if (c->purpose != IR_COMM_PP)
    return split_rank(c, plan_group_position(p, c->group, device));
  int rank;
  return pp_instance(p, c, device, &rank) < 0 ? -1 : rank;
}

void plan_comm_members(const struct plan *p, uint32_t comm, uint32_t device, uint32_t *members) {
  if (!p || !members || comm >= p->n_comms)
    return;
  const struct plan_comm *c = &p->comms[comm];
  if (c->purpose != IR_COMM_PP) {
    if (c->group >= p->n_groups)
      return;
    const struct ir_group *g = &p->groups[c->group];
    if (c->split <= 1 && !c->block) {
      memcpy(members, &p->device_pool[g->first], g->count * sizeof *members);
      return;
    }
    int pos = plan_group_position(p, c->group, device);
    if (pos < 0)
      return;
    uint32_t size = plan_comm_size(p, comm);
    for (uint32_t k = 0; k < size; k++)
      members[k] = p->device_pool[g->first + split_position(c, (uint32_t)pos, k)];
    return;
  }
  int rank;
  int pos = pp_instance(p, c, device, &rank);
  if (pos < 0 || c->peer_group >= p->n_groups)
    return;
  if ((uint32_t)pos >= p->groups[c->group].count || (uint32_t)pos >= p->groups[c->peer_group].count)
    return;
  members[0] = p->device_pool[p->groups[c->group].first + (uint32_t)pos];
  members[1] = p->device_pool[p->groups[c->peer_group].first + (uint32_t)pos];
}

void plan_comm_name(const struct plan *p, uint32_t comm, char *buf, size_t len) {
  if (!buf || len == 0)
    return;
  if (!p || comm >= p->n_comms) {
    snprintf(buf, len, "comm %u?", comm);
    return;
  }
  const struct plan_comm *c = &p->comms[comm];
  switch (c->purpose) {
  case IR_COMM_PP: snprintf(buf, len, "pp g%u->g%u", c->group, c->peer_group); break;
  case IR_COMM_DP: snprintf(buf, len, "dp g%u", c->group); break;
  case IR_COMM_EP: snprintf(buf, len, "ep g%u", c->group); break;
  case IR_COMM_TP: snprintf(buf, len, "tp g%u", c->group); break;
  case IR_COMM_CP: snprintf(buf, len, "cp g%u", c->group); break;
  default: snprintf(buf, len, "none g%u", c->group); break;
  }
  if (c->split > 1 && c->purpose != IR_COMM_PP) {
    size_t used = strlen(buf);
    if (used < len)
      snprintf(buf + used, len - used, c->purpose == IR_COMM_DP || c->purpose == IR_COMM_EP ? "%%%u" : "/%u",
               c->split);
  }
  if (c->block) { /* "ep g3:64": EP groups of 64 consecutive positions */
    size_t used = strlen(buf);
    if (used < len)
      snprintf(buf + used, len - used, ":%u", c->block);
  }
}

void plan_node_name(const struct plan *p, uint32_t node, char *buf, size_t len) {
  if (!buf || len == 0)
    return;
  if (!p || node >= p->n_nodes) {
    snprintf(buf, len, "node %u?", node);
    return;
  }
  ir_node_format_name(&p->nodes[node], p->n_tags, (const char(*)[MODEL_TAG_NAME_MAX])p->tag_names,
                      buf, len);
}

uint32_t plan_group_span(const struct plan_class *c, uint32_t entry) {
  uint32_t n = c->instrs[c->stream_instrs[entry]].group_parts;
  return n ? n : 1;
}

GHashTable *plan_class_group_index(const struct plan_class *c) {
  GHashTable *index = NULL;
  for (uint32_t e = 0; e < c->n_instrs;) {
    uint32_t n = plan_group_span(c, e);
    for (uint32_t k = 0; k < n && n > 1; k++) {
      if (!index)
        index = g_hash_table_new(g_direct_hash, g_direct_equal);
      g_hash_table_insert(index, GUINT_TO_POINTER(c->instrs[c->stream_instrs[e + k]].node),
                          GUINT_TO_POINTER(e + 1));
    }
    e += n;
  }
  return index;
}

void plan_group_name(const struct plan *p, const struct plan_class *c, uint32_t entry,
                     bool short_form, int mb_tag, char *buf, size_t len) {
  uint32_t n = plan_group_span(c, entry);
  GString *s = g_string_new(short_form ? "" : "group: ");
  for (uint32_t k = 0; k < n; k++) {
    uint32_t node = c->instrs[c->stream_instrs[entry + k]].node;
    const struct ir_node *x = &p->nodes[node];
    if (short_form) {
      g_string_append_printf(s, "%s%c%s", k ? " " : "", x->kind == IR_NODE_SEND ? 's' : 'r',
                             ir_pass_name(x->pass));
      if (mb_tag >= 0 && x->tags[mb_tag] >= 0)
        g_string_append_printf(s, "%d", x->tags[mb_tag]);
    } else {
      char name[256];
      plan_node_name(p, node, name, sizeof name);
      g_string_append_printf(s, "%s%s", k ? " + " : "", name);
    }
  }
  g_strlcpy(buf, s->str, len);
  g_string_free(s, TRUE);
}

bool plan_mixed_stream(const struct plan *p, uint32_t *stream, uint32_t *device, uint64_t *bytes) {
  bool found = false;
  *bytes = 0;
  for (uint32_t k = 0; k < p->n_classes; k++) {
    const struct plan_class *c = &p->classes[k];
    for (uint32_t st = 0; st < p->n_streams; st++) {
      uint32_t purposes = 0;
      uint64_t total = 0;
      for (uint32_t e = c->stream_first[st]; e < c->stream_first[st + 1]; e++) {
        const struct ir_node *n = &p->nodes[c->instrs[c->stream_instrs[e]].node];
        if (n->purpose == IR_COMM_NONE)
          continue;
        purposes |= 1u << n->purpose;
        total += n->bytes;
      }
      if ((purposes & (purposes - 1)) && total > *bytes && c->n_devices) {
        found = true;
        *bytes = total;
        *stream = st;
        *device = c->devices[0];
      }
    }
  }
  return found;
}

uint64_t plan_instruction_count(const struct plan *p) {
  uint64_t total = 0;
  if (!p)
    return 0;
  for (uint32_t c = 0; c < p->n_classes; c++)
    total += (uint64_t)p->classes[c].n_instrs * p->classes[c].n_devices;
  return total;
}

/* --- equality ------------------------------------------------------------------------------
 * Two plans are equal when they mean the same thing: every field of every record is equal, and
 * every pool-backed list (group devices, segset segments, waits, reads, writes, consumers) holds
 * the same entries in the same order. Where a list starts in its pool is not compared, so a
 * plan whose pools are laid out in another order (the reader lays them out in issue order)
 * still equals it. Fields that mean nothing are skipped: tags past n_tags, text after a name's
 * NUL, the sequence number of an instruction without a communicator. The model is compared by
 * its configuration (as JSON values, so formatting does not matter) and its name. */

static bool lists_equal(const uint32_t *pa, uint32_t fa, uint32_t ca, const uint32_t *pb,
                        uint32_t fb, uint32_t cb) {
  if (ca != cb)
    return false;
  return ca == 0 || memcmp(pa + fa, pb + fb, ca * sizeof *pa) == 0;
}

static bool json_text_equal(const char *a, const char *b) {
  if (!a || !b)
    return a == b;
  if (strcmp(a, b) == 0)
    return true;
  cJSON *ja = cJSON_Parse(a), *jb = cJSON_Parse(b);
  bool eq = ja && jb && cJSON_Compare(ja, jb, true);
  cJSON_Delete(ja);
  cJSON_Delete(jb);
  return eq;
}

static bool node_equal(const struct ir_node *a, const struct ir_node *b, uint32_t n_tags) {
  for (uint32_t t = 0; t < n_tags; t++)
    if (a->tags[t] != b->tags[t])
      return false;
  return a->kind == b->kind && a->pass == b->pass && a->purpose == b->purpose &&
         a->segment == b->segment && a->group == b->group && a->peer_group == b->peer_group &&
         a->stream == b->stream && a->pair == b->pair && a->segset == b->segset &&
         a->bytes == b->bytes && a->shard_degree == b->shard_degree &&
         a->replica_degree == b->replica_degree && a->shard_grads == b->shard_grads &&
         (a->shard_optimizer || a->shard_grads) == (b->shard_optimizer || b->shard_grads) &&
         a->shard_params == b->shard_params && a->recompute == b->recompute &&
         a->expert_replicas == b->expert_replicas && a->route_split == b->route_split &&
         a->recompute_modules == b->recompute_modules && a->directive == b->directive &&
         a->priority == b->priority && a->tp_degree == b->tp_degree &&
         a->sequence_parallel == b->sequence_parallel && a->collectives == b->collectives &&
         a->capacity_factor == b->capacity_factor && a->fp8_expert_inputs == b->fp8_expert_inputs &&
         a->cp_degree == b->cp_degree && a->cp_comm == b->cp_comm;
}

bool plan_class_diff(const struct plan_class *a, const struct plan_class *b, uint32_t n_streams,
                     char *what, size_t len) {
  if (a->n_instrs != b->n_instrs) {
    snprintf(what, len, "instruction count %u vs %u", a->n_instrs, b->n_instrs);
    return false;
  }
  for (uint32_t i = 0; i < a->n_instrs; i++) {
    const struct plan_instr *x = &a->instrs[i], *y = &b->instrs[i];
    const char *field = NULL;
    if (x->node != y->node)
      field = "node";
    else if (x->stream != y->stream)
      field = "stream";
    else if (x->comm != y->comm)
      field = "comm";
    else if (x->comm != IR_NONE && x->seq != y->seq)
      field = "seq";
    else if (x->group_parts != y->group_parts)
      field = "group";
    else if (!lists_equal(a->waits, x->wait_first, x->wait_count, b->waits, y->wait_first,
                          y->wait_count))
      field = "waits";
    else if (!lists_equal(a->reads, x->read_first, x->read_count, b->reads, y->read_first,
                          y->read_count))
      field = "reads";
    else if (!lists_equal(a->writes, x->write_first, x->write_count, b->writes, y->write_first,
                          y->write_count))
      field = "writes";
    if (field) {
      snprintf(what, len, "instruction %u \"%s\"", i, field);
      return false;
    }
  }
  if (!a->stream_first != !b->stream_first || !a->stream_instrs != !b->stream_instrs ||
      (a->stream_first &&
       memcmp(a->stream_first, b->stream_first, (n_streams + 1) * sizeof(uint32_t)) != 0) ||
      (a->stream_instrs && a->n_instrs &&
       memcmp(a->stream_instrs, b->stream_instrs, a->n_instrs * sizeof(uint32_t)) != 0)) {
    snprintf(what, len, "stream lists");
    return false;
  }
  if (a->n_tensors != b->n_tensors) {
    snprintf(what, len, "tensor count %u vs %u", a->n_tensors, b->n_tensors);
    return false;
  }
  for (uint32_t t = 0; t < a->n_tensors; t++) {
    const struct plan_tensor *x = &a->tensors[t], *y = &b->tensors[t];
    if (x->bytes != y->bytes || x->producer != y->producer || x->kind != y->kind ||
        x->alloc != y->alloc || x->release != y->release ||
        !lists_equal(a->consumers, x->consumer_first, x->consumer_count, b->consumers,
                     y->consumer_first, y->consumer_count)) {
      snprintf(what, len, "tensor %u", t);
      return false;
    }
  }
  return true;
}

static bool comm_equal(const struct plan_comm *x, const struct plan_comm *y) {
  return x->purpose == y->purpose && x->group == y->group && x->peer_group == y->peer_group &&
         x->split == y->split && x->stride == y->stride && x->block == y->block;
}

bool plan_equal(const struct plan *a, const struct plan *b) {
  if (!a || !b)
    return a == b;
  if (!json_text_equal(a->model_json, b->model_json) ||
      !json_text_equal(a->program_json, b->program_json))
    return false;
  if (!a->model != !b->model || (a->model && strcmp(a->model->name, b->model->name) != 0))
    return false;
  if (a->n_devices != b->n_devices || a->n_microbatches != b->n_microbatches ||
      a->n_tags != b->n_tags || a->n_nodes != b->n_nodes || a->n_groups != b->n_groups ||
      a->n_segsets != b->n_segsets || a->n_streams != b->n_streams || a->n_comms != b->n_comms ||
      a->n_classes != b->n_classes)
    return false;
  for (uint32_t t = 0; t < a->n_tags; t++)
    if (strncmp(a->tag_names[t], b->tag_names[t], MODEL_TAG_NAME_MAX) != 0)
      return false;
  for (uint32_t i = 0; i < a->n_nodes; i++)
    if (!node_equal(&a->nodes[i], &b->nodes[i], a->n_tags))
      return false;
  for (uint32_t g = 0; g < a->n_groups; g++)
    if (!lists_equal(a->device_pool, a->groups[g].first, a->groups[g].count, b->device_pool,
                     b->groups[g].first, b->groups[g].count))
      return false;
  for (uint32_t s = 0; s < a->n_segsets; s++) {
    const struct ir_segset *x = &a->segsets[s], *y = &b->segsets[s];
    if (x->param_bytes != y->param_bytes ||
        !lists_equal(a->segment_pool, x->first, x->count, b->segment_pool, y->first, y->count))
      return false;
  }
  for (uint32_t s = 0; s < a->n_streams; s++) {
    const struct ir_stream *x = &a->streams[s], *y = &b->streams[s];
    if (strncmp(x->name, y->name, IR_NAME_MAX) != 0 || x->priority != y->priority ||
        x->sm_share != y->sm_share)
      return false;
  }
  for (uint32_t c = 0; c < a->n_comms; c++)
    if (!comm_equal(&a->comms[c], &b->comms[c]))
      return false;
  if (a->n_devices &&
      memcmp(a->device_class, b->device_class, a->n_devices * sizeof(uint32_t)) != 0)
    return false;
  char what[96];
  for (uint32_t c = 0; c < a->n_classes; c++) {
    const struct plan_class *x = &a->classes[c], *y = &b->classes[c];
    if (!lists_equal(x->devices, 0, x->n_devices, y->devices, 0, y->n_devices))
      return false;
    if (!plan_class_diff(x, y, a->n_streams, what, sizeof what))
      return false;
  }
  return true;
}
