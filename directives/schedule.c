/* schedule: the schedule builders (docs/design.md, "The directive phase order") and the harness
 * that puts their `order` directives into a directive program. The CSV interchange lives in
 * schedule_csv.c.
 *
 * Conventions.
 * - A stage is a PP region index. An action is (stage, micro-batch, pass); a rank's schedule is
 *   its list of slots, one action or two that may interleave (an overlapped F&B).
 * - Builders work on pipeline positions p = 0..R-1 and map them to physical ranks through the
 *   layout, so any numbering of the ranks works as long as the layout has the family's shape:
 *     one stage per rank (gpipe, 1f1b, zerobubble, dualpipe): position p holds stage p;
 *     loop (interleaved_1f1b, interleaved_zerobubble): v = stages / R >= 2, stage s is on the rank of stage s mod R, so
 *       position p holds stages p, p+R, ..., p+(v-1)R;
 *     V (zbv, dualpipev): 2R stages, stage 2R-1-s is on the rank of stage s, so position p holds
 *       stages p and 2R-1-p.
 * - DualPipe runs two copies of an R-stage model in opposite directions. The IR has one copy,
 *   so the copies are told apart by micro-batch: micro-batches 0..M/2-1 belong to copy A and go
 *   down (stage s on the rank that holds stage s in the layout), micro-batches M/2..M-1 belong to
 *   copy B and go up (stage s on the rank that holds stage R-1-s). Actions keep PP = the region
 *   index in both copies; rank r thus runs stage r for copy A and stage R-1-r for copy B. The
 *   harness places copy B's micro-batches accordingly (place {"PP": s, "MB": m}).
 * - Dependencies every builder respects (checked by the unit tests): F(s,m) after F(s-1,m);
 *   B or BI of (s,m) after F(s,m) and after the B/BI of (s+1,m); BW(s,m) after BI(s,m). */
#include "schedule.h"

#include <string.h>

#include "../base/json.h"
#include "schedule-impl.h"

static const char *const family_names[SCHED_FAMILY_COUNT] = {
    "gpipe",     "1f1b",       "interleaved_1f1b",       "zerobubble",
    "zbv",       "dualpipe",   "dualpipev",              "interleaved_zerobubble",
    "custom"};

const char *sched_family_name(enum sched_family f) {
  return (unsigned)f < SCHED_FAMILY_COUNT ? family_names[f] : "?";
}

bool sched_family_parse(const char *name, enum sched_family *out) {
  if (!name)
    return false;
  for (int i = 0; i < SCHED_FAMILY_COUNT; i++)
    if (strcmp(name, family_names[i]) == 0) {
      if (out)
        *out = (enum sched_family)i;
      return true;
    }
  return false;
}

void sched_program_free(struct sched_program *s) {
  if (!s)
    return;
  for (uint32_t r = 0; r < s->n_ranks; r++)
    g_free(s->ranks[r].slots);
  g_free(s->ranks);
  g_free(s->note);
  g_free(s);
}

/* ---- emitting ------------------------------------------------------------------------------ */

struct builder {
  struct sched_rows rows;
  const int32_t *pos_rank; /* physical rank of pipeline position p */
};

static struct sched_action act(int32_t stage, int32_t mb, enum ir_pass pass) {
  return (struct sched_action){.stage = stage, .mb = mb, .pass = pass};
}

static void emit(struct builder *b, uint32_t pos, struct sched_action a) {
  struct sched_slot s = {.n_actions = 1, .actions = {a}};
  sched_rows_push(&b->rows, (uint32_t)b->pos_rank[pos], &s);
}

static void emit2(struct builder *b, uint32_t pos, struct sched_action x, struct sched_action y) {
  struct sched_slot s = {.n_actions = 2, .actions = {x, y}};
  sched_rows_push(&b->rows, (uint32_t)b->pos_rank[pos], &s);
}

/* ---- builders ------------------------------------------------------------------------------ */

/* GPipe (Huang et al. 2019): all forwards, then all backwards in micro-batch order. Peak
 * activations M on every rank; bubble (R-1)(F+B) per rank. */
static void build_gpipe(struct builder *b, uint32_t R, uint32_t M) {
  for (uint32_t p = 0; p < R; p++) {
    for (uint32_t m = 0; m < M; m++)
      emit(b, p, act((int32_t)p, (int32_t)m, IR_PASS_F));
    for (uint32_t m = 0; m < M; m++)
      emit(b, p, act((int32_t)p, (int32_t)m, IR_PASS_B));
  }
}

/* 1F1B (PipeDream-flush, Narayanan et al. 2021): min(R-1-p, M) warm-up forwards, then one
 * forward and one backward alternately, then the remaining backwards. Same bubble as GPipe,
 * peak activations min(R-p, M) at position p. ZB-H1 is the same shape with the backward split
 * into BI and BW and position p holding back p of its BW (Qi et al. 2024, "Zero Bubble Pipeline
 * Parallelism", ZB-H1; PyTorch's _get_1f1b_rank_ops with enable_zero_bubble): the deferred BW
 * fill the cool-down, which cuts the bubble from (R-1)(F+B) to (R-1)(F+B-W) while the peak
 * stays R micro-batches, 1F1B's peak. */
static void build_1f1b(struct builder *b, uint32_t R, uint32_t M, bool zero_bubble) {
  for (uint32_t p = 0; p < R; p++) {
    int32_t s = (int32_t)p;
    uint32_t warmup = R - 1 - p < M ? R - 1 - p : M;
    uint32_t f = 0, bk = 0, w = 0, lag = p;
    enum ir_pass back = zero_bubble ? IR_PASS_BI : IR_PASS_B;
    for (; f < warmup; f++)
      emit(b, p, act(s, (int32_t)f, IR_PASS_F));
    while (bk < M) {
      if (f < M) {
        emit(b, p, act(s, (int32_t)f, IR_PASS_F));
        f++;
      }
      emit(b, p, act(s, (int32_t)bk, back));
      bk++;
      if (zero_bubble && bk - w > lag) {
        emit(b, p, act(s, (int32_t)w, IR_PASS_BW));
        w++;
      }
    }
    if (zero_bubble)
      for (; w < M; w++)
        emit(b, p, act(s, (int32_t)w, IR_PASS_BW));
  }
}

