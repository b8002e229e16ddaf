/* hf: Hugging Face weights in (docs/exec.md, "Hugging Face weights"). The name of every
 * parameter tensor of a Hugging Face checkpoint of the model's family and where it lies in an
 * op's one-device block (the map); the safetensors reader (a little-endian u64 header length,
 * that many bytes of JSON {name: {dtype, shape, data_offsets}}, then the data), which checks
 * every tensor's name, shape and dtype against the map; and the load, where each device reads
 * only the elements it keeps: files are mapped, so the pages of other ranks' slices are never
 * read. The export is hf_save.c's. RoPE needs no permutation: the kernels rotate in HF's
 * rotate_half layout (kernels/kernels.h). */
#include <math.h>
#include <string.h>

#include "../base/json.h"
#include "exec-impl.h"
#include "gpu_weights.h"

/* ---- the map ------------------------------------------------------------------------------ */

struct map_builder {
  GArray *t; /* struct exec_hf_tensor */
  uint32_t op;
  uint64_t at; /* next offset in the op's block */
};

static void add(struct map_builder *b, char *name, uint32_t ndim, uint64_t rows, uint64_t cols,
                bool transposed) {
  struct exec_hf_tensor t = {name, b->op, b->at, ndim, {rows, ndim > 1 ? cols : 0}, transposed,
                             false};
  g_array_append_val(b->t, t);
  b->at += ndim > 1 ? rows * cols : rows;
}

/* nn.Linear(in, out).weight: HF [out, in], the kernels [in, out] */
static void linear(struct map_builder *b, const char *prefix, const char *what, uint64_t in,
                   uint64_t out) {
  add(b, g_strdup_printf("%s.%s.weight", prefix, what), 2, out, in, true);
}

/* SwiGLU: the kernels' wg, wu [C, F] and wd [F, C] (kernels/kernels.h) */
static void swiglu(struct map_builder *b, const char *prefix, bool mixtral, uint64_t C,
                   uint64_t F) {
  linear(b, prefix, mixtral ? "w1" : "gate_proj", C, F);
  linear(b, prefix, mixtral ? "w3" : "up_proj", C, F);
  linear(b, prefix, mixtral ? "w2" : "down_proj", F, C);
}

