/* base errors: the PIPER_ERROR domain, one-line messages, assertions, program exits. */
#include "base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

G_DEFINE_QUARK(piper - error - quark, piper_error)

/* Sets err to msg with control characters as \xNN, so an error is always one line. */
static void set_one_line(GError **err, int code, const char *fmt, va_list ap) {
  char *msg = g_strdup_vprintf(fmt, ap);
  GString *line = g_string_sized_new(strlen(msg));
  for (const unsigned char *c = (const unsigned char *)msg; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      g_string_append_printf(line, "\\x%02x", *c);
    else
      g_string_append_c(line, (char)*c);
  g_set_error_literal(err, PIPER_ERROR, code, line->str);
  g_string_free(line, TRUE);
  g_free(msg);
}

bool piper_input_error(GError **err, const char *fmt, ...) {
  if (err && !*err) {
    va_list ap;
    va_start(ap, fmt);
    set_one_line(err, PIPER_ERROR_INPUT, fmt, ap);
    va_end(ap);
  }
  return false;
}

bool piper_runtime_error(GError **err, const char *fmt, ...) {
  if (err && !*err) {
    va_list ap;
    va_start(ap, fmt);
    set_one_line(err, PIPER_ERROR_RUNTIME, fmt, ap);
    va_end(ap);
  }
  return false;
}

char *piper_quote(const char *s, size_t len, size_t max) {
  GString *q = g_string_new("\"");
  size_t i = 0;
  for (; i < len && s[i] && i < max; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      g_string_append_printf(q, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f)
      g_string_append_printf(q, "\\x%02x", c);
    else
      g_string_append_c(q, (char)c);
  }
  g_string_append(q, i < len && s[i] ? "\"..." : "\"");
  return g_string_free(q, FALSE);
}

_Noreturn void piper_assert_fail(const char *cond, const char *file, int line, const char *func) {
  fprintf(stderr, "piper: assertion failed: %s (%s:%d, %s)\n", cond, file, line, func);
  fflush(stderr);
  abort();
}

int piper_error_exit(const char *program, GError *err) {
  fprintf(stderr, "%s: error: %s\n", program, err ? err->message : "unknown error");
  int code = err && err->domain == PIPER_ERROR && err->code == PIPER_ERROR_RUNTIME ? 1 : 2;
  if (err)
    g_error_free(err);
  return code;
}

static bool usage_quiet;

void piper_usage_error_quiet(bool quiet) {
  usage_quiet = quiet;
}

int piper_usage_error(const char *program, const char *fmt, ...) {
  if (usage_quiet)
    return 2;
  va_list ap;
  va_start(ap, fmt);
  char *what = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: error: %s (see %s --help)\n", program, what, program);
  g_free(what);
  return 2;
}

bool piper_parse_u32(const char *text, uint32_t lo, uint32_t hi, uint32_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || end == text || *end || v < (long long)lo || v > (long long)hi)
    return false;
  *out = (uint32_t)v;
  return true;
}

bool piper_parse_double(const char *text, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end || !(v >= lo && v <= hi))
    return false;
  *out = v;
  return true;
}
