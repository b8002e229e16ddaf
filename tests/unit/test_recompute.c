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

#include "../../base/json.h"
#include "../../directives/compile.h"
#include "../../directives/schedule.h"
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
  struct kernels_attention_dims d = {2, 32, 4, 2, 16, 64, KERNELS_ROPE_THETA, NULL, NULL, 0, 0};
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
      {"{\"op\":\"recompute\",\"filter\":{},\"granularity\":\"full\",\"modules\":[\"mlp\"]}",
       "\"modules\" applies to \"granularity\": \"selective\" only"},
      {"{\"op\":\"recompute\",\"filter\":{},\"granularity\":\"selective\",\"modules\":[\"mlp\","
       "\"mlp\"]}",
       "\"modules\" names \"mlp\" twice"},
      {"{\"op\":\"recompute\",\"filter\":{},\"granularity\":\"selective\",\"modules\":[\"attn\"]}",
       "\"modules\": \"attn\" is not one of core_attn"},
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

/* ---- Korthikanti et al. 2022, by hand, at real sizes --------------------------------------- */

/* What one decoder layer keeps per token for its backward, in bytes, derived from the model's
 * dimensions as Korthikanti et al. (2022, "Reducing Activation Recomputation in Large
 * Transformer Models", section 4) count it, with this project's kept tensors (docs/memory.md):
 * B = 2 (bf16), h hidden, H heads, KV key-value heads, D head dim, F the MLP's width.
 *
 * Llama-3 (GQA, SwiGLU), no tensor parallelism:
 *   norm 1: its input x 2h, its rstd 4 (fp32)                                    2h + 4
 *   attention: its input 2h, q 2HD, k and v 2 x 2 KV D, core output y 2HD,
 *              log-sum-exp 4H (fp32; flash attention keeps no score matrix)       2h + 4HD + 4 KV D + 4H
 *   norm 2                                                                        2h + 4
 *   MLP: its input 2h, gate and up 4F, silu(gate) up 2F                           2h + 6F
 *   S = 8h + 8 + 4HD + 4 KV D + 4H + 6F (Llama-3-8B: 139,400 B, 34.03 h: the paper's 34 sbh)
 * Recomputation (what F keeps, what R rebuilds):
 *   full: the layer's input x (2h, the paper's 2sbh per layer), R all of S;
 *   selective core_attn: drops y and lse, 2HD + 4H (the paper's 5as/h term is the score
 *     matrix, which a fused attention never keeps; what remains is its output);
 *   layernorm: drops the two norm outputs the attention and MLP keep, 4h;
 *   mlp: drops gate, up and silu(gate) up, 6F.
 * Tensor parallelism t (Megatron): q, k, v, y, lse, gate, up, act divided by t; the norms'
 * and the blocks' inputs replicated (8h + 8 whole); with sequence parallelism those too: S / t
 * (the paper's 34 sbh / t). Full keeps x whole without SP, x / t with it.
 *
 * DeepSeek-V3 MoE layer (MLA with q_lora_rank ql, kv_lora_rank kvl, rope and nope head dims,
 * v head dim Dv, qk = nope + rope; E routed experts, k per token, expert width Fe; shared
 * experts' width Fs = Fe x n_shared), local experts (one device):
 *   norm 1                                                                        2h + 4
 *   MLA: its input 2h, latents c_q, [c_kv, k_rope] 2(ql + kvl + rope), q and k 2 x 2H qk,
 *        v 2H Dv, core output 2H Dv, log-sum-exp 4H
 *   norm 2                                                                        2h + 4
 *   router: its input 2h, fp32 probabilities 4E, the routing (int32 id, fp32 weight) 8k
 *   shared experts: gate, up, silu(gate) up (their input is the router's)         6Fs
 *   routed experts: the routed rows 2kh, gate and up 4k Fe, the routing 8k, silu(gate) up
 *        times the routing weight 2k Fe and that weight (fp32) 4k per row, the permutation
 *        (int32 row and expert) 8k; not the expert outputs: the experts apply the routing
 *        weights (Megatron-Core's weighted SwiGLU), the combine only sums    2kh + 6k Fe + 20k
 * and: full keeps each segment's inputs (x; the experts' h and routing: 4h + 8k; the residual
 * add after the experts saves nothing and is not rerun); layernorm drops 4h; mla_up_proj q, k,
 * v, 2(2H qk + H Dv); moe_act 2k Fe; shared_experts 6Fs; moe reruns the experts' segment in
 * full (it keeps h and the routing, 2h + 8k, for 2kh + 6k Fe + 20k). */
