/* kernels: host (CPU) reference kernels for every model op the executor runs: forward,
 * backward-for-inputs (BI) and backward-for-weights (BW) as separate entry points, plus AdamW.
 * fp32, flat row-major float arrays, one function per layer (llm.c style); GEMMs use BLAS.
 * The conventions every op follows are in the comment below.
 *
 *   enum { T = 4, C = 8, F = 16, P = 3 * C * F };  // tokens, width, FFN width, parameters
 *   static float params[P], dparams[P], m1[P], v1[P];  // P = kernels_mlp_param_count(C, F)
 *   static float h[T * C], m[T * C], dm[T * C], dh[T * C];
 *   static float saved[3 * T * F], bwork[2 * T * F];   // kernels_mlp_saved/bwork_floats(T, F)
 *   kernels_mlp_forward(m, saved, h, params, T, C, F);                         // F
 *   kernels_mlp_backward_input(dh, bwork, dm, saved, params, T, C, F, false);  // BI: dh = ...
 *   kernels_mlp_backward_weight(dparams, bwork, dm, h, saved, T, C, F);        // BW (later)
 *   kernels_adamw_step(params, dparams, m1, v1, P, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
 */

/* Conventions, for every op:
 * - Shapes are row-major; [T, C] means T rows of C floats. T = tokens of the micro-batch.
 * - `params` is the op's flat parameter block, exactly kernels_<op>_param_count() floats, laid
 *   out as documented per op (the same count models/ reports as model_op.param_count).
 *   `dparams` has the same layout.
 * - Gradients to weights ACCUMULATE (+=), so micro-batches add up; the caller zeroes them.
 * - Gradients to inputs are written (=) when `accumulate` is false and added (+=) when true
 *   (the residual stream x and the normalised h fan out to several ops, whose input gradients
 *   must be summed).
 * - What the forward keeps for the backward goes into a caller-provided `saved` buffer of
 *   kernels_<op>_saved_floats() floats; it must live until the op's last backward (BW).
 *   Inputs the caller already holds (x, h, the output gradient) are passed again explicitly
 *   rather than copied into `saved`.
 * - BI hands BW its intermediate gradients through `bwork`, kernels_<op>_bwork_floats()
 *   floats, which must live from BI until BW (zero-bubble schedules run BW much later).
 * - The fused kernels_<op>_backward is exactly BI followed by BW (bit-identical results).
 * - Deterministic: same inputs give bit-identical outputs. Kernels do not thread; OpenBLAS may
 *   thread a GEMM, but it splits only the M and N dimensions, never the summed K dimension, so
 *   results do not depend on timing. Kernels do not allocate after warm-up: a per-thread
 *   scratch grows on a thread's first call at its largest shape, and each RoPE table is built
 *   once per process (both thread-safe).
 * - Sizes are int (host runs use small models); offsets are computed in size_t.
 */
#ifndef PIPER_KERNELS_KERNELS_H
#define PIPER_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KERNELS_RMSNORM_EPS 1e-6f
#define KERNELS_ROPE_THETA 10000.0f

/* ---- GEMM -------------------------------------------------------------------------------- */

/* C = alpha * op(A) * op(B) + beta * C, row-major. op(A) is [m, k], op(B) is [k, n], C is
 * [m, n]. A is stored [m, k] (lda >= k), or [k, m] when trans_a (lda >= m); likewise B.
 * beta == 0 ignores C's old contents (NaN included). cblas_sgemm under HAVE_BLAS, else loops. */
void kernels_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* ---- EMBEDDING: tokens -> x ------------------------------------------------------------
 * params: wte [V, C]. tokens: int32 [T], each in [0, V). No BI: tokens are not differentiable.
 * Nothing is saved: BW needs the tokens and dx. */
