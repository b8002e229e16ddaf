#!/usr/bin/env bash
# piper-exec as a user runs it. One process: bad input gets one line and exit 2; a one-device
# plan trains and writes its run directory; tiny-dense learns a real text in 100 steps; plans
# from piper-compile -o run like plans compiled in-process. With mpirun (when MPI is built in):
# tiny-moe trained 3 steps on a global batch of 8 micro-batches gives the same losses and final
# parameters as one device under dp2, 1F1B over 2 ranks, pp2_dp2_ep2 (1F1B), its ZeRO-1, ZeRO-2
# and ZeRO-3 variants, DualPipeV on pp4_dp2_ep2_v_placement, ZB-H1 and DualPipe (also with
# ZeRO-2 and EP 2); tiny-dense
# under tensor parallelism (TP 2, TP 2 + SP, ZB-H1 over PP 2 x TP 2 + SP, PP 2 x DP 2 x TP 2)
# and context parallelism (CP 4 x TP 2, recomputation, CP 4's all-gather; CP 2, CP 2 x TP 2,
# CP 2 x PP 2 x DP 2, CP 4 and CP 2's all-gather on the cuda backend, on the emulated GPU),
# and tiny-moe with
# experts divided by TP (TP 2, TP 2 + SP, PP 2 x TP 2 + SP, EP 2 x TP 2, PP 2 x
# DP 2 x EP 2 x TP 2, its ZB-H1, full recomputation bit-identical to storing; EP 4 over TP 2 x
# DP 2 with expert TP 1 with ZeRO-1, and inside TP 2 x DP 4; CP 2 x EP 2, with DP 2 and
# ZeRO-1, and CP 2 x TP 2 x EP 2 with expert TP 1). The frontier layouts' host plans (CP 2,
# EP of its own size, uneven stages, interleaving with any M, DualPipe with ZeRO-1) are in
# test_layouts.sh, which make test runs; they are not repeated here
# gives the losses and parameters of one device; a checkpoint at step 2
# resumes bit-identically; a killed rank and a stuck plan both end in an error within the
# timeout. A checkpoint of another sharding, learning rate or batch shape is refused naming the
# difference (or accepted with --resume-allow-change); the last step is checkpointed,
# --checkpoint-keep prunes, stale temporary files go; --dump-params /dev/full fails cleanly.
set -u
BIN=${PIPER_BIN:-bin}
PE="$BIN/piper-exec"
PC="$BIN/piper-compile"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# 2 cores in CI: no BLAS threads on top of the ranks; mpirun as root needs consent
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

# expect_bad NAME SUBSTRING ARGS...: exit 2 and one stderr line with the prefix and SUBSTRING
expect_bad() {
  local name=$1 want=$2; shift 2
  "$PE" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne 2 ]; then bad "$name: exit $rc, want 2 ($(head -c 300 "$T/err"))"; return; fi
  if [ "$(wc -l <"$T/err")" -ne 1 ]; then bad "$name: $(wc -l <"$T/err") stderr lines: $(cat "$T/err")"; return; fi
  grep -q "^piper-exec: error: " "$T/err" || { bad "$name: no error prefix: $(cat "$T/err")"; return; }
  grep -qF -- "$want" "$T/err" || { bad "$name: message lacks '$want': $(cat "$T/err")"; return; }
  ok
}

MOE=models/tiny-moe.json
DENSE=models/tiny-dense.json
BS=directives/base-schedules
echo '[]' >"$T/one.json"
cat >"$T/pp2.json" <<'EOF'
[
  {"op": "place", "filter": {"PP": 0}, "devices": [0]},
  {"op": "place", "filter": {"PP": 1}, "devices": [1]}
]
EOF
# losses, run, same, same_as (the runs need MPIRUN, set below)
. tests/cli/exec-lib.bash

# --- basics and bad input (one process) ------------------------------------------------------
"$PE" --help | grep -q -- "--checkpoint-every" && ok || bad "--help"
"$PE" --version | grep -q "^piper-exec " && ok || bad "--version"
"$PE" --list-backends >"$T/bk" && [ "$(cut -f1 "$T/bk" | head -1)" = host ] && ok || bad "--list-backends: $(cat "$T/bk")"
expect_bad "no model" "give --model FILE" --directives "$T/one.json"
expect_bad "unknown option" "unknown option --frobnicate" --frobnicate
expect_bad "bad iters" "--iters" --model $DENSE --directives "$T/one.json" --iters 0
expect_bad "unknown backend" "not built in" --backend nonesuch --model $DENSE --directives "$T/one.json"
expect_bad "checkpoint alone" "--checkpoint-every" --model $DENSE --directives "$T/one.json" --checkpoint "$T/ck"
expect_bad "missing data" "/nonexistent/data.bin" --model $DENSE --directives "$T/one.json" --data /nonexistent/data.bin --no-report
expect_bad "bad model" "tiny-moe-missing.json" --model models/tiny-moe-missing.json --directives "$T/one.json"
expect_bad "plan too big" "the plan has 2 devices but the job has 1 processes" \
  --model $MOE --directives $BS/dp2.json --mbs 2 --no-report
# experts divided by an expert TP between 1 and the dense TP (EP 4 x ETP 2 over TP 4 x DP 2)
# are simulated, not run: one line, before the TP degree's own check (expert TP 1 runs, below)
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); d['num_key_value_heads'] = 4
json.dump(d, open(sys.argv[2], 'w'))" $MOE "$T/moe-kv4.json"
expect_bad "etp between 1 and tp" "an expert_tensor_parallel between 1 and the dense tensor_parallel, which piper-sim simulates" --model "$T/moe-kv4.json" --layout tp=4,dp=2,ep=4,etp=2,sp --mbs 2 --no-report
expect_bad "mla" "needs MLA attention, which no op of exec/ops.def runs yet (the host backend cannot train it" --model models/deepseek-v3.json --pp-regions 61 --directives "$T/one.json" --no-report
expect_bad "qwen2 shared gate" "gates its shared expert (shared_expert_gate), which has no host kernel" \
  --model models/qwen1.5-moe-a2.7b.json --directives "$T/one.json" --no-report
