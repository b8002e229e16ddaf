/* exec: the executor (SPEC §7). Runs the per-device plans for real, one process per device:
 * every instruction of this device's plan on its logical stream, cross-stream waits through
 * events, communication on communicators split per purpose, and training (forward, backward
 * with BI/BW where the plan splits it, gradient sync, AdamW) through a backend.
 *
 *   struct exec_options o = exec_options_default();
 *   o.plan = plan; o.iters = 10;                       // plan from compile_run or plan_read_dir
 *   struct exec_backend *b = exec_backend_host.create(&(struct exec_backend_params){0}, &err);
 *   struct exec_result r = {0};
 *   if (!exec_run(&o, &exec_backend_host, b, &r, &err)) ...;   // r.losses[i], run directory
 *   exec_result_clear(&r); exec_backend_host.destroy(b);
 *
 * Backends implement one small table (struct exec_backend_ops, after ggml's backend interface):
 * memory, streams, events, communicators and the kernel table. The runner (exec/runner.c)
 * knows nothing of threads, MPI or CUDA; `host` (CPU threads + MPI) is always built, others
 * register in exec_backends[] where their build flag is set.
 */
#ifndef PIPER_EXEC_EXEC_H
#define PIPER_EXEC_EXEC_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../ir/plan.h"
#include "../kernels/kernels.h"
#include "../report/report.h"

/* ---- backend interface ------------------------------------------------------------------- */

struct exec_backend; /* one instance per process (opaque, owned by its ops) */
struct exec_stream;  /* an in-order queue of work */
struct exec_event;   /* marks a point in a stream's queue */
struct exec_comm;    /* a communicator: a set of world ranks, rank = position */

/* Work run in stream order. Returns false with *err set to fail the stream (the runner then
 * reports the error). For the host backend the call runs on the stream's worker thread. */
typedef bool (*exec_task_fn)(void *arg, GError **err);

struct exec_backend_params {
  int *argc; /* for MPI_Init_thread; may be NULL */
  char ***argv;
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

/* Kernel table: the entry points of kernels.h (same signatures), plus the few memory helpers
 * the runner needs, so a device backend can supply its own. */
struct exec_kernels {
  void (*fill)(float *x, float value, size_t n);
  void (*copy)(void *dst, const void *src, size_t bytes);
  void (*add)(float *y, const float *x, size_t n); /* y += x */
  __typeof__(kernels_embedding_forward) *embedding_forward;
  __typeof__(kernels_embedding_backward_weight) *embedding_backward_weight;
  __typeof__(kernels_embedding_backward) *embedding_backward;
  __typeof__(kernels_rmsnorm_forward) *rmsnorm_forward;
  __typeof__(kernels_rmsnorm_backward_input) *rmsnorm_backward_input;
  __typeof__(kernels_rmsnorm_backward_weight) *rmsnorm_backward_weight;
  __typeof__(kernels_rmsnorm_backward) *rmsnorm_backward;
  __typeof__(kernels_attention_forward) *attention_forward;
  __typeof__(kernels_attention_backward_input) *attention_backward_input;
  __typeof__(kernels_attention_backward_weight) *attention_backward_weight;
  __typeof__(kernels_attention_backward) *attention_backward;
  __typeof__(kernels_mlp_forward) *mlp_forward;
  __typeof__(kernels_mlp_backward_input) *mlp_backward_input;
  __typeof__(kernels_mlp_backward_weight) *mlp_backward_weight;
  __typeof__(kernels_mlp_backward) *mlp_backward;
  __typeof__(kernels_router_forward) *router_forward;
  __typeof__(kernels_router_backward_input) *router_backward_input;
  __typeof__(kernels_router_backward_weight) *router_backward_weight;
  __typeof__(kernels_router_backward) *router_backward;
  __typeof__(kernels_moe_dispatch_plan) *moe_dispatch_plan;
  __typeof__(kernels_moe_dispatch_forward) *moe_dispatch_forward;
  __typeof__(kernels_moe_dispatch_backward) *moe_dispatch_backward;
  __typeof__(kernels_moe_combine_forward) *moe_combine_forward;
  __typeof__(kernels_moe_combine_backward) *moe_combine_backward;
  __typeof__(kernels_expert_ffn_forward) *expert_ffn_forward;
  __typeof__(kernels_expert_ffn_backward_input) *expert_ffn_backward_input;
  __typeof__(kernels_expert_ffn_backward_weight) *expert_ffn_backward_weight;
  __typeof__(kernels_expert_ffn_backward) *expert_ffn_backward;
  __typeof__(kernels_lm_head_loss_forward) *lm_head_loss_forward;
  __typeof__(kernels_lm_head_loss_backward_input) *lm_head_loss_backward_input;
  __typeof__(kernels_lm_head_loss_backward_weight) *lm_head_loss_backward_weight;
  __typeof__(kernels_lm_head_loss_backward) *lm_head_loss_backward;
  __typeof__(kernels_residual_add_forward) *residual_add_forward;
  __typeof__(kernels_residual_add_backward) *residual_add_backward;
  __typeof__(kernels_adamw_step) *adamw_step;
};

struct exec_backend_ops {
  const char *name;        /* "host", "cuda" */
  const char *description; /* one line for --list-backends */

