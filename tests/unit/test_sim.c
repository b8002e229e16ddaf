/* Tests of the simulator (sim/): profile loading and cost formulas (roofline, measured table
 * with interpolation, ring/tree alpha-beta collectives on the group's span), the engine on
 * hand-built plans (stream order, waits, rendezvous, processor sharing, SM shares, contention,
 * link sharing, memory lifetimes), the pinned metrics from synthetic intervals, the report files
 * (results.csv columns, trace.json schema), the charts, and the textbook results
 * (docs/design.md, "The simulator's definitions") end to end through the real compile pipeline
 * with profiles/unit.json. Run from the repo root.
 *
 * Times: the unit profile's costs are decimal milliseconds, which binary floating point cannot
 * hold exactly; a step sums at most a few hundred of them, so results agree with the textbook
 * integers to far better than 1e-9 s (TIME_TOL). */
#include "test-helpers.h"
#include <cairo.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../base/json.h"
#include "../../directives/compile.h"
#include "../../report/chart.h"
#include "../../sim/cost.h"
#include "../../sim/profile.h"
#include "../../report/report.h"
#include "../../directives/layout.h"
#include "../../sim/queue-impl.h"
#include "../../sim/sim.h"
#include "../../tools/sweep.h"

#define TIME_TOL 1e-9
#define MS 1e-3

static struct profile *profile_from(const char *text, GError **err) {
  cJSON *root = json_parse_buffer("test.json", text, strlen(text), err);
  if (!root)
    return NULL;
  struct profile *p = profile_parse_json("test.json", root, err);
  cJSON_Delete(root);
  return p;
}

static struct profile *load_profile(const char *path) {
  GError *err = NULL;
  struct profile *p = profile_load_file(path, &err);
  if (!p)
    fail_msg("%s: %s", path, err->message);
  return p;
}

/* A device profile with round numbers: one GPU per node unless said, efficiencies 1. */
static const char *const plain_profile =
    "{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":100,\"fp32\":10},"
    "\"memory_bandwidth_gbs\":1000,\"memory_capacity_gib\":80},"
    "\"network\":{\"gpus_per_node\":8,\"nics_per_node\":8,\"nvlink_bandwidth_gbs\":100,"
    "\"nvlink_latency_us\":2,\"nic_bandwidth_gbs\":10,\"inter_node_latency_us\":5}}";

/* ---- profiles ----------------------------------------------------------------------------- */

static void test_profile_bundled(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  assert_true(u->synthetic);
  test_assert_near(u->syn_f, 1 * MS, 1e-15, 0, "F");
  test_assert_near(u->syn_b, 2 * MS, 1e-15, 0, "B");
  test_assert_near(u->syn_bi, 1 * MS, 1e-15, 0, "BI");
  test_assert_near(u->syn_bw, 1 * MS, 1e-15, 0, "BW");
  assert_true(u->syn_optimizer == 0 && u->syn_comm == 0);
  profile_free(u);
  const char *dev[] = {"profiles/h100-sxm.json", "profiles/h200.json", "profiles/a100-80g.json",
                       "profiles/h800.json"};
  for (int i = 0; i < 4; i++) {
    struct profile *p = load_profile(dev[i]);
    assert_false(p->synthetic);
    assert_true(p->peak_flops[MODEL_DTYPE_BF16] > 1e14);
    assert_true(p->memory_bandwidth > 1e12);
    assert_true(p->memory_capacity > (40ull << 30));
    assert_int_equal(p->gpus_per_node, 8);
    profile_free(p);
  }
  /* H200 = H100 compute with more and faster memory (datasheets) */
  struct profile *h100 = load_profile("profiles/h100-sxm.json");
  struct profile *h200 = load_profile("profiles/h200.json");
  assert_true(h100->peak_flops[MODEL_DTYPE_BF16] == h200->peak_flops[MODEL_DTYPE_BF16]);
  assert_true(h200->memory_bandwidth > h100->memory_bandwidth);
  /* H800 = H100 compute, NVLink 400 GB/s both ways instead of 900 */
  struct profile *h800 = load_profile("profiles/h800.json");
  assert_true(h800->peak_flops[MODEL_DTYPE_BF16] == h100->peak_flops[MODEL_DTYPE_BF16]);
  assert_true(h800->sm_count == h100->sm_count && h800->shape_model);
  test_assert_near(h800->intra_bandwidth, 200e9, 0, 1e-12, "h800 nvlink");
  /* FP8: 1,979 dense TFLOP/s on all three (3,958 with sparsity on the datasheets), twice bf16 */
  test_assert_near(h100->peak_flops[MODEL_DTYPE_FP8], 1978.9e12, 0, 1e-12, "h100 fp8");
  test_assert_near(h200->peak_flops[MODEL_DTYPE_FP8], 1978.9e12, 0, 1e-12, "h200 fp8");
  test_assert_near(h800->peak_flops[MODEL_DTYPE_FP8], 1978.9e12, 0, 1e-12, "h800 fp8");
  profile_free(h800);
  profile_free(h100);
  profile_free(h200);
}

/* FP8 GEMMs (piper.fp8) on the shapes model: a Llama-3-8B layer's F and B cost less than in
 * bf16 (the GEMMs at twice the peak with half the operand bytes), but more than half (the
 * attention core, norms and the casts stay); blockwise scaling's single cast pass costs less
 * than per-tensor scaling's amax pass plus cast; a profile's measured table is not used. */
static void test_fp8_cost(void **state) {
  (void)state;
  struct model *m = test_load_model("models/llama3-8b.json", 0);
  struct profile *p = load_profile("profiles/h100-sxm.json");
  uint32_t s = 1; /* the first decoder layer's segment */
  double t[3][2];
  const enum model_fp8 recipes[3] = {MODEL_FP8_NONE, MODEL_FP8_TENSORWISE, MODEL_FP8_BLOCKWISE};
  for (int r = 0; r < 3; r++) {
    m->fp8 = recipes[r];
    t[r][0] = profile_compute_cost(p, m, s, IR_PASS_F, 1).seconds;
    t[r][1] = profile_compute_cost(p, m, s, IR_PASS_B, 1).seconds;
  }
  for (int pass = 0; pass < 2; pass++) {
    assert_true(t[1][pass] < t[0][pass] && t[2][pass] < t[0][pass]);
    assert_true(t[1][pass] > 0.5 * t[0][pass]);
    assert_true(t[2][pass] < t[1][pass]);
  }
  m->fp8 = MODEL_FP8_NONE;
  profile_free(p);
  model_free(m);
}

/* ---- costs from shapes (sim/cost.h) ------------------------------------------------------- */

/* 132 SMs at 400 TFLOP/s (3.03 per SM), 1 TB/s, no efficiency losses, no launch overhead:
 * round numbers for hand-computed cases. */
static const char *const shape_profile =
    "{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":400,\"fp32\":40},"
    "\"memory_bandwidth_gbs\":1000,\"memory_capacity_gib\":80,\"sm_count\":132,"
    "\"cost_model\":\"shapes\",\"gemm_efficiency\":1,\"gemm_tile_fill_k\":0,"
    "\"attention_efficiency_fwd\":0.5,\"attention_efficiency_bwd\":0.4,"
    "\"attention_half_seq\":1024},"
    "\"network\":{\"gpus_per_node\":8,\"nics_per_node\":8,\"nvlink_bandwidth_gbs\":100,"
    "\"nvlink_latency_us\":2,\"nic_bandwidth_gbs\":10,\"inter_node_latency_us\":5}}";

static void test_gemm_shapes(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *p = profile_from(shape_profile, &err);
  assert_non_null(p);
  assert_true(p->shape_model);
  /* exactly one wave: 1536 x 2816 is 12 x 11 = 132 tiles of 128 x 256, one per SM, so the
   * GEMM runs at the device's peak: 2 m n k / 400 TFLOP/s (its bytes, 44 MB, take 44 us of
   * the 89 us) */
  struct cost_gemm g = cost_gemm(p, MODEL_DTYPE_BF16, 1536, 2816, 4096);
  assert_int_equal(g.tile_m * g.tile_n, 128 * 256);
  assert_true(g.waves == 1 && g.split_k == 1);
  test_assert_near(g.seconds, 2.0 * 1536 * 2816 * 4096 / 400e12, 0, 1e-12, "one wave");
  /* one more row needs a second wave of 128 x 256 tiles, or smaller tiles: either way
   * well over 1.5 times the time for 0.07% more work */
  struct cost_gemm g1 = cost_gemm(p, MODEL_DTYPE_BF16, 1537, 2816, 4096);
  assert_true(g1.seconds > 1.5 * g.seconds);
  /* skinny: 8 tokens through a 4096 x 4096 weight moves the weight (32 MiB) for 0.27 GFLOP:
   * memory-bound, its time the bytes over the bandwidth */
  struct cost_gemm s = cost_gemm(p, MODEL_DTYPE_BF16, 8, 4096, 4096);
  assert_true(s.memory > s.compute);
  test_assert_near(s.seconds, (8.0 * 4096 + 4096.0 * 4096 + 8.0 * 4096) * 2 / 1e12, 0, 1e-12,
                   "skinny");
  /* FP8 GEMMs take their own main-loop efficiency where the profile gives one: the one-wave
   * GEMM at an FP8 peak of 800 TFLOP/s and 0.5 of it runs at 400, as bf16 at 400 and 1 */
  p->peak_flops[MODEL_DTYPE_FP8] = 800e12;
  struct cost_gemm f8 = cost_gemm(p, MODEL_DTYPE_FP8, 1536, 2816, 4096);
  test_assert_near(f8.compute, g.compute / 2, 0, 1e-12, "fp8 at its peak, bf16's efficiency");
  p->gemm_efficiency_fp8 = 0.5;
  f8 = cost_gemm(p, MODEL_DTYPE_FP8, 1536, 2816, 4096);
  test_assert_near(f8.compute, 2.0 * 1536 * 2816 * 4096 / 400e12, 0, 1e-12, "fp8 efficiency");
  test_assert_near(cost_gemm(p, MODEL_DTYPE_BF16, 1536, 2816, 4096).seconds, g.seconds, 0, 0,
                   "bf16 unchanged");
  p->gemm_efficiency_fp8 = 0;
  /* a long K with few tiles splits K over the idle SMs */
  struct cost_gemm sk = cost_gemm(p, MODEL_DTYPE_BF16, 256, 256, 65536);
  assert_true(sk.split_k > 1);
  /* a measured entry takes precedence over the shape model (tiny-dense's MLP, 64 x 64 x 128) */
  char buf[2048];
  snprintf(buf, sizeof buf,
           "%.*s,\"measured\":[{\"op\":\"mlp\",\"pass\":\"F\",\"shape\":[64,64,128],"
           "\"ms\":1}]}",
           (int)strlen(shape_profile) - 1, shape_profile);
  struct profile *pm = profile_from(buf, &err);
  struct model *m = model_load_file("models/tiny-dense.json", 0, &err);
  assert_non_null(pm);
  assert_non_null(m);
  uint32_t mlp = 0;
  while (m->ops[mlp].kind != MODEL_OP_MLP)
    mlp++;
  struct profile_cost mc = profile_op_cost(pm, m, mlp, IR_PASS_F, 1, 1, false);
  assert_true(mc.measured_ops == 1 && mc.seconds == 1e-3);
  mc = profile_op_cost(pm, m, mlp, IR_PASS_BI, 1, 1, false); /* not measured: from shapes */
  assert_true(mc.measured_ops == 0 && mc.fallback_ops == 1 && mc.seconds < 1e-4);
  model_free(m);
  profile_free(pm);
  /* grouped: 8 experts of 64 rows where one has 256: the hot group's tiles add waves */
  struct cost_gemm even = cost_gemm_grouped(p, MODEL_DTYPE_BF16, 8, 512, 512, 4096, 4096);
  struct cost_gemm hot = cost_gemm_grouped(p, MODEL_DTYPE_BF16, 8, 512, 2048, 4096, 4096);
  assert_true(hot.seconds > even.seconds * 1.2);
  profile_free(p);
}

/* The unfused core (device.attention_kernel "unfused", Megatron-LM before FlashAttention): its
 * batched GEMMs by the tile model over the full square (causal or not), plus the softmax and
 * dropout kernels' traffic over the 8 x 1024 x 1024 scores at 1 TB/s: 9 bytes a score forward
 * (softmax 2 + 2, dropout 2 + 2 + a 1-byte mask), 11 backward. */
static void test_attention_unfused(void **state) {
  (void)state;
  GError *err = NULL;
  char buf[2048];
  const char *dev = strstr(shape_profile, "\"cost_model\"");
  snprintf(buf, sizeof buf, "%.*s\"attention_kernel\":\"unfused\",%s", (int)(dev - shape_profile),
           shape_profile, dev);
  struct profile *p = profile_from(buf, &err);
  assert_non_null(p);
  assert_true(p->attention_unfused);
  double scores = 8.0 * 1024 * 1024;
  enum model_dtype bf = MODEL_DTYPE_BF16;
  double fwd = cost_gemm_grouped(p, bf, 8, 1024, 1024, 1024, 128).seconds +
               cost_gemm_grouped(p, bf, 8, 1024, 1024, 128, 1024).seconds + scores * 9 / 1e12;
  test_assert_near(cost_attention_core(p, bf, 1, 1024, 8, 8, 128, 128, true, 1, false), fwd, 0,
                   1e-12, "unfused forward");
  /* the mask is applied to the full square: causal costs what non-causal does */
  test_assert_near(cost_attention_core(p, bf, 1, 1024, 8, 8, 128, 128, false, 1, false), fwd, 0,
                   1e-12, "unfused non-causal");
  double bwd = 2 * cost_gemm_grouped(p, bf, 8, 1024, 1024, 1024, 128).seconds +
               2 * cost_gemm_grouped(p, bf, 8, 1024, 1024, 128, 1024).seconds + scores * 11 / 1e12;
  test_assert_near(cost_attention_core(p, bf, 1, 1024, 8, 8, 128, 128, true, 1, true), bwd, 0,
                   1e-12, "unfused backward");
  /* slower than the fused kernel of the same shapes: the scores' round trips through HBM */
  struct profile *fused = profile_from(shape_profile, &err);
  assert_non_null(fused);
  assert_true(fwd > cost_attention_core(fused, bf, 1, 1024, 8, 8, 128, 128, false, 1, false));
  profile_free(fused);
  profile_free(p);
  /* a kernel the model does not know: one line naming the key */
  snprintf(buf, sizeof buf, "%.*s\"attention_kernel\":\"flash\",%s", (int)(dev - shape_profile),
           shape_profile, dev);
  assert_null(profile_from(buf, &err));
  assert_non_null(
      strstr(err->message, "device: key \"attention_kernel\": \"flash\" is not fused or unfused"));
  g_clear_error(&err);
}

static void test_attention_core(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *p = profile_from(shape_profile, &err);
  assert_non_null(p);
  /* causal, seq 1024, 8 heads of 128: 2 * 8 * 1024^2 * 256 / 2 FLOPs at 0.5 * 1024 / (1024 +
   * 1024) = 0.25 of 400 TFLOP/s */
  double f = 2.0 * 8 * 1024 * 1024 * 256 / 2;
  test_assert_near(
      cost_attention_core(p, MODEL_DTYPE_BF16, 1, 1024, 8, 8, 128, 128, true, 1, false), f / 100e12,
      0, 1e-12, "causal forward");
  /* backward: 2.5 times the FLOPs at 0.4 * 0.5 */
  test_assert_near(cost_attention_core(p, MODEL_DTYPE_BF16, 1, 1024, 8, 8, 128, 128, true, 1, true),
                   2.5 * f / 80e12, 0, 1e-12, "causal backward");
  /* non-causal: twice the FLOPs, at the efficiency of causal 2048 (0.5 * 2/3) */
  test_assert_near(cost_attention_core(p, MODEL_DTYPE_BF16, 1, 1024, 8, 8, 128, 128, false, 1,
                                       false),
                   2 * f / (400e12 / 3), 0, 1e-12, "non-causal");
  /* two context-parallel chunks: half the work each, at the efficiency of 512 (0.5 / 3) */
  test_assert_near(cost_attention_core(p, MODEL_DTYPE_BF16, 1, 1024, 8, 8, 128, 128, true, 2,
                                       false),
                   f / 2 / (400e12 / 6), 0, 1e-12, "cp 2");
  /* routing: 1000 routes over 10 experts. The trained router's published skew (MaxVio 0.52
   * with an auxiliary loss, 0.04 loss-free: Wang et al. 2024, Table 2) plus a micro-batch's
   * binomial spread, about sqrt(2 ln 10) sd over the mean on the busiest (mean 100, sd
   * sqrt(90)) */
  GError *merr = NULL;
  struct model *qm = model_load_file("models/qwen3-30b-a3b.json", 0, &merr);
  struct model *dm = model_load_file("models/deepseek-v3.json", 0, &merr);
  assert_non_null(qm);
  assert_non_null(dm);
  double spread = sqrt(2 * log(10.0)) * sqrt(90.0) / 100;
  test_assert_near(cost_routing_hot_factor(p, qm, 1000, 10), 1.52 + spread, 0, 1e-12,
                   "aux-loss router: hot expert");
  assert_false(qm->loss_free_balancing);
  assert_true(dm->loss_free_balancing); /* topk_method "noaux_tc" */
  test_assert_near(cost_routing_hot_factor(p, dm, 1000, 10), 1.04 + spread, 0, 1e-12,
                   "loss-free router: hot expert");
  assert_true(cost_routing_hot_factor(p, qm, 1000, 1) == 1); /* one expert: nothing to skew */
  p->routing_imbalance = 1.5;
  assert_true(cost_routing_hot_factor(p, qm, 1000, 10) == 1.5);
  model_free(qm);
  model_free(dm);
  profile_free(p);
  /* the bundled H100: a TP-8 slice of Llama-3-70B's MLP and a few-token expert GEMM run
   * further from peak than the whole MLP (tiles, waves, bytes) */
  struct profile *h = load_profile("profiles/h100-sxm.json");
  struct cost_gemm whole = cost_gemm(h, MODEL_DTYPE_BF16, 4096, 2 * 28672, 8192);
  struct cost_gemm tp8 = cost_gemm(h, MODEL_DTYPE_BF16, 4096, 2 * 28672 / 8, 8192);
  struct cost_gemm few = cost_gemm(h, MODEL_DTYPE_BF16, 32, 2 * 768, 2048);
  double e_whole = whole.flops / whole.seconds, e_tp8 = tp8.flops / tp8.seconds;
  double e_few = few.flops / few.seconds;
  assert_true(e_whole > e_tp8 && e_tp8 > e_few);
  profile_free(h);
}

