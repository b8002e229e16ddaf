#!/usr/bin/env bash
# The front-end flags mean the same in piper-compile, piper-sim and piper-exec (issue 12 item 6):
# --mbs without --schedule sets the MB split everywhere, --ranks alone is checked against the
# placement, --plans refuses them; a schedule exported as a PyTorch CSV and imported again with
# the same flags gives the same CSV and byte-identical plans for every family; piper-sim takes
# --import-csv; PyTorch's default CSV (communication cells) imports with a note; an error in an
# imported CSV names the CSV, its row and column. piper-exec: --quiet drops only the step lines,
# --log-every N keeps every N-th with the time left, checkpoints and resumes say so, and --help
# says --iters counts from the start of training. Issue 32's small things: --quiet drops progress
# and keeps the summary in every tool (--no-summary drops the summary), -o is --out everywhere,
# --layout refuses ep on a dense model and stages that do not divide the layers, a placement with
# more stages than the model's regions says both counts, docs/sim.md's sweep runs as written,
# the README's mpirun recipes run as root as written.
set -u
BIN=${PIPER_BIN:-bin}
PC="$BIN/piper-compile"
PS="$BIN/piper-sim"
PE="$BIN/piper-exec"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

MOE=models/tiny-moe.json
DENSE=models/tiny-dense.json
BS=directives/base-schedules
UNIT=profiles/unit.json

# --- --mbs without --schedule: the same split in all three programs -------------------------
"$PC" --model $MOE --directives $BS/pp2_dp2_ep2.json --mbs 6 >"$T/c.out" 2>"$T/err" &&
  grep -q ", 6 micro-batches," "$T/c.out" && ok || bad "compile --mbs 6: $(cat "$T/c.out" "$T/err")"
"$PS" --model $MOE --directives $BS/pp2_dp2_ep2.json --mbs 6 --profile $UNIT --no-charts \
  --out "$T/sim6" >"$T/s.out" 2>"$T/err" &&
  grep -q ", 6 micro-batches," "$T/s.out" && ok || bad "sim --mbs 6: $(cat "$T/s.out" "$T/err")"
echo '[{"op": "place", "filter": {}, "devices": [0]}]' >"$T/one.json"
"$PE" --model $DENSE --directives "$T/one.json" --mbs 3 --warmup 0 --iters 1 --no-report \
  >"$T/e.out" 2>"$T/err" &&
  grep -q ", 3 micro-batches per rank," "$T/e.out" && ok || bad "exec --mbs 3: $(cat "$T/e.out" "$T/err")"

# --- --quiet drops progress lines only: piper-sim still prints its summary ------------------
"$PS" --model $MOE --directives $BS/pp2_dp2_ep2.json --mbs 4 --profile $UNIT --no-charts --quiet \
  --out "$T/quiet" >"$T/s.out" 2>"$T/err" && grep -q "^piper-sim: tiny-moe, custom" "$T/s.out" &&
  grep -q "^  iteration" "$T/s.out" && ok || bad "sim --quiet: $(cat "$T/s.out" "$T/err")"
for prog in "$PC" "$PS" "$PE"; do
  [ "$("$prog" --help | grep -c -- '--import-csv FILE')" -eq 1 ] && ok || bad "$prog --help: --import-csv once"
done

# --- --ranks without --schedule is checked; --plans refuses front-end flags -------------------
for prog in "$PC" "$PS --profile $UNIT --no-charts --out $T/r3"; do
  $prog --model $MOE --directives $BS/pp2_dp2_ep2.json --ranks 3 >/dev/null 2>"$T/err"
  rc=$?
  [ "$rc" -eq 2 ] && grep -q "error: --ranks 3, but the placement of .*pp2_dp2_ep2.json has 2 pipeline ranks" "$T/err" &&
    ok || bad "$prog --ranks 3: exit $rc: $(cat "$T/err")"
done
"$PC" --model $MOE --directives $BS/pp2_dp2_ep2.json --ranks 2 >/dev/null 2>"$T/err" && ok ||
  bad "--ranks 2 (right): $(cat "$T/err")"
