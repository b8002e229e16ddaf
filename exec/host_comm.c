/* host_comm: the host backend's communication. Under an MPI launcher (mpirun, srun): one
 * process per device (rank = device), communicators split per purpose and stream, and every
 * operation of the plan nonblocking (Isend/Irecv, Iallreduce, Ireduce_scatter_block,
 * Iallgather, Ialltoall(v)): posted, then handed to the event loop (exec_host_wait), which
 * tests it between compute tasks and, on a cancel, cancels or completes it before its task
 * unwinds. A process started alone (or a build without MPI) runs one device without MPI:
 * communicators of one member only. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/json.h"
#include "host-impl.h"

#ifdef HAVE_MPI
#include <mpi.h>
#endif

struct host_world {
  bool mpi; /* false: one process, local communicators */
#ifdef HAVE_MPI
  MPI_Comm control; /* job-wide operations outside the plan */
  bool finalize;    /* we initialised MPI, so we finalise it */
  char library[128];
#endif
};

struct exec_comm {
  struct host_context *b;
  char label[64];
  bool local; /* one member: this process */
#ifdef HAVE_MPI
  MPI_Comm comm;
  uint32_t size, rank;
  uint32_t *members; /* world rank of each comm rank */
#endif
};

/* ---- one process ------------------------------------------------------------------------- */

static bool local_comm_init(struct host_context *b, const struct exec_backend_params *p,
                            GError **err) {
  (void)p;
  (void)err;
  b->rank = 0;
  b->size = 1;
  b->world->mpi = false;
  return true;
}

static bool local_comm_barrier(struct host_context *b, GError **err) {
  (void)b, (void)err;
  return true;
}
static void local_comm_finalize(struct host_context *b) {
  (void)b;
}
static void local_comm_abort(struct host_context *b, int code) {
  (void)b;
  (void)code;
}
static const char *local_comm_library(struct host_context *b) {
  (void)b;
#ifdef HAVE_MPI
  return "one process, no MPI";
#else
  return "one process (built without MPI)";
#endif
}

static struct exec_comm *local_comm_create(struct host_context *b, const char *label,
                                           const uint32_t *members, uint32_t n_members,
                                           bool point_to_point, GError **err) {
  (void)point_to_point;
  if (n_members != 1 || members[0] != 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "%s spans %u devices but this process runs alone (launch with mpirun or srun)",
                label, n_members);
    return NULL;
  }
  struct exec_comm *c = g_new0(struct exec_comm, 1);
  c->b = b;
  c->local = true;
  g_strlcpy(c->label, label, sizeof c->label);
  return c;
}

static void local_comm_destroy(struct exec_comm *c) {
  g_free(c);
}

static bool no_peer(struct exec_comm *c, GError **err) {
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
              "%s: point-to-point needs another process (launch with mpirun or srun)", c->label);
  return false;
}

/* A transfer with itself (no plan has one; the runner's stall injection does): like MPI's
 * unmatched receive it waits until cancelled, and nothing is in flight to stop. */
static enum host_pending_state never_test(struct host_pending *p, GError **err) {
  (void)p, (void)err;
  return HOST_PENDING_WAITING;
}
static bool never_cancel(struct host_pending *p) {
  (void)p;
  return true;
}

static bool local_transfer(struct exec_comm *c, bool is_send, uint32_t peer, GError **err) {
  if (peer != 0)
    return no_peer(c, err);
  struct host_pending p = {never_test, never_cancel, ""};
  g_snprintf(p.what, sizeof p.what, "%s rank 0 on %s", is_send ? "send to" : "receive from",
             c->label);
  return exec_host_wait(c->b, &p, err);
}

static bool local_send(struct exec_comm *c, uint32_t peer, const void *buf, size_t bytes, int tag,
                       GError **err) {
  (void)buf, (void)bytes, (void)tag;
  return local_transfer(c, true, peer, err);
}

static bool local_recv(struct exec_comm *c, uint32_t peer, void *buf, size_t bytes, int tag,
                       GError **err) {
  (void)buf, (void)bytes, (void)tag;
  return local_transfer(c, false, peer, err);
}

