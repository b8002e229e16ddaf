/* prof-impl: what the profiler's sources share: the run's figures, one op's buffers at one
 * shape, the table's entries and the network's fits, written as one profile format. Each file
 * calls only files below it in this list (nothing calls up, so no two call each other):
 *
 *  run.c           prof_run, the backends' table (host; cuda.c's) -> every file below
 *  cuda.c          the GPU, compiled with HAVE_CUDA only         -> net.c, ops.c, core.c
 *  host.c          the host's cores and the executor's own costs -> net.c, core.c
 *  chain.c         the host kernels in the executor's order      -> host_kernels.c, ops.c, core.c
 *  host_kernels.c  one op through the host kernels               -> ops.c, core.c
 *  machine.c       the host's GEMM rate, bandwidth and AdamW     -> core.c
 *  output.c        the profile's JSON                            -> core.c
 *  net.c           the network under mpirun, and its fits        -> core.c
 *  ops.c           the ops' shapes, buffers' sizes, the entries  -> core.c
 *  core.c          progress, medians, inputs, line fits, a backend's cost per instruction
 *
 * The cuda part is one row of run.c's table of backends (prof_cuda_measure, declared below
 * with HAVE_CUDA only): the core knows nothing of it. */
#ifndef PIPER_PROF_PROF_IMPL_H
#define PIPER_PROF_PROF_IMPL_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "../ir/ir.h"
#include "../kernels/kernels.h"
#include "../models/model.h"
#include "prof.h"

/* What the run found, gathered on rank 0 into the profile. */
struct prof_run {
  const struct prof_args *a;
  int rank, size;
#ifdef HAVE_MPI
  /* The job's communicator (a duplicate of the world, under a launcher), every MPI call of
   * the profiler is on it. Its error handler is MPI_ERRORS_ARE_FATAL, set on purpose: a
   * failed call ends the job with MPI's own line naming the call and the communicator (what
   * a profiler that cannot measure should do), so no call's result goes unseen. */
  MPI_Comm comm;
#endif
  cJSON *measured;  /* the table's entries */
  GHashTable *seen; /* "kind shape" keys already measured */
  uint32_t n_entries, n_skipped;
  double gemm_flops, triad_bytes; /* per second */
  double adamw_overhead, adamw_per_param;
  GArray *opt_params, *opt_seconds; /* AdamW per segment in the executor's order (chains) */
  bool optimizer_from_chain;
  cJSON *fits;     /* sources: per operation, its measured points */
  cJSON *fit_json; /* the profile's "collectives" section (intra_node) */
  double p2p_latency, p2p_bandwidth, ar_bandwidth;
  bool network_measured;
  /* the host: cores of this node, the executor's own costs (prof_measure_host) */
  uint32_t cores;
  double instruction_overhead, comm_test, wait_share, wait_self_share, wake_latency, loop_late;
  double eager_bytes; /* the largest message a send completes without its receiver */
  double wait_pinned_slowdown; /* a computing rank's, with a waiter pinned on its core */
  bool comm_measured; /* comm_test and wait_share: 2 ranks or more */
  bool failed;        /* a measurement failed: err says which */
  /* the GPU (--backend cuda): gemm_flops is then its fp32 GEMM rate, triad_bytes its device
   * copy bandwidth */
  char gpu_name[256];
  double gpu_memory_gib, gemm_flops_bf16;
  double weight_copy_bytes_per_param; /* bf16 models' weight copies, once a step (0: none) */
  double compute_copy_bytes_per_param; /* held: their bytes per GEMM weight parameter */
  uint32_t gpu_sms;
};

/* How piper-exec holds memory whatever the model's dtype (the profile's "memory" section,
 * struct profile_memory): facts of its code, not measurements. Both backends keep the plan's
 * tensors, the parameters (the fp32 master copy), their gradients and AdamW's m and v in fp32
 * (exec/params.c: exec_state_init_params; exec/memory.c: exec_mb_buffer; exec/backend_cuda_arena.c plans the
 * arena's slots at exec_gpu_act_dtype's width, 4 bytes per element today); the cuda backend adds a bf16 copy of each GEMM
 * weight matrix of a bf16 model (exec/backend_cuda_kernels.c: weight_copy). */
