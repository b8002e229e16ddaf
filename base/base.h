/* base: what every module of Piper uses and none owns. Errors (the PIPER_ERROR domain whose
 * codes are the programs' exit statuses), always-on assertions (assert.h), file output that
 * never leaves half a file nor replaces a device, hashing, the clock, comparators and the
 * command-line helpers of the program entry points. It depends on GLib and libc only.
 *
 *   GError *err = NULL;
 *   uint32_t n = 0;
 *   if (n == 0)                                 // bad input: exit status 2 in the programs
 *     piper_input_error(&err, "%s: \"layers\" must be positive", "models/tiny-moe.json");
 *   g_clear_error(&err);
 *   struct piper_out out;
 *   if (piper_out_open(&out, "out/results.csv", &err)) {
 *     fprintf(out.f, "a,b\n");
 *     piper_out_close(&out, &err);              // checks every write; renames into place
 *   }
 *   g_clear_error(&err);
 */
#ifndef PIPER_BASE_BASE_H
#define PIPER_BASE_BASE_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "assert.h"
#include "version.h"

/* ---- errors ------------------------------------------------------------------------------ */

#define PIPER_ERROR piper_error_quark()
GQuark piper_error_quark(void);

/* The code is the exit status the program entry points use
 * (docs/design.md, "Outputs and exit statuses"). */
enum piper_error_code {
  PIPER_ERROR_RUNTIME = 1, /* the run failed: I/O, a peer died, a watchdog fired */
  PIPER_ERROR_INPUT = 2,   /* the user's input is wrong */
};

/* Sets err (when unset) to an input error; printf-style. Control characters in the message
 * (echoed from input files) are written as \xNN, so an error is always one line. Always returns
 * false, for `return piper_input_error(...)`. */
bool piper_input_error(GError **err, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* The same for a runtime failure (exit status 1). */
bool piper_runtime_error(GError **err, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* s[0 .. len) made safe to echo in a one-line message: in double quotes, quotes and
 * backslashes escaped, other non-printable bytes as \xNN, cut after max bytes ("..."). */
char *piper_quote(const char *s, size_t len, size_t max);

/* ---- output files ------------------------------------------------------------------------ */

/* An output being written. A regular file or a new path is written to path.tmp and renamed into
 * place on close, so readers never see half a file; a symlink is followed (its target is
 * replaced, the link stays); a character device, FIFO or socket (/dev/null, /dev/stdout) and "-"
 * (standard output) are written in place. */
struct piper_out {
  FILE *f;
  char *path;  /* what error messages name (as given) */
  char *final; /* where the rename goes; NULL when written in place */
  char *tmp;   /* the temporary file; NULL when written in place */
  bool sync;   /* fsync the file and its directory before and after the rename */
};
bool piper_out_open(struct piper_out *o, const char *path, GError **err);
/* Checks every write (ferror, fflush, fclose), then renames into place. On failure removes the
 * temporary file and sets a runtime error naming the path. Always releases o. */
bool piper_out_close(struct piper_out *o, GError **err);
/* Drops an output without publishing it (an error elsewhere). NULL-safe on a zeroed o. */
void piper_out_abandon(struct piper_out *o);
/* Writes len bytes to path as one piper_out. */
bool piper_write_file(const char *path, const void *data, size_t len, GError **err);
/* Same, with fsync of the file and the directory (checkpoints). */
bool piper_write_file_durable(const char *path, const void *data, size_t len, GError **err);

/* ---- input files ------------------------------------------------------------------------- */

/* Reads the whole of path (at most max bytes) into a NUL-terminated buffer (g_free), *len set
 * when len is not NULL. A regular file (after links), or a pipe or FIFO read to its end (shell
 * process substitution, `<(...)`; one nobody writes to is an error, never a hang). Anything
 * else is refused rather than read: a terminal would block, a device never ends. Errors are
 * input errors naming path. */
char *piper_read_file(const char *path, size_t max, size_t *len, GError **err);

/* ---- hashing, clock, comparators --------------------------------------------------------- */

#define PIPER_FNV1A_INIT 14695981039346656037ull
/* 64-bit FNV-1a of n bytes, continuing from h (start with PIPER_FNV1A_INIT). */
uint64_t piper_fnv1a(uint64_t h, const void *data, size_t n);
/* splitmix64's finaliser: a counter-based hash (a value that depends only on its key, never
 * on the order of the draws), for the synthetic data, the initial parameters and the
 * simulator's scenario draws. */
static inline uint64_t piper_splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Seconds on the monotonic clock. */
double piper_clock_seconds(void);
/* Which machine's monotonic clock piper_clock_seconds reads: the kernel's boot id (processes
 * with equal ids share the clock), else the host name; into out (NUL-terminated). */
void piper_clock_machine(char *out, size_t n);

/* qsort comparators over arrays of the named type, ascending. */
int piper_cmp_u32(const void *a, const void *b);
int piper_cmp_u64(const void *a, const void *b);
int piper_cmp_double(const void *a, const void *b);

/* ---- command-line helpers of the program entry points ----------------------------------- */

/* Prints "<program>: error: <message>" on stderr, frees err, returns the exit status: 1 for
 * PIPER_ERROR_RUNTIME, 2 for everything else (docs/design.md, "Outputs and exit statuses"). */
int piper_error_exit(const char *program, GError *err);
/* Prints "<program>: error: <what> (see <program> --help)" on stderr; returns 2 (bad input). */
int piper_usage_error(const char *program, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* quiet: piper_usage_error prints nothing (it still returns 2). For the ranks of a launcher other
 * than the first, where the same command line gives every rank the same usage error. */
void piper_usage_error_quiet(bool quiet);
/* Whole decimal number in [lo, hi]; false otherwise. */
bool piper_parse_u32(const char *text, uint32_t lo, uint32_t hi, uint32_t *out);
/* Finite decimal number in [lo, hi]; false otherwise. */
bool piper_parse_double(const char *text, double lo, double hi, double *out);

#endif
