/* sim pipeline: model + directive program -> per-device plans, the compile steps of a run
 * (the same steps piper-compile takes), shared by piper-sim, its sweep, tests and benchmarks. */
#include <stdlib.h>

#include "../ir/json.h"
#include "sim.h"

struct plan *sim_compile(const char *model_path, const char *directives_path,
                         const struct sched_options *sched, int pp_regions, GError **err) {
  struct model *m = NULL;
  struct dir_program *prog = NULL;
  struct ir_graph *g = NULL;
  struct plan *plan = NULL;
  char *text = NULL;

  m = model_load_file(model_path, pp_regions, err);
  if (!m)
    goto out;
  prog = dir_program_load_file(directives_path, err);
  if (!prog)
    goto out;
  if (sched && !sched_prepare_program(prog, (uint32_t)m->pp_regions, sched, err))
    goto out;
  g = ir_graph_build(m);
  if (!g) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot build the training graph",
                model_path);
    goto out;
  }
  if (!dir_program_apply(prog, g, 0, err))
    goto out;
  cJSON *pj = dir_program_to_json(prog);
  text = cJSON_Print(pj);
  cJSON_Delete(pj);
  plan = plan_lower(g, text, err);
out:
  free(text);
  if (g)
    ir_graph_free(g);
  dir_program_free(prog);
  model_free(m);
  return plan;
}
