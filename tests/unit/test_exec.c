/* Tests for exec/ in one process: what the executor derives from a model and from plans (edge
 * tensors, instruction roles, data-parallel ranks, parameter layout), the data reader, the
 * initialisation, the host backend's streams and events, and one-device training: the loss
 * falls, BI + BW equals the fused backward, a checkpoint resumes bit-identically, a corrupt one
 * is refused, a checkpoint of another sharding, hyper-parameter or batch shape is refused naming
 * the difference, the last step is checkpointed, old ones pruned, and the watchdog turns a stuck instruction into an error. Multi-process runs
 * (the equivalence tests) are in tests/cli/test_exec.sh. */
#include "test-helpers.h"

#include <glib/gstdio.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../directives/compile.h"
#include "../../exec/exec-impl.h"
#include "../../exec/watchdog.h"
#include "../../base/json.h"

static struct exec_backend *backend; /* one per process: MPI initialises once */

static char *write_temp(const char *name, const char *text, size_t len) {
  char *dir = test_tmp_dir("test_exec_XXXXXX");
  char *path = g_build_filename(dir, name, NULL);
  assert_true(g_file_set_contents(path, text, (gssize)len, NULL));
  g_free(dir);
  return path;
}

/* Compiles model + program text (+ mbs, schedule) in-process. */
static struct compile_result compile_text(const char *model, const char *program, uint32_t mbs,
                                          const char *schedule, int pp_regions) {
  char *path = write_temp("program.json", program, strlen(program));
  struct compile_options o = compile_options_default();
  o.model_path = model;
  o.directives_path = path;
  o.pp_regions = pp_regions;
  o.schedule.mbs = mbs;
  if (schedule) {
    o.have_schedule = true;
    assert_true(sched_family_parse(schedule, &o.schedule.family));
  }
  struct compile_result r = test_compile(&o);
  g_free(path);
  return r;
}

/* ---- model level ------------------------------------------------------------------------- */

static void test_model_edges(void **state) {
  (void)state;
  GError *err = NULL;
  struct model *m = model_load_file("models/tiny-moe.json", 0, &err);
  assert_non_null(m);
  struct exec_model xm;
  assert_true(exec_model_init(&xm, m, &err));
  assert_int_equal(xm.T, 64);
  assert_int_equal(xm.K, 2);
  assert_int_equal(xm.E, 8);
  uint32_t experts = 0;
  for (uint32_t s = 0; s < m->n_segments; s++) {
    const struct exec_segment *es = &xm.segs[s];
    if (!es->expert)
      continue;
    experts++;
    /* an expert region reads h and the routing from its router's segment, writes m */
    assert_int_equal(es->n_in_edges, 1);
    assert_int_equal(es->n_out_edges, 1);
    assert_int_equal(xm.edge_mask[es->in_edges[0]], EXEC_BIT(EXEC_T_H) | EXEC_BIT(EXEC_T_R));
    assert_int_equal(xm.edge_mask[es->out_edges[0]], EXEC_BIT(EXEC_T_M));
    assert_int_equal(es->n_ops, 1);
    assert_int_equal(es->ops[0].kind, MODEL_OP_EXPERT_FFN);
    assert_int_equal(es->final_value[EXEC_T_M], 2); /* inputs h, r, then its output */
  }
  assert_int_equal(experts, 4);
  /* the residual after an expert region reads x from two segments back */
  const struct exec_segment *after = &xm.segs[2];
  assert_int_equal(after->n_in_edges, 2);
  assert_int_equal(xm.edge_mask[after->in_edges[0]], EXEC_BIT(EXEC_T_X));
  assert_int_equal(m->edges[after->in_edges[0]].src, 0);
  assert_int_equal(xm.edge_mask[after->in_edges[1]], EXEC_BIT(EXEC_T_M));
  /* every edge carries something */
  for (uint32_t e = 0; e < m->n_edges; e++)
    assert_true(xm.edge_mask[e] != 0);
  assert_int_equal(exec_tensor_words(&xm, EXEC_T_R), 2 * 64 * 2);
  /* r's gradient travels in r's layout (the plan's bytes): weights' gradients, then unused */
  assert_int_equal(exec_grad_floats(&xm, EXEC_T_R), 2 * 64 * 2);
  exec_model_clear(&xm);
  model_free(m);
}

static void test_model_refuses_mla(void **state) {
  (void)state;
  GError *err = NULL;
  struct model *m = model_load_file("models/deepseek-v3.json", 0, &err);
  assert_non_null(m);
  struct exec_model xm;
  assert_false(exec_model_init(&xm, m, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "deepseek-v3"));
  assert_non_null(strstr(err->message, "MLA"));
  g_error_free(err);
  model_free(m);
}

/* ---- device level ------------------------------------------------------------------------ */

static void test_device_pp2_dp2_ep2(void **state) {
  (void)state;
  gchar *prog = NULL;
  assert_true(g_file_get_contents("directives/base-schedules/pp2_dp2_ep2.json", &prog, NULL, NULL));
  struct compile_result r = compile_text("models/tiny-moe.json", prog, 4, "1f1b", 0);
  g_free(prog);
  struct exec_model xm;
  GError *err = NULL;
  assert_true(exec_model_init(&xm, r.plan->model, &err));
  uint32_t want_dp_rank[4] = {0, 1, 0, 1};
  for (uint32_t d = 0; d < 4; d++) {
    struct exec_device dev;
    if (!exec_device_init(&dev, r.plan, &xm, d, &err))
      fail_msg("%s", err->message);
    assert_int_equal(dev.M, 4);
    assert_int_equal(dev.dp_degree, 2);
    assert_int_equal(dev.dp_rank, want_dp_rank[d]);
    uint32_t sends = 0, recvs = 0, to = 0, from = 0, opt = 0, ar = 0;
    for (uint32_t i = 0; i < dev.n_instrs; i++) {
      const struct exec_instr *x = &dev.instrs[i];
      switch (x->role) {
      case EXEC_ROLE_SEND: sends++; break;
      case EXEC_ROLE_RECV: recvs++; break;
      case EXEC_ROLE_A2A_TO_EXPERT: to++; break;
      case EXEC_ROLE_A2A_FROM_EXPERT: from++; break;
      case EXEC_ROLE_OPTIMIZER: opt++; break;
      case EXEC_ROLE_ALL_REDUCE: ar++; break;
      default: break;
      }
      if (x->role == EXEC_ROLE_SEND || x->role == EXEC_ROLE_RECV) {
        /* PP=0 devices talk to PP=1 devices at the same DP position and back */
        assert_int_equal(x->peer, d < 2 ? d + 2 : d - 2);
        assert_true(x->edge < r.plan->model->n_edges);
        assert_int_equal(xm.edge_mask[x->edge], EXEC_BIT(EXEC_T_X));
      }
      if (x->mb >= 0)
        assert_true((uint32_t)x->mb < dev.M);
    }
    /* one activation edge between the stages, each way, per micro-batch */
    assert_int_equal(sends, 4);
    assert_int_equal(recvs, 4);
    /* two expert regions per stage: dispatch and combine in F and in B, per micro-batch */
    assert_int_equal(to, 2 * 2 * 4);
    assert_int_equal(from, 2 * 2 * 4);
    assert_int_equal(opt, 1);
    assert_true(ar >= 1);
    for (uint32_t s = 0; s < r.plan->model->n_segments; s++) {
      if (!dev.holds[s])
        continue;
      bool expert = r.plan->model->segments[s].expert;
      assert_int_equal(dev.ep_size[s], expert ? 2 : 1);
      assert_int_equal(dev.param_local[s],
                       r.plan->model->segments[s].param_count / (expert ? 2 : 1));
      /* sharded experts are never in a gradient bucket */
      if (expert)
        assert_int_equal(dev.bucket_of[s], IR_NONE);
      assert_true(dev.param_offset[s] + dev.param_local[s] <= dev.n_params);
    }
    exec_device_clear(&dev);
  }
  /* a 4-device plan cannot be run as device 4 */
  struct exec_device dev;
  assert_false(exec_device_init(&dev, r.plan, &xm, 4, &err));
  assert_non_null(strstr(err->message, "4 devices"));
  g_clear_error(&err);
  exec_model_clear(&xm);
  compile_result_free(&r);
}

