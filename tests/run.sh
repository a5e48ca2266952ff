#!/usr/bin/env bash
# Runs every test suite given as arguments (executables or shell scripts that
# print "RESULT <suite> <passed> <failed> [<skipped>]" lines), sums them, and
# prints the closing line "N passed, N failed" (", N skipped" if any were). A
# suite that dies without a RESULT line counts as one failure.
set -u
total_pass=0
total_fail=0
total_skip=0
for suite in "$@"; do
  echo "== $suite"
  out=$("$suite" 2>&1)
  rc=$?
  printf '%s\n' "$out" | grep -v '^RESULT '
  results=$(printf '%s\n' "$out" | grep '^RESULT ' || true)
  if [ -z "$results" ]; then
    echo "  FAIL  $suite: no RESULT line (exit $rc)"
    total_fail=$((total_fail + 1))
    continue
  fi
  while read -r _ name p f s; do
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    total_skip=$((total_skip + ${s:-0}))
  done <<< "$results"
done
skipped=""
[ "$total_skip" -gt 0 ] && skipped=", $total_skip skipped"
echo "$total_pass passed, $total_fail failed$skipped"
[ "$total_fail" -eq 0 ]
