/* report: the run directory (docs/design.md, "Outputs and exit statuses"), shared by piper-sim
 * (simulated runs) and piper-exec (measured runs), read back by piper-compare. It takes per-device
 * intervals (what ran on which stream, when) and memory numbers, derives the pinned metrics
 * (bubble, exposed communication, overlap: stats.c), writes the directive program, results.csv,
 * metrics.json and trace.json (write.c) and reads a run directory back (read.c); chart.h draws its
 * pictures. It depends on base/, models/ and ir/ only.
 *
 *   const struct plan *plan = NULL;           // from compile_run or plan_read_dir
 *   struct report_interval ran[] = {{.start = 0, .end = 1e-3, .node = 0, .stream = 0}};
 *   double step_s = 1e-3;
 *   GError *err = NULL;
 *   struct report_run r = {.plan = plan, .kind = "sim", .schedule = "1f1b",
 *                          .n_iterations = 1, .iteration_times = &step_s};
 *   report_run_init_devices(&r);              // devices[], pp/dp ranks from the plan
 *   r.devices[0].intervals = ran;             // (and .memory) not owned by the report
 *   r.devices[0].n_intervals = 1;
 *   report_compute_stats(&r);
 *   if (!report_write_dir(&r, "out/run", &err))
 *     fprintf(stderr, "%s\n", err->message);
 *   report_run_free_devices(&r);
 */
#ifndef PIPER_REPORT_REPORT_H
#define PIPER_REPORT_REPORT_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/plan.h"

enum report_mem_kind {
  REPORT_MEM_PARAMS,
  REPORT_MEM_GRADS,
  REPORT_MEM_OPTIMIZER,
  REPORT_MEM_ACTIVATIONS,
  REPORT_MEM_GATHERED, /* ZeRO-3 parameters gathered for a use */
  REPORT_MEM_COMM,     /* receive and collective buffers */
  REPORT_MEM_KIND_COUNT
};
const char *report_mem_kind_name(enum report_mem_kind k);

/* One instruction that ran: plan node and stream, seconds on a clock shared by all devices.
 * wait: how long before start the instruction was posted. The simulator starts a
 * communication's box when its parties meet, so a receive posted early waits first (the
 * waiting shows as idle, not as communication, in the figures); a measured box starts at the
 * post, wait 0. Comparisons take durations from the post (wait + end - start) on both sides. */
struct report_interval {
  double start, end;
  uint32_t node;
  uint32_t stream;
  double wait;
};

/* One instruction of a critical path: the device and stream it ran on, when. */
struct report_path_step {
  uint32_t device, stream;
  double start, end;
};

/* Memory held by kind from time t on (static kinds included). */
struct report_memory_point {
  double t;
  uint64_t bytes[REPORT_MEM_KIND_COUNT];
};

struct report_device {
  uint32_t device;
  int32_t pp_rank, dp_rank; /* from the plan (report_run_init_devices) */
  int32_t tp_rank;          /* position in its tensor-parallel group (0 without TP) */
  /* inputs; not owned: devices that behave alike may share one array */
  uint32_t n_intervals;
  const struct report_interval *intervals; /* sorted by start */
  uint32_t n_memory;
  const struct report_memory_point *memory; /* sorted by t; may be empty */
  uint64_t peak_memory_bytes;
  uint64_t peak_breakdown[REPORT_MEM_KIND_COUNT]; /* at the moment of the peak */
  /* optional, measured runs: every traced step, for trace.json. Step k (of the run's
   * n_trace_steps) is all_intervals[step_begin[k], step_begin[k + 1]), sorted by start;
   * intervals above is one of them (the one the statistics and charts describe). NULL: the
   * trace holds intervals alone, as one step. */
  const struct report_interval *all_intervals;
  const uint32_t *step_begin; /* [n_trace_steps + 1] */
  /* derived by report_compute_stats (docs/design.md, "The simulator's definitions") */
  double compute_s;        /* time with some compute running */
  double comm_s;           /* time with some communication running */
  double bubble_fraction;  /* 1 - compute_s / iteration time */
  double exposed_comm_s;   /* communication running, no compute */
  double overlap_fraction; /* communication under compute / comm_s (0 without comm) */
  double idle_s;           /* nothing running */
  /* The bubble split: bubble_fraction * iteration time = pipeline_idle_s + exposed_comm_s +
   * imbalance_s. imbalance_s is the part of idle_s the device would have spent computing had
   * it as much compute as the busiest device of the run (min(idle_s, max compute_s -
   * compute_s): the extra work of an LM-head or embedding stage); pipeline_idle_s is the rest
   * of idle_s (fill, drain and waits of the schedule itself). */
  double pipeline_idle_s;
  double imbalance_s;
};

