/* schedule: the PyTorch pipeline-schedule CSV interchange (torch.distributed.pipelining,
 * _dump_csv / _load_csv). One row per rank, in rank order, one cell per action: "<stage>F<mb>"
 * forward, "<stage>B<mb>" full backward, "<stage>I<mb>" backward for inputs, "<stage>W<mb>"
 * backward for weights, "(<a>;<b>)OVERLAP_F_B" two actions that may interleave, an empty cell
 * an idle step (skipped on reading). Rows end in "\n" ("\r\n" is read too, as Python's csv
 * module writes it); spaces around a cell are ignored, as PyTorch's _Action.from_str strips
 * them. The communication cells of PyTorch's default "compute_comms" dialect (SEND_F, RECV_F,
 * SEND_B, RECV_B, SEND_F_RECV_B, SEND_B_RECV_F, UNSHARD, RESHARD, REDUCE_GRAD, WAIT_REDUCE_GRAD
 * (the wait PyTorch's GPipe and 1F1B schedules put after REDUCE_GRAD), with or without
 * a micro-batch) are read and skipped, counted in the program's note: the plan makes its own
 * (pipeline sends and receives from the placement, UNSHARD/RESHARD from shard directives,
 * REDUCE_GRAD from replicate). Writing gives the compute-only dialect; writing what was read
 * gives the same bytes back for every file this writer produced. */
#include <string.h>

#include "../base/json.h"
#include "schedule-impl.h"
#include "schedule.h"

static bool write_action(FILE *f, const struct sched_action *a) {
  return fprintf(f, "%d%c%d", a->stage, sched_pass_letter(a->pass), a->mb) > 0;
}

bool sched_write_csv(const struct sched_program *s, FILE *f) {
  PIPER_ASSERT(s && f);
  for (uint32_t r = 0; r < s->n_ranks; r++) {
    const struct sched_rank *rk = &s->ranks[r];
    for (uint32_t i = 0; i < rk->n_slots; i++) {
      const struct sched_slot *sl = &rk->slots[i];
      if (i > 0)
        fputc(',', f);
      if (sl->n_actions == 2) {
        fputc('(', f);
        write_action(f, &sl->actions[0]);
        fputc(';', f);
        write_action(f, &sl->actions[1]);
        fputs(")OVERLAP_F_B", f);
      } else {
        write_action(f, &sl->actions[0]);
      }
    }
    fputc('\n', f);
  }
  return !ferror(f);
}

/* ---- reading --------------------------------------------------------------------------------- */

#define CELL_QUOTE_MAX 40

/* A cell made safe for a one-line message: quoted, escaped, cut after CELL_QUOTE_MAX bytes. */
static char *quote_cell(const char *s, size_t n) {
  return piper_quote(s, n, CELL_QUOTE_MAX);
}

/* Reads a decimal index of at most 9 digits at s[*i], below limit. */
static bool read_index(const char *s, size_t n, size_t *i, int64_t limit, int32_t *out) {
  size_t start = *i;
  int64_t v = 0;
  while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
    if (*i - start >= 9)
      return false;
    v = v * 10 + (s[*i] - '0');
    (*i)++;
  }
  if (*i == start || v >= limit)
    return false;
  *out = (int32_t)v;
  return true;
}

/* One "<stage><letter><mb>" occupying all of s[0..n). */
static bool parse_action(const char *s, size_t n, struct sched_action *a) {
  size_t i = 0;
  if (!read_index(s, n, &i, SCHED_MAX_STAGES, &a->stage) || i >= n)
    return false;
  switch (s[i++]) {
  case 'F': a->pass = IR_PASS_F; break;
  case 'B': a->pass = IR_PASS_B; break;
  case 'I': a->pass = IR_PASS_BI; break;
  case 'W': a->pass = IR_PASS_BW; break;
  default: return false;
  }
  return read_index(s, n, &i, DIR_MAX_MICROBATCHES, &a->mb) && i == n;
}

/* The communication actions of PyTorch's _action_regex, longest first so that a name that
 * begins another ("SEND_F" in "SEND_F_RECV_B") is tried after it; and what the plan does
 * instead of each. */
static const struct {
  const char *name;
  const char *instead;
} comm_kinds[] = {
    {"SEND_F_RECV_B", "pipeline sends and receives come from the placement"},
    {"SEND_B_RECV_F", "pipeline sends and receives come from the placement"},
    {"WAIT_REDUCE_GRAD", "gradient reduction comes from the replicate directives"},
    {"REDUCE_GRAD", "gradient reduction comes from the replicate directives"},
    {"UNSHARD", "parameter gathers come from the shard directives"},
    {"RESHARD", "parameter gathers come from the shard directives"},
    {"SEND_F", "pipeline sends and receives come from the placement"},
    {"RECV_F", "pipeline sends and receives come from the placement"},
    {"SEND_B", "pipeline sends and receives come from the placement"},
    {"RECV_B", "pipeline sends and receives come from the placement"},
};
#define N_COMM_KINDS G_N_ELEMENTS(comm_kinds)

