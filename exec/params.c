/* params: a device's training state: the parameters' deterministic initialisation, the stores
 * of parameters, gradients and AdamW moments (only this device's share, shard.c), where a
 * compute finds its parameters and puts its weight gradients, and the export of the model's. */
#include <math.h>
#include <string.h>

#include "train-impl.h"

float exec_init_param(const struct model *m, uint64_t seed, uint32_t op, uint64_t index) {
  if (op < m->n_ops && m->ops[op].kind == MODEL_OP_RMSNORM)
    return 1.0f;
  /* The LM head's copy of a tied embedding ([V, C] like the table) starts as the table. */
  if (op < m->n_ops && m->ops[op].kind == MODEL_OP_LM_HEAD_LOSS && m->tie_word_embeddings)
    for (uint32_t o = 0; o < m->n_ops; o++)
      if (m->ops[o].kind == MODEL_OP_EMBEDDING) {
        op = o;
        break;
      }
  /* a counter-based hash: each parameter's value depends only on its key */
  uint64_t key = piper_splitmix64(seed ^ 0x5049504552ull) ^ ((uint64_t)op << 40) ^ index;
  uint64_t h = piper_splitmix64(key);
  /* Box-Muller on two 24-bit uniforms in (0, 1]; std 0.02 (GPT-2's initialisation). */
  double u1 = ((double)(h >> 40) + 1.0) / 16777216.0;
  double u2 = (double)((h >> 16) & 0xffffff) / 16777216.0;
  return (float)(0.02 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t exec_model_param_total(const struct exec_model *xm) {
  uint64_t n = 0;
  for (uint32_t o = 0; o < xm->m->n_ops; o++)
    n += xm->m->ops[o].param_count;
  return n;
}

void exec_for_each_param(const struct exec_state *s, uint32_t seg, exec_param_fn fn, void *data) {
  const struct exec_segment *es = &s->xm->segs[seg];
  const struct exec_device *d = s->dev;
  uint32_t S = d->ep_size[seg];
  for (uint32_t j = 0; j < es->n_ops; j++) {
    const struct exec_seg_op *so = &es->ops[j];
    const struct model_op *op = &s->xm->m->ops[so->op];
    uint32_t tp = exec_segment_tp(d, seg);
    uint64_t n = exec_tp_op_params(s->xm, op, tp) / S;
    uint64_t first = (uint64_t)d->ep_rank[seg] * n; /* local experts start here in the op */
    uint64_t base = d->op_offset[so->op];
    /* a TP slice's elements sit where the one-device layout has them (tp.c) */
    for (uint64_t i = 0; i < n; i++)
      fn(s, so->op, base + i, exec_tp_full_index(s->xm, op, tp, d->tp_rank, first + i),
         data);
  }
}

struct fill_ctx {
  float *host;
  uint64_t seg_offset;
};

static void fill_init(const struct exec_state *s, uint32_t op, uint64_t local, uint64_t g,
                      void *data) {
  struct fill_ctx *c = data;
  c->host[c->seg_offset + local] = exec_init_param(s->xm->m, s->o->seed, op, g);
}

/* Each store holds only this device's share (shard.c): what the simulator's static memory
 * counts, byte for byte. */
bool exec_state_init_params(struct exec_state *s, GError **err) {
  const struct exec_device *d = s->dev;
  size_t n = (size_t)(d->n_params ? d->n_params : 1);
  size_t pb = (size_t)d->n_store[EXEC_STORE_PARAMS] * sizeof(float);
  size_t gb = (size_t)d->n_store[EXEC_STORE_GRADS] * sizeof(float);
  size_t ob = (size_t)d->n_store[EXEC_STORE_STATE] * sizeof(float);
  s->params = exec_backend_alloc(s->b, pb ? pb : sizeof(float));
  /* one float per micro-batch, outside the memory figures (they predate it) */
  s->loss_device = exec_backend_alloc(s->b, (d->M ? d->M : 1) * sizeof(float));
  s->grads = exec_backend_alloc(s->b, gb ? gb : sizeof(float));
  s->adam_m = exec_backend_alloc(s->b, ob ? ob : sizeof(float));
  s->adam_v = exec_backend_alloc(s->b, ob ? ob : sizeof(float));
  s->grad_acc = g_new0(float *, d->n_buckets ? d->n_buckets : 1);
  if (!s->params || !s->grads || !s->adam_m || !s->adam_v || !s->loss_device) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "rank %u: cannot allocate %zu bytes of parameters and optimizer state", d->device,
                pb + gb + 2 * ob);
    return false;
  }
  exec_mem_add(s, REPORT_MEM_PARAMS, (int64_t)pb);
  exec_mem_add(s, REPORT_MEM_GRADS, (int64_t)gb);
  exec_mem_add(s, REPORT_MEM_OPTIMIZER, 2 * (int64_t)ob);
  float *host = g_new0(float, n);
  for (uint32_t seg = 0; seg < s->xm->m->n_segments; seg++) {
    if (!d->holds[seg])
      continue;
    struct fill_ctx c = {host, d->param_offset[seg]};
    exec_for_each_param(s, seg, fill_init, &c);
  }
  float *store = g_new0(float, d->n_store[EXEC_STORE_PARAMS] + 1);
  exec_store_compact(d, EXEC_STORE_PARAMS, host, store);
  exec_backend_from_host(s->b, s->params, store, pb);
  g_free(store);
  g_free(host);
  return true;
}

