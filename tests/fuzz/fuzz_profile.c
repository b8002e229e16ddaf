/* libFuzzer target for the hardware-profile parser: any bytes are parsed as JSON and loaded as a
 * profile. It must never crash, leak or hang; a refused profile must say why in one line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/json.h"
#include "../../sim/profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  GError *err = NULL;
  cJSON *root = json_parse_buffer("fuzz.json", (const char *)data, size, &err);
  if (!root) {
    g_clear_error(&err);
    return 0;
  }
  struct profile *p = profile_parse_json("fuzz.json", root, &err);
  if (p) {
    profile_free(p);
  } else if (!err || !err->message[0] || strchr(err->message, '\n') ||
             err->code != PIPER_ERROR_INPUT) {
    abort();
  }
  g_clear_error(&err);
  cJSON_Delete(root);
  return 0;
}
