/* backend_cuda_cudnn: cuda_cudnn.h, the attention core from cuDNN's fused SDPA. The graphs are
 * the ones cuDNN's frontend (cudnn-frontend's SDPA node, causal mask as its diagonal band)
 * hands the backend, node for node, so that the fused-attention engine recognises them:
 *   forward:  S = Q Kᵀ; S *= scale; mask (row + shift >= col, else -inf); max, sub, exp, sum,
 *             log, Stats = max + log sum; P = exp / sum; O = P V
 *   backward: softmax_sum = rowsum(dO * O) (* 1); S as forward; P = exp(S - Stats); dV = Pᵀ dO
 *             (summed over a kv head's query heads); dS = P (dO Vᵀ - softmax_sum) * scale;
 *             dK = dSᵀ Q (summed likewise); dQ_accum = dS K (fp32); dQ = dQ_accum
 * where shift = q_offset - kv_offset (no node when 0). Tensors are 4-D [B, heads, S, D] with
 * the strides of the executor's [B*S, heads*D] rows, so no copy reorders them; K and V enter
 * the products as transposed views (strides swapped), as the frontend passes them. */
#include "cuda_cudnn.h"

#include <math.h>
#include <string.h>

#include "../base/base.h"

#ifndef HAVE_CUDNN

bool exec_cudnn_sdpa_built(void) {
  return false;
}

bool exec_cudnn_sdpa_supported(const struct exec_cudnn_sdpa_shape *s) {
  (void)s;
  return false;
}

struct exec_cudnn_sdpa *exec_cudnn_sdpa_new(GError **err) {
  piper_runtime_error(err, "attention from cuDNN: this build has no cuDNN (NO_CUDNN=1, or no "
                           "cudnn.h under CUDA_HOME)");
  return NULL;
}

void exec_cudnn_sdpa_free(struct exec_cudnn_sdpa *c) {
  (void)c;
}

bool exec_cudnn_sdpa_forward(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                             float *y, float *lse, const float *q, const float *k, const float *v,
                             cudaStream_t st, GError **err) {
  (void)c, (void)s, (void)y, (void)lse, (void)q, (void)k, (void)v, (void)st;
  return exec_cudnn_sdpa_new(err) != NULL;
}

bool exec_cudnn_sdpa_backward(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                              float *dq, float *dk, float *dv, const float *q, const float *k,
                              const float *v, const float *y, const float *dy, const float *lse,
                              cudaStream_t st, GError **err) {
  (void)c, (void)s, (void)dq, (void)dk, (void)dv, (void)q, (void)k, (void)v, (void)y, (void)dy;
  (void)lse, (void)st;
  return exec_cudnn_sdpa_new(err) != NULL;
}

#else /* HAVE_CUDNN */

#include <cudnn.h>

#include "../kernels/kernels_cuda.h"

/* the variant pack's tensors (ids of the graph's non-virtual tensors); virtual ones count up
 * from UID_VIRTUAL */
enum {
  UID_Q = 1,
  UID_K,
  UID_V,
  UID_O,
  UID_STATS,
  UID_DO,
  UID_DQ,
  UID_DK,
  UID_DV,
  UID_SOFTMAX_SUM,
  UID_DQ_ACCUM,
  UID_SCALE, /* by value: 1/sqrt(D) */
  UID_SHIFT, /* by value: q_offset - kv_offset (int32) */
  UID_NEG_INF,
  UID_ONE,
  UID_VIRTUAL = 100,
};

#define GRAPH_MAX_DESCS 128
#define GRAPH_MAX_OPS 48

/* One graph under construction and, once finalized, its plan: every descriptor it made is
 * kept (the plan refers to them) and destroyed with it. The first failing call is recorded
 * and every later call skipped, so a builder reads as the list of its nodes. */
struct graph {
  cudnnHandle_t handle;
  cudnnBackendDescriptor_t descs[GRAPH_MAX_DESCS];
  int n_descs;
  cudnnBackendDescriptor_t ops[GRAPH_MAX_OPS];
  int n_ops;
  int64_t next_uid;
  cudnnBackendDescriptor_t scalars[UID_ONE + 1]; /* one descriptor per by-value uid */
  cudnnStatus_t status;
  const char *failed; /* the cuDNN call or node that failed */
  cudnnBackendDescriptor_t plan;
  int64_t workspace;
};

struct plan_entry {
  struct exec_cudnn_sdpa_shape shape;
  bool backward;
  struct graph *g;
};

