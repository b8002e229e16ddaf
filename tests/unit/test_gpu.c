/* test_gpu: the host-side pieces of the cuda backend, which run without a GPU: the offline
 * arena planner and the run-time carver (exec/arena.h), the device, communicator and SM-share
 * decisions (exec/gpu_layout.h), device times and the backend's memory peak in the run's
 * report, and the registry (the cuda backend is listed exactly when built). */
#include "test-helpers.h"

#include "../../base/json.h"
#include "../../exec/arena.h"
#include "../../exec/backend.h"
#include "../../report/report.h"
#include "../../exec/gpu_layout.h"
#include "../../exec/gpu_weights.h"
#include "../../sim/profile.h"
#include "../../sim/sim.h"

/* ---- arena --------------------------------------------------------------------------------- */

/* Every pair of tensors live at the same time occupies disjoint bytes; every block ends within
 * the arena. Replays the events, checking each allocation against the live set. */
static void assert_no_overlap(const struct plan_tensor *tensors, uint32_t n_tensors,
                              const struct exec_arena_event *ev, uint32_t n_ev,
                              const struct exec_arena *a) {
  bool *live = g_new0(bool, n_tensors);
  for (uint32_t k = 0; k < n_ev; k++) {
    uint32_t t = ev[k].tensor;
    if (!ev[k].alloc) {
      live[t] = false;
      continue;
    }
    uint64_t lo = a->offset[t], hi = lo + tensors[t].bytes;
    assert_true(a->offset[t] != UINT64_MAX);
    assert_true(hi <= a->size);
    for (uint32_t u = 0; u < n_tensors; u++) {
      if (!live[u])
        continue;
      uint64_t ulo = a->offset[u], uhi = ulo + tensors[u].bytes;
      if (lo < uhi && ulo < hi)
        fail_msg("tensors %u [%llu, %llu) and %u [%llu, %llu) overlap while both live", t,
                 (unsigned long long)lo, (unsigned long long)hi, u, (unsigned long long)ulo,
                 (unsigned long long)uhi);
    }
    live[t] = true;
  }
  g_free(live);
}

static void plan_by_hand(const struct plan_tensor *t, uint32_t n_t,
                         const struct exec_arena_event *ev, uint32_t n_ev, uint64_t align,
                         struct exec_arena *a) {
  GError *err = NULL;
  assert_true(exec_arena_plan_events(n_t, t, ev, n_ev, align, a, &err));
  assert_null(err);
  assert_no_overlap(t, n_t, ev, n_ev, a);
}

/* Frees in the reverse order of allocation (a stack): first fit packs exactly, the arena is the
 * live peak. */
static void test_arena_stack_order_is_exact(void **state) {
  (void)state;
  struct plan_tensor t[3] = {{.bytes = 100}, {.bytes = 300}, {.bytes = 50}};
  struct exec_arena_event ev[] = {{0, 0, true}, {1, 1, true},  {1, 2, false},
                                  {2, 3, true}, {2, 4, false}, {0, 5, false}};
  struct exec_arena a;
  plan_by_hand(t, 3, ev, G_N_ELEMENTS(ev), 1, &a);
  assert_int_equal(a.live_peak, 400);
  assert_int_equal(a.size, 400);
  assert_int_equal(a.offset[0], 0);
  assert_int_equal(a.offset[1], 100);
  assert_int_equal(a.offset[2], 100); /* reuses tensor 1's block */
  exec_arena_clear(&a);
}

/* The fragmentation bound: a freed hole too small for the next tensor is skipped, so the arena
 * exceeds the live peak (here 350 against 250); a later tensor that fits takes the hole. */
static void test_arena_fragmentation(void **state) {
  (void)state;
  struct plan_tensor t[4] = {{.bytes = 100}, {.bytes = 100}, {.bytes = 150}, {.bytes = 60}};
  struct exec_arena_event ev[] = {
      {0, 0, true}, {1, 1, true}, {0, 2, false}, {2, 3, true}, {3, 4, true}};
  struct exec_arena a;
  plan_by_hand(t, 4, ev, G_N_ELEMENTS(ev), 1, &a);
  assert_int_equal(a.live_peak, 310);
  assert_int_equal(a.offset[2], 200);
  assert_int_equal(a.offset[3], 0); /* first fit: the hole at 0 */
  assert_int_equal(a.size, 350);
  exec_arena_clear(&a);
}

/* Blocks start on the alignment and sizes round up to it. */
static void test_arena_alignment(void **state) {
  (void)state;
  struct plan_tensor t[2] = {{.bytes = 10}, {.bytes = 10}};
  struct exec_arena_event ev[] = {{0, 0, true}, {1, 1, true}};
  struct exec_arena a;
  plan_by_hand(t, 2, ev, 2, 256, &a);
  assert_int_equal(a.offset[1], 256);
  assert_int_equal(a.size, 512);
  assert_int_equal(a.live_peak, 512);
  exec_arena_clear(&a);
}

static void test_arena_refuses_bad_events(void **state) {
  (void)state;
  struct plan_tensor t[1] = {{.bytes = 10}};
  struct exec_arena_event twice[] = {{0, 0, true}, {0, 1, true}};
  struct exec_arena_event unborn[] = {{0, 0, false}};
  struct exec_arena a;
  GError *err = NULL;
  assert_false(exec_arena_plan_events(1, t, twice, 2, 1, &a, &err));
  test_assert_input_error(err, "which is live");
  g_clear_error(&err);
  assert_false(exec_arena_plan_events(1, t, unborn, 1, 1, &a, &err));
  test_assert_input_error(err, "not live");
  g_clear_error(&err);
}

static struct plan *compile_layout(const char *model, const char *layout, const char *schedule,
                                   uint32_t mbs) {
  struct compile_options o = compile_options_default();
  o.model_path = model;
  o.layout = layout;
  if (schedule) {
    o.have_schedule = true;
    assert_true(sched_family_parse(schedule, &o.schedule.family));
    o.schedule.mbs = mbs;
  }
  GError *err = NULL;
  struct plan *p = compile_take_plan(&o, &err);
  if (!p)
    fail_msg("compile %s %s: %s", model, layout, err->message);
  return p;
}

/* Every class of a real plan: events pair up (each tensor allocated once, freed at most
 * once, never before it is allocated), no two live tensors overlap, the arena holds the peak. */
