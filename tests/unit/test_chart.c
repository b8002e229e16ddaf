/* Tests of the charts people read (report/chart.h, issue 12 item 4), by opening the PNGs with
 * Cairo's reader: each has the size its layout says and is not blank, and the things a reader
 * relies on are there in pixels: a V schedule's BI drawn (teal) with no full backward, the
 * capacity line and the stacked breakdown of memory.png, 32 distinct line colours for 32
 * devices, one cap line per distinct profile cap in the what-if chart, and a lane of thousands of
 * short transfers drawn as a utilisation band (its share of time busy) rather than as a solid
 * bar. Run from the repo root; gnuplot is a dependency (tools/install-deps.sh). */
#include "test-helpers.h"

#include <cairo.h>

#include "../../report/chart.h"
#include "../../report/report.h"

/* ---- reading a PNG back ------------------------------------------------------------------- */

struct png {
  cairo_surface_t *s;
  int width, height, stride;
  const unsigned char *data;
};

static struct png png_open(const char *path) {
  struct png p = {.s = cairo_image_surface_create_from_png(path)};
  if (cairo_surface_status(p.s) != CAIRO_STATUS_SUCCESS)
    fail_msg("%s: %s", path, cairo_status_to_string(cairo_surface_status(p.s)));
  cairo_surface_flush(p.s);
  p.width = cairo_image_surface_get_width(p.s);
  p.height = cairo_image_surface_get_height(p.s);
  p.stride = cairo_image_surface_get_stride(p.s);
  p.data = cairo_image_surface_get_data(p.s);
  return p;
}

static void png_close(struct png *p) {
  cairo_surface_destroy(p->s);
}

/* 0xRRGGBB of pixel (x, y) (opaque charts: no premultiplication to undo). */
static unsigned png_pixel(const struct png *p, int x, int y) {
  uint32_t v;
  memcpy(&v, p->data + (size_t)y * p->stride + (size_t)x * 4, 4);
  return v & 0xFFFFFF;
}

/* Pixels of exactly colour rgb in the rectangle [x0, x1) x [y0, y1) (clipped). */
static uint64_t png_count(const struct png *p, unsigned rgb, int x0, int y0, int x1, int y1) {
  uint64_t n = 0;
  for (int y = MAX(y0, 0); y < MIN(y1, p->height); y++)
    for (int x = MAX(x0, 0); x < MIN(x1, p->width); x++)
      n += png_pixel(p, x, y) == rgb;
  return n;
}

/* Not blank: at least min_share of the pixels are not white, and at least min_colours colours. */
static void assert_not_blank(const struct png *p, double min_share, uint32_t min_colours) {
  uint64_t inked = 0;
  GHashTable *colours = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (int y = 0; y < p->height; y++)
    for (int x = 0; x < p->width; x++) {
      unsigned c = png_pixel(p, x, y);
      inked += c != 0xFFFFFF;
      g_hash_table_add(colours, GUINT_TO_POINTER(c + 1));
    }
  double share = (double)inked / ((double)p->width * p->height);
  if (share < min_share || g_hash_table_size(colours) < min_colours)
    fail_msg("blank-looking chart: %.4f of the pixels inked, %u colours", share,
             g_hash_table_size(colours));
  g_hash_table_destroy(colours);
}

/* ---- runs to draw ------------------------------------------------------------------------- */

/* A run the way the executor fills one: every device its instructions back to back, each
 * `unit` seconds (communication `comm_share` of that, then idle), every `repeat` times, with an
 * activation step after each compute. */
struct fake_run {
  struct report_run run;
  struct report_interval **intervals;
  struct report_memory_point **memory;
};

