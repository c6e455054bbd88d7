#!/usr/bin/env bash
# record-result.sh NAME COMMAND [ARG...] - runs COMMAND, showing its output,
# and keeps a dated copy under bench-results/ (the repository's, or
# $RESULTS_DIR): bench-results/YYYY-MM-DD-HHMMSS-NAME.txt, a header saying
# when, on which commit and machine, and exactly what ran, then everything
# COMMAND printed (stdout and stderr, as it came). The Makefile's benchmark
# and simulation targets run through it, so every figure the docs quote
# comes from such a file; commit the file with the docs that quote it.
# Exits with COMMAND's status (the file is kept either way and says it).
#
#   hack/record-result.sh bench go test -run '^$' -bench . ./internal/placement/
#
# The header (one "key: value" per line, then a line "---"):
#   result    NAME
#   date      start, UTC (ISO 8601), and the duration at the end
#   commit    the checkout's commit, "+ uncommitted changes" and the files
#             if tracked files differ from it
#   machine   CPU model, cores (online), memory, OS, kernel, Go version
#   load      load averages (1, 5, 15 min) at the start and at the end
#   command   the command, each argument shell-quoted, and the directory
#   exit      COMMAND's exit status (at the end)
#
# With SUMMARY set (an extended regular expression), it also writes
# ...-NAME-summary.txt: the header, then only the lines of the output
# that match it, then the end lines (for outputs too large to commit).
set -uo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 NAME COMMAND [ARG...]" >&2
    exit 2
fi
name=$1
shift
case $name in *[!A-Za-z0-9._-]*) echo "record-result: NAME may hold letters, digits, '.', '_', '-': $name" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${RESULTS_DIR:-$root/bench-results}
mkdir -p "$dir"
start=$(date -u +%s)
file=$dir/$(date -u -d "@$start" +%Y-%m-%d-%H%M%S)-$name.txt

commit() {
    local c
    c=$(git rev-parse HEAD 2>/dev/null) || { echo "unknown (not a git checkout)"; return; }
    local changed
    changed=$(git status --porcelain --untracked-files=no 2>/dev/null | awk '{print $2}' | paste -sd' ')
    echo "$c${changed:+ + uncommitted changes in $changed}"
}
machine() {
    local cpu cores mem os
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
    cores=$(nproc 2>/dev/null)
    mem=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)
    os=$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
    echo "${cpu:-unknown CPU}, $cores cores, $mem memory, ${os:-unknown OS}, Linux $(uname -r), $(go version 2>/dev/null | awk '{print $3}')"
}
load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null; }
quoted=""
for a in "$@"; do # each argument as a shell reads it back: quoted where needed
    case $a in
    "" | *[!A-Za-z0-9_./=:,+@%^-]*) a="'${a//\'/\'\\\'\'}'" ;;
    esac
    quoted="$quoted $a"
done
case $PWD in
"$root") where="the repository root" ;;
"$root"/*) where=${PWD#"$root"/} ;;
*) where=$PWD ;;
esac

{
    echo "result: $name"
    echo "date: $(date -u -d "@$start" +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(commit)"
    echo "machine: $(machine)"
    echo "load: $(load) at the start"
    echo "command:$quoted (in $where)"
    echo "---"
} >"$file"

"$@" 2>&1 | tee -a "$file"
rc=${PIPESTATUS[0]}

{
    echo "---"
    echo "load: $(load) at the end"
    echo "duration: $(($(date -u +%s) - start)) s"
    echo "exit: $rc"
} >>"$file"
echo "record-result: ${file#"$root"/} (exit $rc)" >&2
if [ -n "${SUMMARY:-}" ]; then
    summary=${file%.txt}-summary.txt
    {
        sed '/^---$/q' "$file" | sed '$d'
        echo "summary: only the lines matching '$SUMMARY' are kept"
        echo "---"
        sed '1,/^---$/d' "$file" | grep -E -- "$SUMMARY"
    } >"$summary"
    echo "record-result: ${summary#"$root"/}" >&2
fi
exit "$rc"
