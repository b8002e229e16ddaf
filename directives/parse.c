/* directives: reading, validating, building and writing directive programs
 * (docs/design.md, "The directive phase order").
 * Applying a program to the IR lives in apply.c. Every input error is one line of the shape
 * "<file>: directive <index> (<op>): <what>", naming the key at fault. */
#include "directives.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/json.h"

/* Program-wide cap on the filters of all order directives together. A struct dir_filter is about
 * 600 bytes while "{}," is 3 bytes of JSON, so without a cap a small file could ask for a huge
 * allocation; real schedules (thousands of ranks x micro-batches) stay well under it. */
#define DIR_MAX_ORDER_FILTERS 1000000
/* Filter indices, priorities: large enough for any real use, small enough to stay exact. */
#define DIR_MAX_INDEX (1 << 30)
#define DIR_MAX_PRIORITY (1 << 30)
#define DIR_MAX_BUCKET_MB 1e6
/* How much of an offending string goes into a message. */
#define QUOTE_MAX 40

static const char *const op_names[] = {"place",     "replicate", "shard",
                                       "split",     "order",     "stream",
                                       "tensor_parallel", "recompute", "context_parallel"};
static const char *const pass_names[] = {"F", "B", "BI", "BW"};

const char *dir_op_name(enum dir_op op) {
  return (unsigned)op < G_N_ELEMENTS(op_names) ? op_names[op] : "?";
}

/* s made safe for a one-line message: quoted, escaped, cut after QUOTE_MAX bytes. */
static char *quote(const char *s) {
  return piper_quote(s, strlen(s), QUOTE_MAX);
}

/* Counts the elements of a JSON array, stopping once past cap: a list with millions of
 * entries is refused without walking it all (cJSON_GetArraySize walks everything). */
static size_t count_upto(const cJSON *arr, size_t cap) {
  size_t n = 0;
  for (const cJSON *it = arr->child; it && n <= cap; it = it->next)
    n++;
  return n;
}

/* Like json_check_keys, but also refuses duplicate keys (cJSON keeps them and lookups see only
 * the first, so a second "devices" would be silently ignored) and lists what is allowed. */
static bool check_keys(const cJSON *obj, const char *const *allowed, const char *ctx,
                       GError **err) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    const char *k = it->string ? it->string : "";
    bool ok = false;
    for (const char *const *a = allowed; *a; a++)
      if (strcmp(k, *a) == 0)
        ok = true;
    if (!ok) {
      g_autofree char *q = quote(k);
      GString *list = g_string_new(NULL);
      for (const char *const *a = allowed; *a; a++)
        g_string_append_printf(list, "%s%s", a == allowed ? "" : ", ", *a);
      piper_input_error(err, "%s: unknown key %s (allowed: %s)", ctx, q, list->str);
      g_string_free(list, TRUE);
      return false;
    }
    /* Every key before it is allowed, so this scan is short. */
    for (const cJSON *prev = obj->child; prev != it; prev = prev->next)
      if (strcmp(prev->string ? prev->string : "", k) == 0)
        return piper_input_error(err, "%s: duplicate key \"%s\"", ctx, k);
  }
  return true;
}

/* Names (streams, dim_name, filter keys) are printable ASCII without spaces, 1 .. DIR_NAME_MAX-1
 * bytes: they appear in node names like "F PP=0 MB=3" and in plan files. what names the value in
 * the message, e.g. "\"stream\"". */
static bool check_name(const char *s, char out[DIR_NAME_MAX], const char *ctx, const char *what,
                       GError **err) {
  size_t len = strlen(s);
  if (len == 0)
    return piper_input_error(err, "%s: %s must not be empty", ctx, what);
  if (len >= DIR_NAME_MAX)
    return piper_input_error(err, "%s: %s is %zu bytes long, at most %d", ctx, what, len,
                             DIR_NAME_MAX - 1);
  for (size_t i = 0; i < len; i++)
    if (!g_ascii_isgraph(s[i]))
      return piper_input_error(err, "%s: %s must be printable ASCII without spaces", ctx, what);
  memcpy(out, s, len + 1);
  return true;
}

