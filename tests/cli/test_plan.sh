#!/usr/bin/env bash
# piper-plan as a user runs it (issue 12 item 3): a small search writes plan.csv (ranked, every
# configuration) and plan.png and prints the best with why; bad input exits 2 with one line
# "piper-plan: error: ..."; sweeps (piper-plan --sweep, piper-sim --sweep) take per-entry
# layouts and PP splits, check their files before running, print their summary even when every
# configuration fails, and honour or refuse --profile, --no-charts and the one-run options.
# Run from the repository root.
set -u
BIN=${PIPER_BIN:-bin}
PLAN="$BIN/piper-plan"
SIM="$BIN/piper-sim"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; passes=$((passes + 1)); }

[ -x "$PLAN" ] || { echo "FAIL: $PLAN not built"; exit 1; }

"$PLAN" --help | grep -q -- "--tp LIST" && ok "--help names the tensor-parallel degrees" || fail "--help"
"$PLAN" --version | grep -Eq '^piper-plan [0-9]+\.[0-9]+\.[0-9]+$' && ok "--version" || fail "--version"

# 1. a small search with a known answer (tests/unit/test_planner.c has the hand check)
small=(--model models/tiny-dense.json --devices 4 --profile profiles/unit.json --global-batch 16)
if "$PLAN" "${small[@]}" --pp 4 --out "$tmp/p" > "$tmp/stdout" 2> "$tmp/stderr"; then
  ok "plan exits 0"
  [ "$(wc -l < "$tmp/p/plan.csv")" -eq 7 ] && ok "plan.csv: 6 configurations" || fail "rows: $(cat "$tmp/p/plan.csv")"
  sed -n 2p "$tmp/p/plan.csv" | grep -q '^1,ok,zerobubble,"pp=4,dp=1,ep=1",4,1,1,1,1,1,none,4,zero0,2,8,0.027,' \
    && ok "rank 1: zero-bubble, 27 ms" || fail "rank 1: $(sed -n 2p "$tmp/p/plan.csv")"
  grep -q '^  #1 zerobubble pp=4,dp=1,ep=1, 8 micro-batches' "$tmp/stdout" && grep -q "beats #2 by 6 ms" "$tmp/stdout" \
    && ok "summary: the best and why" || fail "summary: $(cat "$tmp/stdout")"
  [ "$(head -c 4 "$tmp/p/plan.png" | od -An -c | tr -d ' ')" = "211PNG" ] && ok "plan.png is a PNG" || fail "plan.png"
  ! grep -q $'\r' "$tmp/stderr" && grep -q '^piper-plan: 6/6 configurations simulated' "$tmp/stderr" \
    && ok "progress lines on a non-terminal stderr" || fail "progress: $(cat "$tmp/stderr")"
else
  fail "plan: $(cat "$tmp/stderr")"
fi
# the pick's commands: the printed piper-sim line runs as printed and gives the pick's figures
# (iteration time, throughput, peak memory: plan.csv's rank 1), on the unit profile and on a real
# model and profile where device classes collapse; both lines use Megatron's names
# (--micro-batch-size, --num-micro-batches; --seq-length when the search set it); the mpirun
# line names piper-exec with the root-safe variables and, on a host profile, runs as printed
rerun_pick() {  # rerun_pick NAME STDOUT PLANCSV [exec]
  local cmd run
  cmd=$(grep -A1 '^  run #1:$' "$2" | sed -n '2s/^    //p')
  run=$(grep -A2 '^  run #1:$' "$2" | sed -n '3s/^    //p')
  case "$cmd" in "$BIN/piper-sim "*) ;; *) fail "$1: no piper-sim command: $(cat "$2")"; return;; esac
  python3 - "$3" "$cmd" "$run" <<'PY' && ok "$1: the commands give the pick's sizes in Megatron's names" || fail "$1: sizes: $cmd / $run"
import csv, sys
pick = next(csv.DictReader(open(sys.argv[1])))
want = "--micro-batch-size %s --num-micro-batches %s" % (pick["micro_batch_size"], pick["num_microbatches"])
for line in sys.argv[2:]:
    assert want in line and "--mbs" not in line, (want, line)
