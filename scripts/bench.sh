#!/usr/bin/env bash
# Regenerates BENCHMARKS.md from scratch: every scenario and both shared
# traces, infergate vs round-robin, gie-v1.5 and llm-d over several seeds, with
# 95% confidence intervals, the raw JSON, SVG plots, the exact commands, the
# commit and the machine. `make bench` runs it after building bin/infergate-lab.
#
# Only what the docs display or link is written under docs/: each run's JSON
# report and its TTFT CDF plot ($BENCH_DOCS). Everything else (per-pod load
# plots, the sensitivity runs' JSON) goes to $BENCH_OUT, which git ignores.
#
# Environment:
#   INFERGATE_TRACES  directory holding the public traces (default ../shared/traces,
#                     relative to the main checkout when run in a git worktree)
#   BENCH_SEEDS       seeds per scenario (default 5)
#   BENCH_SEEDS_LARGE seeds for scale-1000, ~1 min of CPU per simulation (default 3)
#   BENCH_DOCS        directory for the JSON reports and TTFT CDF plots the docs
#                     link (default docs/bench)
#   BENCH_OUT         directory for the other generated files: per-pod load plots,
#                     the sensitivity runs' JSON (default bench-out, git-ignored)
#   BENCH_SCENARIOS   space-separated subset of scenarios (default all)
#   BENCH_SENSITIVITY 0 skips the realism sensitivity table (docs/benchmarks.md)
#
# Published vs tuning data: the published run uses scenario seeds 1-5, the
# Azure code trace's first 30 minutes and the Mooncake trace's first 10
# minutes. Tune on seeds 101-110 (--seed-base 101), the Azure trace from
# minute 30 and Mooncake minutes 10-30 (`infergate-lab experiment --start 30m`,
# `--start 10m --duration 10m`); never on the published ones.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/infergate-lab}
SEEDS=${BENCH_SEEDS:-5}
SEEDS_LARGE=${BENCH_SEEDS_LARGE:-3}
OUT=${BENCH_OUT:-bench-out}
DOCS_OUT=${BENCH_DOCS:-docs/bench}
TRACES=${INFERGATE_TRACES:-../shared/traces}
if [ -z "${INFERGATE_TRACES:-}" ] && [ ! -d "$TRACES" ]; then
	# In a git worktree, ../shared/traces is relative to the main checkout.
	common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
	if [ -n "$common" ] && [ -d "$(dirname "$common")/../shared/traces" ]; then
		TRACES=$(cd "$(dirname "$common")/../shared/traces" && pwd)
	fi
fi
POLICIES=round-robin,gie-v1.5,llm-d,infergate
MD=BENCHMARKS.md
README=README.md
DOC=docs/benchmarks.md
HOMO=bench/fleets/h100x8-llama8b.yaml
TMP=$(mktemp "${TMPDIR:-/tmp}/benchmarks.XXXXXX")
trap 'rm -f "$TMP" "$TMP.glance" "$TMP.readme" "$TMP.sens" "$TMP.heldout"' EXIT

if [ ! -x "$BIN" ]; then
	echo "bench.sh: $BIN not found; run make lab (or make bench)" >&2
	exit 1
