#!/bin/sh
# lint-layers: refuses an #include "..." that points up the layering (make lint).
#   tools/lint-layers.sh [-t TABLE] FILE...     # paths relative to the repository root
# TABLE (default tools/lint-layers.txt beside this script) has one line per module,
# "module: allowed modules ...". A file's module is its top-level folder; an include is resolved
# against the including file's folder, and its module is the top-level folder it lands in. Prints
# "file:line: includes X (module A may not depend on B)" per violation and a summary; exit 1 on
# any violation, 2 on a bad table or a file whose module has no line in it. A module's private
# headers (*-impl.h) are its own: including one from another module is a violation too. tests/
# are exempt.
table="$(dirname "$0")/lint-layers.txt"
if [ "$1" = "-t" ]; then table=$2; shift 2; fi
[ -r "$table" ] || { echo "lint-layers: error: cannot read the table $table" >&2; exit 2; }
[ $# -gt 0 ] || { echo "lint-layers: error: no files given" >&2; exit 2; }
exec awk -v table="$table" '
function norm(path,   n, parts, i, out, k, m) {   # a/b/../c/./d -> a/c/d
  n = split(path, parts, "/"); k = 0
  for (i = 1; i <= n; i++) {
    if (parts[i] == "" || parts[i] == ".") continue
    if (parts[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
    out[++k] = parts[i]
  }
  m = ""
  for (i = 1; i <= k; i++) m = m (i > 1 ? "/" : "") out[i]
  return m
}
function module_of(path) { return index(path, "/") ? substr(path, 1, index(path, "/") - 1) : "" }
BEGIN {
  while ((getline line < table) > 0) {
    sub(/#.*/, "", line)
    if (line !~ /[^ \t]/) continue
    if (line !~ /^[ \t]*[A-Za-z0-9_-]+[ \t]*:/) { print "lint-layers: error: " table ": bad line \"" line "\"" > "/dev/stderr"; setup = 1; exit 2 }
    mod = line; sub(/[ \t]*:.*/, "", mod); sub(/^[ \t]*/, "", mod)
    known[mod] = 1
    rest = line; sub(/^[^:]*:/, "", rest)
    n = split(rest, deps, /[ \t]+/)
    for (i = 1; i <= n; i++) if (deps[i] != "") allow[mod, deps[i]] = 1
  }
  close(table)
  for (i = 1; i < ARGC; i++) {
    f = norm(ARGV[i]); m = module_of(f)
    if (m == "tests") { ARGV[i] = ""; continue }
    if (!(m in known)) { print "lint-layers: error: " ARGV[i] ": module \"" m "\" has no line in " table > "/dev/stderr"; setup = 1; exit 2 }
    files++
  }
}
FNR == 1 { f = norm(FILENAME); m = module_of(f); dir = f; sub(/\/[^\/]*$/, "", dir) }
/^[ \t]*#[ \t]*include[ \t]*"/ {
  inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
  target = module_of(norm(dir "/" inc))
  if (target == m || !(target in known)) next   # its own module, or no module of ours
  if (inc ~ /-impl\.h$/) {
    printf "%s:%d: includes %s (a private header of module %s)\n", FILENAME, FNR, inc, target
    bad++
  } else if (!((m, target) in allow)) {
    printf "%s:%d: includes %s (module %s may not depend on %s)\n", FILENAME, FNR, inc, m, target
    bad++
  }
}
END {
  if (setup) exit 2
  if (bad) { printf "lint-layers: %d include(s) against the layering (%s)\n", bad, table; exit 1 }
  printf "lint-layers: %d files, no include against the layering\n", files
}' "$@"
