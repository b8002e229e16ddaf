/* sim engine: the discrete-event simulation (docs/design.md, "The simulator's definitions").
 *
 * Time is continuous (seconds, double). A device runs kernels as a fluid: each running compute
 * kernel has remaining work (seconds it would take alone on the whole device) and a rate; the
 * rates are recomputed whenever the set of kernels on the device changes (processor sharing with
 * per-stream SM caps, minus the SMs and memory bandwidth held by communication). A communication
 * op has a latency part (not shared) and a transfer part progressing at 1 / (transfers sharing
 * the busiest participant's link). Events carry a version so that rescheduling a kernel leaves
 * its stale events to be skipped.
 *
 * Devices are grouped in units that provably behave alike (same program class, same link spans,
 * partners in the same units: a colour refinement); one representative per unit is simulated.
 *
 * A profile with host facts (cores_per_node) makes the devices of a node processes sharing its
 * cores: each device's compute then runs at profile_node_speed of the node's computing and
 * waiting devices, recomputed whenever a device of the node starts or stops computing. Every
 * device is then its own unit (whether a device computes depends on its node's others, which
 * the colour refinement does not see).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "../base/json.h"
#include "cost.h"
#include "queue-impl.h"
#include "scenario.h"
#include "sim.h"

/* ---- small helpers over the plan ------------------------------------------------------------ */

static const uint32_t *group_devices(const struct plan *p, uint32_t g, uint32_t *count) {
  *count = p->groups[g].count;
  return p->device_pool + p->groups[g].first;
}

/* The other end of a send/recv node run by device. */
static uint32_t node_peer(const struct plan *p, const struct ir_node *n, uint32_t device) {
  int pos = plan_group_position(p, n->group, device);
  if (pos < 0 || n->peer_group == IR_NONE)
    return IR_NONE;
  uint32_t cnt;
  const uint32_t *d = group_devices(p, n->peer_group, &cnt);
  return (uint32_t)pos < cnt ? d[pos] : IR_NONE;
}

static bool kind_is_p2p(enum ir_node_kind k) {
  return k == IR_NODE_SEND || k == IR_NODE_RECV;
}
static bool kind_is_comm(enum ir_node_kind k) {
  return k != IR_NODE_COMPUTE && k != IR_NODE_OPTIMIZER && k < IR_NODE_KIND_COUNT;
}

/* A collective communicator with several instances in its group (tensor parallelism, EP
 * groups carved from a stage). */
static bool comm_is_split(const struct plan *p, uint32_t comm) {
  return comm < p->n_comms && p->comms[comm].purpose != IR_COMM_PP &&
         (p->comms[comm].split > 1 || p->comms[comm].block);
}

/* The sorted distinct values of map[] over the members of device's instance of split comm k
 * (map NULL: the members themselves); *span where they run, when span is not NULL. */
static GArray *split_instance(const struct plan *p, const struct profile *prof, uint32_t k,
                              uint32_t device, const uint32_t *map, struct profile_span *span) {
  uint32_t n = plan_comm_size(p, k);
  uint32_t *members = g_new0(uint32_t, n ? n : 1);
  plan_comm_members(p, k, device, members);
  if (span)
    *span = profile_span_of(prof, members, n);
  GArray *set = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t i = 0; i < n; i++) {
    uint32_t v = map ? map[members[i]] : members[i];
    g_array_append_val(set, v);
  }
  g_free(members);
  uint32_t *v = (uint32_t *)set->data, w = 0;
  qsort(v, set->len, sizeof *v, piper_cmp_u32);
  for (uint32_t i = 0; i < set->len; i++)
    if (i == 0 || v[i] != v[w - 1])
      v[w++] = v[i];
  g_array_set_size(set, w);
  return set;
}

/* Zeroed memory for the large arrays of the run: past a few MiB mapped on its own, aligned to
 * 2 MiB and marked for transparent huge pages, because with every device simulated each event
 * touches another unit's state and 4 KiB pages made nearly every such touch a TLB miss too. A
 * fresh mapping is zero already: the memset that cleared an aligned allocation was 5% of
 * sim_run's instructions and faulted in every page, those nobody touches (the host loop's
 * arrays without one) included (docs/scale.md). A header before the block says how it came, for
 * big_free. */
struct big_header {
  void *base;    /* what to give back */
  size_t mapped; /* bytes mapped at base; 0: calloc'd */
};

static void *big_alloc0(size_t bytes) {
  size_t huge = (size_t)2 << 20, head = sizeof(struct big_header);
  if (bytes >= 2 * huge) {
    size_t len = (bytes + huge - 1) / huge * huge, mapped = len + 2 * huge;
    void *base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      /* the header sits in the small page before the aligned block */
      char *at = (char *)(((uintptr_t)base + head + huge - 1) / huge * huge);
      madvise(at, len, MADV_HUGEPAGE);
      *((struct big_header *)(void *)at - 1) = (struct big_header){base, mapped};
      return at;
    }
  }
  char *p = calloc(1, head + (bytes ? bytes : 1));
  g_assert(p);
  *(struct big_header *)(void *)p = (struct big_header){p, 0};
  return p + head;
}

static void big_free(void *p) {
  if (!p)
    return;
  const struct big_header *h = (const struct big_header *)p - 1;
  if (h->mapped)
    munmap(h->base, h->mapped);
  else
    free(h->base);
}

/* ---- static memory ------------------------------------------------------------------------ */

/* Bytes per parameter of parameters, gradients and optimizer state. Mixed-precision Adam (ZeRO
 * paper, Rajbhandari et al. 2020, §3.1): 2 bytes of bf16 parameters, 2 of gradients, 12 of
 * optimizer state (fp32 master copy, momentum, variance); fp32 training: 4 + 4 + 8 (momentum,
 * variance). A profile that states how its backend holds them (struct profile_memory) replaces
 * each rate; copy is its bf16 copy of each GEMM weight matrix (bf16 models only), counted with
 * the parameters. */
struct static_rates {
  double params, grads, opt, copy;
};

static struct static_rates static_rates_of(const struct profile *prof, enum model_dtype dtype) {
  bool bf16 = dtype == MODEL_DTYPE_BF16;
  struct static_rates r = {bf16 ? 2 : 4, bf16 ? 2 : 4, bf16 ? 12 : 8, 0};
  if (!prof)
    return r;
  const struct profile_memory *pm = &prof->memory;
  if (pm->param_bytes >= 0)
    r.params = pm->param_bytes;
  if (pm->grad_bytes >= 0)
    r.grads = pm->grad_bytes;
  if (pm->optimizer_bytes >= 0)
    r.opt = pm->optimizer_bytes;
  if (dtype != MODEL_DTYPE_FP32)
    r.copy = pm->compute_copy_bytes;
  return r;
}

/* Parameters of segment seg that are a GEMM's weight matrix (whatever is not an embedding's
 * rows or a norm's scale), of which a backend computing in bf16 keeps a bf16 copy. A tied LM
 * head in one region shares the embedding's matrix and counts it here, where its GEMM is. */
static double segment_gemm_params(const struct model *m, uint32_t seg) {
  const struct model_segment *s = &m->segments[seg];
  double n = 0;
  for (uint32_t o = s->op_first; o < s->op_first + s->op_count; o++) {
    const struct model_op *op = &m->ops[o];
    if (op->kind == MODEL_OP_EMBEDDING || op->kind == MODEL_OP_RMSNORM)
      continue;
    n += (double)op->param_count;
    if (op->kind == MODEL_OP_LM_HEAD_LOSS && op->param_count == 0 && m->tie_word_embeddings)
      n += (double)m->vocab_size * (double)m->hidden_size;
  }
  return n;
}

/* The compute copies of `held` parameters of segment seg (its share on this device: TP slices,
 * local experts): the GEMM weights' part of them. */
static double segment_copy_params(const struct model *m, uint32_t seg, double held) {
  double all = (double)m->segments[seg].param_count, gemm = segment_gemm_params(m, seg);
  return all > 0 ? gemm * held / all : gemm;
}

/* A ZeRO bucket (a reduce-scatter of the class): P parameters on each of N devices, padded to
 * N * ceil(P / N) so the collectives divide evenly, as the executor lays them out. Each level
 * keeps its sharded stores at one shard, ceil(P / N), and the rest whole (padded):
 *   ZeRO-1: params, grads padded, optimizer shard   (bf16: about 4 psi + 12 psi / N)
 *   ZeRO-2: params padded, grads, optimizer shard   (2 psi + 14 psi / N)
 *   ZeRO-3: every store one shard                   (16 psi / N)
 * Compute copies are of whole weights (ZeRO-1/2); ZeRO-3's gathered weights are converted per
 * GEMM, in its scratch. */
static void zero_bucket_memory(const struct plan *p, const struct ir_node *n,
                               const struct static_rates *r, double *params, double *grads,
                               double *opt) {
  double P = (double)p->segsets[n->segset].param_bytes / (double)model_dtype_bytes(p->model->dtype);
  double N = n->replica_degree ? n->replica_degree : 1;
  double shard = ceil(P / N), padded = shard * N;
  *params += r->params * (n->shard_params ? shard : padded);
  *grads += r->grads * (n->shard_grads ? shard : padded);
  *opt += r->opt * shard;
  if (r->copy <= 0 || n->shard_params)
    return;
  const struct ir_segset *ss = &p->segsets[n->segset];
  double all = 0, gemm = 0;
  for (uint32_t j = 0; j < ss->count; j++) {
    uint32_t seg = p->segment_pool[ss->first + j];
    if (seg < p->model->n_segments) {
      all += (double)p->model->segments[seg].param_count;
      gemm += segment_gemm_params(p->model, seg);
    }
  }
  *params += r->copy * (all > 0 ? gemm * P / all : gemm);
}

void sim_static_memory(const struct plan *p, const struct plan_class *c,
                       uint64_t bytes[REPORT_MEM_KIND_COUNT]) {
  sim_static_memory_held(p, c, NULL, bytes);
}

void sim_static_memory_held(const struct plan *p, const struct plan_class *c,
                            const struct profile *prof, uint64_t bytes[REPORT_MEM_KIND_COUNT]) {
  memset(bytes, 0, sizeof(uint64_t) * REPORT_MEM_KIND_COUNT);
  const struct model *m = p->model;
  bool *seen = g_new0(bool, m->n_segments);
  struct static_rates r = static_rates_of(prof, m->dtype);
  double params = 0, grads = 0, opt = 0;
  /* ZeRO buckets first; their segments are then counted */
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_REDUCE_SCATTER || n->segset >= p->n_segsets)
      continue;
    const struct ir_segset *ss = &p->segsets[n->segset];
    bool fresh = true;
    for (uint32_t j = 0; j < ss->count; j++) {
      uint32_t seg = p->segment_pool[ss->first + j];
      fresh &= seg < m->n_segments && !seen[seg];
      if (seg < m->n_segments)
        seen[seg] = true;
    }
    if (fresh)
      zero_bucket_memory(p, n, &r, &params, &grads, &opt);
  }
  /* every other segment held here whole: its local experts, or what no ZeRO bucket shards */
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (n->kind != IR_NODE_COMPUTE || n->segment == IR_NONE || n->segment >= m->n_segments)
      continue;
    if (seen[n->segment])
      continue;
    seen[n->segment] = true;
    double psi = (double)m->segments[n->segment].param_count;
    if (n->tp_degree > 1) /* each TP rank holds its slices (norms and router whole) */
      psi = (double)ir_tp_segment_param_bytes(m, n->segment, n->tp_degree) /
            (double)model_dtype_bytes(m->dtype);
    psi /= (double)(n->shard_degree ? n->shard_degree : 1);
    params += r.params * psi;
    grads += r.grads * psi;
    opt += r.opt * psi;
    if (r.copy > 0)
      params += r.copy * segment_copy_params(m, n->segment, psi);
  }
  g_free(seen);
  bytes[REPORT_MEM_PARAMS] = (uint64_t)llround(params);
  bytes[REPORT_MEM_GRADS] = (uint64_t)llround(grads);
  bytes[REPORT_MEM_OPTIMIZER] = (uint64_t)llround(opt);
}

/* ---- per-class costs ---------------------------------------------------------------------- */

struct class_info {
  double *work;                  /* [n_instrs] compute: seconds alone; comm: unused */
  /* The host thread (profile.host_launch > 0, not ranks sharing cores; NULL otherwise):
   * [n_instrs] its time to enqueue each instruction, and the sync points, where it waits
   * after enqueueing the instruction until the instruction has started on the GPU */
  double *host;
  uint8_t *sync;
  double *host_compute; /* [n_instrs] a compute node's host time (profile_cost.host_seconds) */
  float *mem_frac;               /* [n_instrs] */
  uint32_t *measured, *fallback; /* [n_instrs] op counts */
  uint8_t *tensor_kind;          /* [n_tensors] report_mem_kind */
  uint8_t *tensor_saved;         /* [n_tensors] saved activations */
  uint64_t *tensor_bytes;        /* [n_tensors] as the profile's backend holds them */
  /* The plan's memory points (plan_class_memory_events): instruction i allocates and releases
   * the tensors of events[event_first[i] .. event_first[i + 1]) */
  struct plan_memory_event *events;
  uint32_t *event_first; /* [n_instrs + 1] */
  uint32_t n_streams_used;
  uint32_t *streams_used;
  /* [n_instrs] the streams (bits over streams_used) whose head may become ready when
   * instruction i ends: its own, and those of every instruction that waits on it (all bits
   * past 64 streams). try_advance asks only those (unit_rt.dirty). */
  uint64_t *wake;
  uint32_t n_comms; /* distinct comms used, ascending */
  uint32_t *comms;
  uint32_t *comm_kind; /* per used comm: node kind of its first instruction */
  uint32_t *comm_node; /* per used comm: a node of it (p2p: to find the peer) */
  /* The class's point-to-point instructions by (comm, seq), ascending: a device has one
   * instruction per pair, so a send finds its receive in the peer's class (slot_join). */
  uint32_t n_p2p;
  struct p2p_key *p2p;
  uint32_t *order; /* [n_instrs] the sorted order of a unit's intervals (unit_intervals_sorted) */
  bool have_static; /* static_bytes computed (the same for every unit of the class) */
  uint32_t n_comm_instrs;
  uint64_t static_bytes[REPORT_MEM_KIND_COUNT];
};

struct p2p_key {
  uint32_t comm, seq, instr;
};

static int p2p_key_cmp(const void *a, const void *b) {
  const struct p2p_key *x = a, *y = b;
  if (x->comm != y->comm)
    return x->comm < y->comm ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The class's point-to-point instruction on comm with sequence number seq, or IR_NONE. */
static uint32_t class_p2p_find(const struct class_info *ci, uint32_t comm, uint32_t seq) {
  struct p2p_key key = {comm, seq, 0};
  const struct p2p_key *k = bsearch(&key, ci->p2p, ci->n_p2p, sizeof key, p2p_key_cmp);
  return k ? k->instr : IR_NONE;
}

/* Fills ci->p2p from class c. */
static void class_p2p_index(const struct plan *p, const struct plan_class *c,
                            struct class_info *ci) {
  ci->p2p = g_new(struct p2p_key, c->n_instrs + 1);
  ci->n_p2p = 0;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    if (kind_is_p2p(p->nodes[c->instrs[i].node].kind))
      ci->p2p[ci->n_p2p++] = (struct p2p_key){c->instrs[i].comm, c->instrs[i].seq, i};
  qsort(ci->p2p, ci->n_p2p, sizeof *ci->p2p, p2p_key_cmp);
}

struct cost_key {
  uint32_t segment, pass, shard;
};

/* A compute node's cost. A rerun under recompute costs its forward (full), or its modules'
 * share of it (selective: their forward FLOPs over the segment's, the profile having no
 * separate entry for a module). */
/* Experts whose TP is smaller than the dense layers' (route_split, ir.h) run their sequence
 * shard's routed rows with whole expert weights: every op of an expert segment works per row,
 * so the cost of the whole rows divides by route_split (the weight traffic, a small part at
 * these row counts, is counted divided too). */
static struct profile_cost routed_share(struct profile_cost pc, const struct ir_node *n,
                                        const struct profile *prof) {
  if (n->route_split > 1 && !prof->synthetic) /* textbook units stay per node */
    pc.seconds /= (double)n->route_split;
  return pc;
}

/* A selective rerun's host time: one launch for each module it reruns in each op that has a
 * part of it (a norm, an activation, an up-projection GEMM). */
static double selective_host_seconds(const struct profile *prof, const struct model *m,
                                     const struct ir_node *n) {
  const struct model_segment *s = &m->segments[n->segment];
  double launches = 0;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++)
    for (int k = 0; k < MODEL_MODULE_COUNT; k++)
      if ((n->recompute_modules & MODEL_MODULE_BIT(k)) && m->ops[i].module_flops_fwd[k] > 0)
        launches++;
  return launches * prof->host_launch;
}

