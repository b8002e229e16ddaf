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

#endif