/* Interleaved 1F1B (Narayanan et al. 2021, §2.2; Megatron-LM's
 * forward_backward_pipelining_with_interleaving): v chunks per rank in a loop layout.
 * Micro-batches go through the chunks in groups of G (Megatron's
 * --microbatch-group-size-per-virtual-pipeline-stage, default R): the forwards of a rank run
 * group 0 through chunk 0, then chunk 1, ..., then group 1 likewise; the last group takes the
 * micro-batches left (Megatron's get_schedule_table: fewer than G when G does not divide M).
 * Backwards run the same sequence with the chunks reversed. Warm-up: (R-1-p)*2 + (v-1)*G
 * forwards, capped at M v. With G = R dividing M the bubble is (R-1)(F+B)/v per rank for chunk
 * costs F and B, at the price of about v times more in-flight chunk activations in the
 * warm-up; a last group of g < R micro-batches leaves its chunks waiting for the pipeline to
 * turn round (R - g per chunk change: see tests/unit/test_schedule.c). */
static void build_interleaved(struct builder *b, uint32_t R, uint32_t v, uint32_t M, uint32_t G) {
  uint32_t total = M * v;
  g_autofree int32_t *mb = g_new(int32_t, total);
  g_autofree uint32_t *chunk = g_new(uint32_t, total);
  uint32_t k = 0;
  for (uint32_t first = 0; first < M; first += G) {
    uint32_t last = first + 2 * G > M ? M : first + G; /* the last group takes the rest */
    for (uint32_t c = 0; c < v; c++)
      for (uint32_t m = first; m < last; m++, k++) {
        mb[k] = (int32_t)m;
        chunk[k] = c;
      }
    if (last == M)
      break;
  }
  PIPER_ASSERT(k == total);
  /* A backward of a group's first chunk comes (v-1) x its group's size forwards after it: the
   * warm-up covers the biggest group (the last, G + M mod G) so that every backward finds its
   * forward issued. */
  uint32_t biggest = M < 2 * G ? M : G + M % G;
  for (uint32_t p = 0; p < R; p++) {
    uint32_t warmup = (R - 1 - p) * 2 + (v - 1) * biggest;
    if (warmup > total)
      warmup = total;
    for (uint32_t i = 0; i < warmup; i++)
      emit(b, p, act((int32_t)(chunk[i] * R + p), mb[i], IR_PASS_F));
    for (uint32_t i = 0; i < total; i++) {
      uint32_t kf = i + warmup;
      if (kf < total)
        emit(b, p, act((int32_t)(chunk[kf] * R + p), mb[kf], IR_PASS_F));
      emit(b, p, act((int32_t)((v - 1 - chunk[i]) * R + p), mb[i], IR_PASS_B));
    }
  }
}

/* Interleaved zero bubble (Qi et al. 2024, ZB1P; PyTorch's ScheduleInterleavedZeroBubble): the
 * loop layout of interleaved 1F1B with the backward split into BI and BW. PyTorch's
 * flexible rounds: M micro-batches run in max(1, M / R) rounds of mpr = M / rounds (M must
 * divide into them), the k-th forward of a rank runs chunk (k / mpr) mod v, the k-th backward
 * chunk v-1 - (k / mpr) mod v, each chunk's micro-batches counted in order. Position p warms up
 * with (v-1) mpr + R-1-p forwards (one per hop, not 1F1B's two: the BI of the next rank comes
 * back one unit later), then runs F BI pairs, then the remaining BI; from its p-th backward on
 * each BI is followed by the BW of the oldest backward not yet weighted, and the BW left over
 * run last. This is _get_1f1b_rank_ops with enable_zero_bubble, num_1f1b_microbatches = p. */
static void build_interleaved_zb(struct builder *b, uint32_t R, uint32_t v, uint32_t M) {
  uint32_t rounds = M / R > 1 ? M / R : 1, mpr = M / rounds, total = M * v;
  g_autofree uint32_t *count = g_new(uint32_t, 3 * (size_t)v); /* F, BI, BW per chunk */
  g_autofree uint32_t *back_chunk = g_new(uint32_t, total);    /* chunk of each backward */
  for (uint32_t p = 0; p < R; p++) {
    uint32_t warmup = MIN((v - 1) * mpr + (R - 1 - p), total), n_back = 0, n_weight = 0;
    memset(count, 0, 3 * (size_t)v * sizeof *count);
#define CHUNK_STAGE(c) ((int32_t)((c) * R + p))
#define EMIT_NEXT(c, kind, pass)                                                                 \
  emit(b, p, act(CHUNK_STAGE(c), (int32_t)count[(kind) * v + (c)]++, (pass)))
    for (uint32_t op = 0; op < total + warmup; op++) {
      if (op < total) /* a forward: warm-up or steady state */
        EMIT_NEXT((op / mpr) % v, 0, IR_PASS_F);
      if (op < warmup)
        continue;
      uint32_t c = v - 1 - ((op - warmup) / mpr) % v;
      EMIT_NEXT(c, 1, IR_PASS_BI);
      back_chunk[n_back++] = c;
      if (op - warmup >= p) {
        EMIT_NEXT(back_chunk[n_weight], 2, IR_PASS_BW);
        n_weight++;
      }
    }
    for (; n_weight < n_back; n_weight++)
      EMIT_NEXT(back_chunk[n_weight], 2, IR_PASS_BW);
#undef EMIT_NEXT
#undef CHUNK_STAGE
    PIPER_ASSERT(n_back == total);
  }
}

/* ZB-V (Qi et al. 2024, zero-bubble V schedule; PyTorch's ScheduleZBVZeroBubble): two stages
 * per rank in a V, backward split into BI and BW. Position p warms up with 2(R-p)-1 forwards of
 * its first stage, then alternates the two stages so that in steady state every rank runs
 * F BI BW of one stage then of the other; the cool-down defers BW to fill what is left. With
 * F = BI = BW the only idle time is the R-1 units before the last rank's first forward, and the
 * peak is 2R chunk activations (R full stages: 1F1B's peak). Needs M >= 2R-1 (the first rank's
 * warm-up). Under full recomputation (recompute) the cool-down runs each BW right after its BI:
 * a deferred BW holds what the rerun restored, 2p chunks on rank p (DeepSeek-V3 on PP 16: 252
 * GiB on the last rank). */
