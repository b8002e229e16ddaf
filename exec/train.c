/* train: what each instruction does to the training state of one device: a segment's forward,
 * fused backward, or its BI and BW halves (op by op, through the backend's kernel table), the
 * expert-parallel dispatch and combine around an expert segment, point-to-point transfers of a
 * model edge, gradient buckets, ZeRO gathers and AdamW.
 *
 * Inside a segment every tensor version is a value (SSA): ops read values and write new ones,
 * so the backward finds each op's inputs as the forward saw them. Memory follows the plan's
 * rule (ir/plan.h, "the memory rule" below): a forward keeps in its saved tensor exactly what
 * its backward reads, outputs live in the tensors that carry them until their last reader,
 * everything else only while its instruction runs. */
#include <math.h>
#include <string.h>

#include "../base/json.h"
#include "exec-impl.h"

#define TC EXEC_T_COUNT

/* ---- memory ------------------------------------------------------------------------------ */

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
#define OWN_WORK IR_NONE
#define OWN_MB (IR_NONE - 1u)
/* exec_state.gathered_users of a gather whose buffer is its plan tensor's */
#define GATHER_TENSOR UINT32_MAX

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

/* A device buffer (never NULL, even for 0 bytes) owned by `owner`: zeroed when asked, else with
 * undefined contents (NaN under poisoning, so a kernel that reads what it did not write, or a
 * buffer used after its release, shows up in the equivalence tests). */