PY
  if ! eval "$cmd --out \"$tmp/rerun-$1\" --no-charts --no-sensitivity" > /dev/null 2>&1; then
    fail "$1: the printed command fails: $cmd"; return
  fi
  python3 - "$3" "$tmp/rerun-$1/metrics.json" <<'PY' && ok "$1: the printed piper-sim command reproduces the pick" || fail "$1: figures differ: $cmd"
import csv, json, sys
pick = next(csv.DictReader(open(sys.argv[1])))
m = json.load(open(sys.argv[2]))
close = lambda a, b: abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-12)
assert pick["status"] == "ok", pick
assert close(float(pick["iteration_time_s"]), m["iteration_time_s"]), (pick, m["iteration_time_s"])
assert close(float(pick["throughput_tokens_per_s"]), m["throughput_tokens_per_s"])
assert abs(float(pick["peak_memory_gib"]) - m["peak_memory_bytes_max"] / 2**30) < 1e-5
PY
  grep -A2 '^  run #1:$' "$2" | sed -n 3p | grep -q "^    .*mpirun --allow-run-as-root -np [0-9]* .*$BIN/piper-exec --backend [a-z]* --model " \
    && ok "$1: the mpirun command" || fail "$1: mpirun line: $(grep -A2 '^  run #1:$' "$2")"
  [ "${4:-}" = exec ] || return 0
  # as printed (as root or not: --allow-run-as-root), with only a fresh output directory added
  if eval "$run --out \"$tmp/exec-$1\"" > "$tmp/exec-$1.log" 2>&1 &&
     grep -q '^piper-exec: final loss [0-9.]*, .* over 20 measured steps' "$tmp/exec-$1.log"; then
    ok "$1: the printed mpirun command trains"
  else
    fail "$1: the printed mpirun command fails: $run: $(tail -3 "$tmp/exec-$1.log")"
  fi
}
"$PLAN" "${small[@]}" --out "$tmp/pick" > "$tmp/stdout" 2>/dev/null && rerun_pick tiny "$tmp/stdout" "$tmp/pick/plan.csv" exec \
  || fail "plan for the pick"
"$PLAN" "${small[@]}" --seq-length 32 --micro-batch-size 1,2 --out "$tmp/pick-seq" > "$tmp/stdout" 2>/dev/null &&
  grep -A2 '^  run #1:$' "$tmp/stdout" | grep -c -- '--seq-length 32' | grep -qx 2 &&
  rerun_pick tiny-seq "$tmp/stdout" "$tmp/pick-seq/plan.csv" || fail "the pick's commands carry --seq-length: $(cat "$tmp/stdout")"
"$PLAN" --model models/qwen1.5-moe-a2.7b.json --devices 16 --pp 2 --tp 1 --max-interleave 1 --profile profiles/h100-sxm.json \
  --global-batch 64 --out "$tmp/pickq" --no-charts --quiet > "$tmp/stdout" 2>/dev/null \
  && rerun_pick qwen "$tmp/stdout" "$tmp/pickq/plan.csv" || fail "plan for the qwen pick"

# 2. uneven stages where the stages do not divide the layers: DeepSeek-V3's 61 over 16 stages
# searched as 2 + 14 x 4 + 3 (the spec is simulated as --layout takes it)
"$PLAN" --model models/deepseek-v3.json --devices 16 --pp 16 --tp 1 --schedules 1f1b --max-interleave 1 \
  --profile profiles/h100-sxm.json --global-batch 32 --out "$tmp/uneven" --no-charts --quiet 2>/dev/null &&
  grep -q '^1,over_memory_cap,1f1b,"pp=16,dp=1,ep=1,first-stage-layers=2,last-stage-layers=3",16,1,1,1,1,1,none,16,' "$tmp/uneven/plan.csv" &&
  ok "61 layers over 16 stages" || fail "uneven stages: $(cat "$tmp/uneven/plan.csv" 2>/dev/null)"
