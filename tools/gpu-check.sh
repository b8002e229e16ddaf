#!/usr/bin/env bash
# gpu-check: the cuda backend's checks, on a machine with an NVIDIA GPU, the CUDA toolkit in
# /usr/local/cuda (NCCL, cuBLASLt) and Debian packages only. One script, meant to finish in
# under 8 minutes on one H200 (each step is capped, and a step that would start past 7 minutes
# is failed unrun); writes its report, traces and profile under $OUT (default out/gpu-check)
# and exits non-zero when a check fails.
#   (a) every CUDA kernel against the host reference kernels, F, BI and BW apart, with fp32
#       GEMMs (tolerance 2e-4) and bf16 GEMMs (3e-2) (tests/gpu/check_kernels.c says why; bf16
#       attention runs cuDNN's fused SDPA where the build found cuDNN, also checked alone at
#       context-parallel chunk offsets), and with bf16 GEMMs again with the own fused and the
#       unfused attention cores forced (PIPER_CUDA_ATTENTION), with the fused LM head in
#       16-column vocabulary tiles (PIPER_CUDA_HEAD_COLS, fp32 and bf16) and
#       with the LM head in 7-row chunks (PIPER_CUDA_HEAD_ROWS: its multi-chunk path); the
#       bf16 activation kernels (kernels/cuda_bf16.cu) against the host on bf16 inputs (2^-8);
#   (b) tiny-moe, 20 steps: one GPU (fp32 GEMMs, as the model is fp32; and bf16 GEMMs), and 4
#       ranks PP2 x DP2 x EP2 dualpipev sharing the GPU (host-staged MPI), against the host
#       backend's losses step by step; then the issue's "a dualpipev plan no slower than the
#       same work run sequentially": the 4-rank run's step time against one GPU running the same
#       global batch in one process (pp=1, 8 micro-batches: 512 tokens per step, as 2 DP ranks x
#       4 micro-batches), median step times (reported, not failed: the ranks share the GPU
#       through host-staged MPI, so this is no measure of NCCL's overlap);
#   (c) llama3-8b-shaped layers at reduced depth (2 layers, then 8, seq 4096) on one GPU:
#       throughput, MFU against the GPU's dense bf16 peak, executor overhead (step time against
#       the busy time of the GPU's instructions), reported against the issue's targets (>= 60%
#       MFU, <= 2% overhead; reported, not failed);
#       then (tools/gpu-peer.py) the same 2-layer model trained by PyTorch on the same GPU,
#       eager and torch.compile, SDPA attention, bf16 autocast, fused AdamW: tokens/s and MFU
#       beside piper-exec's (one line where PyTorch or a mode is unavailable); the attention
#       cores alone (cuDNN's and the own kernel's F/B TFLOP/s at sequence 4096), cuBLASLt's
#       GEMMs in bf16 and the FP8 GEMMs of both recipes (build/gpu/bench_fp8: with and
#       without quantisation, checked against the host reference), and the 2-layer step under
#       each FP8 recipe (MFU against the dense bf16 peak, speed-up over the bf16 step);
#   (b') FP8 (piper.fp8, exec/backend_cuda_fp8.c): tiny-moe as a bf16 model, 100 steps in
#       bf16 and under each recipe (tensorwise, blockwise): every step's loss within 0.25% of
#       bf16's (DeepSeek-V3's published bound), and the run's "GEMMs in e4m3" count above 0;
#   (d) piper-prof --backend cuda at the shapes of tiny-moe and the llama layers (the llama
#       layers' per-op table F / BI / BW / B goes into the report, with the MLP op's MFU alone:
#       6 T C F FLOPs for F, 12 T C F for B, and a whole decoder layer's), then simulate ->
#       execute -> compare with that
#       profile, for tiny-moe on one GPU and for the llama layers of (c) (the prediction errors
#       are reported, not failed);
#   (e) the equivalence suite's multi-rank plans of tiny-moe (DP2, PP2 x DP2 x EP2 1F1B, ZeRO-1,
#       ZeRO-3, ZB-H1, interleaved 1F1B (also M = 5, groups of 3), DualPipe on 4 stages (and
#       with ZeRO-1), uneven stages (1 + 3 layers), full recomputation, tensor
#       parallelism with SP: PP2 x TP2, DP2 x EP2 x TP2, EP 2 inside DP 4, EP 4 over TP 2 x
#       DP 2 with expert TP 1 and ZeRO-1), ranks
#       sharing the GPU, 10 steps each against the host backend's run of the same plan (1e-4).
# Usage: tools/gpu-check.sh [--dry-run | --emu]   (from anywhere; OUT=DIR chooses where results go)
# --dry-run: no GPU needed: builds as configured, then runs every step's host-side part (the
# host reference runs, the reduced llama model, simulate -> compare against a host run of the
# same plan) so the script's plumbing is checked where no GPU is (tests/cli/test_cuda.sh runs
# it with GPU_CHECK_SKIP_BUILD=1, which skips the build). GPU_CHECK_SKIP_BUILD=1 on a GPU uses a
# tree built beforehand, which must list the cuda backend.
# --emu: no GPU needed: the same checks on the emulated GPU (tests/gpu/emu/README.md: the cuda
# backend and its kernels built against host stand-ins of the CUDA runtime, cuBLASLt and
# NCCL, by `make emu`): (a) and (b) as on a GPU, plus (b) with one emulated GPU per rank (the
# NCCL path, over MPI, each stream in its own thread with jitter: PIPER_EMU_ASYNC); (c) is
# skipped (Llama layers at CPU speed); (d) profiles tiny-moe only; (e) runs each plan with one
# emulated GPU per rank (NCCL, streams apart); runs take 8 steps ((e) 4), not 20. Times mean
# nothing there.
set -u
cd "$(dirname "$0")/.." || exit 2
DRY=0
EMU=0
case ${1:-} in
  --dry-run) DRY=1 ;;
  --emu) EMU=1 ;;
  "") ;;
  -h | --help) sed -n '2,58p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu-check.sh: error: unknown argument $1" >&2; exit 2 ;;
