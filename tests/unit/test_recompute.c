/* Activation recomputation's memory, by hand: what one layer keeps with and without it, in
 * the plan's tensors (the memory rule, ir/plan.h) and in the simulator's peak.
 *
 * tiny-dense (fp32, micro-batch 2 x 32 = T 64 tokens, hidden 64, 4 heads and 2 KV heads of 16,
 * ffn 128, 8 layers) in 8 PP regions: regions 1 to 6 are one layer each. What a layer's
 * backward reads (the host kernels' saved buffers, models/build.c):
 *   rmsnorm, twice: its input x [T, 64] 16,384 B + rstd [T] 256 B            =  16,640 each
 *   attention: its input h 16,384 + q [T, 64] 16,384 + k, v [T, 32] 2 x 8,192
 *     + the core's output y [T, 64] 16,384 + log-sum-exp [T, 4 heads] 1,024    =  66,560
 *   MLP: its input h 16,384 + gate, up [T, 256] 65,536 + silu(gate) up [T, 128] 32,768
 *                                                                              = 114,688
 *   one layer                                                                  = 214,528
 * Without recomputation F keeps all 214,528 B until B. Under full recomputation F keeps the
 * layer's input x alone (16,384 B) and R rebuilds the 214,528 B right before B; under
 * selective recomputation F keeps all but the attention core (214,528 - 17,408 = 197,120 B)
 * and R rebuilds the core's 16,384 + 1,024 = 17,408 B.
 * What F and R hold only while they run (their workspace): a plain F's W; F under full, W +
 * 214,528 (what it no longer keeps); R under full, W; F under selective, W + 17,408; R under
 * selective, nothing.
 * Under tensor parallelism over 2 devices (Megatron's layout, no sequence parallelism) each
 * device keeps its heads' and its FFN columns' half, the replicated inputs and norms whole:
 *   rmsnorm, twice                                                             =  16,640 each
 *   attention: h 16,384 + q 8,192 + k, v 2 x 4,096 + y 8,192 + lse 512          =  41,472
 *   MLP: h 16,384 + gate, up 32,768 + silu(gate) up 16,384                      =  65,536
 *   one layer                                                                  = 140,288
 * and its attention core is 8,192 + 512 = 8,704 B: selective F keeps 131,584, R rebuilds
 * 8,704; full F keeps the input x (16,384, whole) and R rebuilds 140,288.
 * In the simulator, one device running every forward before every backward holds each
 * micro-batch's kept bytes from its F to its backward: two more micro-batches add twice the
 * model's kept bytes per micro-batch to the peak of saved activations. */
#include "test-helpers.h"

#include "../../ir/plan.h"
#include "../../kernels/kernels.h"
#include "../../sim/sim.h"

#define LAYER_SAVED 214528u
#define LAYER_INPUT 16384u
#define CORE 17408u
#define LAYERS 8u
#define TP2_LAYER_SAVED 140288u
#define TP2_CORE 8704u

enum granularity { NONE, FULL, SELECTIVE };
static const char *const names[] = {"none", "full", "selective"};

/* One device, M micro-batches, every forward before every backward (a split alone: the
 * default order issues each ready forward first). */
static struct plan *compile_tp(enum granularity g, uint32_t M, uint32_t tp) {
  char *dir = test_tmp_dir("test_recompute-XXXXXX");
  char *path = g_build_filename(dir, "program.json", NULL);
  char text[512];
  char tp_text[160] = "";
  if (tp > 1)
    g_snprintf(tp_text, sizeof tp_text,
               "{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
               "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":%u},",
               tp);
  g_snprintf(text, sizeof text,
             "[%s%s%s%s{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":%u}]",
             tp_text, g == NONE ? "" : "{\"op\":\"recompute\",\"filter\":{},\"granularity\":\"",
             g == NONE ? "" : names[g], g == NONE ? "" : "\"},", M);
  test_write_file(path, text);
  GError *err = NULL;
  struct plan *p = compile_plan("models/tiny-dense.json", path, NULL, (int)LAYERS, &err);
  if (!p)
    fail_msg("%s: %s", names[g], err->message);
  test_remove_tree(dir);
  g_free(path);
  g_free(dir);
  return p;
}