struct exec_cudnn_sdpa {
  cudnnHandle_t handle;
  GMutex lock;   /* streams of one device enqueue from their own threads */
  GPtrArray *plans; /* struct plan_entry */
};

static cudnnBackendDescriptor_t make(struct graph *g, cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = NULL;
  if (g->status != CUDNN_STATUS_SUCCESS)
    return NULL;
  if (g->n_descs == GRAPH_MAX_DESCS) {
    g->status = CUDNN_STATUS_INTERNAL_ERROR;
    g->failed = "too many descriptors for one graph";
    return NULL;
  }
  g->status = cudnnBackendCreateDescriptor(type, &d);
  if (g->status != CUDNN_STATUS_SUCCESS) {
    g->failed = "cudnnBackendCreateDescriptor";
    return NULL;
  }
  g->descs[g->n_descs++] = d;
  return d;
}

static void set(struct graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *v) {
  if (g->status != CUDNN_STATUS_SUCCESS)
    return;
  g->status = cudnnBackendSetAttribute(d, name, type, count, v);
  if (g->status != CUDNN_STATUS_SUCCESS)
    g->failed = "cudnnBackendSetAttribute";
}

static void finalize(struct graph *g, cudnnBackendDescriptor_t d, const char *what) {
  if (g->status != CUDNN_STATUS_SUCCESS)
    return;
  g->status = cudnnBackendFinalize(d);
  if (g->status != CUDNN_STATUS_SUCCESS)
    g->failed = what;
}

/* a 4-D tensor; uid 0 makes a virtual one (an intermediate cuDNN keeps on chip) */
static cudnnBackendDescriptor_t tensor(struct graph *g, int64_t uid, cudnnDataType_t type,
                                       const int64_t dim[4], const int64_t stride[4],
                                       bool by_value) {
  cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  bool virt = uid == 0;
  int64_t id = virt ? g->next_uid++ : uid, align = 16;
  set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
  set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
  set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
  set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
  if (by_value)
    set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  finalize(g, t, "tensor descriptor");
  return t;
}

/* a [1, 1, 1, 1] scalar passed by value at execution, one descriptor per uid however many
 * nodes read it (the backward scales twice) */
static cudnnBackendDescriptor_t scalar(struct graph *g, int64_t uid, cudnnDataType_t type) {
  static const int64_t one[4] = {1, 1, 1, 1};
  if (!g->scalars[uid])
    g->scalars[uid] = tensor(g, uid, type, one, one, true);
  return g->scalars[uid];
}

static void add_op(struct graph *g, cudnnBackendDescriptor_t op, const char *what) {
  finalize(g, op, what);
  if (g->status != CUDNN_STATUS_SUCCESS)
    return;
  if (g->n_ops == GRAPH_MAX_OPS) {
    g->status = CUDNN_STATUS_INTERNAL_ERROR;
    g->failed = "too many operations for one graph";
    return;
  }
  g->ops[g->n_ops++] = op;
}

