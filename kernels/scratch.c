/* scratch: per-thread working memory for the kernels that need more than the caller's buffers
 * (the executor runs kernels on several worker threads at once). */
#include "kernels-impl.h"

#include "../base/assert.h"

#include <glib.h>

/* One buffer and its size per slot, per thread, freed when the thread exits. Grown, never
 * shrunk: after a thread's first call at its largest shape, no kernel allocates. One GPrivate
 * holds all the slots: an array of GPrivates initialised as {G_PRIVATE_INIT(g_free)} gives the
 * notify to its first element only, and the other slots' buffers leaked at every growth and
 * thread exit (LeakSanitizer in test_kernels). */
struct scratch {
  void *buf[KERNELS_SCRATCH_SLOTS];
  size_t size[KERNELS_SCRATCH_SLOTS];
};

static void scratch_free(gpointer data) {
  struct scratch *s = data;
  for (int k = 0; k < KERNELS_SCRATCH_SLOTS; k++)
    g_free(s->buf[k]);
  g_free(s);
}

static GPrivate scratch_key = G_PRIVATE_INIT(scratch_free);

void *kernels_impl_scratch(enum kernels_scratch_slot slot, size_t bytes) {
  PIPER_ASSERT(slot >= 0 && slot < KERNELS_SCRATCH_SLOTS);
  struct scratch *s = g_private_get(&scratch_key);
  if (!s) {
    s = g_new0(struct scratch, 1);
    g_private_set(&scratch_key, s);
  }
  if (!s->buf[slot] || s->size[slot] < bytes) {
    g_free(s->buf[slot]);
    s->buf[slot] = g_malloc(bytes ? bytes : 1);
    s->size[slot] = bytes;
  }
  return s->buf[slot];
}
