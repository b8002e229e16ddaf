/* cost: GEMM, attention-core and op costs from shapes (cost.h; docs/sim.md, "Costs from
 * shapes"). */
#include "cost.h"

#include <math.h>

/* The output tiles a cuBLAS-like heuristic chooses among on a tensor-core GPU (CUTLASS's
 * Hopper/Ampere tile shapes), each with its main loop's rate relative to the largest: a tile
 * reuses each operand element tile_m * tile_n / (tile_m + tile_n) times from shared memory, so
 * small tiles feed the tensor cores less well (our assumption, in the ratio of those reuses,
 * rounded: 128x256 43, 128x128 32, 64x128 21, 64x64 16). */
static const struct {
  uint32_t m, n;
  double rate;
} gemm_tiles[] = {
    {128, 256, 1.0}, {256, 128, 1.0}, {128, 128, 0.9}, {64, 256, 0.85},
    {64, 128, 0.75}, {128, 64, 0.75}, {64, 64, 0.6},
};

/* a split-K tile keeps at least this much of K (CUTLASS's split-K serial kernels stop
 * paying off below a few hundred) */
#define SPLIT_K_MIN 512.0

static double device_sms(const struct profile *p) {
  return p->sm_count ? (double)p->sm_count : 132.0;
}

static double achieved_bandwidth(const struct profile *p) {
  return p->memory_bandwidth * p->memory_efficiency;
}

/* Time of the tiles of one tile shape and split: every wave runs a tile per SM, each at the
 * SM's share of the main loop's rate, over its K slice plus the fill. */
static double tiles_time(const struct profile *p, enum model_dtype dtype, double tiles, double tm,
                         double tn, double k_slice, double rate) {
  double sms = device_sms(p);
  double eff = dtype == MODEL_DTYPE_FP8 && p->gemm_efficiency_fp8 > 0 ? p->gemm_efficiency_fp8
                                                                        : p->gemm_efficiency;
  double per_sm = p->peak_flops[dtype] * eff * rate / sms;
  double waves = ceil(tiles / sms);
  return waves * 2.0 * tm * tn * (k_slice + p->gemm_tile_fill_k) / per_sm;
}

struct cost_gemm cost_gemm_grouped(const struct profile *p, enum model_dtype dtype, double groups,
                                   double rows, double hot_rows, double n, double k) {
  struct cost_gemm g = {.split_k = 1};
  double e = (double)model_dtype_bytes(dtype);
  if (groups < 1)
    groups = 1;
  double all_rows = (groups - 1) * rows + hot_rows;
  g.flops = 2.0 * all_rows * n * k;
  /* each operand once and the output once: at the sizes where it matters (skinny GEMMs) the
   * tiles of one operand are few and L2 holds them */
  g.bytes = (all_rows * k + groups * k * n + all_rows * n) * e;
  g.memory = g.bytes / achieved_bandwidth(p);
  g.compute = INFINITY;
  for (size_t t = 0; t < sizeof gemm_tiles / sizeof gemm_tiles[0]; t++) {
    double tm = gemm_tiles[t].m, tn = gemm_tiles[t].n;
    double col = ceil(n / tn);
    double tiles = ((groups - 1) * ceil(rows / tm) + ceil(hot_rows / tm)) * col;
    /* split-K when the tiles leave SMs idle and K is long: partial sums in fp32 written and
     * reduced (read) once more */
    double max_split = floor(device_sms(p) / tiles);
    double k_cap = floor(k / SPLIT_K_MIN);
    if (max_split > k_cap)
      max_split = k_cap;
    for (double s = 1; s <= (max_split > 1 ? max_split : 1); s *= 2) {
      double c = tiles_time(p, dtype, tiles * s, tm, tn, ceil(k / s), gemm_tiles[t].rate);
      if (s > 1)
        c += 2.0 * s * all_rows * n * 4.0 / achieved_bandwidth(p);
      if (c < g.compute) {
        g.compute = c;
        g.tile_m = (uint32_t)tm;
        g.tile_n = (uint32_t)tn;
        g.split_k = (uint32_t)s;
        g.waves = ceil(tiles * s / device_sms(p));
      }
    }
  }
  g.seconds = (g.compute > g.memory ? g.compute : g.memory) + p->kernel_overhead;
  return g;
}

