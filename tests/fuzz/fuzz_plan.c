/* libFuzzer target for the plan reader: the input is parsed as JSON of the form
 * {"index": <plan.json>, "devices": [<device-0.json>, ...]} and read with plan_from_json. It
 * must never crash, leak or hang; a failure must be one line in PIPER_ERROR_INPUT; and a plan
 * that reads must write and read back equal (through a temporary directory, which only the
 * rare valid inputs reach). Seeds are small lowered plans in that form. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../../base/json.h"
#include "../../ir/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Bounds the work one input can ask for: each device document is read in full. */
#define FUZZ_MAX_DEVICES 256

static char *dir;

static void remove_scratch(void) {
  GDir *d = g_dir_open(dir, 0, NULL);
  const char *name;
  while (d && (name = g_dir_read_name(d))) {
    char *path = g_build_filename(dir, name, NULL);
    g_remove(path);
    g_free(path);
  }
  if (d)
    g_dir_close(d);
  g_rmdir(dir);
}

static const char *scratch_dir(void) {
  if (!dir) {
    dir = g_dir_make_tmp("fuzz_plan-XXXXXX", NULL);
    if (!dir)
      abort();
    atexit(remove_scratch);
  }
  return dir;
}

static void check_error(GError *err) {
  if (!err || err->domain != PIPER_ERROR || err->code != PIPER_ERROR_INPUT || !err->message ||
      !*err->message || strchr(err->message, '\n'))
    abort();
}

static void check_round_trip(const struct plan *p) {
  GError *err = NULL;
  const char *dir = scratch_dir();
  if (!plan_write_dir(p, dir, &err))
    abort();
  struct plan *back = plan_read_dir(dir, &err);
  if (!back || !plan_equal(p, back))
    abort();
  plan_free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  GError *err = NULL;
  cJSON *root = json_parse_buffer("fuzz.json", (const char *)data, size, &err);
  if (!root) {
    g_clear_error(&err);
    return 0;
  }
  const cJSON *index = cJSON_GetObjectItemCaseSensitive(root, "index");
  const cJSON *devices = cJSON_GetObjectItemCaseSensitive(root, "devices");
  if (!cJSON_IsObject(index) || !cJSON_IsArray(devices))
    goto out;
  const cJSON *docs[FUZZ_MAX_DEVICES];
  uint32_t n = 0;
  for (const cJSON *d = devices->child; d; d = d->next) {
    if (n == FUZZ_MAX_DEVICES)
      goto out;
    docs[n++] = d;
  }
  struct plan *p = plan_from_json("fuzz", index, docs, n, &err);
  if (p) {
    if (!plan_equal(p, p))
      abort();
    check_round_trip(p);
    plan_free(p);
  } else {
    check_error(err);
    g_clear_error(&err);
  }
out:
  cJSON_Delete(root);
  return 0;
}
