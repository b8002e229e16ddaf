/* prof host: what the simulator needs to model ranks sharing a node's cores (sim/profile.h,
 * "host"): the node's cores, the executor's loop per instruction, and under mpirun what testing
 * and waiting for communication cost the ranks beside it, and MPI's eager limit.
 *
 * The loop's cost is a task and an event record through the host backend, no kernel; a test
 * is one MPI_Test of posted communication; and what a rank waiting for communication costs a
 * rank computing on the same core: two ranks are pinned to one core, one waits in the host
 * backend's loop for a receive while the other counts GEMMs, against the count with the waiter
 * asleep. Under processor sharing the computing rank then runs at 1 / (1 + share). */
#include <sched.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "../base/base.h"
#include "../exec/backend.h"
#include "../kernels/kernels.h"
#include "prof-impl.h"

#ifdef HAVE_MPI
/* Seconds per MPI_Test of a receive from another rank that nothing matches (as the loop
 * tests posted work: the library polls its shared-memory queues), the median of 9 batches;
 * the receive is cancelled after. The other ranks sleep meanwhile. */
static double host_test_cost(const struct prof_run *r, uint32_t n) {
  char in = 0;
  MPI_Request req;
  MPI_Irecv(&in, 1, MPI_CHAR, 1, 99, r->comm, &req);
  int flag = 0;
  double t[9];
  for (int b = 0; b < 9; b++) {
    double t0 = piper_clock_seconds();
    for (uint32_t i = 0; i < n / 9 + 1; i++)
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    t[b] = (piper_clock_seconds() - t0) / (n / 9 + 1);
  }
  MPI_Cancel(&req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  return prof_median(t, 9);
}

/* GEMMs of 64^3 per second over `window` seconds. */
static double compute_rate(double window) {
  enum { N = 64 };
  static float a[N * N], b[N * N], c[N * N];
  double t0 = piper_clock_seconds(), t = t0;
  uint64_t calls = 0;
  while (t - t0 < window) {
    kernels_gemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
    calls++;
    if ((calls & 15) == 0)
      t = piper_clock_seconds();
  }
  return (double)calls / (piper_clock_seconds() - t0);
}

struct wait_arg {
  struct exec_backend *b;
  struct exec_comm *c;
  int32_t v;
  double seen; /* when the task saw the message */
};
static bool recv_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  struct wait_arg *w = arg;
  bool ok = exec_comm_recv(w->b, w->c, 0, &w->v, sizeof w->v, 5, err);
  w->seen = piper_clock_seconds();
  return ok;
}

/* Rank 1: waits in the backend's loop for one message; returns the wait's CPU share. */
static double waiter_once(struct exec_backend *b, struct exec_comm *c, double *seen, bool *ok,
                          GError **err) {
  struct exec_stream *st = exec_stream_create(b, "piper-prof wait", 0, err);
  if (!st) {
    *ok = false;
    return 0;
  }
  struct exec_event *e = exec_event_create(b);
  struct wait_arg w = {.b = b, .c = c};
  struct timespec c0, c1;
  double t0 = piper_clock_seconds();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  exec_stream_submit(b, st, recv_task, &w, 0);
  exec_event_record(b, e, st);
  *ok = exec_event_synchronize(b, e, 60) && *ok;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  double cpu_s = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
  exec_event_destroy(b, e);
  exec_stream_destroy(b, st);
  *seen = w.seen;
  return cpu_s / (piper_clock_seconds() - t0);
}

/* Rank 0: computes for window seconds while rank 1 waits, sends, and computes on so that the
 * core stays busy while the waiter must wake; returns the compute rate. */
static double computer_once(struct exec_backend *b, struct exec_comm *c, double window,
                            double *sent, bool *ok, GError **err) {
  double rate = compute_rate(window);
  int32_t v = 1;
  *sent = piper_clock_seconds();
  *ok = exec_comm_send(b, c, 1, &v, sizeof v, 5, err) && *ok;
  compute_rate(0.01);
  return rate;
}

enum { PAIR_ROUNDS = 7 };

/* Rank 1 sleeps in MPI (1 ms polls) until rank 0 says go. */
static void pair_go(const struct prof_run *r, int rank) {
  char go = 1;
  if (rank == 0) {
    MPI_Send(&go, 1, MPI_CHAR, 1, 96, r->comm);
    return;
  }
  MPI_Request req;
  MPI_Irecv(&go, 1, MPI_CHAR, 0, 96, r->comm, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag)
      g_usleep(1000);
  }
}

