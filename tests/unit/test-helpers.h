/* test-helpers: what the cmocka unit tests share: cmocka's own prelude, temporary directories
 * and files, loading a model, compiling a plan, and the two comparisons every test makes (an
 * input error naming the fault; a figure within atol + rtol * |want|). Each helper fails the
 * current test with the reason instead of returning an error.
 *
 *   char *dir = test_tmp_dir("test_x-XXXXXX");
 *   char *path = g_build_filename(dir, "program.json", NULL);
 *   test_write_file(path, "[]");
 *   struct model *m = test_load_model("models/tiny-moe.json", 0);
 *   test_assert_near(model_param_count(m), 1e6, 0, 0.5, "parameters");
 *   model_free(m);
 *   g_free(path);
 *   test_remove_tree(dir);
 *   g_free(dir);
 */
#ifndef PIPER_TESTS_UNIT_TEST_HELPERS_H
#define PIPER_TESTS_UNIT_TEST_HELPERS_H

/* cmocka.h needs these first */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../../base/base.h"
#include "../../base/json.h"
#include "../../directives/compile.h"
#include "../../models/model.h"

/* |got - want| <= atol + rtol * |want|; false for NaN. */
static inline bool test_near(double got, double want, double atol, double rtol) {
  return fabs(got - want) <= atol + rtol * fabs(want);
}

static inline void test_assert_near(double got, double want, double atol, double rtol,
                                    const char *what) {
  if (!test_near(got, want, atol, rtol))
    fail_msg("%s: got %.12g, want %.12g", what, got, want);
}

/* An input error (PIPER_ERROR_INPUT) whose message contains substring. */
static inline void test_assert_input_error(const GError *err, const char *substring) {
  assert_non_null(err);
  assert_true(err->domain == PIPER_ERROR);
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  if (!strstr(err->message, substring))
    fail_msg("message \"%s\" lacks \"%s\"", err->message, substring);
}

/* A new directory under the system's temporary one; pattern ends in XXXXXX. */
static inline char *test_tmp_dir(const char *pattern) {
  GError *err = NULL;
  char *dir = g_dir_make_tmp(pattern, &err);
  if (!dir)
    fail_msg("tmp dir: %s", err->message);
  return dir;
}

/* Removes path and, for a directory, everything under it. */
static inline void test_remove_tree(const char *path) {
  GDir *d = g_dir_open(path, 0, NULL);
  if (d) {
    const char *name;
    while ((name = g_dir_read_name(d))) {
      char *child = g_build_filename(path, name, NULL);
      test_remove_tree(child);
      g_free(child);
    }
    g_dir_close(d);
    g_rmdir(path);
  } else {
    g_remove(path);
  }
}

/* The whole file, NUL-terminated; the caller g_frees it. */
static inline char *test_read_file(const char *path) {
  char *text = NULL;
  if (!g_file_get_contents(path, &text, NULL, NULL))
    fail_msg("cannot read %s", path);
  return text;
}

static inline void test_write_file(const char *path, const char *text) {
  GError *err = NULL;
  if (!g_file_set_contents(path, text, -1, &err))
    fail_msg("cannot write %s: %s", path, err->message);
}

/* pp > 0 overrides the file's PP split. */
static inline struct model *test_load_model(const char *path, int pp) {
  GError *err = NULL;
  struct model *m = model_load_file(path, pp, &err);
  if (!m)
    fail_msg("%s: %s", path, err->message);
  return m;
}

/* compile_run, which must succeed; the caller frees the result (compile_result_free). */
static inline struct compile_result test_compile(const struct compile_options *o) {
  struct compile_result r;
  GError *err = NULL;
  if (!compile_run(o, &r, &err))
    fail_msg("compile %s with %s: %s", o->model_path, o->directives_path, err->message);
  return r;
}

/* Applies a directive program given as JSON text to model m's graph; the graph, or NULL with
 * *err. */
static inline struct ir_graph *test_apply_text(const struct model *m, const char *text,
                                               GError **err) {
  cJSON *root = json_parse_buffer("test.json", text, strlen(text), err);
  if (!root)
    return NULL;
  struct dir_program *p = dir_program_parse_json("test.json", root, err);
  cJSON_Delete(root);
  if (!p)
    return NULL;
  struct ir_graph *g = ir_graph_build(m);
  bool ok = dir_program_apply(p, g, 0, err);
  dir_program_free(p);
  if (!ok) {
    ir_graph_free(g);
    return NULL;
  }
  return g;
}

/* test_apply_text, failing the test with the error. */
static inline struct ir_graph *test_must_apply(const struct model *m, const char *text) {
  GError *err = NULL;
  struct ir_graph *g = test_apply_text(m, text, &err);
  if (!g)
    fail_msg("%s", err->message);
  return g;
}

/* The program is refused with an input error naming substring. */
static inline void test_expect_apply_error(const struct model *m, const char *text,
                                           const char *substring) {
  GError *err = NULL;
  struct ir_graph *g = test_apply_text(m, text, &err);
  assert_null(g);
  test_assert_input_error(err, substring);
  g_error_free(err);
}

#endif
