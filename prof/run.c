/* prof run: prof_run's phases (load the models, start MPI under mpirun, measure through the
 * chosen backend, let the other ranks go, write the profile, end MPI) and the table of the
 * backends measured through: the host's, and the cuda backend's where it is built (cuda.c). */
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "../base/base.h"
#include "../base/launch.h"
#include "../models/model.h"
#include "prof-impl.h"

enum { PROF_REPEATS_DEFAULT = 21, PROF_REPEATS_QUICK = 5, PROF_WARMUP_DEFAULT = 3 };

/* ---- the host backend ------------------------------------------------------------------------ */

/* The largest model's parameters, capped: AdamW holds 4 floats per parameter, so at most a
 * sixteenth of the memory, and 16 M parameters (a quarter of a second per step on one core)
 * are enough to see its slope. */
static uint64_t adamw_max_params(const GPtrArray *models) {
  uint64_t max_params = 0;
  for (guint i = 0; i < models->len; i++) {
    uint64_t n = model_param_count(g_ptr_array_index(models, i));
    max_params = n > max_params ? n : max_params;
  }
  double cap = prof_physical_memory_bytes() / 64;
  if ((double)max_params > cap)
    max_params = (uint64_t)cap;
  if (max_params > ((uint64_t)1 << 24))
    max_params = (uint64_t)1 << 24;
  return max_params;
}

/* Network first, with every rank; then rank 0 alone times the kernels while the others sleep,
 * so nothing else of this run competes for the cores. */
static bool host_measure(struct prof_run *r, GPtrArray *models, GError **err) {
#ifdef HAVE_MPI
  if (r->size > 1) {
    prof_progress(r, "network over 2 to %d ranks", r->size);
    prof_measure_network(r);
  }
#endif
  if (!prof_measure_host(r, err))
    r->failed = true;
#ifdef HAVE_MPI
  if (r->size > 1 && r->rank != 0) {
    prof_idle_until_released(r);
    return false;
  }
#endif
  prof_measure_machine(r, adamw_max_params(models));
  bool *chained = g_new0(bool, models->len + 1);
  prof_measure_chains(r, models, chained);
  for (guint i = 0; i < models->len; i++)
    if (!chained[i])
      prof_host_measure_model(r, g_ptr_array_index(models, i));
  g_free(chained);
  prof_fit_chain_optimizer(r);
  prof_progress(r, "%u kernel entries, %u op shapes left to the roofline", r->n_entries,
                r->n_skipped);
  return true;
}

/* ---- the backends --------------------------------------------------------------------------- */

static const struct prof_backend backends[] = {
    {.name = "host", .measure = host_measure},
#ifdef HAVE_CUDA
    {.name = "cuda", .measure = prof_cuda_measure}, /* cuda.c, built with the cuda backend */
#endif
};

static const struct prof_backend *backend_find(const char *name) {
  for (size_t i = 0; name && i < G_N_ELEMENTS(backends); i++)
    if (strcmp(backends[i].name, name) == 0)
      return &backends[i];
  return NULL;
}

bool prof_backend_built(const char *name) {
  return backend_find(name) != NULL;
}

char *prof_backend_names(void) {
  GString *s = g_string_new("");
  for (size_t i = 0; i < G_N_ELEMENTS(backends); i++)
    g_string_append_printf(s, "%s%s", i ? ", " : "", backends[i].name);
  return g_string_free(s, FALSE);
}

struct prof_args prof_args_default(void) {
  return (struct prof_args){
      .backend = "host", .repeats = PROF_REPEATS_DEFAULT, .warmup = PROF_WARMUP_DEFAULT};
}

/* ---- the run ------------------------------------------------------------------------------- */

static bool load_models(const struct prof_args *a, GPtrArray *models, GError **err) {
  char **paths = g_strsplit(a->model, ",", -1);
  bool ok = true;
  for (char **p = paths; *p && ok; p++) {
    if (!**p)
      continue;
    struct model *m = model_load_file(*p, 0, err);
    if (m)
      g_ptr_array_add(models, m);
    ok = m != NULL;
  }
  g_strfreev(paths);
  if (ok && models->len == 0)
    return piper_input_error(err, "--model: no model file in \"%s\"", a->model);
  return ok;
}

