/* scratch: per-thread working memory for the kernels that need more than the caller's buffers
 * (the executor runs kernels on several worker threads at once). */
#include "kernels-impl.h"

#include "../base/assert.h"

#include <glib.h>

/* One buffer and its size per slot and thread, freed when the thread exits. Grown, never
 * shrunk: after a thread's first call at its largest shape, no kernel allocates. */
static GPrivate scratch_buf[KERNELS_SCRATCH_SLOTS] = {G_PRIVATE_INIT(g_free)};
static GPrivate scratch_size[KERNELS_SCRATCH_SLOTS];

void *kernels_impl_scratch(enum kernels_scratch_slot slot, size_t bytes) {
  PIPER_ASSERT(slot >= 0 && slot < KERNELS_SCRATCH_SLOTS);
  void *buf = g_private_get(&scratch_buf[slot]);
  size_t have = GPOINTER_TO_SIZE(g_private_get(&scratch_size[slot]));
  if (!buf || have < bytes) {
    buf = g_malloc(bytes ? bytes : 1);
    g_private_replace(&scratch_buf[slot], buf);
    g_private_set(&scratch_size[slot], GSIZE_TO_POINTER(bytes));
  }
  return buf;
}
