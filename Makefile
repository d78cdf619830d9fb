# Sluice: the two commands of the README are `go run ./cmd/sluice demo` and `make test`.
GO            ?= go
STATICCHECK   ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
APIDIFF       ?= golang.org/x/exp/cmd/apidiff@v0.0.0-20261113113407-e3970619a1a4
BENCHCOUNT    ?= 6
BENCHTIME     ?= 1s
FUZZTIME      ?= 1m
SOAKTIME      ?= 60s
PROPERTY_TRIALS ?= 200000
BENCH         ?= .
RESULTS       ?= results/local.txt
PKGS          := ./...
# go test's -p: test binaries and builds run at once. Many tests wait on real servers and
# real time, so twice the cores keeps the machine busy while they wait (the default, one
# per core, left a 2-core machine half idle).
TESTP         ?= 4

.PHONY: all test test-deps test-short bench fuzz soak robustness matrix lint api api-base vet fmt tidy clean release image

all: lint test

## test: install the servers the tests start if they are missing (scripts/test-deps: apt-get
## as root, else it says what to install), then every test with the race detector, then the
## simulator's golden reports without it (every shipped scenario in full: a few seconds
## without -race, a minute with it; sim/golden_test.go is built without -race only), then a
## short run of each fuzz target.
test: test-deps
	$(GO) test -race -p $(TESTP) -timeout 15m $(PKGS)
	$(GO) test -count=1 -timeout 5m -run Golden ./sim
	cd bench && $(GO) test -race -timeout 5m -run . ./...
	cd tests && $(GO) test -race -timeout 10m ./...
	$(MAKE) fuzz FUZZTIME=10000x PROPERTY_TRIALS=0

test-deps:
	@scripts/test-deps

## test-short: the quick subset, for the edit loop.
test-short:
	$(GO) test -short -timeout 5m $(PKGS)

## bench: comparative benchmarks in bench/, interleaved, reported as ratios by benchstat
## (the redis ones: make bench BENCH=Redis BENCHCOUNT=5 RESULTS=results/redis.txt).
## The libraries are interleaved: one run of every benchmark, BENCHCOUNT times over, so a
## machine that slows down mid-run slows every library alike.
bench:
	mkdir -p bench/results
	cd bench && $(GO) test -c -o results/bench.test . && rm -f $(RESULTS) && \
	  for i in $$(seq $(BENCHCOUNT)); do \
	    ./results/bench.test -test.run '^$$' -test.bench '$(BENCH)' -test.benchmem -test.benchtime $(BENCHTIME) | tee -a $(RESULTS); \
	  done
	cd bench && $(GO) tool benchstat -col /impl $(RESULTS)

## fuzz: each fuzz target for FUZZTIME (make test runs each for 10,000 inputs; their seed
## corpora run with the other tests), then the core's property test for PROPERTY_TRIALS
## random sequences and the redis script's differential test for 20,000 (make test runs
## their defaults, 2,000 and 2,500; PROPERTY_TRIALS=0 skips both long runs).
## scripts/fuzz builds each package's instrumented test binary once and runs its targets
## (what go test -fuzz does, one link per package instead of one per target); it also
## handles Go 1.26's fuzz deadline race (go.dev/issue/75804).
FUZZ_TARGETS := .:FuzzParse ./internal/wire:FuzzQueryRoundTrip ./internal/wire:FuzzAnswerRoundTrip ./server:FuzzParseConfig ./server:FuzzGlobMatch ./internal/wire:FuzzValidTag ./lease/allot:FuzzStateCodec ./internal/ratehdr:FuzzRead ./gossip/hits:FuzzDecode ./server:FuzzParseEnvoyConfig ./strict/cas:FuzzCodec ./server:FuzzRequestDecoding
fuzz:
	@GO=$(GO) scripts/fuzz $(FUZZTIME) $(FUZZ_TARGETS)
	@if [ "$(PROPERTY_TRIALS)" != 0 ]; then \
	  echo "property test of ./gcra, $(PROPERTY_TRIALS) trials"; \
	  SLUICE_PROPERTY_TRIALS=$(PROPERTY_TRIALS) $(GO) test -count=1 -run '^TestPropertyConformance$$' ./gcra || exit 1; \
	  echo "differential test of the redis script against the core, 20,000 sequences"; \
	  SLUICE_STRICT_DIFF_SEQS=20000 $(GO) test -count=1 -run '^TestDifferential$$' ./strict || exit 1; \
	fi

## matrix: the guarantee matrix, every mode on every shape of sim/matrix.yaml beside the
## ideal throttle (docs/simulator.md, "The guarantee matrix"); records the run in
## sim/testdata/matrix.json, writes docs/guarantees.md from it, and ends with its summary
## line (exit 1 while a cell within its mode's envelope fails).
matrix:
	$(GO) run ./cmd/sluice sim --matrix --record sim/testdata/matrix.json --guarantees docs/guarantees.md