static void test_profile_errors(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"kind\":\"device\"}", "\"device\" is required"},
      {"{\"kind\":\"gpu\"}", "\"kind\""},
      {"{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":1,\"B_ms\":2,\"BI_ms\":1}}", "BW_ms"},
      {"{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":1,\"B_ms\":2,\"BI_ms\":1,\"BW_ms\":1,"
       "\"X_ms\":1}}",
       "X_ms"},
      {"{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":-1,\"B_ms\":2,\"BI_ms\":1,\"BW_ms\":1}}",
       "F_ms"},
      {"{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":1,\"fp32\":1},"
       "\"memory_bandwidth_gbs\":1,\"memory_capacity_gib\":1}}",
       "\"network\" is required"},
      {"{\"bogus\":1}", "bogus"},
      {"{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":1,\"fp32\":1},"
       "\"memory_bandwidth_gbs\":1,\"memory_capacity_gib\":1},\"network\":{\"gpus_per_node\":8,"
       "\"nics_per_node\":8,\"nvlink_bandwidth_gbs\":1,\"nvlink_latency_us\":1,"
       "\"nic_bandwidth_gbs\":1,\"inter_node_latency_us\":1,\"all_to_all\":\"mpi\"}}",
       "\"all_to_all\": \"mpi\" is not nccl or deepep"},
      {"{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":1,\"fp32\":1},"
       "\"memory_bandwidth_gbs\":1,\"memory_capacity_gib\":1,\"cost_model\":\"tiles\"}}",
       "cost_model"},
      {"{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":1,\"B_ms\":2,\"BI_ms\":1,\"BW_ms\":1},"
       "\"moe\":{\"routing_imbalance\":0.5}}",
       "routing_imbalance"},
      {"{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":1,\"B_ms\":2,\"BI_ms\":1,\"BW_ms\":1},"
       "\"moe\":{\"expert_gemm_launches\":\"loop\"}}",
       "\"expert_gemm_launches\": \"loop\" is not grouped or per_expert"},
      {"{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":1,\"fp32\":1},"
       "\"memory_bandwidth_gbs\":1,\"memory_capacity_gib\":1,\"gemm_efficiency_fp8\":2}}",
       "gemm_efficiency_fp8"},
      {"[1]", "object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    GError *err = NULL;
    struct profile *p = profile_from(cases[i].text, &err);
    if (p)
      fail_msg("case %zu accepted", i);
    assert_non_null(err);
    assert_int_equal(err->code, PIPER_ERROR_INPUT);
    if (!strstr(err->message, cases[i].want) || !strstr(err->message, "test.json"))
      fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err->message, cases[i].want);
    g_error_free(err);
  }
  /* measured table: unknown op kind and duplicate entries */
  GError *err = NULL;
  char buf[2048];
  snprintf(buf, sizeof buf,
           "%.*s,\"measured\":[{\"op\":\"conv\",\"pass\":\"F\",\"shape\":[1],"
           "\"ms\":1}]}",
           (int)strlen(plain_profile) - 1, plain_profile);
  assert_null(profile_from(buf, &err));
  assert_non_null(strstr(err->message, "measured[0]"));
  g_clear_error(&err);
  snprintf(buf, sizeof buf,
           "%.*s,\"measured\":[{\"op\":\"mlp\",\"pass\":\"F\",\"shape\":[1],"
           "\"ms\":1},{\"op\":\"mlp\",\"pass\":\"F\",\"shape\":[1],\"ms\":2}]}",
           (int)strlen(plain_profile) - 1, plain_profile);
  assert_null(profile_from(buf, &err));
  assert_non_null(strstr(err->message, "duplicate"));
  g_clear_error(&err);
}

static void test_roofline_and_table(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  GError *err = NULL;
  struct profile *p = profile_from(plain_profile, &err);
  assert_non_null(p);
  /* roofline by hand over the segment's ops (fp32 model: the fp32 peak) */
  uint32_t s = 1;
  const struct model_segment *seg = &m->segments[s];
  double want = 0;
  for (uint32_t i = seg->op_first; i < seg->op_first + seg->op_count; i++) {
    double tc = m->ops[i].flops_fwd / 10e12, tm = (double)m->ops[i].bytes_fwd / 1000e9;
    want += tc > tm ? tc : tm;
  }
  struct profile_cost c = profile_compute_cost(p, m, s, IR_PASS_F, 1);
  test_assert_near(c.seconds, want, 0, 1e-12, "roofline F");
  assert_int_equal(c.fallback_ops, seg->op_count);
  assert_int_equal(c.measured_ops, 0);
  /* Experts sharded over 4 devices of a data-parallel group: each device keeps a quarter of the
   * weights (a quarter of the weight traffic) but runs as many routed tokens as its own
   * micro-batch has (the same FLOPs). */
  double want4 = 0;
  for (uint32_t i = seg->op_first; i < seg->op_first + seg->op_count; i++) {
    double pb = (double)m->ops[i].param_bytes;
    double tc = m->ops[i].flops_fwd / 10e12,
           tm = ((double)m->ops[i].bytes_fwd - pb + pb / 4) / 1000e9;
    want4 += tc > tm ? tc : tm;
  }
  struct profile_cost c4 = profile_compute_cost(p, m, s, IR_PASS_F, 4);
  test_assert_near(c4.seconds, want4, 0, 1e-12, "sharded");
  assert_true(want4 < want);
  /* B = BI + BW under the roofline when every op has one bound for all passes is not given;
   * B must at least cost as much as its heavier half */
  struct profile_cost bi = profile_compute_cost(p, m, s, IR_PASS_BI, 1);
  struct profile_cost b = profile_compute_cost(p, m, s, IR_PASS_B, 1);
  assert_true(b.seconds >= bi.seconds);
  profile_free(p);

  /* measured table: exact entry, interpolation in one dimension, proportional extrapolation */
  const struct model_op *op = &m->ops[seg->op_first];
  char buf[4096];
  int64_t T = op->shape[0];
  GString *shape_lo = g_string_new(""), *shape_hi = g_string_new("");
  for (int k = 0; k < PROFILE_MAX_SHAPE; k++) {
    g_string_append_printf(shape_lo, "%s%lld", k ? "," : "",
                           (long long)(k == 0 ? T / 2 : op->shape[k]));
    g_string_append_printf(shape_hi, "%s%lld", k ? "," : "",
                           (long long)(k == 0 ? T * 2 : op->shape[k]));
  }
  snprintf(buf, sizeof buf,
           "%.*s,\"measured\":[{\"op\":\"%s\",\"pass\":\"F\",\"shape\":[%s],\"ms\":1},"
           "{\"op\":\"%s\",\"pass\":\"F\",\"shape\":[%s],\"ms\":4}]}",
           (int)strlen(plain_profile) - 1, plain_profile, model_op_kind_name(op->kind),
           shape_lo->str, model_op_kind_name(op->kind), shape_hi->str);
  p = profile_from(buf, &err);
  if (!p)
    fail_msg("%s", err->message);
  struct profile_cost cm = profile_compute_cost(p, m, s, IR_PASS_F, 1);
  /* every op of the segment with that kind and shape is measured (layers repeat ops) */
  uint32_t same = 0;
  double rest = 0;
  for (uint32_t i = seg->op_first; i < seg->op_first + seg->op_count; i++) {
    if (m->ops[i].kind == op->kind && memcmp(m->ops[i].shape, op->shape, sizeof op->shape) == 0) {
      same++;
      continue;
    }
    double tc = m->ops[i].flops_fwd / 10e12, tm = (double)m->ops[i].bytes_fwd / 1000e9;
    rest += tc > tm ? tc : tm;
  }
  assert_int_equal(cm.measured_ops, same);
  assert_int_equal(cm.fallback_ops, seg->op_count - same);
  /* T lies a third of the way from T/2 to 2T: 1 ms + (4-1) ms * (T - T/2) / (2T - T/2) = 2 ms */
  test_assert_near(cm.seconds, rest + same * 2 * MS, 0, 1e-12, "interpolated");
  profile_free(p);
  /* outside the measured range: the nearest entry scaled in proportion (T/2 -> 1 ms: T -> 2) */
  snprintf(buf, sizeof buf,
           "%.*s,\"measured\":[{\"op\":\"%s\",\"pass\":\"F\",\"shape\":[%s],\"ms\":1}]}",
           (int)strlen(plain_profile) - 1, plain_profile, model_op_kind_name(op->kind),
           shape_lo->str);
  p = profile_from(buf, &err);
  if (!p)
    fail_msg("%s", err->message);
  struct profile_cost ce = profile_compute_cost(p, m, s, IR_PASS_F, 1);
  assert_int_equal(ce.measured_ops, same);
  test_assert_near(ce.seconds, rest + same * 2 * MS, 0, 1e-12, "extrapolated");
  profile_free(p);
  /* host_ms (GPU profiles): an op takes the longer of its kernels and its enqueueing */
  for (int slow_host = 0; slow_host <= 1; slow_host++) {
    snprintf(buf, sizeof buf,
             "%.*s,\"measured\":[{\"op\":\"%s\",\"pass\":\"F\",\"shape\":[%s],\"ms\":1,"
             "\"host_ms\":%s}]}",
             (int)strlen(plain_profile) - 1, plain_profile, model_op_kind_name(op->kind),
             shape_lo->str, slow_host ? "3" : "0.5");
    p = profile_from(buf, &err);
    if (!p)
      fail_msg("%s", err->message);
    struct profile_cost ch = profile_compute_cost(p, m, s, IR_PASS_F, 1);
    test_assert_near(ch.seconds, rest + same * (slow_host ? 6 : 2) * MS, 0, 1e-12, "host_ms");
    assert_true(ch.host_seconds == 0); /* no host thread */
    profile_free(p);
  }
  /* with a host thread (device.host_launch_us) the measured host_ms is the host's time, and
   * the op costs its kernels' (both extrapolated alike, x2); the other ops' host time is
   * their launches, the same in both profiles */
  double host_of[2];
  for (int slow_host = 0; slow_host <= 1; slow_host++) {
    GString *prof = g_string_new(plain_profile);
    g_string_replace(prof, "\"device\":{", "\"device\":{\"host_launch_us\":10,", 1);
    g_string_truncate(prof, prof->len - 1);
    snprintf(buf, sizeof buf,
             "%s,\"measured\":[{\"op\":\"%s\",\"pass\":\"F\",\"shape\":[%s],\"ms\":1,"
             "\"host_ms\":%s}]}",
             prof->str, model_op_kind_name(op->kind), shape_lo->str, slow_host ? "3" : "0.5");
    g_string_free(prof, TRUE);
    p = profile_from(buf, &err);
    if (!p)
      fail_msg("%s", err->message);
    struct profile_cost ch = profile_compute_cost(p, m, s, IR_PASS_F, 1);
    test_assert_near(ch.seconds, rest + same * 2 * MS, 0, 1e-12, "device time only");
    host_of[slow_host] = ch.host_seconds;
    profile_free(p);
  }
  test_assert_near(host_of[1] - host_of[0], same * (6 - 1) * MS, 0, 1e-12, "measured host_ms");
  g_string_free(shape_lo, TRUE);
  g_string_free(shape_hi, TRUE);
  model_free(m);
}

/* An expert segment on a device of a d-way expert-parallel group costs what the profile
 * measured for the experts alone at d (PROFILE_EP_DIM), where it did; at a degree it did not
 * measure, the op as measured on one device (dispatch to combine). */
static void test_expert_parallel_entries(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-moe.json", 0);
  uint32_t s = UINT32_MAX, e = 0;
  for (uint32_t k = 0; k < m->n_segments && s == UINT32_MAX; k++)
    for (uint32_t i = m->segments[k].op_first;
         i < m->segments[k].op_first + m->segments[k].op_count; i++)
      if (m->ops[i].kind == MODEL_OP_EXPERT_FFN && m->segments[k].op_count == 1)
        s = k, e = i;
  assert_true(s != UINT32_MAX); /* tiny-moe's experts are a segment of their own */
  const int64_t *sh = m->ops[e].shape;
  char buf[4096];
  snprintf(buf, sizeof buf,
           "%.*s,\"measured\":["
           "{\"op\":\"expert_ffn\",\"pass\":\"F\",\"shape\":[%lld,%lld,%lld,%lld,%lld],\"ms\":4},"
           "{\"op\":\"expert_ffn\",\"pass\":\"F\",\"shape\":[%lld,%lld,%lld,%lld,%lld,2],\"ms\":3},"
           "{\"op\":\"expert_ffn\",\"pass\":\"BI\",\"shape\":[%lld,%lld,%lld,%lld,%lld,2],\"ms\":1},"
           "{\"op\":\"expert_ffn\",\"pass\":\"BW\",\"shape\":[%lld,%lld,%lld,%lld,%lld,2],\"ms\":0.5}"
           "]}",
           (int)strlen(plain_profile) - 1, plain_profile, (long long)sh[0], (long long)sh[1],
           (long long)sh[2], (long long)sh[3], (long long)sh[4], (long long)sh[0], (long long)sh[1],
           (long long)sh[2], (long long)sh[3], (long long)sh[4], (long long)sh[0], (long long)sh[1],
           (long long)sh[2], (long long)sh[3], (long long)sh[4], (long long)sh[0], (long long)sh[1],
           (long long)sh[2], (long long)sh[3], (long long)sh[4]);
  GError *err = NULL;
  struct profile *p = profile_from(buf, &err);
  if (!p)
    fail_msg("%s", err->message);
  test_assert_near(profile_compute_cost(p, m, s, IR_PASS_F, 1).seconds, 4 * MS, 0, 1e-12,
                   "one device");
  test_assert_near(profile_compute_cost(p, m, s, IR_PASS_F, 2).seconds, 3 * MS, 0, 1e-12,
                   "ep 2 measured");
  test_assert_near(profile_compute_cost(p, m, s, IR_PASS_F, 4).seconds, 4 * MS, 0, 1e-12,
                   "ep 4 not measured: the one-device op");
  /* B from its halves at the measured degree */
  test_assert_near(profile_compute_cost(p, m, s, IR_PASS_B, 2).seconds, 1.5 * MS, 0, 1e-12,
                   "ep 2 B = BI + BW");
  /* BI measured at ep 2 only: the one-device op is not scaled from it (to 0), it falls back */
  struct profile_cost one = profile_compute_cost(p, m, s, IR_PASS_BI, 1);
  assert_true(one.seconds > 0);
  assert_int_equal(one.measured_ops, 0);
  profile_free(p);
  model_free(m);
}

/* AdamW's traffic per parameter updated, plus the weight copies' per parameter held (a bf16
 * model on the cuda backend): 1000 GB/s, 28 B (the default) and 10 B. */
static void test_optimizer_cost(void **state) {
  (void)state;
  GError *err = NULL;
  /* the key goes in before "memory_capacity_gib" (a GString: no offsets into a fixed buffer,
   * which gcc 12's -Warray-bounds could not prove in range under ASan) */
  GString *text = g_string_new(plain_profile);
  const char *at = strstr(text->str, "\"memory_capacity_gib\"");
  assert_non_null(at);
  g_string_insert(text, at - text->str, "\"weight_copy_bytes_per_param\":10.0, ");
  struct profile *p = profile_from(text->str, &err);
  g_string_free(text, TRUE);
  if (!p)
    fail_msg("%s", err->message);
  test_assert_near(p->weight_copy_bytes_per_param, 10, 0, 1e-12, "parsed");
  double over = p->kernel_overhead;
  test_assert_near(profile_optimizer_cost(p, 1e9, 0).seconds, 28e9 / 1e12 + over, 0, 1e-12,
                   "no copies");
  test_assert_near(profile_optimizer_cost(p, 0.5e9, 1e9).seconds, (14e9 + 10e9) / 1e12 + over, 0,
                   1e-12, "ZeRO-1 over 2: half updated, all copied");
  profile_free(p);
}

/* MoE as it runs: an expert op's GEMMs are two grouped launches (gate/up, down) whose
 * most-loaded expert gets routing_imbalance x the mean rows; the dispatch and combine copies
 * and the SwiGLU pass are memory-bound traffic besides. */
static void test_moe_costs(void **state) {
  (void)state;
  GError *err = NULL;
  struct model *m = model_load_file("models/qwen3-30b-a3b.json", 0, &err);
  assert_non_null(m);
  struct profile *h = load_profile("profiles/h100-sxm.json");
  uint32_t e = 0;
  while (m->ops[e].kind != MODEL_OP_EXPERT_FFN)
    e++;
  const struct model_op *op = &m->ops[e];
  double T = (double)op->shape[0], hid = (double)op->shape[1], f = (double)op->shape[2];
  double E = (double)op->shape[3], k = (double)op->shape[4], ep = 8;
  double bytes = (double)op->bytes_fwd;
  h->routing_imbalance = 2;
  double fam[PROFILE_FAMILY_COUNT] = {0}, mem = 0;
  assert_true(cost_model_op(h, m, op, IR_PASS_F, 1, (uint32_t)ep, 1, bytes, fam, &mem));
  /* 8 devices of 16 experts each get T k routes: T k / 16 rows an expert, twice on the hot one */
  double rows = T * k / (E / ep);
  double want = cost_gemm_grouped(h, m->dtype, E / ep, rows, 2 * rows, 2 * f, hid).seconds +
                cost_gemm_grouped(h, m->dtype, E / ep, rows, 2 * rows, hid, f).seconds;
  test_assert_near(fam[PROFILE_FAMILY_GEMM], want, 0, 1e-12, "grouped GEMMs, hot expert");
  assert_true(fam[PROFILE_FAMILY_MEMORY] > 0 && mem >= fam[PROFILE_FAMILY_MEMORY]);
  double hot = fam[PROFILE_FAMILY_GEMM];
  /* the all-to-all over 8 ranks waits for the rank of the hot expert: its 16 experts carry
   * 15 + 2 experts' mean rows */
  test_assert_near(cost_all_to_all_skew(h, m, 8), 17.0 / 16, 0, 1e-12, "a2a skew");
  assert_true(cost_all_to_all_skew(h, m, 1) == 1);
  h->routing_imbalance = 0; /* published skew + binomial spread: less than 2x here */
  double fam1[PROFILE_FAMILY_COUNT] = {0};
  mem = 0;
  assert_true(cost_model_op(h, m, op, IR_PASS_F, 1, (uint32_t)ep, 1, bytes, fam1, &mem));
  /* the 8 devices' T k routes each over the 128 experts: mean 2048 routes an expert */
  double routes = T * k * ep, mean = routes / E;
  double hf = 1 + COST_MAXVIO_AUX_LOSS + sqrt(2 * log(E)) * sqrt(mean * (1 - 1 / E)) / mean;
  double want1 = cost_gemm_grouped(h, m->dtype, E / ep, rows, hf * rows, 2 * f, hid).seconds +
                 cost_gemm_grouped(h, m->dtype, E / ep, rows, hf * rows, hid, f).seconds;
  test_assert_near(fam1[PROFILE_FAMILY_GEMM], want1, 0, 1e-12, "published skew");
  assert_true(fam1[PROFILE_FAMILY_GEMM] <= hot);
  /* per-expert launches (Transformer Engine's GroupedLinear): the same tiles, and each of the
   * 16 local experts' launches past the first pays kernel_overhead (4 us on this profile): F
   * runs 2 products, 2 x 15 x 4 us = 120 us more; B runs each GEMM's input and weight
   * gradients, 4 products, 240 us more */
  h->routing_imbalance = 1;
  h->expert_gemm_per_expert = false;
  for (int pass = 0; pass < 2; pass++) {
    enum ir_pass ps = pass ? IR_PASS_B : IR_PASS_F;
    double g1[PROFILE_FAMILY_COUNT] = {0}, g16[PROFILE_FAMILY_COUNT] = {0};
    assert_true(cost_model_op(h, m, op, ps, 1, (uint32_t)ep, 1, bytes, g1, &mem));
    h->expert_gemm_per_expert = true;
    assert_true(cost_model_op(h, m, op, ps, 1, (uint32_t)ep, 1, bytes, g16, &mem));
    h->expert_gemm_per_expert = false;
    assert_true(h->kernel_overhead == 4e-6);
    test_assert_near(g16[PROFILE_FAMILY_GEMM] - g1[PROFILE_FAMILY_GEMM], pass ? 240e-6 : 120e-6,
                     1e-12, 0, "per-expert launches");
    assert_true(g16[PROFILE_FAMILY_MEMORY] == g1[PROFILE_FAMILY_MEMORY]);
  }
  profile_free(h);
  model_free(m);
}

