/* json: file parsing with located errors, typed getters, atomic writes. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Line and column (1-based) of pos within buf. */
static void locate(const char *buf, const char *pos, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (const char *c = buf; c < pos && *c; c++) {
    if (*c == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

cJSON *json_parse_buffer(const char *name, const char *buf, size_t len, GError **err) {
  /* cJSON recurses per nesting level; deep nesting is refused by cJSON's own limit
   * (CJSON_NESTING_LIMIT, 1000), which keeps the stack bounded. */
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, false);
  if (!root) {
    int line, col;
    const char *at = end ? end : buf;
    if (at > buf + len)
      at = buf + len;
    locate(buf, at, &line, &col);
    piper_input_error(err, "%s:%d:%d: malformed JSON", name, line, col);
    return NULL;
  }
  /* Anything but whitespace after the value is an error too. */
  for (const char *c = end; c && c < buf + len && *c; c++) {
    if (*c != ' ' && *c != '\n' && *c != '\r' && *c != '\t') {
      int line, col;
      locate(buf, c, &line, &col);
      cJSON_Delete(root);
      piper_input_error(err, "%s:%d:%d: malformed JSON: text after the value", name, line, col);
      return NULL;
    }
  }
  return root;
}

cJSON *json_parse_file(const char *path, GError **err) {
  size_t len = 0;
  char *text = piper_read_file(path, JSON_MAX_FILE_BYTES, &len, err);
  if (!text)
    return NULL;
  cJSON *root = NULL;
  if (memchr(text, '\0', len))
    piper_input_error(err, "%s: not a text file (NUL byte)", path);
  else
    root = json_parse_buffer(path, text, len, err);
  g_free(text);
  return root;
}

bool json_check_keys(const cJSON *obj, const char *const *allowed, const char *ctx, GError **err) {
  if (!cJSON_IsObject(obj))
    return piper_input_error(err, "%s: expected an object", ctx);
  for (const cJSON *it = obj->child; it; it = it->next) {
    bool ok = false;
    for (const char *const *a = allowed; *a; a++)
      if (it->string && strcmp(it->string, *a) == 0)
        ok = true;
    if (!ok)
      return piper_input_error(err, "%s: unknown key \"%s\"", ctx, it->string ? it->string : "");
  }
  return true;
}

bool json_as_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out, const char *ctx,
                 const char *what, GError **err) {
  if (!cJSON_IsNumber(v))
    return piper_input_error(err, "%s: \"%s\" must be an integer", ctx, what);
  double d = v->valuedouble;
  if (!isfinite(d) || d != floor(d))
    return piper_input_error(err, "%s: \"%s\" must be an integer", ctx, what);
  if (d < (double)lo || d > (double)hi)
    return piper_input_error(err, "%s: \"%s\" = %.17g is out of range [%lld, %lld]", ctx, what, d,
                     (long long)lo, (long long)hi);
  *out = (int64_t)d;
  return true;
}

static const cJSON *lookup(const cJSON *obj, const char *key, bool required, const char *ctx,
                           GError **err, bool *missing) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *missing = v == NULL;
  if (!v && required)
    piper_input_error(err, "%s: missing key \"%s\"", ctx, key);
  return v;
}

bool json_get_int(const cJSON *obj, const char *key, bool required, int64_t lo, int64_t hi,
                  int64_t *out, const char *ctx, GError **err) {
  bool missing;
  const cJSON *v = lookup(obj, key, required, ctx, err, &missing);
  if (missing)
    return !required;
  return json_as_int(v, lo, hi, out, ctx, key, err);
}

bool json_get_double(const cJSON *obj, const char *key, bool required, double lo, double hi,
                     double *out, const char *ctx, GError **err) {
  bool missing;
  const cJSON *v = lookup(obj, key, required, ctx, err, &missing);
  if (missing)
    return !required;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return piper_input_error(err, "%s: \"%s\" must be a number", ctx, key);
  if (v->valuedouble < lo || v->valuedouble > hi)
    return piper_input_error(err, "%s: \"%s\" = %g is out of range [%g, %g]", ctx, key, v->valuedouble, lo,
                     hi);
  *out = v->valuedouble;
  return true;
}

bool json_get_bool(const cJSON *obj, const char *key, bool required, bool *out, const char *ctx,
                   GError **err) {
  bool missing;
  const cJSON *v = lookup(obj, key, required, ctx, err, &missing);
  if (missing)
    return !required;
  if (!cJSON_IsBool(v))
    return piper_input_error(err, "%s: \"%s\" must be true or false", ctx, key);
  *out = cJSON_IsTrue(v);
  return true;
}

bool json_get_string(const cJSON *obj, const char *key, bool required, const char **out,
                     const char *ctx, GError **err) {
  bool missing;
  const cJSON *v = lookup(obj, key, required, ctx, err, &missing);
  if (missing)
    return !required;
  if (!cJSON_IsString(v) || !v->valuestring)
    return piper_input_error(err, "%s: \"%s\" must be a string", ctx, key);
  *out = v->valuestring;
  return true;
}

bool json_write_file(const char *path, const cJSON *root, GError **err) {
  char *text = cJSON_Print(root);
  if (!text) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: out of memory serialising", path);
    return false;
  }
  GString *s = g_string_new(text);
  g_string_append_c(s, '\n');
  cJSON_free(text);
  bool ok = piper_write_file(path, s->str, s->len, err);
  g_string_free(s, TRUE);
  return ok;
}

