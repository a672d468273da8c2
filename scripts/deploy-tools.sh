#!/usr/bin/env bash
# Builds the deploy tooling (Helm, kubeconform, tflint, Terraform) from the Go
# module proxy with `go install`, caching each binary in $TOOLS_BIN (default
# ~/.cache/infergate/bin) as <name>-<version> plus a <name> symlink, so only
# the first run on a machine pays for the builds. The tools never enter the
# main module's go.mod. Build times are printed (and appended to
# $TOOLS_BIN/build-times.log).
#
# Usage: scripts/deploy-tools.sh [helm|kubeconform|tflint|terraform ...]
#        (no arguments builds all four)
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS_BIN=${TOOLS_BIN:-$HOME/.cache/infergate/bin}
mkdir -p "$TOOLS_BIN"

# Versions. Keep these in sync with docs/deploy.md.
HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
TFLINT_VERSION=v0.64.0
# Terraform 1.5.7 is the last MPL-2.0 release: never move to anything newer.
TERRAFORM_VERSION=v1.5.7

build() { # name version package
	local name=$1 version=$2 pkg=$3
	local out="$TOOLS_BIN/$name-$version"
	if [ ! -x "$out" ]; then
		echo "deploy-tools: building $name $version (cached afterwards in $TOOLS_BIN)"
		local start=$SECONDS gobin="$TOOLS_BIN/.gobin-$name"
		rm -rf "$gobin"
		# Run outside the repo so the main module's go.mod is never consulted
		# or touched; -mod=mod lets go install resolve the tool's own go.mod.
		(cd "$TOOLS_BIN" && GOBIN="$gobin" GOFLAGS="-mod=mod -buildvcs=false" \
			go install -trimpath -ldflags="-s -w" "$pkg@$version")
		mv "$gobin/$(basename "$pkg")" "$out.tmp"
		rm -rf "$gobin"
		mv "$out.tmp" "$out"
		local took=$((SECONDS - start))
		echo "deploy-tools: built $name $version in ${took}s"
		echo "$(date -u +%FT%TZ) $name $version ${took}s" >>"$TOOLS_BIN/build-times.log"
	fi
	ln -sf "$name-$version" "$TOOLS_BIN/$name"
}

want() { [ $# -eq 1 ] && return 0; local t; for t in "${@:2}"; do [ "$t" = "$1" ] && return 0; done; return 1; }

for arg in "$@"; do
	case $arg in
	helm | kubeconform | tflint | terraform) ;;
	*) echo "deploy-tools: unknown tool '$arg' (known: helm kubeconform tflint terraform)" >&2; exit 2 ;;
	esac
done

want helm "$@" && build helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
want kubeconform "$@" && build kubeconform "$KUBECONFORM_VERSION" github.com/yannh/kubeconform/cmd/kubeconform
want tflint "$@" && build tflint "$TFLINT_VERSION" github.com/terraform-linters/tflint
want terraform "$@" && build terraform "$TERRAFORM_VERSION" github.com/hashicorp/terraform
exit 0
