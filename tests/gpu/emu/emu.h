/* emu: what the emulation's parts share (tests/gpu/emu/README.md). */
#ifndef PIPER_EMU_EMU_H
#define PIPER_EMU_EMU_H
#include <stdbool.h>
#include <stddef.h>

/* true when [p, p + bytes) lies inside one device allocation */
bool emu_device_range(const void *p, size_t bytes);
/* aborts, naming what, unless [p, p + bytes) lies inside one device allocation (bytes 0: no
 * check) */
void emu_check_device(const void *p, size_t bytes, const char *what);
#endif
