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
  struct host_context *b;
  uint64_t recorded;
  atomic_uint_fast64_t completed; /* written under the lock; atomic for lock-free readers */
};

struct exec_stream {
  struct host_context *b;
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

static double host_clock(struct host_context *b) {
  return piper_clock_seconds() - b->epoch;
}

/* Wakes the workers and the submitting thread blocked on event e (everyone for NULL). Lock
 * held. Waking only the waiters matters: a wakeup costs microseconds, an instruction's whole
 * budget of executor overhead. */
static void wake_waiters(struct host_context *b, const struct exec_event *e) {
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
  struct host_context *b = s->b;
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
      bool ok = it.fn(s, it.arg, &err);
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

static struct exec_stream *host_stream_create(struct exec_backend *backend, const char *name,
                                              int priority, GError **err) {
  struct host_context *b = backend->context;
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
  struct host_context *b = s->b;
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
  struct host_context *b = e->b;
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

static uint64_t host_progress(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  return atomic_load(&b->progress);
}

static void host_cancel(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  g_mutex_lock(&b->lock);
  atomic_store(&b->cancelled, true);
  wake_waiters(b, NULL);
  g_mutex_unlock(&b->lock);
}

static void host_reset(struct exec_backend *backend) {
  struct host_context *b = backend->context;
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

/* ---- kernels ----------------------------------------------------------------------------
 * The host runs a kernel inline on the stream's worker thread: each entry is kernels.h's
 * function, called now. */

/* x [n] = value */
static void host_fill(struct exec_stream *s, float *x, float value, size_t n) {
  (void)s;
  for (size_t i = 0; i < n; i++)
    x[i] = value;
}

/* dst [bytes] = src */
static void host_copy(struct exec_stream *s, void *dst, const void *src, size_t bytes) {
  (void)s;
  if (bytes)
    memmove(dst, src, bytes);
}

/* y [n] += x [n] */
static void host_add(struct exec_stream *s, float *y, const float *x, size_t n) {
  (void)s;
  for (size_t i = 0; i < n; i++)
    y[i] += x[i];
}

static void k_embedding_forward(struct exec_stream *s, float *x, const int32_t *tokens,
                                const float *params, int T, int V, int C) {
  (void)s;
  kernels_embedding_forward(x, tokens, params, T, V, C);
}

static void k_embedding_backward_weight(struct exec_stream *s, float *dparams, const float *dx,
                                        const int32_t *tokens, int T, int V, int C) {
  (void)s;
  kernels_embedding_backward_weight(dparams, dx, tokens, T, V, C);
}

static void k_embedding_backward(struct exec_stream *s, float *dparams, const float *dx,
                                 const int32_t *tokens, int T, int V, int C) {
  (void)s;
  kernels_embedding_backward(dparams, dx, tokens, T, V, C);
}

static void k_rmsnorm_forward(struct exec_stream *s, float *h, float *saved, const float *x,
                              const float *params, int T, int C, float eps) {
  (void)s;
  kernels_rmsnorm_forward(h, saved, x, params, T, C, eps);
}

static void k_rmsnorm_backward_input(struct exec_stream *s, float *dx, const float *dh,
                                     const float *x, const float *saved, const float *params, int T,
                                     int C, bool accumulate) {
  (void)s;
  kernels_rmsnorm_backward_input(dx, dh, x, saved, params, T, C, accumulate);
}

static void k_rmsnorm_backward_weight(struct exec_stream *s, float *dparams, const float *dh,
                                      const float *x, const float *saved, int T, int C) {
  (void)s;
  kernels_rmsnorm_backward_weight(dparams, dh, x, saved, T, C);
}

static void k_rmsnorm_backward(struct exec_stream *s, float *dx, float *dparams, const float *dh,
                               const float *x, const float *saved, const float *params, int T,
                               int C, bool accumulate) {
  (void)s;
  kernels_rmsnorm_backward(dx, dparams, dh, x, saved, params, T, C, accumulate);
}

static void k_attention_forward(struct exec_stream *s, float *a, float *saved, const float *h,
                                const float *params, const struct kernels_attention_dims *d) {
  (void)s;
  kernels_attention_forward(a, saved, h, params, d);
}

static void k_attention_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                       const float *da, const float *saved, const float *params,
                                       const struct kernels_attention_dims *d, bool accumulate) {
  (void)s;
  kernels_attention_backward_input(dh, bwork, da, saved, params, d, accumulate);
}

static void k_attention_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                        const float *da, const float *h, const float *saved,
                                        const struct kernels_attention_dims *d) {
  (void)s;
  kernels_attention_backward_weight(dparams, bwork, da, h, saved, d);
}

static void k_attention_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                                 const float *da, const float *h, const float *saved,
                                 const float *params, const struct kernels_attention_dims *d,
                                 bool accumulate) {
  (void)s;
  kernels_attention_backward(dh, dparams, bwork, da, h, saved, params, d, accumulate);
}

static void k_mlp_forward(struct exec_stream *s, float *m, float *saved, const float *h,
                          const float *params, int T, int C, int F) {
  (void)s;
  kernels_mlp_forward(m, saved, h, params, T, C, F);
}

static void k_mlp_backward_input(struct exec_stream *s, float *dh, float *bwork, const float *dm,
                                 const float *saved, const float *params, int T, int C, int F,
                                 bool accumulate) {
  (void)s;
  kernels_mlp_backward_input(dh, bwork, dm, saved, params, T, C, F, accumulate);
}

static void k_mlp_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                  const float *dm, const float *h, const float *saved, int T, int C,
                                  int F) {
  (void)s;
  kernels_mlp_backward_weight(dparams, bwork, dm, h, saved, T, C, F);
}

