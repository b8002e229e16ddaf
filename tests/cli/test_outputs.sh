#!/usr/bin/env bash
# Writing an output never replaces what is not a regular file, and a full disk is an error:
# devices and pipes behind --dump-ir, --export-csv, --json are written in place (as root a
# rename would turn /dev/null into a regular file), a symlink is followed, /dev/full exits 1
# naming the file.
set -u
BIN=${PIPER_BIN:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
PC="$BIN/piper-compile"
M="--model models/tiny-dense.json --layout pp=1"

"$PC" $M --dump-ir /dev/null >"$T/out" 2>"$T/err" && [ -c /dev/null ] && ok || bad "--dump-ir /dev/null: $(cat "$T/err")"
"$PC" $M --dump-ir /dev/stdout 2>"$T/err" | python3 -c "import json,sys; json.JSONDecoder().raw_decode(sys.stdin.read())" && [ -L /dev/stdout ] \
  && ok || bad "--dump-ir /dev/stdout into a pipe: $(cat "$T/err")"
"$PC" $M --dump-ir - 2>"$T/err" | python3 -c "import json,sys; json.JSONDecoder().raw_decode(sys.stdin.read())" && ok || bad "--dump-ir -: $(cat "$T/err")"
if [ -w /dev/full ]; then
  "$PC" $M --dump-ir /dev/full >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 1 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "/dev/full.*No space left on device" "$T/err" && [ -c /dev/full ] \
    && ok || bad "--dump-ir /dev/full: exit $rc, $(cat "$T/err")"
  "$PC" $M --dump-dot /dev/full >"$T/out" 2>"$T/err"
  [ $? -eq 1 ] && grep -q "/dev/full" "$T/err" && [ -c /dev/full ] && ok || bad "--dump-dot /dev/full: $(cat "$T/err")"
fi
# a symlink is followed: its target gets the file, the link stays a link
echo old >"$T/target.json"
ln -s target.json "$T/link.json"
"$PC" $M --dump-ir "$T/link.json" >/dev/null 2>"$T/err" && [ -L "$T/link.json" ] && grep -q '"nodes"' "$T/target.json" \
  && ok || bad "--dump-ir LINK: $(cat "$T/err")"
# a FIFO is written in place, not replaced
mkfifo "$T/fifo"
cat "$T/fifo" >"$T/from_fifo" &
reader=$!
"$PC" $M --dump-ir "$T/fifo" >/dev/null 2>"$T/err"
wait $reader
[ -p "$T/fifo" ] && grep -q '"nodes"' "$T/from_fifo" && ok || bad "--dump-ir FIFO: $(cat "$T/err")"
# piper-compare --json through a link
"$BIN/piper-sim" $M --profile profiles/unit.json --out "$T/run" --no-charts --quiet 2>"$T/err" || bad "sim: $(cat "$T/err")"
ln -s cmp-target.json "$T/cmp-link.json"
"$BIN/piper-compare" "$T/run" "$T/run" --json "$T/cmp-link.json" >/dev/null 2>"$T/err" && [ -L "$T/cmp-link.json" ] \
  && python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$T/cmp-target.json" && ok || bad "compare --json LINK: $(cat "$T/err")"

# an --out that cannot be made is refused before any work: the planner's search, a simulation
for tool in "piper-plan --model models/llama3.1-405b.json --devices 8192" "piper-sim $M"; do
  start=$(date +%s)
  "$BIN"/$tool --profile profiles/h100-sxm.json --out /proc/piper-no-such/run >"$T/out" 2>"$T/err"
  rc=$?
  secs=$(($(date +%s) - start))
  [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q -- "--out /proc/piper-no-such/run: cannot write there" "$T/err" \
    && [ $secs -le 5 ] && ok || bad "${tool%% *} --out unwritable: exit $rc after ${secs} s, $(cat "$T/err")"
done

echo "test_outputs.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
