/* plan: the progress check. A dry run of every device's streams in which an instruction
 * completes once it heads its stream and its event waits are done; communication completes
 * when every member of its communicator instance has arrived at the same sequence number. A
 * point-to-point group arrives at all its parts at once and frees its stream when the last part
 * has met its peer (plan_instr.group_parts). Arrival is monotone (running a ready instruction
 * never disables another), so this worklist
 * run reaches the same end state as a unit-time run in lock step; anything left unfinished is
 * a deadlock, reported with the devices and instructions that wait on each other.
 *
 * The run goes over units. It first runs one unit per colour of alike devices (see colours
 * below), which costs what the classes cost, not what the devices cost; only when that run
 * does not finish does it run every device, so that the verdict and the message name the
 * devices exactly as before. */
#include <string.h>

#include "../base/json.h"
#include "plan.h"

/* An instance of a communicator at one sequence number: the communicator and sequence, and
 * which instance (device mode: the PP position; colour mode: the two colours of a PP pair). */
struct arrival_key {
  uint64_t comm_seq, instance;
};

struct arrival {
  struct arrival_key key;
  uint32_t count;
  uint32_t first_node; /* node of the first arrival, to check the others agree */
  uint32_t first_device;
  GArray *who; /* (unit, stream) pairs waiting */
};

struct progress {
  const struct plan *p;
  uint32_t n_units;         /* devices, or colours */
  const uint32_t *unit_rep; /* [unit]: a device of the unit (NULL: unit = device) */
  const uint32_t *colour;   /* [device]: its colour in colour mode, NULL in device mode */
  const uint32_t *weight;   /* [unit]: devices in the colour (colour mode) */
  uint32_t **pc;            /* [unit][stream]: next position in the class's stream list */
  bool **arrived;           /* [unit][stream]: head has arrived at its communication */
  uint32_t **outstanding;   /* [unit][stream]: parts of the head's group not yet met */
  uint32_t **stream_pos;    /* [class][instr]: position of the instruction in its stream list */
  GHashTable *arrivals;     /* struct arrival_key * -> struct arrival * (which holds the key) */
  GArray *work;             /* units to revisit */
  bool *queued;
};

static uint32_t unit_device(const struct progress *s, uint32_t unit) {
  return s->unit_rep ? s->unit_rep[unit] : unit;
}

static const struct plan_class *unit_class(const struct progress *s, uint32_t unit) {
  return plan_device_class(s->p, unit_device(s, unit));
}

/* The instance of a communicator a unit is in; *weight is the devices its arrival stands for
 * (an instance completes when plan_comm_size devices have arrived). Device mode: PP pairs
 * differ by the position of the device in its side's group (a send of A[k] meets the recv of
 * B[k]); a collective has one instance of all its members. Colour mode: a PP instance is named
 * by the colours of its two sides (every member of a colour has its peer in one colour, so all
 * pairs between two colours arrive together) and each side counts once; a colour arriving at a
 * collective brings all its members. */
static struct arrival_key arrival_key(const struct progress *s, const struct plan_instr *in,
                                      uint32_t unit, uint32_t *weight) {
  const struct plan *p = s->p;
  uint32_t device = unit_device(s, unit);
  struct arrival_key k = {((uint64_t)in->comm << 32) | in->seq, 0};
  bool pp = p->comms[in->comm].purpose == IR_COMM_PP;
  *weight = 1;
  uint32_t split = p->comms[in->comm].split;
  if (!s->colour) {
    if (pp) {
      k.instance = (uint64_t)(uint32_t)plan_node_position(p, in->node, device);
    } else if (split > 1 || p->comms[in->comm].block) {
      /* which TP group, or which TP rank's devices (of which EP block: struct plan_comm) */
      uint32_t pos = (uint32_t)plan_group_position(p, p->comms[in->comm].group, device);
      uint32_t stride, rank;
      k.instance = plan_comm_instance(&p->comms[in->comm], pos, &stride, &rank);
    }
  } else if (pp) {
    uint32_t peer = plan_peer(p, in->node, device);
    uint64_t other = peer == IR_NONE ? IR_NONE : s->colour[peer];
    k.instance = unit < other ? ((uint64_t)unit << 32) | other : (other << 32) | unit;
  } else {
    *weight = s->weight[unit];
  }
  return k;
}

/* g_int64_hash folds the key's halves together, and the key's fields (communicator, PP
 * instance, sequence) then collide by the thousand in large groups, which made every lookup a
 * walk along a chain as long as the group; a full mix keeps the table's chains short. */
