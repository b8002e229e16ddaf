/* piper-exec: train a model by running its per-device plans for real (SPEC §7): one process
 * per device (mpirun / srun; one process alone runs a one-device plan), writing the run
 * directory of SPEC §8 from measured times. Exit status: 0 success, 1 runtime failure (a
 * watchdog, a dead peer, I/O), 2 bad input. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef HAVE_BLAS
#include <cblas.h>
#endif

#include "../directives/compile.h"
#include "../exec/exec.h"
#include "../base/json.h"
#include "../base/version.h"

static const char usage[] =
    "usage: piper-exec --model FILE --directives FILE [--schedule NAME --ranks R --mbs M]\n"
    "                  [options]\n"
    "       piper-exec --plans DIR [options]\n"
    "       piper-exec --list-backends\n"
    "\n"
    "Trains the model by running the per-device plans, one process per device:\n"
    "  mpirun -np N piper-exec ...   (or srun -n N piper-exec ...; one process runs a one-device\n"
    "plan). Rank r runs device r. Writes out/<YYYYmmdd_HHMMSS>/ (or --out DIR): the program\n"
    "compiled, results.csv, metrics.json (with the loss of every step) and trace.json, from\n"
    "measured times.\n"
    "\n"
    "plan:\n"
    "  --model FILE          annotated model (models/*.json)\n"
    "  --directives FILE     directive program; --base-schedule FILE is the same\n"
    "  --schedule NAME       gpipe, 1f1b, interleaved_1f1b, zerobubble, zbv, dualpipe,\n"
    "                        dualpipev, custom\n"
    "  --ranks R             pipeline ranks (default: from the placement)\n"
    "  --mbs M               micro-batches per step on each data-parallel rank\n"
    "  --keep-order          keep the base program's order directives\n"
    "  --pp-regions N        split the model into N equal PP regions\n"
    "  --plans DIR           plans written by piper-compile -o DIR instead\n"
    "training:\n"
    "  --backend NAME        host (default); see --list-backends\n"
    "  --iters N             measured steps (default 10)\n"
    "  --warmup K            steps before them, trained but not timed (default 1)\n"
    "  --data FILE           token file (llm.c format, uint16) or any file as bytes;\n"
    "                        default: a synthetic stream\n"
    "  --seed S              initialisation and synthetic data (default 1234)\n"
    "  --lr X                AdamW learning rate (default 0.001)\n"
    "  --weight-decay X      AdamW weight decay (default 0)\n"
    "  --checkpoint DIR      write checkpoints to DIR ...\n"
    "  --checkpoint-every K  ... every K steps\n"
    "  --resume DIR          continue from the latest checkpoint in DIR\n"
    "  --timeout S           watchdog: fail when nothing progresses for S seconds (default 300)\n"
    "output:\n"
    "  --out DIR             run directory (default out/<YYYYmmdd_HHMMSS>)\n"
    "  --no-report           write no run directory\n"
    "  --dump-params FILE    write the final parameters (float32, model op order)\n"
    "  --quiet               no per-step lines\n"
    "  --list-backends, --help, --version\n"
    "environment:\n"
    "  PIPER_EXEC_FAULT=stall:RANK:STEP or kill:RANK:STEP   inject a hang or a crash (tests)\n";

/* Under AddressSanitizer (make asan): MPI keeps allocations until exit in modules it unloads
 * at MPI_Finalize, so their reports name no module and cannot be suppressed. Processes an MPI
 * launcher started therefore run LeakSanitizer's one check before MPI starts (everything of
 * ours is reachable then), which also turns off the check at exit. A process started alone
 * never starts MPI and keeps the full check. Weak: absent without the sanitizer. */
