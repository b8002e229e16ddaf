/* backend_host: the host backend's streams, events and memory, and the backend registry.
 * Each rank runs its plan from one event loop on the submitting thread (libuv's uv_run is the
 * model): streams are in-order queues of items (tasks, event records, event waits), and the
 * loop, entered by event_synchronize, repeatedly
 *   1. tests the communication that blocked tasks wait for, resuming those it completed;
 *   2. runs the next task in submission order (the plan's) once it is ready, and ready event
 *      records and waits at once: a task in flight holds back nothing, a task that waits
 *      holds back every later one;
 *   3. when nothing is ready, polls for EXEC_HOST_IDLE_SPIN_US (1 ms), then sleeps in 20 us
 *      quanta between polls (a communication that ends within the window is seen at once; a
 *      rank that waits longer leaves the core to the ranks that compute: 4 ranks on 2 cores);
 * A task runs on its stream's fiber (a stack of its own, ucontext), so a communication call
 * inside it posts nonblocking MPI and switches back to the loop instead of blocking the rank:
 * compute of other streams runs meanwhile, and no thread per stream competes for the cores
 * (4 ranks on 2 cores). Only the loop's thread touches the streams, so cancelling is plain
 * code: every posted request is cancelled or completed before its task unwinds, and a task
 * whose requests cannot be stopped stays suspended, its buffers untouched, until the job ends.
 * Events count generations: a record enqueues generation g and completes it when the loop
 * reaches it; a wait captures the latest generation at enqueue time. */
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <ucontext.h>

#include "../base/assert.h"
#include "../base/json.h"
#include "host-impl.h"

enum item_kind { ITEM_TASK, ITEM_RECORD, ITEM_WAIT };

struct item {
  enum item_kind kind;
  exec_task_fn fn;
  void *arg;
  uint32_t id;
  struct exec_event *event;
  uint64_t gen;
  uint64_t seq; /* submission order across streams: the loop runs the ready item first here */
};

struct exec_event {
  struct host_context *b;
  uint64_t recorded, completed;
};

/* A fiber's stack: big enough for any kernel (BLAS keeps buffers on it), committed lazily. */
#define FIBER_STACK_BYTES ((size_t)8 << 20)

struct exec_stream {
  struct host_context *b;
  char name[64];
  GArray *queue; /* struct item */
  guint head;
  enum exec_stream_phase phase;
  uint32_t task_id;
  double since;
  bool failed;
  GError *error;
  /* the fiber: a task in flight (in_task) may be suspended on pending communication */
  ucontext_t fiber;
  void *stack;
  struct item current;
  bool in_task, task_ok;
  GError *task_error;
  struct host_pending *pending; /* what the suspended task waits for */
  enum host_pending_state pending_state;
  GError *pending_error;
  bool stuck; /* cancelled, but its requests could not be stopped: never resumed */
};

/* Where fibers switch back to; the stream whose fiber runs now. */
struct host_loop {
  ucontext_t ctx;
  struct exec_stream *running;
  uint64_t seq;
  double idle_since; /* when the loop last found nothing to do, 0 while busy */
  struct exec_backend_loop_stats stats;
  double task_s; /* inside fibers (task bodies), to take out of the loop's own time */
  double last_within; /* when a task last tested the others' communication */
};

static _Thread_local struct exec_stream *fiber_starting;

/* Under AddressSanitizer (make asan) every switch of stacks is announced, so that it does not
 * take a fiber's frames for an overflow of the loop's stack (sanitizer/common_interface_defs.h). */
