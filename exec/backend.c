/* backend: the public face of a backend instance. Every call the executor makes to a backend
 * goes through these wrappers (ggml-backend's pattern): they check their arguments, supply the
 * default of an optional entry the table leaves NULL, and keep the version check in one place,
 * so the runner never touches a table and an out-of-tree backend fills in only what it has. */
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/json.h"
#include "backend.h"

/* ---- the built-in backends and the op list ------------------------------------------------ */

#ifdef HAVE_CUDA
extern const struct exec_backend_ops exec_backend_cuda; /* exec/backend_cuda.c */
#endif

const struct exec_backend_ops *const exec_backends[] = {
    &exec_backend_host,
#ifdef HAVE_CUDA
    &exec_backend_cuda,
#endif
    NULL,
};

const struct exec_backend_ops *exec_backend_find(const char *name) {
  for (size_t i = 0; exec_backends[i]; i++)
    if (strcmp(exec_backends[i]->name, name) == 0)
      return exec_backends[i];
  return NULL;
}

const char *exec_backend_builtin(uint32_t i, const char **description) {
  for (uint32_t k = 0; exec_backends[k]; k++)
    if (k == i) {
      if (description)
        *description = exec_backends[k]->description;
      return exec_backends[k]->name;
    }
  return NULL;
}

