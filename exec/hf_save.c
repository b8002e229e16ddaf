/* hf_save: the trained parameters as a Hugging Face checkpoint (docs/exec.md, "Hugging Face
 * weights"): DIR/model.safetensors (bf16 or fp32) and DIR/config.json. No rank holds the whole
 * model: op after op (hf.c's map in model order), every rank puts in the elements it holds a
 * current copy of, the lowest such rank of each element is agreed on (a min-reduction), the
 * values summed to rank 0 from those owners alone (exact: one non-zero term), and rank 0
 * appends the op's tensors to the file, transposed to HF's [out, in]. */
#include <math.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../base/json.h"
#include "gpu_weights.h"
#include "runner-impl.h"

#define NOBODY 1e30

struct op_ctx {
  const float *host; /* this device's flat parameters */
  uint32_t op, seg;
  double *value, *owner; /* [op's count] */
  double rank;
};

static void take(const struct exec_state *s, uint32_t op, uint64_t local, uint64_t g, void *data) {
  struct op_ctx *c = data;
  if (op != c->op || !exec_param_current(s, c->seg, local))
    return;
  c->value[g] = c->host[s->dev->param_offset[c->seg] + local];
  c->owner[g] = c->rank;
}

static char *header_json(const struct exec_hf_map *map, bool bf16, size_t *len) {
  cJSON *o = cJSON_CreateObject();
  cJSON *meta = cJSON_AddObjectToObject(o, "__metadata__");
  cJSON_AddStringToObject(meta, "format", "pt");
  uint64_t at = 0;
  for (uint32_t k = 0; k < map->n; k++) {
    const struct exec_hf_tensor *t = &map->t[k];
    if (t->alias)
      continue;
    cJSON *e = cJSON_AddObjectToObject(o, t->name);
    cJSON_AddStringToObject(e, "dtype", bf16 ? "BF16" : "F32");
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
      n *= t->shape[d];
    }
    cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    at += n * (bf16 ? 2 : 4);
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
  }
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  /* padded with spaces to a multiple of 8, so the data is aligned (as safetensors writes) */
  size_t n = strlen(text), padded = (n + 7) / 8 * 8;
  char *out = g_malloc(padded + 1);
  memcpy(out, text, n);
  memset(out + n, ' ', padded - n);
  out[padded] = 0;
  cJSON_free(text);
  *len = padded;
  return out;
}

/* Tensor t of an op's gathered block, in HF's order and dtype. */
static bool write_tensor(FILE *f, const struct exec_hf_tensor *t, const double *block, bool bf16) {
  uint64_t rows = t->shape[0], cols = t->ndim > 1 ? t->shape[1] : 1, n = rows * cols;
  unsigned char buf[4096];
  size_t fill = 0, w = bf16 ? 2 : 4;
  for (uint64_t i = 0; i < n; i++) {
    /* HF [r, c] is the block's [c, r] when transposed */
    uint64_t p = t->transposed ? (i % cols) * rows + i / cols : i;
    float x = (float)block[t->offset + p];
    if (bf16) {
      uint16_t h = exec_bf16_round(x);
      buf[fill] = (unsigned char)(h & 0xff);
      buf[fill + 1] = (unsigned char)(h >> 8);
    } else
      memcpy(buf + fill, &x, 4);
    fill += w;
    if (fill == sizeof buf) {
      if (fwrite(buf, 1, fill, f) != fill)
        return false;
      fill = 0;
    }
  }
  return fwrite(buf, 1, fill, f) == fill;
}

static const char *architecture(const char *model_type) {
  static const char *const rows[][2] = {
      {"llama", "LlamaForCausalLM"},         {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},         {"qwen3", "Qwen3ForCausalLM"},
      {"qwen2_moe", "Qwen2MoeForCausalLM"},  {"qwen3_moe", "Qwen3MoeForCausalLM"},
      {"mixtral", "MixtralForCausalLM"},     {"deepseek_v3", "DeepseekV3ForCausalLM"}};
  for (size_t k = 0; k < G_N_ELEMENTS(rows); k++)
    if (strcmp(rows[k][0], model_type) == 0)
      return rows[k][1];
  return NULL;
}

/* The model file's Hugging Face keys (its "piper" training fields dropped) and what
 * transformers reads to pick the class and the dtype. */
static bool write_config(const struct model *m, const char *dir, bool bf16, GError **err) {
  cJSON *o = model_to_json(m);
  cJSON_DeleteItemFromObjectCaseSensitive(o, "piper");
  const char *arch = architecture(m->model_type);
  if (arch) {
    cJSON *a = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch));
  }
  cJSON_AddStringToObject(o, "hidden_act", "silu");
  cJSON_AddStringToObject(o, "torch_dtype", bf16 ? "bfloat16" : "float32");
  char *path = g_build_filename(dir, "config.json", NULL);
  bool ok = json_write_file(path, o, err);
  g_free(path);
  cJSON_Delete(o);
  return ok;
}