static void check_plan_arenas(const struct plan *p) {
  for (uint32_t k = 0; k < p->n_classes; k++) {
    const struct plan_class *c = &p->classes[k];
    GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
    exec_arena_class_events(c, ev);
    assert_true(ev->len > 0);
    struct exec_arena a;
    plan_by_hand(c->tensors, c->n_tensors, (const struct exec_arena_event *)(void *)ev->data,
                 ev->len, 256, &a);
    assert_true(a.size >= a.live_peak);
    uint64_t all = 0;
    for (uint32_t t = 0; t < c->n_tensors; t++)
      all += (c->tensors[t].bytes + 255) & ~(uint64_t)255;
    assert_true(a.size <= all);
    exec_arena_clear(&a);
    g_array_free(ev, TRUE);
  }
}

static void test_arena_real_plans(void **state) {
  (void)state;
  struct plan *one = compile_layout("models/tiny-moe.json", "pp=1", NULL, 0);
  check_plan_arenas(one);
  plan_free(one);
  struct plan *four = compile_layout("models/tiny-moe.json", "pp=2,dp=2,ep=2,v", "dualpipev", 4);
  check_plan_arenas(four);
  plan_free(four);
}

/* On one device with one stream the simulator's timed order is the issue order: its transient
 * peak (peak less static memory) is the planner's sum-of-live maximum, byte for byte. */
static void test_arena_peak_matches_simulator(void **state) {
  (void)state;
  struct plan *p = compile_layout("models/tiny-dense.json", "pp=1", "1f1b", 4);
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", &err);
  assert_non_null(prof);
  struct sim_options so = {0};
  struct sim_result *r = sim_run(p, prof, &so, &err);
  assert_non_null(r);
  const struct sim_unit *u = &r->units[r->device_unit[0]];
  uint64_t stat = 0;
  for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
    stat += u->static_bytes[k];
  struct exec_arena a;
  assert_true(exec_arena_plan(plan_device_class(p, 0), 1, &a, &err));
  assert_int_equal(a.live_peak, u->peak_bytes - stat);
  assert_true(a.size >= a.live_peak);
  exec_arena_clear(&a);
  sim_result_free(r);
  profile_free(prof);
  plan_free(p);
}

/* Replays a class's events through the carver as a backend meets them (each tensor one block
 * of its planned bytes): every block lands at its planned offset, no two live blocks share a
 * byte, and none ends past the arena. */
static void carve_class(const struct plan_class *c, const struct exec_arena *a) {
  struct exec_arena_carver cv;
  exec_arena_carver_init(&cv, a, c->tensors, 256);
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
  exec_arena_class_events(c, ev);
  uint64_t *at = g_new(uint64_t, c->n_tensors);
  bool *live = g_new0(bool, c->n_tensors);
  for (guint k = 0; k < ev->len; k++) {
    const struct exec_arena_event *e = &g_array_index(ev, struct exec_arena_event, k);
    if (!e->alloc) {
      exec_arena_carve_release(&cv, e->tensor, false);
      live[e->tensor] = false;
      continue;
    }
    uint64_t bytes = c->tensors[e->tensor].bytes;
    assert_true(exec_arena_carve(&cv, e->tensor, bytes, 256, false, &at[e->tensor]));
    assert_int_equal(at[e->tensor], a->offset[e->tensor]);
    assert_true(at[e->tensor] + bytes <= a->size);
    for (uint32_t u = 0; u < c->n_tensors; u++)
      if (live[u] && at[u] < at[e->tensor] + bytes && at[e->tensor] < at[u] + c->tensors[u].bytes)
        fail_msg("tensors %u and %u live at once share bytes", u, e->tensor);
    live[e->tensor] = true;
  }
  assert_int_equal(cv.fallback_blocks, 0);
  g_free(live);
  g_free(at);
  g_array_free(ev, TRUE);
  exec_arena_carver_clear(&cv);
}

/* For every device of a plan: the arena the cuda backend allocates is the planner's size, which
 * within 1% of the live peak of the plan's memory rule in issue order (greedy by size packs
 * most plans without a hole, first fit does not); carving at its offsets keeps live tensors
 * apart; and the live peak against the simulator's transient peak (its peak less static
 * memory): equal on one device,
 * where its timed order is the issue order; with several devices the simulator's order holds
 * at least as much at once (received buffers posted ahead), so the arena never exceeds it. */
static void check_arena_against_simulator(const char *model, const char *layout,
                                          const char *schedule, uint32_t mbs) {
  struct plan *p = compile_layout(model, layout, schedule, mbs);
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/h100-sxm.json", &err);
  assert_non_null(prof);
  struct sim_options so = {0};
  struct sim_result *r = sim_run(p, prof, &so, &err);
  assert_non_null(r);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct sim_unit *u = &r->units[r->device_unit[d]];
    uint64_t stat = 0;
    for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
      stat += u->static_bytes[k];
    struct exec_arena a;
    const struct plan_class *c = plan_device_class(p, d);
    assert_true(exec_arena_plan(c, 256, &a, &err));
    /* the live peak is a lower bound no placement beats; the planner packs the dense plans
     * here to it exactly and leaves holes of at most 2% on the expert-parallel ones, whose
     * capacity-sized buffers (ir/expert.c) interleave unevenly (0.85% DualPipeV, 1.87%
     * ZeRO-2, measured) */
    if (a.size < a.live_peak || (double)(a.size - a.live_peak) > 0.02 * (double)a.live_peak)
      fail_msg("%s %s device %u: arena %llu bytes, live peak %llu", model, layout, d,
               (unsigned long long)a.size, (unsigned long long)a.live_peak);
    assert_true(a.first_fit_size >= a.size);
    if (p->n_devices == 1)
      assert_int_equal(a.live_peak, u->peak_bytes - stat);
    else
      assert_true(a.live_peak <= u->peak_bytes - stat);
    carve_class(c, &a);
    exec_arena_clear(&a);
  }
  sim_result_free(r);
  profile_free(prof);
  plan_free(p);
}

static void test_arena_size_is_the_peak(void **state) {
  (void)state;
  check_arena_against_simulator("models/tiny-dense.json", "pp=1", "1f1b", 4);
  check_arena_against_simulator("models/tiny-moe.json", "pp=1", NULL, 0);
  check_arena_against_simulator("models/tiny-moe.json", "pp=2", "1f1b", 8);
  check_arena_against_simulator("models/tiny-moe.json", "pp=4", "zerobubble", 8);
  check_arena_against_simulator("models/tiny-moe.json", "pp=2,dp=2,ep=2,v", "dualpipev", 4);
  check_arena_against_simulator("models/tiny-dense.json", "pp=2,dp=2,zero=1", "1f1b", 4);
  check_arena_against_simulator("models/tiny-dense.json", "pp=2,dp=2,zero=3", "1f1b", 4);
  check_arena_against_simulator("models/tiny-moe.json", "pp=2,dp=2,ep=2,zero=2", "1f1b", 4);
}

