/* base utilities: hashing, the clock, comparators. */
#include "base.h"

#include <glib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t piper_fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

double piper_clock_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void piper_clock_machine(char *out, size_t n) {
  gchar *text = NULL;
  if (g_file_get_contents("/proc/sys/kernel/random/boot_id", &text, NULL, NULL)) {
    g_strlcpy(out, g_strstrip(text), n);
    g_free(text);
    return;
  }
  if (gethostname(out, n) != 0)
    g_strlcpy(out, "unknown", n);
  out[n - 1] = 0;
}

int piper_cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

int piper_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

int piper_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