esac
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT" || exit 2
# run directories of an earlier check go (each run writes a fresh one)
rm -rf "$OUT"/moe* "$OUT"/llama* "$OUT"/loop* "$OUT"/sim* "$OUT"/eq-*
REPORT="$OUT/report.txt"
: > "$REPORT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
fails=0
say() { echo "$*" | tee -a "$REPORT"; }
ok() { say "ok:   $*"; }
fail() { say "FAIL: $*"; fails=$((fails + 1)); }
t_start=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-420} # no step starts after this: the whole stays under 8 minutes
# in_budget STEP: true while a step may still start, else the step is failed unrun
in_budget() {
  local used=$(($(date +%s) - t_start))
  [ "$used" -lt "$BUDGET" ] && return 0
  fail "$1: not run, $used s used of the ${BUDGET} s budget"
  return 1
}
EXEC=bin/piper-exec
PROF=bin/piper-prof
TOOLS=bin # piper-sim, piper-compare
KBIN=build/gpu # the GPU check programs
STEPS=20       # (b)'s training runs; (e)'s take half
BACKEND=cuda
[ "$DRY" = 1 ] && BACKEND=host # dry run: the host backend stands in for the GPU's runs
if [ "$EMU" = 1 ]; then
  EXEC=build/emu/bin/piper-exec
  PROF=build/emu/bin/piper-prof
  TOOLS=build/emu/bin # `make emu` builds every program (bin/ may not exist)
  KBIN=build/emu/gpu
  # a CPU thread runs each rank's kernels: fewer steps (each still runs every instruction
  # kind and the optimizer), no step budget, and an arena that leaves the emulated GPU's
  # 1 GiB room for the streams' workspaces
  STEPS=8
  BUDGET=${GPU_CHECK_BUDGET_S:-3000}
  export PIPER_CUDA_MEMORY=${PIPER_CUDA_MEMORY:-268435456}
fi

# ---- the GPU -------------------------------------------------------------------------------
mode=
[ "$DRY" = 1 ] && mode=' (dry run: no GPU used)'
[ "$EMU" = 1 ] && mode=' (emulated GPU: tests/gpu/emu)'
say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)$mode"
peak=0
cap=
if [ "$EMU" = 1 ]; then
  say "GPU: emulated on the CPU (no tensor cores, no timing: results are checked, times are not)"
elif [ "$DRY" = 0 ]; then
  if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    say "FAIL: no GPU (nvidia-smi -L fails): nothing to check"
    exit 2
  fi
  nvidia-smi -L | tee -a "$REPORT"
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
  # dense bf16 peak (TFLOP/s) of the GPUs the targets are stated for; others: CUDA_PEAK_TFLOPS
  case "$gpu_name" in
    *H200* | *H100*SXM* | *H100\ 80GB\ HBM3*) peak=${CUDA_PEAK_TFLOPS:-989} ;;
    *H100*) peak=${CUDA_PEAK_TFLOPS:-756} ;;
    *A100*) peak=${CUDA_PEAK_TFLOPS:-312} ;;
    *) peak=${CUDA_PEAK_TFLOPS:-0} ;;
  esac
  say "GPU: $gpu_name (sm_$cap), dense bf16 peak ${peak} TFLOP/s"
fi

# ---- build: only this GPU's architecture, to keep nvcc short -------------------------------
build() {
  local tb
  tb=$(date +%s)
  if [ -n "${GPU_CHECK_SKIP_BUILD:-}" ]; then
    # a tree built elsewhere (a login node, or here before): it must hold the cuda backend
    if [ "$DRY" = 0 ] && ! { [ -x $KBIN/check_kernels ] && $EXEC --list-backends | grep -q '^cuda'; }; then
      fail "build: GPU_CHECK_SKIP_BUILD is set but the tree holds no cuda backend (make CUDA_ARCH=sm_$cap all)"
      exit 1
    fi
    say "skip: build (GPU_CHECK_SKIP_BUILD: the tree is built)"
    return
  fi
  export PATH="/usr/local/cuda/bin:$PATH"
  if [ "$EMU" = 1 ]; then
    make -j"$(nproc)" all emu > "$OUT/build.log" 2>&1 &&
      [ -x $KBIN/check_kernels ] && $EXEC --list-backends | grep -q '^cuda'
  elif [ "$DRY" = 0 ]; then
    timeout 240 tools/install-deps.sh > "$OUT/install-deps.log" 2>&1 ||
      say "note: install-deps failed (see $OUT/install-deps.log)"
    make -j"$(nproc)" CUDA_ARCH="sm_$cap" all > "$OUT/build.log" 2>&1 &&
      [ -x build/gpu/check_kernels ] && $EXEC --list-backends | grep -q '^cuda'
  else
    make -j"$(nproc)" all > "$OUT/build.log" 2>&1
  fi || {
    fail "build (see $OUT/build.log$([ "$DRY" = 0 ] && echo '; the cuda backend must be listed'))"
    tail -20 "$OUT/build.log"
    exit 1
  }
  ok "build ($(($(date +%s) - tb)) s)"
}

# ---- (a) kernels ---------------------------------------------------------------------------
check_kernels() {
  [ "$DRY" = 1 ] && { say "skip: (a) kernels need the GPU"; return; }
  # label|environment: both GEMM precisions (bf16 runs take cuDNN's attention where built,
  # and the checks run cuDNN's entry point at context-parallel chunk offsets); the own fused
  # and the unfused attention cores, which bf16 runs take only when asked; the LM head's row
  # chunks (PIPER_CUDA_HEAD_ROWS also chooses that path over the fused head) of 7 rows (the
  # checks' T of 32 rows is one chunk under the chunk rule: 5 chunks, the last partial, check
  # the multi-chunk path, dparams summed over chunks); and the fused head (the default) in
  # 16-column vocabulary tiles (the checks' V of 101 is one tile under the tile rule: 7
  # tiles, the last partial, check the log-sum-exp merge and dh summed over tiles)
  local variants=("fp32 GEMMs|PIPER_CUDA_GEMM=fp32" "bf16 GEMMs|PIPER_CUDA_GEMM=bf16"
    "bf16 GEMMs, own fused attention|PIPER_CUDA_GEMM=bf16 PIPER_CUDA_ATTENTION=fused"
    "bf16 GEMMs, unfused attention|PIPER_CUDA_GEMM=bf16 PIPER_CUDA_ATTENTION=unfused"
    "bf16 GEMMs, LM head in 7-row chunks|PIPER_CUDA_GEMM=bf16 PIPER_CUDA_HEAD_ROWS=7"
    "fp32 GEMMs, fused LM head in 16-column tiles|PIPER_CUDA_GEMM=fp32 PIPER_CUDA_HEAD_COLS=16"
    "bf16 GEMMs, fused LM head in 16-column tiles|PIPER_CUDA_GEMM=bf16 PIPER_CUDA_HEAD_COLS=16")
  local v label vars n=0 f
  for v in "${variants[@]}"; do
    IFS='|' read -r label vars <<< "$v"
    n=$((n + 1))
    f="$OUT/kernels-$n.txt"
    in_budget "(a) kernels, $label" || continue
    # shellcheck disable=SC2086 # vars is a list of assignments
    if env $vars timeout 90 $KBIN/check_kernels > "$f" 2>&1; then
      ok "(a) kernels vs host reference, $label: $(tail -1 "$f")"
    else
      fail "(a) kernels, $label: $(grep -c '^FAIL' "$f") failed; $(tail -1 "$f")"
      grep '^FAIL' "$f" | head -20 | tee -a "$REPORT"
    fi
  done
  # the FP8 GEMMs (exec/backend_cuda_fp8.c's recipes) against the host reference: the e4m3
  # bytes and scales bit for bit, the products within bench_fp8's tolerance; emulated, at
  # small shapes (their timings mean nothing); on a GPU (c) runs the full table
  if [ "$EMU" = 1 ] && in_budget "(a) FP8 GEMMs"; then
    if timeout 120 $KBIN/bench_fp8 --small > "$OUT/bench_fp8.txt" 2>&1; then
      ok "(a) FP8 GEMMs vs host reference (tensorwise, blockwise; bench_fp8 --small): $(grep -c ' ok$' "$OUT/bench_fp8.txt") ok"
    else
      fail "(a) FP8 GEMMs vs host reference: $(grep -E 'FAIL|differ|error' "$OUT/bench_fp8.txt" | head -3)"
    fi
  fi
}

