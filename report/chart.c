/* chart: the schedule chart (Cairo) and the memory chart (gnuplot) of a run. */
#include "chart.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "../base/json.h"

bool chart_format_parse(const char *name, enum chart_format *out) {
  if (strcmp(name, "png") == 0)
    *out = CHART_PNG;
  else if (strcmp(name, "svg") == 0)
    *out = CHART_SVG;
  else if (strcmp(name, "pdf") == 0)
    *out = CHART_PDF;
  else
    return false;
  return true;
}

uint32_t *chart_pick_devices(const struct report_run *r, uint32_t max_rows, uint32_t *n) {
  uint32_t *out = g_new(uint32_t, r->n_devices + 1);
  *n = 0;
  if (r->n_devices <= max_rows) {
    for (uint32_t i = 0; i < r->n_devices; i++)
      out[(*n)++] = i;
    return out;
  }
  /* one device per pp rank, in pp order */
  uint32_t *by_pp = g_new(uint32_t, r->pp + 1);
  for (uint32_t k = 0; k < r->pp; k++)
    by_pp[k] = UINT32_MAX;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    if (d->dp_rank == 0 && d->pp_rank >= 0 && (uint32_t)d->pp_rank < r->pp)
      by_pp[d->pp_rank] = i;
  }
  uint32_t cnt = 0;
  for (uint32_t k = 0; k < r->pp; k++)
    if (by_pp[k] != UINT32_MAX)
      by_pp[cnt++] = by_pp[k];
  if (cnt <= max_rows) {
    memcpy(out, by_pp, cnt * sizeof *out);
    *n = cnt;
  } else {
    for (uint32_t k = 0; k < max_rows; k++)
      out[(*n)++] = by_pp[(uint64_t)k * cnt / max_rows];
  }
  g_free(by_pp);
  return out;
}

/* ---- schedule chart ------------------------------------------------------------------------ */

struct rgb {
  double r, g, b;
};
static struct rgb hex(unsigned v) {
  return (struct rgb){((v >> 16) & 255) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0};
}
static struct rgb lighten(struct rgb c, double f) {
  return (struct rgb){c.r + (1 - c.r) * f, c.g + (1 - c.g) * f, c.b + (1 - c.b) * f};
}

/* Colours (Tableau 10): passes take the light-to-mid hues, communication dark ones. kind is an
 * enum ir_node_kind, pass an enum ir_pass (numbers, so that a kind read from a trace, which
 * may be one this build does not know, gets the default). */
static struct rgb kind_colour(uint32_t kind, uint32_t pass) {
  switch (kind) {
  case IR_NODE_COMPUTE:
    switch (pass) {
    case IR_PASS_F: return hex(0x4E79A7);
    case IR_PASS_B: return hex(0x59A14F);
    case IR_PASS_BI: return hex(0x8CD17D);
    case IR_PASS_BW: return hex(0xF28E2B);
    case IR_PASS_R: return hex(0x76B7B2); /* recomputation */
    default: return hex(0x999999);
    }
  case IR_NODE_OPTIMIZER: return hex(0x79706E);
  case IR_NODE_SEND:
  case IR_NODE_RECV: return hex(0x6B3FA0);
  case IR_NODE_ALL_REDUCE:
  case IR_NODE_REDUCE_SCATTER: return hex(0xC0392B);
  case IR_NODE_ALL_GATHER: return hex(0x9C755F);
  case IR_NODE_ALL_TO_ALL: return hex(0xD4477F);
  default: return hex(0x333333);
  }
}

static const struct {
  const char *label;
  unsigned colour;
  bool comm;
} legend[] = {
    {"F", 0x4E79A7, false},
    {"B", 0x59A14F, false},
    {"BI", 0x8CD17D, false},
    {"BW", 0xF28E2B, false},
    {"optimizer", 0x79706E, false},
    {"send/recv", 0x6B3FA0, true},
    {"all-reduce / reduce-scatter", 0xC0392B, true},
    {"all-gather", 0x9C755F, true},
    {"all-to-all", 0xD4477F, true},
};

/* Tick step: 1, 2 or 5 times a power of ten, giving about `want` ticks over span. */
static double nice_step(double span, int want) {
  double raw = span / want;
  double p = pow(10, floor(log10(raw)));
  double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double align) {
  cairo_text_extents_t te;
  cairo_text_extents(cr, s, &te);
  cairo_move_to(cr, x - align * te.x_advance, y);
  cairo_show_text(cr, s);
}

#define LANE_H 16.0
#define COMM_H 8.0
#define ROW_GAP 8.0
#define LEFT 170.0
#define RIGHT 24.0
#define TOP 56.0
#define PLOT_W 1500.0
#define MAX_ROWS 32

/* Where everything of the schedule chart goes: the devices drawn, a lane per stream each of
 * them uses, the time window and the page size. */
struct schedule_layout {
  uint32_t n_rows;
  uint32_t *rows;     /* indices into r->devices */
  uint32_t stride;    /* n_streams + 1 */
  uint32_t *lane_of;  /* [n_rows][stride]: lane of a stream in its row, UINT32_MAX: unused */
  uint32_t *n_lanes;  /* [n_rows] */
  double t0, t1, sx;  /* window (seconds) and pixels per second */
  double width, height, axis_y;
  int mb_tag;         /* the micro-batch tag, -1 when the plan has none */
};

