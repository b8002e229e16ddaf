/* json: reading and writing the project's JSON files, with errors that locate the fault.
 * Every input error is a GError in PIPER_ERROR with code PIPER_ERROR_INPUT (exit status 2);
 * messages name the file and the key, and parse errors carry line and column.
 *
 *   GError *err = NULL;
 *   int64_t n = 0;
 *   cJSON *root = json_parse_file("models/tiny-moe.json", &err);
 *   if (root && !json_get_int(root, "hidden_size", true, 1, 1 << 20, &n, "models/tiny-moe.json",
 *                             &err))
 *     fprintf(stderr, "%s\n", err->message);   // models/tiny-moe.json: "hidden_size" ...
 *   cJSON_Delete(root);
 *   g_clear_error(&err);
 */
#ifndef PIPER_BASE_JSON_H
#define PIPER_BASE_JSON_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "base.h"

/* Largest input file read (64 MiB): a bigger one is refused before reading. */
#define JSON_MAX_FILE_BYTES (64u << 20)

/* Parses a whole file; on failure the message is "<path>:<line>:<col>: <what>". */
cJSON *json_parse_file(const char *path, GError **err);
/* json_parse_file, then json_refuse_duplicate_keys: what every input file reader wants. */
cJSON *json_parse_file_strict(const char *path, GError **err);
/* Parses a buffer; name is what error messages call it (a path, "<stdin>"). */
cJSON *json_parse_buffer(const char *name, const char *buf, size_t len, GError **err);

/* Fails naming the first key of obj that is not in allowed (NULL-terminated). ctx says where
 * obj is, e.g. "directives.json: directive 3 (place)". */
bool json_check_keys(const cJSON *obj, const char *const *allowed, const char *ctx, GError **err);

/* ---- typed getters: one family ---------------------------------------------------------
 * Every reader checks JSON values through these, so a value of the wrong type or out of range
 * gets the same message wherever it is read:
 *   missing key "k"
 *   "k" must be an integer in [lo, hi]          (a number in [lo, hi], true or false, a string)
 *   "k" = 12 is out of range [lo, hi]
 * Numbers in messages are printed in their shortest exact form.
 *
 * A location says where a value is: a context (a file name, or "x.json: directive 3 (place)")
 * and at most two array steps of a JSON path ("streams[1].instructions[4]"). It is formatted
 * only when an error is reported, so readers of big files pay nothing for it on the good path.
 * The value getters take the value found under key (NULL when the key is missing, an error);
 * the object getters look key up in obj first. */
struct json_loc {
  const char *ctx;
  const char *a; /* first array step, or NULL */
  uint32_t ai;
  const char *b; /* second array step (only with a), or NULL */
  uint32_t bi;
};
/* A location that is just a context string. */
#define JSON_LOC(ctx_) (&(const struct json_loc){.ctx = (ctx_)})

/* Sets an input error "<location>: <message>" and returns false. */
bool json_fail_at(GError **err, const struct json_loc *l, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
/* Writes d in its shortest form that reads back exactly (%.15g, else %.17g). */
void json_format_number(double d, char buf[32]);
/* A finite JSON number without a fractional part. */
bool json_is_whole(const cJSON *v);
/* Looks up every member of obj among keys[0 .. n) into slot[] (NULL where absent); unknown or
 * repeated keys are errors. One pass over the members, each usually found by one comparison
 * when obj lists them in the order of keys (as the plan writer does). */
bool json_fetch(const cJSON *obj, const char *const *keys, size_t n, const cJSON **slot,
                const struct json_loc *l, GError **err);

/* Value getters. */
bool json_value_int(const cJSON *v, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    const struct json_loc *l, GError **err);
bool json_value_u32(const cJSON *v, const char *key, uint32_t lo, uint32_t hi, uint32_t *out,
                    const struct json_loc *l, GError **err);
/* A byte count or other unsigned value in [0, hi]; hi at most 2^53 (exact in a double). */
bool json_value_u64(const cJSON *v, const char *key, uint64_t hi, uint64_t *out,
                    const struct json_loc *l, GError **err);
/* An index below lim, or (when nullable) null for UINT32_MAX. */
bool json_value_ref(const cJSON *v, const char *key, uint32_t lim, bool nullable, uint32_t *out,
                    const struct json_loc *l, GError **err);
bool json_value_double(const cJSON *v, const char *key, double lo, double hi, double *out,
                       const struct json_loc *l, GError **err);
/* A number in (0, hi]: for sizes and shares where zero means nothing. */
bool json_value_positive(const cJSON *v, const char *key, double hi, double *out,
                         const struct json_loc *l, GError **err);
bool json_value_bool(const cJSON *v, const char *key, bool *out, const struct json_loc *l,
                     GError **err);
/* A string of at most max - 1 bytes (max 0: any length); *out points into v. */
bool json_value_string(const cJSON *v, const char *key, size_t max, const char **out,
                       const struct json_loc *l, GError **err);
/* An array of at most max elements: *first is its first element (NULL if empty), *n the count. */
bool json_value_array(const cJSON *v, const char *key, uint32_t max, const cJSON **first,
                      uint32_t *n, const struct json_loc *l, GError **err);
bool json_value_object(const cJSON *v, const char *key, const struct json_loc *l, GError **err);

/* Object getters: a missing key is an error when required, else leaves *out untouched and
 * returns true. ctx names obj in messages. */
bool json_get_int(const cJSON *obj, const char *key, bool required, int64_t lo, int64_t hi,
                  int64_t *out, const char *ctx, GError **err);
bool json_get_u32(const cJSON *obj, const char *key, bool required, uint32_t lo, uint32_t hi,
                  uint32_t *out, const char *ctx, GError **err);
bool json_get_double(const cJSON *obj, const char *key, bool required, double lo, double hi,
                     double *out, const char *ctx, GError **err);
bool json_get_positive(const cJSON *obj, const char *key, bool required, double hi, double *out,
                       const char *ctx, GError **err);
bool json_get_bool(const cJSON *obj, const char *key, bool required, bool *out, const char *ctx,
                   GError **err);
/* *out points into obj; valid while obj lives. */
bool json_get_string(const cJSON *obj, const char *key, bool required, const char **out,
                     const char *ctx, GError **err);
/* *out is the object under key, or NULL when it is absent and not required. */
bool json_get_object(const cJSON *obj, const char *key, bool required, const cJSON **out,
                     const char *ctx, GError **err);
/* json_value_int for a value named `what` in a plain context: for callers that name list
 * elements ("layers[1]") rather than keys. */
bool json_as_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out, const char *ctx,
                 const char *what, GError **err);

/* Fails naming the first key that appears twice in one object anywhere under root, with the
 * object's path ("piper", "streams[1]"): cJSON keeps both and lookups see only the first, so a
 * second value would be silently ignored. name is the file, for the message. */
bool json_refuse_duplicate_keys(const cJSON *root, const char *name, GError **err);

/* Writes root to path (pretty-printed, trailing newline) through piper_out. */
bool json_write_file(const char *path, const cJSON *root, GError **err);

#endif
