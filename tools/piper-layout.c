/* piper-layout: writes the directive program of a layout (pp=, dp=, ep=, v, interleave=,
 * zero=) for editing; every other program takes the same SPEC as --layout. */
#include <stdio.h>
#include <string.h>

#include "../base/base.h"
#include "../directives/layout.h"
#include "options.h"

struct layout_cli {
  const char *spec, *out;
};

static bool take_spec(void *args, const char *arg, GError **err) {
  struct layout_cli *a = args;
  if (a->spec)
    return piper_input_error(err, "one layout at a time (got \"%s\" and \"%s\")", a->spec, arg);
  a->spec = arg;
  return true;
}

// clang-format off
static const struct option_spec options[] = {
    {.name = "--out", .alias = "-o", .kind = OPTION_STRING,
     .offset = offsetof(struct layout_cli, out), .metavar = "FILE",
     .help = "write the program to FILE (default: standard output)"},
    OPTIONS_HELP_VERSION,
    OPTIONS_END,
};
// clang-format on

static const struct option_program program = {
    .name = "piper-layout",
    .usage = "usage: piper-layout SPEC [-o FILE]\n"
             "\n"
             "Writes the place / replicate / shard directives of a layout, one per line, to edit or\n"
             "to pass as --directives. SPEC is comma-separated: pp=N pipeline ranks, dp=N devices per\n"
             "rank (data parallel replicas), ep=N expert parallelism (1, or dp: experts sharded over\n"
             "the rank's devices), v (two stages per rank in a V, for zbv and dualpipev) or\n"
             "interleave=N (N stages per rank in a loop, for interleaved_1f1b), zero=1|2|3\n"
             "(ZeRO-1 shards optimizer state, ZeRO-2 gradients too, ZeRO-3 parameters too),\n"
             "recompute=full|selective (activation recomputation everywhere; full:uniform:N\n"
             "reruns chunks of N layers, full:block:N each stage's first N layers,\n"
             "selective:layernorm+mlp named modules; recompute@A-B=... on stages A to B only),\n"
             "tp=N tensor\n"
             "parallelism inside each replica (sp: with sequence parallelism), cp=N context\n"
             "parallelism (each sequence split over N devices; cp-comm=p2p ring, the default,\n"
             "or all_gather). Devices follow Megatron's rank order: tensor parallel innermost,\n"
             "then context parallel, then data parallel, pipeline outermost (rank r holds\n"
             "devices r*dp*cp*tp .. (r+1)*dp*cp*tp-1, device (dp_rank*cp + cp_rank)*tp +\n"
             "tp_rank within it).\n"
             "The model needs as many PP regions as the layout has stages (pp, 2pp with v,\n"
             "pp*N with interleave): --layout sets them; with a file use --pp-regions.\n"
             "\n"
             "  piper-layout pp=4,dp=2,ep=2,v -o my_layout.json\n"
             "  piper-layout pp=4,tp=8,sp          # Llama-3-70B on 32 GPUs\n"
             "\n",
    .epilogue = "\nExit status: 0 success, 1 runtime failure, 2 bad input.\n",
    .options = options,
    .help_column = 20,
    .positional = take_spec,
};

int main(int argc, char **argv) {
  struct layout_cli a = {0};
  int rc = options_parse(&program, &a, argc, argv);
  if (rc != OPTIONS_CONTINUE)
    return rc;
  if (!a.spec)
    return piper_usage_error(program.name, "%s", "give a layout, e.g. pp=4,dp=2");
  GError *err = NULL;
  struct layout l;
  if (!layout_parse(a.spec, &l, &err))
    return piper_error_exit(program.name, err);
  char *text = layout_to_json(&l);
  bool ok = piper_write_file(a.out ? a.out : "-", text, strlen(text), &err);
  g_free(text);
  if (!ok)
    return piper_error_exit(program.name, err);
  if (a.out && !layout_has_stage_layers(&l))
    fprintf(stderr, "piper-layout: %u devices, %u pipeline ranks, %u stages (use --pp-regions %u)\n",
            layout_devices(&l), l.pp, layout_stages(&l), layout_stages(&l));
  else if (a.out) /* the layer counts belong to the model file, which this program never reads */
    fprintf(stderr, "piper-layout: %u devices, %u pipeline ranks, %u stages (uneven: give the "
                    "model's \"piper\": {\"pp_layers\": [...]} or use --layout itself)\n",
            layout_devices(&l), l.pp, layout_stages(&l));
  return 0;
}
