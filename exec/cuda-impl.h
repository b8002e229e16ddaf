/* cuda-impl: the cuda backend's private state (its struct exec_backend's context), shared by
 * its lifecycle, memory, streams and events (backend_cuda.c), its communication
 * (backend_cuda_comm.c) and its kernel table (backend_cuda_kernels.c). Built only with
 * HAVE_CUDA. The host thread only enqueues: a task runs when it is submitted, its kernels and
 * NCCL calls go to the stream's CUDA stream, and nothing waits for the GPU except a copy to
 * host memory (a value the CPU needs: the loss, MoE routing counts). */
#ifndef PIPER_EXEC_CUDA_IMPL_H
#define PIPER_EXEC_CUDA_IMPL_H
#ifdef HAVE_CUDA /* empty without it: the CUDA headers are not there */

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "arena.h"
#include "backend.h"
#include "gpu_layout.h"
#include "gpu_weights.h"

/* Device memory a stream's GEMMs reuse in turn: the bf16 copies of their operands
 * (backend_cuda_kernels.c), grown on first need (the warm-up step), outside the arena. */
struct cuda_scratch {
  void *p;
  size_t bytes;
};

struct cuda_context {
  struct exec_backend *backend;    /* the instance this is the context of */
  uint32_t rank, size;             /* world */
  uint32_t local_rank, local_size; /* on this host */
  int device, n_sms;
  char device_name[256];
  bool mpi, finalize_mpi;
  bool shared_gpu;      /* ranks share this GPU: host-staged MPI instead of NCCL */
  MPI_Comm job;         /* the job's ranks (a duplicate of MPI_COMM_WORLD, the backend's own) */
  MPI_Comm node;        /* the ranks of this host */
  GArray *staged_sends; /* host-staged sends in flight (backend_cuda_comm.c) */
  cudaStream_t p2p_side; /* where groups in flight run (exec_cuda_p2p_start), made on first use */
  double epoch;
  /* the backend's clock at epoch_event: 0 on rank 0; on a rank of rank 0's machine, which
   * takes rank 0's origin, when its own event completed on it */
  double epoch_event_at;
  const struct plan *plan; /* from configure (not owned) */
  uint32_t plan_device;
  bool bf16_gemm; /* GEMMs take bf16 copies of their fp32 operands, fp32 out and accumulation */
  /* The dtype the kernels hold activations in (what every activation buffer the runner hands
   * a kernel entry holds): exec_gpu_act_dtype's (gpu_layout.h), MODEL_DTYPE_FP32 for every
   * model today, bf16 only as GEMM operands and the MLP's own intermediates. A kernel that
   * wants bf16 operands (a library attention) converts around its call while it is fp32. The
   * arena's slots are planned at its width (exec_cuda_arena_plan). */
  enum model_dtype act_dtype;
  /* piper.fp8: the linear layers' GEMMs in e4m3 under this recipe (backend_cuda_fp8.c), and
   * how many ran so or fell back to bf16 (the end of the run prints both) */
  enum model_fp8 fp8;
  uint64_t fp8_gemms, fp8_declined;
  enum exec_gpu_attention attention; /* PIPER_CUDA_ATTENTION (gpu_layout.h) */
  /* cuDNN's attention (cuda_cudnn.h), made on its first use; cudnn_off once it could not be
   * made or refused a graph in auto mode (the own kernels run from then on) */
  struct exec_cudnn_sdpa *cudnn;
  bool cudnn_off;
  /* bf16 GEMMs: one bf16 copy per weight matrix of the optimizer's store, made by its first
   * GEMM after each write (backend_cuda_kernels.c), in first-fit blocks of the arena */
  struct exec_wcache wcache;
  size_t wcache_bytes;
  struct cuda_scratch setup_bf16; /* the setup stream's (work outside tasks) */
  cublasLtHandle_t lt;
  void *lt_workspace;
  size_t lt_workspace_bytes;
  GHashTable *gemm_algos; /* GEMM key -> cublasLtMatmulHeuristicResult_t (kernels) */
  /* memory: one device allocation, carved first fit at run time */
  GMutex mem_lock;
  char *arena;
  size_t arena_bytes, arena_high;
  GArray *blocks;   /* struct cuda_block, live, by offset (at or above dyn_base) */
  /* plan tensors carved at the arena planner's offsets, in [0, dyn_base) (backend_cuda_arena.c);
   * everything else (parameters, workspaces, what the carver refuses) first fit above */
  bool carving;
  size_t dyn_base;
  /* the host thread's time inside instructions' tasks and, of it, carving (the report) */
  double host_task_s, host_carve_s;
  uint64_t host_tasks;
  struct exec_arena plan_arena;
  struct exec_arena_carver carver;
  struct plan_tensor *arena_tensors; /* the class's tensors at the bytes the executor holds */
  GHashTable *carved;                /* block pointer -> its tensor + 1 */
  uint32_t *wait_stamp;              /* [n_instrs]: instructions already waited for */
  uint32_t wait_gen;
  GArray *deferred; /* struct cuda_deferred: released, reusable once their events complete */
  /* work outside any task (the runner's step setup) runs on this stream; every stream waits
   * for its latest record before its next work */
  cudaStream_t setup;
  struct exec_stream *setup_stream; /* setup as a stream: kernels outside any task run on it */
  cudaEvent_t setup_done;
  uint64_t setup_gen;
  GPtrArray *streams;
  GArray *task_ends; /* cudaEvent_t of submitted tasks, oldest first: progress */
  /* per-instruction GPU times: timing events around each task's work, indexed by task id,
   * measured from epoch_event (recorded when the backend's clock read 0) */
  GArray *t_start, *t_end; /* cudaEvent_t */
  cudaEvent_t epoch_event;
  GPtrArray *free_events;
  uint64_t progress;
  bool cancelled;
};

