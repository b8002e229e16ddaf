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
  python3 - "$T/$1" "$T/$2" <<'EOF' && ok || bad "$2 differs from one device"
import array, json, math, sys
a, b = sys.argv[1], sys.argv[2]
la = json.load(open(a + "/metrics.json"))["losses"]
lb = json.load(open(b + "/metrics.json"))["losses"]
assert len(la) == len(lb) == 3, (la, lb)
for x, y in zip(la, lb):
    assert abs(x - y) <= 1e-5 * abs(x), ("loss", la, lb)
pa, pb = array.array("f"), array.array("f")
pa.frombytes(open(a + ".params", "rb").read())
pb.frombytes(open(b + ".params", "rb").read())
assert len(pa) == len(pb) > 0
num = sum((x - y) ** 2 for x, y in zip(pa, pb))
den = sum(x * x for x in pa)
assert math.sqrt(num / den) <= 1e-4, ("parameter norm", math.sqrt(num / den))
worst = max(abs(x - y) - 1e-4 * abs(x) for x, y in zip(pa, pb))
assert worst <= 1e-5, ("parameter element", worst)
EOF
}
