/* model loading: reads an annotated model file (HF config.json keys plus a "piper" object),
 * validates every key with one-line errors naming the file and the key, and writes the
 * normalised configuration back (model_to_json). build.c derives ops, segments and edges. */
#include "model-impl.h"

#include <string.h>

#include "../base/json.h"

/* Upper bounds on sizes. They are far above any real model and keep every derived product
 * (bytes of a [tokens, vocab] logits tensor, expert parameter counts) inside 64 bits or
 * close enough that build.c's checked arithmetic reports the rest. */
#define MAX_HIDDEN (INT64_C(1) << 20)
#define MAX_HEADS (INT64_C(1) << 16)
#define MAX_HEAD_DIM (INT64_C(1) << 16)
#define MAX_FFN (INT64_C(1) << 24)
#define MAX_EXPERTS INT64_C(4096)
#define MAX_VOCAB (INT64_C(1) << 24)
#define MAX_LORA (INT64_C(1) << 20)
#define MAX_SEQ (INT64_C(1) << 22)
#define MAX_MICRO_BATCH (INT64_C(1) << 16)

static const char *const reserved_tags[] = {"PP", "EP", "PASS", "MB", NULL};

struct family_entry {
  const char *model_type;
  enum model_family family;
};

static const struct family_entry families[] = {
    {"llama", MODEL_FAMILY_DENSE},   {"mistral", MODEL_FAMILY_DENSE},
    {"qwen2", MODEL_FAMILY_DENSE},   {"qwen3", MODEL_FAMILY_DENSE},
    {"qwen3_moe", MODEL_FAMILY_MOE}, {"qwen2_moe", MODEL_FAMILY_MOE},
    {"mixtral", MODEL_FAMILY_MOE},   {"deepseek_v3", MODEL_FAMILY_DEEPSEEK_V3},
    {"gpt2", MODEL_FAMILY_DENSE},    {"gpt_bigcode", MODEL_FAMILY_DENSE},
    {"gpt_oss", MODEL_FAMILY_MOE},
};

/* GPT-3-style decoders (LayerNorm, GELU MLP, learned positions, biases), read under Hugging
 * Face's GPT2Config names (n_embd, n_layer, n_head, n_inner, n_positions) or the common ones. */
static bool is_gpt_style(const struct model *m) {
  return strcmp(m->model_type, "gpt2") == 0 || strcmp(m->model_type, "gpt_bigcode") == 0;
}

static bool is_gpt_oss(const struct model *m) {
  return strcmp(m->model_type, "gpt_oss") == 0;
}

size_t model_dtype_bytes(enum model_dtype d) {
  return d == MODEL_DTYPE_FP8 ? 1 : d == MODEL_DTYPE_BF16 ? 2 : 4;
}

const char *model_dtype_name(enum model_dtype d) {
  return d == MODEL_DTYPE_FP8 ? "fp8" : d == MODEL_DTYPE_BF16 ? "bf16" : "fp32";
}

static const char *const fp8_names[] = {"none", "tensorwise", "blockwise", NULL};

const char *model_fp8_name(enum model_fp8 f) {
  return fp8_names[f];
}

enum model_dtype model_gemm_dtype(const struct model *m) {
  return m->fp8 != MODEL_FP8_NONE ? MODEL_DTYPE_FP8 : m->dtype;
}

const char *model_op_kind_name(enum model_op_kind k) {
  static const char *const names[MODEL_OP_KIND_COUNT] = {
      "embedding", "rmsnorm",       "attention", "mla_attention", "residual_add",
      "mlp",       "shared_expert", "router",    "expert_ffn",    "lm_head_loss",
  };
  return (unsigned)k < MODEL_OP_KIND_COUNT ? names[k] : "unknown";
}

static const char *const module_names[MODEL_MODULE_COUNT] = {
    "core_attn", "layernorm", "mlp", "moe_act", "moe", "shared_experts", "mla_up_proj",
};

const char *model_module_name(enum model_module k) {
  return (unsigned)k < MODEL_MODULE_COUNT ? module_names[k] : "unknown";
}

bool model_module_parse(const char *name, enum model_module *out) {
  for (int k = 0; k < MODEL_MODULE_COUNT; k++)
    if (strcmp(name, module_names[k]) == 0) {
      *out = (enum model_module)k;
      return true;
    }
  return false;
}

int model_tag_index(const struct model *m, const char *name) {
  for (uint32_t i = 0; i < m->n_tags; i++)
    if (strcmp(m->tag_names[i], name) == 0)
      return (int)i;
  return -1;
}

uint64_t model_param_count(const struct model *m) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < m->n_ops; i++)
    n += m->ops[i].param_count;
  return n;
}

double model_flops_per_microbatch(const struct model *m) {
  double f = 0;
  for (uint32_t i = 0; i < m->n_ops; i++)
    f += m->ops[i].flops_fwd + m->ops[i].flops_bwd_input + m->ops[i].flops_bwd_weight;
  return f;
}

int64_t model_tokens_per_microbatch(const struct model *m) {
  return m->micro_batch_size * m->seq_len / (m->context_parallel > 1 ? m->context_parallel : 1);
}

void model_free(struct model *m) {
  if (!m)
    return;
  g_free(m->pp_layers);
  g_free(m->user_tags);
  g_free(m->ops);
  g_free(m->op_tags);
  g_free(m->segments);
  g_free(m->edges);
  g_free(m->source_json);
  g_free(m);
}

/* --- getters ------------------------------------------------------------------------------- */

/* An integer key of obj. prefix ("piper" or NULL) makes the key's full name in messages.
 * At top level a JSON null counts as absent: real HF configs write "head_dim": null and
 * "q_lora_rank": null for "not used". */
static bool get_int(const cJSON *obj, const char *prefix, const char *key, bool required,
                    int64_t lo, int64_t hi, int64_t *out, const char *file, GError **err) {
  char full[64];
  g_snprintf(full, sizeof full, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", key);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!v || (!prefix && cJSON_IsNull(v))) {
    if (required)
      return piper_input_error(err, "%s: missing key \"%s\"", file, full);
    return true;
  }
  return json_as_int(v, lo, hi, out, file, full, err);
}

static bool present(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  return v && !cJSON_IsNull(v);
}

/* Tag and display names end up in directive files, charts and CSV columns: keep them to
 * characters that need no quoting anywhere. */
static bool name_ok(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n == 0 || n >= max)
    return false;
  for (const char *c = s; *c; c++)
    if (!g_ascii_isalnum(*c) && *c != '_' && *c != '-' && *c != '.')
      return false;
  return true;
}

