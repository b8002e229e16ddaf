/* chart: the what-if chart (Cairo): throughput against peak memory, one point per configuration,
 * colour by schedule, marker by profile, a memory-cap line per profile, labels placed where they
 * overlap nothing. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../base/base.h"
#include "chart-impl.h"

#define PT_W 1400.0
#define PT_H 860.0
#define PT_LEFT 96.0
#define PT_RIGHT 330.0 /* legend column */
#define PT_TOP 64.0
#define PT_BOTTOM 92.0
#define PT_MARKER 6.0
#define PT_MAX_LABELS 40

/* Schedules get colours in order of first appearance (Tableau 10, then two more); profiles get
 * markers the same way. */
static const unsigned point_palette[] = {0x4E79A7, 0xF28E2B, 0x59A14F, 0xE15759, 0x76B7B2, 0xEDC948,
                                         0xB07AA1, 0xFF9DA7, 0x9C755F, 0x79706E, 0x17BECF, 0x8C564B};
enum marker { MARK_CIRCLE, MARK_SQUARE, MARK_TRIANGLE, MARK_DIAMOND, MARK_DOWN, MARK_COUNT };

struct rect {
  double x0, y0, x1, y1;
};

/* What the chart is drawn from: the points, their keys, the axes. */
struct points_chart {
  const char *title;
  const struct chart_point *p;
  uint32_t n;
  const char **schedules, **profiles; /* distinct keys, first-appearance order */
  uint32_t n_schedules, n_profiles;
  double *profile_cap; /* [n_profiles] bytes, 0: none */
  double x_min, x_max, y_min, y_max, unit; /* axes: bytes, tokens/s; bytes per axis unit */
  const char *unit_name;
  double y_scale;         /* tokens/s per throughput tick unit (1, 1e3, 1e6) */
  const char *y_suffix;   /* "", "k", "M" */
  bool *pareto;           /* [n] on the front */
  uint32_t n_outside;     /* simulated points beyond the axes */
  GArray *taken; /* struct rect: what a label must not cover */
  GString *listing; /* what was drawn (chart_points_listed), or NULL */
};

static uint32_t key_index(const char **keys, uint32_t *n, const char *key) {
  for (uint32_t i = 0; i < *n; i++)
    if (strcmp(keys[i], key) == 0)
      return i;
  keys[*n] = key;
  return (*n)++;
}

static void set_hex(cairo_t *cr, unsigned v, double alpha) {
  cairo_set_source_rgba(cr, ((v >> 16) & 255) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0,
                        alpha);
}

static unsigned schedule_colour(const struct points_chart *c, const char *schedule) {
  for (uint32_t i = 0; i < c->n_schedules; i++)
    if (strcmp(c->schedules[i], schedule) == 0)
      return point_palette[i % G_N_ELEMENTS(point_palette)];
  return 0x333333;
}

static enum marker profile_marker(const struct points_chart *c, const char *profile) {
  for (uint32_t i = 0; i < c->n_profiles; i++)
    if (strcmp(c->profiles[i], profile) == 0)
      return (enum marker)(i % MARK_COUNT);
  return MARK_CIRCLE;
}

/* The Pareto front of throughput against memory: no other point has less memory and more
 * throughput. Among the points under their cap when there are any (the trade-off a user can
 * take), else among all simulated ones. */
static void find_pareto(struct points_chart *c, bool any_feasible) {
  const struct chart_point *p = c->p;
  uint32_t *idx = g_new(uint32_t, c->n + 1), m = 0;
  for (uint32_t i = 0; i < c->n; i++)
    if (p[i].ok && (p[i].feasible || !any_feasible))
      idx[m++] = i;
  /* by memory, then throughput descending: a sweep keeps each new best throughput */
  for (uint32_t a = 1; a < m; a++)
    for (uint32_t b = a; b > 0; b--) {
      const struct chart_point *x = &p[idx[b - 1]], *y = &p[idx[b]];
      bool after = x->peak_memory_bytes > y->peak_memory_bytes ||
                   (x->peak_memory_bytes == y->peak_memory_bytes &&
                    x->throughput_tokens_per_s < y->throughput_tokens_per_s);
      if (!after)
        break;
      uint32_t t = idx[b - 1];
      idx[b - 1] = idx[b];
      idx[b] = t;
    }
  double best = -1;
  for (uint32_t k = 0; k < m; k++)
    if (p[idx[k]].throughput_tokens_per_s > best) {
      best = p[idx[k]].throughput_tokens_per_s;
      c->pareto[idx[k]] = true;
    }
  g_free(idx);
}

