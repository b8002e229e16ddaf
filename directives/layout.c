/* layout: place / replicate / shard directives generated from pp, dp, ep and the stage shape. */
#include "layout.h"

#include <string.h>

#include "../base/json.h"

/* "stage-layers=6+8+8+6": every stage's decoder layers, in stage order. */
static bool parse_stage_list(const char *spec, const char *value, struct layout *l,
                             GError **err) {
  gchar **parts = g_strsplit(value, "+", -1);
  bool ok = true;
  l->n_stage_layers = 0;
  for (gchar **p = parts; ok && *p; p++) {
    uint32_t n = 0;
    if (l->n_stage_layers == LAYOUT_MAX_STAGE_LIST)
      ok = piper_input_error(err, "--layout \"%s\": \"stage-layers\" has more than %u entries",
                             spec, LAYOUT_MAX_STAGE_LIST);
    else if (!piper_parse_u32(*p, 0, MODEL_MAX_LAYERS, &n))
      ok = piper_input_error(err, "--layout \"%s\": \"stage-layers\" entry %u (\"%s\") must be a "
                                  "whole number of layers, e.g. stage-layers=3+5",
                             spec, l->n_stage_layers, *p);
    else if (n == 0)
      ok = piper_input_error(err, "--layout \"%s\": \"stage-layers\" gives stage %u no layer; "
                                  "every stage needs at least one", spec, l->n_stage_layers);
    else
      l->stage_layers[l->n_stage_layers++] = n;
  }
  g_strfreev(parts);
  return ok;
}

/* "layernorm+mla_up_proj" -> a MODEL_MODULE_BIT mask; false on an unknown or repeated name. */
static bool parse_modules(const char *text, uint32_t *out) {
  gchar **names = g_strsplit(text, "+", -1);
  bool ok = names[0] != NULL;
  *out = 0;
  for (gchar **it = names; ok && *it; it++) {
    enum model_module k;
    ok = model_module_parse(*it, &k) && !(*out & MODEL_MODULE_BIT(k));
    *out |= ok ? MODEL_MODULE_BIT(k) : 0;
  }
  g_strfreev(names);
  return ok;
}

/* "recompute[@A[-B]]=full[:uniform|block:N]|selective[:M+M][:uniform|block:N]" -> one more
 * l->recompute. */
static bool parse_recompute(const char *spec, const char *item, const char *value, struct layout *l,
                            GError **err) {
  if (l->n_recompute >= LAYOUT_MAX_RECOMPUTE)
    return piper_input_error(err, "--layout \"%s\": more than %u recompute items", spec,
                             LAYOUT_MAX_RECOMPUTE);
  struct layout_recompute r = {.all_stages = item[9] != '@'};
  if (!r.all_stages) {
    g_autofree char *range = g_strndup(item + 10, (size_t)(value - 1 - (item + 10)));
    char *dash = strchr(range, '-');
    if (dash)
      *dash = '\0';
    if (!piper_parse_u32(range, 0, 65535, &r.first_stage) ||
        !piper_parse_u32(dash ? dash + 1 : range, r.first_stage, 65535, &r.last_stage))
      return piper_input_error(err, "--layout \"%s\": \"%s\": stages must be @A or @A-B with "
                                    "A <= B (stage numbers)", spec, item);
  }
  gchar **w = g_strsplit(value, ":", -1);
  uint32_t n = g_strv_length(w);
  bool ok = true;
  /* GRANULARITY[:MODULES][:METHOD:N], modules with selective only */
  bool sel = strcmp(w[0], "selective") == 0;
  uint32_t mods = sel && (n == 2 || n == 4);
  if (sel || strcmp(w[0], "full") == 0) {
    r.granularity = sel ? IR_RECOMPUTE_SELECTIVE : IR_RECOMPUTE_FULL;
    ok = n == 1 + mods || n == 3 + mods;
    ok = ok && (!mods || parse_modules(w[1], &r.modules));
    if (ok && n == 3 + mods) {
      const char *m = w[1 + mods];
      r.method = strcmp(m, "uniform") == 0 ? DIR_RECOMPUTE_UNIFORM
                 : strcmp(m, "block") == 0 ? DIR_RECOMPUTE_BLOCK
                                           : DIR_RECOMPUTE_SEGMENT;
      ok = r.method != DIR_RECOMPUTE_SEGMENT &&
           piper_parse_u32(w[2 + mods], 1, MODEL_MAX_LAYERS, &r.num_layers);
    }
  } else
    ok = false;
  g_strfreev(w);
  if (!ok)
    return piper_input_error(err, "--layout \"%s\": \"%s\" must be full, full:uniform:N, "
                                  "full:block:N (N layers), selective, selective:M+M (modules "
                                  "core_attn, layernorm, mlp, moe_act, moe, shared_experts, "
                                  "mla_up_proj), each selective one with :uniform:N or :block:N",
                             spec, item);
  l->recompute[l->n_recompute++] = r;
  return true;
}