struct cost_gemm cost_gemm(const struct profile *p, enum model_dtype dtype, double m, double n,
                           double k) {
  return cost_gemm_grouped(p, dtype, 1, m, m, n, k);
}

/* FlashAttention-class efficiency at a causal sequence x: plateau * x / (x + half). */
static double attention_efficiency(const struct profile *p, double x, bool backward) {
  double plateau = p->attention_efficiency[backward ? 1 : 0];
  return plateau * x / (x + p->attention_half_seq);
}

/* The core as Megatron-LM ran it in 2020-2022 (before FlashAttention; Korthikanti et al. 2022,
 * Sec. 4.1 list its tensors): per head, QK^T as a batched GEMM writing the full q x s scores
 * (the causal mask applied afterwards, so no half), a fused scale-mask-softmax reading them and
 * writing the probabilities, dropout writing its output and a 1-byte mask, and PV as a batched
 * GEMM. Backward: dP = dO V^T, dV = P^T dO, dropout's and softmax's backward over the scores,
 * dQ = dS K, dK = dS^T Q. The GEMMs by the tile model, the elementwise kernels at memory
 * bandwidth: forward 2 + 2 (softmax) + 2 + 2 + 1 (dropout) bytes a score, backward 2 + 1 + 2
 * (dropout) + 2 + 2 + 2 (softmax) bytes a score, in the model's dtype of 2 bytes. */
static double unfused_attention_core(const struct profile *p, enum model_dtype dtype, double batch,
                                     double q, double s, double heads, double d_qk, double d_v,
                                     bool backward) {
  double g = batch * heads, t = 0, e = (double)model_dtype_bytes(dtype);
  double scores = g * q * s, elementwise;
  if (!backward) {
    t += cost_gemm_grouped(p, dtype, g, q, q, s, d_qk).seconds; /* S = Q K^T */
    t += cost_gemm_grouped(p, dtype, g, q, q, d_v, s).seconds;  /* O = P V */
    elementwise = scores * (4 * e + 1);
  } else {
    t += cost_gemm_grouped(p, dtype, g, q, q, s, d_v).seconds;  /* dP = dO V^T */
    t += cost_gemm_grouped(p, dtype, g, s, s, d_v, q).seconds;  /* dV = P^T dO */
    t += cost_gemm_grouped(p, dtype, g, q, q, d_qk, s).seconds; /* dQ = dS K */
    t += cost_gemm_grouped(p, dtype, g, s, s, d_qk, q).seconds; /* dK = dS^T Q */
    elementwise = scores * (2 * e + 1 + 3 * e);
  }
  /* softmax and dropout: two kernels a pass */
  return t + elementwise / achieved_bandwidth(p) + 2 * p->kernel_overhead;
}

