/* backend_cuda: one process per GPU (MPI ranks), a CUDA stream per logical stream with the
 * plan's priorities, CUDA events for the cross-stream waits, one device allocation per process
 * (the plan's tensors at the arena planner's offsets: backend_cuda_arena.c; the rest first fit
 * above them), and the kernel table of backend_cuda_kernels.c. The host thread only
 * enqueues: stream_submit runs the task at once, and the task's kernels and communication go
 * to the stream's CUDA stream in order; event_synchronize polls the event under the runner's
 * watchdog. Errors name the call, file, line, rank and GPU, and are returned, never exit. */
#include <math.h>
#include <string.h>
#include <time.h>

/* NVTX's header converts object to function pointers (its run-time injection), which ISO C
 * forbids; the rest of this file stays pedantic */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <nvtx3/nvToolsExt.h>
#pragma GCC diagnostic pop

#include "../base/assert.h"
#include "../base/base.h"
#include "arena.h"
#include "backend_cuda.h"
#include "cuda-impl.h"
#include "cuda_cudnn.h"
#include "gpu_layout.h"

_Thread_local struct exec_stream *exec_cuda_current;

/* A live block of the arena, and a released one waiting for the work enqueued before it. */
struct blk {
  size_t offset, bytes;
};
struct deferred {
  size_t offset;
  guint n_done;
  cudaEvent_t *done; /* one per stream, recorded at the release */
};

/* ---- checks ------------------------------------------------------------------------------ */

static bool check_failed(const struct cuda_context *b, const char *call, const char *file, int line,
                         const char *what, GError **err) {
  char gpu[32] = "no GPU selected";
  if (b && b->device >= 0)
    g_snprintf(gpu, sizeof gpu, "GPU %d", b->device);
  return piper_runtime_error(err, "rank %u %s: %s failed at %s:%d: %s", b ? b->rank : 0, gpu, call,
                             file, line, what);
}

bool exec_cuda_check(const struct cuda_context *b, cudaError_t e, const char *call,
                     const char *file, int line, GError **err) {
  if (e == cudaSuccess)
    return true;
  char what[256];
  g_snprintf(what, sizeof what, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
  return check_failed(b, call, file, line, what, err);
}

bool exec_cublas_check(const struct cuda_context *b, cublasStatus_t e, const char *call,
                       const char *file, int line, GError **err) {
  if (e == CUBLAS_STATUS_SUCCESS)
    return true;
  char what[64];
  g_snprintf(what, sizeof what, "cuBLAS status %d", (int)e);
  return check_failed(b, call, file, line, what, err);
}

bool exec_nccl_check(const struct cuda_context *b, ncclResult_t e, const char *call,
                     const char *file, int line, GError **err) {
  if (e == ncclSuccess)
    return true;
  return check_failed(b, call, file, line, ncclGetErrorString(e), err);
}

bool exec_mpi_check(const struct cuda_context *b, int e, const char *call, const char *file,
                    int line, GError **err) {
  if (e == MPI_SUCCESS)
    return true;
  char what[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(e, what, &len) != MPI_SUCCESS)
    g_snprintf(what, sizeof what, "MPI error %d", e);
  return check_failed(b, call, file, line, what, err);
}

void exec_cuda_fail(struct exec_stream *s, GError *e) {
  if (!s || s == s->b->setup_stream) {
    /* work outside any task: nobody to fail, say it */
    g_printerr("piper-exec: error: %s\n", e->message);
    g_error_free(e);
    return;
  }
  if (s->failed) {
    g_error_free(e);
    return;
  }
  s->failed = true;
  s->error = e;
  s->since = piper_clock_seconds() - s->b->epoch;
  s->b->cancelled = true;
}

/* PIPER_CUDA_GEMM=bf16|fp32 overrides the model's precision (the kernel check runs both);
 * PIPER_CUDA_ATTENTION=cudnn|fused|unfused the attention core's choice. */
static void gemm_override(struct cuda_context *b) {
  b->attention = exec_gpu_attention_mode(getenv("PIPER_CUDA_ATTENTION"));
  const char *g = getenv("PIPER_CUDA_GEMM");
  if (g && strcmp(g, "fp32") == 0)
    b->bf16_gemm = false;
  else if (g && strcmp(g, "bf16") == 0)
    b->bf16_gemm = true;
}

/* ---- device selection ---------------------------------------------------------------------- */

/* Kernel scratch (the LM head's logits chunks, attention's operand copies) comes from the
 * device's stream-ordered pool (cudaMallocAsync). Its default release threshold, 0, hands
 * every freed byte back to the driver at each synchronisation, so each step would map its
 * scratch (over a GiB for a real vocabulary) again: the pool keeps what it has. */
static bool keep_pool_memory(struct cuda_context *b, GError **err) {
  cudaMemPool_t pool;
  uint64_t keep = UINT64_MAX;
  return CUDA_CHECK(b, cudaDeviceGetDefaultMemPool(&pool, b->device), err) &&
         CUDA_CHECK(b, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), err);
}

