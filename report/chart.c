/* chart: the schedule chart (Cairo) and the memory chart (gnuplot) of a run. */
#include "chart.h"
#include "chart-impl.h"

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

/* What chart_pick_devices picks for a run without marked devices. */
static uint32_t *chart_pick_healthy(const struct report_run *r, uint32_t max_rows, uint32_t *n) {
  uint32_t *out = g_new(uint32_t, r->n_devices + 1);
  *n = 0;
  /* the tp ranks of a group run one program on slices: tp rank 0 speaks for them */
  uint32_t shown = r->tp > 1 ? r->n_devices / r->tp : r->n_devices;
  if (shown <= max_rows) {
    for (uint32_t i = 0; i < r->n_devices; i++)
      if (r->devices[i].tp_rank == 0)
        out[(*n)++] = i;
    return out;
  }
  /* one device per pp rank, in pp order */
  uint32_t *by_pp = g_new(uint32_t, r->pp + 1);
  for (uint32_t k = 0; k < r->pp; k++)
    by_pp[k] = UINT32_MAX;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const struct report_device *d = &r->devices[i];
    if (d->dp_rank == 0 && d->tp_rank == 0 && d->pp_rank >= 0 && (uint32_t)d->pp_rank < r->pp)
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

static bool row_before(const struct report_run *r, uint32_t a, uint32_t b) {
  const struct report_device *x = &r->devices[a], *y = &r->devices[b];
  return x->pp_rank != y->pp_rank ? x->pp_rank < y->pp_rank : x->device < y->device;
}

/* A what-if's changed devices (r->marked, up to 8) get rows of their own beside those picked,
 * in pp order (an insertion sort: a few dozen rows). */
/* The device of pp rank pp on which the critical path spends the most time (UINT32_MAX: the
 * path does not visit the rank). */
static uint32_t path_device_of_rank(const struct report_run *r, int32_t pp) {
  uint32_t best = UINT32_MAX, cur = UINT32_MAX;
  double best_s = 0, cur_s = 0;
  GHashTable *time = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
  for (uint32_t k = 0; k < r->n_path; k++) {
    uint32_t d = r->path[k].device;
    if (d >= r->n_devices || r->devices[d].pp_rank != pp)
      continue;
    double *t = g_hash_table_lookup(time, GUINT_TO_POINTER(d + 1));
    if (!t) {
      t = g_new0(double, 1);
      g_hash_table_insert(time, GUINT_TO_POINTER(d + 1), t);
    }
    *t += r->path[k].end - r->path[k].start;
    cur = d;
    cur_s = *t;
    if (best == UINT32_MAX || cur_s > best_s || (cur_s == best_s && cur < best)) {
      best = cur;
      best_s = cur_s;
    }
  }
  g_hash_table_destroy(time);
  return best;
}

uint32_t *chart_pick_devices(const struct report_run *r, uint32_t max_rows, uint32_t *n) {
  uint32_t *rows = chart_pick_healthy(r, max_rows, n);
  /* a what-if's rows follow its critical path: of each pp rank drawn, the device the path
   * spends the most time on, where the rows are not every device already */
  uint32_t shown = r->tp > 1 ? r->n_devices / r->tp : r->n_devices;
  for (uint32_t j = 0; r->n_path > 0 && shown > max_rows && j < *n; j++) {
    uint32_t d = path_device_of_rank(r, r->devices[rows[j]].pp_rank);
    if (d != UINT32_MAX)
      rows[j] = d;
  }
  if (r->n_marked == 0)
    return rows;
  for (uint32_t k = 0; k < r->n_marked && k < 8; k++) {
    uint32_t d = r->marked[k];
    bool have = d >= r->n_devices || r->devices[d].device != d;
    for (uint32_t j = 0; j < *n && !have; j++)
      have = rows[j] == d;
    if (!have)
      rows[(*n)++] = d;
  }
  for (uint32_t i = 1; i < *n; i++)
    for (uint32_t j = i; j > 0 && row_before(r, rows[j], rows[j - 1]); j--) {
      uint32_t t = rows[j];
      rows[j] = rows[j - 1];
      rows[j - 1] = t;
    }
  return rows;
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


/* The legend's entries, in order; legend_index maps an instruction to one. */
enum { LEG_F, LEG_B, LEG_BI, LEG_BW, LEG_R, LEG_OPT, LEG_P2P, LEG_REDUCE, LEG_GATHER, LEG_A2A,
       LEG_TP, LEG_CP, LEG_OTHER, LEG_COUNT };
static const struct {
  const char *label;
  unsigned colour;
  bool comm;
} legend[LEG_COUNT] = {
    [LEG_F] = {"F forward", 0x4E79A7, false},
    [LEG_B] = {"B backward", 0x59A14F, false},
    [LEG_BI] = {"BI backward (inputs)", 0x76B7B2, false},
    [LEG_BW] = {"BW backward (weights)", 0xF28E2B, false},
    [LEG_R] = {"R recomputed forward", 0xFF9DA7, false},
    [LEG_OPT] = {"optimizer", 0x79706E, false},
    [LEG_P2P] = {"pp send/recv", 0x6B3FA0, true},
    [LEG_REDUCE] = {"dp all-reduce / reduce-scatter", 0xC0392B, true},
    [LEG_GATHER] = {"ZeRO all-gather", 0x9C755F, true},
    [LEG_A2A] = {"ep all-to-all", 0xD4477F, true},
    [LEG_TP] = {"tp collectives", 0xB6992D, true},
    [LEG_CP] = {"cp K/V exchange", 0x17BECF, true},
    [LEG_OTHER] = {"other", 0x333333, true},
};

/* A node's legend entry: tensor-parallel collectives (purpose tp) apart from the gradient
 * collectives of the same kinds. */
static uint32_t legend_index(uint32_t kind, uint32_t pass, enum ir_comm_purpose purpose) {
  if (purpose == IR_COMM_TP && kind != IR_NODE_COMPUTE && kind != IR_NODE_OPTIMIZER)
    return LEG_TP;
  if (purpose == IR_COMM_CP && kind != IR_NODE_COMPUTE && kind != IR_NODE_OPTIMIZER)
    return LEG_CP;
  switch (kind) {
  case IR_NODE_COMPUTE:
    return pass == IR_PASS_F    ? LEG_F
           : pass == IR_PASS_B  ? LEG_B
           : pass == IR_PASS_BI ? LEG_BI
           : pass == IR_PASS_BW ? LEG_BW
           : pass == IR_PASS_R  ? LEG_R
                                : LEG_OTHER;
  case IR_NODE_OPTIMIZER: return LEG_OPT;
  case IR_NODE_SEND:
  case IR_NODE_RECV: return LEG_P2P;
  case IR_NODE_ALL_REDUCE:
  case IR_NODE_REDUCE_SCATTER: return LEG_REDUCE;
  case IR_NODE_ALL_GATHER: return LEG_GATHER;
  case IR_NODE_ALL_TO_ALL: return LEG_A2A;
  default: return LEG_OTHER;
  }
}

/* A box's colour: its legend entry's (Tableau 10: passes the light-to-mid hues, communication
 * dark ones). kind is an enum ir_node_kind, pass an enum ir_pass (numbers, so that a kind read
 * from a trace, which may be one this build does not know, gets the default). */
static struct rgb kind_colour(uint32_t kind, uint32_t pass, enum ir_comm_purpose purpose) {
  if (kind == IR_NODE_COMPUTE && pass > IR_PASS_BW && pass != IR_PASS_R)
    return hex(0x999999);
  return hex(legend[legend_index(kind, pass, purpose)].colour);
}

/* What the legend shows: the entries present, hatching (a rank holding several stages) and
 * utilisation bands (lanes too dense for one box per instruction). */
struct legend_use {
  bool entry[LEG_COUNT];
  bool chunks, dense;
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
#define LEFT 330.0
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
  struct legend_use use; /* what the rows drawn contain (filled while drawing them) */
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

static void legend_use_of(const struct report_run *r, struct schedule_layout *l);

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
  l->height += 28 * 3; /* legend, up to three lines */
  l->width = LEFT + PLOT_W + RIGHT;
  l->mb_tag = micro_batch_tag(p);
  legend_use_of(r, l);
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
  char tp[48] = "";
  uint32_t cp = r->cp > 1 ? r->cp : 1;
  if (r->tp > 1)
    snprintf(tp, sizeof tp, " × tp %u", r->tp);
  if (cp > 1) /* the report counts CP ranks among dp (report.h) */
    snprintf(tp + strlen(tp), sizeof tp - strlen(tp), " × cp %u", cp);
  snprintf(title, sizeof title,
           "%s · %s · pp %u × dp %u%s · %u micro-batches · iteration %.4g %s%s", p->model->name,
           r->schedule ? r->schedule : "custom", r->pp, r->dp / cp, tp, p->n_microbatches,
           iter >= 1 ? iter : iter * 1e3, iter >= 1 ? "s" : "ms",
           r->tp > 1 ? (l->n_rows * r->tp >= r->n_devices ? " · tp rank 0 of each group shown"
                                                          : " · tp 0, dp 0 of each pp rank shown")
           : l->n_rows < r->n_devices ? (r->n_path > 0 ? " · the critical path's device of each pp rank shown" : " · dp rank 0 of each pp rank shown")
                                      : "");
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

/* The PP stages the device computes, ascending (at most max): the first is drawn plain, the
 * later ones (a V schedule's second leg, interleaved chunks) hatched. Returns their number. */
static uint32_t device_stages(const struct plan *p, const struct report_device *d, int32_t *stages,
                              uint32_t max) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    const struct ir_node *nd = &p->nodes[d->intervals[k].node];
    int32_t st = nd->tags[MODEL_TAG_PP];
    if (nd->kind != IR_NODE_COMPUTE || st < 0)
      continue;
    uint32_t at = 0;
    while (at < n && stages[at] < st)
      at++;
    if ((at < n && stages[at] == st) || (at == n && n == max))
      continue;
    if (n == max)
      n--; /* keep the lowest max stages */
    memmove(stages + at + 1, stages + at, (n - at) * sizeof *stages);
    stages[at] = st;
    n++;
  }
  return n;
}

/* The position of stage among the device's stages: 0 plain, k >= 1 hatched. */
static int stage_chunk(const int32_t *stages, uint32_t n, int32_t stage) {
  for (uint32_t i = 0; i < n; i++)
    if (stages[i] == stage)
      return (int)i;
  return 0;
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

#define MAX_DEVICE_STAGES 16
#define LANE_NAME_MAX 44

/* The pipeline rank of device dev (-1 when unknown). */
static int32_t device_pp_rank(const struct report_run *r, uint32_t dev) {
  if (dev < r->n_devices && r->devices[dev].device == dev)
    return r->devices[dev].pp_rank;
  for (uint32_t i = 0; i < r->n_devices; i++)
    if (r->devices[i].device == dev)
      return r->devices[i].pp_rank;
  return -1;
}

/* Adds v to the small set s[*n] (at most max). */
static void set_add(int32_t *s, uint32_t *n, uint32_t max, int32_t v) {
  for (uint32_t i = 0; i < *n; i++)
    if (s[i] == v)
      return;
  if (*n < max)
    s[(*n)++] = v;
}

static void append_ranks(GString *g, const char *what, const int32_t *ranks, uint32_t n) {
  g_string_append_printf(g, "%s%s rank%s ", g->len ? " + " : "", what, n > 1 ? "s" : "");
  for (uint32_t i = 0; i < n; i++)
    g_string_append_printf(g, "%s%d", i ? ", " : "", ranks[i]);
}

/* What runs on one lane of a device, in the user's terms. */
struct lane_content {
  bool compute, optimizer, all_reduce, reduce_scatter, all_gather, all_to_all, tp, cp, other;
  int32_t to[8], from[8]; /* pp ranks sent to, received from */
  uint32_t n_to, n_from;
};

static void lane_content(const struct report_run *r, const struct report_device *d,
                         uint32_t stream, struct lane_content *c) {
  const struct plan *p = r->plan;
  memset(c, 0, sizeof *c);
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    if (d->intervals[k].stream != stream)
      continue;
    const struct ir_node *n = &p->nodes[d->intervals[k].node];
    if (n->purpose == IR_COMM_TP || n->purpose == IR_COMM_CP) {
      c->tp |= n->purpose == IR_COMM_TP;
      c->cp |= n->purpose == IR_COMM_CP;
      continue;
    }
    switch (n->kind) {
    case IR_NODE_COMPUTE: c->compute = true; break;
    case IR_NODE_OPTIMIZER: c->optimizer = true; break;
    case IR_NODE_ALL_REDUCE: c->all_reduce = true; break;
    case IR_NODE_REDUCE_SCATTER: c->reduce_scatter = true; break;
    case IR_NODE_ALL_GATHER: c->all_gather = true; break;
    case IR_NODE_ALL_TO_ALL: c->all_to_all = true; break;
    case IR_NODE_SEND:
    case IR_NODE_RECV: {
      int32_t peer = -1;
      if (n->peer_group < p->n_groups)
        peer = device_pp_rank(r, p->device_pool[p->groups[n->peer_group].first]);
      if (n->kind == IR_NODE_SEND)
        set_add(c->to, &c->n_to, G_N_ELEMENTS(c->to), peer);
      else
        set_add(c->from, &c->n_from, G_N_ELEMENTS(c->from), peer);
      break;
    }
    default: c->other = true; break;
    }
  }
}

/* "compute: stage 0 | 7 hatched", "pp send to rank 2", "pp send/recv with rank 1", "dp
 * all-reduce", ...: a lane's name from what runs on it; the stream's own name when nothing
 * does. */
static void lane_name(const struct report_run *r, const struct report_device *d, uint32_t stream,
                      const int32_t *stages, uint32_t n_stages, char *buf, size_t len) {
  struct lane_content c;
  lane_content(r, d, stream, &c);
  GString *g = g_string_new(NULL);
  if (c.compute) {
    g_string_append_printf(g, "compute: stage %d", n_stages ? stages[0] : -1);
    for (uint32_t i = 1; i < n_stages; i++)
      g_string_append_printf(g, "%s%d", i == 1 ? ", hatched " : ", ", stages[i]);
  }
  if (c.optimizer)
    g_string_append_printf(g, "%soptimizer", g->len ? " + " : "");
  if (c.n_to == 1 && c.n_from == 1 && c.to[0] == c.from[0]) {
    append_ranks(g, "pp send/recv with", c.to, 1);
  } else {
    if (c.n_to)
      append_ranks(g, "pp send to", c.to, c.n_to);
    if (c.n_from)
      append_ranks(g, "pp recv from", c.from, c.n_from);
  }
  const struct {
    bool on;
    const char *name;
  } kinds[] = {{c.all_reduce, "dp all-reduce"},
               {c.reduce_scatter, "dp reduce-scatter"},
               {c.all_gather, "ZeRO all-gather"},
               {c.all_to_all, "ep all-to-all"},
               {c.tp, "tp collectives"},
               {c.cp, "cp K/V exchange"},
               {c.other, "other"}};
  for (size_t i = 0; i < G_N_ELEMENTS(kinds); i++)
    if (kinds[i].on)
      g_string_append_printf(g, "%s%s", g->len ? " + " : "", kinds[i].name);
  if (g->len == 0 && stream < r->plan->n_streams)
    g_string_append(g, r->plan->streams[stream].name);
  if (g->len >= len && len > 4) { /* cut with an ellipsis rather than mid-word silently */
    g_string_truncate(g, len - 4);
    g_string_append(g, "...");
  }
  g_strlcpy(buf, g->str, len);
  g_string_free(g, TRUE);
}

/* A device's row frame in the schedule chart: its ranks, its lanes named by what runs on them. */
static void draw_device_frame(cairo_t *cr, const struct report_run *r,
                              const struct report_device *d, const uint32_t *lo, uint32_t n_lanes,
                              const int32_t *stages, uint32_t n_stages, uint32_t ri, double y,
                              double row_h) {
  const struct plan *p = r->plan;
  char label[64], sublabel[64];
  snprintf(label, sizeof label, "device %u", d->device);
  if (r->tp > 1)
    snprintf(sublabel, sizeof sublabel, "pp %d · dp %d · tp rank %d", d->pp_rank, d->dp_rank,
             d->tp_rank);
  else
    snprintf(sublabel, sizeof sublabel, "pp rank %d · dp rank %d", d->pp_rank, d->dp_rank);
  if (!model_pp_split_is_equal(p->model)) { /* uneven stages: the device's load */
    size_t n = strlen(sublabel);
    snprintf(sublabel + n, sizeof sublabel - n, " · %lld layers",
             (long long)report_device_layers(p, d));
  }
  const char **names = g_new0(const char *, n_lanes + 1);
  char *text = g_malloc0((size_t)(n_lanes + 1) * LANE_NAME_MAX); /* a name per lane */
  for (uint32_t s = 0; s < p->n_streams; s++)
    if (lo[s] != UINT32_MAX && lo[s] < n_lanes) {
      char *name = text + (size_t)lo[s] * LANE_NAME_MAX;
      lane_name(r, d, s, stages, n_stages, name, LANE_NAME_MAX);
      names[lo[s]] = name;
    }
  draw_row_frame(cr, label, sublabel, names, n_lanes, ri, y, row_h);
  g_free(text);
  g_free(names);
}

/* The micro-batch number inside a compute box, only where it fits; on a hatched box it sits on
 * a patch of the box's colour, so that the stripes do not cross it. */
static void draw_micro_batch(cairo_t *cr, int mb, double x0, double x1, double ly,
                             const struct rgb *patch) {
  char ml[16];
  snprintf(ml, sizeof ml, "%d", mb);
  cairo_text_extents_t te;
  cairo_text_extents(cr, ml, &te);
  if (te.x_advance + 2 <= x1 - x0) {
    if (patch) {
      cairo_set_source_rgb(cr, patch->r, patch->g, patch->b);
      cairo_rectangle(cr, (x0 + x1) / 2 - te.x_advance / 2 - 1.5, ly + 3, te.x_advance + 3,
                      LANE_H - 6);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 1, 1, 1);
    text_at(cr, (x0 + x1) / 2, ly + 11.5, ml, 0.5);
  }
}

/* What one instruction looks like, whether it comes from a plan or from a trace. */
struct chart_box {
  double start, end; /* seconds, on the layout's clock */
  struct rgb colour;
  bool comm;
  int mb;    /* micro-batch shown inside compute boxes; -1: none */
  int chunk; /* the position of its stage among the rank's: 0 plain, 1 "/", 2 "\", 3+ crossed */
};

/* White stripes over a box of a rank's later stage: "/" for the second, "\" for the third,
 * both beyond. */
static void draw_hatch(cairo_t *cr, double x0, double y0, double w, double h, int chunk) {
  cairo_save(cr);
  cairo_rectangle(cr, x0, y0, w, h);
  cairo_clip(cr);
  cairo_set_source_rgba(cr, 1, 1, 1, 0.55);
  cairo_set_line_width(cr, 1.3);
  for (int dir = 0; dir < 2; dir++) {
    if ((dir == 0 && chunk == 2) || (dir == 1 && chunk < 2))
      continue;
    for (double x = x0 - h; x < x0 + w; x += 5) {
      cairo_move_to(cr, x, dir ? y0 : y0 + h);
      cairo_line_to(cr, x + h, dir ? y0 + h : y0);
    }
  }
  cairo_stroke(cr);
  cairo_restore(cr);
}

/* A full-height box for compute, a thin bar for communication. */
static void draw_box(cairo_t *cr, const struct schedule_layout *l, const struct chart_box *b,
                     double ly) {
  double x0 = LEFT + (b->start - l->t0) * l->sx, x1 = LEFT + (b->end - l->t0) * l->sx;
  if (x1 - x0 < 0.6)
    x1 = x0 + 0.6; /* zero-cost ops stay visible as hairlines */
  double by = b->comm ? ly + (LANE_H - COMM_H) / 2 : ly + 1, bh = b->comm ? COMM_H : LANE_H - 2;
  /* too narrow for stripes: a later stage is told apart by a lighter shade instead */
  struct rgb c = b->chunk > 0 && x1 - x0 < 4 ? lighten(b->colour, 0.35) : b->colour;
  cairo_set_source_rgb(cr, c.r, c.g, c.b);
  cairo_rectangle(cr, x0, by, x1 - x0, bh);
  cairo_fill(cr);
  if (b->chunk > 0 && x1 - x0 >= 4)
    draw_hatch(cr, x0, by, x1 - x0, bh, b->chunk);
  if (x1 - x0 >= 3) { /* a white edge separates back-to-back boxes */
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_set_line_width(cr, 0.6);
    cairo_rectangle(cr, x0 + 0.3, by + 0.3, x1 - x0 - 0.6, bh - 0.6);
    cairo_stroke(cr);
  }
  if (!b->comm && b->mb >= 0)
    draw_micro_batch(cr, b->mb, x0, x1, ly, b->chunk > 0 ? &c : NULL);
}

/* One interval of a plan's run. */
static void draw_interval(cairo_t *cr, const struct plan *p, const struct schedule_layout *l,
                          const struct report_interval *iv, double ly, const int32_t *stages,
                          uint32_t n_stages) {
  const struct ir_node *n = &p->nodes[iv->node];
  struct chart_box b = {iv->start, iv->end, kind_colour(n->kind, n->pass, n->purpose),
                        !report_node_is_compute(n), l->mb_tag >= 0 ? n->tags[l->mb_tag] : -1, 0};
  if (n->kind == IR_NODE_COMPUTE)
    b.chunk = stage_chunk(stages, n_stages, n->tags[MODEL_TAG_PP]);
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

/* A lane too dense for a box per instruction: more instructions than a quarter of the plot's
 * pixels, 30% of them under 1.5 px wide (thousands of micro-batches), where boxes widened to stay
 * visible would paint a solid bar that overstates how busy the lane is. A few zero-cost
 * instructions (a synthetic profile's free communication) stay hairlines. */
static bool lane_dense(const struct schedule_layout *l, const struct report_device *d,
                       uint32_t stream) {
  uint32_t n = 0, thin = 0;
  for (uint32_t k = 0; k < d->n_intervals; k++)
    if (d->intervals[k].stream == stream) {
      n++;
      thin += (d->intervals[k].end - d->intervals[k].start) * l->sx < 1.5;
    }
  return n > PLOT_W / 4 && (uint64_t)thin * 10 > (uint64_t)n * 3;
}

#define BAND_PX 2.0

/* A dense lane as a utilisation band: per BAND_PX-wide column, the share of the column's time
 * each kind ran, stacked from the lane's floor (a full column: busy all the time). */
static void draw_lane_band(cairo_t *cr, const struct plan *p, const struct schedule_layout *l,
                           const struct report_device *d, uint32_t stream, double ly) {
  uint32_t nb = (uint32_t)ceil(PLOT_W / BAND_PX);
  double bin_s = BAND_PX / l->sx;
  double *busy = g_new0(double, (size_t)nb * LEG_COUNT);
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    const struct report_interval *iv = &d->intervals[k];
    if (iv->stream != stream)
      continue;
    const struct ir_node *n = &p->nodes[iv->node];
    uint32_t leg = legend_index(n->kind, n->pass, n->purpose);
    double a = fmax(iv->start - l->t0, 0), z = fmax(iv->end - l->t0, a);
    for (uint32_t bin = (uint32_t)(a / bin_s); bin < nb && bin * bin_s < z; bin++)
      busy[(size_t)bin * LEG_COUNT + leg] +=
          fmin(z, (bin + 1) * bin_s) - fmax(a, bin * bin_s);
  }
  for (uint32_t bin = 0; bin < nb; bin++) {
    double y = ly + LANE_H - 1, room = LANE_H - 2;
    for (uint32_t leg = 0; leg < LEG_COUNT && room > 0; leg++) {
      double h = fmin(busy[(size_t)bin * LEG_COUNT + leg] / bin_s * (LANE_H - 2), room);
      if (h <= 0)
        continue;
      struct rgb c = hex(legend[leg].colour);
      cairo_set_source_rgb(cr, c.r, c.g, c.b);
      cairo_rectangle(cr, LEFT + bin * BAND_PX, y - h, BAND_PX, h);
      cairo_fill(cr);
      y -= h;
      room -= h;
    }
  }
  g_free(busy);
}

/* Row ri at height y; returns its height. */
static double draw_device_row(cairo_t *cr, const struct report_run *r,
                              const struct schedule_layout *l, uint32_t ri, double y) {
  const struct plan *p = r->plan;
  const struct report_device *d = &r->devices[l->rows[ri]];
  const uint32_t *lo = l->lane_of + (size_t)ri * l->stride;
  double row_h = l->n_lanes[ri] * LANE_H;
  int32_t stages[MAX_DEVICE_STAGES];
  uint32_t n_stages = device_stages(p, d, stages, MAX_DEVICE_STAGES);
  draw_device_frame(cr, r, d, lo, l->n_lanes[ri], stages, n_stages, ri, y, row_h);
  bool *dense = g_new0(bool, p->n_streams + 1);
  for (uint32_t s = 0; s < p->n_streams; s++)
    if (lo[s] != UINT32_MAX) {
      dense[s] = lane_dense(l, d, s);
      if (dense[s])
        draw_lane_band(cr, p, l, d, s, y + lo[s] * LANE_H);
    }
  cairo_set_font_size(cr, 9);
  const struct plan_class *c = plan_device_class(p, d->device);
  GHashTable *groups = c ? plan_class_group_index(c) : NULL;
  for (uint32_t k = 0; k < d->n_intervals; k++) {
    const struct report_interval *iv = &d->intervals[k];
    if (iv->stream >= p->n_streams || lo[iv->stream] == UINT32_MAX || dense[iv->stream])
      continue;
    uint32_t entry =
        groups ? GPOINTER_TO_UINT(g_hash_table_lookup(groups, GUINT_TO_POINTER(iv->node))) : 0;
    if (entry && c->instrs[c->stream_instrs[entry - 1]].node != iv->node)
      continue; /* a later part of a group: drawn with its first part */
    draw_interval(cr, p, l, iv, y + lo[iv->stream] * LANE_H, stages, n_stages);
    if (entry)
      draw_group_label(cr, p, c, entry - 1, l, iv, y + lo[iv->stream] * LANE_H);
  }
  if (groups)
    g_hash_table_destroy(groups);
  g_free(dense);
  return row_h;
}

/* What the rows drawn contain, for the legend: a pre-pass over their instructions. */
static void legend_use_of(const struct report_run *r, struct schedule_layout *l) {
  const struct plan *p = r->plan;
  memset(&l->use, 0, sizeof l->use);
  for (uint32_t ri = 0; ri < l->n_rows; ri++) {
    const struct report_device *d = &r->devices[l->rows[ri]];
    int32_t stages[MAX_DEVICE_STAGES];
    l->use.chunks |= device_stages(p, d, stages, MAX_DEVICE_STAGES) > 1;
    for (uint32_t k = 0; k < d->n_intervals; k++) {
      const struct ir_node *n = &p->nodes[d->intervals[k].node];
      l->use.entry[legend_index(n->kind, n->pass, n->purpose)] = true;
    }
    const uint32_t *lo = l->lane_of + (size_t)ri * l->stride;
    for (uint32_t s = 0; s < p->n_streams && !l->use.dense; s++)
      l->use.dense = lo[s] != UINT32_MAX && lane_dense(l, d, s);
  }
}

/* The entries the run contains, then what hatching and bands mean when there are any. */
static void draw_legend(cairo_t *cr, const struct schedule_layout *l) {
  double lx = LEFT, ly = l->axis_y + 50;
  cairo_set_font_size(cr, 12);
  for (size_t i = 0; i < LEG_COUNT; i++) {
    if (!l->use.entry[i])
      continue;
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
  GString *note = g_string_new("numbers: micro-batch");
  if (l->use.chunks)
    g_string_prepend(note, "hatched: the rank's later stage (its compute lane names it); ");
  if (l->use.dense)
    g_string_append(note, "; dense lanes: column height = share of time busy");
  cairo_set_font_size(cr, 11);
  cairo_text_extents_t te;
  cairo_text_extents(cr, note->str, &te);
  if (lx + (l->use.chunks ? 24 : 0) + te.x_advance > LEFT + PLOT_W) {
    lx = LEFT;
    ly += 24;
  }
  if (l->use.chunks) {
    struct rgb c = hex(legend[LEG_F].colour);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_rectangle(cr, lx, ly - 12, 18, 14);
    cairo_fill(cr);
    draw_hatch(cr, lx, ly - 12, 18, 14, 1);
    lx += 24;
  }
  cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
  text_at(cr, lx, ly, note->str, 0);
  g_string_free(note, TRUE);
}

/* A what-if's changed device: its row framed in red, its note under the row's label. */
static void draw_marked_row(cairo_t *cr, const struct report_run *r, uint32_t dev, double y,
                            double row_h) {
  for (uint32_t k = 0; k < r->n_marked; k++) {
    if (r->marked[k] != r->devices[dev].device)
      continue;
    cairo_set_source_rgb(cr, 0.80, 0.10, 0.10);
    cairo_set_line_width(cr, 2);
    cairo_rectangle(cr, 3, y - 1, LEFT + PLOT_W - 2, row_h + 2);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 10);
    text_at(cr, 8, y + LANE_H + 21, r->marked_notes ? r->marked_notes[k] : "changed", 0);
  }
}

/* The critical path over the rows drawn: each of its instructions there outlined in red, and
 * a line from one to the next where the path goes on on another row drawn. */
static void draw_path(cairo_t *cr, const struct report_run *r, const struct schedule_layout *l,
                      const double *row_y) {
  cairo_set_source_rgb(cr, 0.85, 0.05, 0.05);
  double px = NAN, py = NAN;
  for (uint32_t k = 0; k < r->n_path; k++) {
    const struct report_path_step *st = &r->path[k];
    uint32_t ri = UINT32_MAX;
    for (uint32_t j = 0; j < l->n_rows && ri == UINT32_MAX; j++)
      if (r->devices[l->rows[j]].device == st->device)
        ri = j;
    if (ri == UINT32_MAX || st->stream >= r->plan->n_streams ||
        l->lane_of[(size_t)ri * l->stride + st->stream] == UINT32_MAX) {
      px = py = NAN; /* off the rows drawn */
      continue;
    }
    double x0 = LEFT + (st->start - l->t0) * l->sx, x1 = LEFT + (st->end - l->t0) * l->sx;
    double ly = row_y[ri] + l->lane_of[(size_t)ri * l->stride + st->stream] * LANE_H;
    cairo_set_line_width(cr, 1.6);
    cairo_rectangle(cr, x0, ly + 1, fmax(x1 - x0, 1), LANE_H - 2);
    cairo_stroke(cr);
    if (isfinite(px) && fabs(py - (ly + LANE_H / 2)) > 1) {
      cairo_set_line_width(cr, 1.0);
      cairo_move_to(cr, px, py);
      cairo_line_to(cr, x0, ly + LANE_H / 2);
      cairo_stroke(cr);
    }
    px = x1;
    py = ly + LANE_H / 2;
  }
  cairo_set_font_size(cr, 11);
  text_at(cr, LEFT + PLOT_W, 46, "red: the critical path of the step; framed rows: devices the "
                                 "what-if changed", 1);
}

static void draw_schedule(cairo_t *cr, const struct report_run *r,
                          const struct schedule_layout *l) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  draw_title(cr, r, l);
  draw_time_axis(cr, l);
  double y = TOP, *row_y = g_new(double, l->n_rows + 1);
  for (uint32_t ri = 0; ri < l->n_rows; ri++) {
    row_y[ri] = y;
    double h = draw_device_row(cr, r, l, ri, y);
    if (r->n_marked > 0)
      draw_marked_row(cr, r, l->rows[ri], y, h);
    y += h + ROW_GAP;
  }
  if (r->n_path > 0)
    draw_path(cr, r, l, row_y);
  g_free(row_y);
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
 * once drawn (render_chart). */
static cairo_surface_t *chart_surface(double width, double height, enum chart_format f,
                                      struct piper_out *out) {
  if (f == CHART_PNG)
    return cairo_image_surface_create(CAIRO_FORMAT_RGB24, (int)width, (int)ceil(height));
  if (f == CHART_SVG)
    return cairo_svg_surface_create_for_stream(write_to_out, out->f, width, height);
  return cairo_pdf_surface_create_for_stream(write_to_out, out->f, width, height);
}

/* Draws a chart of width x height by draw(cr, what) onto a surface streaming into out; false
 * (err set) when cairo fails at any step. */
static bool render_chart(double width, double height, enum chart_format f,
                         void (*draw)(cairo_t *cr, const void *what), const void *what,
                         struct piper_out *out, GError **err) {
  cairo_surface_t *surf = chart_surface(width, height, f, out);
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

bool chart_write_cairo(const char *path, double width, double height, enum chart_format f,
                       void (*draw)(cairo_t *cr, const void *what), const void *what,
                       GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  if (!render_chart(width, height, f, draw, what, &out, err)) {
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
  bool ok = chart_write_cairo(path, l.width, l.height, f, draw_schedule_chart, &c, err);
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
  int32_t min_stage; /* the device's first PP stage (later ones drawn hatched) */
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
  l->height += 40 + 28 * 3; /* axis, legend */
  l->width = LEFT + PLOT_W + RIGHT;
  for (int i = 0; i < LEG_COUNT; i++) /* a trace's kinds: the full legend */
    l->use.entry[i] = i != LEG_OTHER;
  l->use.chunks = true;
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
                          kind_colour(n->ir_kind, n->pass, IR_COMM_NONE), !compute, n->micro_batch,
                          n->ir_kind == IR_NODE_COMPUTE && n->stage > row->min_stage};
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
  bool ok = chart_write_cairo(path, c.l.width, c.l.height, CHART_PNG, draw_compare, &c, err);
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
/* Lines never share a colour up to 32 devices (chart_pick_devices draws one per pipeline rank
 * beyond that): Tableau 20, then twelve more of distinct hue and lightness. */
static const unsigned device_palette[32] = {
    0x4E79A7, 0xF28E2B, 0x59A14F, 0xE15759, 0xB07AA1, 0x76B7B2, 0xEDC948, 0x9C755F,
    0xA0CBE8, 0xFFBE7D, 0x8CD17D, 0xFF9D9A, 0xD4A6C8, 0x86BCB6, 0xF1CE63, 0xD7B5A6,
    0x79706E, 0xBAB0AC, 0xD37295, 0x499894, 0x1F3A93, 0x8B0000, 0x006400, 0xFF00FF,
    0x00CED1, 0x808000, 0x4B0082, 0xFF4500, 0x2F4F4F, 0xDAA520, 0x7FFF00, 0x000000};

/* The breakdown's kinds: names in the key and colours. */
static const struct {
  const char *title;
  unsigned colour;
} memory_kinds[REPORT_MEM_KIND_COUNT] = {
    [REPORT_MEM_PARAMS] = {"parameters", 0x4E79A7},
    [REPORT_MEM_GRADS] = {"gradients", 0x59A14F},
    [REPORT_MEM_OPTIMIZER] = {"optimizer state", 0xB07AA1},
    [REPORT_MEM_ACTIVATIONS] = {"activations", 0xF28E2B},
    [REPORT_MEM_GATHERED] = {"gathered parameters (ZeRO-3)", 0x76B7B2},
    [REPORT_MEM_COMM] = {"communication buffers", 0xE15759},
};

struct memory_axes {
  double t0, t1;
  bool secs, gibs;
  double scale, mem_unit;
  uint32_t peak_device; /* index into r->devices: the breakdown's device */
  double top;           /* the highest memory drawn, bytes */
  bool capacity_drawn;  /* the capacity is within reach of the curves (else said in words) */
};

static struct memory_axes memory_axes(const struct report_run *r, const uint32_t *rows,
                                      uint32_t n) {
  struct memory_axes a = {0};
  report_run_window(r, &a.t0, &a.t1);
  a.secs = a.t1 - a.t0 >= 1;
  a.scale = a.secs ? 1 : 1e3;
  for (uint32_t i = 0; i < r->n_devices; i++)
    if (r->devices[i].peak_memory_bytes > r->devices[a.peak_device].peak_memory_bytes)
      a.peak_device = i;
  for (uint32_t i = 0; i < n; i++)
    a.top = fmax(a.top, (double)r->devices[rows[i]].peak_memory_bytes);
  if (r->n_devices)
    a.top = fmax(a.top, (double)r->devices[a.peak_device].peak_memory_bytes);
  /* A capacity far above every curve would flatten them to the axis: drawn only within 4x. */
  double cap = r->memory_capacity_bytes;
  a.capacity_drawn = cap > 0 && cap <= 4 * fmax(a.top, 1);
  double reach = a.capacity_drawn ? fmax(a.top, cap) : a.top;
  /* GiB for real models, MiB for the tiny ones (whose peaks are a few MiB) */
  a.gibs = reach >= (double)(1ull << 30);
  a.mem_unit = a.gibs ? (double)(1ull << 30) : (double)(1ull << 20);
  return a;
}

static uint64_t point_total(const struct report_memory_point *m) {
  uint64_t tot = 0;
  for (int j = 0; j < REPORT_MEM_KIND_COUNT; j++)
    tot += m->bytes[j];
  return tot;
}

/* The breakdown block: time and the running sums of the kinds, as steps (each change drawn
 * at its time, so that filled areas between the sums are steps too). A device without a
 * timeline shows its peak breakdown over the whole step. */
static void write_breakdown_block(FILE *f, const struct report_device *d,
                                  const struct memory_axes *a) {
  fprintf(f, "# breakdown of device %u (the peak)\n", d->device);
  struct report_memory_point only = {.t = a->t0};
  memcpy(only.bytes, d->peak_breakdown, sizeof only.bytes);
  const struct report_memory_point *m = d->n_memory ? d->memory : &only;
  uint32_t n = d->n_memory ? d->n_memory : 1;
  for (uint32_t k = 0; k <= n; k++) {
    const struct report_memory_point *at = &m[k < n ? k : n - 1];
    double t = k < n ? fmax(at->t - a->t0, 0) : a->t1 - a->t0;
    for (int rep = 0; rep < (k > 0 && k < n ? 2 : 1); rep++) {
      const struct report_memory_point *v = rep == 0 && k > 0 && k < n ? &m[k - 1] : at;
      fprintf(f, "%.9g", t * a->scale);
      double sum = 0;
      for (int j = 0; j < REPORT_MEM_KIND_COUNT; j++) {
        sum += (double)v->bytes[j];
        fprintf(f, " %.6f", sum / a->mem_unit);
      }
      fputc('\n', f);
    }
  }
  fputs("\n\n", f);
}

/* memory.dat: one gnuplot data block per device drawn (time, total memory: a step function),
 * then the peak device's breakdown. */
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
      double t = fmax(d->memory[k].t - a->t0, 0);
      last = point_total(&d->memory[k]);
      fprintf(f, "%.9g %.6f\n", t * a->scale, (double)last / a->mem_unit);
    }
    fprintf(f, "%.9g %.6f\n\n\n", (a->t1 - a->t0) * a->scale, (double)last / a->mem_unit);
  }
  if (r->n_devices)
    write_breakdown_block(f, &r->devices[a->peak_device], a);
  return piper_out_close(&out, err);
}

