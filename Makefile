# Tessera build, test and demo entry points. `make help` lists them.
GO              ?= go
STATICCHECK     := honnef.co/go/tools/cmd/staticcheck@v0.7.0
# A count, not a duration: Go 1.26's fuzz coordinator can report a spurious
# "context deadline exceeded" when a duration budget ends mid-execution
# (golang/go#75804, fixed in Go 1.27); a count has no deadline to race.
FUZZTIME        ?= 2000000x
FUZZ_PACKAGES   := ./pkg/api/ ./internal/limiterconf/
BENCHTIME       ?= 200x
LIMITER         := $(wildcard limiter/Makefile)

# go-nvml's cgo bindings call NVML functions the header marks deprecated;
# every build of that package would print ~150 lines of warnings that say
# nothing about Tessera. Go's own default flags, less that one warning (a
# CGO_CFLAGS set in the environment wins). Every cgo package sees these
# flags, so they stay Go's defaults apart from the warning.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# The Kubernetes components report the pinned release (kubectl refuses the
# placeholder version otherwise): the flags of internal/version's
# KubernetesLDFlags, from go.mod's k8s.io/kubernetes.
K8S_VERSION     ?= $(shell $(GO) list -m -f '{{.Version}}' k8s.io/kubernetes 2>/dev/null)
K8S_SEMVER      := $(subst ., ,$(patsubst v%,%,$(K8S_VERSION)))
K8S_LDFLAGS     := -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
                   -X k8s.io/component-base/version.gitMajor=$(word 1,$(K8S_SEMVER)) \
                   -X k8s.io/component-base/version.gitMinor=$(word 2,$(K8S_SEMVER)) \
                   -X k8s.io/component-base/version.gitTreeState=clean
# tessera-lab carries a whole control plane; without DWARF it links in a
# third of the time (12 s -> 4 s here) and is 140 MB instead of 190 MB.
LAB_LDFLAGS     := -s -w $(K8S_LDFLAGS)
# What the lab's containers run besides Go (tessera-lab --tools).
LAB_TOOLS       ?= bin/lab-tools
INTEGRATION     := ./internal/nodeagent/... ./cmd/kubectl-tessera/... ./charts/... ./test/integration/...
# Benchmarks and simulations keep a dated copy of their output, with the
# commit, the machine and the exact command, in bench-results/ (commit it
# with the docs that quote it); scheduler_perf's raw data items go to
# bench-results/data/ (not committed).
RECORD          := hack/record-result.sh

# make e2e's real node: its binaries, images and test binary.
E2E             := bin/e2e

.PHONY: help build images e2e e2e-build release-plugin test-release-plugin lab-tools volcano test test-go test-limiter test-integration test-alone lint fuzz bench bench-scheduler-ci bench-scheduler bench-scheduler-preemption bench-scheduler-dra demo lab simulate clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

build: lab-tools ## build bin/tessera, bin/kubectl-tessera, bin/tessera-sim, bin/tessera-lab and its tools (and the limiter library)
	$(GO) build -ldflags "$(K8S_LDFLAGS)" -o bin/tessera ./cmd/tessera
	$(GO) build -o bin/kubectl-tessera ./cmd/kubectl-tessera
	$(GO) build -o bin/tessera-sim ./cmd/tessera-sim
	$(GO) build -ldflags "$(LAB_LDFLAGS)" -o bin/tessera-lab ./cmd/tessera-lab

images: ## the image index (linux/amd64 + linux/arm64) in bin/images: OCI layout, tar, smoke test (docs/install.md)
	K8S_LDFLAGS="$(K8S_LDFLAGS)" hack/images/build.sh

e2e: e2e-build ## the chart installed as the README says on a real node (kubelet, containerd, runc, CNI, kube-proxy), the GPU guides' pods in real containers (root; docs/install.md)
	cd test/e2e && ../../$(E2E)/e2e.test -test.v -test.timeout 20m $(E2E_FLAGS)