/* Which GPU this rank uses, and whether another rank of its host uses the same one. */
static bool select_device(struct cuda_context *b, GError **err) {
  int n = 0;
  /* no driver, no device: the one line `--backend cuda` prints */
  if (!CUDA_CHECK(b, cudaGetDeviceCount(&n), err))
    return false;
  b->device = exec_gpu_pick(b->local_rank, b->local_size, n);
  if (b->device < 0)
    return piper_runtime_error(err, "rank %u: no CUDA device visible", b->rank);
  struct cudaDeviceProp prop;
  if (!CUDA_CHECK(b, cudaSetDevice(b->device), err) ||
      !CUDA_CHECK(b, cudaGetDeviceProperties(&prop, b->device), err))
    return false;
  b->n_sms = prop.multiProcessorCount;
  g_strlcpy(b->device_name, prop.name, sizeof b->device_name);
  if (!keep_pool_memory(b, err))
    return false;
  uint8_t mine[16];
  memcpy(mine, prop.uuid.bytes, 16);
  uint8_t *all = g_malloc0((size_t)16 * b->local_size);
  bool ok = true;
  if (b->mpi)
    ok = MPI_CHECK(b, MPI_Allgather(mine, 16, MPI_BYTE, all, 16, MPI_BYTE, b->node), err);
  else
    memcpy(all, mine, 16);
  if (ok)
    b->shared_gpu = exec_gpu_shared(all, b->local_size, b->local_rank);
  g_free(all);
  int any = b->shared_gpu;
  if (ok && b->mpi)
    ok = MPI_CHECK(b, MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, b->job), err);
  b->shared_gpu = any; /* one mode for the whole job: every communicator works the same way */
  if (ok && b->shared_gpu && b->rank == 0)
    g_printerr("piper-exec: cuda: ranks share a GPU: communication goes through host-staged "
               "MPI instead of NCCL\n");
  return ok;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static void context_free(struct cuda_context *b) {
  exec_cuda_fp8_report(b);
  exec_cuda_weights_free(b);
  exec_cudnn_sdpa_free(b->cudnn);
  if (b->gemm_algos)
    g_hash_table_destroy(b->gemm_algos);
  if (b->lt_workspace)
    cudaFree(b->lt_workspace);
  if (b->setup_bf16.p)
    cudaFree(b->setup_bf16.p);
  if (b->lt)
    cublasLtDestroy(b->lt);
  if (b->arena)
    cudaFree(b->arena);
  if (b->setup_done)
    cudaEventDestroy(b->setup_done);
  if (b->setup)
    cudaStreamDestroy(b->setup);
  if (b->task_ends) {
    for (guint i = 0; i < b->task_ends->len; i++)
      cudaEventDestroy(g_array_index(b->task_ends, cudaEvent_t, i));
    g_array_free(b->task_ends, TRUE);
  }
  if (b->free_events) {
    for (guint i = 0; i < b->free_events->len; i++)
      cudaEventDestroy(g_ptr_array_index(b->free_events, i));
    g_ptr_array_free(b->free_events, TRUE);
  }
  GArray *timing[2] = {b->t_start, b->t_end};
  for (int k = 0; k < 2; k++) {
    for (guint i = 0; timing[k] && i < timing[k]->len; i++)
      if (g_array_index(timing[k], cudaEvent_t, i))
        cudaEventDestroy(g_array_index(timing[k], cudaEvent_t, i));
    if (timing[k])
      g_array_free(timing[k], TRUE);
  }
  if (b->epoch_event)
    cudaEventDestroy(b->epoch_event);
  exec_cuda_arena_free(b);
  if (b->blocks)
    g_array_free(b->blocks, TRUE);
  for (guint i = 0; b->deferred && i < b->deferred->len; i++) {
    struct deferred *d = &g_array_index(b->deferred, struct deferred, i);
    for (guint k = 0; k < d->n_done; k++)
      cudaEventDestroy(d->done[k]);
    g_free(d->done);
  }
  if (b->deferred)
    g_array_free(b->deferred, TRUE);
  if (b->streams)
    g_ptr_array_free(b->streams, TRUE);
  g_mutex_clear(&b->mem_lock);
  g_free(b->setup_stream);
  g_free(b);
}

static bool start_gpu(struct cuda_context *b, GError **err) {
  b->lt_workspace_bytes = (size_t)32 << 20;
  return CUDA_CHECK(b, cudaStreamCreateWithFlags(&b->setup, cudaStreamNonBlocking), err) &&
         CUDA_CHECK(b, cudaEventCreate(&b->epoch_event), err) &&
         CUDA_CHECK(b, cudaEventCreateWithFlags(&b->setup_done, cudaEventDisableTiming), err) &&
         CUBLAS_CHECK(b, cublasLtCreate(&b->lt), err) &&
         CUDA_CHECK(b, cudaMalloc(&b->lt_workspace, b->lt_workspace_bytes), err);
}

/* The ranks' shared time origin (as the host backend's): a rank on rank 0's machine reads the
 * same monotonic clock, so it takes rank 0's origin and places its GPU events from when its
 * own epoch event completed on that clock; leaving a barrier is not a shared moment when
 * ranks outnumber the cores they run on. A rank on another machine keeps its own. */
