/* model-impl: what load.c and build.c share inside the model module; not a public interface.
 * load.c fills the configuration fields of struct model (sizes, dtype, PP split, user tags)
 * and build.c derives the rest (ops, tags, segments, edges, costs) from them.
 */
#ifndef PIPER_MODELS_MODEL_IMPL_H
#define PIPER_MODELS_MODEL_IMPL_H

#include "model.h"

/* Fills ops, op_tags, segments, edges and n_ep_regions of a model whose configuration fields
 * are set and valid. ctx names the model in messages (the only failure is a size whose bytes
 * overflow 64 bits). */
bool model_build(struct model *m, const char *ctx, GError **err);

#endif
