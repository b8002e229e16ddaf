/* exec: the executor (SPEC §7). Runs the per-device plans for real, one process per device:
 * every instruction of this device's plan on its logical stream, cross-stream waits through
 * events, communication on communicators split per purpose, and training (forward, backward
 * with BI/BW where the plan splits it, gradient sync, AdamW) through a backend.
 *
 *   GError *err = NULL;
 *   const struct plan *plan = NULL; // from compile_run or plan_read_dir
 *   struct exec_backend *b = exec_backend_init(&exec_backend_host, NULL, &err);
 *   struct exec_options o = exec_options_default();
 *   o.plan = plan;
 *   o.iters = 10;
 *   struct exec_result r = {0};
 *   if (b && exec_run(&o, b, &r, &err))
 *     printf("final loss %f\n", r.losses[r.n_steps - 1]);
 *   exec_result_clear(&r);
 *   exec_backend_free(b);
 *
 * A backend is an instance of one small table (struct exec_backend_ops, after ggml's backend
 * interface): memory, streams, events, communicators and the kernel table, behind the wrappers
 * of exec/backend.c. The runner (exec/runner.c) knows nothing of threads, MPI or CUDA; `host`
 * (one event loop per process + MPI) is always built, others register in exec_backends[] where their build
 * flag is set, and an out-of-tree backend needs only this header.
 */
#ifndef PIPER_EXEC_EXEC_H
#define PIPER_EXEC_EXEC_H

#include <glib.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ir/plan.h"
#include "../kernels/kernels.h"
#include "../report/report.h"

/* ---- backend interface ------------------------------------------------------------------- */

/* The version of the table below. A backend sets api_version to the value it was written
 * against; exec_backend_init refuses a table of another version. */
#define EXEC_BACKEND_API_VERSION 5 /* 2: loop_stats; 3: p2p_group; 4: configure, task_times; \
                                      5: alloc_tensor, memory_peak */

struct exec_backend_ops;
struct exec_stream; /* an in-order queue of work (the backend's own type) */
struct exec_event;  /* marks a point in a stream's queue */
struct exec_comm;   /* a communicator: a set of world ranks, rank = position */

/* A backend instance: its table and its private state. The same for every backend; made by
 * exec_backend_init, freed by exec_backend_free. */
struct exec_backend {
  const struct exec_backend_ops *ops;
  void *context; /* the backend's own (the host: struct host_context) */
};

/* Work run in stream order, given the stream it runs on (kernels are enqueued on it). Returns
 * false with *err set to fail the stream (the runner then reports the error). */
typedef bool (*exec_task_fn)(struct exec_stream *s, void *arg, GError **err);

struct exec_backend_params {
  int *argc; /* for MPI_Init_thread; may be NULL */
  char ***argv;
  bool force_mpi; /* host: start MPI even when no launcher started this process */
};

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

/* Kernel table: the entry points of kernels.h with the stream they run on first (a device
 * backend enqueues them there; the host runs them inline, in the task). s is NULL
 * for work outside any task (the runner's step setup): the backend orders it before work
 * submitted after it. Every pointer argument is device memory (from alloc). All entries are
 * required. */
