# infergate Makefile. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
BIN := bin/infergate
# The simulator, benchmarks and local stack (cmd/infergate-lab); production
# images carry BIN alone.
LAB_BIN := bin/infergate-lab
PKGS := ./...
# Tools built from the Go module proxy are cached here between runs.
TOOLS_BIN ?= $(HOME)/.cache/infergate/bin
export PATH := $(TOOLS_BIN):$(PATH)

.PHONY: all build lab test unit check lint run bench tools services fuzz fuzz-smoke proto
# Concurrent packages (limiter, tracker, scraper, stores, discovery): make
# test runs their tests under the race detector.
RACE_PKGS := ./tier1/gateway ./tier1/picker ./tier1/scrape ./tier1/extproc ./tier1/kube ./tier1/peers ./tier1/prefix ./tier2/ratelimit ./tier2/tenant ./tier2/discovery ./tier2/gateway ./tier2/route

all: build

build: lab
	$(GO) build -o $(BIN) ./cmd/infergate

## lab: the lab binary alone (sim, bench, experiment, report, loadbench, dev).
lab:
	$(GO) build -o $(LAB_BIN) ./cmd/infergate-lab

## test: everything CI checks (lint, unit, integration, deploy checks), the
## concurrent packages under the race detector.
test: tools lint
	$(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)
	$(GO) test -count=1 -timeout 30m $$($(GO) list $(PKGS) | grep -v -x -F $(foreach p,$(RACE_PKGS),-e github.com/infergate/infergate/$(patsubst ./%,%,$(p))))
	$(MAKE) fuzz-smoke

## image: the container image (linux/amd64 and linux/arm64, non-root, no
## shell) as an OCI archive in IMAGE_TAR, named ghcr.io/infergate/infergate:<VERSION file>;
## needs no Docker engine (`docker load -i bin/infergate-image.tar` to use it).
## The Dockerfile builds the same image with Docker.
IMAGE_TAR ?= bin/infergate-image.tar
.PHONY: image
image:
	$(GO) run ./deploy/tools/image -out $(IMAGE_TAR)

## unit: the fast Go tests only.
unit:
	$(GO) test -count=1 -short $(PKGS)

## check: the contributor's default before a commit: gofmt, vet,
## staticcheck, errcheck and the short tests under the race detector.
check: lint
	$(GO) test -count=1 -short -race $(PKGS)

## fuzz: every fuzz target in the module, FUZZTIME (default 30s) each.
fuzz:
	./scripts/fuzz.sh

## fuzz-smoke: every fuzz target for 2s (part of `make test`).
fuzz-smoke:
	FUZZTIME=2s ./scripts/fuzz.sh

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	@if command -v staticcheck >/dev/null; then staticcheck $(PKGS); else echo "staticcheck not installed (run: make tools)"; exit 1; fi
	@./scripts/errcheck.sh

## tools: build the real tools the tests need (Consul, staticcheck, errcheck, ...), cached in $(TOOLS_BIN).
tools:
	@./scripts/tools.sh
	@./scripts/deploy-tools.sh

## proto: regenerate tier1/peers/meshpb from mesh.proto (needs protoc: apt-get
## install protobuf-compiler); the plugins are built at the versions go.mod names.
proto:
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$$($(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative tier1/peers/meshpb/mesh.proto

## run: the all-in-one local stack on embedded defaults; PORT_BASE=18000 moves
## every port (default 8080: Tier 2 on 8080, admin 8081, metrics 8082, Tier 1s
## from 8090; 0 picks free ones; docs/local-stack.md); TRACE=1 prints every
## request's spans to the console (docs/tracing.md).
run: lab
	$(LAB_BIN) dev$(if $(PORT_BASE), --port-base $(PORT_BASE))$(if $(TRACE), --trace-console)

## bench: regenerate BENCHMARKS.md from scratch.
bench: lab
	BIN=$(LAB_BIN) ./scripts/bench.sh

## soak: the soak test alone, SOAK long (default 10m) at SOAK_RATE req/s; Tier 2's
## and a Tier 1's RSS and goroutines must stay flat (docs/reliability.md).
SOAK ?= 10m
SOAK_RATE ?= 20
.PHONY: soak
soak:
	INFERGATE_SOAK=$(SOAK) INFERGATE_SOAK_RATE=$(SOAK_RATE) $(GO) test -count=1 -timeout 60m -run '^TestSoak$$' -v ./integration