#if defined(__SANITIZE_ADDRESS__)
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old);
static _Thread_local void *asan_loop_fake;
static _Thread_local const void *asan_loop_bottom;
static _Thread_local size_t asan_loop_size;
/* fiber to loop: leaving the fiber's stack (fake: the fiber's saved fake frames) */
static void to_loop(struct exec_stream *s, void **fake) {
  __sanitizer_start_switch_fiber(fake, asan_loop_bottom, asan_loop_size);
  swapcontext(&s->fiber, &s->b->loop->ctx);
  __sanitizer_finish_switch_fiber(*fake, &asan_loop_bottom, &asan_loop_size);
}
static void to_fiber(ucontext_t *loop, struct exec_stream *s) {
  __sanitizer_start_switch_fiber(&asan_loop_fake, s->stack, FIBER_STACK_BYTES);
  swapcontext(loop, &s->fiber);
  __sanitizer_finish_switch_fiber(asan_loop_fake, NULL, NULL);
}
static void fiber_entered(void) {
  __sanitizer_finish_switch_fiber(NULL, &asan_loop_bottom, &asan_loop_size);
}
#else
static void to_loop(struct exec_stream *s, void **fake) {
  (void)fake;
  swapcontext(&s->fiber, &s->b->loop->ctx);
}
static void to_fiber(ucontext_t *loop, struct exec_stream *s) {
  swapcontext(loop, &s->fiber);
}
static void fiber_entered(void) {
}
#endif

static double host_clock(struct host_context *b) {
  return piper_clock_seconds() - b->epoch;
}

/* ---- fibers ------------------------------------------------------------------------------ */

/* A stream's fiber: runs the stream's current task, then switches back to the loop; resumed
 * for the next task. It never returns. */
static void fiber_main(void) {
  struct exec_stream *s = fiber_starting;
  void *fake = NULL;
  fiber_entered();
  for (;;) {
    GError *err = NULL;
    s->task_ok = s->current.fn(s, s->current.arg, &err);
    s->task_error = err;
    s->in_task = false;
    to_loop(s, &fake);
  }
}

static bool fiber_init(struct exec_stream *s, GError **err) {
  void *stack = mmap(NULL, FIBER_STACK_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED)
    return piper_runtime_error(err, "stream %s: no memory for its stack", s->name);
  /* the lowest page is a guard: an overflow faults instead of writing into another stack */
  mprotect(stack, 4096, PROT_NONE);
  s->stack = stack;
  getcontext(&s->fiber);
  s->fiber.uc_stack.ss_sp = stack;
  s->fiber.uc_stack.ss_size = FIBER_STACK_BYTES;
  s->fiber.uc_link = NULL;
  makecontext(&s->fiber, fiber_main, 0);
  return true;
}

/* Switches to s's fiber until its task finishes or suspends on communication. */
static void fiber_resume(struct host_context *b, struct exec_stream *s) {
  struct host_loop *L = b->loop;
  struct exec_stream *outer = L->running;
  L->running = s;
  fiber_starting = s;
  double t0 = piper_clock_seconds();
  to_fiber(&L->ctx, s);
  L->task_s += piper_clock_seconds() - t0;
  L->running = outer;
}

bool exec_host_wait(struct host_context *b, struct host_pending *p, GError **err) {
  struct exec_stream *s = b->loop->running;
  enum host_pending_state st = p->test(p, err);
  if (st == HOST_PENDING_WAITING && !s) {
    /* outside any task (no fiber to suspend; the runner never does it): poll here, and
     * after a cancel return only once nothing is in flight (else the process watchdog ends
     * the job) */
    while ((st = p->test(p, err)) == HOST_PENDING_WAITING && !b->cancelled)
      sched_yield();
    if (st == HOST_PENDING_WAITING && !p->cancel(p))
      while (p->test(p, NULL) == HOST_PENDING_WAITING)
        sched_yield();
    if (st == HOST_PENDING_WAITING)
      st = HOST_PENDING_CANCELLED;
  } else if (st == HOST_PENDING_WAITING) {
    s->pending = p;
    s->pending_state = HOST_PENDING_WAITING;
    void *fake = NULL;
    to_loop(s, &fake);
    s->pending = NULL;
    st = s->pending_state;
    if (s->pending_error)
      g_propagate_error(err, s->pending_error);
    s->pending_error = NULL;
  }
  if (st == HOST_PENDING_CANCELLED || st == HOST_PENDING_WAITING)
    return piper_runtime_error(err, "rank %u: %s cancelled", b->rank, p->what);
  return st == HOST_PENDING_DONE;
}

/* ---- the loop ---------------------------------------------------------------------------- */