static void *mb_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                       uint32_t owner, size_t bytes, enum report_mem_kind kind, bool zero) {
  size_t n = (bytes + 15) & ~(size_t)15;
  if (!n)
    n = 16;
  /* a backend that only enqueues keeps no pool (exec_pool_put); it is told whose buffer a
   * plan tensor's is, so it can place it where its offline plan put it (the cuda arena): the
   * running instruction's workspace blocks too, in its workspace tensor's slot, one after
   * the other */
  uint32_t place = owner == OWN_WORK && st && st->has_work ? st->work_tensor : owner;
  void *p = place < OWN_MB && exec_backend_enqueues(s->b)
                ? exec_backend_alloc_tensor(s->b, place, n)
                : exec_pool_get(s, n);
  struct exec_block blk = {p, n, kind, false};
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

/* Host memory of the micro-batch, zeroed: what the CPU reads (pointer tables, expert-parallel
 * state, all-to-all counts). Not device memory, so not in the figures. */
static void *mb_host(struct exec_state *s, struct exec_mb *mb, size_t bytes,
                     enum report_mem_kind kind) {
  (void)s;
  size_t n = (bytes + 15) & ~(size_t)15;
  struct exec_block blk = {g_malloc0(n ? n : 16), n ? n : 16, kind, true};
  g_mutex_lock(&mb->lock);
  g_array_append_val(mb->allocs, blk);
  g_mutex_unlock(&mb->lock);
  return blk.p;
}

/* Device floats written in full before they are read. */
static float *mb_floats_raw(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                            uint32_t owner, size_t n) {
  return mb_buffer(s, st, mb, owner, n * sizeof(float), REPORT_MEM_ACTIVATIONS, false);
}

/* Device floats, zeroed. */
static float *mb_floats(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                        uint32_t owner, size_t n) {
  return mb_buffer(s, st, mb, owner, n * sizeof(float), REPORT_MEM_ACTIVATIONS, true);
}

static void *mb_raw(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                    uint32_t owner, size_t bytes, enum report_mem_kind kind) {
  return mb_buffer(s, st, mb, owner, bytes, kind, false);
}

/* The tensor of kind k instruction i writes (the first), or OWN_WORK. */
static uint32_t written_tensor(const struct exec_state *s, uint32_t i, enum plan_tensor_kind k) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  for (uint32_t w = 0; w < in->write_count; w++)
    if (c->tensors[c->writes[in->write_first + w]].kind == k)
      return c->writes[in->write_first + w];
  return OWN_WORK;
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

/* The buffer of a compute's TP collectives: the tensor its TP node reads (tp_buffer). */
static bool is_tp_buffer(const struct exec_state *s, const struct plan_tensor *pt) {
  const struct plan_class *c = s->dev->cls;
  return pt->consumer_count > 0 &&
         s->dev->instrs[c->consumers[pt->consumer_first]].role == EXEC_ROLE_TP;
}

/* The plan tensor that carries value t out of instruction i: an "out" tensor whose consumer
 * reads t through its edge (else, unless exact, i's first "out" tensor); OWN_WORK (exact) or
 * OWN_MB when there is none. */
static uint32_t out_tensor_of(const struct exec_state *s, uint32_t i, enum exec_tensor t,
                              bool exact) {
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  uint32_t first = OWN_WORK;
  for (uint32_t w = 0; w < in->write_count; w++) {
    uint32_t tid = c->writes[in->write_first + w];
    const struct plan_tensor *pt = &c->tensors[tid];
    if (pt->kind != PLAN_TENSOR_OUT || is_tp_buffer(s, pt))
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

static uint32_t out_tensor(const struct exec_state *s, uint32_t i, enum exec_tensor t) {
  return out_tensor_of(s, i, t, false);
}

/* The "out" tensor of all-to-all i read by the expert segment's instructions (experts true) or
 * by the other side's; OWN_MB when there is none. */
static uint32_t a2a_out_tensor(const struct exec_state *s, uint32_t i, bool experts) {
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

static size_t slot_of(uint32_t i, int t) {
  return (size_t)i * TC + (size_t)t;
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
    uint32_t owner = out_tensor_of(s, j, (enum exec_tensor)t, true);
    if (!(xm->edge_mask[x->edge] & EXEC_BIT(t)) || owner == OWN_WORK || s->recv_ready[slot_of(j, t)])
      continue;
    size_t words = x->pass == IR_PASS_F ? exec_tensor_words(xm, (enum exec_tensor)t)
                                        : exec_grad_floats(xm, (enum exec_tensor)t);
    s->recv_ready[slot_of(j, t)] =
        mb_raw(s, st, &s->mbs[x->mb], owner, words * 4, REPORT_MEM_COMM);
  }
}

/* Instruction i has ended: its workspace goes, and what it was the last use of. */
static void instr_memory_done(struct exec_state *s, uint32_t i, struct exec_task_ctx *st) {
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
  mb->tokens_host = mb_host(s, mb, T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  mb->targets_host = mb_host(s, mb, T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  uint64_t block = (uint64_t)(s->step - 1) * s->dev->dp_degree * s->dev->M + mb->global_index;
  exec_data_batch(s->data, block, xm->batch, xm->seq, mb->tokens_host, mb->targets_host);
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

/* ---- parameters -------------------------------------------------------------------------- */

/* splitmix64: a counter-based hash, so each parameter's value depends only on its key. */
static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

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
  uint64_t h = mix(mix(seed ^ 0x5049504552ull) ^ ((uint64_t)op << 40) ^ index);
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

/* Calls fn(local index, global index) for every parameter of segment seg held here. */
static void for_each_param(const struct exec_state *s, uint32_t seg,
                           void (*fn)(const struct exec_state *, uint32_t op, uint64_t local,
                                      uint64_t global_in_op, void *),
                           void *data) {
  const struct exec_segment *es = &s->xm->segs[seg];
  const struct exec_device *d = s->dev;
  uint32_t S = d->ep_size[seg];
  for (uint32_t j = 0; j < es->n_ops; j++) {
    const struct exec_seg_op *so = &es->ops[j];
    const struct model_op *op = &s->xm->m->ops[so->op];
    uint64_t n = exec_tp_op_params(s->xm, op, d->tp_degree) / S;
    uint64_t first = (uint64_t)d->ep_rank[seg] * n; /* local experts start here in the op */
    uint64_t base = d->op_offset[so->op];
    /* a TP slice's elements sit where the one-device layout has them (tp.c) */
    for (uint64_t i = 0; i < n; i++)
      fn(s, so->op, base + i, exec_tp_full_index(s->xm, op, d->tp_degree, d->tp_rank, first + i),
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
    for_each_param(s, seg, fill_init, &c);
  }
  float *store = g_new0(float, d->n_store[EXEC_STORE_PARAMS] + 1);
  exec_store_compact(d, EXEC_STORE_PARAMS, host, store);
  exec_backend_from_host(s->b, s->params, store, pb);
  g_free(store);
  g_free(host);
  return true;
}

/* Where flat index `flat` of a store lives on the device; it must be stored here. */
static float *stored(const struct exec_state *s, float *base, enum exec_store which,
                     uint64_t flat) {
  uint64_t at = exec_store_index(s->dev, which, flat);
  PIPER_ASSERT(at != EXEC_NOT_STORED);
  return base + at;
}

/* The gradient accumulator of bucket b under ZeRO-2/3, made (zeroed) by its first weight
 * gradient of the step. Counted as communication memory: it is the reduce-scatter's input,
 * and after it only the shard stays. One rank's instructions run on one host thread (the
 * backend's event loop), so the first use cannot race. */
static float *grad_accumulator(struct exec_state *s, struct exec_task_ctx *st, uint32_t b) {
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

static void grad_accumulator_release(struct exec_state *s, uint32_t b) {
  if (!s->grad_acc[b])
    return;
  exec_backend_release(s->b, s->grad_acc[b]);
  s->grad_acc[b] = NULL;
  exec_mem_add(s, REPORT_MEM_COMM, -(int64_t)(s->dev->buckets[b].padded * sizeof(float)));
}

/* Where segment seg's weight gradients accumulate. */
static float *grads_of(struct exec_state *s, struct exec_task_ctx *st, uint32_t seg) {
  const struct exec_device *d = s->dev;
  uint32_t b = d->bucket_of[seg];
  if (b != IR_NONE && d->buckets[b].sharded_grads)
    return grad_accumulator(s, st, b) + (d->param_offset[seg] - d->buckets[b].offset);
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
    grad_accumulator_release(s, b);
  g_free(s->grad_acc);
  s->grad_acc = NULL;
  s->params = s->grads = s->adam_m = s->adam_v = s->loss_device = NULL;
}

/* Whether this device holds a current copy of element `local` of segment seg: everywhere but
 * outside its own shard under ZeRO-3 (the rest is stale until the next gather). */
static bool current(const struct exec_state *s, uint32_t seg, uint64_t local) {
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
  if (!current(s, c->seg, local))
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
    for_each_param(s, seg, export_one, &c);
  }
  g_free(op_offset);
  g_free(host);
}

/* ---- segments ---------------------------------------------------------------------------- */

/* The expert op of a segment run on one device (no expert parallelism): dispatch, experts,
 * combine all local. */
struct local_moe {
  int32_t *counts, *route_row, *row_expert;
  float *rows, *y, *scratch;
};

struct exec_seg_run {
  float **val, **dval;
  float **saved, **bwork;
  struct local_moe **moe;
  /* per op: an attention's lse and y where selective recomputation keeps them apart from
   * its saved q, k, v (kernels_attention_dims.core); NULL: inside saved */
  float **core;
  /* per value: the copy of an input that a forward under full recomputation keeps for its
   * rerun (the only thing it keeps); NULL elsewhere */
  float **kept_in;
  /* a forward under full recomputation: its values went with its workspace */
  bool dropped;
};

/* Expert-parallel state of one micro-batch at one expert segment. */
struct exec_moe {
  uint32_t S, rank;
  int e_first, e_count;
  uint32_t in_edge;
  int32_t *send_counts, *recv_counts; /* host memory [S] */
  size_t n_recv, cap; /* rows received; rows every buffer of them holds (the plan's capacity) */
  const int32_t *ids;
  const float *weights;
  int32_t *route_row, *send_expert, *recv_expert;
  float *send_rows, *recv_rows, *y_recv, *y_send, *saved, *bwork, *scratch;
  float *dy_recv, *drows_recv;
  bool rerun; /* routed by the rerun's own dispatch (full recomputation, pass R) */
};

#define KT(st, s, call)                                                                            \
  do {                                                                                             \
    double kt0_ = exec_backend_clock((s)->b);                                                      \
    call;                                                                                          \
    (st)->kernel_s += exec_backend_clock((s)->b) - kt0_;                                           \
  } while (0)

#define CT(st, s, ok, call)                                                                        \
  do {                                                                                             \
    double ct0_ = exec_backend_clock((s)->b);                                                      \
    ok = (call);                                                                                   \
    (st)->comm_s += exec_backend_clock((s)->b) - ct0_;                                             \
  } while (0)

static bool internal(GError **err, const struct exec_state *s, uint32_t i, const char *what) {
  char nb[256];
  plan_node_name(s->dev->plan, s->dev->instrs[i].node, nb, sizeof nb);
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "rank %u: instruction %u \"%s\": %s",
              s->dev->device, i, nb, what);
  return false;
}

/* Input tensor t of model edge e for this micro-batch: computed here, or received. Which one
 * is a property of the micro-batch, not of the segment: DualPipe runs a segment here for some
 * micro-batches and on another device for the others. */
static float *edge_value(struct exec_state *s, struct exec_mb *mb, uint32_t e, enum exec_tensor t) {
  float *local = mb->out[(size_t)s->xm->m->edges[e].src * TC + t];
  return local ? local : mb->in_val[(size_t)e * TC + t];
}

static const float *params_of(struct exec_state *s, const struct exec_instr *x) {
  const struct exec_device *d = s->dev;
  if (x->gather != IR_NONE) {
    const struct exec_bucket *bk = &d->buckets[d->instrs[x->gather].bucket];
    return (const float *)s->gathered[x->gather] + (d->param_offset[x->segment] - bk->offset);
  }
  return stored(s, s->params, EXEC_STORE_PARAMS, d->param_offset[x->segment]);
}

/* Whether the segment's backward reads value v (so the forward keeps it in its saved
 * activations): an input of a norm, attention, MLP, router or head (their weight gradients,
 * and the norm's input gradient, need it), the routing of the local experts, the router's
 * output. */
static bool value_kept(const struct exec_segment *es, int32_t v) {
  for (uint32_t j = 0; j < es->n_ops; j++) {
    const struct exec_seg_op *so = &es->ops[j];
    switch (so->kind) {
    case MODEL_OP_RMSNORM:
    case MODEL_OP_ATTENTION:
    case MODEL_OP_MLP:
    case MODEL_OP_SHARED_EXPERT:
    case MODEL_OP_LM_HEAD_LOSS:
      if (so->in[0] == v)
        return true;
      break;
    case MODEL_OP_ROUTER:
      if (so->in[0] == v || so->out == v)
        return true;
      break;
    case MODEL_OP_EXPERT_FFN:
      if (so->in[1] == v)
        return true;
      break;
    default: break;
    }
  }
  return false;
}

/* Where forward instruction i keeps value v: with its saved activations when the backward
 * reads it, in the tensor that carries it on when it leaves the segment, else in the
 * instruction's workspace. */
static uint32_t value_owner(const struct exec_state *s, uint32_t i, const struct exec_segment *es,
                            int32_t v, uint32_t saved) {
  if (value_kept(es, v))
    return saved;
  enum exec_tensor t = (enum exec_tensor)es->values[v].tensor;
  if (es->final_value[t] == v)
    return out_tensor_of(s, i, t, true); /* OWN_WORK when nothing reads it on */
  return OWN_WORK;
}

/* How a forward instruction keeps what its backward reads (ir_node.recompute, docs/directives.md):
 * plainly; under full recomputation F keeps only copies of its inputs and R rebuilds the rest;
 * under selective both keep all but the attention core, which F drops and R reruns alone. */
enum fwd_keep { FWD_PLAIN, FWD_FULL_DROP, FWD_FULL_RERUN, FWD_SELECTIVE_DROP, FWD_SELECTIVE_RERUN };

static enum fwd_keep fwd_keep_of(const struct exec_state *s, const struct exec_instr *x) {
  enum ir_recompute rc = s->dev->plan->nodes[x->node].recompute;
  bool rerun = x->pass == IR_PASS_R;
  if (rc == IR_RECOMPUTE_FULL)
    return rerun ? FWD_FULL_RERUN : FWD_FULL_DROP;
  if (rc == IR_RECOMPUTE_SELECTIVE)
    return rerun ? FWD_SELECTIVE_RERUN : FWD_SELECTIVE_DROP;
  return FWD_PLAIN;
}

/* The owner of what instruction i saves for a backward: its saved tensor, or the micro-batch
 * where the plan has none on this device. */
static uint32_t saved_owner(const struct exec_state *s, uint32_t i) {
  uint32_t t = written_tensor(s, i, PLAN_TENSOR_SAVED);
  return t == OWN_WORK ? OWN_MB : t;
}

/* The run tables of a segment's forward, and its inputs: those the backward reads are copied
 * into the saved activations (the tensor that brought them goes after its last reader). Under
 * full recomputation F copies every input into `keep` too, for R; R (from: F's run) reads
 * them there. */
static struct exec_seg_run *seg_run_begin(struct exec_state *s, uint32_t i,
                                          struct exec_task_ctx *st, uint32_t saved, uint32_t keep,
                                          const struct exec_seg_run *from) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  const struct exec_segment *es = &s->xm->segs[x->segment];
  struct exec_seg_run *run = mb_host(s, mb, sizeof *run, REPORT_MEM_ACTIVATIONS);
  run->val = mb_host(s, mb, es->n_values * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->dval = mb_host(s, mb, es->n_values * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->kept_in = mb_host(s, mb, es->n_values * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->saved = mb_host(s, mb, es->n_ops * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->bwork = mb_host(s, mb, es->n_ops * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->core = mb_host(s, mb, es->n_ops * sizeof(float *), REPORT_MEM_ACTIVATIONS);
  run->moe = mb_host(s, mb, es->n_ops * sizeof(struct local_moe *), REPORT_MEM_ACTIVATIONS);
  for (uint32_t v = 0; v < es->n_values; v++) {
    if (es->values[v].op >= 0)
      continue;
    enum exec_tensor t = (enum exec_tensor)es->values[v].tensor;
    float *in = from ? from->kept_in[v] : edge_value(s, mb, es->values[v].edge, t);
    size_t n = exec_tensor_words(s->xm, t) * sizeof(float);
    if (in && keep != OWN_WORK) {
      run->kept_in[v] = mb_floats_raw(s, st, mb, keep, n / sizeof(float));
      KT(st, s, s->k->copy(st->stream, run->kept_in[v], in, n));
    }
    if (in && value_kept(es, (int32_t)v)) {
      float *copy = mb_floats_raw(s, st, mb, saved, n / sizeof(float));
      KT(st, s, s->k->copy(st->stream, copy, in, n));
      in = copy;
    }
    run->val[v] = in;
  }
  return run;
}

/* The segment's final values, for the instructions that read them. One the backward also
 * reads lives in the saved activations; the tensor that carries it on gets its own copy, so
 * that each goes at its own release point. */
static void seg_outputs(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                        struct exec_seg_run *run) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_segment *es = &s->xm->segs[x->segment];
  struct exec_mb *mb = &s->mbs[x->mb];
  for (int t = 0; t < TC; t++) {
    int32_t v = es->final_value[t];
    if (v < 0)
      continue;
    float *val = run->val[v];
    uint32_t out = out_tensor_of(s, i, (enum exec_tensor)t, true);
    if (out != OWN_WORK && es->values[v].op >= 0 && value_kept(es, v)) {
      size_t n = exec_tensor_words(s->xm, (enum exec_tensor)t);
      val = mb_floats_raw(s, st, mb, out, n);
      KT(st, s, s->k->copy(st->stream, val, run->val[v], n * sizeof(float)));
    }
    mb->out[(size_t)x->segment * TC + t] = val;
  }
}

/* ---- tensor parallelism (tp.c) ------------------------------------------------------------ */

/* Attention's dimensions as this device runs it: heads / tp of each kind. */
static struct kernels_attention_dims attention_dims(const struct exec_state *s,
                                                    const struct model_op *op) {
  struct kernels_attention_dims dd = exec_attention_dims(s->xm, op);
  dd.heads /= (int)s->dev->tp_degree;
  dd.kv_heads /= (int)s->dev->tp_degree;
  return dd;
}

/* Each expert's intermediate size as this device runs it (its gate / up columns, down rows). */
static int expert_width(const struct exec_state *s) {
  return s->xm->F_expert / (int)s->dev->tp_degree;
}

/* The MLP's intermediate size as this device runs it. */
static int mlp_width(const struct exec_state *s, const struct model_op *op) {
  return (int)op->shape[2] / (int)s->dev->tp_degree;
}

/* A rerun under full recomputation computes only what its backward reads: an op runs when it
 * saves something or a later running op reads its output, so a layer's last residual add does
 * not; the embedding (its token ids) and a local MoE (its routing and rows) run but skip the
 * lookup and the combine when nothing reads them. Returns needed[n_values] (value v is
 * computed) followed by runs[n_ops]. */
static bool *rerun_needed(const struct exec_segment *es) {
  bool *needed = g_new0(bool, es->n_values + es->n_ops + 1), *runs = needed + es->n_values;
  for (uint32_t v = 0; v < es->n_values; v++)
    needed[v] = value_kept(es, (int32_t)v);
  for (int32_t j = (int32_t)es->n_ops - 1; j >= 0; j--) {
    const struct exec_seg_op *so = &es->ops[j];
    runs[j] = so->kind != MODEL_OP_RESIDUAL_ADD || (so->out >= 0 && needed[so->out]);
    for (int q = 0; q < 3 && runs[j]; q++)
      if (so->in[q] >= 0)
        needed[so->in[q]] = true;
  }
  return needed;
}

/* One forward (or rerun) of a segment: the op loop's shared state. */
struct fwd {
  struct exec_state *s;
  struct exec_task_ctx *st;
  struct exec_mb *mb;
  const struct exec_segment *es;
  struct exec_seg_run *run;
  const float *P;
  uint32_t i, saved; /* owner of what the backward reads (OWN_WORK: F under full) */
  enum fwd_keep keep;
  const bool *needed; /* a full rerun's (rerun_needed); NULL: every value */
};

static void fwd_attention(struct fwd *f, uint32_t j, float *out, const float *in0,
                          const float *prm) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  struct kernels_attention_dims dd = attention_dims(s, &s->xm->m->ops[f->es->ops[j].op]);
  size_t all = kernels_attention_saved_floats(&dd), core = kernels_attention_core_floats(&dd);
  if (f->keep == FWD_SELECTIVE_DROP) { /* q, k, v saved; lse and y only while F runs */
    f->run->saved[j] = mb_floats_raw(s, st, f->mb, f->saved, all - core);
    dd.core = f->run->core[j] = mb_floats_raw(s, st, f->mb, OWN_WORK, core);
  } else {
    f->run->saved[j] = mb_floats_raw(s, st, f->mb, f->saved, all);
  }
  KT(st, s, s->k->attention_forward(st->stream, out, f->run->saved[j], in0, prm, &dd));
}

/* The experts on one device: dispatch, experts, combine (no combine in a rerun that does not
 * need its output). */
static void fwd_local_moe(struct fwd *f, uint32_t j, float *out, const float *in0, const float *in1,
                          const float *prm) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = f->mb;
  const struct exec_model *xm = s->xm;
  int T = xm->T, C = xm->C, E = xm->E, K = xm->K, TK = T * K, F = expert_width(s);
  uint32_t saved = f->saved;
  struct local_moe *lm = mb_host(s, mb, sizeof *lm, REPORT_MEM_ACTIVATIONS);
  f->run->moe[j] = lm;
  /* the backward reads the routing and the experts' outputs (the weights' gradient) */
  lm->counts = mb_raw(s, st, mb, OWN_WORK, sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  lm->route_row = mb_raw(s, st, mb, saved, (size_t)TK * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  lm->row_expert = mb_raw(s, st, mb, saved, (size_t)TK * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  lm->rows = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C);
  lm->y = mb_floats_raw(s, st, mb, saved, (size_t)TK * C);
  lm->scratch = mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats(TK, C));
  f->run->saved[j] = mb_floats_raw(s, st, mb, saved, kernels_expert_ffn_saved_floats(TK, C, F));
  const int32_t *ids = (const int32_t *)in1;
  const float *weights = in1 + TK;
  KT(st, s, k->moe_dispatch_plan(st->stream, lm->counts, lm->route_row, ids, T, K, E, 1));
  KT(st, s,
     k->moe_dispatch_forward(st->stream, lm->rows, lm->row_expert, in0, ids, lm->route_row, T, K,
                             C));
  KT(st, s,
     k->expert_ffn_forward(st->stream, lm->y, f->run->saved[j], lm->scratch, lm->rows,
                           lm->row_expert, TK, prm, 0, E, C, F));
  if (out)
    KT(st, s, k->moe_combine_forward(st->stream, out, lm->y, weights, lm->route_row, T, K, C));
}

static void fwd_lm_head(struct fwd *f, uint32_t j, const float *in0, const float *prm) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = f->mb;
  int T = xm->T, C = xm->C, V = xm->V;
  f->run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_lm_head_loss_saved_floats(T, V));
  mb->targets = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  exec_backend_from_host(s->b, mb->targets, mb->targets_host, (size_t)T * sizeof(int32_t));
  const float *w = xm->tied ? f->P + s->dev->op_offset[f->es->ops[0].op] : prm;
  float *loss = s->loss_device + f->s->dev->instrs[f->i].mb, loss_host = 0;
  KT(st, s,
     s->k->lm_head_loss_forward(
         st->stream, loss, f->run->saved[j], in0, mb->targets, w,
         xm->tied || xm->tied_copy ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED, T, C, V));
  exec_backend_to_host(s->b, &loss_host, loss, sizeof loss_host);
  mb->loss = loss_host; /* a rerun's is the same, bit for bit */
  mb->has_loss = true;
}

/* The [T, C] buffer instruction i's TP collectives run in: the plan tensor its TP node reads,
 * made on first use (the instruction's workspace where the plan has none). */
static float *tp_buffer(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                        uint32_t i, float **buf) {
  if (*buf)
    return *buf;
  const struct plan_class *c = s->dev->cls;
  const struct plan_instr *in = &c->instrs[i];
  uint32_t owner = OWN_WORK;
  for (uint32_t w = 0; w < in->write_count; w++) {
    uint32_t tid = c->writes[in->write_first + w];
    if (c->tensors[tid].kind == PLAN_TENSOR_OUT && is_tp_buffer(s, &c->tensors[tid]))
      owner = tid;
  }
  *buf = mb_floats_raw(s, st, mb, owner, (size_t)s->xm->T * (size_t)s->xm->C);
  return *buf;
}

/* Value src [T_seq, C], a sequence shard under SP, gathered whole into *slot [T, C]. */
static const float *tp_gathered(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                                float **slot, const float *src, GError **err) {
  size_t n = (size_t)s->xm->T_seq * (size_t)s->xm->C;
  if (!*slot)
    *slot = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)s->xm->T * (size_t)s->xm->C);
  return exec_tp_all_gather(s, st, src, *slot, n, err) ? *slot : NULL;
}

/* A slice's partial result in buf [T, C], summed over the TP group, then into dst (= or +=):
 * all of it, or under SP this device's sequence shard (a reduce-scatter). */
static bool tp_sum_into(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                        float *dst, bool acc, GError **err) {
  struct exec_tp_bufs *tb = &st->tp;
  size_t n = (size_t)s->xm->T_seq * (size_t)s->xm->C;
  float *buf = tb->sum, *sum = buf;
  if (s->dev->sequence_parallel) {
    if (acc && !tb->shard)
      tb->shard = mb_floats_raw(s, st, mb, OWN_WORK, n);
    sum = acc ? tb->shard : dst;
    if (!exec_tp_reduce_scatter(s, st, buf, sum, n, err))
      return false;
  } else if (!exec_tp_all_reduce(s, st, buf, n, err)) {
    return false;
  }
  if (acc)
    KT(st, s, s->k->add(st->stream, dst, sum, n));
  else if (sum != dst)
    KT(st, s, s->k->copy(st->stream, dst, sum, n * sizeof(float)));
  return true;
}

/* Forward of divided op j under TP: this rank's slice into the collectives' buffer, summed
 * over the group into the op's output (the LM head sums only its row statistics). */
static bool tp_forward_op(struct fwd *f, uint32_t j, GError **err) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  struct exec_tp_bufs *tb = &st->tp;
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = f->mb;
  struct exec_seg_run *run = f->run;
  const struct exec_seg_op *so = &f->es->ops[j];
  const struct model_op *op = &xm->m->ops[so->op];
  const float *prm = f->P + s->dev->op_offset[so->op];
  const float *in0 = so->in[0] >= 0 ? run->val[so->in[0]] : NULL;
  int T = xm->T;
  float *buf = tp_buffer(s, st, mb, f->i, &tb->sum);
  if (s->dev->sequence_parallel && in0 && !(in0 = tp_gathered(s, st, mb, &tb->input, in0, err)))
    return false;
  switch (so->kind) {
  case MODEL_OP_EMBEDDING:
    mb->tokens = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
    exec_backend_from_host(s->b, mb->tokens, mb->tokens_host, (size_t)T * sizeof(int32_t));
    KT(st, s, exec_tp_embedding_forward(s, st->stream, buf, mb->tokens, prm));
    break;
  case MODEL_OP_ATTENTION: fwd_attention(f, j, buf, in0, prm); break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: {
    int F = mlp_width(s, op);
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_mlp_saved_floats(T, F));
    KT(st, s, s->k->mlp_forward(st->stream, buf, run->saved[j], in0, prm, T, xm->C, F));
    break;
  }
  case MODEL_OP_EXPERT_FFN:
    /* the whole sequence's routing (the router runs on it under SP too, fwd_op); the partial
     * outputs summed over the group after the combine, as the plan's one [T, hidden] all-reduce */
    fwd_local_moe(f, j, buf, in0, run->val[so->in[1]], prm);
    break;
  case MODEL_OP_LM_HEAD_LOSS: {
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_lm_head_loss_saved_floats(T, xm->V));
    mb->targets = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
    exec_backend_from_host(s->b, mb->targets, mb->targets_host, (size_t)T * sizeof(int32_t));
    const float *w = xm->tied ? f->P + s->dev->op_offset[f->es->ops[0].op] : prm;
    /* the row statistics gathered in the collectives' buffer (exec_tp_device_init: 3 tp <= C) */
    float *loss = s->loss_device + s->dev->instrs[f->i].mb, loss_host = 0;
    if (!exec_tp_head_forward(s, st, buf, loss, run->saved[j], in0, mb->targets, w,
                              xm->tied || xm->tied_copy, err))
      return false;
    exec_backend_to_host(s->b, &loss_host, loss, sizeof loss_host);
    mb->loss = loss_host; /* a rerun's is the same, bit for bit */
    mb->has_loss = s->dev->tp_rank == 0; /* every TP peer has it; the step sums one */
    return true;
  }
  default: return internal(err, s, f->i, "op kind without a tensor-parallel kernel");
  }
  return tp_sum_into(s, st, mb, run->val[so->out], false, err);
}

/* Op j of the forward f. */
static bool fwd_op(struct fwd *f, uint32_t j, GError **err) {
  struct exec_state *s = f->s;
  struct exec_task_ctx *st = f->st;
  const struct exec_kernels *k = s->k;
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = f->mb;
  struct exec_seg_run *run = f->run;
  const struct exec_seg_op *so = &f->es->ops[j];
  const float *prm = f->P + s->dev->op_offset[so->op];
  int T = xm->T, C = xm->C, V = xm->V, K = xm->K, E = xm->E, Ts = xm->T_seq;
  float *out = NULL;
  bool tp = s->dev->tp_degree > 1 && exec_tp_divided(so->kind);
  /* only the embedding's lookup and the combine can be left out; the other kernels (and the
   * TP collectives) write their output whether read or not */
  bool optional = !tp && (so->kind == MODEL_OP_EMBEDDING || so->kind == MODEL_OP_EXPERT_FFN);
  if (so->out >= 0 && (!f->needed || f->needed[so->out] || !optional))
    out = run->val[so->out] =
        mb_floats_raw(s, st, mb, value_owner(s, f->i, f->es, so->out, f->saved),
                      exec_tensor_words(xm, (enum exec_tensor)f->es->values[so->out].tensor));
  const float *in0 = so->in[0] >= 0 ? run->val[so->in[0]] : NULL;
  const float *in1 = so->in[1] >= 0 ? run->val[so->in[1]] : NULL;
  const float *in2 = so->in[2] >= 0 ? run->val[so->in[2]] : NULL;
  if (tp)
    return tp_forward_op(f, j, err);
  switch (so->kind) {
  case MODEL_OP_EMBEDDING:
    mb->tokens = mb_raw(s, st, mb, f->saved, (size_t)T * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
    exec_backend_from_host(s->b, mb->tokens, mb->tokens_host, (size_t)T * sizeof(int32_t));
    if (out)
      KT(st, s, k->embedding_forward(st->stream, out, mb->tokens, prm, T, V, C));
    return true;
  case MODEL_OP_RMSNORM:
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_rmsnorm_saved_floats(Ts));
    KT(st, s,
       k->rmsnorm_forward(st->stream, out, run->saved[j], in0, prm, Ts, C, xm->rms_norm_eps));
    return true;
  case MODEL_OP_ATTENTION: fwd_attention(f, j, out, in0, prm); return true;
  case MODEL_OP_RESIDUAL_ADD: {
    size_t n = (size_t)Ts * C;
    KT(st, s, k->copy(st->stream, out, in0, n * sizeof(float)));
    KT(st, s, k->residual_add_forward(st->stream, out, in1, n));
    if (in2)
      KT(st, s, k->residual_add_forward(st->stream, out, in2, n));
    return true;
  }
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: {
    int F = (int)xm->m->ops[so->op].shape[2];
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_mlp_saved_floats(T, F));
    KT(st, s, k->mlp_forward(st->stream, out, run->saved[j], in0, prm, T, C, F));
    return true;
  }
  case MODEL_OP_ROUTER:
    /* under SP on the whole sequence: every TP rank's expert slices read every token's route */
    if (s->dev->sequence_parallel && !(in0 = tp_gathered(s, st, mb, &st->tp.input, in0, err)))
      return false;
    run->saved[j] = mb_floats_raw(s, st, mb, f->saved, kernels_router_saved_floats(T, E));
    KT(st, s,
       k->router_forward(st->stream, (int32_t *)out, out + T * K, run->saved[j], in0, prm, T, C, E,
                         K));
    return true;
  case MODEL_OP_EXPERT_FFN:
    if (s->dev->ep_size[s->dev->instrs[f->i].segment] > 1)
      return internal(err, s, f->i, "expert op outside EP path");
    fwd_local_moe(f, j, out, in0, in1, prm);
    return true;
  case MODEL_OP_LM_HEAD_LOSS: fwd_lm_head(f, j, in0, prm); return true;
  default: return internal(err, s, f->i, "op kind without a host kernel");
  }
}

