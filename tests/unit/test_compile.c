/* Tests of the compile pipeline: the training DAG, the effect of each directive counted
 * exactly on small graphs, lowering to per-device plans, determinism and the progress check. */
#include "test-helpers.h"
#include <string.h>
#include <glib/gstdio.h>

#include "../../directives/compile.h"
#include "../../directives/directives.h"
#include "../../ir/ir.h"
#include "../../base/json.h"
#include "../../ir/plan.h"
#include "../../ir/plan-impl.h"
#include "../../models/model.h"

struct counts {
  uint32_t kind[IR_NODE_KIND_COUNT];
  uint32_t pass[IR_PASS_NONE + 1]; /* compute nodes by pass */
  uint32_t data_edges, temporal_edges;
};

static struct counts count(const struct ir_graph *g) {
  struct counts c;
  memset(&c, 0, sizeof c);
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    c.kind[n->kind]++;
    if (n->kind == IR_NODE_COMPUTE)
      c.pass[n->pass]++;
  }
  for (uint32_t i = 0; i < g->edges->len; i++) {
    const struct ir_edge *e = IR_EDGE(g, i);
    if (e->kind == IR_EDGE_DATA)
      c.data_edges++;
    if (e->kind == IR_EDGE_TEMPORAL)
      c.temporal_edges++;
  }
  return c;
}

static uint32_t param_segments(const struct model *m) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < m->n_segments; s++)
    n += m->segments[s].param_count > 0;
  return n;
}

/* ---- the unsplit graph ------------------------------------------------------------------- */

/* ir_topo_update against a sort from scratch (ir_topo_init) after every batch of added edges:
 * the same positions and, once an edge closes a cycle, the same refusal and stuck node. The
 * graphs: tiny-dense's DAG with extra nodes, edges drawn forward in the current order (so
 * acyclic) in batches of 1 to 8, as the order phase adds a rank's temporal edges; some go into
 * sources, some repeat an edge. (The planner's compiles rely on it being exact: the positions
 * decide the order of a schedule's incomparable nodes, so the plans.) */
static void test_topo_incremental_exact(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  GRand *rng = g_rand_new_with_seed(32);
  uint32_t unchanged = 0;
  for (int round = 0; round < 40; round++) {
    struct ir_graph *g = ir_graph_build(m);
    struct ir_node tmpl = *IR_NODE(g, 0);
    uint32_t extra = (uint32_t)g_rand_int_range(rng, 20, 200);
    for (uint32_t i = 0; i < extra; i++)
      ir_graph_add_node(g, &tmpl);
    uint32_t nn = g->nodes->len, stuck = 0, stuck_ref = 0;
    for (uint32_t i = 0; i < nn; i++) /* a sparse random DAG over the new nodes: ids upward */
      for (int k = 0; k < 2; k++) {
        uint32_t u = (uint32_t)g_rand_int_range(rng, 0, (gint32)nn);
        uint32_t v = (uint32_t)g_rand_int_range(rng, 0, (gint32)nn);
        if (u < v && u >= g->nodes->len - extra)
          ir_graph_add_edge(g, u, v, IR_EDGE_DATA, 0, 0);
      }
    struct ir_topo t, ref;
    assert_true(ir_topo_init(&t, g, &stuck));
    for (int batch = 0; batch < 30; batch++) {
      uint32_t n_new = (uint32_t)g_rand_int_range(rng, 1, 9);
      for (uint32_t k = 0; k < n_new; k++) {
        uint32_t a = (uint32_t)g_rand_int_range(rng, 0, (gint32)nn);
        uint32_t b = (uint32_t)g_rand_int_range(rng, 0, (gint32)nn);
        if (t.pos[a] != t.pos[b]) /* forward in the current order: no cycle */
          ir_graph_add_edge(g, t.pos[a] < t.pos[b] ? a : b, t.pos[a] < t.pos[b] ? b : a,
                            IR_EDGE_TEMPORAL, 0, 0);
      }
      g_autofree uint32_t *old = g_memdup2(t.pos, nn * sizeof *old);
      assert_true(ir_topo_update(&t, g, &stuck));
      assert_true(ir_topo_init(&ref, g, &stuck_ref));
      assert_memory_equal(t.pos, ref.pos, nn * sizeof *t.pos);
      assert_memory_equal(t.order, ref.order, nn * sizeof *t.order);
      unchanged += memcmp(old, t.pos, nn * sizeof *old) == 0;
      ir_topo_free(&ref);
    }
    /* a back edge closes a cycle: refused like a sort from scratch, naming the same node */
    uint32_t first = t.order[0], last = t.order[nn - 1];
    if (first != last) {
      ir_graph_add_edge(g, last, first, IR_EDGE_TEMPORAL, 0, 0);
      assert_false(ir_topo_update(&t, g, &stuck));
      assert_false(ir_topo_init(&ref, g, &stuck_ref));
      assert_int_equal(stuck, stuck_ref);
      ir_topo_free(&ref);
    }
    ir_topo_free(&t);
    ir_graph_free(g);
  }
  /* the shortcut (new edges that move nothing) was exercised, not only re-sorts */
  assert_true(unchanged > 0);
  g_rand_free(rng);
  model_free(m);
}

static void test_build_dense(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  struct ir_graph *g = ir_graph_build(m);
  struct counts c = count(g);
  /* tiny-dense: 4 PP regions, no experts -> one segment (compute node) per stage and pass. */
  assert_int_equal(m->n_segments, 4);
  assert_int_equal(c.pass[IR_PASS_F], 4);
  assert_int_equal(c.pass[IR_PASS_B], 4);
  assert_int_equal(c.kind[IR_NODE_OPTIMIZER], 4);
  /* 3 forward edges, 3 reversed gradient edges, 4 saved-activation edges. */
  assert_int_equal(c.data_edges, 3 + 3 + 4);
  assert_int_equal(c.temporal_edges, 4); /* each B feeds its region's optimizer */
  ir_graph_free(g);
  model_free(m);
}

/* A compiled plan passes every check the reader makes of a plan from files (ir/plan_model.c):
 * those checks refuse edits, never the compiler's own plans. */
static void assert_reader_accepts(const struct plan *p) {
  GError *err = NULL;
  if (!plan_check_model(p, "compiled", &err) || !plan_check_instructions(p, "compiled", &err))
    fail_msg("%s", err->message);
}

/* ---- stream declarations ------------------------------------------------------------------ */

/* Each `stream` naming a new stream keeps its settings, however often the stream table grows
 * (it once wrote them through the table's buffer from before the growth). */
static void test_stream_declarations_kept(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  GString *text = g_string_new("[");
  enum { N = 40 };
  for (int i = 0; i < N; i++)
    g_string_append_printf(text, "%s{\"op\":\"stream\",\"name\":\"s%d\",\"priority\":%d,"
                           "\"sm_share\":%g}", i ? "," : "", i, -1 - i, (i + 1) / 64.0);
  g_string_append(text, "]");
  struct ir_graph *g = test_must_apply(m, text->str);
  for (int i = 0; i < N; i++) {
    char name[16];
    g_snprintf(name, sizeof name, "s%d", i);
    uint32_t found = IR_NONE;
    for (uint32_t s = 0; s < g->streams->len; s++)
      if (strcmp(IR_STREAM(g, s)->name, name) == 0)
        found = s;
    assert_int_not_equal(found, IR_NONE);
    assert_int_equal(IR_STREAM(g, found)->priority, -1 - i);
    assert_true(IR_STREAM(g, found)->sm_share == (i + 1) / 64.0);
  }
  ir_graph_free(g);
  g_string_free(text, TRUE);
  model_free(m);
}