static bool shared_epoch(struct cuda_context *b, GError **err) {
  if (!b->mpi)
    return true;
  struct {
    char machine[64];
    double epoch;
  } mine = {.epoch = b->epoch}, root;
  piper_clock_machine(mine.machine, sizeof mine.machine);
  root = mine;
  if (!MPI_CHECK(b, MPI_Bcast(&root, sizeof root, MPI_BYTE, 0, b->job), err))
    return false;
  if (strcmp(root.machine, mine.machine) != 0)
    return true;
  b->epoch_event_at = b->epoch - root.epoch;
  b->epoch = root.epoch;
  return true;
}

static void cuda_free(struct exec_backend *backend);

static bool cuda_init(struct exec_backend *backend, const struct exec_backend_params *p,
                      GError **err) {
  struct cuda_context *b = g_new0(struct cuda_context, 1);
  g_mutex_init(&b->mem_lock);
  b->size = b->local_size = 1;
  b->device = -1;
  b->bf16_gemm = true;
  b->streams = g_ptr_array_new();
  b->task_ends = g_array_new(FALSE, FALSE, sizeof(cudaEvent_t));
  b->t_start = g_array_new(FALSE, TRUE, sizeof(cudaEvent_t));
  b->t_end = g_array_new(FALSE, TRUE, sizeof(cudaEvent_t));
  b->free_events = g_ptr_array_new();
  b->blocks = g_array_new(FALSE, FALSE, sizeof(struct blk));
  exec_wcache_init(&b->wcache);
  b->deferred = g_array_new(FALSE, FALSE, sizeof(struct deferred));
  backend->context = b;
  b->backend = backend;
  b->setup_stream = g_new0(struct exec_stream, 1);
  b->setup_stream->b = b;
  b->setup_stream->plan_stream = -1;
  g_strlcpy(b->setup_stream->name, "setup", sizeof b->setup_stream->name);
  if (!exec_cuda_comm_start(b, p, err) || !select_device(b, err) || !start_gpu(b, err)) {
    exec_cuda_comm_finalize(b);
    context_free(b);
    backend->context = NULL;
    return false;
  }
  if (b->mpi && !MPI_CHECK(b, MPI_Barrier(b->job), err)) {
    cuda_free(backend);
    return false;
  }
  /* the GPU's time origin: an event that completed when the clock read (about) 0 */
  cudaEventRecord(b->epoch_event, b->setup);
  cudaEventSynchronize(b->epoch_event);
  b->epoch = piper_clock_seconds();
  if (!shared_epoch(b, err)) {
    cuda_free(backend);
    return false;
  }
  gemm_override(b);
  return true;
}

static struct exec_stream *cuda_setup_stream(struct exec_backend *backend) {
  struct cuda_context *b = backend->context;
  return b->setup_stream;
}

struct cuda_context *exec_cuda_context(struct exec_backend *b) {
  return b->context;
}

static void cuda_free(struct exec_backend *backend) {
  struct cuda_context *b = backend->context;
  if (!b)
    return;
  cudaDeviceSynchronize();
  if (b->arena && b->rank == 0)
    g_printerr("piper-exec: cuda: arena high-water %.3f GiB of %.2f GiB reserved (rank 0)\n",
               b->arena_high / 1073741824.0, b->arena_bytes / 1073741824.0);
  exec_cuda_arena_report(b);
  for (guint i = b->streams->len; i-- > 0;) {
    struct exec_stream *s = g_ptr_array_index(b->streams, i);
    cudaStreamDestroy(s->cs);
    exec_cuda_green_destroy(s->green);
    cudaFree(s->lt_workspace);
    if (s->bf16.p)
      cudaFree(s->bf16.p);
    if (s->error)
      g_error_free(s->error);
    g_free(s);
  }
  g_ptr_array_set_size(b->streams, 0);
  exec_cuda_comm_finalize(b);
  context_free(b);
  backend->context = NULL;
}

static void cuda_abort(struct exec_backend *backend, int code) {
  struct cuda_context *b = backend->context;
  if (b && b->mpi)
    /* returns only when it fails: the caller exits */
    (void)MPI_Abort(b->job != MPI_COMM_NULL ? b->job : MPI_COMM_WORLD, code);
}

static uint32_t cuda_world_rank(struct exec_backend *b) {
  return ((struct cuda_context *)b->context)->rank;
}
static uint32_t cuda_world_size(struct exec_backend *b) {
  return ((struct cuda_context *)b->context)->size;
}
static const char *cuda_comm_library(struct exec_backend *backend) {
  struct cuda_context *b = backend->context;
  if (!b->mpi)
    return "one process, no MPI"; /* as the host backend says: no communicator is made */
  return b->shared_gpu ? "MPI (host-staged: ranks share a GPU)" : "NCCL (MPI bootstrap)";
}
static double cuda_clock(struct exec_backend *backend) {
  return piper_clock_seconds() - ((struct cuda_context *)backend->context)->epoch;
}