/* A name under key (see check_name). */
static bool get_name(const cJSON *obj, const char *key, bool required, char out[DIR_NAME_MAX],
                     const char *ctx, GError **err) {
  const char *s = NULL;
  if (!json_get_string(obj, key, required, &s, ctx, err))
    return false;
  if (!s)
    return true;
  g_autofree char *q = quote(s);
  g_autofree char *what = g_strdup_printf("\"%s\" = %s", key, q);
  return check_name(s, out, ctx, what, err);
}

/* where says which filter, e.g. "\"filter\"" or "\"filters\" group 1 filter 0". */
static bool parse_filter(const cJSON *v, struct dir_filter *f, const char *ctx, const char *where,
                         GError **err) {
  memset(f, 0, sizeof *f);
  f->pass = IR_PASS_NONE;
  if (!cJSON_IsObject(v))
    return piper_input_error(err, "%s: %s must be an object such as {\"PP\": 0, \"PASS\": \"F\"}",
                             ctx, where);
  bool have_pass = false;
  for (const cJSON *it = v->child; it; it = it->next) {
    const char *k = it->string ? it->string : "";
    g_autofree char *q = quote(k);
    if (strcmp(k, "PASS") == 0) {
      if (have_pass)
        return piper_input_error(err, "%s: %s: duplicate key \"PASS\"", ctx, where);
      have_pass = true;
      int p = -1;
      if (cJSON_IsString(it) && it->valuestring)
        for (int i = 0; i < (int)G_N_ELEMENTS(pass_names); i++)
          if (strcmp(it->valuestring, pass_names[i]) == 0)
            p = i;
      if (p < 0)
        return piper_input_error(err, "%s: %s: \"PASS\" must be one of F, B, BI, BW", ctx, where);
      f->pass = (enum ir_pass)p;
      continue;
    }
    if (f->n_keys == DIR_MAX_FILTER_KEYS)
      return piper_input_error(err, "%s: %s: more than %d keys besides PASS", ctx, where,
                               DIR_MAX_FILTER_KEYS);
    struct dir_filter_key *key = &f->keys[f->n_keys];
    g_autofree char *what = g_strdup_printf("%s: key %s", where, q);
    if (!check_name(k, key->name, ctx, what, err))
      return false;
    for (uint32_t i = 0; i < f->n_keys; i++)
      if (strcmp(f->keys[i].name, key->name) == 0)
        return piper_input_error(err, "%s: %s: duplicate key %s", ctx, where, q);
    if (cJSON_IsString(it) && it->valuestring && strcmp(it->valuestring, "*") == 0) {
      key->value = IR_FILTER_ANY;
    } else if (cJSON_IsNumber(it) && isfinite(it->valuedouble) &&
               it->valuedouble == floor(it->valuedouble)) {
      if (it->valuedouble < 0 || it->valuedouble > DIR_MAX_INDEX) {
        char num[32];
        json_format_number(it->valuedouble, num);
        return piper_input_error(err, "%s: %s: %s = %s is out of range [0, %d] (or \"*\" for any)",
                                 ctx, where, q, num, DIR_MAX_INDEX);
      }
      key->value = (int32_t)it->valuedouble;
    } else {
      return piper_input_error(err, "%s: %s: %s must be an integer index >= 0 or \"*\"", ctx, where,
                               q);
    }
    f->n_keys++;
  }
  return true;
}

/* A non-empty list of distinct ids in [0, IR_MAX_DEVICES). The length is checked before
 * anything is allocated: a list longer than IR_MAX_DEVICES must repeat an id or hold one out of
 * range anyway. */
static bool parse_devices(const cJSON *obj, struct dir_directive *d, uint32_t *max_device,
                          const char *ctx, GError **err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "devices");
  if (!v)
    return piper_input_error(err, "%s: missing key \"devices\"", ctx);
  if (!cJSON_IsArray(v) || !v->child)
    return piper_input_error(err, "%s: \"devices\" must be a non-empty list of device ids", ctx);
  size_t n = count_upto(v, IR_MAX_DEVICES);
  if (n > IR_MAX_DEVICES)
    return piper_input_error(
        err, "%s: \"devices\" has more than %d entries (ids are distinct and below %d)", ctx,
        IR_MAX_DEVICES, IR_MAX_DEVICES);
  d->devices = g_new(uint32_t, n);
  d->n_devices = (uint32_t)n;
  uint8_t seen[IR_MAX_DEVICES / 8] = {0};
  size_t i = 0;
  for (const cJSON *it = v->child; it; it = it->next, i++) {
    char what[32];
    snprintf(what, sizeof what, "devices[%zu]", i);
    int64_t id;
    if (!json_value_int(it, what, 0, IR_MAX_DEVICES - 1, &id, JSON_LOC(ctx), err))
      return false;
    if (seen[id / 8] & (1u << (id % 8)))
      return piper_input_error(err, "%s: \"devices\" names device %lld twice", ctx, (long long)id);
    seen[id / 8] |= (uint8_t)(1u << (id % 8));
    d->devices[i] = (uint32_t)id;
    if ((uint32_t)id + 1 > *max_device)
      *max_device = (uint32_t)id + 1;
  }
  return true;
}

