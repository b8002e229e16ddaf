/* backend_cuda_fp8: the cuda backend's FP8 GEMMs for models with piper.fp8 (docs/exec.md,
 * "FP8"). Which GEMMs: the linear layers' (attention's q, k, v and output projections, the
 * MLP's and the routed experts' three matrices), forward, input gradient and weight gradient,
 * as Transformer Engine and DeepSeek-V3 do; attention's core, norms, the router, the embedding
 * and the LM head stay bf16, as both recipes keep them. Every operand is e4m3 (DeepSeek-V3's
 * choice for all three GEMMs; fine-grained scales make e4m3's range enough for gradients, so
 * the hybrid e5m2-gradient format is not used), quantised per GEMM from the fp32 (or bf16)
 * operand by kernels/fp8.cu, K-major as cuBLASLt's FP8 matmul reads it; accumulation and
 * output fp32. Recipes:
 * - tensorwise (current scaling): one scale per operand, 448 / amax of the whole operand,
 *   computed on the device (no host sync); cuBLASLt applies the two inverse scales
 *   (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER) in its fp32 epilogue.
 * - blockwise (DeepSeek-V3): activations and gradients in 1 x 128 tiles along K, weights in
 *   128 x 128 blocks, one fp32 scale each; the product runs as one FP8 GEMM per 128-wide K
 *   slice into fp32 scratch, promoted into C with the slice's tile scales by kc_fp8_promote:
 *   DeepSeek's fp32 promotion every 128 of K, done outside the tensor cores.
 * K is padded with zeros to a multiple of 16 (cuBLASLt's FP8 reads 16-byte rows). A GEMM
 * for which cuBLASLt has no FP8 algorithm runs in bf16 and is counted; the end of the run
 * prints both counts. */
#include <inttypes.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "../kernels/fp8.h"
#include "cuda-impl.h"

/* The linear layers' ops: the GEMMs inside them run in FP8 under a recipe. */
static bool linear_op(enum exec_op op) {
  switch (op) {
  case EXEC_OP_attention_forward:
  case EXEC_OP_attention_backward_input:
  case EXEC_OP_attention_backward_weight:
  case EXEC_OP_attention_backward:
  case EXEC_OP_mlp_forward:
  case EXEC_OP_mlp_backward_input:
  case EXEC_OP_mlp_backward_weight:
  case EXEC_OP_mlp_backward:
  case EXEC_OP_expert_ffn_forward:
  case EXEC_OP_expert_ffn_backward_input:
  case EXEC_OP_expert_ffn_backward_weight:
  case EXEC_OP_expert_ffn_backward:
    return true;
  default:
    return false;
  }
}

bool exec_cuda_fp8_enter(struct exec_stream *s, enum exec_op op) {
  bool was = s->fp8;
  s->fp8 = s->b->fp8 != MODEL_FP8_NONE && linear_op(op);
  return was;
}

void exec_cuda_fp8_leave(struct exec_stream *s, bool was) {
  s->fp8 = was;
}

/* ---- one FP8 GEMM --------------------------------------------------------------------------- */

/* One operand's FP8 form: K-major e4m3 [outer][kp] (K padded with zeros to kp, a multiple
 * of 16) and its dequantisation factors (tensorwise: scale[1]; blockwise: inv [outer
 * blocks][nk], block_outer rows of outer a block). */
struct fp8_operand {
  uint8_t *q;
  int kp;
  float *scale, *inv;
  int outer, block_outer;
};

/* Quantises x (rows x cols as stored, row stride ld; bf16 bits when bf16) into o, K along
 * rows when transpose. */
static void quantize(struct cuda_context *b, cudaStream_t cs, struct fp8_operand *o,
                     float *partials, const void *x, bool bf16, int rows, int cols, int ld,
                     bool transpose) {
  if (b->fp8 == MODEL_FP8_TENSORWISE) {
    kc_fp8_amax_scale(o->scale, partials, x, bf16, rows, cols, ld, cs);
    kc_fp8_quantize_tensor(o->q, o->kp, x, bf16, rows, cols, ld, transpose, o->scale, cs);
  } else {
    kc_fp8_quantize_tiles(o->q, o->kp, o->inv, x, bf16, rows, cols, ld, transpose, o->block_outer,
                          cs);
  }
}