static struct profile_cost compute_cost(const struct profile *prof, const struct model *m,
                                        const struct ir_node *n) {
  if (n->segment >= m->n_segments)
    return (struct profile_cost){0};
  if (n->pass != IR_PASS_R)
    return routed_share(profile_compute_cost_tp(prof, m, n->segment, n->pass, n->shard_degree,
                                                n->tp_degree, n->sequence_parallel),
                        n, prof);
  struct profile_cost pc = profile_compute_cost_tp(prof, m, n->segment, IR_PASS_F, n->shard_degree,
                                                   n->tp_degree, n->sequence_parallel);
  if (n->recompute == IR_RECOMPUTE_SELECTIVE) {
    const struct model_segment *s = &m->segments[n->segment];
    double rerun = ir_segment_module_flops(m, n->segment, n->recompute_modules);
    pc.seconds *= s->flops_fwd > 0 ? rerun / s->flops_fwd : 0;
    pc.host_seconds = selective_host_seconds(prof, m, n);
  }
  return routed_share(pc, n, prof);
}

/* The bytes of each of the class's tensors as the profile's backend holds them: the plan
 * counts elements at the model's dtype, a backend may hold them wider (piper-exec: fp32).
 * Scaled whole and rounded up, as the cuda backend plans its arena's slots
 * (exec_arena_tensors_held); the few fixed-width parts of a tensor (int32 token ids, fp32
 * statistics per row) are scaled with the rest. */
static uint64_t *class_tensor_bytes(const struct plan *p, const struct plan_class *c,
                                    const struct profile *prof) {
  uint64_t counted = model_dtype_bytes(p->model->dtype);
  uint64_t held = profile_activation_bytes(prof, p->model->dtype);
  uint64_t *bytes = g_new0(uint64_t, c->n_tensors + 1);
  for (uint32_t t = 0; t < c->n_tensors; t++)
    bytes[t] = held == counted ? c->tensors[t].bytes
                               : (c->tensors[t].bytes * held + counted - 1) / counted;
  return bytes;
}

/* A compute node's cost, from cache: costs depend on (segment, pass, shard) only, and many
 * micro-batches share them; selective reruns cost only their modules: a pass of their own, per
 * module set. */
static const struct profile_cost *cached_compute_cost(const struct plan *p,
                                                      const struct profile *prof,
                                                      const struct ir_node *n,
                                                      GHashTable *cost_cache) {
  bool sel = n->pass == IR_PASS_R && n->recompute == IR_RECOMPUTE_SELECTIVE;
  uint64_t pass = sel ? 15 : n->pass;
  uint64_t modules = sel && n->recompute_modules != IR_RECOMPUTE_MODULES_DEFAULT
                         ? (uint64_t)(n->recompute_modules & 0x7f) << 45
                         : 0;
  uint64_t key = ((uint64_t)n->segment << 24) ^ (pass << 20) ^ modules ^
                 (uint64_t)(n->shard_degree & 0xfffff) ^ ((uint64_t)(n->tp_degree & 0x7ff) << 52) ^
                 ((uint64_t)n->sequence_parallel << 63) ^ ((uint64_t)(n->route_split & 0xff) << 40);
  struct profile_cost *pc = g_hash_table_lookup(cost_cache, &key);
  if (!pc) {
    pc = g_new(struct profile_cost, 1);
    *pc = compute_cost(prof, p->model, n);
    uint64_t *k = g_new(uint64_t, 1);
    *k = key;
    g_hash_table_insert(cost_cache, k, pc);
  }
  return pc;
}

static void class_info_build(const struct plan *p, const struct plan_class *c,
                             const struct profile *prof, GHashTable *cost_cache,
                             struct class_info *ci) {
  ci->work = g_new0(double, c->n_instrs + 1);
  ci->host_compute = g_new0(double, c->n_instrs + 1);
  ci->mem_frac = g_new0(float, c->n_instrs + 1);
  ci->measured = g_new0(uint32_t, c->n_instrs + 1);
  ci->fallback = g_new0(uint32_t, c->n_instrs + 1);
  GArray *comms = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GHashTable *seen = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct plan_instr *in = &c->instrs[i];
    const struct ir_node *n = &p->nodes[in->node];
    if (n->kind == IR_NODE_COMPUTE) {
      const struct profile_cost *pc = cached_compute_cost(p, prof, n, cost_cache);
      ci->work[i] = pc->seconds + prof->instruction_overhead;
      ci->host_compute[i] = pc->host_seconds;
      ci->mem_frac[i] = (float)pc->mem_fraction;
      ci->measured[i] = pc->measured_ops;
      ci->fallback[i] = pc->fallback_ops;
    } else if (n->kind == IR_NODE_OPTIMIZER) {
      double params = 0;
      if (n->segset != IR_NONE && n->segset < p->n_segsets)
        params =
            (double)p->segsets[n->segset].param_bytes / (double)model_dtype_bytes(p->model->dtype);
      /* the whole weights a device holds get their bf16 copy (ZeRO-1/2 too); ZeRO-3's are
       * gathered per use and converted per GEMM, in the ops' own time */
      double copied = p->model->dtype != MODEL_DTYPE_FP32 && !n->shard_params ? params : 0;
      if ((n->shard_optimizer || n->shard_grads || n->shard_params) && n->replica_degree > 1)
        params /= n->replica_degree;
      struct profile_cost pc = profile_optimizer_cost(prof, params, copied);
      ci->work[i] = pc.seconds + prof->instruction_overhead;
      ci->mem_frac[i] = (float)pc.mem_fraction;
    } else if (in->comm != IR_NONE &&
               !g_hash_table_contains(seen, GUINT_TO_POINTER(in->comm + 1))) {
      g_hash_table_add(seen, GUINT_TO_POINTER(in->comm + 1));
      g_array_append_val(comms, in->comm);
    }
  }
  /* sort the used comms, keep a representative node each */
  uint32_t nc = comms->len;
  uint32_t *cs = (uint32_t *)g_array_free(comms, FALSE);
  for (uint32_t i = 1; i < nc; i++) {
    uint32_t v = cs[i], j = i;
    while (j > 0 && cs[j - 1] > v) {
      cs[j] = cs[j - 1];
      j--;
    }
    cs[j] = v;
  }
  ci->n_comms = nc;
  ci->comms = cs;
  ci->comm_kind = g_new0(uint32_t, nc + 1);
  ci->comm_node = g_new0(uint32_t, nc + 1);
  for (uint32_t k = 0; k < nc; k++)
    ci->comm_node[k] = IR_NONE;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct plan_instr *in = &c->instrs[i];
    if (in->comm == IR_NONE)
      continue;
    uint32_t lo = 0, hi = nc;
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      if (cs[mid] < in->comm)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo < nc && ci->comm_node[lo] == IR_NONE) {
      ci->comm_node[lo] = in->node;
      ci->comm_kind[lo] = p->nodes[in->node].kind;
    }
  }
  g_hash_table_destroy(seen);
  class_p2p_index(p, c, ci);
  for (uint32_t i = 0; i < c->n_instrs; i++)
    ci->n_comm_instrs += kind_is_comm(p->nodes[c->instrs[i].node].kind);
  ci->tensor_kind = g_new0(uint8_t, c->n_tensors + 1);
  ci->tensor_saved = g_new0(uint8_t, c->n_tensors + 1);
  for (uint32_t t = 0; t < c->n_tensors; t++) {
    const struct plan_tensor *pt = &c->tensors[t];
    enum ir_node_kind k =
        pt->producer < c->n_instrs ? p->nodes[c->instrs[pt->producer].node].kind : IR_NODE_COMPUTE;
    uint8_t kind = k == IR_NODE_COMPUTE || k == IR_NODE_OPTIMIZER ? REPORT_MEM_ACTIVATIONS
                   : k == IR_NODE_ALL_GATHER                      ? REPORT_MEM_GATHERED
                                                                  : REPORT_MEM_COMM;
    ci->tensor_kind[t] = kind;
    ci->tensor_saved[t] = kind == REPORT_MEM_ACTIVATIONS && pt->kind == PLAN_TENSOR_SAVED;
  }
  ci->tensor_bytes = class_tensor_bytes(p, c, prof);
  plan_class_memory_events(c, &ci->events);
  ci->event_first = g_new0(uint32_t, c->n_instrs + 2);
  for (uint32_t t = 0; t < c->n_tensors; t++) {
    ci->event_first[c->tensors[t].alloc + 1]++;
    ci->event_first[c->tensors[t].release + 1]++;
  }
  for (uint32_t i = 0; i < c->n_instrs; i++)
    ci->event_first[i + 1] += ci->event_first[i];
  ci->streams_used = g_new0(uint32_t, p->n_streams + 1);
  for (uint32_t s = 0; s < p->n_streams; s++)
    if (c->stream_first[s + 1] > c->stream_first[s])
      ci->streams_used[ci->n_streams_used++] = s;
}

/* Launches of the optimizer step (Megatron's distributed optimizer: the gradients' norm and
 * its all-reduce, the clip, the fused multi-tensor Adam, the copy to the bf16 weights) */
#define HOST_OPTIMIZER_LAUNCHES 4

/* Whether instruction i of c is a MoE dispatch all-to-all into a forward (or rerun) of the
 * experts: the one before which Megatron's dropless dispatcher copies the tokens per expert to
 * the host and waits for them (token_dispatcher.py, _maybe_dtoh_and_synchronize at
 * "before_ep_alltoall"). Backward all-to-alls reuse the sizes the forward kept on the host. */
static bool instr_is_dispatch(const struct plan *p, const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  const struct ir_node *n = &p->nodes[in->node];
  if (n->kind != IR_NODE_ALL_TO_ALL)
    return false;
  for (uint32_t w = 0; w < in->write_count; w++) {
    const struct plan_tensor *t = &c->tensors[c->writes[in->write_first + w]];
    for (uint32_t k = 0; k < t->consumer_count; k++) {
      const struct ir_node *x = &p->nodes[c->instrs[c->consumers[t->consumer_first + k]].node];
      if (x->kind == IR_NODE_COMPUTE && x->shard_degree > 1 &&
          (x->pass == IR_PASS_F || x->pass == IR_PASS_R))
        return true;
    }
  }
  return false;
}

/* The host thread's costs (class_info.host, .sync): a compute node's launches, one a
 * communication (a p2p group's part, a collective; a TP or CP node as many as it stands for),
 * the optimizer's few, each at the profile's host_launch; a synthetic profile's host_ms
 * for every instruction. */
static void class_host_build(const struct plan *p, const struct plan_class *c,
                             const struct profile *prof, struct class_info *ci) {
  ci->host = g_new0(double, c->n_instrs + 1);
  ci->sync = g_new0(uint8_t, c->n_instrs + 1);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c->instrs[i].node];
    if (prof->synthetic)
      ci->host[i] = prof->syn_host; /* the same for every instruction */
    else if (n->kind == IR_NODE_COMPUTE)
      ci->host[i] = ci->host_compute[i];
    else if (n->kind == IR_NODE_OPTIMIZER)
      ci->host[i] = HOST_OPTIMIZER_LAUNCHES * prof->host_launch;
    else
      ci->host[i] = (n->collectives > 1 ? n->collectives : 1) * prof->host_launch;
    ci->sync[i] = prof->moe_dispatch_sync && instr_is_dispatch(p, c, i);
  }
}

/* Fills ci->wake (class_info) from class c. */
static void class_wake_build(const struct plan *p, const struct plan_class *c,
                             struct class_info *ci) {
  ci->wake = g_new0(uint64_t, c->n_instrs + 1);
  if (ci->n_streams_used > 64) {
    for (uint32_t i = 0; i < c->n_instrs; i++)
      ci->wake[i] = ~(uint64_t)0;
    return;
  }
  uint64_t *bit = g_new0(uint64_t, p->n_streams + 1);
  for (uint32_t k = 0; k < ci->n_streams_used; k++)
    bit[ci->streams_used[k]] = (uint64_t)1 << k;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct plan_instr *in = &c->instrs[i];
    ci->wake[i] |= bit[in->stream];
    for (uint32_t w = 0; w < in->wait_count; w++)
      ci->wake[c->waits[in->wait_first + w]] |= bit[in->stream];
  }
  g_free(bit);
}

static void class_info_free(struct class_info *ci) {
  g_free(ci->work);
  g_free(ci->host_compute);
  g_free(ci->host);
  g_free(ci->sync);
  g_free(ci->mem_frac);
  g_free(ci->measured);
  g_free(ci->fallback);
  g_free(ci->tensor_kind);
  g_free(ci->tensor_saved);
  g_free(ci->tensor_bytes);
  g_free(ci->events);
  g_free(ci->event_first);
  g_free(ci->streams_used);
  g_free(ci->wake);
  g_free(ci->comms);
  g_free(ci->comm_kind);
  g_free(ci->comm_node);
  g_free(ci->p2p);
  g_free(ci->order);
}

/* ---- units (colour refinement) ------------------------------------------------------------ */

static uint32_t intern_key(GHashTable *h, GArray *key) {
  GBytes *b = g_bytes_new(key->data, key->len * sizeof(uint32_t));
  gpointer v = g_hash_table_lookup(h, b);
  if (v) {
    g_bytes_unref(b);
    return GPOINTER_TO_UINT(v) - 1;
  }
  uint32_t id = g_hash_table_size(h);
  g_hash_table_insert(h, b, GUINT_TO_POINTER(id + 1));
  return id;
}

/* The interned colour set of device's instance of split comm k, worked out once per instance
 * (cache: (comm, lowest member) -> colour set):
 * every member of an instance has the same set, and sorting it for each of thousands of devices
 * was most of a planner's one-micro-batch simulation at 8,192 devices. */
static uint32_t split_instance_colour(const struct plan *p, const struct profile *prof, uint32_t k,
                                      uint32_t device, const uint32_t *col, GHashTable *set_ids,
                                      GHashTable *cache) {
  uint32_t n = plan_comm_size(p, k), lowest = UINT32_MAX;
  uint32_t *members = g_new0(uint32_t, n ? n : 1);
  plan_comm_members(p, k, device, members);
  for (uint32_t i = 0; i < n; i++)
    lowest = MIN(lowest, members[i]);
  g_free(members);
  int64_t key = (int64_t)(((uint64_t)k << 32) | lowest);
  gpointer hit;
  if (g_hash_table_lookup_extended(cache, &key, NULL, &hit))
    return GPOINTER_TO_UINT(hit);
  GArray *set = split_instance(p, prof, k, device, col, NULL);
  uint32_t v = intern_key(set_ids, set);
  g_array_free(set, TRUE);
  int64_t *slot = g_new(int64_t, 1);
  *slot = key;
  g_hash_table_insert(cache, slot, GUINT_TO_POINTER(v));
  return v;
}

/* colour[d] for every device: devices of one colour provably run at the same times. */
/* What a scenario does to device d, for its initial colour: its factors' bits, and the device
 * itself when its compute varies per instruction (no other device runs like it then). */
static void scenario_key(const struct sim_scenario *sc, uint32_t d, GArray *key) {
  if (!sc)
    return;
  double v[3] = {sc->compute[d], sc->inter_bw[d], sc->intra_bw[d]};
  uint32_t w[6];
  memcpy(w, v, sizeof w);
  g_array_append_vals(key, w, 6);
  uint32_t own = sim_scenario_varies(sc, d) ? d : IR_NONE;
  g_array_append_val(key, own);
}

