#!/usr/bin/env bash
# Megatron's batch and sequence vocabulary on every tool (issue 32 item 2): --micro-batch-size,
# --seq-length (alias --seq-len), --global-batch-size and --num-micro-batches (alias --mbs) in
# piper-compile, piper-sim and piper-exec; --global-batch-size (alias --global-batch),
# --micro-batch-size (one size or a list) and --seq-length in piper-plan. The model file keeps the
# defaults; the flags really change the plan (sequence length and micro-batch size change
# activation memory and costs); the micro-batch count is global / (micro-batch size x dp);
# inconsistent combinations are refused in one line with exit 2. And -o/--out and --quiet mean
# the same in every tool (piper-compare's: the comparison's files; the summary stays).
set -u
BIN=${PIPER_BIN:-bin}
PC="$BIN/piper-compile"
PS="$BIN/piper-sim"
PE="$BIN/piper-exec"
PP="$BIN/piper-plan"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
# the value of a top-level key of a metrics.json
metric() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
peak() { sed -n 's/^  peak memory *\([0-9.]*\) GiB.*/\1/p' "$1"; }
iter() { sed -n 's/^  iteration *\([0-9.e+]*\) ms/\1/p' "$1"; }
# one line on stderr naming the flag, exit 2
refused() { # rc stderr-file pattern
  [ "$1" -eq 2 ] && [ "$(wc -l <"$2")" -eq 1 ] && grep -q -- "$3" "$2"
}

DENSE=models/tiny-dense.json # seq_len 32, micro_batch_size 2 in the file
H100=profiles/h100-sxm.json
SIM=(--model $DENSE --layout pp=2,dp=2 --schedule 1f1b --profile $H100 --no-charts --no-sensitivity --force)

# --- every tool's --help names the flags -----------------------------------------------------
for prog in "$PC" "$PS" "$PE"; do
  h=$("$prog" --help)
  for f in "--num-micro-batches, --mbs M" "--micro-batch-size B" "--seq-length, --seq-len S" "--global-batch-size G"; do
    grep -qF -- "$f" <<<"$h" && ok || bad "$prog --help: no '$f'"
  done
done
h=$("$PP" --help)
for f in "--global-batch-size, --global-batch SEQ" "--micro-batch-size, --micro-batch-sizes" "--seq-length, --seq-len S"; do
  grep -qF -- "$f" <<<"$h" && ok || bad "piper-plan --help: no '$f'"
done

# --- the model file keeps the defaults; the flags replace them (metrics.json says so) ---------
"$PS" "${SIM[@]}" --mbs 4 -o "$T/d" >"$T/d.out" 2>"$T/err" &&
  [ "$(metric "$T/d/metrics.json" seq_len)" = 32 ] && [ "$(metric "$T/d/metrics.json" micro_batch_size)" = 2 ] &&
  ok || bad "defaults: $(cat "$T/err")"
"$PS" "${SIM[@]}" --num-micro-batches 4 --seq-length 64 -o "$T/s64" >"$T/s64.out" 2>"$T/err" &&
  [ "$(metric "$T/s64/metrics.json" seq_len)" = 64 ] && ok || bad "--seq-length 64: $(cat "$T/err")"
"$PS" "${SIM[@]}" --num-micro-batches 4 --micro-batch-size 4 -o "$T/b4" >"$T/b4.out" 2>"$T/err" &&
  [ "$(metric "$T/b4/metrics.json" micro_batch_size)" = 4 ] && ok || bad "--micro-batch-size 4: $(cat "$T/err")"

# --- they change the plan: a longer sequence or a larger micro-batch holds more activations and
# costs more time (h100 profile: costs from shapes) ----------------------------------------------
python3 - "$(peak "$T/d.out")" "$(peak "$T/s64.out")" "$(peak "$T/b4.out")" \
  "$(iter "$T/d.out")" "$(iter "$T/s64.out")" "$(iter "$T/b4.out")" <<'EOF' && ok || bad "flags change nothing: $(cat "$T/d.out" "$T/s64.out" "$T/b4.out")"