/* "pp=4" -> key "pp", value 4; a bare "v" has no value. */
static bool parse_item(const char *spec, const char *item, struct layout *l, GError **err) {
  const char *eq = strchr(item, '=');
  if (!eq) {
    static const struct {
      const char *name;
      size_t offset;
    } flags[] = {{"sp", offsetof(struct layout, sequence_parallel)},
                 {"account-for-embedding", offsetof(struct layout, account_embedding)},
                 {"account-for-loss", offsetof(struct layout, account_loss)},
                 {"fp8-expert-inputs", offsetof(struct layout, fp8_expert_inputs)}};
    for (size_t k = 0; k < G_N_ELEMENTS(flags); k++)
      if (strcmp(item, flags[k].name) == 0) {
        *(bool *)((char *)l + flags[k].offset) = true;
        return true;
      }
    if (strcmp(item, "v") != 0)
      return piper_input_error(err,
                               "--layout \"%s\": unknown item \"%s\" (pp=, dp=, ep=, etp=, "
                               "tp=, cp=, cp-comm=, interleave=, zero=, recompute=, "
                               "first-stage-layers=, last-stage-layers=, stage-layers=, "
                               "capacity=, v, sp, account-for-embedding, account-for-loss, "
                               "fp8-expert-inputs)",
                               spec, item);
    l->shape = LAYOUT_V;
    return true;
  }
  size_t klen = (size_t)(eq - item);
  if (klen == 12 && strncmp(item, "stage-layers", klen) == 0)
    return parse_stage_list(spec, eq + 1, l, err);
  if (klen == 8 && strncmp(item, "capacity", klen) == 0) {
    /* the shard directives' capacity_factor (ir/expert.c): below 1 the average routing would
     * not fit */
    char *end = NULL;
    double f = g_ascii_strtod(eq + 1, &end);
    if (end == eq + 1 || *end || !(f >= 1.0 && f <= IR_EP_CAPACITY_FACTOR_MAX))
      return piper_input_error(err, "--layout \"%s\": \"capacity\" must be a number in [1, %g]",
                               spec, IR_EP_CAPACITY_FACTOR_MAX);
    l->capacity_factor = f;
    return true;
  }
  if (klen == 7 && strncmp(item, "cp-comm", klen) == 0) {
    bool gather = strcmp(eq + 1, "all_gather") == 0;
    if (!gather && strcmp(eq + 1, "p2p") != 0)
      return piper_input_error(err, "--layout \"%s\": \"cp-comm\" must be p2p (a ring of K/V "
                                    "exchanges) or all_gather", spec);
    l->cp_comm = gather ? IR_CP_ALL_GATHER : IR_CP_P2P;
    return true;
  }
  if (klen >= 9 && strncmp(item, "recompute", 9) == 0 && (klen == 9 || item[9] == '@'))
    return parse_recompute(spec, item, eq + 1, l, err);
  static const struct {
    const char *key;
    size_t offset;
    uint32_t lo, hi;
  } keys[] = {
      {"pp", offsetof(struct layout, pp), 1, 65536},
      {"dp", offsetof(struct layout, dp), 1, LAYOUT_MAX_DEVICES},
      {"ep", offsetof(struct layout, ep), 1, LAYOUT_MAX_DEVICES},
      {"tp", offsetof(struct layout, tp), 1, DIR_MAX_TP_DEGREE},
      {"etp", offsetof(struct layout, etp), 1, DIR_MAX_TP_DEGREE},
      {"cp", offsetof(struct layout, cp), 1, MODEL_MAX_CONTEXT_PARALLEL},
      {"interleave", offsetof(struct layout, interleave), 1, 64},
      {"zero", offsetof(struct layout, zero), 0, 3},
      {"first-stage-layers", offsetof(struct layout, first_stage_layers), 1, MODEL_MAX_LAYERS},
      {"last-stage-layers", offsetof(struct layout, last_stage_layers), 1, MODEL_MAX_LAYERS},
  };
  for (size_t k = 0; k < G_N_ELEMENTS(keys); k++) {
    if (strlen(keys[k].key) != klen || strncmp(item, keys[k].key, klen) != 0)
      continue;
    uint32_t *field = (uint32_t *)((char *)l + keys[k].offset);
    if (!piper_parse_u32(eq + 1, keys[k].lo, keys[k].hi, field))
      return piper_input_error(err, "--layout \"%s\": \"%s\" must be a whole number in [%u, %u]",
                               spec, keys[k].key, keys[k].lo, keys[k].hi);
    return true;
  }
  return piper_input_error(err,
                           "--layout \"%s\": unknown key \"%.*s\" (pp, dp, ep, etp, tp, cp, "
                           "cp-comm, interleave, zero, recompute, first-stage-layers, "
                           "last-stage-layers, stage-layers, capacity, v, sp, "
                           "account-for-embedding, account-for-loss, fp8-expert-inputs)",
                           spec, (int)klen, item);
}

