/* plan_read: plans from a directory of JSON files (docs/design.md, "The plan contract");
 * plan_write.c writes them.
 *
 * Devices of one class carry the same program; the reader checks that they agree, and checks
 * every field a device file repeats from the index (op, pass, bytes, peer, rank, members)
 * against the index, so an edited file cannot disagree silently. Readable names ("name") are
 * informational and only type-checked, so a plan stays readable when the naming changes.
 *
 * Reading validates every index and count before using it and fails with one line naming the
 * file and the JSON path, e.g. "out/device-3.json: streams[1].instructions[4]: \"node\" = 99 is
 * out of range [0, 40]". Device files are read one at a time, so memory stays at one file's
 * parse tree plus the plan. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../base/json.h"
#include "plan.h"
#include "plan-impl.h"

/* --- reading: typed getters (base/json.h) with locations ------------------------------------
 * A location is the file and a JSON path of at most two array steps ("streams[1].
 * instructions[4]"); it is formatted only when an error is reported. */

/* Appends the entries of array v, each an index below lim, to pool. */
static bool read_refs(const cJSON *v, const char *key, uint32_t lim, GArray *pool,
                      const struct json_loc *l, GError **err) {
  const cJSON *c;
  uint32_t n;
  if (!json_value_array(v, key, PLAN_MAX_COUNT, &c, &n, l, err))
    return false;
  for (uint32_t k = 0; c; c = c->next, k++) {
    if (!json_is_whole(c) || c->valuedouble < 0 || c->valuedouble >= (double)lim) {
      if (lim == 0)
        return json_fail_at(err, l, "\"%s\"[%u] refers to nothing (the list is empty)", key, k);
      return json_fail_at(err, l, "\"%s\"[%u] must be an integer in [0, %u]", key, k, lim - 1);
    }
    uint32_t x = (uint32_t)c->valuedouble;
    g_array_append_val(pool, x);
  }
  if (pool->len > PLAN_MAX_COUNT)
    return json_fail_at(err, l, "more than %u \"%s\" entries in all", PLAN_MAX_COUNT, key);
  return true;
}

static bool expect_string(const cJSON *v, const char *key, const char *want,
                          const struct json_loc *l, GError **err) {
  const char *s;
  if (!json_value_string(v, key, PLAN_NAME_LEN, &s, l, err))
    return false;
  if (strcmp(s, want) != 0)
    return json_fail_at(err, l, "\"%s\" is \"%s\", expected \"%s\"", key, s, want);
  return true;
}

static bool check_format(const cJSON *format, const cJSON *version, const char *want,
                         const struct json_loc *l, GError **err) {
  if (!expect_string(format, "format", want, l, err))
    return false;
  if (!version)
    return json_fail_at(err, l, "missing key \"version\"");
  if (!json_is_whole(version))
    return json_fail_at(err, l, "\"version\" must be an integer");
  if (version->valuedouble != PLAN_VERSION)
    return json_fail_at(err, l, "plan format version %.17g is not supported (this build reads %d)",
                        version->valuedouble, PLAN_VERSION);
  return true;
}

/* --- reading the index --------------------------------------------------------------------- */

struct reader {
  char *dir; /* how messages name the plan directory */
  char *index_file;
  struct plan *p;
  uint32_t n_classes;
  bool by_class;          /* "layout": "classes": one file per class, none per device */
  uint32_t *class_instrs; /* [n_classes]: instruction count the index gives */
  uint32_t *class_source; /* [n_classes]: device whose file defined the class, or IR_NONE */
  uint32_t **class_comms; /* [n_classes]: communicators the class uses, ascending */
  uint32_t *class_n_comms;
  uint32_t *seq_next; /* [2 * n_comms]: scratch, next sequence number per end */
  /* Summary from the index, checked once every class is known. */
  int64_t sum_instrs, sum_per_op[IR_NODE_KIND_COUNT];
};

static struct reader *reader_new(const char *dir) {
  struct reader *r = g_new0(struct reader, 1);
  r->dir = g_strdup(dir);
  r->index_file = g_build_filename(dir, "plan.json", NULL);
  return r;
}

static void reader_free(struct reader *r) {
  if (!r)
    return;
  plan_free(r->p);
  if (r->class_comms)
    for (uint32_t c = 0; c < r->n_classes; c++)
      g_free(r->class_comms[c]);
  g_free(r->class_comms);
  g_free(r->class_n_comms);
  g_free(r->class_instrs);
  g_free(r->class_source);
  g_free(r->seq_next);
  g_free(r->index_file);
  g_free(r->dir);
  g_free(r);
}

/* Moves a GArray of uint32_t into a plain g_malloc'd array. */
static uint32_t *take_pool(GArray *a, uint32_t *n) {
  *n = a->len;
  return (uint32_t *)(void *)g_array_free(a, FALSE);
}

enum {
  I_FORMAT,
  I_VERSION,
  I_LAYOUT,
  I_MODEL_NAME,
  I_MODEL,
  I_PROGRAM,
  I_N_DEVICES,
  I_N_MICROBATCHES,
  I_TAGS,
  I_STREAMS,
  I_GROUPS,
  I_SEGSETS,
  I_NODES,
  I_COMMS,
  I_CLASSES,
  I_DEVICE_CLASS,
  I_SUMMARY,
  I_COUNT
};
static const char *const index_keys[I_COUNT] = {
    "format",  "version",      "layout",        "model_name", "model",  "program",
    "n_devices", "n_microbatches", "tags",    "streams",    "groups", "segsets",
    "nodes",   "communicators", "classes",       "device_class", "summary"};

/* Checks that an "id" member equals the record's position (ids are there for people). */
static bool check_id(const cJSON *v, uint32_t want, const struct json_loc *l, GError **err) {
  int64_t id;
  if (!json_value_int(v, "id", 0, UINT32_MAX, &id, l, err))
    return false;
  if ((uint32_t)id != want)
    return json_fail_at(err, l, "\"id\" is %lld, expected %u (its position in the list)",
                        (long long)id, want);
  return true;
}

static bool read_model(struct reader *r, const cJSON *const *k, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  const char *model_name;
  if (!json_value_string(k[I_MODEL_NAME], "model_name", sizeof p->model->name, &model_name, &l,
                         err))
    return false;
  if (!k[I_MODEL])
    return json_fail_at(err, &l, "missing key \"model\"");
  if (!cJSON_IsObject(k[I_MODEL]))
    return json_fail_at(err, &l, "\"model\" must be an object");
  GError *e = NULL;
  p->model = model_load_json(model_name, k[I_MODEL], 0, &e);
  if (!p->model) {
    if (!e)
      return json_fail_at(err, &l, "\"model\": the model configuration is invalid");
    g_propagate_prefixed_error(err, e, "%s: \"model\": ", r->index_file);
    return false;
  }
  /* the writer gives model_name the model's own name: a "piper.name" edited apart from it would
   * relabel the run's results */
  if (strncmp(p->model->name, model_name, sizeof p->model->name) != 0)
    return json_fail_at(err, &l,
                        "\"model_name\" is \"%s\", the embedded \"model\" is named \"%.*s\"",
                        model_name, (int)sizeof p->model->name, p->model->name);
  char *text = cJSON_PrintUnformatted(k[I_MODEL]);
  p->model_json = g_strdup(text);
  cJSON_free(text);
  const cJSON *prog = k[I_PROGRAM];
  if (!prog)
    return json_fail_at(err, &l, "missing key \"program\"");
  if (cJSON_IsString(prog)) {
    p->program_json = g_strdup(prog->valuestring);
  } else if (!cJSON_IsNull(prog)) {
    text = cJSON_PrintUnformatted(prog);
    p->program_json = g_strdup(text);
    cJSON_free(text);
  }
  return true;
}

static bool read_tags_streams(struct reader *r, const cJSON *const *k, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  const cJSON *c;
  uint32_t n;
  if (!json_value_array(k[I_TAGS], "tags", IR_MAX_TAGS, &c, &n, &l, err))
    return false;
  for (uint32_t t = 0; c; c = c->next, t++) {
    struct json_loc lt = {r->index_file, "tags", t, NULL, 0};
    if (!cJSON_IsString(c) || !c->valuestring || !c->valuestring[0] ||
        strlen(c->valuestring) >= MODEL_TAG_NAME_MAX)
      return json_fail_at(err, &lt, "a tag name must be a string of 1 to %d characters",
                          MODEL_TAG_NAME_MAX - 1);
    for (uint32_t u = 0; u < t; u++)
      if (strcmp(p->tag_names[u], c->valuestring) == 0)
        return json_fail_at(err, &lt, "tag \"%s\" is listed twice", c->valuestring);
    memset(p->tag_names[t], 0, MODEL_TAG_NAME_MAX);
    strcpy(p->tag_names[t], c->valuestring);
  }
  p->n_tags = n;
  /* The graph's tags are the model's, then the split dimensions. */
  if (p->n_tags < p->model->n_tags)
    return json_fail_at(err, &l, "\"tags\" has %u names, fewer than the model's %u", p->n_tags,
                        p->model->n_tags);
  for (uint32_t t = 0; t < p->model->n_tags; t++)
    if (strncmp(p->tag_names[t], p->model->tag_names[t], MODEL_TAG_NAME_MAX) != 0) {
      struct json_loc lt = {r->index_file, "tags", t, NULL, 0};
      return json_fail_at(err, &lt, "\"%s\" differs from the model's tag %u \"%.*s\"",
                          p->tag_names[t], t, MODEL_TAG_NAME_MAX, p->model->tag_names[t]);
    }

  if (!json_value_array(k[I_STREAMS], "streams", PLAN_MAX_STREAMS, &c, &n, &l, err))
    return false;
  if (n == 0)
    return json_fail_at(err, &l, "\"streams\" is empty");
  p->streams = g_new0(struct ir_stream, n);
  p->n_streams = n;
  GHashTable *seen = g_hash_table_new(g_str_hash, g_str_equal);
  bool ok = false;
  for (uint32_t s = 0; c; c = c->next, s++) {
    struct json_loc ls = {r->index_file, "streams", s, NULL, 0};
    enum { S_ID, S_NAME, S_PRIORITY, S_SHARE, S_N };
    static const char *const keys[S_N] = {"id", "name", "priority", "sm_share"};
    const cJSON *x[S_N];
    const char *name;
    int64_t prio;
    if (!json_fetch(c, keys, S_N, x, &ls, err) || !check_id(x[S_ID], s, &ls, err) ||
        !json_value_string(x[S_NAME], "name", IR_NAME_MAX, &name, &ls, err) ||
        !json_value_int(x[S_PRIORITY], "priority", INT32_MIN, INT32_MAX, &prio, &ls, err))
      goto out;
    if (!name[0]) {
      json_fail_at(err, &ls, "\"name\" is empty");
      goto out;
    }
    if (g_hash_table_contains(seen, name)) {
      json_fail_at(err, &ls, "stream \"%s\" is listed twice", name);
      goto out;
    }
    g_hash_table_add(seen, (gpointer)name);
    if (!x[S_SHARE] || !cJSON_IsNumber(x[S_SHARE]) || !(x[S_SHARE]->valuedouble >= 0) ||
        !(x[S_SHARE]->valuedouble <= 1)) {
      json_fail_at(err, &ls, "\"sm_share\" must be a number in [0, 1]");
      goto out;
    }
    strcpy(p->streams[s].name, name);
    p->streams[s].priority = (int32_t)prio;
    p->streams[s].sm_share = x[S_SHARE]->valuedouble;
  }
  ok = true;
out:
  g_hash_table_destroy(seen);
  return ok;
}

