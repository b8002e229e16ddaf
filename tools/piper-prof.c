/* piper-prof: measures this machine for the simulator and writes a device profile (sim/profile.h).
 * Every op kind of the given models is timed at the shapes the models use, separately for F,
 * BI, BW and the fused B, through the host kernels the executor calls (exec/train.c), as the
 * median of repeats after warm-up; then AdamW at several sizes, the single-thread GEMM rate
 * and a triad bandwidth (the roofline the simulator falls back on for ops without an entry);
 * the host's cores and the executor's own costs through the host backend; under mpirun with 2
 * or more ranks, point-to-point and each collective over a range of sizes and group sizes,
 * one fit per operation by least squares. Progress goes to stderr. */
#include <cJSON.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_MPI
#include <mpi.h>
#endif

#include "../base/base.h"
#include "../base/version.h"
#include "../exec/backend.h"
#include "../ir/ir.h"
#include "../kernels/kernels.h"
#include "../models/model.h"
#include "../sim/profile.h"
#include "options.h"
#include "prof-impl.h"


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


void prof_progress(const struct prof_run *r, const char *fmt, ...) {
  if (r->a->quiet || r->rank != 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  fputs("piper-prof: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static double physical_memory_bytes(void) {
  return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

double prof_round_sig(double x, int digits) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.*g", digits, x);
  return strtod(buf, NULL);
}

/* ---- timing ------------------------------------------------------------------------------- */

typedef void (*bench_fn)(void *ctx);

/* Median seconds of one call of fn: warm-up calls first (scratch grows, caches fill), then at
 * least `repeats` timed calls, more for short kernels (up to about 50 ms of timing in all). */
static double median_seconds_after(const struct prof_args *a, bench_fn fn, void *ctx,
                                   bench_fn before) {
  for (uint32_t i = 0; i < a->warmup; i++)
    fn(ctx);
  if (before)
    before(NULL);
  double t0 = piper_clock_seconds();
  fn(ctx);
  double first = piper_clock_seconds() - t0;
  uint32_t n = a->repeats;
  double want = a->quick ? 0.005 : 0.05;
  if (first > 0 && want / first > n)
    n = want / first > 500 ? 500 : (uint32_t)(want / first);
  double *t = g_new(double, n);
  for (uint32_t i = 0; i < n; i++) {
    if (before)
      before(NULL);
    double s = piper_clock_seconds();
    fn(ctx);
    t[i] = piper_clock_seconds() - s;
  }
  qsort(t, n, sizeof *t, piper_cmp_double);
  double med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  g_free(t);
  return med;
}

static double median_seconds(const struct prof_args *a, bench_fn fn, void *ctx) {
  return median_seconds_after(a, fn, ctx, NULL);
}

/* Writes a buffer twice the last-level cache (at least 16 MiB): what runs next finds its
 * operands in memory, as the optimizer does after a whole step of other work. */
static void evict_caches(void *unused) {
  (void)unused;
  static char *buf;
  static size_t n;
  if (!buf) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    n = llc > 0 ? 2 * (size_t)llc : 0;
    n = n < ((size_t)16 << 20) ? (size_t)16 << 20 : n > ((size_t)256 << 20) ? (size_t)256 << 20 : n;
    buf = g_malloc(n);
  }
  for (size_t i = 0; i < n; i += 64)
    buf[i] = (char)(buf[i] + 1);
}

float *prof_random_floats(size_t n, uint32_t seed, float scale) {
  float *x = g_new(float, n ? n : 1);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = scale * (((float)(s >> 8) / 16777216.0f) - 0.5f);
  }
  return x;
}

int32_t *prof_random_ids(size_t n, int32_t range) {
  int32_t *x = g_new(int32_t, n ? n : 1);
  for (size_t i = 0; i < n; i++)
    x[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)range);
  return x;
}

/* Least squares of y = alpha + beta * x over n points, each residual relative to its y (weights
 * 1 / y^2): the times span several decades, and a plain fit would let the largest sizes set
 * the latency too (often below zero). */
void prof_fit_line(const double *x, const double *y, int n, double *alpha, double *beta) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < n; i++) {
    double w = y[i] > 0 ? 1 / (y[i] * y[i]) : 0;
    sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  double d = sw * sxx - sx * sx;
  *beta = d != 0 ? (sw * sxy - sx * sy) / d : 0;
  *alpha = sw > 0 ? (sy - *beta * sx) / sw : 0;
}

/* ---- one op's kernels, as exec/train.c calls them ----------------------------------------- */


static void run_embedding(struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    kernels_embedding_forward(b->out, b->tokens, b->params, b->T, b->V, b->C);
  else if (b->pass == IR_PASS_BW)
    kernels_embedding_backward_weight(b->dparams, b->dout, b->tokens, b->T, b->V, b->C);
  else if (b->pass == IR_PASS_B)
    kernels_embedding_backward(b->dparams, b->dout, b->tokens, b->T, b->V, b->C);
}

static void run_rmsnorm(struct op_bench *b) {
  float eps = (float)b->m->rms_norm_eps;
  if (b->pass == IR_PASS_F)
    kernels_rmsnorm_forward(b->out, b->saved, b->in0, b->params, b->T, b->C, eps);
  else if (b->pass == IR_PASS_BI)
    kernels_rmsnorm_backward_input(b->din, b->dout, b->in0, b->saved, b->params, b->T, b->C, false);
  else if (b->pass == IR_PASS_BW)
    kernels_rmsnorm_backward_weight(b->dparams, b->dout, b->in0, b->saved, b->T, b->C);
  else
    kernels_rmsnorm_backward(b->din, b->dparams, b->dout, b->in0, b->saved, b->params, b->T, b->C,
                             false);
}

static void run_attention(struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    kernels_attention_forward(b->out, b->saved, b->in0, b->params, &b->dd);
  else if (b->pass == IR_PASS_BI)
    kernels_attention_backward_input(b->din, b->bwork, b->dout, b->saved, b->params, &b->dd, false);
  else if (b->pass == IR_PASS_BW)
    kernels_attention_backward_weight(b->dparams, b->bwork, b->dout, b->in0, b->saved, &b->dd);
  else
    kernels_attention_backward(b->din, b->dparams, b->bwork, b->dout, b->in0, b->saved, b->params,
                               &b->dd, false);
}

/* The executor copies x, then adds the block's output; backward hands dx to both inputs. */
static void run_residual_add(struct op_bench *b) {
  size_t n = (size_t)b->T * b->C;
  if (b->pass == IR_PASS_F) {
    memcpy(b->out, b->in0, n * sizeof(float));
    kernels_residual_add_forward(b->out, b->dout, n);
  } else if (b->pass != IR_PASS_BW) {
    kernels_residual_add_backward(b->din, b->dout, n, false);
    kernels_residual_add_backward(b->out, b->dout, n, false);
  }
}

static void run_mlp(struct op_bench *b) {
  if (b->pass == IR_PASS_F)
    kernels_mlp_forward(b->out, b->saved, b->in0, b->params, b->T, b->C, b->F);
  else if (b->pass == IR_PASS_BI)
    kernels_mlp_backward_input(b->din, b->bwork, b->dout, b->saved, b->params, b->T, b->C, b->F,
                               false);
  else if (b->pass == IR_PASS_BW)
    kernels_mlp_backward_weight(b->dparams, b->bwork, b->dout, b->in0, b->saved, b->T, b->C, b->F);
  else
    kernels_mlp_backward(b->din, b->dparams, b->bwork, b->dout, b->in0, b->saved, b->params, b->T,
                         b->C, b->F, false);
}

static void run_router(struct op_bench *b) {
  int T = b->T, C = b->C, E = b->E, K = b->K;
  if (b->pass == IR_PASS_F)
    kernels_router_forward(b->ids, b->weights, b->saved, b->in0, b->params, T, C, E, K);
  else if (b->pass == IR_PASS_BI)
    kernels_router_backward_input(b->din, b->bwork, b->dweights, b->ids, b->weights, b->saved,
                                  b->params, T, C, E, K, false);
  else if (b->pass == IR_PASS_BW)
    kernels_router_backward_weight(b->dparams, b->bwork, b->in0, T, C, E);
  else
    kernels_router_backward(b->din, b->dparams, b->bwork, b->dweights, b->ids, b->weights, b->saved,
                            b->in0, b->params, T, C, E, K, false);
}

/* The experts alone on one device of an ep-way group, as the executor's expert-parallel path
 * runs them between the all-to-alls: E / ep local experts over the T x k rows it receives. */
static void run_ep_experts(struct op_bench *b) {
  int C = b->C, El = b->E / b->ep, F = b->F, TK = b->T * b->K;
  if (b->pass == IR_PASS_F)
    kernels_expert_ffn_forward(b->y, b->saved, b->scratch, b->rows, b->row_expert, TK, b->params, 0,
                               El, C, F);
  else if (b->pass == IR_PASS_BW)
    kernels_expert_ffn_backward_weight(b->dparams, b->bwork, b->row_expert, TK, b->saved, 0, El, C,
                                       F);
  else if (b->pass == IR_PASS_B)
    kernels_expert_ffn_backward(b->drows, b->dparams, b->bwork, b->scratch, b->dy, b->row_expert,
                                TK, b->saved, b->params, 0, El, C, F, false);
  else
    kernels_expert_ffn_backward_input(b->drows, b->bwork, b->scratch, b->dy, b->row_expert, TK,
                                      b->saved, b->params, 0, El, C, F, false);
}

/* Experts on one device: plan, dispatch, the experts, combine (and their backward), as the
 * executor's one-device path runs them. */
static void run_expert_ffn(struct op_bench *b) {
  int T = b->T, C = b->C, E = b->E, K = b->K, F = b->F, TK = T * K;
  if (b->ep > 1) {
    run_ep_experts(b);
    return;
  }
  if (b->pass == IR_PASS_F) {
    kernels_moe_dispatch_plan(b->counts, b->route_row, b->ids, T, K, E, 1);
    kernels_moe_dispatch_forward(b->rows, b->row_expert, b->in0, b->ids, b->route_row, T, K, C);
    kernels_expert_ffn_forward(b->y, b->saved, b->scratch, b->rows, b->row_expert, TK, b->params, 0,
                               E, C, F);
    kernels_moe_combine_forward(b->out, b->y, b->weights, b->route_row, T, K, C);
    return;
  }
  if (b->pass == IR_PASS_BW) {
    kernels_expert_ffn_backward_weight(b->dparams, b->bwork, b->row_expert, TK, b->saved, 0, E, C,
                                       F);
    return;
  }
  kernels_moe_combine_backward(b->dy, b->dweights, b->dout, b->y, b->weights, b->route_row, T, K,
                               C);
  if (b->pass == IR_PASS_B)
    kernels_expert_ffn_backward(b->drows, b->dparams, b->bwork, b->scratch, b->dy, b->row_expert,
                                TK, b->saved, b->params, 0, E, C, F, false);
  else
    kernels_expert_ffn_backward_input(b->drows, b->bwork, b->scratch, b->dy, b->row_expert, TK,
                                      b->saved, b->params, 0, E, C, F, false);
  kernels_moe_dispatch_backward(b->din, b->drows, b->route_row, T, K, C, false);
}

/* BI recomputes the logits from in0 into bwork and reads saved's row statistics only, so
 * repeated calls see the same inputs each time. */
static void run_lm_head(struct op_bench *b) {
  enum kernels_lm_head_layout lay =
      b->m->tie_word_embeddings ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
  int T = b->T, C = b->C, V = b->V;
  float loss;
  if (b->pass == IR_PASS_F)
    kernels_lm_head_loss_forward(&loss, b->saved, b->in0, b->tokens, b->params, lay, T, C, V);
  else if (b->pass == IR_PASS_BI)
    kernels_lm_head_loss_backward_input(b->din, b->bwork, b->saved, b->in0, b->tokens, b->params,
                                        lay, 1.0f, T, C, V, false);
  else if (b->pass == IR_PASS_BW)
    kernels_lm_head_loss_backward_weight(b->dparams, b->bwork, b->saved, b->in0, b->tokens,
                                         b->params, lay, 1.0f, T, C, V);
  else
    kernels_lm_head_loss_backward(b->din, b->dparams, b->bwork, b->saved, b->in0, b->tokens,
                                  b->params, lay, 1.0f, T, C, V, false);
}