/* First start and last end of every interval (a 1 ms window when there are none). */
static void interval_window(const struct report_run *r, double *t0, double *t1) {
  double lo = INFINITY, hi = -INFINITY;
  for (uint32_t i = 0; i < r->n_devices; i++)
    for (uint32_t k = 0; k < r->devices[i].n_intervals; k++) {
      if (r->devices[i].intervals[k].start < lo)
        lo = r->devices[i].intervals[k].start;
      if (r->devices[i].intervals[k].end > hi)
        hi = r->devices[i].intervals[k].end;
    }
  if (!isfinite(lo) || hi <= lo) {
    lo = 0;
    hi = 1e-3;
  }
  *t0 = lo;
  *t1 = hi;
}

/* The micro-batch dimension: "MB" (the schedule harness), else the first split dimension. */
static int micro_batch_tag(const struct plan *p) {
  int mb_tag = -1;
  for (uint32_t t = 0; t < p->n_tags && t < IR_MAX_TAGS; t++)
    if (strcmp(p->tag_names[t], "MB") == 0)
      mb_tag = (int)t;
  if (mb_tag < 0 && p->model->n_tags < p->n_tags)
    mb_tag = (int)p->model->n_tags;
  return mb_tag;
}

/* Lanes of row ri: the streams its device uses, in stream order (one empty lane at least). */
static void assign_lanes(const struct report_run *r, struct schedule_layout *l, uint32_t ri) {
  const struct plan *p = r->plan;
  const struct report_device *d = &r->devices[l->rows[ri]];
  uint32_t *lo = l->lane_of + (size_t)ri * l->stride;
  for (uint32_t s = 0; s < p->n_streams; s++)
    lo[s] = UINT32_MAX;
  for (uint32_t k = 0; k < d->n_intervals; k++)
    if (d->intervals[k].stream < p->n_streams)
      lo[d->intervals[k].stream] = 0;
  for (uint32_t s = 0; s < p->n_streams; s++)
    if (lo[s] != UINT32_MAX)
      lo[s] = l->n_lanes[ri]++;
  if (l->n_lanes[ri] == 0)
    l->n_lanes[ri] = 1;
}

static void layout_init(const struct report_run *r, struct schedule_layout *l) {
  const struct plan *p = r->plan;
  memset(l, 0, sizeof *l);
  l->rows = chart_pick_devices(r, MAX_ROWS, &l->n_rows);
  interval_window(r, &l->t0, &l->t1);
  l->sx = PLOT_W / (l->t1 - l->t0);
  l->stride = p->n_streams + 1;
  l->lane_of = g_new(uint32_t, (size_t)l->n_rows * l->stride);
  l->n_lanes = g_new0(uint32_t, l->n_rows + 1);
  l->height = TOP;
  for (uint32_t ri = 0; ri < l->n_rows; ri++) {
    assign_lanes(r, l, ri);
    l->height += l->n_lanes[ri] * LANE_H + ROW_GAP;
  }
  l->axis_y = l->height + 4;
  l->height += 40;     /* axis */
  l->height += 28 * 2; /* legend, two lines */
  l->width = LEFT + PLOT_W + RIGHT;
  l->mb_tag = micro_batch_tag(p);
}

static void layout_free(struct schedule_layout *l) {
  g_free(l->rows);
  g_free(l->lane_of);
  g_free(l->n_lanes);
}

static void draw_title(cairo_t *cr, const struct report_run *r, const struct schedule_layout *l) {
  const struct plan *p = r->plan;
  char title[512];
  double iter = l->t1 - l->t0;
  snprintf(title, sizeof title, "%s · %s · pp %u × dp %u · %u micro-batches · iteration %.4g %s%s",
           p->model->name, r->schedule ? r->schedule : "custom", r->pp, r->dp, p->n_microbatches,
           iter >= 1 ? iter : iter * 1e3, iter >= 1 ? "s" : "ms",
           l->n_rows < r->n_devices ? " · dp rank 0 of each pp rank shown" : "");
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_set_font_size(cr, 16);
  text_at(cr, LEFT, 28, title, 0);
}

/* Vertical grid lines at round times, their labels and the axis title. */
static void draw_time_axis(cairo_t *cr, const struct schedule_layout *l) {
  double iter = l->t1 - l->t0;
  double unit = iter >= 1 ? 1 : 1e-3;
  const char *unit_name = iter >= 1 ? "s" : "ms";
  double step = nice_step(iter / unit, 10) * unit;
  cairo_set_font_size(cr, 11);
  for (double t = 0; t <= iter * 1.0001; t += step) {
    double x = LEFT + t * l->sx;
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_set_line_width(cr, 1);
    cairo_move_to(cr, x, TOP - 6);
    cairo_line_to(cr, x, l->axis_y);
    cairo_stroke(cr);
    char lab[32];
    snprintf(lab, sizeof lab, "%g", round(t / unit * 1e6) / 1e6);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text_at(cr, x, l->axis_y + 16, lab, 0.5);
  }
  char axis_label[32];
  snprintf(axis_label, sizeof axis_label, "time (%s)", unit_name);
  cairo_set_font_size(cr, 12);
  text_at(cr, LEFT + PLOT_W / 2, l->axis_y + 34, axis_label, 0.5);
}

/* The device's first PP stage, so that its later stage (V / interleaved chunk) is shaded
 * lighter. */