/* Selective recomputation's rerun: each attention core again from the q, k and v its forward
 * kept, into R's saved tensor; everything else the forward kept stays as it is. */
static bool seg_rerun_cores(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                            GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  const struct exec_segment *es = &s->xm->segs[x->segment];
  struct exec_seg_run *run = mb->seg[x->segment];
  if (!run)
    return internal(err, s, i, "a rerun before its forward");
  uint32_t saved = saved_owner(s, i);
  for (uint32_t j = 0; j < es->n_ops; j++) {
    if (es->ops[j].kind != MODEL_OP_ATTENTION)
      continue;
    struct kernels_attention_dims dd = attention_dims(s, &s->xm->m->ops[es->ops[j].op]);
    dd.core = run->core[j] = mb_floats_raw(s, st, mb, saved, kernels_attention_core_floats(&dd));
    KT(st, s, s->k->attention_core_forward(st->stream, run->saved[j], &dd));
  }
  return true;
}

/* A segment's forward F, or its rerun R under full recomputation: the same ops on the same
 * inputs, so R's values are F's bit for bit. */
static bool seg_forward(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  struct fwd f = {.s = s, .st = st, .mb = mb, .es = &s->xm->segs[x->segment], .i = i};
  f.keep = fwd_keep_of(s, x);
  if ((f.keep == FWD_SELECTIVE_DROP || f.keep == FWD_SELECTIVE_RERUN) &&
      !s->k->attention_core_forward)
    return internal(err, s, i, "selective recomputation needs the backend's attention core kernel");
  if (f.keep == FWD_SELECTIVE_RERUN)
    return seg_rerun_cores(s, i, st, err);
  const struct exec_seg_run *from = NULL;
  uint32_t keep = OWN_WORK;
  f.saved = saved_owner(s, i);
  if (f.keep == FWD_FULL_DROP) { /* only the inputs, for R */
    keep = f.saved;
    f.saved = OWN_WORK;
  } else if (f.keep == FWD_FULL_RERUN) {
    from = mb->seg[x->segment];
    if (!from || !from->dropped)
      return internal(err, s, i, "a rerun before its forward");
  }
  f.run = seg_run_begin(s, i, st, f.saved, keep, from);
  f.run->dropped = f.keep == FWD_FULL_DROP;
  mb->seg[x->segment] = f.run;
  for (uint32_t v = 0; v < f.es->n_values; v++)
    if (f.es->values[v].op < 0 && !f.run->val[v])
      return internal(err, s, i, "an input of the segment has not arrived");
  f.P = params_of(s, x);
  bool *needed = f.keep == FWD_FULL_RERUN ? rerun_needed(f.es) : NULL;
  f.needed = needed;
  bool ok = true;
  for (uint32_t j = 0; j < f.es->n_ops && ok; j++)
    if (!needed || needed[f.es->n_values + j])
      ok = fwd_op(&f, j, err);
  g_free(needed);
  if (ok && f.keep != FWD_FULL_RERUN) /* R's outputs: the next segments have theirs */
    seg_outputs(s, i, st, f.run);
  return ok;
}

