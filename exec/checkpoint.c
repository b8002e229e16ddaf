/* checkpoint: training state on disk. Every rank writes DIR/step-<k>/rank-<r>.ckpt: a header,
 * a JSON description of everything that decides how the state is laid out and what the next
 * step computes (checkpoint_meta.c), then its parameters and AdamW moments, and an FNV-1a
 * checksum of all that. Each file goes through a temp file, fsync, rename and a directory fsync; when all
 * ranks have written, rank 0 points DIR/latest at the step (also by rename), so a crash
 * mid-write leaves the previous checkpoint in force. Loading verifies everything, compares the
 * description with this run's field by field, and refuses what it could not continue exactly,
 * naming the difference; the changes a user may make on purpose (learning rate, ...) pass only
 * when allowed (exec_options.resume_allow_change) and are reported. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "../base/json.h"
#include "exec-impl.h"

#define MAGIC "PIPERCKP"
#define VERSION 2

/* Version 2: then meta_bytes of JSON, 3 * n_params floats and the uint64 checksum. */
struct header {
  char magic[8];
  uint32_t version, meta_bytes;
  uint64_t n_params, reserved;
};

_Static_assert(sizeof(struct header) == EXEC_CHECKPOINT_HEADER_BYTES, "checkpoint header size");

/* Largest description read back: a plan's placement is small. */
#define META_MAX_BYTES (16u << 20)

/* ---- the file ---------------------------------------------------------------------------- */

void exec_checkpoint_file_clear(struct exec_checkpoint_file *f) {
  if (!f)
    return;
  exec_checkpoint_meta_clear(&f->meta);
  memset(f, 0, sizeof *f);
}

bool exec_checkpoint_verify(const char *path, const void *bytes, size_t len, GError **err) {
  uint64_t stored;
  if (len < sizeof(struct header) + sizeof stored)
    return piper_input_error(err, "%s: truncated (%zu bytes)", path, len);
  memcpy(&stored, (const char *)bytes + len - sizeof stored, sizeof stored);
  if (piper_fnv1a(PIPER_FNV1A_INIT, bytes, len - sizeof stored) != stored)
    return piper_input_error(err, "%s: checksum mismatch: the file is corrupt", path);
  return true;
}

static bool parse(const char *path, const void *bytes, size_t len, struct exec_checkpoint_file *f,
                  bool verify, GError **err) {
  const char *data = bytes;
  memset(f, 0, sizeof *f);
  struct header h;
  uint64_t stored;
  if (len < 8 || memcmp(data, MAGIC, 8) != 0)
    return piper_input_error(err, "%s: not a piper-exec checkpoint", path);
  if (len < sizeof h + sizeof stored)
    return piper_input_error(err, "%s: truncated (%zu bytes)", path, len);
  memcpy(&h, data, sizeof h);
  if (h.version == 1)
    return piper_input_error(err,
                             "%s: written by an older piper-exec (checkpoint version 1), which "
                             "does not record the plan's sharding: it cannot be resumed exactly",
                             path);
  if (h.version != VERSION)
    return piper_input_error(err, "%s: checkpoint version %u (this piper-exec reads version %u)",
                             path, h.version, VERSION);
  if (verify && !exec_checkpoint_verify(path, bytes, len, err))
    return false;
  size_t room = len - sizeof h - sizeof stored;
  if (h.meta_bytes > META_MAX_BYTES || h.meta_bytes > room ||
      h.n_params > (room - h.meta_bytes) / (3 * sizeof(float)) ||
      h.meta_bytes + 3 * h.n_params * sizeof(float) != room)
    return piper_input_error(err,
                             "%s: %zu bytes do not hold a description of %u bytes and 3 arrays "
                             "of %llu parameters",
                             path, len, h.meta_bytes, (unsigned long long)h.n_params);
  if (!exec_checkpoint_meta_from_json(path, data + sizeof h, h.meta_bytes, &f->meta, err)) {
    exec_checkpoint_file_clear(f);
    return false;
  }
  if (f->meta.n_params != h.n_params) {
    exec_checkpoint_file_clear(f);
    return piper_input_error(err, "%s: the description says %llu parameters, the header %llu", path,
                             (unsigned long long)f->meta.n_params, (unsigned long long)h.n_params);
  }
  f->version = h.version;
  f->arrays = data + sizeof h + h.meta_bytes;
  return true;
}