static bool read_groups_segsets(struct reader *r, const cJSON *const *k, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  const cJSON *c;
  uint32_t n;
  bool ok = false;
  GArray *pool = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  uint32_t *stamp = g_new0(uint32_t, p->n_devices);
  if (!json_value_array(k[I_GROUPS], "groups", PLAN_MAX_COUNT, &c, &n, &l, err))
    goto out;
  p->groups = g_new0(struct ir_group, n ? n : 1);
  p->n_groups = n;
  for (uint32_t g = 0; c; c = c->next, g++) {
    struct json_loc lg = {r->index_file, "groups", g, NULL, 0};
    static const char *const keys[] = {"id", "devices"};
    const cJSON *x[2];
    uint32_t first = pool->len;
    if (!json_fetch(c, keys, 2, x, &lg, err) || !check_id(x[0], g, &lg, err) ||
        !read_refs(x[1], "devices", p->n_devices, pool, &lg, err))
      goto out;
    if (pool->len == first) {
      json_fail_at(err, &lg, "\"devices\" is empty");
      goto out;
    }
    /* A device twice in one group would have two ranks. */
    for (uint32_t i = first; i < pool->len; i++) {
      uint32_t d = g_array_index(pool, uint32_t, i);
      if (stamp[d] == g + 1) {
        json_fail_at(err, &lg, "device %u is listed twice", d);
        goto out;
      }
      stamp[d] = g + 1;
    }
    p->groups[g].first = first;
    p->groups[g].count = pool->len - first;
  }
  p->device_pool = take_pool(pool, &p->n_device_pool);
  pool = g_array_new(FALSE, FALSE, sizeof(uint32_t));

  if (!json_value_array(k[I_SEGSETS], "segsets", PLAN_MAX_COUNT, &c, &n, &l, err))
    goto out;
  p->segsets = g_new0(struct ir_segset, n ? n : 1);
  p->n_segsets = n;
  for (uint32_t s = 0; c; c = c->next, s++) {
    struct json_loc ls = {r->index_file, "segsets", s, NULL, 0};
    static const char *const keys[] = {"id", "segments", "param_bytes"};
    const cJSON *x[3];
    uint32_t first = pool->len;
    if (!json_fetch(c, keys, 3, x, &ls, err) || !check_id(x[0], s, &ls, err) ||
        !read_refs(x[1], "segments", p->model->n_segments, pool, &ls, err) ||
        !json_value_u64(x[2], "param_bytes", PLAN_MAX_BYTES, &p->segsets[s].param_bytes, &ls, err))
      goto out;
    p->segsets[s].first = first;
    p->segsets[s].count = pool->len - first;
  }
  p->segment_pool = take_pool(pool, &p->n_segment_pool);
  pool = NULL;
  ok = true;
out:
  if (pool)
    g_array_free(pool, TRUE);
  g_free(stamp);
  return ok;
}

enum {
  N_ID,
  N_NAME,
  N_KIND,
  N_PASS,
  N_PURPOSE,
  N_TAGS,
  N_GROUP,
  N_PEER_GROUP,
  N_STREAM,
  N_SEGMENT,
  N_SEGSET,
  N_PAIR,
  N_BYTES,
  N_SHARD_DEGREE,
  N_REPLICA_DEGREE,
  N_SHARD_GRADS,
  N_SHARD_PARAMS,
  N_SHARD_OPTIMIZER,
  N_RECOMPUTE,
  N_DIRECTIVE,
  N_TP_DEGREE, /* tensor parallelism: optional, absent without it */
  N_SEQUENCE_PARALLEL,
  N_COLLECTIVES,
  N_PRIORITY,
  N_CAPACITY_FACTOR,   /* expert parallelism: optional, absent without it */
  N_FP8_EXPERT_INPUTS, /* expert parallelism: optional, absent when false */
  N_RECOMPUTE_MODULES, /* selective recomputation of other modules than the attention core */
  N_EXPERT_REPLICAS,   /* experts carved from the stage: optional, absent without */
  N_ROUTE_SPLIT,
  N_CP_DEGREE,         /* context parallelism: optional, absent without it */
  N_CP_COMM,
  N_COUNT
};
static const char *const node_keys[N_COUNT] = {"id",
                                               "name",
                                               "kind",
                                               "pass",
                                               "purpose",
                                               "tags",
                                               "group",
                                               "peer_group",
                                               "stream",
                                               "segment",
                                               "segset",
                                               "pair",
                                               "bytes",
                                               "shard_degree",
                                               "replica_degree",
                                               "shard_grads",
                                               "shard_params",
                                               "shard_optimizer",
                                               "recompute",
                                               "directive",
                                               "tp_degree",
                                               "sequence_parallel",
                                               "collectives",
                                               "priority",
                                               "capacity_factor",
                                               "fp8_expert_inputs",
                                               "recompute_modules",
                                               "expert_replicas",
                                               "route_split",
                                               "cp_degree",
                                               "cp_comm"};

/* The optional context-parallel fields: a degree of 2 or more that divides the node's group
 * (with its TP degree), and how its K/V travel; a cp node always has them. */
static bool read_context_parallel(const struct plan *p, struct ir_node *n, const cJSON *deg_v,
                                  const cJSON *comm_v, const struct json_loc *l, GError **err) {
  int64_t deg = 0;
  const char *comm = NULL;
  if (deg_v && !json_value_int(deg_v, "cp_degree", 2, MODEL_MAX_CONTEXT_PARALLEL, &deg, l, err))
    return false;
  if (comm_v && !json_value_string(comm_v, "cp_comm", 16, &comm, l, err))
    return false;
  n->cp_degree = (uint32_t)deg;
  n->cp_comm = comm && strcmp(comm, "all_gather") == 0 ? IR_CP_ALL_GATHER : IR_CP_P2P;
  if (comm && strcmp(comm, "all_gather") != 0 && strcmp(comm, "p2p") != 0)
    return json_fail_at(err, l, "\"cp_comm\" must be \"p2p\" or \"all_gather\"");
  if (!deg != !comm || (!deg && n->purpose == IR_COMM_CP))
    return json_fail_at(err, l, "\"cp_degree\" and \"cp_comm\" go together, on every cp node");
  uint32_t tp = n->tp_degree > 1 ? n->tp_degree : 1;
  if (deg && (p->groups[n->group].count % (tp * (uint32_t)deg) != 0 ||
              p->model->context_parallel != deg))
    return json_fail_at(err, l, "\"cp_degree\" %lld must divide the %u devices of \"group\" %u "
                                "(with tp %u) and equal the model's context_parallel %lld",
                        (long long)deg, p->groups[n->group].count, n->group, tp,
                        (long long)p->model->context_parallel);
  return true;
}

/* A selective node's "recompute_modules" (module names, absent: the attention core). */
static bool read_recompute_modules(const cJSON *v, struct ir_node *n, const struct json_loc *l,
                                   GError **err) {
  n->recompute_modules = n->recompute == IR_RECOMPUTE_SELECTIVE ? IR_RECOMPUTE_MODULES_DEFAULT : 0;
  if (!v)
    return true;
  if (n->recompute != IR_RECOMPUTE_SELECTIVE || !cJSON_IsArray(v) || !v->child)
    return json_fail_at(err, l, "\"recompute_modules\" must be a list of module names on a "
                                "selective node");
  n->recompute_modules = 0;
  for (const cJSON *it = v->child; it; it = it->next) {
    enum model_module k;
    if (!cJSON_IsString(it) || !it->valuestring || !model_module_parse(it->valuestring, &k))
      return json_fail_at(err, l, "\"recompute_modules\": not a module name (core_attn, "
                                  "layernorm, mlp, moe_act, moe, shared_experts, mla_up_proj)");
    n->recompute_modules |= MODEL_MODULE_BIT(k);
  }
  return true;
}