enum bwd_mode { BWD_FUSED, BWD_INPUT, BWD_WEIGHT };

/* One segment's backward (or its BI or BW half) on one micro-batch. */
struct bwd {
  struct exec_state *s;
  struct exec_task_ctx *st;
  const struct exec_kernels *k;
  const struct exec_model *xm;
  struct exec_mb *mb;
  struct exec_seg_run *run;
  const struct exec_segment *es;
  enum bwd_mode mode;
  const float *P; /* the segment's parameters (NULL for BW: it needs none) */
  float *G;       /* and their gradients */
  float dloss;    /* the loss gradient's scale: one over the global batch's micro-batches */
  uint32_t i;     /* the instruction */
  uint32_t keep;  /* owner of what BW reads: BI's saved tensor, or the workspace (B, BW) */
};

/* Where the gradient of value v goes: an input's leaves the segment in the tensor that
 * carries it back; the others are the instruction's, or kept for BW after a BI. */
static uint32_t grad_owner(const struct bwd *b, int32_t v) {
  const struct exec_value *val = &b->es->values[v];
  if (val->op < 0)
    return out_tensor(b->s, b->i, (enum exec_tensor)val->tensor);
  return b->keep;
}

static float *dval_out(struct bwd *b, int32_t v) {
  struct exec_seg_run *run = b->run;
  if (!run->dval[v])
    run->dval[v] = mb_floats(b->s, b->st, b->mb, grad_owner(b, v),
                             exec_grad_floats(b->xm, (enum exec_tensor)b->es->values[v].tensor));
  return run->dval[v];
}

/* Gradient buffer of input value v and whether to accumulate into it. */
static float *dval_in(struct bwd *b, int32_t v, bool *acc) {
  struct exec_seg_run *run = b->run;
  *acc = run->dval[v] != NULL;
  if (!*acc) /* the kernel writes it (accumulate = false) */
    run->dval[v] = mb_floats_raw(b->s, b->st, b->mb, grad_owner(b, v),
                                 exec_grad_floats(b->xm, (enum exec_tensor)b->es->values[v].tensor));
  return run->dval[v];
}

/* Op j of the segment, with its operands as the forward saw them. */
struct bwd_op {
  int32_t j;
  const struct exec_seg_op *so;
  const struct model_op *op;
  const float *prm, *in0, *in1;
  float *dprm, *dout, *din; /* din: gradient of input 0 (= or += by acc) */
  bool acc;
};

/* Gradients of the segment's outputs: the sum over the edges that carried them, in edge
 * order. */
static bool output_grads(struct bwd *b, uint32_t i, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  const struct exec_segment *es = b->es;
  struct exec_seg_run *run = b->run;
  for (uint32_t q = 0; q < es->n_out_edges; q++) {
    uint32_t e = es->out_edges[q];
    for (int t = 0; t < TC; t++) {
      if (!(b->xm->edge_mask[e] & EXEC_BIT(t)))
        continue;
      const float *g = b->mb->grad[(size_t)e * TC + t];
      if (!g)
        return internal(err, s, i, "an output gradient of the segment has not arrived");
      int32_t v = es->final_value[t];
      size_t n = exec_grad_floats(b->xm, (enum exec_tensor)t);
      if (!run->dval[v]) {
        run->dval[v] = mb_floats_raw(s, st, b->mb, grad_owner(b, v), n);
        KT(st, s, b->k->copy(st->stream, run->dval[v], g, n * sizeof(float)));
      } else {
        KT(st, s, b->k->add(st->stream, run->dval[v], g, n));
      }
    }
  }
  return true;
}

static void bwd_embedding(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  int T = b->xm->T, V = b->xm->V, C = b->xm->C;
  if (b->mode == BWD_FUSED)
    KT(st, s, b->k->embedding_backward(st->stream, o->dprm, o->dout, b->mb->tokens, T, V, C));
  else if (b->mode == BWD_WEIGHT)
    KT(st, s,
       b->k->embedding_backward_weight(st->stream, o->dprm, o->dout, b->mb->tokens, T, V, C));
}

static void bwd_rmsnorm(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  const float *saved = b->run->saved[o->j];
  int T = b->xm->T_seq, C = b->xm->C;
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->rmsnorm_backward(st->stream, o->din, o->dprm, o->dout, o->in0, saved, o->prm, T, C,
                              o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->rmsnorm_backward_input(st->stream, o->din, o->dout, o->in0, saved, o->prm, T, C,
                                    o->acc));
  else
    KT(st, s, b->k->rmsnorm_backward_weight(st->stream, o->dprm, o->dout, o->in0, saved, T, C));
}

static void bwd_attention(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  int32_t j = o->j;
  struct kernels_attention_dims dd = attention_dims(s, o->op);
  dd.core = run->core[j]; /* apart from saved under selective recomputation */
  if (b->mode != BWD_WEIGHT)
    run->bwork[j] = mb_floats_raw(s, st, b->mb, b->keep, kernels_attention_bwork_floats(&dd));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->attention_backward(st->stream, o->din, o->dprm, run->bwork[j], o->dout, o->in0,
                                run->saved[j], o->prm, &dd, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->attention_backward_input(st->stream, o->din, run->bwork[j], o->dout, run->saved[j],
                                      o->prm, &dd, o->acc));
  else
    KT(st, s,
       b->k->attention_backward_weight(st->stream, o->dprm, run->bwork[j], o->dout, o->in0,
                                       run->saved[j], &dd));
}