# ---- (b) tiny-moe losses against the host backend ------------------------------------------
# compare_losses A B RTOL: every step's loss within RTOL relative (metrics.json "losses")
compare_losses() {
  python3 - "$1/metrics.json" "$2/metrics.json" "$3" "$STEPS" << 'PY'
import json, sys
a = json.load(open(sys.argv[1]))["losses"]
b = json.load(open(sys.argv[2]))["losses"]
rtol = float(sys.argv[3])
assert len(a) == len(b) == int(sys.argv[4]), (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b))
print(f"worst step {worst:.2e} (tol {rtol:g}); host {a[0]:.4f} -> {a[-1]:.4f}, other {b[0]:.4f} -> {b[-1]:.4f}")
sys.exit(0 if worst <= rtol else 1)
PY
}
one=(--model models/tiny-moe.json --layout pp=1 --iters "$STEPS" --warmup 0 --seed 7)
LAYOUT4=pp=2,dp=2,ep=2,v
four=(--model models/tiny-moe.json --layout "$LAYOUT4" --schedule dualpipev --mbs 4
  --iters "$STEPS" --warmup 0 --seed 7)
run() { # name, then the command; output in $OUT/name.log
  local name=$1
  shift
  timeout 150 "$@" > "$OUT/$name.log" 2>&1
}
# check_losses LABEL NAME REF TOL COMMAND...: run NAME, compare its losses with run REF's
check_losses() {
  local label=$1 name=$2 ref=$3 tol=$4 r=
  shift 4
  in_budget "$label" || return
  if run "$name" "$@" && r=$(compare_losses "$OUT/$ref" "$OUT/$name" "$tol"); then
    ok "$label: $r"
  else
    fail "$label: ${r:-$(tail -3 "$OUT/$name.log")}"
  fi
}
check_training() {
  in_budget "(b) host reference runs" || return
  if run moe1-host $EXEC "${one[@]}" --backend host --out "$OUT/moe1-host" &&
    run moe4-host mpirun --oversubscribe -np 4 $EXEC "${four[@]}" --backend host \
      --out "$OUT/moe4-host"; then
    ok "(b) host reference runs (one process; 4 ranks dualpipev)"
  else
    fail "(b) host reference runs (see moe1-host.log, moe4-host.log)"
    return
  fi
  if [ "$DRY" = 1 ]; then
    # the comparison itself, on two host runs of the same plan: equal to the last bit
    check_losses "(b) loss comparison (dry run: the host backend twice)" moe1-host-again \
      moe1-host 1e-6 $EXEC "${one[@]}" --backend host --out "$OUT/moe1-host-again"
    return
  fi
  # fp32 model: fp32 GEMMs; the losses differ only by summation order, through 20 AdamW steps
  check_losses "(b) tiny-moe one GPU, fp32" moe1-cuda moe1-host 1e-3 \
    $EXEC "${one[@]}" --backend cuda --out "$OUT/moe1-cuda"
  # bf16 GEMMs: the bf16 tolerance (3e-2, as the kernels')
  PIPER_CUDA_GEMM=bf16 check_losses "(b) tiny-moe one GPU, bf16 GEMMs" moe1-cuda-bf16 moe1-host \
    3e-2 $EXEC "${one[@]}" --backend cuda --out "$OUT/moe1-cuda-bf16"
  PIPER_CUDA_GEMM=bf16 check_losses \
    "(b) tiny-moe 4 ranks PP2xDP2xEP2 dualpipev on one GPU, bf16 GEMMs" moe4-cuda moe4-host \
    3e-2 mpirun --oversubscribe -np 4 $EXEC "${four[@]}" --backend cuda --out "$OUT/moe4-cuda"
  if [ -f "$OUT/moe4-cuda.log" ]; then
    if [ "$(grep -c "communication goes through host-staged" "$OUT/moe4-cuda.log")" -eq 1 ]; then
      ok "(b) host-staged MPI said once at start-up"
    else
      fail "(b) host-staged MPI not said exactly once in moe4-cuda.log"
    fi
  fi
  [ "$EMU" = 1 ] || return
  # the NCCL path, which one GPU cannot take: an emulated GPU per rank (NCCL's calls over MPI),
  # its streams run apart, each in its own thread, with jitter (a missing event wait fails)
  PIPER_EMU_GPUS=4 PIPER_EMU_ASYNC=1 PIPER_EMU_JITTER_US=50 PIPER_CUDA_GEMM=bf16 check_losses \
    "(b) tiny-moe 4 ranks PP2xDP2xEP2 dualpipev, a GPU each (NCCL, streams apart), bf16 GEMMs" \
    moe4-cuda-nccl moe4-host 3e-2 mpirun --oversubscribe -np 4 $EXEC "${four[@]}" \
    --backend cuda --out "$OUT/moe4-cuda-nccl"
  if [ -f "$OUT/moe4-cuda-nccl/metrics.json" ] && grep -q 'host-staged' "$OUT/moe4-cuda-nccl.log"; then
    fail "(b) with one emulated GPU per rank the ranks still went through host-staged MPI"
  fi
}

