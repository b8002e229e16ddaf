/* Tests of the schedule builders, the CSV interchange and the harness (directives/schedule.h).
 *
 * The core is a unit-time executor: each rank runs its slots in order with costs F = 1, B = 2,
 * BI = 1, BW = 1 (a two-action slot costs the sum), an action starts once the actions it needs
 * have finished on any rank (zero communication cost), and the makespan is reported, or a
 * deadlock. With these costs the textbook bubble formulas are exact integers, so the tests
 * assert them exactly. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream */
#endif
#include "test-helpers.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../directives/directives.h"
#include "../../directives/schedule.h"
#include "../../base/json.h"

/* ---- the unit-time checker ------------------------------------------------------------------- */

struct run {
  bool ok;
  char why[256];
  int64_t makespan;
  uint32_t peak[64]; /* per rank: F done minus B/BW done, at its highest */
};

/* sched_read_csv of a whole C string. */
static struct sched_program *read_csv(const char *name, const char *text, GError **err) {
  return sched_read_csv(name, text, strlen(text), err);
}

static int64_t cost(enum ir_pass p) {
  return p == IR_PASS_B ? 2 : 1;
}

/* Expected rank of (stage, mb): the layout's, except DualPipe's copy B (mb >= M/2), which runs
 * stage s on the rank of stage R-1-s. */
static int32_t rank_of(const struct sched_layout *l, bool dualpipe, uint32_t M, int32_t stage,
                       int32_t mb) {
  if (dualpipe && (uint32_t)mb >= M / 2)
    return l->stage_rank[l->n_stages - 1 - (uint32_t)stage];
  return l->stage_rank[stage];
}

/* Validates s against the layout (each (stage, mb) exactly one F and either one B or one BI
 * and one BW, on the right rank) and executes it. */
static struct run execute(const struct sched_program *s, const struct sched_layout *l,
                          bool dualpipe) {
  struct run out = {.ok = false};
  uint32_t S = s->n_stages, M = s->n_microbatches, R = s->n_ranks;
  assert_true(R <= 64);
  size_t n = (size_t)S * M;
  /* finish time per (stage, mb) of F, of the backward that feeds stage-1 (B or BI), of BW */
  int64_t *tf = malloc(n * sizeof *tf), *tb = malloc(n * sizeof *tb), *tw = malloc(n * sizeof *tw);
  uint32_t *count = calloc(n * 4, sizeof *count);
  for (size_t i = 0; i < n; i++)
    tf[i] = tb[i] = tw[i] = -1;
  for (uint32_t r = 0; r < R; r++)
    for (uint32_t i = 0; i < s->ranks[r].n_slots; i++) {
      const struct sched_slot *sl = &s->ranks[r].slots[i];
      if (sl->n_actions != 1 && sl->n_actions != 2) {
        snprintf(out.why, sizeof out.why, "rank %u slot %u has %u actions", r, i, sl->n_actions);
        goto done;
      }
      for (uint32_t k = 0; k < sl->n_actions; k++) {
        const struct sched_action *a = &sl->actions[k];
        if (a->stage < 0 || (uint32_t)a->stage >= S || a->mb < 0 || (uint32_t)a->mb >= M ||
            a->pass > IR_PASS_BW) {
          snprintf(out.why, sizeof out.why, "rank %u slot %u: action %d/%d/%d out of range", r, i,
                   a->stage, a->mb, a->pass);
          goto done;
        }
        if (l && rank_of(l, dualpipe, M, a->stage, a->mb) != (int32_t)r) {
          snprintf(out.why, sizeof out.why, "rank %u runs stage %d mb %d of rank %d", r, a->stage,
                   a->mb, rank_of(l, dualpipe, M, a->stage, a->mb));
          goto done;
        }
        count[((size_t)a->stage * M + (size_t)a->mb) * 4 + a->pass]++;
      }
    }
  for (uint32_t st = 0; st < S; st++)
    for (uint32_t m = 0; m < M; m++) {
      uint32_t *c = &count[((size_t)st * M + m) * 4];
      bool full = c[IR_PASS_B] == 1 && c[IR_PASS_BI] == 0 && c[IR_PASS_BW] == 0;
      bool split = c[IR_PASS_B] == 0 && c[IR_PASS_BI] == 1 && c[IR_PASS_BW] == 1;
      if (c[IR_PASS_F] != 1 || !(full || split)) {
        snprintf(out.why, sizeof out.why, "stage %u mb %u: %u F, %u B, %u BI, %u BW", st, m,
                 c[IR_PASS_F], c[IR_PASS_B], c[IR_PASS_BI], c[IR_PASS_BW]);
        goto done;
      }
    }

  uint32_t *next = calloc(R, sizeof *next);
  int64_t *free_at = calloc(R, sizeof *free_at);
  bool progress = true;
  while (progress) {
    progress = false;
    for (uint32_t r = 0; r < R; r++) {
      while (next[r] < s->ranks[r].n_slots) {
        const struct sched_slot *sl = &s->ranks[r].slots[next[r]];
        int64_t start = free_at[r], c = 0;
        bool ready = true;
        for (uint32_t k = 0; k < sl->n_actions && ready; k++) {
          const struct sched_action *a = &sl->actions[k];
          size_t i = (size_t)a->stage * M + (size_t)a->mb;
          int64_t need[2] = {-2, -2};
          if (a->pass == IR_PASS_F) {
            if (a->stage > 0)
              need[0] = tf[i - M];
          } else if (a->pass == IR_PASS_BW) {
            need[0] = tb[i];
          } else {
            need[0] = tf[i];
            if ((uint32_t)a->stage + 1 < S)
              need[1] = tb[i + M];
          }
          for (int d = 0; d < 2; d++) {
            if (need[d] == -1)
              ready = false;
            if (need[d] > start)
              start = need[d];
          }
          c += cost(a->pass);
        }
        if (!ready)
          break;
        for (uint32_t k = 0; k < sl->n_actions; k++) {
          const struct sched_action *a = &sl->actions[k];
          size_t i = (size_t)a->stage * M + (size_t)a->mb;
          if (a->pass == IR_PASS_F)
            tf[i] = start + c;
          else if (a->pass == IR_PASS_BW)
            tw[i] = start + c;
          else
            tb[i] = start + c;
        }
        free_at[r] = start + c;
        next[r]++;
        progress = true;
      }
    }
  }
  out.ok = true;
  for (uint32_t r = 0; r < R; r++) {
    if (next[r] < s->ranks[r].n_slots) {
      const struct sched_action *a = &s->ranks[r].slots[next[r]].actions[0];
      snprintf(out.why, sizeof out.why,
               "deadlock: rank %u stuck at slot %u (stage %d mb %d pass %d)", r, next[r], a->stage,
               a->mb, a->pass);
      out.ok = false;
    }
    if (free_at[r] > out.makespan)
      out.makespan = free_at[r];
    int64_t cur = 0, pk = 0;
    for (uint32_t i = 0; i < s->ranks[r].n_slots; i++)
      for (uint32_t k = 0; k < s->ranks[r].slots[i].n_actions; k++) {
        enum ir_pass p = s->ranks[r].slots[i].actions[k].pass;
        cur += p == IR_PASS_F ? 1 : p == IR_PASS_BI ? 0 : -1;
        if (cur > pk)
          pk = cur;
      }
    out.peak[r] = (uint32_t)pk;
  }
  free(next);
  free(free_at);
done:
  free(tf);
  free(tb);
  free(tw);
  free(count);
  return out;
}

