/* Tensor and sequence parallelism: the rewrite (nodes, communication, exact bytes), the split
 * communicators, the per-device costs and memory, and the errors. */
#include "test-helpers.h"

#include "../../base/json.h"
#include "../../directives/directives.h"
#include "../../ir/plan.h"
#include "../../sim/sim.h"

/* tiny-dense in one PP region: hidden h = 64, 8 layers, 4 heads of 16, 2 KV heads, FFN 128,
 * vocabulary 256, seq 32 x micro-batch 2 = T = 64 tokens, fp32 (4 bytes). Hand-computed:
 *   act = T h 4 = 16384 bytes, the [T, hidden] tensor one TP all-reduce moves.
 *   Parameters per layer: 2 RMSNorm weights 2 x 64 = 128 (whole on every rank); attention
 *   q,o 64 x 64 each + k,v 64 x 32 each = 12288 (/2 = 6144); MLP 3 x 64 x 128 = 24576
 *   (/2 = 12288): 18560 per device. Embedding and head 256 x 64 = 16384 each (/2 = 8192),
 *   final norm 64. Per device: 8 x 18560 + 2 x 8192 + 64 = 164928 parameters = 659712 bytes.
 *   Saved activations per layer: two RMSNorms act + 4 T = 16640 each (whole); attention
 *   act (whole) + (q,k,v 64 x 128 x 4 = 32768 + core 16384 + lse 64 x 4 x 4 = 1024) / 2 =
 *   16384 + 25088 = 41472; MLP act + (gate/up 64 x 256 x 4 = 65536 + silu(gate) * up
 *   64 x 128 x 4 = 32768) / 2 = 65536: 140288. Plus ids 256, final norm 16640, the head's
 *   input 16384, targets 64 x 4 = 256 and per-token max logit and 1 / sum of exp 2 x 64 x 4 =
 *   512 (all whole: the parallel cross-entropy reduces them over the vocabulary slices):
 *   8 x 140288 + 256 + 16640 + 17152 = 1156352 bytes.
 *   TP collectives: F: 2 per layer + 1 (vocabulary-parallel embedding) = 17 of act, and the
 *   parallel cross-entropy's 3 of T x 4 = 256: 20 collectives, 17 x 16384 + 768 = 279296
 *   bytes. B: 2 per layer + 1 (the head's input gradient) = 17 of act = 278528 bytes. */
#define ACT 16384u
#define PARAMS_PER_DEVICE 164928u
#define SAVED_PER_DEVICE 1156352u

/* The one TP node of kind after compute node of pass. */
static const struct ir_node *tp_node(const struct ir_graph *g, enum ir_node_kind kind,
                                     enum ir_pass pass) {
  const struct ir_node *found = NULL;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->purpose == IR_COMM_TP && n->kind == kind && n->pass == pass) {
      assert_null(found);
      found = n;
    }
  }
  assert_non_null(found);
  return found;
}

static void test_rewrite_tp2(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 1);
  struct ir_graph *g =
      test_must_apply(m, "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
                         "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":2}]");
  uint32_t n_tp = 0;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_COMPUTE)
      assert_int_equal(n->tp_degree, 2);
    n_tp += n->purpose == IR_COMM_TP;
  }
  assert_int_equal(n_tp, 2); /* one per F and B node */
  const struct ir_node *f = tp_node(g, IR_NODE_ALL_REDUCE, IR_PASS_F);
  assert_int_equal(f->collectives, 20);
  assert_int_equal(f->bytes, 17 * ACT + 3 * 64 * 4);
  assert_int_equal(f->tp_degree, 2);
  const struct ir_node *b = tp_node(g, IR_NODE_ALL_REDUCE, IR_PASS_B);
  assert_int_equal(b->collectives, 17);
  assert_int_equal(b->bytes, 17 * ACT);
  /* the optimizer's set holds each device's slices; the saved activations are divided */
  for (uint32_t i = 0; i < g->nodes->len; i++)
    if (IR_NODE(g, i)->kind == IR_NODE_OPTIMIZER)
      assert_int_equal(IR_SEGSET(g, IR_NODE(g, i)->segset)->param_bytes, 4 * PARAMS_PER_DEVICE);
  bool saw_saved = false;
  for (uint32_t e = 0; e < g->edges->len; e++) {
    const struct ir_edge *ed = IR_EDGE(g, e);
    if (ed->kind == IR_EDGE_DATA && ed->slot == 1) {
      assert_int_equal(ed->bytes, SAVED_PER_DEVICE);
      saw_saved = true;
    }
  }
  assert_true(saw_saved);
  ir_graph_free(g);
  model_free(m);
}

