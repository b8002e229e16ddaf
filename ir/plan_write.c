/* plan_write: plans to a directory of JSON files (docs/design.md, "The plan contract");
 * plan_read.c reads them back.
 *
 * dir/plan.json holds everything devices share (model config, program, tags, streams, groups,
 * segment sets, nodes, communicators, classes); dir/device-<d>.json holds one device's program:
 * per stream its instructions in issue order, its tensors, and what is particular to the device
 * (its positions in groups, its peers and communicator ranks). Plans of more than
 * PLAN_DEVICE_FILES_MAX devices write dir/class-<k>.json instead, once per class (see
 * plan-impl.h), and plan.json says "layout": "classes".
 *
 * Output layout: records that fit on one line (an instruction, a node, a tensor) are printed on
 * one line, so `grep 'MB=3' device-0.json` shows whole instructions; everything else is indented.
 * Arrays are walked in order and nothing iterates a hash table, so equal plans give equal bytes.
 * Each class's instruction and tensor text is built once and shared by its members. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../base/assert.h"
#include "../base/json.h"
#include "plan.h"
#include "plan-impl.h"

/* A record is printed on one line when it has at most this many values and this many chars. */
#define PLAN_FLAT_VALUES 64
#define PLAN_FLAT_CHARS 400

static const char *const tensor_kind_names[] = {"out", "saved", "work"};

static void append_flat(GString *out, const cJSON *v) {
  char *s = cJSON_PrintUnformatted(v);
  g_string_append(out, s ? s : "null");
  cJSON_free(s);
}

static void append_key(GString *out, const char *key) {
  cJSON *s = cJSON_CreateString(key ? key : "");
  append_flat(out, s);
  cJSON_Delete(s);
}

static bool within_budget(const cJSON *v, int *budget) {
  if (--*budget < 0)
    return false;
  for (const cJSON *c = v->child; c; c = c->next)
    if (!within_budget(c, budget))
      return false;
  return true;
}

static void append_indent(GString *out, int depth) {
  for (int i = 0; i < depth; i++)
    g_string_append(out, "  ");
}

/* Prints v: scalars and arrays of scalars on one line, small records on one line, the rest
 * one member per line, indented by two spaces per level. */
static void emit(GString *out, const cJSON *v, int depth) {
  bool object = cJSON_IsObject(v);
  if (!object && !cJSON_IsArray(v)) {
    append_flat(out, v);
    return;
  }
  bool scalars = !object;
  for (const cJSON *c = v->child; c && scalars; c = c->next)
    if (cJSON_IsArray(c) || cJSON_IsObject(c))
      scalars = false;
  if (scalars || !v->child) {
    append_flat(out, v);
    return;
  }
  int budget = PLAN_FLAT_VALUES;
  if (depth > 0 && within_budget(v, &budget)) {
    char *s = cJSON_PrintUnformatted(v);
    bool fits = s && strlen(s) + 2 * (size_t)depth <= PLAN_FLAT_CHARS;
    if (fits)
      g_string_append(out, s);
    cJSON_free(s);
    if (fits)
      return;
  }
  g_string_append(out, object ? "{\n" : "[\n");
  for (const cJSON *c = v->child; c; c = c->next) {
    append_indent(out, depth + 1);
    if (object) {
      append_key(out, c->string);
      g_string_append(out, ": ");
    }
    emit(out, c, depth + 1);
    g_string_append(out, c->next ? ",\n" : "\n");
  }
  append_indent(out, depth);
  g_string_append_c(out, object ? '}' : ']');
}

static bool write_json(const char *path, const cJSON *root, GString *buf, GError **err) {
  g_string_truncate(buf, 0);
  emit(buf, root, 0);
  g_string_append_c(buf, '\n');
  return piper_write_file(path, buf->str, buf->len, err);
}

/* An index or null (IR_NONE). */
static void add_ref(cJSON *obj, const char *key, uint32_t v) {
  if (v == IR_NONE)
    cJSON_AddNullToObject(obj, key);
  else
    cJSON_AddNumberToObject(obj, key, v);
}

