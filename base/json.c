/* json: file parsing with located errors, the typed getters, atomic writes. */
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

cJSON *json_parse_file_strict(const char *path, GError **err) {
  cJSON *root = json_parse_file(path, err);
  if (root && !json_refuse_duplicate_keys(root, path, err)) {
    cJSON_Delete(root);
    return NULL;
  }
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

/* ---- typed getters ------------------------------------------------------------------------ */

bool json_fail_at(GError **err, const struct json_loc *l, const char *fmt, ...) {
  if (!err || *err)
    return false;
  va_list ap;
  va_start(ap, fmt);
  char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  GString *where = g_string_new(l->ctx);
  if (l->a) {
    g_string_append_printf(where, ": %s[%u]", l->a, l->ai);
    if (l->b)
      g_string_append_printf(where, ".%s[%u]", l->b, l->bi);
  }
  piper_input_error(err, "%s: %s", where->str, msg);
  g_string_free(where, TRUE);
  g_free(msg);
  return false;
}

void json_format_number(double d, char buf[32]) {
  snprintf(buf, 32, "%.15g", d);
  if (strtod(buf, NULL) != d)
    snprintf(buf, 32, "%.17g", d);
}

bool json_is_whole(const cJSON *v) {
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

bool json_fetch(const cJSON *obj, const char *const *keys, size_t n, const cJSON **slot,
                const struct json_loc *l, GError **err) {
  if (!cJSON_IsObject(obj))
    return json_fail_at(err, l, "expected an object");
  memset(slot, 0, n * sizeof *slot);
  size_t next = 0;
  for (const cJSON *c = obj->child; c; c = c->next) {
    size_t k = n;
    for (size_t j = 0; c->string && j < n; j++) {
      size_t cand = (next + j) % n;
      if (strcmp(c->string, keys[cand]) == 0) {
        k = cand;
        break;
      }
    }
    if (k == n)
      return json_fail_at(err, l, "unknown key \"%s\"", c->string ? c->string : "");
    next = k + 1;
    if (slot[k])
      return json_fail_at(err, l, "key \"%s\" appears twice", keys[k]);
    slot[k] = c;
  }
  return true;
}

static bool int_range_fail(GError **err, const struct json_loc *l, const char *key, double v,
                           int64_t lo, int64_t hi) {
  char num[32];
  json_format_number(v, num);
  if (hi < lo)
    return json_fail_at(err, l, "\"%s\" = %s refers to nothing (the list is empty)", key, num);
  return json_fail_at(err, l, "\"%s\" = %s is out of range [%lld, %lld]", key, num, (long long)lo,
                      (long long)hi);
}

bool json_value_int(const cJSON *v, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (!json_is_whole(v))
    return json_fail_at(err, l, "\"%s\" must be an integer in [%lld, %lld]", key, (long long)lo,
                        (long long)hi);
  if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
    return int_range_fail(err, l, key, v->valuedouble, lo, hi);
  *out = (int64_t)v->valuedouble;
  return true;
}

bool json_value_u32(const cJSON *v, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
                    const struct json_loc *l, GError **err) {
  int64_t x;
  if (!json_value_int(v, key, lo, hi, &x, l, err))
    return false;
  *out = (uint32_t)x;
  return true;
}

bool json_value_u64(const cJSON *v, const char *key, uint64_t hi, uint64_t *out,
                    const struct json_loc *l, GError **err) {
  int64_t x;
  if (!json_value_int(v, key, 0, (int64_t)hi, &x, l, err))
    return false;
  *out = (uint64_t)x;
  return true;
}

bool json_value_ref(const cJSON *v, const char *key, uint32_t lim, bool nullable, uint32_t *out,
                    const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (cJSON_IsNull(v)) {
    if (!nullable)
      return json_fail_at(err, l, "\"%s\" must be an integer, not null", key);
    *out = UINT32_MAX;
    return true;
  }
  if (!json_is_whole(v)) {
    if (lim == 0)
      return json_fail_at(err, l, "\"%s\" must be %s (the list is empty)", key,
                          nullable ? "null" : "an integer");
    return json_fail_at(err, l, "\"%s\" must be an integer in [0, %u]%s", key, lim - 1,
                        nullable ? " or null" : "");
  }
  if (v->valuedouble < 0 || v->valuedouble >= (double)lim)
    return int_range_fail(err, l, key, v->valuedouble, 0, (int64_t)lim - 1);
  *out = (uint32_t)v->valuedouble;
  return true;
}

/* Bounds as the messages print them: "[lo, hi]", or "(0, hi]" for json_value_positive. */
static void format_bounds(char buf[80], bool open_zero, double lo, double hi) {
  char a[32], b[32];
  json_format_number(lo, a);
  json_format_number(hi, b);
  snprintf(buf, 80, "%s%s, %s]", open_zero ? "(" : "[", open_zero ? "0" : a, b);
}

static bool number_in(const cJSON *v, const char *key, bool open_zero, double lo, double hi,
                      double *out, const struct json_loc *l, GError **err) {
  char bounds[80];
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
    format_bounds(bounds, open_zero, lo, hi);
    return json_fail_at(err, l, "\"%s\" must be a number in %s", key, bounds);
  }
  double d = v->valuedouble;
  if ((open_zero ? !(d > 0) : d < lo) || d > hi) {
    char num[32];
    json_format_number(d, num);
    format_bounds(bounds, open_zero, lo, hi);
    return json_fail_at(err, l, "\"%s\" = %s is out of range %s", key, num, bounds);
  }
  *out = d;
  return true;
}

bool json_value_double(const cJSON *v, const char *key, double lo, double hi, double *out,
                       const struct json_loc *l, GError **err) {
  return number_in(v, key, false, lo, hi, out, l, err);
}

bool json_value_positive(const cJSON *v, const char *key, double hi, double *out,
                         const struct json_loc *l, GError **err) {
  return number_in(v, key, true, 0, hi, out, l, err);
}

bool json_value_bool(const cJSON *v, const char *key, bool *out, const struct json_loc *l,
                     GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (!cJSON_IsBool(v))
    return json_fail_at(err, l, "\"%s\" must be true or false", key);
  *out = cJSON_IsTrue(v);
  return true;
}

bool json_value_string(const cJSON *v, const char *key, size_t max, const char **out,
                       const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (!cJSON_IsString(v) || !v->valuestring)
    return json_fail_at(err, l, "\"%s\" must be a string", key);
  if (max && strlen(v->valuestring) >= max)
    return json_fail_at(err, l, "\"%s\" is longer than %zu characters", key, max - 1);
  *out = v->valuestring;
  return true;
}

bool json_value_array(const cJSON *v, const char *key, uint32_t max, const cJSON **first,
                      uint32_t *n, const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (!cJSON_IsArray(v))
    return json_fail_at(err, l, "\"%s\" must be an array", key);
  uint32_t count = 0;
  for (const cJSON *c = v->child; c; c = c->next)
    if (++count > max)
      return json_fail_at(err, l, "\"%s\" has more than %u entries", key, max);
  *first = v->child;
  *n = count;
  return true;
}

bool json_value_object(const cJSON *v, const char *key, const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"%s\"", key);
  if (!cJSON_IsObject(v))
    return json_fail_at(err, l, "\"%s\" must be an object", key);
  return true;
}

