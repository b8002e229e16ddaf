/* nccl: include/nccl.h's calls over MPI (tests/gpu/emu/README.md). A unique id names its
 * maker's world rank and a count; the members of a new communicator send their world ranks
 * to that maker, which answers with the table, and MPI_Comm_create_group (collective over
 * the members only, as ncclCommInitRank) makes the MPI communicator, ranks in NCCL's order.
 * Operations run when called (the stream runs at enqueue): a send copies its bytes and
 * completes in the background (so a rank never blocks on a peer that first waits for this
 * rank's later work), a receive or collective waits; a group posts every part, then waits
 * for its receives. */
#include <glib.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "emu.h"

struct emu_nccl_comm {
  MPI_Comm mpi;
  int rank, size;
};

struct pending_send {
  MPI_Request req;
  void *copy;
};

struct part {
  bool send;
  void *buf;
  size_t bytes;
  int peer;
  ncclComm_t comm;
  cudaStream_t stream;
};

static GMutex sends_lock; /* streams post sends from their threads (emu.h) */
static GArray *sends;  /* struct pending_send */
static GArray *group;  /* struct part, between ncclGroupStart and ncclGroupEnd */
static int group_depth;
static int ids_made;
enum { ID_TAG = 27000 }; /* the set-up messages: ID_TAG + 2 (count % 2000), + 1 the answer */

static const char magic[8] = "piperemu";

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error (emulation: an MPI call failed)";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  }
  return "unknown result";
}

static size_t type_bytes(ncclDataType_t t) {
  return t == ncclFloat ? 4 : 1;
}

/* Frees the buffered sends MPI has finished; all: waits for every one. */
static void settle(bool all) {
  g_mutex_lock(&sends_lock);
  for (guint i = 0; sends && i < sends->len;) {
    struct pending_send *s = &g_array_index(sends, struct pending_send, i);
    int done = 0;
    if (all)
      done = MPI_Wait(&s->req, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    else
      MPI_Test(&s->req, &done, MPI_STATUS_IGNORE);
    if (!done) {
      i++;
      continue;
    }
    g_free(s->copy);
    g_array_remove_index_fast(sends, i);
  }
  g_mutex_unlock(&sends_lock);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, magic, sizeof magic);
  int fields[2] = {world, ids_made++};
  memcpy(id->internal + sizeof magic, fields, sizeof fields);
  return ncclSuccess;
}

/* The members' world ranks in communicator order, gathered at the id's maker. */
static bool member_table(int *table, int nranks, int rank, int maker, int tag) {
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  if (rank != 0) {
    int mine[2] = {rank, world};
    return MPI_Send(mine, 2, MPI_INT, maker, tag, MPI_COMM_WORLD) == MPI_SUCCESS &&
           MPI_Recv(table, nranks, MPI_INT, maker, tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE) ==
               MPI_SUCCESS;
  }
  if (world != maker)
    return false; /* NCCL: the id's maker is the communicator's rank 0 here */
  table[0] = world;
  for (int k = 1; k < nranks; k++) {
    int got[2];
    if (MPI_Recv(got, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS ||
        got[0] <= 0 || got[0] >= nranks)
      return false;
    table[got[0]] = got[1];
  }
  for (int k = 1; k < nranks; k++)
    if (MPI_Send(table, nranks, MPI_INT, table[k], tag + 1, MPI_COMM_WORLD) != MPI_SUCCESS)
      return false;
  return true;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.internal, magic, sizeof magic) != 0 ||
      (config && config->maxCTAs < 0))
    return ncclInvalidArgument;
  int fields[2];
  memcpy(fields, id.internal + sizeof magic, sizeof fields);
  int tag = ID_TAG + 2 * (fields[1] % 2000);
  int *table = g_new0(int, nranks);
  MPI_Group world_group, members;
  MPI_Comm mpi = MPI_COMM_NULL;
  bool ok = member_table(table, nranks, rank, fields[0], tag) &&
            MPI_Comm_group(MPI_COMM_WORLD, &world_group) == MPI_SUCCESS &&
            MPI_Group_incl(world_group, nranks, table, &members) == MPI_SUCCESS &&
            MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &mpi) == MPI_SUCCESS;
  g_free(table);
  if (!ok)
    return ncclSystemError;
  MPI_Group_free(&members);
  MPI_Group_free(&world_group);
  *comm = g_new0(struct emu_nccl_comm, 1);
  (*comm)->mpi = mpi;
  (*comm)->rank = rank;
  (*comm)->size = nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm)
    return ncclInvalidArgument;
  cudaDeviceSynchronize(); /* what the streams still hold for it */
  settle(true);
  MPI_Comm_free(&comm->mpi);
  g_free(comm);
  return ncclSuccess;
}

static ncclResult_t post_send(const struct part *p) {
  struct pending_send s = {MPI_REQUEST_NULL, g_memdup2(p->buf, p->bytes ? p->bytes : 1)};
  if (MPI_Isend(s.copy, (int)p->bytes, MPI_BYTE, p->peer, 0, p->comm->mpi, &s.req) !=
      MPI_SUCCESS) {
    g_free(s.copy);
    return ncclSystemError;
  }
  g_mutex_lock(&sends_lock);
  if (!sends)
    sends = g_array_new(FALSE, FALSE, sizeof(struct pending_send));
  g_array_append_val(sends, s);
  g_mutex_unlock(&sends_lock);
  return ncclSuccess;
}