/* The output gradient passes to every input (none in BW: no parameters). */
static void bwd_residual_add(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  if (b->mode == BWD_WEIGHT)
    return;
  for (int q = 0; q < 3; q++) {
    if (o->so->in[q] < 0)
      continue;
    bool a;
    float *g = dval_in(b, o->so->in[q], &a);
    KT(st, s,
       b->k->residual_add_backward(st->stream, g, o->dout, (size_t)b->xm->T_seq * b->xm->C, a));
  }
}

static void bwd_mlp(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  int32_t j = o->j;
  int T = b->xm->T, C = b->xm->C, F = mlp_width(s, o->op);
  if (b->mode != BWD_WEIGHT)
    run->bwork[j] = mb_floats_raw(s, st, b->mb, b->keep, kernels_mlp_bwork_floats(T, F));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->mlp_backward(st->stream, o->din, o->dprm, run->bwork[j], o->dout, o->in0,
                          run->saved[j], o->prm, T, C, F, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->mlp_backward_input(st->stream, o->din, run->bwork[j], o->dout, run->saved[j], o->prm,
                                T, C, F, o->acc));
  else
    KT(st, s,
       b->k->mlp_backward_weight(st->stream, o->dprm, run->bwork[j], o->dout, o->in0, run->saved[j],
                                 T, C, F));
}

static void bwd_router(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  int32_t j = o->j;
  int T = b->xm->T, C = b->xm->C, E = b->xm->E, K = b->xm->K, TK = T * K;
  const float *r = run->val[o->so->out];
  const int32_t *ids = (const int32_t *)r;
  if (b->mode != BWD_WEIGHT)
    run->bwork[j] = mb_floats_raw(s, st, b->mb, b->keep, kernels_router_bwork_floats(T, E));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->router_backward(st->stream, o->din, o->dprm, run->bwork[j], o->dout, ids, r + TK,
                             run->saved[j], o->in0, o->prm, T, C, E, K, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->router_backward_input(st->stream, o->din, run->bwork[j], o->dout, ids, r + TK,
                                   run->saved[j], o->prm, T, C, E, K, o->acc));
  else
    KT(st, s, b->k->router_backward_weight(st->stream, o->dprm, run->bwork[j], o->in0, T, C, E));
}

/* Experts on one device: combine's backward, the experts', dispatch's. Under TP (dh_tp: the
 * collectives' buffer) each rank's expert outputs are partial sums, so the routing weights'
 * gradient (dout . y) is summed over the group here, and the input gradient, partial too, is
 * left in dh_tp for the caller's sum. */
static bool bwd_expert_ffn(struct bwd *b, const struct bwd_op *o, float *dh_tp, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  struct exec_mb *mb = b->mb;
  const struct exec_kernels *k = b->k;
  int32_t j = o->j;
  int T = b->xm->T, C = b->xm->C, E = b->xm->E, K = b->xm->K, TK = T * K, F = expert_width(s);
  struct local_moe *lm = run->moe[j];
  if (b->mode == BWD_WEIGHT) {
    KT(st, s,
       k->expert_ffn_backward_weight(st->stream, o->dprm, run->bwork[j], lm->row_expert, TK,
                                     run->saved[j], 0, E, C, F));
    return true;
  }
  run->bwork[j] = mb_floats_raw(s, st, mb, b->keep, kernels_expert_ffn_bwork_floats(TK, C, F));
  float *dy = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C),
        *drows = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK * C),
        *scratch = mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats(TK, C));
  bool ar;
  float *dw = dval_in(b, o->so->in[1], &ar);
  float *dwt = ar ? mb_floats_raw(s, st, mb, OWN_WORK, (size_t)TK) : dw;
  KT(st, s,
     k->moe_combine_backward(st->stream, dy, dwt, o->dout, lm->y, o->in1 + TK, lm->route_row, T, K,
                             C));
  if (dh_tp && !exec_tp_all_reduce(s, st, dwt, (size_t)TK, err))
    return false;
  if (ar)
    KT(st, s, k->add(st->stream, dw, dwt, (size_t)TK));
  if (b->mode == BWD_FUSED)
    KT(st, s,
       k->expert_ffn_backward(st->stream, drows, o->dprm, run->bwork[j], scratch, dy,
                              lm->row_expert, TK, run->saved[j], o->prm, 0, E, C, F, false));
  else
    KT(st, s,
       k->expert_ffn_backward_input(st->stream, drows, run->bwork[j], scratch, dy,
                                    lm->row_expert, TK, run->saved[j], o->prm, 0, E, C, F, false));
  bool ah = false;
  float *dh = dh_tp ? dh_tp : dval_in(b, o->so->in[0], &ah);
  KT(st, s, k->moe_dispatch_backward(st->stream, dh, drows, lm->route_row, T, K, C, ah));
  return true;
}

static void bwd_lm_head(struct bwd *b, const struct bwd_op *o) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  struct exec_seg_run *run = b->run;
  const struct exec_model *xm = b->xm;
  int32_t j = o->j;
  int T = xm->T, C = xm->C, V = xm->V;
  enum kernels_lm_head_layout lay =
      xm->tied || xm->tied_copy ? KERNELS_LM_HEAD_TIED : KERNELS_LM_HEAD_UNTIED;
  /* BW recomputes the logits too, so it reads the head's parameters as BI does (the host
   * executor holds them whole; under ZeRO-3 the plan would have to gather them for BW) */
  const float *P = b->P ? b->P : params_of(s, &s->dev->instrs[b->i]);
  const uint64_t *at = s->dev->op_offset;
  const float *w = P + (xm->tied ? at[b->es->ops[0].op] : at[o->so->op]);
  float *dw = xm->tied ? b->G + at[b->es->ops[0].op] : o->dprm;
  run->bwork[j] = NULL; /* BI and BW recompute the dlogits from h and the row statistics */
  if (b->mode == BWD_FUSED)
    KT(st, s,
       b->k->lm_head_loss_backward(st->stream, o->din, dw, run->bwork[j], run->saved[j], o->in0,
                                   b->mb->targets, w, lay, b->dloss, T, C, V, o->acc));
  else if (b->mode == BWD_INPUT)
    KT(st, s,
       b->k->lm_head_loss_backward_input(st->stream, o->din, run->bwork[j], run->saved[j],
                                         o->in0, b->mb->targets, w, lay, b->dloss, T, C, V,
                                         o->acc));
  else
    KT(st, s,
       b->k->lm_head_loss_backward_weight(st->stream, dw, run->bwork[j], run->saved[j], o->in0,
                                          b->mb->targets, w, lay, b->dloss, T, C, V));
}

/* The local experts' backward under TP: the output gradient whole (gathered under SP), the
 * partial input gradient summed over the group (reduce-scattered under SP). */
static bool tp_experts_backward(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  if (b->mode == BWD_WEIGHT)
    return bwd_expert_ffn(b, o, NULL, err);
  if (s->dev->sequence_parallel &&
      !(o->dout = (float *)tp_gathered(s, st, b->mb, &st->tp.dout, o->dout, err)))
    return false;
  bool ah;
  float *dh = dval_in(b, o->so->in[0], &ah);
  float *buf = tp_buffer(s, st, b->mb, b->i, &st->tp.sum);
  return bwd_expert_ffn(b, o, buf, err) && tp_sum_into(s, st, b->mb, dh, ah, err);
}

/* The router under SP runs on the whole sequence (its input gathered), as every TP rank needs
 * the whole routing for its slices of the experts: its weight gradient is the same on every
 * rank, and its input gradient's rows of this device's shard go on. */
static bool tp_router_backward(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  size_t n = (size_t)b->xm->T_seq * (size_t)b->xm->C;
  if (o->in0 && b->mode != BWD_INPUT &&
      !(o->in0 = tp_gathered(s, st, b->mb, &st->tp.input, o->in0, err)))
    return false;
  float *din = o->din;
  bool acc = o->acc;
  if (din) {
    o->din = tp_buffer(s, st, b->mb, b->i, &st->tp.sum);
    o->acc = false;
  }
  bwd_router(b, o);
  if (!din)
    return true;
  const float *mine = o->din + (size_t)s->dev->tp_rank * n;
  if (acc)
    KT(st, s, s->k->add(st->stream, din, mine, n));
  else
    KT(st, s, s->k->copy(st->stream, din, mine, n * sizeof(float)));
  return true;
}

/* Backward of divided op j under TP: the input gradient of this rank's slice into the
 * collectives' buffer, summed over the group into the op's input gradient; the weight
 * gradient of the slice. */
static bool tp_backward_op(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  const struct exec_model *xm = b->xm;
  bool input = b->mode != BWD_WEIGHT, weight = b->mode != BWD_INPUT;
  if (o->so->kind == MODEL_OP_EXPERT_FFN)
    return tp_experts_backward(b, o, err);
  float *din = o->din, *buf = NULL;
  bool acc = o->acc;
  if (input && o->so->kind != MODEL_OP_EMBEDDING) {
    buf = tp_buffer(s, st, b->mb, b->i, &st->tp.sum);
    o->din = buf;
    o->acc = false;
  }
  /* SP: the output gradient's and the input's sequence shards gathered (the input only where
   * it is read: weight gradients, and the head's logits) */
  bool sp = s->dev->sequence_parallel;
  if (sp && o->dout && (weight || o->so->kind != MODEL_OP_EMBEDDING) &&
      !(o->dout = (float *)tp_gathered(s, st, b->mb, &st->tp.dout, o->dout, err)))
    return false;
  if (sp && o->in0 && (weight || o->so->kind == MODEL_OP_LM_HEAD_LOSS) &&
      !(o->in0 = tp_gathered(s, st, b->mb, &st->tp.input, o->in0, err)))
    return false;
  switch (o->so->kind) {
  case MODEL_OP_EMBEDDING:
    if (weight)
      KT(st, s, exec_tp_embedding_backward(s, st->stream, o->dprm, o->dout, b->mb->tokens));
    return true;
  case MODEL_OP_ATTENTION: bwd_attention(b, o); break;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: bwd_mlp(b, o); break;
  case MODEL_OP_LM_HEAD_LOSS: {
    const uint64_t *at = s->dev->op_offset;
    const float *P = b->P ? b->P : params_of(s, &s->dev->instrs[b->i]);
    const float *w = P + (xm->tied ? at[b->es->ops[0].op] : at[o->so->op]);
    float *dw = xm->tied ? b->G + at[b->es->ops[0].op] : o->dprm;
    b->run->bwork[o->j] = NULL;
    KT(st, s,
       exec_tp_head_backward(s, st->stream, buf, weight ? dw : NULL, b->run->saved[o->j], o->in0,
                             b->mb->targets, w, xm->tied || xm->tied_copy, b->dloss));
    break;
  }
  default: return internal(err, s, b->i, "op kind without a tensor-parallel kernel");
  }
  return !input || tp_sum_into(s, st, b->mb, din, acc, err);
}

