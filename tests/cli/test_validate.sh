#!/usr/bin/env bash
# The validation suite (validation/runs.json, tools/validate.py, docs/validation.md): the table
# of published runs regenerates and meets the issue's targets (dense within 10%, median 5%; MoE
# 20%, median 10%; MFU ordered by model size as published) but for the misses the file marks
# known, each with its reason; a miss not marked, or a mark whose miss is gone, fails the
# check; a run whose configuration does not add up is bad input (one line, exit 2).
set -u
BIN=${PIPER_BIN:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

# the whole table, regenerated and checked (5-10 minutes on a 2-core machine: the 1T pipelines)
if python3 tools/validate.py --bin "$BIN" --out "$T/full" --check >"$T/full.log" 2>&1; then ok
else bad "validate --check: $(tail -5 "$T/full.log")"; fi
for id in $(python3 -c "import json; print(' '.join(r['id'] for r in json.load(open('validation/runs.json'))['runs']))"); do
  grep -q "^| $id |" "$T/full/table.md" && grep -q "^$id	" "$T/full/table.tsv" && ok || bad "$id not in the table"
done
grep -q "^Pending" "$T/full/table.md" && ok || bad "the table lists no pending runs"

# runs.json with one run: P is a python expression that edits run r (and spec d)
one() { # ID OUT P
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
d = json.load(open("validation/runs.json"))
d["runs"] = [r for r in d["runs"] if r["id"] == sys.argv[1]]
d["known_misses"] = {}
r = d["runs"][0]
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
EOF
}
# Llama 3.1 405B on 8,192 GPUs misses (+15%): without its mark the check fails naming it
one llama3-405b-8k "$T/r1.json" 'r.pop("known_miss")'
python3 tools/validate.py --bin "$BIN" --runs "$T/r1.json" --out "$T/o1" --check >"$T/o1.log" 2>&1
[ $? -eq 1 ] && grep -q "^MISS: llama3-405b-8k: ratio 1\.[0-9]* outside 1 +- 0.1" "$T/o1.log" && ok ||
  bad "an unmarked miss passed: $(cat "$T/o1.log")"
# a MoE run is held to the MoE target (20%) and its miss fails unmarked
one gpt-oss-120b-h100-gbs512 "$T/r4.json" 'r.pop("known_miss")'
python3 tools/validate.py --bin "$BIN" --runs "$T/r4.json" --out "$T/o4" --check >"$T/o4.log" 2>&1
[ $? -eq 1 ] && grep -q "^MISS: gpt-oss-120b-h100-gbs512: ratio 1\.[0-9]* outside 1 +- 0.2" "$T/o4.log" &&
  grep -q "^MISS: moe median" "$T/o4.log" && ok || bad "an unmarked MoE miss passed: $(cat "$T/o4.log")"
# the profile override is read: the 22B run priced with the fused attention kernel it did not
# run (the bundled A100 profile as is) misses, as it did before the override (+17%)
one megatron-gpt3-22b "$T/r5.json" 'r.pop("profile_overrides")'
python3 tools/validate.py --bin "$BIN" --runs "$T/r5.json" --out "$T/o5" --check >"$T/o5.log" 2>&1
[ $? -eq 1 ] && grep -q "^MISS: megatron-gpt3-22b: ratio 1\.1[5-9]" "$T/o5.log" && ok ||
  bad "the unfused-attention override was not applied: $(cat "$T/o5.log")"
# so is the model's: GPT-OSS in FP8 runs faster than the published BF16 figure's configuration
one gpt-oss-120b-h100-gbs512 "$T/r6.json" 'r["model_piper"] = {"fp8": "tensorwise"}'
python3 tools/validate.py --bin "$BIN" --runs "$T/r6.json" --out "$T/o6" >"$T/o6.log" 2>&1
python3 - "$T/o4/table.tsv" "$T/o6/table.tsv" <<'EOF2' && ok || bad "model_piper fp8 not applied"
import sys
bf16, fp8 = (float(open(p).read().splitlines()[1].split("\t")[6]) for p in sys.argv[1:])
sys.exit(0 if fp8 > 1.1 * bf16 else 1)
EOF2
# and the per-expert launches of Transformer Engine's grouped GEMM: without them (one grouped
# launch, the profile default) the same run is faster (its 16 local experts' launches cost
# 4 us each past the first: about 0.5 ms a layer's F + B)
one gpt-oss-120b-h100-gbs512 "$T/r7.json" 'r["profile_overrides"]["moe"].pop("expert_gemm_launches")'
python3 tools/validate.py --bin "$BIN" --runs "$T/r7.json" --out "$T/o7" >"$T/o7.log" 2>&1
python3 - "$T/o4/table.tsv" "$T/o7/table.tsv" <<'EOF2' && ok || bad "moe.expert_gemm_launches not applied"
import sys
per_expert, grouped = (float(open(p).read().splitlines()[1].split("\t")[6]) for p in sys.argv[1:])
sys.exit(0 if grouped > 1.005 * per_expert else 1)
EOF2
# a published figure 30% higher makes a passing run miss (the check reads the figure)
one megatron-gpt3-175b "$T/r2.json" 'r["published"]["value"] *= 1.3'
python3 tools/validate.py --bin "$BIN" --runs "$T/r2.json" --out "$T/o2" --check >"$T/o2.log" 2>&1
[ $? -eq 1 ] && grep -q "^MISS: megatron-gpt3-175b" "$T/o2.log" && ok || bad "a changed figure passed: $(cat "$T/o2.log")"
# a mark on a run within target is stale
one megatron-gpt3-175b "$T/r3.json" 'r["known_miss"] = "no longer"'
python3 tools/validate.py --bin "$BIN" --runs "$T/r3.json" --out "$T/o3" --check >"$T/o3.log" 2>&1
[ $? -eq 1 ] && grep -q "megatron-gpt3-175b: marked known but within target now" "$T/o3.log" && ok ||
  bad "a stale mark passed: $(cat "$T/o3.log")"

# bad input: one line naming the file and the run, exit 2
expect_bad() { # WANT RUNS
  python3 tools/validate.py --bin "$BIN" --runs "$2" --out "$T/ob" >"$T/ob.out" 2>"$T/ob.err"
  local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <"$T/ob.err")" -ne 1 ] || ! grep -qF -- "$1" "$T/ob.err"; then
    bad "$2: exit $rc, $(cat "$T/ob.err")"
  else ok; fi
}
one megatron-gpt3-22b "$T/b1.json" 'r["gbs"] = 8'
expect_bad "$T/b1.json: run \"megatron-gpt3-22b\": dp x microbatches x micro_batch_size is not \"gbs\"" "$T/b1.json"
one megatron-gpt3-22b "$T/b2.json" 'r["gpus"] = 16'
expect_bad "run \"megatron-gpt3-22b\": tp x cp x pp x dp is not \"gpus\"" "$T/b2.json"
one megatron-gpt3-22b "$T/b3.json" 'del r["published"]["source"]'
expect_bad "\"published\" needs \"source\"" "$T/b3.json"
one megatron-gpt3-22b "$T/b4.json" 'del r["profile"]'
expect_bad "run \"megatron-gpt3-22b\": missing key \"profile\"" "$T/b4.json"
one gpt-oss-120b-h100-gbs512 "$T/b5.json" 'r["profile_overrides"] = "balanced"'
expect_bad "run \"gpt-oss-120b-h100-gbs512\": \"profile_overrides\" must be an object" "$T/b5.json"
one gpt-oss-120b-h100-gbs512 "$T/b6.json" 'r["ep"] = 3'
expect_bad "run \"gpt-oss-120b-h100-gbs512\": \"ep\" must divide tp x dp" "$T/b6.json"
expect_bad "no-such.json" "$T/no-such.json"

# the families the runs use are costed, not trained: piper-exec refuses them in one line naming
# the model and its model_type (exit 2)
for m in gpt3-22b:gpt2 gpt-oss-20b:gpt_oss; do
  "$BIN/piper-exec" --model "models/${m%%:*}.json" --layout pp=1 --iters 1 --out "$T/x" --force \
    >/dev/null 2>"$T/x.err"
  rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$T/x.err")" -eq 1 ] &&
    grep -q "^piper-exec: error: ${m%%:*}: model_type ${m##*:} (.*) has no host kernel" "$T/x.err" && ok ||
    bad "piper-exec ${m%%:*}: exit $rc, $(cat "$T/x.err")"
done

echo "test_validate: $pass passed, $failed failed"
[ $failed -eq 0 ]