static bool local_all_reduce_f32(struct exec_comm *c, float *buf, size_t n, GError **err) {
  (void)c, (void)buf, (void)n, (void)err;
  return true;
}

static bool local_reduce_scatter_f32(struct exec_comm *c, const float *in, float *out,
                                     size_t n_per_rank, GError **err) {
  (void)c, (void)err;
  memmove(out, in, n_per_rank * sizeof(float));
  return true;
}

static bool local_all_gather(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                             GError **err) {
  (void)c, (void)err;
  if (in != out)
    memmove(out, in, bytes_per_rank);
  return true;
}

static bool local_all_to_all_i32(struct exec_comm *c, const int32_t *in, int32_t *out,
                                 GError **err) {
  (void)c, (void)err;
  out[0] = in[0];
  return true;
}

static bool local_all_to_all_v(struct exec_comm *c, const void *in, const size_t *send_bytes,
                               void *out, const size_t *recv_bytes, GError **err) {
  (void)c, (void)err, (void)recv_bytes;
  memmove(out, in, send_bytes[0]);
  return true;
}

static bool local_world_all_reduce_f64(struct host_context *b, double *buf, size_t n,
                                       enum exec_reduce_op op, GError **err) {
  (void)b, (void)buf, (void)n, (void)op, (void)err;
  return true;
}

static bool local_world_gather(struct host_context *b, const void *in, size_t bytes, void **out,
                               size_t **out_sizes, GError **err) {
  (void)b, (void)err;
  *out = g_memdup2(in, bytes ? bytes : 1);
  *out_sizes = g_new(size_t, 1);
  (*out_sizes)[0] = bytes;
  return true;
}

static bool local_world_broadcast(struct host_context *b, void *buf, size_t bytes, GError **err) {
  (void)b, (void)buf, (void)bytes, (void)err;
  return true;
}

#ifdef HAVE_MPI
/* ---- MPI ------------------------------------------------------------------------------- */

/* MPI's text for code rc (its code when MPI cannot say). */
static void mpi_error_text(int rc, char msg[MPI_MAX_ERROR_STRING]) {
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    g_snprintf(msg, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
}

static bool mpi_fail(GError **err, struct host_context *b, const char *label, const char *what,
                     int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  mpi_error_text(rc, msg);
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
              "rank %u: %s on %s failed: %s (a peer may have died)", b->rank, what, label, msg);
  return false;
}

/* Posted requests, as the event loop sees them. */
struct mpi_pending {
  struct host_pending base;
  struct host_context *b;
  int n;
  MPI_Request *reqs;
  bool cancellable; /* point-to-point: MPI_Cancel applies (not to collectives) */
};

static enum host_pending_state mpi_test(struct host_pending *p, GError **err) {
  struct mpi_pending *m = (struct mpi_pending *)p;
  int flag = 0;
  int rc = MPI_Testall(m->n, m->reqs, &flag, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    mpi_error_text(rc, msg);
    piper_runtime_error(err, "rank %u: %s failed: %s (a peer may have died)", m->b->rank,
                        p->what, msg);
    return HOST_PENDING_FAILED;
  }
  return flag ? HOST_PENDING_DONE : HOST_PENDING_WAITING;
}

/* How long a cancel waits for requests to settle: a cancelled receive that nothing matched
 * settles at once; a collective or send whose peers are alive finishes within it. */
#define CANCEL_GRACE_S 0.5

