#!/usr/bin/env bash
# Real Debian programs under LD_PRELOAD=$LIBHAKMEM: each workload runs once
# with the system allocator and once with hakmem; stdout, stderr and the exit
# code must be identical. Missing programs are failures (CI installs them:
# python3 libpython3.11-testsuite perl coreutils gcc g++ nodejs
# openjdk-17-jdk-headless sqlite3 redis-server redis-tools memcached
# mariadb-server openssh-server postgresql).
set -u
SUITE=real_programs
. "$(dirname "$0")/lib.sh"

LIBHAKMEM=${LIBHAKMEM:-${BUILD:-build}/libhakmem.so}
if [ ! -f "$LIBHAKMEM" ]; then
  bad setup "LIBHAKMEM is unset or not a file: '${LIBHAKMEM:-}'"
  finish
fi
case "$LIBHAKMEM" in /*) ;; *) LIBHAKMEM=$PWD/$LIBHAKMEM ;; esac
KEEP=${BUILD:-build} # where a failed run's output is kept
case "$KEEP" in /*) ;; *) KEEP=$PWD/$KEEP ;; esac

T=$(mktemp -d /tmp/hakmem-real.XXXXXX)
trap 'rm -rf "$T"' EXIT
# The programs run with hakmem's default options: no HAKMEM_* variable
# from the caller's environment reaches them, but those named in
# HAK_REAL_OPTIONS ("HAKMEM_NAME=VALUE ...", which tools/soak rotates).
for v in $(compgen -e | grep '^HAKMEM_'); do unset "$v"; done
for o in ${HAK_REAL_OPTIONS:-}; do
  case $o in
    HAKMEM_[A-Z]*=*) export "$o" ;;
    *) bad setup "HAK_REAL_OPTIONS: '$o' is not HAKMEM_NAME=VALUE"; finish ;;
  esac
done
export LC_ALL=C

PY=/usr/bin/python3
need() { # need NAME PATH...: fails the check NAME if a program is missing
  local name=$1; shift
  for p in "$@"; do
    if ! command -v "$p" >/dev/null 2>&1; then
      bad "$name" "required program '$p' is not installed (apt-get install it)"
      return 1
    fi
  done
}

# same NAME CMD...: runs CMD (in $T) without and with the preload and compares.
same() {
  local name=$1; shift
  local b=$T/$name.base h=$T/$name.hak rb rh t0 t1 t2
  t0=$(date +%s.%N)
  (cd "$T" && timeout 120 "$@" >"$b.out" 2>"$b.err"); rb=$?
  t1=$(date +%s.%N)
  (cd "$T" && timeout 120 env LD_PRELOAD="$LIBHAKMEM" "$@" >"$h.out" 2>"$h.err"); rh=$?
  t2=$(date +%s.%N)
  local times
  times=$(awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN{printf "system %.2fs, hakmem %.2fs", b-a, c-b}')
  if [ "$rb" -ne 0 ]; then
    bad "$name" "workload fails even without hakmem (exit $rb): $(head -c 300 "$b.err")"
    return 1
  fi
  if [ "$rh" -eq 124 ]; then
    bad "$name" "timed out (120 s) under hakmem"
    return 1
  fi
  if [ "$rh" -ne "$rb" ]; then
    bad "$name" "exit $rh under hakmem vs $rb without; stderr: $(head -c 400 "$h.err")"
    return 1
  fi
  if ! cmp -s "$b.out" "$h.out"; then
    bad "$name" "stdout differs under hakmem ($(wc -c <"$b.out") vs $(wc -c <"$h.out") bytes): $(diff "$b.out" "$h.out" | head -5 | tr '\n' '|')"
    return 1
  fi
  if ! cmp -s "$b.err" "$h.err"; then
    bad "$name" "stderr differs under hakmem: $(diff "$b.err" "$h.err" | head -5 | tr '\n' '|')"
    return 1
  fi
  if [ ! -s "$b.out" ]; then
    bad "$name" "workload printed nothing (test bug)"
    return 1
  fi
  ok "$name" "$times"
}

# ---------------------------------------------------------------- python3
cat >"$T/work.py" <<'EOF'
import gc, hashlib, json, random, threading
random.seed(12345)
d = {}
for i in range(200000):
    k = "k%07d-%s" % (i, "x" * (i % 37))
    d[k] = [i, str(i * 7), {"v": i % 1000, "s": k[::-1]}]
keys = sorted(d, key=lambda s: (len(s), s[::-1]))
sub = {k: d[k] for k in keys[:60000]}
s = json.dumps(sub, sort_keys=True)
back = json.loads(s)
assert back == json.loads(json.dumps(back))
nums = [random.random() for _ in range(200000)]
nums.sort()
words = " ".join(keys[::3]).split(" ")
for k in keys[::2]:
    del d[k]
for i in range(100000):
    d["n%d" % i] = bytearray(i % 700)
gc.collect()
results = [None] * 4
def worker(t):
    acc = {}
    for i in range(60000):
        acc[(t, i % 5000)] = "%d:%d" % (t, i) * (1 + i % 5)
    results[t] = sum(len(v) for v in acc.values())
ths = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for t in ths: t.start()
for t in ths: t.join()
h = hashlib.sha256()
for k in sorted(d)[::5]:
    h.update(k.encode())
h.update(s.encode())
print(len(d), len(back), len(words), "%.6f" % sum(nums), results, h.hexdigest())
EOF
if need python3 "$PY"; then
  same python3_dict_json_sort "$PY" "$T/work.py"
fi

# ------------------------------------------- python3's own regression tests
# A slice of CPython's test suite (Debian's libpython3.11-testsuite), every
# object from malloc (PYTHONMALLOC=malloc), in regrtest's worker processes:
# containers, str and bytes, pickle, gc and weakrefs, threads (their exits
# and thread-locals) and queues, mmap, ctypes, fork, wait4 and subprocess. A
# failure is hakmem's only if the same files pass without it. (The whole suite, 448 files of pyenv's 3.11.7 on
# the development machine, failed the same 5 with and without hakmem:
# environment checks; docs/RELIABILITY.md.)
REGRTESTS="test_dict test_list test_set test_tuple test_bytes test_unicode test_re test_json
  test_pickle test_marshal test_copy test_gc test_weakref test_thread test_threading
  test_threading_local test_queue test_mmap
  test_array test_memoryview test_collections test_deque test_heapq test_sort test_itertools
  test_functools test_struct test_zlib test_hashlib test_decimal test_ctypes test_ast
  test_compile test_fork1 test_wait4 test_os test_subprocess"
# regrtest NAME [ENV...]: runs the slice with `env ENV...` (-W: a failed
# file's output is printed); the exit code.
regrtest() {
  local name=$1; shift
  (cd "$T" && timeout 600 env "$@" PYTHONMALLOC=malloc "$PY" -m test -j2 -W $REGRTESTS \
    >"$T/$name.out" 2>&1)
}
# regrtest_fault NAME: the first failed test case's report (else the first
# failure's), on one line; the whole output is kept in $KEEP/NAME.out.
regrtest_fault() {
  mkdir -p "$KEEP" && cp "$T/$1.out" "$KEEP/$1.out"
  { grep -m1 -A20 -E '^(FAIL|ERROR): test' "$T/$1.out" ||
    grep -m1 -A14 -E '^test test_[a-z0-9_]+ (failed|crashed)' "$T/$1.out"; } | tr '\n' '|'
  echo "(all of it: $KEEP/$1.out)"
}
# regrtest itself comes with python3 (libpython3.11-stdlib); the files of the
# slice come with the test suite.
PYTESTS=/usr/lib/python3.11/test
missing_tests=()
for t in $REGRTESTS; do [ -e "$PYTESTS/$t.py" ] || [ -d "$PYTESTS/$t" ] || missing_tests+=("$t"); done
if need python3 "$PY"; then
  if [ "${#missing_tests[@]}" -gt 0 ]; then
    bad python3_regrtest_slice "CPython's test suite is missing (apt-get install libpython3.11-testsuite): ${#missing_tests[@]} of the slice's $(echo $REGRTESTS | wc -w) files are not in $PYTESTS, ${missing_tests[0]} first"
  elif regrtest regrtest.hak LD_PRELOAD="$LIBHAKMEM"; then
    ok python3_regrtest_slice "$(grep -m1 -E '^All [0-9]+ tests OK' "$T/regrtest.hak.out")"
  elif regrtest regrtest.base; then
    bad python3_regrtest_slice "fails under hakmem only: $(regrtest_fault regrtest.hak)"
  else
    bad python3_regrtest_slice "fails without hakmem too: $(regrtest_fault regrtest.base)"
  fi
fi

# ---------------------------------------------------------------- perl
cat >"$T/work.pl" <<'EOF'
use strict; use warnings; use Digest::MD5 qw(md5_hex);
my %h;
for my $i (0 .. 199999) { $h{"key$i" . ("y" x ($i % 23))} = [$i, "v" . ($i * 3), { n => $i % 97 }]; }
my @k = sort keys %h;
my $sum = 0; $sum += $h{$_}[0] for @k;
delete @h{ @k[ grep { $_ % 2 } 0 .. $#k ] };
my %inv; push @{ $inv{ $h{$_}[2]{n} } }, $_ for keys %h;
my $s = join(",", map { "$_=" . $h{$_}[1] } sort keys %h);
my @parts = split /,/, $s; my $re = join("", map { chr(65 + $_ % 26) x ($_ % 50) } 0 .. 20000);
(my $t = $re) =~ s/(A+)/lc($1)/ge;
print scalar(keys %h), " $sum ", scalar(@parts), " ", scalar(keys %inv), " ", md5_hex($s), " ", md5_hex($t), "\n";
EOF
if need perl perl; then
  same perl_hash_sort_regex perl "$T/work.pl"
fi

# ---------------------------------------------------------------- sort
if need sort sort awk; then
  awk 'BEGIN { srand(7); for (i = 0; i < 200000; i++)
         printf "%08d %s %d\n", int(rand() * 100000000), substr("abcdefghijklmnopqrstuvwxyz", i % 26 + 1, 1 + i % 9), i }' \
    >"$T/lines.txt"
  same sort_200k_lines sort "$T/lines.txt"
  same sort_200k_lines_parallel_tempfiles sort --parallel=2 -S 1M -T "$T" -k2,2 -k1,1n "$T/lines.txt"
fi

# ---------------------------------------------------------------- gcc / g++
cat >"$T/prog.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
int main(void) {
  enum { N = 50000 };
  char **v = malloc(N * sizeof *v);
  unsigned long h = 5381;
  for (int i = 0; i < N; i++) { v[i] = malloc(24); snprintf(v[i], 24, "s%d", (i * 7919) % N); }
  qsort(v, N, sizeof *v, cmp);
  for (int i = 0; i < N; i++) { for (char *c = v[i]; *c; c++) h = h * 33 + (unsigned char)*c; free(v[i]); }
  free(v);
  printf("%s %lu\n", "prog ok", h);
  return 0;
}
EOF
cat >"$T/prog.cc" <<'EOF'
#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
int main() {
  std::map<std::string, std::vector<int>> m;
  for (int i = 0; i < 100000; i++) m["k" + std::to_string(i % 3001)].push_back(i);
  std::ostringstream os;
  long s = 0;
  for (auto &kv : m) { s += kv.second.back(); std::sort(kv.second.rbegin(), kv.second.rend()); }
  os << m.size() << " " << s << " " << m.begin()->second.front();
  std::cout << os.str() << std::endl;
}
EOF
# The compilers run under each allocator; the built programs then run plainly.
cat >"$T/build_c.sh" <<'EOF'
set -e
out=$1
gcc -O2 -Wall -o "$out" prog.c
./"$out"
EOF
cat >"$T/build_cc.sh" <<'EOF'
set -e
out=$1
g++ -O2 -Wall -o "$out" prog.cc
./"$out"
EOF
if need gcc_compiles_and_runs gcc; then
  if same gcc_compiles_and_runs bash "$T/build_c.sh" prog_c_bin; then
    if grep -q '^prog ok ' "$T/gcc_compiles_and_runs.hak.out"; then ok gcc_compiled_program_output_correct
    else bad gcc_compiled_program_output_correct "unexpected output: $(head -c 200 "$T/gcc_compiles_and_runs.hak.out")"; fi
  fi
fi
if need gxx_compiles_and_runs g++; then
  same gxx_compiles_and_runs bash "$T/build_cc.sh" prog_cc_bin
fi

# ---------------------------------------------------------------- node
# V8 and libuv: four worker threads build and drop strings and Buffers
# (Buffer memory is malloc's), then the main thread a 200,000-key object
# through JSON and 2,000 Buffers of 1-64 KiB.
cat >"$T/work.js" <<'EOF'
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
const crypto = require('crypto');
if (isMainThread) {
  const results = [];
  for (let t = 0; t < 4; t++) {
    const w = new Worker(__filename, { workerData: t });
    w.on('message', (m) => {
      results[t] = m;
      if (results.filter((r) => r !== undefined).length < 4) return;
      const o = {};
      for (let k = 0; k < 200000; k++) o['k' + k] = [k, String(k * 7)];
      const back = JSON.parse(JSON.stringify(o));
      const h = crypto.createHash('sha256');
      for (let k = 0; k < 2000; k++) h.update(Buffer.alloc(1024 * (k % 64 + 1), k & 255));
      console.log(results.join(' '), Object.keys(back).length, back.k199999[1], h.digest('hex'));
    });
  }
} else {
  const t = workerData, keep = [], h = crypto.createHash('sha256');
  for (let i = 0; i < 300000; i++) {
    keep.push('x'.repeat(i % 100) + i);
    if (keep.length > 1000) keep.shift();
  }
  for (let i = 0; i < 5000; i++) {
    const b = Buffer.allocUnsafe(((i * 13 + t) % 70000) + 1);
    b.fill(i & 255);
    h.update(b);
  }
  parentPort.postMessage(keep.length + ':' + h.digest('hex').slice(0, 16));
}
EOF
if need node_workers_json_buffers node; then
  same node_workers_json_buffers node "$T/work.js"
fi

# ---------------------------------------------------------------- java
# The JVM's C heap: javac (a Java program) compiles, then 8 pooled threads
# each start and join a short-lived thread per task, and compress and
# inflate through the JDK's native zlib (Deflater and Inflater malloc their
# streams), while the heap grows a map of strings.
cat >"$T/Work.java" <<'EOF'
import java.util.*;
import java.util.concurrent.*;
import java.util.zip.*;
public class Work {
  public static void main(String[] args) throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(8);
    List<Future<Long>> fs = new ArrayList<>();
    for (int t = 0; t < 64; t++) {
      final int task = t;
      fs.add(pool.submit(() -> {
        long sum = 0;
        Deflater d = new Deflater();
        Inflater in = new Inflater();
        byte[] buf = new byte[1 << 16], out = new byte[1 << 17], back = new byte[1 << 16];
        for (int i = 0; i < 100; i++) {
          for (int j = 0; j < buf.length; j++) buf[j] = (byte) ((j * (i + task)) >> 7);
          d.reset(); d.setInput(buf); d.finish();
          int n = d.deflate(out);
          in.reset(); in.setInput(out, 0, n);
          int m = in.inflate(back);
          sum += n + m + (Arrays.equals(buf, back) ? 1 : 0);
        }
        d.end(); in.end();
        Thread th = new Thread(() -> {});
        th.start(); th.join();
        return sum;
      }));
    }
    Map<String, String> map = new HashMap<>();
    for (int i = 0; i < 200000; i++) map.put("k" + i, Integer.toString(i * 31));
    long total = 0;
    for (Future<Long> f : fs) total += f.get();
    pool.shutdown();
    System.out.println(total + " " + map.size() + " " + map.get("k199999"));
  }
}
EOF
cat >"$T/build_java.sh" <<'EOF'
set -e
out=$1
mkdir -p "$out"
javac -d "$out" Work.java
java -cp "$out" Work
EOF
if need java_compiles_and_runs javac java; then
  same java_compiles_and_runs bash "$T/build_java.sh" java_classes
fi

# ---------------------------------------------------------------- sqlite3
{
  echo "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER, pad TEXT);"
  echo "BEGIN;"
  awk 'BEGIN { for (i = 1; i <= 50000; i++)
         printf "INSERT INTO t(k, v, pad) VALUES (%ck%d%c, %d, %c%s%c);\n", 39, (i * 7919) % 1000, 39, (i * 13) % 1001, 39, substr("ppppppppppppppppppppppppppppppppppppppppppppppppp", 1, i % 50), 39 }'
  echo "COMMIT;"
  cat <<'EOF'
CREATE INDEX t_k ON t(k);
CREATE INDEX t_v ON t(v, k);
SELECT k, count(*), sum(v), avg(length(pad)) FROM t GROUP BY k ORDER BY k LIMIT 15;
SELECT count(*), min(id), max(id) FROM t WHERE v BETWEEN 100 AND 200;
SELECT v % 10 AS d, count(DISTINCT k), group_concat(DISTINCT length(pad)) FROM t GROUP BY d ORDER BY d;
UPDATE t SET pad = pad || pad WHERE v % 3 = 0;
DELETE FROM t WHERE v % 5 = 0;
SELECT count(*), sum(length(pad)) FROM t;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000)
  SELECT count(*), sum(x) FROM c JOIN t ON t.id = c.x;
SELECT a.k, count(*) FROM t a JOIN t b ON a.k = b.k AND a.id < b.id WHERE a.v < 3 GROUP BY a.k ORDER BY 2 DESC, 1 LIMIT 5;
VACUUM;
PRAGMA integrity_check;
EOF
} >"$T/work.sql"
cat >"$T/run_sqlite.sh" <<'EOF'
set -e
db=$1
rm -f "$db"
sqlite3 "$db" <work.sql
sqlite3 "$db" "SELECT count(*) FROM t;"
EOF
if need sqlite3_workload sqlite3; then
  same sqlite3_workload bash "$T/run_sqlite.sh" db1.sqlite
fi

# ---------------------------------------------------------------- redis
# A server with two I/O threads on a unix socket: a Lua script builds
# strings, lists, hashes, sorted sets and a 5 MB string, deletes and grows
# some; the dataset's digest before and after a save-and-reload, then
# redis-benchmark's 20 clients (output dropped) and the script again.
# Redis counts its memory with malloc_usable_size at every malloc and free.
cat >"$T/build.lua" <<'EOF'
for i = 1, 60000 do
  redis.call('SET', 'k' .. i, string.rep('v', i % 300))
  if i % 3 == 0 then redis.call('RPUSH', 'l' .. (i % 100), i, string.rep('x', i % 50)) end
  if i % 5 == 0 then redis.call('HSET', 'h' .. (i % 50), 'f' .. i, i * 7) end
  if i % 7 == 0 then redis.call('ZADD', 'z' .. (i % 20), i % 1000, 'm' .. i) end
  if i % 11 == 0 then redis.call('SADD', 's' .. (i % 30), 'e' .. (i % 5000)) end
end
for i = 1, 60000, 4 do redis.call('DEL', 'k' .. i) end
for i = 2, 60000, 8 do redis.call('APPEND', 'k' .. i, string.rep('a', 500)) end
for i = 0, 99, 2 do redis.call('LTRIM', 'l' .. i, 10, -10) end
redis.call('SET', 'big', string.rep('B', 3000000))
redis.call('SETRANGE', 'big', 5000000, 'end')
return {redis.call('DBSIZE'), redis.call('STRLEN', 'k2'), redis.call('LLEN', 'l1'),
        redis.call('HLEN', 'h5'), redis.call('ZCARD', 'z4'), redis.call('SCARD', 's5'),
        redis.call('STRLEN', 'big')}
EOF
cat >"$T/run_redis.sh" <<'EOF'
set -e
sock=$PWD/redis.sock
rm -f "$sock" dump.rdb
redis-server --port 0 --unixsocket "$sock" --dir "$PWD" --dbfilename dump.rdb --save "" \
  --appendonly no --enable-debug-command yes --io-threads 2 --io-threads-do-reads yes \
  --logfile "$PWD/redis.log" &
srv=$!
cli() { redis-cli -s "$sock" "$@"; }
for _ in $(seq 100); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done
cli eval "$(cat build.lua)" 0
cli debug digest
cli zrange z4 0 4 withscores
cli debug reload
cli debug digest
redis-benchmark -s "$sock" -q -n 20000 -c 20 -r 10000 -d 100 \
  -t set,get,lpush,lpop,sadd,hset,zadd,mset >/dev/null
cli flushall
cli eval "$(cat build.lua)" 0
cli debug digest
cli shutdown nosave
wait $srv
EOF
if need redis_workload redis-server redis-cli redis-benchmark; then
  same redis_workload bash "$T/run_redis.sh" work
  # The server's allocations land in hakmem, not in the jemalloc it links:
  # a 64 MiB string, then the statistics it prints at exit.
  (cd "$T" && rm -f s.sock &&
    { LD_PRELOAD="$LIBHAKMEM" HAKMEM_STATS=1 timeout 60 redis-server --port 0 --unixsocket s.sock \
        --save "" --logfile s.log 2>redis.stats & } &&
    for _ in $(seq 100); do redis-cli -s s.sock ping >/dev/null 2>&1 && break; sleep 0.1; done &&
    redis-cli -s s.sock setrange huge 67108864 x >/dev/null &&
    redis-cli -s s.sock shutdown nosave >/dev/null; wait)
  peak=$(sed -n 's/.*OS mapped now.*(peak \([0-9]*\) KiB).*/\1/p' "$T/redis.stats" 2>/dev/null | tail -1)
  if [ "${peak:-0}" -ge $((64 * 1024)) ]; then
    ok redis_allocations_served_by_hakmem "peak mapped ${peak} KiB"
  else
    bad redis_allocations_served_by_hakmem "hakmem's peak mapped '${peak:-none}' KiB < 64 MiB after a 64 MiB string"
  fi
