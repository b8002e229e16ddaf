/* memory: the executor's device memory, as the plan's memory rule has it: the byte figures, the
 * pool of freed buffers, each buffer's owner (a plan tensor, the running instruction or the
 * micro-batch) and its release, and each micro-batch's own state. */
#include <math.h>
#include <string.h>

#include "train-impl.h"

/* ---- the figures and the pool of freed buffers ----------------------------------------------- */

void exec_mem_add(struct exec_state *s, enum report_mem_kind k, int64_t bytes) {
  g_mutex_lock(&s->mem_lock);
  s->mem[k] = (uint64_t)((int64_t)s->mem[k] + bytes);
  uint64_t total = 0;
  for (int i = 0; i < REPORT_MEM_KIND_COUNT; i++)
    total += s->mem[i];
  if (total > s->mem_peak) {
    s->mem_peak = total;
    memcpy(s->mem_peak_breakdown, s->mem, sizeof s->mem);
  }
  g_mutex_unlock(&s->mem_lock);
}

void *exec_pool_get(struct exec_state *s, size_t bytes) {
  void *p = NULL;
  g_mutex_lock(&s->pool_lock);
  GPtrArray *free_list = s->pool ? g_hash_table_lookup(s->pool, GSIZE_TO_POINTER(bytes)) : NULL;
  if (free_list && free_list->len)
    p = g_ptr_array_steal_index_fast(free_list, free_list->len - 1);
  g_mutex_unlock(&s->pool_lock);
  if (!p)
    p = exec_backend_alloc(s->b, bytes);
  return p;
}

void exec_pool_put(struct exec_state *s, void *p, size_t bytes) {
  /* a backend that only enqueues may still run the buffer's last kernels: release hands it
   * out again only after the work enqueued before (the cache would hand it out now) */
  if (exec_backend_enqueues(s->b)) {
    exec_backend_release(s->b, p);
    return;
  }
  g_mutex_lock(&s->pool_lock);
  if (!s->pool)
    s->pool = g_hash_table_new(g_direct_hash, g_direct_equal);
  GPtrArray *free_list = g_hash_table_lookup(s->pool, GSIZE_TO_POINTER(bytes));
  if (!free_list) {
    free_list = g_ptr_array_new();
    g_hash_table_insert(s->pool, GSIZE_TO_POINTER(bytes), free_list);
  }
  g_ptr_array_add(free_list, p);
  g_mutex_unlock(&s->pool_lock);
}

void exec_pool_clear(struct exec_state *s) {
  if (!s->pool)
    return;
  GHashTableIter it;
  gpointer key, value;
  g_hash_table_iter_init(&it, s->pool);
  while (g_hash_table_iter_next(&it, &key, &value)) {
    GPtrArray *free_list = value;
    for (guint i = 0; i < free_list->len; i++)
      exec_backend_release(s->b, g_ptr_array_index(free_list, i));
    g_ptr_array_free(free_list, TRUE);
  }
  g_hash_table_destroy(s->pool);
  s->pool = NULL;
}

/* ---- the memory rule ----------------------------------------------------------------------
 *
 * Every device buffer has an owner: a plan tensor (allocated while its producer runs, released
 * when the plan's release point and every consumer have ended: struct plan_tensor), the running
 * instruction (its workspace, released when it ends), or, for the state the plan has no tensor
 * for yet, the micro-batch (released with it: the expert-parallel dispatch's routing tables and
 * rows, which the backward all-to-alls read). The figures count these real allocations as they
 * are made and released. What the CPU alone reads (pointer tables, counts) is host memory and
 * not in the device's figures. */

static void block_release(struct exec_state *s, const struct exec_block *blk) {
  if (blk->host) {
    g_free(blk->p);
    return;
  }
  exec_mem_add(s, blk->kind, -(int64_t)blk->bytes);
  exec_pool_put(s, blk->p, blk->bytes);
}

static void blocks_release(struct exec_state *s, GArray *blocks) {
  for (guint k = 0; blocks && k < blocks->len; k++)
    block_release(s, &g_array_index(blocks, struct exec_block, k));
  if (blocks)
    g_array_set_size(blocks, 0);
}

/* The figures' kind of plan tensor t, by its producer, as the simulator counts it: what
 * compute writes is activations, a gather's output gathered parameters, the rest (received,
 * exchanged by an all-to-all) communication buffers. */