# step_ms DIR: the median step time (ms) of a run, its first 2 steps (warm-up: allocation,
# cuBLASLt's heuristic, the bf16 weight copies) left out
step_ms() {
  python3 - "$1/metrics.json" << 'PY'
import json, statistics, sys
t = json.load(open(sys.argv[1]))["iteration_times_s"]
print(f"{statistics.median(t[2:] if len(t) > 4 else t) * 1e3:.2f}")
PY
}
# The issue's "a dualpipev plan no slower than the same work run sequentially", on one GPU: the
# 4-rank dualpipev run above against one process running its global batch (2 DP ranks x 4
# micro-batches of micro_batch_size 2: 512 tokens per step = pp=1 with 8 micro-batches).
# Reported, not failed: 4 ranks sharing one GPU talk through host-staged MPI.
check_dualpipev_speed() {
  local four_dir=$OUT/moe4-$BACKEND seq=moe8-seq-$BACKEND t4 t1
  [ "$EMU" = 1 ] && { say "skip: (b) dualpipev against sequential: emulated times mean nothing"; return; }
  in_budget "(b) dualpipev against sequential" || return
  if [ ! -f "$four_dir/metrics.json" ]; then
    say "skip: (b) dualpipev against sequential: no 4-rank run in $four_dir (failed above)"
    return
  fi
  if ! PIPER_CUDA_GEMM=bf16 run "$seq" $EXEC --model models/tiny-moe.json --layout pp=1 --mbs 8 \
    --iters 20 --warmup 0 --seed 7 --backend "$BACKEND" --out "$OUT/$seq"; then
    fail "(b) dualpipev against sequential: $(tail -3 "$OUT/$seq.log")"
    return
  fi
  if ! t4=$(step_ms "$four_dir") || ! t1=$(step_ms "$OUT/$seq"); then
    fail "(b) dualpipev against sequential: no step times in $four_dir or $OUT/$seq"
    return
  fi
  python3 - "$t4" "$t1" "$BACKEND" << 'PY' | tee -a "$REPORT"
import sys
a, b, backend = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
how = ("the ranks share the GPU through host-staged MPI" if backend == "cuda"
       else "dry run: 4 processes on the CPUs")
print(f"      (b) dualpipev vs sequential, tiny-moe, 512 tokens per step ({backend}): 4 ranks "
      f"PP2xDP2xEP2 dualpipev {a:.2f} ms/step ({how}), "
      f"one process pp=1 with 8 micro-batches {b:.2f} ms/step: ratio {a / b:.2f} "
      f"(target <= 1: {'met' if a <= b else 'NOT met'}; reported, not failed)")
PY
  ok "(b) dualpipev against sequential measured (figures above)"
}

# ---- (b) FP8: the same model in bf16 and under each piper.fp8 recipe ------------------------
# make_fp8 RECIPE PATH [BASE]: BASE (tiny-moe) as a bf16 model with piper.fp8 RECIPE (none:
# without the key: the bf16 reference)
make_fp8() {
  python3 - "$1" "$2" "${3:-models/tiny-moe.json}" << 'PY'
import json, sys
m = json.load(open(sys.argv[3]))
m["piper"]["dtype"] = "bf16"
m["piper"].pop("fp8", None)
if sys.argv[1] != "none":
    m["piper"]["fp8"] = sys.argv[1]
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
}
# compare_fp8 REF RUN STEPS: every step's loss within 0.25% of the bf16 run's (DeepSeek-V3's
# published bound: "the relative error of our FP8-trained model's loss remains consistently
# below 0.25% compared with the BF16 baseline"), and not the same bits (FP8 changed the
# arithmetic: the check could not pass on bf16 GEMMs by accident)
compare_fp8() {
  python3 - "$1/metrics.json" "$2/metrics.json" "$3" << 'PY'
import json, sys
a = json.load(open(sys.argv[1]))["losses"]
b = json.load(open(sys.argv[2]))["losses"]
assert len(a) == len(b) == int(sys.argv[3]), (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b))
same = a == b
print(f"worst step {worst:.2e} (tol 2.5e-3) over {len(a)} steps; bf16 {a[0]:.4f} -> {a[-1]:.4f}, "
      f"fp8 {b[0]:.4f} -> {b[-1]:.4f}{'; the same bits as bf16: FP8 did not run' if same else ''}")
sys.exit(0 if worst <= 2.5e-3 and not same else 1)
PY
}
FP8_STEPS=100
[ "$EMU" = 1 ] && FP8_STEPS=6
check_fp8_training() {
  local ref=$OUT/tiny-moe-bf16.json r line res
  make_fp8 none "$ref" && make_fp8 tensorwise "$OUT/tiny-moe-tensorwise.json" &&
    make_fp8 blockwise "$OUT/tiny-moe-blockwise.json" || { fail "(b) FP8: could not write the models"; return; }
  local args=(--layout pp=1 --iters "$FP8_STEPS" --warmup 0 --seed 7)
  if [ "$DRY" = 1 ]; then
    # the host backend has no FP8 GEMMs: refused in one line naming the key, exit 2
    run fp8-host $EXEC --model "$OUT/tiny-moe-tensorwise.json" "${args[@]}" --backend host \
      --out "$OUT/fp8-host"
    if [ $? = 2 ] && [ "$(grep -c 'piper.fp8.*has no FP8 GEMMs' "$OUT/fp8-host.log")" = 1 ]; then
      ok "(b) FP8 (dry run): the host backend refuses piper.fp8 in one line, exit 2"
    else
      fail "(b) FP8 (dry run): the host backend did not refuse piper.fp8: $(tail -2 "$OUT/fp8-host.log")"
    fi
    return
  fi
  in_budget "(b) FP8 loss tracking" || return
  if ! run moe-bf16 $EXEC --model "$ref" "${args[@]}" --backend cuda --out "$OUT/moe-bf16"; then
    fail "(b) FP8: the bf16 reference run: $(tail -3 "$OUT/moe-bf16.log")"
    return
  fi
  for r in tensorwise blockwise; do
    in_budget "(b) FP8 $r" || return
    res=
    if run "moe-fp8-$r" $EXEC --model "$OUT/tiny-moe-$r.json" "${args[@]}" --backend cuda \
      --out "$OUT/moe-fp8-$r" && res=$(compare_fp8 "$OUT/moe-bf16" "$OUT/moe-fp8-$r" "$FP8_STEPS") &&
      line=$(grep -o 'FP8 ([a-z]*): [1-9][0-9]* GEMMs in e4m3, [0-9]*' "$OUT/moe-fp8-$r.log"); then
      ok "(b) tiny-moe FP8 $r against bf16: $res; $line in bf16"
    else
      fail "(b) tiny-moe FP8 $r against bf16: ${res:-$(tail -3 "$OUT/moe-fp8-$r.log")}"
    fi
  done
}

