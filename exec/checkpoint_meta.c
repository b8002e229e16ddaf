/* checkpoint_meta: the description a checkpoint carries of the run that wrote it, and the
 * comparison a resume makes. Everything that decides how a rank's state is laid out (the
 * segments it holds, their expert split, the gradient buckets with their ZeRO sharding and
 * device group) or what the next step computes (batch shape, seed, data, AdamW, the device's
 * program) is recorded field by field as JSON, so a refusal can name the difference; the file
 * around it is checkpoint.c's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <glib/gstdio.h>

#include "../base/json.h"
#include "exec-impl.h"

/* ---- what may change on purpose ---------------------------------------------------------- */

/* "lr" covers the learning-rate schedule too */
static const char *const allow_names[] = {"lr",   "weight_decay", "beta1",     "beta2", "eps",
                                          "data", "schedule",     "clip_grad", "layout", NULL};

bool exec_resume_allow_parse(const char *list, uint32_t *mask, GError **err) {
  *mask = 0;
  if (!list)
    return true;
  gchar **names = g_strsplit(list, ",", -1);
  bool ok = true;
  for (gchar **n = names; *n && ok; n++) {
    g_strstrip(*n);
    uint32_t bit = 0;
    for (uint32_t k = 0; allow_names[k]; k++)
      if (strcmp(*n, allow_names[k]) == 0)
        bit = 1u << k;
    if (!bit) {
      char *q = piper_quote(*n, strlen(*n), 40);
      ok = piper_input_error(err,
                             "--resume-allow-change: %s is not one of lr, weight_decay, beta1, "
                             "beta2, eps, data, schedule, clip_grad, layout",
                             q);
      g_free(q);
    }
    *mask |= bit;
  }
  g_strfreev(names);
  return ok;
}

/* ---- the description --------------------------------------------------------------------- */

void exec_checkpoint_meta_clear(struct exec_checkpoint_meta *m) {
  if (!m)
    return;
  g_free(m->model);
  g_free(m->data_kind);
  g_free(m->data_path);
  for (uint32_t k = 0; m->segments && k < m->n_segments; k++)
    g_free(m->segments[k].ops);
  g_free(m->lr_schedule);
  g_free(m->segments);
  for (uint32_t b = 0; b < m->n_buckets; b++) {
    g_free(m->buckets[b].group);
    g_free(m->buckets[b].segs);
  }
  g_free(m->buckets);
  memset(m, 0, sizeof *m);
}

static uint64_t hash_text(const char *text) {
  /* normalised, so a plan read back from disk hashes like the one compiled in-process */
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  char *norm = j ? cJSON_PrintUnformatted(j) : NULL;
  const char *t = norm ? norm : text ? text : "";
  uint64_t h = piper_fnv1a(PIPER_FNV1A_INIT, t, strlen(t));
  cJSON_free(norm);
  cJSON_Delete(j);
  return h;
}

/* What this device runs, in order: another schedule computes the same sums in another order. */
static uint64_t program_hash(const struct exec_device *d) {
  uint64_t h = PIPER_FNV1A_INIT;
  for (uint32_t i = 0; i < d->n_instrs; i++) {
    const struct exec_instr *x = &d->instrs[i];
    uint32_t rec[8] = {x->role,    x->stream, x->pass, (uint32_t)x->mb,
                       x->segment, x->edge,   x->peer, x->bucket};
    h = piper_fnv1a(h, rec, sizeof rec);
  }
  return h;
}

static void describe_buckets(const struct exec_device *d, struct exec_checkpoint_meta *m) {
  const struct plan *p = d->plan;
  m->n_buckets = d->n_buckets;
  m->buckets = g_new0(struct exec_checkpoint_bucket, d->n_buckets ? d->n_buckets : 1);
  for (uint32_t b = 0; b < d->n_buckets; b++) {
    const struct exec_bucket *bk = &d->buckets[b];
    struct exec_checkpoint_bucket *c = &m->buckets[b];
    c->zero = bk->sharded_params      ? 3
              : bk->sharded_grads     ? 2
              : bk->sharded_optimizer ? 1
                                      : 0;
    const struct ir_group *g = &p->groups[p->nodes[bk->node].group];
    c->n_group = g->count;
    c->group = g_memdup2(&p->device_pool[g->first], (g->count ? g->count : 1) * sizeof(uint32_t));
    c->n_segs = bk->n_segs;
    c->segs = g_memdup2(bk->segs, (bk->n_segs ? bk->n_segs : 1) * sizeof(uint32_t));
    c->rank = bk->rank;
    c->offset = bk->offset;
    c->count = bk->count;
    c->shard = bk->shard;
  }
}

