/* Tests of the directives module: the parser (directives/parse.c) and, further down, the
 * rewrites (directives/apply.c). Each section has its own tests; main() lists them by section. */
#include "test-helpers.h"
#include <stdio.h>
#include <string.h>

#include "../../directives/directives.h"
#include "../../base/json.h"

/* ============================================================================================
 * Parser
 * ========================================================================================== */

/* Parses text as if it were the file "t.json". */
static struct dir_program *parse_text(const char *text, GError **err) {
  cJSON *root = json_parse_buffer("t.json", text, strlen(text), err);
  if (!root)
    return NULL;
  struct dir_program *p = dir_program_parse_json("t.json", root, err);
  cJSON_Delete(root);
  return p;
}

static struct dir_program *parse_ok(const char *text) {
  GError *err = NULL;
  struct dir_program *p = parse_text(text, &err);
  if (!p)
    fail_msg("unexpected error: %s", err ? err->message : "(none)");
  assert_null(err);
  return p;
}

/* The error is an input error, one line, containing want. */
static void assert_input_error(struct dir_program *p, GError *err, const char *want) {
  assert_null(p);
  test_assert_input_error(err, want);
  assert_null(strchr(err->message, '\n'));
  g_error_free(err);
}

static void expect_error(const char *text, const char *want) {
  GError *err = NULL;
  struct dir_program *p = parse_text(text, &err);
  assert_input_error(p, err, want);
}

static void test_op_names(void **state) {
  (void)state;
  assert_string_equal(dir_op_name(DIR_PLACE), "place");
  assert_string_equal(dir_op_name(DIR_REPLICATE), "replicate");
  assert_string_equal(dir_op_name(DIR_SHARD), "shard");
  assert_string_equal(dir_op_name(DIR_SPLIT), "split");
  assert_string_equal(dir_op_name(DIR_ORDER), "order");
  assert_string_equal(dir_op_name(DIR_STREAM), "stream");
}

static void test_parse_empty_program(void **state) {
  (void)state;
  struct dir_program *p = parse_ok("[]");
  assert_int_equal(p->n, 0);
  assert_int_equal(p->max_device, 0);
  assert_string_equal(p->name, "t.json");
  dir_program_free(p);
  dir_program_free(NULL);
}

static void test_parse_place(void **state) {
  (void)state;
  struct dir_program *p =
      parse_ok("[{\"op\": \"place\", \"filter\": {\"PP\": 1, \"EP\": \"*\", \"PASS\": \"B\"},"
               "  \"devices\": [3, 1], \"stream\": \"p2p\"},"
               " {\"op\": \"place\", \"filter\": {}, \"devices\": [0]}]");
  assert_int_equal(p->n, 2);
  const struct dir_directive *d = &p->d[0];
  assert_int_equal(d->op, DIR_PLACE);
  assert_int_equal(d->index, 0);
  assert_int_equal(d->filter.n_keys, 2);
  assert_string_equal(d->filter.keys[0].name, "PP");
  assert_int_equal(d->filter.keys[0].value, 1);
  assert_string_equal(d->filter.keys[1].name, "EP");
  assert_int_equal(d->filter.keys[1].value, IR_FILTER_ANY);
  assert_int_equal(d->filter.pass, IR_PASS_B);
  assert_int_equal(d->n_devices, 2);
  assert_int_equal(d->devices[0], 3);
  assert_int_equal(d->devices[1], 1);
  assert_string_equal(d->stream, "p2p");
  /* defaults: {} matches everything, no PASS, default stream */
  d = &p->d[1];
  assert_int_equal(d->index, 1);
  assert_int_equal(d->filter.n_keys, 0);
  assert_int_equal(d->filter.pass, IR_PASS_NONE);
  assert_int_equal(d->n_devices, 1);
  assert_int_equal(d->devices[0], 0);
  assert_string_equal(d->stream, "");
  assert_int_equal(p->max_device, 4);
  dir_program_free(p);
}

static void test_parse_replicate(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"replicate\", \"filter\": {\"PP\": 0}, \"devices\": [0, 2, 4, 6],"
      "  \"reduce_stream\": \"dp\", \"gather_stream\": \"ag\", \"bucket_size\": 12.5,"
      "  \"shard_grads\": true, \"shard_params\": false},"
      " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [1, 0]},"
      " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [7], \"shard_params\": true}]");
  assert_int_equal(p->n, 3);
  const struct dir_directive *d = &p->d[0];
  assert_int_equal(d->op, DIR_REPLICATE);
  assert_int_equal(d->filter.n_keys, 1);
  assert_int_equal(d->n_devices, 4);
  assert_int_equal(d->devices[3], 6);
  assert_string_equal(d->reduce_stream, "dp");
  assert_string_equal(d->gather_stream, "ag");
  assert_true(d->bucket_size_mb == 12.5);
  assert_true(d->shard_grads);
  assert_false(d->shard_params);
  d = &p->d[1]; /* defaults */
  assert_string_equal(d->reduce_stream, "");
  assert_string_equal(d->gather_stream, "");
  assert_true(d->bucket_size_mb == DIR_DEFAULT_BUCKET_MB);
  assert_false(d->shard_grads);
  assert_false(d->shard_params);
  d = &p->d[2]; /* ZeRO-3 implies ZeRO-2 */
  assert_true(d->shard_params);
  assert_true(d->shard_grads);
  assert_int_equal(p->max_device, 8);
  dir_program_free(p);
}