size_t kernels_embedding_param_count(int V, int C);
/* kernels_embedding_forward: x [T, C] = wte[tokens[t]] */
/* kernels_embedding_backward_weight: dwte[tokens[t]] += dx[t], t ascending (deterministic for
 * repeated tokens). */

/* ---- RMSNORM: x -> h ---------------------------------------------------------------------
 * h = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). params: w [C]. eps: the model's
 * rms_norm_eps (KERNELS_RMSNORM_EPS when the file has none).
 * saved: rstd [T]. BI and BW need x, saved and dh; nothing goes from BI to BW. */
size_t kernels_rmsnorm_param_count(int C);
size_t kernels_rmsnorm_saved_floats(int T);
/* kernels_rmsnorm_forward: h [T, C], saved [T] <- x [T, C] */
/* kernels_rmsnorm_backward_input: dx [T, C] (= or +=) <- dh [T, C] */
/* kernels_rmsnorm_backward_weight: dw [C] += sum_t dh * x * rstd */

/* ---- ROTARY POSITION EMBEDDING (used by attention; public for the CUDA reference) --------
 * x [batch * seq, n_heads * head_dim]; row b*seq + s is at position s. Pairs (i, i + D/2)
 * (the Hugging Face "rotate_half" layout) rotate by angle s * theta^(-2i/D), i < D/2:
 *   x'[i] = x[i] cos - x[i+D/2] sin,  x'[i+D/2] = x[i+D/2] cos + x[i] sin.
 * inverse rotates the other way, which is also the backward (the map is orthogonal). In place;
 * head_dim must be even. */
void kernels_rope(float *x, int batch, int seq, int n_heads, int head_dim, float theta,
                  bool inverse);
/* The model file's "rope_scaling" of type "llama3" (Hugging Face key names). All zero (or a
 * NULL pointer) is no scaling. The cos/sin tables of every (theta, seq, head_dim, scaling)
 * are built once per process and shared by all threads. */
struct kernels_rope_scaling {
  float factor, low_freq_factor, high_freq_factor;
  int original_max_position_embeddings;
};
void kernels_rope_scaled(float *x, int batch, int seq, int n_heads, int head_dim, float theta,
                         const struct kernels_rope_scaling *scaling, bool inverse);
/* Whether the kernels implement a "rope_scaling" "type" (or "rope_type"): none, "default"
 * and "llama3". The caller reports the others (e.g. DeepSeek's "yarn") as an input error. */
bool kernels_rope_scaling_supported(const char *type);
/* Under context parallelism: x holds one rank's seq / cp tokens of each of batch sequences of
 * seq, its chunks cp_rank and 2 cp - 1 - cp_rank of seq / (2 cp) each, in that order; each
 * row is rotated by its global position (bit-identical to those rows of kernels_rope_scaled
 * over the whole sequence). */
void kernels_rope_cp(float *x, int batch, int seq, int cp, int cp_rank, int n_heads, int head_dim,
                     float theta, const struct kernels_rope_scaling *scaling, bool inverse);

/* ---- ATTENTION: h -> a (causal, RoPE, grouped-query) --------------------------------------
 * params: wq [C, H*D], wk [C, KV*D], wv [C, KV*D], wo [H*D, C], in that order, no biases.
 * q = rope(h wq), k = rope(h wk), v = h wv; head j uses kv head j / (H / KV);
 * p = softmax(q k^T / sqrt(D)) over keys s' <= s of the same sequence; y = p v; a = y wo.
 * saved (in order): q [T, H*D] (after RoPE), k [T, KV*D] (after RoPE), v [T, KV*D],
 *   lse [B, H, S] (log-sum-exp of each row of scores), y [T, H*D]. The probabilities are
 *   recomputed in BI from q, k and lse, bit-identical to the forward's (flash-style). 
 * bwork (in order): dy [T, H*D] (BI scratch), dq [T, H*D], dk [T, KV*D], dv [T, KV*D]
 *   (gradients before RoPE, i.e. of h wq, h wk, h wv), written by BI, read by BW.
 * BW also needs h and da. T = B * S; H % KV == 0; D even. */