/* "0x" and 1 to 16 hex digits: a 64-bit value written as text. */
static bool read_hex(const cJSON *v, const char *key, uint64_t *out, const struct json_loc *l,
                     GError **err) {
  const char *s;
  if (!json_value_string(v, key, PLAN_NAME_LEN, &s, l, err))
    return false;
  size_t n = strlen(s);
  bool ok = n > 2 && n <= 18 && s[0] == '0' && s[1] == 'x';
  uint64_t x = 0;
  for (size_t i = 2; ok && i < n; i++) {
    int d = g_ascii_xdigit_value(s[i]);
    if (d < 0)
      ok = false;
    x = x << 4 | (uint64_t)(d < 0 ? 0 : d);
  }
  if (!ok)
    return json_fail_at(err, l, "\"%s\" must be a hex string such as \"0x1f\"", key);
  *out = x;
  return true;
}

static bool read_pass(const cJSON *v, enum ir_pass *out, const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"pass\"");
  if (cJSON_IsNull(v)) {
    *out = IR_PASS_NONE;
    return true;
  }
  if (cJSON_IsString(v) && v->valuestring)
    for (int k = IR_PASS_F; k < IR_PASS_NONE; k++)
      if (strcmp(v->valuestring, ir_pass_name((enum ir_pass)k)) == 0) {
        *out = (enum ir_pass)k;
        return true;
      }
  return json_fail_at(err, l, "\"pass\" must be null or a pass name (F, B, BI, BW)");
}

static bool read_purpose(const cJSON *v, bool nullable, enum ir_comm_purpose *out,
                         const struct json_loc *l, GError **err) {
  if (!v)
    return json_fail_at(err, l, "missing key \"purpose\"");
  if (nullable && cJSON_IsNull(v)) {
    *out = IR_COMM_NONE;
    return true;
  }
  if (cJSON_IsString(v) && v->valuestring)
    for (int k = IR_COMM_PP; k < IR_COMM_PURPOSE_COUNT; k++)
      if (strcmp(v->valuestring, plan_purpose_names[k]) == 0) {
        *out = (enum ir_comm_purpose)k;
        return true;
      }
  return json_fail_at(err, l, "\"purpose\" must be %s\"pp\", \"dp\", \"ep\", \"tp\" or \"cp\"",
                      nullable ? "null, " : "");
}

/* A send or recv finds its peer at its own position in peer_group. */
static bool check_peer_group(const struct plan *p, const struct ir_node *n,
                             const struct json_loc *l, GError **err) {
  if (n->kind != IR_NODE_SEND && n->kind != IR_NODE_RECV)
    return true;
  if (n->peer_group == IR_NONE)
    return json_fail_at(err, l, "a %s needs a \"peer_group\"", ir_node_kind_name(n->kind));
  if (p->groups[n->peer_group].count != p->groups[n->group].count)
    return json_fail_at(err, l, "\"peer_group\" %u has %u devices, \"group\" %u has %u",
                        n->peer_group, p->groups[n->peer_group].count, n->group,
                        p->groups[n->group].count);
  return true;
}

/* The optional tensor-parallel fields: a degree of 2 or more that divides the node's group,
 * sequence_parallel and collectives only with it, and a tp node always with it. */
static bool read_tensor_parallel(const struct plan *p, struct ir_node *n, const cJSON *tp,
                                 const cJSON *sp, const cJSON *count, const struct json_loc *l,
                                 GError **err) {
  int64_t deg = 0, cnt = 0;
  if (tp && !json_value_int(tp, "tp_degree", 2, IR_MAX_DEVICES, &deg, l, err))
    return false;
  if (sp && !json_value_bool(sp, "sequence_parallel", &n->sequence_parallel, l, err))
    return false;
  if (count && !json_value_int(count, "collectives", 2, INT32_MAX, &cnt, l, err))
    return false;
  n->tp_degree = (uint32_t)deg;
  n->collectives = (uint32_t)cnt;
  if (deg && p->groups[n->group].count % (uint32_t)deg != 0)
    return json_fail_at(err, l, "\"tp_degree\" %lld does not divide the %u devices of \"group\" %u",
                        (long long)deg, p->groups[n->group].count, n->group);
  if (!deg && (n->sequence_parallel || (cnt && n->purpose != IR_COMM_CP) ||
               n->purpose == IR_COMM_TP))
    return json_fail_at(err, l, "%s needs a \"tp_degree\"",
                        n->purpose == IR_COMM_TP ? "a tp node"
                                                 : "\"sequence_parallel\" or \"collectives\"");
  return true;
}

/* The EP receive capacity (ir/expert.c), on EP nodes alone; plans written before it get the
 * default. */
static bool read_capacity(struct ir_node *n, const cJSON *v, const cJSON *fp8,
                          const struct json_loc *l, GError **err) {
  n->capacity_factor = n->shard_degree > 1 ? IR_EP_CAPACITY_FACTOR_DEFAULT : 0;
  if (fp8 && n->shard_degree <= 1)
    return json_fail_at(err, l, "\"fp8_expert_inputs\" on a node without expert parallelism");
  if (fp8 && !json_value_bool(fp8, "fp8_expert_inputs", &n->fp8_expert_inputs, l, err))
    return false;
  if (!v)
    return true;
  if (n->shard_degree <= 1)
    return json_fail_at(err, l, "\"capacity_factor\" on a node without expert parallelism");
  return json_value_double(v, "capacity_factor", 1.0, IR_EP_CAPACITY_FACTOR_MAX,
                           &n->capacity_factor, l, err);
}

/* Experts carved from the stage (ir.h): "expert_replicas" and "route_split", 2 or more where
 * present. */
static bool read_expert_grid(struct ir_node *n, const cJSON *const *x, const struct json_loc *l,
                             GError **err) {
  int64_t v = 0;
  n->expert_replicas = n->route_split = 0;
  if (x[N_EXPERT_REPLICAS]) {
    if (!json_value_int(x[N_EXPERT_REPLICAS], "expert_replicas", 2, IR_MAX_DEVICES, &v, l, err))
      return false;
    n->expert_replicas = (uint32_t)v;
  }
  if (x[N_ROUTE_SPLIT]) {
    if (!json_value_int(x[N_ROUTE_SPLIT], "route_split", 2, IR_MAX_DEVICES, &v, l, err))
      return false;
    n->route_split = (uint32_t)v;
  }
  return true;
}

/* The ZeRO level: shard_grads and shard_params always written, shard_optimizer only for
 * ZeRO-1 (every higher level implies it). */
static bool read_zero_flags(const cJSON *const *x, struct ir_node *n, const struct json_loc *l,
                            GError **err) {
  if (!json_value_bool(x[N_SHARD_GRADS], "shard_grads", &n->shard_grads, l, err) ||
      !json_value_bool(x[N_SHARD_PARAMS], "shard_params", &n->shard_params, l, err))
    return false;
  n->shard_optimizer = false;
  if (x[N_SHARD_OPTIMIZER] &&
      !json_value_bool(x[N_SHARD_OPTIMIZER], "shard_optimizer", &n->shard_optimizer, l, err))
    return false;
  n->shard_optimizer |= n->shard_grads;
  /* Optional too: "full" or "selective" on F and R nodes of a recompute directive. */
  n->recompute = IR_RECOMPUTE_NONE;
  const cJSON *rc = x[N_RECOMPUTE];
  if (!rc)
    return read_recompute_modules(x[N_RECOMPUTE_MODULES], n, l, err);
  if (cJSON_IsString(rc) && rc->valuestring && strcmp(rc->valuestring, "full") == 0)
    n->recompute = IR_RECOMPUTE_FULL;
  else if (cJSON_IsString(rc) && rc->valuestring && strcmp(rc->valuestring, "selective") == 0)
    n->recompute = IR_RECOMPUTE_SELECTIVE;
  else
    return json_fail_at(err, l, "\"recompute\" must be \"full\" or \"selective\"");
  return read_recompute_modules(x[N_RECOMPUTE_MODULES], n, l, err);
}

