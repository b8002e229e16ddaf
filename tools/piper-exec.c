/* piper-exec: train a model by running its per-device plans for real
 * (docs/design.md, "The executor's contract"): one process per device (mpirun / srun; one
 * process alone runs a one-device plan), writing the run directory from measured times
 * (docs/design.md, "Outputs and exit statuses"). Exit status: 0 success, 1 runtime failure (a
 * watchdog, a dead peer, I/O), 2 bad input. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <glib/gstdio.h>

#ifdef HAVE_BLAS
#include <cblas.h>
#endif

#include "../directives/compile.h"
#include "../exec/exec.h"
#include "../exec/watchdog.h"
#include "../base/json.h"
#include "../base/version.h"
#include "../report/chart.h"
#include "options.h"

/* What the command line asks for. */
struct exec_cli {
  struct compile_args compile;
  struct exec_options run; /* the training options the table fills (iters, lr, ...) */
  const char *plans, *out, *backend, *data, *checkpoint, *resume, *dump_params;
  const char *lr_decay_style, *lr_wsd_decay_style, *eval_data;
  double peak_tflops;
  uint32_t checkpoint_every, seed;
  bool quiet, no_report, no_charts, force;
};

static void list_backends(const struct option_program *p) {
  (void)p;
  const char *name, *description;
  for (uint32_t k = 0; (name = exec_backend_builtin(k, &description)); k++)
    printf("%s\t%s\n", name, description);
}

