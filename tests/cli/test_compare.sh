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
passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; passes=$((passes + 1)); }
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

# 3b. node by node, exec (2 measured steps) against sim: every node of the one-device plan
# pairs (4 stages x 2 micro-batches of F and of B, 4 optimizer updates); the measured trace
# holds both measured steps (2 and 3, after 1 warm-up), each event its step and plan node; the
# chart is written beside --json, 1854 pixels wide (the schedule chart's margin, wide enough for lane names such as "pp send to rank 2") and not blank
grep -q '^per node (device, IR node, micro-batch): median duration over the traced steps (A 2, B 1)' \
  "$tmp/out" && ok "per-node section" || fail "per-node section: $(grep -A2 '^per node' "$tmp/out")"
grep -Eq '^worst 10 nodes by error +device +mb' "$tmp/out" && ok "worst ten header" \
  || fail "worst ten: $(grep -A2 '^worst' "$tmp/out")"
python3 - "$tmp/es.json" "$tmp/exec" <<'EOF2' && ok "--json nodes, trace of every measured step" || fail "--json nodes / trace steps"
import json, sys
j = json.load(open(sys.argv[1]))
n = j["nodes"]
assert n["paired"] == 20 and n["only_a"] == 0 and n["only_b"] == 0, n
assert n["steps_a"] == 2 and n["steps_b"] == 1 and j["a"]["trace_steps"] == 2
rows = {r["kind"]: r for r in n["summary"]}
assert [r["kind"] for r in n["summary"]] == ["all", "F", "B", "optimizer"], list(rows)
assert rows["all"]["nodes"] == 20 and rows["F"]["nodes"] == 8 and rows["optimizer"]["nodes"] == 4
for r in n["summary"]:
    assert set(r) == {"kind", "nodes", "median_ratio", "median_error", "p90_error", "max_error"}, r
    assert 0 <= r["median_error"] <= r["p90_error"] <= r["max_error"], r
assert len(n["worst"]) == 10
errs = [w["error"] for w in n["worst"]]
assert errs == sorted(errs, reverse=True) and errs[0] == rows["all"]["max_error"]
for w in n["worst"]:
    assert set(w) == {"name", "kind", "device", "micro_batch", "a", "b", "ratio", "error"}, w
    assert abs(w["ratio"] - w["b"] / w["a"]) < 1e-12 * w["ratio"]
    assert abs(w["error"] - (max(w["ratio"], 1 / w["ratio"]) - 1)) < 1e-9