/* Both pinned to one core, in rounds (a change of the machine's load falls on both halves of a
 * round): rank 0 computes alone while rank 1 sleeps, then computes while rank 1 waits for it in
 * the backend's loop, sends, and computes on so that the core is busy when the waiter must
 * wake. Medians over the rounds. */
static bool host_wait_pair(struct prof_run *r, struct exec_backend *b, struct exec_comm *c,
                           double window, GError **err) {
  bool ok = true;
  double share[PAIR_ROUNDS], self[PAIR_ROUNDS], wake[PAIR_ROUNDS];
  for (int i = 0; i < PAIR_ROUNDS; i++) {
    double sent = 0, seen = 0;
    if (r->rank == 0) {
      double alone = compute_rate(window);
      pair_go(r, 0);
      double shared = computer_once(b, c, window, &sent, &ok, err);
      MPI_Recv(&seen, 1, MPI_DOUBLE, 1, 97, r->comm, MPI_STATUS_IGNORE);
      MPI_Recv(&self[i], 1, MPI_DOUBLE, 1, 98, r->comm, MPI_STATUS_IGNORE);
      share[i] = shared > 0 ? alone / shared - 1 : 0;
      wake[i] = seen - sent > 0 ? seen - sent : 0;
    } else if (r->rank == 1) {
      pair_go(r, 1);
      double mine = waiter_once(b, c, &seen, &ok, err);
      MPI_Send(&seen, 1, MPI_DOUBLE, 0, 97, r->comm);
      MPI_Send(&mine, 1, MPI_DOUBLE, 0, 98, r->comm);
    }
  }
  if (r->rank == 0) {
    double slow = prof_median(share, PAIR_ROUNDS);
    r->wait_pinned_slowdown = slow < 0 ? 0 : slow > 1 ? 1 : slow;
    r->wait_self_share = prof_median(self, PAIR_ROUNDS);
    r->wake_latency = prof_median(wake, PAIR_ROUNDS);
  }
  return ok;
}

/* Rank 1 waits in the backend's loop for rank 0, which computes meanwhile on the same core:
 * the share of the core the waiter takes, and how long after the message it notices. */
static bool host_wait_share(struct prof_run *r, struct exec_backend *b, GError **err) {
  uint32_t pair[2] = {0, 1};
  struct exec_comm *c = exec_comm_create(b, "piper-prof wait", pair, 2, true, err);
  if (!c)
    return false;
  cpu_set_t old, one;
  sched_getaffinity(0, sizeof old, &old);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old))
    cpu++;
  MPI_Bcast(&cpu, 1, MPI_INT, 0, r->comm);
  if (r->rank <= 1) {
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
  }
  prof_sleeping_barrier(r);
  bool ok = r->rank > 1 || host_wait_pair(r, b, c, r->a->quick ? 0.02 : 0.05, err);
  if (r->rank <= 1)
    sched_setaffinity(0, sizeof old, &old);
  prof_sleeping_barrier(r);
  exec_comm_destroy(b, c);
  return ok;
}

/* Rank 0 of host_wait_demand: computes for window seconds, sends the waiter (a world rank: the
 * communicator is point-to-point) its message, and computes on while the waiter wakes. */
static void demand_sender(struct exec_backend *b, struct exec_comm *c, uint32_t waiter,
                         double window, bool *ok, GError **err) {
  compute_rate(window);
  int32_t v = 1;
  *ok = exec_comm_send(b, c, waiter, &v, sizeof v, 5, err) && *ok;
  compute_rate(0.01);
}

/* What a rank waiting for its peers in the backend's loop asks of the node's cores: rank 0
 * computes (GEMMs) while the last rank waits for a message rank 0 sends at the end of the
 * window; the other ranks sleep, so that a core is free for the waiter (on 2 cores) and it
 * burns what its loop asks, not what a saturated scheduler leaves it (beside 3 computing
 * ranks on 2 cores it gets 0.03 of a core and wakes ~2 ms late; in 4-rank 1F1B runs waiting
 * ranks burn 0.27-0.35 of a core). The waiter's CPU time over its wait, median over rounds;
 * rank 0 keeps the figure. */
