// launch: the threads of fake_cuda.hpp's kernel launches, as fibers on the thread that runs the
// launch (the caller's, or its stream's: emu.h).
// Each block runs warp by warp: lane 0 of a warp runs first, on a fiber; if it ends without
// reaching a barrier or a shuffle, the warp's other lanes run as plain calls (most kernels:
// elementwise, no barrier, about a function call per thread). Otherwise the whole block goes
// to fibers, one per thread, run in turn to their next barrier: a __syncthreads releases when
// every thread still running waits there, a warp's __syncwarp (and each half of a shuffle)
// when every running lane of the warp does. Threads waiting at barriers nothing can release
// abort the program with the launch named: on a GPU that is a hang or undefined behaviour.
#include "fake_cuda.hpp"

#include "emu.h"

#include <sys/mman.h>

#include <vector>

thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

constexpr size_t kStack = 128 * 1024; // per thread of a block: kernels keep tiles in locals
constexpr unsigned kMaxThreads = 1024;

enum state { NEW, READY, AT_BLOCK, AT_WARP, DONE };

struct fiber {
  void *sp; // saved stack pointer while switched out
  state st;
  uint3 idx; // its threadIdx
};

struct grid_run {
  void (*thunk)(void *);
  void *arg;
  unsigned threads;
  fiber f[kMaxThreads];
  void *sched_sp;
  int cur;     // the fiber running, -1 in the scheduler
  bool direct; // a lane running as a plain call
  bool synced; // the running fiber reached a barrier or a shuffle
  float shuffle[kMaxThreads / 32][32];
};

thread_local grid_run *run_now;
thread_local unsigned char *stacks; // kMaxThreads stacks, a guard page under each

} // namespace

// ---- context switch --------------------------------------------------------------------------
// emu_switch(save, to): saves the callee-saved registers on the current stack, stores the
// stack pointer in *save, loads `to` and restores what is saved there (the System V ABI:
// everything else is the caller's to save).
#if defined(__x86_64__)
extern "C" void emu_switch(void **save, void *to);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
#elif defined(__aarch64__)
extern "C" void emu_switch(void **save, void *to);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, %function
emu_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
  .size emu_switch, .-emu_switch
)");
#else
#error "the CUDA emulation's fibers need x86-64 or AArch64"
#endif