/* --- which HF keys a model file may carry -------------------------------------------------- */

/* Keys the loader reads (load_hf, load_numerics, load_piper): each one shapes the model. */
static const char *const understood_keys[] = {
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "intermediate_size",
    "moe_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts",
    "num_experts_per_tok", "n_shared_experts", "shared_expert_intermediate_size",
    "mlp_only_layers", "decoder_sparse_step", "moe_layer_freq", "first_k_dense_replace",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "rope_theta", "rms_norm_eps", "rope_scaling", "piper",
    /* gpt2 / gpt_bigcode (GPT2Config's names) and gpt_oss */
    "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "n_ctx", "activation_function",
    "layer_norm_epsilon", "multi_query", "layer_types", "experts_per_token", "topk_method",
    /* checked in check_hf_values: accepted only with the value the builder assumes */
    "hidden_act", "attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", NULL};

/* Keys that change neither the parameters nor the work of a training step as the simulator and
 * executor model it: token ids, initialisation, dropout at 0, inference and serving settings,
 * router losses and routing details that leave the shapes alone, and DeepSeek-V3's
 * multi-token-prediction depth (num_nextn_predict_layers: HF's own model does not build those
 * layers either). */
static const char *const harmless_keys[] = {
    "architectures", "attention_dropout", "auto_map", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "max_position_embeddings", "max_window_layers",
    "norm_topk_prob", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "aux_loss_alpha", "seq_aux", "ep_size", "n_group", "topk_group",
    "routed_scaling_factor", "scoring_func", "num_nextn_predict_layers", "pretraining_tp",
    "torch_dtype", "transformers_version", "use_cache", "quantization_config", "rope_interleave",
    "_name_or_path",
    /* gpt2 / gpt_bigcode: dropout, the sequence-summary head of GPT2DoubleHeads, attention
     * scaling and softmax precision (numerics, not work), inference settings */
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_activation", "summary_first_dropout",
    "summary_proj_to_labels", "summary_type", "summary_use_proj", "scale_attn_weights",
    "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "task_specific_params",
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "inference_runner",
    "max_batch_size", "max_sequence_length", "pad_key_length", "validate_runner_input",
    /* gpt_oss: the clamp of its SwiGLU (numerics) and the pre-training context length */
    "swiglu_limit", "initial_context_length", NULL};

static bool in_list(const char *const *list, const char *key) {
  for (; *list; list++)
    if (strcmp(*list, key) == 0)
      return true;
  return false;
}

/* A key not understood could change the architecture (a bias, another activation, a layer
 * layout): refused, naming it, rather than costed as if it were absent. */
static bool check_hf_keys(const cJSON *root, const char *file, GError **err) {
  for (const cJSON *c = root->child; c; c = c->next) {
    const char *key = c->string ? c->string : "";
    if (in_list(understood_keys, key) || in_list(harmless_keys, key))
      continue;
    char *q = piper_quote(key, strlen(key), 40);
    piper_input_error(err,
                      "%s: key %s is not understood and may change the architecture (models/"
                      "load.c lists the keys read and the keys known to be harmless)",
                      file, q);
    g_free(q);
    return false;
  }
  return true;
}

static bool false_or_null(const cJSON *root, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  return !v || cJSON_IsNull(v) || cJSON_IsFalse(v);
}

/* Keys whose usual value is what the builder assumes (SwiGLU decoders without biases, full
 * causal attention); any other value changes the model. */
static bool check_gpt_act(const struct model *m, const cJSON *root, const char *file,
                          GError **err) {
  /* GELU in its exact or tanh forms: the same work */
  static const char *const gelus[] = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", NULL};
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
  if (act && !(cJSON_IsString(act) && act->valuestring && in_list(gelus, act->valuestring)))
    return piper_input_error(err,
                             "%s: \"activation_function\" must be a GELU (gelu, gelu_new, "
                             "gelu_pytorch_tanh, gelu_fast) for %s",
                             file, m->model_type);
  if (present(root, "hidden_act"))
    return piper_input_error(err, "%s: \"hidden_act\" is not a %s key (activation_function is)",
                             file, m->model_type);
  return true;
}