static bool parse_order(const cJSON *obj, struct dir_directive *d, size_t *n_order_filters,
                        const char *ctx, GError **err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "filters");
  if (!v)
    return piper_input_error(err, "%s: missing key \"filters\"", ctx);
  const char *shape = "a list of at least 2 groups, each a non-empty list of filters";
  if (!cJSON_IsArray(v))
    return piper_input_error(err, "%s: \"filters\" must be %s", ctx, shape);
  size_t n_groups = count_upto(v, DIR_MAX_ORDER_FILTERS);
  if (n_groups < 2)
    return piper_input_error(err, "%s: \"filters\" has %zu group%s; it must be %s", ctx, n_groups,
                             n_groups == 1 ? "" : "s", shape);
  /* Count first, allocate after: the total is capped over the whole program. */
  size_t total = 0, g = 0;
  for (const cJSON *grp = v->child; grp; grp = grp->next, g++) {
    size_t k;
    if (cJSON_IsObject(grp)) {
      k = 1; /* a bare filter is a one-filter group */
    } else if (cJSON_IsArray(grp)) {
      k = count_upto(grp, DIR_MAX_ORDER_FILTERS);
      if (k == 0)
        return piper_input_error(
            err,
            "%s: \"filters\" group %zu is empty (a group is a non-empty list of "
            "filters)",
            ctx, g);
    } else {
      return piper_input_error(
          err, "%s: \"filters\" group %zu must be a list of filters or a filter", ctx, g);
    }
    total += k;
    if (*n_order_filters + total > DIR_MAX_ORDER_FILTERS)
      return piper_input_error(err,
                               "%s: \"filters\": the program's order directives hold more than %d "
                               "filters",
                               ctx, DIR_MAX_ORDER_FILTERS);
  }
  *n_order_filters += total;
  d->n_slots = (uint32_t)n_groups;
  d->slot_first = g_new(uint32_t, n_groups + 1);
  d->filters = g_new0(struct dir_filter, total);
  uint32_t at = 0;
  g = 0;
  for (const cJSON *grp = v->child; grp; grp = grp->next, g++) {
    d->slot_first[g] = at;
    const cJSON *first = cJSON_IsObject(grp) ? grp : grp->child;
    size_t j = 0;
    for (const cJSON *f = first; f; f = cJSON_IsObject(grp) ? NULL : f->next, j++) {
      char where[64];
      snprintf(where, sizeof where, "\"filters\" group %zu filter %zu", g, j);
      if (!parse_filter(f, &d->filters[at], ctx, where, err))
        return false;
      at++;
    }
  }
  d->slot_first[g] = at;
  return true;
}

static void directive_clear(struct dir_directive *d) {
  g_free(d->devices);
  g_free(d->slot_first);
  g_free(d->filters);
  d->devices = NULL;
  d->slot_first = NULL;
  d->filters = NULL;
}

/* {"op": "tensor_parallel", "filter": F, "degree": t, "sequence_parallel": b} */
static bool parse_tensor_parallel(const cJSON *obj, struct dir_directive *d, const char *ctx,
                                  GError **err) {
  static const char *const keys[] = {"op", "filter", "degree", "sequence_parallel", NULL};
  if (!check_keys(obj, keys, ctx, err))
    return false;
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, "filter");
  if (!f)
    return piper_input_error(err, "%s: missing key \"filter\"", ctx);
  return parse_filter(f, &d->filter, ctx, "\"filter\"", err) &&
         json_get_u32(obj, "degree", true, 1, DIR_MAX_TP_DEGREE, &d->tp_degree, ctx, err) &&
         json_get_bool(obj, "sequence_parallel", false, &d->sequence_parallel, ctx, err);
}