double cost_attention_core(const struct profile *p, enum model_dtype dtype, double batch,
                           double seq, double heads, double kv_heads, double d_qk, double d_v,
                           bool causal, uint32_t cp_chunks, bool backward) {
  if (cp_chunks < 1)
    cp_chunks = 1;
  if (p->attention_unfused)
    return unfused_attention_core(p, dtype, batch, seq / cp_chunks, seq, heads, d_qk, d_v,
                                  backward);
  /* QK^T over d_qk and PV over d_v, half the square when causal */
  double flops = 2.0 * batch * heads * seq * seq * (d_qk + d_v) * (causal ? 0.5 : 1.0);
  flops /= cp_chunks;
  if (backward)
    flops *= 2.5;
  /* A non-causal sequence s has the work per query tile of a causal one of 2 s: the FA3
   * paper's forward figures (Shah et al. 2024, Fig. 5, head dim 128) put non-causal at s close
   * to causal at 2 s (467 vs 423 TFLOP/s at 512 / 1k, 565 vs 521 at 1k / 2k). */
  double x = seq / cp_chunks * (causal ? 1.0 : 2.0);
  double t = flops / (p->peak_flops[dtype] * attention_efficiency(p, x, backward));
  /* q, k, v read and the output written (twice that and dq, dk, dv backward) */
  double e = (double)model_dtype_bytes(dtype);
  double bytes = batch * seq / cp_chunks * (heads * (d_qk + d_v) + kv_heads * (d_qk + d_v)) * e;
  double tm = (backward ? 2.5 : 1.0) * bytes / achieved_bandwidth(p);
  return (t > tm ? t : tm) + p->kernel_overhead;
}

double cost_routing_maxvio(const struct model *m) {
  return m->loss_free_balancing ? COST_MAXVIO_LOSS_FREE : COST_MAXVIO_AUX_LOSS;
}

double cost_routing_hot_factor(const struct profile *p, const struct model *m, double routes,
                               double experts) {
  if (p->routing_imbalance > 0)
    return p->routing_imbalance;
  if (experts <= 1 || routes <= 0)
    return 1;
  /* the trained router's own skew (published MaxVio, over a whole validation set), and on top
   * of it a micro-batch's sampling spread: binomial(routes, 1/E) per expert, the largest of E
   * about mean + sqrt(2 ln E) sd */
  double mean = routes / experts;
  double sd = sqrt(mean * (1 - 1 / experts));
  return 1 + cost_routing_maxvio(m) + sqrt(2 * log(experts)) * sd / mean;
}

/* ---- collectives by level ---------------------------------------------------------------- */

/* The NIC level of a span across nodes: each member's share of its node's NICs (all of them
 * when the group fills the node: one ring or peer per NIC rail), past one leaf group through
 * the spine. */
static void nic_level(const struct profile *p, const struct profile_span *span, double *bw,
                      double *lat) {
  double gpn = p->gpus_per_node ? (double)p->gpus_per_node : 1;
  *bw = p->nic_bandwidth * p->network_efficiency * p->nics_per_node * span->min_per_node / gpn;
  *lat = p->inter_latency;
  if (p->nodes_per_leaf && span->n_nodes > p->nodes_per_leaf) {
    *bw *= p->spine_bandwidth_factor;
    *lat += p->spine_latency;
  }
  double intra = p->intra_bandwidth * p->network_efficiency;
  if (intra > 0 && intra < *bw)
    *bw = intra;
}

/* Ring and tree all-reduce as NCCL's tuning model (src/graph/tuning.cc) counts them: a ring
 * takes 2 (p - 1) steps, 2 (N - 1) of them across nodes; a tree chains the g ranks of a node
 * and spans the N nodes with a double binary tree, 2 ((g - 1) intra + log2 N inter) steps, and
 * moves every byte twice. The algorithm is the faster, as NCCL's tuner picks, unless the profile
 * names one; inside one node NCCL uses rings. */
static void all_reduce_levels(const struct profile *p, double n, const struct profile_span *span,
                              double b_inter, double a_inter, struct profile_comm_cost *c) {
  double pr = span->p, N = span->n_nodes, g = span->min_per_node;
  double a_intra = p->intra_latency;
  double b = N > 1 ? b_inter : p->intra_bandwidth * p->network_efficiency;
  double inter_steps = N > 1 ? 2 * (N - 1) : 0;
  double ring_l = (2 * (pr - 1) - inter_steps) * a_intra + inter_steps * a_inter;
  double ring_t = 2 * (pr - 1) / pr * n / b;
  double tree_l = 2 * ((g - 1) * a_intra + ceil(log2(N > 1 ? N : 1)) * a_inter);
  double tree_t = 2 * n / b;
  bool tree = N > 1 && (p->algo == PROFILE_ALGO_TREE ||
                        (p->algo == PROFILE_ALGO_AUTO && tree_l + tree_t < ring_l + ring_t));
  c->latency = tree ? tree_l : ring_l;
  c->transfer = tree ? tree_t : ring_t;
}