static bool mpi_cancel(struct host_pending *p) {
  struct mpi_pending *m = (struct mpi_pending *)p;
  if (m->cancellable)
    for (int i = 0; i < m->n; i++)
      if (m->reqs[i] != MPI_REQUEST_NULL)
        (void)MPI_Cancel(&m->reqs[i]); /* a request that cannot be cancelled completes */
  double until = piper_clock_seconds() + CANCEL_GRACE_S;
  for (;;) {
    int flag = 0;
    if (MPI_Testall(m->n, m->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      return false; /* state unknown: keep what it may touch */
    if (flag)
      return true;
    if (piper_clock_seconds() > until)
      return false;
    sched_yield();
  }
}

/* Hands posted requests to the event loop until they complete; false on an MPI error or a
 * cancel. */
static bool wait_requests(struct host_context *b, const char *label, const char *what, int n,
                          MPI_Request *reqs, bool cancellable, GError **err) {
  struct mpi_pending m = {{mpi_test, mpi_cancel, ""}, b, n, reqs, cancellable};
  g_snprintf(m.base.what, sizeof m.base.what, "%s on %s", what, label);
  return exec_host_wait(b, &m.base, err);
}

/* MPI's code rc as an error naming the call, on this rank; false (for returns). */
static bool mpi_call_fail(GError **err, const char *call, int rank, int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  mpi_error_text(rc, msg);
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "rank %d: %s failed: %s", rank, call, msg);
  return false;
}

/* Every MPI call of the world's set-up is checked (MPI_ERRORS_RETURN is set first thing). */
#define MPI_CHECK(call, rank)                                                                      \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != MPI_SUCCESS)                                                                        \
      return mpi_call_fail(err, #call, rank, rc_);                                                 \
  } while (0)

/* Starts MPI where the launcher has not (with full thread support: the watchdog thread ends
 * the job while the event loop may be inside MPI). */
static bool mpi_start(struct host_context *b, const struct exec_backend_params *p, int *provided,
                      GError **err) {
  int inited = 0;
  MPI_CHECK(MPI_Initialized(&inited), -1);
  if (inited) {
    MPI_CHECK(MPI_Query_thread(provided), -1);
    return true;
  }
  int rc = MPI_Init_thread(p ? p->argc : NULL, p ? p->argv : NULL, MPI_THREAD_MULTIPLE, provided);
  if (rc != MPI_SUCCESS) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "MPI_Init_thread failed (code %d)", rc);
    return false;
  }
  b->world->finalize = true;
  return true;
}

/* The job's communicator (control), a duplicate of the world that reports errors: every
 * communicator of the backend derives from it. */
static bool mpi_comm_init(struct host_context *b, const struct exec_backend_params *p,
                          GError **err) {
  b->world->mpi = true;
  b->world->control = MPI_COMM_NULL;
  int provided = 0;
  if (!mpi_start(b, p, &provided, err))
    return false;
  if (provided < MPI_THREAD_MULTIPLE) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "the MPI library provides thread level %d, but piper-exec needs "
                "MPI_THREAD_MULTIPLE (%d): its watchdog thread ends the job (MPI_Abort) while "
                "the event loop may be inside MPI; use an MPI built with thread support",
                provided, MPI_THREAD_MULTIPLE);
    if (b->world->finalize)
      (void)MPI_Finalize(); /* failing already: the thread level is the error */
    return false;
  }
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), -1);
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &b->world->control), -1);
  MPI_CHECK(MPI_Comm_set_errhandler(b->world->control, MPI_ERRORS_RETURN), -1);
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(b->world->control, &rank), -1);
  MPI_CHECK(MPI_Comm_size(b->world->control, &size), rank);
  b->rank = (uint32_t)rank;
  b->size = (uint32_t)size;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_CHECK(MPI_Get_library_version(lib, &len), rank);
  char *nl = strchr(lib, '\n');
  if (nl)
    *nl = 0;
  char *comma = strchr(lib, ',');
  if (comma)
    *comma = 0;
  g_snprintf(b->world->library, sizeof b->world->library, "MPI (%s)", lib);
  return true;
}

static bool mpi_comm_barrier(struct host_context *b, GError **err) {
  int rc = MPI_Barrier(b->world->control);
  return rc == MPI_SUCCESS || mpi_fail(err, b, "the job", "barrier", rc);
}

/* Teardown has no caller to tell: a failure here (a peer gone) changes nothing that follows,
 * and MPI_Finalize is still due. */
static void mpi_comm_finalize(struct host_context *b) {
  if (b->world->control != MPI_COMM_NULL)
    (void)MPI_Comm_free(&b->world->control);
  if (b->world->finalize)
    (void)MPI_Finalize();
}

