#!/usr/bin/env bash
# tools/run-suites.sh, which make test and make test-long run their suites through: with -j 2
# two suites run at once, yet each one's output comes whole, in the order given, under its
# "== NAME" line and over its timing line; a suite written @NAME runs with nothing beside it;
# a failed suite fails the run and the others still run; tools/test-slowest.sh lists the
# slowest from the timing lines; tools/fuzz-one.sh's and tools/timed.sh's lines.
set -u
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 failed=0
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
R=tools/run-suites.sh

# a and b wait for each other (each up to 5 s): they pass only when run side by side
cat > "$T/a.sh" << EOF
touch "$T/a.on"; for i in \$(seq 50); do [ -e "$T/b.on" ] && break; sleep 0.1; done
[ -e "$T/b.on" ] || { echo "b never ran beside a"; exit 1; }
sleep 0.3; rm -f "$T/a.on"; echo "a out"
EOF
sed -e 's/a\.on/X.on/g; s/b\.on/a.on/g; s/X\.on/b.on/g; s/b never ran beside a/a never ran beside b/; s/a out/b out/' \
  "$T/a.sh" > "$T/b.sh"
# the alone suite fails when another is running; c runs beside d, after it ends without a newline
echo "ls $T/*.on 2> /dev/null && exit 1; echo alone out" > "$T/alone.sh"
echo "touch $T/c.on; sleep 0.5; rm $T/c.on; printf 'c out'" > "$T/c.sh"
echo "touch $T/d.on; sleep 0.5; rm $T/d.on; echo 'd out'; exit 3" > "$T/d.sh"
echo "touch $T/slow.on; sleep 2; rm $T/slow.on; echo 'slow out'" > "$T/slow.sh"
# c ends first: the alone suite must still wait for slow
$R -j 2 "$T/a.sh" "$T/b.sh" "$T/c.sh" "$T/slow.sh" "@$T/alone.sh" "$T/d.sh" > "$T/log" 2>&1
rc=$?
[ "$rc" = 1 ] && ok || bad "exit status $rc with a failed suite, want 1: $(cat "$T/log")"
want="== $T/a.sh|a out|time|== $T/b.sh|b out|time|== $T/c.sh|c out|time|== $T/slow.sh|slow out|time|== $T/alone.sh|alone out|time|== $T/d.sh|d out|time"
got=$(sed 's/^time: .*/time/' "$T/log" | paste -sd'|')
[ "$got" = "$want" ] && ok || bad "order or sections: $got"
grep -Eq "^time: $T/a.sh [0-9.]+ s wall, [0-9.]+ s user, [0-9.]+ s sys, load [0-9.]+$" "$T/log" && ok ||
  bad "timing line: $(grep '^time' "$T/log" | head -1)"
# one at a time the pair cannot meet
$R -j 1 "$T/a.sh" > "$T/log1" 2>&1 && bad "-j 1 ran a beside something" || ok
$R -j 0 "$T/a.sh" > /dev/null 2> "$T/err"; rc=$?
[ "$rc" = 2 ] && grep -q "^run-suites.sh: error: -j" "$T/err" && ok || bad "-j 0: exit $rc, $(cat "$T/err")"

# the slowest, from the timing lines
printf '%s\n' 'time: x 1.5 s wall, 1.0 s user, 0.5 s sys, load 1' 'time: y 9.0 s wall, 2.0 s user, 0.0 s sys, load 1' \
  'time: z 3.0 s wall, 0.0 s user, 0.0 s sys' > "$T/times"
out=$(tools/test-slowest.sh "$T/times" 2)
[ "$(sed -n 1p <<< "$out")" = "time: 3 steps, 14 s wall, 4 s of CPU (user + sys); the slowest:" ] &&
  [ "$(sed -n 2p <<< "$out" | awk '{print $1, $NF}')" = "9.0 y" ] &&
  [ "$(sed -n 3p <<< "$out" | awk '{print $1, $NF}')" = "3.0 z" ] && [ "$(wc -l <<< "$out")" = 3 ] && ok ||
  bad "test-slowest: $out"
out=$(tools/timed.sh step bash -c 'echo hi; exit 4'); rc=$?
[ "$rc" = 4 ] && [ "$(head -1 <<< "$out")" = hi ] && grep -Eq '^time: step [0-9.]+ s wall' <<< "$out" && ok ||
  bad "timed.sh: exit $rc, $out"
# a fuzz target that crashes: its log's end and exit 1 (a stand-in program: no clang needed)
mkdir -p "$T/fuzz"
printf '#!/bin/sh\necho "==1==ERROR: AddressSanitizer: fake"\nexit 1\n' > "$T/fuzz/fuzz_model"
chmod +x "$T/fuzz/fuzz_model"
out=$(FUZZ_SECONDS=1 tools/fuzz-one.sh "$T/fuzz/fuzz_model"); rc=$?
[ "$rc" = 1 ] && grep -q "AddressSanitizer: fake" <<< "$out" && ok || bad "fuzz-one.sh on a crash: exit $rc, $out"
printf '#!/bin/sh\nexit 0\n' > "$T/fuzz/fuzz_model"
[ "$(FUZZ_SECONDS=1 tools/fuzz-one.sh "$T/fuzz/fuzz_model")" = "fuzz_model: no crash in 1 s" ] && ok ||
  bad "fuzz-one.sh: no 'no crash' line"

echo "test_run_suites.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
