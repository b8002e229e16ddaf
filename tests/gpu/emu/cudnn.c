/* cudnn: include/cudnn.h's backend API on the host (tests/gpu/emu/README.md), the part that
 * exec/backend_cuda_cudnn.c calls. What it checks, as cuDNN would refuse it:
 *   - setting an attribute of a finalized descriptor, or with the wrong type (BAD_PARAM);
 *   - finalizing without the attributes cuDNN requires of that descriptor (tensor: id, type,
 *     alignment, 4 dims and strides; operations: their descriptors and tensors, finalized;
 *     matmul: shapes that agree, batches that broadcast; reshape: the same element count);
 *   - an operation that reads a virtual tensor no earlier operation wrote;
 *   - an execution plan over any graph but the two SDPA graphs, node for node in the order
 *     cuDNN's frontend emits them (signature() below; NOT_SUPPORTED_GRAPH_PATTERN), with bf16
 *     Q, K, V, O, dO, dQ, dK, dV and fp32 Stats, softmax_sum, dQ_accum, and the forward's P
 *     bf16 where it enters P V;
 *   - executing with a tensor of the graph missing from the variant pack, or a buffer (or the
 *     workspace, sized by the plan) not inside one device allocation (abort, naming it).
 * The plan then runs the host's attention in double on the tensors as their dims and strides
 * place them, in stream order: the forward writes O (bf16, rounded to nearest even) and Stats,
 * the backward softmax_sum, dQ_accum (added to, as cuDNN's atomics do: the caller zeroes it),
 * dQ, dK, dV. The workspace holds each row's max and sum (it is used, so it must be there). */
#include <cudnn.h>
#include <glib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

struct emu_cudnn {
  cudaStream_t stream;
};

enum { MAX_ATTRS = 16 };
struct attr {
  int name, type;
  int64_t count;
  void *data;
};

struct emu_cudnn_desc {
  cudnnBackendDescriptorType_t type;
  bool finalized;
  struct attr attrs[MAX_ATTRS];
  int n_attrs;
  /* tensor */
  int64_t uid, dim[4], stride[4];
  int dtype;
  bool is_virtual, by_value;
  /* engine config (from the heuristics) and plan: the operation graph; plan: its kind */
  struct emu_cudnn_desc *graph;
  int kind; /* 1 forward, 2 backward */
  int64_t workspace;
};

static long n_plans, n_forward, n_backward;
static GMutex count_lock;

void emu_cudnn_counts(long *plans, long *forward, long *backward) {
  g_mutex_lock(&count_lock);
  *plans = n_plans, *forward = n_forward, *backward = n_backward;
  g_mutex_unlock(&count_lock);
}

size_t cudnnGetVersion(void) {
  return CUDNN_VERSION;
}

const char *cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
  case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
  case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
  case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
  case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
  case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
  default: return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  *h = g_new0(struct emu_cudnn, 1);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  g_free(h);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  if (!h)
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t *d) {
  *d = g_new0(struct emu_cudnn_desc, 1);
  (*d)->type = type;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  if (!d)
    return CUDNN_STATUS_SUCCESS;
  for (int i = 0; i < d->n_attrs; i++)
    g_free(d->attrs[i].data);
  g_free(d);
  return CUDNN_STATUS_SUCCESS;
}

static size_t type_bytes(cudnnBackendAttributeType_t t) {
  switch (t) {
  case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
  case CUDNN_TYPE_INT64: return 8;
  case CUDNN_TYPE_FLOAT: return 4;
  case CUDNN_TYPE_HANDLE:
  case CUDNN_TYPE_VOID_PTR:
  case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void *);
  default: return 4; /* the enums and INT32 */
  }
}

