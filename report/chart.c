/* chart: the schedule chart (Cairo) and the memory chart (gnuplot) of a run. */
#include "chart.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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

/* Colours (Tableau 10): passes take the light-to-mid hues, communication dark ones. */
static struct rgb node_colour(const struct ir_node *n) {
  switch (n->kind) {
  case IR_NODE_COMPUTE:
    switch (n->pass) {
    case IR_PASS_F: return hex(0x4E79A7);
    case IR_PASS_B: return hex(0x59A14F);
    case IR_PASS_BI: return hex(0x8CD17D);
    case IR_PASS_BW: return hex(0xF28E2B);
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

bool chart_schedule(const struct report_run *r, const char *path, enum chart_format f,
                    GError **err) {
  const struct plan *p = r->plan;
  uint32_t nrows;
  uint32_t *rows = chart_pick_devices(r, 32, &nrows);
  double t0 = INFINITY, t1 = -INFINITY;
  for (uint32_t i = 0; i < r->n_devices; i++)
    for (uint32_t k = 0; k < r->devices[i].n_intervals; k++) {
      if (r->devices[i].intervals[k].start < t0)
        t0 = r->devices[i].intervals[k].start;
      if (r->devices[i].intervals[k].end > t1)
        t1 = r->devices[i].intervals[k].end;
    }
  if (!isfinite(t0) || t1 <= t0) {
    t0 = 0;
    t1 = 1e-3;
  }
  /* lanes: the streams each drawn device uses */
  uint32_t *lane_of = g_new(uint32_t, (size_t)nrows * (p->n_streams + 1));
  uint32_t *n_lanes = g_new0(uint32_t, nrows + 1);
  double height = TOP;
  for (uint32_t ri = 0; ri < nrows; ri++) {
    const struct report_device *d = &r->devices[rows[ri]];
    uint32_t *lo = lane_of + (size_t)ri * (p->n_streams + 1);
    for (uint32_t s = 0; s < p->n_streams; s++)
      lo[s] = UINT32_MAX;
    for (uint32_t k = 0; k < d->n_intervals; k++)
      if (d->intervals[k].stream < p->n_streams)
        lo[d->intervals[k].stream] = 0;
    for (uint32_t s = 0; s < p->n_streams; s++)
      if (lo[s] != UINT32_MAX)
        lo[s] = n_lanes[ri]++;
    if (n_lanes[ri] == 0)
      n_lanes[ri] = 1;
    height += n_lanes[ri] * LANE_H + ROW_GAP;
  }
  double axis_y = height + 4;
  height += 40;     /* axis */
  height += 28 * 2; /* legend, two lines */
  double width = LEFT + PLOT_W + RIGHT;

  cairo_surface_t *surf;
  if (f == CHART_PNG)
    surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, (int)width, (int)ceil(height));
  else if (f == CHART_SVG)
    surf = cairo_svg_surface_create(path, width, height);
  else
    surf = cairo_pdf_surface_create(path, width, height);
  if (cairo_surface_status(surf) != CAIRO_STATUS_SUCCESS) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create the chart: %s", path,
                cairo_status_to_string(cairo_surface_status(surf)));
    cairo_surface_destroy(surf);
    g_free(rows);
    g_free(lane_of);
    g_free(n_lanes);
    return false;
  }
  cairo_t *cr = cairo_create(surf);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  /* title */
  char title[512];
  double iter = t1 - t0;
  snprintf(title, sizeof title, "%s · %s · pp %u × dp %u · %u micro-batches · iteration %.4g %s%s",
           p->model->name, r->schedule ? r->schedule : "custom", r->pp, r->dp, p->n_microbatches,
           iter >= 1 ? iter : iter * 1e3, iter >= 1 ? "s" : "ms",
           nrows < r->n_devices ? " · dp rank 0 of each pp rank shown" : "");
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_set_font_size(cr, 16);
  text_at(cr, LEFT, 28, title, 0);

  double sx = PLOT_W / (t1 - t0);
  /* the micro-batch dimension: "MB" (the schedule harness), else the first split dimension */
  int mb_tag = -1;
  for (uint32_t t = 0; t < p->n_tags && t < IR_MAX_TAGS; t++)
    if (strcmp(p->tag_names[t], "MB") == 0)
      mb_tag = (int)t;
  if (mb_tag < 0 && p->model->n_tags < p->n_tags)
    mb_tag = (int)p->model->n_tags;
  /* time grid */
  double unit = iter >= 1 ? 1 : 1e-3;
  const char *unit_name = iter >= 1 ? "s" : "ms";
  double step = nice_step(iter / unit, 10) * unit;
  cairo_set_font_size(cr, 11);
  for (double t = 0; t <= iter * 1.0001; t += step) {
    double x = LEFT + t * sx;
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_set_line_width(cr, 1);
    cairo_move_to(cr, x, TOP - 6);
    cairo_line_to(cr, x, axis_y);
    cairo_stroke(cr);
    char lab[32];
    snprintf(lab, sizeof lab, "%g", round(t / unit * 1e6) / 1e6);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text_at(cr, x, axis_y + 16, lab, 0.5);
  }
  char axis_label[32];
  snprintf(axis_label, sizeof axis_label, "time (%s)", unit_name);
  cairo_set_font_size(cr, 12);
  text_at(cr, LEFT + PLOT_W / 2, axis_y + 34, axis_label, 0.5);