/* One row per option, as in redis's config table: kept as rows, not reflowed. */
// clang-format off
#define EXEC_OPTION(field) .offset = offsetof(struct exec_cli, field)
#define STEPS_MAX (UINT32_MAX - 1)
static const struct option_spec options[] = {
    {.kind = OPTION_HEADING, .help = "plan:"},
    OPTIONS_COMPILE_ARGS(struct exec_cli, compile),
    {.name = "--plans", .kind = OPTION_STRING, EXEC_OPTION(plans), .metavar = "DIR",
     .help = "plans written by piper-compile -o DIR instead"},
    {.kind = OPTION_HEADING, .help = "training:"},
    {.name = "--backend", .kind = OPTION_STRING, EXEC_OPTION(backend), .metavar = "NAME",
     .help = "host (default); see --list-backends"},
    {.name = "--iters", .kind = OPTION_U32, EXEC_OPTION(run.iters), .lo = 1, .hi = STEPS_MAX,
     .metavar = "N", .help = "measured steps (default 10); training ends at step K+N\n"
                             "counted from its start: a --resume runs the steps left to\n"
                             "it, not N more"},
    {.name = "--warmup", .kind = OPTION_U32, EXEC_OPTION(run.warmup), .lo = 0, .hi = STEPS_MAX,
     .metavar = "K", .help = "steps before them, trained but not timed (default 1)"},
    {.name = "--data", .kind = OPTION_STRING, EXEC_OPTION(data), .metavar = "FILE",
     .help = "token file (llm.c format, uint16) or any file as bytes;\n"
             "default: a synthetic stream"},
    {.name = "--seed", .kind = OPTION_U32, EXEC_OPTION(seed), .lo = 0, .hi = UINT32_MAX - 1,
     .metavar = "S", .help = "initialisation and synthetic data (default 1234)"},
    {.name = "--lr", .kind = OPTION_FLOAT, EXEC_OPTION(run.lr), .lo = 0, .hi = 10,
     .metavar = "X", .help = "AdamW learning rate: the schedule's peak (default 0.001)"},
    {.name = "--weight-decay", .kind = OPTION_FLOAT, EXEC_OPTION(run.weight_decay), .lo = 0,
     .hi = 10, .metavar = "X", .help = "AdamW weight decay (default 0)"},
    {.name = "--lr-warmup-iters", .kind = OPTION_U32, EXEC_OPTION(run.lr_schedule.warmup_iters),
     .hi = STEPS_MAX, .metavar = "N", .help = "rise linearly to --lr over N steps (default 0)"},
    {.name = "--lr-decay-style", .kind = OPTION_STRING, EXEC_OPTION(lr_decay_style),
     .metavar = "S", .help = "then constant (default), linear, cosine or wsd ..."},
    {.name = "--min-lr", .kind = OPTION_FLOAT, EXEC_OPTION(run.lr_schedule.min_lr), .lo = 0,
     .hi = 10, .metavar = "X", .help = "... to X (default 0) ..."},
    {.name = "--lr-decay-iters", .kind = OPTION_U32, EXEC_OPTION(run.lr_schedule.decay_iters),
     .lo = 1, .hi = STEPS_MAX, .metavar = "N", .help = "... at step N (default: the last)"},
    {.name = "--lr-wsd-decay-iters", .kind = OPTION_U32,
     EXEC_OPTION(run.lr_schedule.wsd_decay_iters), .lo = 1, .hi = STEPS_MAX, .metavar = "N",
     .help = "wsd: anneal over the last N steps of the decay ..."},
    {.name = "--lr-wsd-decay-fraction", .kind = OPTION_FLOAT,
     EXEC_OPTION(run.lr_schedule.wsd_decay_fraction), .lo = 1e-6, .hi = 1, .metavar = "F",
     .help = "... or over this fraction of them (default 0.1) ..."},
    {.name = "--lr-wsd-decay-style", .kind = OPTION_STRING, EXEC_OPTION(lr_wsd_decay_style),
     .metavar = "S", .help = "... shaped exponential (default), linear, cosine, minus_sqrt"},
    {.name = "--clip-grad", .kind = OPTION_FLOAT, EXEC_OPTION(run.clip_grad), .lo = 0, .hi = 1e9,
     .metavar = "X", .help = "clip gradients to global L2 norm X (default 0: never)"},
    {.name = "--eval-data", .kind = OPTION_STRING, EXEC_OPTION(eval_data), .metavar = "FILE",
     .help = "held-out data (as --data): its loss, forward only, ..."},
    {.name = "--eval-every", .kind = OPTION_U32, EXEC_OPTION(run.eval_every), .lo = 1,
     .hi = STEPS_MAX, .metavar = "N", .help = "... every N steps and after the last ..."},
    {.name = "--eval-iters", .kind = OPTION_U32, EXEC_OPTION(run.eval_iters), .lo = 1,
     .hi = STEPS_MAX, .metavar = "K", .help = "... over its first K global batches (default 1)"},
    {.name = "--peak-tflops", .kind = OPTION_DOUBLE, EXEC_OPTION(peak_tflops), .lo = 1e-6,
     .hi = 1e9, .metavar = "X", .help = "a device's peak, for the step line's MFU"},
    {.name = "--checkpoint", .kind = OPTION_STRING, EXEC_OPTION(checkpoint), .metavar = "DIR",
     .help = "write checkpoints to DIR ..."},
    {.name = "--checkpoint-every", .kind = OPTION_U32, EXEC_OPTION(checkpoint_every), .lo = 1,
     .hi = STEPS_MAX, .metavar = "K", .help = "... every K steps and after the last"},
    {.name = "--checkpoint-keep", .kind = OPTION_U32, EXEC_OPTION(run.checkpoint_keep), .lo = 1,
     .hi = STEPS_MAX, .metavar = "K", .help = "keep the last K checkpoints (default: all)"},
    {.name = "--resume", .kind = OPTION_STRING, EXEC_OPTION(resume), .metavar = "DIR",
     .help = "continue from the latest checkpoint in DIR"},
    {.name = "--resume-allow-change", .kind = OPTION_STRING, EXEC_OPTION(run.resume_allow_change),
     .metavar = "LIST", .help = "accept these changes on --resume (comma-separated: lr,\n"
             "weight_decay, beta1, beta2, eps, data, schedule, clip_grad;\n"
             "layout: resume on another layout, resharded)"},
    {.name = "--timeout", .kind = OPTION_DOUBLE, EXEC_OPTION(run.timeout_s), .lo = 0.01,
     .hi = 1e9, .metavar = "S",
     .help = "watchdog: fail when nothing progresses for S seconds (default 300)"},
    {.name = "--straggler-threshold", .kind = OPTION_DOUBLE, EXEC_OPTION(run.straggler_threshold),
     .lo = 0.01, .hi = 100, .metavar = "F",
     .help = "name a rank whose compute exceeds its peers' median by more than\n"
             "F (default 0.25) in 3 of 4 measured steps"},
    {.kind = OPTION_HEADING, .help = "output:"},
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING, EXEC_OPTION(out), .metavar = "DIR",
     .help = "run directory (default: a new out/<YYYYmmdd_HHMMSS>[_K])"},
    {.name = "--force", .kind = OPTION_FLAG, EXEC_OPTION(force),
     .help = "overwrite another run's files in --out DIR"},
    {.name = "--no-report", .kind = OPTION_FLAG, EXEC_OPTION(no_report),
     .help = "write no run directory"},
    {.name = "--dump-params", .kind = OPTION_STRING, EXEC_OPTION(dump_params), .metavar = "FILE",
     .help = "write the final parameters (float32, model op order)"},
    {.name = "--load-hf", .kind = OPTION_STRING, EXEC_OPTION(run.load_hf_dir), .metavar = "DIR",
     .help = "start from Hugging Face safetensors in DIR (with its index)"},
    {.name = "--save-hf", .kind = OPTION_STRING, EXEC_OPTION(run.save_hf_dir), .metavar = "DIR",
     .help = "write the final parameters as DIR/model.safetensors + config.json"},
    {.name = "--save-dtype", .kind = OPTION_STRING, EXEC_OPTION(run.save_hf_dtype),
     .metavar = "T", .help = "... in bf16 or fp32 (default)"},
    {.name = "--no-charts", .kind = OPTION_FLAG, EXEC_OPTION(no_charts),
     .help = "draw no schedule.png/.svg or memory.png of the measured step"},
    {.name = "--quiet", .kind = OPTION_FLAG, EXEC_OPTION(quiet),
     .help = "no per-step lines (the summary, checkpoint and resume lines stay)"},
    {.name = "--log-every", .kind = OPTION_U32, EXEC_OPTION(run.log_every), .lo = 1,
     .hi = STEPS_MAX, .metavar = "N",
     .help = "a step line every N steps, with the time left (default 1; the\n"
             "first and the last always)"},
    {.name = "--list-backends", .kind = OPTION_ACTION, .action = list_backends,
     .help = "print the backends built in, one per line, and exit"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-exec",
    .usage =
        "usage: piper-exec --model FILE --directives FILE [--schedule NAME --ranks R --mbs M]\n"
        "                  [options]\n"
        "       piper-exec --plans DIR [options]\n"
        "       piper-exec --list-backends\n"
        "\n"
        "Trains the model by running the per-device plans, one process per device:\n"
        "  mpirun -np N piper-exec ...   (or srun -n N piper-exec ...; one process runs a "
        "one-device\n"
        "plan). Rank r runs device r. Writes out/<YYYYmmdd_HHMMSS>/ (or --out DIR): the program\n"
        "compiled, results.csv, metrics.json (with the loss of every step) and trace.json, from\n"
        "measured times.\n"
        "\n",
    .epilogue =
        "environment:\n"
        "  PIPER_EXEC_FAULT=stall:[KIND:]RANK:STEP, kill:RANK:STEP or stop:RANK:STEP   inject a\n"
        "    hang (KIND: send, recv, all-reduce, reduce-scatter, all-to-all, all-gather), a crash\n"
        "    or a SIGSTOP (step 0: at start-up) (tests)\n"
        "\n"
        "Ctrl-C (SIGINT; SIGTERM too when run alone) finishes the current step, writes the run\n"
        "directory with the steps done and exits 130; a second one ends the run at once.\n"
        "\n"
        "Exit status: 0 success, 1 runtime failure (a watchdog, a dead peer, I/O), 2 bad input,\n"
        "130 stopped by a signal.\n",
    .options = options,
    .help_column = 24,
};

