#!/usr/bin/env bash
# Checkpoints that reshard (--resume-allow-change layout). A 4-rank PP 2 x DP 2 checkpoint of
# tiny-dense at step 2 resumes on TP 2 x DP 2 and on one device; a PP 2 x DP 2 x EP 2 ZeRO-2
# checkpoint of tiny-moe on one device, under ZeRO-3 and on DP 2 x EP 2 x TP 2; a tied model's
# PP 2 checkpoint (the head keeps a copy of the table) on one PP region (no copy). Each gives the
# losses of steps 3 and 4 and the final parameters of continuing on the old layout, to the
# tolerance of another reduction order: losses within 1e-5 relative, parameters within 1e-4
# relative in norm and 1e-5 + 1e-4 relative per element (tests/cli/test_exec.sh says why); the
# old layout through the same path is bit-identical; the step directory's tensors.json names
# the tensors by their Hugging Face names and global shapes. Without the flag a new layout is still
# refused; another model, another global batch and a corrupt file read from are refused naming
# the file (a file nobody reads from, a DP replica's, is not checksummed).
set -u
BIN=${PIPER_BIN:-bin}
PE="$BIN/piper-exec"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
MPIRUN=(mpirun --oversubscribe)
BS=directives/base-schedules
echo '[]' >"$T/one.json"
AL=(--resume-allow-change layout)

# job NAME NP ARGS...: 4 steps in all, final parameters kept
job() {
  local name=$1 np=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$np" "$PE" "$@" --warmup 0 --iters 4 --quiet --timeout 60 \
    --no-charts --out "$T/$name" --dump-params "$T/$name.params" >"$T/$name.log" 2>&1 && return 0
  bad "$name: $(tail -3 "$T/$name.log")"
  return 1
}
# near REF NAME: NAME's losses (steps 3, 4) and parameters against REF's (steps 1 to 4)
near() {
  python3 tests/cli/same_run.py "$T/$1" "$T/$2" 2 2 && ok || bad "$2 differs from continuing on the old layout"
}
losses() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['losses'])" "$1/metrics.json"; }

# --- tiny-dense: PP 2 x DP 2 -> TP 2 x DP 2, one device, itself ------------------------------
DN=(--model models/tiny-dense.json)
OLD=("${DN[@]}" --layout pp=2,dp=2 --schedule 1f1b --mbs 4)
if timeout 300 "${MPIRUN[@]}" -np 4 "$PE" "${OLD[@]}" --warmup 0 --iters 2 --quiet --timeout 60 --no-report \
  --checkpoint "$T/ck" --checkpoint-every 2 >"$T/ck.log" 2>&1 && job whole 4 "${OLD[@]}"; then
  # the step directory names the tensors the rank files hold slices of
  python3 -c "import json,sys; t={e['name']: e for e in json.load(open(sys.argv[1]))['tensors']}
e = t['model.layers.7.mlp.down_proj.weight']; assert e['shape'] == [64, 128] and e['transposed'], e
assert len(t) == 2 + 8 * 9 + 1, len(t)" "$T/ck/step-2/tensors.json" && ok || bad "tensors.json: $(head -c 300 "$T/ck/step-2/tensors.json")"
  job tp2_dp2 4 "${DN[@]}" --layout pp=1,dp=2,tp=2 --mbs 4 --resume "$T/ck" "${AL[@]}" && near whole tp2_dp2
  grep -q "^resume: from $T/ck (step 2) with schedule changed, the layout of its 4 ranks resharded, allowed by --resume-allow-change$" \
    "$T/tp2_dp2.log" && ok || bad "the resharding is not said: $(grep resume "$T/tp2_dp2.log")"
  job one 1 "${DN[@]}" --directives "$T/one.json" --mbs 8 --resume "$T/ck" "${AL[@]}" && near whole one
  job same 4 "${OLD[@]}" --resume "$T/ck" "${AL[@]}" &&
    [ "$(losses "$T/same")" = "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['losses'][2:])" "$T/whole/metrics.json")" ] &&
    cmp -s "$T/same.params" "$T/whole.params" && ok || bad "the old layout through resharding is not bit-identical"
  # refusals
  "$PE" "${DN[@]}" --directives "$T/one.json" --mbs 8 --warmup 0 --iters 4 --resume "$T/ck" --no-report >"$T/r.log" 2>&1
  [ $? -eq 2 ] && grep -q "^piper-exec: error: resume: .*rank-0.ckpt was written by rank 0 of 4, read by rank 0 of 1 (--resume-allow-change layout to reshard)$" "$T/r.log" &&
    ok || bad "another layout without the flag: $(cat "$T/r.log")"
  "$PE" --model models/tiny-moe.json --directives "$T/one.json" --mbs 8 --warmup 0 --iters 4 \
    --resume "$T/ck" "${AL[@]}" --no-report >"$T/r.log" 2>&1
  [ $? -eq 2 ] && grep -q "rank-0.ckpt was written for another model" "$T/r.log" && ok || bad "another model: $(cat "$T/r.log")"
  "$PE" "${DN[@]}" --directives "$T/one.json" --mbs 4 --warmup 0 --iters 4 --resume "$T/ck" "${AL[@]}" --no-report >"$T/r.log" 2>&1
  [ $? -eq 2 ] && grep -q "written with a global batch of 16 sequences of 32 tokens, this plan has 8 of 32" "$T/r.log" &&
    ok || bad "another global batch: $(cat "$T/r.log")"
  cp -r "$T/ck" "$T/bent"
  # a byte of rank 0's moments (its file is read from: it holds stage 0)
  printf '\xff' | dd of="$T/bent/step-2/rank-0.ckpt" bs=1 seek=$(($(stat -c %s "$T/bent/step-2/rank-0.ckpt") - 100)) \
    conv=notrunc 2>/dev/null
  "$PE" "${DN[@]}" --directives "$T/one.json" --mbs 8 --warmup 0 --iters 4 --resume "$T/bent" "${AL[@]}" --no-report >"$T/r.log" 2>&1
  [ $? -eq 2 ] && grep -q "bent/step-2/rank-0.ckpt: checksum mismatch" "$T/r.log" && ok || bad "a corrupt file: $(cat "$T/r.log")"
