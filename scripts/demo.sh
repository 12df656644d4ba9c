#!/usr/bin/env bash
# make demo: the whole pipeline on loopback against the platform simulator,
# with nothing but Go. Builds the binaries, starts
#   platform-sim   127.0.0.1:9790  (API + token endpoint, delivers RTLD batches)
#   exporter       127.0.0.1:9780  (/metrics)
#   rtld-receiver  127.0.0.1:9781  (ingest + /metrics)
# (skipping any whose binary is missing), prints where to look, and stops everything
# on Ctrl-C. Logs go to $DEMO_DIR (default ./data/demo).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
MAKE=${MAKE:-make}
BIN=${BIN:-bin}
DEMO_DIR=${DEMO_DIR:-./data/demo}
SIM_ADDR=${SIM_ADDR:-127.0.0.1:9790}
EXPORTER_ADDR=${EXPORTER_ADDR:-127.0.0.1:9780}
RECEIVER_ADDR=${RECEIVER_ADDR:-127.0.0.1:9781}
SIM_URL="http://$SIM_ADDR"
# The simulator's demo organization and credentials (internal/platformsim).
ORG_ID=${EDGEPIPE_ORGANIZATION_ID:-7c1e5a0d-3b94-4f26-8d1a-5e0b9c2f4a61}
export EDGEPIPE_CLIENT_ID=${EDGEPIPE_CLIENT_ID:-edgepipe-demo}
export EDGEPIPE_CLIENT_SECRET=${EDGEPIPE_CLIENT_SECRET:-edgepipe-demo-secret}
export EDGEPIPE_RTLD_USERNAME=${EDGEPIPE_RTLD_USERNAME:-edgepipe-demo}
export EDGEPIPE_RTLD_PASSWORD=${EDGEPIPE_RTLD_PASSWORD:-edgepipe-demo-rtld}

"$MAKE" --no-print-directory build BIN="$BIN" GO="$GO"
mkdir -p "$DEMO_DIR"

pids=()
names=()
stop_all() {
	trap - EXIT INT TERM
	((${#pids[@]})) || exit 0
	echo
	echo "demo: stopping ${names[*]}"
	kill -TERM "${pids[@]}" 2>/dev/null || true
	for _ in $(seq 1 100); do # up to 10s for a graceful exit
		alive=0
		for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		((alive)) || break
		sleep 0.1
	done
	kill -KILL "${pids[@]}" 2>/dev/null || true
	wait "${pids[@]}" 2>/dev/null || true
	echo "demo: stopped (logs in $DEMO_DIR)"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# start NAME ARGS…: runs $BIN/NAME in the background, logging to $DEMO_DIR.
start() {
	local name=$1
	shift
	if [ ! -x "$BIN/$name" ]; then
		echo "demo: $name not found in $BIN, skipped"
		return 1
	fi
	"$BIN/$name" "$@" >"$DEMO_DIR/$name.log" 2>&1 &
	pids+=($!)
	names+=("$name")
	echo "demo: started $name (pid $!, log $DEMO_DIR/$name.log)"
}

# wait_port HOST:PORT NAME: waits up to 15s for a listener; fails if the
# process died.
wait_port() {
	local addr=$1 name=$2 pid=${pids[-1]}
	for _ in $(seq 1 150); do
		if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then return 0; fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "demo: $name exited; last log lines:" >&2
			tail -n 20 "$DEMO_DIR/$name.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	echo "demo: $name not listening on $addr after 15s" >&2
	exit 1
}

# The platform posts log batches only to https: the receiver serves TLS with a
# self-signed certificate made by the Go distribution's own generator, and the
# simulator (demo only) skips verifying it.
TLS_DIR=$(cd "$DEMO_DIR" && pwd)/tls
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

have_sim=false
if start platform-sim --web.listen-address="$SIM_ADDR" --delivery.insecure-skip-verify; then
	wait_port "$SIM_ADDR" platform-sim
	have_sim=true
fi

if start exporter \
	--api.url="$SIM_URL" --auth.url="$SIM_URL" \
	--organization-id="$ORG_ID" \
	--state.dir="$DEMO_DIR/exporter-state" \
	--web.listen-address="$EXPORTER_ADDR"; then
	wait_port "$EXPORTER_ADDR" exporter
fi

if [ -x "$BIN/rtld-receiver" ]; then
	envs=${EDGEPIPE_ENVIRONMENT_ID:-}
	if [ -z "$envs" ] && $have_sim; then
		envs=$("$GO" run ./scripts/demoenvs -url "$SIM_URL" -org "$ORG_ID" -max 3)
	fi
	if [ -n "$envs" ]; then
		# Comma-separated lists go through the environment (DESIGN.md);
		# the flag is repeatable instead.
		if EDGEPIPE_ENVIRONMENT_ID="$envs" start rtld-receiver \
			--api.url="$SIM_URL" --auth.url="$SIM_URL" \
			--public-url="https://$RECEIVER_ADDR" \
			--web.config.file="$TLS_DIR/web.yml" \
			--spool.dir="$DEMO_DIR/spool" \
			--web.listen-address="$RECEIVER_ADDR"; then
			wait_port "$RECEIVER_ADDR" rtld-receiver
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

cat <<MSG

edgepipe demo is running: ${names[*]}
  platform simulator  $SIM_URL   (token: POST $SIM_URL/connect/token)
  exporter metrics    curl -s http://$EXPORTER_ADDR/metrics | grep '^cdn_'
  receiver metrics    curl -sk https://$RECEIVER_ADDR/metrics | grep '^edgepipe_rtld_'
  receiver spool      ls $DEMO_DIR/spool
  logs                tail -f $DEMO_DIR/*.log
Press Ctrl-C to stop.
MSG

# Wait until Ctrl-C or until one of the programs exits.
set +e
wait -n "${pids[@]}"
status=$?
set -e
echo "demo: a program exited (status $status); see $DEMO_DIR/*.log"
exit "$status"
