/* checkpoint: training state on disk. Every rank writes DIR/step-<k>/rank-<r>.ckpt (its
 * parameters, AdamW moments, the step and a fingerprint of the plan layout) through a temp
 * file, fsync and rename, with an FNV-1a checksum at the end; when all ranks have written,
 * rank 0 points DIR/latest at the step (also by rename), so a crash mid-write leaves the
 * previous checkpoint in force. Loading verifies everything and refuses what does not match. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../base/json.h"
#include "exec-impl.h"

#define MAGIC "PIPERCKP"
#define VERSION 1

struct header {
  char magic[8];
  uint32_t version, rank, n_ranks, step;
  uint64_t fingerprint, n_params, seed;
};

static bool io_fail(GError **err, const char *path, const char *what) {
  g_set_error(err, PIPER_ERROR, PIPER_ERROR_RUNTIME, "%s: %s: %s", path, what, strerror(errno));
  return false;
}

static bool write_all(FILE *f, const void *p, size_t n, uint64_t *h) {
  *h = piper_fnv1a(*h, p, n);
  return fwrite(p, 1, n, f) == n;
}

bool exec_checkpoint_write(const struct exec_state *s, const char *dir, uint32_t step,
                           GError **err) {
  const struct exec_device *d = s->dev;
  char *sub = g_strdup_printf("%s/step-%u", dir, step);
  char *path = g_strdup_printf("%s/rank-%u.ckpt", sub, d->device);
  bool ok = false;
  struct piper_out out = {0};
  float *host = NULL;
  if (g_mkdir_with_parents(sub, 0755) != 0) {
    io_fail(err, sub, "cannot create the checkpoint directory");
    goto out;
  }
  if (!piper_out_open(&out, path, err))
    goto out;
  out.sync = true;
  struct header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, MAGIC, 8);
  h.version = VERSION;
  h.rank = d->device;
  h.n_ranks = d->plan->n_devices;
  h.step = step;
  h.fingerprint = exec_device_fingerprint(d);
  h.n_params = d->n_params;
  h.seed = s->o->seed;
  uint64_t sum = PIPER_FNV1A_INIT;
  size_t n = (size_t)d->n_params;
  host = g_new(float, n ? n : 1);
  bool wrote = write_all(out.f, &h, sizeof h, &sum);
  const float *arrays[3] = {s->params, s->adam_m, s->adam_v};
  for (int a = 0; a < 3 && wrote; a++) {
    exec_backend_to_host(s->b, host, arrays[a], n * sizeof(float));
    wrote = write_all(out.f, host, n * sizeof(float), &sum);
  }
  uint64_t tail = sum;
  wrote = wrote && fwrite(&tail, sizeof tail, 1, out.f) == 1;
  if (!wrote) { /* piper_out_close reports the stream's error naming the file */
    ok = piper_out_close(&out, err);
    if (ok)
      ok = io_fail(err, path, "write failed");
    goto out;
  }
  ok = piper_out_close(&out, err);
out:
  if (out.f)
    piper_out_abandon(&out);
  g_free(host);
  g_free(sub);
  g_free(path);
  return ok;
}

bool exec_checkpoint_commit(const char *dir, uint32_t step, uint32_t n_ranks, GError **err) {
  (void)n_ranks;
  char *path = g_strdup_printf("%s/latest", dir);
  char text[32];
  int len = g_snprintf(text, sizeof text, "step-%u\n", step);
  bool ok = piper_write_file_durable(path, text, (size_t)len, err);
  g_free(path);
  return ok;
}

/* The step directory a resume reads: DIR/latest names it, or DIR is one itself. */
static char *resolve(const char *dir, uint32_t rank, GError **err) {
  char *latest = g_strdup_printf("%s/latest", dir);
  gchar *text = NULL;
  char *path = NULL;
  if (g_file_get_contents(latest, &text, NULL, NULL)) {
    g_strstrip(text);
    if (!g_str_has_prefix(text, "step-") || strchr(text, '/'))
      piper_input_error(err, "%s: does not name a checkpoint step (\"%s\")", latest, text);
    else
      path = g_strdup_printf("%s/%s/rank-%u.ckpt", dir, text, rank);
  } else {
    char *direct = g_strdup_printf("%s/rank-%u.ckpt", dir, rank);
    if (g_file_test(direct, G_FILE_TEST_EXISTS))
      path = g_strdup(direct);
    else
      piper_input_error(err, "%s: no checkpoint here (no \"latest\" file and no rank-%u.ckpt)", dir,
                        rank);
    g_free(direct);
  }
  g_free(text);
  g_free(latest);
  return path;
}

bool exec_checkpoint_read(struct exec_state *s, const char *dir, uint32_t *step, GError **err) {
  const struct exec_device *d = s->dev;
  char *path = resolve(dir, d->device, err);
  if (!path)
    return false;
  gchar *data = NULL;
  gsize len = 0;
  GError *io = NULL;
  bool ok = false;
  if (!g_file_get_contents(path, &data, &len, &io)) {
    piper_input_error(err, "%s: cannot read: %s", path, io->message);
    g_error_free(io);
    goto out;
  }
  struct header h;
  size_t n = (size_t)d->n_params, body = 3 * n * sizeof(float);
  if (len < sizeof h + sizeof(uint64_t)) {
    piper_input_error(err, "%s: truncated (%zu bytes)", path, (size_t)len);
    goto out;
  }
  memcpy(&h, data, sizeof h);
  if (memcmp(h.magic, MAGIC, 8) != 0 || h.version != VERSION) {
    piper_input_error(err, "%s: not a piper-exec checkpoint (version %u)", path, VERSION);
    goto out;
  }
  uint64_t stored;
  memcpy(&stored, data + len - sizeof stored, sizeof stored);
  if (piper_fnv1a(PIPER_FNV1A_INIT, data, len - sizeof stored) != stored) {
    piper_input_error(err, "%s: checksum mismatch: the file is corrupt", path);
    goto out;
  }
  if (h.rank != d->device || h.n_ranks != d->plan->n_devices) {
    piper_input_error(err, "%s: written by rank %u of %u, read by rank %u of %u", path, h.rank,
                      h.n_ranks, d->device, d->plan->n_devices);
    goto out;
  }
  if (h.fingerprint != exec_device_fingerprint(d) || h.n_params != d->n_params ||
      len != sizeof h + body + sizeof stored) {
    piper_input_error(err,
                      "%s: written for a different model or parameter layout (fingerprint "
                      "%016llx, this plan %016llx)",
                      path, (unsigned long long)h.fingerprint,
                      (unsigned long long)exec_device_fingerprint(d));
    goto out;
  }
  if (h.seed != s->o->seed) {
    piper_input_error(err, "%s: written with --seed %llu, this run has --seed %llu", path,
                      (unsigned long long)h.seed, (unsigned long long)s->o->seed);
    goto out;
  }
  float *arrays[3] = {s->params, s->adam_m, s->adam_v};
  for (int a = 0; a < 3; a++)
    exec_backend_from_host(s->b, arrays[a], data + sizeof h + (size_t)a * n * sizeof(float),
                           n * sizeof(float));
  *step = h.step;
  ok = true;
out:
  g_free(data);
  g_free(path);
  return ok;
}
