/* sim scenario: reading a what-if file and answering the engine's questions (scenario.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../base/json.h"
#include "sim.h"

/* A counter-based generator (splitmix64 of seed and the draw's coordinates): a draw depends
 * only on what it is for, never on the order the simulation asks in. */
static double uniform01(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t h =
      piper_splitmix64(seed ^ piper_splitmix64(a ^ piper_splitmix64(b + 0x632be59bd9b4e019ull)));
  return ((double)(h >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
}

/* Standard normal by Box-Muller from two draws. */
static double normal(uint64_t seed, uint64_t a, uint64_t b) {
  double u1 = uniform01(seed, a, 2 * b), u2 = uniform01(seed, a, 2 * b + 1);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * G_PI * u2);
}

static bool key_error(GError **err, const char *path, const char *key, const char *what) {
  return piper_input_error(err, "%s: key \"%s\": %s", path, key, what);
}

/* Fails on the first key of obj not in allowed (NULL-terminated); where prefixes its name. */
static bool check_keys(const cJSON *obj, const char *const *allowed, const char *where,
                       const char *path, GError **err) {
  for (const cJSON *c = obj->child; c; c = c->next) {
    bool ok = false;
    for (const char *const *a = allowed; *a && !ok; a++)
      ok = strcmp(*a, c->string) == 0;
    if (!ok) {
      char key[160];
      snprintf(key, sizeof key, "%s%s", where, c->string);
      return key_error(err, path, key, "unknown key");
    }
  }
  return true;
}

static bool get_number(const cJSON *obj, const char *name, const char *where, bool required,
                       double lo, double hi, bool lo_open, double *out, const char *path,
                       GError **err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  char key[160], what[96];
  snprintf(key, sizeof key, "%s%s", where, name);
  if (!v)
    return required ? key_error(err, path, key, "missing") : true;
  snprintf(what, sizeof what, "must be a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
  if (!cJSON_IsNumber(v) || !(lo_open ? v->valuedouble > lo : v->valuedouble >= lo) ||
      !(v->valuedouble <= hi))
    return key_error(err, path, key, what);
  *out = v->valuedouble;
  return true;
}

/* "devices": a non-empty array of device ids of the plan. */
static bool get_devices(const cJSON *obj, const char *where, uint32_t n_devices, GArray *out,
                        const char *path, GError **err) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "devices");
  char key[160], what[96];
  snprintf(key, sizeof key, "%sdevices", where);
  if (!v)
    return key_error(err, path, key, "missing");
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
    return key_error(err, path, key, "must be a non-empty array of device ids");
  snprintf(what, sizeof what, "must hold integers in [0, %u] (the plan's devices)",
           n_devices - 1);
  const cJSON *d;
  cJSON_ArrayForEach(d, v) {
    if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble >= n_devices ||
        d->valuedouble != floor(d->valuedouble))
      return key_error(err, path, key, what);
    uint32_t id = (uint32_t)d->valuedouble;
    g_array_append_val(out, id);
  }
  return true;
}

static bool parse_slow(const cJSON *root, struct sim_scenario *sc, GError **err) {
  const cJSON *slow = cJSON_GetObjectItemCaseSensitive(root, "slow");
  if (!slow)
    return true;
  if (!cJSON_IsArray(slow))
    return key_error(err, sc->path, "slow", "must be an array of {\"devices\", \"factor\"}");
  static const char *const keys[] = {"devices", "factor", NULL};
  uint32_t k = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, slow) {
    char where[48];
    snprintf(where, sizeof where, "slow[%u].", k++);
    if (!cJSON_IsObject(it)) {
      where[strlen(where) - 1] = 0;
      return key_error(err, sc->path, where, "must be an object {\"devices\", \"factor\"}");
    }
    double factor = 1;
    GArray *devs = g_array_new(FALSE, FALSE, sizeof(uint32_t));
    bool ok = check_keys(it, keys, where, sc->path, err) &&
              get_devices(it, where, sc->n_devices, devs, sc->path, err) &&
              get_number(it, "factor", where, true, 0, 1e6, true, &factor, sc->path, err);
    for (uint32_t j = 0; ok && j < devs->len; j++)
      sc->compute[g_array_index(devs, uint32_t, j)] *= factor;
    g_array_free(devs, TRUE);
    if (!ok)
      return false;
  }
  return true;
}