/* The keys each op takes (op_names order). */
static const char *const *const op_keys[] = {
    (const char *const[]){"op", "filter", "devices", "stream", NULL},
    (const char *const[]){"op", "filter", "devices", "reduce_stream", "gather_stream",
                          "bucket_size", "shard_grads", "shard_params", "shard_optimizer", NULL},
    (const char *const[]){"op", "filter", "devices", "stream", "capacity_factor",
                          "fp8_expert_inputs", "degree", "expert_tensor_parallel", NULL},
    (const char *const[]){"op", "filter", "dim_name", "num_microbatches", NULL},
    (const char *const[]){"op", "filters", NULL},
    (const char *const[]){"op", "name", "priority", "sm_share", NULL},
    (const char *const[]){"op", "filter", "degree", "sequence_parallel", NULL},
    (const char *const[]){"op", "filter", "granularity", "method", "num_layers", "modules", NULL},
    (const char *const[]){"op", "degree", "comm", NULL},
};

/* {"op": "context_parallel", "degree": c, "comm": "p2p" | "all_gather"}: the whole model (a
 * sequence is split once, for every layer, as Megatron's --context-parallel-size does). */
static bool parse_context_parallel(const cJSON *obj, struct dir_directive *d, const char *ctx,
                                   GError **err) {
  const char *comm = NULL;
  if (!json_get_u32(obj, "degree", true, 1, MODEL_MAX_CONTEXT_PARALLEL, &d->cp_degree, ctx, err) ||
      !json_get_string(obj, "comm", false, &comm, ctx, err))
    return false;
  d->cp_comm = IR_CP_P2P;
  if (comm && strcmp(comm, "all_gather") == 0)
    d->cp_comm = IR_CP_ALL_GATHER;
  else if (comm && strcmp(comm, "p2p") != 0) {
    g_autofree char *q = quote(comm);
    return piper_input_error(err, "%s: \"comm\" = %s must be \"p2p\" (a ring of K/V exchanges "
                                  "overlapped with attention) or \"all_gather\"", ctx, q);
  }
  return true;
}

uint32_t dir_program_context_parallel(const struct dir_program *p) {
  for (uint32_t d = 0; p && d < p->n; d++)
    if (p->d[d].op == DIR_CONTEXT_PARALLEL)
      return p->d[d].cp_degree;
  return 1;
}

static bool parse_stream(const cJSON *obj, struct dir_directive *d, const char *ctx,
                         GError **err) {
  d->sm_share = 1.0;
  if (!get_name(obj, "name", true, d->name, ctx, err) ||
      !json_get_int(obj, "priority", false, -DIR_MAX_PRIORITY, DIR_MAX_PRIORITY, &d->priority,
                    ctx, err) ||
      !json_get_positive(obj, "sm_share", false, 1.0, &d->sm_share, ctx, err))
    return false;
  if (d->sm_share < DIR_MIN_SM_SHARE) /* a share no GPU can grant: almost surely a typo */
    return piper_input_error(err, "%s: \"sm_share\" = %g is below %g (one SM in a thousand)", ctx,
                             d->sm_share, DIR_MIN_SM_SHARE);
  return true;
}

static bool parse_replicate(const cJSON *obj, struct dir_directive *d, uint32_t *max_device,
                            const char *ctx, GError **err) {
  d->bucket_size_mb = DIR_DEFAULT_BUCKET_MB;
  if (!parse_devices(obj, d, max_device, ctx, err) ||
      !get_name(obj, "reduce_stream", false, d->reduce_stream, ctx, err) ||
      !get_name(obj, "gather_stream", false, d->gather_stream, ctx, err) ||
      !json_get_positive(obj, "bucket_size", false, DIR_MAX_BUCKET_MB, &d->bucket_size_mb, ctx,
                         err) ||
      !json_get_bool(obj, "shard_grads", false, &d->shard_grads, ctx, err) ||
      !json_get_bool(obj, "shard_params", false, &d->shard_params, ctx, err) ||
      !json_get_bool(obj, "shard_optimizer", false, &d->shard_optimizer, ctx, err))
    return false;
  /* ZeRO-3 shards gradients as well as parameters; ZeRO-2 the optimizer state as well as
   * gradients (each level keeps the ones below it). */
  if (d->shard_params)
    d->shard_grads = true;
  if (d->shard_grads)
    d->shard_optimizer = true;
  return true;
}

