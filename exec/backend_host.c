/* backend_host: the host backend's streams, events and memory, and the backend registry.
 * A stream is a worker thread draining an in-order queue of items: tasks, event records and
 * event waits. Events count generations: a record enqueues generation g and completes it when
 * the worker reaches it; a wait captures the latest generation at enqueue time and blocks the
 * worker until it has completed. One mutex guards all queues and events; each stream has its
 * own condition variable, so an event wakes only the streams that wait on it. */
#include <string.h>
#include <time.h>

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
};

struct exec_event {
  struct exec_backend *b;
  uint64_t recorded;
  atomic_uint_fast64_t completed; /* written under the lock; atomic for lock-free readers */
};

struct exec_stream {
  struct exec_backend *b;
  char name[64];
  GThread *thread;
  GCond cond;
  GArray *queue; /* struct item */
  guint head;
  bool stop;
  enum exec_stream_phase phase;
  uint32_t task_id;
  const struct exec_event *waiting_on;
  double since;
  bool failed;
  GError *error;
};

static double host_clock(struct exec_backend *b) {
  return piper_clock_seconds() - b->epoch;
}

/* Wakes the workers and the submitting thread blocked on event e (everyone for NULL). Lock
 * held. Waking only the waiters matters: a wakeup costs microseconds, an instruction's whole
 * budget of executor overhead. */
static void wake_waiters(struct exec_backend *b, const struct exec_event *e) {
  for (guint i = 0; i < b->streams->len; i++) {
    struct exec_stream *s = g_ptr_array_index(b->streams, i);
    if (s->phase == EXEC_STREAM_WAITING && (e == NULL || s->waiting_on == e))
      g_cond_signal(&s->cond);
  }
  if (e == NULL || b->main_waiting_on == e)
    g_cond_broadcast(&b->main_cond);
}

static gpointer worker(gpointer data) {
  struct exec_stream *s = data;
  struct exec_backend *b = s->b;
  g_mutex_lock(&b->lock);
  for (;;) {
    while (s->head == s->queue->len && !s->stop) {
      s->phase = EXEC_STREAM_IDLE;
      g_cond_wait(&s->cond, &b->lock);
    }
    if (s->head == s->queue->len)
      break;
    struct item it = g_array_index(s->queue, struct item, s->head++);
    if (s->head == s->queue->len) {
      g_array_set_size(s->queue, 0);
      s->head = 0;
    }
    switch (it.kind) {
    case ITEM_WAIT:
      if (atomic_load(&it.event->completed) < it.gen) {
        s->phase = EXEC_STREAM_WAITING;
        s->waiting_on = it.event;
        s->since = host_clock(b);
        while (atomic_load(&it.event->completed) < it.gen && !atomic_load(&b->cancelled))
          g_cond_wait(&s->cond, &b->lock);
        s->waiting_on = NULL;
      }
      break;
    case ITEM_RECORD:
      if (it.gen > atomic_load(&it.event->completed))
        atomic_store(&it.event->completed, it.gen);
      atomic_fetch_add(&b->progress, 1);
      wake_waiters(b, it.event);
      break;
    case ITEM_TASK: {
      if (s->failed || atomic_load(&b->cancelled)) {
        atomic_fetch_add(&b->progress, 1);
        break;
      }
      s->phase = EXEC_STREAM_RUNNING;
      s->task_id = it.id;
      s->since = host_clock(b);
      g_mutex_unlock(&b->lock);
      GError *err = NULL;
      bool ok = it.fn(it.arg, &err);
      g_mutex_lock(&b->lock);
      if (!ok) {
        s->failed = true;
        if (!err)
          g_set_error(&err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "stream %s: task %u failed", s->name,
                      it.id);
        s->error = err;
        s->since = host_clock(b);
        /* one failure ends the step everywhere: nothing after it can be trusted */
        atomic_store(&b->cancelled, true);
        wake_waiters(b, NULL);
      }
      atomic_fetch_add(&b->progress, 1);
      s->phase = EXEC_STREAM_IDLE;
      break;
    }
    }
  }
  g_mutex_unlock(&b->lock);
  return NULL;
}

static struct exec_stream *host_stream_create(struct exec_backend *b, const char *name,
                                              int priority, GError **err) {
  (void)priority; /* threads of one process share the CPU; the OS schedules them */
  (void)err;
  struct exec_stream *s = g_new0(struct exec_stream, 1);
  s->b = b;
  g_strlcpy(s->name, name, sizeof s->name);
  g_cond_init(&s->cond);
  s->queue = g_array_new(FALSE, FALSE, sizeof(struct item));
  g_mutex_lock(&b->lock);
  g_ptr_array_add(b->streams, s);
  g_mutex_unlock(&b->lock);
  char tname[16];
  g_snprintf(tname, sizeof tname, "px-%s", name);
  s->thread = g_thread_new(tname, worker, s);
  return s;
}

