#!/usr/bin/env bash
# Large sequential write and read through `unkai nfs` (libnfs-utils' nfs-cp and nfs-cat)
# against a FUSE mount of the same volume (cp and cat), in the same run, alternating.
#
#   scripts/bench-nfs.sh [SIZE_MIB] [RUNS]       (default 1024 MiB, 3 runs)
#   UNKAI_FAULTS=latency_ms=20 scripts/bench-nfs.sh 256 1   # both sides with store latency
#   UNKAI_BENCH_ARGS=--writeback scripts/bench-nfs.sh         # flags for both mount and nfs
#
# Reads are cold: both clients are restarted after the writes and the page cache dropped.
# Prints MB/s per run and the medians. Needs root (mount, drop_caches), libnfs-utils, and a
# release build (cargo build --release). Everything lives in a temporary directory, removed
# at exit with the mount unmounted and the server stopped.
set -euo pipefail
SIZE_MIB="${1:-1024}"
RUNS="${2:-3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/unkai"
command -v nfs-cp >/dev/null || { echo "nfs-cp missing: apt-get install libnfs-utils" >&2; exit 1; }
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }

T="$(mktemp -d /tmp/unkai-bench-nfs.XXXXXX)"
MNT="$T/mnt"; mkdir -p "$MNT"
export UNKAI_CACHE_DIR="$T/cache"
META="sqlite://$T/meta.db"
SRV=""; MOUNTED=""
cleanup() {
  [ -n "$SRV" ] && kill -TERM "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null || true
  [ -n "$MOUNTED" ] && "$BIN" umount "$MNT" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT

"$BIN" format "$META" benchnfs >/dev/null 2>&1
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# Both clients started afresh: reads after it find no block in either process's memory.
start() {
  "$BIN" mount -d "$META" "$MNT" --log-level warn ${UNKAI_BENCH_ARGS:-} >>"$T/mount.log" 2>&1; MOUNTED=1
  : >"$T/nfs.log"
  UNKAI_CACHE_DIR="$T/cache-nfs" "$BIN" nfs "$META" --listen "127.0.0.1:$PORT" --no-root-squash ${UNKAI_BENCH_ARGS:-} >>"$T/nfs.log" 2>&1 &
  SRV=$!
  for _ in $(seq 600); do grep -q "nfs serving volume" "$T/nfs.log" && break; sleep 0.1; done
  grep -q "nfs serving volume" "$T/nfs.log" || { cat "$T/nfs.log"; exit 1; }
}
stop() {
  kill -TERM "$SRV"; wait "$SRV" || true; SRV=""
  "$BIN" umount "$MNT" >/dev/null; MOUNTED=""
}
start
url() { echo "nfs://127.0.0.1//$1?nfsport=$PORT&mountport=$PORT"; }

SRC="$T/src"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$SRC"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
# Seconds of a command, as a decimal.
secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N); echo "$e - $s" | bc -l; }
mbs() { echo "scale=1; $SIZE_MIB * 1.048576 / $1" | bc -l; }

declare -a FW FR NW NR
for r in $(seq "$RUNS"); do
  cat "$SRC" >/dev/null
  t=$(secs bash -c "cp '$SRC' '$MNT/fuse-$r' && sync -f '$MNT/fuse-$r'"); FW+=("$(mbs "$t")")
  t=$(secs nfs-cp "$SRC" "$(url "nfs-$r")"); NW+=("$(mbs "$t")")
  stop; start
  drop
  t=$(secs cat "$MNT/fuse-$r"); FR+=("$(mbs "$t")")
  drop
  t=$(secs bash -c "nfs-cat '$(url "nfs-$r")' >/dev/null"); NR+=("$(mbs "$t")")
  cmp -s "$SRC" "$MNT/nfs-$r" || { echo "run $r: the file written over NFS differs" >&2; exit 1; }
  echo "run $r: write MB/s fuse ${FW[-1]} nfs ${NW[-1]}; read MB/s fuse ${FR[-1]} nfs ${NR[-1]}"
  rm -f "$MNT/fuse-$r" "$MNT/nfs-$r"
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
fw=$(med "${FW[@]}"); nw=$(med "${NW[@]}"); fr=$(med "${FR[@]}"); nr=$(med "${NR[@]}")
echo "median of $RUNS, $SIZE_MIB MiB${UNKAI_FAULTS:+, UNKAI_FAULTS=$UNKAI_FAULTS}:"
echo "| | FUSE (cp, cat) | NFS (nfs-cp, nfs-cat) | NFS / FUSE |"
echo "|---|--:|--:|--:|"
echo "| sequential write MB/s | $fw | $nw | $(echo "scale=2; $nw / $fw" | bc -l) |"
echo "| sequential read MB/s | $fr | $nr | $(echo "scale=2; $nr / $fr" | bc -l) |"
