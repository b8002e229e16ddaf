/* Tests for exec/tp.c: the slices a TP rank holds, against matrices cut by hand from a known
 * full block (the one-device layout: element k holds k), experts' slices under EP x TP, the
 * vocabulary-parallel embedding's
 * two halves against the whole lookup, and what a device of a TP plan derives (its TP and
 * data-parallel ranks, the parameters it holds, the TP nodes' role). The runs that train with
 * TP are in tests/cli/test_exec.sh. */
#include "test-helpers.h"

#include <math.h>
#include <string.h>

#include "../../directives/compile.h"
#include "../../exec/exec-impl.h"

static struct model *dense;
static struct exec_model xm;

static int setup(void **state) {
  (void)state;
  dense = test_load_model("models/tiny-dense.json", 1);
  GError *err = NULL;
  if (!exec_model_init(&xm, dense, &err))
    fail_msg("%s", err->message);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  exec_model_clear(&xm);
  model_free(dense);
  return 0;
}

static const struct model_op *op_of(enum model_op_kind k) {
  for (uint32_t o = 0; o < dense->n_ops; o++)
    if (dense->ops[o].kind == k)
      return &dense->ops[o];
  fail_msg("no op of kind %d", (int)k);
  return NULL;
}

/* The full indices rank r of tp holds, in its local order. */
static uint64_t *slice(const struct model_op *op, uint32_t tp, uint32_t r, uint64_t *n) {
  *n = exec_tp_op_params(&xm, op, tp);
  uint64_t *idx = g_new(uint64_t, *n);
  for (uint64_t i = 0; i < *n; i++)
    idx[i] = exec_tp_full_index(&xm, op, tp, r, i);
  return idx;
}

/* Appends the column block [c0, c0 + w) of the [rows, cols] matrix at base, row by row. */
static void want_columns(GArray *want, uint64_t base, uint64_t rows, uint64_t cols, uint64_t c0,
                         uint64_t w) {
  for (uint64_t i = 0; i < rows; i++)
    for (uint64_t j = c0; j < c0 + w; j++) {
      uint64_t k = base + i * cols + j;
      g_array_append_val(want, k);
    }
}

/* Appends rows [r0, r0 + h) of the [rows, cols] matrix at base. */
static void want_rows(GArray *want, uint64_t base, uint64_t cols, uint64_t r0, uint64_t h) {
  for (uint64_t k = base + r0 * cols; k < base + (r0 + h) * cols; k++)
    g_array_append_val(want, k);
}

static void assert_slice(const struct model_op *op, uint32_t tp, uint32_t r, GArray *want) {
  uint64_t n;
  uint64_t *got = slice(op, tp, r, &n);
  assert_int_equal(n, want->len);
  for (uint64_t i = 0; i < n; i++)
    if (got[i] != g_array_index(want, uint64_t, i))
      fail_msg("op kind %d, rank %u of %u: local %llu is full %llu, want %llu", (int)op->kind, r,
               tp, (unsigned long long)i, (unsigned long long)got[i],
               (unsigned long long)g_array_index(want, uint64_t, i));
  g_free(got);
  g_array_set_size(want, 0);
}

/* MLP [wg C x F | wu C x F | wd F x C]: gate and up columns, down rows. */
static void test_mlp_slices(void **state) {
  (void)state;
  const struct model_op *op = op_of(MODEL_OP_MLP);
  uint64_t C = 64, F = 128;
  assert_int_equal(op->shape[2], F);
  GArray *want = g_array_new(FALSE, FALSE, sizeof(uint64_t));
  for (uint32_t tp = 2; tp <= 4; tp *= 2)
    for (uint32_t r = 0; r < tp; r++) {
      uint64_t w = F / tp;
      want_columns(want, 0, C, F, r * w, w);
      want_columns(want, C * F, C, F, r * w, w);
      want_rows(want, 2 * C * F, C, r * w, w);
      assert_slice(op, tp, r, want);
    }
  g_array_free(want, TRUE);
}

