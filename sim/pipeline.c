/* sim pipeline: model + directive program -> per-device plans for piper-sim, its sweep, tests
 * and benchmarks, through the front end piper-compile and piper-exec use (directives/compile.h). */
#include "../directives/compile.h"
#include "sim.h"

struct plan *sim_compile(const char *model_path, const char *directives_path,
                         const struct sched_options *sched, int pp_regions, GError **err) {
  struct compile_options o = compile_options_default();
  o.model_path = model_path;
  o.directives_path = directives_path;
  o.pp_regions = pp_regions;
  if (sched) {
    o.have_schedule = true;
    o.schedule = *sched;
  }
  struct compile_result r;
  if (!compile_run(&o, &r, err))
    return NULL;
  struct plan *plan = r.plan;
  r.plan = NULL; /* the caller owns the plan; the rest goes */
  compile_result_free(&r);
  return plan;
}
