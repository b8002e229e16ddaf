/* backend_cuda_adamw: the cuda backend's optimizer entries of its kernel table
 * (backend_cuda_kernels.c): AdamW over one tensor (kc_adamw) and over every tensor of a step in
 * one launch (kc_adamw_multi), each writing the bf16 copies of the weight matrices it updates
 * (bf16 models; exec/gpu_weights.h). */
#include <stdint.h>

#include "../kernels/kernels_cuda.h"
#include "cuda-impl.h"
#include "gpu_weights.h"

static struct cuda_context *kernel_ctx(struct exec_stream *s) {
  return exec_cuda_kernel_ctx(s);
}

static cudaStream_t st_of(struct exec_stream *s) {
  return exec_cuda_st_of(s);
}

static int entry_by_address(gconstpointer a, gconstpointer b) {
  const struct exec_wcache_entry *x = *(struct exec_wcache_entry *const *)a;
  const struct exec_wcache_entry *y = *(struct exec_wcache_entry *const *)b;
  return (uintptr_t)x->ptr < (uintptr_t)y->ptr ? -1 : (uintptr_t)x->ptr > (uintptr_t)y->ptr;
}

/* The optimizer's step over params [n] for a bf16 model: the bf16 copies of the weight
 * matrices it rewrites are made by the update itself, where a matrix is compact (its copy is
 * then the same elements in the same order), and converted afterwards where it is strided or
 * overlaps one already written. A GEMM that read an old copy read the weights before this
 * update, which the plan orders before the optimizer, as it orders the fp32 weights' readers. */
struct adamw_args {
  float *params;
  const float *grads;
  float *m, *v;
  float lr, beta1, beta2, eps, weight_decay;
  int step;
};

/* The spans of one tensor's update (kc_adamw_tensor rows, onto spans): where the tensor holds
 * compact weight matrices with bf16 copies, a span per matrix that writes its copy (made:
 * their entries, to mark made once the update is enqueued) and spans without between; strided
 * or overlapping matrices go to later (converted after the update). */
static void adamw_spans(struct cuda_context *b, const struct adamw_args *a, size_t n, GArray *spans,
                        GPtrArray *made, GPtrArray *later) {
  float *params = a->params;
  GPtrArray *within = g_ptr_array_new();
  if (b->bf16_gemm)
    exec_wcache_within(&b->wcache, params, n * sizeof(float), within);
  g_ptr_array_sort(within, entry_by_address);
  size_t done = 0; /* params [0, done) spanned */
  for (guint k = 0; k < within->len; k++) {
    struct exec_wcache_entry *w = g_ptr_array_index(within, k);
    size_t at = (size_t)((const float *)w->ptr - params), len = (size_t)w->rows * w->cols;
    if (w->ld != w->cols || at < done) {
      g_ptr_array_add(later, w);
      continue;
    }
    struct kc_adamw_tensor gap = {params + done, a->grads + done, a->m + done, a->v + done, NULL,
                                  at - done, 0};
    struct kc_adamw_tensor mat = {params + at, a->grads + at, a->m + at, a->v + at, w->copy, len, 0};
    if (gap.n)
      g_array_append_val(spans, gap);
    g_array_append_val(spans, mat);
    g_ptr_array_add(made, w);
    done = at + len;
  }
  struct kc_adamw_tensor rest = {params + done, a->grads + done, a->m + done, a->v + done, NULL,
                                 n - done, 0};
  if (rest.n)
    g_array_append_val(spans, rest);
  g_ptr_array_free(within, TRUE);
}

/* After the update: the copies it wrote are made, the strided ones converted and made. */
static void adamw_copies_done(struct exec_stream *s, GPtrArray *made, GPtrArray *later) {
  struct cuda_context *b = kernel_ctx(s);
  cudaStream_t cs = st_of(s);
  GError *e = NULL;
  for (guint k = 0; k < made->len && !e; k++)
    exec_cuda_copy_made(b, g_ptr_array_index(made, k), cs, &e);
  for (guint k = 0; k < later->len && !e; k++) {
    struct exec_wcache_entry *w = g_ptr_array_index(later, k);
    kc_to_bf16(w->copy, w->ptr, w->rows, w->cols, w->ld, cs);
    exec_cuda_copy_made(b, w, cs, &e);
  }
  if (e)
    exec_cuda_fail(s, e);
}

