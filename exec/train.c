/* train: what each instruction does to the training state of one device: exec_run_instr
 * dispatches it by role (a segment's forward or backward, an expert compute, an all-to-all, a
 * transfer, a data-parallel collective, the optimizer), then ends its memory and micro-batch. */
#include "train-impl.h"

bool exec_run_instr(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  bool ok = true;
  st->has_work = s->work_of && s->work_of[i] != IR_NONE;
  st->work_tensor = st->has_work ? s->work_of[i] : 0;
  st->group = 0;
  switch (x->role) {
  case EXEC_ROLE_COMPUTE: {
    bool ep = s->dev->ep_size[x->segment] > 1;
    enum bwd_mode mode = x->pass == IR_PASS_BI   ? BWD_INPUT
                         : x->pass == IR_PASS_BW ? BWD_WEIGHT
                                                 : BWD_FUSED;
    if (ep)
      ok = exec_expert_compute(s, i, mode, x->pass == IR_PASS_F || x->pass == IR_PASS_R, st, err);
    else if (x->pass == IR_PASS_F || x->pass == IR_PASS_R)
      ok = exec_segment_forward(s, i, st, err); /* R: what F dropped again, bit for bit */
    else
      ok = exec_segment_backward(s, i, mode, st, err);
    if (s->dev->tp_degree > 1) {
      /* all its communication is its TP collectives; one rank's instructions run on one
       * thread, so the table's creation cannot race */
      if (!s->tp_seconds)
        s->tp_seconds = g_new0(double, s->dev->n_instrs ? s->dev->n_instrs : 1);
      s->tp_seconds[i] = st->comm_s;
    }
    if (x->gather != IR_NONE)
      exec_gathered_release(s, x->gather);
    break;
  }
  case EXEC_ROLE_SEND:
  case EXEC_ROLE_RECV: ok = exec_transfer_group(s, i, st, err); break;
  case EXEC_ROLE_A2A_TO_EXPERT:
  case EXEC_ROLE_A2A_FROM_EXPERT: ok = exec_all_to_all(s, i, st, err); break;
  case EXEC_ROLE_ALL_REDUCE:
  case EXEC_ROLE_REDUCE_SCATTER:
  case EXEC_ROLE_GATHER_USE:
  case EXEC_ROLE_GATHER_UPDATE: ok = exec_data_parallel(s, i, st, err); break;
  case EXEC_ROLE_OPTIMIZER: ok = exec_optimizer_step(s, i, st); break;
  case EXEC_ROLE_TIED_SYNC: ok = exec_tied_sync(s, i, st, err); break;
  case EXEC_ROLE_TP: break; /* its collectives ran inside its compute (tp.c) */
  case EXEC_ROLE_CP: break; /* its exchange ran inside its attention (context_parallel.c) */
  }
  exec_instr_memory_done(s, i, st);
  if (x->mb >= 0 && atomic_fetch_sub(&s->mbs[x->mb].remaining, 1) == 1)
    exec_mb_end(s, (uint32_t)x->mb);
  return ok;
}

bool exec_instr_in_forward(const struct exec_instr *x) {
  switch (x->role) {
  case EXEC_ROLE_COMPUTE:
  case EXEC_ROLE_A2A_TO_EXPERT:
  case EXEC_ROLE_A2A_FROM_EXPERT:
  case EXEC_ROLE_GATHER_USE: return x->pass == IR_PASS_F;
  /* a point-to-point group's lead posts its forward parts alone (transfer.c) */
  case EXEC_ROLE_SEND:
  case EXEC_ROLE_RECV: return x->group_lead != IR_NONE || x->pass == IR_PASS_F;
  case EXEC_ROLE_TP:
  case EXEC_ROLE_CP: return true;
  default: return false;
  }
}

void exec_skip_instr(struct exec_state *s, uint32_t i, struct exec_task_ctx *st) {
  const struct exec_instr *x = &s->dev->instrs[i];
  if (x->role == EXEC_ROLE_COMPUTE && x->gather != IR_NONE)
    exec_gathered_release(s, x->gather); /* a backward's use of ZeRO-3's gathered parameters */
  exec_instr_memory_done(s, i, st);
  if (x->mb >= 0 && atomic_fetch_sub(&s->mbs[x->mb].remaining, 1) == 1)
    exec_mb_end(s, (uint32_t)x->mb);
}