static bool check_hf_values(const struct model *m, const cJSON *root, const char *file,
                            GError **err) {
  if (is_gpt_style(m) && !check_gpt_act(m, root, file, err))
    return false;
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (act && !(cJSON_IsString(act) && act->valuestring && strcmp(act->valuestring, "silu") == 0))
    return piper_input_error(err, "%s: \"hidden_act\" must be \"silu\" (the MLPs are SwiGLU)",
                             file);
  /* gpt_oss builds its attention biases (attention_bias) and sliding layers (layer_types) */
  static const char *const off[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
  for (size_t i = is_gpt_oss(m) ? 1 : 0; i < G_N_ELEMENTS(off); i++)
    if (!false_or_null(root, off[i]))
      return piper_input_error(err, "%s: \"%s\" must be false or absent (not modelled)", file,
                               off[i]);
  /* Qwen writes sliding_window with use_sliding_window false: unused. Mistral's window only
   * matters when it is shorter than the sequence. */
  const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
  bool qwen_off = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window") != NULL ||
                  is_gpt_oss(m);
  const cJSON *piper = cJSON_GetObjectItemCaseSensitive(root, "piper");
  const cJSON *seq = piper ? cJSON_GetObjectItemCaseSensitive(piper, "seq_len") : NULL;
  if (sw && !cJSON_IsNull(sw) && !qwen_off &&
      !(cJSON_IsNumber(sw) && seq && cJSON_IsNumber(seq) && sw->valuedouble >= seq->valuedouble))
    return piper_input_error(err,
                             "%s: \"sliding_window\" shorter than piper.seq_len is not modelled "
                             "(attention is full causal)",
                             file);
  return true;
}

/* --- the HF part --------------------------------------------------------------------------- */

static bool load_family(struct model *m, const cJSON *root, const char *file, GError **err) {
  const char *type = NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (!v)
    return piper_input_error(err, "%s: missing key \"model_type\"", file);
  if (!cJSON_IsString(v) || !v->valuestring)
    return piper_input_error(err, "%s: \"model_type\" must be a string", file);
  type = v->valuestring;
  for (size_t i = 0; i < G_N_ELEMENTS(families); i++) {
    if (strcmp(type, families[i].model_type) == 0) {
      m->family = families[i].family;
      g_strlcpy(m->model_type, type, sizeof m->model_type);
      return true;
    }
  }
  /* %.40s: the value is user text; keep the message one short line. */
  return piper_input_error(err,
                   "%s: \"model_type\" = \"%.40s\" is not supported (llama, mistral, qwen2, "
                   "qwen3, qwen2_moe, qwen3_moe, mixtral, deepseek_v3, gpt2, gpt_bigcode, "
                   "gpt_oss)",
                   file, type);
}

/* The routed-expert count goes by three names (qwen: num_experts, mixtral: num_local_experts,
 * deepseek: n_routed_experts); any one is accepted, several must agree. */
static bool load_expert_count(struct model *m, const cJSON *root, const char *file, GError **err) {
  static const char *const keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
  const char *seen = NULL;
  for (size_t i = 0; i < G_N_ELEMENTS(keys); i++) {
    if (!present(root, keys[i]))
      continue;
    int64_t n = 0;
    if (!get_int(root, NULL, keys[i], true, 1, MAX_EXPERTS, &n, file, err))
      return false;
    if (seen && n != m->num_experts)
      return piper_input_error(err, "%s: \"%s\" = %lld disagrees with \"%s\" = %lld", file, keys[i],
                       (long long)n, seen, (long long)m->num_experts);
    m->num_experts = n;
    seen = keys[i];
  }
  if (!seen)
    return piper_input_error(err, "%s: missing key \"%s\" (number of routed experts)", file,
                     m->family == MODEL_FAMILY_DEEPSEEK_V3   ? "n_routed_experts"
                     : strcmp(m->model_type, "mixtral") == 0 ? "num_local_experts"
                                                             : "num_experts");
  return true;
}

/* Layouts this module does not build (some layers dense in a MoE family) are refused rather
 * than silently costed as all-MoE. */
static bool check_all_moe(const struct model *m, const cJSON *root, const char *file,
                          GError **err) {
  const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
  if (only && cJSON_IsArray(only) && cJSON_GetArraySize(only) > 0)
    return piper_input_error(err, "%s: \"mlp_only_layers\" is not supported (every layer of %s is MoE)",
                     file, m->model_type);
  static const char *const step_keys[] = {"decoder_sparse_step", "moe_layer_freq"};
  for (size_t i = 0; i < G_N_ELEMENTS(step_keys); i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, step_keys[i]);
    if (v && cJSON_IsNumber(v) && v->valuedouble != 1)
      return piper_input_error(err, "%s: \"%s\" = %g is not supported (only 1: every layer MoE)", file,
                       step_keys[i], v->valuedouble);
  }
  return true;
}

/* Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): besides the routed experts, one shared expert of
 * shared_expert_intermediate_size whose output a sigmoid gate scales (HF Qwen2MoeSparseMoeBlock:
 * shared_expert, shared_expert_gate = Linear(hidden, 1, bias=False)). HF's config defaults the
 * width to 5632 when absent, so a file must say it. Other families have no such key. */
static bool load_qwen2_shared_expert(struct model *m, const cJSON *root, const char *file,
                                     GError **err) {
  bool qwen2 = strcmp(m->model_type, "qwen2_moe") == 0;
  if (!qwen2) {
    if (present(root, "shared_expert_intermediate_size"))
      return piper_input_error(err,
                               "%s: \"shared_expert_intermediate_size\" is a qwen2_moe key; %s "
                               "sizes shared experts with n_shared_experts",
                               file, m->model_type);
    return true;
  }
  if (present(root, "n_shared_experts"))
    return piper_input_error(err,
                             "%s: \"n_shared_experts\" is not a qwen2_moe key (its shared expert "
                             "is shared_expert_intermediate_size wide)",
                             file);
  if (!get_int(root, NULL, "shared_expert_intermediate_size", true, 0, MAX_FFN,
               &m->shared_expert_intermediate_size, file, err))
    return false;
  m->shared_expert_gate = m->shared_expert_intermediate_size > 0;
  return true;
}

/* An integer under its common name or, for GPT-style models, GPT2Config's (alias, NULL for
 * none): either is accepted, both must agree. */
static bool get_alias_int(const cJSON *root, const char *key, const char *alias, bool required,
                          int64_t lo, int64_t hi, int64_t *out, const char *file, GError **err) {
  bool has_key = present(root, key), has_alias = alias && present(root, alias);
  if (!has_alias)
    return get_int(root, NULL, key, required, lo, hi, out, file, err);
  int64_t a = 0;
  if (!get_int(root, NULL, alias, true, lo, hi, &a, file, err))
    return false;
  if (has_key) {
    if (!get_int(root, NULL, key, true, lo, hi, out, file, err))
      return false;
    if (*out != a)
      return piper_input_error(err, "%s: \"%s\" = %lld disagrees with \"%s\" = %lld", file,
                               alias, (long long)a, key, (long long)*out);
  }
  *out = a;
  return true;
}

/* GPT-3-style: learned positions (n_positions rows, required: they are parameters), biases
 * everywhere, LayerNorm and a GELU MLP 4 x hidden wide unless n_inner says otherwise, tied
 * embeddings unless the file says not (GPT2Config's default), gpt_bigcode's multi-query
 * attention (one key/value head). */
static bool load_gpt_style(struct model *m, const cJSON *root, const char *file, GError **err) {
  m->norm = MODEL_NORM_LAYER;
  m->mlp_act = MODEL_MLP_GELU;
  m->linear_bias = true;
  m->tie_word_embeddings = true;
  if (!get_alias_int(root, "max_position_embeddings", "n_positions", true, 1, MAX_SEQ,
                     &m->max_positions, file, err))
    return false;
  m->intermediate_size = 4 * m->hidden_size;
  if (!get_alias_int(root, "intermediate_size", "n_inner", false, 1, MAX_FFN,
                     &m->intermediate_size, file, err))
    return false;
  bool mq = false;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "multi_query");
  if (v && !cJSON_IsNull(v) && !json_get_bool(root, "multi_query", false, &mq, file, err))
    return false;
  if (mq && strcmp(m->model_type, "gpt_bigcode") != 0)
    return piper_input_error(err, "%s: \"multi_query\" is a gpt_bigcode key", file);
  if (mq)
    m->num_kv_heads = 1;
  return true;
}

/* gpt_oss: RMSNorm and SwiGLU experts of intermediate_size (with biases, as its attention
 * and router), a sink logit per head, and sliding-window attention on the layers layer_types
 * names "sliding_attention" (HF's default when absent: every even layer). */