PIPER_EXEC_FAULT=bogus expect_bad "bad fault" "PIPER_EXEC_FAULT" --model $DENSE --directives "$T/one.json"

# --- one process: a one-device plan trains and writes its run directory ------------------------
if "$PE" --model $DENSE --directives "$T/one.json" --mbs 2 --iters 3 --out "$T/run1" >"$T/out" 2>"$T/err"; then
  ok
  for f in custom_pp1_mbs2.json results.csv metrics.json trace.json schedule.png schedule.svg; do
    [ -s "$T/run1/$f" ] && ok || bad "run directory lacks $f"
  done
  # the measured step's charts: real PNGs, listed in the summary
  head -c 8 "$T/run1/schedule.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" && ok || bad "schedule.png is not a PNG"
  if command -v gnuplot >/dev/null; then
    [ -s "$T/run1/memory.png" ] && ok || bad "run directory lacks memory.png"
  fi
  grep -q "schedule.png schedule.svg" "$T/out" && ok || bad "summary does not list the charts: $(cat "$T/out")"
  head -1 "$T/run1/results.csv" | grep -q "^dp_rank,model,schedule,pp,dp,batch_size,num_microbatches,seq_len,samples,iter_time_mean_s,iter_time_std_s,throughput_tokens_per_s,peak_memory_pp0_gb" \
    && ok || bad "results.csv columns: $(head -1 "$T/run1/results.csv")"
  python3 - "$T/run1" <<'EOF' && ok || bad "metrics.json / trace.json content"
import json, sys
d = sys.argv[1]
m = json.load(open(d + "/metrics.json"))
assert m["kind"] == "exec" and len(m["losses"]) == 4, m.get("losses")  # warmup 1 + 3
assert len(m["iteration_times_s"]) == 3 and all(t > 0 for t in m["iteration_times_s"])
assert m["devices"][0]["peak_memory_bytes"] > 0
t = json.load(open(d + "/trace.json"))
x = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert x and all(e["dur"] >= 0 for e in x) and any(e["args"].get("PASS") == "BW" or e["args"].get("PASS") == "B" for e in x)
assert any(e["ph"] == "C" for e in t["traceEvents"])  # memory counters
EOF
  grep -q "^step  4/4  loss " "$T/out" && ok || bad "progress lines: $(cat "$T/out")"
else
  bad "one-device run: $(cat "$T/err")"
fi