/* Replays events (the order a backend meets them in) through a carver over arena a, each
 * tensor one block of its bytes: how many blocks were refused (the backend's first fit
 * above the planned region takes them). */
static uint32_t carve_refused(const struct plan_class *c, const struct exec_arena *a,
                              const GArray *ev) {
  struct exec_arena_carver cv;
  exec_arena_carver_init(&cv, a, c->tensors, 256);
  bool *carved = g_new0(bool, c->n_tensors);
  for (guint k = 0; k < ev->len; k++) {
    const struct exec_arena_event *e = &g_array_index(ev, struct exec_arena_event, k);
    uint64_t at = 0;
    if (e->alloc)
      carved[e->tensor] =
          exec_arena_carve(&cv, e->tensor, c->tensors[e->tensor].bytes, 256, false, &at);
    else if (carved[e->tensor])
      exec_arena_carve_release(&cv, e->tensor, false);
  }
  uint32_t refused = cv.fallback_blocks;
  g_free(carved);
  exec_arena_carver_clear(&cv);
  return refused;
}

/* A pipeline's receives are posted as soon as their stream is free (exec/memory.c,
 * recv_issue), before their turn in issue order. Planned over the executor's order
 * (exec_arena_device_events: the same events, receives moved up), every block carves at its
 * planned offset; planned at their turn, the early receives meet slots still held and blocks
 * go above the planned region (the emulated GPU measured tiny-moe zero-bubble 2 to 4% over
 * the simulator's peak). Either way the live peak stays within the simulator's, which holds
 * the same receives early. */
static void check_device_events(const char *model, const char *layout, const char *schedule,
                                uint32_t mbs) {
  struct plan *p = compile_layout(model, layout, schedule, mbs);
  GError *err = NULL;
  struct profile *prof = profile_load_file("profiles/host-cpu.json", &err);
  assert_non_null(prof);
  struct sim_options so = {0};
  struct sim_result *r = sim_run(p, prof, &so, &err);
  assert_non_null(r);
  uint32_t refused_at_turn = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    GArray *turn = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
    GArray *dev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
    exec_arena_class_events(c, turn);
    exec_arena_device_events(p, c, dev);
    assert_int_equal(dev->len, turn->len);
    struct exec_arena a, b;
    assert_true(exec_arena_plan_best(c->n_tensors, c->tensors,
                                     (const struct exec_arena_event *)(void *)dev->data, dev->len,
                                     256, &a, &err));
    assert_int_equal(carve_refused(c, &a, dev), 0);
    const struct sim_unit *u = &r->units[r->device_unit[d]];
    uint64_t stat = 0;
    for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++)
      stat += u->static_bytes[k];
    assert_true(a.live_peak <= u->peak_bytes - stat);
    assert_true(exec_arena_plan_best(c->n_tensors, c->tensors,
                                     (const struct exec_arena_event *)(void *)turn->data, turn->len,
                                     256, &b, &err));
    refused_at_turn += carve_refused(c, &b, dev);
    exec_arena_clear(&a);
    exec_arena_clear(&b);
    g_array_free(turn, TRUE);
    g_array_free(dev, TRUE);
  }
  assert_true(refused_at_turn > 0);
  sim_result_free(r);
  profile_free(prof);
  plan_free(p);
}

static void test_arena_receives_posted_early(void **state) {
  (void)state;
  check_device_events("models/tiny-moe.json", "pp=2", "zerobubble", 4);
  check_device_events("models/tiny-dense.json", "pp=2", "1f1b", 4);
  check_device_events("models/tiny-moe.json", "pp=2,v", "dualpipev", 4);
}

/* The run's order may leave the plan's: a block that does not fit its slot, or a slot whose
 * bytes a live tensor still holds, is refused (the backend's fallback takes it); blocks of one
 * tensor follow one another in its slot, which is free again with the last one. */
static void test_arena_carve_refusals(void **state) {
  (void)state;
  struct plan_tensor t[3] = {{.bytes = 512}, {.bytes = 256}, {.bytes = 512}};
  /* 0 lives alone, then 1 and 2 together in its place */
  struct exec_arena_event ev[] = {{0, 0, true}, {0, 1, false}, {1, 2, true}, {2, 3, true}};
  struct exec_arena a;
  plan_by_hand(t, 3, ev, 4, 256, &a);
  assert_int_equal(a.size, 768);
  struct exec_arena_carver cv;
  exec_arena_carver_init(&cv, &a, t, 256);
  uint64_t at = 0;
  assert_true(exec_arena_carve(&cv, 0, 200, 256, false, &at));
  assert_int_equal(at, a.offset[0]);
  assert_true(exec_arena_carve(&cv, 0, 256, 256, false, &at)); /* the second block follows */
  assert_int_equal(at, a.offset[0] + 256);
  assert_false(exec_arena_carve(&cv, 0, 1, 256, false, &at)); /* the slot is full */
  /* 1 and 2 share bytes with 0, still live: refused */
  assert_true(a.offset[1] < 512 || a.offset[2] < 512);
  uint32_t early = a.offset[1] < 512 ? 1 : 2;
  assert_false(exec_arena_carve(&cv, early, 16, 256, false, &at));
  exec_arena_carve_release(&cv, 0, false);
  assert_false(exec_arena_carve(&cv, early, 16, 256, false, &at)); /* one block of 0 is left */
  exec_arena_carve_release(&cv, 0, false);
  assert_true(exec_arena_carve(&cv, early, 16, 256, false, &at));
  assert_int_equal(at, a.offset[early]);
  assert_false(exec_arena_carve(&cv, 3 - early, 4096, 256, false, &at)); /* larger than its slot */
  assert_int_equal(cv.fallback_blocks, 4);
  assert_int_equal(cv.carved_blocks, 3);
  /* a workspace's two sides (exec/memory.c): the top one down from the slot's end, each
   * side starting over with its own last block while the other's stay */
  exec_arena_carve_release(&cv, early, false);
  assert_true(exec_arena_carve(&cv, 0, 256, 256, true, &at));
  assert_int_equal(at, a.offset[0] + 256);
  assert_true(exec_arena_carve(&cv, 0, 100, 256, false, &at));
  assert_int_equal(at, a.offset[0]);
  assert_false(exec_arena_carve(&cv, 0, 1, 256, false, &at)); /* the sides meet */
  exec_arena_carve_release(&cv, 0, false);
  assert_true(exec_arena_carve(&cv, 0, 256, 256, false, &at)); /* the start again */
  assert_int_equal(at, a.offset[0]);
  exec_arena_carve_release(&cv, 0, true);
  exec_arena_carve_release(&cv, 0, false);
  assert_true(exec_arena_carve(&cv, 0, 512, 256, true, &at)); /* all free: the whole slot */
  assert_int_equal(at, a.offset[0]);
  exec_arena_carve_release(&cv, 0, true);
  /* every tensor's overlap list names the others sharing its bytes, both ways */
  for (uint32_t x = 0; x < 3; x++)
    for (uint32_t k = cv.overlap_first[x]; k < cv.overlap_first[x + 1]; k++) {
      uint32_t y = cv.overlap[k];
      assert_true(a.offset[x] < a.offset[y] + 256 * ((t[y].bytes + 255) / 256) &&
                  a.offset[y] < a.offset[x] + 256 * ((t[x].bytes + 255) / 256));
    }
  assert_int_equal(cv.overlap_first[3], 4); /* 0 meets 1 and 2, and back */
  exec_arena_carver_clear(&cv);
  exec_arena_clear(&a);
}

