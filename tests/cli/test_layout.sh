#!/usr/bin/env bash
# Layouts from flags: piper-layout writes the bundled rank-order base schedules byte for byte,
# --layout compiles and simulates exactly like the same program given as a file, and bad specs
# are one line with exit 2.
set -u
BIN=${PIPER_BIN:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
BS=directives/base-schedules

for c in "dp=2 dp2" "pp=4 pp4" "pp=8 pp8" "pp=4,v pp4_v" "pp=4,interleave=2 pp4_interleaved" \
  "pp=2,dp=2,ep=2 pp2_dp2_ep2" "pp=2,dp=2,ep=2,zero=1 pp2_dp2_ep2_zero1" "pp=2,dp=2,ep=2,zero=2 pp2_dp2_ep2_zero2" "pp=2,dp=2,ep=2,zero=3 pp2_dp2_ep2_zero3"; do
  set -- $c
  "$BIN/piper-layout" "$1" | cmp -s - "$BS/$2.json" && ok || bad "piper-layout $1 differs from $2.json"
done
"$BIN/piper-layout" pp=2,dp=2,ep=2,v -o "$T/v.json" 2>"$T/err" && [ -s "$T/v.json" ] && grep -q "use --pp-regions 4" "$T/err" && ok || bad "piper-layout -o"

# --layout = --directives of the file it writes, with the PP regions it implies
sim() { "$BIN/piper-sim" --profile profiles/h100-sxm.json --no-charts --quiet "$@"; }
sim --model models/tiny-moe.json --layout pp=2,dp=2,ep=2,v --schedule dualpipev --mbs 8 --out "$T/a" &&
  sim --model models/tiny-moe.json --directives "$T/v.json" --pp-regions 4 --schedule dualpipev --mbs 8 --out "$T/b" &&
  cmp -s "$T/a/results.csv" "$T/b/results.csv" && ok || bad "--layout simulates like its file"
"$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2,dp=2,ep=2 --schedule 1f1b --mbs 4 -o "$T/p1" >/dev/null &&
  "$BIN/piper-compile" --model models/tiny-moe.json --directives $BS/pp2_dp2_ep2.json --schedule 1f1b --mbs 4 -o "$T/p2" >/dev/null &&
  diff -r "$T/p1" "$T/p2" >/dev/null && ok || bad "--layout compiles to the bundled file's plans"

# expert groups carved from the stage survive the plan files: --plans simulates like --layout
# (the schedule's name aside), block and split of their communicators included
"$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2,tp=2,dp=4,ep=2,sp,zero=1 --schedule 1f1b --mbs 4 -o "$T/ep_p" >/dev/null &&
  sim --plans "$T/ep_p" --out "$T/ep_a" && sim --model models/tiny-moe.json --layout pp=2,tp=2,dp=4,ep=2,sp,zero=1 --schedule 1f1b --mbs 4 --out "$T/ep_b" &&
  [ "$(cut -d, -f4- "$T/ep_a/results.csv")" = "$(cut -d, -f4- "$T/ep_b/results.csv")" ] &&
  grep -q '"block":4' "$T/ep_p/plan.json" && ok || bad "carved expert groups: --plans differs from --layout"

expect_bad() {
  local want=$1; shift
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -qF -- "$want" "$T/err"; then
    bad "$* : exit $rc, $(cat "$T/err")"
  else ok; fi
}
# uneven stages: the layer counts reach the plan (its model's pp_layers) and the reports (each
# stage's layers in metrics.json); Llama-3.1-405B's 126 layers and DeepSeek-V3's 61 over 16
# stages compile and simulate
layers() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['model']['piper']['pp_layers'])" "$1/plan.json"; }
"$BIN/piper-compile" --model models/tiny-dense.json --layout pp=2,stage-layers=3+5 --schedule 1f1b --mbs 4 -o "$T/u1" >/dev/null &&
  [ "$(layers "$T/u1")" = "[3, 5]" ] && ok || bad "stage-layers=3+5: $(layers "$T/u1")"