struct kernels_attention_dims {
  int batch, seq, heads, kv_heads, head_dim, hidden;
  float rope_theta; /* KERNELS_ROPE_THETA unless the model says otherwise */
  const struct kernels_rope_scaling *rope_scaling; /* the model's "rope_scaling"; NULL: none */
  /* Where the core's lse and y live: NULL, right after v in saved (the layout above); else
   * a buffer of kernels_attention_core_floats() floats of its own, so that selective
   * recomputation can drop it after the forward and rebuild it before the backward while q,
   * k and v stay saved (saved then holds kernels_attention_saved_floats() minus those). */
  float *core;
  /* Context parallelism (docs/directives.md, "Context parallelism"): the tokens are CP rank
   * cp_rank's two chunks of every sequence (seq / cp of seq * cp), rotated at their global
   * positions (kernels_rope_cp) by the projection ops below; cp 0 or 1: the whole sequence. */
  int cp, cp_rank;
};
size_t kernels_attention_param_count(const struct kernels_attention_dims *d);
size_t kernels_attention_saved_floats(const struct kernels_attention_dims *d);
size_t kernels_attention_bwork_floats(const struct kernels_attention_dims *d);
/* lse and y: the part of saved that the core alone writes (Megatron's selective
 * recomputation reruns the core and keeps the rest) */
size_t kernels_attention_core_floats(const struct kernels_attention_dims *d);
/* Pointers into params, saved and bwork in the layouts above (NULL where the buffer is NULL):
 * the one description of them, which the host kernels and the cuda backend's both use. The
 * views serve const and non-const callers; each kernel writes only the buffers it owns
 * (forward: saved, BI: bwork). */
struct kernels_attention_views {
  size_t T, HD, KD; /* tokens, H * D, KV * D */
  const float *wq, *wk, *wv, *wo;
  float *q, *k, *v, *lse, *y;
  float *dy, *dq, *dk, *dv;
};
struct kernels_attention_views kernels_attention_views(const struct kernels_attention_dims *d,
                                                       const float *params, const float *saved,
                                                       const float *bwork);
/* Ring attention's blocks under context parallelism (kernels/attention_cp.c): m query rows of
 * one sequence at global positions q0 .. q0+m-1 against n keys at k0 .. k0+n-1, causal by
 * those positions, q and y [m, H*D], k and v [n, KV*D], lse [H, m] (the whole attention's
 * [B, H, S] with B 1, so a block of a whole sequence is the plain core); scale 1/sqrt(D). A
 * row that sees no key of the block gets y 0 and lse -inf (the merge then skips it). */
struct kernels_attention_block {
  int m, n, heads, kv_heads, head_dim;
  int q0, k0;
  float scale;
};
/* kernels_attention_block_forward: y, lse <- one block's softmax(q k^T) v (merge false: =),
 * or merged into them (merge true: as kernels_attention_merge). */
/* y, lse (the running result of m rows) <- the softmax over both key sets, given a block's
 * y_block, lse_block: the log-sum-exp merge of partial outputs. */
void kernels_attention_merge(float *y, float *lse, const float *y_block, const float *lse_block,
                             int m, int heads, int head_dim);
/* kernels_attention_block_backward: dq [m, H*D], dk, dv [n, KV*D] += one block's gradients,
 * given dy and the merged y and lse of the query rows (the final softmax's): FlashAttention-2's
 * backward per block, so the blocks' sums are the whole attention's gradients. */
/* The attention op in its parts, for context parallelism's orchestration between them
 * (exec/context_parallel.c): kernels_attention_qkv_forward: q, k, v of saved <- h (RoPE by
 * d->cp); kernels_attention_out_forward: a [T, C] = y wo; kernels_attention_out_backward_input:
 * dy of bwork = da wo^T; kernels_attention_qkv_backward_input: dq and dk of bwork rotated back
 * (in place), dh (= or +=) <- dq wq^T + dk wk^T + dv wv^T. */
