#!/usr/bin/env bash
# piper-prof as a user runs it: on tiny-dense it writes a profile that piper-sim loads and costs
# every op of the model from (no roofline fallback), with the machine, backend and date inside;
# under mpirun with 2 ranks the network section comes from fitted collectives; bad input exits
# 2 with one line "piper-prof: error: ...". Run from the repository root.
set -u
BIN=${PIPER_BIN:-bin}
PROF="$BIN/piper-prof"
SIM="$BIN/piper-sim"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; passes=$((passes + 1)); }

[ -x "$PROF" ] || { echo "FAIL: $PROF not built"; exit 1; }

"$PROF" --help | grep -q -- "--model FILE" && ok "--help" || fail "--help"
"$PROF" --version | grep -Eq '^piper-prof [0-9]+\.[0-9]+\.[0-9]+$' && ok "--version" || fail "--version"

# 1. one process: the kernels, the machine; piper-sim uses the table for every op
if "$PROF" --model models/tiny-dense.json -o "$tmp/p.json" --quick --repeats 3 2> "$tmp/err"; then
  ok "piper-prof exits 0"
else
  fail "piper-prof: $(cat "$tmp/err")"
fi
grep -q "piper-prof: .*attention" "$tmp/err" && grep -q "wrote $tmp/p.json" "$tmp/err" \
  && ok "progress on stderr" || fail "no progress: $(head -3 "$tmp/err")"
# the kernels are timed on the executor's data flow: every op of tiny-dense but the embedding
# reads its predecessor's output ([T, C] all along)
n_ops=$(python3 -c "import json; print(json.load(open('models/tiny-dense.json')).get('num_hidden_layers', 0))")
linked=$(sed -n 's/.*tiny-dense: \([0-9]*\) ops read their predecessor.*/\1/p' "$tmp/err")
[ -n "$linked" ] && [ "$linked" -ge $((6 * n_ops + 2)) ] \
  && ok "ops chained as the executor runs them ($linked)" || fail "ops chained: '${linked}'"
python3 - "$tmp/p.json" <<'EOF' && ok "profile contents" || fail "profile contents"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["sources"]
assert s["backend"] == "host" and s["date"].endswith("Z") and s["machine"]["cores"] >= 1, s
assert s["machine"]["cpu"] and "piper-prof" in s["command"], s
kinds = {(e["op"], e["pass"]) for e in j["measured"]}
for op in ("embedding", "rmsnorm", "attention", "residual_add", "mlp", "lm_head_loss"):
    for p in ("F", "BI", "BW", "B"):
        assert (op, p) in kinds, (op, p)
assert all(e["ms"] > 0 for e in j["measured"] if (e["op"], e["pass"]) not in
           {("embedding", "BI"), ("residual_add", "BW")}), j["measured"]
assert j["device"]["peak_tflops"]["fp32"] > 0 and j["device"]["memory_bandwidth_gbs"] > 0
EOF
if "$SIM" --model models/tiny-dense.json --layout pp=2 --schedule zerobubble --mbs 4 \
    --profile "$tmp/p.json" --out "$tmp/sim" --no-charts > "$tmp/sim.out" 2> "$tmp/err"; then
  ok "piper-sim loads the profile"
else
  fail "piper-sim: $(cat "$tmp/err")"
fi
grep -Eq '; 0 ops costed by roofline, [1-9][0-9]* measured' "$tmp/sim.out" \
  && ok "every op costed from the measurements" || fail "summary: $(grep simulated "$tmp/sim.out")"
# a one-process profile has no measured waits: a 2-device plan on its node is said to be
# predicted too fast, once
[ "$(grep -c 'warning: .*p.json: host measured by one process.*mpirun -np 2' "$tmp/err")" = 1 ] \
  && ok "one-process profile: warned" || fail "no warning: $(cat "$tmp/err")"

# the experts are also timed alone at every expert-parallel degree that divides them, and an
# EP plan's expert segments cost those entries: the step is shorter than with them removed
if "$PROF" --model models/tiny-moe.json -o "$tmp/pm.json" --quick --repeats 3 2> "$tmp/err" \
    && python3 - "$tmp/pm.json" "$tmp/pm-one.json" <<'EOF'; then
import json, sys
j = json.load(open(sys.argv[1]))
ep = {(e["shape"][5], e["pass"]) for e in j["measured"]
      if e["op"] == "expert_ffn" and len(e["shape"]) > 5}
