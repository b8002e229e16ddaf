/* backend_cuda_comm: the cuda backend's communication. MPI bootstraps the job (ranks, the
 * ranks of each host, one NCCL unique id per communicator broadcast from its first member)
 * and carries the job-wide operations on host memory; NCCL carries everything of the plan on
 * the running task's CUDA stream, so the host only enqueues. When ranks share a GPU NCCL
 * refuses, and every operation goes through host memory and MPI instead ("host-staged"):
 * slower, and it waits for the stream, but any plan then runs on one GPU. */
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "cuda-impl.h"
#include "gpu_layout.h"

struct exec_comm {
  struct cuda_context *b;
  char label[96];
  uint32_t *members, n_members;
  struct exec_gpu_comm_rank me;
  MPI_Comm mpi;    /* members only; every communicator has one (host memory operations) */
  ncclComm_t nccl; /* NULL when host-staged */
};

/* ---- start-up -------------------------------------------------------------------------------- */

bool exec_cuda_comm_start(struct cuda_context *b, const struct exec_backend_params *p,
                          GError **err) {
  b->node = b->job = MPI_COMM_NULL;
  if (!p->force_mpi && !p->launch.launched)
    return true; /* one process, one GPU: no MPI */
  int inited = 0, provided = 0;
  if (!MPI_CHECK(b, MPI_Initialized(&inited), err))
    return false;
  if (!inited) {
    if (!MPI_CHECK(
            b,
            MPI_Init_thread(p ? p->argc : NULL, p ? p->argv : NULL, MPI_THREAD_MULTIPLE, &provided),
            err))
      return false;
    b->finalize_mpi = true;
  }
  b->mpi = true;
  int rank = 0, size = 1, lrank = 0, lsize = 1;
  /* errors return (MPI's default ends the job): MPI_CHECK then names the call; every
   * communicator split from job inherits its handler */
  bool ok = MPI_CHECK(b, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), err) &&
            MPI_CHECK(b, MPI_Comm_dup(MPI_COMM_WORLD, &b->job), err) &&
            MPI_CHECK(b, MPI_Comm_set_errhandler(b->job, MPI_ERRORS_RETURN), err) &&
            MPI_CHECK(b, MPI_Comm_rank(b->job, &rank), err) &&
            MPI_CHECK(b, MPI_Comm_size(b->job, &size), err) &&
            MPI_CHECK(b,
                      MPI_Comm_split_type(b->job, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                          &b->node),
                      err) &&
            MPI_CHECK(b, MPI_Comm_rank(b->node, &lrank), err) &&
            MPI_CHECK(b, MPI_Comm_size(b->node, &lsize), err);
  b->rank = (uint32_t)rank;
  b->size = (uint32_t)size;
  b->local_rank = (uint32_t)lrank;
  b->local_size = (uint32_t)lsize;
  return ok;
}

static void staged_sends_settle(struct cuda_context *b, bool all);

void exec_cuda_comm_finalize(struct cuda_context *b) {
  if (b->p2p_side)
    cudaStreamDestroy(b->p2p_side); /* teardown: the streams are idle */
  b->p2p_side = NULL;
  staged_sends_settle(b, true);
  if (b->staged_sends)
    g_array_free(b->staged_sends, TRUE);
  b->staged_sends = NULL;
  /* teardown has no caller to tell: a failure (a peer gone) changes nothing that follows */
  if (b->node != MPI_COMM_NULL && b->mpi)
    (void)MPI_Comm_free(&b->node);
  if (b->job != MPI_COMM_NULL && b->mpi)
    (void)MPI_Comm_free(&b->job);
  b->node = b->job = MPI_COMM_NULL;
  if (b->finalize_mpi)
    (void)MPI_Finalize();
  b->finalize_mpi = false;
}

/* ---- communicators --------------------------------------------------------------------------- */

/* The NCCL communicator of c's members, its unique id made by the first member and broadcast
 * over the whole job (comm_create is collective over it); a communication stream with an
 * sm_share below 1 limits NCCL's CTAs. */
static bool nccl_create(struct cuda_context *b, struct exec_comm *c, GError **err) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (b->rank == c->me.id_root && !NCCL_CHECK(b, ncclGetUniqueId(&id), err))
    return false;
  if (b->mpi &&
      !MPI_CHECK(b, MPI_Bcast(&id, sizeof id, MPI_BYTE, (int)c->me.id_root, b->job), err))
    return false;
  if (!c->me.member)
    return true;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  int s = b->plan ? exec_gpu_label_stream(b->plan, c->label) : -1;
  int ctas = s >= 0 ? exec_gpu_cta_limit(b->plan->streams[s].sm_share, b->n_sms) : 0;
  if (ctas > 0) {
    config.minCTAs = 1;
    config.maxCTAs = ctas;
  }
  return NCCL_CHECK(
      b, ncclCommInitRankConfig(&c->nccl, (int)c->me.size, id, (int)c->me.rank, &config), err);
}