static bool read_node(struct reader *r, const cJSON *rec, uint32_t i, GError **err) {
  struct plan *p = r->p;
  struct ir_node *n = &p->nodes[i];
  struct json_loc l = {r->index_file, "nodes", i, NULL, 0};
  const cJSON *x[N_COUNT];
  const char *name;
  if (!json_fetch(rec, node_keys, N_COUNT, x, &l, err) || !check_id(x[N_ID], i, &l, err) ||
      !json_value_string(x[N_NAME], "name", PLAN_NAME_LEN, &name, &l, err))
    return false;
  if (!x[N_KIND])
    return json_fail_at(err, &l, "missing key \"kind\"");
  n->kind = IR_NODE_KIND_COUNT;
  if (cJSON_IsString(x[N_KIND]) && x[N_KIND]->valuestring)
    for (int k = 0; k < IR_NODE_KIND_COUNT; k++)
      if (strcmp(x[N_KIND]->valuestring, ir_node_kind_name((enum ir_node_kind)k)) == 0)
        n->kind = (enum ir_node_kind)k;
  if (n->kind == IR_NODE_KIND_COUNT)
    return json_fail_at(err, &l, "\"kind\" is not a node kind");
  if (!read_pass(x[N_PASS], &n->pass, &l, err) ||
      !read_purpose(x[N_PURPOSE], true, &n->purpose, &l, err))
    return false;

  for (int t = 0; t < IR_MAX_TAGS; t++)
    n->tags[t] = -1;
  if (!x[N_TAGS])
    return json_fail_at(err, &l, "missing key \"tags\"");
  if (!cJSON_IsObject(x[N_TAGS]))
    return json_fail_at(err, &l, "\"tags\" must be an object");
  for (const cJSON *c = x[N_TAGS]->child; c; c = c->next) {
    uint32_t t = 0;
    while (t < p->n_tags && !(c->string && strcmp(c->string, p->tag_names[t]) == 0))
      t++;
    if (t == p->n_tags)
      return json_fail_at(err, &l, "\"tags\": \"%s\" is not a tag of the plan",
                          c->string ? c->string : "");
    if (n->tags[t] != -1)
      return json_fail_at(err, &l, "\"tags\": \"%s\" appears twice", c->string);
    int64_t v;
    if (!json_value_int(c, c->string, 0, INT32_MAX, &v, &l, err))
      return false;
    n->tags[t] = (int32_t)v;
  }
  uint64_t bytes;
  int64_t shard, replica;
  if (!json_value_ref(x[N_GROUP], "group", p->n_groups, false, &n->group, &l, err) ||
      !json_value_ref(x[N_PEER_GROUP], "peer_group", p->n_groups, true, &n->peer_group, &l, err) ||
      !json_value_ref(x[N_STREAM], "stream", p->n_streams, false, &n->stream, &l, err) ||
      !json_value_ref(x[N_SEGMENT], "segment", p->model->n_segments, true, &n->segment, &l, err) ||
      !json_value_ref(x[N_SEGSET], "segset", p->n_segsets, true, &n->segset, &l, err) ||
      !json_value_ref(x[N_PAIR], "pair", p->n_nodes, true, &n->pair, &l, err) ||
      !json_value_u64(x[N_BYTES], "bytes", PLAN_MAX_BYTES, &bytes, &l, err) ||
      !json_value_int(x[N_SHARD_DEGREE], "shard_degree", 0, IR_MAX_DEVICES, &shard, &l, err) ||
      !json_value_int(x[N_REPLICA_DEGREE], "replica_degree", 0, IR_MAX_DEVICES, &replica, &l,
                      err) ||
      !read_zero_flags(x, n, &l, err) ||
      !json_value_ref(x[N_DIRECTIVE], "directive", PLAN_MAX_DIRECTIVE, true, &n->directive, &l,
                      err))
    return false;
  if (!read_hex(x[N_PRIORITY], "priority", &n->priority, &l, err))
    return false;
  n->bytes = bytes;
  n->shard_degree = (uint32_t)shard;
  n->replica_degree = (uint32_t)replica;
  if (!read_tensor_parallel(p, n, x[N_TP_DEGREE], x[N_SEQUENCE_PARALLEL], x[N_COLLECTIVES], &l,
                            err) ||
      !read_context_parallel(p, n, x[N_CP_DEGREE], x[N_CP_COMM], &l, err))
    return false;
  return read_capacity(n, x[N_CAPACITY_FACTOR], x[N_FP8_EXPERT_INPUTS], &l, err) &&
         read_expert_grid(n, x, &l, err) &&
         check_peer_group(p, n, &l, err);
}

/* "split" (tensor parallelism): absent, or 2 or more dividing the group, never on pp; a tp
 * communicator always has one. */
static bool read_comm_split(const struct plan *p, struct plan_comm *cm, const cJSON *v,
                            const cJSON *stride_v, const struct json_loc *l, GError **err) {
  int64_t split = 0;
  if (v && !json_value_int(v, "split", 2, IR_MAX_DEVICES, &split, l, err))
    return false;
  cm->split = (uint32_t)split;
  if (split && cm->purpose == IR_COMM_PP)
    return json_fail_at(err, l, "\"split\" must be absent for a pp communicator");
  if (split && p->groups[cm->group].count % (uint32_t)split != 0)
    return json_fail_at(err, l, "\"split\" %lld does not divide the %u devices of \"group\" %u",
                        (long long)split, p->groups[cm->group].count, cm->group);
  if (!split && (cm->purpose == IR_COMM_TP || cm->purpose == IR_COMM_CP))
    return json_fail_at(err, l, "a %s communicator needs a \"split\"",
                        plan_purpose_names[cm->purpose]);
  int64_t stride = 0;
  if (stride_v && !json_value_int(stride_v, "stride", 2, IR_MAX_DEVICES, &stride, l, err))
    return false;
  cm->stride = (uint32_t)stride;
  if (stride && (cm->purpose != IR_COMM_CP ||
                 p->groups[cm->group].count % ((uint32_t)stride * cm->split) != 0))
    return json_fail_at(err, l, "\"stride\" is for a cp communicator, and with \"split\" must "
                                "divide the %u devices of \"group\" %u",
                        p->groups[cm->group].count, cm->group);
  return true;
}

/* "block" (EP carved from the stage): absent, or on an ep communicator 2 or more dividing the
 * group, a multiple of its split. */
static bool read_comm_block(const struct plan *p, struct plan_comm *cm, const cJSON *v,
                            const struct json_loc *l, GError **err) {
  int64_t block = 0;
  if (v && !json_value_int(v, "block", 1, IR_MAX_DEVICES, &block, l, err))
    return false;
  cm->block = (uint32_t)block;
  if (block && cm->purpose != IR_COMM_EP)
    return json_fail_at(err, l, "\"block\" is for ep communicators only");
  if (block && (p->groups[cm->group].count % (uint32_t)block != 0 ||
                (cm->split > 1 && (uint32_t)block % cm->split != 0)))
    return json_fail_at(err, l, "\"block\" %lld does not divide the %u devices of \"group\" %u "
                                "or is no multiple of \"split\"",
                        (long long)block, p->groups[cm->group].count, cm->group);
  return true;
}

static bool read_nodes_comms(struct reader *r, const cJSON *const *k, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  const cJSON *c;
  uint32_t n;
  if (!json_value_array(k[I_NODES], "nodes", PLAN_MAX_COUNT, &c, &n, &l, err))
    return false;
  p->nodes = g_new0(struct ir_node, n ? n : 1);
  p->n_nodes = n;
  for (uint32_t i = 0; c; c = c->next, i++)
    if (!read_node(r, c, i, err))
      return false;

  if (!json_value_array(k[I_COMMS], "communicators", PLAN_MAX_COUNT, &c, &n, &l, err))
    return false;
  p->comms = g_new0(struct plan_comm, n ? n : 1);
  p->n_comms = n;
  for (uint32_t i = 0; c; c = c->next, i++) {
    struct json_loc lc = {r->index_file, "communicators", i, NULL, 0};
    static const char *const keys[] = {"id",         "name",  "purpose", "group",
                                       "peer_group", "split", "block", "stride"};
    const cJSON *x[8];
    const char *name;
    struct plan_comm *cm = &p->comms[i];
    if (!json_fetch(c, keys, 8, x, &lc, err) || !check_id(x[0], i, &lc, err) ||
        !json_value_string(x[1], "name", PLAN_NAME_LEN, &name, &lc, err) ||
        !read_purpose(x[2], false, &cm->purpose, &lc, err) ||
        !json_value_ref(x[3], "group", p->n_groups, false, &cm->group, &lc, err) ||
        !json_value_ref(x[4], "peer_group", p->n_groups, true, &cm->peer_group, &lc, err))
      return false;
    if (cm->purpose == IR_COMM_PP) {
      if (cm->peer_group == IR_NONE)
        return json_fail_at(err, &lc, "a pp communicator needs a \"peer_group\"");
      if (p->groups[cm->peer_group].count != p->groups[cm->group].count)
        return json_fail_at(err, &lc, "\"peer_group\" %u has %u devices, \"group\" %u has %u",
                            cm->peer_group, p->groups[cm->peer_group].count, cm->group,
                            p->groups[cm->group].count);
    } else if (cm->peer_group != IR_NONE) {
      return json_fail_at(err, &lc, "\"peer_group\" must be null for a %s communicator",
                          plan_purpose_names[cm->purpose]);
    }
    if (!read_comm_split(p, cm, x[5], x[7], &lc, err) || !read_comm_block(p, cm, x[6], &lc, err))
      return false;
  }
  return true;
}

static bool read_classes(struct reader *r, const cJSON *const *k, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  const cJSON *c;
  uint32_t n;
  if (!json_value_array(k[I_CLASSES], "classes", p->n_devices, &c, &n, &l, err))
    return false;
  p->classes = g_new0(struct plan_class, n ? n : 1);
  p->n_classes = r->n_classes = n;
  r->class_instrs = g_new0(uint32_t, n ? n : 1);
  r->class_source = g_new(uint32_t, n ? n : 1);
  r->class_comms = g_new0(uint32_t *, n ? n : 1);
  r->class_n_comms = g_new0(uint32_t, n ? n : 1);
  uint32_t *owner = g_new(uint32_t, p->n_devices);
  for (uint32_t d = 0; d < p->n_devices; d++)
    owner[d] = IR_NONE;
  bool ok = false;
  GArray *members = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  for (uint32_t i = 0; c; c = c->next, i++) {
    struct json_loc lc = {r->index_file, "classes", i, NULL, 0};
    static const char *const keys[] = {"id", "instructions", "devices"};
    const cJSON *x[3];
    r->class_source[i] = IR_NONE;
    g_array_set_size(members, 0);
    if (!json_fetch(c, keys, 3, x, &lc, err) || !check_id(x[0], i, &lc, err) ||
        !json_value_u32(x[1], "instructions", 0, PLAN_MAX_COUNT, &r->class_instrs[i], &lc, err) ||
        !read_refs(x[2], "devices", p->n_devices, members, &lc, err))
      goto out;
    if (members->len == 0) {
      json_fail_at(err, &lc, "\"devices\" is empty");
      goto out;
    }
    const uint32_t *m = (const uint32_t *)(void *)members->data;
    for (uint32_t j = 0; j < members->len; j++) {
      if (j > 0 && m[j] <= m[j - 1]) {
        json_fail_at(err, &lc, "\"devices\" must be ascending without repeats");
        goto out;
      }
      if (owner[m[j]] != IR_NONE) {
        json_fail_at(err, &lc, "device %u is also in class %u", m[j], owner[m[j]]);
        goto out;
      }
      owner[m[j]] = i;
    }
    p->classes[i].n_devices = members->len;
    p->classes[i].devices = g_memdup2(m, members->len * sizeof *m);
  }

  if (!json_value_array(k[I_DEVICE_CLASS], "device_class", IR_MAX_DEVICES, &c, &n, &l, err))
    goto out;
  if (n != p->n_devices) {
    json_fail_at(err, &l, "\"device_class\" has %u entries for %u devices", n, p->n_devices);
    goto out;
  }
  p->device_class = g_new(uint32_t, p->n_devices);
  for (uint32_t d = 0; c; c = c->next, d++) {
    struct json_loc ld = {r->index_file, "device_class", d, NULL, 0};
    if (!json_value_ref(c, "device_class", p->n_classes, false, &p->device_class[d], &ld, err))
      goto out;
    if (p->device_class[d] != owner[d]) {
      if (owner[d] == IR_NONE)
        json_fail_at(err, &ld, "device %u is in no class's \"devices\"", d);
      else
        json_fail_at(err, &ld, "device %u is listed in class %u", d, owner[d]);
      goto out;
    }
  }
  ok = true;
out:
  g_array_free(members, TRUE);
  g_free(owner);
  return ok;
}

