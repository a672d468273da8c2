#!/usr/bin/env bash
# Runs every Go fuzz target in the module, one at a time, for FUZZTIME each
# (default 30s; a count such as 2000x also works).
#
#   FUZZTIME=2s scripts/fuzz.sh            # what `make fuzz-smoke` runs
#   FUZZ=Parse scripts/fuzz.sh             # only targets matching a regexp
#
# Each new interesting input is minimised for at most FUZZMINIMIZETIME
# (default 100x: a hundred runs). Go's default, 60s per input, is longer
# than the whole run: a target that found an input early spent the rest of
# its FUZZTIME minimising it and fuzzed no more (shared/config FuzzDecode:
# 5,792 execs in 30s, then none; 23,706 with 100x).
#
# Targets are found with `go test -list '^Fuzz'` in every package whose test
# files declare a func Fuzz* (the grep only saves compiling test binaries
# that cannot hold one). A crash leaves its input in the package's
# testdata/fuzz/<Target>/, where plain `go test` replays it from then on.
#
# Go 1.26's fuzz coordinator can fail a run with a bare "context deadline
# exceeded" when -fuzztime ends while a worker is mid-input on a loaded
# machine (golang/go#75804, fixed in Go 1.27). Such a run wrote no crasher:
# it is reported as a flake, not a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
FUZZ=${FUZZ:-.}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-100x}
PARALLEL=${FUZZPARALLEL:+-parallel=$FUZZPARALLEL}

mapfile -t dirs < <(git ls-files -co --exclude-standard -- '*_test.go' 2>/dev/null | xargs -r grep -l '^func Fuzz' | xargs -r -n1 dirname | sort -u)
if [ ${#dirs[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets in the module"
	exit 1
fi
rel=("${dirs[@]/#/./}")
# One go test -list for all candidates: their test binaries build in parallel.
list=$($GO test -list '^Fuzz' "${rel[@]}" 2>&1) || { echo "fuzz: cannot list targets:"; echo "$list"; exit 1; }
declare -A dirOf
while read -r imp dir; do dirOf[$imp]=$dir; done < <($GO list -f '{{.ImportPath}} {{.Dir}}' "${rel[@]}")
targets=() pending=()
while read -r first second _; do
	case $first in
	Fuzz*) pending+=("$first") ;;
	ok)
		for name in "${pending[@]}"; do
			if grep -Eq -- "$FUZZ" <<<"$name"; then
				targets+=("$second $name")
			fi
		done
		pending=()
		;;
	esac
done <<<"$list"
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no targets match $FUZZ"
	exit 1
fi

echo "fuzz: ${#targets[@]} targets, $FUZZTIME each"
failed=() flaked=()
start=$SECONDS
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	dir=${dirOf[$pkg]}
	corpus="$dir/testdata/fuzz/$name"
	before=$(ls "$corpus" 2>/dev/null | sort)
	t0=$SECONDS
	out=$($GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" $PARALLEL "$pkg" 2>&1)
	rc=$?
	after=$(ls "$corpus" 2>/dev/null | sort)
	new=$(comm -13 <(echo "$before") <(echo "$after") | sed '/^$/d')
	execs=$(grep -o 'execs: [0-9]*' <<<"$out" | tail -1)
	if [ $rc -eq 0 ]; then
		echo "ok     $pkg $name ($((SECONDS - t0))s, ${execs:-no execs line})"
	elif [ -z "$new" ] && grep -q '^    context deadline exceeded$' <<<"$out" && ! grep -q -- '--- FAIL: .*/' <<<"$out"; then
		echo "flake  $pkg $name ($((SECONDS - t0))s): context deadline exceeded at -fuzztime end, no crasher (golang/go#75804)"
		flaked+=("$pkg $name")
	else
		echo "FAIL   $pkg $name ($((SECONDS - t0))s)"
		echo "$out" | grep -v '^fuzz: elapsed' | sed 's/^/       /'
		[ -n "$new" ] && echo "       crasher: $corpus/$new (replay: go test -run '$name/$new' $pkg)"
		failed+=("$pkg $name")
	fi
done
echo "fuzz: ${#targets[@]} targets in $((SECONDS - start))s: $((${#targets[@]} - ${#failed[@]} - ${#flaked[@]})) ok, ${#flaked[@]} flaked, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