/* Under AddressSanitizer (make asan): MPI keeps allocations until exit in modules it unloads
 * at MPI_Finalize, so their reports name no module and cannot be suppressed. Processes an MPI
 * launcher started therefore run LeakSanitizer's one check before MPI starts (everything of
 * ours is reachable then), which also turns off the check at exit. A process started alone
 * never starts MPI and keeps the full check. Weak: absent without the sanitizer. */
extern void __lsan_do_leak_check(void) __attribute__((weak));
static void leak_check_before_mpi(void) {
  if (__lsan_do_leak_check && piper_launch_detect().launched)
    __lsan_do_leak_check();
}

/* The launcher ends every rank when one fails: say so in one line instead of vanishing. A
 * user's stop (SIGINT, or SIGTERM to a process run alone) is a flag the step loop checks
 * instead: the run ends after the current step with what it has. A second signal ends it at
 * once. */
static char term_message[160];
static volatile sig_atomic_t term_code = 1;
static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t stop_allowed = 0; /* 1: SIGINT stops; 2: SIGTERM too */
static volatile sig_atomic_t stop_says = 0;    /* rank 0: acknowledge the stop */
static void on_term(int sig) {
  if (!stop_requested && (stop_allowed == 2 || (stop_allowed == 1 && sig == SIGINT))) {
    stop_requested = 1;
    static const char note[] =
        "piper-exec: stopping after the current step (signal again to end now)\n";
    if (stop_says) {
      ssize_t w = write(STDERR_FILENO, note, sizeof note - 1);
      (void)w;
    }
    return;
  }
  ssize_t w = write(STDERR_FILENO, term_message, strlen(term_message));
  (void)w;
  _exit(term_code);
}

/* The rank a launcher gave this process, before MPI starts (0 when run alone). */
static uint32_t launcher_rank(void) {
  return piper_launch_detect().rank;
}

/* A rank other than the first, ending on an error the first one prints: it lingers a moment,
 * because the launcher ends every rank once one has exited non-zero, and the first might not
 * have written its line yet. */