/* ---- helpers -----------------------------------------------------------------------------------
 */

/* Layouts by shape, identity rank numbering. */
static int32_t layout_buf[256];
static struct sched_layout layout_single(uint32_t R) {
  for (uint32_t s = 0; s < R; s++)
    layout_buf[s] = (int32_t)s;
  return (struct sched_layout){.n_ranks = R, .n_stages = R, .stage_rank = layout_buf};
}
static struct sched_layout layout_loop(uint32_t R, uint32_t v) {
  for (uint32_t s = 0; s < R * v; s++)
    layout_buf[s] = (int32_t)(s % R);
  return (struct sched_layout){.n_ranks = R, .n_stages = R * v, .stage_rank = layout_buf};
}
static struct sched_layout layout_v(uint32_t R) {
  for (uint32_t s = 0; s < 2 * R; s++)
    layout_buf[s] = (int32_t)(s < R ? s : 2 * R - 1 - s);
  return (struct sched_layout){.n_ranks = R, .n_stages = 2 * R, .stage_rank = layout_buf};
}

/* A rank's slots in the tests' notation: "F0 B0" (stage left out) or "0F0 (0F3;3B1)". */
static char *rank_text(const struct sched_rank *rk, bool with_stage) {
  GString *g = g_string_new(NULL);
  static const char letter[] = "FBIW";
  for (uint32_t i = 0; i < rk->n_slots; i++) {
    const struct sched_slot *sl = &rk->slots[i];
    if (i)
      g_string_append_c(g, ' ');
    if (sl->n_actions == 2)
      g_string_append_c(g, '(');
    for (uint32_t k = 0; k < sl->n_actions; k++) {
      const struct sched_action *a = &sl->actions[k];
      if (k)
        g_string_append_c(g, ';');
      if (with_stage)
        g_string_append_printf(g, "%d", a->stage);
      g_string_append_printf(g, "%c%d", letter[a->pass], a->mb);
    }
    if (sl->n_actions == 2)
      g_string_append_c(g, ')');
  }
  return g_string_free(g, FALSE);
}

static char *csv_text(const struct sched_program *s) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  assert_true(sched_write_csv(s, f));
  fclose(f);
  return buf;
}

static struct sched_program *build_ok(enum sched_family f, const struct sched_layout *l,
                                      uint32_t M) {
  GError *e = NULL;
  struct sched_program *s = sched_build(f, l, M, &e);
  if (!s) {
    print_error("%s R=%u M=%u: %s\n", sched_family_name(f), l->n_ranks, M, e->message);
    g_error_free(e);
    fail();
  }
  assert_int_equal(s->family, f);
  assert_int_equal(s->n_ranks, l->n_ranks);
  assert_int_equal(s->n_stages, l->n_stages);
  assert_int_equal(s->n_microbatches, M);
  return s;
}

static struct run run_ok(const struct sched_program *s, const struct sched_layout *l,
                         bool dualpipe) {
  struct run r = execute(s, l, dualpipe);
  if (!r.ok) {
    print_error("%s R=%u M=%u: %s\n", sched_family_name(s->family), s->n_ranks, s->n_microbatches,
                r.why);
    fail();
  }
  return r;
}

/* ---- the checker itself must catch broken schedules ------------------------------------------ */

static void test_checker_catches_errors(void **state) {
  (void)state;
  struct sched_layout l = layout_single(2);
  struct sched_program *s = build_ok(SCHED_1F1B, &l, 4);
  assert_true(execute(s, &l, false).ok);
  /* rank 1 runs B0 before F0: deadlock */
  struct sched_slot t = s->ranks[1].slots[0];
  s->ranks[1].slots[0] = s->ranks[1].slots[1];
  s->ranks[1].slots[1] = t;
  struct run r = execute(s, &l, false);
  assert_false(r.ok);
  assert_non_null(strstr(r.why, "deadlock"));
  s->ranks[1].slots[1] = s->ranks[1].slots[0];
  s->ranks[1].slots[0] = t;
  /* a missing backward */
  s->ranks[0].slots[7].actions[0].pass = IR_PASS_BI;
  r = execute(s, &l, false);
  assert_false(r.ok);
  assert_non_null(strstr(r.why, "stage 0 mb 3"));
  s->ranks[0].slots[7].actions[0].pass = IR_PASS_B;
  /* an action on the wrong rank */
  s->ranks[0].slots[0].actions[0].stage = 1;
  s->ranks[1].slots[0].actions[0].stage = 0;
  assert_false(execute(s, &l, false).ok);
  sched_program_free(s);
}

/* ---- known small cases, written out by hand ------------------------------------------------- */

static void assert_ranks(const struct sched_program *s, bool with_stage, const char *const *want) {
  for (uint32_t r = 0; r < s->n_ranks; r++) {
    g_autofree char *got = rank_text(&s->ranks[r], with_stage);
    if (strcmp(got, want[r]) != 0) {
      print_error("%s rank %u:\n  got  %s\n  want %s\n", sched_family_name(s->family), r, got,
                  want[r]);
      fail();
    }
  }
}

static void test_known_cases(void **state) {
  (void)state;
  struct sched_layout l = layout_single(2);
  struct sched_program *s = build_ok(SCHED_1F1B, &l, 4);
  assert_ranks(s, false,
               (const char *const[]){"F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"});
  sched_program_free(s);

  s = build_ok(SCHED_GPIPE, &l, 3);
  assert_ranks(s, false, (const char *const[]){"F0 F1 F2 B0 B1 B2", "F0 F1 F2 B0 B1 B2"});
  sched_program_free(s);

  /* ZB-H1, R=2: rank 1 keeps one BW back and runs it last; rank 0 runs each BW at once. */
  s = build_ok(SCHED_ZEROBUBBLE, &l, 4);
  assert_ranks(s, false,
               (const char *const[]){"F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3",
                                     "F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3"});
  sched_program_free(s);

  /* Interleaved, R=2, v=2, M=4: micro-batches go through the chunks in pairs (0,1 on stage 0,
   * then on stage 2, then 2,3 ...), rank 0 warms up with (R-1)*2 + (v-1)*R = 4 forwards. */
  l = layout_loop(2, 2);
  s = build_ok(SCHED_INTERLEAVED_1F1B, &l, 4);
  assert_ranks(
      s, true,
      (const char *const[]){"0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
                            "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"});
  sched_program_free(s);

  /* DualPipeV, R=2, M=4 (DeepSeek's eight steps): rank 0 holds stages 0 and 3, rank 1 stages
   * 1 and 2; overlapped F&B pairs in parentheses, the turn rank (1) runs its first pair apart. */
  l = layout_v(2);
  s = build_ok(SCHED_DUALPIPEV, &l, 4);
  assert_ranks(
      s, true,
      (const char *const[]){
          "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1) (3F2;0B0) 3B2 (3F3;0B1) 3B3 0I2 0W2 0I3 0W3",
          "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0) (1F3;2B1) (2F3;1B1) 2B2 1B2 2I3 1I3 2W3 1W3"});
  sched_program_free(s);

  /* ZB-V, R=2, M=3: the minimum 2R-1 micro-batches. */
  s = build_ok(SCHED_ZBV, &l, 3);
  assert_ranks(s, true,
               (const char *const[]){
                   "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2",
                   "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2"});
  sched_program_free(s);

  /* DualPipe, R=2, M=4: copy A (mb 0, 1) goes down, copy B (mb 2, 3) up; each rank runs its
   * stage of A and the mirrored stage of B, starting with the copy it is the first stage of:
   * the two ranks mirror each other. */
  l = layout_single(2);
  s = build_ok(SCHED_DUALPIPE, &l, 4);
  assert_ranks(s, true,
               (const char *const[]){"0F0 1F2 0F1 1B2 (1F3;0B0) 1B3 0I1 0W1",
                                     "0F2 1F0 0F3 1B0 (1F1;0B2) 1B1 0I3 0W3"});
  sched_program_free(s);
}