/* A norm's weight gradient under SP: each device has its sequence shard's part; their sum over
 * the TP group is the gradient (Megatron sums the replicated norms' gradients likewise). */
static bool tp_norm_backward(struct bwd *b, struct bwd_op *o, GError **err) {
  struct exec_state *s = b->s;
  struct exec_task_ctx *st = b->st;
  size_t C = (size_t)b->xm->C;
  if (!st->tp.norm)
    st->tp.norm = mb_floats_raw(s, st, b->mb, OWN_WORK, C);
  float *dprm = o->dprm, *part = st->tp.norm;
  KT(st, s, s->k->fill(st->stream, part, 0.0f, C));
  o->dprm = part;
  bwd_rmsnorm(b, o);
  if (!exec_tp_all_reduce(s, st, part, C, err))
    return false;
  KT(st, s, s->k->add(st->stream, dprm, part, C));
  return true;
}

/* Op j's operands, then its kind's backward. */
static bool backward_op(struct bwd *b, int32_t j, uint32_t i, GError **err) {
  struct exec_seg_run *run = b->run;
  const struct exec_seg_op *so = &b->es->ops[j];
  struct bwd_op o = {.j = j, .so = so, .op = &b->xm->m->ops[so->op]};
  o.prm = b->P ? b->P + b->s->dev->op_offset[so->op] : NULL;
  o.dprm = b->G + b->s->dev->op_offset[so->op];
  o.in0 = so->in[0] >= 0 ? run->val[so->in[0]] : NULL;
  o.in1 = so->in[1] >= 0 ? run->val[so->in[1]] : NULL;
  o.dout = so->out >= 0 ? dval_out(b, so->out) : NULL;
  if (b->mode != BWD_WEIGHT && so->in[0] >= 0 && so->kind != MODEL_OP_EXPERT_FFN &&
      so->kind != MODEL_OP_RESIDUAL_ADD)
    o.din = dval_in(b, so->in[0], &o.acc);
  if (b->s->dev->tp_degree > 1 && exec_tp_divided(so->kind))
    return tp_backward_op(b, &o, err);
  if (b->s->dev->sequence_parallel && so->kind == MODEL_OP_RMSNORM && b->mode != BWD_INPUT)
    return tp_norm_backward(b, &o, err);
  if (b->s->dev->sequence_parallel && so->kind == MODEL_OP_ROUTER)
    return tp_router_backward(b, &o, err);
  switch (so->kind) {
  case MODEL_OP_EMBEDDING: bwd_embedding(b, &o); return true;
  case MODEL_OP_RMSNORM: bwd_rmsnorm(b, &o); return true;
  case MODEL_OP_ATTENTION: bwd_attention(b, &o); return true;
  case MODEL_OP_RESIDUAL_ADD: bwd_residual_add(b, &o); return true;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: bwd_mlp(b, &o); return true;
  case MODEL_OP_ROUTER: bwd_router(b, &o); return true;
  case MODEL_OP_EXPERT_FFN: return bwd_expert_ffn(b, &o, NULL, err);
  case MODEL_OP_LM_HEAD_LOSS: bwd_lm_head(b, &o); return true;
  default: return internal(err, b->s, i, "op kind without a host kernel");
  }
}

/* Gradients of the segment's inputs go onto the edges that brought them. */
static void input_grads(struct bwd *b) {
  const struct exec_segment *es = b->es;
  for (uint32_t v = 0; v < es->n_values; v++) {
    const struct exec_value *val = &es->values[v];
    if (val->op >= 0)
      continue;
    float *g = dval_out(b, (int32_t)v);
    b->mb->grad[(size_t)val->edge * TC + val->tensor] = g;
  }
}

static bool seg_backward(struct exec_state *s, uint32_t i, enum bwd_mode mode,
                         struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  struct exec_mb *mb = &s->mbs[x->mb];
  struct bwd b = {.s = s,
                  .st = st,
                  .k = s->k,
                  .xm = s->xm,
                  .mb = mb,
                  .run = mb->seg[x->segment],
                  .es = &s->xm->segs[x->segment],
                  .mode = mode,
                  .G = grads_of(s, st, x->segment),
                  .dloss = 1.0f / (float)(s->dev->dp_degree * s->dev->M),
                  .i = i,
                  .keep = OWN_WORK};
  if (mode == BWD_INPUT) {
    b.keep = written_tensor(s, i, PLAN_TENSOR_SAVED);
    if (b.keep == OWN_WORK)
      b.keep = OWN_MB;
  }
  if (!b.run)
    return internal(err, s, i, "backward before its forward");
  b.P = mode == BWD_WEIGHT ? NULL : params_of(s, x);
  if (mode != BWD_WEIGHT && !output_grads(&b, i, err))
    return false;
  for (int32_t j = (int32_t)b.es->n_ops - 1; j >= 0; j--)
    if (!backward_op(&b, j, i, err))
      return false;
  if (mode != BWD_WEIGHT)
    input_grads(&b);
  return true;
}

/* ---- expert parallelism ------------------------------------------------------------------ */

static struct exec_comm *comm_of(struct exec_state *s, uint32_t i) {
  uint32_t c = s->dev->instrs[i].comm;
  return c == IR_NONE ? NULL : s->comms[c];
}

static void byte_counts(const int32_t *rows, uint32_t S, size_t row_bytes, size_t *out) {
  for (uint32_t r = 0; r < S; r++)
    out[r] = (size_t)rows[r] * row_bytes;
}

/* EP with TP: the routed rows' partial sums summed over the TP group in place, through the
 * buffer the plan gives the TP node ([T, hidden], ir_tp_segment_comm), T rows at a time. */
static bool tp_sum_floats(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                          uint32_t i, float *x, size_t n, GError **err) {
  size_t chunk = (size_t)s->xm->T * (size_t)s->xm->C;
  float *buf = tp_buffer(s, st, mb, i, &st->tp.sum);
  for (size_t r = 0; r < n; r += chunk) {
    size_t k = n - r < chunk ? n - r : chunk;
    KT(st, s, s->k->copy(st->stream, buf, x + r, k * sizeof(float)));
    if (!exec_tp_all_reduce(s, st, buf, k, err))
      return false;
    KT(st, s, s->k->copy(st->stream, x + r, buf, k * sizeof(float)));
  }
  return true;
}

static bool tp_sum_rows(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                        uint32_t i, float *rows, size_t n_rows, GError **err) {
  return tp_sum_floats(s, st, mb, i, rows, n_rows * (size_t)s->xm->C, err);
}

/* EP with TP and SP: each TP peer dispatched every route (the same rows in the same order on
 * every peer: one routing) but only its sequence shard's tokens' values, zeros elsewhere, and
 * its combine's transpose only its shard's output gradients and routing weights' gradients;
 * summed over the TP group here, in the expert compute (the compute stream orders the TP
 * collectives alike on every peer), each value comes whole from the one peer that holds it
 * (x + 0 is exact). */
static bool sp_whole_rows(struct exec_state *s, struct exec_task_ctx *st, struct exec_mb *mb,
                          uint32_t i, float *rows, size_t n_rows, GError **err) {
  if (!s->dev->sequence_parallel || !n_rows)
    return true;
  return tp_sum_rows(s, st, mb, i, rows, n_rows, err);
}

/* The experts' forward on the rows the dispatch brought, or their rerun under full
 * recomputation on the rows the rerun's own dispatch brought (Megatron-LM's full
 * recomputation of a MoE layer: the rerun routes again, bit-identically, and its combine
 * regenerates the copy the combine's backward reads). F keeps nothing for R. */
static bool expert_forward(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                           struct exec_moe *moe, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  struct exec_mb *mb = &s->mbs[x->mb];
  int C = xm->C, F = expert_width(s), n = (int)moe->n_recv;
  size_t cap = moe->cap; /* every buffer of routed rows at the plan's capacity (ir/expert.c) */
  enum fwd_keep keep = fwd_keep_of(s, x);
  const float *P = params_of(s, x), *rows = moe->recv_rows;
  uint32_t saved = saved_owner(s, i), y = out_tensor(s, i, EXEC_T_M);
  if (keep == FWD_FULL_DROP) {
    saved = OWN_WORK;
  } else if (keep == FWD_FULL_RERUN) {
    if (!moe->rerun)
      return internal(err, s, i, "a rerun before its own dispatch");
  } else if (keep != FWD_PLAIN) {
    return internal(err, s, i, "selective recomputation of experts (they have no attention)");
  }
  float *yr = mb_floats_raw(s, st, mb, y, cap * C);
  moe->y_recv = yr;
  moe->saved = mb_floats_raw(s, st, mb, saved, kernels_expert_ffn_saved_floats((int)cap, C, F));
  moe->scratch =
      mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats((int)cap, C));
  if (!sp_whole_rows(s, st, mb, i, moe->recv_rows, (size_t)n, err))
    return false;
  if (n)
    KT(st, s,
       s->k->expert_ffn_forward(st->stream, yr, moe->saved, moe->scratch, rows, moe->recv_expert, n,
                                P, moe->e_first, moe->e_count, C, F));
  /* TP: the TP peers received the same rows (same tokens, same routing, the all-to-all over
   * the devices of their TP rank), each output a partial sum of its slice; summed here, before
   * the combine, so the combine and its backward see whole outputs. A rerun's too: its combine
   * regenerates the copy the combine's transpose reads (the routing weights' gradient), which
   * must be the forward's whole outputs on every TP peer, or their routers drift apart. */
  if (s->dev->tp_degree > 1 && n)
    return tp_sum_rows(s, st, mb, i, yr, (size_t)n, err);
  return true;
}