/* "slow_random": {"count": N, "factor": F}: N distinct devices drawn with the seed. */
static bool parse_slow_random(const cJSON *root, struct sim_scenario *sc, GError **err) {
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "slow_random");
  if (!r)
    return true;
  if (!cJSON_IsObject(r))
    return key_error(err, sc->path, "slow_random", "must be an object {\"count\", \"factor\"}");
  static const char *const keys[] = {"count", "factor", NULL};
  double count = 0, factor = 1;
  if (!check_keys(r, keys, "slow_random.", sc->path, err) ||
      !get_number(r, "count", "slow_random.", true, 1, sc->n_devices, false, &count, sc->path,
                  err) ||
      !get_number(r, "factor", "slow_random.", true, 0, 1e6, true, &factor, sc->path, err))
    return false;
  if (count != floor(count))
    return key_error(err, sc->path, "slow_random.count", "must be an integer");
  bool *taken = g_new0(bool, sc->n_devices);
  for (uint64_t draw = 0, got = 0; got < (uint64_t)count; draw++) {
    uint32_t d = (uint32_t)(uniform01(sc->seed, 0x51ull, draw) * sc->n_devices);
    if (d >= sc->n_devices || taken[d])
      continue;
    taken[d] = true;
    sc->compute[d] *= factor;
    got++;
  }
  g_free(taken);
  return true;
}

/* A failed NIC: the device's traffic goes out through the NIC of its neighbour in the node
 * (device d ^ 1), which then carries both: half the bandwidth for each. */
static void fail_nic(struct sim_scenario *sc, uint32_t d) {
  sc->inter_bw[d] *= 0.5;
  uint32_t peer = d ^ 1u;
  if (peer < sc->n_devices)
    sc->inter_bw[peer] *= 0.5;
}

static bool parse_link(const cJSON *it, const char *where, struct sim_scenario *sc,
                       GError **err) {
  static const char *const keys[] = {"devices", "bandwidth", "failed", "scope", NULL};
  GArray *devs = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  double bw = 1;
  bool ok = check_keys(it, keys, where, sc->path, err) &&
            get_devices(it, where, sc->n_devices, devs, sc->path, err) &&
            get_number(it, "bandwidth", where, false, 0, 1, true, &bw, sc->path, err);
  const cJSON *failed = cJSON_GetObjectItemCaseSensitive(it, "failed");
  const cJSON *scope = cJSON_GetObjectItemCaseSensitive(it, "scope");
  char key[160];
  enum sim_link_scope sco = SIM_LINK_INTER;
  if (ok && failed && !cJSON_IsBool(failed)) {
    snprintf(key, sizeof key, "%sfailed", where);
    ok = key_error(err, sc->path, key, "must be true or false");
  }
  bool is_failed = failed && cJSON_IsTrue(failed);
  if (ok && !is_failed && !cJSON_GetObjectItemCaseSensitive(it, "bandwidth")) {
    snprintf(key, sizeof key, "%sbandwidth", where);
    ok = key_error(err, sc->path, key, "missing (or \"failed\": true)");
  }
  if (ok && scope) {
    const char *v = cJSON_IsString(scope) ? scope->valuestring : "";
    sco = !strcmp(v, "inter") ? SIM_LINK_INTER
          : !strcmp(v, "intra") ? SIM_LINK_INTRA
          : !strcmp(v, "all")   ? SIM_LINK_ALL
                                : (enum sim_link_scope)-1;
    snprintf(key, sizeof key, "%sscope", where);
    if ((int)sco < 0)
      ok = key_error(err, sc->path, key, "must be \"inter\", \"intra\" or \"all\"");
    else if (is_failed && sco != SIM_LINK_INTER)
      ok = key_error(err, sc->path, key, "a failed NIC is \"inter\" (NVLink failures are not "
                                         "modelled)");
  }
  for (uint32_t j = 0; ok && j < devs->len; j++) {
    uint32_t d = g_array_index(devs, uint32_t, j);
    if (is_failed)
      fail_nic(sc, d);
    if (sco != SIM_LINK_INTRA)
      sc->inter_bw[d] *= bw;
    if (sco != SIM_LINK_INTER)
      sc->intra_bw[d] *= bw;
  }
  g_array_free(devs, TRUE);
  return ok;
}

static bool parse_links(const cJSON *root, struct sim_scenario *sc, GError **err) {
  const cJSON *links = cJSON_GetObjectItemCaseSensitive(root, "links");
  if (!links)
    return true;
  if (!cJSON_IsArray(links))
    return key_error(err, sc->path, "links", "must be an array of {\"devices\", \"bandwidth\"}");
  uint32_t k = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, links) {
    char where[48];
    snprintf(where, sizeof where, "links[%u].", k++);
    if (!cJSON_IsObject(it)) {
      where[strlen(where) - 1] = 0;
      return key_error(err, sc->path, where, "must be an object {\"devices\", \"bandwidth\"}");
    }
    if (!parse_link(it, where, sc, err))
      return false;
  }
  return true;
}