namespace {

uint3 thread_index(unsigned t) {
  return uint3{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
}

[[noreturn]] void fiber_main() {
  grid_run *r = run_now;
  r->thunk(r->arg);
  r->f[r->cur].st = DONE;
  void *dead;
  emu_switch(&dead, r->sched_sp);
  abort(); // never resumed
}

// A fresh fiber for thread t on stack t: the first switch to it "returns" into fiber_main.
void fiber_new(grid_run *r, unsigned t) {
  // stack tops staggered by 1088 bytes (17 cache lines): tops a multiple of 4 KiB apart would
  // all fall in the same cache sets, and every switch would miss
  uintptr_t *sp = (uintptr_t *)(stacks + (t + 1) * kStack - (t * 1088) % 4096);
#if defined(__x86_64__)
  *--sp = 0;                       // fiber_main's return address: it never returns
  *--sp = (uintptr_t)&fiber_main;  // emu_switch's ret
  for (int i = 0; i < 6; i++)      // rbp rbx r12 r13 r14 r15
    *--sp = 0;
#else
  sp -= 22;                        // the 176 bytes emu_switch restores
  for (int i = 0; i < 22; i++)
    sp[i] = 0;
  sp[11] = (uintptr_t)&fiber_main; // x30: where ret goes
#endif
  r->f[t].sp = sp;
  r->f[t].st = READY;
  r->f[t].idx = thread_index(t);
}

void resume(grid_run *r, unsigned t) {
  threadIdx = r->f[t].idx;
  r->cur = (int)t;
  r->synced = false;
  emu_switch(&r->sched_sp, r->f[t].sp);
  r->cur = -1;
}

[[noreturn]] void stuck(const char *what) {
  fprintf(stderr,
          "emu: %s in block (%u,%u,%u) of a %ux%ux%u grid of %ux%ux%u threads: on a GPU a hang "
          "or undefined behaviour\n",
          what, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
          blockDim.y, blockDim.z);
  abort();
}

// The running thread waits at a barrier of kind st (from inside its fiber).
void wait_at(state st, const char *what) {
  grid_run *r = run_now;
  if (r->direct)
    stuck(what); // a lane reached a barrier its warp's lane 0 ended without
  r->synced = true;
  fiber *f = &r->f[r->cur];
  f->st = st;
  emu_switch(&f->sp, r->sched_sp);
}

// Releases what can pass: a warp whose running lanes all wait at its barrier, else the
// block when every running thread waits at __syncthreads. False when nothing can.
bool release(grid_run *r) {
  bool any = false, all_block = true, live = false;
  for (unsigned w0 = 0; w0 < r->threads; w0 += 32) {
    unsigned end = w0 + 32 < r->threads ? w0 + 32 : r->threads;
    bool at_warp = false, all = true;
    for (unsigned t = w0; t < end; t++) {
      at_warp |= r->f[t].st == AT_WARP;
      all &= r->f[t].st == AT_WARP || r->f[t].st == DONE;
    }
    if (at_warp && all) {
      for (unsigned t = w0; t < end; t++)
        if (r->f[t].st == AT_WARP)
          r->f[t].st = READY;
      any = true;
    }
  }
  if (any)
    return true;
  for (unsigned t = 0; t < r->threads; t++) {
    live |= r->f[t].st != DONE;
    all_block &= r->f[t].st == AT_BLOCK || r->f[t].st == DONE;
  }
  if (!live)
    return false;
  if (!all_block)
    stuck("threads wait at different barriers");
  for (unsigned t = 0; t < r->threads; t++)
    if (r->f[t].st == AT_BLOCK)
      r->f[t].st = READY;
  return true;
}

// Every thread from `first` on gets a fiber (lane 0 of the warp at `first` has one, waiting);
// then rounds: each ready fiber runs to its next barrier, and what can pass is released.
void run_fibers(grid_run *r, unsigned first) {
  for (unsigned t = first + 1; t < r->threads; t++)
    fiber_new(r, t);
  do {
    for (unsigned t = 0; t < r->threads; t++)
      if (r->f[t].st == READY)
        resume(r, t);
  } while (release(r));
}

void run_block(grid_run *r) {
  for (unsigned w0 = 0; w0 < r->threads; w0 += 32) {
    fiber_new(r, w0);
    resume(r, w0);
    if (r->f[w0].st != DONE || r->synced) {
      run_fibers(r, w0);
      return;
    }
    unsigned end = w0 + 32 < r->threads ? w0 + 32 : r->threads;
    r->direct = true;
    for (unsigned t = w0 + 1; t < end; t++) {
      threadIdx = thread_index(t);
      r->thunk(r->arg);
      r->f[t].st = DONE;
    }
    r->direct = false;
  }
}

void stacks_once() {
  if (stacks)
    return;
  size_t bytes = kStack * kMaxThreads;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    perror("emu: fiber stacks");
    abort();
  }
  stacks = (unsigned char *)p;
  for (unsigned t = 0; t < kMaxThreads; t++)
    mprotect(stacks + t * kStack, 4096, PROT_NONE); // an overflow faults, not corrupts
}

} // namespace

void emu_run_grid(dim3 grid, dim3 block, void *shared, size_t bytes, void (*thunk)(void *),
                  void *arg) {
  stacks_once();
  static thread_local grid_run r;
  if (run_now) {
    fprintf(stderr, "emu: a kernel launched from inside a kernel\n");
    abort();
  }
  r.thunk = thunk;
  r.arg = arg;
  r.threads = block.x * block.y * block.z;
  r.cur = -1;
  r.direct = false;
  run_now = &r;
  gridDim = uint3{grid.x, grid.y, grid.z};
  blockDim = uint3{block.x, block.y, block.z};
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = uint3{x, y, z};
        if (bytes)
          memset(shared, 0xff, bytes);
        run_block(&r);
      }
  run_now = NULL;
}

namespace {
struct launch_work {
  dim3 grid, block;
  void *(*shared)();
  size_t bytes;
  void (*thunk)(void *);
  void *arg;
  void (*done)(void *);
};

void launch_run(void *p) {
  launch_work *w = (launch_work *)p;
  emu_run_grid(w->grid, w->block, w->shared(), w->bytes, w->thunk, w->arg);
  w->done(w->arg);
  delete w;
}
} // namespace

void emu_launch(cudaStream_t st, dim3 grid, dim3 block, void *(*shared)(), size_t bytes,
                void (*thunk)(void *), void *arg, void (*done)(void *)) {
  emu_enqueue(st, launch_run, new launch_work{grid, block, shared, bytes, thunk, arg, done});
}

void __syncthreads() {
  wait_at(AT_BLOCK, "__syncthreads reached by a lane whose warp's lane 0 ended without it");
}

void __syncwarp(unsigned mask) {
  if (mask != 0xffffffffu)
    stuck("__syncwarp with a partial mask (not emulated)");
  wait_at(AT_WARP, "a warp barrier reached by a lane whose lane 0 ended without it");
}

float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  grid_run *r = run_now;
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned w = t / 32, l = t % 32;
  r->shuffle[w][l] = v;
  __syncwarp(mask);
  float got = r->shuffle[w][l ^ (unsigned)lane_mask];
  __syncwarp(mask);
  return got;
}
