/* gpu_layout: the decisions of the cuda backend that need no GPU, kept apart so that they are
 * tested on machines without one: which GPU a rank uses, whether ranks share a GPU (then
 * NCCL cannot be used between them), how a communicator's members map to NCCL ranks and who
 * makes its unique id, how a stream's sm_share becomes a CTA limit or an SM count, how many
 * rows of logits the LM head computes at a time, and which attention core runs.
 *
 *   uint8_t uuids[2][16] = {{1}, {1}};           // the GPU each local rank picked
 *   int dev = exec_gpu_pick(1, 2, 1);            // local rank 1 of 2, one GPU visible: 0
 *   bool shared = exec_gpu_shared(&uuids[0][0], 2, 1);  // true: host-staged MPI instead of NCCL
 *   uint32_t members[3] = {4, 6, 7};
 *   struct exec_gpu_comm_rank r = exec_gpu_comm_rank(members, 3, 6); // rank 1 of 3, root 4
 *   int ctas = exec_gpu_cta_limit(0.25, 132);    // 33 CTAs for a quarter of an H100's SMs
 *   int rows = exec_gpu_head_chunk_rows(4096, 128256, 0); // 2092: llama3's LM head in 2 chunks
 *   enum exec_gpu_attention am = exec_gpu_attention_mode("fused");
 *   bool fused = exec_gpu_attention_fused(EXEC_GPU_ATTENTION_AUTO, true); // true
 */
#ifndef PIPER_EXEC_GPU_LAYOUT_H
#define PIPER_EXEC_GPU_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "../ir/plan.h"

/* The device a rank uses: its rank among the ranks on its host, modulo the devices it sees
 * (CUDA_VISIBLE_DEVICES narrows them; a launcher that gives each rank one device makes this
 * 0). -1 when no device is visible. */
int exec_gpu_pick(uint32_t local_rank, uint32_t local_size, int n_visible);

/* Whether local rank me shares its GPU (same UUID) with another rank of its host; uuids holds
 * 16 bytes per local rank. */
bool exec_gpu_shared(const uint8_t *uuids, uint32_t n_local, uint32_t me);

/* A rank's place in a communicator: members are world ranks, NCCL rank = position. The
 * unique id is made by the first member and broadcast over MPI from there. */
struct exec_gpu_comm_rank {
  bool member;
  uint32_t rank, size;
  uint32_t id_root; /* world rank that makes the NCCL unique id */
};
struct exec_gpu_comm_rank exec_gpu_comm_rank(const uint32_t *members, uint32_t n_members,
                                             uint32_t world_rank);

/* The plan stream a communicator label names: the runner labels them "pp g1->g2 (stream)".
 * -1 when the label names no stream of the plan. */
int exec_gpu_label_stream(const struct plan *p, const char *label);

/* Whether every device can run its instructions one after another in issue order, as one host
 * thread per rank does when ranks share a GPU (host-staged MPI): sends are posted without
 * waiting (a point-to-point group posts all its sends when its first part comes up), receives
 * wait for the peer's send, collectives for every member. False with the first device that
 * would wait forever and the instruction it waits at. (With NCCL the host only enqueues and the
 * streams progress apart, as plan_check_progress checks.) */
bool exec_gpu_serial_progress(const struct plan *p, uint32_t *device, uint32_t *instr);

/* NCCL's maxCTAs for a communication stream limited to sm_share of n_sms SMs: 0 (NCCL's own
 * default) for a share of 1 or more, else at least 1. */
int exec_gpu_cta_limit(double sm_share, int n_sms);

/* SMs of a green context for a compute stream limited to sm_share: a multiple of the
 * driver's granularity (min_count), at least one granule, at most n_sms; 0 for no limit. */
int exec_gpu_green_sms(double sm_share, int n_sms, int min_count);

/* The LM head's logits chunk (stream-ordered scratch of [rows, V] fp32, not a plan tensor):
 * about EXEC_GPU_HEAD_CHUNK_BYTES of logits, but never under EXEC_GPU_HEAD_MIN_ROWS rows; at
 * most T, at least 1. Why these sizes: each chunk's GEMMs read the whole [C, V] weight (bf16)
 * and BW reads and writes the whole [C, V] fp32 dparams, so a chunk of n rows does 2 n C V
 * FLOPs against 8 C V bytes of dparams traffic: n / 4 FLOP per byte, which needs n >~ 800 to
 * be compute-bound on an H100/H200 (~200 FLOP per byte of HBM), and n >= 1024 keeps the GEMM
 * tiles full. 1 GiB: llama3's V = 128256 gives 2092 rows (seq 4096 in 2 chunks, against 32
 * of 130 rows before), a transient 1.07 GB chunk plus its 0.54 GB bf16 copy in the stream's
 * GEMM scratch; tiny models (T small) get one chunk of T rows. forced > 0 asks for that many
 * rows instead (PIPER_CUDA_HEAD_ROWS: the kernel checks' small T in several chunks), at most T. */
