#!/usr/bin/env bash
# A plan directory whose embedded model was edited after piper-compile wrote it (layers, hidden
# size, vocabulary, experts, sequence length, micro-batch size) or whose n_microbatches was
# edited disagrees with its nodes: piper-sim --plans and piper-exec --plans
# exit 2 with one line naming plan.json and what disagrees. The untouched plans still load.
set -u
BIN=${PIPER_BIN:-bin}
PC="$BIN/piper-compile"
PS="$BIN/piper-sim"
PE="$BIN/piper-exec"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

echo '[]' >"$T/one.json"
"$PC" --model models/tiny-moe.json --directives "$T/one.json" --mbs 2 -o "$T/one" >/dev/null 2>"$T/err" ||
  bad "compile one device: $(cat "$T/err")"
"$PC" --model models/tiny-moe.json --directives directives/base-schedules/pp2_dp2_ep2.json \
  --schedule 1f1b --mbs 4 -o "$T/four" >/dev/null 2>"$T/err" || bad "compile pp2_dp2_ep2: $(cat "$T/err")"

# expect_refused NAME DIR CMD...: exit 2, one stderr line naming DIR/plan.json and the model
# (or $WANT)
expect_refused() {
  local name=$1 dir=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne 2 ]; then bad "$name: exit $rc, want 2 ($(head -c 300 "$T/err"))"; return; fi
  if [ "$(wc -l <"$T/err")" -ne 1 ]; then bad "$name: $(wc -l <"$T/err") stderr lines: $(cat "$T/err")"; return; fi
  grep -q "$dir/plan.json: .*${WANT:-model}" "$T/err" && ok || bad "$name: $(cat "$T/err")"
}

# edit SRC KEY VALUE: a copy of plan directory SRC with model[KEY] = VALUE, in $T/edited
edit() {
  rm -rf "$T/edited"
  cp -r "$1" "$T/edited"
  python3 - "$T/edited/plan.json" "$2" "$3" <<'PY'
import json, sys
path, key, value = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = json.load(open(path))
obj = plan["model"]
*parents, key = key.split(".")  # piper.seq_len: a key of the model's "piper" object
for k in parents:
    obj = obj[k]
assert key in obj, key
obj[key] = value
json.dump(plan, open(path, "w"), indent=1)
PY
}

"$PS" --plans "$T/four" --profile profiles/unit.json --out "$T/sim" --no-charts >/dev/null 2>"$T/err" &&
  ok || bad "untouched plan: $(cat "$T/err")"