static bool expert_compute(struct exec_state *s, uint32_t i, enum bwd_mode mode, bool forward,
                           struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_moe *moe = mb->moe[x->segment];
  int C = xm->C, F = expert_width(s);
  if (!moe)
    return internal(err, s, i, "experts run before their dispatch");
  int n = (int)moe->n_recv;
  float *G = forward ? NULL : grads_of(s, st, x->segment);
  if (forward)
    return expert_forward(s, i, st, moe, err);
  if (mode == BWD_WEIGHT) {
    if (n)
      KT(st, s,
         k->expert_ffn_backward_weight(st->stream, G, moe->bwork, moe->recv_expert, n, moe->saved,
                                       moe->e_first, moe->e_count, C, F));
    return true;
  }
  if (!moe->dy_recv)
    return internal(err, s, i, "expert backward before its output gradient");
  const float *P = params_of(s, x);
  uint32_t keep = OWN_WORK;
  if (mode == BWD_INPUT) {
    keep = written_tensor(s, i, PLAN_TENSOR_SAVED);
    keep = keep == OWN_WORK ? OWN_MB : keep;
  }
  moe->bwork = mb_floats_raw(s, st, mb, keep, kernels_expert_ffn_bwork_floats((int)moe->cap, C, F));
  moe->drows_recv = mb_floats_raw(s, st, mb, out_tensor(s, i, EXEC_T_H), moe->cap * C);
  moe->scratch =
      mb_floats_raw(s, st, mb, OWN_WORK, kernels_expert_ffn_scratch_floats((int)moe->cap, C));
  if (s->dev->sequence_parallel) {
    float *dweights = mb->grad[(size_t)moe->in_edge * TC + EXEC_T_R];
    if (!dweights)
      return internal(err, s, i, "expert backward before the routing weights' gradient");
    if (!sp_whole_rows(s, st, mb, i, moe->dy_recv, (size_t)n, err) ||
        !tp_sum_floats(s, st, mb, i, dweights, (size_t)xm->T * (size_t)xm->K, err))
      return false;
  }
  if (n && mode == BWD_FUSED)
    KT(st, s,
       k->expert_ffn_backward(st->stream, moe->drows_recv, G, moe->bwork, moe->scratch,
                              moe->dy_recv, moe->recv_expert, n, moe->saved, P, moe->e_first,
                              moe->e_count, C, F, false));
  else if (n)
    KT(st, s,
       k->expert_ffn_backward_input(st->stream, moe->drows_recv, moe->bwork, moe->scratch,
                                    moe->dy_recv, moe->recv_expert, n, moe->saved, P, moe->e_first,
                                    moe->e_count, C, F, false));
  /* TP: each slice's input gradient is partial; the rows go back whole */
  if (s->dev->tp_degree > 1 && n)
    return tp_sum_rows(s, st, mb, i, moe->drows_recv, (size_t)n, err);
  return true;
}

/* Piper drops no tokens (ir/expert.c): a routing that sends a device more rows than the
 * plan's capacity stops the step, saying what would hold it. */
static bool capacity_exceeded(struct exec_state *s, uint32_t i, const struct exec_moe *moe,
                              GError **err) {
  const struct ir_node *n = &s->dev->plan->nodes[s->dev->instrs[i].node];
  double f = n->capacity_factor > 0 ? n->capacity_factor : IR_EP_CAPACITY_FACTOR_DEFAULT;
  double need = (double)moe->n_recv / (double)((size_t)s->xm->T * (size_t)s->xm->K);
  g_autofree char *why = g_strdup_printf(
      "the routing sent this device %zu rows, over the plan's expert capacity of %zu "
      "(capacity_factor %g on the shard directive; %.2f would hold them)",
      moe->n_recv, moe->cap, f, need);
  return internal(err, s, i, why);
}

/* A rerun's dispatch reads h and the routing where the router's rerun left them: in its saved
 * activations (the router's backward reads both), which the plan keeps until that backward. */
static bool router_rerun_output(struct exec_state *s, const struct exec_instr *x, const float **h,
                                const float **r) {
  uint32_t src = s->xm->m->edges[x->edge].src;
  const struct exec_seg_run *router = s->mbs[x->mb].seg[src];
  const struct exec_segment *es = &s->xm->segs[src];
  int32_t hv = es->final_value[EXEC_T_H], rv = es->final_value[EXEC_T_R];
  if (!router || router->dropped || hv < 0 || rv < 0)
    return false;
  *h = router->val[hv];
  *r = router->val[rv];
  return *h && *r;
}

/* The dispatch: routes this micro-batch's tokens to the experts' owners (counts first, then
 * the rows and their experts); under full recomputation again in the rerun (pass R), to the
 * same peers in the same order: the routing is recomputed bit for bit. sb, rb: scratch of S
 * byte counts. */
static bool a2a_dispatch(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                         struct exec_comm *comm, size_t *sb, size_t *rb, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  int T = xm->T, C = xm->C, K = xm->K, E = xm->E, TK = T * K;
  size_t row = (size_t)C * sizeof(float);
  bool ok = true;
  uint32_t S = s->dev->ep_size[x->segment];
  struct exec_moe *moe = mb_host(s, mb, sizeof *moe, REPORT_MEM_COMM);
  mb->moe[x->segment] = moe;
  moe->S = S;
  moe->rank = s->dev->ep_rank[x->segment];
  moe->e_count = E / (int)S;
  moe->e_first = (int)moe->rank * moe->e_count;
  moe->in_edge = x->edge;
  moe->rerun = x->pass == IR_PASS_R;
  const float *h = edge_value(s, mb, x->edge, EXEC_T_H);
  const float *r = edge_value(s, mb, x->edge, EXEC_T_R);
  if (moe->rerun && !router_rerun_output(s, x, &h, &r))
    return internal(err, s, i, "a rerun's dispatch before the router's rerun");
  if (!h || !r)
    return internal(err, s, i, "the router's output has not arrived");
  /* the combine and both backward all-to-alls read the routing: the router's own copy in
   * its saved activations lives until its backward, after theirs (r, the copy that came
   * here, goes after this dispatch) */
  const struct exec_seg_run *router = mb->seg[s->xm->m->edges[x->edge].src];
  int32_t rv = s->xm->segs[s->xm->m->edges[x->edge].src].final_value[EXEC_T_R];
  if (moe->rerun || fwd_keep_of(s, x) == FWD_FULL_DROP) {
    /* under full recomputation: the rerun's routing is in the router rerun's saved
     * activations (until its backward, after every reader); the forward's stays in the
     * router's output, which the plan keeps until the forward's combine, its last reader */
  } else if (router && rv >= 0 && router->val[rv] && !router->dropped) {
    r = router->val[rv];
  } else if (router && router->dropped) {
    /* the router's forward under full recomputation kept none of it, and its rerun comes
     * after the combine's backward: a copy of the micro-batch's */
    float *copy = mb_floats_raw(s, st, mb, OWN_MB, (size_t)2 * TK);
    KT(st, s, k->copy(st->stream, copy, r, (size_t)2 * TK * sizeof(float)));
    r = copy;
  }
  moe->ids = (const int32_t *)r;
  moe->weights = r + TK;
  moe->send_counts = mb_host(s, mb, S * sizeof(int32_t), REPORT_MEM_COMM);
  int32_t *counts_dev = mb_raw(s, st, mb, OWN_WORK, S * sizeof(int32_t), REPORT_MEM_COMM);
  /* the routing tables serve the experts, the combine and both backward all-to-alls: the
   * plan's tensor of them (ir_ep_route_bytes) lives until the last of those */
  uint32_t route = written_tensor(s, i, PLAN_TENSOR_SAVED);
  route = route == OWN_WORK ? OWN_MB : route;
  moe->cap = (size_t)ir_ep_capacity_rows(s->dev->plan->model, &s->dev->plan->nodes[x->node]);
  moe->route_row = mb_raw(s, st, mb, route, (size_t)TK * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  moe->send_expert =
      mb_raw(s, st, mb, OWN_WORK, (size_t)TK * sizeof(int32_t), REPORT_MEM_COMM);
  moe->send_rows = mb_raw(s, st, mb, OWN_WORK, (size_t)TK * row, REPORT_MEM_COMM);
  KT(st, s,
     k->moe_dispatch_plan(st->stream, counts_dev, moe->route_row, moe->ids, T, K, E, (int)S));
  if (s->dev->sequence_parallel) {
    /* h is this peer's sequence shard: the other tokens' rows go as zeros (sp_whole_rows) */
    size_t shard = (size_t)xm->T_seq * C;
    float *hz = mb_floats_raw(s, st, mb, OWN_WORK, (size_t)T * C);
    KT(st, s, k->fill(st->stream, hz, 0.0f, (size_t)T * C));
    KT(st, s, k->copy(st->stream, hz + s->dev->tp_rank * shard, h, shard * sizeof(float)));
    h = hz;
  }
  KT(st, s,
     k->moe_dispatch_forward(st->stream, moe->send_rows, moe->send_expert, h, moe->ids,
                             moe->route_row, T, K, C));
  exec_backend_to_host(s->b, moe->send_counts, counts_dev, S * sizeof(int32_t));
  int32_t *rc = mb_host(s, mb, S * sizeof(int32_t), REPORT_MEM_COMM);
  CT(st, s, ok, exec_comm_all_to_all_i32(s->b, comm, moe->send_counts, rc, err));
  moe->recv_counts = rc;
  if (!ok)
    return false;
  moe->n_recv = 0;
  for (uint32_t q = 0; q < S; q++)
    moe->n_recv += (size_t)rc[q];
  if (moe->n_recv > moe->cap)
    return capacity_exceeded(s, i, moe, err);
  moe->recv_rows = mb_raw(s, st, mb, a2a_out_tensor(s, i, true), moe->cap * row, REPORT_MEM_COMM);
  moe->recv_expert =
      mb_raw(s, st, mb, route, moe->cap * sizeof(int32_t), REPORT_MEM_ACTIVATIONS);
  byte_counts(moe->send_counts, S, row, sb);
  byte_counts(moe->recv_counts, S, row, rb);
  CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->send_rows, sb, moe->recv_rows, rb, err));
  if (!ok)
    return false;
  byte_counts(moe->send_counts, S, sizeof(int32_t), sb);
  byte_counts(moe->recv_counts, S, sizeof(int32_t), rb);
  CT(st, s, ok,
     exec_comm_all_to_all_v(s->b, comm, moe->send_expert, sb, moe->recv_expert, rb, err));
  return ok;
}

