/* report: where a run directory goes. A default one is new for every run (mkdir is the lock,
 * so two runs started in the same second never share one); an explicit one that already holds
 * another run's files is refused unless the user says to overwrite them. */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#include "report.h"
#include "../base/base.h"

/* The files whose presence marks a directory as another run's. */
static const char *const run_files[] = {"metrics.json", "results.csv", "trace.json", "sweep.csv"};

char *report_run_dir_new(const char *parent, GError **err) {
  if (g_mkdir_with_parents(parent, 0755) != 0) {
    piper_runtime_error(err, "%s: cannot create directory: %s", parent, g_strerror(errno));
    return NULL;
  }
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tmv);
  for (uint32_t k = 1; k < 100000; k++) {
    char *dir = k == 1 ? g_strdup_printf("%s/%s", parent, stamp)
                       : g_strdup_printf("%s/%s_%u", parent, stamp, k);
    if (mkdir(dir, 0755) == 0)
      return dir;
    int e = errno;
    if (e != EEXIST) {
      piper_runtime_error(err, "%s: cannot create directory: %s", dir, g_strerror(e));
      g_free(dir);
      return NULL;
    }
    g_free(dir);
  }
  piper_runtime_error(err, "%s/%s: every run directory name of this second is taken", parent,
                      stamp);
  return NULL;
}

bool report_run_dir_claim(const char *dir, bool force, GError **err) {
  /* before any work: a directory that cannot be made or written is said now, not after a
   * search or a training run */
  if (g_mkdir_with_parents(dir, 0755) != 0 || access(dir, W_OK) != 0)
    return piper_input_error(err, "--out %s: cannot write there: %s", dir, g_strerror(errno));
  if (force)
    return true;
  for (size_t k = 0; k < G_N_ELEMENTS(run_files); k++) {
    char *path = g_build_filename(dir, run_files[k], NULL);
    bool there = g_file_test(path, G_FILE_TEST_EXISTS);
    g_free(path);
    if (there)
      return piper_input_error(err,
                               "--out %s: the directory holds another run's %s (give --force to "
                               "overwrite it, or another --out)",
                               dir, run_files[k]);
  }
  return true;
}
