# The hakmem command-line tool (tools/hakmem; see docs/CLI.md). Included by
# the top Makefile (BUILD, PREFIX, LIBDIR, DESTDIR come from there).
#   make install-cli   $(PREFIX)/bin/hakmem, $(LIBDIR)/hakmem/hakbench.py,
#                      $(LIBDIR)/hakmem/libhakmem-stats.so (the stats build)
#                      and the release $(LIBDIR)/libhakmem.so it runs by default
#                      (install-lib: the library with its soname's links).
# `make install` includes it.

CLI_LIBDIR := $(DESTDIR)$(LIBDIR)/hakmem

.PHONY: install-cli uninstall-cli

install: install-cli
uninstall: uninstall-cli

install-cli: $(BUILD)/stats/libhakmem.so install-lib
	install -d $(DESTDIR)$(PREFIX)/bin $(CLI_LIBDIR)
	sed 's|^LIBDIR = .*|LIBDIR = "$(LIBDIR)"|' tools/hakmem > $(DESTDIR)$(PREFIX)/bin/hakmem
	grep -qx 'LIBDIR = "$(LIBDIR)"' $(DESTDIR)$(PREFIX)/bin/hakmem
	chmod 755 $(DESTDIR)$(PREFIX)/bin/hakmem
	install -m 644 tools/hakbench.py $(CLI_LIBDIR)/hakbench.py
	install -m 755 $(BUILD)/stats/libhakmem.so $(CLI_LIBDIR)/libhakmem-stats.so

uninstall-cli:
	rm -f $(DESTDIR)$(PREFIX)/bin/hakmem $(CLI_LIBDIR)/hakbench.py $(CLI_LIBDIR)/libhakmem-stats.so
	-rmdir $(CLI_LIBDIR) 2>/dev/null
