#!/usr/bin/env bash
# The frontier layouts of docs/directives.md trained with mpirun on the host backend, each
# against the one-device run (losses within 1e-5, parameters 1e-4: exec-lib.bash's same_as), in
# `make test`: context parallelism (the K/V ring: CP 2, CP 2 x TP 2, CP 2 x PP 2 x DP 2; CP 2's
# all-gather bit-identical to its ring), expert parallelism of its own size (EP 2 inside DP 4;
# EP 4 over TP 2 x DP 2 with expert TP 1, and its full recomputation bit-identical to storing),
# uneven stages (3 + 5 layers; the embedding and the loss counted as layers), interleaved 1F1B
# with M not a multiple of R, DualPipe with ZeRO-1; and EP 2 with DeepSeek-V3's FP8 caching of
# the experts' inputs (losses and memory against EP 2 without it). The same plans on the
# emulated GPU, and their memory against the simulator, are in test_exec.sh and test_memory.sh
# (make test-long; the FP8 cache on the emulated GPU in test_cuda_emu.sh).
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
. tests/cli/exec-lib.bash
echo '[]' >"$T/one.json"

if ! command -v mpirun >/dev/null || ! "$PE" --list-backends | grep -q "MPI"; then
  bad "mpirun or piper-exec's MPI support is missing"
  echo "test_layouts.sh: $pass passed, $failed failed"
  exit 1
fi

# --- tiny-dense: context parallelism, uneven stages, interleaving ----------------------------
MOE=models/tiny-dense.json
if run dense_ref 1 --directives "$T/one.json" --mbs 8; then
  # each CP rank holds chunks i and 3 - i of every sequence, passes K/V round the ring of CP
  # ranks (cp-comm=p2p, the default) for its attention (blocks by the chunks' global offsets,
  # merged by log-sum-exp) and their dK/dV back to their owners
  run cp2 2 --layout cp=2 --mbs 8 && same_as dense_ref cp2
  run cp2_tp2 4 --layout pp=1,tp=2,cp=2 --mbs 8 && same_as dense_ref cp2_tp2
  run pp2_dp2_cp2 8 --layout pp=2,dp=2,cp=2 --schedule 1f1b --mbs 4 && same_as dense_ref pp2_dp2_cp2
  # the all-gather of K/V visits the blocks in the ring's order: at CP 2 bit-identical to the
  # ring (the dK/dV sums add the same two terms)
  run cp2_ag 2 --layout cp=2,cp-comm=all_gather --mbs 8 &&
    [ "$(losses "$T/cp2_ag")" = "$(losses "$T/cp2")" ] && cmp -s "$T/cp2_ag.params" "$T/cp2.params" &&
    ok || bad "CP 2's all-gather is not bit-identical to its ring"
  # uneven stages: 3 + 5 of tiny-dense's 8 layers, and the first / last stage counts with the
  # embedding and the loss counted (2 + 3 + 2 + 1 over four stages)
  run uneven_pp2 2 --layout pp=2,stage-layers=3+5 --schedule 1f1b --mbs 8 && same_as dense_ref uneven_pp2
  run uneven_pp4 4 --layout pp=4,account-for-embedding,account-for-loss --schedule 1f1b --mbs 8 &&
    same_as dense_ref uneven_pp4
  # interleaved 1F1B with M not a multiple of R: 8 micro-batches over 3 ranks x 2 chunks, in
  # groups of 3 (the last 5) and of 4
  run il_pp3 3 --layout pp=3,interleave=2,stage-layers=2+2+1+1+1+1 --schedule interleaved_1f1b --mbs 8 && same_as dense_ref il_pp3
  run il_pp3_g4 3 --layout pp=3,interleave=2,stage-layers=2+2+1+1+1+1 --schedule interleaved_1f1b --mbs 8 --microbatch-group 4 &&
    same_as dense_ref il_pp3_g4
fi

# --- tiny-moe: expert groups carved from the stage, DualPipe with ZeRO-1 ---------------------
MOE=models/tiny-moe.json
if run ref 1 --directives "$T/one.json" --mbs 8; then
  # EP 2 inside DP 4: each all-to-all over a pair of consecutive ranks, each expert's gradient
  # summed over the two ranks that hold it (its expert-DP pair)
  run ep2_in_dp4 4 --layout dp=4,ep=2 --mbs 2 && same ep2_in_dp4
  # EP 4 over TP 2 x DP 2 with expert TP 1 (Megatron's DeepSeek-V3 recipes: whole experts under
  # TP): each TP rank routes its sequence shard over the EP group of all four ranks, the routing
  # weights' gradient summed over the TP pair for the router. capacity 4: EP 4's most (the tiny
  # router sends one rank more than twice the average)
  run ep4_tp2_dp2 4 --layout tp=2,dp=2,ep=4,etp=1,sp,capacity=4 --mbs 4 && same ep4_tp2_dp2
  # ... under full recomputation bit-identical to storing (the rerun's dispatch routes the
  # shard again)
  if [ -s "$T/ep4_tp2_dp2.params" ]; then
    run ep4_tp2_dp2_rc 4 --layout tp=2,dp=2,ep=4,etp=1,sp,capacity=4,recompute=full --mbs 4 &&
      [ "$(losses "$T/ep4_tp2_dp2_rc")" = "$(losses "$T/ep4_tp2_dp2")" ] &&
      cmp -s "$T/ep4_tp2_dp2_rc.params" "$T/ep4_tp2_dp2.params" && ok ||
      bad "ep4_tp2_dp2: full recomputation is not bit-identical to storing activations"
  fi
  # DualPipe under ZeRO-1: each copy reduce-scatters over its own replica group after the
  # copies' sum (one all-reduce per data-parallel position)
  run dualpipe_zero1 4 --layout pp=2,dp=2,zero=1 --schedule dualpipe --mbs 4 && same dualpipe_zero1