/* the type each attribute takes (cuDNN's documentation of the backend descriptors) */
static int attr_type(int name) {
  switch (name) {
  case CUDNN_ATTR_POINTWISE_MODE: return CUDNN_TYPE_POINTWISE_MODE;
  case CUDNN_ATTR_POINTWISE_MATH_PREC:
  case CUDNN_ATTR_TENSOR_DATA_TYPE:
  case CUDNN_ATTR_MATMUL_COMP_TYPE:
  case CUDNN_ATTR_REDUCTION_COMP_TYPE: return CUDNN_TYPE_DATA_TYPE;
  case CUDNN_ATTR_POINTWISE_AXIS:
  case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
  case CUDNN_ATTR_TENSOR_DIMENSIONS:
  case CUDNN_ATTR_TENSOR_STRIDES:
  case CUDNN_ATTR_TENSOR_UNIQUE_ID:
  case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
  case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: return CUDNN_TYPE_INT64;
  case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
  case CUDNN_ATTR_TENSOR_IS_BY_VALUE: return CUDNN_TYPE_BOOLEAN;
  case CUDNN_ATTR_ENGINEHEUR_MODE: return CUDNN_TYPE_HEUR_MODE;
  case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
  case CUDNN_ATTR_OPERATIONGRAPH_HANDLE: return CUDNN_TYPE_HANDLE;
  case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
  case CUDNN_ATTR_VARIANT_PACK_WORKSPACE: return CUDNN_TYPE_VOID_PTR;
  case CUDNN_ATTR_REDUCTION_OPERATOR: return CUDNN_TYPE_REDUCTION_OPERATOR_TYPE;
  default: return CUDNN_TYPE_BACKEND_DESCRIPTOR;
  }
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count,
                                       const void *v) {
  if (!d || !v)
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (d->finalized || (int)type != attr_type(name) || count < 1 || d->n_attrs == MAX_ATTRS)
    return CUDNN_STATUS_BAD_PARAM;
  struct attr *a = NULL;
  for (int i = 0; i < d->n_attrs; i++)
    if (d->attrs[i].name == (int)name)
      a = &d->attrs[i];
  if (!a)
    a = &d->attrs[d->n_attrs++];
  g_free(a->data);
  a->name = name, a->type = type, a->count = count;
  a->data = g_memdup2(v, type_bytes(type) * (size_t)count);
  return CUDNN_STATUS_SUCCESS;
}

static const struct attr *get(const struct emu_cudnn_desc *d, int name) {
  for (int i = 0; i < d->n_attrs; i++)
    if (d->attrs[i].name == name)
      return &d->attrs[i];
  return NULL;
}

/* the descriptor attribute name (a finalized one of type want, -1 any), or NULL */
static struct emu_cudnn_desc *desc_attr(const struct emu_cudnn_desc *d, int name, int want) {
  const struct attr *a = get(d, name);
  struct emu_cudnn_desc *x = a ? *(struct emu_cudnn_desc **)a->data : NULL;
  return x && x->finalized && (want < 0 || (int)x->type == want) ? x : NULL;
}

static int64_t int_attr(const struct emu_cudnn_desc *d, int name, int64_t fallback) {
  const struct attr *a = get(d, name);
  if (!a)
    return fallback;
  if (a->type == CUDNN_TYPE_INT64)
    return *(int64_t *)a->data;
  if (a->type == CUDNN_TYPE_BOOLEAN)
    return *(bool *)a->data;
  return *(int32_t *)a->data;
}