struct hand {
  const char *name, *recompute; /* the directive's granularity and modules, "" for none */
  uint32_t tp;
  bool sp;
  double kept, rebuilt; /* per token per layer */
};

/* The model file with seq_len T, one micro-batch of one sequence, one layer per PP region. */
static char *small_model(const char *dir, const char *path, int64_t T) {
  GError *err = NULL;
  cJSON *root = json_parse_file_strict(path, &err);
  if (!root)
    fail_msg("%s", err->message);
  cJSON *piper = cJSON_GetObjectItemCaseSensitive(root, "piper");
  int layers = cJSON_GetObjectItemCaseSensitive(root, "num_hidden_layers")->valueint;
  cJSON_ReplaceItemInObjectCaseSensitive(piper, "seq_len", cJSON_CreateNumber((double)T));
  cJSON_ReplaceItemInObjectCaseSensitive(piper, "micro_batch_size", cJSON_CreateNumber(1));
  cJSON_ReplaceItemInObjectCaseSensitive(piper, "pp_regions", cJSON_CreateNumber(layers));
  char *out = g_build_filename(dir, "model.json", NULL);
  if (!json_write_file(out, root, &err))
    fail_msg("%s", err->message);
  cJSON_Delete(root);
  return out;
}

/* F's kept and R's rebuilt bytes of decoder layer L (summed over its segments), device 0. */
static void layer_plan(const char *model, const struct hand *c, int32_t L, uint64_t *kept,
                       uint64_t *rebuilt) {
  char *dir = test_tmp_dir("test_recompute-XXXXXX");
  char *path = g_build_filename(dir, "program.json", NULL);
  GString *t = g_string_new("[");
  if (c->tp > 1)
    g_string_append_printf(t, "{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
                              "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":%u%s},",
                           c->tp, c->sp ? ",\"sequence_parallel\":true" : "");
  if (c->recompute[0])
    g_string_append_printf(t, "{\"op\":\"recompute\",\"filter\":{},%s},", c->recompute);
  g_string_append(t, "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":1}]");
  test_write_file(path, t->str);
  GError *err = NULL;
  struct plan *p = compile_plan(model, path, NULL, 0, &err);
  if (!p)
    fail_msg("%s: %s", c->name, err->message);
  *kept = *rebuilt = 0;
  for (uint32_t seg = 0; seg < p->model->n_segments; seg++) {
    const struct model_segment *sg = &p->model->segments[seg];
    if (p->model->ops[sg->op_first].layer != L)
      continue;
    struct layer_figures lf = layer_figures(p, seg);
    *kept += lf.f_saved;
    *rebuilt += lf.r_saved;
  }
  plan_free(p);
  test_remove_tree(dir);
  g_string_free(t, TRUE);
  g_free(path);
  g_free(dir);
}

static void check_hand(const char *file, const struct hand *cases, size_t n, int32_t L, int64_t T) {
  char *dir = test_tmp_dir("test_recompute-XXXXXX");
  char *model = small_model(dir, file, T);
  for (size_t i = 0; i < n; i++) {
    uint64_t kept, rebuilt;
    layer_plan(model, &cases[i], L, &kept, &rebuilt);
    if ((double)kept != cases[i].kept * (double)T || (double)rebuilt != cases[i].rebuilt * (double)T)
      fail_msg("%s, %s: the plan keeps %.2f B and rebuilds %.2f B per token, by hand %.2f and %.2f",
               file, cases[i].name, (double)kept / (double)T, (double)rebuilt / (double)T,
               cases[i].kept, cases[i].rebuilt);
  }
  test_remove_tree(dir);
  g_free(model);
  g_free(dir);
}