/* ---- configure: precision, SM partitioning, the arena ----------------------------------- */

/* What sm_share does here: communication on the stream gets a CTA limit (exec_cuda_comm_create),
 * compute a green context (cuda_stream_create says when it cannot). */
static void report_sm_shares(struct cuda_context *b, const struct plan *p) {
  for (uint32_t s = 0; s < p->n_streams && b->rank == 0; s++)
    if (p->streams[s].sm_share < 1.0)
      g_printerr("piper-exec: cuda: stream %s: sm_share %.2f: NCCL limited to %d CTAs, compute "
                 "to %d SMs\n",
                 p->streams[s].name, p->streams[s].sm_share,
                 exec_gpu_cta_limit(p->streams[s].sm_share, b->n_sms),
                 exec_gpu_green_sms(p->streams[s].sm_share, b->n_sms, 8));
}

/* One allocation: the plan's tensors at the planner's offsets in [0, dyn_base), then the rest
 * (parameters, gradients, optimizer state, workspaces, the micro-batch's routing state and
 * any block the carver refuses) first fit above. */
static bool reserve_arena(struct cuda_context *b, const struct plan *p, uint32_t device,
                          GError **err) {
  if (!exec_cuda_arena_plan(b, p, device, err))
    return false;
  size_t free_b = 0, total = 0;
  if (!CUDA_CHECK(b, cudaMemGetInfo(&free_b, &total), err))
    return false;
  const char *env = getenv("PIPER_CUDA_MEMORY");
  /* ranks sharing the GPU split it (each asks at about the same time, seeing it all free) */
  size_t want = env ? (size_t)g_ascii_strtoull(env, NULL, 10)
                    : (size_t)(free_b * 0.80 / (b->shared_gpu ? b->local_size : 1));
  if (b->rank == 0)
    g_printerr("piper-exec: cuda: %s, %d SMs: arena %.2f GiB reserved (plan's tensors %.3f "
               "GiB at the planner's offsets, its live peak %.3f GiB; %s GEMMs)\n",
               b->device_name, b->n_sms, want / 1073741824.0, b->plan_arena.size / 1073741824.0,
               b->plan_arena.live_peak / 1073741824.0, b->bf16_gemm ? "bf16" : "fp32");
  /* above the planned region: parameters, gradients, optimizer state and workspaces */
  const size_t above = (size_t)64 << 20;
  if (want < b->dyn_base + above)
    return piper_runtime_error(err,
                               "rank %u GPU %d: the arena needs the plan's %.3f GiB at the "
                               "planner's offsets and at least %.3f GiB above them, and %.3f GiB "
                               "is reserved (%s)",
                               b->rank, b->device, b->dyn_base / 1073741824.0,
                               above / 1073741824.0, want / 1073741824.0,
                               env ? "PIPER_CUDA_MEMORY's figure"
                                   : "80% of the GPU's free memory; PIPER_CUDA_MEMORY=BYTES sets "
                                     "another");
  b->arena_bytes = want;
  return CUDA_CHECK(b, cudaMalloc((void **)&b->arena, want), err);
}

static bool cuda_configure(struct exec_backend *backend, const struct plan *p, uint32_t device,
                           GError **err) {
  struct cuda_context *b = backend->context;
  b->plan = p;
  b->plan_device = device;
  b->bf16_gemm = p->model->dtype != MODEL_DTYPE_FP32; /* fp32 models stay fp32 */
  b->fp8 = p->model->fp8; /* a bf16 model's linear layers (backend_cuda_fp8.c) */
  b->act_dtype = exec_gpu_act_dtype(p->model->dtype);
  gemm_override(b);
  uint32_t stuck_device = 0, stuck_instr = 0;
  if (b->shared_gpu && !exec_gpu_serial_progress(p, &stuck_device, &stuck_instr)) {
    char name[160];
    plan_node_name(p, plan_device_class(p, stuck_device)->instrs[stuck_instr].node, name,
                   sizeof name);
    return piper_input_error(err,
                             "ranks sharing a GPU communicate through host-staged MPI, one "
                             "host thread per rank, and this plan then cannot progress: "
                             "device %u would wait forever at instruction %u (%s)",
                             stuck_device, stuck_instr, name);
  }
  report_sm_shares(b, p);
  return b->arena || reserve_arena(b, p, device, err);
}

/* ---- memory -------------------------------------------------------------------------------
 * Live blocks are kept sorted by offset; a released block waits for an event recorded on
 * every stream (work already enqueued may still use it) before first fit may hand it out. */

static bool deferred_done(const struct deferred *d) {
  for (guint k = 0; k < d->n_done; k++)
    if (cudaEventQuery(d->done[k]) == cudaErrorNotReady)
      return false;
  return true;
}

static void remove_block(struct cuda_context *b, size_t offset) {
  for (guint k = 0; k < b->blocks->len; k++)
    if (g_array_index(b->blocks, struct blk, k).offset == offset) {
      g_array_remove_index(b->blocks, k);
      return;
    }
}

