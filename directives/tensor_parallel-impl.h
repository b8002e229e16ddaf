/* tensor_parallel-impl: the hooks by which apply.c runs the tensor-parallel rewrite
 * (directives/tensor_parallel.c) inside its phase order. Private to directives/. */
#ifndef PIPER_DIRECTIVES_TENSOR_PARALLEL_IMPL_H
#define PIPER_DIRECTIVES_TENSOR_PARALLEL_IMPL_H

#include "directives.h"

/* Phase 4b, after replicate / shard: every tensor_parallel directive divides the nodes it
 * matches (tp_degree, replica / shard degree, segment TP degrees, saved and, under sequence
 * parallelism, sent activations). Errors name the file, the directive and the numbers. */
bool dir_tp_apply(const struct dir_program *p, struct ir_graph *g, GError **err);
/* After the gradient buckets: data-parallel collectives and optimizers of divided segments run
 * over one TP rank's devices and move the divided bytes. */
void dir_tp_fix_data_parallel(struct ir_graph *g);
/* After the all-to-alls, before send / recv: the TP collectives of every divided node. */
void dir_tp_insert_comm(struct ir_graph *g);

#endif
