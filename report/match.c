/* report matching: two runs of one plan paired node by node (device, IR node, micro-batch), so
 * that a prediction can be checked op by op, not only kind by kind. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *node_key(const struct report_trace_node *n) {
  return g_strdup_printf("%u\x1f%s\x1f%u", n->device, n->name, n->ordinal);
}

static void pair_error(struct report_node_pair *p) {
  double a = p->a->median_s, b = p->b->median_s;
  if (a == 0 && b == 0) {
    p->ratio = 1;
    p->error = 0;
  } else if (a == 0 || b == 0) {
    p->ratio = a == 0 ? INFINITY : 0;
    p->error = INFINITY;
  } else {
    p->ratio = b / a;
    p->error = fmax(b / a, a / b) - 1;
  }
}

static int pair_cmp(const void *x, const void *y) {
  const struct report_node_pair *p = x, *q = y;
  if (p->error != q->error)
    return p->error > q->error ? -1 : 1;
  if (p->a->device != q->a->device)
    return p->a->device < q->a->device ? -1 : 1;
  int c = strcmp(p->a->name, q->a->name);
  if (c != 0)
    return c;
  return p->a->ordinal < q->a->ordinal ? -1 : p->a->ordinal > q->a->ordinal;
}

struct report_node_pair *report_pair_nodes(const struct report_dir *a, const struct report_dir *b,
                                           uint32_t *n_pairs, uint32_t *only_a, uint32_t *only_b) {
  GHashTable *in_b = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  for (uint32_t i = 0; i < b->n_trace_nodes; i++)
    g_hash_table_insert(in_b, node_key(&b->trace_nodes[i]), (gpointer)&b->trace_nodes[i]);
  struct report_node_pair *pairs = g_new0(struct report_node_pair, a->n_trace_nodes + 1);
  uint32_t n = 0;
  for (uint32_t i = 0; i < a->n_trace_nodes; i++) {
    char *key = node_key(&a->trace_nodes[i]);
    const struct report_trace_node *match = g_hash_table_lookup(in_b, key);
    g_free(key);
    if (!match)
      continue;
    pairs[n] = (struct report_node_pair){&a->trace_nodes[i], match, 0, 0};
    pair_error(&pairs[n]);
    n++;
  }
  g_hash_table_destroy(in_b);
  qsort(pairs, n, sizeof *pairs, pair_cmp);
  *n_pairs = n;
  *only_a = a->n_trace_nodes - n;
  *only_b = b->n_trace_nodes - n;
  return pairs;
}
