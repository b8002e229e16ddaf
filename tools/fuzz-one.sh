#!/usr/bin/env bash
# One libFuzzer target of `make fuzz` for FUZZ_SECONDS (8) seconds from its seed corpus
# (tests/fuzz/seeds/NAME) and the corpus it grew before (its folder beside the binary), one
# process on one core. Prints "fuzz_NAME: no crash in N s", or the end of its log and exits 1.
# A UBSan report counts as a crash (halt_on_error), as an ASan one does.
#   tools/fuzz-one.sh BUILD/fuzz/fuzz_NAME
set -u
f=${1:?usage: tools/fuzz-one.sh BUILD/fuzz/fuzz_NAME}
secs=${FUZZ_SECONDS:-8}
n=$(basename "$f")
dir=$(dirname "$f")
mkdir -p "$dir/corpus-$n"
if UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "$f" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -print_final_stats=0 -artifact_prefix="$dir/" "$dir/corpus-$n" "tests/fuzz/seeds/${n#fuzz_}" \
  > "$dir/$n.log" 2>&1; then
  echo "$n: no crash in $secs s"
else
  tail -40 "$dir/$n.log"
  exit 1
fi