struct exec_kernels {
  void (*fill)(struct exec_stream *s, float *x, float value, size_t n);
  void (*copy)(struct exec_stream *s, void *dst, const void *src, size_t bytes);
  void (*add)(struct exec_stream *s, float *y, const float *x, size_t n); /* y += x */
  void (*embedding_forward)(struct exec_stream *s, float *x, const int32_t *tokens,
                            const float *params, int T, int V, int C);
  void (*embedding_backward_weight)(struct exec_stream *s, float *dparams, const float *dx,
                                    const int32_t *tokens, int T, int V, int C);
  void (*embedding_backward)(struct exec_stream *s, float *dparams, const float *dx,
                             const int32_t *tokens, int T, int V, int C);
  void (*rmsnorm_forward)(struct exec_stream *s, float *h, float *saved, const float *x,
                          const float *params, int T, int C, float eps);
  void (*rmsnorm_backward_input)(struct exec_stream *s, float *dx, const float *dh, const float *x,
                                 const float *saved, const float *params, int T, int C,
                                 bool accumulate);
  void (*rmsnorm_backward_weight)(struct exec_stream *s, float *dparams, const float *dh,
                                  const float *x, const float *saved, int T, int C);
  void (*rmsnorm_backward)(struct exec_stream *s, float *dx, float *dparams, const float *dh,
                           const float *x, const float *saved, const float *params, int T, int C,
                           bool accumulate);
  void (*attention_forward)(struct exec_stream *s, float *a, float *saved, const float *h,
                            const float *params, const struct kernels_attention_dims *d);
  void (*attention_backward_input)(struct exec_stream *s, float *dh, float *bwork, const float *da,
                                   const float *saved, const float *params,
                                   const struct kernels_attention_dims *d, bool accumulate);
  void (*attention_backward_weight)(struct exec_stream *s, float *dparams, const float *bwork,
                                    const float *da, const float *h, const float *saved,
                                    const struct kernels_attention_dims *d);
  void (*attention_backward)(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                             const float *da, const float *h, const float *saved,
                             const float *params, const struct kernels_attention_dims *d,
                             bool accumulate);
  void (*mlp_forward)(struct exec_stream *s, float *m, float *saved, const float *h,
                      const float *params, int T, int C, int F);
  void (*mlp_backward_input)(struct exec_stream *s, float *dh, float *bwork, const float *dm,
                             const float *saved, const float *params, int T, int C, int F,
                             bool accumulate);
  void (*mlp_backward_weight)(struct exec_stream *s, float *dparams, const float *bwork,
                              const float *dm, const float *h, const float *saved, int T, int C,
                              int F);
  void (*mlp_backward)(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                       const float *dm, const float *h, const float *saved, const float *params,
                       int T, int C, int F, bool accumulate);
  void (*router_forward)(struct exec_stream *s, int32_t *ids, float *weights, float *saved,
                         const float *h, const float *params, int T, int C, int E, int K);
  void (*router_backward_input)(struct exec_stream *s, float *dh, float *bwork,
                                const float *dweights, const int32_t *ids, const float *weights,
                                const float *saved, const float *params, int T, int C, int E, int K,
                                bool accumulate);
  void (*router_backward_weight)(struct exec_stream *s, float *dparams, const float *bwork,
                                 const float *h, int T, int C, int E);
  void (*router_backward)(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                          const float *dweights, const int32_t *ids, const float *weights,
                          const float *saved, const float *h, const float *params, int T, int C,
                          int E, int K, bool accumulate);
  void (*moe_dispatch_plan)(struct exec_stream *s, int32_t *send_counts, int32_t *route_row,
                            const int32_t *ids, int T, int K, int E, int n_ranks);
  void (*moe_dispatch_forward)(struct exec_stream *s, float *send, int32_t *send_expert,
                               const float *h, const int32_t *ids, const int32_t *route_row, int T,
                               int K, int C);
  void (*moe_dispatch_backward)(struct exec_stream *s, float *dh, const float *dsend,
                                const int32_t *route_row, int T, int K, int C, bool accumulate);
  void (*moe_combine_forward)(struct exec_stream *s, float *m, const float *y, const float *weights,
                              const int32_t *route_row, int T, int K, int C);
  void (*moe_combine_backward)(struct exec_stream *s, float *dy, float *dweights, const float *dm,
                               const float *y, const float *weights, const int32_t *route_row,
                               int T, int K, int C);
  void (*expert_ffn_forward)(struct exec_stream *s, float *out, float *saved, float *scratch,
                             const float *in, const int32_t *row_expert, int n_rows,
                             const float *params, int e_first, int e_count, int C, int F);
  void (*expert_ffn_backward_input)(struct exec_stream *s, float *din, float *bwork, float *scratch,
                                    const float *dout, const int32_t *row_expert, int n_rows,
                                    const float *saved, const float *params, int e_first,
                                    int e_count, int C, int F, bool accumulate);
  void (*expert_ffn_backward_weight)(struct exec_stream *s, float *dparams, const float *bwork,
                                     const int32_t *row_expert, int n_rows, const float *saved,
                                     int e_first, int e_count, int C, int F);
  void (*expert_ffn_backward)(struct exec_stream *s, float *din, float *dparams, float *bwork,
                              float *scratch, const float *dout, const int32_t *row_expert,
                              int n_rows, const float *saved, const float *params, int e_first,
                              int e_count, int C, int F, bool accumulate);
  /* *loss (device memory, one float): the mean loss (kernels_lm_head_loss_forward's value) */
  void (*lm_head_loss_forward)(struct exec_stream *s, float *loss, float *saved, const float *h,
                               const int32_t *targets, const float *params,
                               enum kernels_lm_head_layout layout, int T, int C, int V);
  void (*lm_head_loss_backward_input)(struct exec_stream *s, float *dh, float *bwork,
                                      const float *saved, const float *h, const int32_t *targets,
                                      const float *params, enum kernels_lm_head_layout layout,
                                      float dloss, int T, int C, int V, bool accumulate);
  void (*lm_head_loss_backward_weight)(struct exec_stream *s, float *dparams, const float *bwork,
                                       const float *saved, const float *h, const int32_t *targets,
                                       const float *params, enum kernels_lm_head_layout layout,
                                       float dloss, int T, int C, int V);
  void (*lm_head_loss_backward)(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                                const float *saved, const float *h, const int32_t *targets,
                                const float *params, enum kernels_lm_head_layout layout,
                                float dloss, int T, int C, int V, bool accumulate);
  void (*residual_add_forward)(struct exec_stream *s, float *x, const float *y, size_t n);
  void (*residual_add_backward)(struct exec_stream *s, float *dy, const float *dx, size_t n,
                                bool accumulate);
  void (*adamw_step)(struct exec_stream *s, float *params, const float *grads, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int step);
  /* Optional entries, after every required one (exec_backend_check counts those up to
   * here). Selective recomputation's rerun: lse and y from the saved q, k, v (into d->core
   * when set); a backend without it runs no selective recomputation (d->core is then never
   * set on its other attention entries either). */
  void (*attention_core_forward)(struct exec_stream *s, float *saved,
                                 const struct kernels_attention_dims *d);
  /* Tensor parallelism's vocabulary slice [lo, lo + n) (kernels_tp_* of kernels.h; exec/tp.c
   * runs the collectives between them): all five, or none, and a backend without them runs no
   * tensor parallelism. tp_head_combine writes the mean loss to *loss (device memory). */
  void (*tp_embedding_forward)(struct exec_stream *s, float *x, const int32_t *tokens,
                               const float *table, int T, int C, int lo, int n);
  void (*tp_embedding_backward)(struct exec_stream *s, float *dtable, const float *dx,
                                const int32_t *tokens, int T, int C, int lo, int n);
  void (*tp_head_stats)(struct exec_stream *s, float *stats, const float *h,
                        const int32_t *targets, const float *w,
                        enum kernels_lm_head_layout layout, int T, int C, int lo, int n);
  void (*tp_head_combine)(struct exec_stream *s, float *loss, float *saved, const float *gathered,
                          int tp, int T);
  void (*tp_head_backward)(struct exec_stream *s, float *dh, float *dw, const float *saved,
                           const float *h, const int32_t *targets, const float *w,
                           enum kernels_lm_head_layout layout, float dloss, int T, int C, int lo,
                           int n);
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

