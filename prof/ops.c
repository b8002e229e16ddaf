/* prof ops: the models' ops as the profiler measures them: each op's dimensions from its shape
 * and its buffers' sizes (the kernels' own counts, the same for the host and the GPU), the
 * expert-parallel variants of the expert ops, and the profile's "measured" entries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../models/model.h"
#include "../sim/profile.h"
#include "prof-impl.h"

struct op_sizes prof_op_sizes(struct op_bench *b) {
  struct op_sizes z = {.in = (size_t)b->T * b->C, .out = (size_t)b->T * b->C};
  size_t TK = (size_t)b->T * b->K;
  switch (b->op->kind) {
  case MODEL_OP_EMBEDDING: z.params = kernels_embedding_param_count(b->V, b->C); break;
  case MODEL_OP_RMSNORM:
    z.params = kernels_rmsnorm_param_count(b->C);
    z.saved = kernels_rmsnorm_saved_floats(b->T);
    break;
  case MODEL_OP_ATTENTION:
    z.params = kernels_attention_param_count(&b->dd);
    z.saved = kernels_attention_saved_floats(&b->dd);
    z.bwork = kernels_attention_bwork_floats(&b->dd);
    break;
  case MODEL_OP_RESIDUAL_ADD: break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT:
    z.params = kernels_mlp_param_count(b->C, b->F);
    z.saved = kernels_mlp_saved_floats(b->T, b->F);
    z.bwork = kernels_mlp_bwork_floats(b->T, b->F);
    break;
  case MODEL_OP_ROUTER:
    z.params = kernels_router_param_count(b->C, b->E);
    z.saved = kernels_router_saved_floats(b->T, b->E);
    z.bwork = kernels_router_bwork_floats(b->T, b->E);
    break;
  case MODEL_OP_EXPERT_FFN:
    z.params = kernels_expert_ffn_param_count(b->ep > 1 ? b->E / b->ep : b->E, b->C, b->F);
    z.saved = kernels_expert_ffn_saved_floats((int)TK, b->C, b->F);
    z.bwork = kernels_expert_ffn_bwork_floats((int)TK, b->C, b->F);
    z.scratch = kernels_expert_ffn_scratch_floats((int)TK, b->C);
    z.rows = TK * b->C;
    break;
  case MODEL_OP_LM_HEAD_LOSS:
    z.params = kernels_lm_head_loss_param_count(b->C, b->V);
    z.saved = kernels_lm_head_loss_saved_floats(b->T, b->V);
    z.bwork = kernels_lm_head_loss_bwork_floats(b->T, b->V);
    break;
  default: break;
  }
  return z;
}

/* The dimensions from the op's shape (models/model.h's table of shape fields). */
void prof_op_bench_dims(struct op_bench *b) {
  const int64_t *s = b->op->shape;
  switch (b->op->kind) {
  case MODEL_OP_ATTENTION:
    b->dd = (struct kernels_attention_dims){
        (int)s[0], (int)s[1], (int)s[2], (int)s[3], (int)s[4], (int)s[5], (float)b->m->rope_theta,
        NULL, NULL, 0, 0};
    b->T = (int)(s[0] * s[1]), b->C = (int)s[5];
    break;
  case MODEL_OP_EMBEDDING: b->T = (int)s[0], b->V = (int)s[1], b->C = (int)s[2]; break;
  case MODEL_OP_LM_HEAD_LOSS: b->T = (int)s[0], b->C = (int)s[1], b->V = (int)s[2]; break;
  case MODEL_OP_ROUTER:
    b->T = (int)s[0], b->C = (int)s[1], b->E = (int)s[2], b->K = (int)s[3];
    break;
  case MODEL_OP_EXPERT_FFN:
    b->T = (int)s[0], b->C = (int)s[1], b->F = (int)s[2], b->E = (int)s[3], b->K = (int)s[4];
    b->ep = (int)s[PROFILE_EP_DIM];
    break;
  default: b->T = (int)s[0], b->C = (int)s[1], b->F = (int)s[2]; break;
  }
  if (b->V == 0)
    b->V = (int)b->m->vocab_size;
}

/* ---- the kernel table --------------------------------------------------------------------- */