else
  bad "tiny-dense checkpoint: $(tail -3 "$T/ck.log")"
fi

# --- tiny-moe: PP 2 x DP 2 x EP 2 ZeRO-2 -> one device, ZeRO-3, DP 2 x EP 2 x TP 2 -------------
MO=(--model models/tiny-moe.json)
OLD=("${MO[@]}" --base-schedule $BS/pp2_dp2_ep2_zero2.json --schedule 1f1b --ranks 2 --mbs 4)
if timeout 300 "${MPIRUN[@]}" -np 4 "$PE" "${OLD[@]}" --warmup 0 --iters 2 --quiet --timeout 60 --no-report \
  --checkpoint "$T/mck" --checkpoint-every 2 >"$T/mck.log" 2>&1 && job mwhole 4 "${OLD[@]}"; then
  job mone 1 "${MO[@]}" --directives "$T/one.json" --mbs 8 --resume "$T/mck" "${AL[@]}" && near mwhole mone
  job mz3 4 "${MO[@]}" --base-schedule $BS/pp2_dp2_ep2_zero3.json --schedule 1f1b --ranks 2 --mbs 4 \
    --resume "$T/mck" "${AL[@]}" && near mwhole mz3
  job meptp 4 "${MO[@]}" --layout pp=1,dp=2,ep=2,tp=2 --mbs 4 --resume "$T/mck" "${AL[@]}" && near mwhole meptp
  # into whole experts under TP (expert TP 1: each rank's 2 of the 8 experts, undivided)
  job metp1 4 "${MO[@]}" --layout tp=2,dp=2,ep=4,etp=1,sp,capacity=4 --mbs 4 --resume "$T/mck" "${AL[@]}" &&
    near mwhole metp1
else
  bad "tiny-moe checkpoint: $(tail -3 "$T/mck.log")"
fi
# ... and out of them: EP 4 over TP 2 x DP 2 with expert TP 1 -> one device
OLD=("${MO[@]}" --layout tp=2,dp=2,ep=4,etp=1,sp,capacity=4 --mbs 4)
if timeout 300 "${MPIRUN[@]}" -np 4 "$PE" "${OLD[@]}" --warmup 0 --iters 2 --quiet --timeout 60 --no-report \
  --checkpoint "$T/eck" --checkpoint-every 2 >"$T/eck.log" 2>&1 && job ewhole 4 "${OLD[@]}"; then
  job eone 1 "${MO[@]}" --directives "$T/one.json" --mbs 8 --resume "$T/eck" "${AL[@]}" && near ewhole eone
else
  bad "tiny-moe expert TP 1 checkpoint: $(tail -3 "$T/eck.log")"
fi

# --- a tied embedding: PP 2 (the head's copy) -> one PP region (none) --------------------------
TI=(--model models/tiny-dense-tied.json)
OLD=("${TI[@]}" --layout pp=2 --schedule 1f1b --mbs 8)
if timeout 300 "${MPIRUN[@]}" -np 2 "$PE" "${OLD[@]}" --warmup 0 --iters 2 --quiet --timeout 60 --no-report \
  --checkpoint "$T/tck" --checkpoint-every 2 >"$T/tck.log" 2>&1 && job twhole 2 "${OLD[@]}"; then
  job tone 1 "${TI[@]}" --pp-regions 1 --directives "$T/one.json" --mbs 8 --resume "$T/tck" "${AL[@]}"
  # the dumps differ in length (no copy on one region): losses only
  python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['losses'][2:]; b=json.load(open(sys.argv[2]))['losses']
sys.exit(not all(abs(x-y) <= 1e-5*abs(x) for x, y in zip(a, b)) or len(b) != 2)" "$T/twhole/metrics.json" "$T/tone/metrics.json" &&
    ok || bad "tied PP 2 -> one region: $(losses "$T/tone") vs $(losses "$T/twhole")"
else
  bad "tied checkpoint: $(tail -3 "$T/tck.log")"
fi

echo "test_reshard.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
