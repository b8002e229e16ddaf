/* gpu_layout: pure functions behind the cuda backend's start-up decisions (see the header). */
#include <glib.h>
#include <math.h>
#include <string.h>

#include "../base/assert.h"
#include "gpu_layout.h"

int exec_gpu_pick(uint32_t local_rank, uint32_t local_size, int n_visible) {
  PIPER_ASSERT(local_rank < local_size);
  if (n_visible <= 0)
    return -1;
  return (int)(local_rank % (uint32_t)n_visible);
}

bool exec_gpu_shared(const uint8_t *uuids, uint32_t n_local, uint32_t me) {
  PIPER_ASSERT(me < n_local);
  for (uint32_t k = 0; k < n_local; k++)
    if (k != me && memcmp(uuids + 16 * (size_t)k, uuids + 16 * (size_t)me, 16) == 0)
      return true;
  return false;
}

struct exec_gpu_comm_rank exec_gpu_comm_rank(const uint32_t *members, uint32_t n_members,
                                             uint32_t world_rank) {
  struct exec_gpu_comm_rank r = {false, 0, n_members, n_members ? members[0] : 0};
  for (uint32_t k = 0; k < n_members; k++)
    if (members[k] == world_rank) {
      r.member = true;
      r.rank = k;
      break;
    }
  return r;
}

int exec_gpu_label_stream(const struct plan *p, const char *label) {
  const char *open = strrchr(label, '(');
  const char *close = open ? strchr(open, ')') : NULL;
  if (!close)
    return -1;
  size_t len = (size_t)(close - open - 1);
  for (uint32_t s = 0; s < p->n_streams; s++)
    if (strlen(p->streams[s].name) == len && strncmp(p->streams[s].name, open + 1, len) == 0)
      return (int)s;
  return -1;
}

int exec_gpu_cta_limit(double sm_share, int n_sms) {
  PIPER_ASSERT(n_sms > 0);
  if (!(sm_share < 1.0))
    return 0;
  int ctas = (int)floor(sm_share * n_sms);
  return ctas < 1 ? 1 : ctas;
}

int exec_gpu_green_sms(double sm_share, int n_sms, int min_count) {
  PIPER_ASSERT(n_sms > 0 && min_count > 0);
  if (!(sm_share < 1.0))
    return 0;
  int sms = (int)floor(sm_share * n_sms / min_count) * min_count;
  if (sms < min_count)
    sms = min_count;
  return sms > n_sms ? n_sms : sms;
}

int exec_gpu_head_chunk_rows(int T, int V, int forced) {
  PIPER_ASSERT(T >= 0 && V >= 0);
  size_t rows = EXEC_GPU_HEAD_CHUNK_BYTES / (sizeof(float) * (size_t)(V > 0 ? V : 1));
  if (forced > 0)
    rows = (size_t)forced;
  else if (rows < EXEC_GPU_HEAD_MIN_ROWS)
    rows = EXEC_GPU_HEAD_MIN_ROWS;
  if (rows > (size_t)T)
    rows = (size_t)T;
  return rows < 1 ? 1 : (int)rows;
}

int exec_gpu_head_tile_cols(int T, int V, int forced) {
  size_t cols;
  if (forced > 0) {
    cols = (size_t)forced;
  } else {
    cols = EXEC_GPU_HEAD_TILE_BYTES / (sizeof(float) * (size_t)(T > 0 ? T : 1)) / 64 * 64;
    if (cols < EXEC_GPU_HEAD_MIN_COLS)
      cols = EXEC_GPU_HEAD_MIN_COLS;
  }
  if (cols > (size_t)V)
    cols = (size_t)V;
  return cols < 1 ? 1 : (int)cols;
}

enum exec_gpu_attention exec_gpu_attention_mode(const char *env) {
  if (env && strcmp(env, "fused") == 0)
    return EXEC_GPU_ATTENTION_FUSED;
  if (env && strcmp(env, "unfused") == 0)
    return EXEC_GPU_ATTENTION_UNFUSED;
  if (env && strcmp(env, "cudnn") == 0)
    return EXEC_GPU_ATTENTION_CUDNN;
  return EXEC_GPU_ATTENTION_AUTO;
}

enum model_dtype exec_gpu_act_dtype(enum model_dtype model) {
  (void)model; /* every model's, until the entries take bf16 activations (gpu_layout.h) */
  return MODEL_DTYPE_FP32;
}

bool exec_gpu_attention_cudnn(enum exec_gpu_attention mode, bool usable) {
  return usable && (mode == EXEC_GPU_ATTENTION_AUTO || mode == EXEC_GPU_ATTENTION_CUDNN);
}

bool exec_gpu_attention_fused(enum exec_gpu_attention mode, bool fusable) {
  /* either core takes any length; the fused one is faster at every one measured */
  return fusable && mode != EXEC_GPU_ATTENTION_UNFUSED;
}

/* ---- serial progress ------------------------------------------------------------------- */

