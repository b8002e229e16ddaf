/* arena: the offline memory plan of one device's step. The plan's tensors come to life and die
 * in the class's issue order (the rule the simulator's memory figures use: an instruction's
 * outputs are allocated at its end before its inputs whose last consumer it is are freed);
 * an offline planner (first fit, or greedy by size where that packs tighter) gives each
 * tensor an offset in one arena, so a device backend makes one allocation per process and
 * carves it at those offsets with no allocator at run time.
 *
 *   GError *err = NULL;
 *   const struct plan_class *c = NULL; // from plan_device_class(plan, device)
 *   struct exec_arena a = {0};
 *   if (exec_arena_plan(c, 256, &a, &err))
 *     printf("arena %llu bytes, live peak %llu\n", (unsigned long long)a.size,
 *            (unsigned long long)a.live_peak);
 *   exec_arena_clear(&a);
 *
 * The events come from the plan's memory rule (plan_class_memory_events, ir/plan.h), the
 * one the simulator's memory timeline and the host executor follow.
 */
#ifndef PIPER_EXEC_ARENA_H
#define PIPER_EXEC_ARENA_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/plan.h"

/* One tensor coming to life (alloc, at instruction instr's start) or dying (at its end). */
struct exec_arena_event {
  uint32_t tensor;
  uint32_t instr;
  bool alloc;
};

/* The step's events of class c in issue order, appended to out (struct exec_arena_event):
 * each tensor allocated at its alloc instruction's start and freed at its release
 * instruction's end (plan_class_memory_events). Tensors of zero bytes have no events. */
void exec_arena_class_events(const struct plan_class *c, GArray *out);

/* exec_arena_class_events as a device's executor meets them: a receive that waits for nothing
 * and is not part of a point-to-point group has its buffers allocated when its stream is free
 * (exec/memory.c, recv_issue; the simulator's hold_ready_recv), that is after the previous
 * instruction on its stream has ended and released, or when the step begins for the first
 * one on its stream, not at its own turn in issue order. Planning them at their turn puts
 * them in slots still held by tensors issued between, whose blocks then go first fit above
 * the planned region. */
void exec_arena_device_events(const struct plan *p, const struct plan_class *c, GArray *out);

/* The plan: offset[t] of each tensor (UINT64_MAX where it has no events), the arena's size
 * (the highest end of any block) and the sum-of-live maximum over the events (what the
 * simulator reports for the same order). First fit keeps the arena within the live peak plus
 * the gaps freed blocks leave behind: size >= live_peak, with equality whenever every free
 * releases the block allocated last (stack order) and in general size <= sum of all tensors. */
struct exec_arena {
  uint32_t n_tensors;
  uint64_t *offset; /* [n_tensors] */
  uint64_t size, live_peak;
  uint32_t n_events;
  uint64_t first_fit_size; /* exec_arena_plan_best: what first fit needed */
  bool greedy;             /* exec_arena_plan_best took greedy by size */
};

/* First fit over events (from exec_arena_class_events or made by hand), blocks aligned to align bytes (a power of
 * two). Input error: a free of a tensor not
 * live. */
bool exec_arena_plan_events(uint32_t n_tensors, const struct plan_tensor *tensors,
                            const struct exec_arena_event *events, uint32_t n_events,
                            uint64_t align, struct exec_arena *out, GError **err);
/* The smaller of first fit and greedy by size (largest tensors first, each at the lowest
 * offset clear of those it lives with: offline, the whole order is known), which packs real
 * plans to their live peak where first fit leaves holes. exec_arena_plan plans a class so. */
bool exec_arena_plan_best(uint32_t n_tensors, const struct plan_tensor *tensors,
                          const struct exec_arena_event *events, uint32_t n_events,
                          uint64_t align, struct exec_arena *out, GError **err);
bool exec_arena_plan(const struct plan_class *c, uint64_t align, struct exec_arena *out,
                     GError **err);
/* The class's tensors at the bytes a backend holds: each tensor's bytes times held / counted
 * (a backend keeping activations in fp32, 4 bytes, where the plan counts a bf16 model's at 2),
 * rounded up; g_free the array. */
struct plan_tensor *exec_arena_tensors_held(const struct plan_class *c, uint64_t counted,
                                            uint64_t held);
void exec_arena_clear(struct exec_arena *a);

/* Carving at run time: a backend places each block the executor allocates for plan tensor t
 * in t's planned slot [offset[t], offset[t] + slot bytes), blocks of one tensor one after the
 * other. A block goes elsewhere (false: the caller's fallback) when it does not fit what is
 * left of the slot, or when a tensor sharing bytes of the slot is still live: the run's order
 * met the plan's only in part (the runner issues in the plan's order, so this is rare).
 * overlaps[t] lists the tensors whose slots share bytes with t's: the ones that held those
 * bytes before, whose last users a device backend makes t's first writer wait for. */
struct exec_arena_carver {
  const struct exec_arena *arena;
  uint32_t n_tensors;
  uint64_t *slot;          /* [n_tensors] planned bytes */
  uint64_t *used;          /* [n_tensors] bytes carved so far while live, from the slot's start */
  uint32_t *blocks;        /* [n_tensors] live blocks (both sides) */
  uint64_t *used_top;      /* [n_tensors] the same from the slot's top down */
  uint32_t *blocks_top;    /* [n_tensors] live blocks of those */
  uint32_t *overlap_first; /* [n_tensors + 1] into overlap */
  uint32_t *overlap;
  uint64_t carved_bytes, fallback_bytes; /* since init */
  uint32_t carved_blocks, fallback_blocks;
};

/* tensors: those the arena was planned over (t's slot: its bytes aligned up). */
void exec_arena_carver_init(struct exec_arena_carver *cv, const struct exec_arena *a,
                            const struct plan_tensor *tensors, uint64_t align);
/* *offset of a block of bytes for tensor t, or false (counted as a fallback): from the slot's
 * start up, or with top from its top down; each side starts over when its last block goes. */
bool exec_arena_carve(struct exec_arena_carver *cv, uint32_t t, uint64_t bytes, uint64_t align,
                      bool top, uint64_t *offset);
/* One carved block of t released (top: one from the top down): the slot is free again with
 * its last one. */
void exec_arena_carve_release(struct exec_arena_carver *cv, uint32_t t, bool top);
void exec_arena_carver_clear(struct exec_arena_carver *cv);

#endif
