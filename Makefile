# make test: the one command that runs every test on a fresh Debian machine.
# It installs redis-server and redis-cli (the tests start their own servers
# on free loopback ports) when they are missing, then runs the suite.

GO ?= go
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test redis bench fuzz example

test: redis
	$(GO) test -race -shuffle=on -timeout 8m ./...

redis:
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then \
		echo "installing redis-server and redis-tools"; \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; \
	fi

bench: redis
	$(GO) test -run '^$$' -bench . -benchmem ./...

example:
	$(GO) run ./example
