/* profile: loading hardware profiles and the cost formulas of the simulator (SPEC §6). */
#include "profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"

/* ---- loading ------------------------------------------------------------------------------ */

static bool get_obj(const cJSON *root, const char *key, const cJSON **out, const char *ctx,
                    GError **err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  *out = NULL;
  if (!v)
    return true;
  if (!cJSON_IsObject(v))
    return piper_input_error(err, "%s: key \"%s\" must be an object", ctx, key);
  *out = v;
  return true;
}

static bool parse_pass(const char *s, enum ir_pass *out) {
  static const char *const names[] = {"F", "B", "BI", "BW"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (enum ir_pass)i;
      return true;
    }
  return false;
}

static int entry_cmp(const void *a, const void *b) {
  const struct profile_entry *x = a, *y = b;
  if (x->kind != y->kind)
    return x->kind < y->kind ? -1 : 1;
  if (x->pass != y->pass)
    return x->pass < y->pass ? -1 : 1;
  for (int i = 0; i < PROFILE_MAX_SHAPE; i++)
    if (x->shape[i] != y->shape[i])
      return x->shape[i] < y->shape[i] ? -1 : 1;
  return 0;
}

static bool parse_measured(struct profile *p, const cJSON *arr, const char *name, GError **err) {
  if (!cJSON_IsArray(arr))
    return piper_input_error(err, "%s: key \"measured\" must be an array", name);
  int n = cJSON_GetArraySize(arr);
  p->entries = g_new0(struct profile_entry, n > 0 ? n : 1);
  static const char *const keys[] = {"op", "pass", "shape", "ms", NULL};
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s: measured[%d]", name, i);
    if (!cJSON_IsObject(e))
      return piper_input_error(err, "%s: must be an object", ctx);
    if (!json_check_keys(e, keys, ctx, err))
      return false;
    struct profile_entry *en = &p->entries[i];
    const char *op, *pass;
    if (!json_get_string(e, "op", true, &op, ctx, err))
      return false;
    if (!json_get_string(e, "pass", true, &pass, ctx, err))
      return false;
    int k;
    for (k = 0; k < MODEL_OP_KIND_COUNT; k++)
      if (strcmp(op, model_op_kind_name((enum model_op_kind)k)) == 0)
        break;
    if (k == MODEL_OP_KIND_COUNT)
      return piper_input_error(err, "%s: key \"op\": unknown op kind \"%s\"", ctx, op);
    en->kind = (enum model_op_kind)k;
    if (!parse_pass(pass, &en->pass))
      return piper_input_error(err, "%s: key \"pass\": \"%s\" is not F, B, BI or BW", ctx, pass);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) < 1 ||
        cJSON_GetArraySize(shape) > PROFILE_MAX_SHAPE)
      return piper_input_error(err, "%s: key \"shape\" must be an array of 1 to %d integers", ctx,
                       PROFILE_MAX_SHAPE);
    int j = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
      int64_t v;
      if (!json_as_int(d, 0, INT64_MAX / 2, &v, ctx, "shape", err))
        return false;
      en->shape[j++] = v;
    }
    double ms;
    if (!json_get_double(e, "ms", true, 0, 1e9, &ms, ctx, err))
      return false;
    en->seconds = ms * 1e-3;
    i++;
  }
  p->n_entries = (uint32_t)i;
  qsort(p->entries, p->n_entries, sizeof *p->entries, entry_cmp);
  for (uint32_t k = 1; k < p->n_entries; k++)
    if (entry_cmp(&p->entries[k - 1], &p->entries[k]) == 0)
      return piper_input_error(err, "%s: measured: duplicate entry for op \"%s\" pass %s", name,
                       model_op_kind_name(p->entries[k].kind), ir_pass_name(p->entries[k].pass));
  return true;
}