/* Ends every process of the job (MPI_Abort returns only if it fails: then the caller exits). */
static void mpi_comm_abort(struct host_context *b, int code) {
  (void)MPI_Abort(b->world->control != MPI_COMM_NULL ? b->world->control : MPI_COMM_WORLD, code);
}

static const char *mpi_comm_library(struct host_context *b) {
  return b->world->library;
}

static struct exec_comm *mpi_comm_create(struct host_context *b, const char *label,
                                         const uint32_t *members, uint32_t n_members,
                                         bool point_to_point, GError **err) {
  MPI_Comm comm = MPI_COMM_NULL;
  int pos = -1;
  for (uint32_t i = 0; i < n_members; i++)
    if (members[i] == b->rank)
      pos = (int)i;
  int rc;
  if (point_to_point)
    rc = MPI_Comm_dup(b->world->control, &comm); /* every rank is in it: peers are job ranks */
  else
    rc = MPI_Comm_split(b->world->control, pos >= 0 ? 0 : MPI_UNDEFINED, pos, &comm);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, b, label, "creating the communicator", rc), NULL;
  if (comm == MPI_COMM_NULL)
    return NULL;
  if (point_to_point)
    pos = (int)b->rank;
  int size = 0; /* errors already return on comm: it inherits the handler of control */
  if ((rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS) {
    (void)MPI_Comm_free(&comm);
    return mpi_fail(err, b, label, "creating the communicator", rc), NULL;
  }
  struct exec_comm *c = g_new0(struct exec_comm, 1);
  c->b = b;
  c->local = false;
  c->comm = comm;
  c->size = (uint32_t)size;
  c->rank = (uint32_t)pos;
  c->members = g_new(uint32_t, c->size);
  if (point_to_point)
    for (uint32_t i = 0; i < c->size; i++)
      c->members[i] = i;
  else
    memcpy(c->members, members, c->size * sizeof(uint32_t));
  g_strlcpy(c->label, label, sizeof c->label);
  return c;
}

static void mpi_comm_destroy(struct exec_comm *c) {
  if (!c)
    return;
  (void)MPI_Comm_free(&c->comm); /* teardown: a peer's failure changes nothing here */
  g_free(c->members);
  g_free(c);
}

static int comm_rank_of(const struct exec_comm *c, uint32_t world_rank) {
  for (uint32_t i = 0; i < c->size; i++)
    if (c->members[i] == world_rank)
      return (int)i;
  return -1;
}

/* Messages above INT_MAX bytes go in pieces (MPI counts are int); order is kept. */
#define CHUNK ((size_t)1 << 30)

static bool p2p(struct exec_comm *c, bool is_send, uint32_t peer, void *buf, size_t bytes, int tag,
                GError **err) {
  int r = comm_rank_of(c, peer);
  if (r < 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "rank %u: rank %u is not in %s", c->b->rank,
                peer, c->label);
    return false;
  }
  char what[64];
  g_snprintf(what, sizeof what, "%s rank %u", is_send ? "send to" : "receive from", peer);
  size_t off = 0;
  do {
    size_t n = bytes - off < CHUNK ? bytes - off : CHUNK;
    MPI_Request req;
    int rc = is_send ? MPI_Isend((char *)buf + off, (int)n, MPI_BYTE, r, tag, c->comm, &req)
                     : MPI_Irecv((char *)buf + off, (int)n, MPI_BYTE, r, tag, c->comm, &req);
    if (rc != MPI_SUCCESS)
      return mpi_fail(err, c->b, c->label, what, rc);
    if (!wait_requests(c->b, c->label, what, 1, &req, true, err))
      return false;
    off += n;
  } while (off < bytes);
  return true;
}

static bool mpi_send(struct exec_comm *c, uint32_t peer, const void *buf, size_t bytes, int tag,
                     GError **err) {
  return p2p(c, true, peer, (void *)buf, bytes, tag, err);
}

static bool mpi_recv(struct exec_comm *c, uint32_t peer, void *buf, size_t bytes, int tag,
                     GError **err) {
  return p2p(c, false, peer, buf, bytes, tag, err);
}