/* recompute: full by default, selective by name; both print back as written. */
static void test_parse_recompute(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"recompute\", \"filter\": {\"PP\": 1}},"
      " {\"op\": \"recompute\", \"filter\": {}, \"granularity\": \"selective\"}]");
  assert_int_equal(p->d[0].op, DIR_RECOMPUTE);
  assert_int_equal(p->d[0].granularity, IR_RECOMPUTE_FULL);
  assert_int_equal(p->d[1].granularity, IR_RECOMPUTE_SELECTIVE);
  cJSON *j = dir_program_to_json(p);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 1), "granularity")->valuestring,
                      "selective");
  cJSON_Delete(j);
  dir_program_free(p);
}

/* ZeRO-1 alone, and implied by ZeRO-2; printed only where it says more than shard_grads. */
static void test_parse_shard_optimizer(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"replicate\", \"filter\": {}, \"devices\": [0, 1], \"shard_optimizer\": true},"
      " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [2, 3], \"shard_grads\": true},"
      " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [4, 5]}]");
  assert_true(p->d[0].shard_optimizer);
  assert_false(p->d[0].shard_grads || p->d[0].shard_params);
  assert_true(p->d[1].shard_optimizer && p->d[1].shard_grads);
  assert_false(p->d[2].shard_optimizer);
  cJSON *j = dir_program_to_json(p);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "shard_optimizer")));
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 1), "shard_optimizer"));
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 2), "shard_optimizer"));
  cJSON_Delete(j);
  dir_program_free(p);
}

static void test_parse_shard(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"shard\", \"filter\": {\"EXPERT\": \"*\", \"PASS\": \"F\"}, \"devices\": [4, 5],"
      "  \"stream\": \"a2a\"},"
      " {\"op\": \"shard\", \"filter\": {\"EXPERT\": 2}, \"devices\": [9],"
      "  \"capacity_factor\": 1.25, \"degree\": 4, \"expert_tensor_parallel\": 2}]");
  const struct dir_directive *d = &p->d[0];
  assert_int_equal(d->op, DIR_SHARD);
  assert_string_equal(d->filter.keys[0].name, "EXPERT");
  assert_int_equal(d->filter.keys[0].value, IR_FILTER_ANY);
  assert_int_equal(d->filter.pass, IR_PASS_F);
  assert_int_equal(d->n_devices, 2);
  assert_string_equal(d->stream, "a2a");
  assert_string_equal(p->d[1].stream, "");
  assert_int_equal(p->d[1].filter.keys[0].value, 2);
  assert_true(d->capacity_factor == 0); /* the default, IR_EP_CAPACITY_FACTOR_DEFAULT */
  assert_true(p->d[1].capacity_factor == 1.25);
  assert_int_equal(d->ep_degree, 0); /* not given: every device of one TP rank */
  assert_int_equal(d->etp_degree, 0);
  assert_int_equal(p->d[1].ep_degree, 4);
  assert_int_equal(p->d[1].etp_degree, 2);
  cJSON *j = dir_program_to_json(p); /* written back only where given */
  assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "degree"));
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 1), "degree")->valueint, 4);
  assert_int_equal(
      cJSON_GetObjectItem(cJSON_GetArrayItem(j, 1), "expert_tensor_parallel")->valueint, 2);
  cJSON_Delete(j);
  assert_int_equal(p->max_device, 10);
  dir_program_free(p);
}

static void test_parse_split(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"MB\", \"num_microbatches\": 8},"
      " {\"op\": \"split\", \"filter\": {\"PP\": 1, \"PASS\": \"BW\"}, \"dim_name\": \"SEQ\","
      "  \"num_microbatches\": 4096}]");
  assert_int_equal(p->n, 2);
  assert_int_equal(p->d[0].op, DIR_SPLIT);
  assert_string_equal(p->d[0].dim_name, "MB");
  assert_int_equal(p->d[0].num_microbatches, 8);
  assert_int_equal(p->d[0].filter.pass, IR_PASS_NONE);
  assert_string_equal(p->d[1].dim_name, "SEQ");
  assert_int_equal(p->d[1].num_microbatches, DIR_MAX_MICROBATCHES);
  assert_int_equal(p->d[1].filter.pass, IR_PASS_BW);
  assert_int_equal(p->max_device, 0);
  dir_program_free(p);
}

static void test_parse_order(void **state) {
  (void)state;
  /* Python-Piper shape (list of lists) mixed with the one-filter shorthand. */
  struct dir_program *p =
      parse_ok("[{\"op\": \"order\", \"filters\": ["
               "   [{\"PP\": 0, \"MB\": 0, \"PASS\": \"F\"}],"
               "   [{\"MB\": 1, \"PASS\": \"F\"}, {\"MB\": 0, \"PASS\": \"BI\"}],"
               "   {\"MB\": 1, \"PASS\": \"BW\"}]}]");
  const struct dir_directive *d = &p->d[0];
  assert_int_equal(d->op, DIR_ORDER);
  assert_int_equal(d->n_slots, 3);
  assert_int_equal(d->slot_first[0], 0);
  assert_int_equal(d->slot_first[1], 1);
  assert_int_equal(d->slot_first[2], 3);
  assert_int_equal(d->slot_first[3], 4);
  assert_int_equal(d->filters[0].n_keys, 2);
  assert_int_equal(d->filters[0].pass, IR_PASS_F);
  assert_string_equal(d->filters[2].keys[0].name, "MB");
  assert_int_equal(d->filters[2].keys[0].value, 0);
  assert_int_equal(d->filters[2].pass, IR_PASS_BI);
  assert_int_equal(d->filters[3].pass, IR_PASS_BW);
  assert_int_equal(d->filters[3].keys[0].value, 1);
  assert_int_equal(d->filter.pass, IR_PASS_NONE);
  dir_program_free(p);
}

