/* backend: the interface a backend implements (after ggml-backend-impl.h), for people who
 * write one; people who run plans need only exec.h. A backend is an instance of one table
 * (struct exec_backend_ops): memory, streams, events, communicators, the kernels and the
 * collectives of exec/ops.def. Callers use the wrappers below (exec/backend.c), never the
 * table: they check arguments and supply the default of an optional entry.
 *
 *   GError *err = NULL;
 *   struct exec_backend_ops mine = exec_backend_host; // a table: memory, streams, ..., kernels
 *   mine.name = "mine";
 *   struct exec_backend *b = exec_backend_init(&mine, NULL, &err);
 *   if (b && !exec_backend_supports_op(b, EXEC_OP_attention_core_forward))
 *     printf("%s lacks %s\n", exec_backend_name(b), exec_op_name(EXEC_OP_attention_core_forward));
 *   exec_backend_free(b);
 *
 * A table is written as the host's and cuda's are: their kernel and collective entries
 * generated from exec/ops.def (docs/exec.md, "Adding an op").
 */
#ifndef PIPER_EXEC_BACKEND_H
#define PIPER_EXEC_BACKEND_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ir/plan.h"
#include "../kernels/kernels.h"
#include "exec.h"

/* The version of the table below. A backend sets api_version to the value it was written
 * against; exec_backend_init refuses a table of another version. */
#define EXEC_BACKEND_API_VERSION 8 /* 2: loop_stats; 3: p2p_group; 4: configure, task_times; \
                                      5: alloc_tensor, memory_peak; 6: ops.def, \
                                      host_memory, setup_stream; 7: busy_clock; \
                                      8: p2p_start, p2p_finish */

struct exec_stream; /* an in-order queue of work (the backend's own type) */
struct exec_event;  /* marks a point in a stream's queue */
struct exec_comm;   /* a communicator: a set of world ranks, rank = position */
struct exec_p2p_flight; /* a point-to-point group in flight (p2p_start .. p2p_finish) */

/* A backend instance: its table and its private state. The same for every backend; made by
 * exec_backend_init, freed by exec_backend_free. */
struct exec_backend {
  const struct exec_backend_ops *ops;
  void *context; /* the backend's own (the host: struct host_context) */
  struct piper_launch launch; /* how this process was started (exec_backend_params) */
};

/* Work run in stream order, given the stream it runs on (kernels are enqueued on it). Returns
 * false with *err set to fail the stream (the runner then reports the error). */
typedef bool (*exec_task_fn)(struct exec_stream *s, void *arg, GError **err);

/* What a stream is doing, for the watchdog's message. */
enum exec_stream_phase { EXEC_STREAM_IDLE, EXEC_STREAM_WAITING, EXEC_STREAM_RUNNING };
struct exec_stream_status {
  enum exec_stream_phase phase;
  uint32_t task_id; /* id given to stream_submit (the runner: instruction index) */
  double since;     /* backend clock when the phase began */
  bool failed;
};

enum exec_reduce_op { EXEC_REDUCE_SUM, EXEC_REDUCE_MAX, EXEC_REDUCE_MIN };

/* A backend that runs work itself (the host's event loop) says what it spent on its own
 * account, outside tasks and outside idle waits for peers: totals since init. */
struct exec_backend_loop_stats {
  double dispatch_s; /* choosing, switching to and accounting for ready items */
  double test_s;     /* testing posted communication (the cost of progressing it) */
  uint64_t tests;    /* those tests */
  uint64_t items;    /* items run (tasks, records, waits) */
};

/* The ops (exec/ops.def): EXEC_OP_<name> for each kernel and collective, in the list's order. */
enum exec_op {
#define EXEC_KERNEL(name, use, params, args) EXEC_OP_##name,
#define EXEC_COLLECTIVE(name, use, params, args, pre) EXEC_OP_##name,
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
  EXEC_OP_COUNT
};

/* Which plans need an op (ops.def's second column): every plan, or a device whose plan has
 * the model op, feature or communication named. */