static bool map_op(const struct model *m, uint32_t o, struct map_builder *b, uint32_t *norms,
                   GError **err) {
  const struct model_op *op = &m->ops[o];
  uint64_t C = (uint64_t)m->hidden_size, V = (uint64_t)m->vocab_size;
  bool mixtral = strcmp(m->model_type, "mixtral") == 0;
  const char *moe = mixtral ? "block_sparse_moe" : "mlp";
  char layer[48];
  g_snprintf(layer, sizeof layer, "model.layers.%d", op->layer);
  char *pre = NULL;
  switch (op->kind) {
  case MODEL_OP_EMBEDDING: add(b, g_strdup("model.embed_tokens.weight"), 2, V, C, false); break;
  case MODEL_OP_RMSNORM:
    if (op->layer < 0)
      add(b, g_strdup("model.norm.weight"), 1, C, 0, false);
    else
      add(b,
          g_strdup_printf("%s.%s.weight", layer,
                          norms[op->layer]++ ? "post_attention_layernorm" : "input_layernorm"),
          1, C, 0, false);
    break;
  case MODEL_OP_ATTENTION: {
    uint64_t HD = (uint64_t)(op->shape[2] * op->shape[4]), KD = (uint64_t)(op->shape[3] * op->shape[4]);
    pre = g_strdup_printf("%s.self_attn", layer);
    linear(b, pre, "q_proj", C, HD);
    linear(b, pre, "k_proj", C, KD);
    linear(b, pre, "v_proj", C, KD);
    linear(b, pre, "o_proj", HD, C);
    break;
  }
  case MODEL_OP_MLP:
    pre = g_strdup_printf("%s.mlp", layer);
    swiglu(b, pre, false, C, (uint64_t)op->shape[2]);
    break;
  case MODEL_OP_SHARED_EXPERT:
    /* DeepSeek-V3 keeps its shared experts as one MLP n_shared times as wide, as Piper does */
    pre = g_strdup_printf("%s.mlp.%s", layer,
                          m->family == MODEL_FAMILY_DEEPSEEK_V3 ? "shared_experts" : "shared_expert");
    swiglu(b, pre, false, C, (uint64_t)op->shape[2]);
    if (m->shared_expert_gate) /* Qwen2-MoE's sigmoid gate, [hidden, 1] after the MLP */
      add(b, g_strdup_printf("%s.mlp.shared_expert_gate.weight", layer), 2, 1, C, true);
    break;
  case MODEL_OP_ROUTER:
    pre = g_strdup_printf("%s.%s", layer, moe);
    linear(b, pre, "gate", C, (uint64_t)op->shape[2]);
    break;
  case MODEL_OP_EXPERT_FFN:
    for (int64_t e = 0; e < op->shape[3]; e++) {
      char *ex = g_strdup_printf("%s.%s.experts.%lld", layer, moe, (long long)e);
      swiglu(b, ex, mixtral, C, (uint64_t)op->shape[2]);
      g_free(ex);
    }
    break;
  case MODEL_OP_LM_HEAD_LOSS:
    if (op->param_count && m->tie_word_embeddings) {
      /* the head's copy of the tied table, [V, C] like it (params.c) */
      add(b, g_strdup("model.embed_tokens.weight"), 2, V, C, false);
      g_array_index(b->t, struct exec_hf_tensor, b->t->len - 1).alias = true;
    } else if (op->param_count)
      add(b, g_strdup("lm_head.weight"), 2, V, C, true);
    break;
  case MODEL_OP_MLA_ATTENTION:
    return piper_input_error(err,
                             "%s: Hugging Face weights of MLA attention (model_type %s) are not "
                             "mapped: the executor has no MLA kernel",
                             m->name, m->model_type);
  default: break;
  }
  g_free(pre);
  if (b->at != op->param_count)
    return piper_input_error(err,
                             "%s: op %u (%s, layer %d) holds %llu parameters, its Hugging Face "
                             "tensors %llu (model_type %s is not mapped faithfully)",
                             m->name, o, model_op_kind_name(op->kind), op->layer,
                             (unsigned long long)op->param_count, (unsigned long long)b->at,
                             m->model_type);
  return true;
}

bool exec_hf_map_build(const struct model *m, struct exec_hf_map *map, GError **err) {
  memset(map, 0, sizeof *map);
  struct map_builder b = {g_array_new(FALSE, FALSE, sizeof(struct exec_hf_tensor)), 0, 0};
  uint32_t *norms = g_new0(uint32_t, m->num_layers + 1);
  map->op_first = g_new0(uint32_t, m->n_ops + 1);
  bool ok = true;
  for (uint32_t o = 0; o < m->n_ops && ok; o++) {
    map->op_first[o] = b.t->len;
    b.op = o;
    b.at = 0;
    ok = map_op(m, o, &b, norms, err);
  }
  map->op_first[m->n_ops] = b.t->len;
  map->n = b.t->len;
  map->t = (struct exec_hf_tensor *)(void *)g_array_free(b.t, FALSE);
  g_free(norms);
  if (!ok)
    exec_hf_map_clear(map);
  return ok;
}

void exec_hf_map_clear(struct exec_hf_map *map) {
  if (!map)
    return;
  for (uint32_t k = 0; k < map->n; k++)
    g_free(map->t[k].name);
  g_free(map->t);
  g_free(map->op_first);
  memset(map, 0, sizeof *map);
}

void exec_hf_locate(const struct exec_hf_map *map, uint32_t op, uint64_t g, uint32_t *tensor,
                    uint64_t *index) {
  uint32_t k = map->op_first[op];
  while (k + 1 < map->op_first[op + 1] && map->t[k + 1].offset <= g)
    k++;
  const struct exec_hf_tensor *t = &map->t[k];
  uint64_t p = g - t->offset;
  *tensor = k;
  /* the block's [in, out] element p is HF's [p % out, p / out] */
  *index = t->transposed ? (p % t->shape[0]) * t->shape[1] + p / t->shape[0] : p;
}