fi

# --- tiny-moe: DeepSeek-V3's FP8 caching of the experts' inputs (fp8-expert-inputs) ----------
# EP 2 with and without it (about 12 s each on 2 cores). The forward's GEMMs read the rows'
# floats, so step 1's loss is the same bits; the weight gradients of gate and up read the rows
# back from e4m3, so the later losses differ, by little: each input within 2^-4 of itself (3
# mantissa bits; kernels/fp8.h), those two gradients within 2^-4 of theirs (sums of products
# of one input each), so what the steps since the first changed of the loss moves by at most
# 2^-4 of that change (AdamW's step follows its gradient's relative error). Measured 5e-7 and
# 4e-5 of it.
if run ep2 2 --layout dp=2,ep=2 --mbs 4 && run ep2_fp8 2 --layout dp=2,ep=2,fp8-expert-inputs --mbs 4; then
  python3 - "$T/ep2" "$T/ep2_fp8" <<'EOF' && ok || bad "fp8-expert-inputs: losses"
import json, sys
a = json.load(open(sys.argv[1] + "/metrics.json"))["losses"]
b = json.load(open(sys.argv[2] + "/metrics.json"))["losses"]
assert len(a) == len(b) == 3, (a, b)
assert a[0] == b[0], ("the forward reads the rows' floats: step 1 the same bits", a, b)
assert a[1:] != b[1:], ("the weight gradients read the FP8 cache: later steps differ", a, b)
for k in (1, 2):
    assert abs(b[k] - a[k]) <= 2**-4 * abs(a[k] - a[0]), ("loss", k, a, b)
EOF
  cmp -s "$T/ep2.params" "$T/ep2_fp8.params" && bad "fp8-expert-inputs: the same parameters as without it"
  # memory: the simulator's peak and breakdown within 1% of the executor's (test_memory.sh's
  # rule), and the cache's saving: each expert forward's saved tensor cap x (4 C - C - 4
  # ceil(C / 128)) bytes smaller in the plan (fp32 rows; cap = 2 x T x top_k rows, the default
  # capacity), and the executor's peak smaller by what the simulator's is
  for v in ep2 ep2_fp8; do
    l=dp=2,ep=2
    [ $v = ep2_fp8 ] && l=$l,fp8-expert-inputs
    "$BIN/piper-sim" --model $MOE --layout $l --mbs 4 --profile profiles/host-cpu.json \
      --out "$T/$v-sim" --no-charts --quiet >"$T/$v-sim.log" 2>&1 ||
      bad "$v: piper-sim: $(tail -2 "$T/$v-sim.log")"
    "$BIN/piper-compile" --model $MOE --layout $l --mbs 4 -o "$T/$v-plan" >"$T/$v-plan.log" 2>&1 ||
      bad "$v: piper-compile: $(tail -2 "$T/$v-plan.log")"
  done
  python3 - "$T" $MOE <<'EOF' && ok || bad "fp8-expert-inputs: memory"
import json, math, sys
t, model = sys.argv[1], json.load(open(sys.argv[2]))
peak = {}
for v in ("ep2", "ep2_fp8"):
    sim = json.load(open(f"{t}/{v}-sim/metrics.json"))["devices"]
    ex = json.load(open(f"{t}/{v}/metrics.json"))["devices"]
    for s, e in zip(sim, ex):
        sp, ep = s["peak_memory_bytes"], e["peak_memory_bytes"]
        assert abs(ep - sp) <= 0.01 * sp, (v, "peak", sp, ep)
        for k, a in s["memory_breakdown_bytes"].items():
            assert abs(a - e["memory_breakdown_bytes"][k]) <= 0.01 * sp, (v, k)
    peak[v] = (sim[0]["peak_memory_bytes"], ex[0]["peak_memory_bytes"])
C, K, p = model["hidden_size"], model["num_experts_per_tok"], model["piper"]
cap = 2 * p["seq_len"] * p["micro_batch_size"] * K
saved = lambda v: [x["bytes"] for x in json.load(open(f"{t}/{v}-plan/device-0.json"))["tensors"]
                   if x["kind"] == "saved"]
cut = [a - b for a, b in zip(saved("ep2"), saved("ep2_fp8")) if a != b]
assert cut and set(cut) == {cap * (4 * C - C - 4 * math.ceil(C / 128))}, cut
ds, de = peak["ep2"][0] - peak["ep2_fp8"][0], peak["ep2"][1] - peak["ep2_fp8"][1]
assert ds > 0 and abs(de - ds) <= 0.01 * peak["ep2"][0], ("peak saving", ds, de)
print(f"ok: fp8-expert-inputs: {len(cut)} saved tensors {cut[0]} B smaller each; peak "
      f"{peak['ep2'][1]} -> {peak['ep2_fp8'][1]} B (simulated {peak['ep2'][0]} -> {peak['ep2_fp8'][0]})")
EOF
fi

echo "test_layouts.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