/* ZeRO under TP 2 x DP 2: each ZeRO level divides a device's slices (P = 164928 parameters,
 * even per bucket, so no padding) over its 2 data-parallel peers. fp32 Adam, by hand:
 *   ZeRO-1: params 4P = 659712, grads 4P = 659712, optimizer 8P / 2 = 659712;
 *   ZeRO-2: grads 4P / 2 = 329856 too; ZeRO-3: params 4P / 2 = 329856 too. */
static void test_zero_with_tp(void **state) {
  (void)state;
  static const char *const keys[] = {"\"shard_optimizer\":true", "\"shard_grads\":true",
                                     "\"shard_params\":true"};
  static const uint64_t want[3][3] = {
      {4 * PARAMS_PER_DEVICE, 4 * PARAMS_PER_DEVICE, 4 * PARAMS_PER_DEVICE},
      {4 * PARAMS_PER_DEVICE, 2 * PARAMS_PER_DEVICE, 4 * PARAMS_PER_DEVICE},
      {2 * PARAMS_PER_DEVICE, 2 * PARAMS_PER_DEVICE, 4 * PARAMS_PER_DEVICE}};
  for (int z = 0; z < 3; z++) {
    char *dir = test_tmp_dir("test_tp-XXXXXX");
    char *path = g_build_filename(dir, "zero.json", NULL);
    char *text = g_strdup_printf("[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1,2,3],%s},"
                                 "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":2}]",
                                 keys[z]);
    test_write_file(path, text);
    struct compile_options o = compile_options_default();
    o.model_path = "models/tiny-dense.json";
    o.directives_path = path;
    o.pp_regions = 1;
    struct compile_result r = test_compile(&o);
    for (uint32_t d = 0; d < 4; d++) {
      uint64_t mem[REPORT_MEM_KIND_COUNT];
      sim_static_memory(r.plan, plan_device_class(r.plan, d), mem);
      assert_int_equal(mem[REPORT_MEM_PARAMS], want[z][0]);
      assert_int_equal(mem[REPORT_MEM_GRADS], want[z][1]);
      assert_int_equal(mem[REPORT_MEM_OPTIMIZER], want[z][2]);
    }
    compile_result_free(&r);
    test_remove_tree(dir);
    g_free(text);
    g_free(path);
    g_free(dir);
  }
}

/* Sequence parallelism: a reduce-scatter and an all-gather of the same totals; the whole parts
 * of the saved activations halve too. Per layer: RMSNorms 16640 / 2 = 8320 each; attention
 * 16384 / 2 + 50176 / 2 = 33280; MLP 16384 / 2 + 98304 / 2 = 57344: 107264. x 8 = 858112,
 * plus token ids 256 (every rank needs all), final norm 8320, the head's 17152 / 2 = 8576:
 * 875264 bytes. */
static void test_rewrite_sequence_parallel(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 1);
  struct ir_graph *g = test_must_apply(m, "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
                                          "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":2,"
                                          "\"sequence_parallel\":true}]");
  const struct ir_node *rs = tp_node(g, IR_NODE_REDUCE_SCATTER, IR_PASS_F);
  const struct ir_node *ag = tp_node(g, IR_NODE_ALL_GATHER, IR_PASS_F);
  assert_int_equal(rs->bytes, 17 * ACT + 3 * 64 * 4);
  assert_int_equal(ag->bytes, rs->bytes);
  assert_int_equal(rs->collectives, 20);
  assert_true(rs->sequence_parallel);
  for (uint32_t e = 0; e < g->edges->len; e++) {
    const struct ir_edge *ed = IR_EDGE(g, e);
    if (ed->kind == IR_EDGE_DATA && ed->slot == 1)
      assert_int_equal(ed->bytes, 875264);
  }
  ir_graph_free(g);
  model_free(m);
}

