/* runtime: the CUDA runtime of include/cuda_runtime.h on the host (tests/gpu/emu/README.md).
 * PIPER_EMU_GPUS (default 1) devices of PIPER_EMU_GPU_BYTES each (default 1 GiB); ranks of a
 * host that pick the same device share it, as on a machine with that many GPUs. Every
 * allocation is registered, so copies, memsets, GEMM and NCCL buffers are checked to lie in
 * device memory (the host's memory stands in for both: a host pointer passed where a device
 * one belongs would otherwise go unnoticed) and to fit their allocation. */
#include <cuda_runtime.h>
#include <glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

/* A stream: its queue of enqueued work, run in order by its own thread in the asynchronous
 * mode (PIPER_EMU_ASYNC=1), at once by the caller otherwise. */
struct emu_stream {
  int priority;
  GMutex lock;
  GCond cond;
  GQueue work; /* struct work */
  bool busy, stop;
  GThread *thread;
};
struct work {
  void (*run)(void *); /* owns arg */
  void *arg;
};
/* An event: how many records were enqueued, how many have run (a wait enqueued after the k-th
 * record waits for done >= k, as CUDA's waits for the record before them). */
struct emu_event {
  unsigned flags;
  uint64_t recorded, done;
  double at;
};
struct emu_mem_pool {
  int device;
};

static _Thread_local cudaError_t last_error;
static GMutex event_lock; /* every event's counts */
static GCond event_cond;
static GPtrArray *streams; /* the live ones, for cudaDeviceSynchronize */
static GMutex streams_lock;
static int device_now;
static size_t used;
static GTree *allocations; /* start -> size */
static GMutex lock;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static long env_long(const char *name, long fallback, long lo) {
  const char *v = getenv(name);
  char *end = NULL;
  long x = v ? strtol(v, &end, 10) : fallback;
  if (v && (end == v || *end || x < lo)) {
    fprintf(stderr, "emu: %s=%s: expected an integer >= %ld\n", name, v, lo);
    exit(2);
  }
  return x;
}

static int n_devices(void) {
  return (int)env_long("PIPER_EMU_GPUS", 1, 0);
}

static size_t device_bytes(void) {
  return (size_t)env_long("PIPER_EMU_GPU_BYTES", 1L << 30, 1L << 20);
}

bool emu_async(void) {
  static int mode = -1;
  if (mode < 0)
    mode = (int)env_long("PIPER_EMU_ASYNC", 0, 0) > 0;
  return mode;
}

/* PIPER_EMU_JITTER_US: each stream waits up to that long before each piece of work (drawn per
 * piece), so that runs try other interleavings of the streams */
static void jitter(void) {
  static long most = -1;
  static _Thread_local GRand *rng;
  if (most < 0)
    most = env_long("PIPER_EMU_JITTER_US", 0, 0);
  if (!most)
    return;
  if (!rng)
    rng = g_rand_new();
  g_usleep((gulong)g_rand_int_range(rng, 0, (gint32)most + 1));
}

static gpointer stream_thread(gpointer data) {
  struct emu_stream *s = data;
  g_mutex_lock(&s->lock);
  for (;;) {
    while (g_queue_is_empty(&s->work) && !s->stop)
      g_cond_wait(&s->cond, &s->lock);
    struct work *w = g_queue_pop_head(&s->work);
    if (!w)
      break; /* stopped and drained */
    s->busy = true;
    g_mutex_unlock(&s->lock);
    jitter();
    w->run(w->arg);
    g_free(w);
    g_mutex_lock(&s->lock);
    s->busy = false;
    g_cond_broadcast(&s->cond);
  }
  g_mutex_unlock(&s->lock);
  return NULL;
}

void emu_enqueue(cudaStream_t s, void (*run)(void *), void *arg) {
  if (!s || !emu_async()) {
    run(arg);
    return;
  }
  struct work *w = g_new(struct work, 1);
  w->run = run;
  w->arg = arg;
  g_mutex_lock(&s->lock);
  g_queue_push_tail(&s->work, w);
  g_cond_broadcast(&s->cond);
  g_mutex_unlock(&s->lock);
}

static void stream_drain(cudaStream_t s) {
  g_mutex_lock(&s->lock);
  while (!g_queue_is_empty(&s->work) || s->busy)
    g_cond_wait(&s->cond, &s->lock);
  g_mutex_unlock(&s->lock);
}

static gint by_address(gconstpointer a, gconstpointer b, gpointer unused) {
  (void)unused;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y ? -1 : x > y;
}

/* The allocation holding [p, p + bytes), or false. */
bool emu_device_range(const void *p, size_t bytes) {
  if (!p)
    return false;
  g_mutex_lock(&lock);
  bool ok = false;
  if (allocations) {
    /* the last allocation starting at or below p */
    GTreeNode *n = g_tree_upper_bound(allocations, p);
    n = n ? g_tree_node_previous(n) : g_tree_node_last(allocations);
    if (n) {
      uintptr_t start = (uintptr_t)g_tree_node_key(n);
      size_t size = GPOINTER_TO_SIZE(g_tree_node_value(n));
      ok = (uintptr_t)p >= start && (uintptr_t)p + bytes <= start + size;
    }
  }
  g_mutex_unlock(&lock);
  return ok;
}