static int quiet_rank_exit(int rc) {
  if (rc != 0 && launcher_rank() != 0)
    g_usleep(G_USEC_PER_SEC);
  return rc;
}

/* An error found before MPI starts is the same on every rank (same command line, same files):
 * rank 0 says it, the others end with the same status quietly. */
static int error_exit_once(GError *err) {
  if (launcher_rank() == 0)
    return piper_error_exit("piper-exec", err);
  int rc = err->code == PIPER_ERROR_RUNTIME ? 1 : 2;
  g_error_free(err);
  return quiet_rank_exit(rc);
}

struct fault {
  int signal; /* SIGKILL (kill) or SIGSTOP (stop); 0: none */
  uint32_t rank, step;
};

static void fault_hook(uint32_t rank, uint32_t step, void *data) {
  const struct fault *f = data;
  if (f->signal && rank == f->rank && step == f->step) {
    fprintf(stderr, "piper-exec: rank %u: PIPER_EXEC_FAULT %s this rank at %s %u\n", rank,
            f->signal == SIGKILL ? "kills" : "stops", step ? "step" : "start-up, step", step);
    raise(f->signal);
  }
}

/* The options that go together; OPTIONS_CONTINUE, or the usage error's exit status. */
static bool backend_built_in(const char *name) {
  const char *n;
  for (uint32_t k = 0; (n = exec_backend_builtin(k, NULL)); k++)
    if (strcmp(n, name) == 0)
      return true;
  return false;
}

/* The learning-rate schedule, clipping and evaluation: names and steps that fit. */
static int read_training(const struct exec_cli *a, struct exec_options *o) {
  GError *err = NULL;
  struct exec_lr_schedule ls;
  if ((a->lr_decay_style &&
       !exec_lr_decay_parse("--lr-decay-style", a->lr_decay_style, &o->lr_schedule.decay, &err)) ||
      (a->lr_wsd_decay_style &&
       !exec_lr_wsd_style_parse("--lr-wsd-decay-style", a->lr_wsd_decay_style,
                                &o->lr_schedule.wsd_style, &err)) ||
      (ls = o->lr_schedule, !exec_lr_schedule_resolve(&ls, o->warmup + o->iters, &err)))
    return error_exit_once(err);
  if (a->run.eval_every && !a->eval_data)
    return piper_usage_error("piper-exec", "%s", "--eval-every N goes with --eval-data FILE");
  if (a->eval_data && access(a->eval_data, R_OK) != 0) /* before MPI: one line, not one per rank */
    return piper_usage_error("piper-exec", "--eval-data %s: cannot read it: %s", a->eval_data,
                             g_strerror(errno));
  o->eval_path = a->eval_data;
  o->peak_flops = a->peak_tflops * 1e12;
  return OPTIONS_CONTINUE;
}

static int check_inputs(const struct exec_cli *a) {
  const struct compile_args *ca = &a->compile;
  if (!backend_built_in(a->backend))
    return piper_usage_error("piper-exec",
                             "--backend: \"%s\" is not built in (see --list-backends)", a->backend);
  if (a->plans && options_compile_arg_given(ca))
    return piper_usage_error("piper-exec", "--plans takes the plans as compiled: %s does not apply",
                             options_compile_arg_given(ca));
  if (!a->plans && (!ca->model || (!ca->directives && !ca->layout)))
    return piper_usage_error("piper-exec", "%s",
                             "give --model FILE and --directives FILE (or --layout SPEC), or --plans DIR");
  if (!!a->checkpoint != !!a->checkpoint_every)
    return piper_usage_error("piper-exec", "%s",
                             "--checkpoint DIR and --checkpoint-every K go together");
  return OPTIONS_CONTINUE;
}

/* The communication kinds a stall can hit (PIPER_EXEC_FAULT=stall:KIND:RANK:STEP). */
static const char *const stall_kinds[] = {
    [EXEC_STALL_ANY] = "any",
    [EXEC_STALL_SEND] = "send",
    [EXEC_STALL_RECV] = "recv",
    [EXEC_STALL_ALL_REDUCE] = "all-reduce",
    [EXEC_STALL_REDUCE_SCATTER] = "reduce-scatter",
    [EXEC_STALL_ALL_TO_ALL] = "all-to-all",
    [EXEC_STALL_ALL_GATHER] = "all-gather",
};

/* PIPER_EXEC_FAULT (tests): a stall the runner injects (stall:RANK:STEP hits the first
 * communication, stall:KIND:RANK:STEP the first of a kind), or a kill or a SIGSTOP by the
 * step hook (kill:RANK:STEP, stop:RANK:STEP; step 0 is start-up). */