static void host_stream_destroy(struct exec_stream *s) {
  if (!s)
    return;
  struct exec_backend *b = s->b;
  g_mutex_lock(&b->lock);
  s->stop = true;
  g_cond_signal(&s->cond);
  g_mutex_unlock(&b->lock);
  g_thread_join(s->thread);
  g_mutex_lock(&b->lock);
  g_ptr_array_remove(b->streams, s);
  g_mutex_unlock(&b->lock);
  g_cond_clear(&s->cond);
  g_array_free(s->queue, TRUE);
  if (s->error)
    g_error_free(s->error);
  g_free(s);
}

static void push(struct exec_stream *s, const struct item *it) {
  g_array_append_val(s->queue, *it);
  g_cond_signal(&s->cond);
}

static void host_stream_submit(struct exec_stream *s, exec_task_fn fn, void *arg,
                               uint32_t task_id) {
  struct item it = {.kind = ITEM_TASK, .fn = fn, .arg = arg, .id = task_id};
  g_mutex_lock(&s->b->lock);
  push(s, &it);
  g_mutex_unlock(&s->b->lock);
}

static void host_stream_status(struct exec_stream *s, struct exec_stream_status *out) {
  g_mutex_lock(&s->b->lock);
  out->phase = s->phase;
  out->task_id = s->task_id;
  out->since = s->since;
  out->failed = s->failed;
  if (s->phase == EXEC_STREAM_WAITING || s->phase == EXEC_STREAM_IDLE) {
    /* the task the stream will run next */
    for (guint i = s->head; i < s->queue->len; i++) {
      const struct item *it = &g_array_index(s->queue, struct item, i);
      if (it->kind == ITEM_TASK) {
        out->task_id = it->id;
        break;
      }
    }
  }
  g_mutex_unlock(&s->b->lock);
}

static const GError *host_stream_error(struct exec_stream *s) {
  g_mutex_lock(&s->b->lock);
  const GError *e = s->error;
  g_mutex_unlock(&s->b->lock);
  return e;
}

static struct exec_event *host_event_create(struct exec_backend *b) {
  struct exec_event *e = g_new0(struct exec_event, 1);
  e->b = b;
  return e;
}

static void host_event_destroy(struct exec_event *e) {
  g_free(e);
}

static void host_event_record(struct exec_event *e, struct exec_stream *s) {
  g_mutex_lock(&s->b->lock);
  struct item it = {.kind = ITEM_RECORD, .event = e, .gen = ++e->recorded};
  push(s, &it);
  g_mutex_unlock(&s->b->lock);
}

static void host_stream_wait_event(struct exec_stream *s, struct exec_event *e) {
  g_mutex_lock(&s->b->lock);
  if (e->recorded > atomic_load(&e->completed)) {
    struct item it = {.kind = ITEM_WAIT, .event = e, .gen = e->recorded};
    push(s, &it);
  }
  g_mutex_unlock(&s->b->lock);
}

static bool host_event_synchronize(struct exec_event *e, double timeout_s) {
  struct exec_backend *b = e->b;
  gint64 deadline = g_get_monotonic_time() + (gint64)(timeout_s * 1e6);
  g_mutex_lock(&b->lock);
  bool done;
  b->main_waiting_on = e;
  while (!(done = atomic_load(&e->completed) >= e->recorded)) {
    if (!g_cond_wait_until(&b->main_cond, &b->lock, deadline)) {
      done = atomic_load(&e->completed) >= e->recorded;
      break;
    }
  }
  b->main_waiting_on = NULL;
  g_mutex_unlock(&b->lock);
  return done;
}

static uint64_t host_progress(struct exec_backend *b) {
  return atomic_load(&b->progress);
}

static void host_cancel(struct exec_backend *b) {
  g_mutex_lock(&b->lock);
  atomic_store(&b->cancelled, true);
  wake_waiters(b, NULL);
  g_mutex_unlock(&b->lock);
}

static void host_reset(struct exec_backend *b) {
  atomic_store(&b->cancelled, false);
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

/* ---- kernels ----------------------------------------------------------------------------- */

/* x [n] = value */
static void host_fill(float *x, float value, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = value;
}

/* dst [bytes] = src */
static void host_copy(void *dst, const void *src, size_t bytes) {
  if (bytes)
    memmove(dst, src, bytes);
}

/* y [n] += x [n] */
static void host_add(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] += x[i];
}