/* The comm_kinds index of a whole cell "<stage><NAME>[<mb>]", or -1. */
static int comm_kind(const char *s, size_t n) {
  size_t i = 0;
  int32_t index;
  if (!read_index(s, n, &i, SCHED_MAX_STAGES, &index))
    return -1;
  for (size_t k = 0; k < N_COMM_KINDS; k++) {
    size_t len = strlen(comm_kinds[k].name);
    if (n - i < len || memcmp(s + i, comm_kinds[k].name, len) != 0)
      continue;
    size_t j = i + len;
    if (j < n && !read_index(s, n, &j, DIR_MAX_MICROBATCHES, &index))
      return -1;
    return j == n ? (int)k : -1;
  }
  return -1;
}

/* "name: skipped 8 communication cells (SEND_F 2, RECV_F 2, ...): the plan makes its own
 * (...)" from the counts per comm_kinds entry; NULL when none was skipped. */
static char *comm_note(const char *name, const uint32_t *count) {
  uint32_t total = 0;
  for (size_t k = 0; k < N_COMM_KINDS; k++)
    total += count[k];
  if (total == 0)
    return NULL;
  GString *g = g_string_new(NULL);
  g_string_append_printf(g, "%s: skipped %u communication cell%s (", name, total,
                         total == 1 ? "" : "s");
  const char *sep = "";
  for (size_t k = 0; k < N_COMM_KINDS; k++)
    if (count[k]) {
      g_string_append_printf(g, "%s%s %u", sep, comm_kinds[k].name, count[k]);
      sep = ", ";
    }
  g_string_append(g, "): the plan makes its own (");
  sep = "";
  for (size_t k = 0; k < N_COMM_KINDS; k++) {
    bool first = count[k] > 0;
    for (size_t j = 0; j < k && first; j++) /* each reason once */
      first = !(count[j] && strcmp(comm_kinds[j].instead, comm_kinds[k].instead) == 0);
    if (first) {
      g_string_append_printf(g, "%s%s", sep, comm_kinds[k].instead);
      sep = "; ";
    }
  }
  g_string_append(g, ")");
  return g_string_free(g, FALSE);
}

static bool parse_cell(const char *s, size_t n, struct sched_slot *slot) {
  static const char suffix[] = ")OVERLAP_F_B";
  size_t sl = sizeof suffix - 1;
  memset(slot, 0, sizeof *slot);
  if (n > 0 && s[0] == '(') {
    if (n < 1 + sl || memcmp(s + n - sl, suffix, sl) != 0)
      return false;
    const char *in = s + 1;
    size_t in_n = n - 1 - sl;
    const char *semi = memchr(in, ';', in_n);
    if (!semi)
      return false;
    size_t first = (size_t)(semi - in);
    slot->n_actions = 2;
    return parse_action(in, first, &slot->actions[0]) &&
           parse_action(semi + 1, in_n - first - 1, &slot->actions[1]);
  }
  slot->n_actions = 1;
  return parse_action(s, n, &slot->actions[0]);
}

/* Key of an action for the duplicate check: stage < 2^16, mb < 2^12, pass < 4. */
static guint action_key(const struct sched_action *a) {
  return ((guint)a->stage * DIR_MAX_MICROBATCHES + (guint)a->mb) * 4u + (guint)a->pass + 1u;
}
G_STATIC_ASSERT((uint64_t)SCHED_MAX_STAGES *DIR_MAX_MICROBATCHES * 4 < UINT32_MAX);

/* Row and column (1-based, cells counted by commas) of byte pos of text. */
static void locate_byte(const char *text, size_t pos, uint32_t *row, uint32_t *col) {
  *row = 1;
  *col = 1;
  for (size_t i = 0; i < pos; i++) {
    if (text[i] == '\n') {
      (*row)++;
      *col = 1;
    } else if (text[i] == ',') {
      (*col)++;
    }
  }
}

/* The reader's state: the rows so far, the actions seen (for repeats), the extent of the
 * indices and the communication cells skipped. */
struct csv_reader {
  const char *name;
  struct sched_rows w;
  GHashTable *seen;
  int32_t max_stage, max_mb;
  uint32_t row, col;
  uint32_t comm_count[N_COMM_KINDS];
};

/* A cell's fault: "name: row R, column C: cell "..." what". */
static bool cell_error(const struct csv_reader *rd, const char *cell, size_t n, const char *what,
                       GError **err) {
  g_autofree char *q = quote_cell(cell, n);
  return piper_input_error(err, "%s: row %u, column %u: cell %s %s", rd->name, rd->row, rd->col, q,
                           what);
}

