/* backend_cuda_head: the cuda backend's LM head + cross-entropy entries, whole and as a
 * tensor-parallel slice's (kernels/ops.def's lm_head_loss_* and tp_head_*), composed like the
 * host's in kernels/loss.c: the same saved layout, GEMMs through cuBLASLt (backend_cuda_gemm.c),
 * the row-wise steps from kernels/cuda.cu. The table itself is backend_cuda_kernels.c's. */
#include <stdlib.h>
#include <string.h>

#include "../base/base.h"
#include "../kernels/kernels_cuda.h"
#include "cuda-impl.h"
#include "gpu_layout.h"

/* ---- LM head + cross-entropy (kernels/loss.c): the host's saved layout (each row's max logit
 * and 1 / sum of exp, O(T)). By default fused over vocabulary tiles (below); with
 * PIPER_CUDA_HEAD=rows (or PIPER_CUDA_HEAD_ROWS) F, BI, BW and B compute the logits a chunk of rows at a time in
 * stream-ordered scratch (exec_gpu_head_chunk_rows: about 1 GiB, at least 1024 rows, so the
 * chunk GEMMs run at GEMM speed), so no [T, V] buffer lives past a kernel. BI and BW each
 * recompute the logits and dlogits (split schedules run them apart); B recomputes them once
 * per chunk and feeds both dh and dparams from them. ---------------------------------------- */

/* Rows per chunk. PIPER_CUDA_HEAD_ROWS=N forces N: gpu-check runs the kernel checks with a few
 * rows, so that the multi-chunk path (a partial last chunk, dparams summed over chunks) is
 * checked against the host at the checks' small T, which the rule puts in one chunk. */
static int head_rows(int T, int V) {
  const char *forced = getenv("PIPER_CUDA_HEAD_ROWS");
  return exec_gpu_head_chunk_rows(T, V, forced ? atoi(forced) : 0);
}

static void head_logits(struct exec_stream *s, float *out, const float *h, const float *params,
                        enum kernels_lm_head_layout layout, int n, int C, int V) {
  if (layout == KERNELS_LM_HEAD_TIED)
    exec_cuda_gemm(s, false, true, n, V, C, 1.0f, h, C, params, C, 0.0f, out, V);
  else
    exec_cuda_gemm(s, false, false, n, V, C, 1.0f, h, C, params, V, 0.0f, out, V);
}

/* ---- the fused head (the default; exec_gpu_head_tile_cols): vocabulary tiles [T, cols] -----
 * F: per tile, one GEMM for its logits and one reduction of them (kc_tp_head_stats: each row's
 * max, sum of exp and target logit within the tile, as a tensor-parallel slice's), then the
 * tiles' stats merged by log-sum-exp into the saved max and 1 / sum and the loss
 * (kc_tp_head_combine, as TP merges its slices'). The tile is read back right after the GEMM
 * wrote it, from the L2 cache at its size: the [T, V] logits never exist. BI, BW and B
 * recompute each tile's logits, turn them into dlogits in place (kc_xent_backward over the
 * tile's columns, the targets as tile columns), and feed dh (summed over the tiles) and the
 * tile's columns of dparams (rows, when tied) from them. */

static bool head_fused(void) {
  const char *mode = getenv("PIPER_CUDA_HEAD");
  return !getenv("PIPER_CUDA_HEAD_ROWS") && !(mode && strcmp(mode, "rows") == 0);
}

static int head_cols(int T, int V) {
  const char *forced = getenv("PIPER_CUDA_HEAD_COLS");
  return exec_gpu_head_tile_cols(T, V, forced ? atoi(forced) : 0);
}

/* logits [T, vc] of vocabulary columns [v0, v0 + vc): a strided view of the weight */
static void tile_logits(struct exec_stream *s, float *out, const float *h, const float *params,
                        enum kernels_lm_head_layout layout, int T, int C, int V, int v0, int vc) {
  if (layout == KERNELS_LM_HEAD_TIED)
    exec_cuda_gemm(s, false, true, T, vc, C, 1.0f, h, C, params + (size_t)v0 * C, C, 0.0f, out, vc);
  else
    exec_cuda_gemm(s, false, false, T, vc, C, 1.0f, h, C, params + v0, V, 0.0f, out, vc);
}