static void fake_run_init(struct fake_run *f, const struct plan *p, uint32_t repeat, double unit,
                          double comm_share) {
  memset(f, 0, sizeof *f);
  f->run = (struct report_run){.plan = p, .kind = "exec", .schedule = "custom"};
  report_run_init_devices(&f->run);
  f->intervals = g_new0(struct report_interval *, p->n_devices);
  f->memory = g_new0(struct report_memory_point *, p->n_devices);
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    size_t n = (size_t)c->n_instrs * repeat;
    f->intervals[d] = g_new0(struct report_interval, n + 1);
    f->memory[d] = g_new0(struct report_memory_point, n + 1);
    uint64_t held = 0;
    uint32_t n_memory = 0;
    for (size_t k = 0; k < n; k++) {
      const struct plan_instr *in = &c->instrs[k % c->n_instrs];
      bool compute = report_node_is_compute(&p->nodes[in->node]);
      double t = unit * (double)(d + k);
      f->intervals[d][k] =
          (struct report_interval){t, t + unit * (compute ? 1 : comm_share), in->node, in->stream, 0};
      if (compute) {
        held += 1u << 20;
        f->memory[d][n_memory].t = t + unit;
        f->memory[d][n_memory].bytes[REPORT_MEM_PARAMS] = 4u << 20;
        f->memory[d][n_memory].bytes[REPORT_MEM_ACTIVATIONS] = held;
        n_memory++;
      }
    }
    struct report_device *rd = &f->run.devices[d];
    rd->n_intervals = (uint32_t)n;
    rd->intervals = f->intervals[d];
    rd->n_memory = n_memory;
    rd->memory = f->memory[d];
    rd->peak_memory_bytes = held + (4u << 20);
    rd->peak_breakdown[REPORT_MEM_PARAMS] = 4u << 20;
    rd->peak_breakdown[REPORT_MEM_ACTIVATIONS] = held;
  }
  report_compute_stats(&f->run);
}

static void fake_run_free(struct fake_run *f) {
  for (uint32_t d = 0; d < f->run.n_devices; d++) {
    g_free(f->intervals[d]);
    g_free(f->memory[d]);
  }
  g_free(f->intervals);
  g_free(f->memory);
  report_run_free_devices(&f->run);
}

static struct plan *plan_of(const char *model, const char *directives, const char *layout,
                            enum sched_family family, uint32_t mbs, int pp_regions) {
  struct compile_options o = compile_options_default();
  o.model_path = model;
  o.directives_path = directives;
  o.layout = layout;
  o.pp_regions = pp_regions;
  o.have_schedule = family != SCHED_CUSTOM;
  o.schedule.family = family;
  o.schedule.mbs = mbs;
  GError *err = NULL;
  struct plan *p = compile_take_plan(&o, &err);
  if (!p)
    fail_msg("%s: %s", directives ? directives : layout, err->message);
  return p;
}

/* ---- the tests ---------------------------------------------------------------------------- */

/* A ZBV run: the chart's size follows its layout (four devices of five lanes), it is inked, BI
 * is drawn in its own colour and no full backward (ZBV splits every one) is. */
static void test_schedule_png(void **state) {
  (void)state;
  struct plan *p = plan_of("models/tiny-moe.json",
                           "directives/base-schedules/pp4_dp2_ep2_v_placement.json", NULL,
                           SCHED_ZBV, 8, 4);
  struct fake_run f;
  fake_run_init(&f, p, 1, 1e-3, 1);
  char *dir = test_tmp_dir("test_chart-XXXXXX");
  char *path = g_build_filename(dir, "schedule.png", NULL);
  GError *err = NULL;
  if (!chart_schedule(&f.run, path, CHART_PNG, &err))
    fail_msg("%s", err->message);
  struct png png = png_open(path);
  assert_int_equal(png.width, 330 + 1500 + 24); /* LEFT + PLOT_W + RIGHT */
  assert_true(png.height > 300 && png.height < 1200);
  assert_not_blank(&png, 0.05, 12);
  assert_true(png_count(&png, 0x76B7B2, 330, 0, png.width, png.height) > 500); /* BI */
  assert_true(png_count(&png, 0x4E79A7, 330, 0, png.width, png.height) > 500); /* F */
  assert_int_equal(png_count(&png, 0x59A14F, 0, 0, png.width, png.height), 0); /* no B */
  png_close(&png);
  fake_run_free(&f);
  plan_free(p);
  g_free(path);
  test_remove_tree(dir);
  g_free(dir);
}

