/* prof cuda: `piper-prof --backend cuda`, the GPU's profile in the host profile's format.
 * Every distinct (op kind, shape) of the models runs through the cuda backend's kernel table
 * for F, BI, BW and B, each call one task on one stream; the backend records a CUDA event
 * before and after every task (the clock of piper-exec's trace), and an entry is the median
 * of those times over repeats after warm-up; "host_ms" is the median time this thread took to
 * enqueue the call (the simulator takes the longer of the two: a small op on a large GPU
 * waits for its enqueueing). As in a training step, an op's parameters are a
 * weight store of the bf16 weight cache: GEMMs of bf16 models read the weights' bf16 copy,
 * made once (in the warm-up) and reused, so an entry leaves out the copy's making, which the
 * executor does once per optimizer step (in the update itself); that cost is measured there
 * and printed apart, per op. Then the GEMM rate in bf16 (weights' copies reused, as in a step) and fp32,
 * a device copy's bandwidth, fused AdamW at 4 sizes, the host thread's cost per enqueued
 * instruction, and under mpirun (one GPU per rank) NCCL's point-to-point and collectives over sizes and
 * group sizes, fitted as the host profiler fits MPI's. Without a usable GPU the backend's
 * start fails and that one line (naming the CUDA error) is the program's error. Compiled only
 * with HAVE_CUDA (the Makefile's CUDA_SRCS); run.c's table of backends names prof_cuda_measure. */
#include <mpi.h>
#include <string.h>
#include <unistd.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "../exec/backend.h"
#include "../exec/backend_cuda.h"
#include "../sim/profile.h"
#include "prof-impl.h"

struct gpu {
  struct exec_backend *b;
  const struct exec_kernels *k;
  struct exec_stream *s;
  struct exec_event *done;
  /* bf16 models: each measured op's weight-copy seconds ("kind shape dtype" -> double), and
   * the sums over every op of the models (repeated layers counted each time) */
  GHashTable *copy_s;
  double copy_seconds, copy_params;
};

/* ---- timing ------------------------------------------------------------------------------- */

typedef bool (*gpu_task_fn)(struct exec_stream *s, void *arg, GError **err);

/* Median GPU seconds of one task: `warmup` untimed tasks, then `n` timed ones (task ids
 * 0 .. n-1: the backend's events around each), all enqueued before one wait. host_out, when
 * not NULL, gets the median host seconds of enqueueing one timed task (submit runs the task
 * on this thread: cuBLASLt's setup, the launches, a wait where the task needs a value on the
 * CPU; a full launch queue makes it wait for the GPU, so it is never far below the GPU's
 * time when the GPU is the slower side). */
static bool gpu_median_host(struct gpu *g, uint32_t warmup, uint32_t n, gpu_task_fn fn,
                            void *arg, double *out, double *host_out, GError **err) {
  for (uint32_t i = 0; i < warmup; i++)
    exec_stream_submit(g->b, g->s, fn, arg, UINT32_MAX);
  double *h = g_new(double, n ? n : 1);
  for (uint32_t i = 0; i < n; i++) {
    double t0 = piper_clock_seconds();
    exec_stream_submit(g->b, g->s, fn, arg, i);
    h[i] = piper_clock_seconds() - t0;
  }
  if (host_out && n)
    *host_out = prof_median(h, n);
  g_free(h);
  exec_event_record(g->b, g->done, g->s);
  if (!exec_event_synchronize(g->b, g->done, 600))
    return piper_runtime_error(err, "piper-prof: the GPU did not finish a measurement in 600 s");
  const GError *se = exec_stream_error(g->b, g->s);
  if (se) {
    if (err)
      *err = g_error_copy(se);
    return false;
  }
  double *t = g_new(double, n ? n : 1);
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++) {
    double s0 = 0, s1 = 0;
    if (exec_backend_task_times(g->b, i, &s0, &s1))
      t[m++] = s1 - s0;
  }
  if (m == 0) {
    g_free(t);
    return piper_runtime_error(err, "piper-prof: the cuda backend gave no event times");
  }
  *out = prof_median(t, m);
  g_free(t);
  return true;
}

static bool gpu_median(struct gpu *g, uint32_t warmup, uint32_t n, gpu_task_fn fn, void *arg,
                       double *out, GError **err) {
  return gpu_median_host(g, warmup, n, fn, arg, out, NULL, err);
}

/* ---- device buffers ---------------------------------------------------------------------- */

static float *device_floats(struct gpu *g, size_t n, uint32_t seed, float scale) {
  float *d = exec_backend_alloc(g->b, (n ? n : 1) * sizeof(float));
  if (d && scale != 0) {
    float *h = prof_random_floats(n, seed, scale);
    exec_backend_from_host(g->b, d, h, n * sizeof(float));
    g_free(h);
  }
  return d;
}

static int32_t *device_ids(struct gpu *g, size_t n, int32_t range) {
  int32_t *d = exec_backend_alloc(g->b, (n ? n : 1) * sizeof(int32_t));
  if (d) {
    int32_t *h = prof_random_ids(n, range);
    exec_backend_from_host(g->b, d, h, n * sizeof(int32_t));
    g_free(h);
  }
  return d;
}

/* One op's operands on the device (struct op_bench's fields, device pointers) and the MoE
 * dispatch counts, which the device writes. */