# ---- (c) llama3-8b-shaped layers, reduced depth --------------------------------------------
LLAMA=$OUT/llama3-8b-2l.json
llama=(--model "$LLAMA" --layout pp=1 --iters 5 --warmup 2 --seed 7)
make_llama() { # [LAYERS PATH]: the reduced model, 2 layers in $LLAMA unless told
  python3 - "${2:-$LLAMA}" "${1:-2}" << 'PY'
import json, sys
m = json.load(open("models/llama3-8b.json"))
m["num_hidden_layers"] = int(sys.argv[2])
m["piper"]["pp_regions"] = 1
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
}
# figures RUN_DIR PEAK_TFLOPS LABEL: throughput, MFU and executor overhead of a run (rank 0)
figures() {
  local out
  out=$(python3 - "$1" "$2" "$3" << 'PY'
import json, sys
d, peak, label = sys.argv[1], float(sys.argv[2]), sys.argv[3]
m = json.load(open(f"{d}/metrics.json"))
t = m["iteration_time_s"]
flops = m["model_flops_per_iteration"]
mfu = flops / t / (peak * 1e12) if peak else float("nan")
# executor overhead: step time against the time some instruction runs on the GPU (the union of
# the traced instructions' intervals of the last measured step, rank 0)
tr = json.load(open(f"{d}/trace.json"))["traceEvents"]
xs = [e for e in tr if e.get("ph") == "X" and e.get("pid", 0) == 0]
last = max(e.get("args", {}).get("step", 0) for e in xs) if xs else 0
iv = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("args", {}).get("step", 0) == last)
busy, end = 0.0, -1e30
for a, b in iv:
    if b <= end:
        continue
    busy += b - max(a, end)
    end = b
span = (iv[-1][1] - iv[0][0]) if iv else 0
over = 1 - busy / span if span else float("nan")
print(f"      {label}, seq {m['seq_len']}: {m['throughput_tokens_per_s']:.0f} tokens/s, "
      f"step {t*1e3:.1f} ms, MFU {mfu*100:.1f}% (target >= 60%: {'met' if mfu >= 0.6 else 'NOT met'}), "
      f"executor overhead {over*100:.2f}% of the step (target <= 2%: {'met' if over <= 0.02 else 'NOT met'}), "
      f"peak memory {m['peak_memory_bytes_max']/2**30:.1f} GiB")
PY
  ) || return 1
  say "$out"
}
check_llama() {
  make_llama || { fail "(c) could not write $LLAMA"; return; }
  if [ "$EMU" = 1 ]; then
    say "skip: (c) llama3-8b-shaped layers: the emulation runs kernels at a CPU thread's speed"
    return
  fi
  if [ "$DRY" = 1 ]; then
    # the plan compiles and simulates (the GPU's run needs the GPU)
    if timeout 60 bin/piper-sim --model "$LLAMA" --layout pp=1 --profile profiles/h200.json \
      --out "$OUT/sim-llama-dry" --force > "$OUT/sim-llama-dry.log" 2>&1; then
      ok "(c) the reduced llama model compiles and simulates (dry run)"
    else
      fail "(c) the reduced llama model: $(tail -3 "$OUT/sim-llama-dry.log")"
    fi
    # the figures' script, on the host run of (b) (peak 1 TFLOP/s: only that it runs)
    if [ -f "$OUT/moe1-host/metrics.json" ] &&
      figures "$OUT/moe1-host" 1 "(c) dry run: tiny-moe on the host"; then
      ok "(c) the figures' script reads a run directory (dry run)"
    else
      fail "(c) the figures' script failed on $OUT/moe1-host"
    fi
    return
  fi
  in_budget "(c) llama3-8b-shaped run" || return
  if run llama-cuda $EXEC "${llama[@]}" --backend cuda --out "$OUT/llama-cuda"; then
    if figures "$OUT/llama-cuda" "$peak" "(c) llama3-8b shape, 2 layers"; then
      ok "(c) llama3-8b-shaped run completed (figures above; targets reported, not failed)"
    else
      fail "(c) no figures from $OUT/llama-cuda"
    fi
    grep -h "arena\|plan tensors\|host thread" "$OUT/llama-cuda.log" | sed 's/^/      /' |
      tee -a "$REPORT"
  else
    fail "(c) llama3-8b-shaped run: $(tail -3 "$OUT/llama-cuda.log")"
  fi
  # deeper: the LM head (a third of the 2-layer step) and the optimizer weigh less, as in the
  # full model's step
  in_budget "(c) llama3-8b shape, 8 layers" || return
  local deep=$OUT/llama3-8b-8l.json
  if make_llama 8 "$deep" && run llama8-cuda $EXEC --model "$deep" --layout pp=1 --iters 3 \
    --warmup 1 --seed 7 --backend cuda --out "$OUT/llama8-cuda" &&
    figures "$OUT/llama8-cuda" "$peak" "(c) llama3-8b shape, 8 layers"; then
    ok "(c) llama3-8b-shaped run, 8 layers, completed (figures above; reported, not failed)"
  else
    fail "(c) llama3-8b shape, 8 layers: $(tail -3 "$OUT/llama8-cuda.log")"
  fi
  check_llama_fp8
  # the kernels the layers' time is mostly in, alone: cuBLASLt's GEMMs at the layers' shapes
  # (and what the backend's choices cost), the FP8 GEMMs as the recipes run them (with and
  # without their quantisation; checked against the host at the 1024 shape), and the
  # attention cores (cuDNN's where built, the own fused kernel) at sequence 4096
  local b
  for b in bench_gemm bench_fp8 bench_attention; do
    in_budget "(c) $b" || return
    if timeout 90 "build/gpu/$b" > "$OUT/$b.txt" 2>&1; then
      ok "(c) build/gpu/$b:"
      sed 's/^/      /' "$OUT/$b.txt" | tee -a "$REPORT"
    else
      fail "(c) build/gpu/$b: $(tail -2 "$OUT/$b.txt")"
    fi
  done
}

