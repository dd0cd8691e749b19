# make test: the one command that runs every test on a fresh Debian machine.
# It installs redis-server and redis-cli (the tests start their own servers
# on free loopback ports) and chromium (the operator page's browser test)
# when they are missing, then runs the suite.

GO ?= go
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test redis chromium bench bench-hot fuzz example overload

# Nested modules (own go.mod, so the main module's ./... does not enter
# them): vetted and tested here, since CI vets only the main module.
NESTED := adapters/envoyrls adapters/grpclimit example example/browsertest middleware/metrics/prometheus middleware/metrics/otel middleware/sluicetest/miniredis

# The browser test writes its screenshots of the operator page here, for CI
# to keep as artifacts, and logs their paths.
export SLUICE_SCREENSHOTS ?= $(CURDIR)/artifacts/screenshots

# The tests run with the key guard on (internal/keyguard): every script
# sluice sends checks that it touches only the keys it declares. make bench
# leaves it off, as production does.
test: redis chromium
	SLUICE_KEYGUARD=1 $(GO) test -race -shuffle=on -timeout 8m ./...
	@set -e; for m in $(NESTED); do \
		echo "$$m: $(GO) vet, $(GO) test -race"; \
		(cd $$m && $(GO) vet ./... && SLUICE_KEYGUARD=1 $(GO) test -race -shuffle=on -timeout 5m ./...); \
	done

redis:
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then \
		echo "installing redis-server and redis-tools"; \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; \
	fi

chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
		echo "installing chromium"; \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

bench: redis
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The hot-path budget (BENCHMARKS.md, "The hot path"): what each step of
# a decision costs, and a decision with each capability configured, on a
# hot key and on 100,000 keys, from every core; a few minutes. With
# benchstat on the PATH (go install golang.org/x/perf/cmd/benchstat@latest)
# it prints the medians.
HOT_COUNT ?= 3
HOT_TIME ?= 0.5s
bench-hot:
	$(GO) test -run '^$$' -bench BenchmarkHotPath -benchmem -count $(HOT_COUNT) -benchtime $(HOT_TIME) ./middleware/ | tee hotpath.txt
	@if command -v benchstat >/dev/null 2>&1; then benchstat -filter '.unit:(sec/op OR cpu-ns/op OR allocs/op)' hotpath.txt; fi

example:
	$(GO) run ./example

# The overload benchmark (BENCHMARKS.md, "Overload"): a handler of 8 slots
# × 20ms under an open-loop load at 3× its capacity from a separate
# process; about 2.5 minutes, so it is not part of make test.
overload:
	$(GO) run ./internal/cmd/overload $(OVERLOAD_FLAGS)