struct cuda_op {
  struct op_bench b;
  int32_t *counts;
  struct gpu *g;
};

static bool cuda_op_init(struct cuda_op *o, struct gpu *g, const struct model *m,
                         const struct model_op *op) {
  struct op_bench *b = &o->b;
  *o = (struct cuda_op){.g = g};
  *b = (struct op_bench){.m = m, .op = op};
  prof_op_bench_dims(b);
  struct op_sizes z = prof_op_sizes(b);
  size_t TK = (size_t)b->T * (b->K ? b->K : 1);
  b->params = device_floats(g, z.params, 1, 0.1f);
  /* the optimizer's block is a weight store in piper-exec (k_adamw_step): without one, every
   * GEMM would convert its whole weight to bf16 (the LM head's 525 M elements once per chunk) */
  if (b->params && exec_cuda_gemm_bf16(g->b))
    exec_cuda_add_weight_store(g->b, b->params, z.params * sizeof(float));
  b->dparams = device_floats(g, z.params, 0, 0);
  b->in0 = device_floats(g, z.in, 2, 1.0f);
  b->dout = device_floats(g, z.out, 3, 1.0f);
  b->out = device_floats(g, z.out, 0, 0);
  b->din = device_floats(g, z.in, 0, 0);
  b->saved = device_floats(g, z.saved, 0, 0);
  b->bwork = device_floats(g, z.bwork, 0, 0);
  b->tokens = device_ids(g, (size_t)b->T, b->V > 0 ? b->V : 1);
  b->ids = device_ids(g, TK, b->E > 0 ? b->E : 1);
  b->route_row = device_ids(g, TK, 1);
  /* an expert-parallel variant's rows come routed to its E / ep experts */
  b->row_expert = device_ids(g, TK, b->ep > 1 ? b->E / b->ep : 1);
  b->weights = device_floats(g, TK, 4, 1.0f);
  b->dweights = device_floats(g, TK, 5, 1.0f);
  b->rows = device_floats(g, z.rows, b->ep > 1 ? 6 : 0, b->ep > 1 ? 1.0f : 0);
  b->y = device_floats(g, z.rows, 0, 0);
  b->dy = device_floats(g, z.rows, b->ep > 1 ? 7 : 0, b->ep > 1 ? 1.0f : 0);
  b->drows = device_floats(g, z.rows, 0, 0);
  b->scratch = device_floats(g, z.scratch, 0, 0);
  o->counts = device_ids(g, 1, 1);
  void *all[] = {b->params,    b->dparams,    b->in0,     b->dout,     b->out,
                 b->din,       b->saved,      b->bwork,   b->tokens,   b->ids,
                 b->route_row, b->row_expert, b->weights, b->dweights, b->rows,
                 b->y,         b->dy,         b->drows,   b->scratch,  o->counts};
  for (size_t i = 0; i < G_N_ELEMENTS(all); i++)
    if (!all[i])
      return false;
  return true;
}

static void cuda_op_free(struct cuda_op *o) {
  struct op_bench *b = &o->b;
  void *all[] = {b->params,    b->dparams,    b->in0,     b->dout,     b->out,
                 b->din,       b->saved,      b->bwork,   b->tokens,   b->ids,
                 b->route_row, b->row_expert, b->weights, b->dweights, b->rows,
                 b->y,         b->dy,         b->drows,   b->scratch,  o->counts};
  for (size_t i = 0; i < G_N_ELEMENTS(all); i++)
    if (all[i])
      exec_backend_release(o->g->b, all[i]);
}

/* ---- one op's pass, as the segment forward and backward (exec/segment_*.c) call the kernel table --------------------------------- */

static void run_norm_embed(struct exec_stream *s, const struct exec_kernels *k,
                           struct op_bench *b) {
  if (b->op->kind == MODEL_OP_EMBEDDING) {
    if (b->pass == IR_PASS_F)
      k->embedding_forward(s, b->out, b->tokens, b->params, b->T, b->V, b->C);
    else if (b->pass == IR_PASS_BW)
      k->embedding_backward_weight(s, b->dparams, b->dout, b->tokens, b->T, b->V, b->C);
    else if (b->pass == IR_PASS_B)
      k->embedding_backward(s, b->dparams, b->dout, b->tokens, b->T, b->V, b->C);
    return;
  }
  float eps = (float)b->m->rms_norm_eps;
  if (b->pass == IR_PASS_F)
    k->rmsnorm_forward(s, b->out, b->saved, b->in0, b->params, b->T, b->C, eps);
  else if (b->pass == IR_PASS_BI)
    k->rmsnorm_backward_input(s, b->din, b->dout, b->in0, b->saved, b->params, b->T, b->C, false);
  else if (b->pass == IR_PASS_BW)
    k->rmsnorm_backward_weight(s, b->dparams, b->dout, b->in0, b->saved, b->T, b->C);
  else
    k->rmsnorm_backward(s, b->din, b->dparams, b->dout, b->in0, b->saved, b->params, b->T, b->C,
                        false);
}