static void test_llama3_layer_by_hand(void **state) {
  (void)state;
  /* Llama-3-8B (models/llama3-8b.json) */
  const double h = 4096, H = 32, KV = 8, D = 128, F = 14336;
  const double S = 8 * h + 8 + 4 * H * D + 4 * KV * D + 4 * H + 6 * F;
  const double core = 2 * H * D + 4 * H, ln = 4 * h, mlp = 6 * F;
  const double divided = 4 * H * D + 4 * KV * D + 4 * H + 6 * F, S2 = 8 * h + 8 + divided / 2;
  assert_true(S == 139400); /* 34.03 h bytes per token per layer */
  const struct hand cases[] = {
      {"none", "", 1, false, S, 0},
      {"full", "\"granularity\":\"full\"", 1, false, 2 * h, S},
      {"core_attn", "\"granularity\":\"selective\"", 1, false, S - core, core},
      {"layernorm", "\"granularity\":\"selective\",\"modules\":[\"layernorm\"]", 1, false, S - ln, ln},
      {"mlp", "\"granularity\":\"selective\",\"modules\":[\"mlp\"]", 1, false, S - mlp, mlp},
      {"core_attn+layernorm+mlp",
       "\"granularity\":\"selective\",\"modules\":[\"core_attn\",\"layernorm\",\"mlp\"]", 1, false,
       S - core - ln - mlp, core + ln + mlp},
      {"tp2", "", 2, false, S2, 0},
      {"tp2 full", "\"granularity\":\"full\"", 2, false, 2 * h, S2},
      {"tp2 core_attn", "\"granularity\":\"selective\"", 2, false, S2 - core / 2, core / 2},
      {"tp2 sp", "", 2, true, S / 2, 0},
      {"tp2 sp full", "\"granularity\":\"full\"", 2, true, h, S / 2},
      {"tp2 sp core_attn", "\"granularity\":\"selective\"", 2, true, (S - core) / 2, core / 2},
  };
  check_hand("models/llama3-8b.json", cases, G_N_ELEMENTS(cases), 5, 64);
}

static void test_deepseek_v3_layer_by_hand(void **state) {
  (void)state;
  /* DeepSeek-V3 (models/deepseek-v3.json), layer 10 (MoE; the first three are dense) */
  const double h = 7168, H = 128, ql = 1536, kvl = 512, rope = 64, qk = 128 + 64, Dv = 128;
  const double E = 256, k = 8, Fe = 2048, Fs = 2048;
  const double mla = 2 * h + 2 * (ql + kvl + rope) + 2 * (2 * H * qk + H * Dv) + 2 * H * Dv + 4 * H;
  const double experts = 2 * k * h + 6 * k * Fe + 20 * k;
  const double S = (2 * h + 4) + mla + (2 * h + 4) + (2 * h + 4 * E + 8 * k) + 6 * Fs + experts;
  const double core = 2 * H * Dv + 4 * H, ln = 4 * h, up = 2 * (2 * H * qk + H * Dv);
  const double act = 2 * k * Fe, shared = 6 * Fs;
  const struct hand cases[] = {
      {"none", "", 1, false, S, 0},
      {"full", "\"granularity\":\"full\"", 1, false, 4 * h + 8 * k, S},
      {"core_attn", "\"granularity\":\"selective\"", 1, false, S - core, core},
      {"layernorm", "\"granularity\":\"selective\",\"modules\":[\"layernorm\"]", 1, false, S - ln, ln},
      {"mla_up_proj", "\"granularity\":\"selective\",\"modules\":[\"mla_up_proj\"]", 1, false,
       S - up, up},
      {"layernorm+mla_up_proj",
       "\"granularity\":\"selective\",\"modules\":[\"layernorm\",\"mla_up_proj\"]", 1, false,
       S - ln - up, ln + up},
      {"moe_act", "\"granularity\":\"selective\",\"modules\":[\"moe_act\"]", 1, false, S - act, act},
      {"shared_experts", "\"granularity\":\"selective\",\"modules\":[\"shared_experts\"]", 1, false,
       S - shared, shared},
      {"moe", "\"granularity\":\"selective\",\"modules\":[\"moe\"]", 1, false,
       S - experts + 2 * h + 8 * k, experts},
  };
  check_hand("models/deepseek-v3.json", cases, G_N_ELEMENTS(cases), 10, 64);
}

/* Full recomputation of every layer keeps what Megatron's keeps (--recompute-granularity full
 * --recompute-method uniform --recompute-num-layers 1): each layer's input x (2h per token,
 * bf16) and, for a layer's backward, that one layer's activations, which its rerun restores.
 * Llama-3-8B, all 32 layers on one stage, T tokens. The peak of saved activations comes while
 * the last layer's rerun runs: the 32 inputs (the rerun reads its chunk's copy, released when
 * it ends; its backward then holds 31 and the copy inside S), one layer's S and the
 * embedding's token ids (int32). Storing holds 32 S, the ids, the final norm's (2h + 4: x and
 * its fp32 rstd) and the LM head's (its input 2h; row max and 1/sum, fp32; targets, int32:
 * 2h + 12). Their ratio, (32 x 2h + S) / (32 S) at this size, is under 10%: 9.0%
 * (docs/memory.md: the peak with one block's backward transients, which both hold, is
 * 10.9%). *activations: the peak of all activations (saved and transients), if not NULL. */