/* The matmul of first (cuBLASLt's A: [n][k] K-major, transposed) and second ([m][k], not):
 * D [n, m] column-major = row-major C [m, n]. ks columns of K from k0 (the whole K for the
 * tensorwise recipe), ld k. */
struct fp8_matmul {
  const uint8_t *first, *second;
  int m, n, k, k0, ks;
  float *D;
  int ldd;
  float alpha, beta;
};

/* One cuBLASLt FP8 matmul (scales: the dequantisation factors a_scale, b_scale of first and
 * second, or NULL for 1), both operands K-major ("TN"); *ran false when cuBLASLt declines
 * the shape. */
static bool fp8_matmul(struct cuda_context *b, cudaStream_t cs, void *ws,
                       const struct fp8_matmul *x, const float *a_scale, const float *b_scale,
                       bool *ran, GError **err) {
  struct exec_lt_matmul lt = {
      .in = CUDA_R_8F_E4M3, .scaling = (int)b->fp8, .opa = CUBLAS_OP_T, .opb = CUBLAS_OP_N,
      .a_rows = x->ks, .a_cols = x->n, .lda = x->k, .b_rows = x->ks, .b_cols = x->m,
      .ldb = x->k, .n = x->n, .m = x->m, .ldd = x->ldd, .A = x->first + x->k0,
      .B = x->second + x->k0, .D = x->D, .alpha = x->alpha, .beta = x->beta,
      .a_scale = a_scale, .b_scale = b_scale};
  return exec_cuda_lt_matmul(b, cs, ws, &lt, true, ran, err);
}

/* Blockwise: one FP8 GEMM per 128-wide K slice into part [m, n] (fp32), each promoted into C
 * with its tiles' factors. The first slice decides: declined there, nothing was written. */