/* ---- every builder over (R, M): validity and the textbook numbers --------------------------- */

/* Micro-batch counts tried for R ranks: the edges and a spread. */
static const uint32_t m_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 64};

static void test_gpipe_1f1b(void **state) {
  (void)state;
  for (uint32_t R = 1; R <= 8; R *= 2)
    for (size_t i = 0; i < G_N_ELEMENTS(m_list); i++) {
      uint32_t M = m_list[i];
      struct sched_layout l = layout_single(R);
      for (int k = 0; k < 2; k++) {
        struct sched_program *s = build_ok(k ? SCHED_1F1B : SCHED_GPIPE, &l, M);
        struct run r = run_ok(s, &l, false);
        /* GPipe and 1F1B: M(F+B) of work plus the (R-1)(F+B) fill-and-drain bubble
         * (Huang et al. 2019; Narayanan et al. 2021, §2.2.1): (M+R-1)*3. */
        assert_int_equal(r.makespan, (int64_t)(M + R - 1) * 3);
        for (uint32_t q = 0; q < R; q++)
          /* GPipe holds every micro-batch; 1F1B rank q at most min(R-q, M). */
          assert_int_equal(r.peak[q], k ? MIN(R - q, M) : M);
        sched_program_free(s);
      }
    }
}

static void test_zerobubble(void **state) {
  (void)state;
  for (uint32_t R = 1; R <= 8; R *= 2)
    for (size_t i = 0; i < G_N_ELEMENTS(m_list); i++) {
      uint32_t M = m_list[i];
      struct sched_layout l = layout_single(R);
      struct sched_program *s = build_ok(SCHED_ZEROBUBBLE, &l, M);
      struct run r = run_ok(s, &l, false);
      if (M >= R) {
        /* ZB-H1 (Qi et al. 2024, §3): bubble (R-1)(F+B-W) with B the input backward, i.e.
         * R-1 units: a third of 1F1B's 3(R-1). Total 3M+R-1. */
        assert_int_equal(r.makespan, (int64_t)3 * M + R - 1);
      } else {
        /* Fewer micro-batches than ranks: no steady state; still strictly better than 1F1B. */
        if (R > 1)
          assert_true(r.makespan < (int64_t)(M + R - 1) * 3);
        assert_true(r.makespan >= (int64_t)3 * M + R - 1);
      }
      /* Equal memory: the highest rank peak is 1F1B's, min(R, M) micro-batches. */
      uint32_t top = 0;
      for (uint32_t q = 0; q < R; q++)
        top = MAX(top, r.peak[q]);
      assert_int_equal(top, MIN(R, M));
      sched_program_free(s);
    }
}

static void test_interleaved(void **state) {
  (void)state;
  for (uint32_t R = 1; R <= 8; R *= 2)
    for (uint32_t v = 2; v <= 4; v++)
      for (uint32_t M = R; M <= 4 * R; M++)
        for (uint32_t G = R; G <= M && G <= 2 * R; G++) {
          /* G: micro-batches per group (Megatron's microbatch group per virtual stage); groups
           * of G, the last taking the rest (G + M mod G, or M when M < 2G) */
          struct sched_layout l = layout_loop(R, v);
          l.microbatch_group = G == R ? 0 : G; /* 0: the default, R */
          struct sched_program *s = build_ok(SCHED_INTERLEAVED_1F1B, &l, M);
          struct run r = run_ok(s, &l, false);
          /* Narayanan et al. 2021, §2.2.2: with v chunks per rank the bubble shrinks to
           * (R-1)(t_f+t_b)/v, t_f and t_b a rank's whole forward and backward (v chunks each). In
           * chunk units (F=1, B=2 per chunk): total = 3 M v + 3, for every M >= R and
           * group G >= R (a group never waits for the pipeline to turn round). */
          assert_int_equal(r.makespan, (int64_t)3 * M * v + 3 * (R - 1));
          uint32_t biggest = M < 2 * G ? M : G + M % G;
          for (uint32_t q = 0; q < R; q++)
            /* Megatron's warm-up, (R-1-q)*2 + (v-1)*G forwards with G the biggest group, plus
             * the first steady one. */
            assert_int_equal(r.peak[q], MIN((R - 1 - q) * 2 + (v - 1) * biggest + 1, M * v));
          sched_program_free(s);
        }
}

/* Interleaved zero bubble (PyTorch's ScheduleInterleavedZeroBubble), R=2, v=2, M=2, derived
 * by hand from _get_1f1b_rank_ops with enable_zero_bubble: one round of mpr = 2; rank 0 warms
 * up with (v-1) mpr + R-1 = 3 forwards and weighs each backward at once, rank 1 warms up with
 * 2 and holds one BW back (num_1f1b_microbatches = rank). */
static void test_interleaved_zb_known(void **state) {
  (void)state;
  struct sched_layout l = layout_loop(2, 2);
  struct sched_program *s = build_ok(SCHED_INTERLEAVED_ZEROBUBBLE, &l, 2);
  assert_ranks(s, true,
               (const char *const[]){"0F0 0F1 2F0 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1",
                                     "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1I0 3W1 1I1 1W0 1W1"});
  sched_program_free(s);
  /* M=4 on R=2: two rounds of mpr = 2: pairs of micro-batches go through the chunks in turn
   * (forward k runs chunk (k / 2) mod 2), backward chunks in the reverse turn. */
  s = build_ok(SCHED_INTERLEAVED_ZEROBUBBLE, &l, 4);
  assert_ranks(s, true,
               (const char *const[]){
                   "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 "
                   "2I3 2W3 0I2 0W2 0I3 0W3",
                   "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 "
                   "1I2 3W3 1I3 1W2 1W3"});
  sched_program_free(s);
}