static bool host_wait_demand(struct prof_run *r, struct exec_backend *b, GError **err) {
  uint32_t waiter = (uint32_t)r->size - 1, pair[2] = {0, waiter};
  struct exec_comm *c = exec_comm_create(b, "piper-prof demand", pair, 2, true, err);
  if (!c)
    return false;
  double window = r->a->quick ? 0.02 : 0.05, share[PAIR_ROUNDS];
  bool ok = true;
  for (int i = 0; i < PAIR_ROUNDS; i++) {
    double seen = 0;
    prof_sleeping_barrier(r);
    if ((uint32_t)r->rank == waiter)
      share[i] = waiter_once(b, c, &seen, &ok, err);
    else if (r->rank == 0)
      demand_sender(b, c, waiter, window, &ok, err);
  }
  if ((uint32_t)r->rank == waiter)
    MPI_Send(share, PAIR_ROUNDS, MPI_DOUBLE, 0, 99, r->comm);
  else if (r->rank == 0)
    MPI_Recv(share, PAIR_ROUNDS, MPI_DOUBLE, (int)waiter, 99, r->comm, MPI_STATUS_IGNORE);
  if (r->rank == 0) {
    double m = prof_median(share, PAIR_ROUNDS);
    r->wait_share = m < 0 ? 0 : m > 1 ? 1 : m;
  }
  prof_sleeping_barrier(r);
  exec_comm_destroy(b, c);
  return ok;
}
/* What the host backend's loop adds to a communication its rank waits on past the loop's spin
 * window (EXEC_HOST_IDLE_SPIN_US; the rank then sleeps between polls, and a rendezvous message
 * needs both sides' polls): rank 0 computes for a window while the last rank waits for its
 * message, then sends; the other ranks sleep, so that each of the two has a core. The message
 * is LATE_BYTES, above Open MPI's shared-memory eager limit (4 KiB) and the size of tiny-moe's
 * expert all-to-alls. Each round times it twice, in turns: through the backend's loop (the send
 * and the receive tasks on streams, as the executor runs them) and with both sides polling
 * without sleep (the backend's calls outside a task), which is what the collective fits
 * measure; the lateness is the difference of the medians (how much later the waiter sees the
 * message, from when the sender posted it). */
enum { LATE_BYTES = 32768 };

struct late_arg {
  struct exec_backend *b;
  struct exec_comm *c;
  uint32_t peer;
  bool send;
  char *buf;
  double t; /* the send posted, or the receive seen */
};

/* The send or the receive, and its time. Inside a task the backend suspends it and its loop
 * polls; outside one the backend polls without sleeping. */
static bool late_exchange(struct late_arg *w, GError **err) {
  if (w->send)
    w->t = piper_clock_seconds();
  bool ok = w->send ? exec_comm_send(w->b, w->c, w->peer, w->buf, LATE_BYTES, 6, err)
                    : exec_comm_recv(w->b, w->c, w->peer, w->buf, LATE_BYTES, 6, err);
  if (!w->send)
    w->t = piper_clock_seconds();
  return ok;
}

static bool late_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  return late_exchange(arg, err);
}

/* One side of one exchange: through the loop (a task on a stream) or polling (no task). */
static bool late_side(struct late_arg *w, bool loop, GError **err) {
  if (!loop)
    return late_exchange(w, err);
  struct exec_stream *st = exec_stream_create(w->b, "piper-prof late", 0, err);
  if (!st)
    return false;
  struct exec_event *e = exec_event_create(w->b);
  exec_stream_submit(w->b, st, late_task, w, 0);
  exec_event_record(w->b, e, st);
  bool ok = exec_event_synchronize(w->b, e, 60);
  exec_event_destroy(w->b, e);
  exec_stream_destroy(w->b, st);
  return ok;
}

/* Seconds from the send's post to the receive seen, one exchange (rank 0 keeps it). */
static double late_once(struct prof_run *r, struct late_arg *w, bool loop, double window,
                        bool *ok, GError **err) {
  double seen = 0;
  prof_sleeping_barrier(r);
  if (r->rank == 0) {
    compute_rate(window);
    *ok = late_side(w, loop, err) && *ok;
    MPI_Recv(&seen, 1, MPI_DOUBLE, (int)w->peer, 95, r->comm, MPI_STATUS_IGNORE);
    return seen - w->t;
  }
  if ((uint32_t)r->rank == (uint32_t)r->size - 1) {
    *ok = late_side(w, loop, err) && *ok;
    MPI_Send(&w->t, 1, MPI_DOUBLE, 0, 95, r->comm);
  }
  return 0;
}

