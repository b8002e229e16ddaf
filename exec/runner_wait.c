/* runner_wait: waiting for a step's streams under the watchdog. A wait that sees no progress
 * for the timeout, or a failed stream, ends in one error naming the rank, the instruction it
 * waits on and its peer; every rank then agrees on the end (no abort when all failed alike). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/assert.h"
#include "../base/json.h"
#include "runner-impl.h"

static const char *instr_peer_text(const struct runner *R, uint32_t i, char *buf, size_t len) {
  const struct exec_instr *x = &R->dev->instrs[i];
  buf[0] = 0;
  if (x->role == EXEC_ROLE_SEND)
    g_snprintf(buf, len, " (sending to rank %u)", x->peer);
  if (x->role == EXEC_ROLE_RECV)
    g_snprintf(buf, len, " (receiving from rank %u)", x->peer);
  if (x->comm != IR_NONE && x->role != EXEC_ROLE_SEND && x->role != EXEC_ROLE_RECV) {
    char cn[64];
    plan_comm_name(R->dev->plan, R->dev->comm_keys[x->comm].comm, cn, sizeof cn);
    g_snprintf(buf, len, " (collective on %s)", cn);
  }
  return buf;
}

/* One line naming what this rank waits on: the longest-running instruction, else the
 * longest-waiting one. */
static void stall_error(struct runner *R, double idle, GError **err) {
  const struct plan *p = R->dev->plan;
  double now = exec_backend_clock(R->b);
  int best = -1, best_rank = -1;
  double best_age = -1;
  struct exec_stream_status best_st = {0};
  for (uint32_t s = 0; s < p->n_streams; s++) {
    if (!R->streams[s])
      continue;
    struct exec_stream_status st;
    exec_stream_status(R->b, R->streams[s], &st);
    int rank = st.phase == EXEC_STREAM_RUNNING ? 2 : st.phase == EXEC_STREAM_WAITING ? 1 : 0;
    if (rank == 0)
      continue;
    double age = now - st.since;
    if (rank > best_rank || (rank == best_rank && age > best_age)) {
      best = (int)s;
      best_rank = rank;
      best_age = age;
      best_st = st;
    }
  }
  if (best < 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "rank %u: watchdog: no progress for %.1f s in a job-wide operation between steps "
                "(stream control; a peer rank may have died)",
                R->rank, idle);
    return;
  }
  uint32_t i = best_st.task_id;
  char nb[256] = "?", peer[96] = "";
  if (i < R->dev->n_instrs) {
    plan_node_name(p, R->dev->instrs[i].node, nb, sizeof nb);
    instr_peer_text(R, i, peer, sizeof peer);
  }
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
              "rank %u: watchdog: no progress for %.1f s: stream \"%s\" is %s instruction %u "
              "\"%s\"%s",
              R->rank, idle, p->streams[best].name,
              best_rank == 2 ? "stuck in" : "waiting to start", i, nb, peer);
}

/* The first error of a failed stream (by time), or NULL. */
static const GError *stream_failure(struct runner *R) {
  const GError *first = NULL;
  double when = INFINITY;
  uint32_t n = R->dev->plan->n_streams;
  for (uint32_t s = 0; s <= n; s++) {
    struct exec_stream *st = s < n ? R->streams[s] : R->control;
    if (!st)
      continue;
    struct exec_stream_status ss;
    exec_stream_status(R->b, st, &ss);
    if (!ss.failed)
      continue;
    const GError *e = exec_stream_error(R->b, st);
    if (e && ss.since < when) {
      first = e;
      when = ss.since;
    }
  }
  return first;
}

/* The process watchdog's thread reported first and is ending the job: stay silent (one
 * line in all) until it has. */
static void await_job_end(void) {
  for (;;)
    g_usleep(G_USEC_PER_SEC);
}

/* Gives up the step: every posted request is cancelled or completed before anything is
 * freed (exec_backend_cancel), and the error says why. */
static bool give_up(struct runner *R, const GError *failure, double idle, GError **err) {
  if (!failure && exec_watchdog_running() && !exec_watchdog_claim())
    await_job_end();
  if (failure)
    g_propagate_error(err, g_error_copy(failure));
  else
    stall_error(R, idle, err);
  exec_backend_cancel(R->b);
  return false;
}

/* Waits until every event in evs has completed, running the backend (its event loop, for the
 * host) in slices between which the watchdog looks: a failed stream, or no progress for
 * timeout_s, gives up. */
bool exec_runner_wait_events(struct runner *R, struct exec_event **evs, uint32_t n,
                             GError **err) {
  /* a gap of many 0.05 s slices between two looks: this process was stopped, not its peers */
  struct exec_stall_clock clock;
  exec_stall_clock_init(&clock, exec_backend_progress(R->b), exec_backend_clock(R->b), 1.0);
  for (uint32_t k = 0; k < n; k++) {
    if (!evs[k])
      continue;
    while (!exec_event_synchronize(R->b, evs[k], 0.05)) {
      const GError *f = stream_failure(R);
      double idle;
      bool restarted = exec_stall_clock_look(&clock, exec_backend_progress(R->b),
                                             exec_backend_clock(R->b), &idle);
      if (f)
        return give_up(R, f, 0, err);
      if (restarted)
        exec_watchdog_progress();
      else if (idle > R->o->timeout_s)
        return give_up(R, NULL, idle, err);
    }
    exec_watchdog_progress();
  }
  const GError *f = stream_failure(R);
  return f ? give_up(R, f, 0, err) : true;
}

/* Runs fn on the control stream and waits for it under the watchdog. */
static bool run_control(struct exec_stream *stream, void *arg, GError **err) {
  (void)stream; /* job-wide operations are host work: no kernels */
  struct control_job *c = arg;
  return c->fn(c->R, c->arg, err);
}

bool exec_runner_control(struct runner *R, bool (*fn)(struct runner *, void *, GError **),
                         void *arg, GError **err) {
  struct control_job c = {R, fn, arg};
  exec_stream_submit(R->b, R->control, run_control, &c, UINT32_MAX);
  exec_event_record(R->b, R->control_end, R->control);
  return exec_runner_wait_events(R, &R->control_end, 1, err);
}