e2e-build: images lab-tools ## what make e2e runs: the node's binaries (kubelet, kube-proxy, containerd, runc, CNI plugins), helm, the containers' images, the test binary
	$(GO) build -ldflags "$(LAB_LDFLAGS)" -o bin/tessera-lab ./cmd/tessera-lab
	$(GO) build -ldflags "$(K8S_LDFLAGS)" -o $(E2E)/ k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
	CGO_ENABLED=0 $(GO) build -ldflags "$(K8S_LDFLAGS)" -o $(E2E)/kubectl ./internal/testenv/kubectlbin
	hack/tools/build-helm.sh bin/helm
	hack/node/build.sh $(E2E)/node
	hack/e2e/images.sh $(E2E)/images
	$(GO) test -c -tags e2e -o $(E2E)/e2e.test ./test/e2e

release-plugin: ## kubectl-tessera release archives (linux, darwin, windows) and their krew manifest in bin/release
	hack/release-plugin.sh

test-release-plugin: ## krew installs kubectl-tessera from this machine's release archive and manifest (hack/release-plugin-test.sh)
	hack/release-plugin-test.sh

lab-tools: ## the lab containers' tools into bin/lab-tools: tessera-lab-init, the limiter, the fake GPU driver, nvidia-smi, gpu-fill (gcc)
	$(GO) build -o $(LAB_TOOLS)/tessera-lab-init ./cmd/tessera-lab/init
	$(MAKE) -C limiter
	install -m 755 limiter/build/libtessera-limiter.so $(LAB_TOOLS)/libtessera-limiter.so
	$(MAKE) -C fakegpu B=$(abspath $(LAB_TOOLS))

volcano: ## Volcano's scheduler and controller manager (volcano.sh/volcano, pinned in hack/volcano) and its CRDs into bin/volcano, for tessera-lab up --volcano
	hack/volcano/build.sh bin/volcano

# The test targets run every test: one that needs what the machine lacks
# (root, a program, NVIDIA's non-free binaries) fails instead of skipping.
# Each target first runs hack/test-deps.sh, which installs and fetches what
# is missing when run as root and names it otherwise. TESSERA_TEST_STRICT=0
# skips those tests instead, each naming what it lacks (plain `go test`
# does so by default).
export TESSERA_TEST_STRICT ?= 1

test: test-go test-limiter test-integration ## run every test (Go with -race, limiter with sanitizers, integration; as root)

test-go: ## Go tests with the race detector (after hack/test-deps.sh go: gcc, root, NVIDIA's MPS control daemon)
	hack/test-deps.sh go
	$(GO) test -race -count=1 ./...

test-limiter: ## limiter tests, then again under ASan+UBSan (after hack/test-deps.sh limiter: root, sudo, NVIDIA's libraries)
	hack/test-deps.sh limiter
ifneq ($(LIMITER),)
	$(MAKE) -C limiter test sanitize
endif

test-integration: ## real kube-apiserver + etcd, kube-scheduler, kubelet device manager, hollow kubelets, the emulated cluster (root)
	hack/test-deps.sh integration
	$(GO) test -tags integration -count=1 -timeout 30m $(INTEGRATION)

test-alone: ## every Go test and subtest alone, one process each (hack/each-test.sh; integration ones need root)
	hack/test-deps.sh go integration
	hack/each-test.sh -subtests ./...
	hack/each-test.sh -tags integration -subtests $(INTEGRATION)

lint: ## gofmt, go vet, staticcheck (with and without the integration tag; make e2e's test with its tag)
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags integration ./...
	$(GO) vet -tags e2e ./test/e2e/
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(STATICCHECK) -tags integration ./...
	$(GO) run $(STATICCHECK) -tags e2e ./test/e2e/

fuzz: ## run every fuzz target for FUZZTIME each (default 2,000,000 inputs)
	@set -e; for pkg in $(FUZZ_PACKAGES); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
	    $(GO) test $$pkg -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME); \
	  done; \
	done