/* TP 2 x DP 2 on four devices, TP innermost: device 2's TP peers are {2, 3}, its
 * data-parallel peers (same TP rank) {0, 2}; static memory halves by TP, not by DP. */
static void test_split_communicators(void **state) {
  (void)state;
  char *dir = test_tmp_dir("test_tp-XXXXXX");
  char *path = g_build_filename(dir, "tp2dp2.json", NULL);
  test_write_file(path, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1,2,3]},"
                        "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":2}]");
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.directives_path = path;
  o.pp_regions = 1;
  struct compile_result r = test_compile(&o);
  const struct plan *p = r.plan;
  uint32_t tp = IR_NONE, dp = IR_NONE;
  for (uint32_t k = 0; k < p->n_comms; k++) {
    if (p->comms[k].purpose == IR_COMM_TP)
      tp = k;
    if (p->comms[k].purpose == IR_COMM_DP)
      dp = k;
  }
  assert_int_not_equal(tp, IR_NONE);
  assert_int_not_equal(dp, IR_NONE);
  assert_int_equal(plan_comm_size(p, tp), 2);
  assert_int_equal(plan_comm_size(p, dp), 2);
  uint32_t members[2];
  plan_comm_members(p, tp, 2, members);
  assert_int_equal(members[0], 2);
  assert_int_equal(members[1], 3);
  assert_int_equal(plan_comm_rank(p, tp, 3), 1);
  plan_comm_members(p, dp, 2, members);
  assert_int_equal(members[0], 0);
  assert_int_equal(members[1], 2);
  assert_int_equal(plan_comm_rank(p, dp, 2), 1);
  /* the gradient all-reduce moves each device's slices */
  for (uint32_t i = 0; i < p->n_nodes; i++)
    if (p->nodes[i].purpose == IR_COMM_DP) {
      assert_int_equal(p->nodes[i].bytes, 4 * PARAMS_PER_DEVICE);
      assert_int_equal(p->nodes[i].replica_degree, 2);
    }
  uint64_t mem[REPORT_MEM_KIND_COUNT];
  sim_static_memory(p, plan_device_class(p, 1), mem);
  assert_int_equal(mem[REPORT_MEM_PARAMS], 4 * PARAMS_PER_DEVICE);
  assert_int_equal(mem[REPORT_MEM_OPTIMIZER], 8 * PARAMS_PER_DEVICE); /* fp32 Adam: m, v */
  /* round trip through the files keeps the new fields */
  char *out = g_build_filename(dir, "plan", NULL);
  GError *err = NULL;
  assert_true(plan_write_dir(p, out, &err));
  struct plan *back = plan_read_dir(out, &err);
  if (!back)
    fail_msg("%s", err->message);
  assert_true(plan_equal(p, back));
  plan_free(back);
  compile_result_free(&r);
  g_free(out);
  g_free(path);
  test_remove_tree(dir);
  g_free(dir);
}

/* Per-device FLOPs of layer 0's forward under TP 2 (hand-computed): RMSNorm 4 T h = 16384 and
 * residual adds T h = 4096 stay whole; attention (2 T h (qd + 2 kvd) + 2 T qd h = 1572864 plus
 * the causal core 2 x 2 x b H s^2 hd / 2 = 262144) / 2 = 917504; MLP (6 T ffn h + 5 T ffn =
 * 3186688) / 2 = 1593344. Sum 2551808; with SP everything halves: 2531328. */
static void test_op_share_flops(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 1);
  double tp = 0, sp = 0;
  for (uint32_t i = 0; i < m->n_ops; i++)
    if (m->ops[i].layer == 0) {
      tp += m->ops[i].flops_fwd * ir_tp_op_share(&m->ops[i], 2, false);
      sp += m->ops[i].flops_fwd * ir_tp_op_share(&m->ops[i], 2, true);
    }
  test_assert_near(tp, 2551808, 0, 0, "TP 2 forward FLOPs of layer 0");
  test_assert_near(sp, 2531328, 0, 0, "TP 2 + SP forward FLOPs of layer 0");
  model_free(m);
}

