#!/usr/bin/env bash
# Checks of the `hakmem` command (tools/hakmem): run (exit status, output,
# LD_PRELOAD, --stats report), report (parser on a hand-written file with
# unknown keys), compare (table, verdict, CSV, failures), error cases and
# exit codes, help texts, and `make install-cli`. Needs only glibc + hakmem
# (compare uses --only hakmem,glibc). Quick: ~10 s.
# Env: LIBHAKMEM (release .so, default build/libhakmem.so), BUILD (default build).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build}
LIBHAKMEM=${LIBHAKMEM:-$BUILD/libhakmem.so}
STATSLIB=$BUILD/stats/libhakmem.so
HAK=$ROOT/tools/hakmem
pass=0
fail=0
ok()  { echo "  ok    $1"; pass=$((pass + 1)); }
bad() { echo "  FAIL  $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -8 | sed 's/^/        /'; fail=$((fail + 1)); }
check() { # check NAME COND-EXIT-STATUS [DETAIL]
  if [ "$2" -eq 0 ]; then ok "$1"; else bad "$1" "${3:-}"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -f "$LIBHAKMEM" ] || bad "LIBHAKMEM=$LIBHAKMEM exists"
if out=$(make -s stats BUILD="$BUILD" 2>&1) && [ -f "$STATSLIB" ]; then ok "make stats"; else bad "make stats" "$out"; fi

# A small C program: known numbers of allocations in known classes.
cat > "$tmp/prog.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
  static void *p[1000];
  for (int i = 0; i < 1000; i++) p[i] = malloc(24);        /* 1000 x class 32 B */
  for (int i = 0; i < 1000; i++) free(p[i]);
  for (int i = 0; i < 3; i++) { void *q = malloc(2 << 20); memset(q, 1, 4096); free(q); }
  printf("prog done %s\n", argc > 1 ? argv[1] : "");
  return argc > 2 ? atoi(argv[2]) : 0;
}
EOF
if out=$(${CC:-cc} -O1 -fno-builtin -o "$tmp/prog" "$tmp/prog.c" 2>&1); then ok "compile test program"; else bad "compile test program" "$out"; fi

# ---- run: exit status, output, environment
out=$("$HAK" run --lib "$LIBHAKMEM" -- "$tmp/prog" "a b" 2>"$tmp/err"); rc=$?
[ $rc -eq 0 ] && [ "$out" = "prog done a b" ] && [ ! -s "$tmp/err" ]
check "run: exit 0, stdout intact, stderr empty" $? "rc=$rc out=$out $(cat "$tmp/err")"
"$HAK" run --lib "$LIBHAKMEM" -- "$tmp/prog" x 3 >/dev/null 2>&1; rc=$?
check "run: exit status 3 passed through" $((rc != 3)) "rc=$rc"
"$HAK" run --lib "$LIBHAKMEM" -- sh -c 'kill -TERM $$' >/dev/null 2>&1; rc=$?
check "run: killed by SIGTERM -> 143" $((rc != 143)) "rc=$rc"
"$HAK" run --lib "$LIBHAKMEM" -- sh -c 'kill -SEGV $$' >/dev/null 2>&1; rc=$?
check "run: killed by SIGSEGV -> 139" $((rc != 139)) "rc=$rc"
out=$(printf 'line1\nline2\n' | "$HAK" run --lib "$LIBHAKMEM" -- cat 2>&1)
[ "$out" = $'line1\nline2' ]
check "run: stdin/stdout pass through" $? "$out"
out=$("$HAK" run --lib "$LIBHAKMEM" -- grep -c libhakmem /proc/self/maps 2>&1)
[ "${out:-0}" -ge 1 ] 2>/dev/null
check "run: the program has libhakmem mapped" $? "$out"
out=$(LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6 "$HAK" run --lib "$LIBHAKMEM" -- sh -c 'echo "$LD_PRELOAD"' 2>&1)
[ "$out" = "/lib/x86_64-linux-gnu/libm.so.6:$LIBHAKMEM" ]
check "run: appends to an existing LD_PRELOAD" $? "$out"
if [ "$(cd "$ROOT/build" 2>/dev/null && pwd -P)" = "$(cd "$BUILD" && pwd -P)" ]; then
  out=$("$HAK" run -- sh -c 'echo "$LD_PRELOAD"' 2>&1)
  [ "$out" = "$ROOT/build/libhakmem.so" ]
  check "run: finds build/libhakmem.so by itself" $? "$out"
