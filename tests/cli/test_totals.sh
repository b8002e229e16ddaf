#!/usr/bin/env bash
# The closing line of `make test` and `make test-long` (tools/test-totals.sh): cmocka tests, CLI
# scripts' "NAME: N passed, N failed" lines, lint, the README check's blocks and fuzz targets are
# counted; a sanitizer report (ASan, LeakSanitizer, UBSan's runtime error) and a lint finding are
# failures even where their suite went on to pass; a suite without its closing line is one
# failure; the totals are the last line.
set -u
cd "$(dirname "$0")/../.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 failed=0
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
totals() { tools/test-totals.sh "$T/log" 2>"$T/err" | tail -n 1; }

printf '%s\n' '== build/tests/test_a' '[  PASSED  ] 3 test(s).' '== tests/cli/test_b.sh' 'test_b.sh: 4 passed, 1 failed' \
  'lint: no function over 120 lines or CCN 40' 'lint-layers: 9 files, no include against the layering' \
  '== readme-check' 'readme-check: 5 passed, 0 failed' '== fuzz_x (8 s)' 'fuzz_x: no crash in 8 s' >"$T/log"
[ "$(totals)" = "tests: 15 passed, 1 failed" ] && ok || bad "clean log: $(totals)"

# a UBSan report inside a suite that still passed, and an ASan report: two failures more
printf '%s\n' '== build/tests/test_c' 'exec/x.c:12:7: runtime error: signed integer overflow' '[  PASSED  ] 2 test(s).' \
  '==123==ERROR: AddressSanitizer: heap-buffer-overflow on address' >>"$T/log"
[ "$(totals)" = "tests: 17 passed, 3 failed" ] && grep -q "sanitizer reports counted as failures: 2" "$T/err" && ok ||
  bad "sanitizer reports: $(totals) $(cat "$T/err")"
# a lint finding, and a suite cut short (no closing line)
printf '%s\n' 'lint: 2 function(s) over 120 lines or CCN 40' '== tests/cli/test_d.sh' 'something' >>"$T/log"
out=$(tools/test-totals.sh "$T/log" 2>&1)
[ "$(totals)" = "tests: 17 passed, 5 failed" ] && [ "$(tail -n 1 <<<"$out")" = "tests: 17 passed, 5 failed" ] &&
  grep -q "ended without their totals: tests/cli/test_d.sh" "$T/err" && ok || bad "lint finding, cut suite: $out"

echo "test_totals.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