static struct exec_checkpoint_segment describe_segment(const struct exec_device *d, uint32_t s) {
  const struct model_segment *sg = &d->xm->m->segments[s];
  struct exec_checkpoint_segment c = {s, d->param_offset[s], d->param_local[s], d->ep_size[s],
                                      d->ep_rank[s], sg->op_count, NULL};
  c.ops = g_new0(uint64_t, 3 * (sg->op_count ? sg->op_count : 1));
  for (uint32_t j = 0; j < sg->op_count; j++) {
    uint32_t op = sg->op_first + j;
    c.ops[3 * j] = op;
    c.ops[3 * j + 1] = d->op_offset[op];
    c.ops[3 * j + 2] =
        exec_tp_op_params(d->xm, &d->xm->m->ops[op], exec_segment_tp(d, s)) / d->ep_size[s];
  }
  return c;
}

/* The model as its Hugging Face keys describe it, without "piper" (training fields, the PP
 * split, the name): what two layouts of one model share. */
static uint64_t arch_hash(const struct model *m) {
  cJSON *j = model_to_json(m);
  cJSON_DeleteItemFromObjectCaseSensitive(j, "piper");
  char *t = cJSON_PrintUnformatted(j);
  uint64_t h = piper_fnv1a(PIPER_FNV1A_INIT, t, strlen(t));
  cJSON_free(t);
  cJSON_Delete(j);
  return h;
}

void exec_checkpoint_describe(const struct exec_options *o, const struct exec_device *d,
                              const struct exec_data *data, uint32_t step,
                              struct exec_checkpoint_meta *m) {
  memset(m, 0, sizeof *m);
  const struct exec_model *xm = d->xm;
  m->step = step;
  m->rank = d->device;
  m->n_ranks = d->plan->n_devices;
  m->model = g_strdup(xm->m->name);
  m->model_hash = hash_text(d->plan->model_json);
  m->n_params = d->n_params;
  for (uint32_t s = 0; s < xm->m->n_segments; s++)
    m->n_segments += d->holds[s];
  m->segments = g_new0(struct exec_checkpoint_segment, m->n_segments ? m->n_segments : 1);
  for (uint32_t s = 0, k = 0; s < xm->m->n_segments; s++)
    if (d->holds[s])
      m->segments[k++] = describe_segment(d, s);
  describe_buckets(d, m);
  m->microbatches = d->M;
  m->global_microbatches = d->M * d->dp_degree;
  m->microbatch_size = (uint32_t)xm->batch;
  m->seq_len = (uint32_t)xm->seq;
  m->dp = d->dp_degree;
  m->dp_rank = d->dp_rank;
  m->seed = o->seed;
  m->data_kind = g_strdup(data ? exec_data_kind(data) : "synthetic");
  m->data_path = g_strdup(o->data_path ? o->data_path : "");
  GStatBuf st;
  if (o->data_path && g_stat(o->data_path, &st) == 0)
    m->data_bytes = (uint64_t)st.st_size;
  m->lr = o->lr;
  m->beta1 = o->beta1;
  m->beta2 = o->beta2;
  m->eps = o->eps;
  m->weight_decay = o->weight_decay;
  struct exec_lr_schedule ls = o->lr_schedule;
  GError *ignored = NULL; /* the run refused a schedule that does not resolve */
  exec_lr_schedule_resolve(&ls, o->warmup + o->iters, &ignored);
  g_clear_error(&ignored);
  m->lr_schedule = exec_lr_schedule_text(&ls);
  m->clip_grad = o->clip_grad;
  m->program_hash = program_hash(d);
  m->arch_hash = arch_hash(xm->m);
  m->tp_degree = d->tp_degree;
  m->tp_rank = d->tp_rank;
}

static cJSON *u32_array(const uint32_t *v, uint32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t k = 0; k < n; k++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber(v[k]));
  return a;
}