static cJSON *u32_array(const uint32_t *v, uint32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t i = 0; i < n; i++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

/* base + first, where a class with no entries of a list may hold no array at all (NULL + 0
 * is undefined in C). */
static const uint32_t *list_at(const uint32_t *base, uint32_t first) {
  return base ? base + first : NULL;
}

static void add_pass(cJSON *obj, enum ir_pass pass) {
  if (pass == IR_PASS_NONE || pass > IR_PASS_NONE)
    cJSON_AddNullToObject(obj, "pass");
  else
    cJSON_AddStringToObject(obj, "pass", ir_pass_name(pass));
}

static const char *kind_name(enum ir_node_kind k) {
  return k < IR_NODE_KIND_COUNT ? ir_node_kind_name(k) : "?";
}

/* True when p is written one file per class instead of one per device. */
static bool by_class(const struct plan *p) {
  return p->n_devices > PLAN_DEVICE_FILES_MAX;
}

/* format, version, model, program and the sizes. NULL when the model is missing. */
static cJSON *index_header(const struct plan *p, const char *path, GError **err) {
  cJSON *model = p->model_json ? cJSON_Parse(p->model_json)
                 : p->model    ? model_to_json(p->model)
                               : NULL;
  if (!model) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "%s: the plan's model configuration is missing or not JSON", path);
    return NULL;
  }
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", PLAN_FORMAT);
  cJSON_AddNumberToObject(root, "version", PLAN_VERSION);
  /* Only the compact layout names itself, so per-device plans keep their bytes. */
  if (by_class(p))
    cJSON_AddStringToObject(root, "layout", PLAN_LAYOUT_CLASSES);
  char model_name[sizeof p->model->name + 1] = "";
  if (p->model)
    plan_copy_name(model_name, p->model->name, sizeof p->model->name);
  cJSON_AddStringToObject(root, "model_name", model_name);
  cJSON_AddItemToObject(root, "model", model);
  cJSON *program = NULL;
  if (p->program_json) {
    program = cJSON_Parse(p->program_json);
    if (!program)
      program = cJSON_CreateString(p->program_json);
  }
  cJSON_AddItemToObject(root, "program", program ? program : cJSON_CreateNull());
  cJSON_AddNumberToObject(root, "n_devices", p->n_devices);
  cJSON_AddNumberToObject(root, "n_microbatches", p->n_microbatches);
  return root;
}

/* tags, streams, groups and segment sets: the tables nodes refer to. */
static void index_tables(cJSON *root, const struct plan *p) {
  char name[PLAN_NAME_LEN];
  cJSON *tags = cJSON_AddArrayToObject(root, "tags");
  for (uint32_t t = 0; t < p->n_tags; t++) {
    plan_copy_name(name, p->tag_names[t], MODEL_TAG_NAME_MAX);
    cJSON_AddItemToArray(tags, cJSON_CreateString(name));
  }
  cJSON *streams = cJSON_AddArrayToObject(root, "streams");
  for (uint32_t s = 0; s < p->n_streams; s++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", s);
    plan_copy_name(name, p->streams[s].name, IR_NAME_MAX);
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "priority", p->streams[s].priority);
    cJSON_AddNumberToObject(o, "sm_share", p->streams[s].sm_share);
    cJSON_AddItemToArray(streams, o);
  }
  cJSON *groups = cJSON_AddArrayToObject(root, "groups");
  for (uint32_t g = 0; g < p->n_groups; g++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", g);
    cJSON_AddItemToObject(o, "devices",
                          u32_array(p->device_pool + p->groups[g].first, p->groups[g].count));
    cJSON_AddItemToArray(groups, o);
  }
  cJSON *segsets = cJSON_AddArrayToObject(root, "segsets");
  for (uint32_t s = 0; s < p->n_segsets; s++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", s);
    cJSON_AddItemToObject(o, "segments",
                          u32_array(p->segment_pool + p->segsets[s].first, p->segsets[s].count));
    cJSON_AddNumberToObject(o, "param_bytes", (double)p->segsets[s].param_bytes);
    cJSON_AddItemToArray(segsets, o);
  }
}

