/* libFuzzer target: the schedule CSV reader (directives/schedule_csv.c). Any input must either
 * be refused with an input error or read into a program whose CSV reads back to the same bytes
 * (the lossless round trip). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../directives/schedule.h"
#include "../../base/json.h"

static char *to_csv(const struct sched_program *s) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f || !sched_write_csv(s, f))
    abort();
  fclose(f);
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = '\0';
  GError *err = NULL;
  struct sched_program *s = sched_read_csv("fuzz.csv", text, size, &err);
  if (!s) {
    if (!err || err->domain != PIPER_ERROR || err->code != PIPER_ERROR_INPUT)
      abort();
    g_error_free(err);
    free(text);
    return 0;
  }
  char *once = to_csv(s);
  struct sched_program *back = sched_read_csv("fuzz.csv", once, strlen(once), &err);
  if (!back)
    abort();
  char *twice = to_csv(back);
  if (strcmp(once, twice) != 0)
    abort();
  free(once);
  free(twice);
  sched_program_free(back);
  sched_program_free(s);
  free(text);
  return 0;
}