static uint32_t *refine_colours(const struct plan *p, const struct profile *prof,
                                const struct class_info *ci, bool collapse,
                                const struct sim_scenario *sc, uint32_t *n_colours) {
  uint32_t nd = p->n_devices;
  uint32_t *col = g_new(uint32_t, nd);
  if (!collapse) {
    for (uint32_t d = 0; d < nd; d++)
      col[d] = d;
    *n_colours = nd;
    return col;
  }
  uint32_t *next = g_new(uint32_t, nd);
  GArray *key = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  /* initial colour: class and the span of every p2p link (intra or inter node) */
  GHashTable *h =
      g_hash_table_new_full(g_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref, NULL);
  for (uint32_t d = 0; d < nd; d++) {
    uint32_t c = p->device_class[d];
    g_array_set_size(key, 0);
    g_array_append_val(key, c);
    for (uint32_t k = 0; k < ci[c].n_comms; k++) {
      if (!kind_is_p2p(ci[c].comm_kind[k]))
        continue;
      uint32_t peer = node_peer(p, &p->nodes[ci[c].comm_node[k]], d);
      uint32_t devs[2] = {d, peer};
      struct profile_span sp = profile_span_of(prof, devs, peer == IR_NONE ? 1 : 2);
      g_array_append_val(key, sp.n_nodes);
    }
    scenario_key(sc, d, key);
    col[d] = intern_key(h, key);
  }
  uint32_t n = g_hash_table_size(h);
  g_hash_table_destroy(h);
  /* refine by partners' colours until stable */
  for (int iter = 0; iter < 64; iter++) {
    h = g_hash_table_new_full(g_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref, NULL);
    GHashTable *set_ids =
        g_hash_table_new_full(g_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref, NULL);
    /* colour set of every collective comm (shared by its members) */
    /* (comm, lowest member) -> colour set of that split instance (split_instance_colour) */
    GHashTable *instance_colour = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    uint32_t *comm_set = g_new(uint32_t, p->n_comms + 1);
    for (uint32_t k = 0; k < p->n_comms; k++) {
      comm_set[k] = IR_NONE;
      if (p->comms[k].purpose == IR_COMM_PP || p->comms[k].group >= p->n_groups)
        continue;
      uint32_t cnt;
      const uint32_t *gd = group_devices(p, p->comms[k].group, &cnt);
      GArray *set = g_array_new(FALSE, FALSE, sizeof(uint32_t));
      for (uint32_t i = 0; i < cnt; i++)
        g_array_append_val(set, col[gd[i]]);
      uint32_t *v = (uint32_t *)set->data;
      /* a sort, not insertion: colours that alternate along a group (devices at node edges
       * have other link spans) made insertion quadratic in the group */
      qsort(v, set->len, sizeof *v, piper_cmp_u32);
      uint32_t w = 0;
      for (uint32_t i = 0; i < set->len; i++)
        if (i == 0 || v[i] != v[w - 1])
          v[w++] = v[i];
      g_array_set_size(set, w);
      comm_set[k] = intern_key(set_ids, set);
      g_array_free(set, TRUE);
    }
    for (uint32_t d = 0; d < nd; d++) {
      uint32_t c = p->device_class[d];
      g_array_set_size(key, 0);
      g_array_append_val(key, col[d]);
      for (uint32_t k = 0; k < ci[c].n_comms; k++) {
        uint32_t v;
        if (kind_is_p2p(ci[c].comm_kind[k])) {
          uint32_t peer = node_peer(p, &p->nodes[ci[c].comm_node[k]], d);
          v = peer == IR_NONE ? IR_NONE : col[peer];
        } else if (comm_is_split(p, ci[c].comms[k])) { /* the colours of d's own instance */
          v = split_instance_colour(p, prof, ci[c].comms[k], d, col, set_ids, instance_colour);
        } else {
          v = comm_set[ci[c].comms[k]];
        }
        g_array_append_val(key, v);
      }
      next[d] = intern_key(h, key);
    }
    uint32_t n2 = g_hash_table_size(h);
    g_hash_table_destroy(h);
    g_hash_table_destroy(set_ids);
    g_hash_table_destroy(instance_colour);
    g_free(comm_set);
    memcpy(col, next, nd * sizeof(uint32_t));
    if (n2 == n)
      break;
    n = n2;
  }
  g_array_free(key, TRUE);
  g_free(next);
  *n_colours = n;
  return col;
}

/* ---- runtime state ------------------------------------------------------------------------ */

enum { EV_KERNEL_END, EV_COMM_END, EV_WAKE, EV_HOST };

/* A kernel end names its unit and instruction, so handling it touches that unit only (no
 * search over the units, no table over every instruction of every unit: with --no-collapse
 * both outgrow the caches). A comm end names its slot (unit unused). Events come out in (time,
 * push order): struct sim_queue (queue-impl.h). */
struct kernel { /* a running compute kernel */
  uint32_t instr;
  uint32_t version; /* of its latest end event; older ones are stale */
  /* The queue's handle of its latest end event (UINT32_MAX: none yet). A new rate cancels the
   * old event in the queue (sim_queue_cancel), so popping it skips it without loading the unit
   * and its kernels: two of every three kernel end events were stale, each two cache misses
   * (docs/scale.md). */
  uint32_t ev;
  double remaining, rate, last, cap;
  float mem_frac;
};

/* Entry i of array f of unit u (the units of a class share interleaved arrays: unit_arrays). */
#define AT(u, f, i) ((u)->f[(size_t)(i) * (u)->stride])

/* What every event of a unit touches comes first (its first two cache lines: ids, running
 * kernels and communications, the arrays' pointers), memory and the rest after. */
struct unit_rt {
  uint32_t cls;
  uint32_t rep;
  uint32_t stride;    /* entries of the arrays below are stride apart: AT */
  uint32_t n_kernels;
  uint32_t n_ops;
  uint32_t n_link[2]; /* transfers running: intra, inter node */
  uint32_t done;
  /* Bits over the class's streams_used whose head may have become ready since try_advance
   * last asked (class_info.wake): a head becomes ready only when its stream's instruction or
   * one it waits on ends (finish_instr), so the others need not be asked. */
  uint64_t dirty;
  struct kernel *kernels;
  uint32_t *ops;      /* running comm ops (slot ids) */
  double comm_sm;     /* SM share held by running communication */
  uint32_t *pos;      /* [n_streams] next entry of stream_instrs */
  uint8_t *busy;      /* [n_streams] */
  double *start, *end; /* [n_instrs], end < 0 while not done */
  uint32_t *slot;      /* [n_instrs] rendezvous of comm instructions */
  double *posted;      /* [n_instrs] when a communication was posted (it starts when its
                          parties have all been) */
  uint32_t *remaining; /* [n_tensors] consumers still to run */
  uint32_t *group_left; /* [n_streams] parts of the stream's running p2p group still to meet */
  uint32_t *blocker;    /* [n_streams] a wait of the stream's head found not done (head_ready) */
  double *queued;       /* [n_streams] time communication waited for its stream (ready else) */
  int64_t mem[REPORT_MEM_KIND_COUNT];
  int64_t mem_total; /* the sum of mem, kept as it moves (mem_point asked it twice an instruction) */
  int64_t saved, peak_saved;
  int64_t peak_total;
  bool keep_tl; /* records a timeline (sim_options.memory_timeline_limit) */
  uint8_t *polled;     /* [n_instrs] host loop: 1 once the rank has seen its communication's
                          transfer end, 2 once the instruction is done (comm_polled) */
  uint8_t *held;       /* [n_instrs] host loop: a receive's buffers counted from when its
                          stream was free and it waited for nothing (hold_ready_recv) */
  int64_t peak_breakdown[REPORT_MEM_KIND_COUNT];
  uint32_t base;       /* global id of instruction 0: base + instr */
  void *block;         /* the arrays above (unit_arrays; first member of its class only,
                          NULL for the others) */
  uint32_t cap_kernels, cap_ops;
  bool own_kernels, own_ops; /* kernels, ops outgrew their places in the pools (sim_pools) */
  double idle_since; /* ranks sharing a node's cores: when its idle spell began; -1 computing */
  /* The host loop (ranks sharing a node's cores): communication that ended while the rank
   * computed, seen when its task ends (instructions) */
  uint32_t n_seen_late, cap_seen_late;
  uint32_t *seen_late;
  /* The memory timeline, inline rather than a GArray: appending touched the array's header,
   * a separate allocation, and read the last point back to compare times (two cache misses per
   * point with as many timelines as devices). tl_t is the last point's time while tl_len > 0. */
  struct report_memory_point *tl;
  uint32_t tl_len, tl_cap;
  double tl_t;
  /* The host thread (class_info.host): instructions before host_pos are enqueued
   * (UINT32_MAX: no host thread, all are); host_free: when it enqueued the last of them;
   * host_blocked: it waits at that one, a sync point, for the GPU to start it. */
  uint32_t host_pos;
  bool host_blocked;
  double host_free;
};

/* What a communication costs; slots share one entry per distinct cost (sim.costs). */
struct slot_cost {
  double latency, transfer, sm_share;
  bool inter;
};

enum { RUN_LEVELS = 24, RUN_HIST_PARTS = 8 };

/* A running communication's state, from a pool (sim.runs) while it runs. */
struct slot_run {
  double lat_end, remaining, rate, last, end_t;
  uint32_t mark; /* visit of the last pass over parties that met it (first_visit) */
  /* A collective of many parties shares the busiest party's link: the largest n_link of its
   * parties. Rescheduling it at every start and end of any of its members' other transfers
   * scanned every party (the square of a data-parallel group over a step), so a large one
   * keeps how many of its parties are at each level (run_levels); hist is false for small
   * ones, and for a party past the last level, which fall back to the scan. */
  bool hist;
  uint32_t level[RUN_LEVELS];
};

/* A rendezvous: p2p pair or collective; its comm op. 32 bytes: with every device simulated
 * there is a slot per point-to-point pair (128 a device here), so its cost lives in a shared
 * table and its running state in a pool of the few running at once. */
struct slot {
  uint32_t expected, arrived;
  uint32_t part_first, part_count; /* into sim.parts: (unit, instr) */
  uint32_t cost;                   /* into sim.costs */
  uint32_t run;                    /* into sim.runs while running, else IR_NONE */
  uint32_t version;
  uint32_t need; /* host loop: polls still needed before the parties that wait complete */
};

struct sim {
  const struct plan *p;
  const struct profile *prof;
  const struct sim_options *o;
  struct class_info *ci;
  uint32_t n_units;
  struct unit_rt *u;
  struct kernel *kernel_pool; /* POOL_KERNELS a unit, then its own (unit_rt.own_kernels) */
  uint32_t *op_pool;          /* POOL_OPS a unit */
  uint32_t *unit_of_device;
  uint32_t *gid_unit; /* not stored: found via bases (binary search) */
  uint32_t n_slots;
  struct slot *slots;
  struct slot_cost *costs;
  struct slot_run *runs;
  uint32_t n_runs, cap_runs, *free_runs, n_free_runs;
  size_t interval_next; /* next free entry of sim_result.interval_block (sim_collect) */
  uint32_t visit;      /* passes over a communication's participants so far */
  uint32_t *parts; /* pairs (unit, instr) */
  struct sim_queue heap;
  uint64_t events;
  double t_first, t_last;
  /* ranks sharing a node's cores (profile cores_per_node): units are devices here */
  bool sharing;
  uint32_t *unit_node;                  /* [n_units] */
  uint32_t *node_first, *node_units;    /* units of node k: node_units[node_first[k] ..] */
  uint32_t *node_running, *node_size;   /* [n_nodes] units computing; units */
  uint32_t n_nodes_alloc;
  GArray **node_wakers; /* [n_nodes] struct waker: idle ranks waiting for a core, oldest first */
};

/* A rank idle in its loop whose communication has ended while every core of its node
 * computes: it sees the end when the scheduler gives it a core (node_handover). */
struct waker {
  uint32_t unit, instr;
};

/* Water-filling of the device's compute capacity among running kernels, each capped by its
 * stream's SM share; communication holds comm_sm of the SMs and, while it runs, a share of
 * the memory bandwidth that slows the memory-bound part of every kernel. */
static void unit_rates(struct sim *s, struct unit_rt *u, double *rates) {
  uint32_t n = u->n_kernels;
  if (n == 0)
    return;
  double capacity = 1.0 - (u->comm_sm < 0.95 ? u->comm_sm : 0.95);
  if (s->sharing) {
    uint32_t node = s->unit_node[u - s->u];
    double running = s->node_running[node];
    capacity *= profile_node_speed(s->prof, running, s->node_size[node] - running);
  }
  /* caps are few and small in number: order kernels by cap (selection by index) */
  uint32_t order[64];
  uint32_t m = n < 64 ? n : 64;
  for (uint32_t i = 0; i < m; i++)
    order[i] = i;
  for (uint32_t i = 1; i < m; i++) {
    uint32_t v = order[i], j = i;
    while (j > 0 && u->kernels[order[j - 1]].cap > u->kernels[v].cap) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = v;
  }
  double left = capacity;
  for (uint32_t k = 0; k < n; k++) {
    uint32_t i = k < m ? order[k] : k;
    double share = left / (double)(n - k);
    double r = u->kernels[i].cap < share ? u->kernels[i].cap : share;
    rates[i] = r;
    left -= r;
  }
  double mem_slow = u->n_ops > 0 ? 1.0 - s->prof->comm_memory_share : 1.0;
  for (uint32_t i = 0; i < n; i++) {
    double mf = u->kernels[i].mem_frac;
    if (mf > 0 && mem_slow < 1.0) {
      /* time per unit work = (1-mf)/r + mf/(r*mem_slow) */
      rates[i] = rates[i] / ((1.0 - mf) + mf / mem_slow);
    }
  }
}

static void unit_settle(struct unit_rt *u, double t) {
  for (uint32_t i = 0; i < u->n_kernels; i++) {
    struct kernel *k = &u->kernels[i];
    k->remaining -= (t - k->last) * k->rate;
    if (k->remaining < 0)
      k->remaining = 0;
    k->last = t;
  }
}

static void unit_reschedule_kernels(struct sim *s, struct unit_rt *u, double t) {
  uint32_t ui = (uint32_t)(u - s->u);
  double rates[256];
  double *r = u->n_kernels <= 256 ? rates : g_new(double, u->n_kernels);
  unit_rates(s, u, r);
  for (uint32_t i = 0; i < u->n_kernels; i++) {
    struct kernel *k = &u->kernels[i];
    if (r[i] == k->rate)
      continue;
    k->rate = r[i];
    double end = k->remaining <= 0 ? t : t + k->remaining / (k->rate > 0 ? k->rate : 1e-30);
    if (k->ev != UINT32_MAX)
      sim_queue_cancel(&s->heap, k->ev);
    k->ev = sim_queue_push(&s->heap, end, EV_KERNEL_END, k->instr, ++k->version, ui);
  }
  if (r != rates)
    g_free(r);
}

/* New rates and end events for u's running kernels. Half the calls (every party of every
 * communication, at its start and end) find none, and the full function's frame (a rates
 * array on the stack) cost more than the rest of such a call. */
static inline void unit_reschedule(struct sim *s, struct unit_rt *u, double t) {
  if (u->n_kernels > 0)
    unit_reschedule_kernels(s, u, t);
}

static void op_settle(struct slot_run *sl, double t) {
  if (t > sl->lat_end) {
    double from = sl->last > sl->lat_end ? sl->last : sl->lat_end;
    sl->remaining -= (t - from) * sl->rate;
    if (sl->remaining < 0)
      sl->remaining = 0;
  }
  sl->last = t;
}