static bool all_to_all(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_model *xm = s->xm;
  const struct exec_kernels *k = s->k;
  struct exec_mb *mb = &s->mbs[x->mb];
  struct exec_comm *comm = comm_of(s, i);
  int T = xm->T, C = xm->C, K = xm->K, TK = T * K;
  size_t row = (size_t)C * sizeof(float);
  bool ok = true;
  /* under SP the combine's output and the dispatch's input gradient are this peer's sequence
   * shard: its tokens' routes, from route off on */
  int TS = xm->T_seq;
  size_t off = s->dev->sequence_parallel ? (size_t)s->dev->tp_rank * TS * K : 0;
  if (!comm)
    return internal(err, s, i, "no communicator");
  uint32_t S = s->dev->ep_size[x->segment];
  size_t *sb = g_new(size_t, S), *rb = g_new(size_t, S);
  struct exec_moe *moe = mb->moe[x->segment];
  bool forward = x->pass == IR_PASS_F || x->pass == IR_PASS_R;
  if (x->role == EXEC_ROLE_A2A_TO_EXPERT && forward) {
    ok = a2a_dispatch(s, i, st, comm, sb, rb, err);
    goto out;
  }
  if (!moe) {
    ok = internal(err, s, i, "all-to-all before its dispatch");
    goto out;
  }
  byte_counts(moe->send_counts, S, row, sb);
  byte_counts(moe->recv_counts, S, row, rb);
  if (x->role == EXEC_ROLE_A2A_FROM_EXPERT && forward) {
    /* combine: expert outputs back to the tokens' owners, weighted sum per token */
    if (!moe->y_recv) {
      ok = internal(err, s, i, "combine before the experts ran");
      goto out;
    }
    /* kept for the transpose (the routing weights' gradient): the plan's tensor of it; under
     * full recomputation the rerun's combine keeps it, the forward's none */
    uint32_t keep = written_tensor(s, i, PLAN_TENSOR_SAVED);
    if (keep == OWN_WORK && fwd_keep_of(s, x) != FWD_FULL_DROP)
      keep = OWN_MB;
    moe->y_send = mb_raw(s, st, mb, keep, (size_t)TK * row, REPORT_MEM_ACTIVATIONS);
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->y_recv, rb, moe->y_send, sb, err));
    if (!ok || x->pass == IR_PASS_R) /* the forward's combined output went on */
      goto out;
    float *mout = mb_floats_raw(s, st, mb, a2a_out_tensor(s, i, false), (size_t)TS * C);
    KT(st, s,
       k->moe_combine_forward(st->stream, mout, moe->y_send, moe->weights + off,
                              moe->route_row + off, TS, K, C));
    mb->out[(size_t)x->segment * TC + EXEC_T_M] = mout;
  } else if (x->role == EXEC_ROLE_A2A_TO_EXPERT) {
    /* combine's transpose: output gradients to the experts; routing weights' gradient here */
    const float *dm = mb->grad[(size_t)x->edge * TC + EXEC_T_M];
    if (!dm) {
      ok = internal(err, s, i, "the experts' output gradient has not arrived");
      goto out;
    }
    float *dy_send = mb_raw(s, st, mb, OWN_WORK, (size_t)TK * row, REPORT_MEM_COMM);
    /* in r's layout (exec_grad_floats): the router's backward reads that many */
    float *dweights =
        mb_floats_raw(s, st, mb, a2a_out_tensor(s, i, false), exec_grad_floats(xm, EXEC_T_R));
    if (s->dev->sequence_parallel) { /* the other tokens' as zeros (sp_whole_rows) */
      KT(st, s, k->fill(st->stream, dy_send, 0.0f, (size_t)TK * C));
      KT(st, s, k->fill(st->stream, dweights, 0.0f, (size_t)TK));
    }
    KT(st, s,
       k->moe_combine_backward(st->stream, dy_send, dweights + off, dm, moe->y_send,
                               moe->weights + off, moe->route_row + off, TS, K, C));
    mb->grad[(size_t)moe->in_edge * TC + EXEC_T_R] = dweights;
    moe->dy_recv =
        mb_raw(s, st, mb, a2a_out_tensor(s, i, true), moe->cap * row, REPORT_MEM_COMM);
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, dy_send, sb, moe->dy_recv, rb, err));
  } else {
    /* dispatch's transpose: input gradients back, summed over each token's routes */
    if (!moe->drows_recv) {
      ok = internal(err, s, i, "input gradients before the experts' backward");
      goto out;
    }
    float *dsend = mb_raw(s, st, mb, OWN_WORK, (size_t)TK * row, REPORT_MEM_COMM);
    CT(st, s, ok, exec_comm_all_to_all_v(s->b, comm, moe->drows_recv, rb, dsend, sb, err));
    if (!ok)
      goto out;
    float *dh = mb_floats_raw(s, st, mb, a2a_out_tensor(s, i, false), (size_t)TS * C);
    KT(st, s,
       k->moe_dispatch_backward(st->stream, dh, dsend, moe->route_row + off, TS, K, C, false));
    mb->grad[(size_t)x->edge * TC + EXEC_T_H] = dh;
  }
out:
  g_free(sb);
  g_free(rb);
  return ok;
}

/* ---- pipeline transfers ------------------------------------------------------------------ */

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
        buf = mb_raw(s, st, mb, out_tensor(s, i, (enum exec_tensor)t), words * 4,
                     REPORT_MEM_COMM);
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
      part.buf = mb_raw(s, st, mb, out_tensor(s, i, (enum exec_tensor)t), words * 4,
                        REPORT_MEM_COMM);
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
static bool transfer_group(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                           GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  if (x->group_lead == IR_NONE)
    return transfer(s, i, st, err);
  if (x->group_lead != i)
    return true;
  GArray *parts = g_array_new(FALSE, FALSE, sizeof(struct exec_p2p_part));
  GPtrArray *slots = g_ptr_array_new();
  bool ok = true;
  for (uint32_t k = x->group_head; k != IR_NONE && ok; k = s->dev->instrs[k].group_next)
    ok = group_collect(s, k, st, parts, slots, err);
  if (ok)
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

/* ---- data parallelism and the optimizer -------------------------------------------------- */

static bool data_parallel(struct exec_state *s, uint32_t i, struct exec_task_ctx *st,
                          GError **err) {
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
    CT(st, s, ok,
       exec_comm_all_reduce_f32(s->b, comm, stored(s, s->grads, EXEC_STORE_GRADS, bk->offset),
                                bk->count, err));
    break;
  case EXEC_ROLE_REDUCE_SCATTER:
    if (bk->sharded_grads) {
      /* ZeRO-2/3: the bucket's sum lands in the stored shard; the whole goes */
      CT(st, s, ok,
         exec_comm_reduce_scatter_f32(s->b, comm, grad_accumulator(s, st, x->bucket),
                                      stored(s, s->grads, EXEC_STORE_GRADS, own), bk->shard,
                                      err));
      grad_accumulator_release(s, x->bucket);
    } else {
      /* ZeRO-1: whole gradients stay; the shard of them this device updates is summed */
      float *tmp = exec_backend_alloc(s->b, (bk->shard ? bk->shard : 1) * sizeof(float));
      exec_mem_add(s, REPORT_MEM_COMM, (int64_t)(bk->shard * sizeof(float)));
      CT(st, s, ok,
         exec_comm_reduce_scatter_f32(s->b, comm,
                                      stored(s, s->grads, EXEC_STORE_GRADS, bk->offset), tmp,
                                      bk->shard, err));
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
       exec_comm_all_gather(s->b, comm, own_p,
                            stored(s, s->params, EXEC_STORE_PARAMS, bk->offset),
                            bk->shard * sizeof(float), err));
    break;
  case EXEC_ROLE_GATHER_USE: {
    /* the gathered parameters are the gather's plan tensor when it has one (released by the
     * memory rule: GATHER_TENSOR marks it), else freed by their last user */
    uint32_t t = written_tensor(s, i, PLAN_TENSOR_OUT);
    float *buf;
    if (t != OWN_WORK) {
      buf = mb_buffer(s, st, NULL, t, (bk->padded ? bk->padded : 1) * sizeof(float),
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
static bool tied_sync(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
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
      float *g = grads_of(s, st, x->segment) + s->dev->op_offset[es->ops[j].op];
      CT(st, s, ok, exec_comm_all_reduce_f32(s->b, comm, g, (size_t)xm->V * (size_t)xm->C, err));
      return ok;
    }
  return internal(err, s, i, "the tied embedding's copy is not in its segment");
}

/* A consumer of gathered parameters is done; the last one frees them. */
static void gathered_release(struct exec_state *s, uint32_t g) {
  if (atomic_load(&s->gathered_users[g]) == GATHER_TENSOR)
    return;
  if (atomic_fetch_sub(&s->gathered_users[g], 1) != 1)
    return;
  const struct exec_bucket *bk = &s->dev->buckets[s->dev->instrs[g].bucket];
  exec_backend_release(s->b, s->gathered[g]);
  s->gathered[g] = NULL;
  exec_mem_add(s, REPORT_MEM_GATHERED, -(int64_t)(bk->padded * sizeof(float)));
}

static bool optimizer(struct exec_state *s, uint32_t i, struct exec_task_ctx *st) {
  const struct exec_instr *x = &s->dev->instrs[i];
  const struct exec_device *d = s->dev;
  const struct plan *p = d->plan;
  const struct ir_segset *ss = &p->segsets[x->segset];
  const struct exec_options *o = s->o;
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
    if (uhi > ulo)
      KT(st, s,
         s->k->adamw_step(st->stream, stored(s, s->params, EXEC_STORE_PARAMS, ulo),
                          stored(s, s->grads, EXEC_STORE_GRADS, ulo),
                          stored(s, s->adam_m, EXEC_STORE_STATE, ulo),
                          stored(s, s->adam_v, EXEC_STORE_STATE, ulo), uhi - ulo, o->lr, o->beta1,
                          o->beta2, o->eps, o->weight_decay, (int)s->step));
  }
  return true;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

bool exec_run_instr(struct exec_state *s, uint32_t i, struct exec_task_ctx *st, GError **err) {
  const struct exec_instr *x = &s->dev->instrs[i];
  bool ok = true;
  st->has_work = s->work_of && s->work_of[i] != IR_NONE;
  st->work_tensor = st->has_work ? s->work_of[i] : 0;
  switch (x->role) {
  case EXEC_ROLE_COMPUTE: {
    bool ep = s->dev->ep_size[x->segment] > 1;
    enum bwd_mode mode = x->pass == IR_PASS_BI   ? BWD_INPUT
                         : x->pass == IR_PASS_BW ? BWD_WEIGHT
                                                 : BWD_FUSED;
    if (ep)
      ok = expert_compute(s, i, mode, x->pass == IR_PASS_F || x->pass == IR_PASS_R, st, err);
    else if (x->pass == IR_PASS_F || x->pass == IR_PASS_R)
      ok = seg_forward(s, i, st, err); /* R: what F dropped again, bit for bit */
    else
      ok = seg_backward(s, i, mode, st, err);
    if (s->dev->tp_degree > 1) {
      /* all its communication is its TP collectives; one rank's instructions run on one
       * thread, so the table's creation cannot race */
      if (!s->tp_seconds)
        s->tp_seconds = g_new0(double, s->dev->n_instrs ? s->dev->n_instrs : 1);
      s->tp_seconds[i] = st->comm_s;
    }
    if (x->gather != IR_NONE)
      gathered_release(s, x->gather);
    break;
  }
  case EXEC_ROLE_SEND:
  case EXEC_ROLE_RECV: ok = transfer_group(s, i, st, err); break;
  case EXEC_ROLE_A2A_TO_EXPERT:
  case EXEC_ROLE_A2A_FROM_EXPERT: ok = all_to_all(s, i, st, err); break;
  case EXEC_ROLE_ALL_REDUCE:
  case EXEC_ROLE_REDUCE_SCATTER:
  case EXEC_ROLE_GATHER_USE:
  case EXEC_ROLE_GATHER_UPDATE: ok = data_parallel(s, i, st, err); break;
  case EXEC_ROLE_OPTIMIZER: ok = optimizer(s, i, st); break;
  case EXEC_ROLE_TIED_SYNC: ok = tied_sync(s, i, st, err); break;
  case EXEC_ROLE_TP: break; /* its collectives ran inside its compute (tp.c) */
  }
  instr_memory_done(s, i, st);
  if (x->mb >= 0 && atomic_fetch_sub(&s->mbs[x->mb].remaining, 1) == 1)
    exec_mb_end(s, (uint32_t)x->mb);
  return ok;
}
