#!/usr/bin/env bash
# piper-compile as a user runs it: good programs compile and write plans (byte-identical across
# runs); bad input of every kind gets one line on stderr naming the fault, and exit status 2.
set -u
BIN=${PIPER_BIN:-bin}
PC="$BIN/piper-compile"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
failed=0

ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

# expect_ok NAME ARGS...: exit 0
expect_ok() {
  local name=$1; shift
  if "$PC" "$@" >"$T/out" 2>"$T/err"; then ok; else bad "$name: exit $? $(cat "$T/err")"; fi
}

# expect_bad NAME SUBSTRING ARGS...: exit 2, exactly one stderr line with the prefix and SUBSTRING
expect_bad() {
  local name=$1 want=$2; shift 2
  "$PC" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$T/err")
  if [ "$rc" -ne 2 ]; then bad "$name: exit $rc, want 2 ($(head -c 300 "$T/err"))"; return; fi
  if [ "$lines" -ne 1 ]; then bad "$name: $lines stderr lines"; return; fi
  if ! grep -q "^piper-compile: error: " "$T/err"; then bad "$name: no error prefix: $(cat "$T/err")"; return; fi
  if ! grep -qF -- "$want" "$T/err"; then bad "$name: message lacks '$want': $(cat "$T/err")"; return; fi
  ok
}

BS=directives/base-schedules
MOE=models/tiny-moe.json
DENSE=models/tiny-dense.json

# --- good input -------------------------------------------------------------------------------
expect_ok "dp-only" --model $MOE --directives $BS/dp2.json --mbs 4 -o "$T/dp2"
expect_ok "pp2_dp2_ep2" --model $MOE --base-schedule $BS/pp2_dp2_ep2.json --schedule 1f1b --ranks 2 --mbs 4 -o "$T/a" --stats
grep -q "^instructions: " "$T/out" || bad "--stats prints instruction counts"
grep -q "^note:" "$T/out" && bad "--stats notes a stream with the default streams"
# issue 14: all-to-all and pipeline traffic on one named stream: one note naming it and its cost
python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for x in d:
    if x['op'] in ('place', 'shard'):
        x['stream'] = 'one'
json.dump(d, open(sys.argv[2], 'w'))" $BS/pp2_dp2_ep2.json "$T/one.json"
expect_ok "one stream" --model $MOE --directives "$T/one.json" --schedule dualpipe --ranks 2 --mbs 4 --stats
[ "$(grep -c '^note: stream "one" carries more than one kind of communication' "$T/out")" -eq 1 ] \
  && grep -q "MiB a step" "$T/out" && ok || bad "--stats: no note for one shared stream: $(cat "$T/out")"
[ -f "$T/a/plan.json" ] && [ -f "$T/a/device-3.json" ] && [ -f "$T/a/1f1b_pp2_mbs4.json" ] && ok || bad "plan files written"
expect_ok "pp2_dp2_ep2 again" --model $MOE --base-schedule $BS/pp2_dp2_ep2.json --schedule 1f1b --ranks 2 --mbs 4 -o "$T/b"
diff -r "$T/a" "$T/b" >/dev/null && ok || bad "plans are not byte-identical across runs"
expect_ok "dump" --model $MOE --directives $BS/pp2_dp2_ep2_zero3.json --dump-ir "$T/ir.json" --dump-dot "$T/ir.dot"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['nodes'] and d['edges']" "$T/ir.json" && ok || bad "--dump-ir is not valid JSON"
grep -q "^digraph piper" "$T/ir.dot" && ok || bad "--dump-dot is not DOT"
expect_ok "deepseek 2048" --model models/deepseek-v3.json --pp-regions 32 \
  --directives $BS/deepseek_v3_pp32_v_dp128_ep128.json --schedule dualpipev --mbs 32
grep -q "2048 devices" "$T/out" && ok || bad "deepseek-v3 compiles to 2048 devices: $(cat "$T/out")"
expect_ok "csv export" --model $MOE --pp-regions 4 --directives $BS/pp4_dp2_ep2_v_placement.json \
  --schedule dualpipev --mbs 8 --export-csv "$T/dpv.csv"
