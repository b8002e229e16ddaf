/* Tests of the run report's charts (report/chart.h) on a run filled the way the executor fills
 * it (every device its own intervals, sorted by start, and its own memory timeline), and of the
 * guarantee that a chart is written whole or not at all: a full disk, a missing directory, a
 * gnuplot script that fails or draws nothing are errors naming the file. Run from the repo
 * root; gnuplot is a dependency (tools/install-deps.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cairo.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/json.h"
#include "../../directives/compile.h"
#include "../../report/chart.h"
#include "../../report/report.h"

/* The plan of a model and a directive file, or the test fails. */
static struct plan *plan_of(const char *model_path, const char *directives_path) {
  GError *err = NULL;
  struct plan *plan = compile_plan(model_path, directives_path, NULL, 0, &err);
  if (!plan)
    fail_msg("%s: %s", directives_path, err->message);
  return plan;
}

/* A measured-looking run: each device runs its instructions back to back on their streams,
 * 1 ms each, and holds 1 MiB more activations after each compute. */
struct fake_run {
  struct report_run run;
  struct report_interval **intervals;
  struct report_memory_point **memory;
};

static void fake_run_init(struct fake_run *f, const struct plan *p) {
  memset(f, 0, sizeof *f);
  f->run = (struct report_run){.plan = p, .kind = "exec", .schedule = "custom"};
  report_run_init_devices(&f->run);
  f->intervals = g_new0(struct report_interval *, p->n_devices);
  f->memory = g_new0(struct report_memory_point *, p->n_devices);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    f->intervals[d] = g_new0(struct report_interval, c->n_instrs + 1);
    f->memory[d] = g_new0(struct report_memory_point, c->n_instrs + 1);
    uint64_t held = 0;
    uint32_t n_memory = 0;
    for (uint32_t i = 0; i < c->n_instrs; i++) {
      double t = 1e-3 * (d + i);
      f->intervals[d][i] = (struct report_interval){t, t + 1e-3, c->instrs[i].node,
                                                    c->instrs[i].stream, 0};
      if (report_node_is_compute(&p->nodes[c->instrs[i].node])) {
        held += 1u << 20;
        f->memory[d][n_memory].t = t + 1e-3;
        f->memory[d][n_memory].bytes[REPORT_MEM_ACTIVATIONS] = held;
        n_memory++;
      }
    }
    struct report_device *rd = &f->run.devices[d];
    rd->n_intervals = c->n_instrs;
    rd->intervals = f->intervals[d];
    rd->n_memory = n_memory;
    rd->memory = f->memory[d];
    rd->peak_memory_bytes = held;
    rd->peak_breakdown[REPORT_MEM_ACTIVATIONS] = held;
  }
  report_compute_stats(&f->run);
}

static void fake_run_free(struct fake_run *f) {
  for (uint32_t d = 0; d < f->run.n_devices; d++) {
    g_free(f->intervals[d]);
    g_free(f->memory[d]);
  }
  g_free(f->intervals);
  g_free(f->memory);
  report_run_free_devices(&f->run);
}

static char *read_text(const char *path, gsize *len) {
  char *text = NULL;
  if (!g_file_get_contents(path, &text, len, NULL))
    fail_msg("cannot read %s", path);
  return text;
}

static void assert_starts_with_file(const char *dir, const char *name, const char *sig) {
  char *path = g_build_filename(dir, name, NULL);
  gsize len = 0;
  char *data = read_text(path, &len);
  if (len < strlen(sig) || memcmp(data, sig, strlen(sig)) != 0)
    fail_msg("%s does not start with its signature", path);
  g_free(data);
  g_free(path);
}