/* Thousands of transfers, each busy a quarter of its slot, beside one long compute: drawn one
 * box each (widened to stay visible) they would paint their lane solid (8 px over the plot's
 * 1500); as a utilisation band the lane's colour covers about a quarter of its 14 px. */
static void test_dense_lane_is_a_band(void **state) {
  (void)state;
  struct plan *p =
      plan_of("models/tiny-dense.json", "directives/base-schedules/pp4.json", NULL, SCHED_1F1B, 4,
              0);
  struct report_run run = {.plan = p, .kind = "sim", .schedule = "1f1b"};
  report_run_init_devices(&run);
  const uint32_t n = 3000;
  const double slot = 1e-6;
  struct report_interval **iv = g_new0(struct report_interval *, p->n_devices);
  uint32_t lanes = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    const struct plan_class *c = plan_device_class(p, d);
    const struct plan_instr *comm = NULL, *compute = NULL;
    for (uint32_t i = 0; i < c->n_instrs; i++) {
      const struct ir_node *nd = &p->nodes[c->instrs[i].node];
      if (!comm && (nd->kind == IR_NODE_SEND || nd->kind == IR_NODE_RECV))
        comm = &c->instrs[i];
      if (!compute && nd->kind == IR_NODE_COMPUTE)
        compute = &c->instrs[i];
    }
    assert_non_null(comm);
    assert_non_null(compute);
    lanes++;
    iv[d] = g_new0(struct report_interval, n + 1);
    iv[d][0] = (struct report_interval){0, n * slot, compute->node, compute->stream, 0};
    for (uint32_t k = 1; k < n; k++)
      iv[d][k] = (struct report_interval){k * slot, (k + 0.25) * slot, comm->node, comm->stream, 0};
    run.devices[d].n_intervals = n;
    run.devices[d].intervals = iv[d];
  }
  report_compute_stats(&run);
  char *dir = test_tmp_dir("test_chart-XXXXXX");
  char *path = g_build_filename(dir, "schedule.png", NULL);
  GError *err = NULL;
  if (!chart_schedule(&run, path, CHART_PNG, &err))
    fail_msg("%s", err->message);
  struct png png = png_open(path);
  assert_not_blank(&png, 0.02, 6);
  uint64_t p2p = png_count(&png, 0x6B3FA0, 330, 56, 330 + 1500, png.height);
  uint64_t solid = (uint64_t)lanes * 1500 * 8;
  if (p2p < solid / 10 || p2p > solid / 2)
    fail_msg("%llu px of send/recv colour; a band is 10%% to 50%% of a solid bar's %llu",
             (unsigned long long)p2p, (unsigned long long)solid);
  png_close(&png);
  for (uint32_t d = 0; d < p->n_devices; d++)
    g_free(iv[d]);
  g_free(iv);
  report_run_free_devices(&run);
  plan_free(p);
  g_free(path);
  test_remove_tree(dir);
  g_free(dir);
}

/* The colours the memory script gives its device lines: "lc rgb '#RRGGBB'" before the
 * breakdown's "filledcurves". */
static uint32_t distinct_line_colours(const char *script) {
  GHashTable *seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  const char *end = strstr(script, "filledcurves");
  for (const char *s = strstr(script, "lc rgb '#"); s && (!end || s < end);
       s = strstr(s + 1, "lc rgb '#")) {
    if (strstr(s, "with steps") == NULL)
      break;
    g_hash_table_add(seen, g_strndup(s + 9, 6));
  }
  uint32_t n = g_hash_table_size(seen);
  g_hash_table_destroy(seen);
  return n;
}

/* memory.png: two panels of the right size, the capacity line (red) when the capacity is in
 * reach, the peak device's parameters and activations stacked (their exact colours); 32 devices
 * get 32 line colours. */
