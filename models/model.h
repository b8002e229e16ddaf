/* model: loads an annotated model file (HF config.json keys plus a "piper" object;
 * docs/design.md, "The model and its annotations") and builds its forward op list, its tags (PP,
 * EP, user tags) and its segments: maximal runs of ops with identical tags, which become the
 * compute nodes of the IR.
 *
 *   GError *err = NULL;
 *   struct model *m = model_load_file("models/tiny-moe.json", 0, &err);  // 0: the file's PP split
 *   double flops = 0;
 *   for (uint32_t s = 0; m && s < m->n_segments; s++)
 *     flops += m->segments[s].flops_fwd;
 *   model_free(m);
 *   g_clear_error(&err);
 */
#ifndef PIPER_MODELS_MODEL_H
#define PIPER_MODELS_MODEL_H

#include <cJSON.h>
#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../base/base.h"

#define MODEL_MAX_TAGS 8 /* PP, EP and up to 6 user tag names */
#define MODEL_TAG_NAME_MAX 32
#define MODEL_MAX_LAYERS 4096
#define MODEL_TAG_PP 0 /* tag index of PP in every model */
#define MODEL_TAG_EP 1 /* tag index of EP in every model (present even if dense) */

enum model_family { MODEL_FAMILY_DENSE, MODEL_FAMILY_MOE, MODEL_FAMILY_DEEPSEEK_V3 };
/* The decoder layer's norm and MLP: RMSNorm and SwiGLU (llama, qwen, mixtral, deepseek,
 * gpt_oss) or, for GPT-3-style models (gpt2, gpt_bigcode), LayerNorm with a bias and a GELU
 * MLP of one up projection. */
enum model_norm { MODEL_NORM_RMS, MODEL_NORM_LAYER };
enum model_mlp_act { MODEL_MLP_SWIGLU, MODEL_MLP_GELU };
/* FP8 is never a model's dtype (piper.dtype is fp32 or bf16): it is the GEMMs' operand type
 * under piper.fp8, a bf16 model's recipe for its GEMMs (model_gemm_dtype). */
enum model_dtype { MODEL_DTYPE_FP32, MODEL_DTYPE_BF16, MODEL_DTYPE_FP8 };
/* piper.fp8: the GEMMs' FP8 recipe: none; per-tensor current scaling (Transformer Engine's
 * default on Hopper: each operand's amax read, then the cast); DeepSeek-V3's fine-grained
 * scaling (1x128 activation tiles, 128x128 weight blocks, each scaled alone: one pass) */
enum model_fp8 { MODEL_FP8_NONE, MODEL_FP8_TENSORWISE, MODEL_FP8_BLOCKWISE };

/* Op kinds, in the order a layer runs them. Each op reads and writes the per-micro-batch
 * state of the decoder: x (residual stream, [T, hidden]), h (normalised hidden), a/m (block
 * outputs), r (routing: top-k expert ids and weights per token). T = micro_batch_size * seq_len.
 * Shape fields (shape[]) per kind:
 *   EMBEDDING      tokens -> x          [T, vocab, hidden]
 *   RMSNORM        x -> h               [T, hidden, layernorm (1: LayerNorm with bias)]
 *   ATTENTION      h -> a (GQA, RoPE)   [batch, seq, heads, kv_heads, head_dim, hidden,
 *                                        window (0: full causal; else each query sees this many
 *                                        keys, gpt_oss's sliding layers)]
 *   MLA_ATTENTION  h -> a (DeepSeek)    [batch, seq, heads, q_lora_rank, kv_lora_rank,
 *                                        qk_head_dim (nope+rope), v_head_dim, hidden]
 *   RESIDUAL_ADD   x += a | m (+ s)     [T, hidden]
 *   MLP            h -> m (SwiGLU)      [T, hidden, ffn, gelu (1: GELU of one up projection)]
 *   SHARED_EXPERT  h -> s (SwiGLU)      [T, hidden, ffn * n_shared]
 *   ROUTER         h -> r (softmax top-k, normalised weights)  [T, hidden, experts, top_k]
 *   EXPERT_FFN     h, r -> m            [T, hidden, expert_ffn, experts, top_k]
 *   LM_HEAD_LOSS   x -> loss (final RMSNorm is its own op before it)  [T, hidden, vocab]
 */
