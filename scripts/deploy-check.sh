#!/usr/bin/env bash
# Checks everything under deploy/ offline:
#   - helm lint --strict of both charts (default values and each ci/*.yaml),
#   - helm template | kubeconform -strict against Kubernetes JSON schemas
#     generated here from the k8s.io/kubernetes module's OpenAPI document
#     (deploy/tools/k8sschema; ServiceMonitor gets a minimal hand-written
#     schema),
#   - terraform fmt -check -recursive deploy/terraform,
#   - tflint (bundled terraform ruleset only) in the module and each example.
# `terraform validate` is not run: it needs provider plugins, which cannot be
# downloaded here; deploy/terraform/terraform_test.go checks what it can.
#
# Tools come from scripts/deploy-tools.sh (cached in $TOOLS_BIN). Exit codes:
# 0 all passed, 1 a check failed, 3 a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLS_BIN=${TOOLS_BIN:-$HOME/.cache/infergate/bin}
export PATH="$TOOLS_BIN:$PATH"

# Kubernetes version whose API the manifests are validated against.
K8S_VERSION=${K8S_VERSION:-1.34.4}
SCHEMA_DIR=${K8S_SCHEMA_DIR:-$HOME/.cache/infergate/k8s-schemas/v$K8S_VERSION}

missing=()
for tool in helm kubeconform terraform tflint; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deploy-check: missing tools: ${missing[*]} (run scripts/deploy-tools.sh)" >&2
	exit 3
fi

failed=0
step() { echo "==> $*"; }
fail() { echo "FAIL: $*" >&2; failed=1; }

# --- Kubernetes schemas (generated once, cached) ---------------------------
# The charts' own CRDs get schemas too (the InferencePool).
CRDS=deploy/helm/infergate-tier1/files/inferencepool-crd.yaml
gen_version=$(cat deploy/tools/k8sschema/main.go $CRDS | sha256sum | cut -c1-16)
if [ "$(cat "$SCHEMA_DIR/.generated" 2>/dev/null)" != "$gen_version" ]; then
	step "generating Kubernetes $K8S_VERSION JSON schemas into $SCHEMA_DIR"
	tmp=$(mktemp -d)
	# Outside any module, so the main go.mod is never touched.
	moddir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	rmdir "$tmp"
	swagger="$moddir/api/openapi-spec/swagger.json"
	[ -f "$swagger" ] || { echo "deploy-check: no swagger.json in k8s.io/kubernetes@v$K8S_VERSION ($moddir)" >&2; exit 1; }
	rm -rf "$SCHEMA_DIR.tmp"
	go run ./deploy/tools/k8sschema -swagger "$swagger" -out "$SCHEMA_DIR.tmp" -crd "$CRDS"
	echo "$gen_version" >"$SCHEMA_DIR.tmp/.generated"
	rm -rf "$SCHEMA_DIR"
	mv "$SCHEMA_DIR.tmp" "$SCHEMA_DIR"
fi

# --- Helm ------------------------------------------------------------------
for chart in deploy/helm/infergate-tier1 deploy/helm/infergate-tier2; do
	name=$(basename "$chart")
	value_sets=("")
	for f in "$chart"/ci/*.yaml; do
		[ -e "$f" ] && value_sets+=("$f")
	done
	for values in "${value_sets[@]}"; do
		args=()
		label="$name (default values)"
		if [ -n "$values" ]; then
			args=(-f "$values")
			label="$name ($(basename "$values"))"
		fi
		step "helm lint --strict $label"
		helm lint --strict "${args[@]}" "$chart" || fail "helm lint $label"
		step "helm template | kubeconform -strict $label"
		if ! out=$(helm template "$name" "$chart" --namespace infergate "${args[@]}"); then
			fail "helm template $label"
			continue
		fi
		echo "$out" | kubeconform -strict -summary \
			-schema-location "$SCHEMA_DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
			|| fail "kubeconform $label"
	done
done

# --- Terraform -------------------------------------------------------------
step "terraform fmt -check -recursive deploy/terraform"
# No CLI configuration needed (and a TF_CLI_CONFIG_FILE naming a missing file
# only adds warnings).
TF_CLI_CONFIG_FILE=/dev/null terraform fmt -check -recursive -diff deploy/terraform || fail "terraform fmt"

for dir in deploy/terraform/modules/* deploy/terraform/examples/*; do
	[ -d "$dir" ] || continue
	step "tflint $dir"
	tflint --chdir="$dir" --config="$ROOT/deploy/terraform/.tflint.hcl" || fail "tflint $dir"
done

if [ "$failed" -ne 0 ]; then
	echo "deploy-check: FAILED" >&2
	exit 1
fi
echo "deploy-check: all checks passed"
