/* libFuzzer target for the model loader: any bytes are parsed as JSON and loaded as a model
 * file. It must never crash, leak or hang, and a model that loads must come back identical
 * through model_to_json (the form plans embed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/json.h"
#include "../../models/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_round_trip(const struct model *m) {
  cJSON *j = model_to_json(m);
  struct model *back = model_load_json("fuzz-roundtrip.json", j, 0, NULL);
  /* A model that loaded must reload from its own normalised form to the same ops. */
  if (!back || strcmp(back->source_json, m->source_json) != 0 || back->n_ops != m->n_ops ||
      back->n_segments != m->n_segments || back->n_edges != m->n_edges ||
      memcmp(back->ops, m->ops, sizeof(struct model_op) * m->n_ops) != 0 ||
      memcmp(back->edges, m->edges, sizeof(struct model_edge) * m->n_edges) != 0)
    abort();
  model_free(back);
  cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  GError *err = NULL;
  cJSON *root = json_parse_buffer("fuzz.json", (const char *)data, size, &err);
  if (!root) {
    g_clear_error(&err);
    return 0;
  }
  /* The first byte also picks a --pp-regions override now and then, to cover that path. */
  int override = size > 0 && data[0] % 4 == 0 ? data[size - 1] % 10 : 0;
  struct model *m = model_load_json("fuzz.json", root, override, &err);
  if (m) {
    check_round_trip(m);
    model_free(m);
  } else {
    /* Every failure must say why. */
    if (!err || !err->message || !*err->message)
      abort();
    g_clear_error(&err);
  }
  cJSON_Delete(root);
  return 0;
}