struct profile *profile_parse_json(const char *name, const cJSON *root, GError **err) {
  struct profile *p = g_new0(struct profile, 1);
  p->path = g_strdup(name);
  /* defaults: a profile states what it knows; the rest takes neutral values */
  p->compute_efficiency = 1;
  p->memory_efficiency = 1;
  p->network_efficiency = 1;
  p->optimizer_bytes_per_param = 28; /* AdamW: read p32,g,m,v (4+4+4+4); write p32,m,v (12) */
  p->gpus_per_node = 8;
  p->nics_per_node = 8;
  p->algo = PROFILE_ALGO_RING;
  char ctx[300];

  if (!cJSON_IsObject(root)) {
    piper_input_error(err, "%s: a profile must be a JSON object", name);
    goto fail;
  }
  static const char *const top[] = {"name",    "kind",       "description", "sources",   "device",
                                    "network", "contention", "measured",    "synthetic", NULL};
  if (!json_check_keys(root, top, name, err))
    goto fail;
  const char *s = NULL;
  if (!json_get_string(root, "name", false, &s, name, err))
    goto fail;
  if (s) {
    p->name = g_strdup(s);
  } else {
    char *base = g_path_get_basename(name);
    char *dot = strrchr(base, '.');
    if (dot)
      *dot = 0;
    p->name = base;
  }
  const char *kind = "device";
  if (!json_get_string(root, "kind", false, &kind, name, err))
    goto fail;
  if (strcmp(kind, "synthetic") == 0) {
    p->synthetic = true;
  } else if (strcmp(kind, "device") != 0) {
    piper_input_error(err, "%s: key \"kind\": \"%s\" is not \"device\" or \"synthetic\"", name, kind);
    goto fail;
  }

