/* libFuzzer target for the compiler behind the parser: bytes -> program -> applied to the tiny
 * dense and MoE models -> lowered to plans (with the progress check). Besides "no crash, no
 * leak, no UBSan report", it checks that every refusal is one input-error line and that every
 * plan the compiler lowers passes the checks a plan read from files gets (plan_check_model,
 * plan_check_instructions): a compiled plan is never refused as edited. Programs that name
 * more than 16 devices or split into more than 16 micro-batches are skipped, so that one input
 * stays well under the fuzzer's time limit. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/json.h"
#include "../../directives/directives.h"
#include "../../ir/ir.h"
#include "../../ir/plan-impl.h"
#include "../../models/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_DEVICES 16
#define MAX_MICROBATCHES 16

static struct model *models[2];

static void load_models(void) {
  static const char *const paths[2] = {"models/tiny-dense.json", "models/tiny-moe.json"};
  for (int k = 0; k < 2; k++) {
    if (models[k])
      continue;
    GError *err = NULL;
    models[k] = model_load_file(paths[k], 0, &err);
    if (!models[k]) /* run from the repository root (make fuzz does) */
      abort();
  }
}

static bool small_enough(const struct dir_program *p) {
  if (p->max_device > MAX_DEVICES)
    return false;
  int64_t mb = 1;
  for (uint32_t i = 0; i < p->n; i++)
    if (p->d[i].op == DIR_SPLIT) {
      mb *= p->d[i].num_microbatches > 0 ? p->d[i].num_microbatches : 1;
      if (mb > MAX_MICROBATCHES)
        return false;
    }
  return true;
}

static void refused(GError *err) {
  /* every refusal is an input error, one line */
  if (!err || err->code != PIPER_ERROR_INPUT || strchr(err->message, '\n'))
    abort();
  g_error_free(err);
}

static void apply_and_lower(const struct model *m, const struct dir_program *p) {
  GError *err = NULL;
  struct ir_graph *g = ir_graph_build(m);
  if (!dir_program_apply(p, g, MAX_DEVICES, &err)) {
    refused(err);
    ir_graph_free(g);
    return;
  }
  struct plan *plan = plan_lower(g, NULL, &err);
  ir_graph_free(g);
  if (!plan) {
    refused(err);
    return;
  }
  if (!plan_check_model(plan, "fuzz", &err) || !plan_check_instructions(plan, "fuzz", &err)) {
    fprintf(stderr, "a lowered plan fails the reader's checks: %s\n", err->message);
    abort();
  }
  plan_free(plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  load_models();
  GError *err = NULL;
  cJSON *root = json_parse_buffer("fuzz.json", (const char *)data, size, &err);
  if (!root) {
    g_clear_error(&err);
    return 0;
  }
  struct dir_program *p = dir_program_parse_json("fuzz.json", root, &err);
  cJSON_Delete(root);
  if (!p) {
    refused(err);
    return 0;
  }
  if (small_enough(p))
    for (int k = 0; k < 2; k++)
      apply_and_lower(models[k], p);
  dir_program_free(p);
  return 0;
}
