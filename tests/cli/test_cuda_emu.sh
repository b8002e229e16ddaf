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
# cuDNN; context parallelism's blocks on the fused kernel, and CP 2 trained on the cuDNN and
# fused cores; DeepSeek-V3's FP8 caching of the experts' inputs against the host backend's.
# Skipped, with a line, without g++ or MPI.
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
# context parallelism's blocks on the fused core (kernels/flash_attention.cu with the chunks'
# lengths and shift): a sequence's halves as chunks, merged, against the whole attention (one
# tile with a 35-row chunk; two tiles per chunk)
for shape in "1 70 2 1 32" "1 140 3 1 64"; do
  # shellcheck disable=SC2086 # a shape is five words
  if out=$(timeout 120 build/emu/gpu/flash_emu $shape chunks 2>&1); then
    echo "ok: fused attention, $out"
    passes=$((passes + 1))
  else
    echo "FAIL: fused attention, $out"
    fails=$((fails + 1))
  fi
done
# ... and trained: CP 2 with bf16 GEMMs on each attention core a bf16 model takes (cuDNN's SDPA
# through its stand-in, the own fused kernel), one emulated GPU per rank, against the host
# backend's one-device run: the losses within the bf16 tolerance (3e-2) (2 micro-batches, 2
# steps: the emulated tensor cores are slow); the fp32 cores against one device at 1e-4:
# tests/cli/test_exec.sh
# tiny-dense with 2 heads of 32 (the fused kernel's smallest head size; cuDNN's takes any
# multiple of 8)
python3 -c "import json, sys; m = json.load(open('models/tiny-dense.json'))
m.update(num_attention_heads=2, num_key_value_heads=1); json.dump(m, open(sys.argv[1], 'w'))" \
  "$tmp/tiny-d32.json"
cp_run() { # NAME NP BACKEND ARGS...
  PIPER_EMU_GPUS=2 PIPER_CUDA_MEMORY=268435456 timeout 900 mpirun --oversubscribe -np "$2" \
    build/emu/bin/piper-exec --backend "$3" --model "$tmp/tiny-d32.json" "${@:4}" --mbs 2 \
    --warmup 0 --iters 2 --quiet --timeout 300 --no-charts --out "$tmp/$1" > "$tmp/$1.log" 2>&1
}
if cp_run cp-host 1 host --pp-regions 1 --layout pp=1; then
  for core in cudnn fused; do
    r=
    if PIPER_CUDA_GEMM=bf16 PIPER_CUDA_ATTENTION=$core cp_run "cp-$core" 2 cuda --layout cp=2 &&
      r=$(python3 - "$tmp/cp-host" "$tmp/cp-$core" << 'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/metrics.json"))["losses"]
b = json.load(open(sys.argv[2] + "/metrics.json"))["losses"]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"worst loss {worst:.1e} (tol 3e-2)")
sys.exit(0 if len(a) == len(b) == 2 and worst <= 3e-2 else 1)
PY
      ); then
      echo "ok: CP 2 on the $core attention core (bf16 GEMMs) = one device: $r"
      passes=$((passes + 1))
    else
      echo "FAIL: CP 2 on the $core attention core: ${r:-} $(tail -3 "$tmp/cp-$core.log")"
      fails=$((fails + 1))
    fi
  done
else
  echo "FAIL: the one-device host run: $(tail -3 "$tmp/cp-host.log")"
  fails=$((fails + 1))
fi
# DeepSeek-V3's FP8 caching of the experts' inputs (fp8-expert-inputs) on the cuda backend: EP
# 2, one emulated GPU per rank, fp32 GEMMs, 2 steps (about 70 s on 2 cores), against the host
# backend's run of the same plan: the losses within the emulated-CUDA tolerance of
# tools/gpu-check.sh (1e-4: the cast is the same bits, the kernel check's "fp8 routed rows"),
# and the memory within 1% of the simulator's (tests/cli/test_memory.sh's rule)
fp8_run() { # NAME BACKEND EXE
  PIPER_EMU_GPUS=2 PIPER_CUDA_MEMORY=268435456 PIPER_CUDA_GEMM=fp32 timeout 900 mpirun \
    --oversubscribe -np 2 "$3" --backend "$2" --model models/tiny-moe.json \
    --layout dp=2,ep=2,fp8-expert-inputs --mbs 4 --warmup 0 --iters 2 --quiet --timeout 300 \
    --no-charts --out "$tmp/$1" > "$tmp/$1.log" 2>&1
}
if fp8_run fp8-host host "${PIPER_BIN:-bin}/piper-exec" && fp8_run fp8-cuda cuda build/emu/bin/piper-exec &&
  "${PIPER_BIN:-bin}/piper-sim" --model models/tiny-moe.json --layout dp=2,ep=2,fp8-expert-inputs --mbs 4 \
    --profile profiles/host-cpu.json --out "$tmp/fp8-sim" --no-charts --quiet > /dev/null 2>&1 &&
  r=$(python3 - "$tmp" << 'PY'
import json, sys
t = sys.argv[1]
a = json.load(open(t + "/fp8-host/metrics.json"))["losses"]
b = json.load(open(t + "/fp8-cuda/metrics.json"))["losses"]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
sim = json.load(open(t + "/fp8-sim/metrics.json"))["devices"]
ex = json.load(open(t + "/fp8-cuda/metrics.json"))["devices"]
mem = max(abs(e["peak_memory_bytes"] - s["peak_memory_bytes"]) / s["peak_memory_bytes"]
          for s, e in zip(sim, ex))
print(f"worst loss {worst:.1e} (tol 1e-4), peak memory {100 * mem:.2f}% from the simulator's")
sys.exit(0 if len(a) == len(b) == 2 and worst <= 1e-4 and mem <= 0.01 else 1)
PY
  ); then
  echo "ok: fp8-expert-inputs on the emulated GPU = the host backend: $r"
  passes=$((passes + 1))
else
  echo "FAIL: fp8-expert-inputs on the emulated GPU: ${r:-} $(tail -3 "$tmp/fp8-cuda.log")"
  fails=$((fails + 1))
fi
echo "test_cuda_emu: $passes passed, $fails failed"
[ "$fails" = 0 ]