static void build_zbv(struct builder *b, uint32_t R, uint32_t M, bool recompute) {
  for (uint32_t p = 0; p < R; p++) {
    int32_t c0 = (int32_t)p, c1 = (int32_t)(2 * R - 1 - p);
    uint32_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (uint32_t i = 0; i < 2 * (R - p) - 1; i++)
      emit(b, p, act(c0, (int32_t)f0++, IR_PASS_F));
    for (uint32_t i = 0; i < p; i++) {
      emit(b, p, act(c1, (int32_t)f1++, IR_PASS_F));
      emit(b, p, act(c0, (int32_t)f0++, IR_PASS_F));
    }
    for (uint32_t i = 0; i < R - p; i++) {
      emit(b, p, act(c1, (int32_t)f1++, IR_PASS_F));
      emit(b, p, act(c1, (int32_t)b1, IR_PASS_BI));
      emit(b, p, act(c1, (int32_t)b1++, IR_PASS_BW));
    }
    while (f1 < f0 || f0 < M) {
      if (f0 < M)
        emit(b, p, act(c0, (int32_t)f0++, IR_PASS_F));
      emit(b, p, act(c0, (int32_t)b0, IR_PASS_BI));
      emit(b, p, act(c0, (int32_t)b0++, IR_PASS_BW));
      emit(b, p, act(c1, (int32_t)f1++, IR_PASS_F));
      emit(b, p, act(c1, (int32_t)b1, IR_PASS_BI));
      emit(b, p, act(c1, (int32_t)b1++, IR_PASS_BW));
    }
    uint32_t w0 = b0, w1 = b1;
    for (uint32_t i = 0; i < p; i++) {
      emit(b, p, act(c0, (int32_t)b0++, IR_PASS_BI));
      if (recompute)
        emit(b, p, act(c0, (int32_t)w0++, IR_PASS_BW));
      emit(b, p, act(c1, (int32_t)b1++, IR_PASS_BI));
      if (recompute)
        emit(b, p, act(c1, (int32_t)w1++, IR_PASS_BW));
    }
    for (uint32_t i = 0; i < R - p; i++) {
      emit(b, p, act(c0, (int32_t)b0++, IR_PASS_BI));
      emit(b, p, act(c0, (int32_t)w0++, IR_PASS_BW));
    }
    while (w1 < b1)
      emit(b, p, act(c1, (int32_t)w1++, IR_PASS_BW));
    while (w0 < b0)
      emit(b, p, act(c0, (int32_t)w0++, IR_PASS_BW));
    PIPER_ASSERT(f0 == M && f1 == M && b0 == M && b1 == M);
  }
}

/* One rank of DualPipe / DualPipeV (DeepSeek-AI 2025, deepseek-ai/DualPipe, the eight steps of
 * DualPipe.step / DualPipeV.step). Local phase 0 is the direction in which the rank is nearer
 * the start; phase 1 the other. H = ranks in one half (DualPipe: R/2; DualPipeV: R), h = the
 * rank's distance from the end of its half, C = chunks per phase (DualPipe: M/2; DualPipeV: M).
 * Backwards with "zero bubble" enabled split into BI now and BW later (a FIFO queue, like
 * WeightGradStore); overlapped F&B pairs are two-action slots with full backwards. */
struct dp_rank {
  struct builder *b;
  uint32_t pos;
  int32_t stage[2], mb0[2]; /* per local phase */
  uint32_t f[2], bk[2];
  struct sched_action *wq; /* deferred BW, FIFO */
  uint32_t wq_head, wq_tail;
  bool recompute; /* sched_layout.recompute */
};

static struct sched_action dp_f(struct dp_rank *d, int ph) {
  return act(d->stage[ph], d->mb0[ph] + (int32_t)d->f[ph]++, IR_PASS_F);
}

static struct sched_action dp_b(struct dp_rank *d, int ph, bool zb) {
  int32_t mb = d->mb0[ph] + (int32_t)d->bk[ph]++;
  if (!zb)
    return act(d->stage[ph], mb, IR_PASS_B);
  d->wq[d->wq_tail++] = act(d->stage[ph], mb, IR_PASS_BW);
  return act(d->stage[ph], mb, IR_PASS_BI);
}

/* Runs the oldest deferred BW; with none deferred (step 6 kept whole, d->recompute), nothing. */
static void dp_w(struct dp_rank *d) {
  PIPER_ASSERT(d->wq_head < d->wq_tail || d->recompute);
  if (d->wq_head < d->wq_tail)
    emit(d->b, d->pos, d->wq[d->wq_head++]);
}

static void build_dualpipe_rank(struct dp_rank *d, uint32_t H, uint32_t h, uint32_t C) {
  struct builder *b = d->b;
  uint32_t p = d->pos;
  /* 1: nF0 */
  for (uint32_t i = 0; i < (H - h - 1) * 2; i++)
    emit(b, p, dp_f(d, 0));
  /* 2: nF0F1 */
  for (uint32_t i = 0; i < h + 1; i++) {
    emit(b, p, dp_f(d, 0));
    emit(b, p, dp_f(d, 1));
  }
  /* 3: nB1W1F1, zero bubble */
  for (uint32_t i = 0; i < H - h - 1; i++) {
    emit(b, p, dp_b(d, 1, true));
    dp_w(d);
    emit(b, p, dp_f(d, 1));
  }
  /* 4 (main): nF0B1F1B0. The rank at the turn does not overlap its first pair: its F feeds its
   * own next stage, and running them apart shortens the bubble (DualPipe's NOTE). */
  for (uint32_t i = 0; i < C - 2 * H + h + 1; i++) {
    if (i == 0 && h == H - 1) {
      emit(b, p, dp_f(d, 0));
      emit(b, p, dp_b(d, 1, false));
    } else {
      struct sched_action x = dp_f(d, 0);
      emit2(b, p, x, dp_b(d, 1, false));
    }
    struct sched_action x = dp_f(d, 1);
    emit2(b, p, x, dp_b(d, 0, false));
  }
  /* 5: nB1F1B0 */
  for (uint32_t i = 0; i < H - h - 1; i++) {
    emit(b, p, dp_b(d, 1, false));
    struct sched_action x = dp_f(d, 1);
    emit2(b, p, x, dp_b(d, 0, false));
  }
  /* 6: nB1B0, the second half with zero bubble. Under full recomputation the second half
   * stays whole: a deferred BW reads what the rerun restored (and what BI kept) until step 8,
   * so the last rank would hold h + 1 = R chunks of whole recomputed activations (DeepSeek-V3,
   * PP 16: 16 chunks of 7 GB, 114 GiB) and undo what recomputation saves; a whole backward
   * frees them at once, for a bubble longer by about (h + 1) / 2 W. */
  bool zb = false;
  uint32_t n6 = h + 1;
  for (uint32_t i = 0; i < n6; i++) {
    if (i == n6 / 2 && h % 2 == 1 && !d->recompute)
      zb = true;
    emit(b, p, dp_b(d, 1, zb));
    if (i == n6 / 2 && h % 2 == 0 && !d->recompute)
      zb = true;
    emit(b, p, dp_b(d, 0, zb));
  }
  /* 7: nWB0, zero bubble */
  for (uint32_t i = 0; i < H - h - 1; i++) {
    dp_w(d);
    emit(b, p, dp_b(d, 0, true));
  }
  /* 8: nW */
  for (uint32_t i = 0; i < h + 1; i++)
    dp_w(d);
  PIPER_ASSERT(d->wq_head == d->wq_tail);
  PIPER_ASSERT(d->f[0] == C && d->f[1] == C && d->bk[0] == C && d->bk[1] == C);
}