/* PIPER_EXEC_SLOW=RANK:FACTOR: that rank's compute takes FACTOR times as long (a test hook:
 * a straggler made on purpose, for the detection that names it). */
static int read_slow(struct exec_options *o) {
  const char *env = getenv("PIPER_EXEC_SLOW");
  if (!env || !*env)
    return OPTIONS_CONTINUE;
  unsigned rank = 0;
  double factor = 0;
  char tail = 0;
  if (sscanf(env, "%u:%lf%c", &rank, &factor, &tail) != 2 || !(factor > 1 && factor < 1e3))
    return piper_usage_error("piper-exec",
                             "PIPER_EXEC_SLOW: \"%s\" is not RANK:FACTOR (a factor above 1)", env);
  o->hooks.slow_rank = rank;
  o->hooks.slow_factor = factor;
  return OPTIONS_CONTINUE;
}

static int read_fault(struct exec_options *o, struct fault *fault) {
  const char *fenv = getenv("PIPER_EXEC_FAULT");
  if (!fenv || !*fenv)
    return OPTIONS_CONTINUE;
  char kind[16] = "", sub[16] = "any";
  unsigned fr = 0, fs = 0;
  int n = sscanf(fenv, "%15[a-z]:%u:%u", kind, &fr, &fs);
  if (n != 3 && strcmp(kind, "stall") == 0)
    n = sscanf(fenv, "%15[a-z]:%15[a-z-]:%u:%u", kind, sub, &fr, &fs) - 1;
  int stall = -1;
  for (size_t k = 0; k < G_N_ELEMENTS(stall_kinds); k++)
    if (strcmp(sub, stall_kinds[k]) == 0)
      stall = (int)k;
  bool known = strcmp(kind, "stall") == 0 || strcmp(kind, "kill") == 0 || strcmp(kind, "stop") == 0;
  if (n != 3 || !known || stall < 0)
    return piper_usage_error("piper-exec",
                             "PIPER_EXEC_FAULT: \"%s\" is not stall:[KIND:]RANK:STEP (KIND: any, "
                             "send, recv, all-reduce, reduce-scatter, all-to-all, all-gather), "
                             "kill:RANK:STEP or stop:RANK:STEP",
                             fenv);
  /* Kept in the release binary on purpose (docs/reliability.md): the fault tests must run the
   * program users run, and an operator may rehearse a failure on a real cluster. A stray
   * variable in a job script must not sabotage a run unseen: say so at start. */
  if (launcher_rank() == 0)
    fprintf(stderr, "piper-exec: note: PIPER_EXEC_FAULT=%s is set: a fault will be injected\n",
            fenv);
  if (strcmp(kind, "stall") == 0) {
    o->hooks.fault = EXEC_FAULT_STALL;
    o->hooks.fault_kind = (enum exec_stall_kind)stall;
    o->hooks.fault_rank = fr;
    o->hooks.fault_step = fs;
  } else {
    *fault = (struct fault){strcmp(kind, "kill") == 0 ? SIGKILL : SIGSTOP, fr, fs};
    o->hooks.step_hook = fault_hook;
    o->hooks.step_hook_data = fault;
  }
  return OPTIONS_CONTINUE;
}

/* The plans to run: read from --plans or compiled, and the name of their program file. */
struct exec_plan {
  struct compile_result compiled;
  struct plan *read;
  const struct plan *plan;
  char *program_file;
};

static void exec_plan_free(struct exec_plan *p) {
  g_free(p->program_file);
  compile_result_free(&p->compiled);
  plan_free(p->read);
}

/* What the executor does not run under tensor parallelism, refused up front (before MPI
 * starts) rather than trained as something else: regions divided unlike each other. */
static bool tp_supported(const struct exec_cli *a, const struct plan *plan, GError **err) {
  const char *file = a->plans                ? a->plans
                     : a->compile.directives ? a->compile.directives
                                             : "--layout";
  const struct ir_node *first = NULL;
  for (uint32_t i = 0; i < plan->n_nodes; i++) {
    const struct ir_node *n = &plan->nodes[i];
    if (n->kind != IR_NODE_COMPUTE)
      continue;
    char name[256];
    plan_node_name(plan, i, name, sizeof name);
    /* ir.h: each TP rank routing its sequence shard to whole experts (expert TP 1) runs */
    if (n->route_split > 1 && n->tp_degree > 1)
      return piper_input_error(err,
                               "%s: \"%s\" divides experts by an expert_tensor_parallel between 1 "
                               "and the dense tensor_parallel, which piper-sim simulates but "
                               "piper-exec does not run yet (expert_tensor_parallel 1 runs)",
                               file, name);
    if (n->route_split > 1)
      continue;
    first = first ? first : n;
    uint32_t tp = n->tp_degree > 1 ? n->tp_degree : 1,
             tp0 = first->tp_degree > 1 ? first->tp_degree : 1;
    if (tp != tp0 || (tp > 1 && n->sequence_parallel != first->sequence_parallel))
      return piper_input_error(err,
                               "%s: \"%s\" is divided by tensor parallelism unlike other "
                               "regions; the executor needs one degree (and one "
                               "sequence_parallel) for the whole model",
                               file, name);
  }
  return true;
}