/* y = mode(x[, b[, t]]) computed in prec; axis >= 0 for GEN_INDEX */
static void pointwise(struct graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
  cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  if (axis >= 0)
    set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  finalize(g, pw, "pointwise descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b)
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  if (t)
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  add_op(g, op, "pointwise operation");
}

static void reduction(struct graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
  set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  finalize(g, r, "reduction descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  add_op(g, op, "reduction operation");
}

/* c = a b over the last two dimensions, batched over the first two (b's heads broadcast over
 * a's query heads: grouped-query attention) */
static void matmul(struct graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t m = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  finalize(g, m, "matmul descriptor");
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  add_op(g, op, "matmul operation");
}

static void reshape(struct graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  add_op(g, op, "reshape operation");
}

/* The dims and strides the graphs share. rows: [B, heads, S, D] over [B*S, heads*D] rows;
 * t: its transpose [B, heads, D, S]; scores [B, H, Sq, Skv] packed, and its transpose. */
struct dims {
  int64_t q[4], qs[4], kv[4], kvs[4], kt[4], kts[4];
  int64_t sc[4], scs[4], sct[4], scts[4], row[4], rows[4];
};

static struct dims dims_of(const struct exec_cudnn_sdpa_shape *s) {
  int64_t B = s->batch, H = s->heads, KV = s->kv_heads, Sq = s->seq_q, Sk = s->seq_kv;
  int64_t D = s->head_dim;
  struct dims d = {
      .q = {B, H, Sq, D},
      .qs = {Sq * H * D, D, H * D, 1},
      .kv = {B, KV, Sk, D},
      .kvs = {Sk * KV * D, D, KV * D, 1},
      .kt = {B, KV, D, Sk},
      .kts = {Sk * KV * D, D, 1, KV * D},
      .sc = {B, H, Sq, Sk},
      .scs = {H * Sq * Sk, Sq * Sk, Sk, 1},
      .sct = {B, H, Sk, Sq},
      .scts = {H * Sq * Sk, Sq * Sk, 1, Sk},
      .row = {B, H, Sq, 1},
      .rows = {H * Sq, Sq, 1, 1},
  };
  return d;
}

/* The causal mask of the scores x (virtual float), the frontend's diagonal band with its
 * right bound at the diagonal: keep where row + shift >= col, else -inf. */
static cudnnBackendDescriptor_t causal(struct graph *g, const struct dims *d,
                                       cudnnBackendDescriptor_t x, bool shifted) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
  cudnnBackendDescriptor_t row = tensor(g, 0, i32, d->sc, d->scs, false);
  cudnnBackendDescriptor_t col = tensor(g, 0, i32, d->sc, d->scs, false);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, row, 2);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, f32, x, NULL, NULL, col, 3);
  if (shifted) {
    cudnnBackendDescriptor_t moved = tensor(g, 0, i32, d->sc, d->scs, false);
    pointwise(g, CUDNN_POINTWISE_ADD, i32, row, scalar(g, UID_SHIFT, i32), NULL, moved, -1);
    row = moved;
  }
  cudnnBackendDescriptor_t keep = tensor(g, 0, b8, d->sc, d->scs, false);
  pointwise(g, CUDNN_POINTWISE_CMP_GE, b8, row, col, NULL, keep, -1);
  cudnnBackendDescriptor_t y = tensor(g, 0, f32, d->sc, d->scs, false);
  pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, f32, x, scalar(g, UID_NEG_INF, f32), keep, y, -1);
  return y;
}

/* scale (Q Kᵀ) masked: the scores both passes start from (q, kt: the operands) */
static cudnnBackendDescriptor_t scores(struct graph *g, const struct dims *d,
                                       cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt) {
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t s = tensor(g, 0, f32, d->sc, d->scs, false);
  matmul(g, q, kt, s);
  cudnnBackendDescriptor_t scaled = tensor(g, 0, f32, d->sc, d->scs, false);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, s, scalar(g, UID_SCALE, f32), NULL, scaled, -1);
  return scaled;
}

static void build_forward(struct graph *g, const struct exec_cudnn_sdpa_shape *s) {
  struct dims d = dims_of(s);
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf = CUDNN_DATA_BFLOAT16;
  bool shifted = s->q_offset != s->kv_offset;
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, bf, d.q, d.qs, false);
  cudnnBackendDescriptor_t kt = tensor(g, UID_K, bf, d.kt, d.kts, false);
  cudnnBackendDescriptor_t v = tensor(g, UID_V, bf, d.kv, d.kvs, false);
  cudnnBackendDescriptor_t x = causal(g, &d, scores(g, &d, q, kt), shifted);
  cudnnBackendDescriptor_t mx = tensor(g, 0, f32, d.row, d.rows, false);
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, x, mx);
  cudnnBackendDescriptor_t sub = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, x, mx, NULL, sub, -1);
  cudnnBackendDescriptor_t e = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, sub, NULL, NULL, e, -1);
  cudnnBackendDescriptor_t sum = tensor(g, 0, f32, d.row, d.rows, false);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
  cudnnBackendDescriptor_t lg = tensor(g, 0, f32, d.row, d.rows, false);
  pointwise(g, CUDNN_POINTWISE_LOG, f32, sum, NULL, NULL, lg, -1);
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, d.row, d.rows, false);
  pointwise(g, CUDNN_POINTWISE_ADD, f32, mx, lg, NULL, stats, -1);
  /* P in the operands' type: cuDNN's fused engines take the second product's A as bf16 (the
   * frontend sets it so) */
  cudnnBackendDescriptor_t p = tensor(g, 0, bf, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_DIV, f32, e, sum, NULL, p, -1);
  matmul(g, p, v, tensor(g, UID_O, bf, d.q, d.qs, false));
}

