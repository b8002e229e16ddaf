/* optimizer: data parallelism and the update: a gradient bucket's all-reduce or reduce-scatter
 * (ZeRO-1/2/3), the ZeRO gathers of parameters, the tied embedding's gradient sum across stages,
 * and AdamW on what this device updates. */
#include "train-impl.h"

bool exec_data_parallel(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_bucket *bk = &s->dev->buckets[x->bucket];
  struct exec_comm *comm = comm_of(s, i);
  bool ok = true;
  if (!comm)
    return internal(err, s, i, "no communicator");
  uint64_t own = bk->offset + (uint64_t)bk->rank * bk->shard; /* flat */
  float *own_p = stored(s, s->params, EXEC_STORE_PARAMS, own);
  switch (x->role) {
  case EXEC_ROLE_ALL_REDUCE:
    /* on a ZeRO-2 bucket, the copies' sum before its reduce-scatter (DualPipe): the whole
     * gradients are in the accumulator, only the shard is stored */
    CT(st, s, ok,
       exec_comm_all_reduce_f32(s->b, comm,
                                bk->sharded_grads
                                    ? exec_grad_accumulator(s, st, x->bucket)
                                    : stored(s, s->grads, EXEC_STORE_GRADS, bk->offset),
                                bk->count, err));
    break;
  case EXEC_ROLE_REDUCE_SCATTER:
    if (bk->sharded_grads) {
      /* ZeRO-2/3: the bucket's sum lands in the stored shard; the whole goes */
      CT(st, s, ok,
         exec_comm_reduce_scatter_f32(s->b, comm, exec_grad_accumulator(s, st, x->bucket),
                                      stored(s, s->grads, EXEC_STORE_GRADS, own), bk->shard, err));
      exec_grad_accumulator_release(s, x->bucket);
    } else {
      /* ZeRO-1: whole gradients stay; the shard of them this device updates is summed */
      float *tmp = exec_backend_alloc(s->b, (bk->shard ? bk->shard : 1) * sizeof(float));
      exec_mem_add(s, REPORT_MEM_COMM, (int64_t)(bk->shard * sizeof(float)));
      CT(st, s, ok,
         exec_comm_reduce_scatter_f32(s->b, comm, stored(s, s->grads, EXEC_STORE_GRADS, bk->offset),
                                      tmp, bk->shard, err));
      if (ok)
        KT(st, s,
           s->k->copy(st->stream, stored(s, s->grads, EXEC_STORE_GRADS, own), tmp,
                      bk->shard * sizeof(float)));
      exec_backend_release(s->b, tmp);
      exec_mem_add(s, REPORT_MEM_COMM, -(int64_t)(bk->shard * sizeof(float)));
    }
    break;
  case EXEC_ROLE_GATHER_UPDATE:
    CT(st, s, ok,
       exec_comm_all_gather(s->b, comm, own_p, stored(s, s->params, EXEC_STORE_PARAMS, bk->offset),
                            bk->shard * sizeof(float), err));
    break;
  case EXEC_ROLE_GATHER_USE: {
    /* the gathered parameters are the gather's plan tensor when it has one (released by the
     * memory rule: GATHER_TENSOR marks it), else freed by their last user */
    uint32_t t = exec_written_tensor(s, i, PLAN_TENSOR_OUT);
    float *buf;
    if (t != OWN_WORK) {
      buf = exec_mb_buffer(s, st, NULL, t, (bk->padded ? bk->padded : 1) * sizeof(float),
                           REPORT_MEM_GATHERED, false);
      atomic_store(&s->gathered_users[i], GATHER_TENSOR);
    } else {
      buf = exec_backend_alloc(s->b, (bk->padded ? bk->padded : 1) * sizeof(float));
      exec_mem_add(s, REPORT_MEM_GATHERED, (int64_t)(bk->padded * sizeof(float)));
      atomic_store(&s->gathered_users[i], x->gather_users);
    }
    CT(st, s, ok, exec_comm_all_gather(s->b, comm, own_p, buf, bk->shard * sizeof(float), err));
    s->gathered[i] = buf;
    break;
  }
  default: break;
  }
  return ok;
}