/* ---- split -------------------------------------------------------------------------------- */

static void test_split_multiplies_matched_nodes(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  struct ir_graph *g = test_must_apply(
      m, "[{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":3}]");
  struct counts c = count(g);
  assert_int_equal(c.pass[IR_PASS_F], 4 * 3);
  assert_int_equal(c.pass[IR_PASS_B], 4 * 3);
  assert_int_equal(c.kind[IR_NODE_OPTIMIZER], 4); /* the update stays single */
  assert_int_equal(g->n_microbatches, 3);
  /* Each optimizer waits for its region's B of every micro-batch. */
  assert_int_equal(c.temporal_edges, 4 * 3);
  ir_graph_free(g);

  /* A split of one region copies only its nodes. */
  g = test_must_apply(
      m, "[{\"op\":\"split\",\"filter\":{\"PP\":1},\"dim_name\":\"MB\",\"num_microbatches\":5}]");
  c = count(g);
  assert_int_equal(c.pass[IR_PASS_F], 3 + 5);
  assert_int_equal(c.pass[IR_PASS_B], 3 + 5);
  ir_graph_free(g);
  model_free(m);
}

/* ---- place -------------------------------------------------------------------------------- */

static void test_place_adds_send_recv_per_crossing_edge(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  struct ir_graph *g =
      test_must_apply(m, "[{\"op\":\"place\",\"filter\":{\"PP\":0},\"devices\":[0]},"
                    "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[0]},"
                    "{\"op\":\"place\",\"filter\":{\"PP\":2},\"devices\":[1]},"
                    "{\"op\":\"place\",\"filter\":{\"PP\":3},\"devices\":[1]},"
                    "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":3}]");
  struct counts c = count(g);
  /* One crossing edge forward (PP1 -> PP2) and one backward (gradient) per micro-batch. */
  assert_int_equal(c.kind[IR_NODE_SEND], 2 * 3);
  assert_int_equal(c.kind[IR_NODE_RECV], 2 * 3);
  assert_int_equal(g->n_devices, 2);
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_SEND) {
      assert_int_equal(IR_NODE(g, n->pair)->kind, IR_NODE_RECV);
      assert_int_equal(IR_NODE(g, n->pair)->pair, i);
      assert_int_equal(n->peer_group, IR_NODE(g, n->pair)->group);
    }
  }
  ir_graph_free(g);
  model_free(m);
}

/* ---- replicate ---------------------------------------------------------------------------- */

static void test_replicate_buckets(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 0);
  uint32_t ps = param_segments(m);
  /* A tiny bucket holds one segment each: one all-reduce per parameter segment. */
  struct ir_graph *g = test_must_apply(
      m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1],\"bucket_size\":0.0001}]");
  struct counts c = count(g);
  assert_int_equal(c.kind[IR_NODE_ALL_REDUCE], ps);
  assert_int_equal(c.kind[IR_NODE_REDUCE_SCATTER], 0);
  ir_graph_free(g);
  /* The default 25 MB bucket holds the whole tiny model. */
  g = test_must_apply(m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1]}]");
  c = count(g);
  assert_int_equal(c.kind[IR_NODE_ALL_REDUCE], 1);
  ir_graph_free(g);
  /* ZeRO-2: reduce-scatter instead of all-reduce; the update touches this device's shard, so
   * an all-gather per bucket follows it. */
  g = test_must_apply(m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1],\"bucket_size\":0.0001,"
                    "\"shard_grads\":true}]");
  c = count(g);
  assert_int_equal(c.kind[IR_NODE_ALL_REDUCE], 0);
  assert_int_equal(c.kind[IR_NODE_REDUCE_SCATTER], ps);
  assert_int_equal(c.kind[IR_NODE_ALL_GATHER], ps);
  ir_graph_free(g);
  /* ZeRO-3: parameters stay sharded; an all-gather per bucket before F and before B of each
   * micro-batch, none after the update. */
  g = test_must_apply(m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1],\"bucket_size\":0.0001,"
                    "\"shard_params\":true},"
                    "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}]");
  c = count(g);
  assert_int_equal(c.kind[IR_NODE_REDUCE_SCATTER], ps);
  assert_int_equal(c.kind[IR_NODE_ALL_GATHER], ps * 2 * 2);
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_OPTIMIZER)
      assert_true(n->shard_params && n->shard_grads);
  }
  ir_graph_free(g);
  model_free(m);
}

/* ZeRO-1 (shard_optimizer): gradients reduce-scattered into each device's shard, the update
 * of that shard alone, then an all-gather of the updated parameters. Per bucket exactly one
 * reduce-scatter and one all-gather, each carrying the bucket's parameter bytes, the gather
 * after the optimizer; the nodes say ZeRO-1 and nothing more. */
static void test_replicate_zero1(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-moe.json", 0);
  uint32_t ps = 0;
  uint64_t total = 0;
  for (uint32_t s = 0; s < m->n_segments; s++)
    if (m->segments[s].param_count > 0) {
      ps++;
      total += m->segments[s].param_bytes;
    }
  struct ir_graph *g =
      test_must_apply(m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1],\"bucket_size\":0.0001,"
                    "\"shard_optimizer\":true},"
                    "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}]");
  struct counts c = count(g);
  assert_int_equal(c.kind[IR_NODE_ALL_REDUCE], 0);
  assert_int_equal(c.kind[IR_NODE_REDUCE_SCATTER], ps);
  assert_int_equal(c.kind[IR_NODE_ALL_GATHER], ps); /* after the update, not per micro-batch */
  uint64_t rs_bytes = 0, ag_bytes = 0;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind == IR_NODE_OPTIMIZER || n->kind == IR_NODE_COMPUTE) {
      assert_true(n->shard_optimizer);
      assert_false(n->shard_grads || n->shard_params);
    }
    if (n->kind == IR_NODE_REDUCE_SCATTER)
      rs_bytes += n->bytes;
    if (n->kind == IR_NODE_ALL_GATHER) {
      ag_bytes += n->bytes;
      assert_int_equal(n->pass, IR_PASS_NONE);
      bool after_update = false;
      for (uint32_t e = 0; e < g->edges->len; e++)
        after_update |= IR_EDGE(g, e)->dst == i &&
                        IR_NODE(g, IR_EDGE(g, e)->src)->kind == IR_NODE_OPTIMIZER;
      assert_true(after_update);
    }
  }
  assert_int_equal(rs_bytes, total);
  assert_int_equal(ag_bytes, total);
  ir_graph_free(g);
  model_free(m);
}

/* ZeRO-3 prefetch: each gather for a use waits for the compute two places before that use on
 * its group (so it overlaps the one right before), except the group's first two uses. Without
 * that edge, every gather of the step is ready at its start. */