E = [e["shape"][3] for e in j["measured"] if e["op"] == "expert_ffn"][0]
want = {(d, p) for d in range(2, E + 1) if E % d == 0 for p in ("F", "BI", "BW", "B")}
assert ep == want, (sorted(ep), sorted(want))
j["measured"] = [e for e in j["measured"] if e["op"] != "expert_ffn" or len(e["shape"]) <= 5]
json.dump(j, open(sys.argv[2], "w"))
EOF
  ok "experts timed at every expert-parallel degree"
else
  fail "expert-parallel entries: $(tail -3 "$tmp/err")"
fi
for v in pm pm-one; do
  "$SIM" --model models/tiny-moe.json --layout pp=2,dp=2,ep=2 --pp-regions 2 --schedule 1f1b \
    --mbs 4 --profile "$tmp/$v.json" --out "$tmp/sim-$v" --no-charts --quiet 2> "$tmp/err" \
    || fail "piper-sim with $v: $(cat "$tmp/err")"
done
python3 - "$tmp/sim-pm/metrics.json" "$tmp/sim-pm-one/metrics.json" <<'EOF' \
  && ok "piper-sim costs the experts at their expert-parallel degree" \
  || fail "expert-parallel entries not used"
import json, sys
ep, one = (json.load(open(f))["iteration_time_s"] for f in sys.argv[1:3])
assert ep < one, (ep, one)
EOF

# 2. two ranks: the network section and the collectives' fits
if command -v mpirun > /dev/null; then
  if timeout 300 mpirun --oversubscribe -np 2 "$PROF" --model models/tiny-dense.json \
      -o "$tmp/p2.json" --quick --repeats 3 > /dev/null 2> "$tmp/err"; then
    ok "piper-prof under mpirun -np 2"
  else
    fail "mpirun piper-prof: $(tail -3 "$tmp/err")"
  fi
  spin=$(sed -n 's/^#define EXEC_HOST_IDLE_SPIN_US \([0-9]*\).*/\1/p' exec/backend.h)
  python3 - "$tmp/p2.json" "$spin" <<'EOF' && ok "network fitted" || fail "network section"
import json, sys
j = json.load(open(sys.argv[1]))
c = j["sources"]["collectives"]
assert set(c) == {"p2p", "all_reduce", "reduce_scatter", "all_gather", "all_to_all"}, c
for k, f in c.items():
    assert f["bandwidth_gbs"] > 0 and f["latency_us"] >= 0 and len(f["points_bytes_us"]) >= 4, (k, f)
n = j["network"]
assert n["nvlink_bandwidth_gbs"] == c["p2p"]["link_bandwidth_gbs"] or \
    abs(n["nvlink_bandwidth_gbs"] / c["p2p"]["link_bandwidth_gbs"] - 1) < 1e-3, (n, c["p2p"])
assert 0 < n["efficiency"] <= 1 and j["sources"]["machine"]["ranks"] == 2# the fits piper-sim uses, one per operation, and the host facts
fits = j["collectives"]["intra_node"]
assert set(fits) == set(c), fits
for k, f in fits.items():
    assert set(f) == {"latency_us", "bandwidth_gbs"} and f["bandwidth_gbs"] > 0, (k, f)
    assert abs(f["bandwidth_gbs"] / c[k]["link_bandwidth_gbs"] - 1) < 1e-3, (k, f, c[k])
    assert all(len(p) == 3 and p[0] == 2 for p in c[k]["points_ranks_bytes_us"]), c[k]
h = j["host"]
# the host backend runs each rank from one loop, which the simulator models (cuda: "enqueue")
assert h["executor"] == "loop", h
assert h["cores_per_node"] >= 1 and h["instruction_overhead_us"] > 0, h
assert 0 <= h["wait_core_share"] <= 1 and h["comm_test_us"] > 0 and h["wake_latency_us"] >= 0, h
# the backend loop's spin window (exec/backend.h) and what its sleeping adds to a communication
assert h["loop_spin_us"] == int(sys.argv[2]) and h["loop_late_us"] >= 0, (h, sys.argv[2])
# MPI's eager limit, one of the sizes tried (a power of two from 256 B to 1 MiB; 1: none eager)
e = h["eager_bytes"]
assert e == 1 or (256 <= e <= 1 << 20 and e & (e - 1) == 0), h
EOF
if [ -f "$tmp/p2.json" ] && "$SIM" --model models/tiny-dense.json --layout pp=2 --schedule 1f1b \
    --mbs 4 --profile "$tmp/p2.json" --out "$tmp/sim2" --no-charts --quiet 2> "$tmp/err"; then
  ok "piper-sim loads the measured host facts and fits"
  grep -q "warning" "$tmp/err" && fail "warned with measured waits: $(cat "$tmp/err")"