/* Over R, v and every M PyTorch accepts: each (stage, mb) has one F, one BI and one BW on the
 * rank the loop layout gives it, no deadlock with F = BI = BW = 1, every F before its BI and
 * every BI before its BW (the executor waits for both), PyTorch's warm-up length, and a
 * makespan between the work plus the R-1 fill and the work plus fill and drain. */
static void test_interleaved_zb(void **state) {
  (void)state;
  for (uint32_t R = 1; R <= 8; R *= 2)
    for (uint32_t v = 2; v <= 4; v++)
      for (size_t i = 0; i < G_N_ELEMENTS(m_list); i++) {
        uint32_t M = m_list[i], rounds = MAX(1, M / R), mpr = M / rounds;
        struct sched_layout l = layout_loop(R, v);
        if (M % rounds != 0) {
          GError *e = NULL;
          assert_null(sched_build(SCHED_INTERLEAVED_ZEROBUBBLE, &l, M, &e));
          test_assert_input_error(e, "rounds");
          g_error_free(e);
          continue;
        }
        struct sched_program *s = build_ok(SCHED_INTERLEAVED_ZEROBUBBLE, &l, M);
        struct run r = run_ok(s, &l, false);
        for (uint32_t q = 0; q < R; q++) {
          const struct sched_rank *rk = &s->ranks[q];
          assert_int_equal(rk->n_slots, 3 * M * v);
          uint32_t warm = 0;
          while (warm < rk->n_slots && rk->slots[warm].actions[0].pass == IR_PASS_F)
            warm++;
          assert_int_equal(warm, MIN((v - 1) * mpr + (R - 1 - q) + 1, M * v));
          /* In flight at most: the warm-up, plus the p backwards whose BW waits. */
          assert_true(r.peak[q] <= MIN((v - 1) * mpr + R, M * v));
        }
        /* 3 M v units of work per rank plus at least the R-1 units of fill. */
        assert_true(r.makespan >= (int64_t)3 * M * v + R - 1);
        if (M % R == 0 && M >= R)
          /* In full rounds the fill and drain are all the idle time there is: ZB1P's promise. */
          assert_true(r.makespan <= (int64_t)3 * M * v + 3 * (R - 1));
        sched_program_free(s);
      }
}

static void test_zbv(void **state) {
  (void)state;
  for (uint32_t R = 1; R <= 8; R *= 2)
    for (size_t i = 0; i < G_N_ELEMENTS(m_list); i++) {
      uint32_t M = m_list[i];
      if (M < 2 * R - 1)
        continue;
      struct sched_layout l = layout_v(R);
      struct sched_program *s = build_ok(SCHED_ZBV, &l, M);
      struct run r = run_ok(s, &l, false);
      /* Each rank does 6M units (two chunks, F+BI+BW each); the last rank cannot start before
       * R-1 forwards went down the V, so 6M + R-1 is a lower bound for any schedule, and ZB-V
       * with F = BI = BW meets it: zero bubble besides the fill (Qi et al. 2024, ZB-V). */
      assert_int_equal(r.makespan, (int64_t)6 * M + R - 1);
      for (uint32_t q = 0; q < R; q++)
        /* 2R chunk activations = R whole stages: 1F1B's peak on its first rank. */
        assert_int_equal(r.peak[q], 2 * R);
      sched_program_free(s);
    }
}

static void test_dualpipe(void **state) {
  (void)state;
  for (uint32_t R = 2; R <= 8; R *= 2)
    for (uint32_t M = 2 * R; M <= 2 * R + 40; M += 2) {
      struct sched_layout l = layout_single(R);
      struct sched_program *s = build_ok(SCHED_DUALPIPE, &l, M);
      struct run r = run_ok(s, &l, true);
      /* DeepSeek-V3 report, Table 2: DualPipe's bubble is (PP/2-1)(F&B + B - 3W) with PP = R
       * ranks; here F&B = 3 (a two-action slot costs F+B), B = 2, W = 1. Work per rank: both
       * copies, M/2 micro-batches each, F+B = 3: 3M. The bound is met exactly. */
      int64_t work = 3 * (int64_t)M, bubble = (int64_t)(R / 2 - 1) * (3 + 2 - 3);
      assert_true(r.makespan >= work && r.makespan <= work + bubble);
      assert_int_equal(r.makespan, work + bubble);
      for (uint32_t q = 0; q < R; q++)
        assert_int_equal(r.peak[q], R + 1); /* Table 2: PP+1 */
      sched_program_free(s);
    }
}

static void test_dualpipev(void **state) {
  (void)state;
  for (uint32_t R = 1; R <= 8; R *= 2)
    for (uint32_t M = 2 * R; M <= 2 * R + 21; M++) {
      struct sched_layout l = layout_v(R);
      struct sched_program *s = build_ok(SCHED_DUALPIPEV, &l, M);
      struct run r = run_ok(s, &l, false);
      /* DualPipeV is DualPipe folded: PP = 2R stages, bubble (PP/2-1)(F&B + B - 3W) = 2(R-1);
       * work per rank two chunks of M micro-batches, 6M. */
      int64_t work = 6 * (int64_t)M, bubble = (int64_t)(R - 1) * (3 + 2 - 3);
      assert_true(r.makespan >= work && r.makespan <= work + bubble);
      assert_int_equal(r.makespan, work + bubble);
      for (uint32_t q = 0; q < R; q++)
        assert_int_equal(r.peak[q], 2 * R + 1); /* PP+1 */
      sched_program_free(s);
    }
}

/* Most weight gradients a rank has deferred at once: BI run, its BW not yet. */
static uint32_t max_deferred(const struct sched_rank *rk) {
  uint32_t open = 0, most = 0;
  for (uint32_t i = 0; i < rk->n_slots; i++)
    for (uint32_t k = 0; k < rk->slots[i].n_actions; k++) {
      enum ir_pass p = rk->slots[i].actions[k].pass;
      open += p == IR_PASS_BI;
      open -= p == IR_PASS_BW;
      most = open > most ? open : most;
    }
  return most;
}

/* Under full recomputation the cool-down of ZB-V, DualPipe and DualPipeV defers no weight
 * gradient: a deferred BW would hold the rerun's activations, and the last rank held R (DualPipeV)
 * or 2R - 2 (ZB-V) of them (DeepSeek-V3 on PP 16: 114 and 252 GiB). At most one weight gradient
 * waits at a time (DualPipe's steps 3 and 7). */
static void test_dualpipe_recompute(void **state) {
  (void)state;
  for (uint32_t R = 2; R <= 8; R *= 2)
    for (uint32_t M = 2 * R; M <= 2 * R + 5; M++) {
      struct sched_layout l = layout_v(R);
      struct sched_program *s = build_ok(SCHED_DUALPIPEV, &l, M);
      assert_true(max_deferred(&s->ranks[R - 1]) > 1); /* without: step 6 defers R - 1 */
      sched_program_free(s);
      l.recompute = true;
      s = build_ok(SCHED_DUALPIPEV, &l, M);
      run_ok(s, &l, false);
      for (uint32_t q = 0; q < R; q++)
        assert_true(max_deferred(&s->ranks[q]) <= 1);
      sched_program_free(s);
      s = build_ok(SCHED_ZBV, &l, M);
      run_ok(s, &l, false);
      for (uint32_t q = 0; q < R; q++)
        assert_true(max_deferred(&s->ranks[q]) <= 1);
      sched_program_free(s);
      l = layout_single(R);
      l.recompute = true;
      s = build_ok(SCHED_DUALPIPE, &l, 2 * M);
      run_ok(s, &l, true);
      for (uint32_t q = 0; q < R; q++)
        assert_true(max_deferred(&s->ranks[q]) <= 1);
      sched_program_free(s);
    }
}