"$PLAN" "${small[@]}" --out "$tmp/nc" --no-charts --no-summary > "$tmp/stdout" 2>/dev/null && [ ! -e "$tmp/nc/plan.png" ] \
  && [ ! -s "$tmp/stdout" ] && [ -s "$tmp/nc/plan.csv" ] && ok "--no-charts, --no-summary" || fail "--no-charts/--no-summary"
# infeasible rows say why: a cap below every configuration
"$PLAN" "${small[@]}" --pp 4 --memory-cap 0.000001 --out "$tmp/cap" > "$tmp/stdout" 2>/dev/null \
  && grep -q "no configuration fits" "$tmp/stdout" && grep -q ',over_memory_cap,.*over the cap of' "$tmp/cap/plan.csv" \
  && ok "over the cap: marked with the reason" || fail "cap: $(cat "$tmp/stdout")"
# --recompute is a second axis: each layout with and without per-layer recomputation; under a
# cap that only recomputing configurations meet (0.0018 to 0.0022 GiB here, 0.0029 without),
# the best recomputes
"$PLAN" "${small[@]}" --pp 4 --recompute none,full:uniform:1 --memory-cap 0.0025 --out "$tmp/rc" \
  > /dev/null 2>&1 && [ "$(wc -l < "$tmp/rc/plan.csv")" -eq 13 ] \
  && sed -n 2p "$tmp/rc/plan.csv" | grep -q '^1,ok,[a-z_0-9]*,"pp=4,dp=1,ep=1,.*recompute=full:uniform:1",' \
  && ok "--recompute: 12 configurations, the best within the cap recomputes" \
  || fail "--recompute: $(head -3 "$tmp/rc/plan.csv")"

# 2. bad input: exit 2, one line
expect_input_error() {  # expect_input_error PROGRAM WHAT-IN-MESSAGE ARGS...
  local prog=$1 want=$2
  shift 2
  "$BIN/$prog" "$@" > /dev/null 2> "$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "exit $rc, want 2: $prog $* ($(cat "$tmp/err"))"; return; fi
  if [ "$(wc -l < "$tmp/err")" -ne 1 ]; then fail "not one line: $(cat "$tmp/err")"; return; fi
  grep -q "^$prog: error: .*$want" "$tmp/err" && ok "bad input: $want" \
    || fail "message lacks '$want': $(cat "$tmp/err")"
}
expect_input_error piper-plan "give --model FILE" --devices 4
expect_input_error piper-plan "--devices" "${small[@]}" --devices 0
expect_input_error piper-plan "--schedules: \"dualpipe\"" "${small[@]}" --schedules 1f1b,dualpipe
expect_input_error piper-plan "--micro-batch-size: " "${small[@]}" --micro-batch-sizes 1,x
expect_input_error piper-plan "--recompute: \"none,full:block:0\"" "${small[@]}" --recompute none,full:block:0
expect_input_error piper-plan "--pp" "${small[@]}" --pp 0
expect_input_error piper-plan "--cp: \"2,x\"" "${small[@]}" --cp 2,x
expect_input_error piper-plan "--ep: \"0\"" "${small[@]}" --ep 0
expect_input_error piper-plan "--fp8: \"fp4\" is not an FP8 recipe" "${small[@]}" --fp8 none,fp4
expect_input_error piper-plan "--fp8 blockwise: models/tiny-dense.json is not a bf16 model" "${small[@]}" --fp8 blockwise
expect_input_error piper-plan "--fp8 blockwise: profile host-cpu has no FP8 peak" --model models/tiny-dense-bf16.json \
  --devices 2 --profile profiles/host-cpu.json --global-batch 4 --fp8 blockwise
expect_input_error piper-sim "--fp8: \"fp4\" is not an FP8 recipe" --model models/tiny-dense-bf16.json --layout pp=2 \
  --profile profiles/unit.json --fp8 fp4
# the rows issue 32 adds: context parallelism and FP8 on request, each in plan.csv's columns
if "$PLAN" --model models/tiny-dense-bf16.json --devices 4 --profile profiles/h100-sxm.json --global-batch 16 \
    --tp 1 --pp 1,2 --cp 1,2 --fp8 none,blockwise --out "$tmp/rows" --no-charts --quiet > /dev/null 2>&1 &&
   python3 - "$tmp/rows/plan.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert {r["cp"] for r in rows} == {"1", "2"}, {r["cp"] for r in rows}