else
  fail "piper-sim with the fitted profile: $(cat "$tmp/err")"
fi
# the lateness is used: a receive whose rank idles past the spin window ends loop_late_us
# later, so with a 20 us window (most 2-rank waits outlast it) the 2-rank 1F1B step is longer
# with the key than with it removed (equal only if it is 0)
if [ -f "$tmp/p2.json" ] && python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))
j["host"]["loop_spin_us"] = 20; json.dump(j, open(sys.argv[2], "w"))
del j["host"]["loop_late_us"]; json.dump(j, open(sys.argv[3], "w"))' "$tmp/p2.json" \
      "$tmp/p2-short.json" "$tmp/p2-old.json" \
    && "$SIM" --model models/tiny-dense.json --layout pp=2 --schedule 1f1b --mbs 4 \
      --profile "$tmp/p2-short.json" --out "$tmp/sim2-short" --no-charts --quiet 2> "$tmp/err" \
    && "$SIM" --model models/tiny-dense.json --layout pp=2 --schedule 1f1b --mbs 4 \
      --profile "$tmp/p2-old.json" --out "$tmp/sim2-old" --no-charts --quiet 2> "$tmp/err" \
    && python3 - "$tmp/p2.json" "$tmp/sim2-short/metrics.json" "$tmp/sim2-old/metrics.json" <<'EOF'; then
import json, sys
late = json.load(open(sys.argv[1]))["host"]["loop_late_us"]
new, old = (json.load(open(f))["iteration_time_s"] for f in sys.argv[2:4])
assert (new > old) if late > 0 else (new == old), (late, new, old)
EOF
  ok "piper-sim charges the loop's lateness"
else
  fail "loop_late_us not charged: $(cat "$tmp/err")"
fi
# 3 ranks: the waiting-share measurement's waiter is the last rank, not rank 1 (a message sent
# to the wrong rank times the waiter out and fails the run); a waiting rank burns some CPU
if timeout 300 mpirun --oversubscribe -np 3 "$PROF" --model models/tiny-dense.json \
    -o "$tmp/p3.json" --quick --repeats 3 > /dev/null 2> "$tmp/err" \
    && python3 -c 'import json, sys; h = json.load(open(sys.argv[1]))["host"]
assert 0 < h["wait_core_share"] <= 1, h' "$tmp/p3.json"; then
  ok "piper-prof under mpirun -np 3: the waiter's share measured"
else
  fail "mpirun -np 3 piper-prof: $(tail -3 "$tmp/err")"
fi
else
  fail "mpirun is missing (MPI is a dependency: tools/install-deps.sh)"
fi

# 3. bad input: exit 2, one line naming the problem
expect_bad() { # NAME SUBSTRING ARGS...
  local name=$1 want=$2; shift 2
  "$PROF" "$@" > /dev/null 2> "$tmp/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^piper-prof: error: .*$want" "$tmp/err"; then
    ok "$name"
  else
    fail "$name: rc $rc, stderr: $(cat "$tmp/err")"
  fi
}
expect_bad "no --model" "--model" -o "$tmp/x.json"
expect_bad "no -o" "-o PROFILE" --model models/tiny-dense.json
expect_bad "missing model file" "nope.json" --model "$tmp/nope.json" -o "$tmp/x.json"
echo '{"hidden_size": ' > "$tmp/bad.json"
expect_bad "malformed model" "bad.json" --model "$tmp/bad.json" -o "$tmp/x.json"
expect_bad "unknown backend" "unknown backend" --model models/tiny-dense.json --backend tpu -o "$tmp/x.json"
# --backend cuda where the cuda backend is built is a run (tests/cli/test_cuda.sh checks it)
if ! "$BIN/piper-exec" --list-backends | grep -q '^cuda'; then
  expect_bad "cuda not built" "cuda" --model models/tiny-dense.json --backend cuda -o "$tmp/x.json"
fi
expect_bad "bad --repeats" "--repeats" --model models/tiny-dense.json --repeats 0 -o "$tmp/x.json"
expect_bad "unknown option" "--frobnicate" --frobnicate
[ ! -e "$tmp/x.json" ] && ok "no profile written on bad input" || fail "a profile was written"

echo "test_prof.sh: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
