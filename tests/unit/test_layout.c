/* Tests of layouts from flags: the bundled base schedules that follow the usual rank order are
 * exactly what the layout writes; every generated layout compiles to the devices and stages it
 * says; bad specs are input errors naming the key. Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <glib/gstdio.h>
#include <string.h>

#include "../../directives/compile.h"
#include "../../directives/layout.h"

static struct layout parse(const char *spec) {
  GError *err = NULL;
  struct layout l;
  if (!layout_parse(spec, &l, &err))
    fail_msg("%s: %s", spec, err->message);
  return l;
}

static void test_bundled_files_are_layouts(void **state) {
  (void)state;
  static const struct {
    const char *spec, *file;
  } cases[] = {
      {"dp=2", "dp2.json"},
      {"pp=4", "pp4.json"},
      {"pp=8", "pp8.json"},
      {"pp=4,v", "pp4_v.json"},
      {"pp=4,interleave=2", "pp4_interleaved.json"},
      {"pp=2,dp=2,ep=2", "pp2_dp2_ep2.json"},
      {"pp=2,dp=2,ep=2,zero=2", "pp2_dp2_ep2_zero2.json"},
      {"pp=2,dp=2,ep=2,zero=3", "pp2_dp2_ep2_zero3.json"},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct layout l = parse(cases[i].spec);
    char *path = g_build_filename("directives/base-schedules", cases[i].file, NULL);
    char *want = NULL;
    if (!g_file_get_contents(path, &want, NULL, NULL))
      fail_msg("cannot read %s", path);
    char *got = layout_to_json(&l);
    if (strcmp(got, want) != 0)
      fail_msg("%s: layout differs from %s:\n%s", cases[i].spec, path, got);
    g_free(got);
    g_free(want);
    g_free(path);
  }
}

static void test_shapes(void **state) {
  (void)state;
  struct layout l = parse("pp=4,dp=2,ep=2,v");
  assert_int_equal(layout_stages(&l), 8);
  assert_int_equal(layout_devices(&l), 8);
  uint32_t v_ranks[] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (uint32_t s = 0; s < 8; s++)
    assert_int_equal(layout_stage_rank(&l, s), v_ranks[s]);
  l = parse("pp=3, interleave=3");
  assert_int_equal(layout_stages(&l), 9);
  assert_int_equal(layout_stage_rank(&l, 7), 1);
  l = parse("pp=16,dp=128,ep=128,v");
  assert_int_equal(layout_devices(&l), 2048);
  l = parse("pp=4,dp=2,tp=8,sp"); /* a rank holds dp x tp devices */
  assert_int_equal(layout_devices(&l), 64);
  assert_true(l.sequence_parallel);
  assert_int_equal(l.n_recompute, 0);
  l = parse("pp=2,dp=2,zero=1,recompute=selective");
  assert_int_equal(l.zero, 1);
  assert_int_equal(l.n_recompute, 1);
  assert_int_equal(l.recompute[0].granularity, IR_RECOMPUTE_SELECTIVE);
  assert_true(l.recompute[0].all_stages);
  l = parse("pp=4,recompute@0-2=full:uniform:2,recompute@3=full:block:1");
  assert_int_equal(l.n_recompute, 2);
  assert_int_equal(l.recompute[0].method, DIR_RECOMPUTE_UNIFORM);
  assert_int_equal(l.recompute[0].num_layers, 2);
  assert_int_equal(l.recompute[0].first_stage, 0);
  assert_int_equal(l.recompute[0].last_stage, 2);
  assert_false(l.recompute[0].all_stages);
  assert_int_equal(l.recompute[1].method, DIR_RECOMPUTE_BLOCK);
  assert_int_equal(l.recompute[1].first_stage, 3);
  assert_int_equal(l.recompute[1].last_stage, 3);
  l = parse("pp=2,recompute=selective:layernorm+mla_up_proj:uniform:1");
  assert_int_equal(l.recompute[0].granularity, IR_RECOMPUTE_SELECTIVE);
  assert_int_equal(l.recompute[0].modules, MODEL_MODULE_BIT(MODEL_MODULE_LAYERNORM) |
                                               MODEL_MODULE_BIT(MODEL_MODULE_MLA_UP_PROJ));
  assert_int_equal(l.recompute[0].method, DIR_RECOMPUTE_UNIFORM);
  assert_int_equal(l.recompute[0].num_layers, 1);
  l = parse("pp=2,recompute=selective:block:3");
  assert_int_equal(l.recompute[0].modules, 0);
  assert_int_equal(l.recompute[0].method, DIR_RECOMPUTE_BLOCK);
  /* the EP options go on every shard line, and only there */
  l = parse("pp=2,dp=2,ep=2,capacity=1.25,fp8-expert-inputs");
  assert_true(l.capacity_factor == 1.25 && l.fp8_expert_inputs);
  char *text = layout_to_json(&l);
  const char *shard = strstr(text, "\"op\": \"shard\"");
  assert_non_null(shard);
  assert_non_null(strstr(shard, "\"capacity_factor\": 1.25, \"fp8_expert_inputs\": true}"));
  size_t shards = 0, options = 0;
  for (const char *q = text; (q = strstr(q, "\"op\": \"shard\"")); q++)
    shards++;
  for (const char *q = text; (q = strstr(q, "fp8_expert_inputs")); q++)
    options++;
  assert_int_equal(shards, 2); /* one a stage */
  assert_int_equal(options, shards);
  g_free(text);
}