bool json_as_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out, const char *ctx,
                 const char *what, GError **err) {
  return json_value_int(v, what, lo, hi, out, JSON_LOC(ctx), err);
}

/* The value under key, or NULL; *skip is true when the key is absent and not required (the
 * getter then leaves its output alone). A missing required key is left to the value getter,
 * which reports it. */
static const cJSON *lookup(const cJSON *obj, const char *key, bool required, bool *skip) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *skip = !v && !required;
  return v;
}

bool json_get_int(const cJSON *obj, const char *key, bool required, int64_t lo, int64_t hi,
                  int64_t *out, const char *ctx, GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  return skip || json_value_int(v, key, lo, hi, out, JSON_LOC(ctx), err);
}

bool json_get_u32(const cJSON *obj, const char *key, bool required, uint32_t lo, uint32_t hi,
                  uint32_t *out, const char *ctx, GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  return skip || json_value_u32(v, key, lo, hi, out, JSON_LOC(ctx), err);
}

bool json_get_double(const cJSON *obj, const char *key, bool required, double lo, double hi,
                     double *out, const char *ctx, GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  return skip || json_value_double(v, key, lo, hi, out, JSON_LOC(ctx), err);
}

bool json_get_positive(const cJSON *obj, const char *key, bool required, double hi, double *out,
                       const char *ctx, GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  return skip || json_value_positive(v, key, hi, out, JSON_LOC(ctx), err);
}