/* Rank numbering need not follow stage order: the builders map positions through the layout. */
static void test_permuted_layouts(void **state) {
  (void)state;
  int32_t single[4] = {2, 0, 3, 1};
  struct sched_layout l = {.n_ranks = 4, .n_stages = 4, .stage_rank = single};
  enum sched_family fs[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_ZEROBUBBLE, SCHED_DUALPIPE};
  for (size_t i = 0; i < G_N_ELEMENTS(fs); i++) {
    struct sched_program *s = build_ok(fs[i], &l, 8);
    struct run r = run_ok(s, &l, fs[i] == SCHED_DUALPIPE);
    if (fs[i] == SCHED_1F1B)
      assert_int_equal(r.peak[2], 4); /* stage 0's rank */
    sched_program_free(s);
  }
  int32_t loop[8] = {3, 1, 0, 2, 3, 1, 0, 2};
  l = (struct sched_layout){.n_ranks = 4, .n_stages = 8, .stage_rank = loop};
  struct sched_program *s = build_ok(SCHED_INTERLEAVED_1F1B, &l, 8);
  assert_int_equal(run_ok(s, &l, false).makespan, 3 * 8 * 2 + 3 * 3);
  sched_program_free(s);
  int32_t v[8] = {1, 3, 0, 2, 2, 0, 3, 1};
  l = (struct sched_layout){.n_ranks = 4, .n_stages = 8, .stage_rank = v};
  s = build_ok(SCHED_DUALPIPEV, &l, 8);
  run_ok(s, &l, false);
  sched_program_free(s);
  s = build_ok(SCHED_ZBV, &l, 8);
  run_ok(s, &l, false);
  sched_program_free(s);
}

/* ---- refusals
 * ------------------------------------------------------------------------------------ */

static void expect_refusal(enum sched_family f, const struct sched_layout *l, uint32_t M,
                           const char *substring) {
  GError *e = NULL;
  struct sched_program *s = sched_build(f, l, M, &e);
  if (s) {
    print_error("%s R=%u S=%u M=%u was accepted\n", sched_family_name(f), l ? l->n_ranks : 0,
                l ? l->n_stages : 0, M);
    fail();
  }
  test_assert_input_error(e, substring);
  g_error_free(e);
}

static void test_refusals(void **state) {
  (void)state;
  struct sched_layout l = layout_single(4);
  expect_refusal(SCHED_1F1B, &l, 0, "between 1 and 4096");
  expect_refusal(SCHED_1F1B, &l, 4097, "between 1 and 4096");
  expect_refusal(SCHED_CUSTOM, &l, 4, "nothing to build");
  expect_refusal(SCHED_1F1B, NULL, 4, "layout is empty");
  /* wrong shapes */
  expect_refusal(SCHED_INTERLEAVED_1F1B, &l, 4, "at least 8");
  expect_refusal(SCHED_ZBV, &l, 8, "V layout");
  expect_refusal(SCHED_DUALPIPEV, &l, 8, "8 stages on 4 ranks");
  l = layout_loop(4, 2);
  expect_refusal(SCHED_1F1B, &l, 4, "one stage per rank");
  expect_refusal(SCHED_ZEROBUBBLE, &l, 4, "one stage per rank");
  expect_refusal(SCHED_DUALPIPE, &l, 8, "one stage per rank");
  expect_refusal(SCHED_DUALPIPEV, &l, 8, "stage 4 is on rank 0, stage 3 on rank 3");
  expect_refusal(SCHED_ZBV, &l, 8, "V layout");
  l = layout_v(4);
  expect_refusal(SCHED_INTERLEAVED_1F1B, &l, 4, "stage 4 is on rank 3, stage 0 on rank 0");
  l = layout_loop(4, 3);
  expect_refusal(SCHED_DUALPIPEV, &l, 8, "has 12 stages");
  int32_t twice[4] = {0, 0, 1, 2};
  l = (struct sched_layout){.n_ranks = 4, .n_stages = 4, .stage_rank = twice};
  expect_refusal(SCHED_1F1B, &l, 4, "stages 0 and 1 are both on rank 0");
  int32_t out[2] = {0, 2};
  l = (struct sched_layout){.n_ranks = 2, .n_stages = 2, .stage_rank = out};
  expect_refusal(SCHED_GPIPE, &l, 4, "stage 1 is on rank 2, outside [0, 2)");
  /* too few micro-batches, wrong parity */
  l = layout_loop(4, 2);
  expect_refusal(SCHED_INTERLEAVED_1F1B, &l, 2, "got M = 2, use M >= 4");
  l.microbatch_group = 3;
  expect_refusal(SCHED_INTERLEAVED_1F1B, &l, 6, "between the 4 ranks and the 6 micro-batches; got 3");
  l.microbatch_group = 7;
  expect_refusal(SCHED_INTERLEAVED_1F1B, &l, 6, "between the 4 ranks and the 6 micro-batches; got 7");
  l.microbatch_group = 0;
  l = layout_v(4);
  expect_refusal(SCHED_ZBV, &l, 6, "at least 2R-1 = 7");
  expect_refusal(SCHED_DUALPIPEV, &l, 7, "at least 2R = 8");
  l = layout_single(4);
  expect_refusal(SCHED_DUALPIPE, &l, 6, "at least 2R = 8");
  expect_refusal(SCHED_DUALPIPE, &l, 9, "even number of micro-batches");
  l = layout_single(3);
  expect_refusal(SCHED_DUALPIPE, &l, 8, "even number of ranks");
  /* too large to read back */
  l = layout_single(128);
  expect_refusal(SCHED_GPIPE, &l, 4096, "more than 1000000 actions");
}

static void test_family_names(void **state) {
  (void)state;
  for (int f = 0; f < SCHED_FAMILY_COUNT; f++) {
    enum sched_family back;
    assert_true(sched_family_parse(sched_family_name((enum sched_family)f), &back));
    assert_int_equal(back, f);
  }
  assert_string_equal(sched_family_name(SCHED_INTERLEAVED_1F1B), "interleaved_1f1b");
  assert_false(sched_family_parse("1F1B", NULL));
  assert_false(sched_family_parse("", NULL));
  assert_false(sched_family_parse(NULL, NULL));
  g_autofree char *name = sched_program_file_name(SCHED_DUALPIPEV, 4, 16);
  assert_string_equal(name, "dualpipev_pp4_mbs16.json");
}

/* ---- order directives
 * ---------------------------------------------------------------------------- */

