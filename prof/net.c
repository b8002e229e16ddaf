/* prof net: the network under mpirun. Every operation over every group size from 2 to the
 * ranks launched (p2p: 2), sizes 8 B to 8 MiB by 4x, each timed by its slowest rank as the
 * median over repeats; then one fit per operation over all its points (NCCL's too, cuda.c).
 *
 * The fit: time = steps(p) a + share(p) n / B, the simulator's ring terms (profile_comm_cost),
 * least squares with relative residuals. These are the "intra_node" fits of the profile:
 * mpirun on one machine puts every rank on it. Also the world's ways of waiting without a
 * core: a spinning rank would take a core from the ranks being timed. */
#include <stdlib.h>
#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "../base/assert.h"
#include "../base/base.h"
#include "prof-impl.h"

/* ---- the fits ----------------------------------------------------------------------------- */

const char *const prof_net_names[NET_N] = {"p2p", "all_reduce", "reduce_scatter",
                                          "all_gather", "all_to_all"};

/* The simulator's alpha-beta terms of one operation of n bytes over p ranks are
 * latency_steps * a + transfer_share * n / B (profile_comm_cost, ring). */
static void net_model_terms(enum net_kind k, int p, double *latency_steps, double *share) {
  double q = p;
  switch (k) {
  case NET_P2P: *latency_steps = 1, *share = 1; break;
  case NET_ALL_REDUCE: *latency_steps = 2 * (q - 1), *share = 2 * (q - 1) / q; break;
  default: *latency_steps = q - 1, *share = (q - 1) / q; break;
  }
}

/* a and B of t = A a + S n / B over the points, weights 1 / t^2; a >= 0 (else refitted at 0). */
static void net_fit(enum net_kind k, const struct net_points *pts, double *a, double *B) {
  double saa = 0, sab = 0, sbb = 0, sat = 0, sbt = 0;
  for (guint i = 0; i < pts->t->len; i++) {
    double A, S, t = g_array_index(pts->t, double, i);
    net_model_terms(k, (int)g_array_index(pts->p, double, i), &A, &S);
    double X = S * g_array_index(pts->n, double, i), w = t > 0 ? 1 / (t * t) : 0;
    saa += w * A * A, sab += w * A * X, sbb += w * X * X, sat += w * A * t, sbt += w * X * t;
  }
  double det = saa * sbb - sab * sab, inv_b;
  *a = det != 0 ? (sat * sbb - sbt * sab) / det : 0;
  inv_b = det != 0 ? (saa * sbt - sab * sat) / det : 0;
  if (*a < 0 || det == 0) {
    *a = 0;
    inv_b = sbb > 0 ? sbt / sbb : 0;
  }
  *B = inv_b > 0 ? 1 / inv_b : 1e15;
}

/* The sources' view of the largest group measured: its points and the plain line through them
 * (latency_us + bytes / bandwidth_gbs), what one operation costs at that size. */
static void net_source_largest(cJSON *src, enum net_kind k, const struct net_points *pts) {
  double pmax = 0, x[32], y[32];
  int n = 0;
  for (guint i = 0; i < pts->p->len; i++)
    pmax = g_array_index(pts->p, double, i) > pmax ? g_array_index(pts->p, double, i) : pmax;
  cJSON *arr = cJSON_CreateArray();
  for (guint i = 0; i < pts->p->len && n < 32; i++) {
    if (g_array_index(pts->p, double, i) != pmax)
      continue;
    x[n] = g_array_index(pts->n, double, i), y[n] = g_array_index(pts->t, double, i);
    cJSON *pt = cJSON_CreateArray();
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(x[n]));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(prof_round_sig(y[n] * 1e6, 4)));
    cJSON_AddItemToArray(arr, pt);
    n++;
  }
  double alpha = 0, beta = 0;
  prof_fit_line(x, y, n, &alpha, &beta);
  cJSON_AddNumberToObject(src, "ranks", k == NET_P2P ? 2 : pmax);
  cJSON_AddNumberToObject(src, "latency_us", prof_round_sig((alpha > 0 ? alpha : 0) * 1e6, 4));
  cJSON_AddNumberToObject(src, "bandwidth_gbs", prof_round_sig(beta > 0 ? 1 / beta / 1e9 : 1e6, 4));
  cJSON_AddItemToObject(src, "points_bytes_us", arr);
}