static struct plan *compile(enum granularity g, uint32_t M) { return compile_tp(g, M, 1); }

/* The micro-batch tag's index (the split dimension "MB"). */
static uint32_t mb_tag(const struct plan *p) {
  for (uint32_t t = 0; t < p->n_tags; t++)
    if (strcmp(p->tag_names[t], "MB") == 0)
      return t;
  fail_msg("no MB tag");
  return 0;
}

/* The bytes of the tensor of kind k that instruction i writes (0 if none). */
static uint64_t written(const struct plan_class *c, uint32_t i, enum plan_tensor_kind k) {
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++)
    if (c->tensors[c->writes[in->write_first + w]].kind == k)
      return c->tensors[c->writes[in->write_first + w]].bytes;
  return 0;
}

/* Saved and work bytes of the F and R of segment seg, micro-batch 0. */
struct layer_figures {
  uint64_t f_saved, f_work, r_saved, r_work;
};

static struct layer_figures layer_figures(const struct plan *p, uint32_t seg) {
  struct layer_figures lf = {0};
  const struct plan_class *c = plan_device_class(p, 0);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_COMPUTE || n->segment != seg || n->tags[mb_tag(p)] != 0)
      continue;
    if (n->pass == IR_PASS_F) {
      lf.f_saved = written(c, i, PLAN_TENSOR_SAVED);
      lf.f_work = written(c, i, PLAN_TENSOR_WORK);
    } else if (n->pass == IR_PASS_R) {
      lf.r_saved = written(c, i, PLAN_TENSOR_SAVED);
      lf.r_work = written(c, i, PLAN_TENSOR_WORK);
    }
  }
  return lf;
}

static void test_layer_tensors(void **state) {
  (void)state;
  struct plan *plain = compile(NONE, 2);
  for (uint32_t seg = 1; seg + 1 < LAYERS; seg++) {
    struct layer_figures none = layer_figures(plain, seg);
    assert_int_equal(none.f_saved, LAYER_SAVED);
    assert_int_equal(none.r_saved, 0);
    uint64_t w = none.f_work;
    assert_true(w > 0);
    struct plan *p = compile(FULL, 2);
    struct layer_figures full = layer_figures(p, seg);
    assert_int_equal(full.f_saved, LAYER_INPUT);
    assert_int_equal(full.r_saved, LAYER_SAVED);
    assert_int_equal(full.f_work, w + LAYER_SAVED);
    assert_int_equal(full.r_work, w);
    plan_free(p);
    p = compile(SELECTIVE, 2);
    struct layer_figures sel = layer_figures(p, seg);
    assert_int_equal(sel.f_saved, LAYER_SAVED - CORE);
    assert_int_equal(sel.r_saved, CORE);
    assert_int_equal(sel.f_work, w + CORE);
    assert_int_equal(sel.r_work, 0);
    plan_free(p);
  }
  plan_free(plain);
}

/* Under TP 2 the attention core a selective F drops is its heads' half (the rewrite that
 * splits F's saved tensor runs after tensor parallelism divided it). */
static void test_layer_tensors_tp2(void **state) {
  (void)state;
  struct plan *plain = compile_tp(NONE, 2, 2), *full = compile_tp(FULL, 2, 2);
  struct plan *sel = compile_tp(SELECTIVE, 2, 2);
  for (uint32_t seg = 1; seg + 1 < LAYERS; seg++) {
    assert_int_equal(layer_figures(plain, seg).f_saved, TP2_LAYER_SAVED);
    struct layer_figures f = layer_figures(full, seg), s = layer_figures(sel, seg);
    assert_int_equal(f.f_saved, LAYER_INPUT);
    assert_int_equal(f.r_saved, TP2_LAYER_SAVED);
    assert_int_equal(s.f_saved, TP2_LAYER_SAVED - TP2_CORE);
    assert_int_equal(s.r_saved, TP2_CORE);
  }
  plan_free(plain);
  plan_free(full);
  plan_free(sel);
}