#define T CUDNN_BACKEND_TENSOR_DESCRIPTOR
static cudnnStatus_t finalize_tensor(struct emu_cudnn_desc *d) {
  const struct attr *dim = get(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
  const struct attr *str = get(d, CUDNN_ATTR_TENSOR_STRIDES);
  if (!get(d, CUDNN_ATTR_TENSOR_UNIQUE_ID) || !get(d, CUDNN_ATTR_TENSOR_DATA_TYPE) ||
      !get(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT) || !dim || !str || dim->count != 4 ||
      str->count != 4)
    return CUDNN_STATUS_BAD_PARAM;
  d->uid = int_attr(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
  d->dtype = (int)int_attr(d, CUDNN_ATTR_TENSOR_DATA_TYPE, 0);
  memcpy(d->dim, dim->data, sizeof d->dim);
  memcpy(d->stride, str->data, sizeof d->stride);
  d->is_virtual = int_attr(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, 0);
  d->by_value = int_attr(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, 0);
  for (int i = 0; i < 4; i++)
    if (d->dim[i] < 1 || d->stride[i] < 0)
      return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

static int64_t numel(const struct emu_cudnn_desc *t) {
  return t->dim[0] * t->dim[1] * t->dim[2] * t->dim[3];
}

static bool binary(int mode) {
  return mode == CUDNN_POINTWISE_ADD || mode == CUDNN_POINTWISE_MUL ||
         mode == CUDNN_POINTWISE_DIV || mode == CUDNN_POINTWISE_SUB ||
         mode == CUDNN_POINTWISE_CMP_GE || mode == CUDNN_POINTWISE_BINARY_SELECT;
}

static cudnnStatus_t finalize_matmul(struct emu_cudnn_desc *d) {
  struct emu_cudnn_desc *a = desc_attr(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, T);
  struct emu_cudnn_desc *b = desc_attr(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, T);
  struct emu_cudnn_desc *c = desc_attr(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, T);
  if (!a || !b || !c || !desc_attr(d, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_BACKEND_MATMUL_DESCRIPTOR))
    return CUDNN_STATUS_BAD_PARAM;
  bool agree = a->dim[2] == c->dim[2] && a->dim[3] == b->dim[2] && b->dim[3] == c->dim[3] &&
               a->dim[0] == c->dim[0] && b->dim[0] == c->dim[0] && a->dim[1] == c->dim[1] &&
               c->dim[1] % b->dim[1] == 0;
  return agree ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

static cudnnStatus_t finalize_op(struct emu_cudnn_desc *d) {
  switch (d->type) {
  case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
    struct emu_cudnn_desc *pw = desc_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                          CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    if (!pw || !desc_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, T) ||
        !desc_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, T))
      return CUDNN_STATUS_BAD_PARAM;
    int mode = (int)int_attr(pw, CUDNN_ATTR_POINTWISE_MODE, -1);
    if (binary(mode) && !desc_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, T))
      return CUDNN_STATUS_BAD_PARAM;
    if (mode == CUDNN_POINTWISE_BINARY_SELECT && !desc_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, T))
      return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
  }
  case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    return desc_attr(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_BACKEND_REDUCTION_DESCRIPTOR) &&
                   desc_attr(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, T) &&
                   desc_attr(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, T)
               ? CUDNN_STATUS_SUCCESS
               : CUDNN_STATUS_BAD_PARAM;
  case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
    struct emu_cudnn_desc *x = desc_attr(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, T);
    struct emu_cudnn_desc *y = desc_attr(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, T);
    return x && y && numel(x) == numel(y) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
  }
  default:
    return finalize_matmul(d);
  }
}

/* ---- the graph's pattern ---------------------------------------------------------------- */

/* an operation's one-word name: MM, RS, the reduction (MAX, SUM) or the pointwise mode */
static const char *op_word(const struct emu_cudnn_desc *op) {
  if (op->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)
    return "MM";
  if (op->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)
    return "RS";
  if (op->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) {
    struct emu_cudnn_desc *r = desc_attr(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, -1);
    return int_attr(r, CUDNN_ATTR_REDUCTION_OPERATOR, -1) == CUDNN_REDUCE_TENSOR_MAX ? "MAX" : "SUM";
  }
  struct emu_cudnn_desc *pw = desc_attr(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, -1);
  switch (int_attr(pw, CUDNN_ATTR_POINTWISE_MODE, -1)) {
  case CUDNN_POINTWISE_ADD: return "ADD";
  case CUDNN_POINTWISE_MUL: return "MUL";
  case CUDNN_POINTWISE_DIV: return "DIV";
  case CUDNN_POINTWISE_SUB: return "SUB";
  case CUDNN_POINTWISE_EXP: return "EXP";
  case CUDNN_POINTWISE_LOG: return "LOG";
  case CUDNN_POINTWISE_IDENTITY: return "ID";
  case CUDNN_POINTWISE_CMP_GE: return "GE";
  case CUDNN_POINTWISE_GEN_INDEX: return "GEN";
  case CUDNN_POINTWISE_BINARY_SELECT: return "SEL";
  default: return "?";
  }
}