/* One op gathered on rank 0 (value: every element from its owner); false only when the job's
 * reductions fail. */
static bool gather_op(struct runner *R, const float *host, uint32_t o, double *value,
                      double *owner, GError **err) {
  const struct model *m = R->s.xm->m;
  uint64_t n = m->ops[o].param_count;
  for (uint64_t i = 0; i < n; i++) {
    value[i] = 0;
    owner[i] = NOBODY;
  }
  for (uint32_t seg = 0; seg < m->n_segments; seg++) {
    const struct model_segment *sg = &m->segments[seg];
    if (!R->dev->holds[seg] || o < sg->op_first || o >= sg->op_first + sg->op_count)
      continue;
    struct op_ctx c = {host, o, seg, value, owner, (double)R->rank};
    exec_for_each_param(&R->s, seg, take, &c);
  }
  double *mine = g_memdup2(owner, n * sizeof(double));
  bool ok = exec_runner_all_reduce(R, owner, n, EXEC_REDUCE_MIN, err);
  for (uint64_t i = 0; ok && i < n; i++)
    if (mine[i] != owner[i])
      value[i] = 0;
  g_free(mine);
  return ok && exec_runner_all_reduce(R, value, n, EXEC_REDUCE_SUM, err);
}

/* Rank 0's file: header, then the tensors as gather_op delivers them. */
struct save_file {
  struct piper_out out;
  GError *error; /* rank 0's first write error; the others keep reducing */
  bool bf16;
};

static void save_open(struct save_file *sf, const struct exec_hf_map *map, const char *dir) {
  size_t len = 0;
  char *head = header_json(map, sf->bf16, &len);
  char *path = g_build_filename(dir, "model.safetensors", NULL);
  if (g_mkdir_with_parents(dir, 0755) != 0)
    piper_runtime_error(&sf->error, "--save-hf %s: cannot create the directory", dir);
  else if (piper_out_open(&sf->out, path, &sf->error)) {
    unsigned char n[8];
    for (int k = 0; k < 8; k++)
      n[k] = (unsigned char)((uint64_t)len >> (8 * k));
    if (fwrite(n, 1, 8, sf->out.f) != 8 || fwrite(head, 1, len, sf->out.f) != len)
      piper_runtime_error(&sf->error, "%s: write failed", path);
  }
  g_free(path);
  g_free(head);
}

bool exec_runner_save_hf(struct runner *R, GError **err) {
  const struct exec_options *o = R->o;
  const struct model *m = R->s.xm->m;
  const struct exec_device *d = R->dev;
  struct save_file sf = {.bf16 = o->save_hf_dtype && strcmp(o->save_hf_dtype, "bf16") == 0};
  struct exec_hf_map map;
  if (!exec_hf_map_build(m, &map, err))
    return false;
  if (R->rank == 0)
    save_open(&sf, &map, o->save_hf_dir);
  size_t n = (size_t)(d->n_params ? d->n_params : 1);
  float *host = g_new(float, n), *store = g_new(float, d->n_store[EXEC_STORE_PARAMS] + 1);
  exec_backend_to_host(R->s.b, store, R->s.params, d->n_store[EXEC_STORE_PARAMS] * sizeof(float));
  exec_store_expand(d, EXEC_STORE_PARAMS, store, host, NAN);
  g_free(store);
  uint64_t most = 1;
  for (uint32_t op = 0; op < m->n_ops; op++)
    most = MAX(most, m->ops[op].param_count);
  double *value = g_new(double, most), *owner = g_new(double, most);
  bool ok = true;
  for (uint32_t op = 0; op < m->n_ops && ok; op++) {
    if (map.op_first[op] == map.op_first[op + 1] || map.t[map.op_first[op]].alias)
      continue;
    ok = gather_op(R, host, op, value, owner, err);
    for (uint64_t i = 0; ok && R->rank == 0 && i < m->ops[op].param_count; i++)
      if (owner[i] == NOBODY)
        ok = piper_runtime_error(err, "--save-hf: no rank holds element %llu of op %u (%s)",
                                 (unsigned long long)i, op, model_op_kind_name(m->ops[op].kind));
    for (uint32_t k = map.op_first[op]; ok && !sf.error && R->rank == 0 && k < map.op_first[op + 1]; k++)
      if (!write_tensor(sf.out.f, &map.t[k], value, sf.bf16))
        piper_runtime_error(&sf.error, "%s: write failed", sf.out.path);
  }
  if (R->rank == 0 && sf.out.f) {
    if (ok && !sf.error)
      piper_out_close(&sf.out, &sf.error);
    else
      piper_out_abandon(&sf.out);
  }
  if (ok && R->rank == 0 && !sf.error)
    write_config(m, o->save_hf_dir, sf.bf16, &sf.error);
  if (ok && sf.error) {
    g_propagate_error(err, sf.error);
    sf.error = NULL;
    ok = false;
  }
  g_clear_error(&sf.error);
  g_free(value);
  g_free(owner);
  g_free(host);
  exec_hf_map_clear(&map);
  return ok;
}