assert {r["fp8"] for r in rows} == {"none", "blockwise"}
assert all(("cp=2" in r["layout"]) == (r["cp"] == "2") for r in rows)
assert not any(r["status"] == "error" for r in rows)
PY
then ok "--cp and --fp8: rows with each, in plan.csv's columns"; else fail "--cp/--fp8 rows: $(head -3 "$tmp/rows/plan.csv")"; fi
# an FP8 pick on a GPU profile: the cuda backend runs FP8 GEMMs, so its mpirun line keeps the recipe
out=$("$PLAN" --model models/tiny-dense-bf16.json --devices 4 --profile profiles/h100-sxm.json --global-batch 16 \
  --tp 1 --pp 2 --fp8 blockwise --out "$tmp/fp8" --no-charts 2>&1)
if grep -q -- "piper-exec --backend cuda .*--fp8 blockwise --iters" <<<"$out" && ! grep -q "bf16)" <<<"$out"; then
  ok "an FP8 pick's mpirun line trains it in FP8 on the cuda backend"
else fail "FP8 pick's mpirun line: $(grep -A3 'run #1' <<<"$out")"; fi
expect_input_error piper-plan "no layout of 4 devices fits.*not a whole number" "${small[@]}" --global-batch 3
expect_input_error piper-plan "nope.json" "${small[@]}" --profile profiles/nope.json
expect_input_error piper-plan "nope.json" --model models/nope.json --devices 4 --profile profiles/unit.json --global-batch 16
expect_input_error piper-plan "--sweep takes" --sweep x.json --model models/tiny-dense.json
# an --out it cannot write is said before the search (no progress line, one line, exit 2)
expect_input_error piper-plan "--out /proc/nope/x: cannot write there" "${small[@]}" --out /proc/nope/x
[ ! -d out ] || [ -z "$(find out -newer "$tmp/err" -maxdepth 1 -mindepth 1 2>/dev/null)" ] \
  && ok "refused runs leave no run directory" || fail "a refused run left a directory in out/"

# 3. sweeps, the explicit mode: per-entry layout and pp_regions
cat > "$tmp/sweep.json" <<EOF
{"model": "models/tiny-dense.json",
 "base_schedules": [{"layout": "pp=4"}, {"file": "directives/base-schedules/pp4_v.json", "pp_regions": 8}],
 "schedules": ["1f1b", "zbv"], "microbatches": [8], "profiles": ["profiles/unit.json"]}
EOF
if "$BIN/piper-plan" --sweep "$tmp/sweep.json" --out "$tmp/sw" > "$tmp/stdout" 2> "$tmp/stderr"; then
  python3 - "$tmp/sw/sweep.csv" <<'EOF' && ok "per-entry layout and pp_regions" || fail "sweep rows: $(cat "$tmp/sw/sweep.csv")"
import csv, sys
rows = {(r["schedule"], r["base"]): r for r in csv.DictReader(open(sys.argv[1]))}
assert rows[("1f1b", "layout pp=4")]["status"] == "ok"
assert abs(float(rows[("1f1b", "layout pp=4")]["iteration_time_s"]) - 0.033) < 1e-9
assert rows[("zbv", "directives/base-schedules/pp4_v.json")]["status"] == "ok"
assert rows[("zbv", "layout pp=4")]["status"] == "error"          # not a V
assert rows[("1f1b", "directives/base-schedules/pp4_v.json")]["status"] == "error"
for r in rows.values():                                           # the split sums to the bubble
    if r["status"] == "ok":
        parts = sum(float(r[k]) for k in ("pipeline_idle_fraction", "exposed_comm_fraction", "imbalance_fraction"))
        assert abs(parts - float(r["bubble_fraction"])) < 1e-5, r
EOF
  grep -q "pipeline idle" "$tmp/stdout" && ok "sweep summary has the bubble split" || fail "summary: $(cat "$tmp/stdout")"
else
  fail "sweep: $(cat "$tmp/stderr")"