static bool load_plan(const struct exec_cli *a, struct exec_plan *p, GError **err) {
  if (a->plans) {
    p->read = plan_read_dir(a->plans, err);
    if (!p->read)
      return false;
    p->plan = p->read;
  } else {
    struct compile_options co;
    if (!compile_args_to_options(&a->compile, &co, err))
      return false;
    g_autoptr(GString) notes = g_string_new(NULL);
    co.notes = notes;
    if (!compile_run(&co, &p->compiled, err))
      return false;
    if (launcher_rank() == 0)
      options_print_notes("piper-exec", notes);
    p->plan = p->compiled.plan;
    p->program_file = g_strdup(p->compiled.program_file_name);
  }
  if (!tp_supported(a, p->plan, err))
    return false;
  if (!p->program_file) {
    /* plans read from disk: name the program by the pipeline ranks the plan has */
    struct report_run shape = {.plan = p->plan};
    report_run_init_devices(&shape);
    p->program_file = sched_program_file_name(SCHED_CUSTOM, shape.pp, p->plan->n_microbatches);
    report_run_free_devices(&shape);
  }
  return true;
}

/* A directory the run will write: created now, and writable, so that a bad path is found
 * before the first step rather than after the last. */
static bool dir_writable(const char *option, const char *dir, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0 || access(dir, W_OK) != 0)
    return piper_input_error(err, "%s %s: cannot write there: %s", option, dir, g_strerror(errno));
  return true;
}

/* The file --dump-params writes: writable if it exists, else its directory is. */
static bool file_writable(const char *option, const char *path, GError **err) {
  char *parent = g_path_get_dirname(path);
  bool ok = g_file_test(path, G_FILE_TEST_EXISTS)
                ? access(path, W_OK) == 0
                : g_file_test(parent, G_FILE_TEST_IS_DIR) && access(parent, W_OK) == 0;
  int e = errno;
  g_free(parent);
  if (!ok)
    return piper_input_error(err, "%s %s: cannot write there: %s", option, path,
                             e ? g_strerror(e) : "no such directory");
  return true;
}

/* The run directory (rank 0 writes it; other ranks only need to know there is one: they send
 * rank 0 their part) and every output path, checked before MPI starts. created: the run
 * directory is new (a failed run removes it again if it stayed empty). */
static bool prepare_outputs(const struct exec_cli *a, char **run_dir, bool *created,
                            GError **err) {
  *run_dir = NULL;
  *created = !a->out;
  if (a->dump_params && !file_writable("--dump-params", a->dump_params, err))
    return false;
  if (a->checkpoint && !dir_writable("--checkpoint", a->checkpoint, err))
    return false;
  if (a->run.save_hf_dir && !dir_writable("--save-hf", a->run.save_hf_dir, err))
    return false;
  const char *dt = a->run.save_hf_dtype;
  if (dt && (!a->run.save_hf_dir || (strcmp(dt, "bf16") != 0 && strcmp(dt, "fp32") != 0)))
    return piper_input_error(err, "--save-dtype %s: give bf16 or fp32, with --save-hf DIR", dt);
  if (a->no_report)
    return true;
  if (a->out) {
    *created = !g_file_test(a->out, G_FILE_TEST_EXISTS);
    if (!report_run_dir_claim(a->out, a->force, err))
      return false;
    *run_dir = g_strdup(a->out);
    return true;
  }
  *run_dir = launcher_rank() == 0 ? report_run_dir_new("out", err) : g_strdup("out");
  return *run_dir != NULL;
}

/* The run's options from the command line and the plan. */
static void fill_run_options(const struct exec_cli *a, const struct exec_plan *p,
                             const char *run_dir, struct exec_options *o) {
  o->plan = p->plan;
  o->schedule = a->compile.schedule ? a->compile.schedule : "custom";
  o->program_file = p->program_file;
  o->data_path = a->data;
  o->checkpoint_dir = a->checkpoint;
  o->checkpoint_every = a->checkpoint_every;
  o->resume_dir = a->resume;
  o->report = run_dir != NULL;
  o->stop = &stop_requested;
  o->dump_params_path = a->dump_params;
  o->seed = a->seed;
}