struct exec_stream {
  struct cuda_context *b;
  char name[64];
  int priority;
  int plan_stream; /* index in plan->streams, -1 for the control stream */
  cudaStream_t cs;
  void *green;        /* CUgreenCtx the stream lives in (sm_share < 1), or NULL */
  void *lt_workspace; /* cuBLASLt's, this stream's own (lt_workspace_bytes) */
  struct cuda_scratch bf16;
  bool fp8; /* inside a linear layer's op of an FP8 model: its GEMMs run in e4m3 */
  uint64_t setup_seen;
  bool failed;
  double since;
  GError *error;
  uint32_t task_id;
};

struct exec_event {
  struct cuda_context *b;
  cudaEvent_t ev;
};

/* The stream the running task's work goes to (set while a task runs), else NULL. */
extern _Thread_local struct exec_stream *exec_cuda_current;

/* cudaStream_t for s (NULL: the setup stream), after making it wait for the latest setup. */
cudaStream_t exec_cuda_stream(struct cuda_context *b, struct exec_stream *s);
/* Fails s (first error kept): a kernel entry cannot return one. */
void exec_cuda_fail(struct exec_stream *s, GError *e);

/* Check helpers behind the macros: false with *err naming call, file, line, rank and GPU. */
bool exec_cuda_check(const struct cuda_context *b, cudaError_t e, const char *call,
                     const char *file, int line, GError **err);
bool exec_cublas_check(const struct cuda_context *b, cublasStatus_t e, const char *call,
                       const char *file, int line, GError **err);
bool exec_nccl_check(const struct cuda_context *b, ncclResult_t e, const char *call,
                     const char *file, int line, GError **err);
bool exec_mpi_check(const struct cuda_context *b, int e, const char *call, const char *file,
                    int line, GError **err);
#define CUDA_CHECK(b, call, err) exec_cuda_check((b), (call), #call, __FILE__, __LINE__, (err))
#define CUBLAS_CHECK(b, call, err) exec_cublas_check((b), (call), #call, __FILE__, __LINE__, (err))
#define NCCL_CHECK(b, call, err) exec_nccl_check((b), (call), #call, __FILE__, __LINE__, (err))
#define MPI_CHECK(b, call, err) exec_mpi_check((b), (call), #call, __FILE__, __LINE__, (err))

/* backend_cuda_comm.c */
bool exec_cuda_comm_start(struct cuda_context *b, const struct exec_backend_params *p,
                          GError **err);
void exec_cuda_comm_finalize(struct cuda_context *b);
struct exec_comm *exec_cuda_comm_create(struct exec_backend *b, const char *label,
                                        const uint32_t *members, uint32_t n_members,
                                        bool point_to_point, GError **err);
void exec_cuda_comm_destroy(struct exec_comm *c);
/* The collectives of ops.def. */
#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre)                                             \
  bool exec_cuda_##name(struct exec_comm *c, EXEC_UNPAREN params, GError **err);
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
bool exec_cuda_p2p_group(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err);
bool exec_cuda_p2p_start(struct exec_backend *b, const struct exec_p2p_part *parts, uint32_t n,
                         struct exec_p2p_flight **out, GError **err);
bool exec_cuda_p2p_finish(struct exec_backend *b, struct exec_p2p_flight *f, GError **err);
bool exec_cuda_world_all_reduce_f64(struct exec_backend *b, double *buf, size_t n,
                                    enum exec_reduce_op op, GError **err);
bool exec_cuda_world_gather(struct exec_backend *b, const void *in, size_t bytes, void **out,
                            size_t **out_sizes, GError **err);
bool exec_cuda_world_broadcast(struct exec_backend *b, void *buf, size_t bytes, GError **err);

/* backend_cuda_green.c: a stream in a green context holding sm_share of the SMs; false with
 * why set when the driver cannot (the caller says so). */
