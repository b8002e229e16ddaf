#!/usr/bin/env bash
# The totals of a `make test` log (its one closing line, "tests: N passed, N failed"): the
# checks of every suite, read from the lines the suites close with. A unit test binary counts
# its cmocka tests; a CLI script its "NAME: N passed, N failed" line; lint, the short fidelity
# loop, the README check's blocks and each fuzz target count one check each. A suite (a
# "== NAME" section) that ended without its closing line counts as one failed check, and so does
# every sanitizer report in the log (ASan, LeakSanitizer, UBSan's "file:line:col: runtime
# error:"), even one whose test went on to pass.
# usage: tools/test-totals.sh LOG
set -u
log=${1:?usage: tools/test-totals.sh LOG}
awk '
  function close_section() {
    if (section != "" && !closed) { failed++; missing = missing " " section }
    section = ""; closed = 0
  }
  /^== / { close_section(); section = $2; next }
  /^\[  PASSED  \] [0-9]+ test/ { passed += $4; closed = 1; next }
  /^\[  FAILED  \] [0-9]+ test/ { failed += $4; closed = 1; next }
  /^[A-Za-z0-9_.-]+: [0-9]+ passed, [0-9]+ failed/ {
    passed += $2; n = $4; sub(/,.*/, "", n); failed += n; closed = 1; next
  }
  /^fuzz_[a-z_]+: no crash in / { passed++; closed = 1; next }
  /^lint: no function over/ || /^lint-layers: .* no include against/ { passed++; next }
  /^lint: [0-9]+ function/ || /^lint-layers: [0-9]+ include/ { failed++; next }
  /^loop: table in / { passed++; next }
  /ERROR: (Address|Leak|Thread|Memory)Sanitizer/ || /:[0-9]+:[0-9]+: runtime error: / { failed++; sanitizer++; next }
  END {
    close_section()
    # the notes first: the totals stay the last line
    if (sanitizer) printf "(sanitizer reports counted as failures: %d)\n", sanitizer > "/dev/stderr"
    if (missing != "") printf "(suites that ended without their totals:%s)\n", missing > "/dev/stderr"
    printf "tests: %d passed, %d failed\n", passed, failed
  }
' "$log"