static bool blockwise(struct cuda_context *b, cudaStream_t cs, void *ws, struct fp8_matmul *x,
                      const struct fp8_operand *fa, const struct fp8_operand *fb, float *part,
                      float *C, int ldc, bool *ran, GError **err) {
  int nk = (x->k + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  float alpha = x->alpha, beta = x->beta;
  x->alpha = 1.0f, x->beta = 0.0f, x->D = part, x->ldd = x->n;
  for (int s = 0; s < nk; s++) {
    x->k0 = s * KERNELS_FP8_BLOCK;
    x->ks = x->k - x->k0 < KERNELS_FP8_BLOCK ? x->k - x->k0 : KERNELS_FP8_BLOCK;
    if (!fp8_matmul(b, cs, ws, x, NULL, NULL, ran, err))
      return false;
    if (!*ran && s > 0) /* a short last slice: C already holds the others */
      return piper_runtime_error(err,
                                 "rank %u GPU %d: cuBLASLt has no FP8 algorithm for the last "
                                 "%d-wide K slice of a %dx%dx%d GEMM",
                                 b->rank, b->device, x->ks, x->m, x->n, x->k);
    if (!*ran)
      return true;
    /* fa holds the A side (rows i of C), fb the B side (columns j) */
    kc_fp8_promote(C, ldc, part, x->m, x->n, alpha, beta, s == 0, fa->inv, fa->block_outer,
                   fb->inv, fb->block_outer, nk, s, cs);
  }
  return true;
}

static size_t round_up(size_t n) {
  return (n + 255) & ~(size_t)255;
}

/* kernels_gemm's contract (row-major C[m,n] = alpha op(A) op(B) + beta C) with e4m3 operands
 * under the model's recipe: 1 ran, 0 declined (the caller runs it in bf16), -1 failed (err).
 * In a linear op, B is the layer's weight unless A is transposed (the weight gradient
 * x^T dy): the kernels' layout (kernels/kernels.h) puts the tokens first, so only a weight
 * gradient contracts over A's rows. */
int exec_cuda_gemm_fp8(struct exec_stream *s, bool ta, bool tb, int m, int n, int k,
                       float alpha, const void *A, int lda, const void *B, int ldb, unsigned pre,
                       float beta, float *C, int ldc, GError **err) {
  struct cuda_context *b = exec_cuda_kernel_ctx(s);
  if (m == 0 || n == 0 || k == 0)
    return 0; /* nothing to multiply: the bf16 path's C = beta C */
  /* cuBLASLt's FP8 reads 16-byte rows: K is padded with zeros (a weight gradient's K is
   * the tokens, an expert's its routed rows: any count) */
  int kp = (k + 15) / 16 * 16;
  bool blocks = b->fp8 == MODEL_FP8_BLOCKWISE;
  int nk = (k + KERNELS_FP8_BLOCK - 1) / KERNELS_FP8_BLOCK;
  struct fp8_operand fa = {NULL, kp, NULL, NULL, m, 1}, fb = {NULL, kp, NULL, NULL, n, ta ? 1 : 128};
  /* scratch: both e4m3 copies, their factors (at most one per 1 x 128 tile), the two
   * tensorwise scales and the amax partials, and blockwise's fp32 slice product */
  size_t qa = round_up((size_t)m * kp), qb = round_up((size_t)n * kp);
  size_t ia = round_up(sizeof(float) * (size_t)m * nk), ib = round_up(sizeof(float) * (size_t)n * nk);
  size_t sc = round_up(sizeof(float) * (4 + KC_FP8_PARTIALS));
  size_t part = blocks ? sizeof(float) * (size_t)m * n : 0;
  char *mem = exec_cuda_stream_scratch(s, qa + qb + ia + ib + sc + part);
  if (!mem)
    return -1; /* the stream failed with the allocation's error */
  cudaStream_t cs = exec_cuda_st_of(s);
  fa.q = (uint8_t *)mem, fb.q = (uint8_t *)mem + qa;
  fa.inv = (float *)(void *)(mem + qa + qb), fb.inv = (float *)(void *)(mem + qa + qb + ia);
  float *scales = (float *)(void *)(mem + qa + qb + ia + ib), *partials = scales + 4;
  float *product = (float *)(void *)(mem + qa + qb + ia + ib + sc);
  fa.scale = scales, fb.scale = scales + 2;
  quantize(b, cs, &fa, partials, A, pre & GEMM_A16, ta ? k : m, ta ? m : k, lda, ta);
  quantize(b, cs, &fb, partials, B, pre & GEMM_B16, tb ? n : k, tb ? k : n, ldb, !tb);
  bool setup = s == b->setup_stream, ran = false;
  void *ws = setup ? b->lt_workspace : s->lt_workspace;
  struct fp8_matmul x = {fb.q, fa.q, m, n, kp, 0, kp, C, ldc, alpha, beta};
  bool ok = blocks ? blockwise(b, cs, ws, &x, &fa, &fb, product, C, ldc, &ran, err)
                   : fp8_matmul(b, cs, ws, &x, fb.scale + 1, fa.scale + 1, &ran, err);
  cudaFreeAsync(mem, cs);
  if (!ok)
    return -1;
  if (ran)
    b->fp8_gemms++;
  else
    b->fp8_declined++;
  return ran ? 1 : 0;
}

void exec_cuda_fp8_report(const struct cuda_context *b) {
  if (b->fp8 != MODEL_FP8_NONE && b->rank == 0)
    g_printerr("piper-exec: cuda: FP8 (%s): %" PRIu64 " GEMMs in e4m3, %" PRIu64
               " of the linear layers' in bf16 (cuBLASLt had no FP8 algorithm) "
               "(rank 0)\n",
               model_fp8_name(b->fp8), b->fp8_gemms, b->fp8_declined);
}