# --- tiny-dense on a real text (bytes) for 100 steps: the loss falls well below its start ----
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || { cat exec/*.c ir/*.c >"$T/text.txt"; TEXT="$T/text.txt"; }
if "$PE" --model $DENSE --directives "$T/one.json" --mbs 2 --warmup 0 --iters 100 --data "$TEXT" \
  --out "$T/text" --quiet 2>"$T/err"; then
  python3 - "$T/text" <<'EOF' && ok || bad "100 steps on $TEXT: the loss did not fall"
import json, sys
l = json.load(open(sys.argv[1] + "/metrics.json"))["losses"]
first, last = l[0], sum(l[-10:]) / 10  # mean of the last 10 steps: one batch is noisy
assert len(l) == 100 and first > 5.0 and last < 0.65 * first, (first, last)
EOF
else
  bad "100 steps: $(cat "$T/err")"
fi

# --- plans from piper-compile -o run like plans compiled in-process ---------------------------
if [ -x "$PC" ] && "$PC" --model $MOE --directives "$T/one.json" --mbs 4 -o "$T/plans" >/dev/null 2>"$T/err"; then
  "$PE" --plans "$T/plans" --iters 2 --out "$T/fromdisk" --quiet --no-charts 2>"$T/err" &&
    [ ! -e "$T/fromdisk/schedule.png" ] &&
    "$PE" --model $MOE --directives "$T/one.json" --mbs 4 --iters 2 --out "$T/inproc" --quiet 2>>"$T/err" &&
    [ "$(losses "$T/fromdisk")" = "$(losses "$T/inproc")" ] && ok || bad "--plans: $(cat "$T/err")"
else
  bad "piper-compile -o: $(cat "$T/err")"
fi

# --- several processes ---------------------------------------------------------------------
# MPI is a dependency (tools/install-deps.sh): without it these tests fail rather than skip.
if ! command -v mpirun >/dev/null || ! "$PE" --list-backends | grep -q "MPI"; then
  bad "mpirun or piper-exec's MPI support is missing"
  echo "test_exec.sh: $pass passed, $failed failed"
  exit 1
fi
MPIRUN=(mpirun --oversubscribe)

if run ref 1 --directives "$T/one.json" --mbs 8; then
  ok
  # the reference itself trained: 3 different losses
  [ "$(losses "$T/ref" | sort -u | wc -l)" -eq 3 ] && ok || bad "reference losses: $(losses "$T/ref")"
  run dp2 2 --directives $BS/dp2.json --mbs 4 && same dp2
  run pp2_1f1b 2 --directives "$T/pp2.json" --schedule 1f1b --ranks 2 --mbs 8 && same pp2_1f1b
  # recomputation reruns the forward before backward: bit-identical to storing (same losses,
  # same parameter bytes), full on every region, selective on the second; dense segments
  # (expert segments and more plans: tests/cli/test_recompute.sh)
  MOE_SAVED=$MOE
  MOE=$DENSE
  run dense_pp2 2 --pp-regions 2 --directives "$T/pp2.json" --schedule 1f1b --ranks 2 --mbs 8
  for g in full selective; do
    python3 -c "import json, sys; d = json.load(open(sys.argv[1]))
d.append({'op': 'recompute', 'filter': {} if sys.argv[2] == 'full' else {'PP': 1}, 'granularity': sys.argv[2]})
json.dump(d, open(sys.argv[3], 'w'))" "$T/pp2.json" $g "$T/pp2_rc_$g.json"
    run pp2_rc_$g 2 --pp-regions 2 --directives "$T/pp2_rc_$g.json" --schedule 1f1b --ranks 2 --mbs 8 &&
      [ "$(losses "$T/pp2_rc_$g")" = "$(losses "$T/dense_pp2")" ] && cmp -s "$T/pp2_rc_$g.params" "$T/dense_pp2.params" \
      && ok || bad "recompute $g is not bit-identical to storing activations"
  done
  # tensor parallelism: each TP rank holds slices cut from the one-device initialisation, so
  # TP 2 and TP 2 x PP 2 x DP 2 (8 ranks on the 2 cores: --oversubscribe, 4 micro-batches per
  # replica) give the one-device losses, and the dumped parameters gathered from the slices
  run dense_ref 1 --directives "$T/one.json" --mbs 8
  run tp2 2 --layout pp=1,tp=2 --mbs 8 && same_as dense_ref tp2
  # ... with sequence parallelism (norms and residuals on sequence shards, the norms' weight
  # gradients summed over the TP group), also under ZB-H1's split backward (BI, BW)
  run tp2_sp 2 --layout pp=1,tp=2,sp --mbs 8 && same_as dense_ref tp2_sp
  run pp2_tp2_sp_zb 4 --layout pp=2,tp=2,sp --schedule zerobubble --mbs 8 && same_as dense_ref pp2_tp2_sp_zb
  run pp2_dp2_tp2 8 --layout pp=2,dp=2,tp=2 --schedule 1f1b --mbs 4 && same_as dense_ref pp2_dp2_tp2
  # context parallelism (CP 2, CP 2 x TP 2, CP 2 x PP 2 x DP 2, CP 2's all-gather: test_layouts.sh,
  # in make test); the all-gather of K/V (cp-comm=all_gather) at CP 4 (8 chunks of 4 tokens) the
  # one-device losses and parameters, as is the ring's CP 4 beside TP 2
  run cp4_ag 4 --layout cp=4,cp-comm=all_gather --mbs 8 && same_as dense_ref cp4_ag
  # ... and recomputation under CP 2 x PP 2 bit-identical to storing: full reruns the forward's
  # exchange, selective the core over every rank's K/V
  run cp4_tp2 8 --layout pp=1,tp=2,cp=4 --mbs 8 && same_as dense_ref cp4_tp2
  run pp2_cp2 4 --layout pp=2,cp=2 --schedule 1f1b --mbs 8 && same_as dense_ref pp2_cp2
  for g in full selective; do
    run pp2_cp2_rc_$g 4 --layout pp=2,cp=2,recompute=$g --schedule 1f1b --mbs 8 &&
      [ "$(losses "$T/pp2_cp2_rc_$g")" = "$(losses "$T/pp2_cp2")" ] && cmp -s "$T/pp2_cp2_rc_$g.params" "$T/pp2_cp2.params" &&
      ok || bad "recompute $g under CP is not bit-identical to storing activations"
  done
  # ... and on the cuda backend (its blocks, exec/backend_cuda_attention_cp.c) on the emulated
  # GPU (tests/gpu/emu/README.md; `make emu`, skipped without g++), one per rank (NCCL's path):
  # the one-device losses and parameters within the emulated-CUDA tolerance of
  # tools/gpu-check.sh (e) (1e-4 of the loss and of the largest parameter)
  if command -v g++ >/dev/null && make -j2 -s --no-print-directory emu >"$T/emu.log" 2>&1; then
    run_emu() {
      local name=$1 np=$2; shift 2
      PIPER_EMU_GPUS=$np PIPER_CUDA_MEMORY=268435456 timeout 900 "${MPIRUN[@]}" -np "$np" \
        build/emu/bin/piper-exec --backend cuda --model $DENSE "$@" --warmup 0 --iters 3 --quiet \
        --timeout 300 --out "$T/$name" --dump-params "$T/$name.params" >"$T/$name.log" 2>&1 ||
        { bad "$name (emulated cuda): $(tail -3 "$T/$name.log")"; return 1; }
    }
    same_emu() {
      python3 - "$T/$1" "$T/$2" <<'EOF' && ok || bad "$2 (emulated cuda) differs from one device"
import array, json, sys
la = json.load(open(sys.argv[1] + "/metrics.json"))["losses"]
lb = json.load(open(sys.argv[2] + "/metrics.json"))["losses"]
assert len(la) == len(lb) == 3, (la, lb)
assert max(abs(x - y) / abs(x) for x, y in zip(la, lb)) <= 1e-4, ("loss", la, lb)
pa, pb = array.array("f"), array.array("f")
pa.frombytes(open(sys.argv[1] + ".params", "rb").read())
pb.frombytes(open(sys.argv[2] + ".params", "rb").read())
assert len(pa) == len(pb) > 0
worst = max(abs(x - y) for x, y in zip(pa, pb)) / max(abs(x) for x in pa)
assert worst <= 1e-4, ("parameters", worst)
EOF
    }
    run_emu cp2_cuda 2 --layout cp=2 --mbs 8 && same_emu dense_ref cp2_cuda
    run_emu cp2_tp2_cuda 4 --layout pp=1,tp=2,cp=2 --mbs 8 && same_emu dense_ref cp2_tp2_cuda
    run_emu pp2_dp2_cp2_cuda 8 --layout pp=2,dp=2,cp=2 --schedule 1f1b --mbs 4 &&
      same_emu dense_ref pp2_dp2_cp2_cuda
    # ... the ring at CP 4 (NCCL's grouped send and receive on the backend's side stream, beside
    # the blocks), and CP 2's all-gather
    run_emu cp4_cuda 4 --layout cp=4 --mbs 8 && same_emu dense_ref cp4_cuda
    run_emu cp2_ag_cuda 2 --layout cp=2,cp-comm=all_gather --mbs 8 && same_emu dense_ref cp2_ag_cuda
  else
    echo "skip: CP on the emulated GPU (make emu: $(tail -1 "$T/emu.log" 2>/dev/null || echo no g++))"
  fi
  # (uneven stages and interleaved 1F1B with M not a multiple of R: test_layouts.sh)
  # a TP checkpoint (each rank's file holds its slices) resumes bit-identically
  tp_run=("${MPIRUN[@]}" -np 2 "$PE" --model $DENSE --layout pp=1,tp=2,sp --mbs 4 --warmup 0 --quiet \
    --timeout 60 --no-report)
  timeout 120 "${tp_run[@]}" --iters 3 --dump-params "$T/tpck_ref.params" >/dev/null 2>&1 &&
    timeout 120 "${tp_run[@]}" --iters 2 --checkpoint "$T/tpck" --checkpoint-every 1 >/dev/null 2>&1 &&
    timeout 120 "${tp_run[@]}" --iters 3 --resume "$T/tpck" --dump-params "$T/tpck.params" >/dev/null 2>&1 &&
    cmp -s "$T/tpck_ref.params" "$T/tpck.params" && ok || bad "a TP checkpoint does not resume bit-identically"
  MOE=$MOE_SAVED
  # experts under tensor parallelism (Megatron's expert TP = TP): each TP rank runs the gate/up
  # columns and down rows of every local expert, cut from the one-device initialisation; local
  # experts (TP 2, TP 2 + SP: router and experts on the whole sequence), PP 2 x TP 2 + SP, and EP 2
  # with TP 2 inside (the all-to-all over the devices of one TP rank), also under PP 2 x DP 2
  # (8 ranks)
  run moe_tp2 2 --layout pp=1,tp=2 --mbs 8 && same moe_tp2
  run moe_tp2_sp 2 --layout pp=1,tp=2,sp --mbs 8 && same moe_tp2_sp
  run moe_pp2_tp2_sp 4 --layout pp=2,tp=2,sp --schedule 1f1b --mbs 8 && same moe_pp2_tp2_sp
  run moe_ep2_tp2 4 --layout pp=1,dp=2,ep=2,tp=2 --mbs 4 && same moe_ep2_tp2
  run moe_pp2_dp2_ep2_tp2 8 --layout pp=2,dp=2,ep=2,tp=2 --schedule 1f1b --mbs 4 && same moe_pp2_dp2_ep2_tp2
  # expert groups carved from the stage (Megatron's expert grid): EP 2 inside DP 4, each
  # all-to-all over a pair of consecutive ranks and each expert's gradient summed over the two
  # ranks that hold it (its expert-DP pair); with ZeRO-1 the experts' optimizer state sharded
  # over that pair and the dense layers' over DP 4; and under PP 2 with ZeRO-2
  run ep2_in_dp4_zero1 4 --layout dp=4,ep=2,zero=1 --mbs 2 && same ep2_in_dp4_zero1
  run pp2_ep2_in_dp4_zero2 8 --layout pp=2,dp=4,ep=2,zero=2 --schedule 1f1b --mbs 2 &&
    same pp2_ep2_in_dp4_zero2
  # EP 4 over TP 2 x DP 2 with expert TP 1 (Megatron's DeepSeek-V3 recipes: whole experts under
  # TP): each TP rank routes its sequence shard over the EP group of all four ranks, the
  # routing weights' gradient summed over the TP pair for the router; with ZeRO-1, and inside
  # TP 2 x DP 4 (expert DP 2: each expert's gradient summed over the two ranks four apart,
  # not over the dense DP group of four). capacity 4: EP 4's most (the tiny router sends one
  # rank more than twice the average)
  run ep4_tp2_dp2_zero1 4 --layout tp=2,dp=2,ep=4,etp=1,sp,capacity=4,zero=1 --mbs 4 &&
    same ep4_tp2_dp2_zero1
  run ep4_tp2_dp4_zero1 8 --layout tp=2,dp=4,ep=4,etp=1,sp,capacity=4,zero=1 --mbs 2 &&
    same ep4_tp2_dp4_zero1
  # (EP 2 inside DP 4, EP 4 over TP 2 x DP 2 and its full recomputation: test_layouts.sh);
  # ... under ZB-H1 over PP 2 (the router's BI sums the routing weights' gradient)
  run pp2_ep4_tp2_dp2_zb 8 --layout pp=2,tp=2,dp=2,ep=4,etp=1,sp,capacity=4 --schedule zerobubble \
    --mbs 4 && same pp2_ep4_tp2_dp2_zb
  # CP with EP: each CP rank routes the tokens of its two chunks; CP 2 x EP 2 (the EP group
  # the CP pair), inside DP 2 with ZeRO-1 (expert DP = DP, dense DP = DP x CP), and CP 2 x TP 2
  # + SP with expert TP 1 (EP over the TP pair of each CP rank, expert DP over CP)
  run cp2_ep2 2 --layout cp=2,ep=2 --mbs 8 && same cp2_ep2
  run cp2_dp2_ep2_zero1 4 --layout cp=2,dp=2,ep=2,zero=1 --mbs 4 && same cp2_dp2_ep2_zero1
  run cp2_tp2_ep2_etp1 4 --layout cp=2,tp=2,sp,ep=2,etp=1 --mbs 8 && same cp2_tp2_ep2_etp1
  # ... with SP: each TP peer dispatches every route (one routing: the router runs on the
  # gathered input) with its sequence shard's rows and zeros for the others, and the experts sum
  # the rows, the output gradients and the routing weights' gradients over the TP group
  run moe_ep2_tp2_sp 4 --layout pp=1,dp=2,ep=2,tp=2,sp --mbs 4 && same moe_ep2_tp2_sp
  run moe_pp2_dp2_ep2_tp2_sp 8 --layout pp=2,dp=2,ep=2,tp=2,sp --schedule 1f1b --mbs 4 &&
    same moe_pp2_dp2_ep2_tp2_sp
  # ... under ZB-H1's split backward (the experts' BI sums the input gradients, BW none), and
  # under full recomputation bit-identical to storing (the rerun sums its partial outputs over
  # the TP group too: the combine of pass R copies them for the routing weights' gradient)
  run moe_zb_ep2_tp2 8 --layout pp=2,dp=2,ep=2,tp=2 --schedule zerobubble --mbs 4 && same moe_zb_ep2_tp2
  run moe_zb_ep2_tp2_sp 8 --layout pp=2,dp=2,ep=2,tp=2,sp --schedule zerobubble --mbs 4 &&
    same moe_zb_ep2_tp2_sp
  for c in "moe_pp2_tp2_sp 4 pp=2,tp=2,sp" "moe_pp2_dp2_ep2_tp2 8 pp=2,dp=2,ep=2,tp=2" \
    "moe_pp2_dp2_ep2_tp2_sp 8 pp=2,dp=2,ep=2,tp=2,sp"; do
    set -- $c
    [ -s "$T/$1.params" ] || continue
    mbs=8; [ "$2" = 8 ] && mbs=4
    run $1_rc $2 --layout $3,recompute=full --schedule 1f1b --mbs $mbs &&
      [ "$(losses "$T/$1_rc")" = "$(losses "$T/$1")" ] && cmp -s "$T/$1_rc.params" "$T/$1.params" &&
      ok || bad "$1: full recomputation is not bit-identical to storing activations"
  done
  # ... and EP 2 x TP 2 under ZB-H1 (the experts' BI after the rerun's TP sums)
  for c in "moe_zb_ep2_tp2 pp=2,dp=2,ep=2,tp=2" "moe_zb_ep2_tp2_sp pp=2,dp=2,ep=2,tp=2,sp"; do
    set -- $c
    [ -s "$T/$1.params" ] || continue
    run $1_rc 8 --layout $2,recompute=full --schedule zerobubble --mbs 4 &&
      [ "$(losses "$T/$1_rc")" = "$(losses "$T/$1")" ] && cmp -s "$T/$1_rc.params" "$T/$1.params" &&
      ok || bad "$1: full recomputation is not bit-identical to storing activations"
  done
  run pp2_dp2_ep2 4 --base-schedule $BS/pp2_dp2_ep2.json --schedule 1f1b --ranks 2 --mbs 4 && same pp2_dp2_ep2
  run zero1 4 --base-schedule $BS/pp2_dp2_ep2_zero1.json --schedule 1f1b --ranks 2 --mbs 4 && same zero1
  run zero2 4 --base-schedule $BS/pp2_dp2_ep2_zero2.json --schedule 1f1b --ranks 2 --mbs 4 && same zero2
  run zero3 4 --base-schedule $BS/pp2_dp2_ep2_zero3.json --schedule 1f1b --ranks 2 --mbs 4 && same zero3
  # each rank allocates only its share of parameters, gradients and optimizer state: the
  # measured figures are the simulator's static memory, byte for byte (formulas, not
  # estimates), and each ZeRO level holds less of its store than the level below
  for z in 1 2 3; do
    [ -s "$T/zero$z/metrics.json" ] || continue
    "$BIN/piper-sim" --model $MOE --base-schedule $BS/pp2_dp2_ep2_zero$z.json --schedule 1f1b --ranks 2 \
      --mbs 4 --profile profiles/host-cpu.json --no-charts --quiet --out "$T/sim_zero$z" 2>"$T/err" || bad "sim zero$z: $(cat "$T/err")"
  done
  python3 - "$T" <<'EOF' && ok || bad "ZeRO static memory: executor and simulator differ"
import json, sys
keys = ("params", "grads", "optimizer")
def static(path):
    return [tuple(d["memory_breakdown_bytes"][k] for k in keys) for d in json.load(open(path))["devices"]]
plain = static(sys.argv[1] + "/pp2_dp2_ep2/metrics.json")
prev = plain
for z in (1, 2, 3):
    e = static(f"{sys.argv[1]}/zero{z}/metrics.json")
    s = static(f"{sys.argv[1]}/sim_zero{z}/metrics.json")
    assert e == s, (z, e, s)
    # level z shards one more store: optimizer (1), gradients (2), parameters (3)
    for a, b in zip(e, prev):
        assert a[3 - z] < b[3 - z], (z, a, b)
    prev = e
EOF
  run dualpipev 4 --pp-regions 4 --base-schedule $BS/pp4_dp2_ep2_v_placement.json --schedule dualpipev \
    --ranks 2 --mbs 4 && same dualpipev
  run zerobubble 2 --directives "$T/pp2.json" --schedule zerobubble --ranks 2 --mbs 8 && same zerobubble
  # DualPipe runs each stage on two devices (one per direction) for different micro-batches
  run dualpipe 4 --pp-regions 4 --directives $BS/pp4.json --schedule dualpipe --mbs 8 && same dualpipe
  # ... and with data and expert parallelism inside each rank: the copies' dense gradients are
  # summed over all four devices, each expert's over the two devices that hold it
  run dualpipe_dp_ep 4 --base-schedule $BS/pp2_dp2_ep2.json --schedule dualpipe --ranks 2 --mbs 4 \
    && same dualpipe_dp_ep
  # ... under ZeRO-2 with the experts sharded (ZeRO-1: test_layouts.sh): each copy
  # reduce-scatters over its own replica group after the copies' sum (one all-reduce per
  # data-parallel position)
  run dualpipe_zero2_ep 4 --layout pp=2,dp=2,ep=2,zero=2 --schedule dualpipe --mbs 4 &&
    same dualpipe_zero2_ep
  # one named stream for all pipeline traffic: sends and receives go in groups, same losses
  named() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for x in d:
    if x['op'] == 'place':
        x['stream'] = 'pp_stream'
json.dump(d, open(sys.argv[2], 'w'))" "$1" "$2"; }
  named $BS/pp4.json "$T/pp4_named.json"
  printf '%s\n' '[' \
    '{"op": "place", "filter": {"PP": 0}, "devices": [0]}, {"op": "place", "filter": {"PP": 1}, "devices": [1]},' \
    '{"op": "place", "filter": {"PP": 2}, "devices": [0]}, {"op": "place", "filter": {"PP": 3}, "devices": [1]}' \
    ']' >"$T/loop.json"
  named "$T/loop.json" "$T/loop_named.json"
  printf '%s\n' '[' \
    '{"op": "place", "filter": {"PP": 0}, "devices": [0]}, {"op": "place", "filter": {"PP": 1}, "devices": [1]},' \
    '{"op": "place", "filter": {"PP": 2}, "devices": [1]}, {"op": "place", "filter": {"PP": 3}, "devices": [0]}' \
    ']' >"$T/v.json"
  named "$T/v.json" "$T/v2_named.json"
  run named_1f1b 4 --pp-regions 4 --directives "$T/pp4_named.json" --schedule 1f1b --mbs 8 \
    && same named_1f1b
  run named_interleaved 2 --pp-regions 4 --directives "$T/loop_named.json" \
    --schedule interleaved_1f1b --mbs 8 && same named_interleaved
  run named_dualpipev 2 --pp-regions 4 --directives "$T/v2_named.json" --schedule dualpipev \
    --mbs 8 && same named_dualpipev
  # a measured group is one trace event per step, named by its parts, carrying node and step
  python3 -c "
import json,sys; t=json.load(open(sys.argv[1]))
g=[e for e in t['traceEvents'] if e['ph']=='X' and 'group_parts' in e['args']]
assert g and all(e['name'].startswith('group: ') and 'node' in e['args'] for e in g), g[:2]
assert len({e['args']['step'] for e in g}) == 3, {e['args']['step'] for e in g}" \
    "$T/named_1f1b/trace.json" && ok || bad "named_1f1b trace lacks one event per group and step"
  # the traces of a multi-rank run hold every device
  python3 -c "
import json,sys; t=json.load(open(sys.argv[1]))
assert {e['pid'] for e in t['traceEvents'] if e['ph']=='X'} == {0,1,2,3}" "$T/zero3/trace.json" \
    && ok || bad "zero3 trace lacks devices"
  # ... on one clock (4 ranks on 2 cores leave a barrier at different moments, by milliseconds:
  # the ranks take rank 0's origin): no member of a collective starts after another has ended
  python3 -c "
import json,sys; t=json.load(open(sys.argv[1]))
by = {}
for e in t['traceEvents']:
    if e['ph'] == 'X' and e['args']['kind'] in ('all_to_all', 'all_reduce'):
        by.setdefault((e['args']['node'], e['args']['step']), []).append(e)
late = [max(e['ts'] for e in v) - min(e['ts'] + e['dur'] for e in v) for v in by.values() if len(v) > 1]
assert late and max(late) < 5, max(late)" "$T/pp2_dp2_ep2/trace.json" \
    && ok || bad "pp2_dp2_ep2's ranks are not on one clock"
fi

# activations live from their forward to their last backward: 1F1B holds fewer micro-batches
# than GPipe on the first stage (2 vs 8 here), and the measured peak shows it
mem() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['devices'][0]['memory_breakdown_bytes']['activations'])" "$1/metrics.json"; }
if timeout 300 "${MPIRUN[@]}" -np 2 "$PE" --model $MOE --directives "$T/pp2.json" --schedule gpipe --mbs 8 \
  --iters 1 --quiet --out "$T/gpipe" >"$T/mem.log" 2>&1 &&
  [ -d "$T/pp2_1f1b" ]; then
  [ "$(mem "$T/pp2_1f1b")" -lt "$(( $(mem "$T/gpipe") / 2 ))" ] && ok ||
    bad "1F1B activations $(mem "$T/pp2_1f1b") not below half of GPipe's $(mem "$T/gpipe")"
else
  bad "gpipe run: $(tail -3 "$T/mem.log")"
fi

# the command of the issue's "done when", as written (plus a place for its output)
if timeout 300 "${MPIRUN[@]}" -np 4 "$PE" --backend host --model $MOE --base-schedule $BS/pp2_dp2_ep2.json \
  --schedule 1f1b --ranks 2 --mbs 4 --out "$T/done" >"$T/done.log" 2>&1; then
  grep -q "final loss" "$T/done.log" && [ -s "$T/done/1f1b_pp2_mbs4.json" ] && [ -s "$T/done/trace.json" ] \
    && ok || bad "done-when run output: $(tail -3 "$T/done.log")"
else
  bad "done-when run: $(tail -5 "$T/done.log")"
fi

# --- checkpoint at step 2, resume, compare with an uninterrupted run: identical ---------------
CK=(--base-schedule $BS/pp2_dp2_ep2_zero3.json --schedule 1f1b --ranks 2 --mbs 4 --warmup 0 --quiet --timeout 60)
if "${MPIRUN[@]}" -np 4 "$PE" --model $MOE "${CK[@]}" --iters 4 --out "$T/whole" >"$T/ck.log" 2>&1 &&
  "${MPIRUN[@]}" -np 4 "$PE" --model $MOE "${CK[@]}" --iters 2 --out "$T/first" --checkpoint "$T/ck" \
    --checkpoint-every 2 >>"$T/ck.log" 2>&1 &&
  "${MPIRUN[@]}" -np 4 "$PE" --model $MOE "${CK[@]}" --iters 4 --out "$T/rest" --resume "$T/ck" >>"$T/ck.log" 2>&1; then
  [ -f "$T/ck/latest" ] && [ -f "$T/ck/step-2/rank-3.ckpt" ] && ok || bad "checkpoint files"
  [ "$(losses "$T/first"; losses "$T/rest")" = "$(losses "$T/whole")" ] && ok ||
    bad "resumed losses differ: $(losses "$T/rest" | tr '\n' ' ') vs $(losses "$T/whole" | tr '\n' ' ')"
  # a corrupt shard is refused, naming the file
  printf '\x55' | dd of="$T/ck/step-2/rank-2.ckpt" bs=1 seek=4096 conv=notrunc 2>/dev/null
  "${MPIRUN[@]}" -np 4 "$PE" --model $MOE "${CK[@]}" --iters 4 --no-report --resume "$T/ck" >"$T/bad.log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && grep -q "rank-2.ckpt: checksum mismatch" "$T/bad.log" && ok || bad "corrupt checkpoint: exit $rc $(tail -3 "$T/bad.log")"
else
  bad "checkpoint runs: $(tail -5 "$T/ck.log")"
fi

# --- a killed rank and a stuck plan end in a clear error within the timeout ------------------
start=$(date +%s)
PIPER_EXEC_FAULT=kill:1:2 timeout 120 "${MPIRUN[@]}" -np 4 "$PE" --model $MOE --base-schedule $BS/pp2_dp2_ep2.json \
  --schedule 1f1b --ranks 2 --mbs 4 --iters 50 --timeout 10 --no-report --quiet >"$T/kill.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 60 ] && grep -q "piper-exec: error: rank [0-9]" "$T/kill.log" \
  && ok || bad "killed rank: exit $rc after ${took}s: $(tail -5 "$T/kill.log")"
# The stalled rank names its own stuck instruction. Two timings a loaded machine breaks when
# every rank has one short --timeout: the ranks start seconds apart (a rank that waits in
# start-up longer than its timeout reports "in start-up"), and the healthy peer, idle from a
# little later, reports only about 0.5 s after the stalled rank (a 0.6 s handicap on the
# stalled rank was enough for rank 0 to report first and end the job). So the stalled rank's
# timeout is derived from a healthy run of the same job timed now (1.5 times it, at least 3 s),
# and the healthy rank gets four times that (one mpirun, an argument list per rank).
STALL_ARGS=(--model $MOE --directives "$T/pp2.json" --schedule 1f1b --ranks 2 --mbs 4 --no-report --quiet)
start=$(date +%s.%N)
timeout 120 "${MPIRUN[@]}" -np 2 "$PE" "${STALL_ARGS[@]}" --warmup 0 --iters 2 --timeout 60 >"$T/healthy.log" 2>&1 ||
  bad "stuck plan's healthy run: $(tail -5 "$T/healthy.log")"
healthy=$(python3 -c "import math, sys; print(math.ceil(float(sys.argv[2]) - float(sys.argv[1])))" "$start" "$(date +%s.%N)")
to=$(((3 * healthy + 1) / 2))
[ "$to" -ge 3 ] || to=3
limit=$((2 * healthy + to + 20))
start=$(date +%s)
PIPER_EXEC_FAULT=stall:1:2 timeout 120 "${MPIRUN[@]}" -np 1 "$PE" "${STALL_ARGS[@]}" --iters 50 --timeout $((4 * to)) \
  : -np 1 "$PE" "${STALL_ARGS[@]}" --iters 50 --timeout $to >"$T/stall.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
# one watchdog line, the stalled rank's: idle past the timeout by under a look's gap (1 s)
[ "$rc" -eq 1 ] && [ "$took" -lt "$limit" ] && [ "$(grep -c watchdog "$T/stall.log")" -eq 1 ] &&
  grep -Eq "piper-exec: error: rank 1: watchdog: no progress for ($to\.[0-9]|$((to + 1))\.0) s: stream \"[^\"]*\" is stuck in instruction [0-9]* \"recv F" "$T/stall.log" \
  && ok || bad "stuck plan (--timeout $to, healthy run ${healthy}s): exit $rc after ${took}s (limit ${limit}s): $(tail -5 "$T/stall.log")"

# --- resume refuses what it cannot continue exactly; checkpoint housekeeping (issue 16) -------
# A checkpoint records its run's sharding, placement, batch shape, seed, data and optimizer;
# a resume that differs is refused with exit 2 and one line naming the difference (the lowest
# refusing rank says it, the job ends without an abort), or, for a change allowed with
# --resume-allow-change, accepted and said on stdout.
# expect_refusal NAME WANT LOG RC: exit 2, one "piper-exec: error:" line, naming WANT, no abort
expect_refusal() {
  local name=$1 want=$2 log=$3 rc=$4
  local n; n=$(grep -c "^piper-exec: error: " "$log")
  if [ "$rc" -eq 2 ] && [ "$n" -eq 1 ] && grep -q "^piper-exec: error: resume: .*$want" "$log" &&
    ! grep -q "MPI_ABORT" "$log"; then
    ok
  else
    bad "$name: exit $rc, $n error lines: $(grep -v '^step' "$log" | head -5)"
  fi
}
Z=(--model $MOE --schedule 1f1b --ranks 2 --mbs 4 --warmup 0 --quiet --timeout 60 --no-charts)
Z2=(--base-schedule $BS/pp2_dp2_ep2_zero2.json)
Z3=(--base-schedule $BS/pp2_dp2_ep2_zero3.json)
PLAIN=(--base-schedule $BS/pp2_dp2_ep2.json)
# ZeRO-2, 3 steps, a checkpoint every 2: the last step is checkpointed too, and resuming it under
# the same plan continues bit-identically
if "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${Z2[@]}" --iters 3 --checkpoint "$T/z2" --checkpoint-every 2 \
    --out "$T/z2first" >"$T/z2.log" 2>&1 &&
  "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${Z2[@]}" --iters 4 --resume "$T/z2" --out "$T/z2rest" >>"$T/z2.log" 2>&1 &&
  "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${Z2[@]}" --iters 4 --out "$T/z2whole" >>"$T/z2.log" 2>&1; then
  [ "$(cat "$T/z2/latest")" = step-3 ] && [ -f "$T/z2/step-2/rank-3.ckpt" ] && [ -f "$T/z2/step-3/rank-3.ckpt" ] \
    && ok || bad "final checkpoint: latest is $(cat "$T/z2/latest"), $(ls "$T/z2")"
  [ "$(losses "$T/z2first"; losses "$T/z2rest")" = "$(losses "$T/z2whole")" ] && ok ||
    bad "ZeRO-2 resumed losses differ: $(losses "$T/z2rest" | tr '\n' ' ') vs $(losses "$T/z2whole" | tr '\n' ' ')"
  # the issue's silent divergence: a ZeRO-2 checkpoint under the plain plan
  "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${PLAIN[@]}" --iters 5 --resume "$T/z2" --no-report >"$T/r.log" 2>&1
  expect_refusal "ZeRO-2 under the plain plan" \
    "was written with shard_grads (ZeRO-2) on device group \[0,1\] .*this plan has no sharding on device group \[0,1\]" "$T/r.log" $?
  # a new learning rate: refused, then accepted with the flag and said on stdout
  "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${Z2[@]}" --iters 5 --resume "$T/z2" --lr 0.002 --no-report >"$T/r.log" 2>&1
  expect_refusal "new lr" "was written with lr 0.001, now 0.002 (--resume-allow-change lr to accept)" "$T/r.log" $?
  if "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${Z2[@]}" --iters 5 --resume "$T/z2" --lr 0.002 \
    --resume-allow-change lr,weight_decay --no-report >"$T/r.log" 2>&1; then
    grep -q "^resume: from $T/z2 (step 3) with lr 0.001 -> 0.002, allowed by --resume-allow-change$" "$T/r.log" \
      && ok || bad "allowed lr change not said: $(head -3 "$T/r.log")"
  else
    bad "--resume-allow-change lr: $(tail -3 "$T/r.log")"
  fi
  # another micro-batch count is refused
  "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" --mbs 2 "${Z2[@]}" --iters 5 --resume "$T/z2" --no-report >"$T/r.log" 2>&1
  expect_refusal "other micro-batches" "micro-batches per step on this device 4, this plan has 2" "$T/r.log" $?
else
  bad "ZeRO-2 checkpoint runs: $(tail -5 "$T/z2.log")"
fi
# the issue's NaN: a ZeRO-3 checkpoint under the plain plan
if "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${Z3[@]}" --iters 1 --checkpoint "$T/z3" --checkpoint-every 1 \
    --no-report >"$T/z3.log" 2>&1; then
  "${MPIRUN[@]}" -np 4 "$PE" "${Z[@]}" "${PLAIN[@]}" --iters 3 --resume "$T/z3" --no-report >"$T/r.log" 2>&1
  expect_refusal "ZeRO-3 under the plain plan" "was written with shard_params (ZeRO-3) on device group \[0,1\]" "$T/r.log" $?
else
  bad "ZeRO-3 checkpoint run: $(tail -5 "$T/z3.log")"
fi

# one process: --checkpoint-keep keeps the last K step directories, a crashed writer's
# temporary files go when checkpointing starts
KD=(--model $DENSE --directives "$T/one.json" --mbs 2 --warmup 0 --no-report --quiet)
mkdir -p "$T/keep/step-2"
echo junk >"$T/keep/latest.tmp"
echo junk >"$T/keep/step-2/rank-0.ckpt.tmp"
if "$PE" "${KD[@]}" --iters 5 --checkpoint "$T/keep" --checkpoint-every 2 --checkpoint-keep 2 2>"$T/err"; then
  [ "$(cat "$T/keep/latest")" = step-5 ] && [ "$(cd "$T/keep" && ls -d step-* | tr '\n' ' ')" = "step-4 step-5 " ] \
    && ok || bad "--checkpoint-keep 2: latest $(cat "$T/keep/latest"), $(ls "$T/keep" | tr '\n' ' ')"
  [ -z "$(find "$T/keep" -name '*.tmp')" ] && ok || bad "stale tmp files left: $(find "$T/keep" -name '*.tmp')"
else
  bad "--checkpoint-keep run: $(cat "$T/err")"
fi
expect_bad "keep without checkpoint" "--checkpoint-keep goes with --checkpoint" "${KD[@]}" --iters 1 --checkpoint-keep 2
expect_bad "allow without resume" "--resume-allow-change goes with --resume" "${KD[@]}" --iters 1 --resume-allow-change lr
expect_bad "allow bad name" '"momentum" is not one of' "${KD[@]}" --iters 1 --resume "$T/keep" --resume-allow-change lr,momentum

# --dump-params on a full device: exit 1 naming it, and the device stays a device
if [ -c /dev/full ]; then
  "$PE" "${KD[@]}" --iters 1 --dump-params /dev/full >"$T/out" 2>"$T/err"
  rc=$?
  [ "$rc" -eq 1 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^piper-exec: error: /dev/full: " "$T/err" \
    && ok || bad "--dump-params /dev/full: exit $rc: $(cat "$T/err")"
  [ -c /dev/full ] && ok || bad "/dev/full is no longer a character device"
  "$PE" "${KD[@]}" --iters 1 --dump-params /dev/null 2>"$T/err" && [ -c /dev/null ] && ok ||
    bad "--dump-params /dev/null: $(cat "$T/err")"
fi

echo "test_exec.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
