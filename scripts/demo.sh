#!/usr/bin/env bash
# make demo: the whole pipeline on loopback against the platform simulator,
# with nothing but Go. Builds the binaries, starts
#   platform-sim   127.0.0.1:9790  (API + token endpoint, delivers RTLD batches)
#   exporter       127.0.0.1:9780  (/metrics)
#   rtld-receiver  127.0.0.1:9781  (ingest + /metrics, TLS)
#   prometheus     127.0.0.1:9090  (only when installed: scrapes both, with the
#                                   Helm chart's alerts when helm is installed)
#   sinks          127.0.0.1:9792  (only when clickhouse-server is installed: a
#                  127.0.0.1:9794   ClickHouse, HTTP on :9793, and a Kafka broker
#                                   (kfake), scripts/demosinks; both programs
#                                   write to them)
# (skipping any whose binary is missing), prints where to look, and stops everything
# on Ctrl-C. Logs go to $DEMO_DIR (default ./data/demo). Every address and
# directory can be overridden, see the README's "Quick start".
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
MAKE=${MAKE:-make}
BIN=${BIN:-bin}
DEMO_DIR=${DEMO_DIR:-./data/demo}
SIM_ADDR=${SIM_ADDR:-127.0.0.1:9790}
EXPORTER_ADDR=${EXPORTER_ADDR:-127.0.0.1:9780}
RECEIVER_ADDR=${RECEIVER_ADDR:-127.0.0.1:9781}
PROMETHEUS_ADDR=${PROMETHEUS_ADDR:-127.0.0.1:9090}
CLICKHOUSE_ADDR=${CLICKHOUSE_ADDR:-127.0.0.1:9792}
CLICKHOUSE_HTTP_ADDR=${CLICKHOUSE_HTTP_ADDR:-127.0.0.1:9793}
KAFKA_ADDR=${KAFKA_ADDR:-127.0.0.1:9794}
# Programs found on PATH (helm also in Go's bin directory, where `make deps`
# installs it); a path, or "none" to leave Prometheus out.
PROMETHEUS_BIN=${PROMETHEUS_BIN:-prometheus}
HELM_BIN=${HELM_BIN:-helm}
# clickhouse-server (or the multi-call clickhouse), or "none": without it the
# demo runs without ClickHouse and Kafka.
CLICKHOUSE_BIN=${CLICKHOUSE_BIN:-clickhouse-server}
SIM_URL="http://$SIM_ADDR"
# The simulated traffic: a scale on the one model behind the Metrics API and
# the access logs, and how many environments the receiver serves. At 0.5 the
# first 6 environments log about 200 records/s on average (300 at the daily
# peak, 120 at night), which a laptop delivers, receives and spools easily.
SIM_TRAFFIC_SCALE=${SIM_TRAFFIC_SCALE:-0.5}
RECEIVER_ENVIRONMENTS=${RECEIVER_ENVIRONMENTS:-6}
# How long after a bucket ends the receiver compares its records with the
# Metrics API: the simulator's data settles in 10 minutes.
RECONCILE_DELAY=${RECONCILE_DELAY:-12m}
# The simulator's demo organization and credentials (internal/platformsim).
ORG_ID=${EDGEPIPE_ORGANIZATION_ID:-7c1e5a0d-3b94-4f26-8d1a-5e0b9c2f4a61}
export EDGEPIPE_CLIENT_ID=${EDGEPIPE_CLIENT_ID:-edgepipe-demo}
export EDGEPIPE_CLIENT_SECRET=${EDGEPIPE_CLIENT_SECRET:-edgepipe-demo-secret}
export EDGEPIPE_RTLD_USERNAME=${EDGEPIPE_RTLD_USERNAME:-edgepipe-demo}
export EDGEPIPE_RTLD_PASSWORD=${EDGEPIPE_RTLD_PASSWORD:-edgepipe-demo-rtld}
# The chart's alerts select their targets by the namespace and pod labels
# the Prometheus Operator adds; the demo's scrape jobs add the same labels,
# for the rules of a release "edgepipe" in the namespace "demo".
CHART=deploy/helm/edgepipe
RULES_RELEASE=edgepipe
RULES_NAMESPACE=demo