static void run_attention(struct exec_stream *s, const struct exec_kernels *k, struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    k->attention_forward(s, b->out, b->saved, b->in0, b->params, &b->dd);
  else if (b->pass == IR_PASS_BI)
    k->attention_backward_input(s, b->din, b->bwork, b->dout, b->saved, b->params, &b->dd, false);
  else if (b->pass == IR_PASS_BW)
    k->attention_backward_weight(s, b->dparams, b->bwork, b->dout, b->in0, b->saved, &b->dd);
  else
    k->attention_backward(s, b->din, b->dparams, b->bwork, b->dout, b->in0, b->saved, b->params,
                          &b->dd, false);
}

static void run_mlp_router(struct exec_stream *s, const struct exec_kernels *k,
                           struct op_bench *b) {
  int T = b->T, C = b->C, E = b->E, K = b->K, F = b->F;
  if (b->op->kind == MODEL_OP_ROUTER) {
    if (b->pass == IR_PASS_F)
      k->router_forward(s, b->ids, b->weights, b->saved, b->in0, b->params, T, C, E, K);
    else if (b->pass == IR_PASS_BI)
      k->router_backward_input(s, b->din, b->bwork, b->dweights, b->ids, b->weights, b->saved,
                               b->params, T, C, E, K, false);
    else if (b->pass == IR_PASS_BW)
      k->router_backward_weight(s, b->dparams, b->bwork, b->in0, T, C, E);
    else
      k->router_backward(s, b->din, b->dparams, b->bwork, b->dweights, b->ids, b->weights, b->saved,
                         b->in0, b->params, T, C, E, K, false);
    return;
  }
  if (b->pass == IR_PASS_F)
    k->mlp_forward(s, b->out, b->saved, b->in0, b->params, T, C, F);
  else if (b->pass == IR_PASS_BI)
    k->mlp_backward_input(s, b->din, b->bwork, b->dout, b->saved, b->params, T, C, F, false);
  else if (b->pass == IR_PASS_BW)
    k->mlp_backward_weight(s, b->dparams, b->bwork, b->dout, b->in0, b->saved, T, C, F);
  else
    k->mlp_backward(s, b->din, b->dparams, b->bwork, b->dout, b->in0, b->saved, b->params, T, C, F,
                    false);
}

/* Experts on one device, as the host profiler runs them: plan, dispatch, the experts, combine,
 * and their backward. */
/* The experts alone on one device of an ep-way group (PROFILE_EP_DIM): E / ep local experts
 * over the T x k rows the dispatch brings. */
static void run_ep_experts(struct exec_stream *s, const struct exec_kernels *k,
                           struct op_bench *b) {
  int C = b->C, El = b->E / b->ep, F = b->F, TK = b->T * b->K;
  if (b->pass == IR_PASS_F)
    k->expert_ffn_forward(s, b->y, b->saved, NULL, NULL, b->scratch, b->rows, b->row_expert,
                          b->dweights, TK, b->params, 0, El, C, F);
  else if (b->pass == IR_PASS_BW)
    k->expert_ffn_backward_weight(s, b->dparams, b->bwork, b->row_expert, TK, b->saved, NULL, NULL,
                                  0, El, C, F);
  else if (b->pass == IR_PASS_B)
    k->expert_ffn_backward(s, b->drows, b->weights, b->dparams, b->bwork, b->scratch, b->dy,
                           b->row_expert, TK, b->saved, NULL, NULL, b->params, 0, El, C, F, false);
  else
    k->expert_ffn_backward_input(s, b->drows, b->weights, b->bwork, b->scratch, b->dy,
                                 b->row_expert, TK, b->saved, NULL, b->params, 0, El, C, F, false);
}

static void run_experts(struct exec_stream *s, const struct exec_kernels *k, struct cuda_op *o) {
  struct op_bench *b = &o->b;
  int T = b->T, C = b->C, E = b->E, K = b->K, F = b->F, TK = T * K;
  if (b->ep > 1) {
    run_ep_experts(s, k, b);
    return;
  }
  if (b->pass == IR_PASS_F) {
    k->moe_dispatch_plan(s, o->counts, b->route_row, b->ids, T, K, E, 1);
    k->moe_dispatch_forward(s, b->rows, b->row_expert, b->dweights, b->in0, b->ids, b->weights,
                            b->route_row, T, K, C);
    k->expert_ffn_forward(s, b->y, b->saved, NULL, NULL, b->scratch, b->rows, b->row_expert,
                          b->dweights, TK, b->params, 0, E, C, F);
    k->moe_combine_forward(s, b->out, b->y, b->route_row, T, K, C);
    return;
  }
  if (b->pass == IR_PASS_BW) {
    k->expert_ffn_backward_weight(s, b->dparams, b->bwork, b->row_expert, TK, b->saved, NULL, NULL,
                                  0, E, C, F);
    return;
  }
  k->moe_combine_backward(s, b->dy, b->dout, b->route_row, T, K, C);
  if (b->pass == IR_PASS_B)
    k->expert_ffn_backward(s, b->drows, b->weights, b->dparams, b->bwork, b->scratch, b->dy,
                           b->row_expert, TK, b->saved, NULL, NULL, b->params, 0, E, C, F, false);
  else
    k->expert_ffn_backward_input(s, b->drows, b->weights, b->bwork, b->scratch, b->dy,
                                 b->row_expert, TK, b->saved, NULL, b->params, 0, E, C, F, false);
  k->moe_dispatch_backward(s, b->din, b->dweights, b->drows, b->weights, b->route_row, T, K, C,
                           false);
}