static bool parse_jitter(const cJSON *root, struct sim_scenario *sc, GError **err) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, "jitter");
  if (!j)
    return true;
  if (!cJSON_IsObject(j))
    return key_error(err, sc->path, "jitter", "must be an object {\"sigma\", \"per\"}");
  static const char *const keys[] = {"sigma", "per", NULL};
  if (!check_keys(j, keys, "jitter.", sc->path, err) ||
      !get_number(j, "sigma", "jitter.", true, 0, 1, false, &sc->jitter_sigma, sc->path, err))
    return false;
  const cJSON *per = cJSON_GetObjectItemCaseSensitive(j, "per");
  sc->jitter_per_kernel = true;
  if (per) {
    const char *v = cJSON_IsString(per) ? per->valuestring : "";
    if (strcmp(v, "kernel") && strcmp(v, "device"))
      return key_error(err, sc->path, "jitter.per", "must be \"kernel\" or \"device\"");
    sc->jitter_per_kernel = !strcmp(v, "kernel");
  }
  if (!sc->jitter_per_kernel) /* one draw per device: folded into its factor */
    for (uint32_t d = 0; d < sc->n_devices; d++)
      sc->compute[d] *= exp(sc->jitter_sigma * normal(sc->seed, 0x7177ull, d));
  return true;
}

/* The devices a scenario changes, each with a note for the chart, ascending. */
static void collect_marked(struct sim_scenario *sc) {
  GArray *m = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GPtrArray *labels = g_ptr_array_new();
  bool per_device_jitter = sc->jitter_sigma > 0 && !sc->jitter_per_kernel;
  for (uint32_t d = 0; d < sc->n_devices && m->len < 64; d++) {
    bool slow = sc->compute[d] != 1 && !per_device_jitter;
    if (!slow && sc->inter_bw[d] == 1 && sc->intra_bw[d] == 1)
      continue;
    GString *g = g_string_new(NULL);
    if (slow)
      g_string_append_printf(g, "compute x%.3g", sc->compute[d]);
    if (sc->inter_bw[d] != 1)
      g_string_append_printf(g, "%sNIC x%.3g", g->len ? ", " : "", sc->inter_bw[d]);
    if (sc->intra_bw[d] != 1)
      g_string_append_printf(g, "%sNVLink x%.3g", g->len ? ", " : "", sc->intra_bw[d]);
    g_array_append_val(m, d);
    g_ptr_array_add(labels, g_string_free(g, FALSE));
  }
  sc->n_marked = m->len;
  sc->marked = (uint32_t *)(void *)g_array_free(m, FALSE);
  sc->marked_label = (char **)g_ptr_array_free(labels, FALSE);
}

struct sim_scenario *sim_scenario_from_json(const cJSON *root, const char *path,
                                            const struct plan *p, GError **err) {
  struct sim_scenario *sc = g_new0(struct sim_scenario, 1);
  sc->path = g_strdup(path);
  sc->n_devices = p->n_devices;
  sc->compute = g_new(double, sc->n_devices + 1);
  sc->inter_bw = g_new(double, sc->n_devices + 1);
  sc->intra_bw = g_new(double, sc->n_devices + 1);
  for (uint32_t d = 0; d <= sc->n_devices; d++)
    sc->compute[d] = sc->inter_bw[d] = sc->intra_bw[d] = 1;
  static const char *const keys[] = {"seed", "slow", "slow_random", "links", "jitter",
                                     "comment", NULL};
  double seed = 0;
  bool ok = true;
  if (!cJSON_IsObject(root))
    ok = piper_input_error(err, "%s: must be a JSON object (keys seed, slow, slow_random, "
                                "links, jitter)", path);
  ok = ok && check_keys(root, keys, "", path, err) &&
       get_number(root, "seed", "", false, 0, 9007199254740991.0, false, &seed, path, err);
  if (ok && seed != floor(seed))
    ok = key_error(err, path, "seed", "must be an integer");
  sc->seed = (uint64_t)seed;
  ok = ok && parse_slow(root, sc, err) && parse_slow_random(root, sc, err) &&
       parse_links(root, sc, err) && parse_jitter(root, sc, err);
  if (!ok) {
    sim_scenario_free(sc);
    return NULL;
  }
  collect_marked(sc);
  return sc;
}