static void test_zero3_prefetch_edges(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 1); /* one segment */
  assert_int_equal(m->n_segments, 1);
  uint32_t mbs = 4;
  struct ir_graph *g = test_must_apply(
      m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1],\"shard_params\":true},"
         "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":4}]");
  uint32_t gathers = 0, linked = 0;
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_ALL_GATHER)
      continue;
    gathers++;
    uint32_t in = 0;
    for (uint32_t e = 0; e < g->edges->len; e++) {
      const struct ir_edge *ed = IR_EDGE(g, e);
      if (ed->dst != i)
        continue;
      in++;
      const struct ir_node *src = IR_NODE(g, ed->src);
      assert_int_equal(ed->kind, IR_EDGE_TEMPORAL);
      assert_int_equal(src->kind, IR_NODE_COMPUTE);
      assert_int_equal(src->group, n->group);
      /* GPipe-like default order: the forward uses of micro-batch k wait for F of k - 2, the
       * backward of micro-batch 0 for F of micro-batch 2 and 1 for F 3, then B of k - 2 */
      int mb_tag = ir_graph_tag(g, "MB", false);
      int32_t k = n->tags[mb_tag], j = src->tags[mb_tag];
      if (n->pass == IR_PASS_F)
        assert_true(src->pass == IR_PASS_F && j == k - 2);
      else if (k >= 2)
        assert_true(src->pass == IR_PASS_B && j == k - 2);
      else
        assert_true(src->pass == IR_PASS_F && j == k + 2);
    }
    assert_true(in <= 1);
    linked += in;
  }
  /* one segment, one bucket: one gather per micro-batch and use */
  assert_int_equal(gathers, mbs * 2);
  assert_int_equal(linked, gathers - 2);
  ir_graph_free(g);
  model_free(m);
}

/* The data edges from src to dst of slot 1 (saved activations): their count and bytes. */
static uint32_t saved_edges(const struct ir_graph *g, uint32_t src, uint32_t dst, uint64_t *bytes) {
  uint32_t n = 0;
  for (uint32_t e = 0; e < g->edges->len; e++) {
    const struct ir_edge *ed = IR_EDGE(g, e);
    if (ed->kind == IR_EDGE_DATA && ed->slot == 1 && ed->src == src && ed->dst == dst) {
      n++;
      *bytes = ed->bytes;
    }
  }
  return n;
}

/* recompute, by hand on tiny-dense (fp32, 2 x 32 tokens = T 64, hidden 64, 4 heads of 16,
 * 8 layers) in 2 PP regions of 4 layers, 2 micro-batches:
 *   full: each F keeps its segment's input for R: region 1's is the [T, hidden] activation,
 *     64 * 64 * 4 = 16,384 B; region 0 starts from token ids (no input edge): 0 B. R hands B
 *     all the segment saved.
 *   selective: per layer the attention core's output T x 64 x 4 = 16,384 B and logsumexp
 *     T x 4 heads x 4 = 1,024 B, so 4 x 17,408 = 69,632 B move from F -> B to R -> B; F -> R
 *     is F's remaining saved tensor. */
static void test_recompute_rewrite(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 2);
  static const char *const prog[2] = {
      "[{\"op\":\"recompute\",\"filter\":{}},"
      "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}]",
      "[{\"op\":\"recompute\",\"filter\":{\"PASS\":\"F\"},\"granularity\":\"selective\"},"
      "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}]"};
  for (int v = 0; v < 2; v++) {
    struct ir_graph *g = test_must_apply(m, prog[v]);
    uint32_t reruns = 0;
    for (uint32_t i = 0; i < g->nodes->len; i++) {
      const struct ir_node *r = IR_NODE(g, i);
      if (r->kind != IR_NODE_COMPUTE || r->pass != IR_PASS_R)
        continue;
      reruns++;
      assert_int_equal(r->recompute, v == 0 ? IR_RECOMPUTE_FULL : IR_RECOMPUTE_SELECTIVE);
      /* its forward and backward: same segment and micro-batch */
      uint32_t f = IR_NONE, b = IR_NONE;
      for (uint32_t k = 0; k < g->nodes->len; k++) {
        const struct ir_node *n = IR_NODE(g, k);
        if (n->kind == IR_NODE_COMPUTE && n->segment == r->segment &&
            memcmp(n->tags, r->tags, sizeof n->tags) == 0) {
          if (n->pass == IR_PASS_F)
            f = k;
          if (n->pass == IR_PASS_B)
            b = k;
        }
      }
      assert_true(f != IR_NONE && b != IR_NONE);
      assert_int_equal(IR_NODE(g, f)->recompute, r->recompute);
      uint64_t saved = m->segments[r->segment].saved_bytes, fr = 0, rb = 0, fb = 0;
      assert_int_equal(saved_edges(g, f, i, &fr), 1);
      assert_int_equal(saved_edges(g, i, b, &rb), 1);
      uint32_t region = (uint32_t)r->tags[MODEL_TAG_PP];
      if (v == 0) {
        assert_int_equal(saved_edges(g, f, b, &fb), 0); /* B reads nothing of F */
        assert_int_equal(fr, region == 0 ? 0 : 16384);
        assert_int_equal(rb, saved);
      } else {
        assert_int_equal(saved_edges(g, f, b, &fb), 1);
        assert_int_equal(rb, 69632);
        assert_int_equal(fb, saved - 69632);
        assert_int_equal(fr, fb); /* one tensor, read by R and B */
      }
      /* R runs right before its backward, held back by the compute before it (else it would
       * run as soon as the device idles after its forward and hold what it restores) */
      assert_true(r->priority < IR_NODE(g, b)->priority);
      uint32_t held = 0;
      for (uint32_t e = 0; e < g->edges->len; e++) {
        const struct ir_edge *ed = IR_EDGE(g, e);
        if (ed->dst == i && ed->kind == IR_EDGE_TEMPORAL) {
          const struct ir_node *u = IR_NODE(g, ed->src);
          assert_true(u->kind == IR_NODE_COMPUTE && u->group == r->group);
          held++;
        }
      }
      assert_int_equal(held, 1);
    }
    assert_int_equal(reruns, 2 * 2); /* 2 regions x 2 micro-batches */
    ir_graph_free(g);
  }
  model_free(m);
}

/* ---- shard -------------------------------------------------------------------------------- */

static void test_shard_adds_all_to_all(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-moe.json", 0);
  uint32_t mbs = 3;
  struct ir_graph *g =
      test_must_apply(m, "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1]},"
                    "{\"op\":\"shard\",\"filter\":{\"EP\":\"*\"},\"devices\":[0,1]},"
                    "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":3}]");
  struct counts c = count(g);
  /* Per MoE layer and micro-batch: dispatch + combine in F, and both again in backward. */
  assert_int_equal(c.kind[IR_NODE_ALL_TO_ALL], (uint32_t)m->n_ep_regions * 4 * mbs);
  /* Sharded experts own distinct parameters: only the non-expert segments are synced, and the
   * default bucket holds all of them. */
  assert_int_equal(c.kind[IR_NODE_ALL_REDUCE], 1);
  for (uint32_t i = 0; i < g->nodes->len; i++) {
    const struct ir_node *n = IR_NODE(g, i);
    if (n->kind != IR_NODE_ALL_REDUCE)
      continue;
    const struct ir_segset *ss = IR_SEGSET(g, n->segset);
    for (uint32_t j = 0; j < ss->count; j++)
      assert_false(m->segments[g_array_index(g->segment_pool, uint32_t, ss->first + j)].expert);
  }
  ir_graph_free(g);
  model_free(m);
}

/* Full recomputation of expert-parallel experts (Megatron-LM's): the rerun reruns the dispatch
 * and the combine (pass R all-to-alls), so F keeps nothing for it. tiny-moe, fp32, T 64 tokens,
 * top-2, hidden 64, EP 2 at the default capacity factor 2: the rerun's dispatch brings
 * min(2 x 64 x 2, 64 x 2 x 2) = 256 rows x 64 x 4 B = 65,536 B to the experts' rerun, its
 * routing tables are 128 + 256 int32 = 1,536 B (each rounded to 16), and the rerun's combine
 * regenerates the copy the combine's transpose reads, 64 x 2 x 64 x 4 = 32,768 B. */