struct report_run {
  const struct plan *plan;  /* nodes, streams, model, program */
  const char *kind;         /* "sim" or "exec" */
  const char *schedule;     /* schedule family name, or "custom" */
  const char *program_file; /* "<schedule>_pp<R>_mbs<M>.json" */
  uint32_t n_iterations;    /* >= 1 */
  const double *iteration_times;
  double peak_flops_per_device; /* for MFU; 0 = unknown (MFU written as null) */
  double memory_capacity_bytes; /* a device's memory (memory.png's line); 0 = unknown */
  const char *capacity_source;  /* where it comes from ("profile h100-sxm"), or NULL */
  uint32_t pp, dp;              /* set by report_run_init_devices */
  uint32_t tp;                  /* tensor-parallel degree, 1 = none (the same) */
  /* context-parallel degree, 1 = none. Its ranks count in dp (each runs its own share of
   * every sequence, its tokens and FLOPs the model's per-rank ones, models/model.h), so
   * tokens and MFU sum over them; dp / cp is the data-parallel degree. */
  uint32_t cp;
  uint32_t n_devices;
  struct report_device *devices;
  cJSON *extra;                /* owned by the caller; its items are copied into metrics.json */
  uint32_t trace_device_limit; /* trace every device when the trace would hold at most this
                                  many events in all, else one device per pp rank; 0 = all */
  uint32_t n_trace_steps;      /* steps in devices' all_intervals; 0: one step (intervals) */
  const uint32_t *trace_steps; /* [n_trace_steps]: the training step number of each */
  /* optional, what-if runs (piper-sim --scenario): devices the schedule chart gives a row and
   * marks with their note ("compute x1.5"), and the step's critical path, drawn over the rows
   * that hold its steps. Zero: none. */
  uint32_t n_marked;
  const uint32_t *marked;            /* device ids */
  const char *const *marked_notes;   /* [n_marked] */
  uint32_t n_path;
  const struct report_path_step *path; /* in time order */
};

/* Allocates devices[] (one per plan device) and fills device, pp_rank and dp_rank: a device's
 * pp rank is the position of its lowest PP stage among the devices' lowest stages; its dp rank
 * its position among the devices of its pp rank. pp = pp ranks, dp = devices per pp rank. */
void report_run_init_devices(struct report_run *r);
void report_run_free_devices(struct report_run *r);

/* First start and last end over every device's intervals (0, 0 without intervals). */
void report_run_window(const struct report_run *r, double *t0, double *t1);
/* Iteration time of the run (first start to last end over every device). */
double report_iteration_time(const struct report_run *r);
/* Decoder layers of the PP stages device d computes (the model's pp_layers summed over them):
 * its share of the model under uneven stages. */
int64_t report_device_layers(const struct plan *p, const struct report_device *d);
/* Fills the derived fields of every device from its intervals, over [t0, t0 + iter). */
void report_compute_stats(struct report_run *r);

/* The run's bubble split, means over devices of each part as a fraction of the iteration
 * time: bubble = pipeline_idle + exposed_comm + imbalance (report_compute_stats done). */
struct report_bubble_split {
  double bubble, pipeline_idle, exposed_comm, imbalance;
};
struct report_bubble_split report_bubble_split(const struct report_run *r);

/* Global figures. */
double report_tokens_per_iteration(const struct report_run *r);
double report_mean_iteration_time(const struct report_run *r, double *stddev);

/* Writes dir/<program_file>, results.csv, metrics.json and trace.json (creating dir). */
/* A new run directory PARENT/YYYYmmdd_HHMMSS (then _2, _3, ... within one second), created
 * here, never one an earlier run made. Returns the path (g_free), NULL with err. */
char *report_run_dir_new(const char *parent, GError **err);
/* An explicit run directory (--out DIR), made if it does not exist: refused with an input
 * error naming DIR when it cannot be made or written, or, unless force, naming the file found
 * when it holds another run's metrics.json, results.csv, trace.json or sweep.csv. */
bool report_run_dir_claim(const char *dir, bool force, GError **err);

bool report_write_dir(const struct report_run *r, const char *dir, GError **err);
bool report_write_results_csv(const struct report_run *r, const char *path, GError **err);
cJSON *report_metrics_json(const struct report_run *r);
bool report_write_trace(const struct report_run *r, const char *path, GError **err);

/* Kind of node: compute (compute and optimizer nodes) or communication. */
bool report_node_is_compute(const struct ir_node *n);

/* ---- reading a run directory back (piper-compare) -------------------------------------------
 * The inverse of report_write_dir for the figures a comparison needs. It sits beside the writer
 * so that a change of format changes both. A missing or malformed file, or files of one directory
 * that disagree (results.csv against metrics.json against trace.json), is a PIPER_ERROR_INPUT
 * naming the file and the key.
 *
 *   GError *err = NULL;
 *   struct report_dir *d = report_dir_load("out/run", &err);
 *   if (d)
 *     printf("%s: %g s\n", d->kind, d->iteration_time_s);
 *   report_dir_free(d);
 */

/* Instructions of one kind in trace.json: compute by pass ("F", "B", "BI", "BW"), "optimizer",
 * communication by kind and the pass it serves ("send F", "all_to_all B", "all_reduce"). */