enum model_op_kind {
  MODEL_OP_EMBEDDING,
  MODEL_OP_RMSNORM,
  MODEL_OP_ATTENTION,
  MODEL_OP_MLA_ATTENTION,
  MODEL_OP_RESIDUAL_ADD,
  MODEL_OP_MLP,
  MODEL_OP_SHARED_EXPERT,
  MODEL_OP_ROUTER,
  MODEL_OP_EXPERT_FFN,
  MODEL_OP_LM_HEAD_LOSS,
  MODEL_OP_KIND_COUNT
};

/* Megatron's --recompute-modules, what selective recomputation may rerun (docs/memory.md):
 *   CORE_ATTN       attention's core: its output and log-sum-exp, rebuilt from q, k, v;
 *   LAYERNORM       a decoder layer's RMSNorm output, which the op it feeds keeps (attention,
 *                   MLP, router), rebuilt from the norm's kept input and its weight;
 *   MLP             a dense SwiGLU MLP's gate, up and silu(gate)·up, rebuilt from its input;
 *   MOE_ACT         the routed experts' silu(gate)·up rows, from their gate and up;
 *   MOE             the routed experts whole: their segment recomputed in full;
 *   SHARED_EXPERTS  the shared experts' gate, up and silu(gate)·up;
 *   MLA_UP_PROJ     MLA's q, k, v, rebuilt from the kept latents by the up-projections. */
enum model_module {
  MODEL_MODULE_CORE_ATTN,
  MODEL_MODULE_LAYERNORM,
  MODEL_MODULE_MLP,
  MODEL_MODULE_MOE_ACT,
  MODEL_MODULE_MOE,
  MODEL_MODULE_SHARED_EXPERTS,
  MODEL_MODULE_MLA_UP_PROJ,
  MODEL_MODULE_COUNT
};
#define MODEL_MODULE_BIT(k) (1u << (k))

/* Costs are per micro-batch on one device holding the whole op (no sharding). */
struct model_op {
  enum model_op_kind kind;
  int32_t layer;           /* decoder layer, -1 for embedding, final norm and head */
  int64_t shape[8];        /* see the kind table above; unused entries are 0 */
  double flops_fwd;        /* forward FLOPs (2 per multiply-add) */
  double flops_bwd_input;  /* backward for inputs (BI) */
  double flops_bwd_weight; /* backward for weights (BW) */
  uint64_t bytes_fwd;      /* bytes read + written by the forward kernel(s) */
  uint64_t param_count;    /* parameters (elements) */
  uint64_t param_bytes;    /* param_count * dtype bytes */
  uint64_t saved_bytes;    /* activations kept from F until the last backward use */
  uint64_t out_bytes;      /* output activation bytes */
  /* What the host kernels hold besides (the memory rule, ir/plan.h): the intermediate
   * gradients BI hands BW (bwork), and scratch an F or a backward frees when it ends. */
  uint64_t bwork_bytes, fwd_scratch_bytes, bwd_scratch_bytes;
  /* what F holds only while the op's layer runs: its scratch, and its output when a later op
   * of its segment reads it and nothing keeps it (segment fwd_work_bytes is their sum) */
  uint64_t fwd_work_bytes;
  /* Selective recomputation of module k (enum model_module) on this op: what a forward stops
   * saving, what its rerun computes (forward FLOPs) and holds only while it runs. 0 where
   * the op has no part of the module. */
  uint64_t module_saved_bytes[MODEL_MODULE_COUNT];
  double module_flops_fwd[MODEL_MODULE_COUNT];
  uint64_t module_rerun_work_bytes[MODEL_MODULE_COUNT];
  /* its output is read by a later segment too (a norm's, by the experts' segment): what
   * layernorm recomputation drops of it is the kept copy, not a transient of F */
  bool out_leaves_segment;
};

