/* sim: discrete-event simulation of per-device plans on a hardware profile
 * (docs/design.md, "The simulator's definitions"). Streams run in order, cross-stream waits,
 * send/recv rendezvous and collectives that start when every member is there; concurrent kernels
 * share a device (processor sharing; communication holds a share of SMs and memory bandwidth) and
 * concurrent transfers share a device's links; memory is tracked per kind with a timeline. Devices
 * that provably behave alike are simulated once.
 *
 *   GError *err = NULL;
 *   struct plan *plan = NULL;                   // from compile_run or plan_read_dir
 *   struct profile *profile = profile_load_file("profiles/h100-sxm.json", &err);
 *   struct sim_result *r = sim_run(plan, profile, &(struct sim_options){.collapse = true}, &err);
 *   if (r) {
 *     printf("%g s\n", r->iteration_time);
 *     struct report_run run = {.plan = plan, .kind = "sim", .schedule = "1f1b"};
 *     report_run_init_devices(&run);
 *     sim_fill_report(r, &run);                 // report.h: intervals and memory per device
 *     report_run_free_devices(&run);
 *   }
 *   sim_result_free(r);
 *   profile_free(profile);
 *   g_clear_error(&err);
 */
#ifndef PIPER_SIM_SIM_H
#define PIPER_SIM_SIM_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/plan.h"
#include "profile.h"
#include "scenario.h"
#include "../report/report.h"

struct sim_options {
  /* Simulate one device per class of devices whose programs, link spans and partners are
   * equivalent (they provably run at the same times); false simulates every device. */
  bool collapse;
  bool no_intervals;       /* keep no per-instruction intervals (sweeps) */
  bool no_memory_timeline; /* keep only memory peaks */
  /* Past this many device instructions (and 64 devices), keep the memory timeline of each
   * class's first member only: those are the devices the trace and charts show at that size
   * (dp rank 0 of each pp rank is the lowest device of its stage), and a timeline for every
   * device is most of the simulator's memory under --no-collapse (two points an instruction).
   * Peaks are kept for every device. 0 keeps every timeline. */
  uint64_t memory_timeline_limit;
  /* What-ifs on devices and links (scenario.h); NULL: the healthy plan. */
  const struct sim_scenario *scenario;
  /* Trace the step's critical path back from its last instruction (sim_result.path). */
  bool critical_path;
};

/* One instruction of the critical path: what it ran on and when, and why it started then. */
enum sim_path_cause {
  SIM_PATH_FIRST,  /* nothing before it on the path: the step's start */
  SIM_PATH_STREAM, /* the previous instruction of its stream ended */
  SIM_PATH_WAIT,   /* an instruction it waits on ended */
  SIM_PATH_PEER    /* a party of its communication arrived last (another device) */
};

struct sim_path_step {
  uint32_t device, node, stream;
  double start, end;
  enum sim_path_cause cause; /* how it is tied to the step before it on the path */
};

/* A set of devices simulated as one (its representative is members[0]). */
struct sim_unit {
  uint32_t class_index;
  uint32_t n_members;
  uint32_t *members; /* ascending */
  uint32_t n_intervals;
  struct report_interval *intervals; /* sorted by start */
  uint32_t n_memory;
  struct report_memory_point *memory; /* sorted by t, static kinds included */
  uint64_t static_bytes[REPORT_MEM_KIND_COUNT];
  uint64_t peak_bytes;
  uint64_t peak_breakdown[REPORT_MEM_KIND_COUNT];
  uint64_t peak_saved_activation_bytes; /* activations saved for backward only */
  double finish; /* end of its last instruction (seconds) */
};

struct sim_result {
  double t_start, t_end, iteration_time; /* seconds */
  uint32_t n_units;
  struct sim_unit *units;
  uint32_t *device_unit;        /* [n_devices] */
  uint64_t unit_instructions;   /* instructions the engine ran */
  uint64_t device_instructions; /* the same weighted by unit size: instructions of the step */
  uint64_t events;              /* events processed */
  uint64_t measured_ops, fallback_ops; /* op executions costed by table / by roofline */
  double seconds_setup, seconds_run;   /* wall clock of the simulator itself */
  /* The stream choice that cost the most: on a stream that carries more than one
   * communicator's traffic on a device, the time communication waited for the stream after
   * its own waits were done, summed over the step; the worst (stream, device). serial_stream
   * is IR_NONE when no such stream queued anything. */
  uint32_t serial_stream, serial_device;
  double serial_seconds;
  /* sim_options.critical_path: the chain of instructions that set the step's end, in time
   * order (first to last) */
  uint32_t n_path;
  struct sim_path_step *path;
  /* the units' intervals, one block (units[k].intervals point into it; freed with free()) */
  struct report_interval *interval_block;
};

struct sim_result *sim_run(const struct plan *p, const struct profile *prof,
                           const struct sim_options *o, GError **err);
void sim_result_free(struct sim_result *r);

/* The step with each cost family of the profile (enum profile_family) scaled by 1 - delta and
 * 1 + delta in turn, the others as they are: 2 x 4 more simulations of the plan under o's
 * scenario (collapsed as o says, without intervals or memory timelines). step: the step
 * simulated unscaled, kept for the ratios. A synthetic profile's costs have no families. */
struct sim_sensitivity {
  double delta, step;
  double minus[PROFILE_FAMILY_COUNT], plus[PROFILE_FAMILY_COUNT]; /* seconds */
};
bool sim_sensitivity_run(const struct plan *p, const struct profile *prof,
                         const struct sim_options *o, double step, double delta,
                         struct sim_sensitivity *out, GError **err);

/* Static memory of a plan class (params, grads, optimizer state by the ZeRO formulas). */
void sim_static_memory(const struct plan *p, const struct plan_class *c,
                       uint64_t bytes[REPORT_MEM_KIND_COUNT]);
/* The same at the rates the profile's backend holds them (struct profile_memory; NULL: the
 * ZeRO formulas), its compute copies of GEMM weights counted as params. */
void sim_static_memory_held(const struct plan *p, const struct plan_class *c,
                            const struct profile *prof, uint64_t bytes[REPORT_MEM_KIND_COUNT]);

/* Points every device of r->devices (report_run_init_devices done) at its unit's intervals and
 * memory, and fills the peaks. */
void sim_fill_report(const struct sim_result *s, struct report_run *r);

#endif
