/* Tests of plan views and plan files: a hand-built plan (2 pipeline stages x 2 data-parallel
 * replicas = 4 devices, so each class has two members), its per-device views, write -> read ->
 * plan_equal, byte-identical rewrites, corrupt files each refused with a located message, and
 * the round trip of a lowered plan (tiny-moe, pp2_dp2_ep2, 1F1B). Run from the repository root. */
#include "test-helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../../directives/compile.h"
#include "../../base/json.h"
#include "../../ir/plan.h"
#include "../../models/model.h"
#include "../../sim/sim.h"

/* --- the hand-built plan --------------------------------------------------------------------
 * Groups: g0 = {0, 2} (stage 0), g1 = {1, 3} (stage 1).
 * Nodes: 0 F PP=0, 1 send F g0->g1, 2 recv F g1<-g0, 3 F PP=1, 4 all-reduce over g0,
 *        5 all-reduce over g1, 6 optimizer g0, 7 optimizer g1.
 * Communicators: 0 pp g0->g1, 1 dp g0, 2 dp g1.
 * Class 0 = {0, 2}: F(0) send(1) all_reduce(4) optimizer(6).
 * Class 1 = {1, 3}: recv(2) F(3) all_reduce(5) optimizer(7).
 * Streams: 0 compute, 1 comm (priority 1, 25% of the SMs). */

#define NODE(k, pass_, purpose_, group_, peer_, stream_, pair_, segset_, bytes_)                   \
  {                                                                                                \
    .kind = (k), .pass = (pass_), .purpose = (purpose_), .segment = IR_NONE, .group = (group_),    \
    .peer_group = (peer_), .stream = (stream_), .pair = (pair_), .segset = (segset_),              \
    .bytes = (bytes_), .shard_degree = 1, .replica_degree = 2, .directive = IR_NONE                \
  }

static void *copy_of(const void *src, size_t bytes) {
  return g_memdup2(src, bytes);
}

static struct plan *hand_plan(void) {
  struct plan *p = g_new0(struct plan, 1);
  p->model = test_load_model("models/tiny-dense.json", 0);
  cJSON *mj = model_to_json(p->model);
  p->model_json = cJSON_PrintUnformatted(mj);
  cJSON_Delete(mj);
  p->program_json = g_strdup("[{\"op\": \"place\", \"filter\": {\"PP\": 0}, \"devices\": [0, 2]}]");
  p->n_devices = 4;
  p->n_microbatches = 1;
  p->n_tags = p->model->n_tags + 1;
  memcpy(p->tag_names, p->model->tag_names, sizeof p->model->tag_names);
  strcpy(p->tag_names[p->model->n_tags], "MB");
  uint32_t mb = p->model->n_tags;

  struct ir_node nodes[] = {
      NODE(IR_NODE_COMPUTE, IR_PASS_F, IR_COMM_NONE, 0, IR_NONE, 0, IR_NONE, IR_NONE, 4096),
      NODE(IR_NODE_SEND, IR_PASS_F, IR_COMM_PP, 0, 1, 1, 2, IR_NONE, 4096),
      NODE(IR_NODE_RECV, IR_PASS_F, IR_COMM_PP, 1, 0, 1, 1, IR_NONE, 4096),
      NODE(IR_NODE_COMPUTE, IR_PASS_F, IR_COMM_NONE, 1, IR_NONE, 0, IR_NONE, IR_NONE, 4096),
      NODE(IR_NODE_ALL_REDUCE, IR_PASS_B, IR_COMM_DP, 0, IR_NONE, 1, IR_NONE, 0, 1000),
      NODE(IR_NODE_ALL_REDUCE, IR_PASS_B, IR_COMM_DP, 1, IR_NONE, 1, IR_NONE, 1, 1000),
      NODE(IR_NODE_OPTIMIZER, IR_PASS_NONE, IR_COMM_NONE, 0, IR_NONE, 0, IR_NONE, 0, 0),
      NODE(IR_NODE_OPTIMIZER, IR_PASS_NONE, IR_COMM_NONE, 1, IR_NONE, 0, IR_NONE, 1, 0),
  };
  p->n_nodes = G_N_ELEMENTS(nodes);
  for (uint32_t i = 0; i < p->n_nodes; i++) {
    for (int t = 0; t < IR_MAX_TAGS; t++)
      nodes[i].tags[t] = -1;
    nodes[i].tags[MODEL_TAG_PP] = nodes[i].group == 0 ? 0 : 1;
    if (i < 4)
      nodes[i].tags[mb] = 0;
    /* Above 2^53, so it only survives the files as text. */
    nodes[i].priority = (UINT64_C(1) << 62) | ((uint64_t)i << 32) | 7;
  }
  /* The reader checks a plan against its model (ir/plan_model.c): compute nodes carry their
   * segment's tags (segment 1 is PP region 1), segment sets their segments' parameter bytes,
   * gradient all-reduces their set's bytes. */
  const struct model_segment *ms = p->model->segments;
  nodes[0].segment = 0;
  nodes[3].segment = 1;
  nodes[4].bytes = ms[0].param_bytes;
  nodes[5].bytes = ms[1].param_bytes + ms[2].param_bytes;
  nodes[3].shard_grads = true;
  nodes[4].directive = 3;
  p->nodes = copy_of(nodes, sizeof nodes);

