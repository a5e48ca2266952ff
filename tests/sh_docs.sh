#!/usr/bin/env bash
# docs/OPTIONS.md is generated from the option table and must be current;
# PERFORMANCE.md's status agrees with its table of runs; HAKMEM_VERBOSE
# prints the version, build flags and every option.
cd "$(dirname "$0")/.."
pass=0 fail=0
check() { # name, command...
  local name=$1; shift
  if out=$("$@" 2>&1); then pass=$((pass + 1)); echo "  ok    docs.$name"
  else fail=$((fail + 1)); echo "  FAIL  docs.$name: $(printf '%s' "$out" | head -3 | tr '\n' '|')"; fi
}
check options_doc_is_current make -s check-options-doc
check class_tables_are_current make -s check-class-tables
check status_counts_agree_with_the_table_of_runs python3 tools/matrix_runs.py --check docs/PERFORMANCE.md
verbose=$(HAKMEM_VERBOSE=1 LD_PRELOAD="$LIBHAKMEM" /bin/true 2>&1)
check verbose_prints_version grep -q "hakmem 0.1.0 (release)" <<< "$verbose"
check verbose_prints_build_flags grep -q "built with .*-O2" <<< "$verbose"
check verbose_prints_every_option bash -c '
  for o in $(sed -n "s/^| \`\(HAKMEM_[A-Z_]*\)\`.*/\1/p" docs/OPTIONS.md); do
    grep -q "$o " <<< "$1" || { echo "missing $o"; exit 1; }; done' _ "$verbose"
# A long value is printed cut, never with bytes from past the buffer.
long=/nonexistent/$(printf 'd%.0s' $(seq 4200))
nuls=$(HAKMEM_VERBOSE=1 HAKMEM_STATS_FILE="$long" LD_PRELOAD="$LIBHAKMEM" /bin/true 2>&1 | tr -dc '\000' | wc -c)
check verbose_prints_a_long_value_without_stray_bytes test "$nuls" -eq 0
stderr=$(HAKMEM_STATS=1 HAKMEM_STATS_FILE="$long%p" LD_PRELOAD="$LIBHAKMEM" /bin/true 2>&1)
check stats_file_too_long_is_an_error grep -q "HAKMEM_STATS_FILE too long" <<< "$stderr"
echo "RESULT docs $pass $fail"
[ "$fail" -eq 0 ]
