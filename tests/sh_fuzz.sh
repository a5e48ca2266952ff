#!/usr/bin/env bash
# libFuzzer checks of the hak_* API (fuzz/fuzz_alloc.c, docs/RELIABILITY.md):
#   fuzz.regress  every input of fuzz/corpus once (-runs=0); always runs
#   fuzz.run      fuzzing for FUZZ_SECONDS: 60 when CI=true, else 10
# A crash leaves its input in build/fuzz/crash-*; reproduce with
#   build/fuzz/fuzz_alloc build/fuzz/crash-<hash>
set -u
SUITE=fuzz
. "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || { bad setup "cannot cd to $ROOT"; finish; }
B=build
MK=(make --no-print-directory)
grep -qs 'fuzz/fuzz.mk' Makefile || MK+=(-f Makefile -f fuzz/fuzz.mk)
if [ "${CI:-}" = true ]; then SECS=${FUZZ_SECONDS:-60}; else SECS=${FUZZ_SECONDS:-10}; fi
T=$(mktemp -d /tmp/hakmem-fuzz.XXXXXX)
trap 'rm -rf "$T"' EXIT
unset HAKMEM_STATS HAKMEM_VERBOSE
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
FZ=$B/fuzz/fuzz_alloc
ARGS=(-max_len=2048 -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 -artifact_prefix="$B/fuzz/")

if ! "${MK[@]}" -j2 fuzz-bin >"$T/build.log" 2>&1; then
  bad build "clang -fsanitize=fuzzer build failed (apt-get install clang libclang-rt-14-dev): $(grep -m3 -E 'error|Error' "$T/build.log" | tr '\n' ' ')"
  finish
fi
if [ ! -d fuzz/corpus ] || [ -z "$(ls fuzz/corpus)" ]; then
  bad regress "fuzz/corpus is missing or empty (make fuzz-corpus)"
else
  n=$(ls fuzz/corpus | wc -l)
  if timeout 300 "$FZ" "${ARGS[@]}" -runs=0 fuzz/corpus >"$T/regress.log" 2>&1; then
    ok regress "$n inputs, $(grep -m1 -o 'cov: [0-9]*' "$T/regress.log" | tail -1)"
  else
    bad regress "$(grep -m1 -E '^fuzz_alloc:|ERROR|runtime error|hakmem:' "$T/regress.log") ($(grep -m1 -o "Test unit written to .*" "$T/regress.log"))"
    sed -n '/ERROR\|^fuzz_alloc:\|hakmem:/,+12p' "$T/regress.log" | head -20 | sed 's/^/      /'
  fi
fi

mkdir -p "$T/work"
t0=$(date +%s.%N)
if timeout $((SECS + 120)) "$FZ" "${ARGS[@]}" -max_total_time="$SECS" "$T/work" fuzz/corpus >"$T/run.log" 2>&1; then
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$T/run.log")
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$T/run.log")
  cov=$(grep -o 'cov: [0-9]*' "$T/run.log" | tail -1)
  ok run "${SECS}s: ${runs:-?} inputs, ${eps:-?}/s, $cov, $(ls "$T/work" | wc -l) new corpus entries"
else
  bad run "$(grep -m1 -E '^fuzz_alloc:|ERROR|runtime error|hakmem:' "$T/run.log") ($(grep -m1 -o "Test unit written to .*" "$T/run.log"))"
  sed -n '/ERROR\|^fuzz_alloc:\|hakmem:/,+14p' "$T/run.log" | head -24 | sed 's/^/      /'
fi
finish
