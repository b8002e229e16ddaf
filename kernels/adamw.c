/* adamw: the optimizer step on flat parameter arrays (llm.c's gpt2_update formula). */
#include "kernels.h"
#include "kernels-impl.h"

#include "../base/assert.h"

#include <math.h>

/* params, m, v [n] updated in place <- grads [n] */
KERNELS_IMPL_VECTOR
void kernels_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, int step) {
  PIPER_ASSERT(step >= 1);
  /* Bias corrections in double: 1 - beta^step loses digits in float for beta near 1. */
  float bc1 = (float)(1.0 - pow(beta1, step));
  float bc2 = (float)(1.0 - pow(beta2, step));
  for (size_t i = 0; i < n; i++) {
    float g = grads[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mh = mi / bc1, vh = vi / bc2;
    /* Decoupled weight decay (Loshchilov & Hutter): applied to the weight, not the gradient. */
    params[i] -= lr * (mh / (sqrtf(vh) + eps) + weight_decay * params[i]);
  }
}

void kernels_adamw_multi(const struct kernels_adamw_tensor *tensors, int n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, int step) {
  for (int i = 0; i < n; i++)
    kernels_adamw_step(tensors[i].params, tensors[i].grads, tensors[i].m, tensors[i].v,
                       tensors[i].n, lr, beta1, beta2, eps, weight_decay, step);
}
