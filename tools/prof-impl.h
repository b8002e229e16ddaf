/* prof-impl: what piper-prof's host profiler (tools/piper-prof.c) and its CUDA part
 * (tools/prof_cuda.c, built with the cuda backend) share: the run's figures, one op's buffers
 * at one shape, the table's entries and the network's fits, written as one profile format. */
#ifndef PIPER_TOOLS_PROF_IMPL_H
#define PIPER_TOOLS_PROF_IMPL_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/ir.h"
#include "../kernels/kernels.h"
#include "../models/model.h"

struct prof_args {
  const char *model, *backend, *out;
  uint32_t repeats, warmup;
  bool quick, quiet;
};

/* What the run found, gathered on rank 0 into the profile. */
struct prof_run {
  const struct prof_args *a;
  int rank, size;
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
  /* the host: cores of this node, the executor's own costs (host_measure) */
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
 * (exec/train.c: exec_state_init_params and mb_buffer; exec/backend_cuda_arena.c plans the
 * arena's slots at 4 bytes per element); the cuda backend adds a bf16 copy of each GEMM
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

void prof_progress(const struct prof_run *r, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
double prof_round_sig(double x, int digits);
float *prof_random_floats(size_t n, uint32_t seed, float scale);
int32_t *prof_random_ids(size_t n, int32_t range);
/* Least squares of y = alpha + beta x, residuals relative to y. */
void prof_fit_line(const double *x, const double *y, int n, double *alpha, double *beta);
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
/* Appends a "measured" entry (seconds as "ms"); returns it for optional keys. */
cJSON *prof_add_entry(struct prof_run *r, const struct model_op *op, enum ir_pass pass,
                      double seconds);
/* Sets an entry's "host_ms": the host thread's time to enqueue the op (GPU profiles). */
void prof_entry_host_ms(cJSON *entry, double seconds);
/* Median seconds per instruction (a no-op task and an event record) through backend b. */
struct exec_backend;
double prof_instruction_cost(struct exec_backend *b, uint32_t n, GError **err);

/* The network: points per operation, fitted into r's "collectives" (rank 0). */
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
void prof_net_record(struct prof_run *r, const struct net_points *pts);
/* Ranks other than 0 wait here, without a core, until rank 0 has written the profile. */
void prof_idle_until_released(void);

#ifdef HAVE_CUDA
/* tools/prof_cuda.c: the cuda backend's kernels, AdamW and, under mpirun, NCCL, into r. */
bool prof_cuda_measure(struct prof_run *r, GPtrArray *models, GError **err);
#endif

#endif
