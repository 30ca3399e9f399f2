# guestbackup's developer entry points. `make test` is what CI runs.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# The tests find the test bed's binaries through the environment this prints.
TOOLS_ENV = eval "$$(hack/tools.sh env)"

# Every Go build here (the tests, vet, the demo, the binaries) is static and
# trimmed, as the test bed's own tools (hack/tools.sh), the image and
# KubeVirt's images are: Go's build cache keys a package by these settings,
# so one setting compiles each package a test and a tool share once, not
# once per setting. Kubernetes' and Kopia's packages are most of a cold
# build. Override on the command line, e.g. make unit CGO_ENABLED=1.
export CGO_ENABLED ?= 0
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
# make test WHAT=./pkg/mutate/... (or PKG=) runs those packages only.
WHAT ?= $(PKG)

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: ## Build or install every tool of the test bed into the cache (~/.cache/guestbackup); TOOLS= names some (hack/tools.sh list).
	hack/tools.sh install $(or $(TOOLS),all)

.PHONY: tools-cluster
tools-cluster: ## Also build KubeVirt's images for the cluster backend (hack/kubevirt-images.sh).
	hack/tools.sh install all cluster

.PHONY: generate
generate: ## Regenerate deepcopy, CRDs, RBAC and the test bed's third-party CRDs.
	hack/tools.sh install controller-gen
	hack/generate.sh

.PHONY: verify-generated
verify-generated: ## Fail when a generated file is stale or was edited by hand.
	hack/tools.sh install controller-gen
	hack/verify-generated.sh

.PHONY: build
build: ## Build every package, both binaries and the kubectl plugin (kubectl-guestbackup: put it on your PATH) into bin/.
	go build ./...
	go build -o bin/controller ./cmd/controller
	go build -o bin/webhook ./cmd/webhook
	go build -o bin/kubectl-guestbackup ./cmd/kubectl-guestbackup

.PHONY: plugin-release
plugin-release: ## Build the kubectl plugin for krew's platforms into bin/plugin, with its krew manifest; VERSION=v1.2.3 URL_BASE=https://... (where the archives are uploaded).
	go run ./hack/plugin-release -version "$(VERSION)" -url-base "$(URL_BASE)" -out bin/plugin

.PHONY: image
image: ## Build the image as an OCI layout tarball (bin/guestbackup-image.tar), without a container engine.
	hack/tools.sh install kopia kopia-arm64
	hack/image.sh

.PHONY: vet
vet: ## Run go vet and check formatting.
	go vet ./...
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt needed: $$unformatted" >&2; exit 1; fi

.PHONY: lint-chart
lint-chart: ## Lint the Helm chart strictly.
	hack/tools.sh install helm
	$(TOOLS_ENV); "$$GUESTBACKUP_HELM" lint --strict charts/guestbackup

.PHONY: unit
unit: ## Run every test that needs no tool of the test bed (go test -short): no API server, no Kopia, no guest, no build of one.
	go test -short -count=1 ./...

.PHONY: test
test: ## Run every test against the real test bed, the cluster backend included (what CI runs); WHAT=./pkg/mutate/... runs those packages only, building only their tools.
	hack/test.sh $(WHAT)

.PHONY: test-cluster
test-cluster: ## Run test/cluster: the end-to-end stories on real KubeVirt on the test bed's real node.
	GO_TEST_FLAGS="-timeout=75m -ginkgo.v" hack/test.sh ./test/cluster

# MODE=cluster runs the demo on real KubeVirt on the test bed's real node.
# The demo builds only the tools it runs (hack/tools.sh's demo sets), as its
# mode and ARGS select: -cluster, -node, or -image=kopia (the test guest).
MODE ?= local
DEMO_ARGS = $(if $(filter cluster,$(MODE)),-cluster)
DEMO_TOOLS = $(strip $(if $(findstring -cluster,$(DEMO_ARGS) $(ARGS)),demo-cluster,\
	$(if $(findstring -node,$(ARGS)),demo-node,\
	demo $(if $(findstring kopia,$(ARGS)),guest))))

.PHONY: demo
demo: ## Run the whole product locally and narrate it; MODE=cluster: on real KubeVirt on the test bed's node.
	hack/tools.sh install $(DEMO_TOOLS)
	@# The server pod's binary too: the demo builds it as a test does, from Go's build cache.
	hack/tools.sh step demo 45 go build -o bin/ ./hack/demo ./cmd/server
	@# Only the tools built above: the test bed checks for no others.
	eval "$$(hack/tools.sh env $(DEMO_TOOLS))"; bin/demo $(DEMO_ARGS) $(ARGS)

.PHONY: bench
bench: tools ## Run the benchmarks and print their figures.
	$(TOOLS_ENV); go test -run='^$$' -bench=. -benchmem -count=1 -timeout=60m ./...
