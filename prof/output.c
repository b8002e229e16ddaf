/* prof output: the profile piper-sim reads (sim/profile.h): the machine's facts and how each
 * figure was measured ("sources"), then "device", "network", "host", "memory", the collectives'
 * fits and the "measured" table, from what the run found (struct prof_run, rank 0). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/base.h"
#include "../base/version.h"
#include "../exec/backend.h"
#include "../exec/gpu_layout.h"
#include "../sim/profile.h"
#include "prof-impl.h"

/* The CPU's model name from /proc/cpuinfo ("unknown" elsewhere). */
static char *cpu_model(void) {
  char *text = NULL;
  if (!g_file_get_contents("/proc/cpuinfo", &text, NULL, NULL))
    return g_strdup("unknown");
  char *name = NULL;
  for (char *line = strtok(text, "\n"); line && !name; line = strtok(NULL, "\n"))
    if (g_str_has_prefix(line, "model name")) {
      char *colon = strchr(line, ':');
      name = g_strdup(g_strstrip(colon ? colon + 1 : line));
    }
  g_free(text);
  return name ? name : g_strdup("unknown");
}

static double load_average(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1)
      l = -1;
    fclose(f);
  }
  return l;
}

struct machine_facts {
  char *cpu, date[32], *command;
  long cores;
  double memory_gib, load;
};