fi

# ---- run --stats: the report
out=$("$HAK" run --stats --lib "$STATSLIB" -- "$tmp/prog" s 2>"$tmp/rep"); rc=$?
rep=$(cat "$tmp/rep")
[ $rc -eq 0 ] && [ "$out" = "prog done s" ]
check "run --stats: exit 0, stdout intact" $? "rc=$rc $out"
printf '%s\n' "$rep" | grep -q '^hakmem statistics: .*prog s (pid [0-9]*, hakmem .*(stats))$'
check "run --stats: report title with pid and version" $? "$rep"
printf '%s\n' "$rep" | grep -q '^Allocations by size class'
check "run --stats: histogram section" $? "$rep"
n32=$(printf '%s\n' "$rep" | awk '$1 == "32" && $2 == "B" { gsub(",", "", $3); print $3 }')
printf '%s\n' "$rep" | grep -Eq '^ +32 B +[0-9,]+ +[0-9.]+% +#+ ' && [ "${n32:-0}" -ge 1000 ]
check "run --stats: 32 B class has >= 1000 requests and a bar (got ${n32:-none})" $? "$rep"
nl=$(printf '%s\n' "$rep" | awk '$1 == "large" && $3 ~ /%$/ { gsub(",", "", $2); print $2 }')
[ "${nl:-0}" -ge 3 ]
check "run --stats: large class has >= 3 requests (got ${nl:-none})" $? "$rep"
for key in 'current bytes' 'peak bytes' 'mapped' 'RSS' 'purges' 'slow path time' 'remote frees'; do
  printf '%s\n' "$rep" | grep -Eq "^  $key +[0-9]"
  check "run --stats: report has '$key' with a figure" $? "$rep"
done
out=$("$HAK" run --stats --lib "$STATSLIB" -- sh -c "'$tmp/prog' 1; '$tmp/prog' 2" 2>&1 >/dev/null)
printf '%s\n' "$out" | grep -q 'processes added up' && printf '%s\n' "$out" | grep -q '^Processes ([0-9]*, most requests first)'
check "run --stats: two child processes are added up, with per-process lines" $? "$out"
"$HAK" run --stats --lib "$STATSLIB" --keep-stats "$tmp/keep" -- "$tmp/prog" >/dev/null 2>&1
kept=$(ls "$tmp/keep" 2>/dev/null | head -1)
[ -n "$kept" ] && head -1 "$tmp/keep/$kept" | grep -q '^hakmem-stats 1$'
check "run --stats --keep-stats: raw file kept" $? "$(ls -la "$tmp/keep" 2>&1)"
"$HAK" run --stats --lib "$STATSLIB" -- "$tmp/prog" x 5 >/dev/null 2>&1; rc=$?
check "run --stats: exit status 5 passed through" $((rc != 5)) "rc=$rc"

# ---- report: the parser on a hand-written file (unknown keys and records ignored)
cat > "$tmp/sample" <<'EOF'
hakmem-stats 1
version hakmem 0.1.0 (stats)
pid 4242
class 16 requests 300 frees 100 bytes 4000 live 200 peak 250 new_field 9
class 64 requests 150 frees 150 bytes 9000 live 0 peak 40
class 0 requests 2 frees 1 bytes 3000000 live 1 peak 2
mapped 8388608 mapped_peak 12582912 committed 8388608
os_mapped_total 16777216 os_returned 8388608 purges 7
segments 2 large_live 1 large_cached 0
refills 12 slabs_allocated 5 remote_collects 3 remote_frees 77
slow_path_ns 2500000
rss 3145728 rss_peak 4194304
some_future_record 1 2 3
EOF
out=$("$HAK" report "$tmp/sample" 2>&1); rc=$?
[ $rc -eq 0 ] \
  && printf '%s\n' "$out" | grep -Eq '^ +16 B +300 +66\.4% +#{40} +200 +250 ' \
  && printf '%s\n' "$out" | grep -Eq '^ +64 B +150 +33\.2% +#{20} ' \
  && printf '%s\n' "$out" | grep -Eq '^  total: 452 requests, 251 frees' \
  && printf '%s\n' "$out" | grep -Eq '^  current bytes +3\.1 KiB .* \+ 1 large block$' \
  && printf '%s\n' "$out" | grep -Eq '^  peak bytes +6\.4 KiB ' \
  && printf '%s\n' "$out" | grep -Eq '^  RSS +3\.0 MiB +at exit, peak 4\.0 MiB' \
  && printf '%s\n' "$out" | grep -Eq '^  purges +7 ' \
  && printf '%s\n' "$out" | grep -Eq '^  slow path time +2\.50 ms' \
  && printf '%s\n' "$out" | grep -Eq '^  remote frees +77 .* 3 batches'