ins = {r["name"]: r for r in j["instructions"]}
assert ins["F"]["count_a"] == ins["F"]["count_b"] == 8  # per step, both sides
t = json.load(open(sys.argv[2] + "/trace.json"))
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert len(x) == 2 * 20 and sorted({e["args"]["step"] for e in x}) == [2, 3]
assert all(isinstance(e["args"]["node"], int) for e in x)
st = t["otherData"]["steps"]
assert [s["step"] for s in st] == [2, 3] and st[0]["start_us"] == 0
assert st[0]["end_us"] <= st[1]["start_us"] < st[1]["end_us"]
for e in x:  # each event inside its step's range
    s = st[e["args"]["step"] - 2]
    assert s["start_us"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= s["end_us"] + 1e-3
m = json.load(open(sys.argv[2] + "/metrics.json"))
assert m["traced_steps"] == [2, 3] and len(m["iteration_times_s"]) == 2
EOF2
png_check() { # file width: a PNG of that width, taller than 100 pixels, of more than 8 colours
  python3 - "$1" "$2" <<'EOF2'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", data[16:24])
assert w == int(sys.argv[2]) and h > 100, (w, h)
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    if kind == b"IDAT":
        idat += data[pos + 8:pos + 8 + n]
    pos += 12 + n
raw = zlib.decompress(idat)
stride = len(raw) // h  # filter byte + pixels
assert stride >= 3 * w, (stride, w)
colours = set()
for y in range(0, h, 3):
    row = raw[y * stride + 1:(y + 1) * stride]
    colours.update(row[i:i + 3] for i in range(0, len(row) - 3, 4 * 7))
assert len(colours) > 8, len(colours)
EOF2
}
png_check "$tmp/compare.png" 1854 && ok "compare.png beside --json" || fail "compare.png: $(ls -la "$tmp"/*.png 2>&1)"
"$PC" "$tmp/sim" "$tmp/exec" --chart "$tmp/mine.png" > /dev/null 2> "$tmp/err" \
  && png_check "$tmp/mine.png" 1854 && ok "--chart FILE" || fail "--chart FILE: $(cat "$tmp/err")"
"$PC" "$tmp/sim" "$tmp/exec" --chart "$tmp/no/such/dir/c.png" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && ok "--chart unwritable exits 1" \
  || fail "--chart unwritable: rc $rc $(cat "$tmp/err")"
# a run directory written before events carried their step and node (one step): still read,
# every node paired
rm -rf "$tmp/old" && cp -r "$tmp/exec" "$tmp/old"
python3 - "$tmp/old/trace.json" <<'EOF2'
import json, sys
t = json.load(open(sys.argv[1]))
del t["otherData"]["steps"]
ev = []
for e in t["traceEvents"]:
    if e["ph"] == "X":
        if e["args"]["step"] != 3:
            continue
        del e["args"]["step"], e["args"]["node"]
    ev.append(e)
t["traceEvents"] = ev
json.dump(t, open(sys.argv[1], "w"))
EOF2
"$PC" "$tmp/old" "$tmp/sim" --json "$tmp/old.json" > /dev/null 2> "$tmp/err" \
  && python3 -c "
import json, sys
n = json.load(open(sys.argv[1]))['nodes']
assert n['paired'] == 20 and n['only_a'] == 0 and n['steps_a'] == 1, n" "$tmp/old.json" \
  && ok "a run directory of the old format" || fail "old format: $(cat "$tmp/err")"

# 3c. sim against sim of the same plan and profile: every node pairs, every ratio exactly 1;
# the all-to-all's dispatch and combine (one name) pair each with its own
moesim() { # out
  "$SIM" --model models/tiny-moe.json --directives directives/base-schedules/pp2_dp2_ep2.json \
    --profile profiles/host-cpu.json --out "$1" --no-charts --quiet
}
moesim "$tmp/moe1" && moesim "$tmp/moe2" || fail "piper-sim tiny-moe"
"$PC" "$tmp/moe1" "$tmp/moe2" --json "$tmp/same.json" > "$tmp/out" 2> "$tmp/err" \
  || fail "sim vs sim (same): $(cat "$tmp/err")"
python3 - "$tmp/same.json" "$tmp/moe1/trace.json" <<'EOF2' && ok "sim vs sim: every node ratio 1" || fail "sim vs sim: node ratios"
import json, sys
n = json.load(open(sys.argv[1]))["nodes"]
t = json.load(open(sys.argv[2]))
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert n["paired"] == len(x) > 0 and n["only_a"] == n["only_b"] == 0, (n["paired"], len(x))
for r in n["summary"]:
    assert r["median_ratio"] == 1 and r["median_error"] == 0 and r["max_error"] == 0, r
assert any(r["kind"].startswith("all_to_all") for r in n["summary"])
for w in n["worst"]:
    assert w["ratio"] == 1 and w["error"] == 0 and w["a"] == w["b"], w
EOF2
grep -Eq '^  all +[0-9]+ +1 +0\.0% +0\.0%$' "$tmp/out" && ok "sim vs sim: text row 'all'" \
  || fail "sim vs sim text: $(grep '^  all' "$tmp/out")"

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
  echo "test_compare: $passes passed, $fails failed"
  exit 1
fi
echo "test_compare: $passes passed, 0 failed"
