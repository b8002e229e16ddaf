/* json: reading and writing the project's JSON files, with errors that locate the fault.
 * Every input error is a GError in PIPER_ERROR with code PIPER_ERROR_INPUT (exit status 2);
 * messages name the file and the key, and parse errors carry line and column.
 *
 *   GError *err = NULL;
 *   cJSON *root = json_parse_file("models/tiny-moe.json", &err);
 *   int64_t n;
 *   json_get_int(root, "hidden_size", true, 1, 1 << 20, &n, "models/tiny-moe.json", &err);
 *   cJSON_Delete(root);
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
/* Parses a buffer; name is what error messages call it (a path, "<stdin>"). */
cJSON *json_parse_buffer(const char *name, const char *buf, size_t len, GError **err);

/* Fails naming the first key of obj that is not in allowed (NULL-terminated). ctx says where
 * obj is, e.g. "directives.json: directive 3 (place)". */
bool json_check_keys(const cJSON *obj, const char *const *allowed, const char *ctx, GError **err);

/* Typed getters. A missing key is an error when required, else leaves *out untouched and
 * returns true. Integers must be whole JSON numbers in [lo, hi]. */
bool json_get_int(const cJSON *obj, const char *key, bool required, int64_t lo, int64_t hi,
                  int64_t *out, const char *ctx, GError **err);
bool json_get_double(const cJSON *obj, const char *key, bool required, double lo, double hi,
                     double *out, const char *ctx, GError **err);
bool json_get_bool(const cJSON *obj, const char *key, bool required, bool *out, const char *ctx,
                   GError **err);
/* *out points into obj; valid while obj lives. */
bool json_get_string(const cJSON *obj, const char *key, bool required, const char **out,
                     const char *ctx, GError **err);
/* Checks that a JSON value is a whole number in [lo, hi]; what names it in the message. */
bool json_as_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out, const char *ctx,
                 const char *what, GError **err);

/* Writes root to path (pretty-printed, trailing newline) through piper_out. */
bool json_write_file(const char *path, const cJSON *root, GError **err);

#endif