/* Released blocks whose streams have all passed the release point become free. Polled on
 * the host: making a stream wait for them would tie every stream to every other. */
static void reclaim(struct cuda_context *b) {
  for (guint i = 0; i < b->deferred->len;) {
    struct deferred *d = &g_array_index(b->deferred, struct deferred, i);
    if (!deferred_done(d)) {
      i++;
      continue;
    }
    for (guint k = 0; k < d->n_done; k++)
      cudaEventDestroy(d->done[k]);
    g_free(d->done);
    remove_block(b, d->offset);
    g_array_remove_index(b->deferred, i);
  }
}

/* First fit above the planned region; fail_stream: no room fails the running stream (the
 * executor's buffers), else it is the caller's to do without (a bf16 weight copy). */
static void *arena_alloc(struct cuda_context *b, size_t bytes, bool fail_stream) {
  if (!b->arena) {
    /* before configure (a library user without a plan): plain device memory */
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess &&
                   cudaMemset(p, 0, bytes ? bytes : 1) == cudaSuccess
               ? p
               : NULL;
  }
  size_t need = (bytes + 255) & ~(size_t)255;
  if (!need)
    need = 256;
  g_mutex_lock(&b->mem_lock);
  reclaim(b);
  size_t at = b->dyn_base;
  guint k = 0;
  for (; k < b->blocks->len; k++) {
    const struct blk *x = &g_array_index(b->blocks, struct blk, k);
    if (x->offset >= at + need)
      break;
    at = (x->offset + x->bytes + 255) & ~(size_t)255;
  }
  void *p = NULL;
  if (at + need <= b->arena_bytes) {
    struct blk x = {at, need};
    g_array_insert_vals(b->blocks, k, &x, 1);
    if (at + need > b->arena_high)
      b->arena_high = at + need;
    p = b->arena + at;
  }
  size_t in_use = 0;
  for (guint i = 0; !p && i < b->blocks->len; i++)
    in_use += g_array_index(b->blocks, struct blk, i).bytes;
  g_mutex_unlock(&b->mem_lock);
  if (!p && !fail_stream)
    return NULL;
  if (!p) {
    /* the kernels given NULL then fail too, but this is the stream's first error */
    exec_cuda_fail(exec_cuda_current,
                   g_error_new(PIPER_ERROR, PIPER_ERROR_RUNTIME,
                               "rank %u GPU %d: the arena has no room for %zu bytes (%zu of %zu "
                               "in use or waiting for release; PIPER_CUDA_MEMORY=BYTES sets its "
                               "size)",
                               b->rank, b->device, bytes, in_use, b->arena_bytes));
    return NULL;
  }
  /* zero-filled: inside a task, on its stream (the buffer's first user); outside, on the
   * setup stream, which every stream waits for before its next work */
  struct exec_stream *cur = exec_cuda_current;
  if (p && cudaMemsetAsync(p, 0, bytes, exec_cuda_stream(b, cur)) != cudaSuccess)
    p = NULL;
  if (p && !cur) {
    cudaEventRecord(b->setup_done, b->setup);
    b->setup_gen++;
  }
  return p;
}

static void *cuda_alloc(struct exec_backend *backend, size_t bytes) {
  return arena_alloc(backend->context, bytes, true);
}