struct exec_comm *exec_cuda_comm_create(struct exec_backend *backend, const char *label,
                                        const uint32_t *members, uint32_t n_members,
                                        bool point_to_point, GError **err) {
  (void)point_to_point; /* NCCL send/recv work on any communicator */
  struct cuda_context *b = backend->context;
  struct exec_comm *c = g_new0(struct exec_comm, 1);
  c->b = b;
  g_strlcpy(c->label, label, sizeof c->label);
  c->members = g_memdup2(members, n_members * sizeof *members);
  c->n_members = n_members;
  c->me = exec_gpu_comm_rank(members, n_members, b->rank);
  c->mpi = MPI_COMM_NULL;
  bool ok = true;
  if (b->mpi) {
    MPI_Comm made = MPI_COMM_NULL;
    ok = MPI_CHECK(
        b, MPI_Comm_split(b->job, c->me.member ? 0 : MPI_UNDEFINED, (int)c->me.rank, &made),
        err);
    c->mpi = made;
  }
  if (ok && !b->shared_gpu)
    ok = nccl_create(b, c, err);
  if (!ok || !c->me.member) {
    exec_cuda_comm_destroy(c);
    return NULL;
  }
  return c;
}

void exec_cuda_comm_destroy(struct exec_comm *c) {
  if (!c)
    return;
  if (c->nccl)
    ncclCommDestroy(c->nccl);
  if (c->mpi != MPI_COMM_NULL)
    (void)MPI_Comm_free(&c->mpi); /* teardown: nothing to tell */
  g_free(c->members);
  g_free(c);
}

/* The communicator rank of a world rank (point-to-point communicators hold every rank). */
static int peer_rank(const struct exec_comm *c, uint32_t world) {
  struct exec_gpu_comm_rank r = exec_gpu_comm_rank(c->members, c->n_members, world);
  PIPER_ASSERT(r.member);
  return (int)r.rank;
}

static cudaStream_t stream_now(struct exec_comm *c) {
  return exec_cuda_stream(c->b, exec_cuda_current);
}

/* ---- host staging (ranks sharing a GPU) -------------------------------------------------------- */

static void *to_host_copy(struct exec_comm *c, const void *dev, size_t bytes, GError **err) {
  void *h = g_malloc(bytes ? bytes : 1);
  cudaStream_t cs = stream_now(c);
  if (bytes &&
      !(CUDA_CHECK(c->b, cudaMemcpyAsync(h, dev, bytes, cudaMemcpyDeviceToHost, cs), err) &&
        CUDA_CHECK(c->b, cudaStreamSynchronize(cs), err))) {
    g_free(h);
    return NULL;
  }
  return h;
}

static bool from_host_copy(struct exec_comm *c, void *dev, const void *h, size_t bytes,
                           GError **err) {
  return !bytes ||
         CUDA_CHECK(c->b, cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, stream_now(c)),
                    err);
}

/* A staged send in flight: its host copy lives until MPI is done with it. */
struct staged_send {
  MPI_Request req;
  void *host;
};