/* GPT-3-style and gpt_oss ops from shapes: a GELU MLP is one up and one down GEMM (not
 * SwiGLU's 2f-wide gate and up); a sliding layer's attention core is s / w blocks of w queries
 * over a w-key band, at the kernel's efficiency for w; a full layer the causal s. */
static void test_gpt_shape_costs(void **state) {
  (void)state;
  GError *err = NULL;
  struct model *g = model_load_file("models/gpt3-22b.json", 0, &err);
  struct model *o = model_load_file("models/gpt-oss-20b.json", 0, &err);
  assert_non_null(g);
  assert_non_null(o);
  struct profile *h = load_profile("profiles/h100-sxm.json");
  const struct model_op *mlp = &g->ops[5];
  assert_int_equal(mlp->kind, MODEL_OP_MLP);
  double T = (double)mlp->shape[0], hid = (double)mlp->shape[1], f = (double)mlp->shape[2];
  double fam[PROFILE_FAMILY_COUNT] = {0}, mem = 0;
  assert_true(cost_model_op(h, g, mlp, IR_PASS_F, 1, 1, 1, 0, fam, &mem));
  test_assert_near(fam[PROFILE_FAMILY_GEMM],
                   cost_gemm(h, g->dtype, T, f, hid).seconds + cost_gemm(h, g->dtype, T, hid, f).seconds,
                   0, 1e-12, "GELU MLP: up and down");
  const struct model_op *slide = &o->ops[2], *full = NULL;
  for (uint32_t i = 3; i < o->n_ops && !full; i++)
    if (o->ops[i].kind == MODEL_OP_ATTENTION)
      full = &o->ops[i];
  double b = (double)slide->shape[0], s = (double)slide->shape[1], H = (double)slide->shape[2];
  double kv = (double)slide->shape[3], d = (double)slide->shape[4], w = (double)slide->shape[6];
  assert_true(w == 128 && full->shape[6] == 0);
  double fs[PROFILE_FAMILY_COUNT] = {0}, ff[PROFILE_FAMILY_COUNT] = {0};
  assert_true(cost_model_op(h, o, slide, IR_PASS_BI, 1, 1, 1, 0, fs, &mem));
  assert_true(cost_model_op(h, o, full, IR_PASS_BI, 1, 1, 1, 0, ff, &mem));
  test_assert_near(fs[PROFILE_FAMILY_ATTENTION],
                   cost_attention_core(h, o->dtype, b * s / w, w, H, kv, d, d, false, 1, true), 0,
                   1e-12, "sliding window: s/w blocks of w");
  test_assert_near(ff[PROFILE_FAMILY_ATTENTION],
                   cost_attention_core(h, o->dtype, b, s, H, kv, d, d, true, 1, true), 0, 1e-12,
                   "full layer: causal s");
  assert_true(fs[PROFILE_FAMILY_ATTENTION] < ff[PROFILE_FAMILY_ATTENTION] / 4);
  profile_free(h);
  model_free(g);
  model_free(o);
}

/* The topology model (network.collective_model "topology"): per-level latency, NCCL's step
 * counts, all-to-all split over NVLink and NIC peers. Same links as plain_profile: NVLink
 * 100 GB/s and 2 us, 8 NICs of 10 GB/s and 5 us per node of 8, efficiency 1. */
static void test_collectives_topology(void **state) {
  (void)state;
  char buf[1024];
  snprintf(buf, sizeof buf, "%.*s,\"collective_model\":\"topology\",\"nodes_per_leaf\":2,"
           "\"spine_latency_us\":1,\"spine_bandwidth_factor\":0.5}}",
           (int)strlen(plain_profile) - 2, plain_profile);
  GError *err = NULL;
  struct profile *p = profile_from(buf, &err);
  if (!p)
    fail_msg("%s", err->message);
  assert_true(p->topology_model);
  double n = 64e6;
  uint32_t devs[32];
  for (uint32_t i = 0; i < 32; i++)
    devs[i] = i;
  /* inside a node: ring, 2 (8 - 1) NVLink steps of 2 us, 2 (7/8) n at 100 GB/s */
  struct profile_span sp = profile_span_of(p, devs, 8);
  struct profile_comm_cost c = profile_comm_cost(p, IR_NODE_ALL_REDUCE, (uint64_t)n, &sp);
  test_assert_near(c.latency, 14 * 2e-6, 0, 1e-15, "intra latency");
  test_assert_near(c.transfer, 2 * 7.0 / 8 * n / 100e9, 0, 1e-15, "intra transfer");
  /* 2 nodes x 8: 30 steps, 2 (2 - 1) = 2 of them across nodes at 5 us, 28 on NVLink at 2 us;
   * the node's 8 NICs carry 2 (15/16) n at 80 GB/s */
  sp = profile_span_of(p, devs, 16);
  c = profile_comm_cost(p, IR_NODE_ALL_REDUCE, (uint64_t)n, &sp);
  test_assert_near(c.latency, 28 * 2e-6 + 2 * 5e-6, 0, 1e-15, "inter latency");
  test_assert_near(c.transfer, 2 * 15.0 / 16 * n / 80e9, 0, 1e-15, "inter transfer");
  /* 4 nodes: past the leaf group of 2, the spine adds 1 us a NIC step and halves the NICs */
  sp = profile_span_of(p, devs, 32);
  c = profile_comm_cost(p, IR_NODE_ALL_REDUCE, (uint64_t)n, &sp);
  test_assert_near(c.latency, (62 - 6) * 2e-6 + 6 * 6e-6, 0, 1e-15, "spine latency");
  test_assert_near(c.transfer, 2 * 31.0 / 32 * n / 40e9, 0, 1e-15, "spine transfer");
  /* tree where NCCL would take it: 1 KiB over 4 nodes, 2 ((8 - 1) 2 us + log2 4 x 6 us) beats
   * the ring's 62 steps */
  p->algo = PROFILE_ALGO_AUTO;
  c = profile_comm_cost(p, IR_NODE_ALL_REDUCE, 1024, &sp);
  test_assert_near(c.latency, 2 * (7 * 2e-6 + 2 * 6e-6), 0, 1e-15, "tree latency");
  /* all-to-all over 2 nodes x 8: 7/16 of n to NVLink peers at 100 GB/s while 8/16 leaves at
   * 80 GB/s; 7 peers at 2 us and 8 at 5 us */
  sp = profile_span_of(p, devs, 16);
  c = profile_comm_cost(p, IR_NODE_ALL_TO_ALL, (uint64_t)n, &sp);
  test_assert_near(c.transfer, 8.0 / 16 * n / 80e9, 0, 1e-15, "a2a transfer");
  test_assert_near(c.latency, 7 * 2e-6 + 8 * 5e-6, 0, 1e-15, "a2a latency");
  /* DeepEP: one pass at its own efficiency */
  p->deepep = true;
  p->deepep_efficiency_inter = 0.5;
  c = profile_comm_cost(p, IR_NODE_ALL_TO_ALL, (uint64_t)n, &sp);
  test_assert_near(c.transfer, 8.0 / 16 * n / 40e9, 0, 1e-15, "deepep transfer");
  test_assert_near(c.latency, 5e-6, 0, 1e-15, "deepep latency");
  profile_free(p);
}

static void test_collectives(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *p = profile_from(plain_profile, &err);
  assert_non_null(p);
  double alpha = 2e-6, B = 100e9, n = 64e6;
  for (uint32_t size = 2; size <= 8; size *= 2) {
    uint32_t devs[8];
    for (uint32_t i = 0; i < size; i++)
      devs[i] = i; /* one node */
    struct profile_span sp = profile_span_of(p, devs, size);
    assert_int_equal(sp.n_nodes, 1);
    double pr = size;
    struct profile_comm_cost ar = profile_comm_cost(p, IR_NODE_ALL_REDUCE, (uint64_t)n, &sp);
    /* ring all-reduce: 2(p-1) alpha + 2(p-1)/p n/B */
    test_assert_near(ar.latency + ar.transfer, 2 * (pr - 1) * alpha + 2 * (pr - 1) / pr * n / B, 0,
                1e-12, "ring all-reduce");
    struct profile_comm_cost ag = profile_comm_cost(p, IR_NODE_ALL_GATHER, (uint64_t)n, &sp);
    struct profile_comm_cost rs = profile_comm_cost(p, IR_NODE_REDUCE_SCATTER, (uint64_t)n, &sp);
    test_assert_near(ag.latency + ag.transfer, (ar.latency + ar.transfer) / 2, 0, 1e-12, "all-gather");
    test_assert_near(rs.latency + rs.transfer, (ar.latency + ar.transfer) / 2, 0, 1e-12,
                "reduce-scatter");
    assert_false(ar.inter_node);
  }
  /* across nodes: 16 ranks on 2 nodes of 8 use all 8 NICs of 10 GB/s each = 80 GB/s, inter-node
   * latency */
  uint32_t devs[16];
  for (uint32_t i = 0; i < 16; i++)
    devs[i] = i;
  struct profile_span sp = profile_span_of(p, devs, 16);
  assert_int_equal(sp.n_nodes, 2);
  assert_int_equal(sp.min_per_node, 8);
  struct profile_comm_cost ar = profile_comm_cost(p, IR_NODE_ALL_REDUCE, (uint64_t)n, &sp);
  assert_true(ar.inter_node);
  test_assert_near(ar.latency + ar.transfer, 2 * 15 * 5e-6 + 2 * 15.0 / 16 * n / 80e9, 0, 1e-12,
              "inter-node ring");
  /* one rank per node (devices 0, 8): one NIC's share, 8 * 10 / 8 = 10 GB/s */
  uint32_t two[2] = {0, 8};
  sp = profile_span_of(p, two, 2);
  assert_int_equal(sp.n_nodes, 2); /* a pair has its own path (no allocation) */
  assert_int_equal(sp.min_per_node, 1);
  uint32_t same[2] = {13, 10}, apart[2] = {9, 7};
  struct profile_span sp_same = profile_span_of(p, same, 2), sp_apart = profile_span_of(p, apart, 2);
  assert_true(sp_same.p == 2 && sp_same.n_nodes == 1 && sp_same.min_per_node == 2);
  assert_true(sp_apart.p == 2 && sp_apart.n_nodes == 2 && sp_apart.min_per_node == 1);
  struct profile_comm_cost pp = profile_comm_cost(p, IR_NODE_SEND, (uint64_t)n, &sp);
  test_assert_near(pp.latency + pp.transfer, 5e-6 + n / 10e9, 0, 1e-12, "p2p inter");
  /* tree is chosen by "auto" only where it is cheaper: small messages over many ranks */
  p->algo = PROFILE_ALGO_AUTO;
  struct profile_comm_cost small = profile_comm_cost(p, IR_NODE_ALL_REDUCE, 1024, &sp);
  p->algo = PROFILE_ALGO_RING;
  struct profile_comm_cost ring = profile_comm_cost(p, IR_NODE_ALL_REDUCE, 1024, &sp);
  assert_true(small.latency + small.transfer <= ring.latency + ring.transfer);
  profile_free(p);
}

/* ---- hand-built plans --------------------------------------------------------------------- */

/* One instruction of a hand-built plan. */
struct hi {
  enum ir_node_kind kind;
  uint32_t stream;
  enum ir_pass pass;
  uint32_t peer;      /* send/recv: the other device; collectives: group index */
  uint64_t bytes;     /* comm payload */
  int wait;           /* class instruction it waits for, -1 none */
  uint64_t out_bytes; /* a tensor it writes (0 none) ... */
  int consumer;       /* ... read by this instruction of the device (-1: none) */
  int saved;          /* that tensor is saved activations */
};

struct hplan {
  uint32_t n_devices, n_streams;
  double shares[4]; /* stream SM shares (0 = 1) */
  uint32_t n[8];
  struct hi ins[8][16];
  uint32_t n_coll_groups;
  uint32_t coll_group[2][8]; /* members */
  uint32_t coll_size[2];
};

/* Builds a plan: one class per device, one node per instruction, groups {d} per device plus
 * the collective groups, a PP comm per ordered device pair and a DP comm per collective group. */
static struct plan *hplan_build(const struct hplan *h) {
  struct plan *p = g_new0(struct plan, 1);
  p->model = test_load_model("models/tiny-dense.json", 0);
  p->n_devices = h->n_devices;
  p->n_microbatches = 1;
  p->n_tags = 1;
  strcpy(p->tag_names[0], "PP");
  uint32_t ng = h->n_devices + h->n_coll_groups;
  p->n_groups = ng;
  p->groups = g_new0(struct ir_group, ng);
  p->device_pool = g_new0(uint32_t, h->n_devices + 16);
  uint32_t pool = 0;
  for (uint32_t d = 0; d < h->n_devices; d++) {
    p->groups[d] = (struct ir_group){pool, 1};
    p->device_pool[pool++] = d;
  }
  for (uint32_t g = 0; g < h->n_coll_groups; g++) {
    p->groups[h->n_devices + g] = (struct ir_group){pool, h->coll_size[g]};
    for (uint32_t i = 0; i < h->coll_size[g]; i++)
      p->device_pool[pool++] = h->coll_group[g][i];
  }
  p->n_device_pool = pool;
  p->n_streams = h->n_streams;
  p->streams = g_new0(struct ir_stream, h->n_streams);
  for (uint32_t s = 0; s < h->n_streams; s++) {
    snprintf(p->streams[s].name, IR_NAME_MAX, "s%u", s);
    p->streams[s].sm_share = h->shares[s] > 0 ? h->shares[s] : 1;
  }
  /* comms: PP a->b at a * n + b, then DP per collective group */
  p->n_comms = h->n_devices * h->n_devices + h->n_coll_groups;
  p->comms = g_new0(struct plan_comm, p->n_comms);
  for (uint32_t a = 0; a < h->n_devices; a++)
    for (uint32_t b = 0; b < h->n_devices; b++)
      p->comms[a * h->n_devices + b] = (struct plan_comm){.purpose = IR_COMM_PP, .group = a, .peer_group = b};
  for (uint32_t g = 0; g < h->n_coll_groups; g++)
    p->comms[h->n_devices * h->n_devices + g] =
        (struct plan_comm){.purpose = IR_COMM_DP, .group = h->n_devices + g, .peer_group = IR_NONE};
  uint32_t total = 0;
  for (uint32_t d = 0; d < h->n_devices; d++)
    total += h->n[d];
  p->nodes = g_new0(struct ir_node, total + 1);
  p->n_classes = h->n_devices;
  p->classes = g_new0(struct plan_class, h->n_devices);
  p->device_class = g_new0(uint32_t, h->n_devices);
  uint32_t node = 0;
  for (uint32_t d = 0; d < h->n_devices; d++) {
    p->device_class[d] = d;
    struct plan_class *c = &p->classes[d];
    uint32_t n = h->n[d];
    c->n_devices = 1;
    c->devices = g_new(uint32_t, 1);
    c->devices[0] = d;
    c->n_instrs = n;
    c->instrs = g_new0(struct plan_instr, n + 1);
    c->waits = g_new0(uint32_t, n + 1);
    c->reads = g_new0(uint32_t, n + 1);
    c->writes = g_new0(uint32_t, n + 1);
    c->consumers = g_new0(uint32_t, n + 1);
    c->tensors = g_new0(struct plan_tensor, n + 1);
    uint32_t seq[64] = {0};
    for (uint32_t i = 0; i < n; i++) {
      const struct hi *x = &h->ins[d][i];
      struct ir_node *nd = &p->nodes[node];
      for (int t = 0; t < IR_MAX_TAGS; t++)
        nd->tags[t] = -1;
      nd->kind = x->kind;
      nd->pass = x->kind == IR_NODE_COMPUTE ? x->pass : IR_PASS_NONE;
      nd->segment = x->kind == IR_NODE_COMPUTE ? 0 : IR_NONE;
      nd->group = d;
      nd->peer_group = IR_NONE;
      nd->segset = IR_NONE;
      nd->pair = IR_NONE;
      nd->stream = x->stream;
      nd->bytes = x->bytes;
      nd->shard_degree = 1;
      nd->replica_degree = 1;
      nd->directive = IR_NONE;
      struct plan_instr *in = &c->instrs[i];
      in->node = node++;
      in->stream = x->stream;
      in->comm = IR_NONE;
      if (x->kind == IR_NODE_SEND || x->kind == IR_NODE_RECV) {
        nd->peer_group = x->peer;
        nd->purpose = IR_COMM_PP;
        in->comm =
            x->kind == IR_NODE_SEND ? d * h->n_devices + x->peer : x->peer * h->n_devices + d;
      } else if (x->kind != IR_NODE_COMPUTE && x->kind != IR_NODE_OPTIMIZER) {
        nd->group = h->n_devices + x->peer;
        nd->purpose = IR_COMM_DP;
        in->comm = h->n_devices * h->n_devices + x->peer;
      }
      if (in->comm != IR_NONE)
        in->seq = seq[in->comm]++;
      if (x->wait >= 0) {
        in->wait_first = c->n_waits;
        in->wait_count = 1;
        c->waits[c->n_waits++] = (uint32_t)x->wait;
      }
    }
    /* tensors, then reads in instruction order */
    for (uint32_t i = 0; i < n; i++) {
      const struct hi *x = &h->ins[d][i];
      c->instrs[i].write_first = c->n_writes;
      if (!x->out_bytes)
        continue;
      uint32_t t = c->n_tensors++;
      c->tensors[t] =
          (struct plan_tensor){x->out_bytes, i, x->saved ? PLAN_TENSOR_SAVED : PLAN_TENSOR_OUT,
                               c->n_consumers, x->consumer >= 0 ? 1u : 0u, i, i};
      if (x->consumer >= 0) /* released by its reader (the memory rule) */
        c->tensors[t].release = (uint32_t)x->consumer;
      if (x->consumer >= 0)
        c->consumers[c->n_consumers++] = (uint32_t)x->consumer;
      c->writes[c->n_writes++] = t;
      c->instrs[i].write_count = 1;
    }
    for (uint32_t i = 0; i < n; i++) {
      c->instrs[i].read_first = c->n_reads;
      for (uint32_t t = 0; t < c->n_tensors; t++)
        if (c->tensors[t].consumer_count && c->consumers[c->tensors[t].consumer_first] == i) {
          c->reads[c->n_reads++] = t;
          c->instrs[i].read_count++;
        }
    }
    c->stream_first = g_new0(uint32_t, h->n_streams + 1);
    c->stream_instrs = g_new0(uint32_t, n + 1);
    uint32_t k = 0;
    for (uint32_t s = 0; s < h->n_streams; s++) {
      c->stream_first[s] = k;
      for (uint32_t i = 0; i < n; i++)
        if (c->instrs[i].stream == s)
          c->stream_instrs[k++] = i;
    }
    c->stream_first[h->n_streams] = k;
  }
  p->n_nodes = node;
  plan_index_positions(p);
  return p;
}

static struct sim_result *run(const struct plan *p, const struct profile *prof, bool collapse) {
  GError *err = NULL;
  struct sim_options o = {.collapse = collapse};
  struct sim_result *r = sim_run(p, prof, &o, &err);
  if (!r)
    fail_msg("sim_run: %s", err->message);
  return r;
}

