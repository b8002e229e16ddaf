/* directives: the directive program (docs/design.md, "The directive phase order"). Parses a JSON
 * array of directives (accepting Python-Piper files unchanged), validates every field, and applies
 * the program to the IR as rewrites in the fixed phase order: all split, the BI/BW split of
 * backward, place, replicate/shard in program order, tensor_parallel, stream, recompute,
 * communication insertion, then order.
 *
 *   GError *err = NULL;
 *   struct model *m = model_load_file("models/tiny-moe.json", 0, &err);
 *   struct ir_graph *graph = m ? ir_graph_build(m) : NULL;
 *   struct dir_program *p = dir_program_load_file("directives/base-schedules/dp2.json", &err);
 *   if (graph && p && !dir_program_apply(p, graph, 0, &err))  // 0: no world size to check
 *     fprintf(stderr, "%s\n", err->message);  // names the directive, its op and the key
 *   dir_program_free(p);
 *   ir_graph_free(graph);
 *   model_free(m);
 *   g_clear_error(&err);
 */
#ifndef PIPER_DIRECTIVES_DIRECTIVES_H
#define PIPER_DIRECTIVES_DIRECTIVES_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../ir/ir.h"

#define DIR_MAX_DIRECTIVES 100000
#define DIR_MAX_MICROBATCHES 4096 /* per split; the product over splits is capped too */
#define DIR_MAX_FILTER_KEYS 16
#define DIR_NAME_MAX IR_NAME_MAX
#define DIR_MIN_SM_SHARE 1e-3     /* of a device's SMs; H100 has 132, B200 148 */
#define DIR_DEFAULT_BUCKET_MB 25.0 /* PyTorch DDP's default bucket size */

enum dir_op { DIR_PLACE, DIR_REPLICATE, DIR_SHARD, DIR_SPLIT, DIR_ORDER, DIR_STREAM,
              DIR_TENSOR_PARALLEL, DIR_RECOMPUTE, DIR_CONTEXT_PARALLEL };
#define DIR_MAX_TP_DEGREE 1024 /* Megatron runs 8; a degree past a rack is surely a typo */

/* A filter as written: key names are resolved against the graph's tags when applied, since
 * split dimensions only exist once the splits ran. */
struct dir_filter_key {
  char name[DIR_NAME_MAX];
  int32_t value; /* >= 0, or IR_FILTER_ANY for "*" */
};
struct dir_filter {
  uint32_t n_keys;
  struct dir_filter_key keys[DIR_MAX_FILTER_KEYS];
  enum ir_pass pass; /* IR_PASS_NONE when no PASS key */
};

/* The user tag whose values are the chunks a layered recompute reruns (one segment each). */
#define DIR_RECOMPUTE_TAG "RC"
enum dir_recompute_method { DIR_RECOMPUTE_SEGMENT, DIR_RECOMPUTE_UNIFORM, DIR_RECOMPUTE_BLOCK };

