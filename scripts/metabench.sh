#!/usr/bin/env bash
# Metadata micro-benchmark: create/stat/delete N files on a mounted SQLite volume and on a
# mounted PostgreSQL volume (a private server from scripts/postgres.sh, fsync off like the
# tests; SQLite keeps its default synchronous=NORMAL), both with file:// storage.
#   scripts/metabench.sh [N] [extra mount flags...]
# e.g. scripts/metabench.sh 10000 --attr-ttl 0 --entry-ttl 0 --negative-ttl 0
# Everything lives in a temporary directory, unmounted and stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10000}"
shift || true
cargo build --release --quiet --bin unkai --example metabench
bin=target/release/unkai
bench=target/release/examples/metabench
work=$(mktemp -d /tmp/unkai-metabench.XXXXXX)
chmod 755 "$work"
cleanup() {
  for mp in "$work"/mnt-*; do
    mountpoint -q "$mp" 2>/dev/null && "$bin" umount "$mp" >/dev/null 2>&1 || true
  done
  scripts/postgres.sh stop "$work/pg" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

run() {
  local name=$1 url=$2 mp="$work/mnt-$1"
  shift 2
  mkdir -p "$mp"
  "$bin" format --storage "file://$work/bucket-$name" "$url" "$name" >/dev/null
  "$bin" mount -d --log "$work/$name.log" "$@" "$url" "$mp"
  mkdir "$mp/bench"
  echo "== $name"
  "$bench" "$mp/bench" "$n"
  "$bin" umount "$mp"
}

scripts/postgres.sh install >/dev/null
admin=$(scripts/postgres.sh start "$work/pg")
pgurl="${admin%/postgres*}/bench?sslmode=disable"
run sqlite "sqlite://$work/meta.db" "$@"
run postgres "$pgurl" "$@"