/* The fits (and their points, for the sources) into r. */
void prof_net_record(struct prof_run *r, const struct net_points *pts) {
  r->fits = cJSON_CreateObject();
  r->fit_json = cJSON_CreateObject();
  for (int k = 0; k < NET_N; k++) {
    double lat, bw;
    net_fit((enum net_kind)k, &pts[k], &lat, &bw);
    prof_progress(r, "%-14s fit over %u points: %.2f us per step + bytes / %.3f GB/s",
                  prof_net_names[k], pts[k].t->len, lat * 1e6, bw / 1e9);
    if (k == NET_P2P)
      r->p2p_latency = lat, r->p2p_bandwidth = bw;
    if (k == NET_ALL_REDUCE)
      r->ar_bandwidth = bw;
    cJSON *f = cJSON_AddObjectToObject(r->fit_json, prof_net_names[k]);
    cJSON_AddNumberToObject(f, "latency_us", prof_round_sig(lat * 1e6, 4));
    cJSON_AddNumberToObject(f, "bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
    cJSON *src = cJSON_AddObjectToObject(r->fits, prof_net_names[k]);
    net_source_largest(src, (enum net_kind)k, &pts[k]);
    cJSON_AddNumberToObject(src, "link_latency_us", prof_round_sig(lat * 1e6, 4));
    cJSON_AddNumberToObject(src, "link_bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
    cJSON *arr = cJSON_AddArrayToObject(src, "points_ranks_bytes_us");
    for (guint i = 0; i < pts[k].t->len; i++) {
      cJSON *pt = cJSON_CreateArray();
      cJSON_AddItemToArray(pt, cJSON_CreateNumber(g_array_index(pts[k].p, double, i)));
      cJSON_AddItemToArray(pt, cJSON_CreateNumber(g_array_index(pts[k].n, double, i)));
      cJSON_AddItemToArray(
          pt, cJSON_CreateNumber(prof_round_sig(g_array_index(pts[k].t, double, i) * 1e6, 4)));
      cJSON_AddItemToArray(arr, pt);
    }
  }
}

/* ---- the measurements (under mpirun) ------------------------------------------------------ */

#ifdef HAVE_MPI

struct net_ctx {
  enum net_kind kind;
  size_t bytes; /* the simulator's convention per kind (sim/profile.h, profile_comm_cost) */
  MPI_Comm comm;
  int rank, size; /* in comm */
  char *send, *recv;
};

/* One operation as the executor posts it (nonblocking, then waited for). */
static void net_once(struct net_ctx *c) {
  MPI_Request req[2];
  int n = 0, p = c->size;
  int per = (int)(c->bytes / (size_t)p); /* bytes per rank of a collective */
  switch (c->kind) {
  case NET_P2P:
    /* half a ping-pong between ranks 0 and 1: one transfer of `bytes` */
    if (c->rank == 0) {
      MPI_Isend(c->send, (int)c->bytes, MPI_BYTE, 1, 7, c->comm, &req[n++]);
      MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
      MPI_Recv(c->recv, (int)c->bytes, MPI_BYTE, 1, 8, c->comm, MPI_STATUS_IGNORE);
    } else if (c->rank == 1) {
      MPI_Irecv(c->recv, (int)c->bytes, MPI_BYTE, 0, 7, c->comm, &req[n++]);
      MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
      MPI_Send(c->send, (int)c->bytes, MPI_BYTE, 0, 8, c->comm);
    }
    return;
  case NET_ALL_REDUCE:
    MPI_Iallreduce(MPI_IN_PLACE, c->send, (int)(c->bytes / 4), MPI_FLOAT, MPI_SUM, c->comm,
                   &req[n++]);
    break;
  case NET_REDUCE_SCATTER:
    MPI_Ireduce_scatter_block(c->send, c->recv, per / 4, MPI_FLOAT, MPI_SUM, c->comm, &req[n++]);
    break;
  case NET_ALL_GATHER:
    MPI_Iallgather(c->send, per, MPI_BYTE, c->recv, per, MPI_BYTE, c->comm, &req[n++]);
    break;
  case NET_ALL_TO_ALL:
    MPI_Ialltoall(c->send, per, MPI_BYTE, c->recv, per, MPI_BYTE, c->comm, &req[n++]);
    break;
  default: PIPER_UNREACHABLE();
  }
  MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
}

/* Median over the repeats of the slowest rank's time (p2p: half the round trip). */
static double net_median(const struct prof_args *a, struct net_ctx *c, uint32_t reps) {
  for (uint32_t i = 0; i < a->warmup; i++)
    net_once(c);
  double *t = g_new(double, reps);
  for (uint32_t i = 0; i < reps; i++) {
    MPI_Barrier(c->comm);
    double s = piper_clock_seconds();
    net_once(c);
    double mine = piper_clock_seconds() - s, worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, c->comm);
    t[i] = c->kind == NET_P2P ? worst / 2 : worst;
  }
  double med = prof_median(t, reps);
  g_free(t);
  return med;
}

/* The ranks outside a group wait here without a core (MPI's barrier spins, and a spinning
 * rank would take a core from the group being timed); host.c's rounds start with it too. */
void prof_sleeping_barrier(const struct prof_run *r) {
  MPI_Request req;
  MPI_Ibarrier(r->comm, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag)
      g_usleep(1000);
  }
}

