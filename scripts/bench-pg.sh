#!/usr/bin/env bash
# Small files on a shared (PostgreSQL) volume against the SQLite lone mount, side by side in
# one run (issue 35): `tar -x` of a tree of source-like files and `rm -rf` of it, and the
# round trips to the database each costs, as the mount counts them (/metrics).
#   scripts/bench-pg.sh [--files N] [--far-files M] [--delay MS] [--rounds R] [--before BIN]
# Volumes, each with a file:// bucket, mounted with default flags:
#   sqlite      SQLite, one mount
#   pg          PostgreSQL on this machine (scripts/postgres.sh with PG_DURABLE=1: fsync and
#               synchronous_commit on, as a real server runs)
#   pg+DELAYms  the same server through examples/delayproxy.rs, which holds every message of
#               the client for DELAY ms (a database in another zone); with the first M files
# N files (default 4000) for sqlite and pg, M (default 500) for all three. Each round runs
# every volume in turn (interleaved), R rounds (default 3); the medians are printed last.
# --before BIN also runs the PostgreSQL volumes with another build of unkai (an earlier
# commit's target/release/unkai), interleaved with this one: rows "pg@before" and so on.
# The machine's other load shows in the figures: compare within one run.
set -euo pipefail
cd "$(dirname "$0")/.."
files=4000
far=500
delay=1
rounds=3
before=
while [ $# -gt 0 ]; do
  case "$1" in
    --files) files=$2; shift 2 ;;
    --far-files) far=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --before) before=$(realpath "$2"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
cargo build --release --quiet --bin unkai --example delayproxy
bin=$PWD/target/release/unkai
. scripts/lib/pgbench.sh

work=$(pgbench_workdir benchpg)
cleanup() { pgbench_cleanup "$work" "$work"/mnt-*; }
trap cleanup EXIT

# The trees: N source-like files (a few hundred bytes to a few KiB) in 20 x 20 directories,
# and the first M of them.
make_tree() {
  local n=$1 out=$2 i d
  mkdir -p "$out"
  for ((i = 0; i < n; i++)); do
    d="$out/tree/d$((i % 20))/e$(((i / 20) % 20))"
    [ -d "$d" ] || mkdir -p "$d"
    head -c $((300 + (i * 7919) % 4000)) /dev/urandom | od -An -tx1 > "$d/f$i.rs"
  done
  tar -cf "$out.tar" -C "$out" tree
  rm -rf "$out"
}
make_tree "$files" "$work/big"
make_tree "$far" "$work/far"

pgbench_start "$work" "$delay"

# META-URL of each volume (the far one: the same server, through the proxy).
declare -A url
url[sqlite]="sqlite://$work/meta.db"
url[pg]=$(pgbench_url bench)
far_name="pg+${delay}ms"
url[$far_name]=$(pgbench_far_url bench)

# One figure from a scrape: the sum of the samples of NAME (or NAME2, its name in another
# build) whose labels contain LABEL.
metric() {
  awk -v name="$1" -v label="$2" -v name2="${4:-$1}" '
    (index($0, name "{") == 1 || index($0, name2 "{") == 1) && index($0, label) { s += $NF }
    END { printf "%.0f", s }' "$3"
}

# Runs one volume (NAME, or NAME@before with the --before build): format (fresh), mount,
# tar -x of TARBALL, rm -rf, each timed and with its round trips; prints
# "NAME FILES TAR_S RM_S RT_PER_FILE_TAR RT_PER_FILE_RM RT_CREATE RT_UNLINK".
run() {
  local label=$1 tarball=$2 n=$3 name=${1%@before} bin=$bin
  [ "$name" != "$label" ] && bin=$before
  local mp="$work/mnt-$name" port scrape t0 t1 t2
  mkdir -p "$mp"
  case "$name" in
    sqlite) rm -f "$work"/meta.db* ;;
  esac
  rm -rf "$work/bucket"
  "$bin" format --force --storage "file://$work/bucket" "${url[$name]}" bench >/dev/null
  port=$(free_port)
  "$bin" mount -d --log "$work/$name.log" --metrics "127.0.0.1:$port" "${url[$name]}" "$mp" >/dev/null
  scrape="$work/scrape"
  curl -s "http://127.0.0.1:$port/metrics" > "$scrape.0"
  t0=$(date +%s.%N)
  tar -xf "$tarball" -C "$mp"
  t1=$(date +%s.%N)
  curl -s "http://127.0.0.1:$port/metrics" > "$scrape.1"
  rm -rf "$mp/tree"
  t2=$(date +%s.%N)
  curl -s "http://127.0.0.1:$port/metrics" > "$scrape.2"
  "$bin" umount "$mp" >/dev/null
  local rt0 rt1 rt2 c0 c1 cr0 cr1 u1 u2 ur1 ur2
  rt0=$(metric unkai_meta_round_trips_total 'for="operations"' "$scrape.0")
  rt1=$(metric unkai_meta_round_trips_total 'for="operations"' "$scrape.1")
  rt2=$(metric unkai_meta_round_trips_total 'for="operations"' "$scrape.2")
  c0=$(metric unkai_op_duration_seconds_count 'op="create"' "$scrape.0" unkai_fuse_op_duration_seconds_count)
  c1=$(metric unkai_op_duration_seconds_count 'op="create"' "$scrape.1" unkai_fuse_op_duration_seconds_count)
  cr0=$(metric unkai_op_round_trips_total 'op="create"' "$scrape.0" unkai_fuse_op_round_trips_total)
  cr1=$(metric unkai_op_round_trips_total 'op="create"' "$scrape.1" unkai_fuse_op_round_trips_total)
  u1=$(metric unkai_op_duration_seconds_count 'op="unlink"' "$scrape.1" unkai_fuse_op_duration_seconds_count)
  u2=$(metric unkai_op_duration_seconds_count 'op="unlink"' "$scrape.2" unkai_fuse_op_duration_seconds_count)
  ur1=$(metric unkai_op_round_trips_total 'op="unlink"' "$scrape.1" unkai_fuse_op_round_trips_total)
  ur2=$(metric unkai_op_round_trips_total 'op="unlink"' "$scrape.2" unkai_fuse_op_round_trips_total)
  awk -v n="$n" -v t0="$t0" -v t1="$t1" -v t2="$t2" \
    -v rt0="$rt0" -v rt1="$rt1" -v rt2="$rt2" -v c="$((c1 - c0))" -v cr="$((cr1 - cr0))" \
    -v u="$((u2 - u1))" -v ur="$((ur2 - ur1))" -v name="$label" 'BEGIN {
      printf "%s %d %.2f %.2f %.1f %.1f %.2f %.2f\n", name, n, t1 - t0, t2 - t1,
        (rt1 - rt0) / n, (rt2 - rt1) / n, c ? cr / c : 0, u ? ur / u : 0 }'
}