/* interval of class instruction i of device d (by node: one node per instruction here) */
static const struct report_interval *iv_of(const struct sim_result *r, const struct plan *p,
                                           uint32_t d, uint32_t i) {
  const struct sim_unit *u = &r->units[r->device_unit[d]];
  uint32_t node = p->classes[p->device_class[d]].instrs[i].node;
  for (uint32_t k = 0; k < u->n_intervals; k++)
    if (u->intervals[k].node == node)
      return &u->intervals[k];
  fail_msg("no interval for device %u instruction %u", d, i);
  return NULL;
}

#define C(stream, pass)                                                                            \
  { IR_NODE_COMPUTE, stream, pass, 0, 0, -1, 0, -1, 0 }

static void test_engine_order_and_rendezvous(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  /* device 0: F (1 ms) then send; device 1: recv then F. Device 1's stream 1 waits for the
   * recv; the rendezvous makes device 1's F start at 1 ms. */
  struct hplan h = {.n_devices = 2, .n_streams = 2, .n = {2, 2}};
  h.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 1000, 0, 0, -1, 0};
  h.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h.ins[1][1] = (struct hi){IR_NODE_COMPUTE, 0, IR_PASS_B, 0, 0, 0, 0, -1, 0};
  struct plan *p = hplan_build(&h);
  struct sim_result *r = run(p, u, false);
  test_assert_near(iv_of(r, p, 1, 0)->start, 1 * MS, TIME_TOL, 0, "recv start");
  test_assert_near(iv_of(r, p, 1, 1)->start, 1 * MS, TIME_TOL, 0, "B start");
  test_assert_near(r->iteration_time, 3 * MS, TIME_TOL, 0, "iteration");
  sim_result_free(r);
  plan_free(p);

  /* processor sharing: two 1 ms kernels on two streams of one device both end at 2 ms */
  struct hplan h2 = {.n_devices = 1, .n_streams = 2, .n = {2}};
  h2.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h2.ins[0][1] = (struct hi)C(1, IR_PASS_F);
  p = hplan_build(&h2);
  r = run(p, u, false);
  test_assert_near(iv_of(r, p, 0, 0)->end, 2 * MS, TIME_TOL, 0, "shared end 0");
  test_assert_near(iv_of(r, p, 0, 1)->end, 2 * MS, TIME_TOL, 0, "shared end 1");
  sim_result_free(r);
  plan_free(p);

  /* SM shares: stream 0 capped at 0.25 takes 4 ms alone; with stream 1 (0.75) running a 3 ms
   * B beside it both proceed at their caps: 1 ms of work at 0.75 takes... B is 2 ms: 2/0.75 */
  struct hplan h3 = {.n_devices = 1, .n_streams = 2, .shares = {0.25, 0.75}, .n = {2}};
  h3.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h3.ins[0][1] = (struct hi)C(1, IR_PASS_B);
  p = hplan_build(&h3);
  r = run(p, u, false);
  test_assert_near(iv_of(r, p, 0, 0)->end, 4 * MS, TIME_TOL, 0, "capped F");
  test_assert_near(iv_of(r, p, 0, 1)->end, 2 * MS / 0.75, TIME_TOL, 0, "capped B");
  sim_result_free(r);
  plan_free(p);
  profile_free(u);
}

/* ---- ranks sharing cores; measured per-operation fits ------------------------------------- */

/* The plain profile with the host facts and a fit per operation (the keys piper-prof writes). */
static const char *const host_profile =
    "{\"kind\":\"device\",\"device\":{\"peak_tflops\":{\"bf16\":100,\"fp32\":10},"
    "\"memory_bandwidth_gbs\":1000,\"memory_capacity_gib\":80},"
    "\"network\":{\"gpus_per_node\":8,\"nics_per_node\":8,\"nvlink_bandwidth_gbs\":100,"
    "\"nvlink_latency_us\":2,\"nic_bandwidth_gbs\":10,\"inter_node_latency_us\":5},"
    "\"host\":{\"cores_per_node\":2,\"instruction_overhead_us\":1.5,\"wait_core_share\":0.25,"
    "\"comm_test_us\":3,\"wake_latency_us\":40},"
    "\"collectives\":{\"intra_node\":{\"p2p\":{\"latency_us\":1,\"bandwidth_gbs\":8},"
    "\"all_to_all\":{\"latency_us\":4,\"bandwidth_gbs\":2}}}}";

static void test_profile_host_and_fits(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *p = profile_from(host_profile, &err);
  if (!p)
    fail_msg("%s", err->message);
  assert_int_equal(p->cores_per_node, 2);
  test_assert_near(p->instruction_overhead, 1.5e-6, 1e-18, 0, "instruction overhead");
  test_assert_near(p->wait_core_share, 0.25, 0, 0, "wait share");
  test_assert_near(p->comm_test, 3e-6, 1e-18, 0, "comm test");
  test_assert_near(p->wake_latency, 40e-6, 1e-18, 0, "wake latency");
  const struct profile_fit *a2a = &p->fits[PROFILE_LINK_INTRA][PROFILE_COLL_ALL_TO_ALL];
  test_assert_near(a2a->latency, 4e-6, 1e-18, 0, "all-to-all latency");
  test_assert_near(a2a->bandwidth, 2e9, 0, 0, "all-to-all bandwidth");
  assert_true(p->fits[PROFILE_LINK_INTRA][PROFILE_COLL_ALL_REDUCE].bandwidth == 0);
  assert_true(p->fits[PROFILE_LINK_INTER][PROFILE_COLL_P2P].bandwidth == 0);
  /* costs: all-to-all over 4 ranks of one node, 4 MB: 3 (4 us) + 3/4 4e6 / 2e9 + the test;
   * p2p 1 MB: 1 us + 1e6 / 8e9 + the test; the all-reduce keeps the link terms (2 us,
   * 100 GB/s): 2 (p-1) 2 us + 2 (p-1)/p n / 100e9 + the test */
  uint32_t devs[4] = {0, 1, 2, 3};
  struct profile_span sp4 = profile_span_of(p, devs, 4), sp2 = profile_span_of(p, devs, 2);
  struct profile_comm_cost c = profile_comm_cost(p, IR_NODE_ALL_TO_ALL, 4000000, &sp4);
  test_assert_near(c.latency, 12e-6 + 3e-6, 1e-15, 0, "a2a latency");
  test_assert_near(c.transfer, 0.75 * 4e6 / 2e9, 1e-15, 0, "a2a transfer");
  c = profile_comm_cost(p, IR_NODE_SEND, 1000000, &sp2);
  test_assert_near(c.latency + c.transfer, 1e-6 + 1e6 / 8e9 + 3e-6, 1e-15, 0, "p2p");
  c = profile_comm_cost(p, IR_NODE_ALL_REDUCE, 4000000, &sp4);
  test_assert_near(c.latency + c.transfer, 6 * 2e-6 + 1.5 * 4e6 / 100e9 + 3e-6, 1e-15, 0,
                   "all-reduce on link terms");
  /* processor sharing: 4 computing on 2 cores run at 1/2; 3 computing and 1 waiting (a
   * quarter core) at 2 / 3.25; 2 computing and 2 waiting at 2 / 2.5; 1 computing alone at 1 */
  test_assert_near(profile_node_speed(p, 4, 0), 0.5, 0, 0, "4 on 2");
  test_assert_near(profile_node_speed(p, 3, 1), 2 / 3.25, 1e-15, 0, "3 + 1 waiting");
  test_assert_near(profile_node_speed(p, 2, 2), 2 / 2.5, 1e-15, 0, "2 + 2 waiting");
  test_assert_near(profile_node_speed(p, 1, 3), 1, 0, 0, "1 + 3 waiting");
  profile_free(p);
  /* without the section nothing is shared */
  p = profile_from(plain_profile, &err);
  assert_int_equal(p->cores_per_node, 0);
  test_assert_near(profile_node_speed(p, 8, 8), 1, 0, 0, "no host section");
  profile_free(p);
}

/* plain_profile with section added must be refused: one input error line naming test.json and
 * the key want. */
static void expect_section_rejected(size_t i, const char *section, const char *want) {
  char buf[2048];
  snprintf(buf, sizeof buf, "%.*s,%s}", (int)strlen(plain_profile) - 1, plain_profile, section);
  GError *err = NULL;
  struct profile *p = profile_from(buf, &err);
  if (p)
    fail_msg("case %zu accepted: %s", i, section);
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  if (!strstr(err->message, want) || !strstr(err->message, "test.json") ||
      strchr(err->message, '\n'))
    fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err->message, want);
  g_error_free(err);
}