void *exec_cuda_alloc_quiet(struct cuda_context *b, size_t bytes) {
  if (b->arena)
    return arena_alloc(b, bytes, false);
  /* before configure (the kernel check): plain device memory, as cuda_alloc gives */
  void *p = NULL;
  return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

bool exec_cuda_block_of(struct cuda_context *b, const void *p, void **base, size_t *bytes) {
  if (!b->arena || (const char *)p < b->arena || (const char *)p >= b->arena + b->arena_bytes)
    return false;
  size_t at = (size_t)((const char *)p - b->arena);
  bool found = false;
  g_mutex_lock(&b->mem_lock);
  for (guint k = 0; k < b->blocks->len && !found; k++) {
    const struct blk *x = &g_array_index(b->blocks, struct blk, k);
    if (x->offset <= at && at < x->offset + x->bytes) {
      *base = b->arena + x->offset;
      *bytes = x->bytes;
      found = true;
    }
  }
  g_mutex_unlock(&b->mem_lock);
  return found;
}

/* A plan tensor's block: at the planner's offset when the carver takes it, else first fit. */
static void *cuda_alloc_tensor(struct exec_backend *backend, uint32_t tensor, size_t bytes) {
  void *p = exec_cuda_arena_carve(backend->context, tensor, bytes);
  return p ? p : cuda_alloc(backend, bytes);
}

/* The highest byte of the allocation in use: the planned arena (the plan's tensors) and what
 * first fit placed above it (parameters, gradients, optimizer state, workspaces). */
static uint64_t cuda_memory_peak(struct exec_backend *backend) {
  const struct cuda_context *b = backend->context;
  if (!b->arena)
    return 0; /* not configured: buffers of their own (cudaMalloc), the runner's count */
  return b->arena_high > b->dyn_base ? b->arena_high : b->dyn_base;
}

static void cuda_release(struct exec_backend *backend, void *p) {
  struct cuda_context *b = backend->context;
  exec_cuda_weights_forget(b, p);
  if (exec_cuda_arena_release(b, p))
    return; /* its slot's next holder waits for its users on the GPU */
  if (!b->arena || (char *)p < b->arena || (char *)p >= b->arena + b->arena_bytes) {
    cudaDeviceSynchronize();
    cudaFree(p);
    return;
  }
  /* work already enqueued on any stream may still use the block */
  struct deferred d = {(size_t)((char *)p - b->arena), 0, NULL};
  d.done = g_new0(cudaEvent_t, b->streams->len + 1);
  for (guint i = 0; i <= b->streams->len; i++) {
    cudaStream_t cs = i < b->streams->len
                          ? ((struct exec_stream *)g_ptr_array_index(b->streams, i))->cs
                          : b->setup;
    if (cudaEventCreateWithFlags(&d.done[d.n_done], cudaEventDisableTiming) != cudaSuccess) {
      cudaDeviceSynchronize(); /* no event: wait for everything instead */
      continue;
    }
    cudaEventRecord(d.done[d.n_done++], cs);
  }
  g_mutex_lock(&b->mem_lock);
  g_array_append_val(b->deferred, d);
  g_mutex_unlock(&b->mem_lock);
}

void exec_cuda_release_block(struct cuda_context *b, void *p) {
  cuda_release(b->backend, p);
}

/* Host to device: from pageable memory cudaMemcpyAsync returns once the bytes are staged, so
 * the caller may reuse its buffer, and no stream is waited for. */
static void cuda_from_host(struct exec_backend *backend, void *dst, const void *src, size_t n) {
  struct cuda_context *b = backend->context;
  cudaStream_t cs = exec_cuda_stream(b, exec_cuda_current);
  GError *e = NULL;
  exec_cuda_written(b, dst, n); /* a checkpoint's weights: their bf16 copies go stale */
  if (n && !CUDA_CHECK(b, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cs), &e))
    exec_cuda_fail(exec_cuda_current, e);
  if (!exec_cuda_current) {
    cudaEventRecord(b->setup_done, b->setup);
    b->setup_gen++;
  }
}

/* Device to host: the only wait inside a step. Inside a task it waits for that task's stream
 * alone (what the value depends on reaches it through the plan's events); outside, for the
 * whole device. */
static void cuda_to_host(struct exec_backend *backend, void *dst, const void *src, size_t n) {
  struct cuda_context *b = backend->context;
  GError *e = NULL;
  bool ok = true;
  if (exec_cuda_current) {
    cudaStream_t cs = exec_cuda_stream(b, exec_cuda_current);
    ok = !n || (CUDA_CHECK(b, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cs), &e) &&
                CUDA_CHECK(b, cudaStreamSynchronize(cs), &e));
  } else {
    ok = CUDA_CHECK(b, cudaDeviceSynchronize(), &e) &&
         (!n || CUDA_CHECK(b, cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), &e));
  }
  if (!ok)
    exec_cuda_fail(exec_cuda_current, e);
}

/* ---- streams and events -------------------------------------------------------------------- */

cudaStream_t exec_cuda_stream(struct cuda_context *b, struct exec_stream *s) {
  if (!s || s == b->setup_stream)
    return b->setup;
  if (s->setup_seen != b->setup_gen) {
    cudaStreamWaitEvent(s->cs, b->setup_done, 0);
    s->setup_seen = b->setup_gen;
  }
  return s->cs;
}

static int plan_stream_of(const struct plan *p, const char *name) {
  for (uint32_t s = 0; p && s < p->n_streams; s++)
    if (strcmp(p->streams[s].name, name) == 0)
      return (int)s;
  return -1;
}

static struct exec_stream *cuda_stream_create(struct exec_backend *backend, const char *name,
                                              int priority, GError **err) {
  struct cuda_context *b = backend->context;
  int lo = 0, hi = 0;
  if (!CUDA_CHECK(b, cudaDeviceGetStreamPriorityRange(&lo, &hi), err))
    return NULL;
  /* the plan: higher runs first; CUDA: lower numbers are higher priorities, in [hi, lo] */
  int cp = lo - priority;
  cp = cp < hi ? hi : cp > lo ? lo : cp;
  struct exec_stream *s = g_new0(struct exec_stream, 1);
  s->b = b;
  s->priority = priority;
  g_strlcpy(s->name, name, sizeof s->name);
  s->plan_stream = plan_stream_of(b->plan, name);
  s->setup_seen = UINT64_MAX;
  double share = s->plan_stream >= 0 ? b->plan->streams[s->plan_stream].sm_share : 1.0;
  char why[160];
  bool green =
      share < 1.0 && exec_cuda_green_stream(b, share, cp, &s->cs, &s->green, why, sizeof why);
  if (share < 1.0 && !green && b->rank == 0)
    g_printerr("piper-exec: cuda: stream %s: compute is not limited to its sm_share: %s\n", name,
               why);
  if ((!green &&
       !CUDA_CHECK(b, cudaStreamCreateWithPriority(&s->cs, cudaStreamNonBlocking, cp), err)) ||
      !CUDA_CHECK(b, cudaMalloc(&s->lt_workspace, b->lt_workspace_bytes), err)) {
    if (s->cs)
      cudaStreamDestroy(s->cs);
    exec_cuda_green_destroy(s->green);
    g_free(s);
    return NULL;
  }
  g_ptr_array_add(b->streams, s);
  return s;
}