static void op_reschedule(struct sim *s, uint32_t id, double t) {
  struct slot *slot = &s->slots[id];
  struct slot_run *sl = &s->runs[slot->run];
  bool inter = s->costs[slot->cost].inter;
  uint32_t share = 1;
  if (sl->hist) {
    for (uint32_t l = RUN_LEVELS - 1; l > 1; l--)
      if (sl->level[l] > 0) {
        share = l;
        break;
      }
  } else {
    for (uint32_t k = 0; k < slot->part_count; k++) {
      uint32_t n = s->u[s->parts[2 * (slot->part_first + k)]].n_link[inter];
      if (n > share)
        share = n;
    }
  }
  double rate = 1.0 / share;
  if (rate == sl->rate)
    return;
  sl->rate = rate;
  double from = t > sl->lat_end ? t : sl->lat_end;
  sl->end_t = sl->remaining <= 0 ? from : from + sl->remaining / rate;
  sim_queue_push(&s->heap, sl->end_t, EV_COMM_END, id, ++slot->version, 0);
}

static void mem_point(struct sim *s, struct unit_rt *u, double t) {
  int64_t total = u->mem_total;
  if (total > u->peak_total) {
    u->peak_total = total;
    memcpy(u->peak_breakdown, u->mem, sizeof u->mem);
  }
  if (u->saved > u->peak_saved)
    u->peak_saved = u->saved;
  (void)s;
  if (!u->keep_tl)
    return;
  struct report_memory_point pt = {.t = t};
  for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
    pt.bytes[k] = (uint64_t)u->mem[k];
  if (u->tl_len > 0 && u->tl_t == t) {
    u->tl[u->tl_len - 1] = pt;
    return;
  }
  if (u->tl_len == u->tl_cap) {
    u->tl_cap = u->tl_cap ? 2 * u->tl_cap : 16;
    u->tl = g_renew(struct report_memory_point, u->tl, u->tl_cap);
  }
  u->tl[u->tl_len++] = pt;
  u->tl_t = t;
}

/* The memory rule (struct plan_tensor): what instruction i allocates comes to life when it
 * starts (is issued on its stream), as a kernel's output or a posted receive's buffer does. */
static void alloc_tensors(struct sim *s, struct unit_rt *u, uint32_t i, double t) {
  const struct class_info *ci = &s->ci[u->cls];
  bool changed = false;
  for (uint32_t k = ci->event_first[i]; k < ci->event_first[i + 1]; k++) {
    uint32_t tid = ci->events[k].tensor;
    if (ci->events[k].release || ci->tensor_bytes[tid] == 0)
      continue;
    u->mem[ci->tensor_kind[tid]] += (int64_t)ci->tensor_bytes[tid];
    u->mem_total += (int64_t)ci->tensor_bytes[tid];
    if (ci->tensor_saved[tid])
      u->saved += (int64_t)ci->tensor_bytes[tid];
    changed = true;
  }
  if (changed)
    mem_point(s, u, t);
}

/* One of tensor tid's last uses (a consumer, or its release point) has ended: the last frees
 * it. Returns whether memory changed. */
static bool use_done(struct unit_rt *u, const struct class_info *ci, uint32_t tid) {
  if (AT(u, remaining, tid) == 0 || --AT(u, remaining, tid) > 0 || ci->tensor_bytes[tid] == 0)
    return false;
  u->mem[ci->tensor_kind[tid]] -= (int64_t)ci->tensor_bytes[tid];
  u->mem_total -= (int64_t)ci->tensor_bytes[tid];
  if (ci->tensor_saved[tid])
    u->saved -= (int64_t)ci->tensor_bytes[tid];
  return true;
}

static void finish_instr(struct sim *s, struct unit_rt *u, uint32_t i, double t) {
  const struct plan_class *c = &s->p->classes[u->cls];
  const struct class_info *ci = &s->ci[u->cls];
  const struct plan_instr *in = &c->instrs[i];
  AT(u, end, i) = t;
  AT(u, busy, in->stream) = 0;
  AT(u, pos, in->stream)++;
  AT(u, blocker, in->stream) = IR_NONE; /* a new head */
  u->dirty |= ci->wake[i];
  u->done++;
  if (t > s->t_last)
    s->t_last = t;
  /* A tensor goes when its release point and every consumer have ended (struct plan_tensor):
   * the release point is the last consumer in issue order, so on one stream that is the
   * release itself. */
  bool freed = false;
  for (uint32_t k = 0; k < in->read_count; k++)
    freed |= use_done(u, ci, c->reads[in->read_first + k]);
  for (uint32_t k = ci->event_first[i]; k < ci->event_first[i + 1]; k++)
    if (ci->events[k].release)
      freed |= use_done(u, ci, ci->events[k].tensor);
  if (freed)
    mem_point(s, u, t);
}

/* Whether this pass over a communication's participants meets slot id for the first time. The
 * members of a collective all run it (and often the same others), so visiting every member's
 * operations repeats each one once per member, and op_reschedule walks the members again: a
 * square of the group per start and end. Settling and rescheduling a slot twice at one time
 * changes nothing (the second settle advances by zero, the second reschedule finds its rate
 * unchanged and pushes no event), so the first visit does all of it, in the same order. */
static bool first_visit(struct sim *s, uint32_t id, uint32_t visit) {
  struct slot_run *r = &s->runs[s->slots[id].run]; /* a unit's ops are running */
  if (r->mark == visit)
    return false;
  r->mark = visit;
  return true;
}

/* Brings every participant of a communication, and what runs beside it, up to time t before
 * the set of running operations changes (rates are recomputed from then on). */
static void settle_parts(struct sim *s, const struct slot *sl, double t) {
  uint32_t visit = ++s->visit;
  for (uint32_t k = 0; k < sl->part_count; k++) {
    struct unit_rt *u = &s->u[s->parts[2 * (sl->part_first + k)]];
    unit_settle(u, t);
    for (uint32_t j = 0; j < u->n_ops; j++)
      if (first_visit(s, u->ops[j], visit))
        op_settle(&s->runs[s->slots[u->ops[j]].run], t);
  }
}

/* New rates for the participants of a communication and every operation they run. */
static void reschedule_parts(struct sim *s, const struct slot *sl, double t) {
  uint32_t visit = ++s->visit;
  for (uint32_t k = 0; k < sl->part_count; k++) {
    struct unit_rt *u = &s->u[s->parts[2 * (sl->part_first + k)]];
    unit_reschedule(s, u, t);
    for (uint32_t j = 0; j < u->n_ops; j++)
      if (first_visit(s, u->ops[j], visit))
        op_reschedule(s, u->ops[j], t);
  }
}

/* How late participant (u, instr) of a communication that ends at t sees its end. A rank that
 * computes picks the completion up in its own loop, and a sender posts and moves on: neither is
 * late. A rank idle in its loop (blocked on a receive or a collective)
 *  - when every core of its node computes for others, must first be given a core (*handover:
 *    it waits in its node's queue): at the next task end on the node whose rank tests
 *    communication in flight (node_handover), or after wake_latency, the scheduler's slice;
 *  - else sees it at once while its idle spell is within the loop's spin window (it polls
 *    without sleeping), and loop_late after (it sleeps between polls, and the message needs
 *    both sides' polls). */
static double comm_lateness(const struct sim *s, const struct unit_rt *u, uint32_t instr,
                            double t, bool *handover) {
  *handover = false;
  if (!s->sharing || u->n_kernels > 0)
    return 0;
  const struct plan_class *c = &s->p->classes[u->cls];
  if (s->p->nodes[c->instrs[instr].node].kind == IR_NODE_SEND)
    return 0;
  uint32_t node = s->unit_node[u - s->u], cores = s->prof->cores_per_node;
  if (s->prof->wake_latency > 0 && s->node_running[node] >= cores) {
    *handover = true;
    return s->prof->wake_latency;
  }
  if (u->idle_since >= 0 && t - u->idle_since > s->prof->loop_spin)
    return s->prof->loop_late;
  return 0;
}

/* Unit u's n_link[inter] has moved from `from` by delta: the large collectives it runs beside
 * slot `self` move one party each (struct slot_run). */
static void run_levels_move(struct sim *s, const struct unit_rt *u, uint32_t self, bool inter,
                            uint32_t from, int delta) {
  for (uint32_t j = 0; j < u->n_ops; j++) {
    const struct slot *o = &s->slots[u->ops[j]];
    struct slot_run *r = &s->runs[o->run];
    if (u->ops[j] == self || !r->hist || s->costs[o->cost].inter != inter)
      continue;
    uint32_t to = (uint32_t)((int)from + delta);
    if (from >= RUN_LEVELS || to >= RUN_LEVELS) {
      r->hist = false;
      continue;
    }
    r->level[from]--;
    r->level[to]++;
  }
}

/* The levels of a collective that starts (after its parties' n_link counted it). */
static void run_levels_init(struct sim *s, uint32_t id) {
  const struct slot *sl = &s->slots[id];
  struct slot_run *r = &s->runs[sl->run];
  bool inter = s->costs[sl->cost].inter;
  r->hist = sl->part_count > RUN_HIST_PARTS;
  for (uint32_t k = 0; k < sl->part_count && r->hist; k++) {
    uint32_t n = s->u[s->parts[2 * (sl->part_first + k)]].n_link[inter];
    if (n >= RUN_LEVELS)
      r->hist = false;
    else
      r->level[n]++;
  }
}

/* A running state from the pool (struct slot_run). */
static uint32_t run_new(struct sim *s) {
  if (s->n_free_runs > 0)
    return s->free_runs[--s->n_free_runs];
  if (s->n_runs == s->cap_runs) {
    s->cap_runs = s->cap_runs ? 2 * s->cap_runs : 256;
    s->runs = g_renew(struct slot_run, s->runs, s->cap_runs);
    s->free_runs = g_renew(uint32_t, s->free_runs, s->cap_runs);
  }
  return s->n_runs++;
}

/* ---- the host thread ---------------------------------------------------------------------
 * A GPU runs what its host has enqueued (docs/sim.md "The host thread"): the host enqueues the
 * instructions in issue order, instruction i taking class_info.host[i], and runs ahead of the
 * GPU as far as it can; an instruction is issued no earlier than it is enqueued (head_ready).
 * At a sync point the host, having enqueued it, waits for the GPU to start it, so what
 * follows reaches the GPU only one host cost after, and the GPU idles meanwhile if its queue
 * has drained. Instruction 0 was enqueued before the step began. */

/* Schedules the host's enqueueing of its next instruction, from host_free on. */
static void host_schedule(struct sim *s, struct unit_rt *u) {
  if (u->host_pos >= s->p->classes[u->cls].n_instrs)
    return;
  sim_queue_push(&s->heap, u->host_free + s->ci[u->cls].host[u->host_pos], EV_HOST, u->host_pos,
                 0, (uint32_t)(u - s->u));
}

/* The host has enqueued instruction i at t: a head may be ready now; the host goes on unless
 * i is a sync point the GPU has not started yet. */
static void host_enqueued(struct sim *s, struct unit_rt *u, uint32_t i, double t) {
  u->host_pos = i + 1;
  u->host_free = t;
  u->dirty = ~(uint64_t)0;
  if (s->ci[u->cls].sync[i] && AT(u, start, i) < 0)
    u->host_blocked = true;
  else
    host_schedule(s, u);
}

/* Instruction i of u starts on the GPU at t: a host waiting at it goes on. */
static inline void host_started(struct sim *s, struct unit_rt *u, uint32_t i, double t) {
  if (u->host_blocked && u->host_pos == i + 1) {
    u->host_blocked = false;
    u->host_free = t;
    host_schedule(s, u);
  }
}

static void start_comm(struct sim *s, uint32_t id, double t) {
  struct slot *sl = &s->slots[id];
  const struct slot_cost *cost = &s->costs[sl->cost];
  settle_parts(s, sl, t);
  sl->run = run_new(s);
  s->runs[sl->run] =
      (struct slot_run){.lat_end = t + cost->latency, .remaining = cost->transfer, .last = t};
  memset(s->runs[sl->run].level, 0, sizeof s->runs[sl->run].level);
  for (uint32_t k = 0; k < sl->part_count; k++) {
    uint32_t ui = s->parts[2 * (sl->part_first + k)],
             instr = s->parts[2 * (sl->part_first + k) + 1];
    struct unit_rt *u = &s->u[ui];
    AT(u, start, instr) = t;
    host_started(s, u, instr, t);
    if (t < s->t_first)
      s->t_first = t;
    if (u->n_ops == u->cap_ops) {
      u->cap_ops = u->cap_ops ? 2 * u->cap_ops : 8;
      u->ops = u->own_ops ? g_renew(uint32_t, u->ops, u->cap_ops)
                          : g_memdup2(u->ops, sizeof(uint32_t) * u->cap_ops);
      u->own_ops = true;
    }
    u->ops[u->n_ops++] = id;
    run_levels_move(s, u, id, cost->inter, u->n_link[cost->inter]++, +1);
    u->comm_sm += cost->sm_share;
  }
  run_levels_init(s, id);
  reschedule_parts(s, sl, t);
}

static void try_advance(struct sim *s, struct unit_rt *u, double t);

/* Communication instruction i has ended. A part of a group waits for the others: the group
 * ends, for its stream and for whatever waits on a part, when its last part does, and it is
 * traced as one box from its first part's start. */
static void part_done(struct sim *s, struct unit_rt *u, uint32_t i, double t) {
  const struct plan_class *c = &s->p->classes[u->cls];
  uint32_t st = c->instrs[i].stream, n = c->instrs[i].group_parts;
  if (n == 0) {
    finish_instr(s, u, i, t);
    return;
  }
  if (--AT(u, group_left, st) > 0)
    return;
  uint32_t e = AT(u, pos, st);
  double first = t;
  for (uint32_t k = 0; k < n; k++)
    if (AT(u, start, c->stream_instrs[e + k]) < first)
      first = AT(u, start, c->stream_instrs[e + k]);
  for (uint32_t k = 0; k < n; k++) {
    AT(u, start, c->stream_instrs[e + k]) = first;
    finish_instr(s, u, c->stream_instrs[e + k], t);
  }
}

/* What a party's poll means to a transfer on the host loop (MPI's progress happens in the
 * ranks' own calls): a collective completes for its members once every member has polled (each
 * moves it on); a message above the profile's eager_bytes completes for its sender once the
 * receiver has polled (and copied it); a receiver, and an eager sender, complete at their own
 * poll. Outside a host loop every party completes when it sees the end. */
enum poll_role { POLL_FREE, POLL_NEEDED, POLL_WAITS, POLL_BOTH };

static enum poll_role poll_role(const struct sim *s, const struct unit_rt *u, uint32_t instr) {
  if (!s->sharing)
    return POLL_FREE;
  const struct ir_node *n = &s->p->nodes[s->p->classes[u->cls].instrs[instr].node];
  if (!kind_is_p2p(n->kind))
    return POLL_BOTH;
  if (s->prof->eager_bytes <= 0 || (double)n->bytes <= s->prof->eager_bytes)
    return POLL_FREE;
  return n->kind == IR_NODE_SEND ? POLL_WAITS : POLL_NEEDED;
}

static void loop_see(struct sim *s, struct unit_rt *u, uint32_t instr, double t);

/* Party (u, instr) polls at t, its transfer over: it completes unless it waits for others'
 * polls; the last poll another waits for releases it (loop_see: at once, or when its task
 * ends). */
static void comm_polled(struct sim *s, struct unit_rt *u, uint32_t instr, double t) {
  struct slot *sl = &s->slots[AT(u, slot, instr)];
  enum poll_role role = poll_role(s, u, instr);
  if (AT(u, polled, instr) == 0) {
    AT(u, polled, instr) = 1;
    if ((role == POLL_NEEDED || role == POLL_BOTH) && sl->need > 0 && --sl->need == 0)
      for (uint32_t k = 0; k < sl->part_count; k++) {
        struct unit_rt *v = &s->u[s->parts[2 * (sl->part_first + k)]];
        uint32_t j = s->parts[2 * (sl->part_first + k) + 1];
        if ((v != u || j != instr) && AT(v, polled, j) == 1) {
          loop_see(s, v, j, t);
          try_advance(s, v, t);
        }
      }
  }
  if (AT(u, polled, instr) == 2 || ((role == POLL_WAITS || role == POLL_BOTH) && sl->need > 0))
    return;
  AT(u, polled, instr) = 2;
  part_done(s, u, instr, t);
}