check "report: hand-written sample parsed and rendered exactly" $? "$out"
out=$("$HAK" report "$tmp/sample" "$tmp/sample" 2>&1)
printf '%s\n' "$out" | grep -Eq '^  total: 904 requests' && printf '%s\n' "$out" | grep -q '2 processes added up'
check "report: two files are added up" $? "$out"
echo "not a stats file" > "$tmp/junk"
out=$("$HAK" report "$tmp/junk" 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && [[ $out == "hakmem: error: "* ]]
check "report: a file without the header -> exit 2, one line" $? "rc=$rc $out"

# ---- compare
out=$("$HAK" compare -q --rounds 1 --only hakmem,glibc --lib "$LIBHAKMEM" --csv "$tmp/c.csv" -- "$tmp/prog" 2>"$tmp/err"); rc=$?
[ $rc -eq 0 ] && printf '%s\n' "$out" | grep -Eq '^hakmem +[0-9.]+m?s ' && printf '%s\n' "$out" | grep -Eq '^glibc +[0-9.]+m?s .* [0-9.]+x$' \
  && printf '%s\n' "$out" | grep -Eq '^verdict: hakmem (is|uses) .* and .*(memory|RSS)'
check "compare: table with hakmem and glibc, verdict line" $? "rc=$rc $out $(cat "$tmp/err")"
python3 - "$tmp/c.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 4, rows                          # (1 warm-up + 1 round) x 2
assert sorted({r["allocator"] for r in rows}) == ["glibc", "hakmem"]
for r in rows:
    assert r["ok"] == "1" and r["rc"] == "0", r
    assert float(r["wall_s"]) > 0 and int(r["maxrss_kib"]) > 0, r
    assert ("LD_PRELOAD=" in r["command"]) == (r["allocator"] == "hakmem"), r
EOF
check "compare --csv: 4 rows that parse, clean env" $? "$(cat "$tmp/c.csv")"
out=$("$HAK" compare --rounds 1 --only hakmem,glibc --lib "$LIBHAKMEM" -- "$tmp/prog" x 4 2>"$tmp/err"); rc=$?
[ $rc -eq 1 ] && grep -q 'failed under hakmem .*exit status 4' "$tmp/err" && grep -q 'failed under glibc' "$tmp/err"
check "compare: a failing program -> reported, exit 1" $? "rc=$rc $out $(cat "$tmp/err")"
"$HAK" compare --rounds 1 --only hakmem,glibc --lib "$LIBHAKMEM" -- true 2>"$tmp/err" >/dev/null
grep -q '^\[[0-9]*/4\] true under \(hakmem\|glibc\)' "$tmp/err"
check "compare: progress line on stderr" $? "$(cat "$tmp/err")"
out=$("$HAK" compare -q --rounds 1 --only hakmem,glibc --lib "$LIBHAKMEM" --show-output -- "$tmp/prog" shown 2>&1)
printf '%s\n' "$out" | grep -q '^prog done shown$'
check "compare --show-output shows the program's output" $? "$out"
if command -v gnuplot >/dev/null; then
  "$HAK" compare -q --rounds 1 --only hakmem,glibc --lib "$LIBHAKMEM" --png "$tmp/c.png" -- true >/dev/null 2>&1
  [ "$(head -c 4 "$tmp/c.png" 2>/dev/null | od -An -c | tr -d ' ')" = "211PNG" ]
  check "compare --png writes a PNG chart" $? "$(ls -la "$tmp" 2>&1)"
else
  # a PATH with python3 (which runs the tool) and nothing else
  mkdir -p "$tmp/py-only" && ln -sf "$(python3 -c 'import sys; print(sys.executable)')" "$tmp/py-only/python3"
  out=$(PATH="$tmp/py-only" "$HAK" compare --rounds 1 --only hakmem,glibc --lib "$LIBHAKMEM" --png "$tmp/c.png" -- /bin/true 2>&1); rc=$?
  [ $rc -eq 2 ] && [[ $out == *"gnuplot not found"* ]]
  check "compare --png without gnuplot: clear message, exit 2" $? "rc=$rc $out"
fi

# ---- errors and exit codes: one line on stderr
one_line() { # NAME EXPECTED-RC CMD...
  local name=$1 want=$2; shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if { [ "$want" = nonzero ] && [ $rc -ne 0 ] || [ "$rc" = "$want" ]; } \
     && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == "hakmem: error: "* ]]; then
    ok "$name (exit $rc: ${err#hakmem: error: })"
  else
    bad "$name (exit $rc, wanted $want)" "$err"
  fi
}
one_line "run: program not found -> 127" 127 "$HAK" run --lib "$LIBHAKMEM" -- /nonexistent/prog
one_line "run: program not in PATH -> 127" 127 "$HAK" run --lib "$LIBHAKMEM" -- no-such-program-xyz
one_line "run: not executable -> 126" 126 "$HAK" run --lib "$LIBHAKMEM" -- "$tmp/prog.c"
one_line "compare: program not found -> 127" 127 "$HAK" compare --only hakmem,glibc --lib "$LIBHAKMEM" -- no-such-program-xyz
one_line "compare: bad --alloc library" nonzero "$HAK" compare --alloc bad=/nonexistent.so -- true
one_line "compare: --alloc without =" 2 "$HAK" compare --alloc justname -- true
one_line "compare: unknown --only name" 2 "$HAK" compare --only hakmem,nosuch -- true
one_line "run: no such --lib" nonzero "$HAK" run --lib /nonexistent.so -- true
# a library ld.so refuses: the run fails, and says why (it ran on glibc's malloc)
# (a position-independent executable: a 64-bit ELF of type DYN that ld.so will not preload)
echo 'int main(void) { return 0; }' > "$tmp/pie.c"
${CC:-cc} -fPIE -pie -o "$tmp/bad.so" "$tmp/pie.c"
out=$("$HAK" compare -q --rounds 1 --warmup 0 --alloc bad="$tmp/bad.so" --only glibc,bad -- true 2>&1)
[[ $out == *"could not be preloaded"* ]]
check "compare: a library that cannot be preloaded fails its runs" $? "$out"
one_line "run: --lib not a shared library" nonzero "$HAK" run --lib "$tmp/prog.c" -- true
one_line "run: missing -- -> usage error 2" 2 "$HAK" run true
one_line "compare: missing -- -> usage error 2" 2 "$HAK" compare --rounds 1 true
one_line "run: unknown option -> 2" 2 "$HAK" run --bogus -- true
one_line "compare: bad --rounds -> 2" 2 "$HAK" compare --rounds zero -- true
one_line "unknown command -> 2" 2 "$HAK" frobnicate
one_line "no command -> 2" 2 "$HAK"