enum exec_op_use {
  EXEC_USE_ALWAYS,
  EXEC_USE_EMBEDDING,
  EXEC_USE_RMSNORM,
  EXEC_USE_ATTENTION,
  EXEC_USE_MLA_ATTENTION, /* no op in the list yet: every backend refuses it */
  EXEC_USE_MLP,
  EXEC_USE_EXPERTS, /* router, dispatch, routed experts, combine */
  EXEC_USE_LM_HEAD,
  EXEC_USE_SELECTIVE_RECOMPUTE,
  EXEC_USE_TENSOR_PARALLEL,
  EXEC_USE_CONTEXT_PARALLEL, /* the attention in parts and its blocks (exec/context_parallel.c) */
  EXEC_USE_POINT_TO_POINT,
  EXEC_USE_ALL_REDUCE,
  EXEC_USE_REDUCE_SCATTER,
  EXEC_USE_ALL_GATHER,
  EXEC_USE_ALL_TO_ALL,
  EXEC_USE_COUNT
};

#define EXEC_UNPAREN(...) __VA_ARGS__

/* Kernel table, one entry per EXEC_KERNEL of ops.def: kernels.h's function of the same name
 * with the stream it runs on first (a device backend enqueues it there; the host runs it
 * inline, in the task). s is never NULL: work outside any task (the runner's step setup) is
 * given exec_backend_setup_stream's stream. Every pointer argument is device memory (from
 * alloc). An entry a backend leaves NULL is an op it does not support. */
struct exec_kernels {
#define EXEC_KERNEL(name, use, params, args)                                                      \
  void (*name)(struct exec_stream * s, EXEC_UNPAREN params);
#define EXEC_COLLECTIVE(name, use, params, args, pre)
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
};

/* The table a backend implements (after ggml's backend interface). Entries marked optional may
 * be NULL: the wrappers in exec/backend.c (exec_backend_*, exec_stream_*, exec_event_*,
 * exec_comm_*, exec_world_*) supply the default named beside them. Callers use the wrappers,
 * never the table. Everything else is required (exec_backend_init checks). "Host memory" is
 * memory the CPU reads (g_malloc); "device memory" comes from alloc. */
/* One part of a point-to-point group (exec_comm_p2p_group): a send of bytes from buf, or a
 * receive of bytes into buf, with peer_world_rank on comm, matched by tag. */
struct exec_p2p_part {
  struct exec_comm *comm;
  uint32_t peer_world_rank;
  bool is_send;
  void *buf; /* device memory; a send only reads it */
  size_t bytes;
  int tag;
};

struct exec_backend_ops {
  uint32_t api_version;    /* EXEC_BACKEND_API_VERSION */
  const char *name;        /* "host", "cuda": the report's "backend" */
  const char *description; /* one line for --list-backends */
  bool host_memory;        /* alloc returns memory the CPU reads (the host backend) */

  /* Lifecycle. init sets b->context (and starts the process group, MPI for host, when there
   * is one); free releases it. Optional: abort ends every process of the job now, after an
   * unrecoverable error (peers may be blocked) (default: nothing; the caller exits). */
  bool (*init)(struct exec_backend *b, const struct exec_backend_params *p, GError **err);
  void (*free)(struct exec_backend *b);
  void (*abort)(struct exec_backend *b, int code);
  /* Optional: this process's rank in the job and the job's size (default 0 and 1). */
  uint32_t (*world_rank)(struct exec_backend *b);
  uint32_t (*world_size)(struct exec_backend *b);
  /* Optional: "MPI (Open MPI 4.1.4)" (default "none"). */
  const char *(*comm_library)(struct exec_backend *b);
  /* Optional: the plan this process runs as device `device`, before anything is allocated
   * (a device backend sizes its memory, limits streams to their sm_share and picks its GEMM
   * precision from it). Default: nothing. */
  bool (*configure)(struct exec_backend *b, const struct plan *plan, uint32_t device,
                    GError **err);
  /* Optional: seconds on a clock all ranks share, offsets aligned at init (default: the
   * process's monotonic clock). */
  double (*clock)(struct exec_backend *b);
  /* Optional: seconds the device has worked so far, on a clock that stops while it is not
   * running, the figure ranks are compared by (piper-exec's stragglers). The host backend's
   * device is the thread that runs its tasks: that thread's CPU time, so a rank that waits for
   * a core it shares (more ranks than cores) is not counted slower, and one whose core does
   * less a second is. Default: none (the runner compares the compute tasks' times on clock,
   * which a device that times its own work, cuda, measures on the device). */
  double (*busy_clock)(struct exec_backend *b);