/* The graphs cuDNN's frontend builds for SDPA with a causal mask (its diagonal band; ADD when
 * the diagonal is shifted), forward and backward ((SUM) where query heads share a kv head). */
static const char *const FORWARD = "MM MUL GEN GEN ADD? GE SEL MAX SUB EXP SUM LOG ADD DIV MM";
static const char *const BACKWARD = "MUL SUM MUL MM MUL SUB GEN GEN ADD? GE SEL EXP RS MM SUM? "
                                    "MM SUB MUL MUL RS MM SUM? RS MM ID";

/* whether the ops' words match pattern (a word ending in ? may be absent) */
static bool matches(struct emu_cudnn_desc **ops, int n, const char *pattern) {
  gchar **want = g_strsplit(pattern, " ", -1);
  int i = 0;
  bool ok = true;
  for (gchar **w = want; *w && ok; w++) {
    size_t len = strlen(*w);
    bool optional = (*w)[len - 1] == '?';
    if (optional)
      (*w)[len - 1] = 0;
    if (i < n && strcmp(op_word(ops[i]), *w) == 0)
      i++;
    else if (!optional)
      ok = false;
  }
  g_strfreev(want);
  return ok && i == n;
}

/* an op's tensors: its inputs (in, up to 3) and its output */
static int op_tensors(const struct emu_cudnn_desc *op, struct emu_cudnn_desc **in,
                      struct emu_cudnn_desc **out) {
  static const int names[][4] = {
      {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC, 0,
       CUDNN_ATTR_OPERATION_MATMUL_CDESC},
      {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, 0, 0, CUDNN_ATTR_OPERATION_RESHAPE_YDESC},
      {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, 0, 0, CUDNN_ATTR_OPERATION_REDUCTION_YDESC},
      {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
       CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC},
  };
  int k = op->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR    ? 0
          : op->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR ? 1
          : op->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ? 2
                                                                     : 3;
  int n = 0;
  for (int i = 0; i < 3; i++)
    if (names[k][i] && desc_attr(op, names[k][i], T))
      in[n++] = desc_attr(op, names[k][i], T);
  *out = desc_attr(op, names[k][3], T);
  return n;
}

/* every virtual input was written by an earlier op */
static bool connected(struct emu_cudnn_desc **ops, int n) {
  GHashTable *made = g_hash_table_new(NULL, NULL);
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    struct emu_cudnn_desc *in[3], *out;
    int k = op_tensors(ops[i], in, &out);
    for (int j = 0; j < k; j++)
      ok = ok && (!in[j]->is_virtual || g_hash_table_contains(made, in[j]));
    g_hash_table_add(made, out);
  }
  g_hash_table_destroy(made);
  return ok;
}

