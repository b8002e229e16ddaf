/* piper-compile: model + directive program -> per-device plans (SPEC §5). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../directives/compile.h"
#include "../base/json.h"
#include "../base/version.h"

static const char *usage =
    "usage: piper-compile --model FILE --directives FILE [options] [-o DIR]\n"
    "\n"
    "Compiles an annotated model and a directive program into per-device plans.\n"
    "\n"
    "  --model FILE           model JSON (HF config.json keys + a \"piper\" object)\n"
    "  --directives FILE      directive program (JSON array); alias --base-schedule\n"
    "  --schedule NAME        build the order for a schedule family: gpipe, 1f1b,\n"
    "                         interleaved_1f1b, zerobubble, zbv, dualpipe, dualpipev,\n"
    "                         custom (the file as written; default)\n"
    "  --ranks R              pipeline ranks the schedule expects (checked against the placement)\n"
    "  --mbs M                micro-batches: sets the program's MB split\n"
    "  --keep-order           keep the file's order directives under --schedule\n"
    "  --pp-regions N         override the model's PP split (equal split of layers)\n"
    "  --devices N            world size: device ids must be below N\n"
    "  --import-csv FILE      replace the order directives by a PyTorch schedule CSV\n"
    "  --export-csv FILE      write each rank's compute order as a PyTorch schedule CSV\n"
    "  -o, --out DIR          write DIR/plan.json, DIR/device-<d>.json and the program\n"
    "  --dump-ir FILE         write the rewritten training DAG as JSON\n"
    "  --dump-dot FILE        write the rewritten training DAG as Graphviz DOT\n"
    "  --stats                print node, edge and instruction counts\n"
    "  --help, --version\n"
    "\n"
    "Exit status: 0 success, 1 runtime failure, 2 bad input.\n";

static bool parse_count(const char *opt, const char *text, uint32_t lo, uint32_t hi, uint32_t *out,
                        GError **err) {
  if (!piper_parse_u32(text, lo, hi, out))
    return piper_input_error(err, "%s: expected an integer in [%u, %u], got \"%s\"", opt, lo, hi, text);
  return true;
}

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
        piper_input_error(err, "--export-csv: slot with more than two actions on rank %u cannot be written",
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

int main(int argc, char **argv) {
  struct compile_args ca = {0};
  struct compile_options o;
  const char *out_dir = NULL, *dump_ir = NULL, *dump_dot = NULL, *export_csv = NULL;
  const char *import_csv = NULL;
  uint32_t n_devices = 0;
  bool stats = false;
  GError *err = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int shared = compile_args_parse(&ca, argc, argv, &i, &err);
    if (shared < 0)
      return piper_error_exit("piper-compile", err);
    if (shared)
      continue;
    const char **text = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("piper-compile %s\n", PIPER_VERSION);
      return 0;
    } else if (strcmp(a, "--stats") == 0) {
      stats = true;
      continue;
    } else if (strcmp(a, "-o") == 0 || strcmp(a, "--out") == 0)
      text = &out_dir;
    else if (strcmp(a, "--dump-ir") == 0)
      text = &dump_ir;
    else if (strcmp(a, "--dump-dot") == 0)
      text = &dump_dot;
    else if (strcmp(a, "--export-csv") == 0)
      text = &export_csv;
    else if (strcmp(a, "--import-csv") == 0)
      text = &import_csv;
    else if (strcmp(a, "--devices") == 0) {
      if (i + 1 >= argc || !parse_count(a, argv[i + 1], 1, IR_MAX_DEVICES, &n_devices, &err)) {
        if (!err)
          piper_input_error(&err, "%s needs a value", a);
        return piper_error_exit("piper-compile", err);
      }
      i++;
      continue;
    } else {
      piper_input_error(&err, "unknown option \"%s\" (see --help)", a);
      return piper_error_exit("piper-compile", err);
    }
    if (i + 1 >= argc) {
      piper_input_error(&err, "%s needs a value (see --help)", a);
      return piper_error_exit("piper-compile", err);
    }
    *text = argv[++i];
  }
  if (!compile_args_to_options(&ca, &o, &err))
    return piper_error_exit("piper-compile", err);
  o.n_devices = n_devices;
  o.import_csv = import_csv;

  double t0 = piper_clock_seconds();
  struct compile_result r;
  if (!compile_run(&o, &r, &err))
    return piper_error_exit("piper-compile", err);
  double t1 = piper_clock_seconds();
  int status = 0;
  if (dump_ir && !ir_graph_dump_json(r.graph, dump_ir, &err))
    goto error;
  if (dump_dot && !ir_graph_dump_dot(r.graph, dump_dot, &err))
    goto error;
  if (out_dir) {
    if (!plan_write_dir(r.plan, out_dir, &err) || !compile_write_program(&r, out_dir, &err))
      goto error;
  }
  if (export_csv) {
    struct sched_program *s = plan_to_schedule(&r, &err);
    if (!s)
      goto error;
    FILE *f = fopen(export_csv, "w");
    bool ok = f && sched_write_csv(s, f);
    if (f && fclose(f) != 0)
      ok = false;
    sched_program_free(s);
    if (!ok) {
      g_set_error(&err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot write", export_csv);
      goto error;
    }
  }
  double secs = t1 - t0;
  uint64_t instrs = plan_instruction_count(r.plan);
  printf("compiled %s with %s: %u devices, %u pipeline ranks, %u micro-batches, %u classes, "
         "%llu instructions (%.3f s)\n",
         r.model->name, o.directives_path, r.plan->n_devices, r.ranks, r.mbs, r.plan->n_classes,
         (unsigned long long)instrs, secs);
  if (stats) {
    uint32_t live_edges = 0, temporal = 0;
    for (uint32_t i = 0; i < r.graph->edges->len; i++) {
      const struct ir_edge *e = IR_EDGE(r.graph, i);
      if (e->kind == IR_EDGE_DEAD)
        continue;
      live_edges++;
      temporal += e->kind == IR_EDGE_TEMPORAL;
    }
    uint32_t kinds[IR_NODE_KIND_COUNT] = {0};
    for (uint32_t i = 0; i < r.graph->nodes->len; i++)
      kinds[IR_NODE(r.graph, i)->kind]++;
    printf("nodes: %u\n", r.graph->nodes->len);
    for (int k = 0; k < IR_NODE_KIND_COUNT; k++)
      if (kinds[k])
        printf("  %s: %u\n", ir_node_kind_name(k), kinds[k]);
    printf("edges: %u (data %u, temporal %u)\n", live_edges, live_edges - temporal, temporal);
    printf("instructions: %llu over %u devices (%u distinct programs)\n",
           (unsigned long long)instrs, r.plan->n_devices, r.plan->n_classes);
    printf("communicators: %u\n", r.plan->n_comms);
    printf("streams: %u\n", r.plan->n_streams);
    printf("compile seconds: %.3f\npeak RSS MiB: %.1f\n", secs, peak_rss_kib() / 1024.0);
  }
  if (out_dir)
    printf("wrote %s/plan.json and %u device plans\n", out_dir, r.plan->n_devices);
  compile_result_free(&r);
  return status;
error:
  compile_result_free(&r);
  return piper_error_exit("piper-compile", err);
}
