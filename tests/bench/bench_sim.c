/* bench_sim: the simulator's performance figures (issue 4). Run from the repository root:
 *   make bench && build/bench/bench_sim [--quick]
 * 1. DeepSeek-V3 (32 PP regions in a V layout over 16 device groups, non-expert regions
 *    replicated and experts sharded over each group, dualpipev, 32 micro-batches) on
 *    profiles/h200.json at 512, 1024 and 2048 devices: compile seconds, simulation seconds,
 *    simulated instructions per second, peak RSS; then the same with every device simulated
 *    (no collapsing), a check of the collapsed result and the engine's raw, linear speed.
 * 2. A sweep of 102 configurations of Qwen3-30B-A3B on 64 GPUs (h100-sxm and h200 profiles).
 * Prints figures; asserts nothing (benchmarks are not tests). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../../base/base.h"
#include "../../base/json.h"
#include "../../directives/compile.h"
#include "../../sim/sim.h"
#include "../../tools/sweep.h"

static double peak_rss_gib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / (1024.0 * 1024.0); /* ru_maxrss is KiB on Linux */
}

/* A base program: stage s of n_stages on rank rank_of[s], g devices per rank; non-expert
 * regions replicated and experts sharded over each rank's devices (stages from first_moe_stage
 * on hold MoE layers). */
static void write_base(const char *path, uint32_t n_stages, const uint32_t *rank_of, uint32_t g,
                       uint32_t first_moe_stage) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs("[\n", f);
  for (uint32_t s = 0; s < n_stages; s++) {
    GString *devs = g_string_new("");
    for (uint32_t i = 0; i < g; i++)
      g_string_append_printf(devs, "%s%u", i ? "," : "", rank_of[s] * g + i);
    fprintf(f, "%s{\"op\":\"place\",\"filter\":{\"PP\":%u},\"devices\":[%s]}", s ? ",\n" : "", s,
            devs->str);
    if (g > 1) {
      fprintf(f, ",\n{\"op\":\"replicate\",\"filter\":{\"PP\":%u},\"devices\":[%s]}", s, devs->str);
      if (s >= first_moe_stage)
        fprintf(f, ",\n{\"op\":\"shard\",\"filter\":{\"PP\":%u,\"EP\":\"*\"},\"devices\":[%s]}", s,
                devs->str);
    }
    g_string_free(devs, TRUE);
  }
  fputs("\n]\n", f);
  fclose(f);
}

static void v_layout(uint32_t ranks, uint32_t *rank_of) {
  for (uint32_t s = 0; s < 2 * ranks; s++)
    rank_of[s] = s < ranks ? s : 2 * ranks - 1 - s;
}


static int deepseek(const char *dir, uint32_t g, bool collapse) {
  const uint32_t R = 16, stages = 32;
  uint32_t rank_of[32];
  v_layout(R, rank_of);
  char path[512];
  snprintf(path, sizeof path, "%s/deepseek_v3_pp32_v_dp%u.json", dir, g);
  write_base(path, stages, rank_of, g, 1); /* stage 0: DeepSeek-V3's dense first layers */
  GError *err = NULL;
  double t0 = piper_clock_seconds();
  struct sched_options so = {.family = SCHED_DUALPIPEV, .mbs = 32};
  struct plan *p = compile_plan("models/deepseek-v3.json", path, &so, (int)stages, &err);
  double t1 = piper_clock_seconds();
  if (!p) {
    fprintf(stderr, "bench_sim: error: %s\n", err->message);
    return 1;
  }
  struct profile *prof = profile_load_file("profiles/h200.json", &err);
  if (!prof) {
    fprintf(stderr, "bench_sim: error: %s\n", err->message);
    return 1;
  }
  struct sim_options o = {.collapse = collapse};
  double t2 = piper_clock_seconds();
  struct sim_result *r = sim_run(p, prof, &o, &err);
  double t3 = piper_clock_seconds();
  if (!r) {
    fprintf(stderr, "bench_sim: error: %s\n", err->message);
    return 1;
  }
  /* the run's report figures too, as piper-sim computes them */
  struct report_run run = {.plan = p,
                           .kind = "sim",
                           .schedule = "dualpipev",
                           .n_iterations = 1,
                           .iteration_times = &r->iteration_time};
  report_run_init_devices(&run);
  sim_fill_report(r, &run);
  report_compute_stats(&run);
  double t4 = piper_clock_seconds();
  double sim_s = t3 - t2;
  printf("deepseek-v3 %5u devices %-11s compile %6.3f s  simulate %6.3f s  (+ metrics %5.3f s)  "
         "%9llu instr  %7.2f M instr/s  units %4u  iteration %.4f s  peak RSS %.2f GiB\n",
         p->n_devices, collapse ? "(collapsed)" : "(all)", t1 - t0, sim_s, t4 - t3,
         (unsigned long long)r->device_instructions, (double)r->device_instructions / sim_s / 1e6,
         r->n_units, r->iteration_time, peak_rss_gib());
  fflush(stdout);
  report_run_free_devices(&run);
  sim_result_free(r);
  profile_free(prof);
  plan_free(p);
  remove(path);
  return 0;
}