/* ---- device choice, communicators, SM shares ---------------------------------------------- */

static void test_gpu_pick(void **state) {
  (void)state;
  assert_int_equal(exec_gpu_pick(0, 8, 8), 0);
  assert_int_equal(exec_gpu_pick(5, 8, 8), 5);
  assert_int_equal(exec_gpu_pick(5, 8, 4), 1); /* 8 ranks on 4 GPUs: two per GPU */
  assert_int_equal(exec_gpu_pick(3, 4, 1), 0); /* CUDA_VISIBLE_DEVICES narrowed to one */
  assert_int_equal(exec_gpu_pick(0, 1, 0), -1);
}

static void test_gpu_shared(void **state) {
  (void)state;
  uint8_t distinct[3][16] = {{1}, {2}, {3}};
  uint8_t two_on_one[3][16] = {{1}, {2}, {1}};
  for (uint32_t me = 0; me < 3; me++)
    assert_false(exec_gpu_shared(&distinct[0][0], 3, me));
  assert_true(exec_gpu_shared(&two_on_one[0][0], 3, 0));
  assert_false(exec_gpu_shared(&two_on_one[0][0], 3, 1));
  assert_true(exec_gpu_shared(&two_on_one[0][0], 3, 2));
  uint8_t alone[1][16] = {{9}};
  assert_false(exec_gpu_shared(&alone[0][0], 1, 0));
}

static void test_gpu_comm_rank(void **state) {
  (void)state;
  uint32_t members[3] = {4, 6, 7};
  struct exec_gpu_comm_rank r = exec_gpu_comm_rank(members, 3, 6);
  assert_true(r.member);
  assert_int_equal(r.rank, 1);
  assert_int_equal(r.size, 3);
  assert_int_equal(r.id_root, 4);
  r = exec_gpu_comm_rank(members, 3, 5);
  assert_false(r.member);
  assert_int_equal(r.id_root, 4); /* non-members still join the id's broadcast */
}

/* The communicators of a PP2 x DP2 x EP2 plan as the runner labels them: every label names a
 * stream of the plan, and every DP and EP group of the plan has members whose NCCL ranks are
 * their positions, the first member making the id. */
static void test_gpu_comm_layout(void **state) {
  (void)state;
  struct plan *p = compile_layout("models/tiny-moe.json", "pp=2,dp=2,ep=2,v", "dualpipev", 4);
  uint32_t seen[IR_COMM_EP + 1] = {0};
  for (uint32_t k = 0; k < p->n_comms; k++) {
    seen[p->comms[k].purpose]++;
    for (uint32_t d = 0; d < p->n_devices; d++) {
      int rank = plan_comm_rank(p, k, d);
      if (rank < 0)
        continue;
      uint32_t n = plan_comm_size(p, k);
      uint32_t *members = g_new(uint32_t, n);
      plan_comm_members(p, k, d, members);
      struct exec_gpu_comm_rank r = exec_gpu_comm_rank(members, n, d);
      assert_true(r.member);
      assert_int_equal(r.rank, (uint32_t)rank);
      assert_int_equal(r.id_root, members[0]);
      g_free(members);
    }
  }
  assert_true(seen[IR_COMM_PP] >= 2); /* one per direction */
  assert_true(seen[IR_COMM_DP] >= 1);
  assert_true(seen[IR_COMM_EP] >= 1);
  char label[128];
  g_snprintf(label, sizeof label, "pp g0->g1 (%s)", p->streams[p->n_streams - 1].name);
  assert_int_equal(exec_gpu_label_stream(p, label), (int)p->n_streams - 1);
  assert_int_equal(exec_gpu_label_stream(p, "dp g0 (no-such-stream)"), -1);
  assert_int_equal(exec_gpu_label_stream(p, "dp g0"), -1);
  plan_free(p);
}

/* Ranks sharing a GPU run each rank's instructions in issue order on one thread: the plans of
 * every schedule family progress so (as tools/gpu-check.sh runs dualpipev on one GPU), and a
 * receive no send matches is named. */
static void test_gpu_serial_progress(void **state) {
  (void)state;
  static const struct {
    const char *layout, *schedule;
    uint32_t mbs;
  } cases[] = {
      {"pp=4", "1f1b", 8},     {"pp=4", "zerobubble", 8},     {"pp=4", "gpipe", 4},
      {"pp=4", "dualpipe", 8}, {"pp=2,dp=2,ep=2", "1f1b", 4}, {"pp=2,dp=2,ep=2,v", "dualpipev", 4},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(cases); k++) {
    struct plan *p =
        compile_layout("models/tiny-moe.json", cases[k].layout, cases[k].schedule, cases[k].mbs);
    uint32_t d = 0, i = 0;
    if (!exec_gpu_serial_progress(p, &d, &i))
      fail_msg("%s %s: device %u stuck at %u", cases[k].layout, cases[k].schedule, d, i);
    plan_free(p);
  }
  struct plan *p = compile_layout("models/tiny-moe.json", "pp=2", "1f1b", 4);
  struct plan_class *c = &p->classes[p->device_class[1]];
  uint32_t first_recv = IR_NONE;
  for (uint32_t i = 0; i < c->n_instrs && first_recv == IR_NONE; i++)
    if (p->nodes[c->instrs[i].node].kind == IR_NODE_RECV)
      first_recv = i;
  assert_int_not_equal(first_recv, IR_NONE);
  c->instrs[first_recv].seq += 1000; /* matches no send */
  uint32_t d = 0, i = 0;
  assert_false(exec_gpu_serial_progress(p, &d, &i));
  /* device 1 waits at that receive; device 0 then waits on device 1: the first named is a
   * receive of either */
  assert_true(d <= 1);
  assert_int_equal(p->nodes[plan_device_class(p, d)->instrs[i].node].kind, IR_NODE_RECV);
  assert_true(d == 0 || i == first_recv);
  plan_free(p);
}