static void test_memory_png(void **state) {
  (void)state;
  struct plan *p =
      plan_of("models/tiny-dense.json", NULL, "pp=2,dp=16", SCHED_1F1B, 4, 0);
  assert_int_equal(p->n_devices, 32);
  struct fake_run f;
  fake_run_init(&f, p, 1, 1e-3, 1);
  f.run.memory_capacity_bytes = 2.0 * (double)f.run.devices[0].peak_memory_bytes;
  f.run.capacity_source = "test";
  char *dir = test_tmp_dir("test_chart-XXXXXX");
  GError *err = NULL;
  if (!chart_memory(&f.run, dir, &err))
    fail_msg("%s", err->message);
  char *path = g_build_filename(dir, "memory.png", NULL);
  struct png png = png_open(path);
  assert_int_equal(png.width, 1400);
  assert_int_equal(png.height, 1150);
  assert_not_blank(&png, 0.05, 20);
  assert_true(png_count(&png, 0xC0392B, 0, 0, png.width, png.height) > 300); /* capacity */
  /* the lower panel: parameters (blue) and activations (orange) filled */
  assert_true(png_count(&png, 0x4E79A7, 0, png.height / 2, png.width, png.height) > 5000);
  assert_true(png_count(&png, 0xF28E2B, 0, png.height / 2, png.width, png.height) > 5000);
  png_close(&png);
  char *gp = g_build_filename(dir, "memory.gp", NULL);
  char *script = NULL;
  assert_true(g_file_get_contents(gp, &script, NULL, NULL));
  assert_int_equal(distinct_line_colours(script), 32);
  g_free(script);
  g_free(gp);
  fake_run_free(&f);
  plan_free(p);
  g_free(path);
  test_remove_tree(dir);
  g_free(dir);
}

/* Columns of the plot that hold a stretch of a cap line's red. */
static uint32_t red_line_groups(const struct png *p) {
  uint32_t groups = 0;
  bool in = false;
  for (int x = 0; x < p->width; x++) {
    bool red = png_count(p, 0xBF382B, x, 0, x + 1, p->height) > 200;
    groups += red && !in;
    in = red;
  }
  return groups;
}

/* The what-if chart: its size, inked, one dashed cap line per distinct cap (two profiles with
 * different caps: two lines; the same cap: one), and a chart of nothing still drawn. */
static void test_points_png(void **state) {
  (void)state;
  const double gib = (double)(1ull << 30);
  struct chart_point pts[12];
  for (int i = 0; i < 12; i++)
    pts[i] = (struct chart_point){.label = i % 3 ? "1f1b/pp4/8" : "zerobubble/pp4/16",
                                  .schedule = i % 3 ? "1f1b" : "zerobubble",
                                  .profile = i % 2 ? "h100" : "a100-40g",
                                  .ok = i != 11,
                                  .peak_memory_bytes = (20 + 3 * i) * gib,
                                  .throughput_tokens_per_s = 1000 + 100 * i,
                                  .memory_cap_bytes = (i % 2 ? 80 : 40) * gib};
  for (int i = 0; i < 12; i++)
    pts[i].feasible = pts[i].peak_memory_bytes <= pts[i].memory_cap_bytes;
  char *dir = test_tmp_dir("test_chart-XXXXXX");
  char *path = g_build_filename(dir, "sweep.png", NULL);
  GError *err = NULL;
  if (!chart_points("test", pts, 12, path, &err))
    fail_msg("%s", err->message);
  struct png png = png_open(path);
  assert_int_equal(png.width, 1400);
  assert_int_equal(png.height, 860);
  assert_not_blank(&png, 0.02, 10);
  assert_int_equal(red_line_groups(&png), 2);
  png_close(&png);
  for (int i = 0; i < 12; i++)
    pts[i].memory_cap_bytes = 80 * gib;
  if (!chart_points("test", pts, 12, path, &err))
    fail_msg("%s", err->message);
  png = png_open(path);
  assert_int_equal(red_line_groups(&png), 1);
  png_close(&png);
  if (!chart_points("nothing", pts, 0, path, &err))
    fail_msg("%s", err->message);
  png = png_open(path);
  assert_not_blank(&png, 0.005, 3);
  png_close(&png);
  g_free(path);
  test_remove_tree(dir);
  g_free(dir);
}