static void machine_facts_init(struct machine_facts *mf, const struct prof_run *r, int argc,
                               char **argv) {
  mf->cpu = cpu_model();
  mf->cores = sysconf(_SC_NPROCESSORS_ONLN);
  mf->memory_gib = prof_physical_memory_bytes() / 1073741824.0;
  mf->load = load_average();
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(mf->date, sizeof mf->date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  GString *cmd = g_string_new("");
  const char *blas = getenv("OPENBLAS_NUM_THREADS");
  if (blas)
    g_string_append_printf(cmd, "OPENBLAS_NUM_THREADS=%s ", blas);
  if (r->size > 1)
    g_string_append_printf(cmd, "mpirun -np %d ", r->size);
  for (int i = 0; i < argc; i++)
    g_string_append_printf(cmd, "%s%s", i ? " " : "", argv[i]);
  mf->command = g_string_free(cmd, FALSE);
}

static void machine_facts_free(struct machine_facts *mf) {
  g_free(mf->cpu);
  g_free(mf->command);
}

static cJSON *sources_json(const struct prof_run *r, const struct machine_facts *mf) {
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "command", mf->command);
  cJSON_AddStringToObject(s, "date", mf->date);
  cJSON_AddStringToObject(s, "backend", r->a->backend);
  cJSON *m = cJSON_AddObjectToObject(s, "machine");
  cJSON_AddStringToObject(m, "cpu", mf->cpu);
  cJSON_AddNumberToObject(m, "cores", (double)mf->cores);
  cJSON_AddNumberToObject(m, "memory_gib", prof_round_sig(mf->memory_gib, 3));
  cJSON_AddNumberToObject(m, "load_average_1min", mf->load);
  cJSON_AddNumberToObject(m, "ranks", r->size);
  const char *blas = getenv("OPENBLAS_NUM_THREADS");
  cJSON_AddStringToObject(m, "openblas_threads", blas ? blas : "unset");
  if (r->gpu_name[0]) {
    cJSON_AddStringToObject(m, "gpu", r->gpu_name);
    cJSON_AddNumberToObject(m, "gpu_memory_gib", prof_round_sig(r->gpu_memory_gib, 4));
    cJSON_AddNumberToObject(m, "gpu_sms", r->gpu_sms);
    cJSON_AddStringToObject(
        s, "measured",
        "every distinct (op kind, shape) of the models: the cuda backend's kernel table (CUDA "
        "kernels, cuBLASLt GEMMs in the precision the executor uses for the model: bf16 "
        "operands with fp32 accumulation for bf16 models, fp32 for fp32 models) for F, BI, BW "
        "and the fused B, each call one task on one CUDA stream timed by the CUDA events the "
        "backend records around it (the trace's clock); the median over repeats after warm-up. "
        "0 where the executor runs nothing (embedding BI, residual-add BW)");
    cJSON_AddStringToObject(
        s, "device",
        "peak_tflops: median rate of the largest SwiGLU MLP forward (three GEMMs) through the "
        "backend, bf16 and fp32; memory_bandwidth_gbs: a device-to-device copy, 2 bytes moved "
        "per byte; both achieved rates (efficiencies 1). kernel_overhead_us and "
        "optimizer_bytes_per_param: least-squares line through fused AdamW's median times at 4 "
        "sizes: intercept; slope times the copy bandwidth. host: instruction_overhead_us = a "
        "no-op task and an event record through the cuda backend (the host thread's enqueue "
        "cost)");
  } else {
    cJSON_AddStringToObject(
        s, "measured",
        "every distinct (op kind, shape) of the models: the host kernels the executor calls for F, "
        "BI, BW and the fused B, run in the executor's order over the whole model (forward of "
        "every op for 4 micro-batches of buffers, then BI in reverse, BW, B; weights shared), "
        "each call timed where it stands; the median over repeats after warm-up, micro-batches "
        "and layers; 0 where the executor runs nothing (embedding BI, residual-add BW). A model "
        "too large for that is timed op by op, alone");
    cJSON_AddStringToObject(
        s, "device",
        "peak_tflops: median rate of one kernels_gemm of n^3 fp32 (bf16 the same: the host "
        "computes in fp32); memory_bandwidth_gbs: triad a = b + s*c, 12 bytes per element; both "
        "are achieved rates, so the efficiencies are 1. kernel_overhead_us and "
        "optimizer_bytes_per_param: least-squares line (relative residuals) through AdamW's "
        "median times per segment, run after each backward sweep of the executor-order runs "
        "(else at 4 sizes up to the largest model's parameter count, caches cold): intercept; "
        "slope times the triad bandwidth. host: cores_per_node = online processors; "
        "instruction_overhead_us = a no-op task and an event record through the host backend's "
        "loop; comm_test_us = one MPI_Test of a pending receive; wait_core_share: rank 0 "
        "computing GEMMs, the last rank waiting for a receive from it in the backend's loop, "
        "the others asleep (no pinning): the waiter's CPU time over its wait; wake_latency_us: two ranks pinned "
        "to one core, one computing, the other waiting in the backend's loop: how late the "
        "waiter sees the message; loop_spin_us: how long the backend's idle loop polls before "
        "it sleeps between polls (a constant of its code); loop_late_us: rank 0 computes 2 ms, "
        "then sends the last rank, which waits for it, 32 KiB, the others asleep (a core for "
        "each): the median time from the send's post to the receive seen through the backend's "
        "loop (tasks on streams) less the same exchange polled without sleeping, 7 rounds in "
        "turns; eager_bytes: the largest of 256 B, 512 B, ... 1 MiB whose send from rank 0 "
        "completes (rank 0 polling) before the last rank posts its receive 2 ms later");
  }
  cJSON_AddStringToObject(
      s, "network",
      r->network_measured
          ? "collectives.intra_node: one fit per operation over every group size from 2 to the "
            "ranks launched and sizes 8 B to 8 MiB: time = steps(p) latency + share(p) bytes / "
            "bandwidth with the simulator's ring terms, least squares with relative residuals; "
            "piper-sim uses these. The 'nvlink' keys (for older readers) are the point-to-point "
            "fit, efficiency the all-reduce's bandwidth over it. sources.collectives: per "
            "operation the points (ranks, bytes, us), the line at the largest group and the "
            "fit's link terms. gpus_per_node 64: every rank of a run on one machine is on one "
            "node, sharing host.cores_per_node cores"
          : "not measured (one process; run under mpirun -np 2 or more): the link is the triad "
            "bandwidth with no latency, a stand-in for shared-memory MPI");
  if (r->fits)
    cJSON_AddItemReferenceToObject(s, "collectives", r->fits);
  return s;
}