fi

# ---------------------------------------------------------------- servers
# What the servers' workloads below share (each sources it from $T).
cat >"$T/servers.sh" <<'EOF'
# maps_preload PID: the line that says the server maps the preloaded library
# (printed as well where nothing is preloaded, so the outputs compare).
maps_preload() {
  if [ -z "${LD_PRELOAD:-}" ] || grep -qF "$(readlink -f "$LD_PRELOAD")" "/proc/$1/maps"; then
    echo "the server maps the preloaded library"
  fi
}
# kill_at_exit PID: a failed step's server does not outlive the workload.
kill_at_exit() { trap "kill -9 $1 2>/dev/null || true" EXIT; }
EOF

# ---------------------------------------------------------------- memcached
# A server of four worker threads on a unix socket (its slab pages, connections
# and buffers are malloc's): four Python clients, on connections each reopens
# every 400 requests, store, read back, append to, count and delete values of
# 1 B to 1.5 MB under keys of their own, then read all of theirs back; the
# digests of the replies, the server's item counts and its exit must match.
cat >"$T/mc_client.py" <<'EOF'
# Four clients, each on its own connections (reopened every 400 requests), store,
# read back, append to, count and delete values of 1 B to 1.5 MB under keys of
# their own; then each reads its keys back. Prints digests of what came back.
import hashlib, random, socket, sys, threading, time

