/* checkpoint_reshard: resuming a checkpoint on another layout (docs/exec.md, "Checkpoints
 * that reshard"; --resume-allow-change layout). Every rank file records, for each segment it
 * held, the model ops in it with where each op's slice starts in the segment's block and how
 * long it is, the device's TP slice and expert split, and its ZeRO buckets (checkpoint_meta.c).
 * That places every stored element at (op, index in the op's one-device block), the same
 * coordinates params.c initialises by and hf.c names tensors by, whatever the PP, DP, TP, EP
 * degrees, ZeRO level or schedule. A new device walks the ops it holds: for each element it
 * stores, the lowest old rank holding a current copy (of the parameter; of the moments, which
 * ZeRO-1 and up keep on one shard only) gives its value. Files are mapped, so pages of slices
 * nobody here needs are not read; a file is checksummed when it is first read from. */
#include <string.h>

#include "exec-impl.h"

struct old_rank {
  char *path;
  GMappedFile *map;
  struct exec_checkpoint_file f;
  bool verified;
};

struct reshard {
  struct exec_state *s;
  struct old_rank *old;
  uint32_t n_old;
  float *flat[3]; /* this device's flat parameters, m, v */
  GError **err;
  bool failed;
};

static const enum exec_store store_of[3] = {EXEC_STORE_PARAMS, EXEC_STORE_STATE, EXEC_STORE_STATE};

/* Whether an old rank kept a current copy of flat element i of array a (0 parameters, 1 and 2
 * the moments): not when a ZeRO bucket shards that array and i lies outside its shard. */
static bool old_current(const struct exec_checkpoint_meta *m, int a, uint64_t i) {
  for (uint32_t b = 0; b < m->n_buckets; b++) {
    const struct exec_checkpoint_bucket *k = &m->buckets[b];
    if (i < k->offset || i >= k->offset + k->count)
      continue;
    bool sharded = a == 0 ? k->zero == 3 : k->zero >= 1;
    uint64_t lo = k->offset + (uint64_t)k->rank * k->shard;
    return !sharded || (i >= lo && i < lo + k->shard);
  }
  return true;
}

static bool open_old(struct old_rank *o, const char *dir, uint32_t r, GError **err) {
  o->path = g_strdup_printf("%s/rank-%u.ckpt", dir, r);
  GError *e = NULL;
  o->map = g_mapped_file_new(o->path, FALSE, &e);
  if (!o->map) {
    piper_input_error(err, "resume: %s: cannot read: %s", o->path, e->message);
    g_error_free(e);
    return false;
  }
  return exec_checkpoint_parse_unverified(o->path, g_mapped_file_get_contents(o->map),
                                          g_mapped_file_get_length(o->map), &o->f, err);
}

static void close_old(struct old_rank *o) {
  exec_checkpoint_file_clear(&o->f);
  if (o->map)
    g_mapped_file_unref(o->map);
  g_free(o->path);
}

/* What every file must share with this run: the model, the global batch, the seed; the
 * optimizer and data as --resume-allow-change says. */
static bool compatible(const struct old_rank *o, const struct exec_checkpoint_meta *first,
                       const struct exec_checkpoint_meta *now, uint32_t allow, GString *notes,
                       GError **err) {
  const struct exec_checkpoint_meta *w = &o->f.meta;
  if (!w->arch_hash)
    return piper_input_error(err,
                             "resume: %s was written before checkpoints recorded their slices: "
                             "resume it on the layout that wrote it",
                             o->path);
  if (w->arch_hash != now->arch_hash)
    return piper_input_error(err, "resume: %s was written for another model (\"%s\", this run's "
                                  "\"%s\")", o->path, w->model, now->model);
  if (w->step != first->step || w->n_ranks != first->n_ranks)
    return piper_input_error(err, "resume: %s is step %u of %u ranks, rank 0's step %u of %u",
                             o->path, w->step, w->n_ranks, first->step, first->n_ranks);
  if (w->global_microbatches * w->microbatch_size != now->global_microbatches * now->microbatch_size ||
      w->seq_len != now->seq_len)
    return piper_input_error(err,
                             "resume: %s was written with a global batch of %u sequences of %u "
                             "tokens, this plan has %u of %u",
                             o->path, w->global_microbatches * w->microbatch_size, w->seq_len,
                             now->global_microbatches * now->microbatch_size, now->seq_len);
  if (w->seed != now->seed)
    return piper_input_error(err, "resume: %s was written with --seed %llu, this run has --seed %llu",
                             o->path, (unsigned long long)w->seed, (unsigned long long)now->seed);
  /* another layout runs another program: the schedule change comes with it */
  return exec_checkpoint_compare_allowed(o->path, w, now, allow | EXEC_RESUME_ALLOW_SCHEDULE,
                                         notes, err);
}