static void test_expert_recompute_all_to_all(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-moe.json", 0);
  const char *ep = "[{\"op\":\"replicate\",\"filter\":{},\"devices\":[0,1]},"
                   "{\"op\":\"shard\",\"filter\":{\"EP\":\"*\"},\"devices\":[0,1]},"
                   "{\"op\":\"recompute\",\"filter\":%s},"
                   "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}]";
  char *text = g_strdup_printf(ep, "{}");
  struct ir_graph *g = test_must_apply(m, text);
  uint32_t rerun_a2a = 0, dispatches = 0, combines = 0;
  for (uint32_t e = 0; e < g->edges->len; e++) {
    const struct ir_edge *ed = IR_EDGE(g, e);
    const struct ir_node *src = IR_NODE(g, ed->src), *dst = IR_NODE(g, ed->dst);
    /* the rerun's combine keeps nothing (the experts applied the routing weights), but the
     * combine's transpose waits for it: the rerun ends before the backward starts */
    if (ed->kind == IR_EDGE_TEMPORAL && src->kind == IR_NODE_ALL_TO_ALL &&
        src->pass == IR_PASS_R) {
      assert_int_equal(dst->kind, IR_NODE_ALL_TO_ALL);
      assert_int_equal(dst->pass, IR_PASS_B);
      combines++;
    }
    if (ed->kind != IR_EDGE_DATA)
      continue;
    /* the experts' forward keeps nothing for their rerun */
    if (src->kind == IR_NODE_COMPUTE && src->pass == IR_PASS_F && dst->pass == IR_PASS_R &&
        dst->kind == IR_NODE_COMPUTE)
      assert_false(m->segments[src->segment].expert);
    /* the backwards read the rerun's routing, not the forward's */
    if (src->kind == IR_NODE_ALL_TO_ALL && src->pass == IR_PASS_F)
      assert_true(dst->pass == IR_PASS_F);
    if (src->kind != IR_NODE_ALL_TO_ALL || src->pass != IR_PASS_R)
      continue;
    if (ed->slot == 0) { /* the rerun's dispatch: rows and their weights to the experts' rerun */
      assert_int_equal(dst->kind, IR_NODE_COMPUTE);
      assert_int_equal(dst->pass, IR_PASS_R);
      assert_true(m->segments[dst->segment].expert);
      assert_int_equal(ed->bytes, 65536 + 1024); /* 256 rows of 64 floats, 256 fp32 weights */
      dispatches++;
    } else {
      assert_int_equal(ed->bytes, 1536); /* routing tables */
    }
  }
  for (uint32_t i = 0; i < g->nodes->len; i++)
    rerun_a2a += IR_NODE(g, i)->kind == IR_NODE_ALL_TO_ALL && IR_NODE(g, i)->pass == IR_PASS_R;
  /* per MoE layer and micro-batch: F dispatch + combine, their transposes, and the rerun's two */
  assert_int_equal(count(g).kind[IR_NODE_ALL_TO_ALL], (uint32_t)m->n_ep_regions * 6 * 2);
  assert_int_equal(rerun_a2a, (uint32_t)m->n_ep_regions * 2 * 2);
  assert_int_equal(dispatches, (uint32_t)m->n_ep_regions * 2);
  assert_int_equal(combines, (uint32_t)m->n_ep_regions * 2);
  ir_graph_free(g);
  g_free(text);
  /* the experts alone: their rerun's dispatch would have no router rerun to read */
  text = g_strdup_printf(ep, "{\"EP\":\"*\"}");
  test_expect_apply_error(m, text, "directive 2 (recompute): recomputes the experts \"F s1");
  test_expect_apply_error(m, text, "in full but not \"F s0");
  g_free(text);
  model_free(m);
}

/* ---- order -------------------------------------------------------------------------------- */

static const char *pp2_place =
    "{\"op\":\"place\",\"filter\":{\"PP\":0},\"devices\":[0]},"
    "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[1]},"
    "{\"op\":\"split\",\"filter\":{},\"dim_name\":\"MB\",\"num_microbatches\":2}";

static void test_order_adds_temporal_edges(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-dense.json", 2);
  char *base = g_strdup_printf("[%s]", pp2_place);
  struct ir_graph *g0 = test_must_apply(m, base);
  char *ordered =
      g_strdup_printf("[%s, {\"op\":\"order\",\"filters\":[[{\"PP\":0,\"MB\":0,\"PASS\":\"F\"}],"
                      "[{\"PP\":0,\"MB\":1,\"PASS\":\"F\"}],[{\"PP\":0,\"MB\":0,\"PASS\":\"B\"}],[{"
                      "\"PP\":0,\"MB\":1,\"PASS\":\"B\"}]]}]",
                      pp2_place);
  struct ir_graph *g1 = test_must_apply(m, ordered);
  /* One segment per stage: each of the 3 slot boundaries adds exactly one edge. */
  assert_int_equal(count(g1).temporal_edges, count(g0).temporal_edges + 3);
  ir_graph_free(g0);
  ir_graph_free(g1);
  g_free(base);
  g_free(ordered);

  /* Backward before forward of the same micro-batch runs against dataflow. */
  char *reverse = g_strdup_printf("[%s, "
                                  "{\"op\":\"order\",\"filters\":[[{\"PP\":0,\"MB\":0,\"PASS\":"
                                  "\"B\"}],[{\"PP\":0,\"MB\":0,\"PASS\":\"F\"}]]}]",
                                  pp2_place);
  test_expect_apply_error(m, reverse, "directive 3 (order): the order creates a cycle against dataflow");
  g_free(reverse);
  /* A slot spanning two device groups. */
  char *cross = g_strdup_printf("[%s, "
                                "{\"op\":\"order\",\"filters\":[[{\"PP\":0,\"MB\":0,\"PASS\":\"F\"}"
                                "],[{\"PP\":1,\"MB\":0,\"PASS\":\"F\"}]]}]",
                                pp2_place);
  test_expect_apply_error(m, cross, "spans device groups");
  g_free(cross);
  /* BI without a later BW. */
  char *bi = g_strdup_printf("[%s, "
                             "{\"op\":\"order\",\"filters\":[[{\"PP\":1,\"MB\":0,\"PASS\":\"F\"}],["
                             "{\"PP\":1,\"MB\":0,\"PASS\":\"BI\"}]]}]",
                             pp2_place);
  test_expect_apply_error(m, bi, "no later group has its BW");
  g_free(bi);
  model_free(m);
}

static void test_bad_programs(void **state) {
  (void)state;
  struct model *m = test_load_model("models/tiny-moe.json", 0);
  test_expect_apply_error(m, "[{\"op\":\"place\",\"filter\":{\"XX\":0},\"devices\":[0]}]",
               "filter key \"XX\" is not a tag");
  test_expect_apply_error(m, "[{\"op\":\"place\",\"filter\":{\"PP\":7},\"devices\":[0]}]", "matches nothing");
  test_expect_apply_error(m, "[{\"op\":\"shard\",\"filter\":{\"PP\":0},\"devices\":[0,1]}]",
               "no expert region");
  test_expect_apply_error(m, "[{\"op\":\"shard\",\"filter\":{\"EP\":\"*\"},\"devices\":[0,1,2]}]",
               "do not divide evenly");
  test_expect_apply_error(m,
               "[{\"op\":\"replicate\",\"filter\":{\"PP\":0},\"devices\":[0,1]},"
               "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[2]}]",
               "must have equal sizes");
  test_expect_apply_error(m, "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]}]",
               "neither replicated nor sharded");
  test_expect_apply_error(m,
               "[{\"op\":\"place\",\"filter\":{},\"devices\":[0,1]},"
               "{\"op\":\"replicate\",\"filter\":{},\"devices\":[2,3]}]",
               "differ from the devices given");
  test_expect_apply_error(m, "[{\"op\":\"split\",\"filter\":{},\"dim_name\":\"PP\",\"num_microbatches\":2}]",
               "already names a tag");
  test_expect_apply_error(m, "[{\"op\":\"recompute\",\"filter\":{\"PASS\":\"B\"}}]",
               "directive 0 (recompute): \"filter\": \"PASS\" may only be F");
  test_expect_apply_error(m, "[{\"op\":\"recompute\",\"filter\":{\"PP\":9}}]", "matches no forward");
  test_expect_apply_error(m,
               "[{\"op\":\"recompute\",\"filter\":{\"PP\":0}},"
               "{\"op\":\"recompute\",\"filter\":{},\"granularity\":\"selective\"}]",
               "which an earlier recompute took");
  model_free(m);
}