static bool read_summary(struct reader *r, const cJSON *v, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  static const char *const keys[] = {"devices", "classes", "nodes", "instructions",
                                     "instructions_per_op"};
  const cJSON *x[5];
  int64_t devices, classes, nodes;
  if (!v)
    return json_fail_at(err, &l, "missing key \"summary\"");
  if (!json_fetch(v, keys, 5, x, &l, err) ||
      !json_value_int(x[0], "devices", 0, INT64_C(1) << 53, &devices, &l, err) ||
      !json_value_int(x[1], "classes", 0, INT64_C(1) << 53, &classes, &l, err) ||
      !json_value_int(x[2], "nodes", 0, INT64_C(1) << 53, &nodes, &l, err) ||
      !json_value_int(x[3], "instructions", 0, INT64_C(1) << 53, &r->sum_instrs, &l, err))
    return false;
  if (devices != p->n_devices || classes != p->n_classes || nodes != p->n_nodes)
    return json_fail_at(err, &l,
                        "\"summary\" counts (devices %lld, classes %lld, nodes %lld) differ "
                        "from the plan's (%u, %u, %u)",
                        (long long)devices, (long long)classes, (long long)nodes, p->n_devices,
                        p->n_classes, p->n_nodes);
  const char *kinds[IR_NODE_KIND_COUNT];
  const cJSON *y[IR_NODE_KIND_COUNT];
  for (int k = 0; k < IR_NODE_KIND_COUNT; k++)
    kinds[k] = ir_node_kind_name((enum ir_node_kind)k);
  if (!x[4])
    return json_fail_at(err, &l, "\"summary\": missing key \"instructions_per_op\"");
  if (!json_fetch(x[4], kinds, IR_NODE_KIND_COUNT, y, &l, err))
    return false;
  for (int k = 0; k < IR_NODE_KIND_COUNT; k++)
    if (!json_value_int(y[k], kinds[k], 0, INT64_C(1) << 53, &r->sum_per_op[k], &l, err))
      return false;
  return true;
}

static bool reader_index(struct reader *r, const cJSON *index, GError **err) {
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  const cJSON *k[I_COUNT];
  if (!json_fetch(index, index_keys, I_COUNT, k, &l, err) ||
      !check_format(k[I_FORMAT], k[I_VERSION], PLAN_FORMAT, &l, err))
    return false;
  struct plan *p = r->p = g_new0(struct plan, 1);
  if (k[I_LAYOUT]) {
    if (!expect_string(k[I_LAYOUT], "layout", PLAN_LAYOUT_CLASSES, &l, err))
      return false;
    r->by_class = true;
  }
  if (!read_model(r, k, err) ||
      !json_value_u32(k[I_N_DEVICES], "n_devices", 1, IR_MAX_DEVICES, &p->n_devices, &l, err) ||
      !json_value_u32(k[I_N_MICROBATCHES], "n_microbatches", 1, PLAN_MAX_MICROBATCHES,
                      &p->n_microbatches, &l, err) ||
      !read_tags_streams(r, k, err) || !read_groups_segsets(r, k, err) ||
      !read_nodes_comms(r, k, err) || !plan_check_model(p, r->index_file, err) ||
      !read_classes(r, k, err) ||
      !read_summary(r, k[I_SUMMARY], err))
    return false;
  plan_index_positions(p);
  r->seq_next = g_new0(uint32_t, 2 * (size_t)(p->n_comms ? p->n_comms : 1));
  return true;
}

/* --- reading device files ------------------------------------------------------------------ */

enum { D_FORMAT, D_VERSION, D_DEVICE, D_CLASS, D_GROUPS, D_COMMS, D_STREAMS, D_TENSORS, D_COUNT };
static const char *const device_keys[D_COUNT] = {"format", "version",       "device",  "class",
                                                 "groups", "communicators", "streams", "tensors"};

enum {
  X_I,
  X_OP,
  X_NODE,
  X_NAME,
  X_PASS,
  X_COMM,
  X_SEQ,
  X_BYTES,
  X_WAITS,
  X_READS,
  X_WRITES,
  X_RANK,
  X_PEER,
  X_GROUP,
  X_COUNT
};
static const char *const instr_keys[X_COUNT] = {"i",      "op",   "node",  "name",  "pass",
                                                "comm",   "seq",  "bytes", "waits", "reads",
                                                "writes", "rank", "peer",  "group"};

static bool list_has(const uint32_t *pool, uint32_t first, uint32_t count, uint32_t v) {
  for (uint32_t k = 0; k < count; k++)
    if (pool[first + k] == v)
      return true;
  return false;
}

/* The communicator fields of instruction in (node nd) of device d. */
static bool read_instr_comm(struct reader *r, uint32_t d, const cJSON *const *x,
                            const struct ir_node *nd, struct plan_instr *in, uint32_t n_instrs,
                            const struct json_loc *l, GError **err) {
  struct plan *p = r->p;
  /* Lowering gives every node that serves a purpose (pp, dp, ep) a communicator. */
  if (nd->purpose == IR_COMM_NONE) {
    static const int absent[] = {X_COMM, X_SEQ, X_RANK};
    for (size_t k = 0; k < G_N_ELEMENTS(absent); k++)
      if (x[absent[k]])
        return json_fail_at(err, l, "\"%s\" is set, but node %u uses no communicator",
                            instr_keys[absent[k]], in->node);
    in->comm = in->seq = IR_NONE;
    return true;
  }
  if (!json_value_ref(x[X_COMM], "comm", p->n_comms, false, &in->comm, l, err))
    return false;
  const struct plan_comm *cm = &p->comms[in->comm];
  if (cm->purpose != nd->purpose)
    return json_fail_at(err, l, "communicator %u is a %s communicator, node %u needs %s", in->comm,
                        plan_purpose_names[cm->purpose], in->node,
                        nd->purpose < IR_COMM_PURPOSE_COUNT ? plan_purpose_names[nd->purpose]
                                                            : "?");
  if (cm->purpose == IR_COMM_CP) {
    if (cm->split != nd->cp_degree || cm->stride != (nd->tp_degree > 1 ? nd->tp_degree : 0))
      return json_fail_at(err, l, "communicator %u has \"split\" %u and \"stride\" %u, node %u "
                                  "has \"cp_degree\" %u and \"tp_degree\" %u",
                          in->comm, cm->split, cm->stride, in->node, nd->cp_degree,
                          nd->tp_degree);
  } else if (cm->purpose != IR_COMM_PP &&
             cm->split != (nd->tp_degree > 1 ? nd->tp_degree : 0))
    return json_fail_at(err, l, "communicator %u has \"split\" %u, node %u has \"tp_degree\" %u",
                        in->comm, cm->split, in->node, nd->tp_degree);
  uint32_t pair[2];
  int side = plan_comm_side(nd);
  int32_t rank = plan_device_comm_rank(p, d, in->comm, side, pair);
  if (rank < 0)
    return json_fail_at(err, l, "device %u is not a member of communicator %u", d, in->comm);
  int64_t written;
  if (!json_value_int(x[X_RANK], "rank", 0, IR_MAX_DEVICES, &written, l, err))
    return false;
  if (written != rank)
    return json_fail_at(err, l, "\"rank\" is %lld, but device %u has rank %d on communicator %u",
                        (long long)written, d, rank, in->comm);
  if ((nd->kind == IR_NODE_SEND || nd->kind == IR_NODE_RECV) && cm->purpose == IR_COMM_PP &&
      plan_device_peer(p, d, nd) != pair[rank ^ 1])
    return json_fail_at(err, l,
                        "node %u talks to device %u, which is not the other end of "
                        "communicator %u (devices %u -> %u)",
                        in->node, plan_device_peer(p, d, nd), in->comm, pair[0], pair[1]);
  if (!json_value_ref(x[X_SEQ], "seq", n_instrs, false, &in->seq, l, err))
    return false;
  /* seq numbers the device's instructions on one end of a communicator in issue order; a gap
   * or a repeat is refused here (members that disagree would deadlock). */
  uint32_t *next = &r->seq_next[2 * (size_t)in->comm + (uint32_t)side];
  if (in->seq != *next)
    return json_fail_at(err, l,
                        "\"seq\" is %u, but this is instruction %u of device %u on "
                        "communicator %u",
                        in->seq, *next, d, in->comm);
  (*next)++;
  return true;
}

/* What one device's program is read into before it becomes a class: the records in issue
 * order, their place in the file, and the pools, laid out in issue order as lowering does. */
struct program_read {
  uint32_t d, n, nt;  /* device, instructions, tensors */
  const cJSON **recs; /* [n]: instruction i's record */
  uint32_t *at;       /* [n]: position of instruction i in its stream list */
  GArray *waits, *reads, *writes, *consumers;
};