results="$work/results"
: > "$results"
printf '%-16s %6s %8s %8s %12s %12s %10s %10s\n' volume files "tar -x s" "rm -rf s" \
  "rt/file tar" "rt/file rm" rt/create rt/unlink
for ((r = 1; r <= rounds; r++)); do
  for v in sqlite ${before:+pg@before} pg; do
    run "$v" "$work/big.tar" "$files" | tee -a "$results" |
      awk '{ printf "%-16s %6s %8s %8s %12s %12s %10s %10s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
  done
  for v in sqlite ${before:+pg@before} pg ${before:+$far_name@before} "$far_name"; do
    run "$v" "$work/far.tar" "$far" | tee -a "$results" |
      awk '{ printf "%-16s %6s %8s %8s %12s %12s %10s %10s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
  done
done
echo "== medians of $rounds rounds"
printf '%-16s %6s %8s %8s %12s %12s %10s %10s\n' volume files "tar -x s" "rm -rf s" \
  "rt/file tar" "rt/file rm" rt/create rt/unlink
sort -k1,1 -k2,2n "$results" | awk '
  function median(list,   a, k, n) {
    n = split(list, a, " ")
    for (k = 2; k <= n; k++) { v = a[k]; j = k - 1; while (j > 0 && a[j] > v) { a[j+1] = a[j]; j-- } a[j+1] = v }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { key = $1 " " $2; if (!(key in seen)) { order[++m] = key; seen[key] = 1 }
    for (f = 3; f <= 8; f++) col[key, f] = col[key, f] " " $f }
  END { for (i = 1; i <= m; i++) { split(order[i], k, " ")
    printf "%-16s %6s %8.2f %8.2f %12.1f %12.1f %10.2f %10.2f\n", k[1], k[2],
      median(col[order[i], 3]), median(col[order[i], 4]), median(col[order[i], 5]),
      median(col[order[i], 6]), median(col[order[i], 7]), median(col[order[i], 8]) } }'