expect_ok "csv import" --model $MOE --pp-regions 4 --directives $BS/pp4_dp2_ep2_v_placement.json \
  --mbs 8 --import-csv "$T/dpv.csv" --export-csv "$T/dpv2.csv"
cmp -s "$T/dpv.csv" "$T/dpv2.csv" && ok || bad "CSV export -> import -> export is not lossless"
# an imported schedule must account for every rank and action, and be text to its end
V4="--model $MOE --pp-regions 4 --directives $BS/pp4_dp2_ep2_v_placement.json --mbs 8"
head -n 1 "$T/dpv.csv" >"$T/onerow.csv"
expect_bad "csv row missing" "onerow.csv: 1 rows, but the placement has 2 pipeline ranks" $V4 --import-csv "$T/onerow.csv"
sed '2s/,[^,]*$//' "$T/dpv.csv" >"$T/lastcut.csv"
expect_bad "csv action missing" "every action of the pipeline must be scheduled" $V4 --import-csv "$T/lastcut.csv"
{ head -c 20 "$T/dpv.csv"; printf '\0'; tail -c +21 "$T/dpv.csv"; } >"$T/nul.csv"
expect_bad "csv NUL byte" "nul.csv: row 1, column" $V4 --import-csv "$T/nul.csv"
# DualPipe with ZeRO-1/2 compiles (each copy shards over its own replica group: a
# reduce-scatter per copy after an all-reduce per position); ZeRO-3 is refused in one line
"$PC" --model $MOE --layout pp=2,dp=2,zero=1 --schedule dualpipe --mbs 4 -o "$T/dpz1" >/dev/null 2>"$T/err" &&
  python3 -c "
import json, sys
p = json.load(open(sys.argv[1] + '/plan.json'))
groups = {g['id']: g['devices'] for g in p['groups']}
got = sorted((n['kind'], tuple(groups[n['group']])) for n in p['nodes']
             if n['kind'] in ('all_reduce', 'reduce_scatter', 'all_gather'))
# per stage: the copies' sum over both copies' devices (one communicator split into the
# positions 0+2 and 1+3), a reduce-scatter and a gather per copy
want = sorted([(k, g) for k, gs in (('all_reduce', [(0, 1, 2, 3)]),
                                    ('reduce_scatter', [(0, 1), (2, 3)]),
                                    ('all_gather', [(0, 1), (2, 3)])) for g in gs] * 2)
assert got == want, got
splits = sorted((tuple(groups[c['group']]), c.get('split')) for c in p['communicators']
                if c['purpose'] == 'dp')
assert splits == [((0, 1), None), ((0, 1, 2, 3), 2), ((2, 3), None)], splits
" "$T/dpz1" && ok || bad "dualpipe zero1: $(cat "$T/err")"
# DualPipe at 2,048 devices keeps one program per pipeline rank: the experts' copies are summed
# by one communicator split into positions, not by 128 pair groups that made every device's
# program its own (2,048 programs, 94.6 s to simulate against 5.5 s for DualPipeV, 2026-12-07)
"$PC" --model models/deepseek-v3.json --layout pp=16,dp=128,ep=128,zero=1,first-stage-layers=4 --schedule dualpipe --mbs 32 --stats \
  2>&1 | grep -q "over 2048 devices (16 distinct programs)" && ok || bad "dualpipe at 2048 devices: not 16 programs"
# DeepSeek-V3's published layouts with expert groups carved from the stage (EP 64 inside DP
# 128, DualPipe and DualPipeV; TP 2 x EP 64 with expert TP 1, DP 32) stay one program per
# pipeline rank, the DP 128 ones with their all-to-alls over blocks of 64 (an ep communicator
# with "block": 64) and the experts' sums over pairs ("split": 64)
for l in "pp=16,dp=128,ep=64,zero=1,recompute=full,first-stage-layers=4 --schedule dualpipe 2048" \
  "pp=16,dp=128,ep=64,zero=1,recompute=full,v,first-stage-layers=2 --schedule dualpipev 2048" \
  "pp=16,dp=32,tp=2,sp,ep=64,etp=1,zero=1,recompute=full,first-stage-layers=4 --schedule 1f1b 1024"; do
  set -- $l
  rm -rf "$T/ds"
  "$PC" --model models/deepseek-v3.json --layout $1 $2 $3 --mbs 32 --stats -o "$T/ds" >"$T/out" 2>&1 &&
    grep -q "over $4 devices (16 distinct programs)" "$T/out" &&
    python3 -c "import json, sys; c = json.load(open(sys.argv[1]))['communicators']