static int32_t first_stage(const struct plan *p, const struct report_device *d) {
  int32_t min_stage = INT32_MAX;
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    const struct ir_node *n = &p->nodes[d->intervals[k].node];
    if (n->kind == IR_NODE_COMPUTE && n->tags[MODEL_TAG_PP] >= 0 &&
        n->tags[MODEL_TAG_PP] < min_stage)
      min_stage = n->tags[MODEL_TAG_PP];
  }
  return min_stage;
}

/* Alternating row background, two short lines at the left edge (what the row is), the lanes'
 * names right-aligned before the plot. */
static void draw_row_frame(cairo_t *cr, const char *label, const char *sublabel,
                           const char *const *lane_names, uint32_t n_lanes, uint32_t ri, double y,
                           double row_h) {
  double shade = ri % 2 ? 0.965 : 0.985;
  cairo_set_source_rgb(cr, shade, shade, shade);
  cairo_rectangle(cr, LEFT, y, PLOT_W, row_h);
  cairo_fill(cr);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_set_font_size(cr, 12);
  text_at(cr, 8, y + LANE_H - 4, label, 0);
  cairo_set_font_size(cr, 10);
  cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
  text_at(cr, 8, y + LANE_H + 9, sublabel, 0);
  cairo_set_font_size(cr, 9);
  cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
  for (uint32_t k = 0; k < n_lanes; k++)
    if (lane_names[k])
      text_at(cr, LEFT - 4, y + k * LANE_H + 11, lane_names[k], 1);
}

/* A device's row frame in the schedule chart: its ranks, its streams. */
static void draw_device_frame(cairo_t *cr, const struct plan *p, const struct report_device *d,
                              const uint32_t *lo, uint32_t n_lanes, uint32_t ri, double y,
                              double row_h) {
  char label[64], sublabel[64];
  snprintf(label, sizeof label, "device %u", d->device);
  snprintf(sublabel, sizeof sublabel, "pp %d · dp %d", d->pp_rank, d->dp_rank);
  const char **names = g_new0(const char *, n_lanes + 1);
  for (uint32_t s = 0; s < p->n_streams; s++)
    if (lo[s] != UINT32_MAX && lo[s] < n_lanes)
      names[lo[s]] = p->streams[s].name;
  draw_row_frame(cr, label, sublabel, names, n_lanes, ri, y, row_h);
  g_free(names);
}

/* The micro-batch number inside a compute box, only where it fits. */
static void draw_micro_batch(cairo_t *cr, int mb, double x0, double x1, double ly) {
  char ml[16];
  snprintf(ml, sizeof ml, "%d", mb);
  cairo_text_extents_t te;
  cairo_text_extents(cr, ml, &te);
  if (te.x_advance + 2 <= x1 - x0) {
    cairo_set_source_rgb(cr, 1, 1, 1);
    text_at(cr, (x0 + x1) / 2, ly + 11.5, ml, 0.5);
  }
}

/* What one instruction looks like, whether it comes from a plan or from a trace. */
struct chart_box {
  double start, end; /* seconds, on the layout's clock */
  struct rgb colour;
  bool comm;
  int mb; /* micro-batch shown inside compute boxes; -1: none */
};

/* A full-height box for compute, a thin bar for communication. */
static void draw_box(cairo_t *cr, const struct schedule_layout *l, const struct chart_box *b,
                     double ly) {
  double x0 = LEFT + (b->start - l->t0) * l->sx, x1 = LEFT + (b->end - l->t0) * l->sx;
  if (x1 - x0 < 0.6)
    x1 = x0 + 0.6; /* zero-cost ops stay visible as hairlines */
  double by = b->comm ? ly + (LANE_H - COMM_H) / 2 : ly + 1, bh = b->comm ? COMM_H : LANE_H - 2;
  cairo_set_source_rgb(cr, b->colour.r, b->colour.g, b->colour.b);
  cairo_rectangle(cr, x0, by, x1 - x0, bh);
  cairo_fill(cr);
  if (x1 - x0 >= 3) { /* a white edge separates back-to-back boxes */
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_set_line_width(cr, 0.6);
    cairo_rectangle(cr, x0 + 0.3, by + 0.3, x1 - x0 - 0.6, bh - 0.6);
    cairo_stroke(cr);
  }
  if (!b->comm && b->mb >= 0)
    draw_micro_batch(cr, b->mb, x0, x1, ly);
}

/* One interval of a plan's run. */
static void draw_interval(cairo_t *cr, const struct plan *p, const struct schedule_layout *l,
                          const struct report_interval *iv, double ly, int32_t min_stage) {
  const struct ir_node *n = &p->nodes[iv->node];
  struct chart_box b = {iv->start, iv->end, kind_colour(n->kind, n->pass),
                        !report_node_is_compute(n), l->mb_tag >= 0 ? n->tags[l->mb_tag] : -1};
  if (!b.comm && n->tags[MODEL_TAG_PP] > min_stage && n->kind == IR_NODE_COMPUTE)
    b.colour = lighten(b.colour, 0.35); /* the rank's later stage (chunk) */
  draw_box(cr, l, &b, ly);
}

/* A point-to-point group is one box (its first part's interval spans the group): its parts
 * ("sF3 rB1": send forward of micro-batch 3, receive backward of 1) over the bar, where they
 * fit. */
