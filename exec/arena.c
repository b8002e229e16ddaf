/* arena: lifetimes of a class's tensors in issue order, and a first-fit placement of them in
 * one block of memory. Free blocks are found by walking the live blocks sorted by offset: a
 * step has thousands of tensors at most, and this runs once before the first step. */
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "arena.h"

/* The plan's memory rule (plan_class_memory_events: allocation at the alloc instruction's
 * start, release at the release instruction's end), the one the simulator follows; tensors of
 * no bytes take no room. */
void exec_arena_class_events(const struct plan_class *c, GArray *out) {
  struct plan_memory_event *ev = NULL;
  uint32_t n = plan_class_memory_events(c, &ev);
  for (uint32_t k = 0; k < n; k++) {
    if (c->tensors[ev[k].tensor].bytes == 0)
      continue;
    struct exec_arena_event e = {ev[k].tensor, ev[k].instr, !ev[k].release};
    g_array_append_val(out, e);
  }
  g_free(ev);
}

/* Where an event falls in the executor's order: at instruction pos, phase 0 (a receive
 * posted when the step begins), 1 (allocations at the start), 2 (releases at the end), 3 (a
 * receive posted once the previous instruction of its stream has released). */
struct keyed_event {
  struct exec_arena_event e;
  uint32_t pos, phase, order;
};