# find_program NAME: the path of NAME (a path, or a name looked up on PATH
# and in Go's bin directory), or nothing.
find_program() {
	local p=$1
	[ "$p" = none ] && return 0
	if [[ "$p" == */* ]]; then
		[ -x "$p" ] && echo "$p"
		return 0
	fi
	if command -v "$p" 2>/dev/null; then return 0; fi
	local gobin
	gobin=$("$GO" env GOBIN)
	[ -n "$gobin" ] || gobin="$("$GO" env GOPATH | cut -d: -f1)/bin"
	[ -x "$gobin/$p" ] && echo "$gobin/$p"
	return 0
}

# listening HOST:PORT: whether something accepts connections there.
listening() {
	(exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null
}

# check_free HOST:PORT VAR: fails when the address is taken (another demo,
# or your own Prometheus on 9090), naming the variable that moves it.
check_free() {
	if listening "$1"; then
		echo "demo: $1 is already in use; stop what listens there or set $2 to another address" >&2
		exit 1
	fi
}

prometheus=$(find_program "$PROMETHEUS_BIN")
clickhouse=$(find_program "$CLICKHOUSE_BIN")
[ -z "${EDGEPIPE_CLICKHOUSE_DSN:-}${EDGEPIPE_KAFKA_BROKERS:-}" ] || clickhouse="" # your own sinks
check_free "$SIM_ADDR" SIM_ADDR
check_free "$EXPORTER_ADDR" EXPORTER_ADDR
check_free "$RECEIVER_ADDR" RECEIVER_ADDR
[ -z "$prometheus" ] || check_free "$PROMETHEUS_ADDR" PROMETHEUS_ADDR
if [ -n "$clickhouse" ]; then
	check_free "$CLICKHOUSE_ADDR" CLICKHOUSE_ADDR
	check_free "$CLICKHOUSE_HTTP_ADDR" CLICKHOUSE_HTTP_ADDR
	check_free "$KAFKA_ADDR" KAFKA_ADDR
fi

"$MAKE" --no-print-directory build BIN="$BIN" GO="$GO"
mkdir -p "$DEMO_DIR"
DEMO_DIR=$(cd "$DEMO_DIR" && pwd)

pids=()
names=()
sinks_pid="" # stopped last: the programs flush into the sinks as they stop
# stop_pids SECONDS PID…: SIGTERM, up to SECONDS for a graceful exit, SIGKILL.
stop_pids() {
	local grace=$1
	shift
	(($#)) || return 0
	kill -TERM "$@" 2>/dev/null || true
	for _ in $(seq 1 $((grace * 10))); do
		alive=0
		for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		((alive)) || break
		sleep 0.1
	done
	kill -KILL "$@" 2>/dev/null || true
	wait "$@" 2>/dev/null || true
}
stop_all() {
	trap - EXIT INT TERM
	((${#pids[@]})) || exit 0
	echo
	echo "demo: stopping ${names[*]}"
	local programs=()
	for pid in "${pids[@]}"; do [ "$pid" = "$sinks_pid" ] || programs+=("$pid"); done
	stop_pids 10 "${programs[@]}"
	# demosinks stops ClickHouse (up to 15s) and the broker.
	[ -z "$sinks_pid" ] || stop_pids 20 "$sinks_pid"
	echo "demo: stopped (logs in $DEMO_DIR)"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# run NAME PROGRAM ARGS…: runs PROGRAM in the background, logging to
# $DEMO_DIR/NAME.log.
run() {
	local name=$1 program=$2
	shift 2
	"$program" "$@" >"$DEMO_DIR/$name.log" 2>&1 &
	pids+=($!)
	names+=("$name")
	echo "demo: started $name (pid $!, log $DEMO_DIR/$name.log)"
}

# start NAME ARGS…: runs $BIN/NAME, or says it is missing.
start() {
	local name=$1
	shift
	if [ ! -x "$BIN/$name" ]; then
		echo "demo: $name not found in $BIN, skipped"
		return 1
	fi
	run "$name" "$BIN/$name" "$@"
}

# wait_port HOST:PORT NAME [SECONDS]: waits up to SECONDS (15) for a
# listener; fails if the process died.
wait_port() {
	local addr=$1 name=$2 seconds=${3:-15} pid=${pids[-1]}
	for _ in $(seq 1 $((seconds * 10))); do
		if listening "$addr"; then return 0; fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "demo: $name exited; last log lines:" >&2
			tail -n 20 "$DEMO_DIR/$name.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	echo "demo: $name not listening on $addr after ${seconds}s" >&2
	exit 1
}

# The platform posts log batches only to https: the receiver serves TLS with a
# self-signed certificate made by the Go distribution's own generator, and the
# simulator (demo only) skips verifying it. Prometheus verifies it against
# the certificate itself.
TLS_DIR=$DEMO_DIR/tls
if [ ! -s "$TLS_DIR/cert.pem" ]; then
	mkdir -p "$TLS_DIR"
	(cd "$TLS_DIR" && "$GO" run "$("$GO" env GOROOT)/src/crypto/tls/generate_cert.go" \
		--host 127.0.0.1,localhost >/dev/null)
fi
cat >"$TLS_DIR/web.yml" <<YML
tls_server_config:
  cert_file: $TLS_DIR/cert.pem
  key_file: $TLS_DIR/key.pem
YML

# ClickHouse and a Kafka broker for both programs' sinks, when
# clickhouse-server is installed (scripts/demosinks, built here: it is a
# demo tool, not a product binary), unless EDGEPIPE_CLICKHOUSE_DSN or
# EDGEPIPE_KAFKA_BROKERS name sinks of your own, which the programs then use.
have_sinks=false
exporter_sinks=()
receiver_sinks=()
CLICKHOUSE_DB=cdn
KAFKA_TOPIC=cdn-access-logs
if [ -n "$clickhouse" ]; then
	"$GO" build -o "$DEMO_DIR/demosinks" ./scripts/demosinks
	run sinks "$DEMO_DIR/demosinks" -dir "$DEMO_DIR/sinks" -clickhouse-bin "$clickhouse" \
		-clickhouse "$CLICKHOUSE_ADDR" -clickhouse-http "$CLICKHOUSE_HTTP_ADDR" -kafka "$KAFKA_ADDR"
	sinks_pid=${pids[-1]}
	wait_port "$KAFKA_ADDR" sinks
	wait_port "$CLICKHOUSE_ADDR" sinks 90
	exporter_sinks=(--clickhouse.dsn="clickhouse://$CLICKHOUSE_ADDR/$CLICKHOUSE_DB")
	receiver_sinks=(--kafka.brokers="$KAFKA_ADDR" --kafka.topic="$KAFKA_TOPIC"
		--clickhouse.dsn="clickhouse://$CLICKHOUSE_ADDR/$CLICKHOUSE_DB")
	have_sinks=true
elif [ -n "${EDGEPIPE_CLICKHOUSE_DSN:-}${EDGEPIPE_KAFKA_BROKERS:-}" ]; then
	echo "demo: EDGEPIPE_CLICKHOUSE_DSN or EDGEPIPE_KAFKA_BROKERS is set: the programs use your sinks, the demo starts none"
elif [ "$CLICKHOUSE_BIN" != none ]; then
	echo "demo: clickhouse-server not found (\`make deps\` installs it), so ClickHouse and Kafka are left out"
fi

have_sim=false
if start platform-sim --web.listen-address="$SIM_ADDR" --delivery.insecure-skip-verify \
	--traffic.scale="$SIM_TRAFFIC_SCALE"; then
	wait_port "$SIM_ADDR" platform-sim
	have_sim=true
fi

have_exporter=false
if start exporter \
	--api.url="$SIM_URL" --auth.url="$SIM_URL" \
	--organization-id="$ORG_ID" \
	--state.dir="$DEMO_DIR/exporter-state" \
	--web.listen-address="$EXPORTER_ADDR" \
	"${exporter_sinks[@]}"; then
	wait_port "$EXPORTER_ADDR" exporter
	have_exporter=true
fi

have_receiver=false
if [ -x "$BIN/rtld-receiver" ]; then
	envs=${EDGEPIPE_ENVIRONMENT_ID:-}
	if [ -z "$envs" ] && $have_sim; then
		envs=$("$GO" run ./scripts/demoenvs -url "$SIM_URL" -org "$ORG_ID" -max "$RECEIVER_ENVIRONMENTS")
	fi
	if [ -n "$envs" ]; then
		# Comma-separated lists go through the environment (DESIGN.md);
		# the flag is repeatable instead.
		if EDGEPIPE_ENVIRONMENT_ID="$envs" start rtld-receiver \
			--api.url="$SIM_URL" --auth.url="$SIM_URL" \
			--public-url="https://$RECEIVER_ADDR" \
			--web.config.file="$TLS_DIR/web.yml" \
			--spool.dir="$DEMO_DIR/spool" \
			--reconcile.delay="$RECONCILE_DELAY" \
			--web.listen-address="$RECEIVER_ADDR" \
			"${receiver_sinks[@]}"; then
			wait_port "$RECEIVER_ADDR" rtld-receiver
			have_receiver=true
		fi
	else
		echo "demo: rtld-receiver skipped (no simulator to find environments in; set EDGEPIPE_ENVIRONMENT_ID)"
	fi
else
	echo "demo: rtld-receiver not found in $BIN, skipped"
fi

if ((${#pids[@]} == 0)); then
	echo "demo: nothing to run (no binaries in $BIN)"
	exit 0
fi

# Prometheus, when installed, with the chart's alerts rendered by helm from
# templates/prometheusrule.yaml: the one source of the rules.
have_prometheus=false
rules_note=""
if [ -z "$prometheus" ]; then
	[ "$PROMETHEUS_BIN" = none ] || echo "demo: prometheus not found (\`make deps\` installs it), skipped"
elif $have_exporter || $have_receiver; then
	PROM_DIR=$DEMO_DIR/prometheus
	mkdir -p "$PROM_DIR"
	rule_files="[]"
	helm=$(find_program "$HELM_BIN")
	if [ -n "$helm" ]; then
		"$helm" template "$RULES_RELEASE" "$CHART" --namespace "$RULES_NAMESPACE" \
			--set metrics.prometheusRule.enabled=true \
			--show-only templates/prometheusrule.yaml >"$PROM_DIR/prometheusrule.yaml"
		# The PrometheusRule's spec is a Prometheus rule file.
		awk '/^spec:$/ { spec = 1; next } spec { sub(/^  /, ""); print }' \
			"$PROM_DIR/prometheusrule.yaml" >"$PROM_DIR/rules.yml"
		rule_files="[rules.yml]"
	else
		rm -f "$PROM_DIR/rules.yml"
		rules_note=" (no alerts: helm not found; \`make deps\` installs it)"
		echo "demo: helm not found, so Prometheus runs without the chart's alerts"
	fi
	{
		cat <<YML
# Written by scripts/demo.sh. The namespace and pod labels are those the
# Prometheus Operator would add, so the chart's alerts (rules.yml, from
# helm template) select these targets as they do in Kubernetes.
global:
  scrape_interval: 5s
  scrape_timeout: 5s
  evaluation_interval: 5s
rule_files: $rule_files
scrape_configs:
YML
		if $have_exporter; then
			cat <<YML
  - job_name: edgepipe-exporter
    static_configs:
      - targets: ["$EXPORTER_ADDR"]
        labels: {namespace: $RULES_NAMESPACE, pod: $RULES_RELEASE-exporter-0}
YML
		fi
		if $have_receiver; then
			cat <<YML
  - job_name: edgepipe-receiver
    scheme: https
    tls_config:
      ca_file: $TLS_DIR/cert.pem
    static_configs:
      - targets: ["$RECEIVER_ADDR"]
        labels: {namespace: $RULES_NAMESPACE, pod: $RULES_RELEASE-receiver-0}
YML
		fi
	} >"$PROM_DIR/prometheus.yml"
	run prometheus "$prometheus" \
		--config.file="$PROM_DIR/prometheus.yml" \
		--storage.tsdb.path="$PROM_DIR/data" \
		--storage.tsdb.retention.time=1d \
		--web.listen-address="$PROMETHEUS_ADDR"
	wait_port "$PROMETHEUS_ADDR" prometheus
	have_prometheus=true
fi

PROM_URL="http://$PROMETHEUS_ADDR"
cat <<MSG

edgepipe demo is running: ${names[*]}
  platform simulator  $SIM_URL   (token: POST $SIM_URL/connect/token)
  exporter metrics    curl -s http://$EXPORTER_ADDR/metrics | grep '^cdn_'
  receiver metrics    curl -sk https://$RECEIVER_ADDR/metrics | grep '^edgepipe_rtld_'
  receiver spool      ls $DEMO_DIR/spool
  logs                tail -f $DEMO_DIR/*.log
MSG
if $have_prometheus; then
	cat <<MSG
  prometheus          $PROM_URL   (targets: $PROM_URL/targets, alerts: $PROM_URL/alerts)$rules_note

Queries to try in $PROM_URL/graph:
  CDN requests per second at the edge, top 5 countries (exporter)
    topk(5, sum by (country_code) (rate(cdn_edge_usage_by_country_requests_edge_total[5m])))
  access-log records per second received, by outcome (receiver)
    sum by (status) (rate(edgepipe_rtld_records_received_total[1m]))
  requests per second by POP and status class, from the access logs (receiver)
    sum by (pop, status_class) (rate(cdn_logs_requests_total[1m]))
  seconds since the end of each dataset's newest bucket (how fresh the exported data is)
    max by (dataset) (edgepipe_bucket_lag_seconds)
MSG
fi
if $have_sinks; then
	ch_client="clickhouse-client --host ${CLICKHOUSE_ADDR%:*} --port ${CLICKHOUSE_ADDR##*:}"
	cat <<MSG

ClickHouse (database $CLICKHOUSE_DB, $CLICKHOUSE_ADDR) and Kafka (topic $KAFKA_TOPIC, $KAFKA_ADDR): the data arriving
  access-log records per environment, each counted once (receiver, table access_logs)
    $ch_client --query "SELECT environment_id, count() AS records FROM $CLICKHOUSE_DB.access_logs FINAL GROUP BY environment_id ORDER BY environment_id"
  edge requests per country in the last hour, top 5 (exporter, table edge_usage_by_country)
    $ch_client --query "SELECT country_code, sum(requests_edge_total) AS requests FROM $CLICKHOUSE_DB.edge_usage_by_country FINAL WHERE time >= now() - 3600 GROUP BY country_code ORDER BY requests DESC LIMIT 5"
  rows in every table, as they arrive (both programs)
    $ch_client --query "SELECT table, sum(rows) AS rows FROM system.parts WHERE database = '$CLICKHOUSE_DB' AND active GROUP BY table ORDER BY table"
  the newest access-log records on the topic, as JSON (receiver)
    kcat -b $KAFKA_ADDR -C -t $KAFKA_TOPIC -o -5 -e -q
MSG
fi
echo "Press Ctrl-C to stop."

# Wait until Ctrl-C or until one of the programs exits.
set +e
wait -n "${pids[@]}"
status=$?
set -e
echo "demo: a program exited (status $status); see $DEMO_DIR/*.log"
exit "$status"