static void add_hex(cJSON *o, const char *key, uint64_t v) {
  char text[24];
  g_snprintf(text, sizeof text, "%016llx", (unsigned long long)v);
  cJSON_AddStringToObject(o, key, text);
}

static cJSON *meta_segments_json(const struct exec_checkpoint_meta *m) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t k = 0; k < m->n_segments; k++) {
    const struct exec_checkpoint_segment *s = &m->segments[k];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "segment", s->segment);
    cJSON_AddNumberToObject(o, "offset", (double)s->offset);
    cJSON_AddNumberToObject(o, "count", (double)s->count);
    cJSON_AddNumberToObject(o, "ep_size", s->ep_size);
    cJSON_AddNumberToObject(o, "ep_rank", s->ep_rank);
    cJSON *ops = cJSON_AddArrayToObject(o, "ops");
    for (uint32_t k = 0; k < 3 * s->n_ops; k++)
      cJSON_AddItemToArray(ops, cJSON_CreateNumber((double)s->ops[k]));
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

static cJSON *meta_buckets_json(const struct exec_checkpoint_meta *m) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t b = 0; b < m->n_buckets; b++) {
    const struct exec_checkpoint_bucket *c = &m->buckets[b];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "zero", c->zero);
    cJSON_AddItemToObject(o, "group", u32_array(c->group, c->n_group));
    cJSON_AddItemToObject(o, "segments", u32_array(c->segs, c->n_segs));
    cJSON_AddNumberToObject(o, "rank", c->rank);
    cJSON_AddNumberToObject(o, "offset", (double)c->offset);
    cJSON_AddNumberToObject(o, "count", (double)c->count);
    cJSON_AddNumberToObject(o, "shard", (double)c->shard);
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

char *exec_checkpoint_meta_to_json(const struct exec_checkpoint_meta *m) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "step", m->step);
  cJSON_AddNumberToObject(o, "rank", m->rank);
  cJSON_AddNumberToObject(o, "n_ranks", m->n_ranks);
  cJSON_AddStringToObject(o, "model", m->model);
  add_hex(o, "model_hash", m->model_hash);
  cJSON_AddNumberToObject(o, "n_params", (double)m->n_params);
  cJSON_AddItemToObject(o, "segments", meta_segments_json(m));
  cJSON_AddItemToObject(o, "buckets", meta_buckets_json(m));
  cJSON_AddNumberToObject(o, "microbatches", m->microbatches);
  cJSON_AddNumberToObject(o, "global_microbatches", m->global_microbatches);
  cJSON_AddNumberToObject(o, "microbatch_size", m->microbatch_size);
  cJSON_AddNumberToObject(o, "seq_len", m->seq_len);
  cJSON_AddNumberToObject(o, "dp", m->dp);
  cJSON_AddNumberToObject(o, "dp_rank", m->dp_rank);
  add_hex(o, "seed", m->seed);
  cJSON_AddStringToObject(o, "data_kind", m->data_kind);
  cJSON_AddStringToObject(o, "data_path", m->data_path);
  cJSON_AddNumberToObject(o, "data_bytes", (double)m->data_bytes);
  cJSON_AddNumberToObject(o, "lr", m->lr);
  cJSON_AddNumberToObject(o, "beta1", m->beta1);
  cJSON_AddNumberToObject(o, "beta2", m->beta2);
  cJSON_AddNumberToObject(o, "eps", m->eps);
  cJSON_AddNumberToObject(o, "weight_decay", m->weight_decay);
  cJSON_AddStringToObject(o, "lr_schedule", m->lr_schedule);
  cJSON_AddNumberToObject(o, "clip_grad", m->clip_grad);
  add_hex(o, "program_hash", m->program_hash);
  add_hex(o, "arch_hash", m->arch_hash);
  cJSON_AddNumberToObject(o, "tp_degree", m->tp_degree);
  cJSON_AddNumberToObject(o, "tp_rank", m->tp_rank);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text; /* cJSON_free */
}

/* ---- reading the description back (input from disk: every field checked) ----------------- */

#define U32_MAX_JSON ((int64_t)UINT32_MAX)
#define COUNT_MAX_JSON ((int64_t)1 << 52) /* exact in a double */