/* A task ended (returned): its result fails the stream or counts as progress. */
static void finish_task(struct host_context *b, struct exec_stream *s) {
  if (!s->task_ok) {
    GError *err = s->task_error;
    if (!err)
      g_set_error(&err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "stream %s: task %u failed", s->name,
                  s->current.id);
    if (!s->failed) {
      s->failed = true;
      s->error = err;
    } else {
      g_error_free(err);
    }
    s->since = host_clock(b);
    /* one failure ends the step everywhere: nothing after it can be trusted */
    b->cancelled = true;
  } else if (s->task_error) {
    g_error_free(s->task_error);
  }
  s->task_error = NULL;
  s->phase = EXEC_STREAM_IDLE;
  b->progress++;
}

/* Runs s's fiber and, when its task returned, accounts for it. */
static void run_fiber(struct host_context *b, struct exec_stream *s) {
  fiber_resume(b, s);
  if (!s->in_task)
    finish_task(b, s);
}

/* 1. Tests the communication of suspended tasks; resumes those it settled. */
/* Tests what suspended tasks wait for, settling it without resuming them. From the loop its
 * time is counted apart; from inside a task it is the task's. */
static void test_pending(struct host_context *b, bool from_loop) {
  for (guint i = 0; i < b->streams->len; i++) {
    struct exec_stream *s = g_ptr_array_index(b->streams, i);
    if (!s->pending || s->stuck || s->pending_state != HOST_PENDING_WAITING)
      continue;
    double t0 = from_loop ? piper_clock_seconds() : 0;
    s->pending_state = s->pending->test(s->pending, &s->pending_error);
    if (from_loop) {
      b->loop->stats.test_s += piper_clock_seconds() - t0;
      b->loop->stats.tests++;
    }
  }
}

static bool poll_pending(struct host_context *b) {
  test_pending(b, true);
  bool progressed = false;
  for (guint i = 0; i < b->streams->len; i++) {
    struct exec_stream *s = g_ptr_array_index(b->streams, i);
    if (!s->pending || s->stuck || s->pending_state == HOST_PENDING_WAITING)
      continue;
    progressed = true;
    b->progress++;
    run_fiber(b, s);
  }
  return progressed;
}

/* Whether the head item of s can run now. */
static bool head_ready(const struct exec_stream *s) {
  if (s->in_task || s->head == s->queue->len)
    return false;
  const struct item *it = &g_array_index(s->queue, struct item, s->head);
  return it->kind != ITEM_WAIT || it->event->completed >= it->gen;
}

/* The submission order of the first task queued on s at or after its head (UINT64_MAX when
 * none): an event record behind a task in flight, or the waits of the next, are not tasks. */
static uint64_t first_task_seq(const struct exec_stream *s) {
  for (guint k = s->head; k < s->queue->len; k++) {
    const struct item *it = &g_array_index(s->queue, struct item, k);
    if (it->kind == ITEM_TASK)
      return it->seq;
  }
  return UINT64_MAX;
}

/* What the loop runs next, or NULL. Records and waits that are ready go at once (they do no
 * work); tasks go in submission order (the plan's issue order): while the first task not yet
 * started cannot start, no later one does. The order in which tensors come and go is then the
 * plan's but for when communication in flight ends, not which input arrived first (peak
 * memory: docs/exec.md); letting a later ready task go first was measured no faster
 * (docs/fidelity.md, 2026-12-01). */
static struct exec_stream *next_ready(struct host_context *b) {
  struct exec_stream *first = NULL;
  uint64_t first_seq = UINT64_MAX;
  for (guint i = 0; i < b->streams->len; i++) {
    struct exec_stream *s = g_ptr_array_index(b->streams, i);
    if (head_ready(s) && g_array_index(s->queue, struct item, s->head).kind != ITEM_TASK)
      return s;
    uint64_t seq = first_task_seq(s);
    if (seq < first_seq) {
      first = s;
      first_seq = seq;
    }
  }
  return first && head_ready(first) ? first : NULL;
}

