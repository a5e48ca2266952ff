#!/usr/bin/env bash
# The other builds under the same workloads: the C suites and two
# cross-thread benchmarks run with build/secure (hardened), build/stats (exact
# counters) and build/clang (the release flags built by clang, with LDFLAGS)
# preloaded over the linked release library, and the release archive linked
# statically into a program, which also runs set-user-ID for another user,
# and built against `make install`'s files with pkg-config. Each suite's
# lines are renamed <build>.<suite>.<test>.
set -u
SUITE=builds
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || { bad setup "cannot cd to $ROOT"; finish; }
B=${BUILD:-$ROOT/build}
make -s secure stats bench-bins >/dev/null 2>&1 || { bad setup "make secure stats bench-bins failed"; finish; }

run_suite() { # build, test binary
  local build=$1 bin=$2 out rc
  out=$(LD_PRELOAD="$B/$build/libhakmem.so" timeout 300 "$B/tests/$bin" 2>&1)
  rc=$?
  # per-test lines and the RESULT line, renamed for tests/run.sh
  printf '%s\n' "$out" | sed -E "s/^(  (ok|FAIL)  +)([a-z_]+)\./\1$build.\3./; s/^RESULT ([a-z_]+)/RESULT $build.\1/"
  printf '%s\n' "$out" | grep -q '^RESULT ' || bad "$build.$bin" "no RESULT line (exit $rc)"
}
for bin in test_api test_early test_stress test_threads test_cxx test_misuse; do
  run_suite secure "$bin"
done
for bin in test_stress test_threads test_hakapi; do
  run_suite stats "$bin"
done
# The release flags under clang, linked with a packager's LDFLAGS (binding
# every symbol at load): the library passes the same C suites, preloaded.
if ! out=$(make -s BUILD="$B/clang" CC=clang LDFLAGS=-Wl,-z,now release 2>&1); then
  bad clang.build "make CC=clang release failed (apt-get install clang): $(grep -m3 -iE 'error|not found' <<< "$out" | tr '\n' ' ')"
elif ! readelf -d "$B/clang/libhakmem.so" | grep -q BIND_NOW; then
  bad clang.ldflags "LDFLAGS=-Wl,-z,now did not reach the library's link: no BIND_NOW in its dynamic section"
else
  ok clang.ldflags "the library binds now"
  for bin in test_api test_early test_stress test_threads test_cxx test_misuse test_hakapi test_introspect; do
    run_suite clang "$bin"
  done
