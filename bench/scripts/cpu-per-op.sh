#!/usr/bin/env bash
# Server CPU per operation, Mayfly beside etcd and Redis, in one run on this machine (issue 26).
# Each line it prints comes from mayfly-bench, which reads the server's CPU time before and after
# each timed phase (Mayfly: mayfly_process_cpu_seconds_total; etcd: its /metrics; Redis: INFO
# cpu) and divides by the operations completed. Loopback only; every load is bounded in time.
#
#   cargo build --release -p mayfly-server -p mayfly-bench
#   bash bench/scripts/cpu-per-op.sh            # peers skipped if etcd / redis-server are absent
#   (apt-get install etcd-server redis-server installs them)
set -u
BIN=${BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
W=$(mktemp -d /var/tmp/mayfly-cpu.XXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
start() {  # flags; sets PID and ADDR
  "$BIN/mayfly" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --insecure-no-auth "$@" >"$W/out" 2>"$W/err" &
  PID=$!; ADDR=""; METRICS=""
  for _ in $(seq 100); do
    ADDR=$(awk '/^mayfly listening on/ {print $NF; exit}' "$W/out")
    METRICS=$(grep -o 'metrics=Some([0-9.:]*)' "$W/err" | head -1 | tr -d 'metrics=Some()')
    [ -n "$ADDR" ] && [ -n "$METRICS" ] && break; sleep 0.1
  done
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null; }
mb() { "$BIN/mayfly-bench" --addr "$ADDR" --metrics "$METRICS" --connections 8 --concurrency "${C:-64}" --duration 8 "$@" 2>&1 | grep -v '^#'; }
echo "# $(nproc) cores, $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null), $(date -u +%F)"
echo "=== mayfly disk, write-with-ttl, default indexing policy"; start --data-dir "$W/d1"; mb write; stop
echo "=== mayfly disk, write-with-ttl, indexing none"; start --data-dir "$W/d2"; mb write --indexing none; stop
echo "=== mayfly disk, point read (in cache), then the health check"; start --data-dir "$W/d3"; mb read --preload 20000; mb health; stop
echo "=== mayfly memory, write-with-ttl"; start --storage memory; mb write; stop
echo "=== mayfly memory, point read, then the health check"; start --storage memory; mb read --preload 20000; mb health; stop
echo "=== mayfly memory, purge of 200,000 documents due within 1 s"; start --storage memory
C=256 mb expiry --documents 200000 --window-secs 1 --lead-secs 45; stop
echo "=== mayfly disk, purge of 200,000 documents due within 1 s"; start --data-dir "$W/d4"
C=256 mb expiry --documents 200000 --window-secs 1 --lead-secs 110; stop
rm -rf "$W"/d*
if command -v etcd >/dev/null; then
  etcd --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --quota-backend-bytes 8589934592 >"$W/etcd.log" 2>&1 &
  EP=$!; sleep 3
  echo "=== etcd put (fsync)"; mb etcd-put
  echo "=== etcd lease-grant + put"; mb etcd-lease-put
  kill $EP; wait $EP 2>/dev/null
fi
if command -v redis-server >/dev/null; then
  redis-server --port 6390 --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always --dir "$W" >"$W/redis.log" 2>&1 &
  RP=$!; sleep 1
  echo "=== redis SET EX, appendfsync always"; mb redis-set --redis-addr 127.0.0.1:6390
  echo "=== redis GET"; mb redis-get --redis-addr 127.0.0.1:6390 --preload 20000
  kill $RP; wait $RP 2>/dev/null
fi
