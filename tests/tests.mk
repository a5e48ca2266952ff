# Test suites. Conventions (add a file, it is picked up):
#   tests/test_*.c   public-API suites, linked against build/libhakmem.so (linked override)
#   tests/test_*.cc  C++ suites, same linking
#   tests/unit_*.c   white-box suites, linked against the debug static library, may use src/*.h
#   tests/sh_*.sh    shell suites; get LIBHAKMEM (path of the release .so) and BUILD in the env
# Every suite prints "RESULT <suite> <passed> <failed>"; tests/run.sh sums them.

TEST_BIN    := $(BUILD)/tests
TEST_CFLAGS := -std=gnu11 -O1 -g -Wall -Wextra -Wno-unused-parameter -pthread -fno-builtin -Iinclude
TEST_LINK   ?= -L$(BUILD) -Wl,-rpath,$(CURDIR)/$(BUILD) -lhakmem

TEST_C   := $(patsubst tests/%.c,$(TEST_BIN)/%,$(wildcard tests/test_*.c))
TEST_CXX := $(patsubst tests/%.cc,$(TEST_BIN)/%,$(wildcard tests/test_*.cc))
TEST_UNIT:= $(patsubst tests/%.c,$(TEST_BIN)/%,$(wildcard tests/unit_*.c))
TEST_SH  := $(sort $(wildcard tests/sh_*.sh))
TEST_ALL_BINS := $(TEST_UNIT) $(TEST_C) $(TEST_CXX)

$(TEST_BIN):
	mkdir -p $@
$(TEST_BIN)/test_%: tests/test_%.c tests/harness.h tests/blocks.h include/hakmem.h $(BUILD)/libhakmem.so | $(TEST_BIN)
	$(CC) $(TEST_CFLAGS) -o $@ $< $(TEST_LINK) -lm -ldl
$(TEST_BIN)/test_%: tests/test_%.cc tests/harness.h tests/blocks.h include/hakmem.h $(BUILD)/libhakmem.so | $(TEST_BIN)
	$(CXX) -std=gnu++17 -O1 -g -Wall -Wextra -pthread -fno-builtin -Iinclude -o $@ $< $(TEST_LINK)
$(TEST_BIN)/unit_%: tests/unit_%.c tests/harness.h $(HDRS) $(BUILD)/debug/libhakmem.a | $(TEST_BIN)
	$(CC) $(TEST_CFLAGS) -Isrc -DHAK_DEBUG=1 -DHAK_STATS=1 -o $@ $< $(BUILD)/debug/libhakmem.a -lm

test-bins: release debug $(TEST_ALL_BINS)

test: test-bins
	@LIBHAKMEM=$(CURDIR)/$(BUILD)/libhakmem.so BUILD=$(CURDIR)/$(BUILD) \
	  tests/run.sh $(TEST_ALL_BINS) $(TEST_SH)

.PHONY: test test-bins
