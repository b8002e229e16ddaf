/* chart: pictures of a run (docs/design.md, "Outputs and exit statuses"). The schedule chart
 * (Cairo: PNG, SVG or PDF) has a row per device and a lane per stream, boxes coloured by pass and
 * labelled with the micro-batch, communication drawn as thin dark bars, a real time axis and a
 * legend. The memory chart is a gnuplot script run by gnuplot (data and script are kept beside
 * it); the what-if chart of sweeps and the planner (chart_points) is drawn with Cairo too. Every
 * file goes through piper_out: a chart that cannot be written whole is an error.
 *
 *   struct report_run run = {0};               // filled as report.h shows (sim or exec)
 *   GError *err = NULL;
 *   GString *written = g_string_new("");
 *   if (!report_write_charts(&run, "out/run", CHART_PNG, written, &err))
 *     fprintf(stderr, "%s\n", err->message);   // else written is " schedule.png schedule.svg memory.png"
 *   chart_schedule(&run, "out/run/schedule.pdf", CHART_PDF, &err);
 *   g_string_free(written, TRUE);
 */
#ifndef PIPER_REPORT_CHART_H
#define PIPER_REPORT_CHART_H

#include <glib.h>
#include <stdbool.h>

#include "report.h"

enum chart_format { CHART_PNG, CHART_SVG, CHART_PDF };
bool chart_format_parse(const char *name, enum chart_format *out);

/* The charts of a run in dir: schedule.png and schedule.svg, schedule.pdf too when f is
 * CHART_PDF, and memory.png (with memory.dat and memory.gp) when gnuplot is installed
 * (chart_gnuplot_available; without it the memory chart is skipped, the caller says so).
 * Appends " <name>" to written (when not NULL) for each file made, pdf first. */
bool report_write_charts(const struct report_run *r, const char *dir, enum chart_format f,
                         GString *written, GError **err);

/* The devices drawn: all when there are at most max_rows, else the dp rank 0 device of each
 * pp rank (at most max_rows of them, evenly spaced). Returns indices into r->devices. */
uint32_t *chart_pick_devices(const struct report_run *r, uint32_t max_rows, uint32_t *n);

bool chart_schedule(const struct report_run *r, const char *path, enum chart_format f,
                    GError **err);
/* A PNG of two runs of one plan read back by report_dir_load: for each device drawn (as
 * chart_pick_devices picks them), A's timeline above B's on one time axis, in the schedule
 * chart's lanes, colours and legend. Each side shows one step (of a run of several, the step
 * of median length), and each side's step starts at t = 0. */
bool chart_compare(const struct report_dir *a, const struct report_dir *b, const char *path,
                   GError **err);
/* One configuration of a what-if chart (a sweep's or a planner's). */
struct chart_point {
  const char *label;    /* shown beside the point (top picks and the Pareto front); NULL: none */
  bool top;             /* a top pick: its label is always drawn (with a leader line if need be) */
  const char *schedule; /* the point's colour */
  const char *profile;  /* its marker; each profile's cap line */
  bool ok;              /* simulated (else not drawn) */
  bool bounded;         /* not simulated: over its cap by a memory bound; not drawn */
  bool feasible;        /* under its cap: a filled marker (else hollow) */
  double peak_memory_bytes, throughput_tokens_per_s;
  double memory_cap_bytes; /* what it was judged against; 0: no cap */
};
/* A PNG of throughput against peak memory: a dashed cap line per distinct cap (labelled with
 * its profiles), colour by schedule, marker by profile, the Pareto front (no other point has
 * less memory and more throughput) joined and ringed, and labels: every top pick's, then the
 * front's where they overlap no marker or other label. The axes span the answers (the points
 * under a cap, the front, the top picks, the caps), not zero; points beyond them are counted in
 * a note, as are labels left out. */
bool chart_points(const char *title, const struct chart_point *points, uint32_t n,
                  const char *path, GError **err);
/* The same, appending to listing (when not NULL) what was drawn, a line each: "x-axis LO HI
 * UNIT", "y-axis LO HI", "cap BYTES", "pareto I" (point index), "label I TEXT" (what a test
 * checks without reading pixels). */
bool chart_points_listed(const char *title, const struct chart_point *points, uint32_t n,
                         const char *path, GString *listing, GError **err);

/* dir/memory.png from dir/memory.dat and dir/memory.gp. */
bool chart_memory(const struct report_run *r, const char *dir, GError **err);

/* gnuplot is on the PATH. */
bool chart_gnuplot_available(void);
/* The output line of a script for chart_run_gnuplot: the script writes name when a user runs
 * it, standard output when piper does (piper then checks the PNG and publishes it). */
#define CHART_GNUPLOT_OUTPUT(name) "if (!exists(\"piper_stdout\")) set output '" name "'\n"
/* Runs gnuplot on dir/script and writes its PNG to dir/output through piper_write_file; a
 * gnuplot failure or a PNG cut short is an error. */
bool chart_run_gnuplot(const char *dir, const char *script, const char *output, GError **err);

#endif