/* 2. Runs the head item of s. */
static void run_item(struct host_context *b, struct exec_stream *s) {
  struct item it = g_array_index(s->queue, struct item, s->head++);
  if (s->head == s->queue->len) {
    g_array_set_size(s->queue, 0);
    s->head = 0;
  }
  switch (it.kind) {
  case ITEM_WAIT: break;
  case ITEM_RECORD:
    if (it.gen > it.event->completed)
      it.event->completed = it.gen;
    b->progress++;
    break;
  case ITEM_TASK:
    if (s->failed || b->cancelled) {
      b->progress++;
      break;
    }
    s->phase = EXEC_STREAM_RUNNING;
    s->task_id = it.id;
    s->since = host_clock(b);
    s->current = it;
    s->in_task = true;
    run_fiber(b, s);
    break;
  }
}

/* Whether anything could still move: a queued item or communication in flight. */
static bool may_progress(struct host_context *b) {
  for (guint i = 0; i < b->streams->len; i++) {
    const struct exec_stream *s = g_ptr_array_index(b->streams, i);
    if (s->in_task && !s->stuck)
      return true;
  }
  return false;
}

/* How long an idle loop polls before it lets the core go, in seconds: a communication that
 * ends within it is seen at no added latency. 1 ms, not 20 us: with 20 us nearly every wait
 * of 4 ranks on 2 cores outlasted the window and was seen a sleep cycle (55-100 us) late; 1 ms
 * made the 4-rank steps 21-39% shorter (docs/fidelity.md, 2026-11-30). */
#define IDLE_SPIN_S (EXEC_HOST_IDLE_SPIN_US * 1e-6)
/* Then the quantum it sleeps between polls (timer slack set to 1 us at init): polling for
 * longer, even with sched_yield, takes the core from the rank that computes (2 cores for 4
 * ranks, or SMT siblings: measured, a spinning neighbour halves a kernel's speed). */
#define IDLE_SLEEP_NS 20000

/* 3. Nothing is ready and everything waits on peers. */
static void idle_wait(struct host_context *b) {
  struct host_loop *L = b->loop;
  double now = piper_clock_seconds();
  if (L->idle_since == 0)
    L->idle_since = now; /* a new idle spell (the loop resets it when work runs) */
  if (now - L->idle_since < IDLE_SPIN_S)
    return;
  struct timespec ts = {0, IDLE_SLEEP_NS};
  nanosleep(&ts, NULL);
}

/* One turn of the loop: 1 and 2 (3 when nothing moved). False when nothing can move. An
 * idle turn counts as waiting for peers; a busy one, less the task bodies and the tests, as
 * the loop's own dispatch time. */
static bool loop_turn(struct host_context *b) {
  struct host_loop *L = b->loop;
  double t0 = piper_clock_seconds(), task0 = L->task_s, test0 = L->stats.test_s;
  uint64_t tests0 = L->stats.tests;
  bool progressed = poll_pending(b);
  struct exec_stream *s = next_ready(b);
  if (s)
    run_item(b, s);
  if (s || progressed) {
    L->idle_since = 0;
    L->stats.items += s != NULL;
    L->stats.dispatch_s +=
        (piper_clock_seconds() - t0) - (L->task_s - task0) - (L->stats.test_s - test0);
    return true;
  }
  L->stats.test_s = test0; /* idle polling is waiting, not cost */
  L->stats.tests = tests0;
  if (!may_progress(b))
    return false;
  idle_wait(b);
  return true;
}

/* Runs the loop until e's latest record has completed (true) or the deadline passes or
 * nothing can move any more (false). */
static bool loop_run(struct host_context *b, const struct exec_event *e, double deadline) {
  PIPER_ASSERT(b->loop->running == NULL); /* not from inside a task */
  while (e->completed < e->recorded) {
    /* the caller's watchdog looks at the clock between calls: return in time even when
     * everything moves */
    if (!loop_turn(b) || piper_clock_seconds() > deadline)
      return e->completed >= e->recorded;
  }
  return true;
}

/* ---- streams and events ------------------------------------------------------------------ */

