/* Context parallelism: the layout and the directive, the rank grid, the model split per rank,
 * the K/V exchange nodes and their communicator, the simulator's costs, and the textbook
 * memory: a rank holds 1/N of the unsplit sequence's activations plus the K/V buffers. */
#include "test-helpers.h"

#include "../../directives/directives.h"
#include "../../directives/layout.h"
#include "../../ir/plan.h"
#include "../../sim/sim.h"

/* tiny-dense: seq 32 x micro-batch 2 = 64 tokens, 8 layers, 2 KV heads of 16, fp32. The K and
 * V of one layer over the whole sequence: 2 x 64 x 2 x 16 x 4 = 16384 bytes. */
#define KV_LAYER 16384u

static struct compile_result compile_layout(const char *layout) {
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.layout = layout;
  return test_compile(&o);
}

static void test_layout_grid(void **state) {
  (void)state;
  struct layout l;
  GError *err = NULL;
  assert_true(layout_parse("pp=2,tp=2,cp=2,dp=3", &l, &err));
  assert_int_equal(layout_devices(&l), 24);
  assert_int_equal(l.cp_comm, IR_CP_P2P);
  /* Megatron's order: TP innermost, then CP, then DP, PP outermost */
  assert_int_equal(layout_device(&l, 0, 1, 0, 0), 1);
  assert_int_equal(layout_device(&l, 0, 0, 1, 0), 2);
  assert_int_equal(layout_device(&l, 0, 0, 0, 1), 4);
  assert_int_equal(layout_device(&l, 1, 0, 0, 0), 12);
  for (uint32_t d = 0; d < 24; d++) {
    uint32_t pp, tp, cp, dp;
    layout_coords(&l, d, &pp, &tp, &cp, &dp);
    assert_int_equal(layout_device(&l, pp, tp, cp, dp), d);
  }
  char *json = layout_to_json(&l);
  assert_non_null(strstr(json, "{\"op\": \"replicate\", \"filter\": {\"PP\": 1}, \"devices\": "
                               "[12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]}"));
  assert_non_null(
      strstr(json, "{\"op\": \"context_parallel\", \"degree\": 2, \"comm\": \"p2p\"}"));
  g_free(json);
  /* dp 1: the CP ranks still replicate each stage (gradients over DP x CP) */
  assert_true(layout_parse("pp=2,cp=2,cp-comm=all_gather", &l, &err));
  json = layout_to_json(&l);
  assert_non_null(strstr(json, "{\"op\": \"replicate\", \"filter\": {\"PP\": 0}, \"devices\": [0, 1]}"));
  assert_non_null(strstr(json, "\"comm\": \"all_gather\""));
  g_free(json);
  /* with EP: a shard without a degree spreads the experts over DP x CP, so ep = dp (below
   * dp x cp) is carved (EP over the CP ranks of each replica), ep = dp x cp is not */
  assert_true(layout_parse("cp=2,dp=2,ep=2", &l, &err));
  json = layout_to_json(&l);
  assert_non_null(strstr(json, "\"degree\": 2, \"expert_tensor_parallel\": 1"));
  g_free(json);
  assert_true(layout_parse("cp=2,dp=2,ep=4", &l, &err));
  json = layout_to_json(&l);
  assert_null(strstr(json, "\"expert_tensor_parallel\""));
  g_free(json);
  static const struct {
    const char *spec, *want;
  } bad[] = {{"cp=0", "\"cp\" must be a whole number"},
             {"cp=2,cp-comm=ring", "\"cp-comm\" must be p2p"},
             {"cp=2,dp=2,ep=3", "does not divide the 4 ranks of a stage (tp x cp x dp = 1 x 2 x 2)"},
             {"cp=2,cp=4", "\"cp\" is given twice"}};
  for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
    assert_false(layout_parse(bad[i].spec, &l, &err));
    test_assert_input_error(err, bad[i].want);
    g_clear_error(&err);
  }
}

