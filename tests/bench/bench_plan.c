/* Planner benchmark (issues 12 and 32). Issue 32: Llama-3.1-405B (126 layers) on 8,192 H100s,
 * global batch 2048 sequences, the default space with --recompute none,selective,full:uniform:1
 * (about a thousand configurations): the target is 1,000 configurations in 60 s on 2 cores with
 * a feasible answer; the static-memory bound leaves most of them unsimulated. Then issue 12's
 * 64-GPU Qwen3-30B-A3B question on an H100 profile, global
 * batch 256 sequences, micro-batch sizes 1 and 2 (every layout pp x dp x ep of 64 devices that
 * divides the model, every schedule that applies, ZeRO 0/2/3), first without tensor
 * parallelism, then with the default degrees (tp 2 and 4 with sequence parallelism: 8 does not
 * divide the 4 KV heads). Prints for each the configurations searched, the wall clock,
 * configurations per second, the CPU time and the best answer; the target is a few hundred
 * configurations in under a minute on 2 cores.
 * Run from the repository root: build/bench/bench_plan [THREADS (default 2)] [405b (only it)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../../tools/planner.h"

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

/* One search: tp NULL searches the default degrees. */
/* The issue-32 search: its counts and wall clock, simulated and bounded configurations, the
 * answer. Exits 1 when it has no feasible answer or misses the target by more than 3x (a loose
 * guard: the machine's load is not ours; figures in docs/sim.md). */
static int search_405b(uint32_t threads) {
  static const char *const recompute[] = {"none", "selective", "full:uniform:1"};
  struct planner_request rq = planner_request_default();
  rq.model_path = "models/llama3.1-405b.json";
  rq.profile_path = "profiles/h100-sxm.json";
  rq.devices = 8192;
  rq.global_batch = 2048;
  rq.recompute = recompute;
  rq.n_recompute = 3;
  rq.threads = threads;
  rq.progress = true;
  GError *err = NULL;
  double cpu0 = cpu_seconds();
  struct planner *pl = planner_new(&rq, &err);
  if (!pl) {
    fprintf(stderr, "bench_plan: %s\n", err->message);
    return 1;
  }
  planner_run(pl, &err);
  double cpu = cpu_seconds() - cpu0, wall = pl->check_seconds + pl->seconds;
  uint32_t feasible = 0, failed = 0;
  for (uint32_t i = 0; i < pl->n_configs; i++) {
    feasible += pl->configs[i].status == PLANNER_FEASIBLE;
    failed += pl->configs[i].status == PLANNER_FAILED;
  }
  printf("planner: llama3.1-405b, 8192 devices, h100-sxm, global batch 2048, recompute "
         "none,selective,full:uniform:1\n");
  printf("  %u configurations (%u layouts checked by the compiler in %.1f s; %u simulated, %u "
         "bounded; %u feasible, %u failed) in %.1f s wall on %u threads (%.1f configurations/s, "
         "%.1f s CPU)\n",
         pl->n_configs, pl->n_checked_layouts, pl->check_seconds, pl->n_simulated,
         pl->n_configs - pl->n_simulated, feasible, failed, wall, threads,
         pl->n_configs / wall, cpu);
  int rc = 0;
  if (feasible) {
    char *name = planner_config_name(&pl->configs[0]);
    printf("  best: %s (%s): %.6g tokens/s, %.4g ms a step, peak %.1f GiB\n", name,
           pl->configs[0].memory_choice, pl->configs[0].throughput_tokens_per_s,
           pl->configs[0].iteration_time_s * 1e3, pl->configs[0].peak_memory_bytes / (1u << 30));
    g_free(name);
  } else {
    printf("  FAIL: no feasible configuration\n");
    rc = 1;
  }
  /* 1,000 in 60 s on 2 threads: 3x that per configuration is a regression, not load */
  if (failed || wall / pl->n_configs * threads > 3 * 60.0 * 2 / 1000) {
    printf("  FAIL: %u failed, %.3f s a configuration per thread (target %.3f)\n", failed,
           wall / pl->n_configs * threads, 60.0 * 2 / 1000);
    rc = 1;
  }
  planner_free(pl);
  return rc;
}

static int search(uint32_t threads, const uint32_t *tp, uint32_t n_tp) {
  static const int64_t sizes[] = {1, 2};
  struct planner_request rq = planner_request_default();
  rq.model_path = "models/qwen3-30b-a3b.json";
  rq.profile_path = "profiles/h100-sxm.json";
  rq.devices = 64;
  rq.global_batch = 256;
  rq.micro_batch_sizes = sizes;
  rq.n_micro_batch_sizes = 2;
  rq.tp = tp;
  rq.n_tp = n_tp;
  rq.threads = threads ? threads : 2;
  rq.progress = true;
  GError *err = NULL;
  struct planner *pl = planner_new(&rq, &err);
  if (!pl) {
    fprintf(stderr, "bench_plan: %s\n", err->message);
    return 1;
  }
  double cpu0 = cpu_seconds();
  planner_run(pl, &err);
  double cpu = cpu_seconds() - cpu0;
  uint32_t feasible = 0, failed = 0;
  for (uint32_t i = 0; i < pl->n_configs; i++) {
    feasible += pl->configs[i].status == PLANNER_FEASIBLE;
    failed += pl->configs[i].status == PLANNER_FAILED;
  }
  printf("planner: qwen3-30b-a3b, 64 devices, h100-sxm, global batch 256, micro-batch sizes 1,2, %s\n",
         tp ? "no tensor parallelism" : "tensor parallelism 1, 2, 4 (default)");
  printf("  %u configurations (%u layouts; %u feasible, %u failed) in %.1f s wall on %u threads "
         "(%.1f configurations/s, %.1f s CPU)\n",
         pl->n_configs, pl->n_layouts, feasible, failed, pl->seconds, rq.threads,
         pl->n_configs / pl->seconds, cpu);
  if (feasible) {
    char *name = planner_config_name(&pl->configs[0]);
    printf("  best: %s (%s): %.6g tokens/s, %.4g ms a step\n", name, pl->configs[0].memory_choice,
           pl->configs[0].throughput_tokens_per_s, pl->configs[0].iteration_time_s * 1e3);
    g_free(name);
  }
  planner_free(pl);
  return 0;
}

int main(int argc, char **argv) {
  uint32_t threads = argc > 1 ? (uint32_t)atoi(argv[1]) : 2;
  bool only_405b = argc > 2 && strcmp(argv[2], "405b") == 0;
  static const uint32_t no_tp[] = {1};
  int rc = search_405b(threads ? threads : 2);
  if (only_405b)
    return rc;
  return search(threads, no_tp, 1) || search(threads, NULL, 0) || rc;
}
