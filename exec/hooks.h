/* hooks: what a run can be told to do wrong on purpose (exec_options' hooks): a stalled
 * transfer, a stopped rank, poisoned buffers, a slow device. The fault runs of the tests use
 * them, and an operator may rehearse a failure with them (piper-exec's PIPER_EXEC_FAULT,
 * PIPER_EXEC_POISON and PIPER_EXEC_SLOW); all off by default.
 *
 *   struct exec_hooks h = {0};
 *   h.fault = EXEC_FAULT_STALL; // rank 1's first all-reduce of step 3 never completes
 *   h.fault_kind = EXEC_STALL_ALL_REDUCE;
 *   h.fault_rank = 1;
 *   h.fault_step = 3;
 */
#ifndef PIPER_EXEC_HOOKS_H
#define PIPER_EXEC_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

enum exec_fault { EXEC_FAULT_NONE, EXEC_FAULT_STALL };
/* Which communication a stall hits: the first instruction of the step of that kind (ANY:
 * the first communication of any kind, or the first instruction when there is none). */
enum exec_stall_kind {
  EXEC_STALL_ANY,
  EXEC_STALL_SEND,
  EXEC_STALL_RECV,
  EXEC_STALL_ALL_REDUCE,     /* DP gradient all-reduce */
  EXEC_STALL_REDUCE_SCATTER, /* ZeRO gradient reduce-scatter */
  EXEC_STALL_ALL_TO_ALL,     /* expert dispatch or combine */
  EXEC_STALL_ALL_GATHER,     /* ZeRO parameter gathers */
};

struct exec_hooks {
  /* Testing hook: EXEC_FAULT_STALL makes rank fault_rank's first instruction of kind
   * fault_kind in step fault_step (1-based) block until cancelled, as a transfer whose peer
   * never comes would (a receive nothing matches, on a communicator of its own). */
  enum exec_fault fault;
  enum exec_stall_kind fault_kind;
  uint32_t fault_rank, fault_step;
  /* Testing hooks: fill every fresh activation buffer with NaN, so a kernel that reads what it
   * did not write shows up as a NaN loss (piper-exec: PIPER_EXEC_POISON=1); make rank
   * slow_rank's compute take slow_factor (> 1) times as long (PIPER_EXEC_SLOW=rank:factor). */
  bool poison;
  uint32_t slow_rank;
  double slow_factor;
  /* Called at the start of every step (rank, 1-based step), e.g. to inject a crash; step 0:
   * at start-up, before the communicators are created. */
  void (*step_hook)(uint32_t rank, uint32_t step, void *data);
  void *step_hook_data;
};

#endif