/* recompute's "method" ("uniform" or "block") and "num_layers", Megatron's
 * --recompute-method and --recompute-num-layers: both or neither. With selective they cut the
 * layers the same way, so that each chunk's modules rerun right before its own backward. */
static bool parse_recompute_method(const cJSON *obj, struct dir_directive *d, const char *ctx,
                                   GError **err) {
  const char *m = NULL;
  if (!json_get_string(obj, "method", false, &m, ctx, err) ||
      !json_get_u32(obj, "num_layers", false, 1, MODEL_MAX_LAYERS, &d->num_layers, ctx, err))
    return false;
  if (!m && d->num_layers == 0)
    return true;
  if (!m || d->num_layers == 0)
    return piper_input_error(err, "%s: \"method\" and \"num_layers\" go together (layers per "
                             "recomputed chunk, or recomputed layers per stage)", ctx);
  if (strcmp(m, "uniform") == 0)
    d->method = DIR_RECOMPUTE_UNIFORM;
  else if (strcmp(m, "block") == 0)
    d->method = DIR_RECOMPUTE_BLOCK;
  else {
    g_autofree char *q = quote(m);
    return piper_input_error(err, "%s: \"method\" = %s must be \"uniform\" or \"block\"", ctx, q);
  }
  return true;
}

/* recompute's "modules": a non-empty list of module names (model_module_name), selective
 * only; absent, the attention core. */
static bool parse_recompute_modules(const cJSON *obj, struct dir_directive *d, const char *ctx,
                                    GError **err) {
  const cJSON *mods = cJSON_GetObjectItemCaseSensitive(obj, "modules");
  d->modules = d->granularity == IR_RECOMPUTE_SELECTIVE ? IR_RECOMPUTE_MODULES_DEFAULT : 0;
  if (!mods)
    return true;
  if (d->granularity != IR_RECOMPUTE_SELECTIVE)
    return piper_input_error(err, "%s: \"modules\" applies to \"granularity\": \"selective\" "
                             "only", ctx);
  if (!cJSON_IsArray(mods) || !mods->child)
    return piper_input_error(err, "%s: \"modules\" must be a non-empty list of core_attn, "
                             "layernorm, mlp, moe_act, moe, shared_experts, mla_up_proj", ctx);
  d->modules = 0;
  for (const cJSON *it = mods->child; it; it = it->next) {
    enum model_module k;
    if (!cJSON_IsString(it) || !it->valuestring || !model_module_parse(it->valuestring, &k)) {
      g_autofree char *q = cJSON_IsString(it) && it->valuestring ? quote(it->valuestring)
                                                                  : g_strdup("a non-string");
      return piper_input_error(err, "%s: \"modules\": %s is not one of core_attn, layernorm, "
                               "mlp, moe_act, moe, shared_experts, mla_up_proj", ctx, q);
    }
    if (d->modules & MODEL_MODULE_BIT(k))
      return piper_input_error(err, "%s: \"modules\" names \"%s\" twice", ctx,
                               model_module_name(k));
    d->modules |= MODEL_MODULE_BIT(k);
  }
  return true;
}

/* recompute's "granularity": "full" (the default) or "selective", Megatron's names. */
static bool parse_granularity(const cJSON *obj, struct dir_directive *d, const char *ctx,
                              GError **err) {
  const char *g = "full";
  if (!json_get_string(obj, "granularity", false, &g, ctx, err))
    return false;
  if (strcmp(g, "full") == 0)
    d->granularity = IR_RECOMPUTE_FULL;
  else if (strcmp(g, "selective") == 0)
    d->granularity = IR_RECOMPUTE_SELECTIVE;
  else {
    g_autofree char *q = quote(g);
    return piper_input_error(err, "%s: \"granularity\" = %s must be \"full\" or \"selective\"",
                             ctx, q);
  }
  return parse_recompute_method(obj, d, ctx, err) && parse_recompute_modules(obj, d, ctx, err);
}

