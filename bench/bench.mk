# Benchmarks (included by the top Makefile; BUILD comes from there).
#   make bench-bins   build the workload programs into $(BUILD)/bench/
#   make bench        quick matrix: every workload, small args, 3 rounds (< 3 min)
#   make bench-full   reference runs, 5 rounds
#   make bench-instr  instructions per malloc/free under callgrind
#   make bench-floor  hakmem against the floor of its design (bench/floor/floor.c)
#   make bench-programs  real programs (python3, perl, sqlite3, g++, bash), timed whole
#   make bench-sizes  random_mixed and xmalloc one size band at a time
#   make bench-cxx    C++ containers (std::map, set, unordered_map, shared_ptr)
# Extra runner options: make bench BENCH_ARGS="--only hakmem,mimalloc"
# See docs/BENCHMARKS.md.

BENCH_BIN    := $(BUILD)/bench
BENCH_CFLAGS ?= -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -pthread -fno-builtin
BENCH_CXXFLAGS ?= -std=gnu++17 -O2 -g -Wall -Wextra -pthread
BENCH_SRCS   := $(sort $(wildcard bench/*.c))
BENCH_CXX_SRCS := $(sort $(wildcard bench/*.cc))
BENCH_PROGS  := $(patsubst bench/%.c,$(BENCH_BIN)/%,$(BENCH_SRCS)) \
                $(patsubst bench/%.cc,$(BENCH_BIN)/%,$(BENCH_CXX_SRCS))
BENCH_NOOP   := $(BENCH_BIN)/random_mixed.noop $(BENCH_BIN)/larson.noop
BENCH_ARGS   ?=
BENCH_PY     ?= python3

$(BENCH_BIN):
	mkdir -p $@
$(BENCH_BIN)/%.noop: bench/%.c $(wildcard bench/*.h) | $(BENCH_BIN)
	$(CC) $(BENCH_CFLAGS) -DNOOP_ALLOC -o $@ $< -lm
$(BENCH_BIN)/%: bench/%.c $(wildcard bench/*.h) | $(BENCH_BIN)
	$(CC) $(BENCH_CFLAGS) -o $@ $< -lm
$(BENCH_BIN)/%: bench/%.cc $(wildcard bench/*.h) | $(BENCH_BIN)
	$(CXX) $(BENCH_CXXFLAGS) -o $@ $<

bench-bins: $(BENCH_PROGS) $(BENCH_NOOP)

# The floor: the cheapest allocator of hakmem's kind (bench/floor/floor.c),
# a column beside hakmem and tcmalloc on the loops that only time the fast
# paths. Not an allocator to use: it never returns memory.
BENCH_FLOOR := $(BENCH_BIN)/libfloor.so
$(BENCH_FLOOR): bench/floor/floor.c | $(BENCH_BIN)
	$(CC) -std=gnu11 -O2 -fno-builtin -fPIC -shared -Wall -Wextra -o $@ $<

bench-floor: bench-bins $(BUILD)/libhakmem.so $(BENCH_FLOOR)
	$(BENCH_PY) bench/run --set full --rounds 7 --only hakmem,tcmalloc,mimalloc,floor \
	  --extra-col floor=$(CURDIR)/$(BENCH_FLOOR) --workloads random_mixed,mid_large_mt,larson $(BENCH_ARGS)

# The hardened build (make secure) is one more column, to show its cost.
BENCH_SECURE := --extra-col hakmem-secure=$(CURDIR)/$(BUILD)/secure/libhakmem.so

bench: bench-bins $(BUILD)/libhakmem.so $(BUILD)/secure/libhakmem.so
	$(BENCH_PY) bench/run --set quick --rounds 3 $(BENCH_SECURE) $(BENCH_ARGS)

bench-full: bench-bins $(BUILD)/libhakmem.so $(BUILD)/secure/libhakmem.so
	$(BENCH_PY) bench/run --set full --rounds 5 $(BENCH_SECURE) $(BENCH_ARGS)

bench-programs: bench-bins $(BUILD)/libhakmem.so
	$(BENCH_PY) bench/run --set programs --rounds 5 $(BENCH_ARGS)

bench-sizes: bench-bins $(BUILD)/libhakmem.so
	$(BENCH_PY) bench/run --set sizes --rounds 3 $(BENCH_ARGS)

bench-cxx: bench-bins $(BUILD)/libhakmem.so
	$(BENCH_PY) bench/run --set cxx --rounds 5 $(BENCH_ARGS)

bench-instr: bench-bins $(BUILD)/libhakmem.so
	$(BENCH_PY) bench/run --instr $(BENCH_ARGS)

.PHONY: bench bench-full bench-instr bench-bins bench-floor bench-programs bench-sizes bench-cxx
