#!/usr/bin/env bash
# The cuda backend on the emulated GPU (tests/gpu/emu/README.md), where no GPU is: `make emu`
# builds the backend and its kernels against host stand-ins of the CUDA runtime, cuBLASLt and
# NCCL; then the fused attention's own check at five shapes (one row; one exact tile; a
# partial tile over two sequences; three tiles with a 2-row tail; GQA groups of 2 and 3;
# every head size) against a double-precision reference, and tools/gpu-check.sh --emu: every
# kernel against the host reference, tiny-moe trained on one emulated GPU and on four (ranks
# sharing one, host-staged; one each, through NCCL), the FP8 GEMMs against the host reference
# (bench_fp8 --small) and tiny-moe under each piper.fp8 recipe against its bf16 run (losses
# within DeepSeek-V3's 0.25%; the e4m3 GEMM count), piper-prof --backend cuda and the
# simulate -> execute -> compare loop, and the equivalence suite's plans (losses and final
# parameters against the host backend's); attention from cuDNN through its stand-in (the kernel
# check: the call sequence and numerics, chunk offsets), and the same check built without
# cuDNN. Skipped, with a line, without g++ or MPI.
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
# Built without cuDNN (NO_CUDNN=1): the sources that see HAVE_CUDNN recompiled without it and
# linked against the emulated library (a whole second emulated build would double this test's
# time); the kernel check then skips cuDNN, and the table's attention runs the own kernels
# (the stand-in counts no execution but the check's own: none, as it is skipped).
nocudnn_check() {
  local flags libs o objs=()
  flags=$(make -s --no-print-directory CUDA_EMU=1 NO_CUDNN=1 BUILD=build/emu print-cflags)
  libs=$(make -s --no-print-directory CUDA_EMU=1 NO_CUDNN=1 BUILD=build/emu print-libs)
  for src in exec/backend_cuda.c exec/backend_cuda_kernels.c exec/backend_cuda_cudnn.c \
    tests/gpu/check_kernels.c; do
    o="$tmp/nocudnn-$(basename "$src" .c).o"
    # shellcheck disable=SC2086 # flags are words
    cc $flags -c "$src" -o "$o" 2>> "$tmp/nocudnn.log" || return 1
    objs+=("$o")
  done
  # shellcheck disable=SC2086
  cc "${objs[@]}" build/emu/libpiper-tools.a build/emu/libpiper.a $libs -o "$tmp/check_nocudnn" \
    2>> "$tmp/nocudnn.log" || return 1
  timeout 300 "$tmp/check_nocudnn" > "$tmp/nocudnn.txt" 2>&1 &&
    grep -q '^skip cudnn: this build has no cuDNN' "$tmp/nocudnn.txt"
}
if nocudnn_check; then
  echo "ok: built without cuDNN (NO_CUDNN=1): the kernel check passes on the own attention kernels, $(tail -1 "$tmp/nocudnn.txt")"
  passes=$((passes + 1))
else
  tail -5 "$tmp/nocudnn.log" "$tmp/nocudnn.txt" 2> /dev/null
  echo "FAIL: the build without cuDNN (NO_CUDNN=1)"
  fails=$((fails + 1))
fi
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