static void op_bench_run(void *ctx) {
  struct op_bench *b = ctx;
  switch (b->op->kind) {
  case MODEL_OP_EMBEDDING: run_embedding(b); break;
  case MODEL_OP_RMSNORM: run_rmsnorm(b); break;
  case MODEL_OP_ATTENTION: run_attention(b); break;
  case MODEL_OP_RESIDUAL_ADD: run_residual_add(b); break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: run_mlp(b); break;
  case MODEL_OP_ROUTER: run_router(b); break;
  case MODEL_OP_EXPERT_FFN: run_expert_ffn(b); break;
  case MODEL_OP_LM_HEAD_LOSS: run_lm_head(b); break;
  default: PIPER_UNREACHABLE();
  }
}


struct op_sizes prof_op_sizes(struct op_bench *b) {
  struct op_sizes z = {.in = (size_t)b->T * b->C, .out = (size_t)b->T * b->C};
  size_t TK = (size_t)b->T * b->K;
  switch (b->op->kind) {
  case MODEL_OP_EMBEDDING: z.params = kernels_embedding_param_count(b->V, b->C); break;
  case MODEL_OP_RMSNORM:
    z.params = kernels_rmsnorm_param_count(b->C);
    z.saved = kernels_rmsnorm_saved_floats(b->T);
    break;
  case MODEL_OP_ATTENTION:
    z.params = kernels_attention_param_count(&b->dd);
    z.saved = kernels_attention_saved_floats(&b->dd);
    z.bwork = kernels_attention_bwork_floats(&b->dd);
    break;
  case MODEL_OP_RESIDUAL_ADD: break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT:
    z.params = kernels_mlp_param_count(b->C, b->F);
    z.saved = kernels_mlp_saved_floats(b->T, b->F);
    z.bwork = kernels_mlp_bwork_floats(b->T, b->F);
    break;
  case MODEL_OP_ROUTER:
    z.params = kernels_router_param_count(b->C, b->E);
    z.saved = kernels_router_saved_floats(b->T, b->E);
    z.bwork = kernels_router_bwork_floats(b->T, b->E);
    break;
  case MODEL_OP_EXPERT_FFN:
    z.params = kernels_expert_ffn_param_count(b->ep > 1 ? b->E / b->ep : b->E, b->C, b->F);
    z.saved = kernels_expert_ffn_saved_floats((int)TK, b->C, b->F);
    z.bwork = kernels_expert_ffn_bwork_floats((int)TK, b->C, b->F);
    z.scratch = kernels_expert_ffn_scratch_floats((int)TK, b->C);
    z.rows = TK * b->C;
    break;
  case MODEL_OP_LM_HEAD_LOSS:
    z.params = kernels_lm_head_loss_param_count(b->C, b->V);
    z.saved = kernels_lm_head_loss_saved_floats(b->T, b->V);
    z.bwork = kernels_lm_head_loss_bwork_floats(b->T, b->V);
    break;
  default: break;
  }
  return z;
}

/* The dimensions from the op's shape (models/model.h's table of shape fields). */
void prof_op_bench_dims(struct op_bench *b) {
  const int64_t *s = b->op->shape;
  switch (b->op->kind) {
  case MODEL_OP_ATTENTION:
    b->dd = (struct kernels_attention_dims){
        (int)s[0], (int)s[1], (int)s[2], (int)s[3], (int)s[4], (int)s[5], (float)b->m->rope_theta,
        NULL, NULL};
    b->T = (int)(s[0] * s[1]), b->C = (int)s[5];
    break;
  case MODEL_OP_EMBEDDING: b->T = (int)s[0], b->V = (int)s[1], b->C = (int)s[2]; break;
  case MODEL_OP_LM_HEAD_LOSS: b->T = (int)s[0], b->C = (int)s[1], b->V = (int)s[2]; break;
  case MODEL_OP_ROUTER:
    b->T = (int)s[0], b->C = (int)s[1], b->E = (int)s[2], b->K = (int)s[3];
    break;
  case MODEL_OP_EXPERT_FFN:
    b->T = (int)s[0], b->C = (int)s[1], b->F = (int)s[2], b->E = (int)s[3], b->K = (int)s[4];
    b->ep = (int)s[PROFILE_EP_DIM];
    break;
  default: b->T = (int)s[0], b->C = (int)s[1], b->F = (int)s[2]; break;
  }
  if (b->V == 0)
    b->V = (int)b->m->vocab_size;
}

static void op_bench_init(struct op_bench *b, const struct model *m, const struct model_op *op) {
  *b = (struct op_bench){.m = m, .op = op};
  prof_op_bench_dims(b);
  struct op_sizes z = prof_op_sizes(b);
  size_t TK = (size_t)b->T * (b->K ? b->K : 1);
  b->params = prof_random_floats(z.params, 1, 0.1f);
  b->dparams = g_new0(float, z.params ? z.params : 1);
  b->in0 = prof_random_floats(z.in, 2, 1.0f);
  b->dout = prof_random_floats(z.out, 3, 1.0f);
  b->out = g_new0(float, z.out ? z.out : 1);
  b->din = g_new0(float, z.in ? z.in : 1);
  b->saved = g_new0(float, z.saved ? z.saved : 1);
  b->bwork = g_new0(float, z.bwork ? z.bwork : 1);
  b->tokens = prof_random_ids((size_t)b->T, b->V > 0 ? b->V : 1);
  b->ids = prof_random_ids(TK, b->E > 0 ? b->E : 1);
  b->route_row = g_new0(int32_t, TK);
  b->row_expert = g_new0(int32_t, TK);
  b->weights = prof_random_floats(TK, 4, 1.0f);
  b->dweights = prof_random_floats(TK, 5, 1.0f);
  b->rows = g_new0(float, z.rows ? z.rows : 1);
  b->y = g_new0(float, z.rows ? z.rows : 1);
  b->dy = g_new0(float, z.rows ? z.rows : 1);
  if (b->ep > 1) { /* what the dispatch would have brought: rows, their local experts */
    g_free(b->rows), g_free(b->dy);
    b->rows = prof_random_floats(z.rows, 6, 1.0f);
    b->dy = prof_random_floats(z.rows, 7, 1.0f);
    for (size_t r = 0; r < TK; r++)
      b->row_expert[r] = b->ids[r] % (b->E / b->ep);
  }
  b->drows = g_new0(float, z.rows ? z.rows : 1);
  b->scratch = g_new0(float, z.scratch ? z.scratch : 1);
}

static void op_bench_free(struct op_bench *b) {
  float *f[] = {b->params,  b->dparams,  b->in0,  b->out, b->dout, b->din,   b->saved,  b->bwork,
                b->weights, b->dweights, b->rows, b->y,   b->dy,   b->drows, b->scratch};
  for (size_t i = 0; i < G_N_ELEMENTS(f); i++)
    g_free(f[i]);
  g_free(b->tokens), g_free(b->ids), g_free(b->route_row), g_free(b->row_expert);
}

/* ---- the kernel table --------------------------------------------------------------------- */

bool prof_op_has_kernel(enum model_op_kind k) {
  return k != MODEL_OP_MLA_ATTENTION && k < MODEL_OP_KIND_COUNT;
}

/* Whether the executor runs anything for (kind, pass): embeddings have no BI (tokens are not
 * differentiable), a residual add no BW (no parameters). */
bool prof_pass_runs(enum model_op_kind k, enum ir_pass pass) {
  return !(k == MODEL_OP_EMBEDDING && pass == IR_PASS_BI) &&
         !(k == MODEL_OP_RESIDUAL_ADD && pass == IR_PASS_BW);
}

static int shape_rank(const struct model_op *op) {
  int n = PROFILE_MAX_SHAPE;
  while (n > 1 && op->shape[n - 1] == 0)
    n--;
  return n;
}

/* milliseconds to 4 significant digits: microsecond resolution is below the clocks' noise */
static cJSON *ms4(double seconds) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.4g", seconds * 1e3);
  return cJSON_CreateNumber(strtod(buf, NULL));
}

void prof_entry_host_ms(cJSON *entry, double seconds) {
  cJSON_AddItemToObject(entry, "host_ms", ms4(seconds));
}

cJSON *prof_add_entry(struct prof_run *r, const struct model_op *op, enum ir_pass pass,
                      double seconds) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "op", model_op_kind_name(op->kind));
  cJSON_AddStringToObject(e, "pass", ir_pass_name(pass));
  cJSON *shape = cJSON_AddArrayToObject(e, "shape");
  for (int i = 0; i < shape_rank(op); i++)
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)op->shape[i]));
  cJSON_AddItemToObject(e, "ms", ms4(seconds));
  cJSON_AddItemToArray(r->measured, e);
  r->n_entries++;
  return e;
}

/* Bytes of every buffer op_bench_init allocates for the op (an upper bound); the CUDA
 * profiler's buffers are the same. */
double prof_op_bench_bytes(const struct model *m, const struct model_op *op) {
  struct op_bench b = {.m = m, .op = op};
  prof_op_bench_dims(&b);
  struct op_sizes z = prof_op_sizes(&b);
  double TK = (double)b.T * (b.K ? b.K : 1);
  return 4.0 *
         (2.0 * (double)z.params + 2.0 * (double)z.in + 2.0 * (double)z.out + (double)z.saved +
          (double)z.bwork + 4.0 * (double)z.rows + (double)z.scratch + 6.0 * TK + (double)b.T);
}

static void progress_op(const struct prof_run *r, const struct model_op *op, const double *t) {
  GString *shape = g_string_new("");
  for (int i = 0; i < shape_rank(op); i++)
    g_string_append_printf(shape, "%s%lld", i ? "x" : "", (long long)op->shape[i]);
  prof_progress(r, "  %-13s %-18s F %8.1f us  BI %8.1f us  BW %8.1f us  B %8.1f us",
           model_op_kind_name(op->kind), shape->str, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6,
           t[3] * 1e6);
  g_string_free(shape, TRUE);
}

/* One op at its shape: F first (it fills saved), BI (it fills bwork) before BW, then B. */
static void measure_op(struct prof_run *r, const struct model *m, const struct model_op *op) {
  static const enum ir_pass passes[] = {IR_PASS_F, IR_PASS_BI, IR_PASS_BW, IR_PASS_B};
  struct op_bench b;
  op_bench_init(&b, m, op);
  double t[4];
  for (size_t p = 0; p < G_N_ELEMENTS(passes); p++) {
    b.pass = passes[p];
    t[p] = prof_pass_runs(op->kind, b.pass) ? median_seconds(r->a, op_bench_run, &b) : 0;
    prof_add_entry(r, op, b.pass, t[p]);
  }
  op_bench_free(&b);
  progress_op(r, op, t);
}

/* "kind shape...": a (kind, shape) class is measured once per run (prof_run.seen). */
static char *op_shape_key(const struct model_op *op) {
  GString *key = g_string_new(model_op_kind_name(op->kind));
  for (int d = 0; d < PROFILE_MAX_SHAPE; d++)
    g_string_append_printf(key, " %lld", (long long)op->shape[d]);
  return g_string_free(key, FALSE);
}

GArray *prof_ep_variants(const struct model *m) {
  GArray *v = g_array_new(FALSE, FALSE, sizeof(struct model_op));
  for (uint32_t i = 0; i < m->n_ops; i++) {
    const struct model_op *op = &m->ops[i];
    if (op->kind != MODEL_OP_EXPERT_FFN)
      continue;
    for (int64_t d = 2, E = op->shape[3]; d <= E; d++) {
      struct model_op x = *op;
      x.shape[PROFILE_EP_DIM] = d;
      bool seen = E % d != 0;
      for (guint k = 0; k < v->len && !seen; k++)
        seen = !memcmp(g_array_index(v, struct model_op, k).shape, x.shape, sizeof x.shape);
      if (!seen)
        g_array_append_val(v, x);
    }
  }
  return v;
}