static enum report_mem_kind tensor_kind(const struct exec_state *s, uint32_t t) {
  const struct exec_instr *x = &s->dev->instrs[s->dev->cls->tensors[t].producer];
  switch (x->role) {
  case EXEC_ROLE_COMPUTE:
  case EXEC_ROLE_OPTIMIZER: return REPORT_MEM_ACTIVATIONS;
  case EXEC_ROLE_GATHER_USE: return REPORT_MEM_GATHERED;
  default: return REPORT_MEM_COMM;
  }
}

/* Where a backend that places tensors puts a workspace block of group g in its tensor's slot:
 * from the slot's top what stays for the whole instruction and the odd groups, from its start
 * the even ones. A group's blocks all go at its end, so each side starts over where a group
 * that holds the gradient its predecessor reads (the other side's) allocates again. */
static uint32_t work_place(const struct exec_task_ctx *st, uint32_t group) {
  bool top = group == EXEC_GROUP_STAY || (group & 1);
  return st->work_tensor | (top ? EXEC_TENSOR_SLOT_TOP : 0);
}

void *exec_mb_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                     uint32_t owner, size_t bytes, enum report_mem_kind kind, bool zero) {
  size_t n = (bytes + 15) & ~(size_t)15;
  if (!n)
    n = 16;
  uint32_t group = owner == OWN_STAY ? EXEC_GROUP_STAY : st ? st->group : 0;
  if (owner == OWN_STAY)
    owner = OWN_WORK;
  /* a backend that only enqueues keeps no pool (exec_pool_put); it is told whose buffer a
   * plan tensor's is, so it can place it where its offline plan put it (the cuda arena): the
   * running instruction's workspace blocks too, in its workspace tensor's slot, one after
   * the other from either end (work_place) */
  uint32_t place = owner == OWN_WORK && st && st->has_work ? work_place(st, group) : owner;
  void *p = place < OWN_MB && exec_backend_enqueues(s->b)
                ? exec_backend_alloc_tensor(s->b, place, n)
                : exec_pool_get(s, n);
  struct exec_block blk = {p, n, kind, false, group};
  struct exec_stream *stream = st ? st->stream : exec_backend_setup_stream(s->b);
  if (zero)
    s->k->fill(stream, blk.p, 0.0f, n / sizeof(float));
  else if (s->poison)
    s->k->fill(stream, blk.p, NAN, n / sizeof(float));
  if (owner == OWN_WORK && st) {
    if (!st->work)
      st->work = g_array_new(FALSE, FALSE, sizeof(struct exec_block));
    g_array_append_val(st->work, blk);
  } else if (owner == OWN_WORK || owner == OWN_MB) {
    g_mutex_lock(&mb->lock);
    g_array_append_val(mb->allocs, blk);
    mb->bytes += n;
    g_mutex_unlock(&mb->lock);
  } else {
    blk.kind = tensor_kind(s, owner);
    g_mutex_lock(&s->tensor_lock);
    g_array_append_val(s->tensors[owner].blocks, blk);
    g_mutex_unlock(&s->tensor_lock);
  }
  exec_mem_add(s, blk.kind, (int64_t)n);
  return blk.p;
}

static void forget_tp_buffer(float **buf, const void *p) {
  if (*buf == p)
    *buf = NULL;
}

void exec_work_group_end(struct exec_state *s, struct exec_task_ctx *st, uint32_t group) {
  if (!st->work)
    return;
  guint kept = 0;
  for (guint k = 0; k < st->work->len; k++) {
    struct exec_block blk = g_array_index(st->work, struct exec_block, k);
    if (blk.group != group) {
      g_array_index(st->work, struct exec_block, kept++) = blk;
      continue;
    }
    struct exec_tp_bufs *tb = &st->tp;
    forget_tp_buffer(&tb->sum, blk.p);
    forget_tp_buffer(&tb->input, blk.p);
    forget_tp_buffer(&tb->dout, blk.p);
    forget_tp_buffer(&tb->shard, blk.p);
    forget_tp_buffer(&tb->norm, blk.p);
    block_release(s, &blk);
  }
  g_array_set_size(st->work, kept);
}