static void cuda_stream_destroy(struct exec_stream *s) {
  if (!s)
    return;
  cudaStreamSynchronize(s->cs);
  cudaStreamDestroy(s->cs);
  exec_cuda_green_destroy(s->green);
  cudaFree(s->lt_workspace);
  if (s->bf16.p)
    cudaFree(s->bf16.p);
  g_ptr_array_remove(s->b->streams, s);
  if (s->error)
    g_error_free(s->error);
  g_free(s);
}

static cudaEvent_t take_event(struct cuda_context *b) {
  if (b->free_events->len)
    return g_ptr_array_steal_index_fast(b->free_events, b->free_events->len - 1);
  cudaEvent_t e = NULL;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
    return NULL;
  return e;
}

/* The NVTX range of a task: the IR node's name, so Nsight Systems shows the DAG. */
static void task_range_push(struct cuda_context *b, uint32_t task_id) {
  char name[160] = "control";
  if (b->plan && task_id != UINT32_MAX) {
    const struct plan_class *c = plan_device_class(b->plan, b->plan_device);
    if (task_id < c->n_instrs)
      plan_node_name(b->plan, c->instrs[task_id].node, name, sizeof name);
  }
  nvtxRangePushA(name);
}

/* The timing event of task id in table (made on first use); NULL for the control stream's
 * tasks (no instruction) or when none can be made. */
static cudaEvent_t timing_event(GArray *table, uint32_t id) {
  if (id == UINT32_MAX)
    return NULL;
  if (id >= table->len)
    g_array_set_size(table, id + 1);
  cudaEvent_t *e = &g_array_index(table, cudaEvent_t, id);
  if (!*e && cudaEventCreate(e) != cudaSuccess)
    *e = NULL;
  return *e;
}

static bool cuda_task_times(struct exec_backend *backend, uint32_t id, double *start, double *end) {
  struct cuda_context *b = backend->context;
  if (id >= b->t_start->len || id >= b->t_end->len)
    return false;
  cudaEvent_t t0 = g_array_index(b->t_start, cudaEvent_t, id);
  cudaEvent_t t1 = g_array_index(b->t_end, cudaEvent_t, id);
  float ms0 = 0, ms1 = 0;
  if (!t0 || !t1 || cudaEventElapsedTime(&ms0, b->epoch_event, t0) != cudaSuccess ||
      cudaEventElapsedTime(&ms1, b->epoch_event, t1) != cudaSuccess)
    return false;
  *start = b->epoch_event_at + ms0 * 1e-3;
  *end = b->epoch_event_at + ms1 * 1e-3;
  return true;
}

static void cuda_stream_submit(struct exec_stream *s, exec_task_fn fn, void *arg,
                               uint32_t task_id) {
  struct cuda_context *b = s->b;
  if (s->failed || b->cancelled)
    return;
  s->task_id = task_id;
  task_range_push(b, task_id);
  cudaStream_t cs = exec_cuda_stream(b, s); /* after the waits enqueued before it */
  cudaEvent_t t0 = timing_event(b->t_start, task_id), t1 = timing_event(b->t_end, task_id);
  if (t0)
    cudaEventRecord(t0, cs);
  struct exec_stream *outer = exec_cuda_current;
  exec_cuda_current = s;
  GError *e = NULL;
  double h0 = piper_clock_seconds();
  bool ok = fn(s, arg, &e);
  if (task_id != UINT32_MAX) {
    b->host_task_s += piper_clock_seconds() - h0;
    b->host_tasks++;
  }
  exec_cuda_current = outer;
  nvtxRangePop();
  if (!ok)
    exec_cuda_fail(s, e ? e
                        : g_error_new(PIPER_ERROR, PIPER_ERROR_RUNTIME, "stream %s: task %u failed",
                                      s->name, task_id));
  else if (e)
    g_error_free(e);
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) {
    GError *le = NULL;
    exec_cuda_check(b, launch, "a kernel launch", s->name, (int)task_id, &le);
    exec_cuda_fail(s, le);
  }
  if (t1)
    cudaEventRecord(t1, cs);
  cudaEvent_t end = take_event(b);
  if (end && cudaEventRecord(end, s->cs) == cudaSuccess)
    g_array_append_val(b->task_ends, end);
}

static void cuda_stream_status(struct exec_stream *s, struct exec_stream_status *out) {
  out->phase = cudaStreamQuery(s->cs) == cudaErrorNotReady ? EXEC_STREAM_RUNNING : EXEC_STREAM_IDLE;
  out->task_id = s->task_id;
  out->since = s->since;
  out->failed = s->failed;
}

static const GError *cuda_stream_error(struct exec_stream *s) {
  return s->error;
}