"$PC" --model $MOE --directives $BS/pp2_dp2_ep2.json -o "$T/plans" >/dev/null 2>&1
"$PS" --plans "$T/plans" --mbs 4 --profile $UNIT --no-charts --out "$T/pm" >/dev/null 2>"$T/err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "piper-sim: error: --plans takes the plans as compiled: --num-micro-batches (--mbs) does not apply" "$T/err" &&
  ok || bad "sim --plans --mbs: exit $rc: $(cat "$T/err")"
"$PE" --plans "$T/plans" --import-csv x.csv --no-report >/dev/null 2>"$T/err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "piper-exec: error: --plans takes the plans as compiled: --import-csv" "$T/err" &&
  ok || bad "exec --plans --import-csv: exit $rc: $(cat "$T/err")"

# --- export then import with the same flags: same CSV, byte-identical plans -------------------
# family base pp-regions mbs
while read -r fam base regions mbs; do
  F=(--model $MOE --directives "$BS/$base" --schedule "$fam" --mbs "$mbs")
  [ "$regions" != - ] && F+=(--pp-regions "$regions")
  rm -rf "$T/p1" "$T/p2"
  if "$PC" "${F[@]}" --export-csv "$T/a.csv" -o "$T/p1" >/dev/null 2>"$T/err" &&
    "$PC" "${F[@]}" --import-csv "$T/a.csv" --export-csv "$T/b.csv" -o "$T/p2" >/dev/null 2>>"$T/err"; then
    cmp -s "$T/a.csv" "$T/b.csv" && diff -rq "$T/p1" "$T/p2" >/dev/null && ok ||
      bad "$fam: the round trip changed the CSV or the plans"
  else
    bad "$fam round trip: $(cat "$T/err")"
  fi
done <<'EOF'
gpipe pp2_dp2_ep2.json - 4
1f1b pp2_dp2_ep2.json - 4
zerobubble pp2_dp2_ep2.json - 4
dualpipe pp2_dp2_ep2.json - 8
interleaved_1f1b pp4_dp2_ep2_interleaved.json 4 4
interleaved_zerobubble pp4_dp2_ep2_interleaved.json 4 4
zbv pp4_dp2_ep2_v_placement.json 4 4
dualpipev pp4_dp2_ep2_v_placement.json 4 8
EOF

# --- piper-sim --import-csv simulates the imported order: the same step as --schedule ----------
Z=(--model $MOE --directives $BS/pp4_dp2_ep2_interleaved.json --pp-regions 4 --mbs 4 --profile $UNIT --no-charts)
"$PC" --model $MOE --directives $BS/pp4_dp2_ep2_interleaved.json --pp-regions 4 --mbs 4 \
  --schedule interleaved_zerobubble --export-csv "$T/izb.csv" >/dev/null 2>&1
if "$PS" "${Z[@]}" --schedule interleaved_zerobubble --out "$T/built" >/dev/null 2>"$T/err" &&
  "$PS" "${Z[@]}" --import-csv "$T/izb.csv" --out "$T/imported" >/dev/null 2>>"$T/err"; then
  it() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['iteration_time_s'])" "$1/metrics.json"; }
  [ "$(it "$T/built")" = "$(it "$T/imported")" ] && ok ||
    bad "sim --import-csv: $(it "$T/imported") s, --schedule: $(it "$T/built") s"
else
  bad "sim --import-csv: $(cat "$T/err")"
fi

# --- PyTorch's default CSV (compute_comms): communication cells skipped with a note -----------
printf '%s\r\n' \
  "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0RESHARD,0REDUCE_GRAD" \
  "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1RESHARD,1REDUCE_GRAD" >"$T/pt.csv"
if "$PS" --model $MOE --directives $BS/pp2_dp2_ep2.json --mbs 2 --import-csv "$T/pt.csv" \
  --profile $UNIT --no-charts --out "$T/pt" >/dev/null 2>"$T/err"; then
  grep -q "^piper-sim: note: $T/pt.csv: skipped 14 communication cells (REDUCE_GRAD 2, UNSHARD 2" "$T/err" &&
    ok || bad "no note on the skipped cells: $(cat "$T/err")"
