/* plan: the progress check. A dry run of every device's streams in which an instruction
 * completes once it heads its stream and its event waits are done; communication completes
 * when every member of its communicator instance has arrived at the same sequence number. A
 * point-to-point group arrives at all its parts at once and frees its stream when the last part
 * has met its peer (plan_instr.group_parts). Arrival is monotone (running a ready instruction never disables another), so this worklist
 * run reaches the same end state as a unit-time run in lock step; anything left unfinished is
 * a deadlock, reported with the devices and instructions that wait on each other. */
#include <string.h>

#include "../base/json.h"
#include "plan.h"

struct arrival {
  uint32_t count;
  uint32_t first_node; /* node of the first arrival, to check the others agree */
  uint32_t first_device;
  GArray *who; /* (device, stream) pairs waiting */
};

struct progress {
  const struct plan *p;
  uint32_t **pc;         /* [device][stream]: next position in the class's stream list */
  bool **arrived;        /* [device][stream]: head has arrived at its communication */
  uint32_t **outstanding; /* [device][stream]: parts of the head's group not yet met */
  uint32_t **stream_pos; /* [class][instr]: position of the instruction in its stream list */
  GHashTable *arrivals;  /* packed key -> struct arrival * */
  GArray *work;          /* devices to revisit */
  bool *queued;
};

static uint64_t arrival_key(const struct plan *p, const struct plan_instr *in, uint32_t device) {
  /* The instance of a communicator a device is in: PP pairs differ by the position of the
   * device in its side's group (a send of A[k] meets the recv of B[k]). */
  uint64_t instance = 0;
  if (p->comms[in->comm].purpose == IR_COMM_PP)
    instance = (uint64_t)plan_node_position(p, in->node, device);
  return ((uint64_t)in->comm << 44) | (instance << 28) | in->seq;
}