/* Element i of array a in an old file, checksummed on first use. */
static bool old_value(struct reshard *R, struct old_rank *o, int a, uint64_t i, float *v) {
  if (!o->verified) {
    if (!exec_checkpoint_verify(o->path, g_mapped_file_get_contents(o->map),
                                g_mapped_file_get_length(o->map), R->err))
      return false;
    o->verified = true;
  }
  memcpy(v, o->f.arrays + ((size_t)a * o->f.meta.n_params + i) * sizeof(float), sizeof(float));
  return true;
}

struct op_need {
  uint32_t op;
  int64_t *local;  /* [count]: flat index here of each element of the op's block, -1 */
  uint8_t *wanted; /* [count]: bit a set while array a still needs the element */
};

static void note_local(const struct exec_state *s, uint32_t op, uint64_t local, uint64_t g,
                       void *data) {
  struct op_need *n = data;
  (void)s;
  if (op == n->op)
    n->local[g] = (int64_t)local;
}

/* Fills what op (whose elements come from the old files' op src) needs from one old rank's
 * segment entry ops[3 * j ..]. */
static bool take_from(struct reshard *R, struct old_rank *o, const struct exec_checkpoint_segment *sg,
                      uint32_t j, uint32_t src, struct op_need *n) {
  const struct exec_model *xm = R->s->xm;
  const struct exec_checkpoint_meta *w = &o->f.meta;
  uint64_t off = sg->ops[3 * j + 1], cnt = sg->ops[3 * j + 2];
  uint64_t total = xm->m->ops[src].param_count;
  /* experts the writer ran whole under its TP (expert TP 1, exec_segment_tp): their local
   * experts' blocks hold 1/EP of the op, not of its TP slice */
  uint32_t tp = w->tp_degree ? w->tp_degree : 1;
  if (sg->ep_size > 1 && cnt * sg->ep_size == total)
    tp = 1;
  for (uint64_t i = 0; i < cnt; i++) {
    uint64_t g = exec_tp_full_index(xm, &xm->m->ops[src], tp, w->tp_rank,
                                    (uint64_t)sg->ep_rank * cnt + i);
    if (g >= total || n->local[g] < 0 || !n->wanted[g])
      continue;
    uint64_t from = sg->offset + off + i;
    for (int a = 0; a < 3; a++) {
      if (!(n->wanted[g] & (1u << a)) || !old_current(w, a, from))
        continue;
      if (!old_value(R, o, a, from, &R->flat[a][n->local[g]]))
        return false;
      n->wanted[g] &= (uint8_t) ~(1u << a);
    }
  }
  return true;
}

/* A segment of this device that holds op, or IR_NONE. */
static uint32_t holding_segment(const struct exec_state *s, uint32_t op) {
  const struct model *m = s->xm->m;
  for (uint32_t seg = 0; seg < m->n_segments; seg++)
    if (s->dev->holds[seg] && op >= m->segments[seg].op_first &&
        op < m->segments[seg].op_first + m->segments[seg].op_count)
      return seg;
  return IR_NONE;
}

