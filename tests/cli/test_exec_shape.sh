#!/usr/bin/env bash
# The executor's shape (docs/exec.md, "Backends"): its library draws nothing (no Cairo or chart
# symbol in exec/'s objects: piper-exec writes the run directory and its charts), the plan
# runner never names a backend nor reads a launcher's variable, and every kernel and collective
# is declared once, in kernels/ops.def or exec/ops.def. Run from the repository root after the
# build.
set -u
BUILD=${BUILD:-build}
pass=0
failed=0
ok() { echo "ok: $1"; pass=$((pass + 1)); }
bad() { echo "FAIL: $1"; failed=$((failed + 1)); }

objs=$(ls "$BUILD"/exec/*.o 2>/dev/null)
if [ -z "$objs" ]; then
  bad "no objects in $BUILD/exec (build first)"
else
  drawn=$(nm -u $objs 2>/dev/null | grep -E ' (cairo_|chart_|report_write_charts)' | sort -u)
  [ -z "$drawn" ] && ok "the executor library uses no Cairo or chart symbol" \
    || bad "the executor library draws: $(echo $drawn)"
fi

named=$(grep -nE '"(host|cuda)"|OMPI_|PMI_|PMIX_|SLURM_|getenv' exec/runner*.c exec/memory.c \
  exec/params.c exec/segment_*.c exec/expert_parallel.c exec/transfer.c exec/optimizer.c \
  exec/train.c 2>/dev/null)
[ -z "$named" ] && ok "the runner names no backend and reads no launcher variable" \
  || bad "the runner knows too much: $named"

# a kernel's table entry is written only by the list: no hand-written ".name = k_..." tables
hand=$(grep -nE '^\s*\.(fill|copy|rmsnorm_forward|send|all_reduce_f32) = ' exec/*.c)
[ -z "$hand" ] && ok "the backends' tables come from exec/ops.def" || bad "hand-written table entries: $hand"

lines=$(wc -l < exec/exec.h)
[ "$lines" -lt 150 ] && ok "exec/exec.h is $lines lines (users' header)" || bad "exec/exec.h is $lines lines"
big=$(wc -l exec/*.c exec/*.h | awk '$2 != "total" && $1 > 1000 { print $2 " (" $1 ")" }')
[ -z "$big" ] && ok "no file in exec/ over 1,000 lines" || bad "over 1,000 lines: $big"

echo "test_exec_shape: $pass passed, $failed failed"
[ "$failed" = 0 ]
