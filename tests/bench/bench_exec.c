/* Executor benchmark (the figures of the piper-exec issue). Run from the repository root:
 *   build/bench/bench_exec            (PIPER_BIN=bin by default, for the multi-process part)
 * 1. tiny-dense on one CPU process (no MPI), 40 measured steps: tokens/s, the time inside
 *    kernels, and the executor's share of the wall time: (wall - kernels) / wall, where wall
 *    is the whole training loop (step setup and the loss exchange included).
 * 2. The executor overhead per instruction: for each instruction, from when it could start (its
 *    stream's previous instruction and the instructions it waits for were done) to its end,
 *    minus the time inside kernels and communication calls; plus each step's setup, over all
 *    instructions of all ranks. For tiny-moe on one process, and on 4 ranks (pp2_dp2_ep2,
 *    1F1B, mpirun) when mpirun is there; the part spent before an instruction started (thread
 *    wake-ups) is shown apart: on a machine with fewer cores than threads it is most of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../../directives/compile.h"
#include "../../exec/backend.h"
#include "../../base/json.h"

static struct plan *compile_one(const char *model, uint32_t mbs, struct compile_result *r) {
  char *path = g_build_filename(g_get_tmp_dir(), "piper-bench-exec-one.json", NULL);
  g_file_set_contents(path, "[]", -1, NULL);
  struct compile_options o = compile_options_default();
  o.model_path = model;
  o.directives_path = path;
  o.schedule.mbs = mbs;
  GError *err = NULL;
  bool ok = compile_run(&o, r, &err);
  g_free(path);
  if (!ok) {
    fprintf(stderr, "bench_exec: %s\n", err->message);
    exit(1);
  }
  return r->plan;
}

static void one_process(struct exec_backend *b, const char *model, uint32_t mbs, uint32_t iters) {
  struct compile_result cr;
  struct exec_options o = exec_options_default();
  o.plan = compile_one(model, mbs, &cr);
  o.warmup = 2;
  o.iters = iters;
  struct exec_result r;
  GError *err = NULL;
  if (!exec_run(&o, b, &r, &err)) {
    fprintf(stderr, "bench_exec: %s\n", err->message);
    exit(1);
  }
  double wall = r.wall_seconds;
  printf("%-10s 1 process, %u micro-batches: %8.0f tokens/s, %6.2f ms/step, kernels %5.1f%% of "
         "the wall time, executor %4.1f%%; overhead %5.2f us per instruction (%.2f us to start), "
         "%llu instructions\n",
         o.plan->model->name, mbs, r.tokens_per_step * iters / wall, wall / iters * 1e3,
         100 * r.kernel_seconds / wall, 100 * (wall - r.kernel_seconds - r.comm_seconds) / wall,
         r.job_overhead_per_instr_s * 1e6, r.job_dispatch_per_instr_s * 1e6,
         (unsigned long long)r.instructions);
  exec_result_clear(&r);
  compile_result_free(&cr);
}

/* One multi-process run of piper-exec under mpirun: np ranks, args after the model. */
static void ranks(uint32_t np, const char *what, const char *args) {
  const char *bin = getenv("PIPER_BIN") ? getenv("PIPER_BIN") : "bin";
  char *dir = g_dir_make_tmp("piper-bench-exec-XXXXXX", NULL);
  char *cmd = g_strdup_printf(
      "OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "mpirun --oversubscribe -np %u %s/piper-exec --model models/tiny-moe.json %s --warmup 2 "
      "--iters 30 --quiet --out %s >/dev/null 2>&1",
      np, bin, args, dir);
  int rc = system(cmd);
  char *metrics = g_build_filename(dir, "metrics.json", NULL);
  GError *err = NULL;
  cJSON *m = rc == 0 ? json_parse_file(metrics, &err) : NULL;
  if (!m) {
    printf("tiny-moe   %u ranks: not run (mpirun or %s/piper-exec missing, or it failed: %d)\n", np,
           bin, rc);
  } else {
    double over = 0, disp = 0, tps = 0;
    json_get_double(m, "executor_overhead_us_per_instruction", true, 0, 1e9, &over, metrics, &err);
    json_get_double(m, "executor_dispatch_us_per_instruction", true, 0, 1e9, &disp, metrics, &err);
    json_get_double(m, "throughput_tokens_per_s", true, 0, 1e12, &tps, metrics, &err);
    printf("tiny-moe   %u ranks (%s): %8.0f tokens/s; overhead %5.2f us per instruction (%.2f us "
           "to start), %ld cores\n",
           np, what, tps, over, disp, sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_Delete(m);
  }
  g_clear_error(&err);
  char *rm = g_strdup_printf("rm -rf '%s'", dir);
  if (system(rm) != 0)
    fprintf(stderr, "bench_exec: could not remove %s\n", dir);
  g_free(rm);
  g_free(metrics);
  g_free(cmd);
  g_free(dir);
}

int main(void) {
  g_setenv("OPENBLAS_NUM_THREADS", "1", FALSE);
  GError *err = NULL;
  struct exec_backend *b = exec_backend_init(&exec_backend_host, NULL, &err);
  if (!b) {
    fprintf(stderr, "bench_exec: %s\n", err->message);
    return 1;
  }
  one_process(b, "models/tiny-dense.json", 2, 40);
  one_process(b, "models/tiny-moe.json", 8, 20);
  exec_backend_free(b);
  /* two pipeline stages, one per rank (test_exec.sh's pp2.json) */
  char *pp2 = g_build_filename(g_get_tmp_dir(), "piper-bench-exec-pp2.json", NULL);
  g_file_set_contents(pp2,
                      "[{\"op\": \"place\", \"filter\": {\"PP\": 0}, \"devices\": [0]},\n"
                      " {\"op\": \"place\", \"filter\": {\"PP\": 1}, \"devices\": [1]}]\n",
                      -1, NULL);
  char *pp2_args = g_strdup_printf("--directives %s --schedule 1f1b --ranks 2 --mbs 8", pp2);
  ranks(2, "PP2, 1F1B, 8 micro-batches", pp2_args);
  g_free(pp2_args);
  g_free(pp2);
  ranks(4, "pp2_dp2_ep2, 1F1B, 4 micro-batches",
        "--base-schedule directives/base-schedules/pp2_dp2_ep2.json --schedule 1f1b --ranks 2 "
        "--mbs 4");
  return 0;
}