static int qwen_sweep(const char *dir) {
  /* 64 GPUs as 8 pipeline ranks of 8 devices (data and expert parallel inside each rank), three
   * schedule families, 17 micro-batch counts and two profiles: 102 configurations, all of which
   * compile and simulate. */
  uint32_t lin[8];
  for (uint32_t s = 0; s < 8; s++)
    lin[s] = s;
  GString *bases = g_string_new("");
  char base_path[512];
  snprintf(base_path, sizeof base_path, "%s/qwen_pp8_dp8.json", dir);
  write_base(base_path, 8, lin, 8, 0);
  g_string_append_printf(bases, "\"%s\"", base_path);
  GString *mbs = g_string_new("");
  for (uint32_t m = 8; m <= 136; m += 8)
    g_string_append_printf(mbs, "%s%u", m > 8 ? "," : "", m);
  char sweep_path[512];
  snprintf(sweep_path, sizeof sweep_path, "%s/qwen_sweep.json", dir);
  FILE *f = fopen(sweep_path, "w");
  fprintf(f,
          "{\"model\":\"models/qwen3-30b-a3b.json\",\"pp_regions\":8,\"base_schedules\":[%s],"
          "\"schedules\":[\"gpipe\",\"1f1b\",\"zerobubble\"],"
          "\"microbatches\":[%s],\"profiles\":[\"profiles/h100-sxm.json\",\"profiles/h200.json\"],"
          "\"memory_cap_gib\":80}\n",
          bases->str, mbs->str);
  g_string_free(mbs, TRUE);
  fclose(f);
  g_string_free(bases, TRUE);
  GError *err = NULL;
  struct sweep *s = sweep_load_file(sweep_path, &err);
  if (!s) {
    fprintf(stderr, "bench_sim: error: %s\n", err->message);
    return 1;
  }
  char out[512];
  snprintf(out, sizeof out, "%s/sweep-out", dir);
  double t0 = piper_clock_seconds();
  bool ok = sweep_run(s, out, false, &err);
  double t1 = piper_clock_seconds();
  if (!ok) {
    fprintf(stderr, "bench_sim: error: %s\n", err->message);
    return 1;
  }
  uint32_t feasible = 0, failed = 0;
  for (uint32_t i = 0; i < s->n_points; i++) {
    feasible += s->points[i].feasible;
    failed += !s->points[i].ok;
  }
  printf("qwen3-30b-a3b sweep on 64 GPUs: %u configurations (%u within the memory cap, %u "
         "failed) in %.2f s; peak RSS %.2f GiB\n",
         s->n_points, feasible, failed, t1 - t0, peak_rss_gib());
  sweep_free(s);
  return 0;
}

int main(int argc, char **argv) {
  bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  char dir[] = "/tmp/bench_sim_XXXXXX";
  if (!g_mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  int rc = 0;
  const uint32_t gs[] = {32, 64, 128};
  for (int i = quick ? 2 : 0; i < 3 && rc == 0; i++)
    rc = deepseek(dir, gs[i], true);
  /* every device simulated: the engine's raw speed, linear in devices */
  for (int i = 0; i < 3 && rc == 0 && !quick; i++)
    rc = deepseek(dir, gs[i], false);
  if (rc == 0 && !quick)
    rc = qwen_sweep(dir);
  char *cmd = g_strdup_printf("rm -rf %s", dir);
  if (system(cmd) != 0)
    rc = 1;
  g_free(cmd);
  return rc;
}
