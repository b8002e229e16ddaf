/* gpu_layout: pure functions behind the cuda backend's start-up decisions (see the header). */
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
