/* backend_cuda_gemm: the cuda backend's GEMMs (cuBLASLt; bf16 operands with fp32
 * accumulation for bf16 models, each weight matrix from its cached bf16 copy, made once per
 * write: exec/gpu_weights.h) for the kernel entries of backend_cuda_kernels.c. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "../kernels/kernels_cuda.h"
#include "cuda-impl.h"
#include "gpu_layout.h"

/* ---- GEMM ------------------------------------------------------------------------------- */

/* The largest power of two up to 256 that divides p's address. */
static uint32_t ptr_alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && a % al != 0)
    al /= 2;
  return al;
}

/* One GEMM's operands as cuBLASLt sees them (column-major: row-major C is column-major C^T =
 * op(B)^T op(A)^T, so B goes first) and their element type. */
struct gemm_call {
  bool ta, tb, bf16;
  int m, n, k;
  const void *first, *second; /* B, A as stored or their bf16 copies */
  int ld_first, ld_second;
};

/* ---- bf16 weight copies ---------------------------------------------------------------- */

/* w's copy is fresh, made on cs: the GEMMs of other streams wait for its event. */
bool exec_cuda_copy_made(struct cuda_context *b, struct exec_wcache_entry *w, cudaStream_t cs,
                         GError **err) {
  if (!CUDA_CHECK(b, cudaGetLastError(), err) ||
      !CUDA_CHECK(b, cudaEventRecord((cudaEvent_t)w->made, cs), err))
    return false;
  w->fresh = true;
  w->maker = cs;
  w->conversions++;
  b->wcache.misses++;
  return true;
}

/* The bf16 copy of weight matrix B (rows x cols, row stride ld) for a GEMM enqueued on cs:
 * made on cs when it is stale (its first GEMM after the optimizer step, a load or a gather
 * wrote it), else reused after cs waits for the stream that made it. NULL when B is not in
 * the optimizer's store or the arena has no room: the caller converts it for this GEMM. */
static const uint16_t *weight_copy(struct cuda_context *b, cudaStream_t cs, const float *B,
                                   int rows, int cols, int ld, GError **err) {
  bool created = false;
  struct exec_wcache_entry *e = exec_wcache_find(&b->wcache, B, rows, cols, ld, &created);
  if (!e)
    return NULL;
  if (created) {
    size_t bytes = (size_t)rows * (size_t)cols * 2;
    cudaEvent_t ev = NULL;
    e->copy = exec_cuda_alloc_quiet(b, bytes);
    if (e->copy && !CUDA_CHECK(b, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), err)) {
      exec_cuda_release_block(b, e->copy);
      e->copy = NULL; /* this GEMM fails; later ones convert per GEMM */
      return NULL;
    }
    e->made = ev;
    if (e->copy)
      b->wcache_bytes += bytes;
  }
  if (!e->copy)
    return NULL; /* no room: converted per GEMM, as without the cache */
  if (e->fresh) {
    b->wcache.hits++;
    if (e->maker != (const void *)cs &&
        !CUDA_CHECK(b, cudaStreamWaitEvent(cs, (cudaEvent_t)e->made, 0), err))
      return NULL;
    return e->copy;
  }
  /* whoever read the previous copy read the weights before their write, which this GEMM's
   * stream already waits for (the plan's order): overwriting it here races with nobody */
  kc_to_bf16(e->copy, B, rows, cols, ld, cs);
  return exec_cuda_copy_made(b, e, cs, err) ? e->copy : NULL;
}

void exec_cuda_written(struct cuda_context *b, const void *p, size_t bytes) {
  if (b && b->wcache.entries)
    exec_wcache_written(&b->wcache, p, bytes);
}

static void entry_free(struct cuda_context *b, struct exec_wcache_entry *e) {
  if (e->made)
    cudaEventDestroy((cudaEvent_t)e->made);
  if (e->copy) {
    exec_cuda_release_block(b, e->copy);
    b->wcache_bytes -= (size_t)e->rows * (size_t)e->cols * 2;
  }
}