/* The capacity: a dashed red line with its label when in reach, else a line of text saying
 * how far below it the run stays. */
static void write_capacity(FILE *f, const struct report_run *r, const struct memory_axes *a) {
  double cap = r->memory_capacity_bytes;
  const char *src = r->capacity_source ? r->capacity_source : "the device";
  if (a->capacity_drawn) {
    fprintf(f,
            "set arrow 1 from graph 0, first %.6f to graph 1, first %.6f nohead dt 2 lw 2 "
            "lc rgb '#C0392B' front\n"
            "set label 1 'capacity %.4g %s (%s)' at graph 0.01, first %.6f offset 0,0.7 "
            "tc rgb '#C0392B' front\n",
            cap / a->mem_unit, cap / a->mem_unit, cap / a->mem_unit, a->gibs ? "GiB" : "MiB", src,
            cap / a->mem_unit);
  } else if (cap > 0) {
    fprintf(f,
            "set label 1 'capacity %.4g GiB (%s): off the scale, the peak uses %.3g%% of it' at "
            "graph 0.01, graph 0.96 tc rgb '#C0392B' front\n",
            cap / (double)(1ull << 30), src, 100 * a->top / cap);
  } else {
    fputs("set label 1 'device capacity unknown (no profile)' at graph 0.01, graph 0.96 "
          "tc rgb '#777777' front\n",
          f);
  }
}