  /* Memory: zero-filled device buffers (NULL when out of memory), and synchronous copies to
   * and from host memory (complete when they return, after work already enqueued). */
  void *(*alloc)(struct exec_backend *b, size_t bytes);
  void (*release)(struct exec_backend *b, void *p);
  /* Optional: a buffer of plan tensor `tensor` (an index into the configured device's class
   * tensors), which a backend may place where its offline plan put the tensor (cuda: the
   * arena planner's offset); released with release (default: alloc). Unlike alloc's, its
   * contents are undefined: the executor zeroes what must start at zero, and zeroing every
   * block again costs a launch and the block's bytes of bandwidth per allocation. With
   * EXEC_TENSOR_SLOT_TOP or'ed into tensor, the block goes from the top of the tensor's slot
   * down (a workspace's blocks fill its slot from both ends: exec/memory.c). */
  void *(*alloc_tensor)(struct exec_backend *b, uint32_t tensor, size_t bytes);
  /* Optional: the device memory this process's buffers really spanned at most, where the
   * backend places them itself (cuda: the highest byte of its one allocation in use, the
   * planned arena included), reported as the peak; 0 when it has none (default: the sum of
   * live buffers the runner counted). */
  uint64_t (*memory_peak)(struct exec_backend *b);
  void (*to_host)(struct exec_backend *b, void *host_dst, const void *device_src, size_t bytes);
  void (*from_host)(struct exec_backend *b, void *device_dst, const void *host_src, size_t bytes);

  /* Streams and events (CUDA semantics): work submitted to a stream runs in order;
   * event_record marks the stream's current end, stream_wait_event makes later work on a
   * stream wait for the event's latest record; event_synchronize waits on the host, up to
   * timeout_s (false on timeout). Submission is from one host thread. A backend may run
   * work only inside event_synchronize, on the calling thread (the host's event loop): the
   * runner calls it in slices and looks at progress between them; timeout_s is then looked
   * at between tasks. */
  struct exec_stream *(*stream_create)(struct exec_backend *b, const char *name, int priority,
                                       GError **err);
  void (*stream_destroy)(struct exec_stream *s);
  void (*stream_submit)(struct exec_stream *s, exec_task_fn fn, void *arg, uint32_t task_id);
  /* Optional (default: idle, never failed). */
  void (*stream_status)(struct exec_stream *s, struct exec_stream_status *out);
  /* Optional: first error of a failed stream (owned by the stream), or NULL (default NULL). */
  const GError *(*stream_error)(struct exec_stream *s);
  struct exec_event *(*event_create)(struct exec_backend *b);
  void (*event_destroy)(struct exec_event *e);
  void (*event_record)(struct exec_event *e, struct exec_stream *s);
  void (*stream_wait_event)(struct exec_stream *s, struct exec_event *e);
  bool (*event_synchronize)(struct exec_event *e, double timeout_s);
  /* Optional: the stream of work enqueued outside any task (the runner's step setup), which
   * the backend orders before work submitted after it (default NULL: kernels run inline). */
  struct exec_stream *(*setup_stream)(struct exec_backend *b);
  /* Optional: count of work items finished so far, the watchdog's progress signal (default 0:
   * the watchdog then counts from the start of each wait). */
  uint64_t (*progress)(struct exec_backend *b);
  /* Optional: when the work of task task_id (the instruction index given to stream_submit)
   * of the step last waited for ran, on the backend's clock: a backend whose tasks only
   * enqueue (cuda) times the work itself (events around it on its stream). False when it does
   * not know (default): the runner keeps the times it measured around the task. */
  bool (*task_times)(struct exec_backend *b, uint32_t task_id, double *start, double *end);
  /* Optional: the backend's own time (default: none; the runner then estimates the executor
   * overhead from instruction start and end times alone). */
  void (*loop_stats)(struct exec_backend *b, struct exec_backend_loop_stats *out);
  /* Optional: cancel makes every blocked or queued item fail soon ("cancelled"): posted
   * communication is cancelled or completed before the task that posted it fails, and work
   * whose communication cannot be stopped is never resumed, so nothing it touches may be
   * freed (its stream never drains); reset clears it before another run, when no stream is
   * busy (default: nothing). */
  void (*cancel)(struct exec_backend *b);
  void (*reset)(struct exec_backend *b);