static void draw_group_label(cairo_t *cr, const struct plan *p, const struct plan_class *c,
                             uint32_t entry, const struct schedule_layout *l,
                             const struct report_interval *iv, double ly) {
  char label[128];
  plan_group_name(p, c, entry, true, l->mb_tag, label, sizeof label);
  double x0 = LEFT + (iv->start - l->t0) * l->sx, x1 = LEFT + (iv->end - l->t0) * l->sx;
  cairo_save(cr);
  cairo_set_font_size(cr, 7);
  cairo_text_extents_t te;
  cairo_text_extents(cr, label, &te);
  if (te.x_advance + 2 <= x1 - x0) {
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text_at(cr, (x0 + x1) / 2, ly + (LANE_H - COMM_H) / 2 - 1, label, 0.5);
  }
  cairo_restore(cr);
}

/* Row ri at height y; returns its height. */
static double draw_device_row(cairo_t *cr, const struct report_run *r,
                              const struct schedule_layout *l, uint32_t ri, double y) {
  const struct plan *p = r->plan;
  const struct report_device *d = &r->devices[l->rows[ri]];
  const uint32_t *lo = l->lane_of + (size_t)ri * l->stride;
  double row_h = l->n_lanes[ri] * LANE_H;
  int32_t min_stage = first_stage(p, d);
  draw_device_frame(cr, p, d, lo, l->n_lanes[ri], ri, y, row_h);
  cairo_set_font_size(cr, 9);
  const struct plan_class *c = plan_device_class(p, d->device);
  GHashTable *groups = c ? plan_class_group_index(c) : NULL;
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    const struct report_interval *iv = &d->intervals[k];
    if (iv->stream >= p->n_streams || lo[iv->stream] == UINT32_MAX)
      continue;
    uint32_t entry =
        groups ? GPOINTER_TO_UINT(g_hash_table_lookup(groups, GUINT_TO_POINTER(iv->node))) : 0;
    if (entry && c->instrs[c->stream_instrs[entry - 1]].node != iv->node)
      continue; /* a later part of a group: drawn with its first part */
    draw_interval(cr, p, l, iv, y + lo[iv->stream] * LANE_H, min_stage);
    if (entry)
      draw_group_label(cr, p, c, entry - 1, l, iv, y + lo[iv->stream] * LANE_H);
  }
  if (groups)
    g_hash_table_destroy(groups);
  return row_h;
}

static void draw_legend(cairo_t *cr, const struct schedule_layout *l) {
  double lx = LEFT, ly = l->axis_y + 50;
  cairo_set_font_size(cr, 12);
  for (size_t i = 0; i < sizeof legend / sizeof legend[0]; i++) {
    struct rgb c = hex(legend[i].colour);
    cairo_text_extents_t te;
    cairo_text_extents(cr, legend[i].label, &te);
    if (lx + 24 + te.x_advance > LEFT + PLOT_W) {
      lx = LEFT;
      ly += 24;
    }
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    if (legend[i].comm)
      cairo_rectangle(cr, lx, ly - 8, 18, COMM_H);
    else
      cairo_rectangle(cr, lx, ly - 12, 18, 14);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    text_at(cr, lx + 24, ly, legend[i].label, 0);
    lx += 24 + te.x_advance + 22;
  }
  cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
  cairo_set_font_size(cr, 11);
  text_at(cr, lx, ly, "(lighter: the rank's later stage; numbers: micro-batch)", 0);
}

static void draw_schedule(cairo_t *cr, const struct report_run *r,
                          const struct schedule_layout *l) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  draw_title(cr, r, l);
  draw_time_axis(cr, l);
  double y = TOP;
  for (uint32_t ri = 0; ri < l->n_rows; ri++)
    y += draw_device_row(cr, r, l, ri, y) + ROW_GAP;
  draw_legend(cr, l);
}

/* Cairo's stream callback: every byte of the chart goes through the output's checked FILE. */
static cairo_status_t write_to_out(void *closure, const unsigned char *data, unsigned int len) {
  FILE *f = closure;
  return fwrite(data, 1, len, f) == len ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
}

static bool cairo_fail(GError **err, const char *path, const char *what, cairo_status_t st) {
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: %s: %s", path, what,
              cairo_status_to_string(st));
  return false;
}

/* A surface that streams into out: vector formats write as they draw, PNG is an image written
 * once drawn (render_schedule). */
static cairo_surface_t *schedule_surface(const struct schedule_layout *l, enum chart_format f,
                                         struct piper_out *out) {
  if (f == CHART_PNG)
    return cairo_image_surface_create(CAIRO_FORMAT_RGB24, (int)l->width, (int)ceil(l->height));
  if (f == CHART_SVG)
    return cairo_svg_surface_create_for_stream(write_to_out, out->f, l->width, l->height);
  return cairo_pdf_surface_create_for_stream(write_to_out, out->f, l->width, l->height);
}

/* Draws a chart of the layout's size by draw(cr, what) onto a surface streaming into out;
 * false (err set) when cairo fails at any step. */
static bool render_chart(const struct schedule_layout *l, enum chart_format f,
                         void (*draw)(cairo_t *cr, const void *what), const void *what,
                         struct piper_out *out, GError **err) {
  cairo_surface_t *surf = schedule_surface(l, f, out);
  if (cairo_surface_status(surf) != CAIRO_STATUS_SUCCESS) {
    cairo_fail(err, out->path, "cannot create the chart", cairo_surface_status(surf));
    cairo_surface_destroy(surf);
    return false;
  }
  cairo_t *cr = cairo_create(surf);
  draw(cr, what);
  cairo_status_t st = cairo_status(cr);
  cairo_destroy(cr);
  if (st == CAIRO_STATUS_SUCCESS && f == CHART_PNG)
    st = cairo_surface_write_to_png_stream(surf, write_to_out, out->f);
  cairo_surface_finish(surf);
  if (st == CAIRO_STATUS_SUCCESS)
    st = cairo_surface_status(surf);
  cairo_surface_destroy(surf);
  if (st != CAIRO_STATUS_SUCCESS)
    return cairo_fail(err, out->path, "cannot write", st);
  return true;
}

