#!/usr/bin/env bash
# Large sequential write and read through `unkai webdav` (curl PUT/GET) against the same
# through a FUSE mount of the same volume (cp/cat), in the same run, on a fresh SQLite volume
# with a local bucket. Each path reads the file the other path wrote (so neither process
# has it cached), the kernel's page cache dropped first. Prints MB/s and the ratio.
#
#   scripts/bench-webdav.sh [SIZE_MIB]          # default 1024
#   UNKAI_FAULTS=latency_ms=20 scripts/bench-webdav.sh 256   # every object request 20 ms late
#
# Run as root after `cargo build --release`. Figures only: nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

SIZE_MIB="${1:-1024}"
BIN="$PWD/target/release/unkai"
[ -x "$BIN" ] || cargo build --release --locked
command -v curl >/dev/null || apt_install curl

work=$(mktemp -d /tmp/unkai-bench-webdav.XXXXXX)
src=$(mktemp /dev/shm/unkai-bench-webdav.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  if grep -q " $mnt fuse" /proc/mounts; then
    "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" || true
  fi
  rm -rf "$work" "$src"
}
trap cleanup EXIT

export UNKAI_CACHE_DIR="$work/cache"
meta="sqlite://$work/meta.db"
"$BIN" format --storage "file://$work/bucket" "$meta" benchdav >/dev/null
"$BIN" mount -d --log "$work/mount.log" "$meta" "$mnt"
UNKAI_WEBDAV_PASSWORD=bench "$BIN" webdav "$meta" --user bench --listen 127.0.0.1:0 \
  >"$work/webdav.log" 2>&1 &
server=$!
for _ in $(seq 600); do
  addr=$(grep -o "webdav serving volume 'benchdav' at [0-9.:]*" "$work/webdav.log" | awk '{print $NF}' || true)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "the webdav server did not start:"; cat "$work/webdav.log"; exit 1; }

echo "==> $SIZE_MIB MiB of random bytes in $src"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$src"

now() { date +%s.%N; }
rate() { awk -v b="$((SIZE_MIB << 20))" -v t="$1" 'BEGIN { printf "%.0f", b / t / 1e6 }'; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }

drop
t0=$(now); cp "$src" "$mnt/fuse.bin"; t1=$(now)
fuse_w=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
drop
t0=$(now)
code=$(curl -sS -o /dev/null -w '%{http_code}' -u bench:bench -T "$src" "http://$addr/dav.bin")
t1=$(now)
[ "$code" = 201 ] || { echo "PUT answered $code"; exit 1; }
dav_w=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')

# Reads: each path reads what the other wrote.
drop
t0=$(now); cat "$mnt/dav.bin" >/dev/null; t1=$(now)
fuse_r=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
drop
t0=$(now)
curl -sS -o /dev/null -u bench:bench "http://$addr/fuse.bin"
t1=$(now)
dav_r=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
# The bytes checked apart, untimed.
curl -sS -u bench:bench "http://$addr/fuse.bin" | cmp -s "$src" - || { echo "GET returned other bytes"; exit 1; }
cmp -s "$src" "$mnt/dav.bin" || { echo "the FUSE mount reads other bytes of dav.bin"; exit 1; }

fw=$(rate "$fuse_w"); dw=$(rate "$dav_w"); fr=$(rate "$fuse_r"); dr=$(rate "$dav_r")
echo
echo "faults: ${UNKAI_FAULTS:-none}; $SIZE_MIB MiB; $(nproc) CPUs"
printf '| %-28s | %12s | %12s | %8s |\n' "" "WebDAV" "FUSE" "ratio"
printf '| %-28s | %7s MB/s | %7s MB/s | %8s |\n' "sequential write (PUT / cp)" "$dw" "$fw" \
  "$(awk -v a="$dw" -v b="$fw" 'BEGIN { printf "%.2f", a / b }')"
printf '| %-28s | %7s MB/s | %7s MB/s | %8s |\n' "sequential read (GET / cat)" "$dr" "$fr" \
  "$(awk -v a="$dr" -v b="$fr" 'BEGIN { printf "%.2f", a / b }')"