static bool done(const struct progress *s, uint32_t device, uint32_t instr) {
  const struct plan_class *c = plan_device_class(s->p, device);
  uint32_t cls = s->p->device_class[device];
  return s->stream_pos[cls][instr] < s->pc[device][c->instrs[instr].stream];
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

/* One part of what heads (device, st) has met its peers. A group completes, and its stream
 * moves past all its parts, when the last part has. */
static void part_met(struct progress *s, uint32_t device, uint32_t st) {
  if (s->outstanding[device][st] > 1) {
    s->outstanding[device][st]--;
    return;
  }
  const struct plan_class *c = plan_device_class(s->p, device);
  s->pc[device][st] += plan_group_span(c, c->stream_first[st] + s->pc[device][st]);
  s->outstanding[device][st] = 0;
  s->arrived[device][st] = false;
}

/* Instruction i of device, heading stream st (alone or as a part of a group), arrives at its
 * rendezvous; false on a mismatch error. */
static bool arrive(struct progress *s, uint32_t device, uint32_t st, uint32_t i, GError **err) {
  const struct plan *p = s->p;
  const struct plan_instr *in = &plan_device_class(p, device)->instrs[i];
  uint64_t key = arrival_key(p, in, device);
  struct arrival *a = g_hash_table_lookup(s->arrivals, &key);
  if (!a) {
    a = g_new0(struct arrival, 1);
    a->first_node = in->node;
    a->first_device = device;
    a->who = g_array_new(FALSE, FALSE, sizeof(uint32_t) * 2);
    uint64_t *k = g_new(uint64_t, 1);
    *k = key;
    g_hash_table_insert(s->arrivals, k, a);
  } else {
    const struct ir_node *x = &p->nodes[a->first_node], *y = &p->nodes[in->node];
    bool pair = (x->kind == IR_NODE_SEND && y->kind == IR_NODE_RECV && x->pair == in->node) ||
                (x->kind == IR_NODE_RECV && y->kind == IR_NODE_SEND && y->pair == a->first_node);
    if (x->kind != y->kind ? !pair : a->first_node != in->node)
      return mismatch(s, a, device, in->node, in->comm, in->seq, err);
  }
  uint32_t who[2] = {device, st};
  g_array_append_vals(a->who, who, 1);
  if (++a->count == plan_comm_size(p, in->comm)) {
    for (uint32_t k = 0; k < a->who->len; k++) {
      uint32_t *w = &g_array_index(a->who, uint32_t, 2 * k);
      part_met(s, w[0], w[1]);
      if (w[0] != device)
        enqueue(s, w[0]);
    }
    g_hash_table_remove(s->arrivals, &key);
  }
  return true;
}

/* Whether the n instructions from entry e of c's stream lists may be issued: their waits are
 * done. */
static bool parts_ready(const struct progress *s, uint32_t device, const struct plan_class *c,
                        uint32_t e, uint32_t n) {
  for (uint32_t k = 0; k < n; k++) {
    const struct plan_instr *in = &c->instrs[c->stream_instrs[e + k]];
    for (uint32_t w = 0; w < in->wait_count; w++)
      if (!done(s, device, c->waits[in->wait_first + w]))
        return false;
  }
  return true;
}

/* Runs what device can run now; false on a mismatch error. */
static bool advance(struct progress *s, uint32_t device, GError **err) {
  const struct plan *p = s->p;
  const struct plan_class *c = plan_device_class(p, device);
  bool changed = true;
  while (changed) {
    changed = false;
    for (uint32_t st = 0; st < p->n_streams; st++) {
      for (;;) {
        uint32_t pos = s->pc[device][st];
        if (pos >= c->stream_first[st + 1] - c->stream_first[st] || s->arrived[device][st])
          break;
        uint32_t e = c->stream_first[st] + pos, n = plan_group_span(c, e);
        if (!parts_ready(s, device, c, e, n))
          break;
        uint32_t i = c->stream_instrs[e];
        if (c->instrs[i].comm == IR_NONE) {
          s->pc[device][st]++;
          changed = true;
          continue;
        }
        /* Every part is posted before any is matched, as ncclGroupEnd or MPI_Waitall do. */
        s->arrived[device][st] = true;
        s->outstanding[device][st] = n;
        changed = true;
        for (uint32_t k = 0; k < n; k++)
          if (!arrive(s, device, st, c->stream_instrs[e + k], err))
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

bool plan_check_progress(const struct plan *p, GError **err) {
  struct progress s = {.p = p};
  bool ok = false;
  s.pc = g_new(uint32_t *, p->n_devices ? p->n_devices : 1);
  s.arrived = g_new(bool *, p->n_devices ? p->n_devices : 1);
  s.outstanding = g_new(uint32_t *, p->n_devices ? p->n_devices : 1);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    s.pc[d] = g_new0(uint32_t, p->n_streams);
    s.arrived[d] = g_new0(bool, p->n_streams);
    s.outstanding[d] = g_new0(uint32_t, p->n_streams);
  }
  s.stream_pos = g_new(uint32_t *, p->n_classes ? p->n_classes : 1);
  for (uint32_t c = 0; c < p->n_classes; c++) {
    const struct plan_class *pc = &p->classes[c];
    s.stream_pos[c] = g_new(uint32_t, pc->n_instrs ? pc->n_instrs : 1);
    for (uint32_t st = 0; st < p->n_streams; st++)
      for (uint32_t k = pc->stream_first[st]; k < pc->stream_first[st + 1]; k++)
        s.stream_pos[c][pc->stream_instrs[k]] = k - pc->stream_first[st];
  }
  s.arrivals = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, arrival_free);
  s.work = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  s.queued = g_new0(bool, p->n_devices ? p->n_devices : 1);
  for (uint32_t d = 0; d < p->n_devices; d++)
    enqueue(&s, d);
  for (uint32_t k = 0; k < s.work->len; k++) {
    uint32_t d = g_array_index(s.work, uint32_t, k);
    s.queued[d] = false;
    if (!advance(&s, d, err))
      goto out;
    /* Compact the queue now and then so it stays bounded by the device count. */
    if (k > 4096 && k * 2 > s.work->len) {
      g_array_remove_range(s.work, 0, k + 1);
      k = (uint32_t)-1;
    }
  }
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    for (uint32_t st = 0; st < p->n_streams; st++)
      if (s.pc[d][st] < c->stream_first[st + 1] - c->stream_first[st]) {
        report_deadlock(&s, err);
        goto out;
      }
  }
  ok = true;
out:
  for (uint32_t d = 0; d < p->n_devices; d++) {
    g_free(s.pc[d]);
    g_free(s.arrived[d]);
    g_free(s.outstanding[d]);
  }
  g_free(s.pc);
  g_free(s.arrived);
  g_free(s.outstanding);
  for (uint32_t c = 0; c < p->n_classes; c++)
    g_free(s.stream_pos[c]);
  g_free(s.stream_pos);
  g_hash_table_destroy(s.arrivals);
  g_array_free(s.work, TRUE);
  g_free(s.queued);
  return ok;
}