/* The uneven-stage keys against each other and the stage count (shape already set). */
static bool check_stage_layers(const char *spec, const struct layout *l, GError **err) {
  uint32_t stages = layout_stages(l);
  bool first_last = l->first_stage_layers || l->last_stage_layers;
  if (l->n_stage_layers && (first_last || l->account_embedding || l->account_loss))
    return piper_input_error(err, "--layout \"%s\": \"stage-layers\" gives every stage's layers; "
                                  "it excludes first-stage-layers, last-stage-layers and "
                                  "account-for-embedding/loss", spec);
  if (l->n_stage_layers && l->n_stage_layers != stages)
    return piper_input_error(err, "--layout \"%s\": \"stage-layers\" has %u entries for %u "
                                  "stages", spec, l->n_stage_layers, stages);
  if (first_last && stages < 2)
    return piper_input_error(err, "--layout \"%s\": first-stage-layers and last-stage-layers "
                                  "need at least 2 stages", spec);
  return true;
}

/* Recompute items name stages the layout has, and no stage twice (each stage gets one). */
static bool check_recompute(const char *spec, const struct layout *l, GError **err) {
  uint32_t stages = layout_stages(l);
  for (uint32_t i = 0; i < l->n_recompute; i++) {
    const struct layout_recompute *a = &l->recompute[i];
    if (!a->all_stages && a->last_stage >= stages)
      return piper_input_error(err, "--layout \"%s\": recompute@%u-%u names a stage past the "
                                    "layout's %u", spec, a->first_stage, a->last_stage, stages);
    for (uint32_t j = 0; j < i; j++) {
      const struct layout_recompute *b = &l->recompute[j];
      if (a->all_stages || b->all_stages ||
          (a->first_stage <= b->last_stage && b->first_stage <= a->last_stage))
        return piper_input_error(err, "--layout \"%s\": two recompute items cover one stage "
                                      "(give each stage one)", spec);
    }
  }
  return true;
}

/* ep and etp against the stage's ranks (Megatron's expert grid: ETP x EP x expert-DP over
 * the TP x CP x DP ranks of a stage). */