static void run_lm_head(struct exec_stream *s, const struct exec_kernels *k, struct op_bench *b) {
  enum kernels_lm_head_layout lay =
      b->m->tie_word_embeddings ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
  int T = b->T, C = b->C, V = b->V;
  if (b->pass == IR_PASS_F)
    k->lm_head_loss_forward(s, b->weights /* the mean loss: one float of scratch */, b->saved,
                            b->in0, b->tokens, b->params, lay, T, C, V);
  else if (b->pass == IR_PASS_BI)
    k->lm_head_loss_backward_input(s, b->din, b->bwork, b->saved, b->in0, b->tokens, b->params, lay,
                                   1.0f, T, C, V, false);
  else if (b->pass == IR_PASS_BW)
    k->lm_head_loss_backward_weight(s, b->dparams, b->bwork, b->saved, b->in0, b->tokens, b->params,
                                    lay, 1.0f, T, C, V);
  else
    k->lm_head_loss_backward(s, b->din, b->dparams, b->bwork, b->saved, b->in0, b->tokens,
                             b->params, lay, 1.0f, T, C, V, false);
}

/* The executor copies x, then adds the block's output; backward hands dx to both inputs. */
static void run_residual(struct exec_stream *s, const struct exec_kernels *k, struct op_bench *b) {
  size_t n = (size_t)b->T * b->C;
  if (b->pass == IR_PASS_F) {
    k->copy(s, b->out, b->in0, n * sizeof(float));
    k->residual_add_forward(s, b->out, b->dout, n);
  } else if (b->pass != IR_PASS_BW) {
    k->residual_add_backward(s, b->din, b->dout, n, false);
    k->residual_add_backward(s, b->out, b->dout, n, false);
  }
}

static bool op_task(struct exec_stream *s, void *arg, GError **err) {
  (void)err; /* a kernel entry fails its stream; gpu_median reads the stream's error */
  struct cuda_op *o = arg;
  const struct exec_kernels *k = o->g->k;
  struct op_bench *b = &o->b;
  switch (b->op->kind) {
  case MODEL_OP_EMBEDDING:
  case MODEL_OP_RMSNORM: run_norm_embed(s, k, b); break;
  case MODEL_OP_ATTENTION: run_attention(s, k, b); break;
  case MODEL_OP_RESIDUAL_ADD: run_residual(s, k, b); break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT:
  case MODEL_OP_ROUTER: run_mlp_router(s, k, b); break;
  case MODEL_OP_EXPERT_FFN: run_experts(s, k, o); break;
  case MODEL_OP_LM_HEAD_LOSS: run_lm_head(s, k, b); break;
  default: PIPER_UNREACHABLE();
  }
  return true;
}

/* ---- the models' ops ---------------------------------------------------------------------- */

/* GEMMs in the precision the executor picks for the model (cuda_configure): bf16 operands
 * with fp32 accumulation for bf16 models, fp32 for fp32 models. */
static void gemm_precision(struct gpu *g, bool bf16) {
  exec_cuda_set_gemm_bf16(g->b, bf16);
}

struct adamw_arg {
  struct gpu *g;
  float *p, *grad, *m, *v;
  size_t n;
  int step;
};
static bool adamw_task(struct exec_stream *s, void *arg, GError **err) {
  (void)err;
  struct adamw_arg *w = arg;
  w->g->k->adamw_step(s, w->p, w->grad, w->m, w->v, w->n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      ++w->step);
  return true;
}

/* What the op's bf16 weight copies cost a step. piper-exec makes them in the optimizer's
 * update (k_adamw_step writes each compact matrix's copy as it writes the weights): AdamW over
 * the op's own weights, whose copies its forward made, less AdamW over as many parameters
 * with no copies. A forward then finds them fresh, so the entries leave them out. */
static bool weight_copy_cost(struct prof_run *r, struct gpu *g, struct cuda_op *o, double *out,
                             GError **err) {
  *out = 0;
  size_t n = prof_op_sizes(&o->b).params;
  if (!exec_cuda_gemm_bf16(g->b) || n == 0)
    return true;
  struct adamw_arg with = {.g = g, .p = o->b.params, .grad = o->b.dparams, .n = n};
  struct adamw_arg without = with;
  with.m = device_floats(g, n, 0, 0), with.v = device_floats(g, n, 0, 0);
  without.p = device_floats(g, n, 11, 0.1f);
  without.m = with.m, without.v = with.v;
  double t_with = 0, t_without = 0;
  uint32_t reps = r->a->quick ? 3 : 5;
  bool ok = with.m && with.v && without.p
                ? gpu_median(g, 1, reps, adamw_task, &with, &t_with, err) &&
                      gpu_median(g, 1, reps, adamw_task, &without, &t_without, err)
                : piper_runtime_error(err, "piper-prof: no device memory for AdamW's state");
  float *bufs[] = {with.m, with.v, without.p};
  for (size_t k = 0; k < G_N_ELEMENTS(bufs); k++)
    if (bufs[k])
      exec_backend_release(g->b, bufs[k]);
  *out = ok && t_with > t_without ? t_with - t_without : 0;
  return ok;
}

