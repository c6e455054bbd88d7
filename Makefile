# Tessera build, test and demo entry points. `make help` lists them.
GO              ?= go
STATICCHECK     := honnef.co/go/tools/cmd/staticcheck@v0.7.0
FUZZTIME        ?= 30s
FUZZ_PACKAGES   := ./pkg/api/
BENCHTIME       ?= 200x
LIMITER         := $(wildcard limiter/Makefile)

.PHONY: help build test test-go test-limiter lint fuzz bench demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

build: ## build bin/tessera (and the limiter library)
	$(GO) build -o bin/tessera ./cmd/tessera
ifneq ($(LIMITER),)
	$(MAKE) -C limiter
endif

test: test-go test-limiter ## run every test (Go with -race, limiter with sanitizers)

test-go: ## Go tests with the race detector
	$(GO) test -race -count=1 ./...

test-limiter: ## limiter tests, then again under ASan+UBSan
ifneq ($(LIMITER),)
	$(MAKE) -C limiter test sanitize
endif

lint: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

fuzz: ## run every fuzz target for FUZZTIME each (default 30s)
	@set -e; for pkg in $(FUZZ_PACKAGES); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
	    $(GO) test $$pkg -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME); \
	  done; \
	done

bench: ## placement benchmarks (see docs/benchmarks.md)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./internal/placement/

demo: ## replay the bundled openb trace through every placement policy (no cluster, no GPU)
	$(GO) run ./cmd/tessera simulate --plot simulation.svg

clean: ## remove build outputs
	rm -rf bin
ifneq ($(LIMITER),)
	$(MAKE) -C limiter clean
endif