/* Posts one part of a group (in pieces of CHUNK) onto reqs. */
static bool post_part(const struct exec_p2p_part *x, GArray *reqs, GError **err) {
  struct exec_comm *c = x->comm;
  int r = comm_rank_of(c, x->peer_world_rank);
  if (r < 0)
    return piper_runtime_error(err, "rank %u: rank %u is not in %s", c->b->rank, x->peer_world_rank,
                               c->label);
  size_t off = 0;
  do {
    size_t n = x->bytes - off < CHUNK ? x->bytes - off : CHUNK;
    char *buf = (char *)x->buf + off;
    MPI_Request req;
    int rc = x->is_send ? MPI_Isend(buf, (int)n, MPI_BYTE, r, x->tag, c->comm, &req)
                        : MPI_Irecv(buf, (int)n, MPI_BYTE, r, x->tag, c->comm, &req);
    if (rc != MPI_SUCCESS)
      return mpi_fail(err, c->b, c->label, x->is_send ? "send (group)" : "receive (group)", rc);
    g_array_append_val(reqs, req);
    off += n;
  } while (off < x->bytes);
  return true;
}

/* A group: every part posted, then one wait for all their requests, so the task suspends
 * once and the parts progress together (none waits on another's peer). A part that cannot be
 * posted cancels those posted before it. */
static bool mpi_p2p_group(struct host_context *b, const struct exec_p2p_part *parts, uint32_t n,
                          GError **err) {
  GArray *reqs = g_array_new(FALSE, FALSE, sizeof(MPI_Request));
  char what[96];
  g_snprintf(what, sizeof what, "group of %u (first: %s rank %u)", n,
             parts[0].is_send ? "send to" : "receive from", parts[0].peer_world_rank);
  bool ok = true;
  for (uint32_t k = 0; k < n && ok; k++)
    ok = post_part(&parts[k], reqs, err);
  if (ok) {
    ok = wait_requests(b, parts[0].comm->label, what, (int)reqs->len, (MPI_Request *)reqs->data,
                       true, err);
  } else if (reqs->len) {
    struct mpi_pending m = {
        {mpi_test, mpi_cancel, ""}, b, (int)reqs->len, (MPI_Request *)reqs->data, true};
    mpi_cancel(&m.base);
  }
  g_array_free(reqs, TRUE);
  return ok;
}

/* A group in flight (exec_host_p2p_start): its posted requests, waited for at finish. */
struct exec_p2p_flight {
  struct host_context *b;
  GArray *reqs; /* MPI_Request */
  char label[64], what[96];
};

/* Every part posted, nothing waited for: the caller's work runs while they are in flight (a
 * peer's matching part may progress only when this rank next calls MPI: at finish, or
 * sooner where the transport moves data on its own). */
static bool mpi_p2p_start(struct host_context *b, const struct exec_p2p_part *parts, uint32_t n,
                          struct exec_p2p_flight **out, GError **err) {
  struct exec_p2p_flight *f = g_new0(struct exec_p2p_flight, 1);
  f->b = b;
  f->reqs = g_array_new(FALSE, FALSE, sizeof(MPI_Request));
  g_strlcpy(f->label, parts[0].comm->label, sizeof f->label);
  g_snprintf(f->what, sizeof f->what, "group of %u in flight (first: %s rank %u)", n,
             parts[0].is_send ? "send to" : "receive from", parts[0].peer_world_rank);
  bool ok = true;
  for (uint32_t k = 0; k < n && ok; k++)
    ok = post_part(&parts[k], f->reqs, err);
  if (!ok) { /* cancel what was posted: nothing stays in flight */
    struct mpi_pending m = {
        {mpi_test, mpi_cancel, ""}, b, (int)f->reqs->len, (MPI_Request *)f->reqs->data, true};
    if (f->reqs->len)
      mpi_cancel(&m.base);
    g_array_free(f->reqs, TRUE);
    g_free(f);
    return false;
  }
  *out = f;
  return true;
}

static bool mpi_p2p_finish(struct exec_p2p_flight *f, GError **err) {
  bool ok = wait_requests(f->b, f->label, f->what, (int)f->reqs->len,
                          (MPI_Request *)f->reqs->data, true, err);
  g_array_free(f->reqs, TRUE);
  g_free(f);
  return ok;
}