static cJSON *node_to_json(const struct plan *p, uint32_t i, const char *node_name) {
  const struct ir_node *n = &p->nodes[i];
  char name[PLAN_NAME_LEN];
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "id", i);
  cJSON_AddStringToObject(o, "name", node_name);
  cJSON_AddStringToObject(o, "kind", kind_name(n->kind));
  add_pass(o, n->pass);
  if (n->purpose == IR_COMM_NONE || n->purpose >= IR_COMM_PURPOSE_COUNT)
    cJSON_AddNullToObject(o, "purpose");
  else
    cJSON_AddStringToObject(o, "purpose", plan_purpose_names[n->purpose]);
  cJSON *nt = cJSON_AddObjectToObject(o, "tags");
  for (uint32_t t = 0; t < p->n_tags; t++)
    if (n->tags[t] != -1) {
      plan_copy_name(name, p->tag_names[t], MODEL_TAG_NAME_MAX);
      cJSON_AddNumberToObject(nt, name, n->tags[t]);
    }
  add_ref(o, "group", n->group);
  add_ref(o, "peer_group", n->peer_group);
  add_ref(o, "stream", n->stream);
  add_ref(o, "segment", n->segment);
  add_ref(o, "segset", n->segset);
  add_ref(o, "pair", n->pair);
  cJSON_AddNumberToObject(o, "bytes", (double)n->bytes);
  cJSON_AddNumberToObject(o, "shard_degree", n->shard_degree);
  cJSON_AddNumberToObject(o, "replica_degree", n->replica_degree);
  cJSON_AddBoolToObject(o, "shard_grads", n->shard_grads);
  cJSON_AddBoolToObject(o, "shard_params", n->shard_params);
  /* Only where it says more than shard_grads (ZeRO-1), so other plans read as before. */
  if (n->shard_optimizer && !n->shard_grads)
    cJSON_AddBoolToObject(o, "shard_optimizer", true);
  if (n->recompute != IR_RECOMPUTE_NONE) /* only then: other plans read as before */
    cJSON_AddStringToObject(o, "recompute",
                            n->recompute == IR_RECOMPUTE_FULL ? "full" : "selective");
  if (n->recompute == IR_RECOMPUTE_SELECTIVE &&
      n->recompute_modules != IR_RECOMPUTE_MODULES_DEFAULT) { /* only then, as above */
    cJSON *mods = cJSON_AddArrayToObject(o, "recompute_modules");
    for (int k = 0; k < MODEL_MODULE_COUNT; k++)
      if (n->recompute_modules & MODEL_MODULE_BIT(k))
        cJSON_AddItemToArray(mods, cJSON_CreateString(model_module_name((enum model_module)k)));
  }
  add_ref(o, "directive", n->directive);
  /* Tensor parallelism: absent without it, so plans without TP stay as they were. */
  if (n->tp_degree > 1)
    cJSON_AddNumberToObject(o, "tp_degree", n->tp_degree);
  if (n->sequence_parallel)
    cJSON_AddBoolToObject(o, "sequence_parallel", true);
  if (n->collectives > 1)
    cJSON_AddNumberToObject(o, "collectives", n->collectives);
  /* Context parallelism: absent without it, as tensor parallelism's fields. */
  if (n->cp_degree > 1) {
    cJSON_AddNumberToObject(o, "cp_degree", n->cp_degree);
    cJSON_AddStringToObject(o, "cp_comm", n->cp_comm == IR_CP_ALL_GATHER ? "all_gather" : "p2p");
  }
  /* Expert parallelism's receive capacity (ir/expert.c): on EP nodes alone. */
  if (n->shard_degree > 1)
    cJSON_AddNumberToObject(o, "capacity_factor", n->capacity_factor > 0
                                                      ? n->capacity_factor
                                                      : IR_EP_CAPACITY_FACTOR_DEFAULT);
  if (n->fp8_expert_inputs)
    cJSON_AddBoolToObject(o, "fp8_expert_inputs", true);
  /* Expert groups carved from the stage (ir.h): absent otherwise, so other plans stay. */
  if (n->expert_replicas > 1)
    cJSON_AddNumberToObject(o, "expert_replicas", n->expert_replicas);
  if (n->route_split > 1)
    cJSON_AddNumberToObject(o, "route_split", n->route_split);
  /* Packed bit fields (order slot, place, pass, micro-batch) beyond 2^53: hex text. */
  char prio[24];
  snprintf(prio, sizeof prio, "0x%llx", (unsigned long long)n->priority);
  cJSON_AddStringToObject(o, "priority", prio);
  return o;
}

