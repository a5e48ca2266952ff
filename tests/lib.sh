# Shared by the shell suites: per-check lines and the RESULT line that
# tests/run.sh sums. Set SUITE before sourcing.
pass=0
fail=0
ok() { echo "  ok    $SUITE.$1${2:+ ($2)}"; pass=$((pass + 1)); }
bad() { echo "  FAIL  $SUITE.$1: $2"; fail=$((fail + 1)); }
finish() {
  echo "RESULT $SUITE $pass $fail"
  [ "$fail" -eq 0 ]
  exit
}