  const cJSON *dev, *net, *con, *syn;
  if (!get_obj(root, "device", &dev, name, err) || !get_obj(root, "network", &net, name, err) ||
      !get_obj(root, "contention", &con, name, err) || !get_obj(root, "synthetic", &syn, name, err))
    goto fail;
  if (!p->synthetic && !dev) {
    piper_input_error(err, "%s: key \"device\" is required for a device profile", name);
    goto fail;
  }
  if (p->synthetic && !syn) {
    piper_input_error(err, "%s: key \"synthetic\" is required for a synthetic profile", name);
    goto fail;
  }
  if (dev) {
    snprintf(ctx, sizeof ctx, "%s: device", name);
    static const char *const keys[] = {
        "peak_tflops",        "memory_bandwidth_gbs",      "memory_capacity_gib",
        "sm_count",           "compute_efficiency",        "memory_efficiency",
        "kernel_overhead_us", "optimizer_bytes_per_param", NULL};
    if (!json_check_keys(dev, keys, ctx, err))
      goto fail;
    const cJSON *pk;
    if (!get_obj(dev, "peak_tflops", &pk, ctx, err))
      goto fail;
    if (!pk && !p->synthetic) {
      piper_input_error(err, "%s: key \"peak_tflops\" is required", ctx);
      goto fail;
    }
    if (pk) {
      char c2[320];
      snprintf(c2, sizeof c2, "%s.peak_tflops", ctx);
      static const char *const dk[] = {"bf16", "fp32", NULL};
      if (!json_check_keys(pk, dk, c2, err))
        goto fail;
      double bf = 0, f32 = 0;
      if (!json_get_double(pk, "bf16", !p->synthetic, 1e-6, 1e6, &bf, c2, err) ||
          !json_get_double(pk, "fp32", !p->synthetic, 1e-6, 1e6, &f32, c2, err))
        goto fail;
      p->peak_flops[MODEL_DTYPE_BF16] = bf * 1e12;
      p->peak_flops[MODEL_DTYPE_FP32] = f32 * 1e12;
    }
    double bw = 0, cap = 0, ov = 0;
    int64_t sms = 0;
    if (!json_get_double(dev, "memory_bandwidth_gbs", !p->synthetic, 1e-3, 1e9, &bw, ctx, err) ||
        !json_get_double(dev, "memory_capacity_gib", !p->synthetic, 1e-6, 1e9, &cap, ctx, err) ||
        !json_get_int(dev, "sm_count", false, 1, 1 << 20, &sms, ctx, err) ||
        !json_get_double(dev, "compute_efficiency", false, 1e-3, 1, &p->compute_efficiency, ctx,
                         err) ||
        !json_get_double(dev, "memory_efficiency", false, 1e-3, 1, &p->memory_efficiency, ctx,
                         err) ||
        !json_get_double(dev, "kernel_overhead_us", false, 0, 1e6, &ov, ctx, err) ||
        !json_get_double(dev, "optimizer_bytes_per_param", false, 0, 1e3,
                         &p->optimizer_bytes_per_param, ctx, err))
      goto fail;
    p->memory_bandwidth = bw * 1e9;
    p->memory_capacity = (uint64_t)(cap * (double)(1ull << 30));
    p->sm_count = (uint32_t)sms;
    p->kernel_overhead = ov * 1e-6;
  }
  if (con) {
    snprintf(ctx, sizeof ctx, "%s: contention", name);
    static const char *const keys[] = {"comm_sm_share", "comm_memory_share", NULL};
    if (!json_check_keys(con, keys, ctx, err) ||
        !json_get_double(con, "comm_sm_share", false, 0, 0.9, &p->comm_sm_share, ctx, err) ||
        !json_get_double(con, "comm_memory_share", false, 0, 0.9, &p->comm_memory_share, ctx, err))
      goto fail;
  }
  if (net) {
    snprintf(ctx, sizeof ctx, "%s: network", name);
    static const char *const keys[] = {
        "gpus_per_node",     "nics_per_node",        "nvlink_bandwidth_gbs",
        "nvlink_latency_us", "nic_bandwidth_gbs",    "inter_node_latency_us",
        "efficiency",        "collective_algorithm", NULL};
    if (!json_check_keys(net, keys, ctx, err))
      goto fail;
    int64_t gpn = p->gpus_per_node, nics = p->nics_per_node;
    double ibw = 0, ilat = 0, nbw = 0, nlat = 0;
    bool req = !p->synthetic;
    if (!json_get_int(net, "gpus_per_node", req, 1, 1 << 16, &gpn, ctx, err) ||
        !json_get_int(net, "nics_per_node", req, 1, 1 << 16, &nics, ctx, err) ||
        !json_get_double(net, "nvlink_bandwidth_gbs", req, 1e-6, 1e9, &ibw, ctx, err) ||
        !json_get_double(net, "nvlink_latency_us", req, 0, 1e9, &ilat, ctx, err) ||
        !json_get_double(net, "nic_bandwidth_gbs", req, 1e-6, 1e9, &nbw, ctx, err) ||
        !json_get_double(net, "inter_node_latency_us", req, 0, 1e9, &nlat, ctx, err) ||
        !json_get_double(net, "efficiency", false, 1e-3, 1, &p->network_efficiency, ctx, err))
      goto fail;
    p->gpus_per_node = (uint32_t)gpn;
    p->nics_per_node = (uint32_t)nics;
    p->intra_bandwidth = ibw * 1e9;
    p->intra_latency = ilat * 1e-6;
    p->nic_bandwidth = nbw * 1e9;
    p->inter_latency = nlat * 1e-6;
    const char *algo = NULL;
    if (!json_get_string(net, "collective_algorithm", false, &algo, ctx, err))
      goto fail;
    if (algo) {
      if (strcmp(algo, "ring") == 0) {
        p->algo = PROFILE_ALGO_RING;
      } else if (strcmp(algo, "tree") == 0) {
        p->algo = PROFILE_ALGO_TREE;
      } else if (strcmp(algo, "auto") == 0) {
        p->algo = PROFILE_ALGO_AUTO;
      } else {
        piper_input_error(err, "%s: key \"collective_algorithm\": \"%s\" is not ring, tree or auto", ctx,
                  algo);
        goto fail;
      }
    }
  } else if (!p->synthetic) {
    piper_input_error(err, "%s: key \"network\" is required for a device profile", name);
    goto fail;
  }
  if (syn) {
    snprintf(ctx, sizeof ctx, "%s: synthetic", name);
    static const char *const keys[] = {"F_ms",         "B_ms",    "BI_ms", "BW_ms",
                                       "optimizer_ms", "comm_ms", NULL};
    if (!json_check_keys(syn, keys, ctx, err))
      goto fail;
    double *dst[] = {&p->syn_f, &p->syn_b, &p->syn_bi, &p->syn_bw, &p->syn_optimizer, &p->syn_comm};
    for (int i = 0; i < 6; i++) {
      double v = 0;
      if (!json_get_double(syn, keys[i], i < 4, 0, 1e9, &v, ctx, err))
        goto fail;
      *dst[i] = v * 1e-3;
    }
  }
  const cJSON *meas = cJSON_GetObjectItemCaseSensitive(root, "measured");
  if (meas && !parse_measured(p, meas, name, err))
    goto fail;
  return p;
fail:
  profile_free(p);
  return NULL;
}