bool exec_state_load_hf(struct exec_state *s, const char *dir, GError **err) {
  const struct exec_device *d = s->dev;
  size_t n = (size_t)(d->n_params ? d->n_params : 1);
  size_t pb = (size_t)d->n_store[EXEC_STORE_PARAMS] * sizeof(float);
  float *host = g_new(float, n), *store = g_new(float, d->n_store[EXEC_STORE_PARAMS] + 1);
  exec_backend_to_host(s->b, store, s->params, pb);
  exec_store_expand(d, EXEC_STORE_PARAMS, store, host, NAN);
  bool ok = exec_hf_load(s, dir, host, err);
  if (ok) {
    exec_store_compact(d, EXEC_STORE_PARAMS, host, store);
    exec_backend_from_host(s->b, s->params, store, pb);
  }
  g_free(store);
  g_free(host);
  return ok;
}

float *exec_grad_accumulator(struct exec_state *s, struct exec_task_ctx *st, uint32_t b) {
  const struct exec_bucket *bk = &s->dev->buckets[b];
  if (!s->grad_acc[b]) {
    size_t bytes = (bk->padded ? bk->padded : 1) * sizeof(float);
    s->grad_acc[b] = exec_backend_alloc(s->b, bytes);
    exec_mem_add(s, REPORT_MEM_COMM, (int64_t)(bk->padded * sizeof(float)));
    s->k->fill(st ? st->stream : exec_backend_setup_stream(s->b), s->grad_acc[b], 0.0f,
               bk->padded ? bk->padded : 1);
  }
  return s->grad_acc[b];
}

void exec_grad_accumulator_release(struct exec_state *s, uint32_t b) {
  if (!s->grad_acc[b])
    return;
  exec_backend_release(s->b, s->grad_acc[b]);
  s->grad_acc[b] = NULL;
  exec_mem_add(s, REPORT_MEM_COMM, -(int64_t)(s->dev->buckets[b].padded * sizeof(float)));
}

const float *exec_params_of(struct exec_state *s, const struct exec_instr *x) {
  const struct exec_device *d = s->dev;
  if (x->gather != IR_NONE) {
    const struct exec_bucket *bk = &d->buckets[d->instrs[x->gather].bucket];
    return (const float *)s->gathered[x->gather] + (d->param_offset[x->segment] - bk->offset);
  }
  return stored(s, s->params, EXEC_STORE_PARAMS, d->param_offset[x->segment]);
}

float *exec_grads_of(struct exec_state *s, struct exec_task_ctx *st, uint32_t seg) {
  const struct exec_device *d = s->dev;
  uint32_t b = d->bucket_of[seg];
  if (b != IR_NONE && d->buckets[b].sharded_grads)
    return exec_grad_accumulator(s, st, b) + (d->param_offset[seg] - d->buckets[b].offset);
  return stored(s, s->grads, EXEC_STORE_GRADS, d->param_offset[seg]);
}

void exec_state_free_params(struct exec_state *s) {
  if (!s->b)
    return;
  exec_backend_release(s->b, s->params);
  exec_backend_release(s->b, s->grads);
  exec_backend_release(s->b, s->adam_m);
  exec_backend_release(s->b, s->adam_v);
  exec_backend_release(s->b, s->loss_device);
  for (uint32_t b = 0; s->grad_acc && b < s->dev->n_buckets; b++)
    exec_grad_accumulator_release(s, b);
  g_free(s->grad_acc);
  s->grad_acc = NULL;
  s->params = s->grads = s->adam_m = s->adam_v = s->loss_device = NULL;
}

bool exec_param_current(const struct exec_state *s, uint32_t seg, uint64_t local) {
  const struct exec_device *d = s->dev;
  uint32_t b = d->bucket_of[seg];
  if (b == IR_NONE || !d->buckets[b].sharded_params)
    return true;
  const struct exec_bucket *bk = &d->buckets[b];
  uint64_t flat = d->param_offset[seg] + local, lo = bk->offset + (uint64_t)bk->rank * bk->shard;
  return flat >= lo && flat < lo + bk->shard;
}

struct export_ctx {
  const float *host;
  float *full;
  bool *held;
  uint32_t seg;
  const uint64_t *op_offset; /* global (model order) offset of each op's parameters */
};

static void export_one(const struct exec_state *s, uint32_t op, uint64_t local, uint64_t g,
                       void *data) {
  struct export_ctx *c = data;
  if (!exec_param_current(s, c->seg, local))
    return;
  c->full[c->op_offset[op] + g] = c->host[s->dev->param_offset[c->seg] + local];
  c->held[c->op_offset[op] + g] = true;
}

void exec_params_export(const struct exec_state *s, float *full, bool *held, uint64_t n_full) {
  const struct exec_device *d = s->dev;
  memset(full, 0, n_full * sizeof(float));
  memset(held, 0, n_full * sizeof(bool));
  size_t n = (size_t)(d->n_params ? d->n_params : 1);
  float *host = g_new(float, n), *store = g_new(float, d->n_store[EXEC_STORE_PARAMS] + 1);
  exec_backend_to_host(s->b, store, s->params, d->n_store[EXEC_STORE_PARAMS] * sizeof(float));
  exec_store_expand(d, EXEC_STORE_PARAMS, store, host, NAN);
  g_free(store);
  const struct model *m = s->xm->m;
  uint64_t *op_offset = g_new(uint64_t, m->n_ops + 1);
  op_offset[0] = 0;
  for (uint32_t o = 0; o < m->n_ops; o++)
    op_offset[o + 1] = op_offset[o] + m->ops[o].param_count;
  for (uint32_t seg = 0; seg < m->n_segments; seg++) {
    if (!d->holds[seg])
      continue;
    struct export_ctx c = {host, full, held, seg, op_offset};
    exec_for_each_param(s, seg, export_one, &c);
  }
  g_free(op_offset);
  g_free(host);
}