static bool parse_directive(const cJSON *obj, uint32_t index, const char *name,
                            struct dir_directive *d, uint32_t *max_device, size_t *n_order_filters,
                            GError **err) {
  memset(d, 0, sizeof *d);
  d->index = index;
  d->filter.pass = IR_PASS_NONE;
  if (!cJSON_IsObject(obj))
    return piper_input_error(err, "%s: directive %u: must be an object with an \"op\"", name,
                             index);
  const cJSON *op = cJSON_GetObjectItemCaseSensitive(obj, "op");
  if (!op)
    return piper_input_error(err, "%s: directive %u: missing key \"op\"", name, index);
  if (!cJSON_IsString(op) || !op->valuestring)
    return piper_input_error(err, "%s: directive %u: \"op\" must be a string", name, index);
  int found = -1;
  for (int i = 0; i < (int)G_N_ELEMENTS(op_names); i++)
    if (strcmp(op->valuestring, op_names[i]) == 0)
      found = i;
  if (found < 0) {
    g_autofree char *q = quote(op->valuestring);
    return piper_input_error(err,
                             "%s: directive %u: unknown op %s (one of place, replicate, shard, "
                             "split, order, stream, tensor_parallel, recompute, "
                             "context_parallel)",
                             name, index, q);
  }
  d->op = (enum dir_op)found;
  g_autofree char *ctx = g_strdup_printf("%s: directive %u (%s)", name, index, op_names[found]);

  if (!check_keys(obj, op_keys[d->op], ctx, err))
    return false;
  switch (d->op) {
  case DIR_RECOMPUTE:
    if (!parse_granularity(obj, d, ctx, err))
      return false;
    break;
  case DIR_TENSOR_PARALLEL: return parse_tensor_parallel(obj, d, ctx, err);
  case DIR_CONTEXT_PARALLEL: return parse_context_parallel(obj, d, ctx, err);
  case DIR_ORDER: return parse_order(obj, d, n_order_filters, ctx, err);
  case DIR_STREAM: return parse_stream(obj, d, ctx, err);
  default: break;
  }

  /* place, replicate, shard, split: all carry one filter. */
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, "filter");
  if (!f)
    return piper_input_error(err, "%s: missing key \"filter\"", ctx);
  if (!parse_filter(f, &d->filter, ctx, "\"filter\"", err))
    return false;

  switch (d->op) {
  case DIR_PLACE:
    return parse_devices(obj, d, max_device, ctx, err) &&
           get_name(obj, "stream", false, d->stream, ctx, err);
  case DIR_SHARD:
    /* below 1 the average routing would not fit (ir/expert.c) */
    return parse_devices(obj, d, max_device, ctx, err) &&
           get_name(obj, "stream", false, d->stream, ctx, err) &&
           json_get_double(obj, "capacity_factor", false, 1.0, IR_EP_CAPACITY_FACTOR_MAX,
                           &d->capacity_factor, ctx, err) &&
           json_get_bool(obj, "fp8_expert_inputs", false, &d->fp8_expert_inputs, ctx, err) &&
           json_get_u32(obj, "degree", false, 1, IR_MAX_DEVICES, &d->ep_degree, ctx, err) &&
           json_get_u32(obj, "expert_tensor_parallel", false, 1, DIR_MAX_TP_DEGREE,
                        &d->etp_degree, ctx, err);
  case DIR_REPLICATE: return parse_replicate(obj, d, max_device, ctx, err);
  case DIR_SPLIT:
    return get_name(obj, "dim_name", true, d->dim_name, ctx, err) &&
           json_get_int(obj, "num_microbatches", true, 1, DIR_MAX_MICROBATCHES,
                        &d->num_microbatches, ctx, err);
  default: return true;
  }
}

struct dir_program *dir_program_parse_json(const char *name, const cJSON *root, GError **err) {
  if (!name)
    name = "<directives>";
  if (!cJSON_IsArray(root)) {
    piper_input_error(err, "%s: a directive program must be a JSON array of directive objects",
                      name);
    return NULL;
  }
  size_t n = count_upto(root, DIR_MAX_DIRECTIVES);
  if (n > DIR_MAX_DIRECTIVES) {
    piper_input_error(err, "%s: more than %d directives", name, DIR_MAX_DIRECTIVES);
    return NULL;
  }
  struct dir_program *p = dir_program_new(name);
  /* Capacity is a power of two so dir_program_append can grow by doubling (see there). */
  size_t cap = 1;
  while (cap < n)
    cap *= 2;
  p->d = g_new0(struct dir_directive, cap);
  size_t n_order_filters = 0;
  for (const cJSON *it = root->child; it; it = it->next) {
    struct dir_directive *d = &p->d[p->n];
    bool ok = parse_directive(it, p->n, name, d, &p->max_device, &n_order_filters, err);
    p->n++; /* counted even on failure, so dir_program_free releases what it holds */
    if (!ok) {
      dir_program_free(p);
      return NULL;
    }
  }
  return p;
}

