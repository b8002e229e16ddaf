/* profile: loading hardware profiles and the cost formulas of the simulator (docs/sim.md, "The
 * simulation model"; docs/design.md, "The simulator's definitions"). */
#include "profile.h"

#include <math.h>

#include "cost.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"

/* ---- loading ------------------------------------------------------------------------------ */

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
  static const char *const keys[] = {"op", "pass", "shape", "ms", "host_ms", NULL};
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
      if (!json_value_int(d, "shape", 0, INT64_MAX / 2, &v, JSON_LOC(ctx), err))
        return false;
      en->shape[j++] = v;
    }
    double ms, host_ms = 0;
    if (!json_get_double(e, "ms", true, 0, 1e9, &ms, ctx, err) ||
        !json_get_double(e, "host_ms", false, 0, 1e9, &host_ms, ctx, err))
      return false;
    /* host_ms (a GPU profile): the host thread's time to enqueue the op. The GPU cannot run
     * what is not enqueued yet, and the executor's waits for values on the CPU (MoE routing,
     * the loss) keep the queue short, so an op whose enqueueing is slower than its kernels
     * takes the enqueue time (small models on a large GPU). */
    en->seconds = (ms > host_ms ? ms : host_ms) * 1e-3;
    en->device_seconds = ms * 1e-3;
    en->host_seconds = host_ms * 1e-3; /* a host thread's (profile.host_launch > 0) instead */
    i++;
  }
  p->n_entries = (uint32_t)i;
  qsort(p->entries, p->n_entries, sizeof *p->entries, entry_cmp);
  for (uint32_t k = 1; k < p->n_entries; k++)
    if (entry_cmp(&p->entries[k - 1], &p->entries[k]) == 0)
      return piper_input_error(err, "%s: measured: duplicate entry for op \"%s\" pass %s", name,
                               model_op_kind_name(p->entries[k].kind),
                               ir_pass_name(p->entries[k].pass));
  return true;
}

/* ---- the profile's keys, as data ----------------------------------------------------------
 * One row per numeric key of a section (in the style of redis's config table): its name, how
 * the field is stored, when it is required, its bounds in the file's unit, the factor to SI
 * units and the field it sets. An absent optional key leaves the field at its default. Keys are
 * read in table order, so the first bad key of a section is the one reported. */

enum profile_key_type {
  PROFILE_KEY_DOUBLE, /* double field = value * scale */
  PROFILE_KEY_BYTES,  /* uint64_t field = value * scale */
  PROFILE_KEY_U32,    /* uint32_t field = value, a whole number */
};
enum profile_key_need {
  PROFILE_KEY_OPTIONAL,
  PROFILE_KEY_REQUIRED,
  PROFILE_KEY_DEVICE, /* required in a device profile, optional in a synthetic one */
};
struct profile_key {
  const char *name;
  enum profile_key_type type;
  enum profile_key_need need;
  double lo, hi;
  double scale;
  size_t offset; /* of the field in struct profile */
};

