#!/usr/bin/env bash
# Large sequential write and read of one object through `unkai gateway` (curl's SigV4, one
# PUT and one GET; and the AWS CLI, multipart and parallel ranged GETs) vs
# `cp`/`dd` through a FUSE mount of the same volume, in the same run. Prints MB/s; no
# assertion on speed. Usage: scripts/bench-gateway.sh [SIZE_MIB] (default 1024). Run as
# root after `cargo build --release`; UNKAI_FAULTS in the environment reaches both servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

SIZE_MIB="${1:-1024}"
BIN="$PWD/target/release/unkai"
[ -x "$BIN" ] || cargo build --release --locked
command -v aws >/dev/null || apt_install awscli

work=$(mktemp -d /tmp/unkai-bench-gw.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt"
gw_pid=""
cleanup() {
  [ -n "$gw_pid" ] && kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null || true
  if grep -q " $mnt fuse" /proc/mounts; then
    "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

meta="sqlite://$work/meta.db"
"$BIN" format "$meta" bench >/dev/null
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$work/src"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
now() { date +%s.%N; }
rate() { awk -v s="$SIZE_MIB" -v t="$1" 'BEGIN { printf "%.0f", s * 1.048576 / t }'; }

mount_vol() { "$BIN" mount -d --log "$work/mount.log" "$meta" "$mnt"; }
umount_vol() { "$BIN" umount "$mnt" >/dev/null; }

export UNKAI_GATEWAY_ACCESS_KEY=bench UNKAI_GATEWAY_SECRET_KEY=bench-secret-key
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret-key AWS_DEFAULT_REGION=us-east-1
port=$((20000 + RANDOM % 20000))
start_gw() {
  "$BIN" gateway --listen "127.0.0.1:$port" "$meta" >>"$work/gateway.log" 2>&1 &
  gw_pid=$!
  for _ in $(seq 600); do
    grep -q "gateway serving volume" "$work/gateway.log" 2>/dev/null && grep -c "gateway serving volume" "$work/gateway.log" | grep -qx "$1" && return
    sleep 0.1
  done
  echo "the gateway did not start:" >&2; cat "$work/gateway.log" >&2; exit 1
}
stop_gw() { kill "$gw_pid"; wait "$gw_pid" || true; gw_pid=""; }
s3() { aws --endpoint-url "http://127.0.0.1:$port" --only-show-errors "$@"; }
curl_s3() {
  curl -sSf --aws-sigv4 "aws:amz:us-east-1:s3" --user "bench:bench-secret-key" \
    -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"
}
secs() { awk -v a="$1" -v b="$2" 'BEGIN { print b - a }'; }

# FUSE: dd with an fsync at the end (as the gateway makes each object durable), then a read
# after a remount (nothing of it in the mount's memory) with the page cache dropped.
mount_vol
mkdir -p "$mnt/bench"
drop
t0=$(now); dd if="$work/src" of="$mnt/bench/fuse.bin" bs=1M conv=fsync status=none; t1=$(now)
fuse_w=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
umount_vol; mount_vol; drop
t0=$(now); dd if="$mnt/bench/fuse.bin" of=/dev/null bs=1M status=none; t1=$(now)
fuse_r=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
umount_vol

# The gateway, restarted (and the page cache dropped) before each read: curl (a single PUT
# and GET, a light client), then `aws s3 cp` up (multipart, its default 8 MiB parts) and down.
start_gw 1
drop
t0=$(now); curl_s3 -o /dev/null -T "$work/src" "http://127.0.0.1:$port/bench/curl.bin"; t1=$(now)
curl_w=$(secs "$t0" "$t1")
stop_gw; start_gw 2; drop
t0=$(now); curl_s3 -o "$work/back" "http://127.0.0.1:$port/bench/curl.bin"; t1=$(now)
curl_r=$(secs "$t0" "$t1")
cmp -s "$work/src" "$work/back" || { echo "the object read back differs" >&2; exit 1; }
rm -f "$work/back"
drop
t0=$(now); s3 s3 cp "$work/src" s3://bench/gw.bin; t1=$(now)
gw_w=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
stop_gw; start_gw 3; drop
t0=$(now); s3 s3 cp s3://bench/gw.bin "$work/back"; t1=$(now)
gw_r=$(secs "$t0" "$t1")
cmp -s "$work/src" "$work/back" || { echo "the object read back differs" >&2; exit 1; }
stop_gw

echo "size: $SIZE_MIB MiB${UNKAI_FAULTS:+, UNKAI_FAULTS=$UNKAI_FAULTS}; aws $(aws --version 2>&1 | cut -d' ' -f1)"
printf "%-28s %10s %10s\n" "path" "write MB/s" "read MB/s"
printf "%-28s %10s %10s\n" "FUSE mount (dd)" "$(rate "$fuse_w")" "$(rate "$fuse_r")"
printf "%-28s %10s %10s\n" "gateway (curl)" "$(rate "$curl_w")" "$(rate "$curl_r")"
printf "%-28s %10s %10s\n" "gateway (aws s3 cp)" "$(rate "$gw_w")" "$(rate "$gw_r")"
awk -v fw="$fuse_w" -v fr="$fuse_r" -v cw="$curl_w" -v cr="$curl_r" -v gw="$gw_w" -v gr="$gw_r" \
  'BEGIN { printf "gateway / FUSE: curl write %.2f, read %.2f; aws write %.2f, read %.2f\n", fw / cw, fr / cr, fw / gw, fr / gr }'
"$BIN" fsck -q "$meta"