static bool load_gpt_oss(struct model *m, const cJSON *root, const char *file, GError **err) {
  bool bias = true; /* GptOssConfig's default */
  const cJSON *ab = cJSON_GetObjectItemCaseSensitive(root, "attention_bias");
  if (ab && !cJSON_IsNull(ab) && !json_get_bool(root, "attention_bias", false, &bias, file, err))
    return false;
  m->linear_bias = bias;
  m->attention_sinks = true;
  if (!get_int(root, NULL, "sliding_window", false, 1, MAX_SEQ, &m->sliding_window, file, err))
    return false;
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
  if (lt && !cJSON_IsNull(lt) &&
      (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != (int)m->num_layers))
    return piper_input_error(err, "%s: \"layer_types\" must list num_hidden_layers = %lld types",
                             file, (long long)m->num_layers);
  for (int64_t l = 0; l < m->num_layers; l++) {
    bool sliding = l % 2 == 0;
    if (lt && !cJSON_IsNull(lt)) {
      const cJSON *t = cJSON_GetArrayItem(lt, (int)l);
      bool full = cJSON_IsString(t) && strcmp(t->valuestring, "full_attention") == 0;
      sliding = cJSON_IsString(t) && strcmp(t->valuestring, "sliding_attention") == 0;
      if (!full && !sliding)
        return piper_input_error(err,
                                 "%s: \"layer_types\"[%lld] must be \"sliding_attention\" or "
                                 "\"full_attention\"",
                                 file, (long long)l);
    }
    if (sliding && m->sliding_window > 0)
      m->sliding_layers[l / 64] |= UINT64_C(1) << (l % 64);
  }
  int64_t k = 0;
  if (!get_int(root, NULL, "experts_per_token", false, 1, MAX_EXPERTS, &k, file, err))
    return false;
  if (k && k != m->experts_per_tok)
    return piper_input_error(err, "%s: \"experts_per_token\" = %lld disagrees with "
                             "\"num_experts_per_tok\" = %lld",
                             file, (long long)k, (long long)m->experts_per_tok);
  return true;
}

static bool load_moe(struct model *m, const cJSON *root, const char *file, GError **err);

static bool load_hf(struct model *m, const cJSON *root, const char *file, GError **err) {
  if (!load_family(m, root, file, err))
    return false;
  bool gpt = is_gpt_style(m);
  if (!get_alias_int(root, "hidden_size", gpt ? "n_embd" : NULL, true, 1, MAX_HIDDEN,
                     &m->hidden_size, file, err) ||
      !get_alias_int(root, "num_hidden_layers", gpt ? "n_layer" : NULL, true, 1,
                     MODEL_MAX_LAYERS, &m->num_layers, file, err) ||
      !get_alias_int(root, "num_attention_heads", gpt ? "n_head" : NULL, true, 1, MAX_HEADS,
                     &m->num_heads, file, err) ||
      !get_int(root, NULL, "vocab_size", true, 1, MAX_VOCAB, &m->vocab_size, file, err))
    return false;

  m->num_kv_heads = m->num_heads;
  if (!get_int(root, NULL, "num_key_value_heads", false, 1, MAX_HEADS, &m->num_kv_heads, file, err))
    return false;
  if (gpt && !load_gpt_style(m, root, file, err))
    return false;
  if (m->num_heads % m->num_kv_heads != 0)
    return piper_input_error(err,
                     "%s: \"num_attention_heads\" = %lld is not a multiple of "
                     "\"num_key_value_heads\" = %lld",
                     file, (long long)m->num_heads, (long long)m->num_kv_heads);

  bool tie = m->tie_word_embeddings;
  const cJSON *tv = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
  if (tv && !cJSON_IsNull(tv) &&
      !json_get_bool(root, "tie_word_embeddings", false, &tie, file, err))
    return false;
  m->tie_word_embeddings = tie;

  bool deepseek = m->family == MODEL_FAMILY_DEEPSEEK_V3;
  if (deepseek) {
    /* MLA has no single head_dim; record the query/key head width for information. */
    m->q_lora_rank = 0;
    if (!get_int(root, NULL, "q_lora_rank", false, 0, MAX_LORA, &m->q_lora_rank, file, err) ||
        !get_int(root, NULL, "kv_lora_rank", true, 1, MAX_LORA, &m->kv_lora_rank, file, err) ||
        !get_int(root, NULL, "qk_nope_head_dim", true, 1, MAX_HEAD_DIM, &m->qk_nope_head_dim, file,
                 err) ||
        !get_int(root, NULL, "qk_rope_head_dim", true, 0, MAX_HEAD_DIM, &m->qk_rope_head_dim, file,
                 err) ||
        !get_int(root, NULL, "v_head_dim", true, 1, MAX_HEAD_DIM, &m->v_head_dim, file, err))
      return false;
    m->head_dim = m->qk_nope_head_dim + m->qk_rope_head_dim;
  } else if (present(root, "head_dim")) {
    if (!get_int(root, NULL, "head_dim", true, 1, MAX_HEAD_DIM, &m->head_dim, file, err))
      return false;
  } else {
    if (m->hidden_size % m->num_heads != 0)
      return piper_input_error(err,
                       "%s: missing key \"head_dim\" and \"hidden_size\" = %lld is not a "
                       "multiple of \"num_attention_heads\" = %lld",
                       file, (long long)m->hidden_size, (long long)m->num_heads);
    m->head_dim = m->hidden_size / m->num_heads;
  }
  /* Every family here applies RoPE, which rotates pairs of dimensions: an odd width has no
   * valid model (the host kernels assert pairs; the simulator would cost a model nobody can
   * train). MLA rotates only its qk_rope_head_dim part. */
  if (deepseek && m->qk_rope_head_dim % 2)
    return piper_input_error(err,
                             "%s: \"qk_rope_head_dim\" = %lld is odd: RoPE rotates pairs of "
                             "dimensions",
                             file, (long long)m->qk_rope_head_dim);
  if (!deepseek && !gpt && m->head_dim % 2)
    return piper_input_error(err,
                             "%s: \"head_dim\" = %lld%s is odd: RoPE rotates pairs of dimensions",
                             file, (long long)m->head_dim,
                             present(root, "head_dim") ? ""
                                                       : " (hidden_size / num_attention_heads)");

  if (gpt)
    return true; /* intermediate_size read by load_gpt_style */
  if (m->family == MODEL_FAMILY_DENSE)
    return get_int(root, NULL, "intermediate_size", true, 1, MAX_FFN, &m->intermediate_size, file,
                   err);

  return load_moe(m, root, file, err);
}

