#!/usr/bin/env bash
# Runs every Fuzz target of the module for FUZZTIME (default 10s) each.
# Targets are discovered with `go test -list '^Fuzz' ./...` (or $FUZZPKGS).
set -euo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
cd "$(dirname "$0")/.."

# `go test -list` prints a package's matching names, then "ok <pkg> <time>".
listing=$($GO test -list '^Fuzz' ${FUZZPKGS:-./...})
pending=()
runs=()
while read -r first second _; do
	case "$first" in
	Fuzz*) pending+=("$first") ;;
	ok)
		for target in "${pending[@]}"; do runs+=("$second $target"); done
		pending=()
		;;
	esac
done <<<"$listing"

# Go 1.26's fuzzing coordinator can report the end of -fuzztime itself as a
# failure, a bare "context deadline exceeded" with no input written, when
# the machine is busy at that moment (go.dev/issue/75804, fixed in Go 1.27).
# Such a run counts as a pass only when no failing input was written and
# the target's corpus replays clean; anything else fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
raced=0
for run in "${runs[@]}"; do
	read -r pkg target <<<"$run"
	echo "== fuzz $pkg $target ($FUZZTIME)"
	if $GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$log"; then
		continue
	fi
	if grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log"; then
		echo "fuzz: $target stopped with Go's fuzztime race (go.dev/issue/75804), no failing input; replaying its corpus"
		$GO test -count=1 -run "^${target}\$" "$pkg"
		raced=$((raced + 1))
		continue
	fi
	exit 1
done
echo "fuzz: ${#runs[@]} target(s), $FUZZTIME each ($raced stopped by Go's fuzztime race, corpus replayed clean)"