static bool too_big(struct exec_comm *c, size_t n, const char *what, GError **err) {
  if (n <= INT_MAX)
    return false;
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
              "rank %u: %s on %s: %zu elements exceed "
              "what one MPI call takes",
              c->b->rank, what, c->label, n);
  return true;
}

static bool mpi_all_reduce_f32(struct exec_comm *c, float *buf, size_t n, GError **err) {
  if (too_big(c, n, "all-reduce", err))
    return false;
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->comm, &req);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, c->b, c->label, "all-reduce", rc);
  return wait_requests(c->b, c->label, "all-reduce", 1, &req, false, err);
}

static bool mpi_reduce_scatter_f32(struct exec_comm *c, const float *in, float *out,
                                   size_t n_per_rank, GError **err) {
  if (too_big(c, n_per_rank * c->size, "reduce-scatter", err))
    return false;
  MPI_Request req;
  int rc = MPI_Ireduce_scatter_block(in, out, (int)n_per_rank, MPI_FLOAT, MPI_SUM, c->comm, &req);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, c->b, c->label, "reduce-scatter", rc);
  return wait_requests(c->b, c->label, "reduce-scatter", 1, &req, false, err);
}

static bool mpi_all_gather(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                           GError **err) {
  if (too_big(c, bytes_per_rank * c->size, "all-gather", err))
    return false;
  const void *send = in == (const char *)out + (size_t)c->rank * bytes_per_rank ? MPI_IN_PLACE : in;
  MPI_Request req;
  int rc = MPI_Iallgather(send, (int)bytes_per_rank, MPI_BYTE, out, (int)bytes_per_rank, MPI_BYTE,
                          c->comm, &req);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, c->b, c->label, "all-gather", rc);
  return wait_requests(c->b, c->label, "all-gather", 1, &req, false, err);
}

static bool mpi_all_to_all_i32(struct exec_comm *c, const int32_t *in, int32_t *out, GError **err) {
  MPI_Request req;
  int rc = MPI_Ialltoall(in, 1, MPI_INT32_T, out, 1, MPI_INT32_T, c->comm, &req);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, c->b, c->label, "all-to-all (counts)", rc);
  return wait_requests(c->b, c->label, "all-to-all (counts)", 1, &req, false, err);
}

static bool mpi_all_to_all_v(struct exec_comm *c, const void *in, const size_t *send_bytes,
                             void *out, const size_t *recv_bytes, GError **err) {
  int *sc = g_new(int, 4 * (size_t)c->size), *sd = sc + c->size, *rcn = sd + c->size,
      *rd = rcn + c->size;
  size_t so = 0, ro = 0;
  bool ok = true;
  for (uint32_t i = 0; i < c->size; i++) {
    sc[i] = (int)send_bytes[i];
    rcn[i] = (int)recv_bytes[i];
    sd[i] = (int)so;
    rd[i] = (int)ro;
    so += send_bytes[i];
    ro += recv_bytes[i];
  }
  if (too_big(c, so > ro ? so : ro, "all-to-all", err)) {
    ok = false;
  } else {
    MPI_Request req;
    int rc = MPI_Ialltoallv(in, sc, sd, MPI_BYTE, out, rcn, rd, MPI_BYTE, c->comm, &req);
    ok = rc == MPI_SUCCESS ? wait_requests(c->b, c->label, "all-to-all", 1, &req, false, err)
                           : mpi_fail(err, c->b, c->label, "all-to-all", rc);
  }
  g_free(sc);
  return ok;
}

static bool mpi_world_all_reduce_f64(struct host_context *b, double *buf, size_t n,
                                     enum exec_reduce_op op, GError **err) {
  MPI_Op mop = op == EXEC_REDUCE_MAX ? MPI_MAX : op == EXEC_REDUCE_MIN ? MPI_MIN : MPI_SUM;
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, mop, b->world->control, &req);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, b, "the job", "all-reduce", rc);
  return wait_requests(b, "the job", "all-reduce", 1, &req, false, err);
}

