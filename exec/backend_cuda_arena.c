/* backend_cuda_arena: the plan's tensors carved from the process's one device allocation at
 * the offsets exec/arena.c planned offline over the plan's memory rule, so the arena the plan
 * needs is the planner's size and nothing is searched for at run time.
 *
 * A host-side release says only that the last user was enqueued; the GPU may still be running
 * it. The tensor that takes those bytes next therefore makes its first writer's stream wait
 * (cudaStreamWaitEvent, nothing on the host) for the end of every instruction that used a
 * tensor sharing bytes with it: the previous holders in this step, or, for holders later in
 * the step, their uses in the step before. Those instructions were all enqueued before, in the
 * plan's issue order, so the waits add no cycle when that order progresses with one host
 * thread per rank (exec_gpu_serial_progress; carving is off, said once, where it does not). */
#include <inttypes.h>
#include <string.h>

#include "../base/assert.h"
#include "../base/base.h"
#include "cuda-impl.h"
#include "gpu_layout.h"

#define ARENA_ALIGN 256
/* The blocks a slot is carved into, one after the other: 16 bytes (cuBLASLt's and the vectorised
 * kernels' alignment; the executor rounds every block to it), not ARENA_ALIGN, since the slot
 * holds the plan's bytes exactly. 256-byte steps overflowed a saved tensor of small blocks (a
 * norm's [T] row statistics at T = 32 under context parallelism) into first fit above the
 * planned region, 0.4 to 2.7% over the planned peak. */
#define BLOCK_ALIGN 16

bool exec_cuda_arena_plan(struct cuda_context *b, const struct plan *p, uint32_t device,
                          GError **err) {
  const struct plan_class *c = plan_device_class(p, device);
  /* the kernels hold activations at act_dtype (fp32), where the plan counts a bf16 model's at
   * 2 bytes: the slots are planned at the bytes really held */
  b->arena_tensors = exec_arena_tensors_held(c, model_dtype_bytes(p->model->dtype),
                                             model_dtype_bytes(b->act_dtype));
  GArray *ev = g_array_new(FALSE, FALSE, sizeof(struct exec_arena_event));
  exec_arena_device_events(p, c, ev); /* receives posted early, as the executor does */
  bool ok = exec_arena_plan_best(c->n_tensors, b->arena_tensors,
                                 (const struct exec_arena_event *)(void *)ev->data, ev->len,
                                 ARENA_ALIGN, &b->plan_arena, err);
  g_array_free(ev, TRUE);
  if (!ok)
    return false;
  uint32_t stuck_device = 0, stuck_instr = 0;
  b->carving = exec_gpu_serial_progress(p, &stuck_device, &stuck_instr);
  if (!b->carving && b->rank == 0)
    g_printerr("piper-exec: cuda: the plan's issue order does not progress one instruction "
               "at a time (device %u, instruction %u): tensors are placed first fit, not at the "
               "planner's offsets\n",
               stuck_device, stuck_instr);
  if (!b->carving)
    return true;
  b->dyn_base = (size_t)b->plan_arena.size;
  exec_arena_carver_init(&b->carver, &b->plan_arena, b->arena_tensors, ARENA_ALIGN);
  b->carved = g_hash_table_new(g_direct_hash, g_direct_equal);
  b->wait_stamp = g_new0(uint32_t, c->n_instrs ? c->n_instrs : 1);
  return true;
}

/* The stream the running task's work goes to waits for instruction i's last record (its
 * timing end event, recorded after its task on its stream). */
static void wait_for_instr(struct cuda_context *b, const struct plan_class *c, cudaStream_t cs,
                           int my_stream, uint32_t i) {
  if (i >= c->n_instrs || b->wait_stamp[i] == b->wait_gen)
    return;
  b->wait_stamp[i] = b->wait_gen;
  if ((int)c->instrs[i].stream == my_stream || i >= b->t_end->len)
    return; /* the same stream runs in order; never run: nothing to wait for */
  cudaEvent_t e = g_array_index(b->t_end, cudaEvent_t, i);
  GError *err = NULL;
  if (e && !CUDA_CHECK(b, cudaStreamWaitEvent(cs, e, 0), &err))
    exec_cuda_fail(exec_cuda_current, err);
}

/* Every instruction that touches tensor u: where it is allocated (zeroed), written, read and
 * released. */
