#!/usr/bin/env bash
# Unchecked errors in the module's non-test, non-generated Go code, with
# errcheck (built by scripts/tools.sh). Part of `make lint`, and so of
# `make check` and `make test`.
#
# An error is handled (returned, wrapped with %w, logged, counted) or
# dropped on purpose with `_ = f()`, which errcheck accepts as explicit;
# say why in a comment on that line. Calls that can never lose an error,
# and files not swept yet, are listed in scripts/errcheck.exclude, each
# with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
ERRCHECK=${ERRCHECK:-errcheck}
if ! command -v "$ERRCHECK" >/dev/null; then
	echo "errcheck not installed (run: make tools)"
	exit 1
fi

exclude=scripts/errcheck.exclude
funcs=$(mktemp)
trap 'rm -f "$funcs"' EXIT
files=()
prints=()
bad=0
while IFS= read -r line; do
	case $line in '' | //*) continue ;; esac
	if [[ $line != *' // '?* ]]; then
		echo "$exclude: no reason given (\" // why\"): $line"
		bad=1
		continue
	fi
	entry=${line%% // *}
	entry=${entry%"${entry##*[![:space:]]}"}
	if [[ $entry == file:* ]]; then
		files+=("${entry#file:}")
	elif [[ $entry == print:* ]]; then
		prints+=("${entry#print:}")
	else
		echo "$entry" >>"$funcs"
	fi
done <"$exclude"
[ $bad -eq 0 ] || exit 1

rc=0
out=$("$ERRCHECK" -ignoretests -ignoregenerated -exclude "$funcs" ./... 2>&1) || rc=$?
if [ $rc -gt 1 ]; then
	echo "$out"
	exit $rc
fi
while IFS= read -r line; do
	[ -z "$line" ] && continue
	file=${line%%:*}
	skip=0
	for re in "${files[@]}"; do
		if grep -Eq "$re" <<<"$file"; then
			skip=1
			break
		fi
	done
	if [[ ${line#*$'\t'} =~ ^fmt\.Fprint(f|ln)?\( ]]; then
		for re in "${prints[@]}"; do
			if grep -Eq "$re" <<<"$file"; then
				skip=1
				break
			fi
		done
	fi
	[ $skip -eq 1 ] && continue
	echo "$line"
	bad=1
done <<<"$out"
if [ $bad -ne 0 ]; then
	echo "errcheck: handle these errors, or drop one with \`_ =\` and say why on the line (scripts/errcheck.sh)"
fi
exit $bad