/* Rank 0's last words: loss, throughput over the measured steps, memory, overhead. */
static void print_result(const struct exec_options *o, const struct exec_result *res) {
  double mean = 0;
  uint32_t nm = 0;
  for (uint32_t k = o->warmup >= res->first_step ? o->warmup - res->first_step + 1 : 0;
       k < res->n_steps; k++) {
    mean += res->step_times[k];
    nm++;
  }
  mean = nm ? mean / nm : 0;
  printf("piper-exec: final loss %.6f, %.0f tokens/s over %u measured steps, peak memory %.1f MiB "
         "(rank 0), executor overhead %.2f us per instruction (%.2f us of it to start)\n",
         res->n_steps ? res->losses[res->n_steps - 1] : NAN,
         mean > 0 ? res->tokens_per_step / mean : 0, nm, (double)res->peak_memory_bytes / (1 << 20),
         res->job_overhead_per_instr_s * 1e6, res->job_dispatch_per_instr_s * 1e6);
}

/* Rank 0: the ranks slower than their peers (the simulator's slow-device scenario can take
 * the ratio). */
static void print_stragglers(const struct exec_options *o, const struct exec_result *res) {
  uint32_t warm = o->warmup >= res->first_step ? o->warmup - res->first_step + 1 : 0;
  uint32_t measured = res->n_steps > warm ? res->n_steps - warm : 0;
  for (uint32_t k = 0; k < res->n_stragglers; k++) {
    const struct exec_straggler *x = &res->stragglers[k];
    printf("  straggler: rank %u computes %.2fx the median of its %u peer%s (plan class %u), "
           "slower in %u of %u measured steps\n",
           x->rank, x->ratio, x->peers, x->peers == 1 ? "" : "s", x->class_id, x->slow_steps,
           measured);
  }
  /* the measured counterpart of a slow-device scenario: rank r runs plan device r */
  if (res->n_stragglers) {
    printf("  as a piper-sim --scenario: {\"slow\": [");
    for (uint32_t k = 0; k < res->n_stragglers; k++)
      printf("%s{\"devices\": [%u], \"factor\": %.2f}", k ? ", " : "", res->stragglers[k].rank,
             res->stragglers[k].ratio);
    printf("]}\n");
  }
}

/* Rank 0: the run directory of the measured run, and its charts (as piper-sim writes them). */
static bool write_run_dir(const struct exec_options *o, const struct exec_result *res,
                          const char *dir, bool charts, GError **err) {
  const struct report_run *run = exec_result_report(res);
  if (!run)
    return true;
  if (!report_write_dir(run, dir, err))
    return false;
  GString *files = g_string_new(NULL);
  if (o->program_file)
    g_string_printf(files, "%s ", o->program_file);
  g_string_append(files, "results.csv metrics.json trace.json");
  bool ok = !charts || report_write_charts(run, dir, CHART_PNG, files, err);
  if (ok)
    printf("  wrote %s/ (%s)\n", dir, files->str);
  g_string_free(files, TRUE);
  return ok;
}

/* The watchdog's way to end the job: every rank, exit status 1. */
static void abort_job(void *data, int code) {
  exec_backend_abort(data, code);
}

/* Communicators freed and MPI finalised under the watchdog, which then stops. */
static void free_backend(struct exec_backend *b) {
  exec_watchdog_phase("finalisation (freeing communicators, MPI_Finalize)", false);
  exec_watchdog_set_abort(NULL, NULL);
  exec_backend_free(b);
  exec_watchdog_stop();
}