/* A chart into path through piper_out: a chart that cannot be drawn whole is no file. */
static bool write_chart(const char *path, const struct schedule_layout *l, enum chart_format f,
                        void (*draw)(cairo_t *cr, const void *what), const void *what,
                        GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  if (!render_chart(l, f, draw, what, &out, err)) {
    piper_out_abandon(&out);
    return false;
  }
  return piper_out_close(&out, err);
}

struct schedule_chart {
  const struct report_run *r;
  const struct schedule_layout *l;
};

static void draw_schedule_chart(cairo_t *cr, const void *what) {
  const struct schedule_chart *c = what;
  draw_schedule(cr, c->r, c->l);
}

bool chart_schedule(const struct report_run *r, const char *path, enum chart_format f,
                    GError **err) {
  struct schedule_layout l;
  layout_init(r, &l);
  struct schedule_chart c = {r, &l};
  bool ok = write_chart(path, &l, f, draw_schedule_chart, &c, err);
  layout_free(&l);
  return ok;
}

/* ---- comparison chart ------------------------------------------------------------------------
 * Two runs of one plan read back from their run directories (no plan at hand: everything comes
 * from the traces), each device's row of A above its row of B on one time axis. */

/* One side: its run, the step drawn and that step's window (seconds on the trace's clock). */
struct compare_side {
  const struct report_dir *d;
  uint32_t step; /* index into d->trace_steps */
  double t0, t1;
};

/* The step of median length (the lower median), so that one slow step does not stand for a
 * run. */
static struct compare_side compare_side_of(const struct report_dir *d) {
  struct compare_side side = {d, 0, 0, 0};
  uint32_t n = d->n_trace_steps;
  if (n == 0)
    return side;
  double *len = g_new(double, n), *sorted = g_new(double, n);
  for (uint32_t k = 0; k < n; k++) {
    double t0, t1;
    report_dir_step_window(d, k, NULL, &t0, &t1);
    len[k] = sorted[k] = t1 - t0;
  }
  qsort(sorted, n, sizeof *sorted, piper_cmp_double);
  double median = sorted[(n - 1) / 2];
  for (uint32_t k = 0; k < n; k++)
    if (len[k] == median) {
      side.step = k;
      break;
    }
  report_dir_step_window(d, side.step, NULL, &side.t0, &side.t1);
  g_free(len);
  g_free(sorted);
  return side;
}

/* One row: a device of one side, its step's events and a lane per stream they use. */
struct compare_row {
  uint32_t side, device;
  GArray *events; /* indices into the side's trace_events */
  uint32_t n_lanes;
  uint32_t *streams; /* [n_lanes]: the tid of each lane, ascending */
  int32_t min_stage; /* the device's first PP stage (later ones drawn lighter) */
};

struct compare_layout {
  struct schedule_layout l; /* time window from 0, page size, axis and legend position */
  struct compare_side side[2];
  uint32_t n_rows;
  struct compare_row *rows;
};

static void compare_row_lanes(struct compare_row *row, const struct report_dir *d) {
  GArray *tids = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  row->min_stage = INT32_MAX;
  for (guint i = 0; i < row->events->len; i++) {
    const struct report_trace_event *e = &d->trace_events[g_array_index(row->events, uint64_t, i)];
    const struct report_trace_node *n = &d->trace_nodes[e->node];
    g_array_append_val(tids, e->stream);
    if (n->ir_kind == IR_NODE_COMPUTE && n->stage >= 0 && n->stage < row->min_stage)
      row->min_stage = n->stage;
  }
  g_array_sort(tids, piper_cmp_u32);
  row->streams = g_new(uint32_t, tids->len + 1);
  for (guint i = 0; i < tids->len; i++)
    if (row->n_lanes == 0 || row->streams[row->n_lanes - 1] != g_array_index(tids, uint32_t, i))
      row->streams[row->n_lanes++] = g_array_index(tids, uint32_t, i);
  g_array_free(tids, TRUE);
}

/* The rows: for each device drawn (chart_pick_devices over A's devices), A's row then B's. */
static void compare_rows(struct compare_layout *c) {
  const struct report_dir *a = c->side[0].d;
  struct report_run devs = {.n_devices = a->n_devices, .devices = a->devices, .pp = a->pp};
  uint32_t n_dev;
  uint32_t *picked = chart_pick_devices(&devs, MAX_ROWS / 2, &n_dev);
  uint32_t *row_of = g_new(uint32_t, a->n_devices + 1);
  for (uint32_t i = 0; i < a->n_devices; i++)
    row_of[i] = UINT32_MAX;
  c->n_rows = 2 * n_dev;
  c->rows = g_new0(struct compare_row, c->n_rows + 1);
  for (uint32_t k = 0; k < n_dev; k++) {
    row_of[picked[k]] = k;
    for (uint32_t s = 0; s < 2; s++)
      c->rows[2 * k + s] =
          (struct compare_row){s, picked[k], g_array_new(FALSE, FALSE, 8), 0, NULL, INT32_MAX};
  }
  for (uint32_t s = 0; s < 2; s++) {
    const struct report_dir *d = c->side[s].d;
    for (uint64_t i = 0; i < d->n_trace_events; i++) {
      const struct report_trace_event *e = &d->trace_events[i];
      uint32_t dev = d->trace_nodes[e->node].device;
      if (e->step == c->side[s].step && dev < a->n_devices && row_of[dev] != UINT32_MAX)
        g_array_append_val(c->rows[2 * row_of[dev] + s].events, i);
    }
  }
  for (uint32_t r = 0; r < c->n_rows; r++)
    compare_row_lanes(&c->rows[r], c->side[c->rows[r].side].d);
  g_free(row_of);
  g_free(picked);
}