static bool check_experts(const char *spec, const struct layout *l, GError **err) {
  uint32_t ranks = layout_stage_ranks(l), etp = layout_expert_tp(l);
  if (l->etp && l->ep < 2)
    return piper_input_error(err, "--layout \"%s\": etp (expert tensor parallelism) needs ep of "
                                  "at least 2", spec);
  if (l->ep < 2)
    return true;
  if (l->tp % etp != 0)
    return piper_input_error(err, "--layout \"%s\": etp=%u must divide tp=%u", spec, etp, l->tp);
  if (etp < l->tp && !l->sequence_parallel)
    return piper_input_error(err, "--layout \"%s\": etp=%u below tp=%u needs sp (each TP rank "
                                  "routes its sequence shard to the experts, as Megatron requires)",
                             spec, etp, l->tp);
  if ((uint64_t)l->ep * etp > ranks || ranks % (l->ep * etp) != 0) {
    char grid[64];
    if (l->cp > 1)
      g_snprintf(grid, sizeof grid, "tp x cp x dp = %u x %u x %u", l->tp, l->cp, l->dp);
    else
      g_snprintf(grid, sizeof grid, "tp x dp = %u x %u", l->tp, l->dp);
    return piper_input_error(err, "--layout \"%s\": ep=%u x etp=%u%s does not divide the %u "
                                  "ranks of a stage (%s)", spec, l->ep, etp,
                             l->etp ? "" : " (etp defaults to tp)", ranks, grid);
  }
  return true;
}

/* What the compiler cannot express yet, and combinations that mean nothing. */
static bool check(const char *spec, struct layout *l, GError **err) {
  if (l->interleave > 1 && l->shape == LAYOUT_V)
    return piper_input_error(err, "--layout \"%s\": interleave and v exclude each other (a V "
                                  "holds two stages per rank)", spec);
  if (l->interleave > 1)
    l->shape = LAYOUT_INTERLEAVED;
  if (!check_experts(spec, l, err))
    return false;
  if (!layout_zero_applies(l))
    return piper_input_error(err, "--layout \"%s\": zero=%u needs dp of at least 2 (or dp x cp)",
                             spec, l->zero);
  if ((l->capacity_factor > 0 || l->fp8_expert_inputs) && l->ep < 2)
    return piper_input_error(err,
                             "--layout \"%s\": %s applies to expert parallelism: it needs "
                             "ep of at least 2",
                             spec, l->fp8_expert_inputs ? "fp8-expert-inputs" : "capacity");
  if (l->sequence_parallel && l->tp < 2)
    return piper_input_error(err, "--layout \"%s\": sp (sequence parallelism) needs tp of at "
                                  "least 2", spec);
  if (!check_stage_layers(spec, l, err) || !check_recompute(spec, l, err))
    return false;
  uint64_t devices = (uint64_t)l->pp * l->dp * l->tp * l->cp;
  if (devices > LAYOUT_MAX_DEVICES)
    return piper_input_error(err, "--layout \"%s\": %llu devices, more than %u", spec,
                             (unsigned long long)devices, LAYOUT_MAX_DEVICES);
  return true;
}

/* An item's key: what comes before '=', or the whole item ("v", "sp"). */
static size_t item_key_len(const char *item) {
  const char *eq = strchr(item, '=');
  return eq ? (size_t)(eq - item) : strlen(item);
}

/* A key given twice ("pp=2,pp=4") is refused: the last one silently won. */
static bool check_repeats(const char *spec, gchar **items, GError **err) {
  for (gchar **a = items; *a; a++)
    for (gchar **b = items; b < a; b++) {
      size_t n = item_key_len(*a);
      if (n && item_key_len(*b) == n && strncmp(*a, *b, n) == 0)
        return piper_input_error(err, "--layout \"%s\": \"%.*s\" is given twice", spec, (int)n,
                                 *a);
    }
  return true;
}