static void remove_dir(const char *dir) {
  char *cmd = g_strdup_printf("rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  g_free(cmd);
}

static void test_charts_of_a_measured_run(void **state) {
  (void)state;
  struct plan *p = plan_of("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json");
  struct fake_run f;
  fake_run_init(&f, p);
  char dir[] = "/tmp/test_report_XXXXXX";
  assert_non_null(g_mkdtemp(dir));
  GError *err = NULL;
  GString *written = g_string_new("");
  if (!report_write_charts(&f.run, dir, CHART_PDF, written, &err))
    fail_msg("%s", err->message);
  assert_string_equal(written->str, " schedule.pdf schedule.png schedule.svg memory.png");
  assert_starts_with_file(dir, "schedule.png", "\x89PNG");
  assert_starts_with_file(dir, "schedule.svg", "<?xml");
  assert_starts_with_file(dir, "schedule.pdf", "%PDF");
  assert_starts_with_file(dir, "memory.png", "\x89PNG");
  assert_starts_with_file(dir, "memory.dat", "# device 0 (pp 0, dp 0)\n");
  /* the script draws memory.png when a user re-runs it, standard output when piper does */
  char *gp = g_build_filename(dir, "memory.gp", NULL);
  char *script = read_text(gp, NULL);
  assert_non_null(strstr(script, "if (!exists(\"piper_stdout\")) set output 'memory.png'\n"));
  g_free(script);
  g_free(gp);
  /* nothing half-written is left behind */
  char *tmp = g_build_filename(dir, "schedule.png.tmp", NULL);
  assert_false(g_file_test(tmp, G_FILE_TEST_EXISTS));
  g_free(tmp);
  g_string_free(written, TRUE);
  remove_dir(dir);
  fake_run_free(&f);
  plan_free(p);
}

/* A measured run that kept three steps (numbered 5, 6, 7) of durations 1, 2 and 4 ms per
 * instruction: trace.json holds every step, each event its step and node; read back, every node
 * has three events and the median duration 2 ms, and the run pairs with itself exactly. */
/* Writes the fake run as a run directory under a new dir (a mkdtemp template) and reads it
 * back, or the test fails. */
static struct report_dir *write_and_load(struct fake_run *f, char *dir) {
  f->run.program_file = "custom_pp2_mbs4.json";
  assert_non_null(g_mkdtemp(dir));
  GError *err = NULL;
  if (!report_write_dir(&f->run, dir, &err))
    fail_msg("%s", err->message);
  struct report_dir *rd = report_dir_load(dir, &err);
  if (!rd)
    fail_msg("%s", err->message);
  return rd;
}

static void test_trace_of_every_step(void **state) {
  (void)state;
  struct plan *p =
      plan_of("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json");
  struct fake_run f;
  fake_run_init(&f, p);
  static const uint32_t steps[] = {5, 6, 7};
  static const double dur[] = {1e-3, 2e-3, 4e-3};
  struct report_interval **all = g_new0(struct report_interval *, p->n_devices);
  uint32_t **begin = g_new0(uint32_t *, p->n_devices);
  uint32_t n_nodes = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    uint32_t n = f.run.devices[d].n_intervals;
    n_nodes += n;
    all[d] = g_new(struct report_interval, 3 * n + 1);
    begin[d] = g_new(uint32_t, 4);
    for (uint32_t k = 0; k < 3; k++) {
      begin[d][k] = k * n;
      for (uint32_t i = 0; i < n; i++) {
        struct report_interval v = f.run.devices[d].intervals[i];
        v.start += 1.0 * k;
        v.end = v.start + dur[k];
        all[d][k * n + i] = v;
      }
    }
    begin[d][3] = 3 * n;
    f.run.devices[d].all_intervals = all[d];
    f.run.devices[d].step_begin = begin[d];
  }
  f.run.n_trace_steps = 3;
  f.run.trace_steps = steps;
  char dir[] = "/tmp/test_report_XXXXXX";
  struct report_dir *rd = write_and_load(&f, dir);
  assert_int_equal(rd->n_trace_steps, 3);
  for (uint32_t k = 0; k < 3; k++)
    assert_int_equal(rd->trace_steps[k], steps[k]);
  assert_int_equal(rd->n_trace_nodes, n_nodes);
  assert_int_equal(rd->n_trace_events, 3 * (uint64_t)n_nodes);
  for (uint32_t i = 0; i < rd->n_trace_nodes; i++) {
    assert_int_equal(rd->trace_nodes[i].n_events, 3);
    /* the trace writes microseconds with 3 decimals */
    assert_true(fabs(rd->trace_nodes[i].median_s - 2e-3) < 1e-9);
  }
  double t0, t1;
  report_dir_step_window(rd, 1, NULL, &t0, &t1);
  assert_true(t0 >= 1.0 - 1e-9 && t1 < 2.0);
  uint32_t n = 0, only_a = 0, only_b = 0;
  struct report_node_pair *pairs = report_pair_nodes(rd, rd, &n, &only_a, &only_b);
  assert_int_equal(n, n_nodes);
  assert_int_equal(only_a + only_b, 0);
  for (uint32_t i = 0; i < n; i++) {
    assert_true(pairs[i].ratio == 1 && pairs[i].error == 0);
    assert_ptr_equal(pairs[i].a, pairs[i].b);
  }
  g_free(pairs);
  /* the comparison chart of the run against itself: a whole PNG */
  char *png = g_build_filename(dir, "compare.png", NULL);
  GError *err = NULL;
  if (!chart_compare(rd, rd, png, &err))
    fail_msg("%s", err->message);
  assert_starts_with_file(dir, "compare.png", "\x89PNG\r\n\x1a\n");
  g_free(png);
  report_dir_free(rd);
  remove_dir(dir);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    g_free(all[d]);
    g_free(begin[d]);
  }
  g_free(all);
  g_free(begin);
  fake_run_free(&f);
  plan_free(p);
}