static bool get_u32(const cJSON *o, const char *key, uint32_t *out, const char *ctx, GError **err) {
  int64_t v = 0;
  if (!json_get_int(o, key, true, 0, U32_MAX_JSON, &v, ctx, err))
    return false;
  *out = (uint32_t)v;
  return true;
}

static bool get_u64(const cJSON *o, const char *key, uint64_t *out, const char *ctx, GError **err) {
  int64_t v = 0;
  if (!json_get_int(o, key, true, 0, COUNT_MAX_JSON, &v, ctx, err))
    return false;
  *out = (uint64_t)v;
  return true;
}

static bool get_hex(const cJSON *o, const char *key, uint64_t *out, const char *ctx, GError **err) {
  const char *t = NULL;
  if (!json_get_string(o, key, true, &t, ctx, err))
    return false;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(t, &end, 16);
  if (strlen(t) != 16 || !g_ascii_isxdigit(t[0]) || errno || *end)
    return piper_input_error(err, "%s: \"%s\" must be 16 hexadecimal digits", ctx, key);
  *out = v;
  return true;
}

static bool get_float(const cJSON *o, const char *key, float *out, const char *ctx, GError **err) {
  double v = 0;
  if (!json_get_double(o, key, true, 0, 1e30, &v, ctx, err))
    return false;
  *out = (float)v;
  return true;
}

static bool get_text(const cJSON *o, const char *key, char **out, const char *ctx, GError **err) {
  const char *t = NULL;
  if (!json_get_string(o, key, true, &t, ctx, err))
    return false;
  *out = g_strdup(t);
  return true;
}

/* A JSON array of at most max whole numbers < 2^32, into a fresh array. */
static bool get_u32_array(const cJSON *o, const char *key, uint32_t max, uint32_t **out,
                          uint32_t *n, const char *ctx, GError **err) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
  int size = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
  if (size < 0 || (uint32_t)size > max)
    return piper_input_error(err, "%s: \"%s\" must be an array of at most %u numbers", ctx, key,
                             max);
  *n = (uint32_t)size;
  *out = g_new0(uint32_t, size ? size : 1);
  uint32_t k = 0;
  for (const cJSON *v = a->child; v; v = v->next) {
    int64_t x = 0;
    if (!json_as_int(v, 0, U32_MAX_JSON, &x, ctx, key, err))
      return false;
    (*out)[k++] = (uint32_t)x;
  }
  return true;
}

/* Bounds the arrays a description may ask for: a plan has far fewer segments and devices. */
#define META_MAX_ITEMS 65536

/* A segment's optional "ops": [op, offset, count] triples. */
static bool read_ops(const cJSON *v, struct exec_checkpoint_segment *s, const char *ctx,
                     GError **err) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(v, "ops");
  if (!a)
    return true;
  int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
  if (n < 0 || n % 3 || n > 3 * META_MAX_ITEMS)
    return piper_input_error(err, "%s: a segment's \"ops\" must be an array of triples", ctx);
  s->ops = g_new0(uint64_t, n ? n : 1);
  s->n_ops = (uint32_t)n / 3;
  uint32_t k = 0;
  for (const cJSON *x = a->child; x; x = x->next) {
    int64_t y = 0;
    if (!json_as_int(x, 0, COUNT_MAX_JSON, &y, ctx, "ops", err))
      return false;
    s->ops[k++] = (uint64_t)y;
  }
  return true;
}

static bool read_segments(const cJSON *root, struct exec_checkpoint_meta *m, const char *ctx,
                          GError **err) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "segments");
  int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
  if (n < 0 || n > META_MAX_ITEMS)
    return piper_input_error(err, "%s: \"segments\" must be an array", ctx);
  m->segments = g_new0(struct exec_checkpoint_segment, n ? n : 1);
  for (const cJSON *v = a->child; v; v = v->next) {
    struct exec_checkpoint_segment *s = &m->segments[m->n_segments];
    if (!cJSON_IsObject(v))
      return piper_input_error(err, "%s: \"segments\" must hold objects", ctx);
    if (!get_u32(v, "segment", &s->segment, ctx, err) ||
        !get_u64(v, "offset", &s->offset, ctx, err) || !get_u64(v, "count", &s->count, ctx, err) ||
        !get_u32(v, "ep_size", &s->ep_size, ctx, err) ||
        !get_u32(v, "ep_rank", &s->ep_rank, ctx, err) || !read_ops(v, s, ctx, err))
      return false;
    m->n_segments++;
  }
  return true;
}