  struct ir_group groups[] = {{0, 2}, {2, 2}};
  uint32_t pool[] = {0, 2, 1, 3};
  p->n_groups = 2;
  p->groups = copy_of(groups, sizeof groups);
  p->n_device_pool = 4;
  p->device_pool = copy_of(pool, sizeof pool);
  struct ir_segset segsets[] = {{0, 1, nodes[4].bytes}, {1, 2, nodes[5].bytes}};
  uint32_t segs[] = {0, 1, 2};
  p->n_segsets = 2;
  p->segsets = copy_of(segsets, sizeof segsets);
  p->n_segment_pool = 3;
  p->segment_pool = copy_of(segs, sizeof segs);
  struct ir_stream streams[2] = {{"compute", 0, 1.0}, {"comm", 1, 0.25}};
  p->n_streams = 2;
  p->streams = copy_of(streams, sizeof streams);
  struct plan_comm comms[] = {
      {IR_COMM_PP, 0, 1, 0, 0, 0}, {IR_COMM_DP, 0, IR_NONE, 0, 0, 0}, {IR_COMM_DP, 1, IR_NONE, 0, 0, 0}};
  p->n_comms = 3;
  p->comms = copy_of(comms, sizeof comms);

  p->n_classes = 2;
  p->classes = g_new0(struct plan_class, 2);
  uint32_t device_class[] = {0, 1, 0, 1};
  p->device_class = copy_of(device_class, sizeof device_class);
  /* Class 0: F, send (waits F), all-reduce, optimizer (waits all-reduce). Tensor 0 = F's
   * output, read by the send; tensor 1 = saved activations, read by the all-reduce. */
  {
    struct plan_class *c = &p->classes[0];
    uint32_t devices[] = {0, 2};
    struct plan_instr instrs[] = {
        {.node = 0,
         .stream = 0,
         .comm = IR_NONE,
         .seq = IR_NONE,
         .write_first = 0,
         .write_count = 2},
        {.node = 1,
         .stream = 1,
         .comm = 0,
         .seq = 0,
         .wait_first = 0,
         .wait_count = 1,
         .read_first = 0,
         .read_count = 1},
        {.node = 4, .stream = 1, .comm = 1, .seq = 0, .read_first = 1, .read_count = 1},
        {.node = 6, .stream = 0, .comm = IR_NONE, .seq = IR_NONE, .wait_first = 1, .wait_count = 1},
    };
    uint32_t stream_first[] = {0, 2, 4}, stream_instrs[] = {0, 3, 1, 2};
    uint32_t waits[] = {0, 2}, reads[] = {0, 1}, writes[] = {0, 1}, consumers[] = {1, 2};
    struct plan_tensor tensors[] = {{4096, 0, PLAN_TENSOR_OUT, 0, 1, 0, 1},
                                    {8192, 0, PLAN_TENSOR_SAVED, 1, 1, 0, 2}};
    c->n_devices = 2;
    c->devices = copy_of(devices, sizeof devices);
    c->n_instrs = 4;
    c->instrs = copy_of(instrs, sizeof instrs);
    c->stream_first = copy_of(stream_first, sizeof stream_first);
    c->stream_instrs = copy_of(stream_instrs, sizeof stream_instrs);
    c->n_waits = 2, c->waits = copy_of(waits, sizeof waits);
    c->n_reads = 2, c->reads = copy_of(reads, sizeof reads);
    c->n_writes = 2, c->writes = copy_of(writes, sizeof writes);
    c->n_consumers = 2, c->consumers = copy_of(consumers, sizeof consumers);
    c->n_tensors = 2, c->tensors = copy_of(tensors, sizeof tensors);
  }
  /* Class 1: recv, F (waits recv, reads what it received), all-reduce, optimizer. */
  {
    struct plan_class *c = &p->classes[1];
    uint32_t devices[] = {1, 3};
    struct plan_instr instrs[] = {
        {.node = 2, .stream = 1, .comm = 0, .seq = 0, .write_first = 0, .write_count = 1},
        {.node = 3,
         .stream = 0,
         .comm = IR_NONE,
         .seq = IR_NONE,
         .wait_first = 0,
         .wait_count = 1,
         .read_first = 0,
         .read_count = 1},
        {.node = 5, .stream = 1, .comm = 2, .seq = 0, .wait_first = 1, .wait_count = 1},
        {.node = 7, .stream = 0, .comm = IR_NONE, .seq = IR_NONE, .wait_first = 2, .wait_count = 1},
    };
    uint32_t stream_first[] = {0, 2, 4}, stream_instrs[] = {1, 3, 0, 2};
    uint32_t waits[] = {0, 1, 2}, reads[] = {0}, writes[] = {0}, consumers[] = {1};
    struct plan_tensor tensors[] = {{4096, 0, PLAN_TENSOR_OUT, 0, 1, 0, 1}};
    c->n_devices = 2;
    c->devices = copy_of(devices, sizeof devices);
    c->n_instrs = 4;
    c->instrs = copy_of(instrs, sizeof instrs);
    c->stream_first = copy_of(stream_first, sizeof stream_first);
    c->stream_instrs = copy_of(stream_instrs, sizeof stream_instrs);
    c->n_waits = 3, c->waits = copy_of(waits, sizeof waits);
    c->n_reads = 1, c->reads = copy_of(reads, sizeof reads);
    c->n_writes = 1, c->writes = copy_of(writes, sizeof writes);
    c->n_consumers = 1, c->consumers = copy_of(consumers, sizeof consumers);
    c->n_tensors = 1, c->tensors = copy_of(tensors, sizeof tensors);
  }
  plan_index_positions(p);
  GError *perr = NULL;
  if (!plan_check_progress(p, &perr))
    fail_msg("hand plan: %s", perr->message);
  return p;
}