sock_path = sys.argv[1]

def connect():
    for _ in range(100):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            return s, s.makefile("rb")
        except OSError:
            time.sleep(0.1)
    raise SystemExit("memcached did not answer")

def call(conn, line, data=None):
    s, f = conn
    s.sendall(line + b"\r\n" + (data + b"\r\n" if data is not None else b""))
    return f.readline()

def get(conn, keys):
    s, f = conn
    s.sendall(b"get " + b" ".join(keys) + b"\r\n")
    out = {}
    while True:
        head = f.readline().split()
        if head[0] == b"END":
            return out
        n = int(head[3])
        out[head[1]] = f.read(n + 2)[:n]

def size(rng):
    r = rng.random()
    if r < 0.85: return rng.randint(1, 1000)
    if r < 0.98: return rng.randint(1000, 50000)
    return rng.randint(50000, 1500000)

results = {}

def client(i):
    rng, h, conn = random.Random(i), hashlib.md5(), connect()
    mine = {}
    for j in range(2500):
        if j % 400 == 399:
            conn[0].close()
            conn = connect()
        key = b"c%dk%d" % (i, rng.randrange(400))
        op = rng.random()
        if op < 0.55:
            val = rng.randbytes(size(rng))
            h.update(call(conn, b"set %s 0 0 %d" % (key, len(val)), val))
            mine[key] = val
        elif op < 0.8:
            got = get(conn, [key])
            h.update(b"hit" if got.get(key) == mine.get(key) else b"miss %s" % key)
        elif op < 0.88:
            add = rng.randbytes(rng.randint(1, 3000))
            h.update(call(conn, b"append %s 0 0 %d" % (key, len(add)), add))
            if key in mine: mine[key] += add
        elif op < 0.95:
            h.update(call(conn, b"delete %s" % key))
            mine.pop(key, None)
        else:
            ckey = b"c%dcount" % i
            r = call(conn, b"incr %s %d" % (ckey, j))
            if r.startswith(b"NOT_FOUND"): r = call(conn, b"set %s 0 0 1" % ckey, b"0")
            h.update(r)
    got = get(conn, sorted(mine))
    results[i] = "%s %d keys, %s" % (h.hexdigest(), len(mine), "all match" if got == mine else "differ")
    conn[0].close()

threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
for i in sorted(results): print("client", i, results[i])
conn = connect()
conn[0].sendall(b"stats\r\n")
for line in iter(conn[1].readline, b"END\r\n"):
    k = line.split()[1]
    if k in (b"curr_items", b"total_items", b"evictions", b"cmd_set"):
        print(line.decode().strip())
EOF
cat >"$T/run_memcached.sh" <<'EOF'
set -e
. ./servers.sh
sock=$PWD/memcached.sock
rm -f "$sock"
memcached -s "$sock" -t 4 -m 256 -I 2m -A -u "$(id -un)" & # -u: as root only
srv=$!
kill_at_exit $srv
python3 mc_client.py "$sock"
maps_preload $srv
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"shutdown\r\n"); s.recv(1)' "$sock"
rc=0; wait $srv || rc=$?
echo "server exit $rc"
EOF
if need memcached_workload memcached; then
  same memcached_workload bash "$T/run_memcached.sh"
fi

# ---------------------------------------------------------------- mariadb
# MariaDB 10.11, a server of a thread per connection: a database made by
# mariadb-install-db, 100,000 InnoDB rows of JSON and 200,000 MyISAM rows
# (joined on an index, updated, deleted, checksummed), a 300,000-value
# GROUP_CONCAT, then mariadb-slap's 8 clients and the checksums again; the
# results, the server's mapping of the library, its exit status and the
# signals and failed assertions in its log must match.
cat >"$T/run_mariadb.sh" <<'EOF'
set -e
. ./servers.sh
d=$PWD/my u=$(id -un)
rm -rf "$d" && mkdir "$d"
mariadb-install-db --no-defaults --datadir="$d/data" --user="$u" \
  --auth-root-authentication-method=normal >"$d/install.log" 2>&1