bool exec_cuda_green_stream(struct cuda_context *b, double sm_share, int priority,
                            cudaStream_t *out, void **green, char *why, size_t why_len);
void exec_cuda_green_destroy(void *green);

/* backend_cuda_arena.c: the plan's tensors at the offline planner's offsets. plan sizes the
 * carved region (dyn_base) for device `device` of p; carve returns a block of tensor t in its
 * slot (from its top with EXEC_TENSOR_SLOT_TOP in t), after making the current stream wait for the last users of what held those bytes
 * before, or NULL (the caller allocates first fit above dyn_base); release is false for a
 * pointer it did not carve. */
bool exec_cuda_arena_plan(struct cuda_context *b, const struct plan *p, uint32_t device,
                          GError **err);
void *exec_cuda_arena_carve(struct cuda_context *b, uint32_t tensor, size_t bytes);
bool exec_cuda_arena_release(struct cuda_context *b, void *p);
void exec_cuda_arena_report(const struct cuda_context *b);
void exec_cuda_arena_free(struct cuda_context *b);

/* backend_cuda.c: a first-fit block of the arena (before configure: cudaMalloc), or NULL when
 * there is no room (no error: the caller does without); the live first-fit block holding p
 * (false when none). */
void *exec_cuda_alloc_quiet(struct cuda_context *b, size_t bytes);
bool exec_cuda_block_of(struct cuda_context *b, const void *p, void **base, size_t *bytes);
/* The backend's release (reusable once the work enqueued before it is done). */
void exec_cuda_release_block(struct cuda_context *b, void *p);

/* A kernel entry's context and CUDA stream: every entry is given a stream (the setup stream
 * outside tasks), whose context is the instance's. */
static inline struct cuda_context *exec_cuda_kernel_ctx(struct exec_stream *s) {
  PIPER_ASSERT(s != NULL);
  return s->b;
}
static inline cudaStream_t exec_cuda_st_of(struct exec_stream *s) {
  return exec_cuda_stream(exec_cuda_kernel_ctx(s), s);
}

/* n bytes of stream-ordered scratch (cudaMallocAsync) on s's stream, NULL with the failure
 * recorded on the stream (backend_cuda_kernels.c) */
void *exec_cuda_stream_scratch(struct exec_stream *s, size_t n);
/* the kernel table's optimizer entries (backend_cuda_adamw.c; kernels/ops.def's adamw_step and
 * adamw_multi) */
void exec_cuda_adamw_step(struct exec_stream *s, float *params, const float *grads, float *m,
                          float *v, size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int step);
void exec_cuda_adamw_multi(struct exec_stream *s, const struct kernels_adamw_tensor *tensors,
                           int n, float lr, float beta1, float beta2, float eps,
                           float weight_decay, int step);
/* cuDNN's attention could not run (e is why): forced (PIPER_CUDA_ATTENTION=cudnn), the stream
 * fails with e (true: handled); in auto mode the own kernels take this call and every later
 * one, said once (false) (backend_cuda_kernels.c) */
bool exec_cuda_cudnn_refused(struct exec_stream *s, GError *e);
/* the kernel table's LM head entries (backend_cuda_head.c; kernels/ops.def's lm_head_loss_*
 * and tp_head_*) */
void exec_cuda_lm_head_loss_forward(struct exec_stream *s, float *loss, float *saved, const float
    *h, const int32_t *targets, const float *params, enum kernels_lm_head_layout layout, int T, int
    C, int V);
void exec_cuda_lm_head_loss_backward_input(struct exec_stream *s, float *dh, float *bwork, const
    float *saved, const float *h, const int32_t *targets, const float *params, enum
    kernels_lm_head_layout layout, float dloss, int T, int C, int V, bool accumulate);
void exec_cuda_lm_head_loss_backward_weight(struct exec_stream *s, float *dparams, const float
    *bwork, const float *saved, const float *h, const int32_t *targets, const float *params, enum
    kernels_lm_head_layout layout, float dloss, int T, int C, int V);
void exec_cuda_lm_head_loss_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
    const float *saved, const float *h, const int32_t *targets, const float *params, enum
    kernels_lm_head_layout layout, float dloss, int T, int C, int V, bool accumulate);
void exec_cuda_tp_head_stats(struct exec_stream *s, float *stats, const float *h, const int32_t
    *targets, const float *w, enum kernels_lm_head_layout layout, int T, int C, int lo, int n);
void exec_cuda_tp_head_combine(struct exec_stream *s, float *loss, float *saved, const float
    *gathered, int tp, int T);
void exec_cuda_tp_head_backward(struct exec_stream *s, float *dh, float *dw, const float *saved,
    const float *h, const int32_t *targets, const float *w, enum kernels_lm_head_layout layout,
    float dloss, int T, int C, int lo, int n);
