/* libFuzzer target for the directive parser: bytes -> JSON -> program -> JSON -> program.
 * Besides "no crash, no leak" it checks the round trip: a program that parses writes JSON that
 * parses again to the same written form, and a deep copy (dir_program_append) writes the same. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../directives/directives.h"
#include "../../base/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *to_text(const struct dir_program *p) {
  cJSON *json = dir_program_to_json(p);
  char *text = cJSON_PrintUnformatted(json);
  cJSON_Delete(json);
  return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  GError *err = NULL;
  cJSON *root = json_parse_buffer("fuzz.json", (const char *)data, size, &err);
  if (!root) {
    g_clear_error(&err);
    return 0;
  }
  struct dir_program *p = dir_program_parse_json("fuzz.json", root, &err);
  cJSON_Delete(root);
  if (!p) {
    /* every refusal is an input error, one line */
    if (!err || err->code != PIPER_ERROR_INPUT || strchr(err->message, '\n'))
      abort();
    g_clear_error(&err);
    return 0;
  }
  if (err)
    abort();

  char *text = to_text(p);
  if (!text)
    abort();
  cJSON *again = json_parse_buffer("again.json", text, strlen(text), &err);
  if (!again)
    abort();
  struct dir_program *q = dir_program_parse_json("again.json", again, &err);
  cJSON_Delete(again);
  if (!q || q->n != p->n || q->max_device != p->max_device)
    abort();
  char *text2 = to_text(q);
  if (strcmp(text, text2) != 0)
    abort();

  /* deep copies, then removal of one op, must stay consistent */
  struct dir_program *c = dir_program_new("copy");
  for (uint32_t i = 0; i < p->n; i++)
    dir_program_append(c, &p->d[i]);
  char *text3 = to_text(c);
  if (strcmp(text, text3) != 0 || c->max_device != p->max_device)
    abort();
  dir_program_remove_op(c, size ? (enum dir_op)(data[0] % 6) : DIR_PLACE);
  for (uint32_t i = 0; i < c->n; i++)
    if (c->d[i].index != i)
      abort();

  cJSON_free(text3);
  cJSON_free(text2);
  cJSON_free(text);
  dir_program_free(c);
  dir_program_free(q);
  dir_program_free(p);
  return 0;
}