  /* Memory: zero-filled device buffers (NULL when out of memory), and synchronous copies to
   * and from host memory (complete when they return, after work already enqueued). */
  void *(*alloc)(struct exec_backend *b, size_t bytes);
  void (*release)(struct exec_backend *b, void *p);
  /* Optional: a buffer of plan tensor `tensor` (an index into the configured device's class
   * tensors), which a backend may place where its offline plan put the tensor (cuda: the
   * arena planner's offset); released with release (default: alloc). Unlike alloc's, its
   * contents are undefined: the executor zeroes what must start at zero, and zeroing every
   * block again costs a launch and the block's bytes of bandwidth per allocation. */
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
  bool (*send)(struct exec_comm *c, uint32_t peer_world_rank, const void *buf, size_t bytes,
               int tag, GError **err);
  bool (*recv)(struct exec_comm *c, uint32_t peer_world_rank, void *buf, size_t bytes, int tag,
               GError **err);
  /* Optional: a point-to-point group, issued together and completing together (CUDA:
   * ncclGroupStart, each part's ncclSend/ncclRecv, ncclGroupEnd; host: every part posted
   * nonblocking, then one wait that suspends the task once): returns when every part has met
   * its peer; false when any part failed (then none is in flight). Parts come in an order in
   * which, run one after another, mirrored groups on two ranks still meet (with each peer, the
   * lower rank sends first). Default: send and recv on the parts in that order. */
  bool (*p2p_group)(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                    GError **err);
  bool (*all_reduce_f32)(struct exec_comm *c, float *buf, size_t n, GError **err);
  /* in: size * n_per_rank floats (not modified), out: this rank's n_per_rank sums. */
  bool (*reduce_scatter_f32)(struct exec_comm *c, const float *in, float *out, size_t n_per_rank,
                             GError **err);
  /* out: size * bytes_per_rank; in may point at out + rank * bytes_per_rank (in place). */
  bool (*all_gather)(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                     GError **err);
  /* One int32 to and from every member (host memory). */
  bool (*all_to_all_i32)(struct exec_comm *c, const int32_t *in, int32_t *out, GError **err);
  /* Variable byte counts per member, in member order, packed. */
  bool (*all_to_all_v)(struct exec_comm *c, const void *in, const size_t *send_bytes, void *out,
                       const size_t *recv_bytes, GError **err);

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
 * entry); _by_name looks the backend up in exec_backends (input error: not built in). */
