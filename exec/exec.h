/* exec: the executor (docs/design.md, "The executor's contract"). Runs the per-device plans
 * for real, one process per device, on a backend (host: CPU + MPI; cuda: GPU + NCCL). This header is for
 * people who run plans; exec/backend.h is for people who write backends.
 *
 *   GError *err = NULL;
 *   const struct plan *plan = NULL; // from compile_run or plan_read_dir
 *   struct exec_backend *b = exec_backend_init_by_name("host", NULL, &err);
 *   struct exec_options o = exec_options_default();
 *   o.plan = plan;
 *   o.iters = 10;
 *   struct exec_result r = {0};
 *   if (b && exec_run(&o, b, &r, &err))
 *     printf("final loss %f\n", r.losses[r.n_steps - 1]);
 *   exec_result_clear(&r);
 *   exec_backend_free(b);
 */
#ifndef PIPER_EXEC_EXEC_H
#define PIPER_EXEC_EXEC_H

#include <glib.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "../base/launch.h"
#include "../ir/plan.h"
#include "hooks.h"
#include "lr_schedule.h"

struct exec_backend; /* an instance of a backend (exec/backend.h) */

struct exec_backend_params {
  int *argc; /* for MPI_Init_thread; may be NULL */
  char ***argv;
  bool force_mpi;             /* host: start MPI even when no launcher started this process */
  struct piper_launch launch; /* the launcher's view of this process (piper_launch_detect) */
};

/* A built-in backend by name (input error: not built in, or it cannot start), and its end. */
struct exec_backend *exec_backend_init_by_name(const char *name,
                                               const struct exec_backend_params *p, GError **err);
void exec_backend_free(struct exec_backend *b);
/* The i-th built-in backend's name and one-line description; NULL past the last. */
const char *exec_backend_builtin(uint32_t i, const char **description);
const char *exec_backend_name(const struct exec_backend *b);
uint32_t exec_backend_world_rank(struct exec_backend *b);
uint32_t exec_backend_world_size(struct exec_backend *b);
const char *exec_backend_comm_library(struct exec_backend *b); /* "MPI (Open MPI 4.1.4)" */
/* Ends every process of the job now, after an unrecoverable error (peers may be blocked). */
void exec_backend_abort(struct exec_backend *b, int code);

struct exec_options {
  const struct plan *plan;  /* the whole plan; this process runs device = world rank */
  const char *schedule;     /* family name for the report, "custom" if NULL */
  const char *program_file; /* "<schedule>_pp<R>_mbs<M>.json" for the report, or NULL */
  uint32_t warmup, iters;   /* steps run = warmup + iters; timings over the last iters */
  uint64_t seed;            /* initialisation and synthetic data */
  const char *data_path;    /* token file or byte file; NULL = synthetic */
  float lr, beta1, beta2, eps, weight_decay; /* lr: the schedule's peak */
  struct exec_lr_schedule lr_schedule;
  float clip_grad; /* clip gradients to this global L2 norm before the update; 0: never */
  /* Held-out loss: every eval_every steps and after the last, the mean loss of eval_iters
   * global batches of eval_path (the same batches each time), forward only (0: never) */
  const char *eval_path;
  uint32_t eval_every, eval_iters;
  double peak_flops;          /* per device, for the step's MFU; 0: unknown */
  double timeout_s;           /* watchdog: no progress for this long is an error */
  const char *checkpoint_dir; /* write checkpoints here every checkpoint_every steps */
  uint32_t checkpoint_every;
  uint32_t checkpoint_keep; /* keep the last K step directories; 0 = all */
  const char *resume_dir;   /* resume from the latest checkpoint in this directory */
  /* What a resume may find changed: "lr,weight_decay,beta1,beta2,eps,data,schedule" (any
   * of them, comma-separated); NULL = nothing. Every other difference is refused. */
  const char *resume_allow_change;
  bool report; /* rank 0 returns the measured run (exec_result_report) for a run directory */
  const char *dump_params_path; /* rank 0 writes every parameter here (float32, model order) */
  /* Hugging Face weights: start from the safetensors in load_hf_dir (shards with their
   * model.safetensors.index.json, or model.safetensors); write the final parameters to
   * save_hf_dir/model.safetensors + config.json in save_hf_dtype ("bf16", "fp32": default) */
  const char *load_hf_dir, *save_hf_dir, *save_hf_dtype;
  bool progress;      /* rank 0 prints a line per step, with the time left at the pace so far */
  uint32_t log_every; /* every log_every-th step only (0, 1: all; the first and last always) */
  double straggler_threshold; /* a rank this much slower than its peers' median: a straggler */
  struct exec_hooks hooks;    /* faults and slow-downs on purpose (exec/hooks.h); none by default */
  /* Nonzero (a signal handler sets it): stop at the next step boundary, where every rank
   * agrees on it (the step's loss exchange); the run holds the steps done. NULL: never. */
  const volatile sig_atomic_t *stop;
};