static void test_directive_errors(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } bad[] = {
      {"[{\"op\":\"context_parallel\",\"degree\":2,\"comm\":\"ring\"}]", "\"comm\" = \"ring\" must be"},
      {"[{\"op\":\"context_parallel\",\"degree\":0}]", "\"degree\""},
      {"[{\"op\":\"context_parallel\",\"degree\":2,\"filter\":{}}]", "unknown key \"filter\""},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
    GError *err = NULL;
    cJSON *root = json_parse_buffer("x.json", bad[i].text, strlen(bad[i].text), &err);
    assert_non_null(root);
    assert_null(dir_program_parse_json("x.json", root, &err));
    test_assert_input_error(err, bad[i].want);
    g_clear_error(&err);
    cJSON_Delete(root);
  }
  /* the sequence must cut into 2N equal chunks: 32 tokens do not make 6 */
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.layout = "cp=3";
  struct compile_result r;
  GError *err = NULL;
  assert_false(compile_run(&o, &r, &err));
  test_assert_input_error(err, "(context_parallel): \"degree\" 3 cuts each sequence into 6 chunks");
  g_clear_error(&err);
  /* a stage placed without replicate has nothing to reduce its gradients over CP with */
  struct model *m = test_load_model("models/tiny-dense.json", 1);
  struct ir_graph *g =
      test_apply_text(m, "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
                         "{\"op\":\"context_parallel\",\"degree\":2}]", &err);
  assert_null(g);
  test_assert_input_error(err, "was loaded for context parallelism 1, not 2");
  g_clear_error(&err);
  model_free(m);
  /* and a model split per rank with nothing exchanging K/V would train something else */
  struct compile_result half = compile_layout("cp=2");
  cJSON *root = model_to_json(half.model);
  compile_result_free(&half);
  m = model_load_json("tiny-cp2", root, 1, &err);
  cJSON_Delete(root);
  assert_non_null(m);
  assert_int_equal(m->context_parallel, 2);
  g = test_apply_text(m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1]}]", &err);
  assert_null(g);
  test_assert_input_error(err, "has piper.context_parallel 2, but the program has no "
                               "context_parallel directive");
  g_clear_error(&err);
  model_free(m);
}

/* One rank's model: 32 of the 64 tokens, and exactly half the causal core of every layer
 * (2 x 2 x b H s^2 hd / 2 = 262144 for the whole sequence). */
static void test_model_share(void **state) {
  (void)state;
  struct compile_result whole = compile_layout("pp=1"), half = compile_layout("cp=2");
  assert_int_equal(model_tokens_per_microbatch(whole.model), 64);
  assert_int_equal(model_tokens_per_microbatch(half.model), 32);
  assert_int_equal(half.model->seq_len, 32);
  for (uint32_t i = 0; i < whole.model->n_ops; i++) {
    const struct model_op *a = &whole.model->ops[i], *b = &half.model->ops[i];
    test_assert_near(b->flops_fwd, a->flops_fwd / 2, 0, 1e-12, "a rank's forward FLOPs");
    test_assert_near(b->flops_bwd_input, a->flops_bwd_input / 2, 0, 1e-12, "backward FLOPs");
    assert_int_equal(b->saved_bytes * 2, a->saved_bytes);
    assert_int_equal(b->param_bytes, a->param_bytes);
    if (a->kind == MODEL_OP_ATTENTION)
      test_assert_near(a->module_flops_fwd[MODEL_MODULE_CORE_ATTN], 262144, 0, 0, "core");
  }
  compile_result_free(&whole);
  compile_result_free(&half);
}

/* The K/V exchange: p2p, an all-gather beside each F (and R) and an all-gather plus a
 * reduce-scatter beside each B, on stream cp, each standing for the 8 layers' K/V; over a cp
 * communicator of one tp rank's and one dp rank's devices (tp 2 x cp 2 x dp 2). */