struct exec_backend *exec_backend_init(const struct exec_backend_ops *ops,
                                       const struct exec_backend_params *p, GError **err);
struct exec_backend *exec_backend_init_by_name(const char *name,
                                               const struct exec_backend_params *p, GError **err);
void exec_backend_free(struct exec_backend *b);
const char *exec_backend_name(const struct exec_backend *b);
void exec_backend_abort(struct exec_backend *b, int code);
uint32_t exec_backend_world_rank(struct exec_backend *b);
uint32_t exec_backend_world_size(struct exec_backend *b);
const char *exec_backend_comm_library(struct exec_backend *b);
double exec_backend_clock(struct exec_backend *b);
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
bool exec_comm_send(struct exec_backend *b, struct exec_comm *c, uint32_t peer_world_rank,
                    const void *buf, size_t bytes, int tag, GError **err);
bool exec_comm_recv(struct exec_backend *b, struct exec_comm *c, uint32_t peer_world_rank,
                    void *buf, size_t bytes, int tag, GError **err);
bool exec_comm_p2p_group(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err);
bool exec_comm_all_reduce_f32(struct exec_backend *b, struct exec_comm *c, float *buf, size_t n,
                              GError **err);
bool exec_comm_reduce_scatter_f32(struct exec_backend *b, struct exec_comm *c, const float *in,
                                  float *out, size_t n_per_rank, GError **err);
bool exec_comm_all_gather(struct exec_backend *b, struct exec_comm *c, const void *in, void *out,
                          size_t bytes_per_rank, GError **err);
bool exec_comm_all_to_all_i32(struct exec_backend *b, struct exec_comm *c, const int32_t *in,
                              int32_t *out, GError **err);
bool exec_comm_all_to_all_v(struct exec_backend *b, struct exec_comm *c, const void *in,
                            const size_t *send_bytes, void *out, const size_t *recv_bytes,
                            GError **err);
bool exec_world_all_reduce_f64(struct exec_backend *b, double *buf, size_t n,
                               enum exec_reduce_op op, GError **err);