/* DualPipe: bidirectional, one stage per rank per copy (see the file comment for the copies).
 * Needs R even, M even and M >= 2R (DualPipe.step's assertions). Bubble
 * (R/2-1)(F&B + B - 3W), activations R+1 chunks per rank, parameters twice (two copies). */
static void build_dualpipe(struct builder *b, uint32_t R, uint32_t M, bool recompute) {
  uint32_t H = R / 2, C = M / 2;
  struct sched_action *wq = g_new(struct sched_action, 2 * (size_t)C);
  for (uint32_t p = 0; p < R; p++) {
    /* Ranks in the second half are nearer the start of copy B: their phase 0 is copy B. */
    int second = p >= H;
    int32_t stage[2] = {(int32_t)p, (int32_t)(R - 1 - p)}, mb0[2] = {0, (int32_t)C};
    struct dp_rank d = {.b = b, .pos = p, .wq = wq, .recompute = recompute};
    for (int ph = 0; ph < 2; ph++) {
      d.stage[ph] = stage[ph ^ second];
      d.mb0[ph] = mb0[ph ^ second];
    }
    build_dualpipe_rank(&d, H, p < H ? p : R - 1 - p, C);
  }
  g_free(wq);
}

/* DualPipeV: DualPipe cut in half, one copy in a V (position p holds stages p and 2R-1-p).
 * Needs M >= 2R (DualPipeV.step's assertion). Bubble (R-1)(F&B + B - 3W) with PP = 2R stages,
 * i.e. (PP/2-1)(F&B + B - 3W); activations 2R+1 chunks per rank. */
static void build_dualpipev(struct builder *b, uint32_t R, uint32_t M, bool recompute) {
  struct sched_action *wq = g_new(struct sched_action, 2 * (size_t)M);
  for (uint32_t p = 0; p < R; p++) {
    struct dp_rank d = {.b = b,
                        .pos = p,
                        .stage = {(int32_t)p, (int32_t)(2 * R - 1 - p)},
                        .mb0 = {0, 0},
                        .wq = wq,
                        .recompute = recompute};
    build_dualpipe_rank(&d, R, p, M);
  }
  g_free(wq);
}

/* ---- layout checks --------------------------------------------------------------------------- */

enum layout_shape { SHAPE_SINGLE, SHAPE_LOOP, SHAPE_V };

/* Checks the layout has the family's shape and fills pos_rank[R]; *v = stages per rank. */
static bool check_layout(enum sched_family f, enum layout_shape shape, const struct sched_layout *l,
                         int32_t *pos_rank, uint32_t *v, GError **err) {
  const char *fam = sched_family_name(f);
  uint32_t R = l->n_ranks, S = l->n_stages;
  static const char *const shape_text[] = {
      "one stage per rank (stage s on its own rank)",
      "a loop layout (v >= 2 stages per rank, stage s on the rank of stage s mod R)",
      "a V layout (2R stages, rank r holding stages r and 2R-1-r)"};
  uint32_t want = shape == SHAPE_SINGLE ? R : shape == SHAPE_V ? 2 * R : 0;
  if (shape == SHAPE_LOOP) {
    if (S % R != 0 || S / R < 2)
      return piper_input_error(err,
                       "%s: needs %s, i.e. a multiple of R = %u stages, at least %u; the "
                       "layout has %u stages on %u ranks",
                       fam, shape_text[shape], R, 2 * R, S, R);
  } else if (S != want) {
    return piper_input_error(err,
                             "%s: needs %s: %u stages on %u ranks; the layout has %u stages on "
                             "%u ranks",
                             fam, shape_text[shape], want, R, S, R);
  }
  *v = S / R;
  /* Positions 0..R-1 are the first R stages; they must sit on distinct ranks. */
  g_autofree int32_t *seen = g_new0(int32_t, R);
  for (uint32_t p = 0; p < R; p++) {
    int32_t r = l->stage_rank[p];
    if (seen[r])
      return piper_input_error(err, "%s: needs %s; stages %d and %u are both on rank %d", fam,
                       shape_text[shape], seen[r] - 1, p, r);
    seen[r] = (int32_t)p + 1;
    pos_rank[p] = r;
  }
  for (uint32_t s = R; s < S; s++) {
    uint32_t p = shape == SHAPE_V ? 2 * R - 1 - s : s % R;
    if (l->stage_rank[s] != l->stage_rank[p])
      return piper_input_error(err, "%s: needs %s; stage %u is on rank %d, stage %u on rank %d", fam,
                       shape_text[shape], s, l->stage_rank[s], p, l->stage_rank[p]);
  }
  return true;
}

/* What any family needs: a known family with something to build, a layout of ranks and
 * stages within the caps, and a micro-batch count the directives can hold. */