bool json_get_bool(const cJSON *obj, const char *key, bool required, bool *out, const char *ctx,
                   GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  return skip || json_value_bool(v, key, out, JSON_LOC(ctx), err);
}

bool json_get_string(const cJSON *obj, const char *key, bool required, const char **out,
                     const char *ctx, GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  return skip || json_value_string(v, key, 0, out, JSON_LOC(ctx), err);
}

bool json_get_object(const cJSON *obj, const char *key, bool required, const cJSON **out,
                     const char *ctx, GError **err) {
  bool skip;
  const cJSON *v = lookup(obj, key, required, &skip);
  *out = NULL;
  if (skip)
    return true;
  if (!json_value_object(v, key, JSON_LOC(ctx), err))
    return false;
  *out = v;
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

/* Appends obj's child key or index to path for messages. */
static void path_push(GString *path, const cJSON *parent, const cJSON *child, size_t index) {
  if (cJSON_IsArray(parent))
    g_string_append_printf(path, "[%zu]", index);
  else
    g_string_append_printf(path, "%s%s", path->len ? "." : "", child->string ? child->string : "");
}

/* Whether key k of child c appeared before it in obj: a scan for the small objects most
 * files hold (a trace's events, a plan's instructions), a hash set beyond. */
#define JSON_DUP_SCAN_MAX 16
static bool seen_before(const cJSON *obj, const cJSON *c, const char *k, GHashTable *seen) {
  if (seen)
    return !g_hash_table_add(seen, (gpointer)k);
  for (const cJSON *b = obj->child; b != c; b = b->next)
    if (strcmp(b->string ? b->string : "", k) == 0)
      return true;
  return false;
}

static bool refuse_duplicates(const cJSON *node, GString *path, const char *name, GError **err) {
  if (!cJSON_IsObject(node) && !cJSON_IsArray(node))
    return true;
  bool object = cJSON_IsObject(node);
  GHashTable *seen = object && cJSON_GetArraySize(node) > JSON_DUP_SCAN_MAX
                         ? g_hash_table_new(g_str_hash, g_str_equal)
                         : NULL;
  bool ok = true;
  size_t index = 0;
  for (const cJSON *c = node->child; ok && c; c = c->next, index++) {
    if (object) {
      const char *k = c->string ? c->string : "";
      if (seen_before(node, c, k, seen)) {
        g_autofree char *q = piper_quote(k, strlen(k), 64);
        g_autofree char *where = path->len ? piper_quote(path->str, path->len, 200)
                                           : g_strdup("the top-level object");
        ok = piper_input_error(err, "%s: key %s appears twice in %s", name, q, where);
        break;
      }
    }
    size_t len = path->len;
    path_push(path, node, c, index);
    ok = refuse_duplicates(c, path, name, err);
    g_string_truncate(path, len);
  }
  if (seen)
    g_hash_table_destroy(seen);
  return ok;
}

bool json_refuse_duplicate_keys(const cJSON *root, const char *name, GError **err) {
  GString *path = g_string_new(NULL);
  bool ok = refuse_duplicates(root, path, name, err);
  g_string_free(path, TRUE);
  return ok;
}