/* The simulator charges a tp node as its collectives: on H100s, the forward's 20 all-reduces of
 * 279296 / 20 = 13964 bytes each over the two devices' NVLink span cost 20 x (latency +
 * transfer) of one, and the compute nodes run their per-device share (a TP 2 forward takes
 * less than the undivided one and more than half of it: norms, residuals and kernel overheads
 * stay whole). */
static void test_sim_tp_costs(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", &err);
  if (!prof)
    fail_msg("%s", err->message);
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.layout = "tp=2";
  struct compile_result r = test_compile(&o);
  const struct plan *p = r.plan;
  struct sim_result *res = sim_run(p, prof, &(struct sim_options){.collapse = false}, &err);
  if (!res)
    fail_msg("%s", err->message);
  uint32_t devs[2] = {0, 1};
  struct profile_span span = profile_span_of(prof, devs, 2);
  struct profile_comm_cost one = profile_comm_cost(prof, IR_NODE_ALL_REDUCE, 279296 / 20, &span);
  bool seen_comm = false, seen_f = false;
  const struct sim_unit *u = &res->units[res->device_unit[0]];
  for (uint32_t k = 0; k < u->n_intervals; k++) {
    const struct report_interval *iv = &u->intervals[k];
    const struct ir_node *n = &p->nodes[iv->node];
    if (n->purpose == IR_COMM_TP && n->pass == IR_PASS_F) {
      test_assert_near(iv->end - iv->start, 20 * (one.latency + one.transfer), 0, 1e-9,
                       "forward TP all-reduces");
      seen_comm = true;
    }
    if (n->kind == IR_NODE_COMPUTE && n->pass == IR_PASS_F) {
      struct profile_cost whole = profile_compute_cost(prof, p->model, n->segment, IR_PASS_F, 1);
      double t = iv->end - iv->start;
      assert_true(t < whole.seconds && t > whole.seconds / 2);
      seen_f = true;
    }
  }
  assert_true(seen_comm && seen_f);
  sim_result_free(res);
  compile_result_free(&r);
  profile_free(prof);
}

/* Many micro-batches of a MoE model with EP over DP and TP + SP inside, every schedule
 * family that fits the layout: the rewrite adds thousands of nodes (the node array moves under
 * it; ASan builds catch a stale pointer) and every plan passes the progress check. */
static void test_moe_schedules(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"pp=2,dp=2,ep=2,tp=2,sp", "1f1b"},
      {"pp=2,dp=2,ep=2,tp=2,sp", "zerobubble"},
      {"pp=2,dp=2,ep=2,tp=2,sp", "dualpipe"},
      {"pp=2,dp=2,ep=2,tp=2,v", "dualpipev"},
      {"pp=2,dp=2,tp=2,interleave=2,zero=3", "interleaved_1f1b"},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct compile_options o = compile_options_default();
    o.model_path = "models/tiny-moe.json";
    o.layout = cases[i][0];
    o.have_schedule = true;
    assert_true(sched_family_parse(cases[i][1], &o.schedule.family));
    o.schedule.mbs = 32;
    struct compile_result r = test_compile(&o);
    uint32_t tp_nodes = 0;
    for (uint32_t k = 0; k < r.plan->n_nodes; k++)
      tp_nodes += r.plan->nodes[k].purpose == IR_COMM_TP;
    assert_true(tp_nodes > 0);
    compile_result_free(&r);
  }
}

/* The bytes of every collective that sums expert gradients, against a hand computation on
 * tiny-moe (fp32, 8 experts of 3 x 64 x 32 = 6144 parameters, 24576 bytes each; 4 MoE layers):
 * a device holds 8 / EP experts per layer, each 1 / ETP of it, so a collective over n expert
 * segments moves n x 8 x 24576 / (EP x ETP) bytes. Layouts: expert TP below the dense TP (whole
 * experts, EP 4 carved over TP 2 x DP 4; with ZeRO-1), experts divided by TP inside DP (EP 2 x
 * ETP 2), and DualPipe's copies' sums of experts under TP (once counted whole over EP). */