static void test_exchange_nodes(void **state) {
  (void)state;
  struct compile_result r = compile_layout("tp=2,cp=2,dp=2");
  const struct plan *p = r.plan;
  uint32_t n_cp = 0, comm = IR_NONE;
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    const struct ir_node *n = &p->nodes[i];
    if (n->kind == IR_NODE_COMPUTE)
      assert_int_equal(n->cp_degree, 2);
    if (n->purpose != IR_COMM_CP)
      continue;
    n_cp++;
    assert_int_equal(n->bytes, 8 * KV_LAYER / 2); /* each TP rank's KV heads */
    assert_int_equal(n->collectives, 8);
    assert_string_equal(p->streams[n->stream].name, "cp");
    assert_true(n->kind == IR_NODE_ALL_GATHER || n->pass == IR_PASS_B);
  }
  assert_int_equal(n_cp, 3);
  for (uint32_t k = 0; k < p->n_comms; k++)
    if (p->comms[k].purpose == IR_COMM_CP)
      comm = k;
  assert_int_not_equal(comm, IR_NONE);
  assert_int_equal(plan_comm_size(p, comm), 2);
  uint32_t members[2];
  plan_comm_members(p, comm, 5, members); /* tp 1, cp 0, dp 1 */
  assert_int_equal(members[0], 5);
  assert_int_equal(members[1], 7);
  assert_int_equal(plan_comm_rank(p, comm, 7), 1);
  /* gradients over DP x CP: the devices of one tp rank */
  for (uint32_t k = 0; k < p->n_comms; k++)
    if (p->comms[k].purpose == IR_COMM_DP)
      assert_int_equal(plan_comm_size(p, k), 4);
  /* the files keep it */
  char *dir = test_tmp_dir("test_cp-XXXXXX");
  GError *err = NULL;
  assert_true(plan_write_dir(p, dir, &err));
  struct plan *back = plan_read_dir(dir, &err);
  if (!back)
    fail_msg("%s", err->message);
  assert_true(plan_equal(p, back));
  plan_free(back);
  /* a plan whose cp communicator lost its stride no longer says which devices meet: refused */
  char *index = g_build_filename(dir, "plan.json", NULL);
  cJSON *root = json_parse_file_strict(index, &err);
  assert_non_null(root);
  const cJSON *comms = cJSON_GetObjectItemCaseSensitive(root, "communicators"), *c;
  cJSON_ArrayForEach(c, comms) {
    const cJSON *purpose = cJSON_GetObjectItemCaseSensitive(c, "purpose");
    if (strcmp(purpose->valuestring, "cp") == 0)
      cJSON_DeleteItemFromObjectCaseSensitive((cJSON *)c, "stride");
  }
  char *text = cJSON_Print(root);
  test_write_file(index, text);
  cJSON_free(text);
  cJSON_Delete(root);
  assert_null(plan_read_dir(dir, &err));
  test_assert_input_error(err, "has \"split\" 2 and \"stride\" 0, node");
  g_clear_error(&err);
  g_free(index);
  test_remove_tree(dir);
  g_free(dir);
  compile_result_free(&r);
}

/* Sum of device 0's tensors of a kind, and the largest workspace of a compute of pass. */
static uint64_t tensors(const struct plan *p, enum plan_tensor_kind kind, enum ir_pass pass,
                        bool largest) {
  const struct plan_class *c = plan_device_class(p, 0);
  uint64_t sum = 0;
  for (uint32_t t = 0; t < c->n_tensors; t++) {
    const struct plan_tensor *pt = &c->tensors[t];
    const struct ir_node *n = &p->nodes[c->instrs[pt->producer].node];
    if (pt->kind != kind || n->kind != IR_NODE_COMPUTE || (largest && n->pass != pass))
      continue;
    sum = largest ? MAX(sum, pt->bytes) : sum + pt->bytes;
  }
  return sum;
}

static uint64_t peak_activations(const struct plan *p) {
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", &err);
  if (!prof)
    fail_msg("%s", err->message);
  struct sim_result *res = sim_run(p, prof, &(struct sim_options){.collapse = false}, &err);
  if (!res)
    fail_msg("%s", err->message);
  uint64_t act = res->units[res->device_unit[0]].peak_breakdown[REPORT_MEM_ACTIVATIONS];
  sim_result_free(res);
  profile_free(prof);
  return act;
}