/* Attention [wq C x HD | wk C x KD | wv C x KD | wo HD x C]: 4 heads, 2 KV heads of 16. */
static void test_attention_slices(void **state) {
  (void)state;
  const struct model_op *op = op_of(MODEL_OP_ATTENTION);
  uint64_t C = 64, HD = 4 * 16, KD = 2 * 16;
  GArray *want = g_array_new(FALSE, FALSE, sizeof(uint64_t));
  for (uint32_t r = 0; r < 2; r++) {
    want_columns(want, 0, C, HD, r * HD / 2, HD / 2);
    want_columns(want, C * HD, C, KD, r * KD / 2, KD / 2);
    want_columns(want, C * HD + C * KD, C, KD, r * KD / 2, KD / 2);
    want_rows(want, C * HD + 2 * C * KD, C, r * HD / 2, HD / 2);
    assert_slice(op, 2, r, want);
  }
  g_array_free(want, TRUE);
}

/* Embedding [V, C]: vocabulary rows; untied head [C, V]: vocabulary columns; norms whole. */
static void test_vocab_and_replicated(void **state) {
  (void)state;
  uint64_t C = 64, V = 256;
  GArray *want = g_array_new(FALSE, FALSE, sizeof(uint64_t));
  for (uint32_t r = 0; r < 2; r++) {
    want_rows(want, 0, C, r * V / 2, V / 2);
    assert_slice(op_of(MODEL_OP_EMBEDDING), 2, r, want);
    want_columns(want, 0, C, V, r * V / 2, V / 2);
    assert_slice(op_of(MODEL_OP_LM_HEAD_LOSS), 2, r, want);
    want_rows(want, 0, C, 0, 1);
    assert_slice(op_of(MODEL_OP_RMSNORM), 2, r, want);
  }
  g_array_free(want, TRUE);
  /* every element of a divided op is held by exactly one rank */
  const struct model_op *op = op_of(MODEL_OP_ATTENTION);
  uint8_t *seen = g_new0(uint8_t, op->param_count);
  for (uint32_t r = 0; r < 4; r++) {
    uint64_t n;
    uint64_t *idx = slice(op, 4, r, &n);
    for (uint64_t i = 0; i < n; i++)
      seen[idx[i]]++;
    g_free(idx);
  }
  for (uint64_t k = 0; k < op->param_count; k++)
    assert_int_equal(seen[k], 1);
  g_free(seen);
}

/* The vocabulary-parallel embedding: the two ranks' lookups sum to the one-device lookup of
 * the whole table, and their weight gradients, placed where their slices sit, to its gradient
 * (tokens on both sides of the split, repeated ones included). */
static void test_vocab_parallel_embedding(void **state) {
  (void)state;
  enum { T = 6, C = 3, V = 8 };
  const int32_t tokens[T] = {0, 3, 4, 7, 3, 5};
  float table[V * C], dx[T * C], want_x[T * C] = {0}, want_dt[V * C] = {0};
  for (int k = 0; k < V * C; k++)
    table[k] = (float)(k + 1);
  for (int k = 0; k < T * C; k++)
    dx[k] = 0.5f * (float)k;
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++) {
      want_x[t * C + c] = table[tokens[t] * C + c];
      want_dt[tokens[t] * C + c] += dx[t * C + c];
    }
  float x[T * C] = {0}, dt[V * C] = {0};
  for (int r = 0; r < 2; r++) {
    float part[T * C];
    kernels_tp_embedding_forward(part, tokens, table + r * (V / 2) * C, T, C, r * V / 2, V / 2);
    for (int k = 0; k < T * C; k++)
      x[k] += part[k];
    kernels_tp_embedding_backward(dt + r * (V / 2) * C, dx, tokens, T, C, r * V / 2, V / 2);
  }
  for (int k = 0; k < T * C; k++)
    assert_float_equal(x[k], want_x[k], 0.0f);
  for (int k = 0; k < V * C; k++)
    assert_float_equal(dt[k], want_dt[k], 0.0f);
}

/* The vocabulary-parallel LM head: three slices' row statistics, merged, give the one-device
 * loss and saved statistics; their dh partials sum to its dh, and each slice's dw is its
 * columns (untied) or rows (tied) of the one-device dw. The slices are uneven (V 11 = 4 + 4 +
 * 3 is not what TP cuts, but the merge must not care) and targets fall in each. */
