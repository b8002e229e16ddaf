/* prof host kernels: one op's buffers on the host and its passes through the host kernels, as
 * exec/segment_*.c call them (the executor-order chains of chain.c run the same calls), and the
 * ops of a model too big to chain, each (kind, shape) timed alone. */
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "../kernels/kernels.h"
#include "../models/model.h"
#include "prof-impl.h"

/* ---- one op's kernels, as the segment forward and backward (exec/segment_*.c) call them ----------------------------------------- */

static void run_embedding(struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    kernels_embedding_forward(b->out, b->tokens, b->params, b->T, b->V, b->C);
  else if (b->pass == IR_PASS_BW)
    kernels_embedding_backward_weight(b->dparams, b->dout, b->tokens, b->T, b->V, b->C);
  else if (b->pass == IR_PASS_B)
    kernels_embedding_backward(b->dparams, b->dout, b->tokens, b->T, b->V, b->C);
}

static void run_rmsnorm(struct op_bench *b) {
  float eps = (float)b->m->rms_norm_eps;
  if (b->pass == IR_PASS_F)
    kernels_rmsnorm_forward(b->out, b->saved, b->in0, b->params, b->T, b->C, eps);
  else if (b->pass == IR_PASS_BI)
    kernels_rmsnorm_backward_input(b->din, b->dout, b->in0, b->saved, b->params, b->T, b->C, false);
  else if (b->pass == IR_PASS_BW)
    kernels_rmsnorm_backward_weight(b->dparams, b->dout, b->in0, b->saved, b->T, b->C);
  else
    kernels_rmsnorm_backward(b->din, b->dparams, b->dout, b->in0, b->saved, b->params, b->T, b->C,
                             false);
}

static void run_attention(struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    kernels_attention_forward(b->out, b->saved, b->in0, b->params, &b->dd);
  else if (b->pass == IR_PASS_BI)
    kernels_attention_backward_input(b->din, b->bwork, b->dout, b->saved, b->params, &b->dd, false);
  else if (b->pass == IR_PASS_BW)
    kernels_attention_backward_weight(b->dparams, b->bwork, b->dout, b->in0, b->saved, &b->dd);
  else
    kernels_attention_backward(b->din, b->dparams, b->bwork, b->dout, b->in0, b->saved, b->params,
                               &b->dd, false);
}

/* The executor copies x, then adds the block's output; backward hands dx to both inputs. */
static void run_residual_add(struct op_bench *b) {
  size_t n = (size_t)b->T * b->C;
  if (b->pass == IR_PASS_F) {
    memcpy(b->out, b->in0, n * sizeof(float));
    kernels_residual_add_forward(b->out, b->dout, n);
  } else if (b->pass != IR_PASS_BW) {
    kernels_residual_add_backward(b->din, b->dout, n, false);
    kernels_residual_add_backward(b->out, b->dout, n, false);
  }
}

static void run_mlp(struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    kernels_mlp_forward(b->out, b->saved, b->in0, b->params, b->T, b->C, b->F);
  else if (b->pass == IR_PASS_BI)
    kernels_mlp_backward_input(b->din, b->bwork, b->dout, b->saved, b->params, b->T, b->C, b->F,
                               false);
  else if (b->pass == IR_PASS_BW)
    kernels_mlp_backward_weight(b->dparams, b->bwork, b->dout, b->in0, b->saved, b->T, b->C, b->F);
  else
    kernels_mlp_backward(b->din, b->dparams, b->bwork, b->dout, b->in0, b->saved, b->params, b->T,
                         b->C, b->F, false);
}

static void run_router(struct op_bench *b) {
  int T = b->T, C = b->C, E = b->E, K = b->K;
  if (b->pass == IR_PASS_F)
    kernels_router_forward(b->ids, b->weights, b->saved, b->in0, b->params, T, C, E, K);
  else if (b->pass == IR_PASS_BI)
    kernels_router_backward_input(b->din, b->bwork, b->dweights, b->ids, b->weights, b->saved,
                                  b->params, T, C, E, K, false);
  else if (b->pass == IR_PASS_BW)
    kernels_router_backward_weight(b->dparams, b->bwork, b->in0, T, C, E);
  else
    kernels_router_backward(b->din, b->dparams, b->bwork, b->dweights, b->ids, b->weights, b->saved,
                            b->in0, b->params, T, C, E, K, false);
}

/* The experts alone on one device of an ep-way group, as the executor's expert-parallel path
 * runs them between the all-to-alls: E / ep local experts over the T x k rows it receives. */