#define PAIR_GAP 10.0 /* extra space between one device's pair of rows and the next */

/* A row's height: its lanes, two at least so that its two-line label fits. */
static double compare_row_height(const struct compare_row *row) {
  return (row->n_lanes > 2 ? row->n_lanes : 2) * LANE_H;
}

static void compare_layout_init(struct compare_layout *c, const struct report_dir *a,
                                const struct report_dir *b) {
  memset(c, 0, sizeof *c);
  c->side[0] = compare_side_of(a);
  c->side[1] = compare_side_of(b);
  compare_rows(c);
  struct schedule_layout *l = &c->l;
  l->t0 = 0;
  l->t1 = fmax(c->side[0].t1 - c->side[0].t0, c->side[1].t1 - c->side[1].t0);
  if (!(l->t1 > 0))
    l->t1 = 1e-3;
  l->sx = PLOT_W / l->t1;
  l->mb_tag = -1;
  l->height = TOP;
  for (uint32_t r = 0; r < c->n_rows; r++)
    l->height += compare_row_height(&c->rows[r]) + ROW_GAP + (r % 2 ? PAIR_GAP : 0);
  l->axis_y = l->height + 4;
  l->height += 40 + 28 * 2; /* axis, legend */
  l->width = LEFT + PLOT_W + RIGHT;
}

static void compare_layout_free(struct compare_layout *c) {
  for (uint32_t r = 0; r < c->n_rows; r++) {
    g_array_free(c->rows[r].events, TRUE);
    g_free(c->rows[r].streams);
  }
  g_free(c->rows);
}

static const char *compare_role(const struct report_dir *d) {
  return strcmp(d->kind, "exec") == 0 ? "measured" : "simulated";
}

/* "measured, step 7 (12.3 ms)" */
static void compare_side_text(const struct compare_side *s, char *buf, size_t len) {
  double span = s->t1 - s->t0;
  if (s->d->n_trace_steps > 1)
    snprintf(buf, len, "%s, step %u (%.4g ms)", compare_role(s->d), s->d->trace_steps[s->step],
             span * 1e3);
  else
    snprintf(buf, len, "%s (%.4g ms)", compare_role(s->d), span * 1e3);
}

static void draw_compare_title(cairo_t *cr, const struct compare_layout *c) {
  const struct report_dir *a = c->side[0].d;
  char sa[96], sb[96], title[512];
  compare_side_text(&c->side[0], sa, sizeof sa);
  compare_side_text(&c->side[1], sb, sizeof sb);
  snprintf(title, sizeof title, "%s · %s · pp %u × dp %u · %u micro-batches · A: %s above B: %s",
           a->model, a->schedule, a->pp, a->dp, a->num_microbatches, sa, sb);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_set_font_size(cr, 15);
  text_at(cr, LEFT, 28, title, 0);
  cairo_set_font_size(cr, 11);
  cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
  text_at(cr, LEFT, 46, "each side's step starts at t = 0", 0);
}

static const char *compare_lane_name(const struct report_dir *d, uint32_t device, uint32_t tid) {
  for (uint32_t i = 0; i < d->n_trace_threads; i++)
    if (d->trace_threads[i].device == device && d->trace_threads[i].stream == tid)
      return d->trace_threads[i].name;
  return NULL;
}

static double draw_compare_row(cairo_t *cr, const struct compare_layout *c, uint32_t r, double y) {
  const struct compare_row *row = &c->rows[r];
  const struct compare_side *side = &c->side[row->side];
  const struct report_dir *d = side->d;
  uint32_t n_lanes = row->n_lanes ? row->n_lanes : 1;
  double row_h = compare_row_height(row);
  char label[64], sublabel[64];
  snprintf(label, sizeof label, "device %u · %s", row->device, row->side ? "B" : "A");
  snprintf(sublabel, sizeof sublabel, "%s", compare_role(d));
  const char **names = g_new0(const char *, n_lanes + 1);
  for (uint32_t k = 0; k < row->n_lanes; k++)
    names[k] = compare_lane_name(d, row->device, row->streams[k]);
  draw_row_frame(cr, label, sublabel, names, n_lanes, row->side, y, row_h);
  g_free(names);
  cairo_set_font_size(cr, 9);
  for (guint i = 0; i < row->events->len; i++) {
    const struct report_trace_event *e = &d->trace_events[g_array_index(row->events, uint64_t, i)];
    const struct report_trace_node *n = &d->trace_nodes[e->node];
    bool compute = n->ir_kind == IR_NODE_COMPUTE || n->ir_kind == IR_NODE_OPTIMIZER;
    struct chart_box b = {e->start_s - side->t0, e->start_s + e->dur_s - side->t0,
                          kind_colour(n->ir_kind, n->pass), !compute, n->micro_batch};
    if (n->ir_kind == IR_NODE_COMPUTE && n->stage > row->min_stage)
      b.colour = lighten(b.colour, 0.35);
    uint32_t lane = 0;
    while (lane + 1 < row->n_lanes && row->streams[lane] != e->stream)
      lane++;
    draw_box(cr, &c->l, &b, y + lane * LANE_H);
  }
  return row_h;
}