bool layout_parse(const char *spec, struct layout *out, GError **err) {
  struct layout l = {
      .pp = 1, .dp = 1, .ep = 1, .tp = 1, .cp = 1, .shape = LAYOUT_LINEAR, .interleave = 1};
  if (!spec || !spec[0])
    return piper_input_error(err, "--layout: empty (e.g. pp=4,dp=2)");
  gchar **items = g_strsplit(spec, ",", -1);
  bool ok = true;
  for (gchar **it = items; *it; it++)
    g_strstrip(*it);
  ok = check_repeats(spec, items, err);
  for (gchar **it = items; ok && *it; it++)
    ok = parse_item(spec, *it, &l, err);
  g_strfreev(items);
  if (!ok || !check(spec, &l, err))
    return false;
  *out = l;
  return true;
}

uint32_t layout_stages(const struct layout *l) {
  switch (l->shape) {
  case LAYOUT_V: return 2 * l->pp;
  case LAYOUT_INTERLEAVED: return l->pp * l->interleave;
  default: return l->pp;
  }
}

bool layout_has_stage_layers(const struct layout *l) {
  return l->n_stage_layers || l->first_stage_layers || l->last_stage_layers ||
         l->account_embedding || l->account_loss;
}

bool layout_stage_layers(const struct layout *l, const char *spec, int64_t num_layers,
                         int32_t *out, GError **err) {
  uint32_t stages = layout_stages(l);
  int64_t sum = 0;
  if (l->n_stage_layers) {
    for (uint32_t s = 0; s < stages; s++)
      sum += out[s] = (int32_t)l->stage_layers[s];
    if (sum != num_layers)
      return piper_input_error(err, "--layout \"%s\": \"stage-layers\" sums to %lld but the "
                                    "model has %lld layers", spec, (long long)sum,
                               (long long)num_layers);
    return true;
  }
  /* Units to split: the layers no count fixes, plus the embedding / loss where counted. */
  uint32_t lo = l->first_stage_layers ? 1 : 0;
  uint32_t hi = stages - (l->last_stage_layers ? 1 : 0);
  int64_t fixed = (int64_t)l->first_stage_layers + l->last_stage_layers;
  if (fixed > num_layers || (lo == hi && fixed != num_layers))
    return piper_input_error(err, "--layout \"%s\": first-stage-layers + last-stage-layers = "
                                  "%lld, %s the model's %lld layers", spec, (long long)fixed,
                             fixed > num_layers ? "more than" : "but with two stages they must be",
                             (long long)num_layers);
  int64_t extra_first = !l->first_stage_layers && l->account_embedding;
  int64_t extra_last = !l->last_stage_layers && l->account_loss;
  int64_t units = num_layers - fixed + extra_first + extra_last;
  uint32_t free_stages = hi - lo;
  for (uint32_t s = 0; s < stages; s++) {
    if (s < lo)
      out[s] = (int32_t)l->first_stage_layers;
    else if (s >= hi)
      out[s] = (int32_t)l->last_stage_layers;
    else /* the first (units mod free) stages take one more, as the model's equal split */
      out[s] = (int32_t)(units / free_stages + (s - lo < units % free_stages ? 1 : 0));
  }
  out[0] -= (int32_t)extra_first;
  out[stages - 1] -= (int32_t)extra_last;
  for (uint32_t s = 0; s < stages; s++)
    if (out[s] < 1)
      return piper_input_error(err, "--layout \"%s\": stage %u would hold no decoder layer "
                                    "(%lld layers over %u stages%s)", spec, s,
                               (long long)num_layers, stages,
                               extra_first || extra_last ? ", embedding and loss counted" : "");
  return true;
}

uint32_t layout_stage_ranks(const struct layout *l) {
  return l->tp * l->cp * l->dp;
}

uint32_t layout_expert_tp(const struct layout *l) {
  return l->etp ? l->etp : l->tp;
}

bool layout_zero_applies(const struct layout *l) {
  return l->zero == 0 || l->dp * l->cp >= 2;
}