#define PROF_HELD_ELEMENT_BYTES 4   /* fp32 */
#define PROF_HELD_OPTIMIZER_BYTES 8 /* AdamW's m and v, fp32 */
#define PROF_CUDA_COMPUTE_COPY_BYTES 2 /* bf16 */

/* Buffers of one op at one shape, every pass's operands (sizes from the kernels' own counts).
 * The fields are named after the executor's: in0 (h or x), in1 (routing), out, dout, din,
 * params and their gradient, saved and bwork; the MoE path's dispatch state. */
struct op_bench {
  const struct model *m;
  const struct model_op *op;
  enum ir_pass pass;
  int T, C, F, V, E, K;
  int ep; /* expert_ffn: 0 the one-device op (dispatch, experts, combine); d > 1 the experts
           * alone on one device of a d-way expert-parallel group (its shape's PROFILE_EP_DIM) */
  struct kernels_attention_dims dd;
  float *params, *dparams, *in0, *out, *dout, *din, *saved, *bwork, *saved2;
  int32_t *tokens, *ids, *route_row, *row_expert, counts[1];
  float *weights, *dweights, *rows, *y, *dy, *drows, *scratch;
};

/* The sizes of each buffer, in floats, by kind (0: not used). */
struct op_sizes {
  size_t params, in, out, saved, bwork, rows, scratch;
};

/* ---- core.c: what every part uses ---------------------------------------------------------- */