char *exec_hf_map_json(const struct model *m) {
  struct exec_hf_map map;
  if (!exec_hf_map_build(m, &map, NULL))
    return NULL;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model", m->name);
  cJSON_AddStringToObject(o, "model_type", m->model_type);
  cJSON_AddStringToObject(o, "about",
                          "every parameter tensor by its Hugging Face name and global shape, and "
                          "where it lies in its op's one-device block (transposed: the block holds "
                          "[shape[1], shape[0]]); each rank-<r>.ckpt holds, per segment, the "
                          "slices [op, offset, count] of those blocks for its tp_rank of "
                          "tp_degree and its ep_rank of ep_size, its ZeRO shards per bucket; the "
                          "AdamW moments follow the parameters' layout (docs/exec.md)");
  cJSON *a = cJSON_AddArrayToObject(o, "tensors");
  for (uint32_t k = 0; k < map.n; k++) {
    const struct exec_hf_tensor *t = &map.t[k];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", t->name);
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    for (uint32_t d = 0; d < t->ndim; d++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
    cJSON_AddNumberToObject(e, "op", t->op);
    cJSON_AddNumberToObject(e, "offset", (double)t->offset);
    cJSON_AddBoolToObject(e, "transposed", t->transposed);
    if (t->alias)
      cJSON_AddBoolToObject(e, "copy", true);
    cJSON_AddItemToArray(a, e);
  }
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  exec_hf_map_clear(&map);
  return text;
}

/* ---- safetensors in ---------------------------------------------------------------------- */

enum hf_dtype { HF_F32, HF_BF16, HF_F16 };

static int cmp_names(gconstpointer a, gconstpointer b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

struct hf_entry {
  const char *file; /* path, for messages */
  enum hf_dtype dtype;
  uint32_t ndim;
  uint64_t shape[8];
  const unsigned char *data;
  bool used;
};

struct hf_source {
  GPtrArray *files;     /* GMappedFile */
  GPtrArray *paths;     /* char * */
  GHashTable *entries;  /* name -> struct hf_entry */
};

static void source_clear(struct hf_source *src) {
  if (src->files)
    g_ptr_array_free(src->files, TRUE);
  if (src->paths)
    g_ptr_array_free(src->paths, TRUE);
  if (src->entries)
    g_hash_table_destroy(src->entries);
  memset(src, 0, sizeof *src);
}

static bool parse_dtype(const char *t, enum hf_dtype *d) {
  static const char *const names[] = {"F32", "BF16", "F16"};
  for (int k = 0; k < 3; k++)
    if (strcmp(t, names[k]) == 0) {
      *d = (enum hf_dtype)k;
      return true;
    }
  return false;
}

static size_t dtype_bytes(enum hf_dtype d) { return d == HF_F32 ? 4 : 2; }

/* One header entry: dtype, shape and data_offsets within data_len bytes. */
static bool read_entry(const char *path, const cJSON *v, const unsigned char *data,
                       uint64_t data_len, struct hf_entry *e, GError **err) {
  const char *name = v->string;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(v, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(v, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
      cJSON_GetArraySize(off) != 2 || cJSON_GetArraySize(sh) > 8)
    return piper_input_error(err, "%s: tensor \"%s\": a header entry needs dtype, shape and "
                                  "data_offsets", path, name);
  if (!parse_dtype(dt->valuestring, &e->dtype))
    return piper_input_error(err, "%s: tensor \"%s\" has dtype %s (BF16, F16 and F32 are read)",
                             path, name, dt->valuestring);
  uint64_t count = 1, lo = 0, hi = 0;
  for (const cJSON *x = sh->child; x; x = x->next) {
    if (!json_is_whole(x) || x->valuedouble < 0 || x->valuedouble > 1e15)
      return piper_input_error(err, "%s: tensor \"%s\": shape must hold whole numbers", path,
                               name);
    e->shape[e->ndim++] = (uint64_t)x->valuedouble;
    count *= (uint64_t)x->valuedouble;
  }
  if (!json_is_whole(off->child) || !json_is_whole(off->child->next) ||
      off->child->valuedouble < 0 || off->child->next->valuedouble < 0)
    return piper_input_error(err, "%s: tensor \"%s\": data_offsets must be whole numbers", path,
                             name);
  lo = (uint64_t)off->child->valuedouble;
  hi = (uint64_t)off->child->next->valuedouble;
  if (hi < lo || hi > data_len || hi - lo != count * dtype_bytes(e->dtype))
    return piper_input_error(err,
                             "%s: tensor \"%s\": data_offsets [%llu, %llu] do not hold its shape "
                             "in the file's %llu data bytes",
                             path, name, (unsigned long long)lo, (unsigned long long)hi,
                             (unsigned long long)data_len);
  e->data = data + lo;
  return true;
}

/* Maps one shard and adds its tensors to src->entries. */
static bool open_shard(struct hf_source *src, const char *path, GError **err) {
  GError *e = NULL;
  GMappedFile *f = g_mapped_file_new(path, FALSE, &e);
  if (!f) {
    piper_input_error(err, "%s: cannot read: %s", path, e->message);
    g_error_free(e);
    return false;
  }
  g_ptr_array_add(src->files, f);
  char *kept = g_strdup(path);
  g_ptr_array_add(src->paths, kept);
  const unsigned char *bytes = (const unsigned char *)g_mapped_file_get_contents(f);
  size_t len = g_mapped_file_get_length(f);
  uint64_t n = 0;
  if (len >= 8)
    for (int k = 7; k >= 0; k--)
      n = n << 8 | bytes[k];
  if (len < 8 || n > len - 8 || n > (64u << 20))
    return piper_input_error(err, "%s: not a safetensors file (header length %llu, %zu bytes)",
                             path, (unsigned long long)n, len);
  cJSON *root = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)n);
  bool ok = cJSON_IsObject(root);
  if (!ok)
    piper_input_error(err, "%s: the safetensors header is not a JSON object", path);
  for (const cJSON *v = ok ? root->child : NULL; v && ok; v = v->next) {
    if (strcmp(v->string, "__metadata__") == 0)
      continue;
    struct hf_entry *x = g_new0(struct hf_entry, 1);
    x->file = kept;
    ok = read_entry(path, v, bytes + 8 + n, len - 8 - n, x, err);
    if (ok && g_hash_table_contains(src->entries, v->string))
      ok = piper_input_error(err, "%s: tensor \"%s\" is stored twice (also in %s)", path,
                             v->string,
                             ((struct hf_entry *)g_hash_table_lookup(src->entries, v->string))->file);
    if (ok)
      g_hash_table_insert(src->entries, g_strdup(v->string), x);
    else
      g_free(x);
  }
  cJSON_Delete(root);
  return ok;
}

/* Each tensor of a shard is where the index says (as transformers would load it), named in the
 * first by name: the same message on every rank. */
static bool check_index(struct hf_source *src, const cJSON *map, const char *index, GError **err) {
  GHashTableIter it;
  gpointer key, value;
  GPtrArray *names = g_ptr_array_new();
  g_hash_table_iter_init(&it, src->entries);
  while (g_hash_table_iter_next(&it, &key, &value))
    g_ptr_array_add(names, key);
  g_ptr_array_sort(names, cmp_names);
  bool ok = true;
  for (guint k = 0; k < names->len && ok; k++) {
    const char *name = g_ptr_array_index(names, k);
    const struct hf_entry *e = g_hash_table_lookup(src->entries, name);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, name);
    char *base = g_path_get_basename(e->file);
    if (!cJSON_IsString(v) || strcmp(v->valuestring, base) != 0)
      ok = piper_input_error(err, "%s: tensor \"%s\" is in %s, the index's weight_map says %s",
                             index, name, base, cJSON_IsString(v) ? v->valuestring : "nothing");
    g_free(base);
  }
  g_ptr_array_free(names, TRUE);
  return ok;
}

