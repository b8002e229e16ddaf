/* cost: the shape cost models of a device profile whose device.cost_model is "shapes"
 * (docs/sim.md, "Costs from shapes"): a GEMM as a tiled tensor-core kernel (tile choice, waves
 * over the SMs, the K loop's fill, split-K, and a roofline on the bytes it moves), the attention
 * core as a FlashAttention-class kernel whose efficiency rises with the sequence, and each model
 * op as its GEMMs, its core and the rest of its traffic at memory bandwidth.
 *
 *   GError *err = NULL;
 *   struct profile *pr = profile_load_file("profiles/h100-sxm.json", &err);
 *   if (pr) {
 *     struct cost_gemm g = cost_gemm(pr, MODEL_DTYPE_BF16, 4096, 14336, 4096);
 *     printf("%g s on %ux%u tiles, %g waves\n", g.seconds, g.tile_m, g.tile_n, g.waves);
 *   }
 */
#ifndef PIPER_SIM_COST_H
#define PIPER_SIM_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "profile.h"

/* One GEMM launch: C[m, n] = A[m, k] B[k, n] (or a grouped launch of several such). */
struct cost_gemm {
  double seconds;          /* max(compute, memory) + the profile's kernel overhead */
  double compute, memory;  /* the tile model's time and bytes moved / achieved bandwidth */
  uint32_t tile_m, tile_n; /* the tile the heuristic picked */
  uint32_t split_k;        /* K split over this many tiles (1: none) */
  double waves;            /* ceil(tiles / SMs) */
  double bytes, flops;
};

/* A plain GEMM of m x n x k (FLOPs 2 m n k) at the model's dtype. */
struct cost_gemm cost_gemm(const struct profile *p, enum model_dtype dtype, double m, double n,
                           double k);
/* A grouped GEMM (one launch for several experts, as Megatron's grouped GEMM and cuBLAS's
 * grouped API run them): `groups` weight matrices of k x n; groups - 1 of them get `rows` rows
 * and one gets hot_rows (the most-loaded expert). Every group's tiles share the waves. */
struct cost_gemm cost_gemm_grouped(const struct profile *p, enum model_dtype dtype, double groups,
                                   double rows, double hot_rows, double n, double k);

/* The attention core (QK^T, softmax, PV) of batch x heads sequences of seq queries, with head
 * sizes d_qk and d_v, causal or not, its queries split in cp_chunks chunks over context-parallel
 * ranks (1: none; each rank's share of the work, at the chunk's efficiency), forward or
 * backward (the backward's 5 matmuls are 2.5 times the forward's 2). */
double cost_attention_core(const struct profile *p, enum model_dtype dtype, double batch,
                           double seq, double heads, double kv_heads, double d_qk, double d_v,
                           bool causal, uint32_t cp_chunks, bool backward);

/* A model op under the shape model: seconds by family (unscaled) and the memory-bound part.
 * ep: the expert-parallel degree of an expert op (1: none); tp: tensor-parallel degree; share:
 * ir_tp_op_share; bytes: the pass's traffic on this device (op_pass_load, scaled as the caller
 * scales it). Returns false for ops that have no GEMM (norms, adds, the embedding), which keep
 * the roofline. */
bool cost_model_op(const struct profile *p, const struct model *m, const struct model_op *op,
                   enum ir_pass pass, uint32_t tp, uint32_t ep, double share, double bytes,
                   double family[PROFILE_FAMILY_COUNT], double *memory_bound);

/* A collective under network.collective_model "topology" (kind and bytes as for
 * profile_comm_cost; no per-operation fit): latency by level and algorithm, transfer at the
 * bandwidth of the level that bounds it. */
struct profile_comm_cost cost_collective(const struct profile *p, enum ir_node_kind kind,
                                         uint64_t bytes, const struct profile_span *span);

/* The most-loaded expert's excess over the mean load (MaxVio = max / mean - 1) of a trained
 * router, from published routing statistics: Wang et al. 2024, "Auxiliary-Loss-Free Load
 * Balancing Strategy for Mixture-of-Experts" (arXiv:2408.15664), Sec. 4.2, Table 2,
 * MaxVio_global on the validation set: 0.52 for their 3B MoE trained with an auxiliary balance
 * loss (0.72 at 1B), 0.04 with the loss-free expert bias (both sizes) that DeepSeek-V3 trains
 * with (topk_method "noaux_tc"). */
#define COST_MAXVIO_AUX_LOSS 0.52
#define COST_MAXVIO_LOSS_FREE 0.04
/* The model's: loss-free for a router with DeepSeek-V3's bias (model.loss_free_balancing),
 * else auxiliary-loss balancing (Mixtral, Qwen, gpt-oss). */
double cost_routing_maxvio(const struct model *m);

/* Expected most-loaded expert's rows over the mean when `routes` routed rows spread over
 * `experts` experts: the profile's routing_imbalance if set (e.g. 1 for benchmarks that force
 * a balanced distribution), else 1 + the model's published MaxVio (cost_routing_maxvio) + the
 * binomial spread of a micro-batch's routes (sqrt(2 ln E) standard deviations over the mean). */
double cost_routing_hot_factor(const struct profile *p, const struct model *m, double routes,
                               double experts);

/* The all-to-all of a MoE layer over `ranks` expert-parallel ranks moves more to and from the
 * rank holding the most-loaded expert: its E / ranks experts get (E / ranks - 1 + hot) times
 * one expert's mean rows, and every rank waits for it. The factor on the transfer (1 for
 * profiles without the shape model and models without experts). */
double cost_all_to_all_skew(const struct profile *p, const struct model *m, uint32_t ranks);

/* Kernel launches the host enqueues for one model op's pass (IR_PASS_R: its forward), as
 * Megatron-Core issues them (the table in sim/cost.c; docs/sim.md "The host thread"); ep: the
 * expert-parallel degree of an expert op (its local experts' GEMM calls). */
double cost_op_launches(const struct profile *p, const struct model *m, const struct model_op *op,
                        enum ir_pass pass, uint32_t ep);

#endif