static void test_gpu_sm_share(void **state) {
  (void)state;
  assert_int_equal(exec_gpu_cta_limit(1.0, 132), 0);
  assert_int_equal(exec_gpu_cta_limit(0.25, 132), 33);
  assert_int_equal(exec_gpu_cta_limit(0.001, 132), 1);
  assert_int_equal(exec_gpu_green_sms(1.0, 132, 8), 0);
  assert_int_equal(exec_gpu_green_sms(0.5, 132, 8), 64);
  assert_int_equal(exec_gpu_green_sms(0.01, 132, 8), 8);
}

/* The LM head's chunk rule: llama3's vocabulary in 2092-row chunks (1 GiB of fp32 logits, a
 * seq of 4096 in 2 chunks, not the 32 of the old 64 MiB rule); a vocabulary too large for
 * 1024 rows in the budget still gets 1024 (the GEMMs' and dparams' efficiency floor); small
 * models one chunk of all T rows; never 0 rows, whatever T and V; a forced count as asked. */
/* Auto runs the unfused core (faster, measured) while its 2 S^2 fp32 scratch fits in 1 GiB:
 * S 11585 still does (1,073,676,800 bytes), 11586 not; fp32 models or unsupported head sizes
 * (not fusable) never fuse, whatever is forced. */
static void test_gpu_attention_choice(void **state) {
  (void)state;
  /* the fused LM head's vocabulary tiles: 32 MiB of fp32 logits, multiples of 64 columns */
  assert_int_equal(exec_gpu_head_tile_cols(4096, 128256, 0), 2048);
  assert_int_equal(exec_gpu_head_tile_cols(3000, 128256, 0), 2752); /* 2796 down to 64s */
  assert_int_equal(exec_gpu_head_tile_cols(1 << 16, 128256, 0), EXEC_GPU_HEAD_MIN_COLS);
  assert_int_equal(exec_gpu_head_tile_cols(32, 101, 0), 101); /* one tile: all of V */
  assert_int_equal(exec_gpu_head_tile_cols(32, 101, 16), 16);
  assert_int_equal(exec_gpu_head_tile_cols(32, 101, 500), 101);
  assert_int_equal(exec_gpu_attention_mode(NULL), EXEC_GPU_ATTENTION_AUTO);
  assert_int_equal(exec_gpu_attention_mode("fused"), EXEC_GPU_ATTENTION_FUSED);
  assert_int_equal(exec_gpu_attention_mode("unfused"), EXEC_GPU_ATTENTION_UNFUSED);
  assert_int_equal(exec_gpu_attention_mode("Fused"), EXEC_GPU_ATTENTION_AUTO);
  assert_true(exec_gpu_attention_fused(EXEC_GPU_ATTENTION_AUTO, true));
  assert_true(exec_gpu_attention_fused(EXEC_GPU_ATTENTION_FUSED, true));
  assert_false(exec_gpu_attention_fused(EXEC_GPU_ATTENTION_UNFUSED, true));
  assert_false(exec_gpu_attention_fused(EXEC_GPU_ATTENTION_FUSED, false));
  assert_false(exec_gpu_attention_fused(EXEC_GPU_ATTENTION_AUTO, false));
  /* cuDNN's core: auto and forced take it where usable, the own kernels' modes never */
  assert_int_equal(exec_gpu_attention_mode("cudnn"), EXEC_GPU_ATTENTION_CUDNN);
  assert_true(exec_gpu_attention_cudnn(EXEC_GPU_ATTENTION_AUTO, true));
  assert_true(exec_gpu_attention_cudnn(EXEC_GPU_ATTENTION_CUDNN, true));
  assert_false(exec_gpu_attention_cudnn(EXEC_GPU_ATTENTION_CUDNN, false));
  assert_false(exec_gpu_attention_cudnn(EXEC_GPU_ATTENTION_FUSED, true));
  assert_false(exec_gpu_attention_cudnn(EXEC_GPU_ATTENTION_UNFUSED, true));
  /* a forced cuDNN core that cannot run a shape leaves it to the own fused kernel */
  assert_true(exec_gpu_attention_fused(EXEC_GPU_ATTENTION_CUDNN, true));
}

static void test_gpu_head_chunk_rows(void **state) {
  (void)state;
  assert_int_equal(exec_gpu_head_chunk_rows(4096, 128256, 0), 2092);
  assert_true((size_t)2092 * 128256 * sizeof(float) <= EXEC_GPU_HEAD_CHUNK_BYTES);
  assert_true((size_t)2093 * 128256 * sizeof(float) > EXEC_GPU_HEAD_CHUNK_BYTES);
  int rows = exec_gpu_head_chunk_rows(4096, 128256, 0);
  assert_int_equal((4096 + rows - 1) / rows, 2);
  assert_int_equal(exec_gpu_head_chunk_rows(1 << 20, 1 << 20, 0), EXEC_GPU_HEAD_MIN_ROWS);
  assert_int_equal(exec_gpu_head_chunk_rows(1 << 20, 32000, 0), 8388);
  assert_int_equal(exec_gpu_head_chunk_rows(32, 101, 0), 32);
  assert_int_equal(exec_gpu_head_chunk_rows(1000, 128256, 0), 1000);
  assert_int_equal(exec_gpu_head_chunk_rows(1, 1, 0), 1);
  assert_int_equal(exec_gpu_head_chunk_rows(0, 128256, 0), 1);
  assert_int_equal(exec_gpu_head_chunk_rows(5000, 0, 0), 5000);
  /* forced (PIPER_CUDA_HEAD_ROWS): as asked, even under the floor, at most T */
  assert_int_equal(exec_gpu_head_chunk_rows(32, 101, 7), 7);
  assert_int_equal(exec_gpu_head_chunk_rows(4096, 128256, 100), 100);
  assert_int_equal(exec_gpu_head_chunk_rows(32, 101, 64), 32);
}

/* ---- device times into trace.json ------------------------------------------------------ */

/* A backend that says when each task's work ran (as the cuda backend does from its events):
 * the host backend, with instruction i running [10 i, 10 i + 1 + i % 3] ms. */
static bool fake_task_times(struct exec_backend *b, uint32_t id, double *start, double *end) {
  (void)b;
  *start = 0.010 * id;
  *end = *start + 0.001 * (1 + id % 3);
  return true;
}