/* --- helpers ------------------------------------------------------------------------------- */

static void write_ok(const struct plan *p, const char *dir) {
  GError *err = NULL;
  if (!plan_write_dir(p, dir, &err))
    fail_msg("write %s: %s", dir, err->message);
}

static struct plan *read_ok(const char *dir) {
  GError *err = NULL;
  struct plan *p = plan_read_dir(dir, &err);
  if (!p)
    fail_msg("read %s: %s", dir, err->message);
  return p;
}

static char *slurp(const char *dir, const char *name) {
  char *path = g_build_filename(dir, name, NULL);
  char *text = test_read_file(path);
  g_free(path);
  return text;
}

/* Every file of plan a's directory equals the same file of b's, byte for byte. */
static void assert_same_files(const char *a, const char *b, uint32_t n_devices) {
  for (uint32_t d = 0; d <= n_devices; d++) {
    char name[32];
    if (d == n_devices)
      snprintf(name, sizeof name, "plan.json");
    else
      snprintf(name, sizeof name, "device-%u.json", d);
    char *x = slurp(a, name), *y = slurp(b, name);
    if (strcmp(x, y) != 0)
      fail_msg("%s differs between %s and %s", name, a, b);
    g_free(x);
    g_free(y);
  }
}

/* --- views --------------------------------------------------------------------------------- */

static void test_views(void **state) {
  (void)state;
  struct plan *p = hand_plan();
  assert_ptr_equal(plan_device_class(p, 0), &p->classes[0]);
  assert_ptr_equal(plan_device_class(p, 3), &p->classes[1]);
  assert_null(plan_device_class(p, 4));

  assert_int_equal(plan_node_position(p, 0, 2), 1);
  assert_int_equal(plan_node_position(p, 0, 1), -1);
  assert_int_equal(plan_node_position(p, 99, 0), -1);

  /* Device 2 is position 1 of g0, so it sends to position 1 of g1 (device 3), and back. */
  assert_int_equal(plan_peer(p, 1, 0), 1);
  assert_int_equal(plan_peer(p, 1, 2), 3);
  assert_int_equal(plan_peer(p, 2, 3), 2);
  assert_int_equal(plan_peer(p, 2, 1), 0);
  assert_int_equal(plan_peer(p, 0, 0), IR_NONE); /* compute has no peer */
  assert_int_equal(plan_peer(p, 1, 1), IR_NONE); /* device 1 does not run the send */

  assert_int_equal(plan_comm_size(p, 0), 2);
  assert_int_equal(plan_comm_size(p, 1), 2);
  assert_int_equal(plan_comm_size(p, 9), 0);
  assert_int_equal(plan_comm_rank(p, 0, 2), 0); /* sender */
  assert_int_equal(plan_comm_rank(p, 0, 3), 1); /* receiver */
  assert_int_equal(plan_comm_rank(p, 1, 2), 1); /* position in g0 */
  assert_int_equal(plan_comm_rank(p, 1, 1), -1);
  assert_int_equal(plan_comm_rank(p, 2, 3), 1);
  uint32_t m[2] = {99, 99};
  plan_comm_members(p, 0, 3, m);
  assert_int_equal(m[0], 2);
  assert_int_equal(m[1], 3);
  plan_comm_members(p, 0, 0, m);
  assert_int_equal(m[0], 0);
  assert_int_equal(m[1], 1);
  plan_comm_members(p, 2, 0, m); /* DP: the group, whoever asks */
  assert_int_equal(m[0], 1);
  assert_int_equal(m[1], 3);

  char name[128];
  plan_comm_name(p, 0, name, sizeof name);
  assert_string_equal(name, "pp g0->g1");
  plan_comm_name(p, 2, name, sizeof name);
  assert_string_equal(name, "dp g1");
  plan_comm_name(p, 7, name, sizeof name);
  assert_string_equal(name, "comm 7?");
  plan_node_name(p, 1, name, sizeof name);
  assert_true(g_str_has_prefix(name, "send F"));
  assert_non_null(strstr(name, "PP=0"));
  assert_non_null(strstr(name, "MB=0"));
  assert_non_null(strstr(name, "->g1"));
  plan_node_name(p, 42, name, sizeof name);
  assert_string_equal(name, "node 42?");

  assert_int_equal(plan_instruction_count(p), 16);
  plan_free(p);
  plan_free(NULL);
}

/* --- round trip ---------------------------------------------------------------------------- */