bool prof_op_has_kernel(enum model_op_kind k) {
  return k != MODEL_OP_MLA_ATTENTION && k < MODEL_OP_KIND_COUNT;
}

/* Whether the executor runs anything for (kind, pass): embeddings have no BI (tokens are not
 * differentiable), a residual add no BW (no parameters). */
bool prof_pass_runs(enum model_op_kind k, enum ir_pass pass) {
  return !(k == MODEL_OP_EMBEDDING && pass == IR_PASS_BI) &&
         !(k == MODEL_OP_RESIDUAL_ADD && pass == IR_PASS_BW);
}

static int shape_rank(const struct model_op *op) {
  int n = PROFILE_MAX_SHAPE;
  while (n > 1 && op->shape[n - 1] == 0)
    n--;
  return n;
}

/* milliseconds to 4 significant digits: microsecond resolution is below the clocks' noise */
static cJSON *ms4(double seconds) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.4g", seconds * 1e3);
  return cJSON_CreateNumber(strtod(buf, NULL));
}

void prof_entry_host_ms(cJSON *entry, double seconds) {
  cJSON_AddItemToObject(entry, "host_ms", ms4(seconds));
}

cJSON *prof_add_entry(struct prof_run *r, const struct model_op *op, enum ir_pass pass,
                      double seconds) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "op", model_op_kind_name(op->kind));
  cJSON_AddStringToObject(e, "pass", ir_pass_name(pass));
  cJSON *shape = cJSON_AddArrayToObject(e, "shape");
  for (int i = 0; i < shape_rank(op); i++)
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)op->shape[i]));
  cJSON_AddItemToObject(e, "ms", ms4(seconds));
  cJSON_AddItemToArray(r->measured, e);
  r->n_entries++;
  return e;
}

/* Bytes of every buffer prof_op_bench_init allocates for the op (an upper bound); the CUDA
 * profiler's buffers are the same. */
double prof_op_bench_bytes(const struct model *m, const struct model_op *op) {
  struct op_bench b = {.m = m, .op = op};
  prof_op_bench_dims(&b);
  struct op_sizes z = prof_op_sizes(&b);
  double TK = (double)b.T * (b.K ? b.K : 1);
  return 4.0 *
         (2.0 * (double)z.params + 2.0 * (double)z.in + 2.0 * (double)z.out + (double)z.saved +
          (double)z.bwork + 4.0 * (double)z.rows + (double)z.scratch + 6.0 * TK + (double)b.T);
}

void prof_progress_op(const struct prof_run *r, const struct model_op *op, const double *t) {
  GString *shape = g_string_new("");
  for (int i = 0; i < shape_rank(op); i++)
    g_string_append_printf(shape, "%s%lld", i ? "x" : "", (long long)op->shape[i]);
  prof_progress(r, "  %-13s %-18s F %8.1f us  BI %8.1f us  BW %8.1f us  B %8.1f us",
                model_op_kind_name(op->kind), shape->str, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6,
                t[3] * 1e6);
  g_string_free(shape, TRUE);
}

char *prof_op_shape_key(const struct model_op *op) {
  GString *key = g_string_new(model_op_kind_name(op->kind));
  for (int d = 0; d < PROFILE_MAX_SHAPE; d++)
    g_string_append_printf(key, " %lld", (long long)op->shape[d]);
  return g_string_free(key, FALSE);
}

GArray *prof_ep_variants(const struct model *m) {
  GArray *v = g_array_new(FALSE, FALSE, sizeof(struct model_op));
  for (uint32_t i = 0; i < m->n_ops; i++) {
    const struct model_op *op = &m->ops[i];
    if (op->kind != MODEL_OP_EXPERT_FFN)
      continue;
    for (int64_t d = 2, E = op->shape[3]; d <= E; d++) {
      struct model_op x = *op;
      x.shape[PROFILE_EP_DIM] = d;
      bool seen = E % d != 0;
      for (guint k = 0; k < v->len && !seen; k++)
        seen = !memcmp(g_array_index(v, struct model_op, k).shape, x.shape, sizeof x.shape);
      if (!seen)
        g_array_append_val(v, x);
    }
  }
  return v;
}