/* nodes, communicators, classes and which class each device runs. */
static void index_program(cJSON *root, const struct plan *p, char *const *names) {
  char name[PLAN_NAME_LEN];
  cJSON *nodes = cJSON_AddArrayToObject(root, "nodes");
  for (uint32_t i = 0; i < p->n_nodes; i++)
    cJSON_AddItemToArray(nodes, node_to_json(p, i, names[i]));
  cJSON *comms = cJSON_AddArrayToObject(root, "communicators");
  for (uint32_t c = 0; c < p->n_comms; c++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", c);
    plan_comm_name(p, c, name, sizeof name);
    cJSON_AddStringToObject(o, "name", name);
    uint32_t purpose = p->comms[c].purpose < IR_COMM_PURPOSE_COUNT ? p->comms[c].purpose : 0;
    cJSON_AddStringToObject(o, "purpose", plan_purpose_names[purpose]);
    add_ref(o, "group", p->comms[c].group);
    add_ref(o, "peer_group", p->comms[c].peer_group);
    if (p->comms[c].split > 1)
      cJSON_AddNumberToObject(o, "split", p->comms[c].split);
    if (p->comms[c].block)
      cJSON_AddNumberToObject(o, "block", p->comms[c].block);
    if (p->comms[c].stride > 1)
      cJSON_AddNumberToObject(o, "stride", p->comms[c].stride);
    cJSON_AddItemToArray(comms, o);
  }
  cJSON *classes = cJSON_AddArrayToObject(root, "classes");
  for (uint32_t c = 0; c < p->n_classes; c++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", c);
    cJSON_AddNumberToObject(o, "instructions", p->classes[c].n_instrs);
    cJSON_AddItemToObject(o, "devices", u32_array(p->classes[c].devices, p->classes[c].n_devices));
    cJSON_AddItemToArray(classes, o);
  }
  cJSON *dc = cJSON_AddArrayToObject(root, "device_class");
  for (uint32_t d = 0; d < p->n_devices; d++)
    cJSON_AddItemToArray(dc, p->device_class[d] == IR_NONE
                                 ? cJSON_CreateNull()
                                 : cJSON_CreateNumber(p->device_class[d]));
}

/* Summary counts: what --stats prints, and a cross-check for the reader. */
static void index_summary(cJSON *root, const struct plan *p) {
  uint64_t per_op[IR_NODE_KIND_COUNT] = {0};
  for (uint32_t c = 0; c < p->n_classes; c++)
    for (uint32_t i = 0; i < p->classes[c].n_instrs; i++) {
      uint32_t node = p->classes[c].instrs[i].node;
      if (node < p->n_nodes && p->nodes[node].kind < IR_NODE_KIND_COUNT)
        per_op[p->nodes[node].kind] += p->classes[c].n_devices;
    }
  cJSON *summary = cJSON_AddObjectToObject(root, "summary");
  cJSON_AddNumberToObject(summary, "devices", p->n_devices);
  cJSON_AddNumberToObject(summary, "classes", p->n_classes);
  cJSON_AddNumberToObject(summary, "nodes", p->n_nodes);
  cJSON_AddNumberToObject(summary, "instructions", (double)plan_instruction_count(p));
  cJSON *ops = cJSON_AddObjectToObject(summary, "instructions_per_op");
  for (uint32_t k = 0; k < IR_NODE_KIND_COUNT; k++)
    cJSON_AddNumberToObject(ops, ir_node_kind_name(k), (double)per_op[k]);
}

/* plan.json, in the order its keys are written. */
static cJSON *index_to_json(const struct plan *p, char *const *names, const char *path,
                            GError **err) {
  cJSON *root = index_header(p, path, err);
  if (!root)
    return NULL;
  index_tables(root, p);
  index_program(root, p, names);
  index_summary(root, p);
  return root;
}