/* The shards model.safetensors.index.json names (each once, in order of first mention), or
 * model.safetensors alone. */
static bool open_source(const char *dir, struct hf_source *src, GError **err) {
  src->files = g_ptr_array_new_with_free_func((GDestroyNotify)g_mapped_file_unref);
  src->paths = g_ptr_array_new_with_free_func(g_free);
  src->entries = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
  char *index = g_build_filename(dir, "model.safetensors.index.json", NULL);
  bool ok = true;
  if (!g_file_test(index, G_FILE_TEST_EXISTS)) {
    char *one = g_build_filename(dir, "model.safetensors", NULL);
    if (!g_file_test(one, G_FILE_TEST_EXISTS))
      ok = piper_input_error(err, "--load-hf %s: no model.safetensors.index.json and no "
                                  "model.safetensors there", dir);
    else
      ok = open_shard(src, one, err);
    g_free(one);
    g_free(index);
    return ok;
  }
  char *text = piper_read_file(index, 64u << 20, NULL, err);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  g_free(text);
  if (text && !root)
    ok = piper_input_error(err, "%s: not valid JSON", index);
  if (root && !json_refuse_duplicate_keys(root, index, err)) /* a tensor mapped twice */
    ok = false;
  const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
  if (root && !cJSON_IsObject(map))
    ok = piper_input_error(err, "%s: \"weight_map\" must be an object", index);
  GHashTable *seen = g_hash_table_new(g_str_hash, g_str_equal);
  for (const cJSON *v = ok && map ? map->child : NULL; v && ok; v = v->next) {
    if (!cJSON_IsString(v) || strchr(v->valuestring, '/'))
      ok = piper_input_error(err, "%s: \"weight_map\": \"%s\" must name a file in %s", index,
                             v->string, dir);
    else if (!g_hash_table_contains(seen, v->valuestring)) {
      g_hash_table_add(seen, v->valuestring);
      char *shard = g_build_filename(dir, v->valuestring, NULL);
      ok = open_shard(src, shard, err);
      g_free(shard);
    }
  }
  g_hash_table_destroy(seen);
  if (ok && root)
    ok = check_index(src, map, index, err);
  cJSON_Delete(root);
  g_free(index);
  return ok && root;
}