/* Every bad new key is one input error naming the file and the key. */
static void test_profile_host_errors(void **state) {
  (void)state;
  static const struct {
    const char *section, *want;
  } cases[] = {
      {"\"host\":{\"instruction_overhead_us\":1}", "cores_per_node"},
      {"\"host\":{\"cores_per_node\":0}", "cores_per_node"},
      {"\"host\":{\"cores_per_node\":2.5}", "cores_per_node"},
      {"\"host\":{\"cores_per_node\":2,\"wait_core_share\":1.5}", "wait_core_share"},
      {"\"host\":{\"cores_per_node\":2,\"comm_test_us\":-1}", "comm_test_us"},
      {"\"host\":{\"cores_per_node\":2,\"wake_latency_us\":\"x\"}", "wake_latency_us"},
      {"\"host\":{\"cores_per_node\":2,\"cores\":2}", "cores"},
      {"\"host\":{\"cores_per_node\":2,\"executor\":\"threads\"}", "executor"},
      {"\"host\":{\"cores_per_node\":2,\"executor\":1}", "executor"},
      {"\"host\":[]", "host"},
      {"\"collectives\":{\"intra\":{}}", "intra"},
      {"\"collectives\":{\"intra_node\":{\"allreduce\":{}}}", "allreduce"},
      {"\"collectives\":{\"intra_node\":{\"p2p\":{\"latency_us\":1}}}", "bandwidth_gbs"},
      {"\"collectives\":{\"inter_node\":{\"p2p\":{\"latency_us\":1,\"bandwidth_gbs\":0}}}",
       "bandwidth_gbs"},
      {"\"collectives\":{\"intra_node\":{\"p2p\":{\"latency_us\":-1,\"bandwidth_gbs\":1}}}",
       "latency_us"},
      {"\"collectives\":{\"intra_node\":{\"p2p\":{\"latency_us\":1,\"bandwidth_gbs\":1,"
       "\"ranks\":2}}}",
       "ranks"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_section_rejected(i, cases[i].section, cases[i].want);
}

/* A synthetic profile (F 1 ms, communication free) with host facts. */
static struct profile *sharing_profile(const char *host) {
  char buf[512];
  snprintf(buf, sizeof buf,
           "{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":1,\"B_ms\":2,\"BI_ms\":1,"
           "\"BW_ms\":1,\"comm_ms\":0},\"host\":{%s}}",
           host);
  GError *err = NULL;
  struct profile *p = profile_from(buf, &err);
  if (!p)
    fail_msg("%s", err->message);
  return p;
}

static void test_engine_cores_shared(void **state) {
  (void)state;
  /* 4 ranks on one node of 2 cores, equal work (one F of 1 ms each): each runs at half speed,
   * so every F and the step end at 2 ms, twice the time alone */
  struct profile *pr = sharing_profile("\"cores_per_node\":2");
  struct hplan h = {.n_devices = 4, .n_streams = 1, .n = {1, 1, 1, 1}};
  for (uint32_t d = 0; d < 4; d++)
    h.ins[d][0] = (struct hi)C(0, IR_PASS_F);
  struct plan *p = hplan_build(&h);
  struct sim_result *r = run(p, pr, true);
  for (uint32_t d = 0; d < 4; d++)
    test_assert_near(iv_of(r, p, d, 0)->end, 2 * MS, TIME_TOL, 0, "4 on 2 cores: 2x");
  test_assert_near(r->iteration_time, 2 * MS, TIME_TOL, 0, "step 2x");
  sim_result_free(r);
  profile_free(pr);
  /* the same on 4 cores, or without the section: 1 ms */
  pr = sharing_profile("\"cores_per_node\":4");
  r = run(p, pr, true);
  test_assert_near(r->iteration_time, 1 * MS, TIME_TOL, 0, "4 on 4 cores");
  sim_result_free(r);
  profile_free(pr);
  plan_free(p);

  /* waiting ranks poll: devices 0-2 compute F while device 3 waits for device 0's send (a
   * quarter core each waiting): 2 / (3 + 0.25) speed, F ends at 1.625 ms; then device 3's F
   * with three waiting: 2 / (1 + 0.75) > 1, full speed, ends at 2.625 ms. The instruction
   * overhead (100 us) is compute: F is 1.1 ms of work, a send's latency 0.1 ms more. */
  pr = sharing_profile("\"cores_per_node\":2,\"wait_core_share\":0.25");
  struct hplan h2 = {.n_devices = 4, .n_streams = 1, .n = {2, 1, 1, 2}};
  h2.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h2.ins[0][1] = (struct hi){IR_NODE_SEND, 0, IR_PASS_NONE, 3, 1000, -1, 0, -1, 0};
  h2.ins[1][0] = (struct hi)C(0, IR_PASS_F);
  h2.ins[2][0] = (struct hi)C(0, IR_PASS_F);
  h2.ins[3][0] = (struct hi){IR_NODE_RECV, 0, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h2.ins[3][1] = (struct hi)C(0, IR_PASS_F);
  p = hplan_build(&h2);
  r = run(p, pr, true);
  test_assert_near(iv_of(r, p, 0, 0)->end, 3.25 / 2 * MS, TIME_TOL, 0, "3 computing + 1 polling");
  test_assert_near(iv_of(r, p, 3, 1)->end, (3.25 / 2 + 1) * MS, TIME_TOL, 0, "then alone");
  sim_result_free(r);
  profile_free(pr);
  pr = sharing_profile("\"cores_per_node\":8,\"instruction_overhead_us\":100");
  r = run(p, pr, true);
  test_assert_near(iv_of(r, p, 0, 0)->end, 1.1 * MS, TIME_TOL, 0, "overhead in F");
  test_assert_near(iv_of(r, p, 3, 0)->end, 1.2 * MS, TIME_TOL, 0, "overhead in the send");
  test_assert_near(iv_of(r, p, 3, 1)->end, 2.3 * MS, TIME_TOL, 0, "then F");
  sim_result_free(r);
  profile_free(pr);
  plan_free(p);

  /* wake-up: device 0's F (1 ms) runs beside two 2 ms Bs on 2 cores (speed 2/3): it ends at
   * 1.5 ms, when both cores are still computing, so device 3 sees the message 0.2 ms late */
  pr = sharing_profile("\"cores_per_node\":2,\"wake_latency_us\":200");
  struct hplan h3 = h2;
  h3.ins[1][0] = (struct hi)C(0, IR_PASS_B);
  h3.ins[2][0] = (struct hi)C(0, IR_PASS_B);
  p = hplan_build(&h3);
  r = run(p, pr, true);
  test_assert_near(iv_of(r, p, 0, 0)->end, 1.5 * MS, TIME_TOL, 0, "F beside two Bs");
  test_assert_near(iv_of(r, p, 3, 0)->end, 1.7 * MS, TIME_TOL, 0, "late wake-up");
  sim_result_free(r);
  /* the scheduler hands the waiter a core at the next turn of a computing rank's loop, when
   * that rank has communication in flight (Open MPI yields in a test that progresses nothing)
   * and before a slice: the Bs, with 1 ms of work left at 1.5 ms on 2 cores for 2, end at 2.5
   * ms, before the 2 ms slice, device 1 with a receive from device 2 posted; without it, and
   * nothing else in flight, a B's end yields nothing: the slice, 1.5 + 2 ms */
  struct profile *slice = sharing_profile("\"cores_per_node\":2,\"wake_latency_us\":2000");
  r = run(p, slice, true);
  test_assert_near(iv_of(r, p, 3, 0)->end, 3.5 * MS, TIME_TOL, 0, "nothing in flight: slice");
  sim_result_free(r);
  plan_free(p);
  struct hplan h5 = h3;
  h5.n_streams = 2;
  h5.n[1] = h5.n[2] = 2;
  h5.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 2, 1000, -1, 0, -1, 0};
  h5.ins[1][1] = (struct hi)C(0, IR_PASS_B);
  h5.ins[2][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 1000, 0, 0, -1, 0};
  p = hplan_build(&h5);
  r = run(p, slice, true);
  test_assert_near(iv_of(r, p, 3, 0)->end, 2.5 * MS, TIME_TOL, 0, "handed over when a B ends");
  sim_result_free(r);
  profile_free(slice);
  plan_free(p);

  /* a receiver that is computing when its message arrives sees it when its task ends (its loop
   * tests between tasks), never a wake-up later: device 3 runs a B on a second stream beside
   * its receive, so all 4 ranks compute (speed 1/2) until the F ends at 2 ms; then 3 on 2 cores
   * (speed 2/3) run the Bs' last 1 ms of work: the B, and the receive with it, end at 3.5 ms */
  struct hplan h4 = h3;
  h4.n_streams = 2;
  h4.n[3] = 2;
  h4.ins[3][1] = (struct hi)C(1, IR_PASS_B);
  p = hplan_build(&h4);
  r = run(p, pr, true);
  test_assert_near(iv_of(r, p, 0, 0)->end, 2 * MS, TIME_TOL, 0, "F beside three Bs");
  test_assert_near(iv_of(r, p, 3, 0)->end, 3.5 * MS, TIME_TOL, 0, "seen when the task ends");
  sim_result_free(r);
  profile_free(pr);
  plan_free(p);
}

/* The executor's loop sleeps between polls once its rank has been idle past loop_spin: a
 * blocked receiver then sees its message loop_late late; within the window it is on time, and
 * a sender is never late. */
static void test_engine_loop_late(void **state) {
  (void)state;
  /* device 1 waits 1 ms (device 0's F) for its receive, on 4 cores: 0.1 ms late */
  struct hplan h = {.n_devices = 2, .n_streams = 1, .n = {2, 1}};
  h.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h.ins[0][1] = (struct hi){IR_NODE_SEND, 0, IR_PASS_NONE, 1, 1000, -1, 0, -1, 0};
  h.ins[1][0] = (struct hi){IR_NODE_RECV, 0, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  struct plan *p = hplan_build(&h);
  struct profile *pr =
      sharing_profile("\"cores_per_node\":4,\"loop_spin_us\":20,\"loop_late_us\":100");
  struct sim_result *r = run(p, pr, true);
  test_assert_near(iv_of(r, p, 1, 0)->end, 1.1 * MS, TIME_TOL, 0, "waited past the spin");
  test_assert_near(iv_of(r, p, 0, 1)->end, 1 * MS, TIME_TOL, 0, "the sender is not late");
  sim_result_free(r);
  profile_free(pr);
  /* a wait within the spin window, or a profile without the key: on time */
  const char *on_time[] = {"\"cores_per_node\":4,\"loop_spin_us\":2000,\"loop_late_us\":100",
                           "\"cores_per_node\":4,\"loop_spin_us\":20"};
  for (size_t i = 0; i < 2; i++) {
    pr = sharing_profile(on_time[i]);
    r = run(p, pr, true);
    test_assert_near(iv_of(r, p, 1, 0)->end, 1 * MS, TIME_TOL, 0, "on time");
    sim_result_free(r);
    profile_free(pr);
  }
  plan_free(p);

  /* the window counts from when the rank went idle, not from the post: device 1 posts its
   * receive at 0 on one stream and computes F (1 ms) on another, then idles until device 0's
   * message at 2 ms (after its B): 1 ms idle, on time within a 1.5 ms window, late past 0.5 */
  struct hplan h2 = {.n_devices = 2, .n_streams = 2, .n = {2, 2}};
  h2.ins[0][0] = (struct hi)C(0, IR_PASS_B);
  h2.ins[0][1] = (struct hi){IR_NODE_SEND, 0, IR_PASS_NONE, 1, 1000, -1, 0, -1, 0};
  h2.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h2.ins[1][1] = (struct hi)C(0, IR_PASS_F);
  p = hplan_build(&h2);
  const char *windows[] = {"\"cores_per_node\":4,\"loop_spin_us\":1500,\"loop_late_us\":100",
                           "\"cores_per_node\":4,\"loop_spin_us\":500,\"loop_late_us\":100"};
  for (size_t i = 0; i < 2; i++) {
    pr = sharing_profile(windows[i]);
    r = run(p, pr, true);
    test_assert_near(iv_of(r, p, 1, 0)->end, (i ? 2.1 : 2.0) * MS, TIME_TOL, 0, "idle spell");
    sim_result_free(r);
    profile_free(pr);
  }
  plan_free(p);
}

/* The host loop (piper-exec's host backend) runs one task at a time, strictly in issue order;
 * what ends while it computes is seen when the task ends; a message above
 * eager_bytes completes for its sender once the receiver has polled; a collective once every
 * member has. Synthetic costs: F 1 ms, BW 1 ms, B 4 ms, communication 0, 4 cores (no sharing). */
/* The host thread (synthetic.host_ms: every instruction takes the host that long to enqueue;
 * docs/sim.md "The host thread"). */
static struct profile *host_thread_profile(double f_ms, double comm_ms, double host_ms,
                                           const char *dispatcher) {
  char buf[512];
  GError *err = NULL;
  snprintf(buf, sizeof buf,
           "{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":%g,\"B_ms\":2,\"BI_ms\":1,"
           "\"BW_ms\":1,\"comm_ms\":%g,\"host_ms\":%g}%s%s%s}",
           f_ms, comm_ms, host_ms, dispatcher ? ",\"moe\":{\"dispatcher\":\"" : "",
           dispatcher ? dispatcher : "", dispatcher ? "\"}" : "");
  struct profile *p = profile_from(buf, &err);
  if (!p)
    fail_msg("%s", err->message);
  return p;
}

static void test_engine_host_thread(void **state) {
  (void)state;
  /* host-bound: four 0.1 ms kernels, 1 ms each to enqueue (instruction 0 was enqueued before
   * the step): kernel k starts when enqueued, at k ms, so the step is 3 ms of host + 0.1 */
  struct hplan h = {.n_devices = 1, .n_streams = 1, .n = {4}};
  for (int i = 0; i < 4; i++)
    h.ins[0][i] = (struct hi)C(0, IR_PASS_F);
  struct plan *p = hplan_build(&h);
  struct profile *tiny = host_thread_profile(0.1, 0, 1, NULL);
  struct sim_result *r = run(p, tiny, false);
  test_assert_near(iv_of(r, p, 0, 2)->start, 2 * MS, TIME_TOL, 0, "enqueued at 2 ms");
  test_assert_near(r->iteration_time, 3.1 * MS, TIME_TOL, 0, "host-bound step");
  sim_result_free(r);
  profile_free(tiny);
  /* device-bound: 1 ms kernels, 0.1 ms to enqueue: the host runs ahead, the step is the
   * kernels' 4 ms as without a host thread */
  struct profile *big = host_thread_profile(1, 0, 0.1, NULL);
  r = run(p, big, false);
  test_assert_near(r->iteration_time, 4 * MS, TIME_TOL, 0, "device-bound step");
  test_assert_near(iv_of(r, p, 0, 3)->start, 3 * MS, TIME_TOL, 0, "back to back");
  sim_result_free(r);
  profile_free(big);
  plan_free(p);

  /* a sync point: F, F, the dispatch all-to-all (stream 1, after the second F) into an
   * expert F, then F; 1 ms kernels, a 0.2 ms all-to-all, 0.5 ms to enqueue each. Without
   * the sync the host is ahead: the all-to-all runs 2-2.2, the expert F 2.2-3.2, the last F
   * 3.2-4.2. Megatron's dropless dispatcher waits on the host until the all-to-all starts
   * (2 ms), so the expert F is enqueued at 2.5: the GPU idles 0.3 ms, the step ends 4.5. */
  struct hplan hs = {.n_devices = 1,
                     .n_streams = 2,
                     .n = {5},
                     .n_coll_groups = 1,
                     .coll_group = {{0}},
                     .coll_size = {1}};
  hs.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  hs.ins[0][1] = (struct hi)C(0, IR_PASS_F);
  hs.ins[0][2] = (struct hi){IR_NODE_ALL_TO_ALL, 1, IR_PASS_NONE, 0, 1000, 1, 1000, 3, 0};
  hs.ins[0][3] = (struct hi){IR_NODE_COMPUTE, 0, IR_PASS_F, 0, 0, 2, 0, -1, 0};
  hs.ins[0][4] = (struct hi)C(0, IR_PASS_F);
  p = hplan_build(&hs);
  p->nodes[p->classes[0].instrs[2].node].pass = IR_PASS_F;
  p->nodes[p->classes[0].instrs[3].node].shard_degree = 2; /* the experts */
  struct profile *sync = host_thread_profile(1, 0.2, 0.5, NULL);
  struct profile *nosync = host_thread_profile(1, 0.2, 0.5, "nosync");
  assert_true(sync->moe_dispatch_sync);
  assert_false(nosync->moe_dispatch_sync);
  r = run(p, nosync, false);
  test_assert_near(iv_of(r, p, 0, 3)->start, 2.2 * MS, TIME_TOL, 0, "no sync: expert F");
  test_assert_near(r->iteration_time, 4.2 * MS, TIME_TOL, 0, "no sync: step");
  sim_result_free(r);
  r = run(p, sync, false);
  test_assert_near(iv_of(r, p, 0, 2)->start, 2 * MS, TIME_TOL, 0, "sync: all-to-all");
  test_assert_near(iv_of(r, p, 0, 3)->start, 2.5 * MS, TIME_TOL, 0, "sync: expert F stalls");
  test_assert_near(r->iteration_time, 4.5 * MS, TIME_TOL, 0, "sync: step 0.3 ms later");
  sim_result_free(r);
  profile_free(sync);
  profile_free(nosync);
  plan_free(p);
}

static void test_engine_host_loop(void **state) {
  (void)state;
  const char *body = "{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":1,\"B_ms\":4,\"BI_ms\":1,"
                     "\"BW_ms\":1,\"comm_ms\":0}%s}";
  char buf[512];
  GError *err = NULL;
  snprintf(buf, sizeof buf, body, ",\"host\":{\"cores_per_node\":4}");
  struct profile *loop = profile_from(buf, &err);
  snprintf(buf, sizeof buf, body, ",\"host\":{\"cores_per_node\":4,\"eager_bytes\":100}");
  struct profile *rndv = profile_from(buf, &err);
  snprintf(buf, sizeof buf, body, "");
  struct profile *plain = profile_from(buf, &err);
  snprintf(buf, sizeof buf, body, ",\"host\":{\"executor\":\"enqueue\",\"cores_per_node\":4}");
  struct profile *enqueue = profile_from(buf, &err);
  assert_non_null(loop);
  assert_non_null(rndv);
  assert_non_null(plain);
  assert_non_null(enqueue);
  assert_true(loop->host_loop);
  assert_false(enqueue->host_loop);

  /* plan order: device 1's receive (after its B in issue order) is posted when the B ends, 4
   * ms, where streams alone post it at once and meet device 0's send at 1 ms */
  struct hplan h = {.n_devices = 2, .n_streams = 2, .n = {2, 2}};
  h.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 1000, 0, 0, -1, 0};
  h.ins[1][0] = (struct hi)C(0, IR_PASS_B);
  h.ins[1][1] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  struct plan *p = hplan_build(&h);
  struct sim_result *r = run(p, loop, true);
  const struct report_interval *recv = iv_of(r, p, 1, 1), *send = iv_of(r, p, 0, 1);
  test_assert_near(recv->start - recv->wait, 4 * MS, TIME_TOL, 0, "posted after the B");
  test_assert_near(send->start, 4 * MS, TIME_TOL, 0, "met then");
  test_assert_near(send->wait, 3 * MS, TIME_TOL, 0, "the send waited from its post");
  sim_result_free(r);
  r = run(p, plain, true);
  test_assert_near(iv_of(r, p, 0, 1)->start, 1 * MS, TIME_TOL, 0, "streams post at once");
  sim_result_free(r);
  plan_free(p);

  /* seen when the task ends: device 1 posts its receive, then computes B (0-4 ms); the message
   * arrives at 1 ms and the receive ends at 4. Device 0 sends at 1 ms and computes BW (1-2 ms):
   * eager, its send ends at its own next poll (2 ms); above eager_bytes, when the receiver has
   * polled (4 ms). The F after the send on its stream starts then. */
  struct hplan h2 = {.n_devices = 2, .n_streams = 2, .n = {4, 2}};
  h2.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h2.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 1000, 0, 0, -1, 0};
  h2.ins[0][2] = (struct hi)C(0, IR_PASS_BW);
  h2.ins[0][3] = (struct hi)C(1, IR_PASS_F);
  h2.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h2.ins[1][1] = (struct hi)C(0, IR_PASS_B);
  p = hplan_build(&h2);
  r = run(p, loop, true);
  test_assert_near(iv_of(r, p, 1, 0)->end, 4 * MS, TIME_TOL, 0, "receive seen after the B");
  test_assert_near(iv_of(r, p, 0, 1)->end, 2 * MS, TIME_TOL, 0, "eager send: own poll");
  test_assert_near(iv_of(r, p, 0, 3)->end, 3 * MS, TIME_TOL, 0, "then F");
  sim_result_free(r);
  r = run(p, rndv, true);
  test_assert_near(iv_of(r, p, 0, 1)->end, 4 * MS, TIME_TOL, 0, "rendezvous: receiver's poll");
  test_assert_near(iv_of(r, p, 0, 3)->end, 5 * MS, TIME_TOL, 0, "then F");
  sim_result_free(r);
  r = run(p, plain, true);
  test_assert_near(iv_of(r, p, 1, 0)->end, 1 * MS, TIME_TOL, 0, "streams: at the arrival");
  sim_result_free(r);
  plan_free(p);

  /* issue order, strictly: device 1's F waits for its receive (device 0 sends after its F,
   * at 1 ms), and its BW on a third stream, ready from the start but after the F in issue
   * order, starts only when the F has: 2 ms, where streams alone run it at once */
  struct hplan h4 = {.n_devices = 2, .n_streams = 3, .n = {2, 3}};
  h4.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h4.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 1000, 0, 0, -1, 0};
  h4.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h4.ins[1][1] = (struct hi){IR_NODE_COMPUTE, 0, IR_PASS_F, 0, 0, 0, 0, -1, 0};
  h4.ins[1][2] = (struct hi)C(2, IR_PASS_BW);
  p = hplan_build(&h4);
  r = run(p, loop, true);
  test_assert_near(iv_of(r, p, 1, 1)->start, 1 * MS, TIME_TOL, 0, "F when its input is in");
  test_assert_near(iv_of(r, p, 1, 2)->start, 2 * MS, TIME_TOL, 0, "BW after it, in order");
  sim_result_free(r);
  r = run(p, plain, true);
  test_assert_near(iv_of(r, p, 1, 2)->start, 0, TIME_TOL, 0, "streams: BW at once");
  sim_result_free(r);
  /* a host section measured on a backend whose host thread only enqueues (cuda): the
   * devices' streams run apart, as without the section */
  r = run(p, enqueue, true);
  test_assert_near(iv_of(r, p, 1, 2)->start, 0, TIME_TOL, 0, "enqueue: BW at once");
  sim_result_free(r);
  plan_free(p);

  /* a collective completes once every member has polled: both post an all-reduce, then
   * device 0 computes F (0-1 ms) and device 1 B (0-4 ms): it ends at 4 ms on both */
  struct hplan h3 = {.n_devices = 2,
                     .n_streams = 2,
                     .n = {2, 2},
                     .n_coll_groups = 1,
                     .coll_group = {{0, 1}},
                     .coll_size = {2}};
  h3.ins[0][0] = (struct hi){IR_NODE_ALL_REDUCE, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h3.ins[0][1] = (struct hi)C(0, IR_PASS_F);
  h3.ins[1][0] = (struct hi){IR_NODE_ALL_REDUCE, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  h3.ins[1][1] = (struct hi)C(0, IR_PASS_B);
  p = hplan_build(&h3);
  r = run(p, loop, true);
  for (uint32_t d = 0; d < 2; d++)
    test_assert_near(iv_of(r, p, d, 0)->end, 4 * MS, TIME_TOL, 0, "all polled");
  sim_result_free(r);
  r = run(p, plain, true);
  test_assert_near(iv_of(r, p, 0, 0)->end, 0, TIME_TOL, 0, "streams: at once");
  sim_result_free(r);
  plan_free(p);
  profile_free(loop);
  profile_free(rndv);
  profile_free(plain);
  profile_free(enqueue);
}

static void test_engine_contention(void **state) {
  (void)state;
  /* a synthetic profile with communication of 1 ms holding half the SMs */
  GError *err = NULL;
  struct profile *pr = profile_from(
      "{\"kind\":\"synthetic\",\"synthetic\":{\"F_ms\":2,\"B_ms\":2,\"BI_ms\":1,\"BW_ms\":1,"
      "\"comm_ms\":1},\"contention\":{\"comm_sm_share\":0.5}}",
      &err);
  assert_non_null(pr);
  /* device 0: F (2 ms of work) on stream 0 while an all-reduce over {0} runs on stream 1 for
   * 1 ms: the F runs at half speed for 1 ms (0.5 ms of work) then full speed: ends at 2.5 ms */
  struct hplan h = {.n_devices = 1,
                    .n_streams = 2,
                    .n = {2},
                    .n_coll_groups = 1,
                    .coll_group = {{0}},
                    .coll_size = {1}};
  h.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h.ins[0][1] = (struct hi){IR_NODE_ALL_REDUCE, 1, IR_PASS_NONE, 0, 1000, -1, 0, -1, 0};
  struct plan *p = hplan_build(&h);
  struct sim_result *r = run(p, pr, false);
  test_assert_near(iv_of(r, p, 0, 1)->end, 1 * MS, TIME_TOL, 0, "all-reduce");
  test_assert_near(iv_of(r, p, 0, 0)->end, 2.5 * MS, TIME_TOL, 0, "slowed F");
  sim_result_free(r);
  plan_free(p);
  profile_free(pr);

  /* link sharing: two sends from device 0 to device 1 at once on two streams share the link.
   * 100 MB at 100 GB/s is 1 ms alone; together each takes 2 ms (+ latency 2 us). */
  pr = profile_from(plain_profile, &err);
  assert_non_null(pr);
  struct hplan h2 = {.n_devices = 2, .n_streams = 2, .n = {2, 2}};
  h2.ins[0][0] = (struct hi){IR_NODE_SEND, 0, IR_PASS_NONE, 1, 100000000, -1, 0, -1, 0};
  h2.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 100000000, -1, 0, -1, 0};
  h2.ins[1][0] = (struct hi){IR_NODE_RECV, 0, IR_PASS_NONE, 0, 100000000, -1, 0, -1, 0};
  h2.ins[1][1] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 100000000, -1, 0, -1, 0};
  p = hplan_build(&h2);
  r = run(p, pr, false);
  test_assert_near(iv_of(r, p, 0, 0)->end, 2e-6 + 2e-3, 1e-12, 1e-9, "shared link 0");
  test_assert_near(iv_of(r, p, 0, 1)->end, 2e-6 + 2e-3, 1e-12, 1e-9, "shared link 1");
  sim_result_free(r);
  plan_free(p);
  profile_free(pr);
}

static void test_engine_memory(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  /* F0, F1 save 100 and 200 bytes read by B0, B1 (order F0 F1 B0 B1): 300 at 2 ms;
   * B0 also writes a 50-byte output nobody reads: alive while B0 runs (the memory rule
   * allocates at the producer's start, releases at the end of its last use, here B0 itself),
   * so the peak is 350 during B0. */
  struct hplan h = {.n_devices = 1, .n_streams = 1, .n = {4}};
  h.ins[0][0] = (struct hi){IR_NODE_COMPUTE, 0, IR_PASS_F, 0, 0, -1, 100, 2, 1};
  h.ins[0][1] = (struct hi){IR_NODE_COMPUTE, 0, IR_PASS_F, 0, 0, -1, 200, 3, 1};
  h.ins[0][2] = (struct hi){IR_NODE_COMPUTE, 0, IR_PASS_B, 0, 0, -1, 50, -1, 0};
  h.ins[0][3] = (struct hi)C(0, IR_PASS_B);
  struct plan *p = hplan_build(&h);
  struct sim_result *r = run(p, u, false);
  const struct sim_unit *su = &r->units[0];
  uint64_t stat = su->static_bytes[REPORT_MEM_PARAMS] + su->static_bytes[REPORT_MEM_GRADS] +
                  su->static_bytes[REPORT_MEM_OPTIMIZER];
  assert_int_equal(su->peak_bytes, stat + 350);
  assert_int_equal(su->peak_saved_activation_bytes, 300);
  assert_int_equal(su->peak_breakdown[REPORT_MEM_ACTIVATIONS], 350);
  /* timeline: ends at static only; activations at 2 ms = 300, at 4 ms (B0 done) = 200 */
  const struct report_memory_point *last = &su->memory[su->n_memory - 1];
  assert_int_equal(last->bytes[REPORT_MEM_ACTIVATIONS], 0);
  bool saw200 = false;
  for (uint32_t k = 0; k < su->n_memory; k++)
    if (fabs(su->memory[k].t - 4 * MS) < TIME_TOL)
      saw200 = su->memory[k].bytes[REPORT_MEM_ACTIVATIONS] == 200;
  assert_true(saw200);
  /* static memory of one segment of an fp32 model: 4 + 4 + 8 bytes per parameter */
  double psi = (double)p->model->segments[0].param_count;
  assert_int_equal(su->static_bytes[REPORT_MEM_PARAMS], (uint64_t)(4 * psi));
  assert_int_equal(su->static_bytes[REPORT_MEM_GRADS], (uint64_t)(4 * psi));
  assert_int_equal(su->static_bytes[REPORT_MEM_OPTIMIZER], (uint64_t)(8 * psi));
  sim_result_free(r);
  plan_free(p);
  profile_free(u);
}

/* ---- metrics from intervals --------------------------------------------------------------- */

