/* launch: the launcher's environment, read in one place (see the header). */
#include <stdlib.h>

#include "launch.h"

/* The first of names that is set, as a count; fallback when none is. */
static uint32_t first_set(const char *const *names, uint32_t fallback, bool *found) {
  for (const char *const *n = names; *n; n++) {
    const char *v = getenv(*n);
    if (v && *v) {
      if (found)
        *found = true;
      return (uint32_t)strtoul(v, NULL, 10);
    }
  }
  return fallback;
}

struct piper_launch piper_launch_detect(void) {
  static const char *const size[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                     "MPI_LOCALNRANKS", NULL};
  static const char *const rank[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", NULL};
  static const char *const local_size[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                           "SLURM_NTASKS_PER_NODE", NULL};
  static const char *const local_rank[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                           "SLURM_LOCALID", NULL};
  static const char *const slurm[] = {"SLURM_NTASKS", NULL};
  struct piper_launch l = {false, 0, 1, 0, 1};
  bool any = false;
  l.size = first_set(size, 1, &any);
  /* PMIx sets a rank but no size variable of its own: a rank alone says "launched" */
  l.rank = first_set(rank, 0, &any);
  uint32_t tasks = first_set(slurm, 1, NULL);
  l.launched = any || tasks > 1;
  if (!any && tasks > 1)
    l.size = tasks;
  l.local_size = first_set(local_size, 1, NULL);
  l.local_rank = first_set(local_rank, 0, NULL);
  if (l.size == 0)
    l.size = 1;
  if (l.local_size == 0)
    l.local_size = 1;
  return l;
}