import sys
p0, ps, pb, t0, ts, tb = map(float, sys.argv[1:])
assert ps > p0 and pb > p0, (p0, ps, pb)
assert ts > t0 and tb > t0, (t0, ts, tb)
EOF
# --seq-len is the same flag
"$PS" "${SIM[@]}" --mbs 4 --seq-len 64 -o "$T/s64b" >/dev/null 2>"$T/err" &&
  cmp -s "$T/s64/results.csv" "$T/s64b/results.csv" && ok || bad "--seq-len differs from --seq-length: $(cat "$T/err")"
# the compiled plans follow the flags; --mbs is --num-micro-batches
"$PC" --model $DENSE --layout pp=2,dp=2 --schedule 1f1b --mbs 4 -o "$T/p_mbs" >/dev/null 2>"$T/err" &&
  "$PC" --model $DENSE --layout pp=2,dp=2 --schedule 1f1b --num-micro-batches 4 -o "$T/p_num" >/dev/null 2>>"$T/err" &&
  diff -r "$T/p_mbs" "$T/p_num" >/dev/null && ok || bad "compile --mbs vs --num-micro-batches: $(cat "$T/err")"
"$PC" --model $DENSE --layout pp=2,dp=2 --schedule 1f1b --mbs 4 --seq-length 64 -o "$T/p_s64" >/dev/null 2>"$T/err" &&
  ! diff -r "$T/p_mbs" "$T/p_s64" >/dev/null && ok || bad "compile --seq-length: same plans $(cat "$T/err")"

# --- --global-batch-size: micro-batches = global / (micro-batch size x dp) --------------------
# 16 sequences over dp 2 in micro-batches of 2: 4 micro-batches, the plans of --mbs 4
"$PC" --model $DENSE --layout pp=2,dp=2 --schedule 1f1b --global-batch-size 16 -o "$T/p_g" >"$T/g.out" 2>"$T/err" &&
  grep -q ", 4 micro-batches," "$T/g.out" && diff -r "$T/p_mbs" "$T/p_g" >/dev/null && ok ||
  bad "compile --global-batch-size 16: $(cat "$T/g.out" "$T/err")"
"$PS" "${SIM[@]}" --global-batch-size 32 --micro-batch-size 4 -o "$T/g4" >"$T/g4.out" 2>"$T/err" &&
  grep -q ", 4 micro-batches," "$T/g4.out" && cmp -s "$T/b4/results.csv" "$T/g4/results.csv" && ok ||
  bad "sim --global-batch-size 32 --micro-batch-size 4: $(cat "$T/g4.out" "$T/err")"
# agreeing counts are accepted
"$PS" "${SIM[@]}" --global-batch-size 16 --num-micro-batches 4 -o "$T/g5" >/dev/null 2>"$T/err" && ok ||
  bad "agreeing --num-micro-batches refused: $(cat "$T/err")"
# on a directive file: dp from its placement (pp2_dp2: 2 replicas)
"$PC" --model models/tiny-moe.json --directives directives/base-schedules/pp2_dp2_ep2.json \
  --global-batch-size 24 >"$T/g.out" 2>"$T/err" && grep -q ", 6 micro-batches," "$T/g.out" && ok ||
  bad "compile --global-batch-size on a directive file: $(cat "$T/g.out" "$T/err")"

# --- inconsistent combinations: one line, exit 2 ---------------------------------------------
"$PS" "${SIM[@]}" --global-batch-size 18 -o "$T/x" >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-sim: error: --global-batch-size 18: not a whole number of micro-batches of 4 sequences (micro-batch size 2 x data-parallel 2)" &&
  ok || bad "global not divisible: $(cat "$T/err")"
"$PS" "${SIM[@]}" --global-batch-size 16 --mbs 8 -o "$T/x" >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-sim: error: --num-micro-batches 8 disagrees with --global-batch-size 16 = 4 micro-batches" &&
  ok || bad "global vs num-micro-batches: $(cat "$T/err")"