/* The simulator's peak of saved activations, device 0. */
static uint64_t peak_saved(enum granularity g, uint32_t M, uint64_t *per_mb) {
  struct plan *p = compile(g, M);
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/unit.json", &err);
  if (!prof)
    fail_msg("profile: %s", err->message);
  struct sim_options o = {.collapse = true};
  struct sim_result *r = sim_run(p, prof, &o, &err);
  if (!r)
    fail_msg("sim_run: %s", err->message);
  uint64_t peak = r->units[r->device_unit[0]].peak_saved_activation_bytes;
  /* what each micro-batch keeps from F to its backward (or its rerun) on the device */
  const struct plan_class *c = plan_device_class(p, 0);
  *per_mb = 0;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind == IR_NODE_COMPUTE && n->pass == IR_PASS_F && n->tags[mb_tag(p)] == 0)
      *per_mb += written(c, i, PLAN_TENSOR_SAVED);
  }
  sim_result_free(r);
  profile_free(prof);
  plan_free(p);
  return peak;
}

static void test_simulated_growth(void **state) {
  (void)state;
  uint64_t grow[3], kept[3];
  for (int g = NONE; g <= SELECTIVE; g++) {
    uint64_t k2, k4;
    uint64_t p2 = peak_saved((enum granularity)g, 2, &k2),
             p4 = peak_saved((enum granularity)g, 4, &k4);
    assert_int_equal(k2, k4);
    kept[g] = k2;
    grow[g] = p4 - p2;
    if (grow[g] != 2 * kept[g])
      fail_msg("%s: two micro-batches more add %llu B to the peak, want 2 x %llu", names[g],
               (unsigned long long)grow[g], (unsigned long long)kept[g]);
  }
  /* full: the inputs of regions 1 to 7 (region 0 starts from token ids, kept by the host) */
  assert_int_equal(kept[FULL], (LAYERS - 1) * LAYER_INPUT);
  /* selective: every layer's attention core less than storing */
  assert_int_equal(kept[NONE] - kept[SELECTIVE], LAYERS * CORE);
  /* and storing keeps at least the eight layers */
  assert_true(kept[NONE] >= LAYERS * LAYER_SAVED);
}

/* Selective recomputation's kernels: the core rerun alone from the saved q, k and v writes the
 * forward's lse and y bit for bit, into a buffer of its own, and the backward that reads them
 * there gives the same gradients, bit for bit, as with them inside saved. Its size is the
 * layer's 17,408 B above. */
