#!/usr/bin/env bash
# piper-compare as a user runs it: two simulations of one program on two synthetic profiles give
# exact ratios (costs twice as high: every time ratio is 2); a short one-process piper-exec run
# and piper-sim on profiles/host-cpu.json of the same program compare, each side named measured
# or simulated; --json parses and holds the keys; --tolerance sets the exit status both ways;
# bad input exits 2 with one line "piper-compare: error: ..." saying what is wrong. Run from the
# repository root.
set -u
BIN=${PIPER_BIN:-bin}
PC="$BIN/piper-compare"
SIM="$BIN/piper-sim"
PE="$BIN/piper-exec"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
export OPENBLAS_NUM_THREADS=1

for p in "$PC" "$SIM" "$PE"; do
  [ -x "$p" ] || { echo "FAIL: $p not built"; exit 1; }
done

"$PC" --help | grep -q -- "--tolerance X" && ok "--help" || fail "--help"
"$PC" --version | grep -Eq '^piper-compare [0-9]+\.[0-9]+\.[0-9]+$' && ok "--version" \
  || fail "--version"

# 1. two simulations of the same program: unit costs (F 1 ms, B 2 ms) and a profile with every
# cost doubled. 1F1B on 4 ranks with 8 micro-batches takes (M+R-1)(F+B) = 33 ms and 66 ms.
cat > "$tmp/double.json" <<'EOF'
{"name": "double", "kind": "synthetic",
 "synthetic": {"F_ms": 2, "B_ms": 4, "BI_ms": 2, "BW_ms": 2, "optimizer_ms": 0, "comm_ms": 0}}
EOF
simrun() { # profile out
  "$SIM" --model models/tiny-dense.json --directives directives/base-schedules/pp4.json \
    --schedule 1f1b --ranks 4 --mbs 8 --profile "$1" --out "$2" --no-charts --quiet
}
simrun profiles/unit.json "$tmp/unit" && simrun "$tmp/double.json" "$tmp/double" \
  || { echo "FAIL: piper-sim did not run"; exit 1; }
if "$PC" "$tmp/unit" "$tmp/double" --json "$tmp/ss.json" > "$tmp/out" 2> "$tmp/err"; then
  ok "sim vs sim exits 0"
else
  fail "sim vs sim exits non-zero: $(cat "$tmp/err")"
fi
[ ! -s "$tmp/err" ] && ok "nothing on stderr" || fail "stderr: $(cat "$tmp/err")"
grep -Eq '^  iteration time \(ms\) +33 +66 +2$' "$tmp/out" && ok "iteration time row 33 66 2" \
  || fail "iteration time row: $(grep 'iteration time' "$tmp/out")"
grep -Eq '^  A = .*unit: simulated \(piper-sim, profile unit' "$tmp/out" && ok "A is simulated" \
  || fail "A's line: $(grep '  A =' "$tmp/out")"
for row in "F" "B" "bubble" "exposed comm" "overlap" "peak memory" "activations" "device 3"; do
  grep -q "^ *$row" "$tmp/out" && ok "row $row" || fail "no row $row"
done
python3 - "$tmp/ss.json" <<'EOF' && ok "--json: keys and exact ratios" || fail "--json sim vs sim"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("a", "b", "model", "n_devices", "global", "devices", "instructions", "tolerance",
          "within_tolerance", "iteration_time_ratio"):
    assert k in j, k
assert j["a"]["role"] == "simulated" and j["b"]["role"] == "simulated", (j["a"], j["b"])
assert j["a"]["kind"] == "sim" and j["b"]["profile"] == "double"
assert j["model"] == "tiny-dense" and j["n_devices"] == 4 and len(j["devices"]) == 4
g = j["global"]
for k in ("iteration_time_s", "throughput_tokens_per_s", "mfu", "bubble_fraction_mean",
          "exposed_comm_s_mean", "overlap_fraction_mean", "peak_memory_bytes_max"):
    assert set(g[k]) == {"a", "b", "ratio"}, k
# synthetic costs are whole milliseconds: the times are exact up to the last bits
assert abs(g["iteration_time_s"]["a"] - 0.033) < 1e-12 and abs(g["iteration_time_s"]["b"] - 0.066) < 1e-12
assert abs(j["iteration_time_ratio"] - 2) < 1e-12
assert abs(g["throughput_tokens_per_s"]["ratio"] - 0.5) < 1e-12
assert g["mfu"]["a"] is None and g["mfu"]["ratio"] is None  # synthetic: no MFU
# the bubble fraction does not change when every cost doubles; memory does not change at all
assert abs(g["bubble_fraction_mean"]["ratio"] - 1) < 1e-12
assert g["peak_memory_bytes_max"]["ratio"] == 1
d = j["devices"][3]
for k in ("busy_s", "comm_s", "bubble_fraction", "exposed_comm_s", "overlap_fraction",
          "peak_memory_bytes", "memory_breakdown_bytes"):
    assert k in d, k