"$PC" --model $DENSE --layout pp=2,dp=2 --schedule 1f1b --global-batch-size 16 --micro-batch-size 3 >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-compile: error: --global-batch-size 16: not a whole number of micro-batches of 6 sequences" &&
  ok || bad "compile global vs micro-batch size: $(cat "$T/err")"
for v in 0 -1 x; do
  "$PS" "${SIM[@]}" --mbs 4 --seq-length "$v" >/dev/null 2>"$T/err"
  refused $? "$T/err" "^piper-sim: error: --seq-length: expected an integer" && ok || bad "--seq-length $v: $(cat "$T/err")"
done
# a sequence that tensor parallelism with SP cannot split names the sequence and the degree
"$PS" --model $DENSE --layout pp=1,tp=2,sp --mbs 2 --seq-length 31 --micro-batch-size 1 --profile $H100 --no-charts \
  -o "$T/x" --force >/dev/null 2>"$T/err"
refused $? "$T/err" "seq_len x micro_batch_size) = 31" && ok || bad "seq 31 under sp: $(cat "$T/err")"
# --plans takes plans as compiled: the flags do not apply
"$PS" --plans "$T/p_mbs" --seq-length 64 --profile $H100 >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-sim: error: --plans takes the plans as compiled: --seq-length does not apply" && ok ||
  bad "sim --plans --seq-length: $(cat "$T/err")"
"$PE" --plans "$T/p_mbs" --global-batch-size 16 >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-exec: error: .*--global-batch-size" && ok || bad "exec --plans --global-batch-size: $(cat "$T/err")"

# --sweep takes the batch from its file: the flags are refused, not ignored
echo '{"model": "models/tiny-dense.json", "base_schedules": [{"layout": "pp=2"}], "schedules": ["1f1b"],
 "microbatches": [4], "profiles": ["profiles/unit.json"]}' >"$T/sw0.json"
"$PS" --sweep "$T/sw0.json" --seq-length 64 --no-charts -o "$T/x" --force >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-sim: error: --sweep takes the model, schedules and micro-batches from its file: --seq-length does not apply" &&
  ok || bad "sim --sweep --seq-length: $(cat "$T/err")"
"$PP" --sweep "$T/sw0.json" --seq-length 64 --no-charts -o "$T/x" --force >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-plan: error: --sweep takes the model" && ok || bad "plan --sweep --seq-length: $(cat "$T/err")"

# --- piper-exec trains what the flags say: tokens per step and metrics follow them ------------
echo '[{"op": "place", "filter": {}, "devices": [0]}]' >"$T/one.json"
"$PE" --model $DENSE --directives "$T/one.json" --global-batch-size 6 --micro-batch-size 3 --seq-length 16 \
  --warmup 0 --iters 1 --quiet --no-charts -o "$T/e" >"$T/e.out" 2>"$T/err" &&
  [ "$(metric "$T/e/metrics.json" seq_len)" = 16 ] && [ "$(metric "$T/e/metrics.json" micro_batch_size)" = 3 ] &&
  [ "$(metric "$T/e/metrics.json" num_microbatches)" = 2 ] && ok || bad "exec flags: $(cat "$T/e.out" "$T/err")"

# --- piper-plan: the sequence length changes the answer; one micro-batch size is a list of one --
PL=(--model $DENSE --devices 4 --profile $H100 --global-batch-size 16 --quiet --no-summary --no-charts --force)
"$PP" "${PL[@]}" -o "$T/pl32" >/dev/null 2>"$T/err" && "$PP" "${PL[@]}" --seq-length 64 -o "$T/pl64" >/dev/null 2>>"$T/err" &&
  ! cmp -s "$T/pl32/plan.csv" "$T/pl64/plan.csv" && ok || bad "plan --seq-length changes nothing: $(cat "$T/err")"
"$PP" "${PL[@]}" --micro-batch-size 4 -o "$T/plb" >/dev/null 2>"$T/err" &&
  [ "$(python3 -c 'import csv,sys; print(sorted({r["micro_batch_size"] for r in csv.DictReader(open(sys.argv[1]))}))' \
    "$T/plb/plan.csv")" = "['4']" ] && ok ||
  bad "plan --micro-batch-size 4: $(cat "$T/err")"
