#!/usr/bin/env bash
# The cuda backend on the emulated GPU (tests/gpu/emu/README.md), where no GPU is: `make emu`
# builds the backend and its kernels against host stand-ins of the CUDA runtime, cuBLASLt and
# NCCL; then the fused attention's own check at five shapes (one row; one exact tile; a
# partial tile over two sequences; three tiles with a 2-row tail; GQA groups of 2 and 3;
# every head size) against a double-precision reference, and tools/gpu-check.sh --emu: every
# kernel against the host reference, tiny-moe trained on one emulated GPU and on four (ranks
# sharing one, host-staged; one each, through NCCL), piper-prof --backend cuda and the
# simulate -> execute -> compare loop, and the equivalence suite's plans (losses and final
# parameters against the host backend's). Skipped, with a line, without g++ or MPI.
set -u
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! command -v g++ > /dev/null || ! command -v mpicc > /dev/null || ! command -v mpirun > /dev/null; then
  echo "skip: test_cuda_emu needs g++ and MPI (the emulated backend is built as the real one is)"
  exit 0
fi
case $(uname -m) in
  x86_64 | aarch64) ;;
  *) echo "skip: the emulation's fibers switch stacks on x86-64 and AArch64 only"; exit 0 ;;
esac
if ! make -j2 --no-print-directory emu > "$tmp/build.log" 2>&1; then
  tail -30 "$tmp/build.log"
  echo "FAIL: make emu"
  exit 1
fi
fails=0
passes=0
for shape in "1 1 1 1 32" "1 64 2 2 64" "2 40 2 1 32" "1 130 2 1 128" "1 70 3 1 64"; do
  # shellcheck disable=SC2086 # a shape is five words
  if out=$(timeout 120 build/emu/gpu/flash_emu $shape 2>&1); then
    echo "ok: fused attention, $out"
    passes=$((passes + 1))
  else
    echo "FAIL: fused attention, $out"
    fails=$((fails + 1))
  fi
done
if OUT="$tmp/gpu-check" GPU_CHECK_SKIP_BUILD=1 tools/gpu-check.sh --emu > "$tmp/gc.log" 2>&1; then
  echo "ok: tools/gpu-check.sh --emu: $(grep -c '^ok:' "$tmp/gc.log") steps ok, $(tail -1 "$tmp/gc.log")"
  passes=$((passes + 1))
else
  grep -E '^(FAIL|skip)' "$tmp/gc.log"
  tail -3 "$tmp/gc.log"
  echo "FAIL: tools/gpu-check.sh --emu"
  fails=$((fails + 1))
fi
# context parallelism is the host backend's alone (its attention kernels take no chunk offsets
# yet): refused in one line, said once, exit 2
out=$(PIPER_CUDA_MEMORY=268435456 timeout 120 mpirun --oversubscribe -np 2 build/emu/bin/piper-exec \
  --backend cuda --model models/tiny-dense.json --layout cp=2 --iters 1 --no-report 2>&1)
rc=$?
if [ "$rc" -eq 2 ] && [ "$(grep -c 'context parallelism): not executed on a backend other than host' <<<"$out")" -eq 1 ]; then
  echo "ok: a context-parallel plan on the cuda backend is refused"
  passes=$((passes + 1))
else
  echo "FAIL: a context-parallel plan on the cuda backend: exit $rc: $out"
  fails=$((fails + 1))
fi
echo "test_cuda_emu: $passes passed, $fails failed"
[ "$fails" = 0 ]