struct profile *profile_load_file(const char *path, GError **err) {
  cJSON *root = json_parse_file(path, err);
  if (!root)
    return NULL;
  struct profile *p = profile_parse_json(path, root, err);
  cJSON_Delete(root);
  return p;
}

void profile_free(struct profile *p) {
  if (!p)
    return;
  g_free(p->name);
  g_free(p->path);
  g_free(p->entries);
  g_free(p);
}

/* ---- compute costs ------------------------------------------------------------------------ */

/* Measured time of (kind, pass, shape): an exact entry; else interpolation along the one shape
 * dimension in which bracketing entries differ from the query (all other dimensions equal),
 * linear in that dimension; outside the measured range the nearest entry is scaled in
 * proportion to the dimension (kernel time grows about linearly in tokens, width or experts).
 * Returns a negative value when nothing applies. */
static double table_lookup(const struct profile *p, enum model_op_kind kind, enum ir_pass pass,
                           const int64_t *shape) {
  struct profile_entry key = {.kind = kind, .pass = pass};
  memcpy(key.shape, shape, sizeof key.shape);
  /* the range of entries of this kind and pass */
  uint32_t lo = 0, hi = p->n_entries;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    const struct profile_entry *e = &p->entries[mid];
    if (e->kind < kind || (e->kind == kind && e->pass < pass))
      lo = mid + 1;
    else
      hi = mid;
  }
  uint32_t first = lo;
  uint32_t last = first;
  while (last < p->n_entries && p->entries[last].kind == kind && p->entries[last].pass == pass)
    last++;
  if (first == last)
    return -1;
  for (uint32_t i = first; i < last; i++)
    if (entry_cmp(&p->entries[i], &key) == 0)
      return p->entries[i].seconds;
  /* one differing dimension: best bracket per dimension, the first dimension that has one */
  for (int d = 0; d < PROFILE_MAX_SHAPE; d++) {
    const struct profile_entry *below = NULL, *above = NULL;
    for (uint32_t i = first; i < last; i++) {
      const struct profile_entry *e = &p->entries[i];
      bool others = true;
      for (int k = 0; k < PROFILE_MAX_SHAPE && others; k++)
        if (k != d && e->shape[k] != shape[k])
          others = false;
      if (!others)
        continue;
      if (e->shape[d] < shape[d] && (!below || e->shape[d] > below->shape[d]))
        below = e;
      if (e->shape[d] > shape[d] && (!above || e->shape[d] < above->shape[d]))
        above = e;
    }
    if (below && above) {
      double x0 = (double)below->shape[d], x1 = (double)above->shape[d], x = (double)shape[d];
      return below->seconds + (above->seconds - below->seconds) * (x - x0) / (x1 - x0);
    }
    const struct profile_entry *near = below ? below : above;
    if (near && near->shape[d] > 0)
      return near->seconds * (double)shape[d] / (double)near->shape[d];
  }
  return -1;
}