## soak: long real-time runs that judge real decisions exactly (SOAKTIME each).
soak:
	SLUICE_SOAK=$(SOAKTIME) $(GO) test -race -tags soak -run Soak -timeout 60m -v $(PKGS)

## robustness: ROBUST_RUNS randomized fault schedules (tests/robustness, docs/robustness.md), each
## ROBUST_DURATION long, seeds from ROBUST_BASE (default: the time, so each run explores new
## ones), each in the mode its seed picks (or ROBUST_MODE's), one line per run and the
## summary last; ROBUST_SEED=N runs that seed alone (reproducing a failure); ROBUST_DUMP=DIR
## keeps each run's records. The members, and the daemon modes' sluice, are race-enabled
## builds. Then (not for one seed or mode) TestGossipPartitionBites and
## TestDaemonGossipPartitionBites: a 4.3 s cut between gossip peers (members, or daemons
## through their proxies) must show in the pool sizes they count. And (not for one seed;
## for ROBUST_MODE's if it is gossip or daemon-gossip) TestOwnerFaults: a key's owner
## killed and cut off, its new owner fenced. The gossip modes' schedules kill and cut off
## owners too (owner_kill, owner_partition). make test runs 2 schedules and
## TestOwnerFaults' gossip mode.
ROBUST_RUNS     ?= 20
ROBUST_DURATION ?= 10s
ROBUST_BASE     ?= $(shell date +%s)
ROBUST_SEED     ?=
ROBUST_MODE     ?=
ROBUST_DUMP     ?=
robustness: test-deps
	@mkdir -p bench/results
	cd tests && $(GO) test -race -c -o ../bench/results/robust.test ./robustness
	$(GO) build -race -o bench/results/robust-sluice ./cmd/sluice
	ROBUST_RUNS=$(ROBUST_RUNS) ROBUST_DURATION=$(ROBUST_DURATION) ROBUST_BASE=$(ROBUST_BASE) ROBUST_SEED=$(ROBUST_SEED) \
	  ROBUST_MODE=$(ROBUST_MODE) ROBUST_DUMP=$(ROBUST_DUMP) ROBUST_SLUICE=$(CURDIR)/bench/results/robust-sluice \
	  bench/results/robust.test -test.run '^(TestRobustness|TestGossipPartitionBites|TestDaemonGossipPartitionBites|TestOwnerFaults)$$' -test.timeout 120m

## lint: go vet and staticcheck (installed through the Go toolchain), gofmt, and the API check.
lint: vet
	$(GO) run $(STATICCHECK) $(PKGS)
	cd bench && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd tests && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	@$(MAKE) --no-print-directory api

## api: the exported API against the last release's (scripts/apicheck, apidiff from
## golang.org/x/exp run through the Go toolchain): the release is the newest vX.Y.Z tag,
## else the commit api/BASE names ("none" before the first). An incompatible change fails
## unless api/next.txt lists it (its line copied from the output): a deliberate break is a
## one-line edit there. Compatible changes are listed for information.
api:
	@GO=$(GO) APIDIFF=$(APIDIFF) scripts/apicheck

## api-base: at a release, record the commit released (HEAD) and its version in api/BASE
## and empty api/next.txt, then commit both: make api-base API_VERSION=v0.3.0
api-base:
	@test -n "$(API_VERSION)" || { echo "make api-base API_VERSION=vX.Y.Z" >&2; exit 2; }
	@scripts/apicheck record $(API_VERSION)

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

tidy:
	$(GO) mod tidy
	cd bench && $(GO) mod tidy
	cd tests && $(GO) mod tidy

## release: binaries without cgo (static on linux) for linux and darwin, amd64 and arm64, in dist/
## (git-ignored) with their SHA256SUMS; the version (git describe) and the commit are stamped
## in, and shown by `sluice version` and the daemon's sluice_build_info.
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILDINFO := github.com/sluicehq/sluice/internal/buildinfo
release:
	rm -rf dist && mkdir -p dist
	@for p in $(RELEASE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; out=dist/sluice-$$os-$$arch; echo "build $$out"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath \
	    -ldflags "-s -w -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT)" -o $$out ./cmd/sluice || exit 1; \
	done
	cd dist && sha256sum sluice-* > SHA256SUMS && cat SHA256SUMS

## image: the daemon's container image from deploy/Dockerfile, named IMAGE (required: nothing
## is published; e.g. make image IMAGE=registry.example.com/sluice:v0.3.0), with the version
## and commit stamped in; push it where your cluster pulls from and set it in
## deploy/kubernetes/sluice.yaml.
image:
	@test -n "$(IMAGE)" || { echo "make image: set IMAGE, e.g. make image IMAGE=registry.example.com/sluice:$(VERSION)" >&2; exit 2; }
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

clean:
	rm -f bench/results/bench.test bench/results/robust.test bench/results/robust-sluice bench/results/*.prof
	rm -rf dist