bool exec_checkpoint_parse(const char *path, const void *bytes, size_t len,
                           struct exec_checkpoint_file *f, GError **err) {
  return parse(path, bytes, len, f, true, err);
}

bool exec_checkpoint_parse_unverified(const char *path, const void *bytes, size_t len,
                                      struct exec_checkpoint_file *f, GError **err) {
  return parse(path, bytes, len, f, false, err);
}

/* ---- writing ----------------------------------------------------------------------------- */

static bool io_fail(GError **err, const char *path, const char *what) {
  return piper_runtime_error(err, "%s: %s: %s", path, what, strerror(errno));
}

static bool write_all(FILE *f, const void *p, size_t n, uint64_t *h) {
  *h = piper_fnv1a(*h, p, n);
  return fwrite(p, 1, n, f) == n;
}

/* A new directory's entry must be durable before anything inside it is relied on. */
static bool sync_dir(const char *dir, GError **err) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  bool ok = fd >= 0 && fsync(fd) == 0;
  if (!ok)
    io_fail(err, dir, "cannot sync directory");
  if (fd >= 0)
    close(fd);
  return ok;
}

static bool write_body(const struct exec_state *s, FILE *f, const char *meta, uint64_t *sum,
                       float *host) {
  size_t n = (size_t)s->dev->n_params;
  struct header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, MAGIC, 8);
  h.version = VERSION;
  h.meta_bytes = (uint32_t)strlen(meta);
  h.n_params = n;
  bool wrote = write_all(f, &h, sizeof h, sum) && write_all(f, meta, h.meta_bytes, sum);
  /* The file keeps the flat layout whatever the sharding: what this device does not store is
   * written as it always read, NaN parameters (ZeRO-3's stale part) and zero moments. */
  const float *arrays[3] = {s->params, s->adam_m, s->adam_v};
  const enum exec_store which[3] = {EXEC_STORE_PARAMS, EXEC_STORE_STATE, EXEC_STORE_STATE};
  float *store = g_new(float, n + 1);
  for (int a = 0; a < 3 && wrote; a++) {
    exec_backend_to_host(s->b, store, arrays[a], s->dev->n_store[which[a]] * sizeof(float));
    exec_store_expand(s->dev, which[a], store, host, a == 0 ? NAN : 0.0f);
    wrote = write_all(f, host, n * sizeof(float), sum);
  }
  g_free(store);
  uint64_t tail = *sum;
  return wrote && fwrite(&tail, sizeof tail, 1, f) == 1;
}

/* Rank 0: the tensors by name and global shape, what the rank files' slices are slices of. */
static bool write_tensor_names(const struct exec_state *s, const char *sub, GError **err) {
  char *text = exec_hf_map_json(s->xm->m);
  if (!text)
    return true;
  char *path = g_strdup_printf("%s/tensors.json", sub);
  bool ok = piper_write_file_durable(path, text, strlen(text), err);
  g_free(path);
  cJSON_free(text);
  return ok;
}

bool exec_checkpoint_write(const struct exec_state *s, const char *dir, uint32_t step,
                           GError **err) {
  const struct exec_device *d = s->dev;
  char *sub = g_strdup_printf("%s/step-%u", dir, step);
  char *path = g_strdup_printf("%s/rank-%u.ckpt", sub, d->device);
  bool ok = false;
  struct piper_out out = {0};
  struct exec_checkpoint_meta m;
  exec_checkpoint_describe(s->o, d, s->data, step, &m);
  char *meta = exec_checkpoint_meta_to_json(&m);
  float *host = g_new(float, d->n_params ? d->n_params : 1);
  if (g_mkdir_with_parents(sub, 0755) != 0) {
    io_fail(err, sub, "cannot create the checkpoint directory");
    goto out;
  }
  if (!sync_dir(dir, err) || !piper_out_open(&out, path, err))
    goto out;
  out.sync = true;
  uint64_t sum = PIPER_FNV1A_INIT;
  if (!write_body(s, out.f, meta, &sum, host)) {
    /* piper_out_close reports the stream's error naming the file */
    ok = piper_out_close(&out, err);
    if (ok)
      ok = io_fail(err, path, "write failed");
    goto out;
  }
  ok = piper_out_close(&out, err);
  if (ok && d->device == 0)
    ok = write_tensor_names(s, sub, err);
out:
  if (out.f)
    piper_out_abandon(&out);
  cJSON_free(meta);
  exec_checkpoint_meta_clear(&m);
  g_free(host);
  g_free(sub);
  g_free(path);
  return ok;
}