/* The shard's fields beyond today's: none where the EP group is every device of one TP rank
 * (ep = dp, experts under the dense TP), so those programs read as they always did. */
/* The EP options of the shard lines, each only when it differs from the default (so layouts
 * without them print as before): the carved group's sizes, capacity_factor, fp8_expert_inputs. */
static void shard_extra(const struct layout *l, char *buf, size_t len) {
  uint32_t etp = layout_expert_tp(l);
  buf[0] = '\0';
  /* a shard without a degree spreads the experts over the devices of one TP rank: DP x CP */
  if (l->ep != l->dp * l->cp || etp != l->tp)
    g_snprintf(buf, len, ", \"degree\": %u, \"expert_tensor_parallel\": %u", l->ep, etp);
  if (l->capacity_factor > 0) {
    char c[48];
    g_snprintf(c, sizeof c, ", \"capacity_factor\": %g", l->capacity_factor);
    g_strlcat(buf, c, len);
  }
  if (l->fp8_expert_inputs)
    g_strlcat(buf, ", \"fp8_expert_inputs\": true", len);
}

uint32_t layout_devices(const struct layout *l) {
  return l->pp * l->dp * l->cp * l->tp;
}

uint32_t layout_device(const struct layout *l, uint32_t pp_rank, uint32_t tp_rank,
                       uint32_t cp_rank, uint32_t dp_rank) {
  return ((pp_rank * l->dp + dp_rank) * l->cp + cp_rank) * l->tp + tp_rank;
}

void layout_coords(const struct layout *l, uint32_t device, uint32_t *pp_rank, uint32_t *tp_rank,
                   uint32_t *cp_rank, uint32_t *dp_rank) {
  *tp_rank = device % l->tp;
  *cp_rank = device / l->tp % l->cp;
  *dp_rank = device / (l->tp * l->cp) % l->dp;
  *pp_rank = device / (l->tp * l->cp * l->dp);
}

uint32_t layout_stage_rank(const struct layout *l, uint32_t stage) {
  PIPER_ASSERT(stage < layout_stages(l));
  switch (l->shape) {
  case LAYOUT_V: return stage < l->pp ? stage : 2 * l->pp - 1 - stage;
  case LAYOUT_INTERLEAVED: return stage % l->pp;
  default: return stage;
  }
}

/* ", "-separated device ids of rank r: dp x cp x tp of them, in position order (a stage's
 * group position is its device's (tp, cp, dp) coordinates, TP innermost: Megatron's order). */
static void append_devices(GString *s, const struct layout *l, uint32_t rank) {
  g_string_append_c(s, '[');
  for (uint32_t dp = 0, i = 0; dp < l->dp; dp++)
    for (uint32_t cp = 0; cp < l->cp; cp++)
      for (uint32_t tp = 0; tp < l->tp; tp++, i++)
        g_string_append_printf(s, i ? ", %u" : "%u", layout_device(l, rank, tp, cp, dp));
  g_string_append_c(s, ']');
}

/* One directive line: {"op": OP, "filter": FILTER, "devices": [...]EXTRA}. */
static void append_line(GString *s, const char *op, const char *filter, const struct layout *l,
                        uint32_t rank, const char *extra) {
  if (s->len > 2)
    g_string_append(s, ",\n");
  g_string_append_printf(s, "  {\"op\": \"%s\", \"filter\": %s, \"devices\": ", op, filter);
  append_devices(s, l, rank);
  g_string_append_printf(s, "%s}", extra);
}

/* One recompute directive per stage of the item (its filter names PP alone, as a layered
 * method needs), or one over {} for the whole model. */