static void assert_filter(const struct dir_filter *f, int32_t stage, const char *dim, int32_t mb,
                          enum ir_pass pass) {
  assert_int_equal(f->n_keys, 2);
  assert_string_equal(f->keys[0].name, "PP");
  assert_int_equal(f->keys[0].value, stage);
  assert_string_equal(f->keys[1].name, dim);
  assert_int_equal(f->keys[1].value, mb);
  assert_int_equal(f->pass, pass);
}

static void test_to_directives(void **state) {
  (void)state;
  struct sched_layout l = layout_v(2);
  struct sched_program *s = build_ok(SCHED_DUALPIPEV, &l, 4);
  struct dir_program *p = dir_program_new("test");
  GError *e = NULL;
  assert_true(sched_to_directives(s, "MB", p, &e));
  assert_int_equal(p->n, 2);
  for (uint32_t r = 0; r < 2; r++) {
    const struct dir_directive *d = &p->d[r];
    assert_int_equal(d->op, DIR_ORDER);
    assert_int_equal(d->index, r);
    assert_int_equal(d->n_slots, s->ranks[r].n_slots);
    for (uint32_t i = 0; i < d->n_slots; i++) {
      const struct sched_slot *sl = &s->ranks[r].slots[i];
      assert_int_equal(d->slot_first[i + 1] - d->slot_first[i], sl->n_actions);
      for (uint32_t k = 0; k < sl->n_actions; k++)
        assert_filter(&d->filters[d->slot_first[i] + k], sl->actions[k].stage, "MB",
                      sl->actions[k].mb, sl->actions[k].pass);
    }
  }
  /* rank 0 slot 7 is the overlapped (0F3;3B1) */
  assert_int_equal(p->d[0].slot_first[8] - p->d[0].slot_first[7], 2);
  assert_filter(&p->d[0].filters[p->d[0].slot_first[7]], 0, "MB", 3, IR_PASS_F);
  assert_filter(&p->d[0].filters[p->d[0].slot_first[7] + 1], 3, "MB", 1, IR_PASS_B);

  /* The JSON round trip through the directive parser keeps every slot. */
  cJSON *j = dir_program_to_json(p);
  struct dir_program *back = dir_program_parse_json("back", j, &e);
  assert_non_null(back);
  assert_int_equal(back->n, 2);
  assert_int_equal(back->d[1].n_slots, p->d[1].n_slots);
  assert_int_equal(back->d[1].slot_first[back->d[1].n_slots], p->d[1].slot_first[p->d[1].n_slots]);
  cJSON_Delete(j);
  dir_program_free(back);

  /* other dimension names; bad ones refused */
  assert_true(sched_to_directives(s, "mb", p, &e));
  assert_int_equal(p->n, 4);
  assert_string_equal(p->d[3].filters[0].keys[1].name, "mb");
  assert_false(sched_to_directives(s, "PASS", p, &e));
  test_assert_input_error(e, "split dimension name");
  g_clear_error(&e);
  assert_false(sched_to_directives(s, "", p, &e));
  g_clear_error(&e);
  assert_int_equal(p->n, 4);
  sched_program_free(s);

  /* A rank with a single slot orders nothing and gets no directive. */
  g_autoptr(GError) e2 = NULL;
  s = read_csv("one", "0F0\n1F0,1B0\n", &e2);
  assert_non_null(s);
  dir_program_free(p);
  p = dir_program_new("test");
  assert_true(sched_to_directives(s, "MB", p, &e));
  assert_int_equal(p->n, 1);
  assert_filter(&p->d[0].filters[0], 1, "MB", 0, IR_PASS_F);
  sched_program_free(s);
  dir_program_free(p);
}

/* ---- CSV
 * ------------------------------------------------------------------------------------------ */

static void test_csv_write(void **state) {
  (void)state;
  struct sched_layout l = layout_single(2);
  struct sched_program *s = build_ok(SCHED_1F1B, &l, 4);
  g_autofree char *t = csv_text(s);
  assert_string_equal(t, "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n");
  sched_program_free(s);
  l = layout_v(2);
  s = build_ok(SCHED_DUALPIPEV, &l, 4);
  g_autofree char *t2 = csv_text(s);
  assert_string_equal(t2,
                      "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,"
                      "(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,0I3,0W3\n"
                      "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,"
                      "(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,2W3,1W3\n");
  sched_program_free(s);
}

static void assert_same_program(const struct sched_program *a, const struct sched_program *b) {
  assert_int_equal(a->n_ranks, b->n_ranks);
  assert_int_equal(a->n_stages, b->n_stages);
  assert_int_equal(a->n_microbatches, b->n_microbatches);
  for (uint32_t r = 0; r < a->n_ranks; r++) {
    assert_int_equal(a->ranks[r].n_slots, b->ranks[r].n_slots);
    for (uint32_t i = 0; i < a->ranks[r].n_slots; i++) {
      const struct sched_slot *x = &a->ranks[r].slots[i], *y = &b->ranks[r].slots[i];
      assert_int_equal(x->n_actions, y->n_actions);
      for (uint32_t k = 0; k < x->n_actions; k++) {
        assert_int_equal(x->actions[k].stage, y->actions[k].stage);
        assert_int_equal(x->actions[k].mb, y->actions[k].mb);
        assert_int_equal(x->actions[k].pass, y->actions[k].pass);
      }
    }
  }
}

static void test_csv_round_trip(void **state) {
  (void)state;
  struct {
    enum sched_family f;
    uint32_t R, v, M;
  } cases[] = {{SCHED_GPIPE, 4, 1, 6},      {SCHED_1F1B, 8, 1, 16},
               {SCHED_ZEROBUBBLE, 4, 1, 9}, {SCHED_INTERLEAVED_1F1B, 4, 2, 8},
               {SCHED_ZBV, 4, 2, 7},        {SCHED_DUALPIPE, 8, 1, 16},
               {SCHED_DUALPIPEV, 4, 2, 11}};
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct sched_layout l = cases[i].f == SCHED_ZBV || cases[i].f == SCHED_DUALPIPEV
                                ? layout_v(cases[i].R)
                            : cases[i].v > 1 ? layout_loop(cases[i].R, cases[i].v)
                                             : layout_single(cases[i].R);
    struct sched_program *s = build_ok(cases[i].f, &l, cases[i].M);
    g_autofree char *t1 = csv_text(s);
    GError *e = NULL;
    struct sched_program *back = read_csv("rt.csv", t1, &e);
    assert_non_null(back);
    assert_int_equal(back->family, SCHED_CUSTOM);
    assert_same_program(s, back);
    g_autofree char *t2 = csv_text(back);
    assert_string_equal(t1, t2);
    sched_program_free(back);
    sched_program_free(s);
  }
}