static void test_round_trip(void **state) {
  (void)state;
  struct plan *p = hand_plan();
  char *a = test_tmp_dir("test_plan-XXXXXX"), *b = test_tmp_dir("test_plan-XXXXXX"),
       *c = test_tmp_dir("test_plan-XXXXXX");
  write_ok(p, a);
  struct plan *q = read_ok(a);
  assert_true(plan_equal(p, q));
  assert_true(plan_equal(q, p));
  /* Spot checks that the reader did not just copy through. */
  assert_int_equal(q->nodes[5].priority, (UINT64_C(1) << 62) | (UINT64_C(5) << 32) | 7);
  assert_true(q->streams[1].sm_share == 0.25);
  assert_int_equal(q->streams[1].priority, 1);
  assert_string_equal(q->streams[1].name, "comm");
  assert_int_equal(q->nodes[4].directive, 3);
  assert_true(q->nodes[3].shard_grads);
  assert_string_equal(q->model->name, "tiny-dense");
  assert_int_equal(q->model->n_segments, p->model->n_segments);
  assert_int_equal(q->classes[1].tensors[0].producer, 0);
  assert_int_equal(q->classes[0].instrs[1].comm, 0);

  /* Same plan twice -> same bytes; and the plan read back writes the same bytes again. */
  write_ok(p, b);
  assert_same_files(a, b, 4);
  write_ok(q, c);
  assert_same_files(a, c, 4);

  /* plan_equal notices a change anywhere. */
  q->classes[1].instrs[2].seq = 1;
  assert_false(plan_equal(p, q));
  q->classes[1].instrs[2].seq = 0;
  q->nodes[6].priority++;
  assert_false(plan_equal(p, q));
  q->nodes[6].priority--;
  q->device_pool[1] = 3, q->device_pool[3] = 2;
  assert_false(plan_equal(p, q));
  q->device_pool[1] = 2, q->device_pool[3] = 3;
  q->classes[0].waits[q->classes[0].instrs[3].wait_first] = 1;
  assert_false(plan_equal(p, q));
  q->classes[0].waits[q->classes[0].instrs[3].wait_first] = 2;
  assert_true(plan_equal(p, q));
  g_free(q->program_json);
  q->program_json = NULL;
  assert_false(plan_equal(p, q));

  /* A smaller plan written over a larger one leaves no stale device files. */
  char *stale = g_build_filename(a, "device-4.json", NULL);
  assert_true(g_file_set_contents(stale, "{}", -1, NULL));
  write_ok(p, a);
  assert_false(g_file_test(stale, G_FILE_TEST_EXISTS));
  g_free(stale);

  plan_free(q);
  plan_free(p);
  test_remove_tree(a);
  test_remove_tree(b);
  test_remove_tree(c);
  g_free(a);
  g_free(b);
  g_free(c);
}

/* The file layout people read: one instruction per line, readable names and peers. */
static void test_readable(void **state) {
  (void)state;
  struct plan *p = hand_plan();
  char *dir = test_tmp_dir("test_plan-XXXXXX");
  write_ok(p, dir);
  char *dev = slurp(dir, "device-2.json");
  const char *send = strstr(dev, "\"op\":\"send\"");
  assert_non_null(send);
  const char *eol = strchr(send, '\n');
  const char *peer = strstr(send, "\"peer\":3");
  assert_true(peer && peer < eol);
  assert_non_null(strstr(dev, "\"name\":\"pp g0->g1\""));
  assert_non_null(strstr(dev, "\"members\":[2,3]"));
  char *index = slurp(dir, "plan.json");
  assert_non_null(strstr(index, "\"format\": \"piper-plan\""));
  assert_non_null(strstr(index, "\"priority\":\"0x4000000500000007\""));
  assert_non_null(strstr(index, "\"instructions\":16"));
  g_free(dev);
  g_free(index);
  plan_free(p);
  test_remove_tree(dir);
  g_free(dir);
}

/* --- corrupt files ------------------------------------------------------------------------- */

/* Sets (value = JSON text) or deletes (value = NULL) the member at path in file, where path is
 * keys and array indices separated by '/'. */
static void edit(const char *dir, const char *file, const char *path, const char *value) {
  char *full = g_build_filename(dir, file, NULL);
  GError *err = NULL;
  cJSON *root = json_parse_file(full, &err);
  if (!root)
    fail_msg("%s", err->message);
  char **parts = g_strsplit(path, "/", -1);
  cJSON *parent = root;
  guint n = g_strv_length(parts);
  for (guint i = 0; i + 1 < n; i++) {
    parent = cJSON_IsArray(parent) ? cJSON_GetArrayItem(parent, atoi(parts[i]))
                                   : cJSON_GetObjectItemCaseSensitive(parent, parts[i]);
    if (!parent)
      fail_msg("%s: no %s in %s", file, parts[i], path);
  }
  const char *last = parts[n - 1];
  if (cJSON_IsArray(parent)) {
    if (value)
      cJSON_ReplaceItemInArray(parent, atoi(last), cJSON_Parse(value));
    else
      cJSON_DeleteItemFromArray(parent, atoi(last));
  } else {
    cJSON_DeleteItemFromObjectCaseSensitive(parent, last);
    if (value)
      cJSON_AddItemToObject(parent, last, cJSON_Parse(value));
  }
  if (!json_write_file(full, root, &err))
    fail_msg("%s", err->message);
  g_strfreev(parts);
  cJSON_Delete(root);
  g_free(full);
}

struct corrupt_case {
  const char *file, *path, *value; /* an edit; path NULL: truncate file to half / delete it */
  const char *expect;              /* substring of the error message */
};