static void head_fused_forward(struct exec_stream *s, float *loss, float *saved, const float *h,
                               const int32_t *targets, const float *params,
                               enum kernels_lm_head_layout layout, int T, int C, int V) {
  int cols = head_cols(T, V), tiles = (V + cols - 1) / cols;
  float *tile = exec_cuda_stream_scratch(s, (size_t)T * cols * sizeof(float));
  float *stats = tile ? exec_cuda_stream_scratch(s, (size_t)tiles * 3 * T * sizeof(float)) : NULL;
  for (int j = 0; stats && j < tiles; j++) {
    int v0 = j * cols, vc = V - v0 < cols ? V - v0 : cols;
    tile_logits(s, tile, h, params, layout, T, C, V, v0, vc);
    kc_tp_head_stats(stats + (size_t)j * 3 * T, tile, targets, 0, T, T, vc, v0, exec_cuda_st_of(s));
  }
  float *rowloss = stats ? exec_cuda_stream_scratch(s, (size_t)T * sizeof(float)) : NULL;
  if (rowloss) {
    kc_tp_head_combine(loss, rowloss, saved, stats, tiles, T, exec_cuda_st_of(s));
    cudaFreeAsync(rowloss, exec_cuda_st_of(s));
  }
  if (stats)
    cudaFreeAsync(stats, exec_cuda_st_of(s));
  if (tile)
    cudaFreeAsync(tile, exec_cuda_st_of(s));
}

/* dh (when dh: = or += as accumulate) and dparams (when dparams: +=) from each tile's
 * recomputed dlogits, tiles in vocabulary order (the same order whether BW runs alone or
 * within B) */
static void head_fused_backward(struct exec_stream *s, float *dh, float *dparams,
                                const float *saved, const float *h, const int32_t *targets,
                                const float *params, enum kernels_lm_head_layout layout,
                                float dloss, int T, int C, int V, bool accumulate) {
  int cols = head_cols(T, V);
  bool bf16 = exec_cuda_kernel_ctx(s)->bf16_gemm, tied = layout == KERNELS_LM_HEAD_TIED;
  float *dl = exec_cuda_stream_scratch(s, (size_t)T * cols * sizeof(float));
  uint16_t *dl16 = dl && bf16 ? exec_cuda_stream_scratch(s, (size_t)T * cols * sizeof(uint16_t)) : NULL;
  int32_t *local = dl && (dl16 || !bf16) ? exec_cuda_stream_scratch(s, (size_t)T * sizeof(int32_t)) : NULL;
  unsigned pre_a = dl16 ? GEMM_A16 : 0, pre_b = dl16 ? GEMM_B16 : 0;
  const void *g = dl16 ? (const void *)dl16 : (const void *)dl;
  for (int v0 = 0; local && v0 < V; v0 += cols) {
    int vc = V - v0 < cols ? V - v0 : cols;
    float beta = v0 > 0 || accumulate ? 1.0f : 0.0f;
    tile_logits(s, dl, h, params, layout, T, C, V, v0, vc);
    kc_slice_targets(local, targets, T, v0, vc, exec_cuda_st_of(s));
    kc_xent_backward(dl, dl16, saved, local, 0, T, T, vc, dloss / (float)T, exec_cuda_st_of(s));
    if (dh && tied)
      exec_cuda_gemm_pre(s, pre_a, false, false, T, C, vc, 1.0f, g, vc, params + (size_t)v0 * C,
                         C, beta, dh, C);
    else if (dh)
      exec_cuda_gemm_pre(s, pre_a, false, true, T, C, vc, 1.0f, g, vc, params + v0, V, beta, dh,
                         C);
    if (dparams && tied)
      exec_cuda_gemm_pre(s, pre_a, true, false, vc, C, T, 1.0f, g, vc, h, C, 1.0f,
                         dparams + (size_t)v0 * C, C);
    else if (dparams)
      exec_cuda_gemm_pre(s, pre_b, true, false, C, vc, T, 1.0f, h, C, g, vc, 1.0f, dparams + v0,
                         V);
  }
  void *bufs[] = {local, dl16, dl};
  for (size_t i = 0; i < G_N_ELEMENTS(bufs); i++)
    if (bufs[i])
      cudaFreeAsync(bufs[i], exec_cuda_st_of(s));
}