else
  bad "PyTorch compute_comms CSV: $(cat "$T/err")"
fi

# --- an error in an imported CSV names the CSV, row and column, not the placement file --------
# expect_csv NAME CSV-TEXT WANT: exit 2, one line, naming bad.csv and WANT, not the base file
expect_csv() {
  printf '%b' "$2" >"$T/bad.csv"
  "$PS" --model $MOE --directives $BS/pp2_dp2_ep2.json --mbs 2 --import-csv "$T/bad.csv" \
    --profile $UNIT --no-charts --out "$T/bad" >/dev/null 2>"$T/err"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$T/bad.csv: $3" "$T/err" &&
    ! grep -q "pp2_dp2_ep2.json" "$T/err"; then
    ok
  else
    bad "$1: exit $rc: $(cat "$T/err")"
  fi
}
expect_csv "repeated action" '0F0,0F1,0B0,0B1\n1F0,0F0\n' "row 2, column 2: cell \"0F0\" repeats"
expect_csv "stage on the other row" '0F0,1F0,0F1,0B0,0B1\n1F1,1B0,1B1\n' \
  "row 1, column 2 schedules stage 1, micro-batch 0, which the placement puts on pipeline rank 1 (row 2)"
expect_csv "micro-batch past the split" '0F0,0F1,0F2,0B0,0B1\n1F0,1F1,1B0,1B1\n' \
  "row 1, column 3: micro-batch 2, but the program splits into 2"
expect_csv "missing backward" '0F0,0F1,0B0\n1F0,1F1,1B0,1B1\n' "row 1 has no B (or I and W) action for stage 0, micro-batch 1"
expect_csv "malformed" '0F0,0X1\n' "row 1, column 2: cell \"0X1\" is malformed"

# --- piper-exec: --quiet, --log-every, checkpoint and resume lines, --iters in --help ---------
E=(--model $DENSE --directives "$T/one.json" --mbs 2 --no-report)
"$PE" "${E[@]}" --warmup 0 --iters 3 --quiet >"$T/q.out" 2>"$T/err"
[ $? -eq 0 ] && ! grep -q "^step" "$T/q.out" && grep -q "^piper-exec: final loss" "$T/q.out" &&
  grep -q "steps 1 to 3 (0 warm-up + 3 measured: --warmup + --iters)$" "$T/q.out" && ok || bad "--quiet: $(cat "$T/q.out" "$T/err")"
# --iters counts the measured steps; the default --warmup 1 adds one before them, and the header
# says so (issue 32: "--iters 10 runs 11 steps" with nothing saying why)
"$PE" "${E[@]}" --iters 10 --quiet >"$T/w.out" 2>"$T/err" &&
  grep -q "steps 1 to 11 (1 warm-up + 10 measured: --warmup + --iters)$" "$T/w.out" &&
  grep -q "tokens/s over 10 measured steps" "$T/w.out" && ok || bad "--iters 10: $(cat "$T/w.out" "$T/err")"
"$PE" "${E[@]}" --warmup 0 --iters 10 --log-every 4 >"$T/l.out" 2>"$T/err"
steps=$(grep "^step" "$T/l.out" | awk '{print $2}' | tr '\n' ' ')
[ "$steps" = " 1/10  4/10  8/10 10/10 " ] || [ "$steps" = "1/10 4/10 8/10 10/10 " ] && ok ||
  bad "--log-every 4 printed steps '$steps'"
[ "$(grep -c '^step .* eta [0-9]' "$T/l.out")" -eq 3 ] && ! grep -q "^step 10/10 .*eta" "$T/l.out" && ok ||
  bad "ETA on the step lines but the last: $(cat "$T/l.out")"
"$PE" "${E[@]}" --warmup 1 --iters 1 --quiet --checkpoint "$T/ck" --checkpoint-every 2 >"$T/ck.out" 2>"$T/err" &&
  grep -q "^checkpoint: step 2 written to $T/ck/step-2$" "$T/ck.out" && ok ||
  bad "checkpoint line: $(cat "$T/ck.out" "$T/err")"