/* A communication of u has ended at t, as u's loop sees it: at once, or, while u computes on
 * the host loop (one task at a time), when that task ends (end_kernel). */
static void loop_see(struct sim *s, struct unit_rt *u, uint32_t instr, double t) {
  if (!s->sharing) {
    /* no host loop: every party completes when it sees the end (POLL_FREE), and nothing reads
     * the polled marks, so the array (another cache line a party) is left alone */
    part_done(s, u, instr, t);
    return;
  }
  if (u->n_kernels == 0) {
    comm_polled(s, u, instr, t);
    return;
  }
  if (u->n_seen_late == u->cap_seen_late) {
    u->cap_seen_late = u->cap_seen_late ? 2 * u->cap_seen_late : 8;
    u->seen_late = g_renew(uint32_t, u->seen_late, u->cap_seen_late);
  }
  u->seen_late[u->n_seen_late++] = instr;
}

static void end_comm(struct sim *s, uint32_t id, double t) {
  struct slot *sl = &s->slots[id];
  const struct slot_cost *cost = &s->costs[sl->cost];
  settle_parts(s, sl, t);
  s->free_runs[s->n_free_runs++] = sl->run;
  sl->run = IR_NONE;
  sl->need = 0;
  for (uint32_t k = 0; k < sl->part_count; k++) {
    enum poll_role r = poll_role(s, &s->u[s->parts[2 * (sl->part_first + k)]],
                                 s->parts[2 * (sl->part_first + k) + 1]);
    sl->need += r == POLL_NEEDED || r == POLL_BOTH;
  }
  for (uint32_t k = 0; k < sl->part_count; k++) {
    uint32_t ui = s->parts[2 * (sl->part_first + k)],
             instr = s->parts[2 * (sl->part_first + k) + 1];
    struct unit_rt *u = &s->u[ui];
    for (uint32_t j = 0; j < u->n_ops; j++)
      if (u->ops[j] == id) {
        u->ops[j] = u->ops[--u->n_ops];
        break;
      }
    run_levels_move(s, u, id, cost->inter, u->n_link[cost->inter]--, -1);
    u->comm_sm -= cost->sm_share;
    if (u->n_ops == 0)
      u->comm_sm = 0; /* no drift from repeated add/subtract */
    bool handover;
    double late = comm_lateness(s, u, instr, t, &handover);
    if (handover) {
      struct waker w = {ui, instr};
      g_array_append_val(s->node_wakers[s->unit_node[ui]], w);
    }
    if (late > 0)
      sim_queue_push(&s->heap, t + late, EV_WAKE, instr, 0, ui);
    else
      loop_see(s, u, instr, t);
  }
  reschedule_parts(s, sl, t);
  for (uint32_t k = 0; k < sl->part_count; k++)
    try_advance(s, &s->u[s->parts[2 * (sl->part_first + k)]], t);
}

/* Unit u starts (+1) or stops (-1) computing at t: its idle spell ends or begins, and the
 * node's other computing units are brought up to t at their old speed and go on at the new
 * one (u itself is settled and rescheduled by its caller). */
static void node_reshare(struct sim *s, struct unit_rt *u, int delta, double t) {
  if (!s->sharing)
    return;
  uint32_t node = s->unit_node[u - s->u];
  s->node_running[node] = (uint32_t)((int)s->node_running[node] + delta);
  u->idle_since = delta > 0 ? -1 : t;
  for (uint32_t k = s->node_first[node]; k < s->node_first[node + 1]; k++) {
    struct unit_rt *v = &s->u[s->node_units[k]];
    if (v == u || v->n_kernels == 0)
      continue;
    unit_settle(v, t);
    unit_reschedule(s, v, t);
  }
}

/* Seconds instruction i of u takes alone: the class's cost, times a scenario's factor for the
 * unit's devices (all alike: scenario_key). */
static double kernel_work(const struct sim *s, const struct unit_rt *u, uint32_t i) {
  double w = s->ci[u->cls].work[i];
  if (s->o->scenario)
    w *= sim_scenario_compute_factor(s->o->scenario, u->rep, i);
  return w;
}

static void start_kernel(struct sim *s, struct unit_rt *u, uint32_t i, double t) {
  const struct plan_class *c = &s->p->classes[u->cls];
  const struct class_info *ci = &s->ci[u->cls];
  unit_settle(u, t);
  if (u->n_kernels == u->cap_kernels) {
    u->cap_kernels = u->cap_kernels ? 2 * u->cap_kernels : 4;
    u->kernels = u->own_kernels ? g_renew(struct kernel, u->kernels, u->cap_kernels)
                                : g_memdup2(u->kernels, sizeof(struct kernel) * u->cap_kernels);
    u->own_kernels = true;
  }
  double cap = s->p->streams[c->instrs[i].stream].sm_share;
  if (!(cap > 0 && cap <= 1))
    cap = 1;
  u->kernels[u->n_kernels++] = (struct kernel){.instr = i,
                                               .ev = UINT32_MAX,
                                               .remaining = kernel_work(s, u, i),
                                               .rate = -1,
                                               .last = t,
                                               .cap = cap,
                                               .mem_frac = ci->mem_frac[i]};
  AT(u, start, i) = t;
  host_started(s, u, i, t);
  if (t < s->t_first)
    s->t_first = t;
  if (u->n_kernels == 1)
    node_reshare(s, u, +1, t);
  unit_reschedule(s, u, t);
}

/* plan_group_span, inline: it is asked at every look at a stream's head. */
static inline uint32_t group_span(const struct plan_class *c, uint32_t entry) {
  uint32_t n = c->instrs[c->stream_instrs[entry]].group_parts;
  return n ? n : 1;
}

/* Communication posted at t whose waits were done earlier waited for its stream only. */
static void stream_queued(struct unit_rt *u, const struct plan_class *c, uint32_t e, uint32_t n,
                          uint32_t st, double t) {
  for (uint32_t k = 0; k < n; k++) {
    const struct plan_instr *in = &c->instrs[c->stream_instrs[e + k]];
    if (in->comm == IR_NONE || in->wait_count == 0)
      continue;
    double ready = 0;
    for (uint32_t w = 0; w < in->wait_count; w++)
      if (AT(u, end, c->waits[in->wait_first + w]) > ready)
        ready = AT(u, end, c->waits[in->wait_first + w]);
    if (t > ready)
      AT(u, queued, st) += t - ready;
  }
}

/* Issues the head of stream st of u (its waits done) at t: a kernel starts; a communication is
 * posted, and starts when its last party posts. A point-to-point group is one operation: all
 * its parts are posted at once, each starts when its peer is there, and the stream is free
 * again when the last has ended. */
static void issue_head(struct sim *s, struct unit_rt *u, uint32_t st, double t) {
  const struct plan_class *c = &s->p->classes[u->cls];
  uint32_t e = AT(u, pos, st), n = group_span(c, e);
  AT(u, busy, st) = 1;
  AT(u, group_left, st) = n;
  stream_queued(u, c, e, n, st, t);
  for (uint32_t j = 0; j < n; j++) {
    uint32_t i = c->stream_instrs[e + j];
    /* issued: a receive's buffer is posted with it, unless the host loop held it already
     * (hold_ready_recv; only ranks sharing cores do: the array is not read otherwise) */
    if (!s->sharing || !AT(u, held, i))
      alloc_tensors(s, u, i, t);
    if (AT(u, slot, i) != IR_NONE) {
      AT(u, posted, i) = t;
      struct slot *sl = &s->slots[AT(u, slot, i)];
      if (++sl->arrived == sl->expected)
        start_comm(s, AT(u, slot, i), t);
    } else {
      start_kernel(s, u, i, t);
    }
  }
}

/* Whether stream st of u has a head that may be issued now. Every event asks it of every
 * stream of the units it touches, and a head waits for many events (DualPipe with expert
 * parallelism: a dozen streams, heads waiting on several instructions each), so the wait
 * found not done last time is asked first: while it is not done the head is not ready, and
 * the head's other waits need not be read (the head changes only in finish_instr, which
 * forgets it). Inline: it is called for every stream at every event, six times an instruction,
 * and the call's saving and restoring of registers cost a quarter of its instructions. */
static inline bool head_ready(struct unit_rt *u, const struct plan_class *c, uint32_t st) {
  if (AT(u, busy, st) || AT(u, pos, st) >= c->stream_first[st + 1])
    return false;
  uint32_t b = AT(u, blocker, st);
  if (b != IR_NONE && AT(u, end, b) < 0)
    return false;
  uint32_t e = AT(u, pos, st), n = group_span(c, e);
  for (uint32_t k = 0; k < n; k++) {
    if (c->stream_instrs[e + k] >= u->host_pos)
      return false; /* not enqueued yet: the host's event asks again */
    const struct plan_instr *in = &c->instrs[c->stream_instrs[e + k]];
    for (uint32_t w = 0; w < in->wait_count; w++)
      if (AT(u, end, c->waits[in->wait_first + w]) < 0) {
        AT(u, blocker, st) = c->waits[in->wait_first + w];
        return false;
      }
  }
  AT(u, blocker, st) = IR_NONE;
  return true;
}

/* A receive's buffers count from the first loop turn that finds it ready, before its turn
 * comes: the executor allocates them as soon as its stream is free, when it waits for nothing
 * and is not part of a point-to-point group (exec/train.c, recv_issue), to post it early. */
static void hold_ready_recv(struct sim *s, struct unit_rt *u, uint32_t st, double t) {
  const struct plan_class *c = &s->p->classes[u->cls];
  uint32_t i = c->stream_instrs[AT(u, pos, st)];
  const struct plan_instr *in = &c->instrs[i];
  if (AT(u, held, i) || in->group_parts > 0 || in->wait_count > 0 ||
      s->p->nodes[in->node].kind != IR_NODE_RECV)
    return;
  alloc_tensors(s, u, i, t);
  AT(u, held, i) = 1;
}

/* The host loop of a rank sharing its node's cores (piper-exec's host backend, exec/
 * backend_host.c): one task at a time, in issue order; while the first instruction not yet
 * issued waits, nothing after it is issued. A compute task holds the loop until it ends (what
 * ends meanwhile is seen then: loop_see); a communication is posted and the loop goes on. */
static void loop_advance(struct sim *s, struct unit_rt *u, double t) {
  const struct plan_class *c = &s->p->classes[u->cls];
  const struct class_info *ci = &s->ci[u->cls];
  while (u->n_kernels == 0) {
    uint32_t first_st = UINT32_MAX, first = UINT32_MAX;
    for (uint32_t k = 0; k < ci->n_streams_used; k++) {
      uint32_t st = ci->streams_used[k];
      if (head_ready(u, c, st))
        hold_ready_recv(s, u, st, t);
      /* the stream's first instruction not yet issued: behind the one in flight, if any */
      uint32_t e = AT(u, pos, st);
      if (AT(u, busy, st))
        e += group_span(c, e);
      if (e < c->stream_first[st + 1] && c->stream_instrs[e] < first) {
        first = c->stream_instrs[e];
        first_st = st;
      }
    }
    if (first_st == UINT32_MAX || !head_ready(u, c, first_st))
      return;
    issue_head(s, u, first_st, t);
  }
}

static void try_advance(struct sim *s, struct unit_rt *u, double t) {
  if (s->sharing) {
    loop_advance(s, u, t);
    return;
  }
  const struct plan_class *c = &s->p->classes[u->cls];
  const struct class_info *ci = &s->ci[u->cls];
  if (ci->n_streams_used > 64) { /* past the mask: every stream */
    for (uint32_t k = 0; k < ci->n_streams_used; k++)
      if (head_ready(u, c, ci->streams_used[k]))
        issue_head(s, u, ci->streams_used[k], t);
    return;
  }
  /* lowest bit first: streams_used order, as asking every stream would (issuing a head ends
   * nothing, so no bit is set behind the one asked) */
  while (u->dirty) {
    uint32_t k = (uint32_t)__builtin_ctzll(u->dirty);
    u->dirty &= u->dirty - 1;
    if (k >= ci->n_streams_used)
      continue;
    uint32_t st = ci->streams_used[k];
    if (head_ready(u, c, st))
      issue_head(s, u, st, t);
  }
}

/* The running kernel of unit u that event e ends, or -1 when e is stale (the kernel was
 * rescheduled since, or has ended). */
static int32_t kernel_of_event(const struct unit_rt *u, const struct sim_event *e) {
  for (uint32_t j = 0; j < u->n_kernels; j++)
    if (u->kernels[j].instr == e->id)
      return u->kernels[j].version == e->version ? (int32_t)j : -1;
  return -1;
}

/* Whether u has communication posted and not yet done: its loop tests it at every turn. */
static bool comm_in_flight(const struct sim *s, const struct unit_rt *u) {
  const struct plan_class *c = &s->p->classes[u->cls];
  const struct class_info *ci = &s->ci[u->cls];
  for (uint32_t k = 0; k < ci->n_streams_used; k++) {
    uint32_t st = ci->streams_used[k];
    if (AT(u, busy, st) && AT(u, slot, c->stream_instrs[AT(u, pos, st)]) != IR_NONE)
      return true;
  }
  return false;
}

/* A rank of node n has ended a task and its loop has turned, testing its communication: under
 * mpirun on more ranks than cores a test that progresses nothing yields the core (Open MPI's
 * yield_when_idle, opal_progress) to a rank waiting for one. The oldest waiter polls and sees
 * its end; while the ones woken find nothing to compute they give the core on. */
static void node_handover(struct sim *s, uint32_t node, double t) {
  GArray *w = s->node_wakers[node];
  while (w->len > 0) {
    struct waker k = g_array_index(w, struct waker, 0);
    g_array_remove_index(w, 0);
    struct unit_rt *v = &s->u[k.unit];
    if (AT(v, polled, k.instr) != 0)
      continue; /* seen already: its slice came first */
    loop_see(s, v, k.instr, t);
    try_advance(s, v, t);
    if (v->n_kernels > 0)
      return;
  }
}

static void end_kernel(struct sim *s, struct unit_rt *u, uint32_t j, double t) {
  uint32_t instr = u->kernels[j].instr;
  unit_settle(u, t);
  u->kernels[j] = u->kernels[--u->n_kernels];
  finish_instr(s, u, instr, t);
  if (u->n_kernels == 0)
    node_reshare(s, u, -1, t);
  unit_reschedule(s, u, t);
  /* the host loop's next turn tests what ended meanwhile before it runs the next task */
  for (uint32_t k = 0; k < u->n_seen_late; k++)
    loop_see(s, u, u->seen_late[k], t);
  u->n_seen_late = 0;
  try_advance(s, u, t);
  /* a rank with nothing in flight makes no MPI call between its tasks, and keeps its core */
  if (s->sharing && comm_in_flight(s, u))
    node_handover(s, s->unit_node[u - s->u], t);
}

/* ---- setup -------------------------------------------------------------------------------- */

struct slot_key {
  uint32_t comm, a, b, seq;
};
/* A full mix: pairs of units a fixed distance apart (a stage's member k and the next stage's)
 * made the old products collide in large groups. */