static const struct corrupt_case corrupt_cases[] = {
    {"plan.json", NULL, "truncate", "plan.json:"},
    {"plan.json", NULL, "truncate", "malformed JSON"},
    {"device-1.json", NULL, "delete", "device-1.json: cannot open"},
    {"plan.json", "version", "2", "plan format version 2 is not supported"},
    {"plan.json", "format", "\"piper-plot\"",
     "\"format\" is \"piper-plot\", expected \"piper-plan\""},
    {"device-0.json", "version", "\"1\"", "device-0.json: \"version\" must be an integer"},
    {"plan.json", "nodes", NULL, "plan.json: missing key \"nodes\""},
    {"plan.json", "nodes/2/bytes", "\"big\"", "nodes[2]: \"bytes\" must be an integer"},
    {"plan.json", "nodes/2/group", "7", "nodes[2]: \"group\" = 7 is out of range [0, 1]"},
    {"plan.json", "nodes/2/peer_group", "null", "nodes[2]: a recv needs a \"peer_group\""},
    {"plan.json", "nodes/0/colour", "1", "nodes[0]: unknown key \"colour\""},
    {"plan.json", "nodes/0/tags/XX", "1", "\"XX\" is not a tag"},
    {"plan.json", "nodes/0/priority", "\"12\"", "\"priority\" must be a hex string"},
    {"plan.json", "nodes/1/kind", "\"teleport\"", "nodes[1]: \"kind\" is not a node kind"},
    {"plan.json", "groups/1/devices", "[1, 9]",
     "groups[1]: \"devices\"[1] must be an integer in [0, 3]"},
    {"plan.json", "groups/1/devices", "[1, 1]", "groups[1]: device 1 is listed twice"},
    {"plan.json", "streams/1/sm_share", "2", "streams[1]: \"sm_share\" must be a number in [0, 1]"},
    {"plan.json", "streams/1/name", "\"compute\"", "stream \"compute\" is listed twice"},
    {"plan.json", "communicators/0/peer_group", "null", "a pp communicator needs a \"peer_group\""},
    {"plan.json", "classes/0/instructions", "5",
     "device-0.json: lists 4 instructions, plan.json says class 0 has 5"},
    {"plan.json", "classes/1/devices", "[1, 2]", "device 2 is also in class 0"},
    {"plan.json", "device_class", "[0, 1, 0]", "\"device_class\" has 3 entries for 4 devices"},
    {"plan.json", "summary/instructions", "15", "\"summary\": \"instructions\" is 15"},
    {"plan.json", "model/hidden_size", "-3", "plan.json: \"model\": "},
    /* A model that parses but disagrees with the nodes (ir/plan_model.c). */
    {"plan.json", "model/hidden_size", "128",
     "plan.json: segsets[0]: \"param_bytes\" is 361472, but the embedded \"model\"'s segments in "
     "it hold 722944 bytes of parameters"},
    {"plan.json", "model/vocab_size", "512", "segsets[0]: \"param_bytes\" is 361472, but"},
    {"plan.json", "nodes/3/segment", "2",
     "node 3 \"F s2 PP=1 MB=0\": the embedded \"model\" disagrees: tag PP is 1, the model's "
     "segment 2 has 2"},
    {"plan.json", "nodes/4/bytes", "7",
     "node 4 \"all_reduce B PP=0 set=0 @g0\": the embedded "
     "\"model\" disagrees: it moves 7 bytes, the model gives 361472"},
    {"plan.json", "tags/0", "\"QQ\"", "tags[0]: \"QQ\" differs from the model's tag 0"},
    {"device-1.json", "device", "3",
     "device-1.json: \"device\" is 3, but this is the file of device 1"},
    {"device-2.json", "streams/1/instructions/0/node", "99",
     "device-2.json: streams[1].instructions[0]: \"node\" = 99 is out of range [0, 7]"},
    {"device-2.json", "streams/1/instructions/0/node", "2",
     "device 2 is not in group 1, which runs node 2"},
    {"device-2.json", "streams/1/instructions/0/peer", "1",
     "\"peer\" is 1, but device 2's peer on node 1 is 3"},
    {"device-2.json", "streams/1/instructions/0/seq", "1",
     "\"seq\" is 1, but this is instruction 0"},
    {"device-2.json", "streams/1/instructions/0/rank", "1",
     "\"rank\" is 1, but device 2 has rank 0"},
    {"device-2.json", "streams/1/instructions/0/bytes", "1", "\"bytes\" is 1, but node 1 has 4096"},
    {"device-2.json", "streams/1/instructions/0/waits", "[1]",
     "\"waits\"[0] must be an integer in [0, 0]"},
    {"device-2.json", "streams/1/instructions/0/i", "0", "instruction 0 is listed twice"},
    {"device-2.json", "streams/0/instructions/1/i", "2", "instruction 2 is listed twice"},
    {"device-2.json", "streams/0/instructions/0/comm", "1",
     "\"comm\" is set, but node 0 uses no communicator"},
    {"device-2.json", "streams/1/instructions/1/comm", "0", "communicator 0 is a pp communicator"},
    /* Both members of class 0 must carry the same program. */
    {"device-2.json", "streams/0/instructions/1/waits", "[1]",
     "device-2.json: its program differs from device 0's (both in class 0) at instruction 3 "
     "\"waits\""},
    {"device-2.json", "tensors/1/bytes", "1",
     "differs from device 0's (both in class 0) at tensor 1"},
    {"device-3.json", "tensors/0/consumers", "[0]",
     "consumer 0 does not come after its producer 0"},
    {"device-3.json", "tensors/0/producer", "1", "its producer, instruction 1, does not list it"},
    {"device-3.json", "streams/0/instructions/0/reads", "[]",
     "its consumer, instruction 1, does not list it"},
    {"device-3.json", "streams/1/name", "\"other\"",
     "streams[1]: \"name\" is \"other\", expected \"comm\""},
    {"device-3.json", "groups/0/position", "0", "groups[0]: expected group 1, position 1"},
    {"device-3.json", "communicators/0/members", "[0, 1]", "\"members\" must be [2, 3]"},
    {"device-3.json", "class", "0", "\"class\" differs from plan.json's device_class[3]"},
    {"device-3.json", "streams", "[]", "\"streams\" has 0 entries, plan.json declares 2 streams"},
};