static guint arrival_hash(gconstpointer key) {
  const struct arrival_key *k = key;
  uint64_t x = k->comm_seq ^ (k->instance * 0x9e3779b97f4a7c15ull);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (guint)x;
}

static gboolean arrival_equal(gconstpointer a, gconstpointer b) {
  const struct arrival_key *x = a, *y = b;
  return x->comm_seq == y->comm_seq && x->instance == y->instance;
}

static bool done(const struct progress *s, uint32_t unit, uint32_t instr) {
  uint32_t cls = s->p->device_class[unit_device(s, unit)];
  return s->stream_pos[cls][instr] < s->pc[unit][s->p->classes[cls].instrs[instr].stream];
}

static void enqueue(struct progress *s, uint32_t device) {
  if (s->queued[device])
    return;
  s->queued[device] = true;
  g_array_append_val(s->work, device);
}

static void arrival_free(gpointer x) {
  struct arrival *a = x;
  g_array_free(a->who, TRUE);
  g_free(a);
}

static bool mismatch(const struct progress *s, const struct arrival *a, uint32_t device,
                     uint32_t node, uint32_t comm, uint32_t seq, GError **err) {
  char x[256], y[256], cn[96];
  plan_node_name(s->p, a->first_node, x, sizeof x);
  plan_node_name(s->p, node, y, sizeof y);
  plan_comm_name(s->p, comm, cn, sizeof cn);
  return piper_input_error(err,
                   "plan deadlocks: on communicator %s sequence %u device %u issues \"%s\" but "
                   "device %u issues \"%s\"",
                   cn, seq, a->first_device, x, device, y);
}

/* One part of what heads (unit, st) has met its peers. A group completes, and its stream
 * moves past all its parts, when the last part has. */
static void part_met(struct progress *s, uint32_t unit, uint32_t st) {
  if (s->outstanding[unit][st] > 1) {
    s->outstanding[unit][st]--;
    return;
  }
  const struct plan_class *c = unit_class(s, unit);
  s->pc[unit][st] += plan_group_span(c, c->stream_first[st] + s->pc[unit][st]);
  s->outstanding[unit][st] = 0;
  s->arrived[unit][st] = false;
}

/* The arrivals (devices) that complete an instance of comm. A split communicator (tensor
 * parallelism) has several instances in one group, which colours do not tell apart (a colour
 * may hold devices of several): colour mode waits for the whole group, every instance at once.
 * That only asks more of a run, so a colour run that finishes still proves the device run does
 * (an instance there completes as soon as its own members arrive). */
static uint32_t arrivals_needed(const struct progress *s, uint32_t comm) {
  const struct plan_comm *c = &s->p->comms[comm];
  if (s->colour && (c->split > 1 || c->block) && c->group < s->p->n_groups)
    return s->p->groups[c->group].count;
  return plan_comm_size(s->p, comm);
}

/* Instruction in of unit, heading stream st (alone or as a part of a group), arrives at its
 * communication; completes the instance when it is the last to come. False on a mismatch
 * error. */
static bool arrive(struct progress *s, uint32_t unit, uint32_t st, const struct plan_instr *in,
                   GError **err) {
  const struct plan *p = s->p;
  uint32_t weight;
  struct arrival_key key = arrival_key(s, in, unit, &weight);
  struct arrival *a = g_hash_table_lookup(s->arrivals, &key);
  if (!a) {
    a = g_new0(struct arrival, 1);
    a->key = key;
    a->first_node = in->node;
    a->first_device = unit_device(s, unit);
    a->who = g_array_new(FALSE, FALSE, sizeof(uint32_t) * 2);
    g_hash_table_insert(s->arrivals, &a->key, a);
  } else {
    const struct ir_node *x = &p->nodes[a->first_node], *y = &p->nodes[in->node];
    bool pair = (x->kind == IR_NODE_SEND && y->kind == IR_NODE_RECV && x->pair == in->node) ||
                (x->kind == IR_NODE_RECV && y->kind == IR_NODE_SEND && y->pair == a->first_node);
    if (x->kind != y->kind ? !pair : a->first_node != in->node)
      return mismatch(s, a, unit_device(s, unit), in->node, in->comm, in->seq, err);
  }
  uint32_t who[2] = {unit, st};
  g_array_append_vals(a->who, who, 1);
  a->count += weight;
  if (a->count == arrivals_needed(s, in->comm)) {
    /* A unit may stand in who twice (a group whose send and receive pair within one colour):
     * each entry is one part met. */
    for (uint32_t k = 0; k < a->who->len; k++) {
      uint32_t *w = &g_array_index(a->who, uint32_t, 2 * k);
      part_met(s, w[0], w[1]);
      if (w[0] != unit)
        enqueue(s, w[0]);
    }
    g_hash_table_remove(s->arrivals, &key);
  }
  return true;
}