/* Frees the staged sends MPI has finished (all: waits for every one, at the end). */
static void staged_sends_settle(struct cuda_context *b, bool all) {
  for (guint i = 0; b->staged_sends && i < b->staged_sends->len;) {
    struct staged_send *x = &g_array_index(b->staged_sends, struct staged_send, i);
    int done = 0;
    /* a send whose test fails is left for the next settling (its host copy must outlive MPI's
     * use of it); the final settling waits, and frees it whatever the wait returns (MPI is
     * being torn down: nothing else could use it) */
    if (all)
      done = MPI_Wait(&x->req, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    else if (MPI_Test(&x->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      done = 0;
    if (!done && !all) {
      i++;
      continue;
    }
    g_free(x->host);
    g_array_remove_index_fast(b->staged_sends, i);
  }
}

/* Posts part k of a staged group: a send from a host copy of the device bytes (the stream is
 * waited for), or a receive into host memory. */
static bool staged_post(struct cuda_context *b, const struct exec_p2p_part *x, void **host,
                        MPI_Request *req, GError **err) {
  int peer = peer_rank(x->comm, x->peer_world_rank);
  if (x->is_send) {
    *host = to_host_copy(x->comm, x->buf, x->bytes, err);
    return *host &&
           MPI_CHECK(b, MPI_Isend(*host, (int)x->bytes, MPI_BYTE, peer, x->tag, x->comm->mpi, req),
                     err);
  }
  *host = g_malloc(x->bytes ? x->bytes : 1);
  return MPI_CHECK(b, MPI_Irecv(*host, (int)x->bytes, MPI_BYTE, peer, x->tag, x->comm->mpi, req),
                   err);
}

/* A staged group: every part posted nonblocking, then a wait for the receives only (mirrored
 * groups meet). Sends complete in the background: the host thread never blocks on a peer's
 * receive, which on one thread enqueueing every stream could wait for work of this rank
 * that is not enqueued yet. */
static bool staged_group(struct cuda_context *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err) {
  staged_sends_settle(b, false);
  void **host = g_new0(void *, n ? n : 1);
  MPI_Request *req = g_new(MPI_Request, n ? n : 1);
  bool ok = true;
  uint32_t posted = 0;
  while (posted < n && ok)
    if ((ok = staged_post(b, &parts[posted], &host[posted], &req[posted], err)))
      posted++;
  /* receives must complete before their buffers are read or freed */
  for (uint32_t k = 0; k < posted; k++)
    if (!parts[k].is_send) {
      bool w = MPI_CHECK(b, MPI_Wait(&req[k], MPI_STATUS_IGNORE), ok ? err : NULL);
      ok = ok && w && from_host_copy(parts[k].comm, parts[k].buf, host[k], parts[k].bytes, err);
    }
  if (!b->staged_sends)
    b->staged_sends = g_array_new(FALSE, FALSE, sizeof(struct staged_send));
  for (uint32_t k = 0; k < n; k++) {
    if (k < posted && parts[k].is_send) {
      struct staged_send x = {req[k], host[k]};
      g_array_append_val(b->staged_sends, x);
    } else {
      g_free(host[k]);
    }
  }
  g_free(host);
  g_free(req);
  return ok;
}

/* ---- point to point ---------------------------------------------------------------------------- */

bool exec_cuda_p2p_group(struct exec_backend *backend, const struct exec_p2p_part *parts,
                         uint32_t n, GError **err) {
  struct cuda_context *b = backend->context;
  for (uint32_t k = 0; k < n; k++)
    if (!parts[k].is_send)
      exec_cuda_written(b, parts[k].buf, parts[k].bytes);
  if (b->shared_gpu)
    return staged_group(b, parts, n, err);
  if (!NCCL_CHECK(b, ncclGroupStart(), err))
    return false;
  bool ok = true;
  for (uint32_t k = 0; k < n && ok; k++) {
    const struct exec_p2p_part *x = &parts[k];
    int peer = peer_rank(x->comm, x->peer_world_rank);
    cudaStream_t cs = stream_now(x->comm);
    ok = x->is_send
             ? NCCL_CHECK(b, ncclSend(x->buf, x->bytes, ncclInt8, peer, x->comm->nccl, cs), err)
             : NCCL_CHECK(b, ncclRecv(x->buf, x->bytes, ncclInt8, peer, x->comm->nccl, cs), err);
  }
  bool ended = NCCL_CHECK(b, ncclGroupEnd(), ok ? err : NULL);
  return ok && ended;
}

/* A group in flight: the side stream's event after its parts. */
struct exec_p2p_flight {
  cudaEvent_t done;
};

/* NCCL's group on the side stream, after the task stream's work so far (what it sends may have
 * just been written there); the task stream goes on at once. Host-staged, the group runs whole
 * here (nothing in flight). */
bool exec_cuda_p2p_start(struct exec_backend *backend, const struct exec_p2p_part *parts,
                         uint32_t n, struct exec_p2p_flight **out, GError **err) {
  struct cuda_context *b = backend->context;
  *out = NULL;
  if (b->shared_gpu || n == 0)
    return exec_cuda_p2p_group(backend, parts, n, err);
  cudaStream_t cs = stream_now(parts[0].comm);
  cudaEvent_t before = NULL, done = NULL;
  if (!b->p2p_side &&
      !CUDA_CHECK(b, cudaStreamCreateWithFlags(&b->p2p_side, cudaStreamNonBlocking), err))
    return false;
  if (!(CUDA_CHECK(b, cudaEventCreateWithFlags(&before, cudaEventDisableTiming), err) &&
        CUDA_CHECK(b, cudaEventCreateWithFlags(&done, cudaEventDisableTiming), err) &&
        CUDA_CHECK(b, cudaEventRecord(before, cs), err) &&
        CUDA_CHECK(b, cudaStreamWaitEvent(b->p2p_side, before, 0), err))) {
    if (before)
      cudaEventDestroy(before);
    if (done)
      cudaEventDestroy(done);
    return false;
  }
  cudaEventDestroy(before); /* released once recorded work completes */
  for (uint32_t k = 0; k < n; k++)
    if (!parts[k].is_send)
      exec_cuda_written(b, parts[k].buf, parts[k].bytes);
  bool ok = NCCL_CHECK(b, ncclGroupStart(), err);
  for (uint32_t k = 0; k < n && ok; k++) {
    const struct exec_p2p_part *x = &parts[k];
    int peer = peer_rank(x->comm, x->peer_world_rank);
    ok = x->is_send
             ? NCCL_CHECK(b, ncclSend(x->buf, x->bytes, ncclInt8, peer, x->comm->nccl, b->p2p_side),
                          err)
             : NCCL_CHECK(b, ncclRecv(x->buf, x->bytes, ncclInt8, peer, x->comm->nccl, b->p2p_side),
                          err);
  }
  bool ended = NCCL_CHECK(b, ncclGroupEnd(), ok ? err : NULL);
  ok = ok && ended && CUDA_CHECK(b, cudaEventRecord(done, b->p2p_side), err);
  if (!ok) {
    cudaEventDestroy(done);
    return false;
  }
  *out = g_new(struct exec_p2p_flight, 1);
  (*out)->done = done;
  return true;
}

/* The task stream's later work waits for the group. */
bool exec_cuda_p2p_finish(struct exec_backend *backend, struct exec_p2p_flight *f, GError **err) {
  struct cuda_context *b = backend->context;
  bool ok = CUDA_CHECK(b, cudaStreamWaitEvent(exec_cuda_stream(b, exec_cuda_current), f->done, 0),
                       err);
  cudaEventDestroy(f->done);
  g_free(f);
  return ok;
}

bool exec_cuda_send(struct exec_comm *c, uint32_t peer, const void *buf, size_t bytes, int tag,
                    GError **err) {
  struct exec_p2p_part part = {c, peer, true, (void *)buf, bytes, tag};
  return exec_cuda_p2p_group(c->b->backend, &part, 1, err);
}

bool exec_cuda_recv(struct exec_comm *c, uint32_t peer, void *buf, size_t bytes, int tag,
                    GError **err) {
  struct exec_p2p_part part = {c, peer, false, buf, bytes, tag};
  return exec_cuda_p2p_group(c->b->backend, &part, 1, err);
}

/* ---- collectives ------------------------------------------------------------------------------- */

bool exec_cuda_all_reduce_f32(struct exec_comm *c, float *buf, size_t n, GError **err) {
  struct cuda_context *b = c->b;
  exec_cuda_written(b, buf, n * sizeof(float));
  if (!b->shared_gpu)
    return NCCL_CHECK(b, ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c->nccl, stream_now(c)),
                      err);
  float *h = to_host_copy(c, buf, n * sizeof(float), err);
  bool ok = h &&
            MPI_CHECK(b, MPI_Allreduce(MPI_IN_PLACE, h, (int)n, MPI_FLOAT, MPI_SUM, c->mpi), err) &&
            from_host_copy(c, buf, h, n * sizeof(float), err);
  g_free(h);
  return ok;
}

bool exec_cuda_reduce_scatter_f32(struct exec_comm *c, const float *in, float *out,
                                  size_t n_per_rank, GError **err) {
  struct cuda_context *b = c->b;
  exec_cuda_written(b, out, n_per_rank * sizeof(float));
  if (!b->shared_gpu)
    return NCCL_CHECK(
        b, ncclReduceScatter(in, out, n_per_rank, ncclFloat, ncclSum, c->nccl, stream_now(c)), err);
  float *h = to_host_copy(c, in, n_per_rank * c->n_members * sizeof(float), err);
  float *mine = g_new(float, n_per_rank ? n_per_rank : 1);
  bool ok =
      h &&
      MPI_CHECK(b, MPI_Reduce_scatter_block(h, mine, (int)n_per_rank, MPI_FLOAT, MPI_SUM, c->mpi),
                err) &&
      from_host_copy(c, out, mine, n_per_rank * sizeof(float), err);
  g_free(h);
  g_free(mine);
  return ok;
}

bool exec_cuda_all_gather(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                          GError **err) {
  struct cuda_context *b = c->b;
  /* ZeRO's gather of updated weights into the store: their bf16 copies go stale */
  exec_cuda_written(b, out, bytes_per_rank * c->n_members);
  if (!b->shared_gpu)
    return NCCL_CHECK(b, ncclAllGather(in, out, bytes_per_rank, ncclInt8, c->nccl, stream_now(c)),
                      err);
  void *h = to_host_copy(c, in, bytes_per_rank, err);
  char *all = g_malloc(bytes_per_rank * c->n_members + 1);
  bool ok = h &&
            MPI_CHECK(b,
                      MPI_Allgather(h, (int)bytes_per_rank, MPI_BYTE, all, (int)bytes_per_rank,
                                    MPI_BYTE, c->mpi),
                      err) &&
            from_host_copy(c, out, all, bytes_per_rank * c->n_members, err);
  g_free(h);
  g_free(all);
  return ok;
}

/* Host memory both ways (the expert-parallel counts): MPI on the members' communicator. */
bool exec_cuda_all_to_all_i32(struct exec_comm *c, const int32_t *in, int32_t *out, GError **err) {
  if (!c->b->mpi) {
    out[0] = in[0];
    return true;
  }
  return MPI_CHECK(c->b, MPI_Alltoall(in, 1, MPI_INT32_T, out, 1, MPI_INT32_T, c->mpi), err);
}

/* Variable counts: one NCCL group of a send and a receive per member (NCCL has no
 * all-to-all-v), on the running task's stream. */
bool exec_cuda_all_to_all_v(struct exec_comm *c, const void *in, const size_t *send_bytes,
                            void *out, const size_t *recv_bytes, GError **err) {
  struct exec_p2p_part *parts = g_new(struct exec_p2p_part, 2 * c->n_members);
  size_t so = 0, ro = 0;
  uint32_t n = 0;
  for (uint32_t k = 0; k < c->n_members; k++) {
    parts[n++] = (struct exec_p2p_part){c, c->members[k], true, (char *)in + so, send_bytes[k], 0};
    parts[n++] =
        (struct exec_p2p_part){c, c->members[k], false, (char *)out + ro, recv_bytes[k], 0};
    so += send_bytes[k];
    ro += recv_bytes[k];
  }
  bool ok = exec_cuda_p2p_group(c->b->backend, parts, n, err);
  g_free(parts);
  return ok;
}

/* ---- job-wide, host memory --------------------------------------------------------------------- */

bool exec_cuda_world_all_reduce_f64(struct exec_backend *backend, double *buf, size_t n,
                                    enum exec_reduce_op op, GError **err) {
  struct cuda_context *b = backend->context;
  if (!b->mpi)
    return true;
  MPI_Op mop = op == EXEC_REDUCE_SUM ? MPI_SUM : op == EXEC_REDUCE_MAX ? MPI_MAX : MPI_MIN;
  return MPI_CHECK(b, MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, mop, b->job),
                   err);
}

bool exec_cuda_world_gather(struct exec_backend *backend, const void *in, size_t bytes, void **out,
                            size_t **out_sizes, GError **err) {
  struct cuda_context *b = backend->context;
  *out = NULL;
  *out_sizes = NULL;
  if (!b->mpi) {
    *out = g_memdup2(in, bytes);
    *out_sizes = g_new(size_t, 1);
    (*out_sizes)[0] = bytes;
    return true;
  }
  uint64_t mine = bytes;
  uint64_t *sizes = b->rank == 0 ? g_new(uint64_t, b->size) : NULL;
  int *counts = b->rank == 0 ? g_new(int, 2 * (size_t)b->size) : NULL;
  int *displs = counts ? counts + b->size : NULL;
  bool ok =
      MPI_CHECK(b, MPI_Gather(&mine, 1, MPI_UINT64_T, sizes, 1, MPI_UINT64_T, 0, b->job), err);
  size_t total = 0;
  /* only rank 0 has the sizes (and judges them); the others send theirs regardless */
  ok = ok &&
       (b->rank != 0 || exec_world_gather_layout(sizes, b->size, counts, displs, &total, err));
  char *all = b->rank == 0 ? g_malloc(total + 1) : NULL;
  ok = ok && MPI_CHECK(b,
                       MPI_Gatherv(in, (int)bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, 0,
                                   b->job),
                       err);
  if (ok && b->rank == 0) {
    *out = all;
    *out_sizes = g_new(size_t, b->size);
    for (uint32_t r = 0; r < b->size; r++)
      (*out_sizes)[r] = (size_t)sizes[r];
  } else {
    g_free(all);
  }
  g_free(sizes);
  g_free(counts);
  return ok;
}

bool exec_cuda_world_broadcast(struct exec_backend *backend, void *buf, size_t bytes,
                               GError **err) {
  struct cuda_context *b = backend->context;
  return !b->mpi || MPI_CHECK(b, MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, b->job), err);
}