static uint64_t slot_key_hash(const struct slot_key *x) {
  uint64_t h = ((uint64_t)x->comm << 32 | x->seq) * 0x9e3779b97f4a7c15ull;
  h ^= ((uint64_t)x->a << 32 | x->b) + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

/* Slot ids by key, open addressing with linear probing: each entry holds its key, so a lookup
 * costs about one cache miss where a GHashTable's hashes, keys, values and the key itself cost
 * four; with --no-collapse the table holds a slot per point-to-point pair of units and misses
 * the caches on nearly every lookup. */
struct slot_entry {
  struct slot_key key;
  uint32_t id; /* slot id + 1; 0: empty */
};

struct slot_table {
  struct slot_entry *e;
  size_t mask, n;
};

static void slot_table_grow(struct slot_table *t) {
  size_t cap = t->e ? 2 * (t->mask + 1) : 1024;
  struct slot_entry *old = t->e;
  size_t old_cap = old ? t->mask + 1 : 0;
  t->e = g_new0(struct slot_entry, cap);
  t->mask = cap - 1;
  for (size_t k = 0; k < old_cap; k++)
    if (old[k].id) {
      size_t at = slot_key_hash(&old[k].key) & t->mask;
      while (t->e[at].id)
        at = (at + 1) & t->mask;
      t->e[at] = old[k];
    }
  g_free(old);
}

/* The entry of key: its slot, or the empty place where it goes. */
static struct slot_entry *slot_table_find(struct slot_table *t, const struct slot_key *key) {
  size_t at = slot_key_hash(key) & t->mask;
  while (t->e[at].id && memcmp(&t->e[at].key, key, sizeof *key) != 0)
    at = (at + 1) & t->mask;
  return &t->e[at];
}

/* profile_comm_cost of (kind, bytes, span), remembered: with every device simulated there is a
 * slot per point-to-point pair of devices, and the pairs of a stage differ only in whether
 * they cross a node (the span), so the same few costs were computed a hundred thousand times
 * (a fifth of the setup's instructions). The function is pure, so the figures are the same. */
enum { COMM_COST_MEMO = 64 };

struct comm_cost_memo {
  bool used;
  enum ir_node_kind kind;
  uint64_t bytes;
  struct profile_span span;
  struct profile_comm_cost cost;
};

/* The rendezvous being built: slots by key, and each participant (unit, instr) with its slot. */
struct slot_builder {
  struct slot_table by_key;
  GArray *slots;                  /* struct slot */
  /* Each participant (unit, instr) and its slot, sized up front (comm_instructions) and
   * written in place: g_array_append_val's generic copy cost 70 instructions a part, two
   * parts an instruction of a --no-collapse run. */
  uint32_t *parts, *part_slot;
  uint32_t n_parts, cap_parts;
  uint32_t *comm_units;           /* [n_comms] distinct units per collective communicator */
  struct profile_span *comm_span; /* [n_comms] where each collective runs */
  GHashTable *split_sets;         /* unit sets of split instances -> id + 1 */
  GArray *costs;                  /* struct slot_cost, distinct */
  uint32_t *cost_ids, cost_mask;  /* costs by value: id + 1, 0 empty */
  struct comm_cost_memo memo[COMM_COST_MEMO];
};

/* Per collective communicator: how many distinct units take part, and its span. */
static void slots_collectives(struct sim *s, struct slot_builder *b) {
  const struct plan *p = s->p;
  b->comm_units = g_new0(uint32_t, p->n_comms + 1);
  b->comm_span = g_new0(struct profile_span, p->n_comms + 1);
  for (uint32_t k = 0; k < p->n_comms; k++) {
    if (p->comms[k].purpose == IR_COMM_PP || p->comms[k].group >= p->n_groups)
      continue;
    uint32_t cnt;
    const uint32_t *gd = group_devices(p, p->comms[k].group, &cnt);
    GHashTable *us = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (uint32_t i = 0; i < cnt; i++)
      g_hash_table_add(us, GUINT_TO_POINTER(s->unit_of_device[gd[i]] + 1));
    b->comm_units[k] = g_hash_table_size(us);
    g_hash_table_destroy(us);
    b->comm_span[k] = profile_span_of(s->prof, gd, cnt);
  }
}

static uint64_t cost_hash(const struct slot_cost *c) {
  uint64_t h = 0, v[3];
  memcpy(v, c, sizeof v);
  for (int k = 0; k < 3; k++)
    h = (h ^ v[k]) * 0x9e3779b97f4a7c15ull;
  return (h ^ c->inter) ^ (h >> 31);
}

/* The id of cost c in the builder's table of distinct costs (open addressing). */
static uint32_t cost_intern(struct slot_builder *b, const struct slot_cost *c) {
  struct slot_cost *all = (struct slot_cost *)(void *)b->costs->data;
  if (2 * (b->costs->len + 1) > b->cost_mask + 1) { /* grow and rehash */
    uint32_t cap = b->cost_ids ? 2 * (b->cost_mask + 1) : 64;
    g_free(b->cost_ids);
    b->cost_ids = g_new0(uint32_t, cap);
    b->cost_mask = cap - 1;
    for (uint32_t k = 0; k < b->costs->len; k++) {
      size_t at = cost_hash(&all[k]) & b->cost_mask;
      while (b->cost_ids[at])
        at = (at + 1) & b->cost_mask;
      b->cost_ids[at] = k + 1;
    }
  }
  size_t at = cost_hash(c) & b->cost_mask;
  for (; b->cost_ids[at]; at = (at + 1) & b->cost_mask) {
    const struct slot_cost *o = &all[b->cost_ids[at] - 1];
    if (o->latency == c->latency && o->transfer == c->transfer && o->sm_share == c->sm_share &&
        o->inter == c->inter)
      return b->cost_ids[at] - 1;
  }
  b->cost_ids[at] = b->costs->len + 1;
  g_array_append_val(b->costs, *c);
  return b->costs->len - 1;
}

static struct profile_comm_cost comm_cost_memo(struct slot_builder *b, const struct profile *prof,
                                               enum ir_node_kind kind, uint64_t bytes,
                                               const struct profile_span *span) {
  uint64_t h = (bytes * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)kind << 48) ^
               ((uint64_t)span->p << 32) ^ ((uint64_t)span->n_nodes << 16) ^ span->min_per_node;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  struct comm_cost_memo *m = &b->memo[(h >> 40) % COMM_COST_MEMO];
  if (m->used && m->kind == kind && m->bytes == bytes && m->span.p == span->p &&
      m->span.n_nodes == span->n_nodes && m->span.min_per_node == span->min_per_node)
    return m->cost;
  *m = (struct comm_cost_memo){.used = true, .kind = kind, .bytes = bytes, .span = *span};
  m->cost = profile_comm_cost(prof, kind, bytes, span);
  return m->cost;
}

/* A new slot for key: its cost on span, and the SM share of the stream it runs on. */
static uint32_t slot_new(struct sim *s, struct slot_builder *b, const struct slot_key *key,
                         const struct plan_instr *in, uint32_t expected,
                         const struct profile_span *span, const uint32_t *devs, uint32_t n_devs,
                         bool indexed) {
  const struct ir_node *n = &s->p->nodes[in->node];
  uint32_t id = b->slots->len;
  struct slot_cost sl = {0};
  if (s->prof->synthetic) {
    sl.latency = s->prof->syn_comm;
  } else {
    /* a tp node stands for `collectives` collectives of bytes / collectives each */
    double count = n->collectives > 1 ? n->collectives : 1;
    struct profile_comm_cost cc =
        comm_cost_memo(b, s->prof, n->kind, (uint64_t)((double)n->bytes / count), span);
    sl.latency = cc.latency * count;
    sl.transfer = cc.transfer * count;
    sl.inter = cc.inter_node;
    if (n->kind == IR_NODE_ALL_TO_ALL) /* the rank of the most-loaded expert sets the pace */
      sl.transfer *= cost_all_to_all_skew(s->prof, s->p->model, span->p);
    if (s->o->scenario) /* a degraded link or NIC: the slowest party's share of its rate */
      sl.transfer /= sim_scenario_bandwidth(s->o->scenario, devs, n_devs, cc.inter_node);
  }
  sl.latency += s->prof->instruction_overhead; /* posting it is the rank's work */
  double share = s->p->streams[in->stream].sm_share;
  sl.sm_share = share > 0 && share < 1 ? share : s->prof->comm_sm_share;
  struct slot slot = {.expected = expected, .cost = cost_intern(b, &sl), .run = IR_NONE};
  g_array_append_val(b->slots, slot);
  if (!indexed)
    return id;
  if (2 * (b->by_key.n + 1) > b->by_key.mask + 1)
    slot_table_grow(&b->by_key);
  struct slot_entry *e = slot_table_find(&b->by_key, key);
  e->key = *key;
  e->id = id + 1;
  b->by_key.n++;
  return id;
}

/* The devices of the communication instruction in run by device rep (peer: a p2p's other end),
 * for a scenario's bandwidths; NULL without a scenario. */
static uint32_t *slot_devices(const struct sim *s, const struct plan_instr *in, uint32_t rep,
                              uint32_t peer, uint32_t *n) {
  const struct plan *p = s->p;
  *n = 0;
  if (!s->o->scenario)
    return NULL;
  if (peer != IR_NONE) {
    uint32_t *d = g_new(uint32_t, 2);
    d[0] = rep;
    d[1] = peer;
    *n = 2;
    return d;
  }
  if (comm_is_split(p, in->comm)) {
    *n = plan_comm_size(p, in->comm);
    uint32_t *d = g_new0(uint32_t, *n + 1);
    plan_comm_members(p, in->comm, rep, d);
    return d;
  }
  const uint32_t *gd = group_devices(p, p->comms[in->comm].group, n);
  uint32_t *d = g_new(uint32_t, *n + 1);
  memcpy(d, gd, sizeof(uint32_t) * *n);
  return d;
}

static void pr_join(struct slot_builder *b, uint32_t ui, uint32_t i, uint32_t id) {
  g_assert(b->n_parts < b->cap_parts);
  b->parts[2 * b->n_parts] = ui;
  b->parts[2 * b->n_parts + 1] = i;
  b->part_slot[b->n_parts++] = id;
}

/* The other end of unit ui's point-to-point instruction i, when unit pu holds it and comes
 * later in build_slots' order: found in pu's class by (comm, seq), a receive for a send and
 * the reverse, whose own peer is in unit ui (the key both ends would make). The slot is then
 * handed to it directly, and the key table, which would hold a slot per pair of devices and
 * miss the caches on every lookup, only keeps what no end found this way. IR_NONE otherwise. */
static uint32_t slot_pair(struct sim *s, uint32_t ui, uint32_t i, uint32_t pu) {
  const struct plan *p = s->p;
  const struct unit_rt *u = &s->u[ui], *v = &s->u[pu];
  const struct plan_instr *in = &p->classes[u->cls].instrs[i];
  uint32_t j = class_p2p_find(&s->ci[v->cls], in->comm, in->seq);
  if (j == IR_NONE || pu < ui || (pu == ui && j <= i) || AT(v, slot, j) != IR_NONE)
    return IR_NONE;
  const struct ir_node *n = &p->nodes[in->node], *m = &p->nodes[p->classes[v->cls].instrs[j].node];
  if (m->kind == n->kind || !kind_is_p2p(m->kind))
    return IR_NONE;
  uint32_t back = node_peer(p, m, v->rep);
  return back < p->n_devices && s->unit_of_device[back] == ui ? j : IR_NONE;
}

/* The slot of unit ui's communication instruction i: a p2p pair is keyed by its two units, a
 * collective by its communicator; both by sequence number. */
static bool slot_join(struct sim *s, struct slot_builder *b, uint32_t ui, uint32_t i,
                      GError **err) {
  const struct plan *p = s->p;
  struct unit_rt *u = &s->u[ui];
  const struct plan_instr *in = &p->classes[u->cls].instrs[i];
  const struct ir_node *n = &p->nodes[in->node];
  struct slot_key key = {.comm = in->comm, .a = IR_NONE, .b = IR_NONE, .seq = in->seq};
  uint32_t expected;
  struct profile_span span;
  char name[160];
  if (AT(u, slot, i) != IR_NONE) { /* the other end made it (slot_pair) */
    pr_join(b, ui, i, AT(u, slot, i));
    return true;
  }
  uint32_t partner = IR_NONE, peer = IR_NONE;
  if (kind_is_p2p(n->kind)) {
    peer = node_peer(p, n, u->rep);
    if (peer == IR_NONE || peer >= p->n_devices) {
      plan_node_name(p, in->node, name, sizeof name);
      return piper_input_error(err, "plan: device %u: %s has no peer device", u->rep, name);
    }
    uint32_t pu = s->unit_of_device[peer];
    partner = pu;
    key.a = n->kind == IR_NODE_SEND ? ui : pu;
    key.b = n->kind == IR_NODE_SEND ? pu : ui;
    expected = 2;
    uint32_t devs[2] = {u->rep, peer};
    span = profile_span_of(s->prof, devs, 2);
  } else {
    if (in->comm == IR_NONE || in->comm >= p->n_comms) {
      plan_node_name(p, in->node, name, sizeof name);
      return piper_input_error(err, "plan: device %u: %s has no communicator", u->rep, name);
    }
    expected = b->comm_units[in->comm];
    span = b->comm_span[in->comm];
    if (comm_is_split(p, in->comm)) {
      /* One slot per set of units an instance holds: the colouring made every member of a
       * unit see the same set, so the units of one set meet there, whichever instance their
       * representatives are in. */
      GArray *set = split_instance(p, s->prof, in->comm, u->rep, s->unit_of_device, &span);
      expected = set->len;
      key.a = intern_key(b->split_sets, set);
      g_array_free(set, TRUE);
    }
  }
  const struct slot_entry *found = slot_table_find(&b->by_key, &key);
  uint32_t id;
  if (found->id) {
    id = found->id - 1;
  } else {
    uint32_t j = partner == IR_NONE ? IR_NONE : slot_pair(s, ui, i, partner);
    uint32_t n_devs = 0, *devs = slot_devices(s, in, u->rep, peer, &n_devs);
    id = slot_new(s, b, &key, in, expected, &span, devs, n_devs, j == IR_NONE);
    g_free(devs);
    if (j != IR_NONE)
      AT(&s->u[partner], slot, j) = id;
  }
  AT(u, slot, i) = id;
  pr_join(b, ui, i, id);
  return true;
}

/* Lays the participants out by slot (a counting sort) into s->parts. */
static void slots_group_parts(struct sim *s, struct slot_builder *b) {
  uint32_t np = b->n_parts;
  s->parts = big_alloc0(sizeof(uint32_t) * (2 * (size_t)np + 2));
  const uint32_t *ps = b->part_slot, *pp = b->parts;
  for (uint32_t k = 0; k < np; k++)
    s->slots[ps[k]].part_count++;
  uint32_t acc = 0;
  for (uint32_t k = 0; k < s->n_slots; k++) {
    s->slots[k].part_first = acc;
    acc += s->slots[k].part_count;
    s->slots[k].part_count = 0;
  }
  for (uint32_t k = 0; k < np; k++) {
    struct slot *sl = &s->slots[ps[k]];
    uint32_t at = sl->part_first + sl->part_count++;
    s->parts[2 * at] = pp[2 * k];
    s->parts[2 * at + 1] = pp[2 * k + 1];
  }
}

/* Every rendezvous must gather all its parties, or the simulation would stall on it. */
static bool slots_check_parties(struct sim *s, GError **err) {
  const struct plan *p = s->p;
  for (uint32_t k = 0; k < s->n_slots; k++) {
    if (s->slots[k].part_count == s->slots[k].expected)
      continue;
    uint32_t ui = s->parts[2 * s->slots[k].part_first];
    uint32_t instr = s->parts[2 * s->slots[k].part_first + 1];
    const struct plan_class *c = &p->classes[s->u[ui].cls];
    char name[160];
    plan_node_name(p, c->instrs[instr].node, name, sizeof name);
    return piper_input_error(err, "plan: device %u: %s (seq %u) has %u of %u parties in the plans",
                             s->u[ui].rep, name, c->instrs[instr].seq, s->slots[k].part_count,
                             s->slots[k].expected);
  }
  return true;
}

/* Communication instructions of every unit: the parts build_slots makes (sized up front: a
 * doubling array copied and faulted in its pages again at every step). */
static uint32_t comm_instructions(const struct sim *s) {
  uint64_t n = 0;
  for (uint32_t k = 0; k < s->n_units; k++)
    n += s->ci[s->u[k].cls].n_comm_instrs;
  return (uint32_t)(n < UINT32_MAX ? n : UINT32_MAX - 1);
}