  /* Communicators. comm_create is collective over the whole job: every rank calls it for the
   * same (label, members) lists in the same order, members or not; it returns NULL to
   * non-members (err unset). Operations are called from tasks and block the stream until done;
   * counts are elements, byte counts bytes; buffers are device memory except all_to_all_i32's
   * and the size arrays, which are host memory. All required. */
  struct exec_comm *(*comm_create)(struct exec_backend *b, const char *label,
                                   const uint32_t *members, uint32_t n_members, bool point_to_point,
                                   GError **err);
  void (*comm_destroy)(struct exec_comm *c);
  /* Optional: a point-to-point group, issued together and completing together (CUDA:
   * ncclGroupStart, each part's ncclSend/ncclRecv, ncclGroupEnd; host: every part posted
   * nonblocking, then one wait that suspends the task once): returns when every part has met
   * its peer; false when any part failed (then none is in flight). Parts come in an order in
   * which, run one after another, mirrored groups on two ranks still meet (with each peer, the
   * lower rank sends first). Default: send and recv on the parts in that order. */
  bool (*p2p_group)(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                    GError **err);
  /* Optional, both or neither: p2p_group in two halves, so that work the task issues between
   * them runs while the parts are in flight (context parallelism's ring, exec/context_parallel.c).
   * p2p_start posts the parts (the same order rule) and returns at once with *out (NULL when
   * nothing is left in flight); p2p_finish waits for them and frees *out (NULL: nothing). Until
   * it returns, the send buffers are read and must not be written, and the receive buffers
   * hold nothing yet. A started group is always finished, on failure paths too. Host: every
   * part posted nonblocking, the wait at finish (the task suspends there once); cuda: NCCL's
   * group on the backend's own side stream, after the task stream's work so far, and the task
   * stream waits for it at finish. Default: p2p_start runs the whole group (p2p_group), then
   * there is nothing to finish. */
  bool (*p2p_start)(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                    struct exec_p2p_flight **out, GError **err);
  bool (*p2p_finish)(struct exec_backend *b, struct exec_p2p_flight *f, GError **err);
  /* Collectives, one entry per EXEC_COLLECTIVE of ops.def (NULL: not supported). */
#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre)                                             \
  bool (*name)(struct exec_comm * c, EXEC_UNPAREN params, GError * *err);
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE

  /* Job-wide operations outside the plan (loss, timings, report) on host memory, called from
   * tasks. Optional for a one-process backend (defaults: the identity; gather returns this
   * process's bytes). */
  bool (*world_all_reduce_f64)(struct exec_backend *b, double *buf, size_t n,
                               enum exec_reduce_op op, GError **err);
  /* Rank 0 receives every rank's bytes concatenated in rank order (*out, *out_sizes: g_free);
   * other ranks get NULL. */
  bool (*world_gather)(struct exec_backend *b, const void *in, size_t bytes, void **out,
                       size_t **out_sizes, GError **err);
  bool (*world_broadcast)(struct exec_backend *b, void *buf, size_t bytes, GError **err);

  const struct exec_kernels *kernels;
};

extern const struct exec_backend_ops exec_backend_host;
/* How long the host backend's loop polls, when nothing is ready, before it sleeps between
 * polls (piper-prof writes it into the profile: the simulator's model of that loop; an idle
 * spell within it sees its communication end at once, a longer one loop_late_us late). */
#define EXEC_HOST_IDLE_SPIN_US 1000
/* Built-in backends, NULL-terminated. */
extern const struct exec_backend_ops *const exec_backends[];
const struct exec_backend_ops *exec_backend_find(const char *name);

/* ---- using a backend (exec/backend.c) ------------------------------------------------------ */

/* An instance of ops (input error: a table of another API version or missing a required
 * entry). exec_backend_init_by_name (exec.h) looks the backend up in exec_backends. */
struct exec_backend *exec_backend_init(const struct exec_backend_ops *ops,
                                       const struct exec_backend_params *p, GError **err);
double exec_backend_clock(struct exec_backend *b);
/* The backend's busy_clock into *secs; false (and *secs 0) without one. */
bool exec_backend_busy_clock(struct exec_backend *b, double *secs);
bool exec_backend_configure(struct exec_backend *b, const struct plan *plan, uint32_t device,
                            GError **err);
bool exec_backend_task_times(struct exec_backend *b, uint32_t task_id, double *start,
                             double *end);
/* Whether the backend's tasks only enqueue work (it times tasks itself: task_times): a buffer
 * may then still be in use when the task that used it last has returned. */
bool exec_backend_enqueues(const struct exec_backend *b);
uint64_t exec_backend_progress(struct exec_backend *b);
/* False (out zeroed) when the backend keeps no such figures. */
bool exec_backend_loop_stats(struct exec_backend *b, struct exec_backend_loop_stats *out);
void exec_backend_cancel(struct exec_backend *b);
void exec_backend_reset(struct exec_backend *b);
const struct exec_kernels *exec_backend_kernels(const struct exec_backend *b);