/* What PyTorch writes (csv module: "\r\n", idle steps as empty cells) reads as well. */
static void test_csv_read_pytorch_style(void **state) {
  (void)state;
  GError *e = NULL;
  struct sched_program *s =
      read_csv("pt.csv", "0F0,,0B0, 0F1 \r\n,1F0,(1F1;1B0)OVERLAP_F_B,,1B1\r\n\r\n", &e);
  assert_non_null(s);
  assert_int_equal(s->n_ranks, 3);
  assert_int_equal(s->n_stages, 2);
  assert_int_equal(s->n_microbatches, 2);
  g_autofree char *r0 = rank_text(&s->ranks[0], true);
  g_autofree char *r1 = rank_text(&s->ranks[1], true);
  assert_string_equal(r0, "0F0 0B0 0F1");
  assert_string_equal(r1, "1F0 (1F1;1B0) 1B1");
  assert_int_equal(s->ranks[2].n_slots, 0);
  sched_program_free(s);
  /* no final newline */
  s = read_csv("pt.csv", "0F0,0B0", &e);
  assert_non_null(s);
  assert_int_equal(s->n_ranks, 1);
  sched_program_free(s);
}

static void expect_csv_error(const char *text, const char *substring);

/* PyTorch's default dump (format "compute_comms", here of 1F1B on two ranks with FSDP): the
 * communication cells are skipped, counted in the note by kind, and the compute order is kept;
 * a compute-only file has no note. */
static void test_csv_read_pytorch_comms(void **state) {
  (void)state;
  GError *e = NULL;
  struct sched_program *s = read_csv(
      "pt.csv",
      "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0RESHARD,0REDUCE_GRAD\r\n"
      "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1RESHARD,1REDUCE_GRAD\r\n",
      &e);
  assert_non_null(s);
  g_autofree char *r0 = rank_text(&s->ranks[0], true);
  g_autofree char *r1 = rank_text(&s->ranks[1], true);
  assert_string_equal(r0, "0F0 0F1 0B0 0B1");
  assert_string_equal(r1, "1F0 1B0 1F1 1B1");
  /* the column of a kept cell is its column in the file, comm cells counted */
  assert_int_equal(s->ranks[0].slots[2].column, 7);
  assert_non_null(s->note);
  assert_string_equal(
      s->note, "pt.csv: skipped 14 communication cells (REDUCE_GRAD 2, UNSHARD 2, RESHARD 2, "
               "SEND_F 2, RECV_F 2, SEND_B 2, RECV_B 2): the plan makes its own (gradient "
               "reduction comes from the replicate directives; parameter gathers come from the "
               "shard directives; pipeline sends and receives come from the placement)");
  sched_program_free(s);
  /* PyTorch's GPipe and 1F1B dumps wait for the reduction after it (WAIT_REDUCE_GRAD) */
  s = read_csv("pt.csv", "0F0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n", &e);
  assert_non_null(s);
  g_autofree char *w0 = rank_text(&s->ranks[0], true);
  assert_string_equal(w0, "0F0 0B0");
  assert_non_null(strstr(s->note, "(WAIT_REDUCE_GRAD 1, REDUCE_GRAD 1)"));
  sched_program_free(s);
  s = read_csv("pt.csv", "0F0,0B0\n", &e);
  assert_non_null(s);
  assert_null(s->note);
  sched_program_free(s);
  /* a row of communication only is a rank with nothing to compute */
  s = read_csv("pt.csv", "0F0,0B0\n1RECV_F0\n", &e);
  assert_non_null(s);
  assert_int_equal(s->n_ranks, 2);
  assert_int_equal(s->ranks[1].n_slots, 0);
  assert_non_null(strstr(s->note, "skipped 1 communication cell (RECV_F 1)"));
  sched_program_free(s);
  expect_csv_error("0SEND_F0,1RECV_F0\n", "no actions");
}

static void expect_csv_error(const char *text, const char *substring) {
  GError *e = NULL;
  struct sched_program *s = read_csv("bad.csv", text, &e);
  if (s) {
    print_error("accepted: %s\n", text);
    fail();
  }
  test_assert_input_error(e, substring);
  assert_non_null(strstr(e->message, "bad.csv: "));
  g_error_free(e);
}

static void test_csv_errors(void **state) {
  (void)state;
  expect_csv_error("", "no actions");
  expect_csv_error("\n\n", "no actions");
  expect_csv_error("0F0,0X1\n", "row 1, column 2: cell \"0X1\" is malformed");
  expect_csv_error("0F0\n0F1,F2\n", "row 2, column 2: cell \"F2\"");
  expect_csv_error("0F\n", "row 1, column 1");
  expect_csv_error("0F1x\n", "column 1");
  expect_csv_error("-1F0\n", "column 1");
  expect_csv_error("0F4096\n", "malformed");
  expect_csv_error("65536F0\n", "malformed");
  expect_csv_error("0F0,\"0B0\"\n", "row 1, column 2");
  expect_csv_error("(0F0;0B1)\n", "malformed");
  expect_csv_error("(0F0)OVERLAP_F_B\n", "malformed");
  expect_csv_error("(0F0;0B1;0F1)OVERLAP_F_B\n", "malformed");
  expect_csv_error("(0F0;0B1)OVERLAP_F_Bx\n", "malformed");
  /* communication cells must be whole, as PyTorch's regex reads them */
  expect_csv_error("0F0,0SEND_X0\n", "column 2: cell \"0SEND_X0\" is malformed");
  expect_csv_error("0F0,SEND_F0\n", "column 2");
  expect_csv_error("0F0,0SEND_F0x\n", "column 2");
  expect_csv_error("0F0,0UNSHARD4096\n", "column 2");
  expect_csv_error("0F0,0B0\n1F0,0F0\n", "row 2, column 2: cell \"0F0\" repeats an action");
  expect_csv_error("(0F0;0F0)OVERLAP_F_B\n", "repeats");
  expect_csv_error("0F0,0I0,0B0\n", "column 3: cell \"0B0\" mixes a full backward");
  expect_csv_error("0F0,0B0,0W0\n", "mixes");
  expect_csv_error("0F0,0F\x01\n", "\\x01");
}

/* ---- base schedules and the harness --------------------------------------------------------- */

static struct dir_program *load(const char *file) {
  g_autofree char *path = g_strdup_printf("directives/base-schedules/%s", file);
  GError *e = NULL;
  struct dir_program *p = dir_program_load_file(path, &e);
  if (!p) {
    print_error("%s\n", e->message);
    fail();
  }
  return p;
}

