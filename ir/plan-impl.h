/* plan-impl: what plan.c (views, equality) and plan_json.c (the reader) share. Private to ir/. */
#ifndef PIPER_IR_PLAN_IMPL_H
#define PIPER_IR_PLAN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* Frees a class's arrays and zeroes it. */
void plan_class_clear(struct plan_class *c);
/* True when the two programs are equal; else writes what differs into what (the reader says
 * where two members of a class disagree). */
bool plan_class_diff(const struct plan_class *a, const struct plan_class *b, uint32_t n_streams,
                     char *what, size_t len);

#endif
