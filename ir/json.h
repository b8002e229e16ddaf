/* json: reading and writing the project's JSON files, with errors that locate the fault.
 * Every input error is a GError in PIPER_ERROR with code PIPER_ERROR_INPUT (exit status 2);
 * messages name the file and the key, and parse errors carry line and column.
 *
 *   cJSON *root = json_parse_file("models/tiny-moe.json", &err);
 *   int64_t n; json_get_int(root, "hidden_size", true, 1, 1 << 20, &n, "models/tiny-moe.json",
 * &err);
 */
#ifndef PIPER_IR_JSON_H
#define PIPER_IR_JSON_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#define PIPER_ERROR piper_error_quark()
GQuark piper_error_quark(void);

/* The code is the exit status the program entry points use (SPEC §8). */
enum piper_error_code {
  PIPER_ERROR_RUNTIME = 1, /* the run failed: I/O, a peer died, a watchdog fired */
  PIPER_ERROR_INPUT = 2,   /* the user's input is wrong */
};

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

/* Writes root to path (pretty-printed, trailing newline) through a temp file and rename. */
bool json_write_file(const char *path, const cJSON *root, GError **err);
/* Writes len bytes to path through a temp file and a rename, so readers never see half. */
bool json_write_text(const char *path, const char *text, size_t len, GError **err);

/* Sets err to an input error; printf-style. Control characters in the message (echoed from
 * input files) are written as \xNN, so an error is always one line. Always returns false, for
 * `return json_fail(...)`. */
bool json_fail(GError **err, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* s[0 .. len) made safe to echo in a one-line message: in double quotes, quotes and
 * backslashes escaped, other non-printable bytes as \xNN, cut after max bytes ("..."). */
char *json_quote(const char *s, size_t len, size_t max);

/* Command-line helpers shared by the program entry points. */
/* Prints "<program>: error: <message>" on stderr, frees err, returns the exit status (SPEC §8):
 * 1 for PIPER_ERROR_RUNTIME, 2 for everything else. */
int piper_error_exit(const char *program, GError *err);
/* Prints "<program>: error: <what> (see <program> --help)" on stderr; returns 2 (bad input). */
int piper_usage_error(const char *program, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* Whole decimal number in [lo, hi]; false otherwise. */
bool piper_parse_u32(const char *text, uint32_t lo, uint32_t hi, uint32_t *out);
/* Finite decimal number in [lo, hi]; false otherwise. */
bool piper_parse_double(const char *text, double lo, double hi, double *out);

#endif