static bool check_request(enum sched_family f, const struct sched_layout *layout, uint32_t M,
                          GError **err) {
  if ((unsigned)f >= SCHED_FAMILY_COUNT) {
    piper_input_error(err, "schedule: unknown schedule family %d", (int)f);
    return false;
  }
  const char *fam = sched_family_name(f);
  if (f == SCHED_CUSTOM) {
    piper_input_error(err, "custom: the base schedule's own split and order directives are the schedule; "
                   "there is nothing to build (keep the base file as written)");
    return false;
  }
  if (!layout || !layout->stage_rank || layout->n_ranks == 0 || layout->n_stages == 0) {
    piper_input_error(err, "%s: the layout is empty: at least one rank and one stage are needed", fam);
    return false;
  }
  uint32_t R = layout->n_ranks, S = layout->n_stages;
  if (R > SCHED_MAX_RANKS || S > SCHED_MAX_STAGES) {
    piper_input_error(err, "%s: %u ranks and %u stages; at most %u of each", fam, R, S,
              (unsigned)SCHED_MAX_RANKS);
    return false;
  }
  for (uint32_t s = 0; s < S; s++)
    if (layout->stage_rank[s] < 0 || (uint32_t)layout->stage_rank[s] >= R) {
      piper_input_error(err, "%s: stage %u is on rank %d, outside [0, %u)", fam, s, layout->stage_rank[s],
                R);
      return false;
    }
  if (M == 0 || M > DIR_MAX_MICROBATCHES) {
    piper_input_error(err, "%s: %u micro-batches; between 1 and %d are accepted", fam, M,
              DIR_MAX_MICROBATCHES);
    return false;
  }
  if ((uint64_t)S * M * 3 > SCHED_MAX_ACTIONS) {
    piper_input_error(err,
              "%s: %u stages x %u micro-batches make more than %u actions; use fewer "
              "micro-batches",
              fam, S, M, SCHED_MAX_ACTIONS);
    return false;
  }
  return true;
}

/* The family's conditions on R and M, each refusal saying what is needed. */
static bool check_microbatches(enum sched_family f, uint32_t R, uint32_t M, uint32_t G,
                               GError **err) {
  switch (f) {
  case SCHED_INTERLEAVED_1F1B:
    if (M < R) {
      piper_input_error(err,
                "interleaved_1f1b: needs at least as many micro-batches as the %u ranks (a "
                "micro-batch comes back to rank 0 for its next chunk after R forwards); got "
                "M = %u, use M >= %u", R, M, R);
      return false;
    }
    if (G && (G < R || G > M)) {
      piper_input_error(err,
                "interleaved_1f1b: the micro-batch group (--microbatch-group) must be between "
                "the %u ranks and the %u micro-batches; got %u", R, M, G);
      return false;
    }
    break;
  case SCHED_INTERLEAVED_ZEROBUBBLE: {
    uint32_t rounds = M / R > 1 ? M / R : 1;
    if (M % rounds != 0) {
      piper_input_error(err,
                        "interleaved_zerobubble: runs M micro-batches in max(1, M / R) = %u "
                        "rounds, so M must be a multiple of %u (PyTorch's rule); got M = %u, "
                        "use M = %u or %u",
                        rounds, rounds, M, M / rounds * rounds, (M / rounds + 1) * rounds);
      return false;
    }
    break;
  }
  case SCHED_ZBV:
    if (M < 2 * R - 1) {
      piper_input_error(err,
                "zbv: needs at least 2R-1 = %u micro-batches for %u ranks (the first "
                "rank's warm-up runs 2R-1 forwards); got M = %u",
                2 * R - 1, R, M);
      return false;
    }
    break;
  case SCHED_DUALPIPE:
    if (R % 2 != 0) {
      piper_input_error(err,
                "dualpipe: needs an even number of ranks (the two directions meet in the "
                "middle); got R = %u (dualpipev works with any R)",
                R);
      return false;
    }
    if (M % 2 != 0 || M < 2 * R) {
      piper_input_error(err,
                "dualpipe: needs an even number of micro-batches, at least 2R = %u (half go "
                "each way); got M = %u",
                2 * R, M);
      return false;
    }
    break;
  case SCHED_DUALPIPEV:
    if (M < 2 * R) {
      piper_input_error(err, "dualpipev: needs at least 2R = %u micro-batches for %u ranks; got M = %u",
                2 * R, R, M);
      return false;
    }
    break;
  default: break;
  }

  return true;
}

/* Every check of sched_build, in its order; fills pos_rank[R] and *v for the builder. */
static bool check_all(enum sched_family f, const struct sched_layout *layout, uint32_t M,
                      int32_t **pos_rank, uint32_t *v, GError **err) {
  if (!check_request(f, layout, M, err))
    return false;
  enum layout_shape shape = SHAPE_SINGLE;
  if (f == SCHED_INTERLEAVED_1F1B || f == SCHED_INTERLEAVED_ZEROBUBBLE)
    shape = SHAPE_LOOP;
  if (f == SCHED_ZBV || f == SCHED_DUALPIPEV)
    shape = SHAPE_V;
  *pos_rank = g_new(int32_t, layout->n_ranks);
  *v = 1;
  return check_layout(f, shape, layout, *pos_rank, v, err) &&
         check_microbatches(f, layout->n_ranks, M, layout->microbatch_group, err);
}

bool sched_check(enum sched_family f, const struct sched_layout *layout, uint32_t M,
                 GError **err) {
  int32_t *pos_rank = NULL;
  uint32_t v = 1;
  bool ok = check_all(f, layout, M, &pos_rank, &v, err);
  g_free(pos_rank);
  return ok;
}

struct sched_program *sched_build(enum sched_family f, const struct sched_layout *layout,
                                  uint32_t M, GError **err) {
  g_autofree int32_t *pos_rank = NULL;
  uint32_t v = 1;
  if (!check_all(f, layout, M, &pos_rank, &v, err))
    return NULL;
  uint32_t R = layout->n_ranks, S = layout->n_stages;
  struct builder b = {.pos_rank = pos_rank};
  sched_rows_init(&b.rows, R);
  switch (f) {
  case SCHED_GPIPE: build_gpipe(&b, R, M); break;
  case SCHED_1F1B: build_1f1b(&b, R, M, false); break;
  case SCHED_ZEROBUBBLE: build_1f1b(&b, R, M, true); break;
  case SCHED_INTERLEAVED_1F1B:
    build_interleaved(&b, R, v, M, layout->microbatch_group ? layout->microbatch_group : R);
    break;
  case SCHED_INTERLEAVED_ZEROBUBBLE: build_interleaved_zb(&b, R, v, M); break;
  case SCHED_ZBV: build_zbv(&b, R, M, layout->recompute); break;
  case SCHED_DUALPIPE: build_dualpipe(&b, R, M, layout->recompute); break;
  case SCHED_DUALPIPEV: build_dualpipev(&b, R, M, layout->recompute); break;
  default: PIPER_UNREACHABLE();
  }
  return sched_rows_finish(&b.rows, f, S, M);
}