static uint64_t llama_peak_saved(const char *model, const char *layout, uint64_t *activations) {
  struct compile_options o = compile_options_default();
  o.model_path = model;
  o.layout = layout;
  o.pp_regions = 1; /* small_model puts a layer in each PP region; one stage holds them all */
  o.have_schedule = true;
  assert_true(sched_family_parse("gpipe", &o.schedule.family));
  o.schedule.mbs = 1;
  GError *err = NULL;
  struct plan *p = compile_take_plan(&o, &err);
  if (!p)
    fail_msg("compile %s: %s", layout, err->message);
  struct profile *prof = profile_load_file("profiles/unit.json", &err);
  if (!prof)
    fail_msg("profile: %s", err->message);
  struct sim_options so = {.collapse = true};
  struct sim_result *r = sim_run(p, prof, &so, &err);
  if (!r)
    fail_msg("sim_run: %s", err->message);
  uint64_t peak = r->units[r->device_unit[0]].peak_saved_activation_bytes;
  if (activations)
    *activations = r->units[r->device_unit[0]].peak_breakdown[REPORT_MEM_ACTIVATIONS];
  sim_result_free(r);
  profile_free(prof);
  plan_free(p);
  return peak;
}

static void test_full_every_layer_as_megatron(void **state) {
  (void)state;
  const int64_t T = 64;
  const double h = 4096, H = 32, KV = 8, D = 128, F = 14336, L = 32;
  const double S = 8 * h + 8 + 4 * H * D + 4 * KV * D + 4 * H + 6 * F;
  char *dir = test_tmp_dir("test_recompute-XXXXXX");
  char *model = small_model(dir, "models/llama3-8b.json", T);
  uint64_t full = llama_peak_saved(model, "pp=1,recompute=full:uniform:1", NULL);
  uint64_t none = llama_peak_saved(model, "pp=1", NULL);
  const double ids = 4, final_norm = 2 * h + 4, head = 2 * h + 12;
  if ((double)full != (L * 2 * h + S + ids) * (double)T ||
      (double)none != (L * S + ids + final_norm + head) * (double)T)
    fail_msg("saved at the peak per token: full %.1f B (by hand %.1f), none %.1f B (%.1f)",
             (double)full / (double)T, L * 2 * h + S + ids, (double)none / (double)T,
             L * S + ids + final_norm + head);
  assert_true((double)full < 0.1 * (double)none);
  test_remove_tree(dir);
  g_free(model);
  g_free(dir);
}

/* The same two plans' peak of all activations, saved and transient, by hand: it comes in the
 * last layer's backward, in its MLP block (a backward holds one block of a layer at a time,
 * model_bwd_group_end), whose transients are its three values' gradients (the norm's, the
 * MLP's, the residual add's), the residual stream's gradient it hands the attention block
 * (4 x 2h) and the SwiGLU's dgate and dup (2 x 2F). Full recomputation holds besides the 31
 * inputs below, the rerun layer's S (its own input in it), the ids, and the gradient arriving
 * from the head and the one it writes for the layer below (2 x 2h, the segment's edges); storing
 * (one segment: the head's gradient is the last residual add's, in the block) 32 S, the ids and
 * the final norm's and head's saved tensors. 10.9% of storing (11.6% with the whole layer's
 * backward transients at once, docs/memory.md). */
static void test_full_every_layer_blocks(void **state) {
  (void)state;
  const int64_t T = 64;
  const double h = 4096, H = 32, KV = 8, D = 128, F = 14336, L = 32;
  const double S = 8 * h + 8 + 4 * H * D + 4 * KV * D + 4 * H + 6 * F;
  const double ids = 4, final_norm = 2 * h + 4, head = 2 * h + 12, block = 4 * 2 * h + 2 * 2 * F;
  char *dir = test_tmp_dir("test_recompute-XXXXXX");
  char *model = small_model(dir, "models/llama3-8b.json", T);
  uint64_t full = 0, none = 0;
  llama_peak_saved(model, "pp=1,recompute=full:uniform:1", &full);
  llama_peak_saved(model, "pp=1", &none);
  double full_hand = (L - 1) * 2 * h + S + ids + 2 * 2 * h + block;
  double none_hand = L * S + ids + final_norm + head + block;
  if ((double)full != full_hand * (double)T || (double)none != none_hand * (double)T)
    fail_msg("activations at the peak per token: full %.1f B (by hand %.1f), none %.1f B (%.1f)",
             (double)full / (double)T, full_hand, (double)none / (double)T, none_hand);
  assert_true((double)full < 0.11 * (double)none);
  test_remove_tree(dir);
  g_free(model);
  g_free(dir);
}