"$1" --no-defaults --datadir="$d/data" --socket="$d/sock" --skip-networking \
  --pid-file="$d/pid" --log-error="$d/err.log" --user="$u" --innodb-buffer-pool-size=64M \
  --max-connections=50 2>>"$d/stderr.log" &
srv=$!
kill_at_exit $srv
sql() { mariadb --no-defaults -S "$d/sock" -u root -N -B "$@"; }
for _ in $(seq 300); do sql -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
maps_preload $srv
sql <<'SQL'
CREATE DATABASE w; USE w;
CREATE TABLE j (id INT PRIMARY KEY, k VARCHAR(40), doc JSON, KEY (k)) ENGINE=InnoDB;
INSERT INTO j SELECT seq, md5(seq), JSON_OBJECT('n', seq, 's', REPEAT('ab', seq % 60),
  'a', JSON_ARRAY(seq % 7, seq % 11)) FROM seq_1_to_100000;
CREATE TABLE m (id INT PRIMARY KEY, k VARCHAR(40), pad TEXT, KEY (k)) ENGINE=MyISAM;
INSERT INTO m SELECT seq, md5(seq * 3), REPEAT('y', seq % 500) FROM seq_1_to_200000;
SELECT COUNT(*), SUM(JSON_VALUE(doc, '$.n')), MD5(GROUP_CONCAT(JSON_EXTRACT(doc, '$.a') ORDER BY id))
  FROM j WHERE k > '8';
