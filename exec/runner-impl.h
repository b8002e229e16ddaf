/* runner-impl: what the plan runner's files share (runner.c drives the steps; runner_wait.c
 * waits under the watchdog; runner_report.c keeps the measured trace and gathers the run rank 0 returns, and the final
 * parameters). */
#ifndef PIPER_EXEC_RUNNER_IMPL_H
#define PIPER_EXEC_RUNNER_IMPL_H

#include "exec-impl.h"

struct runner;

struct task {
  struct runner *R;
  uint32_t i;
};

/* A job-wide operation run on the control stream. */
struct control_job {
  struct runner *R;
  bool (*fn)(struct runner *R, void *arg, GError **err);
  void *arg;
};

struct step_stats {
  double *losses; /* [dp * M] by global micro-batch */
  uint32_t n;
  /* -first start, last end, a stop asked for on some rank, peak memory so far (bytes) */
  double window[4];
  double *compute;  /* [n_devices]: each rank's compute time this step (its slot, others 0) */
};

struct runner {
  struct exec_state s;
  struct exec_model xm;
  struct exec_device device;
  const struct exec_options *o;
  struct exec_backend *b;
  const struct exec_device *dev;
  uint32_t rank;
  struct exec_stream **streams; /* [plan n_streams], NULL where unused */
  struct exec_stream *control;
  struct exec_event **events;     /* [n_instrs] */
  struct exec_event **stream_end; /* [plan n_streams] */
  struct exec_event *control_end;
  struct task *tasks;
  /* per-instruction measurements of the current step */
  double *start, *end, *kernel, *comm;
  /* a compute instruction's time on the backend's busy clock (when busy_known: it has one and
   * the job has ranks to compare), the stragglers' measure; else its kernel time */
  double *busy;
  bool busy_known;
  double step_setup, step_fill;
  bool tracing; /* record memory points (the last step) */
  GMutex trace_lock;
  GArray *memory; /* struct report_memory_point */
  /* totals over measured steps */
  uint64_t instructions;
  double kernel_s, comm_s, task_s, overhead_s, dispatch_s;
  bool loop_known; /* the backend measures its own loop (exec_backend_loop_stats) */
  struct exec_backend_loop_stats loop_step, loop_total; /* this step's, measured steps' */
  bool stall_armed;
  uint32_t stall_instr;
  struct exec_comm *fault_comm; /* the stall's own communicator (fault injection only) */
  int32_t stall_word;           /* the stalled receive's buffer */
  bool model_ready, device_ready; /* what teardown frees */
  bool clean; /* false while streams may be busy or blocked (after a failure: drain them) */
  double progress_t0; /* wall clock at the start of the first step run (for the ETA) */
  struct step_stats ss;
  /* --clip-grad: the optimizer and ZeRO's gathers of updated shards (deferred_role) run in a
   * second phase of the step, once the global gradient norm is known */
  bool defer_update;
  double *norm_sum;   /* device memory: this rank's share of the squared norm */
  double grad_norm;   /* the step's global gradient norm, before clipping */
  struct exec_data *eval_data; /* --eval-data */
  double *measured; /* [n_steps]: step times of measured steps */
  GArray *compute_steps; /* double [n_measured][n_devices]: every rank's compute per step */
  uint32_t n_measured;
  /* the trace of every measured step (write_report): intervals, and per step a pair
   * (step number, first index into traced) */
  GArray *traced;       /* struct report_interval */
  GArray *traced_steps; /* uint32_t pairs */
};

/* runner_wait.c: the events evs [n] waited for under the watchdog (an input or runtime error
 * naming the instruction that stalled or failed). */
/* runner_setup.c: the model, this device's program and the state (input error for what this
 * machine or backend cannot run), then the data, parameters, communicators and streams. */
bool exec_runner_prepare(struct runner *R, const struct exec_options *o, struct exec_backend *b,
                         uint32_t rank, GError **err);
bool exec_runner_setup(struct runner *R, GError **err);
bool exec_runner_wait_events(struct runner *R, struct exec_event **evs, uint32_t n,
                             GError **err);
/* runner_wait.c: fn(R, arg) on the control stream, waited for under the watchdog (job-wide
 * operations: a dead peer cannot block the main thread). */
bool exec_runner_control(struct runner *R, bool (*fn)(struct runner *, void *, GError **),
                         void *arg, GError **err);

/* runner.c: v [n] reduced over the job with op, as a job-wide operation. */
bool exec_runner_all_reduce(struct runner *R, double *v, uint64_t n, enum exec_reduce_op op,
                            GError **err);

/* hf_save.c: the final parameters as o->save_hf_dir/model.safetensors + config.json, each op
 * gathered to rank 0 from the ranks holding it (docs/exec.md, "Hugging Face weights"). */
bool exec_runner_save_hf(struct runner *R, GError **err);

/* runner_report.c: keep step `step`'s intervals in the trace; gather every rank's trace on
 * rank 0 into res->report; write the final parameters (rank 0, o->dump_params_path). */
void exec_runner_keep_step_trace(struct runner *R, uint32_t step);
bool exec_runner_gather_report(struct runner *R, struct exec_result *res,
                               const double *all_losses, uint32_t n_losses,
                               const double *measured, uint32_t n_measured, GError **err);
bool exec_runner_dump_params(struct runner *R, GError **err);

#endif
