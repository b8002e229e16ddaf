/* piper-prof: measures this machine for the simulator and writes a device profile (sim/profile.h).
 * The program is its options and --help (one table) and a call of the profiler module
 * (prof/prof.h), which times every op kind of the given models at the shapes they use, the
 * machine's roofline and the executor's own costs and, under mpirun, the network. Progress goes
 * to stderr. */
#include <stddef.h>
#include <string.h>

#include "../base/base.h"
#include "../prof/prof.h"
#include "options.h"

// clang-format off
static const struct option_spec options[] = {
    {.name = "--model", .kind = OPTION_STRING, .offset = offsetof(struct prof_args, model),
     .metavar = "FILE[,FILE]",
     .help = "annotated model(s) whose op shapes are measured (comma-separated)"},
    {.name = "--backend", .kind = OPTION_STRING, .offset = offsetof(struct prof_args, backend),
     .metavar = "NAME",
     .help = "host (default), or cuda: the GPU's kernels by CUDA events, NCCL under mpirun"},
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING,
     .offset = offsetof(struct prof_args, out), .metavar = "PROFILE",
     .help = "write the profile to PROFILE (\"-\": standard output)"},
    {.name = "--repeats", .kind = OPTION_U32, .offset = offsetof(struct prof_args, repeats),
     .lo = 1, .hi = 10000, .metavar = "N",
     .help = "timed repeats per measurement, at least (default 21; the median is kept)"},
    {.name = "--warmup", .kind = OPTION_U32, .offset = offsetof(struct prof_args, warmup),
     .lo = 0, .hi = 1000, .metavar = "N", .help = "untimed calls before each measurement (default 3)"},
    {.name = "--quick", .kind = OPTION_FLAG, .offset = offsetof(struct prof_args, quick),
     .help = "fewer repeats and smaller messages (tests; figures are noisier)"},
    {.name = "--quiet", .kind = OPTION_FLAG, .offset = offsetof(struct prof_args, quiet),
     .help = "no progress on stderr"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-prof",
    .usage =
        "usage: piper-prof --model FILE[,FILE] [--backend host|cuda] -o PROFILE [options]\n"
        "\n"
        "Measures this machine and writes a device profile for piper-sim --profile: the time\n"
        "of every op kind at the shapes the models use, for F, BI, BW and B, run in the\n"
        "executor's order (medians after warm-up), the experts alone at every expert-parallel\n"
        "degree that divides them, AdamW, the GEMM rate and memory bandwidth,\n"
        "the host's cores and the executor's own costs (per instruction, per test of posted\n"
        "communication, a waiting rank beside a computing one), and, run under mpirun with 2\n"
        "or more ranks, point-to-point and each collective over every group size up to the\n"
        "ranks launched (latency and bandwidth fitted per operation by least squares). Set\n"
        "OPENBLAS_NUM_THREADS=1 to profile one core per rank, as piper-exec runs. With\n"
        "--backend cuda (where the cuda backend is built) the GPU's kernels are timed by CUDA\n"
        "events, and NCCL under mpirun with one GPU per rank; no usable GPU: exit 1.\n"
        "\n"
        "  OPENBLAS_NUM_THREADS=1 mpirun -np 4 piper-prof \\\n"
        "    --model models/tiny-dense.json,models/tiny-moe.json -o profiles/host-cpu.json\n"
        "\n",
    .epilogue = "\nExit status: 0 success, 1 runtime failure, 2 bad input.\n",
    .options = options,
    .help_column = 24,
};

static int check_args(const struct prof_args *a) {
  if (!a->model)
    return piper_usage_error(program.name, "%s", "--model FILE is required");
  if (!a->out)
    return piper_usage_error(program.name, "%s", "-o PROFILE is required");
  if (strcmp(a->backend, "cuda") == 0 && !prof_backend_built("cuda"))
    return piper_usage_error(program.name, "%s",
                             "--backend cuda: this piper-prof times the host kernels only "
                             "(the CUDA backend is not built in)");
  if (!prof_backend_built(a->backend)) {
    char *names = prof_backend_names();
    int rc = piper_usage_error(program.name, "--backend: unknown backend \"%s\" (%s)", a->backend,
                               names);
    g_free(names);
    return rc;
  }
  return OPTIONS_CONTINUE;
}

int main(int argc, char **argv) {
  struct prof_args a = prof_args_default();
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  if ((rc = check_args(&a)) != OPTIONS_CONTINUE)
    return rc;
  GError *err = NULL;
  return prof_run(&a, argc, argv, &err) ? 0 : piper_error_exit(program.name, err);
}