SELECT COUNT(*), SUM(LENGTH(m.pad)) FROM j JOIN m ON j.k = m.k;
UPDATE j SET doc = JSON_SET(doc, '$.s', REPEAT('z', id % 300)) WHERE id % 3 = 0;
DELETE FROM m WHERE id % 4 = 0;
UPDATE m SET pad = CONCAT(pad, REPEAT('q', id % 700)) WHERE id % 5 = 0;
CHECKSUM TABLE j, m;
SET SESSION group_concat_max_len = 100000000;
SELECT LENGTH(GROUP_CONCAT(md5(seq) ORDER BY md5(seq))), MD5(GROUP_CONCAT(md5(seq) ORDER BY md5(seq)))
  FROM seq_1_to_300000;
SELECT k, COUNT(*) c FROM (SELECT LEFT(k, 2) k FROM m) t GROUP BY k ORDER BY c DESC, k LIMIT 3;
SQL
mariadb-slap --no-defaults -S "$d/sock" -u root --concurrency=8 --iterations=2 \
  --number-of-queries=6000 --auto-generate-sql --auto-generate-sql-load-type=mixed \
  --auto-generate-sql-add-autoincrement >/dev/null
sql -e 'CHECKSUM TABLE w.j, w.m'
sql -e 'SHUTDOWN'
rc=0; wait $srv || rc=$?
echo "server exit $rc, signals in the log: $(grep -c 'got signal\|Assertion' "$d/err.log" || true)"
EOF
MARIADBD=$(command -v mariadbd || echo /usr/sbin/mariadbd) # sbin: not on a user's PATH
if need mariadb_workload "$MARIADBD" mariadb mariadb-install-db mariadb-slap; then
  same mariadb_workload bash "$T/run_mariadb.sh" "$MARIADBD"