ep = [x for x in c if x['purpose'] == 'ep']; dp = [x for x in c if x['purpose'] == 'dp' and x.get('split') == 64]
sys.exit(not ep or (sys.argv[2] == '2048') != (all(x.get('block') == 64 for x in ep) and bool(dp)))" "$T/ds/plan.json" $4 &&
    ok || bad "DeepSeek-V3 --layout $1: $(tail -2 "$T/out")"
done
expect_bad "dualpipe zero3" "copies of a ZeRO-3 (shard_params) segment on two device groups" --model $MOE --layout pp=2,dp=2,zero=3 --schedule dualpipe --mbs 4
tac "$T/dpv.csv" >"$T/swapped.csv"
expect_bad "csv rows swapped" "which the placement puts on pipeline rank" $V4 --import-csv "$T/swapped.csv"
sed '0,/"hidden_size"/s//"hidden_size": 32, "hidden_size"/' $DENSE >"$T/dupmodel.json"
expect_bad "model with a key twice" 'dupmodel.json: key "hidden_size" appears twice' --model "$T/dupmodel.json" --directives $BS/dp2.json
mkfifo "$T/fifo.json"
expect_bad "FIFO directives without a writer: an error, no hang" "fifo.json: a pipe with nothing written to it" --model $MOE --directives "$T/fifo.json"
expect_bad "FIFO model without a writer: an error, no hang" "fifo.json: a pipe with nothing written to it" --model "$T/fifo.json" --directives $BS/dp2.json
expect_bad "a directory is refused" "not a regular file" --model $MOE --directives "$T"
# process substitution: a pipe with a writer is read to its end
"$PC" --model $MOE --directives <(cat $BS/dp2.json) >"$T/out" 2>"$T/err" && grep -q "2 devices" "$T/out" &&
  ok || bad "--directives <(...): $(cat "$T/out" "$T/err")"
expect_bad "csv micro-batches" "but the program splits into 4" --model $MOE --pp-regions 4 \
  --directives $BS/pp4_dp2_ep2_v_placement.json --mbs 4 --import-csv "$T/dpv.csv"
"$PC" --help | grep -q -- "--base-schedule" && ok || bad "--help"
"$PC" --version | grep -q "^piper-compile " && ok || bad "--version"