"$BIN/piper-compile" --model models/tiny-dense.json --layout pp=4,first-stage-layers=1,last-stage-layers=3 --schedule 1f1b --mbs 4 -o "$T/u2" >/dev/null &&
  [ "$(layers "$T/u2")" = "[1, 2, 2, 3]" ] && ok || bad "first/last-stage-layers: $(layers "$T/u2")"
"$BIN/piper-compile" --model models/tiny-dense.json --layout pp=2,v,account-for-embedding,account-for-loss --schedule dualpipev --mbs 4 -o "$T/u3" >/dev/null &&
  [ "$(layers "$T/u3")" = "[2, 3, 2, 1]" ] && ok || bad "account-for-embedding/loss: $(layers "$T/u3")"
stage_layers() { python3 -c "import json,sys; m = json.load(open(sys.argv[1])); print(m.get('stage_layers'), sorted({d['layers'] for d in m['devices']}))" "$1/metrics.json"; }
sim --model models/llama3.1-405b.json --layout pp=16,interleave=2,tp=8,dp=64,sp,account-for-embedding,account-for-loss \
  --schedule interleaved_1f1b --mbs 32 --out "$T/l405" &&
  [ "$(stage_layers "$T/l405")" = "[3$(printf ', 4%.0s' $(seq 30)), 3] [7, 8]" ] && ok ||
  bad "405B over 16 x 2 stages: $(stage_layers "$T/l405")"
sim --model models/llama3.1-405b.json --layout pp=16,first-stage-layers=7,last-stage-layers=7 --schedule 1f1b --mbs 16 --out "$T/l405b" &&
  [ "$(stage_layers "$T/l405b")" = "[7$(printf ', 8%.0s' $(seq 14)), 7] [7, 8]" ] && ok ||
  bad "405B first/last 7: $(stage_layers "$T/l405b")"
sim --model models/deepseek-v3.json --layout pp=16,dp=2,ep=2,first-stage-layers=2,last-stage-layers=3 --schedule 1f1b --mbs 16 --out "$T/dsv3" &&
  [ "$(stage_layers "$T/dsv3")" = "[2$(printf ', 4%.0s' $(seq 14)), 3] [2, 3, 4]" ] && ok ||
  bad "DeepSeek-V3 61 over 16: $(stage_layers "$T/dsv3")"
# an equal split adds nothing to the reports
sim --model models/tiny-dense.json --layout pp=2 --schedule 1f1b --mbs 4 --out "$T/eq" &&
  python3 -c "import json,sys; m = json.load(open(sys.argv[1])); sys.exit('stage_layers' in m or any('layers' in d for d in m['devices']))" "$T/eq/metrics.json" &&
  ok || bad "an equal split reports stage layers"
expect_bad "sums to 7 but the model has 8 layers" "$BIN/piper-compile" --model models/tiny-dense.json --layout pp=2,stage-layers=3+4
expect_bad "gives stage 1 no layer" "$BIN/piper-sim" --model models/tiny-dense.json --layout pp=2,stage-layers=8+0 --profile profiles/unit.json
expect_bad "has 2 entries for 4 stages" "$BIN/piper-layout" pp=2,v,stage-layers=3+5
expect_bad '"first-stage-layers" must be a whole number in [1, 4096]' "$BIN/piper-layout" pp=4,first-stage-layers=0
expect_bad "stage 7 would hold no decoder layer" "$BIN/piper-compile" --model models/tiny-dense.json --layout pp=8,account-for-embedding,account-for-loss
expect_bad "more than the model's 8 layers" "$BIN/piper-compile" --model models/tiny-dense.json --layout pp=4,first-stage-layers=5,last-stage-layers=4
expect_bad "need at least 2 stages" "$BIN/piper-layout" pp=1,last-stage-layers=2
expect_bad "excludes first-stage-layers" "$BIN/piper-layout" pp=2,stage-layers=3+5,account-for-loss
expect_bad 'unknown key "xp"' "$BIN/piper-layout" pp=2,xp=2
# context parallelism: the CP ranks replicate each stage (TP, CP, DP, PP order) and one
# context_parallel directive says how K/V travel
"$BIN/piper-layout" pp=2,tp=2,cp=2 | grep -q '"filter": {"PP": 1}, "devices": \[4, 5, 6, 7\]}' &&
  "$BIN/piper-layout" pp=2,cp=2,cp-comm=all_gather | grep -q '"op": "context_parallel", "degree": 2, "comm": "all_gather"' &&
  ok || bad "piper-layout pp=2,tp=2,cp=2"