static void test_vocab_parallel_head(void **state) {
  (void)state;
  enum { T = 5, C = 4, V = 11, TP = 3 };
  const int32_t tg[T] = {0, 10, 4, 7, 3};
  const int lo[TP] = {0, 4, 8}, n[TP] = {4, 4, 3};
  for (int tied = 0; tied < 2; tied++) {
    enum kernels_lm_head_layout L = tied ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
    float h[T * C], w[C * V], saved[2 * T], dh[T * C], dw[C * V] = {0};
    for (int k = 0; k < T * C; k++)
      h[k] = sinf(0.7f * (float)k);
    for (int k = 0; k < C * V; k++)
      w[k] = 0.3f * cosf(1.3f * (float)k);
    float loss;
  kernels_lm_head_loss_forward(&loss, saved, h, tg, w, L, T, C, V);
    kernels_lm_head_loss_backward(dh, dw, NULL, saved, h, tg, w, L, 0.5f, T, C, V, false);
    float gathered[TP * 3 * T], saved2[2 * T], dh2[T * C] = {0};
    float ws[TP][C * 4], dws[TP][C * 4];
    for (int r = 0; r < TP; r++) {
      /* the slice's weights as a TP rank holds them: [C, n] columns, or [n, C] rows */
      for (int i = 0; i < C * n[r]; i++) {
        int row = i / n[r], col = i % n[r];
        ws[r][i] = tied ? w[lo[r] * C + i] : w[row * V + lo[r] + col];
        dws[r][i] = 0;
      }
      kernels_tp_head_stats(gathered + r * 3 * T, h, tg, ws[r], L, T, C, lo[r], n[r]);
    }
    float loss2;
  kernels_tp_head_combine(&loss2, saved2, gathered, TP, T);
    assert_float_equal(loss2, loss, 1e-5f);
    for (int k = 0; k < 2 * T; k++)
      assert_float_equal(saved2[k], saved[k], 1e-5f * fabsf(saved[k]));
    for (int r = 0; r < TP; r++) {
      float part[T * C];
      kernels_tp_head_backward(part, dws[r], saved2, h, tg, ws[r], L, 0.5f, T, C, lo[r], n[r]);
      for (int k = 0; k < T * C; k++)
        dh2[k] += part[k];
      for (int i = 0; i < C * n[r]; i++) {
        int row = i / n[r], col = i % n[r];
        float want = tied ? dw[lo[r] * C + i] : dw[row * V + lo[r] + col];
        assert_float_equal(dws[r][i], want, 1e-5f);
      }
    }
    for (int k = 0; k < T * C; k++)
      assert_float_equal(dh2[k], dh[k], 1e-5f);
  }
}

/* PP 2 x DP 2 x TP 2: TP innermost in each stage's group of 4; each device holds its slices,
 * what the compiler's memory formula says; the TP nodes run inside the compute. */
static void test_device_pp2_dp2_tp2(void **state) {
  (void)state;
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.layout = "pp=2,dp=2,tp=2";
  o.schedule.mbs = 4;
  o.have_schedule = true;
  assert_true(sched_family_parse("1f1b", &o.schedule.family));
  struct compile_result r = test_compile(&o);
  struct exec_model pxm;
  GError *err = NULL;
  assert_true(exec_model_init(&pxm, r.plan->model, &err));
  for (uint32_t d = 0; d < 8; d++) {
    struct exec_device dev;
    if (!exec_device_init(&dev, r.plan, &pxm, d, &err))
      fail_msg("%s", err->message);
    assert_int_equal(dev.tp_degree, 2);
    assert_int_equal(dev.tp_rank, d % 2);
    assert_int_equal(dev.dp_degree, 2);
    assert_int_equal(dev.dp_rank, d % 4 / 2);
    assert_true(dev.tp_comm != IR_NONE);
    uint32_t tp_nodes = 0;
    for (uint32_t i = 0; i < dev.n_instrs; i++)
      tp_nodes += dev.instrs[i].role == EXEC_ROLE_TP;
    assert_true(tp_nodes > 0);
    for (uint32_t s = 0; s < r.plan->model->n_segments; s++)
      if (dev.holds[s])
        assert_int_equal(dev.param_local[s] * 4, ir_tp_segment_param_bytes(r.plan->model, s, 2));
    /* the gradient bucket's group is the two devices with this TP rank */
    for (uint32_t b = 0; b < dev.n_buckets; b++) {
      assert_int_equal(dev.buckets[b].group_size, 2);
      assert_int_equal(dev.buckets[b].rank, dev.dp_rank);
    }
    exec_device_clear(&dev);
  }
  exec_model_clear(&pxm);
  compile_result_free(&r);
}

/* Experts [E x (wg C x F | wu C x F | wd F x C)] (kernels/moe.c): each expert divided like the
 * MLP, experts in order; under EP a device's local experts are a run of the TP rank's slices
 * (exec/params.c, for_each_param: local index ep_rank x n + i), so EP 2 x TP 2 gives each of the four
 * devices the gate/up columns and down rows of its TP rank in its half of the experts; the
 * four hold every element once. */
