#!/usr/bin/env bash
# Every header's usage example compiles. The example is the lines of the header's top comment
# that begin with " *   " (star and three spaces); each becomes the body of
# `static void example(void)` in a file that includes the header (first, so the header must be
# self-contained) and <stdio.h>, compiled with the project's flags (make -s print-cflags) with
# unused-variable warnings off. A header without an example must still compile on its own.
# Run from the repository root; names every header whose example does not compile.
set -u
CC=${CC:-cc}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CFLAGS=$(make -s --no-print-directory print-cflags)
pass=0
failed=0

# every header of the tree: tracked, or new and not ignored (fuzz and test sources included),
# but the emulated GPU's stand-ins for the CUDA toolkit's headers (tests/gpu/emu/include/),
# which take those headers' names and are compiled only by `make emu`, against each other
headers=$(git ls-files -co --exclude-standard '*.h' 2>/dev/null || find . -name '*.h' -not -path './build*')
for h in $headers; do
  h=${h#./}
  case $h in tests/gpu/emu/include/*) continue ;; esac
  src="$T/$(echo "$h" | tr / _).c"
  {
    echo "#include \"$PWD/$h\""
    echo "#include <stdio.h>"
    echo "static void example(void) {"
    # the top comment: from the first line to the first "*/"
    awk 'NR == 1 && !/^\/\*/ { exit } { print } /\*\// { exit }' "$h" | sed -n 's/^ \*   //p'
    echo "}"
  } >"$src"
  # shellcheck disable=SC2086  # CFLAGS is a list of flags
  if $CC $CFLAGS -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-function \
    -c "$src" -o "$T/example.o" 2>"$T/err"; then
    pass=$((pass + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $h: its usage example does not compile:"
    sed -n 's/^/  /p' "$T/err" | head -20
  fi
done

# the layering (make lint's tools/lint-layers.sh) refuses an include that points up and one of
# another module's private header, and passes the tree
mkdir -p "$T/kernels" "$T/prof"
printf '#include "../exec/exec.h"\n' > "$T/kernels/up.c"
printf '#include "../exec/cuda-impl.h"\n' > "$T/prof/private.c"
for f in kernels/up.c prof/private.c; do
  if (cd "$T" && sh "$OLDPWD/tools/lint-layers.sh" -t "$OLDPWD/tools/lint-layers.txt" "$f") > "$T/lint.txt" 2>&1; then
    failed=$((failed + 1))
    echo "FAIL: lint-layers passed $f: $(cat "$T/lint.txt")"
  else
    pass=$((pass + 1))
  fi
done
if tools/lint-layers.sh $(git ls-files 'base/*.[ch]' 'exec/*.[ch]' 'prof/*.[ch]' 'kernels/*.cu' 'tools/*.c') > "$T/lint.txt" 2>&1; then
  pass=$((pass + 1))
else
  failed=$((failed + 1))
  echo "FAIL: lint-layers on the tree: $(tail -3 "$T/lint.txt")"
fi

echo "test_headers: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