static void wait_for_users(struct cuda_context *b, const struct plan_class *c, cudaStream_t cs,
                           int my_stream, uint32_t u) {
  const struct plan_tensor *pt = &c->tensors[u];
  wait_for_instr(b, c, cs, my_stream, pt->alloc);
  wait_for_instr(b, c, cs, my_stream, pt->producer);
  for (uint32_t k = 0; k < pt->consumer_count; k++)
    wait_for_instr(b, c, cs, my_stream, c->consumers[pt->consumer_first + k]);
  wait_for_instr(b, c, cs, my_stream, pt->release);
}

void *exec_cuda_arena_carve(struct cuda_context *b, uint32_t tensor, size_t bytes) {
  if (!b->carving || !b->arena)
    return NULL;
  double t0 = piper_clock_seconds();
  bool top = (tensor & EXEC_TENSOR_SLOT_TOP) != 0;
  tensor &= ~EXEC_TENSOR_SLOT_TOP;
  g_mutex_lock(&b->mem_lock);
  uint64_t off = 0;
  bool first = tensor < b->carver.n_tensors && b->carver.blocks[tensor] == 0;
  bool ok = exec_arena_carve(&b->carver, tensor, bytes, BLOCK_ALIGN, top, &off);
  void *p = ok ? b->arena + off : NULL;
  if (p) /* the side in the value's top bit, the tensor + 1 below */
    g_hash_table_insert(b->carved, p,
                        GUINT_TO_POINTER((tensor + 1) | (top ? EXEC_TENSOR_SLOT_TOP : 0)));
  g_mutex_unlock(&b->mem_lock);
  if (!p)
    return NULL;
  struct exec_stream *cur = exec_cuda_current;
  cudaStream_t cs = exec_cuda_stream(b, cur);
  if (first) {
    /* the slot's previous holders: their last users end before its first writer starts */
    const struct plan_class *c = plan_device_class(b->plan, b->plan_device);
    int my_stream = cur ? cur->plan_stream : -1;
    if (++b->wait_gen == 0) {
      memset(b->wait_stamp, 0, sizeof(uint32_t) * (c->n_instrs ? c->n_instrs : 1));
      b->wait_gen = 1;
    }
    const struct exec_arena_carver *cv = &b->carver;
    for (uint32_t k = cv->overlap_first[tensor]; k < cv->overlap_first[tensor + 1]; k++)
      wait_for_users(b, c, cs, my_stream, cv->overlap[k]);
  }
  /* no zeroing: alloc_tensor's contents are undefined (exec.h) */
  if (!cur) {
    /* outside a task: the setup stream, which every stream waits for before its next work */
    cudaEventRecord(b->setup_done, b->setup);
    b->setup_gen++;
  }
  b->host_carve_s += piper_clock_seconds() - t0;
  return p;
}

bool exec_cuda_arena_release(struct cuda_context *b, void *p) {
  if (!b->carved)
    return false;
  g_mutex_lock(&b->mem_lock);
  gpointer v = NULL;
  bool mine = g_hash_table_steal_extended(b->carved, p, NULL, &v);
  if (mine) {
    uint32_t held = GPOINTER_TO_UINT(v);
    exec_arena_carve_release(&b->carver, (held & ~EXEC_TENSOR_SLOT_TOP) - 1,
                             (held & EXEC_TENSOR_SLOT_TOP) != 0);
  }
  g_mutex_unlock(&b->mem_lock);
  return mine;
}

void exec_cuda_arena_report(const struct cuda_context *b) {
  if (!b->carving || b->rank != 0)
    return;
  const struct exec_arena_carver *cv = &b->carver;
  g_printerr("piper-exec: cuda: plan tensors: %u blocks (%.3f GiB in all) at the planner's "
             "offsets in its %.3f GiB, %u blocks (%.3f GiB) placed first fit above it (rank 0)\n",
             cv->carved_blocks, cv->carved_bytes / 1073741824.0, b->plan_arena.size / 1073741824.0,
             cv->fallback_blocks, cv->fallback_bytes / 1073741824.0);
  if (b->host_tasks)
    g_printerr("piper-exec: cuda: host thread: %" PRIu64 " tasks enqueued, %.1f us each, "
               "%.1f us of it carving the arena (rank 0)\n",
               b->host_tasks, b->host_task_s / (double)b->host_tasks * 1e6,
               b->host_carve_s / (double)b->host_tasks * 1e6);
}

void exec_cuda_arena_free(struct cuda_context *b) {
  exec_arena_carver_clear(&b->carver);
  exec_arena_clear(&b->plan_arena);
  if (b->carved)
    g_hash_table_destroy(b->carved);
  b->carved = NULL;
  g_free(b->arena_tensors);
  b->arena_tensors = NULL;
  g_free(b->wait_stamp);
  b->wait_stamp = NULL;
  b->carving = false;
}