void *exec_mb_host(struct exec_state *s, struct exec_mb *mb, size_t bytes,
                   enum report_mem_kind kind) {
  (void)s;
  size_t n = (bytes + 15) & ~(size_t)15;
  struct exec_block blk = {g_malloc0(n ? n : 16), n ? n : 16, kind, true, 0};
  g_mutex_lock(&mb->lock);
  g_array_append_val(mb->allocs, blk);
  g_mutex_unlock(&mb->lock);
  return blk.p;
}

uint32_t exec_written_tensor(const struct exec_state *s, uint32_t i, enum plan_tensor_kind k) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++)
    if (c->tensors[c->writes[in->write_first + w]].kind == k)
      return c->writes[in->write_first + w];
  return OWN_WORK;
}

uint32_t exec_bi_only_tensor(const struct exec_state *s, uint32_t i) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  uint32_t n_saved = 0, found = OWN_WORK;
  for (uint32_t w = 0; w < in->write_count; w++) {
    uint32_t t = c->writes[in->write_first + w];
    const struct plan_tensor *pt = &c->tensors[t];
    if (pt->kind != PLAN_TENSOR_SAVED)
      continue;
    n_saved++;
    bool weights = false;
    for (uint32_t k = 0; k < pt->consumer_count; k++)
      weights |= s->dev->instrs[c->consumers[pt->consumer_first + k]].pass == IR_PASS_BW;
    if (!weights)
      found = t;
  }
  return n_saved >= 2 ? found : OWN_WORK;
}

/* The model edge through which consumer j of something instruction i writes reads it. */
static uint32_t consumer_edge(const struct exec_state *s, uint32_t i, uint32_t j) {
  const struct exec_instr *x = &s->dev->instrs[i], *y = &s->dev->instrs[j];
  if (y->role != EXEC_ROLE_COMPUTE)
    return y->edge;
  if (x->role != EXEC_ROLE_COMPUTE)
    return x->edge;
  uint32_t a = x->segment < y->segment ? x->segment : y->segment;
  uint32_t b = x->segment < y->segment ? y->segment : x->segment;
  return exec_model_edge(s->xm, a, b);
}

bool exec_is_tp_buffer(const struct exec_state *s, const struct plan_tensor *pt) {
  const struct plan_class *c = s->dev->cls;
  return pt->consumer_count > 0 &&
         s->dev->instrs[c->consumers[pt->consumer_first]].role == EXEC_ROLE_TP;
}

uint32_t exec_out_tensor_of(const struct exec_state *s, uint32_t i, enum exec_tensor t,
                            bool exact) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  uint32_t first = OWN_WORK;
  for (uint32_t w = 0; w < in->write_count; w++) {
    uint32_t tid = c->writes[in->write_first + w];
    const struct plan_tensor *pt = &c->tensors[tid];
    if (pt->kind != PLAN_TENSOR_OUT || exec_is_tp_buffer(s, pt))
      continue;
    if (first == OWN_WORK)
      first = tid;
    for (uint32_t k = 0; k < pt->consumer_count; k++) {
      uint32_t e = consumer_edge(s, i, c->consumers[pt->consumer_first + k]);
      if (e != IR_NONE && (s->xm->edge_mask[e] & EXEC_BIT(t)))
        return tid;
    }
  }
  if (exact)
    return OWN_WORK;
  return first == OWN_WORK ? OWN_MB : first;
}

uint32_t exec_a2a_out_tensor(const struct exec_state *s, uint32_t i, bool experts) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  uint32_t seg = s->dev->instrs[i].segment;
  for (uint32_t w = 0; w < in->write_count; w++) {
    uint32_t tid = c->writes[in->write_first + w];
    const struct plan_tensor *pt = &c->tensors[tid];
    for (uint32_t k = 0; pt->kind == PLAN_TENSOR_OUT && k < pt->consumer_count; k++) {
      const struct exec_instr *y = &s->dev->instrs[c->consumers[pt->consumer_first + k]];
      if ((y->segment == seg) == experts)
        return tid;
    }
  }
  return OWN_MB;
}

/* One of tensor t's last uses has ended (a consumer, or its release point): the last one
 * releases its buffers. */
