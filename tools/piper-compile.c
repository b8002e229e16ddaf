/* piper-compile: model + directive program -> per-device plans
 * (docs/design.md, "The plan contract"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../directives/compile.h"
#include "../base/json.h"
#include "../base/version.h"
#include "options.h"

/* What the command line asks for. */
struct compile_cli {
  struct compile_args compile;
  const char *out_dir, *dump_ir, *dump_dot, *export_csv;
  uint32_t n_devices;
  bool stats, unit_costs;
};

/* One row per option, as in redis's config table: kept as rows, not reflowed. */
// clang-format off
static const struct option_spec options[] = {
    OPTIONS_COMPILE_ARGS(struct compile_cli, compile),
    {.name = "--devices", .kind = OPTION_U32, .offset = offsetof(struct compile_cli, n_devices),
     .lo = 1, .hi = IR_MAX_DEVICES, .metavar = "N",
     .help = "world size: device ids must be below N (and need not all be used)"},
    {.name = "--export-csv", .kind = OPTION_STRING,
     .offset = offsetof(struct compile_cli, export_csv), .metavar = "FILE",
     .help = "write each rank's compute order as a PyTorch schedule CSV"},
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING,
     .offset = offsetof(struct compile_cli, out_dir), .metavar = "DIR",
     .help = "write DIR/plan.json, DIR/device-<d>.json and the program"},
    {.name = "--dump-ir", .kind = OPTION_STRING, .offset = offsetof(struct compile_cli, dump_ir),
     .metavar = "FILE", .help = "write the rewritten training DAG as JSON"},
    {.name = "--dump-dot", .kind = OPTION_STRING, .offset = offsetof(struct compile_cli, dump_dot),
     .metavar = "FILE", .help = "write the rewritten training DAG as Graphviz DOT"},
    {.name = "--stats", .kind = OPTION_FLAG, .offset = offsetof(struct compile_cli, stats),
     .help = "print node, edge and instruction counts, and a note on a stream that\n"
             "mixes kinds of communication"},
    {.name = "--unit-costs", .kind = OPTION_FLAG, .offset = offsetof(struct compile_cli, unit_costs),
     .help = "order a stream that pipeline traffic shares by textbook costs (F 1,\n"
             "B 2) as piper-sim does for a synthetic profile, not by FLOPs"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-compile",
    .usage = "usage: piper-compile --model FILE --directives FILE [options] [-o DIR]\n"
             "\n"
             "Compiles an annotated model and a directive program into per-device plans.\n"
             "\n",
    .epilogue = "\nExit status: 0 success, 1 runtime failure, 2 bad input.\n",
    .options = options,
    .help_column = 25,
};

/* One rank's compute actions, in issue order, as a schedule program row (F/B/BI/BW with stage
 * = PP tag and micro-batch = MB tag). Overlap groups come back as two-action slots. */