/* ---- kernels in the executor's order ------------------------------------------------------
 * A kernel timed alone, back to back on the same buffers, runs with its operands hot in the
 * caches; the executor runs it between the other ops of the model, on one set of activation
 * buffers per micro-batch, with the weights shared. So the model's ops are run as the
 * executor runs them on one device: forward of every op for each of CHAIN_MBS micro-batches,
 * then BI in reverse op order, BW, and the fused B, every op on its micro-batch's own buffers;
 * each call is timed where it stands and an entry is the median over repeats, micro-batches
 * and every op of that kind and shape (the layers). This is a micro-benchmark of the kernels
 * alone, not a run of any plan. */
#define CHAIN_MBS 4

struct chain {
  const struct model *m;
  uint32_t n_ops;         /* the model's, then its expert-parallel variants */
  uint32_t n_model_ops;
  GArray *variants;       /* struct model_op: the expert-parallel variants */
  const struct model_op **ops; /* [n_ops] */
  bool *run;              /* [n_ops] ops timed here (kernel, first-seen shape class) */
  uint32_t *cls;          /* [n_ops] index of the op's (kind, shape) class */
  uint32_t n_classes;
  const struct model_op **class_op; /* [n_classes] an op of each class */
  struct op_bench *b;     /* [CHAIN_MBS * n_ops] */
  GArray **samples;       /* [n_classes * 4] seconds per (class, pass) */
  float **m1, **v1;       /* [n_ops] AdamW moments of each op's weights */
  size_t *n_params;       /* [n_ops] */
  GArray **opt;           /* [n_segments] AdamW seconds of each segment */
  uint8_t *linked;        /* [CHAIN_MBS * n_ops] LINK_IN: in0 borrowed, LINK_DOUT: dout */
  uint32_t n_linked;      /* ops of a micro-batch that read their predecessor's output */
  int step;
};

/* AdamW of every segment after the backward, in segment order, each timed as a whole (the
 * executor's optimizer instruction updates a segment's weights). */
static void chain_optimizer(struct chain *c) {
  c->step++;
  for (uint32_t sg = 0; sg < c->m->n_segments; sg++) {
    const struct model_segment *seg = &c->m->segments[sg];
    double t0 = piper_clock_seconds();
    bool any = false;
    for (uint32_t i = seg->op_first; i < seg->op_first + seg->op_count; i++) {
      if (!c->run[i] || c->n_params[i] == 0)
        continue;
      kernels_adamw_step(c->b[i].params, c->b[i].dparams, c->m1[i], c->v1[i], c->n_params[i], 1e-9f,
                         0.9f, 0.95f, 1e-8f, 0.0f, c->step);
      any = true;
    }
    double dt = piper_clock_seconds() - t0;
    if (any)
      g_array_append_val(c->opt[sg], dt);
  }
}

static const enum ir_pass chain_passes[4] = {IR_PASS_F, IR_PASS_BI, IR_PASS_BW, IR_PASS_B};

/* One pass over every op of micro-batches [mb0, mb1) (backward passes in reverse op order). */
static void chain_sweep(struct chain *c, int pass, int mb0, int mb1) {
  bool reverse = chain_passes[pass] != IR_PASS_F;
  for (int mb = mb0; mb < mb1; mb++)
    for (uint32_t k = 0; k < c->n_ops; k++) {
      uint32_t i = reverse ? c->n_ops - 1 - k : k;
      if (!c->run[i])
        continue;
      struct op_bench *b = &c->b[(size_t)mb * c->n_ops + i];
      b->pass = chain_passes[pass];
      if (!prof_pass_runs(b->op->kind, b->pass))
        continue;
      double t0 = piper_clock_seconds();
      op_bench_run(b);
      double dt = piper_clock_seconds() - t0;
      if (c->cls[i] != UINT32_MAX) /* else measured with an earlier model: run, not kept */
        g_array_append_val(c->samples[c->cls[i] * 4 + (uint32_t)pass], dt);
    }
}

/* One step of the chain as the executor runs a pipeline stage: F of every micro-batch, then
 * each micro-batch's BI and right after it its BW (zero-bubble schedules run a micro-batch's
 * BW right after its BI or two instructions later; swept after every micro-batch's BI
 * instead, the GEMM ops' BW came out 3-6% slower, RMSNorm's 34%), then the fused B of every
 * micro-batch (1F1B-style schedules). */
static void chain_step(struct chain *c) {
  chain_sweep(c, 0, 0, CHAIN_MBS);
  for (int mb = 0; mb < CHAIN_MBS; mb++) {
    chain_sweep(c, 1, mb, mb + 1);
    chain_sweep(c, 2, mb, mb + 1);
  }
  chain_sweep(c, 3, 0, CHAIN_MBS);
}

static double array_median(GArray *a) {
  if (a->len == 0)
    return 0;
  qsort(a->data, a->len, sizeof(double), piper_cmp_double);
  const double *v = (const double *)(void *)a->data;
  return a->len % 2 ? v[a->len / 2] : 0.5 * (v[a->len / 2 - 1] + v[a->len / 2]);
}

enum { LINK_IN = 1, LINK_DOUT = 2 };

/* The executor's data flow within a micro-batch: an op reads the output its predecessor has
 * just written (still in the caches), and its backward reads the input gradient its
 * successor has just written. Each op timed on buffers of its own read them cold, and the
 * kernels came out about 10% slower than in a step. Linked where the sizes agree (a
 * residual add's second input and the MoE ops' routed rows keep their own buffers). */
static uint32_t chain_link(struct chain *c) {
  uint32_t n = 0;
  c->linked = g_new0(uint8_t, (size_t)CHAIN_MBS * c->n_ops + 1);
  for (int mb = 0; mb < CHAIN_MBS; mb++) {
    struct op_bench *prev = NULL;
    uint8_t *prev_link = NULL;
    for (uint32_t i = 0; i < c->n_model_ops; i++) {
      if (!c->run[i])
        continue;
      size_t at = (size_t)mb * c->n_ops + i;
      struct op_bench *b = &c->b[at];
      struct op_sizes zb = prof_op_sizes(b);
      if (prev && b->in0 && prev->out && prev->dout && b->din && zb.in > 0 &&
          prof_op_sizes(prev).out == zb.in) {
        g_free(b->in0);
        b->in0 = prev->out;
        g_free(prev->dout);
        prev->dout = b->din;
        c->linked[at] |= LINK_IN;
        *prev_link |= LINK_DOUT;
        n += mb == 0;
      }
      prev = b;
      prev_link = &c->linked[at];
    }
  }
  return n;
}

/* Buffers of every micro-batch of every op, the weights of micro-batch 0 shared by all. */
static void chain_init(struct chain *c, const struct model *m) {
  c->b = g_new0(struct op_bench, (size_t)CHAIN_MBS * c->n_ops + 1);
  for (uint32_t i = 0; i < c->n_ops; i++) {
    if (!c->run[i])
      continue;
    for (int mb = 0; mb < CHAIN_MBS; mb++) {
      struct op_bench *b = &c->b[(size_t)mb * c->n_ops + i];
      op_bench_init(b, m, c->ops[i]);
      if (mb > 0) {
        g_free(b->params), g_free(b->dparams);
        b->params = c->b[i].params, b->dparams = c->b[i].dparams;
      }
    }
  }
  c->m1 = g_new0(float *, c->n_ops + 1);
  c->v1 = g_new0(float *, c->n_ops + 1);
  c->n_params = g_new0(size_t, c->n_ops + 1);
  for (uint32_t i = 0; i < c->n_ops; i++)
    if (c->run[i]) {
      c->n_params[i] = prof_op_sizes(&c->b[i]).params;
      c->m1[i] = g_new0(float, c->n_params[i] + 1);
      c->v1[i] = g_new0(float, c->n_params[i] + 1);
    }
  c->opt = g_new(GArray *, m->n_segments + 1);
  for (uint32_t sg = 0; sg < m->n_segments; sg++)
    c->opt[sg] = g_array_new(FALSE, FALSE, sizeof(double));
  c->n_linked = chain_link(c);
}

static void chain_free(struct chain *c) {
  for (uint32_t i = 0; i < c->n_ops; i++) {
    if (!c->run[i])
      continue;
    for (int mb = CHAIN_MBS - 1; mb >= 0; mb--) {
      size_t at = (size_t)mb * c->n_ops + i;
      struct op_bench *b = &c->b[at];
      if (mb > 0)
        b->params = b->dparams = NULL;
      if (c->linked[at] & LINK_IN)
        b->in0 = NULL; /* the previous op's out, freed with it */
      if (c->linked[at] & LINK_DOUT)
        b->dout = NULL; /* the next op's din */
      op_bench_free(b);
    }
  }
  g_free(c->linked);
  for (uint32_t k = 0; k < 4 * c->n_classes; k++)
    g_array_free(c->samples[k], TRUE);
  for (uint32_t i = 0; i < c->n_ops; i++)
    g_free(c->m1[i]), g_free(c->v1[i]);
  for (uint32_t sg = 0; sg < c->m->n_segments; sg++)
    g_array_free(c->opt[sg], TRUE);
  g_free(c->m1), g_free(c->v1), g_free(c->n_params), g_free(c->opt);
  g_free(c->samples), g_free(c->b), g_free(c->run), g_free(c->cls), g_free(c->class_op);
  g_free(c->ops);
  g_array_free(c->variants, TRUE);
}

/* The ops with a kernel (all run) and the (kind, shape) classes not measured yet (kept): the
 * model's ops, then their expert-parallel variants, timed after the model's in each sweep. */
static void chain_classes(struct prof_run *r, struct chain *c, const struct model *m) {
  c->m = m;
  c->n_model_ops = m->n_ops;
  c->variants = prof_ep_variants(m);
  c->n_ops = m->n_ops + c->variants->len;
  c->ops = g_new(const struct model_op *, c->n_ops + 1);
  for (uint32_t i = 0; i < c->n_ops; i++)
    c->ops[i] = i < m->n_ops ? &m->ops[i]
                             : &g_array_index(c->variants, struct model_op, i - m->n_ops);
  c->run = g_new0(bool, c->n_ops + 1);
  c->cls = g_new0(uint32_t, c->n_ops + 1);
  c->class_op = g_new0(const struct model_op *, c->n_ops + 1);
  GHashTable *mine = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  for (uint32_t i = 0; i < c->n_ops; i++) {
    const struct model_op *op = c->ops[i];
    if (!prof_op_has_kernel(op->kind))
      continue;
    c->run[i] = true;
    c->cls[i] = UINT32_MAX;
    char *key = op_shape_key(op);
    gpointer id;
    if (g_hash_table_lookup_extended(mine, key, NULL, &id)) {
      c->cls[i] = GPOINTER_TO_UINT(id);
      g_free(key);
      continue;
    }
    if (g_hash_table_contains(r->seen, key)) {
      g_free(key);
      continue;
    }
    c->cls[i] = c->n_classes;
    c->class_op[c->n_classes++] = op;
    g_hash_table_insert(mine, g_strdup(key), GUINT_TO_POINTER(c->cls[i]));
    g_hash_table_add(r->seen, key);
  }
  g_hash_table_destroy(mine);
  c->samples = g_new(GArray *, 4 * c->n_classes + 1);
  for (uint32_t k = 0; k < 4 * c->n_classes; k++)
    c->samples[k] = g_array_new(FALSE, FALSE, sizeof(double));
}

/* Bytes of every buffer of the chain: it must fit comfortably, or the ops are timed alone. */
static double chain_bytes(const struct model *m) {
  double total = 0;
  for (uint32_t i = 0; i < m->n_ops; i++)
    if (prof_op_has_kernel(m->ops[i].kind))
      total += CHAIN_MBS * prof_op_bench_bytes(m, &m->ops[i]);
  GArray *v = prof_ep_variants(m);
  for (guint i = 0; i < v->len; i++)
    total += CHAIN_MBS * prof_op_bench_bytes(m, &g_array_index(v, struct model_op, i));
  g_array_free(v, TRUE);
  return total;
}

