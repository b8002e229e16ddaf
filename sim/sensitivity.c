/* sensitivity: how much the simulated step moves when one family of costs (GEMMs, attention,
 * collectives, memory-bound kernels) is off by a fraction (sim.h, sim_sensitivity_run). */
#include "sim.h"

bool sim_sensitivity_run(const struct plan *p, const struct profile *prof,
                         const struct sim_options *o, double step, double delta,
                         struct sim_sensitivity *out, GError **err) {
  *out = (struct sim_sensitivity){.delta = delta, .step = step};
  /* a copy that shares the profile's tables: only its scales change */
  struct profile scaled = *prof;
  struct sim_options q = o ? *o : (struct sim_options){.collapse = true};
  q.no_intervals = true;
  q.no_memory_timeline = true;
  q.critical_path = false;
  for (int f = 0; f < PROFILE_FAMILY_COUNT; f++) {
    for (int sign = -1; sign <= 1; sign += 2) {
      for (int k = 0; k < PROFILE_FAMILY_COUNT; k++)
        scaled.family_scale[k] = prof->family_scale[k];
      scaled.family_scale[f] *= 1 + sign * delta;
      struct sim_result *r = sim_run(p, &scaled, &q, err);
      if (!r)
        return false;
      (sign < 0 ? out->minus : out->plus)[f] = r->iteration_time;
      sim_result_free(r);
    }
  }
  return true;
}