struct report_trace_kind {
  char name[48];
  uint32_t rank; /* sort key: compute passes, communication kinds by pass, optimizer, unknown */
  uint64_t count;
  double total_s; /* sum of the events' durations from their posts (trace args wait_us) */
};

/* One IR node of one device in trace.json (the event's name names the node, micro-batch
 * included), with its duration over the trace's steps. */
struct report_trace_node {
  char *name;
  uint32_t device;
  uint32_t ordinal;    /* nodes of this name on this device before it (names need not be
                          unique: an all-to-all's dispatch and combine share one) */
  int32_t micro_batch; /* args.MB, -1 without */
  int32_t stage;       /* args.PP, -1 without */
  uint32_t kind;       /* index into trace_kinds */
  uint32_t ir_kind;    /* enum ir_node_kind, IR_NODE_KIND_COUNT when this build does not know it */
  uint32_t pass;       /* enum ir_pass (IR_PASS_NONE without) */
  uint32_t n_events;   /* one per step it ran in */
  double median_s;     /* median duration over those steps, from the post (wait_s + dur_s) */
};

/* One instruction event: times in seconds from the trace's zero. */
struct report_trace_event {
  double start_s, dur_s;
  double wait_s;   /* posted this long before start_s (args wait_us; 0 without) */
  uint32_t node;   /* index into trace_nodes */
  uint32_t stream; /* the event's tid */
  uint32_t step;   /* index into trace_steps */
};

#define REPORT_TRACE_MAX_TID (1 << 20) /* streams of a device: far more than a plan has */

/* A stream's name on a device (trace.json's thread_name). */
struct report_trace_thread {
  uint32_t device, stream;
  char name[64];
};

struct report_dir {
  char *path;
  char *program_file; /* the "<schedule>_pp<R>_mbs<M>.json" file's name inside path */
  cJSON *program;     /* that directive program, parsed */
  cJSON *metrics;     /* metrics.json; the strings below point into it */
  const char *kind;   /* "sim" or "exec": metrics.json "kind", else what its keys say */
  const char *model, *schedule;
  uint32_t pp, dp, n_devices, num_microbatches;
  int64_t micro_batch_size, seq_len;
  uint32_t n_iterations; /* iteration_times_s entries (steps measured; 1 for sim) */
  double iteration_time_s, iteration_time_std_s, throughput_tokens_per_s;
  double tokens_per_iteration, model_flops_per_iteration;
  double mfu; /* NAN when null (synthetic profile, measured run) */
  /* per device from metrics.json: device, pp/dp rank, the derived figures (busy_s is
   * compute_s), peak_memory_bytes and peak_breakdown; no intervals or memory timeline */
  struct report_device *devices;
  uint32_t results_rows;  /* rows of results.csv (one per dp rank) */
  uint32_t trace_devices; /* devices with instruction events in trace.json */
  uint32_t n_trace_kinds;
  struct report_trace_kind *trace_kinds; /* sorted by rank, then name; count is events in all
                                            steps */
  /* the steps the trace holds: their training step numbers, ascending (traces written before
   * events carried "step" hold one step, numbered 0) */
  uint32_t n_trace_steps;
  uint32_t *trace_steps;
  uint32_t n_trace_nodes;
  struct report_trace_node *trace_nodes; /* in order of first appearance */
  uint64_t n_trace_events;
  struct report_trace_event *trace_events; /* in file order */
  uint32_t n_trace_threads;
  struct report_trace_thread *trace_threads;
};

/* Reads dir's program file, results.csv, metrics.json and trace.json. trace.json is read
 * event by event, so a trace larger than JSON_MAX_FILE_BYTES is fine. */
struct report_dir *report_dir_load(const char *dir, GError **err);
void report_dir_free(struct report_dir *d);

/* The time range of step k (an index into trace_steps) on the given devices (all when NULL):
 * first start and last end of its events, seconds (0, 0 without events). */
void report_dir_step_window(const struct report_dir *d, uint32_t k, const bool *devices, double *t0,
                            double *t1);

/* ---- matching two runs of one plan node by node ---------------------------------------------
 * A node of A and one of B pair up when they ran on the same device and name the same IR node
 * (micro-batch included; the k-th node of a name pairs with the k-th). ratio = B/A of their median durations; error = max(B/A, A/B) - 1,
 * so that either side may be the prediction (0 for equal, 1 for a factor of two either way,
 * INFINITY when exactly one of them is 0).
 *
 *   const struct report_dir *a = NULL, *b = NULL;  // from report_dir_load
 *   uint32_t n = 0, only_a = 0, only_b = 0;
 *   struct report_node_pair *pairs = report_pair_nodes(a, b, &n, &only_a, &only_b);
 *   g_free(pairs);
 */
struct report_node_pair {
  const struct report_trace_node *a, *b;
  double ratio, error;
};

/* Every pair, sorted by error (largest first; ties by device, then name). *only_a and *only_b
 * count the nodes of one side the other lacks. */
struct report_node_pair *report_pair_nodes(const struct report_dir *a, const struct report_dir *b,
                                           uint32_t *n_pairs, uint32_t *only_a, uint32_t *only_b);

#endif
