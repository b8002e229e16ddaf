/* launch: how this process was started, read once from the launcher's environment (Open MPI,
 * PMI/PMIx, Slurm), so that nothing below the programs reads launcher variables itself.
 *
 *   struct piper_launch l = piper_launch_detect();
 *   if (l.launched) // rank l.rank of l.size, l.local_rank of l.local_size on this machine
 *     printf("rank %u of %u\n", l.rank, l.size);
 */
#ifndef PIPER_BASE_LAUNCH_H
#define PIPER_BASE_LAUNCH_H

#include <stdbool.h>
#include <stdint.h>

struct piper_launch {
  bool launched;       /* an MPI launcher started this process (then MPI is started) */
  uint32_t rank, size; /* in the job (0 and 1 alone) */
  uint32_t local_rank, local_size; /* on this machine (0 and 1 alone or when not said) */
};

/* The launcher's view; alone (no launcher variable): {false, 0, 1, 0, 1}. */
struct piper_launch piper_launch_detect(void);

#endif