/* A chain's figures once its sweeps are done: AdamW per segment, then each class's entries. */
static void chain_entries(struct prof_run *r, struct chain *c) {
  const struct model *m = c->m;
  for (uint32_t sg = 0; sg < m->n_segments; sg++) {
    if (c->opt[sg]->len == 0)
      continue;
    double params = 0, t = array_median(c->opt[sg]);
    for (uint32_t i = m->segments[sg].op_first;
         i < m->segments[sg].op_first + m->segments[sg].op_count; i++)
      params += (double)c->n_params[i];
    g_array_append_val(r->opt_params, params);
    g_array_append_val(r->opt_seconds, t);
    prof_progress(r, "  %s: AdamW of segment %u: %.0f parameters, %.1f us", m->name, sg, params,
                  t * 1e6);
  }
  for (uint32_t k = 0; k < c->n_classes; k++) {
    double t[4];
    for (int p = 0; p < 4; p++) {
      t[p] = array_median(c->samples[k * 4 + (uint32_t)p]);
      prof_add_entry(r, c->class_op[k], chain_passes[p], t[p]);
    }
    progress_op(r, c->class_op[k], t);
  }
}

/* The chains of every model that fits (their buffers together within an eighth of the memory;
 * chained[i] says which), timed in turns: each repeat sweeps every model's chain once, so a
 * slow spell of the machine (another tenant, a frequency change) falls on every model's
 * samples alike and the medians over repeats leave it out. Timed one model after the other, a
 * spell of ten seconds moved every kernel of one model by 30% between two profiles. */
static void measure_chains(struct prof_run *r, const GPtrArray *models, bool *chained) {
  struct chain *cs = g_new0(struct chain, models->len + 1);
  double total = 0, limit = physical_memory_bytes() / 8;
  for (guint i = 0; i < models->len; i++) {
    const struct model *m = g_ptr_array_index(models, i);
    double bytes = chain_bytes(m);
    if (total + bytes > limit)
      continue;
    total += bytes;
    chained[i] = true;
    prof_progress(r, "kernels of %s (%u ops) in the executor's order, %d micro-batches", m->name,
                  m->n_ops, CHAIN_MBS);
    chain_classes(r, &cs[i], m);
    chain_init(&cs[i], m);
    prof_progress(r, "  %s: %u ops read their predecessor's output, and hand it its gradient",
                  m->name, cs[i].n_linked);
  }
  uint32_t reps = r->a->quick ? 3 : r->a->repeats;
  for (uint32_t rep = 0; rep < r->a->warmup + 1 + reps; rep++)
    for (guint i = 0; i < models->len; i++) {
      struct chain *c = &cs[i];
      if (!chained[i])
        continue;
      if (rep == r->a->warmup + 1) { /* warm-up done */
        for (uint32_t k = 0; k < 4 * c->n_classes; k++)
          g_array_set_size(c->samples[k], 0);
        for (uint32_t sg = 0; sg < c->m->n_segments; sg++)
          g_array_set_size(c->opt[sg], 0);
      }
      chain_step(c);
      chain_optimizer(c);
    }
  for (guint i = 0; i < models->len; i++)
    if (chained[i]) {
      chain_entries(r, &cs[i]);
      chain_free(&cs[i]);
    }
  g_free(cs);
}

/* AdamW as the chains ran it, where they give two sizes or more, replaces the line through
 * the cold, isolated sizes of measure_machine. */
static void fit_chain_optimizer(struct prof_run *r) {
  GArray *x = r->opt_params, *y = r->opt_seconds;
  bool two = false;
  for (guint i = 1; i < x->len; i++)
    two |= g_array_index(x, double, i) != g_array_index(x, double, 0);
  if (!two)
    return;
  prof_fit_line((double *)(void *)x->data, (double *)(void *)y->data, (int)x->len,
                &r->adamw_overhead, &r->adamw_per_param);
  if (r->adamw_overhead < 0)
    r->adamw_overhead = 0;
  r->optimizer_from_chain = true;
  prof_progress(r, "AdamW in the executor's order: %.2f us + %.3f ns per parameter (%u segments)",
           r->adamw_overhead * 1e6, r->adamw_per_param * 1e9, x->len);
}

/* One op of a model too big to chain, timed alone unless its (kind, shape) was seen. */
static void measure_unchained(struct prof_run *r, const struct model *m,
                              const struct model_op *op) {
  char *key = op_shape_key(op);
  if (g_hash_table_contains(r->seen, key)) {
    g_free(key);
    return;
  }
  g_hash_table_add(r->seen, key);
  if (!prof_op_has_kernel(op->kind)) {
    prof_progress(r, "  %-13s no host kernel: left to the roofline", model_op_kind_name(op->kind));
    r->n_skipped++;
    return;
  }
  /* a model too big for this machine: its ops fall back to the roofline, not to swap */
  double bytes = prof_op_bench_bytes(m, op), limit = 0.25 * physical_memory_bytes();
  if (bytes > limit) {
    prof_progress(r,
                  "  %-13s needs %.1f GiB of buffers, over a quarter of this machine's memory: "
                  "left to the roofline",
                  model_op_kind_name(op->kind), bytes / 1073741824.0);
    r->n_skipped++;
    return;
  }
  measure_op(r, m, op);
}

/* Every distinct (kind, shape) of a model too big to chain, and of its expert-parallel
 * variants, once, each kernel timed alone. */
static void measure_model(struct prof_run *r, const struct model *m) {
  prof_progress(r, "kernels of %s (%u ops)", m->name, m->n_ops);
  for (uint32_t i = 0; i < m->n_ops; i++)
    measure_unchained(r, m, &m->ops[i]);
  GArray *v = prof_ep_variants(m);
  for (guint i = 0; i < v->len; i++)
    measure_unchained(r, m, &g_array_index(v, struct model_op, i));
  g_array_free(v, TRUE);
}

/* ---- the machine: GEMM rate, memory bandwidth, AdamW ------------------------------------- */

struct gemm_ctx {
  int n;
  float *a, *b, *c;
};
static void gemm_run(void *ctx) {
  struct gemm_ctx *g = ctx;
  kernels_gemm(false, false, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f, g->c, g->n);
}

struct triad_ctx {
  size_t n;
  float *a, *b, *c;
};
static void triad_run(void *ctx) {
  struct triad_ctx *t = ctx;
  for (size_t i = 0; i < t->n; i++)
    t->a[i] = t->b[i] + 0.5f * t->c[i];
}

struct adamw_ctx {
  size_t n;
  float *p, *g, *m, *v;
  int step;
};
static void adamw_run(void *ctx) {
  struct adamw_ctx *w = ctx;
  kernels_adamw_step(w->p, w->g, w->m, w->v, w->n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, ++w->step);
}

/* AdamW at 4 sizes up to the largest model's parameter count (what one device of a host run
 * updates at most), by 4x: the fit holds where the executor uses it. Each timed call starts
 * with cold caches: the executor's optimizer runs after a whole step of other work. */
static void measure_machine(struct prof_run *r, uint64_t max_params) {
  struct gemm_ctx g = {.n = r->a->quick ? 512 : 1024};
  size_t nn = (size_t)g.n * g.n;
  g.a = prof_random_floats(nn, 7, 1), g.b = prof_random_floats(nn, 8, 1), g.c = g_new0(float, nn);
  r->gemm_flops = 2.0 * g.n * g.n * g.n / median_seconds(r->a, gemm_run, &g);
  g_free(g.a), g_free(g.b), g_free(g.c);
  prof_progress(r, "GEMM %d^3: %.1f GFLOP/s", g.n, r->gemm_flops / 1e9);

  struct triad_ctx t = {.n = (size_t)(r->a->quick ? 4 : 16) << 20};
  t.a = g_new0(float, t.n);
  t.b = prof_random_floats(t.n, 9, 1);
  t.c = prof_random_floats(t.n, 10, 1);
  r->triad_bytes = 3.0 * (double)t.n * sizeof(float) / median_seconds(r->a, triad_run, &t);
  g_free(t.a), g_free(t.b), g_free(t.c);
  prof_progress(r, "triad: %.1f GB/s", r->triad_bytes / 1e9);

  enum { N_ADAMW = 4 };
  double x[N_ADAMW], y[N_ADAMW];
  for (int i = 0; i < N_ADAMW; i++) {
    struct adamw_ctx w = {.n = (size_t)(max_params >> (2 * (N_ADAMW - 1 - i)))};
    if (w.n < 1024)
      w.n = 1024;
    w.p = prof_random_floats(w.n, 11, 1), w.g = prof_random_floats(w.n, 12, 1);
    w.m = g_new0(float, w.n), w.v = g_new0(float, w.n);
    x[i] = (double)w.n;
    y[i] = median_seconds_after(r->a, adamw_run, &w, evict_caches);
    g_free(w.p), g_free(w.g), g_free(w.m), g_free(w.v);
    prof_progress(r, "AdamW %zu parameters: %.1f us", w.n, y[i] * 1e6);
  }
  prof_fit_line(x, y, N_ADAMW, &r->adamw_overhead, &r->adamw_per_param);
  if (r->adamw_overhead < 0)
    r->adamw_overhead = 0;
}

/* ---- the network (under mpirun) ----------------------------------------------------------
 * Every operation over every group size from 2 to the ranks launched (p2p: 2), sizes 8 B to
 * 8 MiB by 4x, each timed by its slowest rank as the median over repeats; then one fit per
 * operation over all its points: time = steps(p) a + share(p) n / B, the simulator's ring
 * terms (profile_comm_cost), least squares with relative residuals. These are the "intra_node"
 * fits of the profile: mpirun on one machine puts every rank on it. */

#ifdef HAVE_MPI
const char *const prof_net_names[NET_N] = {"p2p", "all_reduce", "reduce_scatter",
                                          "all_gather", "all_to_all"};

struct net_ctx {
  enum net_kind kind;
  size_t bytes; /* the simulator's convention per kind (sim/profile.h, profile_comm_cost) */
  MPI_Comm comm;
  int rank, size; /* in comm */
  char *send, *recv;
};

/* One operation as the executor posts it (nonblocking, then waited for). */
static void net_once(struct net_ctx *c) {
  MPI_Request req[2];
  int n = 0, p = c->size;
  int per = (int)(c->bytes / (size_t)p); /* bytes per rank of a collective */
  switch (c->kind) {
  case NET_P2P:
    /* half a ping-pong between ranks 0 and 1: one transfer of `bytes` */
    if (c->rank == 0) {
      MPI_Isend(c->send, (int)c->bytes, MPI_BYTE, 1, 7, c->comm, &req[n++]);
      MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
      MPI_Recv(c->recv, (int)c->bytes, MPI_BYTE, 1, 8, c->comm, MPI_STATUS_IGNORE);
    } else if (c->rank == 1) {
      MPI_Irecv(c->recv, (int)c->bytes, MPI_BYTE, 0, 7, c->comm, &req[n++]);
      MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
      MPI_Send(c->send, (int)c->bytes, MPI_BYTE, 0, 8, c->comm);
    }
    return;
  case NET_ALL_REDUCE:
    MPI_Iallreduce(MPI_IN_PLACE, c->send, (int)(c->bytes / 4), MPI_FLOAT, MPI_SUM, c->comm,
                   &req[n++]);
    break;
  case NET_REDUCE_SCATTER:
    MPI_Ireduce_scatter_block(c->send, c->recv, per / 4, MPI_FLOAT, MPI_SUM, c->comm, &req[n++]);
    break;
  case NET_ALL_GATHER:
    MPI_Iallgather(c->send, per, MPI_BYTE, c->recv, per, MPI_BYTE, c->comm, &req[n++]);
    break;
  case NET_ALL_TO_ALL:
    MPI_Ialltoall(c->send, per, MPI_BYTE, c->recv, per, MPI_BYTE, c->comm, &req[n++]);
    break;
  default: PIPER_UNREACHABLE();
  }
  MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
}