static void test_parse_stream(void **state) {
  (void)state;
  struct dir_program *p =
      parse_ok("[{\"op\": \"stream\", \"name\": \"comm\", \"priority\": -1, \"sm_share\": 0.25},"
               " {\"op\": \"stream\", \"name\": \"compute\"}]");
  assert_int_equal(p->d[0].op, DIR_STREAM);
  assert_string_equal(p->d[0].name, "comm");
  assert_int_equal(p->d[0].priority, -1);
  assert_true(p->d[0].sm_share == 0.25);
  assert_string_equal(p->d[1].name, "compute");
  assert_int_equal(p->d[1].priority, 0);
  assert_true(p->d[1].sm_share == 1.0);
  dir_program_free(p);
}

/* Limits that are allowed, exactly at the edge. */
static void test_parse_limits_accepted(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"place\", \"filter\": {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"e\": 4,"
      " \"f\": 5,"
      "  \"g\": 6, \"h\": 7, \"i\": 8, \"j\": 9, \"k\": 10, \"l\": 11, \"m\": 12, \"n\": 13,"
      "  \"o\": 14, \"ABCDEFGHIJKLMNOPQRSTUVWXYZ01234\": 1073741824, \"PASS\": \"F\"},"
      "  \"devices\": [65535], \"stream\": \"0123456789012345678901234567890\"},"
      " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [0], \"bucket_size\": 1e6},"
      " {\"op\": \"stream\", \"name\": \"s\", \"sm_share\": 1}]");
  assert_int_equal(p->d[0].filter.n_keys, DIR_MAX_FILTER_KEYS);
  assert_int_equal(p->d[0].filter.keys[15].value, 1 << 30);
  assert_int_equal(strlen(p->d[0].stream), DIR_NAME_MAX - 1);
  assert_int_equal(p->max_device, 65536);
  assert_true(p->d[1].bucket_size_mb == 1e6);
  dir_program_free(p);
}

struct bad_case {
  const char *text;
  const char *want;
};

#define PLACE_PREFIX "[{\"op\": \"place\", \"filter\": {}, "
#define SPLIT_PREFIX "[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"MB\", "
#define REPL_PREFIX "[{\"op\": \"replicate\", \"filter\": {}, \"devices\": [0], "

