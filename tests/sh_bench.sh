#!/usr/bin/env bash
# Benchmark suite checks (cheap): every workload runs with tiny arguments under
# glibc and under $LIBHAKMEM and prints a parsable ops/s= line; the
# statistics code of tools/hakbench.py passes its unit tests; tools/matrix_runs.py
# summarizes the committed reports; bench/run runs
# end to end (1 tiny workload, 1 round, glibc + hakmem) and writes its CSV, and
# runs a command of its own beside a commit's library (--cmd, --rev).
# Env: LIBHAKMEM (release .so, default build/libhakmem.so), BUILD (default build).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build}
LIBHAKMEM=${LIBHAKMEM:-$BUILD/libhakmem.so}
BIN=$BUILD/bench
pass=0
fail=0
ok()  { echo "  ok    $1"; pass=$((pass + 1)); }
bad() { echo "  FAIL  $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | tail -5 | sed 's/^/        /'; fail=$((fail + 1)); }

if out=$(make -s bench-bins BUILD="$BUILD" 2>&1); then ok "make bench-bins"; else bad "make bench-bins" "$out"; fi

# name | tiny arguments
tiny=(
  "random_mixed|20000 64 1234567"
  "random_mixed|20000 64 1234567 16 4096"
  "mid_large_mt|2 20000 64 1234567 257 768"
  "mid_large_mt|2 5000 64 1234567 big"
  "larson|2 8 128 200 2000 3"
  "xmalloc|2 2 20000 50"
  "cache_scratch|2 50 8 200"
  "cache_thrash|2 50 8 200"
  "glibc_simple|64 20000 4"
  "glibc_thread|2 64 20000"
  "realloc_chain|16 20000 4096"
  "large|20 4 65536 4194304"
  "batch|20 16"
  "frag|4"
  "frag|--scale 0.004"
  "progtime|true"
  "cxx_containers|map 2000 100"
  "cxx_containers|shared 2000 100"
  "forkjoin|3 2 5"
  "forkjoin|3 2 5 4141 1"
  "forkjoin|3 2 5 4141 2"
)
[ -f "$LIBHAKMEM" ] || bad "LIBHAKMEM=$LIBHAKMEM exists"
for alloc in glibc hakmem; do
  pre=()
  [ "$alloc" = hakmem ] && pre=(LD_PRELOAD="$LIBHAKMEM")
  for t in "${tiny[@]}"; do
    prog=${t%%|*} args=${t#*|}
    # shellcheck disable=SC2086
    out=$(env -i PATH="$PATH" HOME="${HOME:-/}" LANG=C "${pre[@]}" timeout 20 "$BIN/$prog" $args 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'ops/s=[0-9][0-9]*')" -eq 1 ]; then
      ok "$alloc $prog $args"
    else
      bad "$alloc $prog $args (exit $rc)" "$out"
    fi
  done
done
for t in "random_mixed.noop|10000 64" "larson.noop|1 8 128 100 1000 2"; do
  p=${t%%|*} args=${t#*|}
  # shellcheck disable=SC2086
  if out=$("$BIN/$p" $args 2>&1) && [[ $out == *build=noop*ops/s=* ]]; then ok "$p $args"; else bad "$p $args" "$out"; fi
done
# The floor of make bench-floor runs the loops it is a column of.
if out=$(make -s "$BIN/libfloor.so" BUILD="$BUILD" 2>&1); then
  for t in "random_mixed|20000 64 1234567" "mid_large_mt|2 5000 64 1234567 big" "larson|2 10 1000 200 2000 3"; do
    prog=${t%%|*} args=${t#*|}
    # shellcheck disable=SC2086
    if out=$(env -i PATH="$PATH" LANG=C LD_PRELOAD="$BIN/libfloor.so" timeout 20 "$BIN/$prog" $args 2>&1) &&
       [[ $out == *ops/s=[0-9]* ]]; then ok "floor $prog $args"; else bad "floor $prog $args" "$out"; fi
  done
else
  bad "make $BIN/libfloor.so" "$out"
fi
# Memory return (issue: RSS back within 10% of start-up after frag frees
# everything): 64 MiB, a 200 ms delay, then idle with no allocator call. What
# the allocator keeps is anonymous memory; the file pages of the program's
# libraries vary by 100 KiB or more from run to run at start-up (1604 and
# 1708 KiB in two runs), so the growth of the anonymous part is measured.
out=$(env -i PATH="$PATH" LANG=C HAKMEM_PURGE_DELAY_MS=200 LD_PRELOAD="$LIBHAKMEM" \
      timeout 20 "$BIN/frag" 64 --watch 1000 2>&1)
start=$(printf '%s\n' "$out" | grep -o 'start_rss_kib=[0-9]*' | cut -d= -f2)
start_anon=$(printf '%s\n' "$out" | grep -o 'start_anon_kib=[0-9]*' | cut -d= -f2)
idle=$(printf '%s\n' "$out" | grep -o ' 1000:[0-9]*/[0-9]*' | cut -d: -f2)
idle_anon=${idle#*/} idle=${idle%/*}
if [ -n "$start" ] && [ -n "$start_anon" ] && [ -n "$idle" ] &&
   [ $((idle_anon - start_anon)) -le $((start / 10)) ]; then
  ok "frag 64 MiB: idle RSS ${idle} KiB, anonymous memory $((idle_anon - start_anon)) KiB over start-up, within 10% of its RSS ${start} KiB"
else
  bad "frag 64 MiB: idle anonymous memory ${idle_anon:-?} KiB against ${start_anon:-?} at start-up: more than 10% of its RSS ${start:-?} KiB over it" "$out"
fi

# progtime fails the run of a program that fails, is killed or cannot start.
progtime_fails() { # progtime_fails WANT CMD...: exit 1, WANT on stderr, no result line
  local want=$1 out rc
  shift
  out=$("$BIN/progtime" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 1 ] && [[ $out == *"$want"* ]] && [[ $out != *ops/s=* ]]; then
    ok "progtime $*: exit 1, '$want'"
  else
    bad "progtime $*: exit 1, '$want' (exit $rc)" "$out"
  fi
}
progtime_fails "exited with status 1" false
progtime_fails "killed by signal 11" sh -c 'kill -SEGV $$'
progtime_fails "cannot run /nonexistent" /nonexistent

if out=$("$BIN/random_mixed" --help 2>&1) && [[ $out == usage:* ]]; then ok "usage text"; else bad "usage text" "$out"; fi

if out=$(python3 -m unittest discover -s bench -p 'test_hakbench.py' 2>&1); then
  ok "tools/hakbench.py unit tests ($(printf '%s\n' "$out" | grep -o 'Ran [0-9]* tests'))"
else
  bad "tools/hakbench.py unit tests" "$out"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# tools/matrix_runs.py: a row per report of 11 rounds (tests/data holds the
# tables of one), whose first ratio is the report's own random_mixed ws=400
# median; a report of 7 rounds is left out.
full=tests/data/full-report.md
sed 's/^- set: full, 11 rounds/- set: full, 7 rounds/' "$full" > "$tmp/seven.md"
want=$(sed -n 's/^| random_mixed ws=400 *| *[a-z]* | \([0-9.]*\)x |.*/\1/p' "$full")
if out=$(python3 tools/matrix_runs.py "$full" "$tmp/seven.md" 2>&1) && [ "$(printf '%s\n' "$out" | wc -l)" -eq 3 ] &&
   [ -n "$want" ] && [ "$(printf '%s\n' "$out" | tail -1 | cut -d'|' -f4 | tr -d ' ')" = "$want" ]; then
  ok "tools/matrix_runs.py: one row per report of 11 rounds, random_mixed ws=400 at $want"
else
  bad "tools/matrix_runs.py (want $want)" "$out"
fi

# A report that ends its round-by-round table with a geomean row (from session 72 on)
# gives "gm rows" from that row, which hakbench took from unrounded medians.
sed '/^| frag 1GiB *| *tcmalloc/a | geomean | | 1.234x | | 23 of 23 workloads |' "$full" > "$tmp/gm.md"
if out=$(python3 tools/matrix_runs.py "$tmp/gm.md" 2>&1) &&
   [ "$(printf '%s\n' "$out" | tail -1 | awk -F'|' '{print $(NF-2)}' | tr -d ' ')" = 1.234 ]; then
  ok "tools/matrix_runs.py: gm rows is the report's own geomean row"
else
  bad "tools/matrix_runs.py (want gm rows 1.234)" "$out"
fi

# The table of the other columns against hakmem (from session 85 on) changes no figure.
awk '/^Peak RSS/ { print "| workload (column / hakmem, same round) | column | median | middle half | min-max | rounds |";
                   print "|---|---|---|---|---|---|";
                   print "| random_mixed ws=400 | hakmem-secure | 0.828x | 0.819-0.837 | 0.78-0.84 | 11 of 11 |"; print "" }
     { print }' "$full" > "$tmp/cols.md"
if grep -q "column / hakmem" "$tmp/cols.md" && out=$(python3 tools/matrix_runs.py "$tmp/cols.md" 2>&1) &&
   [ "$(printf '%s\n' "$out" | tail -1 | cut -d'|' -f4-)" = "$(python3 tools/matrix_runs.py "$full" | tail -1 | cut -d'|' -f4-)" ]; then
  ok "tools/matrix_runs.py: the other columns' table changes no figure"
else
  bad "tools/matrix_runs.py with the other columns' table" "$out"
fi

# --counts reads a table of such rows back: how many runs met each target. A run
# marked "not in the status's counts" is left out; a group counts by its lowest row.
python3 tools/matrix_runs.py "$full" > "$tmp/runs.md"
row=$(tail -1 "$tmp/runs.md")
printf '%s\n' "$row" | sed 's/| 1\.060 | 1\.060 |/| 1.120 | 1.060 |/' >> "$tmp/runs.md"
printf '%s\n' "$row" | sed "s/| full-report |/| full-x (not in the status's counts) |/" >> "$tmp/runs.md"
if out=$(python3 tools/matrix_runs.py --counts "$tmp/runs.md" 2>&1) &&
   grep -qx '| rm 400 | 1.10 | 2 | 1.060 | 1.120 | 1 |' <<< "$out" &&
   grep -qx '| larson | 1.05 | 2 | 1.055 | 1.177 | 2 |' <<< "$out" &&
   grep -qx '| cache | 1.00 | 2 | 0.995 | 1.000 | 0 |' <<< "$out" &&
   grep -qx '| peaks | all | 2 | | | 2 |' <<< "$out"; then
  ok "tools/matrix_runs.py --counts: runs at or over each target, marked runs left out"
else
  bad "tools/matrix_runs.py --counts" "$out"
fi

# --check compares the status of docs/PERFORMANCE.md with its table of runs
# (tests/sh_docs.sh checks the file as it is): a count one off is named.
n=$(grep -c '^| `[0-9a-f]*` | full-' docs/PERFORMANCE.md)
sed -E '0,/^\| random_mixed ws=8192 /s/([0-9]+) of ([0-9]+)/\2 of \2/' docs/PERFORMANCE.md > "$tmp/status.md"
if ! out=$(python3 tools/matrix_runs.py --check "$tmp/status.md" 2>&1) && [ "$n" -gt 0 ] &&
   [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && grep -q "^status 'random_mixed ws=8192': want" <<< "$out"; then
  ok "tools/matrix_runs.py --check: names a status count the table of runs does not bear out"
else
  bad "tools/matrix_runs.py --check" "$out"
fi

out=$(HAKMEM_LEAK=1 python3 bench/run --set tiny --rounds 1 --warmup 0 --only glibc,hakmem \
      --hakmem-lib "$LIBHAKMEM" --bin-dir "$BIN" --out-dir "$tmp" --tag t --no-install --no-plot -q 2>&1)
rc=$?
csv=$tmp/t.csv
if [ $rc -eq 0 ] && [ -f "$csv" ] && [ "$(grep -c '^random_mixed tiny,' "$csv")" -eq 2 ] \
   && grep -q '^random_mixed tiny,hakmem,1,.*,1,0,[0-9]' "$csv" && [ -f "$tmp/t.md" ] \
   && grep -q '^| random_mixed tiny *| *glibc | [0-9.]*x |' "$tmp/t.md"; then
  ok "bench/run end to end (glibc+hakmem, CSV + Markdown with the round-by-round table)"
else
  bad "bench/run end to end (exit $rc)" "$out"
fi
if [ -f "$csv" ] && ! grep -q HAKMEM_LEAK "$csv" && grep -q "LD_PRELOAD=$LIBHAKMEM" "$csv"; then
  ok "bench/run children get a clean environment"
else
  bad "bench/run children get a clean environment"
fi

# An A/B of any command: PROG from --bin-dir, an --alloc column beside hakmem.
out=$(python3 bench/run --cmd "random_mixed 20000 64 1234567 16 64" --rounds 2 --warmup 0 \
      --only hakmem,again --alloc "again=$LIBHAKMEM" --hakmem-lib "$LIBHAKMEM" --bin-dir "$BIN" \
      --out-dir "$tmp" --tag c --no-install --no-plot -q 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '^random_mixed 20000 64 1234567 16 64,hakmem,' "$tmp/c.csv")" -eq 2 ] &&
   [ "$(grep -c '^random_mixed 20000 64 1234567 16 64,again,' "$tmp/c.csv")" -eq 2 ] &&
   grep -q "min=16 max=64" "$tmp/c.csv" &&
   grep -q '^| random_mixed 20000 64 1234567 16 64 *| *again | [0-9.]*x | [0-9.]*-[0-9.]* | [0-9.]*-[0-9.]* | 2 of 2 |' "$tmp/c.md"; then
  ok "bench/run --cmd: the command as a workload, each allocator in each round, paired by round"
else
  bad "bench/run --cmd (exit $rc)" "$out"
fi
# A column of a commit's library, built from its tree (here HEAD's).
if sha=$(git rev-parse --verify --quiet HEAD 2>/dev/null); then
  out=$(python3 bench/run --cmd "random_mixed 20000 64 1234567" --rounds 1 --warmup 0 --only hakmem \
        --rev HEAD --hakmem-lib "$LIBHAKMEM" --bin-dir "$BIN" --out-dir "$tmp" --tag r --no-install \
        --no-plot -q 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && grep -q "^random_mixed 20000 64 1234567,HEAD,1,.*LD_PRELOAD=$ROOT/build/rev/${sha:0:12}/build/libhakmem.so" "$tmp/r.csv" &&
     grep -q '^random_mixed 20000 64 1234567,hakmem,1,' "$tmp/r.csv"; then
    ok "bench/run --rev HEAD: a column of the commit's library, built in build/rev/"
  else
    bad "bench/run --rev HEAD (exit $rc)" "$out"
  fi
  if out=$(python3 bench/run --cmd "random_mixed 20000 64" --rev no-such-rev --no-install --dry-run 2>&1); then
    bad "bench/run --rev of no commit fails" "$out"
  elif [[ $out == *"--rev no-such-rev: not a commit of this repository"* ]]; then
    ok "bench/run --rev of no commit fails, naming it"
  else
    bad "bench/run --rev of no commit fails, naming it" "$out"
  fi
else
  echo "  skip  bench/run --rev (not a git checkout)"
fi
if out=$(python3 bench/run --cmd " " --only hakmem --hakmem-lib "$LIBHAKMEM" --no-install --dry-run 2>&1); then
  bad "bench/run --cmd with no command fails" "$out"
elif [[ $out == *"--cmd needs a command"* ]]; then
  ok "bench/run --cmd with no command fails, naming the fault"
else
  bad "bench/run --cmd with no command fails, naming the fault" "$out"
fi

echo "RESULT bench $pass $fail"
[ "$fail" -eq 0 ]