static bool mpi_world_gather(struct host_context *b, const void *in, size_t bytes, void **out,
                             size_t **out_sizes, GError **err) {
  *out = NULL;
  *out_sizes = NULL;
  uint64_t mine = bytes;
  uint64_t *sizes = g_new0(uint64_t, b->size);
  MPI_Request req;
  int rc =
      MPI_Igather(&mine, 1, MPI_UINT64_T, sizes, 1, MPI_UINT64_T, 0, b->world->control, &req);
  if (rc != MPI_SUCCESS || !wait_requests(b, "the job", "gather", 1, &req, false, err)) {
    g_free(sizes);
    return rc == MPI_SUCCESS ? false : mpi_fail(err, b, "the job", "gather", rc);
  }
  int *cnt = g_new0(int, 2 * (size_t)b->size), *disp = cnt + b->size;
  size_t total = 0;
  /* only rank 0 has the sizes (and judges them); the others send theirs regardless */
  bool ok = b->rank != 0 || exec_world_gather_layout(sizes, b->size, cnt, disp, &total, err);
  char *all = b->rank == 0 ? g_malloc(total ? total : 1) : NULL;
  if (ok) {
    rc = MPI_Igatherv(in, (int)bytes, MPI_BYTE, all, cnt, disp, MPI_BYTE, 0, b->world->control,
                      &req);
    ok = rc == MPI_SUCCESS ? wait_requests(b, "the job", "gather", 1, &req, false, err)
                           : mpi_fail(err, b, "the job", "gather", rc);
  }
  if (ok && b->rank == 0) {
    *out = all;
    *out_sizes = g_new(size_t, b->size);
    for (uint32_t i = 0; i < b->size; i++)
      (*out_sizes)[i] = (size_t)sizes[i];
  } else {
    g_free(all);
  }
  g_free(cnt);
  g_free(sizes);
  return ok;
}

static bool mpi_world_broadcast(struct host_context *b, void *buf, size_t bytes, GError **err) {
  MPI_Request req;
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, b->world->control, &req);
  if (rc != MPI_SUCCESS)
    return mpi_fail(err, b, "the job", "broadcast", rc);
  return wait_requests(b, "the job", "broadcast", 1, &req, false, err);
}

#endif

/* ---- the backend's entry points: MPI when launched so, else local ------------------------- */

#ifdef HAVE_MPI
#define VIA_WORLD(b, call) ((b)->world->mpi ? mpi_##call : local_##call)
#define VIA_COMM(c, call) ((c)->local ? local_##call : mpi_##call)
#else
#define VIA_WORLD(b, call) local_##call
#define VIA_COMM(c, call) local_##call
#endif

/* After a cancel nothing new is posted: the task fails at once. */
static bool refused(struct host_context *b, const char *label, GError **err) {
  if (!b->cancelled)
    return false;
  piper_runtime_error(err, "rank %u: communication on %s cancelled", b->rank, label);
  return true;
}

bool exec_host_comm_init(struct host_context *b, const struct exec_backend_params *p,
                         GError **err) {
  b->world = g_new0(struct host_world, 1);
#ifdef HAVE_MPI
  /* alone (no launcher), a process runs one device without initialising MPI at all (faster,
   * nothing to tear down); force_mpi starts it anyway */
  if (p->force_mpi || p->launch.launched)
    return mpi_comm_init(b, p, err);
#endif
  return local_comm_init(b, p, err);
}

bool exec_host_comm_barrier(struct host_context *b, GError **err) {
  return VIA_WORLD(b, comm_barrier)(b, err);
}

void exec_host_comm_finalize(struct host_context *b) {
  if (!b->world)
    return;
  VIA_WORLD(b, comm_finalize)(b);
  g_free(b->world);
  b->world = NULL;
}

void exec_host_comm_abort(struct host_context *b, int code) {
  VIA_WORLD(b, comm_abort)(b, code);
}
const char *exec_host_comm_library(struct host_context *b) {
  return VIA_WORLD(b, comm_library)(b);
}

struct exec_comm *exec_host_comm_create(struct host_context *b, const char *label,
                                        const uint32_t *members, uint32_t n_members,
                                        bool point_to_point, GError **err) {
  return VIA_WORLD(b, comm_create)(b, label, members, n_members, point_to_point, err);
}

