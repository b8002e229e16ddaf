#!/usr/bin/env bash
# The slowest steps of a `make test` / `make test-long` log, from their timing lines
# ("time: NAME W s wall, U s user, S s sys, load L", tools/run-suites.sh), and their sums: where
# the time of a CI run went. Printed before the totals line, which stays the log's last.
#   tools/test-slowest.sh LOG [N]
set -u
log=${1:?usage: tools/test-slowest.sh LOG [N]}
n=${2:-8}
grep '^time: ' "$log" | awk -v n="$n" '
  { wall[NR] = $3; user[NR] = $6 + $9; name[NR] = $2; tw += $3; tu += $6 + $9 }
  END {
    if (NR == 0) exit
    printf "time: %d steps, %.0f s wall, %.0f s of CPU (user + sys); the slowest:\n", NR, tw, tu
    for (k = 1; k <= n && k <= NR; k++) {
      best = 0
      for (i = 1; i <= NR; i++) if (!(i in done) && (best == 0 || wall[i] > wall[best])) best = i
      done[best] = 1
      printf "  %7.1f s wall %7.1f s CPU  %s\n", wall[best], user[best], name[best]
    }
  }'
