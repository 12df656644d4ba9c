#!/usr/bin/env bash
# Installs what the integration tests need, only if missing (idempotent,
# quick when everything is there):
#   apt: clickhouse-server clickhouse-client prometheus kcat zookeeper (Debian 12
#        packages; zookeeper is jars run with java, for the ClickHouse cluster tests);
#        podman runc ca-certificates tzdata (the container image, `make image`)
#   go:  helm (for `make helm-lint` and the chart tests), golangci-lint
#        GOLANGCI_LINT_VERSION (for `make lint`; the Makefile pins it) into
#        Go's bin directory, when that directory has no golangci-lint of
#        that version
#   npm: CHDB_PACKAGE (the npm registry's chdb's platform package; its
#        libchdb.so is ClickHouse 26.x as a library, ~560 MB) into
#        <user cache dir>/edgepipe/chdb, for the ClickHouse 26.x tests
#        (internal/testenv.ChDB); skipped when that version is there or
#        EDGEPIPE_LIBCHDB is set; nodejs/npm come from apt when missing
#   the OpenTelemetry Collector the OTLP tests run (internal/testenv), built
#   with the official builder into the user's cache directory: minutes the
#   first time, skipped when that build exists or EDGEPIPE_OTELCOL is set
# The packages' own services are not started (policy-rc.d) and, if an
# install started them anyway, stopped and disabled: tests start their own
# instances on free loopback ports.
set -euo pipefail
GO=${GO:-go}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
# Keep in step with internal/testenv.ChDBPackage (the Makefile passes it).
CHDB_PACKAGE=${CHDB_PACKAGE:-@chdb/lib-linux-x64-gnu@26.7.3-stable.1}

have() { # binary: on PATH or in the usual system dirs (sbin is often off PATH)
	command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ] || [ -x "/usr/sbin/$1" ]
}

declare -A pkg_for=(
	[clickhouse-server]=clickhouse-server
	[clickhouse-client]=clickhouse-client
	[prometheus]=prometheus
	[promtool]=prometheus
	[kcat]=kcat
)
missing=()
for bin in clickhouse-server clickhouse-client prometheus promtool kcat; do
	if ! have "$bin"; then
		pkg=${pkg_for[$bin]}
		[[ " ${missing[*]:-} " == *" $pkg "* ]] || missing+=("$pkg")
	fi
done
# ZooKeeper has no binary on PATH: internal/testenv runs its jar with java.
zookeeper_jar=/usr/share/java/zookeeper.jar
have_zookeeper() { [ -f "$zookeeper_jar" ] && have java; }
have_zookeeper || missing+=(zookeeper)
# npm installs chDB's library (below).
if [ -z "${EDGEPIPE_LIBCHDB:-}" ] && ! have npm; then
	missing+=(npm)
fi