/* ---- lowering ----------------------------------------------------------------------------- */

static struct compile_result compile_files(const char *model, int pp, const char *directives,
                                           enum sched_family f, uint32_t mbs) {
  struct compile_options o = compile_options_default();
  o.model_path = model;
  o.directives_path = directives;
  o.pp_regions = pp;
  o.have_schedule = f != SCHED_CUSTOM;
  o.schedule.family = f;
  o.schedule.mbs = mbs;
  return test_compile(&o);
}

static void test_lower_pp2_dp2_ep2(void **state) {
  (void)state;
  struct compile_result r = compile_files(
      "models/tiny-moe.json", 0, "directives/base-schedules/pp2_dp2_ep2.json", SCHED_1F1B, 4);
  const struct plan *p = r.plan;
  assert_int_equal(p->n_devices, 4);
  assert_int_equal(p->n_classes, 2); /* DP replicas share their program */
  assert_int_equal(p->device_class[0], p->device_class[1]);
  assert_int_equal(p->device_class[2], p->device_class[3]);
  assert_int_not_equal(p->device_class[0], p->device_class[2]);
  /* Every send's peer is the device at the same position of the next group. */
  const struct plan_class *c0 = plan_device_class(p, 1);
  uint32_t sends = 0, computes = 0;
  for (uint32_t i = 0; i < c0->n_instrs; i++) {
    const struct ir_node *n = &p->nodes[c0->instrs[i].node];
    if (n->kind == IR_NODE_SEND) {
      sends++;
      assert_int_equal(plan_peer(p, c0->instrs[i].node, 1), 3);
      assert_int_equal(plan_peer(p, c0->instrs[i].node, 0), 2);
    }
    computes += n->kind == IR_NODE_COMPUTE;
  }
  assert_int_equal(sends, 4); /* one activation per micro-batch leaves stage 0 */
  /* Per-communicator sequence numbers count 0, 1, 2, ... on each device. */
  for (uint32_t cm = 0; cm < p->n_comms; cm++) {
    uint32_t next[2] = {0, 0};
    for (uint32_t i = 0; i < c0->n_instrs; i++) {
      if (c0->instrs[i].comm != cm)
        continue;
      int side = p->nodes[c0->instrs[i].node].kind == IR_NODE_RECV;
      assert_int_equal(c0->instrs[i].seq, next[side]++);
    }
  }
  /* Waits only name instructions on other streams that come earlier. */
  for (uint32_t i = 0; i < c0->n_instrs; i++)
    for (uint32_t w = 0; w < c0->instrs[i].wait_count; w++) {
      uint32_t j = c0->waits[c0->instrs[i].wait_first + w];
      assert_true(j < i);
      assert_int_not_equal(c0->instrs[j].stream, c0->instrs[i].stream);
    }
  /* Tensors: consumers read what producers wrote. */
  for (uint32_t t = 0; t < c0->n_tensors; t++) {
    const struct plan_tensor *pt = &c0->tensors[t];
    assert_true(pt->producer < c0->n_instrs);
    /* a work tensor lives within its producer (the memory rule); the rest have readers */
    if (pt->kind == PLAN_TENSOR_WORK)
      assert_true(pt->consumer_count == 0 && pt->alloc == pt->producer &&
                  pt->release == pt->producer);
    else
      assert_true(pt->consumer_count >= 1 && pt->release >= pt->producer);
    for (uint32_t k = 0; k < pt->consumer_count; k++)
      assert_true(c0->consumers[pt->consumer_first + k] > pt->producer);
  }
  assert_true(computes > 0);
  compile_result_free(&r);
}

/* 1F1B on 2 ranks, 4 micro-batches: the compute order of each rank (one segment per stage). */
static void test_lower_1f1b_order(void **state) {
  (void)state;
  char *path = g_build_filename(g_get_tmp_dir(), "piper-test-pp2.json", NULL);
  g_file_set_contents(path,
                      "[{\"op\":\"place\",\"filter\":{\"PP\":0},\"devices\":[0]},"
                      "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[1]}]",
                      -1, NULL);
  struct compile_result r = compile_files("models/tiny-dense.json", 2, path, SCHED_1F1B, 4);
  const char *want[2] = {"F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"};
  int mb_tag = -1;
  for (uint32_t t = 0; t < r.plan->n_tags; t++)
    if (strcmp(r.plan->tag_names[t], "MB") == 0)
      mb_tag = (int)t;
  assert_true(mb_tag >= 0);
  for (uint32_t d = 0; d < 2; d++) {
    const struct plan_class *c = plan_device_class(r.plan, d);
    GString *got = g_string_new(NULL);
    for (uint32_t i = 0; i < c->n_instrs; i++) {
      const struct ir_node *n = &r.plan->nodes[c->instrs[i].node];
      if (n->kind != IR_NODE_COMPUTE)
        continue;
      g_string_append_printf(got, "%s%s%d", got->len ? " " : "", ir_pass_name(n->pass),
                             n->tags[mb_tag]);
    }
    assert_string_equal(got->str, want[d]);
    g_string_free(got, TRUE);
  }
  compile_result_free(&r);
  g_unlink(path);
  g_free(path);
}

/* The same deadlock with every stage replicated over four devices: the run by colour of alike
 * devices does not finish, and the run over every device names the devices stuck. */
static void test_progress_deadlock_replicated(void **state) {
  (void)state;
  char *path = g_build_filename(g_get_tmp_dir(), "piper-test-pp2dp4s.json", NULL);
  g_file_set_contents(path,
                      "[{\"op\":\"place\",\"filter\":{\"PP\":0},\"devices\":[0,1,2,3],"
                      "\"stream\":\"pp\"},"
                      "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[4,5,6,7],"
                      "\"stream\":\"pp\"},"
                      "{\"op\":\"replicate\",\"filter\":{\"PP\":0},\"devices\":[0,1,2,3]},"
                      "{\"op\":\"replicate\",\"filter\":{\"PP\":1},\"devices\":[4,5,6,7]}]",
                      -1, NULL);
  struct compile_result r = compile_files("models/tiny-dense.json", 2, path, SCHED_CUSTOM, 0);
  GError *err = NULL;
  assert_true(plan_check_progress(r.plan, &err));
  struct plan_class *c = &r.plan->classes[r.plan->device_class[4]];
  uint32_t pp = IR_NONE;
  for (uint32_t s = 0; s < r.plan->n_streams; s++)
    if (strcmp(r.plan->streams[s].name, "pp") == 0)
      pp = s;
  assert_int_not_equal(pp, IR_NONE);
  uint32_t first = c->stream_first[pp];
  uint32_t tmp = c->stream_instrs[first];
  c->stream_instrs[first] = c->stream_instrs[first + 1];
  c->stream_instrs[first + 1] = tmp;
  assert_false(plan_check_progress(r.plan, &err));
  assert_non_null(strstr(err->message, "plan deadlocks: device 0 stream compute waits at"));
  assert_non_null(strstr(err->message, "device 1 stream pp waits at \"send F s0 PP=0"));
  g_error_free(err);
  compile_result_free(&r);
  g_unlink(path);
  g_free(path);
}