/* Median over the repeats of the slowest rank's time (p2p: half the round trip). */
static double net_median(const struct prof_args *a, struct net_ctx *c, uint32_t reps) {
  for (uint32_t i = 0; i < a->warmup; i++)
    net_once(c);
  double *t = g_new(double, reps);
  for (uint32_t i = 0; i < reps; i++) {
    MPI_Barrier(c->comm);
    double s = piper_clock_seconds();
    net_once(c);
    double mine = piper_clock_seconds() - s, worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, c->comm);
    t[i] = c->kind == NET_P2P ? worst / 2 : worst;
  }
  qsort(t, reps, sizeof *t, piper_cmp_double);
  double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  g_free(t);
  return med;
}

/* The simulator's alpha-beta terms of one operation of n bytes over p ranks are
 * latency_steps * a + transfer_share * n / B (profile_comm_cost, ring). */
static void net_model_terms(enum net_kind k, int p, double *latency_steps, double *share) {
  double q = p;
  switch (k) {
  case NET_P2P: *latency_steps = 1, *share = 1; break;
  case NET_ALL_REDUCE: *latency_steps = 2 * (q - 1), *share = 2 * (q - 1) / q; break;
  default: *latency_steps = q - 1, *share = (q - 1) / q; break;
  }
}

/* The ranks outside a group wait here without a core (MPI's barrier spins, and a spinning
 * rank would take a core from the group being timed). */
static void sleeping_barrier(void) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag)
      g_usleep(1000);
  }
}


/* a and B of t = A a + S n / B over the points, weights 1 / t^2; a >= 0 (else refitted at 0). */
static void net_fit(enum net_kind k, const struct net_points *pts, double *a, double *B) {
  double saa = 0, sab = 0, sbb = 0, sat = 0, sbt = 0;
  for (guint i = 0; i < pts->t->len; i++) {
    double A, S, t = g_array_index(pts->t, double, i);
    net_model_terms(k, (int)g_array_index(pts->p, double, i), &A, &S);
    double X = S * g_array_index(pts->n, double, i), w = t > 0 ? 1 / (t * t) : 0;
    saa += w * A * A, sab += w * A * X, sbb += w * X * X, sat += w * A * t, sbt += w * X * t;
  }
  double det = saa * sbb - sab * sab, inv_b;
  *a = det != 0 ? (sat * sbb - sbt * sab) / det : 0;
  inv_b = det != 0 ? (saa * sbt - sab * sat) / det : 0;
  if (*a < 0 || det == 0) {
    *a = 0;
    inv_b = sbb > 0 ? sbt / sbb : 0;
  }
  *B = inv_b > 0 ? 1 / inv_b : 1e15;
}

/* Every operation over the ranks [0, g) of the world: points kept on rank 0. */
static void measure_group(struct prof_run *r, int g, struct net_ctx *c, int max_log4,
                          struct net_points *pts) {
  const struct prof_args *a = r->a;
  for (int k = 0; k < NET_N; k++) {
    if (k == NET_P2P && g != 2)
      continue;
    c->kind = (enum net_kind)k;
    GString *line = g_string_new("");
    for (int s = 0; s < max_log4; s++) {
      size_t unit = (size_t)4 * g; /* whole floats per rank */
      size_t bytes = (((size_t)8 << (2 * s)) + unit - 1) / unit * unit;
      c->bytes = bytes;
      uint32_t reps = bytes > ((size_t)1 << 20) ? (a->quick ? 3 : 7) : (a->quick ? 7 : 31);
      if (reps < a->repeats && bytes <= ((size_t)1 << 20) && !a->quick)
        reps = a->repeats;
      double t = net_median(a, c, reps);
      double pv = g, nv = (double)bytes;
      g_array_append_val(pts[k].p, pv);
      g_array_append_val(pts[k].n, nv);
      g_array_append_val(pts[k].t, t);
      if (s == 0 || s == max_log4 - 1)
        g_string_append_printf(line, "%s%zu B %.1f us", s ? ", " : "", bytes, t * 1e6);
    }
    prof_progress(r, "  %-14s %d ranks: %s", prof_net_names[k], g, line->str);
    g_string_free(line, TRUE);
  }
}

/* The sources' view of the largest group measured: its points and the plain line through them
 * (latency_us + bytes / bandwidth_gbs), what one operation costs at that size. */
static void net_source_largest(cJSON *src, enum net_kind k, const struct net_points *pts) {
  double pmax = 0, x[32], y[32];
  int n = 0;
  for (guint i = 0; i < pts->p->len; i++)
    pmax = g_array_index(pts->p, double, i) > pmax ? g_array_index(pts->p, double, i) : pmax;
  cJSON *arr = cJSON_CreateArray();
  for (guint i = 0; i < pts->p->len && n < 32; i++) {
    if (g_array_index(pts->p, double, i) != pmax)
      continue;
    x[n] = g_array_index(pts->n, double, i), y[n] = g_array_index(pts->t, double, i);
    cJSON *pt = cJSON_CreateArray();
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(x[n]));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(prof_round_sig(y[n] * 1e6, 4)));
    cJSON_AddItemToArray(arr, pt);
    n++;
  }
  double alpha = 0, beta = 0;
  prof_fit_line(x, y, n, &alpha, &beta);
  cJSON_AddNumberToObject(src, "ranks", k == NET_P2P ? 2 : pmax);
  cJSON_AddNumberToObject(src, "latency_us", prof_round_sig((alpha > 0 ? alpha : 0) * 1e6, 4));
  cJSON_AddNumberToObject(src, "bandwidth_gbs", prof_round_sig(beta > 0 ? 1 / beta / 1e9 : 1e6, 4));
  cJSON_AddItemToObject(src, "points_bytes_us", arr);
}

/* The fits (and their points, for the sources) into r. */
void prof_net_record(struct prof_run *r, const struct net_points *pts) {
  r->fits = cJSON_CreateObject();
  r->fit_json = cJSON_CreateObject();
  for (int k = 0; k < NET_N; k++) {
    double lat, bw;
    net_fit((enum net_kind)k, &pts[k], &lat, &bw);
    prof_progress(r, "%-14s fit over %u points: %.2f us per step + bytes / %.3f GB/s",
                  prof_net_names[k], pts[k].t->len, lat * 1e6, bw / 1e9);
    if (k == NET_P2P)
      r->p2p_latency = lat, r->p2p_bandwidth = bw;
    if (k == NET_ALL_REDUCE)
      r->ar_bandwidth = bw;
    cJSON *f = cJSON_AddObjectToObject(r->fit_json, prof_net_names[k]);
    cJSON_AddNumberToObject(f, "latency_us", prof_round_sig(lat * 1e6, 4));
    cJSON_AddNumberToObject(f, "bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
    cJSON *src = cJSON_AddObjectToObject(r->fits, prof_net_names[k]);
    net_source_largest(src, (enum net_kind)k, &pts[k]);
    cJSON_AddNumberToObject(src, "link_latency_us", prof_round_sig(lat * 1e6, 4));
    cJSON_AddNumberToObject(src, "link_bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
    cJSON *arr = cJSON_AddArrayToObject(src, "points_ranks_bytes_us");
    for (guint i = 0; i < pts[k].t->len; i++) {
      cJSON *pt = cJSON_CreateArray();
      cJSON_AddItemToArray(pt, cJSON_CreateNumber(g_array_index(pts[k].p, double, i)));
      cJSON_AddItemToArray(pt, cJSON_CreateNumber(g_array_index(pts[k].n, double, i)));
      cJSON_AddItemToArray(
          pt, cJSON_CreateNumber(prof_round_sig(g_array_index(pts[k].t, double, i) * 1e6, 4)));
      cJSON_AddItemToArray(arr, pt);
    }
  }
}

static void measure_network(struct prof_run *r) {
  int max_log4 = r->a->quick ? 8 : 11; /* 8 B .. 128 KiB (quick) or 8 MiB, by 4x */
  /* sizes round up to whole floats per rank: room for the largest one rounded */
  size_t max_bytes = ((size_t)8 << (2 * (max_log4 - 1))) + (size_t)4 * r->size;
  struct net_ctx c = {0};
  c.send = g_malloc0(max_bytes), c.recv = g_malloc0(max_bytes);
  struct net_points pts[NET_N];
  for (int k = 0; k < NET_N; k++)
    pts[k] = (struct net_points){g_array_new(FALSE, FALSE, sizeof(double)),
                                 g_array_new(FALSE, FALSE, sizeof(double)),
                                 g_array_new(FALSE, FALSE, sizeof(double))};
  for (int g = 2; g <= r->size; g++) {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, r->rank < g ? 0 : MPI_UNDEFINED, r->rank, &sub);
    if (sub != MPI_COMM_NULL) {
      c.comm = sub, c.rank = r->rank, c.size = g;
      measure_group(r, g, &c, max_log4, pts);
      MPI_Comm_free(&sub);
    }
    sleeping_barrier();
  }
  if (r->rank == 0)
    prof_net_record(r, pts);
  for (int k = 0; k < NET_N; k++)
    g_array_free(pts[k].p, TRUE), g_array_free(pts[k].n, TRUE), g_array_free(pts[k].t, TRUE);
  g_free(c.send), g_free(c.recv);
  r->network_measured = true;
}
#endif


/* ---- the host: cores and the executor's own costs ------------------------------------------
 * What the simulator needs to model ranks sharing a node's cores (sim/profile.h, "host"): the
 * node's cores; what the executor's loop spends per instruction (a task and an event record
 * through the host backend's loop, no kernel); what one test of posted communication costs;
 * and what a rank waiting for communication costs a rank computing on the same core: two
 * ranks are pinned to one core, one waits in the host backend's loop for a receive while the
 * other counts GEMMs, against the count with the waiter asleep. Under processor sharing the
 * computing rank then runs at 1 / (1 + share). */

static bool noop_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s, (void)arg, (void)err;
  return true;
}

/* Median seconds per instruction (task + record) of the backend's loop, over 5 batches. */
double prof_instruction_cost(struct exec_backend *b, uint32_t n, GError **err) {
  struct exec_stream *st = exec_stream_create(b, "piper-prof", 0, err);
  if (!st)
    return -1;
  struct exec_event *e = exec_event_create(b);
  double t[5];
  for (int rep = 0; rep < 6; rep++) {
    double t0 = piper_clock_seconds();
    for (uint32_t i = 0; i < n; i++) {
      exec_stream_submit(b, st, noop_task, NULL, i);
      exec_event_record(b, e, st);
    }
    exec_event_synchronize(b, e, 60);
    if (rep > 0) /* the first batch warms the loop up */
      t[rep - 1] = (piper_clock_seconds() - t0) / n;
  }
  exec_event_destroy(b, e);
  exec_stream_destroy(b, st);
  qsort(t, 5, sizeof *t, piper_cmp_double);
  return t[2];
}

#ifdef HAVE_MPI
/* Seconds per MPI_Test of a receive from another rank that nothing matches (as the loop
 * tests posted work: the library polls its shared-memory queues), the median of 9 batches;
 * the receive is cancelled after. The other ranks sleep meanwhile. */
static double host_test_cost(uint32_t n) {
  char in = 0;
  MPI_Request req;
  MPI_Irecv(&in, 1, MPI_CHAR, 1, 99, MPI_COMM_WORLD, &req);
  int flag = 0;
  double t[9];
  for (int b = 0; b < 9; b++) {
    double t0 = piper_clock_seconds();
    for (uint32_t i = 0; i < n / 9 + 1; i++)
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    t[b] = (piper_clock_seconds() - t0) / (n / 9 + 1);
  }
  MPI_Cancel(&req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  qsort(t, 9, sizeof *t, piper_cmp_double);
  return t[4];
}

/* GEMMs of 64^3 per second over `window` seconds. */
static double compute_rate(double window) {
  enum { N = 64 };
  static float a[N * N], b[N * N], c[N * N];
  double t0 = piper_clock_seconds(), t = t0;
  uint64_t calls = 0;
  while (t - t0 < window) {
    kernels_gemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
    calls++;
    if ((calls & 15) == 0)
      t = piper_clock_seconds();
  }
  return (double)calls / (piper_clock_seconds() - t0);
}

struct wait_arg {
  struct exec_backend *b;
  struct exec_comm *c;
  int32_t v;
  double seen; /* when the task saw the message */
};
static bool recv_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  struct wait_arg *w = arg;
  bool ok = exec_comm_recv(w->b, w->c, 0, &w->v, sizeof w->v, 5, err);
  w->seen = piper_clock_seconds();
  return ok;
}