void exec_cuda_weights_forget(struct cuda_context *b, const void *p) {
  if (!b->wcache.stores || !exec_wcache_in_store(&b->wcache, p, 1))
    return;
  GPtrArray *gone = g_ptr_array_new_with_free_func(g_free);
  exec_wcache_drop(&b->wcache, p, gone);
  for (guint k = 0; k < gone->len; k++)
    entry_free(b, g_ptr_array_index(gone, k));
  g_ptr_array_free(gone, TRUE);
}

void exec_cuda_weights_free(struct cuda_context *b) {
  if (!b->wcache.entries)
    return;
  if (b->rank == 0 && b->wcache.entries->len)
    g_printerr("piper-exec: cuda: bf16 weight copies: %u matrices, %.3f GiB, made %" PRIu64
               " times, reused %" PRIu64 " times (rank 0)\n",
               b->wcache.entries->len, b->wcache_bytes / 1073741824.0, b->wcache.misses,
               b->wcache.hits);
  /* copies in the arena go with it; before configure they are device memory of their own */
  for (guint k = 0; k < b->wcache.entries->len; k++) {
    struct exec_wcache_entry *e = g_ptr_array_index(b->wcache.entries, k);
    if (e->made)
      cudaEventDestroy((cudaEvent_t)e->made);
    bool in_arena = b->arena && (char *)e->copy >= b->arena &&
                    (char *)e->copy < b->arena + b->arena_bytes;
    if (e->copy && !in_arena)
      cudaFree(e->copy);
  }
  exec_wcache_clear(&b->wcache);
}

/* bf16 copies of A and B (round to nearest even), compact: cuBLASLt then reads bf16 operands
 * and accumulates in fp32 (CUBLAS_COMPUTE_32F) into fp32 C. B, where it is a weight matrix
 * of the optimizer's store, comes from its cached copy (weight_copy); the rest is converted
 * into the stream's scratch, 6 bytes of traffic per element, O(mk + kn) against the GEMM's
 * O(mnk) arithmetic; an operand already in bf16 (pre) is taken as it is. */
static bool gemm_bf16_operands(struct cuda_context *b, cudaStream_t cs, struct cuda_scratch *sc,
                               struct gemm_call *g, const void *A, int lda, const void *B,
                               int ldb, unsigned pre, GError **err) {
  int ra = g->ta ? g->k : g->m, ca = g->ta ? g->m : g->k; /* A as stored, row-major */
  int rb = g->tb ? g->n : g->k, cb = g->tb ? g->k : g->n;
  const uint16_t *cached = pre & GEMM_B16 ? B : weight_copy(b, cs, B, rb, cb, ldb, err);
  if (!cached && err && *err)
    return false;
  size_t nb = cached ? 0 : (size_t)rb * cb * 2, off = (nb + 255) & ~(size_t)255;
  size_t need = off + (pre & GEMM_A16 ? 0 : (size_t)ra * ca * 2);
  if (need > sc->bytes) {
    /* GEMMs enqueued on this stream may still read the old copies */
    if (sc->p && !(CUDA_CHECK(b, cudaStreamSynchronize(cs), err) &&
                   CUDA_CHECK(b, cudaFree(sc->p), err)))
      return false;
    sc->p = NULL;
    sc->bytes = 0;
    if (!CUDA_CHECK(b, cudaMalloc(&sc->p, need + need / 2), err))
      return false;
    sc->bytes = need + need / 2;
  }
  uint16_t *b16 = sc->p, *a16 = (uint16_t *)(void *)((char *)sc->p + off);
  if (!cached)
    kc_to_bf16(b16, B, rb, cb, ldb, cs);
  g->first = cached ? (const void *)cached : (const void *)b16;
  g->ld_first = pre & GEMM_B16 ? ldb : cb;
  if (pre & GEMM_A16) {
    g->second = A, g->ld_second = lda;
    return true;
  }
  kc_to_bf16(a16, A, ra, ca, lda, cs);
  g->second = a16, g->ld_second = ca;
  return true;
}

/* The algorithm for x: the heuristic's answer per layout, scaling and alignment, cached
 * (asking costs more than a small GEMM, and every step asks for the same shapes). *found is
 * false, and cached so, where cuBLASLt has none. */