/* kernels_attention_forward: a [T, C], saved <- h [T, C] */
/* kernels_attention_core_forward: lse, y <- q, k, v of saved: the core alone, bit-identical to
 * what the forward wrote (into d->core when set, else into saved) */
/* kernels_attention_backward_input: dh [T, C] (= or +=), bwork <- da [T, C] */
/* kernels_attention_backward_weight: dparams += ... <- bwork, da [T, C], h [T, C], saved */

/* ---- MLP (SwiGLU; also SHARED_EXPERT with F = ffn * n_shared): h -> m ----------------------
 * params: w_gate [C, F], w_up [C, F], w_down [F, C]. m = (silu(h wg) * (h wu)) wd.
 * saved (in order): g = h wg [T, F], u = h wu [T, F], act = silu(g) * u [T, F].
 * bwork (in order): dg [T, F], du [T, F], written by BI, read by BW. BW also needs h and dm. */
size_t kernels_mlp_param_count(int C, int F);
size_t kernels_mlp_saved_floats(int T, int F);
size_t kernels_mlp_bwork_floats(int T, int F);
/* Pointers into params (wg, wu [C, F], wd [F, C]), saved (g, u, act [T, F]) and bwork (dg,
 * du [T, F]; dg holds dact until the SwiGLU backward) of a SwiGLU MLP (NULL where the buffer
 * is NULL): the one description of them, for the host kernels and the cuda backend's. */
struct kernels_mlp_views {
  const float *wg, *wu, *wd;
  float *g, *u, *act;
  float *dg, *du;
};
struct kernels_mlp_views kernels_mlp_views(const float *params, const float *saved,
                                           const float *bwork, int T, int C, int F);
/* kernels_mlp_forward: m [T, C], saved <- h [T, C] */
/* kernels_mlp_backward_input: dh [T, C] (= or +=), bwork <- dm [T, C] */

/* ---- ROUTER: h -> r (softmax over E experts, top-k, weights renormalised) ------------------
 * params: w [C, E]. probs = softmax(h w); ids[t] = the K most probable experts, most probable
 * first, ties to the lower expert id; weights[t, k] = probs[ids[t, k]] / sum_k' probs[ids[t,k']].
 * The choice is piecewise constant, so gradients flow only through the chosen probabilities.
 * saved: probs [T, E]. bwork: dlogits [T, E], written by BI, read by BW. BW also needs h. */
size_t kernels_router_param_count(int C, int E);
size_t kernels_router_saved_floats(int T, int E);
size_t kernels_router_bwork_floats(int T, int E);
/* kernels_router_forward: ids int32 [T, K], weights [T, K], saved <- h [T, C] */
/* kernels_router_backward_input: dh [T, C] (= or +=), bwork <- dweights [T, K] (from
 * kernels_moe_dispatch_backward) */

/* ---- TOKEN DISPATCH / COMBINE for expert parallelism (no parameters) -----------------------
 * The EXPERT_FFN op is: plan -> dispatch (rows to send) -> [all-to-all] -> expert FFN on the
 * rows received -> [all-to-all back, same counts] -> combine. On one device n_ranks = 1 and the
 * all-to-alls are skipped: the send buffer is the expert FFN's input and output row order.
 * E experts are split evenly over n_ranks ranks: rank r owns [r*E/n, (r+1)*E/n).
 * Send order: by destination rank, then token, then route slot; route_row[t*K + k] is the row
 * of the send buffer that carries route (t, k). All T*K routes are sent (the local rank's
 * share too). The backward of dispatch and combine is the same permutation reversed, and sums
 * over the K routes of a token in slot order (deterministic). */