/* All-to-all: what goes to the node's own members over NVLink while the rest leaves over the
 * NICs, the slower of the two. NCCL exchanges with each of the p - 1 peers (a step each, whose
 * latency makes small messages slow: a peer's n / p bytes against one step's latency); an
 * optimised dispatcher (DeepEP) sends in one pass at its own efficiency. */
static void all_to_all_levels(const struct profile *p, double n, const struct profile_span *span,
                              double b_inter, double a_inter, struct profile_comm_cost *c) {
  double pr = span->p, g = span->min_per_node;
  double b_intra = p->intra_bandwidth *
                   (p->deepep ? p->deepep_efficiency_intra : p->network_efficiency);
  if (p->deepep && span->n_nodes > 1)
    b_inter *= p->deepep_efficiency_inter / p->network_efficiency;
  double t_intra = (g - 1) / pr * n / b_intra;
  double t_inter = span->n_nodes > 1 ? (pr - g) / pr * n / b_inter : 0;
  c->transfer = t_intra > t_inter ? t_intra : t_inter;
  if (p->deepep)
    c->latency = span->n_nodes > 1 ? a_inter : p->intra_latency;
  else
    c->latency = (g - 1) * p->intra_latency + (pr - g) * a_inter;
}

struct profile_comm_cost cost_collective(const struct profile *p, enum ir_node_kind kind,
                                         uint64_t bytes, const struct profile_span *span) {
  struct profile_comm_cost c = {.inter_node = span->n_nodes > 1};
  double n = (double)bytes, b, a;
  if (span->n_nodes > 1)
    nic_level(p, span, &b, &a);
  else
    b = p->intra_bandwidth * p->network_efficiency, a = p->intra_latency;
  if (b <= 0)
    b = 1;
  double pr = span->p, N = span->n_nodes;
  switch (kind) {
  case IR_NODE_SEND:
  case IR_NODE_RECV:
    c.latency = a;
    c.transfer = n / b;
    break;
  case IR_NODE_ALL_REDUCE:
    if (span->p > 1)
      all_reduce_levels(p, n, span, b, a, &c);
    break;
  case IR_NODE_REDUCE_SCATTER:
  case IR_NODE_ALL_GATHER:
    /* a ring of p - 1 steps, N - 1 of them across nodes */
    if (span->p <= 1)
      break;
    c.latency = (pr - 1 - (N - 1)) * p->intra_latency + (N - 1) * (N > 1 ? a : 0);
    c.transfer = (pr - 1) / pr * n / b;
    break;
  case IR_NODE_ALL_TO_ALL:
    if (span->p > 1)
      all_to_all_levels(p, n, span, b, a, &c);
    break;
  default: break;
  }
  return c;
}

double cost_all_to_all_skew(const struct profile *p, const struct model *m, uint32_t ranks) {
  if (!p->shape_model || m->num_experts <= 1 || ranks <= 1)
    return 1;
  double E = (double)m->num_experts, local = E / ranks;
  if (local < 1)
    local = 1;
  double routes = (double)model_tokens_per_microbatch(m) * (double)m->experts_per_tok * ranks;
  return (local - 1 + cost_routing_hot_factor(p, m, routes, E)) / local;
}

/* ---- model ops as GEMMs ------------------------------------------------------------------- */

/* The GEMMs of one op's forward as (rows, n, k, groups, hot rows); a backward pass runs each
 * as its input-gradient (rows, k, n) and weight-gradient (k, n, rows) products. */