static bool lt_algo(struct cuda_context *b, const struct exec_lt_matmul *x, bool declinable,
                    cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                    cublasLtMatrixLayout_t lc, cublasLtMatmulHeuristicResult_t *heur, bool *found,
                    GError **err) {
  /* the heuristic assumes 256-byte aligned operands unless told: views into saved buffers
   * (a head's columns, an expert's rows) are often only 4-byte aligned, and an FP8 K slice
   * starts 128 bytes into its rows */
  const uint32_t al[] = {ptr_alignment(x->A), ptr_alignment(x->B), ptr_alignment(x->D),
                         ptr_alignment(x->D)};
  char key[160];
  g_snprintf(key, sizeof key, "%d %d %d%d %d %d %d %d %d %d %d %d %d %u %u %u", (int)x->in,
             x->scaling, (int)x->opa, (int)x->opb, x->a_rows, x->a_cols, x->lda, x->b_rows,
             x->b_cols, x->ldb, x->n, x->m, x->ldd, al[0], al[1], al[2]);
  if (!b->gemm_algos)
    b->gemm_algos = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  const cublasLtMatmulHeuristicResult_t *cached = g_hash_table_lookup(b->gemm_algos, key);
  if (cached) {
    *heur = *cached;
    *found = heur->state == CUBLAS_STATUS_SUCCESS;
    return true;
  }
  cublasLtMatmulPreference_t pref = NULL;
  int n_found = 0;
  const cublasLtMatmulPreferenceAttributes_t which[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  bool ok = CUBLAS_CHECK(b, cublasLtMatmulPreferenceCreate(&pref), err) &&
            CUBLAS_CHECK(b,
                         cublasLtMatmulPreferenceSetAttribute(
                             pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                             &b->lt_workspace_bytes, sizeof b->lt_workspace_bytes),
                         err);
  for (size_t i = 0; ok && i < G_N_ELEMENTS(which); i++)
    ok = CUBLAS_CHECK(b, cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]),
                      err);
  cublasStatus_t st = ok ? cublasLtMatmulAlgoGetHeuristic(b->lt, op, la, lb, lc, lc, pref, 1, heur,
                                                          &n_found)
                         : CUBLAS_STATUS_SUCCESS;
  if (pref)
    cublasLtMatmulPreferenceDestroy(pref);
  /* a shape a declinable call cannot run is no error: it is declined */
  if (!ok || (!declinable && !CUBLAS_CHECK(b, st, err)))
    return false;
  if (st != CUBLAS_STATUS_SUCCESS || n_found == 0) {
    memset(heur, 0, sizeof *heur);
    heur->state = CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *found = heur->state == CUBLAS_STATUS_SUCCESS;
  g_hash_table_insert(b->gemm_algos, g_strdup(key), g_memdup2(heur, sizeof *heur));
  return true;
}

bool exec_cuda_lt_matmul(struct cuda_context *b, cudaStream_t cs, void *ws,
                         const struct exec_lt_matmul *x, bool declinable, bool *ran, GError **err) {
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  bool found = false;
  bool ok =
      CUBLAS_CHECK(b, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), err) &&
      CUBLAS_CHECK(b,
                   cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &x->opa,
                                                  sizeof x->opa),
                   err) &&
      CUBLAS_CHECK(b,
                   cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &x->opb,
                                                  sizeof x->opb),
                   err) &&
      (!x->a_scale || CUBLAS_CHECK(b,
                                   cublasLtMatmulDescSetAttribute(
                                       op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &x->a_scale,
                                       sizeof x->a_scale),
                                   err)) &&
      (!x->b_scale || CUBLAS_CHECK(b,
                                   cublasLtMatmulDescSetAttribute(
                                       op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x->b_scale,
                                       sizeof x->b_scale),
                                   err)) &&
      CUBLAS_CHECK(b, cublasLtMatrixLayoutCreate(&la, x->in, x->a_rows, x->a_cols, x->lda), err) &&
      CUBLAS_CHECK(b, cublasLtMatrixLayoutCreate(&lb, x->in, x->b_rows, x->b_cols, x->ldb), err) &&
      CUBLAS_CHECK(b, cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, x->n, x->m, x->ldd), err) &&
      lt_algo(b, x, declinable, op, la, lb, lc, &heur, &found, err);
  *ran = ok && found;
  if (*ran)
    ok = CUBLAS_CHECK(b,
                      cublasLtMatmul(b->lt, op, &x->alpha, x->A, la, x->B, lb, &x->beta, x->D, lc,
                                     x->D, lc, &heur.algo, ws, b->lt_workspace_bytes, cs),
                      err);
  if (lc)
    cublasLtMatrixLayoutDestroy(lc);
  if (lb)
    cublasLtMatrixLayoutDestroy(lb);
  if (la)
    cublasLtMatrixLayoutDestroy(la);
  if (op)
    cublasLtMatmulDescDestroy(op);
  return ok;
}