/* The rendezvous of every communication instruction of every unit. */
static bool build_slots(struct sim *s, GError **err) {
  const struct plan *p = s->p;
  uint32_t cap_parts = comm_instructions(s);
  struct slot_builder b = {
      .slots = g_array_new(FALSE, TRUE, sizeof(struct slot)),
      .parts = g_new(uint32_t, 2 * (size_t)cap_parts + 2),
      .part_slot = g_new(uint32_t, (size_t)cap_parts + 1),
      .cap_parts = cap_parts,
      .costs = g_array_new(FALSE, FALSE, sizeof(struct slot_cost)),
  };
  slot_table_grow(&b.by_key);
  b.split_sets =
      g_hash_table_new_full(g_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref, NULL);
  slots_collectives(s, &b);
  bool ok = true;
  for (uint32_t ui = 0; ui < s->n_units && ok; ui++) {
    const struct plan_class *c = &p->classes[s->u[ui].cls];
    for (uint32_t i = 0; i < c->n_instrs && ok; i++) {
      if (kind_is_comm(p->nodes[c->instrs[i].node].kind))
        ok = slot_join(s, &b, ui, i, err);
    }
  }
  g_free(b.comm_units);
  g_free(b.comm_span);
  g_hash_table_destroy(b.split_sets);
  g_free(b.by_key.e);
  s->n_slots = b.slots->len;
  s->slots = big_alloc0(sizeof(struct slot) * (s->n_slots + 1));
  if (s->n_slots > 0)
    memcpy(s->slots, b.slots->data, sizeof(struct slot) * s->n_slots);
  g_array_free(b.slots, TRUE);
  s->costs = (struct slot_cost *)(void *)g_array_free(b.costs, FALSE);
  g_free(b.cost_ids);
  slots_group_parts(s, &b);
  g_free(b.parts);
  g_free(b.part_slot);
  return ok && slots_check_parties(s, err);
}

static int interval_cmp(const void *a, const void *b) {
  const struct report_interval *x = a, *y = b;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  if (x->stream != y->stream)
    return x->stream < y->stream ? -1 : 1;
  return x->node < y->node ? -1 : x->node > y->node;
}

/* Per class: costs and communication lists, sharing one cost cache across classes. */
static void sim_classes(struct sim *s) {
  const struct plan *p = s->p;
  s->ci = g_new0(struct class_info, p->n_classes + 1);
  GHashTable *cost_cache = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
  for (uint32_t c = 0; c < p->n_classes; c++) {
    class_info_build(p, &p->classes[c], s->prof, cost_cache, &s->ci[c]);
    class_wake_build(p, &p->classes[c], &s->ci[c]);
    if ((s->prof->host_launch > 0 || s->prof->syn_host > 0) && !s->sharing)
      class_host_build(p, &p->classes[c], s->prof, &s->ci[c]);
  }
  g_hash_table_destroy(cost_cache);
}

/* Devices that behave alike form a unit (colour refinement); units are numbered by their
 * lowest device, and res gets each unit's members. */
static void sim_units(struct sim *s, struct sim_result *res) {
  const struct plan *p = s->p;
  uint32_t n_col;
  uint32_t *col =
      refine_colours(p, s->prof, s->ci, s->o->collapse && !s->sharing, s->o->scenario, &n_col);
  uint32_t *col_unit = g_new(uint32_t, n_col + 1);
  for (uint32_t k = 0; k < n_col; k++)
    col_unit[k] = IR_NONE;
  s->unit_of_device = g_new(uint32_t, p->n_devices + 1);
  uint32_t nu = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    if (col_unit[col[d]] == IR_NONE)
      col_unit[col[d]] = nu++;
    s->unit_of_device[d] = col_unit[col[d]];
  }
  g_free(col);
  g_free(col_unit);
  s->n_units = nu;
  s->u = big_alloc0(sizeof(struct unit_rt) * (nu + 1));
  res->n_units = nu;
  res->units = g_new0(struct sim_unit, nu + 1);
  res->device_unit = s->unit_of_device;
  for (uint32_t d = 0; d < p->n_devices; d++)
    res->units[s->unit_of_device[d]].n_members++;
  for (uint32_t k = 0; k < nu; k++) {
    res->units[k].members = g_new(uint32_t, res->units[k].n_members);
    res->units[k].n_members = 0;
  }
  for (uint32_t d = 0; d < p->n_devices; d++) {
    struct sim_unit *su = &res->units[s->unit_of_device[d]];
    su->members[su->n_members++] = d;
  }
}

/* The arrays of the n units of one class in one block, interleaved: entry x of member m is at
 * array[x * n + m] (AT), so the replicas of a stage, which run in lockstep and are handled one
 * after the other at each time, touch neighbouring words where a block per unit put each touch
 * on a line and a page of its own. Doubles first, then 32-bit arrays, then bytes: every array
 * stays aligned. The first member holds the block; zeroed but for pos, start, end, slot and
 * remaining, set below. */
static void unit_arrays(struct unit_rt *const *members, uint32_t n, const struct plan_class *c,
                        size_t ns, size_t ni, size_t nt) {
  size_t bytes = ns * (sizeof(double) + 3 * sizeof(uint32_t) + sizeof(uint8_t)) +
                 ni * (3 * sizeof(double) + sizeof(uint32_t) + 2 * sizeof(uint8_t)) +
                 nt * sizeof(uint32_t);
  char *at = members[0]->block = big_alloc0(bytes * n + sizeof(double));
  size_t sizes[12] = {sizeof(double) * ns,   sizeof(double) * ni,   sizeof(double) * ni,
                      sizeof(double) * ni,   sizeof(uint32_t) * ns, sizeof(uint32_t) * ns,
                      sizeof(uint32_t) * ni, sizeof(uint32_t) * nt, sizeof(uint32_t) * ns,
                      ns,                    ni,                    ni};
  char *first[12];
  for (int k = 0; k < 12; k++) {
    first[k] = at;
    at += sizes[k] * n;
  }
  for (uint32_t m = 0; m < n; m++) {
    struct unit_rt *u = members[m];
    u->stride = n;
    u->queued = (double *)(void *)first[0] + m;
    u->start = (double *)(void *)first[1] + m;
    u->end = (double *)(void *)first[2] + m;
    u->posted = (double *)(void *)first[3] + m;
    u->pos = (uint32_t *)(void *)first[4] + m;
    u->group_left = (uint32_t *)(void *)first[5] + m;
    u->slot = (uint32_t *)(void *)first[6] + m;
    u->remaining = (uint32_t *)(void *)first[7] + m;
    u->blocker = (uint32_t *)(void *)first[8] + m;
    u->busy = (uint8_t *)first[9] + m;
    u->polled = (uint8_t *)first[10] + m;
    u->held = (uint8_t *)first[11] + m;
  }
  /* the initial values, entry by entry: in this order the writes are sequential */
  uint32_t *pos = (uint32_t *)(void *)first[4], *slot = (uint32_t *)(void *)first[6],
           *remaining = (uint32_t *)(void *)first[7], *blocker = (uint32_t *)(void *)first[8];
  double *start = (double *)(void *)first[1], *end = (double *)(void *)first[2];
  for (size_t st = 0; st + 1 < ns; st++)
    for (uint32_t m = 0; m < n; m++)
      pos[st * n + m] = c->stream_first[st];
  for (size_t x = 0; x < ns * n; x++)
    blocker[x] = IR_NONE;
  for (size_t x = 0; x < (ni - 1) * n; x++) {
    start[x] = end[x] = -1;
    slot[x] = IR_NONE;
  }
  for (size_t t = 0; t + 1 < nt; t++)
    for (uint32_t m = 0; m < n; m++)
      remaining[t * n + m] = c->tensors[t].consumer_count + 1; /* and the release point */
}

/* Every unit's arrays, interleaved by class (unit_arrays). */
static void sim_units_arrays(struct sim *s, const struct sim_result *res) {
  const struct plan *p = s->p;
  uint32_t *count = g_new0(uint32_t, p->n_classes + 1), *fill = g_new0(uint32_t, p->n_classes + 1);
  struct unit_rt **by_class = g_new(struct unit_rt *, s->n_units + 1);
  uint32_t *first = g_new0(uint32_t, p->n_classes + 2);
  for (uint32_t k = 0; k < s->n_units; k++)
    count[p->device_class[res->units[k].members[0]]]++;
  for (uint32_t c = 0; c < p->n_classes; c++)
    first[c + 1] = first[c] + count[c];
  for (uint32_t k = 0; k < s->n_units; k++) {
    uint32_t c = p->device_class[res->units[k].members[0]];
    by_class[first[c] + fill[c]++] = &s->u[k];
  }
  for (uint32_t c = 0; c < p->n_classes; c++)
    if (count[c] > 0)
      unit_arrays(by_class + first[c], count[c], &p->classes[c], p->n_streams + 1,
                  p->classes[c].n_instrs + 1, p->classes[c].n_tensors + 1);
  g_free(count);
  g_free(fill);
  g_free(by_class);
  g_free(first);
}

/* Unit k's run-time state: its representative and static memory (its arrays' initial values:
 * unit_arrays). */
static void unit_init(struct sim *s, struct sim_result *res, uint32_t k, uint32_t base) {
  const struct plan *p = s->p;
  struct unit_rt *u = &s->u[k];
  u->rep = res->units[k].members[0];
  u->cls = p->device_class[u->rep];
  u->dirty = ~(uint64_t)0; /* every head asked at the start */
  u->host_pos = UINT32_MAX; /* every instruction enqueued, unless sim_loop starts a host */
  res->units[k].class_index = u->cls;
  const struct plan_class *c = &p->classes[u->cls];
  u->base = base;
  struct class_info *ci = &s->ci[u->cls];
  if (!ci->have_static)
    sim_static_memory_held(p, c, s->prof, ci->static_bytes);
  ci->have_static = true;
  memcpy(res->units[k].static_bytes, ci->static_bytes, sizeof ci->static_bytes);
  for (int m = 0; m < REPORT_MEM_KIND_COUNT; m++) {
    u->mem[m] = (int64_t)res->units[k].static_bytes[m];
    u->mem_total += u->mem[m];
  }
}

/* Which units record a memory timeline: all, none, or past the limit each class's first
 * member only (a unit's representative is its lowest device). */
static void sim_timelines_choose(struct sim *s) {
  const struct plan *p = s->p;
  const struct sim_options *o = s->o;
  uint64_t device_instrs = 0;
  for (uint32_t c = 0; c < p->n_classes; c++)
    device_instrs += (uint64_t)p->classes[c].n_instrs * p->classes[c].n_devices;
  bool all = o->memory_timeline_limit == 0 || p->n_devices <= 64 ||
             device_instrs <= o->memory_timeline_limit;
  for (uint32_t k = 0; k < s->n_units; k++) {
    struct unit_rt *u = &s->u[k];
    u->keep_tl = !o->no_memory_timeline && (all || u->rep == p->classes[u->cls].devices[0]);
  }
}

/* Units by node, for ranks sharing a node's cores (units are devices then). */
static void sim_nodes(struct sim *s, const struct sim_result *res) {
  if (!s->sharing)
    return;
  uint32_t gpn = s->prof->gpus_per_node ? s->prof->gpus_per_node : 1;
  uint32_t nn = (s->p->n_devices + gpn - 1) / gpn;
  s->unit_node = g_new(uint32_t, s->n_units + 1);
  s->node_first = g_new0(uint32_t, nn + 2);
  s->node_units = g_new(uint32_t, s->n_units + 1);
  s->node_running = g_new0(uint32_t, nn + 1);
  s->node_wakers = g_new(GArray *, nn + 1);
  for (uint32_t n = 0; n <= nn; n++)
    s->node_wakers[n] = g_array_new(FALSE, FALSE, sizeof(struct waker));
  s->n_nodes_alloc = nn + 1;
  s->node_size = g_new0(uint32_t, nn + 1);
  for (uint32_t k = 0; k < s->n_units; k++) {
    s->unit_node[k] = res->units[k].members[0] / gpn;
    s->node_size[s->unit_node[k]]++;
  }
  for (uint32_t n = 0; n < nn; n++)
    s->node_first[n + 1] = s->node_first[n] + s->node_size[n];
  uint32_t *fill = g_new0(uint32_t, nn + 1);
  for (uint32_t k = 0; k < s->n_units; k++) {
    uint32_t n = s->unit_node[k];
    s->node_units[s->node_first[n] + fill[n]++] = k;
  }
  g_free(fill);
}

/* Each unit's first running kernels and communications in two pools, unit after unit, on huge
 * pages (big_alloc0): a small allocation per unit put each on a line and a page of its own. */
enum { POOL_KERNELS = 4, POOL_OPS = 8 };

static void sim_pools(struct sim *s) {
  s->kernel_pool = big_alloc0(sizeof(struct kernel) * POOL_KERNELS * (s->n_units + (size_t)1));
  s->op_pool = big_alloc0(sizeof(uint32_t) * POOL_OPS * (s->n_units + (size_t)1));
  for (uint32_t k = 0; k < s->n_units; k++) {
    s->u[k].kernels = s->kernel_pool + (size_t)POOL_KERNELS * k;
    s->u[k].cap_kernels = POOL_KERNELS;
    s->u[k].ops = s->op_pool + (size_t)POOL_OPS * k;
    s->u[k].cap_ops = POOL_OPS;
  }
}

/* Every unit's state; instruction ids (base + instr) must fit in 32 bits. */
static bool sim_units_init(struct sim *s, struct sim_result *res, GError **err) {
  uint64_t total = 0;
  sim_units_arrays(s, res);
  sim_pools(s);
  for (uint32_t k = 0; k < s->n_units; k++) {
    uint32_t base = (uint32_t)total;
    total += s->p->classes[s->p->device_class[res->units[k].members[0]]].n_instrs;
    unit_init(s, res, k, base);
    if (total >= UINT32_MAX)
      return piper_runtime_error(
          err, "plan: more than 2^32 instructions to simulate; rerun without --no-collapse");
  }
  sim_timelines_choose(s);
  return true;
}

/* The event loop: start what can start, then take events in time order until none is left.
 * Not inlined, so that a profile can count the loop apart from the setup (docs/scale.md:
 * valgrind --tool=callgrind --toggle-collect=sim_loop). */
__attribute__((noinline)) static void sim_loop(struct sim *s) {
  for (uint32_t k = 0; k < s->n_units; k++)
    mem_point(s, &s->u[k], 0);
  for (uint32_t k = 0; k < s->n_units; k++) /* every rank starts idle */
    s->u[k].idle_since = 0;
  for (uint32_t k = 0; k < s->n_units; k++) /* the host thread: instruction 0 enqueued */
    if (s->ci[s->u[k].cls].host)
      host_enqueued(s, &s->u[k], 0, 0);
  for (uint32_t k = 0; k < s->n_units; k++)
    try_advance(s, &s->u[k], 0);
  while (s->heap.n > 0) {
    struct sim_event e = sim_queue_pop(&s->heap);
    if (e.type == SIM_QUEUE_CANCELLED)
      continue; /* a kernel's end event superseded by a new rate */
    if (e.type == EV_KERNEL_END) {
      struct unit_rt *u = &s->u[e.unit];
      int32_t j = kernel_of_event(u, &e);
      if (j < 0)
        continue;
      s->events++;
      end_kernel(s, u, (uint32_t)j, e.t);
    } else if (e.type == EV_HOST) { /* not counted: outputs stay as without a host thread */
      host_enqueued(s, &s->u[e.unit], e.id, e.t);
      try_advance(s, &s->u[e.unit], e.t);
    } else if (e.type == EV_WAKE) {
      if (AT(&s->u[e.unit], polled, e.id) != 0)
        continue; /* a turn of another rank's loop handed it a core first */
      s->events++;
      loop_see(s, &s->u[e.unit], e.id, e.t);
      try_advance(s, &s->u[e.unit], e.t);
    } else {
      if (e.version != s->slots[e.id].version || s->slots[e.id].run == IR_NONE)
        continue;
      s->events++;
      end_comm(s, e.id, e.t);
    }
  }
}

/* ---- the critical path ------------------------------------------------------------------- */

/* The position of every instruction in its stream's list, per class (for its predecessor). */
static uint32_t *class_entries(const struct plan_class *c, uint32_t n_streams) {
  uint32_t *entry = g_new(uint32_t, c->n_instrs + 1);
  for (uint32_t st = 0; st < n_streams; st++)
    for (uint32_t e = c->stream_first[st]; e < c->stream_first[st + 1]; e++)
      entry[c->stream_instrs[e]] = e;
  return entry;
}