/* The routed experts of MoE families and deepseek_v3: count, top-k, widths, shared experts,
 * DeepSeek-V3's dense first layers, and how the router balances its load. */
static bool load_moe(struct model *m, const cJSON *root, const char *file, GError **err) {
  bool deepseek = m->family == MODEL_FAMILY_DEEPSEEK_V3;
  bool mixtral = strcmp(m->model_type, "mixtral") == 0 || is_gpt_oss(m);
  if (!load_expert_count(m, root, file, err) ||
      !get_int(root, NULL, "num_experts_per_tok", true, 1, MAX_EXPERTS, &m->experts_per_tok, file,
               err) ||
      !get_int(root, NULL, "n_shared_experts", false, 0, MAX_EXPERTS, &m->n_shared_experts, file,
               err))
    return false;
  /* DeepSeek-V3's auxiliary-loss-free balancing (an expert bias before top-k) */
  const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "topk_method");
  m->loss_free_balancing = cJSON_IsString(tm) && strcmp(tm->valuestring, "noaux_tc") == 0;
  if (m->experts_per_tok > m->num_experts)
    return piper_input_error(err, "%s: \"num_experts_per_tok\" = %lld exceeds the %lld routed experts",
                     file, (long long)m->experts_per_tok, (long long)m->num_experts);
  if (mixtral) {
    /* Mixtral's experts are full-width MLPs: intermediate_size is the expert width. */
    if (!get_int(root, NULL, "intermediate_size", true, 1, MAX_FFN, &m->intermediate_size, file,
                 err))
      return false;
    m->moe_intermediate_size = m->intermediate_size;
    return !is_gpt_oss(m) || load_gpt_oss(m, root, file, err);
  }
  if (!get_int(root, NULL, "moe_intermediate_size", true, 1, MAX_FFN, &m->moe_intermediate_size,
               file, err) ||
      !check_all_moe(m, root, file, err) || !load_qwen2_shared_expert(m, root, file, err))
    return false;
  if (deepseek) {
    if (!get_int(root, NULL, "first_k_dense_replace", false, 0, m->num_layers, &m->first_k_dense,
                 file, err))
      return false;
    /* The dense first layers need intermediate_size; without them it is unused. */
    return get_int(root, NULL, "intermediate_size", m->first_k_dense > 0, 1, MAX_FFN,
                   &m->intermediate_size, file, err);
  }
  /* qwen MoE configs carry intermediate_size for optional dense layers, which we never build;
   * keep it only so model_to_json writes back what it read. */
  return get_int(root, NULL, "intermediate_size", false, 1, MAX_FFN, &m->intermediate_size, file,
                 err);
}

/* --- numerics: rope_theta, rms_norm_eps, rope_scaling ------------------------------------- */

static bool load_rope_scaling(struct model *m, const cJSON *root, const char *file,
                              GError **err) {
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  if (!rs || cJSON_IsNull(rs))
    return true;
  char ctx[512];
  g_snprintf(ctx, sizeof ctx, "%s: \"rope_scaling\"", file);
  if (!cJSON_IsObject(rs))
    return piper_input_error(err, "%s must be an object or null", ctx);
  const char *type = NULL;
  bool has_rope_type = present(rs, "rope_type");
  if (!json_get_string(rs, has_rope_type ? "rope_type" : "type", true, &type, ctx, err))
    return false;
  struct model_rope_scaling *sc = &m->rope_scaling;
  if (g_strlcpy(sc->type, type, sizeof sc->type) >= sizeof sc->type || type[0] == '\0')
    return piper_input_error(err, "%s: unknown type \"%s\"", ctx, type);
  if (present(rs, "factor") && !json_get_double(rs, "factor", false, 1e-6, 1e6, &sc->factor, ctx,
                                                err))
    return false;
  if (strcmp(type, "llama3") != 0)
    return true;
  /* llama3: all four numbers are needed to build the scaled frequencies. */
  return json_get_double(rs, "factor", true, 1e-6, 1e6, &sc->factor, ctx, err) &&
         json_get_double(rs, "low_freq_factor", true, 1e-6, 1e6, &sc->low_freq_factor, ctx,
                         err) &&
         json_get_double(rs, "high_freq_factor", true, 1e-6, 1e6, &sc->high_freq_factor, ctx,
                         err) &&
         json_get_int(rs, "original_max_position_embeddings", true, 1, INT32_MAX,
                      &sc->original_max_position_embeddings, ctx, err) &&
         (sc->high_freq_factor > sc->low_freq_factor ||
          piper_input_error(err, "%s: \"high_freq_factor\" must exceed \"low_freq_factor\"",
                            ctx));
}

static bool load_numerics(struct model *m, const cJSON *root, const char *file, GError **err) {
  m->rope_theta = MODEL_DEFAULT_ROPE_THETA;
  m->rms_norm_eps = MODEL_DEFAULT_RMS_NORM_EPS;
  if (present(root, "rope_theta") &&
      !json_get_double(root, "rope_theta", false, 1.0, 1e12, &m->rope_theta, file, err))
    return false;
  if (present(root, "rms_norm_eps") &&
      !json_get_double(root, "rms_norm_eps", false, 1e-12, 1.0, &m->rms_norm_eps, file, err))
    return false;
  /* GPT2Config's name for the LayerNorm epsilon (held in the same field) */
  if (present(root, "layer_norm_epsilon") &&
      !json_get_double(root, "layer_norm_epsilon", false, 1e-12, 1.0, &m->rms_norm_eps, file, err))
    return false;
  return load_rope_scaling(m, root, file, err);
}

/* --- the "piper" object -------------------------------------------------------------------- */

static void split_equally(struct model *m, int32_t regions) {
  g_free(m->pp_layers);
  m->pp_regions = regions;
  m->pp_layers = g_new0(int32_t, regions);
  /* The first (L mod N) regions take one extra layer (DeepSeek-V3 has 61 layers). */
  for (int32_t r = 0; r < regions; r++)
    m->pp_layers[r] = (int32_t)(m->num_layers / regions + (r < m->num_layers % regions ? 1 : 0));
}