static bool measure_op(struct prof_run *r, struct gpu *g, const struct model *m,
                       const struct model_op *op, double *copy_out, GError **err) {
  static const enum ir_pass passes[] = {IR_PASS_F, IR_PASS_BI, IR_PASS_BW, IR_PASS_B};
  struct cuda_op o;
  bool ok = cuda_op_init(&o, g, m, op);
  if (!ok)
    ok = piper_runtime_error(err, "piper-prof: no device memory for %s's buffers",
                             model_op_kind_name(op->kind));
  double t[4] = {0}, host[4] = {0}, copies = 0;
  uint32_t n = r->a->quick ? 5 : r->a->repeats;
  /* at least one untimed call: it makes the weights' bf16 copies */
  uint32_t warmup = r->a->warmup ? r->a->warmup : 1;
  for (size_t p = 0; ok && p < G_N_ELEMENTS(passes); p++) {
    o.b.pass = passes[p];
    if (prof_pass_runs(op->kind, o.b.pass))
      ok = gpu_median_host(g, warmup, n, op_task, &o, &t[p], &host[p], err);
    if (ok)
      prof_entry_host_ms(prof_add_entry(r, op, o.b.pass, t[p]), host[p]);
  }
  if (ok && prof_pass_runs(op->kind, IR_PASS_F))
    ok = weight_copy_cost(r, g, &o, &copies, err);
  cuda_op_free(&o);
  *copy_out = copies;
  char name[32];
  if (op->kind == MODEL_OP_EXPERT_FFN && op->shape[PROFILE_EP_DIM] > 1)
    snprintf(name, sizeof name, "experts/ep%lld", (long long)op->shape[PROFILE_EP_DIM]);
  else
    snprintf(name, sizeof name, "%s", model_op_kind_name(op->kind));
  if (ok)
    prof_progress(r,
                  "  %-13s F %8.1f us  BI %8.1f us  BW %8.1f us  B %8.1f us  (bf16 weight copy "
                  "%.1f us per step, in the optimizer; enqueueing F %.1f BI %.1f BW %.1f B "
                  "%.1f us)",
                  name, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[3] * 1e6, copies * 1e6,
                  host[0] * 1e6, host[1] * 1e6, host[2] * 1e6, host[3] * 1e6);
  return ok;
}

/* "kind shape... dtype": an op measured once per distinct key (r->seen) */
static char *op_key(const struct model *m, const struct model_op *op) {
  GString *key = g_string_new(model_op_kind_name(op->kind));
  for (int d = 0; d < PROFILE_MAX_SHAPE; d++)
    g_string_append_printf(key, " %lld", (long long)op->shape[d]);
  g_string_append_printf(key, " %d", (int)m->dtype);
  return g_string_free(key, FALSE);
}

/* One op of a bf16 model in the sums of weight-copy time and parameters (every layer's). */
static void count_copy(struct gpu *g, const struct model *m, const struct model_op *op,
                       double seconds) {
  if (m->dtype == MODEL_DTYPE_FP32)
    return;
  g->copy_seconds += seconds;
  g->copy_params += (double)op->param_count;
}

/* One op of a model unless its key was seen; a model op (counted) also goes into the sums of
 * weight-copy time, an expert-parallel variant does not (its weights are a model op's). */
static bool measure_key(struct prof_run *r, struct gpu *g, const struct model *m,
                        const struct model_op *op, bool counted, size_t free_bytes,
                        GError **err) {
  char *key = op_key(m, op);
  const double *known = g_hash_table_lookup(g->copy_s, key);
  if (known && counted)
    count_copy(g, m, op, *known);
  if (g_hash_table_contains(r->seen, key)) {
    g_free(key);
    return true;
  }
  g_hash_table_add(r->seen, g_strdup(key));
  double bytes = prof_op_bench_bytes(m, op); /* cuda_op_init allocates the same buffers */
  if (!prof_op_has_kernel(op->kind) || bytes > 0.5 * (double)free_bytes) {
    prof_progress(r, "  %-13s %s: left to the roofline", model_op_kind_name(op->kind),
                  prof_op_has_kernel(op->kind) ? "buffers over half the GPU's free memory"
                                               : "no kernel");
    r->n_skipped++;
    g_free(key);
    return true;
  }
  double copy = 0;
  if (!measure_op(r, g, m, op, &copy, err)) {
    g_free(key);
    return false;
  }
  if (counted)
    count_copy(g, m, op, copy);
  g_hash_table_insert(g->copy_s, key, g_memdup2(&copy, sizeof copy));
  return true;
}

/* A model's ops, then its expert ops' expert-parallel variants (PROFILE_EP_DIM). */
static bool measure_model(struct prof_run *r, struct gpu *g, const struct model *m,
                          size_t free_bytes, GError **err) {
  gemm_precision(g, m->dtype != MODEL_DTYPE_FP32);
  prof_progress(r, "kernels of %s (%u ops, %s GEMMs)", m->name, m->n_ops,
                m->dtype != MODEL_DTYPE_FP32 ? "bf16" : "fp32");
  bool ok = true;
  for (uint32_t i = 0; ok && i < m->n_ops; i++)
    ok = measure_key(r, g, m, &m->ops[i], true, free_bytes, err);
  GArray *v = prof_ep_variants(m);
  for (guint i = 0; ok && i < v->len; i++)
    ok = measure_key(r, g, m, &g_array_index(v, struct model_op, i), false, free_bytes, err);
  g_array_free(v, TRUE);
  return ok;
}