fi
# Read the tree's state before the old report is removed, or the removal
# itself would count as an uncommitted change.
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=""
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then dirty=" (working tree had uncommitted changes)"; fi
# Remove only what this script writes (the JSON reports and SVG plots).
mkdir -p "$OUT" "$DOCS_OUT"
rm -f "$OUT"/*.json "$OUT"/*.svg "$DOCS_OUT"/*.json "$DOCS_OUT"/*.svg
SCENARIOS=${BENCH_SCENARIOS:-$("$BIN" bench --list | awk '{print $1}')}
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t0=$(date +%s)

reports=()
section() { # title, command words...
	local title=$1 json=$2
	shift 2
	echo "bench.sh: $title" >&2
	local s0=$(date +%s)
	{
		echo
		echo "### $title"
		echo
		echo '```sh'
		echo "$*"
		echo '```'
		echo
		"$@" --format markdown --json-out "$json"
		echo
		echo "Wall time: $(($(date +%s) - s0)) s for all seeds and policies. Raw data: [\`$(basename "$json")\`]($json)."
		echo
		local base
		base=$(basename "$json" .json)
		# --plots writes every plot to $OUT; the docs show the TTFT CDF.
		if [ ! "$OUT" -ef "$DOCS_OUT" ]; then cp "$OUT/$base-ttft-cdf.svg" "$DOCS_OUT/"; fi
		echo "![TTFT CDF]($DOCS_OUT/$base-ttft-cdf.svg)"
		echo
		echo "Per-pod load plots (first seed, one per policy): \`$OUT/$base-load-<policy>.svg\`, written by \`make bench\`, not kept in git."
	} >>"$TMP"
	reports+=("$json")
}

for s in $SCENARIOS; do
	n=$SEEDS
	if [ "$s" = scale-1000 ]; then n=$SEEDS_LARGE; fi
	section "$s" "$DOCS_OUT/$s.json" "$BIN" bench --scenario "$s" --policies "$POLICIES" --seeds "$n" --plots "$OUT"
done

# Each public trace on the mixed fleet (4 H100 + 4 A10G, the default) and
# on the homogeneous one (8 H100).
trace_sections=0
trace() { # file, name, title, extra args...
	local file=$1 name=$2 title=$3
	shift 3
	if [ ! -f "$TRACES/$file" ]; then
		echo "bench.sh: $TRACES/$file absent, skipping" >&2
		return
	fi
	section "trace: $title, 4 H100 + 4 A10G" "$DOCS_OUT/$name-mixed.json" \
		"$BIN" bench --trace "$TRACES/$file" --name "$name-mixed" "$@" --policies "$POLICIES" --seeds "$SEEDS" --plots "$OUT"
	section "trace: $title, 8 H100" "$DOCS_OUT/$name-h100x8.json" \
		"$BIN" bench --trace "$TRACES/$file" --name "$name-h100x8" --fleet "$HOMO" "$@" --policies "$POLICIES" --seeds "$SEEDS" --plots "$OUT"
	trace_sections=$((trace_sections + 1))
}
trace azure_llm_code_2023.csv trace-code "Azure LLM code 2023 (first 30 min)" --duration 30m
trace mooncake_conversation.jsonl trace-conversation "Mooncake conversation (first 10 min)" --duration 10m

# Held-out checks: scenarios kept out of the published catalogue, run on
# seeds nobody tunes on (201-), with the policies each check compares. Not
# in the glance tables.
HELDOUT_SEEDS=${BENCH_SEEDS_HELDOUT:-5}
: >"$TMP.heldout"
heldout() { # scenario, policies, title
	local s=$1 policies=$2 title=$3 json="$DOCS_OUT/heldout-$1.json" s0
	s0=$(date +%s)
	echo "bench.sh: held out: $s" >&2
	{
		echo
		echo "### $title"
		echo
		echo '```sh'
		echo "$BIN bench --scenario $s --policies $policies --seeds $HELDOUT_SEEDS --seed-base 201"
		echo '```'
		echo
		"$BIN" bench --scenario "$s" --policies "$policies" --seeds "$HELDOUT_SEEDS" --seed-base 201 --format markdown --json-out "$json"
		echo
		echo "Wall time: $(($(date +%s) - s0)) s. Raw data: [\`$(basename "$json")\`]($json)."
	} >>"$TMP.heldout"
}
if [ -z "${BENCH_SCENARIOS:-}" ]; then
	heldout identical-pods-noisy round-robin,least-request,infergate \
		"identical-pods-noisy: four identical H100 with engine noise, seeds 201–$((200 + HELDOUT_SEEDS))"
	heldout cache-pressure-32b round-robin,least-request,llm-d,llm-d-precise,infergate,infergate-precise \
		"cache-pressure-32b: precise (KV events) vs approximate prefix routing, seeds 201–$((200 + HELDOUT_SEEDS))"
fi

# replace_between FILE NAME CONTENT-FILE: replaces the lines between
# <!-- bench:NAME:start --> and <!-- bench:NAME:end --> in FILE.
replace_between() {
	local file=$1 name=$2 content=$3 out
	out=$(mktemp "${TMPDIR:-/tmp}/bench-replace.XXXXXX")
	awk -v s="<!-- bench:$name:start -->" -v e="<!-- bench:$name:end -->" -v f="$content" '
		$0 == s { print; while ((getline line < f) > 0) print line; skip = 1; next }
		$0 == e { skip = 0 }
		!skip { print }' "$file" >"$out"
	cat "$out" >"$file"
	rm -f "$out"
}

if [ "${BENCH_SENSITIVITY:-1}" != 0 ]; then
	# How each realism knob and the production inputs move each policy.
	echo "bench.sh: sensitivity" >&2
	sens=()
	for s in mixed-gpu-8b shared-prefix-8b bursty-70b; do
		for knob in off jitter spread stagger late default engine-inputs; do
			args=(--realism "$knob")
			if [ "$knob" = engine-inputs ]; then args=(--realism default --inputs engine); fi
			j="$OUT/sensitivity-$s-$knob.json"
			"$BIN" experiment --scenario "$s" --name "$s · $knob" "${args[@]}" --policies "$POLICIES" --seeds 3 --json-out "$j" >/dev/null
			sens+=("$j")
		done
	done
	{
		echo
		echo "Generated by \`make bench\` at \`$commit\`$dirty: seeds 1–3, means over seeds, ms. \`off\` is no realism;"
		echo "a knob name is that knob alone at its default strength; \`default\` is all four (the published"
		echo "setting); \`engine-inputs\` is \`default\` with the oracle inputs (\`--inputs engine\`) instead of"
		echo "production inputs. Every other row runs production inputs."
		echo
		"$BIN" report glance "${sens[@]}"
		echo
	} >"$TMP.sens"
	replace_between "$DOC" sensitivity "$TMP.sens"
	rm -f "$TMP.sens"
fi

"$BIN" report glance "${reports[@]}" >"$TMP.glance"
{
	echo
	echo "Generated by \`make bench\` at \`$commit\`$dirty ($SEEDS seeds; realism on; production inputs). P99 TTFT and"
	echo "P99 end-to-end latency in ms, means over seeds; full tables with 95% confidence intervals, the no-queue"
	echo "floor and the exact commands in [BENCHMARKS.md](BENCHMARKS.md)."
	echo
	cat "$TMP.glance"
	echo
} >"$TMP.readme"
replace_between "$README" glance "$TMP.readme"
{
	echo "# infergate routing benchmarks"
	echo
	echo "Generated by \`make bench\` (scripts/bench.sh) — do not edit by hand. How the benchmark works, what each"
	echo "scenario models and why: [docs/benchmarks.md](docs/benchmarks.md). Everything is simulated (sim/engine in"
	echo "virtual time); the policies run the same scheduling code as Tier 1 (tier1/picker)."
	echo
	echo "- Commit: \`$commit\`$dirty"
	echo "- Generated: $started, total wall time $(($(date +%s) - t0)) s"
	echo "- Machine: $(uname -srm), ${cpu:-unknown CPU}, $(nproc) CPUs, $(go version 2>/dev/null | awk '{print $3}' || echo 'go ?')"
	echo "- Seeds: $SEEDS per scenario ($SEEDS_LARGE for scale-1000); figures are means over seeds ± the 95% CI half-width (Student t)."
	echo "  A trace is one fixed stream: its seeds vary only the policies' tie-breaks."
	echo "- Traces: $trace_sections of 2 found under \`$TRACES\`, each replayed on the mixed fleet and on 8 H100."
	echo "- Conditions: realism on (engine step jitter σ 3%, pods ±3%, staggered scrapes, 2% late scrapes) and"
	echo "  production scheduling inputs: every policy sees only what Tier 1 computes from the request text"
	echo "  (generated from each request's token counts and shared prefixes); see [docs/benchmarks.md](docs/benchmarks.md#realism-knobs)."
	echo "- Published data: scenario seeds 1–$SEEDS, the Azure trace's first 30 minutes, the Mooncake trace's first 10"
	echo "  minutes. Tuning uses other seeds (101–110) and other windows (Azure from minute 30, Mooncake minutes 10–30)."
	echo
	echo "## At a glance"
	echo
	echo "P99 TTFT and P99 end-to-end latency per policy (means over seeds, ms); full tables below."
	echo
	cat "$TMP.glance"
	echo
	echo "## Targets"
	echo
	echo "Reported, not asserted. Ratios are infergate's P99 TTFT over the baseline's (means over seeds). The"
	echo "floor-bound ratio is the no-queue floor's P99 over the baseline's (the floor runs each pod type at its fastest"
	echo "pod's speed, step jitter at its mean): no router can do better, so a target below it cannot be met in that"
	echo "scenario. Why targets are missed: [docs/benchmarks.md](docs/benchmarks.md#reading-the-results)."
	echo
	"$BIN" report targets "${reports[@]}"
	echo
	echo "## Results"
	cat "$TMP"
	if [ -s "$TMP.heldout" ]; then
		echo
		echo "## Held-out checks"
		echo
		echo "Scenarios outside the published catalogue, on seeds neither published above nor tuned on (201 on),"
		echo "with the policies each compares: \`infergate-precise\` is infergate's default profile with the"
		echo "precise-prefix scorer on an exact index of the engines' KV-cache events (Tier 1's \`kv_events\`),"
		echo "\`llm-d-precise\` llm-d's precise-prefix-cache scorer on the same events. What each shows:"
		echo "[docs/benchmarks-decisions.md](docs/benchmarks-decisions.md#held-out-checks-engine-noise-and-precise-prefixes)."
		cat "$TMP.heldout"
	fi
} >"$MD"
echo "bench.sh: wrote $MD, $DOCS_OUT/, $OUT/, the glance table in $README and the sensitivity table in $DOC in $(($(date +%s) - t0)) s" >&2
