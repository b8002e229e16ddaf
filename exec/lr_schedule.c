/* lr_schedule: the learning rate of each step (lr_schedule.h, struct exec_lr_schedule), with
 * Megatron-LM's formulas (megatron/core/optimizer_param_scheduler.py, get_lr) so that a
 * schedule ported from a Megatron run gives the same rates step for step. */
#include <math.h>
#include <string.h>

#include "../base/base.h"
#include "lr_schedule.h"

static const char *const decay_names[] = {"constant", "linear", "cosine", "wsd", NULL};
static const char *const wsd_names[] = {"exponential", "linear", "cosine", "minus_sqrt", NULL};

static bool parse_name(const char *flag, const char *name, const char *const *names, int *out,
                       const char *list, GError **err) {
  for (int k = 0; names[k]; k++)
    if (name && strcmp(name, names[k]) == 0) {
      *out = k;
      return true;
    }
  char *q = piper_quote(name ? name : "", name ? strlen(name) : 0, 40);
  piper_input_error(err, "%s: %s is not one of %s", flag, q, list);
  g_free(q);
  return false;
}

bool exec_lr_decay_parse(const char *flag, const char *name, enum exec_lr_decay *out,
                         GError **err) {
  int k = 0;
  if (!parse_name(flag, name, decay_names, &k, "constant, linear, cosine, wsd", err))
    return false;
  *out = (enum exec_lr_decay)k;
  return true;
}

bool exec_lr_wsd_style_parse(const char *flag, const char *name, enum exec_lr_wsd_style *out,
                             GError **err) {
  int k = 0;
  if (!parse_name(flag, name, wsd_names, &k, "exponential, linear, cosine, minus_sqrt", err))
    return false;
  *out = (enum exec_lr_wsd_style)k;
  return true;
}

const char *exec_lr_decay_name(enum exec_lr_decay d) {
  return (unsigned)d < 4 ? decay_names[d] : "?";
}

const char *exec_lr_wsd_style_name(enum exec_lr_wsd_style w) {
  return (unsigned)w < 4 ? wsd_names[w] : "?";
}

bool exec_lr_schedule_resolve(struct exec_lr_schedule *s, uint32_t total, GError **err) {
  if (!s->decay_iters)
    s->decay_iters = total;
  if (s->decay == EXEC_LR_CONSTANT)
    return true;
  if (s->decay_iters <= s->warmup_iters)
    return piper_input_error(err,
                             "--lr-decay-iters %u: the decay must end after the %u warm-up "
                             "steps (--lr-warmup-iters)",
                             s->decay_iters, s->warmup_iters);
  if (s->decay != EXEC_LR_WSD)
    return true;
  if (!s->wsd_decay_iters)
    s->wsd_decay_iters = (uint32_t)ceil((double)s->wsd_decay_fraction * s->decay_iters);
  if (!s->wsd_decay_iters || s->wsd_decay_iters > s->decay_iters - s->warmup_iters)
    return piper_input_error(err,
                             "--lr-wsd-decay-iters %u: WSD anneals over 1 to %u steps (those of "
                             "--lr-decay-iters %u after the %u warm-up steps)",
                             s->wsd_decay_iters, s->decay_iters - s->warmup_iters, s->decay_iters,
                             s->warmup_iters);
  return true;
}

/* WSD's annealing coefficient at ratio r in [0, 1] of its decay steps. */
static double wsd_coefficient(enum exec_lr_wsd_style w, double r) {
  switch (w) {
  case EXEC_WSD_LINEAR: return 1.0 - r;
  case EXEC_WSD_COSINE: return 0.5 * (cos(G_PI * r) + 1.0);
  case EXEC_WSD_MINUS_SQRT: return 1.0 - sqrt(r);
  case EXEC_WSD_EXPONENTIAL: break;
  }
  return 2.0 * pow(0.5, r) - 1.0;
}

double exec_lr_at(const struct exec_lr_schedule *s, float lr, uint32_t step) {
  double peak = lr, floor_lr = s->min_lr;
  if (s->warmup_iters && step <= s->warmup_iters)
    return peak * step / s->warmup_iters; /* from 0, as Megatron's default init_lr */
  if (s->decay == EXEC_LR_CONSTANT)
    return peak;
  if (step > s->decay_iters)
    return floor_lr;
  double ratio = (double)(step - s->warmup_iters) / (double)(s->decay_iters - s->warmup_iters);
  double coeff = 1.0;
  if (s->decay == EXEC_LR_LINEAR)
    coeff = 1.0 - ratio;
  else if (s->decay == EXEC_LR_COSINE)
    coeff = 0.5 * (cos(G_PI * ratio) + 1.0);
  else {
    uint32_t anneal_start = s->decay_iters - s->wsd_decay_iters;
    if (step > anneal_start)
      coeff = wsd_coefficient(s->wsd_style,
                              (double)(step - anneal_start) / (double)s->wsd_decay_iters);
  }
  return floor_lr + coeff * (peak - floor_lr);
}

char *exec_lr_schedule_text(const struct exec_lr_schedule *s) {
  GString *t = g_string_new(NULL);
  if (s->warmup_iters)
    g_string_append_printf(t, "warmup %u, ", s->warmup_iters);
  if (s->decay == EXEC_LR_CONSTANT)
    g_string_append(t, "constant");
  else if (s->decay == EXEC_LR_WSD)
    g_string_append_printf(t, "wsd (%s over the last %u steps)", exec_lr_wsd_style_name(s->wsd_style),
                           s->wsd_decay_iters);
  else
    g_string_append(t, exec_lr_decay_name(s->decay));
  if (s->decay != EXEC_LR_CONSTANT)
    g_string_append_printf(t, " to %.9g by step %u", (double)s->min_lr, s->decay_iters);
  return g_string_free(t, FALSE);
}