/* The progress check rejects a hand-made deadlock: device 1 made to send its gradient before
 * receiving the activation the gradient depends on, on one shared stream. */
static void test_progress_catches_deadlock(void **state) {
  (void)state;
  char *path = g_build_filename(g_get_tmp_dir(), "piper-test-pp2s.json", NULL);
  g_file_set_contents(path,
                      "[{\"op\":\"place\",\"filter\":{\"PP\":0},\"devices\":[0],\"stream\":\"pp\"},"
                      "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[1],\"stream\":\"pp\"}]",
                      -1, NULL);
  struct compile_result r = compile_files("models/tiny-dense.json", 2, path, SCHED_CUSTOM, 0);
  GError *err = NULL;
  assert_true(plan_check_progress(r.plan, &err));
  struct plan_class *c = &r.plan->classes[r.plan->device_class[1]];
  uint32_t pp = IR_NONE;
  for (uint32_t s = 0; s < r.plan->n_streams; s++)
    if (strcmp(r.plan->streams[s].name, "pp") == 0)
      pp = s;
  assert_int_not_equal(pp, IR_NONE);
  uint32_t first = c->stream_first[pp], len = c->stream_first[pp + 1] - first;
  assert_int_equal(len, 2); /* recv activation, send gradient */
  uint32_t tmp = c->stream_instrs[first];
  c->stream_instrs[first] = c->stream_instrs[first + 1];
  c->stream_instrs[first + 1] = tmp;
  assert_false(plan_check_progress(r.plan, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "plan deadlocks"));
  assert_non_null(strstr(err->message, "device 1 stream pp waits at \"send B"));
  g_error_free(err);
  compile_result_free(&r);
  g_unlink(path);
  g_free(path);
}

/* 1F1B on 4 ranks with "stream": "pp" on every place: each device's pipeline traffic shares
 * one stream, so lowering groups its sends and receives. */
static struct compile_result compile_named_1f1b(char **path) {
  *path = g_build_filename(g_get_tmp_dir(), "piper-test-pp4-named.json", NULL);
  GString *prog = g_string_new("[");
  for (int k = 0; k < 4; k++)
    g_string_append_printf(prog,
                           "%s{\"op\":\"place\",\"filter\":{\"PP\":%d},\"devices\":[%d],"
                           "\"stream\":\"pp\"}",
                           k ? "," : "", k, k);
  g_string_append(prog, "]");
  g_file_set_contents(*path, prog->str, -1, NULL);
  g_string_free(prog, TRUE);
  return compile_files("models/tiny-dense.json", 4, *path, SCHED_1F1B, 8);
}

/* Megatron's send_forward_recv_backward: in a middle rank's steady state the forward it sends
 * and the gradient it receives next are ready together and go in one group (its backward send
 * and next forward receive become ready at different times there, so they stay apart); groups
 * are whole runs of consecutive entries of one stream, and the plan makes progress. */
static void test_lower_groups_named_stream(void **state) {
  (void)state;
  char *path;
  struct compile_result r = compile_named_1f1b(&path);
  const struct plan *p = r.plan;
  const struct plan_class *c = plan_device_class(p, 1);
  uint32_t fwd_bwd = 0, bwd_fwd = 0;
  for (uint32_t s = 0; s < p->n_streams; s++)
    for (uint32_t e = c->stream_first[s]; e < c->stream_first[s + 1];) {
      uint32_t n = plan_group_span(c, e);
      assert_true(e + n <= c->stream_first[s + 1]);
      if (n == 2) {
        const struct ir_node *a = &p->nodes[c->instrs[c->stream_instrs[e]].node];
        const struct ir_node *b = &p->nodes[c->instrs[c->stream_instrs[e + 1]].node];
        assert_int_equal(c->instrs[c->stream_instrs[e + 1]].group_parts, 2);
        const struct ir_node *snd = a->kind == IR_NODE_SEND ? a : b;
        const struct ir_node *rcv = a->kind == IR_NODE_SEND ? b : a;
        bool pair = snd->kind == IR_NODE_SEND && rcv->kind == IR_NODE_RECV;
        fwd_bwd += pair && snd->pass == IR_PASS_F && rcv->pass == IR_PASS_B;
        bwd_fwd += pair && snd->pass == IR_PASS_B && rcv->pass == IR_PASS_F;
      }
      e += n;
    }
  /* 8 micro-batches, rank 1 warms up with 3 forwards: 5 steady steps */
  if (fwd_bwd < 5)
    fail_msg("send F + recv B groups: %u (send B + recv F: %u); want at least 5", fwd_bwd, bwd_fwd);
  GError *err = NULL;
  assert_true(plan_check_progress(p, &err));
  compile_result_free(&r);
  g_unlink(path);
  g_free(path);
}

/* The progress check understands groups and still catches a hand-made deadlock: a group made
 * to take in the send that follows it, whose data comes from the compute that waits on the
 * group's own receive, can never be posted. */
static void test_progress_catches_group_deadlock(void **state) {
  (void)state;
  char *path;
  struct compile_result r = compile_named_1f1b(&path);
  struct plan_class *c = &r.plan->classes[r.plan->device_class[1]];
  uint32_t pp = IR_NONE;
  for (uint32_t s = 0; s < r.plan->n_streams; s++)
    if (strcmp(r.plan->streams[s].name, "pp") == 0)
      pp = s;
  assert_int_not_equal(pp, IR_NONE);
  uint32_t at = IR_NONE;
  for (uint32_t e = c->stream_first[pp]; e + 2 < c->stream_first[pp + 1] && at == IR_NONE;
       e += plan_group_span(c, e))
    if (plan_group_span(c, e) == 2 &&
        r.plan->nodes[c->instrs[c->stream_instrs[e + 1]].node].kind == IR_NODE_RECV &&
        r.plan->nodes[c->instrs[c->stream_instrs[e + 2]].node].kind == IR_NODE_SEND)
      at = e;
  assert_int_not_equal(at, IR_NONE);
  /* the send after it, and whatever was grouped with that send, join the group */
  uint32_t n = 2 + plan_group_span(c, at + 2);
  for (uint32_t k = 0; k < n; k++)
    c->instrs[c->stream_instrs[at + k]].group_parts = n;
  GError *err = NULL;
  assert_false(plan_check_progress(r.plan, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "plan deadlocks"));
  assert_non_null(strstr(err->message, "device 1 stream pp waits at"));
  g_error_free(err);
  compile_result_free(&r);
  g_unlink(path);
  g_free(path);
}

/* Same inputs, same plan: every lowered field is equal across two compilations. */
static void test_lower_deterministic(void **state) {
  (void)state;
  struct compile_result a =
      compile_files("models/tiny-moe.json", 4,
                    "directives/base-schedules/pp4_dp2_ep2_v_placement.json", SCHED_DUALPIPEV, 8);
  struct compile_result b =
      compile_files("models/tiny-moe.json", 4,
                    "directives/base-schedules/pp4_dp2_ep2_v_placement.json", SCHED_DUALPIPEV, 8);
  assert_true(plan_equal(a.plan, b.plan));
  assert_int_equal(a.plan->n_nodes, b.plan->n_nodes);
  compile_result_free(&a);
  compile_result_free(&b);
}

