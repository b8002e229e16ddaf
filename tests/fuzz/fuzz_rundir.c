/* libFuzzer target for piper-compare's run-directory reader (report_dir_load): the input is
 * split at each line "=====" into metrics.json, results.csv, trace.json and the directive
 * program (x_pp1_mbs1.json), written into a temporary directory and loaded. Loading must
 * succeed or fail with one input-error line, never crash, leak or hang; what loads is then
 * paired with itself node by node, as piper-compare does. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../../report/report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const file_names[] = {"metrics.json", "results.csv", "trace.json",
                                         "x_pp1_mbs1.json"};
#define N_FILES (sizeof file_names / sizeof *file_names)
static const char separator[] = "\n=====\n";

static char *dir;

static void remove_dir(void) {
  for (size_t k = 0; k < N_FILES; k++) {
    char *path = g_build_filename(dir, file_names[k], NULL);
    g_unlink(path);
    g_free(path);
  }
  g_rmdir(dir);
  g_free(dir);
}

/* Writes part k of the input (absent parts: no file). */
static void write_part(size_t k, const uint8_t *at, size_t len, bool present) {
  char *path = g_build_filename(dir, file_names[k], NULL);
  g_unlink(path);
  if (present) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(at, 1, len, f) != len || fclose(f) != 0)
      abort(); /* the fuzzer's own directory: nothing to learn from a failure here */
  }
  g_free(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir) {
    dir = g_dir_make_tmp("fuzz_rundir-XXXXXX", NULL);
    if (!dir)
      abort();
    atexit(remove_dir);
  }
  const uint8_t *at = data, *end = data + size;
  size_t sep = sizeof separator - 1;
  for (size_t k = 0; k < N_FILES; k++) {
    const uint8_t *next = NULL;
    for (const uint8_t *p = at; p && p + sep <= end; p++)
      if (memcmp(p, separator, sep) == 0) {
        next = p;
        break;
      }
    bool present = at <= end && (k == 0 || at > data);
    size_t len = present ? (size_t)((next ? next : end) - at) : 0;
    write_part(k, at, len, present);
    at = next ? next + sep : end + 1;
  }
  GError *err = NULL;
  struct report_dir *d = report_dir_load(dir, &err);
  if (d) {
    uint32_t n = 0, only_a = 0, only_b = 0;
    struct report_node_pair *pairs = report_pair_nodes(d, d, &n, &only_a, &only_b);
    if (only_a || only_b || n != d->n_trace_nodes)
      abort(); /* a run pairs with itself completely */
    for (uint32_t k = 0; k < d->n_trace_steps; k++) {
      double t0, t1;
      report_dir_step_window(d, k, NULL, &t0, &t1);
    }
    g_free(pairs);
    report_dir_free(d);
  } else if (!err || !err->message[0] || strchr(err->message, '\n') ||
             err->code != PIPER_ERROR_INPUT) {
    abort();
  }
  g_clear_error(&err);
  return 0;
}