/* Each layout compiles with the model and gives the devices and pipeline ranks it promises. */
static void test_layouts_compile(void **state) {
  (void)state;
  static const struct {
    const char *spec, *model, *schedule;
    uint32_t mbs;
  } cases[] = {
      {"pp=2,dp=2,ep=2", "models/tiny-moe.json", "1f1b", 4},
      {"pp=2,dp=2,ep=2,v", "models/tiny-moe.json", "dualpipev", 4},
      {"pp=2,dp=2,ep=2,interleave=2", "models/tiny-moe.json", "interleaved_1f1b", 4},
      {"pp=4,dp=2,zero=3", "models/tiny-dense.json", "zerobubble", 4},
      {"pp=2,dp=2,zero=1,recompute=full", "models/tiny-dense.json", "1f1b", 4},
      {"pp=2,dp=2,ep=2,recompute=selective", "models/tiny-moe.json", "1f1b", 4},
      {"pp=2,recompute@0=full:uniform:1,recompute@1=selective", "models/tiny-dense.json", "1f1b", 4},
      {"pp=2,dp=2,ep=2,recompute=full:block:1", "models/tiny-moe.json", "1f1b", 4},
      {"dp=4,ep=4", "models/tiny-moe.json", NULL, 2},
      {"pp=1", "models/tiny-dense.json", NULL, 1},
      {"pp=2,dp=2,ep=2,tp=2,sp", "models/tiny-moe.json", "1f1b", 4},
      {"tp=2", "models/tiny-dense.json", NULL, 1},
      {"pp=2,dp=4,ep=2", "models/tiny-moe.json", "1f1b", 4},
      {"dp=4,ep=2,zero=1", "models/tiny-moe.json", NULL, 2},
      {"tp=2,dp=2,ep=4,etp=1,sp", "models/tiny-moe.json", NULL, 2},
      {"pp=2,tp=2,dp=4,ep=2,sp,zero=2", "models/tiny-moe.json", "1f1b", 4},
      {"pp=2,dp=4,ep=2,v,zero=1", "models/tiny-moe.json", "dualpipev", 4},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct layout l = parse(cases[i].spec);
    char *dir = g_dir_make_tmp("piper-layout-XXXXXX", NULL);
    char *path = g_build_filename(dir, "layout.json", NULL);
    char *text = layout_to_json(&l);
    assert_true(g_file_set_contents(path, text, -1, NULL));
    struct compile_options o = compile_options_default();
    o.model_path = cases[i].model;
    o.directives_path = path;
    o.pp_regions = (int)layout_stages(&l);
    o.schedule.mbs = cases[i].mbs;
    if (cases[i].schedule) {
      o.have_schedule = true;
      assert_true(sched_family_parse(cases[i].schedule, &o.schedule.family));
    }
    struct compile_result r;
    GError *err = NULL;
    if (!compile_run(&o, &r, &err))
      fail_msg("%s: %s", cases[i].spec, err->message);
    assert_int_equal(r.plan->n_devices, layout_devices(&l));
    assert_int_equal(r.ranks, l.pp);
    compile_result_free(&r);
    remove(path);
    g_rmdir(dir);
    g_free(text);
    g_free(path);
    g_free(dir);
  }
}