static cJSON *device_json(const struct prof_run *r, const struct machine_facts *mf) {
  cJSON *d = cJSON_CreateObject();
  cJSON *pk = cJSON_AddObjectToObject(d, "peak_tflops");
  double tf = prof_round_sig(r->gemm_flops / 1e12, 4);
  /* the host computes bf16 in fp32; a GPU has its own bf16 rate */
  cJSON_AddNumberToObject(
      pk, "bf16", r->gpu_name[0] ? prof_round_sig(r->gemm_flops_bf16 / 1e12, 4) : tf);
  cJSON_AddNumberToObject(pk, "fp32", tf);
  cJSON_AddNumberToObject(d, "memory_bandwidth_gbs", prof_round_sig(r->triad_bytes / 1e9, 4));
  cJSON_AddNumberToObject(d, "memory_capacity_gib",
                          prof_round_sig(r->gpu_name[0] ? r->gpu_memory_gib : mf->memory_gib, 3));
  cJSON_AddNumberToObject(d, "compute_efficiency", 1);
  cJSON_AddNumberToObject(d, "memory_efficiency", 1);
  cJSON_AddNumberToObject(d, "kernel_overhead_us", prof_round_sig(r->adamw_overhead * 1e6, 3));
  cJSON_AddNumberToObject(d, "optimizer_bytes_per_param",
                          prof_round_sig(r->adamw_per_param * r->triad_bytes, 3));
  if (r->weight_copy_bytes_per_param > 0)
    cJSON_AddNumberToObject(d, "weight_copy_bytes_per_param",
                            prof_round_sig(r->weight_copy_bytes_per_param, 3));
  return d;
}