/* A data edge between segments of one micro-batch's forward pass (backward runs it reversed,
 * carrying the gradient of the same tensor). */
struct model_edge {
  uint32_t src, dst; /* segment indices, src < dst */
  uint64_t bytes;    /* per micro-batch */
};

struct model_segment {
  uint32_t op_first, op_count;  /* range in model.ops */
  int32_t tags[MODEL_MAX_TAGS]; /* value per tag name, -1 = tag absent */
  double flops_fwd, flops_bwd_input, flops_bwd_weight;
  uint64_t bytes_fwd, param_count, param_bytes, saved_bytes;
  /* Per micro-batch, besides saved_bytes: fwd_work, what F holds only while it runs (outputs
   * nothing keeps, scratch); bwd_keep, the gradients of the segment's values and the ops'
   * bwork, which a fused backward holds while it runs and BI keeps for BW; bwd_scratch, what
   * a backward (or BI) holds only while it runs. */
  uint64_t fwd_work_bytes, bwd_keep_bytes, bwd_scratch_bytes;
  bool expert; /* routed-expert region (has an EP tag) */
};

struct model_user_tag {
  char name[MODEL_TAG_NAME_MAX];
  int32_t first_layer, last_layer; /* inclusive */
};

/* HF "rope_scaling": type is "" when absent or null, else its "rope_type" (or older "type"),
 * e.g. "llama3", "yarn", "linear". The numbers are those of llama3 (and factor of the others);
 * 0 when the file has none. The loader accepts every type (the simulator only costs RoPE);
 * the executor refuses the types its kernels do not implement. */
/* What a model file without "rope_theta" / "rms_norm_eps" gets (Llama 2's values). */
#define MODEL_DEFAULT_ROPE_THETA 10000.0
#define MODEL_DEFAULT_RMS_NORM_EPS 1e-6

struct model_rope_scaling {
  char type[16];
  double factor, low_freq_factor, high_freq_factor;
  int64_t original_max_position_embeddings;
};

/* Megatron runs CP up to 16 (Llama 3 at 131,072 tokens); a degree past this is a typo. */
#define MODEL_MAX_CONTEXT_PARALLEL 1024

struct model {
  char name[64];       /* file basename without .json */
  char model_type[32]; /* HF model_type, e.g. "qwen3_moe" */
  enum model_family family;
  enum model_dtype dtype;
  enum model_fp8 fp8; /* the GEMMs' recipe (piper.fp8); the rest stays in dtype */
  int64_t hidden_size, num_layers, num_heads, num_kv_heads, head_dim;
  int64_t intermediate_size, moe_intermediate_size, num_experts, experts_per_tok;
  int64_t n_shared_experts, first_k_dense, vocab_size;
  /* Qwen2-MoE's one shared expert: its width and its sigmoid gate (a [hidden, 1] linear) */
  int64_t shared_expert_intermediate_size;
  bool shared_expert_gate;
  /* GPT-3-style layers (gpt2, gpt_bigcode) and gpt_oss's extras, each costed as built
   * (models/build.c): the norm and MLP kinds; biases on every projection (attention, MLP,
   * router, experts); learned absolute positions (max_positions rows of hidden; 0: RoPE);
   * attention sinks (one logit per head and layer); sliding-window layers (a bit per layer,
   * window sliding_window; none when 0). */
  enum model_norm norm;
  enum model_mlp_act mlp_act;
  bool linear_bias, attention_sinks;
  int64_t max_positions, sliding_window;
  /* the router balances load with DeepSeek-V3's per-expert bias (topk_method "noaux_tc")
   * rather than an auxiliary loss: sim/cost.h's published imbalance differs */
  bool loss_free_balancing;
  uint64_t sliding_layers[MODEL_MAX_LAYERS / 64];
  int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  bool tie_word_embeddings;
  /* Numerics the kernels need (defaults when the file has no key: theta 10000, eps 1e-6). */
  double rope_theta, rms_norm_eps;
  struct model_rope_scaling rope_scaling;
  int64_t seq_len, micro_batch_size;
  /* Context parallelism (piper.context_parallel, set by the context_parallel directive): the
   * ranks each sequence is split over, in 2 * context_parallel chunks (1: none). The ops are
   * one rank's share: its seq_len / context_parallel tokens, and 1 / context_parallel of the
   * causal attention core (the chunks are load-balanced, docs/directives.md). seq_len stays the
   * whole sequence's. */
  int64_t context_parallel;
  int32_t pp_regions;
  int32_t *pp_layers; /* [pp_regions] layer count per region */
  uint32_t n_user_tags;
  struct model_user_tag *user_tags;
  uint32_t n_tags; /* tag names: PP, EP, then user tag names */
  char tag_names[MODEL_MAX_TAGS][MODEL_TAG_NAME_MAX];
  int32_t n_ep_regions; /* MoE layers (EP regions) */