void emu_check_device(const void *p, size_t bytes, const char *what) {
  if (bytes && !emu_device_range(p, bytes)) {
    fprintf(stderr, "emu: %s: %zu bytes at %p are not inside one device allocation\n", what,
            bytes, p);
    abort();
  }
}

void emu_set_last_error(cudaError_t e) {
  last_error = e;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulation: PIPER_EMU_GPUS=0)";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorNotSupported: return "operation not supported";
  }
  return "unknown error";
}

/* ---- devices -------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n) {
  *n = n_devices();
  return *n ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= n_devices())
    return cudaErrorInvalidDevice;
  device_now = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= n_devices())
    return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "emulated GPU %d (host CPU)", device);
  memcpy(prop->uuid.bytes, "piper-emu-gpu", 13);
  prop->uuid.bytes[15] = (unsigned char)device;
  prop->totalGlobalMem = device_bytes();
  prop->multiProcessorCount = 8;
  prop->major = 8;
  prop->sharedMemPerBlockOptin = 163 * 1024;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  g_mutex_lock(&streams_lock);
  for (guint i = 0; streams && i < streams->len; i++)
    stream_drain(g_ptr_array_index(streams, i));
  g_mutex_unlock(&streams_lock);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  g_mutex_lock(&lock);
  *total = device_bytes();
  *free_bytes = used < *total ? *total - used : 0;
  g_mutex_unlock(&lock);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)symbol, (void)version, (void)flags;
  *fn = NULL; /* no driver: the backend reports green contexts missing */
  if (status)
    *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

/* ---- memory --------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = NULL;
  size_t size = bytes ? (bytes + 255) & ~(size_t)255 : 256;
  g_mutex_lock(&lock);
  bool room = used + size <= device_bytes();
  if (room)
    used += size;
  g_mutex_unlock(&lock);
  if (!room)
    return cudaErrorMemoryAllocation;
  void *m = aligned_alloc(256, size);
  if (!m)
    return cudaErrorMemoryAllocation;
  memset(m, 0xff, size); /* NaN bytes, as fresh device memory is not zero */
  g_mutex_lock(&lock);
  if (!allocations)
    allocations = g_tree_new_full(by_address, NULL, NULL, NULL);
  g_tree_insert(allocations, m, GSIZE_TO_POINTER(size));
  g_mutex_unlock(&lock);
  *p = m;
  return cudaSuccess;
}

/* p's allocation back, at once */
static cudaError_t release(void *p) {
  g_mutex_lock(&lock);
  gpointer size = allocations ? g_tree_lookup(allocations, p) : NULL;
  if (size) {
    g_tree_remove(allocations, p);
    used -= GPOINTER_TO_SIZE(size);
  }
  g_mutex_unlock(&lock);
  if (!size)
    return cudaErrorInvalidValue; /* not an allocation's start */
  free(p);
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p)
    return cudaSuccess;
  cudaDeviceSynchronize(); /* as CUDA's: nothing enqueued still uses it */
  return release(p);
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  (void)s;
  return cudaMalloc(p, bytes);
}

static void free_now(void *p) {
  cudaError_t e = release(p); /* the work before it on its stream has run */
  if (e != cudaSuccess) {
    fprintf(stderr, "emu: cudaFreeAsync(%p): not an allocation's start\n", p);
    abort();
  }
}

/* after the work enqueued before it (stream order), as the stream-ordered allocator's */
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (!p)
    return cudaSuccess;
  if (!emu_device_range(p, 1))
    return cudaErrorInvalidValue;
  if (s && emu_async()) {
    emu_enqueue(s, free_now, p);
    return cudaSuccess;
  }
  return cudaFree(p);
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  static struct emu_mem_pool pools[64];
  if (device < 0 || device >= n_devices() || device >= 64)
    return cudaErrorInvalidDevice;
  pools[device].device = device;
  *pool = &pools[device];
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  (void)attr, (void)value;
  return pool ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice)
    emu_check_device(dst, bytes, "cudaMemcpy destination");
  if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice)
    emu_check_device(src, bytes, "cudaMemcpy source");
  if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault)
    return cudaErrorInvalidValue; /* the backend names every direction */
  if (bytes)
    memmove(dst, src, bytes);
  return cudaSuccess;
}

/* A copy or a fill enqueued: bytes from src (its own snapshot for host memory) or value */
struct copy_work {
  void *dst;
  const void *src;
  size_t bytes;
  int value;
  bool fill;
  unsigned char host[]; /* the snapshot */
};

static void copy_run(void *arg) {
  struct copy_work *c = arg;
  if (c->fill)
    memset(c->dst, c->value, c->bytes);
  else
    memmove(c->dst, c->src, c->bytes);
  g_free(c);
}