/* kernels_gemm's contract (row-major C[m,n] = alpha op(A) op(B) + beta C, beta 0 ignores C)
 * through cuBLASLt: fp32 operands computed in fp32, or (bf16 models) bf16 copies of them with
 * fp32 accumulation (CUBLAS_COMPUTE_32F, bf16 A and B, fp32 C and D). */
static bool gemm_lt(struct cuda_context *b, cudaStream_t cs, void *ws, struct cuda_scratch *sc,
                    bool ta, bool tb, int m, int n, int k, float alpha, const void *A, int lda,
                    const void *B, int ldb, unsigned pre, float beta, float *C, int ldc,
                    GError **err) {
  PIPER_ASSERT(!pre || b->bf16_gemm);
  if (m == 0 || n == 0)
    return true;
  if (k == 0) {
    /* nothing to multiply: C = beta C */
    if (beta == 0.0f)
      for (int r = 0; r < m; r++)
        kc_fill(C + (size_t)r * ldc, 0.0f, (size_t)n, cs);
    return true;
  }
  struct gemm_call g = {ta, tb, b->bf16_gemm, m, n, k, B, A, ldb, lda};
  if (g.bf16 && !gemm_bf16_operands(b, cs, sc, &g, A, lda, B, ldb, pre, err))
    return false;
  /* first operand: B^T as stored, [n, k] after op; second: A, [k, m] after op */
  struct exec_lt_matmul x = {
      .in = g.bf16 ? CUDA_R_16BF : CUDA_R_32F, .scaling = MODEL_FP8_NONE,
      .opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, .opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      .a_rows = tb ? k : n, .a_cols = tb ? n : k, .lda = g.ld_first,
      .b_rows = ta ? m : k, .b_cols = ta ? k : m, .ldb = g.ld_second,
      .n = n, .m = m, .ldd = ldc, .A = g.first, .B = g.second, .D = C, .alpha = alpha,
      .beta = beta};
  bool ran = false;
  if (!exec_cuda_lt_matmul(b, cs, ws, &x, false, &ran, err))
    return false;
  return ran || piper_runtime_error(err,
                                    "rank %u GPU %d: cuBLASLt has no algorithm for a %dx%dx%d %s "
                                    "GEMM",
                                    b->rank, b->device, m, n, k, g.bf16 ? "bf16" : "fp32");
}

/* A GEMM of a kernel entry, pre saying which operands are already bf16 (bf16 models only):
 * failures fail the stream. */
void exec_cuda_gemm_pre(struct exec_stream *s, unsigned pre, bool ta, bool tb, int m, int n, int k,
                     float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                     float *C, int ldc) {
  GError *e = NULL;
  struct cuda_context *b = exec_cuda_kernel_ctx(s);
  /* a workspace and operand copies per stream: GEMMs of two streams run at once (the setup
   * stream's are the context's) */
  bool setup = s == b->setup_stream;
  void *ws = setup ? b->lt_workspace : s->lt_workspace;
  struct cuda_scratch *sc = setup ? &b->setup_bf16 : &s->bf16;
  int fp8 = s->fp8 ? exec_cuda_gemm_fp8(s, ta, tb, m, n, k, alpha, A, lda, B, ldb, pre, beta, C,
                                        ldc, &e)
                   : 0;
  if (fp8 < 0 && e)
    exec_cuda_fail(s, e);
  if (fp8 != 0)
    return;
  if (!gemm_lt(b, exec_cuda_st_of(s), ws, sc, ta, tb, m, n, k, alpha, A, lda, B, ldb, pre, beta, C, ldc,
               &e))
    exec_cuda_fail(s, e);
}
