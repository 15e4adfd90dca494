#!/usr/bin/env bash
# Start or stop a 3-master Redis Cluster on loopback, for fleetlimit's cluster tests.
#
#   .ci/redis-cluster.sh start   # prints REDIS_CLUSTER_ADDRS=127.0.0.1:30001,...
#   .ci/redis-cluster.sh addrs   # prints the addresses if the cluster is up
#   .ci/redis-cluster.sh stop    # shuts the nodes down and removes their data
#
# Then: REDIS_CLUSTER_ADDRS=... go test ./global -run Cluster
#
# Settings (environment): REDIS_CLUSTER_PORT first port (default 30001; the nodes use
# it and the next two), REDIS_CLUSTER_DIR data directory (default a directory named
# after the port under $TMPDIR or /tmp). No persistence, no replicas.
set -euo pipefail

base=${REDIS_CLUSTER_PORT:-30001}
ports=("$base" "$((base + 1))" "$((base + 2))")
dir=${REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/fleetlimit-redis-cluster-$base}

addrs() {
	local IFS=,
	local a=()
	for p in "${ports[@]}"; do a+=("127.0.0.1:$p"); done
	echo "${a[*]}"
}

answers() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }

cluster_ok() {
	for p in "${ports[@]}"; do
		redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
	done
}

start() {
	for tool in redis-server redis-cli; do
		command -v "$tool" >/dev/null || { echo "redis-cluster.sh: $tool not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
	done
	if cluster_ok; then
		echo "REDIS_CLUSTER_ADDRS=$(addrs)"
		return
	fi
	for p in "${ports[@]}"; do
		if answers "$p"; then
			echo "redis-cluster.sh: something already answers on port $p but is not a healthy cluster; run '$0 stop' or set REDIS_CLUSTER_PORT" >&2
			exit 1
		fi
	done
	rm -rf "$dir"
	for p in "${ports[@]}"; do
		mkdir -p "$dir/$p"
		redis-server --port "$p" --bind 127.0.0.1 --daemonize yes \
			--dir "$dir/$p" --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" \
			--cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 2000 \
			--save "" --appendonly no
	done
	for p in "${ports[@]}"; do
		for _ in $(seq 100); do answers "$p" && break; sleep 0.05; done
		answers "$p" || { echo "redis-cluster.sh: node $p did not start; see $dir/$p/redis.log" >&2; exit 1; }
	done
	local hosts=()
	for p in "${ports[@]}"; do hosts+=("127.0.0.1:$p"); done
	redis-cli --cluster create "${hosts[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 ||
		{ cat "$dir/create.log" >&2; exit 1; }
	for _ in $(seq 200); do cluster_ok && break; sleep 0.05; done
	cluster_ok || { echo "redis-cluster.sh: cluster state is not ok after 10 s" >&2; exit 1; }
	echo "REDIS_CLUSTER_ADDRS=$(addrs)"
}

stop() {
	for p in "${ports[@]}"; do
		if answers "$p"; then
			redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
		fi
		if [[ -f "$dir/$p/redis.pid" ]]; then
			pid=$(cat "$dir/$p/redis.pid")
			for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
		fi
	done
	rm -rf "$dir"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
addrs) cluster_ok && echo "REDIS_CLUSTER_ADDRS=$(addrs)" ;;
*)
	echo "usage: $0 start|stop|addrs" >&2
	exit 2
	;;
esac