void exec_cuda_lm_head_loss_forward(struct exec_stream *s, float *loss, float *saved, const float *h,
                                   const int32_t *targets, const float *params,
                                   enum kernels_lm_head_layout layout, int T, int C, int V) {
  if (head_fused()) {
    head_fused_forward(s, loss, saved, h, targets, params, layout, T, C, V);
    return;
  }
  int rows = head_rows(T, V);
  float *chunk = exec_cuda_stream_scratch(s, (size_t)rows * V * sizeof(float));
  float *rowloss = chunk ? exec_cuda_stream_scratch(s, (size_t)T * sizeof(float)) : NULL;
  for (int t0 = 0; rowloss && t0 < T; t0 += rows) {
    int n = T - t0 < rows ? T - t0 : rows;
    head_logits(s, chunk, h + (size_t)t0 * C, params, layout, n, C, V);
    kc_xent_stats(rowloss, saved, chunk, targets, t0, n, T, V, exec_cuda_st_of(s));
  }
  if (rowloss) {
    kc_xent_mean(loss, rowloss, T, exec_cuda_st_of(s));
    cudaFreeAsync(rowloss, exec_cuda_st_of(s));
  }
  if (chunk)
    cudaFreeAsync(chunk, exec_cuda_st_of(s));
}

/* dh rows (BI, when dh), dparams (BW, when dparams) or both (B) from the dlogits, recomputed a
 * chunk of rows at a time: once per chunk whichever of them is asked for. dparams
 * accumulates over the chunks, in the same order whether BW runs alone or within B. */
static void head_backward(struct exec_stream *s, float *dh, float *dparams, const float *saved,
                          const float *h, const int32_t *targets, const float *params,
                          enum kernels_lm_head_layout layout, float dloss, int T, int C, int V,
                          bool accumulate) {
  int rows = head_rows(T, V);
  float *dl = exec_cuda_stream_scratch(s, (size_t)rows * V * sizeof(float));
  /* bf16 GEMMs read the dlogits rounded once, by the cross-entropy's backward itself, rather
   * than converted for each of the two GEMMs: 1.5 GB less traffic per GiB chunk */
  bool bf16 = exec_cuda_kernel_ctx(s)->bf16_gemm;
  uint16_t *dl16 = dl && bf16 ? exec_cuda_stream_scratch(s, (size_t)rows * V * sizeof(uint16_t)) : NULL;
  unsigned pre_a = dl16 ? GEMM_A16 : 0, pre_b = dl16 ? GEMM_B16 : 0;
  const void *g = dl16 ? (const void *)dl16 : (const void *)dl;
  float beta = accumulate ? 1.0f : 0.0f;
  bool tied = layout == KERNELS_LM_HEAD_TIED;
  for (int t0 = 0; dl && (dl16 || !bf16) && t0 < T; t0 += rows) {
    int n = T - t0 < rows ? T - t0 : rows;
    const float *hc = h + (size_t)t0 * C;
    head_logits(s, dl, hc, params, layout, n, C, V);
    kc_xent_backward(dl, dl16, saved, targets, t0, n, T, V, dloss / (float)T, exec_cuda_st_of(s));
    if (dh)
      exec_cuda_gemm_pre(s, pre_a, false, !tied, n, C, V, 1.0f, g, V, params, tied ? C : V, beta,
                         dh + (size_t)t0 * C, C);
    if (dparams && tied)
      exec_cuda_gemm_pre(s, pre_a, true, false, V, C, n, 1.0f, g, V, hc, C, 1.0f, dparams, C);
    else if (dparams)
      exec_cuda_gemm_pre(s, pre_b, true, false, C, V, n, 1.0f, hc, C, g, V, 1.0f, dparams, V);
  }
  if (dl16)
    cudaFreeAsync(dl16, exec_cuda_st_of(s));
  if (dl)
    cudaFreeAsync(dl, exec_cuda_st_of(s));
}

