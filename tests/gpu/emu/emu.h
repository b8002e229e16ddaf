/* emu: what the emulation's parts share (tests/gpu/emu/README.md). */
#ifndef PIPER_EMU_EMU_H
#define PIPER_EMU_EMU_H
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* true when [p, p + bytes) lies inside one device allocation */
bool emu_device_range(const void *p, size_t bytes);
/* aborts, naming what, unless [p, p + bytes) lies inside one device allocation (bytes 0: no
 * check) */
void emu_check_device(const void *p, size_t bytes, const char *what);
/* PIPER_EMU_ASYNC=1: every stream runs its work in its own thread, as a GPU runs its
 * streams apart (README.md) */
bool emu_async(void);
typedef struct emu_stream *emu_stream_t;
/* run(arg) on stream s in its order (at once when synchronous, or on the NULL stream);
 * run owns arg */
void emu_enqueue(emu_stream_t s, void (*run)(void *), void *arg);
#ifdef __cplusplus
}
#endif
#endif
