/* layout: directive programs from a few numbers. `pp=4,dp=2,ep=2,v` says how many pipeline
 * ranks, how many devices replicate each rank's stages (data parallelism), whether experts are
 * sharded over groups of ep of them (expert parallelism, carved from a stage's tp x dp ranks,
 * `etp` its own TP) and how stages map to ranks (one each, a loop of
 * `interleave` stages, or a V of two); `tp=8` divides every replica over 8 devices (tensor
 * parallelism, `sp` adds sequence parallelism), `cp=2` splits every sequence over 2 (context
 * parallelism). The layout writes the place / replicate / shard / tensor_parallel /
 * context_parallel directives, with devices in Megatron's rank order (TP innermost, then
 * context parallel, then data parallel, pipeline outermost: rank r holds devices
 * r*dp*cp*tp .. (r+1)*dp*cp*tp-1, and within it device layout_device(l, r, tp, cp, dp)).
 *
 *   GError *err = NULL;
 *   struct layout l;
 *   if (layout_parse("pp=4,dp=2,ep=2,v", &l, &err)) {
 *     char *json = layout_to_json(&l);          // the directive file, as the bundled ones read
 *     g_free(json);
 *   }
 */
#ifndef PIPER_DIRECTIVES_LAYOUT_H
#define PIPER_DIRECTIVES_LAYOUT_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "directives.h"

#define LAYOUT_MAX_DEVICES (1u << 20)
#define LAYOUT_MAX_STAGE_LIST 512 /* entries of "stage-layers=a+b+..." */

enum layout_shape {
  LAYOUT_LINEAR,      /* one stage per rank */
  LAYOUT_INTERLEAVED, /* interleave stages per rank, stage s on rank s mod pp */
  LAYOUT_V,           /* two stages per rank, rank r holds stages r and 2pp-1-r */
};

#define LAYOUT_MAX_RECOMPUTE 16

/* One recompute item: "recompute=full", "recompute@0-3=full:uniform:1",
 * "recompute@4=full:block:2", "recompute=selective", "recompute=selective:layernorm+mlp". */
struct layout_recompute {
  enum ir_recompute granularity;
  enum dir_recompute_method method; /* full only; DIR_RECOMPUTE_SEGMENT without ":method:N" */
  uint32_t num_layers;
  uint32_t modules; /* selective: MODEL_MODULE_BIT mask ("selective:layernorm+mlp"), 0: default */
  bool all_stages; /* no "@": filter {} */
  uint32_t first_stage, last_stage; /* "@A-B" or "@A" (inclusive) */
};

struct layout {
  uint32_t pp;          /* pipeline ranks */
  uint32_t dp;          /* devices per pipeline rank, each a data-parallel replica */
  uint32_t ep;          /* expert parallelism: ranks of a stage sharing one expert group */
  uint32_t etp;         /* expert tensor parallelism, 0 = not given: tp (Megatron's default) */
  enum layout_shape shape;
  uint32_t interleave;  /* stages per rank for LAYOUT_INTERLEAVED, else 1 (2 for a V) */
  uint32_t zero;        /* 0 (none), 1 (shard_optimizer), 2 (shard_grads), 3 (shard_params) */
  uint32_t tp;          /* tensor parallelism inside each data-parallel replica, 1 = none */
  bool sequence_parallel; /* "sp": with tp */
  uint32_t cp;          /* context parallelism ("cp=N"), 1 = none: each sequence over N devices */
  enum ir_cp_comm cp_comm; /* "cp-comm=p2p|all_gather" (default p2p) */
  /* recompute[@STAGES]=...: one recompute directive each (docs/directives.md, "recompute") */
  uint32_t n_recompute;
  struct layout_recompute recompute[LAYOUT_MAX_RECOMPUTE];
  /* Uneven stages (all 0/false: the model's equal split). Decoder layers of the first / last
   * stage (Megatron's --decoder-first/last-pipeline-num-layers), or of every stage in order
   * ("stage-layers=6+8+..."); the embedding and the loss counted as one layer each when the
   * rest is split (--account-for-embedding/loss-in-pipeline-split). */
  uint32_t first_stage_layers, last_stage_layers;
  uint32_t n_stage_layers;
  uint32_t stage_layers[LAYOUT_MAX_STAGE_LIST];
  bool account_embedding, account_loss;
  /* expert parallelism (ep > 1): the shard directives' capacity_factor ("capacity=F", 0:
   * their default) and fp8_expert_inputs ("fp8-expert-inputs": DeepSeek-V3's FP8 caching of
   * the saved routed rows) */
  double capacity_factor;
  bool fp8_expert_inputs;
  /* Not parsed: [stages] true where the model has no experts (DeepSeek-V3's dense first
   * stage), which then get no shard line; NULL: every stage has them. Not owned. */
  const bool *stage_without_experts;
};