/* The text of a class's program that all its members share: each instruction record up to
 * (not including) its device-specific members and closing brace, and the tensor list. Members
 * of a class differ only in communicator ranks and peers, so writing a device appends these
 * and a few numbers instead of rebuilding and printing every record. */
struct class_text {
  GString *instrs;          /* record prefixes, back to back */
  uint32_t *instr_at;       /* [n_instrs + 1]: where each prefix starts in instrs */
  GString *tensors;         /* the entries of "tensors", indented, comma separated */
  uint32_t *comms, n_comms; /* communicators the class uses, ascending */
};

static void append_record(GString *out, cJSON *o) {
  append_flat(out, o);
  cJSON_Delete(o);
}

static void class_text_init(struct class_text *ct, const struct plan *p, const struct plan_class *c,
                            char *const *names) {
  ct->instrs = g_string_new(NULL);
  ct->instr_at = g_new(uint32_t, (size_t)c->n_instrs + 1);
  for (uint32_t i = 0; i < c->n_instrs; i++) {
    const struct plan_instr *in = &c->instrs[i];
    const struct ir_node *n = &p->nodes[in->node];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "i", i);
    cJSON_AddStringToObject(o, "op", kind_name(n->kind));
    cJSON_AddNumberToObject(o, "node", in->node);
    cJSON_AddStringToObject(o, "name", names[in->node]);
    add_pass(o, n->pass);
    if (in->comm != IR_NONE) {
      cJSON_AddNumberToObject(o, "comm", in->comm);
      cJSON_AddNumberToObject(o, "seq", in->seq);
    }
    if (in->group_parts)
      cJSON_AddNumberToObject(o, "group", in->group_parts);
    cJSON_AddNumberToObject(o, "bytes", (double)n->bytes);
    cJSON_AddItemToObject(o, "waits", u32_array(list_at(c->waits, in->wait_first), in->wait_count));
    cJSON_AddItemToObject(o, "reads", u32_array(list_at(c->reads, in->read_first), in->read_count));
    cJSON_AddItemToObject(o, "writes",
                          u32_array(list_at(c->writes, in->write_first), in->write_count));
    ct->instr_at[i] = (uint32_t)ct->instrs->len;
    append_record(ct->instrs, o);
    g_string_truncate(ct->instrs, ct->instrs->len - 1); /* the closing brace */
  }
  ct->instr_at[c->n_instrs] = (uint32_t)ct->instrs->len;
  ct->tensors = g_string_new(NULL);
  for (uint32_t k = 0; k < c->n_tensors; k++) {
    const struct plan_tensor *tn = &c->tensors[k];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", k);
    cJSON_AddNumberToObject(o, "bytes", (double)tn->bytes);
    cJSON_AddStringToObject(o, "kind", tensor_kind_names[tn->kind]);
    cJSON_AddNumberToObject(o, "producer", tn->producer);
    cJSON_AddItemToObject(o, "consumers",
                          u32_array(list_at(c->consumers, tn->consumer_first), tn->consumer_count));
    cJSON_AddNumberToObject(o, "alloc", tn->alloc);
    cJSON_AddNumberToObject(o, "release", tn->release);
    g_string_append(ct->tensors, k ? ",\n    " : "    ");
    append_record(ct->tensors, o);
  }
  ct->comms = plan_class_comms(c, &ct->n_comms);
}

static void class_text_free(struct class_text *ct) {
  if (ct->instrs)
    g_string_free(ct->instrs, TRUE);
  if (ct->tensors)
    g_string_free(ct->tensors, TRUE);
  g_free(ct->instr_at);
  g_free(ct->comms);
  memset(ct, 0, sizeof *ct);
}

/* Writes device d's file text into out: a small header through cJSON, then the streams and
 * tensors from the class text. Instruction records keep the device-specific members ("rank",
 * "peer") last. */