#define KEY(name, type, need, lo, hi, scale, field)                                                \
  { name, PROFILE_KEY_##type, PROFILE_KEY_##need, lo, hi, scale, offsetof(struct profile, field) }

static const struct profile_key peak_keys[] = {
    KEY("bf16", DOUBLE, DEVICE, 1e-6, 1e6, 1e12, peak_flops[MODEL_DTYPE_BF16]),
    KEY("fp32", DOUBLE, DEVICE, 1e-6, 1e6, 1e12, peak_flops[MODEL_DTYPE_FP32]),
    KEY("fp8", DOUBLE, OPTIONAL, 1e-6, 1e6, 1e12, peak_flops[MODEL_DTYPE_FP8]),
};
static const struct profile_key device_keys[] = {
    KEY("memory_bandwidth_gbs", DOUBLE, DEVICE, 1e-3, 1e9, 1e9, memory_bandwidth),
    KEY("memory_capacity_gib", BYTES, DEVICE, 1e-6, 1e9, (double)(1ull << 30), memory_capacity),
    KEY("sm_count", U32, OPTIONAL, 1, 1 << 20, 1, sm_count),
    KEY("compute_efficiency", DOUBLE, OPTIONAL, 1e-3, 1, 1, compute_efficiency),
    KEY("memory_efficiency", DOUBLE, OPTIONAL, 1e-3, 1, 1, memory_efficiency),
    KEY("kernel_overhead_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, kernel_overhead),
    KEY("host_launch_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, host_launch),
    KEY("optimizer_bytes_per_param", DOUBLE, OPTIONAL, 0, 1e3, 1, optimizer_bytes_per_param),
    KEY("weight_copy_bytes_per_param", DOUBLE, OPTIONAL, 0, 1e3, 1, weight_copy_bytes_per_param),
    /* the shape model's (cost_model "shapes"; sim/cost.h) */
    KEY("gemm_efficiency", DOUBLE, OPTIONAL, 1e-3, 1, 1, gemm_efficiency),
    KEY("gemm_efficiency_fp8", DOUBLE, OPTIONAL, 1e-3, 1, 1, gemm_efficiency_fp8),
    KEY("gemm_tile_fill_k", DOUBLE, OPTIONAL, 0, 1e6, 1, gemm_tile_fill_k),
    KEY("attention_efficiency_fwd", DOUBLE, OPTIONAL, 1e-3, 1, 1, attention_efficiency[0]),
    KEY("attention_efficiency_bwd", DOUBLE, OPTIONAL, 1e-3, 1, 1, attention_efficiency[1]),
    KEY("attention_half_seq", DOUBLE, OPTIONAL, 0, 1e9, 1, attention_half_seq),
};
static const struct profile_key moe_keys[] = {
    KEY("routing_imbalance", DOUBLE, OPTIONAL, 1, 1e6, 1, routing_imbalance),
};
static const struct profile_key contention_keys[] = {
    KEY("comm_sm_share", DOUBLE, OPTIONAL, 0, 0.9, 1, comm_sm_share),
    KEY("comm_memory_share", DOUBLE, OPTIONAL, 0, 0.9, 1, comm_memory_share),
};
static const struct profile_key network_keys[] = {
    KEY("gpus_per_node", U32, DEVICE, 1, 1 << 16, 1, gpus_per_node),
    KEY("nics_per_node", U32, DEVICE, 1, 1 << 16, 1, nics_per_node),
    KEY("nvlink_bandwidth_gbs", DOUBLE, DEVICE, 1e-6, 1e9, 1e9, intra_bandwidth),
    KEY("nvlink_latency_us", DOUBLE, DEVICE, 0, 1e9, 1e-6, intra_latency),
    KEY("nic_bandwidth_gbs", DOUBLE, DEVICE, 1e-6, 1e9, 1e9, nic_bandwidth),
    KEY("inter_node_latency_us", DOUBLE, DEVICE, 0, 1e9, 1e-6, inter_latency),
    KEY("efficiency", DOUBLE, OPTIONAL, 1e-3, 1, 1, network_efficiency),
    /* the topology model's (collective_model "topology"; sim/cost.h) */
    KEY("nodes_per_leaf", U32, OPTIONAL, 0, 1 << 20, 1, nodes_per_leaf),
    KEY("spine_latency_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, spine_latency),
    KEY("spine_bandwidth_factor", DOUBLE, OPTIONAL, 1e-3, 1, 1, spine_bandwidth_factor),
    KEY("deepep_efficiency_intra", DOUBLE, OPTIONAL, 1e-3, 1, 1, deepep_efficiency_intra),
    KEY("deepep_efficiency_inter", DOUBLE, OPTIONAL, 1e-3, 1, 1, deepep_efficiency_inter),
};
static const struct profile_key synthetic_keys[] = {
    KEY("F_ms", DOUBLE, REQUIRED, 0, 1e9, 1e-3, syn_f),
    KEY("B_ms", DOUBLE, REQUIRED, 0, 1e9, 1e-3, syn_b),
    KEY("BI_ms", DOUBLE, REQUIRED, 0, 1e9, 1e-3, syn_bi),
    KEY("BW_ms", DOUBLE, REQUIRED, 0, 1e9, 1e-3, syn_bw),
    KEY("optimizer_ms", DOUBLE, OPTIONAL, 0, 1e9, 1e-3, syn_optimizer),
    KEY("comm_ms", DOUBLE, OPTIONAL, 0, 1e9, 1e-3, syn_comm),
    KEY("host_ms", DOUBLE, OPTIONAL, 0, 1e9, 1e-3, syn_host),
};
static const struct profile_key host_keys[] = {
    KEY("cores_per_node", U32, REQUIRED, 1, 1 << 20, 1, cores_per_node),
    KEY("instruction_overhead_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, instruction_overhead),
    KEY("wait_core_share", DOUBLE, OPTIONAL, 0, 1, 1, wait_core_share),
    KEY("comm_test_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, comm_test),
    KEY("wake_latency_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, wake_latency),
    KEY("loop_spin_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, loop_spin),
    KEY("loop_late_us", DOUBLE, OPTIONAL, 0, 1e6, 1e-6, loop_late),
    KEY("eager_bytes", DOUBLE, OPTIONAL, 0, 1e12, 1, eager_bytes),
};
/* bounds: bytes per element or parameter of any numeric type a backend could hold */
static const struct profile_key memory_keys[] = {
    KEY("activation_bytes_per_element", U32, OPTIONAL, 1, 16, 1, memory.activation_bytes),
    KEY("param_bytes_per_param", DOUBLE, OPTIONAL, 0, 64, 1, memory.param_bytes),
    KEY("grad_bytes_per_param", DOUBLE, OPTIONAL, 0, 64, 1, memory.grad_bytes),
    KEY("optimizer_state_bytes_per_param", DOUBLE, OPTIONAL, 0, 64, 1, memory.optimizer_bytes),
    KEY("compute_copy_bytes_per_param", DOUBLE, OPTIONAL, 0, 64, 1, memory.compute_copy_bytes),
};
#undef KEY
#define FIT_KEY(name, lo, hi, scale, field)                                                       \
  { name, PROFILE_KEY_DOUBLE, PROFILE_KEY_REQUIRED, lo, hi, scale, offsetof(struct profile_fit, field) }
static const struct profile_key fit_keys[] = {
    FIT_KEY("latency_us", 0, 1e9, 1e-6, latency),
    FIT_KEY("bandwidth_gbs", 1e-9, 1e9, 1e9, bandwidth),
};
#undef FIT_KEY

const char *const profile_collective_names[PROFILE_COLL_COUNT] = {
    "p2p", "all_reduce", "reduce_scatter", "all_gather", "all_to_all"};
const char *const profile_link_names[PROFILE_LINK_COUNT] = {"intra_node", "inter_node"};
const char *const profile_family_names[PROFILE_FAMILY_COUNT] = {"gemm", "attention",
                                                                "collectives", "memory"};

/* Sets the fields of rows[0 .. n) from obj. */
static bool read_keys_into(struct profile *p, void *base, const cJSON *obj,
                           const struct profile_key *rows, size_t n, const char *ctx,
                           GError **err) {
  for (size_t i = 0; i < n; i++) {
    const struct profile_key *k = &rows[i];
    bool required =
        k->need == PROFILE_KEY_REQUIRED || (k->need == PROFILE_KEY_DEVICE && !p->synthetic);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, k->name);
    if (!v && !required)
      continue; /* keeps the default */
    char *field = (char *)base + k->offset;
    double x;
    uint32_t u;
    switch (k->type) {
    case PROFILE_KEY_U32:
      if (!json_value_u32(v, k->name, (uint32_t)k->lo, (uint32_t)k->hi, &u, JSON_LOC(ctx), err))
        return false;
      *(uint32_t *)(void *)field = u;
      break;
    case PROFILE_KEY_BYTES:
      if (!json_value_double(v, k->name, k->lo, k->hi, &x, JSON_LOC(ctx), err))
        return false;
      *(uint64_t *)(void *)field = (uint64_t)(x * k->scale);
      break;
    case PROFILE_KEY_DOUBLE:
      if (!json_value_double(v, k->name, k->lo, k->hi, &x, JSON_LOC(ctx), err))
        return false;
      *(double *)(void *)field = k->scale == 1 ? x : x * k->scale;
      break;
    }
  }
  return true;
}

static bool read_keys(struct profile *p, const cJSON *obj, const struct profile_key *rows, size_t n,
                      const char *ctx, GError **err) {
  return read_keys_into(p, p, obj, rows, n, ctx, err);
}

/* json_check_keys with the allowed names taken from the table, plus extra (NULL or a
 * NULL-terminated list of names). */
static bool check_section_keys(const cJSON *obj, const struct profile_key *rows, size_t n,
                               const char *const *extra, const char *ctx, GError **err) {
  const char *allowed[32];
  size_t m = 0;
  for (size_t i = 0; i < n && m < G_N_ELEMENTS(allowed) - 4; i++)
    allowed[m++] = rows[i].name;
  for (size_t i = 0; extra && extra[i] && m < G_N_ELEMENTS(allowed) - 1; i++)
    allowed[m++] = extra[i];
  allowed[m] = NULL;
  return json_check_keys(obj, allowed, ctx, err);
}

/* A section: an object of numeric keys from its table. */
static bool read_section(struct profile *p, const cJSON *obj, const struct profile_key *rows,
                         size_t n, const char *ctx, GError **err) {
  return check_section_keys(obj, rows, n, NULL, ctx, err) && read_keys(p, obj, rows, n, ctx, err);
}

/* Top level: the known keys, the name (else the file's base name) and the kind. */
static bool read_identity(struct profile *p, const char *name, const cJSON *root, GError **err) {
  if (!cJSON_IsObject(root))
    return piper_input_error(err, "%s: a profile must be a JSON object", name);
  static const char *const top[] = {"name",     "kind",      "description", "sources",
                                    "device",   "network",   "contention",  "measured",
                                    "synthetic", "host",     "collectives", "memory",
                                    "moe",      NULL};
  if (!json_check_keys(root, top, name, err))
    return false;
  const char *s = NULL;
  if (!json_get_string(root, "name", false, &s, name, err))
    return false;
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
    return false;
  if (strcmp(kind, "synthetic") == 0)
    p->synthetic = true;
  else if (strcmp(kind, "device") != 0)
    return piper_input_error(err, "%s: key \"kind\": \"%s\" is not \"device\" or \"synthetic\"",
                             name, kind);
  return true;
}

static bool read_choice(const cJSON *obj, const char *key, const char *const *names, int *out,
                        const char *ctx, GError **err);

/* The device section: peak FLOP/s per dtype (an object), then the table's keys. */
static bool read_device(struct profile *p, const char *name, const cJSON *dev, GError **err) {
  char ctx[300];
  snprintf(ctx, sizeof ctx, "%s: device", name);
  const cJSON *pk;
  const char *extra[] = {"peak_tflops", "cost_model", "attention_kernel", NULL};
  static const char *const kernels[] = {"fused", "unfused", NULL};
  const char *model = NULL;
  int kernel = 0;
  if (!check_section_keys(dev, device_keys, G_N_ELEMENTS(device_keys), extra, ctx, err) ||
      !json_get_object(dev, "peak_tflops", false, &pk, ctx, err) ||
      !json_get_string(dev, "cost_model", false, &model, ctx, err) ||
      !read_choice(dev, "attention_kernel", kernels, &kernel, ctx, err))
    return false;
  p->attention_unfused = kernel == 1;
  if (model && strcmp(model, "shapes") != 0 && strcmp(model, "roofline") != 0)
    return piper_input_error(err, "%s: key \"cost_model\": \"%s\" is not roofline or shapes",
                             ctx, model);
  p->shape_model = model && strcmp(model, "shapes") == 0;
  if (!pk && !p->synthetic)
    return piper_input_error(err, "%s: key \"peak_tflops\" is required", ctx);
  if (pk) {
    char c2[320];
    snprintf(c2, sizeof c2, "%s.peak_tflops", ctx);
    if (!read_section(p, pk, peak_keys, G_N_ELEMENTS(peak_keys), c2, err))
      return false;
  }
  return read_keys(p, dev, device_keys, G_N_ELEMENTS(device_keys), ctx, err);
}

/* A string key of a section that takes one of names (NULL-terminated); *out its index, left
 * as it is when the key is absent. */
static bool read_choice(const cJSON *obj, const char *key, const char *const *names, int *out,
                        const char *ctx, GError **err) {
  const char *v = NULL;
  if (!json_get_string(obj, key, false, &v, ctx, err))
    return false;
  if (!v)
    return true;
  for (int i = 0; names[i]; i++)
    if (strcmp(v, names[i]) == 0) {
      *out = i;
      return true;
    }
  GString *list = g_string_new(NULL);
  for (int i = 0; names[i]; i++)
    g_string_append_printf(list, "%s%s", i ? (names[i + 1] ? ", " : " or ") : "", names[i]);
  piper_input_error(err, "%s: key \"%s\": \"%s\" is not %s", ctx, key, v, list->str);
  g_string_free(list, TRUE);
  return false;
}

/* The network section: the table's keys, the collective algorithm and models. */
static bool read_network(struct profile *p, const char *name, const cJSON *net, GError **err) {
  char ctx[300];
  snprintf(ctx, sizeof ctx, "%s: network", name);
  static const char *const extra[] = {"collective_algorithm", "collective_model", "all_to_all",
                                      NULL};
  if (!check_section_keys(net, network_keys, G_N_ELEMENTS(network_keys), extra, ctx, err) ||
      !read_keys(p, net, network_keys, G_N_ELEMENTS(network_keys), ctx, err))
    return false;
  static const char *const algos[] = {
      [PROFILE_ALGO_RING] = "ring", [PROFILE_ALGO_TREE] = "tree", [PROFILE_ALGO_AUTO] = "auto",
      NULL};
  static const char *const models[] = {"alpha_beta", "topology", NULL};
  static const char *const dispatchers[] = {"nccl", "deepep", NULL};
  int algo = (int)p->algo, model = 0, a2a = 0;
  if (!read_choice(net, "collective_algorithm", algos, &algo, ctx, err) ||
      !read_choice(net, "collective_model", models, &model, ctx, err) ||
      !read_choice(net, "all_to_all", dispatchers, &a2a, ctx, err))
    return false;
  p->algo = (enum profile_collective_algo)algo;
  p->topology_model = model == 1;
  p->deepep = a2a == 1;
  return true;
}

/* "collectives": {LINK: {OP: {latency_us, bandwidth_gbs}}}, every level optional. */
static bool read_collectives(struct profile *p, const char *name, const cJSON *col, GError **err) {
  char ctx[300];
  snprintf(ctx, sizeof ctx, "%s: collectives", name);
  const char *links[PROFILE_LINK_COUNT + 1] = {0};
  memcpy(links, profile_link_names, sizeof profile_link_names);
  if (!json_check_keys(col, links, ctx, err))
    return false;
  for (int l = 0; l < PROFILE_LINK_COUNT; l++) {
    const cJSON *lk;
    if (!json_get_object(col, profile_link_names[l], false, &lk, ctx, err))
      return false;
    if (!lk)
      continue;
    char c2[340];
    snprintf(c2, sizeof c2, "%s.%s", ctx, profile_link_names[l]);
    const char *ops[PROFILE_COLL_COUNT + 1] = {0};
    memcpy(ops, profile_collective_names, sizeof profile_collective_names);
    if (!json_check_keys(lk, ops, c2, err))
      return false;
    for (int k = 0; k < PROFILE_COLL_COUNT; k++) {
      const cJSON *op;
      if (!json_get_object(lk, profile_collective_names[k], false, &op, c2, err))
        return false;
      if (!op)
        continue;
      char c3[380];
      snprintf(c3, sizeof c3, "%s.%s", c2, profile_collective_names[k]);
      if (!json_check_keys(op, (const char *const[]){"latency_us", "bandwidth_gbs", NULL}, c3,
                           err) ||
          !read_keys_into(p, &p->fits[l][k], op, fit_keys, G_N_ELEMENTS(fit_keys), c3, err))
        return false;
    }
  }
  return true;
}

/* The host section: its numeric keys and which executor the profile measured ("executor":
 * "loop", the default, or "enqueue"). */
static bool read_host(struct profile *p, const cJSON *host, const char *ctx, GError **err) {
  const char *executor = "loop";
  if (!check_section_keys(host, host_keys, G_N_ELEMENTS(host_keys),
                          (const char *const[]){"executor", NULL}, ctx, err) ||
      !read_keys(p, host, host_keys, G_N_ELEMENTS(host_keys), ctx, err) ||
      !json_get_string(host, "executor", false, &executor, ctx, err))
    return false;
  if (strcmp(executor, "loop") != 0 && strcmp(executor, "enqueue") != 0)
    return piper_input_error(err, "%s: key \"executor\" must be \"loop\" or \"enqueue\", not \"%s\"",
                             ctx, executor);
  p->host_loop = strcmp(executor, "loop") == 0;
  return true;
}

/* The moe section: its numeric keys and how the expert GEMMs are launched. */
static bool read_moe(struct profile *p, const cJSON *moe, const char *ctx, GError **err) {
  static const char *const launches[] = {"grouped", "per_expert", NULL};
  static const char *const dispatchers[] = {"dropless_sync", "nosync", NULL};
  int launch = 0, dispatcher = p->moe_dispatch_sync ? 0 : 1;
  if (!check_section_keys(moe, moe_keys, G_N_ELEMENTS(moe_keys),
                          (const char *const[]){"expert_gemm_launches", "dispatcher", NULL}, ctx,
                          err) ||
      !read_keys(p, moe, moe_keys, G_N_ELEMENTS(moe_keys), ctx, err) ||
      !read_choice(moe, "expert_gemm_launches", launches, &launch, ctx, err) ||
      !read_choice(moe, "dispatcher", dispatchers, &dispatcher, ctx, err))
    return false;
  p->expert_gemm_per_expert = launch == 1;
  p->moe_dispatch_sync = dispatcher == 0;
  return true;
}

/* The optional sections of a measured machine: host facts, per-operation fits and how the
 * backend holds memory. */
static bool read_machine(struct profile *p, const char *name, const cJSON *root, GError **err) {
  const cJSON *host, *col, *mem, *moe;
  char ctx[300];
  if (!json_get_object(root, "moe", false, &moe, name, err) ||
      !json_get_object(root, "host", false, &host, name, err) ||
      !json_get_object(root, "collectives", false, &col, name, err) ||
      !json_get_object(root, "memory", false, &mem, name, err))
    return false;
  snprintf(ctx, sizeof ctx, "%s: host", name);
  if (host && !read_host(p, host, ctx, err))
    return false;
  snprintf(ctx, sizeof ctx, "%s: moe", name);
  if (moe && !read_moe(p, moe, ctx, err))
    return false;
  snprintf(ctx, sizeof ctx, "%s: memory", name);
  if (mem && !read_section(p, mem, memory_keys, G_N_ELEMENTS(memory_keys), ctx, err))
    return false;
  return !col || read_collectives(p, name, col, err);
}

/* The sections by kind: a device profile needs device and network, a synthetic one synthetic;
 * contention and measured are optional. */
static bool read_sections(struct profile *p, const char *name, const cJSON *root, GError **err) {
  const cJSON *dev, *net, *con, *syn;
  char ctx[300];
  if (!json_get_object(root, "device", false, &dev, name, err) ||
      !json_get_object(root, "network", false, &net, name, err) ||
      !json_get_object(root, "contention", false, &con, name, err) ||
      !json_get_object(root, "synthetic", false, &syn, name, err))
    return false;
  if (!p->synthetic && !dev)
    return piper_input_error(err, "%s: key \"device\" is required for a device profile", name);
  if (p->synthetic && !syn)
    return piper_input_error(err, "%s: key \"synthetic\" is required for a synthetic profile",
                             name);
  if (dev && !read_device(p, name, dev, err))
    return false;
  snprintf(ctx, sizeof ctx, "%s: contention", name);
  if (con && !read_section(p, con, contention_keys, G_N_ELEMENTS(contention_keys), ctx, err))
    return false;
  if (net && !read_network(p, name, net, err))
    return false;
  if (!net && !p->synthetic)
    return piper_input_error(err, "%s: key \"network\" is required for a device profile", name);
  snprintf(ctx, sizeof ctx, "%s: synthetic", name);
  if (syn && !read_section(p, syn, synthetic_keys, G_N_ELEMENTS(synthetic_keys), ctx, err))
    return false;
  const cJSON *meas = cJSON_GetObjectItemCaseSensitive(root, "measured");
  return !meas || parse_measured(p, meas, name, err);
}

struct profile *profile_parse_json(const char *name, const cJSON *root, GError **err) {
  struct profile *p = g_new0(struct profile, 1);
  p->path = g_strdup(name);
  /* defaults: a profile states what it knows; the rest takes neutral values */
  p->compute_efficiency = 1;
  p->memory_efficiency = 1;
  p->network_efficiency = 1;
  p->gemm_efficiency = 1;
  p->spine_bandwidth_factor = 1;
  p->deepep_efficiency_intra = p->deepep_efficiency_inter = 1;
  p->attention_efficiency[0] = p->attention_efficiency[1] = 1;
  for (int f = 0; f < PROFILE_FAMILY_COUNT; f++)
    p->family_scale[f] = 1;
  p->optimizer_bytes_per_param = 28; /* AdamW: read p32,g,m,v (4+4+4+4); write p32,m,v (12) */
  p->gpus_per_node = 8;
  p->nics_per_node = 8;
  p->algo = PROFILE_ALGO_RING;
  p->moe_dispatch_sync = true; /* Megatron's dropless alltoall dispatcher */
  /* the plan's own memory rule (struct profile_memory) unless the profile says otherwise */
  p->memory = (struct profile_memory){0, -1, -1, -1, 0};
  if (!read_identity(p, name, root, err) || !read_sections(p, name, root, err) ||
      !read_machine(p, name, root, err)) {
    profile_free(p);
    return NULL;
  }
  return p;
}

struct profile *profile_load_file(const char *path, GError **err) {
  cJSON *root = json_parse_file_strict(path, err);
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

uint32_t profile_activation_bytes(const struct profile *p, enum model_dtype dtype) {
  return p && p->memory.activation_bytes ? p->memory.activation_bytes
                                         : (uint32_t)model_dtype_bytes(dtype);
}

/* ---- compute costs ------------------------------------------------------------------------ */

/* Measured time of (kind, pass, shape): an exact entry; else interpolation along the one shape
 * dimension in which bracketing entries differ from the query (all other dimensions equal),
 * linear in that dimension; outside the measured range the nearest entry is scaled in
 * proportion to the dimension (kernel time grows about linearly in tokens, width or experts).
 * Returns a negative value when nothing applies. */
/* Which time of an entry a lookup reads (struct profile_entry). */
enum entry_time { ENTRY_LONGER, ENTRY_DEVICE, ENTRY_HOST };

static double entry_time(const struct profile_entry *e, enum entry_time which) {
  return which == ENTRY_DEVICE ? e->device_seconds
         : which == ENTRY_HOST ? e->host_seconds
                               : e->seconds;
}

static double table_lookup(const struct profile *p, enum model_op_kind kind, enum ir_pass pass,
                           const int64_t *shape, enum entry_time which) {
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
      return entry_time(&p->entries[i], which);
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
      double y0 = entry_time(below, which), y1 = entry_time(above, which);
      return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    }
    /* never from or to 0 (a dimension the query or the entry does not have: an expert op's
     * one-device entry against its expert-parallel ones) */
    const struct profile_entry *near = below ? below : above;
    if (near && near->shape[d] > 0 && shape[d] > 0)
      return entry_time(near, which) * (double)shape[d] / (double)near->shape[d];
  }
  return -1;
}

/* table_lookup, and B as BI + BW where only those were measured. */
static double measured_time(const struct profile *p, enum model_op_kind kind, enum ir_pass pass,
                            const int64_t *shape, enum entry_time which) {
  double t = table_lookup(p, kind, pass, shape, which);
  if (t < 0 && pass == IR_PASS_B) {
    double ti = table_lookup(p, kind, IR_PASS_BI, shape, which);
    double tw = table_lookup(p, kind, IR_PASS_BW, shape, which);
    if (ti >= 0 && tw >= 0)
      t = ti + tw;
  }
  return t;
}

/* The experts of an expert op on one device of a degree-way group, where the profile measured
 * that degree (PROFILE_EP_DIM; the other dimensions may be interpolated); else negative, and
 * the op is costed as measured on one device. */
static double ep_experts_time(const struct profile *p, enum ir_pass pass, const int64_t *shape,
                              uint32_t degree, enum entry_time which) {
  int64_t q[PROFILE_MAX_SHAPE];
  memcpy(q, shape, sizeof q);
  q[PROFILE_EP_DIM] = degree;
  bool measured = false;
  for (uint32_t i = 0; i < p->n_entries && !measured; i++)
    measured = p->entries[i].kind == MODEL_OP_EXPERT_FFN &&
               p->entries[i].shape[PROFILE_EP_DIM] == (int64_t)degree;
  return measured ? measured_time(p, MODEL_OP_EXPERT_FFN, pass, q, which) : -1;
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
  return profile_compute_cost_tp(p, m, segment, pass, shard_degree, 0, false);
}

/* The family a roofline or measured op's time counts in: the attention ops' in attention, a
 * compute-bound op's in GEMMs, the rest (memory-bound) in memory. */
static enum profile_family roofline_family(enum model_op_kind kind, bool memory_bound) {
  if (kind == MODEL_OP_ATTENTION || kind == MODEL_OP_MLA_ATTENTION)
    return PROFILE_FAMILY_ATTENTION;
  return memory_bound ? PROFILE_FAMILY_MEMORY : PROFILE_FAMILY_GEMM;
}

/* One op of a node on this device: adds its time to c (scaled by family) and its memory-bound
 * part to *mem_time. */
static void op_cost(const struct profile *p, const struct model *m, const struct model_op *op,
                    enum ir_pass pass, uint32_t shard_degree, uint32_t tp_degree,
                    bool sequence_parallel, struct profile_cost *c, double *mem_time) {
  /* an FP8 recipe's GEMMs run at the FP8 peak; measured tables hold bf16 kernels' times, so an
   * FP8 model's ops are costed from their shapes */
  double peak = p->peak_flops[model_gemm_dtype(m)] * p->compute_efficiency;
  double bw = p->memory_bandwidth * p->memory_efficiency;
  double t = -1;
  /* with a host thread a measured host_ms is the host's, and the op costs its device time */
  enum entry_time which = p->host_launch > 0 ? ENTRY_DEVICE : ENTRY_LONGER;
  if (op->kind == MODEL_OP_EXPERT_FFN && shard_degree > 1 && m->fp8 == MODEL_FP8_NONE)
    t = ep_experts_time(p, pass, op->shape, shard_degree, which);
  if (t < 0 && m->fp8 == MODEL_FP8_NONE)
    t = measured_time(p, op->kind, pass, op->shape, which);
  double host = -1;
  if (t >= 0 && p->host_launch > 0) {
    if (op->kind == MODEL_OP_EXPERT_FFN && shard_degree > 1)
      host = ep_experts_time(p, pass, op->shape, shard_degree, ENTRY_HOST);
    if (host < 0)
      host = measured_time(p, op->kind, pass, op->shape, ENTRY_HOST);
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
  /* tensor parallelism: this device's slice of the op (ir_tp_op_share); a measured time
   * is of the whole op */
  double share = ir_tp_op_share(op, tp_degree, sequence_parallel);
  flops *= share;
  bytes *= share;
  double family[PROFILE_FAMILY_COUNT] = {0}, mem = 0;
  if (t >= 0) {
    t *= share;
    c->measured_ops++;
    /* measured times say nothing of their bound; take the roofline's verdict */
    bool bound = bytes / bw > flops / peak;
    family[roofline_family(op->kind, bound)] = t;
    mem = bound ? t : 0;
  } else if (!p->shape_model || !cost_model_op(p, m, op, pass, tp_degree, shard_degree, share,
                                               bytes, family, &mem)) {
    double tc = flops / peak, tm = bytes / bw;
    t = (tc > tm ? tc : tm) + p->kernel_overhead;
    family[roofline_family(op->kind, tm > tc)] = t;
    mem = tm > tc ? t : 0;
    c->fallback_ops++;
  } else {
    c->fallback_ops++;
  }
  double total = 0, unscaled = 0;
  for (int f = 0; f < PROFILE_FAMILY_COUNT; f++) {
    total += family[f] * p->family_scale[f];
    unscaled += family[f];
  }
  c->seconds += total;
  *mem_time += unscaled > 0 ? mem * total / unscaled : 0;
  /* the host's time: measured (piper-prof --backend cuda) where the entry has it, else the
   * op's launches */
  if (p->host_launch > 0)
    c->host_seconds +=
        host > 0 ? host : cost_op_launches(p, m, op, pass, shard_degree) * p->host_launch;
}

struct profile_cost profile_compute_cost_tp(const struct profile *p, const struct model *m,
                                            uint32_t segment, enum ir_pass pass,
                                            uint32_t shard_degree, uint32_t tp_degree,
                                            bool sequence_parallel) {
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
  for (uint32_t i = s->op_first; i < s->op_first + s->op_count; i++)
    op_cost(p, m, &m->ops[i], pass, shard_degree, tp_degree, sequence_parallel, &c, &mem_time);
  c.mem_fraction = c.seconds > 0 ? mem_time / c.seconds : 0;
  return c;
}

struct profile_cost profile_op_cost(const struct profile *p, const struct model *m, uint32_t op,
                                    enum ir_pass pass, uint32_t shard_degree, uint32_t tp_degree,
                                    bool sequence_parallel) {
  struct profile_cost c = {0};
  double mem_time = 0;
  op_cost(p, m, &m->ops[op], pass, shard_degree ? shard_degree : 1, tp_degree, sequence_parallel,
          &c, &mem_time);
  c.mem_fraction = c.seconds > 0 ? mem_time / c.seconds : 0;
  return c;
}

struct profile_cost profile_optimizer_cost(const struct profile *p, double params,
                                          double copied) {
  struct profile_cost c = {0};
  if (p->synthetic) {
    c.seconds = p->syn_optimizer;
    return c;
  }
  double bytes = params * p->optimizer_bytes_per_param + copied * p->weight_copy_bytes_per_param;
  c.seconds = bytes / (p->memory_bandwidth * p->memory_efficiency);
  if (params > 0)
    c.seconds += p->kernel_overhead;
  c.seconds *= p->family_scale[PROFILE_FAMILY_MEMORY];
  c.mem_fraction = 1;
  return c;
}

/* ---- network ------------------------------------------------------------------------------ */

static bool kind_is_comm_op(enum ir_node_kind k) {
  return profile_collective_of(k) != PROFILE_COLL_COUNT;
}

struct profile_span profile_span_of(const struct profile *pr, const uint32_t *devices, uint32_t n) {
  struct profile_span s = {.p = n, .n_nodes = 0, .min_per_node = 0};
  if (n == 0)
    return s;
  uint32_t gpn = pr->gpus_per_node ? pr->gpus_per_node : 1;
  if (n == 2) { /* a point-to-point pair (one a pair with --no-collapse): no allocation */
    bool same = devices[0] / gpn == devices[1] / gpn;
    s.n_nodes = same ? 1 : 2;
    s.min_per_node = same ? 2 : 1;
    return s;
  }
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

/* One link and latency for the span (profile_link), or the operation's measured fit, under
 * the ring (or tree) formulas. */
static struct profile_comm_cost alpha_beta_cost(const struct profile *p, enum ir_node_kind kind,
                                                uint64_t bytes, const struct profile_span *span) {
  struct profile_comm_cost c = {0};
  double n = (double)bytes, B, a;
  double pr = span->p;
  profile_link(p, span, &B, &a);
  c.inter_node = span->n_nodes > 1;
  enum profile_collective op = profile_collective_of(kind);
  const struct profile_fit *fit =
      op < PROFILE_COLL_COUNT ? &p->fits[c.inter_node ? PROFILE_LINK_INTER : PROFILE_LINK_INTRA][op]
                              : NULL;
  bool fitted = fit && fit->bandwidth > 0;
  if (fitted) /* measured for this operation: its own terms, under the ring formulas below */
    a = fit->latency, B = fit->bandwidth;
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
    bool tree = !fitted && (p->algo == PROFILE_ALGO_TREE ||
                            (p->algo == PROFILE_ALGO_AUTO && tree_l + tree_t < ring_l + ring_t));
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

/* Whether a collective takes the topology model: the profile asks for it and has no measured
 * fit of the operation on that kind of link. */
static bool topology_costed(const struct profile *p, enum ir_node_kind kind,
                            const struct profile_span *span) {
  enum profile_collective op = profile_collective_of(kind);
  if (!p->topology_model || op == PROFILE_COLL_COUNT)
    return false;
  return p->fits[span->n_nodes > 1 ? PROFILE_LINK_INTER : PROFILE_LINK_INTRA][op].bandwidth <= 0;
}

struct profile_comm_cost profile_comm_cost(const struct profile *p, enum ir_node_kind kind,
                                           uint64_t bytes, const struct profile_span *span) {
  if (p->synthetic)
    return (struct profile_comm_cost){.latency = p->syn_comm};
  struct profile_comm_cost c = topology_costed(p, kind, span)
                                   ? cost_collective(p, kind, bytes, span)
                                   : alpha_beta_cost(p, kind, bytes, span);
  c.latency *= p->family_scale[PROFILE_FAMILY_COMM];
  c.transfer *= p->family_scale[PROFILE_FAMILY_COMM];
  /* the executor sees an operation end at a test of it */
  if (kind_is_comm_op(kind) && (span->p > 1 || kind == IR_NODE_SEND || kind == IR_NODE_RECV))
    c.latency += p->comm_test;
  return c;
}

enum profile_collective profile_collective_of(enum ir_node_kind kind) {
  switch (kind) {
  case IR_NODE_SEND:
  case IR_NODE_RECV: return PROFILE_COLL_P2P;
  case IR_NODE_ALL_REDUCE: return PROFILE_COLL_ALL_REDUCE;
  case IR_NODE_REDUCE_SCATTER: return PROFILE_COLL_REDUCE_SCATTER;
  case IR_NODE_ALL_GATHER: return PROFILE_COLL_ALL_GATHER;
  case IR_NODE_ALL_TO_ALL: return PROFILE_COLL_ALL_TO_ALL;
  default: return PROFILE_COLL_COUNT;
  }
}

/* ---- ranks sharing a node's cores --------------------------------------------------------- */

/* Processor sharing as the kernel's scheduler does it: a computing rank asks for a whole core,
 * a polling one for wait_core_share of one; when the node's cores cannot meet the demand, each
 * gets its demand scaled down alike. */
double profile_node_speed(const struct profile *p, double running, double waiting) {
  if (p->cores_per_node == 0 || running <= 0)
    return 1;
  double demand = running + waiting * p->wait_core_share;
  double cores = (double)p->cores_per_node;
  return demand <= cores ? 1 : cores / demand;
}