struct op_gemm {
  double rows, n, k, groups, hot_rows;
  double launches; /* kernel launches of each of its products (1 but per-expert launches) */
};

struct op_shape {
  struct op_gemm g[6];
  uint32_t n_gemms;
  bool attention;
  double batch, seq, heads, kv_heads, d_qk, d_v;
  double window; /* keys a query sees on a sliding layer (0: full causal) */
  bool head_recomputes; /* the LM head's BI and BW each recompute the logits (models/build.c) */
};

static void add_gemm(struct op_shape *s, double rows, double n, double k) {
  s->g[s->n_gemms++] = (struct op_gemm){rows, n, k, 1, rows, 1};
}

static double at_least_one(double x) {
  return x < 1 ? 1 : x;
}

/* Attention and MLA: their projections, TP dividing heads (Megatron's column / row layout). */
static void attention_gemms(const struct model *m, const struct model_op *op, double tp,
                            struct op_shape *s) {
  const int64_t *sh = op->shape;
  double b = (double)sh[0], seq = (double)sh[1], T = b * seq, H = at_least_one(sh[2] / tp);
  s->attention = true;
  s->batch = b;
  s->seq = seq;
  s->heads = H;
  if (op->kind == MODEL_OP_ATTENTION) {
    double kv = at_least_one(sh[3] / tp), d = (double)sh[4], h = (double)sh[5];
    s->window = (double)sh[6];
    add_gemm(s, T, (H + 2 * kv) * d, h);
    add_gemm(s, T, h, H * d);
    s->kv_heads = kv;
    s->d_qk = s->d_v = d;
    return;
  }
  double ql = (double)sh[3], kvl = (double)sh[4], qk = (double)sh[5], vd = (double)sh[6];
  double h = (double)sh[7], rope = (double)m->qk_rope_head_dim, nope = qk - rope;
  if (ql > 0) {
    add_gemm(s, T, ql, h);
    add_gemm(s, T, H * qk, ql);
  } else {
    add_gemm(s, T, H * qk, h);
  }
  add_gemm(s, T, kvl + rope, h);
  add_gemm(s, T, H * (nope + vd), kvl);
  add_gemm(s, T, h, H * vd);
  s->kv_heads = H;
  s->d_qk = qk;
  s->d_v = vd;
}

/* The op's forward GEMMs on this device; false for ops without GEMMs. */
static bool op_gemms(const struct profile *p, const struct model *m, const struct model_op *op,
                     double tp, double ep, double share, struct op_shape *s) {
  const int64_t *sh = op->shape;
  double T = (double)sh[0], h = (double)sh[1];
  switch (op->kind) {
  case MODEL_OP_ATTENTION:
  case MODEL_OP_MLA_ATTENTION: attention_gemms(m, op, tp, s); return true;
  case MODEL_OP_MLP:
  case MODEL_OP_SHARED_EXPERT: {
    double f = at_least_one((double)sh[2] / tp);
    add_gemm(s, T, op->kind == MODEL_OP_MLP && sh[3] ? f : 2 * f, h); /* (gate and) up */
    add_gemm(s, T, h, f);                                             /* down */
    return true;
  }
  case MODEL_OP_ROUTER: add_gemm(s, T * share, (double)sh[2], h); return true;
  case MODEL_OP_EXPERT_FFN: {
    /* ep devices each hold E / ep experts and receive the T x top_k routes of one device's
     * micro-batch (balanced on average); the most-loaded expert sets its group's rows */
    double f = at_least_one((double)sh[2] / tp), E = (double)sh[3], k = (double)sh[4];
    double local = at_least_one(E / ep), routes = T * k;
    double rows = routes / local;
    double hot = rows * cost_routing_hot_factor(p, m, routes * ep, E);
    /* per-expert launches: the tiles still pool over the SMs (Transformer Engine spreads the
     * per-expert cuBLAS calls over several streams), but every launch pays its fixed cost */
    double launches = p->expert_gemm_per_expert ? local : 1;
    s->g[s->n_gemms++] = (struct op_gemm){rows, 2 * f, h, local, hot, launches};
    s->g[s->n_gemms++] = (struct op_gemm){rows, h, f, local, hot, launches};
    return true;
  }
  case MODEL_OP_LM_HEAD_LOSS:
    add_gemm(s, T, at_least_one((double)sh[2] / tp), h);
    s->head_recomputes = true;
    return true;
  default: return false;
  }
}