static void run_init(struct prof_run *r, const struct prof_args *a) {
  *r = (struct prof_run){.a = a,
                         .size = 1,
                         .measured = cJSON_CreateArray(),
                         .seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                         .opt_params = g_array_new(FALSE, FALSE, sizeof(double)),
                         .opt_seconds = g_array_new(FALSE, FALSE, sizeof(double))};
#ifdef HAVE_MPI
  r->comm = MPI_COMM_NULL;
#endif
}

static void run_free(struct prof_run *r) {
  cJSON_Delete(r->measured);
  cJSON_Delete(r->fits);
  cJSON_Delete(r->fit_json);
  g_hash_table_destroy(r->seen);
  g_array_free(r->opt_params, TRUE);
  g_array_free(r->opt_seconds, TRUE);
}

/* Under a launcher (base/launch.h): starts MPI (the host backend's instruction costs need full
 * thread support), makes r's communicator and fills in r's rank and size; returns whether it
 * did (false with err set when MPI cannot start as needed). */
static bool mpi_start(struct prof_run *r, int *argc, char ***argv, bool *mpi, GError **err) {
  *mpi = false;
#ifdef HAVE_MPI
  if (!piper_launch_detect().launched)
    return true;
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS)
    return piper_runtime_error(err, "MPI_Init_thread failed (code %d)", rc);
  *mpi = true;
  if (provided < MPI_THREAD_MULTIPLE)
    return piper_runtime_error(err,
                               "the MPI library provides thread level %d, but piper-prof "
                               "needs MPI_THREAD_MULTIPLE (%d), as piper-exec does",
                               provided, MPI_THREAD_MULTIPLE);
  /* from here on a failed call ends the job with MPI's line (prof-impl.h, comm) */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_dup(MPI_COMM_WORLD, &r->comm);
  MPI_Comm_set_errhandler(r->comm, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_rank(r->comm, &r->rank);
  MPI_Comm_size(r->comm, &r->size);
#endif
  (void)r, (void)argc, (void)argv, (void)err;
  return true;
}

/* Rank 0, once it has measured: lets the others go (they wait without a core). */
static void mpi_release(const struct prof_run *r, bool mpi) {
#ifdef HAVE_MPI
  if (mpi && r->rank == 0)
    prof_release_others(r);
#endif
  (void)r, (void)mpi;
}

static void mpi_finish(struct prof_run *r, bool mpi) {
#ifdef HAVE_MPI
  if (mpi) {
    if (r->comm != MPI_COMM_NULL)
      MPI_Comm_free(&r->comm);
    MPI_Finalize();
  }
#endif
  (void)r, (void)mpi;
}

bool prof_run(const struct prof_args *args, int argc, char **argv, GError **err) {
  struct prof_args a = *args;
  if (a.quick && a.repeats == PROF_REPEATS_DEFAULT)
    a.repeats = PROF_REPEATS_QUICK;
  const struct prof_backend *backend = backend_find(a.backend);
  if (!backend) {
    char *names = prof_backend_names();
    piper_input_error(err, "--backend: unknown backend \"%s\" (%s)", a.backend, names);
    g_free(names);
    return false;
  }
  GPtrArray *models = g_ptr_array_new_with_free_func((GDestroyNotify)model_free);
  if (!load_models(&a, models, err)) {
    g_ptr_array_free(models, TRUE);
    return false;
  }
  struct prof_run r;
  run_init(&r, &a);
  bool mpi;
  if (!mpi_start(&r, &argc, &argv, &mpi, err)) {
    mpi_finish(&r, mpi);
    run_free(&r);
    g_ptr_array_free(models, TRUE);
    return false;
  }
  bool writer = backend->measure(&r, models, err);
  mpi_release(&r, mpi);
  bool ok = !r.failed && (!writer || prof_write_profile(&r, argc, argv, err));
  if (writer && ok)
    prof_progress(&r, "wrote %s (%u measured entries)", a.out, r.n_entries);
  mpi_finish(&r, mpi);
  run_free(&r);
  g_ptr_array_free(models, TRUE);
  return ok;
}
