/* libFuzzer target for the token-file reader (exec_data_open): the fuzzer's bytes are written to
 * a file and opened with a small and a large vocabulary. The reader must refuse with one input
 * error line or return a stream whose every token is below the vocabulary; it must never crash,
 * read outside the mapping, leak or hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../base/base.h"
#include "../../exec/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One file per fuzzing process, rewritten for every input and removed at exit. */
static char path_buf[64];

static void remove_file(void) {
  remove(path_buf);
}

static const char *data_path(void) {
  if (!path_buf[0]) {
    snprintf(path_buf, sizeof path_buf, "/tmp/piper-fuzz-data-%ld.bin", (long)getpid());
    atexit(remove_file);
  }
  return path_buf;
}

static void check_stream(const struct exec_data *d, int64_t vocab) {
  enum { BATCH = 2, SEQ = 7 };
  int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
  if (exec_data_tokens(d) < 2)
    abort();
  /* Blocks at the start, in the middle and far past the end (the stream wraps around). */
  const uint64_t blocks[] = {0, 1, exec_data_tokens(d) / 2, UINT64_C(1) << 40};
  for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
    exec_data_batch(d, blocks[b], BATCH, SEQ, tokens, targets);
    for (int i = 0; i < BATCH * SEQ; i++)
      if (tokens[i] < 0 || tokens[i] >= vocab || targets[i] < 0 || targets[i] >= vocab)
        abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *f = fopen(data_path(), "wb");
  if (!f)
    abort();
  if ((size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
    abort();
  /* 300: byte files are readable, token files must hold small ids; 70000: needs uint32 ids
   * for the largest of them. */
  const int64_t vocabs[] = {300, 70000};
  for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
    GError *err = NULL;
    struct exec_data *d = exec_data_open(data_path(), vocabs[v], 1, &err);
    if (d) {
      check_stream(d, vocabs[v]);
      exec_data_free(d);
    } else if (!err || !err->message[0] || strchr(err->message, '\n') ||
               err->code != PIPER_ERROR_INPUT) {
      abort();
    }
    g_clear_error(&err);
  }
  return 0;
}