struct sim_scenario *sim_scenario_load(const char *path, const struct plan *p, GError **err) {
  cJSON *root = json_parse_file_strict(path, err);
  if (!root)
    return NULL;
  struct sim_scenario *sc = sim_scenario_from_json(root, path, p, err);
  cJSON_Delete(root);
  return sc;
}

void sim_scenario_free(struct sim_scenario *sc) {
  if (!sc)
    return;
  for (uint32_t k = 0; k < sc->n_marked; k++)
    g_free(sc->marked_label[k]);
  g_free(sc->marked_label);
  g_free(sc->marked);
  g_free(sc->compute);
  g_free(sc->inter_bw);
  g_free(sc->intra_bw);
  g_free(sc->path);
  g_free(sc);
}

double sim_scenario_compute_factor(const struct sim_scenario *sc, uint32_t d, uint32_t instr) {
  if (!sc || d >= sc->n_devices)
    return 1;
  double f = sc->compute[d];
  if (sc->jitter_sigma > 0 && sc->jitter_per_kernel)
    f *= exp(sc->jitter_sigma * normal(sc->seed, ((uint64_t)d << 32) | 0x1f, instr));
  return f;
}

bool sim_scenario_varies(const struct sim_scenario *sc, uint32_t d) {
  return sc && d < sc->n_devices && sc->jitter_sigma > 0 && sc->jitter_per_kernel;
}

double sim_scenario_bandwidth(const struct sim_scenario *sc, const uint32_t *devices, uint32_t n,
                              bool inter) {
  if (!sc)
    return 1;
  const double *bw = inter ? sc->inter_bw : sc->intra_bw;
  double m = 1;
  for (uint32_t k = 0; k < n; k++)
    if (devices[k] < sc->n_devices && bw[devices[k]] < m)
      m = bw[devices[k]];
  return m;
}

/* ---- what the scenario cost ------------------------------------------------------------- */

static double device_finish(const struct sim_result *r, uint32_t d) {
  return r->units[r->device_unit[d]].finish;
}

static int delay_cmp(const void *a, const void *b) {
  const double *x = a, *y = b; /* pairs (delay, device): larger delay first, then device */
  if (x[0] != y[0])
    return x[0] > y[0] ? -1 : 1;
  return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Devices that end later than in the healthy step, the most delayed first (at most 8). */
static void report_delays(cJSON *o, const struct plan *p, const struct sim_result *healthy,
                          const struct sim_result *run) {
  double eps = 1e-9 + 1e-9 * healthy->iteration_time;
  double *pairs = g_new(double, 2 * (size_t)p->n_devices + 2);
  uint32_t n = 0;
  for (uint32_t d = 0; d < p->n_devices; d++) {
    double late = (device_finish(run, d) - run->t_start) - (device_finish(healthy, d) -
                                                           healthy->t_start);
    if (late > eps) {
      pairs[2 * n] = late;
      pairs[2 * n + 1] = d;
      n++;
    }
  }
  qsort(pairs, n, 2 * sizeof(double), delay_cmp);
  cJSON_AddNumberToObject(o, "delayed_devices", n);
  cJSON *top = cJSON_AddArrayToObject(o, "most_delayed");
  for (uint32_t k = 0; k < n && k < 8; k++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "device", pairs[2 * k + 1]);
    cJSON_AddNumberToObject(e, "delay_s", pairs[2 * k]);
    cJSON_AddItemToArray(top, e);
  }
  g_free(pairs);
}

static bool marked(const struct sim_scenario *sc, uint32_t d) {
  for (uint32_t k = 0; k < sc->n_marked; k++)
    if (sc->marked[k] == d)
      return true;
  return false;
}

/* The critical path: its devices in order, the time it spent on the devices the scenario
 * changed, and the communication it went through, by kind and purpose. */