bool exec_world_gather(struct exec_backend *b, const void *in, size_t bytes, void **out,
                       size_t **out_sizes, GError **err);
bool exec_world_broadcast(struct exec_backend *b, void *buf, size_t bytes, GError **err);

/* ---- running plans ----------------------------------------------------------------------- */

enum exec_fault { EXEC_FAULT_NONE, EXEC_FAULT_STALL };
/* Which communication a stall hits: the first instruction of the step of that kind (ANY:
 * the first communication of any kind, or the first instruction when there is none). */
enum exec_stall_kind {
  EXEC_STALL_ANY,
  EXEC_STALL_SEND,
  EXEC_STALL_RECV,
  EXEC_STALL_ALL_REDUCE,     /* DP gradient all-reduce */
  EXEC_STALL_REDUCE_SCATTER, /* ZeRO gradient reduce-scatter */
  EXEC_STALL_ALL_TO_ALL,     /* expert dispatch or combine */
  EXEC_STALL_ALL_GATHER,     /* ZeRO parameter gathers */
};

struct exec_options {
  const struct plan *plan;  /* the whole plan; this process runs device = world rank */
  const char *schedule;     /* family name for the report, "custom" if NULL */
  const char *program_file; /* "<schedule>_pp<R>_mbs<M>.json" for the report, or NULL */
  uint32_t warmup, iters;   /* steps run = warmup + iters; timings over the last iters */
  uint64_t seed;            /* initialisation and synthetic data */
  const char *data_path;    /* token file or byte file; NULL = synthetic */
  float lr, beta1, beta2, eps, weight_decay;
  double timeout_s;           /* watchdog: no progress for this long is an error */
  const char *checkpoint_dir; /* write checkpoints here every checkpoint_every steps */
  uint32_t checkpoint_every;
  uint32_t checkpoint_keep;   /* keep the last K step directories; 0 = all */
  const char *resume_dir;       /* resume from the latest checkpoint in this directory */
  /* What a resume may find changed: "lr,weight_decay,beta1,beta2,eps,data,schedule" (any
   * of them, comma-separated); NULL = nothing. Every other difference is refused. */
  const char *resume_allow_change;
  const char *out_dir;          /* run directory (rank 0 writes it); NULL = no report */
  bool charts; /* draw schedule.png/.svg and memory.png (gnuplot) of the measured step there */
  const char *dump_params_path; /* rank 0 writes every parameter here (float32, model order) */
  bool progress;                /* rank 0 prints a line per step ... */
  uint32_t log_every; /* ... every log_every-th of them (0 or 1: all; the first and the last
                         always), with the time left at the pace so far */
  /* Testing hook: EXEC_FAULT_STALL makes rank fault_rank's first instruction of kind
   * fault_kind in step fault_step (1-based) block until cancelled, as a transfer whose peer
   * never comes would (a receive nothing matches, on a communicator of its own). */
  enum exec_fault fault;
  enum exec_stall_kind fault_kind;
  uint32_t fault_rank, fault_step;
  /* Testing hook: fill every fresh activation buffer with NaN, so a kernel that reads what it
   * did not write shows up as a NaN loss (piper-exec: PIPER_EXEC_POISON=1). */
  bool poison;
  /* Called at the start of every step (rank, 1-based step), e.g. to inject a crash; step 0:
   * at start-up, before the communicators are created. */
  void (*step_hook)(uint32_t rank, uint32_t step, void *data);
  void *step_hook_data;
  /* Nonzero (a signal handler sets it) asks the run to stop at the next step boundary: the
   * ranks agree on it in the step's loss exchange, so all stop after the same step, and the
   * run directory holds the steps done. NULL: never. */
  const volatile sig_atomic_t *stop;
};

struct exec_options exec_options_default(void);