static struct sched_program *plan_to_schedule(const struct compile_result *r, GError **err) {
  const struct plan *p = r->plan;
  int pp = 0, mb = -1;
  for (uint32_t t = 0; t < p->n_tags; t++)
    if (strcmp(p->tag_names[t], "MB") == 0)
      mb = (int)t;
  if (mb < 0) {
    piper_input_error(err, "--export-csv needs a program with an MB split");
    return NULL;
  }
  uint32_t n_ranks = 0;
  int32_t *layout =
      sched_layout_from_program(r->program, (uint32_t)r->model->pp_regions, &n_ranks, err);
  if (!layout)
    return NULL;
  struct sched_program *s = g_new0(struct sched_program, 1);
  s->family = SCHED_CUSTOM;
  s->n_ranks = n_ranks;
  s->n_stages = (uint32_t)r->model->pp_regions;
  s->n_microbatches = r->mbs;
  s->ranks = g_new0(struct sched_rank, n_ranks);
  for (uint32_t rank = 0; rank < n_ranks; rank++) {
    /* The first stage on this rank names the device group; its first device is the rank. */
    uint32_t stage = 0;
    while (stage < s->n_stages && layout[stage] != (int32_t)rank)
      stage++;
    uint32_t device = IR_NONE;
    for (uint32_t n = 0; n < p->n_nodes && device == IR_NONE; n++)
      if (p->nodes[n].kind == IR_NODE_COMPUTE && p->nodes[n].tags[pp] == (int32_t)stage)
        device = p->device_pool[p->groups[p->nodes[n].group].first];
    if (device == IR_NONE)
      continue;
    const struct plan_class *c = plan_device_class(p, device);
    GArray *slots = g_array_new(FALSE, TRUE, sizeof(struct sched_slot));
    uint64_t last_slot = UINT64_MAX;
    for (uint32_t i = 0; i < c->n_instrs; i++) {
      const struct ir_node *n = &p->nodes[c->instrs[i].node];
      if (n->kind != IR_NODE_COMPUTE || n->tags[mb] < 0)
        continue;
      struct sched_action a = {.stage = n->tags[pp], .mb = n->tags[mb], .pass = n->pass};
      /* Ordered nodes carry their order slot in the priority's high word and the filter's
       * index in the low byte (apply.c); unordered ones each make a slot of their own. */
      bool ordered = n->priority < (1ull << 62);
      uint64_t slot_id = ordered ? n->priority >> 32 : UINT64_MAX - 1 - i;
      uint32_t filter = ordered ? (uint32_t)(n->priority & 0xff) : 0;
      if (!ordered && slots->len) {
        const struct sched_slot *prev = &g_array_index(slots, struct sched_slot, slots->len - 1);
        const struct sched_action *pa = &prev->actions[prev->n_actions - 1];
        if (pa->stage == a.stage && pa->mb == a.mb && pa->pass == a.pass)
          continue;
      }
      if (slot_id != last_slot || slots->len == 0) {
        struct sched_slot sl = {.n_actions = 0};
        g_array_append_val(slots, sl);
        last_slot = slot_id;
      }
      struct sched_slot *sl = &g_array_index(slots, struct sched_slot, slots->len - 1);
      bool seen = false;
      for (uint32_t q = 0; q < sl->n_actions; q++)
        seen |= sl->actions[q].stage == a.stage && sl->actions[q].mb == a.mb &&
                sl->actions[q].pass == a.pass;
      if (seen)
        continue;
      if (sl->n_actions >= 2 || filter >= 2) {
        piper_input_error(
            err, "--export-csv: slot with more than two actions on rank %u cannot be written",
            rank);
        g_array_free(slots, TRUE);
        g_free(layout);
        sched_program_free(s);
        return NULL;
      }
      /* Keep the written filter order inside an overlapped slot. */
      if (sl->n_actions == 1 && filter == 0) {
        sl->actions[1] = sl->actions[0];
        sl->actions[0] = a;
      } else {
        sl->actions[sl->n_actions] = a;
      }
      sl->n_actions++;
    }
    s->ranks[rank].n_slots = slots->len;
    s->ranks[rank].slots = (struct sched_slot *)g_array_free(slots, FALSE);
  }
  g_free(layout);
  return s;
}

static long peak_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* --export-csv: the plan's compute order per rank as a PyTorch schedule CSV. */
static bool export_schedule_csv(const struct compile_result *r, const char *path, GError **err) {
  struct sched_program *s = plan_to_schedule(r, err);
  if (!s)
    return false;
  FILE *f = fopen(path, "w");
  bool ok = f && sched_write_csv(s, f);
  if (f && fclose(f) != 0)
    ok = false;
  sched_program_free(s);
  if (!ok)
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write", path);
  return ok;
}

/* The files the command line asks for: the IR dumps, the plan directory, the CSV. */
static bool write_outputs(const struct compile_cli *a, const struct compile_result *r,
                          GError **err) {
  if (a->dump_ir && !ir_graph_dump_json(r->graph, a->dump_ir, err))
    return false;
  if (a->dump_dot && !ir_graph_dump_dot(r->graph, a->dump_dot, err))
    return false;
  if (a->out_dir &&
      (!plan_write_dir(r->plan, a->out_dir, err) || !compile_write_program(r, a->out_dir, err)))
    return false;
  return !a->export_csv || export_schedule_csv(r, a->export_csv, err);
}