  /* Lifecycle. create starts the process group (MPI for host) when there is one. abort ends
   * every process of the job now (used after an unrecoverable error: peers may be blocked). */
  struct exec_backend *(*create)(const struct exec_backend_params *p, GError **err);
  void (*destroy)(struct exec_backend *b);
  void (*abort)(struct exec_backend *b, int code);
  uint32_t (*world_rank)(struct exec_backend *b);
  uint32_t (*world_size)(struct exec_backend *b);
  const char *(*comm_library)(struct exec_backend *b); /* "MPI (Open MPI 4.1.4)", "none" */
  /* Seconds on a clock all ranks share (offsets aligned at create). */
  double (*clock)(struct exec_backend *b);

  /* Memory: zero-filled device buffers, and copies to and from host memory. */
  void *(*alloc)(struct exec_backend *b, size_t bytes);
  void (*release)(struct exec_backend *b, void *p);
  void (*to_host)(struct exec_backend *b, void *dst, const void *src, size_t bytes);
  void (*from_host)(struct exec_backend *b, void *dst, const void *src, size_t bytes);

  /* Streams and events (CUDA semantics): work submitted to a stream runs in order;
   * event_record marks the stream's current end, stream_wait_event makes later work on a
   * stream wait for the event's latest record; event_synchronize waits on the host, up to
   * timeout_s (false on timeout). Submission is from one host thread. */
  struct exec_stream *(*stream_create)(struct exec_backend *b, const char *name, int priority,
                                       GError **err);
  void (*stream_destroy)(struct exec_stream *s);
  void (*stream_submit)(struct exec_stream *s, exec_task_fn fn, void *arg, uint32_t task_id);
  void (*stream_status)(struct exec_stream *s, struct exec_stream_status *out);
  /* First error of a failed stream (owned by the stream), or NULL. */
  const GError *(*stream_error)(struct exec_stream *s);
  struct exec_event *(*event_create)(struct exec_backend *b);
  void (*event_destroy)(struct exec_event *e);
  void (*event_record)(struct exec_event *e, struct exec_stream *s);
  void (*stream_wait_event)(struct exec_stream *s, struct exec_event *e);
  bool (*event_synchronize)(struct exec_event *e, double timeout_s);
  /* Count of work items finished so far (the watchdog's progress signal). */
  uint64_t (*progress)(struct exec_backend *b);
  /* Makes every blocked or queued item fail soon ("cancelled"), so streams can be joined;
   * reset clears it before another run (when no stream is busy). */
  void (*cancel)(struct exec_backend *b);
  void (*reset)(struct exec_backend *b);

  /* Communicators. comm_create is collective over the whole job: every rank calls it for the
   * same (key, members) lists in the same order, members or not; it returns NULL to non-members
   * (err unset). purpose is only a label. Operations are called from tasks and block the
   * stream until done; counts are elements, byte counts bytes. */
  struct exec_comm *(*comm_create)(struct exec_backend *b, const char *label,
                                   const uint32_t *members, uint32_t n_members, bool point_to_point,
                                   GError **err);
  void (*comm_destroy)(struct exec_comm *c);
  bool (*send)(struct exec_comm *c, uint32_t peer_world_rank, const void *buf, size_t bytes,
               int tag, GError **err);
  bool (*recv)(struct exec_comm *c, uint32_t peer_world_rank, void *buf, size_t bytes, int tag,
               GError **err);
  bool (*all_reduce_f32)(struct exec_comm *c, float *buf, size_t n, GError **err);
  /* in: size * n_per_rank floats (not modified), out: this rank's n_per_rank sums. */
  bool (*reduce_scatter_f32)(struct exec_comm *c, const float *in, float *out, size_t n_per_rank,
                             GError **err);
  /* out: size * bytes_per_rank; in may point at out + rank * bytes_per_rank (in place). */
  bool (*all_gather)(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                     GError **err);
  /* One int32 to and from every member. */
  bool (*all_to_all_i32)(struct exec_comm *c, const int32_t *in, int32_t *out, GError **err);
  /* Variable byte counts per member, in member order, packed. */
  bool (*all_to_all_v)(struct exec_comm *c, const void *in, const size_t *send_bytes, void *out,
                       const size_t *recv_bytes, GError **err);

  /* Job-wide operations outside the plan (loss, timings, report), called from tasks. */
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
/* Built-in backends, NULL-terminated. */
extern const struct exec_backend_ops *const exec_backends[];
const struct exec_backend_ops *exec_backend_find(const char *name);

/* ---- running plans ----------------------------------------------------------------------- */

enum exec_fault { EXEC_FAULT_NONE, EXEC_FAULT_STALL };

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
  const char *resume_dir;       /* resume from the latest checkpoint in this directory */
  const char *out_dir;          /* run directory (rank 0 writes it); NULL = no report */
  const char *dump_params_path; /* rank 0 writes every parameter here (float32, model order) */
  bool progress;                /* rank 0 prints a line per step */
  /* Testing hook: EXEC_FAULT_STALL makes rank fault_rank's first communication instruction of
   * step fault_step (1-based) block until cancelled, as a broken plan would. */
  enum exec_fault fault;
  uint32_t fault_rank, fault_step;
  /* Called at the start of every step (rank, 1-based step), e.g. to inject a crash. */
  void (*step_hook)(uint32_t rank, uint32_t step, void *data);
  void *step_hook_data;
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
  uint64_t peak_memory_bytes;
  char *run_dir; /* the report directory written (rank 0), or NULL */
};

bool exec_run(const struct exec_options *o, const struct exec_backend_ops *ops,
              struct exec_backend *b, struct exec_result *r, GError **err);
void exec_result_clear(struct exec_result *r);

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