bench: ## placement benchmarks (see docs/benchmarks.md; recorded in bench-results/)
	$(RECORD) bench $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./internal/placement/

bench-scheduler-ci: ## scheduler_perf, 100 nodes and a 4-node DRA case (run in CI; recorded in bench-results/)
	$(RECORD) bench-scheduler-ci $(GO) test -tags integration -count=1 -run '^$$' -bench BenchmarkPerfScheduling -benchtime=1x ./test/integration/schedulerperf/ -perf-scheduling-label-filter=integration-test -data-items-dir=$(CURDIR)/bench-results/data

bench-scheduler: ## scheduler_perf, 5,000 nodes x 8 GPUs, 10,000 pods per scheduler (see docs/benchmarks.md; recorded in bench-results/)
	$(RECORD) bench-scheduler $(GO) test -tags integration -count=1 -run '^$$' -bench BenchmarkPerfScheduling -benchtime=1x -timeout=80m ./test/integration/schedulerperf/ -data-items-dir=$(CURDIR)/bench-results/data

bench-scheduler-preemption: ## scheduler_perf, the preemption cases: 500 nodes x 8 GPUs full of quarter shares, then 1,000 half shares of higher priority; the stock profile's own case beside it (see docs/benchmarks.md; recorded in bench-results/)
	$(RECORD) bench-scheduler-preemption $(GO) test -tags integration -count=1 -run '^$$' -bench 'BenchmarkPerfScheduling/(Tessera|Stock)Preemption' -benchtime=1x -timeout=60m ./test/integration/schedulerperf/ -perf-scheduling-label-filter=preemption -data-items-dir=$(CURDIR)/bench-results/data

# bench-scheduler-dra's size: performance (5,000 nodes) or medium (1,000).
DRA_BENCH_SIZE ?= performance
# The lines of a scheduler_perf run its summary record keeps.
PERF_SUMMARY    := ^(Benchmark|--- |ok|PASS|FAIL)|dra_test.go|^(load|duration|exit):

bench-scheduler-dra: ## scheduler_perf, the DRA cases and Tessera's device-plugin case: 5,000 nodes x 8 GPUs (DRA_BENCH_SIZE=medium: 1,000), share and whole-GPU claims, Tessera's and the stock profile (see docs/benchmarks.md; recorded, with a summary)
	SUMMARY='$(PERF_SUMMARY)' $(RECORD) bench-scheduler-dra$(if $(filter-out performance,$(DRA_BENCH_SIZE)),-$(DRA_BENCH_SIZE)) $(GO) test -tags integration -count=1 -v -run '^$$' -bench 'BenchmarkPerfScheduling/(DRA|TesseraFractional)' -benchtime=1x -timeout=60m ./test/integration/schedulerperf/ -perf-scheduling-label-filter=$(DRA_BENCH_SIZE),dra -data-items-dir=$(CURDIR)/bench-results/data

demo: lab-tools ## start the emulated GPU cluster, run the demo workloads, show the enforcement, stop (no cluster, no GPU; root)
	$(GO) build -ldflags "$(LAB_LDFLAGS)" -o bin/tessera-lab ./cmd/tessera-lab
	bin/tessera-lab demo --tools $(LAB_TOOLS)

lab: lab-tools ## start the emulated GPU cluster and keep it running (tessera-lab up; Ctrl-C stops it)
	$(GO) build -ldflags "$(LAB_LDFLAGS)" -o bin/tessera-lab ./cmd/tessera-lab
	bin/tessera-lab up --tools $(LAB_TOOLS) $(LAB_FLAGS)

simulate: ## replay the bundled openb trace through the seven compared placement policies (tessera-sim; recorded in bench-results/)
	$(RECORD) simulate $(GO) run ./cmd/tessera-sim --plot simulation.svg

clean: ## remove build outputs
	rm -rf bin
	$(MAKE) -C fakegpu clean
ifneq ($(LIMITER),)
	$(MAKE) -C limiter clean
endif
