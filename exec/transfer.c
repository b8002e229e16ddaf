/* transfer: pipeline transfers: a send or receive of the tensors a model edge carries (values
 * in the forward, their gradients in the backward), alone or as a part of a point-to-point
 * group. */
#include "train-impl.h"

static bool transfer(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_comm *comm = comm_of(s, i);
  bool fwd = x->pass == IR_PASS_F, ok = true;
  if (!comm)
    return internal(err, s, i, "no communicator");
  for (int t = 0; t < TC && ok; t++) {
    if (!(xm->edge_mask[x->edge] & EXEC_BIT(t)))
      continue;
    size_t words = fwd ? exec_tensor_words(xm, (enum exec_tensor)t)
                       : exec_grad_floats(xm, (enum exec_tensor)t);
    size_t slot = (size_t)x->edge * TC + (size_t)t;
    if (x->role == EXEC_ROLE_SEND) {
      const float *buf = fwd ? mb->out[(size_t)xm->m->edges[x->edge].src * TC + t] : mb->grad[slot];
      if (!buf)
        return internal(err, s, i, "sends data that was never computed");
      CT(st, s, ok, exec_comm_send(s->b, comm, x->peer, buf, words * 4, x->tag, err));
    } else {
      float *buf = s->recv_ready[slot_of(i, t)];
      s->recv_ready[slot_of(i, t)] = NULL;
      if (!buf)
        buf = mb_raw(s, st, mb, out_tensor(s, i, (enum exec_tensor)t), words * 4, REPORT_MEM_COMM);
      CT(st, s, ok, exec_comm_recv(s->b, comm, x->peer, buf, words * 4, x->tag, err));
      if (fwd)
        mb->in_val[slot] = buf;
      else
        mb->grad[slot] = buf;
    }
  }
  return ok;
}

/* Appends the messages of instruction i, a part of a point-to-point group, to parts, and for
 * each the slot that takes a receive's buffer once the group is done (NULL for a send). */
static bool group_collect(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GArray *parts,
                          GPtrArray *slots, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_comm *comm = comm_of(s, i);
  bool fwd = x->pass == IR_PASS_F;
  if (!comm)
    return internal(err, s, i, "no communicator");
  for (int t = 0; t < TC; t++) {
    if (!(xm->edge_mask[x->edge] & EXEC_BIT(t)))
      continue;
    size_t words = fwd ? exec_tensor_words(xm, (enum exec_tensor)t)
                       : exec_grad_floats(xm, (enum exec_tensor)t);
    size_t slot = (size_t)x->edge * TC + (size_t)t;
    struct exec_p2p_part part = {comm, x->peer, x->role == EXEC_ROLE_SEND, NULL, words * 4, x->tag};
    float **dest = NULL;
    if (part.is_send) {
      part.buf = fwd ? mb->out[(size_t)xm->m->edges[x->edge].src * TC + t] : mb->grad[slot];
      if (!part.buf)
        return internal(err, s, i, "sends data that was never computed");
    } else {
      part.buf =
          mb_raw(s, st, mb, out_tensor(s, i, (enum exec_tensor)t), words * 4, REPORT_MEM_COMM);
      dest = fwd ? &mb->in_val[slot] : &mb->grad[slot];
    }
    g_array_append_val(parts, part);
    g_ptr_array_add(slots, dest);
  }
  return true;
}

/* A part of a point-to-point group: the first part's task issues every part's messages as one
 * group (exec_comm_p2p_group: posted together, one wait, the task suspended once) and ends when
 * the last has met its peer, so whatever waits on any part finds the whole group done; the
 * other parts' tasks do nothing and complete with it. Parts go in link_group's order. */
bool exec_transfer_group(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  if (x->group_lead == IR_NONE)
    return transfer(s, i, st, err);
  if (x->group_lead != i)
    return true;
  GArray *parts = g_array_new(FALSE, FALSE, sizeof(struct exec_p2p_part));
  GPtrArray *slots = g_ptr_array_new();
  bool ok = true;
  for (uint32_t k = x->group_head; k != IR_NONE && ok; k = s->dev->instrs[k].group_next)
    if (!s->forward_only || s->dev->instrs[k].pass == IR_PASS_F)
      ok = group_collect(s, k, st, parts, slots, err);
  if (ok && parts->len)
    CT(st, s, ok,
       exec_comm_p2p_group(s->b, (const struct exec_p2p_part *)(void *)parts->data, parts->len,
                           err));
  for (uint32_t k = 0; ok && k < slots->len; k++)
    if (slots->pdata[k])
      *(float **)slots->pdata[k] = g_array_index(parts, struct exec_p2p_part, k).buf;
  g_ptr_array_free(slots, TRUE);
  g_array_free(parts, TRUE);
  return ok;
}
