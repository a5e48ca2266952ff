#!/usr/bin/env bash
# Sanitizer checks (docs/RELIABILITY.md), run by `make test`:
#   ubsan.<suite>  every C suite (tests/test_*.c but test_misuse, tests/unit_*.c)
#                  rebuilt against a UBSan build of the library (with the malloc
#                  override); any "runtime error" fails, as does a failing test
#   ubsan.stress   the hak_* stress program on a no-override UBSan debug build
#   tsan.stress    clang TSan, 8 threads, hak_* API, no-override build, 3 s
#   tsan.stress_debug  the same against the debug (HAK_DEBUG=1) build
# Any TSan report fails the check; nothing is suppressed.
# Env: SAN_TSAN_SECONDS (3), SAN_SKIP_UBSAN=1 / SAN_SKIP_TSAN=1 to skip a part.
set -u
SUITE=sanitizers
. "$(dirname "$0")/lib.sh"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || { bad setup "cannot cd to $ROOT"; finish; }
B=build # the top Makefile's BUILD
MK=(make --no-print-directory)
grep -qs 'tests/sanitize.mk' Makefile || MK+=(-f Makefile -f tests/sanitize.mk)
T=$(mktemp -d /tmp/hakmem-san.XXXXXX)
trap 'rm -rf "$T"' EXIT
unset HAKMEM_STATS HAKMEM_VERBOSE
TSAN_SECONDS=${SAN_TSAN_SECONDS:-3}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1fs", b-a}'; }

# ---------------- UBSan ----------------
if [ "${SAN_SKIP_UBSAN:-0}" != 1 ]; then
  t0=$(now)
  if ! "${MK[@]}" -j2 ubsan-bins >"$T/ubsan-build.log" 2>&1; then
    bad ubsan.build "build failed: $(grep -m3 -E 'error|Error' "$T/ubsan-build.log" | tr '\n' ' ')"
  else
    echo "  (ubsan build $(since "$t0"))"
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1
    for bin in "$B"/ubsan/tests/unit_* "$B"/ubsan/tests/test_*; do
      name=$(basename "$bin")
      [ "$name" = test_misuse ] && continue # frees invalid pointers on purpose
      t0=$(now)
      HAK_FAULTS_PC_SECONDS=3 HAK_FAULTS_CHURN_THREADS=10000 timeout 120 "$bin" >"$T/$name.out" 2>&1
      rc=$?
      res=$(grep -m1 '^RESULT ' "$T/$name.out")
      if grep -q 'runtime error' "$T/$name.out"; then
        bad "ubsan.$name" "undefined behaviour: $(grep -m1 -A6 'runtime error' "$T/$name.out")"
      elif [ -z "$res" ] || [ "$rc" -ne 0 ]; then
        bad "ubsan.$name" "exit $rc, ${res:-no RESULT line}: $(grep -m3 'FAIL' "$T/$name.out" | tr '\n' ' ')"
      else
        ok "ubsan.$name" "${res#RESULT }, $(since "$t0")"
      fi
    done
    t0=$(now)
    if out=$(timeout 60 "$B"/san-ubsan/san_stress -t 8 -s 2 2>&1) && ! grep -q 'runtime error' <<<"$out"; then
      ok ubsan.stress "$(since "$t0"): ${out#san_stress: }"
    else
      bad ubsan.stress "$(head -c 1500 <<<"$out")"
    fi
    unset UBSAN_OPTIONS
  fi
fi

# ---------------- TSan ----------------
if [ "${SAN_SKIP_TSAN:-0}" != 1 ]; then
  t0=$(now)
  if ! "${MK[@]}" -j2 tsan-bins >"$T/tsan-build.log" 2>&1; then
    bad tsan.build "build failed (clang with -fsanitize=thread needed): $(grep -m3 -E 'error|Error' "$T/tsan-build.log" | tr '\n' ' ')"
  else
    echo "  (tsan build $(since "$t0"))"
    for v in san-tsan:stress san-tsan-debug:stress_debug; do
      dir=${v%%:*} name=tsan.${v#*:}
      t0=$(now)
      TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1 \
        timeout 120 "$B/$dir/san_stress" -t 8 -s "$TSAN_SECONDS" -n 512 >"$T/$dir.out" 2>&1
      rc=$?
      if [ "$rc" -eq 0 ] && ! grep -q 'ThreadSanitizer' "$T/$dir.out"; then
        ok "$name" "$(since "$t0"): $(sed -n 's/^san_stress: //p' "$T/$dir.out")"
      else
        # the whole first report: the lead needs the stacks
        bad "$name" "exit $rc; $(grep -m1 'SUMMARY' "$T/$dir.out")"
        sed -n '/^WARNING: ThreadSanitizer/,/^SUMMARY/p' "$T/$dir.out" | sed 's/ (BuildId: [0-9a-f]*)//' | head -80 | sed 's/^/      /'
      fi
    done
  fi
fi
finish