static bool load_pp(struct model *m, const cJSON *piper, const char *file, GError **err) {
  bool has_regions = cJSON_GetObjectItemCaseSensitive(piper, "pp_regions") != NULL;
  const cJSON *layers = cJSON_GetObjectItemCaseSensitive(piper, "pp_layers");
  if (has_regions == (layers != NULL))
    return piper_input_error(err, "%s: \"piper\" needs exactly one of \"pp_regions\" and \"pp_layers\"",
                     file);
  if (has_regions) {
    int64_t n = 0;
    if (!get_int(piper, "piper", "pp_regions", true, 1, m->num_layers, &n, file, err))
      return false;
    split_equally(m, (int32_t)n);
    return true;
  }
  if (!cJSON_IsArray(layers))
    return piper_input_error(err, "%s: \"piper.pp_layers\" must be an array of layer counts", file);
  int n = cJSON_GetArraySize(layers);
  if (n < 1 || n > m->num_layers)
    return piper_input_error(err, "%s: \"piper.pp_layers\" has %d entries; it needs 1 to %lld", file, n,
                     (long long)m->num_layers);
  m->pp_regions = n;
  m->pp_layers = g_new0(int32_t, n);
  int64_t sum = 0;
  int i = 0;
  for (const cJSON *v = layers->child; v; v = v->next, i++) {
    char what[48];
    int64_t c = 0;
    g_snprintf(what, sizeof what, "piper.pp_layers[%d]", i);
    if (!json_as_int(v, 1, m->num_layers, &c, file, what, err))
      return false;
    m->pp_layers[i] = (int32_t)c;
    sum += c;
  }
  if (sum != m->num_layers)
    return piper_input_error(err, "%s: \"piper.pp_layers\" sums to %lld but num_hidden_layers is %lld",
                     file, (long long)sum, (long long)m->num_layers);
  return true;
}

static bool load_tags(struct model *m, const cJSON *piper, const char *file, GError **err) {
  static const char *const tag_keys[] = {"tag", "layers", NULL};
  const cJSON *tags = cJSON_GetObjectItemCaseSensitive(piper, "tags");
  if (!tags)
    return true;
  if (!cJSON_IsArray(tags))
    return piper_input_error(err, "%s: \"piper.tags\" must be an array of {\"tag\", \"layers\"}", file);
  int n = cJSON_GetArraySize(tags);
  /* Entries of one name may not overlap, so there are at most layers entries per name. */
  if (n > (MODEL_MAX_TAGS - 2) * m->num_layers)
    return piper_input_error(err, "%s: \"piper.tags\" has %d entries, more than tags x layers", file, n);
  m->user_tags = g_new0(struct model_user_tag, n > 0 ? n : 1);
  int i = 0;
  for (const cJSON *t = tags->child; t; t = t->next, i++) {
    char ctx[512];
    g_snprintf(ctx, sizeof ctx, "%s: piper.tags[%d]", file, i);
    const char *name = NULL;
    if (!json_check_keys(t, tag_keys, ctx, err) ||
        !json_get_string(t, "tag", true, &name, ctx, err))
      return false;
    if (!name_ok(name, MODEL_TAG_NAME_MAX))
      return piper_input_error(err,
                       "%s: \"tag\" = \"%.40s\" must be 1 to %d characters of letters, digits, "
                       "'_', '-', '.'",
                       ctx, name, MODEL_TAG_NAME_MAX - 1);
    for (const char *const *r = reserved_tags; *r; r++)
      if (strcmp(name, *r) == 0)
        return piper_input_error(err, "%s: tag name \"%s\" is reserved (PP, EP, PASS, MB)", ctx, name);
    const cJSON *range = cJSON_GetObjectItemCaseSensitive(t, "layers");
    if (!range)
      return piper_input_error(err, "%s: missing key \"layers\"", ctx);
    if (!cJSON_IsArray(range) || cJSON_GetArraySize(range) != 2)
      return piper_input_error(err, "%s: \"layers\" must be [first, last]", ctx);
    int64_t first = 0, last = 0;
    if (!json_as_int(range->child, 0, m->num_layers - 1, &first, ctx, "layers[0]", err) ||
        !json_as_int(range->child->next, 0, m->num_layers - 1, &last, ctx, "layers[1]", err))
      return false;
    if (first > last)
      return piper_input_error(err, "%s: \"layers\" = [%lld, %lld] has first > last", ctx, (long long)first,
                       (long long)last);
    /* Values count entries of one name in model order, so entries must come in layer order. */
    for (int j = i - 1; j >= 0; j--) {
      if (strcmp(m->user_tags[j].name, name) != 0)
        continue;
      if (first <= m->user_tags[j].last_layer)
        return piper_input_error(err,
                         "%s: layers [%lld, %lld] of tag \"%s\" must start after its previous "
                         "entry (which ends at layer %d)",
                         ctx, (long long)first, (long long)last, name, m->user_tags[j].last_layer);
      break;
    }
    if (model_tag_index(m, name) < 0) {
      if (m->n_tags >= MODEL_MAX_TAGS)
        return piper_input_error(err, "%s: more than %d distinct user tag names (\"%s\")", ctx,
                         MODEL_MAX_TAGS - 2, name);
      g_strlcpy(m->tag_names[m->n_tags++], name, MODEL_TAG_NAME_MAX);
    }
    g_strlcpy(m->user_tags[i].name, name, MODEL_TAG_NAME_MAX);
    m->user_tags[i].first_layer = (int32_t)first;
    m->user_tags[i].last_layer = (int32_t)last;
    m->n_user_tags = (uint32_t)i + 1;
  }
  return true;
}

/* piper.fp8 (optional): "tensorwise", "blockwise" or "none"; a bf16 model's only (the recipes
 * keep bf16 wherever they do not run FP8) */
static bool load_fp8(struct model *m, const cJSON *piper, const char *file, GError **err) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(piper, "fp8");
  m->fp8 = MODEL_FP8_NONE;
  if (!f)
    return true;
  for (int i = 0; cJSON_IsString(f) && f->valuestring && fp8_names[i]; i++)
    if (strcmp(f->valuestring, fp8_names[i]) == 0)
      m->fp8 = (enum model_fp8)i;
  if (!cJSON_IsString(f) || !f->valuestring || strcmp(f->valuestring, fp8_names[m->fp8]) != 0)
    return piper_input_error(err, "%s: \"piper.fp8\" must be \"tensorwise\", \"blockwise\" or "
                                  "\"none\"",
                             file);
  if (m->fp8 != MODEL_FP8_NONE && m->dtype != MODEL_DTYPE_BF16)
    return piper_input_error(err, "%s: \"piper.fp8\": \"%s\" needs \"piper.dtype\": \"bf16\" "
                                  "(the FP8 recipes keep bf16 outside the GEMMs)",
                             file, fp8_names[m->fp8]);
  return true;
}