static void device_text(GString *out, const struct plan *p, uint32_t d, const struct class_text *ct,
                        char *const *stream_names) {
  const struct plan_class *c = plan_device_class(p, d);
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", PLAN_DEVICE_FORMAT);
  cJSON_AddNumberToObject(root, "version", PLAN_VERSION);
  cJSON_AddNumberToObject(root, "device", d);
  add_ref(root, "class", p->device_class[d]);
  cJSON *groups = cJSON_AddArrayToObject(root, "groups");
  const struct plan_positions *t = &p->positions;
  for (uint32_t e = t->first[d]; e < t->first[d + 1]; e++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "group", t->group[e]);
    cJSON_AddNumberToObject(o, "position", t->rank[e]);
    cJSON_AddItemToArray(groups, o);
  }
  cJSON *cl = cJSON_AddArrayToObject(root, "communicators");
  char name[PLAN_NAME_LEN];
  for (uint32_t k = 0; c && k < ct->n_comms; k++) {
    uint32_t id = ct->comms[k], pair[2];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    plan_comm_name(p, id, name, sizeof name);
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "size", plan_comm_size(p, id));
    cJSON_AddNumberToObject(o, "rank", plan_device_comm_rank(p, d, id, -1, pair));
    /* DP and EP members are the group in plan.json; listing them per device would grow with
     * the square of the group size. */
    if (p->comms[id].purpose == IR_COMM_PP)
      cJSON_AddItemToObject(o, "members", u32_array(pair, 2));
    cJSON_AddItemToArray(cl, o);
  }
  g_string_truncate(out, 0);
  emit(out, root, 0);
  cJSON_Delete(root);
  g_string_truncate(out, out->len - 2); /* reopen the object: drop "\n}" */

  g_string_append(out, ",\n  \"streams\": [");
  for (uint32_t s = 0; s < p->n_streams; s++) {
    g_string_append_printf(out,
                           "%s\n    {\n      \"stream\": %u,\n      \"name\": %s,\n"
                           "      \"instructions\": [",
                           s ? "," : "", s, stream_names[s]);
    uint32_t k0 = c ? c->stream_first[s] : 0, k1 = c ? c->stream_first[s + 1] : 0;
    for (uint32_t k = k0; k < k1; k++) {
      uint32_t i = c->stream_instrs[k];
      const struct plan_instr *in = &c->instrs[i];
      const struct ir_node *n = &p->nodes[in->node];
      g_string_append(out, k > k0 ? ",\n        " : "\n        ");
      g_string_append_len(out, ct->instrs->str + ct->instr_at[i],
                          (gssize)(ct->instr_at[i + 1] - ct->instr_at[i]));
      if (in->comm != IR_NONE) {
        uint32_t pair[2];
        g_string_append_printf(out, ",\"rank\":%d",
                               plan_device_comm_rank(p, d, in->comm, plan_comm_side(n), pair));
      }
      if (n->kind == IR_NODE_SEND || n->kind == IR_NODE_RECV) {
        uint32_t peer = plan_device_peer(p, d, n);
        if (peer == IR_NONE)
          g_string_append(out, ",\"peer\":null");
        else
          g_string_append_printf(out, ",\"peer\":%u", peer);
      }
      g_string_append_c(out, '}');
    }
    g_string_append(out, k1 > k0 ? "\n      ]\n    }" : "]\n    }");
  }
  g_string_append(out, p->n_streams ? "\n  ],\n  \"tensors\": [" : "],\n  \"tensors\": [");
  if (c && c->n_tensors) {
    g_string_append_c(out, '\n');
    g_string_append_len(out, ct->tensors->str, (gssize)ct->tensors->len);
    g_string_append(out, "\n  ]\n}\n");
  } else {
    g_string_append(out, "]\n}\n");
  }
}

/* Writes out to dir/<prefix>-<k>.json. */
static bool write_numbered(const char *dir, const char *prefix, uint32_t k, const GString *out,
                           GError **err) {
  char file[48];
  snprintf(file, sizeof file, "%s-%u.json", prefix, k);
  char *path = g_build_filename(dir, file, NULL);
  bool ok = piper_write_file(path, out->str, out->len, err);
  g_free(path);
  return ok;
}

/* Removes dir/<prefix>-<k>.json for k = from, from + 1, ... up to the first that is not there:
 * files of an earlier plan in the same directory (more devices or classes, or the other layout)
 * would mislead a reader. */
