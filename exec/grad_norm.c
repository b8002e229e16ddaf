/* grad_norm: the global L2 norm of the step's gradients, for clipping and the step line.
 * Every gradient element of the model is counted once in the job, on the device that holds
 * its reduced value: a data-parallel bucket's element by the group member whose shard it is
 * in (that part is summed there under every ZeRO level, and all-reduced everywhere without
 * one), an op that tensor parallelism does not divide (a norm, the router: the same gradient
 * on every TP rank) by TP rank 0 alone, the tied embedding by its table and not by the LM
 * head's copy of it (the tied sync gave both the same sum). Experts are held by one EP rank
 * each. So the sum of every rank's share is the one-device sum of squares. */
#include "train-impl.h"

/* Adds grads[lo, hi) (flat indices of this device) to *sum, the part this device owns. */
static void add_range(struct exec_state *s, struct exec_stream *stream, double *sum, uint32_t seg,
                      uint64_t lo, uint64_t hi) {
  const struct exec_device *d = s->dev;
  if (d->bucket_of[seg] != IR_NONE) {
    const struct exec_bucket *bk = &d->buckets[d->bucket_of[seg]];
    uint64_t olo = bk->offset + (uint64_t)bk->rank * bk->shard, ohi = olo + bk->shard;
    lo = lo > olo ? lo : olo;
    hi = hi < ohi ? hi : ohi;
  }
  if (hi <= lo)
    return;
  uint64_t at = exec_store_index(d, EXEC_STORE_GRADS, lo);
  PIPER_ASSERT(at != EXEC_NOT_STORED); /* the owned part is stored (and contiguous) here */
  s->k->sum_squares(stream, sum, s->grads + at, (size_t)(hi - lo));
}

/* Whether op's gradient here is a copy another device counts. */
static bool counted_elsewhere(const struct exec_state *s, uint32_t seg, uint32_t op) {
  const struct exec_model *xm = s->xm;
  const struct exec_device *d = s->dev;
  if (xm->tied_copy && seg == xm->head_seg && op == xm->head_op)
    return true;
  return d->tp_degree > 1 && d->tp_rank != 0 && !exec_tp_divided(xm->m->ops[op].kind);
}

void exec_grad_sum_squares(struct exec_state *s, struct exec_stream *stream, double *sum) {
  const struct exec_device *d = s->dev;
  const struct exec_model *xm = s->xm;
  for (uint32_t seg = 0; seg < xm->m->n_segments; seg++) {
    if (!d->holds[seg] || !d->param_local[seg])
      continue;
    const struct exec_segment *es = &xm->segs[seg];
    uint64_t base = d->param_offset[seg], end = base + d->param_local[seg];
    for (uint32_t j = 0; j < es->n_ops; j++) {
      uint32_t op = es->ops[j].op;
      /* an op's block runs to the next op's (ops lie in order in the segment's block) */
      uint64_t lo = base + d->op_offset[op];
      uint64_t hi = j + 1 < es->n_ops ? base + d->op_offset[es->ops[j + 1].op] : end;
      if (hi > lo && !counted_elsewhere(s, seg, op))
        add_range(s, stream, sum, seg, lo, hi);
    }
  }
}