/* Adds the pass's GEMMs of g: the forward product, the input gradient (rows x k from dY W^T),
 * the weight gradient (k x n over the rows, each group over its own). recompute: the LM head's
 * BI and BW each recompute the forward product first (models/build.c). */
static void pass_gemms(const struct profile *p, enum model_dtype dt, const struct op_gemm *g,
                       enum ir_pass pass, bool recompute, double *seconds, double *bytes,
                       double *mem_bound) {
  struct cost_gemm fwd = cost_gemm_grouped(p, dt, g->groups, g->rows, g->hot_rows, g->n, g->k);
  struct cost_gemm c[4];
  int n = 0;
  if (pass == IR_PASS_F || (recompute && pass != IR_PASS_B))
    c[n++] = fwd;
  if (recompute && pass == IR_PASS_B) {
    c[n++] = fwd;
    c[n++] = fwd;
  }
  if (pass == IR_PASS_BI || pass == IR_PASS_B)
    c[n++] = cost_gemm_grouped(p, dt, g->groups, g->rows, g->hot_rows, g->k, g->n);
  if (pass == IR_PASS_BW || pass == IR_PASS_B) {
    double inner = ((g->groups - 1) * g->rows + g->hot_rows) / g->groups;
    c[n++] = cost_gemm_grouped(p, dt, g->groups, g->k, g->k, g->n, inner);
  }
  for (int i = 0; i < n; i++) {
    /* each product's launches past the first (cost_gemm_grouped counts one) */
    c[i].seconds += (g->launches - 1) * p->kernel_overhead;
    *seconds += c[i].seconds;
    *bytes += c[i].bytes;
    if (c[i].memory > c[i].compute)
      *mem_bound += c[i].seconds;
  }
}

/* The FP8 recipes' casts of the GEMMs' activation operands, at memory bandwidth: F casts each
 * GEMM's input [rows, k], BI its output gradient [rows, n] (BW multiplies the operands F and
 * BI cast). Per element: per-tensor current scaling reads the bf16 operand twice (its amax,
 * then the cast) and writes the FP8 copy: 2 + 2 + 1 bytes; blockwise scaling reads it once,
 * each 1x128 tile's scale from the tile itself: 2 + 1 bytes and a 4-byte scale per 128. The
 * weights' casts (once per step, in the optimizer) are not counted here. */
static void fp8_quantize(const struct profile *p, enum model_fp8 recipe, const struct op_shape *s,
                         enum ir_pass pass, double family[PROFILE_FAMILY_COUNT],
                         double *memory_bound) {
  double per = recipe == MODEL_FP8_TENSORWISE ? 5.0 : 3.0 + 4.0 / 128.0, elems = 0;
  for (uint32_t i = 0; i < s->n_gemms; i++) {
    const struct op_gemm *g = &s->g[i];
    double rows = (g->groups - 1) * g->rows + g->hot_rows;
    if (pass == IR_PASS_F)
      elems += rows * g->k;
    if (pass == IR_PASS_BI || pass == IR_PASS_B)
      elems += rows * g->n;
  }
  if (elems <= 0)
    return;
  double t = elems * per / achieved_bandwidth(p) + p->kernel_overhead;
  family[PROFILE_FAMILY_MEMORY] += t;
  *memory_bound += t;
}