/* dV (or dK) = xᵀ y summed over each kv head's query heads: straight into out when every query
 * head has its own, else through a [B, H, Skv, D] full-head product and a reduction */
static void head_product(struct graph *g, const struct exec_cudnn_sdpa_shape *s,
                         cudnnBackendDescriptor_t xt,
                         cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t out) {
  if (s->heads == s->kv_heads) {
    matmul(g, xt, y, out);
    return;
  }
  int64_t B = s->batch, H = s->heads, Sk = s->seq_kv, D = s->head_dim;
  int64_t full[4] = {B, H, Sk, D}, fulls[4] = {H * Sk * D, Sk * D, D, 1};
  cudnnBackendDescriptor_t f = tensor(g, 0, CUDNN_DATA_BFLOAT16, full, fulls, false);
  matmul(g, xt, y, f);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, f, out);
}

/* a virtual bf16 transpose [B, H, Skv, Sq] of the scores-shaped x */
static cudnnBackendDescriptor_t transposed(struct graph *g, const struct dims *d,
                                           cudnnBackendDescriptor_t x) {
  cudnnBackendDescriptor_t t = tensor(g, 0, CUDNN_DATA_BFLOAT16, d->sct, d->scts, false);
  reshape(g, x, t);
  return t;
}

static void build_backward(struct graph *g, const struct exec_cudnn_sdpa_shape *s) {
  struct dims d = dims_of(s);
  cudnnDataType_t f32 = CUDNN_DATA_FLOAT, bf = CUDNN_DATA_BFLOAT16;
  bool shifted = s->q_offset != s->kv_offset;
  int64_t B = s->batch, H = s->heads, Sq = s->seq_q, D = s->head_dim;
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, bf, d.q, d.qs, false);
  cudnnBackendDescriptor_t kt = tensor(g, UID_K, bf, d.kt, d.kts, false);
  cudnnBackendDescriptor_t vt = tensor(g, UID_V, bf, d.kt, d.kts, false);
  cudnnBackendDescriptor_t o = tensor(g, UID_O, bf, d.q, d.qs, false);
  cudnnBackendDescriptor_t dO = tensor(g, UID_DO, bf, d.q, d.qs, false);
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, d.row, d.rows, false);
  /* softmax_sum = rowsum(dO * O), in the caller's scratch */
  cudnnBackendDescriptor_t dOo = tensor(g, 0, f32, d.q, d.qs, false);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dO, o, NULL, dOo, -1);
  cudnnBackendDescriptor_t red = tensor(g, 0, f32, d.row, d.rows, false);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, dOo, red);
  cudnnBackendDescriptor_t ssum = tensor(g, UID_SOFTMAX_SUM, f32, d.row, d.rows, false);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, red, scalar(g, UID_ONE, f32), NULL, ssum, -1);
  /* P = exp(masked scores - Stats) */
  cudnnBackendDescriptor_t x = scores(g, &d, q, kt);
  cudnnBackendDescriptor_t xs = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, x, stats, NULL, xs, -1);
  xs = causal(g, &d, xs, shifted);
  cudnnBackendDescriptor_t p = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, xs, NULL, NULL, p, -1);
  head_product(g, s, transposed(g, &d, p), dO, tensor(g, UID_DV, bf, d.kv, d.kvs, false));
  /* dS = P (dO Vᵀ - softmax_sum) scale */
  cudnnBackendDescriptor_t dp = tensor(g, 0, f32, d.sc, d.scs, false);
  matmul(g, dO, vt, dp);
  cudnnBackendDescriptor_t dps = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, dp, ssum, NULL, dps, -1);
  cudnnBackendDescriptor_t dsp = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dps, p, NULL, dsp, -1);
  cudnnBackendDescriptor_t ds = tensor(g, 0, f32, d.sc, d.scs, false);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dsp, scalar(g, UID_SCALE, f32), NULL, ds, -1);
  head_product(g, s, transposed(g, &d, ds), q, tensor(g, UID_DK, bf, d.kv, d.kvs, false));
  /* dQ = dS K, accumulated in fp32 (dQ_accum, zeroed by the caller), then rounded */
  cudnnBackendDescriptor_t k = tensor(g, 0, bf, d.kv, d.kvs, false);
  reshape(g, kt, k);
  int64_t acc[4] = {B, H, Sq, D}, accs[4] = {H * Sq * D, Sq * D, D, 1};
  cudnnBackendDescriptor_t dqa = tensor(g, UID_DQ_ACCUM, f32, acc, accs, false);
  matmul(g, ds, k, dqa);
  pointwise(g, CUDNN_POINTWISE_IDENTITY, f32, dqa, NULL, NULL, tensor(g, UID_DQ, bf, d.q, d.qs, false),
            -1);
}