/* Notes a's key; false when a repeats an action or mixes a full backward with a split one of
 * the same (stage, mb) (they cannot both run). */
static bool note_action(struct csv_reader *rd, const struct sched_action *a, const char **why) {
  gpointer key = GUINT_TO_POINTER(action_key(a));
  if (g_hash_table_contains(rd->seen, key)) {
    *why = "repeats an action already scheduled";
    return false;
  }
  g_hash_table_add(rd->seen, key);
  struct sched_action other = *a;
  bool clash = false;
  if (a->pass == IR_PASS_B) {
    other.pass = IR_PASS_BI;
    clash = g_hash_table_contains(rd->seen, GUINT_TO_POINTER(action_key(&other)));
    other.pass = IR_PASS_BW;
    clash = clash || g_hash_table_contains(rd->seen, GUINT_TO_POINTER(action_key(&other)));
  } else if (a->pass == IR_PASS_BI || a->pass == IR_PASS_BW) {
    other.pass = IR_PASS_B;
    clash = g_hash_table_contains(rd->seen, GUINT_TO_POINTER(action_key(&other)));
  }
  if (clash) {
    *why = "mixes a full backward (B) with a split one (I/W) of the same stage and micro-batch";
    return false;
  }
  rd->max_stage = MAX(rd->max_stage, a->stage);
  rd->max_mb = MAX(rd->max_mb, a->mb);
  return true;
}

/* One non-empty cell of row rank: a communication cell counted and skipped, or a slot. */
static bool read_cell(struct csv_reader *rd, uint32_t rank, const char *cell, size_t n,
                      GError **err) {
  int comm = comm_kind(cell, n);
  if (comm >= 0) {
    rd->comm_count[comm]++;
    return true;
  }
  struct sched_slot slot;
  if (!parse_cell(cell, n, &slot))
    return cell_error(rd, cell, n,
                      "is malformed (expected <stage>F<mb>, <stage>B<mb>, <stage>I<mb>, "
                      "<stage>W<mb>, (<a>;<b>)OVERLAP_F_B or a communication cell such as "
                      "1SEND_F0, indices below 65536 and 4096)",
                      err);
  slot.column = rd->col;
  const char *why = NULL;
  for (uint32_t k = 0; k < slot.n_actions; k++)
    if (!note_action(rd, &slot.actions[k], &why))
      return cell_error(rd, cell, n, why, err);
  if (rd->w.n_actions + slot.n_actions > SCHED_MAX_ACTIONS)
    return piper_input_error(err, "%s: more than %u actions", rd->name, SCHED_MAX_ACTIONS);
  sched_rows_push(&rd->w, rank, &slot);
  return true;
}

/* One row (without its line end): its cells, split at commas, spaces around them dropped. */
static bool read_row(struct csv_reader *rd, const char *line, size_t len, GError **err) {
  if (++rd->row > SCHED_MAX_RANKS)
    return piper_input_error(err, "%s: more than %u rows (one per rank)", rd->name,
                             (unsigned)SCHED_MAX_RANKS);
  uint32_t rank = sched_rows_add_rank(&rd->w);
  rd->col = 0;
  for (size_t at = 0; at <= len;) {
    const char *c = memchr(line + at, ',', len - at);
    size_t end = c ? (size_t)(c - line) : len, b = at, e = end;
    rd->col++;
    while (b < e && (line[b] == ' ' || line[b] == '\t'))
      b++;
    while (e > b && (line[e - 1] == ' ' || line[e - 1] == '\t'))
      e--;
    if (e > b && !read_cell(rd, rank, line + b, e - b, err))
      return false;
    if (!c)
      break;
    at = end + 1;
  }
  return true;
}

struct sched_program *sched_read_csv(const char *name, const char *text, size_t len,
                                     GError **err) {
  if (!name)
    name = "<csv>";
  if (!text) {
    piper_input_error(err, "%s: no text", name);
    return NULL;
  }
  const char *nul = memchr(text, '\0', len);
  if (nul) { /* a reader stopping at the NUL would silently drop the rest of the file */
    uint32_t r, c;
    locate_byte(text, (size_t)(nul - text), &r, &c);
    piper_input_error(err, "%s: row %u, column %u: NUL byte (not a text file)", name, r, c);
    return NULL;
  }
  struct csv_reader rd = {.name = name, .max_stage = -1, .max_mb = -1};
  sched_rows_init(&rd.w, 0);
  rd.seen = g_hash_table_new(g_direct_hash, g_direct_equal);
  bool ok = true;
  for (const char *line = text; ok && *line;) {
    const char *nl = strchr(line, '\n');
    size_t n = nl ? (size_t)(nl - line) : strlen(line);
    const char *next = nl ? nl + 1 : line + n;
    if (n > 0 && line[n - 1] == '\r')
      n--;
    ok = read_row(&rd, line, n, err);
    line = next;
  }
  if (ok && (rd.row == 0 || rd.max_stage < 0))
    ok = piper_input_error(
        err, "%s: no actions (expected one row per rank of cells such as 0F0,0B0)", name);
  g_hash_table_destroy(rd.seen);
  if (!ok) {
    sched_rows_free(&rd.w);
    return NULL;
  }
  struct sched_program *s =
      sched_rows_finish(&rd.w, SCHED_CUSTOM, (uint32_t)rd.max_stage + 1, (uint32_t)rd.max_mb + 1);
  s->note = comm_note(name, rd.comm_count);
  return s;
}