bool cost_model_op(const struct profile *p, const struct model *m, const struct model_op *op,
                   enum ir_pass pass, uint32_t tp, uint32_t ep, double share, double bytes,
                   double family[PROFILE_FAMILY_COUNT], double *memory_bound) {
  struct op_shape s = {0};
  if (!op_gemms(p, m, op, tp > 1 ? tp : 1, ep > 1 ? ep : 1, share, &s))
    return false;
  double gemm_bytes = 0;
  enum model_dtype gd = model_gemm_dtype(m);
  for (uint32_t i = 0; i < s.n_gemms; i++)
    pass_gemms(p, gd, &s.g[i], pass, s.head_recomputes, &family[PROFILE_FAMILY_GEMM],
               &gemm_bytes, memory_bound);
  if (gd != m->dtype) {
    fp8_quantize(p, m->fp8, &s, pass, family, memory_bound);
    /* the op's bytes (models/build.c) count its GEMM operands in the model's dtype: take those
     * out, not the FP8 ones, so the rest stays the op's elementwise traffic */
    gemm_bytes *= (double)model_dtype_bytes(m->dtype) / (double)model_dtype_bytes(gd);
  }
  if (s.attention && pass != IR_PASS_BW) {
    bool bwd = pass != IR_PASS_F;
    /* a sliding layer as s / w blocks of w queries over a full band of w keys: the kernel's
     * work and its efficiency at w (the w^2 / 2 the band's start skips is within w / 2s);
     * under context parallelism s.seq is this rank's share of the sequence (models/build.c) */
    uint32_t cp = m->context_parallel > 1 ? (uint32_t)m->context_parallel : 1;
    double t = s.window > 0
                   ? cost_attention_core(p, m->dtype, s.batch * s.seq / s.window, s.window,
                                         s.heads, s.kv_heads, s.d_qk, s.d_v, false, 1, bwd)
                   : cost_attention_core(p, m->dtype, s.batch, s.seq * cp, s.heads, s.kv_heads,
                                         s.d_qk, s.d_v, true, cp, bwd);
    family[PROFILE_FAMILY_ATTENTION] += t;
    double e = (double)model_dtype_bytes(m->dtype);
    gemm_bytes += s.batch * s.seq * (s.heads + s.kv_heads) * (s.d_qk + s.d_v) * e;
  }
  /* what the GEMMs and the core do not move (activations' elementwise parts, RoPE, softmax
   * and cross-entropy over the logits, the MoE permutation copies) at memory bandwidth */
  double rest = bytes - gemm_bytes;
  if (rest > 0) {
    double t = rest / achieved_bandwidth(p) + p->kernel_overhead;
    family[PROFILE_FAMILY_MEMORY] += t;
    *memory_bound += t;
  }
  return true;
}

/* ---- host launches ------------------------------------------------------------------------
 * Kernel launches the host enqueues for one op and pass, as Megatron-Core runs a layer (its
 * defaults: Transformer Engine layers, the alltoall token dispatcher, moe_router_fusion and
 * moe_permute_fusion off), counted from its code (NVIDIA/Megatron-LM d98e8a6, 2026-08-22:
 * megatron/core/transformer/moe/router.py, token_dispatcher.py, moe_utils.py, experts.py;
 * docs/sim.md "The host thread" lists each count). Backward: autograd's kernels for the same
 * ops, BI the input gradients, BW the weight-gradient GEMMs. The all-to-alls, TP and pipeline
 * communication are instructions of their own (one launch each). */
