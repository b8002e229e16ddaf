/* Compile benchmark: DeepSeek-V3, 32 PP regions in a V layout over 16 device groups, non-expert
 * regions replicated and experts sharded over each group, dualpipev. Prints IR nodes, plan
 * instructions, seconds and peak RSS for 128 / 512 / 2048 devices at 32 micro-batches, and for
 * 32 / 48 / 64 / 96 micro-batches at 2048 devices. Each configuration runs in its own process so
 * peak RSS is its own. Run from the repository root: build/bench/bench_compile */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "../../directives/compile.h"

#define GROUPS 16
#define STAGES 32

/* The V layout: stage s on group s for s < 16, else on group 31 - s. Stage 0 holds only dense
 * layers (DeepSeek-V3's first three layers are dense), so it has no expert region to shard. */
static char *write_program(uint32_t per_group) {
  char *path = g_strdup_printf("%s/piper-bench-ds-%u.json", g_get_tmp_dir(), per_group);
  GString *s = g_string_new("[\n");
  for (uint32_t st = 0; st < STAGES; st++) {
    uint32_t grp = st < GROUPS ? st : 2 * GROUPS - 1 - st;
    GString *devs = g_string_new(NULL);
    for (uint32_t k = 0; k < per_group; k++)
      g_string_append_printf(devs, "%s%u", k ? "," : "", grp * per_group + k);
    g_string_append_printf(s, "%s{\"op\":\"place\",\"filter\":{\"PP\":%u},\"devices\":[%s]},\n",
                           st ? "" : "", st, devs->str);
    g_string_append_printf(s, "{\"op\":\"replicate\",\"filter\":{\"PP\":%u},\"devices\":[%s]}", st,
                           devs->str);
    if (st > 0)
      g_string_append_printf(
          s, ",\n{\"op\":\"shard\",\"filter\":{\"PP\":%u,\"EP\":\"*\"},\"devices\":[%s]}", st,
          devs->str);
    g_string_append(s, st + 1 < STAGES ? ",\n" : "\n]\n");
    g_string_free(devs, TRUE);
  }
  g_file_set_contents(path, s->str, -1, NULL);
  g_string_free(s, TRUE);
  return path;
}

static int run_one(uint32_t per_group, uint32_t mbs) {
  char *path = write_program(per_group);
  struct compile_options o = compile_options_default();
  o.model_path = "models/deepseek-v3.json";
  o.directives_path = path;
  o.pp_regions = STAGES;
  o.have_schedule = true;
  o.schedule.family = SCHED_DUALPIPEV;
  o.schedule.mbs = mbs;
  double t0 = piper_clock_seconds();
  struct compile_result r;
  GError *err = NULL;
  if (!compile_run(&o, &r, &err)) {
    fprintf(stderr, "bench_compile: error: %s\n", err->message);
    return 1;
  }
  double t1 = piper_clock_seconds();
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double secs = t1 - t0;
  printf("%8u %6u %10u %14llu %9.3f %12.1f\n", r.plan->n_devices, mbs, r.graph->nodes->len,
         (unsigned long long)plan_instruction_count(r.plan), secs, ru.ru_maxrss / 1024.0);
  fflush(stdout);
  compile_result_free(&r);
  g_unlink(path);
  g_free(path);
  return 0;
}

int main(void) {
  static const uint32_t per_group[] = {8, 32, 128};
  static const uint32_t mbs[] = {32, 48, 64, 96}; /* dualpipev needs M >= 2R = 32 */
  printf("DeepSeek-V3, 32 PP regions (V layout over 16 groups), DP = EP = group size, dualpipev\n");
  printf("%8s %6s %10s %14s %9s %12s\n", "devices", "mbs", "IR nodes", "instructions", "seconds",
         "peak RSS MiB");
  fflush(stdout); /* the children must not inherit buffered lines */
  int status = 0;
  for (size_t i = 0; i < sizeof per_group / sizeof *per_group; i++) {
    pid_t pid = fork();
    if (pid == 0)
      _exit(run_one(per_group[i], 32));
    int ws;
    waitpid(pid, &ws, 0);
    status |= !WIFEXITED(ws) || WEXITSTATUS(ws);
  }
  for (size_t i = 0; i < sizeof mbs / sizeof *mbs; i++) {
    if (mbs[i] == 32)
      continue;
    pid_t pid = fork();
    if (pid == 0)
      _exit(run_one(128, mbs[i]));
    int ws;
    waitpid(pid, &ws, 0);
    status |= !WIFEXITED(ws) || WEXITSTATUS(ws);
  }
  return status;
}
