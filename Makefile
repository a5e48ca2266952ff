# hakmem — build, test, bench, install.
# `make` builds the release library; `make test` runs every test suite.

CC      ?= gcc
PREFIX  ?= /usr/local
# Where make install puts the libraries and the header (a distribution's
# multiarch directory: LIBDIR=/usr/lib/x86_64-linux-gnu).
LIBDIR  ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BUILD   := build
VERSION := 0.1.0
# The name programs linked with -lhakmem record: its major version, which
# changes only with the ABI (include/hakmem.h's HAKMEM_VERSION_MAJOR).
SONAME  := libhakmem.so.$(firstword $(subst ., ,$(VERSION)))

# segmap.c and large.c last: the order of the library's bss (segmap.c says why).
LAST_SRCS := src/segmap.c src/large.c
SRCS    := $(filter-out $(LAST_SRCS),$(sort $(wildcard src/*.c))) $(LAST_SRCS)
HDRS    := $(wildcard src/*.h src/*.inc) include/hakmem.h

# Flags shared by every variant. Internal symbols are hidden so calls between
# files are direct; TLS is initial-exec so the heap pointer is one %fs load.
BASE_CFLAGS := -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fPIC -pthread \
  -fvisibility=hidden -ftls-model=initial-exec -fno-plt \
  -fno-semantic-interposition -fno-stack-protector -fno-builtin-malloc \
  -Iinclude -Isrc -DHAK_VERSION=\"$(VERSION)\"
RELEASE_CFLAGS := -O2 -DNDEBUG $(CFLAGS)
DEBUG_CFLAGS   := -O1 -g -DHAK_DEBUG=1 -DHAK_STATS=1 $(CFLAGS)
STATS_CFLAGS   := -O2 -g -DNDEBUG -DHAK_STATS=1 $(CFLAGS)
SECURE_CFLAGS  := -O2 -DNDEBUG -DHAK_SECURE=1 $(CFLAGS)
LDLIBS_LIB     := -pthread

.PHONY: all release debug stats secure install install-lib uninstall clean demo

all: release
release: $(BUILD)/libhakmem.so $(BUILD)/libhakmem.a
debug:   $(BUILD)/debug/libhakmem.so $(BUILD)/debug/libhakmem.a
stats:   $(BUILD)/stats/libhakmem.so $(BUILD)/stats/libhakmem.a
secure:  $(BUILD)/secure/libhakmem.so $(BUILD)/secure/libhakmem.a

# $(1)/flags holds the compiler and flags that build $(1), rewritten only
# when they change: its objects and libraries depend on it, so that `make
# CFLAGS=-O0` and then `make` rebuild each time instead of keeping what
# other flags built. $(2)=the flags.
define FLAGS_FILE
$(1)/flags: FORCE | $(1)/obj
	@f='$(subst ','"'"',$(2))'; [ "$$$$f" = "$$$$(cat $$@ 2>/dev/null)" ] || printf '%s\n' "$$$$f" > $$@
endef
FORCE:
.PHONY: FORCE

# The recipe that links a shared library $@ from the objects among its
# prerequisites, with the soname's link beside it; $(1)=compiler flags (no
# comma: LDFLAGS, which may have one, are added here).
link_so = $(CC) -shared $(1) -Wl,-soname,$(SONAME) -Wl,-z,nodelete $(LDFLAGS) -o $@ \
  $(filter %.o,$^) $(LDLIBS_LIB) && ln -sf libhakmem.so $(@D)/$(SONAME)

# One rule set per variant: $(1)=output dir, $(2)=flags.
define VARIANT
$(call FLAGS_FILE,$(1),$(CC) $(BASE_CFLAGS) $(2) $(LDFLAGS))
$(1)/obj/%.o: src/%.c $(HDRS) $(1)/flags | $(1)/obj
	$$(CC) $(BASE_CFLAGS) $(2) -DHAK_BUILD_FLAGS="\"$$(CC) $(strip $(2))\"" -c $$< -o $$@
$(1)/obj:
	mkdir -p $$@
$(1)/libhakmem.so: $(patsubst src/%.c,$(1)/obj/%.o,$(SRCS)) $(1)/flags
	$$(call link_so)
$(1)/libhakmem.a: $(patsubst src/%.c,$(1)/obj/%.o,$(SRCS))
	rm -f $$@ && ar rcs $$@ $$^
endef
$(eval $(call VARIANT,$(BUILD),$(RELEASE_CFLAGS)))
$(eval $(call VARIANT,$(BUILD)/debug,$(DEBUG_CFLAGS)))
$(eval $(call VARIANT,$(BUILD)/stats,$(STATS_CFLAGS)))
$(eval $(call VARIANT,$(BUILD)/secure,$(SECURE_CFLAGS)))

-include tests/tests.mk
-include tests/sanitize.mk
-include fuzz/fuzz.mk
-include bench/bench.mk
-include tools/tools.mk

# Runs a real program under the preloaded library and shows what hakmem served
# (the stats build, so the report has exact per-class counts): python3 when it
# is installed, else perl (always on Debian).
PYTHON := $(firstword $(wildcard /usr/bin/python3))
ifneq ($(PYTHON),)
DEMO_CMD := $(PYTHON) -c "d = {str(i): [i] * 3 for i in range(200000)}; print('python3 ok:', len(d), 'entries')"
else
DEMO_CMD := perl -e 'my %d; $$d{$$_} = [($$_) x 3] for 1..200000; print "perl ok: ", scalar(keys %d), " entries\n"'
endif
demo: release stats
	@echo "== $(firstword $(DEMO_CMD)) builds a hash of 200k entries under LD_PRELOAD=$(BUILD)/stats/libhakmem.so"
	HAKMEM_STATS=1 LD_PRELOAD=$(CURDIR)/$(BUILD)/stats/libhakmem.so $(DEMO_CMD)

# hakmem.pc names a directory under ${prefix} when it is.
pc_dir = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
install: release install-lib
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 $(BUILD)/libhakmem.a $(DESTDIR)$(LIBDIR)/
	install -m 644 include/hakmem.h $(DESTDIR)$(INCLUDEDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	  -e 's|@LIBDIR@|$(call pc_dir,$(LIBDIR))|g' -e 's|@INCLUDEDIR@|$(call pc_dir,$(INCLUDEDIR))|g' \
	  hakmem.pc.in \
	  > $(DESTDIR)$(LIBDIR)/pkgconfig/hakmem.pc

# The shared library as a distribution lays it out: the file named by the
# full version, the soname and the link-time name linked to it.
install-lib: $(BUILD)/libhakmem.so
	install -d $(DESTDIR)$(LIBDIR)
	install -m 755 $(BUILD)/libhakmem.so $(DESTDIR)$(LIBDIR)/libhakmem.so.$(VERSION)
	ln -sf libhakmem.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libhakmem.so

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libhakmem.so $(DESTDIR)$(LIBDIR)/$(SONAME) \
	  $(DESTDIR)$(LIBDIR)/libhakmem.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libhakmem.a \
	  $(DESTDIR)$(INCLUDEDIR)/hakmem.h $(DESTDIR)$(LIBDIR)/pkgconfig/hakmem.pc

# docs/OPTIONS.md is generated from the option table; check-options-doc fails
# when it is stale (run by `make test`).
$(BUILD)/gen_options: tools/gen_options.c src/options.h
	@mkdir -p $(BUILD)
	$(CC) -std=gnu11 -Wall -Wextra -Isrc -o $@ $<
options-doc: $(BUILD)/gen_options
	$(BUILD)/gen_options > docs/OPTIONS.md
check-options-doc: $(BUILD)/gen_options
	@$(BUILD)/gen_options | diff -u docs/OPTIONS.md - >/dev/null || \
	  { echo "docs/OPTIONS.md is stale: run 'make options-doc'"; exit 1; }
.PHONY: options-doc check-options-doc

# malloc's class tables are generated from hak_class_size (src/classes.c);
# check-class-tables fails when they are stale (run by `make test`).
CLASS_TABLES_GEN := python3 tools/gen_class_tables.py
class-tables:
	$(CLASS_TABLES_GEN) fast > src/class_table.inc
	$(CLASS_TABLES_GEN) small > src/small_class_table.inc
check-class-tables:
	@$(CLASS_TABLES_GEN) fast | diff -u src/class_table.inc - >/dev/null && \
	  $(CLASS_TABLES_GEN) small | diff -u src/small_class_table.inc - >/dev/null || \
	  { echo "src/*class_table.inc are stale: run 'make class-tables'"; exit 1; }
.PHONY: class-tables check-class-tables

clean:
	rm -rf $(BUILD)
