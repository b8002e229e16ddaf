#!/usr/bin/env bash
# The README check (tools/readme-check.py) can fail: an altered figure of a README output block
# is reported in one line naming the README's line and both figures; wall-clock figures and
# figures within the block's rtol are not; a command block without its marker is an error.
# The full check (every README command) runs in `make test-long`; this runs the tiny example
# and synthetic READMEs only, in seconds.
set -u
cd "$(dirname "$0")/../.."
BIN=${PIPER_BIN:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 failed=0
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
RC="python3 tools/readme-check.py --quiet --root ."

# --- the README's worked example, as is and with one figure altered ---------------------------
fence=$(python3 tools/readme-check.py --list | grep -F 'compare: bin/piper-sim --model models/tiny-moe.json --pp-regions 4' |
  sed -n '1s/^README.md:\([0-9]*\) .*/\1/p')
[ -n "$fence" ] || { echo "FAIL: no worked example block in README.md"; exit 1; }
$RC --only "$fence" >"$T/out" 2>&1 && grep -qx "readme-check: 1 passed, 0 failed" "$T/out" && ok ||
  bad "README example as is: $(cat "$T/out")"

fig=$(awk -v f="$fence" 'NR > f && /^  iteration / { print NR; exit }' README.md)
old=$(sed -n "${fig}p" README.md | awk '{print $2}')
sed "${fig}s/ $old ms/ 9$old ms/" README.md >"$T/README.md"
$RC --readme "$T/README.md" --only "$fence" >"$T/out" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(grep -c "^$T/README.md:" "$T/out")" -eq 1 ] &&
  grep -qx "$T/README.md:$fig: 9$old in the README, $old now (iteration 9$old)" "$T/out" &&
  grep -qx "readme-check: 0 passed, 1 failed" "$T/out" && ok || bad "altered figure (rc $rc): $(cat "$T/out")"

# its wall-clock figure ("in 0.001 s") is not compared
sim=$(awk -v f="$fence" 'NR > f && /^  simulated / { print NR; exit }' README.md)
sed -E "${sim}s/ in [0-9.]+ s;/ in 123.456 s;/" README.md >"$T/README.md"
grep -q "in 123.456 s;" "$T/README.md" && $RC --readme "$T/README.md" --only "$fence" >"$T/out" 2>&1 && ok ||
  bad "wall-clock figure compared: $(cat "$T/out")"

# --- synthetic READMEs: tolerance, wall, run, skip, missing lines, unmarked blocks ----------------
mk() { printf '%s\n' "$@" >"$T/R.md"; }
mk '<!-- readme-check rtol=1e-4 -->' '```sh' 'echo "loss 1.00005 at 12 ms"' '```' '```' 'loss 1.0000 at 12 ms' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1 && ok || bad "within rtol: $(cat "$T/out")"
mk '<!-- readme-check rtol=1e-4 -->' '```sh' 'echo "loss 1.00005 at 12 ms"' '```' '```' 'loss 1.0000 at 99 ms' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -qx "$T/R.md:6: 99 in the README, 12 now (loss 1.0000, rtol 0.0001)" "$T/out" && ok ||
  bad "ms compared without wall: $(cat "$T/out")"
mk '<!-- readme-check rtol=1e-4 wall -->' '```sh' 'echo "loss 1.00005 at 12 ms"' '```' '```' 'loss 1.0000 at 99 ms' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1 && ok || bad "within rtol, ms under wall: $(cat "$T/out")"
mk '<!-- readme-check rtol=1e-6 wall -->' '```sh' 'echo "loss 1.00005 at 12 ms"' '```' '```' 'loss 1.0000 at 99 ms' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -qx "$T/R.md:6: 1.0000 in the README, 1.00005 now (loss 1.0000, rtol 1e-06)" "$T/out" && ok ||
  bad "outside rtol: $(cat "$T/out")"
mk '<!-- readme-check -->' '```sh' 'echo "peak 3 GiB"; echo "x 2 threads"' '```' '```' '...' 'x 16 threads' 'peak 3 GiB' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -q "^$T/R.md:8: no output line like this one now: peak 3 GiB" "$T/out" && ok ||
  bad "lines out of order: $(cat "$T/out")"
mk '<!-- readme-check -->' '```sh' 'echo "the iteration 3 ms"' '```' '```' 'iteration 3 ms' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -q "no output line like this one now: iteration 3 ms" "$T/out" && ok || bad "words changed: $(cat "$T/out")"
mk '<!-- readme-check run -->' '```sh' 'false' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -q "^$T/R.md:2: the command exited 1" "$T/out" && ok || bad "failing command: $(cat "$T/out")"
mk '<!-- readme-check skip: needs a GPU -->' '```sh' 'false' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1 && grep -qx "readme-check: 0 passed, 0 failed" "$T/out" && ok ||
  bad "skip: $(cat "$T/out")"
mk 'text' '```sh' 'true' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -q "^$T/R.md:2: a command block without a <!-- readme-check" "$T/out" && ok ||
  bad "unmarked block: $(cat "$T/out")"
python3 tools/readme-check.py --list --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -q "^$T/R.md:2: a command block without" "$T/out" && ok || bad "--list on an unmarked block: $(cat "$T/out")"
# every block of the README itself is marked (what a merged recipe forgets; the full run is in
# make test-long)
python3 tools/readme-check.py --list >"$T/out" 2>&1 && ok || bad "README blocks: $(cat "$T/out")"
mk '<!-- readme-check fast -->' '```sh' 'true' '```'
$RC --readme "$T/R.md" >"$T/out" 2>&1
[ $? -eq 1 ] && grep -q "unknown readme-check option 'fast'" "$T/out" && ok || bad "bad option: $(cat "$T/out")"
# a recipe that needs Open MPI's root variables fails: the check runs commands without them
mk '<!-- readme-check run -->' '```sh' '[ -z "${OMPI_ALLOW_RUN_AS_ROOT:-}" ]' '```'
OMPI_ALLOW_RUN_AS_ROOT=1 $RC --readme "$T/R.md" >"$T/out" 2>&1 && ok || bad "root variables kept: $(cat "$T/out")"
# every README mpirun line handles Open MPI's root refusal itself
n=$(grep -c 'mpirun ' README.md)
grep 'mpirun -' README.md | grep -v -- '--allow-run-as-root' >"$T/out"
[ "$n" -gt 0 ] && [ ! -s "$T/out" ] && ok || bad "README mpirun without --allow-run-as-root: $(cat "$T/out")"

# ... and the flag is harmless for a user: Open MPI accepts it from a non-root user (checked as
# `nobody` where this runs as root, as in CI and containers)
if [ "$(id -u)" -eq 0 ] && command -v su >/dev/null && id nobody >/dev/null 2>&1 && command -v mpirun >/dev/null; then
  su -s /bin/bash nobody -c "cd /tmp && mpirun --allow-run-as-root --oversubscribe -np 2 true" >"$T/out" 2>&1 && ok ||
    bad "mpirun --allow-run-as-root as a user: $(cat "$T/out")"
else
  echo "skip: --allow-run-as-root as a user (not root, or no su, nobody or mpirun here)"
fi

echo "test_readme_check.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
