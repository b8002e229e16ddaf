/* options: a program's command-line options as data, after redis's config table. One row per
 * option gives its name, alias, kind of value, where the value goes in the program's argument
 * struct, bounds, metavar and help text; one parser reads argv by the table and --help is
 * printed from it, so the two never disagree.
 *
 *   struct args { const char *out; uint32_t iters; bool quiet; };
 *   static const struct option_spec rows[] = {
 *       {.name = "--out", .alias = "-o", .kind = OPTION_STRING,
 *        .offset = offsetof(struct args, out), .metavar = "DIR", .help = "run directory"},
 *       {.name = "--iters", .kind = OPTION_U32, .offset = offsetof(struct args, iters),
 *        .lo = 1, .hi = 1000, .metavar = "N", .help = "steps (default 10)"},
 *       {.name = "--quiet", .kind = OPTION_FLAG, .offset = offsetof(struct args, quiet),
 *        .help = "print nothing"},
 *       OPTIONS_HELP_VERSION,
 *       OPTIONS_END};
 *   static const struct option_program program = {
 *       .name = "piper-demo", .usage = "usage: piper-demo [options]\n\n", .options = rows,
 *       .help_column = 20};
 *   struct args a = {.iters = 10};
 *   char *argv[] = {"piper-demo", "--iters", "3", NULL};
 *   int rc = options_parse(&program, &a, 3, argv);
 *   if (rc != OPTIONS_CONTINUE) return;         // the program exits with rc (0: --help)
 */
#ifndef PIPER_TOOLS_OPTIONS_H
#define PIPER_TOOLS_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../directives/compile.h"

enum option_kind {
  OPTION_END,     /* ends a table */
  OPTION_HEADING, /* not an option: a heading line of --help ("output:"), the help text */
  OPTION_FLAG,    /* bool, set to true */
  OPTION_STRING,  /* const char *, pointing into argv */
  OPTION_U32,     /* uint32_t, a whole number in [lo, hi] */
  OPTION_DOUBLE,  /* double, a finite number in [lo, hi] */
  OPTION_FLOAT,   /* float, read as a double in [lo, hi] */
  OPTION_ACTION,  /* runs action, then the program exits 0 (--help, --version) */
};

struct option_program;

struct option_spec {
  const char *name;  /* "--out" */
  const char *alias; /* "-o" or a second long name ("--base-schedule"); NULL when none */
  enum option_kind kind;
  size_t offset;       /* of the target in the program's argument struct */
  double lo, hi;       /* bounds of OPTION_U32, OPTION_DOUBLE, OPTION_FLOAT */
  const char *metavar; /* the value's name in --help ("FILE"); NULL for flags and actions */
  const char *help;    /* its help text; "\n" starts a continuation line */
  void (*action)(const struct option_program *p); /* OPTION_ACTION */
};

/* The rows below stay rows (one option per initializer, as in a table): not reflowed. */
// clang-format off
/* A row that ends a table. */
#define OPTIONS_END {.kind = OPTION_END}

/* What a program is, for the parser and --help. */
struct option_program {
  const char *name;     /* "piper-sim": the prefix of every error message */
  const char *usage;    /* printed before the options: synopsis and description */
  const char *epilogue; /* printed after them (exit status, environment); may be NULL */
  const struct option_spec *options;
  int help_column; /* where the help texts start in --help */
  /* Takes an argument that is not an option (NULL: there is none); false with err set (a
   * message without the program's name) rejects it. */
  bool (*positional)(void *args, const char *arg, GError **err);
};

/* The rows every program has: --help (-h) prints the help, --version the version. */
void options_print_help(const struct option_program *p);
void options_print_version(const struct option_program *p);
#define OPTIONS_HELP_VERSION                                                                     \
  {.name = "--help", .alias = "-h", .kind = OPTION_ACTION, .help = "print this help and exit",   \
   .action = options_print_help},                                                                \
  {                                                                                              \
    .name = "--version", .kind = OPTION_ACTION, .help = "print the version and exit",            \
    .action = options_print_version                                                              \
  }

/* The front-end options piper-compile, piper-sim and piper-exec share (struct compile_args of
 * directives/compile.h): rows for the table of a program whose argument struct T holds a
 * struct compile_args as its member m. */