  /* stages of each drawn device in order, to shade its second chunk lighter (V / interleaved) */
  double y = TOP;
  for (uint32_t ri = 0; ri < nrows; ri++) {
    const struct report_device *d = &r->devices[rows[ri]];
    const uint32_t *lo = lane_of + (size_t)ri * (p->n_streams + 1);
    double row_h = n_lanes[ri] * LANE_H;
    int32_t min_stage = INT32_MAX;
    for (uint32_t k = 0; k < d->n_intervals; k++) {
      const struct ir_node *n = &p->nodes[d->intervals[k].node];
      if (n->kind == IR_NODE_COMPUTE && n->tags[MODEL_TAG_PP] >= 0 &&
          n->tags[MODEL_TAG_PP] < min_stage)
        min_stage = n->tags[MODEL_TAG_PP];
    }
    /* row background and labels */
    cairo_set_source_rgb(cr, ri % 2 ? 0.965 : 0.985, ri % 2 ? 0.965 : 0.985,
                         ri % 2 ? 0.965 : 0.985);
    cairo_rectangle(cr, LEFT, y, PLOT_W, row_h);
    cairo_fill(cr);
    /* device and ranks on two short lines at the left edge, clear of the stream names */
    char lab[64];
    snprintf(lab, sizeof lab, "device %u", d->device);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    cairo_set_font_size(cr, 12);
    text_at(cr, 8, y + LANE_H - 4, lab, 0);
    snprintf(lab, sizeof lab, "pp %d · dp %d", d->pp_rank, d->dp_rank);
    cairo_set_font_size(cr, 10);
    cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
    text_at(cr, 8, y + LANE_H + 9, lab, 0);
    cairo_set_font_size(cr, 9);
    cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
    for (uint32_t s = 0; s < p->n_streams; s++)
      if (lo[s] != UINT32_MAX)
        text_at(cr, LEFT - 4, y + lo[s] * LANE_H + 11, p->streams[s].name, 1);
    /* boxes */
    cairo_set_font_size(cr, 9);
    for (uint32_t k = 0; k < d->n_intervals; k++) {
      const struct report_interval *iv = &d->intervals[k];
      if (iv->stream >= p->n_streams || lo[iv->stream] == UINT32_MAX)
        continue;
      const struct ir_node *n = &p->nodes[iv->node];
      bool comm = !report_node_is_compute(n);
      double x0 = LEFT + (iv->start - t0) * sx, x1 = LEFT + (iv->end - t0) * sx;
      if (x1 - x0 < 0.6)
        x1 = x0 + 0.6; /* zero-cost ops stay visible as hairlines */
      double ly = y + lo[iv->stream] * LANE_H;
      double by = comm ? ly + (LANE_H - COMM_H) / 2 : ly + 1, bh = comm ? COMM_H : LANE_H - 2;
      struct rgb c = node_colour(n);
      if (!comm && n->tags[MODEL_TAG_PP] > min_stage && n->kind == IR_NODE_COMPUTE)
        c = lighten(c, 0.35); /* the rank's later stage (chunk) */
      cairo_set_source_rgb(cr, c.r, c.g, c.b);
      cairo_rectangle(cr, x0, by, x1 - x0, bh);
      cairo_fill(cr);
      if (x1 - x0 >= 3) { /* a white edge separates back-to-back boxes */
        cairo_set_source_rgb(cr, 1, 1, 1);
        cairo_set_line_width(cr, 0.6);
        cairo_rectangle(cr, x0 + 0.3, by + 0.3, x1 - x0 - 0.6, bh - 0.6);
        cairo_stroke(cr);
      }
      /* micro-batch label, only where it fits */
      int mb = mb_tag >= 0 ? n->tags[mb_tag] : -1;
      if (!comm && mb >= 0) {
        char ml[16];
        snprintf(ml, sizeof ml, "%d", mb);
        cairo_text_extents_t te;
        cairo_text_extents(cr, ml, &te);
        if (te.x_advance + 2 <= x1 - x0) {
          cairo_set_source_rgb(cr, 1, 1, 1);
          text_at(cr, (x0 + x1) / 2, ly + 11.5, ml, 0.5);
        }
      }
    }
    y += row_h + ROW_GAP;
  }
  /* legend */
  double lx = LEFT, ly = axis_y + 50;
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