/* the kernel table's context-parallel blocks (backend_cuda_attention_cp.c; kernels/ops.def's
 * attention_block_forward and attention_block_backward) */
void exec_cuda_attention_block_forward(struct exec_stream *s, float *y, float *lse, const float *q,
                                       const float *k, const float *v,
                                       const struct kernels_attention_block *b, bool merge);
void exec_cuda_attention_block_backward(struct exec_stream *s, float *dq, float *dk, float *dv,
                                        const float *dy, const float *y, const float *lse,
                                        const float *q, const float *k, const float *v,
                                        const struct kernels_attention_block *b);

/* backend_cuda_gemm.c: a GEMM of a kernel entry (row-major, as kernels_gemm), pre saying which
 * operands are already bf16 (GEMM_A16, GEMM_B16: used as stored, with the ld given, so that
 * they are not converted again); failures fail the stream. */
enum { GEMM_A16 = 1, GEMM_B16 = 2 };
/* Weight w's bf16 copy was just made on cs (the optimizer makes them as it writes weights):
 * the GEMMs of other streams wait for its event. */
bool exec_cuda_copy_made(struct cuda_context *b, struct exec_wcache_entry *w, cudaStream_t cs,
                         GError **err);
void exec_cuda_gemm_pre(struct exec_stream *s, unsigned pre, bool ta, bool tb, int m, int n, int k,
                        float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                        float *C, int ldc);
/* a GEMM of fp32 operands (both converted as the model's GEMMs want) */
static inline void exec_cuda_gemm(struct exec_stream *s, bool ta, bool tb, int m, int n, int k,
                                  float alpha, const float *A, int lda, const float *B, int ldb,
                                  float beta, float *C, int ldc) {
  exec_cuda_gemm_pre(s, 0, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* backend_cuda_gemm.c: one cuBLASLt matmul, D [n, m] column-major (ldd) = alpha op(A) op(B)
 * + beta D, as both GEMM paths (bf16/fp32 and FP8) describe it. The heuristic's algorithm is
 * cached in gemm_algos under everything it is asked with: the layouts (element types, rows,
 * columns, leading dimensions), the transposes, the scaling mode and the operands' alignment.
 * *ran is false where cuBLASLt has no algorithm (the answer is cached too): declinable, a
 * failing heuristic is a decline (FP8: the caller runs the GEMM in bf16), else an error. */
struct exec_lt_matmul {
  cudaDataType_t in; /* A's and B's element type */
  int scaling;       /* enum model_fp8 (per-tensor scale pointers or none) */
  cublasOperation_t opa, opb;
  int a_rows, a_cols, lda, b_rows, b_cols, ldb, n, m, ldd; /* layouts as cuBLASLt reads them */
  const void *A, *B;
  float *D;
  float alpha, beta;
  const float *a_scale, *b_scale; /* CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, or NULL */
};
bool exec_cuda_lt_matmul(struct cuda_context *b, cudaStream_t cs, void *ws,
                         const struct exec_lt_matmul *x, bool declinable, bool *ran, GError **err);

/* backend_cuda_fp8.c: a kernel entry of op starts on s (enter returns the state leave
 * restores): its GEMMs run in FP8 when op is a linear layer's and the model has a recipe.
 * exec_cuda_gemm_fp8: one GEMM (exec_cuda_gemm_pre's arguments) in FP8: 1 ran, 0 declined
 * (run it in bf16), -1 failed. */
bool exec_cuda_fp8_enter(struct exec_stream *s, enum exec_op op);
void exec_cuda_fp8_leave(struct exec_stream *s, bool was);
int exec_cuda_gemm_fp8(struct exec_stream *s, bool ta, bool tb, int m, int n, int k,
                       float alpha, const void *A, int lda, const void *B, int ldb, unsigned pre,
                       float beta, float *C, int ldc, GError **err);
void exec_cuda_fp8_report(const struct cuda_context *b);

/* backend_cuda_gemm.c: device bytes [p, p + bytes) are written by work enqueued now (a
 * copy, a transfer, a collective, the optimizer): bf16 weight copies of them go stale. */
void exec_cuda_written(struct cuda_context *b, const void *p, size_t bytes);
/* p is released: if it is a weight store, its bf16 copies are released with it. */
void exec_cuda_weights_forget(struct cuda_context *b, const void *p);
/* Every bf16 weight copy released (at the end, with the arena). */
void exec_cuda_weights_free(struct cuda_context *b);

/* backend_cuda_kernels.c: the kernel table (the op list's; exec_check_ops refuses a plan
 * needing an op it lacks). */
extern const struct exec_kernels exec_cuda_kernels;
/* The cuda backend's own state of instance b (made by exec_backend_init with the cuda table). */
struct cuda_context *exec_cuda_context(struct exec_backend *b);

#endif /* HAVE_CUDA */
#endif
