#!/usr/bin/env bash
# Installs what is missing, builds unkai, installs it to /usr/local/bin and mounts the
# embedded default volume at /mnt/unkai (or at $1). Run as root on Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."
MOUNTPOINT="${1:-/mnt/unkai}"

. scripts/lib/deps.sh
ensure_build_deps

echo "==> building unkai (release)"
cargo build --release --locked
install -m 0755 target/release/unkai /usr/local/bin/unkai

mkdir -p "$MOUNTPOINT"
if grep -q " $(realpath "$MOUNTPOINT") fuse" /proc/mounts; then
  echo "==> $MOUNTPOINT is already mounted"
else
  unkai mount -d "$MOUNTPOINT"
fi
df -h "$MOUNTPOINT"
echo "==> done: the default volume is mounted at $MOUNTPOINT (unmount: unkai umount $MOUNTPOINT)"
