# edgepipe: `make demo` runs the whole pipeline against the built-in platform
# simulator (needs only Go); `make test` runs every test, integration tests
# included, against real ClickHouse, Prometheus and kcat (`make deps`).

GO        ?= go
BIN       ?= bin
CMDS      := exporter rtld-receiver platform-sim
# The version stamp: `git describe` when a tag (v*) is reachable (e.g. v0.1.0,
# v0.1.0-3-gabc1234-dirty), otherwise v<the VERSION file> (the Dockerfile's
# fallback too; internal/deploytest checks they agree).
VERSION   ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v$$(cat VERSION))
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null)
# The build date is the commit's (SOURCE_DATE_EPOCH, as reproducible builds
# define it), so one commit builds the same binaries and the same image;
# outside git, the time of the build.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
BUILDDATE ?= $(shell date -u $(if $(SOURCE_DATE_EPOCH),-d @$(SOURCE_DATE_EPOCH)) +%Y-%m-%dT%H:%M:%SZ)
# --version, the landing page and <program>_build_info read prometheus/common/version.
PVPKG     := github.com/prometheus/common/version
LDFLAGS   := -s -w \
	-X $(PVPKG).Version=$(VERSION) -X $(PVPKG).Revision=$(REVISION) -X $(PVPKG).BuildDate=$(BUILDDATE)
# The container image (`make image`): the Helm chart's default image is
# $(IMAGE_REPOSITORY):<its appVersion, the VERSION file>, which is IMAGE at a
# release; between releases the tag is `make version` without its "v".
IMAGE_REPOSITORY ?= ghcr.io/edgepipe/edgepipe
IMAGE_TAG        ?= $(patsubst v%,%,$(VERSION))
IMAGE            ?= $(IMAGE_REPOSITORY):$(IMAGE_TAG)
IMAGE_ARCHIVE    ?= $(BIN)/edgepipe-image.tar
PODMAN           ?= podman
TEST_TIMEOUT ?= 25m
TEST_P       ?= 2
FUZZTIME     ?= 10s
BENCH        ?= .
BENCHTIME    ?= 1s
# The golangci-lint that `make deps` installs (go install, into Go's bin
# directory) and `make lint` runs; .golangci.yml is written for v2.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT         ?= $(shell $(GO) env GOPATH)/bin/golangci-lint
# ClickHouse 26.x as a library for the tests (npm; internal/testenv.ChDBPackage).
CHDB_PACKAGE          ?= @chdb/lib-linux-x64-gnu@26.7.3-stable.1

.PHONY: all build version image image-ref demo docs test deps bench bench-scrape bench-scale bench-clickhouse bench-receiver bench-all fuzz lint fmt vet golangci-lint helm-lint clean help

all: lint build test

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build the binaries into ./bin (static, version-stamped)
	@mkdir -p $(BIN)
	@for c in $(CMDS); do \
		echo "go build -o $(BIN)/$$c ./cmd/$$c"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$$c ./cmd/$$c || exit 1; \
	done

version: ## print the version `make build` stamps
	@echo $(VERSION)

# The image's architecture is the binaries' (e.g. GOARCH=arm64 make image);
# build-image itself runs on this machine.
image: build ## build the container image offline from ./bin into $(IMAGE_ARCHIVE), tagged $(IMAGE), and load it into podman if installed
	GOOS= GOARCH= $(GO) run ./internal/ociimage/cmd/build-image -bin $(BIN) -o $(IMAGE_ARCHIVE) -tag $(IMAGE) \
		-version $(VERSION) -revision '$(REVISION)' -created $(BUILDDATE)
	@if command -v $(PODMAN) >/dev/null 2>&1; then \
		echo "$(PODMAN) load -i $(IMAGE_ARCHIVE)"; $(PODMAN) load -q -i $(IMAGE_ARCHIVE) || exit 1; \
	else \
		echo "$(PODMAN) not found: load $(IMAGE_ARCHIVE) with podman load -i or docker load -i"; \
	fi

image-ref: ## print the image reference `make image` tags
	@echo $(IMAGE)

