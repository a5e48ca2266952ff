# The hakmem command-line tool (tools/hakmem; see docs/CLI.md). Included by
# the top Makefile (BUILD, PREFIX, DESTDIR come from there).
#   make install-cli   $(PREFIX)/bin/hakmem, $(PREFIX)/lib/hakmem/hakbench.py,
#                      $(PREFIX)/lib/hakmem/libhakmem-stats.so (the stats build)
#                      and the release $(PREFIX)/lib/libhakmem.so it runs by default
#                      (install-lib: the library with its soname's links).
# `make install` includes it.

CLI_LIBDIR := $(DESTDIR)$(PREFIX)/lib/hakmem

.PHONY: install-cli uninstall-cli

install: install-cli
uninstall: uninstall-cli

install-cli: $(BUILD)/stats/libhakmem.so install-lib
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(CLI_LIBDIR)
	install -m 755 tools/hakmem $(DESTDIR)$(PREFIX)/bin/hakmem
	install -m 644 tools/hakbench.py $(CLI_LIBDIR)/hakbench.py
	install -m 755 $(BUILD)/stats/libhakmem.so $(CLI_LIBDIR)/libhakmem-stats.so

uninstall-cli:
	rm -f $(DESTDIR)$(PREFIX)/bin/hakmem $(CLI_LIBDIR)/hakbench.py $(CLI_LIBDIR)/libhakmem-stats.so
	-rmdir $(CLI_LIBDIR) 2>/dev/null