static void test_corrupt(void **state) {
  (void)state;
  struct plan *p = hand_plan();
  char *dir = test_tmp_dir("test_plan-XXXXXX");
  for (size_t k = 0; k < G_N_ELEMENTS(corrupt_cases); k++) {
    const struct corrupt_case *c = &corrupt_cases[k];
    write_ok(p, dir);
    char *full = g_build_filename(dir, c->file, NULL);
    if (!c->path && strcmp(c->value, "delete") == 0) {
      g_remove(full);
    } else if (!c->path) {
      char *text = slurp(dir, c->file);
      assert_true(g_file_set_contents(full, text, (gssize)strlen(text) / 2, NULL));
      g_free(text);
    } else {
      edit(dir, c->file, c->path, c->value);
    }
    g_free(full);
    GError *err = NULL;
    struct plan *q = plan_read_dir(dir, &err);
    if (q)
      fail_msg("case %zu (%s %s): read a corrupt plan", k, c->file, c->path ? c->path : "");
    assert_true(g_error_matches(err, PIPER_ERROR, PIPER_ERROR_INPUT));
    if (!strstr(err->message, c->expect))
      fail_msg("case %zu: message \"%s\" lacks \"%s\"", k, err->message, c->expect);
    assert_null(strchr(err->message, '\n'));
    g_error_free(err);
  }
  plan_free(p);
  test_remove_tree(dir);
  g_free(dir);
}

/* plan_from_json: the in-memory entry point the fuzzer uses, including its count check. */
static void test_from_json(void **state) {
  (void)state;
  struct plan *p = hand_plan();
  char *dir = test_tmp_dir("test_plan-XXXXXX");
  write_ok(p, dir);
  GError *err = NULL;
  char *path = g_build_filename(dir, "plan.json", NULL);
  cJSON *index = json_parse_file(path, &err);
  g_free(path);
  assert_non_null(index);
  cJSON *docs[4];
  for (int d = 0; d < 4; d++) {
    char name[32];
    snprintf(name, sizeof name, "device-%d.json", d);
    path = g_build_filename(dir, name, NULL);
    docs[d] = json_parse_file(path, &err);
    g_free(path);
    assert_non_null(docs[d]);
  }
  struct plan *q = plan_from_json("mem", index, (const cJSON *const *)docs, 4, &err);
  assert_non_null(q);
  assert_true(plan_equal(p, q));
  plan_free(q);
  q = plan_from_json("mem", index, (const cJSON *const *)docs, 3, &err);
  assert_null(q);
  assert_non_null(strstr(err->message, "mem/plan.json: 3 device documents for 4 devices"));
  g_clear_error(&err);
  /* A duplicate key inside the directive program (kept as written, not read key by key) is
   * refused in memory as in the files: it used to read once and then not back. */
  cJSON *dup = cJSON_Duplicate(index, true);
  cJSON *prog = cJSON_GetObjectItemCaseSensitive(dup, "program");
  assert_true(cJSON_IsArray(prog) && cJSON_IsObject(prog->child));
  cJSON_AddStringToObject(prog->child, "op", "place");
  q = plan_from_json("mem", dup, (const cJSON *const *)docs, 4, &err);
  assert_null(q);
  assert_non_null(strstr(err->message, "mem/plan.json: key \"op\" appears twice in \"program[0]\""));
  g_clear_error(&err);
  cJSON_Delete(dup);
  const cJSON *none[4] = {docs[0], NULL, docs[2], docs[3]};
  q = plan_from_json("mem", index, none, 4, &err);
  assert_null(q);
  assert_non_null(strstr(err->message, "mem/device-1.json: expected an object"));
  g_clear_error(&err);
  for (int d = 0; d < 4; d++)
    cJSON_Delete(docs[d]);
  cJSON_Delete(index);
  plan_free(p);
  test_remove_tree(dir);
  g_free(dir);
}

/* --- a lowered plan ------------------------------------------------------------------------ */