static void test_bad_specs(void **state) {
  (void)state;
  static const struct {
    const char *spec, *want;
  } cases[] = {
      {"", "--layout: empty"},
      {"pp=0", "\"pp\" must be a whole number in [1, 65536]"},
      {"pp=2,xp=2", "unknown key \"xp\""},
      {"pp=2,pp=4", "\"pp\" is given twice"},
      {"pp=2,dp=2,v, v", "\"v\" is given twice"},
      {"tp=2,sp,zero=1,dp=2,zero=2", "\"zero\" is given twice"},
      {"pp=2,sp", "sp (sequence parallelism) needs tp of at least 2"},
      {"pp=2,tp=0", "\"tp\" must be a whole number in [1, 1024]"},
      {"pp=2,w", "unknown item \"w\""},
      {"pp=2,dp=4,ep=3", "ep=3 x etp=1 (etp defaults to tp) does not divide the 4 ranks"},
      {"tp=2,dp=2,ep=4,sp", "ep=4 x etp=2 (etp defaults to tp) does not divide the 4 ranks"},
      {"tp=2,dp=2,ep=4,etp=1", "etp=1 below tp=2 needs sp"},
      {"tp=4,dp=2,ep=2,etp=3,sp", "etp=3 must divide tp=4"},
      {"dp=4,etp=2", "etp (expert tensor parallelism) needs ep of at least 2"},
      {"pp=2,interleave=2,v", "interleave and v exclude each other"},
      {"pp=2,zero=1", "zero=1 needs dp of at least 2"}, /* ZeRO-1 itself is accepted */
      {"pp=2,recompute=all", "\"recompute=all\" must be full, full:uniform:N"},
      {"pp=2,recompute=full:uniform", "must be full, full:uniform:N"},
      {"pp=2,recompute=full:stripes:2", "must be full, full:uniform:N"},
      {"pp=2,recompute=full:block:0", "must be full, full:uniform:N"},
      {"pp=2,recompute=selective:uniform", "must be full, full:uniform:N"},
      {"pp=2,recompute=full:mlp", "must be full, full:uniform:N"},
      {"pp=2,recompute=selective:mlp+mlp", "must be full, full:uniform:N"},
      {"pp=2,recompute=selective:attn", "must be full, full:uniform:N"},
      {"pp=2,recompute@2=full", "recompute@2-2 names a stage past the layout's 2"},
      {"pp=2,recompute@1-0=full", "stages must be @A or @A-B with A <= B"},
      {"pp=2,recompute@x=full", "stages must be @A or @A-B"},
      {"pp=4,recompute@0-2=full,recompute@2-3=selective", "two recompute items cover one stage"},
      {"pp=4,recompute=full,recompute@3=selective", "two recompute items cover one stage"},
      {"pp=2,zero=2", "zero=2 needs dp of at least 2"},
      {"pp=2,capacity=1.5", "capacity applies to expert parallelism: it needs ep of at least 2"},
      {"pp=2,dp=2,fp8-expert-inputs", "fp8-expert-inputs applies to expert parallelism"},
      {"pp=2,dp=2,ep=2,capacity=0.9", "\"capacity\" must be a number in [1, 1024]"},
      {"pp=2,dp=2,ep=2,capacity=x", "\"capacity\" must be a number"},
      {"pp=65536,dp=65536", "more than"},
      {"dp=x", "\"dp\" must be a whole number"},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    GError *err = NULL;
    struct layout l;
    assert_false(layout_parse(cases[i].spec, &l, &err));
    assert_int_equal(err->code, PIPER_ERROR_INPUT);
    if (!strstr(err->message, cases[i].want))
      fail_msg("%s: \"%s\" lacks \"%s\"", cases[i].spec, err->message, cases[i].want);
    g_error_free(err);
  }
}