/* The graph's ops finalized into an operation graph, then the first engine configuration of
 * cuDNN's heuristics (mode A) that finalizes into an execution plan, and its workspace. */
static void plan(struct graph *g) {
  cudnnBackendDescriptor_t og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
  set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->handle);
  finalize(g, og, "operation graph (cuDNN has no engine for this attention graph)");
  cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
  set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(g, heur, "engine heuristics");
  enum { CONFIGS = 8 };
  cudnnBackendDescriptor_t cfg[CONFIGS];
  for (int i = 0; i < CONFIGS; i++)
    cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t n = 0;
  if (g->status == CUDNN_STATUS_SUCCESS) {
    g->status = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, CONFIGS, &n, cfg);
    g->failed = "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)";
  }
  for (int64_t i = 0; g->status == CUDNN_STATUS_SUCCESS && i < n && !g->plan; i++) {
    cudnnBackendDescriptor_t p = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(g, p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->handle);
    set(g, p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
    if (g->status == CUDNN_STATUS_SUCCESS && cudnnBackendFinalize(p) == CUDNN_STATUS_SUCCESS)
      g->plan = p; /* a configuration that does not finalize is skipped, as the frontend does */
  }
  if (g->status == CUDNN_STATUS_SUCCESS && !g->plan) {
    g->status = CUDNN_STATUS_NOT_SUPPORTED;
    g->failed = "execution plan (no engine configuration finalized)";
  }
  int64_t got = 0;
  if (g->status == CUDNN_STATUS_SUCCESS) {
    g->status = cudnnBackendGetAttribute(g->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &got, &g->workspace);
    g->failed = "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)";
  }
  if (g->status == CUDNN_STATUS_SUCCESS)
    g->failed = NULL;
}

static void graph_free(struct graph *g) {
  if (!g)
    return;
  for (int i = g->n_descs - 1; i >= 0; i--)
    cudnnBackendDestroyDescriptor(g->descs[i]);
  g_free(g);
}

static bool same_shape(const struct exec_cudnn_sdpa_shape *a, const struct exec_cudnn_sdpa_shape *b) {
  return a->batch == b->batch && a->seq_q == b->seq_q && a->seq_kv == b->seq_kv &&
         a->heads == b->heads && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
         (a->q_offset != a->kv_offset) == (b->q_offset != b->kv_offset);
}

static bool cudnn_failed(GError **err, cudnnStatus_t st, const char *what,
                         const struct exec_cudnn_sdpa_shape *s, bool backward) {
  return piper_runtime_error(err,
                             "attention from cuDNN (%s, B %d Sq %d Skv %d H %d/%d D %d): %s: %s "
                             "(%s:%d)",
                             backward ? "backward" : "forward", s->batch, s->seq_q, s->seq_kv,
                             s->heads, s->kv_heads, s->head_dim, what, cudnnGetErrorString(st),
                             __FILE__, __LINE__);
}

/* The plan of shape s and pass, built on first use (under c->lock). The shift's value is
 * passed at execution, so one plan serves every chunk offset of a shape. */
static struct graph *plan_for(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                              bool backward, GError **err) {
  for (guint i = 0; i < c->plans->len; i++) {
    struct plan_entry *e = g_ptr_array_index(c->plans, i);
    if (e->backward == backward && same_shape(&e->shape, s))
      return e->g;
  }
  struct graph *g = g_new0(struct graph, 1);
  g->handle = c->handle;
  g->next_uid = UID_VIRTUAL;
  if (backward)
    build_backward(g, s);
  else
    build_forward(g, s);
  plan(g);
  if (g->status != CUDNN_STATUS_SUCCESS) {
    cudnn_failed(err, g->status, g->failed, s, backward);
    graph_free(g);
    return NULL;
  }
  struct plan_entry *e = g_new0(struct plan_entry, 1);
  e->shape = *s;
  e->backward = backward;
  e->g = g;
  g_ptr_array_add(c->plans, e);
  return g;
}

static void plan_entry_free(gpointer p) {
  struct plan_entry *e = p;
  graph_free(e->g);
  g_free(e);
}

bool exec_cudnn_sdpa_built(void) {
  return true;
}