/* The optimizer's update of params [n] is where GEMMs find their weights (bf16 models): the
 * block it lies in is a store whose matrices' bf16 copies the update itself writes once they
 * exist (weight_copy makes the first). */
static void adamw_store(struct cuda_context *b, float *params, size_t n) {
  exec_cuda_written(b, params, n * sizeof(float));
  if (!b->bf16_gemm)
    return;
  void *base = params;
  size_t bytes = n * sizeof(float);
  if (!exec_cuda_block_of(b, params, &base, &bytes))
    base = params;
  exec_wcache_add_store(&b->wcache, base, bytes);
}

void exec_cuda_adamw_step(struct exec_stream *s, float *params, const float *grads, float *m,
                         float *v, size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int step) {
  struct cuda_context *b = kernel_ctx(s);
  const struct adamw_args a = {params, grads, m, v, lr, beta1, beta2, eps, weight_decay, step};
  adamw_store(b, params, n);
  GArray *spans = g_array_new(FALSE, FALSE, sizeof(struct kc_adamw_tensor));
  GPtrArray *made = g_ptr_array_new(), *later = g_ptr_array_new();
  adamw_spans(b, &a, n, spans, made, later);
  for (guint k = 0; k < spans->len; k++) {
    const struct kc_adamw_tensor *x = &g_array_index(spans, struct kc_adamw_tensor, k);
    kc_adamw(x->params, x->grads, x->m, x->v, x->copy, x->n, lr, beta1, beta2, eps, weight_decay,
             step, st_of(s));
  }
  adamw_copies_done(s, made, later);
  g_array_free(spans, TRUE);
  g_ptr_array_free(made, TRUE);
  g_ptr_array_free(later, TRUE);
}

/* Every tensor's spans in one table (stream-ordered device scratch, its rows' first chunks
 * their prefix sums) and one launch (kc_adamw_multi): the optimizer's step costs one launch
 * instead of one per segment and weight matrix. */
void exec_cuda_adamw_multi(struct exec_stream *s, const struct kernels_adamw_tensor *tensors,
                          int n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int step) {
  struct cuda_context *b = kernel_ctx(s);
  GArray *spans = g_array_new(FALSE, FALSE, sizeof(struct kc_adamw_tensor));
  GPtrArray *made = g_ptr_array_new(), *later = g_ptr_array_new();
  for (int i = 0; i < n; i++) {
    const struct kernels_adamw_tensor *t = &tensors[i];
    const struct adamw_args a = {t->params, t->grads, t->m, t->v, lr, beta1, beta2, eps,
                                 weight_decay, step};
    adamw_store(b, t->params, t->n);
    adamw_spans(b, &a, t->n, spans, made, later);
  }
  size_t chunks = 0;
  for (guint k = 0; k < spans->len; k++) {
    struct kc_adamw_tensor *x = &g_array_index(spans, struct kc_adamw_tensor, k);
    x->first_chunk = chunks;
    chunks += (x->n + KC_ADAMW_CHUNK - 1) / KC_ADAMW_CHUNK;
  }
  size_t bytes = spans->len * sizeof(struct kc_adamw_tensor);
  struct kc_adamw_tensor *table = spans->len ? exec_cuda_stream_scratch(s, bytes) : NULL;
  GError *e = NULL;
  if (table && CUDA_CHECK(b, cudaMemcpyAsync(table, spans->data, bytes, cudaMemcpyHostToDevice,
                                             st_of(s)),
                          &e)) {
    kc_adamw_multi(table, (int)spans->len, chunks, lr, beta1, beta2, eps, weight_decay, step,
                   st_of(s));
    adamw_copies_done(s, made, later);
  } else if (e) {
    exec_cuda_fail(s, e);
  }
  if (table)
    cudaFreeAsync(table, st_of(s));
  g_array_free(spans, TRUE);
  g_ptr_array_free(made, TRUE);
  g_ptr_array_free(later, TRUE);
}