/* The expert groups a layout carves, against Megatron's expert rank order within a stage
 * (parallel_state.py: ETP innermost, then EP, then expert DP over the TP x CP x DP positions):
 * position p has EP rank (p / etp) mod ep, its all-to-all peers are the positions of its
 * block of ep x etp with its ETP rank, and its experts' gradients are summed with the
 * positions p mod (ep x etp) + k ep etp. */
static void test_expert_groups(void **state) {
  (void)state;
  static const char *const specs[] = {"dp=4,ep=2,zero=1",         "tp=2,dp=2,ep=4,etp=1,sp",
                                      "tp=2,dp=4,ep=2,sp,zero=1", "tp=2,dp=4,ep=2,etp=1,sp",
                                      "cp=2,dp=2,ep=2,zero=1",    "cp=2,tp=2,ep=2,etp=1,sp"};
  for (size_t i = 0; i < G_N_ELEMENTS(specs); i++) {
    struct layout l = parse(specs[i]);
    char *text = layout_to_json(&l);
    char *dir = g_dir_make_tmp("piper-layout-XXXXXX", NULL);
    char *path = g_build_filename(dir, "layout.json", NULL);
    assert_true(g_file_set_contents(path, text, -1, NULL));
    struct compile_options o = compile_options_default();
    o.model_path = "models/tiny-moe.json";
    o.directives_path = path;
    o.schedule.mbs = 2;
    struct compile_result r;
    GError *err = NULL;
    if (!compile_run(&o, &r, &err))
      fail_msg("%s: %s", specs[i], err->message);
    const struct plan *p = r.plan;
    uint32_t etp = layout_expert_tp(&l), ep = l.ep, span = ep * etp, S = layout_stage_ranks(&l);
    uint32_t seen_ep = 0, seen_edp = 0, members[64];
    for (uint32_t c = 0; c < p->n_comms; c++) {
      const struct plan_comm *pc = &p->comms[c];
      bool a2a = pc->purpose == IR_COMM_EP, edp = pc->purpose == IR_COMM_DP && pc->split == span;
      if (!a2a && !edp)
        continue;
      assert_int_equal(plan_comm_size(p, c), a2a ? ep : S / span);
      for (uint32_t d = 0; d < p->n_devices; d++) { /* one stage: device = position */
        plan_comm_members(p, c, d, members);
        for (uint32_t k = 0; k < plan_comm_size(p, c); k++) {
          uint32_t want = a2a ? d - d % span + d % etp + k * etp : d % span + k * span;
          if (members[k] != want)
            fail_msg("%s: %s communicator of device %u: member %u is %u, not %u", specs[i],
                     a2a ? "ep" : "expert-dp", d, k, members[k], want);
        }
        assert_int_equal(plan_comm_rank(p, c, d), a2a ? (d / etp) % ep : d / span);
      }
      seen_ep += a2a;
      seen_edp += edp;
    }
    if (!seen_ep || (S / span > 1 && !seen_edp))
      fail_msg("%s: no ep (%u) or expert-dp (%u) communicator", specs[i], seen_ep, seen_edp);
    compile_result_free(&r);
    remove(path);
    g_rmdir(dir);
    g_free(path);
    g_free(dir);
    g_free(text);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bundled_files_are_layouts),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_layouts_compile),
      cmocka_unit_test(test_bad_specs),
      cmocka_unit_test(test_expert_groups),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