/* The axes span where the answers are: the points under a cap, the top picks and the front (all
 * simulated points when none fits), the caps within reach of them, then every point inside that
 * memory range for the throughput axis; a margin each side. Zero is no answer: a 1,300 GiB
 * configuration no longer squeezes the ones that fit into a corner. */
static void set_axes(struct points_chart *c, bool any_feasible) {
  const struct chart_point *p = c->p;
  double xlo = INFINITY, xhi = 0;
  for (uint32_t i = 0; i < c->n; i++)
    if (p[i].ok && (p[i].feasible || p[i].top || c->pareto[i] || !any_feasible)) {
      xlo = fmin(xlo, p[i].peak_memory_bytes);
      xhi = fmax(xhi, p[i].peak_memory_bytes);
    }
  if (!(xhi > 0)) {
    xlo = 0;
    xhi = 1 << 30;
  }
  for (uint32_t i = 0; i < c->n_profiles; i++)
    if (c->profile_cap[i] > 0 && c->profile_cap[i] <= 3 * xhi && c->profile_cap[i] >= xlo / 3) {
      xlo = fmin(xlo, c->profile_cap[i]);
      xhi = fmax(xhi, c->profile_cap[i]);
    }
  double span = xhi - xlo > 0 ? xhi - xlo : fmax(xhi, 1) * 0.2;
  c->x_min = fmax(0, xlo - 0.06 * span);
  c->x_max = xhi + 0.08 * span;
  double ylo = INFINITY, yhi = 0;
  for (uint32_t i = 0; i < c->n; i++)
    if (p[i].ok && p[i].peak_memory_bytes >= c->x_min && p[i].peak_memory_bytes <= c->x_max) {
      ylo = fmin(ylo, p[i].throughput_tokens_per_s);
      yhi = fmax(yhi, p[i].throughput_tokens_per_s);
    }
  if (!(yhi > 0)) {
    ylo = 0;
    yhi = 1;
  }
  span = yhi - ylo > 0 ? yhi - ylo : yhi * 0.2;
  c->y_min = fmax(0, ylo - 0.08 * span);
  c->y_max = yhi + 0.1 * span;
  bool gib = c->x_max >= (double)(1ull << 30);
  c->unit = gib ? (double)(1ull << 30) : (double)(1ull << 20);
  c->unit_name = gib ? "GiB" : "MiB";
  c->y_scale = c->y_max >= 1e6 ? 1e6 : c->y_max >= 1e4 ? 1e3 : 1;
  c->y_suffix = c->y_scale == 1e6 ? "M" : c->y_scale == 1e3 ? "k" : "";
  for (uint32_t i = 0; i < c->n; i++)
    c->n_outside += p[i].ok && (p[i].peak_memory_bytes < c->x_min ||
                                p[i].peak_memory_bytes > c->x_max ||
                                p[i].throughput_tokens_per_s < c->y_min ||
                                p[i].throughput_tokens_per_s > c->y_max);
  if (c->listing) {
    g_string_append_printf(c->listing, "x-axis %.6g %.6g %s\n", c->x_min / c->unit,
                           c->x_max / c->unit, c->unit_name);
    g_string_append_printf(c->listing, "y-axis %.6g %.6g\n", c->y_min, c->y_max);
  }
}

/* The keys, each profile's cap (the largest its points were judged against), the front and
 * the axes. */