/* Whether the n instructions from entry e of c's stream lists may be issued: their waits are
 * done. */
static bool parts_ready(const struct progress *s, uint32_t unit, const struct plan_class *c,
                        uint32_t e, uint32_t n) {
  for (uint32_t k = 0; k < n; k++) {
    const struct plan_instr *in = &c->instrs[c->stream_instrs[e + k]];
    for (uint32_t w = 0; w < in->wait_count; w++)
      if (!done(s, unit, c->waits[in->wait_first + w]))
        return false;
  }
  return true;
}

/* Runs what unit can run now; false on a mismatch error. */
static bool advance(struct progress *s, uint32_t unit, GError **err) {
  const struct plan *p = s->p;
  const struct plan_class *c = unit_class(s, unit);
  bool changed = true;
  while (changed) {
    changed = false;
    for (uint32_t st = 0; st < p->n_streams; st++) {
      for (;;) {
        uint32_t pos = s->pc[unit][st];
        if (pos >= c->stream_first[st + 1] - c->stream_first[st] || s->arrived[unit][st])
          break;
        uint32_t e = c->stream_first[st] + pos, n = plan_group_span(c, e);
        if (!parts_ready(s, unit, c, e, n))
          break;
        const struct plan_instr *in = &c->instrs[c->stream_instrs[e]];
        changed = true;
        if (in->comm == IR_NONE) {
          s->pc[unit][st]++;
          continue;
        }
        /* Every part is posted before any is matched, as ncclGroupEnd or MPI_Waitall do. */
        s->arrived[unit][st] = true;
        s->outstanding[unit][st] = n;
        for (uint32_t k = 0; k < n; k++)
          if (!arrive(s, unit, st, &c->instrs[c->stream_instrs[e + k]], err))
            return false;
        break;
      }
    }
  }
  return true;
}

static void report_deadlock(const struct progress *s, GError **err) {
  const struct plan *p = s->p;
  GString *msg = g_string_new("plan deadlocks: ");
  uint32_t shown = 0, stuck = 0;
  char name[256], cn[96];
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    for (uint32_t st = 0; st < p->n_streams; st++) {
      uint32_t pos = s->pc[d][st];
      if (pos >= c->stream_first[st + 1] - c->stream_first[st])
        continue;
      stuck++;
      if (shown >= 6)
        continue;
      uint32_t i = c->stream_instrs[c->stream_first[st] + pos];
      const struct plan_instr *in = &c->instrs[i];
      plan_node_name(p, in->node, name, sizeof name);
      g_string_append_printf(msg, "%sdevice %u stream %s waits at \"%s\"", shown ? "; " : "", d,
                             p->streams[st].name, name);
      if (in->comm != IR_NONE && s->arrived[d][st]) {
        plan_comm_name(p, in->comm, cn, sizeof cn);
        g_string_append_printf(msg, " (%s seq %u: peers not there)", cn, in->seq);
      } else if (in->wait_count) {
        for (uint32_t w = 0; w < in->wait_count; w++) {
          uint32_t wi = c->waits[in->wait_first + w];
          if (done(s, d, wi))
            continue;
          plan_node_name(p, c->instrs[wi].node, name, sizeof name);
          g_string_append_printf(msg, " (after \"%s\")", name);
          break;
        }
      }
      shown++;
    }
  }
  if (stuck > shown)
    g_string_append_printf(msg, "; and %u more", stuck - shown);
  piper_input_error(err, "%s", msg->str);
  g_string_free(msg, TRUE);
}

/* ---- colours of alike devices --------------------------------------------------------------
 * Why one unit per colour decides for all its members. Call a partition of the devices into
 * colours stable when (1) the members of a colour run one plan class and (2) for every
 * send/recv relation of that class (a node's group and peer group, which fix the peer of each
 * member) the peers of all members lie in one colour. Take the lock-step run of every device;
 * by induction on its steps, the members of a colour have equal stream positions and arrival
 * flags: readiness depends on a device's own positions and its class's waits; a collective
 * (one instance: its group) completes when plan_comm_size devices have arrived at one sequence
 * number, and as members of a colour arrive together, that is when the colours arrived there
 * hold that many devices, which is what the weighted count below tests; a pair A[k] -> B[k]
 * completes when both sides have arrived, and with every member of A[k]'s colour X pairing
 * with a member of one colour Y (and Y's members with X's, by the same condition on Y), that
 * is when X and Y have. So the colour run is the device run divided by the partition, a head
 * a device issues is its colour's, and the colour run finishing without a mismatch means the
 * device run does. The refinement starts from the classes and splits colours by the colours
 * of their peers until nothing splits, which leaves a stable partition. A colour run that does
 * not finish proves nothing: the device run then decides, and words the error. A
 * point-to-point group keeps this: its parts are the class's, so the members of a colour post
 * the same parts together, and each part meets its peer colour as a lone send or recv would. */

