# libFuzzer target for the hak_* API (see docs/RELIABILITY.md). Included by the
# top Makefile with `-include fuzz/fuzz.mk`; until then:
#   make -f Makefile -f fuzz/fuzz.mk fuzz FUZZ_SECONDS=60
#
#   make fuzz [FUZZ_SECONDS=60]  fuzz for a bounded time; new inputs go to
#                                $(BUILD)/fuzz/work, crashes to $(BUILD)/fuzz/crash-*
#   make fuzz-regress            run every input of fuzz/corpus once (-runs=0)
#   make fuzz-corpus             regenerate fuzz/corpus with fuzz/make_corpus.py
#
# The library is a no-override debug build (every src/*.c but src/override.c,
# -DHAK_DEBUG=1 -DHAK_STATS=1: assertions and invariant checks on), compiled
# with clang coverage instrumentation (-fsanitize=fuzzer-no-link) and UBSan,
# so the fuzzer steers by the allocator's own branches.

FUZZ_CC      ?= clang
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_SAN     := -fsanitize=undefined -fno-sanitize-recover=undefined
FUZZ_LIBFLAGS:= -O1 -g -DHAK_DEBUG=1 -DHAK_STATS=1 -fsanitize=fuzzer-no-link $(FUZZ_SAN)
FUZZ_SRCS    := $(filter-out src/override.c,$(SRCS))
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
FUZZ_ARGS    ?= -max_len=2048 -rss_limit_mb=4096 -timeout=30 -print_final_stats=1

$(FUZZ_DIR)/obj/%.o: src/%.c $(HDRS) | $(FUZZ_DIR)/obj
	$(FUZZ_CC) $(BASE_CFLAGS) $(FUZZ_LIBFLAGS) -DHAK_BUILD_FLAGS="\"$(FUZZ_CC) $(FUZZ_LIBFLAGS)\"" -c $< -o $@
$(FUZZ_DIR)/obj:
	mkdir -p $@
$(FUZZ_DIR)/libhakmem.a: $(patsubst src/%.c,$(FUZZ_DIR)/obj/%.o,$(FUZZ_SRCS))
	rm -f $@ && ar rcs $@ $^
$(FUZZ_DIR)/fuzz_alloc: fuzz/fuzz_alloc.c include/hakmem.h $(FUZZ_DIR)/libhakmem.a
	$(FUZZ_CC) -std=gnu11 -O1 -g -Wall -Wextra -Iinclude -DFUZZ_LIVE_CHECK=1 \
	  -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $< $(FUZZ_DIR)/libhakmem.a -pthread

fuzz-bin: $(FUZZ_DIR)/fuzz_alloc

FUZZ_ENV := UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fuzz: $(FUZZ_DIR)/fuzz_alloc
	mkdir -p $(FUZZ_DIR)/work
	$(FUZZ_ENV) $(FUZZ_DIR)/fuzz_alloc $(FUZZ_ARGS) -max_total_time=$(FUZZ_SECONDS) \
	  -artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_DIR)/work fuzz/corpus

fuzz-regress: $(FUZZ_DIR)/fuzz_alloc
	$(FUZZ_ENV) $(FUZZ_DIR)/fuzz_alloc $(FUZZ_ARGS) -runs=0 -artifact_prefix=$(FUZZ_DIR)/ fuzz/corpus

fuzz-corpus:
	python3 fuzz/make_corpus.py fuzz/corpus

.PHONY: fuzz fuzz-bin fuzz-regress fuzz-corpus