static const struct bad_case bad_cases[] = {
    /* program shape */
    {"{\"op\": \"place\"}", "t.json: a directive program must be a JSON array"},
    {"[1]", "t.json: directive 0: must be an object"},
    {"[{\"op\": \"stream\", \"name\": \"s\"}, {\"filter\": {}}]",
     "t.json: directive 1: missing key \"op\""},
    {"[{\"op\": 3}]", "t.json: directive 0: \"op\" must be a string"},
    {"[{\"op\": \"stream\", \"name\": \"s\"}, {\"op\": \"plase\"}]",
     "t.json: directive 1: unknown op \"plase\""},
    {PLACE_PREFIX "\"devices\": [0], \"stram\": \"s\"}]",
     "t.json: directive 0 (place): unknown key \"stram\""},
    {"[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"MB\", \"num_microbatches\": 2,"
     " \"op\": \"split\"}]",
     "t.json: directive 0 (split): duplicate key \"op\""},
    {"[{\"op\": \"order\", \"filters\": [{}, {}], \"devices\": [0]}]",
     "directive 0 (order): unknown key \"devices\""},
    /* expert capacity: below 1 the average routing would not fit */
    {"[{\"op\": \"shard\", \"filter\": {}, \"devices\": [0], \"capacity_factor\": 0.5}]",
     "directive 0 (shard): \"capacity_factor\""},
    {"[{\"op\": \"shard\", \"filter\": {}, \"devices\": [0], \"capacity_factor\": \"2\"}]",
     "directive 0 (shard): \"capacity_factor\""},
    {"[{\"op\": \"shard\", \"filter\": {}, \"devices\": [0], \"degree\": 0}]",
     "directive 0 (shard): \"degree\""},
    {"[{\"op\": \"shard\", \"filter\": {}, \"devices\": [0], \"expert_tensor_parallel\": 2.5}]",
     "directive 0 (shard): \"expert_tensor_parallel\""},
    {PLACE_PREFIX "\"devices\": [0], \"degree\": 2}]",
     "directive 0 (place): unknown key \"degree\""},
    {PLACE_PREFIX "\"devices\": [0], \"capacity_factor\": 2}]",
     "directive 0 (place): unknown key \"capacity_factor\""},
    /* filter */
    {"[{\"op\": \"place\", \"devices\": [0]}]", "directive 0 (place): missing key \"filter\""},
    {"[{\"op\": \"place\", \"filter\": [], \"devices\": [0]}]", "\"filter\" must be an object"},
    {"[{\"op\": \"place\", \"filter\": {\"PP\": -1}, \"devices\": [0]}]",
     "directive 0 (place): \"filter\": \"PP\" = -1 is out of range [0, 1073741824]"},
    {"[{\"op\": \"place\", \"filter\": {\"PP\": 1.5}, \"devices\": [0]}]",
     "\"filter\": \"PP\" must be an integer index >= 0 or \"*\""},
    {"[{\"op\": \"place\", \"filter\": {\"PP\": \"x\"}, \"devices\": [0]}]",
     "\"filter\": \"PP\" must be an integer index >= 0 or \"*\""},
    {"[{\"op\": \"place\", \"filter\": {\"PP\": null}, \"devices\": [0]}]",
     "\"filter\": \"PP\" must be an integer index >= 0 or \"*\""},
    {"[{\"op\": \"place\", \"filter\": {\"PP\": 1073741825}, \"devices\": [0]}]",
     "\"PP\" = 1073741825 is out of range"},
    {"[{\"op\": \"place\", \"filter\": {\"PASS\": \"X\"}, \"devices\": [0]}]",
     "directive 0 (place): \"filter\": \"PASS\" must be one of F, B, BI, BW"},
    {"[{\"op\": \"place\", \"filter\": {\"PASS\": 1}, \"devices\": [0]}]",
     "\"PASS\" must be one of F, B, BI, BW"},
    {"[{\"op\": \"place\", \"filter\": {\"PASS\": \"f\"}, \"devices\": [0]}]",
     "\"PASS\" must be one of F, B, BI, BW"},
    {"[{\"op\": \"place\", \"filter\": {\"PP\": 0, \"PP\": 1}, \"devices\": [0]}]",
     "\"filter\": duplicate key \"PP\""},
    {"[{\"op\": \"place\", \"filter\": {\"PASS\": \"F\", \"PASS\": \"B\"}, \"devices\": [0]}]",
     "\"filter\": duplicate key \"PASS\""},
    {"[{\"op\": \"place\", \"filter\": {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"e\": 4, \"f\": 5,"
     " \"g\": 6, \"h\": 7, \"i\": 8, \"j\": 9, \"k\": 10, \"l\": 11, \"m\": 12, \"n\": 13,"
     " \"o\": 14,"
     " \"p\": 15, \"q\": 16}, \"devices\": [0]}]",
     "\"filter\": more than 16 keys"},
    {"[{\"op\": \"place\", \"filter\": {\"\": 0}, \"devices\": [0]}]",
     "\"filter\": key \"\" must not be empty"},
    {"[{\"op\": \"place\", \"filter\": {\"ABCDEFGHIJKLMNOPQRSTUVWXYZ012345\": 0},"
     " \"devices\": [0]}]",
     "is 32 bytes long, at most 31"},
    {"[{\"op\": \"place\", \"filter\": {\"P P\": 0}, \"devices\": [0]}]",
     "key \"P P\" must be printable ASCII without spaces"},
    {"[{\"op\": \"place\", \"filter\": {\"P\\nP\": 0}, \"devices\": [0]}]",
     "key \"P\\x0aP\" must be printable"},
    /* devices */
    {"[{\"op\": \"place\", \"filter\": {}}]", "directive 0 (place): missing key \"devices\""},
    {"[{\"op\": \"stream\", \"name\": \"s\"}, {\"op\": \"stream\", \"name\": \"t\"},"
     " {\"op\": \"place\", \"filter\": {}, \"devices\": []}]",
     "t.json: directive 2 (place): \"devices\" must be a non-empty list of device ids"},
    {PLACE_PREFIX "\"devices\": 0}]", "\"devices\" must be a non-empty list of device ids"},
    {PLACE_PREFIX "\"devices\": [1, 2, 1]}]", "\"devices\" names device 1 twice"},
    {PLACE_PREFIX "\"devices\": [-1]}]", "\"devices[0]\" = -1 is out of range [0, 1048575]"},
    {PLACE_PREFIX "\"devices\": [0, 1048576]}]",
     "\"devices[1]\" = 1048576 is out of range [0, 1048575]"},
    {PLACE_PREFIX "\"devices\": [0.5]}]", "\"devices[0]\" must be an integer"},
    {PLACE_PREFIX "\"devices\": [\"0\"]}]", "\"devices[0]\" must be an integer"},
    {"[{\"op\": \"replicate\", \"filter\": {}, \"devices\": [[0]]}]",
     "directive 0 (replicate): \"devices[0]\" must be an integer"},
    {"[{\"op\": \"shard\", \"filter\": {}, \"devices\": {}}]",
     "directive 0 (shard): \"devices\" must be a non-empty list"},
    /* streams and names */
    {PLACE_PREFIX "\"devices\": [0], \"stream\": 1}]", "\"stream\" must be a string"},
    {PLACE_PREFIX "\"devices\": [0], \"stream\": \"\"}]", "\"stream\" = \"\" must not be empty"},
    {PLACE_PREFIX "\"devices\": [0], \"stream\": \"0123456789012345678901234567890123456789xyz\"}]",
     "\"stream\" = \"0123456789012345678901234567890123456789\"... is 43 bytes long, at most 31"},
    {PLACE_PREFIX "\"devices\": [0], \"stream\": \"a b\"}]",
     "\"stream\" = \"a b\" must be printable ASCII without spaces"},
    {REPL_PREFIX "\"reduce_stream\": true}]", "\"reduce_stream\" must be a string"},
    {REPL_PREFIX "\"gather_stream\": [\"x\"]}]", "\"gather_stream\" must be a string"},
    {"[{\"op\": \"recompute\", \"filter\": {}, \"granularity\": \"some\"}]",
     "directive 0 (recompute): \"granularity\" = \"some\" must be \"full\" or \"selective\""},
    {"[{\"op\": \"recompute\", \"filter\": {}, \"mode\": \"full\"}]",
     "directive 0 (recompute): unknown key \"mode\""},
    {"[{\"op\": \"recompute\"}]", "directive 0 (recompute): missing key \"filter\""},
    /* replicate */
    {REPL_PREFIX "\"bucket_size\": 0}]", "\"bucket_size\" = 0 is out of range (0, 1000000]"},
    {REPL_PREFIX "\"bucket_size\": -5}]", "\"bucket_size\" = -5 is out of range (0, 1000000]"},
    {REPL_PREFIX "\"bucket_size\": 1e7}]", "\"bucket_size\" = 10000000 is out of range"},
    {REPL_PREFIX "\"bucket_size\": \"25\"}]", "\"bucket_size\" must be a number in (0, 1000000]"},
    {REPL_PREFIX "\"bucket_size\": 1e999}]", "\"bucket_size\" must be a number"},
    {REPL_PREFIX "\"shard_grads\": \"yes\"}]", "\"shard_grads\" must be true or false"},
    {REPL_PREFIX "\"shard_params\": 1}]", "\"shard_params\" must be true or false"},
    {REPL_PREFIX "\"shard_optimizer\": null}]", "\"shard_optimizer\" must be true or false"},
    /* split */
    {SPLIT_PREFIX "\"num_microbatches\": 0}]",
     "t.json: directive 0 (split): \"num_microbatches\" = 0 is out of range [1, 4096]"},
    {SPLIT_PREFIX "\"num_microbatches\": -3}]", "\"num_microbatches\" = -3 is out of range"},
    {SPLIT_PREFIX "\"num_microbatches\": 1000000000}]",
     "t.json: directive 0 (split): \"num_microbatches\" = 1000000000 is out of range [1, 4096]"},
    {SPLIT_PREFIX "\"num_microbatches\": 2.5}]",
     "\"num_microbatches\" must be an integer in [1, 4096]"},
    {SPLIT_PREFIX "\"num_microbatches\": \"4\"}]",
     "\"num_microbatches\" must be an integer in [1, 4096]"},
    {SPLIT_PREFIX "\"num_microbatches\": 1e999}]",
     "\"num_microbatches\" must be an integer in [1, 4096]"},
    {"[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"MB\"}]",
     "directive 0 (split): missing key \"num_microbatches\""},
    {"[{\"op\": \"split\", \"filter\": {}, \"num_microbatches\": 2}]",
     "directive 0 (split): missing key \"dim_name\""},
    {"[{\"op\": \"split\", \"filter\": {}, \"dim_name\": 7, \"num_microbatches\": 2}]",
     "\"dim_name\" must be a string"},
    {"[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"\", \"num_microbatches\": 2}]",
     "\"dim_name\" = \"\" must not be empty"},
    /* order */
    {"[{\"op\": \"order\"}]", "directive 0 (order): missing key \"filters\""},
    {"[{\"op\": \"order\", \"filters\": {}}]", "\"filters\" must be a list of at least 2 groups"},
    {"[{\"op\": \"order\", \"filters\": [[{}]]}]", "\"filters\" has 1 group; it must be a list"},
    {"[{\"op\": \"order\", \"filters\": []}]", "\"filters\" has 0 groups"},
    {"[{\"op\": \"order\", \"filters\": [[{}], []]}]", "\"filters\" group 1 is empty"},
    {"[{\"op\": \"order\", \"filters\": [[{}], 3]}]",
     "\"filters\" group 1 must be a list of filters or a filter"},
    {"[{\"op\": \"order\", \"filters\": [[{}], [3]]}]",
     "\"filters\" group 1 filter 0 must be an object"},
    {"[{\"op\": \"place\", \"filter\": {}, \"devices\": [0]}, {\"op\": \"place\", \"filter\": {},"
     " \"devices\": [0]}, {\"op\": \"place\", \"filter\": {}, \"devices\": [0]},"
     " {\"op\": \"place\","
     " \"filter\": {}, \"devices\": [0]}, {\"op\": \"order\", \"filters\": [[{\"PASS\": \"F\"}],"
     " [{\"PASS\": \"F\"}, {\"PASS\": \"Q\"}]]}]",
     "t.json: directive 4 (order): \"filters\" group 1 filter 1: \"PASS\" must be one of F, B, BI, "
     "BW"},
    {"[{\"op\": \"order\", \"filters\": [[{}], [{\"MB\": -1}]]}]",
     "\"filters\" group 1 filter 0: \"MB\" = -1 is out of range"},
    /* stream declarations */
    {"[{\"op\": \"stream\"}]", "directive 0 (stream): missing key \"name\""},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"sm_share\": 0}]",
     "directive 0 (stream): \"sm_share\" = 0 is out of range (0, 1]"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"sm_share\": 1e-300}]",
     "directive 0 (stream): \"sm_share\" = 1e-300 is below 0.001"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"sm_share\": 2}]",
     "\"sm_share\" = 2 is out of range (0, 1]"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"sm_share\": \"half\"}]",
     "\"sm_share\" must be a number in (0, 1]"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"priority\": 1.5}]",
     "\"priority\" must be an integer in [-1073741824, 1073741824]"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"priority\": \"high\"}]",
     "\"priority\" must be an integer"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"priority\": 1e12}]",
     "\"priority\" = 1000000000000 is out of range"},
    {"[{\"op\": \"stream\", \"name\": \"abcdefghijklmnopqrstuvwxyz0123456\"}]",
     "\"name\" = \"abcdefghijklmnopqrstuvwxyz0123456\" is 33 bytes long, at most 31"},
    {"[{\"op\": \"stream\", \"name\": \"s\", \"sm\": 1}]",
     "directive 0 (stream): unknown key \"sm\" (allowed: op, name, priority, sm_share)"},
    /* malformed JSON is located by json_parse_buffer */
    {"[{\"op\": \"place\",\n \"filter\": {]}]", "t.json:2:"},
};