static bool fill_op(struct reshard *R, uint32_t op, struct op_need *n) {
  struct exec_state *s = R->s;
  const struct exec_device *d = s->dev;
  uint32_t seg = holding_segment(s, op);
  uint64_t count = s->xm->m->ops[op].param_count;
  if (seg == IR_NONE || !count)
    return true;
  /* the LM head's copy of a tied table trains as the table (its gradient is summed with it):
   * its values and moments are the embedding's, whichever layout kept a copy */
  uint32_t src = op == s->xm->head_op && s->xm->tied_copy ? s->xm->embedding_op : op;
  n->op = op;
  for (uint64_t g = 0; g < count; g++)
    n->local[g] = -1;
  exec_for_each_param(s, seg, note_local, n);
  for (uint64_t g = 0; g < count; g++) {
    n->wanted[g] = 0;
    if (n->local[g] < 0)
      continue;
    n->local[g] += (int64_t)d->param_offset[seg];
    for (int a = 0; a < 3; a++)
      if (exec_store_index(d, store_of[a], (uint64_t)n->local[g]) != EXEC_NOT_STORED)
        n->wanted[g] |= (uint8_t)(1u << a);
  }
  for (uint32_t r = 0; r < R->n_old; r++) {
    const struct exec_checkpoint_meta *w = &R->old[r].f.meta;
    for (uint32_t k = 0; k < w->n_segments; k++)
      for (uint32_t j = 0; j < w->segments[k].n_ops; j++)
        if (w->segments[k].ops[3 * j] == src &&
            !take_from(R, &R->old[r], &w->segments[k], j, src, n))
          return false;
  }
  for (uint64_t g = 0; g < count; g++)
    if (n->wanted[g])
      return piper_input_error(R->err,
                               "resume: no rank of the checkpoint holds element %llu of op %u "
                               "(%s, layer %d)",
                               (unsigned long long)g, op,
                               model_op_kind_name(s->xm->m->ops[op].kind), s->xm->m->ops[op].layer);
  return true;
}

static bool fill_all(struct reshard *R) {
  const struct model *m = R->s->xm->m;
  uint64_t most = 1;
  for (uint32_t op = 0; op < m->n_ops; op++)
    most = MAX(most, m->ops[op].param_count);
  struct op_need n = {0, g_new(int64_t, most), g_new(uint8_t, most)};
  bool ok = true;
  for (uint32_t op = 0; op < m->n_ops && ok; op++)
    ok = fill_op(R, op, &n);
  g_free(n.local);
  g_free(n.wanted);
  return ok;
}

static bool open_all(struct reshard *R, const char *dir, const struct exec_checkpoint_meta *now,
                     uint32_t allow, GString *notes) {
  struct old_rank first = {0};
  bool ok = open_old(&first, dir, 0, R->err);
  R->n_old = ok ? first.f.meta.n_ranks : 0;
  if (ok && R->n_old == 0)
    ok = piper_input_error(R->err, "resume: %s says it was written by 0 ranks", first.path);
  if (ok) {
    R->old = g_new0(struct old_rank, R->n_old);
    R->old[0] = first;
    first = (struct old_rank){0};
  }
  for (uint32_t r = 1; ok && r < R->n_old; r++)
    ok = open_old(&R->old[r], dir, r, R->err);
  GString *scratch = g_string_new(NULL); /* rank 0's file says the changes, once */
  for (uint32_t r = 0; ok && r < R->n_old; r++)
    ok = compatible(&R->old[r], &R->old[0].f.meta, now, allow, r == 0 ? notes : scratch, R->err);
  g_string_free(scratch, TRUE);
  close_old(&first);
  return ok;
}

bool exec_checkpoint_reshard(struct exec_state *s, const char *step_dir, uint32_t allow,
                             uint32_t *step, GString *notes, GError **err) {
  const struct exec_device *d = s->dev;
  struct reshard R = {.s = s, .err = err};
  struct exec_checkpoint_meta now;
  exec_checkpoint_describe(s->o, d, s->data, 0, &now);
  GString *mine = g_string_new(NULL);
  bool ok = open_all(&R, step_dir, &now, allow, mine);
  size_t n = (size_t)d->n_params + 1;
  for (int a = 0; a < 3; a++)
    R.flat[a] = g_new0(float, n);
  if (ok)
    ok = fill_all(&R);
  if (ok) {
    float *store = g_new(float, n);
    float *arrays[3] = {s->params, s->adam_m, s->adam_v};
    for (int a = 0; a < 3; a++) {
      exec_store_compact(d, store_of[a], R.flat[a], store);
      exec_backend_from_host(s->b, arrays[a], store, d->n_store[store_of[a]] * sizeof(float));
    }
    g_free(store);
    *step = R.old[0].f.meta.step;
    if (mine->len)
      g_string_append_printf(notes, "%s%s", notes->len ? ", " : "", mine->str);
    g_string_append_printf(notes, "%sthe layout of its %u ranks resharded",
                           notes->len ? ", " : "", R.n_old);
  }
  for (uint32_t r = 0; r < R.n_old && R.old; r++)
    close_old(&R.old[r]);
  g_free(R.old);
  for (int a = 0; a < 3; a++)
    g_free(R.flat[a]);
  g_string_free(mine, TRUE);
  exec_checkpoint_meta_clear(&now);
  return ok;
}