static void op_pass_load(const struct model_op *op, enum ir_pass pass, double *flops,
                         double *bytes) {
  /* Backward kernels touch about what the forward touched: BI reads the output gradient and
   * the saved inputs and writes the input gradient; BW reads the same and writes the weight
   * gradient. So each moves bytes_fwd and B (= BI + BW) twice that. */
  switch (pass) {
  case IR_PASS_F:
    *flops = op->flops_fwd;
    *bytes = (double)op->bytes_fwd;
    break;
  case IR_PASS_BI:
    *flops = op->flops_bwd_input;
    *bytes = (double)op->bytes_fwd;
    break;
  case IR_PASS_BW:
    *flops = op->flops_bwd_weight;
    *bytes = (double)op->bytes_fwd;
    break;
  default:
    *flops = op->flops_bwd_input + op->flops_bwd_weight;
    *bytes = 2.0 * (double)op->bytes_fwd;
    break;
  }
}

struct profile_cost profile_compute_cost(const struct profile *p, const struct model *m,
                                         uint32_t segment, enum ir_pass pass,
                                         uint32_t shard_degree) {
  struct profile_cost c = {0};
  if (shard_degree == 0)
    shard_degree = 1;
  if (p->synthetic) {
    c.seconds = pass == IR_PASS_F    ? p->syn_f
                : pass == IR_PASS_BI ? p->syn_bi
                : pass == IR_PASS_BW ? p->syn_bw
                                     : p->syn_b;
    return c;
  }
  const struct model_segment *s = &m->segments[segment];
  double mem_time = 0;
  double peak = p->peak_flops[m->dtype] * p->compute_efficiency;
  double bw = p->memory_bandwidth * p->memory_efficiency;
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++) {
    const struct model_op *op = &m->ops[i];
    double t = table_lookup(p, op->kind, pass, op->shape);
    if (t < 0 && pass == IR_PASS_B) {
      double ti = table_lookup(p, op->kind, IR_PASS_BI, op->shape);
      double tw = table_lookup(p, op->kind, IR_PASS_BW, op->shape);
      if (ti >= 0 && tw >= 0)
        t = ti + tw;
    }
    double flops, bytes;
    op_pass_load(op, pass, &flops, &bytes);
    /* Experts sharded over an EP group that is also the data-parallel group (the only layout
     * the compiler accepts): each device holds 1/shard_degree of the expert weights, and the
     * all-to-all brings it as many routed tokens as its own micro-batch has (balanced routing),
     * so the FLOPs stay whole and only the weight traffic divides. */
    if (shard_degree > 1) {
      double pbytes = (double)op->param_bytes;
      if (pass == IR_PASS_B)
        pbytes *= 2.0; /* B streams the weights twice, as op_pass_load counts */
      if (pbytes > bytes)
        pbytes = bytes;
      bytes -= pbytes - pbytes / shard_degree;
    }
    if (t >= 0) {
      c.measured_ops++;
      /* measured times say nothing of their bound; take the roofline's verdict */
      if (bytes / bw > flops / peak)
        mem_time += t;
    } else {
      double tc = flops / peak, tm = bytes / bw;
      t = (tc > tm ? tc : tm) + p->kernel_overhead;
      if (tm > tc)
        mem_time += t;
      c.fallback_ops++;
    }
    c.seconds += t;
  }
  c.mem_fraction = c.seconds > 0 ? mem_time / c.seconds : 0;
  return c;
}

struct profile_cost profile_optimizer_cost(const struct profile *p, double params) {
  struct profile_cost c = {0};
  if (p->synthetic) {
    c.seconds = p->syn_optimizer;
    return c;
  }
  c.seconds = params * p->optimizer_bytes_per_param / (p->memory_bandwidth * p->memory_efficiency);
  if (params > 0)
    c.seconds += p->kernel_overhead;
  c.mem_fraction = 1;
  return c;
}

/* ---- network ------------------------------------------------------------------------------ */