static void append_recompute(GString *s, const struct layout_recompute *r) {
  g_autofree char *method =
      r->method == DIR_RECOMPUTE_SEGMENT
          ? g_strdup("")
          : g_strdup_printf(", \"method\": \"%s\", \"num_layers\": %u",
                            r->method == DIR_RECOMPUTE_UNIFORM ? "uniform" : "block", r->num_layers);
  const char *g = r->granularity == IR_RECOMPUTE_FULL ? "full" : "selective";
  GString *mods = g_string_new("");
  for (int k = 0; k < MODEL_MODULE_COUNT && r->modules; k++)
    if (r->modules & MODEL_MODULE_BIT(k))
      g_string_append_printf(mods, "%s\"%s\"", mods->len ? ", " : ", \"modules\": [",
                             model_module_name((enum model_module)k));
  if (mods->len)
    g_string_append_c(mods, ']');
  for (uint32_t st = r->first_stage; st <= r->last_stage; st++) {
    g_autofree char *filter = r->all_stages ? g_strdup("{}") : g_strdup_printf("{\"PP\": %u}", st);
    g_string_append_printf(s, "%s  {\"op\": \"recompute\", \"filter\": %s, \"granularity\": \"%s\"%s%s}",
                           s->len > 2 ? ",\n" : "", filter, g, method, mods->str);
  }
  g_string_free(mods, TRUE);
}

char *layout_to_json(const struct layout *l) {
  GString *s = g_string_new("[\n");
  uint32_t stages = layout_stages(l);
  char shard[160];
  shard_extra(l, shard, sizeof shard);
  const char *zero = l->zero == 3 ? ", \"shard_grads\": true, \"shard_params\": true"
                     : l->zero == 2 ? ", \"shard_grads\": true"
                     : l->zero == 1 ? ", \"shard_optimizer\": true"
                                    : "";
  /* context parallelism reduces gradients over DP x CP: its CP ranks replicate the stage */
  uint32_t replicas = l->dp * l->cp;
  if (stages == 1) { /* one stage on every device: no place needed */
    if (replicas == 1 && l->tp > 1)
      append_line(s, "place", "{}", l, 0, "");
    else if (replicas > 1 || l->ep == 1)
      append_line(s, "replicate", "{}", l, 0, zero);
    if (l->ep > 1)
      append_line(s, "shard", "{\"EP\": \"*\"}", l, 0, shard);
  } else {
    char filter[64];
    for (uint32_t st = 0; st < stages; st++) {
      g_snprintf(filter, sizeof filter, "{\"PP\": %u}", st);
      append_line(s, "place", filter, l, layout_stage_rank(l, st), "");
    }
    for (uint32_t st = 0; st < stages && replicas > 1; st++) {
      g_snprintf(filter, sizeof filter, "{\"PP\": %u}", st);
      append_line(s, "replicate", filter, l, layout_stage_rank(l, st), zero);
    }
    for (uint32_t st = 0; st < stages && l->ep > 1; st++) {
      if (l->stage_without_experts && l->stage_without_experts[st])
        continue;
      g_snprintf(filter, sizeof filter, "{\"PP\": %u, \"EP\": \"*\"}", st);
      append_line(s, "shard", filter, l, layout_stage_rank(l, st), shard);
    }
  }
  if (l->tp > 1)
    g_string_append_printf(s,
                           ",\n  {\"op\": \"tensor_parallel\", \"filter\": {}, \"degree\": %u%s}",
                           l->tp, l->sequence_parallel ? ", \"sequence_parallel\": true" : "");
  if (l->cp > 1)
    g_string_append_printf(s, ",\n  {\"op\": \"context_parallel\", \"degree\": %u, \"comm\": \"%s\"}",
                           l->cp, l->cp_comm == IR_CP_ALL_GATHER ? "all_gather" : "p2p");
  for (uint32_t i = 0; i < l->n_recompute; i++)
    append_recompute(s, &l->recompute[i]);
  g_string_append(s, "\n]\n");
  return g_string_free(s, FALSE);
}

struct dir_program *layout_program(const struct layout *l, const char *name, GError **err) {
  char *text = layout_to_json(l);
  cJSON *root = json_parse_buffer(name, text, strlen(text), err);
  g_free(text);
  if (!root)
    return NULL;
  struct dir_program *p = dir_program_parse_json(name, root, err);
  cJSON_Delete(root);
  return p;
}
