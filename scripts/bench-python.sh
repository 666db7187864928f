#!/usr/bin/env bash
# Issue 39's targets: the Python client (the `unkai` wheel, installed by scripts/python.sh into
# target/py-venv) against Python reading through a FUSE mount of the same volume: a 1 GiB
# file read sequentially, and 10,000 files of 4 KiB each opened, read and closed
# (python/bench.py), each side alone on the volume. A fresh SQLite volume on a local bucket in a temporary directory,
# mounted for the run and unmounted on every exit. Prints the figures (docs/benchmarks.md).
#   scripts/bench-python.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/py-venv
[ -x "$VENV/bin/python" ] || { echo "error: no $VENV: run scripts/python.sh first" >&2; exit 1; }
work=$(mktemp -d "${1:-/tmp}/unkai-bench-py.XXXXXX")
mnt="$work/mnt"
cleanup() {
  if grep -q " $mnt " /proc/mounts; then
    target/release/unkai umount "$mnt" || umount -l "$mnt"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$mnt"
url="sqlite://$work/meta.db"
target/release/unkai format --storage "file://$work/bucket" "$url" benchpy >/dev/null
py() { "$VENV/bin/python" -P python/bench.py "$@"; }  # -P: the wheel, not python/unkai
py setup "$url" "$work"
target/release/unkai mount -d --cache-dir "$work/fusecache" "$url" "$mnt"
py fuse "$url" "$work" "$mnt"
target/release/unkai umount "$mnt"
py python "$url" "$work"
py report "$url" "$work"
