#!/usr/bin/env bash
# Activation recomputation in piper-exec --backend host (docs/directives.md, `recompute`): a
# plan with recomputation trains bit-identically to the same plan without it (the same losses
# as written, the same parameter bytes after 3 steps), since R reruns the same kernels on the
# same inputs and parameters (under expert parallelism the rerun routes again, from the
# router's rerun, and its dispatch sends the same rows to the same peers). Plans: dense 1F1B
# over 2 ranks, one device (every forward before every backward), tiny-moe 1F1B over 2 ranks
# (local experts, rerun too), tiny-moe PP 2 x DP 2 x EP 2 (the experts' rerun under expert
# parallelism, with the rerun's own dispatch and combine), ZB-H1 (R before BI), ZeRO-3 (R reads the backward's gathered parameters; under zbv and
# dualpipev the LM head's BW reads its own gather),
# DualPipeV on tiny-moe with EP, and PP 2 x TP 2 with and without SP (R's collectives); each under full and selective recomputation, and full per layer
# (Megatron's methods: uniform chunks of 1 layer, block of each stage's first layer). And the
# executor's own peak of activations drops: full below selective below none on the one-device
# plan (memory agreement with piper-sim is tests/cli/test_memory.sh's).
set -u
BIN=${PIPER_BIN:-bin}
PE="$BIN/piper-exec"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset PIPER_EXEC_FAULT
# every buffer NaN when allocated: a rerun that read what its forward already released (and
# another allocation reused) would not come out bit-identical
export PIPER_EXEC_POISON=1
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
if ! command -v mpirun >/dev/null || ! "$PE" --list-backends | grep -q "MPI"; then
  bad "mpirun or piper-exec's MPI support is missing"
echo "test_recompute.sh: $pass passed, $failed failed"
  exit 1
fi
DENSE=models/tiny-dense.json
MOE=models/tiny-moe.json

# one8 G OUT: one device, 8 micro-batches, every forward recomputed at granularity G (none:
# no recomputation)
one8() { python3 -c "
import json, sys
d = [] if sys.argv[1] == 'none' else [{'op': 'recompute', 'filter': {}, 'granularity': sys.argv[1]}]
if sys.argv[1] == 'modules':
    d = [{'op': 'recompute', 'filter': {}, 'granularity': 'selective', 'modules': ['core_attn', 'layernorm', 'mlp']}]
if sys.argv[1] == 'moe_act':
    d = [{'op': 'recompute', 'filter': {}, 'granularity': 'selective', 'modules': ['moe_act']}]
d.append({'op': 'split', 'filter': {}, 'dim_name': 'MB', 'num_microbatches': 8})
json.dump(d, open(sys.argv[2], 'w'))" "$1" "$2"; }

# run NAME NP MODEL ARGS...: 3 steps, losses and parameters kept
run() {
  local name=$1 np=$2 model=$3
  shift 3
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --oversubscribe -np "$np")
  if timeout 300 "${launch[@]}" "$PE" --backend host --model "$model" "$@" --warmup 0 --iters 3 \
    --quiet --timeout 60 --no-charts --out "$T/$name" --dump-params "$T/$name.params" \
    >"$T/$name.log" 2>&1; then
    return 0
  fi
  bad "$name: $(tail -3 "$T/$name.log")"
  return 1
}
losses() { python3 -c "import json,sys; print('\n'.join(repr(x) for x in json.load(open(sys.argv[1]))['losses']))" "$1/metrics.json"; }
# same NAME REF: bit-identical losses and parameters
same() {
  [ "$(losses "$T/$1")" = "$(losses "$T/$2")" ] && [ -s "$T/$1.params" ] &&
    cmp -s "$T/$1.params" "$T/$2.params" && ok ||
    bad "$1 is not bit-identical to $2 ($(losses "$T/$1" | tr '\n' ' ') against $(losses "$T/$2" | tr '\n' ' '))"
}
# the executor's activations at its peak on device 0
activations() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['devices'][0]['memory_breakdown_bytes']['activations'])" "$1/metrics.json"; }

for g in none full selective modules moe_act; do
  one8 $g "$T/one8_$g.json"