static void test_expert_grad_bytes(void **state) {
  (void)state;
  static const struct {
    const char *layout, *schedule;
    uint32_t ep, etp;
  } cases[] = {
      {"tp=2,dp=4,ep=4,etp=1,sp", "1f1b", 4, 1},
      {"tp=2,dp=4,ep=4,etp=1,sp,zero=1", "1f1b", 4, 1},
      {"tp=2,dp=4,ep=2,sp", "1f1b", 2, 2},
      {"pp=2,dp=2,ep=2,tp=2,sp", "dualpipe", 2, 2},
      {"pp=2,dp=4,ep=4,tp=2,etp=1,sp", "dualpipe", 4, 1},
  };
  const uint64_t expert_layer = 8u * 3u * 64u * 32u * 4u;
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct compile_options o = compile_options_default();
    o.model_path = "models/tiny-moe.json";
    o.layout = cases[i].layout;
    o.have_schedule = true;
    assert_true(sched_family_parse(cases[i].schedule, &o.schedule.family));
    o.schedule.mbs = 4;
    struct compile_result r = test_compile(&o);
    const struct plan *p = r.plan;
    uint32_t seen = 0;
    for (uint32_t k = 0; k < p->n_nodes; k++) {
      const struct ir_node *n = &p->nodes[k];
      if (n->purpose != IR_COMM_DP || n->segset == IR_NONE || n->kind == IR_NODE_OPTIMIZER)
        continue;
      const struct ir_segset *ss = &p->segsets[n->segset];
      uint32_t experts = 0;
      for (uint32_t j = 0; j < ss->count; j++)
        experts += p->model->segments[p->segment_pool[ss->first + j]].expert;
      if (!experts)
        continue;
      assert_int_equal(experts, ss->count); /* experts are bucketed apart */
      uint64_t want = experts * expert_layer / (cases[i].ep * cases[i].etp);
      if (n->bytes != want)
        fail_msg("%s %s: node %u sums %u expert segments in %llu bytes, not %llu",
                 cases[i].layout, cases[i].schedule, k, experts, (unsigned long long)n->bytes,
                 (unsigned long long)want);
      seen++;
    }
    if (!seen)
      fail_msg("%s %s: no collective sums expert gradients", cases[i].layout, cases[i].schedule);
    compile_result_free(&r);
  }
}

static void test_errors(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 1);
  test_expect_apply_error(m,
                          "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1,2]},"
                          "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":3}]",
                          "test.json: directive 1 (tensor_parallel): \"degree\" 3 does not divide "
                          "num_attention_heads = 4");
  test_expect_apply_error(m,
                          "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1,2,3]},"
                          "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":4}]",
                          "\"degree\" 4 does not divide num_key_value_heads = 2");
  test_expect_apply_error(m,
                          "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1,2,3]},"
                          "{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":2}]",
                          "runs on 4 devices, neither replicated nor sharded");
  test_expect_apply_error(m,
                          "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
                          "{\"op\":\"tensor_parallel\",\"filter\":{\"PASS\":\"F\"},\"degree\":2}]",
                          "is not divided but other passes");
  test_expect_apply_error(m,
                          "[{\"op\":\"tensor_parallel\",\"filter\":{},\"degree\":2,\"sp\":true}]",
                          "unknown key \"sp\"");
  test_expect_apply_error(m, "[{\"op\":\"tensor_parallel\",\"filter\":{}}]", "\"degree\"");
  model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rewrite_tp2),    cmocka_unit_test(test_expert_grad_bytes),    cmocka_unit_test(test_rewrite_sequence_parallel),
      cmocka_unit_test(test_zero_with_tp),   cmocka_unit_test(test_split_communicators),
      cmocka_unit_test(test_op_share_flops), cmocka_unit_test(test_sim_tp_costs),
      cmocka_unit_test(test_moe_schedules),  cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests_name("tensor_parallel", tests, NULL, NULL);
}