/* DeepSeek-V3's FP8 caching of the experts' inputs (fp8-expert-inputs), by hand: under expert
 * parallelism an expert layer's forward saves, per row received at the capacity (ir/expert.c:
 * factor x T x top_k, at most EP x T x top_k), the row's input, gate, up and silu(gate) up; with
 * the option the input is h bytes and one fp32 scale per 128 elements instead of h x B. tiny-moe
 * (fp32, h 64: 68 bytes a row instead of 256) at EP 2, capacity 1.5. */
static uint64_t expert_saved(const char *layout, uint64_t *rows, uint64_t *h, uint64_t *f,
                             uint64_t *combine_saved, uint64_t *n_a2a) {
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-moe.json";
  o.layout = layout;
  o.have_schedule = true;
  assert_true(sched_family_parse("1f1b", &o.schedule.family));
  o.schedule.mbs = 2;
  GError *err = NULL;
  struct plan *p = compile_take_plan(&o, &err);
  if (!p)
    fail_msg("compile %s: %s", layout, err->message);
  const struct model *m = p->model;
  *rows = (uint64_t)ceil(1.5 * (double)(model_tokens_per_microbatch(m) * m->experts_per_tok));
  *h = (uint64_t)m->hidden_size;
  *f = (uint64_t)m->moe_intermediate_size;
  const struct plan_class *c = plan_device_class(p, 0);
  uint64_t saved = 0;
  *combine_saved = *n_a2a = 0;
  uint64_t tk = (uint64_t)model_tokens_per_microbatch(m) * (uint64_t)m->experts_per_tok;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind == IR_NODE_COMPUTE && n->pass == IR_PASS_F && n->shard_degree > 1 && !saved)
      saved = written(c, i, PLAN_TENSOR_SAVED);
    /* the forward all-to-alls' kept tensors: the dispatch's routing tables, nothing of the
     * combine's (the experts applied the routing weights) */
    if (n->kind == IR_NODE_ALL_TO_ALL && n->pass == IR_PASS_F) {
      *combine_saved += written(c, i, PLAN_TENSOR_SAVED);
      (*n_a2a)++;
    }
  }
  /* per dispatch (half the forward all-to-alls): a route row per (token, k) and an expert per
   * row received, int32, each table 16-byte aligned */
  uint64_t tables = ((tk * 4 + 15) & ~(uint64_t)15) + ((*rows * 4 + 15) & ~(uint64_t)15);
  *combine_saved -= *n_a2a / 2 * tables;
  plan_free(p);
  return saved;
}

/* Saved tensors released by reader (ir/lower.c, instr_split_saved): where the backward is split
 * into BI and BW (zero-bubble, DualPipeV), a forward's q, k, v (tiny-dense's layer: q [T, 64]
 * 16,384 B + k, v [T, 32] 2 x 8,192 = 32,768 B an attention) and a router's probabilities
 * (fp32 [T, E]) go into a saved tensor of their own, released when the input-gradient pass
 * ends; the rest (the inputs of the linear layers, y, lse, rstd) stays until BW. */