fi

# ---------------------------------------------------------------- sshd
# OpenSSH's sshd on a port of the loopback: its pre-authentication child
# runs under a seccomp filter that kills it at a system call outside its
# list, so a library that makes one there fails the login. A command over
# ssh, a 20 MB file copied in by scp's own protocol (a shell's scp on the
# server) and back by SFTP (served inside sshd's session child); the
# outputs, the digests and the server's exit must match.
cat >"$T/run_sshd.sh" <<'EOF'
set -e
. ./servers.sh
d=$PWD/ssh sshd=$1
rm -rf "$d" && mkdir -m 700 "$d"
ssh-keygen -q -t ed25519 -N '' -f "$d/host"
ssh-keygen -q -t ed25519 -N '' -f "$d/user"
cp "$d/user.pub" "$d/authorized_keys"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$d/config" <<CFG
Port $port
ListenAddress 127.0.0.1
HostKey $d/host
PidFile $d/pid
AuthorizedKeysFile $d/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
Subsystem sftp internal-sftp
CFG
"$sshd" -D -e -f "$d/config" 2>"$d/log" &
srv=$!
kill_at_exit $srv
o=(-F none -i "$d/user" -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no
   -o UserKnownHostsFile="$d/known_hosts" -o LogLevel=ERROR)
for _ in $(seq 100); do
  ssh "${o[@]}" -p "$port" "$(id -un)@127.0.0.1" true 2>/dev/null && break; sleep 0.1
done
maps_preload $srv
ssh "${o[@]}" -p "$port" "$(id -un)@127.0.0.1" 'echo logged in; seq 200000 | sort -r | md5sum'
seq 3000000 >"$d/blob"
scp -q -O "${o[@]}" -P "$port" "$d/blob" "$(id -un)@127.0.0.1:$d/blob.copy"
scp -q "${o[@]}" -P "$port" "$(id -un)@127.0.0.1:$d/blob.copy" "$d/blob.back"
md5sum <"$d/blob.back"
kill $srv; rc=0; wait $srv || rc=$?
echo "server exit $rc, children killed: $(grep -c 'killed by signal\|signal 31\|Bad system call' "$d/log" || true)"
EOF
SSHD=$(command -v sshd || echo /usr/sbin/sshd) # sbin: not on a user's PATH
if need sshd_workload "$SSHD" ssh scp ssh-keygen; then
  [ "$(id -u)" = 0 ] && mkdir -p /run/sshd # its privilege separation directory
  same sshd_workload bash "$T/run_sshd.sh" "$SSHD"
fi

# ---------------------------------------------------------------- postgres
# A PostgreSQL cluster made by initdb (its bootstrap backend), a server
# whose backends are forks of the postmaster, pgbench's loads (4 clients),
# sorts, hash joins and JSON over a million rows, a join run by two
# parallel workers (forked, in dynamic shared memory) and compiled by
# LLVM's JIT (a C++ library), pg_dump; the results, the dump's digest and
# the server log's crashes must match. The server refuses root: as root the
# workload runs as the postgres user.
cat >"$T/run_pg.sh" <<'EOF'
set -e
. ./servers.sh
B=$1 d=$PWD/pg # the server's bin directory; pg, a directory its user owns
rm -rf "$d/data"
"$B/initdb" -D "$d/data" -A trust -E UTF8 --locale=C >"$d/initdb.log"
"$B/pg_ctl" -D "$d/data" -l "$d/log" -w start -o "-k $d -c listen_addresses=" >/dev/null
trap '"$B/pg_ctl" -D "$d/data" -w stop -m immediate >/dev/null 2>&1 || true' EXIT # a failed step's too
export PGHOST=$d PGUSER=$(id -un) PGDATABASE=postgres
pm=$(head -1 "$d/data/postmaster.pid")
maps_preload "$pm"
"$B/pgbench" -q -i -s 2 >/dev/null 2>&1
"$B/pgbench" -n -c 4 -j 2 -t 300 >/dev/null
"$B/pgbench" -n -S -c 4 -j 2 -t 2000 >/dev/null
"$B/psql" -X -A -t -q -v ON_ERROR_STOP=1 <<'SQL'
SET work_mem = '256MB'; -- in this session, with no worker: a container's /dev/shm is small
SET max_parallel_workers_per_gather = 0;
SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history),
       (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT sum(delta) FROM pgbench_history),
       (SELECT count(*) FROM pgbench_history);