static void test_attention_core_rerun(void **state) {
  (void)state;
  struct kernels_attention_dims d = {2, 32, 4, 2, 16, 64, KERNELS_ROPE_THETA, NULL, NULL};
  size_t P = kernels_attention_param_count(&d), SV = kernels_attention_saved_floats(&d);
  size_t CO = kernels_attention_core_floats(&d), BW = kernels_attention_bwork_floats(&d);
  size_t T = 64, C = 64;
  assert_int_equal(CO * 4, CORE);
  float *prm = g_new(float, P), *h = g_new(float, T *C), *a = g_new(float, T *C);
  float *saved = g_new0(float, SV), *split = g_new0(float, SV - CO), *core = g_new0(float, CO);
  float *da = g_new(float, T *C), *dh[2], *dp[2], *bw[2];
  for (size_t i = 0; i < P; i++)
    prm[i] = 0.02f * (float)((i * 2654435761u) % 1000) / 1000.0f - 0.01f;
  for (size_t i = 0; i < T * C; i++) {
    h[i] = (float)((i * 40503u) % 997) / 997.0f - 0.5f;
    da[i] = (float)((i * 9973u) % 991) / 991.0f - 0.5f;
  }
  kernels_attention_forward(a, saved, h, prm, &d);
  struct kernels_attention_dims ds = d;
  ds.core = core;
  kernels_attention_forward(a, split, h, prm, &ds); /* F: q, k, v in split; lse, y in core */
  assert_memory_equal(split, saved, (SV - CO) * sizeof(float));
  memset(core, 0, CO * sizeof(float));
  kernels_attention_core_forward(split, &ds); /* R */
  assert_memory_equal(core, saved + (SV - CO), CO * sizeof(float));
  for (int k = 0; k < 2; k++) {
    dh[k] = g_new(float, T *C);
    dp[k] = g_new0(float, P);
    bw[k] = g_new(float, BW);
    kernels_attention_backward(dh[k], dp[k], bw[k], da, h, k ? split : saved, prm, k ? &ds : &d,
                               false);
  }
  assert_memory_equal(dh[0], dh[1], T * C * sizeof(float));
  assert_memory_equal(dp[0], dp[1], P * sizeof(float));
  for (int k = 0; k < 2; k++) {
    g_free(dh[k]);
    g_free(dp[k]);
    g_free(bw[k]);
  }
  g_free(prm);
  g_free(h);
  g_free(a);
  g_free(saved);
  g_free(split);
  g_free(core);
  g_free(da);
}

/* Compiles tiny-dense in 2 stages of 4 layers on one device, 2 micro-batches, under the given
 * recompute directive(s) (JSON objects, comma-separated); NULL and *err set on refusal. */
static struct plan *compile_layered(const char *recompute, GError **err) {
  char *dir = test_tmp_dir("test_recompute-XXXXXX");
  char *path = g_build_filename(dir, "program.json", NULL);
  char *text = g_strdup_printf(
      "[%s,{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}]", recompute);
  test_write_file(path, text);
  struct plan *p = compile_plan("models/tiny-dense.json", path, NULL, 2, err);
  test_remove_tree(dir);
  g_free(text);
  g_free(path);
  g_free(dir);
  return p;
}

/* Megatron's methods, per stage of 4 layers (docs/directives.md, "recompute"): uniform N
 * reruns chunks of N layers (the last one shorter), block N each of the first N layers (all of
 * them past 4). Each rerun chunk's F keeps its input x (16,384 B) and its R rebuilds its
 * layers' 214,528 B each; nothing else reruns (embedding, head, a block's stored rest). */
static void test_layered_chunks(void **state) {
  (void)state;
  static const struct {
    const char *method;
    uint32_t n;
    uint32_t chunk_layers[8]; /* per rerun chunk, in model order; 0 ends */
  } cases[] = {
      {"uniform", 1, {1, 1, 1, 1, 1, 1, 1, 1}},
      {"uniform", 2, {2, 2, 2, 2}},
      {"uniform", 3, {3, 1, 3, 1}},
      {"uniform", 4, {4, 4}},
      {"block", 1, {1, 1}},
      {"block", 3, {1, 1, 1, 1, 1, 1}},
      {"block", 9, {1, 1, 1, 1, 1, 1, 1, 1}},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    char *d = g_strdup_printf("{\"op\":\"recompute\",\"filter\":{},\"method\":\"%s\","
                              "\"num_layers\":%u}",
                              cases[k].method, cases[k].n);
    GError *err = NULL;
    struct plan *p = compile_layered(d, &err);
    if (!p)
      fail_msg("%s: %s", d, err->message);
    uint32_t r = 0;
    for (uint32_t seg = 0; seg < p->model->n_segments; seg++) {
      struct layer_figures lf = layer_figures(p, seg);
      if (lf.r_saved == 0)
        continue;
      uint32_t want = cases[k].chunk_layers[r++];
      if (want == 0 || lf.r_saved != want * LAYER_SAVED || lf.f_saved != LAYER_INPUT)
        fail_msg("%s: rerun %u keeps %llu B and rebuilds %llu B, want %u B and %u layers", d,
                 r - 1, (unsigned long long)lf.f_saved, (unsigned long long)lf.r_saved,
                 LAYER_INPUT, want);
    }
    if (r < G_N_ELEMENTS(cases[k].chunk_layers) && cases[k].chunk_layers[r] != 0)
      fail_msg("%s: %u reruns, want more", d, r);
    plan_free(p);
    g_free(d);
  }
}

