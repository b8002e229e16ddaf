/* A host stand-in for NVTX (tests/gpu/emu/README.md): ranges are for Nsight, which the
 * emulation has not; they do nothing. */
#ifndef PIPER_EMU_NVTX_H
#define PIPER_EMU_NVTX_H
static inline int nvtxRangePushA(const char *name) {
  (void)name;
  return 0;
}
static inline int nvtxRangePop(void) {
  return 0;
}
#endif