static bool load_piper(struct model *m, const cJSON *root, const char *file, GError **err) {
  static const char *const keys[] = {
      "name", "seq_len", "micro_batch_size", "dtype", "fp8", "pp_regions", "pp_layers", "tags",
      "context_parallel", NULL};
  const cJSON *piper = cJSON_GetObjectItemCaseSensitive(root, "piper");
  if (!piper)
    return piper_input_error(err,
                     "%s: missing key \"piper\" (training fields: seq_len, "
                     "micro_batch_size, dtype, pp_regions or pp_layers)",
                     file);
  char ctx[512];
  g_snprintf(ctx, sizeof ctx, "%s: piper", file);
  if (!json_check_keys(piper, keys, ctx, err))
    return false;

  const cJSON *name = cJSON_GetObjectItemCaseSensitive(piper, "name");
  if (name) {
    if (!cJSON_IsString(name) || !name->valuestring || !name_ok(name->valuestring, sizeof m->name))
      return piper_input_error(err,
                       "%s: \"piper.name\" must be a string of 1 to %zu letters, digits, '_', "
                       "'-', '.'",
                       file, sizeof m->name - 1);
    g_strlcpy(m->name, name->valuestring, sizeof m->name);
  }
  if (!get_int(piper, "piper", "seq_len", true, 1, MAX_SEQ, &m->seq_len, file, err) ||
      !get_int(piper, "piper", "micro_batch_size", true, 1, MAX_MICRO_BATCH, &m->micro_batch_size,
               file, err))
    return false;
  m->context_parallel = 1;
  if (!get_int(piper, "piper", "context_parallel", false, 1, MODEL_MAX_CONTEXT_PARALLEL,
               &m->context_parallel, file, err))
    return false;
  /* 2N chunks of equal length (rank i holds chunks i and 2N-1-i) */
  if (m->context_parallel > 1 && m->seq_len % (2 * m->context_parallel) != 0)
    return piper_input_error(err, "%s: \"piper.seq_len\" %lld is not divisible by 2 x "
                                  "context_parallel = %lld (each sequence is cut into that many "
                                  "equal chunks)", file, (long long)m->seq_len,
                             (long long)(2 * m->context_parallel));
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(piper, "dtype");
  if (!dt)
    return piper_input_error(err, "%s: missing key \"piper.dtype\" (\"fp32\" or \"bf16\")", file);
  if (cJSON_IsString(dt) && dt->valuestring && strcmp(dt->valuestring, "fp32") == 0)
    m->dtype = MODEL_DTYPE_FP32;
  else if (cJSON_IsString(dt) && dt->valuestring && strcmp(dt->valuestring, "bf16") == 0)
    m->dtype = MODEL_DTYPE_BF16;
  else
    return piper_input_error(err, "%s: \"piper.dtype\" must be \"fp32\" or \"bf16\"", file);
  return load_fp8(m, piper, file, err) && load_pp(m, piper, file, err) &&
         load_tags(m, piper, file, err);
}

/* --- entry points -------------------------------------------------------------------------- */

/* "models/tiny-moe.json" -> "tiny-moe". Characters name_ok refuses become '_', so the name
 * model_to_json writes as "piper.name" always reads back. */
static void default_name(char *out, size_t size, const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base);
  if (n > 5 && strcmp(base + n - 5, ".json") == 0)
    n -= 5;
  if (n >= size)
    n = size - 1;
  for (size_t i = 0; i < n; i++) {
    char c = base[i];
    out[i] = g_ascii_isalnum(c) || c == '_' || c == '-' || c == '.' ? c : '_';
  }
  out[n] = '\0';
  if (n == 0)
    g_strlcpy(out, "model", size);
}

struct model *model_load_json(const char *name, const cJSON *root, int pp_regions_override,
                              GError **err) {
  const char *file = name ? name : "<model>";
  struct model *m = g_new0(struct model, 1);
  default_name(m->name, sizeof m->name, file);
  m->n_tags = 2;
  g_strlcpy(m->tag_names[MODEL_TAG_PP], "PP", MODEL_TAG_NAME_MAX);
  g_strlcpy(m->tag_names[MODEL_TAG_EP], "EP", MODEL_TAG_NAME_MAX);

  if (!cJSON_IsObject(root)) {
    piper_input_error(err, "%s: expected a JSON object at the top level", file);
    goto fail;
  }
  if (!check_hf_keys(root, file, err) || !load_hf(m, root, file, err) ||
      !check_hf_values(m, root, file, err) || !load_numerics(m, root, file, err) ||
      !load_piper(m, root, file, err))
    goto fail;
  if (pp_regions_override > 0) {
    if (pp_regions_override > m->num_layers) {
      piper_input_error(err, "%s: --pp-regions %d exceeds num_hidden_layers %lld", file,
                pp_regions_override, (long long)m->num_layers);
      goto fail;
    }
    split_equally(m, pp_regions_override);
  }
  if (!model_build(m, file, err))
    goto fail;

  cJSON *j = model_to_json(m);
  char *text = cJSON_PrintUnformatted(j);
  m->source_json = g_strdup(text);
  cJSON_free(text);
  cJSON_Delete(j);
  return m;
fail:
  model_free(m);
  return NULL;
}

struct model *model_load_file(const char *path, int pp_regions_override, GError **err) {
  cJSON *root = json_parse_file_strict(path, err);
  if (!root)
    return NULL;
  struct model *m = model_load_json(path, root, pp_regions_override, err);
  cJSON_Delete(root);
  return m;
}

/* --- writing back -------------------------------------------------------------------------- */

static void put_int(cJSON *obj, const char *key, int64_t v) {
  cJSON_AddItemToObject(obj, key, cJSON_CreateNumber((double)v));
}

bool model_pp_split_is_equal(const struct model *m) {
  for (int32_t r = 0; r < m->pp_regions; r++)
    if (m->pp_layers[r] != m->num_layers / m->pp_regions + (r < m->num_layers % m->pp_regions))
      return false;
  return true;
}

/* rope_theta, rms_norm_eps and rope_scaling where they differ from the defaults a file without
 * them gets, so that plans of models that never set them stay as they were. */
