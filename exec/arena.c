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

bool exec_arena_plan(const struct plan_class *c, uint64_t align, struct exec_arena *out,
                     GError **err) {
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
  exec_arena_class_events(c, ev);
  bool ok = exec_arena_plan_events(c->n_tensors, c->tensors,
                                   (const struct exec_arena_event *)(void *)ev->data, ev->len,
                                   align, out, err);
  g_array_free(ev, TRUE);
  return ok;
}

void exec_arena_clear(struct exec_arena *a) {
  if (!a)
    return;
  g_free(a->offset);
  memset(a, 0, sizeof *a);
}