/* Why (u, i) could start no earlier than `at` (its start, or its post for a communication that
 * waited for its parties): the latest-ending of its stream's previous instruction and the
 * instructions it waits on. Returns false at the step's beginning. */
static bool path_gate(const struct sim *s, const struct unit_rt *u, uint32_t i, uint32_t **entries,
                      uint32_t *gate, enum sim_path_cause *cause) {
  const struct plan_class *c = &s->p->classes[u->cls];
  if (!entries[u->cls])
    entries[u->cls] = class_entries(c, s->p->n_streams);
  const struct plan_instr *in = &c->instrs[i];
  uint32_t e = entries[u->cls][i];
  double best = -INFINITY;
  if (e > c->stream_first[in->stream]) {
    *gate = c->stream_instrs[e - 1];
    best = AT(u, end, *gate);
    *cause = SIM_PATH_STREAM;
  }
  for (uint32_t w = 0; w < in->wait_count; w++) {
    uint32_t j = c->waits[in->wait_first + w];
    if (AT(u, end, j) > best) {
      best = AT(u, end, j);
      *gate = j;
      *cause = SIM_PATH_WAIT;
    }
  }
  return isfinite(best);
}

/* The party of (u, i)'s communication that arrived last, when it came after (u, i) did. */
static bool path_peer(const struct sim *s, const struct unit_rt *u, uint32_t i, uint32_t *pu,
                      uint32_t *pi) {
  uint32_t id = AT(u, slot, i);
  if (id == IR_NONE || !(AT(u, start, i) > AT(u, posted, i)))
    return false;
  const struct slot *sl = &s->slots[id];
  double latest = AT(u, posted, i);
  bool found = false;
  for (uint32_t k = 0; k < sl->part_count; k++) {
    uint32_t v = s->parts[2 * (sl->part_first + k)], j = s->parts[2 * (sl->part_first + k) + 1];
    if (AT(&s->u[v], posted, j) > latest) {
      latest = AT(&s->u[v], posted, j);
      *pu = v;
      *pi = j;
      found = true;
    }
  }
  return found;
}

/* The critical path: from the instruction that ends the step, back through what made each
 * start when it did (sim_path_cause), into res->path in time order. */
static void sim_critical_path(const struct sim *s, struct sim_result *res) {
  uint32_t cu = IR_NONE, ci = 0;
  double last = -INFINITY;
  for (uint32_t k = 0; k < s->n_units; k++)
    for (uint32_t i = 0; i < s->p->classes[s->u[k].cls].n_instrs; i++)
      if (AT(&s->u[k], end, i) > last) {
        last = AT(&s->u[k], end, i);
        cu = k;
        ci = i;
      }
  GArray *steps = g_array_new(FALSE, FALSE, sizeof(struct sim_path_step));
  uint32_t **entries = g_new0(uint32_t *, s->p->n_classes + 1);
  for (uint32_t n = 0; cu != IR_NONE && n < 1000000; n++) {
    const struct unit_rt *u = &s->u[cu];
    const struct plan_instr *in = &s->p->classes[u->cls].instrs[ci];
    struct sim_path_step st = {u->rep, in->node, in->stream, AT(u, start, ci), AT(u, end, ci),
                               SIM_PATH_FIRST};
    uint32_t pu = 0, pi = 0, gate = IR_NONE;
    enum sim_path_cause cause = SIM_PATH_FIRST;
    if (path_peer(s, u, ci, &pu, &pi)) { /* waited for a party: on through the party */
      st.cause = SIM_PATH_PEER;
      g_array_append_val(steps, st);
      u = &s->u[pu];
      ci = pi;
      in = &s->p->classes[u->cls].instrs[ci];
      st = (struct sim_path_step){u->rep, in->node, in->stream, AT(u, start, ci), AT(u, end, ci),
                                  SIM_PATH_FIRST};
      cu = pu;
    }
    if (path_gate(s, u, ci, entries, &gate, &cause)) {
      st.cause = cause;
      ci = gate;
    } else {
      cu = IR_NONE;
    }
    g_array_append_val(steps, st);
  }
  for (uint32_t c = 0; c < s->p->n_classes; c++)
    g_free(entries[c]);
  g_free(entries);
  res->n_path = steps->len;
  res->path = (struct sim_path_step *)(void *)g_array_free(steps, FALSE);
  for (uint32_t a = 0, b = res->n_path ? res->n_path - 1 : 0; a < b; a++, b--) {
    struct sim_path_step t = res->path[a];
    res->path[a] = res->path[b];
    res->path[b] = t;
  }
}

/* Every instruction must have run; a plan that stalls names where. */
static bool sim_check_finished(const struct sim *s, GError **err) {
  const struct plan *p = s->p;
  for (uint32_t k = 0; k < s->n_units; k++) {
    const struct unit_rt *u = &s->u[k];
    const struct plan_class *c = &p->classes[u->cls];
    if (u->done == c->n_instrs)
      continue;
    for (uint32_t st = 0; st < p->n_streams; st++) {
      if (AT(u, pos, st) >= c->stream_first[st + 1])
        continue;
      uint32_t i = c->stream_instrs[AT(u, pos, st)];
      char name[160];
      plan_node_name(p, c->instrs[i].node, name, sizeof name);
      return piper_runtime_error(
          err, "simulation stalled: device %u stream \"%s\" waits at instruction %u (%s)", u->rep,
          p->streams[st].name, i, name);
    }
  }
  return true;
}

static struct report_interval unit_interval(const struct unit_rt *u, const struct plan_class *c,
                                            uint32_t i) {
  return (struct report_interval){
      .start = AT(u, start, i),
      .end = AT(u, end, i),
      .node = c->instrs[i].node,
      .stream = c->instrs[i].stream,
      .wait = AT(u, slot, i) != IR_NONE && AT(u, start, i) > AT(u, posted, i)
                  ? AT(u, start, i) - AT(u, posted, i)
                  : 0};
}

struct keyed_interval {
  struct report_interval iv;
  uint32_t instr;
};

/* interval_cmp, ties by instruction: the order of a stable sort of the instructions. */
static int keyed_interval_cmp(const void *a, const void *b) {
  const struct keyed_interval *x = a, *y = b;
  int r = interval_cmp(&x->iv, &y->iv);
  return r ? r : (x->instr > y->instr) - (x->instr < y->instr);
}

/* u's intervals sorted by (start, stream, node), ties in instruction order (what the stable
 * qsort of the instructions gave). The units of a class mostly run their instructions in the
 * same order, so the order the class's last unit sorted to is tried first and kept when it is
 * sorted (one pass), else the intervals are sorted and the order kept for the next unit. */
static void unit_intervals_sorted(struct sim *s, const struct unit_rt *u,
                                  struct report_interval *out) {
  const struct plan_class *c = &s->p->classes[u->cls];
  struct class_info *ci = &s->ci[u->cls];
  uint32_t n = c->n_instrs;
  bool sorted = ci->order != NULL;
  for (uint32_t j = 0; sorted && j < n; j++) {
    out[j] = unit_interval(u, c, ci->order[j]);
    if (j > 0) {
      int r = interval_cmp(&out[j - 1], &out[j]);
      sorted = r < 0 || (r == 0 && ci->order[j - 1] < ci->order[j]);
    }
  }
  if (sorted)
    return;
  struct keyed_interval *k = g_new(struct keyed_interval, n + 1);
  for (uint32_t i = 0; i < n; i++)
    k[i] = (struct keyed_interval){unit_interval(u, c, i), i};
  qsort(k, n, sizeof *k, keyed_interval_cmp);
  if (!ci->order)
    ci->order = g_new(uint32_t, n + 1);
  for (uint32_t j = 0; j < n; j++) {
    out[j] = k[j].iv;
    ci->order[j] = k[j].instr;
  }
  g_free(k);
}

/* Unit k's figures, memory timeline and (unless turned off) its intervals in start order. */
static void unit_collect(struct sim *s, struct sim_result *res, uint32_t k) {
  const struct plan *p = s->p;
  struct unit_rt *u = &s->u[k];
  struct sim_unit *su = &res->units[k];
  const struct plan_class *c = &p->classes[u->cls];
  res->unit_instructions += c->n_instrs;
  res->device_instructions += (uint64_t)c->n_instrs * su->n_members;
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    res->measured_ops += (uint64_t)s->ci[u->cls].measured[i] * su->n_members;
    res->fallback_ops += (uint64_t)s->ci[u->cls].fallback[i] * su->n_members;
  }
  su->peak_bytes = (uint64_t)u->peak_total;
  for (int m = 0; m < REPORT_MEM_KIND_COUNT; m++)
    su->peak_breakdown[m] = (uint64_t)u->peak_breakdown[m];
  su->peak_saved_activation_bytes = (uint64_t)u->peak_saved;
  su->finish = -INFINITY;
  for (uint32_t i = 0; i < c->n_instrs; i++)
    su->finish = fmax(su->finish, AT(u, end, i));
  su->n_memory = u->tl_len;
  su->memory = u->tl;
  u->tl = NULL;
  if (s->o->no_intervals)
    return;
  su->intervals = res->interval_block + s->interval_next;
  s->interval_next += c->n_instrs;
  su->n_intervals = c->n_instrs;
  unit_intervals_sorted(s, u, su->intervals);
}

/* True when stream st of class c carries more than one communicator's traffic. */
static bool stream_mixed(const struct plan_class *c, uint32_t st) {
  uint32_t first = IR_NONE;
  for (uint32_t e = c->stream_first[st]; e < c->stream_first[st + 1]; e++) {
    uint32_t comm = c->instrs[c->stream_instrs[e]].comm;
    if (comm == IR_NONE)
      continue;
    if (first == IR_NONE)
      first = comm;
    else if (comm != first)
      return true;
  }
  return false;
}

/* The stream whose sharing queued the most communication (sim_result.serial_*). */
static void sim_collect_serial(struct sim *s, struct sim_result *res) {
  res->serial_stream = res->serial_device = IR_NONE;
  res->serial_seconds = 0;
  for (uint32_t k = 0; k < s->n_units; k++) {
    const struct plan_class *c = &s->p->classes[s->u[k].cls];
    for (uint32_t st = 0; st < s->p->n_streams; st++)
      if (AT(&s->u[k], queued, st) > res->serial_seconds && stream_mixed(c, st)) {
        res->serial_seconds = AT(&s->u[k], queued, st);
        res->serial_stream = st;
        res->serial_device = s->u[k].rep;
      }
  }
}

static void sim_collect(struct sim *s, struct sim_result *res) {
  sim_collect_serial(s, res);
  uint32_t nu = s->n_units;
  res->t_start = nu > 0 && isfinite(s->t_first) ? s->t_first : 0;
  res->t_end = nu > 0 && isfinite(s->t_last) ? s->t_last : 0;
  res->iteration_time = res->t_end - res->t_start;
  res->events = s->events;
  /* each class's arrays go with its last unit: they and the intervals are the two largest
   * parts of the run, and need not be held both at once */
  uint32_t nc = s->p->n_classes, *left = g_new0(uint32_t, nc + 1), *holder = g_new(uint32_t, nc + 1);
  /* every unit's intervals in one block, on huge pages (big_alloc0): a small allocation per
   * unit faulted its pages in one by one */
  size_t n_iv = 1;
  for (uint32_t k = 0; k < nu && !s->o->no_intervals; k++)
    n_iv += s->p->classes[s->u[k].cls].n_instrs;
  res->interval_block = big_alloc0(sizeof(struct report_interval) * n_iv);
  for (uint32_t k = 0; k < nu; k++) {
    left[s->u[k].cls]++;
    if (s->u[k].block)
      holder[s->u[k].cls] = k;
  }
  for (uint32_t k = 0; k < nu; k++) {
    unit_collect(s, res, k);
    if (--left[s->u[k].cls] == 0) {
      big_free(s->u[holder[s->u[k].cls]].block);
      s->u[holder[s->u[k].cls]].block = NULL;
    }
  }
  g_free(left);
  g_free(holder);
}

/* The rendezvous and the event queue, before the results are collected (sim_collect). */
static void sim_free_run(struct sim *s) {
  big_free(s->slots);
  g_free(s->costs);
  g_free(s->runs);
  g_free(s->free_runs);
  big_free(s->parts);
  sim_queue_free(&s->heap);
  s->slots = NULL;
  s->costs = NULL;
  s->runs = NULL;
  s->free_runs = NULL;
  s->parts = NULL;
}

/* Frees the run-time state; the result keeps what it took (timelines, unit_of_device). */
static void sim_free(struct sim *s) {
  for (uint32_t k = 0; k < s->n_units; k++) {
    struct unit_rt *u = &s->u[k];
    big_free(u->block);
    if (u->own_kernels)
      g_free(u->kernels);
    if (u->own_ops)
      g_free(u->ops);
    g_free(u->seen_late);
    g_free(u->tl);
  }
  big_free(s->u);
  big_free(s->kernel_pool);
  big_free(s->op_pool);
  sim_free_run(s);
  g_free(s->unit_node);
  g_free(s->node_first);
  g_free(s->node_units);
  g_free(s->node_running);
  g_free(s->node_size);
  for (uint32_t n = 0; s->node_wakers && n < s->n_nodes_alloc; n++)
    g_array_free(s->node_wakers[n], TRUE);
  g_free(s->node_wakers);
  for (uint32_t c = 0; c < s->p->n_classes; c++)
    class_info_free(&s->ci[c]);
  g_free(s->ci);
}

struct sim_result *sim_run(const struct plan *p, const struct profile *prof,
                           const struct sim_options *o, GError **err) {
  static const struct sim_options defaults = {.collapse = true};
  if (!o)
    o = &defaults;
  if (p->model->fp8 != MODEL_FP8_NONE && !prof->synthetic &&
      !(prof->peak_flops[MODEL_DTYPE_FP8] > 0)) {
    piper_input_error(err,
                      "profile %s: no \"peak_tflops\".\"fp8\", which the model's \"piper.fp8\": "
                      "\"%s\" needs",
                      prof->name, model_fp8_name(p->model->fp8));
    return NULL;
  }
  double w0 = piper_clock_seconds();
  struct sim s = {.p = p,
                  .prof = prof,
                  .o = o,
                  .t_first = INFINITY,
                  .t_last = -INFINITY,
                  .sharing = prof->cores_per_node > 0 && prof->host_loop};
  struct sim_result *res = g_new0(struct sim_result, 1);
  sim_classes(&s);
  sim_units(&s, res);
  sim_nodes(&s, res);
  bool ok = sim_units_init(&s, res, err) && build_slots(&s, err);
  if (ok) {
    res->seconds_setup = piper_clock_seconds() - w0;
    double w1 = piper_clock_seconds();
    sim_loop(&s);
    res->seconds_run = piper_clock_seconds() - w1;
    ok = sim_check_finished(&s, err);
  }
  if (ok && o->critical_path)
    sim_critical_path(&s, res);
  if (ok) {
    sim_free_run(&s);
    sim_collect(&s, res);
  }
  sim_free(&s);
  if (!ok) {
    sim_result_free(res); /* also frees unit_of_device, which res->device_unit holds */
    return NULL;
  }
  return res;
}

void sim_result_free(struct sim_result *r) {
  if (!r)
    return;
  for (uint32_t k = 0; k < r->n_units; k++) {
    g_free(r->units[k].members);
    if (!r->interval_block)
      g_free(r->units[k].intervals);
    g_free(r->units[k].memory);
  }
  g_free(r->units);
  g_free(r->device_unit);
  g_free(r->path);
  big_free(r->interval_block);
  g_free(r);
}

void sim_fill_report(const struct sim_result *s, struct report_run *r) {
  for (uint32_t i = 0; i < r->n_devices; i++) {
    struct report_device *d = &r->devices[i];
    if (d->device >= r->plan->n_devices)
      continue;
    const struct sim_unit *u = &s->units[s->device_unit[d->device]];
    d->n_intervals = u->n_intervals;
    d->intervals = u->intervals;
    d->n_memory = u->n_memory;
    d->memory = u->memory;
    d->peak_memory_bytes = u->peak_bytes;
    memcpy(d->peak_breakdown, u->peak_breakdown, sizeof d->peak_breakdown);
  }
}