static bool host_loop_late(struct prof_run *r, struct exec_backend *b, GError **err) {
  uint32_t waiter = (uint32_t)r->size - 1, pair[2] = {0, waiter};
  struct exec_comm *c = exec_comm_create(b, "piper-prof late", pair, 2, true, err);
  if (!c)
    return false;
  struct late_arg w = {.b = b, .c = c, .peer = r->rank == 0 ? waiter : 0, .send = r->rank == 0,
                       .buf = g_malloc0(LATE_BYTES)};
  /* the waiter waits past the spin window by construction */
  double window = EXEC_HOST_IDLE_SPIN_US * 1e-6 + (r->a->quick ? 0.001 : 0.002);
  double loop[PAIR_ROUNDS], poll[PAIR_ROUNDS];
  bool ok = true;
  for (int i = 0; i < PAIR_ROUNDS; i++) {
    loop[i] = late_once(r, &w, true, window, &ok, err);
    poll[i] = late_once(r, &w, false, window, &ok, err);
  }
  if (r->rank == 0) {
    double late = prof_median(loop, PAIR_ROUNDS) - prof_median(poll, PAIR_ROUNDS);
    r->loop_late = late > 0 ? late : 0;
  }
  prof_sleeping_barrier(r);
  g_free(w.buf);
  exec_comm_destroy(b, c);
  return ok;
}

/* MPI's eager limit, as the host backend meets it: rank 0 sends n bytes to the last rank, which
 * posts its receive 2 ms later; a send that completes before then (rank 0 polling) did not
 * need its receiver. The largest such n of 256 B, 512 B, ... 1 MiB (each size 3 times, the
 * majority kept, after 32 small exchanges that set up the transport's per-peer buffers):
 * above it a sender's request completes only once the receiver has polled (the simulator's
 * host loop). */
static int eager_once(struct prof_run *r, char *buf, size_t n) {
  int waiter = r->size - 1, done = 0;
  prof_sleeping_barrier(r);
  if (r->rank == 0) {
    MPI_Request req;
    double t0 = piper_clock_seconds();
    MPI_Isend(buf, (int)n, MPI_BYTE, waiter, 97, r->comm, &req);
    while (!done && piper_clock_seconds() - t0 < 0.001)
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else if (r->rank == waiter) {
    g_usleep(2000);
    MPI_Recv(buf, (int)n, MPI_BYTE, 0, 97, r->comm, MPI_STATUS_IGNORE);
  }
  MPI_Bcast(&done, 1, MPI_INT, 0, r->comm);
  return done;
}

static void host_eager_limit(struct prof_run *r) {
  int waiter = r->size - 1;
  char *buf = g_malloc0((size_t)1 << 20);
  for (int k = 0; k < 32; k++) {
    if (r->rank == 0)
      MPI_Send(buf, 64, MPI_BYTE, waiter, 96, r->comm);
    else if (r->rank == waiter)
      MPI_Recv(buf, 64, MPI_BYTE, 0, 96, r->comm, MPI_STATUS_IGNORE);
  }
  double eager = 0;
  for (size_t n = 256; n <= ((size_t)1 << 20); n *= 2) {
    int done = 0;
    for (int k = 0; k < 3; k++)
      done += eager_once(r, buf, n);
    if (done < 2)
      break;
    eager = (double)n;
  }
  r->eager_bytes = eager;
  g_free(buf);
}

#endif

bool prof_measure_host(struct prof_run *r, GError **err) {
  r->cores = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
  struct exec_backend *b = exec_backend_init(&exec_backend_host, NULL, err);
  if (!b)
    return false;
  bool ok = true;
  if (r->rank == 0) {
    r->instruction_overhead = prof_instruction_cost(b, r->a->quick ? 2000 : 20000, err);
    ok = r->instruction_overhead >= 0;
  }
#ifdef HAVE_MPI
  if (r->size > 1) {
    prof_sleeping_barrier(r);
    if (r->rank == 0)
      r->comm_test = host_test_cost(r, r->a->quick ? 2000 : 20000);
    ok = host_wait_share(r, b, err) && ok;
    ok = host_wait_demand(r, b, err) && ok;
    ok = host_loop_late(r, b, err) && ok;
    host_eager_limit(r);
    r->comm_measured = true;
  }
#endif
  exec_backend_free(b);
  prof_progress(r,
                "host: %u cores; the executor's loop %.2f us per instruction; a test of posted "
                "communication %.2f us; a waiting rank burns %.2f of a core beside a computing "
                "one (pinned beside one: %.2f of its core, slowing it by %.0f%%) and sees a "
                "message %.1f us late when its core is busy; asleep in the loop, %.1f us late "
                "with a core free; sends up to %.0f bytes complete without their receiver",
                r->cores, r->instruction_overhead * 1e6, r->comm_test * 1e6, r->wait_share,
                r->wait_self_share, 100 * r->wait_pinned_slowdown, r->wake_latency * 1e6,
                r->loop_late * 1e6, r->eager_bytes);
  return ok;
}