"$PP" --model $DENSE --devices 4 --profile $H100 --global-batch 16 --quiet --no-summary --no-charts --force \
  -o "$T/plg" >/dev/null 2>"$T/err" && cmp -s <(cut -d, -f1-4 "$T/pl32/plan.csv") <(cut -d, -f1-4 "$T/plg/plan.csv") &&
  ok || bad "plan --global-batch differs from --global-batch-size: $(cat "$T/err")"

# --- the batch's columns are named alike: plan.csv, sweep.csv and results.csv say
# num_microbatches (as metrics.json does), plan.csv and metrics.json micro_batch_size ------------
echo '{"model": "models/tiny-dense.json", "base_schedules": [{"layout": "pp=2"}], "schedules": ["1f1b"],
 "microbatches": [4], "profiles": ["profiles/unit.json"]}' >"$T/sw.json"
"$PS" --sweep "$T/sw.json" --no-charts --quiet -o "$T/sw" >/dev/null 2>"$T/err"
for f in "$T/pl32/plan.csv" "$T/sw/sweep.csv" "$T/d/results.csv"; do
  head -n 1 "$f" | tr , '\n' | grep -qx num_microbatches && ok || bad "$f: no num_microbatches column: $(head -n 1 "$f")"
done
head -n 1 "$T/pl32/plan.csv" | tr , '\n' | grep -qx micro_batch_size && grep -q '"micro_batch_size"' "$T/d/metrics.json" &&
  grep -q '"num_microbatches"' "$T/d/metrics.json" && ok || bad "micro_batch_size: plan.csv / metrics.json"

# --- piper-compare: -o DIR writes compare.json and compare.png; --quiet keeps the summary -----
"$PS" "${SIM[@]}" --mbs 4 --profile profiles/a100-80g.json -o "$T/a100" >/dev/null 2>"$T/err"
"$BIN/piper-compare" "$T/d" "$T/a100" -o "$T/cmp" >"$T/c.out" 2>"$T/err" &&
  [ -s "$T/cmp/compare.json" ] && [ -s "$T/cmp/compare.png" ] && grep -q "^per device" "$T/c.out" && ok ||
  bad "compare -o: $(cat "$T/err")"
"$BIN/piper-compare" "$T/d" "$T/a100" --quiet >"$T/q.out" 2>"$T/err" && grep -q "^  iteration time (ms) " "$T/q.out" &&
  ! grep -q "^per device\|^mean duration\|^per node" "$T/q.out" && [ ! -s "$T/err" ] && ok ||
  bad "compare --quiet: $(cat "$T/q.out" "$T/err")"
"$BIN/piper-compare" "$T/d" "$T/a100" -o /proc/nonexistent/x >/dev/null 2>"$T/err"
[ $? -eq 1 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^piper-compare: error: /proc/nonexistent/x" "$T/err" && ok ||
  bad "compare -o unwritable: $(cat "$T/err")"
for prog in compile sim exec plan compare layout prof; do
  "$BIN/piper-$prog" --help | grep -q -- "-o, --out" && ok || bad "piper-$prog --help: no -o, --out"
done
for prog in sim exec plan compare prof; do
  "$BIN/piper-$prog" --help | grep -q -- "--quiet" && ok || bad "piper-$prog --help: no --quiet"
done

# --- piper-prof, whose runs are long (make test-long's test_prof.sh): its bad input in one line,
# exit 2, before anything is measured -----------------------------------------------------------
"$BIN/piper-prof" --model models/nope.json -o "$T/p.json" >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-prof: error: models/nope.json: cannot open" && ok || bad "prof missing model: $(cat "$T/err")"
"$BIN/piper-prof" --model $DENSE >/dev/null 2>"$T/err"
refused $? "$T/err" "^piper-prof: error: -o PROFILE is required" && ok || bad "prof without -o: $(cat "$T/err")"
[ ! -e "$T/p.json" ] && ok || bad "prof wrote a profile after bad input"

echo "test_vocabulary.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