struct serial {
  const struct plan *p;
  uint32_t *pos;          /* [n_devices] next instruction (issue order) */
  bool *arrived;          /* [n_devices] counted at the collective at pos */
  uint32_t **group_head;  /* [n_classes][n_instrs] first part's instruction, or IR_NONE */
  GHashTable *sends;      /* "from>to:comm:seq" posted */
  GHashTable *collective; /* "comm:first member:seq" -> members arrived */
};

/* For each instruction of c, the first part of its point-to-point group (IR_NONE: alone). */
static uint32_t *group_heads(const struct plan *p, const struct plan_class *c) {
  uint32_t *head = g_new(uint32_t, c->n_instrs ? c->n_instrs : 1);
  for (uint32_t i = 0; i < c->n_instrs; i++)
    head[i] = IR_NONE;
  for (uint32_t st = 0; st < p->n_streams; st++)
    for (uint32_t e = c->stream_first[st]; e < c->stream_first[st + 1];) {
      uint32_t span = plan_group_span(c, e);
      for (uint32_t k = 0; span > 1 && k < span; k++)
        head[c->stream_instrs[e + k]] = c->stream_instrs[e];
      e += span;
    }
  return head;
}

static void post_send(struct serial *S, uint32_t d, const struct plan_instr *in) {
  char key[64];
  g_snprintf(key, sizeof key, "%u>%u:%u:%u", d, plan_peer(S->p, in->node, d), in->comm, in->seq);
  g_hash_table_add(S->sends, g_strdup(key));
}

/* Posts every send of the group whose first part is head (they are consecutive on its
 * stream). */
static void post_group(struct serial *S, uint32_t d, const struct plan_class *c, uint32_t head) {
  const uint32_t *gh = S->group_head[S->p->device_class[d]];
  for (uint32_t i = 0; i < c->n_instrs; i++)
    if (gh[i] == head && S->p->nodes[c->instrs[i].node].kind == IR_NODE_SEND)
      post_send(S, d, &c->instrs[i]);
}

/* Whether device d's instruction i can complete now (posting what it posts). */
static bool serial_step(struct serial *S, uint32_t d, const struct plan_class *c, uint32_t i) {
  const struct plan_instr *in = &c->instrs[i];
  enum ir_node_kind k = S->p->nodes[in->node].kind;
  uint32_t head = S->group_head[S->p->device_class[d]][i];
  if (head != IR_NONE)
    post_group(S, d, c, head);
  char key[64];
  switch (k) {
  case IR_NODE_COMPUTE:
  case IR_NODE_OPTIMIZER: return true;
  case IR_NODE_SEND: post_send(S, d, in); return true;
  case IR_NODE_RECV:
    g_snprintf(key, sizeof key, "%u>%u:%u:%u", plan_peer(S->p, in->node, d), d, in->comm, in->seq);
    return g_hash_table_contains(S->sends, key);
  default: break;
  }
  uint32_t n = plan_comm_size(S->p, in->comm);
  uint32_t *members = g_new(uint32_t, n ? n : 1);
  plan_comm_members(S->p, in->comm, d, members);
  g_snprintf(key, sizeof key, "%u:%u:%u", in->comm, members[0], in->seq);
  g_free(members);
  uint32_t have = GPOINTER_TO_UINT(g_hash_table_lookup(S->collective, key));
  if (!S->arrived[d]) {
    S->arrived[d] = true;
    g_hash_table_insert(S->collective, g_strdup(key), GUINT_TO_POINTER(++have));
  }
  return have >= n;
}

bool exec_gpu_serial_progress(const struct plan *p, uint32_t *device, uint32_t *instr) {
  struct serial S = {p,
                     g_new0(uint32_t, p->n_devices),
                     g_new0(bool, p->n_devices),
                     g_new0(uint32_t *, p->n_classes),
                     g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                     g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL)};
  for (uint32_t k = 0; k < p->n_classes; k++)
    S.group_head[k] = group_heads(p, &p->classes[k]);
  for (bool moved = true; moved;) {
    moved = false;
    for (uint32_t d = 0; d < p->n_devices; d++) {
      const struct plan_class *c = plan_device_class(p, d);
      while (S.pos[d] < c->n_instrs && serial_step(&S, d, c, S.pos[d])) {
        S.pos[d]++;
        S.arrived[d] = false;
        moved = true;
      }
    }
  }
  bool ok = true;
  for (uint32_t d = 0; d < p->n_devices && ok; d++)
    if (S.pos[d] < plan_device_class(p, d)->n_instrs) {
      ok = false;
      *device = d;
      *instr = S.pos[d];
    }
  for (uint32_t k = 0; k < p->n_classes; k++)
    g_free(S.group_head[k]);
  g_free(S.group_head);
  g_free(S.pos);
  g_free(S.arrived);
  g_hash_table_destroy(S.sends);
  g_hash_table_destroy(S.collective);
  return ok;
}