static void test_parse_bad_inputs(void **state) {
  (void)state;
  for (size_t i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
    GError *err = NULL;
    struct dir_program *p = parse_text(bad_cases[i].text, &err);
    if (p || !err)
      fail_msg("case %zu accepted: %s", i, bad_cases[i].text);
    if (!strstr(err->message, bad_cases[i].want))
      fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err->message, bad_cases[i].want);
    assert_input_error(p, err, bad_cases[i].want);
  }
}

/* Appends n copies of item to arr and closes the list into a ring, so that it looks endless to
 * anything that walks it: the parser must give up after a bounded count, as it does on a list of
 * 10^7 entries, without walking it all or allocating for it. A real 10^7-entry document takes
 * about 3 s and 800 MB to parse with cJSON, too much for a unit test; the ring is harder still.
 * Returns the last element (to break the ring with before freeing). */
static cJSON *make_ring(cJSON *arr, const cJSON *item, int n) {
  for (int i = 0; i < n; i++)
    cJSON_AddItemToArray(arr, cJSON_Duplicate(item, true));
  cJSON *last = arr->child->prev; /* cJSON keeps the tail in child->prev */
  last->next = arr->child;
  return last;
}

static void test_parse_endless_lists(void **state) {
  (void)state;
  GError *err = NULL;
  /* devices */
  cJSON *root = cJSON_Parse("[{\"op\": \"place\", \"filter\": {}}]");
  cJSON *devices = cJSON_AddArrayToObject(root->child, "devices");
  cJSON *zero = cJSON_CreateNumber(0);
  cJSON *last = make_ring(devices, zero, 3);
  struct dir_program *p = dir_program_parse_json("t.json", root, &err);
  last->next = NULL;
  cJSON_Delete(root);
  assert_input_error(p, err,
                     "t.json: directive 0 (place): \"devices\" has more than 1048576 entries");

  /* directives */
  err = NULL;
  root = cJSON_CreateArray();
  cJSON *stream = cJSON_Parse("{\"op\": \"stream\", \"name\": \"s\"}");
  last = make_ring(root, stream, 3);
  p = dir_program_parse_json("t.json", root, &err);
  last->next = NULL;
  cJSON_Delete(root);
  assert_input_error(p, err, "t.json: more than 100000 directives");

  /* order groups, and the filters of one group */
  cJSON *empty = cJSON_CreateObject();
  for (int in_group = 0; in_group < 2; in_group++) {
    err = NULL;
    root = cJSON_Parse("[{\"op\": \"order\", \"filters\": [[{}]]}]");
    cJSON *groups = cJSON_GetObjectItem(root->child, "filters");
    cJSON *ring = groups;
    if (in_group) { /* a ring of filters as the second group */
      ring = cJSON_CreateArray();
      cJSON_AddItemToArray(groups, ring);
    }
    last = make_ring(ring, empty, 3);
    p = dir_program_parse_json("t.json", root, &err);
    last->next = NULL;
    cJSON_Delete(root);
    assert_input_error(p, err, "order directives hold more than 1000000 filters");
  }
  cJSON_Delete(empty);
  cJSON_Delete(stream);
  cJSON_Delete(zero);
}