# cp=1 changes nothing: the plans are byte-identical to the layout without it
"$BIN/piper-compile" --model models/tiny-dense.json --layout pp=2,dp=2,tp=2,cp=1 --schedule 1f1b --mbs 4 -o "$T/cp1" >/dev/null &&
  "$BIN/piper-compile" --model models/tiny-dense.json --layout pp=2,dp=2,tp=2 --schedule 1f1b --mbs 4 -o "$T/cp0" >/dev/null &&
  diff -r "$T/cp1" "$T/cp0" >/dev/null && ok || bad "cp=1 changed the plans"
expect_bad "cuts each sequence into 6 chunks, but tiny-dense's seq_len 32 is not divisible by 6" "$BIN/piper-compile" --model models/tiny-dense.json --layout cp=3
expect_bad '"cp-comm" must be p2p' "$BIN/piper-layout" cp=2,cp-comm=ring
# Llama-3-70B as the vendors lay it out: TP 4 x PP 4 x CP 2, 5 virtual stages per rank
sim --model models/llama3-70b.json --layout tp=4,sp,pp=4,cp=2,interleave=5,zero=1 --schedule interleaved_1f1b --mbs 8 --out "$T/cp70" &&
  python3 -c "import json,sys; m = json.load(open(sys.argv[1])); sys.exit(not (m['cp'] == 2 and m['n_devices'] == 32 and m['dp'] == 2))" "$T/cp70/metrics.json" &&
  ok || bad "Llama-3-70B tp=4,pp=4,cp=2,interleave=5"
expect_bad "ep=3 x etp=1 (etp defaults to tp) does not divide the 4 ranks of a stage" "$BIN/piper-layout" pp=2,dp=4,ep=3
expect_bad "etp=1 below tp=2 needs sp" "$BIN/piper-layout" pp=2,tp=2,dp=2,ep=4,etp=1
expect_bad "\"degree\": 8 experts do not divide evenly over 16 EP ranks" "$BIN/piper-compile" --model models/tiny-moe.json --layout tp=2,dp=8,ep=16,etp=1,sp
expect_bad "\"degree\": 8 experts do not divide evenly over 16 EP ranks" "$BIN/piper-compile" --model models/tiny-moe.json --layout dp=32,ep=16
expect_bad "give a layout" "$BIN/piper-layout"
# the same rules on a shard written by hand: one line naming the directive
printf '[{"op": "replicate", "filter": {}, "devices": [0, 1, 2, 3]},\n {"op": "shard", "filter": {"EP": "*"}, "devices": [0, 1, 2, 3], "degree": 8}]\n' >"$T/ep3.json"
expect_bad 'directive 1 (shard): "degree" 8 x expert_tensor_parallel 1 = 8 does not divide the 4 devices' "$BIN/piper-compile" --model models/tiny-moe.json --directives "$T/ep3.json"
printf '[{"op": "replicate", "filter": {}, "devices": [0, 1, 2, 3]},\n {"op": "shard", "filter": {"EP": "*"}, "devices": [0, 1, 2, 3], "degree": 2, "expert_tensor_parallel": 1},\n {"op": "tensor_parallel", "filter": {}, "degree": 2}]\n' >"$T/etp.json"
expect_bad 'directive 1 (shard): "expert_tensor_parallel" 1 below the tensor-parallel degree 2 needs sequence_parallel' "$BIN/piper-compile" --model models/tiny-moe.json --directives "$T/etp.json"
expect_bad "--layout replaces --directives" "$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2 --directives $BS/dp2.json
expect_bad "disagrees with --layout" "$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2,v --pp-regions 3
expect_bad "interleave and v exclude each other" "$BIN/piper-sim" --model models/tiny-moe.json --layout pp=2,v,interleave=2 --profile profiles/unit.json

echo "test_layout.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