static void k_mlp_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                           const float *dm, const float *h, const float *saved, const float *params,
                           int T, int C, int F, bool accumulate) {
  (void)s;
  kernels_mlp_backward(dh, dparams, bwork, dm, h, saved, params, T, C, F, accumulate);
}

static void k_router_forward(struct exec_stream *s, int32_t *ids, float *weights, float *saved,
                             const float *h, const float *params, int T, int C, int E, int K) {
  (void)s;
  kernels_router_forward(ids, weights, saved, h, params, T, C, E, K);
}

static void k_router_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                    const float *dweights, const int32_t *ids, const float *weights,
                                    const float *saved, const float *params, int T, int C, int E,
                                    int K, bool accumulate) {
  (void)s;
  kernels_router_backward_input(dh, bwork, dweights, ids, weights, saved, params, T, C, E, K,
                                accumulate);
}

static void k_router_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                     const float *h, int T, int C, int E) {
  (void)s;
  kernels_router_backward_weight(dparams, bwork, h, T, C, E);
}

static void k_router_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                              const float *dweights, const int32_t *ids, const float *weights,
                              const float *saved, const float *h, const float *params, int T, int C,
                              int E, int K, bool accumulate) {
  (void)s;
  kernels_router_backward(dh, dparams, bwork, dweights, ids, weights, saved, h, params, T, C, E, K,
                          accumulate);
}

static void k_moe_dispatch_plan(struct exec_stream *s, int32_t *send_counts, int32_t *route_row,
                                const int32_t *ids, int T, int K, int E, int n_ranks) {
  (void)s;
  kernels_moe_dispatch_plan(send_counts, route_row, ids, T, K, E, n_ranks);
}

static void k_moe_dispatch_forward(struct exec_stream *s, float *send, int32_t *send_expert,
                                   const float *h, const int32_t *ids, const int32_t *route_row,
                                   int T, int K, int C) {
  (void)s;
  kernels_moe_dispatch_forward(send, send_expert, h, ids, route_row, T, K, C);
}

static void k_moe_dispatch_backward(struct exec_stream *s, float *dh, const float *dsend,
                                    const int32_t *route_row, int T, int K, int C,
                                    bool accumulate) {
  (void)s;
  kernels_moe_dispatch_backward(dh, dsend, route_row, T, K, C, accumulate);
}

static void k_moe_combine_forward(struct exec_stream *s, float *m, const float *y,
                                  const float *weights, const int32_t *route_row, int T, int K,
                                  int C) {
  (void)s;
  kernels_moe_combine_forward(m, y, weights, route_row, T, K, C);
}