static void points_chart_init(struct points_chart *c, const char *title,
                              const struct chart_point *p, uint32_t n, GString *listing) {
  memset(c, 0, sizeof *c);
  c->title = title;
  c->p = p;
  c->n = n;
  c->listing = listing;
  c->schedules = g_new0(const char *, n + 1);
  c->profiles = g_new0(const char *, n + 1);
  c->profile_cap = g_new0(double, n + 1);
  c->pareto = g_new0(bool, n + 1);
  bool any_feasible = false;
  for (uint32_t i = 0; i < n; i++) {
    if (!p[i].ok)
      continue;
    key_index(c->schedules, &c->n_schedules, p[i].schedule);
    uint32_t pi = key_index(c->profiles, &c->n_profiles, p[i].profile);
    c->profile_cap[pi] = fmax(c->profile_cap[pi], p[i].memory_cap_bytes);
    any_feasible |= p[i].feasible;
  }
  find_pareto(c, any_feasible);
  set_axes(c, any_feasible);
  c->taken = g_array_new(FALSE, FALSE, sizeof(struct rect));
}

static void points_chart_free(struct points_chart *c) {
  g_free(c->pareto);
  g_free(c->schedules);
  g_free(c->profiles);
  g_free(c->profile_cap);
  g_array_free(c->taken, TRUE);
}

static double px(const struct points_chart *c, double bytes) {
  return PT_LEFT + (bytes - c->x_min) / (c->x_max - c->x_min) * (PT_W - PT_LEFT - PT_RIGHT);
}
static double py(const struct points_chart *c, double tput) {
  return PT_H - PT_BOTTOM - (tput - c->y_min) / (c->y_max - c->y_min) * (PT_H - PT_TOP - PT_BOTTOM);
}

static bool inside(const struct points_chart *c, const struct chart_point *p) {
  return p->ok && p->peak_memory_bytes >= c->x_min && p->peak_memory_bytes <= c->x_max &&
         p->throughput_tokens_per_s >= c->y_min && p->throughput_tokens_per_s <= c->y_max;
}

/* A tick's text with as many decimals as its step needs, the same for every tick of an axis
 * ("40", "45", "50"; "1.2M", "1.4M"). */
static void tick_text(char *out, size_t size, double v, double step, const char *suffix) {
  int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
  snprintf(out, size, "%.*f%s", decimals, v, suffix);
}

static double tick_step(double span, int want) {
  double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void show_text(cairo_t *cr, double x, double y, const char *s, double align) {
  cairo_text_extents_t te;
  cairo_text_extents(cr, s, &te);
  cairo_move_to(cr, x - align * te.x_advance, y);
  cairo_show_text(cr, s);
}

static void draw_axes(cairo_t *cr, const struct points_chart *c) {
  double x0 = PT_LEFT, x1 = PT_W - PT_RIGHT, y0 = PT_TOP, y1 = PT_H - PT_BOTTOM;
  cairo_set_font_size(cr, 11);
  double xs = tick_step((c->x_max - c->x_min) / c->unit, 8);
  double ys = tick_step((c->y_max - c->y_min) / c->y_scale, 8);
  for (double v = ceil(c->x_min / c->unit / xs) * xs; v <= c->x_max / c->unit * 1.0001; v += xs) {
    double x = px(c, v * c->unit);
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, x, y0);
    cairo_line_to(cr, x, y1);
    cairo_stroke(cr);
    char lab[32];
    tick_text(lab, sizeof lab, v, xs, "");
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    show_text(cr, x, y1 + 16, lab, 0.5);
  }
  for (double v = ceil(c->y_min / c->y_scale / ys) * ys; v <= c->y_max / c->y_scale * 1.0001;
       v += ys) {
    double y = py(c, v * c->y_scale);
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, x0, y);
    cairo_line_to(cr, x1, y);
    cairo_stroke(cr);
    char lab[32];
    tick_text(lab, sizeof lab, v, ys, c->y_suffix);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    show_text(cr, x0 - 6, y + 4, lab, 1);
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_rectangle(cr, x0, y0, x1 - x0, y1 - y0);
  cairo_stroke(cr);
  char xl[64];
  snprintf(xl, sizeof xl, "peak memory per device (%s)", c->unit_name);
  cairo_set_font_size(cr, 13);
  show_text(cr, (x0 + x1) / 2, y1 + 40, xl, 0.5);
  cairo_save(cr);
  cairo_translate(cr, 22, (y0 + y1) / 2);
  cairo_rotate(cr, -M_PI / 2);
  show_text(cr, 0, 0, "throughput (tokens/s)", 0.5);
  cairo_restore(cr);
  cairo_set_font_size(cr, 16);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  show_text(cr, x0, 32, c->title, 0);
}