static void test_lowered_round_trip(void **state) {
  (void)state;
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-moe.json";
  o.directives_path = "directives/base-schedules/pp2_dp2_ep2.json";
  o.have_schedule = true;
  o.schedule.family = SCHED_1F1B;
  o.schedule.mbs = 4;
  struct compile_result r = test_compile(&o);
  char *a = test_tmp_dir("test_plan-XXXXXX"), *b = test_tmp_dir("test_plan-XXXXXX");
  write_ok(r.plan, a);
  struct plan *q = read_ok(a);
  assert_true(plan_equal(r.plan, q));
  assert_int_equal(plan_instruction_count(q), plan_instruction_count(r.plan));
  assert_int_equal(q->n_devices, 4);
  assert_int_equal(q->n_microbatches, 4);
  write_ok(q, b);
  assert_same_files(a, b, q->n_devices);
  plan_free(q);
  compile_result_free(&r);
  test_remove_tree(a);
  test_remove_tree(b);
  g_free(a);
  g_free(b);
}

/* Point-to-point groups (a named stream for all pipeline traffic) travel through the files:
 * read back equal, written again byte for byte; the reader refuses a group whose parts do not
 * follow it on its stream. */
static void test_grouped_round_trip(void **state) {
  (void)state;
  char *a = test_tmp_dir("test_plan-XXXXXX"), *b = test_tmp_dir("test_plan-XXXXXX");
  char *prog = g_build_filename(a, "named.json", NULL);
  test_write_file(prog,
                  "[{\"op\":\"place\",\"filter\":{\"PP\":0},\"devices\":[0],\"stream\":\"pp\"},"
                  "{\"op\":\"place\",\"filter\":{\"PP\":1},\"devices\":[1],\"stream\":\"pp\"},"
                  "{\"op\":\"place\",\"filter\":{\"PP\":2},\"devices\":[2],\"stream\":\"pp\"}]");
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.directives_path = prog;
  o.pp_regions = 3;
  o.have_schedule = true;
  o.schedule.family = SCHED_1F1B;
  o.schedule.mbs = 6;
  struct compile_result r = test_compile(&o);
  g_unlink(prog);
  write_ok(r.plan, a);
  struct plan *q = read_ok(a);
  assert_true(plan_equal(r.plan, q));
  write_ok(q, b);
  assert_same_files(a, b, q->n_devices);
  char *dev = slurp(a, "device-1.json");
  char *at = strstr(dev, "\"group\":2");
  assert_non_null(at);
  at[8] = '3'; /* its next part still says 2 */
  char *path = g_build_filename(a, "device-1.json", NULL);
  test_write_file(path, dev);
  GError *err = NULL;
  assert_null(plan_read_dir(a, &err));
  test_assert_input_error(err, "begins a group of 3");
  g_clear_error(&err);
  at[8] = '1'; /* a group of one is no group */
  test_write_file(path, dev);
  assert_null(plan_read_dir(a, &err));
  test_assert_input_error(err, "group");
  g_clear_error(&err);
  g_free(path);
  g_free(dev);
  plan_free(q);
  compile_result_free(&r);
  test_remove_tree(a);
  test_remove_tree(b);
  g_free(a);
  g_free(b);
  g_free(prog);
}

/* --- the position table ------------------------------------------------------------------- */

/* The table must say what a scan of each group says, for every (group, device). */
static void assert_positions_match_groups(const struct plan *p) {
  for (uint32_t g = 0; g < p->n_groups; g++)
    for (uint32_t d = 0; d < p->n_devices; d++) {
      int want = -1;
      for (uint32_t i = 0; i < p->groups[g].count && want < 0; i++)
        if (p->device_pool[p->groups[g].first + i] == d)
          want = (int)i;
      assert_int_equal(plan_group_position(p, g, d), want);
    }
  assert_int_equal(plan_group_position(p, p->n_groups, 0), -1);
  assert_int_equal(plan_group_position(p, 0, p->n_devices), -1);
  /* one entry per device_pool slot: linear in the memberships */
  assert_int_equal(p->positions.first[p->n_devices], p->n_device_pool);
}

static void test_positions(void **state) {
  (void)state;
  struct plan *h = hand_plan();
  assert_positions_match_groups(h);
  assert_int_equal(plan_group_position(h, 1, 3), 1); /* group 1 is devices {1, 3} */
  assert_int_equal(plan_group_position(h, 0, 3), -1);
  plan_free(h);

  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-moe.json";
  o.directives_path = "directives/base-schedules/pp2_dp2_ep2.json";
  struct compile_result r = {0};
  GError *err = NULL;
  if (!compile_run(&o, &r, &err))
    fail_msg("compile: %s", err->message);
  assert_positions_match_groups(r.plan); /* built by lowering */
  char *dir = test_tmp_dir("test_plan-XXXXXX");
  write_ok(r.plan, dir);
  struct plan *q = read_ok(dir);
  assert_positions_match_groups(q); /* built by the reader */
  plan_free(q);
  compile_result_free(&r);
  test_remove_tree(dir);
  g_free(dir);
}


/* --- the compact layout past PLAN_DEVICE_FILES_MAX (2,048) devices ------------------------- */

/* Compiles tiny-dense over two stages replicated over dp devices each. */
static struct compile_result compile_dense_dp(uint32_t dp) {
  char layout[64];
  snprintf(layout, sizeof layout, "pp=2,dp=%u", dp);
  struct compile_options o = compile_options_default();
  o.model_path = "models/tiny-dense.json";
  o.layout = layout;
  o.have_schedule = true;
  o.schedule.family = SCHED_1F1B;
  o.schedule.mbs = 4;
  return test_compile(&o);
}