static void report_path(cJSON *o, const struct sim_scenario *sc, const struct plan *p,
                        const struct sim_result *run) {
  cJSON *path = cJSON_AddObjectToObject(o, "critical_path");
  cJSON_AddNumberToObject(path, "instructions", run->n_path);
  cJSON *devs = cJSON_AddArrayToObject(path, "devices");
  GHashTable *comm = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  double on_marked = 0;
  uint32_t last = UINT32_MAX, n_devs = 0;
  for (uint32_t k = 0; k < run->n_path; k++) {
    const struct sim_path_step *st = &run->path[k];
    if (st->device != last && n_devs < 64) {
      cJSON_AddItemToArray(devs, cJSON_CreateNumber(st->device));
      n_devs++;
    }
    last = st->device;
    const struct ir_node *n = &p->nodes[st->node];
    if (marked(sc, st->device))
      on_marked += st->end - st->start;
    if (n->kind == IR_NODE_COMPUTE || n->kind == IR_NODE_OPTIMIZER)
      continue;
    static const char *const purpose[IR_COMM_PURPOSE_COUNT] = {"", " pp", " dp", " ep", " tp",
                                                                " cp"};
    char *name = g_strdup_printf("%s%s", ir_node_kind_name(n->kind),
                                 n->purpose < IR_COMM_PURPOSE_COUNT ? purpose[n->purpose] : "");
    gpointer v = g_hash_table_lookup(comm, name);
    g_hash_table_insert(comm, name, GUINT_TO_POINTER(GPOINTER_TO_UINT(v) + 1));
  }
  cJSON_AddNumberToObject(path, "seconds_on_changed_devices", on_marked);
  GList *keys = g_list_sort(g_hash_table_get_keys(comm), (GCompareFunc)strcmp);
  cJSON *c = cJSON_AddObjectToObject(path, "communication");
  for (GList *l = keys; l; l = l->next)
    cJSON_AddNumberToObject(c, l->data, GPOINTER_TO_UINT(g_hash_table_lookup(comm, l->data)));
  g_list_free(keys);
  g_hash_table_destroy(comm);
}

cJSON *sim_scenario_report(const struct sim_scenario *sc, const struct plan *p,
                           const struct sim_result *healthy, const struct sim_result *run) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "file", sc->path);
  cJSON_AddNumberToObject(o, "seed", (double)sc->seed);
  cJSON_AddNumberToObject(o, "healthy_iteration_time_s", healthy->iteration_time);
  cJSON_AddNumberToObject(o, "iteration_time_s", run->iteration_time);
  cJSON_AddNumberToObject(o, "loss_fraction",
                          healthy->iteration_time > 0
                              ? run->iteration_time / healthy->iteration_time - 1
                              : 0);
  cJSON *m = cJSON_AddArrayToObject(o, "changed_devices");
  for (uint32_t k = 0; k < sc->n_marked; k++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "device", sc->marked[k]);
    cJSON_AddStringToObject(e, "change", sc->marked_label[k]);
    cJSON_AddItemToArray(m, e);
  }
  if (sc->jitter_sigma > 0)
    cJSON_AddStringToObject(o, "jitter", sc->jitter_per_kernel ? "per kernel" : "per device");
  report_delays(o, p, healthy, run);
  report_path(o, sc, p, run);
  return o;
}

char *sim_scenario_summary(const cJSON *report) {
  GString *g = g_string_new(NULL);
  double h = cJSON_GetNumberValue(cJSON_GetObjectItem(report, "healthy_iteration_time_s"));
  double t = cJSON_GetNumberValue(cJSON_GetObjectItem(report, "iteration_time_s"));
  g_string_append_printf(g, "  scenario       %s: %.6g ms against %.6g ms healthy (%+.2f%%)\n",
                         cJSON_GetStringValue(cJSON_GetObjectItem(report, "file")), t * 1e3,
                         h * 1e3,
                         100 * cJSON_GetNumberValue(cJSON_GetObjectItem(report, "loss_fraction")));
  const cJSON *path = cJSON_GetObjectItem(report, "critical_path");
  g_string_append_printf(
      g, "  delay          %g devices end later; critical path %g instructions over",
      cJSON_GetNumberValue(cJSON_GetObjectItem(report, "delayed_devices")),
      cJSON_GetNumberValue(cJSON_GetObjectItem(path, "instructions")));
  const cJSON *d;
  uint32_t n = 0;
  cJSON_ArrayForEach(d, cJSON_GetObjectItem(path, "devices")) {
    if (n++ < 12)
      g_string_append_printf(g, " %g", d->valuedouble);
  }
  if (n > 12)
    g_string_append_printf(g, " ... (%u hops)", n);
  g_string_append(g, "\n  through        ");
  n = 0;
  cJSON_ArrayForEach(d, cJSON_GetObjectItem(path, "communication")) {
    g_string_append_printf(g, "%s%s x%g", n++ ? ", " : "", d->string, d->valuedouble);
  }
  g_string_append_printf(g, "%s; %.6g ms of it on the changed devices\n", n ? "" : "no communication",
                         1e3 * cJSON_GetNumberValue(
                                   cJSON_GetObjectItem(path, "seconds_on_changed_devices")));
  return g_string_free(g, FALSE);
}
