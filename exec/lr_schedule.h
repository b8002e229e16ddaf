/* lr_schedule: the learning rate of each step (exec_options' lr_schedule), warm-up then
 * constant, linear, cosine or WSD decay to a minimum, as Megatron-LM computes it.
 *
 *   struct exec_lr_schedule s = {.decay = EXEC_LR_COSINE, .min_lr = 1e-5f, .warmup_iters = 10};
 *   GError *err = NULL;
 *   if (exec_lr_schedule_resolve(&s, 100, &err))
 *     printf("step 50: %g\n", exec_lr_at(&s, 3e-4f, 50));
 */
#ifndef PIPER_EXEC_LR_SCHEDULE_H
#define PIPER_EXEC_LR_SCHEDULE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* A learning-rate schedule, as Megatron-LM's OptimizerParamScheduler computes it: the rate of
 * step t (1-based: the t-th update) rises linearly from 0 to the peak over warmup_iters steps,
 * then holds (constant) or decays to min_lr by step decay_iters (linear, cosine, or WSD:
 * stable at the peak, then the last wsd_decay_iters steps of decay_iters annealed in the
 * wsd_style shape); past decay_iters it stays at min_lr. */
enum exec_lr_decay { EXEC_LR_CONSTANT, EXEC_LR_LINEAR, EXEC_LR_COSINE, EXEC_LR_WSD };
enum exec_lr_wsd_style {
  EXEC_WSD_EXPONENTIAL,
  EXEC_WSD_LINEAR,
  EXEC_WSD_COSINE,
  EXEC_WSD_MINUS_SQRT
};
struct exec_lr_schedule {
  enum exec_lr_decay decay;
  float min_lr;
  uint32_t warmup_iters;
  uint32_t decay_iters;     /* 0: the run's last step (warmup + iters) */
  uint32_t wsd_decay_iters; /* 0: wsd_decay_fraction of decay_iters */
  float wsd_decay_fraction;
  enum exec_lr_wsd_style wsd_style;
};
/* The rate of step `step` (1-based) under s with peak lr; decay_iters resolved (not 0). */
double exec_lr_at(const struct exec_lr_schedule *s, float lr, uint32_t step);
/* Names as the flags take them ("constant", "linear", "cosine", "wsd"; "exponential",
 * "linear", "cosine", "minus_sqrt"): false with an input error naming flag otherwise. */
bool exec_lr_decay_parse(const char *flag, const char *name, enum exec_lr_decay *out, GError **err);
bool exec_lr_wsd_style_parse(const char *flag, const char *name, enum exec_lr_wsd_style *out,
                             GError **err);
const char *exec_lr_decay_name(enum exec_lr_decay d);
const char *exec_lr_wsd_style_name(enum exec_lr_wsd_style w);
/* s with its defaults resolved for a run of total steps (decay_iters, wsd_decay_iters); an
 * input error for a schedule that cannot be run (decay before the warm-up ends, WSD decay
 * longer than the decay). */
bool exec_lr_schedule_resolve(struct exec_lr_schedule *s, uint32_t total, GError **err);
/* The curve a resolved s draws, in words ("warmup 10, cosine to 1e-05 by step 100"): equal
 * texts, equal rates at every step (what a checkpoint compares; g_free). */
char *exec_lr_schedule_text(const struct exec_lr_schedule *s);

#endif
