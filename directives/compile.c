/* compile: model + directive program (+ schedule) -> IR -> per-device plans. */
#include <errno.h>
#include <string.h>

#include "../base/json.h"
#include "compile.h"
#include "layout.h"

struct compile_options compile_options_default(void) {
  struct compile_options o;
  memset(&o, 0, sizeof o);
  o.schedule.family = SCHED_CUSTOM;
  o.lower = true;
  return o;
}

bool compile_args_to_options(const struct compile_args *a, struct compile_options *o,
                             GError **err) {
  *o = compile_options_default();
  o->model_path = a->model;
  o->directives_path = a->directives;
  o->layout = a->layout;
  o->pp_regions = (int)a->pp_regions;
  o->have_schedule = a->schedule != NULL;
  o->schedule.ranks = a->ranks;
  o->schedule.mbs = a->mbs;
  o->schedule.keep_order = a->keep_order;
  o->schedule.microbatch_group = a->microbatch_group;
  o->import_csv = a->import_csv;
  o->micro_batch_size = a->micro_batch_size;
  o->seq_len = a->seq_length;
  o->global_batch_size = a->global_batch_size;
  o->fp8 = a->fp8;
  if (a->fp8 && strcmp(a->fp8, "none") != 0 && strcmp(a->fp8, "tensorwise") != 0 &&
      strcmp(a->fp8, "blockwise") != 0)
    return piper_input_error(err, "--fp8: \"%s\" is not an FP8 recipe (tensorwise, blockwise or "
                                  "none)",
                             a->fp8);
  if (a->schedule && !sched_family_parse(a->schedule, &o->schedule.family))
    return piper_input_error(err,
                     "--schedule: unknown schedule \"%s\" (gpipe, 1f1b, interleaved_1f1b, "
                     "zerobubble, zbv, dualpipe, dualpipev, interleaved_zerobubble, custom)",
                     a->schedule);
  if (a->microbatch_group && (!a->schedule || o->schedule.family != SCHED_INTERLEAVED_1F1B))
    return piper_input_error(err, "--microbatch-group applies to --schedule interleaved_1f1b only");
  return true;
}

void compile_result_free(struct compile_result *r) {
  if (!r)
    return;
  plan_free(r->plan);
  ir_graph_free(r->graph);
  dir_program_free(r->program);
  model_free(r->model);
  g_free(r->program_file_name);
  memset(r, 0, sizeof *r);
}

/* Micro-batches of p's "MB" split (the dimension an imported schedule orders), or fallback when
 * the program has none. */
static uint32_t program_microbatches(const struct dir_program *p, uint32_t fallback) {
  for (uint32_t i = 0; i < p->n; i++)
    if (p->d[i].op == DIR_SPLIT && strcmp(p->d[i].dim_name, "MB") == 0)
      return (uint32_t)p->d[i].num_microbatches;
  return fallback;
}

/* Replaces the program's order directives by those of a PyTorch-style schedule CSV, which must
 * schedule every action of the pipeline. */
static bool import_csv(struct dir_program *p, uint32_t n_stages, const char *path, GString *notes,
                       GError **err) {
  size_t len = 0;
  char *text = piper_read_file(path, JSON_MAX_FILE_BYTES, &len, err);
  if (!text)
    return false;
  struct sched_program *s = sched_read_csv(path, text, len, err);
  g_free(text);
  if (!s)
    return false;
  uint32_t n_ranks = 1;
  uint32_t M = program_microbatches(p, s->n_microbatches);
  int32_t *mb_rank = sched_microbatch_ranks(p, n_stages, M, &n_ranks, err);
  bool ok = mb_rank && sched_check_complete(s, path, mb_rank, n_stages, n_ranks, M, err);
  g_free(mb_rank);
  if (ok && s->note && notes)
    g_string_append_printf(notes, "%s\n", s->note);
  if (ok) {
    dir_program_remove_op(p, DIR_ORDER);
    ok = sched_to_directives(s, "MB", p, err);
  }
  sched_program_free(s);
  return ok;
}

/* Sets key of the model's "piper" object to value (the command line's training fields). */
static void replace_training_field(cJSON *piper, const char *key, int64_t value) {
  cJSON_DeleteItemFromObjectCaseSensitive(piper, key);
  cJSON_AddNumberToObject(piper, key, (double)value);
}