/* ---- directives ------------------------------------------------------------------------------ */

static void filter_set(struct dir_filter *flt, const char *dim, const struct sched_action *a) {
  memset(flt, 0, sizeof *flt);
  flt->n_keys = 2;
  g_strlcpy(flt->keys[0].name, "PP", DIR_NAME_MAX);
  flt->keys[0].value = a->stage;
  g_strlcpy(flt->keys[1].name, dim, DIR_NAME_MAX);
  flt->keys[1].value = a->mb;
  flt->pass = a->pass;
}

bool sched_to_directives(const struct sched_program *s, const char *dim_name,
                         struct dir_program *out, GError **err) {
  PIPER_ASSERT(s && out);
  if (!dim_name || !dim_name[0] || strlen(dim_name) >= DIR_NAME_MAX ||
      strcmp(dim_name, "PP") == 0 || strcmp(dim_name, "PASS") == 0)
    return piper_input_error(err,
                     "%s: the split dimension name must be a tag name other than PP and "
                     "PASS, shorter than %d bytes (e.g. \"MB\")",
                     out->name, DIR_NAME_MAX);
  for (uint32_t r = 0; r < s->n_ranks; r++) {
    const struct sched_rank *rk = &s->ranks[r];
    if (rk->n_slots < 2)
      continue; /* one slot orders nothing */
    uint32_t n_filters = 0;
    for (uint32_t i = 0; i < rk->n_slots; i++) {
      PIPER_ASSERT(rk->slots[i].n_actions == 1 || rk->slots[i].n_actions == 2);
      n_filters += rk->slots[i].n_actions;
    }
    struct dir_directive d = {.op = DIR_ORDER, .n_slots = rk->n_slots};
    d.filter.pass = IR_PASS_NONE;
    d.slot_first = g_new(uint32_t, rk->n_slots + 1);
    d.filters = g_new0(struct dir_filter, n_filters);
    uint32_t at = 0;
    for (uint32_t i = 0; i < rk->n_slots; i++) {
      d.slot_first[i] = at;
      for (uint32_t k = 0; k < rk->slots[i].n_actions; k++)
        filter_set(&d.filters[at++], dim_name, &rk->slots[i].actions[k]);
    }
    d.slot_first[rk->n_slots] = at;
    dir_program_append(out, &d); /* deep copy */
    g_free(d.slot_first);
    g_free(d.filters);
  }
  return true;
}

/* ---- harness --------------------------------------------------------------------------------- */

char *sched_program_file_name(enum sched_family f, uint32_t ranks, uint32_t mbs) {
  return g_strdup_printf("%s_pp%u_mbs%u.json", sched_family_name(f), ranks, mbs);
}

/* The stages a directive's filter selects for layout purposes: a filter whose only key is PP
 * (an index, or "*"), or {} (every stage). Filters with other keys or a PASS place parts of
 * stages (experts, passes, micro-batches) and do not move a stage. Returns false when the
 * directive says nothing about whole stages. */
static bool filter_stages(const struct dir_filter *f, uint32_t n_stages, uint32_t *first,
                          uint32_t *last) {
  if (f->pass != IR_PASS_NONE || f->n_keys > 1)
    return false;
  if (f->n_keys == 0 || f->keys[0].value == IR_FILTER_ANY) {
    if (f->n_keys == 1 && strcmp(f->keys[0].name, "PP") != 0)
      return false;
    *first = 0;
    *last = n_stages - 1;
    return true;
  }
  if (strcmp(f->keys[0].name, "PP") != 0)
    return false;
  if (f->keys[0].value < 0 || (uint32_t)f->keys[0].value >= n_stages)
    return false;
  *first = *last = (uint32_t)f->keys[0].value;
  return true;
}

/* The stage filter {"PP": s} of a directive, s >= 0; -1 when it is not one. */
static int32_t single_stage(const struct dir_directive *d) {
  const struct dir_filter *f = &d->filter;
  if (d->op != DIR_PLACE || !d->n_devices || f->pass != IR_PASS_NONE || f->n_keys != 1 ||
      strcmp(f->keys[0].name, "PP") != 0 || f->keys[0].value < 0)
    return -1;
  return f->keys[0].value;
}

/* A program that places stages past the model's PP regions is written for more regions than
 * the model is cut into; the shape checks would compare the wrong counts (a V file of 8 stages
 * reported as "the layout has 4"), so say the program's stages and ranks and the model's count. */
static bool check_program_stages(const struct dir_program *p, uint32_t n_stages, GError **err) {
  int32_t top = -1;
  for (uint32_t i = 0; i < p->n; i++)
    top = MAX(top, single_stage(&p->d[i]));
  if (top < (int32_t)n_stages || top >= SCHED_MAX_STAGES)
    return true;
  /* Only a whole layout (stages 0 .. top each placed) is one written for more regions; a stray
   * place is left to apply.c's "matches nothing". */
  g_autofree bool *placed = g_new0(bool, (uint32_t)top + 1);
  for (uint32_t i = 0; i < p->n; i++)
    if (single_stage(&p->d[i]) >= 0)
      placed[single_stage(&p->d[i])] = true;
  for (int32_t st = 0; st <= top; st++)
    if (!placed[st])
      return true;
  /* Its ranks: distinct device lists among its stage places. */
  uint32_t ranks = 0;
  for (uint32_t i = 0; i < p->n; i++) {
    const struct dir_directive *d = &p->d[i];
    bool seen = single_stage(d) < 0;
    for (uint32_t j = 0; j < i && !seen; j++)
      seen = single_stage(&p->d[j]) >= 0 && p->d[j].n_devices == d->n_devices &&
             memcmp(p->d[j].devices, d->devices, d->n_devices * sizeof *d->devices) == 0;
    ranks += !seen;
  }
  return piper_input_error(err,
                           "%s: places %d stages (PP 0 to %d) on %u ranks, but the model is cut "
                           "into %u PP regions: pass --pp-regions %d",
                           p->name, top + 1, top, ranks, n_stages, top + 1);
}

/* A pipeline rank is a distinct device list: rank_dev[r] / rank_n[r] (each [n_stages], pointing
 * into p), numbered by the lowest stage it holds; stage_rank[n_stages] is filled. Returns R, or
 * 0 (err set) when the program places some stages but not all. */