static cJSON *network_json(const struct prof_run *r) {
  double lat = r->network_measured ? r->p2p_latency : 0;
  double bw = r->network_measured ? r->p2p_bandwidth : r->triad_bytes;
  double eff = r->network_measured && bw > 0 ? r->ar_bandwidth / bw : 1;
  eff = eff > 1 ? 1 : eff < 1e-3 ? 1e-3 : eff;
  cJSON *n = cJSON_CreateObject();
  cJSON_AddNumberToObject(n, "gpus_per_node", 64);
  cJSON_AddNumberToObject(n, "nics_per_node", 1);
  cJSON_AddNumberToObject(n, "nvlink_bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
  cJSON_AddNumberToObject(n, "nvlink_latency_us", prof_round_sig(lat * 1e6, 3));
  cJSON_AddNumberToObject(n, "nic_bandwidth_gbs", prof_round_sig(bw / 1e9, 4));
  cJSON_AddNumberToObject(n, "inter_node_latency_us", prof_round_sig(lat * 1e6, 3));
  cJSON_AddNumberToObject(n, "efficiency", prof_round_sig(eff, 3));
  cJSON_AddStringToObject(n, "collective_algorithm", "ring");
  return n;
}

static cJSON *host_json(const struct prof_run *r) {
  cJSON *h = cJSON_CreateObject();
  /* the host backend runs each rank from one loop on the cores (the simulator models it);
   * the cuda backend's host thread only enqueues */
  cJSON_AddStringToObject(h, "executor", strcmp(r->a->backend, "host") == 0 ? "loop" : "enqueue");
  cJSON_AddNumberToObject(h, "cores_per_node", r->cores);
  cJSON_AddNumberToObject(h, "instruction_overhead_us",
                          prof_round_sig(r->instruction_overhead * 1e6, 3));
  if (r->comm_measured) {
    cJSON_AddNumberToObject(h, "wait_core_share", prof_round_sig(r->wait_share, 3));
    cJSON_AddNumberToObject(h, "comm_test_us", prof_round_sig(r->comm_test * 1e6, 3));
    cJSON_AddNumberToObject(h, "wake_latency_us", prof_round_sig(r->wake_latency * 1e6, 3));
    cJSON_AddNumberToObject(h, "loop_spin_us", EXEC_HOST_IDLE_SPIN_US);
    cJSON_AddNumberToObject(h, "loop_late_us", prof_round_sig(r->loop_late * 1e6, 3));
    /* 0 (none eager) still says sends wait for their receiver: write 1 byte then */
    cJSON_AddNumberToObject(h, "eager_bytes", r->eager_bytes > 0 ? r->eager_bytes : 1);
  }
  return h;
}

/* How the measured backend holds memory: constants of its code (PROF_HELD_*; the cuda
 * backend's activations: exec_gpu_act_dtype's width for a bf16 model), written so that the
 * simulator's memory figures of a bf16 model are what this backend holds. The activations'
 * width is written only where it is not the model's own (the datasheet profiles write none:
 * the simulator then counts the model's dtype), so an fp32 model is never counted narrower. */
static cJSON *memory_json(const struct prof_run *r) {
  cJSON *m = cJSON_CreateObject();
  size_t act = strcmp(r->a->backend, "cuda") == 0
                   ? model_dtype_bytes(exec_gpu_act_dtype(MODEL_DTYPE_BF16))
                   : PROF_HELD_ELEMENT_BYTES;
  if (act != model_dtype_bytes(MODEL_DTYPE_BF16))
    cJSON_AddNumberToObject(m, "activation_bytes_per_element", (double)act);
  cJSON_AddNumberToObject(m, "param_bytes_per_param", PROF_HELD_ELEMENT_BYTES);
  cJSON_AddNumberToObject(m, "grad_bytes_per_param", PROF_HELD_ELEMENT_BYTES);
  cJSON_AddNumberToObject(m, "optimizer_state_bytes_per_param", PROF_HELD_OPTIMIZER_BYTES);
  cJSON_AddNumberToObject(m, "compute_copy_bytes_per_param", r->compute_copy_bytes_per_param);
  return m;
}

static cJSON *profile_json(const struct prof_run *r, const struct machine_facts *mf) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "name", strcmp(r->a->backend, "host") == 0 ? "host-cpu"
                                        : r->gpu_name[0]                   ? r->gpu_name
                                                                           : "cpu");
  cJSON_AddStringToObject(root, "kind", "device");
  char *desc = g_strdup_printf(
      "piper-exec's %s backend, measured by piper-prof %s on %s (%ld cores, %d rank%s, "
      "OPENBLAS_NUM_THREADS=%s, load %.2f) on %s: %u kernel entries for the models %s",
      r->a->backend, PIPER_VERSION, mf->cpu, mf->cores, r->size, r->size == 1 ? "" : "s",
      getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset", mf->load, mf->date,
      r->n_entries, r->a->model);
  cJSON_AddStringToObject(root, "description", desc);
  g_free(desc);
  cJSON_AddItemToObject(root, "sources", sources_json(r, mf));
  cJSON_AddItemToObject(root, "device", device_json(r, mf));
  cJSON_AddItemToObject(root, "network", network_json(r));
  cJSON_AddItemToObject(root, "host", host_json(r));
  cJSON_AddItemToObject(root, "memory", memory_json(r));
  if (r->fit_json)
    cJSON_AddItemReferenceToObject(cJSON_AddObjectToObject(root, "collectives"), "intra_node",
                                   r->fit_json);
  cJSON_AddItemReferenceToObject(root, "measured", r->measured);
  return root;
}

bool prof_write_profile(const struct prof_run *r, int argc, char **argv, GError **err) {
  struct machine_facts mf = {0};
  machine_facts_init(&mf, r, argc, argv);
  cJSON *root = profile_json(r, &mf);
  struct profile *check = profile_parse_json(r->a->out, root, err);
  bool ok = check != NULL;
  profile_free(check);
  if (ok) {
    char *text = cJSON_Print(root);
    size_t len = strlen(text);
    text = g_realloc(text, len + 2);
    text[len] = '\n', text[len + 1] = 0;
    ok = piper_write_file(r->a->out, text, len + 1, err);
    g_free(text);
  }
  cJSON_Delete(root);
  machine_facts_free(&mf);
  return ok;
}
