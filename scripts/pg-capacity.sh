#!/usr/bin/env bash
# What each metadata operation costs a PostgreSQL server (issue 35 item 9: the capacity model
# of docs/design.md): one mount on a durable server on this machine (scripts/lib/pgbench.sh)
# makes N of each operation, and for each kind this prints, per operation:
#   rt       round trips to the database, as the mount counts them (/metrics)
#   WAL B    WAL bytes written (pg_current_wal_lsn before and after)
#   rows     rows inserted, updated and deleted (pg_stat_database)
#   commits  transactions committed (pg_stat_database)
#   busy ms  time the server spent executing statements (pg_stat_database.active_time: CPU,
#            and waits for locks and I/O within statements; not the WAL flush of COMMIT)
#   scripts/pg-capacity.sh [--ops N]
# Kinds: create (open O_CREAT + close of an empty file), write (open, write 4 KiB, close of
# an existing file), stat (lstat on a freshly mounted client: lookup from the database),
# unlink. The client's own CPU is not counted. Everything lives in a temporary directory
# removed at exit; the server binds to 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
ops=2000
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) ops=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cargo build --release --quiet --bin unkai --example delayproxy
bin=$PWD/target/release/unkai
. scripts/lib/pgbench.sh

work=$(pgbench_workdir pgcap)
cleanup() { pgbench_cleanup "$work" "$work/mnt"; }
trap cleanup EXIT
pgbench_start "$work" 0
url=$(pgbench_url cap)
"$bin" format --storage "file://$work/bucket" "$url" cap >/dev/null 2>&1
mkdir -p "$work/mnt"
port=$(free_port)
mount() {
  "$bin" mount -d --log "$work/mount.log" --metrics "127.0.0.1:$port" "$url" "$work/mnt" >/dev/null 2>&1
}
umount() { "$bin" umount "$work/mnt" >/dev/null; }

sql() { psql -qAtX "$(pgbench_url cap)" -c "$1"; }
round_trips() {
  curl -s "http://127.0.0.1:$port/metrics" |
    awk 'index($0, "unkai_meta_round_trips_total{") == 1 && index($0, "for=\"operations\"") { s += $NF }
         END { printf "%.0f", s }'
}
# One sample: "rt wal_lsn rows commits active_ms".
sample() {
  sleep 1.5 # pg_stat_database is flushed by each backend at most once a second
  echo "$(round_trips) $(sql "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn") \
$(sql "SELECT tup_inserted + tup_updated + tup_deleted, xact_commit, round(active_time * 1000) FROM pg_stat_database WHERE datname = 'cap'" | tr '|' ' ')"
}

py() { python3 - "$work/mnt/d" "$ops" "$1" <<'PY'
import os, sys, time
d, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = b"x" * 4096
t = time.time()
for i in range(n):
    p = f"{d}/f{i}"
    if kind == "create":
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    elif kind == "write":
        fd = os.open(p, os.O_WRONLY)
        os.write(fd, data)
        os.close(fd)
    elif kind == "stat":
        os.lstat(p)
    elif kind == "unlink":
        os.unlink(p)
print("%.3f" % (time.time() - t))
PY
}

mount
mkdir "$work/mnt/d"
printf '%-8s %6s %8s %8s %6s %9s %6s %8s %8s\n' kind ops "wall s" ops/s rt "WAL B" rows commits "busy ms"
for kind in create write stat unlink; do
  if [ "$kind" = stat ]; then umount; mount; fi
  read -r rt0 w0 r0 c0 t0 <<<"$(sample)"
  secs=$(py "$kind")
  read -r rt1 w1 r1 c1 t1 <<<"$(sample)"
  awk -v k="$kind" -v n="$ops" -v s="$secs" -v rt="$((rt1 - rt0))" -v w="$((w1 - w0))" \
    -v r="$((r1 - r0))" -v c="$((c1 - c0))" -v t="$((t1 - t0))" 'BEGIN {
      printf "%-8s %6d %8.2f %8.0f %6.2f %9.0f %6.2f %8.2f %8.3f\n", k, n, s, n / s, rt / n,
        w / n, r / n, c / n, t / 1000 / n }'
done
umount
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