if ((${#missing[@]})); then
	echo "deps: installing ${missing[*]}"
	SUDO=()
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null 2>&1; then
			SUDO=(sudo -n)
		else
			echo "deps: need root (or sudo) to apt-get install ${missing[*]}" >&2
			exit 1
		fi
	fi
	# Keep the packages' services from starting during installation.
	policy=/usr/sbin/policy-rc.d
	own_policy=false
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
		"${SUDO[@]}" chmod 755 "$policy"
		own_policy=true
	fi
	cleanup() { if $own_policy; then "${SUDO[@]}" rm -f "$policy"; fi; }
	trap cleanup EXIT
	export DEBIAN_FRONTEND=noninteractive
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
	# If a service got started anyway (e.g. systemd ignoring policy-rc.d),
	# stop and disable it: only packages installed just now are touched.
	for pkg in "${missing[@]}"; do
		case "$pkg" in
		prometheus | clickhouse-server | zookeeper) # Debian 12's zookeeper has no unit; others' may
			if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
				"${SUDO[@]}" systemctl disable --now "$pkg.service" >/dev/null 2>&1 || true
			elif command -v service >/dev/null 2>&1; then
				"${SUDO[@]}" service "$pkg" stop >/dev/null 2>&1 || true
			fi
			;;
		esac
	done
	for bin in clickhouse-server clickhouse-client prometheus promtool kcat; do
		have "$bin" || { echo "deps: $bin still missing after apt-get install" >&2; exit 1; }
	done
	have_zookeeper || { echo "deps: $zookeeper_jar or java still missing after apt-get install" >&2; exit 1; }
	[ -n "${EDGEPIPE_LIBCHDB:-}" ] || have npm || { echo "deps: npm still missing after apt-get install" >&2; exit 1; }
else
	echo "deps: clickhouse-server clickhouse-client prometheus promtool kcat zookeeper already installed"
fi

# Containers: Debian's podman with runc (the image test runs edgepipe's image
# with runc, daemonless, as root; `make image` loads the image into podman),
# and the CA certificates and time zone data `make image` puts into the image.
# About 23 MB of packages; the install took 14 s here.
container_pkgs=()
have podman || container_pkgs+=(podman)
have runc || container_pkgs+=(runc)
[ -d /usr/share/ca-certificates/mozilla ] || container_pkgs+=(ca-certificates)
[ -f /usr/share/zoneinfo/Etc/UTC ] || container_pkgs+=(tzdata)
if ((${#container_pkgs[@]})); then
	echo "deps: installing ${container_pkgs[*]}"
	container_sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 || { echo "deps: need root (or sudo) to apt-get install ${container_pkgs[*]}" >&2; exit 1; }
		container_sudo=(sudo -n)
	fi
	"${container_sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	"${container_sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${container_pkgs[@]}"
	for bin in podman runc; do
		have "$bin" || { echo "deps: $bin still missing after apt-get install" >&2; exit 1; }
	done
else
	echo "deps: podman runc ca-certificates tzdata already installed"
fi

if ! have helm && [ ! -x "$($GO env GOPATH)/bin/helm" ]; then
	echo "deps: go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	CGO_ENABLED=0 $GO install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
else
	echo "deps: helm already installed"
fi

golangci_lint="$($GO env GOPATH)/bin/golangci-lint"
if [ -x "$golangci_lint" ] && [ "v$("$golangci_lint" version --short 2>/dev/null)" = "$GOLANGCI_LINT_VERSION" ]; then
	echo "deps: golangci-lint $GOLANGCI_LINT_VERSION already installed"
else
	echo "deps: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
	$GO install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
fi

# chDB: ClickHouse 26.x as a library, for the tests of the SQL newer
# servers get. Only the platform package (libchdb.so), not the Node.js
# bindings: nothing is built, no install script runs.
if [ -n "${EDGEPIPE_LIBCHDB:-}" ]; then
	echo "deps: libchdb.so from EDGEPIPE_LIBCHDB=$EDGEPIPE_LIBCHDB"
else
	chdb_dir="${XDG_CACHE_HOME:-$HOME/.cache}/edgepipe/chdb"
	chdb_name=${CHDB_PACKAGE%@*}
	chdb_version=${CHDB_PACKAGE##*@}
	chdb_have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$chdb_dir/node_modules/$chdb_name/package.json" 2>/dev/null | head -1 || true)
	if [ "$chdb_have" = "$chdb_version" ] && [ -f "$chdb_dir/node_modules/$chdb_name/libchdb.so" ]; then
		echo "deps: chDB $chdb_version (libchdb.so) already installed in $chdb_dir"
	else
		echo "deps: npm install $CHDB_PACKAGE into $chdb_dir"
		t0=$(date +%s)
		mkdir -p "$chdb_dir"
		npm install --prefix "$chdb_dir" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "$CHDB_PACKAGE"
		[ -f "$chdb_dir/node_modules/$chdb_name/libchdb.so" ] || { echo "deps: $chdb_dir/node_modules/$chdb_name/libchdb.so missing after npm install" >&2; exit 1; }
		echo "deps: chDB installed in $(($(date +%s) - t0))s"
	fi
fi

if [ -n "${EDGEPIPE_OTELCOL:-}" ]; then
	echo "deps: OpenTelemetry Collector from EDGEPIPE_OTELCOL=$EDGEPIPE_OTELCOL"
else
	# Prints the cached binary's path; builds it only if it is missing.
	otelcol=$(cd "$(dirname "$0")/.." && $GO run ./internal/testenv/cmd/otelcol-build)
	echo "deps: OpenTelemetry Collector for the tests: $otelcol"
fi