static struct exec_stream *host_stream_create(struct exec_backend *backend, const char *name,
                                              int priority, GError **err) {
  struct host_context *b = backend->context;
  (void)priority; /* one loop runs every stream: plan order decides */
  struct exec_stream *s = g_new0(struct exec_stream, 1);
  s->b = b;
  g_strlcpy(s->name, name, sizeof s->name);
  s->queue = g_array_new(FALSE, FALSE, sizeof(struct item));
  if (!fiber_init(s, err)) {
    g_array_free(s->queue, TRUE);
    g_free(s);
    return NULL;
  }
  g_ptr_array_add(b->streams, s);
  return s;
}

static void host_stream_destroy(struct exec_stream *s) {
  if (!s)
    return;
  /* a suspended task may still have requests in flight into buffers on or off its stack:
   * such a stream is kept, with its stack, until the job ends (the runner destroys only
   * streams that drained) */
  if (s->in_task) {
    s->stuck = true;
    return;
  }
  g_ptr_array_remove(s->b->streams, s);
  munmap(s->stack, FIBER_STACK_BYTES);
  g_array_free(s->queue, TRUE);
  if (s->error)
    g_error_free(s->error);
  g_free(s);
}

static void push(struct exec_stream *s, struct item *it) {
  it->seq = s->b->loop->seq++;
  g_array_append_val(s->queue, *it);
}

static void host_stream_submit(struct exec_stream *s, exec_task_fn fn, void *arg,
                               uint32_t task_id) {
  struct item it = {.kind = ITEM_TASK, .fn = fn, .arg = arg, .id = task_id};
  push(s, &it);
}

static void host_stream_status(struct exec_stream *s, struct exec_stream_status *out) {
  out->phase = s->phase;
  out->task_id = s->task_id;
  out->since = s->since;
  out->failed = s->failed;
  if (s->phase == EXEC_STREAM_IDLE && s->head < s->queue->len) {
    /* the task the stream will run next, and whether an event holds it back */
    for (guint i = s->head; i < s->queue->len; i++) {
      const struct item *it = &g_array_index(s->queue, struct item, i);
      if (it->kind == ITEM_WAIT && it->event->completed < it->gen)
        out->phase = EXEC_STREAM_WAITING;
      if (it->kind == ITEM_TASK) {
        out->task_id = it->id;
        break;
      }
    }
  }
}

static const GError *host_stream_error(struct exec_stream *s) {
  return s->error;
}

static struct exec_event *host_event_create(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  struct exec_event *e = g_new0(struct exec_event, 1);
  e->b = b;
  return e;
}

static void host_event_destroy(struct exec_event *e) {
  g_free(e);
}

static void host_event_record(struct exec_event *e, struct exec_stream *s) {
  struct item it = {.kind = ITEM_RECORD, .event = e, .gen = ++e->recorded};
  push(s, &it);
}

static void host_stream_wait_event(struct exec_stream *s, struct exec_event *e) {
  if (e->recorded > e->completed) {
    struct item it = {.kind = ITEM_WAIT, .event = e, .gen = e->recorded};
    push(s, &it);
  }
}

static bool host_event_synchronize(struct exec_event *e, double timeout_s) {
  return loop_run(e->b, e, piper_clock_seconds() + timeout_s);
}

static uint64_t host_progress(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  return b->progress;
}

/* Stops every suspended task's communication, then lets the task unwind (its call fails,
 * "cancelled"); a task whose requests are still in flight after that (a send or collective
 * a stopped peer never serves) stays suspended for good. Queued tasks are skipped. */
static void host_cancel(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  b->cancelled = true;
  for (guint i = 0; i < b->streams->len; i++) {
    struct exec_stream *s = g_ptr_array_index(b->streams, i);
    if (!s->pending || s->stuck)
      continue;
    /* settled (between the kernels of another task) but not yet resumed: let it unwind */
    if (s->pending_state == HOST_PENDING_WAITING) {
      if (!s->pending->cancel(s->pending)) {
        s->stuck = true;
        continue;
      }
      s->pending_state = HOST_PENDING_CANCELLED;
    }
    run_fiber(b, s);
  }
}