static int compare_keyed_event(const void *a, const void *b) {
  const struct keyed_event *x = a, *y = b;
  if (x->pos != y->pos)
    return x->pos < y->pos ? -1 : 1;
  if (x->phase != y->phase)
    return x->phase < y->phase ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* The instruction before i on i's stream, IR_NONE for the stream's first; prev[] is filled
 * once for the class. */
static uint32_t *stream_previous(const struct plan *p, const struct plan_class *c) {
  uint32_t *prev = g_new(uint32_t, c->n_instrs ? c->n_instrs : 1);
  for (uint32_t st = 0; st < p->n_streams; st++)
    for (uint32_t e = c->stream_first[st]; e < c->stream_first[st + 1]; e++)
      prev[c->stream_instrs[e]] = e > c->stream_first[st] ? c->stream_instrs[e - 1] : IR_NONE;
  return prev;
}

void exec_arena_device_events(const struct plan *p, const struct plan_class *c, GArray *out) {
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
  exec_arena_class_events(c, ev);
  uint32_t *prev = stream_previous(p, c);
  struct keyed_event *k = g_new(struct keyed_event, ev->len ? ev->len : 1);
  for (guint n = 0; n < ev->len; n++) {
    struct exec_arena_event e = g_array_index(ev, struct exec_arena_event, n);
    k[n] = (struct keyed_event){e, e.instr, e.alloc ? 1 : 2, n};
    const struct plan_instr *in = &c->instrs[e.instr];
    /* the same conditions as the executor's and the simulator's early posting */
    if (!e.alloc || p->nodes[in->node].kind != IR_NODE_RECV || in->group_parts > 0 ||
        in->wait_count > 0)
      continue;
    uint32_t q = prev[e.instr];
    k[n].pos = q == IR_NONE ? 0 : q;
    k[n].phase = q == IR_NONE ? 0 : 3;
  }
  qsort(k, ev->len, sizeof *k, compare_keyed_event);
  for (guint n = 0; n < ev->len; n++)
    g_array_append_val(out, k[n].e);
  g_free(k);
  g_free(prev);
  g_array_free(ev, TRUE);
}

struct block {
  uint64_t offset, bytes;
};

static int compare_block(const void *a, const void *b) {
  const struct block *x = a, *y = b;
  return piper_cmp_u64(&x->offset, &y->offset);
}

static uint64_t align_up(uint64_t v, uint64_t align) {
  return (v + align - 1) & ~(align - 1);
}

/* The lowest offset where bytes fit between the live blocks (sorted by offset). */
static uint64_t first_fit(const GArray *live, uint64_t bytes, uint64_t align) {
  uint64_t at = 0;
  for (guint k = 0; k < live->len; k++) {
    const struct block *b = &g_array_index(live, struct block, k);
    if (b->offset >= at + bytes)
      return at;
    at = align_up(b->offset + b->bytes, align);
  }
  return at;
}

static void remove_block(GArray *live, uint64_t offset) {
  for (guint k = 0; k < live->len; k++)
    if (g_array_index(live, struct block, k).offset == offset) {
      g_array_remove_index(live, k);
      return;
    }
  PIPER_UNREACHABLE();
}

bool exec_arena_plan_events(uint32_t n_tensors, const struct plan_tensor *tensors,
                            const struct exec_arena_event *events, uint32_t n_events,
                            uint64_t align, struct exec_arena *out, GError **err) {
  PIPER_ASSERT(align > 0 && (align & (align - 1)) == 0);
  memset(out, 0, sizeof *out);
  out->n_tensors = n_tensors;
  out->n_events = n_events;
  out->offset = g_new(uint64_t, n_tensors ? n_tensors : 1);
  for (uint32_t t = 0; t < n_tensors; t++)
    out->offset[t] = UINT64_MAX;
  bool *live_t = g_new0(bool, n_tensors ? n_tensors : 1);
  GArray *live = g_array_new(FALSE, FALSE, sizeof(struct block));
  uint64_t sum = 0;
  bool ok = true;
  for (uint32_t k = 0; k < n_events && ok; k++) {
    const struct exec_arena_event *e = &events[k];
    PIPER_ASSERT(e->tensor < n_tensors);
    uint64_t bytes = align_up(tensors[e->tensor].bytes, align);
    if (e->alloc == live_t[e->tensor]) {
      ok = piper_input_error(err, "arena: event %u %s tensor %u, which is %s", k,
                             e->alloc ? "allocates" : "frees", e->tensor,
                             live_t[e->tensor] ? "live" : "not live");
      break;
    }
    live_t[e->tensor] = e->alloc;
    if (e->alloc) {
      struct block b = {first_fit(live, bytes, align), bytes};
      out->offset[e->tensor] = b.offset;
      g_array_append_val(live, b);
      g_array_sort(live, compare_block);
      if (b.offset + b.bytes > out->size)
        out->size = b.offset + b.bytes;
      sum += bytes;
      if (sum > out->live_peak)
        out->live_peak = sum;
    } else {
      remove_block(live, out->offset[e->tensor]);
      sum -= bytes;
    }
  }
  g_array_free(live, TRUE);
  g_free(live_t);
  if (!ok)
    exec_arena_clear(out);
  return ok;
}

/* ---- greedy by size: the offline alternative ----------------------------------------------
 * First fit in issue order places a tensor before it knows what comes later, so a small
 * early tensor can split the room a large later one needs. Offline the whole schedule is
 * known: placing the largest tensors first, each at the lowest offset clear of every placed
 * tensor whose lifetime meets its own (TFLite's greedy-by-size arena planner), usually packs to
 * the live peak. Lifetimes are event indices: [alloc, free), free = n_events when never freed. */

struct lifetime {
  uint32_t tensor, first, last;
  uint64_t bytes;
};

static int compare_lifetime_by_size(const void *a, const void *b) {
  const struct lifetime *x = a, *y = b;
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  return x->first < y->first ? -1 : x->first > y->first;
}

/* The lowest offset for l clear of placed[0..n) that overlap it in time; placed is kept
 * sorted by offset (insertion), so the scan is one pass. */
static uint64_t greedy_offset(const struct lifetime *l, const struct lifetime *placed, uint32_t n,
                              const uint64_t *offset, uint64_t align) {
  uint64_t at = 0;
  for (uint32_t k = 0; k < n; k++) {
    const struct lifetime *p = &placed[k];
    if (p->last <= l->first || l->last <= p->first)
      continue; /* never live together */
    uint64_t o = offset[p->tensor];
    if (o >= at + l->bytes)
      return at;
    uint64_t end = align_up(o + p->bytes, align);
    at = end > at ? end : at;
  }
  return at;
}

/* Greedy-by-size offsets for the events (already checked by first fit: they pair up) into
 * offset[], and the size they need. */
static uint64_t greedy_by_size(uint32_t n_tensors, const struct plan_tensor *tensors,
                               const struct exec_arena_event *events, uint32_t n_events,
                               uint64_t align, uint64_t *offset) {
  struct lifetime *l = g_new0(struct lifetime, n_tensors ? n_tensors : 1);
  uint32_t n = 0;
  uint32_t *slot = g_new(uint32_t, n_tensors ? n_tensors : 1);
  for (uint32_t k = 0; k < n_events; k++) {
    const struct exec_arena_event *e = &events[k];
    if (e->alloc) {
      slot[e->tensor] = n;
      l[n++] = (struct lifetime){e->tensor, k, n_events, align_up(tensors[e->tensor].bytes, align)};
    } else {
      l[slot[e->tensor]].last = k;
    }
  }
  qsort(l, n, sizeof *l, compare_lifetime_by_size);
  struct lifetime *placed = g_new(struct lifetime, n ? n : 1);
  uint64_t size = 0;
  for (uint32_t k = 0; k < n; k++) {
    uint64_t o = greedy_offset(&l[k], placed, k, offset, align);
    offset[l[k].tensor] = o;
    /* insert by offset */
    uint32_t at = k;
    while (at > 0 && offset[placed[at - 1].tensor] > o) {
      placed[at] = placed[at - 1];
      at--;
    }
    placed[at] = l[k];
    if (o + l[k].bytes > size)
      size = o + l[k].bytes;
  }
  g_free(placed);
  g_free(slot);
  g_free(l);
  return size;
}

bool exec_arena_plan_best(uint32_t n_tensors, const struct plan_tensor *tensors,
                          const struct exec_arena_event *events, uint32_t n_events, uint64_t align,
                          struct exec_arena *out, GError **err) {
  if (!exec_arena_plan_events(n_tensors, tensors, events, n_events, align, out, err))
    return false;
  out->first_fit_size = out->size;
  if (out->size == out->live_peak)
    return true; /* first fit is already exact */
  uint64_t *greedy = g_new(uint64_t, n_tensors ? n_tensors : 1);
  for (uint32_t t = 0; t < n_tensors; t++)
    greedy[t] = out->offset[t];
  uint64_t size = greedy_by_size(n_tensors, tensors, events, n_events, align, greedy);
  if (size < out->size) {
    g_free(out->offset);
    out->offset = greedy;
    out->size = size;
    out->greedy = true;
  } else {
    g_free(greedy);
  }
  return true;
}

bool exec_arena_plan(const struct plan_class *c, uint64_t align, struct exec_arena *out,
                     GError **err) {
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
  exec_arena_class_events(c, ev);
  bool ok = exec_arena_plan_best(c->n_tensors, c->tensors,
                                 (const struct exec_arena_event *)(void *)ev->data, ev->len, align,
                                 out, err);
  g_array_free(ev, TRUE);
  return ok;
}

struct plan_tensor *exec_arena_tensors_held(const struct plan_class *c, uint64_t counted,
                                            uint64_t held) {
  PIPER_ASSERT(counted > 0);
  struct plan_tensor *t = g_new(struct plan_tensor, c->n_tensors ? c->n_tensors : 1);
  for (uint32_t k = 0; k < c->n_tensors; k++) {
    t[k] = c->tensors[k];
    t[k].bytes = (c->tensors[k].bytes * held + counted - 1) / counted;
  }
  return t;
}

void exec_arena_clear(struct exec_arena *a) {
  if (!a)
    return;
  g_free(a->offset);
  memset(a, 0, sizeof *a);
}

/* ---- carving at run time ------------------------------------------------------------------ */

static bool slots_meet(const struct exec_arena *a, const uint64_t *slot, uint32_t x, uint32_t y) {
  return a->offset[x] < a->offset[y] + slot[y] && a->offset[y] < a->offset[x] + slot[x];
}

void exec_arena_carver_init(struct exec_arena_carver *cv, const struct exec_arena *a,
                            const struct plan_tensor *tensors, uint64_t align) {
  uint32_t n = a->n_tensors;
  memset(cv, 0, sizeof *cv);
  cv->arena = a;
  cv->n_tensors = n;
  cv->slot = g_new0(uint64_t, n ? n : 1);
  cv->used = g_new0(uint64_t, n ? n : 1);
  cv->blocks = g_new0(uint32_t, n ? n : 1);
  cv->used_top = g_new0(uint64_t, n ? n : 1);
  cv->blocks_top = g_new0(uint32_t, n ? n : 1);
  cv->overlap_first = g_new0(uint32_t, n + 1);
  for (uint32_t t = 0; t < n; t++)
    cv->slot[t] = a->offset[t] == UINT64_MAX ? 0 : align_up(tensors[t].bytes, align);
  /* slots sorted by offset: each meets only those starting before its end */
  struct block *by_offset = g_new(struct block, n ? n : 1);
  uint32_t m = 0;
  for (uint32_t t = 0; t < n; t++)
    if (cv->slot[t])
      by_offset[m++] = (struct block){a->offset[t], t};
  qsort(by_offset, m, sizeof *by_offset, compare_block);
  uint32_t *order = g_new(uint32_t, m ? m : 1);
  for (uint32_t i = 0; i < m; i++)
    order[i] = (uint32_t)by_offset[i].bytes; /* the tensor, in the size field */
  g_free(by_offset);
  GArray *pairs = g_array_new(FALSE, FALSE, sizeof(uint32_t) * 2);
  for (uint32_t i = 0; i < m; i++)
    for (uint32_t j = i + 1;
         j < m && a->offset[order[j]] < a->offset[order[i]] + cv->slot[order[i]]; j++)
      if (slots_meet(a, cv->slot, order[i], order[j])) {
        uint32_t pr[2] = {order[i], order[j]}, rp[2] = {order[j], order[i]};
        g_array_append_val(pairs, pr);
        g_array_append_val(pairs, rp);
        cv->overlap_first[order[i] + 1]++;
        cv->overlap_first[order[j] + 1]++;
      }
  for (uint32_t t = 0; t < n; t++)
    cv->overlap_first[t + 1] += cv->overlap_first[t];
  cv->overlap = g_new(uint32_t, pairs->len ? pairs->len : 1);
  uint32_t *fill = g_new0(uint32_t, n ? n : 1);
  for (guint k = 0; k < pairs->len; k++) {
    const uint32_t *pr = (const uint32_t *)(void *)(pairs->data + k * sizeof(uint32_t) * 2);
    cv->overlap[cv->overlap_first[pr[0]] + fill[pr[0]]++] = pr[1];
  }
  g_free(fill);
  g_array_free(pairs, TRUE);
  g_free(order);
}

bool exec_arena_carve(struct exec_arena_carver *cv, uint32_t t, uint64_t bytes, uint64_t align,
                      bool top, uint64_t *offset) {
  uint64_t need = align_up(bytes ? bytes : 1, align);
  bool ok = t < cv->n_tensors && cv->slot[t] && cv->used[t] + cv->used_top[t] + need <= cv->slot[t];
  /* the first block claims the slot: nothing sharing its bytes may still be live */
  for (uint32_t k = ok && cv->blocks[t] == 0 ? cv->overlap_first[t] : 0;
       ok && cv->blocks[t] == 0 && k < cv->overlap_first[t + 1]; k++)
    ok = cv->blocks[cv->overlap[k]] == 0;
  if (!ok) {
    cv->fallback_blocks++;
    cv->fallback_bytes += need;
    return false;
  }
  if (top) {
    cv->used_top[t] += need;
    cv->blocks_top[t]++;
    *offset = cv->arena->offset[t] + cv->slot[t] - cv->used_top[t];
  } else {
    *offset = cv->arena->offset[t] + cv->used[t];
    cv->used[t] += need;
  }
  cv->blocks[t]++;
  cv->carved_blocks++;
  cv->carved_bytes += need;
  return true;
}

void exec_arena_carve_release(struct exec_arena_carver *cv, uint32_t t, bool top) {
  PIPER_ASSERT(t < cv->n_tensors && cv->blocks[t] > 0);
  PIPER_ASSERT(!top || cv->blocks_top[t] > 0);
  cv->blocks[t]--;
  if (top && --cv->blocks_top[t] == 0)
    cv->used_top[t] = 0;
  if (!top && cv->blocks[t] == cv->blocks_top[t])
    cv->used[t] = 0;
}

void exec_arena_carver_clear(struct exec_arena_carver *cv) {
  if (!cv)
    return;
  g_free(cv->slot);
  g_free(cv->used);
  g_free(cv->blocks);
  g_free(cv->used_top);
  g_free(cv->blocks_top);
  g_free(cv->overlap_first);
  g_free(cv->overlap);
  memset(cv, 0, sizeof *cv);
}