/* --stats: the size of the IR and of the plan, and what compiling cost. */
static void print_stats(const struct compile_result *r, double secs) {
  uint32_t live_edges = 0, temporal = 0;
  for (uint32_t i = 0; i < r->graph->edges->len; i++) {
    const struct ir_edge *e = IR_EDGE(r->graph, i);
    if (e->kind == IR_EDGE_DEAD)
      continue;
    live_edges++;
    temporal += e->kind == IR_EDGE_TEMPORAL;
  }
  uint32_t kinds[IR_NODE_KIND_COUNT] = {0};
  for (uint32_t i = 0; i < r->graph->nodes->len; i++)
    kinds[IR_NODE(r->graph, i)->kind]++;
  printf("nodes: %u\n", r->graph->nodes->len);
  for (int k = 0; k < IR_NODE_KIND_COUNT; k++)
    if (kinds[k])
      printf("  %s: %u\n", ir_node_kind_name(k), kinds[k]);
  printf("edges: %u (data %u, temporal %u)\n", live_edges, live_edges - temporal, temporal);
  printf("instructions: %llu over %u devices (%u distinct programs)\n",
         (unsigned long long)plan_instruction_count(r->plan), r->plan->n_devices,
         r->plan->n_classes);
  printf("communicators: %u\n", r->plan->n_comms);
  printf("streams: %u\n", r->plan->n_streams);
  printf("compile seconds: %.3f\npeak RSS MiB: %.1f\n", secs, peak_rss_kib() / 1024.0);
  uint32_t stream, device;
  uint64_t bytes;
  if (plan_mixed_stream(r->plan, &stream, &device, &bytes))
    printf("note: stream \"%s\" carries more than one kind of communication (pipeline, "
           "data-parallel, expert): on device %u, %.6g MiB a step take turns on it that other "
           "streams would overlap; piper-sim estimates the time this costs\n",
           r->plan->streams[stream].name, device, (double)bytes / (1 << 20));
}

static void print_summary(const struct compile_cli *a, const struct compile_result *r,
                          double secs) {
  const struct compile_args *c = &a->compile;
  GString *with = g_string_new(NULL);
  if (c->directives)
    g_string_append(with, c->directives);
  else
    g_string_printf(with, "--layout %s", c->layout);
  printf("compiled %s with %s: %u devices, %u pipeline ranks, %u micro-batches, %u classes, "
         "%llu instructions (%.3f s)\n",
         r->model->name, with->str, r->plan->n_devices, r->ranks, r->mbs,
         r->plan->n_classes, (unsigned long long)plan_instruction_count(r->plan), secs);
  g_string_free(with, TRUE);
  if (a->stats)
    print_stats(r, secs);
  if (a->out_dir && r->plan->n_devices <= PLAN_DEVICE_FILES_MAX)
    printf("wrote %s/plan.json and %u device plans\n", a->out_dir, r->plan->n_devices);
  else if (a->out_dir)
    printf("wrote %s/plan.json and %u class plans (one per class of alike devices, %u devices)\n",
           a->out_dir, r->plan->n_classes, r->plan->n_devices);
}

int main(int argc, char **argv) {
  struct compile_cli a = {0};
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  GError *err = NULL;
  struct compile_options o;
  if (!compile_args_to_options(&a.compile, &o, &err))
    return piper_error_exit(program.name, err);
  o.n_devices = a.n_devices;
  g_autoptr(GString) notes = g_string_new(NULL);
  o.notes = notes;
  o.cost_model = a.unit_costs ? IR_COST_UNIT : IR_COST_FLOPS;

  double t0 = piper_clock_seconds();
  struct compile_result r;
  if (!compile_run(&o, &r, &err))
    return piper_error_exit(program.name, err);
  double secs = piper_clock_seconds() - t0;
  options_print_notes(program.name, notes);
  if (!write_outputs(&a, &r, &err)) {
    compile_result_free(&r);
    return piper_error_exit(program.name, err);
  }
  print_summary(&a, &r, secs);
  compile_result_free(&r);
  return 0;
}
