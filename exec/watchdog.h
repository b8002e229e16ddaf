/* watchdog: the process watchdog. One per process, for its whole life: start-up (MPI initialisation, the start-up barrier),
 * communicator creation, the steps, teardown and finalisation. A thread that reads only a
 * progress counter and the current phase's name: when neither changes for timeout_s it prints
 * one line, "PROGRAM: error: rank R: watchdog: no progress for S s in PHASE", and ends the job
 * with the abort function (exit status 1), else _exit(1). In phases marked self_checked
 * (exec_run's steps, which report a stall themselves, naming the instruction) it waits
 * another timeout_s + 1 s and is the backstop. Without exec_watchdog_start every call below
 * does nothing (a library user, the tests).
 *
 *   exec_watchdog_start("piper-exec", 60.0);
 *   exec_watchdog_phase("start-up", false);
 *   exec_watchdog_progress(); // after each piece of work
 *   exec_watchdog_stop();
 */
#ifndef PIPER_EXEC_WATCHDOG_H
#define PIPER_EXEC_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

void exec_watchdog_start(const char *program, double timeout_s);
void exec_watchdog_stop(void);
void exec_watchdog_set_rank(uint32_t rank);
void exec_watchdog_set_abort(void (*fn)(void *data, int code), void *data);
void exec_watchdog_phase(const char *phase, bool self_checked);
void exec_watchdog_progress(void);
/* True for the first caller only: the one that reports a stall (the other stays silent). */
bool exec_watchdog_claim(void);
bool exec_watchdog_running(void);

/* The stall rule the watchdog thread and the runner's waits share: looked at regularly, a
 * waiter is idle since its progress counter last changed, but a gap between two looks longer
 * than stop_gap_s is this process's own pause (SIGSTOP, then SIGCONT), not its peers' silence,
 * and restarts the idle time as progress does. */
struct exec_stall_clock {
  uint64_t seen;
  double last, looked, stop_gap_s;
};
void exec_stall_clock_init(struct exec_stall_clock *c, uint64_t progress, double now,
                           double stop_gap_s);
/* One look: true when it restarted the idle time (progress, or a pause); *idle gets the
 * seconds without progress. */
bool exec_stall_clock_look(struct exec_stall_clock *c, uint64_t progress, double now,
                           double *idle);

#endif