done
# name NP MODEL LAYOUT-ARGS: the reference runs with the layout as given, each variant with
# ",recompute=G" appended to its --layout (or the one-device program of G)
plans=(
  "dense_pp2 2 $DENSE --layout pp=2 --schedule 1f1b --mbs 8"
  "moe_pp2 2 $MOE --layout pp=2 --schedule 1f1b --mbs 8"
  "moe_ep 4 $MOE --layout pp=2,dp=2,ep=2 --schedule 1f1b --mbs 4"
  "dense_zb 2 $DENSE --layout pp=2 --schedule zerobubble --mbs 4"
  "dense_zero3 4 $DENSE --layout pp=2,dp=2,zero=3 --schedule 1f1b --mbs 4"
  "moe_dualpipev 4 $MOE --pp-regions 4 --layout pp=2,dp=2,ep=2,v --schedule dualpipev --mbs 4"
  "dense_pp2_tp2 4 $DENSE --layout pp=2,tp=2 --schedule 1f1b --mbs 4"
  "dense_pp2_tp2_sp 4 $DENSE --layout pp=2,tp=2,sp --schedule 1f1b --mbs 4"
)
for p in "${plans[@]}"; do
  read -r -a w <<<"$p"
  name=${w[0]} np=${w[1]} model=${w[2]} args=("${w[@]:3}")
  run "$name" "$np" "$model" "${args[@]}" || continue
  # the last: stage 0 per layer, stage 1 selective (the other stages of a V none)
  for g in =full =selective =full:uniform:1 =full:block:1 @0=full:uniform:1,recompute@1=selective; do
    rargs=()
    for a in "${args[@]}"; do
      case $a in pp=*) rargs+=("$a,recompute$g") ;; *) rargs+=("$a") ;; esac
    done
    v=$(echo "$g" | tr -c 'a-z0-9\n' _)
    run "${name}$v" "$np" "$model" "${rargs[@]}" && same "${name}$v" "$name"
  done
done

# ZeRO-3 with experts over part of the replicas (EP 2 in DP 4): the gathers' prefetch and the
# reruns' holds together once closed a cycle ("the training graph has a cycle"); the compiler
# now keeps the holds alone there (prefetch_and_hold), and it trains bit-identically to storing
run moe_ep2_dp4_zero3 8 "$MOE" --layout pp=2,dp=4,ep=2,zero=3 --schedule 1f1b --mbs 2 &&
  run moe_ep2_dp4_zero3_selective 8 "$MOE" --layout pp=2,dp=4,ep=2,zero=3,recompute=selective \
    --schedule 1f1b --mbs 2 && same moe_ep2_dp4_zero3_selective moe_ep2_dp4_zero3

# ZeRO-3 under split backwards (zbv, dualpipev; V layouts): the LM head's BW recomputes the
# logits from its parameters, which the plan once gathered for F and BI only, so BW found them
# sharded and the executor aborted ("at != EXEC_NOT_STORED"), recomputed or not. Each trains
# bit-identically to storing.
if run dense_zbv_zero3 4 "$DENSE" --layout pp=2,dp=2,v,zero=3 --schedule zbv --mbs 4; then
  run dense_zbv_zero3_full 4 "$DENSE" --layout pp=2,dp=2,v,zero=3,recompute=full --schedule zbv \
    --mbs 4 && same dense_zbv_zero3_full dense_zbv_zero3
fi
if run moe_dpv_zero3 4 "$MOE" --layout pp=2,dp=2,v,zero=3 --schedule dualpipev --mbs 4; then
  for g in full selective; do
    run "moe_dpv_zero3_$g" 4 "$MOE" --layout "pp=2,dp=2,v,zero=3,recompute=$g" \
      --schedule dualpipev --mbs 4 && same "moe_dpv_zero3_$g" moe_dpv_zero3
  done
fi

for m in dense moe; do
  model=$DENSE
  [ $m = moe ] && model=$MOE
  for g in none full selective; do
    run "one_${m}_$g" 1 $model --pp-regions 2 --directives "$T/one8_$g.json" || continue
    [ $g != none ] && same "one_${m}_$g" "one_${m}_none"
  done
  if [ -s "$T/one_${m}_none.params" ] && [ -s "$T/one_${m}_full.params" ] && [ -s "$T/one_${m}_selective.params" ]; then
    a=$(activations "$T/one_${m}_none") f=$(activations "$T/one_${m}_full") s=$(activations "$T/one_${m}_selective")
    [ "$f" -lt "$s" ] && [ "$s" -lt "$a" ] && ok ||
      bad "one device ($m): activations at the peak: none $a, selective $s, full $f (want full < selective < none)"
  fi