static void put_numerics(cJSON *o, const struct model *m) {
  if (m->rope_theta != MODEL_DEFAULT_ROPE_THETA)
    cJSON_AddNumberToObject(o, "rope_theta", m->rope_theta);
  if (m->rms_norm_eps != MODEL_DEFAULT_RMS_NORM_EPS)
    cJSON_AddNumberToObject(o, "rms_norm_eps", m->rms_norm_eps);
  const struct model_rope_scaling *sc = &m->rope_scaling;
  if (!sc->type[0])
    return;
  cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
  cJSON_AddStringToObject(r, "rope_type", sc->type);
  if (sc->factor > 0)
    cJSON_AddNumberToObject(r, "factor", sc->factor);
  if (strcmp(sc->type, "llama3") == 0) {
    cJSON_AddNumberToObject(r, "low_freq_factor", sc->low_freq_factor);
    cJSON_AddNumberToObject(r, "high_freq_factor", sc->high_freq_factor);
    put_int(r, "original_max_position_embeddings", sc->original_max_position_embeddings);
  }
}

/* What gpt2 / gpt_bigcode / gpt_oss add, under the names the loader reads back. */
static void put_gpt_keys(cJSON *o, const struct model *m) {
  if (is_gpt_style(m))
    put_int(o, "n_positions", m->max_positions);
  if (!is_gpt_oss(m))
    return;
  cJSON_AddBoolToObject(o, "attention_bias", m->linear_bias);
  if (m->sliding_window > 0)
    put_int(o, "sliding_window", m->sliding_window);
  cJSON *a = cJSON_AddArrayToObject(o, "layer_types");
  for (int64_t l = 0; l < m->num_layers; l++)
    cJSON_AddItemToArray(a, cJSON_CreateString(model_layer_sliding(m, l) ? "sliding_attention"
                                                                         : "full_attention"));
}

bool model_layer_sliding(const struct model *m, int64_t layer) {
  return m->sliding_window > 0 && layer >= 0 && layer < MODEL_MAX_LAYERS &&
         (m->sliding_layers[layer / 64] >> (layer % 64) & 1);
}

cJSON *model_to_json(const struct model *m) {
  bool deepseek = m->family == MODEL_FAMILY_DEEPSEEK_V3;
  bool mixtral = strcmp(m->model_type, "mixtral") == 0 || is_gpt_oss(m);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model_type", m->model_type);
  put_int(o, "hidden_size", m->hidden_size);
  put_int(o, "num_hidden_layers", m->num_layers);
  put_int(o, "num_attention_heads", m->num_heads);
  put_int(o, "num_key_value_heads", m->num_kv_heads);
  if (!deepseek)
    put_int(o, "head_dim", m->head_dim);
  if (m->intermediate_size > 0)
    put_int(o, "intermediate_size", m->intermediate_size);
  if (m->family != MODEL_FAMILY_DENSE) {
    if (!mixtral)
      put_int(o, "moe_intermediate_size", m->moe_intermediate_size);
    put_int(o,
            deepseek  ? "n_routed_experts"
            : mixtral ? "num_local_experts"
                      : "num_experts",
            m->num_experts);
    put_int(o, "num_experts_per_tok", m->experts_per_tok);
    if (m->loss_free_balancing)
      cJSON_AddStringToObject(o, "topk_method", "noaux_tc");
    if (m->n_shared_experts > 0 || deepseek)
      put_int(o, "n_shared_experts", m->n_shared_experts);
    if (strcmp(m->model_type, "qwen2_moe") == 0)
      put_int(o, "shared_expert_intermediate_size", m->shared_expert_intermediate_size);
  }
  if (deepseek) {
    put_int(o, "first_k_dense_replace", m->first_k_dense);
    put_int(o, "q_lora_rank", m->q_lora_rank);
    put_int(o, "kv_lora_rank", m->kv_lora_rank);
    put_int(o, "qk_nope_head_dim", m->qk_nope_head_dim);
    put_int(o, "qk_rope_head_dim", m->qk_rope_head_dim);
    put_int(o, "v_head_dim", m->v_head_dim);
  }
  put_int(o, "vocab_size", m->vocab_size);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", m->tie_word_embeddings);
  put_gpt_keys(o, m);
  put_numerics(o, m);

  cJSON *p = cJSON_AddObjectToObject(o, "piper");
  cJSON_AddStringToObject(p, "name", m->name);
  put_int(p, "seq_len", m->seq_len);
  put_int(p, "micro_batch_size", m->micro_batch_size);
  if (m->context_parallel > 1) /* absent at 1, so plans without it stay as they were */
    put_int(p, "context_parallel", m->context_parallel);
  cJSON_AddStringToObject(p, "dtype", model_dtype_name(m->dtype));
  if (m->fp8 != MODEL_FP8_NONE) /* absent otherwise: plans of other models keep their bytes */
    cJSON_AddStringToObject(p, "fp8", model_fp8_name(m->fp8));
  if (model_pp_split_is_equal(m)) {
    put_int(p, "pp_regions", m->pp_regions);
  } else {
    cJSON *a = cJSON_AddArrayToObject(p, "pp_layers");
    for (int32_t r = 0; r < m->pp_regions; r++)
      cJSON_AddItemToArray(a, cJSON_CreateNumber(m->pp_layers[r]));
  }
  if (m->n_user_tags > 0) {
    cJSON *tags = cJSON_AddArrayToObject(p, "tags");
    for (uint32_t i = 0; i < m->n_user_tags; i++) {
      cJSON *t = cJSON_CreateObject();
      cJSON_AddStringToObject(t, "tag", m->user_tags[i].name);
      cJSON *range = cJSON_AddArrayToObject(t, "layers");
      cJSON_AddItemToArray(range, cJSON_CreateNumber(m->user_tags[i].first_layer));
      cJSON_AddItemToArray(range, cJSON_CreateNumber(m->user_tags[i].last_layer));
      cJSON_AddItemToArray(tags, t);
    }
  }
  return o;
}

uint32_t model_group_end(const struct model *m, uint32_t op, uint32_t end) {
  uint32_t o = op + 1;
  /* the embedding and the final norm share layer -1 but are never next to each other but in a
   * model without layers; the embedding stays alone there too */
  if (m->ops[op].kind == MODEL_OP_EMBEDDING)
    return o < end ? o : end;
  while (o < end && m->ops[o].layer == m->ops[op].layer)
    o++;
  return o;
}

uint32_t model_bwd_group_end(const struct model *m, uint32_t op, uint32_t end) {
  uint32_t g_end = model_group_end(m, op, end);
  if (m->ops[op].layer < 0)
    return g_end;
  /* a block ends at its residual add: what follows in the layer is the next block's */
  for (uint32_t o = op + 1; o < g_end; o++)
    if (m->ops[o - 1].kind == MODEL_OP_RESIDUAL_ADD)
      return o;
  return g_end;
}