static void host_loop_stats(struct exec_backend *backend, struct exec_backend_loop_stats *out) {
  struct host_context *b = backend->context;
  *out = b->loop->stats;
}

static void host_reset(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  b->cancelled = false;
}

/* How often a running task tests the others' communication between its kernels, in seconds:
 * a transfer that needs both sides to progress (a rendezvous, a collective's rounds) then
 * moves during a long task instead of after it. */
#define WITHIN_TASK_PERIOD_S 20e-6

/* Called before each host kernel (s NULL: outside any task). */
static void progress_within(struct exec_stream *s) {
  if (!s)
    return;
  struct host_loop *L = s->b->loop;
  double now = piper_clock_seconds();
  if (now - L->last_within < WITHIN_TASK_PERIOD_S)
    return;
  L->last_within = now;
  test_pending(s->b, false);
}

/* ---- memory ------------------------------------------------------------------------------ */

static void *host_alloc(struct exec_backend *b, size_t bytes) {
  (void)b;
  return g_malloc0(bytes ? bytes : 1);
}

static void host_release(struct exec_backend *b, void *p) {
  (void)b;
  g_free(p);
}

static void host_copy_bytes(struct exec_backend *b, void *dst, const void *src, size_t bytes) {
  (void)b;
  if (bytes)
    memmove(dst, src, bytes);
}

/* ---- kernels ----------------------------------------------------------------------------
 * The host runs a kernel inline, on the fiber of the task that calls it: each entry is
 * kernels.h's function, called now, after testing the communication other tasks wait for
 * (at most every WITHIN_TASK_PERIOD_S). */

/* One entry per kernel of ops.def: kernels_<name>, called now on the task's fiber. */
#define EXEC_KERNEL(name, use, params, args)                                                      \
  static void host_##name(struct exec_stream *s, EXEC_UNPAREN params) {                          \
    progress_within(s);                                                                           \
    kernels_##name args;                                                                          \
  }
#define EXEC_COLLECTIVE(name, use, params, args, pre)
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE

static const struct exec_kernels host_kernels = {
#define EXEC_KERNEL(name, use, params, args) .name = host_##name,
#define EXEC_COLLECTIVE(name, use, params, args, pre)
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
};

/* ---- lifecycle --------------------------------------------------------------------------- */

static void context_free(struct host_context *b) {
  g_ptr_array_free(b->streams, TRUE);
  g_free(b->loop);
  g_free(b);
}

/* The ranks' shared time origin. Ranks of one machine read one monotonic clock, so they take
 * rank 0's origin as it is: the moment each leaves a barrier is not shared when ranks outnumber
 * cores (4 on 2: one descheduled on its way out read its origin 1.5-1.9 ms late, which moved
 * its intervals by that much and lengthened every step's first-start-to-last-end window with
 * it). A rank on another machine (its boot id differs) keeps the barrier's exit. */
struct clock_origin {
  char machine[64]; /* the kernel's boot id, else the host name */
  double epoch;
};

static bool shared_epoch(struct host_context *b, GError **err) {
  if (!exec_host_comm_barrier(b, err))
    return false;
  struct clock_origin mine = {.epoch = piper_clock_seconds()}, root;
  piper_clock_machine(mine.machine, sizeof mine.machine);
  root = mine;
  if (!exec_host_world_broadcast(b, &root, sizeof root, err))
    return false;
  b->epoch = strcmp(root.machine, mine.machine) == 0 ? root.epoch : mine.epoch;
  return true;
}

static bool host_init(struct exec_backend *backend, const struct exec_backend_params *p,
                      GError **err) {
  struct host_context *b = g_new0(struct host_context, 1);
  b->streams = g_ptr_array_new();
  b->loop = g_new0(struct host_loop, 1);
  b->size = 1;
  /* the idle loop's short sleeps end on time (the default slack is 50 us) */
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  if (!exec_host_comm_init(b, p, err)) {
    g_free(b->world); /* a failed start has nothing to finalise */
    context_free(b);
    return false;
  }
  if (!shared_epoch(b, err)) {
    exec_host_comm_finalize(b);
    context_free(b);
    return false;
  }
  backend->context = b;
  return true;
}

