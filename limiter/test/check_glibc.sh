#!/bin/sh
# check_glibc.sh LIB - the shipped library loads on glibc 2.17 and later
# (CentOS 7 and every newer distribution). Prints PASS/FAIL lines:
#  - no symbol it imports asks for a glibc version newer than GLIBC_2.17
#    (objdump -T), and readelf -V agrees;
#  - it is linked against libdl.so.2 and libpthread.so.0, where the dl and
#    pthread symbols live before glibc 2.34, and every dl*/pthread* import
#    is versioned (bound to the version those libraries define).
set -u
LIB=$1
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
newest() { grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -1; }
le_217() { # version <= 2.17
    awk -v v="$1" 'BEGIN { split(v, a, "."); exit !(a[1] < 2 || (a[1] == 2 && a[2] <= 17)) }'
}
t=$(objdump -T "$LIB" | newest)
if [ -n "$t" ] && le_217 "$t"; then pass "glibc-symbol-versions-at-most-2.17 (newest GLIBC_$t)"; else
    fail glibc-symbol-versions-at-most-2.17 "newest GLIBC_$t: $(objdump -T "$LIB" | grep -E 'GLIBC_2\.(1[89]|[2-9][0-9])' | head -5 | tr '\n' ';')"; fi
v=$(readelf -V "$LIB" | newest)
if [ -n "$v" ] && le_217 "$v"; then pass "readelf-version-needs-at-most-2.17 (newest GLIBC_$v)"; else
    fail readelf-version-needs-at-most-2.17 "newest GLIBC_$v"; fi
for lib in libdl.so.2 libpthread.so.0; do
    if readelf -d "$LIB" | grep -q "NEEDED.*\[$lib\]"; then pass "needs-$lib"; else fail "needs-$lib" "no DT_NEEDED"; fi
done
bad=$(objdump -T "$LIB" | awk '$0 ~ /\*UND\*/ && ($NF ~ /^(dl|pthread_)/) && $0 !~ /GLIBC_/ {print $NF}')
if [ -z "$bad" ]; then pass "dl-and-pthread-imports-versioned"; else fail dl-and-pthread-imports-versioned "$bad"; fi
n=$(objdump -T "$LIB" | awk '$0 ~ /\*UND\*/ && ($NF ~ /^(dl|pthread_)/)' | wc -l)
[ "$n" -gt 5 ] && pass "dl-and-pthread-imports-found ($n)" || fail dl-and-pthread-imports-found "only $n"