/* DualPipe runs two model copies: stage s on rank s for the first half of the micro-batches and
 * on rank R-1-s for the second; each pair's gradients are summed by an all-reduce over both. */
static void test_dualpipe_copies_sync(void **state) {
  (void)state;
  struct compile_result r = compile_files("models/tiny-dense.json", 4,
                                          "directives/base-schedules/pp4.json", SCHED_DUALPIPE, 8);
  uint32_t syncs = 0, optimizers = 0;
  for (uint32_t i = 0; i < r.plan->n_nodes; i++) {
    const struct ir_node *n = &r.plan->nodes[i];
    if (n->kind == IR_NODE_OPTIMIZER)
      optimizers++;
    if (n->kind != IR_NODE_ALL_REDUCE)
      continue;
    syncs++;
    const struct ir_group *grp = &r.plan->groups[n->group];
    assert_int_equal(grp->count, 2);
    uint32_t a = r.plan->device_pool[grp->first], b = r.plan->device_pool[grp->first + 1];
    assert_int_equal(a + b, 3); /* ranks s and R-1-s */
  }
  assert_int_equal(syncs, 2);      /* {0,3} and {1,2}, one bucket each for the tiny model */
  assert_int_equal(optimizers, 8); /* every device updates its two stages' copies */
  compile_result_free(&r);
  /* With data and expert parallelism in each rank (pp2_dp2_ep2: ranks [0,1] and [2,3]): the
   * dense segments' copies are summed over all four devices, each expert's over the two devices
   * holding it (position k of both groups: {0,2} and {1,3}): one collective over the four whose
   * communicator is split in two (instances {p mod 2 + 2k}), so that the devices of a group
   * keep one program. */
  r = compile_files("models/tiny-moe.json", 0, "directives/base-schedules/pp2_dp2_ep2.json",
                    SCHED_DUALPIPE, 4);
  uint32_t whole = 0, split = 0;
  for (uint32_t i = 0; i < r.plan->n_nodes; i++) {
    const struct ir_node *n = &r.plan->nodes[i];
    if (n->kind != IR_NODE_ALL_REDUCE)
      continue;
    assert_int_equal(r.plan->groups[n->group].count, 4);
    if (n->tp_degree == 2)
      split++;
    else
      whole++;
  }
  assert_int_equal(whole, 1);
  assert_int_equal(split, 1);
  uint32_t split_comms = 0;
  for (uint32_t c = 0; c < r.plan->n_comms; c++)
    split_comms += r.plan->comms[c].purpose == IR_COMM_DP && r.plan->comms[c].split == 2;
  assert_int_equal(split_comms, 1);
  assert_int_equal(r.plan->n_classes, 2); /* a program per rank: the pairs share it */
  compile_result_free(&r);
}

/* Every schedule builder through the real compiler, lowering and progress check, for R in
 * {2, 4, 8} and micro-batch counts at and above each family's minimum. llama3-8b (32 layers)
 * gives every layout its stages; placements are written per layout. */
static char *write_layout(const char *shape, uint32_t R, uint32_t *n_stages) {
  GString *s = g_string_new("[");
  uint32_t stages = strcmp(shape, "one") == 0 ? R : 2 * R;
  for (uint32_t st = 0; st < stages; st++) {
    uint32_t rank = strcmp(shape, "one") == 0    ? st
                    : strcmp(shape, "loop") == 0 ? st % R
                    : st < R                     ? st
                                                 : 2 * R - 1 - st;
    g_string_append_printf(s, "%s{\"op\":\"place\",\"filter\":{\"PP\":%u},\"devices\":[%u]}",
                           st ? "," : "", st, rank);
  }
  g_string_append(s, "]");
  char *path = g_strdup_printf("%s/piper-test-layout-%s-%u.json", g_get_tmp_dir(), shape, R);
  g_file_set_contents(path, s->str, -1, NULL);
  g_string_free(s, TRUE);
  *n_stages = stages;
  return path;
}

static void test_every_builder_compiles(void **state) {
  (void)state;
  static const struct {
    enum sched_family f;
    const char *shape;
    uint32_t min_mult; /* micro-batches tried: k * R for k = min_mult .. min_mult + 2 */
  } cases[] = {
      {SCHED_GPIPE, "one", 1},
      {SCHED_1F1B, "one", 1},
      {SCHED_ZEROBUBBLE, "one", 1},
      {SCHED_DUALPIPE, "one", 2},
      {SCHED_INTERLEAVED_1F1B, "loop", 1},
      {SCHED_ZBV, "v", 2},
      {SCHED_DUALPIPEV, "v", 2},
  };
  static const uint32_t ranks[] = {2, 4, 8};
  uint32_t compiled = 0;
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
    for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++) {
      uint32_t R = ranks[r], stages;
      char *path = write_layout(cases[c].shape, R, &stages);
      for (uint32_t k = cases[c].min_mult; k < cases[c].min_mult + 3; k++) {
        uint32_t M = k * R;
        struct compile_result res =
            compile_files("models/llama3-8b.json", (int)stages, path, cases[c].f, M);
        assert_int_equal(res.ranks, R);
        assert_int_equal(res.mbs, M);
        /* one F and one backward (B, or BI and BW) per stage and micro-batch */
        uint32_t f = 0, b = 0, bi = 0, bw = 0;
        for (uint32_t i = 0; i < res.plan->n_nodes; i++) {
          const struct ir_node *n = &res.plan->nodes[i];
          if (n->kind != IR_NODE_COMPUTE)
            continue;
          f += n->pass == IR_PASS_F;
          b += n->pass == IR_PASS_B;
          bi += n->pass == IR_PASS_BI;
          bw += n->pass == IR_PASS_BW;
        }
        uint32_t per_pass = res.model->n_segments * M;
        assert_int_equal(f, per_pass);
        assert_int_equal(b + bi, per_pass);
        assert_int_equal(bi, bw);
        assert_reader_accepts(res.plan);
        compile_result_free(&res);
        compiled++;
      }
      g_unlink(path);
      g_free(path);
    }
  assert_int_equal(compiled, 7 * 3 * 3);
}


/* A trainer holds one layer's transients at a time (Megatron, torchtitan, llm.c): so does the
 * plan (docs/memory.md). Llama-3-8B as one stage is one segment of 32 layers; each compute
 * instruction's workspace is the largest op group's transients, within 10% of one decoder
 * layer's from the model's per-op figures (F: its scratch and the outputs nothing keeps), not
 * the sum over the 32 layers. A backward holds one block of a layer at a time (attention's,
 * then the MLP's, each ending at its residual add, as autograd frees a block's gradients before
 * the block below runs): B's is the larger block's values' gradients, bwork and scratch, plus,
 * for the MLP's (the later one), the residual stream's gradient it hands attention's. */