int kernels_moe_owner(int expert, int E, int n_ranks);
/* kernels_moe_dispatch_plan: send_counts int32 [n_ranks] (rows to each rank), route_row int32 [T
 * * K] <- ids [T, K] */
/* kernels_moe_dispatch_forward: send [T*K, C], send_expert int32 [T*K] (the expert of each row),
 * send_weight [T*K] (its routing weight, which the expert applies) <- h [T, C], weights [T, K] */
/* kernels_moe_dispatch_backward: dh [T, C] (= or +=) <- dsend [T*K, C]: dh[t] = sum_k
 * dsend[route_row[t, k]]; dweights [T, K] (written, feeds kernels_router_backward_input; NULL:
 * none) = dsend_weight[route_row[t, k]], the rows' weight gradients the experts' BI wrote.
 * C = 0 gathers the weights' gradients alone (sequence parallelism: dh is a shard of the
 * tokens, the weights' gradients every token's) */
/* kernels_moe_combine_forward: m [T, C] = sum_k y[route_row[t, k]] <- y [T*K, C] (the expert
 * outputs, in send order, already weighted: Megatron-Core applies the routing probabilities
 * in the experts' activation, so its unpermute keeps nothing) */
/* kernels_moe_combine_backward: dy [T*K, C] = dm[t] (written) <- dm [T, C]. Keeps nothing. */

/* ---- EXPERT_FFN: SwiGLU experts over routed rows -------------------------------------------
 * params of the whole op: [E][w_gate C*F, w_up C*F, w_down F*C], contiguous per expert. These
 * kernels run the experts [e_first, e_first + e_count) that one rank holds, and `params` /
 * `dparams` point at expert e_first's block (full + e_first * kernels_expert_ffn_param_count(
 * 1, C, F)). out[r] = w_r · (silu(in[r] wg)·(in[r] wu)) wd of expert row_expert[r], w_r =
 * row_weight[r] its routing weight (Megatron-Core's weighted SwiGLU: the probability scales
 * the activation before the down projection, so the combine only sums and keeps nothing, and
 * the weight's gradient comes from the SwiGLU, whose inputs are saved anyway); every
 * row_expert must be in the range. Rows may come in any order (after dispatch
 * they come by source rank, then token); each expert's rows run as one GEMM, in row order.
 * saved (in order, rows grouped by expert, experts ascending, rows ascending within one):
 *   g [n, F], u [n, F], act [n, F] (silu(g)·u·w), ws [n] (the rows' weights), xs [n, C] (the
 *   inputs; last, so that the backward input and the act rerun, which do not read them, need
 *   not know where they are).
 * act lives there unless the caller gives it a buffer of its own (act, [n, F], same grouping;
 * NULL: in saved; ws then follows u), so that selective recomputation (moe_act) can drop it
 * while the rest stays (kernels_expert_ffn_act_forward rebuilds it from g, u and ws, bit for
 * bit). Every call that reads saved is given the same act (NULL or the buffer). xs likewise
 * (the forward and the weight gradient take it): apart, the executor keeps DeepSeek-V3's FP8
 * copy of it instead (kernels_fp8_rows_quantize) and dequantises it for the weight gradient.
 * bwork (same grouping): dys [n, C] (the output gradient), dg [n, F], du [n, F].
 * scratch: [n, C], used within one call only (forward and BI). */
size_t kernels_expert_ffn_param_count(int E, int C, int F);
size_t kernels_expert_ffn_saved_floats(int n_rows, int C, int F);
size_t kernels_expert_ffn_bwork_floats(int n_rows, int C, int F);
size_t kernels_expert_ffn_scratch_floats(int n_rows, int C);
/* kernels_expert_ffn_forward: out [n, C], saved (act) <- in [n, C], row_expert int32 [n],
 * row_weight [n] */
/* kernels_expert_ffn_backward_input: din [n, C] (= or +=), drow_weight [n] (written), bwork <-
 * dout [n, C] */

