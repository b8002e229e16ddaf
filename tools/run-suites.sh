#!/usr/bin/env bash
# Runs test suites (unit binaries, CLI scripts), at most JOBS at a time, and prints each one's
# output whole and in the order given: "== NAME", its output, then one timing line
# ("time: NAME 12.3 s wall, 11.9 s user, 0.4 s sys, load 1.52"; load is the 1-minute load
# average when it ended). Suites run side by side write to their own buffer, so the log reads
# as a serial run would and tools/test-totals.sh counts it alike. Exit status 1 when any
# suite failed.
#
#   tools/run-suites.sh [-j JOBS] [--prefix CMD] SUITE...
#
# A SUITE ending in .sh runs under bash; anything else is run as a program. --prefix CMD
# (words) goes before each, e.g. "env PIPER_LONG_TESTS=1". JOBS defaults to 1; with 2 on a
# 2-core machine each suite keeps one core. A SUITE written @SUITE runs alone, nothing beside
# it: one that starts MPI jobs (its ranks already take the cores: beside another suite they
# would be oversubscribed, and the busy-polling ranks slow everything), runs threads, or
# watches a shared folder.
set -u
jobs=1
prefix=()
while [ $# -gt 0 ]; do
  case $1 in
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --prefix) read -r -a prefix <<< "$2"; shift 2 ;;
    --) shift; break ;;
    -*) echo "run-suites.sh: error: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
case $jobs in '' | *[!0-9]* | 0) echo "run-suites.sh: error: -j wants a positive count, got '$jobs'" >&2; exit 2 ;; esac
suites=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_one() {
  local i=$1 s=${2#@} cmd log rc
  log=$tmp/$i.log
  if [[ $s == *.sh ]]; then cmd=(bash "$s"); else cmd=("$s"); fi
  echo "== $s" > "$log"
  TIMEFORMAT="time: $s %R s wall, %U s user, %S s sys"
  { time "${prefix[@]}" "${cmd[@]}" >> "$log" 2>&1 < /dev/null; } 2> "$tmp/$i.time"
  rc=$?
  # the timing line starts a line of its own even after output without a final newline
  [ -z "$(tail -c 1 "$log")" ] || echo >> "$log"
  echo "$(cat "$tmp/$i.time"), load $(cut -d' ' -f1 /proc/loadavg)" >> "$log"
  # renamed into place: the parent reads a status only once it is whole
  echo "$rc" > "$tmp/$i.rc" && mv "$tmp/$i.rc" "$tmp/$i.status"
}

next=0 fail=0
flush() {
  while [ "$next" -lt "${#suites[@]}" ] && [ -e "$tmp/$next.status" ]; do
    cat "$tmp/$next.log"
    [ "$(cat "$tmp/$next.status")" = 0 ] || fail=1
    next=$((next + 1))
  done
}

running=0
for i in "${!suites[@]}"; do
  limit=$jobs
  # a suite that runs alone waits for the cores to empty, and the next waits for it
  case ${suites[$i]} in @*) limit=1 ;; esac
  [ "$i" -gt 0 ] && [[ ${suites[$((i - 1))]} == @* ]] && limit=1
  while [ "$running" -ge "$limit" ]; do
    wait -n
    running=$((running - 1))
    flush
  done
  run_one "$i" "${suites[$i]}" &
  running=$((running + 1))
done
wait
flush
exit $fail
