#!/usr/bin/env bash
# Runs `unkai bench --workload all --quick` on a fresh volume and on a local directory of the
# same disk, and prints the table (figures only: no assertion on speed). Run as root after
# `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

BIN="$PWD/target/release/unkai"
[ -x "$BIN" ] || cargo build --release --locked
command -v fio >/dev/null || apt_install fio

work=$(mktemp -d /tmp/unkai-bench.XXXXXX)
mnt="$work/mnt"
mkdir -p "$mnt" "$work/local"
cleanup() {
  if grep -q " $mnt fuse" /proc/mounts; then
    "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

meta="sqlite://$work/meta.db"
"$BIN" format "$meta" bench >/dev/null
"$BIN" mount -d --log "$work/mount.log" "$meta" "$mnt"
echo "==> unkai bench --workload all --quick (unkai mount vs local directory)"
"$BIN" bench --workload all --quick --json "$work/bench.json" "$mnt" "$work/local"
"$BIN" umount "$mnt" >/dev/null
"$BIN" fsck -q "$meta"
