/* sim scenario: what-ifs on individual devices and links for one simulated step (docs/sim.md,
 * "What-if scenarios"): slow devices (a factor on compute, on chosen devices or drawn with a
 * seed), degraded or failed links and NICs, jitter per kernel or per device. The engine asks a
 * scenario for each device's compute factor and link bandwidth; devices a scenario treats alike
 * still collapse into one simulated unit.
 *
 *   GError *err = NULL;
 *   const struct plan *plan = NULL;             // from compile_run or plan_read_dir
 *   struct sim_scenario *sc = sim_scenario_load("docs/examples/slow-gpu.json", plan, &err);
 *   if (sc)                                     // sim.h: sim_options.scenario = sc
 *     printf("device 7468 computes x%g\n", sim_scenario_compute_factor(sc, 7468, 0));
 *   sim_scenario_free(sc);
 *   g_clear_error(&err);
 */
#ifndef PIPER_SIM_SCENARIO_H
#define PIPER_SIM_SCENARIO_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/plan.h"

enum sim_link_scope { SIM_LINK_INTER, SIM_LINK_INTRA, SIM_LINK_ALL };

struct sim_scenario {
  char *path;
  uint64_t seed;
  uint32_t n_devices;
  double *compute;  /* [n_devices] factor on compute time (1: healthy) */
  double *inter_bw; /* [n_devices] share of the NIC's bandwidth left (1: healthy) */
  double *intra_bw; /* [n_devices] share of the NVLink bandwidth left */
  double jitter_sigma;
  bool jitter_per_kernel; /* else one draw per device for the step */
  uint32_t n_marked;      /* devices the scenario touches, ascending (the chart marks them) */
  uint32_t *marked;
  char **marked_label; /* [n_marked] "compute x1.5", "NIC x0.5" */
};

/* Reads and checks a scenario file against the plan's devices. An input error names the file
 * and the key: `FILE: key "slow[0].factor": must be a number > 0`. */
struct sim_scenario *sim_scenario_load(const char *path, const struct plan *p, GError **err);
/* The same from parsed JSON (tests); path names it in errors. */
struct sim_scenario *sim_scenario_from_json(const cJSON *root, const char *path,
                                            const struct plan *p, GError **err);
void sim_scenario_free(struct sim_scenario *sc);

/* Factor on the compute time of instruction instr of device d (slow factor times jitter). */
double sim_scenario_compute_factor(const struct sim_scenario *sc, uint32_t d, uint32_t instr);
/* Whether device d's compute differs from instruction to instruction (per-kernel jitter). */
bool sim_scenario_varies(const struct sim_scenario *sc, uint32_t d);
/* Bandwidth share of a transfer among devices[0..n) over inter- or intra-node links: the
 * smallest share among them (1 without a scenario). */
double sim_scenario_bandwidth(const struct sim_scenario *sc, const uint32_t *devices, uint32_t n,
                              bool inter);

struct sim_result;
/* metrics.json's "scenario": the step against the healthy one (loss_fraction = step / healthy
 * - 1), the devices changed, how many end later and the most delayed, and the critical path
 * (its devices, its time on the changed devices, the communication it went through). */
cJSON *sim_scenario_report(const struct sim_scenario *sc, const struct plan *p,
                           const struct sim_result *healthy, const struct sim_result *run);
/* The summary's lines for that report (g_free). */
char *sim_scenario_summary(const cJSON *report);

#endif