demo: ## run simulator, exporter and receiver on loopback (and Prometheus with the chart's alerts, ClickHouse and Kafka, if installed); Ctrl-C stops all
	@BIN=$(BIN) GO=$(GO) MAKE=$(MAKE) exec ./scripts/demo.sh

docs: build ## write docs/reference/ (every flag and metric) from the programs themselves; needs clickhouse-server (`make deps`)
	$(GO) run ./scripts/gendocs -bin $(BIN)

test: ## the whole suite, integration tests included (real services; see `make deps`)
	$(GO) test -count=1 -p $(TEST_P) -timeout $(TEST_TIMEOUT) ./...

deps: ## install clickhouse-server clickhouse-client prometheus kcat zookeeper podman runc (apt), chDB's libchdb.so (npm: ClickHouse 26.x), helm and golangci-lint (go install), build the test OpenTelemetry Collector; only what is missing
	@GO=$(GO) GOLANGCI_LINT_VERSION=$(GOLANGCI_LINT_VERSION) CHDB_PACKAGE=$(CHDB_PACKAGE) ./scripts/deps.sh

bench: bench-scrape bench-scale bench-clickhouse bench-receiver ## the benchmarks whose results docs/performance.md records

bench-scrape: ## Prometheus scrape time and memory per series vs a bare client_golang collector (100k, 1M series)
	$(GO) test -run '^$$' -bench 'BenchmarkScrape' -benchtime 3x -timeout 60m ./internal/sinks/prometheus

bench-scale: ## the exporter binary against 1,000 simulated environments in 10 properties, default and lean config: requests, poll time, series, scrape, RSS, ClickHouse rows (~15 min)
	$(GO) test -run '^$$' -bench 'BenchmarkScale' -benchtime 1x -timeout 90m ./internal/scalebench

bench-clickhouse: ## exporter rows/s inserted into ClickHouse for the widest dataset
	$(GO) test -run '^$$' -bench 'BenchmarkInsertEdgeUsageByCountry' -benchtime 3s -timeout 30m ./internal/sinks/clickhouse/metrictables

bench-receiver: ## receiver records/s, CPU and peak RSS into Kafka and ClickHouse vs a bare gunzip+decode server (in-process and the binary over https), and RSS with 16 x 29 MB batches
	$(GO) test -run '^$$' -bench '^BenchmarkIngest(HTTPS)?$$' -benchtime 300x -count 2 -timeout 60m ./internal/rtld/receiver
	$(GO) test -run '^$$' -bench '^BenchmarkIngestBigBatches$$' -benchtime 16x -count 2 -timeout 60m ./internal/rtld/receiver

bench-all: ## every benchmark of the module (BENCH=regexp BENCHTIME=…)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem -timeout 60m ./...

fuzz: ## run every Fuzz target for FUZZTIME each
	@FUZZTIME=$(FUZZTIME) GO=$(GO) ./scripts/fuzz.sh

lint: fmt vet golangci-lint ## gofmt check, go vet and golangci-lint with .golangci.yml (`make deps` installs it)

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './vendor/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi; echo "gofmt: clean"

vet:
	$(GO) vet ./...

golangci-lint:
	@if [ ! -x "$(GOLANGCI_LINT)" ]; then \
		echo "$(GOLANGCI_LINT) not found: run make deps (it installs golangci-lint $(GOLANGCI_LINT_VERSION))" >&2; exit 1; \
	fi
	@have=$$("$(GOLANGCI_LINT)" version --short 2>/dev/null); if [ "v$$have" != "$(GOLANGCI_LINT_VERSION)" ]; then \
		echo "$(GOLANGCI_LINT) is v$$have, .golangci.yml is checked with $(GOLANGCI_LINT_VERSION): run make deps" >&2; exit 1; \
	fi
	$(GOLANGCI_LINT) run ./...

helm-lint: ## helm lint + helm template of the chart with every ci/ values file, asserting the rendered objects (needs helm: `make deps`)
	$(GO) test -count=1 -run 'TestChart|TestDockerfile' ./internal/deploytest/

clean:
	rm -rf $(BIN)