static void test_report_stats(void **state) {
  (void)state;
  /* a one-device plan whose nodes are a compute and a send, to classify intervals */
  struct hplan h = {.n_devices = 2, .n_streams = 2, .n = {2, 1}};
  h.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 10, -1, 0, -1, 0};
  h.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 10, -1, 0, -1, 0};
  struct plan *p = hplan_build(&h);
  uint32_t nc = p->classes[0].instrs[0].node, ns = p->classes[0].instrs[1].node;
  /* compute [0,4) and [6,8); comm [3,7): overlap 1 + 1 = 2 of 4; exposed 2; bubble over the
   * window [0,10) (device 1's comm ends at 10): 1 - 6/10 */
  struct report_interval iv0[] = {{0, 4, nc, 0, 0}, {3, 7, ns, 1, 0}, {6, 8, nc, 0, 0}};
  struct report_interval iv1[] = {{9, 10, p->classes[1].instrs[0].node, 1, 0}};
  struct report_run rr = {.plan = p, .kind = "sim", .schedule = "custom"};
  report_run_init_devices(&rr);
  rr.devices[0].intervals = iv0;
  rr.devices[0].n_intervals = 3;
  rr.devices[1].intervals = iv1;
  rr.devices[1].n_intervals = 1;
  report_compute_stats(&rr);
  test_assert_near(report_iteration_time(&rr), 10, 1e-12, 0, "window");
  const struct report_device *d = &rr.devices[0];
  test_assert_near(d->compute_s, 6, 1e-12, 0, "compute");
  test_assert_near(d->comm_s, 4, 1e-12, 0, "comm");
  test_assert_near(d->exposed_comm_s, 2, 1e-12, 0, "exposed");
  test_assert_near(d->overlap_fraction, 0.5, 1e-12, 0, "overlap");
  test_assert_near(d->bubble_fraction, 0.4, 1e-12, 0, "bubble");
  test_assert_near(d->idle_s, 2, 1e-12, 0, "idle");
  test_assert_near(rr.devices[1].bubble_fraction, 1.0, 1e-12, 0, "no compute");
  test_assert_near(rr.devices[1].overlap_fraction, 0, 1e-12, 0, "no overlap");
  report_run_free_devices(&rr);
  plan_free(p);
}

/* The bubble split on the intervals of test_report_stats: device 0 computes 6 of 10 s (the
 * busiest), device 1 nothing; its 9 idle seconds hold the 6 it would have computed with device
 * 0's work (imbalance) and 3 of pipeline idle; its 1 s of communication is exposed. */
static void test_bubble_split_intervals(void **state) {
  (void)state;
  struct hplan h = {.n_devices = 2, .n_streams = 2, .n = {2, 1}};
  h.ins[0][0] = (struct hi)C(0, IR_PASS_F);
  h.ins[0][1] = (struct hi){IR_NODE_SEND, 1, IR_PASS_NONE, 1, 10, -1, 0, -1, 0};
  h.ins[1][0] = (struct hi){IR_NODE_RECV, 1, IR_PASS_NONE, 0, 10, -1, 0, -1, 0};
  struct plan *p = hplan_build(&h);
  uint32_t nc = p->classes[0].instrs[0].node, ns = p->classes[0].instrs[1].node;
  struct report_interval iv0[] = {{0, 4, nc, 0, 0}, {3, 7, ns, 1, 0}, {6, 8, nc, 0, 0}};
  struct report_interval iv1[] = {{9, 10, p->classes[1].instrs[0].node, 1, 0}};
  struct report_run rr = {.plan = p, .kind = "sim", .schedule = "custom"};
  report_run_init_devices(&rr);
  rr.devices[0].intervals = iv0;
  rr.devices[0].n_intervals = 3;
  rr.devices[1].intervals = iv1;
  rr.devices[1].n_intervals = 1;
  report_compute_stats(&rr);
  test_assert_near(rr.devices[0].imbalance_s, 0, 1e-12, 0, "busiest: no imbalance");
  test_assert_near(rr.devices[0].pipeline_idle_s, 2, 1e-12, 0, "busiest: idle is pipeline idle");
  test_assert_near(rr.devices[1].imbalance_s, 6, 1e-12, 0, "idle device: imbalance");
  test_assert_near(rr.devices[1].pipeline_idle_s, 3, 1e-12, 0, "idle device: pipeline idle");
  struct report_bubble_split s = report_bubble_split(&rr);
  /* means of (0.2, 0.3) pipeline idle, (0.2, 0.1) exposed, (0, 0.6) imbalance */
  test_assert_near(s.pipeline_idle, 0.25, 1e-12, 0, "pipeline idle mean");
  test_assert_near(s.exposed_comm, 0.15, 1e-12, 0, "exposed mean");
  test_assert_near(s.imbalance, 0.3, 1e-12, 0, "imbalance mean");
  test_assert_near(s.bubble, 0.7, 1e-12, 0, "bubble mean");
  report_run_free_devices(&rr);
  plan_free(p);
}

/* ---- end to end through the real pipeline -------------------------------------------------- */


static struct plan *compile(const char *model, const char *base, const char *schedule, uint32_t mbs,
                            int pp_regions) {
  GError *err = NULL;
  struct sched_options so = {.mbs = mbs};
  if (!sched_family_parse(schedule, &so.family))
    fail_msg("schedule %s", schedule);
  struct plan *p = compile_plan(model, base, &so, pp_regions, &err);
  if (!p)
    fail_msg("%s %s %s: %s", model, base, schedule, err->message);
  return p;
}

/* Saved-activation bytes of one micro-batch on device d: its SAVED tensors over micro-batches. */
static uint64_t saved_per_mb(const struct plan *p, uint32_t d) {
  const struct plan_class *c = plan_device_class(p, d);
  uint64_t sum = 0;
  for (uint32_t t = 0; t < c->n_tensors; t++)
    if (c->tensors[t].kind == PLAN_TENSOR_SAVED &&
        p->nodes[c->instrs[c->tensors[t].producer].node].kind == IR_NODE_COMPUTE)
      sum += c->tensors[t].bytes;
  return sum / (p->n_microbatches ? p->n_microbatches : 1);
}

static void test_textbook_gpipe_1f1b(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  const uint32_t R = 4;
  const uint32_t Ms[] = {4, 8};
  for (int k = 0; k < 2; k++) {
    uint32_t M = Ms[k];
    const char *sch[] = {"gpipe", "1f1b"};
    for (int s = 0; s < 2; s++) {
      struct plan *p =
          compile("models/tiny-dense.json", "directives/base-schedules/pp4.json", sch[s], M, 0);
      struct sim_result *r = run(p, u, true);
      char what[64];
      snprintf(what, sizeof what, "%s M=%u: (M+R-1)(F+B)", sch[s], M);
      test_assert_near(r->iteration_time, (M + R - 1) * 3 * MS, TIME_TOL, 0, what);
      /* peak activations: 1F1B rank r holds min(R-r, M) micro-batches, GPipe M */
      for (uint32_t d = 0; d < R; d++) {
        const struct sim_unit *su = &r->units[r->device_unit[d]];
        uint64_t per = saved_per_mb(p, d);
        assert_true(per > 0);
        uint32_t want = s == 0 ? M : (R - d < M ? R - d : M);
        if (su->peak_saved_activation_bytes != (uint64_t)want * per)
          fail_msg("%s M=%u rank %u: peak saved %llu = %.3f micro-batches, want %u", sch[s], M, d,
                   (unsigned long long)su->peak_saved_activation_bytes,
                   (double)su->peak_saved_activation_bytes / (double)per, want);
      }
      sim_result_free(r);
      plan_free(p);
    }
  }
  profile_free(u);
}

static void test_textbook_zb_interleaved(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  const uint32_t R = 4, M = 8;
  struct plan *p =
      compile("models/tiny-dense.json", "directives/base-schedules/pp4.json", "zerobubble", M, 0);
  struct sim_result *r = run(p, u, true);
  test_assert_near(r->iteration_time, (3 * M + R - 1) * MS, TIME_TOL, 0, "ZB-H1: 3M+R-1");
  sim_result_free(r);
  plan_free(p);
  /* interleaved 1F1B, v = 2 (8 stages on 4 ranks): 2M(F+B) + (R-1)(F+B) */
  p = compile("models/tiny-dense.json", "directives/base-schedules/pp4_interleaved.json",
              "interleaved_1f1b", M, 8);
  r = run(p, u, true);
  test_assert_near(r->iteration_time, (2 * M * 3 + (R - 1) * 3) * MS, TIME_TOL, 0, "interleaved v=2");
  sim_result_free(r);
  plan_free(p);
  profile_free(u);
}

/* Each device's pipeline idle + exposed communication + imbalance is its bubble, to rounding. */
static void assert_split_sums(const struct report_run *rr, const char *what) {
  double iter = report_iteration_time(rr);
  for (uint32_t d = 0; d < rr->n_devices; d++) {
    const struct report_device *dv = &rr->devices[d];
    assert_true(dv->pipeline_idle_s >= 0 && dv->imbalance_s >= 0);
    test_assert_near(dv->pipeline_idle_s + dv->exposed_comm_s + dv->imbalance_s,
                     dv->bubble_fraction * iter, 1e-12, 1e-9, what);
  }
}

/* 1F1B on the unit profile: every stage does the same work and communication costs nothing, so
 * the whole bubble is the textbook fill and drain (R-1)/(M+R-1) = 3/11; Llama-3-8B's last stage
 * (LM head, 128k vocabulary) on an H100 makes the other stages wait: imbalance. */
static void test_bubble_split_textbook(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  struct plan *p =
      compile("models/tiny-dense.json", "directives/base-schedules/pp4.json", "1f1b", 8, 0);
  struct sim_result *r = run(p, u, true);
  struct report_run rr = {.plan = p, .kind = "sim", .n_iterations = 1,
                          .iteration_times = &r->iteration_time};
  report_run_init_devices(&rr);
  sim_fill_report(r, &rr);
  report_compute_stats(&rr);
  for (uint32_t d = 0; d < rr.n_devices; d++) {
    test_assert_near(rr.devices[d].bubble_fraction, 3.0 / 11, 1e-9, 0, "1F1B bubble");
    test_assert_near(rr.devices[d].pipeline_idle_s, 9 * MS, TIME_TOL, 0, "pipeline idle");
    assert_true(rr.devices[d].exposed_comm_s == 0);
    test_assert_near(rr.devices[d].imbalance_s, 0, TIME_TOL, 0, "no imbalance");
  }
  assert_split_sums(&rr, "unit 1F1B split");
  report_run_free_devices(&rr);
  sim_result_free(r);
  plan_free(p);
  profile_free(u);

  struct profile *h100 = load_profile("profiles/h100-sxm.json");
  p = compile("models/llama3-8b.json", "directives/base-schedules/pp8.json", "1f1b", 16, 8);
  r = run(p, h100, true);
  rr = (struct report_run){.plan = p, .kind = "sim", .n_iterations = 1,
                           .iteration_times = &r->iteration_time};
  report_run_init_devices(&rr);
  sim_fill_report(r, &rr);
  report_compute_stats(&rr);
  assert_split_sums(&rr, "llama3-8b split");
  const struct report_device *last = &rr.devices[rr.n_devices - 1], *mid = &rr.devices[3];
  /* the LM-head stage is the busiest: no imbalance there, a lot on a middle stage */
  assert_true(last->compute_s > mid->compute_s);
  test_assert_near(last->imbalance_s, 0, TIME_TOL, 0, "LM-head stage");
  test_assert_near(mid->imbalance_s, last->compute_s - mid->compute_s, TIME_TOL, 1e-9,
                   "middle stage waits for the LM head's extra work");
  struct report_bubble_split s = report_bubble_split(&rr);
  assert_true(s.imbalance > 0.05);
  test_assert_near(s.pipeline_idle + s.exposed_comm + s.imbalance, s.bubble, 1e-12, 1e-9, "sum");
  report_run_free_devices(&rr);
  sim_result_free(r);
  plan_free(p);
  profile_free(h100);
}

/* DualPipe runs each stage on two devices (one per model copy): pipeline and data-parallel
 * ranks still come out as the placement says (2 x 2), so throughput counts each token once. */
static void test_ranks_with_model_copies(void **state) {
  (void)state;
  struct plan *p = compile("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json",
                           "dualpipe", 4, 0);
  struct report_run rr = {.plan = p, .kind = "sim", .schedule = "dualpipe"};
  report_run_init_devices(&rr);
  assert_int_equal(rr.pp, 2);
  assert_int_equal(rr.dp, 2);
  int32_t want_pp[4] = {0, 0, 1, 1}, want_dp[4] = {0, 1, 0, 1};
  for (uint32_t d = 0; d < 4; d++) {
    assert_int_equal(rr.devices[d].pp_rank, want_pp[d]);
    assert_int_equal(rr.devices[d].dp_rank, want_dp[d]);
  }
  report_run_free_devices(&rr);
  plan_free(p);
}

static void test_textbook_dualpipev(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  const uint32_t R = 4, M = 8, PP = 2 * R;
  struct plan *p = compile("models/tiny-dense.json", "directives/base-schedules/pp4_v.json",
                           "dualpipev", M, (int)PP);
  struct sim_result *r = run(p, u, true);
  /* per-rank work: two stages, M micro-batches, F + B = 3 ms each; bubble at most
   * (PP/2 - 1)(F&B + B - 3W) with F&B = F + B = 3, B = 2, W = 1 */
  double work = 2.0 * M * 3 * MS, bound = work + (PP / 2 - 1) * (3 + 2 - 3) * MS;
  if (r->iteration_time < work - TIME_TOL || r->iteration_time > bound + TIME_TOL)
    fail_msg("DualPipeV: %.6g ms, want within [%.6g, %.6g] ms", r->iteration_time * 1e3, work * 1e3,
             bound * 1e3);
  /* peak activations: at most PP + 1 chunks (a chunk: one stage's saved activations of one
   * micro-batch; the larger of the rank's two stages bounds both) */
  for (uint32_t d = 0; d < R; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    uint64_t chunk[64] = {0};
    for (uint32_t t = 0; t < c->n_tensors; t++) {
      const struct ir_node *n = &p->nodes[c->instrs[c->tensors[t].producer].node];
      if (c->tensors[t].kind == PLAN_TENSOR_SAVED && n->kind == IR_NODE_COMPUTE &&
          n->tags[MODEL_TAG_PP] >= 0 && n->tags[MODEL_TAG_PP] < 64)
        chunk[n->tags[MODEL_TAG_PP]] += c->tensors[t].bytes;
    }
    uint64_t biggest = 0;
    for (int s = 0; s < 64; s++)
      if (chunk[s] / M > biggest)
        biggest = chunk[s] / M;
    const struct sim_unit *su = &r->units[r->device_unit[d]];
    if (su->peak_saved_activation_bytes > (PP + 1) * biggest)
      fail_msg("DualPipeV rank %u: peak saved %.2f chunks, want at most %u", d,
               (double)su->peak_saved_activation_bytes / (double)biggest, PP + 1);
  }
  sim_result_free(r);
  plan_free(p);
  profile_free(u);
}

/* base with "stream": "pp_stream" on every place, written to dir; the caller frees the path. */
static char *named_stream_program(const char *base, const char *dir) {
  char *text = test_read_file(base);
  cJSON *root = cJSON_Parse(text);
  g_free(text);
  assert_non_null(root);
  for (cJSON *d = root->child; d; d = d->next) {
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(d, "op");
    if (cJSON_IsString(op) && strcmp(op->valuestring, "place") == 0)
      cJSON_AddStringToObject(d, "stream", "pp_stream");
  }
  char *out = cJSON_Print(root);
  cJSON_Delete(root);
  char *path = g_build_filename(dir, "named.json", NULL);
  test_write_file(path, out);
  cJSON_free(out);
  return path;
}

/* What piper-sim compiles for a synthetic profile (lowering orders shared streams by
 * textbook units). */
static struct plan *compile_unit(const char *base, const char *schedule, uint32_t mbs, int pp) {
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.directives_path = base;
  o.pp_regions = pp;
  o.have_schedule = true;
  o.schedule.mbs = mbs;
  o.cost_model = IR_COST_UNIT;
  if (!sched_family_parse(schedule, &o.schedule.family))
    fail_msg("schedule %s", schedule);
  struct compile_result r = test_compile(&o);
  struct plan *p = r.plan;
  r.plan = NULL;
  compile_result_free(&r);
  return p;
}

/* Issue 14: one named stream for all pipeline traffic gives the length of the default streams
 * (one per direction), the textbook value, for every schedule family; its sends and receives
 * go in groups. */
static void test_named_stream_textbook(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  char *dir = test_tmp_dir("test_sim-XXXXXX");
  const struct {
    const char *base, *schedule;
    uint32_t mbs;
    int pp;
    double ms;
  } cases[] = {
      {"directives/base-schedules/pp4.json", "1f1b", 8, 0, 33},
      {"directives/base-schedules/pp8.json", "1f1b", 16, 8, 69},
      {"directives/base-schedules/pp8.json", "zerobubble", 16, 8, 55},
      {"directives/base-schedules/pp4_interleaved.json", "interleaved_1f1b", 8, 8, 57},
      {"directives/base-schedules/pp4_v.json", "dualpipev", 10, 8, 63},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    char *named = named_stream_program(cases[k].base, dir);
    struct plan *pd = compile_unit(cases[k].base, cases[k].schedule, cases[k].mbs, cases[k].pp);
    struct plan *pn = compile_unit(named, cases[k].schedule, cases[k].mbs, cases[k].pp);
    struct sim_result *rd = run(pd, u, true), *rn = run(pn, u, true);
    char what[96];
    snprintf(what, sizeof what, "%s %u mbs, default streams", cases[k].schedule, cases[k].mbs);
    test_assert_near(rd->iteration_time, cases[k].ms * MS, TIME_TOL, 0, what);
    snprintf(what, sizeof what, "%s %u mbs, one named stream", cases[k].schedule, cases[k].mbs);
    test_assert_near(rn->iteration_time, cases[k].ms * MS, TIME_TOL, 0, what);
    uint32_t grouped = 0, grouped_default = 0;
    for (uint32_t c = 0; c < pn->n_classes; c++)
      for (uint32_t i = 0; i < pn->classes[c].n_instrs; i++)
        grouped += pn->classes[c].instrs[i].group_parts > 0;
    for (uint32_t c = 0; c < pd->n_classes; c++)
      for (uint32_t i = 0; i < pd->classes[c].n_instrs; i++)
        grouped_default += pd->classes[c].instrs[i].group_parts > 0;
    if (grouped == 0 || grouped_default != 0)
      fail_msg("%s: %u grouped parts with one named stream (want some), %u with default streams "
               "(want none)",
               cases[k].schedule, grouped, grouped_default);
    sim_result_free(rd);
    sim_result_free(rn);
    plan_free(pd);
    plan_free(pn);
    g_free(named);
  }
  test_remove_tree(dir);
  g_free(dir);
  profile_free(u);
}

/* Collapsing devices into units changes nothing: same times, same peaks. */
static void test_collapse_exact(void **state) {
  (void)state;
  struct profile *pr = load_profile("profiles/h100-sxm.json");
  struct plan *p =
      compile("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json", "1f1b", 4, 0);
  struct sim_result *a = run(p, pr, true), *b = run(p, pr, false);
  assert_true(a->n_units < b->n_units);
  assert_int_equal(a->device_instructions, b->device_instructions);
  assert_true(a->iteration_time == b->iteration_time);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct sim_unit *ua = &a->units[a->device_unit[d]], *ub = &b->units[b->device_unit[d]];
    assert_int_equal(ua->peak_bytes, ub->peak_bytes);
    assert_int_equal(ua->n_intervals, ub->n_intervals);
    for (uint32_t k = 0; k < ua->n_intervals; k++) {
      assert_true(ua->intervals[k].start == ub->intervals[k].start);
      assert_true(ua->intervals[k].end == ub->intervals[k].end);
    }
  }
  assert_true(a->iteration_time > 0);
  assert_true(a->fallback_ops > 0);
  sim_result_free(a);
  sim_result_free(b);
  plan_free(p);
  profile_free(pr);
}

/* Past the timeline limit every device keeps its peak but only each class's first member (the
 * devices the outputs show: dp rank 0 of each pp rank) keeps its memory timeline, and the kept
 * timelines are the ones a run without the limit records. pp=2,dp=40: 80 devices, 2 classes. */