/* ---- the device: GEMM rate, copy bandwidth, AdamW ---------------------------------------- */

struct copy_arg {
  struct gpu *g;
  void *dst, *src;
  size_t bytes;
};
static bool copy_task(struct exec_stream *s, void *arg, GError **err) {
  (void)err;
  struct copy_arg *c = arg;
  c->g->k->copy(s, c->dst, c->src, c->bytes);
  return true;
}

/* The GEMM rate: a SwiGLU MLP forward of T x C x F (three GEMMs, 6 T C F FLOPs, plus an
 * elementwise pass that is small beside them at these sizes). */
static bool gemm_rate(struct prof_run *r, struct gpu *g, bool bf16, double *flops, GError **err) {
  int T = r->a->quick ? 1024 : 4096, C = T, F = T;
  struct model_op op = {.kind = MODEL_OP_MLP, .shape = {T, C, F}};
  struct model m = {.dtype = bf16 ? MODEL_DTYPE_BF16 : MODEL_DTYPE_FP32, .vocab_size = 1};
  struct cuda_op o;
  gemm_precision(g, bf16);
  bool ok = cuda_op_init(&o, g, &m, &op);
  double t = 0;
  o.b.pass = IR_PASS_F;
  ok = ok ? gpu_median(g, r->a->warmup, r->a->quick ? 5 : 11, op_task, &o, &t, err)
          : piper_runtime_error(err, "piper-prof: no device memory for the GEMM rate");
  cuda_op_free(&o);
  *flops = ok && t > 0 ? 6.0 * T * (double)C * F / t : 0;
  if (ok)
    prof_progress(r, "GEMM (%s, MLP %dx%dx%d): %.1f TFLOP/s", bf16 ? "bf16" : "fp32", T, C, F,
                  *flops / 1e12);
  return ok;
}

static bool copy_rate(struct prof_run *r, struct gpu *g, GError **err) {
  struct copy_arg c = {.g = g, .bytes = (size_t)(r->a->quick ? 64 : 1024) << 20};
  c.dst = exec_backend_alloc(g->b, c.bytes);
  c.src = exec_backend_alloc(g->b, c.bytes);
  double t = 0;
  bool ok = c.dst && c.src ? gpu_median(g, r->a->warmup, 11, copy_task, &c, &t, err)
                           : piper_runtime_error(err, "piper-prof: no device memory for a copy");
  if (c.dst)
    exec_backend_release(g->b, c.dst);
  if (c.src)
    exec_backend_release(g->b, c.src);
  r->triad_bytes = ok && t > 0 ? 2.0 * (double)c.bytes / t : 0;
  if (ok)
    prof_progress(r, "device copy: %.1f GB/s", r->triad_bytes / 1e9);
  return ok;
}

/* AdamW at 4 sizes up to the largest model's parameter count (by 4x; at most 256 M: 4 GiB of
 * its 4 floats per parameter), fitted as the host profiler fits its own. */
static bool adamw_fit(struct prof_run *r, struct gpu *g, uint64_t max_params, GError **err) {
  enum { N = 4 };
  double x[N], y[N];
  if (max_params > ((uint64_t)1 << 28))
    max_params = (uint64_t)1 << 28;
  bool ok = true;
  for (int i = 0; i < N && ok; i++) {
    struct adamw_arg w = {.g = g, .n = (size_t)(max_params >> (2 * (N - 1 - i)))};
    if (w.n < 1024)
      w.n = 1024;
    w.p = device_floats(g, w.n, 11, 1), w.grad = device_floats(g, w.n, 12, 1);
    w.m = device_floats(g, w.n, 0, 0), w.v = device_floats(g, w.n, 0, 0);
    x[i] = (double)w.n;
    ok = w.p && w.grad && w.m && w.v
             ? gpu_median(g, r->a->warmup, r->a->quick ? 5 : 11, adamw_task, &w, &y[i], err)
             : piper_runtime_error(err, "piper-prof: no device memory for AdamW");
    float *bufs[] = {w.p, w.grad, w.m, w.v};
    for (int k = 0; k < 4; k++)
      if (bufs[k])
        exec_backend_release(g->b, bufs[k]);
    if (ok)
      prof_progress(r, "AdamW %zu parameters: %.1f us", w.n, y[i] * 1e6);
  }
  if (!ok)
    return false;
  prof_fit_line(x, y, N, &r->adamw_overhead, &r->adamw_per_param);
  if (r->adamw_overhead < 0)
    r->adamw_overhead = 0;
  return true;
}

/* ---- NCCL (under mpirun, one GPU per rank) ----------------------------------------------- */

struct net_arg {
  struct gpu *g;
  struct exec_comm *comm;
  enum net_kind kind;
  size_t bytes; /* the simulator's convention per kind (profile_comm_cost) */
  uint32_t me, n;
  float *send, *recv;
  size_t *counts_send, *counts_recv;
};