static uint32_t layout_ranks(const struct dir_program *p, uint32_t n_stages, int32_t *stage_rank,
                             const uint32_t **rank_dev, uint32_t *rank_n, GError **err) {
  /* Which directive gives each stage its devices: the last place that selects it, else the
   * first replicate or shard that does (they place what no place did), else device 0. */
  g_autofree const struct dir_directive **by = g_new0(const struct dir_directive *, n_stages);
  for (uint32_t i = 0; i < p->n; i++) {
    const struct dir_directive *d = &p->d[i];
    uint32_t lo, hi;
    if (d->op != DIR_PLACE && d->op != DIR_REPLICATE && d->op != DIR_SHARD)
      continue;
    if (!d->n_devices || !filter_stages(&d->filter, n_stages, &lo, &hi))
      continue;
    for (uint32_t s = lo; s <= hi; s++) {
      if (d->op == DIR_PLACE || !by[s])
        by[s] = d;
    }
  }
  /* A program that places some stages must place them all (as apply.c requires): a stage left
   * out is most often a layout written for fewer PP regions than the model is cut into, which
   * the shape checks below would report as a puzzling count of ranks. */
  uint32_t placed = 0;
  for (uint32_t s = 0; s < n_stages; s++)
    placed += by[s] != NULL;
  for (uint32_t s = 0; placed > 0 && s < n_stages; s++)
    if (!by[s]) {
      if (placed == s) /* stages 0 .. s-1 placed, none after */
        piper_input_error(err,
                          "%s: pipeline stage PP=%u has no place: no place, replicate or shard "
                          "directive selects it, and the model is cut into %u PP regions (is "
                          "the program written for --pp-regions %u?)",
                          p->name, s, n_stages, placed);
      else
        piper_input_error(err,
                          "%s: pipeline stage PP=%u has no place: no place, replicate or shard "
                          "directive selects it",
                          p->name, s);
      return 0;
    }
  /* A rank is a distinct device list, numbered by the lowest stage it holds; a program that
   * places nothing runs on [0]. */
  static const uint32_t device0 = 0;
  uint32_t R = 0;
  for (uint32_t s = 0; s < n_stages; s++) {
    const uint32_t *dev = by[s] ? by[s]->devices : &device0;
    uint32_t n = by[s] ? by[s]->n_devices : 1;
    int32_t found = -1;
    for (uint32_t r = 0; r < R && found < 0; r++)
      if (rank_n[r] == n && memcmp(rank_dev[r], dev, n * sizeof *dev) == 0)
        found = (int32_t)r;
    if (found < 0) {
      rank_dev[R] = dev;
      rank_n[R] = n;
      found = (int32_t)R++;
    }
    stage_rank[s] = found;
  }
  return R;
}

static bool check_stage_count(const struct dir_program *p, uint32_t n_stages, GError **err) {
  if (n_stages == 0 || n_stages > SCHED_MAX_STAGES)
    return piper_input_error(err, "%s: the model has %u PP regions; 1 to %u are accepted", p->name,
                             n_stages, (unsigned)SCHED_MAX_STAGES);
  return true;
}

int32_t *sched_layout_from_program(const struct dir_program *p, uint32_t n_stages,
                                   uint32_t *n_ranks, GError **err) {
  PIPER_ASSERT(p && n_ranks);
  if (!check_stage_count(p, n_stages, err) || !check_program_stages(p, n_stages, err))
    return NULL;
  int32_t *stage_rank = g_new(int32_t, n_stages);
  g_autofree const uint32_t **rank_dev = g_new0(const uint32_t *, n_stages);
  g_autofree uint32_t *rank_n = g_new0(uint32_t, n_stages);
  *n_ranks = layout_ranks(p, n_stages, stage_rank, rank_dev, rank_n, err);
  if (*n_ranks == 0) {
    g_free(stage_rank);
    return NULL;
  }
  return stage_rank;
}

/* The {"PP": s, "MB": m} of a filter with exactly those two keys (either order), no pass. */
static bool filter_stage_microbatch(const struct dir_filter *f, int32_t *stage, int32_t *mb) {
  if (f->pass != IR_PASS_NONE || f->n_keys != 2)
    return false;
  int pp = strcmp(f->keys[0].name, "PP") == 0 ? 0 : 1;
  if (strcmp(f->keys[pp].name, "PP") != 0 || strcmp(f->keys[1 - pp].name, "MB") != 0)
    return false;
  *stage = f->keys[pp].value;
  *mb = f->keys[1 - pp].value;
  return true;
}

int32_t *sched_microbatch_ranks(const struct dir_program *p, uint32_t n_stages, uint32_t M,
                                uint32_t *n_ranks, GError **err) {
  PIPER_ASSERT(p && n_ranks);
  if (!check_stage_count(p, n_stages, err))
    return NULL;
  g_autofree int32_t *stage_rank = g_new(int32_t, n_stages);
  g_autofree const uint32_t **rank_dev = g_new0(const uint32_t *, n_stages);
  g_autofree uint32_t *rank_n = g_new0(uint32_t, n_stages);
  uint32_t R = layout_ranks(p, n_stages, stage_rank, rank_dev, rank_n, err);
  if (R == 0)
    return NULL;
  int32_t *mb_rank = g_new(int32_t, (size_t)n_stages * (M ? M : 1));
  for (uint32_t s = 0; s < n_stages; s++)
    for (uint32_t m = 0; m < M; m++)
      mb_rank[(size_t)s * M + m] = stage_rank[s];
  for (uint32_t i = 0; i < p->n; i++) {
    const struct dir_directive *d = &p->d[i];
    int32_t s, m;
    if (d->op != DIR_PLACE || !d->n_devices || !filter_stage_microbatch(&d->filter, &s, &m) ||
        s < 0 || (uint32_t)s >= n_stages || m < 0 || (uint32_t)m >= M)
      continue;
    for (uint32_t r = 0; r < R; r++)
      if (rank_n[r] == d->n_devices &&
          memcmp(rank_dev[r], d->devices, d->n_devices * sizeof *d->devices) == 0)
        mb_rank[(size_t)s * M + (size_t)m] = (int32_t)r;
  }
  *n_ranks = R;
  return mb_rank;
}

/* Finds the single MB split of p without changing p: *index is its position, or UINT32_MAX
 * when p has none; *M the micro-batch count it will have (mbs, or the split's own when mbs is
 * 0). False (err set) when p has splits the builders cannot use or no count is known. */