/* Starts the backend (MPI, when launched so), trains, and stops it. */
static int run_on_backend(struct exec_options *o, const struct exec_cli *a, const char *run_dir,
                          int *argc, char ***argv) {
  GError *err = NULL;
  const struct plan *plan = o->plan;
  leak_check_before_mpi();
  /* test hooks: PIPER_EXEC_MPI starts MPI without a launcher, PIPER_EXEC_POISON=1 poisons */
  struct exec_backend_params bp = {argc, argv, getenv("PIPER_EXEC_MPI") != NULL,
                                   piper_launch_detect()};
  o->hooks.poison = getenv("PIPER_EXEC_POISON") && strcmp(getenv("PIPER_EXEC_POISON"), "1") == 0;
  /* from here to the end of MPI_Finalize, a hang anywhere ends the job in one line */
  exec_watchdog_start("piper-exec", o->timeout_s);
  struct exec_backend *b = exec_backend_init_by_name(a->backend, &bp, &err);
  if (!b)
    return piper_error_exit("piper-exec", err);
  uint32_t rank = exec_backend_world_rank(b), size = exec_backend_world_size(b);
  exec_watchdog_set_rank(rank);
  exec_watchdog_set_abort(abort_job, b);
  g_snprintf(term_message, sizeof term_message,
             "piper-exec: error: rank %u: terminated by the launcher (another rank failed or the "
             "job was cancelled)\n",
             rank);
  stop_allowed = size == 1 ? 2 : 1; /* under a launcher, SIGTERM is the launcher's */
  stop_says = rank == 0;
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
#ifdef HAVE_BLAS
  /* several ranks per machine: BLAS threads on top of them only oversubscribe the cores */
  if (size > 1 && !getenv("OPENBLAS_NUM_THREADS"))
    openblas_set_num_threads(1);
#endif
  o->progress = !a->quiet && rank == 0;
  uint32_t total = o->warmup + o->iters;
  if (!a->no_charts && o->report && rank == 0 && !chart_gnuplot_available())
    fprintf(stderr, "piper-exec: note: gnuplot is not installed: no memory.png\n");
  if (rank == 0) {
    printf("piper-exec: %s on %u device%s (backend %s, %s), %u micro-batches per rank, data %s, "
           "steps 1 to %u (%u warm-up + %u measured: --warmup + --iters)\n",
           plan->model->name, plan->n_devices, plan->n_devices == 1 ? "" : "s",
           exec_backend_name(b), exec_backend_comm_library(b), plan->n_microbatches,
           a->data ? a->data : "synthetic", total, o->warmup, o->iters);
    fflush(stdout);
  }
  struct exec_result res = {0};
  if (!exec_run(o, b, &res, &err)) {
    int rc = err->code == PIPER_ERROR_RUNTIME ? 1 : 2;
    if (res.error_printed_elsewhere) /* one line for the job: the rank that saw it says it */
      g_error_free(err);
    else
      rc = piper_error_exit("piper-exec", err);
    if (size > 1 && !res.error_everywhere)
      exec_backend_abort(b, rc); /* peers may be blocked on us */
    if (res.error_everywhere) {  /* the launcher may end us once a peer has exited: quietly */
      term_message[0] = '\0';
      term_code = rc;
    }
    /* The training ran to its end and only an output after the run's report failed (the
     * parameter dump: a FIFO nobody reads, a full disk): the run directory is still written. */
    GError *dir_err = NULL;
    if (rank == 0 && exec_result_report(&res) &&
        !write_run_dir(o, &res, run_dir, !a->no_charts, &dir_err))
      piper_error_exit("piper-exec", dir_err);
    exec_result_clear(&res);
    free_backend(b);
    return rc;
  }
  if (rank == 0) {
    print_result(o, &res);
    print_stragglers(o, &res);
    if (!write_run_dir(o, &res, run_dir, !a->no_charts, &err)) {
      exec_result_clear(&res);
      free_backend(b);
      return piper_error_exit("piper-exec", err);
    }
  }
  if (res.stopped) { /* every rank stops at this step: the launcher may end us once one exits */
    term_message[0] = '\0';
    term_code = 130;
  }
  if (rank == 0 && res.stopped)
    fprintf(stderr,
            "piper-exec: stopped by a signal after step %u of %u; the run directory holds the "
            "steps done\n",
            res.first_step + res.n_steps - 1, o->warmup + o->iters);
  int rc = res.stopped ? 130 : 0;
  exec_result_clear(&res);
  free_backend(b);
  return rc;
}

int main(int argc, char **argv) {
  struct exec_cli a = {.backend = "host", .run = exec_options_default()};
  a.seed = (uint32_t)a.run.seed;
  /* a usage error is every rank's: the first one says it (error_exit_once for the rest) */
  piper_usage_error_quiet(launcher_rank() != 0);
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return quiet_rank_exit(rc);
  struct exec_options o = a.run;
  struct fault fault = {0};
  if ((rc = check_inputs(&a)) != OPTIONS_CONTINUE ||
      (rc = read_training(&a, &o)) != OPTIONS_CONTINUE ||
      (rc = read_fault(&o, &fault)) != OPTIONS_CONTINUE ||
      (rc = read_slow(&o)) != OPTIONS_CONTINUE)
    return quiet_rank_exit(rc);
  piper_usage_error_quiet(false);
  GError *err = NULL;
  struct exec_plan p = {0};
  char *run_dir = NULL;
  bool created = false;
  if (!load_plan(&a, &p, &err) || !prepare_outputs(&a, &run_dir, &created, &err)) {
    exec_plan_free(&p);
    return error_exit_once(err);
  }
  fill_run_options(&a, &p, run_dir, &o);
  rc = run_on_backend(&o, &a, run_dir, &argc, &argv);
  if (rc != 0 && rc != 130 && created && run_dir && launcher_rank() == 0)
    g_rmdir(run_dir); /* a failed run leaves no empty directory behind (only an empty one goes) */
  g_free(run_dir);
  exec_plan_free(&p);
  return rc;
}