SELECT md5(string_agg(x::text, ',' ORDER BY x DESC)) FROM generate_series(1, 1000000) x;
SELECT md5(jsonb_agg(jsonb_build_object('k', x, 'v', repeat('ab', x % 50)) ORDER BY x)::text)
  FROM generate_series(1, 100000) x;
CREATE TABLE t AS SELECT x, md5(x::text) h, repeat('y', x % 3000) pad FROM generate_series(1, 100000) x;
CREATE INDEX ON t (h);
ANALYZE t;
SELECT count(*), md5(string_agg(h, '' ORDER BY h)) FROM t WHERE h > '8';
SELECT count(*), sum(length(a.pad)) FROM t a JOIN t b ON a.h = b.h WHERE a.x % 3 = 0;
SELECT md5(array_agg(md5(x::text) ORDER BY md5(x::text))::text) FROM generate_series(1, 300000) x;
SQL
# the join again, planned for two parallel workers and compiled by the JIT
"$B/psql" -X -A -t -q -v ON_ERROR_STOP=1 -c "SET parallel_setup_cost = 0" \
  -c "SET parallel_tuple_cost = 0" -c "SET jit_above_cost = 0" \
  -c "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY OFF)
      SELECT count(*) FROM t a JOIN t b ON a.h = b.h WHERE a.x % 3 = 0" |
  grep -o "Workers Launched: [0-9]*\|JIT:\|Functions: [0-9]*"
# the dump but for its comments and its \restrict line's random key
"$B/pg_dump" -t t | grep -v '^--\|^\\restrict\|^\\unrestrict' | md5sum
"$B/pg_ctl" -D "$d/data" -w stop -m fast >/dev/null
echo "crashes in the log: $(grep -c 'terminated by signal\|PANIC' "$d/log" || true)"
EOF
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/pgbench" ]; then
  bad postgres_workload "PostgreSQL's server is not installed (apt-get install postgresql)"
else
  mkdir "$T/pg"
  as_pg=()
  if [ "$(id -u)" = 0 ]; then # the user Debian's package makes; $T opens to it
    as_pg=(runuser -u postgres --)
    chown postgres "$T/pg" && chmod 711 "$T"
  fi
  same postgres_workload "${as_pg[@]}" bash "$T/run_pg.sh" "$PGBIN"
fi

# ---------------------------------------------------------------- hakmem really served
if [ -x "$PY" ]; then
  LD_PRELOAD="$LIBHAKMEM" timeout 60 "$PY" -c "print(open('/proc/self/maps').read())" \
    >"$T/maps.txt" 2>"$T/maps.err"
  if grep -q libhakmem "$T/maps.txt"; then
    ok preload_maps_libhakmem_into_python3
  else
    bad preload_maps_libhakmem_into_python3 "libhakmem not in python3's /proc/self/maps under LD_PRELOAD"
  fi
  # Python's own allocations must land in hakmem: a 96 MiB bytearray
  # (PyMem_RawCalloc -> calloc) must show up in hakmem's `mapped` statistic.
  r=$(LD_PRELOAD="$LIBHAKMEM" timeout 60 "$PY" - "$LIBHAKMEM" <<'EOF' 2>"$T/served.err"
import ctypes, sys
h = ctypes.CDLL(sys.argv[1])
st = (ctypes.c_size_t * 14)()
h.hak_stats_get(st)
before = st[0]
blob = bytearray(96 << 20)
blob[-1] = 1
h.hak_stats_get(st)
after = st[0]
print("served" if after - before >= (64 << 20) else "not-served mapped %d -> %d" % (before, after))
EOF
)
  if [ "$r" = "served" ]; then ok python3_allocations_served_by_hakmem
  else bad python3_allocations_served_by_hakmem "$r $(tail -3 "$T/served.err" | tr '\n' '|')"; fi
  err=$(LD_PRELOAD="$LIBHAKMEM" HAKMEM_STATS=1 timeout 60 "$PY" -c 'pass' 2>&1 >/dev/null)
  if printf '%s\n' "$err" | grep -q '^hakmem statistics'; then
    ok hakmem_stats_env_prints_report
  else
    bad hakmem_stats_env_prints_report "HAKMEM_STATS=1 python3 -c pass: stderr has no 'hakmem statistics' line (got: $(printf '%s' "$err" | head -c 200))"
  fi
fi

finish