/* Appends to an object of file name in dir (the top level, or its member obj_key when not "";
 * an array stands for its first element) a second copy of its member key: cJSON keeps both,
 * a reader sees the first. */
static void add_duplicate_key(const char *dir, const char *name, const char *obj_key,
                              const char *key) {
  char *file = g_build_filename(dir, name, NULL);
  GError *err = NULL;
  cJSON *root = json_parse_file(file, &err);
  if (!root)
    fail_msg("%s", err->message);
  cJSON *obj = cJSON_IsArray(root) ? cJSON_GetArrayItem(root, 0) : root;
  if (*obj_key)
    obj = cJSON_GetObjectItemCaseSensitive(obj, obj_key);
  if (cJSON_IsArray(obj))
    obj = cJSON_GetArrayItem(obj, 0);
  cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
  assert_non_null(item);
  cJSON_AddItemToObject(obj, key, cJSON_Duplicate(item, true));
  char *text = cJSON_PrintUnformatted(root);
  assert_true(g_file_set_contents(file, text, -1, NULL));
  cJSON_free(text);
  cJSON_Delete(root);
  g_free(file);
}

/* A key twice in any JSON file of a run directory is refused naming the file and the key
 * (it was read as its first value, and a second traceEvents list on top of the first). */
static void test_run_dir_duplicate_keys(void **state) {
  (void)state;
  struct plan *p = plan_of("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json");
  static const struct {
    const char *file, *obj, *key, *want;
  } cases[] = {
      {"metrics.json", "", "kind", "metrics.json: key \"kind\" appears twice"},
      {"trace.json", "", "traceEvents", "trace.json: key \"traceEvents\" appears twice"},
      {"trace.json", "traceEvents", "name",
       "trace.json: traceEvents[0]: key \"name\" appears twice"},
      {"trace.json", "otherData", "kind", "trace.json: otherData: key \"kind\" appears twice"},
      {"custom_pp2_mbs4.json", "", "op", "custom_pp2_mbs4.json: key \"op\" appears twice"},
  };
  for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
    struct fake_run f;
    fake_run_init(&f, p);
    char dir[] = "/tmp/test_report_XXXXXX";
    report_dir_free(write_and_load(&f, dir));
    add_duplicate_key(dir, cases[c].file, cases[c].obj, cases[c].key);
    GError *err = NULL;
    assert_null(report_dir_load(dir, &err));
    assert_non_null(err);
    assert_int_equal(err->code, PIPER_ERROR_INPUT);
    if (!strstr(err->message, cases[c].want))
      fail_msg("case %zu: %s", c, err->message);
    g_clear_error(&err);
    remove_dir(dir);
    fake_run_free(&f);
  }
  plan_free(p);
}

/* A communication's box may start after its post (the simulator's, when its parties meet):
 * the trace carries the wait, and durations read back (per node and per kind) run from the
 * post, as a measured box does, while the box itself stays where it was drawn. */
static void test_trace_wait_counts_in_durations(void **state) {
  (void)state;
  struct plan *p =
      plan_of("models/tiny-moe.json", "directives/base-schedules/pp2_dp2_ep2.json");
  struct fake_run f;
  fake_run_init(&f, p);
  uint32_t n_comm = 0;
  for (uint32_t d = 0; d < p->n_devices; d++)
    for (uint32_t i = 0; i < f.run.devices[d].n_intervals; i++) {
      struct report_interval *v = &f.intervals[d][i];
      if (!report_node_is_compute(&p->nodes[v->node])) {
        v->wait = 0.5e-3;
        n_comm++;
      }
    }
  assert_true(n_comm > 0);
  char dir[] = "/tmp/test_report_XXXXXX";
  struct report_dir *rd = write_and_load(&f, dir);
  uint64_t waited = 0;
  for (uint64_t e = 0; e < rd->n_trace_events; e++) {
    const struct report_trace_event *ev = &rd->trace_events[e];
    const struct report_trace_node *node = &rd->trace_nodes[ev->node];
    bool comm = node->ir_kind != IR_NODE_COMPUTE && node->ir_kind != IR_NODE_OPTIMIZER;
    assert_true(fabs(ev->dur_s - 1e-3) < 1e-9);
    assert_true(fabs(ev->wait_s - (comm ? 0.5e-3 : 0)) < 1e-9);
    assert_true(fabs(node->median_s - (comm ? 1.5e-3 : 1e-3)) < 1e-9);
    waited += comm;
  }
  assert_true(waited > 0);
  for (uint32_t k = 0; k < rd->n_trace_kinds; k++) {
    const struct report_trace_kind *kind = &rd->trace_kinds[k];
    double each = kind->total_s / (double)kind->count;
    assert_true(fabs(each - 1e-3) < 1e-9 || fabs(each - 1.5e-3) < 1e-9);
  }
  report_dir_free(rd);
  remove_dir(dir);
  fake_run_free(&f);
  plan_free(p);
}