for edit_ in num_hidden_layers=6 hidden_size=128 vocab_size=512 num_experts=16 num_experts=4; do
  key=${edit_%=*} value=${edit_#*=}
  edit "$T/four" "$key" "$value"
  expect_refused "sim, 4 devices, $edit_" "$T/edited" \
    "$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim" --force --no-charts
  edit "$T/one" "$key" "$value"
  expect_refused "sim, one device, $edit_" "$T/edited" \
    "$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim" --force --no-charts
  expect_refused "exec, one device, $edit_" "$T/edited" \
    "$PE" --plans "$T/edited" --iters 1 --out "$T/run" --quiet --no-charts
done
# A dense pipeline shows sequence length and micro-batch size only in what its stages send.
"$PC" --model models/tiny-dense.json --directives directives/base-schedules/pp4.json --pp-regions 4 \
  --schedule 1f1b --mbs 4 -o "$T/dense" >/dev/null 2>"$T/err" || bad "compile pp4: $(cat "$T/err")"
for edit_ in piper.seq_len=64 piper.micro_batch_size=4; do
  key=${edit_%=*} value=${edit_#*=}
  edit "$T/dense" "$key" "$value"
  expect_refused "sim, dense pp4, $edit_" "$T/edited" \
    "$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim" --force --no-charts
done
grep -q "the model's activations there are" "$T/err" && ok || bad "p2p message: $(cat "$T/err")"
# One device and data parallelism alone show sequence length and micro-batch size in no
# transfer: the compute instructions' workspaces carry them. n_microbatches is what the split
# tags number.
"$PC" --model models/tiny-dense.json --directives directives/base-schedules/dp2.json --mbs 2 \
  -o "$T/dp2" >/dev/null 2>"$T/err" || bad "compile dp2: $(cat "$T/err")"
for dir in one dp2; do
  for edit_ in piper.seq_len=64 piper.micro_batch_size=4 piper.seq_len=16; do
    key=${edit_%=*} value=${edit_#*=}
    edit "$T/$dir" "$key" "$value"
    expect_refused "sim, $dir, $edit_" "$T/edited" \
      "$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim" --force --no-charts
    [ "$dir" = one ] && expect_refused "exec, $dir, $edit_" "$T/edited" \
      "$PE" --plans "$T/edited" --iters 1 --out "$T/run" --quiet --no-charts
  done
  grep -q '"work" tensors hold' "$T/err" && ok || bad "work message: $(cat "$T/err")"
  for m in 5 1 3; do
    rm -rf "$T/edited" && cp -r "$T/$dir" "$T/edited"
    python3 - "$T/edited/plan.json" "$m" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
plan["n_microbatches"] = int(sys.argv[2])
json.dump(plan, open(sys.argv[1], "w"), indent=1)
PY
    WANT=n_microbatches expect_refused "sim, $dir, n_microbatches=$m" "$T/edited" \
      "$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim" --force --no-charts
    [ "$dir" = one ] && WANT=n_microbatches expect_refused "exec, $dir, n_microbatches=$m" "$T/edited" \
      "$PE" --plans "$T/edited" --iters 1 --out "$T/run" --quiet --no-charts
  done
done
# Sequence length x micro-batch size kept (64 x 1 for 32 x 2): every workspace is linear in the
# product, so the edited plan is the one piper-compile writes for the edited model (only the
# model differs); it is accepted and simulates as that model's own plan does.
edit "$T/dense" piper.seq_len 64
python3 - "$T/edited/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
plan["model"]["piper"]["micro_batch_size"] = 1
json.dump(plan, open(sys.argv[1], "w"), indent=1)
PY
python3 - "$T/m64.json" <<'PY'
import json, sys
m = json.load(open("models/tiny-dense.json"))
m["piper"]["seq_len"], m["piper"]["micro_batch_size"] = 64, 1
json.dump(m, open(sys.argv[1], "w"))
PY
"$PC" --model "$T/m64.json" --directives directives/base-schedules/pp4.json --pp-regions 4 \
  --schedule 1f1b --mbs 4 -o "$T/dense64" >/dev/null 2>"$T/err" || bad "compile seq 64: $(cat "$T/err")"
"$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim_e" --force --no-charts >/dev/null 2>"$T/err" ||
  bad "product kept: $(cat "$T/err")"
"$PS" --plans "$T/dense64" --profile profiles/unit.json --out "$T/sim_c" --force --no-charts >/dev/null 2>&1
cmp -s "$T/sim_e/trace.json" "$T/sim_c/trace.json" && ok || bad "product kept: trace differs from the compiled model's"
# A byte count of one node edited on its own (the model untouched) is named too.
python3 - "$T/four/plan.json" "$T/bytes.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
n = next(n for n in plan["nodes"] if n["kind"] == "all_to_all")
n["bytes"] += 4
json.dump(plan, open(sys.argv[2], "w"), indent=1)
PY
rm -rf "$T/edited" && cp -r "$T/four" "$T/edited" && cp "$T/bytes.json" "$T/edited/plan.json"
expect_refused "sim, all-to-all bytes" "$T/edited" \
  "$PS" --plans "$T/edited" --profile profiles/unit.json --out "$T/sim" --force --no-charts

echo "test_plan_model.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