struct exec_result {
  uint32_t n_steps;            /* steps run by this call (after a resume: the rest) */
  uint32_t first_step;         /* 1-based number of the first step run */
  double *losses;              /* [n_steps]: mean loss over the global batch */
  double *step_times;          /* [n_steps]: first start to last end over all ranks, seconds */
  double tokens_per_step;      /* global batch tokens */
  double wall_seconds;         /* measured steps, as this rank's loop saw them (setup and
                                  the loss exchange included) */
  uint64_t instructions;       /* instructions this rank ran */
  double kernel_seconds;       /* time inside kernels (this rank, all steps) */
  double comm_seconds;         /* time inside communication calls */
  double task_seconds;         /* time inside instruction bodies */
  double overhead_per_instr_s; /* executor latency per instruction (see the README) */
  double dispatch_per_instr_s; /* the part of it before the instruction started */
  double job_overhead_per_instr_s, job_dispatch_per_instr_s; /* the same over all ranks */
  /* a backend that runs its own loop (host): what one test of posted communication costs,
   * and how many it made per instruction (this rank, measured steps); 0 otherwise */
  double comm_test_s, comm_tests_per_instr;
  uint64_t peak_memory_bytes;
  char *run_dir;   /* the report directory written (rank 0), or NULL */
  char *run_files; /* the files written there, space-separated (rank 0), or NULL */
  /* After a failure: every rank failed at the same agreed point (the job can end without an
   * abort), and whether another rank prints the error (this one need not). */
  bool error_everywhere, error_printed_elsewhere;
  bool stopped; /* exec_options.stop ended the run early, after n_steps steps */
};

bool exec_run(const struct exec_options *o, struct exec_backend *b, struct exec_result *r,
              GError **err);
void exec_result_clear(struct exec_result *r);

/* ---- the process watchdog (exec/watchdog.c) ----------------------------------------------
 * One per process, for its whole life: start-up (MPI initialisation, the start-up barrier),
 * communicator creation, the steps, teardown and finalisation. A thread that reads only a
 * progress counter and the current phase's name: when neither changes for timeout_s it prints
 * one line, "PROGRAM: error: rank R: watchdog: no progress for S s in PHASE", and ends the job
 * with the abort function (exit status 1), else _exit(1). In phases marked self_checked
 * (exec_run's steps, which report a stall themselves, naming the instruction) it waits
 * another timeout_s + 1 s and is the backstop. Without exec_watchdog_start every call below
 * does nothing (a library user, the tests). */
void exec_watchdog_start(const char *program, double timeout_s);
void exec_watchdog_stop(void);
void exec_watchdog_set_rank(uint32_t rank);
void exec_watchdog_set_abort(void (*fn)(void *data, int code), void *data);
void exec_watchdog_phase(const char *phase, bool self_checked);
void exec_watchdog_progress(void);
/* True for the first caller only: the one that reports a stall (the other stays silent). */
bool exec_watchdog_claim(void);
bool exec_watchdog_running(void);

/* ---- pieces with their own tests --------------------------------------------------------- */

/* Training data: a token file (llm.c layout: 256 int32 header, magic 20240520, version 1,
 * token count, then uint16 tokens), any other file as bytes (vocab 256), or, with path NULL, a
 * deterministic synthetic stream with learnable structure. */
#define EXEC_DATA_MAGIC 20240520
struct exec_data;
struct exec_data *exec_data_open(const char *path, int64_t vocab, uint64_t seed, GError **err);
void exec_data_free(struct exec_data *d);
uint64_t exec_data_tokens(const struct exec_data *d);
const char *exec_data_kind(const struct exec_data *d); /* "tokens", "bytes", "synthetic" */
/* Fills tokens and targets ([batch * seq] each) of sequence block `index`: batch consecutive
 * sequences of seq + 1 tokens (targets are the inputs shifted by one). */
void exec_data_batch(const struct exec_data *d, uint64_t index, int batch, int seq, int32_t *tokens,
                     int32_t *targets);

/* Deterministic initial value of element `index` of model op `op`'s parameters: independent of
 * the plan, so every plan of a model starts from the same weights. */
float exec_init_param(const struct model *m, uint64_t seed, uint32_t op, uint64_t index);

#endif