/* ---- data -------------------------------------------------------------------------------- */

static void test_data_token_file(void **state) {
  (void)state;
  int32_t hdr[256] = {EXEC_DATA_MAGIC, 1, 10};
  uint16_t toks[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  char buf[sizeof hdr + sizeof toks];
  memcpy(buf, hdr, sizeof hdr);
  memcpy(buf + sizeof hdr, toks, sizeof toks);
  char *path = write_temp("tokens.bin", buf, sizeof buf);
  GError *err = NULL;
  struct exec_data *d = exec_data_open(path, 256, 0, &err);
  assert_non_null(d);
  assert_string_equal(exec_data_kind(d), "tokens");
  assert_int_equal(exec_data_tokens(d), 10);
  /* block 1 of 2 sequences of 3: sequences 2 and 3 start at 6 and 9 (mod 10 - 3 - 1 = 6) */
  int32_t in[6], tg[6];
  exec_data_batch(d, 1, 2, 3, in, tg);
  int32_t want_in[6] = {5 + 6 % 6, 6 + 6 % 6, 7 + 6 % 6, 5 + 9 % 6, 6 + 9 % 6, 7 + 9 % 6};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(in[i], want_in[i]);
    assert_int_equal(tg[i], want_in[i] + 1);
  }
  exec_data_free(d);
  /* a token at or above the vocabulary is refused, naming the file */
  assert_null(exec_data_open(path, 12, 0, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "vocab_size 12"));
  g_clear_error(&err);
  /* a header that promises more tokens than the file holds */
  hdr[2] = 11;
  memcpy(buf, hdr, sizeof hdr);
  assert_true(g_file_set_contents(path, buf, sizeof buf, NULL));
  assert_null(exec_data_open(path, 256, 0, &err));
  assert_non_null(strstr(err->message, "header says 11 tokens"));
  g_clear_error(&err);
  /* cut inside its header (the magic intact): refused, never read as bytes */
  for (size_t cut = 4; cut < sizeof hdr; cut += 500) {
    assert_true(g_file_set_contents(path, buf, (gssize)cut, NULL));
    assert_null(exec_data_open(path, 256, 0, &err));
    assert_int_equal(err->code, PIPER_ERROR_INPUT);
    assert_non_null(strstr(err->message, "cut inside its 1024-byte header"));
    g_clear_error(&err);
  }
  char *dir = g_path_get_dirname(path);
  test_remove_tree(dir);
  g_free(dir);
  g_free(path);
}

static void test_data_bytes_and_synthetic(void **state) {
  (void)state;
  const char *text = "hello, world";
  char *path = write_temp("text.txt", text, strlen(text));
  GError *err = NULL;
  struct exec_data *d = exec_data_open(path, 256, 0, &err);
  assert_non_null(d);
  assert_string_equal(exec_data_kind(d), "bytes");
  int32_t in[4], tg[4];
  exec_data_batch(d, 0, 1, 4, in, tg);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(in[i], (unsigned char)text[i]);
    assert_int_equal(tg[i], (unsigned char)text[i + 1]);
  }
  exec_data_free(d);
  assert_null(exec_data_open(path, 128, 0, &err)); /* bytes need a 256-token vocabulary */
  assert_non_null(strstr(err->message, "vocab_size >= 256"));
  g_clear_error(&err);
  assert_null(exec_data_open("/nonexistent/piper.bin", 256, 0, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  g_clear_error(&err);
  /* synthetic: a function of the seed only */
  struct exec_data *a = exec_data_open(NULL, 256, 7, &err), *b = exec_data_open(NULL, 256, 7, &err);
  struct exec_data *c = exec_data_open(NULL, 256, 8, &err);
  int32_t x[64], y[64], z[64], t[64];
  exec_data_batch(a, 3, 2, 32, x, t);
  exec_data_batch(b, 3, 2, 32, y, t);
  exec_data_batch(c, 3, 2, 32, z, t);
  assert_memory_equal(x, y, sizeof x);
  assert_memory_not_equal(x, z, sizeof x);
  for (int i = 0; i < 64; i++)
    assert_true(x[i] >= 0 && x[i] < 256);
  exec_data_free(a);
  exec_data_free(b);
  exec_data_free(c);
  char *dir = g_path_get_dirname(path);
  test_remove_tree(dir);
  g_free(dir);
  g_free(path);
}

static void test_init_params(void **state) {
  (void)state;
  GError *err = NULL;
  struct model *m = model_load_file("models/tiny-dense.json", 0, &err);
  assert_non_null(m);
  uint32_t norm = UINT32_MAX, attn = UINT32_MAX;
  for (uint32_t o = 0; o < m->n_ops; o++) {
    if (m->ops[o].kind == MODEL_OP_RMSNORM && norm == UINT32_MAX)
      norm = o;
    if (m->ops[o].kind == MODEL_OP_ATTENTION && attn == UINT32_MAX)
      attn = o;
  }
  assert_true(exec_init_param(m, 1, norm, 3) == 1.0f);
  /* a counter-based hash: the same key gives the same value, another key another */
  assert_true(exec_init_param(m, 1, attn, 5) == exec_init_param(m, 1, attn, 5));
  assert_true(exec_init_param(m, 1, attn, 5) != exec_init_param(m, 2, attn, 5));
  assert_true(exec_init_param(m, 1, attn, 5) != exec_init_param(m, 1, attn, 6));
  /* normal(0, 0.02): over 100000 draws the sample mean is within 5 standard errors
   * (5 * 0.02 / sqrt(1e5) = 3.2e-4) and the sample std within 2% */
  double sum = 0, sq = 0;
  const int n = 100000;
  for (int i = 0; i < n; i++) {
    double v = exec_init_param(m, 1, attn, (uint64_t)i);
    sum += v;
    sq += v * v;
  }
  double mean = sum / n, sd = sqrt(sq / n - mean * mean);
  assert_true(fabs(mean) < 3.2e-4);
  assert_true(fabs(sd - 0.02) < 0.02 * 0.02);
  model_free(m);
}

/* ---- host backend ------------------------------------------------------------------------ */

struct seq_task {
  int *log;
  int *n;
  int value;
  useconds_t sleep_us;
};

static bool seq_fn(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  (void)err;
  struct seq_task *t = arg;
  if (t->sleep_us)
    g_usleep(t->sleep_us);
  t->log[__atomic_fetch_add(t->n, 1, __ATOMIC_SEQ_CST)] = t->value;
  return true;
}

static bool fail_fn(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  (void)arg;
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "task failed on purpose");
  return false;
}

struct recv_task {
  struct exec_comm *comm;
  int32_t word;
  bool returned;
  char message[160];
};

/* A receive nothing matches (from itself): it suspends its task until cancelled. */
static bool recv_fn(struct exec_stream *s, void *arg, GError **err) {
  (void)s;
  struct recv_task *t = arg;
  bool ok = exec_comm_recv(backend, t->comm, 0, &t->word, sizeof t->word, 77, err);
  t->returned = true;
  g_strlcpy(t->message, ok ? "" : (*err)->message, sizeof t->message);
  return ok;
}

/* One loop runs every stream, in submission order: a task suspended on communication lets
 * what was submitted after it on other streams run, up to the first item that must wait (here
 * the task queued behind the receive): nothing after that runs before it, though ready. A
 * cancel stops the request before the task unwinds (with an error, once). */