/* The distinct send/recv relations (group, peer group) of a class, as pairs. */
static GArray *class_relations(const struct plan *p, const struct plan_class *c) {
  GArray *rel = g_array_new(FALSE, FALSE, sizeof(uint64_t));
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (c->instrs[i].comm == IR_NONE || (n->kind != IR_NODE_SEND && n->kind != IR_NODE_RECV))
      continue;
    uint64_t r = ((uint64_t)n->group << 32) | n->peer_group;
    g_array_append_val(rel, r);
  }
  g_array_sort(rel, piper_cmp_u64);
  uint32_t u = 0;
  for (uint32_t i = 0; i < rel->len; i++)
    if (u == 0 || g_array_index(rel, uint64_t, u - 1) != g_array_index(rel, uint64_t, i))
      g_array_index(rel, uint64_t, u++) = g_array_index(rel, uint64_t, i);
  g_array_set_size(rel, u);
  return rel;
}

/* The peer of device in a relation, IR_NONE when it has none. */
static uint32_t relation_peer(const struct plan *p, uint64_t rel, uint32_t device) {
  uint32_t group = (uint32_t)(rel >> 32), peer_group = (uint32_t)rel;
  int pos = plan_group_position(p, group, device);
  if (pos < 0 || peer_group >= p->n_groups || (uint32_t)pos >= p->groups[peer_group].count)
    return IR_NONE;
  return p->device_pool[p->groups[peer_group].first + (uint32_t)pos];
}

/* One refinement step: next[d] numbers the distinct (colour, peers' colours) keys in device
 * order. Returns the number of colours. */
static uint32_t refine_step(const struct plan *p, GArray *const *rel, const uint32_t *col,
                            uint32_t *next) {
  GHashTable *ids =
      g_hash_table_new_full(g_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref, NULL);
  GArray *key = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const GArray *r = rel[p->device_class[d]];
    g_array_set_size(key, 0);
    g_array_append_val(key, col[d]);
    for (uint32_t k = 0; k < r->len; k++) {
      uint32_t peer = relation_peer(p, g_array_index(r, uint64_t, k), d);
      uint32_t v = peer == IR_NONE ? IR_NONE : col[peer];
      g_array_append_val(key, v);
    }
    GBytes *b = g_bytes_new(key->data, key->len * sizeof(uint32_t));
    gpointer id = g_hash_table_lookup(ids, b);
    if (id) {
      g_bytes_unref(b);
    } else {
      id = GUINT_TO_POINTER(g_hash_table_size(ids) + 1);
      g_hash_table_insert(ids, b, id);
    }
    next[d] = GPOINTER_TO_UINT(id) - 1;
  }
  uint32_t n = g_hash_table_size(ids);
  g_array_free(key, TRUE);
  g_hash_table_destroy(ids);
  return n;
}

/* colour[d] of a stable partition (NULL when a device has no class: the device run decides),
 * *n its colours. Each step costs the devices times their classes' relations. */
static uint32_t *device_colours(const struct plan *p, uint32_t *n) {
  for (uint32_t d = 0; d < p->n_devices; d++)
    if (p->device_class[d] >= p->n_classes)
      return NULL;
  GArray **rel = g_new(GArray *, p->n_classes ? p->n_classes : 1);
  for (uint32_t c = 0; c < p->n_classes; c++)
    rel[c] = class_relations(p, &p->classes[c]);
  uint32_t *col = g_new(uint32_t, p->n_devices ? p->n_devices : 1);
  uint32_t *next = g_new(uint32_t, p->n_devices ? p->n_devices : 1);
  for (uint32_t d = 0; d < p->n_devices; d++)
    col[d] = p->device_class[d];
  *n = p->n_classes;
  for (;;) { /* a step never merges colours, so an unchanged count means nothing split */
    uint32_t n2 = refine_step(p, rel, col, next);
    memcpy(col, next, p->n_devices * sizeof *col);
    if (n2 == *n)
      break;
    *n = n2;
  }
  for (uint32_t c = 0; c < p->n_classes; c++)
    g_array_free(rel[c], TRUE);
  g_free(rel);
  g_free(next);
  return col;
}