void *exec_backend_alloc(struct exec_backend *b, size_t bytes);
/* alloc_tensor's flag: from the slot's top (plan tensor indices stay below it) */
#define EXEC_TENSOR_SLOT_TOP 0x80000000u
void *exec_backend_alloc_tensor(struct exec_backend *b, uint32_t tensor, size_t bytes);
/* The backend's memory_peak, or counted (the runner's sum of live buffers) without one. */
uint64_t exec_backend_memory_peak(struct exec_backend *b, uint64_t counted);
void exec_backend_release(struct exec_backend *b, void *device_p);
void exec_backend_to_host(struct exec_backend *b, void *host_dst, const void *device_src,
                          size_t bytes);
void exec_backend_from_host(struct exec_backend *b, void *device_dst, const void *host_src,
                            size_t bytes);

struct exec_stream *exec_stream_create(struct exec_backend *b, const char *name, int priority,
                                       GError **err);
void exec_stream_destroy(struct exec_backend *b, struct exec_stream *s);
void exec_stream_submit(struct exec_backend *b, struct exec_stream *s, exec_task_fn fn, void *arg,
                        uint32_t task_id);
void exec_stream_status(struct exec_backend *b, struct exec_stream *s,
                        struct exec_stream_status *out);
const GError *exec_stream_error(struct exec_backend *b, struct exec_stream *s);
void exec_stream_wait_event(struct exec_backend *b, struct exec_stream *s, struct exec_event *e);
struct exec_event *exec_event_create(struct exec_backend *b);
void exec_event_destroy(struct exec_backend *b, struct exec_event *e);
void exec_event_record(struct exec_backend *b, struct exec_event *e, struct exec_stream *s);
bool exec_event_synchronize(struct exec_backend *b, struct exec_event *e, double timeout_s);

struct exec_comm *exec_comm_create(struct exec_backend *b, const char *label,
                                   const uint32_t *members, uint32_t n_members, bool point_to_point,
                                   GError **err);
void exec_comm_destroy(struct exec_backend *b, struct exec_comm *c);
bool exec_comm_p2p_group(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err);
/* The backend's p2p_start and p2p_finish (or their defaults). */
bool exec_comm_p2p_start(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         struct exec_p2p_flight **out, GError **err);
bool exec_comm_p2p_finish(struct exec_backend *b, struct exec_p2p_flight *f, GError **err);
/* exec_comm_<name> for every collective of ops.def: asserts its precondition, then calls the
 * backend's entry. */
#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre)                                             \
  bool exec_comm_##name(struct exec_backend *b, struct exec_comm *c, EXEC_UNPAREN params,         \
                        GError **err);
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
bool exec_world_all_reduce_f64(struct exec_backend *b, double *buf, size_t n,
                               enum exec_reduce_op op, GError **err);
bool exec_world_gather(struct exec_backend *b, const void *in, size_t bytes, void **out,
                       size_t **out_sizes, GError **err);
bool exec_world_broadcast(struct exec_backend *b, void *buf, size_t bytes, GError **err);

/* world_gather's contract, for backends that gather with MPI: rank r's sizes[r] bytes lie at
 * displs[r] of rank 0's concatenation, in rank order; counts are sizes as MPI's int counts.
 * Returns the total bytes (input error: a rank's bytes do not fit an MPI count). */
bool exec_world_gather_layout(const uint64_t *sizes, uint32_t n, int *counts, int *displs,
                              size_t *total, GError **err);

/* The op's name ("rmsnorm_forward"), its use, and whether b's table has it. */
const char *exec_op_name(enum exec_op op);
enum exec_op_use exec_op_use(enum exec_op op);
const char *exec_op_use_name(enum exec_op_use use);
bool exec_backend_supports_op(const struct exec_backend *b, enum exec_op op);
/* The stream a kernel called outside any task runs on (the runner's step setup): the backend's
 * setup_stream, or NULL where kernels run inline (the host). */
struct exec_stream *exec_backend_setup_stream(struct exec_backend *b);
/* Ranks of this job on this machine (the launcher's, from exec_backend_params; 1 without). */
uint32_t exec_backend_local_size(const struct exec_backend *b);
/* Whether b's memory is the host's (ggml's is_host): the runner then checks that the plan
 * fits this machine's memory before allocating. */
bool exec_backend_host_memory(const struct exec_backend *b);

#endif