static bool net_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  struct net_arg *c = arg;
  struct exec_backend *b = c->g->b;
  size_t per = c->bytes / c->n;
  switch (c->kind) {
  case NET_P2P:
    /* one transfer from member 0 to member 1 */
    if (c->me == 0)
      return exec_comm_send(b, c->comm, 1, c->send, c->bytes, 7, err);
    return c->me != 1 || exec_comm_recv(b, c->comm, 0, c->recv, c->bytes, 7, err);
  case NET_ALL_REDUCE: return exec_comm_all_reduce_f32(b, c->comm, c->send, c->bytes / 4, err);
  case NET_REDUCE_SCATTER:
    return exec_comm_reduce_scatter_f32(b, c->comm, c->send, c->recv, per / 4, err);
  case NET_ALL_GATHER: return exec_comm_all_gather(b, c->comm, c->send, c->recv, per, err);
  case NET_ALL_TO_ALL:
    return exec_comm_all_to_all_v(b, c->comm, c->send, c->counts_send, c->recv, c->counts_recv,
                                  err);
  default: PIPER_UNREACHABLE();
  }
  return false;
}

/* The slowest member's median GPU time of one operation (each rank's own median, then the
 * maximum: the members start together after a barrier and an idle GPU). */
static bool net_point(struct prof_run *r, struct net_arg *c, MPI_Comm sub, double *t,
                      GError **err) {
  for (uint32_t k = 0; k < c->n; k++)
    c->counts_send[k] = c->counts_recv[k] = c->bytes / c->n;
  MPI_Barrier(sub);
  uint32_t reps = c->bytes > ((size_t)1 << 20) ? 7 : (r->a->quick ? 7 : 21);
  double mine = 0;
  bool ok = gpu_median(c->g, r->a->warmup, reps, net_task, c, &mine, err);
  int okv = ok, all = 0;
  MPI_Allreduce(&okv, &all, 1, MPI_INT, MPI_MIN, sub);
  MPI_Allreduce(&mine, t, 1, MPI_DOUBLE, MPI_MAX, sub);
  if (ok && !all)
    ok = piper_runtime_error(err, "piper-prof: a peer's NCCL measurement failed");
  return ok;
}

static bool net_group(struct prof_run *r, struct gpu *g, uint32_t n, struct net_points *pts,
                      GError **err) {
  uint32_t *members = g_new(uint32_t, n);
  for (uint32_t k = 0; k < n; k++)
    members[k] = k;
  char label[64];
  g_snprintf(label, sizeof label, "piper-prof %u ranks", n);
  GError *cerr = NULL;
  struct exec_comm *comm = exec_comm_create(g->b, label, members, n, false, &cerr);
  g_free(members);
  /* every rank learns whether all made it, so none goes on to wait for a failed one */
  int made = cerr == NULL, all_made = 0;
  MPI_Allreduce(&made, &all_made, 1, MPI_INT, MPI_MIN, r->comm);
  if (!all_made) {
    exec_comm_destroy(g->b, comm);
    if (cerr)
      g_propagate_error(err, cerr);
    return cerr ? false
                : piper_runtime_error(err,
                                      "piper-prof: another rank could not make the "
                                      "communicator of %u ranks",
                                      n);
  }
  bool member = (uint32_t)r->rank < n, ok = true;
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(r->comm, member ? 0 : MPI_UNDEFINED, r->rank, &sub);
  int max_log4 = r->a->quick ? 8 : 11; /* 8 B .. 128 KiB or 8 MiB, by 4x */
  size_t max_bytes = ((size_t)8 << (2 * (max_log4 - 1))) + (size_t)4 * n;
  struct net_arg c = {.g = g, .comm = comm, .me = (uint32_t)r->rank, .n = n};
  c.send = member ? device_floats(g, max_bytes / 4 + 1, 0, 0) : NULL;
  c.recv = member ? device_floats(g, max_bytes / 4 + 1, 0, 0) : NULL;
  c.counts_send = g_new(size_t, n), c.counts_recv = g_new(size_t, n);
  for (int k = 0; member && ok && k < NET_N; k++) {
    if (k == NET_P2P && n != 2)
      continue;
    c.kind = (enum net_kind)k;
    for (int s = 0; ok && s < max_log4; s++) {
      size_t unit = (size_t)4 * n; /* whole floats per rank */
      c.bytes = (((size_t)8 << (2 * s)) + unit - 1) / unit * unit;
      double t = 0;
      ok = net_point(r, &c, sub, &t, err);
      double pv = n, nv = (double)c.bytes;
      g_array_append_val(pts[k].p, pv);
      g_array_append_val(pts[k].n, nv);
      g_array_append_val(pts[k].t, t);
    }
    if (ok)
      prof_progress(r, "  %-14s %u ranks: %u sizes", prof_net_names[k], n, (unsigned)max_log4);
  }
  if (c.send)
    exec_backend_release(g->b, c.send);
  if (c.recv)
    exec_backend_release(g->b, c.recv);
  g_free(c.counts_send), g_free(c.counts_recv);
  if (sub != MPI_COMM_NULL)
    MPI_Comm_free(&sub);
  exec_comm_destroy(g->b, comm);
  /* every rank agrees before the next group's communicator is made */
  int okv = ok, all = 0;
  MPI_Allreduce(&okv, &all, 1, MPI_INT, MPI_MIN, r->comm);
  if (ok && !all)
    ok = piper_runtime_error(err, "piper-prof: another rank's NCCL measurement failed");
  return ok;
}

