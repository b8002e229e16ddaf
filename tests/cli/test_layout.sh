#!/usr/bin/env bash
# Layouts from flags: piper-layout writes the bundled rank-order base schedules byte for byte,
# --layout compiles and simulates exactly like the same program given as a file, and bad specs
# are one line with exit 2.
set -u
BIN=${PIPER_BIN:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
BS=directives/base-schedules

for c in "dp=2 dp2" "pp=4 pp4" "pp=8 pp8" "pp=4,v pp4_v" "pp=4,interleave=2 pp4_interleaved" \
  "pp=2,dp=2,ep=2 pp2_dp2_ep2" "pp=2,dp=2,ep=2,zero=1 pp2_dp2_ep2_zero1" "pp=2,dp=2,ep=2,zero=2 pp2_dp2_ep2_zero2" "pp=2,dp=2,ep=2,zero=3 pp2_dp2_ep2_zero3"; do
  set -- $c
  "$BIN/piper-layout" "$1" | cmp -s - "$BS/$2.json" && ok || bad "piper-layout $1 differs from $2.json"
done
"$BIN/piper-layout" pp=2,dp=2,ep=2,v -o "$T/v.json" 2>"$T/err" && [ -s "$T/v.json" ] && grep -q "use --pp-regions 4" "$T/err" && ok || bad "piper-layout -o"

# --layout = --directives of the file it writes, with the PP regions it implies
sim() { "$BIN/piper-sim" --profile profiles/h100-sxm.json --no-charts --quiet "$@"; }
sim --model models/tiny-moe.json --layout pp=2,dp=2,ep=2,v --schedule dualpipev --mbs 8 --out "$T/a" &&
  sim --model models/tiny-moe.json --directives "$T/v.json" --pp-regions 4 --schedule dualpipev --mbs 8 --out "$T/b" &&
  cmp -s "$T/a/results.csv" "$T/b/results.csv" && ok || bad "--layout simulates like its file"
"$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2,dp=2,ep=2 --schedule 1f1b --mbs 4 -o "$T/p1" >/dev/null &&
  "$BIN/piper-compile" --model models/tiny-moe.json --directives $BS/pp2_dp2_ep2.json --schedule 1f1b --mbs 4 -o "$T/p2" >/dev/null &&
  diff -r "$T/p1" "$T/p2" >/dev/null && ok || bad "--layout compiles to the bundled file's plans"

expect_bad() {
  local want=$1; shift
  "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -qF -- "$want" "$T/err"; then
    bad "$* : exit $rc, $(cat "$T/err")"
  else ok; fi
}
expect_bad 'unknown key "cp"' "$BIN/piper-layout" pp=2,cp=2
expect_bad "ep must be 1 or equal to dp" "$BIN/piper-layout" pp=2,dp=4,ep=2
expect_bad "give a layout" "$BIN/piper-layout"
expect_bad "--layout replaces --directives" "$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2 --directives $BS/dp2.json
expect_bad "disagrees with --layout" "$BIN/piper-compile" --model models/tiny-moe.json --layout pp=2,v --pp-regions 3
expect_bad "interleave and v exclude each other" "$BIN/piper-sim" --model models/tiny-moe.json --layout pp=2,v,interleave=2 --profile profiles/unit.json

echo "test_layout.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