/* Rank 1: waits in the backend's loop for one message; returns the wait's CPU share. */
static double waiter_once(struct exec_backend *b, struct exec_comm *c, double *seen, bool *ok,
                          GError **err) {
  struct exec_stream *st = exec_stream_create(b, "piper-prof wait", 0, err);
  if (!st) {
    *ok = false;
    return 0;
  }
  struct exec_event *e = exec_event_create(b);
  struct wait_arg w = {.b = b, .c = c};
  struct timespec c0, c1;
  double t0 = piper_clock_seconds();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
  exec_stream_submit(b, st, recv_task, &w, 0);
  exec_event_record(b, e, st);
  *ok = exec_event_synchronize(b, e, 60) && *ok;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
  double cpu_s = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
  exec_event_destroy(b, e);
  exec_stream_destroy(b, st);
  *seen = w.seen;
  return cpu_s / (piper_clock_seconds() - t0);
}

/* Rank 0: computes for window seconds while rank 1 waits, sends, and computes on so that the
 * core stays busy while the waiter must wake; returns the compute rate. */
static double computer_once(struct exec_backend *b, struct exec_comm *c, double window,
                            double *sent, bool *ok, GError **err) {
  double rate = compute_rate(window);
  int32_t v = 1;
  *sent = piper_clock_seconds();
  *ok = exec_comm_send(b, c, 1, &v, sizeof v, 5, err) && *ok;
  compute_rate(0.01);
  return rate;
}

enum { PAIR_ROUNDS = 7 };

/* Rank 1 sleeps in MPI (1 ms polls) until rank 0 says go. */
static void pair_go(int rank) {
  char go = 1;
  if (rank == 0) {
    MPI_Send(&go, 1, MPI_CHAR, 1, 96, MPI_COMM_WORLD);
    return;
  }
  MPI_Request req;
  MPI_Irecv(&go, 1, MPI_CHAR, 0, 96, MPI_COMM_WORLD, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag)
      g_usleep(1000);
  }
}

static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, piper_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Both pinned to one core, in rounds (a change of the machine's load falls on both halves of a
 * round): rank 0 computes alone while rank 1 sleeps, then computes while rank 1 waits for it in
 * the backend's loop, sends, and computes on so that the core is busy when the waiter must
 * wake. Medians over the rounds. */