/* Ranks of one pipeline stage: the dense grid tp x dp (x cp) from which expert groups are
 * carved (ep x etp must divide it). */
uint32_t layout_stage_ranks(const struct layout *l);
/* The expert TP the layout gives: etp, or tp where not given. */
uint32_t layout_expert_tp(const struct layout *l);
/* ZeRO shards state over the data-parallel replicas (dp x cp): true when the layout's zero
 * level has at least two to shard over (or is 0). layout_parse refuses the others; the planner
 * generates none of them. */
bool layout_zero_applies(const struct layout *l);
/* Parses "key=value,..." with keys pp, dp, ep, etp, tp, interleave, zero, recompute[@A-B] (full,
 * full:uniform:N, full:block:N, selective or selective:MODULE+..., on stages A to B or all),
 * first-stage-layers, last-stage-layers, stage-layers (a+b+...), cp, cp-comm (p2p or
 * all_gather) and the flags v, sp,
 * account-for-embedding, account-for-loss; unset counts are 1. Fails (input error naming the spec and
 * key) on unknown keys, bad numbers, an ep x etp that does not divide the ranks of a stage (or
 * an etp that does not divide tp, or is below it without sp), interleave together with v, and
 * more than LAYOUT_MAX_DEVICES devices. */
bool layout_parse(const char *spec, struct layout *out, GError **err);
/* True when the layout says how many layers each stage holds (any uneven-stage key). */
bool layout_has_stage_layers(const struct layout *l);
/* Decoder layers of each stage (out[layout_stages(l)]) for a model of num_layers layers: the
 * explicit counts, and the layers they leave split equally over the other stages (the first
 * of them take one more where it does not divide, as the model's pp_regions split), counting
 * the embedding in stage 0 and the loss in the last stage as a layer each where asked. Fails
 * (input error naming spec) where the counts do not sum to num_layers or a stage would hold
 * no layer. */
bool layout_stage_layers(const struct layout *l, const char *spec, int64_t num_layers,
                         int32_t *out, GError **err);
/* Pipeline stages (PP regions) the layout places: pp, pp*interleave or 2*pp. */
uint32_t layout_stages(const struct layout *l);
uint32_t layout_devices(const struct layout *l);
/* The rank grid, Megatron's order (TP innermost, then CP, then DP, PP outermost): the device
 * at coordinates (pp, tp, cp, dp), and the coordinates of a device. */
uint32_t layout_device(const struct layout *l, uint32_t pp_rank, uint32_t tp_rank,
                       uint32_t cp_rank, uint32_t dp_rank);
void layout_coords(const struct layout *l, uint32_t device, uint32_t *pp_rank, uint32_t *tp_rank,
                   uint32_t *cp_rank, uint32_t *dp_rank);
/* Pipeline rank holding stage s. */
uint32_t layout_stage_rank(const struct layout *l, uint32_t stage);
/* The directive program as a JSON file's text: one directive per line, places first, then
 * replicates, then shards (g_free). */
char *layout_to_json(const struct layout *l);
/* The same, parsed; name is what its error messages call it. */
struct dir_program *layout_program(const struct layout *l, const char *name, GError **err);

#endif