static void test_memory_timeline_limit(void **state) {
  (void)state;
  GError *err = NULL;
  struct layout l;
  assert_true(layout_parse("pp=2,dp=40", &l, &err));
  char *json = layout_to_json(&l);
  char *dir = test_tmp_dir("piper-tl-XXXXXX");
  char *path = g_build_filename(dir, "layout.json", NULL);
  test_write_file(path, json);
  struct profile *pr = load_profile("profiles/h100-sxm.json");
  struct plan *p = compile("models/tiny-dense.json", path, "1f1b", 4, 2);
  struct sim_options all = {.collapse = false}, lim = {.collapse = false, .memory_timeline_limit = 1};
  struct sim_result *a = sim_run(p, pr, &all, &err), *b = sim_run(p, pr, &lim, &err);
  assert_non_null(a);
  assert_non_null(b);
  assert_true(a->iteration_time == b->iteration_time);
  uint32_t kept = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct sim_unit *ua = &a->units[a->device_unit[d]], *ub = &b->units[b->device_unit[d]];
    const struct plan_class *c = &p->classes[p->device_class[d]];
    assert_int_equal(ua->peak_bytes, ub->peak_bytes);
    assert_true(ua->n_memory > 0);
    if (d != c->devices[0]) {
      assert_int_equal(ub->n_memory, 0);
      continue;
    }
    kept++;
    assert_int_equal(ua->n_memory, ub->n_memory);
    assert_memory_equal(ua->memory, ub->memory, ua->n_memory * sizeof *ua->memory);
  }
  assert_int_equal(kept, p->n_classes);
  sim_result_free(a);
  sim_result_free(b);
  plan_free(p);
  profile_free(pr);
  test_remove_tree(dir);
  g_free(path);
  g_free(dir);
  g_free(json);
}

/* Static memory against the ZeRO formulas, through the real pipeline. */
static void test_static_memory_zero(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  char dir[] = "/tmp/test_sim_XXXXXX";
  assert_non_null(g_mkdtemp(dir));
  /* v is the ZeRO level: none, ZeRO-1, ZeRO-2, ZeRO-3 */
  const char *variants[] = {"", ", \"shard_optimizer\": true", ", \"shard_grads\": true",
                            ", \"shard_params\": true"};
  struct model *m = test_load_model("models/tiny-moe.json", 0);
  for (int v = 0; v < 4; v++) {
    char path[256], text[512];
    snprintf(path, sizeof path, "%s/dp2_%d.json", dir, v);
    snprintf(text, sizeof text,
             "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
             "{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1]%s}]",
             variants[v]);
    test_write_file(path, text);
    GError *err = NULL;
    struct plan *p = compile_plan("models/tiny-moe.json", path, NULL, 0, &err);
    if (!p)
      fail_msg("%s: %s", path, err->message);
    struct sim_result *r = run(p, u, false);
    /* every segment whole on each device (no shard directive): psi = the model's parameters */
    double psi = (double)model_param_count(m), N = 2;
    double pb = m->dtype == MODEL_DTYPE_BF16 ? 2 : 4, gb = pb,
           ob = m->dtype == MODEL_DTYPE_BF16 ? 12 : 8;
    double want_p = v == 3 ? pb * psi / N : pb * psi;
    double want_g = v <= 1 ? gb * psi : gb * psi / N;
    double want_o = v == 0 ? ob * psi : ob * psi / N;
    if (v == 1 && m->dtype == MODEL_DTYPE_FP32) {
      /* by hand: tiny-moe has psi = 281,152 parameters (fp32); ZeRO-1 over 2 devices keeps
       * 4 psi of parameters and 4 psi of gradients, and 8 psi / 2 of Adam moments */
      assert_int_equal(psi, 281152);
      assert_int_equal(r->units[r->device_unit[0]].static_bytes[REPORT_MEM_OPTIMIZER], 1124608);
      assert_int_equal(r->units[r->device_unit[0]].static_bytes[REPORT_MEM_GRADS], 1124608);
    }
    for (uint32_t d = 0; d < 2; d++) {
      const struct sim_unit *su = &r->units[r->device_unit[d]];
      test_assert_near((double)su->static_bytes[REPORT_MEM_PARAMS], want_p, 1, 0, "params");
      test_assert_near((double)su->static_bytes[REPORT_MEM_GRADS], want_g, 1, 0, "grads");
      test_assert_near((double)su->static_bytes[REPORT_MEM_OPTIMIZER], want_o, 1, 0, "optimizer");
    }
    /* for bf16 the totals are the paper's 16 psi, 2 psi + 14 psi / N, 16 psi / N */
    if (m->dtype == MODEL_DTYPE_BF16) {
      const struct sim_unit *su = &r->units[0];
      double tot = (double)(su->static_bytes[0] + su->static_bytes[1] + su->static_bytes[2]);
      double want = v == 0   ? 16 * psi
                    : v == 1 ? 4 * psi + 12 * psi / N
                    : v == 2 ? 2 * psi + 14 * psi / N
                             : 16 * psi / N;
      test_assert_near(tot, want, 3, 0, "ZeRO total");
    }
    sim_result_free(r);
    plan_free(p);
    remove(path);
  }
  model_free(m);
  rmdir(dir);
  profile_free(u);
}

/* ZeRO with expert parallelism: only the bucketed (dense) parameters are sharded over the
 * replicas; each device keeps its local experts whole (they own distinct parameters, nothing
 * to shard), exactly as the executor allocates them. By hand for tiny-moe (fp32) on stage 0
 * of pp2_dp2_ep2: dense D = 42,240 parameters in one bucket (even over 2, no padding), experts
 * E = 98,304 of which 49,152 local. ZeRO-2: params 4 (D + E/2) = 365,568 B, grads
 * 4 (D/2 + E/2) = 281,088 B, Adam 8 (D/2 + E/2) = 562,176 B. */
static void test_static_memory_zero_experts(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  struct plan *p = compile("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2_zero2.json",
                           "1f1b", 4, 0);
  const struct model *m = p->model;
  double D = 0, E = 0;
  for (uint32_t s = 0; s < m->n_segments; s++)
    if (m->segments[s].tags[MODEL_TAG_PP] == 0)
      *(m->segments[s].expert ? &E : &D) += (double)m->segments[s].param_count;
  assert_true(D == 42240 && E == 98304);
  struct sim_result *r = run(p, u, false);
  const struct sim_unit *su = &r->units[r->device_unit[0]];
  assert_int_equal(su->static_bytes[REPORT_MEM_PARAMS], 4 * (D + E / 2));
  assert_int_equal(su->static_bytes[REPORT_MEM_GRADS], 4 * (D / 2 + E / 2));
  assert_int_equal(su->static_bytes[REPORT_MEM_OPTIMIZER], 8 * (D / 2 + E / 2));
  assert_int_equal(su->static_bytes[REPORT_MEM_PARAMS], 365568);
  assert_int_equal(su->static_bytes[REPORT_MEM_GRADS], 281088);
  assert_int_equal(su->static_bytes[REPORT_MEM_OPTIMIZER], 562176);
  sim_result_free(r);
  plan_free(p);
  profile_free(u);
}

/* The profile's memory section: every bad key one input error naming the file and the key. */
static void test_profile_memory_errors(void **state) {
  (void)state;
  static const struct {
    const char *section, *want;
  } cases[] = {
      {"\"memory\":{\"activation_bytes_per_element\":0}", "activation_bytes_per_element"},
      {"\"memory\":{\"activation_bytes_per_element\":2.5}", "activation_bytes_per_element"},
      {"\"memory\":{\"activation_bytes_per_element\":17}", "activation_bytes_per_element"},
      {"\"memory\":{\"param_bytes_per_param\":-1}", "param_bytes_per_param"},
      {"\"memory\":{\"grad_bytes_per_param\":\"4\"}", "grad_bytes_per_param"},
      {"\"memory\":{\"optimizer_state_bytes_per_param\":65}", "optimizer_state_bytes_per_param"},
      {"\"memory\":{\"compute_copy_bytes_per_param\":-2}", "compute_copy_bytes_per_param"},
      {"\"memory\":{\"optimizer_bytes_per_param\":8}", "optimizer_bytes_per_param"},
      {"\"memory\":[]", "memory"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_section_rejected(i, cases[i].section, cases[i].want);
}

/* A profile's memory section: the executor's fp32 rates for a bf16 model. By hand for
 * tiny-dense-bf16 on one device: psi = 328,768 parameters (8 layers of 36,992: attention
 * 12,288, MLP 24,576, two norms of 64; embedding and head 16,384 each, final norm 64), of
 * which GEMM weights 8 x (12,288 + 24,576) + 16,384 = 311,296. Params 4 psi + 2 x 311,296
 * (the compute copies), grads 4 psi, optimizer 8 psi; the plan's tensors at 4 bytes per
 * element where it counts 2, so the activations at the peak double. Without the section:
 * 2 / 2 / 12 psi and the plan's bytes; an fp32 model is unchanged by the section. */
static void test_static_memory_held(void **state) {
  (void)state;
  char buf[2048];
  snprintf(buf, sizeof buf, "%.*s,%s}", (int)strlen(plain_profile) - 1, plain_profile,
           "\"memory\":{\"activation_bytes_per_element\":4,\"param_bytes_per_param\":4,"
           "\"grad_bytes_per_param\":4,\"optimizer_state_bytes_per_param\":8,"
           "\"compute_copy_bytes_per_param\":2}");
  GError *err = NULL;
  struct profile *held = profile_from(buf, &err);
  if (!held)
    fail_msg("%s", err->message);
  struct profile *plain = profile_from(plain_profile, &err);
  assert_non_null(plain);
  char dir[] = "/tmp/test_sim_XXXXXX", one[300];
  assert_non_null(g_mkdtemp(dir));
  snprintf(one, sizeof one, "%s/one.json", dir);
  test_write_file(one, "[{\"op\":\"place\",\"filter\":{},\"devices\":[0]}]");
  struct plan *p = compile("models/tiny-dense-bf16.json", one, "gpipe", 4, 1);
  double psi = 328768, gemm = 311296;
  assert_int_equal(model_param_count(p->model), psi);
  uint64_t mem[REPORT_MEM_KIND_COUNT];
  sim_static_memory_held(p, plan_device_class(p, 0), held, mem);
  assert_int_equal(mem[REPORT_MEM_PARAMS], 4 * psi + 2 * gemm);
  assert_int_equal(mem[REPORT_MEM_GRADS], 4 * psi);
  assert_int_equal(mem[REPORT_MEM_OPTIMIZER], 8 * psi);
  sim_static_memory_held(p, plan_device_class(p, 0), plain, mem);
  assert_int_equal(mem[REPORT_MEM_PARAMS], 2 * psi);
  assert_int_equal(mem[REPORT_MEM_GRADS], 2 * psi);
  assert_int_equal(mem[REPORT_MEM_OPTIMIZER], 12 * psi);
  struct sim_result *rh = run(p, held, false), *rp = run(p, plain, false);
  const struct sim_unit *uh = &rh->units[0], *up = &rp->units[0];
  assert_true(up->peak_breakdown[REPORT_MEM_ACTIVATIONS] > 0);
  assert_int_equal(uh->peak_breakdown[REPORT_MEM_ACTIVATIONS],
                   2 * up->peak_breakdown[REPORT_MEM_ACTIVATIONS]);
  assert_int_equal(uh->peak_bytes, 16 * psi + 2 * gemm + uh->peak_breakdown[REPORT_MEM_ACTIVATIONS]);
  sim_result_free(rh);
  sim_result_free(rp);
  plan_free(p);
  /* fp32: the executor's rates are the fp32 rule, and no compute copy */
  p = compile("models/tiny-dense.json", one, "gpipe", 4, 1);
  remove(one);
  rmdir(dir);
  rh = run(p, held, false);
  rp = run(p, plain, false);
  assert_int_equal(rh->units[0].peak_bytes, rp->units[0].peak_bytes);
  assert_memory_equal(rh->units[0].peak_breakdown, rp->units[0].peak_breakdown,
                      sizeof rh->units[0].peak_breakdown);
  sim_result_free(rh);
  sim_result_free(rp);
  plan_free(p);
  profile_free(held);
  profile_free(plain);
}

/* ---- report files and charts ---------------------------------------------------------------- */

static void test_report_files(void **state) {
  (void)state;
  struct profile *pr = load_profile("profiles/h100-sxm.json");
  struct plan *p =
      compile("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json", "1f1b", 4, 0);
  struct sim_result *r = run(p, pr, true);
  struct report_run rr = {.plan = p,
                          .kind = "sim",
                          .schedule = "1f1b",
                          .program_file = "1f1b_pp2_mbs4.json",
                          .n_iterations = 1,
                          .iteration_times = &r->iteration_time,
                          .peak_flops_per_device = pr->peak_flops[p->model->dtype]};
  report_run_init_devices(&rr);
  assert_int_equal(rr.pp, 2);
  assert_int_equal(rr.dp, 2);
  sim_fill_report(r, &rr);
  report_compute_stats(&rr);
  char dir[] = "/tmp/test_sim_XXXXXX";
  assert_non_null(g_mkdtemp(dir));
  GError *err = NULL;
  if (!report_write_dir(&rr, dir, &err))
    fail_msg("%s", err->message);
  char path[512];

  /* results.csv (docs/design.md, "Outputs and exit statuses"): one row per dp rank */
  snprintf(path, sizeof path, "%s/results.csv", dir);
  char *csv = test_read_file(path);
  const char *header = "dp_rank,model,schedule,pp,dp,batch_size,num_microbatches,seq_len,"
                       "samples,iter_time_mean_s,iter_time_std_s,throughput_tokens_per_s,"
                       "peak_memory_pp0_gb,peak_memory_pp1_gb,bubble_fraction,"
                       "pipeline_idle_fraction,exposed_comm_fraction,imbalance_fraction\n";
  assert_memory_equal(csv, header, strlen(header));
  int lines = 0;
  for (char *c = csv; *c; c++)
    lines += *c == '\n';
  assert_int_equal(lines, 3);
  g_free(csv);

  /* metrics.json: the required keys */
  snprintf(path, sizeof path, "%s/metrics.json", dir);
  cJSON *mj = json_parse_file(path, &err);
  assert_non_null(mj);
  const char *keys[] = {"iteration_time_s", "throughput_tokens_per_s", "mfu", "devices"};
  for (int k = 0; k < 4; k++)
    assert_non_null(cJSON_GetObjectItem(mj, keys[k]));
  assert_true(cJSON_IsNumber(cJSON_GetObjectItem(mj, "mfu")));
  cJSON *devs = cJSON_GetObjectItem(mj, "devices");
  assert_int_equal(cJSON_GetArraySize(devs), 4);
  const char *dkeys[] = {
      "device",         "pp_rank",          "dp_rank",           "bubble_fraction",
      "exposed_comm_s", "overlap_fraction", "peak_memory_bytes", "memory_breakdown_bytes"};
  cJSON *dv;
  cJSON_ArrayForEach(dv, devs) {
    for (int k = 0; k < 8; k++)
      if (!cJSON_GetObjectItem(dv, dkeys[k]))
        fail_msg("device lacks %s", dkeys[k]);
    cJSON *b = cJSON_GetObjectItem(dv, "memory_breakdown_bytes");
    const char *bk[] = {"params", "grads", "optimizer", "activations", "comm"};
    double sum = 0;
    for (int k = 0; k < 5; k++) {
      assert_non_null(cJSON_GetObjectItem(b, bk[k]));
      sum += cJSON_GetObjectItem(b, bk[k])->valuedouble;
    }
    sum += cJSON_GetObjectItem(b, "gathered_params")->valuedouble;
    test_assert_near(sum, cJSON_GetObjectItem(dv, "peak_memory_bytes")->valuedouble, 0.5, 0,
                "breakdown sums to the peak");
  }
  cJSON_Delete(mj);

  /* trace.json: Chrome trace schema */
  snprintf(path, sizeof path, "%s/trace.json", dir);
  cJSON *tj = json_parse_file(path, &err);
  if (!tj)
    fail_msg("%s", err->message);
  cJSON *evs = cJSON_GetObjectItem(tj, "traceEvents");
  assert_true(cJSON_IsArray(evs));
  int nx = 0, nc = 0, nproc = 0, nthread = 0;
  cJSON *e;
  cJSON_ArrayForEach(e, evs) {
    const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
    assert_non_null(ph);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "name")));
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(e, "pid")));
    if (strcmp(ph, "X") == 0) {
      nx++;
      assert_true(cJSON_IsNumber(cJSON_GetObjectItem(e, "tid")));
      assert_true(cJSON_GetObjectItem(e, "ts")->valuedouble >= 0);
      assert_true(cJSON_GetObjectItem(e, "dur")->valuedouble >= 0);
      assert_true(cJSON_IsObject(cJSON_GetObjectItem(e, "args")));
    } else if (strcmp(ph, "C") == 0) {
      nc++;
      cJSON *a = cJSON_GetObjectItem(e, "args"), *v;
      assert_true(cJSON_IsObject(a));
      cJSON_ArrayForEach(v, a) assert_true(cJSON_IsNumber(v));
    } else if (strcmp(ph, "M") == 0) {
      const char *n = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
      nproc += strcmp(n, "process_name") == 0;
      nthread += strcmp(n, "thread_name") == 0;
      if (strcmp(n, "process_sort_index") != 0)
        assert_non_null(
            cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "name")));
    } else {
      fail_msg("unexpected phase %s", ph);
    }
  }
  assert_int_equal(nx, (int)r->device_instructions);
  assert_true(nc > 0);
  assert_int_equal(nproc, 4);
  assert_true(nthread >= 4);
  cJSON_Delete(tj);

  /* schedule charts: PNG, SVG and PDF files with their signatures */
  const char *ext[] = {"png", "svg", "pdf"};
  const char *sig[] = {"\x89PNG", "<?xml", "%PDF"};
  for (int k = 0; k < 3; k++) {
    snprintf(path, sizeof path, "%s/schedule.%s", dir, ext[k]);
    if (!chart_schedule(&rr, path, (enum chart_format)k, &err))
      fail_msg("%s", err->message);
    char *data = test_read_file(path);
    assert_memory_equal(data, sig[k], strlen(sig[k]));
    g_free(data);
  }
  { /* gnuplot is a dependency (tools/install-deps.sh): the chart must come out */
    if (!chart_memory(&rr, dir, &err))
      fail_msg("%s", err->message);
    snprintf(path, sizeof path, "%s/memory.png", dir);
    char *data = test_read_file(path);
    assert_memory_equal(data, "\x89PNG", 4);
    g_free(data);
  }
  char *cmd = g_strdup_printf("rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  g_free(cmd);
  report_run_free_devices(&rr);
  sim_result_free(r);
  plan_free(p);
  profile_free(pr);
}

