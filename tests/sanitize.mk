# Sanitizer builds and checks (see docs/RELIABILITY.md). Included by the top
# Makefile with `-include tests/sanitize.mk`; until then:
#   make -f Makefile -f tests/sanitize.mk test-ubsan
#
#   make test-ubsan   UBSan library (with the malloc override) + every C suite
#                     (tests/test_*.c, tests/unit_*.c) rebuilt and run against it,
#                     plus the hak_* stress program on a no-override UBSan build
#   make test-tsan    clang TSan: 8-thread hak_* stress on a no-override build
#   make san-libs     only the libraries
#
# Libraries (all from the same sources, BASE_CFLAGS of the top Makefile):
#   $(BUILD)/ubsan/libhakmem.{so,a}       gcc, release-like -O1, UBSan, override
#   $(BUILD)/ubsan-debug/libhakmem.a      gcc, debug flags, UBSan, override (unit_*.c)
#   $(BUILD)/san-ubsan/libhakmem.a        gcc, debug flags, UBSan, NO override
#   $(BUILD)/san-tsan/libhakmem.a         clang, -O1, TSan, NO override
#   $(BUILD)/san-tsan-debug/libhakmem.a   clang, debug flags, TSan, NO override
#   $(BUILD)/san-rel/libhakmem.a          release flags, NO override (soak)
# A no-override archive holds every src/*.c except src/override.c: the hak_*
# API works and malloc stays glibc's, which is what TSan and libFuzzer need.

CLANG        ?= clang
SAN_SRCS     := $(filter-out src/override.c,$(SRCS))
UBSAN_FLAGS  := -fsanitize=undefined -fno-sanitize-recover=undefined
TSAN_FLAGS   := -fsanitize=thread
SAN_DEBUG    := -O1 -g -DHAK_DEBUG=1 -DHAK_STATS=1
SAN_TSAN_SECONDS ?= 3
SAN_STRESS_THREADS ?= 8

# $(1)=output dir, $(2)=compiler, $(3)=extra flags, $(4)=sources
define SAN_LIB
$(call FLAGS_FILE,$(1),$(2) $(BASE_CFLAGS) $(3))
$(1)/obj/%.o: src/%.c $(HDRS) $(1)/flags | $(1)/obj
	$(2) $(BASE_CFLAGS) $(3) -DHAK_BUILD_FLAGS="\"$(2) $(strip $(3))\"" -c $$< -o $$@
$(1)/obj:
	mkdir -p $$@
$(1)/libhakmem.a: $(patsubst src/%.c,$(1)/obj/%.o,$(4))
	rm -f $$@ && ar rcs $$@ $$^
endef
$(eval $(call SAN_LIB,$(BUILD)/ubsan,$(CC),-O1 -g -DNDEBUG $(UBSAN_FLAGS) $(CFLAGS),$(SRCS)))
$(eval $(call SAN_LIB,$(BUILD)/ubsan-debug,$(CC),$(SAN_DEBUG) $(UBSAN_FLAGS) $(CFLAGS),$(SRCS)))
$(eval $(call SAN_LIB,$(BUILD)/san-ubsan,$(CC),$(SAN_DEBUG) $(UBSAN_FLAGS) $(CFLAGS),$(SAN_SRCS)))
$(eval $(call SAN_LIB,$(BUILD)/san-tsan,$(CLANG),-O1 -g $(TSAN_FLAGS) $(CFLAGS),$(SAN_SRCS)))
$(eval $(call SAN_LIB,$(BUILD)/san-tsan-debug,$(CLANG),$(SAN_DEBUG) $(TSAN_FLAGS) $(CFLAGS),$(SAN_SRCS)))
$(eval $(call SAN_LIB,$(BUILD)/san-rel,$(CC),-O2 -DNDEBUG $(CFLAGS),$(SAN_SRCS)))

$(BUILD)/ubsan/libhakmem.so: $(patsubst src/%.c,$(BUILD)/ubsan/obj/%.o,$(SRCS))
	$(call link_so,$(UBSAN_FLAGS))

# ---- the C suites against the UBSan library ----
UBSAN_TEST_BIN := $(BUILD)/ubsan/tests
UBSAN_TEST_C    := $(patsubst tests/%.c,$(UBSAN_TEST_BIN)/%,$(wildcard tests/test_*.c))
UBSAN_TEST_UNIT := $(patsubst tests/%.c,$(UBSAN_TEST_BIN)/%,$(wildcard tests/unit_*.c))
# Suites to run (a subset can be chosen: make test-ubsan UBSAN_SUITES="test_api unit_core").
# test_misuse is left out: its children free invalid pointers on purpose, and
# an undetected invalid free is undefined behaviour UBSan may report first.
UBSAN_SUITES ?= $(filter-out test_misuse,$(notdir $(UBSAN_TEST_UNIT) $(UBSAN_TEST_C)))