/* Per stage: stage 0 uniform chunks of 2, stage 1 selective (attention cores). */
static void test_layered_per_stage(void **state) {
  (void)state;
  GError *err = NULL;
  struct plan *p = compile_layered(
      "{\"op\":\"recompute\",\"filter\":{\"PP\":0},\"method\":\"uniform\",\"num_layers\":2},"
      "{\"op\":\"recompute\",\"filter\":{\"PP\":1},\"granularity\":\"selective\"}",
      &err);
  if (!p)
    fail_msg("%s", err->message);
  uint32_t full = 0, sel = 0;
  for (uint32_t seg = 0; seg < p->model->n_segments; seg++) {
    struct layer_figures lf = layer_figures(p, seg);
    full += lf.r_saved == 2 * LAYER_SAVED && lf.f_saved == LAYER_INPUT;
    sel += lf.r_saved > 0 && lf.r_saved % CORE == 0 && lf.r_saved < LAYER_SAVED;
  }
  assert_int_equal(full, 2);
  assert_int_equal(sel, 1); /* stage 1 is one segment: its four cores rerun in one R */
  plan_free(p);
}

static void test_layered_refusals(void **state) {
  (void)state;
  static const struct {
    const char *d, *want;
  } cases[] = {
      {"{\"op\":\"recompute\",\"filter\":{},\"method\":\"uniform\"}",
       "\"method\" and \"num_layers\" go together"},
      {"{\"op\":\"recompute\",\"filter\":{},\"num_layers\":0,\"method\":\"block\"}", "num_layers"},
      {"{\"op\":\"recompute\",\"filter\":{},\"method\":\"stripes\",\"num_layers\":1}",
       "\"method\" = \"stripes\" must be \"uniform\" or \"block\""},
      {"{\"op\":\"recompute\",\"filter\":{},\"granularity\":\"selective\",\"method\":\"block\","
       "\"num_layers\":1}",
       "\"method\" applies to \"granularity\": \"full\" only"},
      {"{\"op\":\"recompute\",\"filter\":{\"EP\":\"*\"},\"method\":\"block\",\"num_layers\":1}",
       "the filter may name PP only"},
      {"{\"op\":\"recompute\",\"filter\":{},\"method\":\"block\",\"num_layers\":1},"
       "{\"op\":\"recompute\",\"filter\":{\"PP\":1},\"method\":\"uniform\",\"num_layers\":1}",
       "directives 0 and 1 (recompute) both cut stage 1's layers"},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    GError *err = NULL;
    struct plan *p = compile_layered(cases[k].d, &err);
    if (p || !err || err->code != PIPER_ERROR_INPUT || !strstr(err->message, cases[k].want))
      fail_msg("%s: got \"%s\", want \"%s\"", cases[k].d, err ? err->message : "a plan",
               cases[k].want);
    g_error_free(err);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_core_rerun),
      cmocka_unit_test(test_layered_chunks),
      cmocka_unit_test(test_layered_per_stage),
      cmocka_unit_test(test_layered_refusals),
      cmocka_unit_test(test_layer_tensors),
      cmocka_unit_test(test_layer_tensors_tp2),
      cmocka_unit_test(test_simulated_growth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