struct op_launches {
  double f, bi, bw;
};
static const struct op_launches launches_of[MODEL_OP_KIND_COUNT] = {
    /* lookup; backward: embedding_dense_backward (sort, segment sums) */
    [MODEL_OP_EMBEDDING] = {1, 0, 2},
    /* TE fused norm; backward: one dgrad kernel, the weight gradient's partial sums reduced */
    [MODEL_OP_RMSNORM] = {1, 1, 1},
    /* QKV GEMM, RoPE of q and k, the fused attention kernel, output projection; backward:
     * two dgrad GEMMs, attention backward, two RoPE backwards; two wgrad GEMMs */
    [MODEL_OP_ATTENTION] = {5, 5, 2},
    /* q down and up, kv down and up projections, two latent norms, RoPE of q and k, split and
     * concatenation of the rope / nope parts (2), attention, output projection */
    [MODEL_OP_MLA_ATTENTION] = {12, 11, 5},
    [MODEL_OP_RESIDUAL_ADD] = {1, 0, 0},
    /* fc1 GEMM, SwiGLU, fc2 GEMM; backward: two dgrad GEMMs and SwiGLU's; two wgrad GEMMs */
    [MODEL_OP_MLP] = {3, 3, 2},
    [MODEL_OP_SHARED_EXPERT] = {3, 3, 2},
    /* router.py, unfused: gating GEMM and its fp32 cast (2); topk_routing_with_score_function:
     * softmax, topk, the dense probs and routing map (zeros and scatter each: 4); the
     * auxiliary loss: compute_routing_scores_for_aux_loss (softmax, topk, zeros, scatter),
     * tokens per expert (sum), switch_load_balancing_loss_func (2 sums, 2 products), its
     * tracker (2); the expert bias update (2). Backward: the loss's and softmax's gradients,
     * the scatter's gather, the GEMM's dgrad; its wgrad */
    [MODEL_OP_ROUTER] = {20, 8, 1},
    /* token_dispatcher.py around the expert GEMMs (counted in op_launch_gemms): preprocess
     * (routing_map.sum, long, input_splits, the counts' slice and three sums: 7), the
     * device-to-host copies of the splits and counts (6 cudaMemcpyAsync), permute (routing
     * map transpose and contiguous, arange, expand, masked_select of indices and probs,
     * index_select: 8), sort_chunks_by_idxs of tokens and probs (2), the activation and the
     * probs product (2), the unsort (1), unpermute (probs product, zeros, scatter_add: 3).
     * Backward: unpermute's (gather, product, sum: 3), the sorts (2), the activation's and
     * the product's (3), permute's (zeros, index_add, probs scatter: 3) */
    [MODEL_OP_EXPERT_FFN] = {29, 11, 0},
    /* the LM head GEMM and Megatron's vocab-parallel cross entropy (max, its all-reduce,
     * subtract, exp, sum, its all-reduce, log, target mask, gather, masked fill: 10);
     * backward: softmax minus one-hot (4), dgrad GEMM; the wgrad GEMM */
    [MODEL_OP_LM_HEAD_LOSS] = {11, 5, 1},
};

double cost_op_launches(const struct profile *p, const struct model *m, const struct model_op *op,
                        enum ir_pass pass, uint32_t ep) {
  if (op->kind >= MODEL_OP_KIND_COUNT)
    return 0;
  const struct op_launches *l = &launches_of[op->kind];
  double f = l->f, bi = l->bi, bw = l->bw;
  if (op->kind == MODEL_OP_EXPERT_FFN) {
    /* fc1 and fc2: one grouped GEMM each, or one cuBLAS call a local expert (TE's
     * GroupedLinear); an FP8 recipe quantizes each call's input first (one cast a call) */
    double local = at_least_one((double)op->shape[3] / (ep ? ep : 1));
    double calls = p->expert_gemm_per_expert ? local : 1;
    double cast = m->fp8 != MODEL_FP8_NONE ? 2 : 1;
    f += 2 * calls * cast;
    bi += 2 * calls * cast;
    bw += 2 * calls;
  }
  switch (pass) {
  case IR_PASS_F:
  case IR_PASS_R: return f;
  case IR_PASS_BI: return bi;
  case IR_PASS_BW: return bw;
  default: return bi + bw;
  }
}