assert set(d["memory_breakdown_bytes"]) == {"params", "grads", "optimizer", "activations",
                                            "gathered_params", "comm"}
assert abs(d["busy_s"]["ratio"] - 2) < 1e-12
ins = {r["name"]: r for r in j["instructions"]}
assert list(ins)[:2] == ["F", "B"], list(ins)
assert abs(ins["F"]["a"] - 0.001) < 1e-12 and abs(ins["F"]["ratio"] - 2) < 1e-12
assert abs(ins["B"]["b"] - 0.004) < 1e-12 and ins["F"]["count_a"] == 32 == ins["F"]["count_b"]
assert j["tolerance"] is None and j["within_tolerance"] is None
EOF

# 2. --tolerance: B/A = 2 is within [1/2.5, 2.5] and outside [1/1.5, 1.5]; the band is symmetric,
# so the swapped order (B/A = 0.5) gives the same verdicts.
for order in "unit double" "double unit"; do
  set -- $order
  "$PC" "$tmp/$1" "$tmp/$2" --tolerance 1.5 > "$tmp/out" 2> "$tmp/err"
  rc=$?
  [ $rc -eq 0 ] && grep -q "within" "$tmp/out" && [ ! -s "$tmp/err" ] \
    && ok "$order: --tolerance 1.5 exits 0" || fail "$order: --tolerance 1.5: rc $rc $(cat "$tmp/err")"
  "$PC" "$tmp/$1" "$tmp/$2" --tolerance 0.5 --json "$tmp/tol.json" > "$tmp/out" 2> "$tmp/err"
  rc=$?
  if [ $rc -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] \
      && grep -q "^piper-compare: error: the prediction is off: iteration time B/A = .* is outside" "$tmp/err"; then
    ok "$order: --tolerance 0.5 exits 1 with one error line"
  else
    fail "$order: --tolerance 0.5: rc $rc, stderr: $(cat "$tmp/err")"
  fi
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['tolerance']==0.5 and j['within_tolerance'] is False" \
    "$tmp/tol.json" && ok "$order: --json says outside" || fail "$order: --json verdict"
done

# 3. measured against simulated: one process, a one-device program, 2 short steps
echo '[{"op": "split", "filter": {}, "dim_name": "MB", "num_microbatches": 2}]' > "$tmp/split2.json"
if "$PE" --model models/tiny-dense.json --directives "$tmp/split2.json" --iters 2 --warmup 1 \
    --quiet --out "$tmp/exec" > /dev/null 2> "$tmp/err" \
    && "$SIM" --model models/tiny-dense.json --directives "$tmp/split2.json" \
      --profile profiles/host-cpu.json --out "$tmp/sim" --no-charts --quiet 2>> "$tmp/err"; then
  ok "piper-exec and piper-sim ran"
else
  fail "piper-exec / piper-sim: $(cat "$tmp/err")"
fi
if "$PC" "$tmp/exec" "$tmp/sim" --json "$tmp/es.json" > "$tmp/out" 2> "$tmp/err"; then
  ok "exec vs sim exits 0"
else
  fail "exec vs sim exits non-zero: $(cat "$tmp/err")"
fi
grep -Eq '^  A = .*exec: measured \(piper-exec, backend host' "$tmp/out" && ok "A is measured" \
  || fail "A's line: $(grep '  A =' "$tmp/out")"
grep -Eq '^  B = .*sim: simulated \(piper-sim, profile host-cpu' "$tmp/out" && ok "B is simulated" \
  || fail "B's line: $(grep '  B =' "$tmp/out")"
"$PC" "$tmp/sim" "$tmp/exec" > "$tmp/out2" 2>&1 && grep -Eq '^  B = .*exec: measured' "$tmp/out2" \
  && ok "either order" || fail "sim vs exec: $(cat "$tmp/out2")"
python3 - "$tmp/es.json" <<'EOF' && ok "--json exec vs sim" || fail "--json exec vs sim"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["a"]["role"] == "measured" and j["a"]["kind"] == "exec" and j["a"]["backend"] == "host"
assert j["b"]["role"] == "simulated" and j["b"]["profile"] == "host-cpu"
assert j["a"]["iterations"] == 2 and j["b"]["iterations"] == 1
assert j["n_devices"] == 1 and j["a"]["program_file"] == "custom_pp1_mbs2.json"
it = j["global"]["iteration_time_s"]
assert it["a"] > 0 and it["b"] > 0 and abs(it["ratio"] - it["b"] / it["a"]) < 1e-12 * it["ratio"]
names = [r["name"] for r in j["instructions"]]
assert names == ["F", "B", "optimizer"], names
# the same plan on both sides: every kind of instruction ran as often
assert all(r["count_a"] == r["count_b"] > 0 for r in j["instructions"])
EOF