static void marker_path(cairo_t *cr, enum marker m, double x, double y, double r) {
  cairo_new_path(cr); /* no line from where the last text ended */
  switch (m) {
  case MARK_SQUARE: cairo_rectangle(cr, x - r * 0.85, y - r * 0.85, 1.7 * r, 1.7 * r); break;
  case MARK_TRIANGLE:
    cairo_move_to(cr, x, y - r * 1.15);
    cairo_line_to(cr, x + r * 1.05, y + r * 0.75);
    cairo_line_to(cr, x - r * 1.05, y + r * 0.75);
    cairo_close_path(cr);
    break;
  case MARK_DOWN:
    cairo_move_to(cr, x, y + r * 1.15);
    cairo_line_to(cr, x + r * 1.05, y - r * 0.75);
    cairo_line_to(cr, x - r * 1.05, y - r * 0.75);
    cairo_close_path(cr);
    break;
  case MARK_DIAMOND:
    cairo_move_to(cr, x, y - r * 1.2);
    cairo_line_to(cr, x + r * 1.2, y);
    cairo_line_to(cr, x, y + r * 1.2);
    cairo_line_to(cr, x - r * 1.2, y);
    cairo_close_path(cr);
    break;
  default: cairo_arc(cr, x, y, r, 0, 2 * M_PI); break;
  }
}

/* Filled: under its profile's cap; hollow (white inside): over it. */
static void draw_marker(cairo_t *cr, enum marker m, unsigned colour, bool filled, double x,
                        double y) {
  marker_path(cr, m, x, y, PT_MARKER);
  if (filled) {
    set_hex(cr, colour, 0.9);
    cairo_fill_preserve(cr);
  } else {
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_fill_preserve(cr);
  }
  set_hex(cr, colour, 1);
  cairo_set_line_width(cr, filled ? 1 : 2);
  cairo_stroke(cr);
}

static bool overlaps(const struct rect *a, const struct rect *b) {
  return a->x0 < b->x1 && b->x0 < a->x1 && a->y0 < b->y1 && b->y0 < a->y1;
}

/* The first place among eight around (x, y) where a w x h label covers nothing taken and stays
 * in the plot; false when there is none. */
/* r lies inside the plot area and overlaps no label or marker already placed. */
static bool rect_free(const struct points_chart *c, const struct rect *r) {
  if (r->x0 < PT_LEFT + 1 || r->x1 > PT_W - PT_RIGHT - 1 || r->y0 < PT_TOP + 1 ||
      r->y1 > PT_H - PT_BOTTOM - 1)
    return false;
  for (guint i = 0; i < c->taken->len; i++)
    if (overlaps(r, &g_array_index(c->taken, struct rect, i)))
      return false;
  return true;
}