/* ---- the run ------------------------------------------------------------------------------ */

static void progress_init(struct progress *s, uint32_t n_units) {
  s->n_units = n_units;
  s->pc = g_new(uint32_t *, n_units ? n_units : 1);
  s->arrived = g_new(bool *, n_units ? n_units : 1);
  s->outstanding = g_new(uint32_t *, n_units ? n_units : 1);
  for (uint32_t u = 0; u < n_units; u++) {
    s->pc[u] = g_new0(uint32_t, s->p->n_streams);
    s->arrived[u] = g_new0(bool, s->p->n_streams);
    s->outstanding[u] = g_new0(uint32_t, s->p->n_streams);
  }
  s->arrivals = g_hash_table_new_full(arrival_hash, arrival_equal, NULL, arrival_free);
  s->work = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  s->queued = g_new0(bool, n_units ? n_units : 1);
}

static void progress_free(struct progress *s) {
  for (uint32_t u = 0; u < s->n_units; u++) {
    g_free(s->pc[u]);
    g_free(s->arrived[u]);
    g_free(s->outstanding[u]);
  }
  g_free(s->pc);
  g_free(s->arrived);
  g_free(s->outstanding);
  g_hash_table_destroy(s->arrivals);
  g_array_free(s->work, TRUE);
  g_free(s->queued);
}

/* Runs every unit as far as it goes. False on a mismatch, or (*stuck) when some unit did not
 * finish; the device run then says where in err. */
static bool progress_run(struct progress *s, bool *stuck, GError **err) {
  *stuck = false;
  for (uint32_t u = 0; u < s->n_units; u++)
    enqueue(s, u);
  for (uint32_t k = 0; k < s->work->len; k++) {
    uint32_t u = g_array_index(s->work, uint32_t, k);
    s->queued[u] = false;
    if (!advance(s, u, err))
      return false;
    /* Compact the queue now and then so it stays bounded by the unit count. */
    if (k > 4096 && k * 2 > s->work->len) {
      g_array_remove_range(s->work, 0, k + 1);
      k = (uint32_t)-1;
    }
  }
  for (uint32_t u = 0; u < s->n_units; u++) {
    const struct plan_class *c = unit_class(s, u);
    for (uint32_t st = 0; st < s->p->n_streams; st++)
      if (s->pc[u][st] < c->stream_first[st + 1] - c->stream_first[st]) {
        *stuck = true;
        if (!s->colour)
          report_deadlock(s, err);
        return false;
      }
  }
  return true;
}

/* The run over one unit per colour; false when it does not finish (no error set). */
static bool check_by_colour(const struct plan *p, uint32_t **stream_pos) {
  uint32_t n = 0;
  uint32_t *col = device_colours(p, &n);
  if (!col)
    return false;
  uint32_t *rep = g_new(uint32_t, n ? n : 1), *weight = g_new0(uint32_t, n ? n : 1);
  for (uint32_t d = p->n_devices; d-- > 0;) { /* colours number devices in order: rep = first */
    rep[col[d]] = d;
    weight[col[d]]++;
  }
  struct progress s = {.p = p, .unit_rep = rep, .colour = col, .weight = weight,
                       .stream_pos = stream_pos};
  progress_init(&s, n);
  bool stuck;
  bool ok = progress_run(&s, &stuck, NULL);
  progress_free(&s);
  g_free(rep);
  g_free(weight);
  g_free(col);
  return ok;
}

bool plan_check_progress(const struct plan *p, GError **err) {
  uint32_t **stream_pos = g_new(uint32_t *, p->n_classes ? p->n_classes : 1);
  for (uint32_t c = 0; c < p->n_classes; c++) {
    const struct plan_class *pc = &p->classes[c];
    stream_pos[c] = g_new(uint32_t, pc->n_instrs ? pc->n_instrs : 1);
    for (uint32_t st = 0; st < p->n_streams; st++)
      for (uint32_t k = pc->stream_first[st]; k < pc->stream_first[st + 1]; k++)
        stream_pos[c][pc->stream_instrs[k]] = k - pc->stream_first[st];
  }
  bool ok = check_by_colour(p, stream_pos);
  if (!ok) {
    struct progress s = {.p = p, .stream_pos = stream_pos};
    progress_init(&s, p->n_devices);
    bool stuck;
    ok = progress_run(&s, &stuck, err);
    progress_free(&s);
  }
  for (uint32_t c = 0; c < p->n_classes; c++)
    g_free(stream_pos[c]);
  g_free(stream_pos);
  return ok;
}