static bool read_bucket(const cJSON *v, struct exec_checkpoint_bucket *c, const char *ctx,
                        GError **err) {
  if (!cJSON_IsObject(v))
    return piper_input_error(err, "%s: \"buckets\" must hold objects", ctx);
  if (!get_u32(v, "zero", &c->zero, ctx, err) ||
      !get_u32_array(v, "group", META_MAX_ITEMS, &c->group, &c->n_group, ctx, err) ||
      !get_u32_array(v, "segments", META_MAX_ITEMS, &c->segs, &c->n_segs, ctx, err) ||
      !get_u32(v, "rank", &c->rank, ctx, err) || !get_u64(v, "offset", &c->offset, ctx, err) ||
      !get_u64(v, "count", &c->count, ctx, err) || !get_u64(v, "shard", &c->shard, ctx, err))
    return false;
  if (c->zero > 3)
    return piper_input_error(err, "%s: a bucket's \"zero\" must be 0, 1, 2 or 3", ctx);
  return true;
}

static bool read_buckets(const cJSON *root, struct exec_checkpoint_meta *m, const char *ctx,
                         GError **err) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "buckets");
  int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
  if (n < 0 || n > META_MAX_ITEMS)
    return piper_input_error(err, "%s: \"buckets\" must be an array", ctx);
  m->buckets = g_new0(struct exec_checkpoint_bucket, n ? n : 1);
  for (const cJSON *v = a->child; v; v = v->next)
    /* counted first, so clearing frees a half-read bucket */
    if (!read_bucket(v, &m->buckets[m->n_buckets++], ctx, err))
      return false;
  return true;
}

/* What later versions added: absent in older checkpoints, which trained without them. */
static bool read_training(const cJSON *o, struct exec_checkpoint_meta *m, const char *ctx,
                          GError **err) {
  const char *text = "constant";
  double clip = 0;
  if (!json_get_string(o, "lr_schedule", false, &text, ctx, err) ||
      !json_get_double(o, "clip_grad", false, 0, 1e30, &clip, ctx, err))
    return false;
  m->lr_schedule = g_strdup(text ? text : "constant");
  m->clip_grad = (float)clip;
  return true;
}

static bool read_scalars(const cJSON *o, struct exec_checkpoint_meta *m, const char *ctx,
                         GError **err) {
  return get_u32(o, "step", &m->step, ctx, err) && get_u32(o, "rank", &m->rank, ctx, err) &&
         get_u32(o, "n_ranks", &m->n_ranks, ctx, err) &&
         get_text(o, "model", &m->model, ctx, err) &&
         get_hex(o, "model_hash", &m->model_hash, ctx, err) &&
         get_u64(o, "n_params", &m->n_params, ctx, err) &&
         get_u32(o, "microbatches", &m->microbatches, ctx, err) &&
         get_u32(o, "global_microbatches", &m->global_microbatches, ctx, err) &&
         get_u32(o, "microbatch_size", &m->microbatch_size, ctx, err) &&
         get_u32(o, "seq_len", &m->seq_len, ctx, err) && get_u32(o, "dp", &m->dp, ctx, err) &&
         get_u32(o, "dp_rank", &m->dp_rank, ctx, err) && get_hex(o, "seed", &m->seed, ctx, err) &&
         get_text(o, "data_kind", &m->data_kind, ctx, err) &&
         get_text(o, "data_path", &m->data_path, ctx, err) &&
         get_u64(o, "data_bytes", &m->data_bytes, ctx, err) &&
         get_float(o, "lr", &m->lr, ctx, err) && get_float(o, "beta1", &m->beta1, ctx, err) &&
         get_float(o, "beta2", &m->beta2, ctx, err) && get_float(o, "eps", &m->eps, ctx, err) &&
         get_float(o, "weight_decay", &m->weight_decay, ctx, err) &&
         get_hex(o, "program_hash", &m->program_hash, ctx, err) && read_training(o, m, ctx, err);
}

