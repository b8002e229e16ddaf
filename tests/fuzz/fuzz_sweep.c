/* libFuzzer target for the sweep file (tools/sweep.c's sweep_load_file): the fuzzer's bytes are
 * written to a file and loaded. A refused file must say why in one input-error line; an accepted
 * one must hold a non-empty grid. Nothing is compiled or simulated (that is sweep_run). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../base/base.h"
#include "../../tools/sweep.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One file per fuzzing process, rewritten for every input and removed at exit. */
static char path_buf[64];

static void remove_file(void) {
  remove(path_buf);
}

static const char *sweep_path(void) {
  if (!path_buf[0]) {
    snprintf(path_buf, sizeof path_buf, "/tmp/piper-fuzz-sweep-%ld.json", (long)getpid());
    atexit(remove_file);
  }
  return path_buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *f = fopen(sweep_path(), "wb");
  if (!f)
    abort();
  if ((size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
    abort();
  GError *err = NULL;
  struct sweep *s = sweep_load_file(sweep_path(), &err);
  if (s) {
    if (!s->model || !s->n_bases || !s->n_schedules || !s->n_mbs || !s->n_profiles)
      abort();
    for (uint32_t i = 0; i < s->n_mbs; i++)
      if (s->mbs[i] == 0)
        abort();
    sweep_free(s);
  } else if (!err || !err->message[0] || strchr(err->message, '\n') ||
             err->code != PIPER_ERROR_INPUT) {
    abort();
  }
  g_clear_error(&err);
  return 0;
}