static void program_read_free(struct program_read *pr) {
  if (pr->waits)
    g_array_free(pr->waits, TRUE);
  if (pr->reads)
    g_array_free(pr->reads, TRUE);
  if (pr->writes)
    g_array_free(pr->writes, TRUE);
  if (pr->consumers)
    g_array_free(pr->consumers, TRUE);
  g_free(pr->recs);
  g_free(pr->at);
}

/* The stream and tensor lists; counts what the file lists before anything is allocated for
 * the count the index declares. */
static bool read_program_lists(struct reader *r, uint32_t cls, const cJSON *const *k,
                               const cJSON **sfirst, const cJSON **tfirst, uint32_t *nt,
                               const struct json_loc *l, GError **err) {
  struct plan *p = r->p;
  uint32_t ns, n = r->class_instrs[cls];
  if (!json_value_array(k[D_TENSORS], "tensors", PLAN_MAX_COUNT, tfirst, nt, l, err) ||
      !json_value_array(k[D_STREAMS], "streams", PLAN_MAX_STREAMS, sfirst, &ns, l, err))
    return false;
  if (ns != p->n_streams)
    return json_fail_at(err, l, "\"streams\" has %u entries, plan.json declares %u streams", ns,
                        p->n_streams);
  uint64_t listed = 0;
  for (const cJSON *x = *sfirst; x; x = x->next) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(x, "instructions");
    for (const cJSON *y = cJSON_IsArray(list) ? list->child : NULL; y; y = y->next)
      listed++;
  }
  if (listed != n)
    return json_fail_at(err, l, "lists %llu instructions, plan.json says class %u has %u",
                        (unsigned long long)listed, cls, n);
  return true;
}

/* Stream s's record: notes where each of its instructions is listed and appends them to the
 * class's stream lists. *filled counts the instructions placed so far. */
static bool read_stream_list(struct reader *r, struct program_read *pr, struct plan_class *c,
                             uint32_t s, const cJSON *srec, uint32_t *filled,
                             const struct json_loc *l, GError **err) {
  struct json_loc ls = {l->ctx, "streams", s, NULL, 0};
  static const char *const keys[] = {"stream", "name", "instructions"};
  const cJSON *x[3], *irec;
  uint32_t sid, ni, ns = r->p->n_streams;
  char want[IR_NAME_MAX + 1];
  plan_copy_name(want, r->p->streams[s].name, IR_NAME_MAX);
  if (!json_fetch(srec, keys, 3, x, &ls, err) ||
      !json_value_ref(x[0], "stream", ns, false, &sid, &ls, err))
    return false;
  if (sid != s)
    return json_fail_at(err, &ls, "\"stream\" is %u, expected %u (streams are listed in order)",
                        sid, s);
  if (!expect_string(x[1], "name", want, &ls, err) ||
      !json_value_array(x[2], "instructions", PLAN_MAX_COUNT, &irec, &ni, &ls, err))
    return false;
  c->stream_first[s] = *filled;
  uint32_t prev = IR_NONE;
  for (uint32_t kk = 0; irec; irec = irec->next, kk++) {
    struct json_loc li = {l->ctx, "streams", s, "instructions", kk};
    uint32_t i;
    if (!cJSON_IsObject(irec))
      return json_fail_at(err, &li, "expected an object");
    if (!json_value_ref(cJSON_GetObjectItemCaseSensitive(irec, "i"), "i", pr->n, false, &i, &li,
                        err))
      return false;
    if (pr->recs[i])
      return json_fail_at(err, &li, "instruction %u is listed twice", i);
    if (prev != IR_NONE && i < prev)
      return json_fail_at(err, &li,
                          "\"i\" is %u after %u: a stream lists its instructions in issue order", i,
                          prev);
    prev = i;
    pr->recs[i] = irec;
    pr->at[i] = kk;
    c->instrs[i].stream = s;
    c->stream_instrs[(*filled)++] = i;
  }
  return true;
}

/* First pass over the streams: where each issue index is listed, so the second pass can go in
 * issue order and lay out the pools the way lowering does. */
static bool read_stream_lists(struct reader *r, struct program_read *pr, struct plan_class *c,
                              uint32_t cls, const cJSON *sfirst, const struct json_loc *l,
                              GError **err) {
  uint32_t filled = 0, ns = r->p->n_streams;
  const cJSON *srec = sfirst;
  for (uint32_t s = 0; s < ns; s++, srec = srec->next)
    if (!read_stream_list(r, pr, c, s, srec, &filled, l, err))
      return false;
  c->stream_first[ns] = filled;
  if (filled != pr->n)
    return json_fail_at(err, l, "lists %u instructions, plan.json says class %u has %u", filled,
                        cls, pr->n);
  return true;
}

/* The fields an instruction repeats from its node (op, pass, bytes) must agree with it. */
static bool check_instr_node(const struct ir_node *nd, uint32_t node, const cJSON *const *x,
                             const struct json_loc *li, GError **err) {
  uint64_t bytes;
  if (!expect_string(x[X_OP], "op", ir_node_kind_name(nd->kind), li, err))
    return false;
  if (nd->pass == IR_PASS_NONE) {
    if (!x[X_PASS] || !cJSON_IsNull(x[X_PASS]))
      return json_fail_at(err, li, "\"pass\" must be null: node %u has no pass", node);
  } else if (!expect_string(x[X_PASS], "pass", ir_pass_name(nd->pass), li, err)) {
    return false;
  }
  if (!json_value_u64(x[X_BYTES], "bytes", PLAN_MAX_BYTES, &bytes, li, err))
    return false;
  if (bytes != nd->bytes)
    return json_fail_at(err, li, "\"bytes\" is %llu, but node %u has %llu",
                        (unsigned long long)bytes, node, (unsigned long long)nd->bytes);
  return true;
}

/* A send or recv names the device at the other end; nothing else has a peer. */
static bool check_instr_peer(const struct plan *p, uint32_t d, const struct ir_node *nd,
                             uint32_t node, const cJSON *const *x, const struct json_loc *li,
                             GError **err) {
  if (nd->kind != IR_NODE_SEND && nd->kind != IR_NODE_RECV) {
    if (x[X_PEER])
      return json_fail_at(err, li, "\"peer\" is set, but a %s has no peer",
                          ir_node_kind_name(nd->kind));
    return true;
  }
  uint32_t peer;
  if (!json_value_ref(x[X_PEER], "peer", p->n_devices, true, &peer, li, err))
    return false;
  if (peer != plan_device_peer(p, d, nd))
    return json_fail_at(err, li, "\"peer\" is %u, but device %u's peer on node %u is %u", peer, d,
                        node, plan_device_peer(p, d, nd));
  return true;
}

/* Waits, reads and writes go to the pools. Issue order is a topological order, so an
 * instruction waits only on earlier ones. */
static bool read_instr_lists(struct program_read *pr, uint32_t i, struct plan_instr *in,
                             const cJSON *const *x, const struct json_loc *li, GError **err) {
  in->wait_first = pr->waits->len;
  if (!read_refs(x[X_WAITS], "waits", i, pr->waits, li, err))
    return false;
  in->wait_count = pr->waits->len - in->wait_first;
  in->read_first = pr->reads->len;
  if (!read_refs(x[X_READS], "reads", pr->nt, pr->reads, li, err))
    return false;
  in->read_count = pr->reads->len - in->read_first;
  in->write_first = pr->writes->len;
  if (!read_refs(x[X_WRITES], "writes", pr->nt, pr->writes, li, err))
    return false;
  in->write_count = pr->writes->len - in->write_first;
  return true;
}

/* "group": the number of parts of the point-to-point group a send or receive belongs to;
 * absent when it is issued alone. */
static bool read_instr_group(const struct ir_node *nd, struct plan_instr *in, const cJSON *const *x,
                             const struct json_loc *li, GError **err) {
  in->group_parts = 0;
  if (!x[X_GROUP])
    return true;
  if (nd->kind != IR_NODE_SEND && nd->kind != IR_NODE_RECV)
    return json_fail_at(err, li, "\"group\" is set, but a %s is not issued in a group",
                        ir_node_kind_name(nd->kind));
  int64_t parts;
  if (!json_value_int(x[X_GROUP], "group", 2, PLAN_MAX_COUNT, &parts, li, err))
    return false;
  in->group_parts = (uint32_t)parts;
  return true;
}

/* Instruction i, in issue order. */
static bool read_instr(struct reader *r, struct program_read *pr, struct plan_class *c, uint32_t i,
                       const struct json_loc *l, GError **err) {
  const struct plan *p = r->p;
  uint32_t d = pr->d;
  struct json_loc li = {l->ctx, "streams", c->instrs[i].stream, "instructions", pr->at[i]};
  struct plan_instr *in = &c->instrs[i];
  const cJSON *x[X_COUNT];
  const char *name;
  if (!json_fetch(pr->recs[i], instr_keys, X_COUNT, x, &li, err) ||
      !json_value_ref(x[X_NODE], "node", p->n_nodes, false, &in->node, &li, err) ||
      !json_value_string(x[X_NAME], "name", PLAN_NAME_LEN, &name, &li, err))
    return false;
  const struct ir_node *nd = &p->nodes[in->node];
  if (plan_group_position(p, nd->group, d) < 0)
    return json_fail_at(err, &li, "device %u is not in group %u, which runs node %u", d, nd->group,
                        in->node);
  return check_instr_node(nd, in->node, x, &li, err) &&
         read_instr_comm(r, d, x, nd, in, pr->n, &li, err) &&
         check_instr_peer(p, d, nd, in->node, x, &li, err) &&
         read_instr_group(nd, in, x, &li, err) && read_instr_lists(pr, i, in, x, &li, err);
}