fi
# missing files are found before anything runs: exit 2, nothing written
sed 's|"profiles/unit.json"\]|"profiles/unit.json", "profiles/typo.json"]|' "$tmp/sweep.json" > "$tmp/missing.json"
expect_input_error piper-sim "missing.json: key \"profiles\": item 1: \"profiles/typo.json\": no such file" --sweep "$tmp/missing.json" --out "$tmp/miss"
[ ! -e "$tmp/miss/sweep.csv" ] && ok "nothing simulated before the check" || fail "missing file found late"
# an all-failed sweep still prints its summary, writes sweep.csv, exits 1
cat > "$tmp/allfail.json" <<EOF
{"model": "models/tiny-dense.json", "base_schedules": ["directives/base-schedules/pp4.json"],
 "schedules": ["dualpipev"], "microbatches": [8], "profiles": ["profiles/unit.json"]}
EOF
"$SIM" --sweep "$tmp/allfail.json" --out "$tmp/af" > "$tmp/stdout" 2> "$tmp/stderr"
rc=$?
[ $rc -eq 1 ] && grep -q "sweep of 1 configurations: 0 feasible, 0 over the memory cap, 1 failed" "$tmp/stdout" \
  && grep -q "every configuration failed" "$tmp/stdout" && [ -s "$tmp/af/sweep.csv" ] \
  && ok "all-failed sweep: summary, sweep.csv, exit 1" || fail "all-failed: rc $rc $(cat "$tmp/stdout" "$tmp/stderr")"
# --profile replaces the file's profiles; --no-charts writes no chart
"$SIM" --sweep "$tmp/sweep.json" --profile profiles/h100-sxm.json --no-charts --out "$tmp/hp" > /dev/null 2>&1 \
  && [ ! -e "$tmp/hp/sweep.png" ] && [ "$(grep -c ',h100-sxm,' "$tmp/hp/sweep.csv")" -eq 4 ] \
  && ! grep -q ',unit,' "$tmp/hp/sweep.csv" && ok "--profile honoured, --no-charts honoured" || fail "--profile/--no-charts"
expect_input_error piper-sim "--format, --viz and --trace-all do not apply" --sweep "$tmp/sweep.json" --format pdf
expect_input_error piper-sim "--sweep takes the model" --sweep "$tmp/sweep.json" --layout pp=2

# 4. the bubble split (issue 12 item 5): piper-sim's summary, metrics.json, results.csv
if "$SIM" --model models/tiny-dense.json --layout pp=4 --schedule 1f1b --mbs 8 --profile profiles/unit.json \
    --out "$tmp/split" --no-charts > "$tmp/stdout" 2>/dev/null; then
  grep -q '^  split          pipeline idle 27.3% + exposed comm 0.0% + imbalance 0.0% (of the step)$' "$tmp/stdout" \
    && ok "summary: textbook 1F1B bubble is all pipeline idle" || fail "summary: $(cat "$tmp/stdout")"
  python3 - "$tmp/split" <<'EOF' && ok "metrics.json and results.csv: the parts sum to the bubble" || fail "split keys"
import csv, json, sys
m = json.load(open(sys.argv[1] + "/metrics.json"))
parts = m["pipeline_idle_fraction_mean"] + m["exposed_comm_fraction_mean"] + m["imbalance_fraction_mean"]
assert abs(parts - m["bubble_fraction_mean"]) < 1e-12 and abs(parts - 3 / 11) < 1e-9, m
for d in m["devices"]:
    assert abs(d["pipeline_idle_s"] + d["exposed_comm_s"] + d["imbalance_s"]
               - d["bubble_fraction"] * m["iteration_time_s"]) < 1e-12, d
row = next(csv.DictReader(open(sys.argv[1] + "/results.csv")))
assert abs(float(row["pipeline_idle_fraction"]) - 3 / 11) < 1e-6 and float(row["imbalance_fraction"]) == 0, row
EOF
else
  fail "piper-sim for the split"
fi

if [ $fails -ne 0 ]; then
  echo "test_plan.sh: $passes passed, $fails failed"
  exit 1
fi
echo "test_plan.sh: $passes passed, 0 failed"