static void draw_compare(cairo_t *cr, const void *what) {
  const struct compare_layout *c = what;
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  draw_compare_title(cr, c);
  draw_time_axis(cr, &c->l);
  double y = TOP;
  for (uint32_t r = 0; r < c->n_rows; r++)
    y += draw_compare_row(cr, c, r, y) + ROW_GAP + (r % 2 ? PAIR_GAP : 0);
  draw_legend(cr, &c->l);
}

bool chart_compare(const struct report_dir *a, const struct report_dir *b, const char *path,
                   GError **err) {
  struct compare_layout c;
  compare_layout_init(&c, a, b);
  bool ok = write_chart(path, &c.l, CHART_PNG, draw_compare, &c, err);
  compare_layout_free(&c);
  return ok;
}

/* ---- gnuplot charts ------------------------------------------------------------------------ */

bool chart_gnuplot_available(void) {
  char *path = g_find_program_in_path("gnuplot");
  g_free(path);
  return path != NULL;
}

/* Reads fd to its end into s (a child's standard error). */
static void read_fd(int fd, GString *s) {
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0)
      g_string_append_len(s, buf, n);
}

/* Reads a file descriptor's whole content from its start. */
static bool read_back(int fd, GByteArray *into) {
  if (lseek(fd, 0, SEEK_SET) != 0)
    return false;
  guint8 buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return false;
    g_byte_array_append(into, buf, (guint)n);
  }
  return true;
}

/* A PNG ends with its IEND chunk: anything shorter was cut off. */
static bool png_complete(const GByteArray *png) {
  static const guint8 iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  return png->len >= 8 + sizeof iend && memcmp(png->data, "\x89PNG", 4) == 0 &&
         memcmp(png->data + png->len - sizeof iend, iend, sizeof iend) == 0;
}

/* Waits for gnuplot and turns a failure into an error carrying its first line of stderr. */
static bool gnuplot_wait(GPid pid, int err_fd, const char *dir, const char *script,
                         GError **err) {
  GString *errout = g_string_new("");
  read_fd(err_fd, errout);
  close(err_fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  g_spawn_close_pid(pid);
  bool ok = g_spawn_check_wait_status(status, NULL);
  if (!ok) {
    char *nl = strchr(errout->str, '\n');
    if (nl)
      *nl = 0;
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s/%s: gnuplot failed: %s", dir, script,
                *errout->str ? errout->str : "(no message)");
  }
  g_string_free(errout, TRUE);
  return ok;
}

/* Runs gnuplot on dir/script with its picture on standard output (the script sets its own output
 * only when piper_stdout is undefined, so a user re-running it gets the file) into png. */
static bool gnuplot_render(const char *dir, const char *script, GByteArray *png, GError **err) {
  GError *e = NULL;
  char *tmp_name = NULL;
  int out_fd = g_file_open_tmp("piper-gnuplot-XXXXXX", &tmp_name, &e);
  if (out_fd < 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s/%s: %s", dir, script, e->message);
    g_error_free(e);
    return false;
  }
  g_unlink(tmp_name); /* the descriptor is all that is needed */
  g_free(tmp_name);
  const gchar *argv[] = {"gnuplot", "-e", "piper_stdout = 1", script, NULL};
  GPid pid;
  int err_fd = -1;
  bool ok = g_spawn_async_with_pipes_and_fds(dir, argv, NULL,
                                             G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD, NULL,
                                             NULL, -1, out_fd, -1, NULL, NULL, 0, &pid, NULL, NULL,
                                             &err_fd, &e);
  if (!ok) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s/%s: cannot run gnuplot: %s", dir, script,
                e->message);
    g_error_free(e);
  } else {
    ok = gnuplot_wait(pid, err_fd, dir, script, err);
    if (ok && !read_back(out_fd, png)) {
      g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s/%s: cannot read gnuplot's output: %s",
                  dir, script, strerror(errno));
      ok = false;
    }
  }
  close(out_fd);
  return ok;
}

bool chart_run_gnuplot(const char *dir, const char *script, const char *output, GError **err) {
  GByteArray *png = g_byte_array_new();
  GError *e = NULL;
  bool ok = gnuplot_render(dir, script, png, &e);
  char *path = g_build_filename(dir, output, NULL);
  if (ok && !png_complete(png)) {
    g_set_error(&e, PIPER_ERROR, PIPER_ERROR_RUNTIME,
                "%s: gnuplot's picture is not a complete PNG (%u bytes)", path, png->len);
    ok = false;
  }
  if (ok)
    ok = piper_write_file(path, png->data, png->len, &e);
  if (!ok)
    g_propagate_error(err, e);
  g_free(path);
  g_byte_array_free(png, TRUE);
  return ok;
}

/* The time window and the units the memory chart uses. */
struct memory_axes {
  double t0, t1;
  bool secs, gibs;
  double scale, mem_unit;
};

