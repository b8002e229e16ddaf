/* chart-impl: what the chart sources (chart.c, chart_points.c) share: the one writer of a Cairo
 * chart into a file. Private to report/. */
#ifndef PIPER_REPORT_CHART_IMPL_H
#define PIPER_REPORT_CHART_IMPL_H

#include <cairo.h>

#include "chart.h"

/* Draws a width x height chart by draw(cr, what) and writes it to path in format f through
 * piper_out: a chart that cannot be drawn whole is no file (err says why). */
bool chart_write_cairo(const char *path, double width, double height, enum chart_format f,
                       void (*draw)(cairo_t *cr, const void *what), const void *what,
                       GError **err);

#endif
