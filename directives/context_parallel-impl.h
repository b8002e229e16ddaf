/* context_parallel-impl: the hooks by which apply.c runs the context-parallel rewrite
 * (directives/context_parallel.c) inside its phase order. Private to directives/. */
#ifndef PIPER_DIRECTIVES_CONTEXT_PARALLEL_IMPL_H
#define PIPER_DIRECTIVES_CONTEXT_PARALLEL_IMPL_H

#include "directives.h"

/* Phase 4b, after tensor_parallel: marks every compute node with the program's CP degree and
 * checks that each runs on tp x cp x d devices it is replicated over. Errors name the file,
 * the directive and the node. */
bool dir_cp_apply(const struct dir_program *p, struct ir_graph *g, GError **err);
/* Last, after send / recv (every edge of a compute node then stays inside its device group)
 * and `order` (an exchange inherits its compute's waits, so it starts with it): the K/V
 * exchange nodes of every attention compute node, with their compute's priority. */
void dir_cp_insert_comm(struct ir_graph *g);

#endif
