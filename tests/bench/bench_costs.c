/* bench_costs: a datasheet profile's cost model against measured op times (issue 31). Run from
 * the repository root:
 *   make bench && build/bench/bench_costs [DATASHEET MEASURED]
 * (defaults: profiles/h200.json against docs/gpu/h200-profile-2026-11-30-1820.json, the
 * piper-prof --backend cuda profile of that H200). For every op of llama3-8b (seq 4096, one
 * sequence: the shapes the measured profile holds) and tiny-moe whose shape the measured profile
 * has, and each pass: the model's time, the measured one and the model's error. Then the GEMMs
 * of bench_gemm's table (docs/gpu/h200-2026-11-30-1820.txt: cuBLASLt, bf16, fp32 output)
 * against the tile model, with fp32 and with bf16 output. Prints figures; asserts nothing (benchmarks are not tests). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../base/base.h"
#include "../../sim/cost.h"
#include "../../sim/profile.h"

/* the measured entry of (kind, pass, shape), or NULL */
static const struct profile_entry *find_entry(const struct profile *p, const struct model_op *op,
                                              enum ir_pass pass) {
  for (uint32_t i = 0; i < p->n_entries; i++) {
    const struct profile_entry *e = &p->entries[i];
    if (e->kind == op->kind && e->pass == pass &&
        memcmp(e->shape, op->shape, sizeof op->shape) == 0)
      return e;
  }
  return NULL;
}

static void compare_model(const struct profile *ds, const struct profile *meas, const char *path,
                          double *sum_abs, int *n) {
  GError *err = NULL;
  struct model *m = model_load_file(path, 0, &err);
  if (!m) {
    fprintf(stderr, "bench_costs: %s\n", err->message);
    g_clear_error(&err);
    return;
  }
  bool seen[MODEL_OP_KIND_COUNT] = {0};
  for (uint32_t i = 0; i < m->n_ops; i++) {
    const struct model_op *op = &m->ops[i];
    if (seen[op->kind])
      continue;
    seen[op->kind] = true;
    for (int pass = IR_PASS_F; pass <= IR_PASS_BW; pass++) {
      const struct profile_entry *e = find_entry(meas, op, (enum ir_pass)pass);
      if (!e || e->seconds <= 0)
        continue;
      double t = profile_op_cost(ds, m, i, (enum ir_pass)pass, 1, 1, false).seconds;
      double rel = t / e->seconds - 1;
      printf("  %-10s %-13s %-3s %10.1f %10.1f %+7.1f%%\n", m->name,
             model_op_kind_name(op->kind), ir_pass_name((enum ir_pass)pass), t * 1e6,
             e->seconds * 1e6, 100 * rel);
      if (e->seconds > 200e-6) { /* launch-bound entries say little of a cost model */
        *sum_abs += fabs(rel);
        (*n)++;
      }
    }
  }
  model_free(m);
}

int main(int argc, char **argv) {
  const char *ds_path = argc > 2 ? argv[1] : "profiles/h200.json";
  const char *meas_path = argc > 2 ? argv[2] : "docs/gpu/h200-profile-2026-11-30-1820.json";
  GError *err = NULL;
  struct profile *ds = profile_load_file(ds_path, &err);
  struct profile *meas = ds ? profile_load_file(meas_path, &err) : NULL;
  if (!meas) {
    fprintf(stderr, "bench_costs: %s\n", err->message);
    g_clear_error(&err);
    profile_free(ds);
    return 1;
  }
  printf("bench_costs: %s (model) against %s (measured), microseconds\n", ds_path, meas_path);
  printf("  %-10s %-13s %-3s %10s %10s %8s\n", "model", "op", "pass", "model", "measured",
         "error");
  double sum_abs = 0;
  int n = 0;
  compare_model(ds, meas, "models/llama3-8b.json", &sum_abs, &n);
  compare_model(ds, meas, "models/tiny-moe.json", &sum_abs, &n);
  printf("  mean |error| over the %d entries above 200 us: %.1f%%\n", n, 100 * sum_abs / (n ? n : 1));
  /* bench_gemm, H200, cuBLASLt, bf16 operands, TFLOP/s with fp32 and with bf16 output (the
   * 1820 run) */
  static const struct {
    const char *name;
    double m, n, k, fp32out, bf16out;
  } gemms[] = {
      {"square 4096", 4096, 4096, 4096, 733.1, 766.8},
      {"square 8192", 8192, 8192, 8192, 778.8, 684.1},
      {"mlp up", 4096, 14336, 4096, 767.9, 679.7},
      {"mlp down", 4096, 4096, 14336, 809.9, 734.5},
      {"lm head 2048 rows", 2048, 128256, 4096, 764.3, 682.3},
      {"lm head 130 rows", 130, 128256, 4096, 480.3, 505.5},
  };
  printf("  GEMMs (bench_gemm on H200) %9s %9s %9s %8s %8s  tile, waves\n", "model", "fp32out",
         "bf16out", "error", "error");
  for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) {
    struct cost_gemm g = cost_gemm(ds, MODEL_DTYPE_BF16, gemms[i].m, gemms[i].n, gemms[i].k);
    double tf = g.flops / g.seconds * 1e-12;
    printf("  %-26s %9.1f %9.1f %9.1f %+7.1f%% %+7.1f%%  %ux%u, %g\n", gemms[i].name, tf,
           gemms[i].fp32out, gemms[i].bf16out, 100 * (tf / gemms[i].fp32out - 1),
           100 * (tf / gemms[i].bf16out - 1), g.tile_m, g.tile_n, g.waves);
  }
  profile_free(meas);
  profile_free(ds);
  return 0;
}