#define OPTIONS_COMPILE_ARGS(T, m)                                                               \
  {.name = "--model", .kind = OPTION_STRING, .offset = offsetof(T, m.model), .metavar = "FILE",  \
   .help = "annotated model (models/*.json: HF config.json keys + a \"piper\" object)"},         \
  {.name = "--directives", .alias = "--base-schedule", .kind = OPTION_STRING,                    \
   .offset = offsetof(T, m.directives), .metavar = "FILE",                                       \
   .help = "directive program (JSON array; a base schedule under --schedule)"},                  \
  {.name = "--layout", .kind = OPTION_STRING, .offset = offsetof(T, m.layout), .metavar = "SPEC", \
   .help = "instead of --directives: place/replicate/shard generated from\n"                    \
           "pp=N,dp=N,ep=N (dividing tp x cp x dp),etp=N,v | interleave=N,\n"              \
           "zero=1|2|3,tp=N,sp,cp=N,cp-comm=p2p|all_gather,\n"                              \
           "recompute[@A-B]=full[:uniform|block:N]|selective[:M+M]\n"                       \
           "(PP regions follow; uneven: first-stage-layers=N,\n"                               \
           "last-stage-layers=N | stage-layers=A+B+...,\n"                                      \
           "account-for-embedding,account-for-loss;\n"                                        \
           "with ep: capacity=F,fp8-expert-inputs)"},                                           \
  {.name = "--schedule", .kind = OPTION_STRING, .offset = offsetof(T, m.schedule),               \
   .metavar = "NAME",                                                                            \
   .help = "build the order directives for R ranks and M micro-batches: gpipe,\n"                \
           "1f1b, interleaved_1f1b, zerobubble, zbv, dualpipe, dualpipev,\n"                     \
           "interleaved_zerobubble, custom (the file as written; default)"},                     \
  {.name = "--ranks", .kind = OPTION_U32, .offset = offsetof(T, m.ranks), .lo = 1,               \
   .hi = IR_MAX_DEVICES, .metavar = "R",                                                         \
   .help = "pipeline ranks the schedule expects (default: from the placement;\n"                 \
           "checked against it)"},                                                               \
  {.name = "--num-micro-batches", .alias = "--mbs", .kind = OPTION_U32,                          \
   .offset = offsetof(T, m.mbs), .lo = 1, .hi = DIR_MAX_MICROBATCHES, .metavar = "M",            \
   .help = "micro-batches per step on each data-parallel replica: sets the\n"                   \
           "program's MB split (default: the program's, or from\n"                             \
           "--global-batch-size; --mbs is its old name, kept)"},                                 \
  {.name = "--micro-batch-size", .kind = OPTION_U32, .offset = offsetof(T, m.micro_batch_size),  \
   .lo = 1, .hi = 1u << 20, .metavar = "B",                                                      \
   .help = "sequences in one micro-batch (default: the model file's\n"                          \
           "piper.micro_batch_size)"},                                                           \
  {.name = "--seq-length", .alias = "--seq-len", .kind = OPTION_U32,                             \
   .offset = offsetof(T, m.seq_length), .lo = 1, .hi = 1u << 24, .metavar = "S",                 \
   .help = "tokens in one sequence (default: the model file's piper.seq_len)"},                \
  {.name = "--fp8", .kind = OPTION_STRING, .offset = offsetof(T, m.fp8), .metavar = "RECIPE",    \
   .help = "GEMMs in FP8: tensorwise, blockwise or none (default: the model\n"                   \
           "file's piper.fp8; piper-sim costs it, piper-exec runs it on the cuda backend)"},   \
  {.name = "--global-batch-size", .kind = OPTION_U32, .offset = offsetof(T, m.global_batch_size), \
   .lo = 1, .hi = 1u << 30, .metavar = "G",                                                      \
   .help = "sequences per step over all data-parallel replicas: the micro-batch\n"             \
           "count is G / (micro-batch size x dp), as in Megatron"},                            \
  {.name = "--microbatch-group", .kind = OPTION_U32, .offset = offsetof(T, m.microbatch_group),  \
   .lo = 1, .hi = DIR_MAX_MICROBATCHES, .metavar = "G",                                         \
   .help = "interleaved_1f1b: micro-batches going through the chunks together,\n"               \
           "R .. M (Megatron's microbatch group per virtual stage; default R)"},                 \
  {.name = "--keep-order", .kind = OPTION_FLAG, .offset = offsetof(T, m.keep_order),             \
   .help = "keep the program's order directives under --schedule"},                             \
  {.name = "--import-csv", .kind = OPTION_STRING, .offset = offsetof(T, m.import_csv),           \
   .metavar = "FILE",                                                                            \
   .help = "replace the order directives by a PyTorch schedule CSV (compute\n"                  \
           "cells; communication cells are skipped with a note)"},                              \
  {                                                                                              \
    .name = "--pp-regions", .kind = OPTION_U32, .offset = offsetof(T, m.pp_regions), .lo = 1,    \
    .hi = MODEL_MAX_LAYERS, .metavar = "N",                                                      \
    .help = "override the model's PP split: N equal regions of layers"                          \
  }

// clang-format on

/* The first front-end option given in ca ("--model", "--mbs", ...), or NULL: what --plans,
 * which takes plans as compiled, cannot be given with. */
const char *options_compile_arg_given(const struct compile_args *ca);

/* Prints each line of notes (compile_options.notes) to stderr as "<program>: note: <line>". */
void options_print_notes(const char *program, const GString *notes);

/* options_parse's result when the program goes on (any other is its exit status). */
#define OPTIONS_CONTINUE (-1)

/* Reads argv[1 ..] into args by p's table. Returns OPTIONS_CONTINUE, or the exit status the
 * program returns at once: 0 after an action (--help), 2 after printing a usage error
 * "<program>: error: <what> (see <program> --help)" (unknown option, missing or bad value). */
int options_parse(const struct option_program *p, void *args, int argc, char **argv);

#endif
