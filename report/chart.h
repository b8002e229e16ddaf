/* chart: pictures of a run (SPEC §8). The schedule chart (Cairo: PNG, SVG or PDF) has a row per
 * device and a lane per stream, boxes coloured by pass and labelled with the micro-batch,
 * communication drawn as thin dark bars, a real time axis and a legend. The memory chart and
 * the sweep chart are gnuplot scripts run by gnuplot (data and script are kept beside them).
 *
 *   chart_schedule(&run, "out/schedule.png", CHART_PNG, &err);
 *   chart_memory(&run, "out", &err);            // out/memory.png (+ memory.dat, memory.gp)
 */
#ifndef PIPER_REPORT_CHART_H
#define PIPER_REPORT_CHART_H

#include <glib.h>
#include <stdbool.h>

#include "report.h"

enum chart_format { CHART_PNG, CHART_SVG, CHART_PDF };
bool chart_format_parse(const char *name, enum chart_format *out);

/* The devices drawn: all when there are at most max_rows, else the dp rank 0 device of each
 * pp rank (at most max_rows of them, evenly spaced). Returns indices into r->devices. */
uint32_t *chart_pick_devices(const struct report_run *r, uint32_t max_rows, uint32_t *n);

bool chart_schedule(const struct report_run *r, const char *path, enum chart_format f,
                    GError **err);
/* dir/memory.png from dir/memory.dat and dir/memory.gp. */
bool chart_memory(const struct report_run *r, const char *dir, GError **err);
/* Runs gnuplot on script (in dir). */
bool chart_run_gnuplot(const char *dir, const char *script, GError **err);

#endif
