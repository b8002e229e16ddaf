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
      {"pp=2,dp=4,ep=2", "ep must be 1 or equal to dp (4)"},
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bundled_files_are_layouts),
      cmocka_unit_test(test_shapes),
      cmocka_unit_test(test_layouts_compile),
      cmocka_unit_test(test_bad_specs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