static bool place_label(const struct points_chart *c, double x, double y, double w, double h,
                        struct rect *out) {
  const double d = PT_MARKER + 3;
  const double cand[8][2] = {{d, -h / 2},          {-d - w, -h / 2},     {-w / 2, -d - h},
                             {-w / 2, d},          {d, -d - h},          {-d - w, -d - h},
                             {d, d},               {-d - w, d}};
  for (int k = 0; k < 8; k++) {
    struct rect r = {x + cand[k][0], y + cand[k][1], x + cand[k][0] + w, y + cand[k][1] + h};
    if (rect_free(c, &r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

/* One dashed vertical line per distinct cap (profiles that share a cap share the line), its
 * label at the top; a cap beyond the axis is an arrow at the right edge. */
static void draw_caps(cairo_t *cr, struct points_chart *c) {
  double label_y = PT_TOP + 14;
  cairo_set_font_size(cr, 10);
  for (uint32_t i = 0; i < c->n_profiles; i++) {
    double cap = c->profile_cap[i];
    bool first = cap > 0;
    for (uint32_t j = 0; j < i && first; j++)
      first = c->profile_cap[j] != cap;
    if (!first)
      continue;
    GString *who = g_string_new(NULL);
    for (uint32_t j = i; j < c->n_profiles; j++)
      if (c->profile_cap[j] == cap)
        g_string_append_printf(who, "%s%s", who->len ? ", " : "", c->profiles[j]);
    char lab[256];
    bool beyond = cap > c->x_max, below = cap < c->x_min;
    snprintf(lab, sizeof lab, "%s%s cap %.4g %s", beyond ? "-> " : below ? "<- " : "", who->str,
             cap / c->unit, c->unit_name);
    g_string_free(who, TRUE);
    /* on whole pixels: a line between two columns blurs into neither */
    double x = beyond ? PT_W - PT_RIGHT : below ? PT_LEFT : round(px(c, cap));
    if (c->listing)
      g_string_append_printf(c->listing, "cap %.0f\n", cap);
    cairo_set_source_rgb(cr, 0.75, 0.22, 0.17);
    if (!beyond && !below) {
      const double dash[] = {6, 4};
      cairo_set_dash(cr, dash, 2, 0);
      cairo_set_line_width(cr, 2);
      cairo_move_to(cr, x, PT_TOP);
      cairo_line_to(cr, x, PT_H - PT_BOTTOM);
      cairo_stroke(cr);
      cairo_set_dash(cr, NULL, 0, 0);
    }
    cairo_text_extents_t te;
    cairo_text_extents(cr, lab, &te);
    double lx = x - te.x_advance - 4 < PT_LEFT ? x + 4 : x - te.x_advance - 4;
    show_text(cr, lx, label_y, lab, 0);
    struct rect r = {lx - 1, label_y - 11, lx + te.x_advance + 1, label_y + 3};
    g_array_append_val(c->taken, r);
    label_y += 14; /* the next cap's label one line down: they never overlap */
  }
}

/* A top pick's label: the eight places beside the point, then the same further out on a
 * leader line, then (the plot full) its first place over whatever is there: it is drawn. */
static void place_top_label(const struct points_chart *c, double x, double y, double w, double h,
                            struct rect *out, bool *leader) {
  *leader = false;
  if (place_label(c, x, y, w, h, out))
    return;
  for (int ring = 2; ring <= 12; ring++) {
    const double d = ring * (PT_MARKER + 6);
    const double cand[6][2] = {{d, -h / 2}, {-d - w, -h / 2}, {d, -d}, {-d - w, -d},
                               {d, d - h},  {-d - w, d - h}};
    for (int k = 0; k < 6; k++) {
      struct rect r = {x + cand[k][0], y + cand[k][1], x + cand[k][0] + w, y + cand[k][1] + h};
      if (rect_free(c, &r)) {
        *out = r;
        *leader = true;
        return;
      }
    }
  }
  double lx = fmin(fmax(x + PT_MARKER + 3, PT_LEFT + 1), PT_W - PT_RIGHT - 1 - w);
  *out = (struct rect){lx, y - h / 2, lx + w, y + h / 2};
}

static void point_xy(const struct points_chart *c, const struct chart_point *p, double *x,
                     double *y) {
  *x = px(c, p->peak_memory_bytes);
  *y = py(c, p->throughput_tokens_per_s);
}

/* The front: a dark step line through its points (left to right), each ringed, named at its
 * right end. */
static void draw_pareto(cairo_t *cr, struct points_chart *c) {
  double last_x = -1, last_y = 0;
  cairo_set_source_rgba(cr, 0.1, 0.1, 0.1, 0.75);
  cairo_set_line_width(cr, 1.6);
  uint32_t n_front = 0;
  /* the front's points in memory order: throughput rises along it */
  for (;;) {
    uint32_t next = UINT32_MAX;
    for (uint32_t i = 0; i < c->n; i++)
      if (c->pareto[i] && inside(c, &c->p[i]) && px(c, c->p[i].peak_memory_bytes) > last_x &&
          (next == UINT32_MAX || c->p[i].peak_memory_bytes < c->p[next].peak_memory_bytes))
        next = i;
    if (next == UINT32_MAX)
      break;
    double x, y;
    point_xy(c, &c->p[next], &x, &y);
    if (n_front++ > 0) {
      cairo_move_to(cr, last_x, last_y);
      cairo_line_to(cr, x, last_y);
      cairo_line_to(cr, x, y);
      cairo_stroke(cr);
    }
    cairo_new_path(cr);
    cairo_arc(cr, x, y, PT_MARKER + 3.5, 0, 2 * M_PI);
    cairo_stroke(cr);
    if (c->listing)
      g_string_append_printf(c->listing, "pareto %u\n", next);
    last_x = x;
    last_y = y;
  }
}

/* One label, drawn and taken; with a leader line back to its point when it stands off. */
static void draw_label(cairo_t *cr, struct points_chart *c, uint32_t i, const struct rect *r,
                       bool leader, double x, double y) {
  g_array_append_val(c->taken, *r);
  if (leader) {
    cairo_set_source_rgba(cr, 0.3, 0.3, 0.3, 0.8);
    cairo_set_line_width(cr, 0.8);
    cairo_move_to(cr, x, y);
    cairo_line_to(cr, x < r->x0 ? r->x0 : r->x1, (r->y0 + r->y1) / 2);
    cairo_stroke(cr);
  }
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  show_text(cr, r->x0 + 1, r->y1 - 2.5, c->p[i].label, 0);
  if (c->listing)
    g_string_append_printf(c->listing, "label %u %s\n", i, c->p[i].label);
}

/* Points (markers first, so that no label covers one), the front, then labels: every top
 * pick's (bold), then the front's where there is room. Returns the labels left out. */
static uint32_t draw_points(cairo_t *cr, struct points_chart *c) {
  for (uint32_t i = 0; i < c->n; i++) {
    const struct chart_point *p = &c->p[i];
    if (!inside(c, p))
      continue;
    double x, y;
    point_xy(c, p, &x, &y);
    draw_marker(cr, profile_marker(c, p->profile), schedule_colour(c, p->schedule), p->feasible,
                x, y);
    struct rect r = {x - PT_MARKER - 1, y - PT_MARKER - 1, x + PT_MARKER + 1, y + PT_MARKER + 1};
    g_array_append_val(c->taken, r);
  }
  draw_pareto(cr, c);
  uint32_t left_out = 0, shown = 0;
  for (int pass = 0; pass < 2; pass++) {
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           pass == 0 ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, pass == 0 ? 11 : 10);
    for (uint32_t i = 0; i < c->n; i++) {
      const struct chart_point *p = &c->p[i];
      bool top = p->top && inside(c, p);
      if (!p->label || !p->label[0] || !inside(c, p) || (pass == 0 ? !top : top || !c->pareto[i]))
        continue;
      cairo_text_extents_t te;
      cairo_text_extents(cr, p->label, &te);
      double x, y, w = te.x_advance + 2, h = pass == 0 ? 13 : 12;
      point_xy(c, p, &x, &y);
      struct rect r;
      bool leader = false;
      if (pass == 0)
        place_top_label(c, x, y, w, h, &r, &leader);
      else if (shown >= PT_MAX_LABELS || !place_label(c, x, y, w, h, &r)) {
        left_out++;
        continue;
      }
      draw_label(cr, c, i, &r, leader, x, y);
      shown++;
    }
  }
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  return left_out;
}

static void draw_legend_column(cairo_t *cr, const struct points_chart *c, uint32_t left_out) {
  double x = PT_W - PT_RIGHT + 24, y = PT_TOP + 8;
  cairo_set_font_size(cr, 12);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  show_text(cr, x, y, "schedule (colour)", 0);
  y += 20;
  for (uint32_t i = 0; i < c->n_schedules; i++, y += 18) {
    draw_marker(cr, MARK_CIRCLE, point_palette[i % G_N_ELEMENTS(point_palette)], true, x + 6,
                y - 4);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    show_text(cr, x + 18, y, c->schedules[i], 0);
  }
  y += 12;
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  show_text(cr, x, y, "profile (marker)", 0);
  y += 20;
  for (uint32_t i = 0; i < c->n_profiles; i++, y += 18) {
    draw_marker(cr, (enum marker)(i % MARK_COUNT), 0x555555, true, x + 6, y - 4);
    char lab[160];
    if (c->profile_cap[i] > 0)
      snprintf(lab, sizeof lab, "%s (cap %.4g %s)", c->profiles[i], c->profile_cap[i] / c->unit,
               c->unit_name);
    else
      snprintf(lab, sizeof lab, "%s (no cap)", c->profiles[i]);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    show_text(cr, x + 18, y, lab, 0);
  }
  y += 12;
  draw_marker(cr, MARK_CIRCLE, 0x555555, true, x + 6, y - 4);
  cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
  show_text(cr, x + 18, y, "fits its profile's memory cap", 0);
  y += 18;
  draw_marker(cr, MARK_CIRCLE, 0x555555, false, x + 6, y - 4);
  cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
  show_text(cr, x + 18, y, "over its profile's memory cap", 0);
  y += 18;
  cairo_set_source_rgba(cr, 0.1, 0.1, 0.1, 0.75);
  cairo_set_line_width(cr, 1.6);
  cairo_new_path(cr);
  cairo_arc(cr, x + 6, y - 4, PT_MARKER + 3.5, 0, 2 * M_PI);
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
  show_text(cr, x + 18, y, "Pareto front: no point has less", 0);
  show_text(cr, x + 18, y + 14, "memory and more throughput", 0);
  y += 32;
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  show_text(cr, x, y, "bold labels: the top picks", 0);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  uint32_t failed = 0, bounded = 0;
  for (uint32_t i = 0; i < c->n; i++) {
    failed += !c->p[i].ok && !c->p[i].bounded;
    bounded += c->p[i].bounded;
  }
  GString *note = g_string_new(NULL);
  if (failed)
    g_string_append_printf(note, "%u configuration%s failed and %s not drawn", failed,
                           failed == 1 ? "" : "s", failed == 1 ? "is" : "are");
  if (bounded)
    g_string_append_printf(note, "%s%u over the cap by a memory bound (not simulated)",
                           note->len ? "; " : "", bounded);
  if (c->n_outside)
    g_string_append_printf(note, "%s%u point%s beyond the axes (they span the answers)",
                           note->len ? "; " : "", c->n_outside, c->n_outside == 1 ? "" : "s");
  if (left_out)
    g_string_append_printf(note, "%slabels of %u points left out where they would overlap",
                           note->len ? "; " : "", left_out);
  if (note->len) {
    g_string_append(note, " (the CSV lists every configuration)");
    cairo_set_font_size(cr, 11);
    cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
    show_text(cr, PT_LEFT, PT_H - 18, note->str, 0);
  }
  g_string_free(note, TRUE);
}

static void draw_points_chart(cairo_t *cr, const void *what) {
  struct points_chart *c = (struct points_chart *)what;
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_line_width(cr, 1);
  draw_axes(cr, c);
  draw_caps(cr, c);
  uint32_t left_out = draw_points(cr, c);
  draw_legend_column(cr, c, left_out);
  if (c->n_schedules == 0) {
    cairo_set_font_size(cr, 14);
    cairo_set_source_rgb(cr, 0.5, 0.1, 0.1);
    show_text(cr, (PT_LEFT + PT_W - PT_RIGHT) / 2, PT_H / 2, "no configuration was simulated",
              0.5);
  }
}

bool chart_points(const char *title, const struct chart_point *points, uint32_t n,
                  const char *path, GError **err) {
  return chart_points_listed(title, points, n, path, NULL, err);
}

bool chart_points_listed(const char *title, const struct chart_point *points, uint32_t n,
                         const char *path, GString *listing, GError **err) {
  struct points_chart c;
  points_chart_init(&c, title, points, n, listing);
  bool ok = chart_write_cairo(path, PT_W, PT_H, CHART_PNG, draw_points_chart, &c, err);
  points_chart_free(&c);
  return ok;
}