static struct emu_cudnn_desc **graph_ops(const struct emu_cudnn_desc *g, int *n) {
  const struct attr *a = get(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
  *n = a ? (int)a->count : 0;
  return a ? (struct emu_cudnn_desc **)a->data : NULL;
}

/* the roles of a recognised graph's tensors */
struct roles {
  struct emu_cudnn_desc *q, *kt, *v, *o, *stats, *scale, *shift, *neg_inf;
  struct emu_cudnn_desc *dO, *dq, *dk, *dv, *ssum, *dqa, *one;
};

static struct emu_cudnn_desc *in_of(struct emu_cudnn_desc *op, int i) {
  struct emu_cudnn_desc *in[3] = {0}, *out;
  op_tensors(op, in, &out);
  return in[i];
}

static struct emu_cudnn_desc *out_of(struct emu_cudnn_desc *op) {
  struct emu_cudnn_desc *in[3], *out;
  op_tensors(op, in, &out);
  return out;
}

/* ops from the mask on: [ADD] GE SEL; sets shift and neg_inf, returns the index after SEL */
static int mask_roles(struct emu_cudnn_desc **ops, int i, struct roles *r) {
  i += 2; /* GEN GEN */
  if (strcmp(op_word(ops[i]), "ADD") == 0)
    r->shift = in_of(ops[i++], 1);
  r->neg_inf = in_of(ops[i + 1], 1);
  return i + 2;
}

static void forward_roles(struct emu_cudnn_desc **ops, int n, struct roles *r) {
  r->q = in_of(ops[0], 0), r->kt = in_of(ops[0], 1), r->scale = in_of(ops[1], 1);
  int i = mask_roles(ops, 2, r);
  r->stats = out_of(ops[i + 5]); /* MAX SUB EXP SUM LOG ADD */
  r->v = in_of(ops[n - 1], 1), r->o = out_of(ops[n - 1]);
}

static void backward_roles(struct emu_cudnn_desc **ops, int n, struct roles *r) {
  r->dO = in_of(ops[0], 0), r->o = in_of(ops[0], 1);
  r->ssum = out_of(ops[2]), r->one = in_of(ops[2], 1);
  r->q = in_of(ops[3], 0), r->kt = in_of(ops[3], 1), r->scale = in_of(ops[4], 1);
  r->stats = in_of(ops[5], 1);
  int i = mask_roles(ops, 6, r) + 2; /* EXP RS */
  i++;                               /* MM Pᵀ dO */
  if (strcmp(op_word(ops[i]), "SUM") == 0)
    i++;
  r->dv = out_of(ops[i - 1]);
  r->v = in_of(ops[i], 1); /* MM dO Vᵀ */
  i += 5;                  /* MM SUB MUL MUL RS */
  i++;                     /* MM dSᵀ Q */
  if (i < n && strcmp(op_word(ops[i]), "SUM") == 0)
    i++;
  r->dk = out_of(ops[i - 1]);
  r->dqa = out_of(ops[n - 2]), r->dq = out_of(ops[n - 1]);
}

static bool typed(const struct emu_cudnn_desc *t, int dtype) {
  return t && t->dtype == dtype && !t->is_virtual;
}

static cudnnStatus_t finalize_plan(struct emu_cudnn_desc *d) {
  struct emu_cudnn_desc *cfg =
      desc_attr(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (!cfg || !get(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE))
    return CUDNN_STATUS_BAD_PARAM;
  int n;
  struct emu_cudnn_desc **ops = graph_ops(cfg->graph, &n);
  struct roles r = {0};
  if (matches(ops, n, FORWARD)) {
    forward_roles(ops, n, &r);
    d->kind = 1;
  } else if (matches(ops, n, BACKWARD)) {
    backward_roles(ops, n, &r);
    d->kind = 2;
  } else {
    return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
  }
  int bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  /* the forward's P @ V takes P in the operands' type, as cuDNN's fused engines require */
  if (d->kind == 1 && in_of(ops[n - 1], 0)->dtype != bf)
    return CUDNN_STATUS_NOT_SUPPORTED;
  bool ok = connected(ops, n) && typed(r.q, bf) && typed(r.kt, bf) && typed(r.v, bf) &&
            typed(r.o, bf) && typed(r.stats, f32) && r.scale->by_value && r.neg_inf->by_value &&
            (!r.shift || (r.shift->by_value && r.shift->dtype == CUDNN_DATA_INT32));
  if (d->kind == 2)
    ok = ok && typed(r.dO, bf) && typed(r.dq, bf) && typed(r.dk, bf) && typed(r.dv, bf) &&
         typed(r.ssum, f32) && typed(r.dqa, f32) && r.one->by_value;
  if (!ok)
    return CUDNN_STATUS_NOT_SUPPORTED;
  d->graph = cfg->graph;
  /* the rows' max and sum, fp32: what a fused kernel keeps per row */
  d->workspace = 2 * r.q->dim[0] * r.q->dim[1] * r.q->dim[2] * (int64_t)sizeof(float);
  g_mutex_lock(&count_lock);
  n_plans++;
  g_mutex_unlock(&count_lock);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  if (!d)
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (d->finalized)
    return CUDNN_STATUS_BAD_PARAM;
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  switch (d->type) {
  case T: s = finalize_tensor(d); break;
  case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
    int mode = (int)int_attr(d, CUDNN_ATTR_POINTWISE_MODE, -1);
    if (mode < 0 || !get(d, CUDNN_ATTR_POINTWISE_MATH_PREC) ||
        (mode == CUDNN_POINTWISE_GEN_INDEX && !get(d, CUDNN_ATTR_POINTWISE_AXIS)))
      s = CUDNN_STATUS_BAD_PARAM;
    break;
  }
  case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    s = get(d, CUDNN_ATTR_MATMUL_COMP_TYPE) ? s : CUDNN_STATUS_BAD_PARAM;
    break;
  case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    s = get(d, CUDNN_ATTR_REDUCTION_OPERATOR) && get(d, CUDNN_ATTR_REDUCTION_COMP_TYPE)
            ? s
            : CUDNN_STATUS_BAD_PARAM;
    break;
  case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
  case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
  case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
  case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: s = finalize_op(d); break;
  case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
    int n;
    struct emu_cudnn_desc **ops = graph_ops(d, &n);
    for (int i = 0; i < n; i++)
      if (!ops[i]->finalized)
        s = CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
    if (!n || !get(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE))
      s = CUDNN_STATUS_BAD_PARAM;
    break;
  }
  case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    s = desc_attr(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR) &&
                get(d, CUDNN_ATTR_ENGINEHEUR_MODE)
            ? s
            : CUDNN_STATUS_BAD_PARAM;
    break;
  case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: s = finalize_plan(d); break;
  case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
    const struct attr *u = get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    const struct attr *p = get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    if (!u || !p || u->count != p->count || !get(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE))
      s = CUDNN_STATUS_BAD_PARAM;
    break;
  }
  default: s = CUDNN_STATUS_BAD_PARAM; /* engine configs come from the heuristics */
  }
  d->finalized = s == CUDNN_STATUS_SUCCESS;
  return s;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested,
                                       int64_t *count, void *v) {
  if (!d || !v)
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (!d->finalized)
    return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
  if (name == CUDNN_ATTR_ENGINEHEUR_RESULTS && type == CUDNN_TYPE_BACKEND_DESCRIPTOR &&
      d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && requested >= 1) {
    struct emu_cudnn_desc *cfg = *(struct emu_cudnn_desc **)v;
    if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
      return CUDNN_STATUS_BAD_PARAM;
    cfg->graph = desc_attr(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, -1);
    cfg->finalized = true;
    *count = 1; /* one engine: the host's attention */
    return CUDNN_STATUS_SUCCESS;
  }
  if (name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE && type == CUDNN_TYPE_INT64 &&
      d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && requested >= 1) {
    *(int64_t *)v = d->workspace;
    *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  return CUDNN_STATUS_NOT_SUPPORTED;
}

/* ---- execution ------------------------------------------------------------------------------ */

/* a tensor as its dims and strides place it, bf16 or fp32 */
struct view {
  void *p;
  int dtype;
  int64_t dim[4], stride[4];
};

static size_t at(const struct view *v, int64_t a, int64_t b, int64_t c, int64_t d) {
  return (size_t)(a * v->stride[0] + b * v->stride[1] + c * v->stride[2] + d * v->stride[3]);
}

static double rd(const struct view *v, int64_t a, int64_t b, int64_t c, int64_t d) {
  size_t i = at(v, a, b, c, d);
  if (v->dtype == CUDNN_DATA_FLOAT)
    return ((float *)v->p)[i];
  uint32_t u = (uint32_t)((uint16_t *)v->p)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void wr(const struct view *v, int64_t a, int64_t b, int64_t c, int64_t d, double x) {
  size_t i = at(v, a, b, c, d);
  float f = (float)x;
  if (v->dtype == CUDNN_DATA_FLOAT) {
    ((float *)v->p)[i] = f;
    return;
  }
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1); /* round to nearest even (no NaN reaches here unrounded) */
  ((uint16_t *)v->p)[i] = (uint16_t)(u >> 16);
}

/* one execution: the views of its tensors and its scalars, read when it was enqueued */
struct run {
  int kind;
  struct view q, kt, v, o, stats, dO, dq, dk, dv, ssum, dqa;
  double scale, one;
  int64_t shift;
  float *workspace;
};

/* row (b, h, i)'s scores against every key, masked to -inf past the diagonal */
static void row_scores(const struct run *r, int64_t b, int64_t h, int64_t i, double *s) {
  int64_t D = r->q.dim[3], Sk = r->kt.dim[3], kh = h / (r->q.dim[1] / r->kt.dim[1]);
  for (int64_t j = 0; j < Sk; j++) {
    double acc = 0;
    for (int64_t d = 0; d < D; d++)
      acc += rd(&r->q, b, h, i, d) * rd(&r->kt, b, kh, d, j);
    s[j] = i + r->shift >= j ? acc * r->scale : -INFINITY;
  }
}

static void run_forward(const struct run *r, double *s) {
  int64_t B = r->q.dim[0], H = r->q.dim[1], Sq = r->q.dim[2], D = r->q.dim[3];
  int64_t Sk = r->kt.dim[3];
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < Sq; i++) {
        int64_t kh = h / (H / r->kt.dim[1]);
        row_scores(r, b, h, i, s);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < Sk; j++)
          mx = fmax(mx, s[j]);
        for (int64_t j = 0; j < Sk; j++)
          sum += s[j] = exp(s[j] - mx);
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int64_t j = 0; j < Sk; j++)
            acc += s[j] / sum * rd(&r->v, b, kh, j, d);
          wr(&r->o, b, h, i, d, acc);
        }
        wr(&r->stats, b, h, i, 0, mx + log(sum));
        size_t row = (size_t)((b * H + h) * Sq + i);
        r->workspace[2 * row] = (float)mx, r->workspace[2 * row + 1] = (float)sum;
      }
}