/* Every operation over the ranks [0, g) of the world: points kept on rank 0. */
static void measure_group(struct prof_run *r, int g, struct net_ctx *c, int max_log4,
                          struct net_points *pts) {
  const struct prof_args *a = r->a;
  for (int k = 0; k < NET_N; k++) {
    if (k == NET_P2P && g != 2)
      continue;
    c->kind = (enum net_kind)k;
    GString *line = g_string_new("");
    for (int s = 0; s < max_log4; s++) {
      size_t unit = (size_t)4 * g; /* whole floats per rank */
      size_t bytes = (((size_t)8 << (2 * s)) + unit - 1) / unit * unit;
      c->bytes = bytes;
      uint32_t reps = bytes > ((size_t)1 << 20) ? (a->quick ? 3 : 7) : (a->quick ? 7 : 31);
      if (reps < a->repeats && bytes <= ((size_t)1 << 20) && !a->quick)
        reps = a->repeats;
      double t = net_median(a, c, reps);
      double pv = g, nv = (double)bytes;
      g_array_append_val(pts[k].p, pv);
      g_array_append_val(pts[k].n, nv);
      g_array_append_val(pts[k].t, t);
      if (s == 0 || s == max_log4 - 1)
        g_string_append_printf(line, "%s%zu B %.1f us", s ? ", " : "", bytes, t * 1e6);
    }
    prof_progress(r, "  %-14s %d ranks: %s", prof_net_names[k], g, line->str);
    g_string_free(line, TRUE);
  }
}

/* Every group of ranks [0, g), g from 2 to the world's size, the ranks outside it asleep. */
void prof_measure_network(struct prof_run *r) {
  int max_log4 = r->a->quick ? 8 : 11; /* 8 B .. 128 KiB (quick) or 8 MiB, by 4x */
  /* sizes round up to whole floats per rank: room for the largest one rounded */
  size_t max_bytes = ((size_t)8 << (2 * (max_log4 - 1))) + (size_t)4 * r->size;
  struct net_ctx c = {0};
  c.send = g_malloc0(max_bytes), c.recv = g_malloc0(max_bytes);
  struct net_points pts[NET_N];
  for (int k = 0; k < NET_N; k++)
    pts[k] = (struct net_points){g_array_new(FALSE, FALSE, sizeof(double)),
                                 g_array_new(FALSE, FALSE, sizeof(double)),
                                 g_array_new(FALSE, FALSE, sizeof(double))};
  for (int g = 2; g <= r->size; g++) {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(r->comm, r->rank < g ? 0 : MPI_UNDEFINED, r->rank, &sub);
    if (sub != MPI_COMM_NULL) {
      c.comm = sub, c.rank = r->rank, c.size = g;
      measure_group(r, g, &c, max_log4, pts);
      MPI_Comm_free(&sub);
    }
    prof_sleeping_barrier(r);
  }
  if (r->rank == 0)
    prof_net_record(r, pts);
  for (int k = 0; k < NET_N; k++)
    g_array_free(pts[k].p, TRUE), g_array_free(pts[k].n, TRUE), g_array_free(pts[k].t, TRUE);
  g_free(c.send), g_free(c.recv);
  r->network_measured = true;
}

/* The other ranks wait for rank 0's kernels without a core: MPI's blocking calls spin, and a
 * spinning rank would take a core from the kernels being timed. */
void prof_idle_until_released(const struct prof_run *r) {
  char done = 0;
  MPI_Request req;
  MPI_Irecv(&done, 1, MPI_CHAR, 0, 9, r->comm, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag)
      g_usleep(20000);
  }
}

void prof_release_others(const struct prof_run *r) {
  char done = 1;
  for (int q = 1; q < r->size; q++)
    MPI_Send(&done, 1, MPI_CHAR, q, 9, r->comm);
}
#endif