void exec_host_comm_destroy(struct exec_comm *c) {
  if (c)
    VIA_COMM(c, comm_destroy)(c);
}

bool exec_host_send(struct exec_comm *c, uint32_t peer, const void *buf, size_t bytes, int tag,
                    GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, send)(c, peer, buf, bytes, tag, err);
}

bool exec_host_recv(struct exec_comm *c, uint32_t peer, void *buf, size_t bytes, int tag,
                    GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, recv)(c, peer, buf, bytes, tag, err);
}

bool exec_host_p2p_group(struct host_context *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err) {
  if (n == 0)
    return true;
  bool local = false;
  for (uint32_t k = 0; k < n; k++) {
    if (refused(b, parts[k].comm->label, err))
      return false;
    local = local || parts[k].comm->local;
  }
#ifdef HAVE_MPI
  if (!local)
    return mpi_p2p_group(b, parts, n, err);
#endif
  /* one process: no part has a peer, so each fails (or, with itself, waits) as alone */
  bool ok = true;
  for (uint32_t k = 0; k < n && ok; k++) {
    const struct exec_p2p_part *x = &parts[k];
    ok = local_transfer(x->comm, x->is_send, x->peer_world_rank, err);
  }
  return ok;
}

bool exec_host_p2p_start(struct host_context *b, const struct exec_p2p_part *parts, uint32_t n,
                         struct exec_p2p_flight **out, GError **err) {
  *out = NULL;
#ifdef HAVE_MPI
  bool local = false;
  for (uint32_t k = 0; k < n; k++) {
    if (refused(b, parts[k].comm->label, err))
      return false;
    local = local || parts[k].comm->local;
  }
  if (n > 0 && !local)
    return mpi_p2p_start(b, parts, n, out, err);
#endif
  return exec_host_p2p_group(b, parts, n, err); /* alone: as a group, nothing in flight */
}

bool exec_host_p2p_finish(struct host_context *b, struct exec_p2p_flight *f, GError **err) {
  (void)b;
  if (!f)
    return true;
#ifdef HAVE_MPI
  return mpi_p2p_finish(f, err);
#else
  (void)err;
  PIPER_ASSERT(!"a group in flight without MPI");
  return false;
#endif
}

bool exec_host_all_reduce_f32(struct exec_comm *c, float *buf, size_t n, GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, all_reduce_f32)(c, buf, n, err);
}

bool exec_host_reduce_scatter_f32(struct exec_comm *c, const float *in, float *out,
                                  size_t n_per_rank, GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, reduce_scatter_f32)(c, in, out, n_per_rank, err);
}

bool exec_host_all_gather(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                          GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, all_gather)(c, in, out, bytes_per_rank, err);
}

bool exec_host_all_to_all_i32(struct exec_comm *c, const int32_t *in, int32_t *out, GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, all_to_all_i32)(c, in, out, err);
}

bool exec_host_all_to_all_v(struct exec_comm *c, const void *in, const size_t *send_bytes,
                            void *out, const size_t *recv_bytes, GError **err) {
  if (refused(c->b, c->label, err))
    return false;
  return VIA_COMM(c, all_to_all_v)(c, in, send_bytes, out, recv_bytes, err);
}

bool exec_host_world_all_reduce_f64(struct host_context *b, double *buf, size_t n,
                                    enum exec_reduce_op op, GError **err) {
  if (refused(b, "the job", err))
    return false;
  return VIA_WORLD(b, world_all_reduce_f64)(b, buf, n, op, err);
}

bool exec_host_world_gather(struct host_context *b, const void *in, size_t bytes, void **out,
                            size_t **out_sizes, GError **err) {
  if (refused(b, "the job", err))
    return false;
  return VIA_WORLD(b, world_gather)(b, in, bytes, out, out_sizes, err);
}

bool exec_host_world_broadcast(struct host_context *b, void *buf, size_t bytes, GError **err) {
  if (refused(b, "the job", err))
    return false;
  return VIA_WORLD(b, world_broadcast)(b, buf, bytes, err);
}