/* A real list just past the cap: refused by its length, before any id is looked at. */
static void test_parse_long_device_list(void **state) {
  (void)state;
  GString *s = g_string_new("[{\"op\": \"place\", \"filter\": {}, \"devices\": [");
  for (int i = 0; i <= IR_MAX_DEVICES; i++)
    g_string_append_printf(s, "%s%d", i ? "," : "", i);
  g_string_append(s, "]}]");
  expect_error(s->str, "\"devices\" has more than 1048576 entries");
  g_string_free(s, TRUE);
}

/* Field-by-field equality of two directives, whatever their op. */
static void assert_filter_equal(const struct dir_filter *a, const struct dir_filter *b) {
  assert_int_equal(a->n_keys, b->n_keys);
  assert_int_equal(a->pass, b->pass);
  for (uint32_t i = 0; i < a->n_keys; i++) {
    assert_string_equal(a->keys[i].name, b->keys[i].name);
    assert_int_equal(a->keys[i].value, b->keys[i].value);
  }
}

static void assert_directive_equal(const struct dir_directive *a, const struct dir_directive *b) {
  assert_int_equal(a->op, b->op);
  assert_int_equal(a->index, b->index);
  assert_filter_equal(&a->filter, &b->filter);
  assert_int_equal(a->n_devices, b->n_devices);
  for (uint32_t i = 0; i < a->n_devices; i++)
    assert_int_equal(a->devices[i], b->devices[i]);
  assert_string_equal(a->stream, b->stream);
  assert_string_equal(a->reduce_stream, b->reduce_stream);
  assert_string_equal(a->gather_stream, b->gather_stream);
  assert_true(a->bucket_size_mb == b->bucket_size_mb);
  assert_int_equal(a->shard_grads, b->shard_grads);
  assert_int_equal(a->shard_params, b->shard_params);
  assert_int_equal(a->shard_optimizer, b->shard_optimizer);
  assert_string_equal(a->dim_name, b->dim_name);
  assert_int_equal(a->num_microbatches, b->num_microbatches);
  assert_int_equal(a->n_slots, b->n_slots);
  if (a->n_slots) {
    for (uint32_t s = 0; s <= a->n_slots; s++)
      assert_int_equal(a->slot_first[s], b->slot_first[s]);
    for (uint32_t k = 0; k < a->slot_first[a->n_slots]; k++)
      assert_filter_equal(&a->filters[k], &b->filters[k]);
  }
  assert_string_equal(a->name, b->name);
  assert_int_equal(a->priority, b->priority);
  assert_true(a->sm_share == b->sm_share);
}