# --- bad input: 24 cases, each exit 2 with one line naming the fault ---------------------------
printf '[{"op": "place", "filter": {"PP": 0}, "devices": [0]},\n {"op": "place" "filter": {}}]' >"$T/malformed.json"
expect_bad "malformed JSON" "malformed.json:2:17: malformed JSON" --model $MOE --directives "$T/malformed.json"
echo '{"op":"place"}' >"$T/notarray.json"
expect_bad "root not an array" "notarray.json" --model $MOE --directives "$T/notarray.json"
echo '[{"op":"plase","filter":{},"devices":[0]}]' >"$T/op.json"
expect_bad "unknown op" 'unknown op "plase"' --model $MOE --directives "$T/op.json"
echo '[{"op":"place","filter":{},"devices":[0],"colour":1}]' >"$T/key.json"
expect_bad "unknown key" '"colour"' --model $MOE --directives "$T/key.json"
echo '[{"op":"place","filter":{},"devices":"0"}]' >"$T/type.json"
expect_bad "wrong type" 'directive 0 (place): "devices"' --model $MOE --directives "$T/type.json"
echo '[{"op":"place","filter":{},"devices":[]}]' >"$T/empty.json"
expect_bad "empty devices" '"devices"' --model $MOE --directives "$T/empty.json"
echo '[{"op":"place","filter":{"PP":0},"devices":[-1]}]' >"$T/neg.json"
expect_bad "negative device" '"devices[0]" = -1' --model $MOE --directives "$T/neg.json"
echo '[{"op":"place","filter":{"PP":0},"devices":[0]},{"op":"place","filter":{"PP":1},"devices":[9]}]' >"$T/range.json"
expect_bad "device out of range" "out of range" --model $MOE --directives "$T/range.json" --devices 4
echo '[{"op":"place","filter":{"LAYER":0},"devices":[0]}]' >"$T/tag.json"
expect_bad "filter key no tag" 'filter key "LAYER" is not a tag' --model $MOE --directives "$T/tag.json"
echo '[{"op":"place","filter":{"PP":5},"devices":[0]}]' >"$T/nothing.json"
expect_bad "filter matches nothing" 'matches nothing' --model $MOE --directives "$T/nothing.json"
echo '[{"op":"replicate","filter":{"PP":0},"devices":[0,1]},{"op":"place","filter":{"PP":1},"devices":[2]}]' >"$T/sizes.json"
expect_bad "unequal group sizes" 'equal sizes' --model $MOE --directives "$T/sizes.json"
echo '[{"op":"split","filter":{},"dim_name":"MB","num_microbatches":0}]' >"$T/split0.json"
expect_bad "split count 0" '"num_microbatches"' --model $MOE --directives "$T/split0.json"
echo '[{"op":"split","filter":{},"dim_name":"MB","num_microbatches":1000000000}]' >"$T/split9.json"
expect_bad "absurd split count" '"num_microbatches"' --model $MOE --directives "$T/split9.json"
echo '[{"op":"split","filter":{},"dim_name":"MB","num_microbatches":2.5}]' >"$T/splitf.json"
expect_bad "fractional split count" '"num_microbatches"' --model $MOE --directives "$T/splitf.json"
python3 -c "print('[{\"op\":\"place\",\"filter\":{},\"devices\":[' + ','.join(str(i) for i in range(10**7)) + ']}]')" >"$T/huge.json"
expect_bad "10^7-device list" "huge.json" --model $MOE --directives "$T/huge.json"
cat >"$T/cycle.json" <<'EOF'
[{"op":"place","filter":{"PP":0},"devices":[0]},{"op":"place","filter":{"PP":1},"devices":[1]},
 {"op":"split","filter":{},"dim_name":"MB","num_microbatches":2},
 {"op":"order","filters":[[{"PP":0,"MB":0,"PASS":"B"}],[{"PP":0,"MB":0,"PASS":"F"}]]}]
EOF
expect_bad "order against dataflow" 'directive 3 (order): the order creates a cycle' --model $MOE --directives "$T/cycle.json"
cat >"$T/span.json" <<'EOF'
[{"op":"place","filter":{"PP":0},"devices":[0]},{"op":"place","filter":{"PP":1},"devices":[1]},
 {"op":"split","filter":{},"dim_name":"MB","num_microbatches":2},
 {"op":"order","filters":[[{"PP":0,"MB":0,"PASS":"F"}],[{"PP":1,"MB":0,"PASS":"F"}]]}]
EOF
expect_bad "order spans groups" 'spans device groups' --model $MOE --directives "$T/span.json"
cat >"$T/bi.json" <<'EOF'
[{"op":"split","filter":{},"dim_name":"MB","num_microbatches":2},
 {"op":"order","filters":[[{"PP":1,"MB":0,"PASS":"F"}],[{"PP":1,"MB":0,"PASS":"BI"}]]}]
EOF
expect_bad "BI without BW" 'no later group has its BW' --model $MOE --directives "$T/bi.json"
echo '[{"op":"order","filters":[[{"PP":0,"PASS":"X"}],[{"PP":0}]]}]' >"$T/pass.json"
expect_bad "bad PASS" '"PASS"' --model $MOE --directives "$T/pass.json"
echo '[{"op":"order","filters":[[{"PP":0}]]}]' >"$T/oneslot.json"
expect_bad "order with one group" '"filters"' --model $MOE --directives "$T/oneslot.json"
expect_bad "schedule needs micro-batches" "dualpipev" --model $MOE --pp-regions 4 \
  --directives $BS/pp4_dp2_ep2_v_placement.json --schedule dualpipev --mbs 2