static bool measure_nccl(struct prof_run *r, struct gpu *g, GError **err) {
  struct net_points pts[NET_N];
  for (int k = 0; k < NET_N; k++)
    pts[k] = (struct net_points){g_array_new(FALSE, FALSE, sizeof(double)),
                                 g_array_new(FALSE, FALSE, sizeof(double)),
                                 g_array_new(FALSE, FALSE, sizeof(double))};
  prof_progress(r, "NCCL over 2 to %d ranks (%s)", r->size, exec_backend_comm_library(g->b));
  bool ok = true;
  for (uint32_t n = 2; ok && n <= (uint32_t)r->size; n++)
    ok = net_group(r, g, n, pts, err);
  if (ok && r->rank == 0)
    prof_net_record(r, pts);
  r->network_measured = ok;
  for (int k = 0; k < NET_N; k++)
    g_array_free(pts[k].p, TRUE), g_array_free(pts[k].n, TRUE), g_array_free(pts[k].t, TRUE);
  return ok;
}

/* ---- the whole run ------------------------------------------------------------------------ */

static bool gpu_facts(struct prof_run *r, struct gpu *g, size_t *free_bytes, GError **err) {
  struct exec_cuda_facts f;
  if (!exec_cuda_facts(g->b, &f, err))
    return false;
  *free_bytes = f.free_bytes;
  g_strlcpy(r->gpu_name, f.name, sizeof r->gpu_name);
  r->gpu_memory_gib = (double)f.total_bytes / 1073741824.0;
  r->gpu_sms = (uint32_t)f.n_sms;
  prof_progress(r, "%s: %d SMs, %.1f GiB (%.1f GiB free)", r->gpu_name, f.n_sms, r->gpu_memory_gib,
                (double)*free_bytes / 1073741824.0);
  return true;
}

static bool measure_gpu(struct prof_run *r, struct gpu *g, GPtrArray *models, GError **err) {
  size_t free_bytes = 0;
  if (!gpu_facts(r, g, &free_bytes, err))
    return false;
  uint64_t max_params = 0;
  for (guint i = 0; i < models->len; i++) {
    uint64_t n = model_param_count(g_ptr_array_index(models, i));
    max_params = n > max_params ? n : max_params;
  }
  bool ok = gemm_rate(r, g, true, &r->gemm_flops_bf16, err) &&
            gemm_rate(r, g, false, &r->gemm_flops, err) && copy_rate(r, g, err) &&
            adamw_fit(r, g, max_params, err);
  g->copy_s = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  for (guint i = 0; ok && i < models->len; i++)
    ok = measure_model(r, g, g_ptr_array_index(models, i), free_bytes, err);
  g_hash_table_destroy(g->copy_s);
  if (!ok)
    return false;
  /* the bf16 models' weight copies as traffic per parameter at the copy bandwidth, so the
   * simulator charges them as it charges AdamW (profile_optimizer_cost) */
  if (g->copy_params > 0)
    r->weight_copy_bytes_per_param = g->copy_seconds / g->copy_params * r->triad_bytes;
  r->compute_copy_bytes_per_param = PROF_CUDA_COMPUTE_COPY_BYTES;
  r->cores = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
  r->instruction_overhead = prof_instruction_cost(g->b, r->a->quick ? 2000 : 20000, err);
  if (r->instruction_overhead < 0)
    return false;
  prof_progress(r,
                "%u kernel entries, %u op shapes left to the roofline; the host thread "
                "enqueues an instruction in %.2f us",
                r->n_entries, r->n_skipped, r->instruction_overhead * 1e6);
  return true;
}

static bool cuda_measure(struct prof_run *r, GPtrArray *models, GError **err) {
  const struct exec_backend_ops *ops = exec_backend_find("cuda");
  PIPER_ASSERT(ops != NULL);
  struct gpu g = {0};
  /* MPI is already started under mpirun (prof_run); the backend then uses it */
  g.b = exec_backend_init(ops, NULL, err);
  if (!g.b)
    return false;
  g.k = exec_backend_kernels(g.b);
  bool ok = (g.s = exec_stream_create(g.b, "piper-prof", 0, err)) != NULL;
  if (ok)
    g.done = exec_event_create(g.b);
  if (ok && r->size > 1)
    ok = measure_nccl(r, &g, err);
  /* rank 0 alone times the kernels: the others' GPUs are theirs, but one profile is written */
  if (ok && r->rank == 0)
    ok = measure_gpu(r, &g, models, err);
  if (g.done)
    exec_event_destroy(g.b, g.done);
  if (g.s)
    exec_stream_destroy(g.b, g.s);
  exec_backend_free(g.b);
  return ok;
}

/* Every rank its own GPU for the network, rank 0 the kernels; the others then wait for rank 0
 * to write the profile. */
bool prof_cuda_measure(struct prof_run *r, GPtrArray *models, GError **err) {
  r->failed = !cuda_measure(r, models, err);
  if (r->size > 1 && r->rank != 0) {
    if (!r->failed)
      prof_idle_until_released(r);
    return false;
  }
  return !r->failed;
}