# The 2-layer step under each FP8 recipe (short: 3 steps after 1 warm-up): MFU against the
# dense bf16 peak (the model's FLOPs, as the bf16 run) and the speed-up over the bf16 step
# (the issue's target: >= 1.3x; reported, not failed)
check_llama_fp8() {
  local r bf16_ms fp8_ms
  bf16_ms=$(step_ms "$OUT/llama-cuda") || { say "      (c) FP8 steps: no bf16 step time to compare"; return; }
  for r in tensorwise blockwise; do
    in_budget "(c) llama3-8b shape, 2 layers, FP8 $r" || return
    if make_fp8 "$r" "$OUT/llama3-8b-2l-$r.json" "$LLAMA" &&
      run "llama-fp8-$r" $EXEC --model "$OUT/llama3-8b-2l-$r.json" --layout pp=1 --iters 3 \
        --warmup 1 --seed 7 --backend cuda --out "$OUT/llama-fp8-$r" &&
      figures "$OUT/llama-fp8-$r" "$peak" "(c) llama3-8b shape, 2 layers, FP8 $r" &&
      fp8_ms=$(step_ms "$OUT/llama-fp8-$r"); then
      say "      (c) FP8 $r step $fp8_ms ms against bf16 $bf16_ms ms: $(awk -v a="$bf16_ms" -v b="$fp8_ms" \
        'BEGIN { r = a / b; printf "%.2fx (target >= 1.3x: %s; reported, not failed)", r, (r >= 1.3 ? "met" : "NOT met") }')"
      grep -h 'FP8 (' "$OUT/llama-fp8-$r.log" | sed 's/^/      /' | tee -a "$REPORT"
      ok "(c) llama3-8b shape, 2 layers, FP8 $r (figures above)"
    else
      fail "(c) llama3-8b shape, 2 layers, FP8 $r: $(tail -3 "$OUT/llama-fp8-$r.log" 2> /dev/null)"
    fi
  done
}

# ---- (d) profile the GPU, then simulate -> execute -> compare ------------------------------
profile_gpu() {
  PROFILE=$OUT/profile-cuda.json
  local prof=("$PROF" --model "models/tiny-moe.json,$LLAMA" --backend cuda --repeats 7
    -o "$PROFILE")
  # emulated: tiny-moe only, few repeats (the code path is checked, not the figures)
  [ "$EMU" = 1 ] && prof=("$PROF" --model models/tiny-moe.json --backend cuda --quick -o "$PROFILE")
  if [ "$DRY" = 1 ]; then
    # the same command line is accepted, and without a GPU ends with the CUDA error (exit 1)
    "${prof[@]}" > "$OUT/prof.log" 2>&1
    local rc=$?
    if [ "$rc" = 1 ] && grep -q 'piper-prof: error: .*cuda' "$OUT/prof.log"; then
      ok "(d) piper-prof --backend cuda: arguments accepted; no GPU: $(tail -1 "$OUT/prof.log")"
    elif [ "$rc" = 0 ]; then
      ok "(d) piper-prof --backend cuda ran (a GPU is here after all)"
    else
      fail "(d) piper-prof --backend cuda: exit $rc: $(tail -1 "$OUT/prof.log")"
    fi
    # the MLP figure's script, on the host's bundled profile (peak 1 TFLOP/s: only that it runs)
    mlp_mfu profiles/host-cpu.json 1 > /dev/null ||
      fail "(d) the MLP MFU script failed on profiles/host-cpu.json"
    PROFILE=profiles/h200.json
    say "      (d) dry run: the loop uses $PROFILE"
    return
  fi
  in_budget "(d) piper-prof --backend cuda" || { PROFILE=profiles/h200.json; return; }
  if timeout 150 "${prof[@]}" > "$OUT/prof.log" 2>&1; then
    ok "(d) piper-prof --backend cuda wrote $PROFILE ($(grep -c '"op"' "$PROFILE") entries)"
    # the simulator models the host backend's loop only where the profile says "loop"
    grep -Eq '"executor":[[:space:]]*"enqueue"' "$PROFILE" ||
      fail "(d) $PROFILE does not say its host thread only enqueues (host.executor)"
    [ "$EMU" = 1 ] && return
    op_table "$OUT/prof.log"
    local mfu
    if mfu=$(mlp_mfu "$PROFILE" "$peak"); then
      say "$mfu"
    else
      fail "(d) no MLP figure from $PROFILE"
    fi
  else
    fail "(d) piper-prof --backend cuda: $(tail -1 "$OUT/prof.log")"
    PROFILE=profiles/h200.json
    say "      (d) the loop below uses the bundled $PROFILE instead"
  fi
}
# op_table LOG: the llama layers' lines of piper-prof's per-op table (F / BI / BW / B per op
# kind at the llama shapes), where a step's time goes
op_table() {
  say "      (d) piper-prof per-op times, llama3-8b shape (2 layers: attention, mlp, 2 rmsnorm, 2"
  say "          residual_add per layer; one embedding and lm_head_loss), bf16 GEMMs:"
  sed -n '/kernels of llama3-8b-2l/,$p' "$1" | grep '^piper-prof:   ' |
    sed 's/^piper-prof:   /          /' | tee -a "$REPORT"
}
# mlp_mfu PROFILE PEAK_TFLOPS: the largest MLP op's MFU alone, from the profile's measured
# entries (SwiGLU: 3 GEMMs of 2 T C F FLOPs each in F; BI and BW 3 each, so B 12 T C F)
mlp_mfu() {
  python3 - "$1" "$2" << 'PY'
import json, sys
p, peak = json.load(open(sys.argv[1])), float(sys.argv[2])
mlp = [e for e in p.get("measured", []) if e["op"] == "mlp" and e["ms"] > 0]
if not mlp:
    sys.exit("no mlp entry in " + sys.argv[1])
big = max(e["shape"][0] * e["shape"][1] * e["shape"][2] for e in mlp)
T, C, F = next(e["shape"] for e in mlp if e["shape"][0] * e["shape"][1] * e["shape"][2] == big)
line = []
for e in mlp:
    if e["shape"][:3] != [T, C, F] or e["pass"] not in ("F", "B"):
        continue
    flops = (6 if e["pass"] == "F" else 12) * T * C * F
    rate = flops / (e["ms"] * 1e-3) / 1e12
    mfu = f", MFU {rate / peak * 100:.1f}%" if peak > 0 else ""
    line.append(f"{e['pass']} {e['ms']:.3f} ms, {rate:.3g} TFLOP/s{mfu}")
print(f"      (d) MLP op alone, T {T} C {C} F {F} (F: 6 T C F FLOPs, B: 12 T C F): "
      + "; ".join(line) + f" (target >= 60% of {peak:g} TFLOP/s; reported, not failed)")
# a whole decoder layer at the same T and C: attention, MLP, 2 RMSNorms, 2 residual adds, F + B
# against model FLOPs (3x the forward's: projections 2 T C (2 HD + 2 KD), causal core
# 2 S T HD per sequence, MLP 6 T C F), the layers' share of a deep model's step
def ms(op, pas, pred):
    return next((e["ms"] for e in p["measured"] if e["op"] == op and e["pass"] == pas
                 and pred(e["shape"])), None)
att = next((e["shape"] for e in p["measured"] if e["op"] == "attention" and e["shape"][5] == C
            and e["shape"][0] * e["shape"][1] == T), None)
if att:
    Bt, S, H, KVH, D, _ = att
    HD, KD = H * D, KVH * D
    fwd = 2 * T * C * (2 * HD + 2 * KD) + 2 * Bt * S * S * HD + 6 * T * C * F
    t = 0.0
    for op, n, pred in (("attention", 1, lambda s: s == att), ("mlp", 1, lambda s: s[:3] == [T, C, F]),
                        ("rmsnorm", 2, lambda s: s[:2] == [T, C]),
                        ("residual_add", 2, lambda s: s[:2] == [T, C])):
        for pas in ("F", "B"):
            x = ms(op, pas, pred)
            t = float("nan") if x is None else t + n * x
    rate = 3 * fwd / (t * 1e-3) / 1e12
    mfu = f", MFU {rate / peak * 100:.1f}%" if peak > 0 else ""
    print(f"      (d) decoder layer (attention, MLP, 2 RMSNorm, 2 residual adds), F + B: {t:.3f} ms, "
          f"{rate:.3g} TFLOP/s{mfu} (model FLOPs: 3x the forward's)")
PY
}
# loop NAME EXEC_DIR FRONT-END-ARGS...: simulate the plan the run EXEC_DIR executed, compare
loop() {
  local name=$1 ran=$2
  shift 2
  in_budget "(d) loop $name" || return
  [ -f "$ran/metrics.json" ] || { fail "(d) loop $name: no run in $ran to compare with"; return; }
  if ! timeout 60 "$TOOLS/piper-sim" "$@" --profile "$PROFILE" --out "$OUT/sim-$name" --force \
    > "$OUT/sim-$name.log" 2>&1; then
    fail "(d) loop $name: piper-sim: $(tail -3 "$OUT/sim-$name.log")"
    return
  fi
  if "$TOOLS/piper-compare" "$OUT/sim-$name" "$ran" --json "$OUT/compare-$name.json" \
    > "$OUT/compare-$name.txt" 2>&1; then
    ok "(d) loop $name: simulate -> execute -> compare ($OUT/compare-$name.txt)"
    grep -m2 -i 'iteration\|peak' "$OUT/compare-$name.txt" | sed 's/^/      /' | tee -a "$REPORT"
  else
    fail "(d) loop $name: piper-compare: $(tail -3 "$OUT/compare-$name.txt")"
  fi
}
check_loop() {
  profile_gpu
  local moe=(--model models/tiny-moe.json --layout pp=1)
  if in_budget "(d) tiny-moe run for the loop"; then
    run loop-moe $EXEC "${moe[@]}" --seed 7 --iters 10 --warmup 2 --backend "$BACKEND" \
      --out "$OUT/loop-moe" || fail "(d) tiny-moe run: $(tail -3 "$OUT/loop-moe.log")"
  fi
  loop moe "$OUT/loop-moe" "${moe[@]}"
  if [ "$DRY" = 0 ] && [ "$EMU" = 0 ]; then
    loop llama "$OUT/llama-cuda" --model "$LLAMA" --layout pp=1
  fi
}