/* "step-<k>" exactly: *step = k. */
static bool step_dir_name(const char *name, uint32_t *step) {
  if (!g_str_has_prefix(name, "step-") || !name[5])
    return false;
  return piper_parse_u32(name + 5, 0, UINT32_MAX, step) && g_ascii_isdigit(name[5]);
}

/* A step directory's rank-<r>.ckpt.tmp files: this rank's, or every rank's. */
static void remove_tmp_files(const char *dir, uint32_t rank, bool all_ranks) {
  GDir *d = g_dir_open(dir, 0, NULL);
  const char *name;
  char *mine = g_strdup_printf("rank-%u.ckpt.tmp", rank);
  while (d && (name = g_dir_read_name(d))) {
    bool any = g_str_has_prefix(name, "rank-") && g_str_has_suffix(name, ".ckpt.tmp");
    if (all_ranks ? any : strcmp(name, mine) == 0) {
      char *path = g_build_filename(dir, name, NULL);
      g_remove(path);
      g_free(path);
    }
  }
  if (d)
    g_dir_close(d);
  g_free(mine);
}

bool exec_checkpoint_begin(const char *dir, uint32_t rank, GError **err) {
  if (g_mkdir_with_parents(dir, 0755) != 0)
    return io_fail(err, dir, "cannot create the checkpoint directory");
  /* rank 0 clears every writer's leftovers (and latest.tmp); each rank its own, in case the
   * ranks do not share the directory */
  bool all = rank == 0;
  if (all) {
    char *latest = g_build_filename(dir, "latest.tmp", NULL);
    g_remove(latest);
    g_free(latest);
  }
  GDir *d = g_dir_open(dir, 0, NULL);
  const char *name;
  uint32_t k;
  while (d && (name = g_dir_read_name(d))) {
    if (!step_dir_name(name, &k))
      continue;
    char *sub = g_build_filename(dir, name, NULL);
    remove_tmp_files(sub, rank, all);
    g_free(sub);
  }
  if (d)
    g_dir_close(d);
  return true;
}

/* Removes a step directory's checkpoint files, then the directory (left when it holds anything
 * else: it is not ours to delete). */
static bool remove_step_dir(const char *sub, GError **err) {
  GDir *d = g_dir_open(sub, 0, NULL);
  const char *name;
  bool ok = true;
  while (ok && d && (name = g_dir_read_name(d))) {
    bool ours = strcmp(name, "tensors.json") == 0 || strcmp(name, "tensors.json.tmp") == 0 ||
                (g_str_has_prefix(name, "rank-") &&
                 (g_str_has_suffix(name, ".ckpt") || g_str_has_suffix(name, ".ckpt.tmp")));
    if (!ours)
      continue;
    char *path = g_build_filename(sub, name, NULL);
    if (g_remove(path) != 0 && errno != ENOENT)
      ok = io_fail(err, path, "cannot remove an old checkpoint");
    g_free(path);
  }
  if (d)
    g_dir_close(d);
  if (ok)
    g_rmdir(sub);
  return ok;
}

/* Keeps step directories `step` (now in force) and the keep - 1 before it; those after it
 * belong to an earlier run that went further and are no longer reachable from "latest". */
static bool prune(const char *dir, uint32_t step, uint32_t keep, GError **err) {
  GArray *steps = g_array_new(FALSE, FALSE, sizeof(uint32_t));
  GDir *d = g_dir_open(dir, 0, NULL);
  const char *name;
  uint32_t k;
  while (d && (name = g_dir_read_name(d)))
    if (step_dir_name(name, &k))
      g_array_append_val(steps, k);
  if (d)
    g_dir_close(d);
  if (steps->len)
    qsort(steps->data, steps->len, sizeof(uint32_t), piper_cmp_u32);
  uint32_t kept = 0;
  bool ok = true;
  for (guint i = steps->len; i-- > 0 && ok;) {
    uint32_t st = g_array_index(steps, uint32_t, i);
    if (st <= step && kept < keep) {
      kept++;
      continue;
    }
    char *sub = g_strdup_printf("%s/step-%u", dir, st);
    ok = remove_step_dir(sub, err);
    g_free(sub);
  }
  g_array_free(steps, TRUE);
  return ok;
}

bool exec_checkpoint_commit(const char *dir, uint32_t step, uint32_t keep, GError **err) {
  char *path = g_strdup_printf("%s/latest", dir);
  char text[32];
  int len = g_snprintf(text, sizeof text, "step-%u\n", step);
  bool ok = piper_write_file_durable(path, text, (size_t)len, err);
  g_free(path);
  return ok && (keep == 0 || prune(dir, step, keep, err));
}

