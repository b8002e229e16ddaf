#!/usr/bin/env bash
# Nothing is lost, nothing is silent: default run directories are new for every run (two in
# one second get _2), an --out holding another run is refused without --force, device ids
# have no gap and every pipeline stage has a place, piper-exec finds unwritable outputs and a
# model too big for the host before the first step, stops at a step boundary on SIGINT or
# SIGTERM (exit 130, with the steps done written), and under MPI says an error once.
# Each case checks the exit status and the message. Run from the repository root.
set -u
BIN=${PIPER_BIN:-bin}
ROOT=$(pwd)
case $BIN in /*) ;; *) BIN="$ROOT/$BIN" ;; esac # the runs below change directory
SIM="$BIN/piper-sim"
PE="$BIN/piper-exec"
PC="$BIN/piper-compile"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

DENSE="$ROOT/models/tiny-dense.json"
UNIT="$ROOT/profiles/unit.json"
PP4="$ROOT/directives/base-schedules/pp4.json"
echo '[]' >"$T/one.json"

# expect NAME STATUS PATTERN CMD...: exit status STATUS and PATTERN (fixed string) on stderr
expect() {
  local name=$1 want=$2 pattern=$3
  shift 3
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    bad "$name: exit $rc, not $want: $(cat "$T/err")"
  elif [ -n "$pattern" ] && ! grep -qF -- "$pattern" "$T/err"; then
    bad "$name: no \"$pattern\" in: $(cat "$T/err")"
  else
    ok
  fi
}

# --- default run directories: new every run, sortable, _2 within one second ---------------------
mkdir -p "$T/cwd"
(
  cd "$T/cwd" || exit 1
  for k in 1 2 3; do
    "$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --no-charts --quiet || exit 1
  done
) && ok || bad "three default sim runs"
n=$(find "$T/cwd/out" -name metrics.json | wc -l)
[ "$n" -eq 3 ] && ok || bad "three default sim runs share directories: $n metrics.json"
ls "$T/cwd/out" | grep -qvE '^[0-9]{8}_[0-9]{6}(_[0-9]+)?$' &&
  bad "unsortable names: $(ls "$T/cwd/out")" || ok
# every name this second and the next few taken: the run gets _2
rm -rf "$T/cwd/out"
now=$(date +%s)
for s in 0 1 2 3 4 5; do mkdir -p "$T/cwd/out/$(date -d "@$((now + s))" +%Y%m%d_%H%M%S)"; done
(cd "$T/cwd" && "$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --no-charts --quiet)
found=$(cd "$T/cwd/out" && ls -d *_2 2>/dev/null)
[ -n "$found" ] && [ -f "$T/cwd/out/$found/metrics.json" ] && ok ||
  bad "a taken name does not give _2: $(ls "$T/cwd/out")"
# two piper-exec runs at once
rm -rf "$T/cwd/out"
(cd "$T/cwd" && "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1 --quiet --no-charts) &
(cd "$T/cwd" && "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1 --quiet --no-charts) &
wait
n=$(find "$T/cwd/out" -name metrics.json | wc -l)
[ "$n" -eq 2 ] && ok || bad "two exec runs at once: $n metrics.json in $(ls "$T/cwd/out")"

# --- an explicit --out that holds another run --------------------------------------------------
"$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --no-charts --quiet --out "$T/sim" ||
  bad "first sim run"
expect "sim --out reused" 2 "--out $T/sim: the directory holds another run's metrics.json" \
  "$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --no-charts --quiet --out "$T/sim"
expect "sim --out reused, --force" 0 "" \
  "$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --no-charts --quiet --out "$T/sim" --force
mkdir -p "$T/csv" && echo x >"$T/csv/results.csv"
expect "exec --out reused" 2 "--out $T/csv: the directory holds another run's results.csv" \
  "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1 --quiet --out "$T/csv"
expect "exec --out reused, --force" 0 "" \
  "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1 --quiet --no-charts --out "$T/csv" --force
mkdir -p "$T/tr" && echo x >"$T/tr/trace.json"
expect "sim --out with a trace.json" 2 "holds another run's trace.json" \
  "$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --quiet --out "$T/tr"
mkdir -p "$T/empty"
expect "an empty --out is fine" 0 "" \
  "$SIM" --model "$DENSE" --directives "$PP4" --profile "$UNIT" --no-charts --quiet --out "$T/empty"

# --- device ids contiguous from 0; every stage placed ------------------------------------------
sed 's/"devices": \[1\]/"devices": [7]/' "$PP4" >"$T/typo.json"
expect "device id gap (sim)" 2 "nothing runs on device 1 while device 7 is used" \
  "$SIM" --model "$DENSE" --directives "$T/typo.json" --profile "$UNIT" --out "$T/typo"
expect "device id gap (compile)" 2 "directive 1 (place): device ids must be contiguous from 0" \
  "$PC" --model "$DENSE" --directives "$T/typo.json"
expect "device id gap (exec)" 2 "give --devices N for a larger world" \
  "$PE" --model "$DENSE" --directives "$T/typo.json" --no-report
expect "--devices 8 makes the world larger" 0 "" \
  "$PC" --model "$DENSE" --directives "$T/typo.json" --devices 8
[ ! -e "$T/typo" ] && ok || bad "a refused sim run left $T/typo"
printf '[\n  {"op": "place", "filter": {"PP": 0}, "devices": [0]},\n  {"op": "place", "filter": {"PP": 1}, "devices": [1]}\n]\n' >"$T/unplaced.json"
expect "unplaced stage" 2 "pipeline stage PP=2 has no place" \
  "$PC" --model "$DENSE" --directives "$T/unplaced.json"
# with a schedule too: the layout written for 2 regions is named as such, not as a rank count
expect "unplaced stage (schedule)" 2 "pipeline stage PP=2 has no place: no place, replicate or shard directive selects it, and the model is cut into 4 PP regions (is the program written for --pp-regions 2?)" \
  "$PC" --model "$DENSE" --directives "$T/unplaced.json" --schedule 1f1b --mbs 4
"$PC" --model "$DENSE" --directives "$T/one.json" >"$T/out" 2>"$T/err" &&
  grep -q ": 1 devices" "$T/out" && ok || bad "no placement at all is one device: $(cat "$T/out" "$T/err")"

# --- piper-exec: outputs checked before the first step -----------------------------------------
echo x >"$T/file"
expect "unwritable --out" 2 "--out $T/file/run: cannot write there" \
  "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1000000 --out "$T/file/run"
expect "unwritable --checkpoint" 2 "--checkpoint $T/file/ck: cannot write there" \
  "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1000000 --no-report \
  --checkpoint "$T/file/ck" --checkpoint-every 1
expect "unwritable --dump-params" 2 "--dump-params $T/nodir/p.bin: cannot write there" \
  "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1000000 --no-report \
  --dump-params "$T/nodir/p.bin"
expect "model too big for the host" 2 "does not fit this machine's memory: about" \
  "$PE" --model "$ROOT/models/llama3-70b.json" --directives "$T/one.json" --no-report --quiet
grep -qF "GiB is available (MemAvailable in /proc/meminfo)" "$T/err" && ok ||
  bad "the memory refusal gives no figure: $(cat "$T/err")"

# --- a signal stops at a step boundary: exit 130, the steps done written ------------------------
for sig in INT TERM; do
  "$PE" --model "$DENSE" --directives "$T/one.json" --iters 1000000 --quiet --no-charts \
    --out "$T/stop$sig" >"$T/out" 2>"$T/err" &
  pid=$!
  for _ in $(seq 100); do # until training has started (a few steps in)
    sleep 0.1
    grep -q "tiny-dense on 1 device" "$T/out" 2>/dev/null && break
  done
  sleep 1
  kill -s "$sig" "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" -eq 130 ] && ok || bad "SIG$sig: exit $rc, not 130: $(cat "$T/err")"
  grep -q "stopped by a signal after step [0-9]* of 1000001; the run directory holds the steps done" \
    "$T/err" && ok || bad "SIG$sig: no stop message: $(cat "$T/err")"
  python3 - "$T/stop$sig/metrics.json" <<'EOF' && ok || bad "SIG$sig: metrics.json"
import json, sys
m = json.load(open(sys.argv[1]))
assert 1 <= len(m["losses"]) < 1000001, len(m["losses"])
assert m["stopped_after_step"] == len(m["losses"]), m["stopped_after_step"]
EOF
done

# --- under MPI an error every rank finds is said once ------------------------------------------
if command -v mpirun >/dev/null && "$PE" --list-backends | grep -q MPI; then
  MPIRUN=(mpirun --oversubscribe)
  timeout 120 "${MPIRUN[@]}" -np 2 "$PE" --model "$ROOT/models/tiny-moe-missing.json" \
    --directives "$T/one.json" >"$T/mpi.log" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] && ok || bad "MPI bad model: exit $rc"
  [ "$(grep -c "piper-exec: error:" "$T/mpi.log")" -eq 1 ] && ok ||
    bad "MPI bad model: not one error line: $(cat "$T/mpi.log")"
  timeout 120 "${MPIRUN[@]}" -np 3 "$PE" --model "$ROOT/models/tiny-moe.json" \
    --directives "$ROOT/directives/base-schedules/dp2.json" --mbs 2 --no-report >"$T/mpi.log" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] && ok || bad "MPI wrong process count: exit $rc"
  [ "$(grep -c "piper-exec: error:" "$T/mpi.log")" -eq 1 ] && ok ||
    bad "MPI wrong process count: not one error line: $(cat "$T/mpi.log")"
  grep -q "MPI_ABORT\|terminated by the launcher" "$T/mpi.log" &&
    bad "MPI wrong process count: an abort banner: $(cat "$T/mpi.log")" || ok
  # SIGINT to rank 1 alone: both ranks stop after the same step, rank 0 writes the run
  timeout 120 "${MPIRUN[@]}" -np 2 "$PE" --model "$ROOT/models/tiny-moe.json" \
    --directives "$ROOT/directives/base-schedules/dp2.json" --mbs 2 --iters 1000000 --quiet \
    --no-charts --out "$T/mpistop" >"$T/mpi.log" 2>&1 &
  mp=$!
  rank1=
  for _ in $(seq 100); do
    sleep 0.1
    for p in $(pgrep -f -- "--out $T/mpistop"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && rank1=$p
    done
    [ -n "$rank1" ] && break
  done
  sleep 4
  [ -n "$rank1" ] && kill -INT "$rank1"
  wait "$mp"
  rc=$?
  [ "$rc" -eq 130 ] && ok || bad "MPI SIGINT to rank 1: exit $rc: $(cat "$T/mpi.log")"
  grep -q "stopped by a signal after step" "$T/mpi.log" && ok ||
    bad "MPI SIGINT to rank 1: no stop message: $(cat "$T/mpi.log")"
  grep -q "terminated by the launcher\|MPI_ABORT" "$T/mpi.log" &&
    bad "MPI SIGINT to rank 1: a failure message: $(cat "$T/mpi.log")" || ok
  python3 - "$T/mpistop/metrics.json" <<'EOF' && ok || bad "MPI SIGINT to rank 1: metrics.json"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["stopped_after_step"] == len(m["losses"]) >= 1
EOF
fi

echo "test_runs.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
