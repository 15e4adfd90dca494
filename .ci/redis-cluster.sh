#!/usr/bin/env bash
# Start or stop a Redis Cluster of 3 masters, each with 1 replica, on loopback, for
# fleetlimit's cluster tests.
#
#   .ci/redis-cluster.sh start   # prints REDIS_CLUSTER_ADDRS=127.0.0.1:21001,...,127.0.0.1:21006
#   .ci/redis-cluster.sh addrs   # prints the addresses if the cluster is up
#   .ci/redis-cluster.sh stop    # shuts the nodes down and removes their data
#
# Then: REDIS_CLUSTER_ADDRS=... go test ./global -run Cluster
#
# Settings (environment): REDIS_CLUSTER_PORT first port (default 21001). The 6 nodes
# listen on that port and the next five (masters on the first three, replicas on the
# last three), and each one's cluster bus on its port + 10000 (default 31001-31006), so
# the base must be at most 55530; all twelve ports must be free (a node that cannot bind
# one exits, and start prints the end of its log). The default keeps all twelve below
# Linux's range of ports for outgoing connections (32768-60999), which a client's
# connection may hold: from 30001, the buses 40001-40006 are inside it, and a test's
# connection once held 40004. REDIS_CLUSTER_DIR data directory (default a directory
# named after the port under $TMPDIR or /tmp). No persistence.
#
# `start` returns once every node reports cluster_state:ok and every replica's link to
# its master is up (a first sync of an empty master: about 1-2 s in all). It prints
# every node's address: any of them seeds a cluster client, which learns the roles from
# the cluster itself. Fault tests that fail a master over start a cluster of their own
# (internal/redistest.StartCluster); this one stays as started.
set -euo pipefail

base=${REDIS_CLUSTER_PORT:-21001}
if ((base < 1 || base + 5 + 10000 > 65535)); then
	echo "redis-cluster.sh: REDIS_CLUSTER_PORT=$base: the nodes use it to +5 and their buses +10000, so it must be 1-55530" >&2
	exit 2
fi
ports=()
for i in 0 1 2 3 4 5; do ports+=("$((base + i))"); done
dir=${REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/fleetlimit-redis-cluster-$base}

addrs() {
	local IFS=,
	local a=()
	for p in "${ports[@]}"; do a+=("127.0.0.1:$p"); done
	echo "${a[*]}"
}

cli() { redis-cli -h 127.0.0.1 -p "$@" 2>/dev/null; }

answers() { [[ $(cli "$1" ping) == PONG ]]; }

# cluster_ok: every node sees the cluster ok, 3 masters and 3 replicas, and every
# replica's link to its master is up (its first sync is done).
cluster_ok() {
	local masters=0 replicas=0 info
	for p in "${ports[@]}"; do
		info=$(cli "$p" cluster info) || return 1
		[[ $info == *cluster_state:ok* ]] || return 1
		info=$(cli "$p" info replication) || return 1
		case "$info" in
		*role:master*) masters=$((masters + 1)) ;;
		*role:slave*)
			[[ $info == *master_link_status:up* ]] || return 1
			replicas=$((replicas + 1))
			;;
		esac
	done
	((masters == 3 && replicas == 3))
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
		# repl-diskless-sync-delay 0: a replica's first sync starts at once instead of
		# after the default 5 s wait for other replicas to join it. Full coverage off:
		# a failed master costs only its own slots (docs/operations.md).
		redis-server --port "$p" --bind 127.0.0.1 --daemonize yes \
			--dir "$dir/$p" --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" \
			--cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 2000 \
			--cluster-require-full-coverage no --save "" --appendonly no --repl-diskless-sync-delay 0
	done
	for p in "${ports[@]}"; do
		for _ in $(seq 100); do answers "$p" && break; sleep 0.05; done
		answers "$p" || {
			# Most often its port or its bus port (+10000) is taken, by a listener or by
			# an outgoing connection's ephemeral port: its log's last lines say which.
			echo "redis-cluster.sh: node $p did not start; the end of $dir/$p/redis.log:" >&2
			tail -n 5 "$dir/$p/redis.log" >&2 || true
			exit 1
		}
	done
	local hosts=()
	for p in "${ports[@]}"; do hosts+=("127.0.0.1:$p"); done
	# With every node on one host, redis-cli makes the first three masters and gives
	# each one of the last three as its replica.
	redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
		{ cat "$dir/create.log" >&2; exit 1; }
	for _ in $(seq 300); do cluster_ok && break; sleep 0.05; done
	cluster_ok || {
		echo "redis-cluster.sh: cluster not ok (state, roles or replica links) after 15 s:" >&2
		cli "$base" cluster nodes >&2 || true
		exit 1
	}
	echo "REDIS_CLUSTER_ADDRS=$(addrs)"
}

stop() {
	for p in "${ports[@]}"; do
		if answers "$p"; then
			cli "$p" shutdown nosave >/dev/null || true
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