void exec_cuda_lm_head_loss_backward_input(struct exec_stream *s, float *dh, float *bwork,
                                          const float *saved, const float *h,
                                          const int32_t *targets, const float *params,
                                          enum kernels_lm_head_layout layout, float dloss, int T,
                                          int C, int V, bool accumulate) {
  (void)bwork;
  if (head_fused())
    head_fused_backward(s, dh, NULL, saved, h, targets, params, layout, dloss, T, C, V, accumulate);
  else
    head_backward(s, dh, NULL, saved, h, targets, params, layout, dloss, T, C, V, accumulate);
}

void exec_cuda_lm_head_loss_backward_weight(struct exec_stream *s, float *dparams,
                                           const float *bwork, const float *saved, const float *h,
                                           const int32_t *targets, const float *params,
                                           enum kernels_lm_head_layout layout, float dloss, int T,
                                           int C, int V) {
  (void)bwork;
  if (head_fused())
    head_fused_backward(s, NULL, dparams, saved, h, targets, params, layout, dloss, T, C, V, false);
  else
    head_backward(s, NULL, dparams, saved, h, targets, params, layout, dloss, T, C, V, false);
}

/* The fused pass: one recompute per chunk for both gradients (BI then BW would make two). */
void exec_cuda_lm_head_loss_backward(struct exec_stream *s, float *dh, float *dparams, float *bwork,
                                    const float *saved, const float *h, const int32_t *targets,
                                    const float *params, enum kernels_lm_head_layout layout,
                                    float dloss, int T, int C, int V, bool accumulate) {
  (void)bwork;
  if (head_fused())
    head_fused_backward(s, dh, dparams, saved, h, targets, params, layout, dloss, T, C, V,
                        accumulate);
  else
    head_backward(s, dh, dparams, saved, h, targets, params, layout, dloss, T, C, V, accumulate);
}


void exec_cuda_tp_head_stats(struct exec_stream *s, float *stats, const float *h,
                            const int32_t *targets, const float *w,
                            enum kernels_lm_head_layout layout, int T, int C, int lo, int n) {
  int rows = head_rows(T, n);
  float *chunk = exec_cuda_stream_scratch(s, (size_t)rows * n * sizeof(float));
  for (int t0 = 0; chunk && t0 < T; t0 += rows) {
    int r = T - t0 < rows ? T - t0 : rows;
    head_logits(s, chunk, h + (size_t)t0 * C, w, layout, r, C, n);
    kc_tp_head_stats(stats, chunk, targets, t0, r, T, n, lo, exec_cuda_st_of(s));
  }
  if (chunk)
    cudaFreeAsync(chunk, exec_cuda_st_of(s));
}

void exec_cuda_tp_head_combine(struct exec_stream *s, float *loss, float *saved,
                              const float *gathered, int tp, int T) {
  float *rowloss = exec_cuda_stream_scratch(s, (size_t)T * sizeof(float));
  if (!rowloss)
    return;
  kc_tp_head_combine(loss, rowloss, saved, gathered, tp, T, exec_cuda_st_of(s));
  cudaFreeAsync(rowloss, exec_cuda_st_of(s));
}

/* The whole head's backward over the slice: its targets as the slice's columns (none outside
 * it), dh a partial sum (=, summed over the group by the caller), dw += */
void exec_cuda_tp_head_backward(struct exec_stream *s, float *dh, float *dw, const float *saved,
                               const float *h, const int32_t *targets, const float *w,
                               enum kernels_lm_head_layout layout, float dloss, int T, int C,
                               int lo, int n) {
  int32_t *local = exec_cuda_stream_scratch(s, (size_t)T * sizeof(int32_t));
  if (!local)
    return;
  kc_slice_targets(local, targets, T, lo, n, exec_cuda_st_of(s));
  head_backward(s, dh, dw, saved, h, local, w, layout, dloss, T, C, n, false);
  cudaFreeAsync(local, exec_cuda_st_of(s));
}