struct dir_program *dir_program_load_file(const char *path, GError **err) {
  cJSON *root = json_parse_file(path, err);
  if (!root)
    return NULL;
  struct dir_program *p = dir_program_parse_json(path, root, err);
  cJSON_Delete(root);
  return p;
}

struct dir_program *dir_program_new(const char *name) {
  struct dir_program *p = g_new0(struct dir_program, 1);
  p->name = g_strdup(name ? name : "<directives>");
  return p;
}

static uint32_t directive_max_device(const struct dir_directive *d) {
  uint32_t m = 0;
  for (uint32_t i = 0; i < d->n_devices; i++)
    if (d->devices[i] + 1 > m)
      m = d->devices[i] + 1;
  return m;
}

/* The array has no capacity field; its capacity is kept >= the power of two at or above n, so
 * growing when n reaches a power of two doubles it and appends stay amortised O(1). */
void dir_program_append(struct dir_program *p, const struct dir_directive *d) {
  PIPER_ASSERT(p && d);
  PIPER_ASSERT(p->n < UINT32_MAX / 2);
  if (p->n == 0 || (p->n & (p->n - 1)) == 0)
    p->d = g_renew(struct dir_directive, p->d, p->n == 0 ? 1 : 2 * (size_t)p->n);
  struct dir_directive *c = &p->d[p->n];
  *c = *d;
  c->index = p->n;
  c->devices = d->n_devices ? g_memdup2(d->devices, d->n_devices * sizeof *d->devices) : NULL;
  if (!d->devices)
    c->n_devices = 0;
  if (d->n_slots && d->slot_first) {
    uint32_t n_filters = d->slot_first[d->n_slots];
    c->slot_first = g_memdup2(d->slot_first, (d->n_slots + 1) * sizeof *d->slot_first);
    c->filters = n_filters ? g_memdup2(d->filters, n_filters * sizeof *d->filters) : NULL;
  } else {
    c->n_slots = 0;
    c->slot_first = NULL;
    c->filters = NULL;
  }
  uint32_t m = directive_max_device(c);
  if (m > p->max_device)
    p->max_device = m;
  p->n++;
}

void dir_program_remove_op(struct dir_program *p, enum dir_op op) {
  if (!p)
    return;
  uint32_t kept = 0;
  p->max_device = 0;
  for (uint32_t i = 0; i < p->n; i++) {
    if (p->d[i].op == op) {
      directive_clear(&p->d[i]);
      continue;
    }
    p->d[kept] = p->d[i];
    p->d[kept].index = kept;
    uint32_t m = directive_max_device(&p->d[kept]);
    if (m > p->max_device)
      p->max_device = m;
    kept++;
  }
  p->n = kept;
}

void dir_program_free(struct dir_program *p) {
  if (!p)
    return;
  for (uint32_t i = 0; i < p->n; i++)
    directive_clear(&p->d[i]);
  g_free(p->d);
  g_free(p->name);
  g_free(p);
}

static cJSON *filter_to_json(const struct dir_filter *f) {
  cJSON *o = cJSON_CreateObject();
  for (uint32_t i = 0; i < f->n_keys; i++) {
    if (f->keys[i].value == IR_FILTER_ANY)
      cJSON_AddStringToObject(o, f->keys[i].name, "*");
    else
      cJSON_AddNumberToObject(o, f->keys[i].name, f->keys[i].value);
  }
  if ((unsigned)f->pass < G_N_ELEMENTS(pass_names))
    cJSON_AddStringToObject(o, "PASS", pass_names[f->pass]);
  return o;
}

static void devices_to_json(cJSON *o, const struct dir_directive *d) {
  cJSON *a = cJSON_AddArrayToObject(o, "devices");
  for (uint32_t i = 0; i < d->n_devices; i++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber(d->devices[i]));
}

static void name_to_json(cJSON *o, const char *key, const char *value) {
  if (value[0])
    cJSON_AddStringToObject(o, key, value);
}