static void tensor_use_done(struct exec_state *s, uint32_t t) {
  if (atomic_fetch_sub(&s->tensors[t].left, 1) != 1)
    return;
  g_mutex_lock(&s->tensor_lock);
  blocks_release(s, s->tensors[t].blocks);
  g_mutex_unlock(&s->tensor_lock);
}

/* Receive j is issued (its stream is free, it waits for nothing): its buffers are allocated
 * now, as the plan's alloc point says, not when the event loop gets to run it. Receives of a
 * point-to-point group and those of no plan tensor allocate when they run. */
static void recv_issue(struct exec_state *s, uint32_t j, struct exec_task_ctx *st) {
  const struct exec_instr *x = &s->dev->instrs[j];
  const struct exec_model *xm = s->xm;
  if (x->role != EXEC_ROLE_RECV || x->group_lead != IR_NONE || x->mb < 0 ||
      s->dev->cls->instrs[j].wait_count > 0)
    return;
  for (int t = 0; t < TC; t++) {
    uint32_t owner = exec_out_tensor_of(s, j, (enum exec_tensor)t, true);
    if (!(xm->edge_mask[x->edge] & EXEC_BIT(t)) || owner == OWN_WORK ||
        s->recv_ready[slot_of(j, t)])
      continue;
    size_t words = x->pass == IR_PASS_F ? exec_tensor_words(xm, (enum exec_tensor)t)
                                        : exec_grad_floats(xm, (enum exec_tensor)t);
    s->recv_ready[slot_of(j, t)] = mb_raw(s, st, &s->mbs[x->mb], owner, words * 4, REPORT_MEM_COMM);
  }
}

void exec_instr_memory_done(struct exec_state *s, uint32_t i, struct exec_task_ctx *st) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  if (st->work) {
    blocks_release(s, st->work);
    g_array_free(st->work, TRUE);
    st->work = NULL;
  }
  for (uint32_t k = 0; k < in->read_count; k++)
    tensor_use_done(s, c->reads[in->read_first + k]);
  for (uint32_t k = s->release_first[i]; k < s->release_first[i + 1]; k++)
    tensor_use_done(s, s->release_list[k]);
  if (s->next_on_stream[i] != IR_NONE)
    recv_issue(s, s->next_on_stream[i], st);
}

void exec_step_memory_begin(struct exec_state *s) {
  const struct plan_class *c = s->dev->cls;
  if (!s->tensors) {
    g_mutex_init(&s->tensor_lock);
    s->tensors = g_new0(struct exec_tensor_rt, c->n_tensors + 1);
    for (uint32_t t = 0; t < c->n_tensors; t++)
      s->tensors[t].blocks = g_array_new(FALSE, FALSE, sizeof(struct exec_block));
    struct plan_memory_event *ev = NULL;
    uint32_t n = plan_class_memory_events(c, &ev);
    s->release_first = g_new0(uint32_t, c->n_instrs + 1);
    s->release_list = g_new(uint32_t, c->n_tensors + 1);
    uint32_t r = 0;
    for (uint32_t k = 0; k < n; k++)
      if (ev[k].release) {
        s->release_first[ev[k].instr + 1]++;
        s->release_list[r++] = ev[k].tensor; /* events come by instruction */
      }
    for (uint32_t i = 0; i < c->n_instrs; i++)
      s->release_first[i + 1] += s->release_first[i];
    g_free(ev);
    s->work_of = g_new(uint32_t, c->n_instrs + 1);
    for (uint32_t i = 0; i <= c->n_instrs; i++)
      s->work_of[i] = IR_NONE;
    for (uint32_t t = 0; t < c->n_tensors; t++)
      if (c->tensors[t].kind == PLAN_TENSOR_WORK && c->tensors[t].producer < c->n_instrs)
        s->work_of[c->tensors[t].producer] = t;
    s->recv_ready = g_new0(float *, (size_t)c->n_instrs * TC + 1);
    s->next_on_stream = g_new(uint32_t, c->n_instrs + 1);
    for (uint32_t st = 0; st < s->dev->plan->n_streams; st++)
      for (uint32_t e = c->stream_first[st]; e < c->stream_first[st + 1]; e++)
        s->next_on_stream[c->stream_instrs[e]] =
            e + 1 < c->stream_first[st + 1] ? c->stream_instrs[e + 1] : IR_NONE;
  }
  for (uint32_t t = 0; t < c->n_tensors; t++)
    atomic_store(&s->tensors[t].left, c->tensors[t].consumer_count + 1);
}