#define LAYER_QKV 32768u
static uint32_t split_forwards(const struct plan *p, bool dense) {
  uint32_t n_split = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    for (uint32_t i = 0; i < c->n_instrs; i++) {
      const struct ir_node *f = &p->nodes[c->instrs[i].node];
      if (f->kind != IR_NODE_COMPUTE || f->pass != IR_PASS_F)
        continue;
      uint32_t n_saved = 0, n_early = 0;
      for (uint32_t w = 0; w < c->instrs[i].write_count; w++) {
        const struct plan_tensor *pt = &c->tensors[c->writes[c->instrs[i].write_first + w]];
        if (pt->kind != PLAN_TENSOR_SAVED)
          continue;
        n_saved++;
        const struct ir_node *last = &p->nodes[c->instrs[pt->release].node];
        assert_int_equal(last->segment, f->segment);
        if (last->pass == IR_PASS_BI) {
          n_early++;
          assert_int_equal(pt->bytes, ir_bi_only_saved_bytes(p->model, f));
          const struct model_segment *sg = &p->model->segments[f->segment];
          uint32_t attn = 0;
          for (uint32_t o = sg->op_first; o < sg->op_first + sg->op_count; o++)
            attn += p->model->ops[o].kind == MODEL_OP_ATTENTION;
          if (dense)
            assert_int_equal(pt->bytes, (uint64_t)attn * LAYER_QKV);
        } else {
          assert_true(last->pass == IR_PASS_BW || last->pass == IR_PASS_B); /* B: fused */
        }
      }
      /* a forward with attention or a router splits its saved tensor in two */
      assert_true(n_saved <= 2 && n_early == (n_saved == 2 ? 1u : 0u));
      n_split += n_saved == 2;
    }
  }
  return n_split;
}

static void test_saved_released_by_reader(void **state) {
  (void)state;
  const struct {
    const char *model, *base, *schedule;
    int regions;
    bool dense;
  } cases[] = {
      {"models/tiny-dense.json", "directives/base-schedules/pp4.json", "zerobubble", 0, true},
      {"models/tiny-moe.json", "directives/base-schedules/pp4_dp2_ep2_v_placement.json",
       "dualpipev", 4, false},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    GError *err = NULL;
    struct sched_options so = {.mbs = 4};
    assert_true(sched_family_parse(cases[k].schedule, &so.family));
    struct plan *p = compile_plan(cases[k].model, cases[k].base, &so, cases[k].regions, &err);
    if (!p)
      fail_msg("%s: %s", cases[k].schedule, err->message);
    if (split_forwards(p, cases[k].dense) == 0)
      fail_msg("%s: no forward split its saved tensor by reader", cases[k].schedule);
    plan_free(p);
  }
}

static void test_fp8_expert_inputs(void **state) {
  (void)state;
  uint64_t rows, h, f, combine, combine8, n, n8;
  uint64_t bf = expert_saved("pp=2,dp=2,ep=2,capacity=1.5", &rows, &h, &f, &combine, &n);
  uint64_t f8 =
      expert_saved("pp=2,dp=2,ep=2,capacity=1.5,fp8-expert-inputs", &rows, &h, &f, &combine8, &n8);
  assert_true(rows > 0 && bf > 0);
  /* per row received (fp32): its input h, gate, up and silu(gate) up times its routing weight
   * 3f, and that weight; the routing tables are the dispatch's tensor. The dispatch saves the
   * routing tables only, the combine nothing (the experts applied the weights). */
  if (bf != rows * (4 * h + 12 * f + 4))
    fail_msg("the experts save %llu B, by hand %llu rows x (4h + 12f + 4) = %llu",
             (unsigned long long)bf, (unsigned long long)rows,
             (unsigned long long)(rows * (4 * h + 12 * f + 4)));
  assert_true(n > 0 && n8 == n);
  if (combine != 0 || combine8 != 0)
    fail_msg("the forward all-to-alls keep %llu B beyond the routing tables",
             (unsigned long long)combine);
  if (bf - f8 != rows * (4 * h - (h + 4 * ((h + 127) / 128))))
    fail_msg("fp8-expert-inputs saves %llu B of %llu, by hand %llu rows x (%llu - %llu)",
             (unsigned long long)(bf - f8), (unsigned long long)bf, (unsigned long long)rows,
             (unsigned long long)(4 * h), (unsigned long long)(h + 4 * ((h + 127) / 128)));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_core_rerun),
      cmocka_unit_test(test_layered_chunks),
      cmocka_unit_test(test_layered_per_stage),
      cmocka_unit_test(test_layered_refusals),
      cmocka_unit_test(test_llama3_layer_by_hand),
      cmocka_unit_test(test_deepseek_v3_layer_by_hand),
      cmocka_unit_test(test_full_every_layer_as_megatron),
      cmocka_unit_test(test_full_every_layer_blocks),
      cmocka_unit_test(test_fp8_expert_inputs),
      cmocka_unit_test(test_saved_released_by_reader),
      cmocka_unit_test(test_layer_tensors),
      cmocka_unit_test(test_layer_tensors_tp2),
      cmocka_unit_test(test_simulated_growth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