/* Top: every device drawn, its own colour (dp replicas dashed, thinner, so that one on top of
 * another stays visible). Bottom: the peak device stacked by kind. The capacity on both. */
static bool write_memory_gp(const struct report_run *r, const uint32_t *rows, uint32_t n,
                            const struct memory_axes *a, const char *path, GError **err) {
  struct piper_out out;
  if (!piper_out_open(&out, path, err))
    return false;
  FILE *f = out.f;
  const char *unit = a->gibs ? "GiB" : "MiB";
  fprintf(f,
          "set terminal pngcairo size 1400,1150 font 'sans,11'\n"
          "%s"
          "set multiplot\n"
          "set lmargin at screen 0.07\nset rmargin at screen 0.80\n"
          "set xlabel 'time (%s)'\nset ylabel 'memory (%s)'\n"
          "set grid\nset key outside right top font ',9' spacing 0.95\n"
          "set yrange [0:%.6f]\nset xrange [0:%.9g]\n"
          "set tmargin at screen 0.95\nset bmargin at screen 0.50\n"
          "set title 'Memory per device: %s, %s%s'\n",
          CHART_GNUPLOT_OUTPUT("memory.png"), a->secs ? "s" : "ms", unit,
          1.08 * fmax(a->top, a->capacity_drawn ? r->memory_capacity_bytes : 0) / a->mem_unit,
          fmax((a->t1 - a->t0) * a->scale, 1e-9), r->plan->model->name,
          r->schedule ? r->schedule : "custom",
          n < r->n_devices ? " (dp rank 0 of each pipeline rank)" : "");
  write_capacity(f, r, a);
  fputs("plot ", f);
  for (uint32_t i = 0; i < n; i++) {
    const struct report_device *d = &r->devices[rows[i]];
    /* Colours go out by (dp rank, pp rank): the solid dp-0 lines take the most distinct. */
    uint32_t colour = 0;
    for (uint32_t j = 0; j < n; j++) {
      const struct report_device *e = &r->devices[rows[j]];
      colour += e->dp_rank < d->dp_rank || (e->dp_rank == d->dp_rank && e->pp_rank < d->pp_rank);
    }
    fprintf(f,
            "%s'memory.dat' index %u using 1:2 with steps lw %d dt %d lc rgb '#%06X' "
            "title 'dev %u (pp %d, dp %d)'",
            i ? ", \\\n     " : "", i, d->dp_rank > 0 ? 1 : 2, d->dp_rank > 0 ? 2 : 1,
            device_palette[colour % G_N_ELEMENTS(device_palette)], d->device, d->pp_rank,
            d->dp_rank);
  }
  if (n == 0)
    fprintf(f, "0 notitle");
  fputc('\n', f);
  if (r->n_devices) {
    const struct report_device *pd = &r->devices[a->peak_device];
    fprintf(f,
            "set tmargin at screen 0.42\nset bmargin at screen 0.06\n"
            "set title 'Device %u (pp %d, dp %d), the highest peak (%.4g %s), by kind'\n",
            pd->device, pd->pp_rank, pd->dp_rank, (double)pd->peak_memory_bytes / a->mem_unit,
            unit);
    fputs("plot ", f);
    for (int k = 0; k < REPORT_MEM_KIND_COUNT; k++) {
      char below[16]; /* the running sum under kind k: column k + 1, or the axis */
      snprintf(below, sizeof below, k ? "%d" : "(0)", k + 1);
      fprintf(f,
              "%s'memory.dat' index %u using 1:%s:%d with filledcurves fs solid 1 noborder "
              "lc rgb '#%06X' title '%s'",
              k ? ", \\\n     " : "", n, below, k + 2, memory_kinds[k].colour,
              memory_kinds[k].title);
    }
    fputc('\n', f);
  }
  fputs("unset multiplot\n", f);
  return piper_out_close(&out, err);
}

bool chart_memory(const struct report_run *r, const char *dir, GError **err) {
  uint32_t n;
  uint32_t *rows = chart_pick_devices(r, G_N_ELEMENTS(device_palette), &n);
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