static void k_moe_combine_backward(struct exec_stream *s, float *dy, float *dweights,
                                   const float *dm, const float *y, const float *weights,
                                   const int32_t *route_row, int T, int K, int C) {
  (void)s;
  kernels_moe_combine_backward(dy, dweights, dm, y, weights, route_row, T, K, C);
}

static void k_expert_ffn_forward(struct exec_stream *s, float *out, float *saved, float *scratch,
                                 const float *in, const int32_t *row_expert, int n_rows,
                                 const float *params, int e_first, int e_count, int C, int F) {
  (void)s;
  kernels_expert_ffn_forward(out, saved, scratch, in, row_expert, n_rows, params, e_first, e_count,
                             C, F);
}

static void k_expert_ffn_backward_input(struct exec_stream *s, float *din, float *bwork,
                                        float *scratch, const float *dout,
                                        const int32_t *row_expert, int n_rows, const float *saved,
                                        const float *params, int e_first, int e_count, int C, int F,
                                        bool accumulate) {
  (void)s;
  kernels_expert_ffn_backward_input(din, bwork, scratch, dout, row_expert, n_rows, saved, params,
                                    e_first, e_count, C, F, accumulate);
}

static void k_expert_ffn_backward_weight(struct exec_stream *s, float *dparams, const float *bwork,
                                         const int32_t *row_expert, int n_rows, const float *saved,
                                         int e_first, int e_count, int C, int F) {
  (void)s;
  kernels_expert_ffn_backward_weight(dparams, bwork, row_expert, n_rows, saved, e_first, e_count, C,
                                     F);
}

static void k_expert_ffn_backward(struct exec_stream *s, float *din, float *dparams, float *bwork,
                                  float *scratch, const float *dout, const int32_t *row_expert,
                                  int n_rows, const float *saved, const float *params, int e_first,
                                  int e_count, int C, int F, bool accumulate) {
  (void)s;
  kernels_expert_ffn_backward(din, dparams, bwork, scratch, dout, row_expert, n_rows, saved, params,
                              e_first, e_count, C, F, accumulate);
}

static void k_lm_head_loss_forward(struct exec_stream *s, float *loss, float *saved, const float *h,
                                   const int32_t *targets, const float *params,
                                   enum kernels_lm_head_layout layout, int T, int C, int V) {
  (void)s;
  *loss = kernels_lm_head_loss_forward(saved, h, targets, params, layout, T, C, V);
}

static void k_lm_head_loss_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                          const float *saved, const int32_t *targets,
                                          const float *params, enum kernels_lm_head_layout layout,
                                          float dloss, int T, int C, int V, bool accumulate) {
  (void)s;
  kernels_lm_head_loss_backward_input(dh, bwork, saved, targets, params, layout, dloss, T, C, V,
                                      accumulate);
}

static void k_lm_head_loss_backward_weight(struct exec_stream *s, float *dparams,
                                           const float *bwork, const float *h,
                                           enum kernels_lm_head_layout layout, int T, int C,
                                           int V) {
  (void)s;
  kernels_lm_head_loss_backward_weight(dparams, bwork, h, layout, T, C, V);
}

static void k_lm_head_loss_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                                    const float *saved, const float *h, const int32_t *targets,
                                    const float *params, enum kernels_lm_head_layout layout,
                                    float dloss, int T, int C, int V, bool accumulate) {
  (void)s;
  kernels_lm_head_loss_backward(dh, dparams, bwork, saved, h, targets, params, layout, dloss, T, C,
                                V, accumulate);
}

static void k_residual_add_forward(struct exec_stream *s, float *x, const float *y, size_t n) {
  (void)s;
  kernels_residual_add_forward(x, y, n);
}

static void k_residual_add_backward(struct exec_stream *s, float *dy, const float *dx, size_t n,
                                    bool accumulate) {
  (void)s;
  kernels_residual_add_backward(dy, dx, n, accumulate);
}