$(UBSAN_TEST_BIN):
	mkdir -p $@
$(UBSAN_TEST_BIN)/test_%: tests/test_%.c tests/harness.h tests/blocks.h include/hakmem.h $(BUILD)/ubsan/libhakmem.so | $(UBSAN_TEST_BIN)
	$(CC) $(TEST_CFLAGS) $(UBSAN_FLAGS) -o $@ $< -L$(BUILD)/ubsan -Wl,-rpath,$(CURDIR)/$(BUILD)/ubsan -lhakmem -lm
$(UBSAN_TEST_BIN)/unit_%: tests/unit_%.c tests/harness.h $(HDRS) $(BUILD)/ubsan-debug/libhakmem.a | $(UBSAN_TEST_BIN)
	$(CC) $(TEST_CFLAGS) $(UBSAN_FLAGS) -Isrc -DHAK_DEBUG=1 -DHAK_STATS=1 -o $@ $< $(BUILD)/ubsan-debug/libhakmem.a -lm

# ---- the hak_* stress program (tests/san_stress.c) ----
SAN_STRESS_DEPS := tests/san_stress.c include/hakmem.h
$(BUILD)/san-ubsan/san_stress: $(SAN_STRESS_DEPS) $(BUILD)/san-ubsan/libhakmem.a
	$(CC) -std=gnu11 -O1 -g -Wall -Wextra -pthread -Iinclude $(UBSAN_FLAGS) -o $@ $< $(BUILD)/san-ubsan/libhakmem.a
$(BUILD)/san-tsan/san_stress: $(SAN_STRESS_DEPS) $(BUILD)/san-tsan/libhakmem.a
	$(CLANG) -std=gnu11 -O1 -g -Wall -Wextra -pthread -Iinclude $(TSAN_FLAGS) -o $@ $< $(BUILD)/san-tsan/libhakmem.a
$(BUILD)/san-tsan-debug/san_stress: $(SAN_STRESS_DEPS) $(BUILD)/san-tsan-debug/libhakmem.a
	$(CLANG) -std=gnu11 -O1 -g -Wall -Wextra -pthread -Iinclude $(TSAN_FLAGS) -o $@ $< $(BUILD)/san-tsan-debug/libhakmem.a
$(BUILD)/san-rel/san_stress: $(SAN_STRESS_DEPS) $(BUILD)/san-rel/libhakmem.a
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -pthread -Iinclude -o $@ $< $(BUILD)/san-rel/libhakmem.a

san-libs: $(BUILD)/ubsan/libhakmem.so $(BUILD)/ubsan-debug/libhakmem.a \
  $(BUILD)/san-ubsan/libhakmem.a $(BUILD)/san-tsan/libhakmem.a $(BUILD)/san-rel/libhakmem.a
ubsan-bins: $(BUILD)/ubsan/libhakmem.so $(UBSAN_TEST_UNIT) $(UBSAN_TEST_C) \
  $(BUILD)/san-ubsan/san_stress
tsan-bins: $(BUILD)/san-tsan/san_stress $(BUILD)/san-tsan-debug/san_stress

# UBSan: a report ends the process (-fno-sanitize-recover) and is also caught
# by grepping for "runtime error" in the suites' output.
UBSAN_ENV := UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1 \
  HAK_FAULTS_PC_SECONDS=3 HAK_FAULTS_CHURN_THREADS=10000
test-ubsan: ubsan-bins
	@out=$$($(UBSAN_ENV) tests/run.sh $(addprefix $(UBSAN_TEST_BIN)/,$(UBSAN_SUITES)) 2>&1); rc=$$?; \
	  printf '%s\n' "$$out"; \
	  if printf '%s\n' "$$out" | grep -q 'runtime error'; then echo "UBSan: undefined behaviour reported"; exit 1; fi; \
	  $(UBSAN_ENV) $(BUILD)/san-ubsan/san_stress -t $(SAN_STRESS_THREADS) -s 2 || exit 1; \
	  exit $$rc

# TSan: any report fails (exitcode=66 and halt_on_error); never suppressed.
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1:history_size=4
test-tsan: tsan-bins
	$(TSAN_ENV) $(BUILD)/san-tsan/san_stress -t $(SAN_STRESS_THREADS) -s $(SAN_TSAN_SECONDS)
	$(TSAN_ENV) $(BUILD)/san-tsan-debug/san_stress -t $(SAN_STRESS_THREADS) -s $(SAN_TSAN_SECONDS)

.PHONY: san-libs ubsan-bins tsan-bins test-ubsan test-tsan

# Soak (not in CI): stress, TSan stress, fuzzer, real programs and the fault
# suite in a loop for SOAK_MINUTES; see tools/soak.
SOAK_MINUTES ?= 10
soak:
	tools/soak $(SOAK_MINUTES)
.PHONY: soak