#define EXEC_GPU_HEAD_CHUNK_BYTES ((size_t)1 << 30)
#define EXEC_GPU_HEAD_MIN_ROWS 1024
int exec_gpu_head_chunk_rows(int T, int V, int forced);

/* The LM head fused with its cross-entropy (the default; PIPER_CUDA_HEAD=rows keeps the row
 * chunks above): the vocabulary in tiles of cols columns, each tile's logits [T, cols] made by
 * one GEMM and reduced at once to its rows' max, sum of exp and target logit (merged over the
 * tiles by log-sum-exp), so no [rows, V] logits chunk is written out and read back. A tile of
 * about EXEC_GPU_HEAD_TILE_BYTES of fp32 logits stays in the L2 cache between the GEMM that
 * writes it and the reduction that reads it (50 MiB on an H100, 60 on an H200); at least
 * EXEC_GPU_HEAD_MIN_COLS columns so the GEMM keeps its tiles full (T 4096: 2048 columns, a
 * [4096, 4096] x [4096, 2048] GEMM); a multiple of 64 (aligned rows for bf16 operands); at
 * most V. forced > 0 asks for that many columns (PIPER_CUDA_HEAD_COLS: the kernel checks'
 * small V in several tiles). */
#define EXEC_GPU_HEAD_TILE_BYTES ((size_t)32 << 20)
#define EXEC_GPU_HEAD_MIN_COLS 256
int exec_gpu_head_tile_cols(int T, int V, int forced);

/* The dtype the cuda backend's kernel entries hold a model's activations in (the values
 * between ops, their gradients, the saved tensors): what its arena's slots are planned at
 * (exec_cuda_arena_plan) and what `piper-prof --backend cuda` writes into its profile's memory
 * section, so the two cannot drift apart. fp32 for every model today: the executor sizes each
 * activation buffer in floats from the host kernels' layouts (exec/memory.c, segment_*.c) and
 * every kernel entry reads and writes fp32; the bf16 kernels (kc_bf16_*, kernels/cuda.cu)
 * are not yet behind an entry. A bf16 model's activations at 2 bytes is the change to here
 * once they are (docs/exec.md, "Memory"). */
enum model_dtype exec_gpu_act_dtype(enum model_dtype model);

/* Which attention core runs: cuDNN's fused SDPA (exec/cuda_cudnn.h, where the build has cuDNN),
 * the own fused kernel (kernels/flash_attention.cu, no [S, S] memory) or per (sequence, head)
 * cuBLASLt GEMMs with a head's S x S fp32 scores in scratch.
 * PIPER_CUDA_ATTENTION=cudnn|fused|unfused forces one (anything else: auto); a forced core
 * that cannot run a shape leaves it to the next in that order. Auto takes cuDNN wherever it
 * can run (a bf16 model, cuDNN built in, a shape exec_cudnn_sdpa_supported takes; the issue's
 * measurement: cuDNN's fused attention is in FlashAttention-3's class on Hopper, the own
 * kernel at 19% of peak forward), then the own fused core wherever it can run (fusable: a
 * bf16 model and a head size the fused kernel has):
 * measured on an H200 at 32 heads, 8 kv heads, head size 128 (2026-11-30), it took 0.73 ms
 * forward and 2.50 ms backward at S 4096, where the unfused GEMMs took 5.9 and 14.4, and 0.08
 * and 0.42 at S 1000; fp32 models keep the unfused core (the fused one computes in bf16). */
enum exec_gpu_attention {
  EXEC_GPU_ATTENTION_AUTO,
  EXEC_GPU_ATTENTION_FUSED,
  EXEC_GPU_ATTENTION_UNFUSED,
  EXEC_GPU_ATTENTION_CUDNN,
};
enum exec_gpu_attention exec_gpu_attention_mode(const char *env);
bool exec_gpu_attention_fused(enum exec_gpu_attention mode, bool fusable);
/* whether cuDNN's core runs (usable: built in, a bf16 model and a supported shape) */
bool exec_gpu_attention_cudnn(enum exec_gpu_attention mode, bool usable);

#endif