# ---- help and version
for c in "" run compare report; do
  out=$("$HAK" $c --help 2>&1); rc=$?
  miss=""
  for s in NAME SYNOPSIS DESCRIPTION OPTIONS 'EXIT STATUS' EXAMPLES; do
    [ "$c" = "" ] && [ "$s" = OPTIONS ] && continue
    printf '%s\n' "$out" | grep -q "^$s\$" || miss="$miss $s"
  done
  [ $rc -eq 0 ] && [ -z "$miss" ]
  check "hakmem ${c:+$c }--help: man-page sections" $? "rc=$rc missing:$miss"
done
out=$("$HAK" --version 2>&1)
[[ $out == "hakmem 0.1.0 "* ]]
check "hakmem --version" $? "$out"

# ---- install layout: the libraries in PREFIX/lib, or in a LIBDIR of their
# own, which the installed command is told
for inst in "inst" "inst2 lib/x86_64-linux-gnu"; do
  read -r name libdir <<< "$inst"
  p="$tmp/$name" what="make install-cli${libdir:+ LIBDIR=PREFIX/$libdir}: installed hakmem runs with its libraries"
  if out=$(make -s install-cli BUILD="$BUILD" PREFIX="$p" ${libdir:+LIBDIR="$p/$libdir"} 2>&1) \
     && out=$("$p/bin/hakmem" run --stats -- "$tmp/prog" "$name" 2>&1) \
     && printf '%s\n' "$out" | grep -q "^prog done $name\$" \
     && printf '%s\n' "$out" | grep -q '^Allocations by size class' \
     && [ "$("$p/bin/hakmem" run -- sh -c 'echo "$LD_PRELOAD"')" = "$p/${libdir:-lib}/libhakmem.so" ]; then
    ok "$what"
  else
    bad "$what" "$out"
  fi
done

echo "RESULT cli $pass $fail"
[ "$fail" -eq 0 ]