/* The runner writes the backend's times, not the ones it measured around the tasks: every
 * traced instruction lasts what the backend said, at the spacing it said. */
static void test_gpu_trace_from_device_times(void **state) {
  (void)state;
  struct plan *p = compile_layout("models/tiny-dense.json", "pp=1", NULL, 0);
  struct exec_backend_ops ops = exec_backend_host;
  ops.task_times = fake_task_times;
  GError *err = NULL;
  struct exec_backend *b = exec_backend_init(&ops, NULL, &err);
  assert_non_null(b);
  assert_true(exec_backend_enqueues(b));
  char *dir = test_tmp_dir("test_gpu-XXXXXX");
  char *out = g_build_filename(dir, "run", NULL);
  struct exec_options o = exec_options_default();
  o.plan = p;
  o.warmup = 0;
  o.iters = 2;
  o.report = true; /* the run comes back; writing it is the program's (piper-exec's) */
  struct exec_result r = {0};
  if (!exec_run(&o, b, &r, &err))
    fail_msg("exec_run: %s", err->message);
  assert_non_null(exec_result_report(&r));
  if (!report_write_dir(exec_result_report(&r), out, &err))
    fail_msg("report_write_dir: %s", err->message);
  char *path = g_build_filename(out, "trace.json", NULL);
  char *text = test_read_file(path);
  cJSON *root = cJSON_Parse(text);
  assert_non_null(root);
  const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
  uint32_t n = 0;
  double first_ts = -1;
  cJSON_ArrayForEach(e, ev) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    const cJSON *step = args ? cJSON_GetObjectItemCaseSensitive(args, "step") : NULL;
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") != 0 || !step || step->valueint != 2)
      continue;
    double ts = cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble;
    double dur = cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble;
    if (first_ts < 0)
      first_ts = ts;
    /* instruction i starts 10 i ms after instruction 0 and lasts 1 + i % 3 ms */
    long i = lround((ts - first_ts) / 10000.0);
    test_assert_near(ts - first_ts, 10000.0 * i, 1e-3, 0, "start (us)");
    test_assert_near(dur, 1000.0 * (1 + i % 3), 1e-3, 0, "duration (us)");
    n++;
  }
  assert_int_equal(n, plan_device_class(p, 0)->n_instrs);
  cJSON_Delete(root);
  g_free(text);
  g_free(path);
  exec_result_clear(&r);
  exec_backend_free(b);
  test_remove_tree(dir);
  g_free(out);
  g_free(dir);
  plan_free(p);
}

/* A backend that places its buffers itself (the cuda arena) reports the memory they spanned:
 * metrics.json's peak is its figure, not the runner's sum of live buffers. */
static uint64_t fake_memory_peak(struct exec_backend *b) {
  (void)b;
  return 123456789;
}

static void test_gpu_backend_memory_peak(void **state) {
  (void)state;
  struct plan *p = compile_layout("models/tiny-dense.json", "pp=1", NULL, 0);
  struct exec_backend_ops ops = exec_backend_host;
  ops.task_times = fake_task_times; /* enqueues: plan tensors go through alloc_tensor */
  ops.memory_peak = fake_memory_peak;
  GError *err = NULL;
  struct exec_backend *b = exec_backend_init(&ops, NULL, &err);
  assert_non_null(b);
  char *dir = test_tmp_dir("test_gpu-XXXXXX");
  char *out = g_build_filename(dir, "run", NULL);
  struct exec_options o = exec_options_default();
  o.plan = p;
  o.warmup = 0;
  o.iters = 1;
  o.report = true; /* the run comes back; writing it is the program's (piper-exec's) */
  struct exec_result r = {0};
  if (!exec_run(&o, b, &r, &err))
    fail_msg("exec_run: %s", err->message);
  assert_non_null(exec_result_report(&r));
  if (!report_write_dir(exec_result_report(&r), out, &err))
    fail_msg("report_write_dir: %s", err->message);
  assert_int_equal(r.peak_memory_bytes, 123456789);
  char *path = g_build_filename(out, "metrics.json", NULL);
  char *text = test_read_file(path);
  cJSON *root = cJSON_Parse(text);
  assert_non_null(root);
  const cJSON *peak = cJSON_GetObjectItemCaseSensitive(root, "peak_memory_bytes_max");
  assert_true(cJSON_IsNumber(peak));
  assert_int_equal((uint64_t)peak->valuedouble, 123456789);
  cJSON_Delete(root);
  g_free(text);
  g_free(path);
  exec_result_clear(&r);
  exec_backend_free(b);
  test_remove_tree(dir);
  g_free(out);
  g_free(dir);
  plan_free(p);
}

/* The executor's own buffers against the planner's slots: a host backend that enqueues (so
 * plan tensors come through alloc_tensor, as on the cuda backend) carves every block the
 * executor asks for through an exec_arena_carver over the one-device plan's class, as
 * backend_cuda_arena.c does, and counts what fits. */
static struct exec_arena_carver fit_carver;
static GHashTable *fit_blocks; /* pointer -> tensor + 1, the side in the top bit */
static const struct plan_class *fit_class;
static uint32_t fit_work_blocks; /* carved into instruction workspace tensors */

static void *fit_alloc_tensor(struct exec_backend *b, uint32_t tensor, size_t bytes) {
  void *p = exec_backend_host.alloc(b, bytes);
  uint64_t at = 0;
  uint32_t top = tensor & EXEC_TENSOR_SLOT_TOP;
  tensor &= ~EXEC_TENSOR_SLOT_TOP;
  if (p && exec_arena_carve(&fit_carver, tensor, bytes, 256, top != 0, &at)) {
    g_hash_table_insert(fit_blocks, p, GUINT_TO_POINTER((tensor + 1) | top));
    fit_work_blocks += fit_class->tensors[tensor].kind == PLAN_TENSOR_WORK;
  }
  return p;
}

static void fit_release(struct exec_backend *b, void *p) {
  gpointer v = NULL;
  if (g_hash_table_steal_extended(fit_blocks, p, NULL, &v)) {
    uint32_t held = GPOINTER_TO_UINT(v);
    exec_arena_carve_release(&fit_carver, (held & ~EXEC_TENSOR_SLOT_TOP) - 1,
                             (held & EXEC_TENSOR_SLOT_TOP) != 0);
  }
  exec_backend_host.release(b, p);
}

/* held: the bytes per element the executor holds (4: fp32) against the plan's dtype, as
 * backend_cuda_arena.c plans the slots; 0: the plan's bytes as they are. */