static const struct exec_kernels host_kernels = {
    .fill = host_fill,
    .copy = host_copy,
    .add = host_add,
    .embedding_forward = kernels_embedding_forward,
    .embedding_backward_weight = kernels_embedding_backward_weight,
    .embedding_backward = kernels_embedding_backward,
    .rmsnorm_forward = kernels_rmsnorm_forward,
    .rmsnorm_backward_input = kernels_rmsnorm_backward_input,
    .rmsnorm_backward_weight = kernels_rmsnorm_backward_weight,
    .rmsnorm_backward = kernels_rmsnorm_backward,
    .attention_forward = kernels_attention_forward,
    .attention_backward_input = kernels_attention_backward_input,
    .attention_backward_weight = kernels_attention_backward_weight,
    .attention_backward = kernels_attention_backward,
    .mlp_forward = kernels_mlp_forward,
    .mlp_backward_input = kernels_mlp_backward_input,
    .mlp_backward_weight = kernels_mlp_backward_weight,
    .mlp_backward = kernels_mlp_backward,
    .router_forward = kernels_router_forward,
    .router_backward_input = kernels_router_backward_input,
    .router_backward_weight = kernels_router_backward_weight,
    .router_backward = kernels_router_backward,
    .moe_dispatch_plan = kernels_moe_dispatch_plan,
    .moe_dispatch_forward = kernels_moe_dispatch_forward,
    .moe_dispatch_backward = kernels_moe_dispatch_backward,
    .moe_combine_forward = kernels_moe_combine_forward,
    .moe_combine_backward = kernels_moe_combine_backward,
    .expert_ffn_forward = kernels_expert_ffn_forward,
    .expert_ffn_backward_input = kernels_expert_ffn_backward_input,
    .expert_ffn_backward_weight = kernels_expert_ffn_backward_weight,
    .expert_ffn_backward = kernels_expert_ffn_backward,
    .lm_head_loss_forward = kernels_lm_head_loss_forward,
    .lm_head_loss_backward_input = kernels_lm_head_loss_backward_input,
    .lm_head_loss_backward_weight = kernels_lm_head_loss_backward_weight,
    .lm_head_loss_backward = kernels_lm_head_loss_backward,
    .residual_add_forward = kernels_residual_add_forward,
    .residual_add_backward = kernels_residual_add_backward,
    .adamw_step = kernels_adamw_step,
};

/* ---- lifecycle --------------------------------------------------------------------------- */

static struct exec_backend *host_create(const struct exec_backend_params *p, GError **err) {
  struct exec_backend *b = g_new0(struct exec_backend, 1);
  g_mutex_init(&b->lock);
  g_cond_init(&b->main_cond);
  b->streams = g_ptr_array_new();
  b->size = 1;
  if (!host_comm_init(b, p, err)) {
    g_ptr_array_free(b->streams, TRUE);
    g_cond_clear(&b->main_cond);
    g_mutex_clear(&b->lock);
    g_free(b);
    return NULL;
  }
  /* every rank leaves the barrier at about the same moment: a shared time origin */
  host_comm_barrier(b);
  b->epoch = piper_clock_seconds();
  return b;
}

static void host_destroy(struct exec_backend *b) {
  if (!b)
    return;
  while (b->streams->len)
    host_stream_destroy(g_ptr_array_index(b->streams, 0));
  host_comm_finalize(b);
  g_ptr_array_free(b->streams, TRUE);
  g_cond_clear(&b->main_cond);
  g_mutex_clear(&b->lock);
  g_free(b);
}

static void host_abort(struct exec_backend *b, int code) {
  host_comm_abort(b, code);
}
static uint32_t host_world_rank(struct exec_backend *b) {
  return b->rank;
}
static uint32_t host_world_size(struct exec_backend *b) {
  return b->size;
}

const struct exec_backend_ops exec_backend_host = {
    .name = "host",
    .description = "CPU: reference kernels in C with BLAS GEMMs, one thread per stream, "
#ifdef HAVE_MPI
                   "MPI communication",
#else
                   "one process (built without MPI)",
#endif
    .create = host_create,
    .destroy = host_destroy,
    .abort = host_abort,
    .world_rank = host_world_rank,
    .world_size = host_world_size,
    .comm_library = host_comm_library,
    .clock = host_clock,
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
    .cancel = host_cancel,
    .reset = host_reset,
    .comm_create = host_comm_create,
    .comm_destroy = host_comm_destroy,
    .send = host_send,
    .recv = host_recv,
    .all_reduce_f32 = host_all_reduce_f32,
    .reduce_scatter_f32 = host_reduce_scatter_f32,
    .all_gather = host_all_gather,
    .all_to_all_i32 = host_all_to_all_i32,
    .all_to_all_v = host_all_to_all_v,
    .world_all_reduce_f64 = host_world_all_reduce_f64,
    .world_gather = host_world_gather,
    .world_broadcast = host_world_broadcast,
    .kernels = &host_kernels,
};

/* The cuda backend registers here under HAVE_CUDA (its own issue). */
const struct exec_backend_ops *const exec_backends[] = {
    &exec_backend_host,
    NULL,
};

const struct exec_backend_ops *exec_backend_find(const char *name) {
  for (size_t i = 0; exec_backends[i]; i++)
    if (strcmp(exec_backends[i]->name, name) == 0)
      return exec_backends[i];
  return NULL;
}
