#!/usr/bin/env bash
# Inputs with nothing in them that once reached undefined behaviour (UBSan: qsort given a NULL
# array of 0 elements). Under `make asan` (UBSAN_OPTIONS=halt_on_error=1) a UBSan report ends
# the program with exit 1, so these fail there if the cause comes back; here they check that
# the programs still handle such inputs.
set -u
BIN=${PIPER_BIN:-bin}
PS="$BIN/piper-sim"
PCMP="$BIN/piper-compare"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }

# a run directory whose trace holds no events: piper-compare reads it (no trace kinds to sort)
if "$PS" --model models/tiny-dense.json --directives directives/base-schedules/dp2.json \
  --profile profiles/unit.json --out "$T/a" --no-charts >/dev/null 2>"$T/err"; then
  cp -r "$T/a" "$T/b"
  echo '{"traceEvents": []}' >"$T/b/trace.json"
  "$PCMP" "$T/a" "$T/b" >"$T/out" 2>"$T/err" && grep -q "8 / 0" "$T/out" && ok ||
    bad "compare with an empty trace: $(cat "$T/err")"
else
  bad "piper-sim: $(cat "$T/err")"
fi

echo "test_empty_inputs.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