/* ---- checking an import against its program ------------------------------------------------ */

/* Bits of the passes seen per (stage, mb). */
enum { SEEN_F = 1, SEEN_B = 2, SEEN_I = 4, SEEN_W = 8 };

static uint8_t pass_bit(enum ir_pass p) {
  switch (p) {
  case IR_PASS_F: return SEEN_F;
  case IR_PASS_B: return SEEN_B;
  case IR_PASS_BI: return SEEN_I;
  case IR_PASS_BW: return SEEN_W;
  default: PIPER_UNREACHABLE();
  }
}

/* "row R, column C" of a slot (just "row R" for a slot not read from a CSV). */
static const char *slot_place(char *buf, size_t len, uint32_t rank, const struct sched_slot *sl) {
  if (sl->column)
    snprintf(buf, len, "row %u, column %u", rank + 1, sl->column);
  else
    snprintf(buf, len, "row %u", rank + 1);
  return buf;
}

/* Marks every action of s in seen[stage * M + mb]; fails on an action outside the program or on
 * the wrong rank. */
static bool mark_actions(const struct sched_program *s, const char *name, const int32_t *mb_rank,
                         uint32_t n_stages, uint32_t M, uint8_t *seen, GError **err) {
  char at[64];
  for (uint32_t r = 0; r < s->n_ranks; r++) {
    const struct sched_rank *rk = &s->ranks[r];
    for (uint32_t i = 0; i < rk->n_slots; i++)
      for (uint32_t k = 0; k < rk->slots[i].n_actions; k++) {
        const struct sched_action *a = &rk->slots[i].actions[k];
        const char *where = slot_place(at, sizeof at, r, &rk->slots[i]);
        if ((uint32_t)a->stage >= n_stages)
          return piper_input_error(err, "%s: %s: stage %d, but the program has %u stages", name,
                                   where, a->stage, n_stages);
        if ((uint32_t)a->mb >= M)
          return piper_input_error(err, "%s: %s: micro-batch %d, but the program splits into %u",
                                   name, where, a->mb, M);
        int32_t want = mb_rank[(size_t)a->stage * M + (size_t)a->mb];
        if ((uint32_t)want != r)
          return piper_input_error(err,
                                   "%s: %s schedules stage %d, micro-batch %d, which the "
                                   "placement puts on pipeline rank %d (row %d)",
                                   name, where, a->stage, a->mb, want, want + 1);
        seen[(size_t)a->stage * M + (size_t)a->mb] |= pass_bit(a->pass);
      }
  }
  return true;
}

bool sched_check_complete(const struct sched_program *s, const char *name, const int32_t *mb_rank,
                          uint32_t n_stages, uint32_t n_ranks, uint32_t n_microbatches,
                          GError **err) {
  if (s->n_ranks != n_ranks)
    return piper_input_error(err,
                             "%s: %u rows, but the placement has %u pipeline ranks (one row per "
                             "rank)",
                             name, s->n_ranks, n_ranks);
  uint32_t M = n_microbatches;
  uint8_t *seen = g_new0(uint8_t, (size_t)n_stages * M);
  bool ok = mark_actions(s, name, mb_rank, n_stages, M, seen, err);
  for (uint32_t st = 0; ok && st < n_stages; st++)
    for (uint32_t mb = 0; ok && mb < M; mb++) {
      uint8_t b = seen[(size_t)st * M + mb];
      const char *missing = !(b & SEEN_F)                              ? "F"
                            : !(b & SEEN_B) && !(b & SEEN_I)           ? "B (or I and W)"
                            : !(b & SEEN_B) && !(b & SEEN_W)           ? "W"
                            : !(b & SEEN_B) && (b & SEEN_W) && !(b & SEEN_I) ? "I"
                                                                       : NULL;
      if (missing)
        ok = piper_input_error(err,
                               "%s: row %d has no %s action for stage %u, micro-batch %u (every "
                               "action of the pipeline must be scheduled)",
                               name, mb_rank[(size_t)st * M + mb] + 1, missing, st, mb);
    }
  g_free(seen);
  return ok;
}
