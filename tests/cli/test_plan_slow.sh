#!/usr/bin/env bash
# piper-plan --rank-by slow-gpu[=F] (issue 35): the top configurations simulated again with one
# GPU F times slower on each pipeline rank in turn, ranked by the fraction of the step it costs
# (slow-gpu.csv). On the unit profile (F 1, B 2 per stage, communication free) the textbook
# holds exactly: pure data parallelism loses F - 1 (every replica waits for the slow one at the
# gradient all-reduce), a 1F1B pipeline of R stages and M micro-batches, its stage r slowed by s
# (W = R - 1 - r stages after it), takes 3r + 3sM + W max(0, 3 - s) + W max(0, 3 - 2s) against
# 3(M + R - 1) (docs/sim.md, test_scenario_slow_stage_1f1b): the pipeline's idle time absorbs
# part of the delay, so the pipeline ranks as more tolerant though it is slower healthy.
# Run from the repository root.
set -u
BIN=${PIPER_BIN:-bin}
PLAN="$BIN/piper-plan"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; passes=$((passes + 1)); }

[ -x "$PLAN" ] || { echo "FAIL: $PLAN not built"; exit 1; }

base=(--model models/tiny-dense.json --devices 8 --profile profiles/unit.json --global-batch 32
      --pp 1,4 --tp 1 --schedules 1f1b --top 20 --no-charts --quiet)
if "$PLAN" "${base[@]}" --rank-by slow-gpu=2 --out "$tmp/s" > "$tmp/stdout" 2> "$tmp/stderr"; then
  ok "--rank-by slow-gpu=2 exits 0"
  python3 - "$tmp/s" <<'PY' && ok "slow-gpu.csv: the pipeline ranks above data parallelism, the textbook losses" || fail "slow-gpu.csv: $(cat "$tmp/s/slow-gpu.csv")"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/slow-gpu.csv")))
plan = list(csv.DictReader(open(sys.argv[1] + "/plan.csv")))
# one row per ZeRO level (0-3) of each of the two layouts
assert len(rows) == len(plan) == 8, (len(rows), len(plan))
half = len(rows) // 2
s, R, M_pp, M_dp = 2.0, 4, 8, 2  # global batch 32, micro-batches of 2: dp 2 x 8, dp 8 x 2
def f1b(r, s, R, M):
    W = R - 1 - r
    return 3 * r + 3 * s * M + W * max(0, 3 - s) + W * max(0, 3 - 2 * s)
worst = max(range(R), key=lambda r: f1b(r, s, R, M_pp))
want_pp = f1b(worst, s, R, M_pp) / (3 * (M_pp + R - 1)) - 1
for k, r in enumerate(rows):
    pp = "pp=4" in r["configuration"]
    # healthy, data parallelism is faster: it ranks first in plan.csv
    assert pp == (int(r["healthy_rank"]) > half), r
    # with one slow GPU, the pipeline loses less: its rows come first
    assert pp == (k < half), r
    loss = float(r["loss_fraction"])
    want = want_pp if pp else s - 1
    assert abs(loss - want) < 1e-9, (r, want)
    assert int(r["worst_pp_rank"]) == (worst if pp else 0), r
    assert abs(float(r["slowed_step_s"]) / float(r["healthy_step_s"]) - 1 - loss) < 1e-12, r
PY
  grep -q "one GPU x2 slower" "$tmp/stdout" && grep -q "^  #1 1f1b pp=4,dp=2" "$tmp/stdout" \
    && ok "summary: the slow-GPU ranking" || fail "summary: $(cat "$tmp/stdout")"
else
  fail "--rank-by slow-gpu=2: $(cat "$tmp/stderr")"
fi
# the default factor, and --top bounds the configurations simulated again
"$PLAN" "${base[@]}" --rank-by slow-gpu --top 2 --out "$tmp/d" > "$tmp/stdout" 2>/dev/null \
  && [ "$(wc -l < "$tmp/d/slow-gpu.csv")" -eq 3 ] && grep -q ',1.3,' "$tmp/d/slow-gpu.csv" \
  && ok "slow-gpu: factor 1.3, the top 2" || fail "default factor: $(cat "$tmp/d/slow-gpu.csv" 2>/dev/null)"
# nothing under the cap: nothing to simulate again, one line, a header-only slow-gpu.csv
"$PLAN" "${base[@]}" --rank-by slow-gpu --memory-cap 0.000001 --out "$tmp/c" > "$tmp/stdout" 2>/dev/null \
  && grep -q "no feasible configuration to simulate again" "$tmp/stdout" \
  && [ "$(wc -l < "$tmp/c/slow-gpu.csv")" -eq 1 ] && ok "slow-gpu: none feasible" \
  || fail "none feasible: $(cat "$tmp/stdout")"
"$PLAN" "${base[@]}" --rank-by throughput --out "$tmp/t" > /dev/null 2>&1 && [ ! -e "$tmp/t/slow-gpu.csv" ] \
  && ok "--rank-by throughput: no slow-gpu.csv" || fail "--rank-by throughput"

expect_input_error() {  # expect_input_error WHAT-IN-MESSAGE ARGS...
  local want=$1
  shift
  "$PLAN" "$@" > /dev/null 2> "$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "exit $rc, want 2: $* ($(cat "$tmp/err"))"; return; fi
  if [ "$(wc -l < "$tmp/err")" -ne 1 ]; then fail "not one line: $(cat "$tmp/err")"; return; fi
  grep -q "^piper-plan: error: .*$want" "$tmp/err" && ok "bad input: $want" \
    || fail "message lacks '$want': $(cat "$tmp/err")"
}
expect_input_error '--rank-by: "slow-gpu=1"' "${base[@]}" --rank-by slow-gpu=1 --out "$tmp/e1"
expect_input_error '--rank-by: "slow-gpu=x"' "${base[@]}" --rank-by slow-gpu=x --out "$tmp/e2"
expect_input_error '--rank-by: "memory"' "${base[@]}" --rank-by memory --out "$tmp/e3"
expect_input_error "--sweep takes" --sweep x.json --rank-by slow-gpu

if [ $fails -ne 0 ]; then
  echo "test_plan_slow.sh: $passes passed, $fails failed"
  exit 1
fi
echo "test_plan_slow.sh: $passes passed, 0 failed"