"$PE" "${E[@]}" --warmup 1 --iters 3 --quiet --resume "$T/ck" >"$T/rs.out" 2>"$T/err" &&
  grep -q "^resume: from $T/ck at step 2; running steps 3 to 4 (--warmup 1 + --iters 3 count from the start of training)$" "$T/rs.out" &&
  ok || bad "resume line: $(cat "$T/rs.out" "$T/err")"
"$PE" --help | grep -q "a --resume runs the steps left to" && ok || bad "--help says nothing of --iters on resume"

# --- a schedule on a file with more stages than the model's PP regions: both counts said -------
# (issue 32: pp4_v.json has 8 stages on 4 ranks; it was reported as "the layout has 4 stages")
"$PC" --model $DENSE --directives $BS/pp4_v.json --schedule zbv --mbs 8 >/dev/null 2>"$T/err"
rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] &&
  grep -q "pp4_v.json: places 8 stages (PP 0 to 7) on 4 ranks, but the model is cut into 4 PP regions: pass --pp-regions 8" "$T/err" &&
  ok || bad "V file, too few regions: exit $rc: $(cat "$T/err")"
"$PC" --model $MOE --directives $BS/pp4_dp2_ep2_v_placement.json --pp-regions 4 --schedule 1f1b --mbs 4 >/dev/null 2>"$T/err"
rc=$?
[ "$rc" -eq 2 ] && grep -q "1f1b: needs one stage per rank .*: 2 stages on 2 ranks; the layout has 4 stages on 2 ranks$" "$T/err" &&
  ok || bad "V file, 1f1b: exit $rc: $(cat "$T/err")"

# --- --layout refuses ep on a dense model and stages that do not divide the layers (Megatron) ---
# expect_layout SPEC MODEL WANT: exit 2, one line containing WANT
expect_layout() {
  "$PC" --model "$2" --layout "$1" -o "$T/lay" >/dev/null 2>"$T/err"
  local rc=$?
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -qF -- "$3" "$T/err" && ok ||
    bad "--layout $1: exit $rc: $(cat "$T/err")"
}
expect_layout pp=2,dp=2,ep=2 $DENSE 'ep=2, but tiny-dense has no experts (a dense model): drop ep'
expect_layout pp=3 models/llama3-8b.json '"pp=3": 32 layers do not divide over 3 stages; say how to split them (first-stage-layers=N'
expect_layout pp=3,interleave=2 $DENSE '8 layers do not divide over 6 stages'
"$PC" --model models/llama3-8b.json --layout pp=3,first-stage-layers=10,last-stage-layers=10 -o "$T/lay" >/dev/null 2>"$T/err" &&
  "$PC" --model $MOE --layout pp=2,dp=2,ep=2 -o "$T/lay2" >/dev/null 2>>"$T/err" && ok ||
  bad "uneven keys / ep on a MoE refused: $(cat "$T/err")"

# --- --quiet means the same in every tool: no progress lines, the summary stays ----------------
# (piper-plan's --quiet used to drop the summary and keep the progress: --no-summary does that)
PL=(--model $DENSE --devices 4 --profile $UNIT --global-batch 16 --pp 4 --no-charts)
"$BIN/piper-plan" "${PL[@]}" --quiet --out "$T/pq" >"$T/p.out" 2>"$T/err" &&
  grep -q "^  #1 " "$T/p.out" && [ ! -s "$T/err" ] && ok || bad "plan --quiet: $(cat "$T/p.out" "$T/err")"
"$BIN/piper-plan" "${PL[@]}" --no-summary --out "$T/pn" >"$T/p.out" 2>"$T/err" &&
  [ ! -s "$T/p.out" ] && grep -q "configurations simulated" "$T/err" && ok ||
  bad "plan --no-summary: $(cat "$T/p.out" "$T/err")"
