# Shared by the scripts that train a plan with mpirun and compare it with one device
# (test_exec.sh, test_layouts.sh). The caller sets T (a temporary folder), PE (piper-exec),
# MPIRUN (an array: mpirun and its options), MOE (the model `run` trains) and defines ok / bad.

# losses of a run directory, one per line, exactly as written
losses() { python3 -c "import json,sys; print('\n'.join(repr(x) for x in json.load(open(sys.argv[1]))['losses']))" "$1/metrics.json"; }

# run NAME NP ARGS...: 3 steps, global batch 8 micro-batches, losses + parameters kept
run() {
  local name=$1 np=$2; shift 2
  if timeout 300 "${MPIRUN[@]}" -np "$np" "$PE" --model $MOE "$@" --warmup 0 --iters 3 --quiet \
    --timeout 60 --out "$T/$name" --dump-params "$T/$name.params" >"$T/$name.log" 2>&1; then
    return 0
  fi
  bad "$name: $(tail -5 "$T/$name.log")"
  return 1
}

# same NAME: losses within 1e-5 (relative) and parameters within 1e-4 of the one-device run.
# Why not exact: data parallelism sums gradients over ranks, and expert parallelism runs two
# micro-batches' rows through one GEMM, so float sums round in another order (observed: losses
# equal to 1e-7, parameters 2e-7 in norm). Elementwise, a parameter whose gradient is tiny
# can move by AdamW's normalised step times that rounding: allow 1e-5 absolute (1% of one step
# at lr 1e-3) on top of 1e-4 relative.
same() { same_as ref "$1"; }
same_as() {
  python3 tests/cli/same_run.py "$T/$1" "$T/$2" 3 && ok || bad "$2 differs from one device"
}