/* Each op's name, use, and where its entry lies: in the kernel table or in the backend's. */
static const struct op_info {
  const char *name;
  enum exec_op_use use;
  bool collective;
  size_t offset;
} op_info[EXEC_OP_COUNT] = {
#define EXEC_KERNEL(name, use, params, args) {#name, use, false, offsetof(struct exec_kernels, name)},
#define EXEC_COLLECTIVE(name, use, params, args, pre)                                             \
  {#name, use, true, offsetof(struct exec_backend_ops, name)},
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
};

static const char *const use_names[EXEC_USE_COUNT] = {
    [EXEC_USE_ALWAYS] = "every plan",
    [EXEC_USE_EMBEDDING] = "the embedding",
    [EXEC_USE_RMSNORM] = "RMSNorm",
    [EXEC_USE_ATTENTION] = "attention",
    [EXEC_USE_MLA_ATTENTION] = "MLA attention",
    [EXEC_USE_MLP] = "the MLP",
    [EXEC_USE_EXPERTS] = "the routed experts",
    [EXEC_USE_LM_HEAD] = "the LM head",
    [EXEC_USE_SELECTIVE_RECOMPUTE] = "selective recomputation",
    [EXEC_USE_TENSOR_PARALLEL] = "tensor parallelism",
    [EXEC_USE_CONTEXT_PARALLEL] = "context parallelism",
    [EXEC_USE_POINT_TO_POINT] = "pipeline transfers",
    [EXEC_USE_ALL_REDUCE] = "gradient all-reduce",
    [EXEC_USE_REDUCE_SCATTER] = "gradient reduce-scatter",
    [EXEC_USE_ALL_GATHER] = "parameter all-gather",
    [EXEC_USE_ALL_TO_ALL] = "expert all-to-all",
};

const char *exec_op_name(enum exec_op op) {
  PIPER_ASSERT(op < EXEC_OP_COUNT);
  return op_info[op].name;
}

enum exec_op_use exec_op_use(enum exec_op op) {
  PIPER_ASSERT(op < EXEC_OP_COUNT);
  return op_info[op].use;
}

const char *exec_op_use_name(enum exec_op_use use) {
  PIPER_ASSERT(use < EXEC_USE_COUNT);
  return use_names[use];
}

typedef void (*any_fn)(void);

static bool table_has(const struct exec_backend_ops *ops, enum exec_op op) {
  const char *base = op_info[op].collective ? (const char *)ops : (const char *)ops->kernels;
  any_fn f;
  memcpy(&f, base + op_info[op].offset, sizeof f);
  return f != NULL;
}

bool exec_backend_supports_op(const struct exec_backend *b, enum exec_op op) {
  PIPER_ASSERT(b != NULL && op < EXEC_OP_COUNT);
  return table_has(b->ops, op);
}

/* Required entries, by name, for the message of a table that lacks one. */
#define REQUIRED(ops, entry)                                                                       \
  { #entry, (ops)->entry != NULL }

static bool check_table(const struct exec_backend_ops *ops, GError **err) {
  if (ops->api_version != EXEC_BACKEND_API_VERSION)
    return piper_input_error(err,
                             "backend \"%s\": interface version %u, this executor needs %u "
                             "(rebuild the backend against exec/exec.h)",
                             ops->name ? ops->name : "?", ops->api_version,
                             EXEC_BACKEND_API_VERSION);
  const struct {
    const char *name;
    bool present;
  } required[] = {
      REQUIRED(ops, name),
      REQUIRED(ops, init),
      REQUIRED(ops, free),
      REQUIRED(ops, alloc),
      REQUIRED(ops, release),
      REQUIRED(ops, to_host),
      REQUIRED(ops, from_host),
      REQUIRED(ops, stream_create),
      REQUIRED(ops, stream_destroy),
      REQUIRED(ops, stream_submit),
      REQUIRED(ops, event_create),
      REQUIRED(ops, event_destroy),
      REQUIRED(ops, event_record),
      REQUIRED(ops, stream_wait_event),
      REQUIRED(ops, event_synchronize),
      REQUIRED(ops, comm_create),
      REQUIRED(ops, comm_destroy),
      REQUIRED(ops, kernels),
  };
  for (size_t i = 0; i < G_N_ELEMENTS(required); i++)
    if (!required[i].present)
      return piper_input_error(err, "backend \"%s\": the table has no %s (a required entry)",
                               ops->name ? ops->name : "?", required[i].name);
  if ((ops->p2p_start == NULL) != (ops->p2p_finish == NULL))
    return piper_input_error(err, "backend \"%s\": the table has one of p2p_start and p2p_finish "
                                  "(both or neither)", ops->name);
  /* the ops every plan runs (ops.def's EXEC_USE_ALWAYS); the others are checked per plan */
  for (int op = 0; op < EXEC_OP_COUNT; op++)
    if (op_info[op].use == EXEC_USE_ALWAYS && !table_has(ops, (enum exec_op)op))
      return piper_input_error(err, "backend \"%s\": the table has no %s (every plan runs it)",
                               ops->name, op_info[op].name);
  return true;
}

struct exec_backend *exec_backend_init(const struct exec_backend_ops *ops,
                                       const struct exec_backend_params *p, GError **err) {
  PIPER_ASSERT(ops != NULL);
  if (!check_table(ops, err))
    return NULL;
  /* without parameters: no arguments for MPI, and the launcher's view read here */
  struct exec_backend_params detected = {NULL, NULL, false, piper_launch_detect()};
  if (!p)
    p = &detected;
  struct exec_backend *b = g_new0(struct exec_backend, 1);
  b->ops = ops;
  b->launch = p->launch;
  if (!ops->init(b, p, err)) {
    g_free(b);
    return NULL;
  }
  return b;
}

struct exec_backend *exec_backend_init_by_name(const char *name,
                                               const struct exec_backend_params *p, GError **err) {
  PIPER_ASSERT(name != NULL);
  const struct exec_backend_ops *ops = exec_backend_find(name);
  if (!ops) {
    piper_input_error(err, "backend \"%s\" is not built in (see --list-backends)", name);
    return NULL;
  }
  return exec_backend_init(ops, p, err);
}

void exec_backend_free(struct exec_backend *b) {
  if (!b)
    return;
  b->ops->free(b);
  g_free(b);
}

const char *exec_backend_name(const struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->name;
}

void exec_backend_abort(struct exec_backend *b, int code) {
  PIPER_ASSERT(b != NULL);
  if (b->ops->abort)
    b->ops->abort(b, code);
}

uint32_t exec_backend_world_rank(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->world_rank ? b->ops->world_rank(b) : 0;
}

uint32_t exec_backend_world_size(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->world_size ? b->ops->world_size(b) : 1;
}

const char *exec_backend_comm_library(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->comm_library ? b->ops->comm_library(b) : "none";
}

double exec_backend_clock(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->clock ? b->ops->clock(b) : piper_clock_seconds();
}

bool exec_backend_busy_clock(struct exec_backend *b, double *secs) {
  PIPER_ASSERT(b != NULL && secs != NULL);
  *secs = b->ops->busy_clock ? b->ops->busy_clock(b) : 0;
  return b->ops->busy_clock != NULL;
}

bool exec_backend_configure(struct exec_backend *b, const struct plan *plan, uint32_t device,
                            GError **err) {
  PIPER_ASSERT(b != NULL && plan != NULL && device < plan->n_devices);
  return b->ops->configure ? b->ops->configure(b, plan, device, err) : true;
}

bool exec_backend_task_times(struct exec_backend *b, uint32_t task_id, double *start,
                             double *end) {
  PIPER_ASSERT(b != NULL && start != NULL && end != NULL);
  return b->ops->task_times ? b->ops->task_times(b, task_id, start, end) : false;
}

bool exec_backend_enqueues(const struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->task_times != NULL;
}

uint64_t exec_backend_progress(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->progress ? b->ops->progress(b) : 0;
}

bool exec_backend_loop_stats(struct exec_backend *b, struct exec_backend_loop_stats *out) {
  PIPER_ASSERT(b != NULL && out != NULL);
  memset(out, 0, sizeof *out);
  if (!b->ops->loop_stats)
    return false;
  b->ops->loop_stats(b, out);
  return true;
}

void exec_backend_cancel(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  if (b->ops->cancel)
    b->ops->cancel(b);
}

void exec_backend_reset(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  if (b->ops->reset)
    b->ops->reset(b);
}

const struct exec_kernels *exec_backend_kernels(const struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->kernels;
}

/* ---- memory ------------------------------------------------------------------------------ */

void *exec_backend_alloc(struct exec_backend *b, size_t bytes) {
  PIPER_ASSERT(b != NULL);
  return b->ops->alloc(b, bytes);
}

void *exec_backend_alloc_tensor(struct exec_backend *b, uint32_t tensor, size_t bytes) {
  PIPER_ASSERT(b != NULL);
  return b->ops->alloc_tensor ? b->ops->alloc_tensor(b, tensor, bytes) : b->ops->alloc(b, bytes);
}

uint64_t exec_backend_memory_peak(struct exec_backend *b, uint64_t counted) {
  PIPER_ASSERT(b != NULL);
  uint64_t v = b->ops->memory_peak ? b->ops->memory_peak(b) : 0;
  return v ? v : counted;
}

void exec_backend_release(struct exec_backend *b, void *device_p) {
  PIPER_ASSERT(b != NULL);
  if (device_p)
    b->ops->release(b, device_p);
}

void exec_backend_to_host(struct exec_backend *b, void *host_dst, const void *device_src,
                          size_t bytes) {
  PIPER_ASSERT(b != NULL);
  PIPER_ASSERT(bytes == 0 || (host_dst != NULL && device_src != NULL));
  b->ops->to_host(b, host_dst, device_src, bytes);
}

void exec_backend_from_host(struct exec_backend *b, void *device_dst, const void *host_src,
                            size_t bytes) {
  PIPER_ASSERT(b != NULL);
  PIPER_ASSERT(bytes == 0 || (device_dst != NULL && host_src != NULL));
  b->ops->from_host(b, device_dst, host_src, bytes);
}

/* ---- streams and events ------------------------------------------------------------------ */

struct exec_stream *exec_stream_create(struct exec_backend *b, const char *name, int priority,
                                       GError **err) {
  PIPER_ASSERT(b != NULL && name != NULL);
  return b->ops->stream_create(b, name, priority, err);
}

void exec_stream_destroy(struct exec_backend *b, struct exec_stream *s) {
  PIPER_ASSERT(b != NULL);
  if (s)
    b->ops->stream_destroy(s);
}

void exec_stream_submit(struct exec_backend *b, struct exec_stream *s, exec_task_fn fn, void *arg,
                        uint32_t task_id) {
  PIPER_ASSERT(b != NULL && s != NULL && fn != NULL);
  b->ops->stream_submit(s, fn, arg, task_id);
}

void exec_stream_status(struct exec_backend *b, struct exec_stream *s,
                        struct exec_stream_status *out) {
  PIPER_ASSERT(b != NULL && s != NULL && out != NULL);
  if (b->ops->stream_status)
    b->ops->stream_status(s, out);
  else
    *out = (struct exec_stream_status){EXEC_STREAM_IDLE, UINT32_MAX, 0, false};
}

const GError *exec_stream_error(struct exec_backend *b, struct exec_stream *s) {
  PIPER_ASSERT(b != NULL && s != NULL);
  return b->ops->stream_error ? b->ops->stream_error(s) : NULL;
}

void exec_stream_wait_event(struct exec_backend *b, struct exec_stream *s, struct exec_event *e) {
  PIPER_ASSERT(b != NULL && s != NULL && e != NULL);
  b->ops->stream_wait_event(s, e);
}

struct exec_event *exec_event_create(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->event_create(b);
}

void exec_event_destroy(struct exec_backend *b, struct exec_event *e) {
  PIPER_ASSERT(b != NULL);
  if (e)
    b->ops->event_destroy(e);
}

void exec_event_record(struct exec_backend *b, struct exec_event *e, struct exec_stream *s) {
  PIPER_ASSERT(b != NULL && e != NULL && s != NULL);
  b->ops->event_record(e, s);
}

bool exec_event_synchronize(struct exec_backend *b, struct exec_event *e, double timeout_s) {
  PIPER_ASSERT(b != NULL && e != NULL && timeout_s >= 0);
  return b->ops->event_synchronize(e, timeout_s);
}

/* ---- communication ----------------------------------------------------------------------- */

struct exec_comm *exec_comm_create(struct exec_backend *b, const char *label,
                                   const uint32_t *members, uint32_t n_members, bool point_to_point,
                                   GError **err) {
  PIPER_ASSERT(b != NULL && label != NULL && (members != NULL || n_members == 0));
  return b->ops->comm_create(b, label, members, n_members, point_to_point, err);
}

void exec_comm_destroy(struct exec_backend *b, struct exec_comm *c) {
  PIPER_ASSERT(b != NULL);
  if (c)
    b->ops->comm_destroy(c);
}

bool exec_comm_p2p_group(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err) {
  PIPER_ASSERT(b != NULL && (parts != NULL || n == 0));
  for (uint32_t k = 0; k < n; k++)
    PIPER_ASSERT(parts[k].comm != NULL && (parts[k].buf != NULL || parts[k].bytes == 0));
  if (b->ops->p2p_group)
    return b->ops->p2p_group(b, parts, n, err);
  bool ok = true;
  for (uint32_t k = 0; k < n && ok; k++) {
    const struct exec_p2p_part *x = &parts[k];
    ok = x->is_send ? b->ops->send(x->comm, x->peer_world_rank, x->buf, x->bytes, x->tag, err)
                    : b->ops->recv(x->comm, x->peer_world_rank, x->buf, x->bytes, x->tag, err);
  }
  return ok;
}

bool exec_comm_p2p_start(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         struct exec_p2p_flight **out, GError **err) {
  PIPER_ASSERT(b != NULL && out != NULL);
  *out = NULL;
  if (!b->ops->p2p_start)
    return exec_comm_p2p_group(b, parts, n, err);
  for (uint32_t k = 0; k < n; k++)
    PIPER_ASSERT(parts[k].comm != NULL && (parts[k].buf != NULL || parts[k].bytes == 0));
  return b->ops->p2p_start(b, parts, n, out, err);
}

bool exec_comm_p2p_finish(struct exec_backend *b, struct exec_p2p_flight *f, GError **err) {
  PIPER_ASSERT(b != NULL);
  return f == NULL || b->ops->p2p_finish(b, f, err);
}

#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre)                                             \
  bool exec_comm_##name(struct exec_backend *b, struct exec_comm *c, EXEC_UNPAREN params,         \
                        GError **err) {                                                           \
    PIPER_ASSERT(b != NULL && c != NULL && (pre));                                                \
    PIPER_ASSERT(b->ops->name != NULL); /* exec_check_plan_ops refused the plan before */         \
    return b->ops->name(c, EXEC_UNPAREN args, err);                                               \
  }
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE

/* ---- job-wide operations (one process: the identity) -------------------------------------- */

bool exec_world_all_reduce_f64(struct exec_backend *b, double *buf, size_t n,
                               enum exec_reduce_op op, GError **err) {
  PIPER_ASSERT(b != NULL && (buf != NULL || n == 0));
  return b->ops->world_all_reduce_f64 ? b->ops->world_all_reduce_f64(b, buf, n, op, err) : true;
}

bool exec_world_gather(struct exec_backend *b, const void *in, size_t bytes, void **out,
                       size_t **out_sizes, GError **err) {
  PIPER_ASSERT(b != NULL && (in != NULL || bytes == 0) && out != NULL && out_sizes != NULL);
  if (b->ops->world_gather)
    return b->ops->world_gather(b, in, bytes, out, out_sizes, err);
  *out = g_memdup2(in, bytes);
  *out_sizes = g_new(size_t, 1);
  (*out_sizes)[0] = bytes;
  return true;
}

bool exec_world_broadcast(struct exec_backend *b, void *buf, size_t bytes, GError **err) {
  PIPER_ASSERT(b != NULL && (buf != NULL || bytes == 0));
  return b->ops->world_broadcast ? b->ops->world_broadcast(b, buf, bytes, err) : true;
}

/* ---- what the runner asks of a backend ---------------------------------------------------- */

struct exec_stream *exec_backend_setup_stream(struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->setup_stream ? b->ops->setup_stream(b) : NULL;
}

uint32_t exec_backend_local_size(const struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->launch.local_size ? b->launch.local_size : 1;
}

bool exec_backend_host_memory(const struct exec_backend *b) {
  PIPER_ASSERT(b != NULL);
  return b->ops->host_memory;
}

bool exec_world_gather_layout(const uint64_t *sizes, uint32_t n, int *counts, int *displs,
                              size_t *total, GError **err) {
  *total = 0;
  for (uint32_t r = 0; r < n; r++) {
    if (sizes[r] > INT_MAX || *total > (size_t)INT_MAX - sizes[r])
      return piper_input_error(err, "the job's gathered report exceeds MPI's count (%d bytes)",
                               INT_MAX);
    counts[r] = (int)sizes[r];
    displs[r] = (int)*total;
    *total += (size_t)sizes[r];
  }
  return true;
}
