#!/usr/bin/env bash
# A stalled or stopped rank ends a 4-rank job (tiny-moe, pp2_dp2_ep2, 1F1B, --timeout 3) with the
# watchdog's line and exit status 1, within a bounded time: never a signal (139, 134), never a
# hang, never exit 0. Stalls are injected in every kind of communication (PIPER_EXEC_FAULT=
# stall:KIND:RANK:STEP: a receive nothing matches, cancelled like a real one), a rank stops
# itself at a step's start and at start-up (stop:RANK:STEP, step 0: before the communicators
# exist, so its peers wait inside MPI_Comm_split), and one rank is sent SIGSTOP from outside in
# the middle of a step. Every rank stopped together past --timeout and resumed apart is a pause,
# not a hang: the job trains to its end and nobody is blamed. FAULT_REPEAT=N runs each case N times (default 1).
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
REPEAT=${FAULT_REPEAT:-1}
BS=directives/base-schedules
JOB=(mpirun --oversubscribe -np 4 "$PE" --model models/tiny-moe.json --schedule 1f1b --ranks 2 --mbs 4
  --timeout 3 --no-report)
LIMIT=40 # seconds: 3 s of watchdog, the job's start-up and its end on 2 shared cores

if ! command -v mpirun >/dev/null || ! "$PE" --list-backends | grep -q "MPI"; then
  bad "mpirun or piper-exec's MPI support is missing"
  echo "test_faults.sh: $pass passed, $failed failed"
  exit 1
fi

# judge NAME RC TOOK LOG [PATTERN]: exit 1 in time, the watchdog's line (matching PATTERN when
# given), no rank with two of them, no crash
judge() {
  local name=$1 rc=$2 took=$3 log=$4 want=${5:-}
  local lines
  lines=$(grep -c "piper-exec: error: rank [0-9]*: watchdog: no progress for" "$log")
  if [ "$rc" -ne 1 ] || [ "$took" -ge "$LIMIT" ]; then
    bad "$name: exit $rc after ${took}s (want 1 within ${LIMIT}s): $(grep -v '^step' "$log" | tail -4)"
  elif [ "$lines" -lt 1 ]; then
    bad "$name: no watchdog line: $(grep -a "piper" "$log" | tail -6)"
  elif [ -n "$want" ] && ! grep -q "$want" "$log"; then
    bad "$name: no line matching '$want': $(grep watchdog "$log")"
  elif grep -qiE "segmentation|signal [0-9]|core dumped|aborted" "$log"; then
    bad "$name: a rank crashed: $(grep -iE "segmentation|signal|core dumped|aborted" "$log" | head -3)"
  elif [ -n "$(grep -o "piper-exec: error: rank [0-9]*: watchdog" "$log" | sort | uniq -d)" ]; then
    bad "$name: a rank reported twice: $(grep watchdog "$log")"
  else
    ok
    return 0
  fi
  return 1
}

# fault NAME FAULT BASE_SCHEDULE [PATTERN]: one injected fault
fault() {
  local name=$1 f=$2 bs=$3 want=${4:-} k start rc
  for k in $(seq "$REPEAT"); do
    start=$(date +%s)
    PIPER_EXEC_FAULT=$f timeout 120 "${JOB[@]}" --base-schedule "$BS/$bs.json" --iters 50 --quiet \
      >"$T/$name.log" 2>&1
    rc=$?
    judge "$name ($f, run $k)" "$rc" $(($(date +%s) - start)) "$T/$name.log" "$want"
  done
}

W='watchdog: no progress for [0-9.]* s'
# --- a stall in every kind of communication -------------------------------------------------
# (which rank reports first is a race: the stalled one, or a peer that waited on it longer)
fault stall-first stall:1:2 pp2_dp2_ep2 "$W: stream"
fault stall-send stall:send:1:2 pp2_dp2_ep2 "$W: stream"
fault stall-recv stall:recv:2:2 pp2_dp2_ep2 "$W: stream"
fault stall-all-reduce stall:all-reduce:2:2 pp2_dp2_ep2 "$W: stream"
fault stall-all-to-all stall:all-to-all:3:2 pp2_dp2_ep2 "$W: stream"
fault stall-all-gather stall:all-gather:1:2 pp2_dp2_ep2_zero3 "$W: stream"
fault stall-reduce-scatter stall:reduce-scatter:0:2 pp2_dp2_ep2_zero3 "$W: stream"

# --- a rank stopped: at a step's start, and at start-up (peers inside MPI_Comm_split) ----------
# (peers may be inside the step or in the job-wide operation that ends the one before)
fault stop-step stop:2:3 pp2_dp2_ep2 "$W\(: stream\| in a job-wide operation between steps\)"
fault stop-startup stop:1:0 pp2_dp2_ep2 "$W in creating communicator"

# --- SIGSTOP from outside, in the middle of a step -------------------------------------------
for k in $(seq "$REPEAT"); do
  start=$(date +%s)
  timeout 120 "${JOB[@]}" --base-schedule "$BS/pp2_dp2_ep2.json" --iters 100000 >"$T/sigstop.log" 2>&1 &
  job=$!
  # wait until steps run, then stop one rank (children of mpirun, itself the child of timeout)
  for _ in $(seq 200); do grep -q "^step *3/" "$T/sigstop.log" && break; sleep 0.1; done
  mpi=$(pgrep -P "$job" -x mpirun)
  victim=$(pgrep -P "$mpi" -x piper-exec | sed -n 2p)
  sleep 0.$((RANDOM % 10))
  if [ -z "$victim" ]; then
    bad "SIGSTOP mid-step (run $k): no rank to stop: $(tail -3 "$T/sigstop.log")"
    kill "$job"
    wait "$job"
    continue
  fi
  kill -STOP "$victim"
  wait "$job"
  rc=$?
  # the stop lands at a random moment: inside a step (a stream waits) or between steps (the
  # job-wide operation that ends one); the watchdog names either, one line
  judge "SIGSTOP mid-step (run $k)" "$rc" $(($(date +%s) - start)) "$T/sigstop.log" \
    "$W\(: stream\| in a job-wide operation between steps\)"
done

# --- every rank SIGSTOPped together for longer than --timeout, resumed 0.3 s apart -------------
# A resumed rank must not count its own pause as its peer's silence (the watchdog thread and the
# runner's wait both take a long gap between two looks for a stop): exit 0, no watchdog line.
for k in $(seq "$REPEAT"); do
  timeout 120 "${JOB[@]}" --base-schedule "$BS/pp2_dp2_ep2.json" --iters 600 >"$T/pause.log" 2>&1 &
  job=$!
  for _ in $(seq 200); do grep -q "^step *3/" "$T/pause.log" && break; sleep 0.1; done
  mpi=$(pgrep -P "$job" -x mpirun)
  ranks=$(pgrep -P "$mpi" -x piper-exec)
  if [ "$(echo "$ranks" | wc -w)" != 4 ]; then
    bad "paused job (run $k): 4 ranks wanted, found '$ranks': $(tail -3 "$T/pause.log")"
    kill "$job"
    wait "$job"
    continue
  fi
  kill -STOP $ranks
  sleep 5 # past --timeout 3
  for r in $ranks; do
    kill -CONT "$r"
    sleep 0.3
  done
  wait "$job"
  rc=$?
  if [ "$rc" -ne 0 ] || grep -q "watchdog" "$T/pause.log" || ! grep -q "^step *601/601" "$T/pause.log"; then
    bad "paused job (run $k): exit $rc: $(grep -v '^step' "$T/pause.log" | tail -3)"
  else
    ok
  fi
done

echo "test_faults.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
