#!/usr/bin/env bash
# Many clients on one shared volume: PostgreSQL metadata, S3 data (versitygw), N mounts (each
# its own unkai process and mountpoint), N = 1, 2, 4 by default.
#   scripts/scaling.sh [--size 256M] [--files 2000] [--sqlite] [N...]
# For each N, on a fresh volume:
#   S2 (SUITE.md): each client writes its own file (fio, 1 MiB sequential, fsync at the end),
#       then every mount is restarted (cold caches, page cache dropped) and each client reads
#       its file back. Prints aggregate and per-client MB/s.
#   M:  each client creates, stats and deletes --files empty files in its own directory
#       (examples/metabench.rs), all clients at once. Prints the sum of the clients' ops/s.
# --sqlite runs M on an SQLite volume too (N mounts of one SQLite file on this machine).
#
#   scripts/scaling.sh --meta [--delay MS] [--runs R] [--quick] [N...]
# S2 for metadata (SUITE.md; `unkai bench --workload s2m`): N = 1, 2, 4, 8 mounts of one
# PostgreSQL volume (file:// bucket) extract a tree of 1,000 small files each (200 with
# --quick) and remove it, each in its own directory and then all in one shared directory;
# aggregate files/s and p99 latency per operation, one column per N. Run twice: PostgreSQL on
# this machine, and behind examples/delayproxy.rs adding MS (default 1) to each message of a
# client. The server runs as a real one does (fsync on; scripts/lib/pgbench.sh). Each run's
# figures are also saved as JSON in /tmp (or $UNKAI_SCALING_JSON): s2m-near.json, s2m-far.json.
# The volume keeps a trash as `format` does by default (1 day): every deletion moves into one
# trash directory; UNKAI_TRASH_DAYS=0 formats it without.
# Servers bind to 127.0.0.1; everything lives in a temporary directory removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/pgbench.sh
size=256M
files=2000
sqlite=0
meta=0
delay=1
runs=1
quick=
clients=()
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --sqlite) sqlite=1; shift ;;
    --meta) meta=1; shift ;;
    --delay) delay=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --quick) quick=--quick; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) clients+=("$1"); shift ;;
  esac
done

