#!/usr/bin/env bash
# Tied embeddings split across pipeline stages (README, "LM head with tie_word_embeddings"): the
# LM head's stage keeps its own copy of the embedding matrix and the plan sums the two copies'
# gradients with an all-reduce per data-parallel position, costed by the simulator like any
# collective. Part of the equivalence suite of test_exec.sh (kept apart so that the two evolve
# independently): tiny-dense-tied in one PP region (the head reads the table itself) is the
# reference; over 2 stages, and 2 stages x 2 replicas, the losses and parameters are the one
# device's, and the head's copy ends equal to the table. Copies the plan cannot sync (both on
# one device group, as V placements put them) are refused, never trained apart.
set -u
BIN=${PIPER_BIN:-bin}
PC="$BIN/piper-compile"
PS="$BIN/piper-sim"
PE="$BIN/piper-exec"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
TIED=models/tiny-dense-tied.json

echo '[]' >"$T/one.json"
cat >"$T/pp2.json" <<'JSON'
[
  {"op": "place", "filter": {"PP": 0}, "devices": [0]},
  {"op": "place", "filter": {"PP": 1}, "devices": [1]}
]
JSON
cat >"$T/pp2_dp2.json" <<'JSON'
[
  {"op": "place", "filter": {"PP": 0}, "devices": [0, 1]},
  {"op": "place", "filter": {"PP": 1}, "devices": [2, 3]},
  {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1]},
  {"op": "replicate", "filter": {"PP": 1}, "devices": [2, 3]}
]
JSON
cat >"$T/v.json" <<'JSON'
[
  {"op": "place", "filter": {"PP": 0}, "devices": [0]},
  {"op": "place", "filter": {"PP": 1}, "devices": [0]}
]
JSON

# --- the compiler inserts the sync: one all-reduce per DP position, vocab x hidden x 4 bytes ---
if "$PC" --model $TIED --base-schedule "$T/pp2_dp2.json" --schedule 1f1b --ranks 2 --mbs 4 \
  -o "$T/plan" >/dev/null 2>"$T/err"; then
  python3 - "$T/plan/plan.json" <<'PY' && ok || bad "tied sync nodes in plan.json"
import json, sys
p = json.load(open(sys.argv[1]))
groups = [g["devices"] for g in p["groups"]]
syncs = [n for n in p["nodes"] if n["kind"] == "all_reduce" and n["segset"] is None]
assert len(syncs) == 2, syncs
assert sorted(groups[n["group"]] for n in syncs) == [[0, 2], [1, 3]], syncs
assert all(n["bytes"] == 256 * 64 * 4 and n["purpose"] == "dp" for n in syncs), syncs
PY
  "$PS" --plans "$T/plan" --profile profiles/h100-sxm.json --out "$T/sim" --no-charts >/dev/null 2>"$T/err" &&
    python3 - "$T/sim/trace.json" <<'PY' && ok || bad "the simulator does not run the tied sync: $(cat "$T/err")"
import json, sys
t = json.load(open(sys.argv[1]))
runs = [e for e in t["traceEvents"] if e.get("ph") == "X" and "all_reduce - s" in e.get("name", "")]
assert len(runs) == 4 and all(e["dur"] > 0 for e in runs), runs  # 2 syncs x 2 members
PY
else
  bad "compile pp2_dp2: $(cat "$T/err")"
fi
# one stage (tied in place) or untied: no such collective
"$PC" --model $TIED --pp-regions 1 --directives "$T/one.json" --mbs 2 -o "$T/one" >/dev/null 2>&1 &&
  python3 -c "import json,sys; assert not [n for n in json.load(open(sys.argv[1]))['nodes'] if n['kind'] == 'all_reduce']" \
    "$T/one/plan.json" && ok || bad "a one-region tied model got a sync"

# --- training: the one device's losses and parameters --------------------------------------
run() {
  local name=$1 np=$2; shift 2
  if timeout 300 mpirun --oversubscribe -np "$np" "$PE" --model $TIED "$@" --warmup 0 --iters 3 \
    --quiet --timeout 60 --out "$T/$name" --dump-params "$T/$name.params" >"$T/$name.log" 2>&1; then
    return 0
  fi
  bad "$name: $(tail -5 "$T/$name.log")"
  return 1
}
# Losses within 1e-5 relative, parameters (without the head's copy, last in model order) as
# test_exec.sh's `same` allows (the two gradients are summed in another order than one table
# accumulates them); the copy equal to the table bit for bit (same gradients, same steps).
same_tied() {
  python3 - "$T/ref" "$T/$1" <<'PY' && ok || bad "$1 differs from one device"
import array, json, math, sys
a, b = sys.argv[1], sys.argv[2]
la = json.load(open(a + "/metrics.json"))["losses"]
lb = json.load(open(b + "/metrics.json"))["losses"]
assert len(la) == len(lb) == 3 and len(set(la)) == 3, (la, lb)
for x, y in zip(la, lb):
    assert abs(x - y) <= 1e-5 * abs(x), ("loss", la, lb)
pa, pb = array.array("f"), array.array("f")
pa.frombytes(open(a + ".params", "rb").read())
pb.frombytes(open(b + ".params", "rb").read())
table = 256 * 64
assert len(pb) == len(pa) + table, (len(pa), len(pb))
assert pb[-table:] == pb[:table], "the head's copy drifted from the embedding table"
num = sum((x - y) ** 2 for x, y in zip(pa, pb))
den = sum(x * x for x in pa)
assert math.sqrt(num / den) <= 1e-4, ("parameter norm", math.sqrt(num / den))
worst = max(abs(x - y) - 1e-4 * abs(x) for x, y in zip(pa, pb))
assert worst <= 1e-5, ("parameter element", worst)
PY
}
if ! command -v mpirun >/dev/null || ! "$PE" --list-backends | grep -q "MPI"; then
  bad "mpirun or piper-exec's MPI support is missing"
elif run ref 1 --pp-regions 1 --directives "$T/one.json" --mbs 8; then
  run pp2 2 --directives "$T/pp2.json" --schedule 1f1b --ranks 2 --mbs 8 && same_tied pp2
  run pp2_dp2 4 --base-schedule "$T/pp2_dp2.json" --schedule 1f1b --ranks 2 --mbs 4 && same_tied pp2_dp2
fi

# --- copies on one device group: refused with one line, exit 2 -----------------------------
"$PE" --model $TIED --directives "$T/v.json" --mbs 2 --iters 1 --no-report --quiet >"$T/out" 2>"$T/err"
rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "tied embedding" "$T/err" && ok ||
  bad "copies on one device: exit $rc: $(cat "$T/err")"

echo "test_tied.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
