#!/usr/bin/env bash
# The peer cache's figures (issue 37; recorded in docs/benchmarks.md), by hand:
#   scripts/peer-bench.sh [SIZE_MIB] [peers|alone|quarters]
# A versitygw S3 server on 127.0.0.1 (scripts/servers.sh install), every request 20 ms late
# (UNKAI_FAULTS), a volume of 4 MiB blocks holding one file of SIZE_MIB; then:
#   1. one mount alone reads it cold: its time;
#   2. four mounts (own cache directories; in a peer cache group unless `alone`) read it
#      cold at the same moment: their time, and the bucket's GETs by their own counters;
#   3. a fifth member reads it: the mean time of a block from a peer vs a GET of step 1;
#   4. (peers) single-block probes, one at a time, no read-ahead: the first 4 KiB of each of
#      PROBES one-block files, by the mount alone (a GET each) and by a mount that asks the
#      group (--no-sharing: every block from its owner, which holds it); and 4 KiB at a
#      random offset (a small random read) by a cold mount alone (ranged GETs) and by a cold
#      mount asking the group (the owner answers the segments it holds); and signed GETs of
#      held blocks sent straight to their owners by Python (the owner's and loopback's share
#      of a block from a peer, without the asker's HTTP stack).
# PERF=FILE: `perf record -g -a` (call graphs) while the four mounts read (step 2), into FILE.
# UNKAI_LOG=info,unkai::data::peers=debug: each peer request's phases in the mounts' logs
# (kept in /tmp/peer-bench-logs).
# `quarters`: the dataset (SIZE_MIB in four files) does not fit one member's disk cache
# (--cache-size SIZE_MIB/2); four members each read a different quarter, then each reads
# all of it: the bucket's GETs of each pass.
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
mount_one() { # NAME [flags...]: mounts; its metrics port in $MPORT, its pid in $MPID
  local name=$1; shift
  local mp=$T/mnt-$name mport; mport=$(port); MPORT=$mport
  mkdir -p "$mp"
  "$BIN" mount --writeback off --free-space-ratio 0 --cache-dir "$T/cache-$name" --metrics 127.0.0.1:$mport "$@" "$META" "$mp" >"$T/$name.log" 2>&1 &
  PIDS+=($!); MPS+=("$mp"); MPID=$!
  for _ in $(seq 300); do mountpoint -q "$mp" && break; sleep 0.1; done
}
cpu() { # PID...: their CPU seconds so far (user + system, all threads)
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "scale=2; $t / $(getconf CLK_TCK)" | bc
}
fig() { # PORT NAME [LABEL]: sum of the samples of NAME whose labels hold LABEL
  curl -s "http://127.0.0.1:$1/metrics" | grep "^$2{" | grep -F "${3:-}" | awk '{s+=$NF} END {printf "%.4f\n", s+0}'
}
gets() { echo "$(fig "$1" unkai_object_request_duration_seconds_count 'op="get"') + $(fig "$1" unkai_object_request_duration_seconds_count 'op="get_range"')" | bc; }
PROBES=${PROBES:-24}
# Seconds per read, one at a time: the first 4 KiB of each file (OFF=0), or 4 KiB at a
# random offset past the first block's first quarter (OFF=rand).
probe() { # DIR OFF
  python3 - "$1" "$2" "$PROBES" <<'PY'
import os, random, sys, time
d, off, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ts = []
for i in range(n):
    f = os.path.join(d, "p%03d" % i)
    o = 0 if off == "0" else random.randrange(1 << 20, (4 << 20) - 4096) & ~4095
    s = time.perf_counter()
    fd = os.open(f, os.O_RDONLY)
    os.pread(fd, 4096, o)
    os.close(fd)
    ts.append(time.perf_counter() - s)
ts.sort()
print("median %.1f ms, mean %.1f ms" % (1000 * ts[len(ts) // 2], 1000 * sum(ts) / len(ts)))
PY
}
# Signed GETs of PROBES held 4 MiB blocks, one at a time, sent straight to their owners
# (rendezvous as data::peers::place) by Python: the owner's and loopback's share.
raw_probe() { # (no arguments)
  python3 - "$T" "$PROBES" <<'PY'
import hashlib, hmac, http.client, os, re, sqlite3, sys, time, glob
T = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 24
key = bytes.fromhex(sqlite3.connect(T + "/meta.db").execute("SELECT value FROM setting WHERE name='peerKey'").fetchone()[0])
members = []
for log in glob.glob(T + "/m[1-4].log"):
    m = re.search(r"serving blocks on (127\.0\.0\.1:\d+)", open(log).read())
    if m: members.append(m.group(1))
root = T + "/s3/bench/vols/"
keys = []
for dp, dn, fn in os.walk(root):
    for f in fn:
        keys.append(os.path.join(dp, f)[len(root):])
# Whole 4 MiB blocks (ID_INDEX_LEN), held by their owners after the reads above.
keys = sorted(k for k in keys if k.endswith("_4194304"))[:n]
def owner(k):
    return max(members, key=lambda m: (int.from_bytes(hashlib.sha256(m.encode() + b"\0" + k.encode()).digest()[:8], "big"), m))
conns = {}
ttfb, tot = [], []
for k in keys:
    o = owner(k)
    path = "/v1/blocks/" + k
    t = int(time.time()); nonce = os.urandom(16).hex()
    tag = hmac.new(key, f"unkai-peer-v2\nGET\n{path}\n{t}\n{nonce}".encode(), hashlib.sha256).hexdigest()
    c = conns.get(o) or http.client.HTTPConnection(*o.split(":"))
    conns[o] = c
    s = time.perf_counter()
    c.request("GET", path, headers={"x-unkai-peer-auth": f"{t}.{nonce}.{tag}"})
    r = c.getresponse()
    f = time.perf_counter()
    body = r.read()
    e = time.perf_counter()
    assert r.status == 200, (r.status, body[:100])
    ttfb.append(1000 * (f - s)); tot.append(1000 * (e - s))
ttfb.sort(); tot.sort()
print("raw signed GETs to owners (%d, python): first byte median %.1f ms, whole median %.1f ms, mean %.1f ms" % (len(tot), ttfb[len(ttfb)//2], tot[len(tot)//2], sum(tot)/len(tot)))
PY
}
mount_one writer
if [ "$MODE" = quarters ]; then
  for q in 1 2 3 4; do
    dd if=/dev/urandom of="$T/mnt-writer/q$q" bs=1M count=$((SIZE / 4)) status=none
  done
  umount "$T/mnt-writer"
  export UNKAI_FAULTS=latency_ms=20
  ports=()
  for i in 1 2 3 4; do
    mount_one m$i --peer-cache 127.0.0.1:0 --cache-size "$((SIZE / 2))M"; ports+=("$MPORT")
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do [ "$(fig "$p" unkai_peer_members)" = "4.0000" ] && break; sleep 0.2; done
  done
  total() { local t=0; for p in "${ports[@]}"; do t=$(echo "$t + $(gets "$p")" | bc); done; echo "$t"; }
  g0=$(total); s=$(date +%s.%N)
  CATS=(); for i in 1 2 3 4; do cat "$T/mnt-m$i/q$i" >/dev/null & CATS+=($!); done; wait "${CATS[@]}"
  e=$(date +%s.%N); g1=$(total); t1=$(echo "$e - $s" | bc)
  s=$(date +%s.%N)
  CATS=(); for i in 1 2 3 4; do cat "$T"/mnt-m$i/q[1234] >/dev/null & CATS+=($!); done; wait "${CATS[@]}"
  e=$(date +%s.%N); g2=$(total); t2=$(echo "$e - $s" | bc)
  P1=$(echo "$g1 - $g0" | bc); P2=$(echo "$g2 - $g1" | bc)
  echo "dataset ${SIZE} MiB in quarters ($((SIZE / 4)) blocks of 4 MiB), --cache-size $((SIZE / 2))M each, store 20 ms late"
  echo "first pass (each member its quarter): ${P1} GETs, ${t1} s"
  echo "second pass (each member all of it): ${P2} GETs, ${t2} s ($(echo "scale=3; $P2 / $P1" | bc)x the first)"
  for i in 1 2 3 4; do
    echo "m$i disk cache: $(du -sm "$T/cache-m$i" | cut -f1) MiB; served $(fig "${ports[$((i-1))]}" unkai_peer_served_total) blocks"
  done
  exit 0
fi
dd if=/dev/urandom of="$T/mnt-writer/data" bs=1M count="$SIZE" status=none
if [ "$MODE" = peers ]; then
  for i in $(seq 0 $((PROBES - 1))); do
    dd if=/dev/urandom of="$T/mnt-writer/$(printf p%03d "$i")" bs=1M count=4 status=none
  done
fi
umount "$T/mnt-writer"
BLOCKS=$(( (SIZE + 3) / 4 ))
export UNKAI_FAULTS=latency_ms=20
mount_one alone; a=$MPORT
c0=$(cpu "$MPID"); s=$(date +%s.%N); cat "$T/mnt-alone/data" >/dev/null; e=$(date +%s.%N)
ALONE=$(echo "$e - $s" | bc); ALONE_CPU=$(echo "$(cpu "$MPID") - $c0" | bc)
GL=$(echo "scale=2; 1000 * $(fig "$a" unkai_object_request_duration_seconds_sum 'op="get"') / $(fig "$a" unkai_object_request_duration_seconds_count 'op="get"')" | bc)
if [ "$MODE" = peers ]; then
  gs=$(fig "$a" unkai_object_request_duration_seconds_sum 'op="get"'); gc=$(fig "$a" unkai_object_request_duration_seconds_count 'op="get"')
  PROBE_ALONE=$(probe "$T/mnt-alone" 0)
  PROBE_GET=$(echo "scale=2; 1000 * ($(fig "$a" unkai_object_request_duration_seconds_sum 'op="get"') - $gs) / ($(fig "$a" unkai_object_request_duration_seconds_count 'op="get"') - $gc)" | bc)
  umount "$T/mnt-alone"; rm -rf "$T/cache-alone"
  mount_one alone2; a=$MPORT
  SMALL_ALONE=$(probe "$T/mnt-alone2" rand)
fi
umount "$T/mnt-alone${PROBE_ALONE:+2}"
PEER=()
ports=()
mpids=()
for i in 1 2 3 4; do
  if [ "$MODE" = peers ]; then PEER=(--peer-cache 127.0.0.1:0); fi
  mount_one m$i "${PEER[@]}"; ports+=("$MPORT"); mpids+=("$MPID")
done
if [ "$MODE" = peers ]; then
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do [ "$(fig "$p" unkai_peer_members)" = "4.0000" ] && break; sleep 0.2; done
  done
fi
before=0; for p in "${ports[@]}"; do before=$(echo "$before + $(gets "$p")" | bc); done
if [ -n "${PERF:-}" ]; then
  perf record -g -F 1000 -a -o "$PERF" 2>/dev/null & PERFPID=$!
  sleep 0.5
fi
c0=$(cpu "${mpids[@]}"); L0=$(cut -d' ' -f1 /proc/loadavg)
s=$(date +%s.%N)
CATS=()
for i in 1 2 3 4; do cat "$T/mnt-m$i/data" >/dev/null & CATS+=($!); done
wait "${CATS[@]}"
if [ -n "${PERF:-}" ]; then kill -INT "$PERFPID"; wait "$PERFPID" || true; fi
e=$(date +%s.%N)
FOUR=$(echo "$e - $s" | bc); FOUR_CPU=$(echo "$(cpu "${mpids[@]}") - $c0" | bc); L1=$(cut -d' ' -f1 /proc/loadavg)
after=0; for p in "${ports[@]}"; do after=$(echo "$after + $(gets "$p")" | bc); done
GETS=$(echo "$after - $before" | bc)
echo "size ${SIZE} MiB, ${BLOCKS} blocks of 4 MiB, store 20 ms late, mode $MODE"
echo "one mount alone, cold: ${ALONE} s (the mount's CPU ${ALONE_CPU} s)"
echo "four mounts at once, cold: ${FOUR} s ($(echo "scale=2; $FOUR / $ALONE" | bc)x one alone; the mounts' CPU ${FOUR_CPU} s, $(echo "scale=2; $FOUR_CPU / $ALONE_CPU" | bc)x; load average ${L0} -> ${L1})"
echo "bucket GETs of the four: ${GETS} ($(echo "scale=2; $GETS / $BLOCKS" | bc)x the blocks)"
if [ "$MODE" = peers ]; then
  mount_one m5 --peer-cache 127.0.0.1:0; f=$MPORT
  for _ in $(seq 100); do [ "$(fig "$f" unkai_peer_members)" = "5.0000" ] && break; sleep 0.2; done
  # The whole file again, sequentially: 4/5 of its blocks are held by the other members.
  cat "$T/mnt-m5/data" >/dev/null
  pl=$(echo "scale=2; 1000 * $(fig "$f" unkai_peer_request_duration_seconds_sum) / $(fig "$f" unkai_peer_request_duration_seconds_count)" | bc)
  echo "sequential read, per block: from a peer ${pl} ms mean; a GET of the mount alone ${GL} ms mean ($(echo "scale=2; $pl / $GL" | bc)x)"
  # The owners fetch the probe files' blocks and keep them; then a mount that only asks.
  probe "$T/mnt-m1" 0 >/dev/null
  mount_one asker --peer-cache 127.0.0.1:0 --no-sharing; q=$MPORT
  for _ in $(seq 100); do [ "$(fig "$q" unkai_peer_members)" = "5.0000" ] && break; sleep 0.2; done
  ps0=$(fig "$q" unkai_peer_request_duration_seconds_sum); pc0=$(fig "$q" unkai_peer_request_duration_seconds_count); g0=$(gets "$q")
  PROBE_PEER=$(probe "$T/mnt-asker" 0)
  pp=$(echo "scale=2; 1000 * ($(fig "$q" unkai_peer_request_duration_seconds_sum) - $ps0) / ($(fig "$q" unkai_peer_request_duration_seconds_count) - $pc0)" | bc)
  g1=$(gets "$q")
  raw_probe || true
  echo "single-block probe (first 4 KiB of a one-block file, no read-ahead, ${PROBES} files one at a time):"
  # The store's 20 ms are injected outside the request's timing (object::faulty).
  echo "  mount alone (a whole-block GET each): ${PROBE_ALONE}; its GETs ${PROBE_GET} ms mean + 20 ms injected"
  echo "  asking the group (owner holds it): ${PROBE_PEER}; peer requests ${pp} ms mean; bucket GETs $(echo "$g1 - $g0" | bc)"
  echo "  ratio of the requests: $(echo "scale=2; $pp / ($PROBE_GET + 20)" | bc)x"
  mount_one asker2 --peer-cache 127.0.0.1:0 --no-sharing; q=$MPORT
  for _ in $(seq 100); do [ "$(fig "$q" unkai_peer_members)" = "5.0000" ] && break; sleep 0.2; done
  g0=$(gets "$q")
  SMALL_PEER=$(probe "$T/mnt-asker2" rand)
  echo "small random read (4 KiB at a random offset, ${PROBES} files one at a time):"
  echo "  mount alone (ranged GETs): ${SMALL_ALONE}"
  echo "  asking the group (the owner holds it, answers the segments): ${SMALL_PEER}; bucket GETs $(echo "$(gets "$q") - $g0" | bc)"
fi