/* What plan.png and sweep.png must show (issue 32), read from the chart's listing of what it
 * drew: every top pick's label, even crowded (ten picks within a few pixels of each other);
 * the cap line; the Pareto front (the points no other beats on both memory and throughput);
 * axes that span the answers, not zero or a 1,300 GiB outlier. */
static void test_points_answers(void **state) {
  (void)state;
  const double gib = (double)(1ull << 30);
  enum { N = 16 };
  struct chart_point pts[N];
  char labels[N][32];
  for (int i = 0; i < N; i++) {
    snprintf(labels[i], sizeof labels[i], "#%d pick-%d", i + 1, i + 1);
    /* ranked best first: throughput falls with i; ten crowded picks around 60 GiB */
    pts[i] = (struct chart_point){.label = labels[i], .schedule = i % 2 ? "1f1b" : "zbv",
                                  .profile = "h100", .ok = true, .feasible = true,
                                  .top = i < 10,
                                  .peak_memory_bytes = (60 + 0.05 * i) * gib,
                                  .throughput_tokens_per_s = 1e6 - 100 * i,
                                  .memory_cap_bytes = 80 * gib};
  }
  /* on the front: the fastest (#1) and two leaner, slower ones; one outlier far over the cap */
  pts[10].peak_memory_bytes = 40 * gib;
  pts[10].throughput_tokens_per_s = 8e5;
  pts[11].peak_memory_bytes = 30 * gib;
  pts[11].throughput_tokens_per_s = 6e5;
  pts[12].peak_memory_bytes = 1300 * gib;
  pts[12].feasible = false;
  pts[12].throughput_tokens_per_s = 1.2e6;
  char *dir = test_tmp_dir("test_chart-XXXXXX");
  char *path = g_build_filename(dir, "plan.png", NULL);
  GString *listing = g_string_new("");
  GError *err = NULL;
  if (!chart_points_listed("answers", pts, N, path, listing, &err))
    fail_msg("%s", err->message);
  for (int i = 0; i < 10; i++) {
    char want[64];
    snprintf(want, sizeof want, "label %d %s\n", i, labels[i]);
    if (!strstr(listing->str, want))
      fail_msg("top pick %d unlabelled:\n%s", i + 1, listing->str);
  }
  char cap[64];
  snprintf(cap, sizeof cap, "cap %.0f\n", 80 * gib);
  assert_non_null(strstr(listing->str, cap));
  assert_non_null(strstr(listing->str, "pareto 0\n"));
  assert_non_null(strstr(listing->str, "pareto 10\n"));
  assert_non_null(strstr(listing->str, "pareto 11\n"));
  assert_null(strstr(listing->str, "pareto 1\n")); /* #2: #1 has as little memory, more speed */
  assert_null(strstr(listing->str, "pareto 12\n")); /* over the cap */
  double lo, hi;
  const char *x = strstr(listing->str, "x-axis ");
  assert_non_null(x);
  assert_int_equal(sscanf(x, "x-axis %lf %lf", &lo, &hi), 2);
  if (!(lo > 20 && lo < 30 && hi > 80 && hi < 100))
    fail_msg("memory axis %g .. %g GiB: want about 30 .. 80 (the answers and the cap)", lo, hi);
  const char *y = strstr(listing->str, "y-axis ");
  assert_int_equal(sscanf(y, "y-axis %lf %lf", &lo, &hi), 2);
  assert_true(lo > 4e5 && hi < 1.2e6);
  struct png png = png_open(path);
  assert_int_equal(red_line_groups(&png), 1);
  png_close(&png);
  g_string_free(listing, TRUE);
  g_free(path);
  test_remove_tree(dir);
  g_free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_png),
      cmocka_unit_test(test_dense_lane_is_a_band),
      cmocka_unit_test(test_memory_png),
      cmocka_unit_test(test_points_png),
      cmocka_unit_test(test_points_answers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