  cairo_destroy(cr);
  bool ok = true;
  if (f == CHART_PNG) {
    cairo_status_t st = cairo_surface_write_to_png(surf, path);
    if (st != CAIRO_STATUS_SUCCESS) {
      g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s", path,
                  cairo_status_to_string(st));
      ok = false;
    }
  }
  cairo_surface_finish(surf);
  if (ok && cairo_surface_status(surf) != CAIRO_STATUS_SUCCESS) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s", path,
                cairo_status_to_string(cairo_surface_status(surf)));
    ok = false;
  }
  cairo_surface_destroy(surf);
  g_free(rows);
  g_free(lane_of);
  g_free(n_lanes);
  return ok;
}

/* ---- gnuplot charts ------------------------------------------------------------------------ */

bool chart_run_gnuplot(const char *dir, const char *script, GError **err) {
  gchar *argv[] = {(gchar *)"gnuplot", (gchar *)script, NULL};
  gchar *out = NULL, *errout = NULL;
  gint status = 0;
  GError *e = NULL;
  if (!g_spawn_sync(dir, argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, &out, &errout, &status, &e)) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s/%s: cannot run gnuplot: %s", dir, script,
                e->message);
    g_error_free(e);
    g_free(out);
    g_free(errout);
    return false;
  }
  bool ok = g_spawn_check_wait_status(status, NULL);
  if (!ok) {
    char *nl = errout ? strchr(errout, '\n') : NULL;
    if (nl)
      *nl = 0;
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s/%s: gnuplot failed: %s", dir, script,
                errout && *errout ? errout : "(no message)");
  }
  g_free(out);
  g_free(errout);
  return ok;
}

bool chart_memory(const struct report_run *r, const char *dir, GError **err) {
  uint32_t n;
  uint32_t *rows = chart_pick_devices(r, 16, &n);
  char *dat = g_build_filename(dir, "memory.dat", NULL);
  char *gp = g_build_filename(dir, "memory.gp", NULL);
  bool ok = false;
  FILE *f = fopen(dat, "w");
  if (!f) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s", dat,
                strerror(errno));
    goto out;
  }
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
  bool secs = t1 - t0 >= 1;
  double scale = secs ? 1 : 1e3;
  /* GiB for real models, MiB for the tiny ones (whose peaks are a few MiB) */
  uint64_t top = 0;
  for (uint32_t i = 0; i < n; i++)
    if (r->devices[rows[i]].peak_memory_bytes > top)
      top = r->devices[rows[i]].peak_memory_bytes;
  bool gibs = top >= (1ull << 30);
  double mem_unit = gibs ? (double)(1ull << 30) : (double)(1ull << 20);
  /* one gnuplot data block per device: time, total GiB (a step function) */
  for (uint32_t i = 0; i < n; i++) {
    const struct report_device *d = &r->devices[rows[i]];
    fprintf(f, "# device %u (pp %d, dp %d)\n", d->device, d->pp_rank, d->dp_rank);
    uint64_t last = 0;
    for (uint32_t k = 0; k < d->n_memory; k++) {
      uint64_t tot = 0;
      for (int j = 0; j < REPORT_MEM_KIND_COUNT; j++)
        tot += d->memory[k].bytes[j];
      double t = d->memory[k].t - t0;
      if (t < 0)
        t = 0;
      fprintf(f, "%.9g %.6f\n", t * scale, (double)tot / mem_unit);
      last = tot;
    }
    fprintf(f, "%.9g %.6f\n\n\n", (t1 - t0) * scale, (double)last / mem_unit);
  }
  fclose(f);
  f = fopen(gp, "w");
  if (!f) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write: %s", gp, strerror(errno));
    goto out;
  }
  fprintf(f,
          "set terminal pngcairo size 1400,700 font 'sans,11'\n"
          "set output 'memory.png'\n"
          "set title 'Memory per device: %s, %s'\n"
          "set xlabel 'time (%s)'\nset ylabel 'memory (%s)'\n"
          "set grid\nset key outside right top\nset yrange [0:*]\n"
          "plot ",
          r->plan->model->name, r->schedule ? r->schedule : "custom", secs ? "s" : "ms",
          gibs ? "GiB" : "MiB");
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
  fclose(f);
  ok = chart_run_gnuplot(dir, "memory.gp", err);
out:
  g_free(rows);
  g_free(dat);
  g_free(gp);
  return ok;
}
