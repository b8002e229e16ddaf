#!/usr/bin/env bash
# piper-exec --backend cuda on a machine without a usable GPU (CI, the development machines):
# where the backend is built it is listed and exits 1 with one line naming the CUDA error,
# alone and under mpirun; where it is not built it is not listed and --backend cuda says so.
# On a machine with a GPU the run may succeed: then the failure checks are skipped (the GPU
# checks are tools/gpu-check.sh). Run from the repository root.
set -u
BIN=${PIPER_BIN:-bin}
EXEC="$BIN/piper-exec"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; passes=$((passes + 1)); }

[ -x "$EXEC" ] || { echo "FAIL: $EXEC not built"; exit 1; }

# one line on stderr, "PROGRAM: error: ..." naming a CUDA error, exit status 1
expect_cuda_error() {
  local what=$1 rc=$2 err=$3 prog=${4:-piper-exec}
  if [ "$rc" -ne 1 ]; then fail "$what: exit $rc, want 1: $(head -3 "$err")"; return; fi
  local lines
  lines=$(grep -c . "$err")
  if [ "$lines" -ne 1 ]; then fail "$what: $lines lines on stderr, want 1: $(head -5 "$err")"; return; fi
  grep -Eq "^$prog: error: .*(cuda[A-Za-z]+\\(|cudaError|no CUDA device)" "$err" \
    && ok "$what: $(cat "$err")" || fail "$what: $(cat "$err")"
}

# The cuda backend's sources that see HAVE_CUDNN also compile without it (NO_CUDNN=1), against
# the real CUDA headers, where the backend is built (the emulated build links and runs that
# configuration: tests/cli/test_cuda_emu.sh).
if "$EXEC" --list-backends | grep -q '^cuda' && [ -f exec/backend_cuda_cudnn.c ]; then
  flags=$(make -s --no-print-directory NO_CUDNN=1 print-cflags 2> /dev/null)
  if [ -z "$flags" ]; then
    echo "skip: NO_CUDNN=1 compile (make print-cflags gave nothing)"
  elif echo "$flags" | grep -q -- -DHAVE_CUDNN; then
    fail "NO_CUDNN=1 still defines HAVE_CUDNN"
  elif (for src in exec/backend_cuda_cudnn.c exec/backend_cuda_kernels.c exec/backend_cuda.c; do
    # shellcheck disable=SC2086 # flags are words
    cc $flags -fsyntax-only "$src" || exit 1
  done) 2> "$tmp/nocudnn.err"; then
    ok "the cuda backend compiles without cuDNN (NO_CUDNN=1)"
  else
    fail "NO_CUDNN=1 compile: $(head -3 "$tmp/nocudnn.err")"
  fi
fi

run=(--model models/tiny-dense.json --layout pp=1 --backend cuda --iters 1 --warmup 0)
if "$EXEC" --list-backends | grep -q '^cuda'; then
  ok "cuda listed"
  if "$EXEC" "${run[@]}" --out "$tmp/one" > "$tmp/out" 2> "$tmp/err"; then
    echo "skip: a usable GPU is here (tools/gpu-check.sh checks it)"
  else
    expect_cuda_error "one process" $? "$tmp/err"
    if command -v mpirun >/dev/null; then
      mpirun --oversubscribe -np 2 "$EXEC" --model models/tiny-dense.json --layout dp=2 \
        --backend cuda --iters 1 --warmup 0 --out "$tmp/two" > "$tmp/out2" 2> "$tmp/err2"
      rc=$?
      # each rank says its one line (mpirun adds its own report of the exit status)
      grep '^piper-exec' "$tmp/err2" > "$tmp/err2p"
      n=$(grep -c . "$tmp/err2p")
      if [ "$rc" -ne 0 ] && [ "$n" -ge 1 ] && [ "$n" -le 2 ] &&
        ! grep -Evq '^piper-exec: error: rank [01] .*cuda[A-Za-z]+\(' "$tmp/err2p"; then
        ok "mpirun -np 2: $(head -1 "$tmp/err2p")"
      else
        fail "mpirun -np 2: exit $rc: $(head -5 "$tmp/err2")"
      fi
    fi
  fi
  # piper-prof --backend cuda: the same one line, no profile written
  PROF="$BIN/piper-prof"
  if "$PROF" --backend cuda --model models/tiny-moe.json --quick --quiet -o "$tmp/gpu.json" \
    > "$tmp/pout" 2> "$tmp/perr"; then
    echo "skip: piper-prof --backend cuda ran (a usable GPU is here)"
  else
    expect_cuda_error "piper-prof --backend cuda" $? "$tmp/perr" piper-prof
    [ -e "$tmp/gpu.json" ] && fail "piper-prof --backend cuda wrote a profile after failing"
  fi
else
  ok "cuda not listed (not built)"
  "$BIN/piper-prof" --backend cuda --model models/tiny-moe.json -o "$tmp/gpu.json" \
    > "$tmp/pout" 2> "$tmp/perr"
  rc=$?
  [ "$rc" -eq 2 ] && grep -q 'not built in' "$tmp/perr" \
    && ok "piper-prof --backend cuda refused: $(cat "$tmp/perr")" || fail "piper-prof: exit $rc: $(cat "$tmp/perr")"
  "$EXEC" "${run[@]}" --out "$tmp/one" > "$tmp/out" 2> "$tmp/err"
  rc=$?
  [ "$rc" -ne 0 ] && grep -q '"cuda" is not built in' "$tmp/err" \
    && ok "--backend cuda refused: $(cat "$tmp/err")" || fail "exit $rc: $(cat "$tmp/err")"
fi

# tools/gpu-check.sh cannot run here, but its host-side steps can: --dry-run runs them (host
# reference runs, loss comparison, the reduced llama model, simulate -> compare) and must pass
if [ "$BIN" = bin ] && command -v python3 > /dev/null && command -v mpirun > /dev/null; then
  if OUT="$tmp/gpu-check" GPU_CHECK_SKIP_BUILD=1 tools/gpu-check.sh --dry-run > "$tmp/gc.out" 2>&1 &&
    grep -q '^gpu-check: 0 check(s) failed' "$tmp/gc.out"; then
    ok "tools/gpu-check.sh --dry-run: $(grep -c '^ok:' "$tmp/gc.out") steps ok"
  else
    fail "tools/gpu-check.sh --dry-run: $(grep -E '^FAIL|^gpu-check' "$tmp/gc.out" | head -5)"
  fi
fi

echo "test_cuda: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