static void run_ep_experts(struct op_bench *b) {
  int C = b->C, El = b->E / b->ep, F = b->F, TK = b->T * b->K;
  if (b->pass == IR_PASS_F)
    kernels_expert_ffn_forward(b->y, b->saved, NULL, NULL, b->scratch, b->rows, b->row_expert,
                               b->dweights, TK, b->params, 0, El, C, F);
  else if (b->pass == IR_PASS_BW)
    kernels_expert_ffn_backward_weight(b->dparams, b->bwork, b->row_expert, TK, b->saved, NULL,
                                       NULL, 0, El, C, F);
  else if (b->pass == IR_PASS_B)
    kernels_expert_ffn_backward(b->drows, b->weights, b->dparams, b->bwork, b->scratch, b->dy,
                                b->row_expert, TK, b->saved, NULL, NULL, b->params, 0, El, C, F,
                                false);
  else
    kernels_expert_ffn_backward_input(b->drows, b->weights, b->bwork, b->scratch, b->dy,
                                      b->row_expert, TK, b->saved, NULL, b->params, 0, El, C, F,
                                      false);
}

/* Experts on one device: plan, dispatch, the experts, combine (and their backward), as the
 * executor's one-device path runs them. */
static void run_expert_ffn(struct op_bench *b) {
  int T = b->T, C = b->C, E = b->E, K = b->K, F = b->F, TK = T * K;
  if (b->ep > 1) {
    run_ep_experts(b);
    return;
  }
  if (b->pass == IR_PASS_F) {
    kernels_moe_dispatch_plan(b->counts, b->route_row, b->ids, T, K, E, 1);
    kernels_moe_dispatch_forward(b->rows, b->row_expert, b->dweights, b->in0, b->ids, b->weights,
                                 b->route_row, T, K, C);
    kernels_expert_ffn_forward(b->y, b->saved, NULL, NULL, b->scratch, b->rows, b->row_expert,
                               b->dweights, TK, b->params, 0, E, C, F);
    kernels_moe_combine_forward(b->out, b->y, b->route_row, T, K, C);
    return;
  }
  if (b->pass == IR_PASS_BW) {
    kernels_expert_ffn_backward_weight(b->dparams, b->bwork, b->row_expert, TK, b->saved, NULL,
                                       NULL, 0, E, C, F);
    return;
  }
  kernels_moe_combine_backward(b->dy, b->dout, b->route_row, T, K, C);
  if (b->pass == IR_PASS_B)
    kernels_expert_ffn_backward(b->drows, b->weights, b->dparams, b->bwork, b->scratch, b->dy,
                                b->row_expert, TK, b->saved, NULL, NULL, b->params, 0, E, C, F,
                                false);
  else
    kernels_expert_ffn_backward_input(b->drows, b->weights, b->bwork, b->scratch, b->dy,
                                      b->row_expert, TK, b->saved, NULL, b->params, 0, E, C, F,
                                      false);
  kernels_moe_dispatch_backward(b->din, b->dweights, b->drows, b->weights, b->route_row, T, K, C,
                                false);
}

/* BI recomputes the logits from in0 into bwork and reads saved's row statistics only, so
 * repeated calls see the same inputs each time. */
static void run_lm_head(struct op_bench *b) {
  enum kernels_lm_head_layout lay =
      b->m->tie_word_embeddings ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
  int T = b->T, C = b->C, V = b->V;
  float loss;
  if (b->pass == IR_PASS_F)
    kernels_lm_head_loss_forward(&loss, b->saved, b->in0, b->tokens, b->params, lay, T, C, V);
  else if (b->pass == IR_PASS_BI)
    kernels_lm_head_loss_backward_input(b->din, b->bwork, b->saved, b->in0, b->tokens, b->params,
                                        lay, 1.0f, T, C, V, false);
  else if (b->pass == IR_PASS_BW)
    kernels_lm_head_loss_backward_weight(b->dparams, b->bwork, b->saved, b->in0, b->tokens,
                                         b->params, lay, 1.0f, T, C, V);
  else
    kernels_lm_head_loss_backward(b->din, b->dparams, b->bwork, b->saved, b->in0, b->tokens,
                                  b->params, lay, 1.0f, T, C, V, false);
}

void prof_op_bench_run(void *ctx) {
  struct op_bench *b = ctx;
  switch (b->op->kind) {
  case MODEL_OP_EMBEDDING: run_embedding(b); break;
  case MODEL_OP_RMSNORM: run_rmsnorm(b); break;
  case MODEL_OP_ATTENTION: run_attention(b); break;
  case MODEL_OP_RESIDUAL_ADD: run_residual_add(b); break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: run_mlp(b); break;
  case MODEL_OP_ROUTER: run_router(b); break;
  case MODEL_OP_EXPERT_FFN: run_expert_ffn(b); break;
  case MODEL_OP_LM_HEAD_LOSS: run_lm_head(b); break;
  default: PIPER_UNREACHABLE();
  }
}