expect_bad "ranks mismatch" "4 ranks was asked" --model $MOE --directives $BS/pp2_dp2_ep2.json --schedule 1f1b --ranks 4 --mbs 4
expect_bad "unknown schedule" 'unknown schedule "2f2b"' --model $MOE --directives $BS/dp2.json --schedule 2f2b
expect_bad "missing model file" "nonexistent.json" --model "$T/nonexistent.json" --directives $BS/dp2.json
echo '{"model_type":"llama","hidden_size":64}' >"$T/model.json"
expect_bad "model missing keys" "model.json" --model "$T/model.json" --directives $BS/dp2.json
expect_bad "bad --mbs" "--mbs" --model $MOE --directives $BS/dp2.json --mbs 0
expect_bad "bad --pp-regions" "--pp-regions 99" --model $MOE --directives $BS/dp2.json --pp-regions 99
expect_bad "unknown option" "--frobnicate" --model $MOE --directives $BS/dp2.json --frobnicate

# --- plans past 2,048 devices: plan.json and one class-<k>.json per class -----------------------
# The directory's files and bytes do not grow with the devices (plan.json's device lists aside);
# piper-sim --plans gives the in-process figures; piper-exec --plans reads it (and then asks for
# one process per device, which this machine cannot launch).
PS="$BIN/piper-sim"
PE="$BIN/piper-exec"
for dp in 1100 2200; do
  expect_ok "compact layout dp=$dp" --model $DENSE --layout pp=2,dp=$dp --schedule 1f1b --mbs 4 -o "$T/big$dp"
done
files() { find "$1" -type f ! -name plan.json ! -name '1f1b_*' | wc -l; }
bytes() { find "$1" -type f ! -name plan.json ! -name '1f1b_*' -printf '%s\n' | awk '{s += $1} END {print s}'; }
if [ "$(files "$T/big1100")" -eq 2 ] && [ "$(files "$T/big2200")" -eq 2 ] &&
  [ -f "$T/big2200/class-1.json" ] && [ ! -e "$T/big2200/device-0.json" ] &&
  grep -q '"layout": "classes"' "$T/big2200/plan.json"; then ok; else bad "compact layout files: $(ls "$T/big2200" | head)"; fi
b1=$(bytes "$T/big1100"); b2=$(bytes "$T/big2200")
[ "$b2" -le $((b1 + b1 / 50)) ] && ok || bad "class files grew with the devices: $b1 -> $b2 bytes"
figures() { grep -E '^  (iteration|throughput|bubble|peak memory|simulated) ' | sed 's/ in [0-9.]* s;/;/'; }
"$PS" --plans "$T/big2200" --profile profiles/unit.json --out "$T/bigsim" --no-charts 2>"$T/err" | figures >"$T/fromdisk"
"$PS" --model $DENSE --layout pp=2,dp=2200 --schedule 1f1b --mbs 4 --profile profiles/unit.json \
  --out "$T/bigsim2" --no-charts 2>>"$T/err" | figures >"$T/inproc"
[ -s "$T/fromdisk" ] && [ "$(wc -l <"$T/fromdisk")" -eq 5 ] && diff "$T/fromdisk" "$T/inproc" >/dev/null &&
  ok || bad "piper-sim --plans on the compact layout: $(cat "$T/err") $(diff "$T/fromdisk" "$T/inproc")"
"$PE" --plans "$T/big2200" --iters 1 --out "$T/bigrun" --quiet --no-charts 2>"$T/err"
grep -q "the plan has 4400 devices but the job has 1 processes" "$T/err" &&
  ok || bad "piper-exec --plans on the compact layout: $(cat "$T/err")"
# Written again over a per-device directory: no device file of the old plan is left behind.
expect_ok "small plan" --model $DENSE --layout pp=2,dp=2 --schedule 1f1b --mbs 4 -o "$T/big1100"
expect_ok "compact over small" --model $DENSE --layout pp=2,dp=1100 --schedule 1f1b --mbs 4 -o "$T/big1100"
[ "$(files "$T/big1100")" -eq 2 ] && ok || bad "stale files after rewriting: $(ls "$T/big1100" | head)"

echo "test_compile.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