static void k_adamw_step(struct exec_stream *s, float *params, const float *grads, float *m,
                         float *v, size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int step) {
  (void)s;
  kernels_adamw_step(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

static const struct exec_kernels host_kernels = {
    .fill = host_fill,
    .copy = host_copy,
    .add = host_add,
    .embedding_forward = k_embedding_forward,
    .embedding_backward_weight = k_embedding_backward_weight,
    .embedding_backward = k_embedding_backward,
    .rmsnorm_forward = k_rmsnorm_forward,
    .rmsnorm_backward_input = k_rmsnorm_backward_input,
    .rmsnorm_backward_weight = k_rmsnorm_backward_weight,
    .rmsnorm_backward = k_rmsnorm_backward,
    .attention_forward = k_attention_forward,
    .attention_backward_input = k_attention_backward_input,
    .attention_backward_weight = k_attention_backward_weight,
    .attention_backward = k_attention_backward,
    .mlp_forward = k_mlp_forward,
    .mlp_backward_input = k_mlp_backward_input,
    .mlp_backward_weight = k_mlp_backward_weight,
    .mlp_backward = k_mlp_backward,
    .router_forward = k_router_forward,
    .router_backward_input = k_router_backward_input,
    .router_backward_weight = k_router_backward_weight,
    .router_backward = k_router_backward,
    .moe_dispatch_plan = k_moe_dispatch_plan,
    .moe_dispatch_forward = k_moe_dispatch_forward,
    .moe_dispatch_backward = k_moe_dispatch_backward,
    .moe_combine_forward = k_moe_combine_forward,
    .moe_combine_backward = k_moe_combine_backward,
    .expert_ffn_forward = k_expert_ffn_forward,
    .expert_ffn_backward_input = k_expert_ffn_backward_input,
    .expert_ffn_backward_weight = k_expert_ffn_backward_weight,
    .expert_ffn_backward = k_expert_ffn_backward,
    .lm_head_loss_forward = k_lm_head_loss_forward,
    .lm_head_loss_backward_input = k_lm_head_loss_backward_input,
    .lm_head_loss_backward_weight = k_lm_head_loss_backward_weight,
    .lm_head_loss_backward = k_lm_head_loss_backward,
    .residual_add_forward = k_residual_add_forward,
    .residual_add_backward = k_residual_add_backward,
    .adamw_step = k_adamw_step,
};

/* ---- lifecycle --------------------------------------------------------------------------- */

static void context_free(struct host_context *b) {
  g_ptr_array_free(b->streams, TRUE);
  g_cond_clear(&b->main_cond);
  g_mutex_clear(&b->lock);
  g_free(b);
}

static bool host_init(struct exec_backend *backend, const struct exec_backend_params *p,
                      GError **err) {
  struct host_context *b = g_new0(struct host_context, 1);
  g_mutex_init(&b->lock);
  g_cond_init(&b->main_cond);
  b->streams = g_ptr_array_new();
  b->size = 1;
  if (!exec_host_comm_init(b, p, err)) {
    g_free(b->world); /* a failed start has nothing to finalise */
    context_free(b);
    return false;
  }
  /* every rank leaves the barrier at about the same moment: a shared time origin */
  exec_host_comm_barrier(b);
  b->epoch = piper_clock_seconds();
  backend->context = b;
  return true;
}

static void host_free(struct exec_backend *backend) {
  struct host_context *b = backend->context;
  if (!b)
    return;
  while (b->streams->len)
    host_stream_destroy(g_ptr_array_index(b->streams, 0));
  exec_host_comm_finalize(b);
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
static struct exec_comm *host_comm_create(struct exec_backend *b, const char *label,
                                          const uint32_t *members, uint32_t n_members,
                                          bool point_to_point, GError **err) {
  return exec_host_comm_create(b->context, label, members, n_members, point_to_point, err);
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
    .description = "CPU: reference kernels in C with BLAS GEMMs, one thread per stream, "
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
    .comm_destroy = exec_host_comm_destroy,
    .send = exec_host_send,
    .recv = exec_host_recv,
    .all_reduce_f32 = exec_host_all_reduce_f32,
    .reduce_scatter_f32 = exec_host_reduce_scatter_f32,
    .all_gather = exec_host_all_gather,
    .all_to_all_i32 = exec_host_all_to_all_i32,
    .all_to_all_v = exec_host_all_to_all_v,
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