/* dK, dV summed in double over a kv head's query heads, then written once */
static void run_backward(const struct run *r, double *s) {
  int64_t B = r->q.dim[0], H = r->q.dim[1], Sq = r->q.dim[2], D = r->q.dim[3];
  int64_t KV = r->kt.dim[1], Sk = r->kt.dim[3];
  double *dk = g_new0(double, (size_t)(B * KV * Sk * D)), *dv = g_new0(double, (size_t)(B * KV * Sk * D));
  double *dp = g_new(double, (size_t)Sk);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < Sq; i++) {
        int64_t kh = h / (H / KV);
        double sum = 0;
        for (int64_t d = 0; d < D; d++)
          sum += rd(&r->dO, b, h, i, d) * rd(&r->o, b, h, i, d);
        sum *= r->one;
        wr(&r->ssum, b, h, i, 0, sum);
        row_scores(r, b, h, i, s);
        double st = rd(&r->stats, b, h, i, 0);
        for (int64_t j = 0; j < Sk; j++) {
          double p = exp(s[j] - st), acc = 0; /* exp(-inf) = 0 past the diagonal */
          for (int64_t d = 0; d < D; d++)
            acc += rd(&r->dO, b, h, i, d) * rd(&r->v, b, kh, d, j);
          dp[j] = p * (acc - sum) * r->scale;
          double *dvr = dv + ((b * KV + kh) * Sk + j) * D, *dkr = dk + ((b * KV + kh) * Sk + j) * D;
          for (int64_t d = 0; d < D; d++) {
            dvr[d] += p * rd(&r->dO, b, h, i, d);
            dkr[d] += dp[j] * rd(&r->q, b, h, i, d);
          }
        }
        for (int64_t d = 0; d < D; d++) {
          double acc = rd(&r->dqa, b, h, i, d);
          for (int64_t j = 0; j < Sk; j++)
            acc += dp[j] * rd(&r->kt, b, kh, d, j);
          wr(&r->dqa, b, h, i, d, acc);
          wr(&r->dq, b, h, i, d, (float)acc);
        }
      }
  for (int64_t b = 0; b < B; b++)
    for (int64_t kh = 0; kh < KV; kh++)
      for (int64_t j = 0; j < Sk; j++)
        for (int64_t d = 0; d < D; d++) {
          size_t x = (size_t)(((b * KV + kh) * Sk + j) * D + d);
          wr(&r->dk, b, kh, j, d, dk[x]);
          wr(&r->dv, b, kh, j, d, dv[x]);
        }
  g_free(dk), g_free(dv), g_free(dp);
}