static void test_expert_slices(void **state) {
  (void)state;
  struct model *moe = test_load_model("models/tiny-moe.json", 1);
  struct exec_model mxm;
  GError *err = NULL;
  if (!exec_model_init(&mxm, moe, &err))
    fail_msg("%s", err->message);
  const struct model_op *op = NULL;
  for (uint32_t o = 0; o < moe->n_ops && !op; o++)
    if (moe->ops[o].kind == MODEL_OP_EXPERT_FFN)
      op = &moe->ops[o];
  assert_non_null(op);
  uint64_t C = 64, F = 32, E = 8, per = 3 * C * F;
  assert_int_equal(op->shape[2], F);
  assert_int_equal(exec_tp_op_params(&mxm, op, 2), E * per / 2);
  GArray *want = g_array_new(FALSE, FALSE, sizeof(uint64_t));
  uint8_t *seen = g_new0(uint8_t, op->param_count);
  for (uint32_t ep = 0; ep < 2; ep++)
    for (uint32_t r = 0; r < 2; r++) {
      uint64_t w = F / 2, n = E * per / 2 / 2, first = ep * n;
      for (uint64_t e = ep * E / 2; e < (ep + 1) * E / 2; e++) {
        want_columns(want, e * per, C, F, r * w, w);
        want_columns(want, e * per + C * F, C, F, r * w, w);
        want_rows(want, e * per + 2 * C * F, C, r * w, w);
      }
      assert_int_equal(want->len, n);
      for (uint64_t i = 0; i < n; i++) {
        uint64_t got = exec_tp_full_index(&mxm, op, 2, r, first + i);
        if (got != g_array_index(want, uint64_t, i))
          fail_msg("EP rank %u, TP rank %u: local %llu is full %llu, want %llu", ep, r,
                   (unsigned long long)i, (unsigned long long)got,
                   (unsigned long long)g_array_index(want, uint64_t, i));
        seen[got]++;
      }
      g_array_set_size(want, 0);
    }
  for (uint64_t k = 0; k < op->param_count; k++)
    assert_int_equal(seen[k], 1);
  g_free(seen);
  g_array_free(want, TRUE);
  exec_model_clear(&mxm);
  model_free(moe);
}

/* A device of EP 2 x TP 2 (one stage, 4 devices, TP innermost): its TP rank, its EP rank (the
 * position's data-parallel rank), its share of an expert segment (a quarter: half the experts,
 * half of each), the router whole. */
static void test_device_ep2_tp2(void **state) {
  (void)state;
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-moe.json";
  o.layout = "pp=1,dp=2,ep=2,tp=2";
  o.schedule.mbs = 4;
  struct compile_result r = test_compile(&o);
  struct exec_model pxm;
  GError *err = NULL;
  assert_true(exec_model_init(&pxm, r.plan->model, &err));
  const struct model *m = r.plan->model;
  for (uint32_t d = 0; d < 4; d++) {
    struct exec_device dev;
    if (!exec_device_init(&dev, r.plan, &pxm, d, &err))
      fail_msg("%s", err->message);
    assert_int_equal(dev.tp_degree, 2);
    assert_int_equal(dev.tp_rank, d % 2);
    uint32_t experts = 0;
    for (uint32_t s = 0; s < m->n_segments; s++) {
      if (!m->segments[s].expert)
        continue;
      experts++;
      assert_int_equal(dev.ep_size[s], 2);
      assert_int_equal(dev.ep_rank[s], d / 2);
      assert_int_equal(dev.param_local[s] * 4, m->segments[s].param_count);
    }
    assert_true(experts > 0);
    exec_device_clear(&dev);
  }
  exec_model_clear(&pxm);
  compile_result_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_slices),           cmocka_unit_test(test_attention_slices),
      cmocka_unit_test(test_vocab_and_replicated), cmocka_unit_test(test_vocab_parallel_embedding),
      cmocka_unit_test(test_vocab_parallel_head),
      cmocka_unit_test(test_device_pp2_dp2_tp2),   cmocka_unit_test(test_expert_slices),
      cmocka_unit_test(test_device_ep2_tp2),
  };
  return cmocka_run_group_tests_name("exec_tp", tests, setup, teardown);
}
