/* watchdog: the process-wide watchdog of exec.h. A thread that only reads a progress counter
 * and the name of the phase the process is in, so it can judge a hang anywhere (inside a
 * blocking MPI_Comm_split or MPI_Finalize as well as inside a step) without touching state the
 * main thread owns. Its report and the runner's own (which names the instruction) are one
 * line in all: whoever claims first reports, the other stays silent. */
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include <glib.h>

#include "../base/base.h"
#include "watchdog.h"

static struct {
  GMutex lock; /* phase, rank, abort function, stop */
  GCond wake;
  GThread *thread;
  bool stop;
  char program[32];
  char phase[160];
  bool self_checked;
  int64_t rank; /* -1 until known */
  double timeout_s;
  void (*abort_fn)(void *data, int code);
  void *abort_data;
  atomic_ullong progress;
  atomic_bool claimed;
} wd = {.rank = -1};

/* How often the thread looks, in microseconds: a tenth of the shortest timeout tried. */
#define WATCH_PERIOD_US 50000

/* Extra time where exec_run watches itself: it names the instruction, so it should win. */
static double grace(double timeout_s) {
  return timeout_s + 1.0;
}

static void end_job(void) {
  g_mutex_lock(&wd.lock);
  void (*fn)(void *, int) = wd.abort_fn;
  void *data = wd.abort_data;
  g_mutex_unlock(&wd.lock);
  if (fn)
    fn(data, 1);
  _exit(1);
}

static void report(double idle) {
  g_mutex_lock(&wd.lock);
  char rank[32] = "";
  if (wd.rank >= 0)
    g_snprintf(rank, sizeof rank, "rank %lld: ", (long long)wd.rank);
  fprintf(stderr, "%s: error: %swatchdog: no progress for %.1f s in %s\n", wd.program, rank, idle,
          wd.phase);
  fflush(stderr);
  g_mutex_unlock(&wd.lock);
}

void exec_stall_clock_init(struct exec_stall_clock *c, uint64_t progress, double now,
                           double stop_gap_s) {
  *c = (struct exec_stall_clock){progress, now, now, stop_gap_s};
}

bool exec_stall_clock_look(struct exec_stall_clock *c, uint64_t progress, double now,
                           double *idle) {
  bool paused = now - c->looked > c->stop_gap_s;
  c->looked = now;
  bool restarted = progress != c->seen || paused;
  if (restarted) {
    c->seen = progress;
    c->last = now;
  }
  *idle = now - c->last;
  return restarted;
}

static gpointer watch(gpointer data) {
  (void)data;
  /* a gap of many periods between two looks: this process itself was stopped (SIGSTOP, then
   * SIGCONT from the launcher that ends the job): not a hang to report */
  struct exec_stall_clock clock;
  exec_stall_clock_init(&clock, atomic_load(&wd.progress), piper_clock_seconds(),
                        20 * WATCH_PERIOD_US * 1e-6);
  g_mutex_lock(&wd.lock);
  while (!wd.stop) {
    g_cond_wait_until(&wd.wake, &wd.lock, g_get_monotonic_time() + WATCH_PERIOD_US);
    double idle;
    if (exec_stall_clock_look(&clock, atomic_load(&wd.progress), piper_clock_seconds(), &idle) ||
        wd.stop)
      continue;
    double limit = wd.timeout_s + (wd.self_checked ? grace(wd.timeout_s) : 0);
    if (idle <= limit)
      continue;
    g_mutex_unlock(&wd.lock);
    if (exec_watchdog_claim()) {
      report(idle);
      end_job();
    }
    /* the runner reported and is ending the job: end it ourselves if that hangs too */
    g_mutex_lock(&wd.lock);
    if (idle > limit + wd.timeout_s) {
      g_mutex_unlock(&wd.lock);
      end_job();
    }
  }
  g_mutex_unlock(&wd.lock);
  return NULL;
}

void exec_watchdog_start(const char *program, double timeout_s) {
  if (wd.thread)
    return;
  g_strlcpy(wd.program, program, sizeof wd.program);
  g_strlcpy(wd.phase, "start-up", sizeof wd.phase);
  wd.timeout_s = timeout_s;
  wd.stop = false;
  atomic_store(&wd.claimed, false);
  wd.thread = g_thread_new("px-watchdog", watch, NULL);
}

void exec_watchdog_stop(void) {
  if (!wd.thread)
    return;
  g_mutex_lock(&wd.lock);
  wd.stop = true;
  g_cond_signal(&wd.wake);
  g_mutex_unlock(&wd.lock);
  g_thread_join(wd.thread);
  wd.thread = NULL;
}

void exec_watchdog_set_rank(uint32_t rank) {
  g_mutex_lock(&wd.lock);
  wd.rank = rank;
  g_mutex_unlock(&wd.lock);
}

void exec_watchdog_set_abort(void (*fn)(void *data, int code), void *data) {
  g_mutex_lock(&wd.lock);
  wd.abort_fn = fn;
  wd.abort_data = data;
  g_mutex_unlock(&wd.lock);
}

void exec_watchdog_phase(const char *phase, bool self_checked) {
  g_mutex_lock(&wd.lock);
  g_strlcpy(wd.phase, phase, sizeof wd.phase);
  wd.self_checked = self_checked;
  g_mutex_unlock(&wd.lock);
  atomic_fetch_add(&wd.progress, 1);
}

void exec_watchdog_progress(void) {
  atomic_fetch_add(&wd.progress, 1);
}

bool exec_watchdog_claim(void) {
  bool expected = false;
  return atomic_compare_exchange_strong(&wd.claimed, &expected, true);
}

bool exec_watchdog_running(void) {
  return wd.thread != NULL;
}