/* ---- reading ----------------------------------------------------------------------------- */

/* The step directory a resume reads: DIR/latest names it, or DIR is one itself. *named gets
 * the step its directory's name says (step-<k>), UINT32_MAX when DIR has another name. */
static char *resolve(const char *dir, uint32_t rank, uint32_t *named, GError **err) {
  *named = UINT32_MAX;
  char *latest = g_strdup_printf("%s/latest", dir);
  gchar *text = NULL;
  char *path = NULL;
  if (g_file_get_contents(latest, &text, NULL, NULL)) {
    g_strstrip(text);
    uint32_t k;
    if (!step_dir_name(text, &k)) {
      char *q = piper_quote(text, strlen(text), 40);
      piper_input_error(err, "%s: does not name a checkpoint step (%s)", latest, q);
      g_free(q);
    } else {
      path = g_strdup_printf("%s/%s/rank-%u.ckpt", dir, text, rank);
      *named = k;
    }
  } else {
    char *direct = g_strdup_printf("%s/rank-%u.ckpt", dir, rank);
    if (g_file_test(direct, G_FILE_TEST_EXISTS)) {
      path = g_strdup(direct);
      char *base = g_path_get_basename(dir);
      uint32_t k;
      if (step_dir_name(base, &k))
        *named = k;
      g_free(base);
    } else
      piper_input_error(err, "%s: no checkpoint here (no \"latest\" file and no rank-%u.ckpt)", dir,
                        rank);
    g_free(direct);
  }
  g_free(text);
  g_free(latest);
  return path;
}

bool exec_checkpoint_read(struct exec_state *s, const char *dir, uint32_t *step, GString *notes,
                          GError **err) {
  const struct exec_device *d = s->dev;
  uint32_t allow = 0;
  if (!exec_resume_allow_parse(s->o->resume_allow_change, &allow, err))
    return false;
  uint32_t named;
  if (allow & EXEC_RESUME_ALLOW_LAYOUT) {
    /* rank 0's file is there whatever the layout; its directory holds every rank's */
    char *first = resolve(dir, 0, &named, err);
    char *sub = first ? g_path_get_dirname(first) : NULL;
    bool ok = sub && exec_checkpoint_reshard(s, sub, allow, step, notes, err);
    if (ok && named != UINT32_MAX && *step != named)
      ok = piper_input_error(err, "%s: the checkpoint describes step %u but is stored as step-%u",
                             first, *step, named);
    g_free(sub);
    g_free(first);
    return ok;
  }
  char *path = resolve(dir, d->device, &named, err);
  if (!path)
    return false;
  size_t len = 0;
  char *data = piper_read_file(path, (size_t)1 << 40, &len, err);
  struct exec_checkpoint_file f = {0};
  struct exec_checkpoint_meta now;
  exec_checkpoint_describe(s->o, d, s->data, 0, &now);
  bool ok = data && exec_checkpoint_parse(path, data, len, &f, err) &&
            exec_checkpoint_compare(path, &f.meta, &now, allow, notes, err);
  /* The description's step is what the run continues from (the data position, the LR
   * schedule); the directory's name is what latest and pruning go by: they must agree. */
  if (ok && named != UINT32_MAX && f.meta.step != named)
    ok = piper_input_error(err, "%s: the checkpoint describes step %u but is stored as step-%u",
                           path, f.meta.step, named);
  if (ok) {
    size_t n = (size_t)d->n_params;
    float *arrays[3] = {s->params, s->adam_m, s->adam_v};
    const enum exec_store which[3] = {EXEC_STORE_PARAMS, EXEC_STORE_STATE, EXEC_STORE_STATE};
    float *flat = g_new(float, n + 1), *store = g_new(float, n + 1);
    for (int a = 0; a < 3; a++) {
      memcpy(flat, f.arrays + (size_t)a * n * sizeof(float), n * sizeof(float));
      exec_store_compact(d, which[a], flat, store);
      exec_backend_from_host(s->b, arrays[a], store, d->n_store[which[a]] * sizeof(float));
    }
    g_free(flat);
    g_free(store);
    *step = f.meta.step;
  }
  exec_checkpoint_file_clear(&f);
  exec_checkpoint_meta_clear(&now);
  g_free(data);
  g_free(path);
  return ok;
}