static void host_free(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  if (!b)
    return;
  /* streams stuck on requests that never end keep their stacks (the job is ending anyway) */
  for (guint i = b->streams->len; i-- > 0;)
    host_stream_destroy(g_ptr_array_index(b->streams, i));
  exec_host_comm_finalize(b);
  if (b->streams->len == 0)
    context_free(b);
  backend->context = NULL;
}

/* The backend-wide entries: the public instance in, the host's context out. */
static void host_abort(struct exec_backend *b, int code) {
  exec_host_comm_abort(b->context, code);
}
static uint32_t host_world_rank(struct exec_backend *b) {
  return ((struct host_context *)b->context)->rank;
}
static uint32_t host_world_size(struct exec_backend *b) {
  return ((struct host_context *)b->context)->size;
}
static const char *host_comm_library(struct exec_backend *b) {
  return exec_host_comm_library(b->context);
}
static double host_clock_op(struct exec_backend *b) {
  return host_clock(b->context);
}
/* Tasks run on the calling thread (their fibers included): its CPU time is the device's. */
static double host_busy_clock(struct exec_backend *b) {
  (void)b;
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static struct exec_comm *host_comm_create(struct exec_backend *b, const char *label,
                                          const uint32_t *members, uint32_t n_members,
                                          bool point_to_point, GError **err) {
  return exec_host_comm_create(b->context, label, members, n_members, point_to_point, err);
}
static bool host_p2p_group(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                           GError **err) {
  return exec_host_p2p_group(b->context, parts, n, err);
}
static bool host_p2p_start(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                           struct exec_p2p_flight **out, GError **err) {
  return exec_host_p2p_start(b->context, parts, n, out, err);
}
static bool host_p2p_finish(struct exec_backend *b, struct exec_p2p_flight *f, GError **err) {
  return exec_host_p2p_finish(b->context, f, err);
}
static bool host_world_all_reduce_f64(struct exec_backend *b, double *buf, size_t n,
                                      enum exec_reduce_op op, GError **err) {
  return exec_host_world_all_reduce_f64(b->context, buf, n, op, err);
}
static bool host_world_gather(struct exec_backend *b, const void *in, size_t bytes, void **out,
                              size_t **out_sizes, GError **err) {
  return exec_host_world_gather(b->context, in, bytes, out, out_sizes, err);
}
static bool host_world_broadcast(struct exec_backend *b, void *buf, size_t bytes, GError **err) {
  return exec_host_world_broadcast(b->context, buf, bytes, err);
}

const struct exec_backend_ops exec_backend_host = {
    .api_version = EXEC_BACKEND_API_VERSION,
    .name = "host",
    .host_memory = true,
    .description = "CPU: reference kernels in C with BLAS GEMMs, one event loop per rank, "
#ifdef HAVE_MPI
                   "MPI communication",
#else
                   "one process (built without MPI)",
#endif
    .init = host_init,
    .free = host_free,
    .abort = host_abort,
    .world_rank = host_world_rank,
    .world_size = host_world_size,
    .comm_library = host_comm_library,
    .clock = host_clock_op,
    .busy_clock = host_busy_clock,
    .alloc = host_alloc,
    .release = host_release,
    .to_host = host_copy_bytes,
    .from_host = host_copy_bytes,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_submit = host_stream_submit,
    .stream_status = host_stream_status,
    .stream_error = host_stream_error,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .stream_wait_event = host_stream_wait_event,
    .event_synchronize = host_event_synchronize,
    .progress = host_progress,
    .loop_stats = host_loop_stats,
    .cancel = host_cancel,
    .reset = host_reset,
    .comm_create = host_comm_create,
    .comm_destroy = exec_host_comm_destroy,
    .p2p_group = host_p2p_group,
    .p2p_start = host_p2p_start,
    .p2p_finish = host_p2p_finish,
    .world_all_reduce_f64 = host_world_all_reduce_f64,
    .world_gather = host_world_gather,
    .world_broadcast = host_world_broadcast,
    .kernels = &host_kernels,
#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre) .name = exec_host_##name,
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
};