cJSON *dir_program_to_json(const struct dir_program *p) {
  cJSON *root = cJSON_CreateArray();
  for (uint32_t i = 0; i < p->n; i++) {
    const struct dir_directive *d = &p->d[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", dir_op_name(d->op));
    switch (d->op) {
    case DIR_PLACE:
    case DIR_SHARD:
      cJSON_AddItemToObject(o, "filter", filter_to_json(&d->filter));
      devices_to_json(o, d);
      name_to_json(o, "stream", d->stream);
      if (d->capacity_factor > 0) /* only when given: other programs print as before */
        cJSON_AddNumberToObject(o, "capacity_factor", d->capacity_factor);
      if (d->fp8_expert_inputs)
        cJSON_AddBoolToObject(o, "fp8_expert_inputs", true);
      if (d->ep_degree > 0)
        cJSON_AddNumberToObject(o, "degree", d->ep_degree);
      if (d->etp_degree > 0)
        cJSON_AddNumberToObject(o, "expert_tensor_parallel", d->etp_degree);
      break;
    case DIR_REPLICATE:
      cJSON_AddItemToObject(o, "filter", filter_to_json(&d->filter));
      devices_to_json(o, d);
      name_to_json(o, "reduce_stream", d->reduce_stream);
      name_to_json(o, "gather_stream", d->gather_stream);
      cJSON_AddNumberToObject(o, "bucket_size", d->bucket_size_mb);
      cJSON_AddBoolToObject(o, "shard_grads", d->shard_grads);
      cJSON_AddBoolToObject(o, "shard_params", d->shard_params);
      /* Written only where it says more than shard_grads does, so programs without ZeRO-1
       * print as they always did. */
      if (d->shard_optimizer && !d->shard_grads)
        cJSON_AddBoolToObject(o, "shard_optimizer", true);
      break;
    case DIR_SPLIT:
      cJSON_AddItemToObject(o, "filter", filter_to_json(&d->filter));
      cJSON_AddStringToObject(o, "dim_name", d->dim_name);
      cJSON_AddNumberToObject(o, "num_microbatches", (double)d->num_microbatches);
      break;
    case DIR_ORDER: {
      cJSON *groups = cJSON_AddArrayToObject(o, "filters");
      for (uint32_t s = 0; s < d->n_slots; s++) {
        cJSON *g = cJSON_CreateArray();
        for (uint32_t k = d->slot_first[s]; k < d->slot_first[s + 1]; k++)
          cJSON_AddItemToArray(g, filter_to_json(&d->filters[k]));
        cJSON_AddItemToArray(groups, g);
      }
      break;
    }
    case DIR_TENSOR_PARALLEL:
      cJSON_AddItemToObject(o, "filter", filter_to_json(&d->filter));
      cJSON_AddNumberToObject(o, "degree", d->tp_degree);
      if (d->sequence_parallel)
        cJSON_AddBoolToObject(o, "sequence_parallel", true);
      break;
    case DIR_RECOMPUTE:
      cJSON_AddItemToObject(o, "filter", filter_to_json(&d->filter));
      cJSON_AddStringToObject(o, "granularity",
                              d->granularity == IR_RECOMPUTE_SELECTIVE ? "selective" : "full");
      if (d->granularity == IR_RECOMPUTE_SELECTIVE && d->modules != IR_RECOMPUTE_MODULES_DEFAULT) {
        cJSON *mods = cJSON_AddArrayToObject(o, "modules");
        for (int k = 0; k < MODEL_MODULE_COUNT; k++)
          if (d->modules & MODEL_MODULE_BIT(k))
            cJSON_AddItemToArray(mods, cJSON_CreateString(model_module_name((enum model_module)k)));
      }
      if (d->method != DIR_RECOMPUTE_SEGMENT) {
        cJSON_AddStringToObject(o, "method", d->method == DIR_RECOMPUTE_UNIFORM ? "uniform" : "block");
        cJSON_AddNumberToObject(o, "num_layers", d->num_layers);
      }
      break;
    case DIR_CONTEXT_PARALLEL:
      cJSON_AddNumberToObject(o, "degree", d->cp_degree);
      cJSON_AddStringToObject(o, "comm", d->cp_comm == IR_CP_ALL_GATHER ? "all_gather" : "p2p");
      break;
    case DIR_STREAM:
      cJSON_AddStringToObject(o, "name", d->name);
      cJSON_AddNumberToObject(o, "priority", (double)d->priority);
      cJSON_AddNumberToObject(o, "sm_share", d->sm_share);
      break;
    }
    cJSON_AddItemToArray(root, o);
  }
  return root;
}