bool exec_cudnn_sdpa_supported(const struct exec_cudnn_sdpa_shape *s) {
  return s->batch > 0 && s->seq_q > 0 && s->seq_kv > 0 && s->kv_heads > 0 &&
         s->heads % s->kv_heads == 0 && s->head_dim % 8 == 0 && s->head_dim >= 8 &&
         s->head_dim <= 128 && s->q_offset >= s->kv_offset &&
         s->q_offset - s->kv_offset <= INT32_MAX;
}

struct exec_cudnn_sdpa *exec_cudnn_sdpa_new(GError **err) {
  cudnnHandle_t h = NULL;
  cudnnStatus_t st = cudnnCreate(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    piper_runtime_error(err, "attention from cuDNN: cudnnCreate: %s (cuDNN %zu)",
                        cudnnGetErrorString(st), cudnnGetVersion());
    return NULL;
  }
  struct exec_cudnn_sdpa *c = g_new0(struct exec_cudnn_sdpa, 1);
  c->handle = h;
  g_mutex_init(&c->lock);
  c->plans = g_ptr_array_new_with_free_func(plan_entry_free);
  return c;
}

void exec_cudnn_sdpa_free(struct exec_cudnn_sdpa *c) {
  if (!c)
    return;
  g_ptr_array_free(c->plans, TRUE);
  cudnnDestroy(c->handle);
  g_mutex_clear(&c->lock);
  g_free(c);
}

/* Stream-ordered scratch: the bf16 copies and cuDNN's own buffers, carved at 256 bytes. */
struct carve {
  char *base;
  size_t used;
};

static void *carve(struct carve *c, size_t bytes) {
  void *p = c->base ? c->base + c->used : NULL;
  c->used += (bytes + 255) & ~(size_t)255;
  return p;
}

