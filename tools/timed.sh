#!/usr/bin/env bash
# Runs a command and prints after it the timing line tools/run-suites.sh prints for a suite
# ("time: NAME W s wall, U s user, S s sys, load L"), for the steps of make test and make
# test-long that are no suite of their own (lint, the short loop, the README check).
#   tools/timed.sh NAME CMD...
set -u
name=${1:?usage: tools/timed.sh NAME CMD...}
shift
TIMEFORMAT="time: $name %R s wall, %U s user, %S s sys"
{ time "$@" 2>&1; } 2> "${TMPDIR:-/tmp}/timed.$$"
rc=$?
echo "$(cat "${TMPDIR:-/tmp}/timed.$$"), load $(cut -d' ' -f1 /proc/loadavg)"
rm -f "${TMPDIR:-/tmp}/timed.$$"
exit $rc