static bool find_split(const struct dir_program *p, uint32_t mbs, uint32_t *index, uint32_t *M,
                       GError **err) {
  uint32_t n = 0;
  *index = UINT32_MAX;
  for (uint32_t i = 0; i < p->n; i++)
    if (p->d[i].op == DIR_SPLIT && n++ == 0)
      *index = i;
  if (n > 1)
    return piper_input_error(err,
                     "%s: %u split directives; the schedule builders need exactly one, with "
                     "dim_name \"MB\"",
                     p->name, n);
  if (n == 1 && strcmp(p->d[*index].dim_name, "MB") != 0)
    return piper_input_error(err,
                     "%s: directive %u (split): dim_name is \"%s\"; the schedule builders "
                     "need \"MB\"",
                     p->name, *index, p->d[*index].dim_name);
  if (n == 0 && mbs == 0)
    return piper_input_error(err, "%s: no split directive and no micro-batch count given (--mbs M)",
                     p->name);
  *M = mbs ? mbs : (uint32_t)p->d[*index].num_microbatches;
  return true;
}

/* Makes the split found by find_split say M micro-batches, adding it when there is none. */
static void set_split(struct dir_program *p, uint32_t index, uint32_t M) {
  if (index != UINT32_MAX) {
    p->d[index].num_microbatches = M;
    return;
  }
  struct dir_directive d = {.op = DIR_SPLIT, .num_microbatches = M};
  d.filter.pass = IR_PASS_NONE;
  g_strlcpy(d.dim_name, "MB", DIR_NAME_MAX);
  dir_program_append(p, &d);
}

/* DualPipe's copy B runs stage s on the rank holding stage R-1-s (file comment): place its
 * micro-batches there, after the base's places so that they win. */
static void place_dualpipe_copy_b(struct dir_program *p, uint32_t n_stages,
                                  const int32_t *stage_rank, uint32_t R, uint32_t M) {
  /* Directive index giving each rank its devices (indices: appending moves p->d). */
  g_autofree uint32_t *group = g_new(uint32_t, R);
  for (uint32_t r = 0; r < R; r++)
    group[r] = UINT32_MAX;
  for (uint32_t i = 0; i < p->n; i++) {
    const struct dir_directive *d = &p->d[i];
    uint32_t lo, hi;
    if ((d->op == DIR_PLACE || d->op == DIR_REPLICATE || d->op == DIR_SHARD) && d->n_devices &&
        filter_stages(&d->filter, n_stages, &lo, &hi))
      for (uint32_t st = lo; st <= hi; st++)
        if (d->op == DIR_PLACE || group[stage_rank[st]] == UINT32_MAX)
          group[stage_rank[st]] = i;
  }
  for (uint32_t st = 0; st < n_stages; st++) {
    uint32_t gi = group[stage_rank[n_stages - 1 - st]];
    uint32_t dev0 = 0, n_dev = gi == UINT32_MAX ? 1 : p->d[gi].n_devices;
    g_autofree uint32_t *devices =
        g_memdup2(gi == UINT32_MAX ? &dev0 : p->d[gi].devices, n_dev * sizeof(uint32_t));
    for (uint32_t m = M / 2; m < M; m++) {
      struct dir_directive d = {.op = DIR_PLACE, .n_devices = n_dev, .devices = devices};
      d.filter.pass = IR_PASS_NONE;
      d.filter.n_keys = 2;
      g_strlcpy(d.filter.keys[0].name, "PP", DIR_NAME_MAX);
      d.filter.keys[0].value = (int32_t)st;
      g_strlcpy(d.filter.keys[1].name, "MB", DIR_NAME_MAX);
      d.filter.keys[1].value = (int32_t)m;
      dir_program_append(p, &d); /* deep copy */
    }
  }
}

/* Everything is checked and built before p changes: on failure p is as it was. */
bool sched_prepare_program(struct dir_program *p, uint32_t n_stages, const struct sched_options *o,
                           GError **err) {
  PIPER_ASSERT(p && o);
  if ((unsigned)o->family >= SCHED_FAMILY_COUNT)
    return piper_input_error(err, "%s: unknown schedule family %d", p->name, (int)o->family);
  const char *fam = sched_family_name(o->family);
  if (o->mbs > DIR_MAX_MICROBATCHES)
    return piper_input_error(err, "%s: %u micro-batches; at most %d", p->name, o->mbs,
                     DIR_MAX_MICROBATCHES);
  uint32_t split = UINT32_MAX, M = 0;
  if (o->family == SCHED_CUSTOM) {
    if (o->mbs == 0)
      return true;
    if (!find_split(p, o->mbs, &split, &M, err))
      return false;
    set_split(p, split, M);
    return true;
  }
  if (!find_split(p, o->mbs, &split, &M, err))
    return false;
  uint32_t R = 0;
  g_autofree int32_t *stage_rank = sched_layout_from_program(p, n_stages, &R, err);
  if (!stage_rank)
    return false;
  if (o->ranks > 0 && o->ranks != R)
    return piper_input_error(err,
                     "%s: %s with %u ranks was asked, but the base schedule places its %u "
                     "stages on %u device groups (ranks)",
                     p->name, fam, o->ranks, n_stages, R);
  if (o->microbatch_group && o->family != SCHED_INTERLEAVED_1F1B)
    return piper_input_error(err, "--microbatch-group applies to interleaved_1f1b only, not %s",
                             fam);
  struct sched_layout l = {.n_ranks = R, .n_stages = n_stages, .stage_rank = stage_rank,
                           .microbatch_group = o->microbatch_group};
  for (uint32_t d = 0; d < p->n; d++)
    l.recompute |= p->d[d].op == DIR_RECOMPUTE && p->d[d].granularity == IR_RECOMPUTE_FULL;
  g_autoptr(GError) e = NULL;
  struct sched_program *s = sched_build(o->family, &l, M, &e);
  if (!s)
    return piper_input_error(err, "%s: %s", p->name, e->message);

  if (!o->keep_order)
    dir_program_remove_op(p, DIR_ORDER);
  /* remove_op renumbers: find the split again (it cannot fail now). */
  if (!find_split(p, M, &split, &M, NULL))
    PIPER_UNREACHABLE();
  set_split(p, split, M);
  if (o->family == SCHED_DUALPIPE)
    place_dualpipe_copy_b(p, n_stages, stage_rank, R, M);
  bool ok = sched_to_directives(s, "MB", p, err);
  sched_program_free(s);
  return ok;
}