/* Each stream list must split into whole groups: a part heading n - 1 others of its group. */
static bool check_groups(const struct plan_class *c, uint32_t n_streams, const struct json_loc *l,
                         GError **err) {
  for (uint32_t s = 0; s < n_streams; s++)
    for (uint32_t e = c->stream_first[s]; e < c->stream_first[s + 1];) {
      uint32_t n = plan_group_span(c, e);
      for (uint32_t k = 1; k < n; k++)
        if (e + k >= c->stream_first[s + 1] || c->instrs[c->stream_instrs[e + k]].group_parts != n)
          return json_fail_at(err, l,
                              "instruction %u begins a group of %u on stream %u, but the next %u "
                              "instructions of that stream are not all its parts",
                              c->stream_instrs[e], n, s, n - 1);
      e += n;
    }
  return true;
}

/* Producer and consumers must name the tensor, so lifetimes computed either way agree. */
static bool check_tensor_links(const struct plan_class *c, const struct program_read *pr,
                               uint32_t t, const struct json_loc *lt, GError **err) {
  const struct plan_tensor *tn = &c->tensors[t];
  const struct plan_instr *producer = &c->instrs[tn->producer];
  if (!list_has(c->writes, producer->write_first, producer->write_count, t))
    return json_fail_at(err, lt, "its producer, instruction %u, does not list it in \"writes\"",
                        tn->producer);
  for (uint32_t j = tn->consumer_first; j < pr->consumers->len; j++) {
    uint32_t u = g_array_index(pr->consumers, uint32_t, j);
    if (u <= tn->producer)
      return json_fail_at(err, lt, "consumer %u does not come after its producer %u", u,
                          tn->producer);
    if (!list_has(c->reads, c->instrs[u].read_first, c->instrs[u].read_count, t))
      return json_fail_at(err, lt, "its consumer, instruction %u, does not list it in \"reads\"",
                          u);
  }
  return true;
}

/* The memory rule's points: allocated no later than written, released no earlier than the
 * last use (struct plan_tensor). */
static bool check_tensor_points(const struct plan_class *c, const struct program_read *pr,
                                uint32_t t, const struct json_loc *lt, GError **err) {
  const struct plan_tensor *tn = &c->tensors[t];
  if (tn->kind == PLAN_TENSOR_WORK &&
      (pr->consumers->len > tn->consumer_first || tn->alloc != tn->producer ||
       tn->release != tn->producer))
    return json_fail_at(err, lt, "a \"work\" tensor lives within its producer: no consumers, "
                                 "\"alloc\" and \"release\" equal to \"producer\"");
  if (tn->alloc > tn->producer)
    return json_fail_at(err, lt, "\"alloc\" %u comes after its producer %u", tn->alloc,
                        tn->producer);
  if (tn->release < tn->producer)
    return json_fail_at(err, lt, "\"release\" %u comes before its producer %u", tn->release,
                        tn->producer);
  for (uint32_t j = tn->consumer_first; j < pr->consumers->len; j++) {
    uint32_t u = g_array_index(pr->consumers, uint32_t, j);
    if (u > tn->release)
      return json_fail_at(err, lt, "\"release\" %u comes before its consumer %u", tn->release, u);
  }
  return true;
}

static bool read_tensor(struct program_read *pr, struct plan_class *c, uint32_t t,
                        const cJSON *trec, const struct json_loc *l, GError **err) {
  struct json_loc lt = {l->ctx, "tensors", t, NULL, 0};
  static const char *const keys[] = {"id",        "bytes", "kind",   "producer",
                                     "consumers", "alloc", "release"};
  const cJSON *x[7];
  struct plan_tensor *tn = &c->tensors[t];
  if (!json_fetch(trec, keys, 7, x, &lt, err) || !check_id(x[0], t, &lt, err) ||
      !json_value_u64(x[1], "bytes", PLAN_MAX_BYTES, &tn->bytes, &lt, err))
    return false;
  if (!x[2])
    return json_fail_at(err, &lt, "missing key \"kind\"");
  if (cJSON_IsString(x[2]) && strcmp(x[2]->valuestring, "out") == 0)
    tn->kind = PLAN_TENSOR_OUT;
  else if (cJSON_IsString(x[2]) && strcmp(x[2]->valuestring, "saved") == 0)
    tn->kind = PLAN_TENSOR_SAVED;
  else if (cJSON_IsString(x[2]) && strcmp(x[2]->valuestring, "work") == 0)
    tn->kind = PLAN_TENSOR_WORK;
  else
    return json_fail_at(err, &lt, "\"kind\" must be \"out\", \"saved\" or \"work\"");
  tn->consumer_first = pr->consumers->len;
  if (!json_value_ref(x[3], "producer", pr->n, false, &tn->producer, &lt, err) ||
      !read_refs(x[4], "consumers", pr->n, pr->consumers, &lt, err))
    return false;
  tn->consumer_count = pr->consumers->len - tn->consumer_first;
  if (!json_value_ref(x[5], "alloc", pr->n, false, &tn->alloc, &lt, err) ||
      !json_value_ref(x[6], "release", pr->n, false, &tn->release, &lt, err))
    return false;
  return check_tensor_links(c, pr, t, &lt, err) && check_tensor_points(c, pr, t, &lt, err);
}

/* A device runs each node of its plan once: an instruction edited to run another's node would
 * run that node twice and its own never. */
static bool check_nodes_once(const struct plan *p, const struct plan_class *c,
                             const struct json_loc *l, GError **err) {
  GHashTable *seen = g_hash_table_new(g_direct_hash, g_direct_equal);
  bool ok = true;
  for (uint32_t i = 0; ok && i < c->n_instrs; i++) {
    gpointer key = GUINT_TO_POINTER(c->instrs[i].node + 1);
    if (g_hash_table_contains(seen, key)) {
      char name[PLAN_NAME_LEN];
      plan_node_name(p, c->instrs[i].node, name, sizeof name);
      ok = json_fail_at(err, l, "node %u \"%s\" is run by two instructions", c->instrs[i].node,
                        name);
    }
    g_hash_table_add(seen, key);
  }
  g_hash_table_destroy(seen);
  return ok;
}

/* Reads one device's program into c (a fresh class without members): the stream lists, then
 * every instruction in issue order, then the tensors (which refer back to both). */
static bool read_program(struct reader *r, uint32_t d, const cJSON *const *k, struct plan_class *c,
                         const struct json_loc *l, GError **err) {
  uint32_t cls = r->p->device_class[d], n = r->class_instrs[cls], ns = r->p->n_streams;
  const cJSON *tfirst, *sfirst;
  uint32_t nt;
  if (!read_program_lists(r, cls, k, &sfirst, &tfirst, &nt, l, err))
    return false;
  struct program_read pr = {.d = d,
                            .n = n,
                            .nt = nt,
                            .recs = g_new0(const cJSON *, n ? n : 1),
                            .at = g_new(uint32_t, n ? n : 1),
                            .waits = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                            .reads = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                            .writes = g_array_new(FALSE, FALSE, sizeof(uint32_t)),
                            .consumers = g_array_new(FALSE, FALSE, sizeof(uint32_t))};
  bool ok = false;
  c->n_instrs = n;
  c->instrs = g_new0(struct plan_instr, n ? n : 1);
  c->stream_first = g_new0(uint32_t, (size_t)ns + 1);
  c->stream_instrs = g_new(uint32_t, n ? n : 1);
  if (!read_stream_lists(r, &pr, c, cls, sfirst, l, err))
    goto out;
  for (uint32_t i = 0; i < n; i++)
    if (!read_instr(r, &pr, c, i, l, err))
      goto out;
  if (!check_groups(c, ns, l, err) || !check_nodes_once(r->p, c, l, err))
    goto out;
  c->waits = take_pool(pr.waits, &c->n_waits);
  c->reads = take_pool(pr.reads, &c->n_reads);
  c->writes = take_pool(pr.writes, &c->n_writes);
  pr.waits = pr.reads = pr.writes = NULL;
  c->n_tensors = nt;
  c->tensors = g_new0(struct plan_tensor, nt ? nt : 1);
  const cJSON *trec = tfirst;
  for (uint32_t t = 0; t < nt; t++, trec = trec->next)
    if (!read_tensor(&pr, c, t, trec, l, err))
      goto out;
  c->consumers = take_pool(pr.consumers, &c->n_consumers);
  pr.consumers = NULL;
  ok = true;
out:
  program_read_free(&pr);
  return ok;
}

