#!/usr/bin/env bash
# Runs the peer test suites against a freshly mounted volume and prints their results:
#   - pjdfstest (the Rust port, crate `pjdfstest`): must report 0 failures;
#   - fsx (crate `fsx`): FSX_OPS operations (default 100000) with every operation enabled;
#   - then `unkai fsck` must find the volume consistent.
# Run as root after `cargo build --release`. Tools install once into $UNKAI_TOOLS.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

BIN="$PWD/target/release/unkai"
[ -x "$BIN" ] || cargo build --release --locked
TOOLS="${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}"
export PATH="$TOOLS/bin:$PATH"
# The EROFS cases remount through mount(8), which runs the fuse helper `unkai` from a fixed
# PATH (/usr/local/bin, /usr/bin, ...), not ours: install the binary there as the quick start
# does, unless the one found there is this build (an older one would serve the remounts).
installed=$(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin command -v unkai || true)
if [ -z "$installed" ] || ! cmp -s "$BIN" "$installed"; then
  echo "==> installing $BIN as /usr/local/bin/unkai (mount helper for remounts)"
  install -m 0755 "$BIN" /usr/local/bin/unkai
fi

apt_install libacl1-dev acl
ensure_peer_tools

work=$(mktemp -d /tmp/unkai-peer.XXXXXX)
# pjdfstest switches to unprivileged users, who must reach the mount through this directory.
chmod 755 "$work"
mnt="$work/mnt"
mkdir -p "$mnt" "$work/second"
cleanup() {
  if grep -q " $mnt fuse" /proc/mounts; then
    "$BIN" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

meta="sqlite://$work/meta.db"
"$BIN" format "$meta" peer >/dev/null
"$BIN" mount -d --log "$work/mount.log" "$meta" "$mnt"

echo "==> pjdfstest (Rust port)"
# At the mount root: its EROFS cases remount the path they are given read-only. They run in a
# second process: the runner keeps descriptors of earlier cases open for writing, and the
# kernel refuses a read-only remount while any file is open for writing (on any file system).
run_pjd() {
  local conf=$1; shift
  pjdfstest -c "$conf" -p "$mnt" -s "$work/second" "$@" > "$work/pjd.out" 2>&1 || true
  grep -v ' ok$' "$work/pjd.out" | grep -v '^$' | grep -v '^ *[0-9]*: \|^ *at ' | tail -n 30
  summary=$(grep '^Summary:' "$work/pjd.out" || true)
  echo "pjdfstest $*: ${summary:-no summary (crashed?)}"
  case "$summary" in
    "Summary: 0 failed"*) ;;
    *) echo "pjdfstest failed; log: $work/mount.log"; tail -20 "$work/mount.log"; exit 1 ;;
  esac
}
run_pjd scripts/peer/pjdfstest.toml
run_pjd scripts/peer/pjdfstest-erofs.toml erofs

ops="${FSX_OPS:-100000}"
seed="${FSX_SEED:-$(( $(date +%s) % 100000 ))}"
echo "==> fsx: $ops operations, seed $seed"
mkdir "$mnt/fsx"
if ! fsx -f scripts/peer/fsx.toml -N "$ops" -S "$seed" -P "$work" "$mnt/fsx/file" > "$work/fsx.out" 2>&1; then
  tail -40 "$work/fsx.out"
  echo "fsx failed (seed $seed); log: $work/mount.log"
  exit 1
fi
tail -n 1 "$work/fsx.out"

"$BIN" umount "$mnt" >/dev/null
echo "==> fsck after the peer suites"
"$BIN" fsck -q "$meta"