void prof_progress(const struct prof_run *r, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
double prof_round_sig(double x, int digits);
double prof_physical_memory_bytes(void);
float *prof_random_floats(size_t n, uint32_t seed, float scale);
int32_t *prof_random_ids(size_t n, int32_t range);
/* Least squares of y = alpha + beta x, residuals relative to y. */
void prof_fit_line(const double *x, const double *y, int n, double *alpha, double *beta);
/* The median of v[0 .. n) (n > 0), which it sorts. */
double prof_median(double *v, size_t n);
typedef void (*prof_bench_fn)(void *ctx);
/* Median seconds of one call of fn after a's warm-up; before, when not NULL, runs untimed
 * ahead of each timed call. */
double prof_median_seconds_after(const struct prof_args *a, prof_bench_fn fn, void *ctx,
                                 prof_bench_fn before);
double prof_median_seconds(const struct prof_args *a, prof_bench_fn fn, void *ctx);
/* Median seconds per instruction (a no-op task and an event record) through backend b;
 * negative (err set) when its stream cannot be made. */
struct exec_backend;
double prof_instruction_cost(struct exec_backend *b, uint32_t n, GError **err);

/* ---- ops.c: the models' ops, their buffers' sizes and the table's entries ------------------ */

/* The op's dimensions from its shape, and its buffers' sizes in floats. */
void prof_op_bench_dims(struct op_bench *b);
struct op_sizes prof_op_sizes(struct op_bench *b);
/* The expert-parallel variants of a model's expert ops (struct model_op with PROFILE_EP_DIM
 * set), each distinct shape once: one per degree d > 1 that divides the experts, the degrees a
 * plan can shard them to. The caller frees the array. */
GArray *prof_ep_variants(const struct model *m);
/* Bytes of every buffer of one op's benchmark (an upper bound, 4-byte elements). */
double prof_op_bench_bytes(const struct model *m, const struct model_op *op);
bool prof_op_has_kernel(enum model_op_kind k);
/* Whether the executor runs anything for (kind, pass). */
bool prof_pass_runs(enum model_op_kind k, enum ir_pass pass);
/* "kind shape...": a (kind, shape) class is measured once per run (prof_run.seen). */
char *prof_op_shape_key(const struct model_op *op);
/* Appends a "measured" entry (seconds as "ms"); returns it for optional keys. */
cJSON *prof_add_entry(struct prof_run *r, const struct model_op *op, enum ir_pass pass,
                      double seconds);
/* Sets an entry's "host_ms": the host thread's time to enqueue the op (GPU profiles). */
void prof_entry_host_ms(cJSON *entry, double seconds);
/* One progress line of an op's four passes (t: seconds of F, BI, BW, B). */
void prof_progress_op(const struct prof_run *r, const struct model_op *op, const double *t);

/* ---- host_kernels.c: one op through the host kernels, as the segment forward and backward (exec/segment_*.c) call them ----------- */

/* Host buffers of the op at its shape (random inputs and weights), freed by prof_op_bench_free. */
void prof_op_bench_init(struct op_bench *b, const struct model *m, const struct model_op *op);
void prof_op_bench_free(struct op_bench *b);
/* Runs b's pass (ctx: struct op_bench): a prof_bench_fn. */
void prof_op_bench_run(void *ctx);
/* Every distinct (kind, shape) of a model too big to chain, and of its expert-parallel
 * variants, once, each kernel timed alone. */
void prof_host_measure_model(struct prof_run *r, const struct model *m);

/* ---- chain.c: the host kernels in the executor's order ------------------------------------- */

/* The models that fit (chained[i] says which) run as the executor runs them, in turns. */
void prof_measure_chains(struct prof_run *r, const GPtrArray *models, bool *chained);
/* AdamW as the chains ran it, where they give two sizes or more, replaces the machine's fit. */
void prof_fit_chain_optimizer(struct prof_run *r);

/* ---- machine.c: the host's GEMM rate, memory bandwidth and AdamW (the roofline) ------------ */

void prof_measure_machine(struct prof_run *r, uint64_t max_params);

/* ---- net.c: the network under mpirun, and its fits ---------------------------------------- */

enum net_kind {
  NET_P2P,
  NET_ALL_REDUCE,
  NET_REDUCE_SCATTER,
  NET_ALL_GATHER,
  NET_ALL_TO_ALL,
  NET_N
};
extern const char *const prof_net_names[NET_N];
/* Measured points of one operation: (group size, bytes, seconds). */
struct net_points {
  GArray *p, *n, *t; /* double */
};
/* Fits each operation's points into r's "collectives" and their sources (rank 0). */
void prof_net_record(struct prof_run *r, const struct net_points *pts);
#ifdef HAVE_MPI
/* Every operation over every group size of the world through MPI (every rank). */
void prof_measure_network(struct prof_run *r);
/* A barrier of the world whose ranks wait without a core (they poll every millisecond). */
void prof_sleeping_barrier(const struct prof_run *r);
/* Ranks other than 0 wait here, without a core, until rank 0 has written the profile. */
void prof_idle_until_released(const struct prof_run *r);
/* Rank 0: lets the others go (prof_idle_until_released). */
void prof_release_others(const struct prof_run *r);
#endif

/* ---- host.c: the host's cores and the executor's own costs --------------------------------- */

/* Every rank takes part (the backend starts with a barrier); rank 0 keeps the figures. */
bool prof_measure_host(struct prof_run *r, GError **err);

/* ---- output.c: the profile --------------------------------------------------------------- */

/* Checks the profile as piper-sim will read it, then writes it to r->a->out. */
bool prof_write_profile(const struct prof_run *r, int argc, char **argv, GError **err);

/* ---- run.c's table: the backends measured through ------------------------------------------ */

/* One backend: measure runs on every rank, fills r (rank 0 keeps the figures) and returns
 * whether this rank writes the profile; a failed measurement sets r->failed and err. */
struct prof_backend {
  const char *name;
  bool (*measure)(struct prof_run *r, GPtrArray *models, GError **err);
};

#ifdef HAVE_CUDA
/* cuda.c, built with the cuda backend only: the GPU's kernels, AdamW and, under mpirun, NCCL,
 * into r; the other ranks then wait for rank 0 (prof_idle_until_released). */
bool prof_cuda_measure(struct prof_run *r, GPtrArray *models, GError **err);
#endif

#endif