static void test_host_loop_suspends_and_cancels(void **state) {
  (void)state;
  GError *err = NULL;
  exec_backend_reset(backend);
  uint32_t self = 0;
  struct exec_comm *comm = exec_comm_create(backend, "self", &self, 1, true, &err);
  assert_non_null(comm);
  struct exec_stream *a = exec_stream_create(backend, "a", 0, &err);
  struct exec_stream *b = exec_stream_create(backend, "b", 0, &err);
  struct exec_event *ea = exec_event_create(backend), *eb = exec_event_create(backend);
  struct exec_event *ec = exec_event_create(backend);
  struct recv_task rt = {comm, 0, false, ""};
  int log[4] = {0}, n = 0;
  struct seq_task t1 = {log, &n, 1, 0}, t2 = {log, &n, 2, 0}, t3 = {log, &n, 3, 0};
  exec_stream_submit(backend, a, recv_fn, &rt, 1);
  exec_stream_submit(backend, b, seq_fn, &t2, 2); /* runs while the receive waits */
  exec_event_record(backend, eb, b);
  exec_stream_submit(backend, a, seq_fn, &t1, 3); /* behind the receive: never runs */
  exec_event_record(backend, ea, a);
  exec_stream_submit(backend, b, seq_fn, &t3, 4); /* ready, but after t1: never runs */
  exec_event_record(backend, ec, b);
  assert_true(exec_event_synchronize(backend, eb, 5));
  assert_int_equal(n, 1);
  assert_int_equal(log[0], 2);
  uint64_t before = exec_backend_progress(backend);
  assert_false(exec_event_synchronize(backend, ec, 0.05));
  assert_int_equal(n, 1);
  assert_false(exec_event_synchronize(backend, ea, 0.05));
  assert_false(rt.returned);
  struct exec_stream_status st;
  exec_stream_status(backend, a, &st);
  assert_int_equal(st.phase, EXEC_STREAM_RUNNING);
  assert_int_equal(st.task_id, 1);
  assert_int_equal(exec_backend_progress(backend), before);
  exec_backend_cancel(backend);
  assert_true(rt.returned);
  assert_non_null(strstr(rt.message, "receive from rank 0 on self cancelled"));
  /* the queued task is skipped, the stream failed with the receive's error */
  assert_true(exec_event_synchronize(backend, ea, 5));
  assert_int_equal(n, 1);
  exec_stream_status(backend, a, &st);
  assert_true(st.failed);
  assert_non_null(strstr(exec_stream_error(backend, a)->message, "cancelled"));
  /* after a cancel nothing new is posted */
  assert_false(exec_comm_recv(backend, comm, 0, &rt.word, sizeof rt.word, 77, &err));
  assert_non_null(strstr(err->message, "cancelled"));
  g_clear_error(&err);
  exec_stream_destroy(backend, a);
  exec_stream_destroy(backend, b);
  exec_event_destroy(backend, ea);
  exec_event_destroy(backend, eb);
  exec_event_destroy(backend, ec);
  exec_comm_destroy(backend, comm);
  exec_backend_reset(backend);
}

static void test_host_streams_events(void **state) {
  (void)state;
  GError *err = NULL;
  exec_backend_reset(backend);
  struct exec_stream *a = exec_stream_create(backend, "a", 0, &err);
  struct exec_stream *b = exec_stream_create(backend, "b", 0, &err);
  struct exec_event *ea = exec_event_create(backend), *eb = exec_event_create(backend);
  int log[8] = {0}, n = 0;
  /* b's task waits for a's slow task through an event, so it logs second */
  struct seq_task t1 = {log, &n, 1, 50000}, t2 = {log, &n, 2, 0}, t3 = {log, &n, 3, 0};
  exec_stream_submit(backend, a, seq_fn, &t1, 1);
  exec_event_record(backend, ea, a);
  exec_stream_wait_event(backend, b, ea);
  exec_stream_submit(backend, b, seq_fn, &t2, 2);
  exec_event_record(backend, eb, b);
  /* in-order on one stream: t3 after t1 */
  exec_stream_submit(backend, a, seq_fn, &t3, 3);
  exec_event_record(backend, ea, a);
  assert_true(exec_event_synchronize(backend, eb, 5));
  assert_true(exec_event_synchronize(backend, ea, 5));
  assert_int_equal(n, 3);
  assert_int_equal(log[0], 1);
  assert_true((log[1] == 2 && log[2] == 3) || (log[1] == 3 && log[2] == 2));
  /* a timeout is reported as such: the host's loop runs work inside synchronize and looks at
   * the clock between tasks, so the second slow task is still queued when it returns */
  struct seq_task slow = {log, &n, 4, 30000}, slower = {log, &n, 5, 30000};
  exec_stream_submit(backend, a, seq_fn, &slow, 4);
  exec_stream_submit(backend, a, seq_fn, &slower, 5);
  exec_event_record(backend, ea, a);
  assert_false(exec_event_synchronize(backend, ea, 0.01));
  struct exec_stream_status st;
  exec_stream_status(backend, a, &st);
  assert_int_equal(st.phase, EXEC_STREAM_IDLE);
  assert_int_equal(st.task_id, 5);
  assert_int_equal(n, 4);
  assert_true(exec_event_synchronize(backend, ea, 5));
  assert_int_equal(n, 5);
  /* plan order: of two ready streams, the item submitted first runs first */
  struct seq_task o1 = {log, &n, 6, 0}, o2 = {log, &n, 7, 0};
  exec_stream_submit(backend, b, seq_fn, &o1, 6);
  exec_stream_submit(backend, a, seq_fn, &o2, 7);
  exec_event_record(backend, ea, a);
  exec_event_record(backend, eb, b);
  assert_true(exec_event_synchronize(backend, ea, 5));
  assert_true(exec_event_synchronize(backend, eb, 5));
  assert_int_equal(log[5], 6);
  assert_int_equal(log[6], 7);
  /* a failing task fails its stream and keeps its error */
  exec_stream_submit(backend, b, fail_fn, NULL, 9);
  exec_event_record(backend, eb, b);
  assert_true(exec_event_synchronize(backend, eb, 5) || true);
  exec_stream_status(backend, b, &st);
  assert_true(st.failed);
  assert_non_null(exec_stream_error(backend, b));
  assert_string_equal(exec_stream_error(backend, b)->message, "task failed on purpose");
  exec_stream_destroy(backend, a);
  exec_stream_destroy(backend, b);
  exec_event_destroy(backend, ea);
  exec_event_destroy(backend, eb);
  exec_backend_reset(backend);
  assert_non_null(exec_backend_find("host"));
  assert_null(exec_backend_find("nonexistent"));
}

/* The table's version and required entries are checked at init; the wrappers fill in what a
 * one-process backend leaves out. */