void exec_step_memory_issue(struct exec_state *s) {
  const struct plan_class *c = s->dev->cls;
  for (uint32_t st = 0; st < s->dev->plan->n_streams; st++)
    if (c->stream_first[st + 1] > c->stream_first[st])
      recv_issue(s, c->stream_instrs[c->stream_first[st]], NULL);
}

void exec_step_memory_end(struct exec_state *s) {
  if (!s->tensors)
    return;
  for (uint32_t i = 0; i < s->dev->n_instrs; i++)
    if (atomic_load(&s->gathered_users[i]) == GATHER_TENSOR) {
      s->gathered[i] = NULL; /* its tensor's block: released below or already */
      atomic_store(&s->gathered_users[i], 0);
    }
  g_mutex_lock(&s->tensor_lock);
  for (uint32_t t = 0; t < s->dev->cls->n_tensors; t++)
    blocks_release(s, s->tensors[t].blocks);
  g_mutex_unlock(&s->tensor_lock);
  memset(s->recv_ready, 0, ((size_t)s->dev->cls->n_instrs * TC + 1) * sizeof(float *));
}

void exec_memory_free(struct exec_state *s) {
  if (!s->tensors)
    return;
  exec_step_memory_end(s);
  for (uint32_t t = 0; t < s->dev->cls->n_tensors; t++)
    g_array_free(s->tensors[t].blocks, TRUE);
  g_clear_pointer(&s->tensors, g_free);
  g_clear_pointer(&s->release_first, g_free);
  g_clear_pointer(&s->release_list, g_free);
  g_clear_pointer(&s->work_of, g_free);
  g_clear_pointer(&s->recv_ready, g_free);
  g_clear_pointer(&s->next_on_stream, g_free);
  g_clear_pointer(&s->tp_seconds, g_free);
  g_mutex_clear(&s->tensor_lock);
}

void exec_mb_begin(struct exec_state *s, uint32_t k) {
  const struct exec_model *xm = s->xm;
  const struct model *m = xm->m;
  struct exec_mb *mb = &s->mbs[k];
  if (!mb->allocs) {
    g_mutex_init(&mb->lock);
    mb->allocs = g_array_new(FALSE, FALSE, sizeof(struct exec_block));
  }
  uint32_t ns = m->n_segments, ne = m->n_edges ? m->n_edges : 1;
  mb->out = g_new0(float *, (size_t)ns *TC);
  mb->in_val = g_new0(float *, (size_t)ne *TC);
  mb->grad = g_new0(float *, (size_t)ne *TC);
  mb->seg = g_new0(struct exec_seg_run *, ns);
  mb->moe = g_new0(struct exec_moe *, ns);
  mb->loss = 0;
  mb->has_loss = false;
  atomic_store(&mb->remaining, s->dev->mb_instr_count[k]);
  mb->global_index = s->dev->dp_rank * s->dev->M + k;
  /* tokens and targets of this micro-batch: its place in the global batch of this step */
  size_t T = (size_t)xm->T;
  /* on the device only where an op reads them: the embedding's and the head's forwards copy
   * them into their saved activations */
  mb->tokens_host = exec_mb_host(s, mb, T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  mb->targets_host = exec_mb_host(s, mb, T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  uint64_t block = exec_cp_data_block(s->dev, s->step, k);
  exec_cp_batch(s->data, s->dev, block, xm->batch, xm->seq, mb->tokens_host, mb->targets_host);
  mb->tokens = mb->targets = NULL;
}

void exec_mb_end(struct exec_state *s, uint32_t k) {
  struct exec_mb *mb = &s->mbs[k];
  if (!mb->allocs || !mb->out)
    return;
  g_mutex_lock(&mb->lock);
  blocks_release(s, mb->allocs);
  mb->bytes = 0;
  g_mutex_unlock(&mb->lock);
  g_free(mb->out);
  g_free(mb->in_val);
  g_free(mb->grad);
  g_free(mb->seg);
  g_free(mb->moe);
  mb->out = mb->in_val = mb->grad = NULL;
  mb->seg = NULL;
  mb->moe = NULL;
  mb->tokens = mb->targets = NULL;
  mb->tokens_host = mb->targets_host = NULL;
}