static struct memory_axes memory_axes(const struct report_run *r, const uint32_t *rows,
                                      uint32_t n) {
  struct memory_axes a;
  double t0 = INFINITY, t1 = -INFINITY;
  for (uint32_t i = 0; i < r->n_devices; i++)
    for (uint32_t k = 0; k < r->devices[i].n_intervals; k++) {
      if (r->devices[i].intervals[k].start < t0)
        t0 = r->devices[i].intervals[k].start;
      if (r->devices[i].intervals[k].end > t1)
        t1 = r->devices[i].intervals[k].end;
    }
  if (!isfinite(t0))
    t0 = t1 = 0;
  a.t0 = t0;
  a.t1 = t1;
  a.secs = t1 - t0 >= 1;
  a.scale = a.secs ? 1 : 1e3;
  /* GiB for real models, MiB for the tiny ones (whose peaks are a few MiB) */
  uint64_t top = 0;
  for (uint32_t i = 0; i < n; i++)
    if (r->devices[rows[i]].peak_memory_bytes > top)
      top = r->devices[rows[i]].peak_memory_bytes;
  a.gibs = top >= (1ull << 30);
  a.mem_unit = a.gibs ? (double)(1ull << 30) : (double)(1ull << 20);
  return a;
}

/* memory.dat: one gnuplot data block per device: time, total memory (a step function). */
static bool write_memory_dat(const struct report_run *r, const uint32_t *rows, uint32_t n,
                             const struct memory_axes *a, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  for (uint32_t i = 0; i < n; i++) {
    const struct report_device *d = &r->devices[rows[i]];
    fprintf(f, "# device %u (pp %d, dp %d)\n", d->device, d->pp_rank, d->dp_rank);
    uint64_t last = 0;
    for (uint32_t k = 0; k < d->n_memory; k++) {
      uint64_t tot = 0;
      for (int j = 0; j < REPORT_MEM_KIND_COUNT; j++)
        tot += d->memory[k].bytes[j];
      double t = d->memory[k].t - a->t0;
      if (t < 0)
        t = 0;
      fprintf(f, "%.9g %.6f\n", t * a->scale, (double)tot / a->mem_unit);
      last = tot;
    }
    fprintf(f, "%.9g %.6f\n\n\n", (a->t1 - a->t0) * a->scale, (double)last / a->mem_unit);
  }
  return piper_out_close(&out, err);
}

static bool write_memory_gp(const struct report_run *r, const uint32_t *rows, uint32_t n,
                            const struct memory_axes *a, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  fprintf(f,
          "set terminal pngcairo size 1400,700 font 'sans,11'\n"
          "%s"
          "set title 'Memory per device: %s, %s'\n"
          "set xlabel 'time (%s)'\nset ylabel 'memory (%s)'\n"
          "set grid\nset key outside right top\nset yrange [0:*]\n"
          "plot ",
          CHART_GNUPLOT_OUTPUT("memory.png"), r->plan->model->name,
          r->schedule ? r->schedule : "custom", a->secs ? "s" : "ms", a->gibs ? "GiB" : "MiB");
  for (uint32_t i = 0; i < n; i++) {
    const struct report_device *d = &r->devices[rows[i]];
    /* Data-parallel replicas often hold the same memory: later ranks are drawn dashed and
     * thinner so a replica lying on top of another stays visible. */
    fprintf(f,
            "%s'memory.dat' index %u using 1:2 with steps lw %d dt %d title 'dev %u (pp %d, dp %d)'",
            i ? ", \\\n     " : "", i, d->dp_rank > 0 ? 1 : 2, d->dp_rank > 0 ? 2 : 1, d->device,
            d->pp_rank, d->dp_rank);
  }
  if (n == 0)
    fprintf(f, "0 notitle");
  fputc('\n', f);
  return piper_out_close(&out, err);
}

bool chart_memory(const struct report_run *r, const char *dir, GError **err) {
  uint32_t n;
  uint32_t *rows = chart_pick_devices(r, 16, &n);
  struct memory_axes a = memory_axes(r, rows, n);
  char *dat = g_build_filename(dir, "memory.dat", NULL);
  char *gp = g_build_filename(dir, "memory.gp", NULL);
  bool ok = write_memory_dat(r, rows, n, &a, dat, err) && write_memory_gp(r, rows, n, &a, gp, err) &&
            chart_run_gnuplot(dir, "memory.gp", "memory.png", err);
  g_free(rows);
  g_free(dat);
  g_free(gp);
  return ok;
}

/* ---- every chart of a run ------------------------------------------------------------------ */

static bool schedule_chart_file(const struct report_run *r, const char *dir, const char *name,
                                enum chart_format f, GString *written, GError **err) {
  char *path = g_build_filename(dir, name, NULL);
  bool ok = chart_schedule(r, path, f, err);
  g_free(path);
  if (ok && written)
    g_string_append_printf(written, " %s", name);
  return ok;
}

bool report_write_charts(const struct report_run *r, const char *dir, enum chart_format f,
                         GString *written, GError **err) {
  /* the names go into `written` in the order piper-sim has always listed them */
  GString *schedule = g_string_new("");
  bool ok = schedule_chart_file(r, dir, "schedule.png", CHART_PNG, schedule, err) &&
            schedule_chart_file(r, dir, "schedule.svg", CHART_SVG, schedule, err) &&
            (f != CHART_PDF || schedule_chart_file(r, dir, "schedule.pdf", CHART_PDF, written, err));
  if (ok && written)
    g_string_append(written, schedule->str);
  g_string_free(schedule, TRUE);
  if (ok && chart_gnuplot_available()) {
    ok = chart_memory(r, dir, err);
    if (ok && written)
      g_string_append(written, " memory.png");
  }
  return ok;
}