struct exec_options exec_options_default(void);

/* A rank whose compute was slower than its peers' (its plan class) in slow_steps of the
 * measured steps, by ratio (the median over the steps of its time / the peers' median). */
struct exec_straggler {
  uint32_t rank, class_id, peers, slow_steps;
  double ratio;
};

struct exec_result {
  uint32_t n_steps, first_step; /* steps this call ran (after a resume: the rest), 1-based */
  double *losses, *step_times;  /* [n_steps]: mean loss of the global batch; first start to
                                  last end over all ranks, seconds */
  double tokens_per_step;       /* global batch tokens */
  double wall_seconds;   /* measured steps as this rank's loop saw them (setup, loss exchange) */
  uint64_t instructions; /* instructions this rank ran */
  /* time inside kernels, communication calls and instruction bodies (this rank, all steps) */
  double kernel_seconds, comm_seconds, task_seconds;
  double overhead_per_instr_s; /* executor latency per instruction (see the README) */
  double dispatch_per_instr_s; /* the part of it before the instruction started */
  double job_overhead_per_instr_s, job_dispatch_per_instr_s; /* the same over all ranks */
  /* a backend that runs its own loop (host): what one test of posted communication costs,
   * and how many it made per instruction (this rank, measured steps); 0 otherwise */
  double comm_test_s, comm_tests_per_instr;
  uint64_t peak_memory_bytes;
  double *compute_seconds; /* [n_devices]: each rank's compute per measured step, mean */
  uint32_t n_stragglers;   /* ranks consistently slower than their peers (all ranks know) */
  struct exec_straggler *stragglers;
  struct exec_report *report; /* with exec_options.report, on rank 0: exec_result_report */
  /* After a failure: every rank failed at the same agreed point (the job can end without an
   * abort), and whether another rank prints the error (this one need not). */
  bool error_everywhere, error_printed_elsewhere;
  bool stopped; /* exec_options.stop ended the run early, after n_steps steps */
  /* [n_steps]: the step's learning rate, global gradient norm (before clipping), peak
   * memory so far (the job's largest rank, bytes), MFU (NAN without peak_flops) */
  double *lrs, *grad_norms, *peak_memory, *mfu;
  /* evaluations: after step eval_steps[k], the held-out loss eval_losses[k] */
  uint32_t n_evals;
  uint32_t *eval_steps;
  double *eval_losses;
};

bool exec_run(const struct exec_options *o, struct exec_backend *b, struct exec_result *r,
              GError **err);
void exec_result_clear(struct exec_result *r);
/* The measured run (every rank's trace, memory and statistics: report/report.h) to write with
 * report_write_dir, report_write_charts; NULL without exec_options.report or off rank 0. */
struct report_run;
const struct report_run *exec_result_report(const struct exec_result *r);
void exec_report_free(struct exec_report *x);

#endif
