/* prof: measures this machine for the simulator and writes a device profile (sim/profile.h's
 * format): every op kind of the models at their shapes for F, BI, BW and B, AdamW, the GEMM rate,
 * memory bandwidth, the executor's own costs and, under mpirun, each collective's fit.
 *
 *   char *argv[] = {"piper-prof", NULL};     // the program's: recorded in the profile
 *   struct prof_args a = prof_args_default(); // host backend, 21 repeats after 3 warm-ups
 *   a.model = "models/tiny-dense.json";
 *   a.out = "profiles/mine.json";
 *   GError *err = NULL;
 *   if (!prof_run(&a, 1, argv, &err))        // under mpirun every rank calls it; rank 0 writes
 *     fprintf(stderr, "%s\n", err->message);
 *   g_clear_error(&err);
 *
 * The host backend times the host kernels in the executor's order (exec/segment_*.c) and measures
 * MPI; the cuda backend (where it is built: prof_backend_built("cuda")) times the GPU's kernel
 * table by CUDA events and NCCL. Progress goes to stderr ("piper-prof: ..."), unless quiet. */
#ifndef PIPER_PROF_PROF_H
#define PIPER_PROF_PROF_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

struct prof_args {
  const char *model;   /* model files whose op shapes are measured, comma-separated */
  const char *backend; /* "host" or "cuda" (prof_backend_built) */
  const char *out;     /* the profile's path ("-": standard output) */
  uint32_t repeats;    /* timed repeats per measurement, at least (the median is kept) */
  uint32_t warmup;     /* untimed calls before each measurement */
  bool quick;          /* fewer repeats (5, where repeats is left at its default) and smaller
                        * messages: tests, noisier figures */
  bool quiet;          /* no progress on stderr */
};

/* The defaults: the host backend, 21 repeats, 3 warm-up calls; no model, no output. */
struct prof_args prof_args_default(void);

/* Whether this build measures through the backend called name ("host"; "cuda" with the cuda
 * backend built in). */
bool prof_backend_built(const char *name);
/* The backends built in, comma-separated ("host, cuda"); the caller frees it. */
char *prof_backend_names(void);

/* Measures and writes a->out. Loads the models (an input error names the file); under mpirun
 * (Open MPI's or a PMI launcher's environment) starts and ends MPI itself, and every rank
 * measures the network, then the others wait without a core while rank 0 times the kernels
 * and writes the profile. argc and argv are the program's, recorded in the profile's sources
 * and handed to MPI. A failed measurement (no usable GPU for cuda) is a runtime error. */
bool prof_run(const struct prof_args *a, int argc, char **argv, GError **err);

#endif
