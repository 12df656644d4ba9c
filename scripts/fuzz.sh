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

for run in "${runs[@]}"; do
	read -r pkg target <<<"$run"
	echo "== fuzz $pkg $target ($FUZZTIME)"
	$GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg"
done
echo "fuzz: ${#runs[@]} target(s), $FUZZTIME each"
