/* ir: JSON and Graphviz dumps of the training DAG (--dump-ir, --dump-dot). Both go through
 * base's piper_out (json_write_file does too), so a failed write is an error, never a
 * truncated file. */
#include <stdio.h>

#include "ir.h"
#include "../base/json.h"

static cJSON *u32_array(const uint32_t *v, uint32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t i = 0; i < n; i++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

bool ir_graph_dump_json(const struct ir_graph *g, const char *path, GError **err) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "model", g->model->name);
  cJSON_AddNumberToObject(root, "n_devices", g->n_devices);
  cJSON_AddNumberToObject(root, "n_microbatches", g->n_microbatches);
  cJSON *tags = cJSON_AddArrayToObject(root, "tags");
  for (uint32_t t = 0; t < g->n_tags; t++)
    cJSON_AddItemToArray(tags, cJSON_CreateString(g->tag_names[t]));
  cJSON *streams = cJSON_AddArrayToObject(root, "streams");
  for (uint32_t i = 0; i < g->streams->len; i++)
    cJSON_AddItemToArray(streams, cJSON_CreateString(IR_STREAM(g, i)->name));
  cJSON *groups = cJSON_AddArrayToObject(root, "groups");
  for (uint32_t i = 0; i < g->groups->len; i++)
    cJSON_AddItemToArray(groups, u32_array(IR_GROUP_DEVICES(g, i), IR_GROUP(g, i)->count));
  cJSON *nodes = cJSON_AddArrayToObject(root, "nodes");
  char name[256];
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", i);
    ir_node_name(g, i, name, sizeof name);
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "kind", ir_node_kind_name(n->kind));
    cJSON_AddStringToObject(o, "pass", ir_pass_name(n->pass));
    cJSON *t = cJSON_AddObjectToObject(o, "tags");
    for (uint32_t k = 0; k < g->n_tags; k++)
      if (n->tags[k] >= 0)
        cJSON_AddNumberToObject(t, g->tag_names[k], n->tags[k]);
    if (n->segment != IR_NONE)
      cJSON_AddNumberToObject(o, "segment", n->segment);
    cJSON_AddNumberToObject(o, "group", n->group);
    if (n->peer_group != IR_NONE)
      cJSON_AddNumberToObject(o, "peer_group", n->peer_group);
    cJSON_AddStringToObject(o, "stream", IR_STREAM(g, n->stream)->name);
    if (n->bytes)
      cJSON_AddNumberToObject(o, "bytes", (double)n->bytes);
    if (n->shard_degree > 1)
      cJSON_AddNumberToObject(o, "shard_degree", n->shard_degree);
    if (n->replica_degree > 1)
      cJSON_AddNumberToObject(o, "replica_degree", n->replica_degree);
    if (n->tp_degree > 1)
      cJSON_AddNumberToObject(o, "tp_degree", n->tp_degree);
    if (n->sequence_parallel)
      cJSON_AddBoolToObject(o, "sequence_parallel", true);
    if (n->collectives > 1)
      cJSON_AddNumberToObject(o, "collectives", n->collectives);
    if (n->segset != IR_NONE) {
      const struct ir_segset *ss = IR_SEGSET(g, n->segset);
      cJSON_AddItemToObject(
          o, "segments",
          u32_array(&g_array_index(g->segment_pool, uint32_t, ss->first), ss->count));
    }
    cJSON_AddItemToArray(nodes, o);
  }
  cJSON *edges = cJSON_AddArrayToObject(root, "edges");
  for (uint32_t i = 0; i < g->edges->len; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "src", e->src);
    cJSON_AddNumberToObject(o, "dst", e->dst);
    cJSON_AddStringToObject(o, "kind", e->kind == IR_EDGE_DATA ? "data" : "temporal");
    if (e->kind == IR_EDGE_DATA) {
      cJSON_AddNumberToObject(o, "slot", e->slot);
      cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
    }
    cJSON_AddItemToArray(edges, o);
  }
  bool ok = json_write_file(path, root, err);
  cJSON_Delete(root);
  return ok;
}

static const char *pass_colour(const struct ir_node *n) {
  if (n->kind == IR_NODE_OPTIMIZER)
    return "gray80";
  if (n->kind != IR_NODE_COMPUTE)
    return "lightyellow";
  switch (n->pass) {
  case IR_PASS_F: return "lightblue";
  case IR_PASS_B: return "lightsalmon";
  case IR_PASS_BI: return "lightpink";
  case IR_PASS_BW: return "palegreen";
  default: return "white";
  }
}

/* One cluster per device group that runs a node, so placement is visible at a glance. */
static void dot_group_cluster(FILE *f, const struct ir_graph *g, uint32_t grp) {
  bool any = false;
  for (uint32_t i = 0; i < g->nodes->len && !any; i++)
    any = IR_NODE(g, i)->group == grp;
  if (!any)
    return;
  fprintf(f, "  subgraph cluster_g%u {\n    label=\"g%u [", grp, grp);
  const uint32_t *d = IR_GROUP_DEVICES(g, grp);
  for (uint32_t k = 0; k < IR_GROUP(g, grp)->count && k < 16; k++)
    fprintf(f, "%s%u", k ? "," : "", d[k]);
  fprintf(f, "%s]\";\n", IR_GROUP(g, grp)->count > 16 ? ",..." : "");
  char name[256];
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->group != grp)
      continue;
    ir_node_name(g, i, name, sizeof name);
    fprintf(f, "    n%u [label=\"%s\", fillcolor=%s%s];\n", i, name, pass_colour(n),
            n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_OPTIMIZER ? "" : ", shape=ellipse");
  }
  fprintf(f, "  }\n");
}

bool ir_graph_dump_dot(const struct ir_graph *g, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  fprintf(f, "digraph piper {\n  rankdir=LR;\n  node [shape=box, style=filled, fontsize=10];\n");
  for (uint32_t grp = 0; grp < g->groups->len; grp++)
    dot_group_cluster(f, g, grp);
  for (uint32_t i = 0; i < g->edges->len; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    fprintf(f, "  n%u -> n%u%s;\n", e->src, e->dst,
            e->kind == IR_EDGE_TEMPORAL ? " [style=dashed, color=gray50]" : "");
  }
  fprintf(f, "}\n");
  return piper_out_close(&out, err); /* checks every write above */
}