struct profile_span profile_span_of(const struct profile *pr, const uint32_t *devices, uint32_t n) {
  struct profile_span s = {.p = n, .n_nodes = 0, .min_per_node = 0};
  if (n == 0)
    return s;
  uint32_t gpn = pr->gpus_per_node ? pr->gpus_per_node : 1;
  /* count members per node; device lists are small next to the cost of sorting them */
  uint32_t *nodes = g_new(uint32_t, n);
  for (uint32_t i = 0; i < n; i++)
    nodes[i] = devices[i] / gpn;
  for (uint32_t i = 1; i < n; i++) { /* insertion sort: lists are mostly ascending already */
    uint32_t v = nodes[i], j = i;
    while (j > 0 && nodes[j - 1] > v) {
      nodes[j] = nodes[j - 1];
      j--;
    }
    nodes[j] = v;
  }
  uint32_t run = 1;
  s.min_per_node = UINT32_MAX;
  for (uint32_t i = 1; i <= n; i++) {
    if (i < n && nodes[i] == nodes[i - 1]) {
      run++;
      continue;
    }
    s.n_nodes++;
    if (run < s.min_per_node)
      s.min_per_node = run;
    run = 1;
  }
  g_free(nodes);
  return s;
}

void profile_link(const struct profile *p, const struct profile_span *span, double *bandwidth,
                  double *latency) {
  double intra = p->intra_bandwidth * p->network_efficiency;
  if (span->n_nodes <= 1) {
    *bandwidth = intra;
    *latency = p->intra_latency;
    return;
  }
  /* Across nodes a ring is as fast as its slowest node boundary: the members on one node
   * share that node's NICs with the node's other GPUs, so they hold min_per_node /
   * gpus_per_node of its NIC bandwidth (all NICs when the group fills the node). */
  double nic = p->nic_bandwidth * p->network_efficiency * p->nics_per_node *
               (double)span->min_per_node / (double)(p->gpus_per_node ? p->gpus_per_node : 1);
  *bandwidth = nic < intra || intra <= 0 ? nic : intra;
  *latency = p->inter_latency;
}

struct profile_comm_cost profile_comm_cost(const struct profile *p, enum ir_node_kind kind,
                                           uint64_t bytes, const struct profile_span *span) {
  struct profile_comm_cost c = {0};
  if (p->synthetic) {
    c.latency = p->syn_comm;
    return c;
  }
  double n = (double)bytes, B, a;
  double pr = span->p;
  profile_link(p, span, &B, &a);
  c.inter_node = span->n_nodes > 1;
  if (B <= 0)
    B = 1;
  switch (kind) {
  case IR_NODE_SEND:
  case IR_NODE_RECV:
    c.latency = a;
    c.transfer = n / B;
    break;
  case IR_NODE_ALL_REDUCE: {
    if (span->p <= 1)
      break;
    /* ring: reduce-scatter then all-gather, each (p-1) steps of n/p bytes */
    double ring_l = 2 * (pr - 1) * a, ring_t = 2 * (pr - 1) / pr * n / B;
    /* double binary tree (NCCL): log2(p) hops up and down, pipelined, every byte crosses
     * each device's link twice */
    double tree_l = 2 * ceil(log2(pr)) * a, tree_t = 2 * n / B;
    bool tree = p->algo == PROFILE_ALGO_TREE ||
                (p->algo == PROFILE_ALGO_AUTO && tree_l + tree_t < ring_l + ring_t);
    c.latency = tree ? tree_l : ring_l;
    c.transfer = tree ? tree_t : ring_t;
    break;
  }
  case IR_NODE_REDUCE_SCATTER:
  case IR_NODE_ALL_GATHER:
  case IR_NODE_ALL_TO_ALL:
    /* ring reduce-scatter / all-gather; all-to-all as p-1 pairwise exchanges, each moving
     * n/p bytes, so the same alpha-beta form */
    if (span->p <= 1)
      break;
    c.latency = (pr - 1) * a;
    c.transfer = (pr - 1) / pr * n / B;
    break;
  default: break;
  }
  return c;
}