# ---- (e) the equivalence suite's multi-rank plans, ranks sharing the GPU ------------------
# Each plan of tiny-moe (an fp32 model: fp32 GEMMs) on the cuda backend against the host
# backend's run of the same plan, 10 steps, every loss within 1e-4 relative (the one-GPU run
# of (b) agrees to 1e-7: only summation orders differ). Exercises what the one-device runs do
# not: ZeRO's sharded stores and gathers, every schedule's point-to-point order, the
# collectives through host-staged MPI, recomputation's reruns.
BS=directives/base-schedules
PLANS=(
  "dp2|2|--directives $BS/dp2.json --mbs 4"
  "pp2-dp2-ep2-1f1b|4|--base-schedule $BS/pp2_dp2_ep2.json --schedule 1f1b --ranks 2 --mbs 4"
  "zero1|4|--base-schedule $BS/pp2_dp2_ep2_zero1.json --schedule 1f1b --ranks 2 --mbs 4"
  "zero3|4|--base-schedule $BS/pp2_dp2_ep2_zero3.json --schedule 1f1b --ranks 2 --mbs 4"
  "zb-h1-pp2|2|--layout pp=2 --schedule zerobubble --mbs 8"
  "interleaved-pp2x2|2|--pp-regions 4 --layout pp=2,interleave=2 --schedule interleaved_1f1b --mbs 4"
  "dualpipe-pp4|4|--pp-regions 4 --directives $BS/pp4.json --schedule dualpipe --mbs 8"
  "dualpipe-zero1|4|--layout pp=2,dp=2,zero=1 --schedule dualpipe --mbs 4"
  "uneven-pp2|2|--layout pp=2,stage-layers=1+3 --schedule 1f1b --mbs 8"
  "interleaved-m5|2|--layout pp=2,interleave=2 --schedule interleaved_1f1b --mbs 5 --microbatch-group 3"
  "recompute-full-pp2-dp2-ep2|4|--layout pp=2,dp=2,ep=2,recompute=full --schedule 1f1b --mbs 4"
  "recompute-uniform1-pp2|2|--layout pp=2,recompute=full:uniform:1 --schedule 1f1b --mbs 4"
  "recompute-modules-pp2|2|--layout pp=2,recompute=selective:core_attn+layernorm+moe:uniform:1 --schedule 1f1b --mbs 4"
  "pp2-tp2-sp|4|--layout pp=2,tp=2,sp --schedule 1f1b --mbs 4"
  "dp2-ep2-tp2-sp|4|--layout pp=1,dp=2,ep=2,tp=2,sp --mbs 4"
  "ep2-in-dp4|4|--layout dp=4,ep=2 --mbs 2"
  "ep4-over-tp2-dp2-etp1-zero1|4|--layout tp=2,dp=2,ep=4,etp=1,sp,capacity=4,zero=1 --mbs 4"
)
# same_run A B RTOL: equal step counts, every loss within RTOL relative, and the final
# parameters (--dump-params: A.params, B.params) within RTOL of the largest one. A fault that
# moves the loss little still fails: one gradient element left out of a reduction moved the
# loss 1e-6 but the parameters 1.5e-3, against 6e-6 from summation order alone (emulated).
same_run() {
  python3 - "$1" "$2" "$3" << 'PY'
import array, json, sys
a = json.load(open(sys.argv[1] + "/metrics.json"))["losses"]
b = json.load(open(sys.argv[2] + "/metrics.json"))["losses"]
rtol = float(sys.argv[3])
worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b)) if a else 1.0
pa, pb = array.array("f"), array.array("f")
pa.frombytes(open(sys.argv[1] + ".params", "rb").read())
pb.frombytes(open(sys.argv[2] + ".params", "rb").read())
big = max((abs(x) for x in pa), default=0.0) or 1.0
pw = max((abs(x - y) for x, y in zip(pa, pb)), default=1.0) / big if len(pa) == len(pb) else 1.0
print(f"{len(b)} steps, worst loss {worst:.1e}, parameters {pw:.1e} of the largest")
sys.exit(0 if len(a) == len(b) > 0 and worst <= rtol and pw <= rtol else 1)
PY
}
check_plans() {
  local spec name np args r
  for spec in "${PLANS[@]}"; do
    IFS='|' read -r name np args <<< "$spec"
    in_budget "(e) $name" || return
    # shellcheck disable=SC2086,SC2206 # args is a word list
    local cmd=(mpirun --oversubscribe -np "$np" "$EXEC" --model models/tiny-moe.json $args
      --iters $((STEPS / 2)) --warmup 0 --seed 7 --no-charts)
    if ! run "eq-$name-host" "${cmd[@]}" --backend host --out "$OUT/eq-$name-host" \
      --dump-params "$OUT/eq-$name-host.params"; then
      fail "(e) $name: the host run failed: $(tail -2 "$OUT/eq-$name-host.log")"
      continue
    fi
    local other=host where="sharing the GPU"
    [ "$DRY" = 0 ] && other=cuda
    # emulated: a GPU per rank, so the plan's communicators are NCCL's ((b) took host staging),
    # streams apart with jitter
    [ "$EMU" = 1 ] && where="one emulated GPU each (NCCL, streams apart)"
    if [ "$DRY" = 0 ] && ! PIPER_EMU_GPUS=$np PIPER_EMU_ASYNC=$EMU PIPER_EMU_JITTER_US=20 \
      run "eq-$name-cuda" "${cmd[@]}" --backend cuda --out "$OUT/eq-$name-cuda" \
      --dump-params "$OUT/eq-$name-cuda.params"; then
      fail "(e) $name, $np ranks $where: $(tail -2 "$OUT/eq-$name-cuda.log")"
      continue
    fi
    if r=$(same_run "$OUT/eq-$name-host" "$OUT/eq-$name-$other" 1e-4); then
      ok "(e) $name, $np ranks$([ "$DRY" = 0 ] && echo " $where = host backend" ||
        echo ': dry run, the host run against itself'): $r"
    else
      fail "(e) $name: the run differs from the host backend's: $r"
    fi
  done
}