static void assert_program_equal(const struct dir_program *a, const struct dir_program *b) {
  assert_int_equal(a->n, b->n);
  assert_int_equal(a->max_device, b->max_device);
  for (uint32_t i = 0; i < a->n; i++)
    assert_directive_equal(&a->d[i], &b->d[i]);
}

/* Every op with every field set, and every op with its defaults. */
static const char every_op[] =
    "[{\"op\": \"stream\", \"name\": \"comm\", \"priority\": -2, \"sm_share\": 0.1},"
    " {\"op\": \"stream\", \"name\": \"compute\"},"
    " {\"op\": \"split\", \"filter\": {\"PP\": \"*\", \"PASS\": \"F\"}, \"dim_name\": \"MB\","
    "  \"num_microbatches\": 7},"
    " {\"op\": \"split\", \"filter\": {}, \"dim_name\": \"S\", \"num_microbatches\": 1},"
    " {\"op\": \"place\", \"filter\": {\"PP\": 0, \"MB\": 3, \"PASS\": \"BI\"},"
    " \"devices\": [2, 0],"
    "  \"stream\": \"p2p\"},"
    " {\"op\": \"place\", \"filter\": {}, \"devices\": [1]},"
    " {\"op\": \"replicate\", \"filter\": {\"PP\": 1}, \"devices\": [5, 3, 4],"
    "  \"reduce_stream\": \"ar\", \"gather_stream\": \"ag\", \"bucket_size\": 0.3,"
    "  \"shard_grads\": true, \"shard_params\": true},"
    " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [0]},"
    " {\"op\": \"shard\", \"filter\": {\"EXPERT\": \"*\", \"PASS\": \"B\"}, \"devices\": [8, 9],"
    "  \"stream\": \"a2a\"},"
    " {\"op\": \"shard\", \"filter\": {}, \"devices\": [0, 1]},"
    " {\"op\": \"order\", \"filters\": [[{\"MB\": 0, \"PASS\": \"F\"}],"
    "  [{\"MB\": 1, \"PASS\": \"F\"}, {\"MB\": 0, \"PASS\": \"B\"}],"
    " {\"MB\": 1, \"PASS\": \"BW\"}]}]";

static void test_round_trip(void **state) {
  (void)state;
  struct dir_program *a = parse_ok(every_op);
  assert_int_equal(a->n, 11);
  assert_int_equal(a->max_device, 10);
  cJSON *json = dir_program_to_json(a);
  char *text = cJSON_Print(json);
  struct dir_program *b = parse_ok(text);
  assert_program_equal(a, b);
  /* and the written form is stable */
  cJSON *json2 = dir_program_to_json(b);
  assert_true(cJSON_Compare(json, json2, true));
  cJSON_Delete(json2);
  cJSON_free(text);
  cJSON_Delete(json);
  dir_program_free(b);
  dir_program_free(a);
}

/* Defaults are written out explicitly or omitted, but read back the same. */
static void test_to_json_shape(void **state) {
  (void)state;
  struct dir_program *p = parse_ok(
      "[{\"op\": \"place\", \"filter\": {\"PP\": \"*\", \"PASS\": \"F\"}, \"devices\": [0]},"
      " {\"op\": \"replicate\", \"filter\": {}, \"devices\": [1]}]");
  cJSON *json = dir_program_to_json(p);
  char *text = cJSON_PrintUnformatted(json);
  assert_string_equal(text,
                      "[{\"op\":\"place\",\"filter\":{\"PP\":\"*\",\"PASS\":\"F\"},"
                      "\"devices\":[0]},"
                      "{\"op\":\"replicate\",\"filter\":{},\"devices\":[1],\"bucket_size\":25,"
                      "\"shard_grads\":false,\"shard_params\":false}]");
  cJSON_free(text);
  cJSON_Delete(json);
  dir_program_free(p);
}