/* Posts every part (sends buffered), then waits for the receives. */
static ncclResult_t run_parts(const struct part *parts, guint n) {
  settle(false);
  MPI_Request *recv = g_new(MPI_Request, n ? n : 1);
  ncclResult_t r = ncclSuccess;
  guint posted = 0;
  for (guint i = 0; i < n && r == ncclSuccess; i++) {
    const struct part *p = &parts[i];
    if (p->send)
      r = post_send(p);
    else if (MPI_Irecv(p->buf, (int)p->bytes, MPI_BYTE, p->peer, 0, p->comm->mpi,
                       &recv[posted++]) != MPI_SUCCESS)
      r = ncclSystemError;
  }
  if (MPI_Waitall((int)posted, recv, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
    r = ncclSystemError;
  g_free(recv);
  return r;
}

/* Parts enqueued on their stream: they run there, in its order (emu.h). An operation failing
 * on a stream's thread has no caller to tell (NCCL reports such errors asynchronously): the
 * emulation says so and aborts. */
struct parts_work {
  guint n;
  struct part parts[];
};

static void must(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) {
    fprintf(stderr, "emu: %s: %s\n", what, ncclGetErrorString(r));
    abort();
  }
}

static void parts_run(void *arg) {
  struct parts_work *w = arg;
  must(run_parts(w->parts, w->n), "NCCL send/receive");
  g_free(w);
}

static ncclResult_t enqueue_parts(const struct part *parts, guint n) {
  if (!n)
    return ncclSuccess;
  for (guint i = 1; i < n; i++)
    if (parts[i].stream != parts[0].stream)
      return ncclInvalidUsage; /* the backend groups one stream's parts */
  if (!parts[0].stream || !emu_async())
    return run_parts(parts, n);
  struct parts_work *w = g_malloc(sizeof *w + n * sizeof *parts);
  w->n = n;
  memcpy(w->parts, parts, n * sizeof *parts);
  emu_enqueue(parts[0].stream, parts_run, w);
  return ncclSuccess;
}

static ncclResult_t point_to_point(bool send, void *buf, size_t count, ncclDataType_t type,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  if (!comm || peer < 0 || peer >= comm->size)
    return ncclInvalidArgument;
  struct part p = {send, buf, count * type_bytes(type), peer, comm, stream};
  emu_check_device(buf, p.bytes, send ? "ncclSend buffer" : "ncclRecv buffer");
  if (group_depth == 0)
    return enqueue_parts(&p, 1);
  g_array_append_val(group, p);
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  if (!group)
    group = g_array_new(FALSE, FALSE, sizeof(struct part));
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0)
    return ncclInvalidUsage;
  if (--group_depth > 0)
    return ncclSuccess;
  ncclResult_t r = enqueue_parts((const struct part *)(void *)group->data, group->len);
  g_array_set_size(group, 0);
  return r;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(true, (void *)buf, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point(false, buf, count, type, peer, comm, stream);
}

/* A collective, checked when called and run in its stream's order: its input copied first
 * (NCCL allows in-place forms MPI spells differently), then the MPI call on the members'
 * communicator. Not inside a group (the backend groups only point-to-point). */
enum coll_kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER };
struct coll_work {
  enum coll_kind kind;
  const void *in;
  void *out;
  size_t count, in_bytes; /* count: floats (reductions) or bytes (gather) per rank */
  ncclComm_t comm;
};

static void coll_run(void *arg) {
  struct coll_work *w = arg;
  settle(false);
  void *copy = g_memdup2(w->in, w->in_bytes ? w->in_bytes : 1);
  MPI_Comm mc = w->comm->mpi;
  int n = (int)w->count, rc;
  if (w->kind == ALL_REDUCE)
    rc = MPI_Allreduce(copy, w->out, n, MPI_FLOAT, MPI_SUM, mc);
  else if (w->kind == REDUCE_SCATTER)
    rc = MPI_Reduce_scatter_block(copy, w->out, n, MPI_FLOAT, MPI_SUM, mc);
  else
    rc = MPI_Allgather(copy, n, MPI_BYTE, w->out, n, MPI_BYTE, mc);
  g_free(copy);
  must(rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError, "NCCL collective");
  g_free(w);
}

static ncclResult_t collective(enum coll_kind kind, const void *in, void *out, size_t count,
                               size_t in_bytes, size_t out_bytes, ncclComm_t comm,
                               cudaStream_t stream) {
  if (!comm)
    return ncclInvalidArgument;
  if (group_depth > 0)
    return ncclInvalidUsage;
  emu_check_device(in, in_bytes, "NCCL collective input");
  emu_check_device(out, out_bytes, "NCCL collective output");
  struct coll_work *w = g_new(struct coll_work, 1);
  *w = (struct coll_work){kind, in, out, count, in_bytes, comm};
  emu_enqueue(stream, coll_run, w);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *in, void *out, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat || op != ncclSum)
    return ncclInvalidArgument;
  return collective(ALL_REDUCE, in, out, count, count * 4, count * 4, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *in, void *out, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat || op != ncclSum || !comm)
    return ncclInvalidArgument;
  return collective(REDUCE_SCATTER, in, out, count, count * 4 * (size_t)comm->size, count * 4,
                    comm, stream);
}

ncclResult_t ncclAllGather(const void *in, void *out, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  size_t bytes = count * type_bytes(type);
  if (!comm)
    return ncclInvalidArgument;
  return collective(ALL_GATHER, in, out, bytes, bytes, bytes * (size_t)comm->size, comm, stream);
}