static void remove_numbered(const char *dir, const char *prefix, uint32_t from) {
  for (uint32_t k = from; k < IR_MAX_DEVICES; k++) {
    char file[48];
    snprintf(file, sizeof file, "%s-%u.json", prefix, k);
    char *path = g_build_filename(dir, file, NULL);
    int rc = g_remove(path);
    g_free(path);
    if (rc != 0)
      break;
  }
}

/* The per-device layout: device-<d>.json for every device. */
static bool write_device_files(const struct plan *p, const char *dir, const struct class_text *texts,
                               char *const *stream_names, GString *buf, GError **err) {
  static const struct class_text none = {0};
  for (uint32_t d = 0; d < p->n_devices; d++) {
    uint32_t c = p->device_class[d];
    device_text(buf, p, d, c < p->n_classes ? &texts[c] : &none, stream_names);
    if (!write_numbered(dir, "device", d, buf, err))
      return false;
  }
  remove_numbered(dir, "device", p->n_devices);
  remove_numbered(dir, "class", 0);
  return true;
}

/* The compact layout: class-<k>.json, the device file of class k's first member, once per
 * class. The other members' files would differ only in ranks and peers, which plan.json's
 * groups and communicators determine, so the directory grows with the classes, not the
 * devices (plan.json's device lists aside). */
static bool write_class_files(const struct plan *p, const char *dir, const struct class_text *texts,
                              char *const *stream_names, GString *buf, GError **err) {
  for (uint32_t c = 0; c < p->n_classes; c++) {
    PIPER_ASSERT(p->classes[c].n_devices > 0);
    device_text(buf, p, p->classes[c].devices[0], &texts[c], stream_names);
    if (!write_numbered(dir, "class", c, buf, err))
      return false;
  }
  remove_numbered(dir, "class", p->n_classes);
  remove_numbered(dir, "device", 0);
  return true;
}

bool plan_write_dir(const struct plan *p, const char *dir, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create directory: %s", dir,
                strerror(errno));
    return false;
  }
  bool ok = false;
  GString *buf = g_string_new(NULL);
  char *path = g_build_filename(dir, "plan.json", NULL);
  struct class_text *texts = g_new0(struct class_text, p->n_classes ? p->n_classes : 1);
  /* Names once per node and stream: every member of a class repeats them. */
  char **names = g_new0(char *, p->n_nodes ? p->n_nodes : 1);
  char **stream_names = g_new0(char *, p->n_streams ? p->n_streams : 1);
  char name[PLAN_NAME_LEN];
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    plan_node_name(p, i, name, sizeof name);
    names[i] = g_strdup(name);
  }
  for (uint32_t s = 0; s < p->n_streams; s++) {
    plan_copy_name(name, p->streams[s].name, IR_NAME_MAX);
    cJSON *js = cJSON_CreateString(name);
    char *text = cJSON_PrintUnformatted(js);
    stream_names[s] = g_strdup(text ? text : "\"\"");
    cJSON_free(text);
    cJSON_Delete(js);
  }

  cJSON *index = index_to_json(p, names, path, err);
  if (!index)
    goto out;
  bool wrote = write_json(path, index, buf, err);
  cJSON_Delete(index);
  if (!wrote)
    goto out;

  for (uint32_t c = 0; c < p->n_classes; c++)
    class_text_init(&texts[c], p, &p->classes[c], names);
  if (!(by_class(p) ? write_class_files(p, dir, texts, stream_names, buf, err)
                    : write_device_files(p, dir, texts, stream_names, buf, err)))
    goto out;
  ok = true;
out:
  for (uint32_t i = 0; i < p->n_nodes; i++)
    g_free(names[i]);
  g_free(names);
  for (uint32_t s = 0; s < p->n_streams; s++)
    g_free(stream_names[s]);
  g_free(stream_names);
  for (uint32_t c = 0; c < p->n_classes; c++)
    class_text_free(&texts[c]);
  g_free(texts);
  g_free(path);
  g_string_free(buf, TRUE);
  return ok;
}