/* Checks the device-specific lists a device file repeats: its groups and communicators. */
static bool read_device_views(struct reader *r, uint32_t d, const cJSON *const *k,
                              const struct json_loc *l, GError **err) {
  struct plan *p = r->p;
  const struct plan_positions *t = &p->positions;
  const cJSON *c;
  uint32_t n, want = t->first[d + 1] - t->first[d];
  if (!json_value_array(k[D_GROUPS], "groups", PLAN_MAX_COUNT, &c, &n, l, err))
    return false;
  if (n != want)
    return json_fail_at(err, l, "\"groups\" has %u entries, but device %u is in %u groups", n, d,
                        want);
  for (uint32_t j = 0; c; c = c->next, j++) {
    struct json_loc lg = {l->ctx, "groups", j, NULL, 0};
    static const char *const keys[] = {"group", "position"};
    const cJSON *x[2];
    int64_t g, pos;
    uint32_t e = t->first[d] + j;
    if (!json_fetch(c, keys, 2, x, &lg, err) ||
        !json_value_int(x[0], "group", 0, UINT32_MAX, &g, &lg, err) ||
        !json_value_int(x[1], "position", 0, UINT32_MAX, &pos, &lg, err))
      return false;
    if ((uint32_t)g != t->group[e] || (uint32_t)pos != t->rank[e])
      return json_fail_at(err, &lg, "expected group %u, position %u (from plan.json)", t->group[e],
                          t->rank[e]);
  }
  uint32_t cls = p->device_class[d];
  uint32_t nc = r->class_n_comms[cls];
  if (!json_value_array(k[D_COMMS], "communicators", PLAN_MAX_COUNT, &c, &n, l, err))
    return false;
  if (n != nc)
    return json_fail_at(err, l, "\"communicators\" has %u entries, but the program uses %u", n, nc);
  for (uint32_t j = 0; c; c = c->next, j++) {
    struct json_loc lc = {l->ctx, "communicators", j, NULL, 0};
    static const char *const keys[] = {"id", "name", "size", "rank", "members"};
    const cJSON *x[5];
    uint32_t id = r->class_comms[cls][j], pair[2];
    int64_t written_id, size, rank;
    const char *name;
    if (!json_fetch(c, keys, 5, x, &lc, err) ||
        !json_value_int(x[0], "id", 0, UINT32_MAX, &written_id, &lc, err))
      return false;
    if ((uint32_t)written_id != id)
      return json_fail_at(err, &lc,
                          "\"id\" is %lld, expected %u (the communicators the program uses, "
                          "ascending)",
                          (long long)written_id, id);
    int32_t want_rank = plan_device_comm_rank(p, d, id, -1, pair);
    if (!json_value_string(x[1], "name", PLAN_NAME_LEN, &name, &lc, err) ||
        !json_value_int(x[2], "size", 0, UINT32_MAX, &size, &lc, err) ||
        !json_value_int(x[3], "rank", 0, UINT32_MAX, &rank, &lc, err))
      return false;
    if ((uint32_t)size != plan_comm_size(p, id) || rank != want_rank)
      return json_fail_at(err, &lc, "\"size\" %lld and \"rank\" %lld, expected %u and %d",
                          (long long)size, (long long)rank, plan_comm_size(p, id), want_rank);
    if (p->comms[id].purpose == IR_COMM_PP) {
      const cJSON *m = x[4];
      if (!m)
        return json_fail_at(err, &lc, "missing key \"members\"");
      if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !json_is_whole(m->child) ||
          !json_is_whole(m->child->next) || m->child->valuedouble != pair[0] ||
          m->child->next->valuedouble != pair[1])
        return json_fail_at(err, &lc, "\"members\" must be [%u, %u]", pair[0], pair[1]);
    } else if (x[4]) {
      return json_fail_at(err, &lc, "\"members\" is only listed for pp communicators");
    }
  }
  return true;
}

/* The name of the file that holds document k: device k's, or class k's in the compact layout. */
static char *doc_file_name(const struct reader *r, uint32_t k) {
  char file_name[48];
  snprintf(file_name, sizeof file_name, "%s-%u.json", r->by_class ? "class" : "device", k);
  return g_build_filename(r->dir, file_name, NULL);
}

/* The device whose program document k holds: k itself, or class k's first member. */
static uint32_t doc_device(const struct reader *r, uint32_t k) {
  return r->by_class ? r->p->classes[k].devices[0] : k;
}

/* How many documents the plan's layout has: one per device, or one per class. */
static uint32_t doc_count(const struct reader *r) {
  return r->by_class ? r->p->n_classes : r->p->n_devices;
}

/* Reads document k (device file or class file) of the layout. */
static bool reader_device(struct reader *r, uint32_t doc_index, const cJSON *doc, GError **err) {
  struct plan *p = r->p;
  uint32_t d = doc_device(r, doc_index);
  char *file = doc_file_name(r, doc_index);
  struct json_loc l = {file, NULL, 0, NULL, 0};
  struct plan_class tmp = {0};
  const cJSON *k[D_COUNT];
  uint32_t dev, cls;
  bool ok = false;
  if (!json_fetch(doc, device_keys, D_COUNT, k, &l, err) ||
      !check_format(k[D_FORMAT], k[D_VERSION], PLAN_DEVICE_FORMAT, &l, err) ||
      !json_value_u32(k[D_DEVICE], "device", 0, IR_MAX_DEVICES, &dev, &l, err))
    goto out;
  if (dev != d) {
    json_fail_at(err, &l, "\"device\" is %u, but this is the file of device %u%s", dev, d,
                 r->by_class ? " (its class's first member)" : "");
    goto out;
  }
  if (!json_value_ref(k[D_CLASS], "class", p->n_classes, false, &cls, &l, err))
    goto out;
  if (cls != p->device_class[d]) {
    json_fail_at(err, &l, "\"class\" differs from plan.json's device_class[%u]", d);
    goto out;
  }
  bool read = read_program(r, d, k, &tmp, &l, err);
  /* seq_next is scratch for one device: clear what it touched. */
  for (uint32_t i = 0; i < tmp.n_instrs; i++) {
    uint32_t comm = tmp.instrs[i].comm;
    if (comm < p->n_comms)
      r->seq_next[2 * (size_t)comm] = r->seq_next[2 * (size_t)comm + 1] = 0;
  }
  if (!read)
    goto out;
  struct plan_class *dst = &p->classes[cls];
  if (r->class_source[cls] == IR_NONE) {
    /* The first member defines the class; the index already gave its member list. */
    uint32_t n_devices = dst->n_devices, *devices = dst->devices;
    *dst = tmp;
    dst->n_devices = n_devices;
    dst->devices = devices;
    memset(&tmp, 0, sizeof tmp);
    r->class_source[cls] = d;
    r->class_comms[cls] = plan_class_comms(dst, &r->class_n_comms[cls]);
  } else {
    char what[96];
    if (!plan_class_diff(dst, &tmp, p->n_streams, what, sizeof what)) {
      json_fail_at(err, &l, "its program differs from device %u's (both in class %u) at %s",
                   r->class_source[cls], cls, what);
      goto out;
    }
  }
  if (!read_device_views(r, d, k, &l, err))
    goto out;
  ok = true;
out:
  plan_class_clear(&tmp);
  g_free(file);
  return ok;
}

/* Checks what needs every device read, then the progress check; the plan moves to the caller. */
static struct plan *reader_finish(struct reader *r, GError **err) {
  struct plan *p = r->p;
  struct json_loc l = {r->index_file, NULL, 0, NULL, 0};
  for (uint32_t c = 0; c < p->n_classes; c++)
    if (r->class_source[c] == IR_NONE) {
      json_fail_at(err, &l, "class %u: no device file read", c);
      return NULL;
    }
  int64_t per_op[IR_NODE_KIND_COUNT] = {0};
  for (uint32_t c = 0; c < p->n_classes; c++)
    for (uint32_t i = 0; i < p->classes[c].n_instrs; i++)
      per_op[p->nodes[p->classes[c].instrs[i].node].kind] += p->classes[c].n_devices;
  if ((uint64_t)r->sum_instrs != plan_instruction_count(p)) {
    json_fail_at(err, &l, "\"summary\": \"instructions\" is %lld, the device files hold %llu",
                 (long long)r->sum_instrs, (unsigned long long)plan_instruction_count(p));
    return NULL;
  }
  for (int k = 0; k < IR_NODE_KIND_COUNT; k++)
    if (per_op[k] != r->sum_per_op[k]) {
      json_fail_at(err, &l,
                   "\"summary\": \"instructions_per_op\" \"%s\" is %lld, the device files "
                   "hold %lld",
                   ir_node_kind_name((enum ir_node_kind)k), (long long)r->sum_per_op[k],
                   (long long)per_op[k]);
      return NULL;
    }
  if (!plan_check_instructions(p, r->index_file, err))
    return NULL;
  if (!plan_check_progress(p, err)) {
    g_prefix_error(err, "%s: ", r->dir);
    return NULL;
  }
  r->p = NULL;
  return p;
}

/* Device document k, refusing duplicate keys first (both readers do, so a plan read from
 * memory reads back from the files it writes). */
static bool reader_device_doc(struct reader *r, uint32_t k, const cJSON *doc, GError **err) {
  char *path = doc_file_name(r, k);
  bool ok = json_refuse_duplicate_keys(doc, path, err);
  g_free(path);
  return ok && reader_device(r, k, doc, err);
}

struct plan *plan_from_json(const char *name, const cJSON *index, const cJSON *const *device_docs,
                            uint32_t n_docs, GError **err) {
  struct reader *r = reader_new(name);
  struct plan *p = NULL;
  /* Duplicate keys are refused here as plan_read_dir refuses them in the files, so a plan
   * that reads from memory also reads back from the files it writes. */
  if (!json_refuse_duplicate_keys(index, r->index_file, err) || !reader_index(r, index, err))
    goto out;
  if (n_docs != doc_count(r)) {
    piper_input_error(err, "%s: %u device documents for %u %s", r->index_file, n_docs,
                      doc_count(r), r->by_class ? "classes" : "devices");
    goto out;
  }
  for (uint32_t d = 0; d < n_docs; d++)
    if (!reader_device_doc(r, d, device_docs[d], err))
      goto out;
  p = reader_finish(r, err);
out:
  reader_free(r);
  return p;
}

struct plan *plan_read_dir(const char *dir, GError **err) {
  struct reader *r = reader_new(dir);
  struct plan *p = NULL;
  cJSON *index = json_parse_file(r->index_file, err);
  if (!index)
    goto out;
  bool ok = json_refuse_duplicate_keys(index, r->index_file, err) && reader_index(r, index, err);
  cJSON_Delete(index);
  if (!ok)
    goto out;
  for (uint32_t k = 0; k < doc_count(r); k++) {
    char *path = doc_file_name(r, k);
    cJSON *doc = json_parse_file(path, err);
    g_free(path);
    if (!doc)
      goto out;
    ok = reader_device_doc(r, k, doc, err);
    cJSON_Delete(doc);
    if (!ok)
      goto out;
  }
  p = reader_finish(r, err);
out:
  reader_free(r);
  return p;
}