static void append_shape(GString *s, uint32_t ndim, const uint64_t *shape) {
  g_string_append_c(s, '[');
  for (uint32_t k = 0; k < ndim; k++)
    g_string_append_printf(s, "%s%llu", k ? ", " : "", (unsigned long long)shape[k]);
  g_string_append_c(s, ']');
}

/* Every tensor the model needs, with its shape; then nothing the model lacks (a bias, Qwen3's
 * q_norm: an architecture the model file does not describe). */
static bool check_source(const struct model *m, const struct exec_hf_map *map,
                         struct hf_source *src, const char *dir, GError **err) {
  for (uint32_t k = 0; k < map->n; k++) {
    const struct exec_hf_tensor *t = &map->t[k];
    struct hf_entry *e = g_hash_table_lookup(src->entries, t->name);
    if (!e)
      return piper_input_error(err, "--load-hf %s: tensor \"%s\" is missing (model %s needs it)",
                               dir, t->name, m->name);
    e->used = true;
    if (e->ndim != t->ndim || e->shape[0] != t->shape[0] || (t->ndim > 1 && e->shape[1] != t->shape[1])) {
      GString *a = g_string_new(NULL), *b = g_string_new(NULL);
      append_shape(a, e->ndim, e->shape);
      append_shape(b, t->ndim, t->shape);
      piper_input_error(err, "%s: tensor \"%s\" has shape %s, model %s needs %s", e->file,
                        t->name, a->str, m->name, b->str);
      g_string_free(a, TRUE);
      g_string_free(b, TRUE);
      return false;
    }
  }
  GHashTableIter it;
  gpointer key, value;
  GPtrArray *extra = g_ptr_array_new();
  g_hash_table_iter_init(&it, src->entries);
  while (g_hash_table_iter_next(&it, &key, &value)) {
    const char *name = key;
    /* tied checkpoints may keep the head; old ones the RoPE frequencies: neither is a weight */
    bool harmless = (m->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) ||
                    g_str_has_suffix(name, ".rotary_emb.inv_freq");
    if (!((struct hf_entry *)value)->used && !harmless)
      g_ptr_array_add(extra, key);
  }
  bool ok = extra->len == 0;
  if (!ok) {
    /* the first by name: the same message on every rank */
    g_ptr_array_sort(extra, cmp_names);
    const char *name = g_ptr_array_index(extra, 0);
    piper_input_error(err,
                      "%s: tensor \"%s\" has no place in model %s (model_type %s: no biases, "
                      "no q/k norms)%s",
                      ((struct hf_entry *)g_hash_table_lookup(src->entries, name))->file, name,
                      m->name, m->model_type, extra->len > 1 ? " (and more)" : "");
  }
  g_ptr_array_free(extra, TRUE);
  return ok;
}