bool exec_checkpoint_meta_from_json(const char *path, const char *text, size_t len,
                                    struct exec_checkpoint_meta *m, GError **err) {
  char *ctx = g_strdup_printf("%s: description", path);
  cJSON *root = json_parse_buffer(ctx, text, len, err);
  /* a key twice would be read as its first value: refused, as in every other input file */
  bool ok = root != NULL && json_refuse_duplicate_keys(root, ctx, err);
  if (ok && !cJSON_IsObject(root))
    ok = piper_input_error(err, "%s: must be a JSON object", ctx);
  ok = ok && read_scalars(root, m, ctx, err) && read_segments(root, m, ctx, err) &&
       read_buckets(root, m, ctx, err);
  /* written since checkpoints reshard; older files resume on their own layout only */
  if (ok && cJSON_GetObjectItemCaseSensitive(root, "arch_hash"))
    ok = get_hex(root, "arch_hash", &m->arch_hash, ctx, err) &&
         get_u32(root, "tp_degree", &m->tp_degree, ctx, err) &&
         get_u32(root, "tp_rank", &m->tp_rank, ctx, err);
  cJSON_Delete(root);
  g_free(ctx);
  return ok;
}

/* ---- comparing a checkpoint with this run ------------------------------------------------ */

static const char *zero_name(uint32_t zero) {
  return zero == 3   ? "shard_params (ZeRO-3)"
         : zero == 2 ? "shard_grads (ZeRO-2)"
         : zero == 1 ? "shard_optimizer (ZeRO-1)"
                     : "no sharding";
}

static void append_list(GString *s, const uint32_t *v, uint32_t n) {
  g_string_append_c(s, '[');
  for (uint32_t k = 0; k < n; k++)
    g_string_append_printf(s, "%s%u", k ? "," : "", v[k]);
  g_string_append_c(s, ']');
}

/* "shard_grads (ZeRO-2) on device group [0,2] for segments [1,2]", or "none". */
static char *bucket_text(const struct exec_checkpoint_meta *m, uint32_t b) {
  if (b >= m->n_buckets)
    return g_strdup("none");
  const struct exec_checkpoint_bucket *c = &m->buckets[b];
  GString *s = g_string_new(zero_name(c->zero));
  g_string_append(s, " on device group ");
  append_list(s, c->group, c->n_group);
  g_string_append(s, " for segments ");
  append_list(s, c->segs, c->n_segs);
  return g_string_free(s, FALSE);
}

