# infergate Makefile. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
GO ?= go
BIN := bin/infergate
PKGS := ./...
# Tools built from the Go module proxy are cached here between runs.
TOOLS_BIN ?= $(HOME)/.cache/infergate/bin
export PATH := $(TOOLS_BIN):$(PATH)

.PHONY: all build test unit lint run bench tools services

all: build

build:
	$(GO) build -o $(BIN) ./cmd/infergate

## test: everything CI checks (lint, unit, integration, deploy checks).
test: tools lint
	$(GO) test -count=1 -timeout 30m $(PKGS)

## unit: the fast Go tests only.
unit:
	$(GO) test -count=1 -short $(PKGS)

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	@if command -v staticcheck >/dev/null; then staticcheck $(PKGS); else echo "staticcheck not installed (run: make tools)"; exit 1; fi

## tools: build the real tools the tests need (Consul, staticcheck, ...), cached in $(TOOLS_BIN).
tools:
	@./scripts/tools.sh
	@./scripts/deploy-tools.sh

## run: the all-in-one local stack on embedded defaults.
run: build
	$(BIN) dev

## bench: regenerate BENCHMARKS.md from scratch.
bench: build
	./scripts/bench.sh

## soak: the soak test alone, SOAK long (default 10m) at SOAK_RATE req/s; Tier 2's
## and a Tier 1's RSS and goroutines must stay flat (docs/reliability.md).
SOAK ?= 10m
SOAK_RATE ?= 20
.PHONY: soak
soak:
	INFERGATE_SOAK=$(SOAK) INFERGATE_SOAK_RATE=$(SOAK_RATE) $(GO) test -count=1 -timeout 60m -run '^TestSoak$$' -v ./integration
