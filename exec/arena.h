/* arena: the offline memory plan of one device's step. The plan's tensors come to life and die
 * in the class's issue order (the rule the simulator's memory figures use: an instruction's
 * outputs are allocated at its end before its inputs whose last consumer it is are freed);
 * a first-fit planner gives each tensor an offset in one arena, so a device backend makes one
 * allocation per process and carves it with no allocator at run time.
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
};

/* First fit over events (from exec_arena_class_events or made by hand), blocks aligned to align bytes (a power of
 * two). Input error: a free of a tensor not
 * live. */
bool exec_arena_plan_events(uint32_t n_tensors, const struct plan_tensor *tensors,
                            const struct exec_arena_event *events, uint32_t n_events,
                            uint64_t align, struct exec_arena *out, GError **err);
bool exec_arena_plan(const struct plan_class *c, uint64_t align, struct exec_arena *out,
                     GError **err);
void exec_arena_clear(struct exec_arena *a);

#endif