static void test_sweep(void **state) {
  (void)state;
  char dir[] = "/tmp/test_sim_XXXXXX";
  assert_non_null(g_mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/sweep.json", dir);
  test_write_file(path, "{\"model\":\"models/tiny-dense.json\","
                   "\"base_schedules\":[\"directives/base-schedules/pp4.json\"],"
                   "\"schedules\":[\"gpipe\",\"1f1b\",\"dualpipev\"],\"microbatches\":[4,8],"
                   "\"profiles\":[\"profiles/unit.json\"],\"memory_cap_gib\":0.0024}");
  GError *err = NULL;
  struct sweep *s = sweep_load_file(path, &err);
  if (!s)
    fail_msg("%s", err->message);
  char out[300];
  snprintf(out, sizeof out, "%s/out", dir);
  bool ok = sweep_run(s, out, false, &err);
  if (!ok && !(err && strstr(err->message, "gnuplot")))
    fail_msg("%s", err->message);
  assert_int_equal(s->n_points, 6);
  /* ranked: feasible by throughput, then over the cap by peak memory (the closest first), then
   * errors (dualpipev on a 4-stage layout is refused by its builder) */
  int cls_prev = 0;
  for (uint32_t i = 0; i < s->n_points; i++) {
    const struct sweep_point *pt = &s->points[i];
    int cls = pt->feasible ? 0 : pt->ok ? 1 : 2;
    assert_true(cls >= cls_prev);
    if (i > 0 && cls == cls_prev && cls == 0)
      assert_true(pt->throughput_tokens_per_s <= s->points[i - 1].throughput_tokens_per_s);
    if (i > 0 && cls == cls_prev && cls == 1)
      assert_true(pt->peak_memory_bytes >= s->points[i - 1].peak_memory_bytes);
    cls_prev = cls;
    if (strcmp(pt->schedule, "dualpipev") == 0) {
      assert_false(pt->ok);
      assert_non_null(pt->error);
    }
  }
  assert_true(s->points[0].ok);
  sweep_free(s);
  /* bad sweep files name the file and key */
  test_write_file(path, "{\"model\":\"m.json\",\"base_schedules\":[\"b.json\"],\"schedules\":[\"nope\"],"
                   "\"microbatches\":[4],\"profiles\":[\"p.json\"]}");
  assert_null(sweep_load_file(path, &err));
  assert_non_null(strstr(err->message, "schedules"));
  g_clear_error(&err);
  test_write_file(path, "{\"model\":\"m.json\",\"base_schedules\":[\"b.json\"],\"schedules\":[\"1f1b\"],"
                   "\"microbatches\":[0],\"profiles\":[\"p.json\"]}");
  assert_null(sweep_load_file(path, &err));
  assert_non_null(strstr(err->message, "microbatches"));
  g_clear_error(&err);
  char *cmd = g_strdup_printf("rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  g_free(cmd);
}

/* ---- what-if scenarios -------------------------------------------------------------------- */

static struct sim_scenario *scenario_of(const char *text, const struct plan *p, GError **err) {
  cJSON *root = cJSON_Parse(text);
  if (!root)
    fail_msg("bad JSON in test: %s", text);
  struct sim_scenario *sc = sim_scenario_from_json(root, "s.json", p, err);
  cJSON_Delete(root);
  return sc;
}

static double scenario_step(const struct plan *p, const struct profile *prof, const char *text,
                            bool collapse) {
  GError *err = NULL;
  struct sim_scenario *sc = scenario_of(text, p, &err);
  if (!sc)
    fail_msg("%s: %s", text, err->message);
  struct sim_options o = {.collapse = collapse, .scenario = sc, .critical_path = true};
  struct sim_result *r = sim_run(p, prof, &o, &err);
  if (!r)
    fail_msg("sim_run: %s", err->message);
  double t = r->iteration_time;
  assert_true(r->n_path > 0);
  sim_result_free(r);
  sim_scenario_free(sc);
  return t;
}

/* One slow stage in 1F1B, unit costs (F = 1, B = 2, communication free), R stages, M >= R
 * micro-batches, stage r's compute slowed by s >= 1; W = R - 1 - r stages after it.
 *  - Fill: micro-batch 0's forward reaches stage r after r F = r.
 *  - Stage r then runs M forwards and M backwards, 3 s M, idle only twice:
 *    before its first backward it has W more forwards to run (W s; 1F1B's warm-up) while the
 *    gradient of micro-batch 0 comes back through the W faster stages after W (F + B) = 3W
 *    (each of them waits for that gradient, not for the slow forwards, while s <= 3): idle
 *    W max(0, 3 - s);
 *    after its last forward it has W backwards to run (2 s W) against the same round trip:
 *    idle W max(0, 3 - 2s);
 *    in between, from F(m) to B(m) it runs W forwards and W backwards, 3 s W >= 3W: no idle.
 *  - Drain: its last backward goes back through stages r - 1 .. 0, r B = 2r.
 * T = 3r + 3sM + W max(0, 3 - s) + W max(0, 3 - 2s); s = 1 gives the textbook 3(M + R - 1).
 * All terms are multiples of 1/4 ms for the factors below, so the figure is exact. */
static void test_scenario_slow_stage_1f1b(void **state) {
  (void)state;
  struct profile *u = load_profile("profiles/unit.json");
  const uint32_t R = 4, M = 8;
  const double factors[] = {1, 1.25, 1.5, 2, 4};
  struct plan *p = compile("models/tiny-dense.json", "directives/base-schedules/pp4.json", "1f1b",
                           M, 0);
  for (uint32_t r = 0; r < R; r++)
    for (size_t k = 0; k < G_N_ELEMENTS(factors); k++) {
      double s = factors[k], W = R - 1 - r;
      double want = (3 * r + 3 * s * M + W * fmax(0, 3 - s) + W * fmax(0, 3 - 2 * s)) * MS;
      char text[128], what[96];
      snprintf(text, sizeof text, "{\"slow\": [{\"devices\": [%u], \"factor\": %g}]}", r, s);
      for (int collapse = 0; collapse < 2; collapse++) {
        snprintf(what, sizeof what, "1F1B R=%u M=%u stage %u x%g%s", R, M, r, s,
                 collapse ? "" : " (every device)");
        test_assert_near(scenario_step(p, u, text, collapse), want, TIME_TOL, 0, what);
      }
    }
  plan_free(p);
  profile_free(u);
}

/* A slow GPU among data-parallel replicas: collapsed or not, the same step; the replicas it
 * does not touch still collapse (few units), and the critical path runs through it. */
static void test_scenario_collapse_exact(void **state) {
  (void)state;
  struct profile *h = load_profile("profiles/h100-sxm.json");
  /* the delay's path through the devices' compute: tiny-dense on an H100 is host-bound (its
   * launches take longer than its kernels), where a slower GPU would delay nothing */
  h->host_launch = 0;
  struct compile_options co = compile_options_default();
  co.model_path = "models/tiny-dense.json";
  co.layout = "pp=2,dp=2";
  co.have_schedule = true;
  co.schedule.mbs = 4;
  co.schedule.family = SCHED_1F1B;
  struct compile_result cr = test_compile(&co);
  struct plan *p = cr.plan;
  cr.plan = NULL;
  compile_result_free(&cr);
  const char *texts[] = {
      "{\"slow\": [{\"devices\": [1], \"factor\": 1.7}]}",
      "{\"links\": [{\"devices\": [0], \"bandwidth\": 0.25, \"scope\": \"all\"}]}",
      "{\"seed\": 3, \"jitter\": {\"sigma\": 0.05}}",
      "{\"seed\": 3, \"jitter\": {\"sigma\": 0.05, \"per\": \"device\"}}",
      "{\"seed\": 5, \"slow_random\": {\"count\": 1, \"factor\": 2}}",
  };
  struct sim_result *healthy = run(p, h, true);
  for (size_t k = 0; k < G_N_ELEMENTS(texts); k++) {
    double a = scenario_step(p, h, texts[k], true), b = scenario_step(p, h, texts[k], false);
    if (a != b)
      fail_msg("%s: collapsed %.17g, every device %.17g", texts[k], a, b);
    if (!(a > healthy->iteration_time))
      fail_msg("%s: %.17g not slower than healthy %.17g", texts[k], a, healthy->iteration_time);
    assert_true(scenario_step(p, h, texts[k], true) == a); /* the seed fixes the draws */
  }
  /* a slow device on the critical path */
  GError *err = NULL;
  struct sim_scenario *sc = scenario_of(texts[0], p, &err);
  struct sim_options o = {.collapse = true, .scenario = sc, .critical_path = true};
  struct sim_result *r = sim_run(p, h, &o, &err);
  assert_non_null(r);
  bool through = false;
  for (uint32_t k = 0; k < r->n_path; k++)
    through |= r->path[k].device == 1;
  assert_true(through);
  for (uint32_t k = 1; k < r->n_path; k++) /* in time order */
    assert_true(r->path[k].start >= r->path[k - 1].start - TIME_TOL);
  cJSON *rep = sim_scenario_report(sc, p, healthy, r);
  assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(rep, "loss_fraction")) > 0);
  /* device 1 (pp 0) delays its dp peer through the gradient all-reduce, and both delay pp 1 */
  assert_int_equal(cJSON_GetNumberValue(cJSON_GetObjectItem(rep, "delayed_devices")), 4);
  char *text = sim_scenario_summary(rep);
  assert_non_null(strstr(text, "healthy"));
  g_free(text);
  cJSON_Delete(rep);
  sim_result_free(r);
  sim_result_free(healthy);
  sim_scenario_free(sc);
  plan_free(p);
  profile_free(h);
}

/* Scenario files: what is read, and one line naming the key for what is wrong. */
static void test_scenario_parse(void **state) {
  (void)state;
  struct plan *p = compile("models/tiny-dense.json", "directives/base-schedules/pp4.json", "1f1b",
                           4, 0);
  GError *err = NULL;
  struct sim_scenario *sc = scenario_of(
      "{\"seed\": 9, \"slow\": [{\"devices\": [1, 2], \"factor\": 1.5}, {\"devices\": [2], "
      "\"factor\": 2}], \"links\": [{\"devices\": [3], \"bandwidth\": 0.5}, {\"devices\": [0], "
      "\"failed\": true}], \"comment\": \"x\"}",
      p, &err);
  assert_non_null(sc);
  assert_true(sc->seed == 9);
  assert_true(sc->compute[0] == 1 && sc->compute[1] == 1.5 && sc->compute[2] == 3);
  assert_true(sc->inter_bw[3] == 0.5 && sc->intra_bw[3] == 1);
  assert_true(sc->inter_bw[0] == 0.5 && sc->inter_bw[1] == 0.5); /* a failed NIC and its stand-in */
  assert_int_equal(sc->n_marked, 4);
  assert_string_equal(sc->marked_label[2], "compute x3");
  uint32_t devs[2] = {2, 3};
  assert_true(sim_scenario_bandwidth(sc, devs, 2, true) == 0.5);
  assert_true(sim_scenario_bandwidth(sc, devs, 2, false) == 1);
  assert_true(sim_scenario_compute_factor(sc, 2, 7) == 3);
  sim_scenario_free(sc);
  const struct {
    const char *text, *want;
  } bad[] = {
      {"[]", "s.json: must be a JSON object"},
      {"{\"slo\": []}", "s.json: key \"slo\": unknown key"},
      {"{\"seed\": -1}", "s.json: key \"seed\": must be a number in [0,"},
      {"{\"seed\": 1.5}", "s.json: key \"seed\": must be an integer"},
      {"{\"slow\": {}}", "s.json: key \"slow\": must be an array"},
      {"{\"slow\": [3]}", "s.json: key \"slow[0]\": must be an object"},
      {"{\"slow\": [{\"devices\": [1]}]}", "s.json: key \"slow[0].factor\": missing"},
      {"{\"slow\": [{\"devices\": [1], \"factor\": 0}]}",
       "s.json: key \"slow[0].factor\": must be a number in (0, 1e+06]"},
      {"{\"slow\": [{\"devices\": [1], \"factor\": 2}, {\"devices\": [4], \"factor\": 2}]}",
       "s.json: key \"slow[1].devices\": must hold integers in [0, 3]"},
      {"{\"slow\": [{\"devices\": [], \"factor\": 2}]}",
       "s.json: key \"slow[0].devices\": must be a non-empty array"},
      {"{\"slow\": [{\"device\": [1], \"factor\": 2}]}", "s.json: key \"slow[0].device\": unknown"},
      {"{\"slow_random\": {\"count\": 5, \"factor\": 2}}",
       "s.json: key \"slow_random.count\": must be a number in [1, 4]"},
      {"{\"links\": [{\"devices\": [1]}]}", "s.json: key \"links[0].bandwidth\": missing"},
      {"{\"links\": [{\"devices\": [1], \"bandwidth\": 1.5}]}",
       "s.json: key \"links[0].bandwidth\": must be a number in (0, 1]"},
      {"{\"links\": [{\"devices\": [1], \"failed\": 1}]}",
       "s.json: key \"links[0].failed\": must be true or false"},
      {"{\"links\": [{\"devices\": [1], \"bandwidth\": 0.5, \"scope\": \"nic\"}]}",
       "s.json: key \"links[0].scope\": must be \"inter\", \"intra\" or \"all\""},
      {"{\"jitter\": {\"sigma\": 2}}", "s.json: key \"jitter.sigma\": must be a number in [0, 1]"},
      {"{\"jitter\": {\"sigma\": 0.1, \"per\": \"step\"}}",
       "s.json: key \"jitter.per\": must be \"kernel\" or \"device\""},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(bad); k++) {
    g_clear_error(&err);
    sc = scenario_of(bad[k].text, p, &err);
    if (sc || !err || !g_str_has_prefix(err->message, bad[k].want) ||
        err->code != PIPER_ERROR_INPUT || strchr(err->message, '\n'))
      fail_msg("%s: got \"%s\", want \"%s...\"", bad[k].text, err ? err->message : "success",
               bad[k].want);
  }
  g_clear_error(&err);
  assert_null(sim_scenario_load("/nonexistent/s.json", p, &err));
  assert_non_null(err);
  g_clear_error(&err);
  plan_free(p);
}

/* The event queue gives (time, push order) exactly, through runs of pushes at one time, times
 * that come back after their bucket went (a bucket reused), pops between pushes, and events
 * cancelled while queued (sim_queue_cancel: popped in place as SIM_QUEUE_CANCELLED, the others'
 * order kept); checked against a stable sort of what is queued and not cancelled. */
struct queued_event {
  double t;
  uint32_t seq, handle;
};

static int queued_cmp(const void *a, const void *b) {
  const struct queued_event *x = a, *y = b;
  if (x->t != y->t)
    return x->t < y->t ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void test_queue_order(void **state) {
  (void)state;
  struct sim_queue q = {0};
  /* a time used up and pushed again at once: its bucket went with its last event */
  sim_queue_push(&q, 1.0, 0, 7, 0, 0);
  sim_queue_push(&q, 2.0, 0, 8, 0, 0);
  sim_queue_push(&q, 1.0, 0, 9, 0, 0);
  assert_int_equal(sim_queue_pop(&q).id, 7);
  assert_int_equal(sim_queue_pop(&q).id, 9);
  sim_queue_push(&q, 1.0, 0, 10, 0, 0);
  assert_int_equal(sim_queue_pop(&q).id, 10);
  assert_int_equal(sim_queue_pop(&q).id, 8);
  assert_int_equal(q.n, 0);
  enum { N = 4000 };
  struct queued_event *live = g_new(struct queued_event, N);
  uint32_t n_live = 0, seq = 0, popped = 0, cancelled = 0, skipped = 0;
  double now = 0;
  uint64_t x = 12345;
  while (seq < N || n_live > 0) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(x >> 33);
    if (seq < N && (r % 3 != 0 || n_live == 0)) {
      /* a run of 1..40 pushes at one time, one of three: many come back after their bucket
       * was used up */
      double t = now + (double)(r % 3);
      uint32_t run = 1 + (r >> 8) % 40;
      for (uint32_t k = 0; k < run && seq < N; k++) {
        uint32_t h = sim_queue_push(&q, t, 0, seq, 0, 0);
        live[n_live++] = (struct queued_event){t, seq++, h};
      }
      /* one run in four cancels a queued event, as a kernel's new rate does its old end */
      if (r % 4 == 1 && n_live > 0) {
        uint32_t k = (r >> 16) % n_live;
        sim_queue_cancel(&q, live[k].handle);
        live[k] = live[--n_live];
        cancelled++;
      }
      continue;
    }
    /* pops in bursts, often down to the last event at the last time pushed: the next push at
     * that time must not find its old bucket */
    qsort(live, n_live, sizeof *live, queued_cmp);
    for (uint32_t k = 1 + (r >> 8) % 60; k > 0 && n_live > 0; k--) {
      struct sim_event e = sim_queue_pop(&q);
      if (e.type == SIM_QUEUE_CANCELLED) {
        skipped++;
        k++;
        continue;
      }
      assert_true(e.t == live[0].t);
      assert_int_equal(e.id, live[0].seq);
      now = e.t;
      memmove(live, live + 1, sizeof *live * --n_live);
      popped++;
    }
  }
  while (q.n > 0) /* cancelled events behind the last live one */
    skipped += sim_queue_pop(&q).type == SIM_QUEUE_CANCELLED;
  assert_true(cancelled > 0);
  assert_int_equal(skipped, cancelled);
  assert_int_equal(popped + cancelled, N);
  assert_int_equal(q.n, 0);
  sim_queue_free(&q);
  g_free(live);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8_cost),
      cmocka_unit_test(test_profile_bundled),
      cmocka_unit_test(test_profile_errors),
      cmocka_unit_test(test_gemm_shapes),
      cmocka_unit_test(test_attention_core),
      cmocka_unit_test(test_attention_unfused),
      cmocka_unit_test(test_roofline_and_table),
      cmocka_unit_test(test_expert_parallel_entries),
      cmocka_unit_test(test_optimizer_cost),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_collectives_topology),
      cmocka_unit_test(test_moe_costs),
      cmocka_unit_test(test_gpt_shape_costs),
      cmocka_unit_test(test_engine_order_and_rendezvous),
      cmocka_unit_test(test_engine_loop_late),
      cmocka_unit_test(test_engine_host_loop),
      cmocka_unit_test(test_engine_host_thread),
      cmocka_unit_test(test_engine_contention),
      cmocka_unit_test(test_profile_host_and_fits),
      cmocka_unit_test(test_profile_host_errors),
      cmocka_unit_test(test_engine_cores_shared),
      cmocka_unit_test(test_engine_memory),
      cmocka_unit_test(test_report_stats),
      cmocka_unit_test(test_collapse_exact),
      cmocka_unit_test(test_memory_timeline_limit),
      cmocka_unit_test(test_static_memory_zero),
      cmocka_unit_test(test_static_memory_zero_experts),
      cmocka_unit_test(test_profile_memory_errors),
      cmocka_unit_test(test_static_memory_held),
      cmocka_unit_test(test_report_files),
      cmocka_unit_test(test_sweep),
      cmocka_unit_test(test_textbook_gpipe_1f1b),
      cmocka_unit_test(test_bubble_split_textbook),
      cmocka_unit_test(test_bubble_split_intervals),
      cmocka_unit_test(test_textbook_zb_interleaved),
      cmocka_unit_test(test_textbook_dualpipev),
      cmocka_unit_test(test_named_stream_textbook),
      cmocka_unit_test(test_ranks_with_model_copies),
      cmocka_unit_test(test_scenario_slow_stage_1f1b),
      cmocka_unit_test(test_scenario_collapse_exact),
      cmocka_unit_test(test_scenario_parse),
      cmocka_unit_test(test_queue_order),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  /* cairo's and fontconfig's caches, so that the leak checker sees only our allocations */
  cairo_debug_reset_static_data();
  void (*fc_fini)(void) = NULL;
  void *sym = dlsym(RTLD_DEFAULT, "FcFini");
  memcpy(&fc_fini, &sym, sizeof sym);
  if (fc_fini)
    fc_fini();
  return rc;
}