extern void __lsan_do_leak_check(void) __attribute__((weak));
static void leak_check_before_mpi(void) {
  if (__lsan_do_leak_check &&
      (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")))
    __lsan_do_leak_check();
}

/* The launcher ends every rank when one fails: say so in one line instead of vanishing. */
static char term_message[160];
static void on_term(int sig) {
  (void)sig;
  ssize_t w = write(STDERR_FILENO, term_message, strlen(term_message));
  (void)w;
  _exit(1);
}

struct fault {
  bool kill;
  uint32_t rank, step;
};

static void fault_hook(uint32_t rank, uint32_t step, void *data) {
  const struct fault *f = data;
  if (f->kill && rank == f->rank && step == f->step) {
    fprintf(stderr, "piper-exec: rank %u: PIPER_EXEC_FAULT kills this rank at step %u\n", rank,
            step);
    raise(SIGKILL);
  }
}

int main(int argc, char **argv) {
  struct compile_args ca = {0};
  const char *plans = NULL, *out = NULL;
  const char *backend_name = "host", *data = NULL, *ckpt = NULL, *resume = NULL, *dump = NULL;
  uint32_t ckpt_every = 0;
  bool quiet = false, no_report = false;
  struct exec_options o = exec_options_default();
  GError *parse_err = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int shared = compile_args_parse(&ca, argc, argv, &i, &parse_err);
    if (shared < 0)
      return piper_error_exit("piper-exec", parse_err);
    if (shared)
      continue;
    const char **target = NULL;
    uint32_t *num = NULL;
    double *real = NULL, lo = 0, hi = 0, tmp = 0;
    uint32_t u32tmp = 0;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("piper-exec %s\n", PIPER_VERSION);
      return 0;
    } else if (strcmp(a, "--list-backends") == 0) {
      for (size_t k = 0; exec_backends[k]; k++)
        printf("%s\t%s\n", exec_backends[k]->name, exec_backends[k]->description);
      return 0;
    } else if (strcmp(a, "--plans") == 0)
      target = &plans;
    else if (strcmp(a, "--out") == 0)
      target = &out;
    else if (strcmp(a, "--backend") == 0)
      target = &backend_name;
    else if (strcmp(a, "--data") == 0)
      target = &data;
    else if (strcmp(a, "--checkpoint") == 0)
      target = &ckpt;
    else if (strcmp(a, "--resume") == 0)
      target = &resume;
    else if (strcmp(a, "--dump-params") == 0)
      target = &dump;
    else if (strcmp(a, "--checkpoint-every") == 0)
      num = &ckpt_every;
    else if (strcmp(a, "--iters") == 0)
      num = &o.iters;
    else if (strcmp(a, "--warmup") == 0)
      num = &o.warmup;
    else if (strcmp(a, "--seed") == 0)
      num = &u32tmp;
    else if (strcmp(a, "--lr") == 0)
      real = &tmp, lo = 0, hi = 10;
    else if (strcmp(a, "--weight-decay") == 0)
      real = &tmp, lo = 0, hi = 10;
    else if (strcmp(a, "--timeout") == 0)
      real = &o.timeout_s, lo = 0.01, hi = 1e9;
    else if (strcmp(a, "--quiet") == 0)
      quiet = true;
    else if (strcmp(a, "--no-report") == 0)
      no_report = true;
    else
      return piper_usage_error("piper-exec", "unknown option %s", a);
    if (target || num || real) {
      if (i + 1 >= argc)
        return piper_usage_error("piper-exec", "%s needs a value", a);
      const char *v = argv[++i];
      if (target) {
        *target = v;
      } else if (num) {
        bool zero_ok = num == &o.warmup || num == &u32tmp;
        uint32_t max = UINT32_MAX - 1;
        if (!piper_parse_u32(v, zero_ok ? 0 : 1, max, num)) {
          fprintf(stderr, "piper-exec: error: %s: \"%s\" is not a %s integer in range\n", a, v,
                  zero_ok ? "non-negative" : "positive");
          return 2;
        }
        if (num == &u32tmp)
          o.seed = u32tmp;
      } else {
        if (!piper_parse_double(v, lo, hi, real)) {
          fprintf(stderr, "piper-exec: error: %s: \"%s\" is not a number in [%g, %g]\n", a, v, lo,
                  hi);
          return 2;
        }
        if (strcmp(a, "--lr") == 0)
          o.lr = (float)tmp;
        if (strcmp(a, "--weight-decay") == 0)
          o.weight_decay = (float)tmp;
      }
    }
  }
  const struct exec_backend_ops *ops = exec_backend_find(backend_name);
  if (!ops)
    return piper_usage_error(
        "piper-exec", "--backend: \"%s\" is not built in (see --list-backends)", backend_name);
  if (plans && (ca.model || ca.directives || ca.schedule))
    return piper_usage_error("piper-exec", "%s",
                             "--plans replaces --model, --directives and --schedule");
  if (!plans && (!ca.model || !ca.directives))
    return piper_usage_error("piper-exec", "%s",
                             "give --model FILE and --directives FILE, or --plans DIR");
  if (!!ckpt != !!ckpt_every)
    return piper_usage_error("piper-exec", "%s",
                             "--checkpoint DIR and --checkpoint-every K go together");
  struct fault fault = {0};
  const char *fenv = getenv("PIPER_EXEC_FAULT");
  if (fenv && *fenv) {
    char kind[16] = "";
    unsigned fr = 0, fs = 0;
    if (sscanf(fenv, "%15[a-z]:%u:%u", kind, &fr, &fs) != 3 ||
        (strcmp(kind, "stall") != 0 && strcmp(kind, "kill") != 0))
      return piper_usage_error(
          "piper-exec", "PIPER_EXEC_FAULT: \"%s\" is not stall:RANK:STEP or kill:RANK:STEP", fenv);
    if (strcmp(kind, "stall") == 0) {
      o.fault = EXEC_FAULT_STALL;
      o.fault_rank = fr;
      o.fault_step = fs;
    } else {
      fault = (struct fault){true, fr, fs};
      o.step_hook = fault_hook;
      o.step_hook_data = &fault;
    }
  }

  GError *err = NULL;
  struct compile_result cr = {0};
  struct plan *owned = NULL;
  const struct plan *plan = NULL;
  char *program_file = NULL;
  if (plans) {
    owned = plan_read_dir(plans, &err);
    if (!owned)
      return piper_error_exit("piper-exec", err);
    plan = owned;
  } else {
    struct compile_options co;
    if (!compile_args_to_options(&ca, &co, &err))
      return piper_error_exit("piper-exec", err);
    if (!compile_run(&co, &cr, &err))
      return piper_error_exit("piper-exec", err);
    plan = cr.plan;
    program_file = g_strdup(cr.program_file_name);
  }
  if (!program_file) {
    /* plans read from disk: name the program by the pipeline ranks the plan has */
    struct report_run shape = {.plan = plan};
    report_run_init_devices(&shape);
    program_file = sched_program_file_name(SCHED_CUSTOM, shape.pp, plan->n_microbatches);
    report_run_free_devices(&shape);
  }

  char stamp[32];
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(stamp, sizeof stamp, "out/%Y%m%d_%H%M%S", &tmv);
  o.plan = plan;
  o.schedule = ca.schedule ? ca.schedule : "custom";
  o.program_file = program_file;
  o.data_path = data;
  o.checkpoint_dir = ckpt;
  o.checkpoint_every = ckpt_every;
  o.resume_dir = resume;
  o.out_dir = no_report ? NULL : out ? out : stamp;
  o.dump_params_path = dump;

  leak_check_before_mpi();
  /* test hooks: PIPER_EXEC_MPI starts MPI without a launcher, PIPER_EXEC_POISON=1 poisons */
  struct exec_backend_params bp = {&argc, &argv, getenv("PIPER_EXEC_MPI") != NULL};
  o.poison = getenv("PIPER_EXEC_POISON") && strcmp(getenv("PIPER_EXEC_POISON"), "1") == 0;
  struct exec_backend *b = exec_backend_init(ops, &bp, &err);
  int rc = 0;
  if (!b) {
    rc = piper_error_exit("piper-exec", err);
    goto done;
  }
  uint32_t rank = exec_backend_world_rank(b), size = exec_backend_world_size(b);
  g_snprintf(term_message, sizeof term_message,
             "piper-exec: error: rank %u: terminated by the launcher (another rank failed or the "
             "job was cancelled)\n",
             rank);
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
#ifdef HAVE_BLAS
  /* several ranks per machine: BLAS threads on top of them only oversubscribe the cores */
  if (size > 1 && !getenv("OPENBLAS_NUM_THREADS"))
    openblas_set_num_threads(1);
#endif
  o.progress = !quiet && rank == 0;
  if (rank == 0 && !quiet) {
    printf("piper-exec: %s on %u device%s (backend %s, %s), %u micro-batches per rank, data %s\n",
           plan->model->name, plan->n_devices, plan->n_devices == 1 ? "" : "s",
           exec_backend_name(b), exec_backend_comm_library(b), plan->n_microbatches,
           data ? data : "synthetic");
    fflush(stdout);
  }
  struct exec_result res = {0};
  if (!exec_run(&o, b, &res, &err)) {
    rc = piper_error_exit("piper-exec", err);
    if (rc == 1 && size > 1)
      exec_backend_abort(b, 1); /* peers may be blocked on us */
    if (rc == 2 && size > 1)
      exec_backend_abort(b, 2);
    exec_backend_free(b);
    goto done;
  }
  if (rank == 0 && !quiet) {
    double mean = 0;
    uint32_t nm = 0;
    for (uint32_t k = o.warmup >= res.first_step ? o.warmup - res.first_step + 1 : 0;
         k < res.n_steps; k++) {
      mean += res.step_times[k];
      nm++;
    }
    mean = nm ? mean / nm : 0;
    printf(
        "piper-exec: final loss %.6f, %.0f tokens/s over %u measured steps, peak memory %.1f MiB "
        "(rank 0), executor overhead %.2f us per instruction (%.2f us of it to start)\n",
        res.n_steps ? res.losses[res.n_steps - 1] : NAN, mean > 0 ? res.tokens_per_step / mean : 0,
        nm, (double)res.peak_memory_bytes / (1 << 20), res.job_overhead_per_instr_s * 1e6,
        res.job_dispatch_per_instr_s * 1e6);
    if (res.run_dir)
      printf("  wrote %s/ (%s results.csv metrics.json trace.json)\n", res.run_dir, program_file);
  }
  exec_result_clear(&res);
  exec_backend_free(b);
done:
  g_free(program_file);
  compile_result_free(&cr);
  plan_free(owned);
  return rc;
}