static struct exec_event *cuda_event_create(struct exec_backend *backend) {
  struct cuda_context *b = backend->context;
  struct exec_event *e = g_new0(struct exec_event, 1);
  e->b = b;
  if (cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming) != cudaSuccess)
    e->ev = NULL;
  return e;
}

static void cuda_event_destroy(struct exec_event *e) {
  if (e->ev)
    cudaEventDestroy(e->ev);
  g_free(e);
}

static void cuda_event_record(struct exec_event *e, struct exec_stream *s) {
  GError *err = NULL;
  if (!CUDA_CHECK(e->b, cudaEventRecord(e->ev, exec_cuda_stream(e->b, s)), &err))
    exec_cuda_fail(s, err);
}

static void cuda_stream_wait_event(struct exec_stream *s, struct exec_event *e) {
  GError *err = NULL;
  if (!CUDA_CHECK(s->b, cudaStreamWaitEvent(exec_cuda_stream(s->b, s), e->ev, 0), &err))
    exec_cuda_fail(s, err);
}

/* Task ends completed so far: the watchdog's progress signal. */
static uint64_t cuda_progress(struct exec_backend *backend) {
  struct cuda_context *b = backend->context;
  guint done = 0;
  while (done < b->task_ends->len &&
         cudaEventQuery(g_array_index(b->task_ends, cudaEvent_t, done)) == cudaSuccess)
    g_ptr_array_add(b->free_events, g_array_index(b->task_ends, cudaEvent_t, done++));
  g_array_remove_range(b->task_ends, 0, done);
  b->progress += done;
  return b->progress;
}

static bool cuda_event_synchronize(struct exec_event *e, double timeout_s) {
  double deadline = piper_clock_seconds() + timeout_s;
  for (;;) {
    cudaError_t q = cudaEventQuery(e->ev);
    if (q == cudaSuccess)
      return true;
    if (q != cudaErrorNotReady || piper_clock_seconds() > deadline)
      return false;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

/* Work already enqueued cannot be taken back from a CUDA stream: cancelling stops what is
 * submitted from now on (the job then ends: a GPU blocked in NCCL needs the abort). */
static void cuda_cancel(struct exec_backend *backend) {
  ((struct cuda_context *)backend->context)->cancelled = true;
}

static void cuda_reset(struct exec_backend *backend) {
  ((struct cuda_context *)backend->context)->cancelled = false;
}

/* ---- beyond the table (backend_cuda.h) ----------------------------------------------------- */

bool exec_cuda_facts(struct exec_backend *backend, struct exec_cuda_facts *out, GError **err) {
  struct cuda_context *b = exec_cuda_context(backend);
  *out = (struct exec_cuda_facts){.n_sms = b->n_sms};
  g_strlcpy(out->name, b->device_name, sizeof out->name);
  return CUDA_CHECK(b, cudaMemGetInfo(&out->free_bytes, &out->total_bytes), err);
}

bool exec_cuda_gemm_bf16(struct exec_backend *backend) {
  return exec_cuda_context(backend)->bf16_gemm;
}

void exec_cuda_set_gemm_bf16(struct exec_backend *backend, bool bf16) {
  exec_cuda_context(backend)->bf16_gemm = bf16;
}

void exec_cuda_add_weight_store(struct exec_backend *backend, const void *store, size_t bytes) {
  exec_wcache_add_store(&exec_cuda_context(backend)->wcache, store, bytes);
}

const struct exec_backend_ops exec_backend_cuda = {
    .api_version = EXEC_BACKEND_API_VERSION,
    .name = "cuda",
    .description = "NVIDIA GPUs: CUDA kernels and cuBLASLt GEMMs, NCCL communication "
                   "(host-staged MPI when ranks share a GPU)",
    .init = cuda_init,
    .free = cuda_free,
    .abort = cuda_abort,
    .world_rank = cuda_world_rank,
    .world_size = cuda_world_size,
    .comm_library = cuda_comm_library,
    .configure = cuda_configure,
    .clock = cuda_clock,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .alloc_tensor = cuda_alloc_tensor,
    .memory_peak = cuda_memory_peak,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_submit = cuda_stream_submit,
    .stream_status = cuda_stream_status,
    .stream_error = cuda_stream_error,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_synchronize = cuda_event_synchronize,
    .setup_stream = cuda_setup_stream,
    .progress = cuda_progress,
    .task_times = cuda_task_times,
    .cancel = cuda_cancel,
    .reset = cuda_reset,
    .comm_create = exec_cuda_comm_create,
    .comm_destroy = exec_cuda_comm_destroy,
    .p2p_group = exec_cuda_p2p_group,
    .p2p_start = exec_cuda_p2p_start,
    .p2p_finish = exec_cuda_p2p_finish,
#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre) .name = exec_cuda_##name,
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
    .world_all_reduce_f64 = exec_cuda_world_all_reduce_f64,
    .world_gather = exec_cuda_world_gather,
    .world_broadcast = exec_cuda_world_broadcast,
    .kernels = &exec_cuda_kernels,
};