static void test_append_deep_copies(void **state) {
  (void)state;
  struct dir_program *p = dir_program_new("built");
  assert_string_equal(p->name, "built");
  assert_int_equal(p->n, 0);

  uint32_t devices[] = {4, 7};
  struct dir_directive d = {.op = DIR_PLACE, .index = 99, .n_devices = 2, .devices = devices};
  d.filter.pass = IR_PASS_F;
  d.filter.n_keys = 1;
  strcpy(d.filter.keys[0].name, "PP");
  strcpy(d.stream, "s");
  dir_program_append(p, &d);

  uint32_t slot_first[] = {0, 1, 3};
  struct dir_filter filters[3] = {{.pass = IR_PASS_F}, {.pass = IR_PASS_B}, {.pass = IR_PASS_BW}};
  struct dir_directive o = {
      .op = DIR_ORDER, .n_slots = 2, .slot_first = slot_first, .filters = filters};
  o.filter.pass = IR_PASS_NONE;
  dir_program_append(p, &o);

  /* the program owns copies: changing the sources changes nothing */
  devices[0] = 60000;
  slot_first[1] = 2;
  filters[0].pass = IR_PASS_BI;
  assert_int_equal(p->n, 2);
  assert_int_equal(p->d[0].index, 0);
  assert_int_equal(p->d[1].index, 1);
  assert_ptr_not_equal(p->d[0].devices, devices);
  assert_int_equal(p->d[0].devices[0], 4);
  assert_int_equal(p->d[1].slot_first[1], 1);
  assert_int_equal(p->d[1].filters[0].pass, IR_PASS_F);
  assert_int_equal(p->d[1].filters[2].pass, IR_PASS_BW);
  assert_int_equal(p->max_device, 8);

  /* many appends (the array grows), then the written form parses back the same */
  struct dir_directive s = {.op = DIR_SPLIT, .num_microbatches = 2};
  s.filter.pass = IR_PASS_NONE;
  strcpy(s.dim_name, "MB");
  for (int i = 0; i < 1000; i++)
    dir_program_append(p, &s);
  assert_int_equal(p->n, 1002);
  assert_int_equal(p->d[1001].index, 1001);
  cJSON *json = dir_program_to_json(p);
  GError *err = NULL;
  struct dir_program *q = dir_program_parse_json("again", json, &err);
  assert_non_null(q);
  assert_program_equal(p, q);
  cJSON_Delete(json);
  dir_program_free(q);

  /* removing an op renumbers the rest and recomputes max_device */
  dir_program_remove_op(p, DIR_SPLIT);
  assert_int_equal(p->n, 2);
  dir_program_remove_op(p, DIR_PLACE);
  assert_int_equal(p->n, 1);
  assert_int_equal(p->d[0].op, DIR_ORDER);
  assert_int_equal(p->d[0].index, 0);
  assert_int_equal(p->max_device, 0);
  dir_program_append(p, &d);
  assert_int_equal(p->d[1].index, 1);
  assert_int_equal(p->d[1].devices[0], 60000);
  assert_int_equal(p->max_device, 60001);
  dir_program_remove_op(p, DIR_STREAM); /* none there: nothing changes */
  assert_int_equal(p->n, 2);
  dir_program_free(p);

  /* appending after a parse, and emptying a program completely */
  p = parse_ok(every_op);
  dir_program_append(p, &d);
  assert_int_equal(p->n, 12);
  assert_int_equal(p->d[11].index, 11);
  for (int op = DIR_PLACE; op <= DIR_STREAM; op++)
    dir_program_remove_op(p, (enum dir_op)op);
  assert_int_equal(p->n, 0);
  dir_program_append(p, &s);
  assert_int_equal(p->n, 1);
  dir_program_free(p);
  dir_program_remove_op(NULL, DIR_PLACE);
}

static void test_load_file(void **state) {
  (void)state;
  GError *err = NULL;
  char *dir = test_tmp_dir("test_directives-XXXXXX");
  char *good = g_build_filename(dir, "good.json", NULL);
  char *bad = g_build_filename(dir, "bad.json", NULL);
  char *wrong = g_build_filename(dir, "wrong.json", NULL);
  assert_true(g_file_set_contents(good, every_op, -1, NULL));
  assert_true(g_file_set_contents(bad, "[\n  {\"op\": \"place\" \"filter\": {}}\n]", -1, NULL));
  assert_true(g_file_set_contents(
      wrong, "[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"MB\", \"num_microbatches\": 0}]",
      -1, NULL));

  struct dir_program *p = dir_program_load_file(good, &err);
  assert_non_null(p);
  assert_int_equal(p->n, 11);
  assert_string_equal(p->name, good);
  dir_program_free(p);

  p = dir_program_load_file(bad, &err);
  char *want = g_strdup_printf("%s:2:", bad);
  assert_input_error(p, err, want);
  g_free(want);

  err = NULL;
  p = dir_program_load_file(wrong, &err);
  want =
      g_strdup_printf("%s: directive 0 (split): \"num_microbatches\" = 0 is out of range", wrong);
  assert_input_error(p, err, want);
  g_free(want);

  err = NULL;
  char *missing = g_build_filename(dir, "missing.json", NULL);
  p = dir_program_load_file(missing, &err);
  assert_null(p);
  assert_non_null(err);
  g_clear_error(&err);

  remove(good);
  remove(bad);
  remove(wrong);
  remove(dir);
  g_free(missing);
  g_free(good);
  g_free(bad);
  g_free(wrong);
  g_free(dir);
}

/* ============================================================================================
 * Rewrites (directives/apply.c)
 * ========================================================================================== */

/* ============================================================================================ */

int main(void) {
  const struct CMUnitTest tests[] = {
      /* parser */
      cmocka_unit_test(test_op_names),
      cmocka_unit_test(test_parse_empty_program),
      cmocka_unit_test(test_parse_place),
      cmocka_unit_test(test_parse_replicate),
      cmocka_unit_test(test_parse_shard_optimizer),
      cmocka_unit_test(test_parse_recompute),
      cmocka_unit_test(test_parse_shard),
      cmocka_unit_test(test_parse_split),
      cmocka_unit_test(test_parse_order),
      cmocka_unit_test(test_parse_stream),
      cmocka_unit_test(test_parse_limits_accepted),
      cmocka_unit_test(test_parse_bad_inputs),
      cmocka_unit_test(test_parse_endless_lists),
      cmocka_unit_test(test_parse_long_device_list),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_to_json_shape),
      cmocka_unit_test(test_append_deep_copies),
      cmocka_unit_test(test_load_file),
      /* rewrites */
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