/* The textbook figure: with CP N a rank's saved activations are exactly 1/N of the unsplit
 * sequence's, its workspaces 1/N plus the K/V its exchange holds (p2p, the ring: the block of
 * one rank's K/V, 1/N of the sequence's, arriving while it attends to the one it holds, in two
 * buffers that take turns (one at N = 2, whose only exchange brings the other rank's), and two
 * blocks of dK/dV more in B (exec/context_parallel.c, ring_backward); all_gather: the whole
 * sequence's K/V, and dK/dV in B), and the simulator's peak of activations (at the backward's
 * start: everything saved plus the backward's workspace) is the unsplit one / N plus the
 * backward's buffers. */
static void test_textbook_memory(void **state) {
  (void)state;
  static const struct {
    const char *layout;
    uint32_t n;
    uint64_t f_buf, b_buf;
  } cases[] = {{"cp=2", 2, KV_LAYER / 2, 3 * KV_LAYER / 2},
               {"cp=4", 4, 2 * KV_LAYER / 4, 4 * KV_LAYER / 4},
               {"cp=4,cp-comm=all_gather", 4, KV_LAYER, 2 * KV_LAYER}};
  struct compile_result one = compile_layout("pp=1");
  uint64_t saved = tensors(one.plan, PLAN_TENSOR_SAVED, IR_PASS_F, false);
  uint64_t f_work = tensors(one.plan, PLAN_TENSOR_WORK, IR_PASS_F, true);
  uint64_t b_work = tensors(one.plan, PLAN_TENSOR_WORK, IR_PASS_B, true);
  uint64_t peak = peak_activations(one.plan);
  assert_int_equal(peak, saved + b_work); /* what the split one is held to below */
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct compile_result r = compile_layout(cases[i].layout);
    uint32_t n = cases[i].n;
    assert_int_equal(tensors(r.plan, PLAN_TENSOR_SAVED, IR_PASS_F, false) * n, saved);
    assert_int_equal(tensors(r.plan, PLAN_TENSOR_WORK, IR_PASS_F, true),
                     f_work / n + cases[i].f_buf);
    assert_int_equal(tensors(r.plan, PLAN_TENSOR_WORK, IR_PASS_B, true),
                     b_work / n + cases[i].b_buf);
    assert_int_equal(peak_activations(r.plan), peak / n + cases[i].b_buf);
    compile_result_free(&r);
  }
  compile_result_free(&one);
}

/* The simulator runs each rank's share: a CP 2 forward costs less than the unsplit one, and the
 * ring's exchange overlaps its compute (it starts with it). */
static void test_sim_overlap(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", &err);
  if (!prof)
    fail_msg("%s", err->message);
  /* the overlap on the device: this tiny model is host-bound under the profile's host thread
   * (docs/sim.md, "The host thread"), which would start the compute when enqueued */
  prof->host_launch = 0;
  struct compile_result r = compile_layout("cp=2");
  const struct plan *p = r.plan;
  struct sim_result *res = sim_run(p, prof, &(struct sim_options){.collapse = false}, &err);
  if (!res)
    fail_msg("%s", err->message);
  const struct sim_unit *u = &res->units[res->device_unit[0]];
  double f_start = -1, f_end = -1, x_start = -1;
  for (uint32_t k = 0; k < u->n_intervals; k++) {
    const struct report_interval *iv = &u->intervals[k];
    const struct ir_node *n = &p->nodes[iv->node];
    if (n->pass != IR_PASS_F)
      continue;
    if (n->kind == IR_NODE_COMPUTE) {
      f_start = iv->start;
      f_end = iv->end;
      struct profile_cost whole = profile_compute_cost(prof, p->model, n->segment, IR_PASS_F, 1);
      assert_true(whole.seconds > 0);
    } else if (n->purpose == IR_COMM_CP) {
      x_start = iv->start;
    }
  }
  assert_true(f_start >= 0 && x_start >= 0);
  assert_true(x_start < f_end); /* overlapped, not after */
  test_assert_near(x_start, f_start, 1e-9, 0, "the exchange starts with its compute");
  sim_result_free(res);
  compile_result_free(&r);
  profile_free(prof);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_grid),     cmocka_unit_test(test_directive_errors),
      cmocka_unit_test(test_model_share),     cmocka_unit_test(test_exchange_nodes),
      cmocka_unit_test(test_textbook_memory), cmocka_unit_test(test_sim_overlap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
