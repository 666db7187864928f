# Shared by the PostgreSQL benchmarks (scripts/bench-pg.sh, scripts/pg-capacity.sh,
# scripts/scaling.sh): a private PostgreSQL server on this machine as a real one runs
# (PG_DURABLE=1: fsync and synchronous_commit on) and examples/delayproxy.rs in front of it,
# which holds every message of a client for DELAY ms (a database in another zone). Source it
# from the repository root after building the delayproxy example (cargo build --release
# --example delayproxy).
#   free_port                  a free TCP port of 127.0.0.1
#   pgbench_workdir NAME       makes and prints a fresh work directory /tmp/unkai-NAME.XXXXXX
#                              (mode 755: the mount's other users may enter it)
#   pgbench_start WORK DELAY   starts both (the server's files in WORK/pg); sets PG_ADMIN (its
#                              admin URL), PG_PORT, PG_PROXY_PORT and PG_PROXY_PID
#   pgbench_url DB             the META-URL of database DB on the server (PG_ADMIN's)
#   pgbench_far_url DB         the same, through the proxy
#   pgbench_stop WORK          stops both (call it from the script's exit trap)
#   pgbench_unmount MOUNTPOINT...
#                              unmounts (with $bin) those of the MOUNTPOINTs that are mounted
#   pgbench_cleanup WORK MOUNTPOINT...
#                              the exit trap's work: pgbench_unmount, pgbench_stop, and WORK
#                              removed

free_port() {
  local p
  while :; do
    p=$(( 20000 + RANDOM % 20000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

pgbench_workdir() {
  local work
  work=$(mktemp -d "/tmp/unkai-$1.XXXXXX")
  chmod 755 "$work"
  echo "$work"
}

pgbench_start() {
  local work=$1 delay=$2
  scripts/postgres.sh install >/dev/null
  PG_DURABLE=1 scripts/postgres.sh start "$work/pg" >/dev/null
  PG_ADMIN=$(cat "$work/pg/url")
  PG_PORT=$(sed -E 's|.*@127\.0\.0\.1:([0-9]+)/.*|\1|' <<<"$PG_ADMIN")
  PG_PROXY_PORT=$(free_port)
  "$PWD/target/release/examples/delayproxy" "127.0.0.1:$PG_PROXY_PORT" "127.0.0.1:$PG_PORT" \
    "$delay" >"$work/proxy.log" 2>&1 &
  PG_PROXY_PID=$!
  for _ in $(seq 100); do grep -q listening "$work/proxy.log" && break; sleep 0.1; done
}

pgbench_url() {
  echo "${PG_ADMIN%/postgres*}/$1?sslmode=disable"
}

pgbench_far_url() {
  local u
  u=$(pgbench_url "$1")
  echo "${u/:$PG_PORT\//:$PG_PROXY_PORT/}"
}

pgbench_stop() {
  [ -n "${PG_PROXY_PID:-}" ] && kill "$PG_PROXY_PID" 2>/dev/null || true
  scripts/postgres.sh stop "$1/pg" >/dev/null 2>&1 || true
}

pgbench_unmount() {
  local mp
  for mp in "$@"; do
    mountpoint -q "$mp" 2>/dev/null && "$bin" umount "$mp" >/dev/null 2>&1 || true
  done
}

pgbench_cleanup() {
  local work=$1
  shift
  pgbench_unmount "$@"
  pgbench_stop "$work"
  rm -rf "$work"
}