/* Runs plan g with the variant pack of (uids, ptrs) and its workspace, on st. */
static bool execute(struct exec_cudnn_sdpa *c, struct graph *g, const int64_t *uids, void **ptrs,
                    int n, void *workspace, cudaStream_t st, GError **err,
                    const struct exec_cudnn_sdpa_shape *s, bool backward) {
  struct graph vp = {.handle = c->handle};
  cudnnBackendDescriptor_t pack = make(&vp, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(&vp, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  set(&vp, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  set(&vp, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  finalize(&vp, pack, "variant pack");
  if (vp.status == CUDNN_STATUS_SUCCESS) {
    vp.status = cudnnSetStream(c->handle, st);
    vp.failed = "cudnnSetStream";
  }
  if (vp.status == CUDNN_STATUS_SUCCESS) {
    vp.status = cudnnBackendExecute(c->handle, g->plan, pack);
    vp.failed = "cudnnBackendExecute";
  }
  bool ok = vp.status == CUDNN_STATUS_SUCCESS || cudnn_failed(err, vp.status, vp.failed, s, backward);
  if (pack)
    cudnnBackendDestroyDescriptor(pack);
  return ok;
}

/* the by-value scalars of both graphs, read by cuDNN when the plan is enqueued */
struct scalars {
  float scale, neg_inf, one;
  int32_t shift;
};

static struct scalars scalars_of(const struct exec_cudnn_sdpa_shape *s) {
  struct scalars v = {1.0f / sqrtf((float)s->head_dim), -INFINITY, 1.0f,
                      (int32_t)(s->q_offset - s->kv_offset)};
  return v;
}

static bool scratch_alloc(struct carve *sc, cudaStream_t st, GError **err) {
  size_t bytes = sc->used;
  sc->used = 0;
  cudaError_t e = cudaMallocAsync((void **)&sc->base, bytes ? bytes : 1, st);
  if (e == cudaSuccess)
    return true;
  return piper_runtime_error(err, "attention from cuDNN: cudaMallocAsync of %zu bytes: %s", bytes,
                             cudaGetErrorString(e));
}

bool exec_cudnn_sdpa_forward(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                             float *y, float *lse, const float *q, const float *k, const float *v,
                             cudaStream_t st, GError **err) {
  g_mutex_lock(&c->lock);
  struct graph *g = plan_for(c, s, false, err);
  bool ok = g != NULL;
  int rq = s->batch * s->seq_q, rk = s->batch * s->seq_kv;
  int cq = s->heads * s->head_dim, ck = s->kv_heads * s->head_dim;
  size_t nq = (size_t)rq * cq, nk = (size_t)rk * ck;
  struct carve sc = {0};
  for (int pass = 0; ok && pass < 2; pass++) { /* sizes, then the allocation */
    if (pass == 1)
      ok = scratch_alloc(&sc, st, err);
    uint16_t *q16 = carve(&sc, nq * 2), *k16 = carve(&sc, nk * 2), *v16 = carve(&sc, nk * 2);
    uint16_t *o16 = carve(&sc, nq * 2);
    void *ws = carve(&sc, (size_t)g->workspace);
    if (pass == 0 || !ok)
      continue;
    kc_to_bf16(q16, q, rq, cq, cq, st);
    kc_to_bf16(k16, k, rk, ck, ck, st);
    kc_to_bf16(v16, v, rk, ck, ck, st);
    struct scalars sv = scalars_of(s);
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_SHIFT};
    void *ptrs[] = {q16, k16, v16, o16, lse, &sv.scale, &sv.neg_inf, &sv.shift};
    int n = s->q_offset != s->kv_offset ? 8 : 7;
    ok = execute(c, g, uids, ptrs, n, ws, st, err, s, false);
    if (ok)
      kc_from_bf16(y, o16, nq, st);
    cudaFreeAsync(sc.base, st);
  }
  g_mutex_unlock(&c->lock);
  return ok;
}

bool exec_cudnn_sdpa_backward(struct exec_cudnn_sdpa *c, const struct exec_cudnn_sdpa_shape *s,
                              float *dq, float *dk, float *dv, const float *q, const float *k,
                              const float *v, const float *y, const float *dy, const float *lse,
                              cudaStream_t st, GError **err) {
  g_mutex_lock(&c->lock);
  struct graph *g = plan_for(c, s, true, err);
  bool ok = g != NULL;
  int rq = s->batch * s->seq_q, rk = s->batch * s->seq_kv;
  int cq = s->heads * s->head_dim, ck = s->kv_heads * s->head_dim;
  size_t nq = (size_t)rq * cq, nk = (size_t)rk * ck, nrow = (size_t)s->batch * s->heads * s->seq_q;
  struct carve sc = {0};
  for (int pass = 0; ok && pass < 2; pass++) {
    if (pass == 1)
      ok = scratch_alloc(&sc, st, err);
    uint16_t *q16 = carve(&sc, nq * 2), *k16 = carve(&sc, nk * 2), *v16 = carve(&sc, nk * 2);
    uint16_t *o16 = carve(&sc, nq * 2), *do16 = carve(&sc, nq * 2), *dq16 = carve(&sc, nq * 2);
    uint16_t *dk16 = carve(&sc, nk * 2), *dv16 = carve(&sc, nk * 2);
    float *ssum = carve(&sc, nrow * 4), *dqa = carve(&sc, nq * 4);
    void *ws = carve(&sc, (size_t)g->workspace);
    if (pass == 0 || !ok)
      continue;
    kc_to_bf16(q16, q, rq, cq, cq, st);
    kc_to_bf16(k16, k, rk, ck, ck, st);
    kc_to_bf16(v16, v, rk, ck, ck, st);
    kc_to_bf16(o16, y, rq, cq, cq, st);
    kc_to_bf16(do16, dy, rq, cq, cq, st);
    kc_fill(dqa, 0.0f, nq, st); /* dQ is accumulated over key tiles */
    struct scalars sv = scalars_of(s);
    int64_t uids[] = {UID_Q,  UID_K,  UID_V,          UID_O,        UID_DO,    UID_STATS,
                      UID_DQ, UID_DK, UID_DV,         UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_SCALE,
                      UID_NEG_INF, UID_ONE, UID_SHIFT};
    void *ptrs[] = {q16,  k16,  v16,  o16,       do16,   (void *)lse, dq16,     dk16,
                    dv16, ssum, dqa,  &sv.scale, &sv.neg_inf, &sv.one, &sv.shift};
    int n = s->q_offset != s->kv_offset ? 15 : 14;
    ok = execute(c, g, uids, ptrs, n, ws, st, err, s, true);
    if (ok) {
      kc_from_bf16(dq, dq16, nq, st);
      kc_from_bf16(dk, dk16, nk, st);
      kc_from_bf16(dv, dv16, nk, st);
    }
    cudaFreeAsync(sc.base, st);
  }
  g_mutex_unlock(&c->lock);
  return ok;
}

#endif /* HAVE_CUDNN */