static void test_workspace_one_layer(void **state) {
  (void)state;
  struct compile_options o = compile_options_default();
  o.model_path = "models/llama3-8b.json";
  o.layout = "pp=1";
  o.have_schedule = true;
  assert_true(sched_family_parse("gpipe", &o.schedule.family));
  o.schedule.mbs = 1;
  GError *err = NULL;
  struct plan *p = compile_take_plan(&o, &err);
  if (!p)
    fail_msg("compile: %s", err->message);
  const struct model *m = p->model;
  assert_int_equal(m->n_segments, 1);
  uint64_t layer_f = 0, layer_b = 0, block_b[2] = {0}, carried = 0;
  int block = 0;
  for (uint32_t k = 0; k < m->n_ops; k++) {
    const struct model_op *op = &m->ops[k];
    if (op->layer != 0)
      continue;
    layer_f += op->fwd_work_bytes;
    layer_b += op->out_bytes + op->bwork_bytes + op->bwd_scratch_bytes;
    assert_true(block < 2);
    block_b[block] += op->out_bytes + op->bwork_bytes + op->bwd_scratch_bytes;
    if (op->kind == MODEL_OP_RESIDUAL_ADD) { /* the stream's gradient: [T, hidden] */
      carried = op->out_bytes;
      block++;
    }
  }
  assert_int_equal(block, 2);
  block_b[1] += carried;
  uint64_t most_b = block_b[0] > block_b[1] ? block_b[0] : block_b[1];
  assert_true(most_b < layer_b);
  const struct model_segment *seg = &m->segments[0];
  assert_true(seg->bwd_keep_bytes + seg->bwd_scratch_bytes > 30 * layer_b); /* the old sum */
  const struct plan_class *c = plan_device_class(p, 0);
  uint64_t work[IR_PASS_NONE + 1] = {0};
  for (uint32_t t = 0; t < c->n_tensors; t++) {
    const struct plan_tensor *pt = &c->tensors[t];
    if (pt->kind != PLAN_TENSOR_WORK)
      continue;
    enum ir_pass pass = p->nodes[c->instrs[pt->producer].node].pass;
    if (pt->bytes > work[pass])
      work[pass] = pt->bytes;
  }
  assert_true(work[IR_PASS_B] >= most_b && work[IR_PASS_B] <= most_b + most_b / 10);
  assert_true(work[IR_PASS_F] >= layer_f && work[IR_PASS_F] <= layer_f + layer_f / 10);
  plan_free(p);
}

/* Every bundled base schedule compiles, lowers and passes the progress check with the model it
 * is written for. */
static void test_base_schedules_compile(void **state) {
  (void)state;
  static const struct {
    const char *file, *model;
    int pp;
    enum sched_family f;
    uint32_t mbs;
  } cases[] = {
      {"dp2", "models/tiny-moe.json", 1, SCHED_1F1B, 4},
      {"pp2_dp2_ep2", "models/tiny-moe.json", 0, SCHED_1F1B, 4},
      {"pp2_dp2_ep2_bucket100", "models/tiny-moe.json", 0, SCHED_ZEROBUBBLE, 4},
      {"pp2_dp2_ep2_zero2", "models/tiny-moe.json", 0, SCHED_GPIPE, 4},
      {"pp2_dp2_ep2_zero3", "models/tiny-moe.json", 0, SCHED_1F1B, 4},
      {"pp2_dp2_ep2_custom_order", "models/tiny-moe.json", 0, SCHED_CUSTOM, 0},
      {"pp4_dp2_ep2_interleaved", "models/tiny-moe.json", 4, SCHED_INTERLEAVED_1F1B, 4},
      {"pp4_dp2_ep2_v_placement", "models/tiny-moe.json", 4, SCHED_DUALPIPEV, 4},
      {"pp4", "models/tiny-dense.json", 4, SCHED_DUALPIPE, 8},
      {"pp4_v", "models/tiny-dense.json", 8, SCHED_ZBV, 8},
      {"pp4_interleaved", "models/tiny-dense.json", 8, SCHED_INTERLEAVED_1F1B, 8},
      {"pp8", "models/tiny-dense.json", 8, SCHED_ZEROBUBBLE, 8},
      {"deepseek_v3_pp32_v_dp128_ep128", "models/deepseek-v3.json", 32, SCHED_DUALPIPEV, 32},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *path = g_strdup_printf("directives/base-schedules/%s.json", cases[i].file);
    struct compile_result r =
        compile_files(cases[i].model, cases[i].pp, path, cases[i].f, cases[i].mbs);
    assert_non_null(r.plan);
    assert_true(r.plan->n_devices >= 2);
    assert_reader_accepts(r.plan);
    compile_result_free(&r);
    g_free(path);
  }
}

/* Megatron's batch fields on the front end: --micro-batch-size and --seq-length replace the
 * model file's (which keeps them), --global-batch-size gives the micro-batch count as
 * global / (micro-batch size x dp), dp from the placement (pp2_dp2_ep2: 2 replicas); a global
 * batch that is no whole number of micro-batches, or a count that disagrees, is refused. */
static void test_megatron_batch_fields(void **state) {
  (void)state;
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-moe.json";
  o.directives_path = "directives/base-schedules/pp2_dp2_ep2.json";
  o.lower = false;
  struct compile_result r = {0};
  GError *err = NULL;
  assert_true(compile_run(&o, &r, &err));
  int64_t file_seq = r.model->seq_len, file_micro = r.model->micro_batch_size;
  compile_result_free(&r);

  o.micro_batch_size = 3;
  o.seq_len = file_seq * 2;
  o.global_batch_size = 3 * 2 * 5; /* 5 micro-batches of 3 sequences on each of 2 replicas */
  assert_true(compile_run(&o, &r, &err));
  assert_int_equal(r.model->micro_batch_size, 3);
  assert_int_equal(r.model->seq_len, file_seq * 2);
  assert_int_equal(r.mbs, 5);
  compile_result_free(&r);
  assert_int_not_equal(file_micro, 3); /* the file's own values were replaced, not kept */

  o.schedule.mbs = 5; /* agreeing: accepted */
  assert_true(compile_run(&o, &r, &err));
  compile_result_free(&r);
  o.schedule.mbs = 4;
  assert_false(compile_run(&o, &r, &err));
  assert_non_null(strstr(err->message, "--num-micro-batches 4 disagrees with --global-batch-size 30"));
  g_clear_error(&err);
  o.schedule.mbs = 0;
  o.global_batch_size = 31;
  assert_false(compile_run(&o, &r, &err));
  assert_non_null(strstr(err->message, "--global-batch-size 31: not a whole number of micro-batches "
                                       "of 6 sequences (micro-batch size 3 x data-parallel 2)"));
  g_clear_error(&err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_build_dense),
      cmocka_unit_test(test_stream_declarations_kept),
      cmocka_unit_test(test_split_multiplies_matched_nodes),
      cmocka_unit_test(test_place_adds_send_recv_per_crossing_edge),
      cmocka_unit_test(test_replicate_buckets),
      cmocka_unit_test(test_replicate_zero1),
      cmocka_unit_test(test_zero3_prefetch_edges),
      cmocka_unit_test(test_recompute_rewrite),
      cmocka_unit_test(test_expert_recompute_all_to_all),
      cmocka_unit_test(test_shard_adds_all_to_all),
      cmocka_unit_test(test_order_adds_temporal_edges),
      cmocka_unit_test(test_bad_programs),
      cmocka_unit_test(test_lower_pp2_dp2_ep2),
      cmocka_unit_test(test_lower_1f1b_order),
      cmocka_unit_test(test_progress_catches_deadlock),
      cmocka_unit_test(test_progress_deadlock_replicated),
      cmocka_unit_test(test_lower_groups_named_stream),
      cmocka_unit_test(test_progress_catches_group_deadlock),
      cmocka_unit_test(test_lower_deterministic),
      cmocka_unit_test(test_dualpipe_copies_sync),
      cmocka_unit_test(test_every_builder_compiles),
      cmocka_unit_test(test_base_schedules_compile),
      cmocka_unit_test(test_workspace_one_layer),
      cmocka_unit_test(test_megatron_batch_fields),
      cmocka_unit_test(test_topo_incremental_exact),
  };
  return cmocka_run_group_tests_name("compile", tests, NULL, NULL);
}