/* The tied embedding's copy held here (the table, or the LM head's copy of it) sums its
 * gradient with the other stage's copy, after each stage's own data-parallel sum. */
bool exec_tied_sync(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_segment *es = &xm->segs[x->segment];
  uint32_t op = x->segment == xm->embedding_seg ? xm->embedding_op : xm->head_op;
  struct exec_comm *comm = comm_of(s, i);
  if (!comm)
    return internal(err, s, i, "no communicator");
  for (uint32_t j = 0; j < es->n_ops; j++)
    if (es->ops[j].op == op) {
      bool ok = true;
      float *g = exec_grads_of(s, st, x->segment) + s->dev->op_offset[es->ops[j].op];
      CT(st, s, ok, exec_comm_all_reduce_f32(s->b, comm, g, (size_t)xm->V * (size_t)xm->C, err));
      return ok;
    }
  return internal(err, s, i, "the tied embedding's copy is not in its segment");
}

void exec_gathered_release(struct exec_state *s, uint32_t g) {
  if (atomic_load(&s->gathered_users[g]) == GATHER_TENSOR)
    return;
  if (atomic_fetch_sub(&s->gathered_users[g], 1) != 1)
    return;
  const struct exec_bucket *bk = &s->dev->buckets[s->dev->instrs[g].bucket];
  exec_backend_release(s->b, s->gathered[g]);
  s->gathered[g] = NULL;
  exec_mem_add(s, REPORT_MEM_GATHERED, -(int64_t)(bk->padded * sizeof(float)));
}

bool exec_optimizer_step(struct exec_state *s, uint32_t i, struct exec_task_ctx *st) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_device *d = s->dev;
  const struct plan *p = d->plan;
  const struct ir_segset *ss = &p->segsets[x->segset];
  const struct exec_options *o = s->o;
  GArray *tensors = g_array_new(FALSE, FALSE, sizeof(struct kernels_adamw_tensor));
  for (uint32_t j = 0; j < ss->count; j++) {
    uint32_t seg = p->segment_pool[ss->first + j];
    if (seg >= s->xm->m->n_segments || !d->holds[seg] || !d->param_local[seg])
      continue;
    uint64_t lo = d->param_offset[seg], hi = lo + d->param_local[seg];
    uint64_t ulo = lo, uhi = hi;
    const struct exec_bucket *bk =
        d->bucket_of[seg] != IR_NONE ? &d->buckets[d->bucket_of[seg]] : NULL;
    if (bk && bk->sharded_optimizer) {
      /* ZeRO: only this device's shard holds reduced gradients; update just that */
      uint64_t olo = bk->offset + (uint64_t)bk->rank * bk->shard, ohi = olo + bk->shard;
      ulo = lo > olo ? lo : olo;
      uhi = hi < ohi ? hi : ohi;
    }
    /* [ulo, uhi) lies in one bucket's shard or one whole segment: contiguous in each store.
     * Under ZeRO-3 the rest of the bucket is not stored here at all. */
    if (uhi > ulo && s->clip_scale < 1.0f)
      KT(st, s,
         s->k->scale(st->stream, stored(s, s->grads, EXEC_STORE_GRADS, ulo), s->clip_scale,
                     uhi - ulo));
    if (uhi > ulo) {
      struct kernels_adamw_tensor t = {stored(s, s->params, EXEC_STORE_PARAMS, ulo),
                                       stored(s, s->grads, EXEC_STORE_GRADS, ulo),
                                       stored(s, s->adam_m, EXEC_STORE_STATE, ulo),
                                       stored(s, s->adam_v, EXEC_STORE_STATE, ulo), uhi - ulo};
      g_array_append_val(tensors, t);
    }
  }
  /* every segment's update in one op: one launch on the cuda backend (kc_adamw_multi), the
   * same updates in the same order on the host */
  if (tensors->len)
    KT(st, s,
       s->k->adamw_multi(st->stream, (const struct kernels_adamw_tensor *)(void *)tensors->data,
                         (int)tensors->len, s->lr, o->beta1, o->beta2, o->eps, o->weight_decay,
                         (int)s->step));
  g_array_free(tensors, TRUE);
  return true;
}