/* Host memory here is pageable (g_malloc), so as CUDA does: host to device takes the source
 * when called (its bytes staged) and lands in stream order; device to host waits for the
 * stream and copies before returning; device to device is stream work. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (!s || !emu_async() || kind == cudaMemcpyDeviceToHost) {
    if (s && emu_async())
      stream_drain(s);
    return cudaMemcpy(dst, src, bytes, kind);
  }
  if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault)
    return cudaErrorInvalidValue;
  emu_check_device(dst, bytes, "cudaMemcpyAsync destination");
  bool staged = kind == cudaMemcpyHostToDevice;
  if (!staged)
    emu_check_device(src, bytes, "cudaMemcpyAsync source");
  struct copy_work *c = g_malloc(sizeof *c + (staged ? bytes : 0));
  *c = (struct copy_work){dst, staged ? c->host : src, bytes, 0, false};
  if (staged)
    memcpy(c->host, src, bytes);
  emu_enqueue(s, copy_run, c);
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  emu_check_device(p, bytes, "cudaMemset");
  memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
  emu_check_device(p, bytes, "cudaMemsetAsync");
  struct copy_work *c = g_new(struct copy_work, 1);
  *c = (struct copy_work){p, NULL, bytes, value, true};
  emu_enqueue(s, copy_run, c);
  return cudaSuccess;
}

/* ---- streams and events --------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
  (void)flags;
  *s = g_new0(struct emu_stream, 1);
  (*s)->priority = priority;
  g_mutex_init(&(*s)->lock);
  g_cond_init(&(*s)->cond);
  g_queue_init(&(*s)->work);
  if (emu_async())
    (*s)->thread = g_thread_new("emu-stream", stream_thread, *s);
  g_mutex_lock(&streams_lock);
  if (!streams)
    streams = g_ptr_array_new();
  g_ptr_array_add(streams, *s);
  g_mutex_unlock(&streams_lock);
  return cudaSuccess;
}

/* As CUDA's: the work enqueued still runs (here: before it returns). */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s)
    return cudaErrorInvalidValue;
  g_mutex_lock(&streams_lock);
  g_ptr_array_remove(streams, s);
  g_mutex_unlock(&streams_lock);
  if (s->thread) {
    g_mutex_lock(&s->lock);
    s->stop = true;
    g_cond_broadcast(&s->cond);
    g_mutex_unlock(&s->lock);
    g_thread_join(s->thread);
  }
  g_mutex_clear(&s->lock);
  g_cond_clear(&s->cond);
  g_free(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s && emu_async())
    stream_drain(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!s || !emu_async())
    return cudaSuccess;
  g_mutex_lock(&s->lock);
  bool idle = g_queue_is_empty(&s->work) && !s->busy;
  g_mutex_unlock(&s->lock);
  return idle ? cudaSuccess : cudaErrorNotReady;
}

struct event_work {
  cudaEvent_t e;
  uint64_t k; /* the record: the k-th */
};

static void event_mark(void *arg) {
  struct event_work *w = arg;
  g_mutex_lock(&event_lock);
  if (w->k > w->e->done)
    w->e->done = w->k;
  w->e->at = now_s(); /* everything before it on the stream has run */
  g_cond_broadcast(&event_cond);
  g_mutex_unlock(&event_lock);
  g_free(w);
}

static void event_wait(void *arg) {
  struct event_work *w = arg;
  g_mutex_lock(&event_lock);
  while (w->e->done < w->k)
    g_cond_wait(&event_cond, &event_lock);
  g_mutex_unlock(&event_lock);
  g_free(w);
}

/* the work enqueued on s after this waits for e's last record before it */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)flags;
  if (!e)
    return cudaErrorInvalidValue;
  g_mutex_lock(&event_lock);
  uint64_t k = e->recorded;
  g_mutex_unlock(&event_lock);
  if (k) {
    struct event_work *w = g_new(struct event_work, 1);
    *w = (struct event_work){e, k};
    emu_enqueue(s, event_wait, w);
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  return cudaEventCreateWithFlags(e, 0);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  *e = g_new0(struct emu_event, 1);
  (*e)->flags = flags;
  return cudaSuccess;
}

/* Asynchronous: work still enqueued may name it (a record, a wait), so it is left to the
 * process's end, as CUDA keeps an event's resources until its pending work is done. */
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!emu_async())
    g_free(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e)
    return cudaErrorInvalidValue;
  g_mutex_lock(&event_lock);
  struct event_work *w = g_new(struct event_work, 1);
  *w = (struct event_work){e, ++e->recorded};
  g_mutex_unlock(&event_lock);
  emu_enqueue(s, event_mark, w);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e)
    return cudaErrorInvalidValue;
  g_mutex_lock(&event_lock);
  bool done = e->done >= e->recorded;
  g_mutex_unlock(&event_lock);
  return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e)
    return cudaErrorInvalidValue;
  g_mutex_lock(&event_lock);
  while (e->done < e->recorded)
    g_cond_wait(&event_cond, &event_lock);
  g_mutex_unlock(&event_lock);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end || !start->recorded || !end->recorded ||
      (start->flags | end->flags) & cudaEventDisableTiming)
    return cudaErrorInvalidValue;
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess)
    return cudaErrorNotReady;
  *ms = (float)((end->at - start->at) * 1e3);
  return cudaSuccess;
}