static void run_now(void *arg) {
  struct run *r = arg;
  double *s = g_new(double, (size_t)r->kt.dim[3]);
  if (r->kind == 1)
    run_forward(r, s);
  else
    run_backward(r, s);
  g_free(s);
  g_free(r);
}

/* the view of tensor t from the pack (uids, ptrs; n), checked to lie in device memory; by-value
 * tensors' host values are read into *value */
static struct view view_of(const struct emu_cudnn_desc *t, const int64_t *uids, void **ptrs,
                           int64_t n, double *value) {
  struct view v = {0};
  if (!t)
    return v;
  for (int64_t i = 0; i < n; i++)
    if (uids[i] == t->uid)
      v.p = ptrs[i];
  if (!v.p) {
    fprintf(stderr, "emu: cudnnBackendExecute: tensor %ld of the graph is not in the variant pack\n",
            (long)t->uid);
    abort();
  }
  v.dtype = t->dtype;
  memcpy(v.dim, t->dim, sizeof v.dim);
  memcpy(v.stride, t->stride, sizeof v.stride);
  if (t->by_value) {
    if (value)
      *value = t->dtype == CUDNN_DATA_INT32 ? *(int32_t *)v.p : *(float *)v.p;
    return v;
  }
  size_t last = at(&v, v.dim[0] - 1, v.dim[1] - 1, v.dim[2] - 1, v.dim[3] - 1) + 1;
  char what[64];
  g_snprintf(what, sizeof what, "cudnnBackendExecute tensor %ld", (long)t->uid);
  emu_check_device(v.p, last * (t->dtype == CUDNN_DATA_FLOAT ? 4 : 2), what);
  return v;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t pack) {
  if (!h || !plan || !pack)
    return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (!plan->finalized || !pack->finalized || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
  const struct attr *u = get(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  const struct attr *p = get(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  const int64_t *uids = u->data;
  void **ptrs = p->data, *ws = *(void **)get(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE)->data;
  emu_check_device(ws, (size_t)plan->workspace, "cudnnBackendExecute workspace");
  int n;
  struct emu_cudnn_desc **ops = graph_ops(plan->graph, &n);
  struct roles r = {0};
  if (plan->kind == 1)
    forward_roles(ops, n, &r);
  else
    backward_roles(ops, n, &r);
  struct run *x = g_new0(struct run, 1);
  double shift = 0, scratch;
  x->kind = plan->kind;
  x->q = view_of(r.q, uids, ptrs, u->count, NULL), x->kt = view_of(r.kt, uids, ptrs, u->count, NULL);
  x->v = view_of(r.v, uids, ptrs, u->count, NULL), x->o = view_of(r.o, uids, ptrs, u->count, NULL);
  x->stats = view_of(r.stats, uids, ptrs, u->count, NULL);
  view_of(r.scale, uids, ptrs, u->count, &x->scale);
  view_of(r.neg_inf, uids, ptrs, u->count, &scratch);
  view_of(r.shift, uids, ptrs, u->count, &shift);
  x->shift = (int64_t)shift;
  x->one = 1;
  if (plan->kind == 2) {
    x->dO = view_of(r.dO, uids, ptrs, u->count, NULL), x->dq = view_of(r.dq, uids, ptrs, u->count, NULL);
    x->dk = view_of(r.dk, uids, ptrs, u->count, NULL), x->dv = view_of(r.dv, uids, ptrs, u->count, NULL);
    x->ssum = view_of(r.ssum, uids, ptrs, u->count, NULL);
    x->dqa = view_of(r.dqa, uids, ptrs, u->count, NULL);
    view_of(r.one, uids, ptrs, u->count, &x->one);
  }
  x->workspace = ws;
  g_mutex_lock(&count_lock);
  if (plan->kind == 1)
    n_forward++;
  else
    n_backward++;
  g_mutex_unlock(&count_lock);
  emu_enqueue(h->stream, run_now, x);
  return CUDNN_STATUS_SUCCESS;
}