/* The model file with its "piper" object's micro_batch_size and seq_len replaced by o's (where
 * > 0: the file keeps the defaults), its fp8 by o's (where given) and its PP split replaced by pp_layers[n_layers]
 * (n_layers > 0). The loader checks the values as it checks the file's. */
static struct model *load_model_with(const struct compile_options *o, int pp_regions,
                                     const int32_t *pp_layers, uint32_t n_layers, GError **err) {
  cJSON *root = json_parse_file_strict(o->model_path, err);
  if (!root)
    return NULL;
  cJSON *piper = cJSON_GetObjectItemCaseSensitive(root, "piper");
  if (!cJSON_IsObject(piper) &&
      (o->micro_batch_size > 0 || o->seq_len > 0 || n_layers > 0 || o->fp8))
    piper = cJSON_AddObjectToObject(root, "piper");
  if (o->micro_batch_size > 0)
    replace_training_field(piper, "micro_batch_size", o->micro_batch_size);
  if (o->fp8) { /* the loader checks it as the file's; the flag is named where it is at fault */
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(piper, "dtype");
    if (strcmp(o->fp8, "none") != 0 &&
        !(cJSON_IsString(dtype) && strcmp(dtype->valuestring, "bf16") == 0)) {
      piper_input_error(err, "--fp8 %s: %s is not a bf16 model (\"piper.dtype\"; the FP8 recipes "
                             "keep bf16 outside the GEMMs)",
                        o->fp8, o->model_path);
      cJSON_Delete(root);
      return NULL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(piper, "fp8");
    cJSON_AddStringToObject(piper, "fp8", o->fp8);
  }
  if (o->seq_len > 0)
    replace_training_field(piper, "seq_len", o->seq_len);
  if (n_layers > 0) {
    cJSON_DeleteItemFromObjectCaseSensitive(piper, "pp_regions");
    cJSON_DeleteItemFromObjectCaseSensitive(piper, "pp_layers");
    cJSON *a = cJSON_AddArrayToObject(piper, "pp_layers");
    for (uint32_t s = 0; s < n_layers; s++)
      cJSON_AddItemToArray(a, cJSON_CreateNumber(pp_layers[s]));
    pp_regions = 0;
  }
  struct model *m = model_load_json(o->model_path, root, pp_regions, err);
  cJSON_Delete(root);
  return m;
}

/* The model split into the layout's stages: equally, or as its uneven-stage keys say (the
 * counts need the model's layer count, so the model is read again with them). */
static struct model *load_model_for_layout(const struct compile_options *o, const struct layout *l,
                                           int pp_regions, GError **err) {
  struct model *m = load_model_with(o, pp_regions, NULL, 0, err);
  if (!m || !l)
    return m;
  uint32_t stages = layout_stages(l);
  /* Experts sharded over a model that has none, or stages that do not divide the layers with
   * nothing saying how to split them: refused, as Megatron refuses them, not run as something
   * else (ep ignored, the first stages one layer longer). */
  g_autofree char *fault = NULL;
  if (l->ep > 1 && m->num_experts <= 0)
    fault = g_strdup_printf("--layout \"%s\": ep=%u, but %s has no experts (a dense model): drop "
                            "ep", o->layout, l->ep, m->name);
  else if (!layout_has_stage_layers(l) && m->num_layers % stages != 0)
    fault = g_strdup_printf("--layout \"%s\": %lld layers do not divide over %u stages; say how "
                            "to split them (first-stage-layers=N, last-stage-layers=N, "
                            "stage-layers=A+B+..., account-for-embedding, account-for-loss)",
                            o->layout, (long long)m->num_layers, stages);
  if (fault) {
    piper_input_error(err, "%s", fault);
    model_free(m);
    return NULL;
  }
  if (!layout_has_stage_layers(l))
    return m;
  g_autofree int32_t *layers = g_new(int32_t, stages);
  bool ok = layout_stage_layers(l, o->layout, m->num_layers, layers, err);
  model_free(m);
  return ok ? load_model_with(o, 0, layers, stages, err) : NULL;
}

/* The model, split into the layout's stages when the program comes from --layout, and the
 * program. */
static bool load_model_and_program(const struct compile_options *o, struct compile_result *r,
                                   GError **err) {
  int pp_regions = o->pp_regions;
  struct layout l;
  if (o->layout) {
    if (!layout_parse(o->layout, &l, err))
      return false;
    if (pp_regions > 0 && (uint32_t)pp_regions != layout_stages(&l))
      return piper_input_error(err, "--pp-regions %d disagrees with --layout \"%s\" (%u stages)",
                               pp_regions, o->layout, layout_stages(&l));
    pp_regions = (int)layout_stages(&l);
  }
  r->model = load_model_for_layout(o, o->layout ? &l : NULL, pp_regions, err);
  if (!r->model)
    return false;
  if (o->layout) {
    g_autofree char *name = g_strdup_printf("--layout \"%s\"", o->layout);
    /* expert sharding only where the model has experts */
    uint32_t stages = layout_stages(&l);
    g_autofree bool *dense = g_new(bool, stages + 1);
    for (uint32_t st = 0; st < stages; st++)
      dense[st] = true;
    for (uint32_t k = 0; k < r->model->n_segments; k++) {
      const struct model_segment *seg = &r->model->segments[k];
      int32_t st = seg->tags[MODEL_TAG_PP];
      if (seg->expert && st >= 0 && (uint32_t)st < stages)
        dense[st] = false;
    }
    l.stage_without_experts = dense;
    r->program = layout_program(&l, name, err);
  } else {
    r->program = dir_program_load_file(o->directives_path, err);
  }
  return r->program != NULL;
}

/* The layered recompute directive (a "method") whose filter covers stage s, if any; fails
 * when its filter names more than PP (chunks are cut per stage before any rewrite runs) or
 * when two cover one stage. */
static bool stage_chunking(const struct dir_program *p, int32_t s, const struct dir_directive **out,
                           GError **err) {
  *out = NULL;
  for (uint32_t d = 0; d < p->n; d++) {
    const struct dir_directive *dd = &p->d[d];
    if (dd->op != DIR_RECOMPUTE || dd->method == DIR_RECOMPUTE_SEGMENT)
      continue;
    bool covers = true;
    for (uint32_t k = 0; k < dd->filter.n_keys; k++) {
      const struct dir_filter_key *fk = &dd->filter.keys[k];
      if (strcmp(fk->name, "PP") != 0)
        return piper_input_error(err,
                                 "%s: directive %u (recompute): with \"method\" the filter may "
                                 "name PP only (its chunks are cut per stage), not \"%s\"",
                                 p->name, dd->index, fk->name);
      covers = covers && (fk->value == IR_FILTER_ANY || fk->value == s);
    }
    if (!covers)
      continue;
    if (*out)
      return piper_input_error(err,
                               "%s: directives %u and %u (recompute) both cut stage %d's layers "
                               "into chunks: give each stage one method",
                               p->name, (*out)->index, dd->index, s);
    *out = dd;
  }
  return true;
}

/* Adds to tags the RC chunks of one stage's layers [first, first + n): uniform, every run of
 * num_layers layers; block, each of the first num_layers layers (the rest stay one segment,
 * stored). Megatron's --recompute-method semantics, per pipeline stage. */
static void add_stage_chunks(cJSON *tags, const struct dir_directive *dd, int64_t first, int64_t n) {
  int64_t step = dd->method == DIR_RECOMPUTE_UNIFORM ? dd->num_layers : 1;
  int64_t end = dd->method == DIR_RECOMPUTE_UNIFORM ? first + n
                                                     : first + MIN(n, (int64_t)dd->num_layers);
  for (int64_t c = first; c < end; c += step) {
    cJSON *t = cJSON_CreateObject(), *range = cJSON_AddArrayToObject(t, "layers");
    cJSON_AddStringToObject(t, "tag", DIR_RECOMPUTE_TAG);
    cJSON_AddItemToArray(range, cJSON_CreateNumber((double)c));
    cJSON_AddItemToArray(range, cJSON_CreateNumber((double)(MIN(c + step, end) - 1)));
    cJSON_AddItemToArray(tags, t);
  }
}

/* Under a layered recompute directive the model is loaded again with its chunks tagged RC, so
 * each chunk is a segment of its own (its F keeps its input, its R reruns it alone). Models
 * without one are left as they are, so their plans stay byte-identical. */
static bool chunk_model(struct compile_result *r, GError **err) {
  const struct dir_program *p = r->program;
  bool any = false;
  for (uint32_t d = 0; d < p->n; d++)
    any = any || (p->d[d].op == DIR_RECOMPUTE && p->d[d].method != DIR_RECOMPUTE_SEGMENT);
  if (!any)
    return true;
  struct model *m = r->model;
  if (model_tag_index(m, DIR_RECOMPUTE_TAG) >= 0)
    return piper_input_error(err, "%s: the model's user tag \"%s\" is the one recompute's "
                             "\"method\" cuts its chunks with: rename it", m->name,
                             DIR_RECOMPUTE_TAG);
  cJSON *root = model_to_json(m), *piper = cJSON_GetObjectItemCaseSensitive(root, "piper");
  cJSON *tags = cJSON_GetObjectItemCaseSensitive(piper, "tags");
  if (!tags)
    tags = cJSON_AddArrayToObject(piper, "tags");
  int64_t first = 0;
  bool ok = true;
  for (int32_t s = 0; ok && s < m->pp_regions; s++) {
    const struct dir_directive *dd = NULL;
    ok = stage_chunking(p, s, &dd, err);
    if (ok && dd)
      add_stage_chunks(tags, dd, first, m->pp_layers[s]);
    first += m->pp_layers[s];
  }
  struct model *chunked = ok ? model_load_json(m->name, root, 0, err) : NULL;
  cJSON_Delete(root);
  if (!chunked)
    return false;
  model_free(r->model);
  r->model = chunked;
  return true;
}

/* The program's data-parallel degree: the most devices one place directive names, over the
 * tensor-parallel degree (a replica is tp devices, tensor parallel innermost). */
static uint32_t program_data_parallel(const struct dir_program *p) {
  uint32_t devices = 1, tp = 1;
  for (uint32_t i = 0; i < p->n; i++) {
    if (p->d[i].op == DIR_PLACE && p->d[i].n_devices > devices)
      devices = p->d[i].n_devices;
    if (p->d[i].op == DIR_TENSOR_PARALLEL && p->d[i].tp_degree > tp)
      tp = p->d[i].tp_degree;
  }
  /* context parallelism splits each sequence, not the batch (Megatron's global batch counts
   * data-parallel replicas only) */
  uint32_t cp = dir_program_context_parallel(p) > 1 ? dir_program_context_parallel(p) : 1;
  return devices / (tp * cp) ? devices / (tp * cp) : 1;
}

/* --global-batch-size as Megatron reads it: global = micro-batches x micro-batch size x dp, so
 * the micro-batch count is global / (micro-batch size x dp), into sched->mbs. Refused where that
 * is not whole, or where --num-micro-batches gives another count. */
static bool derive_microbatches(const struct compile_options *o, const struct compile_result *r,
                                struct sched_options *sched, GError **err) {
  uint64_t micro = (uint64_t)r->model->micro_batch_size, dp = program_data_parallel(r->program);
  uint64_t per_microbatch = micro * dp, global = o->global_batch_size;
  if (global % per_microbatch != 0 || global / per_microbatch > DIR_MAX_MICROBATCHES)
    return piper_input_error(err,
                             "--global-batch-size %llu: not a whole number of micro-batches of "
                             "%llu sequences (micro-batch size %llu x data-parallel %llu), at "
                             "most %u of them",
                             (unsigned long long)global, (unsigned long long)per_microbatch,
                             (unsigned long long)micro, (unsigned long long)dp,
                             (unsigned)DIR_MAX_MICROBATCHES);
  uint32_t m = (uint32_t)(global / per_microbatch);
  if (sched->mbs > 0 && sched->mbs != m)
    return piper_input_error(err,
                             "--num-micro-batches %u disagrees with --global-batch-size %llu = %u "
                             "micro-batches x micro-batch size %llu x data-parallel %llu: give "
                             "one of them",
                             sched->mbs, (unsigned long long)global, m, (unsigned long long)micro,
                             (unsigned long long)dp);
  sched->mbs = m;
  return true;
}

/* Under a context_parallel directive the model is loaded again with piper.context_parallel, so
 * that its ops are one CP rank's share of each sequence (models/model.h); the sequence must cut
 * into 2 x degree equal chunks. Models without one are left as they are. */
static bool context_parallel_model(struct compile_result *r, GError **err) {
  const struct dir_program *p = r->program;
  uint32_t cp = dir_program_context_parallel(p);
  struct model *m = r->model;
  if (cp <= 1 || m->context_parallel == (int64_t)cp)
    return true;
  uint32_t index = 0;
  for (uint32_t d = 0; d < p->n; d++)
    if (p->d[d].op == DIR_CONTEXT_PARALLEL)
      index = p->d[d].index;
  if (m->seq_len % (2 * (int64_t)cp) != 0)
    return piper_input_error(err, "%s: directive %u (context_parallel): \"degree\" %u cuts each "
                                  "sequence into %u chunks, but %s's seq_len %lld is not "
                                  "divisible by %u", p->name, index, cp, 2 * cp, m->name,
                             (long long)m->seq_len, 2 * cp);
  cJSON *root = model_to_json(m), *piper = cJSON_GetObjectItemCaseSensitive(root, "piper");
  cJSON_DeleteItemFromObjectCaseSensitive(piper, "context_parallel");
  cJSON_AddNumberToObject(piper, "context_parallel", cp);
  struct model *split = model_load_json(m->name, root, 0, err);
  cJSON_Delete(root);
  if (!split)
    return false;
  model_free(r->model);
  r->model = split;
  return true;
}

bool compile_run(const struct compile_options *o, struct compile_result *r, GError **err) {
  memset(r, 0, sizeof *r);
  if (!o->model_path)
    return piper_input_error(err, "--model is required");
  if (!o->directives_path && !o->layout)
    return piper_input_error(err, "--directives (or --base-schedule, or --layout) is required");
  if (o->directives_path && o->layout)
    return piper_input_error(err, "--layout replaces --directives: give one of them");
  if (!load_model_and_program(o, r, err) || !context_parallel_model(r, err) ||
      !chunk_model(r, err))
    goto fail;
  for (uint32_t k = 0; k < r->program->n && o->default_streams; k++)
    if (r->program->d[k].op == DIR_PLACE || r->program->d[k].op == DIR_SHARD)
      r->program->d[k].stream[0] = '\0';
  struct sched_options sched = o->schedule;
  if (o->global_batch_size > 0 && !derive_microbatches(o, r, &sched, err))
    goto fail;
  if (o->have_schedule || sched.mbs > 0) {
    if (!sched_prepare_program(r->program, (uint32_t)r->model->pp_regions, &sched, err))
      goto fail;
  }
  if (o->import_csv &&
      !import_csv(r->program, (uint32_t)r->model->pp_regions, o->import_csv, o->notes, err))
    goto fail;
  uint32_t n_ranks = 1;
  int32_t *layout =
      sched_layout_from_program(r->program, (uint32_t)r->model->pp_regions, &n_ranks, err);
  if (!layout)
    goto fail;
  g_free(layout);
  if (o->schedule.ranks > 0 && o->schedule.ranks != n_ranks) {
    piper_input_error(err,
                      "--ranks %u, but the placement of %s has %u pipeline ranks (device groups)",
                      o->schedule.ranks, r->program->name, n_ranks);
    goto fail;
  }
  r->ranks = n_ranks;
  r->graph = ir_graph_build(r->model);
  if (!dir_program_apply(r->program, r->graph, o->n_devices, err))
    goto fail;
  r->mbs = r->graph->n_microbatches;
  r->program_file_name = sched_program_file_name(o->schedule.family, r->ranks, r->mbs);
  if (o->lower) {
    char *text = NULL;
    if (!o->no_program_text) {
      cJSON *pj = dir_program_to_json(r->program);
      text = cJSON_PrintUnformatted(pj);
      cJSON_Delete(pj);
    }
    r->graph->cost_model = o->cost_model;
    r->plan = plan_lower(r->graph, text, err);
    cJSON_free(text);
    if (!r->plan)
      goto fail;
  }
  return true;
fail:
  compile_result_free(r);
  return false;
}

bool compile_write_program(const struct compile_result *r, const char *dir, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0) {
    g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: cannot create: %s", dir,
                strerror(errno));
    return false;
  }
  char *path = g_build_filename(dir, r->program_file_name, NULL);
  cJSON *pj = dir_program_to_json(r->program);
  bool ok = json_write_file(path, pj, err);
  cJSON_Delete(pj);
  g_free(path);
  return ok;
}

struct plan *compile_take_plan(const struct compile_options *o, GError **err) {
  struct compile_result r;
  if (!compile_run(o, &r, err))
    return NULL;
  struct plan *plan = r.plan;
  r.plan = NULL; /* the caller owns the plan; the rest goes */
  compile_result_free(&r);
  return plan;
}

struct plan *compile_plan(const char *model_path, const char *directives_path,
                          const struct sched_options *sched, int pp_regions, GError **err) {
  struct compile_options o = compile_options_default();
  o.model_path = model_path;
  o.directives_path = directives_path;
  o.pp_regions = pp_regions;
  if (sched) {
    o.have_schedule = true;
    o.schedule = *sched;
  }
  return compile_take_plan(&o, err);
}
