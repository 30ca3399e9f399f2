# guestbackup's developer entry points. `make test` is what CI runs.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# The tests find the test bed's binaries through the environment this prints.
TOOLS_ENV = eval "$$(hack/tools.sh env)"
# Packages that start API servers and Kopia servers take minutes on 2 cores;
# test/kubevirt, which boots guests under software emulation, took 43 min on
# a loaded 2-core machine. The timeout catches a hang (with every goroutine's
# stack), within CI's own 90-minute limit; it is not a speed target.
GO_TEST_FLAGS ?= -count=1 -timeout=75m

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: ## Build or install the test bed's tools into the cache (~/.cache/guestbackup).
	hack/tools.sh install

.PHONY: tools-cluster
tools-cluster: tools ## Also build KubeVirt's images for the cluster backend (hack/kubevirt-images.sh).
	hack/tools.sh install-cluster

.PHONY: generate
generate: tools ## Regenerate deepcopy, CRDs, RBAC and the test bed's third-party CRDs.
	hack/generate.sh

.PHONY: verify-generated
verify-generated: tools ## Fail when a generated file is stale or was edited by hand.
	hack/verify-generated.sh

.PHONY: build
build: ## Build every package and both binaries into bin/.
	go build ./...
	go build -o bin/controller ./cmd/controller
	go build -o bin/webhook ./cmd/webhook

.PHONY: image
image: tools ## Build the image as an OCI layout tarball (bin/guestbackup-image.tar), without a container engine.
	hack/image.sh

.PHONY: vet
vet: ## Run go vet and check formatting.
	go vet ./...
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi

.PHONY: lint-chart
lint-chart: tools ## Lint the Helm chart strictly.
	$(TOOLS_ENV); "$$GUESTBACKUP_HELM" lint --strict charts/guestbackup

.PHONY: test
# test/cluster (real KubeVirt on the real node) runs in make test; a plain
# `go test ./...` skips it unless GUESTBACKUP_E2E=cluster selects it, because
# it needs tools-cluster's images.
#
# go test builds and runs packages in the order they are named, -p (the
# number of cores) at a time. The two suites that boot guests are the longest
# by far, so they are named first: the rest then fills the slot test/cluster
# frees while test/kubevirt runs, instead of test/kubevirt starting last.
LONG_TEST_PACKAGES = ./test/kubevirt ./test/cluster
test: tools-cluster verify-generated vet lint-chart ## Run every test against the real test bed, the cluster backend included (what CI runs).
	$(TOOLS_ENV); GUESTBACKUP_E2E=cluster go test $(GO_TEST_FLAGS) $(LONG_TEST_PACKAGES) ./...

.PHONY: test-cluster
test-cluster: tools-cluster ## Run test/cluster: the end-to-end stories on real KubeVirt on the test bed's real node.
	$(TOOLS_ENV); GUESTBACKUP_E2E=cluster go test $(GO_TEST_FLAGS) ./test/cluster -ginkgo.v

# MODE=cluster runs the demo on real KubeVirt on the test bed's real node.
MODE ?= local
DEMO_TOOLS = $(if $(filter cluster,$(MODE)),tools-cluster,tools)
DEMO_ARGS = $(if $(filter cluster,$(MODE)),-cluster)

.PHONY: demo
demo: $(DEMO_TOOLS) ## Run the whole product locally and narrate it; MODE=cluster: on real KubeVirt on the test bed's node.
	$(TOOLS_ENV); go run ./hack/demo $(DEMO_ARGS) $(ARGS)

.PHONY: bench
bench: tools ## Run the benchmarks and print their figures.
	$(TOOLS_ENV); go test -run='^$$' -bench=. -benchmem -count=1 -timeout=30m ./...