static float read_value(const struct hf_entry *e, uint64_t i) {
  const unsigned char *p = e->data + i * dtype_bytes(e->dtype);
  if (e->dtype == HF_F32) {
    float x;
    memcpy(&x, p, 4);
    return x;
  }
  uint16_t h = (uint16_t)(p[0] | p[1] << 8);
  if (e->dtype == HF_BF16)
    return exec_bf16_to_f32(h);
  /* IEEE half: sign, 5-bit exponent (bias 15), 10-bit fraction */
  uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 31u, fr = h & 1023u, u;
  if (ex == 31)
    u = sign | 0x7f800000u | fr << 13;
  else if (ex)
    u = sign | (ex + 112u) << 23 | fr << 13;
  else {
    float x = (float)fr * (1.0f / 16777216.0f); /* subnormal: fr * 2^-24 */
    return sign ? -x : x;
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}

struct load_ctx {
  const struct exec_hf_map *map;
  struct hf_entry **entry; /* [map->n] */
  float *host;
  uint32_t seg;
};

static void load_one(const struct exec_state *s, uint32_t op, uint64_t local, uint64_t g,
                     void *data) {
  struct load_ctx *c = data;
  if (!exec_param_current(s, c->seg, local))
    return;
  uint32_t k;
  uint64_t i;
  exec_hf_locate(c->map, op, g, &k, &i);
  c->host[s->dev->param_offset[c->seg] + local] = read_value(c->entry[k], i);
}

/* The first field in which the checkpoint's model (ck) differs from this run's (m), or NULL;
 * *a and *b get the two values printed. */
static const char *config_difference(const struct model *ck, const struct model *m, char *a,
                                     char *b, size_t n) {
  const struct {
    const char *key;
    double x, y;
  } rows[] = {
      {"hidden_size", (double)ck->hidden_size, (double)m->hidden_size},
      {"num_hidden_layers", (double)ck->num_layers, (double)m->num_layers},
      {"num_attention_heads", (double)ck->num_heads, (double)m->num_heads},
      {"num_key_value_heads", (double)ck->num_kv_heads, (double)m->num_kv_heads},
      {"head_dim", (double)ck->head_dim, (double)m->head_dim},
      {"intermediate_size", (double)ck->intermediate_size, (double)m->intermediate_size},
      {"moe_intermediate_size", (double)ck->moe_intermediate_size,
       (double)m->moe_intermediate_size},
      {"num_experts", (double)ck->num_experts, (double)m->num_experts},
      {"num_experts_per_tok", (double)ck->experts_per_tok, (double)m->experts_per_tok},
      {"vocab_size", (double)ck->vocab_size, (double)m->vocab_size},
      {"tie_word_embeddings", ck->tie_word_embeddings, m->tie_word_embeddings},
      {"rope_theta", ck->rope_theta, m->rope_theta},
      {"rms_norm_eps", ck->rms_norm_eps, m->rms_norm_eps},
      {"rope_scaling.factor", ck->rope_scaling.factor, m->rope_scaling.factor},
  };
  if (strcmp(ck->model_type, m->model_type) != 0) {
    g_snprintf(a, n, "%s", ck->model_type);
    g_snprintf(b, n, "%s", m->model_type);
    return "model_type";
  }
  if (strcmp(ck->rope_scaling.type, m->rope_scaling.type) != 0) {
    g_snprintf(a, n, "\"%s\"", ck->rope_scaling.type);
    g_snprintf(b, n, "\"%s\"", m->rope_scaling.type);
    return "rope_scaling type";
  }
  for (size_t k = 0; k < G_N_ELEMENTS(rows); k++)
    if (rows[k].x != rows[k].y) {
      g_snprintf(a, n, "%g", rows[k].x);
      g_snprintf(b, n, "%g", rows[k].y);
      return rows[k].key;
    }
  return NULL;
}

/* The checkpoint's config.json, when it has one, read as a model file with this run's training
 * fields, must describe this model: shapes catch a wrong width, this also what shapes cannot
 * (rope_theta, rms_norm_eps, rope_scaling, the model type). */
static bool check_config(const struct model *m, const char *dir, GError **err) {
  char *path = g_build_filename(dir, "config.json", NULL);
  if (!g_file_test(path, G_FILE_TEST_EXISTS)) {
    g_free(path);
    return true;
  }
  char *text = piper_read_file(path, 16u << 20, NULL, err);
  cJSON *cfg = text ? cJSON_Parse(text) : NULL;
  bool ok = text != NULL;
  if (ok && !cJSON_IsObject(cfg))
    ok = piper_input_error(err, "%s: not a JSON object", path);
  ok = ok && json_refuse_duplicate_keys(cfg, path, err); /* as the model reader refuses them */
  struct model *ck = NULL;
  if (ok) {
    /* training fields that fit any model: the architecture is what is compared */
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "piper");
    cJSON *piper = cJSON_AddObjectToObject(cfg, "piper");
    cJSON_AddNumberToObject(piper, "seq_len", (double)m->seq_len);
    cJSON_AddNumberToObject(piper, "micro_batch_size", (double)m->micro_batch_size);
    cJSON_AddNumberToObject(piper, "pp_regions", 1);
    cJSON_AddStringToObject(piper, "dtype", "fp32");
    ck = model_load_json(path, cfg, 0, err);
    ok = ck != NULL;
  }
  char a[64], b[64];
  const char *key = ck ? config_difference(ck, m, a, b, sizeof a) : NULL;
  if (key)
    ok = piper_input_error(err, "%s: %s is %s, model %s has %s", path, key, a, m->name, b);
  model_free(ck);
  cJSON_Delete(cfg);
  g_free(text);
  g_free(path);
  return ok;
}

bool exec_hf_load(const struct exec_state *s, const char *dir, float *host, GError **err) {
  const struct model *m = s->xm->m;
  struct exec_hf_map map;
  struct hf_source src = {0};
  if (!exec_hf_map_build(m, &map, err))
    return false;
  bool ok = check_config(m, dir, err) && open_source(dir, &src, err) &&
            check_source(m, &map, &src, dir, err);
  if (ok) {
    struct hf_entry **entry = g_new(struct hf_entry *, map.n + 1);
    for (uint32_t k = 0; k < map.n; k++)
      entry[k] = g_hash_table_lookup(src.entries, map.t[k].name);
    for (uint32_t seg = 0; seg < m->n_segments; seg++) {
      if (!s->dev->holds[seg])
        continue;
      struct load_ctx c = {&map, entry, host, seg};
      exec_for_each_param(s, seg, load_one, &c);
    }
    g_free(entry);
  }
  source_clear(&src);
  exec_hf_map_clear(&map);
  return ok;
}