void prof_op_bench_init(struct op_bench *b, const struct model *m, const struct model_op *op) {
  *b = (struct op_bench){.m = m, .op = op};
  prof_op_bench_dims(b);
  struct op_sizes z = prof_op_sizes(b);
  size_t TK = (size_t)b->T * (b->K ? b->K : 1);
  b->params = prof_random_floats(z.params, 1, 0.1f);
  b->dparams = g_new0(float, z.params ? z.params : 1);
  b->in0 = prof_random_floats(z.in, 2, 1.0f);
  b->dout = prof_random_floats(z.out, 3, 1.0f);
  b->out = g_new0(float, z.out ? z.out : 1);
  b->din = g_new0(float, z.in ? z.in : 1);
  b->saved = g_new0(float, z.saved ? z.saved : 1);
  b->bwork = g_new0(float, z.bwork ? z.bwork : 1);
  b->tokens = prof_random_ids((size_t)b->T, b->V > 0 ? b->V : 1);
  b->ids = prof_random_ids(TK, b->E > 0 ? b->E : 1);
  b->route_row = g_new0(int32_t, TK);
  b->row_expert = g_new0(int32_t, TK);
  b->weights = prof_random_floats(TK, 4, 1.0f);
  b->dweights = prof_random_floats(TK, 5, 1.0f);
  b->rows = g_new0(float, z.rows ? z.rows : 1);
  b->y = g_new0(float, z.rows ? z.rows : 1);
  b->dy = g_new0(float, z.rows ? z.rows : 1);
  if (b->ep > 1) { /* what the dispatch would have brought: rows, their local experts */
    g_free(b->rows), g_free(b->dy);
    b->rows = prof_random_floats(z.rows, 6, 1.0f);
    b->dy = prof_random_floats(z.rows, 7, 1.0f);
    for (size_t r = 0; r < TK; r++)
      b->row_expert[r] = b->ids[r] % (b->E / b->ep);
  }
  b->drows = g_new0(float, z.rows ? z.rows : 1);
  b->scratch = g_new0(float, z.scratch ? z.scratch : 1);
}

void prof_op_bench_free(struct op_bench *b) {
  float *f[] = {b->params,  b->dparams,  b->in0,  b->out, b->dout, b->din,   b->saved,  b->bwork,
                b->weights, b->dweights, b->rows, b->y,   b->dy,   b->drows, b->scratch};
  for (size_t i = 0; i < G_N_ELEMENTS(f); i++)
    g_free(f[i]);
  g_free(b->tokens), g_free(b->ids), g_free(b->route_row), g_free(b->row_expert);
}

/* ---- each op alone (models too big to chain) ---------------------------------------------- */

/* One op at its shape: F first (it fills saved), BI (it fills bwork) before BW, then B. */
static void measure_op(struct prof_run *r, const struct model *m, const struct model_op *op) {
  static const enum ir_pass passes[] = {IR_PASS_F, IR_PASS_BI, IR_PASS_BW, IR_PASS_B};
  struct op_bench b;
  prof_op_bench_init(&b, m, op);
  double t[4];
  for (size_t p = 0; p < G_N_ELEMENTS(passes); p++) {
    b.pass = passes[p];
    t[p] = prof_pass_runs(op->kind, b.pass) ? prof_median_seconds(r->a, prof_op_bench_run, &b) : 0;
    prof_add_entry(r, op, b.pass, t[p]);
  }
  prof_op_bench_free(&b);
  prof_progress_op(r, op, t);
}

/* One op of a model too big to chain, timed alone unless its (kind, shape) was seen. */
static void measure_unchained(struct prof_run *r, const struct model *m,
                              const struct model_op *op) {
  char *key = prof_op_shape_key(op);
  if (g_hash_table_contains(r->seen, key)) {
    g_free(key);
    return;
  }
  g_hash_table_add(r->seen, key);
  if (!prof_op_has_kernel(op->kind)) {
    prof_progress(r, "  %-13s no host kernel: left to the roofline", model_op_kind_name(op->kind));
    r->n_skipped++;
    return;
  }
  /* a model too big for this machine: its ops fall back to the roofline, not to swap */
  double bytes = prof_op_bench_bytes(m, op), limit = 0.25 * prof_physical_memory_bytes();
  if (bytes > limit) {
    prof_progress(r,
                  "  %-13s needs %.1f GiB of buffers, over a quarter of this machine's memory: "
                  "left to the roofline",
                  model_op_kind_name(op->kind), bytes / 1073741824.0);
    r->n_skipped++;
    return;
  }
  measure_op(r, m, op);
}

void prof_host_measure_model(struct prof_run *r, const struct model *m) {
  prof_progress(r, "kernels of %s (%u ops)", m->name, m->n_ops);
  for (uint32_t i = 0; i < m->n_ops; i++)
    measure_unchained(r, m, &m->ops[i]);
  GArray *v = prof_ep_variants(m);
  for (guint i = 0; i < v->len; i++)
    measure_unchained(r, m, &g_array_index(v, struct model_op, i));
  g_array_free(v, TRUE);
}
