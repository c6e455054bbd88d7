#!/usr/bin/env bash
# Runs every test of the given packages alone, one process per test, as
#   go test -count=1 -run '^TestX$' PKG
# would, to prove that no test depends on another's state. Each package's
# test binary is built once and then run once per test (the package's
# directory as working directory, like go test).
#
#   hack/each-test.sh ./...                                   # unit tests
#   hack/each-test.sh -tags integration ./internal/nodeagent/ ./test/integration/...
#   hack/each-test.sh -subtests ./internal/scheduler/         # every subtest alone too
#
# Flags: -tags T (build tags), -subtests (also run each subtest alone,
# found by a -v run of its test), -timeout D (per test, default 20m).
# Exit status 1 if any test failed alone; the tail of its output is shown.
set -uo pipefail
export PATH="/usr/local/go/bin:$PATH"

tags=() subtests=0 timeout=20m
while [ $# -gt 0 ]; do
  case "$1" in
    -tags) tags=(-tags "$2"); shift 2 ;;
    -subtests) subtests=1; shift ;;
    -timeout) timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || set -- ./...

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# regexp of one -run element matching exactly this (sub)test name.
exact() { printf '^%s$' "$(printf '%s' "$1" | sed 's/[][\\.*+?(){}|^$]/\\&/g')"; }

pass=0 fail=0 failed=()
run() { # pkg dir bin pattern label
  local pkg=$1 dir=$2 bin=$3 pattern=$4 label=$5 start out rc ms
  start=${EPOCHREALTIME/./}
  out=$(cd "$dir" && "$bin" -test.count=1 -test.timeout="$timeout" -test.run "$pattern" 2>&1)
  rc=$?
  ms=$(( (${EPOCHREALTIME/./} - start) / 1000 ))
  local secs; secs=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
  if [ $rc -eq 0 ] && ! grep -q '^testing: warning: no tests to run' <<<"$out"; then
    printf 'ok    %-55s %-50s %6.1fs\n' "$pkg" "$label" "$secs"
    pass=$((pass + 1))
  else
    printf 'FAIL  %-55s %-50s %6.1fs\n' "$pkg" "$label" "$secs"
    tail -n 30 <<<"$out" | sed 's/^/      /'
    fail=$((fail + 1)); failed+=("$pkg $label")
  fi
}

pkgs=$(go list "${tags[@]}" -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}|{{.Dir}}{{end}}' "$@") || exit 2
for line in $pkgs; do
  pkg=${line%%|*} dir=${line#*|}
  bin="$work/$(echo "$pkg" | tr / _).test"
  if ! go test "${tags[@]}" -c -o "$bin" "$pkg" >"$work/build.log" 2>&1; then
    echo "FAIL  $pkg: does not build"; cat "$work/build.log"; fail=$((fail + 1)); failed+=("$pkg (build)"); continue
  fi
  [ -x "$bin" ] || continue
  for t in $(cd "$dir" && "$bin" -test.list '.*' | grep -E '^(Test|Fuzz|Example)'); do
    run "$pkg" "$dir" "$bin" "$(exact "$t")" "$t"
    [ $subtests -eq 1 ] || continue
    subs=$(cd "$dir" && "$bin" -test.count=1 -test.timeout="$timeout" -test.v -test.run "$(exact "$t")" 2>/dev/null |
      sed -n 's/^ *=== RUN   \(.*\/.*\)$/\1/p' | sort -u)
    while IFS= read -r s; do
      [ -n "$s" ] || continue
      pattern=""
      IFS=/ read -ra parts <<<"$s"
      for p in "${parts[@]}"; do pattern+="${pattern:+/}$(exact "$p")"; done
      run "$pkg" "$dir" "$bin" "$pattern" "$s"
    done <<<"$subs"
  done
done
echo
echo "$pass passed alone, $fail failed"
for f in "${failed[@]}"; do echo "  FAIL $f"; done
[ $fail -eq 0 ]