/* Files in dir and their bytes; *plan_bytes gets plan.json's. */
static uint32_t dir_files(const char *dir, uint64_t *bytes, uint64_t *plan_bytes) {
  GDir *g = g_dir_open(dir, 0, NULL);
  assert_non_null(g);
  uint32_t n = 0;
  *bytes = *plan_bytes = 0;
  for (const char *name; (name = g_dir_read_name(g)) != NULL; n++) {
    char *path = g_build_filename(dir, name, NULL);
    GStatBuf st;
    assert_int_equal(g_stat(path, &st), 0);
    if (strcmp(name, "plan.json") == 0)
      *plan_bytes = (uint64_t)st.st_size;
    else
      *bytes += (uint64_t)st.st_size;
    g_free(path);
  }
  g_dir_close(g);
  return n;
}

/* Writes, reads back and simulates the plan of dp-wide stages; returns the directory's files
 * and bytes outside plan.json and checks the round trip against the in-process plan. */
static uint32_t compact_round_trip(uint32_t dp, const struct profile *prof, uint64_t *bytes,
                                   uint64_t *plan_bytes) {
  struct compile_result r = compile_dense_dp(dp);
  assert_int_equal(r.plan->n_devices, 2 * dp);
  char *dir = test_tmp_dir("test_plan-XXXXXX");
  write_ok(r.plan, dir);
  uint32_t n = dir_files(dir, bytes, plan_bytes);
  char *index = slurp(dir, "plan.json");
  assert_non_null(strstr(index, "\"layout\": \"classes\""));
  g_free(index);
  struct plan *q = read_ok(dir);
  assert_true(plan_equal(r.plan, q));
  GError *err = NULL;
  struct sim_options so = {.collapse = true, .no_intervals = true};
  struct sim_result *a = sim_run(r.plan, prof, &so, &err);
  struct sim_result *b = sim_run(q, prof, &so, &err);
  assert_non_null(a);
  assert_non_null(b);
  assert_true(a->iteration_time == b->iteration_time);
  assert_int_equal(a->device_instructions, b->device_instructions);
  assert_int_equal(a->n_units, b->n_units);
  for (uint32_t u = 0; u < a->n_units; u++)
    assert_int_equal(a->units[u].peak_bytes, b->units[u].peak_bytes);
  assert_int_equal(n, 1 + q->n_classes);
  sim_result_free(a);
  sim_result_free(b);
  plan_free(q);
  compile_result_free(&r);
  test_remove_tree(dir);
  g_free(dir);
  return n;
}

/* Past 2,048 devices a plan directory holds plan.json and one file per class: the file count
 * and the bytes outside plan.json stay put as the devices double, plan.json grows by its
 * device lists only, and the plan reads back equal and simulates to the same figures. */
static void test_compact_layout(void **state) {
  (void)state;
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", &err);
  assert_non_null(prof);
  uint64_t bytes1, plan1, bytes2, plan2;
  uint32_t n1 = compact_round_trip(1100, prof, &bytes1, &plan1);
  uint32_t n2 = compact_round_trip(2200, prof, &bytes2, &plan2);
  assert_int_equal(n1, n2);
  /* peers and members are device ids: a digit more at most */
  assert_true(bytes2 <= bytes1 + bytes1 / 50);
  /* the device -> class map and the groups: a few bytes per device */
  assert_true(plan2 - plan1 <= 32 * 2200);
  profile_free(prof);
}

/* A plan at the limit keeps one file per device, and rewriting a directory in the other
 * layout leaves no file of the first behind. */
static void test_layout_switch(void **state) {
  (void)state;
  char *dir = test_tmp_dir("test_plan-XXXXXX");
  struct compile_result big = compile_dense_dp(1100), edge = compile_dense_dp(1024);
  uint64_t bytes, plan_bytes;
  write_ok(big.plan, dir);
  write_ok(edge.plan, dir);
  assert_int_equal(dir_files(dir, &bytes, &plan_bytes), 1 + 2048);
  char *index = slurp(dir, "plan.json");
  assert_null(strstr(index, "\"layout\""));
  g_free(index);
  struct plan *q = read_ok(dir);
  assert_true(plan_equal(edge.plan, q));
  plan_free(q);
  write_ok(big.plan, dir);
  assert_int_equal(dir_files(dir, &bytes, &plan_bytes), 1 + big.plan->n_classes);
  /* a class file's device must be its class's first member */
  assert_int_equal(big.plan->classes[0].devices[0], 0);
  edit(dir, "class-0.json", "device", "1");
  GError *err = NULL;
  assert_null(plan_read_dir(dir, &err));
  test_assert_input_error(err, "class-0.json: \"device\" is 1");
  g_clear_error(&err);
  compile_result_free(&big);
  compile_result_free(&edge);
  test_remove_tree(dir);
  g_free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_positions),
      cmocka_unit_test(test_views),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_readable),
      cmocka_unit_test(test_corrupt),
      cmocka_unit_test(test_from_json),
      cmocka_unit_test(test_lowered_round_trip),
      cmocka_unit_test(test_grouped_round_trip),
      cmocka_unit_test(test_compact_layout),
      cmocka_unit_test(test_layout_switch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