struct dir_directive {
  enum dir_op op;
  uint32_t index;           /* position in the program, for messages */
  struct dir_filter filter; /* place, replicate, shard, split */
  uint32_t n_devices;       /* place, replicate, shard */
  uint32_t *devices;
  char stream[DIR_NAME_MAX];        /* place (send/recv), shard (all-to-all); "" = default */
  /* shard: rows a device receives per micro-batch and expert layer, as a multiple of its
   * tokens x top_k (ir_ep_capacity_rows); 0 = IR_EP_CAPACITY_FACTOR_DEFAULT */
  double capacity_factor;
  /* shard: the saved routed rows in FP8 (ir_node.fp8_expert_inputs) */
  bool fp8_expert_inputs;
  /* shard, expert parallelism as its own dimension (docs/directives.md, "Expert parallelism"):
   * "degree", the EP size (ranks sharing one expert group's all-to-all), and
   * "expert_tensor_parallel", the TP size inside each expert (Megatron's
   * --expert-model-parallel-size and --expert-tensor-parallel-size). 0 = not given: the EP
   * group is every device of one TP rank, and experts take the dense layers' TP. */
  uint32_t ep_degree, etp_degree;
  char reduce_stream[DIR_NAME_MAX]; /* replicate; "" = default */
  char gather_stream[DIR_NAME_MAX]; /* replicate; "" = default */
  double bucket_size_mb;            /* replicate */
  /* replicate: ZeRO-1 (shard_optimizer), -2 (shard_grads, implies shard_optimizer), -3
   * (shard_params, implies both) */
  bool shard_optimizer, shard_grads, shard_params;
  enum ir_recompute granularity;    /* recompute: full or selective */
  /* recompute (Megatron's --recompute-method / --recompute-num-layers): SEGMENT (no "method")
   * reruns each matched segment whole; UNIFORM reruns every chunk of num_layers layers of a
   * stage; BLOCK reruns each of the first num_layers layers of a stage and stores the rest.
   * Chunks are segments of their own (the RC tag, compile.c's chunk_model); under selective
   * each chunk's modules rerun before the chunk's backward. */
  enum dir_recompute_method method;
  uint32_t num_layers;
  /* recompute, selective: "modules" (MODEL_MODULE_BIT mask), Megatron's --recompute-modules;
   * IR_RECOMPUTE_MODULES_DEFAULT (core_attn) when absent */
  uint32_t modules;
  char dim_name[DIR_NAME_MAX];      /* split */
  int64_t num_microbatches;         /* split */
  uint32_t n_slots;           /* order: slot s holds filters[slot_first[s] .. slot_first[s+1]) */
  uint32_t *slot_first;       /* [n_slots + 1] */
  struct dir_filter *filters; /* order */
  /* stream declaration (beyond the reference):
   * {"op":"stream","name":..,"priority":..,"sm_share":..} */
  char name[DIR_NAME_MAX];
  int64_t priority;
  double sm_share; /* fraction of the device's SMs, (0, 1] */
  /* tensor_parallel (directives/tensor_parallel.c):
   * {"op":"tensor_parallel","filter":..,"degree":t,"sequence_parallel":b} */
  uint32_t tp_degree;
  bool sequence_parallel;
  /* context_parallel (directives/context_parallel.c), the whole model:
   * {"op":"context_parallel","degree":c,"comm":"p2p"|"all_gather"} */
  uint32_t cp_degree;
  enum ir_cp_comm cp_comm;
};

struct dir_program {
  char *name; /* file path, for messages */
  uint32_t n;
  struct dir_directive *d;
  uint32_t max_device; /* largest device id named + 1 (0 when none) */
};

struct dir_program *dir_program_load_file(const char *path, GError **err);
struct dir_program *dir_program_parse_json(const char *name, const cJSON *root, GError **err);
/* Builds an empty program to which directives are appended (schedule builders). */
struct dir_program *dir_program_new(const char *name);
/* Appends a deep copy of d, renumbering its index. */
void dir_program_append(struct dir_program *p, const struct dir_directive *d);
/* Removes every directive of the given op (renumbering the rest). */
void dir_program_remove_op(struct dir_program *p, enum dir_op op);
void dir_program_free(struct dir_program *p);
/* The program as JSON, in the input format (round trip through dir_program_parse_json). */
cJSON *dir_program_to_json(const struct dir_program *p);
const char *dir_op_name(enum dir_op op);

/* n_devices_limit > 0 makes ids >= limit an error (a world size given by the user); 0 accepts
 * ids up to IR_MAX_DEVICES - 1. Errors name p->name, the directive index and op, and the key. */
bool dir_program_apply(const struct dir_program *p, struct ir_graph *g, uint32_t n_devices_limit,
                       GError **err);

/* The program's context_parallel degree (1 without one). The model must be loaded with it
 * (piper.context_parallel, models/model.h) before the program is applied: compile_run does. */
uint32_t dir_program_context_parallel(const struct dir_program *p);

/* Resolves a written filter against the graph's tag names; fails naming an unknown key. */
bool dir_filter_resolve(const struct dir_filter *f, const struct ir_graph *g, struct ir_filter *out,
                        const char *ctx, GError **err);

#endif