static void test_chart_write_errors(void **state) {
  (void)state;
  struct plan *p = plan_of("models/tiny-moe.json", "directives/base-schedules/dp2.json");
  struct fake_run f;
  fake_run_init(&f, p);
  const enum chart_format formats[] = {CHART_PNG, CHART_SVG, CHART_PDF};
  for (int k = 0; k < 3; k++) {
    GError *err = NULL;
    /* a full disk: every write fails */
    if (g_file_test("/dev/full", G_FILE_TEST_EXISTS)) {
      assert_false(chart_schedule(&f.run, "/dev/full", formats[k], &err));
      assert_non_null(err);
      assert_non_null(strstr(err->message, "/dev/full"));
      assert_int_equal(err->code, PIPER_ERROR_RUNTIME);
      g_clear_error(&err);
    }
    assert_false(chart_schedule(&f.run, "/nonexistent-dir/schedule.png", formats[k], &err));
    assert_non_null(err);
    assert_non_null(strstr(err->message, "/nonexistent-dir/schedule.png"));
    g_clear_error(&err);
  }
  GError *err = NULL;
  assert_false(report_write_charts(&f.run, "/nonexistent-dir", CHART_PNG, NULL, &err));
  assert_non_null(err);
  g_clear_error(&err);
  fake_run_free(&f);
  plan_free(p);
}

static void write_script(const char *dir, const char *name, const char *text) {
  char *path = g_build_filename(dir, name, NULL);
  GError *err = NULL;
  if (!piper_write_file(path, text, strlen(text), &err))
    fail_msg("%s", err->message);
  g_free(path);
}

static void test_gnuplot_failures(void **state) {
  (void)state;
  char dir[] = "/tmp/test_report_XXXXXX";
  assert_non_null(g_mkdtemp(dir));
  GError *err = NULL;
  /* a script gnuplot rejects: its first line of stderr in the error */
  write_script(dir, "bad.gp", "set terminal pngcairo\nthis is not gnuplot\n");
  assert_false(chart_run_gnuplot(dir, "bad.gp", "bad.png", &err));
  assert_non_null(err);
  assert_non_null(strstr(err->message, "gnuplot failed"));
  g_clear_error(&err);
  /* a script that draws nothing: no PNG is not a PNG, and no file appears */
  write_script(dir, "empty.gp", "set terminal pngcairo\n" CHART_GNUPLOT_OUTPUT("empty.png"));
  assert_false(chart_run_gnuplot(dir, "empty.gp", "empty.png", &err));
  assert_non_null(err);
  assert_non_null(strstr(err->message, "not a complete PNG"));
  g_clear_error(&err);
  char *png = g_build_filename(dir, "empty.png", NULL);
  assert_false(g_file_test(png, G_FILE_TEST_EXISTS));
  g_free(png);
  /* a script that draws: the PNG comes out whole */
  write_script(dir, "ok.gp",
               "set terminal pngcairo size 200,100\n" CHART_GNUPLOT_OUTPUT("ok.png") "plot x\n");
  if (!chart_run_gnuplot(dir, "ok.gp", "ok.png", &err))
    fail_msg("%s", err->message);
  assert_starts_with_file(dir, "ok.png", "\x89PNG");
  remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_charts_of_a_measured_run),
      cmocka_unit_test(test_trace_of_every_step),
      cmocka_unit_test(test_trace_wait_counts_in_durations),
      cmocka_unit_test(test_run_dir_duplicate_keys),
      cmocka_unit_test(test_chart_write_errors),
      cmocka_unit_test(test_gnuplot_failures),
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