static void check_executor_fits(const char *model, const char *layout, const char *schedule,
                                uint32_t mbs, uint64_t held, uint32_t *carved,
                                uint32_t *refused) {
  struct plan *p = compile_layout(model, layout, schedule, mbs);
  GError *err = NULL;
  const struct plan_class *c = plan_device_class(p, 0);
  struct plan_tensor *t =
      held ? exec_arena_tensors_held(c, model_dtype_bytes(p->model->dtype), held) : NULL;
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
  exec_arena_class_events(c, ev);
  struct exec_arena a;
  assert_true(exec_arena_plan_best(c->n_tensors, t ? t : c->tensors,
                                   (const struct exec_arena_event *)(void *)ev->data, ev->len,
                                   256, &a, &err));
  g_array_free(ev, TRUE);
  exec_arena_carver_init(&fit_carver, &a, t ? t : c->tensors, 256);
  fit_blocks = g_hash_table_new(g_direct_hash, g_direct_equal);
  fit_class = c;
  fit_work_blocks = 0;
  struct exec_backend_ops ops = exec_backend_host;
  ops.task_times = fake_task_times;
  ops.alloc_tensor = fit_alloc_tensor;
  ops.release = fit_release;
  struct exec_backend *b = exec_backend_init(&ops, NULL, &err);
  assert_non_null(b);
  struct exec_options o = exec_options_default();
  o.plan = p;
  o.warmup = 1;
  o.iters = 1;
  struct exec_result r = {0};
  if (!exec_run(&o, b, &r, &err))
    fail_msg("exec_run: %s", err->message);
  *carved = fit_carver.carved_blocks;
  *refused = fit_carver.fallback_blocks;
  exec_result_clear(&r);
  g_free(t);
  exec_backend_free(b);
  g_hash_table_destroy(fit_blocks);
  exec_arena_carver_clear(&fit_carver);
  exec_arena_clear(&a);
  plan_free(p);
}

/* Every block the executor allocates for a plan tensor, over a warm-up and a measured step,
 * lands at the planner's offset: dense and MoE (its expert rows at this plan's routing),
 * fp32 as planned, an instruction's workspace blocks in its workspace tensor's slot (before,
 * they went first fit beside it: on an H200 a second 2.06 GiB for the Llama layers). A bf16 model's plan counts activations at 2 bytes while the executor holds
 * fp32: at the plan's bytes the blocks do not fit (the backend would place them first fit
 * above the arena), at the bytes held (what backend_cuda_arena.c plans) they all do. */
static void test_gpu_executor_fits_planned_slots(void **state) {
  (void)state;
  uint32_t carved = 0, refused = 0;
  check_executor_fits("models/tiny-dense.json", "pp=1", "1f1b", 4, 0, &carved, &refused);
  assert_true(carved > 100);
  assert_int_equal(refused, 0);
  assert_true(fit_work_blocks > 20);
  check_executor_fits("models/tiny-moe.json", "pp=1", "1f1b", 4, 0, &carved, &refused);
  assert_true(carved > 100);
  assert_int_equal(refused, 0);
  assert_true(fit_work_blocks > 20);
  char *dir = test_tmp_dir("test_gpu-XXXXXX");
  char *fp32 = test_read_file("models/tiny-dense.json");
  char **parts = g_strsplit(fp32, "\"dtype\": \"fp32\"", -1);
  assert_int_equal(g_strv_length(parts), 2);
  char *text = g_strjoinv("\"dtype\": \"bf16\"", parts);
  g_strfreev(parts);
  g_free(fp32);
  char *bf16 = g_build_filename(dir, "tiny-dense-bf16.json", NULL);
  test_write_file(bf16, text);
  check_executor_fits(bf16, "pp=1", "1f1b", 4, 0, &carved, &refused);
  assert_true(refused > 100);
  check_executor_fits(bf16, "pp=1", "1f1b", 4, 4, &carved, &refused);
  assert_true(carved > 100);
  assert_int_equal(refused, 0);
  g_free(bf16);
  g_free(text);
  test_remove_tree(dir);
  g_free(dir);
}

/* fp32 -> bf16 on the host, bit for bit what cvt.rn.bf16.f32 gives (cuda_bf16.hpp's host
 * path is the same rule): ties to even, subnormals kept, overflow to infinity, NaN canonical. */
static void test_gpu_bf16_round(void **state) {
  (void)state;
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000u, 0x3f80u}, /* 1 */
      {0x3f808000u, 0x3f80u}, /* 1 + 2^-8: a tie, the even one below */
      {0x3f818000u, 0x3f82u}, /* 1 + 3 * 2^-8: a tie, the even one above */
      {0x3f808001u, 0x3f81u}, /* just above the tie */
      {0x3f807fffu, 0x3f80u}, /* just below it */
      {0xbf808001u, 0xbf81u}, /* the sign is apart */
      {0x00000000u, 0x0000u}, {0x80000000u, 0x8000u},
      {0x00008000u, 0x0000u}, /* the smallest subnormal tie: to even (zero) */
      {0x00018000u, 0x0002u}, /* a subnormal tie to even above */
      {0x007fffffu, 0x0080u}, /* the largest subnormal rounds up to the smallest normal */
      {0x7f7fffffu, 0x7f80u}, /* FLT_MAX overflows to infinity */
      {0x7f7f7fffu, 0x7f7fu}, /* the largest finite bf16 stays */
      {0x7f800000u, 0x7f80u}, {0xff800000u, 0xff80u}, /* infinities */
      {0x7fc00000u, 0x7fffu}, {0xffc00001u, 0x7fffu}, {0x7f800001u, 0x7fffu}, /* NaNs */
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    float x;
    memcpy(&x, &cases[i].in, sizeof x);
    if (exec_bf16_round(x) != cases[i].out)
      fail_msg("0x%08x -> 0x%04x, expected 0x%04x", cases[i].in, exec_bf16_round(x),
               cases[i].out);
  }
  /* every bf16 value survives the round trip; and rounding is within half a bf16 ulp */
  for (uint32_t b = 0; b < 0x10000u; b++) {
    float x = exec_bf16_to_f32((uint16_t)b);
    if (!isnan(x))
      assert_int_equal(exec_bf16_round(x), b);
  }
  GRand *r = g_rand_new_with_seed(13);
  for (int i = 0; i < 100000; i++) {
    float x = (float)g_rand_double_range(r, -1e6, 1e6);
    float y = exec_bf16_to_f32(exec_bf16_round(x));
    assert_true(fabsf(y - x) <= ldexpf(fabsf(x), -8)); /* the unit roundoff, 2^-8 */
  }
  g_rand_free(r);
}