static void test_base_schedule_layouts(void **state) {
  (void)state;
  struct {
    const char *file;
    uint32_t stages, ranks;
    int32_t stage_rank[8];
  } cases[] = {
      {"dp2.json", 1, 1, {0}},
      {"pp2_dp2_ep2.json", 2, 2, {0, 1}},
      {"pp2_dp2_ep2_bucket100.json", 2, 2, {0, 1}},
      {"pp2_dp2_ep2_zero2.json", 2, 2, {0, 1}},
      {"pp2_dp2_ep2_zero3.json", 2, 2, {0, 1}},
      {"pp2_dp2_ep2_custom_order.json", 2, 2, {0, 1}},
      {"pp4_dp2_ep2_interleaved.json", 4, 2, {0, 1, 0, 1}},
      {"pp4_dp2_ep2_v_placement.json", 4, 2, {0, 1, 1, 0}},
      {"pp4.json", 4, 4, {0, 1, 2, 3}},
      {"pp4_v.json", 8, 4, {0, 1, 2, 3, 3, 2, 1, 0}},
      {"pp4_interleaved.json", 8, 4, {0, 1, 2, 3, 0, 1, 2, 3}},
      {"pp8.json", 8, 8, {0, 1, 2, 3, 4, 5, 6, 7}},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    struct dir_program *p = load(cases[i].file);
    uint32_t R = 0;
    GError *e = NULL;
    g_autofree int32_t *sr = sched_layout_from_program(p, cases[i].stages, &R, &e);
    assert_non_null(sr);
    assert_int_equal(R, cases[i].ranks);
    for (uint32_t s = 0; s < cases[i].stages; s++)
      assert_int_equal(sr[s], cases[i].stage_rank[s]);
    dir_program_free(p);
  }
  /* The replicated and expert-sharded files keep the pipeline groups they name. */
  struct dir_program *p = load("pp2_dp2_ep2_zero3.json");
  for (uint32_t i = 0; i < p->n; i++)
    if (p->d[i].op == DIR_REPLICATE)
      assert_true(p->d[i].shard_grads && p->d[i].shard_params);
  dir_program_free(p);
  /* Unplaced stages sit on device 0, with anything placed on [0]. */
  p = load("pp4.json");
  dir_program_remove_op(p, DIR_PLACE);
  uint32_t R = 9;
  g_autofree int32_t *sr = sched_layout_from_program(p, 3, &R, NULL);
  assert_int_equal(R, 1);
  assert_int_equal(sr[2], 0);
  dir_program_free(p);
}

static uint32_t count_op(const struct dir_program *p, enum dir_op op) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->n; i++)
    n += p->d[i].op == op;
  return n;
}

static void test_prepare_program(void **state) {
  (void)state;
  GError *e = NULL;
  /* 1F1B on the custom-order base: its orders are dropped, the split rewritten to 4. */
  struct dir_program *p = load("pp2_dp2_ep2_custom_order.json");
  struct sched_options o = {.family = SCHED_1F1B, .ranks = 2, .mbs = 4};
  assert_true(sched_prepare_program(p, 2, &o, &e));
  assert_int_equal(count_op(p, DIR_SPLIT), 1);
  assert_int_equal(count_op(p, DIR_ORDER), 2);
  for (uint32_t i = 0; i < p->n; i++) {
    if (p->d[i].op == DIR_SPLIT)
      assert_int_equal(p->d[i].num_microbatches, 4);
    if (p->d[i].op == DIR_ORDER)
      assert_int_equal(p->d[i].n_slots, 8);
  }
  dir_program_free(p);

  /* --keep-order keeps the base's two orders next to the builder's */
  p = load("pp2_dp2_ep2_custom_order.json");
  o.keep_order = true;
  assert_true(sched_prepare_program(p, 2, &o, &e));
  assert_int_equal(count_op(p, DIR_ORDER), 4);
  dir_program_free(p);

  /* custom keeps the file, enforcing only the split */
  p = load("pp2_dp2_ep2_custom_order.json");
  uint32_t n_before = p->n;
  o = (struct sched_options){.family = SCHED_CUSTOM, .mbs = 2};
  assert_true(sched_prepare_program(p, 2, &o, &e));
  assert_int_equal(p->n, n_before);
  dir_program_free(p);

  /* No split in the base: one is added; with --ranks 0 the layout says R. */
  p = load("pp4_interleaved.json");
  o = (struct sched_options){.family = SCHED_INTERLEAVED_1F1B, .mbs = 8};
  assert_true(sched_prepare_program(p, 8, &o, &e));
  assert_int_equal(count_op(p, DIR_SPLIT), 1);
  assert_int_equal(count_op(p, DIR_ORDER), 4);
  assert_string_equal(p->d[8].dim_name, "MB");
  assert_int_equal(p->d[8].num_microbatches, 8);
  dir_program_free(p);

  /* Wrong family for the layout, wrong rank count, no micro-batch count: refused. */
  p = load("pp4_interleaved.json");
  o = (struct sched_options){.family = SCHED_DUALPIPEV, .mbs = 8};
  assert_false(sched_prepare_program(p, 8, &o, &e));
  test_assert_input_error(e, "V layout");
  assert_non_null(strstr(e->message, "pp4_interleaved.json"));
  g_clear_error(&e);
  dir_program_free(p);
  p = load("pp4_v.json");
  o = (struct sched_options){.family = SCHED_ZBV, .ranks = 8, .mbs = 16};
  assert_false(sched_prepare_program(p, 8, &o, &e));
  test_assert_input_error(e, "on 4 device groups");
  g_clear_error(&e);
  /* a failed call left p as it was: still no split, so no count is known */
  assert_int_equal(count_op(p, DIR_SPLIT), 0);
  o = (struct sched_options){.family = SCHED_ZBV, .ranks = 4};
  assert_false(sched_prepare_program(p, 8, &o, &e));
  test_assert_input_error(e, "--mbs");
  g_clear_error(&e);
  o.mbs = 7;
  assert_true(sched_prepare_program(p, 8, &o, &e));
  assert_int_equal(count_op(p, DIR_ORDER), 4);
  dir_program_free(p);

  /* DualPipe places copy B's micro-batches on the mirrored ranks. */
  p = load("pp4.json");
  o = (struct sched_options){.family = SCHED_DUALPIPE, .ranks = 4, .mbs = 8};
  assert_true(sched_prepare_program(p, 4, &o, &e));
  assert_int_equal(count_op(p, DIR_PLACE), 4 + 4 * 4);
  assert_int_equal(count_op(p, DIR_ORDER), 4);
  for (uint32_t i = 0; i < p->n; i++) {
    const struct dir_directive *d = &p->d[i];
    if (d->op != DIR_PLACE || d->filter.n_keys != 2)
      continue;
    assert_true(d->filter.keys[1].value >= 4);
    assert_int_equal(d->devices[0], 3 - d->filter.keys[0].value);
  }
  dir_program_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checker_catches_errors),
      cmocka_unit_test(test_known_cases),
      cmocka_unit_test(test_gpipe_1f1b),
      cmocka_unit_test(test_zerobubble),
      cmocka_unit_test(test_interleaved),
      cmocka_unit_test(test_interleaved_zb_known),
      cmocka_unit_test(test_interleaved_zb),
      cmocka_unit_test(test_zbv),
      cmocka_unit_test(test_dualpipe),
      cmocka_unit_test(test_dualpipev),
      cmocka_unit_test(test_dualpipe_recompute),
      cmocka_unit_test(test_permuted_layouts),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_family_names),
      cmocka_unit_test(test_to_directives),
      cmocka_unit_test(test_csv_write),
      cmocka_unit_test(test_csv_round_trip),
      cmocka_unit_test(test_csv_read_pytorch_style),
      cmocka_unit_test(test_csv_read_pytorch_comms),
      cmocka_unit_test(test_csv_errors),
      cmocka_unit_test(test_base_schedule_layouts),
      cmocka_unit_test(test_prepare_program),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
