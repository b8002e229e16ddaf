/* host-impl: the host backend's private state, shared by its streams (backend_host.c) and its
 * communication (host_comm.c, MPI when built with it). */
#ifndef PIPER_EXEC_HOST_IMPL_H
#define PIPER_EXEC_HOST_IMPL_H

#include <stdatomic.h>

#include "exec.h"

struct host_world; /* MPI state (host_comm.c) */

struct exec_backend {
  GMutex lock;                              /* queues, events and stream phases */
  GCond main_cond;                          /* the submitting thread waits here ... */
  const struct exec_event *main_waiting_on; /* ... for this event */
  atomic_ullong progress;
  atomic_bool cancelled;
  double epoch; /* monotonic seconds at the aligned start */
  uint32_t rank, size;
  GPtrArray *streams; /* struct exec_stream *, live ones */
  struct host_world *world;
};

bool host_comm_init(struct exec_backend *b, const struct exec_backend_params *p, GError **err);
void host_comm_finalize(struct exec_backend *b);
void host_comm_abort(struct exec_backend *b, int code);
/* Barrier across the job used to align clocks at start (no-op alone). */
void host_comm_barrier(struct exec_backend *b);
const char *host_comm_library(struct exec_backend *b);

struct exec_comm *host_comm_create(struct exec_backend *b, const char *label,
                                   const uint32_t *members, uint32_t n_members, bool point_to_point,
                                   GError **err);
void host_comm_destroy(struct exec_comm *c);
bool host_send(struct exec_comm *c, uint32_t peer, const void *buf, size_t bytes, int tag,
               GError **err);
bool host_recv(struct exec_comm *c, uint32_t peer, void *buf, size_t bytes, int tag, GError **err);
bool host_all_reduce_f32(struct exec_comm *c, float *buf, size_t n, GError **err);
bool host_reduce_scatter_f32(struct exec_comm *c, const float *in, float *out, size_t n_per_rank,
                             GError **err);
bool host_all_gather(struct exec_comm *c, const void *in, void *out, size_t bytes_per_rank,
                     GError **err);
bool host_all_to_all_i32(struct exec_comm *c, const int32_t *in, int32_t *out, GError **err);
bool host_all_to_all_v(struct exec_comm *c, const void *in, const size_t *send_bytes, void *out,
                       const size_t *recv_bytes, GError **err);
bool host_world_all_reduce_f64(struct exec_backend *b, double *buf, size_t n,
                               enum exec_reduce_op op, GError **err);
bool host_world_gather(struct exec_backend *b, const void *in, size_t bytes, void **out,
                       size_t **out_sizes, GError **err);
bool host_world_broadcast(struct exec_backend *b, void *buf, size_t bytes, GError **err);

#endif