static bool host_wait_pair(struct prof_run *r, struct exec_backend *b, struct exec_comm *c,
                           double window, GError **err) {
  bool ok = true;
  double share[PAIR_ROUNDS], self[PAIR_ROUNDS], wake[PAIR_ROUNDS];
  for (int i = 0; i < PAIR_ROUNDS; i++) {
    double sent = 0, seen = 0;
    if (r->rank == 0) {
      double alone = compute_rate(window);
      pair_go(0);
      double shared = computer_once(b, c, window, &sent, &ok, err);
      MPI_Recv(&seen, 1, MPI_DOUBLE, 1, 97, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Recv(&self[i], 1, MPI_DOUBLE, 1, 98, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      share[i] = shared > 0 ? alone / shared - 1 : 0;
      wake[i] = seen - sent > 0 ? seen - sent : 0;
    } else if (r->rank == 1) {
      pair_go(1);
      double mine = waiter_once(b, c, &seen, &ok, err);
      MPI_Send(&seen, 1, MPI_DOUBLE, 0, 97, MPI_COMM_WORLD);
      MPI_Send(&mine, 1, MPI_DOUBLE, 0, 98, MPI_COMM_WORLD);
    }
  }
  if (r->rank == 0) {
    double slow = median_of(share, PAIR_ROUNDS);
    r->wait_pinned_slowdown = slow < 0 ? 0 : slow > 1 ? 1 : slow;
    r->wait_self_share = median_of(self, PAIR_ROUNDS);
    r->wake_latency = median_of(wake, PAIR_ROUNDS);
  }
  return ok;
}

/* Rank 1 waits in the backend's loop for rank 0, which computes meanwhile on the same core:
 * the share of the core the waiter takes, and how long after the message it notices. */
static bool host_wait_share(struct prof_run *r, struct exec_backend *b, GError **err) {
  uint32_t pair[2] = {0, 1};
  struct exec_comm *c = exec_comm_create(b, "piper-prof wait", pair, 2, true, err);
  if (!c)
    return false;
  cpu_set_t old, one;
  sched_getaffinity(0, sizeof old, &old);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old))
    cpu++;
  MPI_Bcast(&cpu, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (r->rank <= 1) {
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
  }
  sleeping_barrier();
  bool ok = r->rank > 1 || host_wait_pair(r, b, c, r->a->quick ? 0.02 : 0.05, err);
  if (r->rank <= 1)
    sched_setaffinity(0, sizeof old, &old);
  sleeping_barrier();
  exec_comm_destroy(b, c);
  return ok;
}

/* Rank 0 of host_wait_demand: computes for window seconds, sends the waiter (a world rank: the
 * communicator is point-to-point) its message, and computes on while the waiter wakes. */
static void demand_sender(struct exec_backend *b, struct exec_comm *c, uint32_t waiter,
                         double window, bool *ok, GError **err) {
  compute_rate(window);
  int32_t v = 1;
  *ok = exec_comm_send(b, c, waiter, &v, sizeof v, 5, err) && *ok;
  compute_rate(0.01);
}

/* What a rank waiting for its peers in the backend's loop asks of the node's cores: rank 0
 * computes (GEMMs) while the last rank waits for a message rank 0 sends at the end of the
 * window; the other ranks sleep, so that a core is free for the waiter (on 2 cores) and it
 * burns what its loop asks, not what a saturated scheduler leaves it (beside 3 computing
 * ranks on 2 cores it gets 0.03 of a core and wakes ~2 ms late; in 4-rank 1F1B runs waiting
 * ranks burn 0.27-0.35 of a core). The waiter's CPU time over its wait, median over rounds;
 * rank 0 keeps the figure. */
static bool host_wait_demand(struct prof_run *r, struct exec_backend *b, GError **err) {
  uint32_t waiter = (uint32_t)r->size - 1, pair[2] = {0, waiter};
  struct exec_comm *c = exec_comm_create(b, "piper-prof demand", pair, 2, true, err);
  if (!c)
    return false;
  double window = r->a->quick ? 0.02 : 0.05, share[PAIR_ROUNDS];
  bool ok = true;
  for (int i = 0; i < PAIR_ROUNDS; i++) {
    double seen = 0;
    sleeping_barrier();
    if ((uint32_t)r->rank == waiter)
      share[i] = waiter_once(b, c, &seen, &ok, err);
    else if (r->rank == 0)
      demand_sender(b, c, waiter, window, &ok, err);
  }
  if ((uint32_t)r->rank == waiter)
    MPI_Send(share, PAIR_ROUNDS, MPI_DOUBLE, 0, 99, MPI_COMM_WORLD);
  else if (r->rank == 0)
    MPI_Recv(share, PAIR_ROUNDS, MPI_DOUBLE, (int)waiter, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  if (r->rank == 0) {
    double m = median_of(share, PAIR_ROUNDS);
    r->wait_share = m < 0 ? 0 : m > 1 ? 1 : m;
  }
  sleeping_barrier();
  exec_comm_destroy(b, c);
  return ok;
}
/* What the host backend's loop adds to a communication its rank waits on past the loop's spin
 * window (EXEC_HOST_IDLE_SPIN_US; the rank then sleeps between polls, and a rendezvous message
 * needs both sides' polls): rank 0 computes for a window while the last rank waits for its
 * message, then sends; the other ranks sleep, so that each of the two has a core. The message
 * is LATE_BYTES, above Open MPI's shared-memory eager limit (4 KiB) and the size of tiny-moe's
 * expert all-to-alls. Each round times it twice, in turns: through the backend's loop (the send
 * and the receive tasks on streams, as the executor runs them) and with both sides polling
 * without sleep (the backend's calls outside a task), which is what the collective fits
 * measure; the lateness is the difference of the medians (how much later the waiter sees the
 * message, from when the sender posted it). */
enum { LATE_BYTES = 32768 };

struct late_arg {
  struct exec_backend *b;
  struct exec_comm *c;
  uint32_t peer;
  bool send;
  char *buf;
  double t; /* the send posted, or the receive seen */
};

/* The send or the receive, and its time. Inside a task the backend suspends it and its loop
 * polls; outside one the backend polls without sleeping. */
static bool late_exchange(struct late_arg *w, GError **err) {
  if (w->send)
    w->t = piper_clock_seconds();
  bool ok = w->send ? exec_comm_send(w->b, w->c, w->peer, w->buf, LATE_BYTES, 6, err)
                    : exec_comm_recv(w->b, w->c, w->peer, w->buf, LATE_BYTES, 6, err);
  if (!w->send)
    w->t = piper_clock_seconds();
  return ok;
}

static bool late_task(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  return late_exchange(arg, err);
}

/* One side of one exchange: through the loop (a task on a stream) or polling (no task). */
static bool late_side(struct late_arg *w, bool loop, GError **err) {
  if (!loop)
    return late_exchange(w, err);
  struct exec_stream *st = exec_stream_create(w->b, "piper-prof late", 0, err);
  if (!st)
    return false;
  struct exec_event *e = exec_event_create(w->b);
  exec_stream_submit(w->b, st, late_task, w, 0);
  exec_event_record(w->b, e, st);
  bool ok = exec_event_synchronize(w->b, e, 60);
  exec_event_destroy(w->b, e);
  exec_stream_destroy(w->b, st);
  return ok;
}

/* Seconds from the send's post to the receive seen, one exchange (rank 0 keeps it). */
static double late_once(struct prof_run *r, struct late_arg *w, bool loop, double window,
                        bool *ok, GError **err) {
  double seen = 0;
  sleeping_barrier();
  if (r->rank == 0) {
    compute_rate(window);
    *ok = late_side(w, loop, err) && *ok;
    MPI_Recv(&seen, 1, MPI_DOUBLE, (int)w->peer, 95, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return seen - w->t;
  }
  if ((uint32_t)r->rank == (uint32_t)r->size - 1) {
    *ok = late_side(w, loop, err) && *ok;
    MPI_Send(&w->t, 1, MPI_DOUBLE, 0, 95, MPI_COMM_WORLD);
  }
  return 0;
}

static bool host_loop_late(struct prof_run *r, struct exec_backend *b, GError **err) {
  uint32_t waiter = (uint32_t)r->size - 1, pair[2] = {0, waiter};
  struct exec_comm *c = exec_comm_create(b, "piper-prof late", pair, 2, true, err);
  if (!c)
    return false;
  struct late_arg w = {.b = b, .c = c, .peer = r->rank == 0 ? waiter : 0, .send = r->rank == 0,
                       .buf = g_malloc0(LATE_BYTES)};
  /* the waiter waits past the spin window by construction */
  double window = EXEC_HOST_IDLE_SPIN_US * 1e-6 + (r->a->quick ? 0.001 : 0.002);
  double loop[PAIR_ROUNDS], poll[PAIR_ROUNDS];
  bool ok = true;
  for (int i = 0; i < PAIR_ROUNDS; i++) {
    loop[i] = late_once(r, &w, true, window, &ok, err);
    poll[i] = late_once(r, &w, false, window, &ok, err);
  }
  if (r->rank == 0) {
    double late = median_of(loop, PAIR_ROUNDS) - median_of(poll, PAIR_ROUNDS);
    r->loop_late = late > 0 ? late : 0;
  }
  sleeping_barrier();
  g_free(w.buf);
  exec_comm_destroy(b, c);
  return ok;
}
#endif

/* MPI's eager limit, as the host backend meets it: rank 0 sends n bytes to the last rank, which
 * posts its receive 2 ms later; a send that completes before then (rank 0 polling) did not
 * need its receiver. The largest such n of 256 B, 512 B, ... 1 MiB (each size 3 times, the
 * majority kept, after 32 small exchanges that set up the transport's per-peer buffers):
 * above it a sender's request completes only once the receiver has polled (the simulator's
 * host loop). */
static int eager_once(struct prof_run *r, char *buf, size_t n) {
  int waiter = r->size - 1, done = 0;
  sleeping_barrier();
  if (r->rank == 0) {
    MPI_Request req;
    double t0 = piper_clock_seconds();
    MPI_Isend(buf, (int)n, MPI_BYTE, waiter, 97, MPI_COMM_WORLD, &req);
    while (!done && piper_clock_seconds() - t0 < 0.001)
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else if (r->rank == waiter) {
    g_usleep(2000);
    MPI_Recv(buf, (int)n, MPI_BYTE, 0, 97, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return done;
}

static void host_eager_limit(struct prof_run *r) {
  int waiter = r->size - 1;
  char *buf = g_malloc0((size_t)1 << 20);
  for (int k = 0; k < 32; k++) {
    if (r->rank == 0)
      MPI_Send(buf, 64, MPI_BYTE, waiter, 96, MPI_COMM_WORLD);
    else if (r->rank == waiter)
      MPI_Recv(buf, 64, MPI_BYTE, 0, 96, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  double eager = 0;
  for (size_t n = 256; n <= ((size_t)1 << 20); n *= 2) {
    int done = 0;
    for (int k = 0; k < 3; k++)
      done += eager_once(r, buf, n);
    if (done < 2)
      break;
    eager = (double)n;
  }
  r->eager_bytes = eager;
  g_free(buf);
}

/* Every rank takes part (the backend starts with a barrier); rank 0 keeps the figures. */
static bool measure_host(struct prof_run *r, GError **err) {
  r->cores = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
  struct exec_backend *b = exec_backend_init(&exec_backend_host, NULL, err);
  if (!b)
    return false;
  bool ok = true;
  if (r->rank == 0) {
    r->instruction_overhead = prof_instruction_cost(b, r->a->quick ? 2000 : 20000, err);
    ok = r->instruction_overhead >= 0;
  }
#ifdef HAVE_MPI
  if (r->size > 1) {
    sleeping_barrier();
    if (r->rank == 0)
      r->comm_test = host_test_cost(r->a->quick ? 2000 : 20000);
    ok = host_wait_share(r, b, err) && ok;
    ok = host_wait_demand(r, b, err) && ok;
    ok = host_loop_late(r, b, err) && ok;
    host_eager_limit(r);
    r->comm_measured = true;
  }
#endif
  exec_backend_free(b);
  prof_progress(r,
           "host: %u cores; the executor's loop %.2f us per instruction; a test of posted "
           "communication %.2f us; a waiting rank burns %.2f of a core beside a computing one "
           "(pinned beside one: %.2f of its core, slowing it by %.0f%%) and sees a message "
           "%.1f us late when its core is busy; asleep in the loop, %.1f us late with a core free; "
           "sends up to %.0f bytes complete without their receiver",
           r->cores, r->instruction_overhead * 1e6, r->comm_test * 1e6, r->wait_share,
           r->wait_self_share, 100 * r->wait_pinned_slowdown, r->wake_latency * 1e6,
           r->loop_late * 1e6, r->eager_bytes);
  return ok;
}

/* ---- the profile ---------------------------------------------------------------------------- */

/* The CPU's model name from /proc/cpuinfo ("unknown" elsewhere). */
static char *cpu_model(void) {
  char *text = NULL;
  if (!g_file_get_contents("/proc/cpuinfo", &text, NULL, NULL))
    return g_strdup("unknown");
  char *name = NULL;
  for (char *line = strtok(text, "\n"); line && !name; line = strtok(NULL, "\n"))
    if (g_str_has_prefix(line, "model name")) {
      char *colon = strchr(line, ':');
      name = g_strdup(g_strstrip(colon ? colon + 1 : line));
    }
  g_free(text);
  return name ? name : g_strdup("unknown");
}

static double load_average(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1)
      l = -1;
    fclose(f);
  }
  return l;
}

struct machine_facts {
  char *cpu, date[32], *command;
  long cores;
  double memory_gib, load;
};

static void machine_facts_init(struct machine_facts *mf, const struct prof_run *r, int argc,
                               char **argv) {
  mf->cpu = cpu_model();
  mf->cores = sysconf(_SC_NPROCESSORS_ONLN);
  mf->memory_gib = physical_memory_bytes() / 1073741824.0;
  mf->load = load_average();
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(mf->date, sizeof mf->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  GString *cmd = g_string_new("");
  const char *blas = getenv("OPENBLAS_NUM_THREADS");
  if (blas)
    g_string_append_printf(cmd, "OPENBLAS_NUM_THREADS=%s ", blas);
  if (r->size > 1)
    g_string_append_printf(cmd, "mpirun -np %d ", r->size);
  for (int i = 0; i < argc; i++)
    g_string_append_printf(cmd, "%s%s", i ? " " : "", argv[i]);
  mf->command = g_string_free(cmd, FALSE);
}

static void machine_facts_free(struct machine_facts *mf) {
  g_free(mf->cpu);
  g_free(mf->command);
}

static cJSON *sources_json(const struct prof_run *r, const struct machine_facts *mf) {
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "command", mf->command);
  cJSON_AddStringToObject(s, "date", mf->date);
  cJSON_AddStringToObject(s, "backend", r->a->backend);
  cJSON *m = cJSON_AddObjectToObject(s, "machine");
  cJSON_AddStringToObject(m, "cpu", mf->cpu);
  cJSON_AddNumberToObject(m, "cores", (double)mf->cores);
  cJSON_AddNumberToObject(m, "memory_gib", prof_round_sig(mf->memory_gib, 3));
  cJSON_AddNumberToObject(m, "load_average_1min", mf->load);
  cJSON_AddNumberToObject(m, "ranks", r->size);
  const char *blas = getenv("OPENBLAS_NUM_THREADS");
  cJSON_AddStringToObject(m, "openblas_threads", blas ? blas : "unset");
  if (r->gpu_name[0]) {
    cJSON_AddStringToObject(m, "gpu", r->gpu_name);
    cJSON_AddNumberToObject(m, "gpu_memory_gib", prof_round_sig(r->gpu_memory_gib, 4));
    cJSON_AddNumberToObject(m, "gpu_sms", r->gpu_sms);
    cJSON_AddStringToObject(
        s, "measured",
        "every distinct (op kind, shape) of the models: the cuda backend's kernel table (CUDA "
        "kernels, cuBLASLt GEMMs in the precision the executor uses for the model: bf16 "
        "operands with fp32 accumulation for bf16 models, fp32 for fp32 models) for F, BI, BW "
        "and the fused B, each call one task on one CUDA stream timed by the CUDA events the "
        "backend records around it (the trace's clock); the median over repeats after warm-up. "
        "0 where the executor runs nothing (embedding BI, residual-add BW)");
    cJSON_AddStringToObject(
        s, "device",
        "peak_tflops: median rate of the largest SwiGLU MLP forward (three GEMMs) through the "
        "backend, bf16 and fp32; memory_bandwidth_gbs: a device-to-device copy, 2 bytes moved "
        "per byte; both achieved rates (efficiencies 1). kernel_overhead_us and "
        "optimizer_bytes_per_param: least-squares line through fused AdamW's median times at 4 "
        "sizes: intercept; slope times the copy bandwidth. host: instruction_overhead_us = a "
        "no-op task and an event record through the cuda backend (the host thread's enqueue "
        "cost)");
  } else {
    cJSON_AddStringToObject(
        s, "measured",
        "every distinct (op kind, shape) of the models: the host kernels of exec/train.c for F, "
        "BI, BW and the fused B, run in the executor's order over the whole model (forward of "
        "every op for 4 micro-batches of buffers, then BI in reverse, BW, B; weights shared), "
        "each call timed where it stands; the median over repeats after warm-up, micro-batches "
        "and layers; 0 where the executor runs nothing (embedding BI, residual-add BW). A model "
        "too large for that is timed op by op, alone");
    cJSON_AddStringToObject(
        s, "device",
        "peak_tflops: median rate of one kernels_gemm of n^3 fp32 (bf16 the same: the host "
        "computes in fp32); memory_bandwidth_gbs: triad a = b + s*c, 12 bytes per element; both "
        "are achieved rates, so the efficiencies are 1. kernel_overhead_us and "
        "optimizer_bytes_per_param: least-squares line (relative residuals) through AdamW's "
        "median times per segment, run after each backward sweep of the executor-order runs "
        "(else at 4 sizes up to the largest model's parameter count, caches cold): intercept; "
        "slope times the triad bandwidth. host: cores_per_node = online processors; "
        "instruction_overhead_us = a no-op task and an event record through the host backend's "
        "loop; comm_test_us = one MPI_Test of a pending receive; wait_core_share: rank 0 "
        "computing GEMMs, the last rank waiting for a receive from it in the backend's loop, "
        "the others asleep (no pinning): the waiter's CPU time over its wait; wake_latency_us: two ranks pinned "
        "to one core, one computing, the other waiting in the backend's loop: how late the "
        "waiter sees the message; loop_spin_us: how long the backend's idle loop polls before "
        "it sleeps between polls (a constant of its code); loop_late_us: rank 0 computes 2 ms, "
        "then sends the last rank, which waits for it, 32 KiB, the others asleep (a core for "
        "each): the median time from the send's post to the receive seen through the backend's "
        "loop (tasks on streams) less the same exchange polled without sleeping, 7 rounds in "
        "turns; eager_bytes: the largest of 256 B, 512 B, ... 1 MiB whose send from rank 0 "
        "completes (rank 0 polling) before the last rank posts its receive 2 ms later");
  }
  cJSON_AddStringToObject(
      s, "network",
      r->network_measured
          ? "collectives.intra_node: one fit per operation over every group size from 2 to the "
            "ranks launched and sizes 8 B to 8 MiB: time = steps(p) latency + share(p) bytes / "
            "bandwidth with the simulator's ring terms, least squares with relative residuals; "
            "piper-sim uses these. The 'nvlink' keys (for older readers) are the point-to-point "
            "fit, efficiency the all-reduce's bandwidth over it. sources.collectives: per "
            "operation the points (ranks, bytes, us), the line at the largest group and the "
            "fit's link terms. gpus_per_node 64: every rank of a run on one machine is on one "
            "node, sharing host.cores_per_node cores"
          : "not measured (one process; run under mpirun -np 2 or more): the link is the triad "
            "bandwidth with no latency, a stand-in for shared-memory MPI");
  if (r->fits)
    cJSON_AddItemReferenceToObject(s, "collectives", r->fits);
  return s;
}

static cJSON *device_json(const struct prof_run *r, const struct machine_facts *mf) {
  cJSON *d = cJSON_CreateObject();
  cJSON *pk = cJSON_AddObjectToObject(d, "peak_tflops");
  double tf = prof_round_sig(r->gemm_flops / 1e12, 4);
  /* the host computes bf16 in fp32; a GPU has its own bf16 rate */
  cJSON_AddNumberToObject(
      pk, "bf16", r->gpu_name[0] ? prof_round_sig(r->gemm_flops_bf16 / 1e12, 4) : tf);
  cJSON_AddNumberToObject(pk, "fp32", tf);
  cJSON_AddNumberToObject(d, "memory_bandwidth_gbs", prof_round_sig(r->triad_bytes / 1e9, 4));
  cJSON_AddNumberToObject(d, "memory_capacity_gib",
                          prof_round_sig(r->gpu_name[0] ? r->gpu_memory_gib : mf->memory_gib, 3));
  cJSON_AddNumberToObject(d, "compute_efficiency", 1);
  cJSON_AddNumberToObject(d, "memory_efficiency", 1);
  cJSON_AddNumberToObject(d, "kernel_overhead_us", prof_round_sig(r->adamw_overhead * 1e6, 3));
  cJSON_AddNumberToObject(d, "optimizer_bytes_per_param",
                          prof_round_sig(r->adamw_per_param * r->triad_bytes, 3));
  if (r->weight_copy_bytes_per_param > 0)
    cJSON_AddNumberToObject(d, "weight_copy_bytes_per_param",
                            prof_round_sig(r->weight_copy_bytes_per_param, 3));
  return d;
}

static cJSON *network_json(const struct prof_run *r) {
  double lat = r->network_measured ? r->p2p_latency : 0;
  double bw = r->network_measured ? r->p2p_bandwidth : r->triad_bytes;
  double eff = r->network_measured && bw > 0 ? r->ar_bandwidth / bw : 1;
  eff = eff > 1 ? 1 : eff < 1e-3 ? 1e-3 : eff;
  cJSON *n = cJSON_CreateObject();
  cJSON_AddNumberToObject(n, "gpus_per_node", 64);
  cJSON_AddNumberToObject(n, "nics_per_node", 1);
  cJSON_AddNumberToObject(n, "nvlink_bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
  cJSON_AddNumberToObject(n, "nvlink_latency_us", prof_round_sig(lat * 1e6, 3));
  cJSON_AddNumberToObject(n, "nic_bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
  cJSON_AddNumberToObject(n, "inter_node_latency_us", prof_round_sig(lat * 1e6, 3));
  cJSON_AddNumberToObject(n, "efficiency", prof_round_sig(eff, 3));
  cJSON_AddStringToObject(n, "collective_algorithm", "ring");
  return n;
}

static cJSON *host_json(const struct prof_run *r) {
  cJSON *h = cJSON_CreateObject();
  /* the host backend runs each rank from one loop on the cores (the simulator models it);
   * the cuda backend's host thread only enqueues */
  cJSON_AddStringToObject(h, "executor", strcmp(r->a->backend, "host") == 0 ? "loop" : "enqueue");
  cJSON_AddNumberToObject(h, "cores_per_node", r->cores);
  cJSON_AddNumberToObject(h, "instruction_overhead_us",
                          prof_round_sig(r->instruction_overhead * 1e6, 3));
  if (r->comm_measured) {
    cJSON_AddNumberToObject(h, "wait_core_share", prof_round_sig(r->wait_share, 3));
    cJSON_AddNumberToObject(h, "comm_test_us", prof_round_sig(r->comm_test * 1e6, 3));
    cJSON_AddNumberToObject(h, "wake_latency_us", prof_round_sig(r->wake_latency * 1e6, 3));
    cJSON_AddNumberToObject(h, "loop_spin_us", EXEC_HOST_IDLE_SPIN_US);
    cJSON_AddNumberToObject(h, "loop_late_us", prof_round_sig(r->loop_late * 1e6, 3));
    /* 0 (none eager) still says sends wait for their receiver: write 1 byte then */
    cJSON_AddNumberToObject(h, "eager_bytes", r->eager_bytes > 0 ? r->eager_bytes : 1);
  }
  return h;
}

/* How the measured backend holds memory: constants of its code (PROF_HELD_*), written so
 * that the simulator's memory figures of a bf16 model are what this backend holds. */
static cJSON *memory_json(const struct prof_run *r) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddNumberToObject(m, "activation_bytes_per_element", PROF_HELD_ELEMENT_BYTES);
  cJSON_AddNumberToObject(m, "param_bytes_per_param", PROF_HELD_ELEMENT_BYTES);
  cJSON_AddNumberToObject(m, "grad_bytes_per_param", PROF_HELD_ELEMENT_BYTES);
  cJSON_AddNumberToObject(m, "optimizer_state_bytes_per_param", PROF_HELD_OPTIMIZER_BYTES);
  cJSON_AddNumberToObject(m, "compute_copy_bytes_per_param", r->compute_copy_bytes_per_param);
  return m;
}

static cJSON *profile_json(const struct prof_run *r, const struct machine_facts *mf) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "name", strcmp(r->a->backend, "host") == 0 ? "host-cpu"
                                        : r->gpu_name[0]                   ? r->gpu_name
                                                                           : "cpu");
  cJSON_AddStringToObject(root, "kind", "device");
  char *desc = g_strdup_printf(
      "piper-exec's %s backend, measured by piper-prof %s on %s (%ld cores, %d rank%s, "
      "OPENBLAS_NUM_THREADS=%s, load %.2f) on %s: %u kernel entries for the models %s",
      r->a->backend, PIPER_VERSION, mf->cpu, mf->cores, r->size, r->size == 1 ? "" : "s",
      getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset", mf->load, mf->date,
      r->n_entries, r->a->model);
  cJSON_AddStringToObject(root, "description", desc);
  g_free(desc);
  cJSON_AddItemToObject(root, "sources", sources_json(r, mf));
  cJSON_AddItemToObject(root, "device", device_json(r, mf));
  cJSON_AddItemToObject(root, "network", network_json(r));
  cJSON_AddItemToObject(root, "host", host_json(r));
  cJSON_AddItemToObject(root, "memory", memory_json(r));
  if (r->fit_json)
    cJSON_AddItemReferenceToObject(cJSON_AddObjectToObject(root, "collectives"), "intra_node",
                                   r->fit_json);
  cJSON_AddItemReferenceToObject(root, "measured", r->measured);
  return root;
}

/* Checks the profile as piper-sim will read it, then writes it. */
static bool write_profile(const struct prof_run *r, int argc, char **argv, GError **err) {
  struct machine_facts mf = {0};
  machine_facts_init(&mf, r, argc, argv);
  cJSON *root = profile_json(r, &mf);
  struct profile *check = profile_parse_json(r->a->out, root, err);
  bool ok = check != NULL;
  profile_free(check);
  if (ok) {
    char *text = cJSON_Print(root);
    size_t len = strlen(text);
    text = g_realloc(text, len + 2);
    text[len] = '\n', text[len + 1] = 0;
    ok = piper_write_file(r->a->out, text, len + 1, err);
    g_free(text);
  }
  cJSON_Delete(root);
  machine_facts_free(&mf);
  return ok;
}

/* ---- the program ---------------------------------------------------------------------------- */

static bool load_models(const struct prof_args *a, GPtrArray *models, GError **err) {
  char **paths = g_strsplit(a->model, ",", -1);
  bool ok = true;
  for (char **p = paths; *p && ok; p++) {
    if (!**p)
      continue;
    struct model *m = model_load_file(*p, 0, err);
    if (m)
      g_ptr_array_add(models, m);
    ok = m != NULL;
  }
  g_strfreev(paths);
  if (ok && models->len == 0)
    return piper_input_error(err, "--model: no model file in \"%s\"", a->model);
  return ok;
}

static int check_args(const struct prof_args *a) {
  if (!a->model)
    return piper_usage_error(program.name, "%s", "--model FILE is required");
  if (!a->out)
    return piper_usage_error(program.name, "%s", "-o PROFILE is required");
#ifdef HAVE_CUDA
  if (strcmp(a->backend, "host") != 0 && strcmp(a->backend, "cuda") != 0)
    return piper_usage_error(program.name, "--backend: unknown backend \"%s\" (host, cuda)",
                             a->backend);
#else
  if (strcmp(a->backend, "cuda") == 0)
    return piper_usage_error(program.name, "%s",
                             "--backend cuda: this piper-prof times the host kernels only "
                             "(the CUDA backend is not built in)");
  if (strcmp(a->backend, "host") != 0)
    return piper_usage_error(program.name, "--backend: unknown backend \"%s\" (host)", a->backend);
#endif
  return OPTIONS_CONTINUE;
}

static bool under_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

#ifdef HAVE_MPI
/* The other ranks wait for rank 0's kernels without a core: MPI's blocking calls spin, and a
 * spinning rank would take a core from the kernels being timed. */
void prof_idle_until_released(void) {
  char done = 0;
  MPI_Request req;
  MPI_Irecv(&done, 1, MPI_CHAR, 0, 9, MPI_COMM_WORLD, &req);
  for (int flag = 0; !flag;) {
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (!flag)
      g_usleep(20000);
  }
}

static void release_others(const struct prof_run *r) {
  char done = 1;
  for (int q = 1; q < r->size; q++)
    MPI_Send(&done, 1, MPI_CHAR, q, 9, MPI_COMM_WORLD);
}
#endif

/* Network first, with every rank; then rank 0 alone times the kernels while the others sleep,
 * so nothing else of this run competes for the cores. */
static bool measure_all(struct prof_run *r, GPtrArray *models, GError **err) {
#ifdef HAVE_CUDA
  if (strcmp(r->a->backend, "cuda") == 0) {
    /* tools/prof_cuda.c: every rank its own GPU for the network, rank 0 the kernels */
    r->failed = !prof_cuda_measure(r, models, err);
    if (r->size > 1 && r->rank != 0) {
      if (!r->failed)
        prof_idle_until_released();
      return false;
    }
    return !r->failed;
  }
#endif
#ifdef HAVE_MPI
  if (r->size > 1) {
    prof_progress(r, "network over 2 to %d ranks", r->size);
    measure_network(r);
  }
#endif
  if (!measure_host(r, err))
    r->failed = true;
#ifdef HAVE_MPI
  if (r->size > 1 && r->rank != 0) {
    prof_idle_until_released();
    return false;
  }
#endif
  uint64_t max_params = 0;
  for (guint i = 0; i < models->len; i++) {
    uint64_t n = model_param_count(g_ptr_array_index(models, i));
    max_params = n > max_params ? n : max_params;
  }
  /* AdamW holds 4 floats per parameter: at most a sixteenth of the memory, and 16 M parameters
   * (a quarter of a second per step on one core) are enough to see its slope */
  double cap = physical_memory_bytes() / 64;
  if ((double)max_params > cap)
    max_params = (uint64_t)cap;
  if (max_params > ((uint64_t)1 << 24))
    max_params = (uint64_t)1 << 24;
  measure_machine(r, max_params);
  bool *chained = g_new0(bool, models->len + 1);
  measure_chains(r, models, chained);
  for (guint i = 0; i < models->len; i++)
    if (!chained[i])
      measure_model(r, g_ptr_array_index(models, i));
  g_free(chained);
  fit_chain_optimizer(r);
  prof_progress(r, "%u kernel entries, %u op shapes left to the roofline", r->n_entries,
                r->n_skipped);
  return true;
}

int main(int argc, char **argv) {
  struct prof_args a = {.backend = "host", .repeats = 21, .warmup = 3};
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  if ((rc = check_args(&a)) != OPTIONS_CONTINUE)
    return rc;
  if (a.quick && a.repeats == 21)
    a.repeats = 5;
  GError *err = NULL;
  GPtrArray *models = g_ptr_array_new_with_free_func((GDestroyNotify)model_free);
  if (!load_models(&a, models, &err)) {
    g_ptr_array_free(models, TRUE);
    return piper_error_exit(program.name, err);
  }
  struct prof_run r = {.a = &a,
                       .size = 1,
                       .measured = cJSON_CreateArray(),
                       .seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                       .opt_params = g_array_new(FALSE, FALSE, sizeof(double)),
                       .opt_seconds = g_array_new(FALSE, FALSE, sizeof(double))};
  bool mpi = false;
#ifdef HAVE_MPI
  if (under_mpirun()) {
    int provided; /* the host backend (instruction costs) needs full thread support */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    mpi = true;
  }
#endif
  bool writer = measure_all(&r, models, &err);
#ifdef HAVE_MPI
  if (mpi && r.rank == 0)
    release_others(&r);
#endif
  bool ok = !r.failed && (!writer || write_profile(&r, argc, argv, &err));
  if (writer && ok)
    prof_progress(&r, "wrote %s (%u measured entries)", a.out, r.n_entries);
#ifdef HAVE_MPI
  if (mpi)
    MPI_Finalize();
#endif
  (void)mpi;
  cJSON_Delete(r.measured);
  cJSON_Delete(r.fits);
  cJSON_Delete(r.fit_json);
  g_hash_table_destroy(r.seen);
  g_array_free(r.opt_params, TRUE);
  g_array_free(r.opt_seconds, TRUE);
  g_ptr_array_free(models, TRUE);
  return ok ? 0 : piper_error_exit(program.name, err);
}