if [ "$meta" = 1 ]; then
  [ ${#clients[@]} -gt 0 ] || clients=(1 2 4 8)
  cargo build --release --quiet --bin unkai --example delayproxy
  bin=$PWD/target/release/unkai
  work=$(pgbench_workdir scaling)
  cleanup() { pgbench_cleanup "$work" "$work"/mnt-s2m/*; }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  pgbench_start "$work" "$delay"
  most=$(printf '%s\n' "${clients[@]}" | sort -n | tail -1)
  echo "== S2m: ${clients[*]} mounts of one PostgreSQL volume; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  for where in near far; do
    if [ "$where" = near ]; then
      url=$(pgbench_url s2m); label="PostgreSQL on this machine"
    else
      url=$(pgbench_far_url s2m); label="PostgreSQL ${delay} ms away (delayproxy)"
    fi
    rm -rf "$work/bucket"
    "$bin" format --force --storage "file://$work/bucket" "$url" s2m >/dev/null 2>&1
    # Mountpoints mnt-s2m/1 ... (short names: the table's columns are named by them).
    for i in $(seq "$most"); do
      mkdir -p "$work/mnt-s2m/$i"
      "$bin" mount -d --log "$work/mount-$i.log" "$url" "$work/mnt-s2m/$i" >/dev/null 2>&1
    done
    groups=()
    for n in "${clients[@]}"; do
      groups+=("$(seq -s, 1 "$n")")
    done
    echo "== $label; columns: the mounts used (1,2 = two clients)"
    (cd "$work/mnt-s2m" &&
      "$bin" bench --workload s2m --runs "$runs" $quick --quiet --json "$work/$where.json" "${groups[@]}")
    cp "$work/$where.json" "${UNKAI_SCALING_JSON:-/tmp}/s2m-$where.json" 2>/dev/null || true
    for i in $(seq "$most"); do "$bin" umount "$work/mnt-s2m/$i" >/dev/null; done
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  done
  exit 0
fi
[ ${#clients[@]} -gt 0 ] || clients=(1 2 4)

command -v fio >/dev/null || { echo "error: fio is needed: apt-get install fio" >&2; exit 1; }
scripts/servers.sh install >/dev/null
scripts/postgres.sh install >/dev/null
cargo build --release --quiet --bin unkai --example metabench
bin=$PWD/target/release/unkai
metabench=$PWD/target/release/examples/metabench
tools="${UNKAI_TOOLS:-$HOME/.cache/unkai-tools}"

work=$(pgbench_workdir scaling)
gw_pid=
cleanup() {
  pgbench_unmount "$work"/mnt-*
  [ -n "$gw_pid" ] && kill "$gw_pid" 2>/dev/null || true
  pgbench_cleanup "$work"
}
trap cleanup EXIT

# S3: versitygw, posix backend.
port=$(free_port)
mkdir -p "$work/s3"
ROOT_ACCESS_KEY_ID=bench ROOT_SECRET_ACCESS_KEY=benchsecret \
  "$tools/bin/versitygw" --port "127.0.0.1:$port" posix "$work/s3" >"$work/s3.log" 2>&1 &
gw_pid=$!
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$port"
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

# scripts/postgres.sh with its defaults (pgbench_start would make it durable, with a proxy).
PG_ADMIN=$(scripts/postgres.sh start "$work/pg")

mount_all() { # URL N
  local url=$1 n=$2 i
  for i in $(seq "$n"); do
    mkdir -p "$work/mnt-$i"
    "$bin" mount -d --log "$work/mount-$i.log" "$url" "$work/mnt-$i"
  done
}
umount_all() { # N
  local i
  for i in $(seq "$1"); do "$bin" umount "$work/mnt-$i" >/dev/null; done
}

# fio over N mounts: one job per client, each job's file in its own mount.
fio_mb() { # RW N -> aggregate MB/s
  local rw=$1 n=$2 dirs="" i
  for i in $(seq "$n"); do dirs="$dirs${dirs:+:}$work/mnt-$i/s2"; done
  fio --name=s2 --rw="$rw" --bs=1M --size="$size" --numjobs="$n" --directory="$dirs" \
      --ioengine=psync --end_fsync=1 --group_reporting --output-format=json 2>/dev/null \
    | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k=sys.argv[1]; print("%.0f" % (j[k]["bw_bytes"]/1e6))' \
      "$([ "$rw" = write ] && echo write || echo read)"
}

meta_ops() { # N -> "create stat delete" summed ops/s
  local n=$1 i
  for i in $(seq "$n"); do
    mkdir -p "$work/mnt-$i/m$i"
    "$metabench" "$work/mnt-$i/m$i" "$files" >"$work/meta-$i.out" &
  done
  wait
  for phase in create stat delete; do
    cat "$work"/meta-*.out | awk -v p="$phase" '$1==p {s+=$(NF-1)} END {printf "%.0f ", s}'
  done
  rm -f "$work"/meta-*.out
}

printf '%-8s %-9s %10s %10s %14s %10s %10s %10s\n' engine clients "write MB/s" "read MB/s" "read/client" create/s stat/s delete/s
for n in "${clients[@]}"; do
  url=$(pgbench_url "s2_$n")
  "$bin" format --storage "s3://bench/v$n" "$url" "v$n" >/dev/null
  mount_all "$url" "$n"
  for i in $(seq "$n"); do mkdir -p "$work/mnt-$i/s2"; done
  w=$(fio_mb write "$n")
  umount_all "$n"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  mount_all "$url" "$n"
  r=$(fio_mb read "$n")
  read -r c s d <<<"$(meta_ops "$n")"
  umount_all "$n"
  printf '%-8s %-9s %10s %10s %14s %10s %10s %10s\n' postgres "$n" "$w" "$r" "$(( r / n ))" "$c" "$s" "$d"
  if [ "$sqlite" = 1 ]; then
    url="sqlite://$work/meta-$n.db"
    "$bin" format --storage "s3://bench/sq$n" "$url" "sq$n" >/dev/null
    mount_all "$url" "$n"
    read -r c s d <<<"$(meta_ops "$n")"
    umount_all "$n"
    printf '%-8s %-9s %10s %10s %14s %10s %10s %10s\n' sqlite "$n" - - - "$c" "$s" "$d"
  fi
done