echo '{"model": "models/tiny-dense.json", "base_schedules": [{"layout": "pp=2"}], "schedules": ["1f1b"],
 "microbatches": [4], "profiles": ["profiles/unit.json"]}' >"$T/sw.json"
"$PS" --sweep "$T/sw.json" --no-charts --quiet --out "$T/sq" >"$T/s.out" 2>"$T/err" &&
  grep -q "sweep.csv" "$T/s.out" && [ ! -s "$T/err" ] && ok || bad "sim --sweep --quiet: $(cat "$T/s.out" "$T/err")"
for prog in "$BIN/piper-plan" "$PS" "$PE" "$BIN/piper-prof"; do
  "$prog" --help | grep -- "--quiet" | grep -q "no progress\|no per-step" && ok || bad "$prog --help: --quiet"
done

# --- -o DIR is --out DIR in every tool that writes a run directory ---------------------------
"$PS" --model $DENSE --layout pp=2 --mbs 4 --profile $UNIT --no-charts --quiet -o "$T/o_sim" >/dev/null 2>"$T/err" &&
  [ -s "$T/o_sim/metrics.json" ] && ok || bad "sim -o: $(cat "$T/err")"
"$BIN/piper-plan" "${PL[@]}" --quiet --no-summary -o "$T/o_plan" >/dev/null 2>"$T/err" &&
  [ -s "$T/o_plan/plan.csv" ] && ok || bad "plan -o: $(cat "$T/err")"
"$PE" --model $DENSE --directives "$T/one.json" --mbs 2 --warmup 0 --iters 1 --quiet --no-charts \
  -o "$T/o_exec" >/dev/null 2>"$T/err" && [ -s "$T/o_exec/metrics.json" ] && ok || bad "exec -o: $(cat "$T/err")"
for prog in "$PC" "$PS" "$PE" "$BIN/piper-plan" "$BIN/piper-layout" "$BIN/piper-prof"; do
  "$prog" --help | grep -q -- "-o, --out" && ok || bad "$prog --help: no -o, --out"
done

# --- docs/sim.md's sweep example runs as written: feasible rows, none failed; sweep.csv names
# its memory columns as plan.csv does (GiB) -----------------------------------------------------
sed -n '/^## What-if sweeps/,/^## Performance/p' docs/sim.md | sed -n '/^```json$/,/^```$/p' | sed '1d;$d' >"$T/doc_sweep.json"
"$PS" --sweep "$T/doc_sweep.json" --no-charts --quiet -o "$T/doc_sweep" >"$T/s.out" 2>"$T/err" &&
  grep -q "^piper-sim: sweep of 36 configurations: [1-9][0-9]* feasible, .*, 0 failed to compile$" "$T/s.out" &&
  grep -qF "$(head -n 1 "$T/s.out")" docs/sim.md && ok || bad "docs/sim.md's sweep: $(cat "$T/s.out" "$T/err")"
head -n 1 "$T/doc_sweep/sweep.csv" | grep -q ",peak_memory_gib,memory_cap_gib," &&
  head -n 1 "$T/o_plan/plan.csv" | grep -q ",peak_memory_gib,memory_cap_gib," && ok ||
  bad "memory columns: $(head -n 1 "$T/doc_sweep/sweep.csv") / $(head -n 1 "$T/o_plan/plan.csv")"

# --- README: every mpirun recipe handles Open MPI's root refusal itself (--allow-run-as-root: a
# user who copies one command needs nothing exported before it); every host mpirun recipe runs
# with more ranks than cores (--oversubscribe) ----------------------------------------------------
python3 - README.md <<'EOF' && ok || bad "README mpirun recipes"
import sys
lines = open(sys.argv[1]).read().splitlines()
runs = [(i, l) for i, l in enumerate(lines) if "mpirun -" in l or "mpirun --" in l]
assert runs, "no mpirun recipe"
for i, l in runs:
    assert "--allow-run-as-root" in l, "line %d: %s" % (i + 1, l)
    if "--backend cuda" not in l:
        assert "--oversubscribe" in l, "line %d: %s" % (i + 1, l)
EOF

echo "test_flags.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