  uint32_t n_ops;
  struct model_op *ops;
  int32_t *op_tags; /* [n_ops * MODEL_MAX_TAGS], -1 = absent */
  uint32_t n_segments;
  struct model_segment *segments;
  uint32_t n_edges;
  struct model_edge *edges;

  char *source_json; /* the normalised config (model_to_json), owned */
};

/* pp_regions_override > 0 replaces the file's PP split with an equal split into that many
 * regions (--pp-regions). Errors are PIPER_ERROR_INPUT naming the file and key. */
struct model *model_load_file(const char *path, int pp_regions_override, GError **err);
/* name is used in messages and as model.name. */
struct model *model_load_json(const char *name, const cJSON *root, int pp_regions_override,
                              GError **err);
void model_free(struct model *m);
/* True when the PP split is the equal one (the first layers mod regions regions one layer
 * longer): what pp_regions gives. Reports show per-stage layers only where it is not. */
bool model_pp_split_is_equal(const struct model *m);
/* True for a sliding-window attention layer (gpt_oss's "sliding_attention" layer_types). */
bool model_layer_sliding(const struct model *m, int64_t layer);

/* The model's configuration as a JSON object that model_load_json reads back to the same model
 * (embedded in plans so they are self-contained). Caller frees. */
cJSON *model_to_json(const struct model *m);

size_t model_dtype_bytes(enum model_dtype d);
const char *model_dtype_name(enum model_dtype d);
const char *model_fp8_name(enum model_fp8 f);
/* the GEMMs' operand type: FP8 under an FP8 recipe, else the model's dtype */
enum model_dtype model_gemm_dtype(const struct model *m);
const char *model_op_kind_name(enum model_op_kind k);
/* "core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts", "mla_up_proj". */
const char *model_module_name(enum model_module k);
/* The module named name; false when none is. */
bool model_module_parse(const char *name, enum model_module *out);
/* Tag index of name, or -1. */
int model_tag_index(const struct model *m, const char *name);
/* Totals over the whole model, one micro-batch. */
uint64_t model_param_count(const struct model *m);
double model_flops_per_microbatch(const struct model *m); /* F + BI + BW */
/* Tokens of one micro-batch on one device: micro_batch_size * seq_len / context_parallel. */
int64_t model_tokens_per_microbatch(const struct model *m);
/* Op groups, the unit a trainer holds transients for (docs/memory.md): the ops of one decoder
 * layer; the embedding, and the final norm with the head, are groups of their own. The end of
 * the group of op `op` within ops [op, end): the first op after it of another layer. */
uint32_t model_group_end(const struct model *m, uint32_t op, uint32_t end);
/* Backward op groups: a layer's blocks, each ending at its residual add (attention's, then the
 * MLP's or the experts'), as autograd frees a block's gradients and transients before the block
 * below runs its backward; outside the layers, model_group_end's. A backward holds one block's
 * transients at a time (docs/memory.md). The end of the group of `op` within [op, end). */
uint32_t model_bwd_group_end(const struct model *m, uint32_t op, uint32_t end);

#endif