static bool same_list(const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb) {
  return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static bool same_bucket(const struct exec_checkpoint_bucket *a,
                        const struct exec_checkpoint_bucket *b) {
  return a->zero == b->zero && same_list(a->group, a->n_group, b->group, b->n_group) &&
         same_list(a->segs, a->n_segs, b->segs, b->n_segs);
}

static bool compare_sharding(const char *path, const struct exec_checkpoint_meta *was,
                             const struct exec_checkpoint_meta *now, GError **err) {
  uint32_t n = was->n_buckets > now->n_buckets ? was->n_buckets : now->n_buckets;
  for (uint32_t b = 0; b < n; b++) {
    if (b < was->n_buckets && b < now->n_buckets) {
      const struct exec_checkpoint_bucket *x = &was->buckets[b], *y = &now->buckets[b];
      if (same_bucket(x, y)) {
        if (x->rank != y->rank || x->offset != y->offset || x->count != y->count ||
            x->shard != y->shard)
          return piper_input_error(
              err,
              "resume: %s holds shard %u (offset %llu, %llu parameters, shards of %llu) of its "
              "gradient bucket %u, this plan shard %u (offset %llu, %llu, shards of %llu)",
              path, x->rank, (unsigned long long)x->offset, (unsigned long long)x->count,
              (unsigned long long)x->shard, b, y->rank, (unsigned long long)y->offset,
              (unsigned long long)y->count, (unsigned long long)y->shard);
        continue;
      }
    }
    char *a = bucket_text(was, b), *c = bucket_text(now, b);
    piper_input_error(err, "resume: %s was written with %s, this plan has %s", path, a, c);
    g_free(a);
    g_free(c);
    return false;
  }
  return true;
}

static void append_held(GString *s, const struct exec_checkpoint_meta *m) {
  g_string_append_c(s, '[');
  for (uint32_t k = 0; k < m->n_segments; k++)
    g_string_append_printf(s, "%s%u", k ? "," : "", m->segments[k].segment);
  g_string_append_c(s, ']');
}

static bool compare_placement(const char *path, const struct exec_checkpoint_meta *was,
                              const struct exec_checkpoint_meta *now, GError **err) {
  bool same_set = was->n_segments == now->n_segments;
  for (uint32_t k = 0; same_set && k < was->n_segments; k++)
    same_set = was->segments[k].segment == now->segments[k].segment;
  if (!same_set) {
    GString *a = g_string_new(NULL), *b = g_string_new(NULL);
    append_held(a, was);
    append_held(b, now);
    piper_input_error(err,
                      "resume: %s was written for a device holding segments %s, this plan "
                      "places segments %s on device %u",
                      path, a->str, b->str, now->rank);
    g_string_free(a, TRUE);
    g_string_free(b, TRUE);
    return false;
  }
  for (uint32_t k = 0; k < was->n_segments; k++) {
    const struct exec_checkpoint_segment *x = &was->segments[k], *y = &now->segments[k];
    if (x->ep_size != y->ep_size || x->ep_rank != y->ep_rank)
      return piper_input_error(err,
                               "resume: %s was written with segment %u's experts split over %u "
                               "devices (part %u here), this plan splits them over %u (part %u)",
                               path, x->segment, x->ep_size, x->ep_rank, y->ep_size, y->ep_rank);
    if (x->offset != y->offset || x->count != y->count)
      return piper_input_error(err,
                               "resume: %s holds segment %u at offset %llu (%llu parameters), "
                               "this plan lays it out at offset %llu (%llu parameters)",
                               path, x->segment, (unsigned long long)x->offset,
                               (unsigned long long)x->count, (unsigned long long)y->offset,
                               (unsigned long long)y->count);
  }
  return true;
}

/* The whole numbers that must match, in the order a message is most useful. */
static bool compare_counts(const char *path, const struct exec_checkpoint_meta *was,
                           const struct exec_checkpoint_meta *now, GError **err) {
  struct {
    const char *what;
    uint32_t was, now;
  } rows[] = {
      {"micro-batches per step on this device", was->microbatches, now->microbatches},
      {"micro-batches per step in all", was->global_microbatches, now->global_microbatches},
      {"micro-batch size", was->microbatch_size, now->microbatch_size},
      {"sequence length", was->seq_len, now->seq_len},
      {"data-parallel degree", was->dp, now->dp},
      {"data-parallel rank", was->dp_rank, now->dp_rank},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(rows); k++)
    if (rows[k].was != rows[k].now)
      return piper_input_error(err, "resume: %s was written with %s %u, this plan has %u", path,
                               rows[k].what, rows[k].was, rows[k].now);
  return true;
}

/* What this run may change with --resume-allow-change: a difference is refused, or accepted
 * and said in notes. */
bool exec_checkpoint_compare_allowed(const char *path, const struct exec_checkpoint_meta *was,
                            const struct exec_checkpoint_meta *now, uint32_t allow, GString *notes,
                            GError **err) {
  const float fw[5] = {was->lr, was->weight_decay, was->beta1, was->beta2, was->eps};
  const float fn[5] = {now->lr, now->weight_decay, now->beta1, now->beta2, now->eps};
  for (uint32_t k = 0; k < 5; k++) {
    if (memcmp(&fw[k], &fn[k], sizeof(float)) == 0)
      continue;
    if (!(allow & (1u << k)))
      return piper_input_error(err,
                               "resume: %s was written with %s %g, now %g (--resume-allow-change "
                               "%s to accept)",
                               path, allow_names[k], (double)fw[k], (double)fn[k], allow_names[k]);
    g_string_append_printf(notes, "%s%s %g -> %g", notes->len ? ", " : "", allow_names[k],
                           (double)fw[k], (double)fn[k]);
  }
  if (strcmp(was->lr_schedule, now->lr_schedule) != 0) {
    if (!(allow & EXEC_RESUME_ALLOW_LR))
      return piper_input_error(err,
                               "resume: %s was written with the learning-rate schedule \"%s\", "
                               "now \"%s\" (--resume-allow-change lr to accept)",
                               path, was->lr_schedule, now->lr_schedule);
    g_string_append_printf(notes, "%slr schedule \"%s\" -> \"%s\"", notes->len ? ", " : "",
                           was->lr_schedule, now->lr_schedule);
  }
  if (memcmp(&was->clip_grad, &now->clip_grad, sizeof(float)) != 0) {
    if (!(allow & EXEC_RESUME_ALLOW_CLIP_GRAD))
      return piper_input_error(err,
                               "resume: %s was written with --clip-grad %g, now %g "
                               "(--resume-allow-change clip_grad to accept)",
                               path, (double)was->clip_grad, (double)now->clip_grad);
    g_string_append_printf(notes, "%sclip_grad %g -> %g", notes->len ? ", " : "",
                           (double)was->clip_grad, (double)now->clip_grad);
  }
  if (strcmp(was->data_kind, now->data_kind) != 0 || strcmp(was->data_path, now->data_path) != 0 ||
      was->data_bytes != now->data_bytes) {
    char *a = g_strdup_printf("%s %s (%llu bytes)", was->data_kind,
                              *was->data_path ? was->data_path : "stream",
                              (unsigned long long)was->data_bytes);
    char *b = g_strdup_printf("%s %s (%llu bytes)", now->data_kind,
                              *now->data_path ? now->data_path : "stream",
                              (unsigned long long)now->data_bytes);
    bool ok = (allow & EXEC_RESUME_ALLOW_DATA) != 0;
    if (ok)
      g_string_append_printf(notes, "%sdata %s -> %s", notes->len ? ", " : "", a, b);
    else
      piper_input_error(err,
                        "resume: %s was written with data %s, now %s (--resume-allow-change data "
                        "to accept)",
                        path, a, b);
    g_free(a);
    g_free(b);
    if (!ok)
      return false;
  }
  if (was->program_hash != now->program_hash) {
    if (!(allow & EXEC_RESUME_ALLOW_SCHEDULE))
      return piper_input_error(err,
                               "resume: %s was written by another schedule or instruction order "
                               "on this device: the state fits, the sums would round otherwise "
                               "(--resume-allow-change schedule to accept)",
                               path);
    g_string_append_printf(notes, "%sschedule changed", notes->len ? ", " : "");
  }
  return true;
}

/* Another layout of the same model and batch: resumable, resharded, when the user says so. */
static bool layout_refused(GError **err) {
  if (err && *err) {
    char *m = g_strdup_printf("%s (--resume-allow-change layout to reshard)", (*err)->message);
    g_free((*err)->message);
    (*err)->message = m;
  }
  return false;
}

bool exec_checkpoint_compare(const char *path, const struct exec_checkpoint_meta *was,
                             const struct exec_checkpoint_meta *now, uint32_t allow, GString *notes,
                             GError **err) {
  /* what a resharding resume keeps: the architecture and the global batch */
  bool same_arch = was->arch_hash && was->arch_hash == now->arch_hash &&
                   was->global_microbatches * was->microbatch_size ==
                       now->global_microbatches * now->microbatch_size &&
                   was->seq_len == now->seq_len;
  if (was->rank != now->rank || was->n_ranks != now->n_ranks) {
    piper_input_error(err, "resume: %s was written by rank %u of %u, read by rank %u of %u", path,
                      was->rank, was->n_ranks, now->rank, now->n_ranks);
    return same_arch ? layout_refused(err) : false;
  }
  if (was->model_hash != now->model_hash) {
    piper_input_error(err,
                      "resume: %s was written for a different model or parameter layout (model "
                      "\"%s\" %016llx, this plan's \"%s\" %016llx)",
                      path, was->model, (unsigned long long)was->model_hash, now->model,
                      (unsigned long long)now->model_hash);
    return same_arch ? layout_refused(err) : false;
  }
  if (!compare_counts(path, was, now, err) || !compare_placement(path, was, now, err) ||
      !compare_sharding(path, was, now, err))
    return same_arch ? layout_refused(err) : false;
  if (was->n_params != now->n_params)
    return piper_input_error(err,
                             "resume: %s was written for a different model or parameter layout "
                             "(%llu parameters here, this plan %llu)",
                             path, (unsigned long long)was->n_params,
                             (unsigned long long)now->n_params);
  if (was->seed != now->seed)
    return piper_input_error(err,
                             "resume: %s was written with --seed %llu, this run has --seed %llu",
                             path, (unsigned long long)was->seed, (unsigned long long)now->seed);
  return exec_checkpoint_compare_allowed(path, was, now, allow, notes, err);
}
