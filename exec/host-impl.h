/* host-impl: the host backend's private state (its struct exec_backend's context), shared by
 * its streams (backend_host.c) and its communication (host_comm.c, MPI when built with it). */
#ifndef PIPER_EXEC_HOST_IMPL_H
#define PIPER_EXEC_HOST_IMPL_H

#include "backend.h"

struct host_world; /* MPI state (host_comm.c) */
struct host_loop;  /* the event loop (backend_host.c) */

/* Touched only by the thread that submits and runs the loop. */
struct host_context {
  uint64_t progress; /* items finished and communication settled */
  bool cancelled;
  double epoch; /* monotonic seconds at the aligned start */
  uint32_t rank, size;
  GPtrArray *streams; /* struct exec_stream *, live ones */
  struct host_loop *loop;
  struct host_world *world;
};

/* Communication a task waits for, already posted. test settles it when it can (an error
 * sets *err); cancel stops it: true once nothing it touches is in flight any more (MPI_Cancel
 * and completion), false when requests are left that cannot be stopped. */
enum host_pending_state {
  HOST_PENDING_WAITING,
  HOST_PENDING_DONE,
  HOST_PENDING_FAILED,
  HOST_PENDING_CANCELLED
};
struct host_pending {
  enum host_pending_state (*test)(struct host_pending *p, GError **err);
  bool (*cancel)(struct host_pending *p);
  char what[128]; /* "receive from rank 1 on pp (recv)", for the error */
};

/* Waits for p: inside a task, suspends the task and lets the loop run other streams until p
 * settles; false with *err set when it failed or was cancelled. */
bool exec_host_wait(struct host_context *b, struct host_pending *p, GError **err);

bool exec_host_comm_init(struct host_context *b, const struct exec_backend_params *p, GError **err);
void exec_host_comm_finalize(struct host_context *b);
void exec_host_comm_abort(struct host_context *b, int code);
/* Barrier across the job used to align clocks at start (no-op alone). */
bool exec_host_comm_barrier(struct host_context *b, GError **err);
const char *exec_host_comm_library(struct host_context *b);

struct exec_comm *exec_host_comm_create(struct host_context *b, const char *label,
                                        const uint32_t *members, uint32_t n_members,
                                        bool point_to_point, GError **err);
void exec_host_comm_destroy(struct exec_comm *c);
/* The collectives of ops.def. */
#define EXEC_KERNEL(name, use, params, args)
#define EXEC_COLLECTIVE(name, use, params, args, pre)                                             \
  bool exec_host_##name(struct exec_comm *c, EXEC_UNPAREN params, GError **err);
#include "ops.def"
#undef EXEC_KERNEL
#undef EXEC_COLLECTIVE
/* A point-to-point group (struct exec_backend_ops.p2p_group): posted together, one wait. */
bool exec_host_p2p_group(struct host_context *b, const struct exec_p2p_part *parts, uint32_t n,
                         GError **err);
/* The group in two halves (struct exec_backend_ops.p2p_start, p2p_finish): posted, then waited
 * for at finish. */
bool exec_host_p2p_start(struct host_context *b, const struct exec_p2p_part *parts, uint32_t n,
                         struct exec_p2p_flight **out, GError **err);
bool exec_host_p2p_finish(struct host_context *b, struct exec_p2p_flight *f, GError **err);
bool exec_host_world_all_reduce_f64(struct host_context *b, double *buf, size_t n,
                                    enum exec_reduce_op op, GError **err);
bool exec_host_world_gather(struct host_context *b, const void *in, size_t bytes, void **out,
                            size_t **out_sizes, GError **err);
bool exec_host_world_broadcast(struct host_context *b, void *buf, size_t bytes, GError **err);

#endif