# 4. bad input: exit 2, one line "piper-compare: error: ..." that says what is wrong
bad() { # description expected-text args...
  local what=$1 expect=$2
  shift 2
  "$PC" "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^piper-compare: error: " "$tmp/err" \
      && grep -qF -- "$expect" "$tmp/err"; then
    ok "bad input: $what ($(cat "$tmp/err"))"
  else
    fail "bad input: $what: rc $rc, stderr: $(cat "$tmp/err")"
  fi
}
broken() { # name: a copy of the simulated run to break
  rm -rf "$tmp/$1"
  cp -r "$tmp/unit" "$tmp/$1"
}
bad "one directory" "give two run directories" "$tmp/unit"
bad "three directories" "one run directory too many" "$tmp/unit" "$tmp/unit" "$tmp/unit"
bad "unknown option" "unknown option --frobnicate" "$tmp/unit" "$tmp/double" --frobnicate
bad "tolerance not a number" '--tolerance: "abc" is not a number' "$tmp/unit" "$tmp/double" --tolerance abc
bad "tolerance negative" '--tolerance: "-1"' "$tmp/unit" "$tmp/double" --tolerance -1
bad "missing directory" "$tmp/nope: no such run directory" "$tmp/nope" "$tmp/unit"
bad "a file, not a directory" "not a directory" "$tmp/double.json" "$tmp/unit"
broken nometrics && rm "$tmp/nometrics/metrics.json"
bad "no metrics.json" "nometrics/metrics.json: cannot open" "$tmp/unit" "$tmp/nometrics"
broken trunc && head -c 300 "$tmp/unit/metrics.json" > "$tmp/trunc/metrics.json"
bad "truncated metrics.json" "trunc/metrics.json:" "$tmp/trunc" "$tmp/unit"
grep -q "malformed JSON" "$tmp/err" || fail "truncated metrics.json: message: $(cat "$tmp/err")"
broken nokey && python3 -c "
import json, sys
p = sys.argv[1]; m = json.load(open(p)); del m['iteration_time_s']; json.dump(m, open(p, 'w'))" \
  "$tmp/nokey/metrics.json"
bad "metrics.json without iteration_time_s" 'nokey/metrics.json: missing key "iteration_time_s"' \
  "$tmp/unit" "$tmp/nokey"
broken badtrace && head -c 2000 "$tmp/unit/trace.json" > "$tmp/badtrace/trace.json"
bad "truncated trace.json" "badtrace/trace.json:" "$tmp/unit" "$tmp/badtrace"
broken noprog && rm "$tmp/noprog/1f1b_pp4_mbs8.json"
bad "no program file" "no directive program" "$tmp/unit" "$tmp/noprog"
broken mixed && cp "$tmp/double/results.csv" "$tmp/mixed/results.csv"
bad "results.csv of another run" "mixed/results.csv: line 2: iter_time_mean_s" "$tmp/mixed" "$tmp/unit"
# mismatched runs: another micro-batch count (another program), another model
"$SIM" --model models/tiny-dense.json --directives directives/base-schedules/pp4.json \
  --schedule 1f1b --ranks 4 --mbs 4 --profile profiles/unit.json --out "$tmp/mbs4" --no-charts --quiet
bad "another program" "the directive programs differ" "$tmp/unit" "$tmp/mbs4"
"$SIM" --model models/tiny-moe.json --pp-regions 4 --directives directives/base-schedules/pp4.json \
  --schedule 1f1b --ranks 4 --mbs 8 --profile profiles/unit.json --out "$tmp/moe" --no-charts --quiet
bad "another model" 'different models ("tiny-dense" and "tiny-moe"' "$tmp/unit" "$tmp/moe"
bad "another device count" "different device counts (4 and 1" "$tmp/unit" "$tmp/sim"

# 5. an output that cannot be written is a runtime failure (1)
"$PC" "$tmp/unit" "$tmp/double" --json "$tmp/no/such/dir/c.json" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && ok "--json unwritable exits 1" \
  || fail "--json unwritable: rc $rc $(cat "$tmp/err")"

if [ $fails -ne 0 ]; then
  echo "test_compare: $fails failure(s)"
  exit 1
fi
echo "test_compare: all passed"