/* ---- LM_HEAD_LOSS: h -> loss ------------------------------------------------------------
 * params: w [C, V] (KERNELS_LM_HEAD_UNTIED), or, with tied embeddings (models/ then counts no
 * head parameters), the embedding's wte [V, C] (KERNELS_LM_HEAD_TIED), whose gradient then
 * goes into dwte. logits = h w; loss = mean over the T tokens of -log softmax(logits)[target].
 * targets int32 [T], each in [0, V). saved: each row's max logit [T], then 1 / the sum of its
 * exp [T] (O(T), not the [T, V] probabilities). F computes the logits a chunk of rows at a
 * time; BI and BW each recompute them (and the dlogits) from h the same way, one more head GEMM
 * each, so nothing of [T, V] lives past a kernel. bwork: none (0 floats; may be NULL). dloss
 * scales the gradient (1 for one micro-batch; 1/n to average n of them). */
enum kernels_lm_head_layout { KERNELS_LM_HEAD_UNTIED, KERNELS_LM_HEAD_TIED };
size_t kernels_lm_head_loss_param_count(int C, int V); /* untied: C * V */
size_t kernels_lm_head_loss_saved_floats(int T, int V);
size_t kernels_lm_head_loss_bwork_floats(int T, int V);
/* kernels_lm_head_loss_forward: *loss <- the mean loss; saved <- h [T, C] */
/* kernels_lm_head_loss_backward_input: dh [T, C] (= or +=), bwork */

/* ---- Tensor parallelism's vocabulary slice (exec/tp.c) -------------------------------------
 * A TP rank holds rows [lo, lo + n) of the vocabulary (Megatron's vocabulary-parallel
 * embedding and parallel cross-entropy). Embedding: x [T, C] <- the slice's table [n, C] rows
 * for the tokens in it, zeros for the others (the sum over the group gives every token its
 * row); BW: dtable [n, C] += dx of the tokens in it. LM head: logits = h w over the slice (w
 * [C, n] untied, or the table's rows [n, C] tied); stats [3, T] <- each row's max logit m over
 * the slice, the sum of exp(logit - m), and the target's logit where the target is in the
 * slice (else 0); _combine merges the group's stats, gathered [tp][3, T], into saved (the max
 * over the vocabulary [T], then 1 / the sum of exp [T], as kernels_lm_head_loss_forward's) and
 * writes the mean loss to *loss; _backward: the slice's dlogits from saved, dh [T, C] = dlogits w^T
 * (a partial sum over the group; NULL: none) and dw += (NULL: none). */

/* ---- buffers: x [n] = value; dst [bytes] = src (may overlap); y [n] += x [n] ---------------- */
/* kernels_sum_squares: *sum += x [n] squared, summed in double in index order; kernels_scale:
 * x [n] *= factor (gradient clipping) */

/* ---- RESIDUAL_ADD: x += y ----------------------------------------------------------------
 * Backward passes the gradient to both: dx is unchanged, dy = dx (or dy += dx). */

/* ---- AdamW (decoupled weight decay, bias-corrected; step counts from 1) --------------------
 * m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mh = m / (1 - b1^step);  vh = v / (1 - b2^step)
 * p -= lr * (mh / (sqrt(vh) + eps) + weight_decay * p)      over n elements, in place.
 * kernels_adamw_multi: the same over each of n tensors in turn (the optimizer's whole step in
 * one call: the cuda backend runs it as one launch over a table of the tensors). The table is
 * host memory; its pointers are the backend's memory. */
struct kernels_adamw_tensor {
  float *params;
  const float *grads;
  float *m, *v;
  size_t n;
};

/* The op kernels' prototypes, void kernels_<name>(parameters), from the op list (kernels/ops.def:
 * each entry's parameters; the comments above say what each computes). */
#define KERNEL_OP(name, use, cuda, params, args) void kernels_##name params;
#include "ops.def"
#undef KERNEL_OP

#endif