done
# Selective recomputation of named modules (Megatron's --recompute-modules): norm outputs, MLP
# and shared-expert activations and the routed experts' silu(gate)·up rows (moe_act: local
# experts, and under expert parallelism at the plan's capacity) dropped by F and rebuilt by R,
# bit-identical to storing them, under 1F1B, zero-bubble (R before BI) and ZeRO-3 (R reads the
# gathered parameters); "moe" reruns the local experts' segments in full. Each drops
# activations (one device, below none).
SHARED=$T/tiny-moe-shared.json
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d['n_shared_experts'] = 1
json.dump(d, open(sys.argv[2], 'w'))" $MOE "$SHARED"
mods=(
  "dense_pp2 2 $DENSE --layout pp=2,recompute=selective:core_attn+layernorm+mlp --schedule 1f1b --mbs 8"
  "dense_zb 2 $DENSE --layout pp=2,recompute=selective:layernorm+mlp --schedule zerobubble --mbs 4"
  "dense_zero3 4 $DENSE --layout pp=2,dp=2,zero=3,recompute=selective:layernorm --schedule 1f1b --mbs 4"
  "one_dense_none 1 $DENSE --pp-regions 2 --directives $T/one8_modules.json"
  "moe_pp2 2 $MOE --layout pp=2,recompute=selective:moe_act --schedule 1f1b --mbs 8"
  "moe_ep 4 $MOE --layout pp=2,dp=2,ep=2,recompute=selective:layernorm+moe_act --schedule 1f1b --mbs 4"
  "moe_zb 2 $MOE --layout pp=2,recompute=selective:moe_act --schedule zerobubble --mbs 4"
  "one_moe_none 1 $MOE --pp-regions 2 --directives $T/one8_moe_act.json"
)
run moe_zb 2 "$MOE" --layout pp=2 --schedule zerobubble --mbs 4
run moe_shared 2 "$SHARED" --layout pp=2 --schedule 1f1b --mbs 8 &&
  mods+=("moe_shared 2 $SHARED --layout pp=2,recompute=selective:layernorm+shared_experts+moe --schedule 1f1b --mbs 8")
for p in "${mods[@]}"; do
  read -r -a w <<<"$p"
  run "${w[0]}_modules" "${w[1]}" "${w[2]}" "${w[@]:3}" && same "${w[0]}_modules" "${w[0]}"
done
if [ -s "$T/one_dense_none_modules.params" ]; then
  a=$(activations "$T/one_dense_none") s=$(activations "$T/one_dense_selective") m=$(activations "$T/one_dense_none_modules")
  [ "$m" -lt "$s" ] && ok || bad "one device: activations at the peak: selective $s, core_attn+layernorm+mlp $m (want fewer)"
fi
if [ -s "$T/one_moe_none_modules.params" ]; then
  a=$(activations "$T/one_moe_none") m=$(activations "$T/one_moe_none_modules")
  [ "$m" -lt "$a" ] && ok || bad "one device (moe): activations at the peak: none $a, moe_act $m (want fewer)"
fi
# what the executor cannot rerun is refused in one error line (exit 2): mla_up_proj has no MLA
# kernel (DeepSeek-V3's plan is refused before anything is allocated); modules besides the
# attention core under tensor parallelism
refused() {
  local want=$1
  shift
  "$PE" --backend host --warmup 0 --iters 1 --quiet --no-charts --out "$T/refused" "$@" >"$T/refused.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c 'error:' "$T/refused.log")" -eq 1 ] && grep -q "error: .*$want" "$T/refused.log" && ok ||
    bad "want exit 2 and one line with '$want', got $rc: $(cat "$T/refused.log")"
}
refused 'recomputation of "mla_up_proj" has no kernel on the host backend' --model models/deepseek-v3.json --layout pp=1,recompute=selective:mla_up_proj --mbs 1
refused 'other than core_attn under tensor parallelism' --model $DENSE --layout tp=2,recompute=selective:layernorm --mbs 2
echo "test_recompute.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