# ---- (c) the PyTorch peer: the same 2-layer model trained by PyTorch on this GPU ------------
# peer_table: piper-exec's 2-layer run (c) beside PyTorch's modes, tokens/s and MFU (both from
# the model FLOPs piper-exec counts per token, so the two MFUs are comparable)
peer_table() {
  python3 - "$OUT/llama-cuda/metrics.json" "$OUT/peer.json" "${peak:-0}" << 'PY' | tee -a "$REPORT"
import json, sys
peak = float(sys.argv[3])
try:
    m = json.load(open(sys.argv[1]))
    piper, per_token = m["throughput_tokens_per_s"], m["model_flops_per_iteration"] / (m["throughput_tokens_per_s"] * m["iteration_time_s"])
except (OSError, KeyError, ValueError, ZeroDivisionError):
    piper, per_token = None, None
peer = json.load(open(sys.argv[2])).get("modes", {})
def mfu(tps):
    return f"{tps * per_token / (peak * 1e12) * 100:.1f}%" if per_token and peak else "-"
rows = [("piper-exec (cuda)", piper)] + [(f"pytorch {k}", v.get("tokens_per_s")) for k, v in peer.items()]
for name, tps in rows:
    print(f"      {name:<22} {'%.0f tokens/s' % tps if tps else 'not run':>18}  MFU {mfu(tps) if tps else '-'}")
best = max((v.get("tokens_per_s") or 0 for v in peer.values()), default=0)
if piper and best:
    r = piper / best
    print(f"      piper-exec / best PyTorch mode: {r:.2f}x (target >= 1.0: {'met' if r >= 1 else 'NOT met'}; reported, not failed)")
PY
}
check_peer() {
  if [ "$EMU" = 1 ]; then
    say "skip: (c) PyTorch peer: the emulation has no GPU for PyTorch"
    return
  fi
  local args=(--model "$LLAMA" --steps 5 --warmup 2 --json "$OUT/peer.json")
  # dry run: the script on a CPU-sized model where PyTorch is installed, one line where not
  [ "$DRY" = 1 ] && args=(--model "$LLAMA" --smoke --device cpu --steps 2 --warmup 1 --modes eager
    --json "$OUT/peer.json")
  in_budget "(c) PyTorch peer" || return
  if timeout 240 python3 tools/gpu-peer.py "${args[@]}" > "$OUT/peer.log" 2>&1; then
    sed 's/^/      /' "$OUT/peer.log" | tee -a "$REPORT"
    [ "$DRY" = 0 ] && peer_table
    ok "(c) PyTorch peer (tools/gpu-peer.py; figures above, reported, not failed)"
  else
    fail "(c) PyTorch peer: $(tail -2 "$OUT/peer.log")"
  fi
}

build
check_kernels
check_training
check_fp8_training
check_dualpipev_speed
check_llama
check_peer
check_loop
check_plans
say "gpu-check: $fails check(s) failed, $(($(date +%s) - t_start)) s"
[ "$fails" -eq 0 ]
