/* libFuzzer target for the checkpoint reader (exec_checkpoint_parse, then the comparison a
 * resume makes). It must never crash, leak or hang, and a refusal must be one line in
 * PIPER_ERROR_INPUT. Each input is read twice:
 *   - as it is, a whole checkpoint file (magic, version, sizes, checksum);
 *   - completed: its header and description kept, zero arrays appended and a correct checksum,
 *     so mutations of the description get past the checksum; what parses is compared with
 *     tiny-dense's one-device plan, as a resume would.
 * A real checkpoint of tiny-dense is 4 MB, over the fuzzer's input limit and slow to checksum:
 * the seeds (tests/fuzz/seeds/checkpoint) are real ones cut after the description, and the
 * arrays completed are at most FUZZ_MAX_PARAMS long (a description announcing more is then
 * refused for the mismatch, after it has been read). The *-cut seeds announce that many, in
 * the header and the description, and the reference plan is taken to have as many, so they
 * reach every comparison. Run from the repository root
 * (models/tiny-dense.json). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../../directives/compile.h"
#include "../../exec/exec-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Bounds the arrays of a completed input: a few thousand executions a second. */
#define FUZZ_MAX_PARAMS 4096u

static struct {
  bool ready;
  struct compile_result compiled;
  struct exec_model xm;
  struct exec_device dev;
  struct exec_checkpoint_meta now;
} ref;

static void ref_free(void) {
  exec_checkpoint_meta_clear(&ref.now);
  exec_device_clear(&ref.dev);
  exec_model_clear(&ref.xm);
  compile_result_free(&ref.compiled);
}

/* tiny-dense on one device, 2 micro-batches: what the seeds were written by. */
static void ref_init(void) {
  GError *err = NULL;
  char *dir = g_dir_make_tmp("fuzz_checkpoint-XXXXXX", NULL);
  char *program = dir ? g_build_filename(dir, "one.json", NULL) : NULL;
  if (!program || !g_file_set_contents(program, "[]", 2, NULL))
    abort();
  struct compile_options co = compile_options_default();
  co.model_path = "models/tiny-dense.json";
  co.directives_path = program;
  co.schedule.mbs = 2;
  bool ok = compile_run(&co, &ref.compiled, &err) &&
            exec_model_init(&ref.xm, ref.compiled.plan->model, &err) &&
            exec_device_init(&ref.dev, ref.compiled.plan, &ref.xm, 0, &err);
  g_remove(program);
  g_rmdir(dir);
  g_free(program);
  g_free(dir);
  if (!ok) {
    fprintf(stderr, "fuzz_checkpoint: %s (run from the repository root)\n", err->message);
    abort();
  }
  struct exec_options o = exec_options_default();
  exec_checkpoint_describe(&o, &ref.dev, NULL, 0, &ref.now);
  /* capped like the arrays, so a completed seed whose count was cut to match reaches every
   * comparison */
  ref.now.n_params = FUZZ_MAX_PARAMS;
  ref.ready = true;
  atexit(ref_free);
}

static void check_error(GError *err) {
  if (!err || err->domain != PIPER_ERROR || err->code != PIPER_ERROR_INPUT || !err->message ||
      !*err->message || strchr(err->message, '\n'))
    abort();
}

static void read_bytes(const char *bytes, size_t len, uint32_t allow) {
  GError *err = NULL;
  struct exec_checkpoint_file f;
  if (!exec_checkpoint_parse("fuzz.ckpt", bytes, len, &f, &err)) {
    check_error(err);
    g_clear_error(&err);
    return;
  }
  GString *notes = g_string_new(NULL);
  if (!exec_checkpoint_compare("fuzz.ckpt", &f.meta, &ref.now, allow, notes, &err))
    check_error(err);
  g_clear_error(&err);
  g_string_free(notes, TRUE);
  exec_checkpoint_file_clear(&f);
}

/* Header and description of the input, zero arrays of the announced size, a good checksum. */
static void read_completed(const uint8_t *data, size_t size) {
  const size_t hb = EXEC_CHECKPOINT_HEADER_BYTES;
  if (size < hb)
    return;
  uint32_t meta_bytes;
  uint64_t n_params;
  memcpy(&meta_bytes, data + 12, sizeof meta_bytes);
  memcpy(&n_params, data + 16, sizeof n_params);
  if (meta_bytes > size - hb)
    return;
  if (n_params > FUZZ_MAX_PARAMS)
    n_params = FUZZ_MAX_PARAMS;
  size_t arrays = 3 * (size_t)n_params * sizeof(float);
  size_t len = hb + meta_bytes + arrays + sizeof(uint64_t);
  char *buf = g_malloc0(len);
  memcpy(buf, data, hb + meta_bytes);
  memcpy(buf + 16, &n_params, sizeof n_params);
  uint64_t sum = piper_fnv1a(PIPER_FNV1A_INIT, buf, len - sizeof sum);
  memcpy(buf + len - sizeof sum, &sum, sizeof sum);
  /* the byte after the description, when there is one, picks what a resume allows */
  uint32_t allow = size > hb + meta_bytes ? data[hb + meta_bytes] : 0;
  read_bytes(buf, len, allow);
  g_free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ref.ready)
    ref_init();
  read_bytes((const char *)data, size, 0);
  read_completed(data, size);
  return 0;
}
