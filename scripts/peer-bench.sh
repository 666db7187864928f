#!/usr/bin/env bash
# The peer cache's figures (issue 37; recorded in docs/benchmarks.md), by hand:
#   scripts/peer-bench.sh [SIZE_MIB] [peers|alone]
# A versitygw S3 server on 127.0.0.1 (scripts/servers.sh install), every request 20 ms late
# (UNKAI_FAULTS), a volume of 4 MiB blocks holding one file of SIZE_MIB; then:
#   1. one mount alone reads it cold: its time;
#   2. four mounts (own cache directories; in a peer cache group unless `alone`) read it
#      cold at the same moment: their time, and the bucket's GETs by their own counters;
#   3. a fifth member reads it: the mean time of a block from a peer vs a GET of step 1.
# Everything runs as root in a temporary directory, removed at the end.
set -euo pipefail
SIZE=${1:-256}
MODE=${2:-peers}
BIN=${UNKAI_BIN:-$(dirname "$0")/../target/release/unkai}
GW=${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}/bin/versitygw
T=$(mktemp -d /tmp/unkai-peerbench-XXXXXX)
PIDS=()
MPS=()
cleanup() {
  for m in "${MPS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  sleep 1
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  mkdir -p /tmp/peer-bench-logs && cp "$T"/*.log /tmp/peer-bench-logs/ 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
GWP=$(port)
mkdir -p "$T/s3"
ROOT_ACCESS_KEY_ID=bench ROOT_SECRET_ACCESS_KEY=benchsecret "$GW" --port 127.0.0.1:$GWP posix "$T/s3" >"$T/gw.log" 2>&1 &
PIDS+=($!)
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_ENDPOINT_URL=http://127.0.0.1:$GWP AWS_REGION=us-east-1
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$GWP) 2>/dev/null && break; sleep 0.1; done
META=sqlite://$T/meta.db
"$BIN" format --storage s3://bench/vols "$META" bench >/dev/null
mount_one() { # NAME [flags...]: mounts; its metrics port in $MPORT
  local name=$1; shift
  local mp=$T/mnt-$name mport; mport=$(port); MPORT=$mport
  mkdir -p "$mp"
  "$BIN" mount --writeback off --cache-dir "$T/cache-$name" --metrics 127.0.0.1:$mport "$@" "$META" "$mp" >"$T/$name.log" 2>&1 &
  PIDS+=($!); MPS+=("$mp")
  for _ in $(seq 300); do mountpoint -q "$mp" && break; sleep 0.1; done
}
fig() { # PORT NAME [LABEL]: sum of the samples of NAME whose labels hold LABEL
  curl -s "http://127.0.0.1:$1/metrics" | grep "^$2{" | grep -F "${3:-}" | awk '{s+=$NF} END {printf "%.4f\n", s+0}'
}
gets() { echo "$(fig "$1" unkai_object_request_duration_seconds_count 'op="get"') + $(fig "$1" unkai_object_request_duration_seconds_count 'op="get_range"')" | bc; }
mount_one writer
dd if=/dev/urandom of="$T/mnt-writer/data" bs=1M count="$SIZE" status=none
umount "$T/mnt-writer"
BLOCKS=$(( (SIZE + 3) / 4 ))
export UNKAI_FAULTS=latency_ms=20
mount_one alone; a=$MPORT
s=$(date +%s.%N); cat "$T/mnt-alone/data" >/dev/null; e=$(date +%s.%N)
ALONE=$(echo "$e - $s" | bc)
GL=$(echo "scale=2; 1000 * $(fig "$a" unkai_object_request_duration_seconds_sum 'op="get"') / $(fig "$a" unkai_object_request_duration_seconds_count 'op="get"')" | bc)
umount "$T/mnt-alone"
PEER=()
ports=()
for i in 1 2 3 4; do
  if [ "$MODE" = peers ]; then PEER=(--peer-cache 127.0.0.1:0); fi
  mount_one m$i "${PEER[@]}"; ports+=("$MPORT")
done
if [ "$MODE" = peers ]; then
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do [ "$(fig "$p" unkai_peer_members)" = "4.0000" ] && break; sleep 0.2; done
  done
fi
before=0; for p in "${ports[@]}"; do before=$(echo "$before + $(gets "$p")" | bc); done
s=$(date +%s.%N)
CATS=()
for i in 1 2 3 4; do cat "$T/mnt-m$i/data" >/dev/null & CATS+=($!); done
wait "${CATS[@]}"
e=$(date +%s.%N)
FOUR=$(echo "$e - $s" | bc)
after=0; for p in "${ports[@]}"; do after=$(echo "$after + $(gets "$p")" | bc); done
GETS=$(echo "$after - $before" | bc)
echo "size ${SIZE} MiB, ${BLOCKS} blocks of 4 MiB, store 20 ms late, mode $MODE"
echo "one mount alone, cold: ${ALONE} s"
echo "four mounts at once, cold: ${FOUR} s ($(echo "scale=2; $FOUR / $ALONE" | bc)x one alone)"
echo "bucket GETs of the four: ${GETS} ($(echo "scale=2; $GETS / $BLOCKS" | bc)x the blocks)"
if [ "$MODE" = peers ]; then
  mount_one m5 --peer-cache 127.0.0.1:0; f=$MPORT
  for _ in $(seq 100); do [ "$(fig "$f" unkai_peer_members)" = "5.0000" ] && break; sleep 0.2; done
  # The whole file again, sequentially: 4/5 of its blocks are held by the other members.
  cat "$T/mnt-m5/data" >/dev/null
  pl=$(echo "scale=2; 1000 * $(fig "$f" unkai_peer_request_duration_seconds_sum) / $(fig "$f" unkai_peer_request_duration_seconds_count)" | bc)
  echo "sequential read, per block: from a peer ${pl} ms mean; a GET of the mount alone ${GL} ms mean ($(echo "scale=2; $pl / $GL" | bc)x)"
fi