static void test_backend_table_checks_and_defaults(void **state) {
  (void)state;
  GError *err = NULL;
  struct exec_backend_ops other = exec_backend_host;
  other.api_version = EXEC_BACKEND_API_VERSION + 1;
  assert_null(exec_backend_init(&other, NULL, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "interface version"));
  g_clear_error(&err);
  struct exec_backend_ops lacking = exec_backend_host;
  lacking.stream_submit = NULL;
  assert_null(exec_backend_init(&lacking, NULL, &err));
  assert_non_null(strstr(err->message, "has no stream_submit"));
  g_clear_error(&err);
  /* an op every plan runs (ops.def's EXEC_USE_ALWAYS) is required of every table */
  struct exec_kernels no_fill = *exec_backend_host.kernels;
  no_fill.fill = NULL;
  lacking = exec_backend_host;
  lacking.kernels = &no_fill;
  assert_null(exec_backend_init(&lacking, NULL, &err));
  assert_non_null(strstr(err->message, "has no fill (every plan runs it)"));
  g_clear_error(&err);
  /* a group started must be finishable: p2p_start and p2p_finish come together */
  lacking = exec_backend_host;
  lacking.p2p_finish = NULL;
  assert_null(exec_backend_init(&lacking, NULL, &err));
  assert_non_null(strstr(err->message, "one of p2p_start and p2p_finish (both or neither)"));
  g_clear_error(&err);
  assert_null(exec_backend_init_by_name("nonexistent", NULL, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  g_clear_error(&err);
  struct exec_backend_ops minimal = exec_backend_host;
  minimal.abort = NULL;
  minimal.world_rank = NULL;
  minimal.world_size = NULL;
  minimal.comm_library = NULL;
  minimal.world_all_reduce_f64 = NULL;
  minimal.world_gather = NULL;
  minimal.world_broadcast = NULL;
  struct exec_backend *b = exec_backend_init(&minimal, NULL, &err);
  assert_non_null(b);
  assert_ptr_equal(b->ops, &minimal);
  assert_string_equal(exec_backend_name(b), "host");
  assert_string_equal(exec_backend_comm_library(b), "none");
  assert_int_equal(exec_backend_world_rank(b), 0);
  assert_int_equal(exec_backend_world_size(b), 1);
  double x[2] = {1.5, -2};
  assert_true(exec_world_all_reduce_f64(b, x, 2, EXEC_REDUCE_SUM, &err));
  assert_true(x[0] == 1.5 && x[1] == -2);
  void *all = NULL;
  size_t *sizes = NULL;
  assert_true(exec_world_gather(b, x, sizeof x, &all, &sizes, &err));
  assert_int_equal(sizes[0], sizeof x);
  assert_memory_equal(all, x, sizeof x);
  g_free(all);
  g_free(sizes);
  exec_backend_free(b);
}

/* The busy clock (stragglers' measure): the host's counts the work its thread does and not
 * the time it waits (a rank waiting for a core); a backend without one says so. */
static void test_backend_busy_clock(void **state) {
  (void)state;
  GError *err = NULL;
  struct exec_backend *b = exec_backend_init(&exec_backend_host, NULL, &err);
  assert_non_null(b);
  double b0, b1, b2;
  assert_true(exec_backend_busy_clock(b, &b0));
  g_usleep(100000); /* 0.1 s asleep: the clock barely moves */
  assert_true(exec_backend_busy_clock(b, &b1));
  assert_true(b1 - b0 < 0.02);
  double t0 = exec_backend_clock(b);
  while (exec_backend_clock(b) - t0 < 0.05) /* 0.05 s spinning: it moves, at most as fast */
    ;
  assert_true(exec_backend_busy_clock(b, &b2));
  assert_true(b2 - b1 > 0 && b2 - b1 <= exec_backend_clock(b) - t0 + 1e-3);
  exec_backend_free(b);
  struct exec_backend_ops ops = exec_backend_host;
  ops.busy_clock = NULL;
  b = exec_backend_init(&ops, NULL, &err);
  assert_non_null(b);
  b0 = 1;
  assert_false(exec_backend_busy_clock(b, &b0));
  assert_true(b0 == 0);
  exec_backend_free(b);
}

/* The stall rule: idle time grows between looks without progress and restarts on progress;
 * a gap between two looks longer than the stop gap (this process was stopped, SIGSTOP) restarts
 * it too, so a resumed rank does not blame its peers for its own pause. */
static void test_stall_clock(void **state) {
  (void)state;
  struct exec_stall_clock c;
  double idle = -1, t = 0;
  exec_stall_clock_init(&c, 7, 0.0, 1.0);
  for (int k = 0; k < 80; k++) /* 4 s of looks every 0.05 s, nothing done */
    assert_false(exec_stall_clock_look(&c, 7, t += 0.05, &idle));
  assert_true(fabs(idle - 4.0) < 1e-9);
  assert_true(exec_stall_clock_look(&c, 8, t += 0.05, &idle)); /* progress */
  assert_true(idle == 0);
  assert_false(exec_stall_clock_look(&c, 8, t += 0.05, &idle));
  assert_true(fabs(idle - 0.05) < 1e-9);
  assert_true(exec_stall_clock_look(&c, 8, t += 5.0, &idle)); /* stopped 5 s: a pause */
  assert_true(idle == 0);
  assert_false(exec_stall_clock_look(&c, 8, t += 0.9, &idle)); /* a slow look is not one */
  assert_true(fabs(idle - 0.9) < 1e-9);
}

static GString *p2p_log;

static bool log_send(struct exec_comm *c, uint32_t peer, const void *buf, size_t bytes, int tag,
                     GError **err) {
  (void)c, (void)buf, (void)err;
  g_string_append_printf(p2p_log, "s%u:%zu:%d ", peer, bytes, tag);
  return true;
}

static bool log_recv(struct exec_comm *c, uint32_t peer, void *buf, size_t bytes, int tag,
                     GError **err) {
  (void)c, (void)buf;
  g_string_append_printf(p2p_log, "r%u:%zu:%d ", peer, bytes, tag);
  return tag == 99 ? piper_runtime_error(err, "receive failed on purpose") : true;
}

/* A point-to-point group: without a p2p_group entry the wrapper runs the parts' sends and
 * receives in the order given and stops at the first failure; the host backend's own group
 * fails, alone, as its sends and receives do (no peer). */
static void test_backend_p2p_group(void **state) {
  (void)state;
  GError *err = NULL;
  struct exec_backend_ops ops = exec_backend_host;
  ops.p2p_group = NULL;
  ops.send = log_send;
  ops.recv = log_recv;
  struct exec_backend *b = exec_backend_init(&ops, NULL, &err);
  assert_non_null(b);
  uint32_t me = 0;
  struct exec_comm *c = exec_comm_create(b, "pp", &me, 1, true, &err);
  assert_non_null(c);
  float x[4] = {0}, y[2] = {0};
  struct exec_p2p_part parts[3] = {
      {c, 1, true, x, sizeof x, 7}, {c, 1, false, y, sizeof y, 7}, {c, 2, false, y, sizeof y, 8}};
  p2p_log = g_string_new("");
  assert_true(exec_comm_p2p_group(b, parts, 3, &err));
  assert_string_equal(p2p_log->str, "s1:16:7 r1:8:7 r2:8:8 ");
  g_string_truncate(p2p_log, 0);
  parts[1].tag = 99;
  assert_false(exec_comm_p2p_group(b, parts, 3, &err));
  assert_string_equal(p2p_log->str, "s1:16:7 r1:8:99 ");
  assert_non_null(strstr(err->message, "on purpose"));
  g_clear_error(&err);
  g_string_free(p2p_log, TRUE);
  exec_comm_destroy(b, c);
  exec_backend_free(b);

  b = exec_backend_init(&exec_backend_host, NULL, &err);
  assert_non_null(b);
  c = exec_comm_create(b, "pp", &me, 1, true, &err);
  assert_non_null(c);
  for (int k = 0; k < 3; k++) /* the first communicator is gone with its backend */
    parts[k].comm = c;
  parts[1].tag = 7;
  assert_true(exec_comm_p2p_group(b, parts, 0, &err));
  assert_false(exec_comm_p2p_group(b, parts, 2, &err));
  assert_non_null(strstr(err->message, "needs another process"));
  g_clear_error(&err);
  exec_comm_destroy(b, c);
  exec_backend_free(b);
}

/* ---- one-device training ----------------------------------------------------------------- */

struct trained {
  double *losses;
  uint32_t n;
  float *params;
  uint64_t n_params;
};

static bool train(const struct plan *plan, struct exec_options *o, struct trained *out,
                  GError **err) {
  char *dir = test_tmp_dir("test_exec_params_XXXXXX");
  char *dump = g_build_filename(dir, "params.bin", NULL);
  o->plan = plan;
  o->dump_params_path = dump;
  struct exec_result r;
  bool ok = exec_run(o, backend, &r, err);
  if (ok) {
    out->n = r.n_steps;
    out->losses = g_memdup2(r.losses, r.n_steps * sizeof(double));
    gchar *data = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(dump, &data, &len, NULL));
    out->params = (float *)data;
    out->n_params = len / sizeof(float);
    exec_result_clear(&r);
  }
  test_remove_tree(dir);
  g_free(dump);
  g_free(dir);
  return ok;
}

static void trained_free(struct trained *t) {
  g_free(t->losses);
  g_free(t->params);
}

static void test_train_loss_falls(void **state) {
  (void)state;
  struct compile_result r = compile_text("models/tiny-dense.json", "[]", 2, NULL, 0);
  struct exec_options o = exec_options_default();
  o.warmup = 0;
  o.iters = 25;
  o.lr = 3e-3f;
  struct trained t;
  GError *err = NULL;
  if (!train(r.plan, &o, &t, &err))
    fail_msg("%s", err->message);
  assert_int_equal(t.n, 25);
  /* from ln(256) = 5.55 at random init; the synthetic stream is 3/4 predictable */
  assert_true(fabs(t.losses[0] - log(256.0)) < 0.2);
  assert_true(t.losses[24] < t.losses[0] - 0.5);
  trained_free(&t);
  compile_result_free(&r);
}

/* The same steps with the backward split into BI and BW (all BI, then all BW, as zero-bubble
 * schedules do) give bit-identical results: the fused kernels are BI followed by BW, and each
 * op's weight gradient sums the micro-batches in the same order either way. */
static void test_bi_bw_split_equals_fused(void **state) {
  (void)state;
  const char *split =
      "[{\"op\": \"split\", \"filter\": {}, \"dim_name\": \"MB\", \"num_microbatches\": 2},"
      " {\"op\": \"order\", \"filters\": [[{\"PASS\": \"F\"}], [{\"PASS\": \"BI\"}],"
      " [{\"PASS\": \"BW\"}]]}]";
  struct compile_result fused = compile_text("models/tiny-moe.json", "[]", 2, NULL, 0);
  struct compile_result bibw = compile_text("models/tiny-moe.json", split, 0, NULL, 0);
  uint32_t bi = 0;
  for (uint32_t i = 0; i < bibw.plan->n_nodes; i++)
    bi += bibw.plan->nodes[i].pass == IR_PASS_BI;
  assert_true(bi > 0);
  struct exec_options o = exec_options_default();
  o.warmup = 0;
  o.iters = 3;
  struct trained a, b;
  GError *err = NULL;
  if (!train(fused.plan, &o, &a, &err))
    fail_msg("%s", err->message);
  if (!train(bibw.plan, &o, &b, &err))
    fail_msg("%s", err->message);
  assert_memory_equal(a.losses, b.losses, 3 * sizeof(double));
  assert_int_equal(a.n_params, b.n_params);
  assert_memory_equal(a.params, b.params, a.n_params * sizeof(float));
  trained_free(&a);
  trained_free(&b);
  compile_result_free(&fused);
  compile_result_free(&bibw);
}

static void test_checkpoint_resume(void **state) {
  (void)state;
  struct compile_result r = compile_text("models/tiny-moe.json", "[]", 2, NULL, 0);
  char *dir = test_tmp_dir("test_exec_ckpt_XXXXXX");
  GError *err = NULL;
  struct exec_options o = exec_options_default();
  o.warmup = 0;
  o.iters = 4;
  struct trained whole, first, rest;
  if (!train(r.plan, &o, &whole, &err))
    fail_msg("%s", err->message);
  o.iters = 2;
  o.checkpoint_dir = dir;
  o.checkpoint_every = 2;
  if (!train(r.plan, &o, &first, &err))
    fail_msg("%s", err->message);
  o.iters = 4;
  o.checkpoint_dir = NULL;
  o.resume_dir = dir;
  if (!train(r.plan, &o, &rest, &err))
    fail_msg("%s", err->message);
  assert_int_equal(rest.n, 2);
  assert_memory_equal(first.losses, whole.losses, 2 * sizeof(double));
  assert_memory_equal(rest.losses, whole.losses + 2, 2 * sizeof(double));
  assert_memory_equal(rest.params, whole.params, whole.n_params * sizeof(float));
  /* another seed, another model, a flipped byte: each refused with what is wrong */
  struct trained none;
  o.seed = 99;
  assert_false(train(r.plan, &o, &none, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "--seed"));
  g_clear_error(&err);
  o.seed = exec_options_default().seed;
  struct compile_result dense = compile_text("models/tiny-dense.json", "[]", 2, NULL, 0);
  assert_false(train(dense.plan, &o, &none, &err));
  assert_non_null(strstr(err->message, "different model or parameter layout"));
  g_clear_error(&err);
  compile_result_free(&dense);
  char *file = g_build_filename(dir, "step-2", "rank-0.ckpt", NULL);
  gchar *data = NULL;
  gsize len = 0;
  assert_true(g_file_get_contents(file, &data, &len, NULL));
  data[len / 2] ^= 0x10;
  assert_true(g_file_set_contents(file, data, (gssize)len, NULL));
  assert_false(train(r.plan, &o, &none, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "checksum mismatch"));
  g_clear_error(&err);
  g_free(data);
  g_free(file);
  trained_free(&whole);
  trained_free(&first);
  trained_free(&rest);
  test_remove_tree(dir);
  g_free(dir);
  compile_result_free(&r);
}

/* Device 0's description under a base schedule of pp2_dp2_ep2 (1F1B, 4 micro-batches). */
static void describe_device0(const char *base, const struct exec_options *o,
                             struct exec_checkpoint_meta *m) {
  gchar *prog = NULL;
  assert_true(g_file_get_contents(base, &prog, NULL, NULL));
  struct compile_result r = compile_text("models/tiny-moe.json", prog, 4, "1f1b", 0);
  g_free(prog);
  struct exec_model xm;
  struct exec_device dev;
  GError *err = NULL;
  assert_true(exec_model_init(&xm, r.plan->model, &err));
  if (!exec_device_init(&dev, r.plan, &xm, 0, &err))
    fail_msg("%s", err->message);
  exec_checkpoint_describe(o, &dev, NULL, 4, m);
  exec_device_clear(&dev);
  exec_model_clear(&xm);
  compile_result_free(&r);
}

/* compare(was, now) fails with an input error containing want, or succeeds when want is NULL;
 * notes get what was accepted. */
static void expect_compare(const struct exec_checkpoint_meta *was,
                           const struct exec_checkpoint_meta *now, uint32_t allow, const char *want,
                           GString *notes) {
  GError *err = NULL;
  bool ok = exec_checkpoint_compare("ck/rank-0.ckpt", was, now, allow, notes, &err);
  if (!want) {
    if (!ok)
      fail_msg("%s", err->message);
    return;
  }
  assert_false(ok);
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  if (!strstr(err->message, want))
    fail_msg("\"%s\" lacks \"%s\"", err->message, want);
  assert_null(strchr(err->message, '\n'));
  g_error_free(err);
}

/* The two failures (a ZeRO-2 or ZeRO-3 checkpoint resumed under the plain plan) are
 * refusals naming the sharding; a learning rate change passes only when allowed. */
static void test_checkpoint_compare(void **state) {
  (void)state;
  const char *bs = "directives/base-schedules/";
  struct exec_options o = exec_options_default();
  struct exec_checkpoint_meta plain, zero1, zero2, zero3, lr;
  char *path = g_strconcat(bs, "pp2_dp2_ep2.json", NULL);
  describe_device0(path, &o, &plain);
  g_free(path);
  path = g_strconcat(bs, "pp2_dp2_ep2_zero2.json", NULL);
  describe_device0(path, &o, &zero2);
  g_free(path);
  path = g_strconcat(bs, "pp2_dp2_ep2_zero1.json", NULL);
  describe_device0(path, &o, &zero1);
  g_free(path);
  path = g_strconcat(bs, "pp2_dp2_ep2_zero3.json", NULL);
  describe_device0(path, &o, &zero3);
  o.lr = 2e-3f;
  describe_device0(path, &o, &lr);
  g_free(path);
  GString *notes = g_string_new(NULL);
  expect_compare(&zero2, &zero2, 0, NULL, notes);
  expect_compare(&zero2, &plain, 0,
                 "was written with shard_grads (ZeRO-2) on device group [0,1] for segments", notes);
  expect_compare(&zero2, &plain, 0, "this plan has no sharding on device group [0,1]", notes);
  expect_compare(&zero3, &plain, 0, "was written with shard_params (ZeRO-3)", notes);
  /* ZeRO-1 keeps only its shard of the moments: neither plain nor ZeRO-2 reads it as theirs */
  expect_compare(&zero1, &plain, 0, "was written with shard_optimizer (ZeRO-1)", notes);
  expect_compare(&zero2, &zero1, 0, "this plan has shard_optimizer (ZeRO-1)", notes);
  expect_compare(&plain, &zero3, 0, "this plan has shard_params (ZeRO-3)", notes);
  assert_int_equal(notes->len, 0);
  expect_compare(&zero3, &lr, 0, "lr 0.001, now 0.002 (--resume-allow-change lr to accept)", notes);
  uint32_t allow = 0;
  GError *err = NULL;
  assert_true(exec_resume_allow_parse("weight_decay, lr", &allow, &err));
  expect_compare(&zero3, &lr, allow, NULL, notes);
  assert_string_equal(notes->str, "lr 0.001 -> 0.002");
  assert_false(exec_resume_allow_parse("lr,momentum", &allow, &err));
  assert_non_null(strstr(err->message, "\"momentum\" is not one of"));
  g_clear_error(&err);
  /* another micro-batch count, seed and data file are refused */
  lr.microbatches = 8;
  expect_compare(&zero3, &lr, allow, "micro-batches per step on this device 4, this plan has 8",
                 notes);
  lr.microbatches = zero3.microbatches;
  lr.seed = 7;
  expect_compare(&zero3, &lr, allow, "--seed 1234, this run has --seed 7", notes);
  lr.seed = zero3.seed;
  g_free(lr.data_path);
  lr.data_path = g_strdup("train.bin");
  expect_compare(&zero3, &lr, allow,
                 "with data synthetic stream (0 bytes), now synthetic train.bin", notes);
  /* the description survives its JSON form */
  char *text = exec_checkpoint_meta_to_json(&zero3);
  cJSON *j = cJSON_Parse(text);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "tiny-moe");
  struct exec_checkpoint_meta back = {0};
  if (!exec_checkpoint_meta_from_json("ck", text, strlen(text), &back, &err))
    fail_msg("%s", err->message);
  exec_checkpoint_meta_clear(&back);
  /* a key twice (the first would be read) is refused, naming it */
  cJSON_AddItemToObject(j, "model", cJSON_CreateString("tiny-dense"));
  char *twice = cJSON_PrintUnformatted(j);
  memset(&back, 0, sizeof back);
  assert_false(exec_checkpoint_meta_from_json("ck", twice, strlen(twice), &back, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_string_equal(err->message, "ck: description: key \"model\" appears twice in the "
                                    "top-level object");
  g_clear_error(&err);
  exec_checkpoint_meta_clear(&back);
  cJSON_free(twice);
  cJSON_Delete(j);
  cJSON_free(text);
  g_string_free(notes, TRUE);
  exec_checkpoint_meta_clear(&plain);
  exec_checkpoint_meta_clear(&zero2);
  exec_checkpoint_meta_clear(&zero1);
  exec_checkpoint_meta_clear(&zero3);
  exec_checkpoint_meta_clear(&lr);
}

/* Bytes that are not a whole checkpoint are input errors, never a crash. */
static void test_checkpoint_parse_refuses(void **state) {
  (void)state;
  struct exec_checkpoint_file f;
  GError *err = NULL;
  const char *cases[][2] = {
      {"", "not a piper-exec checkpoint"},
      {"PIPERCKP", "truncated"},
      {"PIPERCKP\x01\0\0\0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "version 1"},
      {"PIPERCKP\x07\0\0\0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "version 7"},
      {"PIPERCKP\x02\0\0\0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "checksum mismatch"},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    size_t len = k < 2 ? strlen(cases[k][0]) : 56;
    assert_false(exec_checkpoint_parse("x.ckpt", cases[k][0], len, &f, &err));
    assert_int_equal(err->code, PIPER_ERROR_INPUT);
    if (!strstr(err->message, cases[k][1]))
      fail_msg("case %zu: \"%s\" lacks \"%s\"", k, err->message, cases[k][1]);
    g_clear_error(&err);
  }
}

/* The last step is checkpointed even off the period, --checkpoint-keep prunes, and a crashed
 * writer's temporary files go when checkpointing starts. */
static void test_checkpoint_final_keep_and_cleanup(void **state) {
  (void)state;
  struct compile_result r = compile_text("models/tiny-dense.json", "[]", 2, NULL, 0);
  char *dir = test_tmp_dir("test_exec_keep_XXXXXX");
  char *stale[3] = {g_build_filename(dir, "latest.tmp", NULL),
                    g_build_filename(dir, "step-2", "rank-0.ckpt.tmp", NULL),
                    g_build_filename(dir, "step-9", "rank-0.ckpt", NULL)};
  for (int k = 0; k < 3; k++) {
    char *parent = g_path_get_dirname(stale[k]);
    g_mkdir_with_parents(parent, 0755);
    g_free(parent);
    assert_true(g_file_set_contents(stale[k], "junk", 4, NULL));
  }
  struct exec_options o = exec_options_default();
  o.warmup = 0;
  o.iters = 5;
  o.checkpoint_dir = dir;
  o.checkpoint_every = 2;
  o.checkpoint_keep = 2;
  struct trained t;
  GError *err = NULL;
  if (!train(r.plan, &o, &t, &err))
    fail_msg("%s", err->message);
  char *latest = g_build_filename(dir, "latest", NULL);
  gchar *text = NULL;
  assert_true(g_file_get_contents(latest, &text, NULL, NULL));
  assert_string_equal(text, "step-5\n");
  const char *want[] = {"step-4/rank-0.ckpt", "step-5/rank-0.ckpt"};
  const char *gone[] = {"step-2", "step-9", "latest.tmp"};
  for (int k = 0; k < 2; k++) {
    char *p = g_build_filename(dir, want[k], NULL);
    assert_true(g_file_test(p, G_FILE_TEST_IS_REGULAR));
    g_free(p);
  }
  for (int k = 0; k < 3; k++) {
    char *p = g_build_filename(dir, gone[k], NULL);
    if (g_file_test(p, G_FILE_TEST_EXISTS))
      fail_msg("%s is still there", p);
    g_free(p);
  }
  /* keep without a directory, allow without a resume: refused */
  struct trained none;
  o.checkpoint_dir = NULL;
  assert_false(train(r.plan, &o, &none, &err));
  assert_non_null(strstr(err->message, "--checkpoint-keep goes with --checkpoint"));
  g_clear_error(&err);
  o.checkpoint_keep = 0;
  o.resume_allow_change = "lr";
  assert_false(train(r.plan, &o, &none, &err));
  assert_non_null(strstr(err->message, "--resume-allow-change goes with --resume"));
  g_clear_error(&err);
  g_free(text);
  g_free(latest);
  for (int k = 0; k < 3; k++)
    g_free(stale[k]);
  trained_free(&t);
  test_remove_tree(dir);
  g_free(dir);
  compile_result_free(&r);
}

static void test_watchdog(void **state) {
  (void)state;
  struct compile_result r = compile_text("models/tiny-dense.json", "[]", 2, NULL, 0);
  struct exec_options o = exec_options_default();
  o.warmup = 0;
  o.iters = 3;
  o.timeout_s = 0.3;
  o.hooks.fault = EXEC_FAULT_STALL;
  o.hooks.fault_rank = 0;
  o.hooks.fault_step = 2;
  o.plan = r.plan;
  struct exec_result res;
  GError *err = NULL;
  double t0 = g_get_monotonic_time() / 1e6;
  assert_false(exec_run(&o, backend, &res, &err));
  double took = g_get_monotonic_time() / 1e6 - t0;
  assert_int_equal(err->code, PIPER_ERROR_RUNTIME);
  /* one line naming the rank, the stream and the instruction */
  assert_non_null(strstr(err->message, "rank 0: watchdog: no progress for"));
  assert_non_null(strstr(err->message, "stream \"compute\" is stuck in instruction 0 \"F s0"));
  assert_null(strchr(err->message, '\n'));
  assert_true(took < 5);
  g_clear_error(&err);
  /* the backend runs again after a reset (exec_run does it) */
  o.hooks.fault = EXEC_FAULT_NONE;
  struct trained t;
  if (!train(r.plan, &o, &t, &err))
    fail_msg("%s", err->message);
  trained_free(&t);
  compile_result_free(&r);
}

static void test_refuses_plan_larger_than_job(void **state) {
  (void)state;
  gchar *prog = NULL;
  assert_true(g_file_get_contents("directives/base-schedules/dp2.json", &prog, NULL, NULL));
  struct compile_result r = compile_text("models/tiny-moe.json", prog, 2, NULL, 0);
  g_free(prog);
  struct exec_options o = exec_options_default();
  o.plan = r.plan;
  struct exec_result res;
  GError *err = NULL;
  assert_false(exec_run(&o, backend, &res, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "the plan has 2 devices but the job has 1 processes"));
  g_clear_error(&err);
  compile_result_free(&r);
}

/* The op list (exec/ops.def) generates the host's tables: every op is there, each name once,
 * and a table without an op is refused for exactly the plans that use it, naming the op. */
static void test_ops_cover_host_and_refuse_unsupported(void **state) {
  (void)state;
  GHashTable *names = g_hash_table_new(g_str_hash, g_str_equal);
  for (int op = 0; op < EXEC_OP_COUNT; op++) {
    assert_true(exec_backend_supports_op(backend, (enum exec_op)op));
    const char *name = exec_op_name((enum exec_op)op);
    assert_false(g_hash_table_contains(names, name));
    g_hash_table_add(names, (gpointer)name);
  }
  assert_int_equal(g_hash_table_size(names), EXEC_OP_COUNT);
  g_hash_table_destroy(names);
  assert_string_equal(exec_op_name(EXEC_OP_rmsnorm_forward), "rmsnorm_forward");
  assert_int_equal(exec_op_use(EXEC_OP_reduce_scatter_f32), EXEC_USE_REDUCE_SCATTER);

  gchar *prog = NULL;
  assert_true(g_file_get_contents("directives/base-schedules/dp2.json", &prog, NULL, NULL));
  struct compile_result dp = compile_text("models/tiny-moe.json", prog, 2, NULL, 0);
  g_free(prog);
  bool uses[EXEC_USE_COUNT];
  exec_plan_uses(dp.plan, uses);
  assert_true(uses[EXEC_USE_ALWAYS] && uses[EXEC_USE_ATTENTION] && uses[EXEC_USE_EXPERTS]);
  assert_true(uses[EXEC_USE_ALL_REDUCE]);
  assert_false(uses[EXEC_USE_POINT_TO_POINT] || uses[EXEC_USE_TENSOR_PARALLEL]);
  assert_false(uses[EXEC_USE_SELECTIVE_RECOMPUTE]);

  GError *err = NULL;
  struct exec_backend_ops no_send = exec_backend_host;
  no_send.send = NULL;
  struct exec_backend_ops no_all_reduce = exec_backend_host;
  no_all_reduce.all_reduce_f32 = NULL;
  struct exec_backend *b = exec_backend_init(&no_send, NULL, &err);
  assert_non_null(b);
  assert_false(exec_backend_supports_op(b, EXEC_OP_send));
  assert_true(exec_check_ops(b, dp.plan, &err)); /* data parallelism sends nothing */
  exec_backend_free(b);
  b = exec_backend_init(&no_all_reduce, NULL, &err);
  assert_non_null(b);
  assert_false(exec_check_ops(b, dp.plan, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "no all_reduce_f32 op"));
  assert_non_null(strstr(err->message, "gradient all-reduce"));
  g_clear_error(&err);
  exec_backend_free(b);
  compile_result_free(&dp);

  /* MLA attention is a use with no op in the list yet: every backend refuses it, by name */
  struct compile_result mla = compile_text("models/deepseek-v3.json", "[]", 1, NULL, 1);
  assert_non_null(mla.plan);
  exec_plan_uses(mla.plan, uses);
  assert_true(uses[EXEC_USE_MLA_ATTENTION] && !uses[EXEC_USE_ATTENTION]);
  assert_false(exec_check_ops(backend, mla.plan, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "MLA attention, which no op of exec/ops.def runs"));
  g_clear_error(&err);
  compile_result_free(&mla);
}

/* Stragglers: ranks of a class compared with their peers' median, step by step; named when
 * slower by more than the threshold in three steps of four. */
/* The Hugging Face names of a family: every parameter of the model in exactly one tensor (the
 * map covers each op's block end to end), the family's own names, and a Linear weight's [out,
 * in] element for a block's [in, out] one. */
static const struct exec_hf_tensor *hf_find(const struct exec_hf_map *map, const char *name) {
  for (uint32_t k = 0; k < map->n; k++)
    if (strcmp(map->t[k].name, name) == 0)
      return &map->t[k];
  return NULL;
}

static void hf_expect(const char *file, const char *name, uint64_t rows, uint64_t cols) {
  GError *err = NULL;
  struct model *m = model_load_file(file, 0, &err);
  assert_non_null(m);
  struct exec_hf_map map;
  assert_true(exec_hf_map_build(m, &map, &err));
  uint64_t total = 0;
  for (uint32_t k = 0; k < map.n; k++)
    if (!map.t[k].alias)
      total += map.t[k].shape[0] * (map.t[k].ndim > 1 ? map.t[k].shape[1] : 1);
  assert_int_equal(total, model_param_count(m));
  const struct exec_hf_tensor *t = hf_find(&map, name);
  assert_non_null(t);
  assert_int_equal(t->shape[0], rows);
  assert_int_equal(t->shape[1], cols);
  exec_hf_map_clear(&map);
  model_free(m);
}

static void test_hf_names_per_family(void **state) {
  (void)state;
  hf_expect("models/llama3-8b.json", "model.layers.31.self_attn.k_proj.weight", 1024, 4096);
  hf_expect("models/mixtral-8x22b.json", "model.layers.0.block_sparse_moe.experts.7.w2.weight",
            6144, 16384);
  hf_expect("models/qwen3-30b-a3b.json", "model.layers.47.mlp.gate.weight", 128, 2048);
  hf_expect("models/qwen1.5-moe-a2.7b.json", "model.layers.0.mlp.shared_expert_gate.weight", 1,
            2048);
  /* q_proj [out 4096, in 4096]: the block's element [0, 1] (index 1) is HF's [1, 0] */
  GError *err = NULL;
  struct model *m = model_load_file("models/llama3-8b.json", 0, &err);
  struct exec_hf_map map;
  assert_true(exec_hf_map_build(m, &map, &err));
  uint32_t op = 0, k;
  while (m->ops[op].kind != MODEL_OP_ATTENTION)
    op++;
  uint64_t index;
  exec_hf_locate(&map, op, 1, &k, &index);
  assert_string_equal(map.t[k].name, "model.layers.0.self_attn.q_proj.weight");
  assert_int_equal(index, 4096);
  /* the first element of k_proj follows q_proj's 4096 x 4096 */
  exec_hf_locate(&map, op, 4096ull * 4096, &k, &index);
  assert_string_equal(map.t[k].name, "model.layers.0.self_attn.k_proj.weight");
  assert_int_equal(index, 0);
  exec_hf_map_clear(&map);
  model_free(m);
  /* MLA has no mapping: refused naming the model type */
  m = model_load_file("models/deepseek-v3.json", 61, &err);
  assert_non_null(m);
  assert_false(exec_hf_map_build(m, &map, &err));
  assert_non_null(strstr(err->message, "MLA attention (model_type deepseek_v3)"));
  g_clear_error(&err);
  model_free(m);
}

static void test_stragglers_named_against_their_peers(void **state) {
  (void)state;
  /* 4 steps x 5 ranks; ranks 0-3 one class (data-parallel replicas), rank 4 alone */
  const uint32_t class_of[5] = {0, 0, 0, 0, 1};
  double t[4][5];
  for (int s = 0; s < 4; s++)
    for (int r = 0; r < 5; r++)
      t[s][r] = 1.0 + 0.01 * r; /* peers within 3% of each other */
  for (int s = 0; s < 4; s++)
    t[s][1] = 1.5 * 1.02; /* rank 1: 1.5x its peers' median (1.02) every step */
  t[2][3] = 2.0;          /* rank 3: slow in one step of four only */
  for (int s = 0; s < 4; s++)
    t[s][4] = 9.0; /* alone in its class: no peer to compare with */
  struct exec_straggler *x = NULL;
  uint32_t n = exec_find_stragglers(&t[0][0], 4, 5, class_of, 0.25, &x);
  assert_int_equal(n, 1);
  assert_int_equal(x[0].rank, 1);
  assert_int_equal(x[0].class_id, 0);
  assert_int_equal(x[0].peers, 3);
  assert_int_equal(x[0].slow_steps, 4);
  /* its peers 0, 2, 3 take 1.00, 1.02, 1.03 (2.0 in step 2): the median is 1.02 each step */
  assert_true(fabs(x[0].ratio - 1.5) < 1e-12);
  g_free(x);
  /* a threshold above its ratio names nobody; a slow step in three of four is enough */
  assert_int_equal(exec_find_stragglers(&t[0][0], 4, 5, class_of, 0.6, &x), 0);
  assert_null(x);
  t[0][1] = 1.0;
  assert_int_equal(exec_find_stragglers(&t[0][0], 4, 5, class_of, 0.25, &x), 1);
  assert_int_equal(x[0].slow_steps, 3);
  g_free(x);
  t[1][1] = 1.0; /* two of four: not consistent */
  assert_int_equal(exec_find_stragglers(&t[0][0], 4, 5, class_of, 0.25, &x), 0);
  /* one measured step is never enough */
  assert_int_equal(exec_find_stragglers(&t[3][0], 1, 5, class_of, 0.25, &x), 0);
}

/* Each schedule's curve at chosen steps (peak 1, floor 0.25, warm-up 4, decay by step 16: the
 * decay's ratio is (t - 4) / 12), against Megatron-LM's formulas worked by hand. */
static void test_lr_schedule_curves(void **state) {
  (void)state;
  const double tol = 1e-12; /* cos and pow in double; the rest is exact */
  struct exec_lr_schedule s = {.min_lr = 0.25f, .warmup_iters = 4, .decay_iters = 16,
                               .wsd_decay_fraction = 0.1f};
  GError *err = NULL;
  /* warm-up from 0, whatever comes after */
  assert_true(exec_lr_at(&s, 1.0f, 1) == 0.25 && exec_lr_at(&s, 1.0f, 2) == 0.5);
  assert_true(exec_lr_at(&s, 1.0f, 4) == 1.0);
  /* constant: the peak for ever, the floor unused */
  assert_true(exec_lr_at(&s, 1.0f, 5) == 1.0 && exec_lr_at(&s, 1.0f, 1000) == 1.0);
  s.decay = EXEC_LR_LINEAR;
  assert_true(exec_lr_at(&s, 1.0f, 7) == 0.8125 && exec_lr_at(&s, 1.0f, 10) == 0.625);
  assert_true(exec_lr_at(&s, 1.0f, 16) == 0.25 && exec_lr_at(&s, 1.0f, 17) == 0.25);
  assert_true(exec_lr_at(&s, 2.0f, 10) == 1.125); /* scales with the peak, not the floor */
  s.decay = EXEC_LR_COSINE;
  assert_true(fabs(exec_lr_at(&s, 1.0f, 8) - 0.8125) < tol); /* cos(pi / 3) = 1/2 */
  assert_true(fabs(exec_lr_at(&s, 1.0f, 10) - 0.625) < tol);
  assert_true(fabs(exec_lr_at(&s, 1.0f, 16) - 0.25) < tol && exec_lr_at(&s, 1.0f, 30) == 0.25);
  /* WSD: stable to step 12, then 4 steps of annealing in each shape */
  s.decay = EXEC_LR_WSD;
  s.wsd_decay_iters = 4;
  const double at14[] = {[EXEC_WSD_EXPONENTIAL] = 2 * sqrt(0.5) - 1, [EXEC_WSD_LINEAR] = 0.5,
                         [EXEC_WSD_COSINE] = 0.5, [EXEC_WSD_MINUS_SQRT] = 1 - sqrt(0.5)};
  for (int w = 0; w < 4; w++) {
    s.wsd_style = (enum exec_lr_wsd_style)w;
    assert_true(exec_lr_at(&s, 1.0f, 5) == 1.0 && exec_lr_at(&s, 1.0f, 12) == 1.0);
    assert_true(fabs(exec_lr_at(&s, 1.0f, 14) - (0.25 + 0.75 * at14[w])) < tol);
    assert_true(fabs(exec_lr_at(&s, 1.0f, 16) - 0.25) < tol);
  }
  s.wsd_style = EXEC_WSD_LINEAR;
  assert_true(exec_lr_at(&s, 1.0f, 13) == 0.8125);
  /* resolved: the fraction of the decay steps, rounded up; the run's end as the decay's */
  struct exec_lr_schedule r = s;
  r.wsd_decay_iters = 0;
  r.wsd_decay_fraction = 0.2f; /* 3.2 steps of 16 -> 4 */
  assert_true(exec_lr_schedule_resolve(&r, 100, &err));
  assert_int_equal(r.wsd_decay_iters, 4);
  r.decay_iters = 0;
  assert_true(exec_lr_schedule_resolve(&r, 100, &err));
  assert_int_equal(r.decay_iters, 100);
  char *text = exec_lr_schedule_text(&s);
  assert_string_equal(text, "warmup 4, wsd (linear over the last 4 steps) to 0.25 by step 16");
  g_free(text);
  /* refused: a decay that ends in the warm-up, an annealing longer than the decay */
  r = s;
  r.decay_iters = 4;
  assert_false(exec_lr_schedule_resolve(&r, 100, &err));
  assert_non_null(strstr(err->message, "--lr-decay-iters 4"));
  g_clear_error(&err);
  r = s;
  r.wsd_decay_iters = 13;
  assert_false(exec_lr_schedule_resolve(&r, 100, &err));
  assert_non_null(strstr(err->message, "--lr-wsd-decay-iters 13"));
  g_clear_error(&err);
  enum exec_lr_decay d;
  assert_true(exec_lr_decay_parse("--lr-decay-style", "cosine", &d, &err) && d == EXEC_LR_COSINE);
  assert_false(exec_lr_decay_parse("--lr-decay-style", "cosin", &d, &err));
  assert_non_null(strstr(err->message, "--lr-decay-style"));
  g_clear_error(&err);
}

static int setup(void **state) {
  (void)state;
  GError *err = NULL;
  backend = exec_backend_init(&exec_backend_host, NULL, &err);
  if (!backend) {
    fprintf(stderr, "host backend: %s\n", err->message);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  exec_backend_free(backend);
  return 0;
}

int main(void) {
  /* the tests run kernels on several streams: keep BLAS from adding threads on 2 cores */
  g_setenv("OPENBLAS_NUM_THREADS", "1", FALSE);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_edges),
      cmocka_unit_test(test_model_refuses_mla),
      cmocka_unit_test(test_device_pp2_dp2_ep2),
      cmocka_unit_test(test_data_token_file),
      cmocka_unit_test(test_data_bytes_and_synthetic),
      cmocka_unit_test(test_init_params),
      cmocka_unit_test(test_host_streams_events),
      cmocka_unit_test(test_host_loop_suspends_and_cancels),
      cmocka_unit_test(test_backend_table_checks_and_defaults),
      cmocka_unit_test(test_backend_p2p_group),
      cmocka_unit_test(test_backend_busy_clock),
      cmocka_unit_test(test_stall_clock),
      cmocka_unit_test(test_train_loss_falls),
      cmocka_unit_test(test_bi_bw_split_equals_fused),
      cmocka_unit_test(test_checkpoint_resume),
      cmocka_unit_test(test_checkpoint_compare),
      cmocka_unit_test(test_checkpoint_parse_refuses),
      cmocka_unit_test(test_checkpoint_final_keep_and_cleanup),
      cmocka_unit_test(test_watchdog),
      cmocka_unit_test(test_refuses_plan_larger_than_job),
      cmocka_unit_test(test_ops_cover_host_and_refuse_unsupported),
      cmocka_unit_test(test_stragglers_named_against_their_peers),
      cmocka_unit_test(test_hf_names_per_family),
      cmocka_unit_test(test_lr_schedule_curves),
  };
  return cmocka_run_group_tests_name("exec", tests, setup, teardown);
}