/* The bf16 weight copies: only matrices inside a weight store get one; each is stale until
 * made and after any write meeting its extent (first to last element: a write between a
 * strided matrix's rows counts too, conservatively), and stays fresh across writes
 * elsewhere. */
static void test_gpu_weight_cache(void **state) {
  (void)state;
  static float store[1024], other[64];
  struct exec_wcache c;
  exec_wcache_init(&c);
  bool created = false;
  assert_null(exec_wcache_find(&c, store, 4, 4, 4, &created));
  exec_wcache_add_store(&c, store, 512 * sizeof(float));
  exec_wcache_add_store(&c, store + 256, 768 * sizeof(float)); /* merges: one store */
  assert_int_equal(c.stores->len, 1);
  assert_true(exec_wcache_in_store(&c, store, sizeof store));
  assert_false(exec_wcache_in_store(&c, other, sizeof(float)));
  assert_int_equal(exec_wcache_extent(4, 8, 16), (3 * 16 + 8) * sizeof(float));
  assert_int_equal(exec_wcache_extent(0, 8, 16), 0);
  /* a matrix crossing the store's end is not cached */
  assert_null(exec_wcache_find(&c, store + 1020, 2, 4, 4, &created));
  struct exec_wcache_entry *a = exec_wcache_find(&c, store, 4, 8, 16, &created);
  assert_non_null(a);
  assert_true(created);
  assert_false(a->fresh);
  assert_null(a->maker);
  assert_null(a->copy);
  a->fresh = true; /* made */
  struct exec_wcache_entry *again = exec_wcache_find(&c, store, 4, 8, 16, &created);
  assert_ptr_equal(again, a);
  assert_false(created);
  /* another view of the same bytes is another copy */
  struct exec_wcache_entry *b = exec_wcache_find(&c, store, 4, 8, 8, &created);
  assert_true(created && b != a);
  b->fresh = true;
  struct exec_wcache_entry *d = exec_wcache_find(&c, store + 512, 16, 16, 16, &created);
  d->fresh = true;
  /* writes outside every store, or just past a matrix's extent, leave it fresh */
  assert_int_equal(exec_wcache_written(&c, other, sizeof other), 0);
  assert_int_equal(exec_wcache_written(&c, store + 3 * 16 + 8, 8 * sizeof(float)), 0);
  assert_true(a->fresh && b->fresh && d->fresh);
  /* a write inside a's extent and past b's (store[0, 32)): a goes stale, b and d not */
  assert_int_equal(exec_wcache_written(&c, store + 33, sizeof(float)), 1);
  assert_false(a->fresh);
  assert_true(b->fresh);
  assert_int_equal(exec_wcache_written(&c, store + 31, sizeof(float)), 1);
  assert_false(b->fresh);
  assert_true(d->fresh);
  /* the optimizer's whole range */
  a->fresh = b->fresh = true;
  assert_int_equal(exec_wcache_written(&c, store, sizeof store), 3);
  assert_false(a->fresh || b->fresh || d->fresh);
  assert_int_equal(exec_wcache_written(&c, store, 0), 0);
  assert_int_equal(c.entries->len, 3);
  /* what an optimizer that rewrote a range remakes: matrices wholly inside it with a copy */
  GPtrArray *remake = g_ptr_array_new();
  assert_int_equal(exec_wcache_within(&c, store, sizeof store, remake), 0); /* no copies yet */
  static uint16_t copy_a[32], copy_d[256];
  a->copy = copy_a;
  d->copy = copy_d;
  assert_int_equal(exec_wcache_within(&c, store, sizeof store, remake), 2);
  assert_true(g_ptr_array_index(remake, 0) == a || g_ptr_array_index(remake, 1) == a);
  g_ptr_array_set_size(remake, 0);
  /* a ZeRO shard ending inside a's extent: a is half written, only the gather completes it */
  assert_int_equal(exec_wcache_within(&c, store, 40 * sizeof(float), remake), 0);
  assert_int_equal(exec_wcache_within(&c, store + 512, 256 * sizeof(float), remake), 1);
  assert_ptr_equal(g_ptr_array_index(remake, 0), d);
  assert_int_equal(exec_wcache_within(&c, store, 0, remake), 0);
  g_ptr_array_free(remake, TRUE);
  a->copy = d->copy = NULL;
  /* the store is freed: its entries go, and nothing is cached there any more */
  GPtrArray *gone = g_ptr_array_new_with_free_func(g_free);
  assert_int_equal(exec_wcache_drop(&c, other, gone), 0);
  assert_int_equal(exec_wcache_drop(&c, store, gone), 3);
  assert_int_equal(gone->len, 3);
  assert_int_equal(c.entries->len, 0);
  assert_null(exec_wcache_find(&c, store, 4, 8, 16, &created));
  g_ptr_array_free(gone, TRUE);
  exec_wcache_clear(&c);
}

/* The cuda backend is in the registry exactly when it was built. */
static void test_gpu_registry(void **state) {
  (void)state;
#ifdef HAVE_CUDA
  assert_non_null(exec_backend_find("cuda"));
#else
  assert_null(exec_backend_find("cuda"));
#endif
  assert_non_null(exec_backend_find("host"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arena_stack_order_is_exact),
      cmocka_unit_test(test_arena_fragmentation),
      cmocka_unit_test(test_arena_alignment),
      cmocka_unit_test(test_arena_refuses_bad_events),
      cmocka_unit_test(test_arena_real_plans),
      cmocka_unit_test(test_arena_peak_matches_simulator),
      cmocka_unit_test(test_arena_size_is_the_peak),
      cmocka_unit_test(test_arena_carve_refusals),
      cmocka_unit_test(test_arena_receives_posted_early),
      cmocka_unit_test(test_gpu_pick),
      cmocka_unit_test(test_gpu_shared),
      cmocka_unit_test(test_gpu_comm_rank),
      cmocka_unit_test(test_gpu_comm_layout),
      cmocka_unit_test(test_gpu_serial_progress),
      cmocka_unit_test(test_gpu_sm_share),
      cmocka_unit_test(test_gpu_head_chunk_rows),
      cmocka_unit_test(test_gpu_attention_choice),
      cmocka_unit_test(test_gpu_trace_from_device_times),
      cmocka_unit_test(test_gpu_backend_memory_peak),
      cmocka_unit_test(test_gpu_executor_fits_planned_slots),
      cmocka_unit_test(test_gpu_bf16_round),
      cmocka_unit_test(test_gpu_weight_cache),
      cmocka_unit_test(test_gpu_registry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