fi
# Flags tracked: a build with other CFLAGS, then one with none, rebuilds
# the library each time (the flags it was built with are in its text), and
# a build with nothing changed rebuilds nothing.
d=$(mktemp -d)
probe() { strings "$d/libhakmem.so" | grep -c -e -DHAK_FLAGS_PROBE; }
built_at() { stat -c %y "$d/libhakmem.so" "$d"/obj/*.o; }
if ! out=$(make -s BUILD="$d" CFLAGS=-DHAK_FLAGS_PROBE release 2>&1) || [ "$(probe)" != 1 ]; then
  bad flags.tracked "make CFLAGS=-DHAK_FLAGS_PROBE release: no probe in the library's flags: $out"
elif ! out=$(make -s BUILD="$d" release 2>&1) || [ "$(probe)" != 0 ]; then
  bad flags.tracked "make release after a build with other CFLAGS kept the old library: $out"
else
  built=$(built_at)
  sleep 1
  make -s BUILD="$d" release >/dev/null 2>&1
  if [ "$(built_at)" != "$built" ]; then
    bad flags.tracked "make release with nothing changed rebuilt the library"
  else
    ok flags.tracked "rebuilt when CFLAGS changed, not when nothing did"
  fi
fi
rm -rf "$d"
# The release archive linked into a program (README): its malloc and free
# are hakmem's, with no preload. The block escapes through a volatile, or
# clang -O2 drops the malloc and free of a block nothing reads.
mkdir -p "$B/tests"
cat > "$B/tests/static_link.c" <<'C'
#include <hakmem.h>
#include <stdio.h>
#include <stdlib.h>
static char *volatile kept;
static size_t large_live(void) {
  hak_stats_t s;
  hak_stats_get(&s);
  return s.large_live;
}
int main(void) {
  size_t before = large_live();
  char *p = malloc(2 << 20);
  if (p == NULL) return 1;
  p[0] = 1;
  kept = p;
  size_t during = large_live();
  free(p);
  printf("%zu %zu %zu\n", before, during, large_live());
  return !(during == before + 1 && large_live() == before);
}
C
if out=$(${CC:-cc} -O2 -I"$ROOT/include" -o "$B/tests/static_link" "$B/tests/static_link.c" \
    "$B/libhakmem.a" -pthread 2>&1 && env -u LD_PRELOAD "$B/tests/static_link" 2>&1); then
  ok release.static_link "large blocks live before, during, after: $out"
else
  bad release.static_link "$out"
fi
# A library built with -DHAK_NO_OVERRIDE (include/hakmem.h) exports no
# name of glibc's: the program's malloc stays glibc's, beside hakmem's
# hak_* blocks.
d=$(mktemp -d)
cat > "$d/no_override.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <hakmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  Dl_info m, h;
  if (!dladdr(dlsym(RTLD_DEFAULT, "malloc"), &m) || !dladdr((void *)hak_malloc, &h)) return 2;
  char *g = malloc(100), *s = hak_malloc(100), *l = hak_malloc(3 << 20);
  if (!g || !s || !l || hak_usable_size(s) < 100 || hak_usable_size(l) < (3 << 20)) return 3;
  memset(s, 1, 100);
  memset(l, 1, 3 << 20);
  free(g);
  hak_free(s);
  hak_free(l);
  printf("malloc from %s, hak_malloc from %s\n", m.dli_fname, h.dli_fname);
  return strstr(m.dli_fname, "libc.so") == NULL || strstr(h.dli_fname, "libhakmem") == NULL;
}
C
if ! out=$(make -s BUILD="$d" CFLAGS=-DHAK_NO_OVERRIDE release 2>&1); then
  bad no_override.build "make CFLAGS=-DHAK_NO_OVERRIDE release failed: $out"
elif glibc_names=$(nm -D --defined-only "$d/libhakmem.so" | awk '{print $3}' | grep -v '^hak_'); then
  bad no_override.exports "the library exports glibc's names: $(echo $glibc_names)"
elif out=$(${CC:-cc} -O2 -I"$ROOT/include" -o "$d/no_override" "$d/no_override.c" -L"$d" \
    -Wl,-rpath,"$d" -lhakmem -pthread 2>&1 && env -u LD_PRELOAD "$d/no_override" 2>&1); then
  ok no_override.program "only hak_* exported; $out"
else
  bad no_override.program "$out"
fi
rm -rf "$d"
# The same program set-user-ID root, run by nobody: its HAKMEM_* variables
# are the caller's and are ignored, or HAKMEM_STATS_FILE would overwrite a
# file only root may write. Needs root, setpriv (util-linux) and a file
# system that honours the set-user-ID bit.
setuid_check=release.setuid_program_ignores_the_environment
d=$(mktemp -d)
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null ||
    findmnt -no OPTIONS -T "$d" 2>/dev/null | grep -qw nosuid; then
  bad $setuid_check "cannot run: needs root, setpriv and a file system without nosuid ($d)"
else
  chmod 755 "$d" && cp "$B/tests/static_link" "$d/suid" && chmod 4755 "$d/suid"
  printf 'kept\n' > "$d/victim" && chmod 600 "$d/victim"
  (cd "$d" && env -u LD_PRELOAD HAKMEM_STATS=1 HAKMEM_STATS_FILE="$d/written" ./suid >/dev/null 2>&1)
  out=$(cd "$d" && setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -u LD_PRELOAD HAKMEM_STATS=1 HAKMEM_STATS_FILE="$d/victim" ./suid 2>&1)
  if [ ! -s "$d/written" ]; then
    bad $setuid_check "run by root, the program wrote no statistics file"
  elif ! grep -qE '^[0-9]+ [0-9]+ [0-9]+$' <<< "$out"; then
    bad $setuid_check "run by nobody, the program did not run: $out"
  elif [ "$(cat "$d/victim")" != kept ]; then
    bad $setuid_check "run by nobody, it wrote root's file: $(head -c 80 "$d/victim")"
  else
    ok $setuid_check "root's file kept; run by root, it wrote its statistics"
  fi
fi
rm -rf "$d"
# `make install` into a package's root (DESTDIR), the libraries in a
# multiarch directory, the same program built with the flags of the
# installed hakmem.pc (linked to the shared library, and to the archive with
# the static flags), then `make uninstall`.
d=$(mktemp -d)
lib=/usr/lib/x86_64-linux-gnu
if ! out=$(make -s install BUILD="$B" DESTDIR="$d" PREFIX=/usr LIBDIR=$lib 2>&1); then
  bad install "make install failed: $out"
elif ! command -v pkg-config >/dev/null; then
  bad install.pkg_config "needs pkg-config (apt-get install pkgconf)"
else
  export PKG_CONFIG_SYSROOT_DIR="$d" PKG_CONFIG_PATH="$d$lib/pkgconfig"
  for how in shared static; do
    # the library the program loads: the installed one, or none
    if [ $how = shared ]; then
      flags="$(pkg-config --cflags --libs hakmem) -Wl,-rpath,$d$lib"
      want="libhakmem.so.0 => $d$lib/libhakmem.so.0"
    else
      flags="$(pkg-config --cflags hakmem) -Wl,-Bstatic $(pkg-config --static --libs hakmem) -Wl,-Bdynamic"
      want=
    fi
    # shellcheck disable=SC2086 # flags are words
    if ! out=$(${CC:-cc} -O2 -o "$d/prog" "$B/tests/static_link.c" $flags 2>&1 &&
        env -u LD_PRELOAD "$d/prog" 2>&1); then
      bad install.pkg_config_$how "${CC:-cc} ... $flags: $out"
    elif loads=$(ldd "$d/prog" | grep -o 'libhakmem[^ ]* => [^ ]*'); [ "$loads" != "$want" ]; then
      bad install.pkg_config_$how "the program loads '${loads:-no hakmem}', not '${want:-no hakmem}'"
    else
      ok install.pkg_config_$how "large blocks live before, during, after: $out"
    fi
  done
  unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
  rm -f "$d/prog"
  if ! out=$(make -s uninstall BUILD="$B" DESTDIR="$d" PREFIX=/usr LIBDIR=$lib 2>&1); then
    bad install.uninstall "make uninstall failed: $out"
  elif left=$(find "$d" ! -type d) && [ -n "$left" ]; then
    bad install.uninstall "left: $(tr '\n' ' ' <<< "$left")"
  else
    ok install.uninstall "no file left"
  fi
fi
rm -rf "$d"
for build in secure stats; do
  for cmd in "larson 2 8 128 1000 20000 5" "xmalloc 2 2 20000 50"; do
    if out=$(LD_PRELOAD="$B/$build/libhakmem.so" timeout 120 $B/bench/$cmd 2>&1) &&
        grep -q 'ops/s=' <<< "$out"; then
      ok "$build.bench.${cmd%% *}"
    else
      bad "$build.bench.${cmd%% *}" "$(tail -2 <<< "$out" | tr '\n' ' ')"
    fi
  done
done
finish
